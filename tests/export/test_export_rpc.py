"""``session.export`` through a real host: every block kind in every format, no secret in any export unless
asked (never for a plugin), thinking on request, a new file or inline, and the HTML in headless Chromium."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.export.test_export import PNG, png_pixels_vary, run_chromium
from tests.hostkit import client_for, inprocess_host, msg

SECRET = "sk-live-rpc-7a6b5c4d3e2f1a0b"


async def every_block_kind(c: HostClient) -> str:
    """A session whose messages hold every block kind, a secret value, a credential ref and an image."""
    await c.call("secrets.set", {"ref": "secret:provider/openai", "value": SECRET})
    put = await c.call("attachments.put", {"name": "shot.png", "mimeType": "image/png",
                                           "dataBase64": base64.b64encode(PNG).decode()})
    sid = (await c.call("session.create", {"title": "Export over RPC"}))["id"]
    messages = [
        msg("u1", f"my key is {SECRET} and <b>markup</b>", blocks=[
            {"type": "text", "text": f"my key is {SECRET} and <b>markup</b>"},
            {"type": "attachment", "kind": "image", "name": "shot.png", "ref": put["ref"], "mimeType": "image/png",
             "size": len(PNG)}]),
        msg("a1", "", role="assistant", blocks=[
            {"type": "thinking", "text": "secret musing quokka", "signature": "sig"},
            {"type": "text", "text": "```python\nprint('rpc export')\n```"}],
            meta={"modelId": "m", "credentialRef": "secret:provider/openai", "apiKey": "plain-key-value"}),
        msg("t1", "", role="tool", toolName="Bash", blocks=[
            {"type": "tool_call", "callId": "c1", "name": "Bash", "args": {"command": f"echo {SECRET}"},
             "result": "tool output pelican", "status": "ok"}]),
        msg("gone", "deleted words walrus"),
    ]
    for m in messages:
        await c.call("session.appendMessage", {"sessionId": sid, "message": m})
    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "gone"})
    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
        "id": "cp1", "summary": "summary of the start", "throughMessageId": "a1", "firstKeptMessageId": "t1",
        "tokensBefore": 10, "retainedTail": []}})
    return str(sid)


@pytest.mark.parametrize("fmt", ["md", "html", "jsonl"])
async def test_every_block_kind_exports_and_no_secret_leaks(tmp_path: Path, fmt: str) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            sid = await every_block_kind(c)
            out = await c.call("session.export", {"sessionId": sid, "format": fmt})
            text = out["content"]
            assert out["messages"] == 3 and out["compactions"] == 1 and out["thinkingOmitted"] == 1
            for visible in ("markup", "rpc export", "tool output pelican", "summary of the start"):
                assert visible in text, (fmt, visible)
            assert SECRET not in text and "plain-key-value" not in text and "secret:provider/openai" not in text
            assert "quokka" not in text and "walrus" not in text
            assert out["redactions"] >= 3 and out["bytes"] == len(text.encode())
            with_all = await c.call("session.export", {"sessionId": sid, "format": fmt, "includeThinking": True,
                                                       "includeSecrets": True})
            assert "quokka" in with_all["content"] and SECRET in with_all["content"]
            if fmt == "html":
                assert f"data:image/png;base64,{base64.b64encode(PNG).decode()}" in text
            if fmt == "jsonl":
                lines = [json.loads(line) for line in text.splitlines()]
                assert [ln["type"] for ln in lines[:2]] == ["session", "session_info"]
                assert [ln["id"] for ln in lines if ln["type"] == "message"] == ["u1", "a1", "t1"]


async def test_the_exported_page_opens_in_headless_chromium(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            sid = await every_block_kind(c)
            page = tmp_path / "out" / "export.html"
            page.parent.mkdir()
            done = await c.call("session.export", {"sessionId": sid, "format": "html", "outPath": str(page)})
            assert done["path"] == str(page) and "content" not in done
    dom = await trio.to_thread.run_sync(run_chromium, ["--dump-dom"], page, tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for visible in ("markup", "rpc export", "tool output pelican", "summary of the start"):
        assert visible in dom.stdout
    assert SECRET not in dom.stdout
    shot = tmp_path / "export.png"
    result = await trio.to_thread.run_sync(
        run_chromium, [f"--screenshot={shot}", "--window-size=1100,1400", "--hide-scrollbars"], page, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert png_pixels_vary(shot.read_bytes())
    for log in (dom.stderr, result.stderr):
        assert ":CONSOLE" not in log and "Content Security Policy" not in log


async def test_export_files_are_new_files_and_plugins_get_no_secrets(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c, \
                client_for(host, "p", kind="plugin", plugin_id="alpha") as plugin:
            sid = await every_block_kind(c)
            target = tmp_path / "exists.md"
            target.write_text("keep me")
            for bad, code in ((str(target), "CONFLICT"), ("relative.md", "INVALID_PARAMS"),
                              (str(tmp_path / "no-dir" / "x.md"), "NOT_FOUND")):
                with pytest.raises(RpcError) as err:
                    await c.call("session.export", {"sessionId": sid, "outPath": bad})
                assert err.value.data_code == code, bad
            assert target.read_text() == "keep me"
            assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no temp file left
            imported = await plugin.call("plugins.importSession", {
                "sourceId": "s", "externalId": "e", "messages": [msg("m1", f"plugin text {SECRET}")]})
            mine = await plugin.call("session.export", {"sessionId": imported["sessionId"]})
            assert "plugin text" in mine["content"] and SECRET not in mine["content"]
            for params in ({"sessionId": imported["sessionId"], "includeSecrets": True}, {"sessionId": sid}):
                with pytest.raises(RpcError) as err:
                    await plugin.call("session.export", params)
                assert err.value.data_code == "PERMISSION_DENIED"


async def test_an_export_right_after_appends_holds_them(tmp_path: Path) -> None:
    """Appends are acknowledged before their index commit: the export waits until the index covers them."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            sid = (await c.call("session.create", {"title": "fresh"}))["id"]
            calls = [("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"line {i}")})
                     for i in range(20)]
            answers = await c.pipelined([*calls, ("session.export", {"sessionId": sid, "format": "jsonl",
                                                                        "includeSecrets": True})])
            lines = [json.loads(line) for line in answers[-1]["content"].splitlines()]
            assert [ln["id"] for ln in lines if ln["type"] == "message"] == [f"m{i}" for i in range(20)]


async def test_thinking_inside_a_checkpoint_is_left_out_unless_asked(tmp_path: Path) -> None:
    """session.export: "Thinking blocks are left out unless asked". A jsonl export left them in a
    checkpoint's retainedTail and in details.retainedReasoning (prior thinking turns), uncounted."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            sid = (await c.call("session.create", {}))["id"]
            for m in (msg("u1", "q1"), msg("a1", "r1", role="assistant"), msg("u2", "q2")):
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                "id": "c1", "summary": "S", "throughMessageId": "a1", "tokensBefore": 1,
                "retainedTail": [{"id": "u2", "role": "user", "blocks": [
                    {"type": "thinking", "text": "tail marmalade"}, {"type": "text", "text": "q2"}]}],
                "details": {"retainedTailMode": "active_turn", "retainedReasoning": [
                    {"text": "kept answer", "thinking": "loose marmalade"},
                    {"blocks": [{"type": "thinking", "text": "block marmalade"}, {"type": "text", "text": "ok"}]},
                    {"thinking": "only marmalade"}]}}})
            out = await c.call("session.export", {"sessionId": sid, "format": "jsonl"})
            assert "marmalade" not in out["content"]
            assert out["thinkingOmitted"] == 4
            [cp] = [json.loads(ln) for ln in out["content"].splitlines() if '"compaction"' in ln]
            assert cp["retainedTail"][0]["blocks"] == [{"type": "text", "text": "q2"}]
            assert cp["details"]["retainedReasoning"] == [
                {"text": "kept answer"}, {"role": "assistant", "blocks": [{"type": "text", "text": "ok"}]}]
            full = await c.call("session.export", {"sessionId": sid, "format": "jsonl", "includeThinking": True})
            assert full["content"].count("marmalade") == 4


@pytest.mark.parametrize("fmt", ["md", "html"])
async def test_an_evicted_attachment_is_marked_not_linked(tmp_path: Path, fmt: str) -> None:
    """Seed 000 §2.3: a reference to bytes the GC evicted says so wherever it is read. The Markdown and
    HTML exports show ``[attachment evicted: <name>]`` (as the JSONL's blocks say ``evicted``), never the
    ref of bytes that are gone nor an inlined image; an attachment whose bytes are here is shown as before."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "ui", kind="ui") as c:
            gone = await c.call("attachments.put", {"name": "old.png", "mimeType": "image/png",
                                                    "dataBase64": base64.b64encode(PNG).decode()})
            kept = await c.call("attachments.put", {"name": "new.png", "mimeType": "image/png",
                                                    "dataBase64": base64.b64encode(PNG[:-1] + b"!").decode()})
            sids = []
            for name, put in (("old.png", gone), ("new.png", kept)):
                sid = (await c.call("session.create", {"title": name}))["id"]
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "see", blocks=[
                    {"type": "text", "text": "see"},
                    {"type": "attachment", "kind": "image", "name": name, "ref": put["ref"],
                     "mimeType": "image/png", "size": len(PNG)}])})
                sids.append(sid)
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": len(PNG) + 10})
            gc = await c.call("attachments.gc", {"activeSessionId": sids[1]})
            assert gc["evicted"] == [gone["sha256"]]
            text = (await c.call("session.export", {"sessionId": sids[0], "format": fmt}))["content"]
            marker = "[attachment evicted: **old.png**]" if fmt == "md" else "[attachment evicted: <b>old.png</b>]"
            assert marker in text and "not in this export" in text
            assert gone["sha256"] not in text and "data:image/png" not in text
            text = (await c.call("session.export", {"sessionId": sids[1], "format": fmt}))["content"]
            assert "attachment evicted" not in text
            assert (kept["ref"] if fmt == "md" else "data:image/png;base64,") in text
