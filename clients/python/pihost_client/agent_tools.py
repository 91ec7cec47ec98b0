"""The reference sidecar's built-in tools: read a file and list a directory, under a project root.

Paths are resolved against the session's project root and must stay inside it
(symlinks resolved first); anything else is refused with a clear error. Output
is bounded so a tool result never grows a transcript line without limit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["TOOL_SCHEMAS", "ToolError", "run_tool"]

MAX_READ_BYTES = 64 * 1024
MAX_ENTRIES = 500

TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    {"name": "read_file", "description": "Read a UTF-8 text file under the project root.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "list_dir", "description": "List a directory under the project root.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
)


class ToolError(Exception):
    """The tool refused or failed; the message goes back to the model as the result."""


def _inside(root: str | None, path: str) -> Path:
    if not root:
        raise ToolError("this session has no project root, so file tools are unavailable")
    base = Path(root).resolve()
    target = (base / path).resolve()
    if target != base and base not in target.parents:
        raise ToolError(f"{path!r} is outside the project root {base}")
    return target


def run_tool(name: str, args: dict[str, Any], project_root: str | None) -> str:
    """Run one tool (blocking file I/O: call it in a worker thread)."""
    path = args.get("path")
    if not isinstance(path, str) or not path:
        raise ToolError(f"{name}: 'path' must be a non-empty string")
    target = _inside(project_root, path)
    if name == "list_dir":
        try:
            entries = sorted(os.scandir(target), key=lambda e: e.name)
        except OSError as exc:
            raise ToolError(f"cannot list {path}: {exc.strerror}") from None
        names = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries[:MAX_ENTRIES]]
        more = len(entries) - len(names)
        return " ".join(names) + (f" (+{more} more)" if more > 0 else "")
    if name == "read_file":
        try:
            with open(target, "rb") as f:
                data = f.read(MAX_READ_BYTES + 1)
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror}") from None
        text = data[:MAX_READ_BYTES].decode("utf-8", "replace")
        return text + ("\n[truncated]" if len(data) > MAX_READ_BYTES else "")
    raise ToolError(f"unknown tool {name!r}")
