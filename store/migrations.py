"""Our migration chain, keyed by ``PRAGMA user_version`` (seed 003 §7).

What happens to a database depends only on its ``user_version`` (see
:func:`classify`):

* 0 and no schema objects  → fresh install: the full DDL at ``SCHEMA_VERSION``.
* 1–6                      → seed D119 breaking reset: archived as ``<db>.v6.bak``.
* 7–19 (seed-era layouts we cannot migrate), or 0 with foreign schema objects
                           → the same reset, archived as ``<db>.v<n>.bak``.
* 20 … SCHEMA_VERSION-1    → the ordered :data:`STEPS`, each in ONE transaction,
                             an exact readable ``<db>.v<n>.bak`` before any
                             destructive step.
* SCHEMA_VERSION           → plain open.
* > SCHEMA_VERSION         → :class:`~store.errors.SchemaTooNew`; file untouched.

The reset is a file operation (the old file is renamed, not rewritten), so it
happens before the writer connection opens (:func:`reset_database`);
:func:`migrate` runs on the writer connection for everything else.

An archive or backup never overwrites an older one: when ``<db>.v6.bak`` is
taken, the new one is ``<db>.v6.bak.<now_ms>``.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from .errors import IOFailure, SchemaTooNew, StoreError, classify_os_error
from .faults import NO_FAULTS, Faults
from .fsutil import fsync_dir
from .schema import (
    DDL,
    DDL_V20,
    DDL_V21,
    DDL_V22,
    MAX_SEQ,
    MID_SEQ_BITS,
    SCHEMA_VERSION,
    V21_ADDITIONS,
    V22_MESSAGE_TRIGGERS,
    V22_MESSAGES_FTS,
    V22_SEARCH_HAZARD,
    V22_SESSIONS,
    V23_ADDITIONS,
    apply_schema,
    hazard_sql,
    searchable_sql,
)

FIRST_MIGRATABLE_VERSION = 20
"""The oldest ``user_version`` the step chain upgrades in place."""

LAST_PRE_V7_VERSION = 6
"""Versions 1..6 are archived under the seed's fixed name ``<db>.v6.bak``."""

SIDECAR_SUFFIXES = ("-wal", "-journal", "-shm")


class MigrationFailed(StoreError):
    """A migration step failed; it was rolled back and the old schema is authoritative."""

    code = "MIGRATION_FAILED"


@dataclass(frozen=True)
class MigrationStep:
    """One structural change from ``to_version - 1`` to ``to_version``.

    ``apply`` runs inside the step's transaction and must neither commit nor
    roll back. ``destructive`` steps (anything that drops, rebuilds or rewrites
    existing rows) get a WAL checkpoint and an exact backup first, and run
    with foreign key enforcement off (table rebuilds) plus a
    ``foreign_key_check`` before commit.
    """

    to_version: int
    description: str
    destructive: bool
    apply: Callable[[sqlite3.Connection], None]


def _v21_boot_reports(conn: sqlite3.Connection) -> None:
    for statement in V21_ADDITIONS:
        conn.execute(statement)


def _v22_search_layout(conn: sqlite3.Connection) -> None:
    """Number the sessions, renumber ``messages.mid``, rebuild the search index.

    ``messages`` is rebuilt (rename, create with the unchanged DDL, copy in new
    mid order, drop) instead of updated in place: an in-place update of the
    INTEGER PRIMARY KEY could collide with not-yet-renumbered rows, and a copy
    in key order writes the table once, sequentially. Rows of sessions that no
    longer exist (foreign key violations) have no ordinal and are dropped; the
    index is derived from the transcripts anyway.
    """
    too_long = conn.execute(
        "SELECT session_id, seq FROM messages WHERE seq NOT BETWEEN 1 AND ? LIMIT 1", (MAX_SEQ,)
    ).fetchone()
    if too_long is not None:
        raise MigrationFailed(
            f"session {too_long[0]} has a message at seq {too_long[1]}; v22 supports 1..{MAX_SEQ}"
        )
    for trigger in ("messages_ai", "messages_ad", "messages_au"):
        conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    conn.execute("DROP TABLE IF EXISTS messages_fts")
    conn.execute(V22_SESSIONS[0])  # ALTER TABLE sessions ADD COLUMN ordinal
    conn.execute(
        "UPDATE sessions SET ordinal = o.n FROM (SELECT id, row_number() OVER "
        "(ORDER BY created_at, id) AS n FROM sessions) AS o WHERE o.id = sessions.id"
    )
    for statement in V22_SESSIONS[1:]:
        conn.execute(statement)
    messages_sql = next(s for s in DDL if s.startswith("CREATE TABLE messages ("))
    columns = [row[1] for row in conn.execute("PRAGMA table_info(messages)")]
    conn.execute("DROP INDEX IF EXISTS idx_messages_turn")
    conn.execute("ALTER TABLE messages RENAME TO messages_v21")
    conn.execute(messages_sql)
    rest = ", ".join(f"m.{c}" for c in columns if c != "mid")
    conn.execute(
        f"INSERT INTO messages(mid, {', '.join(c for c in columns if c != 'mid')}) "
        f"SELECT (s.ordinal << {MID_SEQ_BITS}) + m.seq AS new_mid, {rest} "
        "FROM messages_v21 AS m JOIN sessions AS s ON s.id = m.session_id ORDER BY new_mid"
    )
    conn.execute("DROP TABLE messages_v21")
    conn.execute(next(s for s in DDL if s.startswith("CREATE INDEX idx_messages_turn")))
    conn.execute(V22_MESSAGES_FTS)
    conn.execute(
        f"INSERT INTO messages_fts(rowid, text) SELECT m.mid, m.text FROM messages AS m "
        f"WHERE {searchable_sql('m')} ORDER BY m.mid"
    )
    conn.execute(V22_SEARCH_HAZARD)
    conn.execute(
        f"INSERT INTO search_hazard(mid) SELECT m.mid FROM messages AS m "
        f"WHERE {searchable_sql('m')} AND {hazard_sql('m')}"
    )
    for statement in V22_MESSAGE_TRIGGERS:
        conn.execute(statement)


def _v23_created_index(conn: sqlite3.Connection) -> None:
    for statement in V23_ADDITIONS:
        conn.execute(statement)


STEPS: tuple[MigrationStep, ...] = (
    MigrationStep(
        to_version=21,
        description="add boot_reports and idx_messages_turn",
        destructive=False,
        apply=_v21_boot_reports,
    ),
    MigrationStep(
        to_version=22,
        description="search layout: session ordinals, session-ordered mids, searchable-only FTS",
        destructive=True,
        apply=_v22_search_layout,
    ),
    MigrationStep(
        to_version=23,
        description="index messages by created_at (newest-first message search)",
        destructive=False,
        apply=_v23_created_index,
    ),
)
"""The production chain, ordered by ``to_version`` (immutable on purpose)."""


def ddl_for_version(version: int) -> tuple[str, ...]:
    """The DDL of a layout this build knows exactly (20, 21, 22 and ``SCHEMA_VERSION``)."""
    known = {20: DDL_V20, 21: DDL_V21, 22: DDL_V22, SCHEMA_VERSION: DDL}
    if version not in known:
        raise ValueError(f"no DDL kept for schema version {version} (known: {', '.join(map(str, known))})")
    return known[version]


class OpenAction(Enum):
    FRESH = "fresh"
    CURRENT = "current"
    UPGRADE = "upgrade"
    RESET = "reset"
    TOO_NEW = "too_new"


def classify(user_version: int, has_schema: bool) -> OpenAction:
    """Decide what opening a database with this version means (pure)."""
    if user_version > SCHEMA_VERSION:
        return OpenAction.TOO_NEW
    if user_version == SCHEMA_VERSION:
        return OpenAction.CURRENT
    if user_version >= FIRST_MIGRATABLE_VERSION:
        return OpenAction.UPGRADE
    if user_version == 0 and not has_schema:
        return OpenAction.FRESH
    return OpenAction.RESET


def archive_name(db_name: str, user_version: int) -> str:
    """``pi.sqlite.v6.bak`` for versions 1–6, ``pi.sqlite.v<n>.bak`` otherwise."""
    shown = LAST_PRE_V7_VERSION if 1 <= user_version <= LAST_PRE_V7_VERSION else user_version
    return f"{db_name}.v{shown}.bak"


def schema_too_new(db_path: Path, found: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"{db_path} has schema version {found}, newer than the version this build "
        f"supports ({SCHEMA_VERSION}); refusing to open it, the file is left untouched",
        data={"found": found, "supported": SCHEMA_VERSION, "path": str(db_path)},
    )


# --- file helpers (shared with store.database's quarantine) -------------------


def free_path(base: Path, now_ms: int) -> Path:
    """``base`` if neither it nor its sidecars exist, else a ``.<now_ms>`` variant."""
    candidate = base
    attempt = 0
    while any(Path(f"{candidate}{s}").exists() for s in ("", *SIDECAR_SUFFIXES)):
        attempt += 1
        suffix = f".{now_ms}" if attempt == 1 else f".{now_ms}-{attempt}"
        candidate = base.with_name(base.name + suffix)
    return candidate


def _rename(src: Path, dst: Path) -> None:
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dst)
        fd = os.open(dst, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(src)


def move_db_family(src: Path, dst: Path, *, keep_empty_sidecars: bool) -> list[Path]:
    """Move a database file and its sidecars to ``dst`` (+ same suffixes).

    Sidecars (``-wal``, ``-journal``) move FIRST: a database file must never
    be left next to a journal that belongs to another database (the journal of
    an archived file, replayed into a fresh one, would corrupt it). ``-shm``
    is derived state; it moves last (or is deleted with the empty sidecars).
    Both directories are fsynced. Returns the paths that now exist at ``dst``.
    """
    moved: list[Path] = []
    try:
        for suffix in ("-wal", "-journal", "", "-shm"):
            source = Path(f"{src}{suffix}")
            if not source.exists():
                continue
            if suffix and not keep_empty_sidecars and (
                suffix == "-shm" or source.stat().st_size == 0
            ):
                source.unlink()
                continue
            target = Path(f"{dst}{suffix}")
            _rename(source, target)
            moved.append(target)
        fsync_dir(src.parent)
        if dst.parent != src.parent:
            fsync_dir(dst.parent)
    except OSError as exc:
        raise classify_os_error(exc, f"moving {src} to {dst}") from exc
    return moved


# --- reset (seed D119) --------------------------------------------------------


def reset_database(
    db_path: Path, user_version: int, *, now_ms: int, faults: Faults = NO_FAULTS
) -> Path:
    """Archive a database this build cannot migrate; return the archive path.

    The file is WAL-checkpointed first (so the archive is one self-contained
    file), then renamed to ``<db>.v6.bak`` / ``<db>.v<n>.bak``; empty stale
    ``-wal``/``-shm`` siblings are removed. No connection may be open on it.
    The caller then creates a fresh database at ``db_path``.
    """
    db_path = Path(db_path)
    archive = free_path(db_path.with_name(archive_name(db_path.name, user_version)), now_ms)
    try:
        conn = sqlite3.connect(db_path, isolation_level=None)
    except sqlite3.Error as exc:
        raise IOFailure(f"cannot open {db_path} to archive it: {exc}") from exc
    try:
        # The first read also rolls back a hot rollback journal, if any.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        # Not fatal: the -wal then moves with the file and stays its pair.
        pass
    finally:
        conn.close()
    move_db_family(db_path, archive, keep_empty_sidecars=False)
    faults.point("db.reset.after_archive")
    return archive


# --- the step chain -----------------------------------------------------------


@dataclass
class MigrationResult:
    from_version: int
    to_version: int
    created_fresh: bool = False
    applied: list[int] = field(default_factory=list)
    backups: list[Path] = field(default_factory=list)


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _has_schema(conn: sqlite3.Connection) -> bool:
    return int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]) > 0


def plan_steps(current: int, steps: Sequence[MigrationStep]) -> list[MigrationStep]:
    """The contiguous steps from ``current`` to ``SCHEMA_VERSION`` (or MigrationFailed)."""
    by_version: dict[int, MigrationStep] = {}
    for step in steps:
        if step.to_version in by_version:
            raise MigrationFailed(f"two migration steps lead to version {step.to_version}")
        by_version[step.to_version] = step
    chain: list[MigrationStep] = []
    for version in range(current + 1, SCHEMA_VERSION + 1):
        found = by_version.get(version)
        if found is None:
            raise MigrationFailed(
                f"no migration step from schema version {version - 1} to {version} "
                f"(database is at {current}, this build needs {SCHEMA_VERSION})",
                data={"found": current, "supported": SCHEMA_VERSION},
            )
        chain.append(found)
    return chain


def backup_database(
    conn: sqlite3.Connection, db_path: Path, version: int, *, now_ms: int
) -> Path:
    """WAL-checkpoint, then write an exact, verified copy to ``<db>.v<version>.bak``.

    The copy is made with the SQLite online backup API (page for page), turned
    into a self-contained rollback-journal file, fsynced, verified (opens, same
    ``user_version``, ``quick_check`` ok) and only then renamed into place.
    """
    db_path = Path(db_path)
    busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    if busy:
        raise MigrationFailed(f"cannot checkpoint {db_path} before backup: database busy")
    target = free_path(db_path.with_name(f"{db_path.name}.v{version}.bak"), now_ms)
    tmp = target.with_name(f"{target.name}.tmp-{now_ms}")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise classify_os_error(exc, f"creating backup {tmp}") from exc
    try:
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            conn.backup(dst)
            dst.execute("PRAGMA journal_mode = DELETE").fetchone()
        finally:
            dst.close()
        _verify_backup(tmp, version)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, target)
        fsync_dir(target.parent)
    except BaseException as exc:
        for leftover in (tmp, Path(f"{tmp}-journal")):
            leftover.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise classify_os_error(exc, f"writing backup {target}") from exc
        if isinstance(exc, sqlite3.Error):
            raise MigrationFailed(f"backup of {db_path} to {target} failed: {exc}") from exc
        raise
    return target


def _remove_stale_backup_temps(db_path: Path) -> None:
    """Drop half-written backups a crash left behind (never a finished ``.bak``)."""
    for stale in db_path.parent.glob(f"{db_path.name}.v*.bak*.tmp-*"):
        stale.unlink(missing_ok=True)


def _verify_backup(path: Path, version: int) -> None:
    check = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        found = _user_version(check)
        result = check.execute("PRAGMA quick_check").fetchall()
    finally:
        check.close()
    if found != version or result != [("ok",)]:
        raise MigrationFailed(
            f"backup {path} failed verification (user_version {found}, expected "
            f"{version}; quick_check {result[:3]!r})"
        )


def _run_step(
    conn: sqlite3.Connection, step: MigrationStep, from_version: int, faults: Faults
) -> None:
    fk_was_on = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    if step.destructive and fk_was_on:
        conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            step.apply(conn)
            if not conn.in_transaction:
                raise MigrationFailed("the step ended its transaction itself")
            if step.destructive:
                violations = conn.execute("PRAGMA foreign_key_check").fetchmany(5)
                if violations:
                    raise MigrationFailed(f"foreign key violations after step: {violations!r}")
            faults.point("migrate.before_commit")
            conn.execute(f"PRAGMA user_version = {int(step.to_version)}")
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, Exception):
                raise MigrationFailed(
                    f"migration v{from_version}→v{step.to_version} ({step.description}) "
                    f"failed and was rolled back; schema v{from_version} stays "
                    f"authoritative: {exc}",
                    data={"from": from_version, "to": step.to_version},
                ) from exc
            raise
    finally:
        if step.destructive and fk_was_on:
            conn.execute("PRAGMA foreign_keys = ON")


def migrate(
    conn: sqlite3.Connection,
    db_path: Path,
    steps: Sequence[MigrationStep] = STEPS,
    *,
    now_ms: int,
    faults: Faults = NO_FAULTS,
) -> MigrationResult:
    """Bring the writer connection's database to ``SCHEMA_VERSION``.

    ``conn`` is the writer (``isolation_level=None``, PRAGMAs applied). Fresh
    databases get the full DDL in one transaction; older migratable ones walk
    ``steps``; each step commits its own ``user_version``, so a failure leaves
    the database at the last committed version. Versions that need a reset
    raise :class:`MigrationFailed` (run :func:`reset_database` first); newer
    ones raise :class:`SchemaTooNew` without writing anything.
    """
    db_path = Path(db_path)
    current = _user_version(conn)
    action = classify(current, _has_schema(conn))
    result = MigrationResult(from_version=current, to_version=current)
    if action is OpenAction.TOO_NEW:
        raise schema_too_new(db_path, current)
    if action is OpenAction.CURRENT:
        return result
    if action is OpenAction.RESET:
        raise MigrationFailed(
            f"{db_path} has schema version {current}, which cannot be migrated; "
            f"it must be archived as {archive_name(db_path.name, current)} first",
            data={"found": current, "supported": SCHEMA_VERSION},
        )
    if action is OpenAction.FRESH:
        faults.point("migrate.before_fresh_schema")
        apply_schema(conn)
        result.to_version = SCHEMA_VERSION
        result.created_fresh = True
        return result
    chain = plan_steps(current, steps)
    _remove_stale_backup_temps(db_path)
    for step in chain:
        if step.destructive:
            result.backups.append(backup_database(conn, db_path, current, now_ms=now_ms))
            faults.point("migrate.after_backup")
        _run_step(conn, step, current, faults)
        current = step.to_version
        result.applied.append(current)
        result.to_version = current
    return result
