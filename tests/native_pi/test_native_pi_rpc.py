"""Native pi sessions through a real host (seed 003 §12): merged into session.list, read from snapshots,
refused for every mutation, forked into exactly one v3 child (idempotent with a receipt key), exported."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from runtime.handlers import native_pi as native_handler
from runtime.routes import ROUTES
from tests.hostkit import client_for, inprocess_host, msg
from tests.native_pi.test_native_pi import root, tree_state
from tests.samplekit import untouched_samples
from tests.threadkit import on_trio_thread

__all__ = ["root", "untouched_samples"]

TREE = "native-pi:tree-session"
STUB = "native-pi:019e19b4-eb48-746a-aa6b-8dfcfa37954b"


def find(root: Path, pattern: str) -> Path:
    return next(root.rglob(pattern))


async def code_of(c: HostClient, method: str, params: dict[str, Any]) -> str:
    with pytest.raises(RpcError) as err:
        await c.call(method, params)
    return err.value.data_code


async def every_page(c: HostClient, limit: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await c.call("session.list", {"limit": limit, **({"cursor": cursor} if cursor else {})})
        out += page["sessions"]
        cursor = page.get("nextCursor")
        if not cursor:
            return out


async def test_native_sessions_are_merged_into_session_list_read_only(tmp_path: Path, root: Path) -> None:
    before = tree_state(root)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            own = [(await c.call("session.create", {"title": f"host {i}"}))["id"] for i in range(3)]
            listed = await every_page(c, 100)
            native = [s for s in listed if s["source"] == "native-pi"]
            assert {s["id"] for s in native} == {
                "native-pi:019e963d-6bd6-7ade-8a49-256ac3391bdd", STUB, "native-pi:real-session", TREE,
                "native-pi:v1-session"}
            assert all(s["native"]["readOnly"] for s in native)
            assert {s["id"] for s in listed} - {s["id"] for s in native} == set(own)
            keys = [(s["updatedAt"], s["id"]) for s in listed]
            assert keys == sorted(keys, reverse=True)  # one order for both kinds
            # paging with small pages walks the same list, each session once
            for limit in (1, 2, 3):
                assert [s["id"] for s in await every_page(c, limit)] == [s["id"] for s in listed]
            # a project filter or a plugin sees no native session
            assert all(s.get("source") != "native-pi"
                       for s in (await c.call("session.list", {"projectId": 1}))["sessions"])
    assert tree_state(root) == before  # nothing under the pi root was written


async def test_get_reads_the_current_branch_of_a_snapshot(tmp_path: Path, root: Path) -> None:
    path = find(root, "*_tree.jsonl")
    torn = path.read_bytes() + b'{"type":"message","id":"eabc","parentId":"e0000007","message":{"role":"u'
    path.write_bytes(torn)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": TREE})
            assert [m["blocks"][0]["text"] for m in page["messages"]] == ["main question", "main answer", "follow up"]
            assert page["session"]["id"] == TREE and page["session"]["source"] == "native-pi"
            assert (page["totalMessages"], page["messageStart"], page["hasMoreBefore"]) == (3, 0, False)
            last = await c.call("session.get", {"sessionId": TREE, "messageLimit": 1})
            assert (last["messageStart"], last["hasMoreBefore"]) == (2, True)
            assert last["messages"][0]["seq"] == 3
            around = await c.call("session.get", {"sessionId": TREE, "messageAround": page["messages"][1]["id"],
                                                  "messageLimit": 1})
            assert [m["id"] for m in around["messages"]] == [page["messages"][1]["id"]]
            assert await code_of(c, "session.get", {"sessionId": TREE, "messageAround": "nope"}) == \
                "MESSAGE_NOT_FOUND"
            assert await code_of(c, "session.get", {"sessionId": "native-pi:unknown"}) == "SESSION_NOT_FOUND"
            assert await code_of(c, "session.get", {"sessionId": "native-pi:../../etc"}) == "INVALID_PARAMS"
    assert path.read_bytes() == torn  # never repaired


async def test_without_a_configured_root_there_are_no_native_sessions(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            assert (await c.call("session.list", {}))["sessions"] == []
            assert await code_of(c, "session.get", {"sessionId": TREE}) == "SESSION_NOT_FOUND"


# every method that names a session and has no native handler refuses a native id, before anything runs
NATIVE_ROUTES = {name for name, route in ROUTES.items() if route.native is not None}
REFUSED: dict[str, dict[str, Any]] = {
    "session.rename": {"title": "x"},
    "session.update": {"modelId": "m"},
    "session.delete": {},
    "session.appendMessage": {"message": msg("m1", "x")},
    "session.queuePush": {"principal": "p", "content": "c", "permissionMode": "ask"},
    "session.queueList": {},
    "session.truncateFrom": {"messageId": "m1"},
    "session.saveActiveRevision": {"rootUserId": "m1"},
    "session.listRevisions": {},
    "session.deleteMessage": {"messageId": "m1"},
    "session.startTurn": {"turnId": "t1"},
    "session.tree": {},
    "session.context": {},
    "sessions.trash": {},
    "sessions.purge": {},
    "plans.submit": {"turnId": "t", "toolCallId": "c", "kind": "plan", "markdown": "# p", "workspaceRoot": "/w"},
    "attachments.ref": {"sha256": "0" * 64},
}
# (session.turnEnvironment takes no sessionId: one sent is an unknown key, INVALID_PARAMS, whatever its value —
# tests/protocol/test_error_listing.py)


def test_the_native_handlers_are_exactly_the_supported_reads_and_fork() -> None:
    from store.interchange.native_pi import SUPPORTED

    assert NATIVE_ROUTES | {"session.list"} == set(SUPPORTED)


@pytest.mark.parametrize("method", sorted(REFUSED))
async def test_mutations_and_other_session_methods_are_refused(tmp_path: Path, root: Path, method: str) -> None:
    before = tree_state(root)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            with pytest.raises(RpcError) as err:
                await c.call(method, {"sessionId": TREE, **REFUSED[method]})
            assert err.value.data_code == "UNSUPPORTED_FOR_NATIVE_SESSION"
            assert err.value.data["method"] == method and err.value.data["sessionId"] == TREE
            assert not host.registry.statistics().children  # no actor was started for it
    assert tree_state(root) == before


def db_rows(root: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def test_fork_writes_one_child_and_a_retry_finds_it(tmp_path: Path, root: Path) -> None:
    data = tmp_path / "data"
    parent = find(root, "*stub_provider*.jsonl")
    before = tree_state(root)
    params = {"sessionId": STUB, "title": "Forked here", "submissionId": "fork-1"}
    with trio.fail_after(60):
        async with inprocess_host(data, native_pi_root=root) as host, client_for(host) as c:
            child = await c.call("session.fork", params)
            assert child["id"].startswith("native-pi:") and child["title"] == "Forked here"
            assert child["source"] == "native-pi" and child["native"]["version"] == 3
            new = sorted(set(tree_state(root)) - set(before))
            assert len(new) == 1 and (root / new[0]).parent == parent.parent
            header = orjson.loads((root / new[0]).read_bytes().splitlines()[0])
            assert header["version"] == 3 and header["parentSession"] == str(parent.resolve())
            assert await c.call("session.fork", params) == child  # the receipt answers
            assert child["id"] in [s["id"] for s in (await c.call("session.list", {"limit": 50}))["sessions"]]
            page = await c.call("session.get", {"sessionId": child["id"]})
            assert page["totalMessages"] == (await c.call("session.get", {"sessionId": STUB}))["totalMessages"]
            first = page["messages"][0]["id"]
            early = await c.call("session.fork", {"sessionId": STUB, "throughMessageId":
                                                  first.replace(child["id"], STUB)})
            assert (await c.call("session.get", {"sessionId": early["id"]}))["totalMessages"] == 1
            assert await code_of(c, "session.fork", {"sessionId": STUB, "throughMessageId": f"{STUB}:nope"}) == \
                "MESSAGE_NOT_FOUND"
    assert {k: v for k, v in tree_state(root).items() if k in before} == before  # the parent never changed
    # a crash after the link and before the receipt's commit: the retry finds the child it wrote
    conn = sqlite3.connect(data / "pi.sqlite")
    conn.execute("DELETE FROM command_receipts WHERE submission_id = 'fork-1'")
    conn.commit()
    conn.close()
    files = set(tree_state(root))
    with trio.fail_after(60):
        async with inprocess_host(data, native_pi_root=root) as host, client_for(host) as c:
            assert (await c.call("session.fork", params))["id"] == child["id"]
    assert set(tree_state(root)) == files  # no second child


async def test_a_native_session_exports(tmp_path: Path, root: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            md = await c.call("session.export", {"sessionId": TREE, "format": "md"})
            assert md["messages"] == 3 and "main answer" in md["content"] and "follow up" in md["content"]
            jsonl = await c.call("session.export", {"sessionId": TREE, "format": "jsonl"})
            lines = [orjson.loads(line) for line in jsonl["content"].splitlines()]
            assert lines[0]["sessionId"] == TREE and [ln["type"] for ln in lines].count("message") == 3


@pytest.mark.parametrize(("method", "params"), [
    ("collab.deliver", {"pluginId": "team", "sourceSessionId": TREE, "targetSessionId": "s1", "kind": "task",
                        "content": "x", "idempotencyKey": "k"}),
    ("collab.deliver", {"pluginId": "team", "sourceSessionId": "s1", "targetSessionId": TREE, "kind": "task",
                        "content": "x", "idempotencyKey": "k"}),
    ("collab.deliver", {"pluginId": "team", "source_session_id": "s1", "target_session_id": TREE, "kind": "task",
                        "content": "x", "idempotencyKey": "k"}),
    ("attachments.gc", {"activeSessionId": TREE}),
])
async def test_a_native_id_in_any_session_field_is_refused_as_native(tmp_path: Path, root: Path, method: str,
                                                                    params: dict[str, Any]) -> None:
    """Found in stop 41's audit: only ``sessionId`` was checked, so a native id as a collaboration source or
    target (or gc's active session) was INVALID_PARAMS, not the UNSUPPORTED_FOR_NATIVE_SESSION the README
    promises for every method that does not support one."""
    before = tree_state(root)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "s1"})
            with pytest.raises(RpcError) as err:
                await c.call(method, params)
            assert err.value.data_code == "UNSUPPORTED_FOR_NATIVE_SESSION"
            assert (err.value.data["method"], err.value.data["sessionId"]) == (method, TREE)
            if method == "collab.deliver":
                assert (await c.call("collab.list", {"sessionId": "s1"}))["deliveries"] == []
    assert tree_state(root) == before


async def test_get_builds_its_window_off_the_trio_thread(tmp_path: Path, root: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A native session's window (up to a whole-history read) is built in the worker thread that reads the
    snapshot, never on the trio loop (every other request of the host waits while it runs there)."""
    seen: list[bool] = []
    window = native_handler.native_window

    def window_seen(*args: Any) -> dict[str, Any]:
        seen.append(on_trio_thread())
        return window(*args)

    monkeypatch.setattr(native_handler, "native_window", window_seen)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, client_for(host) as c:
            page = await c.call("session.get", {"sessionId": TREE})
            assert page["totalMessages"] == 3
            assert await code_of(c, "session.get", {"sessionId": TREE, "messageAround": "nope"}) == \
                "MESSAGE_NOT_FOUND"
    assert seen == [False, False]
