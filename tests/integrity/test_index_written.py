"""The store half of the one line primitive: ``store.indexing.appends.index_written`` moves the
index mark by compare-and-set and, when the mark is short of the lines' start, indexes the missing
bytes from the transcript first instead of jumping over them (issue 22, item 1)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store.indexing import index
from store.indexing.appends import Written, index_written
from store.indexing.database import in_transaction
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.dbkit import NOW

SID = "sess"


def _line(mid: str, text: str) -> bytes:
    return dumps_line({"type": "message", "id": mid, "role": "user", "createdAt": "2026-01-01T00:00:00Z",
                       "blocks": [{"type": "text", "text": text}]})


def _session(conn: sqlite3.Connection, path: Path) -> str | None:
    create_transcript(path, SID, NOW)
    plan = plan_reconcile(path, 0, None)
    in_transaction(conn, lambda c: apply_plan(c, SID, plan, now_ms=NOW))
    return plan.epoch


def _write(path: Path, lines: list[bytes], epoch: str | None, **kw: object) -> Written:
    w = TranscriptWriter.open(path)
    try:
        start, end = w.append(lines)
    finally:
        w.close()
    return Written(SID, path, start, end, epoch, lines, **kw)  # type: ignore[arg-type]


def test_a_lost_op_before_is_indexed_from_the_file_not_jumped_over(conn: sqlite3.Connection,
                                                                    tmp_path: Path) -> None:
    """Reproduces issue 22: a later line's op set the mark to the new file length over an earlier
    append whose index op was lost. Now the op finds the mark short of its start and indexes m1 first."""
    path = tmp_path / "t.jsonl"
    epoch = _session(conn, path)
    _write(path, [_line("m1", "lost one")], epoch)  # its index op never ran
    w2 = _write(path, [_line("m2", "second")], epoch, seqs={0: 2})
    refs = in_transaction(conn, lambda c: index_written(c, w2, now_ms=NOW))
    assert [r["seq"] for r in refs] == [2]
    assert conn.execute("SELECT id, seq FROM messages ORDER BY seq").fetchall() == [("m1", 1), ("m2", 2)]
    assert index.index_mark(conn, SID) == (w2.end, epoch)


def test_an_op_whose_lines_a_repair_already_indexed_leaves_the_mark(conn: sqlite3.Connection,
                                                                    tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    epoch = _session(conn, path)
    w1 = _write(path, [_line("m1", "one")], epoch, seqs={0: 1})
    w2 = _write(path, [_line("m2", "two")], epoch, seqs={0: 2})
    mark = index.index_mark(conn, SID)
    assert mark is not None
    in_transaction(conn, lambda c: apply_plan(c, SID, plan_reconcile(path, *mark), now_ms=NOW))  # the repair
    in_transaction(conn, lambda c: index_written(c, w1, now_ms=NOW))
    in_transaction(conn, lambda c: index_written(c, w2, now_ms=NOW))
    assert conn.execute("SELECT id, seq FROM messages ORDER BY seq").fetchall() == [("m1", 1), ("m2", 2)]
    assert index.index_mark(conn, SID) == (w2.end, epoch)


def test_the_mark_moves_only_by_compare_and_set(conn: sqlite3.Connection, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    epoch = _session(conn, path)
    mark = index.index_mark(conn, SID)
    assert mark is not None
    assert not index.set_index_mark(conn, SID, mark[0] + 10, epoch, expected=(mark[0] + 1, epoch))
    assert index.index_mark(conn, SID) == mark
    assert index.set_index_mark(conn, SID, mark[0] + 10, epoch, expected=mark)
    assert index.index_mark(conn, SID) == (mark[0] + 10, epoch)
