"""Native pi sessions as the wire sees them: the catalog of a configured root, windows, export, fork.

:mod:`store.interchange.native_pi` reads and forks one file; this module serves a whole
configured pi session root (seed 003 §12) to the host's methods:

* :class:`NativeCatalog` lists the root (``session.list`` merges it) and keeps
  each file's *summary* keyed by its identity (device, inode, size, mtime,
  ctime), so a listing re-reads only files that changed; a detail read
  (``session.get``, ``session.export``, ``session.fork``) always takes a fresh
  immutable byte snapshot. Ids resolve by lookup in the listing (id → the
  canonical path found by walking the root): no path is ever built from an id.
* :func:`native_window` is ``session.get``'s window over the current branch.
* :func:`export_native` writes the export of a native session.
* :meth:`NativeCatalog.fork` is ``session.fork`` of a native session: one v3
  child (:func:`store.interchange.native_pi.fork_native`); with a child id derived from the
  request's receipt key, a retry finds the child it already wrote instead of
  writing a second one (idempotent by construction).

Nothing here writes SQLite or this host's ``sessions/``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from store.compaction import normalize_on_read
from store.errors import IdempotencyConflict, InvalidInput, MessageNotFound, SessionNotFound, StoreError
from store.faults import NO_FAULTS, Faults
from store.interchange.export import ExportOptions, ExportReport, export_records
from store.interchange.importers.common import DEFAULT_LIMITS, ImportLimits, Refused, local_id
from store.interchange.importers.pi import CORRUPT_LEAF, TORN, locate_entry
from store.interchange.native_pi import (
    NativeListing,
    NativeSession,
    Snapshot,
    candidates,
    fork_native,
    forked_as_asked,
    native_lines,
    project,
    snapshot,
    tool_calls,
)
from store.rules import NATIVE_SESSION_ID_RE
from store.transcripts.records import cap_content, wire_record
from store.transcripts.windows import WindowRequest, window_bounds

__all__ = ["NativeCatalog", "export_native", "native_summary", "native_window"]

THINKING_LEVELS = frozenset({"off", "minimal", "low", "medium", "high", "xhigh", "max", "omit"})


def native_summary(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A native projection as a ``SessionSummary``: no host settings exist, so mode and permission
    mode are the host's defaults; ``source: native-pi`` and ``native`` say what it is."""
    thinking = summary.get("thinkingLevel")
    out = {
        "id": summary["id"], "title": summary.get("title") or "", "projectId": None,
        "projectPath": summary.get("projectPath"), "providerId": summary.get("providerId"),
        "modelId": summary.get("modelId"), "mode": "agent",
        "thinkingLevel": thinking if thinking in THINKING_LEVELS else "off", "permissionMode": "inherit",
        "source": summary["source"], "deletedAt": None, "pinned": False,
        "messageCount": int(summary.get("messageCount") or 0), "createdAt": int(summary.get("createdAt") or 0),
        "updatedAt": int(summary.get("updatedAt") or 0), "native": dict(summary.get("native") or {}),
    }
    return {k: v for k, v in out.items() if v is not None or k in ("projectId", "deletedAt")}


_FileKey = tuple[int, int, int, int, int]


@dataclass
class _Entry:
    key: _FileKey
    summary: dict[str, Any] | None
    refusal: str | None


def _file_key(st: os.stat_result) -> _FileKey:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class NativeCatalog:
    """One configured pi session root (``None``: no native sessions). Thread-safe."""

    def __init__(self, root: Path | None, *, limits: ImportLimits = DEFAULT_LIMITS, faults: Faults = NO_FAULTS) -> None:
        self.root = root
        self.limits = limits
        self.faults = faults
        self._lock = threading.Lock()
        self._files: dict[str, _Entry] = {}

    # -- listing --------------------------------------------------------------------
    def listing(self) -> NativeListing:
        """Every native session under the root (summaries, newest activity first); cheap when unchanged."""
        out = NativeListing()
        if self.root is None:
            return out
        with self._lock:
            seen: set[str] = set()
            for path in candidates(self.root):
                name = str(path)
                seen.add(name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                entry = self._files.get(name)
                if entry is None or entry.key != _file_key(st):
                    entry = self._project(path, st)
                    self._files[name] = entry
                if entry.summary is None:
                    out.refused.append({"path": name, "reason": entry.refusal or "READ_ERROR"})
                    continue
                summary = dict(entry.summary)
                nid = summary["id"]
                if nid in out.paths:  # the same pi id twice (a copied file): keep both, apart
                    nid = f"{nid}.{hashlib.sha256(name.encode()).hexdigest()[:8]}"
                    summary["id"] = nid
                out.paths[nid] = Path(os.path.realpath(path))
                out.sessions.append(native_summary(summary))
            for gone in set(self._files) - seen:
                del self._files[gone]
        out.sessions.sort(key=lambda s: (-int(s["updatedAt"]), s["id"]))
        return out

    def _project(self, path: Path, st: os.stat_result) -> _Entry:
        try:
            session = project(snapshot(path), limits=self.limits)
        except (Refused, StoreError, OSError) as exc:
            return _Entry(_file_key(st), None, getattr(exc, "code", "READ_ERROR"))
        return _Entry(_file_key(st), dict(session.summary), None)

    def resolve(self, native_id: str) -> Path:
        """The canonical file of a listed native session (``SESSION_NOT_FOUND`` otherwise)."""
        if not NATIVE_SESSION_ID_RE.fullmatch(native_id):
            raise InvalidInput(f"{native_id!r} is not a native pi session id", data={"field": "sessionId"})
        if self.root is None:
            raise SessionNotFound(f"native session {native_id} not found: no native pi session root is configured",
                                  data={"sessionId": native_id})
        found = self.listing().paths.get(native_id)
        if found is None:
            raise SessionNotFound(f"native session {native_id} not found", data={"sessionId": native_id})
        return found

    # -- detail -----------------------------------------------------------------------
    def get(self, native_id: str) -> NativeSession:
        """A fresh immutable snapshot of the session, on its current branch (never repaired)."""
        path = self.resolve(native_id)
        try:
            return project(snapshot(path), native_id=native_id, limits=self.limits)
        except Refused as exc:
            raise InvalidInput(exc.message, data={"sessionId": native_id, "reason": exc.code}) from None

    def fork(self, native_id: str, *, now_ms: int, through_message_id: str | None, title: str | None,
             child_uuid: str | None) -> NativeSession:
        """``session.fork`` of a native session: the child (a retry with the same ``child_uuid`` finds it)."""
        parent = self.resolve(native_id)
        leaf: str | None = None
        kept: int | None = None
        if through_message_id is not None:
            leaf, kept = _entry_of_message(snapshot(parent), native_id, through_message_id, self.limits)
        if child_uuid is not None:
            found = _find_child(parent.parent, child_uuid, self.limits)
            if found is not None:
                # the child an earlier attempt published before its receipt committed: the answer only to
                # the same request (the same key for another fork is a conflict, never that child)
                if not forked_as_asked(snapshot(parent), found.snapshot, leaf_id=leaf, title=title,
                                       limits=self.limits, calls_kept=kept):
                    raise IdempotencyConflict(
                        "this submissionId already forked this session into another child (another message, "
                        "title or parent): a new fork needs a new submissionId",
                        data={"sessionId": native_id, "childId": found.id})
                return found
        result = fork_native(parent, now_ms=now_ms, leaf_id=leaf, title=title, child_uuid=child_uuid,
                             limits=self.limits, calls_kept=kept, faults=self.faults)
        return result.session


def _entry_of_message(snap: Snapshot, native_id: str, message_id: str,
                      limits: ImportLimits) -> tuple[str | None, int | None]:
    """Where a fork through a message id of the native projection ends (``MESSAGE_NOT_FOUND`` if no entry
    makes that id): the pi entry behind it and, for an assistant entry with tool calls, how many of its calls
    the child keeps. An entry's own message keeps none (its calls are the messages after it); its ``i``-th
    tool call's message ``<entry>.<i>`` keeps calls ``0..i``. A corrupt-leaf notice (shown after the whole
    branch) is the whole branch: ``(None, None)``; a torn-entry notice (shown before the entry recovered from
    behind it) is the whole entry before that one (the child's lines are whole: it holds no such notice)."""
    prefix = f"{native_id}:"
    local = message_id[len(prefix):] if message_id.startswith(prefix) else None
    if local:
        for line in native_lines(snap.data, max_line_bytes=limits.max_line_bytes):
            # an entry recovered from behind a torn start is read as the read reads it (locate_entry)
            rec = locate_entry(line.data)[0] if line.data is not None else None
            if rec is None or rec.get("type") == "session" or not isinstance(rec.get("id"), str):
                continue
            key: str = rec["id"]
            calls = tool_calls(rec)
            if local_id(key) == local:
                return key, 0 if calls else None
            for i in range(len(calls)):
                if local_id(f"{key}.{i}") == local:
                    return key, i + 1
            if local_id(f"{CORRUPT_LEAF}:{key}") == local:
                return None, None
            parent = rec.get("parentId")
            if local_id(f"{TORN}:{key}") == local and isinstance(parent, str) and parent:
                return parent, None
    raise MessageNotFound(f"message {message_id} is not in native session {native_id}",
                          data={"sessionId": native_id, "messageId": message_id})


def _find_child(directory: Path, child_uuid: str, limits: ImportLimits) -> NativeSession | None:
    """A child an earlier attempt of the same fork already published (``<timestamp>_<uuid>.jsonl``)."""
    suffix = f"_{child_uuid}.jsonl"
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(suffix))
    except OSError:
        return None
    for name in names:
        try:
            child = project(snapshot(directory / name), limits=limits)
        except (Refused, StoreError, OSError):
            continue
        if child.header.get("id") == child_uuid:
            return child
    return None


# --------------------------------------------------------------------------- window and export


def native_window(session: NativeSession, req: WindowRequest) -> dict[str, Any]:
    """``session.get``'s result for a native session (pure): the window over its current branch."""
    messages = session.messages
    total = len(messages)
    target: int | None = None
    if req.around is not None:
        target = next((i for i, rec in enumerate(messages) if rec["id"] == req.around), None)
        if target is None:
            raise MessageNotFound(f"message {req.around} is not in session {session.id}",
                                  data={"sessionId": session.id, "messageId": req.around})
    start, end = window_bounds(total, req, target)
    out: list[dict[str, Any]] = []
    for pos in range(start, end):
        rec = wire_record(messages[pos])
        rec["seq"] = pos + 1
        out.append(cap_content(rec, req.content_limit, selected=target == pos))
    return {
        "session": native_summary(session.summary),
        "messages": out,
        "compactions": [wire_record(normalize_on_read(dict(c))) for c in session.compactions],
        "messageStart": start,
        "messageEnd": end,
        "hasMoreBefore": start > 0,
        "hasMoreAfter": end < total,
        "totalMessages": total,
    }


def _with_checkpoints(session: NativeSession) -> tuple[
        list[dict[str, Any]], Iterator[tuple[dict[str, Any], list[dict[str, Any]], None]]]:
    after: dict[str, list[dict[str, Any]]] = {}
    ids = {rec["id"] for rec in session.messages}
    orphans: list[dict[str, Any]] = []
    for cp in session.compactions:
        through = cp.get("throughMessageId")
        if isinstance(through, str) and through in ids:
            after.setdefault(through, []).append(cp)
        else:
            orphans.append(cp)

    def records() -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], None]]:
        for rec in session.messages:  # a native session's lines name no root of this host's
            yield rec, after.pop(rec["id"], []), None

    return orphans, records()


def export_native(session: NativeSession, out: BinaryIO, options: ExportOptions) -> ExportReport:
    """``session.export`` of a native session (from its snapshot; no environments exist)."""
    orphans, records = _with_checkpoints(session)
    return export_records(native_summary(session.summary), records, orphans, (), out, options)
