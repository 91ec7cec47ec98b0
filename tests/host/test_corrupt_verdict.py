"""The verdict "this index is corrupt" outlives the run that reached it (RELIABILITY.md row 7).

Found by chaos corrupt mode (seed 1522264345): a read met a value that does not decode (a changed byte in
a text column, which ``quick_check`` does not see), the host stopped to start again on a rebuilt index, and
the runner's SIGTERM came in between. ``pi-host serve`` then exits instead of restarting, and the next boot
served the same damaged index again, until a read met the damage once more. Now the stop records the
verdict (``index-corrupt`` in the data directory) and the next boot rebuilds, whoever starts it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError, open_client
from runtime.host import RunningHost, run_host
from tests import hostkit
from tests.hostkit import client_for, inprocess_host, msg


async def test_a_host_that_met_its_index_corrupt_and_stopped_rebuilds_it_at_the_next_boot(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "kept"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
        conn = sqlite3.connect(root / "pi.sqlite")
        with conn:  # one byte that is not UTF-8: every page well formed, quick_check passes
            conn.execute("UPDATE sessions SET title = CAST(X'ff41' AS TEXT) WHERE id = 's1'")
        conn.close()
        codes: list[str] = []
        async with trio.open_nursery() as nursery:  # the CLI would start it again; a signal came meanwhile
            running: RunningHost = await nursery.start(run_host, hostkit.test_config(root))
            async with client_for(running) as c:
                try:
                    await c.call("session.list", {})
                except RpcError as exc:
                    codes.append(exc.data_code)
            await running.shutdown.requested.wait()  # the host stops itself: it met its index corrupt
        assert codes == ["CORRUPT_DATA"] and running.shutdown.restart_reason == "index_corrupt"
        assert (root / "index-corrupt").exists()
        async with inprocess_host(root) as again, client_for(again) as c:
            database = (await c.call("host.status", {}))["boot"]["database"]
            listed = (await c.call("session.list", {}))["sessions"]
            got = await c.call("session.get", {"sessionId": "s1"})
        assert database["rebuilt"] is True and database["quarantined"]
        assert [s["id"] for s in listed] == ["s1"] and [m["id"] for m in got["messages"]] == ["m1"]
        assert not (root / "index-corrupt").exists()  # spent: the boot after does not rebuild again
        async with inprocess_host(root) as third, client_for(third) as c:
            assert (await c.call("host.status", {}))["boot"]["database"]["rebuilt"] is False


async def test_a_plain_stop_leaves_no_verdict(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1"})
        assert not (root / "index-corrupt").exists()
        async with inprocess_host(root) as again, client_for(again) as c:
            assert (await c.call("host.status", {}))["boot"]["database"]["rebuilt"] is False


async def test_a_boot_killed_while_it_rebuilds_on_the_verdict_still_salvages_the_damaged_copy(
        tmp_path: Path) -> None:
    """Found by chaos corrupt mode (seed 1815820303): the host met its index corrupt (the integrity sweep),
    stopped with the verdict recorded and started again; the runner's SIGKILL landed during that rebuilding
    boot, after it quarantined the damaged file and marked the salvage it owed in the new index, before the
    salvage ran. The verdict was spent only once a boot finished, so the next boot read it again and
    quarantined the new index (nothing but what the killed boot had written), then salvaged from that one: the
    damaged copy's DB-only rows (settings, turns, approvals, notifications ...) were never salvaged, and 224
    acknowledged effects were lost. The verdict is spent as soon as its file is quarantined; the mark in the
    new index carries the salvage still owed to the next boot."""
    data = tmp_path / "data"
    data.mkdir()
    proc = hostkit.start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as c:
                await c.call("session.create", {"sessionId": "s1", "title": "kept"})
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "hello")})
                await c.call("settings.set", {"ns": "ui", "key": "sidebarWidth", "value": 280})
    finally:
        assert proc.terminate() == 0
    (verdict := data / "index-corrupt").write_bytes(b'{"metCorruptAt": 1}\n')  # a running host met it corrupt
    with pytest.raises(RuntimeError, match="exited with -9"):  # killed after the salvage's first table
        hostkit.start_host_process(data, env={"RT_CRASHPOINT": "salvage.after_table:1"}, timeout=30)
    assert not verdict.exists()  # spent: its file is in quarantine
    proc = hostkit.start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as c:
                boot = (await c.call("host.status", {}))["boot"]
                width = (await c.call("settings.get", {"ns": "ui", "key": "sidebarWidth"})).get("value")
                got = await c.call("session.get", {"sessionId": "s1"})
    finally:
        proc.kill9()
    copies = sorted(p.name for p in (data / "quarantine").glob("pi.sqlite.corrupt-*") if "-wal" not in p.name
                    and "-shm" not in p.name)
    assert len(copies) == 1, copies  # the new index was not quarantined again
    assert Path(boot["salvage"]["source"]).name == copies[0] and boot["salvaged"].get("kv")
    assert width == 280 and [m["id"] for m in got["messages"]] == ["m1"]
