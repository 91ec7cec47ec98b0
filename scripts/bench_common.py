"""Shared pieces of ``scripts/bench``: sizes, targets, wall and CPU meters, message
corpus, raw fsync loop, rounds, in-process and subprocess hosts, machine info.

Every section module (``bench_appends``, ``bench_windows``, ``bench_gateway``,
``bench_history``) returns a :class:`Section`: absolute figures plus the ratios that matter, each
ratio compared with its target (PASS/MISS, never an exception).
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(ROOT))

from actors.gateway_types import CallContext  # noqa: E402 - after the sys.path setup above
from runtime.config import HostConfig  # noqa: E402 - after the sys.path setup above
from runtime.datadir import DataDir  # noqa: E402 - after the sys.path setup above
from runtime.host import RunningHost, run_host  # noqa: E402 - after the sys.path setup above
from store.fsutil import write_all  # noqa: E402 - after the sys.path setup above
from store.indexing import index  # noqa: E402 - after the sys.path setup above
from store.indexing.database import open_writer  # noqa: E402 - after the sys.path setup above
from store.jsonio import dumps_line  # noqa: E402 - after the sys.path setup above
from store.transcripts.records import normalize_message  # noqa: E402 - after the sys.path setup above

# ----------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """How much work each section does. ``full`` is the default, ``quick`` is CI-sized."""

    name: str
    raw_appends: int                      # raw write+fdatasync loop iterations
    session_appends: int                  # one session, one append at a time
    sessions: int                         # concurrent sessions (issue 2: 50)
    appends_per_session: int              # per concurrent session
    window_sizes: tuple[int, int, int]    # messages in the small / medium / large session
    window_reps: int                      # timed newest-50 reads per session (warm)
    cold_reps: int                        # reads after the first one in the fresh process
    sync_appends: int                     # appends per synchronous mode
    sync_settings: int                    # settings.set calls per synchronous mode
    gw_appends: int                       # one WebSocket client, sequential appends
    gw_clients: int                       # concurrent clients (issue 3: 50)
    gw_calls_per_client: int              # per client, for appends and host.status
    gw_batches: int                       # JSON-RPC batches of 64 appends
    search_messages: int
    search_sessions: int
    search_queries: int
    search_reps: int
    search_brute: int
    revision_turns: int
    revision_bytes: int
    history_messages: int                 # the whole-history session (issue 12: 50,000)
    history_reps: int                     # timed whole-history reads per path, alternating with the parse
    import_mb: float = 1024.0             # generated Claude Code projects tree (issue 15: 1 GB)
    import_sessions: int = 64
    cli_reps: int = 20                    # rounds of the CLI start-up commands (bench_cli)


SIZES: Mapping[str, Sizes] = MappingProxyType({
    "full": Sizes("full", raw_appends=2000, session_appends=2000, sessions=50, appends_per_session=40,
                  window_sizes=(50, 5_000, 50_000), window_reps=60, cold_reps=20, sync_appends=1000,
                  sync_settings=1000, gw_appends=1000, gw_clients=50, gw_calls_per_client=40, gw_batches=100,
                  search_messages=1_000_000, search_sessions=5_000, search_queries=20, search_reps=3,
                  search_brute=5, revision_turns=40, revision_bytes=2048, history_messages=50_000, history_reps=5,
                  import_mb=1024.0, import_sessions=64),
    "quick": Sizes("quick", raw_appends=300, session_appends=300, sessions=50, appends_per_session=6,
                   window_sizes=(50, 2_000, 10_000), window_reps=30, cold_reps=10, sync_appends=200,
                   sync_settings=200, gw_appends=200, gw_clients=50, gw_calls_per_client=6, gw_batches=20,
                   search_messages=20_000, search_sessions=100, search_queries=10, search_reps=2,
                   search_brute=3, revision_turns=40, revision_bytes=2048, history_messages=10_000, history_reps=3,
                   import_mb=20.0, import_sessions=8, cli_reps=10),
    # For the smoke test only: every code path, seconds of work. One timed round where a round only
    # repeats what the figures are a median of (the smoke test asserts the report, never the speed).
    "tiny": Sizes("tiny", raw_appends=30, session_appends=30, sessions=5, appends_per_session=4,
                  window_sizes=(50, 200, 600), window_reps=2, cold_reps=1, sync_appends=20,
                  sync_settings=20, gw_appends=20, gw_clients=5, gw_calls_per_client=4, gw_batches=3,
                  search_messages=2_000, search_sessions=20, search_queries=3, search_reps=1,
                  search_brute=2, revision_turns=4, revision_bytes=256, history_messages=300, history_reps=1,
                  import_mb=1.0, import_sessions=4, cli_reps=1),
})

# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Target:
    """One measured ratio against its goal. ``op`` is ">=" or "<="."""

    name: str
    measured: float | None
    op: str
    goal: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        if self.measured is None or not math.isfinite(self.measured):
            return False
        return self.measured >= self.goal if self.op == ">=" else self.measured <= self.goal

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "MISS"

    def to_json(self) -> dict[str, Any]:
        # The exact value: a rounded one could sit on the other side of the goal
        # than the verdict (1.0004 shown as 1.0 against "<= 1"). Reports round for display.
        exact = self.measured if self.measured is not None and math.isfinite(self.measured) else None
        return {**asdict(self), "measured": exact, "verdict": self.verdict}

    def line(self) -> str:
        shown = "n/a" if self.measured is None else f"{self.measured:.3g}"
        detail = f"  {self.detail}" if self.detail else ""
        return f"  [{self.verdict}] {self.name}: {shown} (target {self.op} {self.goal:g}){detail}"


@dataclass
class Section:
    key: str
    title: str
    figures: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "seconds": round(self.seconds, 2), "figures": self.figures,
                "targets": [t.to_json() for t in self.targets], "notes": self.notes,
                "error": self.error, "skipped": self.skipped}


def rnd(value: float | None, digits: int = 3) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}") if abs(value) < 10 ** digits else round(value)


def shown(value: Any) -> str:
    """A figure as a note prints it: ``667`` rather than ``667.0``; ``n/a`` when it was not measured."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a" if value is None else str(value)
    return f"{value:g}"


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# ----------------------------------------------------------------------------- CPU and wall time


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process, all its threads (``/proc/<pid>/stat``,
    clock-tick resolution)."""
    return _stat_cpu_seconds(f"/proc/{pid}/stat")


def main_thread_cpu_seconds(pid: int) -> float:
    """The same for that process's main thread alone (``/proc/<pid>/task/<pid>/stat``): a host's trio
    thread; the rest of its CPU ran in worker threads (transcript writes, the DB writer, reads)."""
    return _stat_cpu_seconds(f"/proc/{pid}/task/{pid}/stat")


def _stat_cpu_seconds(path: str) -> float:
    with open(path, "rb") as fh:
        data = fh.read()
    fields = data[data.rindex(b")") + 2:].split()  # fields[0] is field 3 (state): utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Meter:
    """Wall and CPU seconds summed over the measured segments of one workload.

    ``cpu`` is this process's CPU time (``time.process_time``: every thread, so worker
    threads count); with ``pid`` set, ``other_cpu`` is that process's (a host subprocess) and
    ``other_main_cpu`` its main thread's share.
    """

    pid: int | None = None
    ops: int = 0
    seconds: float = 0.0
    span: float = 0.0  # wall seconds including ``settle`` (what the CPU clocks covered)
    cpu: float = 0.0
    other_cpu: float = 0.0
    other_work_cpu: float = 0.0  # the other process's CPU until ``work`` returned (``settle`` excluded)
    other_main_cpu: float = 0.0

    def _cpu_now(self) -> tuple[float, float, float]:
        if self.pid is None:
            return time.process_time(), 0.0, 0.0
        return time.process_time(), process_cpu_seconds(self.pid), main_thread_cpu_seconds(self.pid)

    async def measure(self, ops: int, work: Callable[[], Awaitable[Any]],
                      settle: Callable[[], Awaitable[Any]] | None = None) -> float:
        """Run ``work`` (``ops`` operations) and add its wall and CPU time. ``settle`` runs after the
        wall clock stops and before the CPU clocks do: work the operations left behind (the index
        committing after the replies) is charged to them, not to whatever is measured next."""
        c0, o0, m0 = self._cpu_now()
        t0 = time.perf_counter()
        await work()
        secs = time.perf_counter() - t0
        o_work = process_cpu_seconds(self.pid) if self.pid is not None and settle is not None else None
        if settle is not None:
            await settle()
        c1, o1, m1 = self._cpu_now()
        self.ops += ops
        self.seconds += secs
        self.span += time.perf_counter() - t0
        self.cpu += c1 - c0
        self.other_cpu += o1 - o0
        self.other_work_cpu += (o_work if o_work is not None else o1) - o0
        self.other_main_cpu += m1 - m0
        return secs

    @property
    def per_sec(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else math.nan

    def cpu_ms_per_op(self) -> float:
        return self.cpu / self.ops * 1000 if self.ops else math.nan

    def other_cpu_ms_per_op(self) -> float:
        return self.other_cpu / self.ops * 1000 if self.ops else math.nan

    def other_main_cpu_ms_per_op(self) -> float:
        return self.other_main_cpu / self.ops * 1000 if self.ops else math.nan

    def other_cores_busy(self) -> float:
        """The other process's CPU seconds per wall second over the segments, settling included:
        how many cores it kept busy (its Python work holds the interpreter lock: about one core; SQLite
        and fsync in its worker threads run outside it)."""
        return self.other_cpu / self.span if self.span > 0 else math.nan

    def other_cores_busy_in_work(self) -> float:
        """The same until each ``work`` returned (``settle`` excluded: while the operations ran)."""
        return self.other_work_cpu / self.seconds if self.seconds > 0 else math.nan


# ----------------------------------------------------------------------------- corpus

_WORDS: tuple[str, ...] = tuple((
    "the session index message transcript append durable fsync window offset reader writer actor "
    "trio sqlite query tool result assistant user file path build test error value return config "
    "request response batch commit journal page cache layout restart cold warm byte line json parse "
    "function class module import async await nursery cancel scope deadline retry receipt token"
).split())


class Corpus:
    """Deterministic realistic messages: 300 B-3 KB text (log-uniform), ~20 % tool rows."""

    def __init__(self, seed: int = 1) -> None:
        self._rng = random.Random(seed)
        self._pool = " ".join(self._rng.choice(_WORDS) for _ in range(20_000))

    def _text(self, lo: int = 300, hi: int = 3000) -> str:
        n = int(math.exp(self._rng.uniform(math.log(lo), math.log(hi))))
        start = self._rng.randrange(0, len(self._pool) - n)
        return self._pool[start:start + n]

    def message(self, mid: str, i: int) -> dict[str, Any]:
        r = self._rng.random()
        if r < 0.1:  # assistant tool call
            return {"id": mid, "role": "assistant", "blocks": [
                {"type": "text", "text": self._text(200, 800)},
                {"type": "tool_call", "callId": f"c-{mid}", "name": "Read",
                 "input": {"path": f"/src/pkg/mod{i % 97}.py"}}]}
        if r < 0.2:  # tool result row
            return {"id": mid, "role": "tool", "toolName": "Read", "blocks": [
                {"type": "tool_result", "callId": f"c-{mid}", "content": self._text()}]}
        return {"id": mid, "role": "user" if r < 0.5 else "assistant",
                "blocks": [{"type": "text", "text": self._text()}]}

    def messages(self, prefix: str, n: int) -> list[dict[str, Any]]:
        return [self.message(f"{prefix}-{i:06d}", i) for i in range(n)]


def encoded_lines(messages: Sequence[dict[str, Any]]) -> list[bytes]:
    """The transcript lines the host writes for these messages (same encoder, same normalisation)."""
    now = int(time.time() * 1000)
    return [dumps_line(normalize_message(m, now_ms=now)) for m in messages]


# ----------------------------------------------------------------------------- index SQL alone


@dataclass(frozen=True)
class IndexSqlOnly:
    """What the DB writer's SQL alone costs for some messages (:func:`index_sql_only`)."""

    messages: int
    transactions: int
    seconds: float
    cpu: float  # CPU seconds of the thread that ran the SQL (time.thread_time)

    @property
    def per_sec(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else math.nan

    @property
    def ms_per_message(self) -> float:
        return self.seconds / self.messages * 1000 if self.messages else math.nan

    @property
    def cpu_ms_per_message(self) -> float:
        return self.cpu / self.messages * 1000 if self.messages else math.nan

    def figures(self) -> dict[str, Any]:
        return {"messages": self.messages, "transactions": self.transactions, "perSec": rnd(self.per_sec),
                "msPerMessage": rnd(self.ms_per_message), "cpuMsPerMessage": rnd(self.cpu_ms_per_message)}


def host_commit_groups(messages: Sequence[dict[str, Any]], before: Mapping[str, Any],
                       after: Mapping[str, Any]) -> tuple[list[Sequence[dict[str, Any]]], float]:
    """``messages`` cut into transactions of as many index ops as the host's DB writer put in each of its
    commits between two ``host.status`` ``dbWriter`` readings, and that mean (ops / transactions)."""
    commits = after["batches"] - before["batches"]
    per_commit = (after["ops"] - before["ops"]) / commits if commits else 1.0
    n = max(1, round(per_commit))
    return [messages[i:i + n] for i in range(0, len(messages), n)], per_commit


def index_sql_only(root: Path, groups: Sequence[Sequence[dict[str, Any]]]) -> IndexSqlOnly:
    """The DB writer's SQL alone for these messages: a scratch database with the real schema
    (trigram FTS triggers included), ``index.index_messages`` with each message's transcript line
    (as a session actor passes them), one transaction per group, ``synchronous=NORMAL`` as for
    derived rows; no file, no fsync, no actor, no gateway. Wall and CPU time of the loop alone
    (encoding the lines happens before the clocks start)."""
    root.mkdir(parents=True, exist_ok=True)
    conn, _ = open_writer(root / "index-only.sqlite", quarantine_dir=root / "q", now_ms=1, synchronous="NORMAL")
    try:
        conn.execute("BEGIN")
        index.insert_session(conn, "index-only", now_ms=1)
        conn.execute("COMMIT")
        work: list[list[index.IndexRecord]] = []
        offset = 0
        for group in groups:
            items = []
            for m in group:
                rec = normalize_message(m, now_ms=1)
                line = dumps_line(rec)
                items.append(index.IndexRecord(rec, offset, len(line), line=line))
                offset += len(line)
            work.append(items)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        for items in work:
            if not items:
                continue
            conn.execute("BEGIN")
            index.index_messages(conn, "index-only", items, indexed_len=items[-1].offset + items[-1].length,
                                 file_epoch=None, now_ms=1)
            conn.execute("COMMIT")
        secs = time.perf_counter() - t0
        cpu = time.thread_time() - c0
    finally:
        conn.close()
    for path in root.iterdir():
        if path.is_file():
            path.unlink()
    return IndexSqlOnly(messages=sum(len(w) for w in work), transactions=len(work), seconds=secs, cpu=cpu)


# ----------------------------------------------------------------------------- raw loop


class RawLoop:
    """The baseline: one ``write`` + ``fdatasync`` per line, appending to a fresh file.

    Call :meth:`run` in rounds interleaved with the measured workload so both
    see the same disk weather (the bench machine may be shared and noisy).
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "bench-raw-baseline.bin"  # not *.jsonl: boot must not see a session
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.write(self._fd, b'{"type":"session"}\n')
        os.fdatasync(self._fd)
        self.appends = 0
        self.bytes = 0
        self.seconds = 0.0
        self.cpu = 0.0
        self.hop_appends = 0
        self.hop_seconds = 0.0
        self.hop_cpu = 0.0
        self.groups = 0
        self.grouped_lines = 0
        self.grouped_seconds = 0.0

    def run(self, lines: Sequence[bytes]) -> float:
        c0 = time.process_time()
        t0 = time.perf_counter()
        for line in lines:
            self._write_durably(line)
        secs = time.perf_counter() - t0
        self.cpu += time.process_time() - c0
        self.appends += len(lines)
        self.bytes += sum(len(b) for b in lines)
        self.seconds += secs
        return secs

    def _write_durably(self, data: bytes) -> None:
        write_all(self._fd, data)
        os.fdatasync(self._fd)

    async def run_hopped(self, lines: Sequence[bytes]) -> float:
        """The same loop driven from trio, each write+fdatasync in a worker thread:
        one thread hop per append, the least any host that keeps fsync off its
        event loop pays. Its rate is the floor figure next to the raw one."""
        c0 = time.process_time()
        t0 = time.perf_counter()
        for line in lines:
            await trio.to_thread.run_sync(self._write_durably, line)
        secs = time.perf_counter() - t0
        self.hop_cpu += time.process_time() - c0
        self.hop_appends += len(lines)
        self.hop_seconds += secs
        return secs

    def run_grouped(self, groups: Sequence[Sequence[bytes]]) -> float:
        """One write of each group's lines joined, then one fdatasync: the ceiling
        for group commit of exactly those bytes on this disk."""
        t0 = time.perf_counter()
        for group in groups:
            self._write_durably(b"".join(group))
        secs = time.perf_counter() - t0
        self.groups += len(groups)
        self.grouped_lines += sum(len(g) for g in groups)
        self.grouped_seconds += secs
        return secs

    @property
    def per_sec(self) -> float:
        return self.appends / self.seconds if self.seconds > 0 else math.nan

    @property
    def hopped_per_sec(self) -> float:
        return self.hop_appends / self.hop_seconds if self.hop_seconds > 0 else math.nan

    @property
    def hopped_cpu_ms_per_append(self) -> float:
        return self.hop_cpu / self.hop_appends * 1000 if self.hop_appends else math.nan

    @property
    def grouped_lines_per_sec(self) -> float:
        return self.grouped_lines / self.grouped_seconds if self.grouped_seconds > 0 else math.nan

    def close(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"appends": self.appends, "bytes": self.bytes, "perSec": rnd(self.per_sec),
                               "cpuMsPerAppend": rnd(self.cpu / self.appends * 1000 if self.appends else None)}
        if self.hop_appends:
            out["viaWorkerThreadPerSec"] = rnd(self.hopped_per_sec)
            out["viaWorkerThreadCpuMsPerAppend"] = rnd(self.hopped_cpu_ms_per_append)
        if self.groups:
            out["groups"] = self.groups
            out["groupedLinesPerSec"] = rnd(self.grouped_lines_per_sec)
        return out


def chunks(items: Sequence[Any], rounds: int) -> list[Sequence[Any]]:
    """Split ``items`` into ``rounds`` contiguous, nearly equal parts (no empty part)."""
    rounds = max(1, min(rounds, len(items)))
    step, extra = divmod(len(items), rounds)
    out: list[Sequence[Any]] = []
    pos = 0
    for r in range(rounds):
        n = step + (1 if r < extra else 0)
        out.append(items[pos:pos + n])
        pos += n
    return out


def rounds_of(work: Mapping[str, Sequence[Any]], rounds: int) -> list[dict[str, Sequence[Any]]]:
    """``work`` (per session) cut into ``rounds`` parts, each part a slice of every session's list."""
    n = min((len(v) for v in work.values()), default=0)
    parts = {sid: chunks(msgs, min(rounds, n)) for sid, msgs in work.items()}
    return [{sid: p[r] for sid, p in parts.items()} for r in range(min(rounds, n))]



# ----------------------------------------------------------------------------- hosts


SWEEP_OFF = ("--integrity-sweep", "0")
"""The idle integrity sweep (a pass a minute after boot, then hourly, only while the DB writer is idle) is
left out of every measured host: its pass over a large index would share the cores with whatever a section
measures next, differently from run to run."""


def host_config(root: Path, **overrides: Any) -> HostConfig:
    base: dict[str, Any] = dict(data_dir=DataDir(root), port=0, session_idle_timeout=3600.0, ask_timeout=300.0,
                                integrity_sweep_interval=None, freeze_boot=True)
    base.update(overrides)
    return HostConfig(**base)


@asynccontextmanager
async def inprocess_host(root: Path, **overrides: Any) -> AsyncIterator[RunningHost]:
    """The real host (boot, actors, gateway) inside this trio run; cleanly stopped on exit.

    Boot sets the collector as ``pi-host serve`` has it (``HostConfig.freeze_boot``, before the read
    warm-up: ``freeze_boot_objects``): what is alive then is frozen, the youngest generation's threshold
    raised. Without it every full collection walked the benchmark process's ~80,000 boot objects again
    (some 45 ms each, one every few thousand appends, charged to whichever measured segment it fell in)
    and a young collection ran every ~40 appends: CPU a served host does not spend."""
    async with trio.open_nursery() as nursery:
        running: RunningHost = await nursery.start(run_host, host_config(root, **overrides))
        try:
            yield running
        finally:
            nursery.cancel_scope.cancel()


def call_context(client_id: str = "bench") -> CallContext:
    return CallContext(connection_id=0, client_id=client_id, client_kind="bench", protocol=1)


@dataclass
class HostProcess:
    proc: subprocess.Popen[bytes]
    url: str
    token: str

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=timeout)


def start_host_process(data_dir: Path, *extra: str, timeout: float = 120) -> HostProcess:
    """``pi-host serve --port 0`` as a subprocess; returns once its ``host.json`` names it."""
    host_json = data_dir / "host.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "--data-dir", str(data_dir), "serve", "--port", "0", "--quiet",
         *SWEEP_OFF, *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"host exited with {proc.returncode}: {err[-3000:]}")
        try:
            info = json.loads(host_json.read_text())
            if info.get("pid") == proc.pid:
                return HostProcess(proc, info["url"], (data_dir / "host.token").read_text().strip())
        except (FileNotFoundError, ValueError):
            pass
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"host in {data_dir} did not write host.json within {timeout}s")


# ----------------------------------------------------------------------------- machine


def filesystem_of(path: Path) -> dict[str, str]:
    """Mount point, type and device of the filesystem holding ``path`` (from /proc/mounts)."""
    target = os.path.realpath(path)
    best = {"mount": "?", "type": "unknown", "device": "?"}
    try:
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                dev, mnt, fstype, *_ = line.split()
                mnt = mnt.replace("\\040", " ")
                inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best["mount"] if best["mount"] != "?" else ""):
                    best = {"mount": mnt, "type": fstype, "device": dev}
    except OSError:
        pass
    return best


def machine_info(bench_dir: Path) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "benchDir": str(bench_dir),
        "filesystem": filesystem_of(bench_dir),
        "gitCommit": commit,
    }
