"""`pi-host serve` processes forked from a warm parent: the suite's fast way to start a real host process.

Importing the host (pydantic building every wire model, trio, the handlers) costs about a second of CPU,
and the suite starts a few hundred host processes (every SIGKILL test starts one per fault point). A
multiprocessing *forkserver* imports the host once per pytest worker; each host is then forked from it and
runs the same entry point as the installed command, ``runtime.cli.main(["--data-dir", D, "serve", ...])``,
in a process of its own: its own pid, signals, exit status (``-9`` after a SIGKILL, as with Popen), data
directory lock, and environment (set before ``main`` runs; the host reads ``RT_CRASHPOINT`` and the rest at
run time, never at import). Its stdout and stderr go to files read back by :meth:`ForkedHost.communicate`.

The forkserver is a fresh interpreter, not a fork of the test process (which runs threads and trio), so a
forked host starts from a clean single-threaded state. One-shot commands run forked too
(:func:`tests.hostkit.run_cli`); tests of what only a fresh interpreter shows (signals to the command, its pipes
and terminal, locale and interpreter settings, the process lifecycle, the packaged wheel) run the real
executable, and ``PIHOST_TEST_EXEC_HOSTS=1`` makes every host a fresh ``python -m runtime.cli`` process again.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import importlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

LAZY_IN_A_HOST = ["cryptography.hazmat.primitives.ciphers.aead", "cryptography.exceptions",
                  "store.interchange.export_render", "encodings.idna"]
"""What a host imports on first use rather than at boot (tests/host/test_boot_imports.py checks that in a fresh
interpreter): the first secret or config-sync bundle read (cryptography), the first Markdown / HTML export, the
first IDNA host name. Many of the suite's hosts use one of them; imported in the forkserver, a forked host finds
them loaded instead of importing them again (some 15 ms of CPU a host)."""

# What the forkserver imports once; each forked host starts with these loaded.
# (pytest too: a forked child runs the parent's ``__main__`` module again, ``pytest.__main__`` when the
# suite runs without workers.)
# The wire models are built on first use (protocol.models_common.WireModel): tests.host_fork_models builds them
# here, once, so a forked host's serve finds them built (building them in each host: ~0.2 s of CPU).
PRELOAD = ["runtime.cli", "runtime.cli_serve", "runtime.host", "tests.host_fork", "tests.host_fork_models", "pytest",
           *LAZY_IN_A_HOST]


def exec_hosts() -> bool:
    """Whether this run starts every host as a fresh interpreter (``PIHOST_TEST_EXEC_HOSTS=1``)."""
    return os.environ.get("PIHOST_TEST_EXEC_HOSTS") == "1" or sys.platform != "linux"


_NAME = "pihost-forked"
"""The name of every forked host's :class:`multiprocessing.Process` (:func:`_kill_leftovers` finds them by it)."""


@functools.cache
def _context() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    assert isinstance(ctx, ForkServerContext)
    ctx.set_forkserver_preload(PRELOAD)
    # registered after multiprocessing's own exit handler (multiprocessing.util registers it when imported), so it
    # runs first: atexit runs them last in, first out
    importlib.import_module("multiprocessing.util")
    atexit.register(_kill_leftovers)
    return ctx


def _kill_leftovers() -> None:
    """At the test process's exit, SIGKILL and reap every forked host still running, saying so on stderr.
    Multiprocessing joins its live children at exit: a host a failing test left running (its stop never
    reached) would otherwise hang the run for ever instead of letting pytest report the failure."""
    left = [p for p in multiprocessing.active_children() if p.name == _NAME and p.exitcode is None]
    for process in left:
        assert process.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
        process.join(30)
    if left:
        print(f"tests.host_fork: killed {len(left)} forked host(s) still running at exit (pids "
              f"{', '.join(str(p.pid) for p in left)}): a test did not stop its host", file=sys.stderr)


def _serve(argv: list[str], env: dict[str, str], cwd: str, out_path: str, err_path: str,
           umask: int | None = None) -> None:
    """The forked host: the caller's environment, folder and output files, then the command's own main."""
    # What the forkserver imported (the host, pytest) is shared with it until written to, and the cyclic
    # collector writes to every object it walks: the host's own collection when boot is done
    # (runtime.process.freeze_boot_objects) walked all of it and copied most of the forkserver's memory,
    # over half of a short-lived host's CPU. Freezing it first (moving the generations' lists whole, no
    # object walked) leaves that collection boot's own objects, as in an installed host's process.
    gc.freeze()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # a TZ in env is the host's local timezone, as for an exec'd host
    if umask is not None:  # the process's umask, as a parent's umask is an exec'd host's
        os.umask(umask)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    from runtime.cli import main

    sys.exit(main(argv))


class ForkedHost:
    """The part of :class:`subprocess.Popen` the tests use, for a host forked from the forkserver."""

    stdout: Any = None
    stderr: Any = None

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, umask: int | None = None) -> None:
        folder = tempfile.mkdtemp(prefix="pihost-forked-")
        self._out = os.path.join(folder, "stdout")
        self._err = os.path.join(folder, "stderr")
        weakref.finalize(self, shutil.rmtree, folder, True)
        self.args = argv
        self._process = _context().Process(target=_serve, args=(argv, env, str(cwd), self._out, self._err, umask),
                                           daemon=False, name=_NAME)
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def communicate(self, timeout: float | None = None) -> tuple[bytes, bytes]:
        self.wait(timeout)
        out, err = (Path(p).read_bytes() if os.path.exists(p) else b"" for p in (self._out, self._err))
        return out, err

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            # The forkserver, not this process, reaps the host: it can be gone between the exit code's check
            # and the signal (a SIGKILL the test sent a moment before, say). Gone is what a signal asks for.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
