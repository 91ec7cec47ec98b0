"""What a turn's end settles besides the turn row, in one place for every way a turn ends.

``session.endTurn``, ``session.recoverInflight`` (the sidecar is gone) and a
rewrite that cuts a running turn's reply (``session.truncateFrom``) all end
turns. Each one, inside the transaction that ends the turn:

* cancels the approvals and interactions the turn still had pending (an answer
  after its turn ended is refused);
* ends the plan execution the turn was running (completed → completed,
  error → failed, aborted → cancelled: ``store/plans.py``);
* ends the collaboration delivery the turn was running (completed → completed,
  otherwise failed, with its callback: ``store/collab.py``).

:func:`publish` announces all of it after the commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from actors.session_context import SessionContext
from runtime.handlers import approvals as user_requests
from runtime.handlers import collab, plans
from store import approvals
from store import plans as plan_rows
from store.faults import Faults
from store.indexing import index

__all__ = ["Aftermath", "publish", "settle"]


@dataclass
class Aftermath:
    cancelled: list[dict[str, Any]] = field(default_factory=list)
    """Requests the turn end cancelled (``approval.resolved`` / ``interaction.resolved``)."""
    executions: list[dict[str, Any]] = field(default_factory=list)
    """Plan executions it ended (``plan.execution``)."""
    session: dict[str, Any] | None = None
    """The session summary afterwards when an execution ended (its projected state moved)."""
    deliveries: list[Any] = field(default_factory=list)
    """``(Changed, queue owners)`` of each delivery it settled (``collab.delivery``, ``session.queue``)."""


def settle(conn: Any, sid: str, turn_ids: Iterable[str], status: str, error_code: str | None, now: int,
           faults: Faults) -> Aftermath:
    """Inside the transaction that ended ``turn_ids`` with ``status``."""
    out = Aftermath()
    for turn_id in turn_ids:
        # a damaged record is cancelled and announced all the same (its turn ended): what no longer reads is
        # shown by stand-ins and named in the request's `unreadable`
        out.cancelled.extend(approvals.settled_request(conn, kind, rid)
                             for kind, rid in approvals.cancel_for_turn(conn, sid, turn_id, now))
        out.executions.extend(plan_rows.settle_for_turn(conn, sid, turn_id, status, error_code, now))
        out.deliveries.append(collab.settle_for_turn(conn, sid, turn_id, status, error_code, now, faults))
    if out.executions:
        out.session = index.public_session(index.require_session(conn, sid))
    return out


def publish(ctx: SessionContext, aftermath: Aftermath) -> None:
    """After the commit."""
    user_requests.publish_cancelled(ctx, aftermath.cancelled)
    plans.publish_executions(ctx, aftermath.executions, aftermath.session)
    for moved, owners in aftermath.deliveries:
        collab.publish(ctx, moved, owners)
