"""Render the benchmark report (a JSON-able dict) as Markdown.

After the summary of targets comes one side-by-side table of the append paths (the
raw loop, ``SQLiteSession``, pi-host in-process and over WebSocket: appends/s for one
session and for N at once, each with its CPU per append), built from the
``appends`` and ``gateway`` sections' figures; then every section in turn.
"""

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
    """Each target with its note (``detail``: for a target that can miss, the floor or ceiling that
    bounds it, measured in the same run; the same numbers are figures of its section)."""
    return _table(["target", "measured", "goal", "verdict", "bound in this run / note"],
                  [[t["name"], _fmt(t["measured"]), f"{t['op']} {t['goal']:g}", f"**{t['verdict']}**",
                    str(t.get("detail") or "").replace("|", "\\|")]
                   for t in targets])


def _row(label: str, one: Mapping[str, Any] | None, one_rate: str, many: Mapping[str, Any] | None, many_rate: str,
         one_cpu: str = "cpuMsPerAppend", many_cpu: str = "cpuMsPerAppend",
         one_ratio: str | None = None, many_ratio: str | None = None) -> list[str]:
    def get(d: Mapping[str, Any] | None, key: str | None) -> str:
        return "" if d is None or key is None else _fmt(d.get(key))
    return [label, get(one, one_rate), get(one, one_ratio), get(one, one_cpu),
            get(many, many_rate), get(many, many_ratio), get(many, many_cpu)]


def _stores_table(sections: Mapping[str, Any]) -> list[str]:
    """The append paths side by side (issue 12's table), from the appends and gateway figures."""
    rows: list[list[str]] = []
    sessions = ""
    for key, where in (("appends", "in-process"), ("gateway", "over WebSocket")):
        figs = (sections.get(key) or {}).get("figures") or {}
        raw, lite = figs.get("raw"), figs.get("sqliteSession")
        if not isinstance(raw, Mapping) or not isinstance(lite, Mapping):
            continue
        sessions = str(lite.get("concurrentSessions", sessions))
        if key == "appends":
            rows.append(_row("raw write+fdatasync loop", raw, "perSec", None, ""))
            rows.append(_row("raw loop, one worker-thread hop per append", raw, "viaWorkerThreadPerSec", None, "",
                             one_cpu="viaWorkerThreadCpuMsPerAppend"))
        rows.append(_row(f"SQLiteSession baseline ({key} section)", lite, "oneSessionPerSec", lite,
                         "concurrentAggregatePerSec", "oneSessionCpuMsPerAppend", "concurrentCpuMsPerAppend"))
        if key == "appends":
            rows.append(_row(f"pi-host {where}", figs.get("oneSession"), "perSec", figs.get("concurrentSessions"),
                             "aggregatePerSec", one_ratio="ratioToSqliteSession", many_ratio="ratioToSqliteSession"))
        else:
            rows.append(_row(f"pi-host {where} (host + client CPU)", figs.get("oneClient"), "perSec",
                             figs.get("concurrentClients"), "appendsPerSec", one_ratio="ratioToSqliteSession",
                             many_ratio="ratioToSqliteSession"))
    if not rows:
        return []
    header = ["store", "appends/s, 1 session", "x SQLiteSession", "CPU ms/append", f"{sessions} sessions at once",
              "x SQLiteSession", "CPU ms/append"]
    return ["## Append paths side by side", "",
            "One append awaited at a time per session, one fsync each; ratios against the SQLiteSession baseline "
            "measured in the same section, in rounds alternating with the host.", "",
            *_table(header, rows), ""]


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
        f"SQLite {machine['sqlite']}, git {machine.get('gitCommit') or '?'}. The bench process's allocator is "
        "tuned as `pi-host serve` tunes its own (`runtime.process.tune_allocator`), for the in-process host and "
        "every baseline alike.",
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
    lines += _stores_table(report["sections"])
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
