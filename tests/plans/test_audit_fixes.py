"""plans.submit leaves nothing behind when it fails: the UTF-8 byte limit is checked before the
intent is written, and a failure after the intent removes the intent and the artifact (seed 003 §4.6a)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store import plans
from store.errors import PayloadTooLarge
from tests.hostkit import client_for, inprocess_host
from tests.threadkit import on_trio_thread


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


def _submit(sid: str, ws: Path, call_id: str, markdown: str) -> dict[str, Any]:
    return {"sessionId": sid, "turnId": "t1", "toolCallId": call_id, "kind": "plan", "markdown": markdown,
            "workspaceRoot": str(ws)}


def _leftovers(data: Path, ws: Path) -> list[str]:
    """Intent sidecars in the data directory and files under the workspace's .pi/ (a temp file included)."""
    intents = [n for n in os.listdir(data / "sessions") if n.endswith(plans.INTENT_SUFFIX)]
    pi = [str(Path(d, f).relative_to(ws)) for d, _, files in os.walk(ws / ".pi") for f in files]
    return intents + pi


def test_markdown_size_is_counted_in_utf8_bytes() -> None:
    plans.check_markdown_size(b"x" * plans.MAX_MARKDOWN_BYTES)
    with pytest.raises(PayloadTooLarge, match="bytes of UTF-8"):
        plans.check_markdown_size(("é" * (plans.MAX_MARKDOWN_BYTES // 2 + 1)).encode())


async def test_multibyte_markdown_over_the_byte_limit_writes_nothing(tmp_path: Path) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
            # 600,000 characters (under the wire model's character bound), 1,200,000 bytes of UTF-8
            err = await _err(c.call("plans.submit", _submit(sid, ws, "c1", "é" * 600_000)))
            assert err.data_code == "PAYLOAD_TOO_LARGE"
            assert _leftovers(data, ws) == []
            assert (await c.call("plans.pending", {}))["pending"] == []
            # exactly the limit in bytes is accepted, and the session was not held by the refusal
            ok = await c.call("plans.submit", _submit(sid, ws, "c2", "é" * (plans.MAX_MARKDOWN_BYTES // 2)))
            assert ok["artifactSize"] == plans.MAX_MARKDOWN_BYTES
            assert _leftovers(data, ws) == [ok["artifactPath"]]


@pytest.mark.parametrize(("point", "action"), [
    ("plans.intent.after_rename", "eio"),  # the intent is published, then the write reports a failure
    ("plans.artifact.after_write", "enospc"),  # a known storage error while writing the artifact
    ("plans.before_row", "raise"),  # the artifact is published, the row was never sent
])
async def test_a_failure_after_the_intent_removes_what_the_submission_wrote(
        tmp_path: Path, point: str, action: str) -> None:
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
            host.faults.add(point, nth=1, action=action)
            with pytest.raises(RpcError):
                await c.call("plans.submit", _submit(sid, ws, "c1", "# Plan\n"))
            host.faults.clear()
            assert _leftovers(data, ws) == []
            assert (await c.call("plans.pending", {}))["pending"] == []
            again = await c.call("plans.submit", _submit(sid, ws, "c2", "# Plan\n"))
            assert _leftovers(data, ws) == [again["artifactPath"]]


async def test_the_artifact_is_hashed_off_the_trio_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's markdown (up to 1 MiB) is hashed in the session's worker thread, never on the trio loop
    (every other request of the host waits while it runs there)."""
    seen: list[bool] = []
    sha256_of = plans.sha256_of

    def hashed_seen(data: bytes) -> str:
        seen.append(on_trio_thread())
        return sha256_of(data)

    monkeypatch.setattr(plans, "sha256_of", hashed_seen)
    ws, data = tmp_path / "ws", tmp_path / "data"
    ws.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
            ok = await c.call("plans.submit", _submit(sid, ws, "c1", "# Plan\n" + "x" * 500_000))
            assert ok["artifactSize"] == 500_007
    assert seen == [False]
