"""The two installations (seed 003 §2, D599): a development build defaults to ``~/.pi-desktop-dev``.

"A packaged installation keeps this tree in ~/.pi-desktop. A development build
keeps the same tree in ~/.pi-desktop-dev, because a shipped app and a pnpm dev
host are two installations that have to run at the same time (D599, ADR 0094).
PI_DESKTOP_DATA_DIR replaces either root outright and is resolved to an
absolute path".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.datadir import DataDir
from tests.hostkit import REPO


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["HOME"] = str(home)
    env.update(extra)
    return env


def test_dev_defaults_to_the_dev_root_never_the_packaged_one(tmp_path: Path) -> None:
    """§2: "A development build keeps the same tree in ~/.pi-desktop-dev" - and a packaged one in
    ~/.pi-desktop."""
    home = {"HOME": str(tmp_path)}
    assert DataDir.locate(None, home, dev=True) == (DataDir(tmp_path / ".pi-desktop-dev"), "dev")
    assert DataDir.locate(None, home) == (DataDir(tmp_path / ".pi-desktop"), "packaged")


@pytest.mark.parametrize("dev", [False, True])
def test_precedence_data_dir_then_env_then_default(tmp_path: Path, dev: bool) -> None:
    """§2: "PI_DESKTOP_DATA_DIR replaces either root outright and is resolved to an absolute path";
    --data-dir wins over both (--data-dir > PI_DESKTOP_DATA_DIR > default)."""
    env = {"HOME": str(tmp_path), "PI_DESKTOP_DATA_DIR": "rel/env-root"}
    assert DataDir.locate("/abs/flag", env, dev=dev) == (DataDir(Path("/abs/flag")), "flag")
    located, source = DataDir.locate(None, env, dev=dev)
    assert source == "env" and located.root == Path(os.path.abspath("rel/env-root"))
    assert located.root.is_absolute()


def _first_stderr_line(argv: list[str], env: dict[str, str], *, says_root: bool = True) -> tuple[str, Path]:
    """Start a host (``--quiet``), read its first stderr line and the root its listening line names, stop it.

    A root chosen by --data-dir or PI_DESKTOP_DATA_DIR is named by the listening line only
    (``says_root=False``: no stderr line to wait for).
    """
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        listening = proc.stdout.readline()
        assert listening.startswith("pi-host listening on "), listening
        root = Path(listening.rsplit("(data dir ", 1)[1].rstrip(")\n"))
        first = proc.stderr.readline() if says_root else ""
        return first, root
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert says_root or err.startswith("pi-host: shutting down"), err  # no root line before it


def test_serve_dev_uses_the_dev_root_and_says_so_first(tmp_path: Path) -> None:
    """§2 (D599): "a shipped app and a pnpm dev host are two installations that have to run at the
    same time" - `pi-host --dev serve` never creates or opens ~/.pi-desktop, and its first line names
    the development root."""
    first, root = _first_stderr_line(
        [sys.executable, "-m", "runtime.cli", "--dev", "serve", "--port", "0", "--quiet"], _env(tmp_path))
    dev_root = tmp_path / ".pi-desktop-dev"
    assert first.startswith(f"pi-host: serving the development data directory {dev_root} (--dev)"), first
    assert root == dev_root and (dev_root / "pi.sqlite").exists()
    assert not (tmp_path / ".pi-desktop").exists()


def test_dev_after_the_command_and_for_client_commands(tmp_path: Path) -> None:
    """§2: both installations are separate for every command: `serve --dev` and `--dev status`
    address the dev root (a status with no dev host running finds none, not the packaged one)."""
    first, root = _first_stderr_line(
        [sys.executable, "-m", "runtime.cli", "serve", "--dev", "--port", "0", "--quiet"], _env(tmp_path))
    assert root == tmp_path / ".pi-desktop-dev" and "development data directory" in first
    for argv in (["--dev", "status"], ["status", "--dev"]):
        done = subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=REPO, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2  # no host runs there any more
        assert done.stderr.strip() == f"pi-host: no host is running on {tmp_path / '.pi-desktop-dev'}"
    assert not (tmp_path / ".pi-desktop").exists()


def test_data_dir_and_env_still_win_over_dev(tmp_path: Path) -> None:
    """§2: "PI_DESKTOP_DATA_DIR replaces either root outright" - also the development one."""
    chosen = tmp_path / "chosen"
    _first, root = _first_stderr_line(
        [sys.executable, "-m", "runtime.cli", "--dev", "serve", "--port", "0", "--quiet"],
        _env(tmp_path, PI_DESKTOP_DATA_DIR=str(chosen)), says_root=False)
    assert root == chosen
    assert not (tmp_path / ".pi-desktop-dev").exists() and not (tmp_path / ".pi-desktop").exists()


def test_scripts_serve_from_a_checkout_is_a_development_build(tmp_path: Path) -> None:
    """§2 (D599) and issue 24 part 8: "./scripts/serve from a checkout is a development build and
    should not default to the real ~/.pi-desktop"."""
    if not (REPO / ".venv" / "bin" / "pi-host").exists():
        pytest.skip("scripts/serve needs the checkout's .venv (made by ./scripts/test)")
    first, root = _first_stderr_line([str(REPO / "scripts" / "serve"), "--port", "0", "--quiet"], _env(tmp_path))
    assert root == tmp_path / ".pi-desktop-dev"
    assert first.startswith(f"pi-host: serving the development data directory {tmp_path / '.pi-desktop-dev'}")
    assert not (tmp_path / ".pi-desktop").exists()


def test_dev_after_agent_and_chat_picks_the_dev_root_as_before_them(tmp_path: Path) -> None:
    """README: "--dev (any command)" - `pi-host agent --dev` and `pi-host chat --dev` address the dev root
    like `pi-host --dev agent` (they answered "unrecognized arguments: --dev", exit 2, while `status --dev`
    worked), and never the packaged ~/.pi-desktop."""
    for name in ("agent", "chat"):
        before = subprocess.run([sys.executable, "-m", "runtime.cli", "--dev", name], cwd=REPO,
                                env=_env(tmp_path), capture_output=True, text=True, timeout=60)
        after = subprocess.run([sys.executable, "-m", "runtime.cli", name, "--dev"], cwd=REPO,
                               env=_env(tmp_path), capture_output=True, text=True, timeout=60)
        assert str(tmp_path / ".pi-desktop-dev") in before.stderr, before.stderr
        assert (after.returncode, after.stderr) == (before.returncode, before.stderr)
    assert not (tmp_path / ".pi-desktop").exists() and not (tmp_path / ".pi-desktop-dev").exists()
