"""SIGINT/SIGTERM during a long boot stop it between two steps (issue 22)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from runtime.boot import BootInterrupted, run_boot
from runtime.client import open_client
from runtime.datadir import DataDir
from runtime.host import Shutdown, run_host
from store.faults import NO_FAULTS
from store.transcripts.transcript import header_line
from tests import hostkit
from tests.hostkit import REPO, start_host_process

SESSIONS = 100
"""Header-only transcripts the index has no row for: boot reconciles each in its own
transaction, which makes the boot last long enough to be signalled in it."""


def _slow_data_dir(root: Path) -> None:
    data_dir = DataDir(root)
    data_dir.ensure()
    for i in range(SESSIONS):
        sid = f"slow{i:04d}"
        line, _ = header_line(sid, 1_700_000_000_000)
        (data_dir.sessions_dir / f"{sid}.jsonl").write_bytes(line)
    # As after a clean stop: boot removes the marker as it begins, which tells the test it runs.
    data_dir.clean_shutdown_path.write_bytes(b'{"at": 0, "actors": {}}')


def _serve_until_signalled_in_boot(root: Path, signum: int) -> tuple[int, str]:
    marker = root / "clean-shutdown"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "--data-dir", str(root), "serve", "--port", "0", "--quiet"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, proc.communicate()
        assert not (root / "host.json").exists(), "the boot was over before the signal: make it slower"
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err.decode()


async def test_sigterm_during_boot_stops_it_between_steps(tmp_path: Path) -> None:
    """Reproduces issue 22: SIGTERM during a long boot was ignored until the boot had finished
    (the host then started serving and shut down). Now boot stops before its next step, says
    which one on stderr, exits 128+SIGTERM and leaves no clean-shutdown marker."""
    root = tmp_path / "data"
    _slow_data_dir(root)
    code, err = await trio.to_thread.run_sync(_serve_until_signalled_in_boot, root, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("pi-host: stopping during boot (SIGTERM): interrupted before "), err
    assert "listening" not in err
    assert not (root / "clean-shutdown").exists()
    assert not (root / "host.json").exists()

    again = start_host_process(root)  # the lock was released; the next boot finishes the work
    try:
        async with open_client(again.url, again.token, client_id="check", client_kind="test") as c:
            boot = (await c.call("host.status", {}))["boot"]
            listed = await c.call("session.list", {"limit": 500})
    finally:
        assert again.terminate() == 0
        again.proc.communicate(timeout=30)
    assert boot["cleanShutdown"] is False  # the interrupted boot is not a clean stop
    assert boot["sessionsScanned"] == SESSIONS
    assert len(listed["sessions"]) == SESSIONS


def test_boot_stops_before_the_step_during_which_a_stop_was_asked(tmp_path: Path) -> None:
    """Each step that ran stays done; the next boot goes on from there."""
    root = tmp_path / "data"
    _slow_data_dir(root)
    asked: list[str] = []

    def stop_requested() -> bool:
        asked.append("?")
        return len(asked) == 5  # the 5th look: between the secrets step and reconcile

    with pytest.raises(BootInterrupted) as stopped:
        run_boot(DataDir(root), faults=NO_FAULTS, now_ms=lambda: 1_700_000_000_000, stop_requested=stop_requested)
    assert stopped.value.step == "reconciling the transcripts with the index"
    assert str(stopped.value) == "interrupted before reconciling the transcripts with the index"
    done = run_boot(DataDir(root), faults=NO_FAULTS, now_ms=lambda: 1_700_000_000_000)
    try:
        assert done.report["reconcile"]["full"] == SESSIONS  # the interrupted boot never reached it
    finally:
        done.conn.close()


async def test_a_host_asked_to_stop_before_it_serves_stops_in_boot_without_a_marker(tmp_path: Path) -> None:
    """``run_host`` with a stop already asked for: ``BootInterrupted``, nothing served, no marker."""
    root = tmp_path / "data"
    _slow_data_dir(root)
    shutdown = Shutdown()
    shutdown.request()
    with trio.fail_after(30), pytest.raises(BootInterrupted, match="interrupted before opening the index"):
        await run_host(hostkit.test_config(root), shutdown=shutdown)
    assert not (root / "clean-shutdown").exists()
    assert not (root / "host.json").exists()
