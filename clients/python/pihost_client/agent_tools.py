"""The reference sidecar's built-in tools: read a file and list a directory, under a project root.

Paths are resolved against the session's project root and must stay inside it
(symlinks resolved first); anything else is refused with a clear error. Output
is bounded so a tool result never grows a transcript line without limit.

Secrets stay out of reach, wherever the project root is: a pi-host data
directory (one holding ``host.token``, ``host.lock`` or ``pi.sqlite``; the
token, ``secrets/``, the database and logs) and everything under it are
refused, as are the directories the sidecar was told to protect (its own data
directory) and credential-shaped files (``*.token``, ``.env``, private keys,
``secrets/``, ``.ssh/``...). :func:`check_tool` says so before anything runs,
so such a call is refused without asking the user first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["TOOL_SCHEMAS", "ToolError", "check_tool", "run_tool"]

MAX_READ_BYTES = 64 * 1024
MAX_ENTRIES = 500

TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    {"name": "read_file", "description": "Read a UTF-8 text file under the project root.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "list_dir", "description": "List a directory under the project root.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
)


DATA_DIR_MARKERS = ("host.token", "host.lock", "pi.sqlite")
"""A directory holding any of these is a pi-host data directory."""
SECRET_NAMES = frozenset({
    ".env", ".envrc", ".netrc", ".pgpass", ".git-credentials", ".npmrc", ".pypirc", ".htpasswd", "credentials",
    "credentials.json", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "secrets", ".ssh", ".gnupg", ".aws",
    ".docker", ".kube", "keyring", "keychain"})
SECRET_SUFFIXES = (".token", ".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".kdbx", ".secret", ".secrets")
SECRET_PREFIXES = (".env.", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "secrets.")


class ToolError(Exception):
    """The tool refused or failed; the message goes back to the model as the result."""


def is_secret_name(name: str) -> bool:
    """A file or directory name that usually holds credentials."""
    lowered = name.lower()
    if lowered.endswith(".pub"):  # a public key
        return False
    return lowered in SECRET_NAMES or lowered.endswith(SECRET_SUFFIXES) or lowered.startswith(SECRET_PREFIXES)


def _is_data_dir(directory: Path) -> bool:
    return any((directory / marker).exists() for marker in DATA_DIR_MARKERS)


def _inside(root: str | None, path: str, protected: Sequence[str | os.PathLike[str]]) -> Path:
    if not root:
        raise ToolError("this session has no project root, so file tools are unavailable")
    base = Path(root).resolve()
    target = (base / path).resolve()
    if target != base and base not in target.parents:
        raise ToolError(f"{path!r} is outside the project root {base}")
    for guarded in protected:
        guarded_dir = Path(guarded).resolve()
        if target == guarded_dir or guarded_dir in target.parents:
            raise ToolError(f"{path!r} is in the host's data directory {guarded_dir}, which the agent may not read")
    for directory in (target, *target.parents):
        if _is_data_dir(directory):
            raise ToolError(f"{path!r} is in a pi-host data directory ({directory}), which the agent may not read")
    for part in (*Path(path).parts, *target.relative_to(base).parts):
        if is_secret_name(part):
            raise ToolError(f"{path!r} looks like a credential file ({part}); the agent may not read it")
    return target


def check_tool(name: str, args: dict[str, Any], project_root: str | None,
               protected: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """The path a tool call would touch, or :class:`ToolError` when it is refused (blocking: a few stats)."""
    if name not in ("list_dir", "read_file"):
        raise ToolError(f"unknown tool {name!r}")
    path = args.get("path")
    if not isinstance(path, str) or not path:
        raise ToolError(f"{name}: 'path' must be a non-empty string")
    return _inside(project_root, path, protected)


def run_tool(name: str, args: dict[str, Any], project_root: str | None,
             protected: Sequence[str | os.PathLike[str]] = ()) -> str:
    """Run one tool (blocking file I/O: call it in a worker thread). ``protected``: directories refused
    wherever they are (the host's data directory)."""
    target = check_tool(name, args, project_root, protected)
    path = args["path"]
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
    raise ToolError(f"unknown tool {name!r}")  # check_tool refused it already
