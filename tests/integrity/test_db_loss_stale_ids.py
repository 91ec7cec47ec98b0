"""A retry after a lost or corrupt ``pi.sqlite`` never acts on the wrong thing (ARCHITECTURE "Authoritative and
derived writes"): a project id issued before the loss names no other project afterwards, and a session the
user deleted before the loss stays deleted.

Black-box, on a real host process, as ``test_db_loss_receipts.py``: the data directory is built through the
wire, the host stopped, the database removed (with its ``-wal``/``-shm``) or its header overwritten, the host
started again, the client's calls retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import call_killed_at, msg
from tests.integrity.test_db_loss_receipts import _damage, _on_host


async def _error(call: Any) -> str:
    with pytest.raises(RpcError) as exc:
        await call
    return str(exc.value.data_code)


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_project_id_issued_before_the_loss_names_no_other_project_after_it(
        tmp_path: Path, how: str) -> None:
    """The rebuilt index numbered the projects again, in the order of their sessions' ids (alpha kept 1,
    beta's 2 went to another): the retried pin pinned another, a retried remove deleted its sessions."""
    data = tmp_path / "data"
    alpha, beta, another = (tmp_path / name for name in ("alpha", "beta", "another"))
    ids: dict[str, int] = {}

    async def build(c: HostClient) -> None:
        for sid, path in (("s-a", alpha), ("s-c", beta), ("s-b", another)):
            made = await c.call("session.create", {"sessionId": sid, "title": sid, "projectPath": str(path)})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-m1", "hello")})
            ids[path.name] = int(made["projectId"])

    async def retry(c: HostClient) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pin": await _error(c.call("projects.pin", {"projectId": ids["beta"], "pinned": True,
                                                         "submissionId": "pin-beta"})),
            "remove": await _error(c.call("projects.remove", {"projectId": ids["beta"],
                                                               "submissionId": "rm-beta"})),
        }
        out["projects"] = {p["path"]: p for p in (await c.call("projects.list", {}))["projects"]}
        out["sessions"] = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        return out

    with trio.fail_after(60):
        await _on_host(data, build)
        assert ids == {"alpha": 1, "beta": 2, "another": 3}
        _damage(data, how)
        got = await _on_host(data, retry)
    assert got["pin"] == "NOT_FOUND" and got["remove"] == "NOT_FOUND"
    assert not any(p["pinned"] for p in got["projects"].values())
    assert got["sessions"] == ["s-a", "s-b", "s-c"]
    before = set(ids.values())
    assert sorted(got["projects"]) == sorted(str(p) for p in (alpha, beta, another))
    assert not before & {p["id"] for p in got["projects"].values()}  # no id of the lost database comes back


def _s1_requests() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The keyed create, append and delete of session s1 the deleted-session tests make and retry."""
    return ({"sessionId": "s1", "title": "t", "submissionId": "k-create"},
            {"sessionId": "s1", "message": msg("u1", "question"), "submissionId": "k-append"},
            {"sessionId": "s1", "submissionId": "k-delete"})


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_session_deleted_before_the_loss_is_not_created_again_by_a_retry(tmp_path: Path, how: str) -> None:
    """``known_sessions`` lived in the database only: the retried create made the deleted session again
    and the retried append landed in it."""
    data = tmp_path / "data"
    create, append, delete = _s1_requests()
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        first["create"] = await c.call("session.create", create)
        await c.call("session.appendMessage", append)
        first["delete"] = await c.call("session.delete", delete)
        # what a retry answers while the database is whole
        first["appendRetry"] = await c.call("session.appendMessage", append)
        assert await c.call("session.create", create) == first["create"]

    async def retry(c: HostClient) -> dict[str, Any]:
        return {"create": await c.call("session.create", create),
                "append": await _error(c.call("session.appendMessage", append)),
                "delete": await c.call("session.delete", delete),
                "fresh": await _error(c.call("session.appendMessage", {**append, "submissionId": "k-other"})),
                "sessions": (await c.call("session.list", {}))["sessions"]}

    with trio.fail_after(60):
        await _on_host(data, build)
        _damage(data, how)
        got = await _on_host(data, retry)
    assert got["create"] == first["create"]  # answered from the create's receipt, nothing created
    assert got["delete"] == first["delete"]
    assert got["append"] == got["fresh"] == "SESSION_NOT_FOUND"  # the append's receipt went with its line
    assert got["sessions"] == []
    assert not (data / "sessions" / "s1.jsonl").exists()


@pytest.mark.parametrize("point", ["delete.before_files", "session_delete.after_log"])
async def test_a_delete_killed_before_its_files_went_stays_done_when_the_database_is_lost_too(
        tmp_path: Path, point: str) -> None:
    """Killed after the rows went (before the log line, or after it and before any file went), then the
    database lost: the marker finishes the delete at boot, and the log keeps the id deleted."""
    data = tmp_path / "data"
    create, append, delete = _s1_requests()
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        first["create"] = await c.call("session.create", create)
        await c.call("session.appendMessage", append)

    async def retry(c: HostClient) -> dict[str, Any]:
        return {"delete": await c.call("session.delete", delete),
                "create": await c.call("session.create", create),
                "append": await _error(c.call("session.appendMessage", append)),
                "sessions": (await c.call("session.list", {}))["sessions"]}

    with trio.fail_after(90):
        await _on_host(data, build)
        await call_killed_at(data, point, "session.delete", delete, client_id="ui-1")
        assert (data / "sessions" / "s1.deleting").exists() and (data / "sessions" / "s1.jsonl").exists()
        _damage(data, "deleted")
        got = await _on_host(data, retry)
    assert got["delete"] == {"sessionId": "s1", "deleted": True}
    assert got["create"] == first["create"] and got["append"] == "SESSION_NOT_FOUND" and got["sessions"] == []
    assert sorted(p.name for p in (data / "sessions").iterdir()) == ["deleted-sessions.log"]


def _child_of(method: str, answer: dict[str, Any]) -> str:
    return str(answer["id"] if method == "session.fork" else answer["session"]["id"])


@pytest.mark.parametrize("method", ["session.fork", "session.assistantEdit"])
async def test_a_fork_deleted_before_the_loss_is_not_made_again_by_a_retry(tmp_path: Path, method: str) -> None:
    """The fork's (and the assistant edit's) receipt row lives under the parent, the session it was asked
    of: the child's delete did not carry it into the deleted-sessions log, and after the loss the retried
    fork made the child again under its derived id (it came back into session.list)."""
    data = tmp_path / "data"
    params: dict[str, Any] = {"sessionId": "s1", "submissionId": "k-child"}
    if method == "session.assistantEdit":
        params |= {"messageId": "a1", "blocks": [{"type": "text", "text": "edited"}]}
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        for m in (msg("u1", "question"), msg("a1", "answer", role="assistant")):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": m})
        made = await c.call(method, params)
        await c.call("session.delete", {"sessionId": _child_of(method, made), "submissionId": "k-del"})
        first["retry"] = await c.call(method, params)  # what a retry answers while the database is whole

    async def retry(c: HostClient) -> dict[str, Any]:
        return {"retry": await c.call(method, params),
                "sessions": sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])}

    with trio.fail_after(60):
        await _on_host(data, build)
        _damage(data, "deleted")
        got = await _on_host(data, retry)
    assert got["sessions"] == ["s1"]
    assert got["retry"] == first["retry"]  # answered from the receipt the log carried, nothing made
    assert not (data / "sessions" / f"{_child_of(method, first['retry'])}.jsonl").exists()
