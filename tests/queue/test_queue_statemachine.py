"""Hypothesis state machine: store/queue.py against a plain Python model of the queue."""

from __future__ import annotations

import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from store import queue
from store.errors import Conflict, IdempotencyConflict, LimitExceeded, NotFound
from tests.queue.conftest import NOW_MS, add_session, open_queue_db

KEYS = st.sampled_from(["k1", "k2", "k3", None])
CONTENTS = st.sampled_from(["a", "b"])


@dataclass
class ModelEntry:
    id: str
    key: str | None
    content: str
    position: int
    priority: int | None = None


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory()
        self.conn: sqlite3.Connection = open_queue_db(Path(self._dir.name) / "pi.sqlite")
        self.conn.execute("PRAGMA synchronous = OFF")  # speed: durability is not what this tests
        add_session(self.conn, "s")
        self.entries: list[ModelEntry] = []
        self.high = 0
        self.used: dict[str, tuple[str, str]] = {}  # key -> (entry id, content) ever admitted
        self.n = 0
        self.leased: ModelEntry | None = None  # taken, no turn began with it: it may be offered again,
        # so it holds a place (and its priority) in the session

    def teardown(self) -> None:
        self.conn.close()
        self._dir.cleanup()

    # model helpers -----------------------------------------------------
    def order(self) -> list[ModelEntry]:
        promoted = sorted((e for e in self.entries if e.priority is not None), key=lambda e: e.priority or 0)
        rest = sorted((e for e in self.entries if e.priority is None), key=lambda e: e.position)
        return promoted + rest

    def pick(self, i: int) -> ModelEntry:
        return self.entries[i % len(self.entries)]

    # rules -------------------------------------------------------------
    @rule(key=KEYS, content=CONTENTS)
    def push(self, key: str | None, content: str) -> None:
        self.n += 1
        new_id = f"q{self.n}"
        inp = queue.PushInput(principal="ui", content=content, permission_mode="ask", idempotency_key=key)
        expect_replay = key is not None and key in self.used
        try:
            out = queue.push(self.conn, "s", inp, new_id=new_id, now_ms=NOW_MS)
        except IdempotencyConflict:
            assert expect_replay and self.used[key][1] != content  # type: ignore[index]
            return
        except LimitExceeded:
            assert not expect_replay and len(self.entries) + (self.leased is not None) == queue.MAX_ENTRIES
            return
        assert out.plan.entry is not None
        if expect_replay:
            assert out.plan.replayed and out.plan.entry.id == self.used[key][0]  # type: ignore[index]
            assert self.used[key][1] == content  # type: ignore[index]
            return
        assert len(self.entries) + (self.leased is not None) < queue.MAX_ENTRIES
        self.high += 1
        assert out.plan.entry.position == self.high
        self.entries.append(ModelEntry(new_id, key, content, self.high))
        if key is not None:
            self.used[key] = (new_id, content)

    @precondition(lambda self: bool(self.entries))
    @rule(i=st.integers(0, 7))
    def remove(self, i: int) -> None:
        entry = self.pick(i)
        queue.remove(self.conn, "s", entry.id, now_ms=NOW_MS)
        self.entries.remove(entry)

    @rule()
    def remove_missing(self) -> None:
        try:
            queue.remove(self.conn, "s", "nope", now_ms=NOW_MS)
        except NotFound:
            return
        raise AssertionError("removing an unknown entry must fail")

    @precondition(lambda self: bool(self.entries))
    @rule(i=st.integers(0, 7))
    def prioritize(self, i: int) -> None:
        entry = self.pick(i)
        queue.prioritize(self.conn, "s", entry.id, now_ms=NOW_MS)
        if entry.priority is None:
            rows = self.entries + ([self.leased] if self.leased is not None else [])
            entry.priority = max((e.priority for e in rows if e.priority is not None), default=0) + 1

    @precondition(lambda self: bool(self.entries))
    @rule(i=st.integers(0, 7), direction=st.sampled_from(["up", "down"]))
    def reorder(self, i: int, direction: str) -> None:
        entry = self.pick(i)
        line = sorted((e for e in self.entries if e.priority is None), key=lambda e: e.position)
        expect_ok = entry.priority is None
        if expect_ok:
            k = line.index(entry)
            j = k - 1 if direction == "up" else k + 1
            expect_ok = 0 <= j < len(line)
        try:
            queue.reorder(self.conn, "s", entry.id, direction, now_ms=NOW_MS)
        except Conflict:
            assert not expect_ok
            return
        assert expect_ok
        other = line[j]
        entry.position, other.position = other.position, entry.position

    @rule()
    def take(self) -> None:
        out = queue.take(self.conn, "s", now_ms=NOW_MS)
        self.leased = None  # the previous one was never started: consumed
        expected = self.order()
        if not expected:
            assert out.plan.entry is None
            return
        assert out.plan.entry is not None and out.plan.entry.id == expected[0].id
        self.entries.remove(expected[0])
        self.leased = expected[0]

    # invariants --------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        got = queue.list_entries(self.conn, "s")
        want = self.order()
        assert [(e.id, e.position, e.priority, e.content, e.idempotency_key) for e in got] == [
            (e.id, e.position, e.priority, e.content, e.key) for e in want
        ]
        assert len(got) <= queue.MAX_ENTRIES
        assert len({e.position for e in got}) == len(got)
        assert queue.load(self.conn, "s").high_water == self.high


QueueModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestQueueModel = QueueModel.TestCase
