"""Message lines the host itself writes into a session's transcript (inside its actor).

Two methods append a record the client did not send as such: a promoted
in-flight checkpoint (``session.recoverInflight``) and a collaboration
delivery's input (``collab.begin``). Both follow the append order — the line
+ fdatasync first, then ONE transaction holding its index row, the method's
own DB change and the receipt — and then publish ``session.message`` like any
append. A failed transaction poisons the actor; its rebuild indexes the line
from the transcript, so a retry finds the id held and does not write it again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from actors.session_context import Lines, SessionContext
from store.jsonio import dumps_line
from store.rules import EVENT_RECORD_MAX
from store.transcripts.records import wire_record

__all__ = ["append_record", "publish_message"]

T = TypeVar("T")


async def append_record(
    ctx: SessionContext,
    record: Mapping[str, Any],
    respond: Callable[[Any, dict[str, Any]], T],
) -> tuple[T, dict[str, Any]]:
    """Write ``record`` as one durable line, then index it with ``respond(conn, ref)`` in the
    same transaction (its value is the method's response, stored with the receipt)."""
    line = dumps_line(dict(record))
    done = await ctx.append_lines(Lines([line], records=[record]), then=lambda conn, refs: respond(conn, refs[0]))
    ref = done.refs[0]
    publish_message(ctx, record, ref, len(line))
    result: T = done.value
    return result, ref


def publish_message(ctx: SessionContext, record: Mapping[str, Any], ref: Mapping[str, Any], size: int) -> None:
    data: dict[str, Any] = {"message": dict(ref)}
    if size <= EVENT_RECORD_MAX:
        data["record"] = wire_record(record)
    ctx.publish("session.message", data, size=min(size, EVENT_RECORD_MAX))
