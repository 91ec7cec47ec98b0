"""``logs.append``: the desktop app's and the agent sidecar's NDJSON logs (seed 003 §2).

Bounded before anything is written: the model caps the record count, the
host caps each record's and the call's JSON bytes (``PAYLOAD_TOO_LARGE``) and
re-checks the category before a path is built. A ``ui`` connection writes
``app/`` only and an ``agent`` connection ``agent/`` only; other kinds (test,
cli) may write either. Each line is ``{"ts", "clientId", "record"}``; the file
write runs in a worker thread.
"""

from __future__ import annotations

from typing import Any

import orjson

from protocol import models as m
from runtime.context import HostContext
from runtime.logs import ClientLogs
from store.errors import PayloadTooLarge, PermissionDenied
from store.receipts import ReceiptKey

__all__ = ["CLIENT_LOGS", "append"]

CLIENT_LOGS = "logs.client"  # services.extra key of the host's ClientLogs (made on first use)
_SOURCE_OF_KIND = {"ui": "app", "agent": "agent"}


def _sink(ctx: HostContext) -> ClientLogs:
    sink = ctx.services.extra.get(CLIENT_LOGS)
    if not isinstance(sink, ClientLogs):
        sink = ClientLogs(ctx.services.data_dir.logs_dir)
        ctx.services.extra[CLIENT_LOGS] = sink
    return sink


async def append(ctx: HostContext, p: m.LogsAppendParams, key: ReceiptKey | None) -> Any:
    own = _SOURCE_OF_KIND.get(ctx.caller.client_kind)
    if own is not None and own != p.source:
        raise PermissionDenied(f"a {ctx.caller.client_kind} connection writes the {own} logs, not {p.source}",
                               data={"field": "source"})
    now, client = ctx.now(), ctx.caller.client_id
    lines: list[str] = []
    total = 0
    for i, record in enumerate(p.records):
        size = len(orjson.dumps(record))
        if size > m.MAX_LOG_RECORD_BYTES:
            raise PayloadTooLarge(f"log record {i} is {size} bytes (at most {m.MAX_LOG_RECORD_BYTES})",
                                  data={"field": f"records.{i}", "limit": m.MAX_LOG_RECORD_BYTES})
        total += size  # the records' own UTF-8 JSON (README §logs), not the lines' characters
        if total > m.MAX_LOG_APPEND_BYTES:
            raise PayloadTooLarge(f"the records add up to more than {m.MAX_LOG_APPEND_BYTES} bytes",
                                  data={"field": "records", "limit": m.MAX_LOG_APPEND_BYTES})
        lines.append(orjson.dumps({"ts": now, "clientId": client, "record": record}).decode())
    sink = _sink(ctx)
    sink.path(p.source, p.category)  # validated before any path is built or thread started
    written = await ctx.in_thread(sink.append, p.source, p.category, lines)
    return {"written": len(lines), "bytes": written, "file": f"logs/{p.source}/{p.category}.ndjson"}
