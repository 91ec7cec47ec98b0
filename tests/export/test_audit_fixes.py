"""Audit findings on ``session.export`` and ``session.get``: a checkpoint whose boundary message was deleted
is exported and survives the JSONL round trip; ``full`` reads carry no content cap; a ``sha256`` a user typed
is not taken for the host's token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host, msg

DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


async def _session(c: HostClient, *, through: str, first_kept: str, deleted: tuple[str, ...]) -> str:
    """m0..m3, a checkpoint (``through``, ``first_kept``), then ``deleted`` tombstoned."""
    sid = str((await c.call("session.create", {"title": "checkpoint"}))["id"])
    for i in range(4):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
        "id": "cp1", "summary": "SUMMARY of the start", "throughMessageId": through,
        "firstKeptMessageId": first_kept, "tokensBefore": 100, "retainedTail": [], "details": {}}})
    for mid in deleted:
        await c.call("session.deleteMessage", {"sessionId": sid, "messageId": mid})
    return sid


def _texts(context: dict[str, Any]) -> list[str]:
    return [b["text"] for m in context["messages"] for b in m["blocks"] if b["type"] == "text"]


async def _round_trip(c: HostClient, sid: str, directory: Path) -> str:
    """Export ``sid`` as JSONL into ``directory`` and import it back (source ``pi-host``): the new id."""
    await trio.Path(directory).mkdir()
    await c.call("session.export", {"sessionId": sid, "format": "jsonl", "outPath": str(directory / "s.jsonl")})
    done = await c.call("import.sessions", {"source": "pi-host", "root": str(directory)})
    (imported,) = done["sessions"]
    return str(imported["sessionId"])


@pytest.mark.parametrize("fmt", ["md", "html", "jsonl"])
async def test_a_checkpoint_through_a_deleted_message_is_exported_where_it_stood(tmp_path: Path, fmt: str) -> None:
    """The export placed checkpoints only after live messages: once ``throughMessageId`` was tombstoned
    the checkpoint (still in ``session.get`` and ``session.context``) was dropped from every format."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _session(c, through="m1", first_kept="m2", deleted=("m1",))
            assert len((await c.call("session.get", {"sessionId": sid}))["compactions"]) == 1
            out = await c.call("session.export", {"sessionId": sid, "format": fmt})
            text = out["content"]
            assert out["compactions"] == 1 and out["messages"] == 3
            assert "text 1" not in text
            assert text.index("text 0") < text.index("SUMMARY of the start") < text.index("text 2")
            if fmt == "jsonl":
                lines = [json.loads(line) for line in text.splitlines()]
                body = [(ln["type"], ln.get("id")) for ln in lines[2:]]
                assert body == [("message", "m0"), ("compaction", "cp1"), ("message", "m2"), ("message", "m3")]
                assert lines[3]["throughMessageId"] == "m0"  # the nearest exported message: the file holds no m1


async def test_a_checkpoint_with_no_exported_message_before_it_opens_the_export(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _session(c, through="m1", first_kept="m2", deleted=("m0", "m1"))
            out = await c.call("session.export", {"sessionId": sid, "format": "md"})
            assert out["compactions"] == 1
            assert out["content"].index("SUMMARY of the start") < out["content"].index("text 2")


@pytest.mark.parametrize(("through", "first_kept", "deleted"), [
    ("m1", "m2", ("m1",)),  # the boundary deleted
    ("m2", "m1", ("m1",)),  # the first kept message deleted: the context still starts at m2, not m3
])
async def test_the_jsonl_round_trip_keeps_the_checkpoint_and_the_model_context(
        tmp_path: Path, through: str, first_kept: str, deleted: tuple[str, ...]) -> None:
    """Read back by ``import.sessions``, the checkpoint was lost, and with it the summary the model saw."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = await _session(c, through=through, first_kept=first_kept, deleted=deleted)
            new = await _round_trip(c, sid, tmp_path / "out")
            assert len((await c.call("session.get", {"sessionId": new}))["compactions"]) == 1
            before = _texts(await c.call("session.context", {"sessionId": sid}))
            after = _texts(await c.call("session.context", {"sessionId": new}))
            assert before[0] == "SUMMARY of the start" and after == before


async def test_full_reads_the_whole_content_whatever_content_limit_says(tmp_path: Path) -> None:
    """``full`` is "whole transcript, no content cap", yet a ``contentLimit`` sent with it still cut the text."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "y" * 100)})
            whole = (await c.call("session.get", {"sessionId": sid, "full": True, "contentLimit": 10}))["messages"]
            assert whole[0]["blocks"][0]["text"] == "y" * 100 and "truncated" not in whole[0]
            cut = (await c.call("session.get", {"sessionId": sid, "contentLimit": 10}))["messages"]
            assert cut[0]["blocks"][0]["text"] == "y" * 10 and cut[0]["truncated"] is True


@pytest.mark.parametrize("fmt", ["md", "html", "jsonl"])
async def test_a_typed_sha256_survives_the_export_and_the_host_token_does_not(tmp_path: Path, fmt: str) -> None:
    """Every standalone 64-hex string was redacted as if it were the host token: a digest the user typed
    came out as ``[redacted]`` (and imported back that way). The token itself is redacted by its value."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = str((await c.call("session.create", {"title": "digests"}))["id"])
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u1", f"the file's sha256 is {DIGEST} ok; my token is {host.token}")})
            out = await c.call("session.export", {"sessionId": sid, "format": fmt})
            assert DIGEST in out["content"] and host.token not in out["content"]
            assert out["redactions"] == 1
            if fmt == "jsonl":
                new = await _round_trip(c, sid, tmp_path / "out")
                (back,) = (await c.call("session.get", {"sessionId": new, "full": True}))["messages"]
                assert back["blocks"][0]["text"] == f"the file's sha256 is {DIGEST} ok; my token is [redacted]"
