"""How the CLI tells a running host from a killed one (:func:`runtime.cli_client.find_host`), at the moment in
between: a host killed a moment ago is a zombie whose main thread shows ``Z`` while its other threads are still
torn down, and the kernel drops ``host.lock`` only with the last of them. ``status`` then called it running, tried
to connect, and said "did not answer" instead of "the host was killed" (a CI run met it), and an offline read
met the lock still held."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import cli_client, cli_online
from runtime.cli_client import find_host
from runtime.datadir import DataDir


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited and that nobody has reaped yet."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    while Path(f"/proc/{pid}/stat").exists() and b") Z" not in Path(f"/proc/{pid}/stat").read_bytes():
        threading.Event().wait(0.005)
    yield pid
    os.waitpid(pid, 0)


def _data(tmp_path: Path, pid: int, port: int = 9) -> DataDir:
    data = DataDir(tmp_path)
    data.lock_path.touch()
    (tmp_path / "token").write_text("t")
    data.host_json_path.write_text(json.dumps({"pid": pid, "url": f"ws://127.0.0.1:{port}", "tokenFile": "token"}))
    return data


def _hold(data: DataDir) -> int:
    fd = os.open(data.lock_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs to see a zombie")
def test_a_zombie_still_holding_the_lock_is_called_killed_once_it_lets_go(tmp_path: Path, zombie: int) -> None:
    data = _data(tmp_path, zombie)
    fd = _hold(data)  # the dying host's last threads
    released = threading.Timer(0.2, os.close, (fd,))
    released.start()
    try:
        state = find_host(data)
    finally:
        released.join()
    assert not state.running and not state.booting and state.stale_pid == zombie
    assert state.problem is not None and f"pid {zombie} is not running (the host was killed)" in state.problem
    assert not cli_client.lock_held(data)  # waited for the lock: an offline read may take it now


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs to see a zombie")
def test_a_zombie_that_never_lets_go_is_still_called_killed_after_a_bounded_wait(
        tmp_path: Path, zombie: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_client, "DYING_HOST_LOCK_WAIT_S", 0.1)
    data = _data(tmp_path, zombie)
    fd = _hold(data)
    try:
        state = find_host(data)
        assert cli_client.lock_held(data)
    finally:
        os.close(fd)
    assert not state.running and state.stale_pid == zombie and "(the host was killed)" in (state.problem or "")


def test_a_live_pid_holding_the_lock_is_running(tmp_path: Path) -> None:
    data = _data(tmp_path, os.getpid())
    fd = _hold(data)
    try:
        state = find_host(data)
    finally:
        os.close(fd)
    assert state.running and state.pid == os.getpid()


def test_the_lock_free_and_a_reaped_pid_is_stale(tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    state = find_host(_data(tmp_path, pid))
    assert not state.running and state.stale_pid == pid and "(the host was killed)" in (state.problem or "")


def test_a_host_killed_between_the_look_and_the_call_is_called_killed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``status`` found the lock held, then the host died before it connected: it says what a second look
    says (the host was killed), not "did not answer"."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # the pid the host had, gone by the time of the call
    data = _data(tmp_path, pid, port)
    fd = _hold(data)
    real = cli_online.open_client

    def dies_first(*args: object, **kwargs: object) -> object:
        os.close(fd)  # the host is killed: the kernel drops its lock
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cli_online, "open_client", dies_first)
    assert find_host(data).running  # the first look: a host holds the lock
    code = cli_online.ask_host("status", argparse.Namespace(json=False), data)
    err = capsys.readouterr().err
    assert code == cli_client.EXIT_NO_HOST
    assert f"is stale: pid {pid} is not running (the host was killed)" in err and "did not answer" not in err, err
