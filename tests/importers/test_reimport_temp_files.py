"""Re-imports leave no temp file behind, and unchanged opencode sessions are skipped unparsed (issue 23).

Reproduces: a re-import that parsed a session but found nothing new left an empty
``sessions/<sid>.jsonl.import.tmp.*`` (only publish and undo removed it), so ``pi-host doctor`` reported
"stray temp files of interrupted writes"; JSONL tools leaked one after a copy, a move or an mtime change,
and opencode leaked one per session on every run (its origin row had no file fingerprints).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from runtime.datadir import DataDir
from store.doctor.doctor import run_doctor
from store.fsutil import TEMP_MARKER
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_root, origin_row
from tests.importers import gen
from tests.samplekit import NOW, sample_files

SAMPLES = {
    "claude-code": "codemie_v2.1.7_growing_file_turn2.jsonl",
    "codex": "localpush_desktop-0.104_REDACTED_single_turn.jsonl",
    "pi": "agent-sessions_stub_provider_compaction.jsonl",
}


def _temps(target: ImportTarget) -> list[str]:
    return sorted(n for n in os.listdir(target.sessions_dir) if TEMP_MARKER in n)


def _doctor_temp_findings(data: Path) -> list[str]:
    report = run_doctor(DataDir(data), repair=False, now_ms=NOW)
    return [f.subject for f in report.findings if f.check == "temp.files"]


def _sample(source: str) -> Path:
    found = [p for p in sample_files(source) if p.name == SAMPLES[source]]
    if not found:
        pytest.skip(f"sample {SAMPLES[source]} not here")
    return found[0]


@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_jsonl_reimport_after_mtime_change_copy_and_move_leaves_no_temp_file(
        source: str, tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    src = root / "a" / SAMPLES[source]
    shutil.copyfile(_sample(source), src)
    (first,) = import_root(db, source, root, target, now_ms=lambda: NOW).sessions
    assert first.status == "new"
    # an mtime change: parsed again, nothing new
    os.utime(src, ns=(1_000_000_000, 1_000_000_000))
    (again,) = import_root(db, source, root, target, now_ms=lambda: NOW).sessions
    assert (again.status, again.new_records) == ("unchanged", 0)
    assert _temps(target) == []
    # a copy under another path (same session id): the copy is parsed, nothing new
    other = tmp_path / "copy"
    (other / "b").mkdir(parents=True)
    shutil.copy2(src, other / "b" / src.name)
    (copied,) = import_root(db, source, other, target, now_ms=lambda: NOW).sessions
    assert (copied.session_id, copied.status) == (first.session_id, "unchanged")
    # a move back into the first root, into another folder (the file name is the session id for some tools)
    src.unlink()
    (root / "c").mkdir()
    (other / "b" / src.name).rename(root / "c" / src.name)
    (moved,) = import_root(db, source, root, target, now_ms=lambda: NOW).sessions
    assert moved.status == "unchanged"
    # and the next run without any change is unchanged without being parsed (fingerprints refreshed)
    (quiet,) = import_root(db, source, root, target, now_ms=lambda: NOW).sessions
    assert quiet.status == "unchanged" and quiet.files == []
    assert _temps(target) == []
    assert _doctor_temp_findings(tmp_path) == []


CONV: list[gen.Event] = [
    gen.User("open the file"),
    gen.Response((("text", "reading it"),), (gen.Tool("read", {"path": "/w/a.txt"}, "contents", False),)),
    gen.User("thanks"),
]


@pytest.mark.parametrize("layout", ["sqlite", "json"])
def test_opencode_unchanged_sessions_are_skipped_unparsed_and_leave_no_temp_file(
        layout: str, tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    info, messages = gen.opencode_docs(CONV)
    root = tmp_path / "opencode"
    root.mkdir()
    if layout == "sqlite":
        gen.write_opencode_db(root / "opencode.db", info, messages)
    else:
        gen.write_opencode_json(root, info, messages)
    (first,) = import_root(db, "opencode", root, target, now_ms=lambda: NOW).sessions
    assert first.status == "new"
    origin = origin_row(db, first.session_id)
    assert origin is not None and origin["origin"]["contentFingerprint"]
    for _ in range(2):
        (again,) = import_root(db, "opencode", root, target, now_ms=lambda: NOW).sessions
        assert again.status == "unchanged"
        assert again.files == [], "an unchanged opencode session must not be parsed again"
    assert _temps(target) == []
    assert _doctor_temp_findings(tmp_path) == []
    # a new message is still seen
    more = CONV + [gen.User("one more thing")]
    info2, messages2 = gen.opencode_docs(more)
    if layout == "sqlite":
        (root / "opencode.db").unlink()
        gen.write_opencode_db(root / "opencode.db", info2, messages2)
    else:
        shutil.rmtree(root / "storage")
        gen.write_opencode_json(root, info2, messages2)
    (grown,) = import_root(db, "opencode", root, target, now_ms=lambda: NOW).sessions
    assert grown.status == "updated" and grown.new_records == 1
    assert _temps(target) == []


def test_opencode_is_the_only_importer_with_a_content_fingerprint() -> None:
    assert [name for name, mod in IMPORTERS.items() if hasattr(mod, "fingerprint")] == ["opencode"]
