"""Session-actor handlers: revisions, rewrites (truncate, replace, switch) and compaction.

Every handler runs inside the session actor (one at a time per session) and
keeps the write order of docs/DESIGN.md: files first (revisions line and/or
transcript, each fsynced), index transaction second, reply last.

A rewrite (:func:`commit_rewrite`) is: archive every branch that is about to
leave the transcript (a full ``revision`` line, so no ``revision_live``
reference is ever stranded) → atomic transcript rewrite (new epoch) → one DB
transaction (reindex with owning turns, branch rows, ``is_active`` from the
new root stamps, receipt). A crash between the rewrite and the reindex is
healed by the next catch-up (the epoch differs, so it reindexes in full), and
:func:`ensure_synced` re-derives the branch rows and ``is_active`` from the
files on the first revision request of every actor incarnation.

Per-session state in ``actor.feature_state``: ``revisions.synced`` (rows and
``is_active`` match the files) and ``revisions.liveRefs`` (the
``(root, index)`` pairs whose newest record is a ``revision_live`` reference).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from actors.session_msgs import Custom
from store import index
from store.compaction import normalize_compaction, normalize_on_read
from store.errors import Conflict, CorruptData, InvalidInput, MessageNotFound, NotFound
from store.fsutil import remove_file_durable
from store.jsonio import dumps_line, loads_line
from store.records import normalize_message, receipt_of, rfc3339_to_ms, wire_record, with_receipt
from store.revisions import (
    append_revision_lines,
    family_of,
    find_root,
    live_stamps,
    read_revisions,
    restore_rows,
    revision_line,
    revision_live_line,
    revision_rows,
    root_before,
    stamp_of,
    sync_active,
    upsert_row,
    with_stamp,
)
from store.rewrite import LiveTranscript, RewritePlan, apply_rewrite, load_live, plan_rewrite, reindex, turn_map
from store.transcript import read_spans

if TYPE_CHECKING:
    from actors.session import SessionActor

SYNCED = "revisions.synced"
LIVE_REFS = "revisions.liveRefs"
ARCHIVE_MODES = ("regenerate", "retry", "edit")

Archive = tuple[str, int, list[dict[str, Any]], dict[str, str]]
"""(rootUserId, revisionIndex, branch messages, turns) to store as a full ``revision`` line."""


# ---------------------------------------------------------------------- shared steps


async def snapshot(actor: SessionActor) -> LiveTranscript:
    row = actor.row or {}
    return await actor.io(lambda: load_live(actor.path, default_created_ms=int(row.get("createdAt") or 0)))


async def ensure_synced(actor: SessionActor, live: LiveTranscript | None = None) -> LiveTranscript | None:
    """Once per actor incarnation: branch rows the index lost come back, ``is_active`` follows the stamps."""
    if actor.feature_state.get(SYNCED):
        return live
    live = live or await snapshot(actor)
    rf = await actor.io(read_revisions, actor.deps.data_dir.revisions(actor.sid))
    stamps = live_stamps(live.messages)
    sid, now = actor.sid, actor.now()

    def op(conn: Any) -> None:
        restore_rows(conn, sid, rf, live.messages, now)
        sync_active(conn, sid, stamps)

    await actor.db(op, durable=True)
    actor.feature_state[LIVE_REFS] = rf.live_refs()
    actor.feature_state[SYNCED] = True
    return live


def _live_refs(actor: SessionActor) -> set[tuple[str, int]]:
    refs = actor.feature_state.setdefault(LIVE_REFS, set())
    assert isinstance(refs, set)
    return refs


async def archive(actor: SessionActor, items: Sequence[Archive]) -> None:
    """Append full ``revision`` lines (one write, one fsync) and forget their live references."""
    if not items:
        return
    now = actor.now()
    lines = [revision_line(root, idx, msgs, turns, created_at_ms=now) for root, idx, msgs, turns in items]
    await actor.io(lambda: append_revision_lines(actor.deps.data_dir.revisions(actor.sid), lines,
                                                 faults=actor.deps.faults))
    refs = _live_refs(actor)
    for root, idx, _, _ in items:
        refs.discard((root, idx))


def dropped_live_branches(
    actor: SessionActor, old: Sequence[Mapping[str, Any]], new_ids: set[str], handled: set[tuple[str, int]],
    turns: Mapping[str, str],
) -> list[Archive]:
    """archive_dropped_live_branches: every referenced live branch whose root the rewrite deletes."""
    out: list[Archive] = []
    for root, idx in sorted(_live_refs(actor)):
        if (root, idx) in handled:
            continue
        pos = find_root(old, root)
        if pos is None or old[pos]["id"] in new_ids:
            continue
        branch = [dict(m) for m in old[pos:]]
        out.append((root, idx, branch, {k: v for k, v in turns.items() if any(m["id"] == k for m in branch)}))
    return out


def plan_for(live: LiveTranscript, messages: Sequence[Mapping[str, Any]]) -> RewritePlan:
    return plan_rewrite(messages, live.compactions, tombstones=live.tombstones, session_info=live.session_info)


async def commit_rewrite(
    actor: SessionActor,
    live: LiveTranscript,
    plan: RewritePlan,
    *,
    archives: Sequence[Archive] = (),
    turn_overrides: Mapping[str, str] | None = None,
    finish: Callable[[Any, int], Any] | None = None,
) -> Any:
    """Archive → atomic rewrite → one reindex transaction. Returns ``finish(conn, now)``'s value."""
    await archive(actor, archives)
    if actor.writer is not None:
        writer, actor.writer = actor.writer, None
        await actor.io(writer.close)
    actor.needs_catchup = True  # until the reindex below lands
    rewritten = await actor.io(lambda: apply_rewrite(actor.path, actor.sid, live.created_at_ms, plan,
                                                     faults=actor.deps.faults))
    actor.file_len, actor.epoch = rewritten.file_len, rewritten.epoch
    await actor.io(actor.deps.faults.point, "rewrite.before_reindex")
    stamps = live_stamps(plan.messages)
    sid, now = actor.sid, actor.now()

    def op(conn: Any) -> Any:
        reindex(conn, sid, rewritten, now_ms=now, turn_overrides=turn_overrides)
        conn.execute("UPDATE sessions SET updated_at = MAX(updated_at, ?) WHERE id = ?", (now, sid))
        for root, idx, msgs, _ in archives:
            upsert_row(conn, sid, root, idx, message_count=len(msgs), now_ms=now)
        sync_active(conn, sid, stamps)
        return finish(conn, now) if finish is not None else None

    result = await actor.db(op, durable=True)
    actor.needs_catchup = False
    await actor.refresh_row()
    assert actor.row is not None
    actor.publish("session.updated", {"session": index.public_session(actor.row)})
    return result


def _session(conn: Any, sid: str) -> dict[str, Any]:
    return index.public_session(index.require_session(conn, sid))


def _next_index(rows: Sequence[Mapping[str, Any]]) -> int:
    return max((int(r["revisionIndex"]) for r in rows), default=0) + 1


async def _guarded(actor: SessionActor, body: Callable[[], Any]) -> Any:
    """Run a handler body; any failure makes the next request re-derive revision state from files."""
    try:
        return await body()
    except BaseException:
        actor.feature_state.pop(SYNCED, None)
        raise


# ---------------------------------------------------------------------- session.saveActiveRevision


async def _locate_root(actor: SessionActor, family: str) -> tuple[int, dict[str, Any], int]:
    """(position, newest root record, live message count) — index fast path, full read otherwise."""
    sid = actor.sid
    total = int((await actor.refresh_row())["messageCount"])
    found = await actor.read(index.lookup_ids, [family])
    hit = found.get(family)
    if hit is not None and hit[0] == sid:
        blob = (await actor.io(read_spans, actor.path, [(hit[2], hit[3])]))[0]
        rec = loads_line(blob)
        if rec.get("role") == "user" and family_of(rec) == family:
            return hit[1] - 1, rec, total
    live = await snapshot(actor)
    pos = find_root(live.messages, family)
    if pos is None:
        raise MessageNotFound(f"no live user message roots revision family {family} in session {sid}",
                              data={"sessionId": sid, "messageId": family})
    return pos, live.messages[pos], len(live.messages)


async def save_active_revision(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    return await _guarded(actor, lambda: _save(actor, req))


async def _save(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    await ensure_synced(actor)
    sid = actor.sid
    requested = str(req.params["rootUserId"])
    pos, root, total = await _locate_root(actor, requested)
    family = family_of(root)
    rows = await actor.read(revision_rows, sid, family)
    known = {int(r["revisionIndex"]) for r in rows}
    stamped = stamp_of(root).active
    # D307: refresh the stamped variant; a stamped variant with no row yet is its own new variant.
    idx = stamped if stamped in known else _next_index(rows)
    count = len(known | {idx})
    message_count = total - pos
    now = actor.now()
    # 1. the pager stamp: a same-id replacement line (keep-last at first position), only if it changes
    stamped_rec = with_stamp(root, count=count, active=idx, root=family)
    item: index.IndexRecord | None = None
    new_len = actor.file_len
    if stamped_rec != root:
        line = dumps_line(stamped_rec)
        offsets, new_len = await actor.write_lines([line])
        item = index.IndexRecord(stamped_rec, offsets[0], len(line))
    # 2. the constant-size reference line
    await actor.io(lambda: append_revision_lines(actor.deps.data_dir.revisions(sid),
                                                 [revision_live_line(family, idx, created_at_ms=now)],
                                                 faults=actor.deps.faults))
    _live_refs(actor).add((family, idx))
    epoch = actor.epoch

    # 3. index: the root row's span, the branch row (+ is_active flip), the receipt
    def op(conn: Any) -> Any:
        if item is not None:
            index.index_messages(conn, sid, [item], indexed_len=new_len, file_epoch=epoch, now_ms=now, touch=False)
        upsert_row(conn, sid, family, idx, message_count=message_count, now_ms=now, active=True)
        info = next(r for r in revision_rows(conn, sid, family) if r["revisionIndex"] == idx)
        result = {"revision": info}
        actor.store_receipt(conn, req.receipt, result, sid, now)
        return result

    try:
        result = await actor.db(op, durable=True)
    except BaseException:
        actor.needs_catchup = True
        raise
    if item is not None:
        ref = {**index.message_ref(sid, pos + 1, stamped_rec, None),
               "createdAt": rfc3339_to_ms(stamped_rec.get("createdAt"), now)}
        actor.publish("session.message", {"message": ref, "record": wire_record(stamped_rec), "replaced": True})
    return result


# ---------------------------------------------------------------------- session.listRevisions


async def list_revisions(actor: SessionActor, req: Custom) -> Any:
    async def body() -> Any:
        await actor.ensure_ready()
        await ensure_synced(actor)
        return {"revisions": await actor.read(revision_rows, actor.sid, req.params.get("rootUserId"))}

    return await _guarded(actor, body)


# ---------------------------------------------------------------------- session.activateRevision


async def activate_revision(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    return await _guarded(actor, lambda: _activate(actor, req))


async def _activate(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    live = await snapshot(actor)
    await ensure_synced(actor, live)
    sid = actor.sid
    family = str(req.params["rootUserId"])
    target_idx = int(req.params["revisionIndex"])
    rpos = find_root(live.messages, family)
    if rpos is None:
        raise MessageNotFound(f"no live user message roots revision family {family} in session {sid}",
                              data={"sessionId": sid, "messageId": family})
    root = live.messages[rpos]
    family = family_of(root)
    rf = await actor.io(read_revisions, actor.deps.data_dir.revisions(sid))
    target = rf.get(family, target_idx)
    if target is None:
        raise NotFound(f"revision {target_idx} of family {family} does not exist",
                       data={"sessionId": sid, "rootUserId": family, "revisionIndex": target_idx})
    rows = await actor.read(revision_rows, sid, family)
    known = {int(r["revisionIndex"]) for r in rows} | {e.revision_index for e in rf.family(family)}
    stamped = stamp_of(root).active
    current = stamped if stamped in known else None
    if current == target_idx:
        return {"session": index.public_session(await actor.refresh_row()), "revisions": rows}
    if target.live:
        raise CorruptData(
            f"revision {target_idx} of family {family} is only a live reference but is not the live branch",
            data={"sessionId": sid, "rootUserId": family, "revisionIndex": target_idx})
    live_idx = current if current is not None else max(known, default=0) + 1
    turns = await actor.read(turn_map, sid)
    live_branch = [dict(m) for m in live.messages[rpos:]]
    branch_ids = {m["id"] for m in live_branch}
    # 1. materialize the live branch as a full revision line first (it is about to leave),
    #    unless the file already holds exactly this branch for its variant
    stored = rf.get(family, live_idx)
    archives: list[Archive] = []
    if stored is None or stored.live or _unstamped(stored.messages) != _unstamped(live_branch):
        archives.append((family, live_idx, live_branch, {k: v for k, v in turns.items() if k in branch_ids}))
    restored = [dict(m) for m in target.messages]
    if restored and restored[0].get("role") == "user":
        restored[0] = with_stamp(restored[0], count=len(known | {live_idx}), active=target_idx, root=family)
    merged: dict[str, dict[str, Any]] = {}
    for rec in live.messages[:rpos] + restored:
        merged[rec["id"]] = rec  # keep-last content at first position (the reader rule)
    new_msgs = list(merged.values())
    await _check_foreign_ids(actor, [m["id"] for m in restored])
    archives += dropped_live_branches(actor, live.messages, set(merged), {(family, live_idx)}, turns)
    plan = plan_for(live, new_msgs)

    def finish(conn: Any, now: int) -> Any:
        result = {"session": _session(conn, sid), "revisions": revision_rows(conn, sid, family)}
        actor.store_receipt(conn, req.receipt, result, sid, now)
        return result

    return await commit_rewrite(actor, live, plan, archives=archives, turn_overrides=dict(target.turns),
                                finish=finish)


def _unstamped(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages without the pager stamp (presentation metadata a restore sets afresh)."""
    out = []
    for m in messages:
        rec = dict(m)
        meta = rec.get("meta")
        if isinstance(meta, Mapping):
            rec["meta"] = {k: v for k, v in meta.items() if k not in ("revisionCount", "activeRevision")}
        out.append(rec)
    return out


async def _check_foreign_ids(actor: SessionActor, ids: Sequence[str]) -> None:
    known = await actor.read(index.lookup_ids, ids)
    foreign = sorted(mid for mid, hit in known.items() if hit[0] != actor.sid)
    if foreign:
        raise Conflict(f"message id {foreign[0]} belongs to another session",
                       data={"sessionId": actor.sid, "messageId": foreign[0]})


# ---------------------------------------------------------------------- session.truncateFrom


async def truncate_from(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    return await _guarded(actor, lambda: _truncate(actor, req))


async def _truncate(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    live = await snapshot(actor)
    await ensure_synced(actor, live)
    sid = actor.sid
    mid = str(req.params["messageId"])
    mode = req.params.get("mode")
    pos = live.position(mid)
    if pos is None:
        raise MessageNotFound(f"message {mid} is not in session {sid}; nothing was cut",
                              data={"sessionId": sid, "messageId": mid})
    old = live.messages
    new_msgs = [dict(m) for m in old[:pos]]
    turns = await actor.read(turn_map, sid)
    archives: list[Archive] = []
    handled: set[tuple[str, int]] = set()
    if mode in ARCHIVE_MODES:
        rpos = root_before(old, pos)
        if rpos is not None:
            root = old[rpos]
            family = family_of(root)
            rows = await actor.read(revision_rows, sid, family)
            known = {int(r["revisionIndex"]) for r in rows}
            stamped = stamp_of(root).active
            idx = stamped if stamped in known else _next_index(rows)  # refresh, or mint an inactive variant
            branch = [dict(m) for m in old[rpos:]]
            ids = {m["id"] for m in branch}
            archives.append((family, idx, branch, {k: v for k, v in turns.items() if k in ids}))
            handled.add((family, idx))
            if rpos < pos:  # the root stays: its pager now counts the variant about to be generated
                after = known | {idx}
                new_msgs[rpos] = with_stamp(root, count=len(after) + 1, active=max(after) + 1, root=family)
    archives += dropped_live_branches(actor, old, {m["id"] for m in new_msgs}, handled, turns)
    plan = plan_for(live, new_msgs)
    removed = len(old) - pos
    # The in-flight checkpoint belongs to the reply being cut; drop it before the rewrite so the
    # boot sweep can never promote it back after the cut.
    await actor.io(remove_file_durable, actor.deps.data_dir.inflight(sid))

    def finish(conn: Any, now: int) -> Any:
        conn.execute("UPDATE turns SET status = 'aborted', ended_at = ? WHERE session_id = ? AND status = 'running'",
                     (now, sid))
        result = {"session": _session(conn, sid), "removed": removed}
        actor.store_receipt(conn, req.receipt, result, sid, now)
        return result

    return await commit_rewrite(actor, live, plan, archives=archives, finish=finish)


# ---------------------------------------------------------------------- session.replaceMessages


async def replace_messages(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    return await _guarded(actor, lambda: _replace(actor, req))


async def _replace(actor: SessionActor, req: Custom) -> Any:
    await actor.ensure_ready()
    raw = req.params.get("messages")
    if not isinstance(raw, list):
        raise InvalidInput("messages must be a list", data={"field": "messages"})
    now = actor.now()
    recs: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        try:
            recs.append(normalize_message(m, now_ms=now))
        except InvalidInput as exc:
            exc.data.setdefault("index", i)
            raise
    ids = [r["id"] for r in recs]
    if len(set(ids)) != len(ids):
        raise InvalidInput("messages must have unique ids", data={"field": "messages"})
    await _check_foreign_ids(actor, ids)
    live = await snapshot(actor)
    await ensure_synced(actor, live)
    old_by_id = {m["id"]: m for m in live.messages}
    for i, rec in enumerate(recs):
        receipt = receipt_of(old_by_id.get(rec["id"], {}))
        if receipt is not None and receipt_of(rec) is None:
            recs[i] = with_receipt(rec, receipt)  # keep the append's receipt durable in its line
    for rec in recs:
        dumps_line(rec)  # an unencodable message fails here, before anything changed
    turns = await actor.read(turn_map, actor.sid)
    archives = dropped_live_branches(actor, live.messages, set(ids), set(), turns)
    plan = plan_for(live, recs)
    sid = actor.sid

    def finish(conn: Any, now_ms: int) -> Any:
        result = {"session": _session(conn, sid)}
        actor.store_receipt(conn, req.receipt, result, sid, now_ms)
        return result

    return await commit_rewrite(actor, live, plan, archives=archives, finish=finish)


# ---------------------------------------------------------------------- session.appendCompaction


async def append_compaction(actor: SessionActor, req: Custom) -> Any:
    replay = await actor.check_receipt(req.receipt)
    if replay is not None:
        return replay
    await actor.ensure_ready()
    sid = actor.sid
    rec = normalize_compaction(req.params.get("compaction"), now_ms=actor.now())
    for key in ("throughMessageId", "firstKeptMessageId"):
        anchor = rec.get(key)
        if anchor is not None and await actor.read(index.position_of, sid, anchor) is None:
            raise MessageNotFound(f"compaction {key} {anchor} is not in session {sid}",
                                  data={"sessionId": sid, "messageId": anchor})
    existing = await actor.read(_compaction_span, sid, rec["id"])
    if existing is not None:
        stored = loads_line((await actor.io(read_spans, actor.path, [existing]))[0])
        if {k: v for k, v in stored.items() if k != "createdAt"} != {k: v for k, v in rec.items() if k != "createdAt"}:
            raise Conflict(f"compaction {rec['id']} already exists with different content",
                           data={"sessionId": sid, "compactionId": rec["id"]})
        return {"compaction": wire_record(normalize_on_read(stored))}
    line = dumps_line(rec)
    offsets, new_len = await actor.write_lines([line])
    epoch, now = actor.epoch, actor.now()
    result = {"compaction": wire_record(normalize_on_read(rec))}

    def op(conn: Any) -> Any:
        index.index_compactions(conn, sid, [index.CompactionRecord(rec, offsets[0], len(line))], now)
        index.set_index_mark(conn, sid, new_len, epoch)
        actor.store_receipt(conn, req.receipt, result, sid, now)
        return result

    try:
        # The line is authoritative (boot rebuilds the row); only a receipt needs FULL.
        return await actor.db(op, durable=req.receipt is not None)
    except BaseException:
        actor.needs_catchup = True
        raise


def _compaction_span(conn: Any, sid: str, cid: str) -> tuple[int, int] | None:
    row = conn.execute(
        "SELECT line_offset, line_len FROM compactions WHERE session_id = ? AND id = ? ORDER BY line_offset DESC",
        (sid, cid),
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else None


HANDLERS = {
    "revisions.save": save_active_revision,
    "revisions.list": list_revisions,
    "revisions.activate": activate_revision,
    "rewrite.truncateFrom": truncate_from,
    "rewrite.replaceMessages": replace_messages,
    "compaction.append": append_compaction,
}
"""``Custom.kind`` → handler, registered in ``runtime/features.py``."""
