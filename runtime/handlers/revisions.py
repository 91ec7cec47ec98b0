"""Regenerate branches and whole-transcript rewrites (seed 003 §4.9, §5).

``session.saveActiveRevision`` / ``activateRevision`` / ``listRevisions`` and
the rewrites ``session.truncateFrom`` / ``replaceMessages``. Each runs inside
the session actor and keeps the write order of docs/DESIGN.md: files first
(revisions line and/or transcript, each fsynced), index transaction second,
reply last.

A rewrite (:func:`commit_rewrite`) is: archive every branch that is about to
leave the transcript (a full ``revision`` line, so no ``revision_live``
reference is ever stranded) → atomic transcript rewrite (new epoch; the
request's receipt rides in the new header, with the receipts the old header
carried, so an earlier rewrite's receipt is not left only in SQLite) → one DB
transaction (reindex with owning turns, branch rows, ``is_active`` from the new
root stamps, receipt). A branch row stores what its revisions line says (the
line's ``createdAt``; a reference's ``messageCount``), so a rebuilt index reads
back the same rows.
A crash between the rewrite and the reindex is healed by the next catch-up
(the epoch differs, so it reindexes in full and restores the receipt from
the header), and :func:`ensure_synced` re-derives the branch rows and
``is_active`` from the files once per actor incarnation.

Per-incarnation memo in ``ctx.cache``: ``revisions.synced`` (rows and
``is_active`` match the files), ``revisions.liveRefs`` (the
``(root, index)`` pairs whose newest record is a ``revision_live`` reference)
and ``revisions.stored`` (the payload digest of each pair whose newest record
is a full ``revision`` line: an archive whose exact payload the file already
holds, written by an interrupted try of the same rewrite, is not written again),
``revisions.rootAliases`` (:class:`RootAliases`: the ids under which a user message joins a family
whose key is another id, so ``listRevisions`` looks each family's live root up in the index instead of
reading every user message), ``revisions.artifacts`` (path → the artifact row the file's ``artifact`` lines
carry: :func:`carry_artifacts`), and ``revisions.mark`` (the :class:`SyncMark` the database holds for the
session as this incarnation last wrote it: a branch write moves it in its own transaction, :class:`Remark`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.session_context import CarriedAnswer, Lines, SessionContext
from protocol import models as m
from runtime.handlers import turn_aftermath
from store import artifacts, collab, receipts
from store.errors import Conflict, CorruptData, InvalidInput, MessageNotFound, NotFound, PermissionDenied
from store.faults import NO_FAULTS, Faults
from store.fsutil import remove_file_durable
from store.indexing import index
from store.indexing.reconcile import restore_lost_turns, restore_receipt, scan_from
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey, file_record
from store.receipts import conflict as receipts_conflict
from store.revisions import (
    RevisionEntry,
    RevisionFile,
    SyncMark,
    append_revision_lines,
    archived_deletion_lines,
    artifact_line,
    branch_unavailable,
    drop_sync_mark,
    entry_of_line,
    family_key,
    family_of,
    find_root,
    hidden_by_import,
    live_roots,
    live_stamps,
    names_live,
    note_root_aliases,
    payload_digest,
    read_revisions,
    read_sync_mark,
    respell,
    restore_rows,
    revision_line,
    revision_live_line,
    revision_rows,
    revisions_fingerprint,
    root_before,
    stamp_of,
    stored_as,
    sync_active,
    transcript_tail,
    upsert_row,
    user_line_spans,
    with_stamp,
    write_sync_mark,
)
from store.tombstones import deleted_ids
from store.transcripts.records import Root, normalize_message, rfc3339_to_ms, wire_record, with_internal_meta
from store.transcripts.rewrite import (
    LiveTranscript,
    RewritePlan,
    Rewritten,
    apply_rewrite,
    as_reindexed,
    carried_delivered,
    dropped_append_receipts,
    load_live,
    plan_rewrite,
    reindex,
    turn_map,
)
from store.transcripts.transcript import read_spans
from store.turns import abort_running, get_turn

__all__ = ["activate", "foreign_ids", "list_revisions", "replace_messages", "save_active", "set_archived_deleted",
           "snapshot", "truncate_from"]

SYNCED = "revisions.synced"
LIVE_REFS = "revisions.liveRefs"
STORED = "revisions.stored"
ROOT_ALIASES = "revisions.rootAliases"
MARK = "revisions.mark"
CARRIED_ARTIFACTS = "revisions.artifacts"


@dataclass
class RootAliases:
    """The user messages that join a family under another id (``store.revisions.note_root_aliases``), from
    every line of the transcript of ``epoch`` up to byte ``upto``: what ``listRevisions`` looks up to find
    each family's live root without reading the transcript (``store.revisions.live_roots``). A later call
    reads only the lines appended since; a rewrite (a new epoch) sets it from the lines it wrote, anything
    else that replaced the file makes the next call read it once."""

    epoch: str | None
    upto: int
    by_family: dict[str, set[str]] = field(default_factory=dict)


ARCHIVE_MODES = ("regenerate", "retry", "edit")

Archive = tuple[str, int, list[dict[str, Any]], dict[str, str]]
"""(rootUserId, revisionIndex, branch messages, turns) to store as a full ``revision`` line."""
RestoredArchive = tuple[Archive, Sequence[Mapping[str, Any]], frozenset[str]]
"""An archive of part of a branch being restored (not of the live transcript), with the checkpoints and
the deleted message ids it carries (the live transcript's tombstones and checkpoints are not its own)."""


# ---------------------------------------------------------------------- shared steps


async def snapshot(ctx: SessionContext) -> LiveTranscript:
    created = int(ctx.row.get("createdAt") or 0)
    path = ctx.paths.transcript
    return await ctx.io(lambda: load_live(path, default_created_ms=created))


def resolve_position(live: LiveTranscript, session_id: str, message_id: str) -> int | None:
    """The client's message id in the live transcript, by any of its spellings (``index.line_spellings``)."""
    for candidate in index.line_spellings(session_id, message_id):
        pos = live.position(candidate)
        if pos is not None:
            return pos
    return None


async def ensure_synced(ctx: SessionContext, live: LiveTranscript | None = None) -> LiveTranscript | None:
    """Once per actor incarnation: branch rows the index lost come back, ``is_active`` follows the stamps,
    and the receipt rows of keyed saves whose reference line carries them (a crash between the line and
    the commit left no row: the retry is answered from the line, :func:`save_active`).

    The session's :class:`SyncMark` says what the rows were last synced against in full. While the files
    are still what it says (the transcript's epoch and the bytes before the length it covered, the revisions
    file byte for byte), only the transcript lines appended since are read: each family's live root is looked
    up through the index (``live_roots``, with the root aliases the mark keeps), not found by reading the
    session (issue 26: the first branch call of an actor cost O(session)). Anything else (no mark: a lost or
    rebuilt database; a revisions file edited by hand or put back from a backup; a transcript of another
    epoch or other bytes; an index that cannot tell) reads both files whole, as before, and marks anew."""
    if ctx.cache.get(SYNCED):
        return live
    quick = None if live is not None else await ctx.io_with_reader(
        _quick_sync, ctx.sid, ctx.paths.transcript, ctx.paths.revisions, ctx.epoch, ctx.file_len)
    sid, now = ctx.sid, ctx.now()
    if quick is not None:
        rf, stamps, mark = quick.revisions, quick.stamps, quick.mark

        def quick_op(conn: Any) -> None:
            restore_rows(conn, sid, rf, (), now)  # (no reference without its count: the plan saw to it)
            sync_active(conn, sid, stamps)
            for carried in rf.line_receipts:
                restore_receipt(conn, sid, carried, now_ms=now)
            write_sync_mark(conn, sid, mark, now)

        await ctx.db(quick_op, durable=True)
        _memo(ctx, rf)
        ctx.cache[MARK] = mark
        ctx.cache[ROOT_ALIASES] = RootAliases(mark.epoch, mark.upto, {k: set(v) for k, v in mark.aliases.items()})
        return None
    live = live or await snapshot(ctx)
    revisions, transcript, file_len = ctx.paths.revisions, ctx.paths.transcript, ctx.file_len

    def files() -> tuple[RevisionFile, str, str]:
        # fingerprinted before it is read: an edit landing in between leaves a mark that no longer matches
        fingerprint = revisions_fingerprint(revisions)
        return read_revisions(revisions), fingerprint, transcript_tail(transcript, file_len)

    rf, fingerprint, tail = await ctx.io(files)
    stamps = live_stamps(live.messages)
    messages = live.messages
    _aliases_from(ctx, ctx.epoch, file_len, messages)  # the whole transcript is read here already
    aliases = ctx.cache[ROOT_ALIASES].by_family
    # a mark only for the file the snapshot read: the length the actor knows, at its epoch
    full_mark = SyncMark(ctx.epoch, file_len, tail, fingerprint, {k: sorted(v) for k, v in aliases.items()}) if (
        live.epoch == ctx.epoch and live.valid_length == file_len) else None

    def op(conn: Any) -> None:
        restore_rows(conn, sid, rf, messages, now)
        sync_active(conn, sid, stamps)
        for carried in rf.line_receipts:  # a row already there (the usual case) is left alone
            restore_receipt(conn, sid, carried, now_ms=now)
        if full_mark is not None:
            write_sync_mark(conn, sid, full_mark, now)
        else:
            drop_sync_mark(conn, sid)

    await ctx.db(op, durable=True)
    _memo(ctx, rf)
    ctx.cache[MARK] = full_mark
    return live


class Remark:
    """The :class:`SyncMark` a branch write leaves in its own transaction, so the next actor incarnation does
    not read the whole session for the host's own writes: the files as the write leaves them, provided they
    were what this incarnation's mark (``revisions.mark``) says before it (the revisions file byte for byte;
    the transcript's bytes before the length it covered, at its epoch). Otherwise (a file changed behind the
    host's back since, a write that moved no mark) the transaction drops the mark: the next incarnation syncs
    in full. A write that fails before its commit leaves the old mark, which its files no longer match."""

    def __init__(self, ctx: SessionContext, aliases: Mapping[str, Iterable[str]]) -> None:
        old = ctx.cache.get(MARK)
        self.old: SyncMark | None = old if isinstance(old, SyncMark) else None
        self.sid, self.epoch, self.file_len = ctx.sid, ctx.epoch, ctx.file_len
        self.transcript, self.revisions = ctx.paths.transcript, ctx.paths.revisions
        self.aliases = {family: set(ids) for family, ids in aliases.items()}
        self.intact = False
        self.new: SyncMark | None = None

    def before(self) -> None:
        """Worker thread, before the write touches a file."""
        old = self.old
        self.intact = old is not None and old.epoch == self.epoch and old.upto <= self.file_len and (
            transcript_tail(self.transcript, old.upto) == old.tail
            and revisions_fingerprint(self.revisions) == old.revisions)

    def after(self, epoch: str | None, upto: int) -> None:
        """Worker thread, once the write's files are durable: the transcript of ``epoch`` is ``upto`` long."""
        if self.intact:
            self.new = SyncMark(epoch, upto, transcript_tail(self.transcript, upto),
                                revisions_fingerprint(self.revisions),
                                {family: sorted(ids) for family, ids in self.aliases.items()})

    def write(self, conn: Any, now_ms: int) -> None:
        """In the write's transaction."""
        if self.new is not None:
            write_sync_mark(conn, self.sid, self.new, now_ms)
        else:
            drop_sync_mark(conn, self.sid)

    def done(self, ctx: SessionContext) -> None:
        ctx.cache[MARK] = self.new


def _memo(ctx: SessionContext, rf: RevisionFile) -> None:
    ctx.cache[LIVE_REFS] = rf.live_refs()
    ctx.cache[STORED] = rf.stored_digests()
    ctx.cache[CARRIED_ARTIFACTS] = artifacts.carried_of(rf.artifacts)
    ctx.cache[SYNCED] = True


@dataclass(frozen=True)
class QuickSync:
    """What :func:`_quick_sync` found: the revisions file, each row family's live stamp, the mark to write."""

    revisions: RevisionFile
    stamps: dict[str, int | None]
    mark: SyncMark


def _quick_sync(conn: Any, sid: str, transcript: str | os.PathLike[str], revisions: str | os.PathLike[str],
                epoch: str | None, file_len: int) -> QuickSync | None:
    """The sync of :func:`ensure_synced` without reading the transcript before the session's mark, or None
    when the files are not provably what the mark says (or the index cannot tell a family's live root)."""
    mark = read_sync_mark(conn, sid)
    if mark is None or mark.epoch != epoch or mark.upto > file_len:
        return None
    if transcript_tail(transcript, mark.upto) != mark.tail:
        return None
    fingerprint = revisions_fingerprint(revisions)
    if fingerprint != mark.revisions:
        return None
    rf = read_revisions(revisions)
    if any(entry.live and entry.message_count is None for entry in rf.entries.values()):
        return None  # a reference written before its count was kept counts the live suffix: read it
    aliases = {family: set(ids) for family, ids in mark.aliases.items()}
    end = mark.upto
    if end < file_len:  # the lines appended since: their root aliases (a new family root, an edit's line)
        scan = scan_from(Path(transcript), end, stop=file_len)
        note_root_aliases(aliases, (item.record for item in scan.messages))
        end = scan.end
    families = sorted({entry.root_user_id for entry in rf.entries.values()})
    roots = live_roots(conn, sid, transcript, families, aliases) if families else {}
    if roots is None:
        return None  # the index trails the file
    # live_stamps' rule: a family's stamp is that of the first live user message of that family
    stamps = {family: stamp_of(root).active for family, root in roots.items()
              if root is not None and family_of(root) == family}
    new_mark = SyncMark(epoch, end, transcript_tail(transcript, end), fingerprint,
                        {family: sorted(ids) for family, ids in aliases.items()})
    return QuickSync(rf, stamps, new_mark)


def _aliases_from(ctx: SessionContext, epoch: str | None, upto: int, records: Iterable[Mapping[str, Any]]) -> None:
    seen = RootAliases(epoch, upto)
    note_root_aliases(seen.by_family, records)
    ctx.cache[ROOT_ALIASES] = seen


async def _root_aliases(ctx: SessionContext) -> dict[str, set[str]]:
    """:class:`RootAliases` of the transcript as it is now: the lines appended since the last look read (only
    them), or the whole file when it was replaced by other means than :func:`commit_rewrite`."""
    seen = ctx.cache.get(ROOT_ALIASES)
    epoch, end, path = ctx.epoch, ctx.file_len, ctx.paths.transcript
    if not isinstance(seen, RootAliases) or seen.epoch != epoch or seen.upto > end:
        seen = RootAliases(epoch, 0)
        ctx.cache[ROOT_ALIASES] = seen
    if seen.upto < end:
        start = seen.upto
        try:
            scan = await ctx.io(lambda: scan_from(path, start, stop=end))
        except FileNotFoundError:
            return seen.by_family
        note_root_aliases(seen.by_family, (item.record for item in scan.messages))
        seen.upto = scan.end
    return seen.by_family


async def set_archived_deleted(ctx: SessionContext, message_id: str, deleted: bool) -> bool:
    """Tombstone (or restore) a message only an archived branch holds: one refreshed ``revision`` line
    per branch holding it (write + fsync), which a restore of the branch honours (seed 000 §3.3), with the
    request's receipt on it. False: no branch stored in full holds it. Asking for the state it has writes
    nothing; a retry whose receipt a branch line already carries (its row lost in a crash before the
    commit) writes nothing either, and a different request under that key is IDEMPOTENCY_CONFLICT."""
    await ensure_synced(ctx)
    path, faults, now = ctx.paths.revisions, ctx.faults, ctx.now()
    spellings = index.line_spellings(ctx.sid, message_id)
    receipt = file_record(ctx.receipt, messageId=message_id) if ctx.receipt is not None else None
    got = await ctx.io(lambda: archived_deletion_lines(path, spellings, deleted, created_at_ms=now, receipt=receipt))
    if got.carried is not None and ctx.receipt is not None:
        if (got.carried.get("fingerprint"), got.carried.get("method")) != (ctx.receipt.fingerprint,
                                                                          ctx.receipt.method):
            raise receipts_conflict(ctx.receipt, str(got.carried.get("method")))
        return True  # the request's own effect, durable before a crash took its row: answered the same
    if got.lines:
        ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: nothing is written after a failed fsync
        lines = got.lines

        def append() -> list[tuple[tuple[str, int], str]]:
            append_revision_lines(path, lines, faults=faults)
            # what archive() compares a branch leaving the transcript with: whole branches read back and
            # hashed, in the worker thread too
            return [(entry.key, payload_digest(entry)) for line in lines if (entry := entry_of_line(line)) is not None]

        stored = _stored(ctx)
        for key, digest in await ctx.io(append):
            stored[key] = digest
    return got.found


def _live_refs(ctx: SessionContext) -> set[tuple[str, int]]:
    refs = ctx.cache.setdefault(LIVE_REFS, set())
    assert isinstance(refs, set)
    return refs


def _stored(ctx: SessionContext) -> dict[tuple[str, int], str]:
    stored = ctx.cache.setdefault(STORED, {})
    assert isinstance(stored, dict)
    return stored


def _referenced(ctx: SessionContext, key: tuple[str, int]) -> None:
    """A ``revision_live`` line for ``key`` is durable: its newest record is a reference now."""
    _live_refs(ctx).add(key)
    _stored(ctx).pop(key, None)


async def archive(ctx: SessionContext, items: Sequence[Archive],
                  compactions: Sequence[Mapping[str, Any]] = (),
                  tombstones: Mapping[str, Mapping[str, Any]] | None = None,
                  roots: Mapping[str, Root | None] | None = None) -> int:
    """Append full ``revision`` lines (one write, one fsync) and forget their live references. Each line
    keeps the checkpoints of ``compactions`` anchored in its branch, the ids of its messages
    ``tombstones`` hides and the project root ``roots`` names for its messages (``LiveTranscript.roots``: the
    root each line stood under; ``store.revisions.ROOTS``): a restore writes all three again. Returns the time
    the lines carry (``createdAt``): a row the archive creates stores that time, as a rebuild reads it back."""
    now = ctx.now()
    if not items:
        return now
    stored = _stored(ctx)
    known = {(root, idx): stored.get((root, idx)) for root, idx, _, _ in items}
    hidden = deleted_ids(tombstones or {})
    path, faults = ctx.paths.revisions, ctx.faults

    def write() -> list[tuple[tuple[str, int], str]]:
        # whole branches serialized, read back and hashed (megabytes for a long one): this actor's worker
        # thread's work, in the hop that appends them, never the trio loop's
        lines = []
        written: list[tuple[tuple[str, int], str]] = []
        for root, idx, msgs, turns in items:
            ids = {msg["id"] for msg in msgs}
            extra: dict[str, Any] = {}
            comps = [dict(c) for c in compactions if c.get("throughMessageId") in ids]
            if comps:
                extra["compactions"] = comps
            deleted = sorted(ids & hidden)
            if deleted:
                extra["deleted"] = deleted
            line = revision_line(root, idx, msgs, turns, created_at_ms=now, extra=extra or None, roots=roots)
            entry = entry_of_line(line)
            digest = payload_digest(entry) if entry is not None else ""
            if digest and known[(root, idx)] == digest:
                continue  # durable already (an interrupted try of this rewrite wrote it): one line per variant
            lines.append(line)
            written.append(((root, idx), digest))
        if lines:
            append_revision_lines(path, lines, faults=faults)
        return written

    for key, digest in await ctx.io(write):
        stored[key] = digest
    refs = _live_refs(ctx)
    for root, idx, _, _ in items:
        refs.discard((root, idx))
    return now


def dropped_live_branches(
    ctx: SessionContext, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
    handled: set[tuple[str, int]], turns: Mapping[str, str],
) -> list[Archive]:
    """archive_dropped_live_branches: every referenced live branch the rewrite takes out of the live
    position its ``revision_live`` reference names: its root deleted, or kept without the stamp that
    marks it that variant (a ``replaceMessages`` sending the root without its pager meta), which would
    leave the reference naming a branch that is no longer live."""
    return dropped_branches(frozenset(_live_refs(ctx)), old, new, handled, turns)


def dropped_branches(
    refs: Iterable[tuple[str, int]], old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]],
    handled: set[tuple[str, int]], turns: Mapping[str, str],
) -> list[Archive]:
    """:func:`dropped_live_branches` over ``refs`` (the live references: a copy, so a worker thread may run it)."""
    out: list[Archive] = []
    for root, idx in sorted(refs):
        if (root, idx) in handled:
            continue
        pos = find_root(old, root)
        if pos is None or not names_live(old[pos], idx):
            continue  # a stale reference (a file restored from a backup): the live suffix is another variant
        npos = find_root(new, root)
        if npos is not None and new[npos]["id"] == old[pos]["id"] and stamp_of(new[npos]).active == idx:
            continue
        branch = [dict(m) for m in old[pos:]]
        ids = {m["id"] for m in branch}  # one lookup per turn entry, not a scan of the branch each (on the loop)
        out.append((root, idx, branch, {k: v for k, v in turns.items() if k in ids}))
    return out


def plan_for(live: LiveTranscript, messages: Sequence[Mapping[str, Any]], *,
             shown: set[str] | frozenset[str] = frozenset(),
             restored: Sequence[Mapping[str, Any]] = (),
             hide: Iterable[str] = (),
             restored_roots: Mapping[str, Root] | None = None) -> RewritePlan:
    """``shown``: messages whose tombstone the rewrite drops (a restored branch's, an import hid);
    ``restored``: a restored branch's checkpoints, written again after the live ones; ``hide``: a
    restored branch's messages the user had deleted (their tombstones are written again);
    ``restored_roots``: the roots a restored branch's messages stood under (its revision line's
    ``roots``), which the rewrite writes them back under (a message without one: the session's root)."""
    tombstones = {k: v for k, v in live.tombstones.items() if k not in shown} if shown else dict(live.tombstones)
    for mid in hide:
        tombstones[mid] = {"type": "tombstone", "id": f"t-{mid}", "messageId": mid, "deleted": True}
    held = {c.get("id") for c in live.compactions}
    compactions = [*live.compactions, *(c for c in restored if c.get("id") not in held)]
    return plan_rewrite(messages, compactions, tombstones=tombstones, session_info=live.session_info,
                        decisions=live.decisions, opaque=live.unknown,
                        roots={**live.roots, **restored_roots} if restored_roots else live.roots, root=live.root)


async def commit_rewrite(
    ctx: SessionContext,
    live: LiveTranscript,
    plan: RewritePlan,
    finish: Callable[[Any, int, Faults | None], Any],
    *,
    archives: Sequence[Archive] = (),
    turn_overrides: Mapping[str, str] | None = None,
    receipt_extra: Mapping[str, Any] | None = None,
    restored_archives: Sequence[RestoredArchive] = (),
    restored_roots: Mapping[str, Root] | None = None,
) -> Any:
    """Archive → atomic rewrite (receipt in the header) → one reindex transaction.

    ``turn_overrides``: the owning turns of lines the new file brings back that the index no longer holds (a
    switch to a stored branch: its ``turns`` map, turns that had a row when it was archived); each of those turns
    that has no row now gets one, as a rebuild from the files would give it (``reconcile.restore_lost_turns``,
    ``INDEX_LOST``): after a lost database the revisions file was the only place of such a turn, and the
    rebuild restored only the turns the transcript's lines named.

    Returns ``finish(conn, now, faults)``'s value: the response, stored with the receipt. Keyed, the
    header's receipt carries it (``extra.response``: a retry after the database was lost is answered
    with it, not with the session as it is then), computed before the file is written by a dry run of
    the commit's steps in the DB writer (rolled back, ``index.dry_run``): behind every index op of the
    session's earlier lines (the writer runs ops in the order they came), with the row as the reindex
    leaves it (``as_reindexed``: its message count; the answer reads no message row), and
    ``finish(conn, now, None)``: no fault point, nothing kept for after the commit. One more round trip
    for a keyed rewrite, no fsync; unkeyed ones as before.
    """
    remark = Remark(ctx, {})
    await ctx.io(remark.before)
    archived_at = await archive(ctx, archives, live.compactions, live.tombstones, live.roots)
    dated = [(item, archived_at) for item in archives]
    restored = {**live.roots, **restored_roots} if restored_roots else live.roots
    for item, comps, deleted in restored_archives:  # lines of a restored branch: its own checkpoints and deletions
        dated.append((item, await archive(ctx, [item], comps, {mid: {"deleted": True} for mid in deleted},
                                          restored)))
    path, sid, faults = ctx.paths.transcript, ctx.sid, ctx.faults
    stamps = live_stamps(plan.messages)
    now = ctx.now()

    def then(conn: Any, faults: Faults | None = faults) -> Any:
        for (root, idx, msgs, _), at in dated:  # a new row's createdAt is its line's (a rebuild reads that)
            upsert_row(conn, sid, root, idx, message_count=len(msgs), now_ms=at)
        sync_active(conn, sid, stamps)
        return finish(conn, now, faults)

    def restore_owning_turns(conn: Any, records: Sequence[Mapping[str, Any]]) -> None:
        if turn_overrides:  # before the rows go: a line the index holds names no lost turn
            restore_lost_turns(conn, sid, [{"id": rec["id"], "turnId": turn_overrides[rec["id"]],
                                            "createdAt": rec.get("createdAt")}
                                           for rec in records if rec.get("id") in turn_overrides])

    receipt = answer = None
    if ctx.receipt is not None:
        def dry(conn: Any) -> Any:
            restore_owning_turns(conn, plan.messages)
            as_reindexed(conn, sid, plan)
            index.touch_session(conn, sid, now)
            return then(conn, None)

        answer = await ctx.db(lambda conn: index.dry_run(conn, dry), durable=False)
        receipt = file_record(ctx.receipt, **dict(receipt_extra or {}), response=answer)
    carried = CarriedAnswer(answer)
    made: list[Rewritten] = []
    # the artifact rows no line of the new file gives back: a line the rewrite cuts leaves no file, and its row
    # stays listed (seed 003 §4.10), so the revisions file carries it for an index rebuilt from the files
    await carry_artifacts(ctx, plan)

    def write() -> Rewritten:
        # the old header's receipts ride on: a later rewrite must not leave an earlier one only in SQLite
        # and the deliver answers of collaboration input lines (the old header's, and those of lines it drops)
        # and the receipts of keyed appends whose lines it drops, which those lines were the only place of
        kept = [*live.receipts, *dropped_append_receipts(sid, live.messages, plan.messages)]
        made.append(apply_rewrite(path, sid, live.created_at_ms, plan, receipt=receipt, carried=kept,
                                  faults=faults, dropped_offsets=[*live.dropped_offsets, *plan.left_out],
                                  now_ms=now, delivered=carried_delivered(live.delivered, live.messages,
                                                                          plan.messages)))
        # the new file's lines are these: listRevisions reads none of them to find its families' roots
        note_root_aliases(remark.aliases, (item.record for item in made[-1].messages))
        remark.after(made[-1].epoch, made[-1].file_len)
        return made[-1]

    def reindexed(conn: Any, rewritten: Rewritten) -> None:
        restore_owning_turns(conn, [item.record for item in rewritten.messages])
        reindex(conn, sid, rewritten, now_ms=now, turn_overrides=turn_overrides)
        index.touch_session(conn, sid, now)
        remark.write(conn, now)

    result = await ctx.rewrite_file(write, reindexed, lambda conn: carried.give(then(conn)),
                                    fault="rewrite.before_reindex")  # keyed: the answer the header carries
    carried.check(ctx.method)
    remark.done(ctx)
    ctx.cache[ROOT_ALIASES] = RootAliases(made[-1].epoch, made[-1].file_len, remark.aliases)
    ctx.publish("session.updated", {"session": index.public_session(ctx.row)})
    return result


async def carry_artifacts(ctx: SessionContext, plan: RewritePlan) -> None:
    """Before a rewrite writes ``plan``: the session's artifact rows that neither its lines nor the revisions
    file's ``artifact`` lines give back any more (``store.artifacts.rows_to_carry``: those whose last line the
    rewrite takes out, those an older host's header carried) are appended to the revisions file, one ``artifact``
    line each, fsynced before the transcript is replaced. The revisions file, append-only and read whole by a
    rebuild, holds any number of them (a header held at most 256, within 64 KiB), and a row is carried once.
    The rows the file carries are memoized per incarnation (``revisions.artifacts``, from :func:`ensure_synced`'s
    read; else read here), read behind every acknowledged append's index op."""
    memo = ctx.cache.get(CARRIED_ARTIFACTS)
    known: dict[str, artifacts.Carried] | None = memo if isinstance(memo, dict) else None
    sid, path, faults = ctx.sid, ctx.paths.revisions, ctx.faults

    def carry(conn: Any) -> dict[str, artifacts.Carried]:
        lines = list(zip(plan.messages, plan.message_roots or [None] * len(plan.messages), strict=True))
        held = known if known is not None else artifacts.carried_of(read_revisions(path).artifacts)
        rows = artifacts.rows_to_carry(conn, sid, lines, held)
        if rows:
            append_revision_lines(path, [artifact_line(row) for row in rows], faults=faults)
        return {**held, **{row["path"]: (row["op"], row["turnId"], row["updatedAt"]) for row in rows}}

    ctx.cache[CARRIED_ARTIFACTS] = await ctx.io_with_reader(carry)


def _session(conn: Any, sid: str) -> dict[str, Any]:
    return index.public_session(index.require_session(conn, sid))


def _next_index(rows: Sequence[Mapping[str, Any]]) -> int:
    return max((int(r["revisionIndex"]) for r in rows), default=0) + 1


# ---------------------------------------------------------------------- session.saveActiveRevision


async def resolve_family(ctx: SessionContext, root_user_id: str) -> str:
    """The family key as stored: the client's id, or its D444 spelling when that is what this session holds
    (a live message of that spelling, else a family its branch rows key by it: an archived root)."""
    found: str | None = await ctx.read(index.resolve_id, ctx.sid, root_user_id)
    if found is not None:
        return found
    family: str = await ctx.read(family_key, ctx.sid, root_user_id)
    return family


async def _locate_root(ctx: SessionContext, family: str) -> tuple[int, dict[str, Any], int]:
    """(position, newest root record, live message count) — index fast path, full read otherwise."""
    sid = ctx.sid
    total = int(ctx.row["messageCount"])
    hit = (await ctx.read(index.lookup_ids, [family])).get(family)
    if hit is not None and hit[0] == sid:
        blob = (await ctx.io(read_spans, ctx.paths.transcript, [(hit[2], hit[3])]))[0]
        rec = loads_line(blob)
        if rec.get("role") == "user" and family_of(rec) == family:
            return hit[1] - 1, rec, total
    live = await snapshot(ctx)
    pos = find_root(live.messages, family)
    if pos is None:
        raise MessageNotFound(f"no live user message roots revision family {family} in session {sid}",
                              data={"sessionId": sid, "messageId": family})
    return pos, live.messages[pos], len(live.messages)


async def save_active(ctx: SessionContext, p: m.SaveActiveRevisionParams, key: ReceiptKey | None) -> Any:
    ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: nothing is written after a failed fsync
    await ensure_synced(ctx)
    if key is not None:
        # the receipt a crash before the commit left on the reference line only, restored just now
        found = await ctx.read(receipts.check, key)
        if found is not None:
            return found["response"]
    sid = ctx.sid
    pos, root, total = await _locate_root(ctx, await resolve_family(ctx, p.root_user_id))
    family = family_of(root)
    rows = await ctx.read(revision_rows, sid, family)
    known = {int(r["revisionIndex"]) for r in rows}
    stamped = stamp_of(root).active
    # D307: refresh the stamped variant; a stamped variant with no row yet is its own new variant.
    idx = stamped if stamped in known else _next_index(rows)
    count = len(known | {idx})
    message_count = total - pos
    now = ctx.now()
    # 1. the pager stamp: a same-id replacement line (keep-last at first position), only if it changes
    stamped_rec = with_stamp(root, count=count, active=idx, root=family)
    stamp = [dumps_line(stamped_rec)] if stamped_rec != root else []
    # 3. index: the stamp line's op (the root row's span), the branch row (+ is_active flip), the receipt
    def made(conn: Any) -> Any:
        upsert_row(conn, sid, family, idx, message_count=message_count, now_ms=now, active=True)
        info = next(r for r in revision_rows(conn, sid, family) if r["revisionIndex"] == idx)
        return {"revision": info}

    # keyed: the reference line carries the receipt with the answer, asked of a rolled-back run of the op
    # before the line is written (a retry after the database was lost is answered with it, writes nothing)
    answer = None if key is None else await ctx.db(lambda conn: index.dry_run(conn, made), durable=False)
    receipt = None if key is None else file_record(key, response=answer)
    carried = CarriedAnswer(answer)

    remark = Remark(ctx, await _root_aliases(ctx))
    note_root_aliases(remark.aliases, [stamped_rec])

    def op(conn: Any, refs: Any = None) -> Any:
        remark.write(conn, now)
        return carried.give(made(conn))

    # 2. the constant-size reference line, after the stamp line (same worker-thread hop)
    path, faults, transcript, epoch = ctx.paths.revisions, ctx.faults, ctx.paths.transcript, ctx.epoch

    def reference() -> None:
        remark.before()  # (the stamp line went after the bytes it looks at)
        # the count rides in the line: a rebuilt row reads back what this one stores
        line = revision_live_line(family, idx, created_at_ms=now, message_count=message_count, receipt=receipt)
        append_revision_lines(path, [line], faults=faults)
        remark.after(epoch, os.stat(transcript).st_size)  # the stamp line is the transcript's last

    if stamp:
        done = await ctx.append_lines(Lines(stamp, records=[stamped_rec]), then=op, touch=False,
                                      after_write=reference)
        _referenced(ctx, (family, idx))
        result = done.value
    else:
        await ctx.io(reference)
        _referenced(ctx, (family, idx))
        result = await ctx.commit(op)
    carried.check(ctx.method)
    remark.done(ctx)
    if stamp:
        ref = {**index.message_ref(sid, pos + 1, stamped_rec, None),
               "createdAt": rfc3339_to_ms(stamped_rec.get("createdAt"), now)}
        ctx.publish("session.message", {"message": ref, "record": wire_record(stamped_rec), "replaced": True})
    return result


# ---------------------------------------------------------------------- session.listRevisions


async def list_revisions(ctx: SessionContext, p: m.ListRevisionsParams, key: ReceiptKey | None) -> Any:
    await ensure_synced(ctx)
    family = None if p.root_user_id is None else await _family_named(ctx, p.root_user_id)
    rows = await ctx.read(revision_rows, ctx.sid, family)
    if rows:
        # a branch activateRevision cannot switch to is marked so (its family's live root, its reference):
        # the roots are looked up by the ids they can have, not found by reading every user message
        families = {str(row["rootUserId"]) for row in rows}
        aliases = await _root_aliases(ctx)
        wanted = {family: frozenset(aliases.get(family, ())) for family in families}
        roots = await ctx.io_with_reader(live_roots, ctx.sid, ctx.paths.transcript, families, wanted)
        if roots is None:  # the index trails the file: every live user message, read through it or the file
            users = await ctx.io_with_reader(_live_user_records, ctx.sid, ctx.paths.transcript,
                                             int(ctx.row.get("createdAt") or 0))
            roots = {family: None if (pos := find_root(users, family)) is None else users[pos]
                     for family in families}
        refs = _live_refs(ctx)
        for row in rows:
            root, idx = str(row["rootUserId"]), int(row["revisionIndex"])
            why = branch_unavailable(roots[root], (root, idx) in refs, idx)
            if why is not None:
                row["unavailable"] = why
    return {"revisions": rows}


def _live_user_records(conn: Any, sid: str, path: str | os.PathLike[str], created: int) -> list[dict[str, Any]]:
    """The live user messages in transcript order (newest line of each), read through the index's spans;
    the whole transcript when a row has none or a span does not hold a user line."""
    spans = user_line_spans(conn, sid)
    if spans is not None:
        try:
            records = [loads_line(blob) for blob in read_spans(path, spans)]
        except (CorruptData, ValueError):  # a span past the end or off a line: the index trails the file
            records = []
        if len(records) == len(spans) and all(rec.get("role") == "user" for rec in records):
            return records
    return [rec for rec in load_live(path, default_created_ms=created).messages if rec.get("role") == "user"]


async def _family_named(ctx: SessionContext, root_user_id: str) -> str:
    """The family key ``root_user_id`` names, as ``saveActiveRevision`` / ``activateRevision`` resolve
    it: a live user message named by its own id (an edit under a new id: ``meta.revisionRootId``
    names the original) is in the family it stamps; any other id is the family key itself (a family
    whose root is archived is listed too, so no live root is required)."""
    family = await resolve_family(ctx, root_user_id)
    hit = (await ctx.read(index.lookup_ids, [family])).get(family)
    if hit is None or hit[0] != ctx.sid:
        return family
    rec = loads_line((await ctx.io(read_spans, ctx.paths.transcript, [(hit[2], hit[3])]))[0])
    return family_of(rec) if rec.get("role") == "user" else family


# ---------------------------------------------------------------------- session.activateRevision


async def activate(ctx: SessionContext, p: m.ActivateRevisionParams, key: ReceiptKey | None) -> Any:
    ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: nothing is written after a failed fsync
    live = await snapshot(ctx)
    await ensure_synced(ctx, live)
    sid = ctx.sid
    target_idx = p.revision_index
    rpos = find_root(live.messages, await resolve_family(ctx, p.root_user_id))
    if rpos is None:
        raise MessageNotFound(f"no live user message roots revision family {p.root_user_id} in session {sid}",
                              data={"sessionId": sid, "messageId": p.root_user_id})
    root = live.messages[rpos]
    family = family_of(root)
    rf = await ctx.io(read_revisions, ctx.paths.revisions)
    target = rf.get(family, target_idx)
    if target is None:
        raise NotFound(f"revision {target_idx} of family {family} does not exist",
                       data={"sessionId": sid, "rootUserId": family, "revisionIndex": target_idx})
    rows = await ctx.read(revision_rows, sid, family)
    known = {int(r["revisionIndex"]) for r in rows} | {e.revision_index for e in rf.family(family)}
    stamped = stamp_of(root).active
    current = stamped if stamped in known else None
    if current == target_idx:
        # already live: nothing is written, no line and no event. Keyed, its receipt is a database row only
        # (there is no effect for it to ride with, as a trash or restore that changes nothing): a retry is
        # answered with it, a restart included; after the database was lost, with the session as it is then
        if key is None:
            return {"session": index.public_session(await ctx.read(index.require_session, sid)), "revisions": rows}
        return await ctx.commit(lambda conn: {"session": _session(conn, sid),
                                              "revisions": revision_rows(conn, sid, family)})
    if target.live:
        raise CorruptData(
            f"revision {target_idx} of family {family} is only a live reference but is not the live branch",
            data={"sessionId": sid, "rootUserId": family, "revisionIndex": target_idx})
    turns = await ctx.read(turn_map, sid)
    # comparing the live branch with its stored variant and merging the restored one copy and compare whole
    # branches (O(session)): in this actor's worker thread, not on the trio loop (as the rewrite's plan below)
    refs = frozenset(_live_refs(ctx))
    switch = await ctx.io(plan_switch, sid, live, rpos, rf, family, known, current, target_idx, target, turns, refs)
    # ids of the branch another session took since it left the transcript (the revisions file reserves none)
    # come back as an append of them is stored: under this session's D444 spelling
    taken = await foreign_ids(ctx, switch.restored_ids)
    if taken:
        switch = await ctx.io(plan_switch, sid, live, rpos, rf, family, known, current, target_idx, target, turns,
                              refs, frozenset(taken))
    await _check_foreign_ids(ctx, switch.restored_ids)
    new_msgs, shown, descent = switch.new_msgs, switch.shown, switch.descent
    # the whole transcript serialized: this actor's worker thread's work, not the trio loop's (as below)
    plan = await ctx.io(lambda: plan_for(live, new_msgs, shown=shown, restored=descent.compactions,
                                         hide=descent.deleted, restored_roots=descent.roots))

    def finish(conn: Any, now: int, faults: Faults | None) -> Any:
        return {"session": _session(conn, sid), "revisions": revision_rows(conn, sid, family)}

    return await commit_rewrite(ctx, live, plan, finish, archives=switch.archives, turn_overrides=descent.turns,
                                receipt_extra={"rootUserId": family}, restored_archives=descent.archives,
                                restored_roots=descent.roots)


@dataclass(frozen=True, slots=True)
class Switch:
    """What ``activateRevision`` rewrites the transcript to (:func:`plan_switch`)."""

    archives: list[Archive]
    new_msgs: list[dict[str, Any]]
    restored_ids: list[str]
    shown: set[str]
    descent: Descent


def plan_switch(sid: str, live: LiveTranscript, rpos: int, rf: RevisionFile, family: str, known: set[int],
                current: int | None, target_idx: int, target: RevisionEntry, turns: Mapping[str, str],
                refs: frozenset[tuple[str, int]], taken: frozenset[str] = frozenset()) -> Switch:
    """``activateRevision``'s pure part, run in the session's worker thread: the live branch compared with
    its stored variant (stored first unless the file holds exactly it), the restored branch on its newest
    descendants merged after the messages before the root, and the live branches the switch drops.
    ``taken``: restored ids another session holds, which come back respelled (:func:`store.revisions.respell`)."""
    hidden = hidden_by_import(sid, live.tombstones)  # other branches of an imported tree: stored apart
    live_branch = [dict(msg) for msg in live.messages[rpos:] if msg["id"] not in hidden]
    if current is not None:
        live_idx = current
    else:  # an unsaved live branch: the next variant, unless an interrupted try of this switch stored it
        # already (its revisions line durable, the rewrite that would have stamped the root not made)
        again = stored_as(rf, family, live_branch)
        live_idx = again if again is not None else max(known, default=0) + 1
    branch_ids = {msg["id"] for msg in live_branch}
    # 1. materialize the live branch as a full revision line first (it is about to leave),
    #    unless the file already holds exactly this branch for its variant
    stored = rf.get(family, live_idx)
    archives: list[Archive] = []
    live_deleted = branch_ids & deleted_ids(live.tombstones)
    if (stored is None or stored.live or _unstamped(stored.messages) != _unstamped(live_branch)
            or stored.deleted != live_deleted):
        archives.append((family, live_idx, live_branch, {k: v for k, v in turns.items() if k in branch_ids}))
    restored = [dict(msg) for msg in target.messages]
    if restored and restored[0].get("role") == "user":
        restored[0] = with_stamp(restored[0], count=len(known | {live_idx}), active=target_idx, root=family)
    restored, descent = newest_descendants(rf, family, restored, target)
    if taken:
        spelled = respell(sid, taken, restored, descent.turns, descent.compactions, descent.deleted)
        restored, descent.turns, descent.compactions, descent.deleted = (
            spelled.messages, spelled.turns, spelled.compactions, spelled.deleted)
    merged: dict[str, dict[str, Any]] = {}
    for rec in live.messages[:rpos] + restored:
        merged[rec["id"]] = rec  # keep-last content at first position (the reader rule)
    new_msgs = list(merged.values())
    archives += dropped_branches(refs, live.messages, new_msgs, {(family, live_idx)}, turns)
    shown = hidden & ({msg["id"] for msg in restored} | {str(c["id"]) for c in descent.compactions})
    _settle_deletions(live_branch, live_deleted, restored, descent, shown)
    return Switch(archives, new_msgs, [msg["id"] for msg in restored], shown, descent)


def _settle_deletions(live_branch: Sequence[Mapping[str, Any]], live_deleted: set[str],
                      restored: Sequence[Mapping[str, Any]], descent: Descent, shown: set[str]) -> None:
    """Seed 000 §3.3: a tombstone is one node's. A restored message with the id of one leaving the transcript
    is the same node when it holds the same content (the prompt both replies of a regenerate share): its
    deletion state is the one it has now, not the one stored when its branch left (a restore since then
    stays). Holding other content (an edit that reused the id), it is another node: the leaving one's
    tombstone is not its own (dropped: ``shown``), and it comes back as its branch stored it.
    Updates ``descent.deleted`` (the tombstones written again) and ``shown`` in place."""
    leaving = {str(msg["id"]): msg for msg in live_branch}
    for rec in restored:
        mid = str(rec["id"])
        twin = leaving.get(mid)
        if twin is None:
            continue
        if (twin.get("role"), twin.get("blocks")) == (rec.get("role"), rec.get("blocks")):
            if mid in live_deleted:
                descent.deleted.add(mid)
            else:
                descent.deleted.discard(mid)
        elif mid in live_deleted and mid not in descent.deleted:
            shown.add(mid)


@dataclass
class Descent:
    """What a restored branch brings back once each family rooted inside it is on its newest variant."""

    turns: dict[str, str]
    compactions: list[dict[str, Any]]
    deleted: set[str]
    archives: list[RestoredArchive] = field(default_factory=list)
    roots: dict[str, Root] = field(default_factory=dict)
    """The project root each restored message's line stood under (its branch line's ``roots``)."""


def newest_descendants(rf: RevisionFile, family: str, restored: list[dict[str, Any]],
                       target: RevisionEntry) -> tuple[list[dict[str, Any]], Descent]:
    """Seed 000 §3.2: "The branch selector ... follows the newest default descendants when switching." Below
    the root the switch names, every family of the restored branch comes back on its newest stored variant
    (the highest revision index: variants are numbered in the order they were made), not on the one that
    was live when the branch left the transcript. That one is stored first (a full ``revision`` line over
    its own index, with its checkpoints and deletions, unless the file holds exactly it), so the pager can
    bring it back. Deeper families of the variant taken are followed the same way."""
    out = list(restored)
    descent = Descent(turns=dict(target.turns), compactions=[dict(c) for c in target.compactions],
                      deleted=set(target.deleted), roots=dict(target.roots))
    indices: dict[str, set[int]] = {}
    newest_of: dict[str, RevisionEntry] = {}
    for (fam_key, idx), entry in rf.entries.items():  # once: a branch may hold many user messages
        indices.setdefault(fam_key, set()).add(idx)
        if not entry.live and entry.messages and (
                fam_key not in newest_of or idx > newest_of[fam_key].revision_index):
            newest_of[fam_key] = entry
    seen = {family}
    i = 1
    while i < len(out):
        rec = out[i]
        fam = family_of(rec) if rec.get("role") == "user" else None
        if fam is None or fam in seen:
            i += 1
            continue
        seen.add(fam)
        active = stamp_of(rec).active
        newest = newest_of.get(fam)
        if active is None or newest is None or newest.revision_index <= active:
            i += 1
            continue
        tail = out[i:]
        ids = {m["id"] for m in tail}
        comps = [c for c in descent.compactions if c.get("throughMessageId") in ids]
        gone = frozenset(descent.deleted & ids)
        stored = rf.get(fam, active)
        if (stored is None or stored.live or _unstamped(stored.messages) != _unstamped(tail)
                or stored.deleted != gone):
            turns = {k: v for k, v in descent.turns.items() if k in ids}
            descent.archives.append(((fam, active, [dict(m) for m in tail], turns), comps, gone))
        count = max(stamp_of(rec).count or 0, len(indices.get(fam, ())))
        taken = [dict(m) for m in newest.messages]
        taken[0] = with_stamp(taken[0], count=count, active=newest.revision_index, root=fam)
        out = out[:i] + taken
        descent.turns = {k: v for k, v in descent.turns.items() if k not in ids} | dict(newest.turns)
        descent.compactions = [c for c in descent.compactions if c.get("throughMessageId") not in ids] + [
            dict(c) for c in newest.compactions]
        descent.deleted = (descent.deleted - ids) | set(newest.deleted)
        descent.roots.update(newest.roots)
        i += 1
    return out, descent


def _unstamped(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages without the pager stamp (presentation metadata a restore sets afresh)."""
    out = []
    for msg in messages:
        rec = dict(msg)
        meta = rec.get("meta")
        if isinstance(meta, Mapping):
            rec["meta"] = {k: v for k, v in meta.items() if k not in ("revisionCount", "activeRevision")}
        out.append(rec)
    return out


async def foreign_ids(ctx: SessionContext, ids: Sequence[str]) -> set[str]:
    """The ids another session holds: in the index, or in its acknowledged appends the index does not
    cover yet (asked first: one settled before the read is in the read's snapshot), as an append asks."""
    pending = ctx.index_log.held(ids)
    known = await ctx.read(index.lookup_ids, ids)
    return ({mid for mid, hit in known.items() if hit[0] != ctx.sid}
            | {mid for mid, held in pending.items() if held.session_id != ctx.sid})


async def _check_foreign_ids(ctx: SessionContext, ids: Sequence[str]) -> None:
    foreign = sorted(await foreign_ids(ctx, ids))
    if foreign:
        raise Conflict(f"message id {foreign[0]} belongs to another session",
                       data={"sessionId": ctx.sid, "messageId": foreign[0]})


# ---------------------------------------------------------------------- session.truncateFrom


async def truncate_from(ctx: SessionContext, p: m.TruncateFromParams, key: ReceiptKey | None) -> Any:
    ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: nothing is written after a failed fsync
    live = await snapshot(ctx)
    await ensure_synced(ctx, live)
    sid = ctx.sid
    pos = resolve_position(live, sid, p.message_id)
    if pos is None:
        raise MessageNotFound(f"message {p.message_id} is not in session {sid}; nothing was cut",
                              data={"sessionId": sid, "messageId": p.message_id})
    old = live.messages
    if p.mode in ARCHIVE_MODES and collab.is_collaboration_input(old[pos]):
        done = {"edit": "edited", "retry": "resent", "regenerate": "regenerated"}[p.mode]
        raise PermissionDenied(f"message {p.message_id} is collaboration input from another session; it cannot "
                               f"be {done} as the user's own", data={"sessionId": sid, "messageId": p.message_id})
    new_msgs = [dict(msg) for msg in old[:pos]]
    turns = await ctx.read(turn_map, sid)
    archives: list[Archive] = []
    handled: set[tuple[str, int]] = set()
    if p.mode in ARCHIVE_MODES:
        rpos = root_before(old, pos)
        if rpos is not None:
            root = old[rpos]
            family = family_of(root)
            rows = await ctx.read(revision_rows, sid, family)
            known = {int(r["revisionIndex"]) for r in rows}
            stamped = stamp_of(root).active
            hidden = hidden_by_import(sid, live.tombstones)  # other branches of an imported tree: stored apart
            branch = [dict(msg) for msg in old[rpos:] if msg["id"] not in hidden]
            if stamped in known:
                idx = stamped  # refresh the stamped variant
            else:  # mint an inactive variant, unless an interrupted try of this cut already stored it
                again = None
                if known:
                    stored = await ctx.io(read_revisions, ctx.paths.revisions)
                    again = stored_as(stored, family, branch)
                idx = again if again is not None else _next_index(rows)
            ids = {msg["id"] for msg in branch}
            archives.append((family, idx, branch, {k: v for k, v in turns.items() if k in ids}))
            handled.add((family, idx))
            if rpos < pos:  # the root stays: its pager now counts the variant about to be generated
                after = known | {idx}
                new_msgs[rpos] = with_stamp(root, count=len(after) + 1, active=max(after) + 1, root=family)
    archives += dropped_live_branches(ctx, old, new_msgs, handled, turns)
    plan = await ctx.io(plan_for, live, new_msgs)
    removed = len(old) - pos
    # The in-flight checkpoint belongs to the reply being cut; drop it before the rewrite so the
    # boot sweep can never promote it back after the cut.
    await ctx.io(remove_file_durable, ctx.paths.inflight)

    aftermath: list[tuple[list[str], turn_aftermath.Aftermath]] = []

    def finish(conn: Any, now: int, faults: Faults | None) -> Any:
        aborted = abort_running(conn, sid, now)  # and what those turns still asked or ran ends with them
        settled = turn_aftermath.settle(conn, sid, aborted, "aborted", None, now, faults or NO_FAULTS)
        if faults is not None:  # not a dry run: published after the commit
            aftermath.append((aborted, settled))
        return {"session": _session(conn, sid), "removed": removed}

    result = await commit_rewrite(ctx, live, plan, finish, archives=archives, receipt_extra={"removed": removed})
    if aftermath:
        aborted, moved = aftermath[-1]
        for turn in await ctx.read(lambda conn: [get_turn(conn, t) for t in aborted]):
            if turn is not None:
                ctx.publish("turn.ended", {"turn": {k: v for k, v in turn.items() if v is not None}})
        turn_aftermath.publish(ctx, moved)
    return result


# ---------------------------------------------------------------------- session.replaceMessages


async def replace_messages(ctx: SessionContext, p: m.ReplaceMessagesParams, key: ReceiptKey | None) -> Any:
    ctx.refuse_if_storage_failed()  # RELIABILITY rule 7: nothing is written after a failed fsync
    now = ctx.now()
    recs: list[dict[str, Any]] = []
    for i, msg in enumerate(p.messages):
        try:
            recs.append(normalize_message(msg.model_dump(by_alias=True, exclude_unset=True), now_ms=now))
        except InvalidInput as exc:
            exc.data.setdefault("index", i)
            raise
    ids = [r["id"] for r in recs]
    await _check_foreign_ids(ctx, ids)
    live = await snapshot(ctx)
    await ensure_synced(ctx, live)
    old_by_id = {msg["id"]: msg for msg in live.messages}
    collab.check_rewrite(old_by_id, recs)  # collaboration input is never stripped, edited or forged
    for i, rec in enumerate(recs):
        # an append's receipt, a collaboration input's deliver answer: they stay durable in the line
        recs[i] = with_internal_meta(rec, old_by_id.get(rec["id"], {}))
    for rec in recs:
        dumps_line(rec)  # an unencodable message fails here, before anything changed
    turns = await ctx.read(turn_map, ctx.sid)
    archives = dropped_live_branches(ctx, live.messages, recs, set(), turns)
    plan = await ctx.io(plan_for, live, recs)
    sid = ctx.sid

    def finish(conn: Any, now_ms: int, faults: Faults | None) -> Any:
        return {"session": _session(conn, sid)}

    return await commit_rewrite(ctx, live, plan, finish, archives=archives)
