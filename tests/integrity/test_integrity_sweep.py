"""The idle integrity sweep (``actors/integrity_sweep.py``) and the salvage's ``inconsistent`` rows
(RELIABILITY row 7, "damage nothing reads").

Found by ``scripts/chaos --mode corrupt``: a random byte changed a turn's id inside its row (``chaos…`` read
back as ``ch`os…``). Every page stayed well formed, so boot's ``quick_check`` passed, no request read the
row's index entry, and the host served the wrong id for as long as it ran (and after every restart). Only
``PRAGMA integrity_check`` sees it: the row no longer matches its entry in the primary key's index. Now the
host checks its index table by table while idle, meets the damage itself, restarts on a rebuilt index, and
the salvage leaves out the row whose value is wrong (``inconsistent``) instead of copying it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from protocol.models_host import StatusResult
from runtime.client import open_client
from store.indexing.integrity import check_table, inconsistent_rows, sweep_tables
from store.indexing.salvage import salvage
from store.upgrade.schema import apply_schema
from tests.hostkit import once_rebuilt, start_host_process

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
    bad = inconsistent_rows(conn, "turns")
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
    proc = start_host_process(data, "--integrity-sweep", "1")
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
