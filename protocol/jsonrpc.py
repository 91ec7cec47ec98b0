"""JSON-RPC 2.0 envelopes: pure validation of decoded frames and response building.

No I/O. The gateway decodes a text frame (``store.jsonio.loads_strict``), hands the
value to :func:`parse_message` and gets back either one :class:`Call` / :class:`Invalid`
item or a list of them (a batch). Responses are built as dicts and serialized with
:func:`encode` (orjson), one array frame per batch via :func:`encode_batch`.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

import orjson

from protocol.errors import INTERNAL_MESSAGE, RpcErrorCode, error_object

__all__ = [
    "Call",
    "Encoded",
    "gc_paused",
    "Invalid",
    "Item",
    "RequestId",
    "NO_ID",
    "parse_message",
    "parse_item",
    "success",
    "error",
    "error_for_code",
    "notification",
    "encode",
    "encode_batch",
    "encoded_parts",
    "json_size_upto",
    "dumps_content",
    "dumps_long_string",
    "loads_large",
    "longer_than",
    "more_items_than",
    "valid_id",
]

RequestId = str | int | None


@dataclass(frozen=True, slots=True)
class Encoded:
    """A result already encoded as JSON (``session.get`` windows, built from the transcript's own
    bytes): the gateway sends it as it is, never decoded, re-encoded or copied (:func:`encoded_parts`).
    ``data`` owns exactly its bytes (a join or a concatenation, not an encoder's grown buffer), so it
    may wait in the outbound queue as it is."""

    data: bytes

    def decode(self) -> Any:
        return loads_large(self.data)


def json_size_upto(value: Any, limit: int) -> int:
    """Roughly how many characters the JSON text of ``value`` has, counted only until it passes ``limit``
    (then some number above ``limit``).

    A count without encoding: each string's length and quotes, the keys, and the shortest text of
    everything else (a separator and one character per item: a number or a literal counts one),
    so within about half of the truth; a whole container is counted at once and the count stops
    at the first container that takes it past ``limit``. So a small value costs a glance, and a
    large one at most about ``limit / 2`` items. Callers decide with it whether work that grows
    with ``value`` (encoding it, hashing it) may run on the trio loop. Something no JSON encoder
    takes (a key that is no string) counts as long: the work goes to the thread, which fails as
    it would have."""
    left = limit
    stack: list[Any] = [value]
    pop, push = stack.pop, stack.append
    try:
        while stack:
            item = pop()
            kind = type(item)
            if kind is str:
                left -= len(item) + 2
                items: Any = ()
            elif kind is dict:
                left -= 2 + 5 * len(item)  # braces; each entry's quotes, colon, comma and shortest value
                if left < 0:
                    return limit - left
                left -= sum(map(len, item))  # the keys
                items = item.values()
            elif kind is list or kind is tuple:
                left -= 2 + 2 * len(item)
                items = item
            elif kind is Encoded:
                left -= len(item.data)
                items = ()
            else:
                items = ()
            if left < 0:
                return limit - left
            for sub in items:
                kind = type(sub)
                if kind is str:
                    left -= len(sub) + 1  # its quotes (one counted with the container)
                elif kind is dict or kind is list or kind is tuple or kind is Encoded:
                    push(sub)
            if left < 0:
                return limit - left
    except TypeError:
        return limit + 1
    return limit - left


def longer_than(value: Any, limit: int) -> bool:
    """Whether the JSON text of ``value`` is roughly longer than ``limit`` characters (:func:`json_size_upto`)."""
    return json_size_upto(value, limit) > limit


def more_items_than(value: Any, limit: int) -> bool:
    """Whether ``value`` holds more than ``limit`` objects, arrays and their items, counted only until
    it passes ``limit`` (a glance for a small value). Validating params costs per item (a message of
    4,096 empty text blocks, ~107 KB: 8-9 ms), not per character (a 2.5 MiB text: 7 us)."""
    left = limit
    stack: list[Any] = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            left -= 1 + len(item)
            if left < 0:
                return True
            for v in item.values():
                if type(v) is dict or type(v) is list:
                    push(v)
        elif kind is list:
            left -= 1 + len(item)
            if left < 0:
                return True
            for v in item:
                if type(v) is dict or type(v) is list:
                    push(v)
    return False


LARGE_JSON = 1024 * 1024
"""Above this many bytes :func:`loads_large` decodes with the garbage collector paused."""


def loads_large(data: bytes | str) -> Any:
    """``orjson.loads``; for a large document (a whole-history reply) with the cyclic garbage
    collector paused: the decode allocates objects by the hundred thousand, each allocation
    burst triggers a collection that walks everything decoded so far, and none of it can be
    garbage yet. Doubles as fast on a 50,000-message reply."""
    if len(data) < LARGE_JSON:
        return orjson.loads(data)
    with gc_paused():
        return orjson.loads(data)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (left as it was: a caller that paused it
    already keeps it paused)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_MAX_ID_CHARS: Final = 256
_MAX_METHOD_CHARS: Final = 256


class _NoId:
    """Marker for "the request has no id member" (a notification)."""

    def __repr__(self) -> str:
        return "NO_ID"


NO_ID: Final = _NoId()


@dataclass(frozen=True, slots=True)
class Call:
    """A well-formed request (``is_notification`` when it has no ``id``)."""

    method: str
    params: Any  # dict, list or None (absent)
    id: RequestId | _NoId

    @property
    def is_notification(self) -> bool:
        return self.id is NO_ID

    @property
    def response_id(self) -> RequestId:
        return None if isinstance(self.id, _NoId) else self.id


@dataclass(frozen=True, slots=True)
class Invalid:
    """An envelope that is not a valid request; answered with -32600 (id if usable)."""

    id: RequestId
    reason: str


Item = Call | Invalid


def valid_id(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return _INT64_MIN <= value <= _INT64_MAX
    if isinstance(value, str):
        return len(value) <= _MAX_ID_CHARS
    return False


def parse_item(value: Any) -> Item:
    """Validate one request object of a frame (or batch)."""
    if not isinstance(value, dict):
        return Invalid(None, "request must be a JSON object")
    has_id = "id" in value
    raw_id = value.get("id")
    usable_id: RequestId = raw_id if has_id and valid_id(raw_id) else None
    if has_id and not valid_id(raw_id):
        return Invalid(None, "id must be a string, an integer (int64) or null")
    if value.get("jsonrpc") != "2.0":
        return Invalid(usable_id, 'member "jsonrpc" must be exactly "2.0"')
    method = value.get("method")
    if not isinstance(method, str) or not method or len(method) > _MAX_METHOD_CHARS:
        return Invalid(usable_id, 'member "method" must be a non-empty string')
    params = value.get("params")
    if "params" in value and not isinstance(params, (dict, list)):
        return Invalid(usable_id, 'member "params" must be an object or an array')
    return Call(method=method, params=params, id=raw_id if has_id else NO_ID)


def parse_message(value: Any, *, max_batch: int) -> Item | list[Item]:
    """Validate a decoded frame: one request, or a non-empty batch of at most ``max_batch``."""
    if isinstance(value, list):
        if not value:
            return Invalid(None, "empty batch")
        if len(value) > max_batch:
            return Invalid(None, f"batch of {len(value)} requests exceeds the limit of {max_batch}")
        return [parse_item(entry) for entry in value]
    return parse_item(value)


def success(request_id: RequestId, result: Any) -> dict[str, Any]:
    """A success response; an :class:`Encoded` result stays as it is (:func:`encode` writes its bytes)."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def encoded_parts(response: dict[str, Any]) -> tuple[bytes, bytes, bytes] | None:
    """A success response whose result is :class:`Encoded`, as the three pieces of its JSON text:
    the envelope up to the result, the result's own bytes (not copied), the closing brace. Joined,
    they are exactly what :func:`encode` writes. ``None`` for any other response."""
    result = response.get("result")
    if not isinstance(result, Encoded) or "error" in response:
        return None
    request_id = response.get("id")
    if not valid_id(request_id):
        return None
    head = b'{"jsonrpc":"2.0","id":' + orjson.dumps(request_id) + b',"result":'
    return head, result.data, b"}"


def error(request_id: RequestId, exc: BaseException) -> dict[str, Any]:
    """Error response for ``exc`` (mapped by :func:`protocol.errors.error_object`)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error_object(exc)}


def error_for_code(
    request_id: RequestId, code: str, message: str, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec = RpcErrorCode.spec(code)
    body: dict[str, Any] = dict(data or {})
    body["code"] = code
    body["retriable"] = spec.retriable
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": spec.numeric, "message": message, "data": body}}


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def _internal(request_id: RequestId) -> bytes:
    return orjson.dumps(error_for_code(request_id, RpcErrorCode.INTERNAL, INTERNAL_MESSAGE))


BIG_STRING: Final = 256 * 1024
"""A string this long is encoded on its own (see :func:`encode`)."""
STRING_CHUNK: Final = 64 * 1024
"""Characters of a long string encoded at once (:func:`dumps_long_string`)."""


def dumps_long_string(text: str) -> bytes:
    """``orjson.dumps(text)``, made :data:`STRING_CHUNK` characters at a time.

    orjson reserves about 16 bytes of output buffer per character of the string it
    is writing (measured: a 16 MiB text, 265 MB for a moment); chunk by chunk it
    reserves about 1 MiB. The bytes are the same: JSON escapes each character on its
    own and a ``str`` slice never splits one (no surrogate pairs in a Python string;
    a lone surrogate fails either way). They are also the stdlib's
    (``json.dumps(text, ensure_ascii=False)`` in UTF-8), which this replaced: the same
    escapes for every code point, at 2.5-4.7 times its speed.
    """
    parts = [b'"']
    for start in range(0, len(text), STRING_CHUNK):
        parts.append(orjson.dumps(text[start:start + STRING_CHUNK])[1:-1])
    parts.append(b'"')
    return b"".join(parts)


def _big_strings_as_fragments(value: Any) -> Any:
    """``value`` with every string longer than :data:`BIG_STRING` pre-encoded as an ``orjson.Fragment``
    (:func:`dumps_long_string`: orjson's scratch memory for a long string would be 16 times its length).
    Containers are copied only on the path to such a string; everything else is shared.
    """
    if isinstance(value, str):
        if len(value) > BIG_STRING:
            return orjson.Fragment(dumps_long_string(value))
        return value
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            new = _big_strings_as_fragments(item)
            if new is not item:
                if out is None:
                    out = dict(value)
                out[key] = new
        return value if out is None else out
    if isinstance(value, list):
        items: list[Any] | None = None
        for i, item in enumerate(value):
            new = _big_strings_as_fragments(item)
            if new is not item:
                if items is None:
                    items = list(value)
                items[i] = new
        return value if items is None else items
    return value


def dumps_content(value: Any) -> bytes:
    """``orjson.dumps(value)``, its strings longer than :data:`BIG_STRING` encoded one by one (as
    :func:`encode` with ``big_strings``); raises what orjson raises."""
    return orjson.dumps(_big_strings_as_fragments(value))


def encode(response: dict[str, Any], *, big_strings: bool = False) -> bytes:
    """Serialize one response; an unserializable result becomes a -32603 error.

    ``big_strings``: the result may hold long texts (transcript content): they are
    encoded one by one so the encoder's scratch memory stays near the output size.
    """
    result = response.get("result")
    if isinstance(result, Encoded):
        response = {**response, "result": orjson.Fragment(result.data)}
    try:
        try:
            if big_strings:
                return orjson.dumps(_big_strings_as_fragments(response))
            return orjson.dumps(response)
        except orjson.JSONEncodeError as exc:
            if "64-bit" not in str(exc) or isinstance(result, Encoded):
                raise
            # an integer beyond 64 bits a seed-era settings value holds (kept exact by the migration and the
            # settings reader): the JSON text carries its exact literal, never a rounded float
            return json.dumps(response, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, orjson.JSONEncodeError, UnicodeEncodeError):
        request_id = response.get("id")
        return _internal(request_id if valid_id(request_id) else None)


def encode_batch(responses: list[dict[str, Any]]) -> bytes:
    """Serialize a batch's responses as ONE JSON array."""
    return b"[" + b",".join(encode(response) for response in responses) + b"]"
