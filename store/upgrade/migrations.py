"""The migration chain, keyed by ``PRAGMA user_version`` (seed 003 §7).

What happens to a database depends only on its ``user_version`` (see
:func:`classify`; docs/DESIGN.md "Schema versions" maps every number to its
layout):

* 0 and no schema objects  → fresh install: the full DDL at ``SCHEMA_VERSION``.
* 1–6                      → seed D119 breaking reset: archived as ``<db>.v6.bak``.
* 0 with foreign schema objects → the same reset, archived as ``<db>.v0.bak``.
* 7–11, 14–19 (the seed's layouts) and 20 … SCHEMA_VERSION-1 (ours)
                           → walked in place, one step per transaction:
                             the seed's 7→8, 8/9/10→11 (guarded), 11→14,
                             14→15, 15→16, 16→17, 17→18 (queue priority),
                             18→19 (``omit`` thinking level), then ours
                             19→20 (the seed layout becomes ours), 20→21,
                             21→22, 22→23, 23→24, 24→25.
                             Every step marked ``backup`` first checkpoints
                             the WAL and writes an exact, verified
                             ``<db>.v<from>.bak``.
* 12, 13                   → numbers no release wrote: :class:`SchemaUnknown`,
                             file untouched.
* SCHEMA_VERSION           → plain open.
* > SCHEMA_VERSION         → :class:`~store.errors.SchemaTooNew`; file untouched.

Fault points (``store.faults``): ``migrate.<from>_<to>.after_backup``,
``.before_commit`` and ``.after_commit`` for every step, plus the generic
``migrate.after_backup`` / ``migrate.before_commit``.

The reset is a file operation (the old file is renamed, not rewritten), so it
happens before the writer connection opens (:func:`reset_database`);
:func:`migrate` runs on the writer connection for everything else.

An archive or backup never overwrites an older one: when ``<db>.v6.bak`` is
taken, the new one is ``<db>.v6.bak.<now_ms>``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Final

from store.errors import IOFailure, SchemaTooNew, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import fsync_dir, owner_only
from store.upgrade.attachment_adopt import mark_pending
from store.upgrade.schema import (
    DDL,
    DDL_V20,
    DDL_V21,
    DDL_V22,
    DDL_V23,
    DDL_V24,
    DDL_V25,
    DDL_V26,
    DDL_V27,
    DDL_V28,
    DDL_V29,
    DDL_V30,
    DDL_V31,
    MAX_SEQ,
    MID_SEQ_BITS,
    SCHEMA_VERSION,
    V21_ADDITIONS,
    V22_MESSAGE_TRIGGERS,
    V22_MESSAGES_FTS,
    V22_SEARCH_HAZARD,
    V22_SESSIONS,
    V23_ADDITIONS,
    V24_ADDITIONS,
    V25_ADDITIONS,
    V26_ADDITIONS,
    V27_ADDITIONS,
    V28_TOOL_SEARCH,
    V29_KNOWN_SESSIONS,
    V30_QUEUE_LEASES,
    V31_LEASE_CLIENT,
    V32_WINDOW_INDEX,
    apply_schema,
    hazard_sql,
    searchable_sql,
)
from store.upgrade.schema_rebuild import converge
from store.upgrade.seed_migrations import (
    current_platform,
    guarded_step,
    plan_guarded,
    step_7_to_8,
    step_11_to_14,
    step_14_to_15,
    step_15_to_16,
    step_16_to_17,
    step_17_to_18,
    step_18_to_19,
)
from store.upgrade.seed_schemas import LAST_SEED_VERSION, SEED_GAPS, SEED_VERSIONS

FIRST_MIGRATABLE_VERSION = 20
"""The oldest ``user_version`` the step chain upgrades in place."""

LAST_PRE_V7_VERSION = 6
"""Versions 1..6 are archived under the seed's fixed name ``<db>.v6.bak``."""

SIDECAR_SUFFIXES = ("-wal", "-journal", "-shm")


class MigrationFailed(StoreError):
    """A migration step failed; it was rolled back and the old schema is authoritative."""

    code = "MIGRATION_FAILED"


class SchemaUnknown(StoreError):
    """A ``user_version`` no release ever wrote (12, 13): refused, file untouched."""

    code = "SCHEMA_UNKNOWN"


@dataclass(frozen=True)
class MigrationStep:
    """One structural change from ``from_versions`` (default ``to_version - 1``) to ``to_version``.

    ``apply`` runs inside the step's transaction and must neither commit nor
    roll back. ``destructive`` steps (anything that drops, rebuilds or rewrites
    existing rows) run with foreign key enforcement off (table rebuilds) plus a
    ``foreign_key_check`` before commit. A step with ``backup`` (default: when
    destructive) gets a WAL checkpoint and an exact backup of its starting
    version first. ``verify`` adds a ``quick_check`` and ``foreign_key_check``
    before the commit. ``preflight`` is a read-only check the engine runs
    before the chain's first write, so that a refusal leaves the file as it was.
    """

    to_version: int
    description: str
    destructive: bool
    apply: Callable[[sqlite3.Connection], None]
    from_versions: tuple[int, ...] = ()
    backup: bool | None = None
    verify: bool = False
    preflight: Callable[[sqlite3.Connection], None] | None = None

    @property
    def sources(self) -> tuple[int, ...]:
        return self.from_versions or (self.to_version - 1,)

    @property
    def takes_backup(self) -> bool:
        return self.destructive if self.backup is None else self.backup


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


def _v24_user_requests(conn: sqlite3.Connection) -> None:
    for statement in V24_ADDITIONS:
        conn.execute(statement)


def _v25_wire_columns(conn: sqlite3.Connection) -> None:
    for statement in V25_ADDITIONS:
        conn.execute(statement)


def _v26_attachment_metadata(conn: sqlite3.Connection) -> None:
    for statement in V26_ADDITIONS:
        conn.execute(statement)
    # rows marked by an older build's eviction are mid-eviction: the next GC finishes them
    conn.execute("UPDATE attachment_blobs SET deletion_state = 'evicting' WHERE marked_for_eviction = 1")


def _v27_thread_meta(conn: sqlite3.Connection) -> None:
    for statement in V27_ADDITIONS:
        conn.execute(statement)


def _v28_tool_search(conn: sqlite3.Connection) -> None:
    """Tool output search: its table, index and triggers. Tool rows indexed before
    hold no output row: each session with tool rows is reindexed from its
    transcript at the next boot (``indexed_len = 0`` asks for the full pass),
    which fills ``tool_output`` for them."""
    for statement in V28_TOOL_SEARCH:
        conn.execute(statement)
    conn.execute(
        "UPDATE sessions SET indexed_len = 0 WHERE id IN (SELECT session_id FROM messages WHERE role = 'tool')"
    )


def _v29_known_sessions(conn: sqlite3.Connection) -> None:
    """Every session there is becomes known (a session deleted before this build left no record:
    an append to it stays refused unless other traces name it, ``store/orphans.py``)."""
    for statement in V29_KNOWN_SESSIONS:
        conn.execute(statement)
    conn.execute("INSERT INTO known_sessions(id, created_at) SELECT id, created_at FROM sessions")


def _v30_queue_leases(conn: sqlite3.Connection) -> None:
    """Every entry there is waits (an entry handed out before this build is already gone)."""
    for statement in V30_QUEUE_LEASES:
        conn.execute(statement)


def _v31_lease_client(conn: sqlite3.Connection) -> None:
    """Entries handed out before this step keep no taker (any client's turn may carry them, as before)."""
    for statement in V31_LEASE_CLIENT:
        conn.execute(statement)


def _v32_window_index(conn: sqlite3.Connection) -> None:
    """Built from the rows there are (one pass over ``messages``; nothing else changes)."""
    for statement in V32_WINDOW_INDEX:
        conn.execute(statement)


def _v20_from_seed(conn: sqlite3.Connection) -> None:
    """Seed v19 → our v20: every table to its v20 definition, every row kept.

    Tables whose definition differs (``sessions`` gains ``indexed_len`` /
    ``file_epoch``, ``messages`` its transcript offsets and ``deleted`` flag,
    ``turn_queue`` its column order) are rebuilt; our additions
    (``compactions``, ``command_receipts``, ``run_snapshots``,
    ``attachment_blobs``/``_refs``) are created; tables we do not know are
    left alone. The new offsets start empty (``indexed_len = 0``), so the
    first boot reindexes every session from its transcript; the seed's
    ``attachments/`` files have no rows yet, so the step asks boot to adopt
    them (``store.upgrade.attachment_adopt``).
    """
    converge(conn, DDL_V20)
    mark_pending(conn)


SEED_BRIDGE = MigrationStep(
    to_version=20,
    description="seed v19 layout → host v20 (tables rebuilt to their v20 definition, our tables added)",
    destructive=True,
    apply=_v20_from_seed,
    from_versions=(LAST_SEED_VERSION,),
    verify=True,
)
"""Where the seed's history (… 19) joins ours (20 …)."""

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
    MigrationStep(
        to_version=24,
        description="approvals, interactions, permission rules; plan execution lifecycle; turn cost and retry lineage",
        destructive=False,
        apply=_v24_user_requests,
    ),
    MigrationStep(
        to_version=25,
        description="messages.wire_cut and line_crc (window replies reuse the lines' bytes)",
        destructive=False,
        apply=_v25_wire_columns,
    ),
    MigrationStep(
        to_version=26,
        description="attachment metadata (kind, trust, provenance, source, run, page/image), deletion state, "
                    "reference origin and eviction marks",
        destructive=False,
        apply=_v26_attachment_metadata,
    ),
    MigrationStep(
        to_version=27,
        description="thread metadata (tags, folder, preset, archive flag, parent thread, origins)",
        destructive=False,
        apply=_v27_thread_meta,
    ),
    MigrationStep(
        to_version=28,
        description="tool output search: tool_output and its own trigram index (sessions with tool rows "
                    "reindexed at the next boot)",
        destructive=False,
        apply=_v28_tool_search,
    ),
    MigrationStep(
        to_version=29,
        description="known sessions: every session id created, and whether the user deleted it",
        destructive=False,
        apply=_v29_known_sessions,
    ),
    MigrationStep(
        to_version=30,
        description="turn queue leases: a handed-out entry stays until its turn ran",
        destructive=False,
        apply=_v30_queue_leases,
    ),
    MigrationStep(
        to_version=31,
        description="queue lease clients: only a client an entry was handed to starts a turn with it",
        destructive=False,
        apply=_v31_lease_client,
    ),
    MigrationStep(
        to_version=32,
        description="a covering index for window reads (a page of a session from the index alone)",
        destructive=False,
        apply=_v32_window_index,
    ),
)
"""This host's own steps, 20 → 21 → … → 32 (immutable on purpose)."""


def seed_steps(platform: str | None = None) -> tuple[MigrationStep, ...]:
    """The seed's chain (§7) for a platform (the guarded step checks the shell catalog of it)."""
    where = platform or current_platform()

    def guarded(conn: sqlite3.Connection) -> None:
        guarded_step(conn, where)

    def guarded_preflight(conn: sqlite3.Connection) -> None:
        plan_guarded(conn, where)

    return (
        MigrationStep(8, "seed v7 → v8: the first plan_approvals table", False, step_7_to_8, backup=True,
                      verify=True),
        MigrationStep(11, "seed guarded v8→v11: chat → plan, settings/tasks/shell validated, plan_approvals "
                      "artifact, execution and kind fields", True, guarded,
                      from_versions=(8, 9, 10), verify=True, preflight=guarded_preflight),
        MigrationStep(14, "seed v11 → v14: sessions.deleted_at, session_import_origins", False, step_11_to_14,
                      from_versions=(11,), backup=True, verify=True),
        MigrationStep(15, "seed v14 → v15: turn_queue", False, step_14_to_15, backup=True, verify=True),
        MigrationStep(16, "seed v15 → v16: collaboration ledger, turn_queue.session_message_id", False,
                      step_15_to_16, backup=True, verify=True),
        MigrationStep(17, "seed v16 → v17: providers.owner_plugin_id", False, step_16_to_17, backup=True,
                      verify=True),
        MigrationStep(18, "seed v17 → v18: turn_queue.priority", False, step_17_to_18, backup=True, verify=True),
        MigrationStep(19, "seed v18 → v19: thinking level omit", True, step_18_to_19, backup=True, verify=True),
    )


def chain_steps(platform: str | None = None) -> tuple[MigrationStep, ...]:
    """Every step this build knows: the seed's, the bridge, then ours."""
    return (*seed_steps(platform), SEED_BRIDGE, *STEPS)


def ddl_for_version(version: int) -> tuple[str, ...]:
    """The DDL of a layout this build knows exactly (20 … 31 and ``SCHEMA_VERSION``)."""
    known = {20: DDL_V20, 21: DDL_V21, 22: DDL_V22, 23: DDL_V23, 24: DDL_V24, 25: DDL_V25, 26: DDL_V26, 27: DDL_V27,
             28: DDL_V28, 29: DDL_V29, 30: DDL_V30, 31: DDL_V31,
             SCHEMA_VERSION: DDL}
    if version not in known:
        raise ValueError(f"no DDL kept for schema version {version} (known: {', '.join(map(str, known))})")
    return known[version]


class OpenAction(Enum):
    FRESH = "fresh"
    CURRENT = "current"
    UPGRADE = "upgrade"
    RESET = "reset"
    TOO_NEW = "too_new"
    UNKNOWN = "unknown"


def classify(user_version: int, has_schema: bool) -> OpenAction:
    """Decide what opening a database with this version means (pure)."""
    if user_version > SCHEMA_VERSION:
        return OpenAction.TOO_NEW
    if user_version == SCHEMA_VERSION:
        return OpenAction.CURRENT
    if user_version >= FIRST_MIGRATABLE_VERSION or user_version in SEED_VERSIONS:
        return OpenAction.UPGRADE
    if user_version == 0 and not has_schema:
        return OpenAction.FRESH
    if user_version == 0 or 1 <= user_version <= LAST_PRE_V7_VERSION:
        return OpenAction.RESET
    return OpenAction.UNKNOWN


def archive_name(db_name: str, user_version: int) -> str:
    """``pi.sqlite.v6.bak`` for versions 1–6, ``pi.sqlite.v<n>.bak`` otherwise."""
    shown = LAST_PRE_V7_VERSION if 1 <= user_version <= LAST_PRE_V7_VERSION else user_version
    return f"{db_name}.v{shown}.bak"


def schema_unknown(db_path: Path, found: int) -> SchemaUnknown:
    seed = ", ".join(str(v) for v in SEED_VERSIONS)
    return SchemaUnknown(
        f"{db_path} has schema version {found}, which no pi-desktop release wrote (seed versions: {seed}; "
        f"this host's own: {FIRST_MIGRATABLE_VERSION}-{SCHEMA_VERSION}); refusing to open it, the file is "
        f"left untouched",
        data={"found": found, "supported": SCHEMA_VERSION, "path": str(db_path), "gaps": list(SEED_GAPS)},
    )


def schema_too_new(db_path: Path, found: int) -> SchemaTooNew:
    return SchemaTooNew(
        f"{db_path} has schema version {found}, newer than the version this build "
        f"supports ({SCHEMA_VERSION}); refusing to open it, the file is left untouched",
        data={"found": found, "supported": SCHEMA_VERSION, "path": str(db_path)},
    )


# --- file helpers (shared with store.indexing.database's quarantine) -------------------


def free_path(base: Path, now_ms: int) -> Path:
    """``base`` if neither it nor its sidecars exist, else a ``.<now_ms>`` variant."""
    candidate = base
    attempt = 0
    while any(Path(f"{candidate}{s}").exists() for s in ("", *SIDECAR_SUFFIXES)):
        attempt += 1
        suffix = f".{now_ms}" if attempt == 1 else f".{now_ms}-{attempt}"
        candidate = base.with_name(base.name + suffix)
    return candidate


def backups_of(db_path: Path, version: int) -> list[Path]:
    """The backups of version ``version`` next to ``db_path``: ``<db>.v<version>.bak`` and the
    ``.<ms>`` / ``.<ms>-<n>`` names :func:`free_path` gives the later ones."""
    base = f"{db_path.name}.v{version}.bak"
    pattern = re.compile(re.escape(base) + r"(\.\d+(-\d+)?)?")
    try:
        names = os.listdir(db_path.parent)
    except OSError:
        return []
    return sorted(db_path.with_name(n) for n in names if pattern.fullmatch(n))


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
    for moved in move_db_family(db_path, archive, keep_empty_sidecars=False):
        owner_only(moved)  # the user's old index, kept for recovery: owner-only like every file of the directory
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
    """The steps from ``current`` to ``SCHEMA_VERSION``, each starting where the last ended.

    Raises :class:`MigrationFailed` (before anything is written) when a
    version on the way has no step or two steps start from one version.
    """
    by_source: dict[int, MigrationStep] = {}
    for step in steps:
        for source in step.sources:
            if source in by_source:
                raise MigrationFailed(f"two migration steps start from version {source}")
            by_source[source] = step
    chain: list[MigrationStep] = []
    version = current
    while version < SCHEMA_VERSION:
        found = by_source.get(version)
        if found is None or found.to_version <= version:
            raise MigrationFailed(
                f"no migration step from schema version {version} to {version + 1} "
                f"(database is at {current}, this build needs {SCHEMA_VERSION})",
                data={"found": current, "supported": SCHEMA_VERSION},
            )
        chain.append(found)
        version = found.to_version
    return chain


def backup_database(
    conn: sqlite3.Connection, db_path: Path, version: int, *, now_ms: int, checkpoint: bool = True
) -> Path:
    """WAL-checkpoint, then write an exact, verified copy to ``<db>.v<version>.bak``.

    The copy is the checkpointed file byte for byte (read while ``conn`` holds
    a lock no writer gets past), but for the header's two file-format bytes
    (18–19) that say "WAL": they say rollback journal, so the backup is one
    self-contained file a read-only open does not grow ``-wal``/``-shm``
    siblings beside. It is fsynced, verified (opens read-only, same
    ``user_version``, ``quick_check`` ok) and only then renamed into place.
    ``checkpoint=False``: ``conn`` is a read-only connection to a file that has
    no WAL (nothing to checkpoint, and the source must not be written).
    """
    db_path = Path(db_path)
    if checkpoint:
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise MigrationFailed(f"cannot checkpoint {db_path} before backup: database busy")
    target = free_path(db_path.with_name(f"{db_path.name}.v{version}.bak"), now_ms)
    tmp = target.with_name(f"{target.name}.tmp-{now_ms}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise classify_os_error(exc, f"creating backup {tmp}") from exc
    try:
        try:
            _copy_locked(conn, db_path, fd, writer=checkpoint)
            os.fsync(fd)
        finally:
            os.close(fd)
        _verify_backup(tmp, version)
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


_COPY_CHUNK: Final = 1 << 20
_WAL_FORMAT: Final = b"\x02\x02"  # header bytes 18-19: file format write/read version 2 = WAL, 1 = rollback


def _copy_locked(conn: sqlite3.Connection, db_path: Path, fd: int, *, writer: bool) -> None:
    """Copy ``db_path``'s bytes to ``fd`` while ``conn`` holds the write lock (``writer``: the checkpointed
    writer, whose ``-wal`` must be empty) or a read lock (a rollback-journal file, read-only ``conn``)."""
    conn.execute("BEGIN IMMEDIATE" if writer else "BEGIN")
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the lock is taken on the first read
        wal = Path(f"{db_path}-wal")
        if writer and wal.exists() and wal.stat().st_size > 0:
            raise MigrationFailed(f"cannot back up {db_path}: its -wal still holds frames after the checkpoint")
        with open(db_path, "rb") as src:
            header = bytearray(src.read(100))
            if header[18:20] == _WAL_FORMAT:
                header[18:20] = b"\x01\x01"
            _write_all(fd, bytes(header))
            while chunk := src.read(_COPY_CHUNK):
                _write_all(fd, chunk)
    finally:
        conn.execute("ROLLBACK")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


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


def _step_name(from_version: int, step: MigrationStep) -> str:
    return f"migrate.{from_version}_{step.to_version}"


def _failure(step: MigrationStep, from_version: int, exc: BaseException, *, what: str,
             authoritative: int | None = None) -> MigrationFailed:
    data: dict[str, object] = {"from": from_version, "to": step.to_version}
    inner = getattr(exc, "data", None)
    if isinstance(inner, dict):
        data.update({k: v for k, v in inner.items() if k not in data})
    kept = from_version if authoritative is None else authoritative
    return MigrationFailed(
        f"migration v{from_version}→v{step.to_version} ({step.description}) {what}; "
        f"schema v{kept} stays authoritative: {exc}",
        data=data,
    )


def _verify(conn: sqlite3.Connection) -> None:
    problems = conn.execute("PRAGMA quick_check").fetchmany(5)
    if problems != [("ok",)]:
        raise MigrationFailed(f"quick_check after step: {problems!r}")


def _foreign_key_check(conn: sqlite3.Connection) -> None:
    violations = conn.execute("PRAGMA foreign_key_check").fetchmany(5)
    if violations:
        shown = ", ".join(f"{t} rowid {r} → {p}" for t, r, p, _fk in violations)
        raise MigrationFailed(f"foreign key violations after step: {shown}")


def _run_step(
    conn: sqlite3.Connection, step: MigrationStep, from_version: int, faults: Faults
) -> None:
    name = _step_name(from_version, step)
    fk_was_on = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    if step.destructive and fk_was_on:
        conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            step.apply(conn)
            if not conn.in_transaction:
                raise MigrationFailed("the step ended its transaction itself")
            if step.destructive or step.verify:
                _foreign_key_check(conn)
            if step.verify:
                _verify(conn)
            faults.point("migrate.before_commit")
            faults.point(f"{name}.before_commit")
            conn.execute(f"PRAGMA user_version = {int(step.to_version)}")
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, Exception):
                raise _failure(step, from_version, exc, what="failed and was rolled back") from exc
            raise
    finally:
        if step.destructive and fk_was_on:
            conn.execute("PRAGMA foreign_keys = ON")
    faults.point(f"{name}.after_commit")


def migrate(
    conn: sqlite3.Connection,
    db_path: Path,
    steps: Sequence[MigrationStep] | None = None,
    *,
    now_ms: int,
    faults: Faults = NO_FAULTS,
    platform: str | None = None,
) -> MigrationResult:
    """Bring the writer connection's database to ``SCHEMA_VERSION``.

    ``conn`` is the writer (``isolation_level=None``, PRAGMAs applied). Fresh
    databases get the full DDL in one transaction; older migratable ones walk
    ``steps`` (default: :func:`chain_steps` for ``platform``); each step
    commits its own ``user_version``, so a failure leaves the database at the
    last committed version, never between two. Every ``preflight`` of the
    chain runs after the first backup and before the first write, so an input
    the guarded step would refuse leaves the file exactly as it was. Versions
    that need a reset raise :class:`MigrationFailed` (run
    :func:`reset_database` first); newer ones raise :class:`SchemaTooNew`,
    unknown ones :class:`SchemaUnknown`, without writing anything.
    """
    db_path = Path(db_path)
    current = _user_version(conn)
    action = classify(current, _has_schema(conn))
    result = MigrationResult(from_version=current, to_version=current)
    if action is OpenAction.TOO_NEW:
        raise schema_too_new(db_path, current)
    if action is OpenAction.UNKNOWN:
        raise schema_unknown(db_path, current)
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
        apply_schema(conn, then=mark_made_anew)
        result.to_version = SCHEMA_VERSION
        result.created_fresh = True
        return result
    chain = plan_steps(current, chain_steps(platform) if steps is None else steps)
    _remove_stale_backup_temps(db_path)
    earlier = backups_of(db_path, current)
    for position, step in enumerate(chain):
        if step.takes_backup:
            result.backups.append(backup_database(conn, db_path, current, now_ms=now_ms))
            faults.point("migrate.after_backup")
            faults.point(f"{_step_name(current, step)}.after_backup")
        if position == 0:
            try:
                _preflight(conn, chain, current)
            except MigrationFailed:
                if earlier and result.backups:
                    # Refused before any change: the file is intact and a backup of this version is
                    # already there. A launcher retrying the start must not add a full copy per try.
                    result.backups.pop().unlink(missing_ok=True)
                raise
        _run_step(conn, step, current, faults)
        current = step.to_version
        result.applied.append(current)
        result.to_version = current
    return result


def refuse_before_writing(
    db_path: Path, *, now_ms: int, platform: str | None = None
) -> None:
    """Run the chain's preflights on a read-only connection, before the writer touches the file.

    For a database in rollback-journal mode: switching it to WAL (the writer's
    first PRAGMA) rewrites its header, so an input the guarded step refuses
    must be found before that, or the refused file would not be byte for byte
    what it was (seed §7 "fails closed ... pre-migration schema intact"). On a
    refusal the backup of the starting version is written from the read-only
    connection (as :func:`migrate` would have) and :class:`MigrationFailed`
    raised; the database file itself is never opened for writing.
    """
    db_path = Path(db_path)
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    try:
        current = _user_version(conn)
        if classify(current, _has_schema(conn)) is not OpenAction.UPGRADE:
            return
        chain = plan_steps(current, chain_steps(platform))
        try:
            _preflight(conn, chain, current)
        except MigrationFailed:
            if chain and chain[0].takes_backup and not backups_of(db_path, current):
                # the first refusal leaves a backup (as migrate would have); a retried start, refused
                # again with the file intact, does not add a full copy per try
                _remove_stale_backup_temps(db_path)
                backup_database(conn, db_path, current, now_ms=now_ms, checkpoint=False)
            raise
    finally:
        conn.close()


def preflight_refusal(conn: sqlite3.Connection, *, platform: str | None = None) -> MigrationFailed | None:
    """Why the next open would refuse to migrate ``conn``'s database, or None (reads only).

    The refusal :func:`migrate` and :func:`refuse_before_writing` would raise before the chain's first
    write (a malformed seed-era value the guarded step names, seed §7), for a database they would upgrade;
    None for any other version. ``pi-host doctor`` reports it instead of promising a migration.
    """
    current = _user_version(conn)
    if classify(current, _has_schema(conn)) is not OpenAction.UPGRADE:
        return None
    try:
        _preflight(conn, plan_steps(current, chain_steps(platform)), current)
    except MigrationFailed as exc:
        return exc
    return None


def _preflight(conn: sqlite3.Connection, chain: Sequence[MigrationStep], start: int) -> None:
    version = start
    for step in chain:
        if step.preflight is not None:
            try:
                step.preflight(conn)
            except Exception as exc:
                raise _failure(step, version, exc, what="refused before any change",
                               authoritative=start) from exc
        version = step.to_version


MADE_ANEW_KV: Final = ("pi-host", "indexMadeAnew")
"""Set in the transaction that creates a fresh schema; boot clears it once the steps owed to an index made anew
(project-id floor, blob adoption, a new cursor identity, the deleted log, secrets_meta) have run. A boot killed
in between finds it and runs them again: without it the next boot took the empty index for an ordinary one."""


def mark_made_anew(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT OR REPLACE INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, 'true', 0)", MADE_ANEW_KV)


def made_anew(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM kv WHERE ns = ? AND key = ?", MADE_ANEW_KV).fetchone() is not None


def clear_made_anew(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", MADE_ANEW_KV)
