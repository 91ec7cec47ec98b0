"""The answer a keyed session change carries in its transcript line (``extra.response``) is computed before
the line is written, by a dry run in the DB writer: it must count what the session acknowledged before it
even while those appends' index rows are still held (the index lag), so it is the answer the commit gives
and the one every retry gets (``SessionContext.append_info``, ``revisions.commit_rewrite``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store.jsonio import loads_line
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.revisions.helpers import transcript_path


def _carried(root: Path, sid: str, submission: str) -> Any:
    """The answer the receipt of ``submission`` carries in ``sid``'s transcript (a line or the header)."""
    for raw in transcript_path(root, sid).read_bytes().splitlines():
        rec = loads_line(raw)
        receipt = rec.get("receipt")
        if isinstance(receipt, dict) and receipt.get("submissionId") == submission:
            return receipt["extra"]["response"]
    raise AssertionError(f"no receipt {submission} in {sid}")


async def test_a_keyed_change_answers_with_the_appends_whose_index_rows_are_held(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root, index_hold=3600.0) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            await index_caught_up(host)
            got: dict[str, Any] = {}
            for n in range(3):  # held: acknowledged, their index rows not committed
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"u{n}", f"q{n}")})
            log = host.services.index_log
            assert log.acknowledged - log.covered_seq == 3  # the three appends' rows are held
            got["rename"] = await c.call("session.rename", {"sessionId": "s1", "title": "renamed",
                                                            "submissionId": "k-rename"})
            assert got["rename"] == (await c.call("session.get", {"sessionId": "s1"}))["session"]  # its commit's
            for n in range(3, 5):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"u{n}", f"q{n}")})
            assert log.acknowledged - log.covered_seq == 2
            got["metadata"] = await c.call("session.updateMetadata", {"sessionId": "s1", "tags": ["a"],
                                                                      "submissionId": "k-meta"})
            assert got["metadata"] == (await c.call("session.get", {"sessionId": "s1"}))["session"]
            carried = {"rename": _carried(root, "s1", "k-rename"), "metadata": _carried(root, "s1", "k-meta")}
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u5", "q5")})
            assert log.acknowledged - log.covered_seq == 1
            got["truncate"] = await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "u4",
                                                                     "submissionId": "k-cut"})
            now = (await c.call("session.get", {"sessionId": "s1"}))["session"]
    assert got["rename"]["messageCount"] == 3 and got["rename"]["title"] == "renamed"
    assert got["metadata"]["messageCount"] == 5 and got["metadata"]["thread"]["tags"] == ["a"]
    assert got["truncate"]["session"]["messageCount"] == 4 and got["truncate"]["removed"] == 2
    assert got["truncate"]["session"] == now
    assert carried == {"rename": got["rename"], "metadata": got["metadata"]}
    assert _carried(root, "s1", "k-cut") == got["truncate"]  # in the rewritten header


async def test_a_keyed_change_after_a_failed_index_op_answers_with_the_lines_it_left_out(tmp_path: Path) -> None:
    """An append whose index op failed (the disk full) is acknowledged; its rows come back by a repair, or
    by the next commit of the session, which indexes the bytes the index misses first. The answer computed
    before the next keyed change's line must count it too, as that commit will."""
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m1", "first")})
            await index_caught_up(host)
            faults = host.faults
            faults.add("index.before_commit", faults.hits("index.before_commit") + 1, "enospc")
            assert (await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m2", "second")})
                    )["message"]["seq"] == 2
            renamed = await c.call("session.rename", {"sessionId": "s1", "title": "renamed", "submissionId": "k-1"})
            now = (await c.call("session.get", {"sessionId": "s1"}))["session"]
    assert renamed["messageCount"] == 2 and renamed == now
    assert _carried(root, "s1", "k-1") == renamed


@pytest.mark.parametrize("change", ["create", "create-in-existing", "update"])
async def test_a_keyed_change_that_failed_leaves_the_projects_as_they_were(tmp_path: Path, change: str) -> None:
    """The dry run of a keyed create or ``session.update`` naming a project used to insert that project's row
    for good (so that the id its answer names is the commit's), before the file write that can still fail: a
    create refused with STORAGE_FULL left a project with no session in ``projects.list`` (and moved an
    existing one's ``lastOpenedAt``). A failed command changes nothing; its retry makes the project once, with
    the id its answer names."""
    root = tmp_path / "data"
    new, old = str(tmp_path / "new"), str(tmp_path / "old")
    params: dict[str, Any] = {
        "create": {"sessionId": "s1", "title": "t", "projectPath": new},
        "create-in-existing": {"sessionId": "s1", "title": "t", "projectPath": old},
        "update": {"sessionId": "s0", "projectPath": new},
    }[change]
    method = "session.update" if change == "update" else "session.create"
    point = "append.before_write" if change == "update" else "create.after_tmp_write"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "s0", "title": "t", "projectPath": old})
            before = (await c.call("projects.list", {}))["projects"]
            await trio.sleep(0.002)  # a later millisecond: a moved lastOpenedAt would show
            host.faults.add(point, host.faults.hits(point) + 1, "enospc")
            with pytest.raises(RpcError) as failed:
                await c.call(method, {**params, "submissionId": "k-1"})
            assert failed.value.data_code == "STORAGE_FULL"
            after_failure = (await c.call("projects.list", {}))["projects"]
            answer = await c.call(method, {**params, "submissionId": "k-1"})
            listed = (await c.call("projects.list", {}))["projects"]
            sid = params["sessionId"]
            assert answer == (await c.call("session.get", {"sessionId": sid}))["session"]
    assert after_failure == before
    path = params["projectPath"]
    (project,) = [p for p in listed if p["path"] == path]
    assert answer["projectId"] == project["id"]
    if change == "create-in-existing":
        assert len(listed) == 1 and project["sessionCount"] == 2
    else:
        assert len(listed) == 2 and project["sessionCount"] == 1 and project["id"] == 2
