"""A snapshot of everything a host persists, to prove that a request changed nothing."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

# Derived search structures (the writer's idle upkeep reorganizes them) and the boot log.
_SKIP_TABLES = ("messages_fts", "sqlite_", "boot_reports")
_SKIP_DIRS = {"logs", "quarantine"}
_SKIP_FILES = {"host.json", "host.lock", "pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm", "clean-shutdown"}


def state(root: Path) -> dict[str, Any]:
    """Every row of every table (search index internals aside) and every file's bytes (as digests)."""
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                  if not r[0].startswith(_SKIP_TABLES)]
        db = {t: sorted(map(repr, conn.execute(f'SELECT * FROM "{t}"'))) for t in tables}  # noqa: S608
    finally:
        conn.close()
    files: dict[str, str] = {}
    for base, dirs, names in os.walk(root):
        rel_base = os.path.relpath(base, root)
        dirs[:] = [d for d in dirs if not (rel_base == "." and d in _SKIP_DIRS)]
        for name in names:
            if rel_base == "." and name in _SKIP_FILES:
                continue
            path = os.path.join(base, name)
            with open(path, "rb") as fh:
                files[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return {"db": db, "files": files}
