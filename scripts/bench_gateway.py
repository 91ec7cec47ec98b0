"""The WebSocket gateway (issues 3 and 12): a real ``pi-host serve --port 0`` subprocess and
``runtime.client`` clients.

* one client, ``session.appendMessage`` one at a time: round-trip p50/p99 and
  appends/s against ``SQLiteSession`` (``bench_baselines.py``, one session) and the
  raw write+fdatasync loop of the same lines, alternating in rounds;
* N clients on N sessions at once, against ``SQLiteSession`` with N sessions at once
  (alternating in rounds), and against the same gateway's throughput for
  ``host.status`` with N clients (storage must not be the bottleneck);
* JSON-RPC batches of 64 appends to one session: messages/s acknowledged, then the
  index catching up at its own rate (sustained messages/s until a search finds the
  last acknowledged message, and the seconds from that acknowledgement until it does).

CPU per append over WebSocket is the host subprocess's CPU (``/proc/<pid>/stat``)
plus the client's own (``time.process_time``), over exactly the measured segments
(each ending with one ``session.list``, which waits for the index to cover every
acknowledged append, so index work is charged to the appends that caused it).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import trio
from bench_baselines import SQLiteSessionBaseline
from bench_common import (
    Corpus,
    IndexSqlOnly,
    Meter,
    RawLoop,
    Section,
    Sizes,
    Target,
    chunks,
    encoded_lines,
    host_commit_groups,
    index_sql_only,
    main_thread_cpu_seconds,
    pct,
    process_cpu_seconds,
    ratio,
    rnd,
    rounds_of,
    shown,
    start_host_process,
)

from runtime.client import HostClient, RpcError, open_client

BATCH = 64
ONE_CLIENT_TARGET = 1.0     # x SQLiteSession, one session
CONCURRENT_TARGET = 1.0     # x SQLiteSession, N sessions at once (issue 26)
HOST_CPU_MS_TARGET = 0.45   # host CPU per append, one client, index included (issue 26)
BATCH_TARGET = 20_000.0     # messages/s acknowledged
WARMUP = 5
ROUNDS = 10  # the baselines and the clients' appends alternate in this many rounds
SEARCH_DEADLINE = 120.0


def _append(sid: str, m: dict[str, Any]) -> dict[str, Any]:
    return {"sessionId": sid, "message": m}


async def _prepare(client: HostClient, sid: str, warm: Sequence[dict[str, Any]]) -> None:
    await client.call("session.create", {"sessionId": sid, "title": f"gateway {sid}"})
    for m in warm:
        await client.call("session.appendMessage", _append(sid, m))


async def _index_barrier(client: HostClient) -> None:
    """``session.list`` waits until the index covers every append acknowledged before it arrived."""
    await client.call("session.list", {"limit": 1})


async def _appends(client: HostClient, sid: str, msgs: Sequence[dict[str, Any]], lat: list[float]) -> None:
    for m in msgs:
        t0 = time.perf_counter()
        await client.call("session.appendMessage", _append(sid, m))
        lat.append(time.perf_counter() - t0)


async def _one_client(url: str, token: str, pid: int, msgs: Sequence[dict[str, Any]], corpus: Corpus,
                      raw: RawLoop, sql: SQLiteSessionBaseline) -> dict[str, Any]:
    lat: list[float] = []
    lines = encoded_lines(msgs)
    host, lite = Meter(pid=pid), Meter()
    async with open_client(url, token, client_id="bench-one") as c:
        warm = corpus.messages("gw-one-warm", WARMUP)
        await _prepare(c, "gw-one", warm)
        await sql.append_each("gw-one", warm)
        status = await c.call("host.status", {})
        before, steps_before = status["dbWriter"], status["trio"]
        for part, raw_lines in zip(chunks(msgs, ROUNDS), chunks(lines, ROUNDS), strict=True):
            await trio.to_thread.run_sync(raw.run, raw_lines)
            await raw.run_hopped(raw_lines)
            await lite.measure(len(part), partial(sql.append_each, "gw-one", part))
            await host.measure(len(part), partial(_appends, c, "gw-one", part, lat), partial(_index_barrier, c))
        status = await c.call("host.status", {})  # the status calls add no index op
        after, steps_after = status["dbWriter"], status["trio"]
    n = len(msgs)
    hand_offs = {"taskStepsPerAppend": rnd((steps_after["taskSteps"] - steps_before["taskSteps"]) / n),
                 "ioWaitsPerAppend": rnd((steps_after["ioWaits"] - steps_before["ioWaits"]) / n)}
    return {"lat": lat, "host": host, "sqlite": lite, "dbWriter": (before, after), "handOffs": hand_offs}


async def _concurrent(url: str, token: str, pid: int, work: dict[str, list[dict[str, Any]]], status_calls: int,
                      corpus: Corpus, sql: SQLiteSessionBaseline) -> dict[str, Any]:
    """N clients: ``status_calls`` host.status each (timed as a whole), then their appends in rounds
    alternating with SQLiteSession's N sessions."""
    lat: list[float] = []
    host, lite, status = Meter(pid=pid), Meter(), Meter(pid=pid)
    async with trio.open_nursery() as outer:
        clients: dict[str, HostClient] = {}
        ready = trio.Event()
        done = trio.Event()

        async def hold(sid: str) -> None:
            async with open_client(url, token, client_id=f"bench-{sid}") as c:
                clients[sid] = c
                if len(clients) == len(work):
                    ready.set()
                await done.wait()

        for sid in work:
            outer.start_soon(hold, sid)
        await ready.wait()
        for sid, c in clients.items():
            warm = corpus.messages(f"{sid}-warm", WARMUP)
            await _prepare(c, sid, warm)
            await sql.append_each(sid, warm)
        any_client = next(iter(clients.values()))

        async def statuses() -> None:
            async with trio.open_nursery() as nursery:
                for c in clients.values():
                    nursery.start_soon(_statuses, c, status_calls)

        async def appends(part: Mapping[str, Sequence[dict[str, Any]]]) -> None:
            async with trio.open_nursery() as nursery:
                for sid, msgs in part.items():
                    nursery.start_soon(_appends, clients[sid], sid, msgs, lat)

        await status.measure(len(clients) * status_calls, statuses)
        for part in rounds_of(work, ROUNDS):
            n = sum(len(v) for v in part.values())
            await lite.measure(n, partial(sql.append_concurrently, part))
            await host.measure(n, partial(appends, part), partial(_index_barrier, any_client))
        done.set()
    return {"lat": lat, "host": host, "sqlite": lite, "status": status}


async def _statuses(c: HostClient, calls: int) -> None:
    for _ in range(calls):
        await c.call("host.status", {})


def with_token(m: dict[str, Any], token: str) -> dict[str, Any]:
    """``m`` as a user text message that starts with ``token`` (for a search to find)."""
    text = " ".join(b.get("text") or b.get("content") or "" for b in m["blocks"])
    return {"id": m["id"], "role": "user", "blocks": [{"type": "text", "text": f"{token} {text}"}]}


async def _found(client: HostClient, query: str, message_id: str) -> bool:
    got = await client.call("search.sessions", {"query": query, "limit": 5})
    return any(s["messageId"] == message_id for r in got["results"] for s in r["snippets"])


async def _batches(url: str, token: str, pid: int, batches: list[list[dict[str, Any]]], corpus: Corpus,
                   needle: str) -> dict[str, Any]:
    last_id = batches[-1][-1]["id"]
    async with open_client(url, token, client_id="bench-batch") as c:
        await _prepare(c, "gw-batch", corpus.messages("gw-batch-warm", WARMUP))
        await _index_barrier(c)
        c0, h0, m0 = time.process_time(), process_cpu_seconds(pid), main_thread_cpu_seconds(pid)
        t0 = time.perf_counter()
        for group in batches:
            results = await c.batch([("session.appendMessage", _append("gw-batch", m)) for m in group])
            failed = [r for r in results if isinstance(r, RpcError)]
            if failed:
                raise RuntimeError(f"{len(failed)} appends of a batch failed: {failed[0]}")
        acked = time.perf_counter()
        c1, h1, m1 = time.process_time(), process_cpu_seconds(pid), main_thread_cpu_seconds(pid)
        searches = 1
        while not await _found(c, needle, last_id):  # search.sessions waits for the index barrier itself
            if time.perf_counter() - acked > SEARCH_DEADLINE:
                raise AssertionError(f"search.sessions did not find {last_id} within {SEARCH_DEADLINE} s")
            searches += 1
            await trio.sleep(0.001)
        found = time.perf_counter()
        c2, h2 = time.process_time(), process_cpu_seconds(pid)
        total = (await c.call("session.get", {"sessionId": "gw-batch", "messageLimit": 1}))["totalMessages"]
        index_status = (await c.call("host.status", {}))["index"]
    expected = WARMUP + sum(len(g) for g in batches)
    if total != expected:
        raise AssertionError(f"batch session holds {total} messages, expected {expected}")
    return {"ackSecs": acked - t0, "searchFoundSecs": found - t0, "catchUpSecs": found - acked,
            "searches": searches, "ackCpu": (c1 - c0, h1 - h0), "caughtUpCpu": (c2 - c0, h2 - h0),
            "ackHostTrioThreadCpu": m1 - m0,
            "index": index_status}


def run_gateway(sizes: Sizes, work: Path) -> Section:
    sec = Section("gateway", "Gateway (pi-host serve subprocess, WebSocket JSON-RPC)")
    corpus = Corpus(seed=19)
    root = work / "gateway"
    one = corpus.messages("gw-one", sizes.gw_appends)
    multi = {f"g{j:02d}": corpus.messages(f"g{j:02d}", sizes.gw_calls_per_client) for j in range(sizes.gw_clients)}
    batches = [corpus.messages(f"gw-batch-{b:04d}", BATCH) for b in range(sizes.gw_batches)]
    needle = f"benchlastmsg{uuid.uuid4().hex}"  # in the run's last message only
    batches[-1][-1] = with_token(batches[-1][-1], needle)
    root.mkdir(parents=True, exist_ok=True)
    proc = start_host_process(root, "--count-task-steps")  # host.status.trio: its task steps and I/O waits
    pid = proc.proc.pid
    raw = RawLoop(root / "sessions")
    sql = SQLiteSessionBaseline(work / "gateway-baselines" / "sqlite-session.db")
    try:
        one_got = trio.run(_one_client, proc.url, proc.token, pid, one, corpus, raw, sql)
        conc = trio.run(_concurrent, proc.url, proc.token, pid, multi, sizes.gw_calls_per_client, corpus, sql)
        batch_lines = [encoded_lines(group) for group in batches]
        half = len(batch_lines) // 2
        raw.run_grouped(batch_lines[:half])
        bat = trio.run(_batches, proc.url, proc.token, pid, batches, corpus, needle)
        raw.run_grouped(batch_lines[half:])
        lite_counts = sql.counts()
    finally:
        raw.close()
        sql.close()
        proc.stop()
    expected = {"gw-one": len(one) + WARMUP, **{sid: len(m) + WARMUP for sid, m in multi.items()}}
    if lite_counts != expected:
        raise AssertionError(f"SQLiteSession holds {lite_counts} messages, expected {expected}")
    lat: list[float] = one_got["lat"]
    host1: Meter = one_got["host"]
    lite1: Meter = one_got["sqlite"]
    hostn: Meter = conc["host"]
    liten: Meter = conc["sqlite"]
    status: Meter = conc["status"]
    n_batch = sizes.gw_batches * BATCH
    batch_rate = n_batch / bat["ackSecs"]
    sustained = n_batch / bat["searchFoundSecs"]
    idx_batches = index_sql_only(root / "index-only", batches)  # one transaction per batch, as they arrive
    one_groups, ops_per_commit = host_commit_groups(one, *one_got["dbWriter"])  # as the host committed them
    idx_one = index_sql_only(root / "index-only-one", one_groups)
    index_rate = idx_batches.per_sec
    floors = _floors(raw, lite1, hostn, liten, idx_one, index_rate)
    floors["hostCpuPerAppend"].update(one_got["handOffs"])
    ack_client_cpu, ack_host_cpu = bat["ackCpu"]
    up_client_cpu, up_host_cpu = bat["caughtUpCpu"]
    sec.figures = {
        "raw": raw.figures(),
        "sqliteSession": {**sql.describe(), "oneSessionPerSec": rnd(lite1.per_sec),
                          "oneSessionCpuMsPerAppend": rnd(lite1.cpu_ms_per_op()),
                          "concurrentSessions": sizes.gw_clients,
                          "concurrentAggregatePerSec": rnd(liten.per_sec),
                          "concurrentCpuMsPerAppend": rnd(liten.cpu_ms_per_op())},
        "oneClient": {"appends": len(lat), "p50ms": rnd(pct(lat, 50) * 1000), "p99ms": rnd(pct(lat, 99) * 1000),
                      "perSec": rnd(host1.per_sec),
                      "hostCpuMsPerAppend": rnd(host1.other_cpu_ms_per_op()),
                      "hostTrioThreadCpuMsPerAppend": rnd(host1.other_main_cpu_ms_per_op()),
                      "clientCpuMsPerAppend": rnd(host1.cpu_ms_per_op()),
                      "cpuMsPerAppend": rnd(host1.other_cpu_ms_per_op() + host1.cpu_ms_per_op()),
                      "ratioToSqliteSession": rnd(ratio(host1.per_sec, lite1.per_sec)),
                      "ratioToRaw": rnd(ratio(host1.per_sec, raw.per_sec)),
                      "ratioToRawViaWorkerThread": rnd(ratio(host1.per_sec, raw.hopped_per_sec)),
                      # the host's trio thread (serve --count-task-steps), over the rounds: its appends and the
                      # one session.list ending each round
                      **one_got["handOffs"]},
        "concurrentClients": {"clients": sizes.gw_clients, "callsPerClient": sizes.gw_calls_per_client,
                              "appendsPerSec": rnd(hostn.per_sec),
                              "p50ms": rnd(pct(conc["lat"], 50) * 1000), "p99ms": rnd(pct(conc["lat"], 99) * 1000),
                              "hostCpuMsPerAppend": rnd(hostn.other_cpu_ms_per_op()),
                              "hostTrioThreadCpuMsPerAppend": rnd(hostn.other_main_cpu_ms_per_op()),
                              "clientCpuMsPerAppend": rnd(hostn.cpu_ms_per_op()),
                              "cpuMsPerAppend": rnd(hostn.other_cpu_ms_per_op() + hostn.cpu_ms_per_op()),
                              "ratioToSqliteSession": rnd(ratio(hostn.per_sec, liten.per_sec)),
                              "hostStatusPerSec": rnd(status.per_sec),
                              "ratioAppendToStatus": rnd(ratio(hostn.per_sec, status.per_sec)),
                              "appendRatioToRaw": rnd(ratio(hostn.per_sec, raw.per_sec))},
        "batches": {"batchSize": BATCH, "batches": sizes.gw_batches, "messagesPerSec": rnd(batch_rate),
                    "hostCpuMsPerMessage": rnd(ack_host_cpu / n_batch * 1000),
                    "hostTrioThreadCpuMsPerMessage": rnd(bat["ackHostTrioThreadCpu"] / n_batch * 1000),
                    "clientCpuMsPerMessage": rnd(ack_client_cpu / n_batch * 1000),
                    "ratioToRaw": rnd(ratio(batch_rate, raw.per_sec)),
                    # the best any design can do on this disk: one write of the batch's own bytes and
                    # one fdatasync per batch, nothing else
                    "rawBatchWriteCeiling": rnd(raw.grouped_lines_per_sec),
                    "ratioToCeiling": rnd(ratio(batch_rate, raw.grouped_lines_per_sec)),
                    "ceilingToTarget": rnd(ratio(raw.grouped_lines_per_sec, BATCH_TARGET)),
                    "indexSqlOnlyPerSec": rnd(index_rate),
                    "indexSqlOnlyCpuMsPerMessage": rnd(idx_batches.cpu_ms_per_message),
                    "indexSqlOnlyToTarget": rnd(ratio(index_rate, BATCH_TARGET))},
        "indexSqlOnlyOneClient": {**idx_one.figures(), "hostOpsPerCommit": rnd(ops_per_commit)},
        "floors": floors,
        "batchesIndexCatchUp": {"sustainedSearchCaughtUpPerSec": rnd(sustained),
                                "lastAckToSearchFindsSecs": rnd(bat["catchUpSecs"]),
                                "searchCalls": bat["searches"],
                                "hostCpuMsPerMessage": rnd(up_host_cpu / n_batch * 1000),
                                "clientCpuMsPerMessage": rnd(up_client_cpu / n_batch * 1000),
                                "sustainedToIndexSqlOnly": rnd(ratio(sustained, index_rate)),
                                "indexMaxLagOps": bat["index"]["maxLagOps"],
                                "indexMaxLagBytes": bat["index"]["maxLagBytes"],
                                "appendStalls": bat["index"]["appendStalls"]},
    }
    vs_lite, conc_floor, batch_floor = floors["vsSqliteSession"], floors["concurrent"], floors["batches"]
    sec.targets = [
        Target("one client / SQLiteSession baseline (appends/s)", ratio(host1.per_sec, lite1.per_sec), ">=",
               ONE_CLIENT_TARGET, "one session, one append awaited at a time; ceiling in this run: the raw loop "
               f"via one worker-thread hop {shown(vs_lite['rawViaWorkerThreadToSqliteSession'])}x SQLiteSession, hop + "
               f"index SQL alone in turn {shown(vs_lite['hopPlusIndexSqlToSqliteSession'])}x"),
        Target(f"{sizes.gw_clients} clients on {sizes.gw_clients} sessions / SQLiteSession with "
               f"{sizes.gw_clients} sessions (appends/s)", ratio(hostn.per_sec, liten.per_sec), ">=",
               CONCURRENT_TARGET, "group commit must pay off; in this run the host kept "
               f"{shown(conc_floor['hostCoresBusy'])} cores busy (CPU s / wall s; "
               f"{shown(conc_floor['hostCoresBusyUntilAcked'])} until the last reply, then the index catch-up, "
               f"{shown(conc_floor['indexCatchUpShareOfWall'])} of the wall time); CPU-bound ceiling at 1 core: "
               f"1 / {shown(conc_floor['hostCpuMsPerAppend'])} ms = {shown(conc_floor['cpuBoundCeilingPerSec'])}/s = "
               f"{shown(conc_floor['cpuBoundCeilingToSqliteSession'])}x SQLiteSession; on all "
               f"{conc_floor['cores']} cores, host + client CPU ({shown(conc_floor['hostAndClientCpuMsPerAppend'])} "
               f"ms): {shown(conc_floor['machineCpuCeilingPerSec'])}/s = "
               f"{shown(conc_floor['machineCpuCeilingToSqliteSession'])}x"),
        Target(f"batches of {BATCH} appends to one session (messages/s acknowledged)", batch_rate, ">=",
               BATCH_TARGET, f"bound in this run: the lower of the raw write+fdatasync of the same batches "
               f"{shown(batch_floor['rawBatchWritePerSec'])}/s and the index SQL alone "
               f"{shown(batch_floor['indexSqlOnlyPerSec'])}/s = {shown(batch_floor['boundPerSec'])}/s "
               f"({shown(batch_floor['boundedBy'])})"),
        Target("one client: host CPU ms per append (index included)", host1.other_cpu_ms_per_op(), "<=",
               HOST_CPU_MS_TARGET, host_cpu_detail(floors["hostCpuPerAppend"])),
    ]
    sec.notes = [
        f"raw loop and SQLiteSession (scripts/bench_baselines.py, in this bench process) alternate with the "
        f"one-client appends in {ROUNDS} rounds; SQLiteSession with {sizes.gw_clients} sessions ({sizes.gw_clients} "
        "trio tasks) alternates with the clients' rounds; raw loop in the host's transcripts directory, the "
        "SQLite file on the same filesystem",
        "cpuMsPerAppend = hostCpuMsPerAppend (the pi-host serve subprocess, /proc/<pid>/stat utime+stime, "
        "clock-tick resolution; hostTrioThread* is its main thread's share, /proc/<pid>/task/<pid>/stat, the rest "
        "ran in worker threads: transcript writes, the DB writer's index commits, reads) + clientCpuMsPerAppend "
        "(this process, time.process_time), over the measured "
        "segments; each segment ends with one session.list, which waits for the index to cover the segment's "
        "appends, so their index work is counted (that call's own cost too)",
        "host.status with the same clients is the gateway's no-op reference of issue 3 (it walks the data "
        "directory in a worker thread): ratioAppendToStatus is reported, no longer a target",
        f"batch ceiling = the same {BATCH} encoded lines per batch written with one write + one fdatasync in a "
        "tight loop (half before, half after the host's batches): no design can acknowledge those bytes faster "
        "on this disk; ceilingToTarget < 1 means the target is out of reach here for messages of this size",
        "batchesIndexCatchUp: the run's last message carries a unique token; sustainedSearchCaughtUpPerSec = "
        "the batches' messages / seconds from sending the first batch until search.sessions for that token "
        "returns the last acknowledged message (search.sessions waits for the index to cover every append "
        "acknowledged before it); lastAckToSearchFindsSecs = seconds from the last acknowledgement until then",
        "indexSqlOnly: the same batches through index.index_messages on a scratch database (real schema, "
        "trigram FTS triggers, one transaction per batch, no file or gateway work). Appends are acknowledged "
        "after the transcript fsync and the index commits behind a read barrier (ARCHITECTURE.md \"Read "
        "barriers\"), so it bounds how fast search can keep up, not the acknowledged rate; the index lag is "
        "bounded (appends stall beyond it), so over a long run it bounds the acknowledged rate as well",
        "indexSqlOnlyOneClient: the one-client messages the same way, in transactions of hostOpsPerCommit "
        "messages (the host's own DB writer commits in that segment: index ops / transactions); "
        "cpuMsPerMessage is that thread's time.thread_time",
        "floors (the bound beside each target, every part measured in this run): vsSqliteSession = the raw "
        "loop via one worker-thread hop (this section's, in this process) and the hop + the index SQL alone "
        "(indexSqlOnlyOneClient, paid in turn) over SQLiteSession with one session; concurrent.hostCoresBusy = "
        "the host's CPU seconds / wall seconds over the clients' segments (index catch-up included; its Python "
        "work holds the interpreter lock: about one core, SQLite and fsync in its worker threads run outside "
        "it), hostCoresBusyUntilAcked the same until each segment's last reply, indexCatchUpShareOfWall the "
        "share of the segments' wall time spent waiting for the index after it; cpuBoundCeilingPerSec = 1 core / "
        "the host's CPU per append (the host can pass it: its worker threads run outside the lock); "
        "machineCpuCeilingPerSec = every core / (host + client CPU per append), the bound with nothing else "
        "running; batches: the lower of the batch ceiling and indexSqlOnlyPerSec; hostCpuPerAppend: the hop's "
        "CPU + the index SQL alone's CPU per message, and the in-process CPU per append of the appends section "
        "of this run (when it ran before this one)",
    ]
    return sec


def _floors(raw: RawLoop, lite1: Meter, hostn: Meter, liten: Meter, idx_one: IndexSqlOnly,
            index_batches_per_sec: float) -> dict[str, dict[str, Any]]:
    """The bound of each target, from figures measured in this section."""
    hop_ms = 1000 / raw.hopped_per_sec
    both_ms = hop_ms + idx_one.ms_per_message
    host_cpu_ms = hostn.other_cpu_ms_per_op()
    ceiling = 1000 / host_cpu_ms if host_cpu_ms > 0 else math.nan
    # every core of the machine on the host's and the client's CPU per append, nothing else running
    both_cpu_ms = host_cpu_ms + hostn.cpu_ms_per_op()
    cores = os.cpu_count() or 1
    machine_ceiling = cores * 1000 / both_cpu_ms if both_cpu_ms > 0 else math.nan
    bound, bounded_by = min((raw.grouped_lines_per_sec, "raw batch write"),
                            (index_batches_per_sec, "index SQL alone"))
    return {
        "vsSqliteSession": {"rawViaWorkerThreadToSqliteSession": rnd(ratio(raw.hopped_per_sec, lite1.per_sec)),
                            "hopPlusIndexSqlToSqliteSession": rnd(ratio(1000 / both_ms, lite1.per_sec))},
        "concurrent": {"hostCoresBusy": rnd(hostn.other_cores_busy()),
                       "hostCoresBusyUntilAcked": rnd(hostn.other_cores_busy_in_work()),
                       "indexCatchUpShareOfWall": rnd(ratio(hostn.span - hostn.seconds, hostn.span)),
                       "hostCpuMsPerAppend": rnd(host_cpu_ms),
                       "cpuBoundCeilingPerSec": rnd(ceiling),
                       "cpuBoundCeilingToSqliteSession": rnd(ratio(ceiling, liten.per_sec)),
                       "cores": cores, "hostAndClientCpuMsPerAppend": rnd(both_cpu_ms),
                       "machineCpuCeilingPerSec": rnd(machine_ceiling),
                       "machineCpuCeilingToSqliteSession": rnd(ratio(machine_ceiling, liten.per_sec))},
        "batches": {"rawBatchWritePerSec": rnd(raw.grouped_lines_per_sec),
                    "indexSqlOnlyPerSec": rnd(index_batches_per_sec), "boundPerSec": rnd(bound),
                    "boundedBy": bounded_by},
        "hostCpuPerAppend": {"rawViaWorkerThreadCpuMs": rnd(raw.hopped_cpu_ms_per_append),
                             "indexSqlCpuMs": rnd(idx_one.cpu_ms_per_message),
                             "sumCpuMs": rnd(raw.hopped_cpu_ms_per_append + idx_one.cpu_ms_per_message)},
    }


def host_cpu_detail(floor: Mapping[str, Any]) -> str:
    """The note beside the host-CPU target: its floor, and the in-process figure once linked."""
    text = (f"the pi-host serve process, /proc/<pid>/stat; floor in this run: raw loop via one worker-thread hop "
            f"{shown(floor['rawViaWorkerThreadCpuMs'])} ms + index SQL alone {shown(floor['indexSqlCpuMs'])} ms = "
            f"{shown(floor['sumCpuMs'])} ms")
    if floor.get("taskStepsPerAppend") is not None:
        text += (f"; its trio thread per append: {shown(floor['taskStepsPerAppend'])} task steps, "
                 f"{shown(floor['ioWaitsPerAppend'])} I/O waits")
    if floor.get("inProcessCpuMs") is not None:
        text += (f"; in-process in this run (appends section, both threads, index and driver included): "
                 f"{shown(floor['inProcessCpuMs'])} ms, its floor {shown(floor['inProcessFloorCpuMs'])} ms")
        if floor.get("inProcessTaskStepsPerAppend") is not None:
            text += f", {shown(floor['inProcessTaskStepsPerAppend'])} task steps per append"
    return text


def link_in_process(gateway: Section, appends: Mapping[str, Any]) -> None:
    """Set the in-process CPU per append of the same run's appends section (its figures, as in the
    report) beside the host-CPU target: the WebSocket host's cost over the in-process one is the
    gateway's own share."""
    figs = appends.get("figures") or {}
    in_process = (figs.get("oneSession") or {}).get("cpuMsPerAppend")
    floors = gateway.figures.get("floors")
    if in_process is None or not isinstance(floors, dict):
        return
    floor = floors["hostCpuPerAppend"]
    floor["inProcessCpuMs"] = in_process
    floor["inProcessFloorCpuMs"] = ((figs.get("floors") or {}).get("cpuPerAppend") or {}).get("sumCpuMs")
    floor["inProcessTaskStepsPerAppend"] = (figs.get("oneSession") or {}).get("taskStepsPerAppend")
    gateway.targets = [replace(t, detail=host_cpu_detail(floor)) if t.name.startswith("one client: host CPU")
                       else t for t in gateway.targets]
