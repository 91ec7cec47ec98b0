"""Boot: a plan approval whose mode line reached the transcript before its row changed (seed 003 §4.6a).

``plans.respond`` (approve) writes the session's ``session_info`` line first (mode ``agent``, the target
permission mode, the call's receipt, :data:`store.plans.APPROVAL_KEY` naming the request), fsynced, then
approves the row. Killed between the two, the session runs in agent mode with no approval behind it; the
fence would interrupt the request and the retry be refused. Before the fence, the line's approval is
applied and its receipt stored with the answer, as recorded decisions are (``store.approvals``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store import plans, receipts
from store.errors import StoreError
from store.indexing.index import public_session, require_session
from store.transcripts.records import rfc3339_to_ms
from store.transcripts.transcript import lines_naming

__all__ = ["apply_recorded_approvals"]


def _find_approval_lines(path: Path, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The ``session_info`` line naming each approval of ``ids``, when it still sets the session's mode
    (the newest ``session_info`` line says ``agent``: an approve that failed in the host was undone by a
    later line restoring the previous mode, and is not applied). A whole-file scan; boot only."""
    found: dict[str, dict[str, Any]] = {}
    mode: Any = None
    for rec in lines_naming(path, b'"session_info"'):
        if rec.get("type") != "session_info":
            continue
        mode = rec.get("mode", mode)
        note = rec.get(plans.APPROVAL_KEY)
        if isinstance(note, dict) and note.get("requestId") in ids:
            found[str(note["requestId"])] = rec
    return found if mode == "agent" else {}


def apply_recorded_approvals(conn: sqlite3.Connection, transcript_of: Callable[[str], Path], now_ms: int) -> int:
    """Boot, before the fence: a pending plan whose approval's mode line reached its transcript is approved.

    (The host died after the line was fsynced and before the row changed: the session already runs in
    ``agent`` mode with the target permission from that line; interrupting the request would leave the
    raised permission with no approval behind it, and the retry refused.) The receipt the line carries is
    stored with the response the approval would have given.
    """
    applied = 0
    pending = conn.execute("SELECT request_id, session_id FROM plan_approvals WHERE status = 'pending'").fetchall()
    by_session: dict[str, set[str]] = {}
    for request_id, sid in pending:
        by_session.setdefault(str(sid), set()).add(str(request_id))
    for sid, ids in sorted(by_session.items()):
        for request_id, rec in sorted(_find_approval_lines(transcript_of(sid), ids).items()):
            note = rec[plans.APPROVAL_KEY]
            target = note.get("targetPermissionMode")
            at = rfc3339_to_ms(rec.get("updatedAt"), now_ms)
            try:
                approval = plans.approve(
                    conn, request_id, target_permission_mode=target if isinstance(target, str) else None,
                    execution_id=str(note.get("executionId") or f"exec_{request_id}"), now_ms=at)
            except StoreError:
                continue  # expired by then: the fence's rules apply
            key = receipts.key_of_record(rec.get("receipt"))
            if key is not None and not receipts.exists(conn, key.client_id, key.submission_id):
                session = public_session(require_session(conn, sid))
                receipts.store(conn, key, {"approval": approval, "session": session}, session_id=sid, now_ms=at)
            applied += 1
    return applied
