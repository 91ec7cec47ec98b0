"""Importers: other agents' session files to this host's transcript records.

Each module is a pure parser for one tool (never writes the source):
``discover(root)`` yields :class:`~store.interchange.importers.common.SourceUnit` (one per
session) and ``parse(unit, ctx)`` returns a :class:`~store.interchange.importers.common.Parsed`
whose ``records`` stream in transcript order. :mod:`store.interchange.import_write` writes
them. ``default_root`` is where each tool keeps its sessions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType

from store.interchange.importers import claude_code, codex, host_jsonl, opencode, pi
from store.interchange.importers.common import SOURCES, ParseContext, Parsed, SourceUnit

__all__ = ["IMPORTERS", "SOURCES", "content_fingerprint", "default_root", "discover", "diverged_from", "file_names",
           "former_ids", "kept_as_imported", "named_as_before", "parse"]

IMPORTERS: Mapping[str, ModuleType] = MappingProxyType({
    "claude-code": claude_code,
    "codex": codex,
    "pi": pi,
    "opencode": opencode,
    "pi-host": host_jsonl,
})
assert tuple(IMPORTERS) == SOURCES

_ROOTS: Mapping[str, Callable[[Path, Mapping[str, str]], Path]] = MappingProxyType({
    "claude-code": lambda home, env: Path(env.get("CLAUDE_CONFIG_DIR") or home / ".claude") / "projects",
    "codex": lambda home, env: Path(env.get("CODEX_HOME") or home / ".codex") / "sessions",
    "pi": lambda home, env: Path(env.get("PI_CODING_AGENT_DIR") or home / ".pi" / "agent") / "sessions",
    "opencode": lambda home, env: Path(env.get("XDG_DATA_HOME") or home / ".local" / "share") / "opencode",
    "pi-host": lambda home, env: Path.cwd(),
})


def default_root(source: str, env: Mapping[str, str] | None = None) -> Path:
    """The directory a tool keeps its sessions in (its own environment overrides honoured)."""
    environ = os.environ if env is None else env
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    return _ROOTS[source](home, environ)


def discover(source: str, root: Path) -> Iterator[SourceUnit]:
    return IMPORTERS[source].discover(root)  # type: ignore[no-any-return]


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    return IMPORTERS[unit.source].parse(unit, ctx)  # type: ignore[no-any-return]


def content_fingerprint(unit: SourceUnit) -> str | None:
    """The digest a re-import compares for a source without per-session files (None: compare files)."""
    if unit.source == "opencode":
        return opencode.fingerprint(unit)
    return None


def former_ids(unit: SourceUnit) -> tuple[str, ...]:
    """External ids an earlier version of the importer gave the unit's session (tried, in order, when no
    session has the unit's own id: :func:`store.interchange.imports.resolve_unit`)."""
    if unit.source == "claude-code":
        return claude_code.former_ids(unit)
    return ()


def file_names(unit: SourceUnit) -> tuple[str, str] | None:
    """The external ids (its session's own, a copy's) the unit's file may have been imported as, for a source that
    names a file by which other files share its name (None: the unit has one name)."""
    if unit.source == "claude-code":
        return claude_code.file_names(unit)
    return None


def diverged_from(unit: SourceUnit, other: Path) -> bool:
    """Whether ``other``, the file an import made the session of the unit's own name from, is another existing file
    whose contents and the unit's part ways (:func:`file_names`)."""
    if unit.source == "claude-code":
        return claude_code.diverged_from(unit, other)
    return False


def named_as_before(unit: SourceUnit, holds: Callable[[str], bool]) -> SourceUnit:
    """``unit``, told to name its records as the import that made its session did when this version names them
    otherwise (``holds(glob)``: whether the session has a message whose id matches the GLOB pattern)."""
    if unit.source == "codex":
        return codex.named_as_before(unit, holds)
    return unit


def kept_as_imported(unit: SourceUnit, imported: Collection[str]) -> str | None:
    """Why an import of ``unit`` must leave its session as imported from the files ``imported`` (None: import)."""
    if unit.source == "claude-code":
        return claude_code.kept_as_imported(unit, imported)
    return None
