"""Boot: everything that must happen before a single request is served.

lock → open/migrate the index (quarantine + rebuild a corrupt one) →
maintenance transaction (interruption fence, retention) → finish interrupted
deletes and sweep temp files → ``secrets_meta`` from the secret files →
reconcile every transcript with the index → (an index quarantined as corrupt)
salvage its DB-only rows and settle them as the maintenance transaction does →
in-flight checkpoint sweep → queue settling → scratch sweep. Synchronous: the supervisor
runs it in a worker thread before it starts any actor or opens the gateway.

Between two steps boot asks ``stop_requested`` (the host's shutdown flag, set
by SIGINT/SIGTERM): when a stop was asked for, it closes the database and raises
:class:`BootInterrupted` naming the step it did not start. Each step commits on
its own, so what ran stays done and the next boot goes on from there.
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runtime.datadir import DataDir, held_leaving_no_file
from store import collab, plugins, projects, review, schedule
from store.approvals import apply_recorded_decisions
from store.attachments import AttachmentFiles
from store.config.providers import follow_stored_keys
from store.config.secrets_meta_rebuild import rebuild_secrets_meta
from store.errors import StorageFull, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fence import (
    interrupt_deliveries,
    interruption_fence,
    previous_boot_started,
    record_boot_report,
    retention,
)
from store.fsutil import sweep_temp_files
from store.indexing.backlog import CATCH_UP_STEP_BYTES, WAL_BOUND_BYTES, Backlog, Steps, run_steps, wal_bytes
from store.indexing.corruption import is_corruption
from store.indexing.cursors import renew_index_identity
from store.indexing.database import (
    OpenReport,
    close_writer,
    disk_full,
    forget_salvage_marker,
    incremental_vacuum,
    open_writer,
    prune_quarantined,
    refuse_early,
    salvage_owed_by_marker,
    sqlite_failure,
    sweep_quarantine_temps,
    transaction,
)
from store.indexing.index import index_mark, index_marks, raise_project_id_floor, session_ids
from store.indexing.reconcile import TailScan, apply_plan, forget_deleted, forget_logged, plan_reconcile, verify_clean
from store.indexing.salvage import SalvageReport, quarantined_main_file, salvage
from store.indexing.salvage import clear_pending as clear_salvage
from store.indexing.salvage import mark_pending as mark_salvage
from store.indexing.salvage import pending_source as pending_salvage
from store.indexing.wal_fold import close_unfolded, fold_or_refuse, fold_wal, short_of_room
from store.inflight import sweep as sweep_inflight
from store.interchange.native_pi import sweep_fork_staging
from store.plan_recovery import apply_recorded_approvals
from store.plans import sweep_intents
from store.queue import settle_after_restart
from store.receipts import RECEIPTS_DIR
from store.receipts import sweep_files as sweep_receipt_files
from store.rules import MAX_TOKEN_CHARS, SESSION_ID_RE
from store.search.search_upkeep import defer_merges, merges_deferred, resume_merges
from store.transcripts import deleted_log
from store.transcripts.session_files import finish_delete, pending_deletes, sweep_session_folders
from store.upgrade.attachment_adopt import adopt_pending, backfill_meta_files, mark_pending
from store.upgrade.migrations import clear_made_anew, made_anew

log = logging.getLogger("pi_host")

InflightSweep = Callable[[sqlite3.Connection, DataDir, int], dict[str, Any]]


def inflight_boot_sweep(conn: sqlite3.Connection, data_dir: DataDir, now_ms: int, *,
                        faults: Faults = NO_FAULTS) -> dict[str, Any]:
    """Boot step 4: promote leftover in-flight checkpoints, then settle the streaming reservations of the
    turns that ended since the previous boot began (the fence's included) that no checkpoint settled
    (``store/inflight.py``). A clock stepped back below that start still covers the fence's turns."""
    previous = previous_boot_started(conn)
    since = 0 if previous is None else min(previous, now_ms)
    return sweep_inflight(conn, sessions_dir=data_dir.sessions_dir, quarantine_dir=data_dir.quarantine_dir,
                          transcript_path=data_dir.transcript, now_ms=now_ms, faults=faults,
                          reservations_since_ms=since)


class BootInterrupted(Exception):
    """A stop was asked for during boot: nothing was served, ``step`` never started."""

    def __init__(self, step: str) -> None:
        super().__init__(f"interrupted before {step}")
        self.step = step


@dataclass
class BootResult:
    conn: sqlite3.Connection
    boot_id: str
    report: dict[str, Any] = field(default_factory=dict)


def load_or_create_token(data_dir: DataDir) -> str:
    """256-bit token in ``host.token`` (0600, created with O_EXCL, then fchmod). A file that holds no token
    a client could send (shorter than 32 characters, not UTF-8, longer than ``host.hello`` takes: damaged)
    is replaced."""
    path = data_dir.token_path
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        st = os.stat(path, follow_symlinks=False)
        if st.st_mode & 0o077:
            os.chmod(path, 0o600)
        try:
            token = path.read_bytes().decode("utf-8").strip()
        except UnicodeDecodeError:
            token = ""
        if 32 <= len(token) <= MAX_TOKEN_CHARS:
            return token
        os.unlink(path)
        return load_or_create_token(data_dir)
    try:
        os.fchmod(fd, 0o600)
        token = secrets.token_hex(32)
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return token


def refuse_before_writing(data_dir: DataDir, *, now_ms: int) -> None:
    """Raise the refusal opening the index will give (a database newer than this build, a version no release
    wrote, a seed-era row the guarded migration refuses: seed §7 "fail closed"), before the host writes
    anything into the data directory: its folders, their modes, the lock and token files, the logs.

    Decided under the data directory's lock (:class:`~runtime.datadir.DataDirLocked` when a host holds it);
    a ``host.lock`` taken for that is removed again. The refusal writes only what opening the index would
    (the backup of the starting version, seed §7). A directory with no database returns at once."""
    if not data_dir.db_path.is_file():
        return
    with held_leaving_no_file(data_dir):
        refuse_early(data_dir.db_path, quarantine_dir=data_dir.quarantine_dir, now_ms=now_ms)


def _session_ids_on_disk(data_dir: DataDir) -> set[str]:
    live: set[str] = set()
    for name in os.listdir(data_dir.sessions_dir):
        if name.endswith(".jsonl") and not name.endswith(".revisions.jsonl"):
            sid = name[: -len(".jsonl")]
            if SESSION_ID_RE.fullmatch(sid):
                live.add(sid)
    return live


_USED_FOLDERS = ("sessions", "attachments", "secrets", "plugins", "config-sync", "quarantine")


def _used_before(data_dir: DataDir) -> bool:
    """Whether a database created anew replaces one that was lost: a host served this data directory
    before (something in its folders). A new data directory starts its project ids at 1."""
    for name in _USED_FOLDERS:
        try:
            with os.scandir(data_dir.root / name) as entries:
                if next(entries, None) is not None:
                    return True
        except OSError:
            continue
    return False


def _finish_deletes(conn: sqlite3.Connection, data_dir: DataDir, now: int) -> list[str]:
    """Deletes that began before the crash: rows and the receipt (from the marker) first, then files."""
    done: list[str] = []
    for pending in pending_deletes(data_dir.sessions_dir):
        sid = pending.session_id
        with transaction(conn):
            forget_deleted(conn, pending, now_ms=now)
        finish_delete(data_dir.session_paths(sid), now_ms=now)
        done.append(sid)
    return sorted(done)


def _count_damage(sid: str, scan: TailScan | None, counts: dict[str, int], damaged: list[dict[str, Any]]) -> None:
    """Torn tails, unparsable mid-file lines and unknown line kinds are skipped, never silent:
    counted in the boot report and logged (RELIABILITY §4 row 4)."""
    if scan is None:
        return
    torn = scan.torn_tail_bytes > 0
    counts["tornTails"] += int(torn)
    counts["badLines"] += len(scan.bad_lines)
    counts["unknownLines"] += scan.unknown_lines
    if scan.bad_lines or torn:
        entry = {"sessionId": sid, "badLines": len(scan.bad_lines), "badLineOffsets": scan.bad_lines[:10],
                 "tornTailBytes": scan.torn_tail_bytes}
        damaged.append(entry)
        log.warning("transcript of %s has damaged lines (skipped)", sid, extra={"damage": entry})


def _far_behind(path: Path, indexed_len: int | None) -> bool:
    """The transcript runs more than one bounded commit past a mark its index has (one ``stat``)."""
    if not indexed_len:
        return False
    try:
        return os.stat(path).st_size - indexed_len > CATCH_UP_STEP_BYTES
    except OSError:
        return False  # missing or unreadable: the plan below says which


def _with_steps(scan: TailScan | None, steps: Steps) -> TailScan | None:
    """The damage a catch-up's bounded commits skipped (``steps``) counted with the rest's scan."""
    if not steps.bad_lines and not steps.unknown_lines:
        return scan
    out = scan if scan is not None else TailScan(start=0, end=0)
    out.bad_lines[:0] = steps.bad_lines
    out.unknown_lines += steps.unknown_lines
    return out


def _secrets_meta_step(conn: sqlite3.Connection, data_dir: DataDir, *, db_rebuilt: bool,
                       now_ms: int) -> dict[str, Any]:
    """Rebuild/repair ``secrets_meta`` in one transaction, and the providers' ``hasApiKey`` with it; an
    unreadable directory is reported, not fatal."""
    try:
        with transaction(conn):
            out = rebuild_secrets_meta(conn, data_dir.secrets_dir, db_rebuilt=db_rebuilt)
            followed = follow_stored_keys(conn, now_ms=now_ms)
    except OSError as exc:
        log.warning("secrets_meta rebuild skipped: %s", exc)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if followed:
        out["providersFollowed"] = followed
    if out["added"] or out["removed"] or out["skipped"] or followed:
        log.info("secrets_meta repaired from secrets/ files", extra={"secrets": out})
    return out


def _salvage_step(conn: sqlite3.Connection, data_dir: DataDir, source: Path, report: dict[str, Any], *,
                  now_ms: int, audit_retention_days: int, boot_id: str, faults: Faults) -> None:
    """Copy what only the quarantined index held into the rebuilt one (``store/indexing/salvage.py``), then
    settle the copied rows as the maintenance transaction settles rows a restart finds: recorded decisions,
    the interruption fence (a salvaged running turn or pending request is interrupted, a handed-out queue
    entry offered again), retention, unslotted schedules, and the providers' key state. Its own failure is
    logged and reported, never a failed boot: the rebuilt index serves without it."""
    detail: dict[str, Any] = {"source": str(source)}
    out: SalvageReport | None = None
    try:
        out = salvage(conn, source, now_ms=now_ms, faults=faults)
        detail = out.to_dict()
    except Exception as exc:
        if disk_full(exc):
            raise
        log.warning("salvaging the quarantined index failed; serving the rebuilt index without the rest: %s",
                    exc, exc_info=True)
        detail["failed"] = f"{type(exc).__name__}: {exc}"
    report["salvage"] = detail
    if out is not None and out.skipped_reason:
        log.warning("the quarantined index was not salvaged: %s", out.skipped_reason)
        with transaction(conn):
            clear_salvage(conn)
        return
    try:
        # each table commits on its own: what a failed salvage had copied is settled too
        with transaction(conn):
            clear_salvage(conn)
            detail["settled"] = {
                "decisionsRecovered": apply_recorded_decisions(conn, data_dir.transcript, now_ms),
                "planApprovalsRecovered": apply_recorded_approvals(conn, data_dir.transcript, now_ms),
                "fence": interruption_fence(conn, now_ms=now_ms, boot_id=boot_id),
                "retention": retention(conn, now_ms=now_ms, audit_days=audit_retention_days),
                "tasksArmed": schedule.arm_unslotted(conn, now_ms),
                "tasksResloted": schedule.reslot_off_grid(conn, now_ms),
                "providersFollowed": follow_stored_keys(conn, now_ms=now_ms),
            }
    except Exception as exc:
        if disk_full(exc):
            raise
        log.warning("settling the salvaged rows failed: %s", exc, exc_info=True)
        detail["settleFailed"] = f"{type(exc).__name__}: {exc}"
        with transaction(conn):
            clear_salvage(conn)
    if out is None:
        return
    log.info("salvaged DB-only rows from the quarantined index", extra={"salvage": detail})
    report["salvaged"] = {t: n for t, n in out.copied.items() if n}
    # skipped: rows not copied for what they hold (not UTF-8, bad JSON, an orphan) or a b-tree that failed
    # midway; rows the rebuild had written already ("kept") are not counted
    skipped = {t: sum(n for why, n in c.items() if why != "kept") for t, c in out.skipped.items()}
    report["salvageSkipped"] = {t: n for t, n in skipped.items() if n}


def run_boot(
    data_dir: DataDir,
    *,
    faults: Faults,
    now_ms: Callable[[], int],
    audit_retention_days: int = 90,
    inflight_sweep: InflightSweep | None = None,
    clean_shutdown: bool | None = None,
    stop_requested: Callable[[], bool] = lambda: False,
    rebuild_index: bool = False,
    keep_quarantined: bool = False,
    native_pi_root: Path | None = None,
) -> BootResult:
    """Recover the data directory before anything is served (``inflight_sweep``: tests inject
    their own; the default is :func:`inflight_boot_sweep` with ``faults``).

    ``stop_requested`` is asked between steps (from this worker thread): True stops the boot
    with :class:`BootInterrupted`. ``rebuild_index``: quarantine the index and rebuild it from the files
    whatever its check says (the running host met it corrupt). ``keep_quarantined``: prune no quarantined copy
    of the index (diagnostics; by default the newest ``QUARANTINED_INDEXES_KEPT`` are kept).
    ``native_pi_root``: the configured pi session root, whose killed native forks' staging files are swept."""
    t0 = time.perf_counter()
    boot_id = secrets.token_hex(8)
    report: dict[str, Any] = {"bootId": boot_id}
    if stop_requested():
        raise BootInterrupted("opening the index")
    conn, open_report = open_writer(
        data_dir.db_path, quarantine_dir=data_dir.quarantine_dir, now_ms=now_ms(), faults=faults,
        quarantine="the running host met it corrupt" if rebuild_index else None,
        verdict=data_dir.index_corrupt_path,  # spent once the file is in quarantine
    )
    report["database"] = open_report.to_dict()
    try:
        # a full disk's leftover WAL folded into the database before boot writes (or nothing written: refused)
        report["walFold"] = fold_or_refuse(conn).to_dict()
        return _recover(conn, open_report, data_dir, report, t0=t0, boot_id=boot_id, faults=faults,
                        now_ms=now_ms, audit_retention_days=audit_retention_days,
                        inflight_sweep=inflight_sweep, clean_shutdown=clean_shutdown,
                        stop_requested=stop_requested, keep_quarantined=keep_quarantined,
                        native_pi_root=native_pi_root)
    except BootInterrupted:
        raise
    except BaseException as exc:
        if isinstance(exc, (sqlite3.DatabaseError, UnicodeDecodeError)) and is_corruption(exc):
            close_writer(conn)  # the caller quarantines the index and boots again (``runtime.host``)
            raise
        if not disk_full(exc):
            raise
        # every step commits on its own: what ran stays done, the next boot (with room) goes on from there; the
        # WAL those commits grew is folded when the disk has room for it, so the failed boot keeps no more room
        # than its commits hold
        if _fold_quietly(conn):
            close_writer(conn)
        else:
            close_unfolded(conn)  # no checkpoint into a full disk on closing either
        if isinstance(exc, StorageFull):
            raise
        if isinstance(exc, sqlite3.Error):
            raise sqlite_failure(exc, "recovering the data directory at boot") from exc
        assert isinstance(exc, OSError)
        raise classify_os_error(exc, "recovering the data directory at boot") from exc


def _fold_quietly(conn: sqlite3.Connection) -> bool:
    """A failed boot's last try to give its WAL back (:func:`fold_wal` when it fits; an error is logged, not
    raised: the boot's own failure is what it reports); whether it was folded."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        return fold_wal(conn).folded
    except (sqlite3.Error, OSError, ValueError) as exc:
        log.info("a failed boot's WAL was not folded: %s", exc)
        return False


@dataclass
class _Merges:
    """FTS5 merges deferred (``store.search.search_upkeep.defer_merges``) before the first commit that indexes
    transcript lines, when the disk is short of room: a merge folds a level's segments in one transaction, up
    to the index's size in the WAL, which is the room a start on a disk that was full lacks. Resumed once the
    reconcile is over if the disk has room then; else the host serves with them deferred (each index commit
    writes its own segment, the DB writer's idle merges fold them in bounded steps) until a boot finds room."""

    conn: sqlite3.Connection
    wanted: bool
    deferred: bool = False

    def before_indexing(self) -> None:
        if self.wanted and not self.deferred:
            with transaction(self.conn):
                defer_merges(self.conn)
            self.deferred = True


def _recover(conn: sqlite3.Connection, open_report: OpenReport, data_dir: DataDir, report: dict[str, Any], *,
             t0: float, boot_id: str, faults: Faults, now_ms: Callable[[], int], audit_retention_days: int,
             inflight_sweep: InflightSweep | None, clean_shutdown: bool | None,
             stop_requested: Callable[[], bool], keep_quarantined: bool,
             native_pi_root: Path | None = None) -> BootResult:
    """The steps of :func:`run_boot` after the index opened."""

    def between(step: str) -> None:
        if stop_requested():
            close_writer(conn)
            raise BootInterrupted(step)

    between("the maintenance transaction")
    now = now_ms()
    quarantined = quarantined_main_file(open_report.quarantined) if open_report.corruption else None
    # an index made anew: every derived row is owed (also when the boot that created it was killed before these
    # steps ran: the schema's own transaction flagged it)
    unfinished = made_anew(conn) and not open_report.created_fresh
    renewed = open_report.rebuilt or open_report.created_fresh or unfinished
    if quarantined is None and not open_report.rebuilt:
        # a host killed after quarantining the index and before the rebuilt one held the salvage's mark (its
        # first transaction, below): the file written before the move still names the copy; the index is then
        # missing, or the fresh one that boot created holds nothing yet
        quarantined = salvage_owed_by_marker(data_dir.quarantine_dir)
        renewed = renewed or quarantined is not None  # the killed boot made this index: it is one made anew
    if open_report.rebuilt or (renewed and _used_before(data_dir)) or quarantined is not None:
        # a database rebuilt from the files numbers the projects again: above any id the lost one issued
        floor = projects.id_floor_after_loss((data_dir.root, data_dir.sessions_dir), now_ms=now)
        faults.point("boot.before_salvage_mark")
        with transaction(conn):
            report["projectIdFloor"] = raise_project_id_floor(conn, floor, now)
            if quarantined is not None:
                # owed until it ran: a boot killed before or during it leaves the mark to the next one
                mark_salvage(conn, quarantined, now)
    forget_salvage_marker(data_dir.quarantine_dir)  # the index holds the mark now, or none is owed
    # seed-era attachment files get their rows once, after the migration asked for it; so does every blob
    # file of a database created anew or rebuilt from the files (the blobs are files, their rows derived:
    # without one, GC takes a referenced blob for an orphan of an interrupted put and deletes it)
    if renewed:
        mark_pending(conn)
        # search.query cursors hold session ordinals, which this index numbered anew
        with transaction(conn):
            renew_index_identity(conn, now)
    report["attachmentsAdopted"] = adopt_pending(conn, data_dir.attachments_dir, now_ms=now,
                                                 sessions_dir=data_dir.sessions_dir)
    # a blob stored before its metadata file existed gets it from its row (a bounded batch per boot, once)
    report["attachmentMetaWritten"] = backfill_meta_files(conn, AttachmentFiles(data_dir.attachments_dir,
                                                                                faults=faults))
    # 1. maintenance transaction: the fence, retention, notification cap, unslotted scheduled tasks
    with transaction(conn):
        # an answer whose decision line was fsynced before the host died takes effect, not the fence
        report["decisionsRecovered"] = apply_recorded_decisions(conn, data_dir.transcript, now)
        report["planApprovalsRecovered"] = apply_recorded_approvals(conn, data_dir.transcript, now)
        report["fence"] = interruption_fence(conn, now_ms=now, boot_id=boot_id)
        report["retention"] = retention(conn, now_ms=now, audit_days=audit_retention_days)
        # a saved schedule without a stored slot (an older build's row, a hand-written one) is armed from now
        report["tasksArmed"] = schedule.arm_unslotted(conn, now)
        # a stored slot of another zone (the host restarted elsewhere) moves to this zone's wall time
        report["tasksResloted"] = schedule.reslot_off_grid(conn, now)
    incremental_vacuum(conn)
    between("finishing interrupted deletes")
    # 2. interrupted deletes (their receipts restored from the markers), interrupted plan
    #    submissions (an artifact no row records is removed), stray temp files
    report["finishedDeletes"] = _finish_deletes(conn, data_dir, now)
    live = _session_ids_on_disk(data_dir)
    if renewed:
        # the ids the user deleted, from the log outside the database: deleted again, never recreated by a retry
        logged = deleted_log.read(data_dir.sessions_dir)
        with transaction(conn):
            report["deletedSessionsRestored"] = forget_logged(conn, logged, live)
    report["deletedLogCompacted"] = deleted_log.compact(data_dir.sessions_dir, live=sorted(live), faults=faults)
    with transaction(conn):
        report["planIntents"] = sweep_intents(conn, data_dir.sessions_dir)
    # an uninstall intent whose receipts all committed (a kill right after the commit) has done its work
    report["uninstallIntents"] = plugins.sweep_uninstall_intents(conn, data_dir.root / "plugins")
    # every folder an atomic write publishes into, the data directory's own files (host.json, the
    # clean-shutdown marker) and config-sync/ included: a kill between a temp write and its rename leaves one
    own_dirs = [d for d in (data_dir.root / "plugins", data_dir.root / "plugins" / "assets",
                            data_dir.root / "config-sync", data_dir.root / RECEIPTS_DIR) if d.is_dir()]
    report["tempFilesRemoved"] = sum(
        len(sweep_temp_files(d))
        for d in (data_dir.root, data_dir.sessions_dir, data_dir.secrets_dir, data_dir.attachments_dir, *own_dirs)
    ) + len(sweep_quarantine_temps(data_dir.quarantine_dir))  # there only the names written that way: never a copy
    if native_pi_root is not None:
        # a native fork killed between its staging write and its link (or before unlinking the staging name):
        # only files provably its staging files, in pi's folders (the child, if linked, stays published)
        native = sweep_fork_staging(native_pi_root)
        report["nativeForkStagingRemoved"] = len(native)
        report["tempFilesRemoved"] += len(native)
    between("the secrets_meta rebuild")
    # 2b. secrets_meta from the secrets/*.sec headers (full rebuild after an index rebuild)
    report["secrets"] = _secrets_meta_step(conn, data_dir,
                                           db_rebuilt=renewed,
                                           now_ms=now_ms())
    if renewed:  # every step owed to an index made anew has run (the salvage below keeps its own mark)
        with transaction(conn):
            clear_made_anew(conn)
    between("reconciling the transcripts with the index")
    # 3. reconcile the index with every transcript (and every row with its file)
    rows = index_marks(conn)
    reconciled: dict[str, int] = {"clean": 0, "tail": 0, "full": 0, "missing": 0, "restoredRows": 0,
                                  "indexedMessages": 0, "removedRows": 0, "errors": 0,
                                  "tornTails": 0, "badLines": 0, "unknownLines": 0, "markBehindFile": 0}
    errors: list[dict[str, str]] = []
    damaged: list[dict[str, Any]] = []
    merges = _Merges(conn, short_of_room(conn))
    for sid in sorted(live | set(rows)):
        indexed_len, epoch = rows.get(sid, (0, None))
        try:
            path = data_dir.transcript(sid)
            # a tail far past the mark: indexed in bounded commits first, the WAL checkpointed between them
            # (store.indexing.backlog: not twice the index's size free on disk); the plan below is the rest
            far = _far_behind(path, indexed_len)
            if far:
                merges.before_indexing()
            steps = run_steps(conn, Backlog(sid, path, now), faults=faults) if far else Steps()
            if steps.commits:
                indexed_len, epoch = index_mark(conn, sid) or (0, None)
            plan = plan_reconcile(path, indexed_len or 0, epoch)
            if plan.kind == "clean" and sid in rows and not steps.commits:
                # "clean" from the mark alone is checked against the file: a mark moved over
                # lines that were never indexed is found here and the session reindexed.
                plan = verify_clean(conn, sid, path, plan)
                reconciled["markBehindFile"] += int(plan.kind != "clean")
            reconciled["tail" if steps.commits and plan.kind == "clean" else plan.kind] += 1
            reconciled["indexedMessages"] += steps.messages
            _count_damage(sid, _with_steps(plan.scan, steps), reconciled, damaged)
            if plan.kind == "clean" and sid in rows:
                continue
            if plan.kind == "missing" and sid in rows and not rows[sid][0]:
                continue
            merges.before_indexing()
            with transaction(conn):
                out = apply_plan(conn, sid, plan, now_ms=now)
            if wal_bytes(conn) > WAL_BOUND_BYTES:
                fold_wal(conn)  # the WAL starts over from nothing when the disk has room for that, else it waits
            reconciled["restoredRows"] += int(out["restoredRow"])
            reconciled["indexedMessages"] += out["indexed"]
            reconciled["removedRows"] += out["removed"]
        except (StoreError, sqlite3.Error, ValueError, OSError) as exc:
            if disk_full(exc):
                raise  # no room for the index: boot fails STORAGE_FULL, never serves a partial index
            reconciled["errors"] += 1
            errors.append({"sessionId": sid, "error": f"{type(exc).__name__}: {exc}"})
    if (merges.deferred or merges_deferred(conn)) and not short_of_room(conn):  # (or an earlier boot's)
        with transaction(conn):
            resume_merges(conn)
    report["mergesDeferred"] = merges_deferred(conn)  # still short of room: until a boot that has it
    report["reconcile"] = reconciled
    if damaged:
        report["damagedTranscripts"] = damaged[:50]
    if errors:
        report["reconcileErrors"] = errors[:50]
    salvage_from = pending_salvage(conn)
    if salvage_from is not None:
        between("salvaging the quarantined index")
        # 3b. the DB-only rows the quarantined file still reads back, before the sweeps that settle them
        _salvage_step(conn, data_dir, salvage_from, report, now_ms=now, audit_retention_days=audit_retention_days,
                      boot_id=boot_id, faults=faults)
    # 3c. older quarantined copies of the index (each as large as the index): the newest few are kept
    try:
        pruned = [] if keep_quarantined else prune_quarantined(
            data_dir.quarantine_dir, data_dir.db_path.name, protect=pending_salvage(conn))
    except StoreError as exc:
        log.warning("pruning old quarantined index copies failed: %s", exc)
    else:
        if pruned:
            log.info("old quarantined index copies deleted", extra={"pruned": pruned})
            report["quarantinePruned"] = len(pruned)
    between("the in-flight checkpoint sweep")
    # 4. in-flight checkpoints whose final row never landed
    if inflight_sweep is not None:
        report["inflight"] = inflight_sweep(conn, data_dir, now)
    else:
        report["inflight"] = inflight_boot_sweep(conn, data_dir, now, faults=faults)
    # 4b. queue entries whose turn the fence ended: consumed if their prompt landed, else waiting again
    with transaction(conn):
        report["queue"] = settle_after_restart(conn, now_ms=now)
        # a delivery whose begin wrote its input line and died before the ledger: bound to that line's turn
        report["queue"]["boundDeliveries"] = collab.bind_landed_inputs(conn, now_ms=now)
        # a delivery whose admission a cut turn had begun with, consumed just now, is interrupted too
        report["queue"]["interruptedDeliveries"] = interrupt_deliveries(conn, now_ms=now, running=False)
    between("the scratch sweep")
    # 5. scratch / review snapshots of sessions that no longer exist
    folders = sweep_session_folders(((data_dir.scratch_root, "scratch"),
                                     (data_dir.review_changes_dir, "review-changes")), session_ids(conn))
    report["scratchSwept"] = folders.removed  # what went, not what was tried
    if folders.left:
        report["scratchNotSwept"] = folders.left[:50]
        log.warning("the startup sweep left %d entr(ies) under scratch/ and review-changes/: %s",
                    len(folders.left), ", ".join(f"{e['path']} ({e['reason']})" for e in folders.left[:10]))
    # a review.record killed before its meta.json: its before bytes (up to 4 MiB) that nothing lists or reads
    # (no record is in flight before the gateway opens; a keyed retry writes both files again)
    report["reviewHalvesRemoved"] = review.remove_unpublished(data_dir.review_changes_dir)
    report["tempFilesRemoved"] += review.sweep_snapshot_temp_files(data_dir.review_changes_dir)
    report["projectRemovalsSwept"] = projects.sweep_removal_intents(conn, data_dir.sessions_dir)
    if pending_salvage(conn) is None:  # else a row the quarantined index still holds may name a file
        # a command receipt's answer file no row names: its transaction rolled back or was killed before its commit
        report["receiptFilesRemoved"] = sweep_receipt_files(conn)
    report["durationMs"] = int((time.perf_counter() - t0) * 1000)
    # Summary figures (protocol BootReport); the detailed sections stay alongside.
    report["cleanShutdown"] = clean_shutdown
    report["sessionsScanned"] = sum(reconciled[k] for k in ("clean", "tail", "full", "missing"))
    report["indexRowsAdded"] = reconciled["indexedMessages"]
    report["indexRowsRemoved"] = reconciled["removedRows"]
    report["inflightPromoted"] = int((report.get("inflight") or {}).get("promoted", 0))
    report["turnsAborted"] = len(report["fence"]["abortedTurns"])
    report["dbRebuilt"] = bool(open_report.rebuilt)
    report["tornTails"] = reconciled["tornTails"]
    report["secretsMetaRebuilt"] = int(report["secrets"].get("added", 0))
    with transaction(conn):
        record_boot_report(conn, boot_id, now, orjson.dumps(report).decode())
    return BootResult(conn=conn, boot_id=boot_id, report=report)
