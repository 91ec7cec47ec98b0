"""RELIABILITY.md rows 5 and 6 swept over every I/O call of the transcript's write paths (the ``Fs`` shim of
row 5's third injection, at every ``k``): create, append, a group append, a rewrite, an append after it.

* Row 5, ``k``-th write: a real short write (half the bytes land), then ``ENOSPC`` on the next one (the tmpfs
  case of RELIABILITY.md §3). The call fails ``STORAGE_FULL``, nothing is acknowledged, the file is back to
  what it was (every line parses, no temp file left) and, once space is back, the same call lands once.
* Row 6, ``k``-th ``fsync``/``fdatasync``: ``EIO``. No acknowledgement; an append's writer is failed and never
  fsyncs again (no retry-then-ack: rule 7), every later append on it is refused; a new writer (the next boot
  trusts the disk) reads every acknowledged line, and the failed one at most once.

Figures: "every k in 1..K: 0 acked-then-missing, 0 unparsable files"; "0 acks after EIO; 0 retried fsyncs".
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import store.fsutil as fsutil_mod
import store.transcripts.transcript as transcript_mod
from store.errors import IOFailure, StorageFull
from store.fsutil import is_temp_name
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript, read_transcript, rewrite_transcript

T0 = 1785056400000
SID = "s1"

Message = tuple[str, str]


def line(mid: str, text: str) -> bytes:
    return dumps_line({"type": "message", "id": mid, "role": "user", "createdAt": "2026-07-26T09:00:00.000Z",
                       "blocks": [{"type": "text", "text": text}]})


@dataclass
class FaultyOs:
    """``os`` for the store's file code: counts writes and fsyncs; ``short_at``: that write lands half its
    bytes and the next write fails ENOSPC; ``eio_at``: that fsync fails EIO. ``synced``: every fd fsynced,
    in order (a failed fsync included)."""

    short_at: int = 0
    eio_at: int = 0
    real: ModuleType = os
    writes: int = 0
    syncs: int = 0
    full: bool = False
    synced: list[int] = field(default_factory=list)
    faults: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def write(self, fd: int, data: Any) -> int:
        self.writes += 1
        if self.full:
            self.full = False
            self.faults += 1
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if self.writes == self.short_at and len(data) >= 2:
            self.full = True
            return int(self.real.write(fd, data[: len(data) // 2]))
        return int(self.real.write(fd, data))

    def _sync(self, fd: int, call: Callable[[int], None]) -> None:
        self.syncs += 1
        self.synced.append(fd)
        if self.syncs == self.eio_at:
            self.faults += 1
            raise OSError(errno.EIO, "Input/output error (injected)")
        call(fd)

    def fsync(self, fd: int) -> None:
        self._sync(fd, self.real.fsync)

    def fdatasync(self, fd: int) -> None:
        self._sync(fd, self.real.fdatasync)


def _shown(path: Path) -> list[Message]:
    t = read_transcript(path)
    assert t.bad_lines == 0 and not t.torn_tail and t.header is not None, (t.bad_lines, t.torn_tail)
    return [(m.id, m.record["blocks"][0]["text"]) for m in t.messages]


@dataclass
class Run:
    folder: Path
    shim: FaultyOs
    acked: list[Message] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.folder / f"{SID}.jsonl"

    def no_temp_left(self) -> None:
        left = [p.name for p in self.folder.iterdir() if is_temp_name(p.name)]
        assert not left, left


def _workload(run: Run) -> None:
    """Each step, and when it fails as the fault allows, its checks and its retry once the fault is gone."""
    path = run.path

    def create() -> None:
        create_transcript(path, SID, T0, body_lines=[line("m1", "one")])

    try:
        create()
    except (StorageFull, IOFailure) as exc:
        run.failures.append(f"create:{exc.code}")
        run.no_temp_left()
        assert not path.exists() or isinstance(exc, IOFailure), "a failed create left its file"
        if not path.exists():
            create()
    run.acked = [("m1", "one")]
    assert _shown(path) == run.acked

    writer = TranscriptWriter.open(path)
    for group in ([("m2", "two")], [("m3", "three"), ("m4", "four")]):
        writer = _append(run, writer, group)
    writer.close()

    new = [("m1", "one, edited"), ("m2", "two"), ("m3", "three")]
    try:
        rewrite_transcript(path, SID, T0, [line(m, t) for m, t in new])
    except (StorageFull, IOFailure) as exc:
        run.failures.append(f"rewrite:{exc.code}")
        run.no_temp_left()
        assert _shown(path) in (run.acked, new), "a failed rewrite left a mixed file"
        rewrite_transcript(path, SID, T0, [line(m, t) for m, t in new])
    run.acked = list(new)
    assert _shown(path) == run.acked
    writer = _append(run, TranscriptWriter.open(path), [("m5", "five")])
    writer.close()
    run.no_temp_left()
    assert _shown(path) == run.acked


def _append(run: Run, writer: TranscriptWriter, group: list[Message]) -> TranscriptWriter:
    lines = [line(m, t) for m, t in group]
    try:
        writer.append(lines)
    except StorageFull as exc:
        run.failures.append(f"append:{exc.code}")
        assert not writer.failed, "a rolled-back write must leave the writer usable"
        assert _shown(run.path) == run.acked, "a write that failed left bytes behind"
        writer.append(lines)  # space is back
    except IOFailure as exc:
        run.failures.append(f"append:{exc.code}")
        assert writer.failed and writer.storage_failed
        fsyncs = len(run.shim.synced)
        with pytest.raises(IOFailure):
            writer.append(lines)
        with pytest.raises(IOFailure):
            writer.append([line("other", "never")])
        assert len(run.shim.synced) == fsyncs, "a failed writer fsynced again (retry-then-ack)"
        writer.close()
        writer = TranscriptWriter.open(run.path)  # the next boot trusts the disk
        shown = _shown(run.path)
        assert shown in (run.acked, [*run.acked, *group]), shown
        if shown == run.acked:
            writer.append(lines)
    run.acked.extend(group)
    assert _shown(run.path) == run.acked
    return writer


def _count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaultyOs:
    shim = FaultyOs()
    monkeypatch.setattr(fsutil_mod, "os", shim)
    monkeypatch.setattr(transcript_mod, "os", shim)
    folder = tmp_path / "count"
    folder.mkdir()
    _workload(Run(folder, shim))
    monkeypatch.undo()
    return shim


def _sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> list[list[str]]:
    clean = _count(tmp_path, monkeypatch)
    total = clean.writes if kind == "short" else clean.syncs
    assert total >= 5, total
    outcomes = []
    for k in range(1, total + 1):
        shim = FaultyOs(short_at=k) if kind == "short" else FaultyOs(eio_at=k)
        monkeypatch.setattr(fsutil_mod, "os", shim)
        monkeypatch.setattr(transcript_mod, "os", shim)
        folder = tmp_path / f"{kind}-{k}"
        folder.mkdir()
        run = Run(folder, shim)
        try:
            _workload(run)
        finally:
            monkeypatch.undo()
        outcomes.append(run.failures)
    return outcomes


def test_a_short_write_then_enospc_at_every_write_is_storage_full_rolled_back_and_lands_once_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = _sweep(tmp_path, monkeypatch, "short")
    failed = [o for o in outcomes if o]
    # The sweep reached every kind of write: create, append, group append, rewrite.
    kinds = {f for o in failed for f in o}
    assert {"create:STORAGE_FULL", "append:STORAGE_FULL", "rewrite:STORAGE_FULL"} <= kinds, kinds


def test_an_eio_at_every_fsync_is_never_acknowledged_and_never_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = _sweep(tmp_path, monkeypatch, "eio")
    kinds = {f for o in outcomes for f in o}
    assert {"create:IO_ERROR", "append:IO_ERROR", "rewrite:IO_ERROR"} <= kinds, kinds
