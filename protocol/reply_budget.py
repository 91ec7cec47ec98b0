"""Reply byte budgets declared by requests (pure; the gateway enforces them).

Most replies are small and bounded by their own limits; a few methods read
content whose size only the data knows. Their params take ``maxBytes`` (a byte
budget the host fits the reply into before it reads anything); these are the
*budgeted* methods. A request declares its budget: its ``maxBytes``, else the
single-reply limit.

Inside a JSON-RPC batch the budgeted entries share the batch's budget: one
without ``maxBytes`` gets an equal share of what the explicit ones leave. A
batch whose declared budgets cannot fit (explicit ``maxBytes`` adding up past
the batch limit, or shares that would fall below ``MIN_BATCH_SHARE_BYTES``) is
refused whole with ``PAYLOAD_TOO_LARGE`` before any entry runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from store.rules import MAX_BATCH_REPLY_BYTES, MAX_REPLY_BYTES, MAX_WHOLE_READ_BYTES, MIN_BATCH_SHARE_BYTES

from .methods import METHODS

__all__ = ["BUDGETED", "WHOLE_READS", "BatchRefused", "batch_budgets", "carries_content", "declared_bytes"]

BUDGETED: frozenset[str] = frozenset(
    name for name, spec in METHODS.items() if "max_bytes" in spec.params_model.model_fields
)
"""Methods whose params have ``maxBytes``."""
WHOLE_READS: frozenset[str] = frozenset({"session.context", "session.tree"})
"""Methods that read a whole transcript (refused beyond ``MAX_WHOLE_READ_BYTES``)."""


_READS: frozenset[str] = frozenset(name for name, spec in METHODS.items() if not spec.mutating)


def carries_content(method: str) -> bool:
    """Reads may answer with long texts (transcripts, prompts, plans); mutations answer with summaries."""
    return method in _READS


class BatchRefused(Exception):
    """The batch's declared reply budgets cannot fit: refused whole (``PAYLOAD_TOO_LARGE``)."""

    code = "PAYLOAD_TOO_LARGE"

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


def _explicit(params: Any) -> int | None:
    if isinstance(params, Mapping):
        value = params.get("maxBytes", params.get("max_bytes"))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, MAX_REPLY_BYTES)
    return None


def declared_bytes(method: str, params: Any) -> int:
    """Bytes a single request may make the host read and send (0: bounded by its own limits)."""
    if method in WHOLE_READS:
        return MAX_WHOLE_READ_BYTES
    if method not in BUDGETED:
        return 0
    explicit = _explicit(params)
    return explicit if explicit is not None else MAX_REPLY_BYTES


def batch_budgets(calls: Sequence[tuple[str, Any]], *, limit: int = MAX_BATCH_REPLY_BYTES) -> list[int | None]:
    """Per entry: the ``maxBytes`` to run it with (``None``: not budgeted, run as sent).

    Raises :class:`BatchRefused` when the declared budgets cannot fit ``limit``.
    """
    explicit = [_explicit(params) if method in BUDGETED else None for method, params in calls]
    implicit = sum(1 for (method, _), e in zip(calls, explicit, strict=True) if method in BUDGETED and e is None)
    fixed = sum(e for e in explicit if e is not None)
    left = limit - fixed
    share = min(MAX_REPLY_BYTES, left // implicit) if implicit else 0
    if left < 0 or (implicit and share < MIN_BATCH_SHARE_BYTES):
        raise BatchRefused(
            f"the batch's window reads declare more than the batch reply limit of {limit} bytes "
            f"({implicit} without maxBytes, {fixed} bytes declared with it): send fewer per batch or give each "
            f"a smaller maxBytes (at least {MIN_BATCH_SHARE_BYTES} per entry without one)",
            {"limit": limit, "declared": fixed, "withoutMaxBytes": implicit, "field": "maxBytes"},
        )
    out: list[int | None] = []
    for (method, _), e in zip(calls, explicit, strict=True):
        if method not in BUDGETED:
            out.append(None)
        else:
            out.append(e if e is not None else share)
    return out
