"""Render the benchmark report (a JSON-able dict) as Markdown."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Scalar = (str, int, float, bool, type(None))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 160 else text[:157] + "..."
    if isinstance(value, Mapping):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)


def _is_flat(d: Mapping[str, Any]) -> bool:
    return all(isinstance(v, Scalar) or isinstance(v, (list, tuple)) for v in d.values())


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _figures(figs: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    scalars = [(k, v) for k, v in figs.items() if isinstance(v, Scalar) or isinstance(v, (list, tuple))]
    if scalars:
        lines += _table(["figure", "value"], [[k, _fmt(v)] for k, v in scalars]) + [""]
    for key, value in figs.items():
        if not isinstance(value, Mapping):
            continue
        lines.append(f"**{key}**")
        lines.append("")
        if _is_flat(value):
            lines += _table(["figure", "value"], [[k, _fmt(v)] for k, v in value.items()])
        elif all(isinstance(v, Mapping) and _is_flat(v) for v in value.values()):
            cols: list[str] = []
            for v in value.values():
                cols += [c for c in v if c not in cols]
            lines += _table([key, *cols], [[k, *(_fmt(v.get(c)) for c in cols)] for k, v in value.items()])
        else:
            lines += ["```json", json.dumps(value, indent=2, ensure_ascii=False), "```"]
        lines.append("")
    return lines


def _targets_table(targets: list[Mapping[str, Any]]) -> list[str]:
    return _table(["target", "measured", "goal", "verdict"],
                  [[t["name"], _fmt(t["measured"]), f"{t['op']} {t['goal']:g}", f"**{t['verdict']}**"]
                   for t in targets])


def render_markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    machine = meta["machine"]
    fs = machine["filesystem"]
    lines = [
        "# pi-host benchmark report",
        "",
        f"Size preset **{meta['size']}**, started {meta['startedAt']}, wall time {meta['wallSeconds']} s"
        f"{' (incomplete)' if not meta.get('complete') else ''}.",
        "",
        f"Machine: {machine['cores']} cores, {machine['platform']}, Python {machine['python']}, "
        f"SQLite {machine['sqlite']}, git {machine.get('gitCommit') or '?'}.",
        f"Bench directory `{machine['benchDir']}` on {fs['type']} ({fs['device']} mounted at {fs['mount']}).",
        "",
        "Every ratio below was measured in this run against a baseline measured in this run. "
        "A MISS is reported, never hidden; it does not fail the run.",
        "",
        "## Summary",
        "",
    ]
    all_targets = [t for s in report["sections"].values() for t in s["targets"]]
    if all_targets:
        lines += _targets_table(all_targets)
    else:
        lines.append("No targets measured.")
    lines.append("")
    for sec in report["sections"].values():
        lines += [f"## {sec['title']}", "", f"Section time {sec['seconds']} s.", ""]
        if sec.get("skipped"):
            lines += [f"Skipped: {sec['skipped']}", ""]
            continue
        if sec.get("error"):
            lines += ["**ERROR** (section did not finish):", "", "```", sec["error"].rstrip(), "```", ""]
        if sec["targets"]:
            lines += _targets_table(sec["targets"]) + [""]
        lines += _figures(sec["figures"])
        for note in sec["notes"]:
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
