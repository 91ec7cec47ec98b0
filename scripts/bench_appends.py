"""Durable appends (issue 2) and the cost of SQLite ``synchronous=FULL`` vs ``NORMAL``.

Appends go through an in-process host's request pipeline (``session.appendMessage``
calls: validation, the session actor's real write path, file + fdatasync, then
the index batch, then the reply), one awaited at a time. The raw baseline writes the
same encoded lines with one ``write`` + ``fdatasync`` each to a file in the
same directory as the transcripts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from bench_common import (
    Corpus,
    RawLoop,
    Section,
    Sizes,
    Target,
    call_context,
    chunks,
    encoded_lines,
    inprocess_host,
    ratio,
    rnd,
)

from runtime.host import RunningHost

ONE_SESSION_TARGET = 0.7
WARMUP = 5
ROUNDS = 10  # raw loop and host appends alternate in this many rounds


async def _create(host: RunningHost, sid: str, corpus: Corpus) -> None:
    await host.pipeline.call("session.create", {"sessionId": sid, "title": f"bench {sid}"}, call_context())
    for m in corpus.messages(f"{sid}-warm", WARMUP):  # first append pays the actor start + catch-up
        await host.pipeline.call("session.appendMessage", {"sessionId": sid, "message": m}, call_context())


async def _sequential(host: RunningHost, sid: str, messages: Sequence[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    for m in messages:
        await host.pipeline.call("session.appendMessage", {"sessionId": sid, "message": m}, call_context())
    return time.perf_counter() - t0


async def _total(host: RunningHost, sid: str) -> int:
    got = await host.pipeline.call("session.get", {"sessionId": sid, "messageLimit": 1}, call_context())
    return int(got["totalMessages"])


async def _drive_appends(root: Path, one: list[dict[str, Any]], multi: dict[str, list[dict[str, Any]]],
                         corpus: Corpus, raw: RawLoop) -> dict[str, Any]:
    lines = encoded_lines(one)
    async with inprocess_host(root) as host:
        await _create(host, "one", corpus)
        one_secs = 0.0
        for msgs, raw_lines in zip(chunks(one, ROUNDS), chunks(lines, ROUNDS), strict=True):
            await trio.to_thread.run_sync(raw.run, raw_lines)
            await raw.run_hopped(raw_lines)
            one_secs += await _sequential(host, "one", msgs)
        for sid in multi:
            await _create(host, sid, corpus)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for sid, msgs in multi.items():
                nursery.start_soon(_sequential, host, sid, msgs)
        multi_secs = time.perf_counter() - t0
        totals = {"one": await _total(host, "one")}
        for sid in multi:
            totals[sid] = await _total(host, sid)
    expected = {"one": len(one) + WARMUP, **{sid: len(m) + WARMUP for sid, m in multi.items()}}
    if totals != expected:
        raise AssertionError(f"message counts after the run differ from what was appended: {totals} vs {expected}")
    return {"oneSecs": one_secs, "multiSecs": multi_secs}


def run_appends(sizes: Sizes, work: Path) -> Section:
    sec = Section("appends", "Durable appends (in-process, one at a time awaited)")
    corpus = Corpus(seed=11)
    one = corpus.messages("one", sizes.session_appends)
    multi = {f"c{j:02d}": corpus.messages(f"c{j:02d}", sizes.appends_per_session) for j in range(sizes.sessions)}
    root = work / "appends"
    raw = RawLoop(root / "sessions")
    try:
        got = trio.run(_drive_appends, root, one, multi, corpus, raw)
    finally:
        raw.close()
    n_multi = sizes.sessions * sizes.appends_per_session
    one_rate = len(one) / got["oneSecs"]
    multi_rate = n_multi / got["multiSecs"]
    sec.figures = {
        "raw": raw.figures(),
        "oneSession": {"appends": len(one), "perSec": rnd(one_rate),
                       "meanAckMs": rnd(got["oneSecs"] / len(one) * 1000),
                       "ratioToRaw": rnd(ratio(one_rate, raw.per_sec)),
                       "ratioToRawViaWorkerThread": rnd(ratio(one_rate, raw.hopped_per_sec)),
                       "rawViaWorkerThreadToRaw": rnd(ratio(raw.hopped_per_sec, raw.per_sec))},
        "concurrentSessions": {"sessions": sizes.sessions, "appends": n_multi,
                               "aggregatePerSec": rnd(multi_rate),
                               "ratioToRaw": rnd(ratio(multi_rate, raw.per_sec))},
    }
    sec.targets = [
        Target("one session / raw write+fdatasync loop", ratio(one_rate, raw.per_sec), ">=", ONE_SESSION_TARGET,
               "one fsync on the ack path"),
    ]
    sec.notes = [
        f"raw loop: {raw.appends} x (write + fdatasync) of the same encoded lines in the transcripts directory, "
        f"alternating with the one-session appends in {ROUNDS} rounds (same disk conditions)",
        f"{sizes.sessions} sessions concurrently: aggregate ratio to the same raw loop is reported, no target",
        "viaWorkerThread: the raw loop driven from trio with each write+fdatasync in a worker thread (one hop "
        "per append, the least a host pays that keeps fsync off its event loop); rawViaWorkerThreadToRaw is the "
        "best ratio to the raw loop such a host can reach on this machine",
    ]
    return sec


# ----------------------------------------------------------------------------- synchronous


async def _drive_sync(root: Path, mode: str | None, msgs: list[dict[str, Any]], settings: int,
                      corpus: Corpus) -> dict[str, Any]:
    async with inprocess_host(root, synchronous=mode) as host:
        await _create(host, "sync", corpus)
        append_secs = await _sequential(host, "sync", msgs)
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
