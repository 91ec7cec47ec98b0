"""Derived views of a transcript: the model context and the conversation tree.

Both are pure functions of what the files hold (the deduped live messages, the
compaction records, the tombstones and the archived revision branches); the
session actor reads the files and calls them. Nothing here is stored; only the
latest Turn context (below) also reads the index, where turns and their
snapshots live.

**Model context** (seed 000 §4 ``buildSessionContext``, seed 003 §2.1, §4.7a):

* skipped: tombstoned messages, ``system`` notices, and subagent-attributed
  rows (``meta.parentToolCallId`` or ``meta.agentName``) — the parent only ever
  saw the delegate's report, which is the ``Task`` tool result;
* a tool result whose call was tombstoned: a ``tool`` row's ``tool_call``
  block whose ``callId`` only a tombstoned (non-tool) message holds is dropped,
  and the row with it when no block is left (a provider refuses a result whose
  call is missing). The reverse stays: a call whose ``tool`` row was
  tombstoned keeps its place (a call with no result yet is the normal mid-turn
  state, and the host cannot tell the two apart; adapters fill in a result);
* the newest *valid* compaction checkpoint (its ``throughMessageId`` still
  exists, and no tombstone hides the checkpoint itself: a pi import hides one
  on a branch the file left) starts the context: one summary message (role
  ``user``, a single text block holding the summary, ``compactionSummary:
  true``), then the
  checkpoint's ``retainedTail`` (minus entries the kept range below already
  holds in full, and minus tombstoned/attributed ones), then the transcript
  from ``firstKeptMessageId`` (inclusive) when that message exists, else from
  the message after ``throughMessageId``;
* blocks are provider-neutral: ``text``, ``tool_call`` and ``attachment``
  blocks are kept as stored; ``thinking`` blocks are dropped unless replay is
  asked for — by the message (``meta.replayReasoning: true``) or by the block
  itself carrying provider replay state (``signature``, ``redacted`` or
  ``replay``) — and then appear as ``{"type": "reasoning", ...}``; every other
  block type (``hostedSearch``, unknown types) is display-only and dropped. A
  message left with no blocks is dropped.

**Tree** (seed 000 §1, §3): live messages are a chain whose ``parentId`` is the
previous *visible* message (children of a tombstoned node reconnect to its
visible ancestor; the tombstoned node itself stays, marked ``deleted``, with
no live child; archived replies regenerated under it stay there). An archived
revision branch is a chain rooted at its user turn (seed 000 §3.2): when its
stored root is the message already in the tree (same id, role and blocks: a
regenerate), the rest of the chain hangs under that message ("a new assistant
branch under the user message"); when the root differs (an edit), the whole
chain, its user message first, hangs off the root's parent ("a sibling under
the original parent"). Siblings are ordered by
revision index (the live root and its first reply carry the stamped
``activeRevision``; an unsaved live variant sorts last; an archived node
carries its branch's index, or from a later user turn stamped with a family of
its own, that family's stamped index). Each message shows once: the variant a
family's placed root already shows (the live one, or the one an enclosing
archived branch holds, per its root's stamp) is not placed again from its
stored copy.
Archived node ids are ``rev:<rootUserId>:<revisionIndex>:<messageId>`` (unique
even where a branch shares message ids with the live transcript); every node
also carries ``messageId``. The nodes of a branch whose family no live user
message roots carry ``unavailable`` (``StoredBranch.unavailable``):
``activateRevision`` cannot switch to it.

**Latest Turn context** (seed 000 §4: "produces provider-neutral messages plus
the latest Turn context"): a turn's context is the run environment snapshot
``session.startTurn`` stored for it (``store/snapshots.py``; the host writes no
other per-turn context). The latest one is that of the turn newest on the
active branch: ranked by the position of the last live message tied to it (its
line's ``turnId``, or the turn's bound ``input`` message), a ``running`` turn
after every message (it runs on the live branch: rewrites abort it, its reply
lands there), ties by start time. A turn that only archived branches mention is
not on the active branch; a tombstone hides a message, not the turn it ran in.
Turns without a snapshot have no context.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.compaction import normalize_on_read, split_valid
from store.ids import remapped_message_id
from store.revisions import family_of, live_stamps, stamp_of
from store.snapshots import input_digest_of, load_snapshot
from store.transcripts.records import blocks_of, extract_text, meta_of

CONTEXT_BLOCK_TYPES = ("text", "tool_call", "attachment")
REPLAY_KEYS = ("signature", "redacted", "replay")
PREVIEW_CHARS = 120


# --------------------------------------------------------------------------- model context


def is_attributed(record: Mapping[str, Any]) -> bool:
    """A subagent row (seed 003 §4.7a)."""
    meta = meta_of(record)
    return any(isinstance(meta.get(k), str) and meta.get(k) for k in ("parentToolCallId", "agentName"))


def in_context(record: Mapping[str, Any], tombstoned: set[str] | frozenset[str]) -> bool:
    return (
        record.get("id") not in tombstoned
        and record.get("role") != "system"
        and not is_attributed(record)
    )


def context_blocks(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    replay = meta_of(record).get("replayReasoning") is True
    out: list[dict[str, Any]] = []
    for block in blocks_of(record):
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind in CONTEXT_BLOCK_TYPES:
            out.append(dict(block))
        elif kind == "thinking" and (replay or any(k in block for k in REPLAY_KEYS)):
            out.append({**block, "type": "reasoning"})
    return out


def context_message(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The provider-neutral projection of one record (None when nothing is left)."""
    blocks = context_blocks(record)
    if not blocks:
        return None
    out: dict[str, Any] = {"id": record.get("id"), "role": record.get("role"), "blocks": blocks}
    for key in ("toolName", "turnId", "createdAt"):
        if isinstance(record.get(key), str):
            out[key] = record[key]
    return out


def newest_valid(
    compactions: Sequence[Mapping[str, Any]], message_ids: Iterable[str]
) -> dict[str, Any] | None:
    kept, _ = split_valid(compactions, message_ids)
    return normalize_on_read(kept[-1]) if kept else None


def build_session_context(
    records: Sequence[Mapping[str, Any]],
    compactions: Sequence[Mapping[str, Any]],
    tombstoned_ids: Iterable[str],
) -> dict[str, Any]:
    """``{"messages": [...], "compaction": record | None}`` for the live transcript.

    ``records`` are the deduped live messages in order; ``compactions`` the
    checkpoint records in file order (invalid ones are ignored here).
    """
    tombstoned = frozenset(tombstoned_ids)
    positions = {rec["id"]: i for i, rec in enumerate(records)}
    # a checkpoint a tombstone names is hidden (it is on a branch an import left): never the start
    checkpoint = newest_valid([c for c in compactions if c.get("id") not in tombstoned], positions)
    out: list[dict[str, Any]] = []
    start = 0
    if checkpoint is not None:
        first_kept = checkpoint.get("firstKeptMessageId")
        start = positions[checkpoint["throughMessageId"]] + 1
        if isinstance(first_kept, str) and first_kept in positions:
            # never past the boundary: a firstKept after throughMessageId would drop the messages
            # between them, neither summarized nor kept
            start = min(start, positions[first_kept])
        summary: dict[str, Any] = {
            "id": checkpoint.get("id"),
            "role": "user",
            "blocks": [{"type": "text", "text": checkpoint.get("summary", "")}],
            "compactionSummary": True,
        }
        if isinstance(checkpoint.get("createdAt"), str):
            summary["createdAt"] = checkpoint["createdAt"]
        out.append(summary)
        kept_ids = {rec["id"] for rec in records[start:]}
        for tail in checkpoint.get("retainedTail") or ():
            if (not isinstance(tail, Mapping) or not isinstance(tail.get("id"), str)  # an older line's: no id
                    or tail["id"] in kept_ids or not in_context(tail, tombstoned)):
                continue
            msg = context_message(tail)
            if msg is not None:
                out.append(msg)
    for rec in records[start:]:
        if not in_context(rec, tombstoned):
            continue
        msg = context_message(rec)
        if msg is not None:
            out.append(msg)
    tails = (checkpoint.get("retainedTail") or ()) if checkpoint is not None else ()
    hidden_calls = _tombstoned_calls([*records, *(t for t in tails if isinstance(t, Mapping))], tombstoned)
    if hidden_calls:
        out = _without_results_of(out, hidden_calls)
    return {"messages": out, "compaction": checkpoint}


def _call_ids(record: Mapping[str, Any]) -> set[str]:
    return {b["callId"] for b in blocks_of(record)
            if isinstance(b, Mapping) and b.get("type") == "tool_call" and isinstance(b.get("callId"), str)}


def _tombstoned_calls(records: Iterable[Mapping[str, Any]], tombstoned: frozenset[str]) -> set[str]:
    """The call ids of the tool calls tombstoned messages (other than ``tool`` rows: those hold results) make."""
    out: set[str] = set()
    for rec in records:
        if rec.get("id") in tombstoned and rec.get("role") != "tool":
            out |= _call_ids(rec)
    return out


def _without_results_of(messages: list[dict[str, Any]], hidden_calls: set[str]) -> list[dict[str, Any]]:
    """``messages`` minus the results (``tool`` rows' ``tool_call`` blocks) of the calls in ``hidden_calls``
    that no message of the context makes any more; a row left with no block goes too."""
    hidden = hidden_calls - {cid for msg in messages if msg.get("role") != "tool" for cid in _call_ids(msg)}
    if not hidden:
        return messages
    out: list[dict[str, Any]] = []
    for msg in messages:
        if msg.get("role") == "tool":
            blocks = [b for b in msg["blocks"] if not (b.get("type") == "tool_call" and b.get("callId") in hidden)]
            if not blocks:
                continue
            if len(blocks) != len(msg["blocks"]):
                msg = {**msg, "blocks": blocks}
        out.append(msg)
    return out


# --------------------------------------------------------------------------- latest Turn context


def turn_positions(records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``turnId`` → position of the last live message whose line names that turn."""
    out: dict[str, int] = {}
    for i, rec in enumerate(records):
        turn = rec.get("turnId")
        if isinstance(turn, str) and turn:
            out[turn] = i
    return out


def latest_turn_context(
    conn: sqlite3.Connection, session_id: str, records: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``{"turnId", "version", "digest", "snapshot", "input"?}`` of the newest turn on the active branch
    (``records``: the deduped live messages in order) that has a run environment snapshot, or None.

    The chosen snapshot is read back verified (``load_snapshot``: CORRUPT_DATA on a digest mismatch).
    """
    by_turn = turn_positions(records)
    by_message = {rec["id"]: i for i, rec in enumerate(records)}

    def input_at(input_id: str, digest: Any) -> int:
        """The position of the live message that *is* the bound input (as sent or in its D444 spelling): the
        same id and the same normalized input (``session.verifyEnvironment``'s test). An edit that reused the
        id holds other words: the turn ran on the archived message, not on it."""
        for mid in (input_id, remapped_message_id(session_id, input_id)):
            i = by_message.get(mid, -1)
            if i >= 0 and input_digest_of(input_id, records[i]) == digest:
                return i
        return -1

    best: tuple[int, int, str] | None = None
    for turn_id, status, started_at, input_id, digest in conn.execute(
        "SELECT t.id, t.status, t.started_at, "
        "CASE WHEN json_valid(r.input_json) THEN json_extract(r.input_json, '$.messageId') END, r.input_digest "
        "FROM turns t JOIN run_snapshots r ON r.turn_id = t.id WHERE t.session_id = ?",
        (session_id,),
    ):
        at = by_turn.get(turn_id, -1)
        if isinstance(input_id, str):  # the bound input
            at = max(at, input_at(input_id, digest))
        if status == "running":
            at = len(records)
        if at < 0:
            continue  # only an archived branch (or no message at all) knows this turn
        key = (at, int(started_at or 0), str(turn_id))
        if best is None or key > best:
            best = key
    if best is None:
        return None
    return {"turnId": best[2], **load_snapshot(conn, best[2])}


# --------------------------------------------------------------------------- tree


@dataclass(frozen=True)
class StoredBranch:
    """One revisions-file entry: a full archived branch, or a live reference (no payload)."""

    root_user_id: str
    revision_index: int
    messages: Sequence[Mapping[str, Any]]
    live: bool = False
    deleted: frozenset[str] = frozenset()
    """Its messages the user had deleted when it left the transcript (shown ``deleted``)."""
    unavailable: str | None = None
    """Why ``activateRevision`` cannot switch to it (``store.revisions.branch_unavailable``), shown on its nodes."""


def preview(record: Mapping[str, Any], limit: int = PREVIEW_CHARS) -> str:
    text = extract_text(record)
    if text is None:
        names = [name for b in blocks_of(record)
                 if isinstance(b, Mapping) and b.get("type") == "tool_call" and isinstance(name := b.get("name"), str)]
        tool = record.get("toolName")
        text = tool if isinstance(tool, str) else ", ".join(names)
    flat = " ".join(text.split())
    return flat[:limit]


def archived_node_id(root_user_id: str, revision_index: int, message_id: str) -> str:
    return f"rev:{root_user_id}:{revision_index}:{message_id}"


def _node(rec: Mapping[str, Any], node_id: str, parent: str | None, *, active: bool, deleted: bool,
          revision_index: int | None) -> dict[str, Any]:
    node: dict[str, Any] = {
        "id": node_id,
        "messageId": rec.get("id"),
        "parentId": parent,
        "role": rec.get("role"),
        "active": active,
        "deleted": deleted,
        "preview": preview(rec),
    }
    if revision_index is not None:
        node["revisionIndex"] = revision_index
    return node


def build_tree(
    records: Sequence[Mapping[str, Any]],
    tombstoned_ids: Iterable[str],
    branches: Sequence[StoredBranch] = (),
) -> dict[str, Any]:
    """``{"nodes": [...], "activeLeafId": ...}``: parents before children, siblings by revision index."""
    tombstoned = frozenset(tombstoned_ids)
    stamps = live_stamps(records)
    nodes: list[dict[str, Any]] = []
    roots = _Roots()
    visible: str | None = None
    reply_rev: int | None = None  # the live root's stamp, for the reply that follows it
    for rec in records:
        deleted = rec.get("id") in tombstoned
        rev = None
        if rec.get("role") == "user":
            fam = family_of(rec)
            if fam not in roots.parent:
                rev = stamps.get(fam)
                roots.seen(fam, str(rec["id"]), rec, visible, shown=rev)
            reply_rev = rev
        elif reply_rev is not None:
            rev, reply_rev = reply_rev, None
        nodes.append(_node(rec, str(rec["id"]), visible, active=not deleted, deleted=deleted, revision_index=rev))
        if not deleted:
            visible = str(rec["id"])
    active_leaf = visible
    # archived branches: live references name the live suffix, already placed above
    archived = [b for b in branches if not b.live and b.messages]
    archived.sort(key=lambda b: (b.root_user_id, b.revision_index))
    pending = list(archived)
    # A branch whose root is not live may hang inside another archived branch: resolve iteratively.
    while pending:
        progressed = False
        rest: list[StoredBranch] = []
        for b in pending:
            if b.root_user_id in roots.parent:
                # The variant the family's placed root already shows inline (the live one, or the one an
                # enclosing archived branch holds) is in the tree once: its stored copy is skipped.
                if roots.shown.get(b.root_user_id) != b.revision_index:
                    _add_branch(nodes, roots, b, roots.parent[b.root_user_id])
                progressed = True
            else:
                rest.append(b)
        if not progressed:
            for b in rest:  # the root is nowhere: a separate top-level chain
                _add_branch(nodes, roots, b, None)
            break
        pending = rest
    return {"nodes": _ordered(nodes), "activeLeafId": active_leaf}


@dataclass
class _Roots:
    """Per revision family, the first root message placed in the tree: its parent, node and record, and
    the variant the chain through it shows (None: unknown, an unsaved variant)."""

    parent: dict[str, str | None] = field(default_factory=dict)
    node: dict[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    shown: dict[str, int | None] = field(default_factory=dict)

    def seen(self, family: str, node_id: str, rec: Mapping[str, Any], parent: str | None, *,
             shown: int | None) -> None:
        if family not in self.parent:
            self.parent[family] = parent
            self.node[family] = (node_id, rec)
            self.shown[family] = shown


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(key) == b.get(key) for key in ("id", "role", "blocks"))


def _add_branch(nodes: list[dict[str, Any]], roots: _Roots, b: StoredBranch, attach: str | None) -> None:
    """Place one archived branch. A later user turn in it whose root line is stamped with a family of its
    own starts that family's variant (the stamp says which one was live when the branch left): from
    there on its nodes carry that family's index, and the root records which variant it shows, so the
    stored copy of that same variant is not placed a second time (``build_tree``)."""
    parent = attach
    skip = 0
    placed = roots.node.get(b.root_user_id)
    if placed is not None and b.messages and _same_message(b.messages[0], placed[1]):
        parent, skip = placed[0], 1  # a regenerate: the branch goes on under that message
    label: int | None = b.revision_index
    for i, rec in enumerate(b.messages):
        user = rec.get("role") == "user"
        family = family_of(rec) if user else None
        own = family == b.root_user_id
        shown = b.revision_index if own else stamp_of(rec).active
        if user and not own and shown is not None:
            label = shown  # a nested family's stamped variant; an unstamped turn stays in this one
        if i < skip:
            continue
        node_id = archived_node_id(b.root_user_id, b.revision_index, str(rec.get("id")))
        if family is not None:
            roots.seen(family, node_id, rec, parent, shown=shown)
        node = _node(rec, node_id, parent, active=False, deleted=rec.get("id") in b.deleted, revision_index=label)
        if b.unavailable is not None:
            node["unavailable"] = b.unavailable
        nodes.append(node)
        parent = node_id


def _ordered(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pre-order walk: parents before children; siblings by revision index, then insertion order.

    Seed 000 §3.4 "Walk length is bounded by node count": each node id is placed once (a damaged revisions
    file can repeat a message inside its branch, which would make that node its own ancestor); a later node
    with an id already placed is left out. With one node per id, each node has one parent, so what the walk
    reaches from the roots is a forest (a cycle is never reached) and it visits each node at most once."""
    unique: dict[str, dict[str, Any]] = {}
    for n in nodes:
        unique.setdefault(n["id"], n)
    children: dict[str | None, list[tuple[int, dict[str, Any]]]] = {}
    ids = unique.keys()
    for i, n in enumerate(unique.values()):
        parent = n["parentId"] if n["parentId"] in ids else None
        children.setdefault(parent, []).append((i, n))
    big = 1 << 62
    for kids in children.values():
        kids.sort(key=lambda item: (item[1].get("revisionIndex", big) if item[1].get("revisionIndex") is not None
                                    else big, item[0]))
    out: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = [n for _, n in reversed(children.get(None, []))]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(n for _, n in reversed(children.get(node["id"], [])))
    return out


__all__ = [
    "CONTEXT_BLOCK_TYPES",
    "StoredBranch",
    "archived_node_id",
    "build_session_context",
    "build_tree",
    "context_blocks",
    "context_message",
    "in_context",
    "is_attributed",
    "newest_valid",
    "preview",
]
