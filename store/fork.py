"""Fork planning and the fork's file steps (seed 003 §4.5, §5 fork row).

A fork copies the live transcript — or, message-scoped, the prefix through one
message — into a new, independent session:

* every message id is remapped, and so is every tool-call id (``callId`` /
  ``toolCallId`` in blocks, ``meta.parentToolCallId`` / ``meta.toolCallId``):
  the mapping is a pure function of ``(child id, old id)``
  (:func:`derived_id`), so every reference inside the fork stays consistent
  and no child id can collide with a source id;
* a compaction checkpoint is copied only when its boundary
  (``throughMessageId``) is included, bounded as a read serves it
  (:func:`store.compaction.normalize_on_read`: a stored tail over its mode's
  bound or a legacy tail is written as its latest user message or empty,
  never as it stood); its ids (own id, boundary,
  ``firstKeptMessageId`` when included, retained-tail message and call ids) are
  remapped the same way;
* a tombstoned message stays tombstoned in the child;
* what belongs to the source and means nothing in the child is dropped: the
  internal command receipt (``meta.receipt``), the regenerate pager stamp
  (``revisionCount`` / ``activeRevision`` / ``revisionRootId`` — revisions
  are not copied), and ``turnId`` (turn rows, run snapshots and approval rows
  are never copied);
* references to ``scratch/<source>/pasted/...`` in any string (message or
  checkpoint) are rewritten to ``scratch/<child>/pasted/...``; only referenced
  files that exist are copied (:func:`copy_pasted`).

Planning is pure; :func:`write_child_transcript`, :func:`copy_pasted` and
:func:`remove_child_files` are the synchronous file steps the session actor
orders (copies → transcript → index → reply; cleanup on a handled failure).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.compaction import normalize_on_read, split_valid
from store.errors import Conflict, MessageNotFound, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, open_nofollow, remove_file_durable, write_all
from store.indexing import index
from store.tombstones import tombstone_record
from store.transcripts.records import Root
from store.transcripts.rewrite import RewritePlan, Rewritten, plan_rewrite, reindex, rewritten
from store.transcripts.transcript import header_line

CALL_KEYS = ("callId", "toolCallId")
META_CALL_KEYS = ("parentToolCallId", "toolCallId")
DROPPED_META = ("receipt", "revisionCount", "activeRevision", "revisionRootId")
PASTED = "pasted"
_NAME_END = re.compile(r"[\n\r\t\"'<>|`]")
_TRAILING = ".,;:!?)]}"
MAX_REF_CHARS = 1024
"""A referenced name is looked for in at most this many characters after ``pasted/``."""


def derived_id(child_id: str, kind: str, old_id: str) -> str:
    """The child's id for ``old_id`` (deterministic, bounded, never a source id)."""
    digest = hashlib.sha256(f"{child_id}\x00{kind}\x00{old_id}".encode()).hexdigest()[:32]
    return f"{kind[0]}{digest}"


@dataclass
class Remapper:
    """Rewrites ids and scratch paths of one fork; collects the pasted names it saw."""

    source_id: str
    child_id: str
    pasted_refs: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._path_re = re.compile(
            rf"(?<![A-Za-z0-9_.\-])scratch([/\\]){re.escape(self.source_id)}([/\\]){PASTED}\2"
        )

    def message_id(self, old: str) -> str:
        return derived_id(self.child_id, "message", old)

    def call_id(self, old: str) -> str:
        return derived_id(self.child_id, "call", old)

    def string(self, value: str) -> str:
        if self.source_id not in value or PASTED not in value:
            return value
        pieces: list[str] = []
        last = 0
        for match in self._path_re.finditer(value):
            sep = match.group(1)
            pieces.append(value[last:match.start()])
            pieces.append(f"scratch{sep}{self.child_id}{sep}{PASTED}{match.group(2)}")
            last = match.end()
            rest = value[last: last + MAX_REF_CHARS]
            end = _NAME_END.search(rest)
            ref = rest[: end.start() if end else len(rest)]
            if ref:
                self.pasted_refs.add(ref)
        if not pieces:
            return value
        pieces.append(value[last:])
        return "".join(pieces)

    def value(self, value: Any) -> Any:
        """Scratch paths rewritten in every string of a JSON value (keys untouched)."""
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value

    def block(self, block: Any) -> Any:
        if not isinstance(block, dict):
            return self.value(block)
        out = self.value(block)
        for key in CALL_KEYS:
            if isinstance(out.get(key), str):
                out[key] = self.call_id(block[key])
        return out

    def message(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in rec.items():
            if key == "turnId":
                continue
            if key == "id":
                out["id"] = self.message_id(str(value))
            elif key == "blocks" and isinstance(value, list):
                out["blocks"] = [self.block(b) for b in value]
            elif key == "meta" and isinstance(value, Mapping):
                meta = {k: self.value(v) for k, v in value.items() if k not in DROPPED_META}
                for mk in META_CALL_KEYS:
                    if isinstance(value.get(mk), str):
                        meta[mk] = self.call_id(value[mk])
                if meta:
                    out["meta"] = meta
            else:
                out[key] = self.value(value)
        return out

    def compaction(self, rec: Mapping[str, Any], included: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in rec.items():
            if key == "id":
                out["id"] = derived_id(self.child_id, "k-compaction", str(value))
            elif key == "throughMessageId":
                out[key] = self.message_id(str(value))
            elif key == "firstKeptMessageId":
                if isinstance(value, str) and value in included:
                    out[key] = self.message_id(value)
            elif key == "retainedTail" and isinstance(value, list):
                out[key] = [self.message(m) if isinstance(m, Mapping) and isinstance(m.get("id"), str)
                            else self.value(m) for m in value]
            elif key == "details" and isinstance(value, Mapping):
                details = self.value(dict(value))
                reasoning = details.get("retainedReasoning")
                if isinstance(reasoning, list):
                    details["retainedReasoning"] = [
                        {**e, "id": self.message_id(e["id"])} if isinstance(e, dict) and isinstance(e.get("id"), str)
                        else e for e in reasoning
                    ]
                out[key] = details
            else:
                out[key] = self.value(value)
        return out


@dataclass(frozen=True)
class ForkPlan:
    child_id: str
    plan: RewritePlan
    """The child's body lines (messages, kept checkpoints, tombstones, session_info) with spans."""
    id_map: dict[str, str]
    pasted_refs: frozenset[str]
    """Names after ``scratch/<source>/pasted/`` the copied records mention (candidates to copy)."""
    dropped_compactions: list[str]


def plan_fork(
    source_id: str,
    child_id: str,
    messages: Sequence[Mapping[str, Any]],
    compactions: Sequence[Mapping[str, Any]],
    tombstones: Mapping[str, Mapping[str, Any]],
    session_info: Mapping[str, Any],
    *,
    through_message_id: str | None = None,
    now_ms: int,
    roots: Mapping[str, Root | None] | None = None,
    root: Root | None = None,
) -> ForkPlan:
    """Lay out the child's transcript body. Raises MESSAGE_NOT_FOUND for an unknown boundary.

    ``roots``/``root`` (``LiveTranscript.roots``/``root``): the project root each source line stands under
    and the session's; the child's copy of a line stands under the same (``plan_rewrite``)."""
    ids = [str(m["id"]) for m in messages]
    if through_message_id is not None:
        through_message_id = index.find_line_id(source_id, through_message_id, ids) or through_message_id
        if through_message_id not in ids:
            raise MessageNotFound(
                f"message {through_message_id} is not in session {source_id}; nothing was forked",
                data={"sessionId": source_id, "messageId": through_message_id},
            )
        prefix = list(messages[: ids.index(through_message_id) + 1])
    else:
        prefix = list(messages)
    included = {str(m["id"]) for m in prefix}
    remap = Remapper(source_id, child_id)
    new_msgs = [remap.message(m) for m in prefix]
    id_map = {str(old["id"]): str(new["id"]) for old, new in zip(prefix, new_msgs, strict=True)}
    hidden = {cid for cid, tomb in tombstones.items() if tomb.get("deleted", True) is True}
    # a checkpoint a tombstone hides (on a branch an import left) is not the child's
    kept, dropped = split_valid([c for c in compactions if c.get("id") not in hidden], included)
    # written bounded as every read serves it (a stored tail over its mode's bound, a legacy tail): one rule
    new_comps = [remap.compaction(normalize_on_read(c), included) for c in kept]
    tombs: dict[str, dict[str, Any]] = {}
    for old_id, tomb in tombstones.items():
        if old_id in included and tomb.get("deleted", True) is True:
            new_mid = id_map[old_id]
            tombs[new_mid] = tombstone_record(derived_id(child_id, "tombstone", old_id), new_mid, True,
                                              created_at_ms=now_ms)
    child_roots = None if roots is None else {id_map[mid]: r for mid, r in roots.items() if mid in id_map}
    plan = plan_rewrite(new_msgs, new_comps, tombstones=tombs, session_info=dict(session_info), roots=child_roots,
                        root=root)
    return ForkPlan(child_id, plan, id_map, frozenset(remap.pasted_refs), [str(c.get("id")) for c in dropped])


# --------------------------------------------------------------------------- file steps


def write_child_transcript(
    path: str | os.PathLike[str],
    child_id: str,
    created_at_ms: int,
    plan: RewritePlan,
    *,
    receipt: Mapping[str, Any] | None = None,
    faults: Faults = NO_FAULTS,
) -> Rewritten:
    """Temp + fsync + link + dir fsync (fault points ``fork.*``); never replaces an existing file.

    ``receipt``: the fork request's receipt record, carried in the child's header.
    """
    target = os.fspath(path)
    if os.path.lexists(target):
        raise Conflict(f"transcript for fork child {child_id} already exists", data={"sessionId": child_id})
    line, header = header_line(child_id, created_at_ms, receipt=receipt)
    try:
        atomic_write(target, b"".join([line, *plan.body]), faults=faults, point_prefix="fork", exclusive=True)
    except Conflict:
        raise Conflict(f"transcript for fork child {child_id} already exists", data={"sessionId": child_id}) from None
    return rewritten(plan, header.epoch, header.length)


def _candidates(ref: str) -> list[str]:
    """Possible file names in a reference, longest first (a name may contain spaces; prose may follow)."""
    out: list[str] = []
    for i in range(len(ref), 0, -1):
        if i == len(ref) or ref[i] == " ":
            piece = ref[:i]
            out.append(piece)
            stripped = piece.rstrip(_TRAILING)
            if stripped and stripped != piece:
                out.append(stripped)
    return out


def _safe_relative(name: str) -> bool:
    if not name or name.startswith(("/", "\\")) or "\x00" in name:
        return False
    parts = re.split(r"[/\\]", name)
    return all(p not in ("", ".", "..") for p in parts)


def resolve_pasted(source_dir: str | os.PathLike[str], refs: Sequence[str] | frozenset[str]) -> list[str]:
    """Referenced names that exist as regular files (no symlinks) under ``source_dir``."""
    base = os.fspath(source_dir)
    found: set[str] = set()
    for ref in refs:
        for cand in _candidates(ref):
            rel = cand.replace("\\", "/")
            if not _safe_relative(rel):
                continue
            full = os.path.join(base, rel)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and not _has_symlink_dir(base, rel):
                found.add(rel)
                break
    return sorted(found)


def _has_symlink_dir(base: str, rel: str) -> bool:
    parts = rel.split("/")[:-1]
    cur = base
    for p in parts:
        cur = os.path.join(cur, p)
        if os.path.islink(cur):
            return True
    return False


def _mkdirs(root: str, rel_dir: str, created: list[str]) -> None:
    cur = root
    for p in [x for x in rel_dir.split("/") if x]:
        cur = os.path.join(cur, p)
        if not os.path.isdir(cur):
            os.mkdir(cur, 0o700)
            created.append(cur)


def copy_pasted(
    source_dir: str | os.PathLike[str],
    child_dir: str | os.PathLike[str],
    names: Sequence[str],
    *,
    faults: Faults = NO_FAULTS,
) -> list[str]:
    """Copy ``names`` (relative, validated) from ``source_dir`` to ``child_dir`` durably. Returns them."""
    if not names:
        return []
    src, dst = os.fspath(source_dir), os.fspath(child_dir)
    dirs: list[str] = []
    try:
        scratch_child = os.path.dirname(dst)
        if not os.path.isdir(scratch_child):
            os.makedirs(scratch_child, 0o700)
            dirs.append(scratch_child)
        if not os.path.isdir(dst):
            os.mkdir(dst, 0o700)
            dirs.append(dst)
        for rel in names:
            _mkdirs(dst, os.path.dirname(rel), dirs)
            _copy_file(os.path.join(src, rel), os.path.join(dst, rel))
            faults.point("fork.after_copy")
        for d in {os.path.dirname(os.path.join(dst, rel)) for rel in names} | set(dirs):
            fsync_dir(d)
        fsync_dir(os.path.dirname(scratch_child))
    except OSError as exc:
        raise classify_os_error(exc, f"copy pasted inputs to {dst}") from exc
    return list(names)


def _copy_file(src: str, dst: str) -> None:
    sfd = open_nofollow(src, os.O_RDONLY)
    try:
        dfd = open_nofollow(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(dfd, 0o600)
            while True:
                chunk = os.read(sfd, 1 << 20)
                if not chunk:
                    break
                write_all(dfd, chunk)
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def remove_child_files(transcript: str | os.PathLike[str], scratch_dir: str | os.PathLike[str]) -> None:
    """Undo a failed fork's files: the child transcript (and any temp left by it) and its scratch copies."""
    target = os.fspath(transcript)
    directory = os.path.dirname(os.path.abspath(target))
    name = os.path.basename(target)
    try:
        remove_file_durable(target)
    except StoreError:
        pass  # the fork's own error is the one to report; boot's sweep finishes the job
    try:
        leftovers = [e for e in os.listdir(directory) if e.startswith(name + ".tmp.")]
    except OSError:
        leftovers = []
    for entry in leftovers:
        try:
            os.unlink(os.path.join(directory, entry))
        except OSError:
            pass
    shutil.rmtree(os.fspath(scratch_dir), ignore_errors=True)
    try:
        fsync_dir(os.path.dirname(os.fspath(scratch_dir)))
    except (OSError, StoreError):
        pass


__all__ = [
    "ForkPlan",
    "Remapper",
    "child_answer",
    "copy_pasted",
    "derived_id",
    "plan_fork",
    "remove_child_files",
    "resolve_pasted",
    "write_child_transcript",
]


def index_child(conn: sqlite3.Connection, child: str, written: Rewritten, *, now_ms: int, title: str,
                settings: dict[str, Any], project_id: int | None) -> None:
    """The child session's row and its index rows, in the caller's transaction (``session.fork``,
    ``session.assistantEdit``): the parent's settings that are set, and the exact ``project_id`` (not a
    lookup by path, which would touch the project row)."""
    _insert_child_row(conn, child, now_ms=now_ms, title=title, settings=settings, project_id=project_id,
                      file_epoch=written.epoch)
    reindex(conn, child, written, now_ms=now_ms)


def child_answer(conn: sqlite3.Connection, child: str, plan: RewritePlan, *, now_ms: int, title: str,
                 settings: dict[str, Any], project_id: int | None) -> dict[str, Any]:
    """The summary ``session.fork``'s commit (:func:`index_child`) will answer for the child ``plan`` makes:
    its row, with the count of messages the reindex gives it, read and rolled back
    (:func:`store.indexing.index.dry_run`; the message rows themselves are not indexed twice)."""

    def insert(c: sqlite3.Connection) -> dict[str, Any]:
        _insert_child_row(c, child, now_ms=now_ms, title=title, settings=settings, project_id=project_id,
                          file_epoch=None)
        c.execute("UPDATE sessions SET last_seq = ? WHERE id = ?", (len(plan.messages), child))
        return index.public_session(index.require_session(c, child))

    return index.dry_run(conn, insert)


def _insert_child_row(conn: sqlite3.Connection, child: str, *, now_ms: int, title: str, settings: dict[str, Any],
                      project_id: int | None, file_epoch: str | None) -> None:
    index.insert_session(conn, child, now_ms=now_ms, created_at_ms=now_ms, title=title,
                         settings={k: v for k, v in settings.items() if v is not None}, file_epoch=file_epoch)
    index.set_project_id(conn, child, project_id)
