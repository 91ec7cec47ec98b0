"""Assistant Edit (seed 003 §4.5, §4.9): a message-scoped fork whose last reply is edited.

    "A message-scoped fork copies only the canonical prefix through the selected
    message. Assistant Edit uses that child and records the original/edited
    response tails in the child's existing message_revisions store; the source
    transcript and source revisions are never rewritten."

The plan is pure (:func:`plan_assistant_edit`): the child's body is the fork
of the prefix through the selected assistant message (:func:`store.fork.plan_fork`:
ids remapped, receipts, turns and pager stamps dropped) with that message
replaced by the edited one, under a new id. The response tail is the branch
rooted at the nearest user message before it (the family key of a regenerate
pager, §4.9):

* revision 1 is the ORIGINAL tail, a full ``revision`` line (it has left the
  child's transcript);
* revision 2 is the EDITED tail, a ``revision_live`` reference (it is the live
  suffix of the child's transcript), active;
* the root user line carries the pager stamp (``revisionCount`` 2,
  ``activeRevision`` 2).

:func:`write_revisions` is the one file step this adds to a fork: the child's
revisions file, written whole (temp + fsync + rename) BEFORE the child's
transcript is published, so a published child always has its revisions. A
crash before the publication leaves at most an unpublished revisions file,
which a retry (same child id, derived from the receipt key) replaces.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from store.errors import InvalidInput, MessageNotFound, StoreError
from store.faults import NO_FAULTS, Faults
from store.fork import ForkPlan, derived_id, plan_fork
from store.fsutil import atomic_write, fsync_dir
from store.indexing import index
from store.revisions import revision_line, revision_live_line, root_before, with_stamp
from store.tombstones import tombstone_record
from store.transcripts.records import Root, ms_to_rfc3339
from store.transcripts.rewrite import RewritePlan, plan_rewrite

ORIGINAL_REVISION = 1
EDITED_REVISION = 2
DROPPED_EDIT_META = ("usage",)
"""Meta of the original reply that does not describe the edited text (it was never generated)."""

__all__ = ["EDITED_REVISION", "ORIGINAL_REVISION", "EditPlan", "plan_assistant_edit", "remove_revisions", "response",
           "write_revisions"]


@dataclass(frozen=True)
class EditPlan:
    fork: ForkPlan
    """The plain message-scoped fork (its ``pasted_refs`` name the inputs to copy)."""
    plan: RewritePlan
    """The child's body: the fork with the selected reply replaced by the edited one."""
    root_user_id: str
    """The family key of the edited tail in the child (the child's root user message id)."""
    original_id: str
    """The child's id of the original reply (in revision 1)."""
    edited_id: str
    """The child's id of the edited reply (the live transcript's last message)."""
    original_tail: list[dict[str, Any]]
    edited_tail: list[dict[str, Any]]
    revision_lines: list[bytes]


def plan_assistant_edit(
    source_id: str,
    child_id: str,
    messages: Sequence[Mapping[str, Any]],
    compactions: Sequence[Mapping[str, Any]],
    tombstones: Mapping[str, Mapping[str, Any]],
    session_info: Mapping[str, Any],
    *,
    message_id: str,
    blocks: Sequence[Mapping[str, Any]],
    now_ms: int,
    roots: Mapping[str, Root | None] | None = None,
    root: Root | None = None,
) -> EditPlan:
    """Lay out the child of an Assistant Edit. Nothing is written.

    Raises MESSAGE_NOT_FOUND for an unknown id, INVALID_PARAMS when the message
    is not an assistant reply or no user message precedes it (no tail to record).
    """
    ids = [str(msg["id"]) for msg in messages]
    message_id = index.find_line_id(source_id, message_id, ids) or message_id
    if message_id not in ids:
        raise MessageNotFound(f"message {message_id} is not in session {source_id}; nothing was forked",
                              data={"sessionId": source_id, "messageId": message_id})
    selected = messages[ids.index(message_id)]
    if selected.get("role") != "assistant":
        raise InvalidInput(f"message {message_id} is a {selected.get('role')} message; Assistant Edit edits an "
                           f"assistant reply", data={"sessionId": source_id, "messageId": message_id,
                                                     "field": "messageId"})
    if root_before(messages, ids.index(message_id)) is None:
        raise InvalidInput(f"no user message precedes {message_id}; there is no response tail to record",
                           data={"sessionId": source_id, "messageId": message_id, "field": "messageId"})
    # the selected reply's own tombstone is not carried: the edited reply is a new message
    kept_tombs = {k: v for k, v in tombstones.items() if k != message_id}
    fork = plan_fork(source_id, child_id, messages, compactions, kept_tombs, session_info,
                     through_message_id=message_id, now_ms=now_ms, roots=roots, root=root)
    child_msgs = [dict(msg) for msg in fork.plan.messages]
    original = child_msgs[-1]
    rpos = root_before(child_msgs, len(child_msgs) - 1)
    assert rpos is not None  # the fork keeps every message before the selected one
    family = str(child_msgs[rpos]["id"])
    edited = _edited(original, blocks, derived_id(child_id, "edit", message_id), now_ms)
    original_tail = [dict(msg) for msg in child_msgs[rpos:]]
    original_tail[0] = with_stamp(original_tail[0], count=EDITED_REVISION, active=ORIGINAL_REVISION, root=family)
    live = child_msgs[:-1] + [edited]
    live[rpos] = with_stamp(live[rpos], count=EDITED_REVISION, active=EDITED_REVISION, root=family)
    tombs = {
        fork.id_map[old]: tombstone_record(derived_id(child_id, "tombstone", old), fork.id_map[old], True,
                                           created_at_ms=now_ms)
        for old, tomb in kept_tombs.items()
        if old in fork.id_map and tomb.get("deleted", True) is True
    }
    # the child's lines stand under the roots the fork gave them (``records.Root``); the edited reply under the
    # session's
    child_roots = None if roots is None else {
        str(msg["id"]): under for msg, under in zip(fork.plan.messages, fork.plan.message_roots, strict=True)}
    plan = plan_rewrite(live, fork.plan.compactions, tombstones=tombs, session_info=dict(session_info),
                        roots=child_roots, root=root)
    lines = [
        # the original tail keeps its lines' roots: a switch back to it writes them under them again
        revision_line(family, ORIGINAL_REVISION, original_tail, {}, created_at_ms=now_ms, roots=child_roots),
        revision_live_line(family, EDITED_REVISION, created_at_ms=now_ms, message_count=len(live) - rpos),
    ]
    return EditPlan(fork, plan, family, str(original["id"]), str(edited["id"]), original_tail,
                    [dict(msg) for msg in live[rpos:]], lines)


def _edited(original: Mapping[str, Any], blocks: Sequence[Mapping[str, Any]], new_id: str,
            now_ms: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in original.items():
        if key == "id":
            out["id"] = new_id
        elif key == "blocks":
            out["blocks"] = [dict(b) for b in blocks]
        elif key == "createdAt":
            out["createdAt"] = ms_to_rfc3339(now_ms)
        elif key != "meta":
            out[key] = value
    raw_meta = original.get("meta")
    meta = {k: v for k, v in raw_meta.items() if k not in DROPPED_EDIT_META} if isinstance(raw_meta, Mapping) else {}
    meta["assistantEdit"] = {"originalMessageId": str(original["id"])}
    out["meta"] = meta
    return out


def response(summary: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The result: the child's summary and where the edit sits. ``extra`` is what the receipt in the
    child's header carries (``file_record(key, **extra)``), so boot rebuilds the same response from it."""
    ids = {k: extra.get(k) for k in ("messageId", "originalMessageId", "rootUserId")}
    if not all(isinstance(v, str) and v for v in ids.values()):
        return None
    return {"session": dict(summary), **ids, "revisionIndex": EDITED_REVISION,
            "originalRevisionIndex": ORIGINAL_REVISION}


def write_revisions(path: str | os.PathLike[str], lines: Sequence[bytes], *, faults: Faults = NO_FAULTS) -> None:
    """The child's revisions file, whole (temp + fsync + rename + dir fsync; fault points
    ``assistantEdit.revisions.*``). Replaces a leftover of an unpublished earlier attempt."""
    atomic_write(path, b"".join(lines), faults=faults, point_prefix="assistantEdit.revisions")


def remove_revisions(path: str | os.PathLike[str]) -> None:
    """Undo :func:`write_revisions` after a failed edit: the file and any temp file it left."""
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    try:
        leftovers = [e for e in os.listdir(directory) if e == name or e.startswith(name + ".tmp.")]
    except OSError:
        return
    for entry in leftovers:
        try:
            os.unlink(os.path.join(directory, entry))
        except OSError:
            pass  # boot's sweep finishes the job
    try:
        fsync_dir(directory)
    except (OSError, StoreError):
        pass
