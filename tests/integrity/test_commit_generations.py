"""Commit generations per session (``store.indexing.group_commit.GroupStats.generation_of``): what a
session actor's read-ahead checks. A batch limited to some sessions' index ops moves only theirs; any
other op moves every session's; the map of sessions is bounded."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from actors.db_writer import DbOp, IndexOp, _IndexBatch
from store.indexing.appends import Written
from store.indexing.group_commit import GroupCommit, GroupStats
from tests.dbkit import NOW


class _Noop:
    """An op limited to some sessions that writes nothing."""

    def __init__(self, *sessions: str) -> None:
        self.sessions: frozenset[str] | None = frozenset(sessions)
        self.durable = False
        self.requests = 1

    @staticmethod
    def fn(conn: sqlite3.Connection) -> None:
        return None


def test_a_batch_moves_only_the_generations_of_the_sessions_it_indexes(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "g.sqlite", isolation_level=None)
    stats = GroupStats()
    gc = GroupCommit(conn, stats=stats)
    a0, b0 = stats.generation_of("a"), stats.generation_of("b")
    gc.run([_Noop("a")])
    assert stats.generation_of("a") > a0 and stats.generation_of("b") == b0
    assert stats.generation_of("a") % 2 == 0
    a1 = stats.generation_of("a")
    gc.run([_Noop("b"), DbOp(lambda c: None)])  # any op that may change any row: everyone moves
    assert stats.generation_of("a") > a1 and stats.generation_of("zzz") == stats.generation
    stats.upkeep_steps = 0
    before = stats.generation
    gc.upkeep()  # a merge: nothing a read returns changes
    assert stats.generation == before


def test_the_map_of_sessions_is_bounded_and_forgets_conservatively(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "g.sqlite", isolation_level=None)
    stats = GroupStats()
    stats.TOUCHED_LIMIT = 8
    gc = GroupCommit(conn, stats=stats)
    gc.run([_Noop("a")])
    kept = stats.generation_of("a")
    untouched = stats.generation_of("never")
    for i in range(10):
        gc.run([_Noop(f"s{i}")])
    assert len(stats.touched) <= 8
    # the map was cleared once: every session then counts as changed (never stale served)
    assert stats.generation_of("a") > kept and stats.generation_of("never") > untouched


def test_index_ops_name_their_session_and_other_ops_none() -> None:
    w = Written("a", Path("/a.jsonl"), 0, 10, "e", [b"x" * 10])
    w2 = Written("b", Path("/b.jsonl"), 0, 10, "e", [b"y" * 10])
    assert IndexOp(w, NOW).sessions == {"a"}
    assert _IndexBatch([[IndexOp(w, NOW)], [IndexOp(w2, NOW)]]).sessions == {"a", "b"}
    assert DbOp(lambda c: None).sessions is None
