"""The transcript line limit (``MAX_LINE_BYTES``) holds the same for every reader: the boot scan
(``scan_from``, in bounded chunks) and a full read (``read_transcript``, which a rewrite and a read without
the index use) call the same lines bad, at the same offsets, whatever the chunk bounds; a rewrite keeps
them aside. The limit and the chunk are made small here; the hostile test writes a real 65 MiB line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from store.indexing import reconcile
from store.transcripts import transcript
from store.transcripts.rewrite import load_live

LIMIT = 300


def _line(mid: str, size: int) -> bytes:
    """A message line of exactly ``size`` bytes before its newline."""
    head = {"type": "message", "id": mid, "role": "user", "text": ""}
    bare = len(json.dumps(head, separators=(",", ":")))
    head["text"] = "x" * (size - bare)
    line = json.dumps(head, separators=(",", ":")).encode()
    assert len(line) == size
    return line + b"\n"


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
