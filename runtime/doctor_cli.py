"""``pi-host doctor``'s output: the human report, the ``--json`` report, the progress bar.

The progress bar is drawn only when stdout is a terminal (and not for
``--json``), on one line that is cleared before the report is printed.
"""

from __future__ import annotations

import json
import time
from typing import TextIO

from store.doctor.doctor_report import DoctorReport, Severity

BAR_WIDTH = 30
MIN_REDRAW_S = 0.05


class ProgressBar:
    """``progress(phase, done, total)`` drawing ``doctor: sessions [#####.....] 12/40`` in place."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._last = 0.0
        self._drawn = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < MIN_REDRAW_S:
            return
        self._last = now
        filled = BAR_WIDTH * done // total if total else BAR_WIDTH
        self._out.write(f"\rdoctor: {phase:<11} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}")
        self._out.flush()
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self._out.write("\r\x1b[2K")
            self._out.flush()
            self._drawn = False


_LABEL = {Severity.INFO: "info", Severity.REPAIRABLE: "repairable", Severity.DAMAGED: "DAMAGED"}


def render(report: DoctorReport) -> str:
    lines = [f"pi-host doctor: {report.data_dir}"
             + (f" (schema v{report.schema_version})" if report.schema_version is not None else "")]
    if report.checked:
        lines.append("  checked: " + ", ".join(f"{n} {what}" for what, n in sorted(report.checked.items())))
    order = {Severity.DAMAGED: 0, Severity.REPAIRABLE: 1, Severity.INFO: 2}
    for f in sorted(report.findings, key=lambda f: order[f.severity]):
        tail = " (repaired)" if f.repaired else ""
        lines.append(f"  [{_LABEL[f.severity]}] {f.check}  {f.subject}: {f.detail}{tail}")
    s = report.summary()
    if not s["repairable"] and not s["damaged"]:
        verdict = "clean"
    else:
        parts = []
        if s["repairable"]:
            parts.append(f"{s['repaired']} of {s['repairable']} repairable problem(s) repaired"
                         if report.repair else f"{s['repairable']} repairable problem(s) (run with --repair)")
        if s["damaged"]:
            parts.append(f"{s['damaged']} problem(s) nothing here can repair")
        verdict = "; ".join(parts)
    lines.append(f"result: {verdict} (exit {report.exit_code})")
    return "\n".join(lines)


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False)
