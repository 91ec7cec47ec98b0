"""A missing host, a bad token, a failing body: the SDK, the chat and the agent say so at once, in one line.

Reproduces issue 25's "a missing host is handled badly outside the CLI": the
SDK's ``connect()`` raised a ``BaseExceptionGroup`` (so ``except
ConnectionLost`` caught nothing, the chat's handler included, which printed a
25-line traceback after 30 s), a bad token (``UNAUTHENTICATED``, not
retriable) was retried for the whole 30 s timeout, and the agent waited
silently, even for a data directory that does not exist.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import ConnectionLost, HostNotRunning, HostRefused, RpcError, connect
from tests.hostkit import REPO, HostProcess, start_host_process

BACKENDS = ("asyncio", "trio")


@pytest.fixture
def host(tmp_path: Path) -> Any:
    started = start_host_process(tmp_path / "data")
    try:
        yield started
    finally:
        started.terminate()
        started.proc.communicate()


def _raised(backend: str, **kwargs: Any) -> BaseException:
    """What ``async with connect(**kwargs)`` raises, under ``backend``; a 10 s bound (the old timeout was 30 s)."""

    async def attempt() -> BaseException:
        with anyio.fail_after(10):
            try:
                async with connect(client_id="failures", **kwargs):
                    pass
            except BaseException as exc:  # noqa: B036 - the test inspects exactly what comes out
                return exc
        raise AssertionError("connect() succeeded")

    return anyio.run(attempt, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_token_fails_at_once_with_a_typed_exception(host: HostProcess, backend: str) -> None:
    """Issue 25: UNAUTHENTICATED is not retried; connect() raises HostRefused (a ConnectionLost), not a group."""
    exc = _raised(backend, url=host.url, token="0" * 64, connect_timeout=30)
    assert type(exc) is HostRefused and isinstance(exc, ConnectionLost), repr(exc)
    assert exc.code == "UNAUTHENTICATED"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_token_given_with_the_data_directory_is_the_one_sent(host: HostProcess, backend: str) -> None:
    """``connect(data_dir=..., token=...)`` ignored the token it was given and sent the token file's, so a
    wrong token connected (and a right one given for a data directory whose token file this user cannot read
    never counted). The data directory names the url; a token given is the one sent."""
    exc = _raised(backend, data_dir=host.data_dir, token="0" * 64, connect_timeout=30)
    assert type(exc) is HostRefused and exc.code == "UNAUTHENTICATED", repr(exc)

    async def right_token() -> str:
        async with connect(client_id="failures", data_dir=host.data_dir, token=f"{host.token}\n") as client:
            return str((await client.host.status())["version"])

    assert anyio.run(right_token, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_handshake_fails_at_once_even_when_waiting_for_a_host(host: HostProcess, backend: str) -> None:
    """clients/python/README.md, "The first connection": a handshake the host refuses (an Origin it does not
    allow: 403) is ``HostRefused`` (``HANDSHAKE_REFUSED``, the status and the host's reason) at once, as in the
    TypeScript client; retrying cannot fix it, so ``wait_for_host`` does not retry it either. It was retried for
    the whole ``connect_timeout``."""
    exc = _raised(backend, url=host.url, token=host.token, origin="http://evil.example", connect_timeout=30,
                  wait_for_host=True)
    assert type(exc) is HostRefused and exc.code == "HANDSHAKE_REFUSED" and exc.status == 403, repr(exc)
    assert "HTTP 403" in str(exc) and "Origin http://evil.example is not allowed" in str(exc), str(exc)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_host_fails_at_once_unless_asked_to_wait(tmp_path: Path, backend: str) -> None:
    """Issue 25: a data directory that does not exist, and one no host runs on, fail at once; waiting for a
    host is asked for, says so, and ends in a plain ConnectionLost at its timeout."""
    missing = _raised(backend, data_dir=tmp_path / "nowhere")
    assert isinstance(missing, HostNotRunning) and missing.no_data_dir and isinstance(missing, ConnectionLost)
    assert "does not exist" in str(missing)
    (tmp_path / "empty").mkdir()
    idle = _raised(backend, data_dir=tmp_path / "empty")
    assert isinstance(idle, HostNotRunning) and not idle.no_data_dir and "no host.json" in str(idle)
    said: list[str] = []
    waited = _raised(backend, data_dir=tmp_path / "empty", wait_for_host=True, connect_timeout=1,
                     on_state=said.append)
    assert type(waited) is ConnectionLost and "could not connect within 1" in str(waited)
    assert said and said[0].startswith("waiting for a host: no host is running on"), said


@pytest.mark.parametrize("backend", BACKENDS)
def test_errors_raised_in_the_body_come_out_unwrapped(host: HostProcess, backend: str) -> None:
    """Issue 25: an RpcError (or any exception) raised inside ``async with connect()`` is caught by its own
    ``except``, not hidden in an exception group."""

    async def body() -> tuple[str, str]:
        try:
            async with connect(host.url, host.token, client_id="unwrap") as c:
                await c.session.get(session_id="s_does_not_exist")
        except RpcError as exc:
            code = exc.data_code
        try:
            async with connect(host.url, host.token, client_id="unwrap"):
                raise KeyError("mine")
        except KeyError as exc:
            mine = str(exc)
        return code, mine

    assert anyio.run(body, backend=backend) == ("SESSION_NOT_FOUND", "'mine'")


def _program(module: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_the_chat_and_the_agent_say_in_one_line_that_there_is_no_host(tmp_path: Path) -> None:
    """Issue 25: no 30 s blank screen and traceback, no silent wait: one line on stderr, exit status 2."""
    (tmp_path / "empty").mkdir()
    for module in ("pihost_client.chat", "pihost_client.agent"):
        done = _program(module, "--data-dir", str(tmp_path / "nowhere"))
        assert done.returncode == 2, (module, done.stderr)
        assert done.stderr.strip().splitlines() == [
            f"pi-host {module.split('.')[1]}: no host has used {tmp_path / 'nowhere'}: the data directory does not "
            "exist"], done.stderr
    done = _program("pihost_client.chat", "--data-dir", str(tmp_path / "empty"))
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"pi-host chat: no host is running on {tmp_path / 'empty'} (no host.json)"], done.stderr


def test_the_agent_says_it_waits_for_a_host_then_connects(tmp_path: Path) -> None:
    """Issue 25: the agent on a data directory with no host yet prints its waiting line, then connects to the
    host started there."""
    data = tmp_path / "data"
    data.mkdir()
    err = (tmp_path / "agent.err").open("w")
    agent = subprocess.Popen([sys.executable, "-m", "pihost_client.agent", "--data-dir", str(data),
                              "--controller-id", "agent-waits"], cwd=REPO, stdout=subprocess.PIPE, stderr=err,
                             text=True)
    host: HostProcess | None = None
    try:
        deadline = time.monotonic() + 30
        while "waiting for a host" not in (tmp_path / "agent.err").read_text():
            assert agent.poll() is None and time.monotonic() < deadline, (tmp_path / "agent.err").read_text()
            time.sleep(0.1)
        host = start_host_process(data)
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert "agent-waits connected" in line, line
    finally:
        agent.terminate()
        agent.communicate(timeout=30)
        err.close()
        if host is not None:
            host.terminate()
            host.proc.communicate()
    said = (tmp_path / "agent.err").read_text().splitlines()
    assert said[0] == f"pi-host agent: waiting for a host: no host is running on {data} (no host.json)", said
    assert said[1] == "pi-host agent: connected", said
