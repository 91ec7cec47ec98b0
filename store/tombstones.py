"""Message tombstones (seed 000 §3.3): hide a message without rewriting the file.

A tombstone is one transcript line::

    {"type":"tombstone","id":"<tombstone id>","messageId":"m1","deleted":true,"createdAt":"…"}

``deleted: false`` is a restore. The newest line per ``messageId`` wins, so
delete and restore are both O(1) appends. The index mirrors the state in
``messages.deleted`` (search and model context skip those rows); boot
reconcile rebuilds the flag from the lines.

A whole-file rewrite keeps only the state of surviving messages: it writes one
``deleted: true`` line after each surviving tombstoned message
(:func:`tombstone_lines_for`) and drops the history of restores. Pure
functions, no I/O, but :func:`line_id` (one line read).

A tombstone names the message as its transcript line does. Only a line whose
index row took the D444 spelling ``{sessionId}:{id}`` without the line itself
being remapped (two sessions wrote the same new id at once, or a transcript
copied by hand) is spelled differently in the index: the tombstone names the
line's id, and the index resolves it like a client's id (``index.set_deleted``),
so every reader of the transcript (context, tree, rewrites) agrees with the index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from store.jsonio import dumps_line, loads_line
from store.transcripts.records import ms_to_rfc3339
from store.transcripts.transcript import read_spans

TOMBSTONE = "tombstone"


def tombstone_record(tombstone_id: str, message_id: str, deleted: bool, *, created_at_ms: int,
                     receipt: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The line record (``type`` first, ``id`` second, as every line); ``receipt``: the command
    receipt of the request that writes it (``receipts.file_record``), durable with it."""
    rec: dict[str, Any] = {
        "type": TOMBSTONE,
        "id": tombstone_id,
        "messageId": message_id,
        "deleted": deleted,
        "createdAt": ms_to_rfc3339(created_at_ms),
    }
    if receipt is not None:
        rec["receipt"] = dict(receipt)
    return rec


def tombstone_line(tombstone_id: str, message_id: str, deleted: bool, *, created_at_ms: int,
                   receipt: Mapping[str, Any] | None = None) -> bytes:
    return dumps_line(tombstone_record(tombstone_id, message_id, deleted, created_at_ms=created_at_ms,
                                       receipt=receipt))


def deleted_ids(tombstones: Mapping[str, Mapping[str, Any] | bool]) -> set[str]:
    """Message ids whose newest tombstone says ``deleted`` (a record or a plain flag per id)."""
    out: set[str] = set()
    for mid, value in tombstones.items():
        flag = value if isinstance(value, bool) else value.get("deleted", True) is True
        if flag:
            out.add(mid)
    return out


def tombstone_lines_for(
    records: Sequence[Mapping[str, Any]],
    deleted: Iterable[str],
    *,
    created_at_ms: int = 0,
    id_for: Callable[[str], str] | None = None,
) -> list[tuple[str, bytes]]:
    """``(messageId, line)`` for each record in ``records`` whose id is in ``deleted``, in record order.

    What a rewrite writes right after each surviving tombstoned message, so a
    rebuild from the new file restores the flag. ``id_for(message_id)`` names
    the tombstone (default ``t-<messageId>``).
    """
    wanted = set(deleted)
    out: list[tuple[str, bytes]] = []
    for rec in records:
        mid = rec.get("id")
        if not isinstance(mid, str) or mid not in wanted:
            continue
        tid = id_for(mid) if id_for is not None else f"t-{mid}"
        out.append((mid, tombstone_line(tid, mid, True, created_at_ms=created_at_ms)))
    return out


__all__ = [
    "TOMBSTONE",
    "deleted_ids",
    "tombstone_line",
    "tombstone_lines_for",
    "tombstone_record",
]


def message_state(conn: Any, session_id: str, message_id: str) -> dict[str, Any] | None:
    """The index's view of one message: its MessageRef and whether it is tombstoned."""
    row = conn.execute(
        "SELECT seq, role, created_at, turn_id, deleted FROM messages WHERE session_id = ? AND id = ?",
        (session_id, message_id),
    ).fetchone()
    if row is None:
        return None
    return {"ref": {"id": message_id, "sessionId": session_id, "seq": row[0], "role": row[1], "createdAt": row[2],
                    "turnId": row[3]}, "deleted": bool(row[4])}


def line_id(conn: Any, path: Any, session_id: str, stored: str) -> str:
    """The id the transcript line of the message stored as ``stored`` carries (see the module
    docstring): ``stored`` unless it is a D444 spelling the line does not have."""
    prefix = f"{session_id}:"
    if not stored.startswith(prefix):
        return stored
    row = conn.execute("SELECT line_offset, line_len FROM messages WHERE session_id = ? AND id = ?",
                       (session_id, stored)).fetchone()
    if row is None or row[0] is None:
        return stored
    try:
        got = loads_line(read_spans(path, [(int(row[0]), int(row[1]))])[0]).get("id")
    except ValueError:
        return stored
    return got if isinstance(got, str) and prefix + got == stored else stored
