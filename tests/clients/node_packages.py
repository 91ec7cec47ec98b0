"""The TypeScript package's node_modules, installed once however many test workers ask at the same time, and its
test harness compiled once for every module (and run) that runs it.

Two test modules (the type checks and the reconnect harness) need ``clients/typescript/node_modules``; on a
fresh clone they may start side by side on two workers, and one ``npm ci`` (which empties node_modules first)
under another's ``tsc`` made that one fail ("Cannot find global type 'Boolean'"). An exclusive lock on a file
(in the temp folder, named by the package's path) serialises the check and the install, and a marker
written after a successful install (not ``.bin/tsc``, which npm links before the libraries are in place)
says the folder is whole.

The harness (``test/harness.ts`` and the client, compiled by tsc: ~3 s of CPU) is run by two modules, which
``--dist loadfile`` may put on two workers: each compiled it into a folder of its own and removed it after. The
build now goes to a folder named by what it is made of (the sources, the tsconfigs, the package lock: tsc and the
declaration files), compiled under a lock by the first to ask and taken whole (a marker) by the others, in this
run and the next ones while nothing it is made of changes. A new build removes those of other sources unused
for an hour.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

MARKER = ".pihost-npm-ci-done"
BUILD_MARKER = ".pihost-tsc-done"
BUILD_PREFIX = ".build-tsc-"


def _lock_path(pkg: Path, what: str) -> Path:
    digest = hashlib.sha256(str(pkg.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"pihost-{what}-{digest}.lock"


def ensure_node_modules(pkg: Path) -> Path:
    """``pkg/node_modules``, whole (``npm ci`` once, under a lock); skips without Node.js and npm."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed on this machine: the TypeScript tests need node and npm")
    modules = pkg / "node_modules"
    with open(_lock_path(pkg, "npm"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (modules / MARKER).exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=pkg, check=True, capture_output=True,
                           timeout=300)
            (modules / MARKER).write_text("npm ci finished\n")
    return modules


def _inputs_digest(pkg: Path, project: str, args: tuple[str, ...]) -> str:
    """A digest of what ``tsc -p project`` compiles in ``pkg``: every ``.ts`` and ``tsconfig*.json`` outside
    node_modules and the build folders, the package lock (tsc's version, the declaration files'), and the
    arguments."""
    h = hashlib.sha256(repr((project, args)).encode())
    files: list[Path] = []
    for folder, dirs, names in os.walk(pkg):
        dirs[:] = [d for d in dirs if d != "node_modules" and not d.startswith(".build")]
        files += [Path(folder) / n for n in names if n.endswith(".ts") or n == "package-lock.json"
                  or (n.startswith("tsconfig") and n.endswith(".json"))]
    for path in sorted(files):
        h.update(str(path.relative_to(pkg)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def tsc_build(pkg: Path, project: str, *args: str) -> Path:
    """``tsc -p project --outDir <folder> *args`` in ``pkg``, once for the same inputs: the folder (inside the
    package, so Node resolves the package's modules), compiled under a lock by the first caller and reused whole
    by the next. A failed compile fails the caller with tsc's output, and leaves no folder."""
    ensure_node_modules(pkg)
    out = pkg / f"{BUILD_PREFIX}{_inputs_digest(pkg, project, args)}"
    with open(_lock_path(pkg, "tsc"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / BUILD_MARKER).exists():
            (out / BUILD_MARKER).touch()  # in use: see below
        else:
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run([str(pkg / "node_modules" / ".bin" / "tsc"), "-p", project, "--outDir", str(out),
                                   *args], cwd=pkg, capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                shutil.rmtree(out, ignore_errors=True)
                raise AssertionError(f"tsc -p {project} failed: {proc.stdout}{proc.stderr}")
            (out / BUILD_MARKER).write_text("tsc finished\n")
            for old in pkg.glob(f"{BUILD_PREFIX}*"):  # of other sources, unused for an hour (no run going on)
                used = old / BUILD_MARKER if (old / BUILD_MARKER).exists() else old
                if old != out and time.time() - used.stat().st_mtime > 3600:
                    shutil.rmtree(old, ignore_errors=True)
    return out
