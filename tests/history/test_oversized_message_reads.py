"""A message whose line is over the largest reply (seed 003 §1 goal 3: "bounded renderer transcript reads
even when a session contains very large message content"; README §6 windows).

``import.sessions`` takes source lines up to 32 MiB, but ``session.get`` refused a page holding such a
message whatever it was asked: ``PAYLOAD_TOO_LARGE`` naming a ``maxBytes`` (the line's size) over the
16 MiB the params accept, even with ``contentLimit``; the message could not be read, nor could any page
go past it. With ``contentLimit`` it now comes alone in its page, its content cut; without it the error
names ``contentLimit``, never a ``maxBytes`` the params refuse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store.rules import MAX_REPLY_BYTES
from tests.hostkit import client_for, inprocess_host, msg

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
