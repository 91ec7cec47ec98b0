"""Corrupt mode's pieces (``scripts/chaos --mode corrupt``): damage ``pi.sqlite`` under a running host,
and sort what the checker finds missing afterwards into host bugs and rows the damage took.

:func:`damage` overwrites a random stretch (or a few random bytes) of the index database file, after
a ``PRAGMA wal_checkpoint`` from a side connection or not. The host must meet it with ``CORRUPT_DATA``
(or a closed connection) and restart itself on an index rebuilt from the transcripts, salvaging the
DB-only rows the quarantined file still reads back (``store/indexing/salvage.py``).

What the checker may accept (:func:`damaged_tables`, :func:`excused`): a DB-only effect (a queue entry,
a setting, a turn row, a notification, an approval, a collaboration delivery, a DB-only receipt) may be
missing only when a boot report names its table in ``salvageSkipped`` (or says the salvage did not
run: ``salvage.failed`` / ``salvage.notSalvaged``, when the quarantined file no longer opens), and only
when that salvage ran after the row's acknowledgement and after the last check that saw the row present
(:class:`Salvages`: times are history positions; a salvage is placed where the runner first saw its boot,
no earlier than it ran, as no worker is connected between a restart and the check that follows it). Such a
loss is counted as ``damaged_lost``, apart from ``lost``; anything the transcripts carry (messages,
titles, sessions), any DB-only row whose table the salvage copied whole and any row acknowledged (or seen)
after the last such salvage must still be there. A finding the checker cannot tie to an acknowledgement
(a register never acknowledged) is excused by any such salvage before the check. A value no write
produced (an approval's request id the host never issued: a byte changed inside a row whose page stays well
formed) is counted there too: SQLite keeps no checksums, so neither the host nor its salvage can see it.
"""

from __future__ import annotations

import os
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

# Checker names (their prefix) → the DB-only tables whose damage may excuse their loss.
DB_ONLY: Final[dict[str, frozenset[str]]] = {
    "queue:": frozenset({"turn_queue", "kv"}),
    "setting:": frozenset({"kv"}),
    "turn:": frozenset({"turns"}),
    "notification:": frozenset({"notifications"}),
    "approval:": frozenset({"approvals"}),
    # a delivery's turn binding is cleared (the schema's ON DELETE SET NULL) when its turn row is lost
    "delivery:": frozenset({"session_collaboration_messages", "turn_queue", "turns"}),
    "receipt replay:": frozenset({"command_receipts"}),
}
ALL_DB_ONLY: Final[frozenset[str]] = frozenset().union(*DB_ONLY.values())
# Receipts the transcripts carry (their retry must answer as the first time, whatever the damage).
FILE_RECEIPTS: Final[tuple[str, ...]] = (
    "session.appendMessage", "session.create", "session.delete", "session.fork", "session.truncateFrom",
    "session.rename", "session.update")


def damage(db_path: Path, rng: random.Random, *, checkpoint: bool) -> str:
    """Overwrite part of ``db_path`` in place (the host keeps it open); returns what was done."""
    note = ""
    if checkpoint:
        try:
            side = sqlite3.connect(db_path, timeout=2.0)
            try:
                row = side.execute("PRAGMA wal_checkpoint").fetchone()
                note = f"checkpoint={tuple(row) if row else None} "
            finally:
                side.close()
        except sqlite3.Error as exc:
            note = f"checkpoint failed ({exc}) "
    size = db_path.stat().st_size
    with db_path.open("rb") as f:
        header = f.read(100)
    page = int.from_bytes(header[16:18], "big") if len(header) >= 18 else 4096
    page = 65536 if page == 1 else (page or 4096)
    fd = os.open(db_path, os.O_WRONLY)
    try:
        if rng.random() < 0.5:
            length = rng.choice((8, 64, 512, page, 2 * page, 4 * page))
            length = min(length, max(1, size - 1))
            # the header page only now and then: most of the file is b-tree pages
            low = 0 if rng.random() < 0.1 else min(page, max(0, size - length))
            offset = rng.randrange(low, max(low + 1, size - length))
            os.pwrite(fd, rng.randbytes(length), offset)
            return f"{note}stretch of {length} bytes at {offset} (page {offset // page + 1} of {size // page})"
        spots = sorted(rng.randrange(size) for _ in range(rng.randint(1, 8)))
        for at in spots:
            os.pwrite(fd, rng.randbytes(1), at)
        return f"{note}{len(spots)} random bytes at pages {sorted({s // page + 1 for s in spots})} of {size // page}"
    finally:
        os.close(fd)


def damaged_tables(boot: dict[str, Any]) -> set[str]:
    """The DB-only tables a boot report says the salvage could not copy whole."""
    salvage = boot.get("salvage") or {}
    if salvage.get("failed") or salvage.get("notSalvaged"):
        return set(ALL_DB_ONLY)
    return {t for t, n in (boot.get("salvageSkipped") or {}).items() if n}


def excused(name: str, tables: set[str]) -> bool:
    """True when ``name`` (a checker finding) is a DB-only effect of one of ``tables``."""
    for prefix, owners in DB_ONLY.items():
        if name.startswith(prefix):
            if prefix == "receipt replay:" and any(m in name.split(":", 1)[1].split()[:1] for m in FILE_RECEIPTS):
                return False
            return bool(owners & tables)
    return False


@dataclass
class Salvages:
    """The salvages a run saw, in history time, and when each acknowledged record was last seen present."""

    runs: list[tuple[int, frozenset[str]]] = field(default_factory=list)
    """(history position where the runner first saw the boot that salvaged, the tables it could not copy)."""
    seen_present: dict[int, int] = field(default_factory=dict)
    """acknowledgement index → history position of the last check that saw its effect present."""
    boots: set[str] = field(default_factory=set)

    def salvaged(self, at: int, tables: set[str], boot_id: str | None = None) -> None:
        """A boot report seen at history position ``at`` (once per boot: a later look at it adds nothing)."""
        if boot_id is not None:
            if boot_id in self.boots:
                return
            self.boots.add(boot_id)
        if tables:
            self.runs.append((at, frozenset(tables)))

    def checked(self, at: int, acked: set[int], lost: set[int]) -> None:
        """A check at ``at`` covered the acknowledgements ``acked``; those not in ``lost`` were present."""
        for a in acked - lost:
            if a < at:
                self.seen_present[a] = max(at, self.seen_present.get(a, -1))

    def excuses(self, name: str, anchor: int | None, at: int, *, sightings: bool = True) -> bool:
        """True when a salvage between ``name``'s acknowledgement ``anchor`` (and, with ``sightings``, the
        last check that saw its effect: not for a receipt, which no check sees) and the check at ``at``
        could not copy the table it lives in."""
        since = -1 if anchor is None else anchor
        if anchor is not None and sightings:
            since = max(since, self.seen_present.get(anchor, -1))
        return any(since < when <= at and excused(name, set(tables)) for when, tables in self.runs)

    def tables(self) -> set[str]:
        """Every table some salvage so far could not copy."""
        return set().union(*(t for _, t in self.runs))


__all__ = ["DB_ONLY", "FILE_RECEIPTS", "Salvages", "damage", "damaged_tables", "excused"]
