"""The DB writer holds index ops nobody reads yet for ``HostConfig.index_hold`` seconds, so a steady
stream of awaited appends shares its index commits (the trigram index's CPU per message falls with the
batch, issue 26); a read that needs the rows ends the hold at once (read-your-writes)."""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.config import HostConfig
from tests.hostkit import client_for, inprocess_host, msg

GAP = 0.07  # seconds between appends: longer than the old 0.05 s hold, well inside the default


def test_default_hold_spans_appends_arriving_apart() -> None:
    assert HostConfig.__dataclass_fields__["index_hold"].default >= 3 * GAP


async def test_appends_arriving_apart_share_one_index_commit(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
        sid = (await c.call("session.create", {"sessionId": "hold", "title": "hold"}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("warm", "warm")})
        await c.call("session.get", {"sessionId": sid})  # a read: the warm-up's index op commits now
        before = (await c.call("host.status", {}))["dbWriter"]
        for i in range(3):
            if i:
                await trio.sleep(GAP)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"zebra {i}")})
        got = await c.call("search.sessions", {"query": "zebra"})  # a barrier read ends the hold
        after = (await c.call("host.status", {}))["dbWriter"]
    assert [(r["sessionId"], r["messageMatches"]) for r in got["results"]] == [(sid, 3)]
    # one commit for the three (two when the machine stalled past the hold): not one per append
    assert after["batches"] - before["batches"] <= 2, (before, after)
