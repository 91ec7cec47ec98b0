"""The wheel, installed for real: what ``pip wheel .`` / ``pipx install .`` gives a user.

Reproduces issue 25's "installing it for real fails": ``pyproject.toml`` listed
packages by hand and ``runtime/handlers`` had no ``__init__.py``, so the wheel
lacked ``runtime.kernel`` and ``runtime.handlers`` and ``pi-host --version``
died with ``ModuleNotFoundError``. The editable development install hid it.

The wheel is built offline (``--no-build-isolation``, the test extras carry
setuptools and wheel) from a copy of the sources, installed with ``--no-deps``
into a fresh venv whose dependencies come from the project venv's
site-packages (a path entry, so the project's own editable install is not
seen), and run from outside the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import trio

from runtime.client import open_client
from tests.hostkit import REPO, HostProcess, msg

SOURCES = ("pyproject.toml", "README.md", "runtime", "actors", "protocol", "store")
IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
from pathlib import Path
names = []
for top in ("runtime", "actors", "protocol", "store"):
    pkg = importlib.import_module(top)
    names.append(top)
    for info in pkgutil.walk_packages(pkg.__path__, top + "."):
        importlib.import_module(info.name)
        names.append(info.name)
import runtime, actors, protocol
data = [Path(protocol.__file__).parent / "schema.json", Path(actors.__file__).parent / "inspector" / "index.html",
        Path(actors.__file__).parent / "inspector" / "app.js"]
print(json.dumps({"modules": names, "runtime": runtime.__file__, "data": [p.is_file() for p in data]}))
"""


def _run(*cmd: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def _build_and_install(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", wheels, src, cwd=tmp_path)
    (wheel,) = wheels.glob("pi_host-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", py, "install", "--quiet", "--no-deps", "--no-index",
         "--disable-pip-version-check", wheel, cwd=tmp_path)
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "project-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return wheel, venv, env


def _serve(venv: Path, data: Path, cwd: Path, env: dict[str, str]) -> HostProcess:
    """The installed ``pi-host serve --port 0``, once its ``host.json`` names it."""
    proc = subprocess.Popen([str(venv / "bin" / "pi-host"), "--data-dir", str(data), "serve", "--port", "0",
                             "--quiet"], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the installed host exited: {proc.communicate()[1].decode()[-3000:]}")
        try:
            info = json.loads((data / "host.json").read_text())
        except (FileNotFoundError, ValueError):
            info = {}
        if info.get("pid") == proc.pid:
            return HostProcess(proc, data, info["url"], (data / "host.token").read_text().strip())
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the installed host did not write host.json in time")


@pytest.mark.slow  # about 30 s: a wheel build, a venv and a host start
async def test_wheel_installs_and_runs_from_a_fresh_venv(tmp_path: Path) -> None:
    """Issue 25: the built wheel holds every subpackage; its ``pi-host`` prints its version, imports every
    module, finds its package data, writes the TypeScript types and JSON Schema, serves, and takes an append."""
    wheel, venv, env = await trio.to_thread.run_sync(_build_and_install, tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("runtime/kernel/__init__.py", "runtime/handlers/__init__.py",
                   "store/interchange/importers/__init__.py", "protocol/schema.json", "protocol/protocol.ts",
                   "actors/inspector/index.html"):
        assert needed in names, f"the wheel lacks {needed}"
    assert not [n for n in names if n.startswith(("tests/", "clients/", "scripts/"))]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    version = await trio.to_thread.run_sync(lambda: _run(venv / "bin" / "pi-host", "--version", cwd=outside, env=env))
    assert "0.1.0" in version
    report = json.loads(await trio.to_thread.run_sync(
        lambda: _run(venv / "bin" / "python", "-c", IMPORT_ALL, cwd=outside, env=env)))
    assert Path(report["runtime"]).is_relative_to(venv), report["runtime"]
    assert {"runtime.kernel.supervisor", "runtime.handlers.sessions", "store.interchange.importers"} <= set(
        report["modules"])
    assert all(report["data"])
    ui = tmp_path / "ui-project" / "src" / "pihost"  # `pi-host types`: what a UI project outside the repo gets
    await trio.to_thread.run_sync(lambda: _run(venv / "bin" / "pi-host", "types", "--out", ui, cwd=outside, env=env))
    assert (ui / "protocol.ts").read_bytes() == (REPO / "clients" / "typescript" / "src" / "protocol.ts").read_bytes()
    assert (ui / "schema.json").read_bytes() == (REPO / "protocol" / "schema.json").read_bytes()

    host = await trio.to_thread.run_sync(_serve, venv, tmp_path / "data", outside, env)
    try:
        async with open_client(host.url, host.token, client_id="wheel-test") as c:
            sid = (await c.call("session.create", {"title": "from the wheel"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hello")})
            page = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in page["messages"]] == ["m1"]
    finally:
        assert await trio.to_thread.run_sync(host.terminate) == 0
        host.proc.communicate()
