"""What ``pi-host doctor`` found: findings, their severity, the exit code (pure, no I/O).

Severity of a finding:

* ``info``       — worth knowing, nothing wrong (a quarantine file kept, a
                   schema the next start migrates);
* ``repairable`` — wrong, and ``--repair`` fixes it from what the data
                   directory still holds (the transcripts are the source of
                   truth); ``repaired`` says whether this run did;
* ``damaged``    — wrong, and nothing here can put it right (bytes that are
                   gone, a line that does not parse, a page SQLite cannot read).

Exit code: 2 when anything is damaged, else 1 when anything was repairable
(repaired or not), else 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: called while a long phase runs."""

EXIT_CLEAN = 0
EXIT_REPAIRABLE = 1
EXIT_DAMAGED = 2


class Severity(StrEnum):
    INFO = "info"
    REPAIRABLE = "repairable"
    DAMAGED = "damaged"


@dataclass
class Finding:
    check: str
    """Stable name of what was checked (``sqlite.integrity``, ``index.session``, ...)."""
    subject: str
    """What it is about (``session s1``, ``attachments/<sha>``, ``pi.sqlite``)."""
    detail: str
    severity: Severity
    repaired: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "subject": self.subject, "detail": self.detail,
                "severity": str(self.severity), "repaired": self.repaired, "data": self.data}


@dataclass
class DoctorReport:
    data_dir: str
    repair: bool
    schema_version: int | None = None
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)

    def add(self, check: str, subject: str, detail: str, severity: Severity, **data: Any) -> Finding:
        finding = Finding(check, subject, detail, severity, data=dict(data))
        self.findings.append(finding)
        return finding

    def count(self, what: str, n: int = 1) -> None:
        self.checked[what] = self.checked.get(what, 0) + n

    def of(self, severity: Severity) -> list[Finding]:
        return [f for f in self.findings if f.severity is severity]

    @property
    def exit_code(self) -> int:
        if self.of(Severity.DAMAGED):
            return EXIT_DAMAGED
        if self.of(Severity.REPAIRABLE):
            return EXIT_REPAIRABLE
        return EXIT_CLEAN

    def summary(self) -> dict[str, int]:
        repairable = self.of(Severity.REPAIRABLE)
        return {"info": len(self.of(Severity.INFO)), "repairable": len(repairable),
                "repaired": sum(1 for f in repairable if f.repaired), "damaged": len(self.of(Severity.DAMAGED))}

    def to_json(self) -> dict[str, Any]:
        return {"dataDir": self.data_dir, "repair": self.repair, "schemaVersion": self.schema_version,
                "exitCode": self.exit_code, "summary": self.summary(), "checked": dict(self.checked),
                "findings": [f.to_json() for f in self.findings]}
