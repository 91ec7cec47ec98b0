"""Method handlers: turns, run environment, in-flight checkpoints, notifications, artifacts.

Session-routed methods become ``Custom`` requests for the session actor (see
``actors/session_turns.py`` and ``actors/session_inflight.py``); the inbox and
artifact listing are plain DB reads/writes that never touch sessions, turns or
transcripts. Registered through ``runtime/features.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.gateway_types import CallContext
from actors.session_inflight import after_append, save_inflight
from actors.session_msgs import Custom
from actors.session_turns import end_turn, start_turn
from runtime.api import HostApi, decode_cursor, encode_cursor
from store import artifacts, index, notifications
from store.errors import InvalidInput, NotFound
from store.snapshots import load_snapshot

Handler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]


def turn_handlers() -> dict[str, Any]:
    """``Custom.kind`` → session-actor handler."""
    return {
        "turns.start": start_turn,
        "turns.end": end_turn,
        "turns.saveInflight": save_inflight,
        "__after_append__": after_append,
    }


def _cursor(value: Any, size: int) -> list[Any] | None:
    decoded = decode_cursor(value)
    if decoded is not None and not (isinstance(decoded, list) and len(decoded) == size):
        raise InvalidInput("cursor is not valid", data={"field": "cursor"})
    return decoded


def turn_methods(*, registry: Any, reads: Any, db: Any, bus: Any, now_ms: Callable[[], int],
                 **_: Any) -> dict[str, Handler]:
    """JSON-RPC method name → handler."""

    def routed(method: str, kind: str, build: Callable[[dict[str, Any], Mapping[str, Any], Any], dict[str, Any]]
               ) -> Handler:
        async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, model: Any) -> Any:
            params = build(p, raw, model)
            receipt = HostApi.receipt(method, p, raw, ctx)
            return await registry.ask(p["sessionId"], Custom(kind, params, receipt=receipt))

        return handler

    def start_params(p: dict[str, Any], raw: Mapping[str, Any], model: Any) -> dict[str, Any]:
        out = {k: v for k, v in p.items() if k != "environment"}
        if model.environment is not None:
            # Every field, defaults included, nothing dropped: this is what gets digested.
            out["environment"] = model.environment.model_dump(mode="json", by_alias=True)
        return out

    def end_params(p: dict[str, Any], raw: Mapping[str, Any], model: Any) -> dict[str, Any]:
        out = dict(p)
        if isinstance(raw.get("usage"), Mapping):
            out["usage"] = dict(raw["usage"])  # provider-specific keys kept as sent
        return out

    def inflight_params(p: dict[str, Any], raw: Mapping[str, Any], model: Any) -> dict[str, Any]:
        return {**p, "message": raw["message"]}  # lossless: the raw message

    async def turn_environment(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        turn_id = p["turnId"]

        def read(conn: Any) -> dict[str, Any]:
            if conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone() is None:
                raise NotFound(f"turn {turn_id} not found", data={"turnId": turn_id})
            return load_snapshot(conn, turn_id)

        return await reads.run(read)

    async def notes_list(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        cursor = _cursor(p.get("cursor"), 2)
        items, nxt, unread = await reads.run(
            lambda conn: notifications.list_notifications(
                conn, unread_only=bool(p.get("unreadOnly")), limit=int(p.get("limit", 50)),
                cursor=(int(cursor[0]), str(cursor[1])) if cursor else None)
        )
        return {"notifications": [{k: v for k, v in n.items() if v is not None} for n in items],
                "unreadCount": unread, "nextCursor": encode_cursor(list(nxt)) if nxt else None}

    def inbox_write(method: str, fn: Callable[[Any, dict[str, Any], int], dict[str, Any]]) -> Handler:
        async def handler(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
            receipt = HostApi.receipt(method, p, raw, ctx)
            now = now_ms()

            def op(conn: Any) -> Any:
                if receipt is not None:
                    found = index.check_receipt(conn, receipt.client_id, receipt.submission_id, receipt.method,
                                                receipt.fingerprint)
                    if found is not None:
                        return found["response"]
                result = fn(conn, p, now)
                if receipt is not None:
                    index.store_receipt_if_absent(
                        conn, client_id=receipt.client_id, submission_id=receipt.submission_id,
                        method=receipt.method, fingerprint=receipt.fingerprint, response=result,
                        session_id=None, now_ms=now)
                return result

            return await db.write(op, durable=True)

        return handler

    async def artifacts_list(p: dict[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        cursor = _cursor(p.get("cursor"), 3)
        items, nxt = await reads.run(
            lambda conn: artifacts.list_artifacts(conn, session_id=p.get("sessionId"),
                                                  limit=int(p.get("limit", 100)), cursor=cursor)
        )
        return {"artifacts": [{k: v for k, v in a.items() if v is not None} for a in items],
                "nextCursor": encode_cursor(nxt) if nxt else None}

    return {
        "session.startTurn": routed("session.startTurn", "turns.start", start_params),
        "session.endTurn": routed("session.endTurn", "turns.end", end_params),
        "session.saveInflightMessage": routed("session.saveInflightMessage", "turns.saveInflight",
                                              inflight_params),
        "session.turnEnvironment": turn_environment,
        "notifications.list": notes_list,
        "notifications.markRead": inbox_write(
            "notifications.markRead", lambda conn, p, now: {"updated": notifications.mark_read(conn, p["ids"], now)}),
        "notifications.markAllRead": inbox_write(
            "notifications.markAllRead", lambda conn, p, now: {"updated": notifications.mark_all_read(conn, now)}),
        "notifications.clear": inbox_write(
            "notifications.clear", lambda conn, p, now: {"deleted": notifications.clear(conn, p.get("ids"))}),
        "artifacts.list": artifacts_list,
    }
