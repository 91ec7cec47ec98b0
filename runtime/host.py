"""The supervisor's top level: boot, start actors, open the gateway, shut down cleanly.

Order (hypercorn's "listeners only after startup"): lock → boot recovery (in a
worker thread; nothing served) → DB writer → scheduler → session registry →
gateway → ``host.json``. Shutdown runs in reverse: gateway closed, session
actors stopped (writers closed), scheduler stopped, DB writer drained, connection closed, clean-shutdown
marker written.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from actors.db_reader import ReadPool
from actors.db_writer import DbWriter, DbWriterStats
from actors.events import EventBus
from actors.gateway import Gateway
from actors.gateway_types import GatewayConfig
from actors.registry import SessionRegistry
from actors.scheduler import Scheduler, tasks_changed
from actors.session import DbHandle, SessionDeps
from runtime.api import VERSION, HostApi, wall_ms
from runtime.boot import BootResult, load_or_create_token, run_boot
from runtime.config import HostConfig
from runtime.datadir import DataDirLock
from runtime.features import feature_handlers, feature_methods, inflight_boot_sweep
from runtime.kernel.supervisor import ActorRef, ChildSpec, DynamicSupervisor, Supervisor
from store.faults import Faults
from store.fsutil import atomic_write, remove_file_durable

log = logging.getLogger("pi_host")


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
    api: HostApi
    bus: EventBus
    faults: Faults
    scheduler: ActorRef | None = None

    def kill_actor(self, name: str) -> bool:
        """Chaos hook: crash an actor by name ("db-writer", "scheduler" or "session:<id>")."""
        if name.startswith("session:"):
            return self.registry.kill(name.split(":", 1)[1])
        return bool(self.supervisor.kill(name))


async def run_host(
    config: HostConfig,
    *,
    task_status: trio.TaskStatus[RunningHost] = trio.TASK_STATUS_IGNORED,
    now_ms: Callable[[], int] = wall_ms,
) -> None:
    data_dir = config.data_dir
    started_at = now_ms()
    t0 = time.monotonic()
    await trio.to_thread.run_sync(data_dir.ensure)
    lock = DataDirLock(data_dir)
    lock.acquire()
    faults = Faults.parse(config.faults_spec or os.environ.get("RT_CRASHPOINT"))
    try:
        clean = await trio.to_thread.run_sync(data_dir.clean_shutdown_path.exists)
        await trio.to_thread.run_sync(remove_file_durable, data_dir.clean_shutdown_path)
        token = await trio.to_thread.run_sync(load_or_create_token, data_dir)
        boot = await trio.to_thread.run_sync(
            lambda: run_boot(data_dir, faults=faults, now_ms=now_ms,
                             audit_retention_days=config.audit_retention_days,
                             inflight_sweep=inflight_boot_sweep, clean_shutdown=clean)
        )
        log.info("boot finished", extra={"report": boot.report})
        reads = ReadPool(data_dir.db_path, size=config.read_pool_size)
        await trio.to_thread.run_sync(reads.warm)
        bus = EventBus()
        db_stats = DbWriterStats()
        try:
            async with trio.open_nursery() as nursery:
                supervisor = Supervisor(intensity=config.restart_intensity, period=config.restart_period)
                await nursery.start(supervisor.run)
                writer_ref = await supervisor.start_child(
                    ChildSpec("db-writer", lambda: DbWriter(
                        boot.conn, mailbox_size=config.db_mailbox, batch_limit=config.db_batch_limit,
                        faults=faults, stats=db_stats, force_synchronous=config.synchronous,
                        upkeep_after=config.search_upkeep_after))
                )
                db = DbHandle(lambda op: writer_ref.ask(op, timeout=config.ask_timeout))
                scheduler_ref = await supervisor.start_child(
                    ChildSpec("scheduler", lambda: Scheduler(db=db, reads=reads, bus=bus, now_ms=now_ms,
                                                             faults=faults))
                )
                sessions = DynamicSupervisor(
                    intensity=config.session_restart_intensity, period=config.restart_period,
                    max_children=config.max_sessions_active,
                )
                await nursery.start(sessions.run)
                deps = SessionDeps(
                    data_dir=data_dir, db=db, reads=reads, bus=bus, faults=faults, now_ms=now_ms,
                    features=feature_handlers(), idle_timeout=config.session_idle_timeout,
                    mailbox_size=config.session_mailbox, batch_limit=config.session_batch_limit,
                )
                registry = SessionRegistry(deps, sessions, ask_timeout=config.ask_timeout)

                async def status() -> dict[str, Any]:
                    size = await trio.to_thread.run_sync(_dir_size, data_dir.root)
                    sup_stats = supervisor.statistics()
                    sess_stats = sessions.statistics()
                    writer_actor = writer_ref.current() if hasattr(writer_ref, "current") else None
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
                            "sessions": _count(sess_stats, "children"),
                            "total": _count(sess_stats, "children") + _count(sup_stats, "children"),
                            "restarts": _count(sess_stats, "restarts") + _count(sup_stats, "restarts"),
                        },
                        "dbWriter": {"queueDepth": depth, "peakDepth": peak, "batches": db_stats.batches,
                                     "ops": db_stats.ops, "maxBatch": db_stats.max_batch,
                                     "fullCommits": db_stats.full_commits,
                                     "normalCommits": db_stats.normal_commits,
                                     "searchUpkeepSteps": db_stats.upkeep_steps},
                        "dataDirBytes": size,
                        "boot": boot.report,
                    }

                api = HostApi(registry=registry, reads=reads, db=db, bus=bus, status=status,
                              boot_id=boot.boot_id, now_ms=now_ms, validate_results=config.validate_results,
                              extra_handlers=feature_methods(registry=registry, reads=reads, db=db, bus=bus,
                                                             now_ms=now_ms, data_dir=data_dir, faults=faults,
                                                             scheduler=tasks_changed(scheduler_ref.tell_nowait)))
                gw_config = GatewayConfig(
                    host=config.host, port=config.port, token=token,
                    allowed_origins=config.allowed_origins,
                    max_frame_bytes=config.max_frame_bytes, max_params_bytes=config.max_params_bytes,
                )
                gateway = Gateway(gw_config, api, bus)
                port = await nursery.start(gateway.serve)
                url = f"ws://{_url_host(config.host)}:{port}"
                info = {"pid": os.getpid(), "url": url, "tokenFile": str(data_dir.token_path),
                        "startedAt": started_at, "bootId": boot.boot_id, "version": VERSION}
                await trio.to_thread.run_sync(
                    lambda: atomic_write(data_dir.host_json_path, orjson.dumps(info, option=orjson.OPT_INDENT_2))
                )
                running = RunningHost(config=config, port=port, url=url, token=token, boot=boot,
                                      registry=registry, supervisor=supervisor, sessions=sessions, api=api,
                                      bus=bus, faults=faults, scheduler=scheduler_ref)
                task_status.started(running)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        with trio.move_on_after(10):
                            await sessions.aclose(grace=5.0)
                            await supervisor.aclose(grace=5.0)
                    nursery.cancel_scope.cancel()
        finally:
            reads.close()
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_close_conn, boot.conn)
                await trio.to_thread.run_sync(_write_clean_marker, data_dir, now_ms())
    finally:
        lock.release()


def _close_conn(conn: Any) -> None:
    try:
        if conn.in_transaction:
            conn.rollback()
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except Exception:  # noqa: BLE001 - best effort on shutdown
        pass
    conn.close()


def _write_clean_marker(data_dir: Any, now: int) -> None:
    try:
        atomic_write(data_dir.clean_shutdown_path, orjson.dumps({"at": now}))
        remove_file_durable(data_dir.host_json_path)
    except OSError:
        pass


def _dir_size(root: Any) -> int:
    total = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def _count(stats: Any, name: str) -> int:
    value = getattr(stats, name, None)
    if value is None and isinstance(stats, dict):
        value = stats.get(name)
    if isinstance(value, (list, tuple, dict)):
        return len(value)
    return int(value or 0)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
