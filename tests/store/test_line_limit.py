"""The transcript line limit (``MAX_LINE_BYTES``) holds the same for every reader: the boot scan
(``scan_from``, in bounded chunks) and a full read (``read_transcript``, which a rewrite and a read without
the index use) call the same lines bad, at the same offsets, whatever the chunk bounds; a rewrite keeps
them aside. The limit and the chunk are made small here; the hostile test writes a real 65 MiB line. The
revisions file's reader applies the same limit with the same chunked reader (``bounded_lines``)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from store import revisions
from store.indexing import reconcile
from store.transcripts import transcript
from store.transcripts.rewrite import load_live

LIMIT = 300


def _padded(record: dict[str, Any], key: str, size: int, fill: str) -> bytes:
    """``record`` as a line of exactly ``size`` bytes before its newline, ``key`` padded with ``fill``."""
    record[key] = ""
    bare = len(json.dumps(record, separators=(",", ":")))
    record[key] = fill * (size - bare)
    line = json.dumps(record, separators=(",", ":")).encode()
    assert len(line) == size
    return line + b"\n"


def _line(mid: str, size: int) -> bytes:
    """A message line of exactly ``size`` bytes before its newline."""
    return _padded({"type": "message", "id": mid, "role": "user", "text": ""}, "text", size, "x")


@pytest.mark.parametrize("chunk", [7, 64, 301, 450, 1 << 20])
def test_scan_and_full_read_agree_on_over_long_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     chunk: int) -> None:
    monkeypatch.setattr(reconcile, "MAX_LINE_BYTES", LIMIT)
    monkeypatch.setattr(transcript, "MAX_LINE_BYTES", LIMIT)
    monkeypatch.setattr(reconcile, "_SCAN_CHUNK", chunk)
    header = transcript.header_line("s1", 1)[0]
    lines = [_line("m1", 80), _line("m2", LIMIT), _line("big1", LIMIT + 1), _line("m3", 90),
             _line("big2", 3 * LIMIT), _line("m4", 60), _line("big3", LIMIT + 40)]
    path = tmp_path / "s1.jsonl"
    path.write_bytes(header + b"".join(lines))
    offsets = [len(header) + sum(map(len, lines[:i])) for i in range(len(lines))]
    bad = [offsets[2], offsets[4], offsets[6]]

    scan = reconcile.scan_from(path, 0)
    assert scan.bad_lines == bad
    assert [m.record["id"] for m in scan.messages] == ["m1", "m2", "m3", "m4"]
    assert scan.end == path.stat().st_size and scan.torn_tail_bytes == 0  # the last line ends where it ends

    full = transcript.read_transcript(path)
    assert full.bad_line_offsets == bad
    assert [m.id for m in full.messages] == ["m1", "m2", "m3", "m4"]
    live = load_live(path)
    assert live.ids == ["m1", "m2", "m3", "m4"] and sorted(live.dropped_offsets) == bad

    aside = transcript.keep_dropped_lines(path, live.dropped_offsets, 1)  # what a rewrite keeps first
    assert aside is not None and Path(aside).read_bytes() == lines[2] + lines[4] + lines[6]


def test_an_over_long_torn_tail_is_a_torn_tail_from_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconcile, "MAX_LINE_BYTES", LIMIT)
    monkeypatch.setattr(reconcile, "_SCAN_CHUNK", 16)
    header = transcript.header_line("s1", 1)[0]
    body = header + _line("m1", 60) + b'{"type":"message","id":"m2","text":"' + b"y" * (3 * LIMIT)
    path = tmp_path / "s1.jsonl"
    path.write_bytes(body)
    scan = reconcile.scan_from(path, 0)
    start = len(header) + 61
    assert scan.end == start and scan.torn_tail_bytes == len(body) - start and scan.bad_lines == []


# ---------------------------------------------------------------------------------------------- revisions file

def _revision(root: str, size: int) -> bytes:
    """A ``revision_live`` line of exactly ``size`` bytes before its newline (a key readers skip pads it)."""
    record = json.loads(revisions.revision_live_line(root, 1, created_at_ms=5, message_count=1))
    return _padded(record, "pad", size, "p")


@pytest.mark.parametrize("chunk", [7, 64, 301, 450, 1 << 20])
def test_the_revisions_file_applies_the_transcript_line_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              chunk: int) -> None:
    """The revisions file's reader (every one: ``read_revisions``, the archived-deletion lookup, the parse
    of bytes) calls a line over ``MAX_LINE_BYTES`` bad, as a transcript's readers do, wherever the chunks
    end; the lines around it read back."""
    monkeypatch.setattr(revisions, "MAX_LINE_BYTES", LIMIT)
    monkeypatch.setattr(revisions, "_READ_CHUNK", chunk)
    lines = [_revision("u1", 150), _revision("u2", LIMIT), _revision("big1", LIMIT + 1), _revision("u3", 160),
             _revision("big2", 3 * LIMIT), _revision("u4", 140)]
    path = tmp_path / "s1.revisions.jsonl"
    path.write_bytes(b"".join(lines) + b'{"type":"revision_live","rootUserId":"torn"')
    for rf in (revisions.read_revisions(path), revisions.parse_revisions(path.read_bytes())):
        assert sorted(root for root, _ in rf.entries) == ["u1", "u2", "u3", "u4"]
        assert rf.bad_lines == 2 and rf.torn_tail and rf.unknown_lines == 0
    assert revisions.archived_deletion_lines(path, ["m1"], True, created_at_ms=6) == \
        revisions.ArchivedDeletion(False, [])  # it reads the file the same way (and finds no branch)


def test_a_runaway_revisions_line_is_never_held_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line far over the limit (here 16 MiB against a 300-byte limit) costs the reader no more memory than
    the limit and its chunks: it is skipped as it streams past, not read into memory and parsed."""
    monkeypatch.setattr(revisions, "MAX_LINE_BYTES", LIMIT)
    monkeypatch.setattr(revisions, "_READ_CHUNK", 64 << 10)
    huge = 16 << 20
    path = tmp_path / "s1.revisions.jsonl"
    path.write_bytes(_revision("u1", 150) + _revision("runaway", huge) + _revision("u2", 150))
    tracemalloc.start()
    try:
        rf = revisions.read_revisions(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sorted(root for root, _ in rf.entries) == ["u1", "u2"] and rf.bad_lines == 1
    assert peak < 1 << 20, peak  # two chunks and change, not the 16 MiB line
