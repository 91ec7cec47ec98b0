"""``last_message_line``: what boot's clean verdict is checked against (issue 22, item 1)."""

from __future__ import annotations

from pathlib import Path

from store.indexing.reconcile import last_message_line
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript


def _message(mid: str) -> bytes:
    return dumps_line({"type": "message", "id": mid, "role": "user", "blocks": [{"type": "text", "text": mid}]})


def test_the_last_message_line_behind_a_long_run_of_other_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    create_transcript(path, "s", 1)
    assert last_message_line(path, path.stat().st_size) is None  # a header only: no message line
    w = TranscriptWriter.open(path)
    try:
        w.append([_message("m1")])
        start, end = w.append([_message("m2")])
        # more than one backward window of other lines after it (the window grows to find it)
        w.append([dumps_line({"type": "session_info", "title": "x" * 500}) for _ in range(100)])
        size = w.length
    finally:
        w.close()
    assert last_message_line(path, size) == (start, end - start)
    assert last_message_line(path, end) == (start, end - start)
    assert last_message_line(path, start) == (start - len(_message("m1")), len(_message("m1")))
