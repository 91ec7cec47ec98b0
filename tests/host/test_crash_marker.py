"""The clean-shutdown marker is written only after a clean drain (ARCHITECTURE.md "Shutdown")."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.host import RunningHost, run_host
from runtime.kernel.supervisor import RestartIntensityExceeded
from tests import hostkit
from tests.hostkit import client_for, inprocess_host


async def test_restart_intensity_crash_leaves_no_clean_marker(tmp_path: Path) -> None:
    """Reproduces issue 22: a host that died of ``RestartIntensityExceeded`` (the DB writer
    killed past the restart intensity) wrote the clean-shutdown marker in its outer
    ``finally``, so the next boot reported ``cleanShutdown: true`` for a crash."""
    root = tmp_path / "data"
    kills = 0
    with trio.fail_after(60), pytest.RaisesGroup(RestartIntensityExceeded, flatten_subgroups=True):
        async with inprocess_host(root, restart_intensity=2, restart_period=60.0) as host:
            async with client_for(host) as c:
                await c.call("session.create", {"sessionId": "before-crash"})
            while True:  # each kill is a restart, until the supervisor gives up (the host crashes)
                if host.kill_actor("db-writer"):
                    kills += 1
                await trio.sleep(0.02)
    assert kills == 3  # two restarts admitted, the third crash is one too many
    assert not (root / "clean-shutdown").exists()
    assert not (root / "host.json").exists()  # the host is gone either way
    async with inprocess_host(root) as again, client_for(again) as c:
        boot = (await c.call("host.status", {}))["boot"]
        listed = await c.call("session.list", {})
    assert boot["cleanShutdown"] is False
    assert "previousShutdown" not in boot
    assert [s["id"] for s in listed["sessions"]] == ["before-crash"]


async def test_orderly_stop_still_writes_the_marker(tmp_path: Path) -> None:
    """The other half: a requested shutdown that drained writes the marker, and the next boot says so."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            host: RunningHost = await nursery.start(run_host, hostkit.test_config(root))
            host.shutdown.request()  # run_host returns once it has drained; the nursery then exits
    assert (root / "clean-shutdown").exists()
    async with inprocess_host(root) as again, client_for(again) as c:
        boot = (await c.call("host.status", {}))["boot"]
    assert boot["cleanShutdown"] is True
