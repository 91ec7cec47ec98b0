"""Bounded window reads of one transcript (seed 003 §5): positions, spans, projection.

A window is served from the index's byte spans (``messages.line_offset`` /
``line_len``): one read snapshot for the rows and the compaction chain, then
one sequential read of exactly the window's lines, so opening the newest page
of a 50,000-message session costs what a 50-message one costs. The reply is
encoded in the same call, from the lines' own bytes (``store/transcripts/window_reply.py``).
Everything here is synchronous and runs in a read-pool thread.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from pathlib import Path
from typing import Any

from store import approvals, attachments, session_state, thread_meta
from store.compaction import still_valid
from store.errors import PayloadTooLarge, StoreError
from store.indexing import index
from store.indexing.backlog import CATCH_UP_STEP_BYTES
from store.indexing.database import ReaderConnection
from store.indexing.reconcile import ReconcilePlan, clean_plan, open_transcript, plan_catch_up
from store.jsonio import loads_line
from store.rules import MAX_REPLY_BYTES
from store.transcripts.big_line import BIG_STRING, parse_capped
from store.transcripts.records import blocks_of, cap_content, wire_record
from store.transcripts.transcript import read_spans, read_transcript
from store.transcripts.window_reply import encode_window, with_field

__all__ = [
    "MAX_COALESCED_READ",
    "SPANS_MEMO_ROWS",
    "SPANS_MEMO_WINDOWS",
    "Window",
    "WindowRequest",
    "find_tool_call_line",
    "navigation_call_id",
    "navigation_parent",
    "newest_read_target",
    "prepare_reads",
    "read_cold",
    "read_spans_coalesced",
    "read_warm",
    "window_bounds",
]

MAX_COALESCED_READ = 4 * 1024 * 1024
SPANS_MEMO_WINDOWS = 8
"""Windows a pooled reader keeps the spans of (:func:`_spans`): a few pages of a few sessions."""
SPANS_MEMO_ROWS = 512
"""Rows of the longest window kept (a page of 50 or 200 is; a whole history is read again)."""


@dataclass(frozen=True, slots=True)
class WindowRequest:
    """Which window (validated by the wire model: at most one anchor)."""

    before: int | None = None
    start: int | None = None
    limit: int | None = None
    """``None``: the whole transcript."""
    content_limit: int | None = None
    around: str | None = None
    max_bytes: int | None = None
    """Byte budget of the window's transcript lines (``None``: unbounded): see :func:`fit_budget`."""


@dataclass
class Window:
    total: int = 0
    start: int = 0
    end: int = 0
    target_pos: int | None = None
    missing_target: bool = False
    row: dict[str, Any] | None = None
    plan_kind: str = ""
    file_len: int = 0
    epoch: str | None = None
    reply: bytes = b""
    """The encoded ``session.get`` result (``store/transcripts/window_reply.py``)."""
    target: dict[str, Any] | None = None
    """The projected ``messageAround`` target."""
    alone: bool = False
    """The page is one message whose line alone is over the budget, served cut to ``contentLimit``
    (:func:`fit_rows`); its encoded size is checked against the budget once it is encoded."""


def read_spans_coalesced(path: Path, spans: Sequence[tuple[int, int]], *, fd: int | None = None) -> list[bytes]:
    """``read_spans``, but ranges that lie back to back in the file are read with one pread.

    Consecutive message lines of an append-only transcript are adjacent, so a
    window (or a whole-session load) is one sequential read of exactly its
    lines instead of one system call per line (seed 003 §11.2). A merged read
    is capped at :data:`MAX_COALESCED_READ` bytes. ``fd``: ``path`` open already (left open).
    """
    merged: list[tuple[int, int]] = []
    for offset, length in spans:
        if merged:
            last_off, last_len = merged[-1]
            if last_off + last_len == offset and last_len + length <= MAX_COALESCED_READ:
                merged[-1] = (last_off, last_len + length)
                continue
        merged.append((offset, length))
    if len(merged) == len(spans):
        return read_spans(path, spans, fd=fd)
    out: list[bytes] = []
    pieces = iter(spans)
    for (_, total), blob in zip(merged, read_spans(path, merged, fd=fd), strict=True):
        view = memoryview(blob)
        pos = 0
        while pos < total:
            _, length = next(pieces)
            out.append(bytes(view[pos : pos + length]))
            pos += length
    return out


def window_bounds(total: int, req: WindowRequest, target_pos: int | None) -> tuple[int, int]:
    """Physical positions ``[start, end)`` of the window a request asks for (seed §5)."""
    limit = req.limit
    if target_pos is not None:
        lim = limit or 50
        start = max(0, target_pos - lim // 2)
        end = min(total, start + lim)
        return max(0, end - lim), end
    if req.start is not None:
        start = min(req.start, total)
        return start, total if limit is None else min(total, start + limit)
    end = total if req.before is None else max(0, min(req.before, total))
    return (0 if limit is None else max(0, end - limit)), end


EVICTED_ASK_FIRST = 64
"""A window of more rows than this, read with nothing known of the session's optional rows (the actor's read,
``index.EVERY_KIND``), asks first whether the session has an evicted reference (what ``read_cold`` knows from
its session row): the marks' join walks the window's rows, one probe each (0.4 ms for 5,000 with none to find)."""


def read_warm(conn: sqlite3.Connection, sid: str, path: Path, total: int, req: WindowRequest,
              session: Mapping[str, Any], *, derived_fresh: bool = False, now_ms: int | None = None,
              fd: int | None = None, present: index.Present = index.EVERY_KIND,
              memo: ReaderConnection | None = None) -> Window:
    """Target position, bounds, window rows, the compaction chain, and the encoded reply, in one snapshot.

    The bytes are read in the same call (not in a second worker-thread hop):
    the session actor is the transcript's only writer and awaits this call,
    so the offsets cannot move underneath it. Called by :func:`read_cold` without an actor
    (``sessions.get_direct``), every byte (message and compaction lines) is read through ``fd``,
    the file the snapshot's mark was checked against. ``derived_fresh``: ``session`` was read
    in this same snapshot with its derived fields (``read_cold``), so they are not derived again.
    ``fd``: the transcript, open already (``read_cold``); the caller closes it. ``present``: which of the
    session's optional rows exist in this snapshot (``read_cold`` read them with ``session``); the compaction,
    eviction and turn statements run only for kinds that have a row. ``memo``: ``conn``, whose spans memo
    holds for this snapshot (``read_cold`` asked its version first): the window's rows come from it.
    """
    w = Window(total=total)
    if req.around is not None:
        w.target_pos = index.position_of(conn, sid, req.around)
        if w.target_pos is None:
            w.missing_target = True
            return w
    w.start, w.end = window_bounds(total, req, w.target_pos)
    compactions = index.compaction_rows(conn, sid) if present.compactions else []
    if req.max_bytes is None:
        rows = _spans(conn, memo, sid, w.start, w.end)
    else:
        rows = fit_budget(conn, sid, w, req, sum(int(c[3]) for c in compactions), memo)
        if rows:
            w.start, w.end = rows[0][0] - 1, rows[-1][0]
    lines = read_spans_coalesced(path, [(c[2], c[3]) for c in compactions], fd=fd) if compactions else []
    if derived_fresh:
        summary = index.public_session(session)
    else:  # the summary's derived fields as this snapshot has them, not as the actor cached them
        summary = {k: v for k, v in index.public_session(session).items() if k not in session_state.DERIVED}
        summary.update(session_state.projections(conn, {sid: str(session.get("mode") or "agent")}, now_ms)[sid])
    if present is index.EVERY_KIND and len(rows) > EVICTED_ASK_FIRST:  # the actor's read: nothing known
        present = replace(present, evicted=index.has_evicted_refs(conn, sid))
    evicted = attachments.evicted_marks(conn, sid, rows[0][0], rows[-1][0]) if rows and present.evicted else None
    w.reply, w.target = encode_window(path, summary, rows, lines, start=w.start, end=w.end,
                                      total=total, content_limit=req.content_limit, target_pos=w.target_pos,
                                      evicted=evicted, fd=fd, cut_target=w.alone,
                                      lost=attachments.LostBlobs(conn, attachments.reader_memo(conn)))
    check_alone(w, req)
    turns = {r[4] for r in rows if r[4] is not None}
    if w.end >= total and present.turns:  # the newest window: also the turns that have no row yet (asked before
        turns.update(_turns_after(conn, sid, total))  # replying)
    if turns:
        found = approvals.decisions_for_turns(conn, sid, turns, now_ms)
        if found.items:
            w.reply = with_field(w.reply, "decisions", found.items)
        if found.unreadable:
            w.reply = with_field(w.reply, "unreadableDecisions", found.unreadable)
    return w


def _turns_after(conn: sqlite3.Connection, sid: str, total: int) -> list[str]:
    """The session's turns that started at or after its newest message (no row of theirs yet)."""
    return [r[0] for r in conn.execute(
        "SELECT id FROM turns WHERE session_id = ? AND started_at >= COALESCE((SELECT MAX(m.created_at) FROM "
        "messages m WHERE m.session_id = ? AND m.seq = ?), 0)", (sid, sid, total))]


def prepare_reads(conn: sqlite3.Connection) -> None:
    """Run every statement of a newest-page read once on a new read connection, for no session.

    The driver keeps each connection's prepared statements; a statement's
    first run on a connection parses and plans it, which made the first read
    of a host cost more than twice a later one. The read pool calls this as
    it opens a connection, so no request pays that: not the first read of a
    host, not the first read that lands on another pooled connection. The
    empty id is no session's
    (``store/rules.py``): every statement matches nothing and reads a page or
    two of an index. Only a statement left out here costs its parse on first
    use, as before.
    """
    none = ""
    index.session_row(conn, none)
    index.session_row_present(conn, none)
    session_state.projections(conn, {none: "agent"})
    thread_meta.attach(conn, [{"id": none}])
    index.compaction_rows(conn, none)
    index.window_spans(conn, none, 0, 0)
    attachments.evicted_marks(conn, none, 1, 0)
    _turns_after(conn, none, 0)
    approvals.decisions_for_turns(conn, none, [none], 0)
    conn.execute("BEGIN")  # read_cold's snapshot, dated by the version its spans memo holds for
    conn.execute("PRAGMA data_version")
    conn.execute("ROLLBACK")


def newest_read_target(conn: sqlite3.Connection) -> str | None:
    """The live session with messages that was updated last: the one a client most likely opens first
    after a restart (the host's read warm-up reads its newest page, ``sessions.warm_reads``)."""
    row = conn.execute("SELECT id FROM sessions WHERE deleted_at IS NULL AND last_seq > 0 "
                       "ORDER BY updated_at DESC LIMIT 1").fetchone()
    return None if row is None else str(row[0])


PER_MESSAGE_OVERHEAD = 64
"""Bytes a projected message may add to its transcript line (``seq``, ``deleted``, ``turnId``, commas)."""
_PAGING = ["messageBefore", "messageEnd", "messageLimit", "maxBytes", "contentLimit"]
_LEN = 2  # index of the line length in a window_spans row


def _spans(conn: sqlite3.Connection, memo: ReaderConnection | None, sid: str, start: int,
           end: int) -> list[Any]:
    """``index.window_spans``, from ``memo`` (a reader's spans memo, valid in this snapshot) when it holds them.

    A page read again while the index did not change (a client re-opening a session, the newest page read
    at each focus) costs a dictionary look-up instead of a statement and a row tuple per message: the rows
    are a function of the database's content, and ``PRAGMA data_version`` tells whether another connection
    committed since they were read. A new version empties the memo; it holds :data:`SPANS_MEMO_WINDOWS`
    windows of at most :data:`SPANS_MEMO_ROWS` rows each (the oldest leaves first): some 600 KB a reader."""
    if memo is None:
        return index.window_spans(conn, sid, start, end)
    key = (sid, start, end)
    rows = memo.spans_memo.get(key)
    if rows is None:
        rows = index.window_spans(conn, sid, start, end)
        if len(rows) > SPANS_MEMO_ROWS:
            return rows  # a long window (a whole history): not kept
        if len(memo.spans_memo) >= SPANS_MEMO_WINDOWS:
            del memo.spans_memo[next(iter(memo.spans_memo))]
        memo.spans_memo[key] = rows
    return list(rows)  # the caller's own list: the memo's is never handed out


def _memo_for(conn: sqlite3.Connection) -> ReaderConnection | None:
    """``conn`` when it is a pooled reader, its spans memo made valid for the snapshot just begun: its
    ``PRAGMA data_version``, asked first, starts the snapshot and dates it. ``None`` for any other connection."""
    if not isinstance(conn, ReaderConnection):
        return None
    version = conn.execute("PRAGMA data_version").fetchone()[0]
    if version != conn.spans_version:
        conn.spans_memo.clear()
        conn.spans_version = version
    return conn


def fit_budget(conn: sqlite3.Connection, sid: str, w: Window, req: WindowRequest,
               compaction_bytes: int, memo: ReaderConnection | None = None) -> list[Any]:
    """The rows of ``[w.start, w.end)`` whose lines fit ``req.max_bytes``, decided from the index alone
    (:func:`fit_rows` over the index's spans). ``memo``: as :func:`read_warm`'s."""

    def spans(newest_first: bool) -> Iterable[Any]:
        if req.limit is not None:  # at most MAX_WINDOW rows: read them all, then cut
            return _spans(conn, memo, sid, w.start, w.end)
        return index.iter_window_spans(conn, sid, w.start, w.end, newest_first=newest_first)

    return fit_rows(w, req, compaction_bytes, spans)


def fit_rows(w: Window, req: WindowRequest, compaction_bytes: int,
             spans: Callable[[bool], Iterable[Any]]) -> list[Any]:
    """The rows of ``[w.start, w.end)`` whose lines fit ``req.max_bytes``. ``spans(newest_first)``: the
    window's rows (seq, offset, length, ...), oldest first or newest first; read lazily by a window
    without a limit, so it never reads more rows than the budget holds. The index's reads and the
    transcript-alone read (:func:`read_file_window`) cut the same way.

    The budget counts the transcript bytes the reply is built from (every
    message line plus the compaction lines a window always carries), so the
    host never reads more than it may send. A window that does not fit is cut
    to a page: the newest messages for a backward window, the oldest for a
    forward one (``messageEnd``), the nearest ones for ``messageAround`` — the
    result's ``messageStart``/``messageEnd``/``hasMore*`` say where to go on. A
    request for the whole transcript that does not fit, or a page that cannot
    hold even one message, is ``PAYLOAD_TOO_LARGE`` naming the paging params.
    """
    budget = req.max_bytes
    assert budget is not None
    fixed = 512 + compaction_bytes
    if fixed > budget:
        raise PayloadTooLarge(
            f"the session's compaction checkpoints alone are {fixed} bytes, over the reply budget of {budget}",
            data={"limit": budget, "size": fixed, "field": "maxBytes"})
    room = budget - fixed
    if w.start >= w.end:
        return []
    whole = req.limit is None and req.start is None and req.before is None and req.around is None
    if req.limit is not None:
        listed = list(spans(False))
        rows = _fit_rows(listed, w, req, room)
        first = _first_kept(listed, w, req)
    else:
        newest_first = req.start is None and not whole
        rows = _cut(spans(newest_first), room)
        first = next(iter(spans(newest_first)), None) if not rows else None
        if len(rows) == w.end - w.start:
            return sorted(rows)
        if whole:
            raise PayloadTooLarge(
                f"the whole transcript ({w.end - w.start} messages) is over the reply limit of {budget} bytes: read "
                "it in pages (messageEnd with messageLimit or maxBytes, starting at 0, until hasMoreAfter is false; "
                "contentLimit cuts a message that is alone over the limit)",
                data={"limit": budget, "messages": w.end - w.start, "paging": _PAGING})
    if not rows:
        if req.around is not None and w.target_pos is not None:  # the page a cut window keeps first: the target
            first = next((r for r in spans(False) if int(r[0]) == w.target_pos + 1), first)
        if first is not None and req.content_limit is not None:
            # with contentLimit, a message whose line alone is over the budget comes alone, cut
            # (check_alone: its encoded size, not its line's, must fit)
            w.alone = True
            return [first]
        needed = fixed + (int(first[_LEN]) if first is not None else 0) + PER_MESSAGE_OVERHEAD
        if needed > MAX_REPLY_BYTES:
            raise PayloadTooLarge(
                f"one message of this window is {needed - fixed - PER_MESSAGE_OVERHEAD} bytes, over the largest "
                f"reply budget ({MAX_REPLY_BYTES} bytes): read it with contentLimit (its content is then cut to "
                "that many characters)",
                data={"limit": budget, "size": needed - fixed - PER_MESSAGE_OVERHEAD, "field": "contentLimit",
                      "paging": _PAGING})
        raise PayloadTooLarge(
            f"one message of this window is larger than the reply budget of {budget} bytes: maxBytes {needed} "
            "holds it (data.needed)",
            data={"limit": budget, "needed": needed, "field": "maxBytes", "paging": _PAGING})
    return sorted(rows)


def check_alone(w: Window, req: WindowRequest) -> None:
    """A page of one message served cut (:attr:`Window.alone`) whose reply is still over ``maxBytes``
    (what ``contentLimit`` does not cut, or a large ``contentLimit``) is ``PAYLOAD_TOO_LARGE``: with
    ``data.needed`` when a ``maxBytes`` the params accept holds it, else naming ``contentLimit``."""
    if not w.alone or req.max_bytes is None or len(w.reply) <= req.max_bytes:
        return
    size = len(w.reply)
    if size <= MAX_REPLY_BYTES:
        raise PayloadTooLarge(
            f"the message of this page, cut to contentLimit, is a {size}-byte reply, over the budget of "
            f"{req.max_bytes} bytes: maxBytes {size} holds it (data.needed)",
            data={"limit": req.max_bytes, "needed": size, "field": "maxBytes", "paging": _PAGING})
    raise PayloadTooLarge(
        f"the message of this page, cut to contentLimit {req.content_limit}, is still a {size}-byte reply, over "
        f"the largest reply ({MAX_REPLY_BYTES} bytes): a smaller contentLimit cuts more of it",
        data={"limit": req.max_bytes, "size": size, "field": "contentLimit", "paging": _PAGING})


def _first_kept(rows: Sequence[Any], w: Window, req: WindowRequest) -> Any:
    """The row a cut window keeps first (:func:`_fit_rows`): the target, the newest, or the oldest."""
    if not rows:
        return None
    if req.around is not None and w.target_pos is not None:
        return next((r for r in rows if int(r[0]) == w.target_pos + 1), rows[0])
    return rows[-1] if req.start is None else rows[0]


def _fit_rows(rows: list[Any], w: Window, req: WindowRequest, room: int) -> list[Any]:
    if sum(map(itemgetter(_LEN), rows)) + PER_MESSAGE_OVERHEAD * len(rows) <= room:  # the usual page: all fit
        return rows
    if req.around is not None and w.target_pos is not None:
        return _around(rows, w, room)
    return _cut(reversed(rows) if req.start is None else iter(rows), room)


def _cut(rows: Iterable[Any], room: int) -> list[Any]:
    """Rows in the order given while their lines fit ``room`` bytes."""
    kept: list[Any] = []
    for row in rows:
        room -= int(row[_LEN]) + PER_MESSAGE_OVERHEAD
        if room < 0:
            break
        kept.append(row)
    return kept


def _around(rows: Sequence[Any], w: Window, room: int) -> list[Any]:
    """The target first, then its neighbours alternately (older, newer) while they fit."""
    assert w.target_pos is not None
    by_seq = {int(r[0]): r for r in rows}
    target = w.target_pos + 1  # seq
    picked: list[Any] = []
    older, newer = target, target + 1
    while older > w.start or newer <= w.end:
        for seq in (older, newer):
            row = by_seq.get(seq)
            if row is None:
                continue
            cost = int(row[_LEN]) + PER_MESSAGE_OVERHEAD
            if cost > room:
                return sorted(picked)
            room -= cost
            picked.append(row)
        older, newer = older - 1, newer + 1
    return sorted(picked)


def read_file_window(path: Path, req: WindowRequest, session: Mapping[str, Any], *,
                     max_file_bytes: int) -> Window:
    """The window read from the transcript alone, without the index (while the index cannot catch up
    with the file: a full disk refuses its commit). Bounded: a transcript over ``max_file_bytes`` is
    ``PAYLOAD_TOO_LARGE``. Positions are the deduped file order, as the index would have them."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        size = 0
    if size > max_file_bytes:
        raise PayloadTooLarge(f"the transcript ({size} bytes) cannot be read without its index, which is behind "
                              "while the disk is full; retry once space is freed",
                              data={"size": size, "limit": max_file_bytes})
    t = read_transcript(path) if size else None
    messages = t.messages if t is not None else []
    w = Window(total=len(messages))
    if req.around is not None:
        w.target_pos = t.positions.get(req.around) if t is not None else None
        if w.target_pos is None:
            w.missing_target = True
            return w
    w.start, w.end = window_bounds(w.total, req, w.target_pos)
    deleted = t.deleted_ids if t is not None else frozenset()
    rows = [(i + 1, e.offset, e.length, int(e.id in deleted), e.record.get("turnId"), None, None)
            for i, e in enumerate(messages[w.start:w.end], start=w.start)]  # no descriptors: parsed
    ids = set(t.positions) if t is not None else set()
    newest = {c.id: c for c in (t.compactions if t is not None else [])}  # one per id, its newest line
    comps = [newest.pop(c.id) for c in (t.compactions if t is not None else []) if c.id in newest]
    # an anchorless line has no anchor that exists; a checkpoint a tombstone hides is not served
    # (index.set_deleted)
    comps = [c for c in comps if still_valid(c.record, ids) and c.id not in deleted]
    if req.max_bytes is not None:
        every = rows
        rows = fit_rows(w, req, sum(c.length for c in comps),
                        lambda newest_first: every[::-1] if newest_first else every)
        if rows:
            w.start, w.end = rows[0][0] - 1, rows[-1][0]
    lines = read_spans_coalesced(path, [(c.offset, c.length) for c in comps]) if comps else []
    summary = {**index.public_session(session), "messageCount": w.total}  # the file's count: the row's lags
    w.reply, w.target = encode_window(path, summary, rows, lines, start=w.start, end=w.end,
                                      total=w.total, content_limit=req.content_limit, target_pos=w.target_pos,
                                      cut_target=w.alone)
    check_alone(w, req)
    return w


def read_cold(conn: sqlite3.Connection, sid: str, path: Path, req: WindowRequest,
              now_ms: int | None = None) -> Window:
    """First read of an actor: row + clean-file check + window, one snapshot.

    ``plan_kind != "clean"`` (or no row) means the caller must catch the index
    up with the file first; no window is read then.
    """
    conn.execute("BEGIN")
    try:
        memo = _memo_for(conn)
        row, present = index.session_row_present(conn, sid, now_ms)
        if row is None:
            return Window()
        try:  # the usual clean file: one open serves the check and the window's bytes
            fd: int | None = open_transcript(path)
        except (OSError, StoreError):
            fd = None  # missing or refused: plan_reconcile says so, as it always did
        try:
            plan: ReconcilePlan | None = None
            if fd is not None:
                plan = clean_plan(fd, row["_indexedLen"], row["_fileEpoch"])
            if plan is None:  # whether a whole line follows the mark; a far tail is not read here (nor twice)
                plan = plan_catch_up(path, row["_indexedLen"], row["_fileEpoch"], far=CATCH_UP_STEP_BYTES)
            if plan.kind != "clean" or plan.file_len != row["_indexedLen"]:
                return Window(row=row, plan_kind=plan.kind)
            w = read_warm(conn, sid, path, int(row["messageCount"]), req, row, derived_fresh=True, now_ms=now_ms,
                          fd=fd, present=present, memo=memo)
        finally:
            if fd is not None:
                os.close(fd)
        w.row, w.plan_kind, w.file_len, w.epoch = row, plan.kind, plan.file_len, plan.epoch
        return w
    finally:
        conn.execute("ROLLBACK")


def navigation_call_id(target: Mapping[str, Any] | None) -> str | None:
    """The ``parentToolCallId`` of a ``messageAround`` target (a subagent-attributed row), if any."""
    meta = (target or {}).get("meta") or {}
    call_id = meta.get("parentToolCallId") if isinstance(meta, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def navigation_parent(path: Path, call_id: str, content_limit: int | None) -> dict[str, Any] | None:
    """The owning Task row of a nested target, capped like the window (``None`` if absent). Read cut, a line
    with strings over ``big_line.BIG_STRING`` bytes is parsed without them, as ``window_reply.project_line``
    reads one: the same row, at the cost of its bytes rather than a parse of them."""
    line = _tool_call_line(path, call_id)
    if line is None:
        return None
    capped = parse_capped(line, content_limit) if content_limit and len(line) >= BIG_STRING else None
    if capped is None:
        return cap_content(wire_record(loads_line(line)), content_limit)
    out = cap_content(wire_record(capped[0]), content_limit)
    if capped[1]:
        out["truncated"] = True  # a text block parse_capped cut already
    return out


def find_tool_call_line(path: Path, call_id: str) -> dict[str, Any] | None:
    """The newest message line holding a ``tool_call`` block with ``callId`` (navigation parent), whole."""
    line = _tool_call_line(path, call_id)
    return None if line is None else loads_line(line)


def _tool_call_line(path: Path, call_id: str) -> bytes | None:
    """The bytes of :func:`find_tool_call_line`'s line. Every line naming the id is looked at (the call's
    result, its subagent's messages): one with strings over ``big_line.BIG_STRING`` bytes is parsed without
    them (only its type and its blocks' type and ``callId`` are read), so a tool result of tens of MiB costs
    its bytes, not some 14 times them."""
    needle = call_id.encode()
    found: tuple[int, int] | None = None  # where the newest one lies: not held while later lines are read
    with open(path, "rb") as fh:
        for line in fh:
            if needle in line and line.endswith(b"\n") and _calls(line, call_id):
                found = (fh.tell() - len(line), len(line))
            del line
        if found is None:
            return None
        fh.seek(found[0])
        return fh.read(found[1])


def _calls(line: bytes, call_id: str) -> bool:
    """Whether ``line`` is a message holding a ``tool_call`` block with ``callId``. A large string in a place
    ``parse_capped`` cannot cut (a key, ``meta``, a tool result's ``content``) or one that is not valid JSON:
    the line is parsed whole, as before."""
    capped = parse_capped(line, 1) if len(line) >= BIG_STRING else None
    if capped is not None:
        rec = capped[0]
    else:
        try:
            rec = loads_line(line)
        except ValueError:
            return False
    if rec.get("type") != "message":
        return False
    return any(isinstance(block, dict) and block.get("type") == "tool_call" and block.get("callId") == call_id
               for block in blocks_of(rec))
