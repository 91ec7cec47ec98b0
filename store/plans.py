"""Plan/Goal approvals: immutable Markdown artifacts + ``plan_approvals`` rows (seed 003 §4.6a).

Submission writes the exact Markdown bytes to a new, unique
``<workspaceRoot>/.pi/<kind>/<stamp>-<random>.md`` (``O_CREAT|O_EXCL``, fsync,
directory fsync; an existing file is never replaced), then inserts one
``pending`` row carrying the relative path, SHA-256 and size. A session has at
most one pending row (unique partial index); a stale pending row past its
``expires_at`` is expired first.

Approval re-verifies the artifact (path shape, no symlinks, size, hash), then
in one transaction: ``status = approved``, a fresh ``execution_id``,
``execution_state = queued``, ``sessions.mode = agent`` and the explicit
permission mode. Reject/expiry leave the session in its contract mode. Any
response to a row that is no longer pending (answered, expired, or
``interrupted`` by the boot fence) is a ``CONFLICT``: nothing from before a
restart is ever replayed.

File functions run in a worker thread; SQL functions inside a DB call.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
import stat
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson

from store.errors import (
    Conflict,
    CorruptData,
    DamagedRecord,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    StoreError,
    classify_os_error,
)
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, remove_file_durable, write_all
from store.jsonio import Readable, readable
from store.rules import not_ended_sql
from store.safe_open import check_path, open_regular, open_under, path_error, read_bounded

__all__ = [
    "Artifact",
    "INTENT_SUFFIX",
    "KINDS",
    "LIVE_PENDING",
    "MAX_MARKDOWN_BYTES",
    "abandon_submission",
    "approve",
    "check_markdown_size",
    "expire_stale",
    "find_keyed_artifact",
    "get_request",
    "insert_pending",
    "keyed_token",
    "lapsed_sessions",
    "list_pending",
    "next_deadline",
    "reject",
    "stale_pending",
    "sweep_intents",
    "verify_artifact",
    "write_artifact",
    "write_intent",
]

KINDS = ("plan", "goal")
PERMISSION_TARGETS = ("ask", "accept-edits", "auto")
MAX_MARKDOWN_BYTES = 1024 * 1024
_REL_RE = re.compile(r"^\.pi/(plan|goal)/[A-Za-z0-9_-]{1,80}\.md$")
_CHUNK = 1 << 16
INTENT_SUFFIX = ".plan-intent.json"


@dataclass(frozen=True)
class Artifact:
    relative_path: str
    sha256: str
    size: int


def _check_root(workspace_root: str) -> str:
    check_path(workspace_root, field="workspaceRoot")
    try:
        st = os.stat(workspace_root)
    except FileNotFoundError:
        raise NotFound(f"workspace {workspace_root} does not exist", data={"workspaceRoot": workspace_root}) from None
    except OSError as exc:
        raise path_error(exc, workspace_root, field="workspaceRoot", what="open workspace") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InvalidInput(f"workspace {workspace_root} is not a directory", data={"field": "workspaceRoot"})
    return workspace_root


def _ensure_real_dir(path: str) -> None:
    """Create ``path`` (fsyncing its parent) or accept it only if it is a real directory, not a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
        else:
            fsync_dir(os.path.dirname(path))
        st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise Conflict(f"{path} is not a directory (symlinks are refused)", data={"path": path})


def artifact_name(kind: str, now_ms: int | None = None, token: str | None = None) -> str:
    """A fresh relative path ``.pi/<kind>/<stamp>-<token>.md`` (chosen before anything is written); the token
    is random, or a keyed submission's :func:`keyed_token`."""
    if kind not in KINDS:
        raise InvalidInput("kind must be plan or goal", data={"field": "kind"})
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime((now_ms or int(time.time() * 1000)) / 1000))
    return f".pi/{kind}/{stamp}-{token or secrets.token_hex(6)}.md"


def keyed_token(client_id: str, submission_id: str) -> str:
    """The name token (12 hex) of a keyed submission's artifact, derived from its receipt key."""
    return hashlib.sha256(f"{client_id}\x00{submission_id}".encode()).hexdigest()[:12]


def find_keyed_artifact(workspace_root: str, kind: str, token: str, markdown: bytes) -> Artifact | None:
    """The artifact an earlier try of this keyed submission published (its name ends in the key's token) if it
    holds exactly ``markdown``: a retry whose row and receipt went with a lost database names it again and
    publishes no second file. None: there is none (or it changed: then the retry writes its own)."""
    if kind not in KINDS:
        raise InvalidInput("kind must be plan or goal", data={"field": "kind"})
    root = _check_root(workspace_root)
    kind_dir = os.path.join(root, ".pi", kind)
    try:
        names = sorted(os.listdir(kind_dir))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise classify_os_error(exc, f"list {kind} artifacts in {root}") from exc
    sha, size = hashlib.sha256(markdown).hexdigest(), len(markdown)
    for name in names:
        rel = f".pi/{kind}/{name}"
        if not name.endswith(f"-{token}.md") or not _REL_RE.fullmatch(rel):
            continue
        try:
            verify_artifact(root, rel, sha, size)  # no symlink followed, exact bytes
        except CorruptData:
            continue
        return Artifact(rel, sha, size)
    return None


def check_markdown_size(markdown: bytes) -> None:
    """The artifact limit is in UTF-8 bytes (what is written), not characters: checked before
    the submission writes anything (its intent included)."""
    if len(markdown) > MAX_MARKDOWN_BYTES:
        raise PayloadTooLarge(f"markdown is {len(markdown)} bytes of UTF-8; at most {MAX_MARKDOWN_BYTES} are allowed",
                              data={"field": "markdown", "size": len(markdown), "limit": MAX_MARKDOWN_BYTES})


def write_artifact(workspace_root: str, kind: str, markdown: bytes, *, faults: Faults = NO_FAULTS,
                   now_ms: int | None = None, relative_path: str | None = None) -> Artifact:
    """Write the exact bytes to a new unique file; returns its relative path, SHA-256 and size.

    The bytes go to a temporary sibling first (fsynced), then are published
    under the final name with ``link`` (never replacing a file) and the
    directory is fsynced: the artifact exists whole or not at all.
    """
    if kind not in KINDS:
        raise InvalidInput("kind must be plan or goal", data={"field": "kind"})
    check_markdown_size(markdown)
    root = _check_root(workspace_root)
    rel = relative_path or artifact_name(kind, now_ms)
    if not _REL_RE.fullmatch(rel) or not rel.startswith(f".pi/{kind}/"):
        raise InvalidInput(f"artifact path {rel!r} is not a {kind} artifact path", data={"field": "relativePath"})
    try:
        pi_dir = os.path.join(root, ".pi")
        kind_dir = os.path.join(pi_dir, kind)
        _ensure_real_dir(pi_dir)
        _ensure_real_dir(kind_dir)
        path = os.path.join(root, rel)
        tmp = f"{path}.tmp.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            try:
                write_all(fd, markdown)
                faults.point("plans.artifact.after_write")
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise Conflict(f"artifact {rel} already exists; artifacts are immutable",
                               data={"relativePath": rel}) from None
            finally:
                os.unlink(tmp)
            fsync_dir(kind_dir)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise classify_os_error(exc, f"write {kind} artifact in {root}") from exc
    return Artifact(rel, hashlib.sha256(markdown).hexdigest(), len(markdown))


# -- submission intents: the receipt of the file effect (ARCHITECTURE.md "Receipts ride with their effect")


def write_intent(path: str | os.PathLike[str], *, request_id: str, session_id: str, workspace_root: str,
                 artifact: Artifact, faults: Faults = NO_FAULTS) -> None:
    """Before the artifact is published: which file this submission is about to create.

    If the host dies before the approval row commits, boot finds the intent
    with no row and removes the artifact (:func:`sweep_intents`): a plan
    file no row records never survives a crash, and the retried submission
    runs once, on a clean slate.
    """
    body = {"type": "plan_intent", "requestId": request_id, "sessionId": session_id,
            "workspaceRoot": workspace_root, "relativePath": artifact.relative_path,
            "sha256": artifact.sha256, "size": artifact.size}
    atomic_write(path, orjson.dumps(body) + b"\n", faults=faults, point_prefix="plans.intent")


def sweep_intents(conn: sqlite3.Connection, sessions_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Boot: finish every submission that was interrupted (row present) or undo it (no row)."""
    kept = removed = 0
    for name in sorted(os.listdir(sessions_dir)):
        if not name.endswith(INTENT_SUFFIX):
            continue
        path = os.path.join(sessions_dir, name)
        try:
            fd = open_regular(path, max_bytes=1 << 16)
            try:
                intent = orjson.loads(read_bounded(fd, 1 << 16, path=path))
            finally:
                os.close(fd)
        except (OSError, ValueError, StoreError):
            intent = None
        if isinstance(intent, dict) and isinstance(intent.get("requestId"), str):
            row = conn.execute("SELECT 1 FROM plan_approvals WHERE request_id = ?", (intent["requestId"],)).fetchone()
            if row is None:
                _remove_if_ours(intent)
                removed += 1
            else:
                kept += 1
        remove_file_durable(path)
    return {"artifactsKept": kept, "artifactsRemoved": removed}


def _remove_if_ours(intent: dict[str, Any]) -> None:
    """Remove what an interrupted submission left: its temporary file, and the artifact it
    published if it is exactly the bytes it wrote."""
    root, rel = intent.get("workspaceRoot"), intent.get("relativePath")
    if not isinstance(root, str) or not isinstance(rel, str) or not _REL_RE.fullmatch(rel):
        return
    folder, name = os.path.split(os.path.join(root, rel))
    try:
        leftovers = [n for n in os.listdir(folder) if n.startswith(f"{name}.tmp.")]
    except OSError:
        leftovers = []
    for leftover in leftovers:  # the name carries a random part: only this submission made it
        try:
            os.unlink(os.path.join(folder, leftover))
        except OSError:
            pass
    try:
        verify_artifact(root, rel, intent.get("sha256"), intent.get("size"))
    except (CorruptData, StoreError):
        return  # not the file this submission wrote (or gone): never remove a foreign file
    remove_artifact(root, rel)
    try:
        fsync_dir(os.path.dirname(os.path.join(root, rel)))
    except OSError:
        pass


def abandon_submission(intent_path: str | os.PathLike[str], workspace_root: str, artifact: Artifact) -> None:
    """A submission failed before its row committed: remove what it wrote, best effort, never raising.

    The same rule as the boot sweep (:func:`_remove_if_ours`): its temporary
    file, and the artifact only if it holds exactly the bytes this submission
    planned (a file already at that name, which ``link`` refused, is kept). The
    intent goes last: if this is cut short, the boot sweep still has its record.
    """
    _remove_if_ours({"workspaceRoot": workspace_root, "relativePath": artifact.relative_path,
                     "sha256": artifact.sha256, "size": artifact.size})
    try:
        remove_file_durable(intent_path)
    except StoreError:
        pass  # a leftover intent is finished by the boot sweep; the caller's own error is what matters


def remove_artifact(workspace_root: str, relative_path: str) -> None:
    """Undo a write whose row could not be inserted (best effort)."""
    if _REL_RE.fullmatch(relative_path):
        try:
            os.unlink(os.path.join(workspace_root, relative_path))
        except OSError:
            pass


def verify_artifact(workspace_root: str, relative_path: str | None, sha256: str | None, size: int | None) -> None:
    """The artifact must still be exactly what was submitted (path shape, no symlink, size, hash)."""
    def bad(reason: str) -> CorruptData:
        return CorruptData(f"plan artifact {relative_path!r} failed verification: {reason}",
                           data={"path": relative_path, "reason": reason})

    if not relative_path or not _REL_RE.fullmatch(relative_path) or sha256 is None or size is None:
        raise bad("no valid artifact recorded")
    root = _check_root(workspace_root)
    # Walk from the workspace without following a symlink, open non-blocking (an agent can
    # write the workspace: a FIFO or device put in the artifact's place must not block the
    # session actor), fstat before reading, and never read more than one byte past its size.
    try:
        fd = open_under(os.path.join(root, relative_path), [root], max_bytes=None, field="artifactPath")
    except NotFound:
        raise bad("file is missing") from None
    except StoreError as exc:
        raise bad(exc.message) from None
    try:
        digest, total = hashlib.sha256(), 0
        while total <= size and (chunk := os.read(fd, min(_CHUNK, size + 1 - total))):
            digest.update(chunk)
            total += len(chunk)
    except OSError as exc:
        raise bad(f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if total != size:
        raise bad(f"size changed ({total} bytes, expected {size})")
    if digest.hexdigest() != sha256:
        raise bad("content hash changed")


# -- SQL ---------------------------------------------------------------------

_COLS = ("request_id, session_id, turn_id, tool_call_id, kind, title, question, status, action, "
         "target_permission_mode, created_at, updated_at, expires_at, resolved_at, error_code, "
         "artifact_relative_path, artifact_sha256, artifact_size_bytes, version, execution_id, execution_state, "
         "execution_turn_id, execution_outcome, execution_error_code, execution_started_at, execution_ended_at")
_KEYS = ("requestId", "sessionId", "turnId", "toolCallId", "kind", "title", "question", "status", "action",
         "targetPermissionMode", "createdAt", "updatedAt", "expiresAt", "resolvedAt", "errorCode",
         "artifactPath", "artifactSha256", "artifactSize", "version", "executionId", "executionState",
         "executionTurnId", "_outcome", "executionErrorCode", "executionStartedAt", "executionEndedAt")
EXECUTION_OUTCOMES = ("completed", "failed", "cancelled")
EXECUTION_ENDED = ("completed", "interrupted")
"""The ``execution_state`` of an ended execution (``_end`` writes one of them)."""
EXECUTION_MAY_RUN = f"(execution_state IS NOT NULL AND {not_ended_sql('execution_state', EXECUTION_ENDED)})"
"""SQL: an execution that is queued or running, or may be: its stored state is damaged (outside its set), which
is no proof it ended. It keeps its session in agent mode, its turn's end and the boot fence end it, and
``plans.finishExecution`` accepts it."""

LIVE_PENDING = "(status = 'pending' AND (expires_at IS NULL OR expires_at > ?))"
"""SQL: a pending row whose deadline has not passed at ``?`` (the host's clock): what holds a session."""
STATUSES: Final = ("pending", "approved", "changes_requested", "rejected", "expired", "interrupted")
_DAMAGED_PENDING = "(resolved_at IS NULL AND status NOT IN ({}))".format(", ".join(f"'{s}'" for s in STATUSES))
"""SQL: a row whose status is damaged (outside :data:`STATUSES`; SQLite checks a CHECK on writes only) and that
has no resolution time, which every transition out of pending sets in the same statement: it was never settled.
No index holds it (the partial ones are ``status = 'pending'``): a query for it scans the table. It does not hold
its session (:data:`LIVE_PENDING`) and is never answered (CORRUPT_DATA), but it expires at its deadline and the
boot fence interrupts it, as ``store.approvals`` does with an approval whose status is damaged; ``plans.pending``
names it in ``unreadable`` (:func:`list_pending`)."""
PENDING = f"(status = 'pending' OR {_DAMAGED_PENDING})"
"""SQL: a row pending, or :data:`_DAMAGED_PENDING` (what the expiry and the boot fence settle)."""
_STALE = f"{PENDING} AND expires_at IS NOT NULL AND expires_at <= ?"
"""SQL: a row still pending (or damaged and never settled) whose deadline passed at ``?``: with a session, read
through the session's index; without one (the boot fence, the timer's due wake-up), a scan."""


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    out = {k: v for k, v in zip(_KEYS, row, strict=True) if v is not None}
    outcome = out.pop("_outcome", None)
    if outcome is not None:  # the lifecycle's end in full (the seed column only knows completed/interrupted)
        out["executionState"] = outcome
    return out


def get_request(conn: sqlite3.Connection, request_id: str) -> dict[str, Any]:
    """The request; ``DamagedRecord`` (CORRUPT_DATA) when a column with a fixed set holds another value: it is
    never answered, approved or announced with a value the host did not write."""
    row = conn.execute(f"SELECT {_COLS} FROM plan_approvals WHERE request_id = ?", (request_id,)).fetchone()
    if row is None:
        raise NotFound(f"approval request {request_id} not found", data={"requestId": request_id})
    return _checked(row)


def markdown_of(conn: sqlite3.Connection, request_id: str) -> str:
    row = conn.execute("SELECT plan_json FROM plan_approvals WHERE request_id = ?", (request_id,)).fetchone()
    if row is None:
        raise NotFound(f"approval request {request_id} not found", data={"requestId": request_id})
    return str(row[0])


_SETS: tuple[tuple[int, tuple[str | None, ...], str], ...] = (
    (_KEYS.index("kind"), ("plan", "goal"), "kind"),
    (_KEYS.index("status"), STATUSES, "status"),
    (_KEYS.index("action"), (None, "approve", "request_changes", "reject"), "action"),
    (_KEYS.index("targetPermissionMode"), (None, "ask", "accept-edits", "auto"), "target_permission_mode"),
    (_KEYS.index("executionState"), (None, "queued", "running", "completed", "interrupted"), "execution_state"),
    (_KEYS.index("_outcome"), (None, *EXECUTION_OUTCOMES, "interrupted"), "execution_outcome"),
)
"""The columns with a fixed set (their CHECKs), by position in :data:`_COLS`."""


_NUMBERS: Final = tuple(_KEYS.index(key) for key in (
    "createdAt", "updatedAt", "expiresAt", "resolvedAt", "artifactSize", "version", "executionStartedAt",
    "executionEndedAt"))
"""The integer columns, non-negative as the host writes them (times in milliseconds, a size, a version), by
position in :data:`_COLS`: SQLite keeps any value a column is given."""


def _checked(row: tuple[Any, ...]) -> dict[str, Any]:
    """:func:`_row`, each column with a fixed set checked (``DamagedRecord`` naming it: SQLite checks a CHECK on
    writes only), and each integer column (:data:`_NUMBERS`)."""
    for at, allowed, column in _SETS:
        if row[at] not in allowed:
            raise DamagedRecord(f"plan approval {row[0]}'s {column} is {row[at]!r}, not one of its set",
                                data={"requestId": row[0]})
    for at in _NUMBERS:
        if row[at] is not None and (type(row[at]) is not int or row[at] < 0):
            raise DamagedRecord(f"plan approval {row[0]}'s {_KEYS[at]} is {row[at]!r}, not a count",
                                data={"requestId": row[0]})
    return _row(row)


def _pending_rows(conn: sqlite3.Connection, session_id: str | None, now_ms: int) -> list[tuple[Any, ...]]:
    """The live pending rows, and the live :data:`_DAMAGED_PENDING` ones (a second arm, so the first still reads
    the pending rows' index; the second reads the session's rows, or scans the table for every session's)."""
    where = "(expires_at IS NULL OR expires_at > ?)"
    args: tuple[Any, ...] = (now_ms,)
    if session_id is not None:
        where += " AND session_id = ?"
        args += (session_id,)
    select = f"SELECT {_COLS} FROM plan_approvals WHERE"
    return conn.execute(f"{select} status = 'pending' AND {where} UNION ALL {select} {_DAMAGED_PENDING} AND {where} "
                        "ORDER BY created_at DESC, request_id", args + args).fetchall()


def list_pending(conn: sqlite3.Connection, session_id: str | None, now_ms: int) -> Readable[dict[str, Any]]:
    """Only live ``pending`` rows, with their original ``expires_at``: terminal ones are never rehydrated,
    and a row past its deadline is expired whether or not anything has marked it yet (seed 003 §4.5). A row
    whose record is damaged (a column outside its set) is named in ``unreadable`` (request ids), not listed;
    so is a row whose status is damaged but never settled (:data:`_DAMAGED_PENDING`), never dropped unnamed."""
    return readable(_pending_rows(conn, session_id, now_ms), _checked, lambda r: str(r[0]))


def expire_all_stale(conn: sqlite3.Connection, now_ms: int) -> int:
    """Every session's pending rows past their deadline: ``expired`` at their deadline (boot fence)."""
    return conn.execute(
        "UPDATE plan_approvals SET status = 'expired', updated_at = ?, resolved_at = expires_at, "
        f"error_code = 'EXPIRED' WHERE {_STALE}", (now_ms, now_ms)).rowcount


def expire_stale(conn: sqlite3.Connection, session_id: str, now_ms: int) -> int:
    """A pending row past its deadline becomes ``expired``, resolved at its deadline as the boot fence
    has it (the session stays in its contract mode). The rows it changed (0: nothing was left to)."""
    return conn.execute(
        "UPDATE plan_approvals SET status = 'expired', updated_at = ?, resolved_at = expires_at, "
        f"error_code = 'EXPIRED' WHERE session_id = ? AND {_STALE}",
        (now_ms, session_id, now_ms)).rowcount


def next_deadline(conn: sqlite3.Connection, *, damaged: bool = False) -> int | None:
    """The earliest ``expires_at`` of a pending request (None: nothing can expire), read through the pending
    rows' index; ``damaged``: of a request whose status is damaged too (:data:`_DAMAGED_PENDING`: a scan, so only
    on the expiry timer's own wake-ups, never per request)."""
    found = [conn.execute("SELECT MIN(expires_at) FROM plan_approvals WHERE status = 'pending'").fetchone()[0]]
    if damaged:
        found.append(conn.execute(f"SELECT MIN(expires_at) FROM plan_approvals WHERE {_DAMAGED_PENDING}")
                     .fetchone()[0])
    deadlines = [int(at) for at in found if at is not None]
    return min(deadlines) if deadlines else None


def lapsed_sessions(conn: sqlite3.Connection, now_ms: int, limit: int) -> list[str]:
    """At most ``limit`` sessions with a pending request past its deadline at ``now_ms``, earliest first."""
    return [r[0] for r in conn.execute(
        f"SELECT session_id FROM plan_approvals WHERE {_STALE} GROUP BY session_id "
        "ORDER BY MIN(expires_at), session_id LIMIT ?", (now_ms, limit))]


def stale_pending(conn: sqlite3.Connection, session_id: str, now_ms: int) -> list[str]:
    """The session's requests past their deadline that nothing has marked ``expired`` yet."""
    return [r[0] for r in conn.execute(
        f"SELECT request_id FROM plan_approvals WHERE session_id = ? AND {_STALE} ORDER BY created_at, request_id",
        (session_id, now_ms))]


def pending_of(conn: sqlite3.Connection, session_id: str, now_ms: int) -> dict[str, Any] | None:
    """The session's live pending request, damaged or not (it holds the session all the same: one at a time)."""
    rows = _pending_rows(conn, session_id, now_ms)
    return _row(rows[0]) if rows else None


def insert_pending(conn: sqlite3.Connection, *, request_id: str, session_id: str, turn_id: str, tool_call_id: str,
                   kind: str, markdown: str, title: str, question: str, artifact: Artifact,
                   expires_at: int | None, now_ms: int) -> dict[str, Any]:
    expire_stale(conn, session_id, now_ms)
    existing = pending_of(conn, session_id, now_ms)
    if existing is not None:
        raise Conflict(f"session {session_id} already has a pending {existing['kind']} approval",
                       data={"sessionId": session_id, "requestId": existing["requestId"]})
    if conn.execute("SELECT 1 FROM plan_approvals WHERE tool_call_id = ?", (tool_call_id,)).fetchone():
        raise Conflict(f"tool call {tool_call_id} already submitted a proposal", data={"toolCallId": tool_call_id})
    conn.execute(
        "INSERT INTO plan_approvals(request_id, session_id, turn_id, tool_call_id, kind, plan_json, title, question, "
        "status, created_at, updated_at, expires_at, artifact_relative_path, artifact_sha256, artifact_size_bytes) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
        (request_id, session_id, turn_id, tool_call_id, kind, markdown, title, question, now_ms, now_ms,
         expires_at, artifact.relative_path, artifact.sha256, artifact.size))
    return get_request(conn, request_id)


def require_pending(conn: sqlite3.Connection, request_id: str, now_ms: int) -> dict[str, Any]:
    """The row, if it may still be answered; ``CONFLICT`` for a stale response."""
    row = get_request(conn, request_id)
    if row["status"] == "pending" and row.get("expiresAt") is not None and row["expiresAt"] <= now_ms:
        expire_stale(conn, row["sessionId"], now_ms)
        row = get_request(conn, request_id)
    if row["status"] != "pending":
        raise Conflict(f"approval request {request_id} is {row['status']}, not pending: a stale response is refused",
                       data={"requestId": request_id, "status": row["status"]})
    return row


def approve(conn: sqlite3.Connection, request_id: str, *, target_permission_mode: str | None, execution_id: str,
            now_ms: int) -> dict[str, Any]:
    """One transaction: approved + queued execution, session → agent + explicit permission mode."""
    if target_permission_mode is not None and target_permission_mode not in PERMISSION_TARGETS:
        raise InvalidInput("targetPermissionMode must be ask, accept-edits or auto",
                           data={"field": "targetPermissionMode"})
    row = require_pending(conn, request_id, now_ms)
    conn.execute(
        "UPDATE plan_approvals SET status = 'approved', action = 'approve', target_permission_mode = ?, "
        "resolved_at = ?, updated_at = ?, execution_id = ?, execution_state = 'queued', version = version + 1 "
        "WHERE request_id = ? AND status = 'pending'",
        (target_permission_mode, now_ms, now_ms, execution_id, request_id))
    if target_permission_mode is None:
        conn.execute("UPDATE sessions SET mode = 'agent' WHERE id = ?", (row["sessionId"],))
    else:
        conn.execute("UPDATE sessions SET mode = 'agent', permission_mode = ? WHERE id = ?",
                     (target_permission_mode, row["sessionId"]))
    return get_request(conn, request_id)


APPROVAL_KEY = "planApproval"
"""The key of the approve's ``session_info`` line that names what it approves: ``{requestId, executionId,
targetPermissionMode}``. The line (mode ``agent``, the receipt) is fsynced before the row changes."""


def approval_note(request_id: str, execution_id: str, target_permission_mode: str | None) -> dict[str, Any]:
    return {APPROVAL_KEY: {"requestId": request_id, "executionId": execution_id,
                           "targetPermissionMode": target_permission_mode}}


def reject(conn: sqlite3.Connection, request_id: str, *, now_ms: int) -> dict[str, Any]:
    """Close the gate; the session stays in its contract mode."""
    require_pending(conn, request_id, now_ms)
    conn.execute(
        "UPDATE plan_approvals SET status = 'rejected', action = 'reject', resolved_at = ?, updated_at = ?, "
        "version = version + 1 WHERE request_id = ? AND status = 'pending'", (now_ms, now_ms, request_id))
    return get_request(conn, request_id)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- execution lifecycle (seed §4.6a execution fields, bound to the executing turn) ----------

def get_execution(conn: sqlite3.Connection, session_id: str, execution_id: str) -> dict[str, Any]:
    row = conn.execute(f"SELECT {_COLS} FROM plan_approvals WHERE execution_id = ?", (execution_id,)).fetchone()
    if row is None or row[1] != session_id:
        raise NotFound(f"execution {execution_id} not found in session {session_id}",
                       data={"executionId": execution_id, "sessionId": session_id})
    return _checked(row)


def _raw_execution(conn: sqlite3.Connection, session_id: str, execution_id: str) -> dict[str, Any]:
    """:func:`get_execution` unchecked, for a transition that ends an execution whatever it holds."""
    row = conn.execute(f"SELECT {_COLS} FROM plan_approvals WHERE execution_id = ?", (execution_id,)).fetchone()
    if row is None or row[1] != session_id:
        raise NotFound(f"execution {execution_id} not found in session {session_id}",
                       data={"executionId": execution_id, "sessionId": session_id})
    return _row(row)


def _turn_running(conn: sqlite3.Connection, session_id: str, turn_id: str) -> None:
    found = conn.execute("SELECT status FROM turns WHERE id = ? AND session_id = ?", (turn_id, session_id)).fetchone()
    if found is None:
        raise NotFound(f"turn {turn_id} not found in session {session_id}", data={"turnId": turn_id})
    if found[0] != "running":
        raise Conflict(f"turn {turn_id} is {found[0]}: an execution runs in a running turn",
                       data={"turnId": turn_id, "status": found[0]})


def start_execution(conn: sqlite3.Connection, session_id: str, execution_id: str, turn_id: str,
                    now_ms: int) -> dict[str, Any]:
    """queued → running, bound to ``turn_id`` (a running turn of the session)."""
    row = get_execution(conn, session_id, execution_id)
    if row.get("executionState") != "queued":
        raise Conflict(f"execution {execution_id} is {row.get('executionState')}, not queued",
                       data={"executionId": execution_id, "executionState": row.get("executionState")})
    _turn_running(conn, session_id, turn_id)
    conn.execute(
        "UPDATE plan_approvals SET execution_state = 'running', execution_turn_id = ?, execution_started_at = ?, "
        "updated_at = ? WHERE execution_id = ? AND execution_state = 'queued'",
        (turn_id, now_ms, now_ms, execution_id))
    return get_execution(conn, session_id, execution_id)


def _end(conn: sqlite3.Connection, execution_id: str, outcome: str, error_code: str | None, now_ms: int) -> None:
    conn.execute(
        "UPDATE plan_approvals SET execution_state = ?, execution_outcome = ?, execution_error_code = ?, "
        f"execution_ended_at = ?, updated_at = ? WHERE execution_id = ? AND {EXECUTION_MAY_RUN}",
        ("completed" if outcome == "completed" else "interrupted", outcome, error_code, now_ms, now_ms, execution_id))


def finish_execution(conn: sqlite3.Connection, session_id: str, execution_id: str, *, turn_id: str | None,
                     outcome: str, error_code: str | None, now_ms: int) -> dict[str, Any]:
    """running → completed | failed | cancelled (by its own turn); queued → cancelled (before it ran)."""
    if outcome not in EXECUTION_OUTCOMES:
        raise InvalidInput("outcome must be completed, failed or cancelled", data={"field": "outcome"})
    row = _raw_execution(conn, session_id, execution_id)
    state = row.get("executionState")
    if state not in (None, "queued", "running", *EXECUTION_OUTCOMES, "interrupted"):
        # damaged: it may be running. Bound to a turn, it ran there (only that turn ends it); else it had not.
        state = "running" if row.get("executionTurnId") is not None else "queued"
    if state == "queued":
        if outcome != "cancelled":
            raise Conflict(f"execution {execution_id} has not started: it can only be cancelled",
                           data={"executionId": execution_id, "executionState": state})
    elif state == "running":
        if turn_id != row.get("executionTurnId"):
            raise Conflict(f"execution {execution_id} runs in turn {row.get('executionTurnId')}, not {turn_id}",
                           data={"executionId": execution_id, "turnId": row.get("executionTurnId")})
    else:
        raise Conflict(f"execution {execution_id} already ended ({state})",
                       data={"executionId": execution_id, "executionState": state})
    _end(conn, execution_id, outcome, error_code, now_ms)
    return get_execution(conn, session_id, execution_id)


def settle_for_turn(conn: sqlite3.Connection, session_id: str, turn_id: str, turn_status: str,
                    error_code: str | None, now_ms: int) -> list[dict[str, Any]]:
    """The executing turn ended without finishing its execution: completed → completed,
    error → failed, aborted → cancelled."""
    outcome = {"completed": "completed", "error": "failed", "aborted": "cancelled"}[turn_status]
    ids = [r[0] for r in conn.execute(
        "SELECT execution_id FROM plan_approvals WHERE session_id = ? AND execution_turn_id = ? "
        f"AND {EXECUTION_MAY_RUN} AND execution_state != 'queued'", (session_id, turn_id))]
    for execution_id in ids:
        _end(conn, execution_id, outcome, error_code if outcome != "completed" else None, now_ms)
    ended = [conn.execute(f"SELECT {_COLS} FROM plan_approvals WHERE execution_id = ?", (e,)).fetchone()
             for e in ids]
    return readable(ended, _checked, lambda r: str(r[0])).items  # a damaged one ends unannounced, never unended


def active_contract(conn: sqlite3.Connection, session_id: str, now_ms: int) -> dict[str, Any] | None:
    """The session's live pending approval, else its queued/running execution (what a mode change must keep);
    a pending row past its deadline holds nothing (seed 003 §4.5: expiry returns planning to editable)."""
    row = conn.execute(
        f"SELECT {_COLS} FROM plan_approvals WHERE session_id = ? AND ({LIVE_PENDING} "
        f"OR {EXECUTION_MAY_RUN}) "
        "ORDER BY status = 'pending' DESC, created_at DESC LIMIT 1", (session_id, now_ms)).fetchone()
    return _row(row) if row else None  # raw: a damaged one holds the session all the same
