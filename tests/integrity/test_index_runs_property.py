"""Property: whatever the DB writer's mailbox held and however it joined it, the index is what one op
at a time makes it (issue 26's index runs and batches; issue 22's one owner of the mark).

A random script of what session actors write — new messages (one or two per op, tool rows), a line that replaces
a message of its session, a tombstone, a ``session_info`` line, a compaction checkpoint — across three
sessions goes to the transcripts once. One database indexes it op by op (``index_written``, the path before runs); the
other takes the same ops in random mailbox batches through the writer's own planner
(``actors.db_writer._runs``: runs per session, several sessions' runs as one batch) and its own
savepoint helper (``group_commit.attempt``). Every op's outcome, every row, every mark and every
search result must be equal — and equal to a third index rebuilt from the transcripts alone (the
transcripts are the source of truth: boot, ``doctor --repair`` and a repair rebuild this way).

Reproduced by the rebuild comparison: a message's later line (a streamed reply's final text, an edit)
left the live row's ``created_at`` (and, for a line written behind the host's back, its ``role``) at
the first line's, where a rebuilt index and every read take the newest line's.
"""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.db_writer import IndexOp, _IndexBatch, _runs
from runtime.kernel.actor import Envelope
from store.indexing import index
from store.indexing.appends import Written, index_written
from store.indexing.database import in_transaction
from store.indexing.group_commit import attempt
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line, loads_line
from store.search.search import search_messages
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.dbkit import NOW, fresh_db

SIDS = ("a", "b", "c")
WORDS = ("zebra", "quartz", "fjord", "数据库", "glyph")
KINDS = ("new", "two", "tool", "replace", "tombstone", "info", "compaction")

# one step of a session actor: (session, kind, message slot, second slot, word)
Step = tuple[str, str, int, int, str]


@dataclass
class _Actor:
    """What a session actor knows when it plans a line: its next seq, the ids it holds and their roles."""

    seq: int = 0
    ids: list[str] = field(default_factory=list)
    roles: dict[str, str] = field(default_factory=dict)


def _message(mid: str, text: str, role: str, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    if role == "tool":  # a tool row: its output is searched apart (``tool_output``)
        return {"type": "message", "id": mid, "role": role, "createdAt": created, "toolName": "Bash", "blocks": [
            {"type": "tool_call", "callId": f"c-{mid}", "name": "Bash", "args": {"command": "ls"},
             "status": "ok", "result": text}]}
    return {"type": "message", "id": mid, "role": role, "createdAt": created,
            "blocks": [{"type": "text", "text": text}]}


def _lines(step: Step, actor: _Actor, n: int) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """The records of one op and the seqs the actor acknowledged for its new messages."""
    sid, kind, slot, other, word = step
    if kind in ("replace", "tombstone") and actor.ids:
        mid = actor.ids[slot % len(actor.ids)]
        if kind == "replace":  # a message's later line (a streamed reply's final text, an edit)
            # same role as a session actor writes it; another one as only a line written behind the
            # host's back can have (the index follows the file either way)
            role = actor.roles[mid] if other % 4 else ("assistant" if actor.roles[mid] == "user" else "user")
            return [_message(mid, f"{word} replaced {n}", role, created=f"2026-01-02T00:00:{n % 60:02d}Z")], {}
        return [{"type": "tombstone", "id": f"t-{n}", "messageId": mid, "deleted": True}], {}
    if kind == "info":
        return [{"type": "session_info", "title": f"{sid} {word} {n}"}], {}
    if kind == "compaction" and actor.ids:  # a checkpoint through one of its messages (same id again: a newer one)
        return [{"type": "compaction", "id": f"{sid}-c{other % 2}", "summary": f"{word} summary {n}",
                 "throughMessageId": actor.ids[slot % len(actor.ids)], "tokensBefore": 100 + n,
                 "createdAt": f"2026-01-03T00:00:{n % 60:02d}Z"}], {}
    records: list[dict[str, Any]] = []
    seqs: dict[int, int] = {}
    count = 2 if kind == "two" else 1
    for i in range(count):
        mid = f"{sid}-{n}-{i}"
        actor.seq += 1
        actor.ids.append(mid)
        actor.roles[mid] = "tool" if kind == "tool" else "user" if i == 0 else "assistant"
        seqs[len(records)] = actor.seq
        records.append(_message(mid, f"{word} {n} {i} " + word * (other % 3), actor.roles[mid]))
    if kind == "two" and other % 2:  # a session_info line between two new messages of one op
        records.insert(1, {"type": "session_info", "title": f"{sid} mid {n}"})
        seqs = {0: seqs[0], 2: seqs[1]}
    return records, seqs


def _rows(conn: sqlite3.Connection) -> dict[str, Any]:
    return {
        "messages": conn.execute("SELECT id, session_id, seq, role, text, deleted, line_offset, line_len, "
                                 "wire_cut, line_crc, created_at, turn_id FROM messages "
                                 "ORDER BY session_id, seq").fetchall(),
        "sessions": conn.execute("SELECT id, title, last_seq, indexed_len, file_epoch "
                                 "FROM sessions ORDER BY id").fetchall(),
        "compactions": conn.execute("SELECT session_id, id, through_message_id, first_kept_message_id, "
                                    "line_offset, line_len, created_at FROM compactions "
                                    "ORDER BY session_id, line_offset").fetchall(),
        "tool_output": conn.execute("SELECT m.id, t.text FROM tool_output t JOIN messages m ON m.mid = t.mid "
                                    "ORDER BY m.id").fetchall(),
        "marks": [index.index_mark(conn, sid) for sid in SIDS],
        "found": {w: sorted((h["sessionId"], h["messageId"]) for h in search_messages(conn, w, limit=200)["results"])
                  for w in WORDS},
    }


def _run_batched(conn: sqlite3.Connection, ops: list[IndexOp], sizes: list[int]) -> list[Any]:
    """The ops through the writer's planner in mailbox batches of ``sizes``: each op's outcome."""
    outcome: dict[int, Any] = {}
    at = 0
    for size in [*sizes, len(ops)]:
        chunk = ops[at:at + size]
        at += len(chunk)
        if not chunk:
            break
        envs = [Envelope(op, None) for op in chunk]
        conn.execute("BEGIN IMMEDIATE")
        for planned, group in _runs(envs):
            ok, value = attempt(conn, "op", partial(planned.fn, conn))
            assert ok, value
            if isinstance(planned, _IndexBatch):
                for env, (one_ok, refs) in zip(group, value, strict=True):
                    assert one_ok, refs
                    outcome[id(env.msg)] = refs
            else:
                outcome[id(planned)] = value
        conn.execute("COMMIT")
    return [_identities(outcome[id(op)]) for op in ops]


def _identities(refs: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """An op's refs as the messages they name (id and seq). A joined run answers each op with its
    messages' rows as the run left them: a message a later op of the run replaced carries that
    line's role, where one op at a time answered with the role of its own line."""
    return [(str(r["id"]), int(r["seq"])) for r in refs]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(st.sampled_from(SIDS), st.sampled_from(KINDS), st.integers(0, 9), st.integers(0, 5),
                             st.sampled_from(WORDS)),
                   min_size=1, max_size=24),
    sizes=st.lists(st.integers(1, 9), max_size=8),
)
def test_any_mailbox_batching_indexes_what_one_op_at_a_time_indexes(steps: list[Step], sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        alone, batched = fresh_db(root / "alone.sqlite"), fresh_db(root / "batched.sqlite")
        where: dict[str, tuple[Path, str | None]] = {}
        for sid in SIDS:
            path = root / f"{sid}.jsonl"
            create_transcript(path, sid, NOW)
            plan = plan_reconcile(path, 0, None)
            for c in (alone, batched):
                in_transaction(c, lambda c, sid=sid, plan=plan: apply_plan(c, sid, plan, now_ms=NOW))
            where[sid] = (path, plan.epoch)
        actors = {sid: _Actor() for sid in SIDS}
        ops: list[IndexOp] = []
        for n, step in enumerate(steps):
            sid = step[0]
            records, seqs = _lines(step, actors[sid], n)
            path, epoch = where[sid]
            lines = [dumps_line(r) for r in records]
            writer = TranscriptWriter.open(path)
            try:
                start, end = writer.append(lines)
            finally:
                writer.close()
            parsed = [loads_line(x) for x in lines] if n % 3 else None  # some ops parse their lines lazily
            ops.append(IndexOp(Written(sid, path, start, end, epoch, lines, parsed, seqs), NOW + n))
        try:
            one_by_one = [_identities(in_transaction(alone, lambda c, op=op: index_written(c, op.written,
                                                                                          now_ms=op.now_ms)))
                          for op in ops]
            assert _run_batched(batched, ops, sizes) == one_by_one
            assert _rows(batched) == _rows(alone)
            for sid in SIDS:  # and both cover every line written
                path, epoch = where[sid]
                assert index.index_mark(batched, sid) == (path.stat().st_size, epoch)
            # the transcripts are the source of truth: an index rebuilt from them is the same index
            rebuilt = fresh_db(root / "rebuilt.sqlite")
            try:
                for sid in SIDS:
                    path, epoch = where[sid]
                    plan = plan_reconcile(path, 0, None)
                    in_transaction(rebuilt, lambda c, sid=sid, plan=plan: apply_plan(c, sid, plan, now_ms=NOW))
                assert _rows(rebuilt) == _rows(alone)
            finally:
                rebuilt.close()
        finally:
            alone.close()
            batched.close()
