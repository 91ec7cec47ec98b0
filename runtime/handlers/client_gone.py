"""What the host does once a client is gone (``Pipeline.on_client_gone``: its last connection closed
and no connection of it came back within ``HostConfig.client_gone_after``).

For an agent sidecar that died while the host runs:

* the queues it controlled are held again (until a controller attaches, as after a restart), the
  prompts it took and began no turn with are offered again, listed first, and each changed queue is
  announced on ``session.queue`` (``store/queue.py``, leases), so another sidecar attaches;
* the queue turns it was running (a ``started`` lease it took, its turn still ``running``) are
  recovered as ``session.recoverInflight`` would (its checkpoint settled, the turn ended ``aborted``,
  ``SIDECAR_LOST``, in the session's actor), so the queue goes on instead of waiting behind a turn
  nobody runs; the turn's end settles its prompt (consumed if it landed, else waiting again).
  A turn that did not come from the queue has no known owner and is left to a client's
  ``recoverInflight``.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.gateway_types import CallContext
from actors.session import SessionOp
from protocol import models as m
from runtime.context import Services, session_call
from runtime.handlers import inflight
from runtime.handlers.queue import CONTROLLER_KIND, SERVICE, TOPIC, QueueControl, read_state
from store import queue
from store.errors import StoreError

__all__ = ["on_client_gone"]

log = logging.getLogger("pi_host")

_RECOVER = SessionOp(inflight.recover, True, "session.recoverInflight")


async def on_client_gone(services: Services, caller: CallContext) -> None:
    if caller.client_kind != CONTROLLER_KIND:
        return
    control: QueueControl = services.get(SERVICE)
    client = caller.client_id

    released = control.release_client(client)

    def settle(conn: Any) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        changed = sorted({*queue.offer_again_taken_by(conn, client), *released})
        states = [{**read_state(conn, control.peek(sid), sid), "sessionId": sid} for sid in changed]
        return states, queue.running_turns_started_by(conn, client)

    changed, running = await services.db.write(settle, durable=True, label="queue.clientGone")
    for state in changed:
        services.bus.publish(TOPIC, state, session_id=state["sessionId"])
    for sid, turn_id in running:
        try:
            await _recover(services, caller, sid, turn_id)
        except StoreError as exc:  # ended meanwhile, or its checkpoint is another turn's: nothing to do
            log.info("client %s gone: turn %s of session %s not recovered: %s", client, turn_id, sid, exc)


async def _recover(services: Services, caller: CallContext, sid: str, turn_id: str) -> None:
    """``session.recoverInflight {sessionId, turnId}`` in the session's actor, as a client would call it."""
    params = m.RecoverInflightParams.model_validate({"sessionId": sid, "turnId": turn_id})
    got = await session_call(services, sid, _RECOVER, params, caller)
    log.info("client %s gone: recovered turn %s of session %s (%s)", caller.client_id, turn_id, sid,
             got.get("action") if isinstance(got, dict) else got)
