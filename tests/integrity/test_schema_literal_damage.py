"""RELIABILITY.md row 7 for a damaged byte of the stored schema that stays readable: a byte of a CHECK's string
literal in ``sqlite_master`` changed into another readable character (``'high'`` read ``'higt'``). The schema
still parses, ``quick_check`` finds no row against it and SQLite's "CHECK constraint failed" decodes, so the
first valid write of that value was answered INTERNAL ("a host bug"), and so was every retry on that index.
It is damage (the stored definition is not the host's, ``store.indexing.corruption.altered_definition``): the
write answers CORRUPT_DATA (or its connection closes while the host restarts), the host rebuilds the index
from the transcripts, and the retry succeeds. (The same byte changed into one that is not UTF-8 was made
CORRUPT_DATA before: tests/integrity/test_constraint_errors.py.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runtime.client import RpcError
from tests.hostkit import msg
from tests.integrity.test_index_damage_routes import Host, internal_in_log


def _damage_check_literal(db: Path, table: str, literal: str, damaged: str) -> None:
    """Change ``literal`` in ``table``'s stored CREATE statement, as a damaged schema page leaves it, and move the
    schema cookie on so that a serving host's connections read the schema again."""
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        conn.execute("PRAGMA writable_schema = ON")
        changed = conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?",
                               (literal, damaged, table)).rowcount
        assert changed == 1
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute(f"PRAGMA schema_version = {version + 1}")
    finally:
        conn.close()


async def test_a_write_refused_by_a_damaged_check_literal_is_corrupt_data_and_the_retry_succeeds(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    h = Host(data)
    await h.start()
    try:
        await h.call("agent", "session.create", {"sessionId": "s1", "title": "t"})
        await h.call("agent", "session.appendMessage", {"sessionId": "s1", "message": msg("m0", "needle")})
        _damage_check_literal(data / "pi.sqlite", "sessions", "'high'", "'higt'")
        update = {"sessionId": "s1", "thinkingLevel": "high", "submissionId": "think-1"}
        with pytest.raises(RpcError) as met:
            await h.call("agent", "session.update", update)  # waits for the host to serve again
        assert met.value.data_code in ("CORRUPT_DATA", "CLOSED"), met.value
        assert list((data / "quarantine").glob("pi.sqlite.corrupt-*"))
        updated = await h.call("agent", "session.update", update)
        assert updated["thinkingLevel"] == "high"
        got = await h.call("agent", "session.get", {"sessionId": "s1", "full": True})
        assert got["session"]["thinkingLevel"] == "high"
        assert [m["id"] for m in got["messages"]] == ["m0"]
    finally:
        await h.drop_clients()
        h.kill()
    assert internal_in_log(data) == []
