"""Client commands import only what they need (issue 25 item 5).

Reproduces: every CLI call imported the whole host, so ``pi-host --version`` took ~2 s (``runtime.host``
~1 s, ``protocol.methods`` ~0.5 s of import time) and shell completion ran ``sessions --ids`` for 3.5 s
on every Tab. Each test runs the CLI's ``main`` in a fresh interpreter and reads ``sys.modules`` when it
returns: no timing, only which modules a command pulled in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from runtime.client import open_client
from runtime.version import VERSION
from tests.hostkit import REPO, HostProcess, msg, start_host_process

HOST_MODULES = ("runtime.host", "actors", "protocol.methods")
"""The host, its actors and the method registry (with every protocol model): what `serve` alone needs."""
TALKING_MODULES = ("trio", "runtime.client", "pydantic")
"""What a command needs only to talk to a running host."""

DRIVER = """
import json, sys
from runtime.cli import main
try:
    code = main(sys.argv[2:])
except SystemExit as exc:  # argparse's --version and --help
    code = exc.code if isinstance(exc.code, int) else 0
sys.stdout.flush()
with open(sys.argv[1], "w") as fh:
    json.dump({"code": code, "modules": sorted(sys.modules)}, fh)
"""


def run_cli(tmp_path: Path, *args: str) -> tuple[int, str, set[str]]:
    """(exit code, stdout, every module imported) of ``pi-host ARGS`` run in a fresh interpreter."""
    report = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(report), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(report.read_text())
    return int(data["code"]), done.stdout, set(data["modules"])


def imported(modules: set[str], tops: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == t or m.startswith(t + ".") for t in tops))


def _seeded(data: Path) -> str:
    """A data directory a host served and stopped, holding one session with one message: its id."""
    host = start_host_process(data)
    try:
        return trio.run(_seed, host)
    finally:
        host.terminate()
        host.proc.communicate()


async def _seed(host: HostProcess) -> str:
    async with open_client(host.url, host.token, client_id="fast-cli-seed", client_kind="test") as c:
        sid = str((await c.call("session.create", {"title": "fast CLI"}))["id"])
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "remember the milk")})
    return sid


def test_version_imports_neither_the_host_nor_a_client(tmp_path: Path) -> None:
    """`pi-host --version` needs two constants: no host, no trio, no client, no pydantic."""
    code, out, modules = run_cli(tmp_path, "--version")
    assert code == 0 and out.strip() == f"pi-host {VERSION} (protocol 1)"
    assert imported(modules, HOST_MODULES + TALKING_MODULES) == []
    assert "runtime.cli" in modules  # the driver did run the CLI


def test_types_imports_neither_the_host_nor_a_client(tmp_path: Path) -> None:
    """`pi-host types` copies package data: it imports no model to write the types."""
    code, out, modules = run_cli(tmp_path, "types", "--out", str(tmp_path / "types"))
    assert code == 0 and (tmp_path / "types" / "protocol.ts").is_file()
    assert imported(modules, HOST_MODULES + TALKING_MODULES + ("protocol.models",)) == []


def test_offline_reads_and_completion_import_no_host(tmp_path: Path) -> None:
    """`sessions --ids` (what completion runs on every Tab), `sessions`, `show`, `search` offline and
    `completion bash` read the data directory through the store alone."""
    data = tmp_path / "data"
    sid = _seeded(data)
    reads = {
        "sessions --ids": (["sessions", "--ids"], sid),
        "sessions": (["sessions"], "fast CLI"),
        "show": (["show", sid], "remember the milk"),
        "search": (["search", "milk"], sid),
    }
    for name, (args, expected) in reads.items():
        code, out, modules = run_cli(tmp_path, "--data-dir", str(data), *args)
        assert code == 0 and expected in out, (name, out)
        assert "runtime.cli_offline" in modules, name  # it did read offline
        assert imported(modules, HOST_MODULES + TALKING_MODULES) == [], name
    code, out, modules = run_cli(tmp_path, "completion", "bash")
    assert code == 0 and "complete -F _pi_host pi-host" in out
    assert imported(modules, HOST_MODULES + TALKING_MODULES) == []


def test_an_index_without_a_lock_file_is_read_offline_and_left_without_one(tmp_path: Path) -> None:
    """A directory holding an index but no ``host.lock`` (an earlier app's, or one whose start a fail-closed
    migration refused: that start leaves no lock file behind) is read offline like any other, and the read
    leaves no lock file either; a directory with neither stays "not a pi-host data directory"."""
    data = tmp_path / "data"
    sid = _seeded(data)
    (data / "host.lock").unlink()
    code, out, _ = run_cli(tmp_path, "--data-dir", str(data), "sessions", "--ids")
    assert code == 0 and sid in out, out
    assert not (data / "host.lock").exists()


def test_reads_on_a_running_host_import_the_client_but_no_host(tmp_path: Path) -> None:
    """`status` and `sessions --ids` with a host running: the client talks to it; the host is not imported."""
    data = tmp_path / "data"
    host = start_host_process(data)
    try:
        sid = trio.run(_seed, host)
        code, out, modules = run_cli(tmp_path, "--data-dir", str(data), "status", "--json")
        assert code == 0 and json.loads(out)["version"] == VERSION
        assert "runtime.client" in modules and imported(modules, HOST_MODULES) == []
        code, out, modules = run_cli(tmp_path, "--data-dir", str(data), "sessions", "--ids")
        assert code == 0 and out.split() == [sid]
        assert "runtime.cli_offline" not in modules and imported(modules, HOST_MODULES) == []
    finally:
        host.terminate()
        host.proc.communicate()


def test_serve_is_the_command_that_imports_the_host() -> None:
    """The other side: the CLI's serve module does import the host (so the tests above measure the split)."""
    done = subprocess.run([sys.executable, "-c", "import sys, runtime.cli_serve; "
                           "print('runtime.host' in sys.modules, 'protocol.methods' in sys.modules)"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr
