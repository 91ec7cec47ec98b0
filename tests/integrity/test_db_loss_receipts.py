"""A lost or corrupt ``pi.sqlite`` loses nothing the files hold: keyed writes whose effect is in a file are
answered from the rebuilt index, and a retry adds nothing (ARCHITECTURE "Receipts ride with their effect").

Black-box, on a real host process: the data directory is built through the wire, the host stopped, the
database removed (with its ``-wal``/``-shm``) or its header overwritten, the host started again.
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from protocol.models import SessionSummary
from runtime.client import HostClient, RpcError, open_client
from store.ids import derived_id
from store.transcripts.rewrite import CARRIED_RECEIPTS
from tests.hostkit import call_killed_at, msg, start_host_process
from tests.imports.test_crash_retry import SOURCE as CLAUDE_CODE
from tests.plugin_imports.test_plugin_imports_rpc import IMPORT as PLUGIN_IMPORT
from tests.revisions.helpers import revisions_path, transcript_path


async def _on_host(root: Path, work: Any, *, sidecar: bool = False) -> Any:
    """``work(ui)`` on a host process on ``root``; ``sidecar``: ``work(ui, agent)``, with an agent client too."""
    proc = await trio.to_thread.run_sync(start_host_process, root)
    try:
        async with open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as c:
            if not sidecar:
                return await work(c)
            async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as sc:
                return await work(c, sc)
    finally:
        assert await trio.to_thread.run_sync(proc.terminate) == 0


async def deliver_and_run(c: HostClient, params: dict[str, Any]) -> Any:
    """``collab.deliver`` to ``tgt``, then its turn ``t1`` begins it and completes: the first answer."""
    first = await c.call("collab.deliver", params)
    did = first["delivery"]["id"]
    await c.call("session.startTurn", {"sessionId": "tgt", "turnId": "t1"})
    await c.call("collab.begin", {"sessionId": "tgt", "deliveryId": did, "turnId": "t1"})
    await c.call("session.endTurn", {"sessionId": "tgt", "turnId": "t1", "status": "completed"})
    return first


def _damage(root: Path, how: str) -> None:
    if how == "deleted":
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (root / name).unlink(missing_ok=True)
    else:
        with open(root / "pi.sqlite", "r+b") as fh:
            fh.write(b"not an SQLite header, garbage!!" * 8)


Append = Callable[[dict[str, Any], str], Awaitable[None]]


async def _retried_after_damage(root: Path, sid: str, how: str,
                                script: Callable[[HostClient, Append], Awaitable[None]]) -> list[Any]:
    """Run ``script`` on a host (its ``append(message, key)`` sends a keyed append to ``sid``), damage the
    database as ``how`` says, then retry every keyed append on a new host: the retries' answers, after
    checking that each equals its first answer and that neither the transcript nor the revisions file moved."""
    keyed: list[tuple[dict[str, Any], Any]] = []

    async def build(c: HostClient) -> None:
        async def append(m: dict[str, Any], key: str) -> None:
            params = {"sessionId": sid, "message": m, "submissionId": key}
            keyed.append((params, await c.call("session.appendMessage", params)))

        await c.call("session.create", {"sessionId": sid, "title": "t"})
        await script(c, append)

    async def retry(c: HostClient) -> list[Any]:
        return [await c.call("session.appendMessage", params) for params, _ in keyed]

    with trio.fail_after(60):
        await _on_host(root, build)
        files = (transcript_path(root, sid).read_bytes(), revisions_path(root, sid).read_bytes())
        _damage(root, how)
        answers = await _on_host(root, retry)
    assert answers == [answer for _, answer in keyed]
    assert (transcript_path(root, sid).read_bytes(), revisions_path(root, sid).read_bytes()) == files
    return answers


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_append_archived_by_a_regenerate_is_answered_not_written_again(
        tmp_path: Path, how: str) -> None:
    """An append's receipt rides in its line; a regenerate and a branch switch move that line into the
    revisions file. The rebuilt index used to restore receipts from live lines only: the retry of the
    regenerated reply's append then wrote it again, at the end of the transcript (a duplicate, behind
    the branch the user had switched back to)."""
    sid = "s1"

    async def script(c: HostClient, append: Append) -> None:
        await append(msg("u1", "question"), "k-u1")
        await append(msg("a1", "first answer", role="assistant"), "k-a1")
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
        await append(msg("a1r", "second answer", role="assistant"), "k-a1r")
        await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
        await append(msg("u2", "after the switch"), "k-u2")

    answers = await _retried_after_damage(tmp_path, sid, how, script)
    assert [got["message"]["seq"] for got in answers] == [1, 2, 2, 3]  # a1r stood where a1 stands again


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_append_whose_branch_has_no_live_place_is_answered_not_written_again(
        tmp_path: Path, how: str) -> None:
    """An edit archives the user's message with its branch; a later truncate cuts the edited message too,
    so no live message continues that family. The rebuilt index placed an archived line's receipt at its
    family's live place, and skipped a branch without one: the retry of the first prompt's append then
    wrote it again at the end of the transcript (found by tests/history/test_history_property_reads.py)."""
    sid = "s1"

    async def script(c: HostClient, append: Append) -> None:
        await append(msg("u0", "hello"), "k-u0")
        await append(msg("u1", "question"), "k-u1")
        await append(msg("a1", "answer", role="assistant"), "k-a1")
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
        await c.call("session.appendMessage",  # cut below without an archive: its line (and receipt) is gone
                     {"sessionId": sid, "message": msg("e1", "question, edited", meta={"revisionRootId": "u1"})})
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "e1"})
        await append(msg("u2", "something else"), "k-u2")

    answers = await _retried_after_damage(tmp_path, sid, how, script)
    assert [got["message"]["seq"] for got in answers] == [1, 2, 3, 2]


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_create_or_fork_is_answered_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """A create's and a fork's receipt ride in the new transcript's header. The rebuilt index answered their
    retries with the session's summary as it is now (renamed since, messages added, cut by a rewrite that
    carried the receipt forward), not with the answer the first call got (seed 000 §2.4). More keyed changes
    than a rewritten header carries (``CARRIED_RECEIPTS``) came in between: the birth receipt is never dropped
    (a retry answered CONFLICT, "already exists", once 64 receipts of renames had pushed it out)."""
    create = {"sessionId": "s1", "title": "first", "projectPath": str(tmp_path / "proj"), "mode": "plan",
              "submissionId": "k-create"}
    fork = {"sessionId": "s1", "title": "the fork", "submissionId": "k-fork"}
    child = derived_id("fork", "ui-1", "k-fork")
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        first["create"] = await c.call("session.create", create)
        for n in (1, 2):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"u{n}", f"question {n}")})
        first["fork"] = await c.call("session.fork", fork)
        for sid in ("s1", child):
            # more keyed changes than a rewritten header carries: the birth receipt stays beside the newest
            for n in range(CARRIED_RECEIPTS + 1):
                await c.call("session.rename", {"sessionId": sid, "title": f"renamed {sid} {n}",
                                                "submissionId": f"k-rename-{sid}-{n}"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-u3", "later")})
        # a rewrite: the create's and the fork's receipts move to the new headers' carried receipts
        await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "u2"})
        await c.call("session.truncateFrom", {"sessionId": child, "messageId": f"{child}-u3"})
        assert await c.call("session.create", create) == first["create"]  # the database whole: its row answers
        assert await c.call("session.fork", fork) == first["fork"]

    async def retry(c: HostClient) -> dict[str, Any]:
        return {"create": await c.call("session.create", create), "fork": await c.call("session.fork", fork),
                "sessions": sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])}

    with trio.fail_after(60):
        await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert first["fork"]["id"] == child and first["fork"]["messageCount"] == 2
    assert got["create"] == first["create"]
    assert got["fork"] == first["fork"]
    for answer in (got["create"], got["fork"]):
        SessionSummary.model_validate(answer)
    assert got["sessions"] == sorted(["s1", child])  # nothing created again


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_session_change_is_answered_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """The keyed changes whose receipt rides in a transcript line (a ``session_info`` line, a rewritten
    header, an assistant edit's child header): the rebuilt index answered their retries with the session as
    it is at the retry (renamed, grown, changed again since), not with the answer the first call got
    (seed 000 §2.4). Each session below gets one keyed change, then a change that would alter its answer. A
    rewrite kept only the newest ``session_info`` line: the receipt of an earlier one was lost with the
    database, and its retry renamed the session again. A keyed ``activateRevision`` of the branch already live
    writes nothing (protocol/README §4): its retry after the loss answers the session as it is then."""
    edit_child = derived_id("assistantEdit", "ui-1", "k-edit")
    keyed: dict[str, tuple[str, dict[str, Any]]] = {
        "rename": ("session.rename", {"sessionId": "r", "title": "the first title"}),
        "update": ("session.update", {"sessionId": "u", "modelId": "model-a", "thinkingLevel": "high"}),
        "metadata": ("session.updateMetadata", {"sessionId": "m", "tags": ["first"], "folder": "f1"}),
        "trash": ("sessions.trash", {"sessionId": "t"}),
        "restore": ("sessions.restore", {"sessionId": "t"}),
        "truncate": ("session.truncateFrom", {"sessionId": "x", "messageId": "x-u1"}),
        "replace": ("session.replaceMessages", {"sessionId": "p", "messages": [msg("p-u0", "q0")]}),
        "activate": ("session.activateRevision", {"sessionId": "v", "rootUserId": "v-u1", "revisionIndex": 1}),
        # the branch already live: nothing to rewrite and nothing written, its receipt a database row only
        "activate-live": ("session.activateRevision", {"sessionId": "v", "rootUserId": "v-u1", "revisionIndex": 1}),
        "edit": ("session.assistantEdit", {"sessionId": "e", "messageId": "e-a1", "title": "edited",
                                           "blocks": [{"type": "text", "text": "r1, edited"}]}),
        # its line then dropped by a rewrite (which keeps the newest session_info line only)
        "rename-then-cut": ("session.rename", {"sessionId": "w", "title": "before the cut"}),
    }
    for name, (_, params) in keyed.items():
        params["submissionId"] = f"k-{name}"
    first: dict[str, Any] = {}

    async def send(c: HostClient, name: str) -> None:
        method, params = keyed[name]
        first[name] = await c.call(method, params)

    async def later(c: HostClient, sid: str, n: int = 0) -> None:
        await c.call("session.rename", {"sessionId": sid, "title": f"renamed since {n}"})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-later-{n}", "later")})

    async def build(c: HostClient) -> None:
        for sid in "rumtxpvew":
            await c.call("session.create", {"sessionId": sid, "title": f"session {sid}"})
            for n in (0, 1):
                for m in (msg(f"{sid}-u{n}", f"q{n}"), msg(f"{sid}-a{n}", f"r{n}", role="assistant")):
                    await c.call("session.appendMessage", {"sessionId": sid, "message": m})
        await send(c, "rename")
        await send(c, "update")
        await c.call("session.update", {"sessionId": "u", "modelId": "model-b", "thinkingLevel": "low"})
        await send(c, "metadata")
        await c.call("session.updateMetadata", {"sessionId": "m", "tags": ["second"], "folder": "f2"})
        await send(c, "trash")
        await send(c, "restore")
        await send(c, "truncate")
        await send(c, "replace")
        await c.call("session.truncateFrom", {"sessionId": "v", "messageId": "v-a1", "mode": "regenerate"})
        await c.call("session.appendMessage", {"sessionId": "v", "message": msg("v-a1r", "again", role="assistant")})
        await send(c, "activate")
        await send(c, "activate-live")
        await send(c, "edit")
        await send(c, "rename-then-cut")
        await c.call("session.rename", {"sessionId": "w", "title": "renamed before the cut"})
        await c.call("session.truncateFrom", {"sessionId": "w", "messageId": "w-u1"})
        for sid in ("r", "u", "m", "t", "x", "p", "v", "e", "w", edit_child):
            await later(c, sid)
        for name, (method, params) in keyed.items():  # the database whole: the receipt rows answer
            assert await c.call(method, params) == first[name], name

    async def retry(c: HostClient) -> dict[str, Any]:
        got = {name: await c.call(method, params) for name, (method, params) in keyed.items()}
        got["sessions"] = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        got["v-now"] = await c.call("session.activateRevision", {"sessionId": "v", "rootUserId": "v-u1",
                                                                 "revisionIndex": 1})
        return got

    sessions = sorted([*"rumtxpvew", edit_child])
    with trio.fail_after(90):
        await _on_host(tmp_path, build)
        files = {sid: transcript_path(tmp_path, sid).read_bytes() for sid in sessions}
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert first["truncate"]["removed"] == 2 and first["trash"]["session"]["deletedAt"] is not None
    assert first["activate-live"] == first["activate"]
    # a call that changed nothing wrote nothing for its receipt to ride in (as sessions.trash / restore that
    # find the session in the state they ask for): after the loss its retry answers the session as it is
    assert got["activate-live"] == got["v-now"] != first["activate-live"]
    assert [name for name in keyed if got[name] != first[name]] == ["activate-live"]  # which answered otherwise
    assert {name: got[name] for name in keyed if name != "activate-live"} == {
        name: answer for name, answer in first.items() if name != "activate-live"}
    for name, (method, _) in keyed.items():
        METHODS[method].result_model.model_validate(got[name])
    assert got["sessions"] == sessions  # nothing made again
    assert {sid: transcript_path(tmp_path, sid).read_bytes() for sid in sessions} == files  # nor written again


_ASSET = [{"path": "README.md", "mediaType": "text/markdown", "dataBase64": "IyBoaQo="}]


async def _plugin_acme(c: HostClient) -> None:
    await c.call("plugins.register", {"pluginId": "acme", "name": "acme", "version": "1", "assets": _ASSET})
    await c.call("settings.update", {"ns": "plugin:acme", "values": {"a": 1, "b": 2}})


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_uninstall_is_answered_as_the_first_time_after_the_loss(tmp_path: Path, how: str) -> None:
    """An uninstall's effect is in files (the registry entry, the assets) and in the database (the plugin's
    settings, its providers); its receipt was a database row only, and its intent went with the commit. After
    the loss its retry uninstalled again what was registered since (a second effect) and answered
    ``registryEntryRemoved: false`` without the settings it removed. A keyed call with nothing to remove
    (``ghost``) answers the same too."""
    calls = {"acme": {"pluginId": "acme", "submissionId": "k-un"},
             "ghost": {"pluginId": "ghost", "submissionId": "k-gh"}}
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        await _plugin_acme(c)
        for name, params in calls.items():
            first[name] = await c.call("plugins.uninstall", params)
        await c.call("plugins.register", {"pluginId": "acme", "name": "acme", "version": "2"})  # again, since

    async def retry(c: HostClient) -> dict[str, Any]:
        got = {name: await c.call("plugins.uninstall", params) for name, params in calls.items()}
        got["plugins"] = [(p["id"], p["version"]) for p in (await c.call("plugins.list", {}))["plugins"]]
        return got

    with trio.fail_after(60):
        await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert first["acme"] == {"pluginId": "acme", "registryEntryRemoved": True, "assetsRemoved": True,
                             "settingsRemoved": ["a", "b"], "providersReleased": []}
    assert {name: got[name] for name in calls} == first
    assert got["plugins"] == [("acme", "2")]  # not uninstalled again


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_an_uninstall_intent_left_over_after_the_loss_is_finished_once_by_its_retry(
        tmp_path: Path, how: str) -> None:
    """Killed right after its commit, the uninstall's intent stays; boot removes it once every receipt it
    names is stored, but the lost database stores none: it stays, and the retry finishes the uninstall (the
    files are gone, the rebuilt database holds nothing of the plugin). That retry answered
    ``settingsRemoved: []``: the settings the uninstall removed went with the database. The intent carries
    the answer now, as a crash-free run gives it."""
    params = {"pluginId": "acme", "submissionId": "k-un"}
    await _on_host(tmp_path, _plugin_acme)
    await call_killed_at(tmp_path, "plugins.uninstall.after_commit", "plugins.uninstall", params, client_id="ui-1")
    _damage(tmp_path, how)
    intents = sorted(p.name for p in (tmp_path / "plugins").glob("*.intent"))

    async def retry(c: HostClient) -> list[Any]:
        left = sorted(p.name for p in (tmp_path / "plugins").glob("*.intent"))  # after boot
        return [left, await c.call("plugins.uninstall", params), await c.call("plugins.uninstall", params),
                (await c.call("plugins.list", {}))["plugins"],
                (await c.call("plugins.listAssets", {"pluginId": "acme"}))["assets"]]

    with trio.fail_after(60):
        left, answer, again, plugins, assets = await _on_host(tmp_path, retry)
    assert intents == left == [f"uninstall-{b'acme'.hex()}.intent"]  # boot cannot tell it finished
    assert answer == again == {"pluginId": "acme", "registryEntryRemoved": True, "assetsRemoved": True,
                               "settingsRemoved": ["a", "b"], "providersReleased": []}
    assert plugins == [] and assets == []
    assert sorted(p.name for p in (tmp_path / "plugins").glob("*.intent")) == []


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_answer_of_a_request_is_answered_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """``approvals.respond`` and ``interactions.respond`` write the decision line (with the call's receipt)
    before the rows. The request itself is a database row: after the loss there is none, and the retry
    answered NOT_FOUND although the decision stands in the transcript. The line carries the answer now."""
    first: dict[str, Any] = {}
    keyed: dict[str, tuple[str, dict[str, Any]]] = {}

    async def build(c: HostClient, sc: HostClient) -> None:
        await sc.call("session.create", {"sessionId": "s1", "title": "t"})
        await sc.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        asked = await sc.call("approvals.request", {"sessionId": "s1", "turnId": "t1", "tool": "Read",
                                                    "risk": "low"})
        question = await sc.call("interactions.request", {"sessionId": "s1", "turnId": "t1",
                                                           "question": "Which?", "allowFreeText": True})
        keyed["approval"] = ("approvals.respond", {"sessionId": "s1", "requestId": asked["request"]["requestId"],
                                                   "optionId": "allow_session", "submissionId": "k-allow"})
        keyed["question"] = ("interactions.respond", {
            "sessionId": "s1", "requestId": question["request"]["requestId"], "answer": {"text": "this one"},
            "submissionId": "k-answer"})
        for name, (method, params) in keyed.items():
            first[name] = await c.call(method, params)

    async def retry(c: HostClient) -> dict[str, Any]:
        return {name: await c.call(method, params) for name, (method, params) in keyed.items()}

    with trio.fail_after(60):
        await _on_host(tmp_path, build, sidecar=True)
        transcript = transcript_path(tmp_path, "s1").read_bytes()
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert first["approval"]["request"]["status"] == "allowed" and first["question"]["request"]["status"] == "answered"
    assert got == first
    for name, (method, _) in keyed.items():
        METHODS[method].result_model.model_validate(got[name])
    assert transcript_path(tmp_path, "s1").read_bytes() == transcript  # no second decision line


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_database_only_change_runs_once_on_what_the_loss_left(tmp_path: Path, how: str) -> None:
    """A change whose whole effect is database state (a queue entry, a task, a setting) commits its receipt in
    the same transaction: both are lost together, so nothing can answer as the first call did. Its retry runs
    as a first call on the rebuilt database: the effect is there once, and the answer is what the rebuilt
    state holds (a fresh task id, not the lost one, which names nothing now). Nothing is there twice."""
    keyed: dict[str, tuple[str, dict[str, Any]]] = {
        "queue": ("session.queuePush", {"sessionId": "s1", "principal": "ui", "content": "later, please",
                                         "permissionMode": "ask"}),
        "task": ("tasks.create", {"title": "nightly", "prompt": "check"}),
        "setting": ("settings.set", {"ns": "ui", "key": "theme", "value": "dark"}),
    }
    for name, (_, params) in keyed.items():
        params["submissionId"] = f"k-{name}"

    async def build(c: HostClient) -> dict[str, Any]:
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        return {name: await c.call(method, params) for name, (method, params) in keyed.items()}

    async def retry(c: HostClient) -> dict[str, Any]:
        got = {name: await c.call(method, params) for name, (method, params) in keyed.items()}
        for name, (method, params) in keyed.items():  # and again: now answered from the new receipt
            assert await c.call(method, params) == got[name], name
        got["queued"] = (await c.call("session.queueList", {"sessionId": "s1"}))["entries"]
        got["tasks"] = (await c.call("tasks.list", {}))["tasks"]
        got["theme"] = (await c.call("settings.get", {"ns": "ui", "key": "theme"}))["value"]
        return got

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    for name, (method, _) in keyed.items():
        METHODS[method].result_model.model_validate(got[name])
    assert [e["content"] for e in got["queued"]] == ["later, please"]
    assert got["tasks"] == [got["task"]] and got["task"]["id"] != first["task"]["id"]
    assert got["theme"] == "dark"


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_plugin_registration_is_answered_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """``plugins.register`` and ``plugins.setEnabled`` change ``plugins/registry.json``; their receipts were
    database rows only. After the loss their retries ran again: the registration put version 1 back over the
    version 2 registered since, the switch disabled the plugin enabled since (a second effect each, undoing a
    later change), and each answered the entry as it then was. The registry write carries the receipt now."""
    keyed: dict[str, tuple[str, dict[str, Any]]] = {
        "register": ("plugins.register", {"pluginId": "acme", "name": "acme", "version": "1", "assets": _ASSET,
                                          "submissionId": "k-reg"}),
        "disable": ("plugins.setEnabled", {"pluginId": "acme", "enabled": False, "submissionId": "k-off"}),
    }
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        for name, (method, params) in keyed.items():
            first[name] = await c.call(method, params)
        await c.call("plugins.setEnabled", {"pluginId": "acme", "enabled": True})  # later changes
        await c.call("plugins.register", {"pluginId": "acme", "name": "acme", "version": "2"})

    async def retry(c: HostClient) -> dict[str, Any]:
        got = {name: await c.call(method, params) for name, (method, params) in keyed.items()}
        got["plugins"] = [(p["id"], p["version"], p["enabled"]) for p in (await c.call("plugins.list", {}))["plugins"]]
        return got

    with trio.fail_after(60):
        await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        got = await _on_host(tmp_path, retry)
    assert {name: got[name] for name in keyed} == first
    assert got["plugins"] == [("acme", "2", True)]  # nothing undone


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_change_held_in_a_file_is_answered_once_after_the_loss(tmp_path: Path, how: str) -> None:
    """More keyed changes whose effect is a file (seed 000 §2.4), each followed by a change that would alter its
    answer or that a second run would undo. ``session.saveActiveRevision``'s receipt was a database row only:
    after the loss its retry saved the live branch again (another reference line, the regenerated variant's)
    and answered that variant, not the one it saved. Its reference line carries the receipt and the answer now.
    ``projects.remove``: the project is a database row and its removal intent goes once the removal is over, so
    nothing is left to answer from; the retry is NOT_FOUND and deletes nothing again (its sessions stay
    deleted: ``sessions/deleted-sessions.log`` names them)."""
    data, folder = tmp_path / "data", tmp_path / "project"
    data.mkdir()
    folder.mkdir()
    keyed: dict[str, tuple[str, dict[str, Any]]] = {
        "save": ("session.saveActiveRevision", {"sessionId": "sv", "rootUserId": "sv-u1"}),
        "hide": ("session.deleteMessage", {"sessionId": "dm", "messageId": "dm-a0"}),
        "delete": ("session.delete", {"sessionId": "d"}),
        "compact": ("session.appendCompaction", {"sessionId": "c", "compaction": {
            "id": "cp1", "summary": "so far", "throughMessageId": "c-a1", "tokensBefore": 10}}),
        "secret": ("secrets.set", {"ref": "provider/acme", "value": "first"}),
        "put": ("attachments.put", {"name": "a.txt", "mimeType": "text/plain", "dataBase64": "aGkK"}),
    }
    for name, (_, params) in keyed.items():
        params["submissionId"] = f"k-{name}"
    first: dict[str, Any] = {}
    sessions = ("sv", "dm", "c")

    async def build(c: HostClient) -> None:
        for sid in (*sessions, "d"):
            await c.call("session.create", {"sessionId": sid, "title": f"session {sid}"})
            for n in (0, 1):
                for m in (msg(f"{sid}-u{n}", f"q{n}"), msg(f"{sid}-a{n}", f"r{n}", role="assistant")):
                    await c.call("session.appendMessage", {"sessionId": sid, "message": m})
        made = await c.call("session.create", {"sessionId": "pj", "title": "p", "projectPath": str(folder)})
        keyed["remove"] = ("projects.remove", {"projectId": made["projectId"], "submissionId": "k-remove"})
        for name, (method, params) in keyed.items():
            first[name] = await c.call(method, params)
        # later changes
        await c.call("session.truncateFrom", {"sessionId": "sv", "messageId": "sv-a1", "mode": "regenerate"})
        await c.call("session.restoreMessage", {"sessionId": "dm", "messageId": "dm-a0"})
        first["secret-since"] = await c.call("secrets.set", {"ref": "provider/acme", "value": "second"})
        for sid in sessions:
            await c.call("session.rename", {"sessionId": sid, "title": "renamed since"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-later", "later")})

    async def retry(c: HostClient) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for name, (method, params) in keyed.items():
            try:
                got[name] = await c.call(method, params)
            except RpcError as exc:
                got[name] = exc.data_code
        got["secrets"] = [(s["ref"], s["updatedAt"]) for s in (await c.call("secrets.list", {}))["secrets"]]
        got["sessions"] = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        return got

    def files() -> dict[str, tuple[bytes, bytes | None]]:
        return {sid: (transcript_path(data, sid).read_bytes(),
                      revisions_path(data, sid).read_bytes() if revisions_path(data, sid).exists() else None)
                for sid in sessions}

    with trio.fail_after(90):
        await _on_host(data, build)
        before = files()
        _damage(data, how)
        got = await _on_host(data, retry)
    assert first["save"]["revision"]["revisionIndex"] == 1 and first["remove"]["deletedSessions"] == ["pj"]
    assert [name for name in keyed if name != "remove" and got[name] != first[name]] == []
    for name, (method, _) in keyed.items():
        if name != "remove":
            METHODS[method].result_model.model_validate(got[name])
    assert got["remove"] == "NOT_FOUND"
    assert files() == before  # nothing saved, hidden or compacted again
    assert got["secrets"] == [("provider/acme", first["secret-since"]["updatedAt"])]  # the later value stays
    assert got["sessions"] == sorted(sessions)  # "d" and "pj" stay deleted


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_review_record_and_restore_answer_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """A review snapshot's ``meta.json`` carries the recording call's receipt and the restore's intent with its
    receipt; the receipt rows go with the database. After the loss the retried record answered the snapshot as
    ``meta.json`` says now (``restored``), not ``recorded``, and the retried restore, the file edited since,
    answered FILE_CHANGED though its own restore was over. Neither writes anything (the edit stays)."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    (ws / "docs").mkdir(parents=True)
    notes = ws / "docs" / "notes.md"
    notes.write_bytes(b"after\n")
    keyed: dict[str, tuple[str, dict[str, Any]]] = {
        "record": ("review.record", {"sessionId": "rv", "path": "docs/notes.md", "toolName": "Edit",
                                     "beforeBase64": "YmVmb3JlCg==", "toolCallId": "call_3", "messageId": "a1",
                                     "submissionId": "k-record"}),
    }
    first: dict[str, Any] = {}

    async def build(c: HostClient) -> None:
        await c.call("session.create", {"sessionId": "rv", "title": "r", "projectPath": str(ws)})
        first["record"] = await c.call(*keyed["record"])
        snapshot = first["record"]["snapshot"]["snapshotId"]
        keyed["restore"] = ("review.restore", {"sessionId": "rv", "snapshotId": snapshot, "submissionId": "k-restore"})
        first["restore"] = await c.call(*keyed["restore"])
        notes.write_bytes(b"edited since\n")

    async def retry(c: HostClient) -> dict[str, Any]:
        got = {name: await c.call(method, params) for name, (method, params) in keyed.items()}
        got["snapshots"] = (await c.call("review.list", {"sessionId": "rv"}))["snapshots"]
        return got

    with trio.fail_after(60):
        await _on_host(data, build)
        review = sorted(p.name for p in (data / "review-changes" / "rv").iterdir())
        _damage(data, how)
        got = await _on_host(data, retry)
    assert first["record"]["snapshot"]["state"] == "recorded" and first["restore"]["snapshot"]["state"] == "restored"
    assert {name: got[name] for name in keyed} == first
    for name, (method, _) in keyed.items():
        METHODS[method].result_model.model_validate(got[name])
    assert got["snapshots"] == [first["restore"]["snapshot"]]  # recorded once
    assert sorted(p.name for p in (data / "review-changes" / "rv").iterdir()) == review
    assert notes.read_bytes() == b"edited since\n"  # not restored again


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_plan_submission_writes_no_second_artifact_after_the_loss(tmp_path: Path, how: str) -> None:
    """``plans.submit`` writes its Markdown artifact into the workspace, then the pending approval (a database
    row) with the receipt. After the loss the row and the receipt are gone; the retry wrote a second artifact
    (another unique name) for a new request id. A keyed submission's request id and artifact name token derive
    from the key now, and its retry names the artifact the first try published: one file, one pending approval
    with the first request id and artifact (the row is made again: its times are the retry's)."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    params = {"sessionId": "pl", "turnId": "t0", "toolCallId": "c1", "kind": "plan", "markdown": "# plan\n",
              "workspaceRoot": str(ws), "submissionId": "k-plan"}

    async def build(c: HostClient, sc: HostClient) -> Any:
        await c.call("session.create", {"sessionId": "pl", "title": "p", "projectPath": str(ws), "mode": "plan"})
        await sc.call("session.startTurn", {"sessionId": "pl", "turnId": "t0"})
        return await sc.call("plans.submit", params)

    async def retry(c: HostClient, sc: HostClient) -> tuple[Any, Any]:
        return await sc.call("plans.submit", params), (await c.call("plans.pending", {}))["pending"]

    with trio.fail_after(60):
        first = await _on_host(data, build, sidecar=True)
        _damage(data, how)
        got, pending = await _on_host(data, retry, sidecar=True)
    same = ("requestId", "sessionId", "turnId", "toolCallId", "kind", "status", "artifactPath", "artifactSha256",
            "artifactSize", "version")
    assert {k: got[k] for k in same} == {k: first[k] for k in same}
    METHODS["plans.submit"].result_model.model_validate(got)
    assert sorted(p.name for p in (ws / ".pi" / "plan").iterdir()) == [first["artifactPath"].rsplit("/", 1)[1]]
    assert [p["requestId"] for p in pending] == [first["requestId"]]


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_import_is_answered_as_the_first_time_after_the_loss(tmp_path: Path, how: str) -> None:
    """``import.sessions`` and ``plugins.importSession`` carry their receipts in the sessions they write (an
    ``import_receipt`` line, the new transcript's header): after the loss their retries answer what the first
    calls answered (``new`` / ``created: true``, not ``unchanged``) and write no session again."""
    data, src = tmp_path / "data", tmp_path / "src"
    data.mkdir()
    shutil.copytree(CLAUDE_CODE, src)
    keyed = {"sessions": ("import.sessions", {"source": "claude-code", "root": str(src), "submissionId": "k-import"}),
             "plugin": ("plugins.importSession", {**PLUGIN_IMPORT, "submissionId": "k-plugin"})}

    async def run(c: HostClient, plugin: HostClient) -> dict[str, Any]:
        got = {name: await (plugin if method.startswith("plugins.") else c).call(method, params)
               for name, (method, params) in keyed.items()}
        got["listed"] = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        return got

    async def on_host(work: Any, *, register: bool = False) -> Any:
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as c, \
                    open_client(proc.url, proc.token, client_id="p1", client_kind="plugin", plugin_id="alpha") as p:
                if register:
                    await c.call("plugins.register", {"pluginId": "alpha", "name": "alpha", "version": "1"})
                return await work(c, p)
        finally:
            assert await trio.to_thread.run_sync(proc.terminate) == 0

    with trio.fail_after(90):
        first = await on_host(run, register=True)
        files = sorted((p.name, p.read_bytes()) for p in (data / "sessions").glob("*.jsonl"))
        _damage(data, how)
        got = await on_host(run)
    assert first["sessions"]["counts"]["new"] == 6 and first["plugin"]["created"] is True and len(files) == 7
    assert got == first
    assert sorted((p.name, p.read_bytes()) for p in (data / "sessions").glob("*.jsonl")) == files


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_delivery_that_began_is_not_delivered_again_after_the_loss(tmp_path: Path, how: str) -> None:
    """``collab.deliver``'s ledger row and queue admission are database rows; the begin's input line
    (``collab-<deliveryId>``) is the only trace in a file. After the loss the retry queued a NEW delivery
    (a new id, another admission): the task was delivered twice. Now a delivery's id derives from its
    idempotency key and its input line carries the deliver's receipt and answer: the keyed retry answers
    the first answer, a retry by idempotency key alone answers that delivery replayed, and nothing is
    queued or written again."""
    deliver = {"pluginId": "team", "sourceSessionId": "src", "targetSessionId": "tgt", "kind": "task",
               "content": "review it", "idempotencyKey": "k1", "notifyOnCompletion": True}
    keyed = {**deliver, "submissionId": "k-deliver"}

    async def build(c: HostClient) -> Any:
        for sid in ("src", "tgt", "other"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
        return await deliver_and_run(c, keyed)

    async def retry(c: HostClient) -> Any:
        again = await c.call("collab.deliver", keyed)
        unkeyed = await c.call("collab.deliver", deliver)
        queued = (await c.call("session.queueList", {"sessionId": "tgt"}))
        listed = await c.call("collab.list", {"sessionId": "tgt", "direction": "incoming"})
        with pytest.raises(RpcError) as elsewhere:  # the key's delivery began in tgt: not one to another target
            await c.call("collab.deliver", {**deliver, "targetSessionId": "other"})
        assert elsewhere.value.data_code == "IDEMPOTENCY_CONFLICT"
        assert (await c.call("session.queueList", {"sessionId": "other"}))["entries"] == []
        return again, unkeyed, queued, listed

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build)
        transcript = transcript_path(tmp_path, "tgt").read_bytes()
        _damage(tmp_path, how)
        again, unkeyed, queued, listed = await _on_host(tmp_path, retry)
    did = first["delivery"]["id"]
    assert first["replayed"] is False and first["entry"]["sessionMessageId"] == did
    assert again == first
    assert unkeyed["replayed"] is True and unkeyed["delivery"]["id"] == did
    assert queued["entries"] == []  # no admission of a second delivery
    assert [d["id"] for d in listed["deliveries"]] in ([], [did])  # nothing new queued
    assert transcript_path(tmp_path, "tgt").read_bytes() == transcript


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_retried_inflight_recovery_is_answered_as_the_first_time_after_the_loss(
        tmp_path: Path, how: str) -> None:
    """``session.recoverInflight`` promotes the checkpoint into a transcript line and removes the checkpoint;
    its receipt was a database row only: after the loss the retry found no checkpoint and answered
    ``{"action": "none"}``. The promoted line carries the receipt with the answer now."""
    sid = "s1"
    recover = {"sessionId": sid, "turnId": "t1", "submissionId": "k-recover"}

    async def build(c: HostClient) -> Any:
        await c.call("session.create", {"sessionId": sid, "title": "t"})
        await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "question")})
        await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1", "message": msg(
            "a1", "partial answer", role="assistant", meta={"status": "streaming"})})
        first = await c.call("session.recoverInflight", recover)
        listed = (await c.call("session.get", {"sessionId": sid}))["messages"]
        return first, listed

    async def retry(c: HostClient) -> Any:
        return await c.call("session.recoverInflight", recover), await c.call("session.recoverInflight", recover)

    with trio.fail_after(60):
        first, listed = await _on_host(tmp_path, build)
        transcript = transcript_path(tmp_path, sid).read_bytes()
        _damage(tmp_path, how)
        again, twice = await _on_host(tmp_path, retry)
    assert first["action"] == "promoted" and first["turn"]["status"] == "aborted"
    assert (first["message"]["id"], first["message"]["seq"]) == (listed[-1]["id"], listed[-1]["seq"])
    assert again == first and twice == first
    assert transcript_path(tmp_path, sid).read_bytes() == transcript
