"""``pi-host serve`` says what boot repaired after a crash.

Reproduces issue 25's "boot recovery prints only ``boot finished`` after a crash that it repaired": a host
SIGKILLed mid-turn, its transcript left with a torn last line, started again and printed nothing about it.
"""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.cli_serve import recovery_line
from runtime.client import open_client
from tests.hostkit import HostProcess, msg, start_host_process
from tests.migrations.seedkit import VERSIONS, build_seed_dir


def _stdout_after_listening(host: HostProcess) -> list[str]:
    """Stops the host; what it printed on stdout."""
    host.terminate()
    out, _ = host.proc.communicate()
    return out.decode().splitlines()


def test_a_crash_repaired_at_boot_is_reported_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host = start_host_process(data)

    async def work() -> str:
        async with open_client(host.url, host.token, client_id="boot-line", client_kind="agent") as c:
            sid = str((await c.call("session.create", {"title": "Crash"}))["id"])
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "before the crash")})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            return sid

    sid = trio.run(work)
    host.kill9()
    out, _ = host.proc.communicate()
    assert not any("recovered" in line for line in out.decode().splitlines())  # a new data dir: nothing to say
    with (data / "sessions" / f"{sid}.jsonl").open("ab") as f:
        f.write(b'{"type":"message","id":"torn","role":"user","blo')  # the half-written line of a crash

    again = start_host_process(data)
    lines = _stdout_after_listening(again)
    recovered = [line for line in lines if line.startswith("pi-host: recovered from an unclean shutdown")]
    assert len(recovered) == 1, lines
    assert "1 torn tail cut" in recovered[0] and "1 running turn marked aborted" in recovered[0], recovered

    again = start_host_process(data)  # stopped cleanly just now: nothing to report
    assert not any("recovered" in line for line in _stdout_after_listening(again))


def test_the_line_says_when_nothing_needed_repair() -> None:
    """An unclean stop with nothing to repair still says so; a clean one says nothing."""
    report = {"cleanShutdown": False, "sessionsScanned": 0, "database": {"createdFresh": False}, "durationMs": 7}
    assert recovery_line(report) == "pi-host: recovered from an unclean shutdown in 7 ms: nothing needed repair"
    assert recovery_line({**report, "cleanShutdown": True}) is None
    assert recovery_line({**report, "database": {"createdFresh": True}}) is None


def test_the_first_start_on_an_earlier_apps_directory_is_not_called_a_crash_recovery(tmp_path: Path) -> None:
    """A seed-era directory never had pi-host's clean-shutdown marker (nor its ``host.token``): its first boot
    scans and upgrades it, and the line says so, not "recovered from an unclean shutdown"; the second start,
    after a clean stop, says nothing."""
    data = tmp_path / "data"
    build_seed_dir(data, VERSIONS[-1])
    lines = _stdout_after_listening(start_host_process(data))
    assert not any("unclean shutdown" in line for line in lines), lines
    first = [line for line in lines if line.startswith("pi-host: first start on this data directory")]
    assert len(first) == 1 and "sessions scanned" in first[0], lines
    assert not any(line.startswith("pi-host: ") and "start" in line
                   for line in _stdout_after_listening(start_host_process(data))[1:])
    report = {"cleanShutdown": False, "sessionsScanned": 0, "database": {"createdFresh": False}, "durationMs": 7}
    assert recovery_line(report, first_start=True) == "pi-host: first start on this data directory in 7 ms: " \
                                                      "nothing to take in"
    assert recovery_line({**report, "cleanShutdown": True}, first_start=True) is None
