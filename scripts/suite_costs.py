"""Each test module's seconds from a JUnit XML report, for the suite's longest-first order.

    ./scripts/test --junitxml=/tmp/suite.xml
    .venv/bin/python -m scripts.suite_costs /tmp/suite.xml      # writes tests/module_costs.json

A test case's time is its setup, call and teardown (pytest's default ``junit_duration_report``), so a
module's fixtures are counted in its module. Prints the modules, longest first.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "module_costs.json"


def module_of(classname: str) -> str | None:
    """``tests.host.test_smoke`` or ``tests.host.test_smoke.TestX`` -> ``tests/host/test_smoke.py``."""
    parts = classname.split(".")
    if not all(parts):  # "" (an interrupted run's report holds one such case), or not a dotted name
        return None
    for n in range(len(parts), 0, -1):
        path = Path(*parts[:n]).with_suffix(".py")
        if (ROOT / path).is_file():
            return path.as_posix()
    return None


def module_seconds(report: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        module = module_of(case.get("classname", ""))
        if module is not None:
            seconds[module] += float(case.get("time", "0") or 0)
    return dict(seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", type=Path, help="a JUnit XML report of a whole-suite run")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    seconds = module_seconds(args.report)
    if not seconds:
        ap.error(f"{args.report}: no test cases of this repository's modules")
    ordered = dict(sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])))
    args.out.write_text(json.dumps({"seconds": {k: round(v, 1) for k, v in ordered.items()}}, indent=1) + "\n",
                        encoding="utf-8")
    total = sum(seconds.values())
    print(f"{len(seconds)} modules, {total:.0f} s of tests in all; longest first:")
    for module, s in list(ordered.items())[:25]:
        print(f"  {s:8.1f} s  {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
