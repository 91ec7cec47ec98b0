"""The answer a keyed ``session.create`` carries in its transcript's header (``extra.response``): what its
commit answers, computed before the file is written, and what a rebuilt index answers a retry with."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from store import receipts
from store.indexing import index
from store.indexing.reconcile import apply_plan, created_answer, plan_reconcile, rebuild_response
from store.jsonio import dumps_line, now_rfc3339
from store.transcripts.transcript import create_transcript
from tests.dbkit import NOW, tx

KEY = receipts.ReceiptKey("ui-1", "k-create", "session.create", "f" * 64)


def _info(**settings: Any) -> bytes:
    return dumps_line({"type": "session_info", **settings, "updatedAt": now_rfc3339(NOW)})


def test_the_answer_computed_before_the_file_is_the_one_the_commit_gives(tmp_path: Path,
                                                                          conn: sqlite3.Connection) -> None:
    write = tx(conn)
    write(lambda c: index.upsert_project(c, str(tmp_path / "other"), NOW))  # the next project id is not 1
    info = _info(title="t", projectPath=str(tmp_path / "proj"), mode="plan", modelId="m")
    answer = write(lambda c: created_answer(c, "s1", NOW, info, now_ms=NOW))
    # no session row, no known id, no project row: only the project's id is reserved (the answer names it)
    assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM known_sessions").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM projects").fetchone()[0] == 1
    assert answer["projectId"] == 2
    assert write(lambda c: index.upsert_project(c, str(tmp_path / "made in between"), NOW)) == 3
    path = tmp_path / "s1.jsonl"
    create_transcript(path, "s1", NOW, body_lines=[info], receipt=receipts.file_record(KEY, response=answer))
    committed = write(lambda c: (apply_plan(c, "s1", plan_reconcile(path, 0, None), now_ms=NOW + 5),
                                 index.public_session(index.require_session(c, "s1")))[1])
    assert committed == answer
    assert conn.execute("SELECT id FROM projects WHERE path = ?", (str(tmp_path / "proj"),)).fetchone()[0] == 2
    assert answer["state"] == "planning" and answer["messageCount"] == 0 and answer["createdAt"] == NOW


def test_a_rebuilt_receipt_answers_what_the_header_carries_or_as_before_without_it(
        conn: sqlite3.Connection) -> None:
    write = tx(conn)
    write(lambda c: index.insert_session(c, "s1", now_ms=NOW, title="renamed since"))
    now = write(lambda c: index.public_session(index.require_session(c, "s1")))
    said = {**now, "title": "first"}
    record = receipts.file_record(KEY)
    assert write(lambda c: rebuild_response(c, "s1", record)) == now  # a header written before the answer rode
    record = receipts.file_record(KEY, response=said)
    assert write(lambda c: rebuild_response(c, "s1", record)) == said
    record = receipts.file_record(KEY, response={**said, "id": "s2"})  # not this session's: not trusted
    assert write(lambda c: rebuild_response(c, "s1", record)) == now


def test_a_dry_run_leaves_no_row_whether_it_returns_or_raises(conn: sqlite3.Connection) -> None:
    write = tx(conn)

    def insert_then(fail: bool) -> Callable[[sqlite3.Connection], int]:
        def run(c: sqlite3.Connection) -> int:
            index.insert_session(c, "s1", now_ms=NOW)
            if fail:
                raise LookupError("after the insert")
            return int(c.execute("SELECT COUNT(*) FROM sessions").fetchone()[0])
        return run

    assert write(lambda c: index.dry_run(c, insert_then(False))) == 1
    with pytest.raises(LookupError):
        write(lambda c: (index.insert_session(c, "kept", now_ms=NOW), index.dry_run(c, insert_then(True))))
    assert conn.execute("SELECT id FROM sessions").fetchall() == []
    write(lambda c: (index.insert_session(c, "kept", now_ms=NOW), index.dry_run(c, insert_then(False))))
    assert conn.execute("SELECT id FROM sessions").fetchall() == [("kept",)]  # what ran before it stays
