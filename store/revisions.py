"""Regenerate history: the append-only ``<id>.revisions.jsonl`` file and its index rows.

File format (seed 003 §2.1, §4.9, D105/D109/D307, ADR 0060), one JSON object per line::

    {"type":"revision","rootUserId":"u1","revisionIndex":1,"createdAt":"…",
     "messages":[…message records…],"turns":{"<messageId>":"<turnId>"}}
    {"type":"revision_live","rootUserId":"u2","revisionIndex":2,"createdAt":"…","messageCount":2}

* A *branch* is the transcript suffix rooted at a user turn. ``revision`` stores
  a branch that has left (or is about to leave) the transcript; ``revision_live``
  names the branch that is the live suffix right now, in constant size.
* The last record for ``(rootUserId, revisionIndex)`` wins (a refresh is one
  more line). The file is never rewritten; switching only flips ``is_active``
  in the index.
* ``artifact`` lines (:data:`ARTIFACT`) keep artifact rows (seed 003 §4.10) whose Write/Edit line a
  rewrite took out of every file (a cut, a replace), or that an import's export carried: a rebuilt index
  restores them (the newest per path wins, as a line's row does).
* A legacy file holds only ``revision`` lines and reads back message for
  message. Unknown line kinds and a torn trailing line are skipped; a line
  over ``MAX_LINE_BYTES`` (64 MiB) is a bad line, as in a transcript, and the
  reader never holds it whole.
* The file is the source of truth for the index rows: a row's ``created_at`` is
  the ``createdAt`` of the key's first line, its ``message_count`` the newest
  line's (a ``revision``'s messages; a ``revision_live``'s ``messageCount``, the
  live suffix when it was saved — a line written before that key existed counts
  the live suffix at rebuild), so a rebuilt index reads back what was stored.

The family key of a live user message is ``meta.revisionRootId`` when present,
else its id. Its pager stamp (``revisionCount``, ``activeRevision``,
``revisionRootId``) is presentation metadata on the root's own line.

The SQL half keeps ``message_revisions`` (one row per branch) in line with the
file and with the live root stamps. Synchronous; no trio.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from store.errors import CorruptData, IOFailure, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import open_nofollow, owner_only_fd, published_fsync_dir, write_all
from store.ids import remapped_message_id
from store.indexing.sql_lists import in_chunks
from store.jsonio import dumps_line, loads_line
from store.transcripts.records import Root, meta_of, ms_to_rfc3339, rfc3339_to_ms, root_named
from store.transcripts.transcript import MAX_LINE_BYTES, bounded_lines, read_spans

REVISION = "revision"
REVISION_LIVE = "revision_live"
ARTIFACT = "artifact"
"""A line ``{"type": "artifact", "path", "op", "turnId", "updatedAt"}``: one artifact row as the index held it
(``artifacts.list``'s item without its ``sessionId``; ``updatedAt`` in Unix ms), which no line of the transcript
or of an archived branch gives back any more (``store.artifacts.rows_to_carry``)."""
PAGER_KEYS = ("revisionCount", "activeRevision", "revisionRootId")
"""The pager stamp of a family's root line (seed 003 §4.9): presentation metadata the host writes."""

Key = tuple[str, int]


# --------------------------------------------------------------------------- lines


def revision_line(
    root_user_id: str,
    revision_index: int,
    messages: Sequence[Mapping[str, Any]],
    turns: Mapping[str, str],
    *,
    created_at_ms: int,
    extra: Mapping[str, Any] | None = None,
    roots: Mapping[str, Root | None] | None = None,
) -> bytes:
    """A full branch payload (the branch is leaving, or has left, the transcript). ``extra`` keys ride
    after the standard ones (``compactions``: the branch's checkpoints, which a restore writes again;
    ``deleted``: the ids of its messages the user had deleted; an import's ``importedFrom`` /
    ``sourceLeaf``; readers skip keys they do not know). ``roots``: the project root each message's line stood
    under in the transcript (``records.Root``), kept as ``roots`` (:func:`roots_field`) when any is known."""
    ids = {m.get("id") for m in messages}
    rec: dict[str, Any] = {
        "type": REVISION,
        "rootUserId": root_user_id,
        "revisionIndex": revision_index,
        "createdAt": ms_to_rfc3339(created_at_ms),
        "messages": [dict(m) for m in messages],
        "turns": {k: v for k, v in turns.items() if k in ids},
    }
    changes = roots_field(messages, roots or {})
    if changes:
        rec[ROOTS] = changes
    rec.update(extra or {})
    return dumps_line(rec)


ROOTS = "roots"
"""A ``revision`` line's ``[[messageId, projectPath | null], ...]``: from that message of its branch on, the
lines stood under that project root in the transcript (``records.Root``), until the next entry; messages before
the first entry had none named. A switch writes the branch back under them (a rewrite writes a root line
before a message whose root is not the one in effect), so its Write/Edit lines resolve against the folder
they were written in, not the session's now. A line without it (written before it was kept) comes back under
the session's root, as before."""


def roots_field(messages: Sequence[Mapping[str, Any]], roots: Mapping[str, Root | None]) -> list[list[Any]]:
    """``roots`` (message id → root) of ``messages`` as a revision line keeps them (:data:`ROOTS`): one entry
    where the root changes, in the branch's order."""
    out: list[list[Any]] = []
    in_effect: Root | None = None
    for m in messages:
        root = roots.get(str(m.get("id")))
        if root is not None and root != in_effect:
            out.append([m.get("id"), root.path])
            in_effect = root
    return out


def roots_of(rec: Mapping[str, Any]) -> dict[str, Root]:
    """Message id → root of a ``revision`` record's branch (:data:`ROOTS`; an entry naming no message of
    the branch, or no path, is skipped)."""
    raw = rec.get(ROOTS)
    messages = rec.get("messages")
    if not isinstance(raw, list) or not isinstance(messages, list):
        return {}
    at: dict[str, Root] = {}
    for item in raw:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and (
                item[1] is None or isinstance(item[1], str)):
            root = root_named({"projectPath": item[1]})
            if root is not None:
                at[item[0]] = root
    out: dict[str, Root] = {}
    current: Root | None = None
    for m in messages:
        mid = m.get("id") if isinstance(m, Mapping) else None
        if not isinstance(mid, str):
            continue
        current = at.get(mid, current)
        if current is not None:
            out[mid] = current
    return out


def revision_live_line(root_user_id: str, revision_index: int, *, created_at_ms: int,
                       message_count: int | None = None, receipt: Mapping[str, Any] | None = None,
                       extra: Mapping[str, Any] | None = None) -> bytes:
    """A constant-size reference to the branch that is the live transcript suffix. ``message_count``:
    the suffix's length when it was saved, which the index row stores (a rebuilt row reads it back).
    ``receipt``: a keyed ``session.saveActiveRevision``'s receipt record, with the answer it gives
    (``RevisionFile.line_receipts``: a rebuilt index restores it). ``extra`` keys ride after the standard ones
    (an import's ``importedFrom``; readers skip keys they do not know)."""
    rec: dict[str, Any] = {
        "type": REVISION_LIVE,
        "rootUserId": root_user_id,
        "revisionIndex": revision_index,
        "createdAt": ms_to_rfc3339(created_at_ms),
    }
    if message_count is not None:
        rec["messageCount"] = message_count
    if receipt is not None:
        rec["receipt"] = dict(receipt)
    rec.update(extra or {})
    return dumps_line(rec)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class RevisionEntry:
    root_user_id: str
    revision_index: int
    live: bool
    created_at: str
    messages: tuple[dict[str, Any], ...] = ()
    """Empty for a ``revision_live`` reference (resolve it with :func:`resolve`)."""
    turns: Mapping[str, str] = field(default_factory=dict)
    compactions: tuple[dict[str, Any], ...] = ()
    """The branch's context checkpoints (``compactions``: those anchored in it when it left the transcript),
    which a restore writes again."""
    deleted: frozenset[str] = frozenset()
    """Its messages the user had deleted (tombstoned) when it left the transcript (``deleted``): a
    restore writes their tombstones again, so a deleted message never comes back with its branch."""
    message_count: int | None = None
    """A ``revision_live`` reference's ``messageCount`` (None: a line written before it was kept)."""
    roots: Mapping[str, Root] = field(default_factory=dict)
    """Message id → the project root its line stood under in the transcript (:data:`ROOTS`; a message
    without one: none was known)."""

    @property
    def key(self) -> Key:
        return (self.root_user_id, self.revision_index)


@dataclass(frozen=True)
class ArchivedLine:
    """A message line an archived branch holds (``RevisionFile.tool_lines``)."""

    record: dict[str, Any]
    root: Root | None
    """The project root its line stood under in the transcript (:data:`ROOTS`; None: none was recorded)."""
    turn_id: str | None
    """Its owning turn as the branch recorded it (``turns``), else the line's own ``turnId``."""


@dataclass
class RevisionFile:
    entries: dict[Key, RevisionEntry] = field(default_factory=dict)
    """Last record per (rootUserId, revisionIndex)."""
    first_seen_ms: dict[Key, int] = field(default_factory=dict)
    bad_lines: int = 0
    unknown_lines: int = 0
    torn_tail: bool = False
    records: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """The last record per key as the file holds it (only from ``parse_revisions(..., records=True)``)."""
    line_receipts: list[dict[str, Any]] = field(default_factory=list)
    """The receipt records the ``revision_live`` lines carry, oldest first (every line's: a later line of
    the key, a refresh or a regenerate's archive, leaves them standing)."""
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Path → the newest of its :data:`ARTIFACT` lines (by ``updatedAt``; of one time, the later line), as the
    line holds it (the fields are checked where a row is restored: ``store.artifacts.restore_carried``)."""
    tool_lines: list[ArchivedLine] = field(default_factory=list)
    """Every message with a ``tool_call`` block that any full ``revision`` line holds, in file order (not only
    the newest line of its key: an older line of a key keeps the lines a later refresh no longer has), each
    with the root and turn its branch recorded (only from ``read_revisions(..., tool_lines=True)``): the
    Write/Edit results whose artifacts a rebuilt index lists as the live index did (seed 003 §4.10)."""

    def family(self, root_user_id: str) -> list[RevisionEntry]:
        return sorted((e for e in self.entries.values() if e.root_user_id == root_user_id),
                      key=lambda e: e.revision_index)

    def get(self, root_user_id: str, revision_index: int) -> RevisionEntry | None:
        return self.entries.get((root_user_id, revision_index))

    def live_refs(self) -> set[Key]:
        return {k for k, e in self.entries.items() if e.live}

    def stored_digests(self) -> dict[Key, str]:
        """:func:`payload_digest` of every key whose newest record is a full ``revision`` line."""
        return {k: payload_digest(e) for k, e in self.entries.items() if not e.live}


def payload_digest(entry: RevisionEntry) -> str:
    """What a full ``revision`` line stores of its branch, not when (``createdAt``): its messages, turns,
    checkpoints and deleted ids. Two lines of one key with one digest store the same variant twice."""
    body: dict[str, Any] = {"messages": list(entry.messages), "turns": dict(entry.turns),
                            "compactions": list(entry.compactions), "deleted": sorted(entry.deleted)}
    if entry.roots:  # (a line without them digests as it did)
        body[ROOTS] = sorted((mid, root.path or "") for mid, root in entry.roots.items())
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def entry_of_line(line: bytes) -> RevisionEntry | None:
    """The record a revisions line holds, as a reader takes it (None: not a revision record)."""
    try:
        return _entry(loads_line(line))
    except ValueError:
        return None


def _entry(rec: Mapping[str, Any]) -> RevisionEntry | None:
    kind = rec.get("type")
    root = rec.get("rootUserId")
    idx = rec.get("revisionIndex")
    if kind not in (REVISION, REVISION_LIVE) or not isinstance(root, str) or not root:
        return None
    if not isinstance(idx, int) or isinstance(idx, bool) or idx < 1:
        return None
    raw_created = rec.get("createdAt")
    created = raw_created if isinstance(raw_created, str) else ""
    if kind == REVISION_LIVE:
        count = rec.get("messageCount")
        kept_count = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
        return RevisionEntry(root, idx, True, created, message_count=kept_count)
    msgs = rec.get("messages")
    if not isinstance(msgs, list):
        return None
    kept = tuple(m for m in msgs if isinstance(m, dict) and isinstance(m.get("id"), str))
    turns = rec.get("turns")
    turn_map = {k: v for k, v in turns.items() if isinstance(v, str)} if isinstance(turns, dict) else {}
    comps = rec.get("compactions")
    checkpoints = tuple(c for c in comps if isinstance(c, dict) and c.get("type") == "compaction"
                        and isinstance(c.get("id"), str)) if isinstance(comps, list) else ()
    raw_deleted = rec.get("deleted")
    deleted = frozenset(d for d in raw_deleted if isinstance(d, str)) if isinstance(raw_deleted, list) else frozenset()
    return RevisionEntry(root, idx, False, created, kept, turn_map, checkpoints, deleted, roots=roots_of(rec))


def parse_revisions(data: bytes, *, records: bool = False, tool_lines: bool = False) -> RevisionFile:
    """``records``: also keep each key's newest record as the file spells it (``RevisionFile.records``).
    The file itself is read with :func:`read_revisions`, which never holds an over-long line whole."""
    out = RevisionFile()
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            out.torn_tail = pos < len(data)
            return out
        _take_line(out, data[pos:nl], records, tool_lines)
        pos = nl + 1


def _take_line(out: RevisionFile, line: bytes, records: bool, tool_lines: bool = False) -> None:
    """One line (its newline left off) into ``out``. A line over ``MAX_LINE_BYTES`` is unreadable damage,
    as in a transcript: a bad line, never parsed."""
    if len(line) > MAX_LINE_BYTES:
        out.bad_lines += 1
        return
    if not line.strip(b"\x00 \t\r"):
        return
    try:
        rec = loads_line(line)
    except ValueError:
        out.bad_lines += 1
        return
    if rec.get("type") == ARTIFACT:
        _take_artifact(out, rec)
        return
    if rec.get("type") not in (REVISION, REVISION_LIVE):
        out.unknown_lines += 1
        return
    entry = _entry(rec)
    if entry is None:
        out.bad_lines += 1
        return
    out.entries[entry.key] = entry
    carried = rec.get("receipt")
    if entry.live and isinstance(carried, dict):
        out.line_receipts.append(carried)
    out.first_seen_ms.setdefault(entry.key, rfc3339_to_ms(entry.created_at, 0))
    if records:
        out.records[entry.key] = rec
    if tool_lines and not entry.live:
        out.tool_lines += [ArchivedLine(m, entry.roots.get(m["id"]), _turn_of(entry, m)) for m in entry.messages
                           if _has_tool_call(m)]


def _take_artifact(out: RevisionFile, rec: dict[str, Any]) -> None:
    path, at = rec.get("path"), rec.get("updatedAt")
    if not isinstance(path, str) or not isinstance(at, int) or isinstance(at, bool):
        out.bad_lines += 1
        return
    held = out.artifacts.get(path)
    if held is None or at >= held["updatedAt"]:
        out.artifacts[path] = rec


def artifact_line(row: Mapping[str, Any]) -> bytes:
    """The :data:`ARTIFACT` line of one artifact row (``{"path", "op", "turnId", "updatedAt"}``)."""
    return dumps_line({"type": ARTIFACT, "path": row["path"], "op": row["op"], "turnId": row.get("turnId"),
                       "updatedAt": row["updatedAt"]})


def _has_tool_call(record: Mapping[str, Any]) -> bool:
    blocks = record.get("blocks")
    return isinstance(blocks, list) and any(isinstance(b, Mapping) and b.get("type") == "tool_call" for b in blocks)


def _turn_of(entry: RevisionEntry, record: Mapping[str, Any]) -> str | None:
    turn = entry.turns.get(record["id"]) or record.get("turnId")
    return turn if isinstance(turn, str) else None


CARRIED_LINE_RECEIPTS = 64
"""At most this many receipts of archived deletes ride on one branch's line, the newest kept."""


@dataclass(frozen=True)
class ArchivedDeletion:
    """What :func:`archived_deletion_lines` found: whether some full branch holds the message, the lines
    to append, and the receipt of the asking request's key one of those branches already carries (the
    request ran before: nothing to write, its answer is what the line records)."""

    found: bool
    lines: list[bytes]
    carried: dict[str, Any] | None = None


def archived_deletion_lines(path: str | os.PathLike[str], line_ids: Iterable[str], deleted: bool, *,
                            created_at_ms: int, receipt: Mapping[str, Any] | None = None) -> ArchivedDeletion:
    """Delete or restore a message that only an archived branch holds (seed 000 §3.3: any node can be
    tombstoned, whichever leaf is current). ``path``: the revisions file; ``line_ids``: the ids the
    message's line may carry; ``receipt``: the request's receipt record (``receipts.file_record``).
    Finds whether some branch stored in full (its newest line a ``revision``) holds the message, and
    makes one refreshed ``revision`` line per such branch whose ``deleted`` ids change: the newest
    line again, every other key kept (a refresh is one more line; the file is never rewritten),
    ``createdAt`` now, the receipt added to the line's ``receipts`` (the receipt rides with its
    effect). A branch already carrying the receipt's key is the request's own earlier effect."""
    rf = _read_file(path, records=True)
    wanted = set(line_ids)
    key = (receipt.get("clientId"), receipt.get("submissionId")) if receipt is not None else None
    found = False
    out: list[bytes] = []
    for branch, rec in rf.records.items():
        held = {m["id"] for m in rf.entries[branch].messages} & wanted  # a live reference holds none
        if not held:
            continue
        found = True
        raw_receipts = rec.get("receipts")
        carried = [r for r in raw_receipts if isinstance(r, dict)] if isinstance(raw_receipts, list) else []
        for earlier in carried:
            if key is not None and (earlier.get("clientId"), earlier.get("submissionId")) == key:
                return ArchivedDeletion(True, [], dict(earlier))
        raw = rec.get("deleted")
        before = {d for d in raw if isinstance(d, str)} if isinstance(raw, list) else set()
        after = before | held if deleted else before - held
        if after == before:
            continue
        refreshed = {k: v for k, v in rec.items() if k != "deleted"}
        refreshed["createdAt"] = ms_to_rfc3339(created_at_ms)
        if after:
            refreshed["deleted"] = sorted(after)
        if receipt is not None:
            refreshed["receipts"] = [*carried, dict(receipt)][-CARRIED_LINE_RECEIPTS:]
        out.append(dumps_line(refreshed))
    return ArchivedDeletion(found, out)


def read_revisions(path: str | os.PathLike[str], *, records: bool = False, tool_lines: bool = False) -> RevisionFile:
    """Read the whole file; a missing file is an empty history. ``records``: also keep each key's newest
    record as the file spells it (``RevisionFile.records``); ``tool_lines``: every archived line with a tool
    call (``RevisionFile.tool_lines``)."""
    return _read_file(path, records=records, tool_lines=tool_lines)


_READ_CHUNK = 1 << 20


def _read_file(path: str | os.PathLike[str], *, records: bool = False, tool_lines: bool = False) -> RevisionFile:
    """The file line by line in bounded chunks (``bounded_lines``, as the boot scan reads a transcript): a
    line over ``MAX_LINE_BYTES`` is counted bad without being held whole, so a runaway line costs no more
    memory than the limit. A missing file is an empty history."""
    out = RevisionFile()
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return out
    except OSError as exc:
        raise classify_os_error(exc, f"read revisions {os.fspath(path)}") from exc
    try:
        for _, _, line, _ in bounded_lines(fd, 0, os.fstat(fd).st_size, limit=MAX_LINE_BYTES, chunk=_READ_CHUNK):
            if line is None:
                out.torn_tail = True
            elif not line:
                out.bad_lines += 1  # over the limit
            else:
                _take_line(out, line[:-1], records, tool_lines)
    except OSError as exc:
        raise classify_os_error(exc, f"read revisions {os.fspath(path)}") from exc
    finally:
        os.close(fd)
    return out


# --------------------------------------------------------------------------- appending


def append_revision_lines(
    path: str | os.PathLike[str], lines: Sequence[bytes], *, faults: Faults = NO_FAULTS
) -> int:
    """Append complete lines durably (create + dir fsync on first use). Returns the new length.

    A torn trailing line left by a crash is cut back to the last newline first,
    so a new line never lands glued to garbage. On a write error the file is
    truncated back to its previous length; a failed fsync is reported, never
    retried.
    """
    target = os.fspath(path)
    data = b"".join(lines)
    if not data:
        return os.stat(target).st_size if os.path.exists(target) else 0
    for line in lines:
        if not line.endswith(b"\n") or line.count(b"\n") != 1:
            raise ValueError("each revisions line must end with exactly one newline")
    created = False
    try:
        try:
            fd = open_nofollow(target, os.O_RDWR | os.O_APPEND)
        except FileNotFoundError:
            fd = open_nofollow(target, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
            os.fchmod(fd, 0o600)
            created = True
    except OSError as exc:
        raise classify_os_error(exc, f"open revisions {target}") from exc
    try:
        if not created:
            owner_only_fd(fd, target)  # an earlier app's file may be 0644: the host's files are 0600
        size = os.fstat(fd).st_size
        pre = _repair_tail(fd, size)
        try:
            write_all(fd, data)
            faults.point("revisions.after_write")
        except OSError as exc:
            try:
                os.ftruncate(fd, pre)
            except OSError:
                pass
            raise classify_os_error(exc, f"append to {target}") from exc
        try:
            os.fdatasync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, pre)
            except OSError:
                pass
            raise IOFailure(f"fsync of {target} failed ({exc.strerror or exc}); the revision is not durable",
                            data={"path": target, "errno": exc.errno}) from exc
        if created:
            published_fsync_dir(os.path.dirname(os.path.abspath(target)), target)
        return pre + len(data)
    except StoreError:
        raise
    except OSError as exc:
        raise classify_os_error(exc, f"append to {target}") from exc
    finally:
        os.close(fd)


def _repair_tail(fd: int, size: int) -> int:
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
    start = size
    while start > 0:
        take = min(65536, start)
        start -= take
        chunk = os.pread(fd, take, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            os.ftruncate(fd, keep)
            os.fsync(fd)
            return keep
    os.ftruncate(fd, 0)
    os.fsync(fd)
    return 0


# --------------------------------------------------------------------------- families and stamps


@dataclass(frozen=True)
class Stamp:
    count: int | None
    active: int | None
    root: str | None


def family_of(record: Mapping[str, Any]) -> str:
    root = meta_of(record).get("revisionRootId")
    return root if isinstance(root, str) and root else str(record["id"])


def family_root(stored: RevisionFile, named: str, spelled: str | None = None) -> str:
    """The family a user message joins when its ``meta.revisionRootId`` names ``named`` (a message no
    longer live): ``named`` itself when it roots a stored family or is nowhere in the file; else the
    family of the archived user message of that id. An edit of an edited message may name the message it
    revises; its family stays the original's, so every variant of the turn is one set (seed 003 §4.9:
    "meta.revisionRootId keeps pointing at the original family"). ``spelled``: the session's own spelling
    of ``named`` (``{sessionId}:{id}``, the id a message was stored under because another session held
    it), looked for after ``named`` itself: the client names the id it chose."""
    for candidate in (named,) if spelled is None else (named, spelled):
        if any(e.root_user_id == candidate for e in stored.entries.values()):
            return candidate
    for candidate in (named,) if spelled is None else (named, spelled):
        for entry in sorted(stored.entries.values(), key=lambda e: e.key):
            for message in entry.messages:
                if message.get("id") == candidate and message.get("role") == "user":
                    return family_of(message)
    return named


def stored_as(stored: RevisionFile, family: str, messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the family's newest stored variant that holds exactly ``messages`` (a full
    ``revision`` line, not a reference), or None. An archive whose revisions line became durable before
    the transcript rewrite that would have stamped it (a crash between the two) is found again by the
    retry, which refreshes that variant instead of minting an identical second one."""
    for entry in reversed(stored.family(family)):
        if not entry.live and len(entry.messages) == len(messages) and all(
                dict(a) == dict(b) for a, b in zip(entry.messages, messages, strict=True)):
            return entry.revision_index
    return None


def stamp_of(record: Mapping[str, Any]) -> Stamp:
    meta = meta_of(record)

    def num(key: str) -> int | None:
        v = meta.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    root = meta.get("revisionRootId")
    return Stamp(num("revisionCount"), num("activeRevision"), root if isinstance(root, str) else None)


def with_stamp(record: Mapping[str, Any], *, count: int, active: int, root: str) -> dict[str, Any]:
    """The root line with its pager meta set (every other key unchanged)."""
    meta = dict(meta_of(record))
    meta["revisionCount"] = count
    meta["activeRevision"] = active
    meta["revisionRootId"] = root
    out = dict(record)
    out["meta"] = meta
    return out


def find_root(messages: Sequence[Mapping[str, Any]], root_user_id: str) -> int | None:
    """Position of the live root of a family: a user message whose family key is ``root_user_id``."""
    fallback = None
    for i, rec in enumerate(messages):
        if rec.get("role") != "user":
            continue
        if family_of(rec) == root_user_id:
            return i
        if fallback is None and rec.get("id") == root_user_id:
            fallback = i
    return fallback


def names_live(root: Mapping[str, Any], revision_index: int) -> bool:
    """Whether a ``revision_live`` reference to variant ``revision_index`` names the live branch rooted at
    ``root`` (the family's live root, :func:`find_root`). A reference carries no ids or digest, only its key:
    it is that branch only while the root's pager stamp names its index (``activeRevision``, set by the save
    that wrote it and by every switch). A reference another variant's stamp has replaced (a revisions file
    restored from a backup) names a branch the file no longer holds: it resolves to nothing."""
    return stamp_of(root).active == revision_index


ROOT_MISSING = "root_missing"
STALE_REFERENCE = "stale_reference"


def branch_unavailable(root: Mapping[str, Any] | None, reference: bool, revision_index: int) -> str | None:
    """Why ``activateRevision`` cannot switch to a branch now (None: it can), as ``listRevisions`` and the tree
    say it: ``root`` is its family's live root (:func:`find_root`; None: no live user message roots the
    family, ``ROOT_MISSING``), ``reference`` whether the key's newest line is a ``revision_live`` one (a
    reference the root's stamp does not name is ``STALE_REFERENCE``: :func:`names_live`)."""
    if root is None:
        return ROOT_MISSING
    if reference and not names_live(root, revision_index):
        return STALE_REFERENCE
    return None


def root_before(messages: Sequence[Mapping[str, Any]], pos: int) -> int | None:
    """The nearest user message at or before ``pos`` (the root of the branch holding it)."""
    for i in range(min(pos, len(messages) - 1), -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def live_stamps(messages: Iterable[Mapping[str, Any]]) -> dict[str, int | None]:
    """family → the active variant its live root is stamped with (None: unsaved/unstamped)."""
    out: dict[str, int | None] = {}
    for rec in messages:
        if rec.get("role") != "user":
            continue
        fam = family_of(rec)
        if fam not in out:  # the first root of a family is its live root (find_root)
            out[fam] = stamp_of(rec).active
    return out


def hidden_by_import(session_id: str, tombstones: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Messages whose newest tombstone is an import's off-branch one (``<sid>:off-branch:…``): lines of
    another branch of a tree source (pi) that the import keeps in this store, not part of the branch
    they sit in. A branch archived from the transcript leaves them out, and a restore shows them again."""
    prefix = f"{session_id}:off-branch:"
    return {mid for mid, tomb in tombstones.items()
            if tomb.get("deleted", True) is not False and str(tomb.get("id") or "").startswith(prefix)}


@dataclass(frozen=True)
class Branch:
    root_user_id: str
    revision_index: int
    messages: list[dict[str, Any]]
    turns: dict[str, str]
    live: bool


def resolve(
    entry: RevisionEntry, live_messages: Sequence[Mapping[str, Any]], live_turns: Mapping[str, str]
) -> Branch | None:
    """The branch an entry names. A reference resolves to the live suffix when the live root's stamp names
    its variant (:func:`names_live`); None otherwise (its root is not live, or the reference is stale)."""
    if not entry.live:
        return Branch(entry.root_user_id, entry.revision_index, [dict(m) for m in entry.messages],
                      dict(entry.turns), False)
    pos = find_root(live_messages, entry.root_user_id)
    if pos is None or not names_live(live_messages[pos], entry.revision_index):
        return None
    msgs = [dict(m) for m in live_messages[pos:]]
    ids = {m["id"] for m in msgs}
    return Branch(entry.root_user_id, entry.revision_index, msgs,
                  {k: v for k, v in live_turns.items() if k in ids}, True)


@dataclass(frozen=True)
class Respelled:
    """A branch's data with the ids another session took respelled (:func:`respell`)."""

    messages: list[dict[str, Any]]
    turns: dict[str, str]
    compactions: list[dict[str, Any]]
    deleted: set[str]


def respell(session_id: str, taken: Iterable[str], messages: Sequence[Mapping[str, Any]],
            turns: Mapping[str, str], compactions: Sequence[Mapping[str, Any]], deleted: Iterable[str]) -> Respelled:
    """A restored branch whose message ids another session took since it left the transcript (the
    revisions file holds no id in the index): each such id becomes its D444 spelling ``{sessionId}:{id}``,
    the id an append of it would be stored under, and so does every reference the branch's data makes to
    it (its turns map, its deleted ids, its checkpoints' ``throughMessageId`` / ``firstKeptMessageId`` and
    ``retainedTail`` copies). ``meta.revisionRootId`` is a family key of this session's revisions file,
    not a message id any session holds, and stays as the file keys the family. The file itself is never
    changed: a restore respells again (an id spelled already is not taken, so no id is spelled twice)."""
    names = {mid: remapped_message_id(session_id, mid) for mid in taken}

    def name(mid: Any) -> Any:
        return names.get(mid, mid) if isinstance(mid, str) else mid

    def message(rec: Mapping[str, Any]) -> dict[str, Any]:
        return {**rec, "id": name(rec.get("id"))}

    def checkpoint(rec: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(rec)
        for key in ("throughMessageId", "firstKeptMessageId"):
            if key in out:
                out[key] = name(out[key])
        tail = out.get("retainedTail")
        if isinstance(tail, list):
            out["retainedTail"] = [message(m) if isinstance(m, Mapping) else m for m in tail]
        return out

    return Respelled([message(m) for m in messages], {name(k): v for k, v in turns.items()},
                     [checkpoint(c) for c in compactions], {name(d) for d in deleted})


# --------------------------------------------------------------------------- index rows (message_revisions)


def row_id(session_id: str, root_user_id: str, revision_index: int) -> str:
    return f"{session_id}/{root_user_id}/{revision_index}"


def revision_rows(conn: Any, session_id: str, root_user_id: str | None = None) -> list[dict[str, Any]]:
    sql = ("SELECT root_user_id, revision_index, is_active, message_count, created_at FROM message_revisions "
           "WHERE session_id = ?")
    args: list[Any] = [session_id]
    if root_user_id is not None:
        sql += " AND root_user_id = ?"
        args.append(root_user_id)
    sql += " ORDER BY root_user_id, revision_index"
    return [
        {"rootUserId": r[0], "revisionIndex": r[1], "isActive": bool(r[2]), "messageCount": r[3],
         "createdAt": r[4]}
        for r in conn.execute(sql, args)
    ]


def user_line_spans(conn: Any, session_id: str) -> list[tuple[int, int]] | None:
    """``(line_offset, line_len)`` of the session's live user messages in transcript order (where a family's
    live root is looked for, without reading the rest); None when a row has no span (read the transcript)."""
    spans = []
    for offset, length in conn.execute(
            "SELECT line_offset, line_len FROM messages WHERE session_id = ? AND role = 'user' ORDER BY seq",
            (session_id,)):
        if offset is None or length is None:
            return None
        spans.append((int(offset), int(length)))
    return spans


def note_root_aliases(aliases: dict[str, set[str]], records: Iterable[Mapping[str, Any]]) -> None:
    """Add to ``aliases`` (family key -> line ids) each user message of ``records`` whose family is not its own
    id (``meta.revisionRootId`` names another: an edit under a new id, a restored or imported root). With
    the family key itself (and its ``{sessionId}:{id}`` spelling) these are every id a family's live root
    can have (:func:`family_of`), which is what :func:`live_roots` looks up. Fed every line of a transcript
    (or a live view of it), ``aliases`` may keep ids that left it since: :func:`live_roots` checks each."""
    for rec in records:
        mid = rec.get("id")
        if rec.get("role") == "user" and isinstance(mid, str):
            family = family_of(rec)
            if family != mid:
                aliases.setdefault(family, set()).add(mid)


def live_roots(
    conn: Any, session_id: str, path: str | os.PathLike[str], families: Iterable[str],
    aliases: Mapping[str, Iterable[str]],
) -> dict[str, dict[str, Any] | None] | None:
    """Each family's live root, as :func:`find_root` finds it among the session's live user messages, read
    from the index and the lines of the few messages that can be it: the family key, its aliases
    (:func:`note_root_aliases`, a superset of the user messages that join the family under another id),
    each by either spelling of its row id. The cost is the families' and their aliases', not the
    session's. None when the index cannot tell (a row without a span, a span that does not hold its
    message's line: the index trails the file): read the transcript instead."""
    wanted = list(dict.fromkeys(families))
    line_ids = {mid for family in wanted for mid in (family, *aliases.get(family, ()))}
    row_ids = sorted({rid for mid in line_ids for rid in (mid, remapped_message_id(session_id, mid))})
    hits: list[tuple[int, str, int, int]] = []
    for marks, chunk in in_chunks(row_ids):
        for rid, seq, offset, length in conn.execute(
                f"SELECT id, seq, line_offset, line_len FROM messages WHERE session_id = ? AND id IN ({marks})",
                (session_id, *chunk)):
            if offset is None or length is None:
                return None
            hits.append((int(seq), str(rid), int(offset), int(length)))
    hits.sort()
    try:
        records = [loads_line(blob) for blob in read_spans(path, [(off, n) for _, _, off, n in hits])]
    except (CorruptData, ValueError):  # a span past the end or off a line
        return None
    users = []
    for (_, rid, _, _), rec in zip(hits, records, strict=True):
        mid = rec.get("id")
        if rec.get("type") != "message" or not isinstance(mid, str) or rid not in (
                mid, remapped_message_id(session_id, mid)):
            return None
        if rec.get("role") == "user":
            users.append(rec)
    out: dict[str, dict[str, Any] | None] = {}
    for family in wanted:
        pos = find_root(users, family)
        out[family] = None if pos is None else users[pos]
    return out


def family_key(conn: Any, session_id: str, root_user_id: str) -> str:
    """The family key ``root_user_id`` names among the session's rows: itself, or its ``{sessionId}:{id}``
    spelling when only that keys a family (the root was stored so because another session held the id, and
    the client names the id it chose)."""
    spelled = remapped_message_id(session_id, root_user_id)
    for candidate in (root_user_id, spelled):
        if conn.execute("SELECT 1 FROM message_revisions WHERE session_id = ? AND root_user_id = ? LIMIT 1",
                        (session_id, candidate)).fetchone() is not None:
            return candidate
    return root_user_id


def upsert_row(
    conn: Any, session_id: str, root_user_id: str, revision_index: int, *, message_count: int, now_ms: int,
    active: bool | None = None,
) -> None:
    """Insert a branch row or refresh its ``message_count``; ``active=True`` makes it the family's one."""
    conn.execute(
        "INSERT INTO message_revisions(id, session_id, root_user_id, revision_index, is_active, message_count, "
        "created_at) VALUES (?,?,?,?,0,?,?) ON CONFLICT(session_id, root_user_id, revision_index) "
        "DO UPDATE SET message_count = excluded.message_count",
        (row_id(session_id, root_user_id, revision_index), session_id, root_user_id, revision_index,
         message_count, now_ms),
    )
    if active is True:
        set_active(conn, session_id, root_user_id, revision_index)
    elif active is False:
        conn.execute(
            "UPDATE message_revisions SET is_active = 0 WHERE session_id = ? AND root_user_id = ? "
            "AND revision_index = ?", (session_id, root_user_id, revision_index))


def set_active(conn: Any, session_id: str, root_user_id: str, revision_index: int | None) -> None:
    """Exactly the named variant of the family is active (none when ``revision_index`` is None)."""
    conn.execute(
        "UPDATE message_revisions SET is_active = CASE WHEN revision_index = ? THEN 1 ELSE 0 END "
        "WHERE session_id = ? AND root_user_id = ?",
        (revision_index if revision_index is not None else -1, session_id, root_user_id),
    )


def sync_active(conn: Any, session_id: str, stamps: Mapping[str, int | None]) -> None:
    """``is_active`` follows the live transcript: a family's stamped variant if its root is live."""
    families = [r[0] for r in conn.execute(
        "SELECT DISTINCT root_user_id FROM message_revisions WHERE session_id = ?", (session_id,))]
    for fam in families:
        set_active(conn, session_id, fam, stamps.get(fam))


def rows_from_file(
    rf: RevisionFile, live_messages: Sequence[Mapping[str, Any]]
) -> list[tuple[str, int, int, int]]:
    """``(root, index, message_count, created_at_ms)`` for every branch the file names: what the rows
    stored when the lines were written (the count the newest line says, the first line's time)."""
    out = []
    for key, entry in sorted(rf.entries.items()):
        if entry.live and entry.message_count is not None:
            count = entry.message_count
        elif entry.live:  # an older reference without its count: the live suffix now, if it is that branch
            pos = find_root(live_messages, entry.root_user_id)
            count = 0 if pos is None or not names_live(live_messages[pos], entry.revision_index) else (
                len(live_messages) - pos)
        else:
            count = len(entry.messages)
        out.append((key[0], key[1], count, rf.first_seen_ms.get(key, 0)))
    return out


def restore_rows(
    conn: Any, session_id: str, rf: RevisionFile, live_messages: Sequence[Mapping[str, Any]], now_ms: int
) -> int:
    """Insert rows the index lost (a crash or a rebuilt database), give every row the count the file's
    newest line says (a crash after a branch was archived in full, before the rewrite's transaction, left
    the row with the count of the reference it replaced), and delete the rows of branches the file does not
    name (it was restored from a backup or edited while the host was stopped: a row without its line would
    list a branch no switch can restore); ``is_active`` and ``created_at`` are kept. Every writer appends a
    branch's line before it commits its row, so the file names every branch a row was made for. The
    number of rows inserted, changed or deleted."""
    changed = 0
    named = set(rf.entries)
    for root, idx in [(str(r[0]), int(r[1])) for r in conn.execute(
            "SELECT root_user_id, revision_index FROM message_revisions WHERE session_id = ?", (session_id,))]:
        if (root, idx) not in named:
            changed += conn.execute(
                "DELETE FROM message_revisions WHERE session_id = ? AND root_user_id = ? AND revision_index = ?",
                (session_id, root, idx)).rowcount
    for root, idx, count, created in rows_from_file(rf, live_messages):
        cur = conn.execute(
            "INSERT INTO message_revisions(id, session_id, root_user_id, revision_index, is_active, "
            "message_count, created_at) VALUES (?,?,?,?,0,?,?) "
            "ON CONFLICT(session_id, root_user_id, revision_index) DO UPDATE SET "
            "message_count = excluded.message_count WHERE message_count != excluded.message_count",
            (row_id(session_id, root, idx), session_id, root, idx, count, created or now_ms),
        )
        changed += cur.rowcount
    return changed


# --------------------------------------------------------------------------- the sync mark (issue 26)


SYNC_MARK_NS = "pi-host/revisions.synced"
"""``kv`` namespace of :class:`SyncMark` rows, keyed by session id (a ``/`` no client namespace may hold)."""

_TAIL_BYTES = 4096


@dataclass(frozen=True)
class SyncMark:
    """What a session's branch rows were last synced against in full (the rows the revisions file names,
    ``is_active`` from the live stamps, the receipts its lines carry): the transcript of ``epoch`` up to byte
    ``upto`` (``tail``: the digest of the bytes just before it, :func:`transcript_tail`), the revisions
    file as ``revisions`` fingerprints it (:func:`revisions_fingerprint`), and the root aliases of those
    transcript lines (:func:`note_root_aliases`). Written in the transaction of the sync that made it true;
    while the files are still what it says, a sync reads only the transcript's lines appended since."""

    epoch: str | None
    upto: int
    tail: str
    revisions: str
    aliases: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def to_json(self) -> str:
        return orjson.dumps({"epoch": self.epoch, "upto": self.upto, "tail": self.tail, "revisions": self.revisions,
                             "aliases": {k: sorted(v) for k, v in sorted(self.aliases.items())}}).decode()


def transcript_tail(path: str | os.PathLike[str], upto: int) -> str:
    """SHA-256 of the transcript's last bytes before ``upto`` (at most 4 KiB; "" past the end or no file):
    the lines a mark was taken after are still the ones there (a file put back from a backup of the same epoch
    ends elsewhere, or with other bytes)."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise classify_os_error(exc, f"read {os.fspath(path)}") from exc
    try:
        if os.fstat(fd).st_size < upto:
            return ""
        start = max(0, upto - _TAIL_BYTES)
        return hashlib.sha256(os.pread(fd, upto - start, start)).hexdigest()
    except OSError as exc:
        raise classify_os_error(exc, f"read {os.fspath(path)}") from exc
    finally:
        os.close(fd)


def revisions_fingerprint(path: str | os.PathLike[str], upto: int | None = None) -> str:
    """``<size>:<sha256>`` of the revisions file's bytes (``0:`` when there is none), or of its first ``upto``
    bytes ("" when it is shorter): any change to it, a host's append or a hand's edit, changes this."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return "0:" if not upto else ""
    except OSError as exc:
        raise classify_os_error(exc, f"read revisions {os.fspath(path)}") from exc
    digest = hashlib.sha256()
    size = 0
    try:
        end = os.fstat(fd).st_size if upto is None else upto
        while size < end and (chunk := os.pread(fd, min(_READ_CHUNK, end - size), size)):
            digest.update(chunk)
            size += len(chunk)
    except OSError as exc:
        raise classify_os_error(exc, f"read revisions {os.fspath(path)}") from exc
    finally:
        os.close(fd)
    if size < end:
        return ""
    return f"{size}:{digest.hexdigest()}" if size else "0:"


def read_sync_mark(conn: Any, session_id: str) -> SyncMark | None:
    """The session's :class:`SyncMark` (None: none, or one this build cannot read: sync in full)."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", (SYNC_MARK_NS, session_id)).fetchone()
    if row is None:
        return None
    try:
        raw = orjson.loads(row[0])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    epoch, upto, tail, revisions, aliases = (raw.get(k) for k in ("epoch", "upto", "tail", "revisions", "aliases"))
    if not (epoch is None or isinstance(epoch, str)) or not isinstance(upto, int) or isinstance(upto, bool) or (
            upto < 0 or not isinstance(tail, str) or not isinstance(revisions, str) or not isinstance(aliases, dict)):
        return None
    kept: dict[str, list[str]] = {}
    for family, ids in aliases.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        kept[family] = list(ids)
    return SyncMark(epoch, upto, tail, revisions, kept)


def write_sync_mark(conn: Any, session_id: str, mark: SyncMark, now_ms: int) -> None:
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
                 "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
                 (SYNC_MARK_NS, session_id, mark.to_json(), now_ms))


def drop_sync_mark(conn: Any, session_id: str) -> None:
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", (SYNC_MARK_NS, session_id))


__all__ = [
    "ARTIFACT",
    "ArchivedLine",
    "ArchivedDeletion",
    "archived_deletion_lines",
    "Branch",
    "PAGER_KEYS",
    "Respelled",
    "REVISION",
    "REVISION_LIVE",
    "RevisionEntry",
    "RevisionFile",
    "ROOT_MISSING",
    "ROOTS",
    "STALE_REFERENCE",
    "SYNC_MARK_NS",
    "Stamp",
    "SyncMark",
    "append_revision_lines",
    "artifact_line",
    "branch_unavailable",
    "entry_of_line",
    "drop_sync_mark",
    "family_key",
    "family_of",
    "find_root",
    "hidden_by_import",
    "live_roots",
    "live_stamps",
    "names_live",
    "parse_revisions",
    "payload_digest",
    "read_revisions",
    "read_sync_mark",
    "resolve",
    "respell",
    "restore_rows",
    "revision_line",
    "revision_live_line",
    "note_root_aliases",
    "revision_rows",
    "revisions_fingerprint",
    "root_before",
    "roots_field",
    "roots_of",
    "rows_from_file",
    "set_active",
    "stamp_of",
    "sync_active",
    "transcript_tail",
    "upsert_row",
    "user_line_spans",
    "with_stamp",
    "write_sync_mark",
]
