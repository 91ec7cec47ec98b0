"""A rebuilt index (the database lost, the transcripts kept) gets back the turns the lines name
(``store.turns.restore_named``, called by ``store.indexing.reconcile.apply_plan``): every message row links
to its line's turn again, and the turn, whose row and end went with the database, is ended, never running
again (``INDEX_LOST``). Its start retried answers it as it stands; its end retried settles it once."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store import turns
from store.errors import Conflict
from store.indexing import index
from store.indexing.database import open_writer
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line
from store.transcripts.records import rfc3339_to_ms
from store.transcripts.transcript import TranscriptWriter, create_transcript

SID = "s1"
NOW = 1_700_000_000_000
T0 = "2026-01-01T00:00:00.000Z"
T1 = "2026-01-01T00:00:01.000Z"
T2 = "2026-01-01T00:00:02.000Z"


def line(mid: str, turn: str | None, at: str, role: str = "user") -> bytes:
    rec: dict[str, Any] = {"type": "message", "id": mid, "role": role, "createdAt": at,
                           "blocks": [{"type": "text", "text": mid}]}
    if turn is not None:
        rec["turnId"] = turn
    return dumps_line(rec)


def rebuilt(tmp_path: Path, *lines: bytes, before: str | None = None) -> sqlite3.Connection:
    """A fresh index (as after the loss) with the session ``s1`` rebuilt from a transcript of ``lines``;
    ``before``: SQL run first (what another session's rebuild or a salvage left)."""
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    with TranscriptWriter.open(path) as w:
        w.append(list(lines))
    conn.execute("BEGIN")
    for sql in (before or "").split(";"):
        if sql:
            conn.execute(sql)
    apply_plan(conn, SID, plan_reconcile(path, 0, None), now_ms=NOW + 100)
    conn.execute("COMMIT")
    return conn


def links(conn: sqlite3.Connection) -> dict[str, str | None]:
    return dict(conn.execute("SELECT id, turn_id FROM messages WHERE session_id = ? ORDER BY seq", (SID,)))


def test_every_message_row_links_to_its_lines_turn_again(tmp_path: Path) -> None:
    conn = rebuilt(tmp_path, line("u1", "t1", T0), line("a1", "t1", T1, "assistant"), line("n1", None, T1),
                   line("u2", "t2", T2))
    assert links(conn) == {"u1": "t1", "a1": "t1", "n1": None, "u2": "t2"}
    # the answer a keyed append's retry is given comes from the row: the turn as the first answer said
    assert index.message_refs(conn, ["a1"])["a1"]["turnId"] == "t1"
    t1 = turns.get_turn(conn, "t1")
    assert t1 is not None
    assert (t1["sessionId"], t1["status"], t1["errorCode"]) == (SID, "aborted", turns.INDEX_LOST)
    assert (t1["startedAt"], t1["endedAt"]) == (rfc3339_to_ms(T0, 0), rfc3339_to_ms(T1, 0))
    assert conn.execute("SELECT COUNT(*) FROM turns WHERE status = 'running'").fetchone()[0] == 0
    conn.close()


def test_a_turn_another_session_holds_is_left_to_it(tmp_path: Path) -> None:
    """A line naming another session's turn (kept in the line, bound to no row when appended)."""
    conn = rebuilt(tmp_path, line("u1", "t8", T0), before=(
        "INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('other', 'o', 1, 1);"
        "INSERT INTO turns(id, session_id, status, started_at) VALUES ('t8', 'other', 'completed', 1)"))
    assert links(conn) == {"u1": None}
    assert conn.execute("SELECT session_id, status FROM turns WHERE id = 't8'").fetchone() == ("other", "completed")
    conn.close()


def test_a_retried_start_answers_the_turn_as_it_stands_and_its_retried_end_settles_it_once(
        tmp_path: Path) -> None:
    conn = rebuilt(tmp_path, line("u1", "t1", T0), line("a1", "t1", T1, "assistant"))
    conn.execute("BEGIN")
    turn, created = turns.start_turn(conn, session_id=SID, turn_id="t1", provider_id=None, model_id=None,
                                     snapshot=None, now_ms=NOW + 200)
    assert not created and (turn["status"], turn["errorCode"]) == ("aborted", turns.INDEX_LOST)
    ended = turns.end_turn(conn, session_id=SID, turn_id="t1", status="completed", error_code=None, usage=None,
                           create_notification=True, now_ms=NOW + 300)
    assert ended.changed and ended.notification is not None
    assert (ended.turn["status"], ended.turn["errorCode"]) == ("completed", None)
    again = turns.end_turn(conn, session_id=SID, turn_id="t1", status="completed", error_code=None, usage=None,
                           create_notification=True, now_ms=NOW + 400)
    assert not again.changed and again.notification is None
    with pytest.raises(Conflict):  # settled now: a start of it is what it was before the loss, refused
        turns.start_turn(conn, session_id=SID, turn_id="t1", provider_id=None, model_id=None, snapshot=None,
                         now_ms=NOW + 500)
    assert links(conn) == {"u1": "t1", "a1": "t1"}
    conn.execute("COMMIT")
    conn.close()


def never_started(conn: sqlite3.Connection) -> sqlite3.Connection:
    """The index as the append of a line naming turn ``tX``, which was never started, left it: the row
    bound to no turn, no turn row."""
    conn.execute("UPDATE messages SET turn_id = NULL WHERE turn_id = 'tX'")
    conn.execute("DELETE FROM turns WHERE id = 'tX'")
    assert links(conn) == {"u0": None}
    return conn


def test_the_session_row_kept_and_its_newest_commits_lost_the_tail_restores_its_turns(tmp_path: Path) -> None:
    """The database kept the session's row but lost its newest commits (its ``-wal`` lost, the main file
    kept): the tail the index lacks names a turn whose row went with them. The reconcile of that tail (boot,
    a catch-up) restores the turn as a rebuild does, and links the rows to it; the line the index held,
    whose turn had no row when it was appended (a turn never started), stays bound to none."""
    conn = never_started(rebuilt(tmp_path, line("u0", "tX", T0)))  # indexed before the loss, bound to no turn
    mark = index.session_row(conn, SID)
    path = tmp_path / f"{SID}.jsonl"
    with TranscriptWriter.open(path) as w:  # what the lost commits had indexed: t1's row and these rows
        w.append([line("u1", "t1", T1), line("a1", "t1", T2, "assistant")])
    plan = plan_reconcile(path, mark["_indexedLen"], mark["_fileEpoch"])
    assert plan.kind == "tail"
    conn.execute("BEGIN")
    apply_plan(conn, SID, plan, now_ms=NOW + 200)
    conn.execute("COMMIT")
    assert links(conn) == {"u0": None, "u1": "t1", "a1": "t1"}
    t1 = turns.get_turn(conn, "t1")
    assert t1 is not None and (t1["status"], t1["errorCode"]) == ("aborted", turns.INDEX_LOST)
    assert (t1["startedAt"], t1["endedAt"]) == (rfc3339_to_ms(T1, 0), rfc3339_to_ms(T2, 0))
    assert turns.get_turn(conn, "tX") is None
    conn.close()


def test_a_full_reindex_of_a_kept_session_restores_the_turns_only_its_lost_rows_name(tmp_path: Path) -> None:
    """The same through a full reindex of a session whose row the database kept (``doctor --repair``, an
    epoch the index does not know): the turns named only by lines the index lacked come back; a turn a line
    the index held names (appended while it had no row: never started) does not."""
    conn = never_started(rebuilt(tmp_path, line("u0", "tX", T0)))
    path = tmp_path / f"{SID}.jsonl"
    with TranscriptWriter.open(path) as w:
        w.append([line("u1", "t1", T1), line("u2", "tX", T2)])
    conn.execute("BEGIN")
    apply_plan(conn, SID, plan_reconcile(path, 0, None), now_ms=NOW + 200)
    conn.execute("COMMIT")
    assert links(conn) == {"u0": None, "u1": "t1", "u2": None}
    assert [r[0] for r in conn.execute("SELECT id FROM turns")] == ["t1"]
    conn.close()
