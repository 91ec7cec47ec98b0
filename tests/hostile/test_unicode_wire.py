"""Unicode and encoding audit over the wire: legal-but-nasty text reaching a real host.

What the neighbours already hold is not repeated here: strict JSON decoding (tests/store/test_jsonio.py),
the search fold rules against a store-level corpus (tests/store/test_search.py), NUL in paths and
integers beyond int64 (tests/hostile/test_input.py), a byte order mark or a missing final newline in an
import source (tests/importers/test_reader.py). This file checks, black-box over WebSocket, that every
acknowledged text reads back exactly as sent (also after a restart), that the transcript files stay
valid UTF-8 JSONL, that refused text changes nothing, that search counts equal a brute-force scan of
what was stored, and that an import source with bad bytes keeps its session.
"""

from __future__ import annotations

import base64
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Request, TextMessage

from runtime.client import HostClient, RpcError
from runtime.host import RunningHost
from store.rules import label_problem
from store.search.search_text import fold
from tests.hostile.wire import error_code, exchange, hello_frame, raw_connection, request
from tests.hostkit import client_for, inprocess_host, msg
from tests.importers.gen import Response, User, claude_code_lines, codex_lines, pi_lines

NASTY = [
    "nul\x00inside", "\x00", "c0 \x01\x02\x1b\x1f\x7f end", "line\u2028sep\u2029para", "\ufeffbom first",
    "cafe\u0301 (NFD)", "caf\u00e9 (NFC)", "\u202eevil\u202c \u2067rtl\u2069", "👨\u200d👩\u200d👧\u200d👦 family",
    "ＦＵＬＬ ｗｉｄｔｈ", "\U0010ffff\ufffe\uffff\ufffd", "cr\rlf\ntab\t", " padded ", "İSTANBUL ſ K",
    "東京都渋谷区", "🇫🇷🇩🇪 flags", "z\u0336\u0301\u0308\u20dd stacked", "x" * 70_000, "😀" * 20_000,
]


def _transcript_lines(root: Path) -> Iterator[Any]:
    """Every line of every transcript under ``root``, parsed: UTF-8 and one JSON object per ``\\n`` line
    (U+2028 and a bare CR inside a string are not line ends)."""
    files = list((root / "sessions").rglob("*.jsonl"))
    assert files
    for path in files:
        data = path.read_bytes()
        assert data.endswith(b"\n"), path
        for line in data.decode("utf-8").split("\n")[:-1]:
            yield orjson.loads(line)


def _task_title(text: str) -> str:
    """The title a task gets: the text's first 200 characters, read back exactly (a title ending in a tab, one
    holding CR and LF too), or a plain one where the label rule refuses them (a NUL, another control character)."""
    return text[:200] if label_problem(text[:200]) is None else f"title {len(text)}"


async def _fill(c: HostClient) -> dict[str, Any]:
    """Send NASTY everywhere text goes; what each place must read back."""
    with pytest.raises(RpcError) as refused:  # a label holds no control character but tab, LF, CR (store.rules)
        await c.call("session.create", {"sessionId": "s1", "title": "\u202e😀e\u0301\x01 t"})
    assert refused.value.data_code == "INVALID_PARAMS"
    sid = (await c.call("session.create", {"sessionId": "s1", "title": "\u202e😀e\u0301\t t"}))["id"]
    for i, text in enumerate(NASTY):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"u{i}", text)})
        await c.call("session.appendMessage", {"sessionId": sid, "message": {
            "id": f"a{i}", "role": "assistant", "blocks": [
                {"type": "thinking", "text": text},
                {"type": "tool_call", "callId": f"c{i}", "name": "bash", "args": {text: [text, {"k": text}]}}]}})
        await c.call("session.appendMessage", {"sessionId": sid, "message": {
            "id": f"t{i}", "role": "tool", "toolName": "bash", "blocks": [
                {"type": "tool_call", "callId": f"c{i}", "name": "bash", "status": "ok", "result": text}]}})
        if label_problem(text[:200]) is not None:  # a NUL or another control in a title: refused, nothing stored
            with pytest.raises(RpcError) as refused:
                await c.call("tasks.create", {"taskId": f"task{i}", "title": text[:200], "prompt": text})
            assert refused.value.data_code == "INVALID_PARAMS"
        await c.call("tasks.create", {"taskId": f"task{i}", "title": _task_title(text), "prompt": text})
        blob = await c.call("attachments.put", {"name": text[:255], "mimeType": "text/plain",
                                                "dataBase64": base64.b64encode(text.encode()).decode()})
        assert blob["name"] == text[:255]
        await c.call("settings.set", {"ns": "app", "key": f"k{i}", "value": {text[:2000]: text[:2000]}})
    await c.call("settings.set", {"ns": "app", "key": "\u202e😀e\u0301\x00", "value": 1})
    renamed = await c.call("session.rename", {"sessionId": sid, "title": "😀" * 80})  # 80 code points, 320 bytes
    assert renamed["title"] == "😀" * 80
    return {"messages": (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]}


async def _check(c: HostClient, sent: dict[str, Any]) -> None:
    messages = {m["id"]: m for m in (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]}
    assert list(messages.values()) == sent["messages"]
    for i, text in enumerate(NASTY):
        assert messages[f"u{i}"]["blocks"] == [{"type": "text", "text": text}]
        thinking, call = messages[f"a{i}"]["blocks"]
        assert thinking["text"] == text and call["args"] == {text: [text, {"k": text}]}
        assert messages[f"t{i}"]["blocks"][0]["result"] == text
        task = await c.call("tasks.get", {"taskId": f"task{i}"})
        task = task.get("task", task)
        assert (task["title"], task["prompt"]) == (_task_title(text), text)
        assert (await c.call("settings.get", {"ns": "app", "key": f"k{i}"}))["value"] == {text[:2000]: text[:2000]}
    assert (await c.call("settings.get", {"ns": "app", "key": "\u202e😀e\u0301\x00"}))["value"] == 1
    assert (await c.call("session.get", {"sessionId": "s1"}))["session"]["title"] == "😀" * 80


async def test_nasty_text_reads_back_exactly_everywhere_and_after_a_restart(tmp_path: Path) -> None:
    """C0 controls and NUL, U+2028/2029, a BOM, combining marks, RTL overrides, ZWJ sequences,
    noncharacters, NFC and NFD spellings, full-width forms and very long single words, in message text,
    thinking, tool args (keys too) and results, task titles and prompts, attachment names and settings:
    each reads back as sent, the transcript stays UTF-8 JSONL, and a restarted host serves the same. A title is a
    label (store.rules.label_problem): one holding a NUL or a control other than tab, LF, CR is refused instead."""
    with trio.fail_after(90):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sent = await _fill(c)
            await _check(c, sent)
        texts = [line["blocks"][0].get("text") for line in _transcript_lines(tmp_path)
                 if line.get("type") == "message" and line["id"].startswith("u")]
        assert texts == NASTY  # the file holds the text itself, not a lossy stand-in
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await _check(c, sent)


SURROGATE_ESCAPES = ["\\ud800", "\\udfff", "\\ude00\\ud83d", "x\\ud83dy", "\\ud83d\\ud83d\\ude00", "\\ud83d"]


async def test_lone_and_reversed_surrogate_escapes_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """JSON allows ``\\ud800`` but it cannot be stored as UTF-8: every text place answers PARSE_ERROR
    (documented), nothing is stored, the connection and host keep serving; an escaped valid pair is the
    character itself."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            places = [
                ("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "@@")}),
                ("session.appendMessage", {"sessionId": "s1", "message": {"id": "m1", "role": "assistant", "blocks": [
                    {"type": "tool_call", "callId": "c1", "name": "bash", "args": {"@@": "@@"}}]}}),
                ("session.create", {"sessionId": "s2", "title": "@@"}),
                ("session.rename", {"sessionId": "s1", "title": "@@"}),
                ("settings.set", {"ns": "app", "key": "k", "value": "@@"}),
                ("settings.set", {"ns": "app", "key": "@@", "value": 1}),
                ("tasks.create", {"taskId": "task1", "title": "t", "prompt": "@@"}),
                ("search.query", {"query": "ab@@"}),
            ]
            async with raw_connection(host.url, host.token) as ws:
                for method, params in places:
                    for escape in SURROGATE_ESCAPES:
                        frame = request(method, params).replace("@@", escape)
                        assert error_code(await exchange(ws, frame)) == "PARSE_ERROR", (method, escape)
                ok = await exchange(ws, request("session.appendMessage", {
                    "sessionId": "s1", "message": msg("m2", "@@")}).replace("@@", "\\ud83d\\ude00\\u0000\\u2028"))
                assert "result" in ok, ok
            got = (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]
            assert [(m["id"], m["blocks"][0]["text"]) for m in got] == [("m2", "😀\x00\u2028")]
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"]["title"] == "t"
            assert (await c.call("settings.get", {"ns": "app", "key": "k"})).get("value") is None
            assert (await c.call("tasks.list", {})).get("tasks") in ([], None)
            with pytest.raises(RpcError):
                await c.call("session.get", {"sessionId": "s2"})
        assert [line.get("id") for line in _transcript_lines(tmp_path) if line.get("type") == "message"] == ["m2"]


def _masked(opcode: int, payload: bytes, fin: bool) -> bytes:
    """One client WebSocket frame (masked), written by hand: a fragment may end inside a character."""
    key = os.urandom(4)
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class _RawSocket:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def events(self) -> list[Any]:
        """The next events; a CloseConnection when the host closed (or dropped) the connection."""
        while True:
            data = await self.stream.receive_some(65536)
            if not data:
                return [CloseConnection(code=1006)]
            self.ws.receive_data(data)
            out = list(self.ws.events())
            if out:
                return out


async def _open_raw(host: RunningHost) -> _RawSocket:
    authority, _, path = host.url.split("//", 1)[1].partition("/")
    name, port = authority.rsplit(":", 1)
    raw = _RawSocket(await trio.open_tcp_stream(name, int(port)))
    await raw.stream.send_all(raw.ws.send(Request(host=authority, target="/" + path)))
    assert isinstance((await raw.events())[0], AcceptConnection)
    await raw.stream.send_all(raw.ws.send(Message(data=hello_frame(host.token))))
    assert "result" in orjson.loads((await raw.events())[0].data)
    return raw


async def test_characters_split_across_frames_are_reassembled_and_bad_utf8_closes_only_that_socket(
        tmp_path: Path) -> None:
    """A 4-byte emoji and a ZWJ sequence cut across continuation frames (mid-character) arrive whole; a
    frame with an encoded surrogate, an overlong encoding or a code point past U+10FFFF (not UTF-8) fails
    that connection (a 1007 close frame or the TCP stream closed: RFC 6455 allows either) without running
    anything, and the host goes on serving."""
    text = "a😀b👨\u200d👩\u200d👧c"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            raw = await _open_raw(host)
            body = request("session.appendMessage", {"sessionId": "s1", "message": msg("m1", text)}).encode()
            cut1, cut2 = body.index("😀".encode()) + 2, body.index("👧".encode()) + 3
            await raw.stream.send_all(_masked(1, body[:cut1], False) + _masked(0, body[cut1:cut2], False)
                                      + _masked(0, body[cut2:], True))
            (answer,) = await raw.events()
            await raw.stream.aclose()
            assert isinstance(answer, TextMessage) and "result" in orjson.loads(answer.data), answer
            for bad in (b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xff"):
                raw = await _open_raw(host)
                frame = body.replace(b"m1", b"m2").replace("😀".encode(), bad)
                try:
                    await raw.stream.send_all(_masked(1, frame, True))
                    closed = (await raw.events())[0]
                finally:
                    await raw.stream.aclose()
                assert isinstance(closed, CloseConnection) and closed.code in (1007, 1006), closed
            got = (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]
            assert [(m["id"], m["blocks"][0]["text"]) for m in got] == [("m1", text)]


SEARCH_TEXTS = [
    "café au lait", "cafe\u0301 au lait", "👨\u200d👩\u200d👧\u200d👦 family 👨\u200d👩\u200d👧", "😀😁😂🤣 grin",
    "東京都渋谷区の天気", "東京タワー", "ＦＵＬＬ ｗｉｄｔｈ", "full width", "\u202eevil\u202c txt",
    "ls\u2028ps\u2029x", "\ufeffbom start", "İSTANBUL istanbul ıstanbul", "ſtraße STRASSE", "ΟΔΟΣ οδος",
    "a\x01b\x02c\x1f", "\ufffe\uffff nonchar", "x" * 3000 + "needle" + "y" * 3000, "K kelvin k",
    "e\u0301e\u0301e\u0301", "ﬃ ligature ffi", "🇫🇷🇩🇪 flags", "मनीष हिन्दी", "עברית \u200frtl",
    "\U0001F600\U0001F600x", "z\u0336\u0301\u0308 stacked", "nul\x00inside l\x00x", "real \ufffd here l\ufffdi",
]
SEARCH_QUERIES = [
    "caf", "café", "cafe\u0301", "e\u0301 ", "\u0301 a", "\u0301e\u0301", "👨\u200d👩", "\u200d👩\u200d",
    "😁😂", "😀😀", "\U0001F600x", "東京", "東京都渋", "天気", "区の天気", "ＦＵＬ", "full", "ｗｉｄｔｈ",
    "\u202eevil", "evil\u202c", "\u2028ps", "ps\u2029x", "\ufeffbom", "bom start", "i\u0307s", "istanbul",
    "İstanbul", "ıst", "ſtr", "straße", "οδοσ", "ΟΔΟς", "\x01b\x02", "\ufffe", "\uffff n", "needley",
    "xneedley", "xxxxxxxx", "k k", "kelvin", "ﬃ", "ffi", "🇩🇪", "🇷🇩", "\U0001F1EB", "नीष", "ि",
    "\u200frtl", "\u0336\u0301", "ligature", "au lait", "\ufffd", "l\ufffd", "L\ufffdI", "\ufffd here", "l\ufffdx",
]


def _pages(found: list[Any], page: dict[str, Any]) -> str | None:
    found.extend(page["results"])
    cursor = page.get("nextCursor")
    return cursor if isinstance(cursor, str) else None


async def _all_results(c: HostClient, method: str, params: dict[str, Any]) -> list[Any]:
    found: list[Any] = []
    cursor = _pages(found, await c.call(method, params))
    while cursor:
        cursor = _pages(found, await c.call(method, {**params, "cursor": cursor}))
    return found


async def test_search_counts_equal_a_brute_force_scan_of_what_was_stored(tmp_path: Path) -> None:
    """3-character and 8-character queries, CJK, emoji (trigrams that split a ZWJ sequence or a flag's
    regional indicators), combining marks and the fold's special letters, in both scopes: the totals,
    the sessions and the paged hits equal a scan of the stored texts with the documented predicate."""
    with trio.fail_after(120):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            stored: list[tuple[str, str, str]] = []  # (scope, session, text)
            for n in range(3):
                sid = (await c.call("session.create", {"sessionId": f"s{n}", "title": f"s{n}"}))["id"]
                for i, text in enumerate(SEARCH_TEXTS):
                    if (i + n) % 3 == 0:
                        continue
                    role = "user" if i % 2 else "assistant"
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", text, role)})
                    if (i + n) % 3 == 1:
                        await c.call("session.appendMessage", {"sessionId": sid, "message": {
                            "id": f"t{i}", "role": "tool", "toolName": "bash", "blocks": [
                                {"type": "tool_call", "callId": f"c{i}", "name": "bash", "result": text}]}})
                got = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                for m in got:
                    block = m["blocks"][0]
                    scope = "tools" if m["role"] == "tool" else "messages"
                    stored.append((scope, sid, block["text"] if scope == "messages" else block["result"]))
            await host.services.index_log.barrier()
            for scope in ("messages", "tools"):
                for query in SEARCH_QUERIES:
                    hits = [(s, t) for sc, s, t in stored if sc == scope and fold(query.strip()) in fold(t)]
                    sessions = await c.call("search.sessions", {"query": query, "scope": scope, "limit": 100})
                    got = (sessions["totalMessageMatches"], sessions["totalSessions"],
                           sorted(r["sessionId"] for r in sessions["results"]))
                    want = (len(hits), len({s for s, _ in hits}), sorted({s for s, _ in hits}))
                    assert got == want, (scope, query)
                    paged = await _all_results(c, "search.query", {"query": query, "scope": scope, "limit": 2})
                    assert len(paged) == len(hits), (scope, query)
                    assert len({(r["sessionId"], r["messageId"]) for r in paged}) == len(hits), (scope, query)


async def test_the_params_cap_counts_utf8_bytes_at_its_exact_edge(tmp_path: Path) -> None:
    """``max_params_bytes`` is UTF-8 bytes of the params as compact JSON, however the frame spells them:
    a text of 4-byte emoji exactly at the cap is stored, one byte more is PAYLOAD_TOO_LARGE and nothing is
    stored; the same text sent as ``\\ud83d\\ude00`` escapes (12 characters each) counts the same."""
    cap = 64 * 1024
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, max_params_bytes=cap) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})

            def params(mid: str, text: str) -> dict[str, Any]:
                return {"sessionId": "s1", "message": msg(mid, text)}

            overhead = len(orjson.dumps(params("m1", "")))
            fits = "😀" * ((cap - overhead) // 4) + "a" * ((cap - overhead) % 4)
            assert len(orjson.dumps(params("m1", fits))) == cap
            async with raw_connection(host.url, host.token) as ws:
                escaped = request("session.appendMessage", params("m1", fits)).replace("😀", "\\ud83d\\ude00")
                assert "result" in await exchange(ws, escaped)
                over = request("session.appendMessage", params("m2", fits + "a")).replace("😀", "\\ud83d\\ude00")
                assert error_code(await exchange(ws, over)) == "PAYLOAD_TOO_LARGE"
                plain_over = request("session.appendMessage", params("m3", fits + "a"))
                assert error_code(await exchange(ws, plain_over)) == "PAYLOAD_TOO_LARGE"
            got = (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]
            assert [(m["id"], m["blocks"][0]["text"]) for m in got] == [("m1", fits)]


IMPORT_TEXTS = ["first e\u0301 😀 \u2028 \u202eltr", "reply one", "SECOND-MARK", "reply two", "third 東京 \ufeff"]


def _damaged(lines: list[bytes], how: str) -> bytes:
    """``lines`` with the one holding ``SECOND-MARK`` damaged (or the whole file re-ended)."""
    if how == "crlf+bom":
        return b"\xef\xbb\xbf" + b"".join(line.rstrip(b"\n") + b"\r\n" for line in lines)
    bad = {"invalid": b"\xff\xfe", "overlong": b"\xc0\xaf", "surrogate": b"\xed\xa0\x80",
           "escaped surrogate": b"\\udc00", "cut": b""}[how]
    out = []
    for line in lines:
        if b"SECOND-MARK" in line:
            line = line[: len(line) // 2] + b"\n" if how == "cut" else line.replace(b"SECOND-MARK", b"SECOND" + bad)
        out.append(line)
    return b"".join(out)


@pytest.mark.parametrize("how", ["crlf+bom", "invalid", "overlong", "surrogate", "escaped surrogate", "cut"])
async def test_an_import_source_with_bad_bytes_keeps_its_session(tmp_path: Path, how: str) -> None:
    """Claude Code, Codex and pi sources with one line holding invalid UTF-8, an overlong encoding, an
    encoded or escaped lone surrogate, or a cut line (or the whole file CRLF-ended behind a BOM): the
    session is imported with every other message exactly as written, the host's transcript is valid
    UTF-8 JSONL, and the damage is reported. A cut line is a bad line (pi's broken chain also gets its
    notice). Bytes that are not UTF-8 read as U+FFFD, as the tools' own loaders (Node's utf8 decoding)
    read them: the line is kept, counted as repaired. An escaped lone surrogate is no damage but JSON as
    JavaScript writes it: its line is kept, the half read as U+FFFD."""
    conv = [User(IMPORT_TEXTS[0]), Response((("text", IMPORT_TEXTS[1]),), ()), User(IMPORT_TEXTS[2]),
            Response((("text", IMPORT_TEXTS[3]),), ()), User(IMPORT_TEXTS[4])]
    sources = {"claude-code": claude_code_lines(conv), "codex": codex_lines(conv), "pi": pi_lines(conv)}
    with trio.fail_after(120):
        for tool, lines in sources.items():
            folder = tmp_path / tool / "src"
            folder.mkdir(parents=True)
            (folder / "session.jsonl").write_bytes(_damaged(lines, how))
            data = tmp_path / tool / "data"
            async with inprocess_host(data) as host, client_for(host) as c:
                (summary,) = (await c.call("import.sessions", {"source": tool, "root": str(folder)}))["sessions"]
                assert summary["status"] == "new", (tool, summary)
                page = await c.call("session.get", {"sessionId": summary["sessionId"], "full": True})
            texts = [b.get("text") for m in page["messages"] if m["role"] in ("user", "assistant")
                     for b in m["blocks"] if b["type"] == "text"]
            assert IMPORT_TEXTS[0] in texts and IMPORT_TEXTS[1] in texts, (tool, texts)
            if how == "crlf+bom":
                assert texts == IMPORT_TEXTS, (tool, texts)
            elif how == "escaped surrogate":  # valid JSON (JSON.stringify writes it): the line is kept, U+FFFD
                assert texts == [t.replace("SECOND-MARK", "SECOND\ufffd") for t in IMPORT_TEXTS], (tool, texts)
                assert summary["files"][0]["badLines"] == 0, (tool, summary["files"])
            elif how != "cut":  # bytes that are not UTF-8: each bad sequence reads as U+FFFD, the line is kept
                replaced = "SECOND" + {"invalid": b"\xff\xfe", "overlong": b"\xc0\xaf",
                                       "surrogate": b"\xed\xa0\x80"}[how].decode("utf-8", "replace")
                assert texts == [t.replace("SECOND-MARK", replaced) for t in IMPORT_TEXTS], (tool, texts)
                (report,) = summary["files"]
                assert report["badLines"] == 0, (tool, report)
                assert report["repairedLines"] == sum(b"SECOND-MARK" in line for line in lines), (tool, report)
                assert all(m["role"] != "system" for m in page["messages"]), (tool, page["messages"])
            else:
                assert not any(t and "SECOND" in t for t in texts), (tool, texts)
                (report,) = summary["files"]
                assert report["badLines"] == sum(b"SECOND-MARK" in line for line in lines), (tool, report)
                if tool != "pi":  # a flat log: the lines after the bad one are kept
                    assert IMPORT_TEXTS[3] in texts and IMPORT_TEXTS[4] in texts, (tool, texts)
                else:  # a tree whose leaf no longer reaches the root: the reachable part and a notice
                    assert [m["role"] for m in page["messages"]][-1] == "system", (tool, page["messages"])
            list(_transcript_lines(data))


GRAPHEMES = ["👨\u200d👩\u200d👧\u200d👦", "🇫🇷", "👍🏽", "❤\ufe0f", "\u0915\u093f", "\u0e01\u0e31", "e\u0301\u0308",
             "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"]


def _graphemes_whole(snippet: str, grapheme: str) -> bool:
    """``snippet`` (ellipses dropped) holds only whole copies of ``grapheme``."""
    body = snippet.strip("\u2026")
    return body.replace(grapheme, "").strip("abcdefghijklmnopqrstuvwxyz ") == ""


async def test_snippets_never_cut_a_grapheme(tmp_path: Path) -> None:
    """A snippet window cut inside a ZWJ sequence, a flag's regional-indicator pair, an emoji with its skin
    tone or variation selector, an Indic vowel sign (a spacing mark), a Thai mark or a tag sequence showed
    a stray joiner, half a flag or a lone modifier: the window is widened to whole grapheme clusters, as it
    already was for combining marks."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            for i, grapheme in enumerate(GRAPHEMES):
                for pad in range(len(grapheme) + 1):  # every phase of the cut against the cluster
                    text = grapheme * 60 + " " + "a" * pad + f" needle{i}x{pad} " + grapheme * 60
                    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}x{pad}", text)})
            await host.services.index_log.barrier()
            for i, grapheme in enumerate(GRAPHEMES):
                for pad in range(len(grapheme) + 1):
                    (hit,) = (await c.call("search.query", {"query": f"needle{i}x{pad} "}))["results"]
                    assert f"needle{i}x{pad}" in hit["snippet"]
                    assert _graphemes_whole(hit["snippet"].replace(f"needle{i}x{pad}", ""), grapheme), \
                        (grapheme, pad, hit["snippet"])


async def test_a_snippet_stays_short_beside_a_run_of_marks(tmp_path: Path) -> None:
    """A window is widened to whole clusters only so far: a match beside a million combining marks (or a
    million-long ZWJ chain) got a snippet of the whole run: a million characters in every hit's snippet."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            runs = ["\u0301" * 1_000_000, "a\u200d" * 500_000, "\u0301" * 1_000_000 + "needle", "\u093f" * 1_000_000]
            for i, run in enumerate(runs * 2):
                text = f"needle {i} " + run if i % 2 else run + f" needle {i}"
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", text)})
            await host.services.index_log.barrier()
            hits = (await c.call("search.query", {"query": "needle"}))["results"]
            assert len(hits) == len(runs) * 2
            assert all(len(hit["snippet"]) < 400 for hit in hits), [len(hit["snippet"]) for hit in hits]
            assert (await c.call("search.sessions", {"query": "needle"}))["totalMessageMatches"] == len(runs) * 2


async def test_snippets_are_one_line(tmp_path: Path) -> None:
    """Newlines and tabs become spaces in a snippet (protocol: a one-line excerpt); the Unicode line and
    paragraph separators and NEL came through and broke the line in a renderer that honours them."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            text = "one\u2028two\u2029three\x85four\r\nfive\vsix\fseven\tneedle"
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", text)})
            await host.services.index_log.barrier()
            (hit,) = (await c.call("search.query", {"query": "needle"}))["results"]
            assert hit["snippet"] == "one two three four  five six seven needle"
            stored = (await c.call("session.get", {"sessionId": "s1"}))["messages"][0]["blocks"][0]["text"]
            assert stored == text  # the message itself is untouched

async def test_a_replacement_character_query_does_not_count_texts_holding_a_nul(tmp_path: Path) -> None:
    """Found by the brute-force comparison above: stored texts "nul\x00x" and "\ufffd" — the query
    "\ufffd" matches one of them, the host counts two."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            for i, text in enumerate(["nul\x00x", "real \ufffd here"]):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", text)})
            await host.services.index_log.barrier()
            hits = (await c.call("search.query", {"query": "\ufffd"}))["results"]
            assert [h["messageId"] for h in hits] == ["m1"]
