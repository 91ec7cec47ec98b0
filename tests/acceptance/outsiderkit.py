"""What the outsider test files share (tests written from the seeds' text alone, black-box against real
``pi-host serve`` processes): a host with one client, an append, and a call's error code."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import HostProcess, msg, start_host_process

__all__ = ["all_at_once", "all_pages", "artifact_paths", "assert_snapshot_refused", "client", "code_of", "data_dir",
           "drop_database", "error_of", "killed_during", "outcome", "real_host", "say", "shared_host", "write_tool"]


async def all_pages(c: HostClient, method: str, key: str, params: dict[str, Any] | None = None, *,
                    limit: int = 200) -> list[dict[str, Any]]:
    """Every row of a paged list method (``notifications.list`` → ``notifications``, ``audit.list`` →
    ``entries``): its pages in order, each asked with the same filter and the previous page's ``nextCursor``."""
    rows: list[dict[str, Any]] = []
    ask: dict[str, Any] = {"limit": limit, **(params or {})}
    while True:
        page = await c.call(method, ask)
        rows += page[key]
        if not page.get("nextCursor"):
            return rows
        ask = {"limit": limit, **(params or {}), "cursor": page["nextCursor"]}


async def outcome(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    """The call's result, or its error code when it fails."""
    try:
        return await c.call(method, params)
    except RpcError as failed:
        return failed.data_code


async def all_at_once(calls: list[tuple[HostClient, str, dict[str, Any]]]) -> list[Any]:
    """Every call sent at once, each from its own task (races between connections): each one's result or error
    code, in call order."""
    out: list[Any] = [None] * len(calls)

    async def one(i: int, c: HostClient, method: str, params: dict[str, Any]) -> None:
        out[i] = await outcome(c, method, params)

    async with trio.open_nursery() as nursery:
        for i, (c, method, params) in enumerate(calls):
            nursery.start_soon(one, i, c, method, params)
    return out


async def assert_snapshot_refused(c: HostClient, sid: str, turn_id: str) -> None:
    """Every reader of a turn's run environment snapshot (seed 000 §4) answers ``CORRUPT_DATA`` for it."""
    for method, params in (("session.turnEnvironment", {"turnId": turn_id}),
                           ("session.verifyEnvironment", {"sessionId": sid, "turnId": turn_id}),
                           ("session.context", {"sessionId": sid})):
        assert await code_of(c, method, params) == "CORRUPT_DATA", method


def data_dir(tmp_path: Path) -> Path:
    """A new, empty data directory under ``tmp_path``."""
    root = tmp_path / "data"
    root.mkdir()
    return root


@asynccontextmanager
async def real_host(data_dir: Path, kind: str = "ui", client_id: str = "outsider",
                    plugin_id: str | None = None, serve_args: Sequence[str] = ()
                    ) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    """A ``pi-host serve`` process on ``data_dir`` (with ``serve_args``) and a client of it; killed (SIGKILL)
    on exit, so the caller's restart boots from whatever reached the disk."""
    proc = start_host_process(data_dir, *serve_args)
    try:
        async with open_client(proc.url, proc.token, client_id=client_id, client_kind=kind,
                               plugin_id=plugin_id) as c:
            yield proc, c
    finally:
        proc.kill9()


def shared_host(tmp_path_factory: Any, name: str) -> Iterator[HostProcess]:
    """The body of a module's one-host fixture (``yield from shared_host(tmp_path_factory, "name")``): a
    ``pi-host serve`` process for the probes that never restart it; killed (SIGKILL) at the module's end."""
    root = tmp_path_factory.mktemp(name) / "data"
    root.mkdir()
    proc = start_host_process(root)
    try:
        yield proc
    finally:
        proc.kill9()


@asynccontextmanager
async def client(proc: HostProcess, client_id: str = "outsider", kind: str = "ui",
                 plugin_id: str | None = None) -> AsyncIterator[HostClient]:
    """One more connection to a running host."""
    async with open_client(proc.url, proc.token, client_id=client_id, client_kind=kind, plugin_id=plugin_id) as c:
        yield c


async def killed_during(data: Path, spec: str, calls: list[tuple[str, dict[str, Any]]], *,
                        kind: str = "ui", serve_args: tuple[str, ...] = ()) -> list[Any]:
    """A host armed with ``RT_CRASHPOINT=spec`` answers every call but the last, and dies at that one without
    answering it (its first half ran on the same host: a running run or turn survives no restart). The
    answers of the others. ``serve_args``: more arguments of its ``pi-host serve``."""
    crashing = start_host_process(data, *serve_args, env={"RT_CRASHPOINT": spec})
    answers: list[Any] = []
    try:
        async with client(crashing, kind=kind) as c:
            for method, params in calls[:-1]:
                answers.append(await c.call(method, params))
            method, params = calls[-1]
            try:
                answers.append(await c.call(method, params))
            except (ClientClosed, OSError):
                pass
    except (ClientClosed, OSError):
        pass
    await trio.to_thread.run_sync(crashing.reap)
    assert crashing.proc.returncode == -9, f"the host did not die at {spec}"
    assert len(answers) == len(calls) - 1, "the host answered the call it was to die in"
    return answers


async def say(c: HostClient, sid: str, mid: str, text: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    """Append one message (``tests.hostkit.msg``); the append's result."""
    result: dict[str, Any] = await c.call("session.appendMessage",
                                          {"sessionId": sid, "message": msg(mid, text, role=role, **extra)})
    return result


async def error_of(c: HostClient, method: str, params: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The call's error code and data (``(None, {})`` when it succeeds)."""
    try:
        await c.call(method, params)
    except RpcError as failed:
        return failed.data_code, failed.data
    return None, {}


async def code_of(c: HostClient, method: str, params: dict[str, Any]) -> str | None:
    """The call's error code (None when it succeeds)."""
    return (await error_of(c, method, params))[0]


async def ctx_ids(c: HostClient, sid: str) -> list[str]:
    """The ids of the session's context (``session.context``), in order."""
    return [m["id"] for m in (await c.call("session.context", {"sessionId": sid}))["messages"]]


async def nested_branches(c: HostClient, sid: str) -> None:
    """Seed 000 §3.2's shape: the first reply regenerated (a1 → b1), and inside branch B the second reply
    regenerated too (b2 → b2x, the newest); the live branch ends at b2x."""
    await say(c, sid, "q1", "first question")
    await say(c, sid, "a1", "reply A", "assistant")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
    await say(c, sid, "b1", "reply B", "assistant")
    await say(c, sid, "q2", "second question")
    await say(c, sid, "b2", "second reply, first try", "assistant")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "b2", "mode": "regenerate"})
    await say(c, sid, "b2x", "second reply, newest", "assistant")


async def put_file(c: HostClient, fill: bytes, size: int = 1000) -> dict[str, Any]:
    """``attachments.put`` of a file ``f.bin`` holding ``fill * size`` bytes: its answer (``ref``, ``size``)."""
    result: dict[str, Any] = await c.call("attachments.put", {
        "name": "f.bin", "mimeType": "application/octet-stream", "kind": "file",
        "dataBase64": base64.b64encode(fill * size).decode()})
    return result


def file_block(blob: dict[str, Any]) -> dict[str, Any]:
    """The attachment block of a message that references the blob :func:`put_file` answered."""
    return {"type": "attachment", "kind": "file", "name": "f.bin", "ref": blob["ref"],
            "mimeType": "application/octet-stream", "size": blob["size"]}


def write_tool(mid: str, path: str, name: str = "Write") -> dict[str, Any]:
    """A finished file tool call (``Write``, ``Edit``...) on ``path``, as a tool message."""
    return {"id": mid, "role": "tool", "toolName": name, "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": name, "args": {"path": path}, "status": "ok"}]}


async def artifact_paths(c: HostClient, sid: str) -> list[str]:
    """The session's listed artifact paths, sorted (the result validated against its model)."""
    result = await c.call("artifacts.list", {"sessionId": sid})
    METHODS["artifacts.list"].result_model.model_validate(result)
    return sorted(a["path"] for a in result["artifacts"])


def drop_database(root: Path) -> None:
    """The database lost: ``pi.sqlite`` and its ``-wal`` / ``-shm`` gone (the host is stopped)."""
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)
