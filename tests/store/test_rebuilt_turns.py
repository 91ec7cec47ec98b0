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
