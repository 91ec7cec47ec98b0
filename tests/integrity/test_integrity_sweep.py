"""The idle integrity sweep (``actors/integrity_sweep.py``) and the salvage's ``inconsistent`` rows
(RELIABILITY row 7, "damage nothing reads").

Found by ``scripts/chaos --mode corrupt``: a random byte changed a turn's id inside its row (``chaos…`` read
back as ``ch`os…``). Every page stayed well formed, so boot's ``quick_check`` passed, no request read the
row's index entry, and the host served the wrong id for as long as it ran (and after every restart). Only
``PRAGMA integrity_check`` sees it: the row no longer matches its entry in the primary key's index. Now the
host checks its index table by table while idle, meets the damage itself, restarts on a rebuilt index, and
the salvage leaves out the row whose value is wrong (``inconsistent``) instead of copying it.

The search indexes too: a leaf gone from ``messages_fts_data`` leaves every b-tree well formed
(``integrity_check`` passes) and breaks only the searches whose terms it held. FTS5's own ``integrity-check``
is the sweep's last step for each FTS5 table; it holds the write lock while it runs, so it gives way to the
DB writer."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import trio

from actors.db_reader import ReadPool
from actors.integrity_sweep import IntegritySweep
from protocol.models_host import StatusResult
from runtime.client import open_client
from store.indexing.group_commit import GroupStats
from store.indexing.integrity import (
    check_fts,
    check_table,
    fts_tables,
    open_fts_checker,
    sweep_tables,
    table_damage,
)
from store.indexing.salvage import salvage
from store.upgrade.schema import apply_schema
from tests.hostkit import msg, once_rebuilt, start_host_process

VICTIM = b"turn-victim-0003"


def _turns(path: Path, n: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_schema(conn)
    conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 't', 1, 1)")
    for i in range(n):
        conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES (?, 's1', 'completed', ?)",
                     (f"turn-victim-{i:04d}", 1000 + i))
    conn.close()


def _change_a_byte_of_the_row(db: Path, table: str, needle: bytes) -> None:
    """Change one byte of ``needle`` where ``table``'s own b-tree holds it (not in its indexes)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = [r[0] for r in conn.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,))]
    conn.close()
    data = bytearray(db.read_bytes())
    for page in pages:
        start = (page - 1) * page_size
        at = data.find(needle, start, start + page_size)
        if at >= 0:
            data[at + 1] = ord("`")  # "turn-…" reads "t`rn-…": still UTF-8, the page still well formed
            with open(db, "r+b") as f:
                f.seek(at + 1)
                f.write(b"`")
            return
    raise AssertionError(f"{needle!r} is on no page of {table}")


def test_a_byte_changed_inside_a_row_is_found_by_the_check_and_left_out_by_the_salvage(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    _turns(db, 8)
    _change_a_byte_of_the_row(db, "turns", VICTIM)
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"  # what boot runs: blind to it
    assert "turns" in sweep_tables(conn) and "messages_fts_data" in sweep_tables(conn)
    problems = check_table(conn, "turns")
    assert problems and any("missing from index" in p for p in problems), problems
    bad = table_damage(conn, "turns").inconsistent
    assert len(bad) == 1
    assert conn.execute("SELECT id FROM turns WHERE rowid = ?", (next(iter(bad)),)).fetchone() == ("t`rn-victim-0003",)
    assert check_table(conn, "kv") == []
    conn.close()
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    dst.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s1', 't', 1, 1)")
    out = salvage(dst, db, now_ms=5)
    ids = [r[0] for r in dst.execute("SELECT id FROM turns ORDER BY id")]
    dst.close()
    assert ids == [f"turn-victim-{i:04d}" for i in range(8) if i != 3], ids  # no wrong id, the rest copied
    assert out.skipped["turns"] == {"inconsistent": 1}, out


async def test_the_serving_host_finds_damage_no_request_reads_and_rebuilds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    # a pass every second, each step once the DB writer was idle 0.5 s (5 s by default): the polls below wait
    # for passes, not for idle periods
    proc = start_host_process(data, "--integrity-sweep", "1", "--integrity-sweep-after", "0.5")
    try:
        with trio.fail_after(90):
            async with open_client(proc.url, proc.token, client_id="agent-1", client_kind="agent") as c:
                await c.call("session.create", {"sessionId": "s1", "title": "sweep"})
                for i in range(6):
                    tid = f"turn-victim-{i:04d}"
                    await c.call("session.startTurn", {"sessionId": "s1", "turnId": tid})
                    await c.call("session.endTurn", {"sessionId": "s1", "turnId": tid, "status": "completed"})
                status = await c.call("host.status", {})
                boot_id = status["bootId"]
                # an undamaged index: whole passes, no restart
                for _ in range(120):  # polled: a pass ends only after the host stayed idle (bounded above)
                    if (await c.call("host.status", {}))["dbWriter"]["integrityPasses"] >= 1:
                        break
                    await trio.sleep(0.5)
                status = await c.call("host.status", {})
                assert status["bootId"] == boot_id
                StatusResult.model_validate(status)  # the new dbWriter counters against the wire model
            _change_a_byte_of_the_row(data / "pi.sqlite", "turns", VICTIM)
            async with open_client(proc.url, proc.token, client_id="agent-1", client_kind="agent") as c:
                # a commit: the readers' page caches see the file again; no request reads the turns table
                await c.call("settings.set", {"ns": "ui", "key": "k", "value": 1})
            async with once_rebuilt(proc) as again:
                status = await again.call("host.status", {})
                StatusResult.model_validate(status)  # the boot report's salvage fields against the wire model
                boot = status["boot"]
                turns = (await again.call("session.listTurns", {"sessionId": "s1", "limit": 50}))["turns"]
                assert boot["salvageSkipped"] == {"turns": 1}, boot.get("salvage")
                assert sorted(t["id"] for t in turns) == [f"turn-victim-{i:04d}" for i in range(6) if i != 3]
                assert (await again.call("settings.get", {"ns": "ui", "key": "k"}))["value"] == 1
        log = (data / "logs" / "host" / "host.ndjson").read_text()
        assert "the integrity sweep found the index damaged" in log
    finally:
        proc.kill9()


# ---------------------------------------------------------------------------------------------- FTS5's own check

def _words(i: int) -> str:
    """Message ``i``'s text: a word of its own (``w<i>x``) among words of every message."""
    return f"needle w{i:04d}x " + " ".join(f"{chr(97 + (i * 7 + k) % 26)}{chr(97 + (i + k * 3) % 26)}q{k}"
                                             for k in range(30))


def _drop_a_leaf(db: Path) -> int:
    """Delete one leaf of the search index's largest segment from ``messages_fts_data`` (not its first: the
    structure record says the segment has it); its id."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        leaves = [r[0] for r in conn.execute("SELECT id FROM messages_fts_data WHERE id > 10 ORDER BY id")]
        assert len(leaves) >= 3, leaves
        victim = int(leaves[len(leaves) // 2])
        conn.execute("DELETE FROM messages_fts_data WHERE id = ?", (victim,))
    finally:
        conn.close()
    return victim


def _index_with_leaves(db: Path, n: int) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    apply_schema(conn)
    conn.execute("BEGIN")
    for i in range(n):
        conn.execute("INSERT INTO messages_fts(rowid, text) VALUES (?, ?)", (i + 1, _words(i)))
    conn.execute("COMMIT")
    conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")  # one segment, many leaves
    conn.close()


def test_fts5s_check_finds_a_leaf_gone_that_integrity_check_and_most_searches_miss(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    _index_with_leaves(db, 200)
    conn = open_fts_checker(db)
    assert fts_tables(conn) == ["messages_fts", "tool_fts"]
    assert check_fts(conn, "messages_fts") == [] and check_fts(conn, "tool_fts") == []
    _drop_a_leaf(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # the shadow tables' b-trees: fine
    assert all(check_table(conn, t) == [] for t in sweep_tables(conn))
    # a search whose terms are on other leaves answers as before
    assert conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH '\"w0000x\"'").fetchall() == [(1,)]
    data_before = conn.execute("SELECT count(*), sum(length(block)) FROM messages_fts_data").fetchone()
    problems = check_fts(conn, "messages_fts")
    assert problems and "malformed" in problems[0], problems
    assert not conn.in_transaction  # rolled back, nothing written
    assert conn.execute("SELECT count(*), sum(length(block)) FROM messages_fts_data").fetchone() == data_before
    assert check_fts(conn, "tool_fts") == []
    conn.close()


class _WriterSetsOut(GroupStats):
    """The DB writer setting out to open a transaction at every look (the check's progress callback)."""

    @property  # type: ignore[override]
    def writes_begun(self) -> int:
        self._looks = getattr(self, "_looks", 0) + 1
        return self._looks

    @writes_begun.setter
    def writes_begun(self, value: int) -> None:
        pass


def _sweep(db: Path, stats: GroupStats) -> IntegritySweep:
    return IntegritySweep(ReadPool(db, size=1), stats, idle_after=0, interval=1, on_corruption=lambda exc: None,
                          db_path=db)


def test_fts5s_check_gives_way_to_the_db_writer(tmp_path: Path) -> None:
    """The check holds the write lock while it runs: it never waits for the writer's lock, and stops as soon as
    the writer sets out to open a transaction (None: try again once idle); left alone, it runs to the end."""
    db = tmp_path / "pi.sqlite"
    _index_with_leaves(db, 3000)  # large enough for the check to look more than once
    assert _sweep(db, GroupStats())._check_fts("messages_fts", threading.Event()) == []
    moving = _WriterSetsOut()
    assert _sweep(db, moving)._check_fts("messages_fts", threading.Event()) is None
    assert moving.writes_begun > 3  # the check looked (and stopped at its first look)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # the writer's transaction holds the lock
    try:
        assert _sweep(db, GroupStats())._check_fts("messages_fts", threading.Event()) is None
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    _drop_a_leaf(db)
    problems = _sweep(db, GroupStats())._check_fts("messages_fts", threading.Event())
    assert problems and "malformed" in problems[0], problems


async def test_the_serving_host_finds_a_search_index_leaf_gone_and_rebuilds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    n = 120
    # no idle upkeep: its merge step would meet the damage first (a restart too, but not the sweep's)
    proc = start_host_process(data, "--integrity-sweep", "1", "--integrity-sweep-after", "0.5",
                              "--search-upkeep-after", "0")
    try:
        with trio.fail_after(120):
            async with open_client(proc.url, proc.token, client_id="agent-1", client_kind="agent") as c:
                await c.call("session.create", {"sessionId": "s1", "title": "sweep"})
                for i in range(n):
                    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", _words(i))})
                for _ in range(120):  # an undamaged index: a whole pass, FTS5 checks included, no restart
                    status = await c.call("host.status", {})
                    if status["dbWriter"]["integrityPasses"] >= 1:
                        break
                    await trio.sleep(0.5)
                assert status["dbWriter"]["integrityPasses"] >= 1
                assert not status["boot"]["dbRebuilt"]
                _sql_optimize(data / "pi.sqlite")
                _drop_a_leaf(data / "pi.sqlite")
            async with once_rebuilt(proc) as again:
                found = await again.call("search.query", {"query": "needle", "limit": 500})
                assert sorted(h["messageId"] for h in found["results"]) == sorted(f"m{i}" for i in range(n))
                for i in (0, n // 2, n - 1):
                    one = await again.call("search.query", {"query": f"w{i:04d}x"})
                    assert [h["messageId"] for h in one["results"]] == [f"m{i}"]
        records = (data / "logs" / "host" / "host.ndjson").read_text()
        assert "the integrity sweep found the index damaged" in records and "messages_fts" in records
    finally:
        proc.kill9()


def _sql_optimize(db: Path) -> None:
    """The index merged into one segment of many leaves (what the idle upkeep does over time)."""
    conn = sqlite3.connect(db, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA trusted_schema = ON")
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
    finally:
        conn.close()


async def test_the_first_pass_comes_a_minute_after_boot_not_an_interval(tmp_path: Path, autojump_clock: object) -> None:
    """Damage made while no host ran (inside a row: boot's quick_check passes) is found by the first pass, a
    minute after boot, not an hour later (the interval between two passes)."""
    db = tmp_path / "pi.sqlite"
    _turns(db, 8)
    _change_a_byte_of_the_row(db, "turns", VICTIM)
    found: list[float] = []
    reads = ReadPool(db, size=1)
    try:
        await _first_pass_times(reads, db, found)
    finally:
        reads.close()


async def _first_pass_times(reads: ReadPool, db: Path, found: list[float]) -> None:
    start = trio.current_time()
    await IntegritySweep(reads, GroupStats(), idle_after=0, interval=3600, first_after=60, db_path=db,
                         on_corruption=lambda exc: found.append(trio.current_time() - start)).run()
    assert len(found) == 1 and 60 <= found[0] < 3600, found
    found.clear()
    start = trio.current_time()
    await IntegritySweep(reads, GroupStats(), idle_after=0, interval=30, first_after=60, db_path=db,
                         on_corruption=lambda exc: found.append(trio.current_time() - start)).run()
    assert len(found) == 1 and 30 <= found[0] < 60, found  # never later than the interval
