"""Which tool wrote the sessions under a folder (for the CLI's hint when an import finds nothing).

Only the first line of a few ``.jsonl`` files is read (never a whole file), plus
opencode's fixed names (``opencode.db``, ``storage/session``). The verdict is a
hint, never a decision: importing still uses the source the user named.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from store.interchange.importers.reader import LineReader, parse_object

__all__ = ["guess_source", "source_of_first_record"]

MAX_FILES = 20
MAX_DEPTH = 5
CLAUDE_FIRST_KINDS = frozenset({"summary", "file-history-snapshot", "queue-operation", "user", "assistant", "system"})
CODEX_KINDS = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def source_of_first_record(rec: Mapping[str, Any]) -> str | None:
    """The tool whose session files start with a record like ``rec`` (None: not recognised)."""
    kind = rec.get("type")
    if kind in CODEX_KINDS or (kind is None and "id" in rec and "instructions" in rec):
        return "codex"
    if kind == "session" and "sessionId" in rec:
        return "pi-host"
    if kind == "session" and "version" in rec and "id" in rec:
        return "pi"
    if "sessionId" in rec or kind in CLAUDE_FIRST_KINDS:
        return "claude-code"
    return None


def _first_record(path: Path) -> Mapping[str, Any] | None:
    try:
        for line in LineReader(path, max_line_bytes=1 << 20, chunk=1 << 16):
            if line.data is None:
                return None
            if line.data.strip():
                return parse_object(line.data)
    except OSError:
        return None
    return None


def _jsonl_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root] if root.suffix == ".jsonl" else []
    found: list[Path] = []
    base = len(root.parts)
    for folder, dirs, files in os.walk(root):
        if len(Path(folder).parts) - base >= MAX_DEPTH:
            dirs.clear()
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".jsonl") and not name.endswith(".revisions.jsonl"):
                found.append(Path(folder) / name)
                if len(found) >= MAX_FILES:
                    return found
    return found


def guess_source(root: Path) -> str | None:
    """The tool that most of the sampled session files under ``root`` belong to, or None."""
    if root.name == "opencode.db" or (root / "opencode.db").is_file() or (root / "storage" / "session").is_dir():
        return "opencode"
    votes: Counter[str] = Counter()
    for path in _jsonl_files(root):
        rec = _first_record(path)
        guess = source_of_first_record(rec) if rec is not None else None
        if guess is not None:
            votes[guess] += 1
    return votes.most_common(1)[0][0] if votes else None
