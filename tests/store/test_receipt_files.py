"""Command receipts whose answer is large keep it in a file, not in their row (store/receipts.py).

Seed 003 §1.3: the database stores no large payloads. An answer over ``FILE_BYTES`` of JSON is written to
``receipts/<sha256>.json`` before the transaction holding its row commits; the row holds a small stand-in;
a retry reads the file back checked (size, SHA-256) and gets the same answer; a file gone or damaged is
``CORRUPT_DATA``; a file no row names is removed by the boot sweep."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import receipts
from store.errors import CorruptData, IdempotencyConflict
from tests.dbkit import NOW, tx

BIG = {"entry": {"id": "q1", "text": "x" * 900_000}, "position": 0}


def _key(sub: str = "s1", method: str = "session.queuePush", fp: str = "f" * 64) -> receipts.ReceiptKey:
    return receipts.ReceiptKey("c1", sub, method, fp)


def _row(conn: sqlite3.Connection, sub: str = "s1") -> str:
    return str(conn.execute("SELECT response_json FROM command_receipts WHERE submission_id = ?",
                            (sub,)).fetchone()[0])


def _store(conn: sqlite3.Connection, key: receipts.ReceiptKey, answer: Any) -> None:
    tx(conn)(lambda c: receipts.store(c, key, answer, session_id=None, now_ms=NOW))


def _files(conn: sqlite3.Connection) -> list[Path]:
    directory = receipts.receipts_dir(conn)
    assert directory is not None
    return sorted(directory.glob("*.json")) if directory.is_dir() else []


def test_a_large_answer_is_kept_in_a_file_and_read_back_identically(conn: sqlite3.Connection) -> None:
    _store(conn, _key(), BIG)
    row = _row(conn)
    assert len(row) < 200, row
    body = orjson.dumps(BIG)
    digest = hashlib.sha256(body).hexdigest()
    assert orjson.loads(row) == {receipts.FILE_KEY: {"sha256": digest, "bytes": len(body)}}
    [file] = _files(conn)
    assert file.name == f"{digest}.json" and file.read_bytes() == body
    found = receipts.check(conn, _key())
    assert found is not None and orjson.dumps(found["response"]) == body
    assert receipts.get(conn, "c1", "s1") == {"method": "session.queuePush", "status": "completed",
                                              "response": BIG, "fingerprint": "f" * 64}


def test_a_small_answer_stays_in_its_row(conn: sqlite3.Connection) -> None:
    small = {"entry": {"id": "q1", "text": "x" * (receipts.FILE_BYTES - 100)}}
    _store(conn, _key(), small)
    assert orjson.loads(_row(conn)) == small
    assert _files(conn) == []


def test_a_different_request_is_a_conflict_without_reading_the_file(conn: sqlite3.Connection) -> None:
    _store(conn, _key(), BIG)
    for file in _files(conn):
        file.unlink()
    with pytest.raises(IdempotencyConflict):
        receipts.check(conn, _key(fp="0" * 64))
    assert receipts.exists(conn, "c1", "s1") and receipts.method_of(conn, "c1", "s1") == "session.queuePush"


@pytest.mark.parametrize("damage", ["missing", "flipped", "truncated", "longer"])
def test_a_missing_or_damaged_file_is_corrupt_data(conn: sqlite3.Connection, damage: str) -> None:
    _store(conn, _key(), BIG)
    [file] = _files(conn)
    body = file.read_bytes()
    if damage == "missing":
        file.unlink()
    elif damage == "flipped":
        file.write_bytes(body[:-3] + b"y" + body[-2:])
    elif damage == "truncated":
        file.write_bytes(body[:-1])
    else:
        file.write_bytes(body + b" ")
    with pytest.raises(CorruptData) as err:
        receipts.check(conn, _key())
    assert err.value.code == "CORRUPT_DATA"
    assert err.value.data["reason"] == "receiptFile" and err.value.data["file"] == f"receipts/{file.name}"


def test_an_existing_receipt_is_not_overwritten_and_writes_no_file(conn: sqlite3.Connection) -> None:
    _store(conn, _key(), {"small": True})
    _store(conn, _key(), BIG)
    assert orjson.loads(_row(conn)) == {"small": True}
    assert _files(conn) == []


def test_two_receipts_of_one_answer_share_its_file(conn: sqlite3.Connection) -> None:
    _store(conn, _key("s1"), BIG)
    _store(conn, _key("s2"), BIG)
    assert len(_files(conn)) == 1
    assert receipts.sweep_files(conn) == 0
    found = receipts.check(conn, _key("s2"))
    assert found is not None and found["response"] == BIG


def test_the_sweep_removes_files_no_row_names(conn: sqlite3.Connection) -> None:
    _store(conn, _key("s1"), BIG)
    kept = _files(conn)

    def rolled_back(c: sqlite3.Connection) -> None:
        receipts.store(c, _key("s2"), {"other": "y" * 100_000}, session_id=None, now_ms=NOW)
        raise RuntimeError("the effect failed after its receipt's file was written")

    with pytest.raises(RuntimeError):
        tx(conn)(rolled_back)
    assert receipts.exists(conn, "c1", "s2") is False
    assert len(_files(conn)) == 2  # the file was written before the (rolled back) commit
    directory = receipts.receipts_dir(conn)
    assert directory is not None
    (directory / f"{'a' * 64}.json.tmp.0123abcd").write_bytes(b"half")
    (directory / "notes.txt").write_bytes(b"not ours")
    assert receipts.sweep_files(conn) == 2
    assert _files(conn) == kept and (directory / "notes.txt").exists()
    found = receipts.check(conn, _key("s1"))
    assert found is not None and found["response"] == BIG


def test_the_sweep_of_an_empty_or_absent_folder_removes_nothing(conn: sqlite3.Connection) -> None:
    assert receipts.sweep_files(conn) == 0
    _store(conn, _key(), {"small": True})
    assert receipts.sweep_files(conn) == 0


def test_in_memory_the_answer_stays_in_its_row() -> None:
    mem = sqlite3.connect(":memory:", isolation_level=None)
    mem.execute("CREATE TABLE command_receipts (client_id TEXT, submission_id TEXT, method TEXT, status TEXT, "
                "response_json TEXT, fingerprint TEXT, session_id TEXT, created_at INTEGER, "
                "PRIMARY KEY (client_id, submission_id))")
    receipts.store(mem, _key(), BIG, session_id=None, now_ms=NOW)
    assert receipts.receipts_dir(mem) is None
    found = receipts.check(mem, _key())
    assert found is not None and found["response"] == BIG


def test_a_damaged_stand_in_is_corrupt_data(conn: sqlite3.Connection) -> None:
    _store(conn, _key(), BIG)
    conn.execute("UPDATE command_receipts SET response_json = ?",
                 (orjson.dumps({receipts.FILE_KEY: {"sha256": "nope", "bytes": 1}}).decode(),))
    with pytest.raises(CorruptData):
        receipts.check(conn, _key())
