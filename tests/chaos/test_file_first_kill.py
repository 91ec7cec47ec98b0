"""SIGKILL between a file effect and its database commit, for every file-first method.

For each method and each named fault point between its file step and the
commit of its transaction (and right after that commit, before the reply):
a `pi-host serve` process SIGKILLs itself there (``RT_CRASHPOINT``), a host
is started on its data directory (in this process: the same boot recovery,
actors, gateway and WebSocket client), and the client retries with the same
``submissionId``. The retry must succeed, a
further retry must get the identical answer, and the effect must have
happened exactly once (one session, one fork, one artifact, one line...): no
second session, no lost delete acknowledgement, no orphan artifact.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, RpcError, open_client
from tests.hostkit import HostProcess, client_for, index_caught_up, inprocess_host, start_host_process
from tests.pipeline.scenarios import (
    SCENARIOS,
    Vars,
    count,
    decision_lines,
    deliver_params,
    with_plan,
    with_two_sessions,
)

Count = Callable[[Path, Vars], int]


def messages_of(root: Path, v: Vars) -> int:
    conn = sqlite3.connect(f"file:{root / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (v["sid"],)).fetchone()[0])
    finally:
        conn.close()


def transcript_files(root: Path, v: Vars) -> int:
    return sum(1 for p in (root / "sessions").iterdir() if p.name.endswith(".jsonl")
               and not p.name.endswith(".revisions.jsonl"))


def info_lines(root: Path, v: Vars) -> int:
    path = root / "sessions" / f"{v['sid']}.jsonl"
    return sum(1 for line in path.read_bytes().splitlines() if b'"type":"session_info"' in line)


# method -> (fault points between the file and the commit, how one effect shows)
CASES: dict[str, tuple[tuple[str, ...], Count | None]] = {
    "session.create": (("create.after_tmp_fsync", "create.after_rename", "create.before_index",
                        "session.create.before_commit", "session.create.after_commit"), transcript_files),
    "session.fork": (("fork.after_rename", "fork.before_index", "session.fork.before_commit",
                      "session.fork.after_commit"), transcript_files),
    # Assistant Edit (seed 003 §4.5): the child's revisions file first, then its transcript (the receipt
    # rides in its header), then the rows; a kill before the transcript leaves no child, only a retry makes it
    "session.assistantEdit": (("assistantEdit.revisions.after_rename", "fork.after_rename",
                               "assistantEdit.before_index", "session.assistantEdit.before_commit",
                               "session.assistantEdit.after_commit"), transcript_files),
    "session.delete": (("delete.after_marker", "session.delete.before_commit", "session.delete.after_commit",
                        "delete.before_files"), count("SELECT COUNT(*) FROM sessions")),
    "session.truncateFrom": (("rewrite.after_rename", "rewrite.before_reindex", "session.truncateFrom.before_commit",
                              "session.truncateFrom.after_commit"), messages_of),
    "session.replaceMessages": (("rewrite.after_rename", "rewrite.before_reindex",
                                 "session.replaceMessages.before_commit", "session.replaceMessages.after_commit"),
                                messages_of),
    "session.activateRevision": (("revisions.after_write", "rewrite.after_rename", "rewrite.before_reindex",
                                  "session.activateRevision.before_commit", "session.activateRevision.after_commit"),
                                 None),
    "plans.submit": (("plans.intent.after_tmp_fsync", "plans.intent.after_rename", "plans.artifact.after_write",
                      "plans.before_row", "plans.submit.before_commit", "plans.submit.after_commit"), None),
    "attachments.importFile": (("attachments.import.before_fsync", "attachments.importFile.before_commit",
                                "attachments.importFile.after_commit"), None),
    "review.record": (("review.before.after_rename", "review.meta.after_tmp_fsync", "review.meta.after_rename",
                       "review.record.before_commit", "review.record.after_commit"), None),
    "review.restore": (("review.restore_intent.after_rename", "review.restore_file.after_tmp_write",
                        "review.restored.after_tmp_fsync",
                        "review.restored.after_rename", "review.restore.before_commit",
                        "review.restore.after_commit"), None),
    "session.appendMessage": (("append.after_write", "append.after_fsync", "index.before_commit",
                               "index.after_commit"), None),
    "import.sessions": (("import.after_link", "index.before_commit", "import.sessions.before_commit",
                         "import.sessions.after_commit"), count("SELECT COUNT(*) FROM sessions")),
    "plugins.importSession": (("import.after_link", "plugins.importSession.before_commit",
                               "plugins.importSession.after_commit"),
                              count("SELECT COUNT(*) FROM session_import_origins")),
    "sessions.purge": (("purge.after_marker", "sessions.purge.before_commit", "sessions.purge.after_commit",
                        "purge.before_files"), count("SELECT COUNT(*) FROM sessions")),
    # issue 16: a user's decision is a transcript line first (its receipt rides in it), then rows
    "approvals.respond": (("append.after_fsync", "approvals.respond.before_commit",
                           "approvals.respond.after_commit"), decision_lines),
    "interactions.respond": (("append.after_fsync", "interactions.respond.before_commit",
                              "interactions.respond.after_commit"), decision_lines),
    # the collaboration input row and a recovered checkpoint are message lines written before their rows
    "collab.begin": (("collab.begin.after_commit",), messages_of),  # before the commit: see below
    "session.recoverInflight": (("append.after_fsync", "session.recoverInflight.before_commit",
                                 "session.recoverInflight.after_commit"), messages_of),
    # thread metadata: a session_info line (its receipt rides in it), then the thread_meta row
    "session.updateMetadata": (("append.after_fsync", "session.updateMetadata.before_commit",
                                "session.updateMetadata.after_commit"), None),
    "session.rename": (("append.after_fsync", "session.rename.before_commit", "session.rename.after_commit"),
                       info_lines),
    "session.update": (("append.after_fsync", "session.update.before_commit", "session.update.after_commit"),
                       info_lines),
    "sessions.trash": (("append.after_fsync", "sessions.trash.before_commit", "sessions.trash.after_commit"),
                       info_lines),
    "sessions.restore": (("append.after_fsync", "sessions.restore.before_commit", "sessions.restore.after_commit"),
                         info_lines),
    # the queue is database-only: a kill anywhere in its transaction leaves it whole or absent
    **{f"session.{op}": (("queue.after_apply", f"session.{op}.before_commit", f"session.{op}.after_commit"),
                         SCENARIOS[f"session.{op}"].count)
       for op in ("queuePush", "queueRemove", "queuePrioritize", "queueReorder")},
    "session.queueAttach": (("session.queueAttach.before_commit", "session.queueAttach.after_commit"), None),
    # set up in the crashing host (a controller's attachment does not outlive its host), whose setup
    # pushes entries through queue.after_apply: the take's own commit points only. Killed before its
    # commit, the take's retry finds the queue held (no controller since the restart) and takes nothing
    # until a controller attaches; so no count of one effect here
    "session.queueTake": (("session.queueTake.before_commit", "session.queueTake.after_commit"), None),
}


def _client(proc: HostProcess, kind: str) -> Any:
    plugin = kind.removeprefix("plugin:") if kind.startswith("plugin:") else None
    return open_client(proc.url, proc.token, client_id="chaos-file", client_kind="plugin" if plugin else kind,
                       plugin_id=plugin)


# The session rows of these scenarios hold absolute paths (a project root): set up in place.
# their session rows (and review snapshots' meta.json) hold the absolute project path
IN_PLACE = {"plans.submit", "attachments.importFile", "review.record", "review.restore"}
# A running turn does not outlive its host (the boot fence ends it): these are set up in the host that
# then dies at the point (their setups write no transcript line, so the point's first hit is the call's).
IN_CRASHING_HOST = {"approvals.respond", "interactions.respond", "collab.begin", "session.recoverInflight",
                    "session.queueTake"}


async def _setup(method: str, root: Path) -> Vars:
    """The scenario's state, made by a real host that then stops cleanly. The host runs in this
    process (boot, actors, gateway, the same WebSocket client): a host subprocess per data directory
    made most of this module's time, and only the crashing and the restarted host need a process."""
    async with inprocess_host(root) as host, client_for(host, "chaos-file", SCENARIOS[method].kind) as c:
        v = await SCENARIOS[method].setup(c, root)
        await index_caught_up(host)  # as a SIGTERM'd host's drain: the index covers every acknowledged append
        return v


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Vars]]:
    """One data directory per method with its scenario's state, made once (copied per case)."""
    base = tmp_path_factory.mktemp("file-first")

    async def prepare() -> dict[str, tuple[Path, Vars]]:
        out: dict[str, tuple[Path, Vars]] = {}
        for method in CASES:
            if method in IN_PLACE or method in IN_CRASHING_HOST:
                continue
            root = base / method / "data"
            root.parent.mkdir()
            out[method] = (root, await _setup(method, root))
        return out

    return trio.run(prepare)


def _copy(src: Path, dst: Path) -> None:
    """The data directory and its sibling folders (workspace, files) the scenario made."""
    for item in src.parent.iterdir():
        shutil.copytree(item, dst.parent / item.name, symlinks=True)


def _rebase(v: Vars, old: Path, new: Path) -> Vars:
    return {k: (val.replace(str(old.parent), str(new.parent)) if isinstance(val, str) else val) for k, val in v.items()}


@pytest.mark.parametrize(("method", "point"), [(m, p) for m, (points, _) in CASES.items() for p in points])
async def test_sigkill_between_file_and_commit_then_retry(tmp_path: Path, prepared: dict[str, tuple[Path, Vars]],
                                                          method: str, point: str) -> None:
    root = tmp_path / "data"
    scenario = SCENARIOS[method]
    points, effect = CASES[method]
    v: Vars = {}
    if method in IN_PLACE:
        v = await _setup(method, root)
    elif method not in IN_CRASHING_HOST:
        src, v0 = prepared[method]
        _copy(src, root)
        v = _rebase(v0, src, root)
    before: int | None = None
    if method not in IN_CRASHING_HOST:
        before = effect(root, v) if effect else None
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    acked: Any = None
    try:
        with trio.fail_after(60):
            try:
                async with _client(crashing, scenario.kind) as c:
                    if method in IN_CRASHING_HOST:
                        v = await scenario.setup(c, root)
                        await c.call("session.get", {"sessionId": v["sid"]})  # the index covers the setup
                        before = effect(root, v) if effect else None
                    params = {**scenario.params(v), "submissionId": f"chaos-{method}"}
                    acked = await c.call(method, params)
                    # An append is acknowledged once its line is durable, before its index commit:
                    # the host dies right after the answer (``index.*`` points).
                    assert method == "session.appendMessage" and point.startswith("index."), (method, point)
                    await c.call("host.status", {})  # the connection drops when the host dies
            except (ClientClosed, OSError):
                pass
            await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
            assert crashing.proc.returncode == -9, f"the host did not die at {point}"
            # The restart's boot recovery and the retries run in this process (the same boot, actors, gateway
            # and WebSocket client as a `pi-host serve`): only the host that dies needs a process of its own.
            async with inprocess_host(root) as again, client_for(again, "chaos-file", scenario.kind) as c:
                first = await c.call(method, params)
                if acked is not None:
                    assert first == acked, "the retry did not get the acknowledged answer"
                assert await c.call(method, params) == first
                if effect is not None:
                    assert before is not None
                    assert abs(effect(root, v) - before) == 1, f"{method} at {point}: not exactly one effect"
                await _check_effect(c, root, method, v, first)
    finally:  # a host that did not die at its point would outlive the test (and hang its exit)
        if crashing.proc.poll() is None:
            crashing.kill9()


async def _check_effect(c: Any, root: Path, method: str, v: Vars, first: Any) -> None:
    if method == "plans.submit":
        folder = Path(v["ws"]) / ".pi" / "plan"
        files = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp")) if folder.exists() else []
        assert files == [first["artifactPath"].rsplit("/", 1)[1]], "an artifact no approval row records survived"
        assert not any(".tmp." in p.name for p in folder.iterdir())
    if method in ("import.sessions", "plugins.importSession"):
        got = (await c.call("session.list", {}))["sessions"]
        assert len(got) == 1
        page = await c.call("session.get", {"sessionId": got[0]["id"], "full": True})
        assert page["totalMessages"] >= 1
        assert len(list((root / "sessions").glob("*.jsonl"))) == 1
    if method in ("session.delete", "sessions.purge"):
        with pytest.raises(RpcError) as err:
            await c.call("session.get", {"sessionId": v["sid"]})
        assert err.value.data_code == "SESSION_NOT_FOUND"
    if method in ("session.create", "session.fork"):
        got = await c.call("session.get", {"sessionId": first["id"]})
        assert got["session"]["id"] == first["id"]
    if method == "session.assistantEdit":  # the child holds both tails, the edited one active
        child = first["session"]["id"]
        revs = (await c.call("session.listRevisions", {"sessionId": child}))["revisions"]
        assert [(r["revisionIndex"], r["isActive"]) for r in revs] == [(1, False), (2, True)]
        assert len(list((root / "sessions").glob("*.revisions.jsonl"))) == 1
    if method == "session.appendMessage":
        got = await c.call("session.get", {"sessionId": v["sid"], "full": True})
        assert [m["id"] for m in got["messages"]].count("m1") == 1


@pytest.mark.parametrize("point", ["append.after_fsync", "collab.begin.before_commit"])
async def test_a_begin_killed_before_its_commit_is_recorded_once_and_its_retry_answers_it(
        tmp_path: Path, point: str) -> None:
    """collab.begin writes its input line, then the ledger. Killed between the two, the line is the proof
    that t1 began the delivery: boot binds the delivery to t1 (interrupted: the restart cut t1) and
    consumes its admission, so no queue entry hands it out again; the retry (same submissionId) answers
    what the first try would have (running in t1, its input row); a begin from the next turn is CONFLICT
    naming t1. Exactly one input row, never a second run."""
    root = tmp_path / "data"
    scenario = SCENARIOS["collab.begin"]
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    with trio.fail_after(60):
        try:
            async with _client(crashing, scenario.kind) as c:
                v = await scenario.setup(c, root)
                await c.call("collab.begin", {**scenario.params(v), "submissionId": "chaos-begin"})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
        assert crashing.proc.returncode == -9, f"the host did not die at {point}"
        async with inprocess_host(root) as again, client_for(again, "chaos-file", scenario.kind) as c:
            got = await c.call("collab.get", {"deliveryId": v["delivery"]})
            assert (got["status"], got["turnId"]) == ("interrupted", "t1")  # bound at boot, before any retry
            queued = (await c.call("session.queueList", {"sessionId": v["sid"]}))["entries"]
            assert all(e.get("sessionMessageId") != v["delivery"] for e in queued)  # its admission is consumed
            answer = await c.call("collab.begin", {**scenario.params(v), "submissionId": "chaos-begin"})
            assert (answer["delivery"]["status"], answer["delivery"]["turnId"]) == ("running", "t1")
            assert answer["message"]["id"] == f"collab-{v['delivery']}"
            await c.call("session.startTurn", {"sessionId": v["sid"], "turnId": "t9"})
            with pytest.raises(RpcError) as err:
                await c.call("collab.begin", {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t9",
                                              "submissionId": "chaos-begin-2"})
            assert err.value.data_code == "CONFLICT" and err.value.data["turnId"] == "t1"
            page = await c.call("session.get", {"sessionId": v["sid"], "full": True})
            inputs = [m for m in page["messages"] if m.get("sessionMessage")]
            assert len(inputs) == 1 and inputs[0]["sessionMessage"]["deliveryId"] == v["delivery"]


async def test_a_begin_killed_after_its_turn_took_the_admission_leaves_the_delivery_interrupted(
        tmp_path: Path) -> None:
    """Seed 003 §4.6c: after a restart, queued deliveries whose admission a turn began with are not held;
    nothing is replayed. The controller took the delivery's admission and started t1 with it, and the host
    died inside collab.begin after the input line, before the commit. Boot's fence held the delivery (its
    admission was still queued), then settled the admission t1 had begun with (consumed: its input had
    landed), leaving a 'queued' delivery no queue entry would ever hand out; a begin in the next turn
    then bound it to t2 with t1's input row. It is interrupted now, its one input row kept."""
    root = tmp_path / "data"
    crashing = start_host_process(root, env={"RT_CRASHPOINT": "collab.begin.before_commit:1"})
    with trio.fail_after(60):
        try:
            async with _client(crashing, "test") as c, open_client(
                    crashing.url, crashing.token, client_id="sidecar", client_kind="agent") as agent:
                v = await with_two_sessions(c, root)
                delivery = (await c.call("collab.deliver", deliver_params(v)))["delivery"]["id"]
                await agent.call("session.queueAttach", {"sessionId": v["sid"], "controllerId": "sidecar"})
                control = {"sessionId": v["sid"], "controllerId": "sidecar"}
                taken = (await agent.call("session.queueTake", control))["entry"]
                assert taken["sessionMessageId"] == delivery
                await agent.call("session.startTurn", {"sessionId": v["sid"], "turnId": "t1"})
                await c.call("collab.begin", {"sessionId": v["sid"], "deliveryId": delivery, "turnId": "t1",
                                              "submissionId": "begin-1"})
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
        assert crashing.proc.returncode == -9
        async with inprocess_host(root) as again, client_for(again, "chaos-file", "test") as c:
            got = await c.call("collab.get", {"deliveryId": delivery})
            assert got["status"] == "interrupted"
            assert (await c.call("session.queueList", {"sessionId": v["sid"]}))["entries"] == []
            page = await c.call("session.get", {"sessionId": v["sid"], "full": True})
            inputs = [m for m in page["messages"] if m.get("sessionMessage")]
            assert len(inputs) == 1 and inputs[0]["turnId"] == "t1"
            await c.call("session.startTurn", {"sessionId": v["sid"], "turnId": "t2"})
            with pytest.raises(RpcError) as err:  # never replayed
                await c.call("collab.begin", {"sessionId": v["sid"], "deliveryId": delivery, "turnId": "t2"})
            assert err.value.data_code == "CONFLICT"


@pytest.mark.parametrize("point", ["append.after_write", "append.after_fsync", "plans.respond.before_commit"])
async def test_a_plan_approval_cut_after_its_mode_line_is_approved_at_the_restart(tmp_path: Path, point: str) -> None:
    """plans.respond (approve) writes the session_info line that switches the session to agent mode (and
    the target permission), fsynced, before the approval row changes. Killed between the two, the session
    ran in agent mode with the raised permission and no approval behind it: the fence interrupted the
    request and the retry was CONFLICT. Boot applies the approval the line names, before the fence, and
    stores the line's receipt: the retry gets the answer, once."""
    root = tmp_path / "data"
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    v: Vars = {}
    params: dict[str, Any] = {}
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id="chaos-plan", client_kind="ui") as c:
                v = await with_plan(c, root)
                params = {"requestId": v["request"], "action": "approve", "targetPermissionMode": "accept-edits",
                          "submissionId": "approve-1"}
                await c.call("plans.respond", params)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
        assert crashing.proc.returncode == -9 and params, f"the host did not die in plans.respond at {point}"
        async with inprocess_host(root) as again, client_for(again, "chaos-plan", "ui") as c:
            first = await c.call("plans.respond", params)
            assert first["approval"]["status"] == "approved" and first["approval"]["executionState"] == "queued"
            assert await c.call("plans.respond", params) == first
            session = (await c.call("session.get", {"sessionId": v["sid"]}))["session"]
            assert (session["mode"], session["permissionMode"]) == ("agent", "accept-edits")
            assert (await c.call("plans.pending", {"sessionId": v["sid"]}))["pending"] == []
