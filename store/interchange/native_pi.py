"""Native pi sessions, read-only, and the native fork (seed 003 §12, ADR 0254).

A configured pi session root (``~/.pi/agent/sessions``) is a second transcript
authority, owned by pi: nothing here is ever written to SQLite or copied to
this host's ``sessions/``, and no byte of a native file is ever modified.

* **list** (:func:`list_native`): every ``*.jsonl`` under the root (regular
  files only, never through a symlink) is read as an immutable byte snapshot
  and projected as a session summary with the opaque id ``native-pi:<pi id>``
  and ``source: "native-pi"``; files that are not pi sessions are reported,
  not listed. The canonical path stays inside the host (never on the wire).
* **get** (:func:`get_native`): a snapshot of the file, parsed in memory
  (:class:`store.interchange.importers.pi.PiConverter`, the importer's own reading of
  v1–v3) following the current branch from the leaf. pi's persistent
  ``SessionManager.open`` would repair a missing newline or migrate an old
  format in place; this never does. A last line without its newline is read
  as it stands when it is one complete JSON object (:func:`native_lines`);
  one that does not parse is a torn tail and is not read. Listing, detail,
  header reading and fork all read lines this one way.
* **unsupported operations** (:func:`check_supported`): rename, delete,
  project move, revisions, queue, plan/goal, collaboration and appends are
  refused with ``UNSUPPORTED_FOR_NATIVE_SESSION``.
* **fork** (:func:`fork_native`): exactly one new v3 child in the parent's
  directory. The branch is the one **get** shows, found by the same walk
  (:func:`.importers.pi.find_branch`, :func:`.importers.pi.on_branch`: on a
  damaged tree the same fallback branch), extracted from the parent snapshot (its entry lines
  copied byte for byte, unknown fields kept; every child line, the parent's
  unterminated last entry included, ends with a newline), the child title and the
  parent's saved model / thinking level are appended when the branch lacks
  them, and the child header carries ``parentSession`` (the parent's canonical
  path). A fork through one tool message ``<entry>.<i>`` of an assistant entry
  keeps that entry's calls ``0..i`` with their results and drops its later calls
  (:func:`_through_call`: the entry's line and a re-parented result's line are the
  only lines not copied byte for byte). Publication: a full write of an exclusive (``O_EXCL``) non-``.jsonl``
  temp file in the same directory, fsynced; the staged file must still match
  the device/inode/size/SHA-256 captured at write time before a same-directory
  hard link to ``<timestamp>_<id>.jsonl`` (``link`` never replaces a file),
  and the published name must match that same identity and hash afterwards.
  Any mismatch fails closed (``CONFLICT`` with a ``reason``) without a child;
  cleanup removes only files whose device/inode and content still match what
  this fork wrote (the whole file by size + hash, a partial staging write by
  byte prefix). A foreign file — one that took the final name first, or
  replaced a staged or published name — is never removed. The parent is only
  ever opened read-only. A fork killed before its cleanup leaves its staging
  file; boot removes it (:func:`sweep_fork_staging`, only what is provably one).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from store.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import fsync_dir, write_all
from store.interchange.importers.common import (
    DEFAULT_LIMITS,
    FileReport,
    ImportLimits,
    ParseContext,
    Refused,
    SessionMeta,
    SessionReport,
    local_id,
)
from store.interchange.importers.pi import Branch, PiConverter, find_branch, locate_entry, on_branch, read_header
from store.interchange.importers.reader import Line, lines_of, parse_object, read_bounded
from store.jsonio import now_rfc3339
from store.transcripts.records import rfc3339_to_ms

__all__ = [
    "NATIVE_PREFIX",
    "SUPPORTED",
    "ForkHooks",
    "ForkResult",
    "NativeListing",
    "NativeSession",
    "Snapshot",
    "UnsupportedForNativeSession",
    "check_supported",
    "fork_native",
    "forked_as_asked",
    "get_native",
    "is_native_id",
    "list_native",
    "native_lines",
    "snapshot",
    "staging_header_prefix",
    "sweep_fork_staging",
    "tool_calls",
    "unsupported_for_native",
]

NATIVE_PREFIX = "native-pi:"
SOURCE = "native-pi"
MAX_NATIVE_BYTES = 256 * 1024 * 1024
SUPPORTED = frozenset({"session.list", "session.get", "session.fork", "session.export"})
"""Methods a native session answers; every other session method is refused."""
_NATIVE_ID = re.compile(r"^native-pi:[A-Za-z0-9_\-.@+=]{1,120}$")


class UnsupportedForNativeSession(StoreError):
    """A mutation this host does not perform on pi-owned sessions (seed §12: rename, delete, revisions...)."""

    code = "UNSUPPORTED_FOR_NATIVE_SESSION"


def is_native_id(value: object) -> bool:
    return isinstance(value, str) and value.startswith(NATIVE_PREFIX)


def unsupported_for_native(method: str, session_id: str) -> UnsupportedForNativeSession:
    """The refusal of ``method`` for a native session (the request pipeline raises it before validation)."""
    return UnsupportedForNativeSession(
        f"{method} is not supported for native pi sessions (they belong to pi; fork one to change it)",
        data={"sessionId": session_id[:200], "method": method})


def check_supported(method: str, session_id: str) -> None:
    if is_native_id(session_id) and method not in SUPPORTED:
        raise unsupported_for_native(method, session_id)


# --------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class Snapshot:
    """The bytes of a native file as they were at one moment, with the file's identity then."""

    path: Path
    data: bytes
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _open_regular(path: Path) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise NotFound(f"native session file {path} not found", data={"path": str(path)}) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidInput(f"{path} is a symlink; native sessions are read only from regular files",
                               data={"path": str(path)}) from None
        raise classify_os_error(exc, f"open {path}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InvalidInput(f"{path} is not a regular file", data={"path": str(path)})
    return fd, st


def snapshot(path: Path, *, max_bytes: int = MAX_NATIVE_BYTES) -> Snapshot:
    """An immutable byte snapshot: one read of the whole file (read-only, no symlink, bounded)."""
    fd, st = _open_regular(path)
    try:
        if st.st_size > max_bytes:
            raise PayloadTooLarge(f"{path} is larger than {max_bytes} bytes", data={"path": str(path)})
        chunks: list[bytes] = []
        total = 0
        while total < st.st_size:
            chunk = os.read(fd, min(1 << 20, st.st_size - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return Snapshot(path, b"".join(chunks), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def native_lines(data: bytes, *, max_line_bytes: int) -> Iterator[Line]:
    """The lines of a native snapshot: its complete lines (:func:`lines_of`), then a last line without
    a newline if it is one complete JSON object within the line bound (pi may not have written the newline
    yet, or a user's editor dropped it). A last line that does not parse is a torn tail: not read. The
    bytes are never repaired; a trailing line's ``length`` has no newline to count."""
    end = 0
    for line in lines_of(data, max_line_bytes=max_line_bytes):
        end = line.offset + line.length
        yield line
    tail = data[end:]
    if tail and len(tail) <= max_line_bytes and parse_object(tail) is not None:
        yield Line(end, tail, len(tail))


# --------------------------------------------------------------------------- projection


def _native_id(pi_id: str) -> str:
    return NATIVE_PREFIX + local_id(pi_id)


@dataclass
class NativeSession:
    id: str
    summary: dict[str, Any]
    messages: list[dict[str, Any]]
    compactions: list[dict[str, Any]]
    report: SessionReport
    snapshot: Snapshot
    leaf_id: str | None
    header: dict[str, Any]


def project(snap: Snapshot, *, native_id: str | None = None, limits: ImportLimits = DEFAULT_LIMITS) -> NativeSession:
    """Parse a snapshot in memory and follow its current branch (raises :class:`Refused`)."""
    first = next(iter(native_lines(snap.data, max_line_bytes=limits.max_line_bytes)), None)
    header = read_header(parse_object(first.data) if first is not None and first.data is not None else None)
    nid = native_id or _native_id(header.id)
    meta = SessionMeta(SOURCE, header.id, nid)
    report = SessionReport(SOURCE, header.id, nid)
    file = FileReport(str(snap.path), size=snap.size)
    report.files.append(file)
    conv = PiConverter(ParseContext(limits), meta, report, file, lambda key: f"{nid}:{local_id(key)}")
    messages: list[dict[str, Any]] = []
    compactions: list[dict[str, Any]] = []
    positions: dict[str, int] = {}
    for slot in conv.run(lambda: native_lines(snap.data, max_line_bytes=limits.max_line_bytes)):
        rec = slot.record
        if rec["type"] == "compaction":
            compactions.append(rec)
        elif rec["id"] in positions:
            messages[positions[rec["id"]]] = rec
        else:
            positions[rec["id"]] = len(messages)
            messages.append(rec)
    branch = conv.branch
    summary = {
        "id": nid, "source": SOURCE, "title": meta.title, "projectPath": header.cwd,
        "messageCount": len(messages), "createdAt": header.timestamp or meta.created_ms or 0,
        "updatedAt": meta.updated_ms or header.timestamp or 0, "native": {"version": header.version,
                                                                           "readOnly": True},
        "modelId": meta.history.get("modelId"), "providerId": meta.history.get("providerId"),
        "thinkingLevel": meta.thinking_level,
    }
    return NativeSession(nid, summary, messages, compactions, report, snap, branch.leaf if branch else None,
                         header.raw)


@dataclass
class NativeListing:
    sessions: list[dict[str, Any]] = field(default_factory=list)
    """Summaries, newest activity first (what ``session.list`` merges in)."""
    refused: list[dict[str, str]] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)
    """native id → canonical file path (host-internal: never sent to a client)."""


def candidates(root: Path) -> Iterator[Path]:
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".jsonl"):
                path = Path(dirpath) / name
                try:
                    regular = stat.S_ISREG(os.lstat(path).st_mode)
                except OSError:  # pi deleted or renamed it since the walk listed it: not a session now
                    continue
                if regular:
                    yield path


def list_native(root: Path, *, limits: ImportLimits = DEFAULT_LIMITS) -> NativeListing:
    """Every native session under ``root`` (read-only snapshots; nothing is cached or written)."""
    out = NativeListing()
    for path in candidates(root):
        try:
            session = project(snapshot(path), limits=limits)
        except (Refused, StoreError, OSError) as exc:
            out.refused.append({"path": str(path), "reason": getattr(exc, "code", "READ_ERROR")})
            continue
        nid = session.id
        if nid in out.paths:  # the same pi id twice (a copied file): keep both, apart
            nid = f"{nid}.{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
            session.summary["id"] = nid
        out.paths[nid] = Path(os.path.realpath(path))
        out.sessions.append(session.summary)
    out.sessions.sort(key=lambda s: (-int(s["updatedAt"] or 0), s["id"]))
    return out


def get_native(root: Path, native_id: str, *, limits: ImportLimits = DEFAULT_LIMITS,
               listing: NativeListing | None = None) -> NativeSession:
    """The current-branch detail of one native session (``NOT_FOUND`` for an unknown id)."""
    if not _NATIVE_ID.fullmatch(native_id):
        raise InvalidInput(f"{native_id!r} is not a native pi session id", data={"field": "sessionId"})
    found = (listing or list_native(root, limits=limits)).paths.get(native_id)
    if found is None:
        raise NotFound(f"native session {native_id} not found", data={"sessionId": native_id})
    try:
        return project(snapshot(found), native_id=native_id, limits=limits)
    except Refused as exc:
        raise InvalidInput(exc.message, data={"sessionId": native_id, "reason": exc.code}) from None


# --------------------------------------------------------------------------- fork


@dataclass
class ForkHooks:
    """Test seams at each publication step (production passes none)."""

    write: Callable[[int, bytes], None] = field(default=write_all)
    after_stage: Callable[[Path], None] | None = None
    before_link: Callable[[Path, Path], None] | None = None
    after_link: Callable[[Path], None] | None = None


@dataclass(frozen=True)
class ForkResult:
    path: Path
    native_id: str
    header: dict[str, Any]
    session: NativeSession


def _branch_lines(snap: Snapshot, leaf_id: str | None, limits: ImportLimits, calls_kept: int | None = None,
                  ) -> tuple[dict[str, Any], list[tuple[dict[str, Any], bytes]], str | None]:
    """The parent's header, the (entry, raw entry bytes) pairs of the branch, in file order, and its leaf.

    The branch is the one a detail read shows (:func:`project`): the same first pass
    (:func:`find_branch`: its bounded walk, a cycle stopping at its first repeat, and without ``leaf_id``
    the fallback from a leaf that reaches no root to the newest one that does) and the same reading of its
    lines (:func:`on_branch`: every line holding one of its entries, an entry recovered from behind a torn
    start copied without those bytes)."""
    lines = list(native_lines(snap.data, max_line_bytes=limits.max_line_bytes))
    if not lines or lines[0].data is None:
        raise InvalidInput("the parent is not a pi session", data={"reason": "NOT_A_SESSION_FILE"})
    file = FileReport(str(snap.path), size=snap.size)
    try:
        branch = find_branch(lines, file, SessionReport(SOURCE, "", ""), limits.max_tracked_ids, leaf_id)
    except Refused as exc:
        raise InvalidInput(exc.message, data={"reason": exc.code}) from None
    if branch.header.version != 3:
        raise UnsupportedForNativeSession(
            f"only pi v3 sessions can be forked (this one is v{branch.header.version})",
            data={"version": branch.header.version})
    if leaf_id is not None and leaf_id not in branch.parents:
        raise NotFound(f"entry {leaf_id} is not in the parent session", data={"entryId": leaf_id})
    found_lines = list(on_branch(lines, branch, file))
    entries = [(found.rec, snap.data[found.line.offset + found.start: found.line.offset + found.line.length])
               for found in found_lines]
    if calls_kept is not None and entries:
        after = found_lines[-1].line.offset + found_lines[-1].line.length
        entries = _through_call(snap, [line for line in lines if line.offset >= after], branch, entries, calls_kept)
        return branch.header.raw, entries, str(entries[-1][0]["id"])
    return branch.header.raw, entries, branch.leaf if entries else None


def tool_calls(rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The tool calls of an assistant entry, in the order the reader numbers them (``<entry>.<i>``)."""
    message = rec.get("message")
    if rec.get("type") != "message" or not isinstance(message, Mapping) or message.get("role") != "assistant" \
            or not isinstance(message.get("content"), list):
        return []
    return [b for b in message["content"] if isinstance(b, Mapping) and b.get("type") == "toolCall"]


def _through_call(snap: Snapshot, later: list[Line], branch: Branch, entries: list[tuple[dict[str, Any], bytes]],
                  kept: int) -> list[tuple[dict[str, Any], bytes]]:
    """A branch ending at an assistant entry, cut after its first ``kept`` tool calls (the messages
    ``<entry>.0`` .. ``<entry>.<kept-1>`` a read shows): the entry keeps its other blocks and those calls
    only (rewritten when it loses any), and the results pi recorded for the kept calls follow it (for each
    call the first ``toolResult`` entry answering it among the entry's descendants, in file order), each
    parented to the entry before it in the child (rewritten only when that differs), so the child shows
    each kept call with the result the parent showed, and no call without its result."""
    rec, raw = entries[-1]
    calls = tool_calls(rec)
    if kept < len(calls):
        dropped = {id(block) for block in calls[kept:]}
        message = rec["message"]
        rec = {**rec, "message": {**message, "content": [b for b in message["content"] if id(b) not in dropped]}}
        raw = orjson.dumps(rec)
    out = [*entries[:-1], (rec, raw)]
    wanted = {b["id"] for b in calls[:kept] if isinstance(b.get("id"), str) and b["id"]}
    anchor = last = str(rec["id"])
    for line in later:  # the lines after the entry's own
        if not wanted:
            break
        if line.data is None:
            continue
        found, start = locate_entry(line.data)
        message = found.get("message") if found is not None else None
        if found is None or found.get("type") != "message" or not isinstance(message, Mapping) \
                or message.get("role") != "toolResult" or not isinstance(message.get("toolCallId"), str) \
                or message["toolCallId"] not in wanted:
            continue
        key = found.get("id")
        if not isinstance(key, str) or key == anchor or anchor not in branch.for_leaf(key).keys:
            continue
        wanted.discard(message["toolCallId"])
        data = snap.data[line.offset + start: line.offset + line.length]
        if found.get("parentId") != last:
            found["parentId"] = last
            data = orjson.dumps(found)
        out.append((found, data))
        last = key
    return out


def _fallbacks(branch: list[tuple[dict[str, Any], bytes]], parent_entries: Iterable[dict[str, Any]],
               title: str | None, now_iso: str) -> list[dict[str, Any]]:
    """Entries appended to the child: its title, and the parent's saved model/thinking level if the branch
    does not set them itself."""
    kinds = {kind for rec, _ in branch if isinstance(kind := rec.get("type"), str)}
    has_model = "model_change" in kinds or any(
        rec.get("type") == "message" and isinstance(rec.get("message"), Mapping)
        and rec["message"].get("role") == "assistant" for rec, _ in branch)
    saved_model: dict[str, Any] | None = None
    saved_thinking: str | None = None
    saved_name: str | None = None
    for rec in parent_entries:
        kind = rec.get("type")
        if kind == "model_change" and isinstance(rec.get("modelId"), str):
            saved_model = {"provider": rec.get("provider"), "modelId": rec["modelId"]}
        elif kind == "message" and isinstance(rec.get("message"), Mapping) and rec["message"].get("role") == \
                "assistant" and isinstance(rec["message"].get("model"), str):
            saved_model = {"provider": rec["message"].get("provider"), "modelId": rec["message"]["model"]}
        elif kind == "thinking_level_change" and isinstance(rec.get("thinkingLevel"), str):
            saved_thinking = rec["thinkingLevel"]
        elif kind == "session_info" and isinstance(rec.get("name"), str):
            saved_name = rec["name"]
    out: list[dict[str, Any]] = []
    name = title if title is not None else (f"{saved_name} (fork)" if saved_name else None)
    if name:
        out.append({"type": "session_info", "timestamp": now_iso, "name": name})
    if not has_model and saved_model is not None:
        out.append({"type": "model_change", "timestamp": now_iso, **saved_model})
    if "thinking_level_change" not in kinds and saved_thinking is not None:
        out.append({"type": "thinking_level_change", "timestamp": now_iso, "thinkingLevel": saved_thinking})
    return out


def child_bytes(snap: Snapshot, *, child_id: str, now_ms: int, leaf_id: str | None = None, title: str | None = None,
                limits: ImportLimits = DEFAULT_LIMITS, calls_kept: int | None = None) -> bytes:
    """The whole child file, built in memory from the parent snapshot (the parent is not touched).
    ``calls_kept``: the fork ends inside ``leaf_id``'s tool calls, after that many (:func:`_through_call`)."""
    parent_header, branch, leaf = _branch_lines(snap, leaf_id, limits, calls_kept)
    now_iso = now_rfc3339(now_ms)
    parent_path = os.path.realpath(snap.path)
    try:
        parent_path.encode("utf-8")
    except UnicodeEncodeError:  # a folder name that is not UTF-8: no v3 (JSON) header can name it
        raise UnsupportedForNativeSession(
            "this session's path is not valid UTF-8, so a child's header cannot name it as its parentSession",
            data={"reason": "path_not_utf8"}) from None
    header = {"type": "session", "version": 3, "id": child_id, "timestamp": now_iso,
              "cwd": parent_header.get("cwd", ""), "parentSession": parent_path}
    parts = [orjson.dumps(header) + b"\n"]
    used = {rec["id"] for rec, _ in branch}
    last = leaf  # what is appended continues the branch from its leaf (not from the last line copied)
    for _, raw in branch:
        parts.append(raw if raw.endswith(b"\n") else raw + b"\n")
    all_entries = [rec for rec in (parse_object(line.data) for line in native_lines(
        snap.data, max_line_bytes=limits.max_line_bytes) if line.data is not None) if rec is not None]
    for extra in _fallbacks(branch, all_entries, title, now_iso):
        eid = secrets.token_hex(4)
        while eid in used:
            eid = secrets.token_hex(4)
        used.add(eid)
        entry = {"type": extra.pop("type"), "id": eid, "parentId": last, **extra}
        last = eid
        parts.append(orjson.dumps(entry) + b"\n")
    return b"".join(parts)


def forked_as_asked(parent: Snapshot, child: Snapshot, *, leaf_id: str | None, title: str | None,
                    limits: ImportLimits = DEFAULT_LIMITS, calls_kept: int | None = None) -> bool:
    """Is ``child`` (a file an earlier attempt of the same keyed fork published, then crashed before its
    receipt) what this fork of ``parent`` asks for: the same parent, branch and title? Rebuilt with
    :func:`child_bytes` at the child's own time; its appended entries' random ids aside, byte for byte.
    Without ``leaf_id`` the branch is the parent's current one (the branch a read shows, a damaged tree's
    fallback included) or, when pi has appended to the parent since, the one ending where the child's copied
    parent lines end, which must have been the parent's leaf then: only entries timestamped after the fork
    may follow it."""
    lines = child.data.split(b"\n")
    try:
        header = orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        return False
    if not isinstance(header, dict) or header.get("parentSession") != os.path.realpath(parent.path) \
            or not isinstance(header.get("id"), str):
        return False
    forked_at = rfc3339_to_ms(header.get("timestamp"), -1)
    if leaf_id is None and _same_child(parent, lines, header["id"], forked_at, None, title, limits):
        return True  # the parent's current branch, as it still is (a damaged tree's fallback branch too)
    if leaf_id is None:
        entries = [(rec, parent.data[line.offset: line.offset + line.length].rstrip(b"\n"))
                   for line in native_lines(parent.data, max_line_bytes=limits.max_line_bytes)
                   if line.data is not None and (rec := parse_object(line.data)) is not None
                   and isinstance(rec.get("id"), str)]
        raw = {rec["id"]: data for rec, data in entries}
        for line in lines[1:]:
            rec = parse_object(line) if line else None
            if rec is None or raw.get(rec.get("id")) != line:
                break
            leaf_id = rec["id"]
        # the parent's leaf then: every entry after it in the file came after the fork
        after = [rec for rec, _ in entries[next((i + 1 for i, (rec, _) in enumerate(entries)
                                                 if rec["id"] == leaf_id), len(entries)):]]
        if leaf_id is None or any(rfc3339_to_ms(rec.get("timestamp"), -1) < forked_at for rec in after):
            return False
    return _same_child(parent, lines, header["id"], forked_at, leaf_id, title, limits, calls_kept)


def _same_child(parent: Snapshot, lines: list[bytes], child_id: str, forked_at: int, leaf_id: str | None,
                title: str | None, limits: ImportLimits, calls_kept: int | None = None) -> bool:
    """Are a child's ``lines`` what :func:`child_bytes` builds from ``parent`` for this fork (the ids of the
    entries it appended aside)?"""
    try:
        expected = child_bytes(parent, child_id=child_id, now_ms=forked_at, leaf_id=leaf_id, title=title,
                               limits=limits, calls_kept=calls_kept).split(b"\n")
    except StoreError:
        return False
    if len(expected) != len(lines):
        return False
    for got, want in zip(lines, expected, strict=True):
        if got != want:
            a, b = parse_object(got), parse_object(want)
            if a is None or b is None or {k: v for k, v in a.items() if k not in ("id", "parentId")} != \
                    {k: v for k, v in b.items() if k not in ("id", "parentId")}:
                return False
    return True


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _read_all(path: Path, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return read_bounded(fd, limit)
    finally:
        os.close(fd)


def _matches(path: Path, identity: tuple[int, int], data: bytes, *, prefix_ok: bool) -> bool:
    """Is ``path`` still the file this fork wrote (same inode, and the content, or a prefix of it)?"""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or _identity(st) != identity:
        return False
    if st.st_size > len(data) or (not prefix_ok and st.st_size != len(data)):
        return False
    content = _read_all(path, len(data))
    if content is None:
        return False
    return content == data if not prefix_ok else data.startswith(content)


def _remove_if_ours(path: Path, identity: tuple[int, int] | None, data: bytes, *, prefix_ok: bool) -> bool:
    if identity is None or not _matches(path, identity, data, prefix_ok=prefix_ok):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


STAGING_INFIX = ".fork-"
STAGING_SUFFIX = ".tmp"
_STAGING_NAME = re.compile(r"^\.(\d{4}-\d\d-\d\dT\d\d)-(\d\d)-(\d\d)-(\d{3}Z)_"
                           r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl"
                           + re.escape(STAGING_INFIX) + r"[0-9a-f]{12}" + re.escape(STAGING_SUFFIX) + "$")


def staging_header_prefix(name: str) -> bytes | None:
    """The bytes every staging file :func:`fork_native` names ``name`` starts with (its child's header up to
    ``cwd``), or None when ``name`` is not such a name."""
    found = _STAGING_NAME.fullmatch(name)
    if found is None:
        return None
    day, hh, mm, ms, cid = found.groups()
    stamp = f"{day}:{hh}:{mm}.{ms}"
    return b'{"type":"session","version":3,"id":"' + cid.encode() + b'","timestamp":"' + stamp.encode() \
        + b'","cwd":'


def _is_fork_staging(path: Path, st: os.stat_result) -> bool:
    """Provably a staging file a killed fork left: its name is one :func:`fork_native` makes, it is a regular
    file of this user with the mode the fork creates it with (0600), and its bytes are empty or begin as the
    child header its name promises (a partial write holds a prefix of it)."""
    prefix = staging_header_prefix(path.name)
    if prefix is None or not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() \
            or stat.S_IMODE(st.st_mode) != 0o600:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if _identity(os.fstat(fd)) != _identity(st):
            return False
        head = b""
        while len(head) < len(prefix) and (chunk := os.read(fd, len(prefix) - len(head))):
            head += chunk
    finally:
        os.close(fd)
    return prefix.startswith(head) and (len(head) == len(prefix) or st.st_size == len(head))


def sweep_fork_staging(root: Path) -> list[Path]:
    """Boot (nothing is forking yet): remove the staging files of forks killed before they finished
    (:func:`_is_fork_staging`) under a native pi root, fsyncing each folder one left. A fork killed after its
    link leaves the child published under its final name (a hard link of the same file): only the staging
    name goes. Nothing else under the root is touched (symlinks are not followed)."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        here: list[Path] = []
        for name in sorted(filenames):
            if not name.endswith(STAGING_SUFFIX) or STAGING_INFIX not in name:
                continue
            path = Path(dirpath) / name
            try:
                if not _is_fork_staging(path, os.lstat(path)):
                    continue
                os.unlink(path)
            except OSError:
                continue
            here.append(path)
        if here:
            removed += here
            try:
                fsync_dir(Path(dirpath))
            except OSError:  # the names are gone from this boot's view; a lost unlink is swept at the next one
                pass
    return removed


def _fail(reason: str, message: str, **data: Any) -> Conflict:
    return Conflict(f"native fork failed closed: {message}", data={"reason": reason, **data})


def fork_native(parent: Path, *, now_ms: int, leaf_id: str | None = None, title: str | None = None,
                child_uuid: str | None = None, hooks: ForkHooks | None = None,
                limits: ImportLimits = DEFAULT_LIMITS, calls_kept: int | None = None,
                faults: Faults = NO_FAULTS) -> ForkResult:
    """Write exactly one v3 child beside ``parent`` (see the module doc); the parent is only read.
    Fault points: ``nativeFork.after_stage`` (the staging file written and fsynced, not linked),
    ``nativeFork.after_link`` (the child published, the staging name not yet removed)."""
    hooks = hooks or ForkHooks()
    snap = snapshot(parent)
    cid = child_uuid or str(uuid.uuid4())
    data = child_bytes(snap, child_id=cid, now_ms=now_ms, leaf_id=leaf_id, title=title, limits=limits,
                       calls_kept=calls_kept)
    digest = hashlib.sha256(data).hexdigest()
    directory = parent.parent
    final = directory / f"{now_rfc3339(now_ms).replace(':', '-').replace('.', '-')}_{cid}.jsonl"
    temp = directory / f".{final.name}{STAGING_INFIX}{secrets.token_hex(6)}{STAGING_SUFFIX}"
    identity: tuple[int, int] | None = None
    linked = False
    try:
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise classify_os_error(exc, f"stage {temp}") from exc
        try:
            identity = _identity(os.fstat(fd))
            try:
                hooks.write(fd, data)
                os.fsync(fd)
            except OSError as exc:
                raise classify_os_error(exc, f"write {temp}") from exc
        finally:
            os.close(fd)
        faults.point("nativeFork.after_stage")
        if hooks.after_stage:
            hooks.after_stage(temp)
        if not _matches(temp, identity, data, prefix_ok=False):
            raise _fail("staged_file_changed", f"{temp.name} no longer matches what was written "
                        "(device/inode/size/hash)", expectedSha256=digest)
        if hooks.before_link:
            hooks.before_link(temp, final)
        try:
            os.link(temp, final)
        except FileExistsError:
            raise _fail("target_exists", f"{final.name} already exists; it is not ours and stays") from None
        except OSError as exc:
            raise classify_os_error(exc, f"link {final}") from exc
        linked = True
        faults.point("nativeFork.after_link")
        if hooks.after_link:
            hooks.after_link(final)
        if not _matches(final, identity, data, prefix_ok=False):
            raise _fail("published_file_changed", f"{final.name} does not match the staged file "
                        "(device/inode/size/hash)", expectedSha256=digest)
        fsync_dir(directory)
    except BaseException:
        _remove_if_ours(temp, identity, data, prefix_ok=True)
        if linked:
            _remove_if_ours(final, identity, data, prefix_ok=False)
        try:
            fsync_dir(directory)
        except OSError:
            pass
        raise
    _remove_if_ours(temp, identity, data, prefix_ok=False)
    fsync_dir(directory)
    child = project(Snapshot(final, data, identity[0], identity[1], len(data), 0), limits=limits)
    return ForkResult(final, child.id, orjson.loads(data.split(b"\n", 1)[0]), child)
