"""The answer a keyed session change carries in its transcript line (``extra.response``): what a
``session_info`` line's commit answers, computed before the line is written (``appends.info_answer``), and
what a rebuilt index answers a retry with (``reconcile.carried_answer``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from store import receipts
from store.indexing import index
from store.indexing.appends import info_answer
from store.indexing.reconcile import rebuild_response
from tests.dbkit import NOW, tx


def _summary(conn: sqlite3.Connection, sid: str = "s1") -> dict[str, Any]:
    return index.public_session(index.require_session(conn, sid))


def test_an_info_lines_answer_is_its_commits_and_leaves_no_row(tmp_path: Path, conn: sqlite3.Connection) -> None:
    write = tx(conn)
    write(lambda c: index.insert_session(c, "s1", now_ms=NOW, title="t"))
    write(lambda c: index.upsert_project(c, str(tmp_path / "other"), NOW))  # the next project id is not 1
    before = write(_summary)
    info = {"type": "session_info", "title": "t", "modelId": "m2", "projectPath": str(tmp_path / "p")}

    def then(c: sqlite3.Connection, refs: list[dict[str, Any]]) -> dict[str, Any]:
        index.rename_session(c, "s1", "renamed")
        return _summary(c)

    answer = write(lambda c: info_answer(c, "s1", info, then, now_ms=NOW + 5))
    assert write(_summary) == before  # the row as it was; only the project row stays (the id it names)
    assert answer["title"] == "renamed" and answer["modelId"] == "m2" and answer["projectId"] == 2
    assert answer["updatedAt"] == before["updatedAt"]  # a line without messages leaves it
    committed = write(lambda c: (index.update_session_settings(c, "s1", {"modelId": "m2", "projectPath": str(
        tmp_path / "p")}, now_ms=NOW + 5), then(c, []))[1])
    assert committed == answer


KEY = receipts.ReceiptKey("ui-1", "k-1", "session.truncateFrom", "f" * 64)


def test_a_rebuilt_receipt_answers_what_its_line_carries_or_as_before_without_it(conn: sqlite3.Connection) -> None:
    write = tx(conn)
    write(lambda c: index.insert_session(c, "s1", now_ms=NOW, title="grown since"))
    now = write(_summary)
    said = {"session": {**now, "title": "first", "messageCount": 2}, "removed": 3}
    assert write(lambda c: rebuild_response(c, "s1", receipts.file_record(KEY, removed=3))) == \
        {"session": now, "removed": 3}  # a header written before the answer rode in it
    assert write(lambda c: rebuild_response(c, "s1", receipts.file_record(KEY, removed=3, response=said))) == said
    other = {**said, "session": {**said["session"], "id": "s2"}}  # not this session's: not trusted
    assert write(lambda c: rebuild_response(c, "s1", receipts.file_record(KEY, removed=3, response=other))) == \
        {"session": now, "removed": 3}
    rename = receipts.ReceiptKey("ui-1", "k-2", "session.rename", "f" * 64)
    first = {**now, "title": "first"}
    assert write(lambda c: rebuild_response(c, "s1", receipts.file_record(rename, response=first))) == first
    assert write(lambda c: rebuild_response(c, "s1", receipts.file_record(rename))) == now
