"""The host's dispatcher: validated wire params in, actor requests out.

This module only translates. It validates params with the protocol models,
builds the request an actor understands (with the command-receipt key), and
returns the actor's answer. Errors pass through untouched; the gateway maps
them once, at the edge.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import trio
from pydantic import ValidationError

from actors.db_reader import ReadPool
from actors.events import EventBus
from actors.gateway_types import BATCH_POSITION, CallContext
from actors.registry import SessionRegistry
from actors.session import DbHandle
from actors.session_msgs import (
    AppendMessage,
    CreateSession,
    Custom,
    DeleteSession,
    GetWindow,
    ReceiptKey,
    RenameSession,
    UpdateSession,
)
from protocol.errors import MethodNotFound
from protocol.methods import METHODS, parse_params
from runtime.kernel.actor import InternalBug
from store import index
from store.errors import InvalidInput
from store.ids import new_id

Handler = Callable[[dict[str, Any], Mapping[str, Any], CallContext, Any], Awaitable[Any]]

VERSION = "0.1.0"

log = logging.getLogger("pi_host")


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(value)).decode().rstrip("=")


def decode_cursor(value: str | None) -> Any:
    if value is None:
        return None
    try:
        pad = "=" * (-len(value) % 4)
        return orjson.loads(base64.urlsafe_b64decode(value + pad))
    except (ValueError, TypeError):
        raise InvalidInput("cursor is not valid", data={"field": "cursor"}) from None


class HostApi:
    """Implements the gateway's Dispatcher protocol."""

    def __init__(
        self,
        *,
        registry: SessionRegistry,
        reads: ReadPool,
        db: DbHandle,
        bus: EventBus,
        status: Callable[[], Awaitable[dict[str, Any]]],
        boot_id: str,
        now_ms: Callable[[], int],
        extra_handlers: Mapping[str, Handler] | None = None,
        validate_results: bool = False,
    ) -> None:
        # Tests run with validate_results=True: every answer is checked against its
        # documented result model. The wire carries the handler's answer as is
        # (transcript records stay byte-for-byte what was stored).
        self.validate_results = validate_results
        self.registry = registry
        self.reads = reads
        self.db = db
        self.bus = bus
        self._status = status
        self.boot_id = boot_id
        self.now_ms = now_ms
        self.handlers: dict[str, Handler] = {
            "host.status": self._host_status,
            "session.create": self._session_create,
            "session.list": self._session_list,
            "session.get": self._session_get,
            "session.appendMessage": self._append,
            "session.rename": self._rename,
            "session.update": self._update,
            "session.delete": self._delete,
            "settings.get": self._settings_get,
            "settings.set": self._settings_set,
        }
        if extra_handlers:
            self.handlers.update(extra_handlers)

    def hello(self, ctx: CallContext) -> dict[str, Any]:
        return {"hostVersion": VERSION, "bootId": self.boot_id, "serverTime": self.now_ms()}

    async def dispatch(
        self,
        method: str,
        params: Any,
        ctx: CallContext,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> Any:
        handler = self.handlers.get(method)
        if handler is None or method not in METHODS:
            raise MethodNotFound(method)
        raw = params if params is not None else {}
        model = parse_params(method, raw)
        p = model.model_dump(by_alias=True, exclude_none=True)
        sid = p.get("sessionId")
        if isinstance(sid, str) and method.startswith("session.") and method != "session.create":
            await self.registry.warm(sid)
        # Ordering point: from here to the actor's mailbox nothing yields, so
        # requests are enqueued in the order they arrived.
        task_status.started()
        result = await handler(p, raw if isinstance(raw, Mapping) else {}, ctx, model)
        if not self.validate_results:
            return result
        try:
            METHODS[method].result_model.model_validate(result)
            return result
        except ValidationError as exc:
            # Our own answer does not fit the documented model: a host bug, not bad params.
            log.error("result of %s does not match its model: %s", method, exc)
            raise InternalBug(f"result of {method} does not match the protocol model") from None

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def receipt(method: str, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext) -> ReceiptKey | None:
        sub = p.get("submissionId")
        if sub is None:
            return None
        return ReceiptKey(ctx.client_id, str(sub), method, index.fingerprint(method, raw))

    async def _host_status(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        return await self._status()

    async def _session_create(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        sid = p.get("sessionId")
        key = self.receipt("session.create", p, raw, ctx)
        if sid is None:
            if key is not None:
                # A retry without an explicit id must land on the same session.
                found = await self.reads.run(index.check_receipt, key.client_id, key.submission_id, key.method,
                                             key.fingerprint)
                if found is not None:
                    return found["response"]
            sid = new_id()
        settings = {k: p[k] for k in ("providerId", "modelId", "mode", "thinkingLevel", "permissionMode") if k in p}
        req = CreateSession(title=p.get("title", ""), project_path=p.get("projectPath"), settings=settings,
                            receipt=key)
        return await self.registry.ask(sid, req)

    async def _session_list(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        cursor = decode_cursor(p.get("cursor"))
        if cursor is not None and not (isinstance(cursor, list) and len(cursor) == 2):
            raise InvalidInput("cursor is not valid", data={"field": "cursor"})
        items, nxt = await self.reads.run(
            lambda conn: index.list_sessions(conn, limit=p.get("limit", 50),
                                             cursor=tuple(cursor) if cursor else None,
                                             project_id=p.get("projectId"))
        )
        return {"sessions": [index.public_session(r) for r in items],
                "nextCursor": encode_cursor(list(nxt)) if nxt else None}

    async def _session_get(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        req = GetWindow(
            before=p.get("messageBefore"),
            start=p.get("messageEnd"),
            limit=None if p.get("full") else p.get("messageLimit", None if ctx.client_kind == "agent" else 100),
            content_limit=p.get("contentLimit"),
            around=p.get("messageAround"),
        )
        return await self.registry.ask(p["sessionId"], req)

    async def _append(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        key = self.receipt("session.appendMessage", p, raw, ctx)
        position = BATCH_POSITION.get()
        more = position is not None and position[0] < position[1] - 1
        return await self.registry.ask(
            p["sessionId"], AppendMessage(message=raw["message"], turn_id=p.get("turnId"), receipt=key, more=more)
        )

    async def _rename(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        key = self.receipt("session.rename", p, raw, ctx)
        return await self.registry.ask(p["sessionId"], RenameSession(title=p["title"], receipt=key))

    async def _update(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        key = self.receipt("session.update", p, raw, ctx)
        settings = {k: p[k] for k in ("providerId", "modelId", "mode", "thinkingLevel", "permissionMode",
                                      "projectPath") if k in p}
        return await self.registry.ask(p["sessionId"], UpdateSession(settings=settings, receipt=key))

    async def _delete(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        key = self.receipt("session.delete", p, raw, ctx)
        if key is not None:
            found = await self.reads.run(index.check_receipt, key.client_id, key.submission_id, key.method,
                                         key.fingerprint)
            if found is not None:
                return found["response"]
        return await self.registry.ask(p["sessionId"], DeleteSession(receipt=key))

    async def _settings_get(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        ns, key = p.get("ns", "app"), p["key"]
        row = await self.reads.run(
            lambda conn: conn.execute("SELECT value_json, updated_at FROM kv WHERE ns = ? AND key = ?",
                                      (ns, key)).fetchone()
        )
        if row is None:
            return {"ns": ns, "key": key, "value": None, "updatedAt": None}
        return {"ns": ns, "key": key, "value": orjson.loads(row[0]), "updatedAt": row[1]}

    async def _settings_set(self, p: Mapping[str, Any], raw: Mapping[str, Any], ctx: CallContext, _m: Any) -> Any:
        ns, key = p.get("ns", "app"), p["key"]
        value = raw.get("value") if isinstance(raw, Mapping) else None
        receipt = self.receipt("settings.set", p, raw, ctx)
        now = self.now_ms()
        result = {"ns": ns, "key": key, "value": value, "updatedAt": now}

        def op(conn: Any) -> Any:
            if receipt is not None:
                found = index.check_receipt(conn, receipt.client_id, receipt.submission_id, receipt.method,
                                            receipt.fingerprint)
                if found is not None:
                    return found["response"]
            conn.execute(
                "INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?) ON CONFLICT(ns, key) "
                "DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at",
                (ns, key, orjson.dumps(value).decode(), now),
            )
            if receipt is not None:
                index.store_receipt_if_absent(conn, client_id=receipt.client_id,
                                              submission_id=receipt.submission_id, method=receipt.method,
                                              fingerprint=receipt.fingerprint, response=result,
                                              session_id=None, now_ms=now)
            return result

        return await self.db.write(op, durable=True)


def wall_ms() -> int:
    return int(time.time() * 1000)


__all__ = ["HostApi", "Custom", "encode_cursor", "decode_cursor", "wall_ms"]
