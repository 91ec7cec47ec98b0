"""Durable appends (issues 2 and 12) and the cost of SQLite ``synchronous=FULL`` vs ``NORMAL``.

Appends go through an in-process host's request pipeline (``session.appendMessage``
calls: validation, the session actor's real write path, file + fdatasync, the
reply; the index rows commit behind it, ARCHITECTURE.md "Read barriers"), one
awaited at a time. Measured against, in rounds alternating with the host's appends
(same disk weather):

* the raw loop: the same encoded lines, one ``write`` + ``fdatasync`` each, in the
  transcripts directory, straight and driven from trio with one worker-thread hop
  per append (the floor for a host that keeps fsync off its event loop);
* ``SQLiteSession`` (``bench_baselines.py``): what the OpenAI Agents SDK does per
  append, on the same messages, for one session and for N sessions at once.

CPU seconds per append are the process's CPU time over exactly the measured
segments (the host's segments also cover the wait for the index to catch up, so
its work is charged to the appends that caused it), divided by the appends.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from bench_baselines import SQLiteSessionBaseline
from bench_common import (
    Corpus,
    Meter,
    RawLoop,
    Section,
    Sizes,
    Target,
    call_context,
    chunks,
    encoded_lines,
    host_commit_groups,
    index_sql_only,
    inprocess_host,
    ratio,
    rnd,
    rounds_of,
    shown,
)

from runtime.host import RunningHost

VS_SQLITE_TARGET = 1.25
VS_HOPPED_RAW_TARGET = 0.7
CPU_MS_TARGET = 0.30  # in-process, both threads, index included (issue 26)
WARMUP = 5
ROUNDS = 10  # the baselines and the host's appends alternate in this many rounds


class Wakeups(trio.abc.Instrument):
    """What a workload costs in hand-offs: trio task steps (each one a task switch on the trio
    thread), worker-thread hops (``trio.lowlevel.start_thread_soon``: the thread cache behind both
    ``trio.to_thread.run_sync`` and ``runtime.kernel.threads.run_in_thread``) and the trio thread's
    own CPU seconds (the rest of the process CPU ran in worker threads), over the segments run
    under :meth:`counting`."""

    def __init__(self, *, own_tasks_only: bool = False) -> None:
        self.own_tasks_only = own_tasks_only
        """Count only the hops (and task steps) of the task that runs the segment and its children: a
        baseline's segment, which must not be charged with what a host in the same process (an actor's
        late batch) starts meanwhile. Off for a host's segments: its actors' tasks do the appends' work."""
        self._owner: trio.lowlevel.Task | None = None  # while counting with own_tasks_only
        self.foreign_hops = 0
        """Hops started meanwhile by other tasks, left out (``own_tasks_only``)."""
        self.steps = 0
        self.hops = 0
        self.trio_cpu = 0.0
        self.hop_cpu: dict[str, float] = {}
        """Worker-thread CPU seconds (``time.thread_time`` in the worker) per kind of hop: :func:`hop_kind`."""

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._owner is None or _descends(task, self._owner):
            self.steps += 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        # trio._threads holds its own name for it (trio.to_thread.run_sync)
        namespaces = (vars(trio.lowlevel), vars(importlib.import_module("trio._threads")))
        start = trio.lowlevel.start_thread_soon

        hop_cpu = self.hop_cpu
        owner = self._owner = trio.lowlevel.current_task() if self.own_tasks_only else None

        def counted(fn: Callable[[], Any], deliver: Callable[[Any], object], name: str | None = None) -> None:
            if owner is not None and not _descends(trio.lowlevel.current_task(), owner):
                self.foreign_hops += 1
                start(fn, deliver, name)
                return
            self.hops += 1
            kind = hop_kind(fn)

            def timed() -> Any:  # in the worker thread: its own CPU, the hand-back (``deliver``) not included
                c0 = time.thread_time()
                try:
                    return fn()
                finally:
                    hop_cpu[kind] = hop_cpu.get(kind, 0.0) + time.thread_time() - c0

            start(timed, deliver, name)

        for ns in namespaces:
            ns["start_thread_soon"] = counted
        trio.lowlevel.add_instrument(self)
        c0 = time.thread_time()
        try:
            yield
        finally:
            self.trio_cpu += time.thread_time() - c0
            self._owner = None
            trio.lowlevel.remove_instrument(self)
            for ns in namespaces:
                ns["start_thread_soon"] = start

    def wrap(self, fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        async def counted() -> Any:
            with self.counting():
                return await fn()

        async def run() -> Any:
            if not self.own_tasks_only:
                return await counted()
            got: list[Any] = []

            async def own() -> None:  # a task of its own: the host's tasks descend from the caller's
                got.append(await counted())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(own)
            return got[0]
        return run

    def per_op(self, ops: int, meter: Meter) -> dict[str, Any]:
        if not ops:
            return {}
        return {"taskStepsPerAppend": rnd(self.steps / ops), "threadHopsPerAppend": rnd(self.hops / ops),
                "trioThreadCpuMsPerAppend": rnd(self.trio_cpu / ops * 1000),
                "workerThreadsCpuMsPerAppend": rnd((meter.cpu - self.trio_cpu) / ops * 1000),
                "workerCpuMsPerAppendByHop": {k: rnd(v / ops * 1000) for k, v in sorted(self.hop_cpu.items())},
                **({"otherTasksHops": self.foreign_hops} if self.own_tasks_only else {})}


def _descends(task: trio.lowlevel.Task, owner: trio.lowlevel.Task) -> bool:
    """``task`` is ``owner`` or runs in a nursery under it."""
    t: trio.lowlevel.Task | None = task
    while t is not None:
        if t is owner:
            return True
        nursery = t.parent_nursery
        t = nursery.parent_task if nursery is not None else None
    return False


HOP_KINDS = (("write_durably", "sessionWrite"), ("GroupCommit", "dbWriterCommit"))
"""What a worker-thread hop runs, by the name of its function: the session actor's read + plan + write +
fdatasync (one hop per append group), the DB writer's transaction (one per batch of index ops)."""


def hop_kind(fn: Callable[[], Any]) -> str:
    """The kind of a hop (:data:`HOP_KINDS`), ``other`` for the rest (the raw loop's and the baselines' hops,
    trio.to_thread's wrapper)."""
    inner: Any = fn
    while isinstance(inner, partial):
        inner = inner.func
    name = getattr(inner, "__qualname__", "")
    return next((kind for part, kind in HOP_KINDS if part in name), "other")


async def _create(host: RunningHost, sid: str, warm: Sequence[dict[str, Any]]) -> None:
    await host.pipeline.call("session.create", {"sessionId": sid, "title": f"bench {sid}"}, call_context())
    for m in warm:  # first append pays the actor start + catch-up
        await host.pipeline.call("session.appendMessage", {"sessionId": sid, "message": m}, call_context())


async def _sequential(host: RunningHost, sid: str, messages: Sequence[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    for m in messages:
        await host.pipeline.call("session.appendMessage", {"sessionId": sid, "message": m}, call_context())
    return time.perf_counter() - t0


async def _concurrently(host: RunningHost, work: Mapping[str, Sequence[dict[str, Any]]]) -> None:
    async with trio.open_nursery() as nursery:
        for sid, msgs in work.items():
            nursery.start_soon(_sequential, host, sid, msgs)


async def _db_writer(host: RunningHost) -> dict[str, Any]:
    """The DB writer's counters (``host.status``): its transactions (``batches``) and the ops they held."""
    got: dict[str, Any] = (await host.pipeline.call("host.status", {}, call_context()))["dbWriter"]
    return got


async def _total(host: RunningHost, sid: str) -> int:
    got = await host.pipeline.call("session.get", {"sessionId": sid, "messageLimit": 1}, call_context())
    return int(got["totalMessages"])


async def _drive_appends(root: Path, one: list[dict[str, Any]], multi: dict[str, list[dict[str, Any]]],
                         corpus: Corpus, raw: RawLoop,
                         sql: SQLiteSessionBaseline
                         ) -> tuple[dict[str, Meter], dict[str, Wakeups], tuple[dict[str, Any], dict[str, Any]]]:
    lines = encoded_lines(one)
    meters = {k: Meter() for k in ("host", "sqlite", "hostMulti", "sqliteMulti", "rawHopped")}
    wakes = {k: Wakeups(own_tasks_only=not k.startswith("host")) for k in meters}
    # No idle search-index merges (``search_upkeep_after``): the DB writer starts one ``search_upkeep_after``
    # seconds after its last batch, i.e. in the baselines' segments that follow a host segment whenever those
    # take longer than that (a loaded machine), where its hop and CPU were charged to the raw loop or
    # SQLiteSession; the host's own segments, back to back appends, never left the writer idle that long.
    async with inprocess_host(root, search_upkeep_after=None) as host:
        settle = host.services.index_log.barrier
        warm = corpus.messages("one-warm", WARMUP)
        await _create(host, "one", warm)
        await sql.append_each("one", warm)
        await settle()  # the warm-up's index commit (held ``index_hold``) lands here, not in a baseline's segment
        before = await _db_writer(host)
        for msgs, raw_lines in zip(chunks(one, ROUNDS), chunks(lines, ROUNDS), strict=True):
            await trio.to_thread.run_sync(raw.run, raw_lines)
            await meters["rawHopped"].measure(len(raw_lines), wakes["rawHopped"].wrap(partial(raw.run_hopped,
                                                                                           raw_lines)))
            await meters["sqlite"].measure(len(msgs), wakes["sqlite"].wrap(partial(sql.append_each, "one", msgs)))
            await meters["host"].measure(len(msgs), wakes["host"].wrap(partial(_sequential, host, "one", msgs)),
                                         wakes["host"].wrap(settle))
        after = await _db_writer(host)
        for sid in multi:
            warm = corpus.messages(f"{sid}-warm", WARMUP)
            await _create(host, sid, warm)
            await sql.append_each(sid, warm)
        await settle()
        for part in rounds_of(multi, ROUNDS):
            n = sum(len(v) for v in part.values())
            await meters["sqliteMulti"].measure(n, wakes["sqliteMulti"].wrap(partial(sql.append_concurrently, part)))
            await meters["hostMulti"].measure(n, wakes["hostMulti"].wrap(partial(_concurrently, host, part)),
                                              wakes["hostMulti"].wrap(settle))
        totals = {"one": await _total(host, "one")}
        for sid in multi:
            totals[sid] = await _total(host, sid)
    expected = {"one": len(one) + WARMUP, **{sid: len(m) + WARMUP for sid, m in multi.items()}}
    for store, got in (("host", totals), ("SQLiteSession", sql.counts())):
        if got != expected:
            raise AssertionError(f"{store}: message counts after the run differ from what was appended: "
                                 f"{got} vs {expected}")
    return meters, wakes, (before, after)


def run_appends(sizes: Sizes, work: Path) -> Section:
    sec = Section("appends", "Durable appends (in-process, one at a time awaited)")
    corpus = Corpus(seed=11)
    one = corpus.messages("one", sizes.session_appends)
    multi = {f"c{j:02d}": corpus.messages(f"c{j:02d}", sizes.appends_per_session) for j in range(sizes.sessions)}
    root = work / "appends"
    raw = RawLoop(root / "sessions")
    sql = SQLiteSessionBaseline(work / "appends-baselines" / "sqlite-session.db")
    try:
        m, w, db_writer = trio.run(_drive_appends, root, one, multi, corpus, raw, sql)
    finally:
        raw.close()
        sql.close()
    # the floor's second part: the same messages' index SQL alone, in transactions of as many messages as
    # the host's DB writer put in each of its commits in the measured segments (appends arrive one at a
    # time; the index commit is held while no read waits for it, ``index_hold``)
    groups, ops_per_commit = host_commit_groups(one, *db_writer)
    idx = index_sql_only(work / "appends-index-only", groups)
    host, lite, host_multi, lite_multi = m["host"], m["sqlite"], m["hostMulti"], m["sqliteMulti"]
    hopped = m["rawHopped"]
    floors = append_floors(hop_ms=1000 / raw.hopped_per_sec, hop_cpu_ms=raw.hopped_cpu_ms_per_append,
                           index_ms=idx.ms_per_message, index_cpu_ms=idx.cpu_ms_per_message,
                           sqlite_per_sec=lite.per_sec)
    sec.figures = {
        "raw": {**raw.figures(), "viaWorkerThread": w["rawHopped"].per_op(hopped.ops, hopped)},
        "indexSqlOnly": {**idx.figures(), "hostOpsPerCommit": rnd(ops_per_commit)},
        "floors": floors,
        "sqliteSession": {**sql.describe(), "oneSessionPerSec": rnd(lite.per_sec),
                          "oneSessionCpuMsPerAppend": rnd(lite.cpu_ms_per_op()),
                          "oneSession": w["sqlite"].per_op(lite.ops, lite),
                          "concurrent": w["sqliteMulti"].per_op(lite_multi.ops, lite_multi),
                          "oneSessionRatioToRawViaWorkerThread": rnd(ratio(lite.per_sec, raw.hopped_per_sec)),
                          "concurrentSessions": sizes.sessions,
                          "concurrentAggregatePerSec": rnd(lite_multi.per_sec),
                          "concurrentCpuMsPerAppend": rnd(lite_multi.cpu_ms_per_op())},
        "oneSession": {"appends": host.ops, "perSec": rnd(host.per_sec),
                       "meanAckMs": rnd(host.seconds / host.ops * 1000),
                       "cpuMsPerAppend": rnd(host.cpu_ms_per_op()),
                       "ratioToSqliteSession": rnd(ratio(host.per_sec, lite.per_sec)),
                       "ratioToRaw": rnd(ratio(host.per_sec, raw.per_sec)),
                       "ratioToRawViaWorkerThread": rnd(ratio(host.per_sec, raw.hopped_per_sec)),
                       "rawViaWorkerThreadToRaw": rnd(ratio(raw.hopped_per_sec, raw.per_sec)),
                       "cpuOverSqliteSession": rnd(ratio(host.cpu_ms_per_op(), lite.cpu_ms_per_op())),
                       "cpuOverRawViaWorkerThread": rnd(ratio(host.cpu_ms_per_op(), hopped.cpu_ms_per_op())),
                       **w["host"].per_op(host.ops, host)},
        "concurrentSessions": {"sessions": sizes.sessions, "appends": host_multi.ops,
                               "aggregatePerSec": rnd(host_multi.per_sec),
                               "cpuMsPerAppend": rnd(host_multi.cpu_ms_per_op()),
                               "ratioToSqliteSession": rnd(ratio(host_multi.per_sec, lite_multi.per_sec)),
                               "ratioToRaw": rnd(ratio(host_multi.per_sec, raw.per_sec)),
                               **w["hostMulti"].per_op(host_multi.ops, host_multi)},
    }
    cpu_floor, hop_ceiling = floors["cpuPerAppend"], floors["vsRawViaWorkerThread"]
    vs_sqlite = floors["vsSqliteSession"]
    sec.targets = [
        Target("one session / SQLiteSession baseline (appends/s)", ratio(host.per_sec, lite.per_sec), ">=",
               VS_SQLITE_TARGET, "both one append awaited at a time, one fsync each; ceiling in this run: the raw "
               f"loop via one worker-thread hop {shown(vs_sqlite['rawViaWorkerThreadToSqliteSession'])}x "
               f"SQLiteSession, hop + index SQL alone in turn "
               f"{shown(vs_sqlite['hopPlusIndexSqlToSqliteSession'])}x"),
        Target("one session / raw write+fdatasync loop via one worker-thread hop",
               ratio(host.per_sec, raw.hopped_per_sec), ">=", VS_HOPPED_RAW_TARGET,
               f"ceiling in this run if the host paid only the hop ({shown(hop_ceiling['hopMsPerAppend'])} ms) + "
               f"the index SQL alone ({shown(hop_ceiling['indexSqlMsPerMessage'])} ms) in turn: "
               f"{shown(hop_ceiling['ratio'])} (the index commits behind the reply, on a worker thread: "
               "overlapping the next append, a host can pass it)"),
        Target("one session: CPU ms per append (both threads, index included)", host.cpu_ms_per_op(), "<=",
               CPU_MS_TARGET, f"floor in this run: raw loop via one worker-thread hop "
               f"{shown(cpu_floor['rawViaWorkerThreadCpuMs'])} ms + index SQL alone "
               f"{shown(cpu_floor['indexSqlCpuMs'])} ms = {shown(cpu_floor['sumCpuMs'])} ms"),
    ]
    sec.notes = [
        f"raw loop: {raw.appends} x (write + fdatasync) of the same encoded lines in the transcripts directory, "
        f"alternating with SQLiteSession and the one-session appends in {ROUNDS} rounds (same disk conditions)",
        "viaWorkerThread: the raw loop driven from trio with each write+fdatasync in a worker thread (one hop "
        "per append, the least a host pays that keeps fsync off its event loop); rawViaWorkerThreadToRaw is the "
        "best ratio to the raw loop such a host can reach on this machine",
        "SQLiteSession: the OpenAI Agents SDK's per-append work (scripts/bench_baselines.py): one add_items "
        "per message in a worker thread, WAL, synchronous=FULL, INSERT of json.dumps(message) + UPDATE of the "
        "session row in one transaction, one lock per database file; same messages as the host",
        f"{sizes.sessions} sessions concurrently ({sizes.sessions} trio tasks, one append awaited at a time "
        f"each), host and SQLiteSession alternating in rounds; reported, no target in-process",
        "taskStepsPerAppend: trio task steps (each a task switch on the trio thread, trio.abc.Instrument) and "
        "threadHopsPerAppend: worker-thread hops (trio.lowlevel.start_thread_soon, under both "
        "trio.to_thread.run_sync and runtime.kernel.threads.run_in_thread) over the measured segments, the "
        "index catch-up included; trioThreadCpuMsPerAppend is the trio thread's own CPU (time.thread_time, the "
        "bench's driver included), workerThreadsCpuMsPerAppend the rest of the process CPU; "
        "workerCpuMsPerAppendByHop splits the worker threads' CPU by what each hop ran (time.thread_time in the "
        "worker around the hop's function; its hand-back to trio not included): sessionWrite (the session "
        "actor's plan + write + fdatasync), dbWriterCommit (the DB writer's transaction: the index SQL), other",
        "the host runs without idle search-index merges (search_upkeep_after off) and its index is settled "
        "after each warm-up, so the host is quiet in the baselines' segments; their hand-offs and hops are "
        "those of the segment's own task and its children (otherTasksHops: hops other tasks started meanwhile, "
        "left out)",
        "cpuMsPerAppend: process CPU time (time.process_time, all threads) over the measured segments / appends; "
        "the host's segments include the wait for the index to cover them (it commits after the replies), so "
        "index work is counted; in-process the figure includes the bench's own driver",
        f"indexSqlOnly: the one-session messages ({idx.messages}) through index.index_messages on a scratch "
        "database (real schema, trigram FTS triggers, synchronous=NORMAL, each message's transcript line), one "
        "transaction per hostOpsPerCommit messages (the host's own DB writer commits in the measured segments: "
        "index ops / transactions); no file, actor or "
        "pipeline work; after the rounds, in this process (cpuMsPerMessage: that thread's time.thread_time)",
        "floors (the bound beside each target, every part measured in this run): cpuPerAppend = the raw loop via "
        "one worker-thread hop's CPU per append + the index SQL alone's CPU per message (what any host that "
        "keeps fsync off its loop and indexes each message pays); vsRawViaWorkerThread.ratio = hop ms / (hop ms + "
        "index SQL ms), the ratio a host paying only those two in turn would reach; vsSqliteSession: the hop loop's "
        "rate and the hop + index SQL rate over SQLiteSession's (the ceiling of a host keeping fsync off its "
        "loop, without and with the index)",
    ]
    return sec


def append_floors(*, hop_ms: float, hop_cpu_ms: float, index_ms: float, index_cpu_ms: float,
                  sqlite_per_sec: float) -> dict[str, dict[str, Any]]:
    """The bounds of the one-session targets from parts measured in the same run: the raw loop via one
    worker-thread hop (wall and CPU per append) and the index SQL alone (per message)."""
    both_ms = hop_ms + index_ms
    return {
        "cpuPerAppend": {"rawViaWorkerThreadCpuMs": rnd(hop_cpu_ms), "indexSqlCpuMs": rnd(index_cpu_ms),
                         "sumCpuMs": rnd(hop_cpu_ms + index_cpu_ms)},
        "vsRawViaWorkerThread": {"hopMsPerAppend": rnd(hop_ms), "indexSqlMsPerMessage": rnd(index_ms),
                                 "ratio": rnd(ratio(hop_ms, both_ms))},
        "vsSqliteSession": {"rawViaWorkerThreadToSqliteSession": rnd(ratio(1000 / hop_ms, sqlite_per_sec)),
                            "hopPlusIndexSqlToSqliteSession": rnd(ratio(1000 / both_ms, sqlite_per_sec))},
    }


# ----------------------------------------------------------------------------- synchronous


async def _drive_sync(root: Path, mode: str | None, msgs: list[dict[str, Any]], settings: int,
                      corpus: Corpus) -> dict[str, Any]:
    async with inprocess_host(root, synchronous=mode) as host:
        await _create(host, "sync", corpus.messages("sync-warm", WARMUP))
        t0 = time.perf_counter()
        await _sequential(host, "sync", msgs)
        # the index committing them is part of an append's cost, and it must not ride in the first
        # settings.set's commit (a held index batch joins the next write: FULL, and no NORMAL commit seen)
        await host.services.index_log.barrier()
        append_secs = time.perf_counter() - t0
        ctx = call_context()
        t0 = time.perf_counter()
        for i in range(settings):
            await host.pipeline.call("settings.set", {"ns": "bench", "key": f"k{i % 16}",
                                                     "value": {"i": i, "theme": "dark"}}, ctx)
        settings_secs = time.perf_counter() - t0
        status = await host.pipeline.call("host.status", {}, ctx)
    return {"appendSecs": append_secs, "settingsSecs": settings_secs,
            "fullCommits": status["dbWriter"]["fullCommits"], "normalCommits": status["dbWriter"]["normalCommits"]}


def run_synchronous(sizes: Sizes, work: Path) -> Section:
    sec = Section("synchronous", "SQLite synchronous=FULL vs NORMAL")
    corpus = Corpus(seed=13)
    msgs = corpus.messages("sync", sizes.sync_appends)
    modes: dict[str, dict[str, Any]] = {}
    for label, mode in (("FULL", "FULL"), ("NORMAL", "NORMAL"), ("auto", None)):
        got = trio.run(_drive_sync, work / f"sync-{label}", mode, msgs, sizes.sync_settings, corpus)
        modes[label] = {
            "appendsPerSec": rnd(len(msgs) / got["appendSecs"]),
            "settingsSetPerSec": rnd(sizes.sync_settings / got["settingsSecs"]),
            "appendSecs": got["appendSecs"], "settingsSecs": got["settingsSecs"],
            "fullCommits": got["fullCommits"], "normalCommits": got["normalCommits"],
        }
    full, normal = modes["FULL"], modes["NORMAL"]
    sec.figures = {
        "appends": sizes.sync_appends,
        "settingsSet": sizes.sync_settings,
        "modes": {k: {kk: vv for kk, vv in v.items() if not kk.endswith("Secs")} for k, v in modes.items()},
        "appendCostFullOverNormal": rnd(ratio(full["appendSecs"], normal["appendSecs"])),
        "settingsCostFullOverNormal": rnd(ratio(full["settingsSecs"], normal["settingsSecs"])),
        "appendCostAutoOverNormal": rnd(ratio(modes["auto"]["appendSecs"], normal["appendSecs"])),
    }
    sec.notes = [
        "cost ratio = wall time under FULL / wall time under NORMAL for the same workload (no target: reported)",
        "auto = the host's default (NORMAL for index-only batches such as appends, FULL for DB-only state)",
    ]
    return sec
