"""What `pi-host serve` imports before it listens (issue 26 item 4: a host start is import-bound).

A host process's start is mostly its imports, and the suite, the desktop app and every CLI `serve` pay it.
Rare capabilities are imported by their first use instead: httpx (only `models.refresh` talks HTTP, and it
brings click and pygments along), cryptography (the first secret or config-sync bundle read or written).
No timing here: a fresh interpreter imports the serve command and reports ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.hostkit import REPO

PROBE = "import json, sys\nimport runtime.cli_serve\nprint(json.dumps(sorted(sys.modules)))\n"

RARE = ("httpx", "click", "pygments", "cryptography")
"""Imported by the first request that needs them, never by boot."""


def boot_modules() -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout))


def imported(modules: set[str], tops: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == t or m.startswith(t + ".") for t in tops))


def test_serve_imports_no_rare_capability() -> None:
    modules = boot_modules()
    assert "runtime.host" in modules and "runtime.handlers.catalog" in modules  # the probe did import the host
    assert imported(modules, RARE) == []


GC_PROBE = """
import gc, json
from runtime.cli import import_serve
seen = []
gc.callbacks.append(lambda phase, info: seen.append(info["generation"]) if phase == "start" else None)
import_serve()
print(json.dumps({"collections": len(seen), "enabled": gc.isenabled()}))
"""


def test_serve_imports_the_host_without_running_the_collector() -> None:
    """What importing the host makes lives as long as the process: no collection runs while it is made
    (some 130 did), and the collector is on again afterwards (serve freezes what boot left when boot is
    done). The young generation's count has grown meanwhile: one collection follows the import at most."""
    done = subprocess.run([sys.executable, "-c", GC_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["enabled"] is True
    assert found["collections"] <= 1
