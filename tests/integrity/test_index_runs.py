"""Index ops of one session whose lines follow each other run as one op in the DB writer
(``store.indexing.appends.index_written_run``, ``actors.db_writer._runs``): the same rows as one
op at a time, one search-index segment instead of one per op, and each op still gets its own
outcome (issue 26: the index SQL of an awaited append went from one statement per message to one
per held batch)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from actors.db_writer import DbOp, IndexOp, _IndexBatch, _runs
from runtime.kernel.actor import Envelope
from store.errors import CorruptData
from store.indexing import appends, index
from store.indexing.appends import (
    Written,
    follows,
    index_written,
    index_written_batch,
    index_written_run,
    join_written,
)
from store.indexing.database import in_transaction
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line, loads_line
from store.search.search import search_messages
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.dbkit import NOW, add_session, fresh_db

SID = "sess"


def _msg(mid: str, text: str, role: str = "user") -> bytes:
    return dumps_line({"type": "message", "id": mid, "role": role, "createdAt": "2026-01-01T00:00:00Z",
                       "blocks": [{"type": "text", "text": text}]})


def _register(conn: sqlite3.Connection, path: Path) -> str | None:
    plan = plan_reconcile(path, 0, None)
    in_transaction(conn, lambda c: apply_plan(c, SID, plan, now_ms=NOW))
    return plan.epoch


def _write(path: Path, epoch: str | None, lines: list[bytes], seqs: dict[int, int] | None = None,
           parsed: bool = True) -> Written:
    w = TranscriptWriter.open(path)
    try:
        start, end = w.append(lines)
    finally:
        w.close()
    return Written(SID, path, start, end, epoch, lines, [loads_line(x) for x in lines] if parsed else None,
                   seqs or {})


def _rows(conn: sqlite3.Connection) -> dict[str, Any]:
    return {
        "messages": conn.execute("SELECT id, seq, role, text, deleted, line_offset, line_len, wire_cut, line_crc "
                                 "FROM messages ORDER BY seq").fetchall(),
        "session": conn.execute("SELECT title, last_seq, indexed_len, file_epoch, updated_at FROM sessions "
                                "WHERE id = ?", (SID,)).fetchone(),
        "receipts": conn.execute("SELECT * FROM command_receipts ORDER BY 1, 2").fetchall(),
        "found": sorted(h["messageId"] for h in search_messages(conn, "zebra", limit=50)["results"]),
    }


def _ops(path: Path, epoch: str | None) -> list[Written]:
    """Five ops as a session actor makes them: new messages, a replaced line, a tombstone, a
    session_info line, and one op holding two messages (one of them parsed lazily)."""
    return [
        _write(path, epoch, [_msg("m1", "zebra one")], {0: 1}),
        _write(path, epoch, [_msg("m2", "zebra two", "assistant")], {0: 2}),
        _write(path, epoch, [_msg("m2", "zebra two, replaced", "assistant")]),
        _write(path, epoch, [dumps_line({"type": "tombstone", "id": "t-m1", "messageId": "m1", "deleted": True}),
                             dumps_line({"type": "session_info", "title": "renamed"})]),
        _write(path, epoch, [_msg("m3", "zebra three"), _msg("m4", "four")], {0: 3, 1: 4}, parsed=False),
    ]


def test_a_run_indexes_what_one_op_at_a_time_indexes(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    create_transcript(path, SID, NOW)
    alone, joined = fresh_db(tmp_path / "alone.sqlite"), fresh_db(tmp_path / "joined.sqlite")
    epoch = _register(alone, path)
    assert _register(joined, path) == epoch
    ws = _ops(path, epoch)
    assert all(follows(a, b) for a, b in zip(ws, ws[1:], strict=False))
    one_by_one = [in_transaction(alone, lambda c, w=w: index_written(c, w, now_ms=NOW)) for w in ws]
    together = in_transaction(joined, lambda c: index_written_run(c, ws, now_ms=NOW))
    assert together == [(True, refs) for refs in one_by_one]
    assert [len(refs) for refs in one_by_one] == [1, 1, 1, 0, 2]
    assert _rows(joined) == _rows(alone)
    assert _rows(joined)["found"] == ["m2", "m3"]  # m1 is deleted
    assert index.index_mark(joined, SID) == (ws[-1].end, epoch)


def _segments(conn: sqlite3.Connection) -> int:
    """The search index's segments (the FTS5 structure record's per-level counts)."""
    got = conn.execute("SELECT count(*) FROM messages_fts_data WHERE id > 10").fetchone()
    return int(got[0])


def test_a_run_writes_one_search_segment_not_one_per_op(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    create_transcript(path, SID, NOW)
    alone, joined = fresh_db(tmp_path / "alone.sqlite"), fresh_db(tmp_path / "joined.sqlite")
    epoch = _register(alone, path)
    _register(joined, path)
    ws = [_write(path, epoch, [_msg(f"m{i}", f"zebra {i} " + "word " * 50)], {0: i}) for i in range(1, 9)]

    def alone_op(c: sqlite3.Connection) -> None:
        for w in ws:
            c.execute("SAVEPOINT op")
            index_written(c, w, now_ms=NOW)
            c.execute("RELEASE op")

    in_transaction(alone, alone_op)
    in_transaction(joined, lambda c: index_written_run(c, ws, now_ms=NOW))
    assert _rows(joined) == _rows(alone)
    assert _segments(joined) < _segments(alone)


def test_when_the_run_fails_each_op_gets_its_own_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An op whose indexing raises (here: any op holding the line ``boom``) fails the joined op,
    which rolls back whole; then each op runs alone: the others are indexed, that one fails alone."""
    path = tmp_path / "t.jsonl"
    create_transcript(path, SID, NOW)
    conn = fresh_db(tmp_path / "pi.sqlite")
    epoch = _register(conn, path)
    real = appends.index_written

    def failing(c: sqlite3.Connection, w: Written, *, now_ms: int) -> list[dict[str, Any]]:
        refs = real(c, w, now_ms=now_ms)
        if any(b"boom" in line for line in w.lines):
            raise CorruptData("boom")
        return refs

    monkeypatch.setattr(appends, "index_written", failing)
    ws = [_write(path, epoch, [_msg("m1", "one")], {0: 1}), _write(path, epoch, [_msg("m2", "boom")], {0: 2}),
          _write(path, epoch, [_msg("m3", "three")], {0: 3})]
    got = in_transaction(conn, lambda c: index_written_run(c, ws, now_ms=NOW))
    assert [ok for ok, _ in got] == [True, False, True]
    assert isinstance(got[1][1], CorruptData)
    assert [r["id"] for r in got[2][1]] == ["m3"]
    # m3 went in alone after m2's op rolled back: the mark was short of its start, so it indexed
    # m2's line from the file first (the rule of every index op), and m2 is served all the same
    assert conn.execute("SELECT id, seq FROM messages ORDER BY seq").fetchall() == [("m1", 1), ("m2", 2), ("m3", 3)]
    assert index.index_mark(conn, SID) == (ws[-1].end, epoch)


def test_a_message_whose_row_takes_the_session_spelling_is_still_its_ops(tmp_path: Path) -> None:
    """D444: another session holds m1, so this session's row is ``sess:m1``; the op gets that ref."""
    path = tmp_path / "t.jsonl"
    create_transcript(path, SID, NOW)
    conn = fresh_db(tmp_path / "pi.sqlite")
    epoch = _register(conn, path)
    add_session(conn, "other")
    in_transaction(conn, lambda c: index.index_messages(
        c, "other", [index.IndexRecord(loads_line(_msg("m1", "theirs")), 0, 10)], indexed_len=None,
        file_epoch=None, now_ms=NOW))
    ws = [_write(path, epoch, [_msg("m1", "mine")]), _write(path, epoch, [_msg("m2", "two")])]
    got = in_transaction(conn, lambda c: index_written_run(c, ws, now_ms=NOW))
    assert [[r["id"] for r in refs] for ok, refs in got] == [["sess:m1"], ["m2"]]


def test_joined_lines_keep_each_ops_acknowledged_seqs(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    create_transcript(path, SID, NOW)
    epoch = "e"
    ws = [_write(path, epoch, [_msg("a", "1"), _msg("b", "2")], {1: 2}), _write(path, epoch, [_msg("c", "3")], {0: 3})]
    one = join_written(ws)
    assert (one.start, one.end, len(one.lines), dict(one.seqs)) == (ws[0].start, ws[1].end, 3, {1: 2, 2: 3})
    assert one.records is not None and len(one.records) == 3
    lazy = join_written([ws[0], _write(path, epoch, [_msg("d", "4")], parsed=False)])
    assert lazy.records is None


def _env(msg: Any) -> Envelope:
    return Envelope(msg, None)


def _w(sid: str, start: int, end: int, epoch: str = "e") -> Written:
    return Written(sid, Path(f"/{sid}.jsonl"), start, end, epoch, [b"x" * (end - start)])


def test_runs_join_only_what_follows_and_stop_at_any_other_op() -> None:
    a1, a2, a3, a_gap = (IndexOp(_w("a", 0, 10), NOW), IndexOp(_w("a", 10, 20), NOW),
                         IndexOp(_w("a", 20, 30), NOW), IndexOp(_w("a", 40, 50), NOW))
    b1, b2 = IndexOp(_w("b", 0, 5), NOW), IndexOp(_w("b", 5, 9, epoch="other"), NOW)
    other = DbOp(lambda c: None)
    runs = _runs([_env(m) for m in (a1, b1, a2, other, a3, a_gap, b2)])
    shapes = [(type(op).__name__, [env.msg for env in group]) for op, group in runs]
    # a's gap ends the batch a3 opened; b2 (another epoch) is b's first op of the next batch
    assert shapes == [("_IndexBatch", [a1, a2, b1]), ("DbOp", [other]), ("IndexOp", [a3]),
                      ("_IndexBatch", [a_gap, b2])]
    batch = runs[0][0]
    assert isinstance(batch, _IndexBatch) and batch.requests == 3 and not batch.durable
    assert [[op for op in run] for run in batch.runs] == [[a1, a2], [b1]]


@pytest.mark.parametrize("touch", [True, False])
def test_ops_that_touch_differently_are_not_joined(touch: bool) -> None:
    first = _w("a", 0, 10)
    second = Written("a", first.path, 10, 20, "e", [b"y" * 10], touch=touch)
    assert follows(first, second) is touch


def _sessions(tmp_path: Path, conns: list[sqlite3.Connection], sids: list[str]) -> dict[str, tuple[Path, str | None]]:
    out: dict[str, tuple[Path, str | None]] = {}
    for sid in sids:
        path = tmp_path / f"{sid}.jsonl"
        create_transcript(path, sid, NOW)
        plan = plan_reconcile(path, 0, None)
        for c in conns:
            in_transaction(c, lambda c, sid=sid, plan=plan: apply_plan(c, sid, plan, now_ms=NOW))
        out[sid] = (path, plan.epoch)
    return out


def _op(sid: str, where: tuple[Path, str | None], lines: list[bytes], seqs: dict[int, int] | None = None) -> Written:
    path, epoch = where
    w = _write(path, epoch, lines, seqs)
    return Written(sid, path, w.start, w.end, epoch, w.lines, w.records, w.seqs)


def _all_rows(conn: sqlite3.Connection) -> dict[str, Any]:
    return {
        "messages": conn.execute("SELECT id, session_id, seq, role, text, deleted, line_offset, line_len "
                                 "FROM messages ORDER BY session_id, seq").fetchall(),
        "sessions": conn.execute("SELECT id, title, last_seq, indexed_len, file_epoch FROM sessions "
                                 "ORDER BY id").fetchall(),
        "found": sorted((h["sessionId"], h["messageId"]) for h in search_messages(conn, "zebra", limit=50)["results"]),
    }


def test_a_batch_of_several_sessions_indexes_what_one_op_at_a_time_indexes(tmp_path: Path) -> None:
    """Two sessions' runs in one batch, their new rows in one INSERT: the same rows, marks and
    search results as one op at a time, and a tombstone of a row held in the same batch lands."""
    alone, batched = fresh_db(tmp_path / "alone.sqlite"), fresh_db(tmp_path / "batched.sqlite")
    at = _sessions(tmp_path, [alone, batched], ["a", "b"])
    runs = [
        [_op("a", at["a"], [_msg("a1", "zebra a one")], {0: 1}),
         _op("a", at["a"], [_msg("a2", "zebra a two"),
                            dumps_line({"type": "tombstone", "id": "t-a1", "messageId": "a1", "deleted": True})],
             {0: 2})],
        [_op("b", at["b"], [_msg("b1", "zebra b one", "assistant")], {0: 1}),
         _op("b", at["b"], [dumps_line({"type": "session_info", "title": "b renamed"}), _msg("b2", "b two")],
             {1: 2})],
    ]
    one_by_one = [[(True, in_transaction(alone, lambda c, w=w: index_written(c, w, now_ms=NOW))) for w in run]
                  for run in runs]
    got = in_transaction(batched, lambda c: index_written_batch(c, runs, now_ms=[NOW] * len(runs)))
    assert got == one_by_one
    assert _all_rows(batched) == _all_rows(alone)
    assert _all_rows(batched)["found"] == [("a", "a2"), ("b", "b1")]
    assert conn_title(batched, "b") == "b renamed"


def test_each_session_of_a_batch_keeps_its_own_time(tmp_path: Path) -> None:
    """§11.1: a session's ``updatedAt`` is the time its own actor acknowledged its lines at (what
    ``session.get`` answers from the actor) — not a later op's of another session the DB writer
    indexed in the same batch, which ``session.list`` and a restarted host would read instead."""
    conn = fresh_db(tmp_path / "batched.sqlite")
    at = _sessions(tmp_path, [conn], ["a", "b", "c"])
    batch = _IndexBatch([[IndexOp(_op("a", at["a"], [_msg("a1", "one")], {0: 1}), NOW + 10),
                          IndexOp(_op("a", at["a"], [_msg("a2", "two")], {0: 2}), NOW + 30)],
                         [IndexOp(_op("b", at["b"], [_msg("b1", "one")], {0: 1}), NOW + 20)],
                         [IndexOp(_op("c", at["c"], [dumps_line({"type": "session_info", "title": "c"})]),
                                  NOW + 40)]])
    in_transaction(conn, batch.fn)
    assert dict(conn.execute("SELECT id, updated_at FROM sessions ORDER BY id").fetchall()) == {
        "a": NOW + 30, "b": NOW + 20, "c": NOW}  # a session_info line does not touch


def conn_title(conn: sqlite3.Connection, sid: str) -> str:
    return str(conn.execute("SELECT title FROM sessions WHERE id = ?", (sid,)).fetchone()[0])


def test_a_batch_writes_one_search_segment_for_all_its_sessions(tmp_path: Path) -> None:
    alone, batched = fresh_db(tmp_path / "alone.sqlite"), fresh_db(tmp_path / "batched.sqlite")
    sids = [f"s{i}" for i in range(6)]
    at = _sessions(tmp_path, [alone, batched], sids)
    runs = [[_op(sid, at[sid], [_msg(f"{sid}-m", f"zebra {sid} " + "word " * 40)], {0: 1})] for sid in sids]
    in_transaction(alone, lambda c: [index_written_run(c, run, now_ms=NOW) for run in runs])
    in_transaction(batched, lambda c: index_written_batch(c, runs, now_ms=[NOW] * len(runs)))
    assert _all_rows(batched) == _all_rows(alone)
    assert _segments(batched) < _segments(alone)


def test_the_same_new_id_in_two_sessions_of_a_batch_falls_back_to_one_run_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """D444 inside one batch: neither op sees the other's held row, so the flush fails on the
    unique id; the batch rolls back and each run goes alone: the second takes ``b:dup``, as when
    the ops ran one at a time."""
    alone, batched = fresh_db(tmp_path / "alone.sqlite"), fresh_db(tmp_path / "batched.sqlite")
    at = _sessions(tmp_path, [alone, batched], ["a", "b"])
    runs = [[_op("a", at["a"], [_msg("dup", "zebra from a")])], [_op("b", at["b"], [_msg("dup", "zebra from b")])]]
    alone_runs: list[int] = []
    real = appends.index_written_run

    def counted(c: sqlite3.Connection, ws: Any, *, now_ms: int) -> Any:
        alone_runs.append(len(ws))
        return real(c, ws, now_ms=now_ms)

    monkeypatch.setattr(appends, "index_written_run", counted)
    one_by_one = [[(True, in_transaction(alone, lambda c, w=w: index_written(c, w, now_ms=NOW))) for w in run]
                  for run in runs]
    got = in_transaction(batched, lambda c: index_written_batch(c, runs, now_ms=[NOW] * len(runs)))
    assert got == one_by_one
    assert [[r["id"] for r in refs] for run in got for ok, refs in run] == [["dup"], ["b:dup"]]
    assert alone_runs == [1, 1]  # the batch failed, then each run went alone
    assert _all_rows(batched) == _all_rows(alone)
