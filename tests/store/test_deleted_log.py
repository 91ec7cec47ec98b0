"""The deleted-sessions log (``store/transcripts/deleted_log.py``): a deleted session id outside the database,
written before the session's files go, read back by a rebuilt index (``reconcile.forget_logged``)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import orjson
import pytest

from store import orphans, receipts
from store.faults import Faults, InjectedFault
from store.indexing import index
from store.indexing.reconcile import forget_logged
from store.receipts import ReceiptKey, file_record
from store.transcripts import deleted_log
from store.transcripts.deleted_log import FILE_NAME, LoggedDelete
from store.transcripts.session_files import SessionPaths, finish_delete, pending_deletes, write_delete_marker
from tests.dbkit import NOW

CREATE = ReceiptKey("ui-1", "k-create", "session.create", "f" * 64)
DELETE = ReceiptKey("ui-1", "k-delete", "session.delete", "d" * 64)


def _paths(root: Path, sid: str = "s1") -> SessionPaths:
    (root / "sessions").mkdir(exist_ok=True)
    return SessionPaths(sid, root / "sessions", root / "scratch", root / "review")


def test_append_and_read_round_trip_skipping_torn_and_bad_lines(tmp_path: Path) -> None:
    one = LoggedDelete("s1", NOW, file_record(DELETE), ({**file_record(CREATE), "response": {"id": "s1"}},))
    deleted_log.append(tmp_path, one)
    with open(tmp_path / FILE_NAME, "ab") as fh:
        fh.write(b'{"type":"session_deleted","sessionId":"s2","dele')  # a kill mid-write
    two = LoggedDelete("s3", NOW + 1)
    deleted_log.append(tmp_path, two)  # starts a line of its own
    with open(tmp_path / FILE_NAME, "ab") as fh:
        fh.write(b'not json\n{"type":"other"}\n{"type":"session_deleted","sessionId":"../x","deletedAt":1}\n')
    assert deleted_log.read(tmp_path) == [one, two]
    assert os.stat(tmp_path / FILE_NAME).st_mode & 0o777 == 0o600
    assert deleted_log.read(tmp_path / "nowhere") == []


def test_finish_delete_logs_the_marker_before_any_file_goes(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.transcript.write_bytes(b"{}\n")
    created = [{**file_record(CREATE), "response": {"id": "s1", "title": "t"}}]
    write_delete_marker(paths, file_record(DELETE), created)
    with pytest.raises(InjectedFault):  # cut right after the line: every file is still there, the marker too
        finish_delete(paths, now_ms=NOW, faults=Faults.parse("session_delete.after_log:1:raise"))
    assert paths.transcript.exists() and [p.session_id for p in pending_deletes(paths.sessions_dir)] == ["s1"]
    assert deleted_log.read(paths.sessions_dir) == [LoggedDelete("s1", NOW, file_record(DELETE), tuple(created))]
    finish_delete(paths, now_ms=NOW + 5)  # boot finishes it: the line again (the newest wins), then the files
    assert sorted(os.listdir(paths.sessions_dir)) == [FILE_NAME]
    assert [e.deleted_at for e in deleted_log.newest(deleted_log.read(paths.sessions_dir))] == [NOW + 5]


def test_an_older_builds_delete_without_a_marker_is_logged_too(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    paths.legacy_deleted.write_bytes(b"{}\n")
    finish_delete(paths, now_ms=NOW)
    assert deleted_log.read(paths.sessions_dir) == [LoggedDelete("s1", NOW)]


def test_created_receipts_are_the_ones_that_made_the_session(conn: sqlite3.Connection) -> None:
    receipts.store(conn, CREATE, {"id": "s1"}, session_id="s1", now_ms=NOW)
    receipts.store(conn, ReceiptKey("ui-1", "k-append", "session.appendMessage", "a" * 64), {"seq": 1},
                   session_id="s1", now_ms=NOW)
    receipts.store(conn, ReceiptKey("ui-1", "k-other", "session.create", "b" * 64), {"id": "s2"},
                   session_id="s2", now_ms=NOW)
    assert orphans.created_receipts(conn, "s1") == [{**file_record(CREATE), "response": {"id": "s1"}}]


def test_a_rebuilt_index_knows_a_logged_id_as_deleted_and_answers_its_retries(conn: sqlite3.Connection) -> None:
    created = ({**file_record(CREATE), "response": {"id": "s1", "title": "t"}},)
    entries = [LoggedDelete("s1", NOW, file_record(DELETE), created), LoggedDelete("s2", NOW),
               LoggedDelete("s1", NOW + 9, None, ()), LoggedDelete("back", NOW)]
    assert forget_logged(conn, entries, {"back"}) == 2  # "back" lives again: its transcript is there
    assert orphans.was_deleted(conn, "s2") and orphans.was_deleted(conn, "s1")
    assert not orphans.was_deleted(conn, "back")
    assert conn.execute("SELECT deleted_at FROM known_sessions WHERE id = 's1'").fetchone()[0] == NOW + 9
    assert forget_logged(conn, entries, {"back"}) == 2  # again: nothing changes
    assert receipts.check(conn, CREATE)["response"] == {"id": "s1", "title": "t"}  # type: ignore[index]
    assert receipts.check(conn, DELETE)["response"] == {"sessionId": "s1", "deleted": True}  # type: ignore[index]
    with pytest.raises(LookupError):  # the outbox's append gets no stub
        orphans.insert_stub(conn, "s1", now_ms=NOW, seen=True)
    index.insert_session(conn, "s1", now_ms=NOW)  # a new create (another key) may make it again
    assert not orphans.was_deleted(conn, "s1")


def test_compaction_keeps_the_newest_line_of_each_dead_id_within_the_bound(tmp_path: Path) -> None:
    for i in range(30):
        deleted_log.append(tmp_path, LoggedDelete(f"s{i % 10}", NOW + i))
    assert deleted_log.compact(tmp_path) is None  # under the size bound: left as it is
    assert len(deleted_log.read(tmp_path)) == 30
    assert deleted_log.compact(tmp_path, live=["s9"], over=0, keep=5) == 5
    kept = deleted_log.read(tmp_path)
    assert [(e.session_id, e.deleted_at) for e in kept] == [(f"s{i}", NOW + 20 + i) for i in range(4, 9)]
    assert not any(n.startswith(FILE_NAME + ".tmp") for n in os.listdir(tmp_path))
    line = (tmp_path / FILE_NAME).read_bytes().splitlines()[0]
    assert orjson.loads(line) == {"type": "session_deleted", "sessionId": "s4", "deletedAt": NOW + 24}


@pytest.mark.parametrize("point", ["after_tmp_write", "after_tmp_fsync", "after_rename", "before_dirsync"])
def test_a_compaction_that_dies_at_any_step_leaves_the_old_log_or_the_new_and_the_next_boot_finishes_it(
        tmp_path: Path, point: str) -> None:
    """Boot passes its faults to the compaction (its four atomic-write points could never fire before): a crash
    at each one leaves a log that reads as the old one or the compacted one, never a mix or a lost id, and
    the next boot's compaction ends where an uncrashed one would."""
    for i in range(30):
        deleted_log.append(tmp_path, LoggedDelete(f"s{i % 10}", NOW + i))
    old = {(e.session_id, e.deleted_at) for e in deleted_log.newest(deleted_log.read(tmp_path))}
    faults = Faults()
    faults.add(f"deleted_log.compact.{point}")
    with pytest.raises(InjectedFault):
        deleted_log.compact(tmp_path, live=["s9"], over=0, keep=5, faults=faults)
    after = {(e.session_id, e.deleted_at) for e in deleted_log.newest(deleted_log.read(tmp_path))}
    new = {(f"s{i}", NOW + 20 + i) for i in range(4, 9)}
    assert after == (old if point in ("after_tmp_write", "after_tmp_fsync") else new), point
    assert deleted_log.compact(tmp_path, live=["s9"], over=0, keep=5) == 5
    assert {(e.session_id, e.deleted_at) for e in deleted_log.read(tmp_path)} == new
