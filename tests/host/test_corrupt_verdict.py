"""The verdict "this index is corrupt" outlives the run that reached it (RELIABILITY.md row 7).

Found by chaos corrupt mode (seed 1522264345): a read met a value that does not decode (a changed byte in
a text column, which ``quick_check`` does not see), the host stopped to start again on a rebuilt index, and
the runner's SIGTERM came in between. ``pi-host serve`` then exits instead of restarting, and the next boot
served the same damaged index again, until a read met the damage once more. Now the stop records the
verdict (``index-corrupt`` in the data directory) and the next boot rebuilds, whoever starts it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import trio

from runtime.client import RpcError
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
