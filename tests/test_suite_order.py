"""The suite's longest-first module order (tests/conftest.py) and the costs it reads (scripts/suite_costs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts import suite_costs

REPO = Path(__file__).resolve().parent.parent


def test_a_junit_report_becomes_seconds_per_module(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_layering" name="a" time="1.5"/>'
        '<testcase classname="tests.test_layering" name="b" time="2.0"/>'
        '<testcase classname="tests.test_static_checks.TestX" name="c" time="0.25"/>'
        '<testcase classname="not.a.module" name="d" time="9"/>'
        '<testcase classname="" name="interrupted" time="4"/>'  # an interrupted run's report holds one
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    assert suite_costs.module_seconds(report) == {"tests/test_layering.py": 3.5, "tests/test_static_checks.py": 0.25}
    out = tmp_path / "costs.json"
    assert suite_costs.main([str(report), "--out", str(out)]) == 0
    seconds = json.loads(out.read_text())["seconds"]
    assert list(seconds)[0] == "tests/test_layering.py" and seconds["tests/test_layering.py"] == 3.5


def test_modules_are_collected_longest_first_each_whole_and_in_its_own_order() -> None:
    costs = json.loads((REPO / "tests" / "module_costs.json").read_text())["seconds"]
    got = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                          "-p", "no:cacheprovider", "tests/test_layering.py", "tests/chaos/test_file_first_kill.py",
                          "tests/store/test_search_property.py"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    ids = [line for line in got.splitlines() if "::" in line]
    modules = list(dict.fromkeys(i.split("::")[0] for i in ids))
    assert modules == sorted(modules, key=lambda m: -costs[m])
    # each module's tests are contiguous: a module appears in one run of ids
    runs = [i.split("::")[0] for n, i in enumerate(ids) if n == 0 or ids[n - 1].split("::")[0] != i.split("::")[0]]
    assert runs == modules
