"""``pi-host follow`` across a lost connection: a visible waiting line, "reconnected; resumed at cursor N" with the
missed events when the host kept running, a resync line when it restarted, and a clean exit on Ctrl-C (130, the
shell's 128 + SIGINT), also while it waits.

Reproduces issue 25's "reconnection done once, well, in every client ... ``follow``": follow reconnected
silently (nothing told the user the host was gone, nor where it resumed).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
import trio

from runtime.client import open_client
from tests.clients.relay import Relay
from tests.hostkit import REPO, HostProcess, msg, start_host_process


class Follow:
    """``pi-host follow SESSION`` as a subprocess; stdout and stderr read line by line by threads."""

    def __init__(self, data: Path, sid: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "follow", sid],
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.out: queue.Queue[str] = queue.Queue()
        self.err: queue.Queue[str] = queue.Queue()
        self.seen_out: list[str] = []
        self.seen_err: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._streams = (self.proc.stdout, self.proc.stderr)
        self._readers = [threading.Thread(target=self._read, args=(stream, q), daemon=True)
                         for stream, q in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], q: queue.Queue[str]) -> None:
        for line in stream:
            q.put(line.rstrip("\n"))

    def expect(self, which: str, match: Callable[[str], bool], timeout: float = 30) -> str:
        q, seen = (self.out, self.seen_out) if which == "out" else (self.err, self.seen_err)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = q.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(line)
            if match(line):
                return line
        raise AssertionError(f"no matching {which} line in {timeout} s: out={self.seen_out} err={self.seen_err}")

    def interrupt(self) -> float:
        """Ctrl-C; how long the exit took (seconds)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        return time.monotonic() - start

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        for stream in self._streams:
            stream.close()


def _append(url: str, token: str, sid: str, mid: str) -> None:
    async def go() -> None:
        async with open_client(url, token, client_id="follow-feed", client_kind="test") as c:
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, mid)})

    trio.run(go)


def _session(host: HostProcess) -> str:
    async def go() -> str:
        async with open_client(host.url, host.token, client_id="follow-setup", client_kind="test") as c:
            created = await c.call("session.create", {"title": "Followed"})
            await c.call("session.appendMessage", {"sessionId": created["id"], "message": msg("m1", "first")})
            return str(created["id"])

    return trio.run(go)


@pytest.mark.slow  # a host killed, then booted again
def test_follow_waits_visibly_for_a_restarted_host_then_resyncs(tmp_path: Path) -> None:
    """Issue 25: the host is SIGKILLed: follow prints one waiting line (not one per attempt), then, once a new
    host runs, "reconnected; resubscribed without a cursor ..." and a resync line (a new boot cannot replay the
    old one's events), then the events that follow; Ctrl-C ends it within a couple of seconds, exit 130."""
    data = tmp_path / "data"
    host = start_host_process(data)
    sid = _session(host)
    follow = Follow(data, sid)
    try:
        follow.expect("err", lambda x: "following" in x)
        host.kill9()
        host.proc.communicate()
        follow.expect("err", lambda x: x.startswith("pi-host: waiting for a host: "))
        time.sleep(2)  # several attempts, each failing the same way
        host = start_host_process(data)
        follow.expect("err", lambda x: x.startswith("pi-host: reconnected; resubscribed without a cursor"))
        follow.expect("out", lambda x: x.startswith("-- resync: the host restarted"))
        _append(host.url, host.token, sid, "after-restart")
        follow.expect("out", lambda x: "session.message" in x and "after-restart" in x)
        waiting = [x for x in follow.seen_err if "waiting for" in x]
        assert len(waiting) <= 2, follow.seen_err  # the same state is said once, not per attempt
        took = follow.interrupt()
        assert follow.proc.returncode == 130 and took < 5, (follow.proc.returncode, took)
        assert not any("Traceback" in x for x in follow.seen_err + list(follow.err.queue))
    finally:
        follow.stop()
        host.terminate()
        host.proc.communicate()


def test_follow_resumes_at_its_cursor_with_the_missed_events(tmp_path: Path) -> None:
    """Issue 25: the connection drops while the host runs on (a relay taken down; ``host.json`` points follow at
    it) and two messages are appended meanwhile: follow says it waits, then "reconnected; resumed at cursor N"
    with the cursor of the last event it printed, then prints the two missed events, nothing twice, no resync;
    Ctrl-C while it waits for the relay also exits cleanly."""
    data = tmp_path / "data"
    host = start_host_process(data)
    sid = _session(host)
    relay = Relay(int(host.url.rsplit(":", 1)[1].split("/")[0]))
    host_json = data / "host.json"
    info = json.loads(host_json.read_text())
    host_json.write_text(json.dumps({**info, "url": f"ws://127.0.0.1:{relay.port}"}))
    follow = Follow(data, sid)
    try:
        follow.expect("err", lambda x: "following" in x)
        _append(host.url, host.token, sid, "a1")
        line = follow.expect("out", lambda x: "a1" in x)
        cursor = int(line.split("]")[0].lstrip("["))
        relay.down()
        follow.expect("err", lambda x: x.startswith("pi-host: waiting for the host to answer: "))
        _append(host.url, host.token, sid, "b1")
        _append(host.url, host.token, sid, "b2")
        relay.up()
        follow.expect("err", lambda x: x == f"pi-host: reconnected; resumed at cursor {cursor}")
        follow.expect("out", lambda x: "b2" in x)
        messages = [x.split()[-1] for x in follow.seen_out if "session.message" in x]
        assert messages == ["a1", "b1", "b2"], follow.seen_out
        assert not any(x.startswith("-- resync") for x in follow.seen_out)

        relay.down()
        follow.expect("err", lambda x: x.startswith("pi-host: waiting for the host to answer: "))
        took = follow.interrupt()
        assert follow.proc.returncode == 130 and took < 5, (follow.proc.returncode, took)
        assert not any("Traceback" in x for x in follow.seen_err + list(follow.err.queue))
    finally:
        follow.stop()
        relay.down()
        host.terminate()
        host.proc.communicate()


def _delete(host: HostProcess, sid: str) -> None:
    async def go() -> None:
        async with open_client(host.url, host.token, client_id="follow-delete", client_kind="test") as c:
            await c.call("session.delete", {"sessionId": sid})

    trio.run(go)


def _show_exit(data: Path, sid: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    return subprocess.run([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "show", sid],
                          cwd=REPO, capture_output=True, env=env, timeout=60, check=False).returncode


def test_follow_ends_when_its_session_is_deleted(tmp_path: Path) -> None:
    """The followed session is deleted: follow printed the session.deleted event and went on waiting for events
    that never come. Now it says so in one line and exits 1, what `pi-host show` of that session exits."""
    data = tmp_path / "data"
    host = start_host_process(data)
    sid = _session(host)
    follow = Follow(data, sid)
    try:
        follow.expect("err", lambda x: "following" in x)
        _delete(host, sid)
        follow.expect("out", lambda x: "session.deleted" in x)
        follow.expect("err", lambda x: x == f"pi-host: session {sid} was deleted; nothing more to follow")
        follow.proc.wait(timeout=10)
        assert follow.proc.returncode == 1 == _show_exit(data, sid), follow.seen_err
        assert not any("Traceback" in x for x in follow.seen_err + list(follow.err.queue))
    finally:
        follow.stop()
        host.terminate()
        host.proc.communicate()
    helped = subprocess.run([sys.executable, "-m", "runtime.cli", "follow", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, check=True).stdout
    assert "session is deleted" in " ".join(helped.split()) and "exits 1" in helped


@pytest.mark.slow  # a host killed, then booted again
def test_follow_ends_when_its_session_was_deleted_while_it_waited(tmp_path: Path) -> None:
    """Deleted while follow was away (here: stopped while its host was killed and a new one deleted the
    session): the new host cannot replay the deletion, so after the resync follow finds the session gone,
    says so in one line and exits 1."""
    data = tmp_path / "data"
    host = start_host_process(data)
    sid = _session(host)
    follow = Follow(data, sid)
    try:
        follow.expect("err", lambda x: "following" in x)
        follow.proc.send_signal(signal.SIGSTOP)
        host.kill9()
        host.proc.communicate()
        host = start_host_process(data)
        _delete(host, sid)
        follow.proc.send_signal(signal.SIGCONT)
        follow.expect("out", lambda x: x.startswith("-- resync: "))
        follow.expect("err", lambda x: x == f"pi-host: session {sid} was deleted; nothing more to follow")
        follow.proc.wait(timeout=10)
        assert follow.proc.returncode == 1, follow.seen_err
        assert not any("Traceback" in x for x in follow.seen_err + list(follow.err.queue))
    finally:
        follow.proc.send_signal(signal.SIGCONT)
        follow.stop()
        host.terminate()
        host.proc.communicate()
