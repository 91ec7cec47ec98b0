"""Turn rows (seed 003 §4.6): start, terminal update with usage rollup, projection.

SQL only, inside the caller's transaction. A turn is ``running`` until its
first terminal update (``completed | aborted | error``); after that it is
settled: repeating the same terminal status is a no-op (no second
notification), a different one is refused with ``CONFLICT`` (a stale
response, e.g. after the boot fence aborted the turn). A turn in a Plan/Goal
session that a running task run is bound to is refused with
``PLAN_REQUIRES_INTERACTIVE_SESSION`` (seed 003 §4.11, ``store.tasks.require_interactive``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from store import notifications, queue, tasks
from store.errors import Conflict, InvalidInput, NotFound
from store.jsonio import Readable, loads_stored, readable, stored_value
from store.rules import TURN_ENDED, TURN_INDEX_LOST, turn_may_be_running
from store.snapshots import PreparedSnapshot, store_snapshot
from store.stamps import after_newest
from store.transcripts.records import rfc3339_to_ms
from store.usage import cost_micros

TERMINAL = TURN_ENDED
STATUSES = ("running", *TERMINAL)
INTERRUPTED = "INTERRUPTED"  # error_code the boot fence gives the turns it aborts
INDEX_LOST = TURN_INDEX_LOST
"""error_code of a turn row rebuilt from the transcript lines that name it (:func:`restore_named`): its row
went with a lost database, and how it ended went with it. It is ``aborted`` (no lost turn runs on: one that
was running would have been fenced), with no usage; its start retried answers it as it stands, its end
retried settles it once as a running turn's would (``start_turn``, ``end_turn``)."""

_COLUMNS = (
    "t.id, t.session_id, t.status, t.provider_id, t.model_id, t.error_code, t.input_tokens, "
    "t.output_tokens, t.usage_json, t.started_at, t.ended_at, "
    "(SELECT digest FROM run_snapshots r WHERE r.turn_id = t.id), t.cost_micros, t.retry_of"
)


@dataclass(frozen=True)
class EndOutcome:
    turn: dict[str, Any]
    notification: dict[str, Any] | None
    changed: bool


def _turn_dict(row: tuple[Any, ...]) -> dict[str, Any]:
    (tid, sid, status, provider, model, error_code, tin, tout, usage_json, started, ended, digest, micros,
     retry_of) = row
    return {
        "id": tid,
        "sessionId": sid,
        "status": stored_value(status, STATUSES, f"turn {tid}'s status"),
        "providerId": provider,
        "modelId": model,
        "errorCode": error_code,
        "inputTokens": tin,
        "outputTokens": tout,
        "usage": loads_stored(usage_json, f"turn {tid}'s usage_json", dict) if usage_json else None,
        "startedAt": started,
        "endedAt": ended,
        "environmentDigest": digest,
        "costMicros": micros,
        "retryOf": retry_of,
    }


def get_turn(conn: sqlite3.Connection, turn_id: str) -> dict[str, Any] | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM turns t WHERE t.id = ?", (turn_id,)).fetchone()
    return _turn_dict(row) if row else None


def turns_by_id(conn: sqlite3.Connection, turn_ids: list[str]) -> Readable[dict[str, Any]]:
    """These turns in this order (a page of ``session.listTurns``); a turn whose record is damaged is named in
    ``unreadable`` instead. An id with no row (deleted since) is left out."""
    rows = [row for tid in turn_ids
            if (row := conn.execute(f"SELECT {_COLUMNS} FROM turns t WHERE t.id = ?", (tid,)).fetchone())]
    return readable(rows, _turn_dict, lambda r: str(r[0]))


def turn_not_found(session_id: str, turn_id: str | None) -> NotFound:
    """What a turn-addressed method answers for a turn id the session does not have."""
    return NotFound(f"turn {turn_id} not found in session {session_id}",
                    data={"sessionId": session_id, "turnId": turn_id})


def require_turn(conn: sqlite3.Connection, session_id: str, turn_id: str) -> dict[str, Any]:
    turn = get_turn(conn, turn_id)
    if turn is None or turn["sessionId"] != session_id:
        raise turn_not_found(session_id, turn_id)
    return turn


def start_turn(
    conn: sqlite3.Connection,
    *,
    session_id: str,
    turn_id: str,
    provider_id: str | None,
    model_id: str | None,
    snapshot: PreparedSnapshot | None,
    now_ms: int,
    retry_of: str | None = None,
    client_id: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Insert a ``running`` turn. Returns (turn, created).

    ``retry_of`` (retry lineage): an earlier, ended turn of the same session this one retries.
    ``client_id``: who starts it; the queue entry that client took, if any, goes with the turn.

    Starting an id again in the same session while it is still running with
    the same snapshot returns the existing row (a retry), and so does starting
    a turn the index rebuilt from its lines after a lost database (``INDEX_LOST``:
    the retry of a start whose receipt went with the database; the turn is
    answered as it stands, never started again); anything else is a
    CONFLICT, and so is a new turn while another one of the session is still
    running (one running turn per session). Provider/model default to the session's current binding (the
    snapshot at run time). A new turn in a Plan/Goal session while a task run bound to it is running is
    ``PLAN_REQUIRES_INTERACTIVE_SESSION``: it would be the unattended run doing contract work (§4.11).
    """
    existing = get_turn(conn, turn_id)
    if existing is not None and existing["sessionId"] == session_id and existing["errorCode"] == INDEX_LOST:
        return existing, False  # a start from before the database was lost: the turn is not run again
    if existing is not None:
        same = (existing["sessionId"] == session_id and existing["status"] == "running"
                and existing["environmentDigest"] == (snapshot.digest if snapshot else None)
                and existing["retryOf"] == retry_of)
        if same:
            return existing, False
        raise Conflict(
            f"turn {turn_id} already exists ({existing['status']} in session {existing['sessionId']})",
            data={"turnId": turn_id, "status": existing["status"]},
        )
    row = conn.execute("SELECT provider_id, model_id, mode FROM sessions WHERE id = ?", (session_id,)).fetchone()
    if row is not None:
        # Before any provider work: the session may have been switched to Plan/Goal after its run started.
        tasks.require_interactive(conn, session_id, row[2], work="start a turn")
        provider_id = provider_id if provider_id is not None else row[0]
        model_id = model_id if model_id is not None else row[1]
    if retry_of is not None:
        earlier = get_turn(conn, retry_of)
        if earlier is None or earlier["sessionId"] != session_id:
            raise NotFound(f"turn {retry_of} (retryOf) not found in session {session_id}",
                           data={"turnId": retry_of, "field": "retryOf"})
        if earlier["status"] == "running":
            raise Conflict(f"turn {retry_of} is still running; a retry starts after it ended",
                           data={"turnId": retry_of, "status": "running"})
    running = conn.execute(f"SELECT id, status FROM turns WHERE session_id = ? AND {turn_may_be_running()} "
                           "ORDER BY status = 'running' DESC LIMIT 1", (session_id,)).fetchone()
    if running is not None:
        # One running turn per session (seed 003 §4.6b: prompts wait behind the active turn; a turn ends
        # before the next starts): a second start is refused, the running one is named. So is one whose
        # stored status is damaged: it may still be running (its end or the boot fence settles it).
        damaged = running[1] != "running"
        state = f"may still be running (its stored status {running[1]!r} is damaged)" if damaged \
            else "is still running"
        raise Conflict(
            f"turn {running[0]} {state} in session {session_id}; end it before starting {turn_id}",
            data={"sessionId": session_id, "turnId": turn_id, "runningTurnId": running[0],
                  **({"damaged": True} if damaged else {})},
        )
    conn.execute(
        "INSERT INTO turns(id, session_id, status, provider_id, model_id, started_at, retry_of) "
        "VALUES (?, ?, 'running', ?, ?, ?, ?)",
        (turn_id, session_id, provider_id, model_id, turn_started_at(conn, session_id, now_ms), retry_of),
    )
    if snapshot is not None:
        store_snapshot(conn, turn_id, snapshot, now_ms)
    queue.bind_lease(conn, session_id, turn_id, client_id)  # the entry the queue handed this client, if any
    turn = get_turn(conn, turn_id)
    assert turn is not None
    return turn, True


def turn_started_at(conn: sqlite3.Connection, session_id: str, now_ms: int) -> int:
    """A new turn's ``started_at``: ``now_ms``, but always after every turn of the session so far.

    The session's ``latestTurn`` and ``session.listTurns`` order its turns by ``(started_at, id)``, and
    turn ids are the caller's: on a clock stepped back the turn just started would not be the latest
    (the summary would show the previous, finished one) and would be listed under older turns."""
    return after_newest(conn, "SELECT MAX(started_at) FROM turns WHERE session_id = ?", (session_id,), now_ms)


def _token(usage: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def end_turn(
    conn: sqlite3.Connection,
    *,
    session_id: str,
    turn_id: str,
    status: str,
    error_code: str | None,
    usage: Mapping[str, Any] | None,
    create_notification: bool,
    now_ms: int,
) -> EndOutcome:
    """Settle a turn; for completed/error (and ``create_notification``) insert its notification.

    A turn rebuilt after a lost database (``INDEX_LOST``) is settled as a running one: the retried end
    says how it ended, which the lost row knew.

    Everything happens in the caller's transaction: the turn update, the
    notification insert (at most one per turn: ``turn_id`` is UNIQUE) and the
    newest-200 prune.
    """
    if status not in TERMINAL:
        raise InvalidInput(f"status must be one of {', '.join(TERMINAL)}", data={"field": "status"})
    if status == "completed" and error_code is not None:
        raise InvalidInput("errorCode is only valid for an error or aborted turn", data={"field": "errorCode"})
    found = turn_status(conn, turn_id)
    if found is None or found[2] != session_id or found[0] in STATUSES:
        turn = require_turn(conn, session_id, turn_id)
    else:  # a stored status outside its set: the turn may be running, and its end settles it as a running one
        turn = {"status": "running", "errorCode": found[1]}
    if turn["status"] != "running" and turn["errorCode"] != INDEX_LOST:
        if turn["status"] != status:
            raise Conflict(
                f"turn {turn_id} already ended as {turn['status']}; a later {status} update is stale",
                data={"turnId": turn_id, "status": turn["status"]},
            )
        return EndOutcome(turn, None, False)
    sets = ["status = ?", "ended_at = MAX(started_at, ?)", "error_code = ?"]  # never before its start
    args: list[Any] = [status, now_ms, error_code]
    if usage is not None:
        sets += ["input_tokens = ?", "output_tokens = ?", "usage_json = ?", "cost_micros = ?"]
        args += [_token(usage, "inputTokens", "input_tokens", "input"),
                 _token(usage, "outputTokens", "output_tokens", "output"),
                 orjson.dumps(dict(usage)).decode(), cost_micros(usage)]
    conn.execute(f"UPDATE turns SET {', '.join(sets)} WHERE id = ? AND ({turn_may_be_running()} OR error_code = ?)",
                 (*args, turn_id, INDEX_LOST))
    note = None
    if create_notification and status != "aborted":
        note = notifications.insert_for_turn(
            conn, session_id=session_id, turn_id=turn_id,
            kind="task.completed" if status == "completed" else "task.failed",
            error_code=error_code if status == "error" else None, now_ms=now_ms,
        )
    settled = get_turn(conn, turn_id)
    assert settled is not None
    return EndOutcome(settled, note, True)


def restore_named(conn: sqlite3.Connection, session_id: str, records: Iterable[Mapping[str, Any]]) -> list[str]:
    """After the database was lost (whole, or its newest commits: ``reconcile.restore_lost_turns`` picks the
    lines): a turn row (``aborted``, ``INDEX_LOST``) for each turn the session's lines name (``turnId``) that
    has no row, so the rebuilt messages link to their turn again and the
    turn is not started anew by a retried start. It spans the times of its lines. A turn another
    session's row holds is left alone. The ids it restored, in first-named order."""
    spans: dict[str, tuple[int, int]] = {}
    for rec in records:
        turn = rec.get("turnId")
        if not isinstance(turn, str) or not turn:
            continue
        at = rfc3339_to_ms(rec.get("createdAt"), 0)
        first, last = spans.get(turn, (at, at))
        spans[turn] = (min(first, at), max(last, at))
    return [turn for turn, (first, last) in spans.items() if conn.execute(
        "INSERT OR IGNORE INTO turns(id, session_id, status, error_code, started_at, ended_at) "
        "VALUES (?, ?, 'aborted', ?, ?, ?)", (turn, session_id, INDEX_LOST, first, last)).rowcount]


def turn_status(conn: sqlite3.Connection, turn_id: str) -> tuple[str, str | None, str] | None:
    """``(status, error_code, session_id)`` of a turn, or None."""
    row = conn.execute("SELECT status, error_code, session_id FROM turns WHERE id = ?", (turn_id,)).fetchone()
    return (row[0], row[1], row[2]) if row else None


def abort_running(conn: sqlite3.Connection, session_id: str, now_ms: int) -> list[str]:
    """A rewrite cut the reply a running turn was producing: the turn ends ``aborted`` (so does one whose stored
    status is damaged: it may be running). The ids it ended."""
    return [r[0] for r in conn.execute(
        "UPDATE turns SET status = 'aborted', ended_at = MAX(started_at, ?) WHERE session_id = ? "
        f"AND {turn_may_be_running()} RETURNING id",
        (now_ms, session_id),
    ).fetchall()]


def require_turn_exists(conn: sqlite3.Connection, turn_id: str) -> None:
    if conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone() is None:
        raise NotFound(f"turn {turn_id} not found", data={"turnId": turn_id})


def record_imported_usage(conn: sqlite3.Connection, *, session_id: str, turn_id: str, provider_id: str | None,
                          model_id: str | None, usage: Mapping[str, Any], at_ms: int) -> None:
    """The turn row of one imported assistant response, so ``usage.*`` counts imported history.

    An imported session has no host turns; each assistant message that carries usage (in the one
    shape of ``store.interchange.importers.usage_shape``) becomes a ``completed`` turn whose id is
    the message id, started and ended at the message's time. Importing the message again (a
    replacement line) updates the row: the rollups count each response once.
    """
    conn.execute(
        "INSERT INTO turns(id, session_id, status, provider_id, model_id, input_tokens, output_tokens, usage_json, "
        "cost_micros, started_at, ended_at) VALUES (?, ?, 'completed', ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT(id) DO UPDATE SET provider_id = excluded.provider_id, model_id = excluded.model_id, "
        "input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens, "
        "usage_json = excluded.usage_json, cost_micros = excluded.cost_micros "
        "WHERE turns.session_id = excluded.session_id",
        (turn_id, session_id, provider_id, model_id, _token(usage, "input"), _token(usage, "output"),
         orjson.dumps(dict(usage)).decode(), cost_micros(usage), at_ms, at_ms),
    )


def record_carried(conn: sqlite3.Connection, *, session_id: str, turn: Mapping[str, Any]) -> None:
    """The turn row of one turn a pi-host export carried (its ``turn`` line, the id already namespaced as the
    copy's message ids are), so the copy's ``usage.*`` sums what the first host's did: its status, model,
    token counts, cost and usage report as that host stored them. Importing it again updates the row (an
    imported response's row of the same id, :func:`record_imported_usage`, is that turn: one row)."""
    usage = turn.get("usage")
    conn.execute(
        "INSERT INTO turns(id, session_id, status, provider_id, model_id, error_code, input_tokens, output_tokens, "
        "usage_json, cost_micros, started_at, ended_at, retry_of) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT(id) DO UPDATE SET status = excluded.status, provider_id = excluded.provider_id, "
        "model_id = excluded.model_id, error_code = excluded.error_code, input_tokens = excluded.input_tokens, "
        "output_tokens = excluded.output_tokens, usage_json = excluded.usage_json, "
        "cost_micros = excluded.cost_micros, started_at = excluded.started_at, ended_at = excluded.ended_at "
        "WHERE turns.session_id = excluded.session_id",
        (turn["id"], session_id, turn["status"], turn.get("providerId"), turn.get("modelId"), turn.get("errorCode"),
         turn["inputTokens"], turn["outputTokens"], orjson.dumps(dict(usage)).decode() if usage else None,
         turn["costMicros"], turn["startedAt"], turn["endedAt"], turn.get("retryOf")),
    )
