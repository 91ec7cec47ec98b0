"""Seed 003 §4.2 (projects), §4.5 (sessions.deleted_at, the trash), §4.14 (the notification inbox) and
protocol/README §9 "Trash", against real ``pi-host serve`` processes over WebSocket.

Found: ``sessions.restore`` of a session not in the trash (and ``sessions.trash`` of one already there)
appended a ``session_info`` line all the same, the call's receipt in it; ``projects.list`` counted a
project's live sessions only while ``projects.remove`` deletes its trashed ones too, and no field said how
many; a trashed session's notifications stayed in ``notifications.list`` and its ``unreadCount``, and
``markAllRead`` / ``clear`` changed them, so a restore did not bring them back as they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.models import NotificationsListResult, ProjectsListResult, TrashResult
from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, code_of, data_dir, real_host, say, shared_host
from tests.hostkit import HostProcess


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each uses sessions and project paths of its own)."""
    yield from shared_host(tmp_path_factory, "trash-outsider")


def _files(root: Path, sid: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "sessions").iterdir() if p.name.startswith(f"{sid}.")}


async def _trash_ids(c: HostClient) -> list[str]:
    return [s["id"] for s in (await c.call("sessions.listTrashed", {}))["sessions"]]


# --------------------------------------------------------------------------------- §4.5 trash, no-op calls


async def test_restoring_a_session_not_in_the_trash_writes_nothing_and_a_keyed_retry_answers_as_the_first(
        tmp_path: Path) -> None:
    """protocol/README §9 Trash: "sessions.restore brings it back exactly"; a session not in the trash has
    nothing to come back from, so its restore answers the session as it is and writes nothing (no
    ``session_info`` line: the transcript keeps its bytes). Keyed (§4), a retry answers exactly what the
    first call did, after a rename, after the session went to the trash since (nothing restored then) and
    after a SIGKILL and restart; the same key for another request is ``IDEMPOTENCY_CONFLICT``. The same for
    ``sessions.trash`` of a session already in the trash: it keeps its first time and writes nothing."""
    root = data_dir(tmp_path)
    keyed = {"sessionId": "live", "submissionId": "rs-live"}
    again = {"sessionId": "gone", "submissionId": "tr-again"}
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            for sid in ("live", "gone"):
                await c.call("session.create", {"sessionId": sid, "title": f"{sid} session"})
                await say(c, sid, f"{sid}-u1", "hello")
            gone_at = (await c.call("sessions.trash", {"sessionId": "gone"}))["session"]["deletedAt"]
            files = {sid: _files(root, sid) for sid in ("live", "gone")}
            summary = (await c.call("session.get", {"sessionId": "live"}))["session"]

            plain = await c.call("sessions.restore", {"sessionId": "live"})
            first = await c.call("sessions.restore", keyed)
            for answer in (plain, first):
                TrashResult.model_validate(answer)
                assert answer["session"] == summary
            trashed_again = await c.call("sessions.trash", again)
            TrashResult.model_validate(trashed_again)
            assert trashed_again["session"]["deletedAt"] == gone_at
            await c.call("sessions.trash", {"sessionId": "gone"})
            assert {sid: _files(root, sid) for sid in ("live", "gone")} == files  # not one byte written
            assert await _trash_ids(c) == ["gone"]

            await c.call("session.rename", {"sessionId": "live", "title": "renamed since"})
            assert await c.call("sessions.restore", keyed) == first
            await c.call("sessions.trash", {"sessionId": "live"})
            assert await c.call("sessions.restore", keyed) == first  # answered: not restored by the retry
            assert await _trash_ids(c) == ["live", "gone"]
            await c.call("sessions.restore", {"sessionId": "gone"})
            assert await c.call("sessions.trash", again) == trashed_again  # answered: not trashed again
            assert await _trash_ids(c) == ["live"]
            assert await code_of(c, "sessions.restore", {**keyed, "sessionId": "gone"}) == "IDEMPOTENCY_CONFLICT"
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert await c.call("sessions.restore", keyed) == first
            assert await c.call("sessions.trash", again) == trashed_again
            assert await _trash_ids(c) == ["live"]
            assert (await c.call("session.get", {"sessionId": "gone"}))["session"].get("deletedAt") is None
            proc.kill9()


# ------------------------------------------------------------------ §4.2 projects.list, projects.remove


async def _project(c: HostClient, path: str) -> dict[str, Any]:
    listed = await c.call("projects.list", {})
    ProjectsListResult.model_validate(listed)
    (project,) = [p for p in listed["projects"] if p["path"] == path]
    return dict(project)


async def test_projects_list_says_how_many_sessions_a_remove_deletes_the_trash_included(
        shared: HostProcess) -> None:
    """Seed 003 §4.2: "projects.list is the Project archive index source of truth"; protocol/README:
    ``projects.remove`` deletes "a project's sessions (rows and files)", the trashed ones too, while
    ``sessionCount`` counts what ``session.list {projectId}`` shows (§9: the trash is "hidden from
    session.list"). ``trashedSessionCount`` beside it counts the project's sessions in the trash, so a UI
    that asks "remove N sessions?" knows N = sessionCount + trashedSessionCount before it removes."""
    path = "/trash-outsider/counted"
    with trio.fail_after(60):
        async with client(shared) as c:
            sids = [(await c.call("session.create", {"projectPath": path, "title": f"s{n}"}))["id"] for n in range(4)]
            await c.call("sessions.trash", {"sessionId": sids[0]})
            await c.call("sessions.trash", {"sessionId": sids[1]})
            project = await _project(c, path)
            listed = (await c.call("session.list", {"projectId": project["id"]}))["sessions"]
            assert sorted(s["id"] for s in listed) == sorted(sids[2:])
            assert (project["sessionCount"], project["trashedSessionCount"]) == (2, 2)
            await c.call("sessions.restore", {"sessionId": sids[1]})
            project = await _project(c, path)
            assert (project["sessionCount"], project["trashedSessionCount"]) == (3, 1)
            for method, params in (("workspace.open", {"path": path}), ("projects.pin", {
                    "projectId": project["id"], "pinned": True})):
                answered = (await c.call(method, params))["project"]
                assert (answered["sessionCount"], answered["trashedSessionCount"]) == (3, 1), method
            removed = await c.call("projects.remove", {"projectId": project["id"]})
            assert sorted(removed["deletedSessions"]) == sorted(sids)
            assert len(removed["deletedSessions"]) == project["sessionCount"] + project["trashedSessionCount"]


# ---------------------------------------------------------------------- §4.14 the inbox and the trash


async def _inbox(c: HostClient) -> dict[str, Any]:
    everything = await c.call("notifications.list", {"limit": 200})
    unread = await c.call("notifications.list", {"unreadOnly": True, "limit": 200})
    for page in (everything, unread):
        NotificationsListResult.model_validate(page)
    assert everything["unreadCount"] == unread["unreadCount"] == len(unread["notifications"])
    return {"all": everything["notifications"], "unread": everything["unreadCount"]}


async def _ended(c: HostClient, sid: str, turn_id: str, status: str = "completed") -> dict[str, Any]:
    await c.call("session.startTurn", {"sessionId": sid, "turnId": turn_id})
    ended = await c.call("session.endTurn", {"sessionId": sid, "turnId": turn_id, "status": status})
    return dict(ended["notification"])


async def test_a_trashed_sessions_notifications_leave_the_inbox_and_come_back_as_they_were_on_restore(
        tmp_path: Path) -> None:
    """protocol/README §9 Trash: a trashed session is hidden and "sessions.restore brings it back exactly";
    nothing is removed before the purge. Seed 003 §4.14: the inbox is ``notifications.list`` with its unread
    count, mark-read, mark-all-read and clear. While its session is in the trash a notification is out of
    the inbox (the list, ``unreadOnly``, ``unreadCount``), and mark-read, mark-all-read and clear do not
    reach it, so a restore (a SIGKILL and restart between) brings it back as it was, read or unread; a
    purge deletes it with its session (§4.14 "session deletion also cascades its rows")."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            for sid in ("hidden", "shown"):
                await c.call("session.create", {"sessionId": sid, "title": f"{sid} session"})
            h1 = await _ended(c, "hidden", "h-t1")
            h2 = await _ended(c, "hidden", "h-t2", "error")
            s1 = await _ended(c, "shown", "s-t1")
            assert await c.call("notifications.markRead", {"ids": [h2["id"]]}) == {"updated": 1}
            before = await _inbox(c)
            assert [n["id"] for n in before["all"]] == [s1["id"], h2["id"], h1["id"]] and before["unread"] == 2

            await c.call("sessions.trash", {"sessionId": "hidden"})
            trashed = await _inbox(c)
            assert trashed == {"all": [before["all"][0]], "unread": 1}
            # what the inbox does not show, its writes do not reach (nothing of the trash changes or goes)
            assert await c.call("notifications.markRead", {"ids": [h1["id"]]}) == {"updated": 0}
            assert await c.call("notifications.clear", {"ids": [h1["id"], h2["id"]]}) == {"deleted": 0}
            assert await c.call("notifications.markAllRead", {}) == {"updated": 1}
            assert (await _inbox(c))["unread"] == 0
            s2 = await _ended(c, "shown", "s-t2")
            assert await c.call("notifications.clear", {}) == {"deleted": 2}
            assert await _inbox(c) == {"all": [], "unread": 0}
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert await _inbox(c) == {"all": [], "unread": 0}
            await c.call("sessions.restore", {"sessionId": "hidden"})
            assert await _inbox(c) == {"all": before["all"][1:], "unread": 1}
            assert s2["id"] not in {n["id"] for n in (await _inbox(c))["all"]}
            await c.call("sessions.trash", {"sessionId": "hidden"})
            await c.call("sessions.purge", {"sessionId": "hidden"})
            await c.call("sessions.restore", {"sessionId": "shown"})  # not in the trash: changes nothing
            assert await _inbox(c) == {"all": [], "unread": 0}
            proc.kill9()
