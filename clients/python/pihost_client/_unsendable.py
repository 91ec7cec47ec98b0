"""What JSON cannot carry in a call's params, and the refusal that names it: one check for both Python clients.

``pihost_client`` (this package) and the host's own ``runtime.client.HostClient`` refuse such params before
anything is sent, as ``INVALID_PARAMS`` (``data.sent`` false, ``data.errors`` saying where). The host ships this
file as ``protocol/unsendable.py``, a link to this one (as ``protocol/protocol.ts`` links the TypeScript client's
types): it imports only the standard library, so either package carries it without the other.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["describe", "holds_non_finite", "unsendable"]

_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def unsendable(params: Any, *, non_finite_only: bool = False) -> tuple[str, list[str | int]] | None:
    """The first value, in the encoder's order, that JSON cannot carry: what it is ("NaN", "a set", "a key of
    type tuple") and where (the keys and indexes from ``params``; a key's is its object's). None when there is
    none. ``non_finite_only``: look only for NaN and ±Infinity (for an encoder that wrote the rest its own way
    and those as ``null``). Iterative; run it only on params an encoder has walked already (no cycle)."""
    stack: list[tuple[Any, list[str | int], bool]] = [(params, [], False)]  # (value, where, is a key)
    while stack:
        value, loc, is_key = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                said = _NON_FINITE[repr(float(value))]
                return (f"a {said} key" if is_key else said), loc
        elif is_key:
            if not (non_finite_only or value is None or isinstance(value, (str, int))):
                return f"a key of type {type(value).__name__}", loc
        elif isinstance(value, dict):
            entries: list[tuple[Any, list[str | int], bool]] = []
            for key, item in value.items():
                entries += [(key, loc, True), (item, [*loc, _key_text(key)], False)]
            stack.extend(reversed(entries))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([(item, [*loc, index], False) for index, item in enumerate(value)]))
        elif not (non_finite_only or value is None or isinstance(value, (str, int))):
            name = type(value).__name__
            return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}", loc
    return None


def holds_non_finite(params: Any) -> bool:
    """Whether a value in ``params`` is NaN or ±Infinity: a quick look, with no paths, for an encoder that wrote
    them as ``null`` and took only string keys (then :func:`unsendable` says where). Iterative; no cycle (see
    there)."""
    containers: list[Any] = [params]
    while containers:
        container = containers.pop()
        for item in container.values() if isinstance(container, dict) else container:
            if isinstance(item, (dict, list, tuple)):
                containers.append(item)
            elif isinstance(item, float) and item - item != 0:  # NaN - NaN, inf - inf: NaN; finite: 0.0
                return True
    return False


def describe(method: str, what: str, loc: list[str | int]) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the ``INVALID_PARAMS`` refusal of ``method``'s params holding ``what`` at
    ``loc`` (from :func:`unsendable`)."""
    where = "params" + "".join(f"[{part}]" if isinstance(part, int)
                               else f".{part}" if part.isidentifier() else f"[{json.dumps(part)}]"
                               for part in loc)
    message = f"{method}: params hold {what} at {where}, which JSON cannot carry; nothing was sent"
    errors = [{"loc": ".".join(str(part) for part in loc), "msg": f"{what}, which JSON cannot carry",
               "type": "json_invalid"}]
    return message, {"code": "INVALID_PARAMS", "retriable": False, "sent": False, "errors": errors}


def _key_text(key: Any) -> str:
    """An object key as JSON writes it (a number, boolean or None becomes a string)."""
    if isinstance(key, str):
        return key
    try:
        return json.dumps(key)
    except ValueError:  # a NaN key: refused when it is reached
        return repr(key)
