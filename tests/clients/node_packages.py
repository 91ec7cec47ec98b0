"""The TypeScript package's node_modules, installed once however many test workers ask at the same time.

Two test modules (the type checks and the reconnect harness) need ``clients/typescript/node_modules``; on a
fresh clone they may start side by side on two workers, and one ``npm ci`` (which empties node_modules first)
under another's ``tsc`` made that one fail ("Cannot find global type 'Boolean'"). An exclusive lock on a file
(in the temp folder, named by the package's path) serialises the check and the install, and a marker
written after a successful install (not ``.bin/tsc``, which npm links before the libraries are in place)
says the folder is whole.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

MARKER = ".pihost-npm-ci-done"


def ensure_node_modules(pkg: Path) -> Path:
    """``pkg/node_modules``, whole (``npm ci`` once, under a lock); skips without Node.js and npm."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed on this machine: the TypeScript tests need node and npm")
    modules = pkg / "node_modules"
    digest = hashlib.sha256(str(pkg.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"pihost-npm-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (modules / MARKER).exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=pkg, check=True, capture_output=True,
                           timeout=300)
            (modules / MARKER).write_text("npm ci finished\n")
    return modules
