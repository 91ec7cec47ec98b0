"""Test helpers: run a host in-process or as a real subprocess, and talk to it."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from runtime.config import HostConfig
from runtime.datadir import DataDir
from runtime.host import RunningHost, run_host
from tests.host_fork import ForkedHost, exec_hosts

REPO = Path(__file__).resolve().parents[1]


def test_config(root: Path, **overrides: Any) -> HostConfig:
    cfg = HostConfig(data_dir=DataDir(root), port=0, session_idle_timeout=60.0, ask_timeout=30.0,
                     validate_results=True)
    return replace(cfg, **overrides)


@asynccontextmanager
async def inprocess_host(root: Path, **overrides: Any) -> AsyncIterator[RunningHost]:
    """A real host (boot, actors, gateway) inside this trio run; stopped on exit."""
    async with trio.open_nursery() as nursery:
        running: RunningHost = await nursery.start(run_host, test_config(root, **overrides))
        try:
            yield running
        finally:
            nursery.cancel_scope.cancel()


async def passivate(running: RunningHost, sid: str) -> None:
    """Stop the session's idle actor, as its idle timeout would: the next request meets none running."""
    actor = running.sessions.ref(sid).current()
    assert actor is not None and running.registry.release_if_idle(sid)
    await actor.wait_exited()


@asynccontextmanager
async def client_for(
    running: RunningHost, client_id: str = "test-client", kind: str = "test", plugin_id: str | None = None
) -> AsyncIterator[HostClient]:
    """A connection. ``kind="plugin:<id>"`` connects as that plugin (clientKind plugin with its pluginId);
    so does ``kind="plugin"`` with ``plugin_id`` (default ``test-plugin``)."""
    if kind.startswith("plugin:"):
        plugin_id = kind.removeprefix("plugin:")
    elif kind == "plugin" and plugin_id is None:
        plugin_id = "test-plugin"
    async with open_client(running.url, running.token, client_id=client_id,
                           client_kind="plugin" if plugin_id else kind, plugin_id=plugin_id) as c:
        yield c


@dataclass
class HostProcess:
    proc: subprocess.Popen[bytes] | ForkedHost
    data_dir: Path
    url: str
    token: str

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.reap(30)

    def terminate(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.reap(timeout)

    def reap(self, timeout: float = 30) -> int:
        """Wait for the exit and drain and close the child's pipes (an exec'd host's ``Popen`` pipes would
        otherwise stay open: "unclosed file" warnings). A later ``proc.communicate()`` still answers what
        the host wrote."""
        self.proc.communicate(timeout=timeout)
        code = self.proc.returncode
        assert code is not None
        return code


def start_host_process(data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                       timeout: float = 60, preexec_fn: Any = None, umask: int | None = None) -> HostProcess:
    """Start ``pi-host serve --port 0`` as a process of its own and wait for its ``host.json``: forked from
    the warm forkserver (tests/host_fork.py), or a fresh interpreter with ``preexec_fn`` or
    ``PIHOST_TEST_EXEC_HOSTS=1``. ``umask``: the host process's umask (forked or exec'd)."""
    return launch_host_process(data_dir, *extra, env=env, preexec_fn=preexec_fn, umask=umask).started(timeout)


@dataclass
class LaunchedHost:
    """A ``pi-host serve`` process launched by :func:`launch_host_process`, maybe still booting."""

    proc: subprocess.Popen[bytes] | ForkedHost
    data_dir: Path
    old_pid: Any

    def started(self, timeout: float = 60) -> HostProcess:
        """Wait for its ``host.json`` (as :func:`start_host_process` does)."""
        return _started(self.proc, self.data_dir, self.old_pid, timeout)

    def kill9(self) -> None:
        """Never used after all: SIGKILLed and reaped."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)


def launch_host_process(data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                        preexec_fn: Any = None, umask: int | None = None) -> LaunchedHost:
    """:func:`start_host_process` without the wait: the host boots while the caller does something else, and
    :meth:`LaunchedHost.started` waits for it."""
    host_json = data_dir / "host.json"
    old_pid = None
    if host_json.exists():
        try:
            old_pid = json.loads(host_json.read_text()).get("pid")
        except ValueError:
            pass
    return LaunchedHost(_launch(data_dir, extra, env, preexec_fn, umask), data_dir, old_pid)


def _started(proc: subprocess.Popen[bytes] | ForkedHost, data_dir: Path, old_pid: Any,
             timeout: float) -> HostProcess:
    host_json = data_dir / "host.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise RuntimeError(f"host exited with {proc.returncode}: {err.decode()[-3000:]}")
        try:
            info = json.loads(host_json.read_text())
            if info.get("pid") == proc.pid and info.get("pid") != old_pid:
                token = (data_dir / "host.token").read_text().strip()
                return HostProcess(proc, data_dir, info["url"], token)
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError("host did not write host.json in time")


@contextmanager
def served(data_dir: Path) -> Iterator[HostProcess]:
    """``pi-host serve --port 0`` on ``data_dir`` for a block; SIGTERMed and reaped (its pipes drained) after."""
    proc = start_host_process(data_dir)
    try:
        yield proc
    finally:
        proc.terminate()


def serve_until_exit(data_dir: Path, *extra: str, env: dict[str, str] | None = None,
                     timeout: float = 120) -> int:
    """Run ``pi-host serve --port 0 --quiet`` on ``data_dir`` until it exits by itself (a crash point, a
    refusal), forked like :func:`start_host_process`; its exit status."""
    proc = _launch(data_dir, extra, env, None)
    try:
        proc.communicate(timeout=timeout)  # drains a Popen's pipes while it runs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    code = proc.returncode
    assert code is not None
    return code


def _launch(data_dir: Path, extra: tuple[str, ...], env: dict[str, str] | None,
            preexec_fn: Any, umask: int | None = None) -> subprocess.Popen[bytes] | ForkedHost:
    """``pi-host serve --port 0 --quiet`` on ``data_dir``: forked from the warm forkserver, or a fresh
    interpreter with ``preexec_fn`` or ``PIHOST_TEST_EXEC_HOSTS=1``; with ``umask`` as its umask."""
    full_env = {**os.environ, **(env or {})}
    argv = ["--data-dir", str(data_dir), "serve", "--port", "0", "--quiet", *extra]
    if preexec_fn is None and not exec_hosts():
        return ForkedHost(argv, full_env, REPO, umask)  # the same main, without importing the host again
    if umask is not None:
        assert preexec_fn is None, "give umask or preexec_fn"
        preexec_fn = functools.partial(os.umask, umask)
    return subprocess.Popen([sys.executable, "-m", "runtime.cli", *argv], cwd=REPO, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec_fn)


def run_cli(*argv: str, env: dict[str, str] | None = None, timeout: float = 120,
            errors: str = "strict", inherit: bool = True) -> subprocess.CompletedProcess[str]:
    """``pi-host <argv>`` run to its end as ``subprocess.run([python, "-m", "runtime.cli", *argv],
    capture_output=True, text=True)`` would, forked from the warm forkserver like a host (no interpreter start
    and host import per call; ``PIHOST_TEST_EXEC_HOSTS=1``: a fresh interpreter). For the tests that read a
    damaged data directory with the offline commands; the tests of the command itself (tests/cli) run the real
    executable. An exception out of ``main`` still ends the process with status 1 and its traceback on stderr.
    ``errors``: how bytes that do not decode read (``"replace"``: as ``bytes.decode(errors="replace")``).
    ``inherit=False``: ``env`` is the whole environment, not additions to this process's."""
    full_env = {**(os.environ if inherit else {}), **(env or {})}
    if exec_hosts():
        return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=REPO, capture_output=True,
                              text=True, errors=errors, timeout=timeout, env=full_env, check=False)
    proc = ForkedHost(list(argv), full_env, REPO)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    code = proc.returncode
    assert code is not None
    return subprocess.CompletedProcess([sys.executable, "-m", "runtime.cli", *argv], code, _text(out, errors),
                                       _text(err, errors))


# What a forked command cannot take from its environment the way a fresh interpreter does: the interpreter's
# own settings (PYTHON*), the locale its streams were opened with (LANG, LC_*), a preloaded library (LD_*).
_EXEC_ONLY_ENV = ("PYTHON", "LANG", "LC_", "LD_")


def forks_alike(extra: dict[str, str] | None) -> bool:
    """Whether a command run with these environment additions behaves forked as it does exec'd (see
    :func:`run_cli`): none of them is read only at interpreter start."""
    return not any(k.startswith(_EXEC_ONLY_ENV) for k in (extra or {}))


def _text(raw: bytes, errors: str) -> str:
    """Bytes a child wrote, decoded as ``subprocess.run(text=True)`` decodes them (locale encoding, universal
    newlines)."""
    return io.TextIOWrapper(io.BytesIO(raw), errors=errors).read()


def msg(mid: str, text: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    """A message record; ``blocks=`` in ``extra`` replaces the single text block."""
    return {"id": mid, "role": role, "blocks": [{"type": "text", "text": text}], **extra}


async def create_two_exchanges(c: HostClient, session_id: str = "s1", title: str = "First") -> None:
    """Create the session ``session_id`` and append two exchanges to it: ``u0``, ``a0``, ``u1``, ``a1`` (the
    ``a`` ones assistant replies)."""
    await c.call("session.create", {"sessionId": session_id, "title": title})
    for m in (msg("u0", "q0"), msg("a0", "r0", role="assistant"), msg("u1", "q1"),
              msg("a1", "r1", role="assistant")):
        await c.call("session.appendMessage", {"sessionId": session_id, "message": m})


async def index_caught_up(host: RunningHost) -> None:
    """Wait until the index covers every acknowledged append (appends are acknowledged before
    their index rows commit): a fault armed on the next DB commit then hits the next request's."""
    await host.services.index_log.barrier()


async def call_killed_at(data_dir: Path, point: str, method: str, params: dict[str, Any], *, nth: int = 1,
                         client_id: str = "test", client_kind: str = "ui", plugin_id: str | None = None) -> None:
    """Call ``method`` on a ``pi-host serve`` process armed to SIGKILL itself at the ``nth`` hit of the fault
    point ``point`` (``RT_CRASHPOINT``), and make sure it died there without answering: the first half of
    every kill-restart-retry test (the retry then runs on a host started on ``data_dir`` again)."""
    crashing = start_host_process(data_dir, env={"RT_CRASHPOINT": f"{point}:{nth}"})
    answered: Any = None
    try:
        with trio.fail_after(60):
            try:
                async with open_client(crashing.url, crashing.token, client_id=client_id,
                                       client_kind=client_kind, plugin_id=plugin_id) as c:
                    answered = await c.call(method, params)
            except (ClientClosed, OSError):
                pass
            if answered is None:
                await trio.to_thread.run_sync(crashing.reap)
    finally:
        crashing.kill9()  # the point was never reached: never leave the host running (and close its pipes)
    assert answered is None, f"the host answered instead of dying at {point}:{nth}"
    assert crashing.proc.returncode == -9, f"the host did not die at {point}:{nth}"


def boot_killed_at(data_dir: Path, point: str) -> bool:
    """Boot ``data_dir`` armed to SIGKILL itself at the first hit of ``point`` (``RT_CRASHPOINT``): True when
    it died there, False when it came up without reaching the point (it is then stopped)."""
    try:
        proc = start_host_process(data_dir, env={"RT_CRASHPOINT": f"{point}:1"}, timeout=30)
    except RuntimeError as died:
        assert "exited with -9" in str(died), str(died)[-2000:]
        return True
    assert proc.terminate() == 0
    return False


@asynccontextmanager
async def once_rebuilt(proc: HostProcess, *, client_id: str = "again",
                       ready: Any = None) -> AsyncIterator[HostClient]:
    """A client of ``proc`` once it serves again on an index rebuilt from the transcripts: a host that met its
    index corrupt restarts itself in the same process and on the same url (RELIABILITY row 7); a client
    reconnects as after any restart. ``ready()``, when given, must also be true (e.g. the quarantine holds the
    file). Within 60 s; each try's handshake is bounded (a stopping run may accept one and never answer it)."""
    with trio.fail_after(60):
        while True:
            with trio.move_on_after(5):
                try:
                    async with open_client(proc.url, proc.token, client_id=client_id, client_kind="agent") as probe:
                        if (ready is None or ready()) and (await probe.call("host.status", {}))["boot"]["dbRebuilt"]:
                            break
                except (OSError, ClientClosed, RpcError):
                    pass
            await trio.sleep(0.02)  # a refused probe is cheap; the restart takes a few tens of ms
    async with open_client(proc.url, proc.token, client_id=client_id, client_kind="agent") as again:
        yield again


@asynccontextmanager
async def faulted_client(data_dir: Path, spec: str | None, *, client_id: str, client_kind: str = "agent",
                         plugin_id: str | None = None) -> AsyncIterator[HostClient]:
    """A client of a ``pi-host serve`` process on ``data_dir`` armed with the fault ``spec``
    (``RT_CRASHPOINT=<point>:<nth>:<action>``, e.g. ``append.after_fsync:1:enospc``; ``None``: not armed),
    all of it inside ``trio.fail_after(60)``. On exit the process is stopped and must exit with 0: a
    fault that raises an error is answered, it never takes the host down."""
    proc = start_host_process(data_dir, env=None if spec is None else {"RT_CRASHPOINT": spec})
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id=client_id, client_kind=client_kind,
                                   plugin_id=plugin_id) as c:
                yield c
    finally:
        assert proc.terminate() == 0


async def failed_then_retried(c: HostClient, method: str, params: dict[str, Any], code: str) -> Any:
    """Call ``method`` with ``params``: the first call fails with the error code ``code`` (``data_code``), the
    retry answers and a second retry answers the same; the retry's answer."""
    try:
        answered = await c.call(method, params)
    except RpcError as failed:
        assert failed.data_code == code, f"{method} failed with {failed.data_code}, not {code}"
    else:
        raise AssertionError(f"{method} answered {answered!r} instead of failing with {code}")
    retried = await c.call(method, params)
    assert await c.call(method, params) == retried
    return retried
