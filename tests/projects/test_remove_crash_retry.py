"""``projects.remove`` SIGKILLed at any step, then retried with the same ``submissionId``.

The removal deletes each of the project's sessions through its actor (marker, rows, files), then
the project row and its memory with the receipt. A host killed part way used to leave the finished
sessions out of the retry's answer (``deletedSessions: []`` after the last one): the retry only saw
what was left. The removal now records its sessions and receipt durably before the first one goes
(``store/projects.py``, the removal intent), so the retry answers exactly what a crash-free run
answers, and everything is removed once.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.dbkit import rows as _rows
from tests.hostkit import call_killed_at, client_for, index_caught_up, inprocess_host, msg

Vars = dict[str, Any]
CLIENT = "ui-rm"

# (fault point, hit): one per step of the removal. A session's delete in its actor commits as session.delete
# does (``session.delete.before_commit`` / ``.after_commit``); three sessions hit each point 3 times.
POINTS = [
    ("projects.remove.intent.after_rename", 1),  # the removal's record is durable, nothing deleted yet
    ("delete.after_marker", 1),  # the first session's marker: boot finishes that delete
    ("session.delete.before_commit", 2),  # the second session's rows, uncommitted
    ("session.delete.after_commit", 2),  # the second session's rows committed, its files not yet removed
    ("delete.before_files", 3),
    ("delete.after_marker", 3),
    ("projects.remove.before_commit", 1),  # every session gone, the project row and receipt not committed
    ("projects.remove.after_commit", 1),  # committed, not yet answered
]


async def _setup(root: Path) -> Vars:
    """Three sessions (messages, an archived revision, an attachment reference) in project ``ws`` with
    memory, and one session in project ``other`` with memory: made by a host that then stops."""
    ws, other = root.parent / "ws", root.parent / "other"
    ws.mkdir()
    other.mkdir()
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
        sids = []
        for i in range(3):
            sid = (await c.call("session.create", {"title": f"s{i}", "projectPath": str(ws)}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "hello")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "hi", role="assistant")})
            await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            sids.append(sid)
        kept = (await c.call("session.create", {"title": "kept", "projectPath": str(other)}))["id"]
        await c.call("session.appendMessage", {"sessionId": kept, "message": msg("k1", "stay")})
        blob = await c.call("attachments.put", {"name": "a.txt", "mimeType": "text/plain",
                                                "dataBase64": base64.b64encode(b"attached").decode()})
        await c.call("attachments.ref", {"sha256": blob["sha256"], "sessionId": sids[0]})
        await c.call("settings.set", {"ns": "projectMemory", "key": str(ws), "value": "remember me"})
        await c.call("settings.set", {"ns": "projectMemory", "key": str(other), "value": "other memory"})
        pid = {p["path"]: p["id"] for p in (await c.call("projects.list", {}))["projects"]}[str(ws)]
        await index_caught_up(host)
    assert all((root / "sessions" / f"{sid}.revisions.jsonl").exists() for sid in sids)
    return {"sids": sorted(sids), "kept": kept, "pid": pid, "ws": str(ws), "other": str(other)}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Vars]:
    """The state, made once and copied per case (the rows name ``ws`` by its path: never changed)."""
    root = tmp_path_factory.mktemp("projects-remove") / "data"
    return root, trio.run(_setup, root)


def _copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)


def _expected(v: Vars) -> dict[str, Any]:
    """What a crash-free ``projects.remove`` answers (tests/projects/test_projects.py checks it too)."""
    return {"projectId": v["pid"], "path": v["ws"], "deletedSessions": v["sids"]}


async def _killed_during_remove(root: Path, point: str, nth: int, params: dict[str, Any],
                                client_id: str = CLIENT) -> None:
    await call_killed_at(root, point, "projects.remove", params, nth=nth, client_id=client_id)


async def _assert_removed_once(c: HostClient, root: Path, v: Vars) -> None:
    """Every session of the project gone (rows, transcript, revisions, marker), the kept one whole; the
    project row and its memory gone, the other project's kept; nothing of the removal left behind."""
    assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [v["kept"]]
    for sid in v["sids"]:
        with pytest.raises(RpcError) as err:
            await c.call("session.get", {"sessionId": sid})
        assert err.value.data_code == "SESSION_NOT_FOUND"
        for suffix in (".jsonl", ".revisions.jsonl", ".deleting"):
            assert not (root / "sessions" / f"{sid}{suffix}").exists(), f"{sid}{suffix} survived"
    kept = await c.call("session.get", {"sessionId": v["kept"], "full": True})
    assert [m["id"] for m in kept["messages"]] == ["k1"]
    assert [p["path"] for p in (await c.call("projects.list", {}))["projects"]] == [v["other"]]
    assert "value" not in (await c.call("settings.get", {"ns": "projectMemory", "key": v["ws"]}))
    other = (await c.call("settings.get", {"ns": "projectMemory", "key": v["other"]}))["value"]
    assert other["content"] == "other memory"
    assert _rows(root, "SELECT id FROM sessions") == [(v["kept"],)]
    assert _rows(root, "SELECT DISTINCT session_id FROM messages") == [(v["kept"],)]


@pytest.mark.parametrize(("point", "nth"), POINTS)
async def test_a_removal_killed_at_any_step_is_answered_on_retry_as_without_the_crash(
        tmp_path: Path, prepared: tuple[Path, Vars], point: str, nth: int) -> None:
    src, v = prepared
    root = tmp_path / "data"
    _copy(src, root)
    params = {"projectId": v["pid"], "submissionId": "rm-1"}
    await _killed_during_remove(root, point, nth, params)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
            first = await c.call("projects.remove", params)
            assert first == _expected(v), f"killed at {point}:{nth}: the retry's answer is not the crash-free one"
            assert await c.call("projects.remove", params) == first
            await index_caught_up(host)
            await _assert_removed_once(c, root, v)
    stored = _rows(root, "SELECT response_json FROM command_receipts WHERE client_id = ? AND submission_id = ?",
                   CLIENT, "rm-1")
    assert len(stored) == 1
    # a crash right after the commit left it: boot removed it (its project row is gone)
    assert list((root / "sessions").glob("project-*")) == [], "the removal's record outlived it"


async def test_a_crash_free_removal_answers_every_session(tmp_path: Path, prepared: tuple[Path, Vars]) -> None:
    src, v = prepared
    root = tmp_path / "data"
    _copy(src, root)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
            out = await c.call("projects.remove", {"projectId": v["pid"], "submissionId": "rm-1"})
            assert out == _expected(v)
            await index_caught_up(host)
            await _assert_removed_once(c, root, v)
    assert list((root / "sessions").glob("project-*")) == []


async def test_a_removal_another_call_finished_is_answered_to_both(
        tmp_path: Path, prepared: tuple[Path, Vars]) -> None:
    """Killed after the first session went; then another client (another key) removes the project before
    the first retries. Both get the whole removal's answer: the first from the receipt the second's last
    transaction stored for it, not ``NOT_FOUND``."""
    src, v = prepared
    root = tmp_path / "data"
    _copy(src, root)
    params = {"projectId": v["pid"], "submissionId": "rm-1"}
    await _killed_during_remove(root, "delete.after_marker", 2, params)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "ui-other", "ui") as other:
            out = await other.call("projects.remove", {"projectId": v["pid"], "submissionId": "rm-2"})
            assert out == _expected(v)
            async with client_for(host, CLIENT, "ui") as c:
                assert await c.call("projects.remove", params) == out
                await index_caught_up(host)
                await _assert_removed_once(c, root, v)


async def test_a_record_left_by_a_finished_removal_never_answers_for_a_new_project_row(tmp_path: Path) -> None:
    """Killed right after the commit, the removal's record stays behind. The project's path opened again
    gets a new row (with a new id: a removed project's id is never issued again, where SQLite would reuse
    the highest one); removing that one answers only its own session, not the sessions of the row removed
    before, and the old id names nothing."""
    root = tmp_path / "data"
    ws = tmp_path / "ws"
    ws.mkdir()
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
        old = sorted([(await c.call("session.create", {"title": f"s{i}", "projectPath": str(ws)}))["id"]
                      for i in range(2)])
        pid = (await c.call("projects.list", {}))["projects"][0]["id"]
        await index_caught_up(host)
    params = {"projectId": pid, "submissionId": "rm-1"}
    await _killed_during_remove(root, "projects.remove.after_commit", 1, params)
    assert list((root / "sessions").glob("project-*")), "the kill did not leave the record behind"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
            assert list((root / "sessions").glob("project-*")) == []  # boot removed it: its row is gone
            assert (await c.call("host.status"))["boot"]["projectRemovalsSwept"] == 1
            assert (await c.call("projects.remove", params))["deletedSessions"] == old
            new = (await c.call("session.create", {"title": "again", "projectPath": str(ws)}))["id"]
            again = (await c.call("projects.list", {}))["projects"]
            assert [p["id"] for p in again] == [pid + 1]  # a new row, a new id
            with pytest.raises(RpcError) as gone:
                await c.call("projects.pin", {"projectId": pid, "pinned": True})
            assert gone.value.data_code == "NOT_FOUND"
            out = await c.call("projects.remove", {"projectId": pid + 1, "submissionId": "rm-2"})
            assert out == {"projectId": pid + 1, "path": str(ws), "deletedSessions": [new]}
    assert list((root / "sessions").glob("project-*")) == []
