"""RELIABILITY.md row 7, each way a damaged index shows: "a corruption found at runtime crashes the DB-writer
actor, and the supervisor rebuilds". A stretch of random bytes over ``pi.sqlite`` (the outsider test's
damage) can leave the b-tree pages well formed and break only what they hold; depending on where it lands, a
read then meets ``SQLITE_CORRUPT``, a text value that is not UTF-8, an FTS5 table that cannot be opened or an
FTS5 index of an unknown format. Each of these is written here on purpose, through SQLite, while the host
serves: the first read that meets it answers CORRUPT_DATA (never INTERNAL, "a host bug"), and the same
process comes back on a rebuilt index holding every acknowledged message. (A random stretch answered
INTERNAL for the last three before; a CI run met the UTF-8 one.)"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from runtime.client import ClientClosed
from tests.acceptance.outsiderkit import error_of
from tests.hostkit import once_rebuilt
from tests.integrity.test_reliability_outsider_a import host, ids, msg

DAMAGE = {
    # Bytes the host never writes (it binds Python str, always UTF-8) where a message's text is kept.
    "text-not-utf8": "UPDATE messages SET text = CAST(X'6e6565646c653120ff' AS TEXT) WHERE session_id = 's1'",
    # The FTS5 index's own record of its format.
    "fts5-format": "UPDATE messages_fts_config SET v = 99 WHERE k = 'version'",
    # The FTS5 table's schema row, as a damaged sqlite_master page leaves it: its tokenizer gone.
    "fts5-schema": None,
}


def _damage(db: Path, kind: str) -> None:
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        if kind == "fts5-schema":
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'trigram', 'trigrxm') "
                         "WHERE name = 'messages_fts'")
        else:
            conn.execute(DAMAGE[kind])
    finally:
        conn.close()


@pytest.mark.parametrize("kind", sorted(DAMAGE))
async def test_each_kind_of_index_damage_is_corrupt_data_and_the_host_rebuilds(tmp_path: Path, kind: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    acked: dict[str, list[str]] = {}
    async with host(data) as (proc, c):  # the first host writes; the damage meets the second one
        for s in range(2):
            sid = f"s{s}"
            await c.call("session.create", {"sessionId": sid, "title": "t"})
            acked[sid] = []
            for i in range(12):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"{sid}m{i}", f"needle{s} " + random.Random(i).randbytes(40).hex())})
                acked[sid].append(f"{sid}m{i}")
        found = await c.call("search.query", {"query": "needle1", "limit": 50})  # indexed: its read barrier
        assert len(found["results"]) == len(acked["s1"])
        if kind == "text-not-utf8":  # under the serving host
            _damage(data / "pi.sqlite", kind)
    if kind != "text-not-utf8":  # between two hosts: FTS5 reads its format and schema when a connection opens it
        _damage(data / "pi.sqlite", kind)
    async with host(data) as (proc, c):
        codes: list[str | None] = []
        try:
            for _ in range(3):
                codes.append((await error_of(c, "search.query", {"query": "needle1"}))[0])
        except ClientClosed as closed:
            codes.append(f"closed {closed}")
        assert "INTERNAL" not in codes, codes
        assert codes[0] == "CORRUPT_DATA", codes
        async with once_rebuilt(proc) as again:  # the same process, the same url
            assert proc.proc.poll() is None
            for sid, want in acked.items():
                assert await ids(again, sid) == want
            found = await again.call("search.query", {"query": "needle1", "limit": 50})
            assert sorted(r["messageId"] for r in found["results"]) == sorted(acked["s1"]), found
    assert list((data / "quarantine").glob("pi.sqlite.corrupt-*")), "the damaged index is kept aside"


async def test_a_column_name_damaged_in_the_schema_is_corrupt_data_not_a_host_bug(tmp_path: Path) -> None:
    """A random byte in a table's CREATE statement (scripts/chaos --mode corrupt met it in ``turns``):
    the statement still parses, so SQLite reports no corruption; the host's own SQL then fails with "no
    such column: t.usage_json", which answered INTERNAL for every turn after. A column (or table) the
    host's schema defines and the file no longer has is damage: CORRUPT_DATA, then a rebuild."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call("session.endTurn", {"sessionId": "s1", "turnId": "t1", "status": "completed"})
        # under the serving host, as the chaos run did: the next statement re-reads the schema
        conn = sqlite3.connect(data / "pi.sqlite", timeout=10, isolation_level=None)
        try:
            conn.execute("PRAGMA writable_schema = ON")
            conn.execute("UPDATE sqlite_master SET sql = replace(sql, 'usage_json', 'usa_e_json') WHERE name = 'turns'")
            cookie = conn.execute("PRAGMA schema_version").fetchone()[0]  # the host's connections re-read it
            conn.execute(f"PRAGMA schema_version = {cookie + 1}")
        finally:
            conn.close()
        codes: list[str | None] = []
        try:
            for n in range(2, 5):
                codes.append((await error_of(c, "session.startTurn", {"sessionId": "s1", "turnId": f"t{n}"}))[0])
        except ClientClosed as closed:
            codes.append(f"closed {closed}")
        assert "INTERNAL" not in codes, codes
        assert codes[0] == "CORRUPT_DATA", codes
        async with once_rebuilt(proc) as again:  # the same process, the same url
            assert proc.proc.poll() is None
            assert await ids(again, "s1") == ["m1"]
            await again.call("session.startTurn", {"sessionId": "s1", "turnId": "t9"})


@pytest.mark.parametrize(("message", "damage"), [
    ("no such column: t.usage_json", True),
    ("table turns has no column named usage_json", True),
    ("no such table: main.turns", True),
    ("no such column: t.not_in_the_schema", False),  # the host's own SQL is wrong: a bug, not damage
    ("no such table: nowhere", False),
])
def test_a_missing_name_is_damage_only_when_the_schema_defines_it(message: str, damage: bool) -> None:
    from store.indexing.corruption import is_corruption

    assert is_corruption(sqlite3.OperationalError(message)) is damage
