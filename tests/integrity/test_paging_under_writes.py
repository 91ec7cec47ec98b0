"""Paging while another client writes (black-box, real hosts over WebSocket).

A UI pages through a list while the agent writes between its page reads: creates, appends, deletes,
trashes, ends turns, truncates. Many items share one timestamp (the host clock is held still with
``SetClock``). The bar for every cursor-paged list: no item seen twice and none skipped among the items
that existed, unchanged, for the whole paging; a cursor from before a rewrite or a restart still pages
(or fails with a stable code). For ``session.get`` windows (seed 003 §5, physical positions): the newest
window and the older ones stitched together are the transcript exactly, while appends land between
reads and after a kill between a line's fsync and its index commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import call_killed_at, client_for, inprocess_host, msg, start_host_process
from tests.scheduler.hostclock import SetClock, host_at
from tests.scheduler.schedkit import BASE
from tests.turns.turnkit import end, start

Between = Callable[[int], Awaitable[None]]


@contextlib.asynccontextmanager
async def ui_and_agent(data: Path, clock: SetClock) -> AsyncIterator[tuple[HostClient, HostClient]]:
    """An in-process host on ``clock`` (held still: many items share a timestamp), a UI client that pages and
    an agent client that writes between its pages."""
    async with host_at(data, clock) as host, client_for(host) as ui, \
            client_for(host, client_id="agent", kind="agent") as agent:
        yield ui, agent


async def page_all(c: HostClient, method: str, params: dict[str, Any], key: str, ident: str,
                   between: Between | None = None) -> list[str]:
    """Every page of ``method`` (``between(n)`` runs after page ``n``); the ids in the order they came."""
    seen: list[str] = []
    cursor: str | None = None
    n = 0
    while True:
        page = await c.call(method, {**params, **({"cursor": cursor} if cursor else {})})
        seen += [str(item[ident]) for item in page[key]]
        cursor = page.get("nextCursor")
        if not cursor:
            return seen
        if between is not None:
            await between(n)
        n += 1
        assert n < 200, "paging does not end"


def no_dupes_no_skips(seen: list[str], unchanged: set[str]) -> None:
    assert len(seen) == len(set(seen)), sorted(x for x in seen if seen.count(x) > 1)
    assert unchanged <= set(seen), sorted(unchanged - set(seen))


# --------------------------------------------------------------------------- cursor-paged lists


async def test_session_list_with_one_timestamp_while_sessions_are_created_touched_deleted_trashed(
        tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            sids = [(await agent.call("session.create", {"sessionId": f"s{i:02d}", "title": f"t{i}"}))["id"]
                    for i in range(14)]
            touched: set[str] = set()

            async def between(n: int) -> None:
                await agent.call("session.create", {"sessionId": f"new{n}", "title": "new"})
                victim, trashed, appended = sids[n], sids[-1 - n], sids[5 + n]
                touched.update({victim, trashed, appended})
                await agent.call("session.delete", {"sessionId": victim})
                await agent.call("sessions.trash", {"sessionId": trashed})
                await agent.call("session.appendMessage", {"sessionId": appended, "message": msg(f"m{n}", "hi")})
                clock.ms += n % 2  # sometimes a later timestamp, sometimes the same one

            seen = await page_all(ui, "session.list", {"limit": 3}, "sessions", "id", between)
            no_dupes_no_skips(seen, set(sids) - touched)


async def test_notifications_with_one_timestamp_while_turns_end_and_some_are_read(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            sid = (await agent.call("session.create", {"title": "n"}))["id"]
            for i in range(10):
                await start(agent, sid, f"t{i:02d}")
                await end(agent, sid, f"t{i:02d}")
            before = (await ui.call("notifications.list", {"limit": 200}))["notifications"]
            ids = {n["id"] for n in before}
            assert len(ids) == 10

            async def between(n: int) -> None:
                await start(agent, sid, f"late{n}")
                await end(agent, sid, f"late{n}")

            seen = await page_all(ui, "notifications.list", {"limit": 3}, "notifications", "id", between)
            no_dupes_no_skips(seen, ids)
            # the unread filter: items marked read between pages leave it, the others are each seen once
            changed: set[str] = set()
            order = [n["id"] for n in before]

            async def read_some(n: int) -> None:
                changed.add(order[-1 - n])
                await agent.call("notifications.markRead", {"ids": [order[-1 - n]]})

            seen = await page_all(ui, "notifications.list", {"limit": 3, "unreadOnly": True}, "notifications",
                                  "id", read_some)
            no_dupes_no_skips(seen, ids - changed)


async def test_turns_with_one_timestamp_while_turns_start_and_end(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            sid = (await agent.call("session.create", {"title": "turns"}))["id"]
            for i in range(9):
                await start(agent, sid, f"t{i}")
                await end(agent, sid, f"t{i}")

            async def between(n: int) -> None:
                await start(agent, sid, f"late{n}")
                await end(agent, sid, f"late{n}")

            seen = await page_all(ui, "session.listTurns", {"sessionId": sid, "limit": 2}, "turns", "id", between)
            no_dupes_no_skips(seen, {f"t{i}" for i in range(9)})


async def test_search_pages_with_one_timestamp_while_messages_are_appended_and_truncated(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            for s in range(6):
                await agent.call("session.create", {"sessionId": f"s{s}", "title": f"t{s}"})
                for i in range(4):
                    await agent.call("session.appendMessage", {
                        "sessionId": f"s{s}", "message": msg(f"s{s}m{i}", f"needle {s} {i}")})
            cut = "s0"
            late = iter(range(1000))

            async def between(n: int) -> None:
                k = next(late)
                await agent.call("session.appendMessage", {
                    "sessionId": f"s{k % 6}", "message": msg(f"late{k}", f"needle late {k}")})
                if k == 1:
                    await agent.call("session.truncateFrom", {"sessionId": cut, "messageId": f"{cut}m2"})

            seen = await page_all(ui, "search.query", {"query": "needle", "limit": 3}, "results", "messageId",
                                  between)
            unchanged = {f"s{s}m{i}" for s in range(6) for i in range(4)} - {f"{cut}m2", f"{cut}m3"}
            no_dupes_no_skips(seen, unchanged)
            seen = await page_all(ui, "search.sessions", {"query": "needle", "limit": 2}, "results", "sessionId",
                                  between)
            # appended sessions move ahead of the cursor; the others are each seen once
            assert len(seen) == len(set(seen))


async def test_cursors_survive_a_restart(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(120):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for s in range(5):
                await c.call("session.create", {"sessionId": f"s{s}", "title": f"t{s}"})
                await c.call("session.appendMessage", {"sessionId": f"s{s}", "message": msg(f"m{s}", "needle")})
                await start(c, f"s{s}", f"t{s}")
                await end(c, f"s{s}", f"t{s}")
            await start(c, "s0", "x1")
            await end(c, "s0", "x1")
            calls: dict[str, tuple[dict[str, Any], str, str]] = {
                "session.list": ({"limit": 2}, "sessions", "id"),
                "notifications.list": ({"limit": 2}, "notifications", "id"),
                "search.query": ({"query": "needle", "limit": 2}, "results", "messageId"),
                "search.sessions": ({"query": "needle", "limit": 2}, "results", "sessionId"),
                "session.listTurns": ({"sessionId": "s0", "limit": 1}, "turns", "id"),
            }
            whole = {m: await page_all(c, m, p, k, i) for m, (p, k, i) in calls.items()}
            first = {m: await c.call(m, p) for m, (p, _, _) in calls.items()}
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for method, (params, key, ident) in calls.items():
                page = first[method]
                rest = await page_all(c, method, {**params, "cursor": page["nextCursor"]}, key, ident)
                assert [str(x[ident]) for x in page[key]] + rest == whole[method], method


async def test_garbled_cursors_are_refused_on_every_list(tmp_path: Path) -> None:
    """tests/hostile covers forged key elements of five lists; here the other cursor lists and a cursor
    passed to the wrong list."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "x"}))["id"]
            for i in range(3):
                await start(c, sid, f"t{i}")
                await end(c, sid, f"t{i}")
            listed = await c.call("notifications.list", {"limit": 1})
            foreign = listed["nextCursor"]
            assert foreign
            for method, params in {"notifications.list": {"limit": 1}, "audit.list": {"limit": 1},
                                   "artifacts.list": {"limit": 1, "sessionId": sid},
                                   "session.list": {"limit": 1}, "session.listTurns": {"sessionId": sid}}.items():
                for bad in ("%%%", "eyJ4IjoxfQ", foreign[:-3] + "AAA", "W10"):
                    if method == "notifications.list" and bad == foreign:
                        continue
                    with pytest.raises(RpcError) as exc:
                        await c.call(method, {**params, "cursor": bad})
                    assert exc.value.code == -32602, (method, bad)
                    assert exc.value.data_code == "INVALID_CURSOR", (method, bad, exc.value.data_code)
                if method != "notifications.list":
                    with pytest.raises(RpcError) as exc:
                        await c.call(method, {**params, "cursor": foreign})
                    assert exc.value.data_code == "INVALID_CURSOR", method


# --------------------------------------------------------------------------- session.get windows


async def windows_back(c: HostClient, sid: str, limit: int, between: Between | None = None) -> tuple[list[str], int]:
    """The newest window, then older ones back to position 0: the ids in file order and the first
    window's ``messageEnd``."""
    got = await c.call("session.get", {"sessionId": sid, "messageLimit": limit})
    end_at = got["messageEnd"]
    chunks = [got]
    n = 0
    while got["hasMoreBefore"]:
        if between is not None:
            await between(n)
        n += 1
        got = await c.call("session.get", {"sessionId": sid, "messageLimit": limit,
                                           "messageBefore": got["messageStart"]})
        assert got["messageEnd"] == chunks[-1]["messageStart"]
        chunks.append(got)
    assert chunks[-1]["messageStart"] == 0
    ids = [m["id"] for chunk in reversed(chunks) for m in chunk["messages"]]
    assert len(ids) == end_at
    return ids, end_at


async def test_windows_stitch_to_the_transcript_while_appends_land(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            sid = (await agent.call("session.create", {"title": "w"}))["id"]
            for i in range(23):
                await agent.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i:02d}", f"x{i}")})

            async def between(n: int) -> None:
                for k in range(2):
                    await agent.call("session.appendMessage", {
                        "sessionId": sid, "message": msg(f"late{n}_{k}", "y")})

            ids, end_at = await windows_back(ui, sid, 4, between)
            assert ids == [f"m{i:02d}" for i in range(23)]
            # forward from where the first window ended: exactly the appends, in order
            fwd: list[str] = []
            got = {"messageEnd": end_at, "hasMoreAfter": True}
            while got["hasMoreAfter"]:
                got = await ui.call("session.get", {"sessionId": sid, "messageEnd": got["messageEnd"],
                                                    "messageLimit": 3})
                fwd += [m["id"] for m in got["messages"]]
                await between(100 + len(fwd))
            full = [m["id"] for m in (await ui.call("session.get", {"sessionId": sid, "full": True}))["messages"]]
            assert ids + fwd == full[: len(ids) + len(fwd)]
            assert len(ids) + len(fwd) >= len(full) - 2


async def test_windows_after_a_truncate_between_reads_fail_or_stay_physical(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "w"}))["id"]
            for i in range(12):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i:02d}", f"x{i}")})
            newest = await c.call("session.get", {"sessionId": sid, "messageLimit": 4})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "m06"})
            after = await c.call("session.get", {"sessionId": sid, "full": True})
            file_ids = [m["id"] for m in after["messages"]]
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 4,
                                               "messageBefore": newest["messageStart"]})
            # the window is the file's lines before that physical position, whatever they are now
            assert [m["id"] for m in got["messages"]] == file_ids[max(0, got["messageStart"]):got["messageEnd"]]
            assert got["messageEnd"] <= newest["messageStart"]


@pytest.mark.parametrize("point", ["append.after_fsync", "index.before_commit"])
async def test_windows_stitch_after_a_kill_between_fsync_and_the_index_commit(tmp_path: Path, point: str) -> None:
    """``append.after_fsync``: killed before the answer; ``index.before_commit``: the append was answered
    (acknowledged once durable), the kill comes before its index rows commit."""
    with trio.fail_after(120):
        proc = start_host_process(tmp_path)
        try:
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as c:
                await c.call("session.create", {"sessionId": "s1", "title": "k"})
                for i in range(9):
                    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"x{i}")})
        finally:
            assert proc.terminate() == 0
        params = {"sessionId": "s1", "message": msg("m9", "x9")}
        if point == "append.after_fsync":
            await call_killed_at(tmp_path, point, "session.appendMessage", params)
        else:
            crashing = start_host_process(tmp_path, env={"RT_CRASHPOINT": f"{point}:1"})
            try:
                with contextlib.suppress(ClientClosed, OSError):
                    async with open_client(crashing.url, crashing.token, client_id="ui", client_kind="ui") as c:
                        await c.call("session.appendMessage", params)
                await trio.to_thread.run_sync(crashing.reap)
            finally:
                crashing.kill9()
            assert crashing.proc.returncode == -9
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            full = [m["id"] for m in (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]]
            assert full == [f"m{i}" for i in range(10)]
            ids, _ = await windows_back(c, "s1", 3)
            assert ids == full


# --------------------------------------------------------------------------- long keys in a cursor


def _write(mid: str, path: str) -> dict[str, Any]:
    return {"id": mid, "role": "tool", "toolName": "Write", "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": "Write", "args": {"path": path}, "status": "ok"}]}


async def test_artifact_pages_with_long_paths_and_one_timestamp(tmp_path: Path) -> None:
    """Artifact paths are long (deep workspaces): the nextCursor the host issues for a page ending on
    such a path must be accepted back (a cursor param is at most 512 characters) and page on."""
    project = tmp_path / "project"
    project.mkdir()
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path / "data", clock) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t", "projectPath": str(project)}))["id"]
            deep = "/".join(["directory_with_a_long_name"] * 20)
            paths = [f"{project}/{deep}/file{i}.py" for i in range(5)]
            for i, path in enumerate(paths):
                await c.call("session.appendMessage", {"sessionId": sid, "message": _write(f"m{i}", path)})

            async def between(n: int) -> None:
                await c.call("session.appendMessage", {
                    "sessionId": sid, "message": _write(f"late{n}", f"{project}/{deep}/late{n}.py")})

            seen = await page_all(c, "artifacts.list", {"sessionId": sid, "limit": 2}, "artifacts", "path", between)
            no_dupes_no_skips(seen, set(paths))
            seen = await page_all(c, "artifacts.list", {"limit": 2}, "artifacts", "path")
            no_dupes_no_skips(seen, set(paths))
            # a cursor ending on a long path whose file is written again (it moves ahead) still pages on
            first = await c.call("artifacts.list", {"sessionId": sid, "limit": 2})
            last = first["artifacts"][-1]["path"]
            clock.ms += 1
            await c.call("session.appendMessage", {"sessionId": sid, "message": _write("again", last)})
            rest = await page_all(c, "artifacts.list", {"sessionId": sid, "limit": 2,
                                                        "cursor": first["nextCursor"]}, "artifacts", "path")
            assert last not in rest
            seen = [a["path"] for a in first["artifacts"]] + rest
            no_dupes_no_skips(seen, set(paths) - {last})
            # a forged digest is refused with the stable code
            with pytest.raises(RpcError) as exc:
                await c.call("artifacts.list", {"sessionId": sid, "limit": 2,
                                                "cursor": first["nextCursor"][:-8] + "AAAAAAAA"})
            assert exc.value.data_code == "INVALID_CURSOR"


async def test_windows_stitch_while_compactions_deletions_and_edits_land(tmp_path: Path) -> None:
    """Compaction lines, tombstones and assistant edits written between window reads: the windows (older
    ones by ``messageBefore``) still stitch without a gap or an overlap to what the whole read gives."""
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            sid = (await agent.call("session.create", {"title": "w"}))["id"]
            for i in range(20):
                role = "assistant" if i % 2 else "user"
                await agent.call("session.appendMessage", {
                    "sessionId": sid, "message": msg(f"m{i:02d}", f"x{i}", role=role)})

            async def between(n: int) -> None:
                if n == 0:
                    await agent.call("session.appendCompaction", {"sessionId": sid, "compaction": {
                        "id": "cp1", "summary": "so far", "firstKeptMessageId": "m10", "throughMessageId": "m09",
                        "tokensBefore": 1000, "retainedTail": []}})
                elif n == 1:
                    await agent.call("session.deleteMessage", {"sessionId": sid, "messageId": "m03"})
                    await agent.call("session.deleteMessage", {"sessionId": sid, "messageId": "m18"})
                elif n == 2:
                    await agent.call("session.assistantEdit", {"sessionId": sid, "messageId": "m05",
                                                               "blocks": [{"type": "text", "text": "edited"}]})
                await agent.call("session.appendMessage", {"sessionId": sid, "message": msg(f"late{n}", "y")})

            got = await ui.call("session.get", {"sessionId": sid, "messageLimit": 4})
            chunks = [got]
            n = 0
            while got["hasMoreBefore"]:
                await between(n)
                n += 1
                got = await ui.call("session.get", {"sessionId": sid, "messageLimit": 4,
                                                    "messageBefore": got["messageStart"]})
                assert got["messageEnd"] == chunks[-1]["messageStart"]
                chunks.append(got)
            ids = [m["id"] for chunk in reversed(chunks) for m in chunk["messages"]]
            full = await ui.call("session.get", {"sessionId": sid, "full": True})
            whole = [m["id"] for m in full["messages"]]
            assert len(ids) == len(set(ids))
            assert ids == whole[: len(ids)], (ids, whole)
            unchanged = {f"m{i:02d}" for i in range(20)} - {"m03", "m18"}
            assert unchanged <= set(ids), sorted(unchanged - set(ids))


async def test_cursors_after_the_index_is_rebuilt(tmp_path: Path) -> None:
    """A restart that rebuilds a lost index: every cursor issued before it either pages on exactly (no
    item twice, none skipped) or is refused with a stable code, never a wrong page. Sessions are created
    out of id order and every message shares one timestamp, so the ties are broken by index numbering.
    (Notifications and turn rows live in the index only: a lost index loses them, nothing to page.)"""
    clock = SetClock(BASE)
    calls: dict[str, tuple[dict[str, Any], str, str]] = {
        "session.list": ({"limit": 2}, "sessions", "id"),
        "search.query": ({"query": "needle", "limit": 3}, "results", "messageId"),
        "search.sessions": ({"query": "needle", "limit": 2}, "results", "sessionId"),
    }
    with trio.fail_after(120):
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for sid in ("s-e", "s-a", "s-d", "s-b", "s-c"):
                await c.call("session.create", {"sessionId": sid, "title": sid})
                for i in range(3):
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-{i}", "needle")})
                await start(c, sid, f"t{sid}")
                await end(c, sid, f"t{sid}")
            await start(c, "s-e", "x1")
            await end(c, "s-e", "x1")
            whole = {m: await page_all(c, m, p, k, i) for m, (p, k, i) in calls.items()}
            first = {m: await c.call(m, p) for m, (p, _, _) in calls.items()}
        from tests.integrity.test_db_loss_receipts import _damage
        _damage(tmp_path, "deleted")
        async with host_at(tmp_path, clock) as host, client_for(host) as c:
            for method, (params, key, ident) in calls.items():
                assert sorted(await page_all(c, method, params, key, ident)) == sorted(whole[method]), method
                page = first[method]
                head = [str(x[ident]) for x in page[key]]
                try:
                    rest = await page_all(c, method, {**params, "cursor": page["nextCursor"]}, key, ident)
                except RpcError as exc:
                    assert exc.data_code in ("INVALID_CURSOR", "CURSOR_EXPIRED"), (method, exc.data_code)
                    continue
                got = head + rest
                assert len(got) == len(set(got)) and set(got) == set(whole[method]), (method, head, rest)


async def test_collab_deliveries_with_one_timestamp_while_more_are_delivered(tmp_path: Path) -> None:
    clock = SetClock(BASE)
    with trio.fail_after(90):
        async with ui_and_agent(tmp_path, clock) as (ui, agent):
            src = (await agent.call("session.create", {"title": "src"}))["id"]
            dsts = [(await agent.call("session.create", {"title": f"dst{i}"}))["id"] for i in range(6)]

            async def deliver(key: str, to: int) -> str:
                got = await agent.call("collab.deliver", {
                    "pluginId": "pl", "sourceSessionId": src, "targetSessionId": dsts[to], "kind": "task",
                    "content": f"task {key}", "idempotencyKey": key})
                return str(got["delivery"]["id"] if "delivery" in got else got["id"])

            ids = {await deliver(f"k{n}", n % 3) for n in range(9)}
            late = iter(range(1000))

            async def between(n: int) -> None:
                k = next(late)
                await deliver(f"late{k}", 3 + k % 3)

            outgoing = {"sessionId": src, "direction": "outgoing", "limit": 3}
            seen = await page_all(ui, "collab.list", outgoing, "deliveries", "id", between)
            no_dupes_no_skips(seen, ids)
            seen = await page_all(ui, "collab.list", {"limit": 3}, "deliveries", "id", between)
            no_dupes_no_skips(seen, ids)


async def test_audit_pages_with_one_timestamp_while_tools_write(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    clock = SetClock(BASE)
    with trio.fail_after(60):
        async with host_at(tmp_path / "data", clock) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t", "projectPath": str(project)}))["id"]
            for i in range(7):
                await c.call("session.appendMessage", {"sessionId": sid, "message": _write(f"m{i}", f"f{i}.py")})
            ids = {str(e["id"]) for e in (await c.call("audit.list", {"limit": 500}))["entries"]}
            assert len(ids) >= 7

            async def between(n: int) -> None:
                await c.call("session.appendMessage", {"sessionId": sid, "message": _write(f"late{n}", "g.py")})

            no_dupes_no_skips(await page_all(c, "audit.list", {"limit": 2}, "entries", "id", between), ids)
            no_dupes_no_skips(await page_all(c, "audit.list", {"limit": 2, "sessionId": sid}, "entries", "id",
                                             between), ids)


async def test_a_forward_stream_under_max_bytes_while_appends_land(tmp_path: Path) -> None:
    """``messageEnd: 0, maxBytes: N`` then ``messageEnd: <previous messageEnd>``: every line once, in order,
    the appends that land meanwhile included."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as ui, \
                client_for(host, client_id="agent", kind="agent") as agent:
            sid = (await agent.call("session.create", {"title": "s"}))["id"]
            for i in range(15):
                await agent.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i:02d}", "x" * 300)})
            ids: list[str] = []
            got: dict[str, Any] = {"messageEnd": 0, "hasMoreAfter": True}
            n = 0
            while got["hasMoreAfter"]:
                got = await ui.call("session.get", {"sessionId": sid, "messageEnd": got["messageEnd"],
                                                    "maxBytes": 1500})
                assert got["messages"], got
                ids += [m["id"] for m in got["messages"]]
                if n < 3:
                    await agent.call("session.appendMessage", {"sessionId": sid, "message": msg(f"late{n}", "y")})
                n += 1
            full = [m["id"] for m in (await ui.call("session.get", {"sessionId": sid, "full": True}))["messages"]]
            assert ids == full
