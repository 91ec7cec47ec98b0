"""protocol/errors.py and protocol/jsonrpc.py: pure mapping and envelope validation."""

from __future__ import annotations

import json
import logging
import sqlite3

import orjson
import pydantic
import pytest

from protocol.errors import INTERNAL_MESSAGE, MethodNotFound, RpcErrorCode, RpcFailure, error_object
from protocol.jsonrpc import (
    NO_ID,
    Call,
    Encoded,
    Invalid,
    dumps_long_string,
    encode,
    encode_batch,
    encoded_parts,
    longer_than,
    parse_message,
    success,
)
from store.errors import IdempotencyConflict, InvalidId, PayloadTooLarge, PermissionDenied, SessionNotFound, StorageFull
from store.indexing.group_commit import index_corrupt
from store.jsonio import StrictJSONError
from tests.gateway.conftest import SECRET, CodedError


class _M(pydantic.BaseModel):
    a: int
    b: str


@pytest.mark.parametrize(
    ("exc", "numeric", "code", "retriable"),
    [
        (SessionNotFound("no such session"), -32002, "SESSION_NOT_FOUND", False),
        (IdempotencyConflict("same key, other payload"), -32003, "IDEMPOTENCY_CONFLICT", False),
        (InvalidId("bad id"), -32602, "INVALID_ID", False),
        (PayloadTooLarge("too big"), -32006, "PAYLOAD_TOO_LARGE", False),
        (StorageFull("disk full"), -32005, "STORAGE_FULL", True),
        (CodedError("BUSY", "mailbox full"), -32004, "BUSY", True),
        (CodedError("TIMEOUT", "ask timed out"), -32004, "TIMEOUT", True),
        (CodedError("ACTOR_RESTARTED", "crashed"), -32004, "ACTOR_RESTARTED", True),
        (CodedError("SOMETHING_NEW", "x"), -32000, "SOMETHING_NEW", False),
        (MethodNotFound("nope.nope"), -32601, "METHOD_NOT_FOUND", False),
        (StrictJSONError("bad json"), -32700, "PARSE_ERROR", False),
        (RpcFailure("UNAUTHENTICATED", "who are you"), -32001, "UNAUTHENTICATED", False),
    ],
)
def test_coded_exceptions_map_by_code(exc: Exception, numeric: int, code: str, retriable: bool) -> None:
    obj = error_object(exc)
    assert obj["code"] == numeric
    assert obj["data"]["code"] == code
    assert obj["data"]["retriable"] is retriable
    assert obj["message"] == str(exc)


def test_error_data_is_copied_but_cannot_override_code() -> None:
    exc = SessionNotFound("gone", data={"sessionId": "s1", "code": "SPOOF", "obj": object()})
    obj = error_object(exc)
    assert obj["data"] == {"sessionId": "s1", "code": "SESSION_NOT_FOUND", "retriable": False}


def test_validation_error_is_invalid_params_with_compact_errors() -> None:
    with pytest.raises(pydantic.ValidationError) as info:
        _M.model_validate({"a": "x" * 10, "b": 3})
    obj = error_object(info.value)
    assert obj["code"] == -32602
    assert obj["data"]["code"] == "INVALID_PARAMS"
    errors = obj["data"]["errors"]
    assert {e["loc"] for e in errors} == {"a", "b"}
    assert all(set(e) == {"loc", "msg", "type"} for e in errors)
    assert "xxxxxxxxxx" not in orjson.dumps(obj).decode()  # input values are not echoed


def test_unexpected_exception_is_internal_without_details(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        obj = error_object(RuntimeError(SECRET))
    assert obj == {"code": -32603, "message": INTERNAL_MESSAGE, "data": {"code": "INTERNAL", "retriable": False}}
    assert SECRET not in orjson.dumps(obj).decode()
    assert any(SECRET in (r.exc_text or "") or r.exc_info for r in caplog.records)  # logged, not sent


def test_single_exception_group_is_unwrapped() -> None:
    obj = error_object(ExceptionGroup("g", [SessionNotFound("x")]))
    assert obj["data"]["code"] == "SESSION_NOT_FOUND"
    many = error_object(ExceptionGroup("g", [SessionNotFound("x"), ValueError("y")]))
    assert many["code"] == -32603


def test_base_exceptions_are_never_mapped() -> None:
    with pytest.raises(KeyboardInterrupt):
        error_object(KeyboardInterrupt())


def test_table_has_documented_numeric_ranges() -> None:
    for code, spec in RpcErrorCode.TABLE.items():
        assert spec.numeric in (-32700, -32600, -32601, -32602, -32603) or -32099 <= spec.numeric <= -32000, code


@pytest.mark.parametrize(
    ("value", "reason_part"),
    [
        ("text", "JSON object"),
        ({"method": "x", "id": 1}, "jsonrpc"),
        ({"jsonrpc": "1.0", "method": "x", "id": 1}, "jsonrpc"),
        ({"jsonrpc": "2.0", "id": 1}, "method"),
        ({"jsonrpc": "2.0", "method": 5, "id": 1}, "method"),
        ({"jsonrpc": "2.0", "method": "x", "id": 1, "params": "str"}, "params"),
        ({"jsonrpc": "2.0", "method": "x", "id": 1.5}, "id"),
        ({"jsonrpc": "2.0", "method": "x", "id": True}, "id"),
        ({"jsonrpc": "2.0", "method": "x", "id": [1]}, "id"),
        ({"jsonrpc": "2.0", "method": "x", "id": 2**70}, "id"),
    ],
)
def test_invalid_envelopes(value: object, reason_part: str) -> None:
    item = parse_message(value, max_batch=10)
    assert isinstance(item, Invalid)
    assert reason_part in item.reason


def test_valid_envelopes_and_batches() -> None:
    call = parse_message({"jsonrpc": "2.0", "method": "m", "id": "a", "params": [1]}, max_batch=10)
    assert call == Call(method="m", params=[1], id="a")
    note = parse_message({"jsonrpc": "2.0", "method": "m"}, max_batch=10)
    assert isinstance(note, Call) and note.is_notification and note.id is NO_ID and note.response_id is None
    null_id = parse_message({"jsonrpc": "2.0", "method": "m", "id": None}, max_batch=10)
    assert isinstance(null_id, Call) and not null_id.is_notification
    batch = parse_message([{"jsonrpc": "2.0", "method": "m", "id": 1}, 7], max_batch=10)
    assert isinstance(batch, list) and isinstance(batch[0], Call) and isinstance(batch[1], Invalid)
    assert isinstance(parse_message([], max_batch=10), Invalid)
    assert isinstance(parse_message([{}] * 11, max_batch=10), Invalid)


def test_unserializable_result_becomes_internal_error() -> None:
    data = orjson.loads(encode(success(3, {"x": object()})))
    assert data["id"] == 3 and data["error"]["code"] == -32603
    batch = orjson.loads(encode_batch([success(1, 1), success(2, {1, 2})]))
    assert batch[0]["result"] == 1 and batch[1]["error"]["code"] == -32603


def test_method_not_found_message() -> None:
    assert MethodNotFound("a.b").message == "method not found: a.b"
    assert MethodNotFound("method not found: a.b").data == {"method": "a.b"}


@pytest.mark.parametrize("request_id", [1, "req-é", None, 2**63 - 1])
def test_a_pre_encoded_result_is_framed_around_its_own_bytes(request_id: int | str | None) -> None:
    """Whole-history pages (issue 26 item 5): a ``session.get`` page is up to 16 MiB of pre-encoded JSON; its
    reply is the envelope's head, the page's own bytes object (not a copy) and the closing brace, and those
    pieces joined are exactly what ``encode`` writes for the same response."""
    data = orjson.dumps({"messages": [{"id": "m1", "text": "é" * 10}], "hasMoreAfter": False})
    response = success(request_id, Encoded(data))
    parts = encoded_parts(response)
    assert parts is not None and parts[1] is data
    assert b"".join(parts) == encode(response)
    assert orjson.loads(b"".join(parts)) == {"jsonrpc": "2.0", "id": request_id, "result": orjson.loads(data)}
    assert encoded_parts(success(request_id, {"a": 1})) is None
    assert encoded_parts({"jsonrpc": "2.0", "id": 1, "error": {"code": 1}}) is None


def test_permission_denied_message_carries_the_outbox_prefix_once() -> None:
    """Seed 003 D597: the desktop outbox drops a refused append "whose host error carries a PERMISSION_DENIED:
    prefix" by the message text; other codes keep their message as raised."""
    err = error_object(PermissionDenied("a plugin connection may not call session.delete"))
    assert err["message"] == "PERMISSION_DENIED: a plugin connection may not call session.delete"
    assert err["data"]["code"] == "PERMISSION_DENIED" and err["code"] == -32008
    again = error_object(PermissionDenied("PERMISSION_DENIED: already said"))
    assert again["message"] == "PERMISSION_DENIED: already said"
    assert error_object(SessionNotFound("no such session"))["message"] == "no such session"


def test_a_corrupt_index_is_corrupt_data_by_its_own_code() -> None:
    """Where the database is read and written (the read pool, the DB writer) a corrupt index is raised on as
    ``IndexCorrupt``, which carries CORRUPT_DATA; the translator classifies no SQLite text of its own."""
    met = sqlite3.DatabaseError("database disk image is malformed")
    err = error_object(index_corrupt(met))
    assert err["data"]["code"] == "CORRUPT_DATA" and err["data"]["reason"] == "index_corrupt"
    assert "restarts on an index rebuilt" in err["message"]
    assert index_corrupt(index_corrupt(met)).__cause__ is met and isinstance(index_corrupt(met), sqlite3.DatabaseError)


@pytest.mark.parametrize("value", [
    {"message": {"id": "m1", "seq": 3}, "replayed": False},
    {"a": "x" * 999},
    ["é" * 500, "b" * 400],
    [[1, 2]] * 200,
    [[]] * 400,
    {str(i): None for i in range(150)},
    [{"id": f"s{i}", "title": "t" * 40, "n": i, "x": None} for i in range(30)],
    Encoded(b"[" + b"1," * 600 + b"1]"),
    "q" * 1200,
])
def test_longer_than_counts_within_half_of_the_text(value: object) -> None:
    """longer_than decides whether encoding or hashing a value may run on the trio loop: its rough count
    of the JSON text is within half of the truth either way."""
    size = len(value.data) if isinstance(value, Encoded) else len(orjson.dumps(value).decode())
    assert longer_than(value, size // 2)
    assert not longer_than(value, 2 * size)


def test_a_long_string_is_encoded_chunk_by_chunk_to_the_same_bytes() -> None:
    """The content path encodes a string over BIG_STRING with orjson chunk by chunk (its scratch memory stays
    near a chunk's, not 16 times the string's): the bytes are orjson's and the stdlib's (which it replaced),
    escapes, non-ASCII, astral characters and the chunk ends wherever they fall."""
    every = "".join(chr(cp) for cp in range(0x800) if not 0xD800 <= cp < 0xE000)
    text = (every + "\U0001F600\u2028\u2029\x7f\"\\\n" + "x" * 1001) * 300  # ~900k characters
    assert dumps_long_string(text) == orjson.dumps(text) == json.dumps(text, ensure_ascii=False).encode("utf-8")
    response = success(7, {"messages": [{"text": text}, {"text": "short"}], "tail": text[:300_000]})
    assert encode(response, big_strings=True) == encode(response) == orjson.dumps(response)
    with pytest.raises(TypeError):
        dumps_long_string("a" * 70_000 + "\ud800")  # a lone surrogate fails as it did
    assert orjson.loads(encode(success(1, "b" * 300_000 + "\ud800"), big_strings=True))["error"]["code"] == -32603
