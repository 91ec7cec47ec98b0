"""What JSON cannot carry in a call's params, and the refusal that names it: one check for both Python clients.

``pihost_client`` (this package) and the host's own ``runtime.client.HostClient`` refuse such params before
anything is sent, as ``INVALID_PARAMS`` (``data.sent`` false, ``data.errors`` saying where). The host ships this
file as ``protocol/unsendable.py``, a link to this one (as ``protocol/protocol.ts`` links the TypeScript client's
types): it imports only the standard library, so either package carries it without the other.

What is sent: dicts, lists and tuples (written as arrays), strings, integers, floats, booleans and None, and
instances of subclasses of ``str``, ``int`` and ``float`` (an ``IntEnum`` or ``StrEnum`` member, numpy's
``float64``), written as the plain value they are. Anything else is refused, also what an encoder would write its own
way (orjson writes a ``datetime``, ``date`` or ``time`` as an ISO string, a ``UUID`` as its text, a dataclass as an
object, an ``Enum`` as its value: a string or object the caller did not write), as are NaN and ±Infinity, a string
holding a surrogate code point (no UTF-8 frame carries one; escaped, the host refuses it as ``PARSE_ERROR``), a key
that is no string, number, boolean or None and, unless ``wide_ints``, an integer outside the signed 64-bit range
(the host refuses the frame as ``PARSE_ERROR``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["INT64_MAX", "INT64_MIN", "describe", "holds_other", "unsendable"]

_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
_PLAIN = frozenset({str, int, float, bool, type(None)})
_CONTAINERS = (dict, list, tuple)


def unsendable(params: Any, *, wide_ints: bool = False) -> tuple[str, list[str | int]] | None:
    """The first value, in the encoder's order, that the protocol's JSON cannot carry (see the module): what it is
    ("NaN", "a set", "a datetime", "a lone surrogate", "a key of type tuple") and where (the keys and indexes from
    ``params``; a key's is its object's). None when there is none. ``wide_ints``: let integers outside the signed
    64-bit range through (the host's own client sends them, so tests see the host's answer). Iterative; run it only
    on params an encoder has walked already, or whose depth is bounded (no cycle)."""
    stack: list[tuple[Any, list[str | int], bool]] = [(params, [], False)]  # (value, where, is a key)
    while stack:
        value, loc, is_key = stack.pop()
        what = _leaf(value, wide_ints or is_key)  # a key is written as a string, an integer one too
        if what is not None:
            return (f"a {what} key" if is_key and what in _NON_FINITE.values() else
                    f"{what} in a key" if is_key and what.startswith("a lone") else what), loc
        if is_key:
            if not (value is None or isinstance(value, (str, int, float))):
                return f"a key of type {type(value).__name__}", loc
        elif isinstance(value, dict):
            entries: list[tuple[Any, list[str | int], bool]] = []
            for key, item in value.items():
                entries += [(key, loc, True), (item, [*loc, _key_text(key)], False)]
            stack.extend(reversed(entries))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([(item, [*loc, index], False) for index, item in enumerate(value)]))
        elif not (value is None or isinstance(value, (str, int, float))):
            return _a(type(value).__name__), loc
    return None


def _leaf(value: Any, wide_ints: bool) -> str | None:
    """Why a string or number cannot be written as it is (None: it can, or it is neither)."""
    if isinstance(value, str):
        return "a lone surrogate" if _SURROGATE.search(value) else None
    if isinstance(value, float):
        return None if math.isfinite(value) else _NON_FINITE[repr(float(value))]
    if isinstance(value, int) and not wide_ints and not INT64_MIN <= value <= INT64_MAX:
        return "an integer outside the signed 64-bit range"
    return None


def holds_other(params: Any) -> bool:
    """Whether ``params`` may hold what :func:`unsendable` refuses that orjson writes without a word: NaN or
    ±Infinity (written ``null``), or a value whose type is not exactly a container or a plain one (a ``datetime``, a
    ``UUID``, a dataclass, an ``Enum``, a subclass: then :func:`unsendable` says whether, and where). A quick look,
    with no paths, for an encoder that took only string keys, so keys are not looked at. Iterative; no cycle."""
    containers: list[Any] = [params]
    plain = _PLAIN
    while containers:
        container = containers.pop()
        for item in container.values() if type(container) is dict else container:
            kind = type(item)
            if kind is dict or kind is list or kind is tuple:
                containers.append(item)
            elif kind not in plain or (kind is float and item - item != 0):  # NaN, ±inf: NaN; finite: 0.0
                return True
    return False


def describe(method: str, what: str, loc: list[str | int]) -> tuple[str, dict[str, Any]]:
    """The message and ``data`` of the ``INVALID_PARAMS`` refusal of ``method``'s params holding ``what`` at
    ``loc`` (from :func:`unsendable`)."""
    where = "params" + "".join(f"[{part}]" if isinstance(part, int)
                               else f".{part}" if part.isidentifier() else f"[{_quoted(part)}]"
                               for part in loc)
    message = f"{method}: params hold {what} at {where}, which JSON cannot carry; nothing was sent"
    errors = [{"loc": ".".join(str(part) for part in loc), "msg": f"{what}, which JSON cannot carry",
               "type": "json_invalid"}]
    return message, {"code": "INVALID_PARAMS", "retriable": False, "sent": False, "errors": errors}


def _a(name: str) -> str:
    """``name`` with its article: "a set", "an Opaque", "a UUID" (an acronym starting with U)."""
    vowel = name[:1].lower() in "aeiou" and not (name[:1] == "U" and name[:2].isupper())
    return f"{'an' if vowel else 'a'} {name}"


def _quoted(key: str) -> str:
    """A key as a JSON string in a message, escaped to ASCII (a lone surrogate in it stays printable)."""
    return json.dumps(key)


def _key_text(key: Any) -> str:
    """An object key as JSON writes it (a number, boolean or None becomes a string)."""
    if isinstance(key, str):
        return key
    try:
        return json.dumps(key)
    except ValueError:  # a NaN key: refused when it is reached
        return repr(key)
