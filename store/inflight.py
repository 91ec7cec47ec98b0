"""In-flight checkpoints (seed 003 §2.1, D299/D327) and their boot promotion.

``sessions/<id>.inflight.json`` holds the assistant reply currently streaming
in a session as one ``{schema, sessionId, turnId, savedAt, message, crc32}`` object
(``savedAt`` an RFC 3339 time like every time in a file; integer ms from an earlier build still reads),
replaced atomically (temp + fsync + rename + dirsync) on every save. ``crc32``
(RELIABILITY rule 9) is the CRC-32 of the file's bytes before it, closed with
``}``: a checkpoint whose bytes changed on disk and still parse (a flipped bit
in the reply's text) is quarantined, never promoted as the reply; a file
without it (written before it existed) is read as before. It is
transient: the final row's append removes it, a completed/error turn end
removes it once its id is indexed as a settled row, and the boot sweep
promotes a leftover whose final row never landed. Synchronous, no trio.

Promotion order (crash-safe, deduplicating): append the promoted line to the
transcript (file first, fsync) → index it in one transaction (the normal
reconcile of the file tail, plus an audit record) → remove the checkpoint. A
crash anywhere in between leaves the checkpoint; the next sweep finds the id
indexed as a settled row and only removes it, and a line appended twice is
deduplicated keep-last at the first position like every other repeated id.

A streaming reservation (an assistant row appended with ``meta.status:
"streaming"``, seed 003 "Active-turn steering") whose checkpoint never came (a
client that died between the two, a plugin that never checkpoints) is settled
by the same boot sweep from its own line, the same way and through the same
steps (:func:`settle_reservations`); otherwise no reader could tell it from a
live stream.
"""

from __future__ import annotations

import os
import re
import sqlite3
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from store.errors import CorruptData, StoreError
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, fsync_dir, remove_file_durable
from store.ids import remapped_message_id
from store.indexing import index
from store.indexing.database import disk_full
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line, loads_line
from store.rules import SESSION_ID_RE
from store.transcripts.records import blocks_of, is_streaming, ms_to_rfc3339, rfc3339_ms
from store.transcripts.transcript import TranscriptWriter, read_spans

SCHEMA = 1
SUFFIX = ".inflight.json"
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024

IndexedState = Literal["absent", "streaming", "settled"]


@dataclass(frozen=True)
class Checkpoint:
    session_id: str
    turn_id: str
    saved_at: int
    message: dict[str, Any]

    @property
    def message_id(self) -> str:
        return str(self.message.get("id"))


# ---------------------------------------------------------------------------
# the file


def has_visible_content(message: Mapping[str, Any]) -> bool:
    """False for an empty reply: no blocks, or only text/thinking blocks without text."""
    for block in blocks_of(message):
        if not isinstance(block, Mapping):
            continue
        if block.get("type") in ("text", "thinking"):
            text = block.get("text")
            if isinstance(text, str) and text.strip():
                return True
            continue
        return True  # tool calls, attachments, unknown block kinds are content
    return False


_CRC_TAIL = re.compile(rb',"crc32":(\d{1,10})\}[ \t\r\n]*\Z')
"""How :func:`encode` ends a checkpoint: the CRC-32 of every byte before ``,"crc32"``, with ``}`` after."""


def encode(session_id: str, turn_id: str, saved_at_ms: int, message: Mapping[str, Any]) -> bytes:
    """The file's bytes. ``savedAt`` is spelled in RFC 3339 like every time in a file (seed 003 §2.1);
    :class:`Checkpoint` and the wire keep integer ms."""
    body = {"schema": SCHEMA, "sessionId": session_id, "turnId": turn_id, "savedAt": ms_to_rfc3339(saved_at_ms),
            "message": dict(message)}
    try:
        data = orjson.dumps(body)
    except TypeError as exc:
        raise CorruptData(f"checkpoint cannot be encoded: {exc}") from None
    return data[:-1] + b',"crc32":%d}' % zlib.crc32(data)


def _check_crc(path: str | os.PathLike[str], data: bytes, body: Mapping[str, Any]) -> None:
    """``CorruptData`` when the checkpoint carries a CRC its bytes do not match (or one not where
    :func:`encode` puts it); a checkpoint without one (an earlier build's) passes."""
    if "crc32" not in body:
        return
    tail = _CRC_TAIL.search(data)
    if tail is None or zlib.crc32(data[:tail.start()] + b"}") != int(tail.group(1)):
        raise CorruptData(f"checkpoint {os.fspath(path)} does not match its CRC-32: its bytes changed on disk",
                          data={"reason": "checksum_mismatch"})


def write_checkpoint(
    path: str | os.PathLike[str],
    session_id: str,
    turn_id: str,
    saved_at_ms: int,
    message: Mapping[str, Any],
    *,
    faults: Faults = NO_FAULTS,
) -> None:
    """Atomically replace the checkpoint (wholly old or wholly new after a crash)."""
    atomic_write(path, encode(session_id, turn_id, saved_at_ms, message), faults=faults,
                 point_prefix="inflight")


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint | None:
    """The checkpoint, None when there is none; ``CorruptData`` when it cannot be interpreted."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_CHECKPOINT_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise CorruptData(f"checkpoint {os.fspath(path)} is larger than {MAX_CHECKPOINT_BYTES} bytes")
    try:
        body = loads_line(data)
    except ValueError as exc:
        raise CorruptData(f"checkpoint {os.fspath(path)} is not a JSON object: {exc}") from None
    _check_crc(path, data, body)
    msg = body.get("message")
    if (body.get("schema") != SCHEMA or not isinstance(msg, dict) or not isinstance(msg.get("id"), str)
            or not isinstance(body.get("sessionId"), str) or not isinstance(body.get("turnId"), str)):
        raise CorruptData(f"checkpoint {os.fspath(path)} does not have the schema-{SCHEMA} shape")
    return Checkpoint(body["sessionId"], body["turnId"], _saved_at_ms(body.get("savedAt")), msg)


def _saved_at_ms(value: object) -> int:
    """The checkpoint's time in ms: an RFC 3339 string, or the integer ms an earlier build wrote; 0 when it
    is neither (the time is informative only: nothing is refused for it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return rfc3339_ms(value) or 0


def checkpoint_message_id(path: str | os.PathLike[str]) -> str | None:
    try:
        cp = read_checkpoint(path)
    except CorruptData:
        return None
    return None if cp is None else cp.message_id


def remove_checkpoint(path: str | os.PathLike[str]) -> bool:
    return remove_file_durable(path)


# ---------------------------------------------------------------------------
# what the index holds for the checkpoint's message


def line_state(blob: bytes | None) -> IndexedState:
    """Classify the indexed transcript line of a message id (None = not indexed)."""
    if blob is None:
        return "absent"
    try:
        rec = loads_line(blob)
    except ValueError:
        return "absent"  # a stale span: treat as not landed, promotion dedupes by id
    # only an assistant line streams: a checkpoint never replaces a user's or a tool's row
    return "streaming" if is_streaming(rec) and rec.get("role") == "assistant" else "settled"


def indexed_state(conn: sqlite3.Connection, session_id: str, transcript: Path, message_id: str) -> IndexedState:
    found = index.lookup_ids(conn, [message_id]).get(message_id)
    if found is None or found[0] != session_id:
        return "absent"
    try:
        blob = read_spans(transcript, [(found[2], found[3])])[0]
    except StoreError:
        return "absent"
    return line_state(blob)


def remapped_id(session_id: str, message_id: str) -> str:
    """The id the append path gives a message whose id another session owns (D444)."""
    return remapped_message_id(session_id, message_id)


def promoted_record(cp: Checkpoint, *, turn_completed: bool) -> dict[str, Any]:
    """The transcript record a leftover checkpoint becomes (complete or aborted)."""
    msg = dict(cp.message)
    rec: dict[str, Any] = {"type": "message", "id": msg.pop("id")}
    msg.pop("type", None)
    rec.update(msg)
    rec.setdefault("turnId", cp.turn_id)
    meta = dict(msg["meta"]) if isinstance(msg.get("meta"), Mapping) else {}
    meta.pop("receipt", None)
    if turn_completed:
        meta["status"] = "completed"
        meta.pop("interrupted", None)
    else:
        meta["status"] = "aborted"
        meta["interrupted"] = True
    meta["recoveredFrom"] = "inflight"
    rec["meta"] = meta
    return rec


# ---------------------------------------------------------------------------
# boot sweep


def _quarantine(path: Path, quarantine_dir: Path, now_ms: int) -> str:
    """``path`` moved to ``<quarantine>/<name>.<now_ms>`` (``-<n>`` when taken: a clock stepped back onto
    an earlier boot's stamp must not replace what that boot set aside)."""
    target = quarantine_dir / f"{path.name}.{now_ms}"
    n = 1
    while os.path.lexists(target):
        target = quarantine_dir / f"{path.name}.{now_ms}-{n}"
        n += 1
    os.replace(path, target)
    fsync_dir(path.parent)
    fsync_dir(quarantine_dir)
    return str(target)


def sweep(
    conn: sqlite3.Connection,
    *,
    sessions_dir: Path,
    quarantine_dir: Path,
    transcript_path: Callable[[str], Path],
    now_ms: int,
    faults: Faults = NO_FAULTS,
    reservations_since_ms: int | None = None,
) -> dict[str, Any]:
    """Settle every leftover checkpoint (boot, after reconcile; ``conn`` in autocommit mode), then, given
    ``reservations_since_ms``, every streaming reservation no checkpoint settled (:func:`settle_reservations`)."""
    report: dict[str, Any] = {"promoted": 0, "promotedIds": [], "removed": 0, "quarantined": [], "errors": []}
    names = sorted(n for n in os.listdir(sessions_dir) if n.endswith(SUFFIX))
    for name in names:
        sid = name[: -len(SUFFIX)]
        if not SESSION_ID_RE.fullmatch(sid):
            continue
        path = sessions_dir / name
        try:
            _settle(conn, sid, path, quarantine_dir, transcript_path(sid), now_ms, faults, report)
        except (StoreError, sqlite3.Error, OSError) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if disk_full(exc):
                raise  # boot fails STORAGE_FULL: serving before the reply lands would order later lines before it
            report["errors"].append({"sessionId": sid, "error": f"{type(exc).__name__}: {exc}"})
    if reservations_since_ms is not None:
        settle_reservations(conn, sessions_dir=sessions_dir, transcript_path=transcript_path,
                            since_ms=reservations_since_ms, now_ms=now_ms, report=report, faults=faults)
    return report


@dataclass(frozen=True)
class Settlement:
    """What to do with a session's leftover checkpoint (the boot sweep and ``recoverInflight``)."""

    action: Literal["none", "quarantine", "remove", "promote"]
    checkpoint: Checkpoint | None = None
    record: dict[str, Any] | None = None
    """``promote``: the transcript record the checkpoint becomes."""


def plan_settlement(conn: sqlite3.Connection, sid: str, path: Path, transcript: Path) -> Settlement:
    """Decide a leftover checkpoint's fate from what the index holds (reads only).

    * no file → ``none``;
    * unreadable, another session's, or its session/transcript gone → ``quarantine``;
    * its message id (or the D444 spelling) is indexed as a settled row → ``remove``;
    * otherwise ``promote``: complete when its turn completed, else aborted.
    """
    try:
        cp = read_checkpoint(path)
    except CorruptData:
        return Settlement("quarantine")
    if cp is None:
        return Settlement("none")
    exists = conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is not None
    if cp.session_id != sid or not exists or not transcript.exists():
        return Settlement("quarantine", cp)
    owner = index.lookup_ids(conn, [cp.message_id]).get(cp.message_id)
    if owner is not None and owner[0] != sid:
        cp = Checkpoint(cp.session_id, cp.turn_id, cp.saved_at,
                        {**cp.message, "id": remapped_id(sid, cp.message_id)})
    if indexed_state(conn, sid, transcript, cp.message_id) == "settled":
        return Settlement("remove", cp)
    status = conn.execute("SELECT status FROM turns WHERE id = ? AND session_id = ?",
                          (cp.turn_id, sid)).fetchone()
    return Settlement("promote", cp, promoted_record(cp, turn_completed=bool(status and status[0] == "completed")))


def quarantine_checkpoint(path: Path, quarantine_dir: Path, now_ms: int) -> str:
    """Move an unusable checkpoint aside (never deleted); returns where it went."""
    return _quarantine(path, quarantine_dir, now_ms)


def record_promotion(conn: sqlite3.Connection, sid: str, settlement: Settlement, now_ms: int, *,
                     reason: str = "boot", source: str = "checkpoint") -> None:
    """The audit record of a promotion (inside the transaction that indexes the line); ``source``
    ``reservation``: a streaming row settled from its own content (no checkpoint)."""
    cp, rec = settlement.checkpoint, settlement.record
    assert cp is not None and rec is not None
    payload: dict[str, Any] = {"messageId": cp.message_id, "turnId": cp.turn_id, "status": rec["meta"]["status"],
                               "savedAt": cp.saved_at, "reason": reason}
    if source != "checkpoint":
        payload["from"] = source
    conn.execute(
        "INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, 'inflight_promoted', ?, ?)",
        (now_ms, sid, orjson.dumps(payload).decode()),
    )


def promotion_recorded(conn: sqlite3.Connection, sid: str, message_id: str) -> bool:
    """Whether the audit record of a promotion of ``message_id`` committed (the promoted line is written
    first: a failure between the two leaves the line without it)."""
    return conn.execute(
        "SELECT 1 FROM audit_log WHERE session_id = ? AND kind = 'inflight_promoted' "
        "AND json_extract(payload_json, '$.messageId') = ? LIMIT 1", (sid, message_id),
    ).fetchone() is not None


def _settle(conn: sqlite3.Connection, sid: str, path: Path, quarantine_dir: Path, transcript: Path,
            now_ms: int, faults: Faults, report: dict[str, Any]) -> None:
    settlement = plan_settlement(conn, sid, path, transcript)
    if settlement.action == "none":
        return
    if settlement.action == "quarantine":
        report["quarantined"].append(_quarantine(path, quarantine_dir, now_ms))
        return
    if settlement.action == "remove":
        remove_checkpoint(path)  # the final row landed; the checkpoint is stale
        report["removed"] += 1
        return
    _promote(conn, sid, transcript, settlement, now_ms, faults, report)
    faults.point("inflight.before_remove")
    remove_checkpoint(path)


def _promote(conn: sqlite3.Connection, sid: str, transcript: Path, settlement: Settlement, now_ms: int,
             faults: Faults, report: dict[str, Any], *, source: str = "checkpoint") -> None:
    """Append the settled line (file first, fsync), then index it with its audit record in one transaction."""
    cp, rec = settlement.checkpoint, settlement.record
    assert cp is not None and rec is not None
    line = dumps_line(rec)
    writer = TranscriptWriter.open(transcript, faults=faults)
    try:
        writer.append([line])
    finally:
        writer.close()
    faults.point("inflight.after_append")
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT indexed_len, file_epoch FROM sessions WHERE id = ?", (sid,)).fetchone()
        plan = plan_reconcile(transcript, int(row[0] or 0), row[1])
        apply_plan(conn, sid, plan, now_ms=now_ms)
        record_promotion(conn, sid, settlement, now_ms, source=source)
        faults.point("inflight.before_commit")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    report["promoted"] += 1
    promoted = {"sessionId": sid, "messageId": cp.message_id, "status": rec["meta"]["status"]}
    if source != "checkpoint":
        promoted["from"] = source
    report["promotedIds"].append(promoted)


# ---------------------------------------------------------------------------
# streaming reservations that never got a checkpoint


def reservations_since(conn: sqlite3.Connection, since_ms: int) -> list[tuple[str, str, str, str, int, int, int]]:
    """Assistant rows of the turns that ended at or after ``since_ms`` (every turn the fence just ended
    and every turn that ended while the previous host ran): the only rows that can still be a streaming
    reservation. ``(session_id, message_id, turn_id, turn_status, created_at, line_offset, line_len)``,
    by session and seq; whether each is still streaming is its transcript line's to say."""
    rows = conn.execute(
        "SELECT m.session_id, m.id, t.id, t.status, m.created_at, m.line_offset, m.line_len FROM turns t "
        "JOIN messages m ON m.turn_id = t.id AND m.session_id = t.session_id "
        "WHERE t.ended_at >= ? AND t.status != 'running' AND m.role = 'assistant' AND m.deleted = 0 "
        "AND m.line_offset IS NOT NULL ORDER BY m.session_id, m.seq",
        (since_ms,),
    ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows]


def plan_reservation(conn: sqlite3.Connection, sid: str, transcript: Path, turn_id: str) -> Settlement:
    """``session.recoverInflight`` with no checkpoint on disk: the turn's newest streaming reservation (an
    assistant row of ``turn_id`` whose line still says ``meta.status: "streaming"``), settled from its own
    content as :func:`settle_reservations` settles it at boot (``promote``); ``none`` when the turn has no
    such row. Reads only (the index and the rows' spans of the transcript)."""
    rows = conn.execute(
        "SELECT m.created_at, m.line_offset, m.line_len, t.status FROM messages m "
        "JOIN turns t ON t.id = m.turn_id AND t.session_id = m.session_id "
        "WHERE m.session_id = ? AND m.turn_id = ? AND m.role = 'assistant' AND m.deleted = 0 "
        "AND m.line_offset IS NOT NULL ORDER BY m.seq DESC",
        (sid, turn_id),
    ).fetchall()
    if not rows:
        return Settlement("none")
    for row, blob in zip(rows, read_spans(transcript, [(int(r[1]), int(r[2])) for r in rows]), strict=True):
        if b'"streaming"' in blob and line_state(blob) == "streaming":
            cp = Checkpoint(sid, turn_id, int(row[0]), loads_line(blob))
            return Settlement("promote", cp, promoted_record(cp, turn_completed=row[3] == "completed"))
    return Settlement("none")


def settle_reservations(
    conn: sqlite3.Connection,
    *,
    sessions_dir: Path,
    transcript_path: Callable[[str], Path],
    since_ms: int,
    now_ms: int,
    report: dict[str, Any],
    faults: Faults = NO_FAULTS,
) -> None:
    """Settle every streaming reservation (an assistant row still ``meta.status: "streaming"``) whose turn
    has ended and that no checkpoint settled (boot, after :func:`sweep`): the row is promoted from its own
    content exactly as a leftover checkpoint is (:func:`promoted_record`): complete when its turn
    completed, otherwise aborted + interrupted, in its position (the line is appended with the same id and
    read keep-last at the first position). A session whose checkpoint is still on disk (its sweep failed)
    is left to the next boot, whose checkpoint promotion must not find the row settled already."""
    by_session: dict[str, list[tuple[str, str, str, str, int, int, int]]] = {}
    for row in reservations_since(conn, since_ms):
        by_session.setdefault(row[0], []).append(row)
    for sid, rows in by_session.items():
        if (sessions_dir / f"{sid}{SUFFIX}").exists():
            continue
        transcript = transcript_path(sid)
        try:
            lines = read_spans(transcript, [(r[5], r[6]) for r in rows])
            for row, blob in zip(rows, lines, strict=True):
                if b'"streaming"' not in blob or line_state(blob) != "streaming":  # most lines are never parsed
                    continue
                _, _, turn_id, turn_status, created_at, _, _ = row
                cp = Checkpoint(sid, turn_id, created_at, loads_line(blob))
                rec = promoted_record(cp, turn_completed=turn_status == "completed")
                _promote(conn, sid, transcript, Settlement("promote", cp, rec), now_ms, faults, report,
                         source="reservation")
        except (StoreError, sqlite3.Error, OSError, ValueError) as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if disk_full(exc):
                raise
            report["errors"].append({"sessionId": sid, "error": f"{type(exc).__name__}: {exc}"})
