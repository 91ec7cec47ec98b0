"""Chaos runs against a real host: SIGKILL cycles, actor kills, ext4 power cuts.

::

    scripts/chaos                                  # process mode, 5 cycles, random seed
    scripts/chaos --mode process --cycles 200 --seed 7
    scripts/chaos --mode actors --cycles 3 --kills 12
    scripts/chaos --mode powercut --cycles 10      # root: loop-mounted ext4 image
    scripts/chaos --mode fuzz --frames 100000      # every method, fuzzed params (scripts/chaos_fuzz.py)
    scripts/chaos --mode history --cycles 1000 --seed 7   # many methods + faults, history checker
    scripts/chaos --mode corrupt --cycles 20 --seed 7      # damage pi.sqlite while it runs

* **process** – a subprocess host (``tests/hostkit.start_host_process``) runs the
  workload (``scripts/chaos_workload.py``); it is SIGKILLed at a random moment
  (sometimes it kills itself first at a named crash point, ``RT_CRASHPOINT``,
  which may also fire during the next boot's recovery), restarted, verified.
* **actors** – an in-process host; the DB-writer and session actors are killed
  at random moments while clients retry with the same ``submissionId``; the host
  must keep serving. A final clean restart is verified too.
* **powercut** – process mode with the data directory on a loop-mounted ext4
  image: SIGKILL, then ``EXT4_IOC_SHUTDOWN`` without a journal flush, remount.
* **history** – several clients run a random mix of routed methods (sessions, settings,
  secrets, queue, approvals, collaboration, tasks) while DB-writer kills, session-actor kills
  and SIGKILLs land at random; the history is checked for lost and duplicated effects, stale
  reads, regressions and index/transcript mismatches (``scripts/chaos_history_mode.py``,
  ``scripts/chaos_history_check.py``); its LAST line is ``ops=… lost=… duplicated=…
  stale_reads=… regressions=… index_mismatch=… db_writer_kills=… actor_kills=… sigkills=…``.
* **corrupt** – process mode, but instead of a SIGKILL a random stretch (or a few random bytes) of
  ``pi.sqlite`` is overwritten while the workload runs (after a ``PRAGMA wal_checkpoint`` from a side
  connection, or not), and the workload goes on: a request meeting the damage must answer
  ``CORRUPT_DATA`` or see its connection close (``INTERNAL`` is a failure). The host must restart
  itself (same process, same URL: a new ``bootId``) on an index rebuilt from the transcripts with the
  DB-only rows salvaged; when it does not notice (the damage landed where nothing reads), reads over
  every table are sent, and after a bounded wait it is SIGKILLed and restarted as in process mode.
  Then the checker runs: a DB-only effect (queue entry, setting, turn row, notification, approval,
  delivery, DB-only receipt) may be missing only when the boot report's ``salvageSkipped`` names its
  table (or the salvage could not open the file) and that salvage ran after the effect was acknowledged
  and after the last check that saw it; such losses are ``damaged_lost``, not ``lost``
  (``scripts/chaos_corrupt.py``). After a rebuild a file-carried receipt may answer its rebuilt
  response (the same session, fields as they are now) and, once the salvage skipped receipts, DB-only
  requests acknowledged before are no longer replayed (their replay may run them again). Damage no read
  met (``integrity_check`` fails after a forced restart) is counted as ``undetected``, not failed. A
  ``session.get`` that answers CORRUPT_DATA for a damaged record it shows (an approval decision's JSON: the
  host keeps serving that index) is damage too (``damaged_lost``); that session's messages are then checked
  in its transcript. Its LAST line is ``cycles=N acknowledged=A lost=L duplicated=D internal=I damaged_lost=K``.
* **fuzz** – a subprocess host gets ``--frames`` fuzzed requests over every
  method (``scripts/chaos_fuzz.py``); its LAST line is
  ``frames=… internal=… crashes=… poisoned=…`` and any non-zero figure fails.

After every restart the checker (``scripts/chaos_checker.py``) verifies the
whole history so far; indeterminate appends and queue pushes are then retried
with the same ``submissionId`` and a sample of acknowledged requests is
replayed (stored receipts must not change). The seed (``--seed``) drives every
random choice; timing still varies between runs. The LAST line is
``cycles=N acknowledged=A lost=L duplicated=D`` (corrupt mode adds ``internal=I damaged_lost=K``);
the exit status is non-zero on any loss, duplicate, unexpected effect, ``INTERNAL`` answer or broken
invariant (``damaged_lost`` alone does not fail a run).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from runtime.cli_serve import INDEX_KEEPS_FAILING as GAVE_UP
from runtime.client import ClientClosed, RpcError, open_client
from scripts.chaos_checker import Report, check
from scripts.chaos_corrupt import FILE_RECEIPTS, Salvages, damage, damaged_tables, excused
from scripts.chaos_fuzz import FuzzReport, Pools, fuzz_host, seed_pools, verify
from scripts.chaos_fuzz import iter_frames as iter_fuzz_frames
from scripts.chaos_history import History, outcomes
from scripts.chaos_observe import ObserveNotes, observe, queue_entry_ids, scan_checkpoints
from scripts.chaos_powercut import LoopMount
from scripts.chaos_workload import HostGone, Pending, Worker, WorkloadConfig, host_stopping, make_workers
from tests.hostkit import HostProcess, inprocess_host, start_host_process

CRASH_POINTS: tuple[str, ...] = (
    "append.after_write", "append.after_fsync", "index.before_commit", "index.after_commit",
    "queue.between_effects", "queue.after_apply", "inflight.after_tmp_fsync", "inflight.after_rename",
    "inflight.before_dirsync",
)
BOOT_CRASH_POINTS: tuple[str, ...] = ("inflight.after_append", "inflight.before_commit", "inflight.before_remove")
CHECKER_CLIENT = "chaos-checker"


@dataclass
class RunConfig:
    mode: str = "process"
    cycles: int = 5
    seed: int = 0
    sessions: int = 4
    workdir: Path | None = None
    keep: bool = False
    keep_quarantined: bool = False
    """Corrupt mode: the host keeps every quarantined copy of the index (``pi-host serve --keep-quarantined``),
    and the work directory is kept with them."""
    run_time: tuple[float, float] = (0.3, 2.0)
    crashpoint_rate: float = 0.3
    kills: int = 12
    max_kills_per_10s: int = 15
    receipt_sample: int = 4
    search_sample: int = 40
    image_mb: int = 64
    frames: int = 100_000
    clients: int = 3
    verbose: bool = True
    rebuild_wait: float = 5.0
    check_wait: float = 180.0
    """A check step (observe, retries, replays) that gets no answer this long is a problem, not a hang."""


@dataclass
class Totals:
    cycles: int = 0
    acknowledged: int = 0
    attempted: int = 0
    lost: set[str] = field(default_factory=set)
    duplicated: set[str] = field(default_factory=set)
    recovered: set[str] = field(default_factory=set)
    unexpected: set[str] = field(default_factory=set)
    problems: dict[str, int] = field(default_factory=dict)
    crashpoints: Counter[str] = field(default_factory=Counter)
    boot_crashes: int = 0
    actor_kills: int = 0
    retried: int = 0
    receipts_replayed: int = 0
    checks: int = 0
    corrupt: bool = False
    internal: int = 0
    damaged_lost: set[str] = field(default_factory=set)
    salvages: Salvages = field(default_factory=Salvages)
    """Corrupt mode: the salvages so far that skipped rows, in history time (a loss of a DB-only row is excused
    by one that ran after its acknowledgement and after a check last saw it)."""
    undetected: int = 0
    """Corrupt mode: checks whose ``integrity_check`` found damage the host had not met (nothing read it)."""
    replays_dropped: int = 0
    replays_unanswered: int = 0
    """Replays the host answered only with "stopping" (``chaos_workload.host_stopping``): not checked."""
    self_restarts: int = 0
    gave_up: int = 0  # corrupt mode: the host exited 4 after more rebuilds than it allows (README), restarted
    forced_restarts: int = 0
    rebuilt: bool = False
    """Corrupt mode: an index was rebuilt from the transcripts (file-carried receipts answer rebuilt responses)."""
    rebuilt_answers: int = 0
    lost_receipts: set[str] = field(default_factory=set)
    """``method key`` of DB-only receipts a damaged page took (their replays answer a new run's response)."""

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.problems or self.internal)

    def add(self, report: Report) -> None:
        self.checks += 1
        self.acknowledged, self.attempted = report.acknowledged, report.attempted
        for name in report.lost:
            if name in self.damaged_lost or (
                    self.corrupt and self.salvages.excuses(name, report.anchors.get(name), report.checked_at)):
                self.damaged_lost.add(name)
            else:
                self.lost.add(name)
        self.salvages.checked(report.checked_at, report.acked, set(report.anchors.values()))
        for name in report.damaged:  # bytes changed in place: only the damage corrupt mode writes explains it
            if self.corrupt:
                self.damaged_lost.add(name)
            else:
                self.problems.setdefault(name, self.cycles)
        self.duplicated |= report.duplicated
        self.recovered |= report.recovered
        self.unexpected |= report.unexpected
        for p in report.problems:
            if self.corrupt and p.startswith("PRAGMA integrity_check"):
                self.undetected += 1
                continue
            self.problems.setdefault(p, self.cycles)

    def problem(self, text: str, anchor: int | None = None, at: int | None = None) -> None:
        """``anchor``/``at``: a receipt's acknowledgement and the history position of its replay (a salvage
        between them may have skipped it); without ``at`` any salvage so far excuses a DB-only finding."""
        receipt = " ".join(text.split(":", 2)[1].split()[:2]) if text.startswith("receipt replay:") else ""
        by_damage = excused(text, self.salvages.tables()) if at is None else \
            self.salvages.excuses(text, anchor, at, sightings=False)
        if self.corrupt and (receipt in self.lost_receipts or by_damage):
            self.damaged_lost.add(receipt or text)
            if receipt:
                self.lost_receipts.add(receipt)
            return
        self.problems.setdefault(text, self.cycles)

    def last_line(self) -> str:
        line = (f"cycles={self.cycles} acknowledged={self.acknowledged} lost={len(self.lost)} "
                f"duplicated={len(self.duplicated)}")
        if self.corrupt:
            line += f" internal={self.internal} damaged_lost={len(self.damaged_lost)}"
        return line


class Runner:
    def __init__(self, cfg: RunConfig, workdir: Path, out: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.out = out
        self.rng = random.Random(cfg.seed)
        self.history = History()
        wl = WorkloadConfig(sessions=cfg.sessions, retry_retriable=cfg.mode == "actors")
        self.workers = make_workers(self.history, wl, self.rng.getrandbits(64), prefix=f"chaos{cfg.seed % 10000}-s")
        self.notes = ObserveNotes()
        self.totals = Totals(corrupt=cfg.mode == "corrupt")

    def log(self, text: str) -> None:
        if self.cfg.verbose:
            self.out(text)

    # ------------------------------------------------------------------ shared steps
    async def verify(self, url: str, token: str, data_dir: Path, *, after_restart: bool,
                     leftover: dict[str, str], full: bool = False) -> Report:
        async with open_client(url, token, client_id=CHECKER_CLIENT, client_kind="test") as c:
            obs = await observe(c, self.workers, data_dir, after_restart=after_restart, leftover=leftover,
                                notes=self.notes, rng=self.rng, search_sample=None if full else self.cfg.search_sample)
            if after_restart:
                status = await c.call("host.status", {})
                boot = status.get("boot") or {}
                self.log(f"  boot: promoted={boot.get('inflightPromoted')} aborted={boot.get('turnsAborted')} "
                         f"indexRowsAdded={boot.get('indexRowsAdded')} cleanShutdown={boot.get('cleanShutdown')}")
                if self.totals.corrupt:
                    damaged = damaged_tables(boot)
                    self.totals.salvages.salvaged(len(self.history.ops), damaged, status.get("bootId"))
                    if "command_receipts" in damaged:
                        self.drop_replays()
                    self.totals.rebuilt |= bool((boot.get("database") or {}).get("rebuilt"))
                    if "salvage" in boot:
                        sal = boot["salvage"] or {}
                        self.log(f"  salvage: salvaged={boot.get('salvaged')} skipped={boot.get('salvageSkipped')} "
                                 f"errors={sorted(sal.get('errors') or {})} "
                                 f"failed={sal.get('failed') or sal.get('notSalvaged')}")
            report = check(self.history, obs)
            self.totals.add(report)
            entries = await queue_entry_ids(c, [w.sid for w in self.workers])
        for w in self.workers:  # the workers' queue model follows what the host (verified) holds
            w.queue = dict(entries.get(w.sid, {}))
        self.log(f"  check: {report.summary()} leftoverCheckpoints={len(leftover)}")
        for line in sorted(report.lost)[:5] + sorted(report.duplicated)[:5] + sorted(report.unexpected)[:5]:
            self.log(f"    ! {line}")
        for p in report.problems[:10]:
            self.log(f"    ! {p}")
        return report

    async def retry_and_replay(self, url: str, token: str) -> None:
        async def one(w: Worker) -> None:
            try:
                async with open_client(url, token, client_id=w.client_id, client_kind="test") as c:
                    self.totals.retried += await w.retry_pending(c)
                    accept = self.rebuilt_answer if self.totals.rebuilt else None
                    if self.totals.rebuilt:
                        w.acked = [p for p in w.acked if not self.truncated_away(p)]
                    unanswered = w.replays_unanswered
                    mismatches = await w.replay_receipts(c, self.cfg.receipt_sample, accept)
                    self.totals.replays_unanswered += w.replays_unanswered - unanswered
                    self.totals.receipts_replayed += min(self.cfg.receipt_sample, len(w.acked))
                    acks = {(o.f, o.key): o.ack_index for o in outcomes(self.history.ops).values()}
                    anchors = {f"{p.method} {p.key}:": acks.get((p.f, p.key)) for p in w.acked}
                    for m in mismatches:
                        anchor = next((a for pre, a in anchors.items() if m.startswith(pre)), None)
                        self.totals.problem(f"receipt replay: {m}", anchor, len(self.history.ops))
            except (HostGone, ClientClosed, OSError) as exc:
                # an armed crash point fired during the retries: the next cycle starts with a dead host
                self.log(f"  {w.name}: host died during retries ({type(exc).__name__})")

        async with trio.open_nursery() as n:
            for w in self.workers:
                n.start_soon(one, w)

    async def drive(self, w: Worker, url: str, token: str, stop: trio.Event) -> None:
        try:
            async with open_client(url, token, client_id=w.client_id, client_kind="test") as c:
                await w.run(c, stop)
        except Exception as exc:  # noqa: BLE001 - the host died under us: this worker's cycle is over
            self.log(f"  {w.name}: connection ended ({type(exc).__name__})")

    async def setup(self, url: str, token: str) -> None:
        for w in self.workers:
            async with open_client(url, token, client_id=w.client_id, client_kind="test") as c:
                await w.create(c)

    def check_definite_failures(self) -> None:
        for w in self.workers:
            bad = w.failures.get("IDEMPOTENCY_CONFLICT", 0)
            if bad:
                self.totals.problem(f"{w.name}: {bad} IDEMPOTENCY_CONFLICT on identical retries")
        if self.totals.corrupt:
            internal = [op for op in self.history.ops if op.type in ("info", "fail")
                        and isinstance(op.result, dict) and op.result.get("code") == "INTERNAL"]
            self.totals.internal = len(internal)
            for op in internal[:10]:
                self.out(f"INTERNAL {op.f} {op.key}: {op.result.get('message')}")

    # ------------------------------------------------------------------ process / powercut
    async def start(self, data_dir: Path, spec: str | None) -> HostProcess:
        env = {"RT_CRASHPOINT": spec} if spec else {"RT_CRASHPOINT": ""}
        # corrupt mode: the host's own idle integrity sweep runs a pass every 2 s, so damage no request reads
        # is found by the host (a self-restart), not only by the runner's SIGKILL and the next boot
        extra: tuple[str, ...] = ("--integrity-sweep", "2") if self.cfg.mode == "corrupt" else ()
        if self.cfg.keep_quarantined:
            extra += ("--keep-quarantined",)
        try:
            return await trio.to_thread.run_sync(lambda: start_host_process(data_dir, *extra, env=env))
        except RuntimeError as exc:
            if not spec:
                raise
            self.totals.boot_crashes += 1
            self.log(f"  boot died at crash point {spec} ({str(exc).splitlines()[0][:80]}); booting again")
            return await trio.to_thread.run_sync(
                lambda: start_host_process(data_dir, *extra, env={"RT_CRASHPOINT": ""}))

    def pick_crashpoint(self) -> str | None:
        if self.rng.random() >= self.cfg.crashpoint_rate:
            return None
        if self.rng.random() < 0.2:
            point, nth = self.rng.choice(BOOT_CRASH_POINTS), 1
        else:
            point, nth = self.rng.choice(CRASH_POINTS), self.rng.randint(1, 12)
        self.totals.crashpoints[point] += 1
        return f"{point}:{nth}:kill"

    async def run_processes(self, disk: LoopMount | None) -> None:
        data_dir = (disk.mountpoint if disk else self.workdir) / "data"
        host = await self.start(data_dir, None)
        try:
            await self.setup(host.url, host.token)
            await self.verify(host.url, host.token, data_dir, after_restart=False, leftover={})
            spec = self.pick_crashpoint()
            if spec:
                await self.kill(host, disk)
                host = await self.start(data_dir, spec)
            for cycle in range(1, self.cfg.cycles + 1):
                self.history.cycle = cycle
                duration = self.rng.uniform(*self.cfg.run_time)
                self.log(f"cycle {cycle}: workload {duration:.2f}s" + (f" crashpoint={spec}" if spec else ""))
                stop = trio.Event()
                async with trio.open_nursery() as n:
                    for w in self.workers:
                        n.start_soon(self.drive, w, host.url, host.token, stop)
                    deadline = trio.current_time() + duration
                    # polls a child process's exit status: there is no event to wait on
                    while trio.current_time() < deadline and host.proc.poll() is None:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                    died_itself = host.proc.poll() is not None
                    await self.kill(host, disk)
                    n.cancel_scope.cancel()
                if died_itself:
                    self.log("  host killed itself at its crash point")
                self.totals.cycles = cycle
                leftover = await trio.to_thread.run_sync(scan_checkpoints, data_dir / "sessions")
                spec = self.pick_crashpoint()
                host = await self.start(data_dir, spec)
                await self.verify(host.url, host.token, data_dir, after_restart=True, leftover=leftover)
                await self.retry_and_replay(host.url, host.token)
            # final: a clean restart, then everything (every search token) once more
            self.log("final: clean shutdown, restart, full verification")
            await trio.to_thread.run_sync(host.terminate)
            _close_pipes(host)
            leftover = await trio.to_thread.run_sync(scan_checkpoints, data_dir / "sessions")
            host = await self.start(data_dir, None)
            await self.verify(host.url, host.token, data_dir, after_restart=True, leftover=leftover, full=True)
        finally:
            await trio.to_thread.run_sync(host.kill9)
            _close_pipes(host)

    async def kill(self, host: HostProcess, disk: LoopMount | None) -> None:
        await trio.to_thread.run_sync(host.kill9)
        _close_pipes(host)
        if disk is not None:
            await trio.to_thread.run_sync(disk.cut)
            await trio.to_thread.run_sync(disk.remount)

    # ------------------------------------------------------------------ corrupt
    async def run_corrupt(self) -> None:
        data_dir = self.workdir / "data"
        db_path = data_dir / "pi.sqlite"
        host = await self.start(data_dir, None)
        try:
            await self.setup(host.url, host.token)
            await self.verify(host.url, host.token, data_dir, after_restart=False, leftover={})
            for cycle in range(1, self.cfg.cycles + 1):
                self.history.cycle = cycle
                before = trio.current_time() + self.rng.uniform(*self.cfg.run_time)
                after = self.rng.uniform(*self.cfg.run_time)
                checkpoint = self.rng.random() < 0.5
                boot_id = (await self.serving(host))["bootId"]
                stop = trio.Event()
                async with trio.open_nursery() as n:
                    for w in self.workers:
                        n.start_soon(self.drive, w, host.url, host.token, stop)
                    await trio.sleep_until(before)
                    what = await trio.to_thread.run_sync(partial(damage, db_path, self.rng, checkpoint=checkpoint))
                    self.log(f"cycle {cycle}: damaged pi.sqlite: {what}")
                    await trio.sleep(after)
                    stop.set()  # the workers finish their step (a turn is cut short after 5 s)
                    n.cancel_scope.deadline = trio.current_time() + 5.0
                self.totals.cycles = cycle
                host = await self.await_rebuild(host, data_dir, boot_id)
                for _ in range(3):  # the checker's own reads may meet damage nothing else read: it restarts
                    with trio.move_on_after(self.cfg.check_wait) as bound:
                        checked_boot = (await self.serving(host))["bootId"]
                        try:
                            leftover = await trio.to_thread.run_sync(scan_checkpoints, data_dir / "sessions")
                            await self.verify(host.url, host.token, data_dir, after_restart=True, leftover=leftover)
                            await self.retry_and_replay(host.url, host.token)
                            break
                        except (ClientClosed, OSError) as exc:
                            self.log(f"  the host went away during the check ({type(exc).__name__}): checking again")
                        except RpcError as exc:  # a check's read met the damage first: CORRUPT_DATA, a restart
                            if not host_stopping(exc):
                                raise
                            self.log(f"  a check's read met the damage ({exc.data_code}): the host restarts itself")
                            host = await self.await_rebuild(host, data_dir, checked_boot)
                            continue
                        except sqlite3.DatabaseError as exc:  # the checker's own read of pi.sqlite met damage
                            self.log(f"  the checker's read met damage ({exc}): the host must meet it too")
                            host = await self.await_rebuild(host, data_dir, (await self.serving(host))["bootId"])
                            continue
                    if bound.cancelled_caught:
                        await self.stalled(host, cycle)
                    await self.serving(host)
            self.log("final: clean shutdown, restart, full verification")
            await trio.to_thread.run_sync(host.terminate)
            _close_pipes(host)
            leftover = await trio.to_thread.run_sync(scan_checkpoints, data_dir / "sessions")
            host = await self.start(data_dir, None)
            await self.verify(host.url, host.token, data_dir, after_restart=True, leftover=leftover, full=True)
        finally:
            await trio.to_thread.run_sync(host.kill9)
            _close_pipes(host)

    async def stalled(self, host: HostProcess, cycle: int) -> None:
        """A check step got no answer within ``check_wait``: a problem, with what the host says it is doing."""
        state = "host.status got no answer in 10 s"
        with trio.move_on_after(10):
            try:
                status = await _status(host.url, host.token)
                state = (f"bootId {status.get('bootId')}, pipeline {status.get('pipeline')}, "
                         f"process alive {host.proc.poll() is None}")
            except (ClientClosed, OSError, RpcError) as exc:
                state = f"host.status failed ({type(exc).__name__})"
        self.totals.problem(f"cycle {cycle}: a check got no answer within {self.cfg.check_wait:.0f} s ({state})")

    async def await_rebuild(self, host: HostProcess, data_dir: Path, boot_id: str) -> HostProcess:
        """Wait for the host to restart itself (a new bootId at the same URL); if it has not noticed the
        damage, read every table through it, wait again, then SIGKILL and restart it."""
        for attempt in range(2):
            with trio.move_on_after(self.cfg.rebuild_wait):
                while True:
                    if host.proc.poll() is not None:
                        words = _last_words(host)
                        if host.proc.returncode == 4 and GAVE_UP in words:
                            # more than 3 rebuilds in 10 minutes: the documented exit (README), which the
                            # runner's damage every cycle can reach; what it acknowledged is checked as ever
                            self.totals.gave_up += 1
                            self.log(f"  the host gave up after repeated rebuilds: {words}")
                        else:
                            self.totals.problem(f"the host exited ({host.proc.returncode}) instead of restarting "
                                                f"itself: {words}")
                        _close_pipes(host)
                        return await self.start(data_dir, None)
                    try:
                        status = await _status(host.url, host.token)
                    except (ClientClosed, OSError, RpcError):
                        status = {}
                    if status.get("bootId") not in (None, boot_id):
                        self.totals.self_restarts += 1
                        self.log("  the host restarted itself on a rebuilt index")
                        return host
                    await trio.sleep(0.1)
            if attempt == 0:
                self.log("  no restart yet: reading every table")
                await self.read_everything(host.url, host.token)
        self.log("  the damage went unnoticed: SIGKILL and restart")
        self.totals.forced_restarts += 1
        await self.kill(host, None)
        return await self.start(data_dir, None)

    def rebuilt_answer(self, p: Pending, want: Any, got: Any) -> bool:
        """After a rebuild, what a replay may answer otherwise, as protocol/README.md documents it: a
        file-carried receipt's response is rebuilt from the state its file left (the same session, its
        fields as they are now: store/indexing/reconcile.py ``rebuild_response``), and an append (or a
        truncation: its receipt rode in the deleted file's header too) to a session deleted since is
        ``SESSION_NOT_FOUND`` (§4, ``session.delete``'s row: only create and delete receipts are kept)."""
        if isinstance(got, RpcError):
            if p.method in ("session.appendMessage", "session.truncateFrom") and got.data_code == "SESSION_NOT_FOUND":
                life = p.key.split("/")[0]
                deleted = any(op.type == "ok" and op.f == "lc_delete" and op.key == life for op in self.history.ops)
                if deleted:
                    self.totals.rebuilt_answers += 1
                return deleted
            return False
        if p.method in REBUILT_RESPONSES and isinstance(want, dict) and isinstance(got, dict):
            same = _session_id(want) is not None and _session_id(want) == _session_id(got)
            self.totals.rebuilt_answers += same
            return same
        return False

    def drop_replays(self) -> None:
        """The salvage skipped receipts: a DB-only receipt acknowledged so far may be gone, and its replay
        would run the request again (a queue entry pushed again after its removal, an older setting back):
        such requests are not replayed any more (file-carried receipts still are)."""
        for w in self.workers:
            kept = [p for p in w.acked if p.method in FILE_RECEIPTS]
            self.totals.replays_dropped += len(w.acked) - len(kept)
            w.acked = kept

    def truncated_away(self, p: Pending) -> bool:
        """An acknowledged append whose line an acknowledged truncateFrom removed: after a rebuild its receipt
        is gone with its line, and a retry writes it again (documented: store/indexing/salvage.py, as
        ``pi-host doctor --repair`` leaves it), so it is not replayed."""
        if p.f != "lc_append" or not p.key.endswith("/m2"):
            return False
        life = p.key.split("/")[0]
        return any(op.type == "ok" and op.f == "lc_truncate" and op.key == life for op in self.history.ops)

    async def serving(self, host: HostProcess) -> dict[str, Any]:
        """``host.status`` once the host serves (it may be restarting itself on a rebuilt index)."""
        with trio.fail_after(60):
            while True:
                try:
                    return await _status(host.url, host.token)
                except (ClientClosed, OSError):
                    await trio.sleep(0.2)

    async def read_everything(self, url: str, token: str) -> None:
        sids = [w.sid for w in self.workers]
        calls: list[tuple[str, dict[str, Any]]] = [
            ("session.list", {"limit": 200}), ("settings.getAll", {"ns": "chaos"}), ("notifications.list", {}),
            ("tasks.list", {}), ("providers.list", {}), ("secrets.list", {}), ("approvals.pending", {}),
            ("interactions.pending", {}),
            ("search.query", {"query": "chaos"}), ("search.query", {"query": "reply"}), ("audit.list", {}),
        ]
        for sid in sids:
            calls += [("session.get", {"sessionId": sid, "full": True}), ("session.queueList", {"sessionId": sid}),
                      ("collab.list", {"sessionId": sid, "direction": "incoming"}),
                      ("session.listTurns", {"sessionId": sid})]
        try:
            async with open_client(url, token, client_id=CHECKER_CLIENT, client_kind="test") as c:
                for method, params in calls:
                    try:
                        await c.call(method, params)
                    except RpcError as exc:
                        if exc.data_code == "INTERNAL":
                            self.totals.internal += 1
                            self.out(f"INTERNAL {method}: {exc.message[:200]}")
                        elif exc.data_code in ("METHOD_NOT_FOUND", "INVALID_PARAMS"):  # this list is wrong
                            self.totals.problem(f"read_everything: {method} answered {exc.data_code}")
        except (ClientClosed, OSError):
            pass  # the host met the damage and is restarting

    # ------------------------------------------------------------------ actors
    async def run_actors(self) -> None:
        data_dir = self.workdir / "data"
        async with inprocess_host(data_dir) as host:
            await self.setup(host.url, host.token)
            for cycle in range(1, self.cfg.cycles + 1):
                self.history.cycle = cycle
                stop = trio.Event()
                kills: list[str] = []
                async with trio.open_nursery() as n:
                    for w in self.workers:
                        n.start_soon(self.drive, w, host.url, host.token, stop)
                    await self.killer(host, kills)
                    stop.set()
                self.totals.actor_kills += len(kills)
                self.totals.cycles = cycle
                self.log(f"cycle {cycle}: {len(kills)} actor kills ({Counter(k.split(':')[0] for k in kills)})")
                await self.retry_and_replay(host.url, host.token)
                await self.verify(host.url, host.token, data_dir, after_restart=False, leftover={})
                status = await _status(host.url, host.token)
                self.log(f"  host serving: restarts={status['actors']['restarts']}")
        self.log("final: clean shutdown, restart, full verification")
        leftover = await trio.to_thread.run_sync(scan_checkpoints, data_dir / "sessions")
        async with inprocess_host(data_dir) as host:
            await self.verify(host.url, host.token, data_dir, after_restart=True, leftover=leftover, full=True)

    async def killer(self, host: Any, kills: list[str]) -> None:
        """Kill the DB writer or a busy session's actor at a random point of an in-flight request."""
        recent: list[float] = []
        while len(kills) < self.cfg.kills:
            await trio.sleep(self.rng.uniform(0.03, 0.3))
            now = trio.current_time()
            recent = [t for t in recent if now - t < 10.0]
            if len(recent) >= self.cfg.max_kills_per_10s:  # stay under the supervisor's restart intensity
                await trio.sleep(10.0 - (now - recent[0]))
                continue
            busy: list[Worker] = []
            for _ in range(2000):  # wait (in ~1 ms steps) for requests to be in flight
                busy = [w for w in self.workers if w.in_flight]
                if busy:
                    break
                await trio.sleep(0.001)
            # land somewhere inside the request: before, during or after its fsync / DB commit
            for _ in range(self.rng.randrange(4)):
                await trio.lowlevel.checkpoint()
            if self.rng.random() < 0.3 or not busy:
                target = "db-writer"
            else:
                target = f"session:{self.rng.choice(busy).sid}"
            if host.kill_actor(target):
                kills.append(target)
                recent.append(trio.current_time())

    # ------------------------------------------------------------------ entry
    async def run(self) -> Totals:
        t0 = time.monotonic()
        self.log(f"chaos mode={self.cfg.mode} seed={self.cfg.seed} cycles={self.cfg.cycles} "
                 f"sessions={self.cfg.sessions} dir={self.workdir}")
        try:
            if self.cfg.mode == "actors":
                await self.run_actors()
            elif self.cfg.mode == "corrupt":
                await self.run_corrupt()
            elif self.cfg.mode == "powercut":
                disk = LoopMount(self.workdir / "disk.img", self.workdir / "mnt", size_mb=self.cfg.image_mb)
                await trio.to_thread.run_sync(disk.create)
                try:
                    await self.run_processes(disk)
                finally:
                    await trio.to_thread.run_sync(disk.destroy)
            else:
                await self.run_processes(None)
        finally:
            self.check_definite_failures()
            self.history.dump(self.workdir / "history.jsonl")
        t = self.totals
        fails = Counter()
        for w in self.workers:
            fails.update(w.failures)
        self.out(f"seed={self.cfg.seed} mode={self.cfg.mode} wall={time.monotonic() - t0:.1f}s "
                 f"attempted={t.attempted} infoOps={sum(1 for op in self.history.ops if op.type == 'info')} "
                 f"recovered={len(t.recovered)} unexpected={len(t.unexpected)} "
                 f"problems={len(t.problems)} retried={t.retried} receiptsReplayed={t.receipts_replayed} "
                 f"actorKills={t.actor_kills} selfRestarts={t.self_restarts} gaveUp={t.gave_up} "
                 f"forcedRestarts={t.forced_restarts} "
                 f"rebuiltAnswers={t.rebuilt_answers} replaysDropped={t.replays_dropped} "
                 f"replaysUnanswered={t.replays_unanswered} undetected={t.undetected} "
                 f"crashpoints={sum(t.crashpoints.values())} bootCrashes={t.boot_crashes} "
                 f"searchVia={self.notes.search_via!r} searched={self.notes.searched} "
                 f"definiteFailures={dict(fails)}")
        acked = Counter(op.f for op in self.history.ops if op.type == "ok")
        self.out("acknowledged collaboration and approvals: " + " ".join(
            f"{f}={acked[f]}" for f in ("collab_deliver", "collab_begin", "collab_settle", "approval_request",
                                        "approval_respond")))
        for name in sorted(t.lost)[:20]:
            self.out(f"LOST {name}")
        for name in sorted(t.duplicated)[:20]:
            self.out(f"DUPLICATED {name}")
        for name in sorted(t.unexpected)[:20]:
            self.out(f"UNEXPECTED {name}")
        for text, cycle in list(t.problems.items())[:20]:
            self.out(f"PROBLEM (cycle {cycle}) {text}")
        self.out(t.last_line())
        return t


REBUILT_RESPONSES: frozenset[str] = frozenset({
    "session.create", "session.fork", "session.rename", "session.update", "session.truncateFrom"})


def _session_id(answer: dict[str, Any]) -> Any:
    inner = answer.get("session")
    return inner.get("id") if isinstance(inner, dict) else answer.get("id")


async def _status(url: str, token: str) -> dict[str, Any]:
    async with open_client(url, token, client_id=CHECKER_CLIENT, client_kind="test") as c:
        result: dict[str, Any] = await c.call("host.status", {})
        return result


def _last_words(host: HostProcess) -> str:
    """The end of what an exited host wrote to stderr (why it stopped), on one line."""
    try:
        _out, err = host.proc.communicate(timeout=5)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return f"(its stderr could not be read: {type(exc).__name__})"
    text = (err or b"").decode("utf-8", "replace").strip()
    return " | ".join(text.splitlines()[-12:])[-3000:] or "(nothing on stderr)"


def _close_pipes(host: HostProcess) -> None:
    for pipe in (host.proc.stdout, host.proc.stderr):
        if pipe is not None and not pipe.closed:
            pipe.close()


def parse_args(argv: Sequence[str]) -> RunConfig:
    ap = argparse.ArgumentParser(prog="scripts/chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("process", "actors", "powercut", "fuzz", "history", "corrupt"),
                    default="process")
    ap.add_argument("--frames", type=int, default=100_000, help="fuzz mode: fuzzed frames to send")
    ap.add_argument("--cycles", type=int, default=5, help="kill/restart cycles (actors: kill rounds)")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: random, printed)")
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--clients", type=int, default=3, help="history mode: clients (a connection and a session each)")
    ap.add_argument("--kills", type=int, default=12, help="actors mode: actor kills per round")
    ap.add_argument("--run-min", type=float, default=0.3, help="shortest workload before a kill (s)")
    ap.add_argument("--run-max", type=float, default=2.0, help="longest workload before a kill (s)")
    ap.add_argument("--crashpoint-rate", type=float, default=0.3,
                    help="share of host starts armed with a random RT_CRASHPOINT")
    ap.add_argument("--image-mb", type=int, default=64, help="powercut: size of the ext4 image")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory even when the run passes")
    ap.add_argument("--keep-quarantined", action="store_true",
                    help="the host keeps every quarantined copy of the index (data/quarantine/); implies --keep")
    ap.add_argument("--quiet", action="store_true", help="only the summary lines")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 2**31)
    return RunConfig(mode=a.mode, cycles=a.cycles, seed=seed, sessions=a.sessions, workdir=a.dir,
                     keep=a.keep or a.keep_quarantined, keep_quarantined=a.keep_quarantined,
                     run_time=(a.run_min, a.run_max), crashpoint_rate=a.crashpoint_rate, kills=a.kills,
                     image_mb=a.image_mb, frames=a.frames, verbose=not a.quiet, clients=a.clients)


def run(cfg: RunConfig, out: Callable[[str], None] = print) -> Totals:
    """Run one chaos configuration (blocking; starts its own trio loop)."""
    made = cfg.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{cfg.mode}-")) if made else Path(cfg.workdir)  # type: ignore[arg-type]
    workdir.mkdir(parents=True, exist_ok=True)
    totals = trio.run(Runner(cfg, workdir, out).run)
    if totals.valid and made and not cfg.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not totals.valid or cfg.keep:
        out(f"work directory kept for inspection: {workdir} (history.jsonl)")
    return totals


async def _fuzz(cfg: RunConfig, workdir: Path, out: Callable[[str], None]) -> FuzzReport:
    """Fuzz mode: a subprocess host, fixture sessions, ``cfg.frames`` fuzzed frames, then the checks."""
    data_dir = workdir / "data"
    sandbox = workdir / "sandbox"
    sandbox.mkdir(parents=True, exist_ok=True)
    host = await trio.to_thread.run_sync(lambda: start_host_process(data_dir, "--quiet"))
    report = FuzzReport()
    t0 = time.monotonic()
    try:
        pools = Pools(sandbox=str(sandbox))
        async with open_client(host.url, host.token, client_id="fuzz-setup", client_kind="ui") as c:
            await seed_pools(c, pools, sessions=6, messages=5)
        out(f"fuzz seed={cfg.seed} frames={cfg.frames}: generating")
        frame_iter = await trio.to_thread.run_sync(lambda: iter_fuzz_frames(cfg.frames, seed=cfg.seed, pools=pools))
        await fuzz_host(host.url, host.token, frame_iter, report,
                        on_progress=(lambda n: out(f"  {n} frames, internal={report.internal}")
                                     if cfg.verbose and n % 10_000 == 0 else None))
        if host.proc.poll() is not None:
            report.crashes += 1
            report.problems.append(f"the host exited with {host.proc.returncode}")
        else:
            status = await _status(host.url, host.token)
            verify(data_dir, report, restarts=int(status["actors"]["restarts"]))
        out(f"seed={cfg.seed} mode=fuzz wall={time.monotonic() - t0:.1f}s answers={report.answers} "
            f"reconnects={report.reconnects} codes={dict(report.codes.most_common())}")
        for sample in report.internal_samples:
            out(f"INTERNAL after {sample}")
        for problem in report.problems[:20]:
            out(f"PROBLEM {problem}")
    finally:
        await trio.to_thread.run_sync(host.kill9)
        _close_pipes(host)
    return report


def run_fuzz(cfg: RunConfig, out: Callable[[str], None] = print) -> FuzzReport:
    made = cfg.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="chaos-fuzz-")) if made else Path(cfg.workdir)  # type: ignore[arg-type]
    workdir.mkdir(parents=True, exist_ok=True)
    report = trio.run(_fuzz, cfg, workdir, out)
    if report.ok and made and not cfg.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not report.ok:
        out(f"work directory kept for inspection: {workdir}")
    out(report.last_line())
    return report


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    if cfg.mode == "fuzz":
        return 0 if run_fuzz(cfg, lambda line: print(line, flush=True)).ok else 1
    if cfg.mode == "history":
        from scripts.chaos_history_mode import HistoryConfig, run_history

        hcfg = HistoryConfig(cycles=cfg.cycles, seed=cfg.seed, clients=cfg.clients, workdir=cfg.workdir,
                             keep=cfg.keep, verbose=cfg.verbose)
        findings, _ = run_history(hcfg, lambda line: print(line, flush=True))
        return 0 if findings.anomalies == 0 else 1
    totals = run(cfg, lambda line: print(line, flush=True))
    # the last line stays the figure line: print it again after a possible "kept" note
    if not totals.valid:
        print(totals.last_line(), flush=True)
    return 0 if totals.valid else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
