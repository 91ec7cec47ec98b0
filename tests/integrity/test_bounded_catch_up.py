"""An index far behind its transcript catches up in bounded commits (``store.indexing.backlog``), the WAL
checkpointed between them: it never needs about twice the index's size free on disk (one transaction's
pages all in the WAL, which cannot start over before it commits). Each commit leaves the session's index
mark at the end of the lines it indexed, so a crash between two resumes there: nothing indexed twice,
nothing skipped; and the index is the one a single-transaction catch-up builds."""

from __future__ import annotations

import random
import shutil
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from actors.db_writer import DbOp, IndexOp, _IndexBatch, _Marks
from store.faults import Faults, InjectedFault
from store.indexing import index
from store.indexing.appends import Written
from store.indexing.backlog import CATCH_UP_STEP_BYTES, Backlog, Repair, run_steps, wal_bytes
from store.indexing.database import apply_pragmas, in_transaction
from store.indexing.group_commit import GroupCommit
from store.indexing.reconcile import apply_plan, plan_reconcile, repair_session
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.dbkit import NOW, fresh_db

SID = "far-behind"
BACKLOG_MB = 6
WAL_BOUND = 12 << 20
"""What the WAL may reach while 6 MB of prose (~28 MB of index) catch up: one bounded commit's pages
(~4.6 bytes of index per byte of prose: ~1.2 MB at 256 KiB) and FTS5's automerge work in it (64 leaf
pages of 32 KB per work unit and level). One transaction put all ~28 MB in it."""


def _lines(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(4000)]
    out = []
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(1800)) + f" needle{i}"
        rec: dict[str, Any] = {"type": "message", "id": f"m{i}", "role": "user" if i % 2 else "assistant",
                               "createdAt": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
                               "blocks": [{"type": "text", "text": text}]}
        if i % 50 == 7:  # an acknowledged keyed append: its receipt rides in its line
            rec["meta"] = {"receipt": {"clientId": "c", "submissionId": f"sub-{i}", "method": "session.appendMessage",
                                       "extra": {"seq": i + 1}}}
        out.append(dumps_line(rec))
    return out


def _build(root: Path, n_lines: int) -> None:
    """A session whose transcript holds ``n_lines`` message lines its index never took (their index
    ops lost: a full disk, a crash), its WAL checkpointed empty."""
    root.mkdir(parents=True, exist_ok=True)
    conn = fresh_db(root / "pi.sqlite")
    try:
        path = root / "t.jsonl"
        create_transcript(path, SID, NOW)
        plan = plan_reconcile(path, 0, None)
        in_transaction(conn, lambda c: apply_plan(c, SID, plan, now_ms=NOW))
        lines = _lines(n_lines)
        w = TranscriptWriter.open(path)
        try:
            for i in range(0, len(lines), 25):
                w.append(lines[i:i + 25])
        finally:
            w.close()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


N_LINES = (BACKLOG_MB << 20) // 13_000


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("far-behind") / "template"
    _build(root, N_LINES)
    return root


def _far_behind(template: Path, root: Path) -> tuple[sqlite3.Connection, Path, int]:
    """A copy of the template: its connection, transcript and how many lines the index misses."""
    shutil.copytree(template, root)
    return _writer(root), root / "t.jsonl", N_LINES


def _writer(root: Path) -> sqlite3.Connection:
    """The DB writer's connection to ``root``'s database (its PRAGMAs: WAL, ``journal_size_limit``...)."""
    conn = sqlite3.connect(root / "pi.sqlite", isolation_level=None, check_same_thread=False)
    apply_pragmas(conn, synchronous="NORMAL")
    return conn


def _index_of(conn: sqlite3.Connection) -> dict[str, Any]:
    return {
        "messages": conn.execute("SELECT id, session_id, seq, role, text, created_at, line_offset, line_len, "
                                 "wire_cut, line_crc, turn_id FROM messages ORDER BY seq").fetchall(),
        "session": conn.execute("SELECT last_seq, indexed_len, updated_at FROM sessions WHERE id = ?",
                                (SID,)).fetchall(),
        "receipts": conn.execute("SELECT client_id, submission_id, method, status, response_json, session_id "
                                 "FROM command_receipts ORDER BY client_id, submission_id").fetchall(),
        "search": conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH '\"needle1\"' "
                               "ORDER BY rowid").fetchall(),
    }


class _WalSampler(Faults):
    """Samples the WAL's size at every fault point of the index path (between two bounded commits,
    before and after the batch's commit): its peak."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(enabled=True)
        self.conn = conn
        self.peak = 0
        self.seen: list[str] = []

    def point(self, name: str) -> None:
        self.seen.append(name)
        self.peak = max(self.peak, wal_bytes(self.conn))
        super().point(name)


@pytest.fixture(scope="module")
def reference(template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The index the catch-up built in one transaction (before)."""
    conn, path, _ = _far_behind(template, tmp_path_factory.mktemp("reference") / "db")
    try:
        in_transaction(conn, lambda c: repair_session(c, SID, path, now_ms=NOW))
        return _index_of(conn)
    finally:
        conn.close()


def test_an_index_op_far_behind_catches_up_in_bounded_commits(tmp_path: Path, template: Path,
                                                               reference: dict[str, Any]) -> None:
    """The live path: the next append's index op finds the mark megabytes short of its lines (the ops
    before it failed while the disk was full). Before: its batch indexed them all in one transaction,
    ~28 MB of WAL over a ~28 MB index."""
    conn, path, n_lines = _far_behind(template, tmp_path / "live")
    last = _lines(1, seed=99)[0].replace(b'"m0"', b'"late"')
    w = TranscriptWriter.open(path)
    try:
        start, end = w.append([last])
        epoch = w.epoch
    finally:
        w.close()
    sampler = _WalSampler(conn)
    outcome = GroupCommit(conn, faults=sampler).run([IndexOp(Written(SID, path, start, end, epoch, [last]), NOW)])
    assert not isinstance(outcome, BaseException), outcome
    assert outcome[0][0], outcome
    assert sampler.seen.count("index.catch_up.after_commit") >= (BACKLOG_MB << 20) // CATCH_UP_STEP_BYTES - 1
    assert sampler.peak < WAL_BOUND, sampler.peak
    got = _index_of(conn)
    assert got["messages"][:-1] == reference["messages"]
    assert got["messages"][-1][0] == "late" and got["messages"][-1][2] == n_lines + 1
    assert got["receipts"] == reference["receipts"] and got["search"] == reference["search"]
    assert index.index_mark(conn, SID) == (end, epoch)


def test_a_repair_far_behind_builds_the_index_one_transaction_builds(tmp_path: Path, template: Path,
                                                                       reference: dict[str, Any]) -> None:
    """The repair a failed index op queued (``IndexLog.fail``) and boot's reconcile: the same rows,
    receipts, search index and mark as one transaction, the WAL bounded meanwhile."""
    conn, path, _ = _far_behind(template, tmp_path / "repair")
    sampler = _WalSampler(conn)
    repair = Repair(SID, path, NOW)
    outcome = GroupCommit(conn, faults=sampler).run([DbOp(repair, durable=False, label="index",
                                                          backlogs=(repair.backlog,))])
    assert not isinstance(outcome, BaseException) and outcome[0][0], outcome
    assert sampler.peak < WAL_BOUND, sampler.peak
    assert _index_of(conn) == reference

    conn2, path2, _ = _far_behind(template, tmp_path / "boot")
    peaks: list[int] = []
    steps = run_steps(conn2, Backlog(SID, path2, NOW), on_commit=lambda s: peaks.append(wal_bytes(conn2)))
    in_transaction(conn2, lambda c: repair_session(c, SID, path2, now_ms=NOW))
    assert steps.commits == len(peaks) > 10 and steps.messages > 0
    assert max(peaks) < WAL_BOUND and steps.wal_peak == max(peaks), peaks
    assert _index_of(conn2) == reference


def test_a_crash_between_two_bounded_commits_resumes_from_the_last(tmp_path: Path, template: Path,
                                                                   reference: dict[str, Any]) -> None:
    """Killed (an injected fault) after the third bounded commit: the index holds exactly the lines
    before its mark, and a restart's catch-up indexes each message once, none skipped."""
    root = tmp_path / "crash"
    conn, path, n_lines = _far_behind(template, root)
    faults = Faults.parse("index.catch_up.after_commit:3:raise")
    with pytest.raises(InjectedFault):
        run_steps(conn, Backlog(SID, path, NOW), faults=faults)
    mark = index.index_mark(conn, SID)
    assert mark is not None
    ids = [r[0] for r in conn.execute("SELECT id FROM messages ORDER BY seq")]
    spans = conn.execute("SELECT MAX(line_offset + line_len) FROM messages").fetchone()[0]
    assert 0 < len(ids) < n_lines and ids == [f"m{i}" for i in range(len(ids))]
    assert spans == mark[0]  # the mark is the end of the last line the rows hold: no row past it, no gap
    conn.close()

    # the restart: a new connection, boot's catch-up (bounded commits, then the rest) from that mark
    conn = _writer(root)
    try:
        run_steps(conn, Backlog(SID, path, NOW))
        in_transaction(conn, lambda c: repair_session(c, SID, path, now_ms=NOW))
        got = _index_of(conn)
        assert [r[0] for r in got["messages"]] == [f"m{i}" for i in range(n_lines)]
        assert got == reference
    finally:
        conn.close()


def test_a_catch_up_that_fails_answers_its_op_instead_of_indexing_the_rest_at_once(tmp_path: Path) -> None:
    """A bounded commit that fails (the disk still full) fails its op with that error: the batch never
    falls back to the whole backlog in its one transaction. The slices before it stay committed."""
    root = tmp_path / "fails"
    _build(root, 200)
    conn, path = _writer(root), root / "t.jsonl"
    faults = Faults.parse("index.catch_up.before_commit:2:enospc")
    repair = Repair(SID, path, NOW)
    outcome = GroupCommit(conn, faults=faults).run([DbOp(repair, durable=False, label="index",
                                                         backlogs=(repair.backlog,))])
    assert not isinstance(outcome, BaseException)
    ok, error = outcome[0]
    assert not ok and getattr(error, "code", None) == "STORAGE_FULL", error
    mark = index.index_mark(conn, SID)
    assert mark is not None and mark[0] < path.stat().st_size
    assert conn.execute("SELECT MAX(line_offset + line_len) FROM messages").fetchone()[0] == mark[0]


class _ShortReads(Faults):
    """Just before each bounded commit, a read begins on another connection and lasts 80 ms: its
    snapshot holds the frames before that commit, so no checkpoint can finish until it ends."""

    def __init__(self, db: Path) -> None:
        super().__init__(enabled=True)
        self.reader = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        self.timers: list[threading.Timer] = []

    def point(self, name: str) -> None:
        if name == "index.catch_up.before_commit":
            self.reader.execute("BEGIN")
            self.reader.execute("SELECT COUNT(*) FROM messages").fetchone()
            timer = threading.Timer(0.08, lambda: self.reader.execute("COMMIT"))
            self.timers.append(timer)
            timer.start()


def test_a_checkpoint_between_two_commits_waits_for_a_short_read_to_leave(tmp_path: Path, template: Path) -> None:
    """A read on the read pool holding the WAL's old frames when a slice committed: the checkpoint
    before the next waits for it to end (reads are short) instead of letting the WAL grow by every
    slice after it (each commit adds new copies of the pages it changed: without a restart the WAL
    outgrows the single transaction)."""
    conn, path, _ = _far_behind(template, tmp_path / "pinned")
    reads = _ShortReads(tmp_path / "pinned" / "pi.sqlite")
    try:
        steps = run_steps(conn, Backlog(SID, path, NOW), faults=reads)
    finally:
        for timer in reads.timers:
            timer.join()
        reads.reader.close()
    assert steps.commits > 10 and len(reads.timers) == steps.commits
    assert steps.pinned == 0 and steps.wal_peak < WAL_BOUND, steps


def test_the_db_writer_looks_for_a_backlog_only_when_its_last_commit_did_not_leave_the_mark_there() -> None:
    """The usual index op follows the one the DB writer committed last for its session: it goes without a
    backlog (no read of the mark per op); after a failed op, another file or an unknown session it
    carries one."""
    marks = _Marks()
    path = Path("t.jsonl")

    def op(start: int, end: int, epoch: str = "e1") -> IndexOp:
        return IndexOp(Written(SID, path, start, end, epoch, [b"x\n"] * (end - start)), NOW)

    assert marks.known(op(10, 12)).backlogs  # nothing known yet
    marks.settled(op(10, 12), True)
    assert not marks.known(op(12, 13)).backlogs
    assert marks.known(op(13, 14)).backlogs and marks.known(op(12, 13, "e2")).backlogs
    marks.settled(op(12, 13), False)  # failed: its lines (and the mark) are a repair's now
    assert marks.known(op(13, 14)).backlogs and marks.known(op(12, 13)).backlogs
    batch = _IndexBatch([[op(20, 21), op(21, 22)]])
    marks.settled(op(15, 20), True)
    known = marks.known(batch)
    assert isinstance(known, _IndexBatch) and not known.backlogs
