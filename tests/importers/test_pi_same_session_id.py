"""Two pi files carrying one session id: the session's own id goes to the longer file whatever order a
folder lists them in, and the other is imported as a session of its own.

Reproduces: every file was named by its header's id, so both files were imported into one session, the
first file walked making it and the second merged into it: which one the session followed hung on the
walk order. The files are the recorded pi 0.73.1 ``basics`` session and an older copy of it (its first
lines: a backup taken while the session grew), in two project folders.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_root
from store.transcripts.transcript import read_transcript
from tests.importers.test_pi_corrupt_leaf import RECORDED_PI
from tests.samplekit import NOW

SESSION = "01a234ad-dfe8-7038-b380-b3ff8f231306"


def _layout(root: Path, *, copy_first: bool) -> tuple[Path, Path]:
    lines = RECORDED_PI.read_bytes().splitlines(keepends=True)
    full, copy = (root / "--b--", root / "--a--") if copy_first else (root / "--a--", root / "--b--")
    for folder in (full, copy):
        folder.mkdir(parents=True)
    (full / RECORDED_PI.name).write_bytes(b"".join(lines))
    (copy / RECORDED_PI.name).write_bytes(b"".join(lines[:6]))  # header, model, thinking level, a turn, the next prompt
    return full / RECORDED_PI.name, copy / RECORDED_PI.name


@pytest.mark.parametrize("copy_first", [True, False], ids=["copy-walked-first", "copy-walked-last"])
def test_the_longer_file_is_the_session_and_the_copy_its_own(tmp_path: Path, db: sqlite3.Connection,
                                                             target: ImportTarget, copy_first: bool) -> None:
    full, copy = _layout(tmp_path / "pi-sessions", copy_first=copy_first)
    units = {u.files[0]: u.external_id for u in IMPORTERS["pi"].discover(tmp_path / "pi-sessions")}
    assert units[full] == SESSION and units[copy].startswith(f"{SESSION}@") and units[copy] != SESSION
    assert {u.files[0]: u.external_id for u in IMPORTERS["pi"].discover(tmp_path / "pi-sessions")} == units
    summary = import_root(db, "pi", tmp_path / "pi-sessions", target, now_ms=lambda: NOW)
    assert sorted(r.status for r in summary.sessions) == ["new", "new"]
    own = read_transcript(target.transcript(session_id_for("pi", SESSION))).messages
    other = read_transcript(target.transcript(session_id_for("pi", units[copy]))).messages
    assert len(own) == 10 and len(other) == 3  # every message of the longer file; the copy's three
    again = import_root(db, "pi", tmp_path / "pi-sessions", target, now_ms=lambda: NOW)
    assert [r.status for r in again.sessions] == ["unchanged", "unchanged"]
