"""``pi-host types --out DIR``: the wire's TypeScript types and JSON Schema, for a UI project outside the repository.

Writes ``DIR/protocol.ts`` (the interfaces, the ``Methods`` and ``Events`` maps, the
block union and the error codes that ``scripts/gen_clients.py`` generates for
``clients/typescript``) and ``DIR/schema.json`` (``scripts/export_schema.py``'s JSON
Schema of every params, result and event model), byte for byte as this installed
pi-host ships them (package data of ``protocol``), so a UI builds against the
protocol of the host it talks to. Existing files of those two names are replaced
(they are generated; run it again after an upgrade); nothing else in DIR is touched.
"""

from __future__ import annotations

import os
import sys
from importlib.resources import files
from pathlib import Path

from protocol.version import PROTOCOL_VERSION
from runtime.version import VERSION

__all__ = ["TYPE_FILES", "types_command", "write_types"]

TYPE_FILES = ("protocol.ts", "schema.json")
"""The files written, as named in the ``protocol`` package."""


def write_types(out: Path) -> list[Path]:
    """Copy :data:`TYPE_FILES` into ``out`` (created if missing); return the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TYPE_FILES:
        data = files("protocol").joinpath(name).read_bytes()
        target = out / name
        tmp = out / f".{name}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, target)  # a reader (a running tsc --watch) never sees half a file
        written.append(target)
    return written


def types_command(out: str) -> int:
    try:
        written = write_types(Path(os.path.abspath(out)))
    except OSError as exc:
        print(f"pi-host types: cannot write to {out}: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    print(f"pi-host types: protocol {PROTOCOL_VERSION} of pi-host {VERSION}", file=sys.stderr)
    return 0
