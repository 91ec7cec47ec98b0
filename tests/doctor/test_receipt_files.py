"""``pi-host doctor`` checks the answer files of command receipts (``receipts/<sha256>.json``, store/receipts.py).

A receipt whose answer is kept in a file that is missing or damaged is damage: its retry answers
``CORRUPT_DATA``; repair leaves the receipt (deleting it would run its effect a second time)."""

from __future__ import annotations

import pytest

from runtime.datadir import DataDir
from store import receipts
from store.doctor.doctor_report import EXIT_CLEAN, EXIT_DAMAGED
from tests.doctor.doctorkit import checks, db, doctor, problems, row

BIG = {"entry": {"id": "q1", "content": "x" * 200_000}}


def _big_receipt(data: DataDir) -> str:
    conn = db(data)
    try:
        conn.execute("BEGIN IMMEDIATE")
        receipts.store(conn, receipts.ReceiptKey("doctor-kit", "big-1", "session.queuePush", "f" * 64), BIG,
                       session_id=None, now_ms=1)
        conn.execute("COMMIT")
    finally:
        conn.close()
    [name] = [p.name for p in (data.root / "receipts").glob("*.json")]
    return name


def test_a_receipt_file_that_reads_back_is_clean(data: DataDir) -> None:
    _big_receipt(data)
    report = doctor(data)
    assert report.exit_code == EXIT_CLEAN, problems(report)


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_missing_or_damaged_receipt_file_is_damage_and_repair_keeps_the_receipt(data: DataDir,
                                                                                   damage: str) -> None:
    name = _big_receipt(data)
    path = data.root / "receipts" / name
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes().replace(b"xxx", b"xyx", 1))
    report = doctor(data)
    assert report.exit_code == EXIT_DAMAGED
    assert checks(report, "damaged") == ["receipts.file_damaged"]
    [finding] = [f for f in report.findings if f.check == "receipts.file_damaged"]
    assert finding.subject == f"receipts/{name}" and finding.data["receipts"] == ["doctor-kit/big-1"]
    doctor(data, repair=True)
    assert row(data, "SELECT count(*) FROM command_receipts WHERE submission_id = 'big-1'") == [(1,)]
