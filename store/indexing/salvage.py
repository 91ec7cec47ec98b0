"""Salvage the DB-only rows of a quarantined index (RELIABILITY row 7; ARCHITECTURE "Durability").

An index found corrupt is quarantined and rebuilt from the transcripts (``runtime/boot.py``). What the
transcripts carry comes back that way; what only the database held (settings, providers, models,
permission rules, scheduled tasks, the turn queue, notifications, receipts of DB-only methods, the audit
log, ...) would be lost for good, although the damage seldom reaches it: most of the file is the FTS5
trigram index. :func:`salvage` opens the quarantined copy read-only (``immutable``: never written; a
non-empty ``-wal`` beside it is read through a private copy of the pair) and copies into the rebuilt
database, table by table, the rows that read back cleanly:

* a table whose b-tree fails midway keeps the rows read before the failure and those read back after it,
  found from the table's other end (``readError``);
* a row whose indexed value no longer matches its index entry (``inconsistent``: ``PRAGMA
  integrity_check(<table>)`` names it; a byte changed inside it, so some value of it is wrong) is skipped;
* rows a damaged page hides from every read (a lowered cell count; a pointer now naming another leaf or cell
  of the table, whose rows are then read twice, the second copy ``kept``) are counted as ``hidden``: the
  rowids a full index of the table names that no scan of it finds (``store.indexing.integrity``);
* a row with a text value that is not UTF-8 (``badText``) or a ``*_json`` value that does not parse
  (``badJson``) is skipped;
* a row whose foreign key names a row the rebuilt database does not have (a session the transcripts no
  longer hold, a provider, a task, a turn) is skipped when the schema would cascade (``orphans``) and has
  the reference cleared when the schema would set it NULL;
* a row whose key the rebuild already wrote keeps the rebuilt one (``INSERT OR IGNORE``: ``kept``), and one
  the rebuilt index refuses for another constraint is skipped (``rejected``); a turn the rebuild restored
  from the lines that name it (``store.turns.INDEX_LOST``: how it ended unknown) takes the salvaged row
  of that turn instead (counted ``copied``).

Projects are numbered anew by the rebuild (protocol/README.md §8.2: an old id names nothing): a salvaged
project takes the rebuilt row of its path (its ``pinned`` flag copied) or a new id, and every project
reference is mapped from the old id to that one. Nothing here is invented: only rows read back are
written. Synchronous, no trio: boot runs it in its worker thread.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from store import turns
from store.attachments import PENDING_GC_NS
from store.faults import NO_FAULTS, Faults
from store.indexing.group_commit import is_key_conflict
from store.indexing.index import PROJECT_IDS_KV, PROJECT_RESERVED_NS, issued_project_id, raise_project_id_floor
from store.indexing.integrity import TableDamage, table_damage
from store.queue import KV_NS as QUEUE_KV_NS
from store.revisions import SYNC_MARK_NS
from store.upgrade.attachment_adopt import PENDING_KEY as ADOPT_PENDING_KV
from store.upgrade.migrations import MADE_ANEW_KV
from store.upgrade.schema import SCHEMA_VERSION

log = logging.getLogger("pi_host")

# The tables copied, in this order (a parent before the rows that refer to it), and why each is DB-only.
SALVAGED: Final[tuple[tuple[str, str], ...]] = (
    ("projects", "a project without sessions, and every project's pin, live only here; rebuilt rows are "
                 "matched by path and the old ids mapped to the new ones"),
    ("kv", "settings, plugin storage, project memory, group records, queue ledgers: DB-only "
           "(the rebuild's own bookkeeping keys are left to it)"),
    ("providers", "provider configuration (its key's presence follows secrets_meta afterwards)"),
    ("models", "the model catalog of each provider"),
    ("scheduled_tasks", "scheduled tasks and their cadence"),
    ("task_runs", "the runs of each scheduled task"),
    ("turns", "a turn's status, usage and cost: transcripts carry messages, not turn rows"),
    ("run_snapshots", "the environment snapshot bound to each turn"),
    ("plan_approvals", "plan and goal approvals and their execution state"),
    ("approvals", "tool permission requests and their answers"),
    ("interactions", "ask-the-user questions and their answers"),
    ("permission_rules", "what the user chose to always allow or deny"),
    ("turn_queue", "the durable turn queue: a user's queued prompts"),
    ("session_collaboration_messages", "the collaboration ledger between sessions"),
    ("notifications", "task notifications and their read state"),
    ("attachment_blobs", "a blob's row comes back from its file and its metadata file (adopted at boot); what "
                         "those do not hold (a blob stored before metadata files were written: its seed 000 §2.3 "
                         "metadata and when it was first stored) is taken from here"),
    ("command_receipts", "receipts of DB-only methods; a receipt a file carries is restored by the rebuild "
                         "and wins, an append's is never copied (its line is the receipt)"),
    ("audit_log", "the audit log, but for tool_execute rows, which the rebuild derives from tool results"),
)

# Tables never salvaged: the rebuild derives them from the files, which are the source of truth.
DERIVED: Final[Mapping[str, str]] = {
    "sessions": "from each transcript's header and session_info lines (no DB-only column is written)",
    "messages": "from the transcripts",
    "messages_fts": "from the messages (its shadow tables too)",
    "search_hazard": "from the messages",
    "tool_output": "from the tool results in the transcripts",
    "tool_fts": "from tool_output",
    "compactions": "from the compaction lines",
    "message_revisions": "from the .revisions.jsonl files",
    "session_import_origins": "from session_info importOrigin",
    "thread_meta": "from session_info thread",
    "known_sessions": "from the sessions and deleted-sessions.log",
    "artifacts": "from Write/Edit tool results",
    "attachment_refs": "from the references in session files",
    "secrets_meta": "from the secrets/*.sec headers",
    "boot_reports": "the lost index's own boot history; the in-flight sweep must cover all time after a loss",
    "session_collaboration_links": "no release writes it",
}

SALVAGE_FROM_VERSION: Final = 31
"""The oldest layout whose salvaged tables are this build's, column for column (v32 added only an index).
An index found corrupt at the first start of a newer build is quarantined before it is migrated, so it is
still of the older layout. Raise this to the new version whenever a migration step changes a table in
:data:`SALVAGED` (tests/integrity/test_index_salvage.py compares them)."""

PENDING_KV: Final = ("pi-host", "salvageQuarantinedIndex")
"""Set by the boot that rebuilt the index (its first transaction), cleared when the salvage ran: a boot
killed before or during the salvage leaves it, and the next boot salvages then (every copy is idempotent)."""

_SKIPPED_KV: Final[frozenset[tuple[str, str]]] = frozenset({
    PENDING_KV,
    ("index", "identity"),  # search cursors of the lost index must not resolve here
    PROJECT_IDS_KV,  # raised by the rebuild above every id the lost database can have issued
    ADOPT_PENDING_KV,
    MADE_ANEW_KV,  # the lost index's own unfinished start, not this one's
})
# PROJECT_RESERVED_NS: ids the lost database issued, below the rebuild's mark (PROJECT_IDS_KV); SYNC_MARK_NS:
# what the lost database's branch rows were synced against (the rebuilt rows have not been: sync in full)
_SKIPPED_KV_NS: Final[frozenset[str]] = frozenset({PENDING_GC_NS, PROJECT_RESERVED_NS, SYNC_MARK_NS})
_JSON_COLUMNS_EXTRA: Final[frozenset[str]] = frozenset({"lease_client"})
# What a blob's file does not hold: filled in where the adopted row lacks it (the first writer's values stay)
_BLOB_META: Final = ("mime_type", "kind", "trust", "provenance", "source", "run_id", "meta_json")
_CURRENT_PROJECT: Final = ("app", "currentProjectId")
# An append's receipt rides in its line: the rebuild restores every one whose message a file holds, and
# one whose message is in no file must let a retry write it (as ``pi-host doctor --repair`` leaves it).
_REBUILT_RECEIPTS: Final[frozenset[str]] = frozenset({"session.appendMessage"})


class _BadRow(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class SalvageReport:
    source: str
    copied: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    relinked_messages: int = 0
    projects_mapped: int = 0
    skipped_reason: str | None = None

    def skip(self, table: str, why: str, n: int = 1) -> None:
        counts = self.skipped.setdefault(table, {})
        counts[why] = counts.get(why, 0) + n

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"source": self.source, "copied": dict(self.copied),
                               "skipped": {t: dict(c) for t, c in self.skipped.items()}}
        if self.errors:
            out["errors"] = dict(self.errors)
        if self.relinked_messages:
            out["relinkedMessages"] = self.relinked_messages
        if self.projects_mapped:
            out["projectsMapped"] = self.projects_mapped
        if self.skipped_reason:
            out["notSalvaged"] = self.skipped_reason
        return out


def mark_pending(conn: sqlite3.Connection, source: Path, now_ms: int) -> None:
    """Remember that ``source`` is to be salvaged into this (rebuilt) index (inside the caller's transaction)."""
    conn.execute("INSERT OR REPLACE INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, ?)",
                 (*PENDING_KV, orjson.dumps({"source": str(source)}).decode(), now_ms))


def pending_source(conn: sqlite3.Connection) -> Path | None:
    """The quarantined file a salvage is owed from, if any."""
    row = conn.execute("SELECT value_json FROM kv WHERE ns = ? AND key = ?", PENDING_KV).fetchone()
    if row is None:
        return None
    try:
        source = orjson.loads(row[0]).get("source")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return Path(source) if isinstance(source, str) else None


def clear_pending(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM kv WHERE ns = ? AND key = ?", PENDING_KV)


def quarantined_main_file(quarantined: list[Path]) -> Path | None:
    """The database file among a quarantine's moved paths (not a ``-wal``/``-journal``/``-shm``)."""
    for path in quarantined:
        if not path.name.endswith(("-wal", "-journal", "-shm")):
            return path
    return None


@contextmanager
def _open_source(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the quarantined file that never writes it: ``immutable`` when there is no
    committed WAL beside it, else over a private copy of the pair (reading a WAL may write its ``-shm``)."""
    wal = Path(f"{path}-wal")
    scratch: Path | None = None
    try:
        if wal.exists() and wal.stat().st_size > 0:
            scratch = Path(tempfile.mkdtemp(prefix=".salvage-", dir=path.parent))
            copy = scratch / "pi.sqlite"
            shutil.copyfile(path, copy)
            shutil.copyfile(wal, f"{copy}-wal")
            uri = f"{copy.as_uri()}?mode=ro"
        else:
            uri = f"{path.as_uri()}?mode=ro&immutable=1"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            conn.text_factory = bytes
            conn.execute("PRAGMA query_only = ON")
            # one CREATE statement damaged so that it no longer parses makes SQLite refuse the whole schema
            # ("malformed database schema"); with writable_schema the broken entry is left out instead and
            # only its table is lost (nothing can be written: read-only, query_only)
            conn.execute("PRAGMA writable_schema = ON")
            yield conn
        finally:
            conn.close()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _mark(value: Any) -> str:
    """A parameter for a key read back (``text_factory=bytes``): a text key is bound as text, not as a blob."""
    return "CAST(? AS TEXT)" if isinstance(value, bytes) else "?"


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The table's column names; empty when its CREATE statement is damaged so that a name is not UTF-8
    (its rows cannot be matched to the rebuilt table's columns: the table is not readable)."""
    names = (r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
    try:
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    except UnicodeDecodeError:
        return []


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise _BadRow("badText") from None
    return value


@dataclass(frozen=True)
class _ForeignKey:
    column: str
    parent: str
    parent_column: str
    set_null: bool


def _foreign_keys(conn: sqlite3.Connection, table: str) -> list[_ForeignKey]:
    out = []
    for row in conn.execute(f"PRAGMA foreign_key_list({table})"):
        parent, column, parent_column, on_delete = str(row[2]), str(row[3]), row[4], str(row[6])
        if parent_column is None:
            parent_column = "id"
        out.append(_ForeignKey(column, parent, str(parent_column), on_delete.upper() == "SET NULL"))
    return out


class _Salvager:
    def __init__(self, src: sqlite3.Connection, dst: sqlite3.Connection, report: SalvageReport, now_ms: int) -> None:
        self.src = src
        self.dst = dst
        self.report = report
        self.now_ms = now_ms
        self.project_map: dict[int, int] = {}

    def _exists(self, table: str, column: str, value: Any) -> bool:
        return self.dst.execute(f"SELECT 1 FROM {table} WHERE {column} = ? LIMIT 1", (value,)).fetchone() is not None

    def _read(self, table: str, columns: list[str], where: str = "",
              leave_inconsistent: bool = False) -> Iterator[tuple[Any, ...]]:
        """Rows as stored, in key order. Where the table's b-tree fails (recorded as a ``readError``), the
        rows past the damage are found from the table's other end: a scan backwards from the last key reads
        down to the damage, keeping only the keys, then each of those rows is read by its key, in key order.
        So one damaged stretch of pages loses only the rows it holds; with two or more, the rows between them
        are found through the table's full indexes (a rowid table: :meth:`_gap_rowids`), else they go too.
        ``leave_inconsistent``: a rowid table's rows ``integrity_check`` names as missing from one of its
        indexes are left out (``inconsistent``)."""
        key = self._key(table)
        damage = table_damage(self.src, table) if leave_inconsistent and key == ["rowid"] else TableDamage()
        suspect = damage.inconsistent
        if damage.hidden:  # no read of the table finds them: counted, so the boot report names the table
            self.report.skip(table, "hidden", damage.hidden)
        n = len(key)
        last: tuple[Any, ...] | None = None
        try:
            for row in self._scan(table, key, columns, where, after=last):
                last = row[:n]
                if suspect and row[0] in suspect:
                    self.report.skip(table, "inconsistent")
                    continue
                yield row[n:]
            return
        except sqlite3.DatabaseError as exc:
            self._read_error(table, exc)
        after: list[tuple[Any, ...]] = []
        try:  # the keys past the damage: read backwards from the end, down to the damage
            for row in self._scan(table, key, columns, where, after=last, backwards=True):
                after.append(row[:n])
        except sqlite3.DatabaseError:
            pass
        after.reverse()
        if key == ["rowid"]:
            after = self._gap_rowids(table, last, after)
        # each row again by its key, in key order (a forward scan from the first of them could descend into the
        # damaged page: in a WITHOUT ROWID table an interior cell holds a row, and the seek starts left of it)
        for found in after:
            if suspect and found[0] in suspect:
                self.report.skip(table, "inconsistent")
                continue
            sql = (f"SELECT {', '.join(columns)} FROM {table} WHERE "
                   + " AND ".join(f"{k} = {_mark(v)}" for k, v in zip(key, found, strict=True)))
            try:
                row = self.src.execute(sql, found).fetchone()
            except sqlite3.DatabaseError as exc:
                self._read_error(table, exc)
                continue
            if row is not None:
                yield tuple(row)

    def _gap_rowids(self, table: str, last: tuple[Any, ...] | None, after: list[tuple[Any, ...]]
                    ) -> list[tuple[Any, ...]]:
        """``after`` (the rowids read back from the table's end, in order) with the rowids between the damage the
        forward scan met and the first of them, as the table's full indexes name them: with two damaged stretches
        of the table's b-tree, the rows between them are found through an index (each index is read until it
        fails; a rowid named by none of them, or whose row does not read, stays lost)."""
        low = last[0] if last is not None else None
        high = after[0][0] if after else None
        found: set[int] = set()
        try:
            indexes = [_text(r[1]) for r in self.src.execute(f"PRAGMA index_list({table})") if not r[4]]
        except (sqlite3.DatabaseError, _BadRow):
            return after
        for index in indexes:
            try:
                for (rowid,) in self.src.execute(f'SELECT rowid FROM {table} INDEXED BY "{index}"'):
                    if (low is None or rowid > low) and (high is None or rowid < high):
                        found.add(int(rowid))
            except sqlite3.DatabaseError:
                continue
        return [(rowid,) for rowid in sorted(found)] + after

    def _key(self, table: str) -> list[str]:
        """The columns that order the table's b-tree: ``rowid``, or a WITHOUT ROWID table's primary key (from
        the rebuilt database's schema: the quarantined one's may be damaged)."""
        sql = self.dst.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        if sql is None or "WITHOUT ROWID" not in str(sql[0]).upper():
            return ["rowid"]
        pk = sorted((int(r[5]), str(r[1])) for r in self.dst.execute(f"PRAGMA table_info({table})") if int(r[5]))
        return [name for _, name in pk]

    def _scan(self, table: str, key: list[str], columns: list[str], where: str, *, after: tuple[Any, ...] | None,
              backwards: bool = False) -> Iterator[tuple[Any, ...]]:
        conditions = [where] if where else []
        params: tuple[Any, ...] = ()
        if after is not None:
            conditions.append(f"({', '.join(key)}) > ({', '.join(_mark(v) for v in after)})")
            params = after
        direction = " DESC" if backwards else ""
        sql = (f"SELECT {', '.join(key + columns)} FROM {table}"
               f"{' WHERE ' + ' AND '.join(conditions) if conditions else ''}"
               f" ORDER BY {', '.join(k + direction for k in key)}")
        cur = self.src.execute(sql, params)
        while True:
            row = cur.fetchone()
            if row is None:
                return
            yield tuple(row)

    def _read_error(self, table: str, exc: sqlite3.DatabaseError) -> None:
        self.report.errors.setdefault(table, f"{type(exc).__name__}: {exc}")
        self.report.skip(table, "readError")

    def _decode(self, columns: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
        values = {c: _text(v) for c, v in zip(columns, row, strict=True)}
        for column, value in values.items():
            if value is not None and (column.endswith("_json") or column in _JSON_COLUMNS_EXTRA):
                try:
                    orjson.loads(value)
                except (orjson.JSONDecodeError, TypeError):
                    raise _BadRow("badJson") from None
        return values

    def _link(self, values: dict[str, Any], fks: list[_ForeignKey]) -> None:
        for fk in fks:
            value = values.get(fk.column)
            if value is None:
                continue
            if fk.parent == "projects":
                value = self.project_map.get(value) if isinstance(value, int) else None
                values[fk.column] = value
            if value is None or not self._exists(fk.parent, fk.parent_column, value):
                if not fk.set_null:
                    raise _BadRow("orphans")
                values[fk.column] = None

    def copy_table(self, table: str) -> None:
        dst_columns = _columns(self.dst, table)
        src_columns = set(_columns(self.src, table))
        if not src_columns:
            self.report.errors[table] = "not readable in the quarantined file"
            self.report.skip(table, "readError")  # none of its rows: boot.salvageSkipped names it
            return
        omit = {"id"} if table == "audit_log" else set()
        columns = [c for c in dst_columns if c in src_columns and c not in omit]
        fks = _foreign_keys(self.dst, table)
        sql = f"INSERT OR IGNORE INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        copied = 0
        # a row whose indexed value no longer matches its index entry had a byte changed inside it: a wrong
        # value that reads back as well formed is left out, not copied (rowid tables; integrity_check names it)
        for row in self._read(table, columns, leave_inconsistent=True):
            try:
                values = self._decode(columns, row)
                if not self._wanted(table, values):
                    continue
                self._link(values, fks)
            except _BadRow as bad:
                self.report.skip(table, bad.why)
                continue
            params = [values[c] for c in columns]
            if table == "turns" and self._over_lost_turn(columns, values):
                copied += 1
                continue
            try:
                added = self.dst.execute(sql, params).rowcount
            except sqlite3.IntegrityError:  # a constraint OR IGNORE does not cover (a foreign key checked above)
                self.report.skip(table, "rejected")
                continue
            if not added:
                added = self._ignored(table, columns, params)
            if added:
                copied += 1
        self.report.copied[table] = copied

    def _over_lost_turn(self, columns: list[str], values: dict[str, Any]) -> bool:
        """A turn the rebuild restored from the lines that name it (``store.turns.INDEX_LOST``: how it ended
        unknown) takes the salvaged row of that turn in its session, which knows it. Whether it did."""
        try:
            return bool(self.dst.execute(
                f"UPDATE turns SET ({', '.join(columns)}) = ({', '.join('?' for _ in columns)}) "
                "WHERE id = ? AND session_id = ? AND error_code = ?",
                [*(values[c] for c in columns), values["id"], values["session_id"], turns.INDEX_LOST]).rowcount)
        except sqlite3.IntegrityError:  # a value the schema refuses: the INSERT OR IGNORE after it tells
            return False

    def _ignored(self, table: str, columns: list[str], params: list[Any]) -> int:
        """Why OR IGNORE left a row out: a row the rebuild wrote under its key (``kept``), or a value the
        schema refuses (``badValue``: a CHECK or NOT NULL constraint, a byte changed inside the row: it reads
        back well formed, so only the constraint tells). Found by inserting it once more without OR IGNORE
        (the failed statement alone is undone); the row count it added (0, unless it went in after all)."""
        try:
            return int(self.dst.execute(
                f"INSERT INTO {table}({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                params).rowcount)
        except sqlite3.IntegrityError as exc:  # a foreign key failed above already, under OR IGNORE too
            self.report.skip(table, "kept" if is_key_conflict(exc) else "badValue")
            return 0

    def copy_blob_meta(self) -> None:
        """``attachment_blobs``: boot gave each blob file a row (and each referenced blob whose file is gone a
        tombstone) before the salvage; each such row gets back what the file does not hold. A blob the rebuilt
        index has no row for (its file gone and nothing refers to it) is left out (``noBlob``)."""
        table = "attachment_blobs"
        src_columns = set(_columns(self.src, table))
        columns = ["sha256", "created_at", *_BLOB_META]
        if not src_columns:
            self.report.errors[table] = "not readable in the quarantined file"
            self.report.skip(table, "readError")
            return
        columns = [c for c in columns if c in src_columns]
        sets = ", ".join(f"{c} = COALESCE({c}, ?)" for c in columns[2:])
        sql = (f"UPDATE attachment_blobs SET {sets}, created_at = COALESCE(?, created_at) "
               "WHERE sha256 = ?")
        copied = 0
        for row in self._read(table, columns):
            try:
                values = self._decode(columns, row)
            except _BadRow as bad:
                self.report.skip(table, bad.why)
                continue
            created = values["created_at"]
            if not isinstance(values["sha256"], str) or not (type(created) is int or created is None):
                self.report.skip(table, "badValue")
                continue
            try:
                found = self.dst.execute(sql, (*(values[c] for c in columns[2:]), created,
                                               values["sha256"])).rowcount
            except sqlite3.IntegrityError:  # a value the schema's CHECK refuses (a damaged byte)
                self.report.skip(table, "rejected")
                continue
            if found:
                copied += 1
            else:
                self.report.skip(table, "noBlob")
        self.report.copied[table] = copied

    def _wanted(self, table: str, values: dict[str, Any]) -> bool:
        """False for a row the rebuild owns (dropped silently); raises _BadRow for an orphan."""
        if table == "kv":
            key = (values["ns"], values["key"])
            if key in _SKIPPED_KV or values["ns"] in _SKIPPED_KV_NS:
                return False
            if values["ns"] == QUEUE_KV_NS and not self._exists("sessions", "id", values["key"]):
                raise _BadRow("orphans")
            if key == _CURRENT_PROJECT:
                old = orjson.loads(values["value_json"])
                new = self.project_map.get(old) if isinstance(old, int) and not isinstance(old, bool) else None
                if new is None:
                    raise _BadRow("orphans")
                values["value_json"] = orjson.dumps(new).decode()
        elif table == "audit_log":
            if values["kind"] == "tool_execute":
                return False
            # no key to keep it from a second copy (a salvage resumed after a kill): the same row is not added
            return self.dst.execute(
                "SELECT 1 FROM audit_log WHERE ts = ? AND kind = ? AND session_id IS ? AND payload_json = ?",
                (values["ts"], values["kind"], values["session_id"], values["payload_json"])).fetchone() is None
        elif table == "command_receipts":
            if values["method"] in _REBUILT_RECEIPTS:
                return False
            sid = values.get("session_id")
            if sid is not None and not self._exists("sessions", "id", sid):
                raise _BadRow("orphans")
        return True

    def copy_projects(self) -> None:
        columns = ["id", "path", "name", "pinned", "created_at", "last_opened_at"]
        copied = 0
        for row in self._read("projects", columns):
            try:
                values = self._decode(columns, row)
            except _BadRow as bad:
                self.report.skip("projects", bad.why)
                continue
            old_id, path = values["id"], values["path"]
            if not isinstance(old_id, int) or not isinstance(path, str):
                self.report.skip("projects", "badValue")
                continue
            found = self.dst.execute("SELECT id FROM projects WHERE path = ?", (path,)).fetchone()
            if found is not None:
                self.dst.execute("UPDATE projects SET pinned = ? WHERE id = ?", (int(bool(values["pinned"])), found[0]))
                self.project_map[old_id] = int(found[0])
                self.report.projects_mapped += 1
                continue
            new_id = raise_project_id_floor(self.dst, issued_project_id(self.dst) + 1, self.now_ms)
            self.dst.execute(
                "INSERT INTO projects(id, path, name, pinned, created_at, last_opened_at) VALUES (?, ?, ?, ?, ?, ?)",
                (new_id, path, values["name"], int(bool(values["pinned"])), values["created_at"],
                 values["last_opened_at"]))
            self.project_map[old_id] = new_id
            copied += 1
        self.report.copied["projects"] = copied

    def relink_messages(self) -> None:
        """Rebuilt messages of a salvaged turn: the rebuild indexed them before the turn row was back, so
        their turn link is missing; the quarantined index's link is taken where it names a turn of the same
        session that is here now."""
        rows = self._read("messages", ["id", "session_id", "turn_id"], "turn_id IS NOT NULL")
        for row in rows:
            try:
                mid, sid, turn = (_text(v) for v in row)
            except _BadRow:
                continue
            self.report.relinked_messages += self.dst.execute(
                "UPDATE messages SET turn_id = ? WHERE id = ? AND session_id = ? AND turn_id IS NULL "
                "AND EXISTS (SELECT 1 FROM turns WHERE id = ? AND session_id = ?)",
                (turn, mid, sid, turn, sid)).rowcount
        self.report.errors.pop("messages", None)  # a derived table: its damage is no salvage failure
        self.report.skipped.pop("messages", None)


def salvage(dst: sqlite3.Connection, source: Path, *, now_ms: int, faults: Faults = NO_FAULTS) -> SalvageReport:
    """Copy the DB-only rows of the quarantined ``source`` into ``dst`` (the rebuilt index), each table in
    its own transaction on ``dst`` (autocommit connection). Never writes ``source``. A table that cannot
    be read at all is reported in ``errors``; what was copied stays."""
    report = SalvageReport(source=str(source))
    with _open_source(source) as src:
        try:
            version = int(src.execute("PRAGMA user_version").fetchone()[0])
        except sqlite3.DatabaseError as exc:
            report.skipped_reason = f"the quarantined file cannot be read: {exc}"
            return report
        if not SALVAGE_FROM_VERSION <= version <= SCHEMA_VERSION:
            report.skipped_reason = (f"its schema version is {version}; this build salvages "
                                     f"{SALVAGE_FROM_VERSION}-{SCHEMA_VERSION}")
            return report
        try:
            tables = {_text(r[0]) for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except (sqlite3.DatabaseError, _BadRow) as exc:
            report.skipped_reason = f"its schema cannot be read: {exc}"
            return report
        worker = _Salvager(src, dst, report, now_ms)
        for table, _why in SALVAGED:
            if table not in tables:  # the same schema version has it: its schema row is damaged
                report.errors[table] = "missing from the quarantined file"
                report.skip(table, "readError")
                continue
            try:
                with _write(dst):
                    if table == "projects":
                        worker.copy_projects()
                    elif table == "attachment_blobs":
                        worker.copy_blob_meta()
                    else:
                        worker.copy_table(table)
                    if table == "turns":
                        worker.relink_messages()
            except sqlite3.Error as exc:
                if _disk_full(exc):
                    raise
                report.errors[table] = f"{type(exc).__name__}: {exc}"
                report.copied.pop(table, None)
                report.skip(table, "readError")  # what it had copied was rolled back
                log.warning("salvaging %s failed: %s", table, exc)
            faults.point("salvage.after_table")
    return report


def _disk_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


@contextmanager
def _write(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
