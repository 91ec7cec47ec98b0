"""A boot whose index passes ``quick_check`` and still meets it damaged rebuilds it (RELIABILITY.md row 7).

Found by chaos corrupt mode (seed 758519178): a random byte landed in a column's name in the stored
``CREATE TABLE compactions`` (``through_message_id`` read ``through_mTssage_id``). The schema still parses,
``quick_check`` finds nothing, and the host served on until it was restarted; the next boot then died opening
its read pool (each reader prepares the statements of a page read: "no such column: c.through_message_id"),
and so did every boot after it: the host never served again. A boot step that meets such damage (the
reconcile reading a column whose name changed) died the same way. A boot that meets its index corrupt now
quarantines it and boots again on an index rebuilt from the transcripts (once: damage in the rebuilt index
is not looped on)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from tests.hostkit import client_for, inprocess_host, msg


def _rename_in_schema(db: Path, table: str, name: str, damaged: str) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA writable_schema = ON")
        changed = conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?",
                               (name, damaged, table)).rowcount
        assert changed == 1
    finally:
        conn.close()
    probe = sqlite3.connect(db)
    try:
        assert probe.execute("PRAGMA quick_check").fetchall() == [("ok",)]  # boot's probe sees nothing
    finally:
        probe.close()


@pytest.mark.parametrize(("table", "name", "damaged"), [
    ("compactions", "through_message_id", "through_mTssage_id"),  # met opening the read pool
    ("sessions", "indexed_len", "indexed_lfn"),  # met by the boot steps (the reconcile)
])
async def test_a_boot_that_meets_a_damaged_schema_rebuilds_the_index(
        tmp_path: Path, table: str, name: str, damaged: str) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "kept"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
        _rename_in_schema(root / "pi.sqlite", table, name, damaged)
        async with inprocess_host(root) as again, client_for(again) as c:
            database = (await c.call("host.status", {}))["boot"]["database"]
            got = await c.call("session.get", {"sessionId": "s1"})
        assert database["rebuilt"] is True and database["quarantined"]
        assert [m["id"] for m in got["messages"]] == ["m1"]
        assert list((root / "quarantine").glob("pi.sqlite.corrupt-*"))
        async with inprocess_host(root) as third, client_for(third) as c:  # the rebuilt index is served as it is
            assert (await c.call("host.status", {}))["boot"]["database"]["rebuilt"] is False
