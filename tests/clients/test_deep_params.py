"""Params nested past what the host reads are refused by the Python clients before anything is sent, with the
code the host gives them (``PARSE_ERROR``, protocol/README "JSON input must be strict"), and the connection goes
on: ``pihost_client`` at the host's own limit (``MAX_JSON_DEPTH`` containers, the request object being level 1;
its encoder raised a bare ``RecursionError`` past ~1000 levels), the host's own ``HostClient`` past what orjson
writes (254 levels: it raised orjson's bare ``TypeError``; up to there it sends, so tests see the host's answer).
Params JSON cannot carry (NaN, a set, bytes; a ``datetime``, a ``UUID``, a dataclass or an ``Enum``, which orjson
wrote as another value; a lone surrogate; for ``pihost_client`` an integer outside the signed 64-bit range) are
refused by both before sending too (one shared check, protocol/unsendable.py), as ``INVALID_PARAMS`` naming where."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import re
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from pihost_client import MAX_JSON_DEPTH as CLIENT_MAX_DEPTH
from pihost_client import RpcError, connect
from runtime.client import RpcError as HostRpcError
from runtime.client import open_client
from store.rules import MAX_JSON_DEPTH
from tests.hostkit import HostProcess, start_host_process


def nest(levels: int) -> Any:
    """``levels`` lists, one inside the other."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def stop(host: HostProcess) -> None:
    host.terminate()
    host.proc.communicate()


def test_the_client_knows_the_hosts_limit() -> None:
    assert CLIENT_MAX_DEPTH == MAX_JSON_DEPTH == 64


async def test_params_nested_past_the_hosts_limit_never_leave_the_client(tmp_path: Path) -> None:
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            # the request object is level 1, params level 2, so nest(62) is the deepest the host reads
            async with open_client(host.url, host.token, client_id="deep-raw") as raw:
                with pytest.raises(HostRpcError) as within:
                    await raw.call("session.list", {"x": nest(MAX_JSON_DEPTH - 2)})
                assert within.value.data_code == "INVALID_PARAMS"  # read, then refused for the unknown key
                with pytest.raises(HostRpcError) as past:
                    await raw.call("session.list", {"x": nest(MAX_JSON_DEPTH - 1)})
                assert past.value.data_code == "PARSE_ERROR"  # the host's own answer
                for levels in (300, 5000):
                    with pytest.raises(HostRpcError) as refused:
                        await raw.call("session.list", {"x": nest(levels)})
                    assert refused.value.data_code == "PARSE_ERROR" and refused.value.data["sent"] is False
                    assert f"more than {MAX_JSON_DEPTH} containers" in refused.value.message
                    assert "nothing was sent" in refused.value.message
                assert (await raw.call("session.list", {}))["sessions"] == []  # the connection goes on
            async with connect(data_dir=tmp_path, client_id="deep-sdk") as c:
                with pytest.raises(RpcError) as within_sdk:
                    await c.call("session.list", {"x": nest(MAX_JSON_DEPTH - 2)})
                assert within_sdk.value.data_code == "INVALID_PARAMS"  # sent: the host read it
                for levels in (MAX_JSON_DEPTH - 1, 300, 5000):
                    with pytest.raises(RpcError) as refused_sdk:
                        await c.call("session.list", {"x": nest(levels)})
                    err = refused_sdk.value
                    assert err.data_code == "PARSE_ERROR" and not err.retriable, levels
                    assert err.data["maxDepth"] == MAX_JSON_DEPTH and err.data["sent"] is False
                    assert f"deeper than {MAX_JSON_DEPTH} containers" in err.message
                with pytest.raises(RpcError):  # a typed method goes through the same check
                    await c.settings.set(ns="ui", key="deep", value=nest(MAX_JSON_DEPTH))
                assert c.connected and c.connects == 1  # the connection went on, never dropped
                assert (await c.call("session.list", {}))["sessions"] == []
    finally:
        stop(host)


class Opaque:
    """An object JSON has no form for."""


class Colour(enum.Enum):
    """An enum that is no ``int`` or ``str``: orjson wrote its value."""

    RED = "red"


class Level(enum.IntEnum):
    """An ``int`` too: sent as that integer by both clients."""

    HIGH = 3


class Tone(enum.StrEnum):
    """A ``str`` too: sent as that string by both clients."""

    WARM = "warm"


@dataclasses.dataclass
class Point:
    """A dataclass: orjson wrote it as an object."""

    x: int


AT = datetime.datetime(2026, 12, 7, 10, 0, tzinfo=datetime.UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")


UNSENDABLE: list[tuple[dict[str, Any], str, str]] = [
    # params, what the message names, where (data.errors[0].loc: the host's dotted spelling)
    ({"x": float("nan")}, "NaN at params.x", "x"),
    ({"x": {"y": [1.5, float("inf")]}}, "Infinity at params.x.y[1]", "x.y.1"),
    ({"x": -float("inf")}, "-Infinity at params.x", "x"),
    ({"items": [1, 2, {3}]}, "a set at params.items[2]", "items.2"),
    ({"x": [b"raw"]}, "a bytes at params.x[0]", "x.0"),
    ({"x": {"deep": Opaque()}}, "an Opaque at params.x.deep", "x.deep"),
    ({"x": {(1, 2): "tuple key"}}, "a key of type tuple at params.x", "x"),
    ({"x": {"odd key": {float("nan"): 1}}}, "a NaN key at params.x[\"odd key\"]", "x.odd key"),
    # what orjson wrote without a word (a string, an object or a value the caller did not write)
    ({"x": {"at": AT}}, "a datetime at params.x.at", "x.at"),
    ({"x": [AT.date()]}, "a date at params.x[0]", "x.0"),
    ({"x": AT.time()}, "a time at params.x", "x"),
    ({"x": ID}, "a UUID at params.x", "x"),
    ({"x": {"p": Point(1)}}, "a Point at params.x.p", "x.p"),
    ({"x": Colour.RED}, "a Colour at params.x", "x"),
    # no UTF-8 frame carries a lone surrogate (pihost_client: a bare UnicodeEncodeError from the socket; HostClient:
    # orjson's bare message, no path)
    ({"x": {"text": "a\ud800b"}}, "a lone surrogate at params.x.text", "x.text"),
    ({"x": ["ok", "\udfff"]}, "a lone surrogate at params.x[1]", "x.1"),
    ({"x": {"k\udc00": 1}}, "a lone surrogate in a key at params.x", "x"),
]

WIDE_INTS: list[tuple[dict[str, Any], str, str]] = [
    # integers the host refuses as PARSE_ERROR (outside the signed 64-bit range): pihost_client refuses them before
    # sending; HostClient sends them, so tests see the host's answer
    ({"x": 2**63}, "an integer outside the signed 64-bit range at params.x", "x"),
    ({"x": [-(2**63) - 1]}, "an integer outside the signed 64-bit range at params.x[0]", "x.0"),
    ({"x": {"y": 2**70}}, "an integer outside the signed 64-bit range at params.x.y", "x.y"),
]


async def test_params_json_cannot_carry_are_refused_before_sending(tmp_path: Path) -> None:
    """NaN, ±Infinity and values JSON has no form for (a set, bytes, any other object, a key that is no string or
    number) are refused before anything is sent, as an ``RpcError`` ``INVALID_PARAMS`` naming the method and where
    the value is (``data.sent`` false, ``data.errors[0].loc``), like params nested too deep: the encoder raised a
    bare ``ValueError`` (``allow_nan=False``) or ``TypeError`` out of the call instead, which a caller handling the
    SDK's ``RpcError`` did not expect and which did not say whether anything was sent. The refusal needs no
    connection (it came only once one was up), and the connection and a retry-safe write's key are untouched: the
    same ``submissionId`` with good params then applies once."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    stopped = False
    try:
        with trio.fail_after(60):
            async with connect(data_dir=tmp_path, client_id="unsendable-sdk", reconnect_timeout=2) as c:
                for params, named, loc in UNSENDABLE + WIDE_INTS:
                    with pytest.raises(RpcError) as refused:
                        await c.call("session.list", params)
                    err = refused.value
                    assert err.data_code == "INVALID_PARAMS" and err.code == -32602 and not err.retriable, named
                    assert err.data["sent"] is False, named
                    assert err.message.startswith("session.list: params hold ") and named in err.message, err.message
                    assert "which JSON cannot carry; nothing was sent" in err.message
                    assert [e["loc"] for e in err.field_errors] == [loc], err.data
                # a typed write: refused before its key is spent, so the same key with good params applies once
                with pytest.raises(RpcError) as typed:
                    await c.settings.set(ns="ui", key="k", value={"w": float("nan")}, submission_id="nan-1")
                assert typed.value.data_code == "INVALID_PARAMS" and typed.value.data["sent"] is False
                assert "settings.set: params hold NaN at params.value.w" in typed.value.message
                with pytest.raises(RpcError) as generated_key:  # a key the client generates: the same
                    await c.settings.set(ns="ui", key="k", value=[{1, 2}])
                assert generated_key.value.data_code == "INVALID_PARAMS"
                assert "a set at params.value[0]" in generated_key.value.message
                await c.settings.set(ns="ui", key="k", value={"w": 1.5}, submission_id="nan-1")
                assert (await c.settings.get(ns="ui", key="k"))["value"] == {"w": 1.5}
                assert c.connected and c.connects == 1  # the connection went on, never dropped
                assert (await c.call("session.list", {}))["sessions"] == []
                # no connection needed: refused at once while the host is gone, not after reconnect_timeout
                await trio.to_thread.run_sync(stop, host)  # the client answers the host's close meanwhile
                stopped = True
                with pytest.raises(RpcError) as offline:
                    await c.call("session.list", {"x": float("nan")})
                assert offline.value.data_code == "INVALID_PARAMS" and offline.value.data["sent"] is False
    finally:
        if not stopped:
            stop(host)


async def test_the_hosts_own_client_refuses_what_json_cannot_carry(tmp_path: Path) -> None:
    """The host's ``HostClient`` (the CLI's and the tests') refuses the same params with the same error as
    ``pihost_client`` (the one shared check): orjson wrote NaN and ±Infinity as ``null`` (the host got another
    value than the caller's) and raised its bare ``TypeError`` for a set, bytes or a tuple key. Nothing is sent;
    a batch holding one such request is refused whole; ``subscribe`` runs the same check; values orjson has no
    form for but JSON has (an integer key, an integer past 64 bits) are still sent, a lone surrogate (no UTF-8
    frame carries it) is refused too, and the connection goes on."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            async with open_client(host.url, host.token, client_id="unsendable-raw") as raw:
                for params, named, loc in UNSENDABLE:
                    with pytest.raises(HostRpcError) as refused:
                        await raw.call("session.list", params)
                    err = refused.value
                    assert err.data_code == "INVALID_PARAMS" and err.code == -32602 and not err.retriable, named
                    assert err.data["sent"] is False, named
                    said = f"session.list: params hold {named}, which JSON cannot carry; nothing was sent"
                    assert err.message == said
                    assert [e["loc"] for e in err.data["errors"]] == [loc], err.data
                with pytest.raises(HostRpcError) as batch:
                    await raw.batch([("session.list", {}), ("settings.get", {"ns": "ui", "key": float("nan")})])
                assert batch.value.data["sent"] is False
                assert batch.value.message.startswith("settings.get: params hold NaN at params.key")
                with pytest.raises(HostRpcError) as notified:
                    await raw.notify("session.list", {"x": {1, 2}})
                assert notified.value.data["sent"] is False and "a set at params.x" in notified.value.message
                with pytest.raises(HostRpcError) as subscribed:
                    await raw.subscribe(["session.message"], cursor=float("inf"))  # type: ignore[arg-type]
                assert subscribed.value.message.startswith("events.subscribe: params hold Infinity at params.cursor")
                with pytest.raises(HostRpcError) as surrogate:  # no UTF-8 text carries it: refused, not sent
                    await raw.call("session.list", {"x": "a\ud800"})
                assert surrogate.value.data_code == "INVALID_PARAMS" and surrogate.value.data["sent"] is False
                assert "at params.x, which JSON cannot carry" in surrogate.value.message
                for carried in ({"x": {1: "int key"}}, {"x": 2**70}):  # orjson refuses these; JSON carries them
                    with pytest.raises(HostRpcError) as answered:
                        await raw.call("session.list", carried)
                    assert "sent" not in answered.value.data, carried  # the host's answer (unknown key; too big)
                assert (await raw.call("session.list", {}))["sessions"] == []  # the connection goes on
    finally:
        stop(host)


async def test_subscribe_params_go_through_the_same_check(tmp_path: Path) -> None:
    """``pihost_client``'s ``subscribe()`` refuses topics or a session id JSON cannot carry as its calls do
    (``INVALID_PARAMS``, ``data.sent`` false, naming ``events.subscribe`` and where): it raised the encoder's bare
    ``ValueError`` / ``TypeError`` instead. Nothing is kept to resubscribe, and the connection goes on."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            async with connect(data_dir=tmp_path, client_id="unsendable-sub") as c:
                bad: list[tuple[list[Any], Any, str]] = [
                    ([float("nan")], None, "NaN at params.topics[0]"),
                    (["session.message"], {"s"}, "a set at params.sessionId"),
                ]
                for topics, session_id, named in bad:
                    with pytest.raises(RpcError) as refused:
                        async with c.subscribe(topics, session_id=session_id):
                            pass
                    err = refused.value
                    assert err.data_code == "INVALID_PARAMS" and err.data["sent"] is False, named
                    assert err.message.startswith(f"events.subscribe: params hold {named}"), err.message
                with pytest.raises(RpcError) as too_deep:
                    async with c.subscribe(nest(MAX_JSON_DEPTH)):
                        pass
                assert too_deep.value.data_code == "PARSE_ERROR" and too_deep.value.data["sent"] is False
                assert not c._subscriptions  # nothing left to resubscribe on a reconnect
                assert c.connected and c.connects == 1
                async with c.subscribe(["session.message"]) as events:
                    assert events.wire_id is not None
    finally:
        stop(host)


def message(text: Any, at: Any = 1) -> dict[str, Any]:
    """A user message whose ``meta.at`` is ``at``."""
    return {"id": "m1", "role": "user", "blocks": [{"type": "text", "text": text}], "meta": {"at": at}}


SILENT: list[tuple[dict[str, Any], str]] = [
    # a message orjson wrote with another value than the caller's (HostClient stored it), or no frame carries
    (message("hi", AT), "a datetime at params.message.meta.at"),
    (message("hi", ID), "a UUID at params.message.meta.at"),
    (message("hi", Point(2)), "a Point at params.message.meta.at"),
    (message("hi", Colour.RED), "a Colour at params.message.meta.at"),
    (message("a\ud800"), "a lone surrogate at params.message.blocks[0].text"),
    (message("hi", 2**64), "an integer outside the signed 64-bit range at params.message.meta.at"),
]


async def test_a_refused_message_never_reaches_the_host(tmp_path: Path) -> None:
    """A message holding a value JSON cannot carry as it is (a ``datetime``, a ``UUID``, a dataclass, an ``Enum``:
    orjson wrote them as a string, an object or the enum's value, so the host's own client stored a message the
    caller did not write; a lone surrogate: ``pihost_client``'s socket raised a bare ``UnicodeEncodeError`` once the
    call was marked sent) is refused by both clients before any frame leaves, naming where
    (``params.message.meta.at``), and the session holds no message after it. ``pihost_client``'s retries do not run
    on the refusal (one try, no frame, no reconnect), and the write's ``submissionId`` is not spent: the same key with
    a good message then applies once. An ``IntEnum`` or ``StrEnum`` is an ``int`` or ``str``: both clients send that
    value, as the standard encoder does."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            async with connect(data_dir=tmp_path, client_id="silent-sdk", reconnect_timeout=2) as c:
                sid = (await c.session.create(title="SDK"))["id"]
                conn = c._conn
                assert conn is not None
                frames: list[str] = []
                send = conn.ws.send

                async def counted(text: str) -> None:
                    frames.append(text)
                    await send(text)

                conn.ws.send = counted  # type: ignore[method-assign]
                for bad, named in SILENT:
                    with pytest.raises(RpcError) as refused:
                        await c.session.append_message(session_id=sid, message=bad,  # type: ignore[arg-type]
                                                       submission_id="silent-1")
                    err = refused.value
                    assert err.data_code == "INVALID_PARAMS" and not err.retriable and err.data["sent"] is False
                    assert f"session.appendMessage: params hold {named}, which JSON cannot carry" in err.message
                assert frames == [] and c.connects == 1  # nothing left, no retry, no reconnect
                assert (await c.session.get(session_id=sid))["messages"] == []
                await c.session.append_message(session_id=sid, message=message("hi"),  # type: ignore[arg-type]
                                               submission_id="silent-1")
                messages = (await c.session.get(session_id=sid))["messages"]
                assert [m["id"] for m in messages] == ["m1"]
                await c.settings.set(ns="ui", key="enums", value={"level": Level.HIGH, "tone": Tone.WARM})
                assert (await c.settings.get(ns="ui", key="enums"))["value"] == {"level": 3, "tone": "warm"}
            async with open_client(host.url, host.token, client_id="silent-raw") as raw:
                sid = (await raw.call("session.create", {"title": "raw"}))["id"]
                for bad, named in SILENT[:-1]:  # HostClient sends an integer past 64 bits (the host's answer)
                    with pytest.raises(HostRpcError) as raw_refused:
                        await raw.call("session.appendMessage", {"sessionId": sid, "message": bad})
                    said = f"session.appendMessage: params hold {named}, which JSON cannot carry; nothing was sent"
                    assert raw_refused.value.message == said and raw_refused.value.data["sent"] is False
                got = await raw.call("session.get", {"sessionId": sid})
                assert got["messages"] == []
                await raw.call("settings.set", {"ns": "ui", "key": "enums2",
                                                "value": {"level": Level.HIGH, "tone": Tone.WARM}})
                answer = await raw.call("settings.get", {"ns": "ui", "key": "enums2"})
                assert answer["value"] == {"level": 3, "tone": "warm"}
    finally:
        stop(host)


async def test_the_host_refuses_an_escaped_lone_surrogate_as_the_clients_do(tmp_path: Path) -> None:
    """The clients refuse a lone surrogate before sending; a frame that carries one as an escape (``"\\ud800"`` in
    JSON text, valid UTF-8) is refused by the host too, as ``PARSE_ERROR`` with ``id: null`` (protocol/README "JSON
    input must be strict"), and nothing is written: the two agree that such a string is never taken."""
    host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    try:
        with trio.fail_after(60):
            async with open_websocket_url(host.url) as ws:
                await ws.send_message(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "host.hello", "params": {
                    "token": host.token, "clientId": "escaped", "clientKind": "test", "protocol": 1}}).decode())
                assert "result" in orjson.loads(await ws.get_message())
                for text in ('"a\\ud800b"', '"\\udfff"', '"\\ude00\\ud83d"'):
                    await ws.send_message('{"jsonrpc": "2.0", "id": 2, "method": "settings.set", "params": '
                                          f'{{"ns": "ui", "key": "lone", "value": {text}}}}}')
                    answer = orjson.loads(await ws.get_message())
                    assert answer["id"] is None and answer["error"]["data"]["code"] == "PARSE_ERROR", answer
                await ws.send_message('{"jsonrpc": "2.0", "id": 3, "method": "settings.get", '
                                      '"params": {"ns": "ui", "key": "lone"}}')
                got = orjson.loads(await ws.get_message())
                assert got["id"] == 3 and "value" not in got["result"], got
                await ws.aclose()
            async with connect(data_dir=tmp_path, client_id="escaped-sdk") as c:
                with pytest.raises(RpcError) as refused:
                    await c.settings.set(ns="ui", key="lone", value="a\ud800b")
                assert refused.value.data["sent"] is False
                assert "a lone surrogate at params.value" in refused.value.message
    finally:
        stop(host)


_SUSPECT_BY_REGEX = re.compile("[\ud800-\udfff]|[0-9]{19}")


@settings(deadline=None)
@given(st.lists(st.sampled_from(["0", "7", "9", "12345678", "a", "é", "日", "\U0001f600", "\ud800", "\udfff", " ",
                                 '"', "\\", "{"]), max_size=60).map("".join))
def test_the_clients_quick_look_finds_what_the_expression_finds(text: str) -> None:
    """``pihost_client``'s look for a lone surrogate or 19 digits in a row in an encoded call (before the walk that
    names them) answers as the regular expression it replaces did, for digits next to wide characters too."""
    from pihost_client.client import _suspect

    assert _suspect(text) is (_SUSPECT_BY_REGEX.search(text) is not None)
    assert _suspect(text + "1" * 19) and _suspect("\udc00" + text)
