"""The composition root: boot, start actors, open the gateway, shut down in order.

Start (hypercorn's "listeners only after startup"): lock → boot recovery (in a
worker thread; nothing served) → DB writer → scheduler → request expiry → session actors →
request pipeline → gateway → ``host.json``. A stop asked for before the host
serves (the CLI forwards SIGINT/SIGTERM from the start) ends boot before its
next step: :class:`~runtime.boot.BootInterrupted`, nothing served, no marker.

Shutdown (:class:`Shutdown`; the CLI requests it on SIGINT/SIGTERM):

1. the gateway refuses new connections and the pipeline answers every new
   request ``SHUTTING_DOWN``;
2. requests already in flight finish, within ``config.shutdown_deadline``
   (default 10 s); their answers are sent, then the connections close (1001);
3. actors stop in reverse start order — session actors (their transcript
   writers closed), the request expiry, the scheduler, the DB writer (which first commits what is
   queued) — each with a stop request, a bounded wait, then a hard cancel;
4. the database closes and the ``clean-shutdown`` marker is written, with how
   every actor ended (``boot.previousShutdown`` of the next boot reports it) —
   only when steps 1-3 ran to the end and no task of the host crashed: after
   ``RestartIntensityExceeded`` or any other crash there is no marker, so the
   next boot reports ``cleanShutdown: false``. (A cancellation from outside, as
   in-process tests stop a host, still runs steps 1-3 shielded: that is a clean
   drain.)

A second signal (:meth:`Shutdown.hurry`) cuts every wait short; the steps
still run, so the marker is still written.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
import trio
from pydantic import ValidationError

from actors.db_reader import ReadPool
from actors.db_writer import DbWriter, DbWriterStats
from actors.events import EventBus
from actors.gateway import Gateway
from actors.gateway_connection import CLOSE_GOING_AWAY
from actors.gateway_http import HttpSite, LoginCodes, load_static
from actors.gateway_types import CallContext, GatewayConfig, Reply
from actors.index_log import IndexLog
from actors.integrity_sweep import IntegritySweep
from actors.registry import SessionRegistry
from actors.scheduler import Scheduler, tasks_changed
from actors.session import DbHandle, SessionDeps
from protocol.methods import EVENTS
from runtime.boot import BootInterrupted, BootResult, load_or_create_token, run_boot
from runtime.config import HostConfig
from runtime.context import Services
from runtime.datadir import DataDir, DataDirLock
from runtime.handlers import inflight
from runtime.handlers import sessions as sessions_handlers
from runtime.handlers.approvals import DEADLINES
from runtime.handlers.attachments import Blobs
from runtime.handlers.client_gone import on_client_gone
from runtime.handlers.host import INSPECTOR_URL, LOGIN_CODES
from runtime.handlers.imports import Imports
from runtime.handlers.plugins import PluginRegistry
from runtime.handlers.queue import QueueControl
from runtime.handlers.secrets import Vault
from runtime.kernel.actor import InternalBug, reply_callback_failed
from runtime.kernel.supervisor import ActorRef, ChildSpec, DynamicSupervisor, Supervisor
from runtime.kernel.task_steps import TaskSteps
from runtime.pipeline import Pipeline
from runtime.process import freeze_boot_objects, release_free_memory
from runtime.request_expiry import RequestExpiry, deadline_notifier, session_runner
from runtime.routes import ROUTES, Route
from runtime.version import VERSION
from store.errors import StoreError
from store.faults import Faults
from store.fsutil import atomic_write, remove_file_durable
from store.indexing.backlog import Repair
from store.indexing.corruption import is_corruption
from store.indexing.database import close_writer
from store.indexing.message_ids import MessageIds
from store.interchange.native_pi_views import NativeCatalog
from store.transcripts import windows

log = logging.getLogger("pi_host")

__all__ = ["RunningHost", "Shutdown", "VERSION", "run_host", "wall_ms"]


def wall_ms() -> int:
    return int(time.time() * 1000)


def validate_event(topic: str, data: dict[str, Any]) -> None:
    """Test hosts: every published payload must match its topic's protocol model."""
    model = EVENTS.get(topic)
    if model is None:
        raise InternalBug(f"event topic {topic!r} is not in the protocol (protocol/models_events.py)")
    try:
        model.model_validate(data)
    except ValidationError as exc:
        log.error("event %s does not match its model: %s", topic, exc)
        raise InternalBug(f"event {topic} does not match the protocol model {model.__name__}") from None


INDEX_CORRUPT = "index_corrupt"
"""A :class:`Shutdown` restart reason: the running host met a corrupt index database. Its caller starts it
again with ``HostConfig.rebuild_index`` (RELIABILITY.md row 7: quarantined and rebuilt from the transcripts)."""


@dataclass
class Shutdown:
    """How a host is asked to stop: :meth:`request` once, :meth:`hurry` to cut the waits.

    Asked during boot (the CLI forwards signals from the start), boot stops before its next
    step (:class:`~runtime.boot.BootInterrupted`); boot's worker thread reads :meth:`asked`.
    """

    requested: trio.Event = field(default_factory=trio.Event)
    hurried: trio.Event = field(default_factory=trio.Event)
    _asked: threading.Event = field(default_factory=threading.Event)
    restart_reason: str | None = None
    """Why the host stopped to be started again (:data:`INDEX_CORRUPT`), None: a plain stop."""

    def request(self) -> None:
        self._asked.set()
        self.requested.set()

    def hurry(self) -> None:
        self.request()
        self.hurried.set()

    def request_restart(self, reason: str) -> None:
        """Stop in order, and tell the caller to start the host again (:attr:`restart_reason`)."""
        if self.restart_reason is None:
            self.restart_reason = reason
        self.request()

    def asked(self) -> bool:
        """Whether a stop was requested (safe from any thread)."""
        return self._asked.is_set()


class HostDispatcher:
    """The gateway's view of the host: the pipeline, plus what ``host.hello`` answers."""

    def __init__(self, pipeline: Pipeline, boot_id: str, now_ms: Callable[[], int]) -> None:
        self._pipeline = pipeline
        self._boot_id = boot_id
        self._now_ms = now_ms

    def hello(self, ctx: CallContext) -> dict[str, Any]:
        return {"hostVersion": VERSION, "bootId": self._boot_id, "serverTime": self._now_ms()}

    async def submit(self, method: str, params: Any, ctx: CallContext, reply: Reply, *, more: bool = False,
                     size: int | None = None) -> None:
        await self._pipeline.submit(method, params, ctx, reply, more=more, size=size)

    def connected(self, ctx: CallContext) -> None:
        self._pipeline.connected(ctx)

    def disconnected(self, ctx: CallContext) -> None:
        self._pipeline.disconnected(ctx)


@dataclass
class RunningHost:
    """Handles tests and the CLI use on a started host."""

    config: HostConfig
    port: int
    url: str
    token: str
    boot: BootResult
    registry: SessionRegistry
    supervisor: Supervisor
    sessions: DynamicSupervisor
    pipeline: Pipeline
    services: Services
    bus: EventBus
    faults: Faults
    gateway: Gateway
    shutdown: Shutdown
    scheduler: ActorRef | None = None
    message_ids: MessageIds | None = None
    """The filter of indexed message ids appends test (``store.indexing.message_ids``)."""

    def kill_actor(self, name: str) -> bool:
        """Chaos hook: crash an actor by name ("db-writer", "scheduler" or "session:<id>")."""
        if name.startswith("session:"):
            return self.registry.kill(name.split(":", 1)[1])
        return bool(self.supervisor.kill(name))


def _corruption_restarts(shutdown: Shutdown) -> Callable[[BaseException], None]:
    """What a reader (any thread) or the DB writer calls when it meets a corrupt index: the host stops in
    order and its caller starts it again on an index rebuilt from the transcripts (RELIABILITY.md row 7:
    "a corruption found at runtime crashes the DB-writer actor, and the supervisor rebuilds")."""
    token = trio.lowlevel.current_trio_token()

    def restart(exc: BaseException) -> None:
        if shutdown.restart_reason is None:
            log.error("the index database is corrupt; restarting on an index rebuilt from the transcripts",
                      extra={"error": str(exc)})
        shutdown.request_restart(INDEX_CORRUPT)

    def told(exc: BaseException) -> None:
        try:
            token.run_sync_soon(restart, exc)
        except trio.RunFinishedError:
            pass  # the host already stopped

    return told


async def run_host(
    config: HostConfig,
    *,
    task_status: trio.TaskStatus[RunningHost] = trio.TASK_STATUS_IGNORED,
    now_ms: Callable[[], int] = wall_ms,
    routes: Mapping[str, Route] = ROUTES,
    shutdown: Shutdown | None = None,
) -> None:
    """Run a host until its :class:`Shutdown` is requested (or the task is cancelled).

    ``routes``: the route table (an embedding application or a test may wrap handlers).
    ``shutdown``: pass one to be able to stop the host during boot too (the CLI does); a stop
    asked for before the host serves raises :class:`~runtime.boot.BootInterrupted` (no marker).
    """
    shutdown = Shutdown() if shutdown is None else shutdown
    data_dir = config.data_dir
    started_at = now_ms()
    t0 = time.monotonic()
    await trio.to_thread.run_sync(data_dir.ensure)
    lock = DataDirLock(data_dir)
    lock.acquire()
    faults = Faults.parse(config.faults_spec or os.environ.get("RT_CRASHPOINT"))
    ended: dict[str, int] = {}
    # Test mode: a reply callback that raised (its request was answered INTERNAL) fails the host at its end.
    callback_failures: list[BaseException] = []
    hook = reply_callback_failed.set(callback_failures.append) if config.validate_results else None
    steps = TaskSteps() if config.count_task_steps else None
    if steps is not None:
        trio.lowlevel.add_instrument(steps)
    try:
        clean = await trio.to_thread.run_sync(_read_clean_marker, data_dir)
        await trio.to_thread.run_sync(remove_file_durable, data_dir.clean_shutdown_path)
        # the previous run met its index corrupt and stopped before it started again on a rebuilt one
        met_corrupt = await trio.to_thread.run_sync(data_dir.index_corrupt_path.exists)
        token = await trio.to_thread.run_sync(load_or_create_token, data_dir)
        index_corrupt = _corruption_restarts(shutdown)
        boot, reads = await _boot(config, faults=faults, now_ms=now_ms, clean_shutdown=clean is not None,
                                  shutdown=shutdown, rebuild=config.rebuild_index or met_corrupt,
                                  on_corruption=index_corrupt)
        if met_corrupt:  # rebuilt: the verdict is spent
            await trio.to_thread.run_sync(remove_file_durable, data_dir.index_corrupt_path)
        if shutdown.asked():  # asked after boot's last step: still before anything is served
            reads.close()
            await trio.to_thread.run_sync(close_writer, boot.conn)
            raise BootInterrupted("starting the actors (boot had finished)")
        if clean is not None:
            boot.report["previousShutdown"] = clean
        log.info("boot finished", extra={"report": boot.report})
        bus = EventBus(backlog=config.event_backlog, backlog_bytes=config.event_backlog_bytes,
                       transient_interval=config.inflight_event_interval, supersedes=inflight.supersedes,
                       validate=validate_event if config.validate_results else None)
        db_stats = DbWriterStats()
        index_log = IndexLog(max_lag_bytes=config.index_lag_bytes, max_lag_ops=config.index_lag_ops)
        message_ids = MessageIds()  # built on boot's writer connection when the DB writer starts
        drained = False  # the marker's condition: the shutdown steps ran to the end and nothing crashed
        try:
            async with trio.open_nursery() as nursery:
                supervisor = Supervisor(intensity=config.restart_intensity, period=config.restart_period)
                await nursery.start(supervisor.run)
                writer_ref = await supervisor.start_child(
                    ChildSpec("db-writer", lambda: DbWriter(
                        boot.conn, mailbox_size=config.db_mailbox, batch_limit=config.db_batch_limit,
                        faults=faults, stats=db_stats, force_synchronous=config.synchronous,
                        upkeep_after=config.search_upkeep_after,
                        index_hold=config.index_hold, index_wanted=index_log.wanted,
                        on_corruption=index_corrupt, message_ids=message_ids))
                )
                index_log.on_wanted(writer_ref.wake)
                if config.integrity_sweep_interval is not None:
                    nursery.start_soon(IntegritySweep(
                        reads, db_stats, idle_after=config.integrity_sweep_after,
                        interval=config.integrity_sweep_interval, on_corruption=index_corrupt,
                        db_path=data_dir.db_path, first_after=config.integrity_sweep_first).run)
                if config.memory_trim_interval is not None:
                    nursery.start_soon(_release_free_memory_every, config.memory_trim_interval)
                db = DbHandle(lambda op: writer_ref.ask(op, timeout=config.ask_timeout))
                # a failed deferred index op is repaired from its transcript before it counts as covered
                nursery.start_soon(index_log.run_repairs, lambda fn: db.write(
                    fn, durable=False, label="index", backlogs=(fn.backlog,) if isinstance(fn, Repair) else ()))
                scheduler_ref = await supervisor.start_child(
                    ChildSpec("scheduler", lambda: Scheduler(db=db, reads=reads, bus=bus, now_ms=now_ms,
                                                             faults=faults))
                )
                sessions = DynamicSupervisor(
                    intensity=config.session_restart_intensity, period=config.restart_period,
                    max_children=config.max_sessions_active, evict_idle=True,
                )
                await nursery.start(sessions.run)
                blobs = Blobs(data_dir.attachments_dir, faults=faults, import_roots=config.import_roots)
                services = Services(
                    data_dir=data_dir, db=db, reads=reads, bus=bus, faults=faults, now_ms=now_ms,
                    writer=writer_ref, index_log=index_log, wake_scheduler=tasks_changed(scheduler_ref.tell_nowait),
                    extra={"queue": QueueControl(),
                           "vault": Vault(data_dir.secrets_dir, faults=faults),
                           "blobs": blobs,
                           "imports": Imports(data_dir.sessions_dir, blobs.files, faults=faults,
                                              review_root=data_dir.review_changes_dir),
                           "native": NativeCatalog(config.native_pi_root, faults=faults),
                           "plugins": PluginRegistry(data_dir.root / "plugins"),
                           "providers.lock": trio.Lock(),
                           LOGIN_CODES: LoginCodes(time.monotonic)},
                )
                # pending requests expire at their deadline, announced; each in its session's actor (ordered
                # with the answers there)
                expiry_ref = await supervisor.start_child(ChildSpec("request-expiry", lambda: RequestExpiry(
                    db=db, reads=reads, bus=bus, now_ms=now_ms, in_session=session_runner(services))))
                services.extra[DEADLINES] = deadline_notifier(expiry_ref.tell_nowait)
                deps = SessionDeps(
                    paths=data_dir.session_paths, db=db, reads=reads, bus=bus, faults=faults, now_ms=now_ms,
                    index_log=index_log, writer=writer_ref, db_generation=db_stats.generation_of,
                    message_ids=message_ids,
                    services=services, idle_timeout=config.session_idle_timeout,
                    mailbox_size=config.session_mailbox, batch_limit=config.session_batch_limit,
                )
                registry = SessionRegistry(deps, sessions)
                services.sessions = registry
                pipeline = Pipeline(services, routes=routes, validate_results=config.validate_results,
                                    on_client_gone=(on_client_gone,), client_gone_after=config.client_gone_after)
                index_log.on_covered(pipeline.book.retire_through)
                await nursery.start(pipeline.run)

                async def status() -> dict[str, Any]:
                    size = await trio.to_thread.run_sync(_dir_size, data_dir.root)
                    sup_stats = supervisor.statistics()
                    sess_stats = sessions.statistics()
                    writer_actor = writer_ref.current()
                    depth = peak = 0
                    if writer_actor is not None:
                        st = writer_actor.statistics()
                        depth, peak = st.mailbox_depth, st.peak_depth
                    return {
                        "version": VERSION,
                        "bootId": boot.boot_id,
                        "startedAt": started_at,
                        "uptimeMs": int((time.monotonic() - t0) * 1000),
                        "actors": {
                            "sessions": len(sess_stats.children),
                            "total": len(sess_stats.children) + len(sup_stats.children),
                            "restarts": sess_stats.restarts + sup_stats.restarts,
                        },
                        "dbWriter": {"queueDepth": depth, "peakDepth": peak, "batches": db_stats.batches,
                                     "ops": db_stats.ops, "maxBatch": db_stats.max_batch,
                                     "fullCommits": db_stats.full_commits,
                                     "normalCommits": db_stats.normal_commits,
                                     "searchUpkeepSteps": db_stats.upkeep_steps,
                                     "integrityChecks": db_stats.integrity_checks,
                                     "integrityPasses": db_stats.integrity_passes},
                        "pipeline": {"inFlight": pipeline.in_flight, **pipeline.book.statistics()},
                        "index": _index_status(index_log),
                        "dataDirBytes": size,
                        "disk": await trio.to_thread.run_sync(_disk, data_dir.root, config.disk_warn_below_bytes),
                        "gateway": _gateway_stats(gateway),
                        **({"trio": steps.statistics()} if steps is not None else {}),
                        "boot": boot.report,
                    }

                services.status = status
                gw_config = GatewayConfig(
                    host=config.host, port=config.port, token=token,
                    allowed_origins=config.allowed_origins,
                    max_frame_bytes=config.max_frame_bytes, max_params_bytes=config.max_params_bytes,
                    max_outbound_bytes=config.max_outbound_bytes, max_unauthenticated=config.max_unauthenticated,
                    ping_interval=config.ping_interval, ping_timeout=config.ping_timeout,
                )
                static = await trio.to_thread.run_sync(load_static)
                site = HttpSite(token=token, codes=services.get(LOGIN_CODES), ready=lambda: gateway.accepting,
                                static=static)
                gateway = Gateway(gw_config, HostDispatcher(pipeline, boot.boot_id, now_ms), bus, site)
                port = await nursery.start(gateway.serve)
                url = f"ws://{_url_host(config.host)}:{port}"
                services.extra[INSPECTOR_URL] = f"http://{_url_host(config.host)}:{port}"
                info = {"pid": os.getpid(), "url": url, "tokenFile": str(data_dir.token_path),
                        "startedAt": started_at, "bootId": boot.boot_id, "version": VERSION}
                await trio.to_thread.run_sync(
                    lambda: atomic_write(data_dir.host_json_path, orjson.dumps(info, option=orjson.OPT_INDENT_2))
                )
                running = RunningHost(config=config, port=port, url=url, token=token, boot=boot,
                                      registry=registry, supervisor=supervisor, sessions=sessions,
                                      pipeline=pipeline, services=services, bus=bus, faults=faults,
                                      gateway=gateway,
                                      shutdown=shutdown, scheduler=scheduler_ref, message_ids=message_ids)
                if config.freeze_boot:  # before the warm-up: the collection walks every object (the caches go cold)
                    froze_at = time.perf_counter()
                    frozen = freeze_boot_objects()  # boot's survivors live as long as the process: never walked again
                    log.info("boot objects frozen", extra={"objects": frozen,
                                                           "ms": round((time.perf_counter() - froze_at) * 1000, 1)})
                if config.warm_reads:  # the last step before the host is started (the warmth lasts only so long)
                    await sessions_handlers.warm_reads(services, partial(pipeline.call, decode=False),
                                                       config.warm_reads)
                task_status.started(running)
                try:
                    await shutdown.requested.wait()
                finally:
                    with trio.CancelScope(shield=True):
                        ended = await _shut_down(config, shutdown, gateway, pipeline, sessions, supervisor)
                    drained = "failed" not in (supervisor.state, sessions.state)
                    nursery.cancel_scope.cancel()
        except BaseException as exc:
            if not _only_cancelled(exc):  # a task of the host crashed (RestartIntensityExceeded, a bug)
                drained = False
            raise
        finally:
            reads.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(close_writer, boot.conn)
                if shutdown.restart_reason == INDEX_CORRUPT:
                    await trio.to_thread.run_sync(_write_corrupt_marker, data_dir, now_ms())
                if drained:
                    await trio.to_thread.run_sync(_write_clean_marker, data_dir, now_ms(), ended)
                else:
                    log.error("the host stopped without a clean drain: no clean-shutdown marker "
                              "(the next boot reports an unclean shutdown)", extra={"actors": ended})
                await trio.to_thread.run_sync(_remove_host_json, data_dir)
    finally:
        lock.release()
        if steps is not None:
            trio.lowlevel.remove_instrument(steps)
        if hook is not None:
            reply_callback_failed.reset(hook)
        if callback_failures:
            raise InternalBug(f"{len(callback_failures)} reply callback(s) raised (their requests were answered "
                              f"INTERNAL); the first: {callback_failures[0]!r}") from callback_failures[0]


async def _boot(config: HostConfig, *, faults: Faults, now_ms: Callable[[], int], clean_shutdown: bool,
                shutdown: Shutdown, rebuild: bool,
                on_corruption: Callable[[BaseException], None]) -> tuple[BootResult, ReadPool]:
    """Boot (``runtime.boot``), then open the read pool (each reader prepares the statements of a page read).
    Either may meet the index damaged where boot's ``quick_check`` does not look (a readable byte changed in
    the stored schema: a column under another name): the index is then quarantined and boot runs again on
    one rebuilt from the transcripts, once (RELIABILITY.md row 7); damage met on a rebuilt index is raised."""
    data_dir = config.data_dir
    while True:
        try:
            boot = await trio.to_thread.run_sync(partial(
                run_boot, data_dir, faults=faults, now_ms=now_ms, audit_retention_days=config.audit_retention_days,
                clean_shutdown=clean_shutdown, stop_requested=shutdown.asked, rebuild_index=rebuild,
                keep_quarantined=config.keep_quarantined, native_pi_root=config.native_pi_root))
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # run_boot closed its connection
            if rebuild or not is_corruption(exc):
                raise
            met: BaseException = exc
        else:
            reads = ReadPool(data_dir.db_path, size=config.read_pool_size, prepare=windows.prepare_reads,
                             on_corruption=on_corruption)
            try:
                await trio.to_thread.run_sync(reads.warm, config.read_pool_warm)
            except BaseException as exc:
                reads.close()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(close_writer, boot.conn)
                if rebuild or not isinstance(exc, (sqlite3.DatabaseError, UnicodeDecodeError)) \
                        or not is_corruption(exc):
                    raise
                met = exc
            else:
                return boot, reads
        log.error("boot met the index corrupt; booting again on an index rebuilt from the transcripts",
                  extra={"error": str(met)})
        rebuild = True


def _write_corrupt_marker(data_dir: DataDir, at_ms: int) -> None:
    """The index-corrupt verdict, durable before the host's caller decides whether to start it again: a
    signal meanwhile ends the process, and corruption ``quick_check`` cannot see (a value that does not
    decode, an FTS5 segment) would otherwise be served again by the next boot until a read met it again."""
    try:
        atomic_write(data_dir.index_corrupt_path, orjson.dumps({"metCorruptAt": at_ms}) + b"\n")
    except (OSError, StoreError) as exc:
        log.error("could not record that the index is corrupt (the next boot checks it again): %s", exc)


async def _shut_down(config: HostConfig, shutdown: Shutdown, gateway: Gateway, pipeline: Pipeline,
                     sessions: DynamicSupervisor, supervisor: Supervisor) -> dict[str, int]:
    """Steps 1-3 of the module docstring. Returns how many actors ended in each state."""
    gateway.stop_accepting()
    pipeline.close()
    with trio.move_on_after(config.shutdown_deadline) as drain:
        async with trio.open_nursery() as watch:
            watch.start_soon(_cancel_on, shutdown.hurried, drain)
            await pipeline.drained()
            watch.cancel_scope.cancel()
    if pipeline.in_flight:
        log.warning("shutdown: %d request(s) still in flight after the deadline", pipeline.in_flight)
    gateway.close_connections(CLOSE_GOING_AWAY, "the host is shutting down")
    await gateway.wait_closed()  # before the actors go and the gateway is cancelled (bounded: close_timeout)
    grace = 0.0 if shutdown.hurried.is_set() else config.shutdown_grace
    states: collections.Counter[str] = collections.Counter()
    with trio.move_on_after(2 * grace + 5):
        states.update((await sessions.aclose(grace=grace)).values())
        states.update((await supervisor.aclose(grace=grace)).values())
    log.info("shutdown: actors ended", extra={"actors": dict(states)})
    return dict(states)


async def _cancel_on(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _index_status(log: IndexLog) -> dict[str, Any]:
    st = log.statistics()
    return {"acknowledged": st.acknowledged, "covered": st.covered, "lagOps": st.lag_ops, "lagBytes": st.lag_bytes,
            "maxLagOps": st.max_lag_ops, "maxLagBytes": st.max_lag_bytes, "readWaits": st.waits,
            "appendStalls": st.stalls, "boundOps": log.max_lag_ops, "boundBytes": log.max_lag_bytes}


def _read_clean_marker(data_dir: Any) -> dict[str, Any] | None:
    """The previous run's clean-shutdown record, or None after a crash."""
    try:
        raw = data_dir.clean_shutdown_path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = orjson.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _only_cancelled(exc: BaseException) -> bool:
    """True when ``exc`` is a cancellation (a bare ``Cancelled`` or a group of nothing else)."""
    if isinstance(exc, BaseExceptionGroup):
        _matched, rest = exc.split(trio.Cancelled)
        return rest is None
    return isinstance(exc, trio.Cancelled)


def _write_clean_marker(data_dir: Any, now: int, actors: dict[str, int]) -> None:
    """Step 4: only after a clean drain (an outside cancellation still ran the shielded steps).

    A marker that cannot be written (a full disk: ``atomic_write`` raises ``StorageFull``) costs the next
    boot its full check, nothing else: the stop goes on (``host.json`` is still removed), and says so."""
    try:
        atomic_write(data_dir.clean_shutdown_path, orjson.dumps({"at": now, "actors": actors}))
    except (OSError, StoreError) as exc:
        log.error("the clean-shutdown marker could not be written (%s); the next boot checks every session "
                  "as after a crash", getattr(exc, "code", type(exc).__name__), extra={"error": str(exc)})


async def _release_free_memory_every(interval: float) -> None:
    """The heap's free memory back to the kernel, every ``interval`` seconds (``runtime.process``: large blocks
    are reused while reads run; what a burst left free is returned here)."""
    while True:
        await trio.sleep(interval)
        await trio.to_thread.run_sync(release_free_memory)


def _remove_host_json(data_dir: Any) -> None:
    """The host is gone, however it ended: no ``host.json`` points at it any more."""
    try:
        remove_file_durable(data_dir.host_json_path)
    except OSError:
        pass


def _disk(root: Any, warn_below: int) -> dict[str, Any]:
    """Free space of the data directory's disk (``statvfs``), with a warning under ``warn_below``."""
    st = os.statvfs(root)
    free = st.f_bavail * st.f_frsize
    if free < warn_below:
        log.warning("the data directory's disk has %d bytes free (warning below %d)", free, warn_below)
    return {"freeBytes": free, "totalBytes": st.f_blocks * st.f_frsize, "warnBelowBytes": warn_below,
            "warning": free < warn_below}


def _gateway_stats(gateway: Gateway) -> dict[str, Any]:
    st = gateway.statistics()
    return {"connections": st.connections, "unauthenticated": st.unauthenticated,
            "evictedUnauthenticated": st.evicted_unauthenticated, "slowConsumerCloses": st.slow_consumer_closes,
            "keepaliveCloses": st.keepalive_closes,
            "outboundBytes": st.outbound_bytes, "peakOutboundBytes": st.peak_outbound_bytes,
            "oversizedReplies": st.oversized_replies}


def _dir_size(root: Any) -> int:
    total = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
