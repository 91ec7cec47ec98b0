"""A message whose line is over the largest reply (seed 003 §1 goal 3: "bounded renderer transcript reads
even when a session contains very large message content"; README §6 windows).

``import.sessions`` takes source lines up to 32 MiB, but ``session.get`` refused a page holding such a
message whatever it was asked: ``PAYLOAD_TOO_LARGE`` naming a ``maxBytes`` (the line's size) over the
16 MiB the params accept, even with ``contentLimit``; the message could not be read, nor could any page
go past it. With ``contentLimit`` it now comes alone in its page, its content cut; without it the error
names ``contentLimit``, never a ``maxBytes`` the params refuse."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from actors import gateway_connection
from runtime.client import HostClient, RpcError
from store.jsonio import loads_line
from store.rules import MAX_REPLY_BYTES
from store.transcripts.big_line import BIG_STRING, parse_capped
from store.transcripts.records import cap_content, wire_record
from store.transcripts.window_reply import Row, project_line
from tests.hostkit import client_for, inprocess_host, msg
from tests.threadkit import on_trio_thread

BIG = 17 * 1024 * 1024
TEXT = "".join(f"{i:09d}," for i in range(BIG // 10)) + "NEEDLEATEND"  # each prefix is its own


async def _imported(c: HostClient, tmp: Path) -> str:
    """A session m0, m1 (``TEXT``, assistant), m2 imported from a pi-host JSONL file: its new id."""
    sid = str((await c.call("session.create", {"title": "big"}))["id"])
    for i in range(3):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
    out = tmp / "out"
    out.mkdir()
    await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(out / "s.jsonl")})
    records = [json.loads(line) for line in (out / "s.jsonl").read_text().splitlines()]
    for rec in records:
        if rec.get("id") == "m1":
            rec["role"], rec["blocks"] = "assistant", [{"type": "text", "text": TEXT}]
    (out / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = await c.call("import.sessions", {"source": "pi-host", "root": str(out)})
    assert done["counts"]["new"] == 1 and done["unreadLines"] == 0
    return str(done["sessions"][0]["sessionId"])


def _cut(m: dict[str, Any], limit: int, seq: int) -> None:
    """``m`` is m1, its own id/seq/role, its text the message's own prefix, marked cut."""
    assert m["id"].endswith(":m1") or m["id"] == "m1"
    assert (m["seq"], m["role"], m["truncated"]) == (seq, "assistant", True)
    (block,) = m["blocks"]
    assert block["text"] == TEXT[:limit] and block["truncated"] is True and block["fullLength"] == len(TEXT)


async def test_a_message_over_the_largest_reply_is_read_cut_to_content_limit(tmp_path: Path) -> None:
    with trio.fail_after(240):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            sid = await _imported(c, tmp_path)

            # backward from the newest page: m2, then m1 alone (cut), then m0
            newest = await c.call("session.get", {"sessionId": sid, "contentLimit": 1000})
            assert [m["seq"] for m in newest["messages"]] == [3] and newest["hasMoreBefore"] is True
            page = await c.call("session.get", {"sessionId": sid, "contentLimit": 1000,
                                                "messageBefore": newest["messageStart"]})
            (big,) = page["messages"]
            _cut(big, 1000, 2)
            assert (page["messageStart"], page["messageEnd"], page["hasMoreBefore"]) == (1, 2, True)
            assert len(json.dumps(page)) < 64 * 1024
            older = await c.call("session.get", {"sessionId": sid, "contentLimit": 1000,
                                                 "messageBefore": page["messageStart"]})
            assert [m["seq"] for m in older["messages"]] == [1] and older["hasMoreBefore"] is False

            # forward, with the smallest budget the params accept: every message once, in order
            seen: list[int] = []
            end = 0
            while True:
                try:
                    fwd = await c.call("session.get", {"sessionId": sid, "messageEnd": end, "contentLimit": 2000,
                                                       "maxBytes": 1024})
                except RpcError as exc:  # the cut message's reply is over 1024 bytes: a budget that holds it
                    assert exc.data_code == "PAYLOAD_TOO_LARGE" and 1024 < exc.data["needed"] <= MAX_REPLY_BYTES
                    fwd = await c.call("session.get", {"sessionId": sid, "messageEnd": end, "contentLimit": 2000,
                                                       "maxBytes": exc.data["needed"]})
                    _cut(fwd["messages"][0], 2000, 2)
                seen += [m["seq"] for m in fwd["messages"]]
                end = fwd["messageEnd"]
                if not fwd["hasMoreAfter"]:
                    break
            assert seen == [1, 2, 3]

            # a search hit, opened around: the target whose line alone is over the budget comes cut too
            (hit,) = (await c.call("search.query", {"query": "NEEDLEATEND", "sessionId": sid}))["results"]
            around = await c.call("session.get", {"sessionId": sid, "messageAround": hit["messageId"],
                                                  "contentLimit": 500})
            (target,) = around["messages"]
            _cut(target, 500, hit["seq"])


async def test_without_content_limit_the_error_names_content_limit_not_an_unacceptable_max_bytes(
        tmp_path: Path) -> None:
    with trio.fail_after(240):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            sid = await _imported(c, tmp_path)
            for params in ({"messageBefore": 2}, {"messageEnd": 1}, {"messageBefore": 2, "maxBytes": 4096}):
                with pytest.raises(RpcError) as raised:
                    await c.call("session.get", {"sessionId": sid, **params})
                assert raised.value.data_code == "PAYLOAD_TOO_LARGE"
                assert raised.value.data["field"] == "contentLimit" and "needed" not in raised.value.data
                assert "contentLimit" in str(raised.value)
            page = await c.call("session.get", {"sessionId": sid, "messageBefore": 2, "contentLimit": 10})
            _cut(page["messages"][0], 10, 2)
            # a contentLimit that cuts nothing (the whole text fits it): still over the largest reply
            with pytest.raises(RpcError) as raised:
                await c.call("session.get", {"sessionId": sid, "messageBefore": 2, "contentLimit": 1 << 30})
            assert raised.value.data_code == "PAYLOAD_TOO_LARGE" and raised.value.data["field"] == "contentLimit"
            assert "needed" not in raised.value.data


# ------------------------------------------------------- the parse of a large line read cut (store level)

_ROW: Row = (5, 0, 0, 0, "t1", None, None)
_UNIT = 'a"b\\c\n\t/ é漢😀\x01'  # escapes, UTF-8 of 2-4 bytes, a surrogate pair when escaped, a control character
_LONG = _UNIT * 9000  # over BIG_STRING bytes in either spelling


def _whole(line: bytes, limit: int) -> dict[str, Any]:
    """The projection as a parse of the whole line gives it (the reference)."""
    try:
        rec = wire_record(loads_line(line))
    except ValueError:
        rec = {"type": "message", "id": None, "corrupt": True}
    rec["seq"] = _ROW[0]
    rec.setdefault("turnId", _ROW[4])
    return cap_content(rec, limit)


def _records() -> list[dict[str, Any]]:
    base = {"type": "message", "id": "m9", "role": "assistant", "createdAt": "2026-01-01T00:00:00.000Z"}
    return [
        {**base, "blocks": [{"type": "text", "text": _LONG}]},
        {**base, "blocks": [{"type": "thinking", "text": _LONG[3:]}, {"type": "text", "text": "short"},
                            {"type": "text", "text": _LONG[:-5]}]},
        {**base, "role": "tool", "blocks": [
            {"type": "tool_call", "name": "Write", "callId": "c1", "args": {"path": "x", "content": _LONG},
             "result": [{"k": _LONG}, 3]},
            {"type": "tool_call", "name": "Read", "callId": "c2", "args": _LONG, "result": _LONG[1:]}]},
        {**base, "blocks": [{"type": "text", "text": "small"}], "meta": {"note": _LONG}},  # not cut: whole parse
        {**base, "blocks": [{"type": "picture", "data": _LONG}]},  # an unknown block's field: whole parse
        {**base, "blocks": [{"type": "text", "text": _LONG}], "meta": {"receipt": {"k": "v"}, "note": "y"}},
    ]


@pytest.mark.parametrize("limit", [1, 7, 1000, 50_000])
@pytest.mark.parametrize("ascii_only", [False, True])
def test_a_large_line_read_cut_is_projected_as_a_whole_parse_projects_it(limit: int, ascii_only: bool) -> None:
    """``parse_capped`` leaves a line's large strings out of the parse; what it gives is exactly the whole
    parse's projection (text, fullLength, truncated marks, args/result cut as compact JSON), and a large
    string where nothing cuts it is parsed whole."""
    for i, record in enumerate(_records()):
        line = json.dumps(record, ensure_ascii=True).encode() if ascii_only else orjson.dumps(record)
        assert len(line) >= BIG_STRING
        if limit <= 1000:  # the strings over BIG_STRING sit where the cap cuts: not parsed (else: parsed whole)
            assert (parse_capped(line, limit) is None) == (i in (3, 4))
        assert project_line(line, _ROW, limit) == _whole(line, limit)
        assert project_line(memoryview(line), _ROW, limit) == _whole(line, limit)


@pytest.mark.parametrize("ascii_only", [False, True])
def test_a_line_of_several_chunks_counts_its_characters_across_the_chunk_ends(ascii_only: bool) -> None:
    """Over a MiB, a string is counted in chunks: escapes, UTF-8 sequences and surrogate pairs that a
    chunk end would split are counted once, as a whole parse counts them."""
    for shift in range(4):
        text = "x" * shift + _UNIT * 120_000
        record = {"type": "message", "id": "m9", "role": "user", "blocks": [{"type": "text", "text": text}]}
        line = json.dumps(record, ensure_ascii=True).encode() if ascii_only else orjson.dumps(record)
        assert parse_capped(line, 7) is not None
        got = project_line(line, _ROW, 7)
        assert got == _whole(line, 7) and got["blocks"][0]["fullLength"] == len(text)


def test_a_large_line_that_is_not_valid_json_text_reads_as_a_whole_parse_reads_it() -> None:
    """A lone surrogate, a bad escape, a raw control character or bad UTF-8 past the part read: the
    parse of the whole line refuses it (a corrupt placeholder), and so does the cut one."""
    head = b'{"type":"message","id":"x","role":"user","blocks":[{"type":"text","text":"'
    bad_ones = (b"\\ud800", b"\\udc00x", b"\\q",
                b"\\u12zz", b"\\", b"\x01", b"\xff", b"\\ud83d\\u0041", b"\xed\xa0\x80")
    for bad in bad_ones:
        line = head + b"a" * 100_000 + bad + b'"}]}'
        assert project_line(line, _ROW, 10) == _whole(line, 10) and _whole(line, 10)["corrupt"] is True
    good = head + b"a" * 100_000 + b'\\u0041\\ud83d\\ude00\\u00e9"}]}'
    assert project_line(good, _ROW, 10) == _whole(good, 10)
    assert project_line(good, _ROW, 10)["blocks"][0]["fullLength"] == 100_003


def test_a_large_line_read_cut_costs_less_memory_than_its_own_bytes() -> None:
    """Parsed whole, a line costs some 14 times its bytes while it is parsed (the parser sizes its work
    by its input) and its text besides: the line of a 17 MiB message briefly held 240 MiB to show 1000
    characters. Read cut, it costs less than its own bytes (they are read once, by the caller)."""
    line = orjson.dumps({"type": "message", "id": "m1", "role": "assistant",
                         "blocks": [{"type": "text", "text": TEXT}]})
    tracemalloc.start()
    try:
        got = project_line(line, _ROW, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got["blocks"][0]["text"] == TEXT[:1000] and got["blocks"][0]["fullLength"] == len(TEXT)
    assert peak < len(line) // 4, peak


async def test_a_long_read_reply_is_encoded_off_the_trio_thread(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A read's reply of megabytes (session.context: up to 16 MiB, not pre-encoded) is encoded
    in a worker thread, never on the trio loop (~7 ms of orjson, ~53 ms with the content path's long strings
    through the stdlib encoder before). Short replies (an append's, a small read's) are still encoded by the
    task that answered, on the loop: no thread hop for them."""
    seen: list[tuple[int, bool]] = []
    encode = gateway_connection.encode

    def encode_seen(response: dict[str, Any], **kwargs: Any) -> bytes:
        data = encode(response, **kwargs)
        seen.append((len(data), on_trio_thread()))
        return data

    monkeypatch.setattr(gateway_connection, "encode", encode_seen)
    text = "long é\n\"line\"\u2028 " * 60_000  # ~1.3 MB, escapes and non-ASCII throughout
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "long"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "short")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", text, role="assistant")})
            context = await c.call("session.context", {"sessionId": sid})
            tree = await c.call("session.tree", {"sessionId": sid})  # previews only: a short reply
            small = await c.call("session.listTurns", {"sessionId": sid})
    assert [m["blocks"][0]["text"] for m in context["messages"]] == ["short", text]
    assert [n["id"] for n in tree["nodes"]] == ["u1", "a1"]
    assert small == {**small, "turns": []}
    long_ones = [on_trio for size, on_trio in seen if size > len(text)]
    short_ones = [on_trio for size, on_trio in seen if size < 64 * 1024]
    assert long_ones == [False]  # the context, in a worker thread
    assert len(short_ones) == 6 and all(short_ones)  # hello, create, 2 appends, the tree, listTurns: on the loop
