"""A re-import of a grown source file reads it only as its parse does: its imported prefix is not read again.

The origin entry keeps a file's earlier states (``[consumed, sha256]``: tests/importers/test_older_copies.py).
The digest of the already-imported prefix was taken by reading the file once more after the parse, up to all
the parse had consumed (to check the bytes were the parse's), so every re-import of a grown file read it one
time more than its parse does: a Claude Code session, whose parse read the main file in three passes, four
times. The parse's own reader now keeps the digest at the offset the last import consumed to as it passes it,
and a Claude Code parse reads its main file once: into a bounded snapshot that its read-ahead (its tree and its
subagents' Task calls, two passes before) and its conversion read (two reads of the file before).
Counted with ``os.open``/``os.read``/``os.close`` wrapped for descriptors opened on the source file (every reader
of a source goes through them), for each importer with a per-file digest (opencode has none: a content
fingerprint); the earlier state recorded, and the older copy it answers, are as before.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from store.attachments import AttachmentFiles
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS, former_ids, parse
from store.interchange.importers.common import ParseContext, SessionReport, SourceUnit
from store.interchange.importers.reader import PEEK_CHUNK
from store.interchange.importers.report import FileReport
from store.interchange.imports import earlier_states, import_unit
from store.interchange.origin_history import origin_row
from tests.samplekit import NOW, open_db

SAMPLES = {
    "claude-code": "claude-code/codemie_v2.1.7_growing_file_turn2.jsonl",
    "codex": "codex/localpush_desktop-0.104_REDACTED_multi_turn_apply_patch_web_search.jsonl",
    "pi": "pi/agent-sessions_stub_provider_compaction.jsonl",
    "pi-host": "claude-code/codemie_v2.1.7_growing_file_turn2.jsonl",  # the transcript an import of it wrote
}
PASSES = {"claude-code": 1}
"""Whole reads of the file a parse makes, where pinned: Claude Code's snapshot of it, which its read-ahead (its tree,
the subagents' Task calls) and its conversion read (each read the file before: 2)."""
PEEKED = {"claude-code": PEEK_CHUNK}
"""Bytes a first import reads beyond its parse at most: the ``sessionId`` an earlier version named a renamed
transcript by (``claude_code.former_ids``), read a small chunk at a time (64 KiB each before). It is asked once:
the offline ``import_unit`` asked twice before (it resolved the unit, then ``prepare_unit`` resolved it again)."""


def _workspace(tmp_path: Path, name: str) -> tuple[sqlite3.Connection, ImportTarget]:
    for sub in ("sessions", "blobs"):
        (tmp_path / name / sub).mkdir(parents=True)
    target = ImportTarget(tmp_path / name / "sessions", AttachmentFiles(tmp_path / name / "blobs"))
    return open_db(tmp_path / name / "pi.sqlite"), target


def _source(source: str, samples: Path, tmp_path: Path) -> bytes:
    if source != "pi-host":
        return (samples / SAMPLES[source]).read_bytes()
    db, target = _workspace(tmp_path, "scratch")
    try:
        (unit,) = IMPORTERS["claude-code"].discover(samples / SAMPLES[source])
        rep = import_unit(db, unit, target, now_ms=NOW)
    finally:
        db.close()
    return target.transcript(rep.session_id).read_bytes()


def _parse(unit: SourceUnit) -> None:
    """Parse ``unit`` as an import does, reading every branch it keeps (nothing written)."""
    parsed = parse(unit, ParseContext())
    for _ in parsed.records:
        pass
    for _ in parsed.off_branch() if parsed.off_branch is not None else ():
        pass


def _reads(monkeypatch: pytest.MonkeyPatch, path: Path, run: Callable[[], Any]) -> int:
    """Bytes ``run`` read from ``path`` (through every descriptor opened on it meanwhile)."""
    real_open, real_read, real_close = os.open, os.read, os.close
    fds: set[int] = set()
    total = 0

    def counted_open(file: Any, *args: Any, **kwargs: Any) -> int:
        fd = real_open(file, *args, **kwargs)
        if os.fspath(file) == os.fspath(path):
            fds.add(fd)
        return fd

    def counted_read(fd: int, n: int) -> bytes:
        nonlocal total
        data = real_read(fd, n)
        if fd in fds:
            total += len(data)
        return data

    def counted_close(fd: int) -> None:
        fds.discard(fd)
        real_close(fd)

    with monkeypatch.context() as m:
        m.setattr(os, "open", counted_open)
        m.setattr(os, "read", counted_read)
        m.setattr(os, "close", counted_close)
        run()
    assert total > 0
    return total


@pytest.mark.parametrize("source", sorted(SAMPLES))
def test_a_grown_file_is_read_only_by_its_parse(source: str, tmp_path: Path, untouched_samples: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    data = _source(source, untouched_samples, tmp_path)
    cut = data.index(b"\n", len(data) // 2) + 1  # the first import read the first half (whole lines)
    path = tmp_path / "src" / Path(SAMPLES[source]).name
    path.parent.mkdir()
    path.write_bytes(data[:cut])
    db, target = _workspace(tmp_path, "host")
    rep: list[SessionReport] = []
    try:
        (unit,) = IMPORTERS[source].discover(path)
        first = _reads(monkeypatch, path, lambda: rep.append(import_unit(db, unit, target, now_ms=NOW)))
        assert rep.pop().status == "new"
        if source in PASSES:  # and, for a first import, what naming the session peeks at (a few KiB), once
            peek = _reads(monkeypatch, path, lambda: former_ids(unit))
            assert peek <= PEEKED[source]
            assert first == PASSES[source] * cut + peek  # before: two peeks
        path.write_bytes(data)
        (grown,) = IMPORTERS[source].discover(path)
        again = _reads(monkeypatch, path, lambda: rep.append(import_unit(db, grown, target, now_ms=NOW)))
        assert rep[0].status == "updated" and rep[0].files[0].consumed == len(data)
        parse_reads = _reads(monkeypatch, path, lambda: _parse(grown))
        assert parse_reads % len(data) == 0  # the parse's own passes, each of the whole file
        if source in PASSES:
            assert parse_reads == PASSES[source] * len(data)
        assert again == parse_reads  # before: one more, the whole file read again for the earlier state
        origin = origin_row(db, grown.session_id)
        assert origin is not None
        entry = origin["origin"]["files"][str(path)]
        assert entry["consumed"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["earlier"] == [[cut, hashlib.sha256(data[:cut]).hexdigest()]]
        path.write_bytes(data[:cut])  # put back: the earlier state the entry keeps
        back = import_unit(db, unit, target, now_ms=NOW)
        assert back.status == "unchanged" and back.older_copy
    finally:
        db.close()


def test_a_report_without_the_digest_at_the_mark_reads_the_prefix_again(tmp_path: Path) -> None:
    """The fallback for a file whose reader was not given the mark (no importer's today): the file is read again
    up to what the parse consumed, and the state is kept only when those bytes still hash to the parse's."""
    path = tmp_path / "s.jsonl"
    data = b'{"a":1}\n{"b":2}\n{"c":3}\n'
    path.write_bytes(data)
    old = {"files": {str(path): {"consumed": 8, "sha256": hashlib.sha256(data[:8]).hexdigest()}}}
    report = FileReport(str(path), size=len(data), consumed=len(data), sha256=hashlib.sha256(data).hexdigest())
    assert earlier_states([report], old) == {str(path): [[8, hashlib.sha256(data[:8]).hexdigest()]]}
    report.sha256 = hashlib.sha256(b"other bytes").hexdigest()  # the file changed since the parse read it
    assert earlier_states([report], old) == {}
