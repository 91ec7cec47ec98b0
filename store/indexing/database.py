"""Opening the SQLite index: support check, PRAGMAs, corruption quarantine.

Synchronous and stdlib ``sqlite3`` only. The DB-writer actor owns the writer
connection (:func:`open_writer`) and uses it from one worker thread at a
time; readers get separate read-only connections (:func:`open_reader`).

PRAGMAs are seed 003 §3 except ``synchronous``: ``FULL`` by default (every
DB-only write must survive a power cut, ARCHITECTURE.md "Durability"); the
writer may switch a batch of derived-only rows to ``NORMAL`` with
:func:`set_synchronous`.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import orjson

from store.attachments import PresentBlobs
from store.errors import CorruptData, IOFailure, StorageFull, StoreError, UnsupportedSQLite, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, owner_only, remove_file_durable
from store.indexing.corruption import is_corruption
from store.search.search_upkeep import tune_index
from store.upgrade.migrations import (
    SIDECAR_SUFFIXES,
    OpenAction,
    classify,
    free_path,
    migrate,
    move_db_family,
    preflight_refusal,
    refuse_before_writing,
    reset_database,
    schema_too_new,
    schema_unknown,
)
from store.upgrade.schema import SCHEMA_VERSION

MIN_SQLITE_VERSION = (3, 34, 0)
"""First SQLite with the FTS5 trigram tokenizer."""

BUSY_TIMEOUT_MS = 5000
CACHE_SIZE_KIB = 16000
READER_MMAP_BYTES = 256 * 1024 * 1024
WAL_SIZE_LIMIT = 16 * 1024 * 1024
"""What the WAL file keeps of its size once a checkpoint let it start over (``journal_size_limit``). Without it
the file stays as large as the largest transaction ever made it (a full FTS merge: about the whole search
index) for the rest of the host's life; ordinary batches stay under it, so it rarely shrinks and regrows."""
SYNCHRONOUS_MODES = {"FULL": 2, "NORMAL": 1}
_AUTO_VACUUM_INCREMENTAL = 2

# Primary result codes that mean "the file is damaged" (anything else, such as
# SQLITE_BUSY or SQLITE_IOERR, is an environment problem and never quarantines).
_SQLITE_READONLY = 8


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def check_sqlite_support(*, version: tuple[int, int, int] | None = None) -> None:
    """Fail clearly unless SQLite is ≥ 3.34 and the FTS5 trigram tokenizer works.

    ``version`` defaults to the linked library's version (tests may pass an
    older one to see the refusal).
    """
    found = version if version is not None else sqlite3.sqlite_version_info
    shown = _version_text(found)
    if tuple(found) < MIN_SQLITE_VERSION:
        raise UnsupportedSQLite(
            f"SQLite {shown} is too old: pi-host needs SQLite >= "
            f"{_version_text(MIN_SQLITE_VERSION)} (FTS5 trigram tokenizer)",
            data={"found": shown, "required": _version_text(MIN_SQLITE_VERSION)},
        )
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE VIRTUAL TABLE temp.trigram_probe USING fts5(x, tokenize='trigram')")
        probe.execute("INSERT INTO temp.trigram_probe(x) VALUES ('pi-host 你好世界 probe')")
        hits = probe.execute(
            "SELECT count(*) FROM temp.trigram_probe WHERE trigram_probe MATCH '\"好世界\"'"
        ).fetchone()[0]
    except sqlite3.Error as exc:
        raise UnsupportedSQLite(
            f"SQLite {shown} cannot use the FTS5 trigram tokenizer: {exc}",
            data={"found": shown},
        ) from exc
    finally:
        probe.close()
    if hits != 1:
        raise UnsupportedSQLite(
            f"SQLite {shown}: FTS5 trigram tokenizer returned {hits} hits for a known substring",
            data={"found": shown},
        )


def _check_synchronous(mode: str) -> str:
    upper = mode.upper()
    if upper not in SYNCHRONOUS_MODES:
        raise ValueError(f"synchronous must be one of {sorted(SYNCHRONOUS_MODES)}, got {mode!r}")
    return upper


def apply_pragmas(
    conn: sqlite3.Connection,
    *,
    synchronous: str = "FULL",
    busy_timeout_ms: int = BUSY_TIMEOUT_MS,
) -> None:
    """Seed §3 PRAGMAs on a writer connection (``synchronous`` FULL unless told).

    ``auto_vacuum`` goes first: it only takes effect before the first table of
    a fresh file is created.
    """
    mode = _check_synchronous(synchronous)
    # Only when it is not set already: assigning it, even to its current value,
    # rewrites the header page (change counter), and a refused migration must
    # leave the file byte for byte as it was.
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != _AUTO_VACUUM_INCREMENTAL:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    journal = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(journal).lower() != "wal":
        raise IOFailure(f"could not switch the database to WAL journal mode (got {journal!r})")
    conn.execute(f"PRAGMA synchronous = {mode}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
    # Required by the FTS triggers; the file is app-owned, never untrusted input.
    conn.execute("PRAGMA trusted_schema = ON")


def set_synchronous(conn: sqlite3.Connection, mode: str) -> None:
    """Switch the writer between FULL (DB-only state) and NORMAL (derived rows)."""
    upper = _check_synchronous(mode)
    conn.execute(f"PRAGMA synchronous = {upper}")
    got = conn.execute("PRAGMA synchronous").fetchone()[0]
    if got != SYNCHRONOUS_MODES[upper]:
        raise IOFailure(f"PRAGMA synchronous = {upper} did not take effect (reads {got})")


class CheckpointResult(NamedTuple):
    busy: bool
    log_frames: int
    checkpointed_frames: int


def checkpoint_wal(conn: sqlite3.Connection, *, wait_ms: int | None = None) -> CheckpointResult:
    """``PRAGMA wal_checkpoint(TRUNCATE)``; ``busy`` means a reader blocked it. ``wait_ms``: wait at most that
    long for the readers instead of the connection's ``busy_timeout``, which is put back after."""
    if wait_ms is None:
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        return CheckpointResult(bool(busy), int(log), int(done))
    (timeout,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
    try:
        busy, log, done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout)}")
    return CheckpointResult(bool(busy), int(log), int(done))


# --- probing and quarantine ---------------------------------------------------


@dataclass(frozen=True)
class DatabaseProbe:
    """What a read-only look at an existing file found."""

    corrupt: bool
    problem: str | None = None
    user_version: int = 0
    has_schema: bool = False


def _ro_uri(db_path: Path) -> str:
    return f"{db_path.resolve().as_uri()}?mode=ro"


def probe_database(db_path: Path) -> DatabaseProbe:
    """Read ``user_version`` and run ``PRAGMA quick_check`` without writing.

    A too-new database is reported without running the check. Damage
    (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``, a failed ``quick_check``) returns
    ``corrupt=True``; any other error (busy, I/O, permissions) raises
    :class:`IOFailure` so that a healthy file is never quarantined by mistake.
    Sidecar files the read-only connection had to create are removed again.
    """
    db_path = Path(db_path)
    existed = {s: Path(f"{db_path}{s}").exists() for s in ("-wal", "-shm")}
    try:
        try:
            return _probe(db_path, read_only=True)
        except sqlite3.Error as exc:
            # SQLITE_READONLY_*: a hot journal/WAL needs recovery, which only a
            # read-write connection may run. Retry once that way.
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) != _SQLITE_READONLY:
                raise
            return _probe(db_path, read_only=False)
    except sqlite3.Error as exc:
        raise IOFailure(f"cannot check {db_path}: {exc}") from exc
    finally:
        for suffix, was_there in existed.items():
            if not was_there:
                Path(f"{db_path}{suffix}").unlink(missing_ok=True)


def _probe(db_path: Path, *, read_only: bool) -> DatabaseProbe:
    uri = _ro_uri(db_path) if read_only else f"{db_path.resolve().as_uri()}?mode=rw"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            return DatabaseProbe(corrupt=False, user_version=version, has_schema=True)
        rows = conn.execute("PRAGMA quick_check").fetchall()
        if rows != [("ok",)]:
            text = "; ".join(str(row[0]) for row in rows[:5])
            return DatabaseProbe(corrupt=True, problem=f"quick_check: {text[:500]}")
        objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return DatabaseProbe(corrupt=False, user_version=version, has_schema=objects > 0)
    except sqlite3.Error as exc:
        if is_corruption(exc):
            name = getattr(exc, "sqlite_errorname", "SQLITE_CORRUPT")
            return DatabaseProbe(corrupt=True, problem=f"{name}: {exc}")
        raise
    except UnicodeDecodeError as exc:
        # SQLite's own error message quotes bytes that are not UTF-8 (a schema row's name the host never
        # wrote so): the file is damaged, and the message cannot even be decoded into an sqlite3.Error
        return DatabaseProbe(corrupt=True, problem=f"SQLITE_CORRUPT: an error message quoting bytes that are "
                                                   f"not UTF-8 ({exc})")
    finally:
        conn.close()


def quarantine_database(
    db_path: Path, quarantine_dir: Path, *, now_ms: int, faults: Faults = NO_FAULTS
) -> list[Path]:
    """Move ``db`` (+ ``-wal``, ``-journal``, ``-shm``) to ``quarantine_dir``.

    Names are ``<db>.corrupt-<now_ms>`` plus the original suffix; both
    directories are fsynced. Returns the quarantined paths.
    """
    db_path = Path(db_path)
    quarantine_dir = Path(quarantine_dir)
    try:
        quarantine_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise classify_os_error(exc, f"creating {quarantine_dir}") from exc
    target = free_path(quarantine_dir / f"{db_path.name}.corrupt-{now_ms}", now_ms)
    # the salvage is owed before the file moves: a kill after the move and before the rebuilt index holds its
    # mark (boot's first transaction) would leave a fresh index and the DB-only rows in quarantine for good
    try:
        atomic_write(quarantine_dir / SALVAGE_OWED, orjson.dumps({"source": target.name}), faults=faults,
                     point_prefix="quarantine")
    except OSError as exc:
        raise classify_os_error(exc, f"writing {quarantine_dir / SALVAGE_OWED}") from exc
    faults.point("db.quarantine.before_move")
    moved = move_db_family(db_path, target, keep_empty_sidecars=True)
    faults.point("db.quarantine.after_move")
    return moved


SALVAGE_OWED = "salvage-owed.json"
"""In ``quarantine/``: the quarantined copy of the index a salvage is owed from, written before the copy
moves there and removed once the rebuilt index holds the mark (:func:`salvage_owed_by_marker`)."""


def salvage_owed_by_marker(quarantine_dir: Path) -> Path | None:
    """The quarantined copy :data:`SALVAGE_OWED` names, when it is there (a kill before the move leaves the
    marker naming nothing: the index is still in place and quarantined again)."""
    try:
        source = orjson.loads((quarantine_dir / SALVAGE_OWED).read_bytes()).get("source")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(source, str) or "/" in source or not source:
        return None
    path = quarantine_dir / source
    return path if path.is_file() else None


def forget_salvage_marker(quarantine_dir: Path) -> None:
    """Once the rebuilt index holds the salvage's mark (or none is owed)."""
    remove_file_durable(quarantine_dir / SALVAGE_OWED)


QUARANTINED_INDEXES_KEPT = 3
"""How many quarantined copies of a corrupt index ``quarantine/`` keeps (the newest; each is as large as
the index, and a failing disk can produce one per restart)."""


def prune_quarantined(quarantine_dir: Path, db_name: str, *, keep: int = QUARANTINED_INDEXES_KEPT,
                      protect: Path | None = None) -> list[str]:
    """Delete all but the newest ``keep`` quarantined copies of the index (``<db>.corrupt-<ms>`` with its
    sidecars, newest by the time in the name, never by mtime), never ``protect`` (a copy whose salvage is
    still owed), and the scratch folders of a salvage a kill interrupted (``.salvage-*``). Only copies
    :func:`quarantine_database` made are touched: a transcript's quarantined lines are user data and stay.
    Returns the deleted copies' names."""
    pattern = re.compile(re.escape(db_name) + r"\.corrupt-(\d+)(\.\d+(-\d+)?)?")
    try:
        names = os.listdir(quarantine_dir)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise classify_os_error(exc, f"listing {quarantine_dir}") from exc
    families: dict[str, int] = {}
    for name in names:
        base = next((name[: -len(s)] for s in SIDECAR_SUFFIXES if name.endswith(s)), name)
        m = pattern.fullmatch(base)
        if m:
            families[base] = int(m.group(1))
    newest_first = sorted(families, key=lambda b: (families[b], b), reverse=True)
    doomed = [b for b in newest_first[keep:] if protect is None or b != protect.name]
    try:
        for base in doomed:
            for suffix in ("", *SIDECAR_SUFFIXES):
                (quarantine_dir / f"{base}{suffix}").unlink(missing_ok=True)
        for name in names:
            if name.startswith(".salvage-"):
                shutil.rmtree(quarantine_dir / name, ignore_errors=True)
        if doomed:
            fsync_dir(quarantine_dir)
    except OSError as exc:
        raise classify_os_error(exc, f"pruning {quarantine_dir}") from exc
    return sorted(doomed)


QUARANTINE_WRITE_TEMP = re.compile(
    rf"(?:{re.escape(SALVAGE_OWED)}|kv\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[0-9]+(?:-[0-9]+)?)"
    r"\.tmp\.[0-9a-f]{12}")
"""The temp file of an interrupted :func:`~store.fsutil.atomic_write` into ``quarantine/``
(``<name>.tmp.<12 hex>``) of a file published there that way: :data:`SALVAGE_OWED`, or a damaged setting's
bytes ``pi-host doctor --repair`` sets aside (``kv.<ns>.<key>.<ms>[-<n>]``, every part file-name-safe:
``store.doctor.doctor_settings.quarantine_name``). Exact on purpose: :func:`~store.fsutil.is_temp_name`
alone would take a finished copy of key ``tmp`` (``kv.ui.tmp.<ms>``) for a temp file. Such a temp file holds
nothing the data directory lacks: the write it belonged to was either published (a link or rename of the
same bytes) or never acknowledged (the setting's row is deleted only once its copy is in place)."""


def quarantine_temp_files(quarantine_dir: Path) -> list[str]:
    """The names of :data:`QUARANTINE_WRITE_TEMP` files in ``quarantine_dir`` (regular files only)."""
    try:
        with os.scandir(quarantine_dir) as entries:
            return sorted(e.name for e in entries
                          if QUARANTINE_WRITE_TEMP.fullmatch(e.name) and e.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise classify_os_error(exc, f"listing {quarantine_dir}") from exc


def sweep_quarantine_temps(quarantine_dir: Path) -> list[str]:
    """Remove the temp files interrupted writes left in ``quarantine/`` (:data:`QUARANTINE_WRITE_TEMP`, never
    a finished file); their names. Boot runs it before anything writes there, and ``pi-host doctor --repair``."""
    doomed = quarantine_temp_files(quarantine_dir)
    try:
        for name in doomed:
            (quarantine_dir / name).unlink(missing_ok=True)
        if doomed:
            fsync_dir(quarantine_dir)
    except OSError as exc:
        raise classify_os_error(exc, f"sweeping {quarantine_dir}") from exc
    return doomed


# --- the writer ---------------------------------------------------------------


@dataclass
class OpenReport:
    """What :func:`open_writer` did to get a usable database.

    ``rebuilt`` is True when an existing file was replaced by a fresh one
    (quarantined as corrupt, or archived by a reset): the caller must rebuild
    the index from the transcripts. ``created_fresh`` is True whenever the
    schema was created in this call (also for a missing file).
    """

    db_path: Path
    schema_version: int = SCHEMA_VERSION
    created_fresh: bool = False
    rebuilt: bool = False
    quarantined: list[Path] = field(default_factory=list)
    corruption: str | None = None
    migrated_from: int | None = None
    archived_to: Path | None = None
    archived_version: int | None = None
    backups: list[Path] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    """The versions each applied migration step reached, in order."""

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form (paths as strings, camelCase keys) for the boot report."""
        return {
            "dbPath": str(self.db_path),
            "schemaVersion": self.schema_version,
            "createdFresh": self.created_fresh,
            "rebuilt": self.rebuilt,
            "quarantined": [str(p) for p in self.quarantined],
            "corruption": self.corruption,
            "migratedFrom": self.migrated_from,
            "archivedTo": None if self.archived_to is None else str(self.archived_to),
            "archivedVersion": self.archived_version,
            "backups": [str(p) for p in self.backups],
            "steps": list(self.steps),
        }


def _in_wal_mode(db_path: Path) -> bool:
    """The file header says WAL (read/write format version bytes 18-19 are 2)."""
    try:
        with db_path.open("rb") as f:
            header = f.read(20)
    except OSError as exc:
        raise classify_os_error(exc, f"reading {db_path}") from exc
    return len(header) == 20 and header[18:20] == b"\x02\x02"


def _connect_writer(db_path: Path) -> sqlite3.Connection:
    if not db_path.exists():
        # Created by us so that the file (and the -wal/-shm SQLite derives
        # from its mode) is 0600.
        try:
            os.close(os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise classify_os_error(exc, f"creating {db_path}") from exc
    try:
        return sqlite3.connect(
            db_path,
            isolation_level=None,
            check_same_thread=False,
            timeout=BUSY_TIMEOUT_MS / 1000,
        )
    except sqlite3.Error as exc:
        raise IOFailure(f"cannot open {db_path}: {exc}") from exc


_SQLITE_FULL = 13


def disk_full(exc: BaseException) -> bool:
    """The failure is a full file system: :class:`StorageFull`, ``ENOSPC``/``EDQUOT``/``EFBIG``, or
    SQLite's "database or disk is full" (``SQLITE_FULL``)."""
    if isinstance(exc, StorageFull):
        return True
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    if not isinstance(exc, sqlite3.Error):
        return False
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == _SQLITE_FULL or "disk is full" in str(exc).lower()


def sqlite_failure(exc: sqlite3.Error, what: str) -> StoreError:
    """The stable error for an SQLite failure outside the writer actor: a full disk is
    :class:`StorageFull` (retriable once space is freed), anything else :class:`IOFailure`."""
    if disk_full(exc):
        return StorageFull(f"{what}: the disk is full ({exc})")
    return IOFailure(f"{what}: {exc}")


def open_writer(
    db_path: Path,
    *,
    quarantine_dir: Path,
    now_ms: int,
    faults: Faults = NO_FAULTS,
    synchronous: str = "FULL",
    platform: str | None = None,
    quarantine: str | None = None,
    verdict: Path | None = None,
) -> tuple[sqlite3.Connection, OpenReport]:
    """Open (creating, quarantining, archiving or migrating as needed) the writer.

    Steps: support check → if the file exists, a read-only probe: damage →
    quarantine and start fresh; ``user_version`` newer than this build →
    :class:`SchemaTooNew`, a number no release wrote → ``SchemaUnknown``
    (nothing written); a pre-v7 version → archive (reset) and start fresh →
    writer connection (autocommit, ``check_same_thread=False``) → PRAGMAs →
    :func:`store.upgrade.migrations.migrate` (the seed's chain and ours; ``platform``
    picks the shell catalog the guarded seed step checks, default: this one).
    A leftover ``-wal``/``-journal`` without its database is quarantined too:
    it must never be replayed into a fresh file. ``quarantine``: why an existing file is quarantined
    without a probe (damage met while it was in use, which a ``quick_check`` may not see); ``verdict``: the
    file that asked for it (the host's record that it met the index corrupt), removed as soon as the file is
    in quarantine, before a fresh index is created: a boot killed after that opens the new index, which
    holds (or :data:`SALVAGE_OWED` names) the salvage still owed from the quarantined copy, instead of
    quarantining the new one too and salvaging from it.
    """
    check_sqlite_support()
    db_path = Path(db_path)
    report = OpenReport(db_path=db_path)
    if db_path.exists():
        probe = DatabaseProbe(corrupt=True, problem=quarantine) if quarantine else probe_database(db_path)
        if probe.corrupt:
            report.corruption = probe.problem
            report.quarantined = quarantine_database(
                db_path, Path(quarantine_dir), now_ms=now_ms, faults=faults
            )
            report.rebuilt = True
        else:
            action = classify(probe.user_version, probe.has_schema)
            if action is OpenAction.TOO_NEW:
                raise schema_too_new(db_path, probe.user_version)
            if action is OpenAction.UNKNOWN:
                raise schema_unknown(db_path, probe.user_version)
            if action is OpenAction.RESET:
                report.archived_to = reset_database(
                    db_path, probe.user_version, now_ms=now_ms, faults=faults
                )
                report.archived_version = probe.user_version
                report.rebuilt = True
            if action is OpenAction.UPGRADE and not _in_wal_mode(db_path):
                # The writer's PRAGMAs would rewrite the header of a rollback-journal
                # file: a refusal must be found while the file is still untouched.
                refuse_before_writing(db_path, now_ms=now_ms, platform=platform)
    elif any(Path(f"{db_path}{s}").exists() for s in SIDECAR_SUFFIXES):
        report.corruption = "journal files without their database"
        report.quarantined = quarantine_database(
            db_path, Path(quarantine_dir), now_ms=now_ms, faults=faults
        )
    if quarantine and verdict is not None:
        try:
            remove_file_durable(verdict)
        except OSError as exc:
            raise classify_os_error(exc, f"removing {verdict}") from exc
    conn = _connect_writer(db_path)
    try:
        apply_pragmas(conn, synchronous=synchronous)
        result = migrate(conn, db_path, now_ms=now_ms, faults=faults, platform=platform)
        tune_index(conn)  # FTS5 options of the search index (idempotent)
        if result.created_fresh:
            fsync_dir(db_path.parent)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise sqlite_failure(exc, f"cannot prepare {db_path}") from exc
        if isinstance(exc, OSError):
            raise classify_os_error(exc, f"preparing {db_path}") from exc
        raise
    for suffix in ("", "-wal", "-shm"):  # the host's now, whatever mode an earlier build left it (and its pair) in
        owner_only(f"{db_path}{suffix}")  # only once no refusal can come: a refused file keeps every mode
    report.created_fresh = result.created_fresh
    report.schema_version = result.to_version
    report.backups = list(result.backups)
    report.steps = list(result.applied)
    if result.applied:
        report.migrated_from = result.from_version
    return conn, report


@contextmanager
def _looking(db_path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``db_path``; sidecars it had to create are removed when it is closed."""
    existed = {s: Path(f"{db_path}{s}").exists() for s in ("-wal", "-shm")}
    try:
        conn = sqlite3.connect(_ro_uri(db_path), uri=True, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()
    finally:
        for suffix, was_there in existed.items():
            if not was_there:
                Path(f"{db_path}{suffix}").unlink(missing_ok=True)


def _peek_version(db_path: Path) -> tuple[int, bool] | None:
    """``user_version`` and whether any schema object exists, read without a ``quick_check`` (None: the file
    does not read as a database, or only a read-write connection could read it)."""
    try:
        with _looking(db_path) as conn:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] if version == 0 else 1
            return version, objects > 0
    except (sqlite3.Error, UnicodeDecodeError):
        return None


def refuse_early(db_path: Path, *, quarantine_dir: Path, now_ms: int, platform: str | None = None) -> None:
    """Raise the refusal :func:`open_writer` would raise for ``db_path`` (:class:`SchemaTooNew`,
    ``SchemaUnknown``, the guarded step's :class:`MigrationFailed`), else return having written nothing.

    For a host to run before it writes anything else into its data directory (seed §7: a refused start
    leaves the directory as it found it). A current, new, damaged or unreadable file returns at once: the
    host's boot opens it as ever. Only when the read-only look says the open would refuse is
    :func:`open_writer` itself run, so the refusal (its message, and the backup of the starting version it
    leaves) is the one a boot would have given.
    """
    db_path = Path(db_path)
    if not db_path.is_file():
        return
    peek = _peek_version(db_path)
    if peek is None:
        return
    action = classify(*peek)
    if action is OpenAction.TOO_NEW:
        raise schema_too_new(db_path, peek[0])
    if action not in (OpenAction.UNKNOWN, OpenAction.UPGRADE):
        return
    probe = probe_database(db_path)  # a damaged file is quarantined by the boot, not refused
    if probe.corrupt:
        return
    action = classify(probe.user_version, probe.has_schema)
    if action is OpenAction.UPGRADE:
        with _looking(db_path) as conn:
            refusal = preflight_refusal(conn, platform=platform)
        if refusal is None:
            return
    elif action is not OpenAction.UNKNOWN:
        return
    conn, _report = open_writer(db_path, quarantine_dir=quarantine_dir, now_ms=now_ms, platform=platform)
    conn.close()  # not refused after all (the file changed since the look): the boot opens it as ever


class ReaderConnection(sqlite3.Connection):
    """A connection of the reader pool (:func:`open_reader`), with what its reads may keep between them.

    ``spans_memo``: window spans (``index.window_spans`` rows) this connection read, by ``(session id,
    start, end)``, valid only at the database version ``spans_version`` (``PRAGMA data_version``, which
    changes with every commit of another connection; a reader commits nothing). ``windows.read_cold``
    keeps and uses it within one read snapshot, whose version it asks first. ``blobs_memo``: see below."""

    spans_version: int | None
    spans_memo: dict[tuple[str, int, int], list[Any]]
    blobs_memo: PresentBlobs
    """The blob files this connection's reads found, kept while their folder is unchanged
    (``store.attachments.reader_memo``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spans_version = None
        self.spans_memo = {}
        self.blobs_memo = PresentBlobs()


def open_reader(db_path: Path, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """A read-only connection (``mode=ro`` and ``query_only``) for the reader pool."""
    db_path = Path(db_path)
    try:
        conn = sqlite3.connect(
            _ro_uri(db_path),
            uri=True,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout_ms / 1000,
            factory=ReaderConnection,
        )
    except sqlite3.Error as exc:
        raise IOFailure(f"cannot open {db_path} read-only: {exc}") from exc
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA cache_size = -{CACHE_SIZE_KIB}")
        conn.execute("PRAGMA trusted_schema = ON")
        # Readers map the file instead of copying pages through read(): measured
        # 8-15 % faster on trigram searches over a 1M-message index.
        conn.execute(f"PRAGMA mmap_size = {READER_MMAP_BYTES}")
    except (sqlite3.Error, UnicodeDecodeError) as exc:  # the latter: SQLite's message quotes damaged bytes
        conn.close()
        raise IOFailure(f"cannot prepare read-only connection to {db_path}: {exc}") from exc
    return conn


__all__ = [
    "BUSY_TIMEOUT_MS",
    "CheckpointResult",
    "DatabaseProbe",
    "MIN_SQLITE_VERSION",
    "OpenReport",
    "ReaderConnection",
    "apply_pragmas",
    "check_sqlite_support",
    "checkpoint_wal",
    "in_transaction",
    "offline_reads",
    "open_offline_reader",
    "open_reader",
    "open_writer",
    "probe_database",
    "quarantine_database",
    "quarantine_temp_files",
    "sweep_quarantine_temps",
    "schema_version",
    "set_synchronous",
    "transaction",
]

T = TypeVar("T")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception (boot's own transactions)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def in_transaction(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """``fn(conn)`` in one committed transaction (:func:`transaction`); its value."""
    with transaction(conn):
        return fn(conn)


def close_writer(conn: sqlite3.Connection) -> None:
    """Shutdown: end any transaction, checkpoint the WAL if nobody reads, close (best effort)."""
    try:
        if conn.in_transaction:
            conn.rollback()
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    except sqlite3.Error:
        pass
    conn.close()


def incremental_vacuum(conn: sqlite3.Connection) -> None:
    """Give freed pages back to the file system (``auto_vacuum = INCREMENTAL``)."""
    # sqlite3.execute steps a row-less PRAGMA once (= one page); executescript steps it to the end.
    conn.executescript("PRAGMA incremental_vacuum;")


def open_offline_reader(db_path: Path) -> sqlite3.Connection:
    """A read-only connection for a CLI while **no host** runs (the caller holds ``host.lock`` shared).

    With a ``-wal`` file present (a host was killed), ``mode=ro`` reads its
    committed frames; without one the file is opened ``immutable=1``, so no
    ``-wal``/``-shm`` file is created: nothing in the data directory changes.
    Raises :class:`IOFailure` when the file is missing or unreadable.
    """
    db_path = Path(db_path)
    if not db_path.is_file():
        raise IOFailure(f"{db_path} does not exist (no host has run on this data directory)")
    wal = db_path.with_name(db_path.name + "-wal")
    uri = _ro_uri(db_path) if wal.exists() else f"{db_path.resolve().as_uri()}?immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA trusted_schema = ON")
    except sqlite3.Error as exc:
        raise IOFailure(f"cannot open {db_path} read-only: {exc}") from exc
    try:
        conn.execute("PRAGMA user_version").fetchone()  # a file that is no database fails its first read
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise _unreadable(db_path, exc) from exc
    return conn


def _unreadable(db_path: Path, exc: sqlite3.DatabaseError) -> CorruptData:
    return CorruptData(f"{db_path} cannot be read ({exc}); the next `pi-host serve` quarantines it and "
                       "rebuilds the index from the transcripts (`pi-host doctor` says more)",
                       data={"path": str(db_path)})


@contextmanager
def offline_reads(db_path: Path) -> Iterator[None]:
    """Around the reads on an :func:`open_offline_reader` connection: a damaged file met past its first page
    (:func:`~store.indexing.corruption.is_corruption`: a malformed page, a text value that is not UTF-8, an
    FTS5 table that cannot be opened) is the same :class:`CorruptData` as one met on opening it."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if not is_corruption(exc):
            raise
        raise _unreadable(Path(db_path), exc) from exc


def schema_version(conn: sqlite3.Connection) -> int:
    """``PRAGMA user_version`` (the layout the file holds; ``store/upgrade/schema.py`` names the current one)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])
