"""One scenario per mutating wire method: the state it needs, a valid request, a different one.

``tests/pipeline/test_receipts.py`` runs every scenario through the receipt
checks, and fails when a mutating method of the route table has none: a new
method cannot skip them.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.client import HostClient
from store.config.secrets import SecretStore
from store.errors import NotFound
from tests.dbkit import rows
from tests.hostkit import msg
from tests.httpkit import FakeProvider, Reply
from tests.importers import gen

Vars = dict[str, Any]
Setup = Callable[[HostClient, Path], Awaitable[Vars]]


@dataclass(frozen=True)
class Scenario:
    setup: Setup
    params: Callable[[Vars], dict[str, Any]]
    other: Callable[[Vars], tuple[str, dict[str, Any]]]
    """A *different* request sent with the same submissionId (another method is fine)."""
    kind: str = "test"
    count: Callable[[Path, Vars], int] | None = None
    """A number one effect moves by exactly one (rows, lines, files, a version counter)."""


# ---------------------------------------------------------------------- building blocks


async def new_session(c: HostClient, **fields: Any) -> str:
    return str((await c.call("session.create", {"title": "scenario", **fields}))["id"])


async def append(c: HostClient, sid: str, mid: str, text: str = "hello", role: str = "user") -> None:
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, text, role=role)})


def count(sql: str) -> Callable[[Path, Vars], int]:
    return lambda root, v: int(rows(root, sql)[0][0])


async def nothing(c: HostClient, root: Path) -> Vars:
    return {}


async def one_session(c: HostClient, root: Path) -> Vars:
    return {"sid": await new_session(c)}


async def with_message(c: HostClient, root: Path) -> Vars:
    sid = await new_session(c)
    await append(c, sid, "m1")
    await append(c, sid, "m2", "second")
    return {"sid": sid}


async def with_turn(c: HostClient, root: Path) -> Vars:
    sid = await new_session(c)
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
    return {"sid": sid}


async def with_checkpoint(c: HostClient, root: Path) -> Vars:
    v = await with_turn(c, root)
    await c.call("session.saveInflightMessage", {"sessionId": v["sid"], "turnId": "t1",
                                                 "message": msg("a1", "partial", "assistant")})
    return v


async def with_approval(c: HostClient, root: Path) -> Vars:
    v = await with_turn(c, root)
    asked = await c.call("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": "Bash", "risk": "low"})
    v["request"] = asked["request"]["requestId"]
    return v


async def with_rules(c: HostClient, root: Path) -> Vars:
    v = await with_turn(c, root)
    for n, tool in enumerate(("Bash", "Edit")):
        asked = await c.call("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": tool,
                                                   "risk": "low"})
        answered = await c.call("approvals.respond", {"sessionId": v["sid"], "optionId": "allow_session",
                                                      "requestId": asked["request"]["requestId"]})
        v[f"rule{n}"] = answered["rule"]["id"]
    return v


async def with_interaction(c: HostClient, root: Path) -> Vars:
    v = await with_turn(c, root)
    asked = await c.call("interactions.request", {"sessionId": v["sid"], "turnId": "t1", "question": "Which?",
                                                  "allowFreeText": True})
    v["request"] = asked["request"]["requestId"]
    return v


def decision_lines(root: Path, v: Vars) -> int:
    path = root / "sessions" / f"{v['sid']}.jsonl"
    return sum(1 for line in path.read_bytes().splitlines() if line.startswith(b'{"type":"approval_decision"'))


async def with_notification(c: HostClient, root: Path) -> Vars:
    v = await with_turn(c, root)
    await c.call("session.endTurn", {"sessionId": v["sid"], "turnId": "t1", "status": "completed"})
    v["nid"] = (await c.call("notifications.list", {}))["notifications"][0]["id"]
    return v


async def with_entries(c: HostClient, root: Path) -> Vars:
    sid = await new_session(c)
    out = {"sid": sid}
    for name in ("e1", "e2"):
        pushed = await c.call("session.queuePush", {"sessionId": sid, "principal": "p", "content": name,
                                                    "permissionMode": "ask"})
        out[name] = pushed["entry"]["id"]
    return out


async def with_controller(c: HostClient, root: Path) -> Vars:
    v = await with_entries(c, root)
    await c.call("session.queueAttach", {"sessionId": v["sid"], "controllerId": "ctl"})
    return v


async def with_turns(c: HostClient, root: Path) -> Vars:
    sid = await new_session(c)
    for u, a in (("u0", "a0"), ("u1", "a1")):
        await append(c, sid, u, f"q {u}")
        await append(c, sid, a, f"a {a}", role="assistant")
    return {"sid": sid}


async def with_variants(c: HostClient, root: Path) -> Vars:
    v = await with_turns(c, root)
    sid = v["sid"]
    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
    await append(c, sid, "a1b", "second", role="assistant")
    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    return v


async def with_tombstone(c: HostClient, root: Path) -> Vars:
    v = await with_message(c, root)
    await c.call("session.deleteMessage", {"sessionId": v["sid"], "messageId": "m1"})
    await c.call("session.deleteMessage", {"sessionId": v["sid"], "messageId": "m2"})
    return v


async def with_secret(c: HostClient, root: Path) -> Vars:
    await c.call("secrets.set", {"ref": "k1", "value": "v1"})
    await c.call("secrets.set", {"ref": "k2", "value": "v2"})
    return {}


DATA = base64.b64encode(b"attachment bytes").decode()


async def with_blob(c: HostClient, root: Path) -> Vars:
    v = await one_session(c, root)
    put = await c.call("attachments.put", {"name": "a.txt", "mimeType": "text/plain", "dataBase64": DATA})
    v["sha"] = put["sha256"]
    return v


async def with_files(c: HostClient, root: Path) -> Vars:
    folder = root.parent / f"{root.name}-files"
    folder.mkdir()
    (folder / "one.txt").write_bytes(b"one")
    (folder / "two.txt").write_bytes(b"two")
    return {"folder": str(folder)}


async def with_project_files(c: HostClient, root: Path) -> Vars:
    v = await with_files(c, root)
    v["sid"] = (await c.call("session.create", {"title": "files", "projectPath": v["folder"]}))["id"]
    return v  # importFile reads only under the session's project


async def with_task(c: HostClient, root: Path) -> Vars:
    t1 = await c.call("tasks.create", {"title": "t", "prompt": "p"})
    t2 = await c.call("tasks.create", {"title": "t2", "prompt": "p2"})
    return {"task": t1["id"], "task2": t2["id"]}


async def with_run(c: HostClient, root: Path) -> Vars:
    v = await with_task(c, root)
    v["run"] = (await c.call("tasks.startRun", {"taskId": v["task"]}))["id"]
    return v


def _workspace(root: Path) -> Path:
    ws = root.parent / f"{root.name}-ws"
    ws.mkdir(exist_ok=True)
    return ws


async def with_plan_session(c: HostClient, root: Path) -> Vars:
    ws = _workspace(root)
    return {"sid": await new_session(c, projectPath=str(ws), mode="plan"), "ws": str(ws)}


def submit_params(v: Vars, markdown: str = "# Plan\n\nDo it.\n") -> dict[str, Any]:
    return {"sessionId": v["sid"], "turnId": "t1", "toolCallId": "call1", "kind": "plan", "markdown": markdown,
            "workspaceRoot": v["ws"]}


async def with_plan(c: HostClient, root: Path) -> Vars:
    v = await with_plan_session(c, root)
    v["request"] = (await c.call("plans.submit", submit_params(v)))["requestId"]
    return v


async def with_execution(c: HostClient, root: Path) -> Vars:
    v = await with_plan(c, root)
    approved = await c.call("plans.respond", {"requestId": v["request"], "action": "approve"})
    v["execution"] = approved["approval"]["executionId"]
    await c.call("session.startTurn", {"sessionId": v["sid"], "turnId": "t2"})  # one running turn per session
    return v


async def with_running_execution(c: HostClient, root: Path) -> Vars:
    v = await with_execution(c, root)
    await c.call("plans.startExecution", {"sessionId": v["sid"], "executionId": v["execution"], "turnId": "t2"})
    return v


def deliver_params(v: Vars, key: str = "k1", content: str = "review this") -> dict[str, Any]:
    return {"pluginId": "pl", "sourceSessionId": v["src"], "targetSessionId": v["sid"], "kind": "task",
            "content": content, "idempotencyKey": key, "notifyOnCompletion": True}


async def with_two_sessions(c: HostClient, root: Path) -> Vars:
    return {"src": await new_session(c), "sid": await new_session(c)}  # sid: the target (its actor runs it)


async def with_delivery(c: HostClient, root: Path) -> Vars:
    v = await with_two_sessions(c, root)
    v["delivery"] = (await c.call("collab.deliver", deliver_params(v)))["delivery"]["id"]
    v["delivery2"] = (await c.call("collab.deliver", deliver_params(v, "k2", "and this")))["delivery"]["id"]
    await c.call("session.startTurn", {"sessionId": v["sid"], "turnId": "t1"})  # one running turn per session
    return v


async def with_begun_delivery(c: HostClient, root: Path) -> Vars:
    v = await with_delivery(c, root)
    await c.call("collab.begin", {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t1"})
    return v


async def with_projects(c: HostClient, root: Path) -> Vars:
    a, b = _workspace(root) / "a", _workspace(root) / "b"
    a.mkdir()
    b.mkdir()
    await new_session(c, projectPath=str(a))
    await new_session(c, projectPath=str(b))
    projects = {p["path"]: p["id"] for p in (await c.call("projects.list", {}))["projects"]}
    return {"a": projects[str(a)], "b": projects[str(b)]}


def artifact_files(root: Path, v: Vars) -> int:
    folder = Path(v["ws"]) / ".pi" / "plan"
    return len(list(folder.iterdir())) if folder.exists() else 0


def transcript_lines(mid: str) -> Callable[[Path, Vars], int]:
    def lines(root: Path, v: Vars) -> int:
        path = root / "sessions" / f"{v['sid']}.jsonl"
        return sum(1 for line in path.read_bytes().splitlines() if f'"id":"{mid}"'.encode() in line)

    return lines


def blob_digest() -> str:
    return hashlib.sha256(b"attachment bytes").hexdigest()


def secret_version(ref: str) -> Callable[[Path, Vars], int]:
    """How many times the secret's file was written (its authenticated version counter)."""
    def version(root: Path, v: Vars) -> int:
        try:
            return SecretStore(root / "secrets").get(ref).version
        except NotFound:
            return 0

    return version


async def with_ui_keys(c: HostClient, root: Path) -> Vars:
    await c.call("settings.update", {"ns": "ui", "values": {"k1": 1, "k2": 2}})
    return {}


async def with_skills(c: HostClient, root: Path) -> Vars:
    for name in ("one", "two"):
        await c.call("skills.put", {"name": name, "version": "1", "source": f"skill {name}"})
    return {}


async def with_groups(c: HostClient, root: Path) -> Vars:
    g1 = await c.call("projectGroups.save", {"name": "one", "roots": ["/work/one"]})
    g2 = await c.call("projectGroups.save", {"name": "two", "roots": ["/work/two"]})
    return {"g1": g1["group"]["id"], "g2": g2["group"]["id"]}


async def with_providers(c: HostClient, root: Path) -> Vars:
    await c.call("providers.create", {"id": "p1", "name": "one", "apiKey": "key-one"})
    await c.call("providers.create", {"id": "p2", "name": "two"})
    return {}


async def with_user_models(c: HostClient, root: Path) -> Vars:
    await with_providers(c, root)
    for mid in ("m1", "m2"):
        await c.call("models.add", {"providerId": "p1", "modelId": mid})
    return {}


async def with_model_server(c: HostClient, root: Path) -> Vars:
    server = FakeProvider(Reply(models=[{"id": "gpt-a"}, {"id": "gpt-b"}], api_key="key-one"), lifetime=90)
    await c.call("providers.create", {"id": "p1", "name": "one", "apiKey": "key-one", "baseUrl": server.base_url})
    return {"server": server}


async def with_plugins(c: HostClient, root: Path) -> Vars:
    for pid in ("acme", "beta"):
        await c.call("plugins.register", {"pluginId": pid, "name": pid, "version": "1", "assets": [
            {"path": "README.md", "mediaType": "text/markdown", "dataBase64": "IyBoaQo="}]})
        await c.call("settings.set", {"ns": f"plugin:{pid}", "key": "k", "value": pid})
    return {}


async def with_sync_key(c: HostClient, root: Path) -> Vars:
    await c.call("configSync.configure", {"enabled": True})
    await c.call("settings.set", {"key": "largePasteThreshold", "value": 900})
    return {}


async def with_bundles(c: HostClient, root: Path) -> Vars:
    await with_sync_key(c, root)
    first = (await c.call("configSync.export", {}))["bundleBase64"]
    second = (await c.call("configSync.export", {}))["bundleBase64"]
    return {"b1": first, "b2": second}


def kv_rows(ns: str) -> Callable[[Path, Vars], int]:
    return lambda root, v: int(rows(root, "SELECT COUNT(*) FROM kv WHERE ns = ?", ns)[0][0])


async def with_claude_root(c: HostClient, root: Path) -> Vars:
    """A Claude Code projects tree with one session (import.sessions)."""
    folder = root.parent / f"{root.name}-claude" / "-work-demo"
    folder.mkdir(parents=True)
    conv = [gen.User("import me"), gen.Response((("text", "imported answer"),), ())]
    (folder / "5a1e0000-0000-4000-8000-000000000001.jsonl").write_bytes(
        b"".join(gen.claude_code_lines(conv, session="5a1e0000-0000-4000-8000-000000000001")))
    return {"root": str(folder.parent)}


async def with_trashed(c: HostClient, root: Path) -> Vars:
    v = await with_message(c, root)
    await c.call("sessions.trash", {"sessionId": v["sid"]})
    return v


# ---------------------------------------------------------------------- the table

async def with_review_file(c: HostClient, root: Path) -> Vars:
    ws = root.parent / f"{root.name}-review-ws"
    ws.mkdir(exist_ok=True)
    (ws / "notes.txt").write_bytes(b"after\n")
    return {"sid": await new_session(c, projectPath=str(ws)), "ws": str(ws)}


def review_params(v: Vars, call: str = "call1") -> dict[str, Any]:
    return {"sessionId": v["sid"], "path": "notes.txt", "beforeBase64": base64.b64encode(b"before\n").decode(),
            "toolName": "Edit", "toolCallId": call, "messageId": "a1"}


async def with_review_snapshot(c: HostClient, root: Path) -> Vars:
    v = await with_review_file(c, root)
    v["snap"] = (await c.call("review.record", review_params(v)))["snapshot"]["snapshotId"]
    return v


def review_snapshots(state: str | None = None) -> Callable[[Path, Vars], int]:
    def snapshots(root: Path, v: Vars) -> int:
        found = list((root / "review-changes" / v["sid"]).glob("rv-*/meta.json"))
        return sum(1 for meta in found if state is None or f'"state":"{state}"' in meta.read_text())
    return snapshots


S = Scenario

SCENARIOS: dict[str, Scenario] = {
    "session.create": S(nothing, lambda v: {"title": "A"}, lambda v: ("session.create", {"title": "B"}),
                        count=count("SELECT COUNT(*) FROM sessions")),
    "session.appendMessage": S(
        one_session, lambda v: {"sessionId": v["sid"], "message": msg("m1", "x")},
        lambda v: ("session.appendMessage", {"sessionId": v["sid"], "message": msg("m2", "y")}),
        count=transcript_lines("m1")),
    "session.rename": S(one_session, lambda v: {"sessionId": v["sid"], "title": "New"},
                        lambda v: ("session.rename", {"sessionId": v["sid"], "title": "Other"})),
    "session.update": S(one_session, lambda v: {"sessionId": v["sid"], "modelId": "m1"},
                        lambda v: ("session.update", {"sessionId": v["sid"], "modelId": "m2"})),
    "session.updateMetadata": S(one_session, lambda v: {"sessionId": v["sid"], "tags": ["a"]},
                                lambda v: ("session.updateMetadata", {"sessionId": v["sid"], "tags": ["b"]})),
    "session.delete": S(one_session, lambda v: {"sessionId": v["sid"]},
                        lambda v: ("session.rename", {"sessionId": v["sid"], "title": "x"})),
    "session.startTurn": S(one_session, lambda v: {"sessionId": v["sid"], "turnId": "t1"},
                           lambda v: ("session.startTurn", {"sessionId": v["sid"], "turnId": "t2"}),
                           count=count("SELECT COUNT(*) FROM turns")),
    "session.endTurn": S(with_turn, lambda v: {"sessionId": v["sid"], "turnId": "t1", "status": "completed"},
                         lambda v: ("session.endTurn", {"sessionId": v["sid"], "turnId": "t1", "status": "error"}),
                         count=count("SELECT COUNT(*) FROM notifications")),
    "session.saveInflightMessage": S(
        with_turn, lambda v: {"sessionId": v["sid"], "turnId": "t1", "message": msg("a1", "partial", "assistant")},
        lambda v: ("session.saveInflightMessage",
                   {"sessionId": v["sid"], "turnId": "t1", "message": msg("a1", "more", "assistant")})),
    "session.recoverInflight": S(
        with_checkpoint, lambda v: {"sessionId": v["sid"], "turnId": "t1"},
        lambda v: ("session.recoverInflight", {"sessionId": v["sid"]}),
        count=count("SELECT COUNT(*) FROM messages")),
    "notifications.markRead": S(with_notification, lambda v: {"ids": [v["nid"]]},
                                lambda v: ("notifications.markRead", {"ids": [v["nid"], "other"]})),
    "notifications.markAllRead": S(with_notification, lambda v: {}, lambda v: ("notifications.clear", {})),
    "notifications.clear": S(with_notification, lambda v: {"ids": [v["nid"]]},
                             lambda v: ("notifications.clear", {})),
    "session.queuePush": S(
        one_session, lambda v: {"sessionId": v["sid"], "principal": "p", "content": "hi", "permissionMode": "ask"},
        lambda v: ("session.queuePush",
                   {"sessionId": v["sid"], "principal": "p", "content": "bye", "permissionMode": "ask"}),
        count=count("SELECT COUNT(*) FROM turn_queue")),
    "session.queueRemove": S(with_entries, lambda v: {"sessionId": v["sid"], "entryId": v["e1"]},
                             lambda v: ("session.queueRemove", {"sessionId": v["sid"], "entryId": v["e2"]})),
    "session.queuePrioritize": S(with_entries, lambda v: {"sessionId": v["sid"], "entryId": v["e2"]},
                                 lambda v: ("session.queuePrioritize", {"sessionId": v["sid"], "entryId": v["e1"]})),
    "session.queueReorder": S(
        with_entries, lambda v: {"sessionId": v["sid"], "entryId": v["e2"], "direction": "up"},
        lambda v: ("session.queueReorder", {"sessionId": v["sid"], "entryId": v["e2"], "direction": "down"})),
    "session.queueAttach": S(one_session, lambda v: {"sessionId": v["sid"], "controllerId": "ctl"},
                             lambda v: ("session.queueAttach", {"sessionId": v["sid"], "controllerId": "ctl2"}),
                             kind="agent"),
    "session.queueTake": S(with_controller, lambda v: {"sessionId": v["sid"], "controllerId": "ctl"},
                           lambda v: ("session.queueAttach", {"sessionId": v["sid"], "controllerId": "ctl"}),
                           kind="agent", count=count("SELECT COUNT(*) FROM turn_queue WHERE lease IS NULL")),
    "session.saveActiveRevision": S(
        with_turns, lambda v: {"sessionId": v["sid"], "rootUserId": "u1"},
        lambda v: ("session.saveActiveRevision", {"sessionId": v["sid"], "rootUserId": "u0"}),
        count=count("SELECT COUNT(*) FROM message_revisions")),
    "session.activateRevision": S(
        with_variants, lambda v: {"sessionId": v["sid"], "rootUserId": "u1", "revisionIndex": 1},
        lambda v: ("session.activateRevision", {"sessionId": v["sid"], "rootUserId": "u1", "revisionIndex": 2})),
    "session.truncateFrom": S(with_turns, lambda v: {"sessionId": v["sid"], "messageId": "a1"},
                              lambda v: ("session.truncateFrom", {"sessionId": v["sid"], "messageId": "u1"})),
    "session.replaceMessages": S(
        with_message, lambda v: {"sessionId": v["sid"], "messages": [msg("r1", "one")]},
        lambda v: ("session.replaceMessages", {"sessionId": v["sid"], "messages": [msg("r2", "two")]})),
    "session.appendCompaction": S(
        with_message,
        lambda v: {"sessionId": v["sid"], "compaction": {"id": "c1", "summary": "s", "throughMessageId": "m1",
                                                         "tokensBefore": 10}},
        lambda v: ("session.appendCompaction", {"sessionId": v["sid"], "compaction": {
            "id": "c1", "summary": "other", "throughMessageId": "m1", "tokensBefore": 10}}),
        count=count("SELECT COUNT(*) FROM compactions")),
    "session.fork": S(with_message, lambda v: {"sessionId": v["sid"]},
                      lambda v: ("session.fork", {"sessionId": v["sid"], "title": "T"}),
                      count=count("SELECT COUNT(*) FROM sessions")),
    "session.assistantEdit": S(
        with_turns, lambda v: {"sessionId": v["sid"], "messageId": "a1", "blocks": [{"type": "text", "text": "e"}]},
        lambda v: ("session.assistantEdit", {"sessionId": v["sid"], "messageId": "a1",
                                             "blocks": [{"type": "text", "text": "other"}]}),
        count=count("SELECT COUNT(*) FROM sessions")),
    "session.deleteMessage": S(with_message, lambda v: {"sessionId": v["sid"], "messageId": "m1"},
                               lambda v: ("session.deleteMessage", {"sessionId": v["sid"], "messageId": "m2"})),
    "session.restoreMessage": S(with_tombstone, lambda v: {"sessionId": v["sid"], "messageId": "m1"},
                                lambda v: ("session.restoreMessage", {"sessionId": v["sid"], "messageId": "m2"})),
    "secrets.set": S(nothing, lambda v: {"ref": "k", "value": "v"},
                     lambda v: ("secrets.set", {"ref": "k2", "value": "v"}), count=secret_version("k")),
    "secrets.delete": S(with_secret, lambda v: {"ref": "k1"}, lambda v: ("secrets.delete", {"ref": "k2"})),
    "attachments.put": S(
        nothing, lambda v: {"name": "a.txt", "mimeType": "text/plain", "dataBase64": DATA},
        lambda v: ("attachments.put", {"name": "b.txt", "mimeType": "text/plain", "dataBase64": DATA}),
        count=count("SELECT COUNT(*) FROM attachment_blobs")),
    "attachments.importFile": S(
        with_project_files, lambda v: {"path": v["folder"] + "/one.txt", "name": "one.txt", "sessionId": v["sid"]},
        lambda v: ("attachments.importFile", {"path": v["folder"] + "/two.txt", "name": "two.txt",
                                              "sessionId": v["sid"]}),
        count=count("SELECT COUNT(*) FROM attachment_blobs")),
    "attachments.ref": S(with_blob, lambda v: {"sha256": v["sha"], "sessionId": v["sid"]},
                         lambda v: ("attachments.ref", {"sha256": v["sha"], "sessionId": v["sid"], "messageId": "m"}),
                         count=count("SELECT COUNT(*) FROM attachment_refs")),
    "attachments.gc": S(with_blob, lambda v: {}, lambda v: ("attachments.gc", {"activeSessionId": v["sid"]})),
    "tasks.create": S(nothing, lambda v: {"title": "t", "prompt": "p"},
                      lambda v: ("tasks.create", {"title": "t", "prompt": "other"}),
                      count=count("SELECT COUNT(*) FROM scheduled_tasks")),
    "tasks.update": S(with_task, lambda v: {"taskId": v["task"], "title": "x"},
                      lambda v: ("tasks.update", {"taskId": v["task"], "title": "y"})),
    "tasks.delete": S(with_task, lambda v: {"taskId": v["task"]},
                      lambda v: ("tasks.delete", {"taskId": v["task2"]})),
    "tasks.startRun": S(with_task, lambda v: {"taskId": v["task"]},
                        lambda v: ("tasks.startRun", {"taskId": v["task2"]}),
                        count=count("SELECT COUNT(*) FROM task_runs")),
    "tasks.finishRun": S(with_run, lambda v: {"runId": v["run"], "status": "completed"},
                         lambda v: ("tasks.finishRun", {"runId": v["run"], "status": "error"})),
    "plans.submit": S(with_plan_session, submit_params,
                      lambda v: ("plans.submit", submit_params(v, "# Other plan\n")), count=artifact_files),
    "plans.respond": S(with_plan, lambda v: {"requestId": v["request"], "action": "reject"},
                       lambda v: ("plans.respond", {"requestId": v["request"], "action": "approve"})),
    "plans.startExecution": S(
        with_execution, lambda v: {"sessionId": v["sid"], "executionId": v["execution"], "turnId": "t2"},
        lambda v: ("plans.startExecution", {"sessionId": v["sid"], "executionId": v["execution"], "turnId": "t3"})),
    "plans.finishExecution": S(
        with_running_execution,
        lambda v: {"sessionId": v["sid"], "executionId": v["execution"], "turnId": "t2", "outcome": "completed"},
        lambda v: ("plans.finishExecution", {"sessionId": v["sid"], "executionId": v["execution"], "turnId": "t2",
                                             "outcome": "failed"})),
    "collab.deliver": S(with_two_sessions, deliver_params,
                        lambda v: ("collab.deliver", deliver_params(v, content="something else")),
                        count=count("SELECT COUNT(*) FROM session_collaboration_messages")),
    "collab.begin": S(
        with_delivery, lambda v: {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t1"},
        lambda v: ("collab.begin", {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t2"}),
        count=count("SELECT COUNT(*) FROM messages")),
    "collab.settle": S(
        with_begun_delivery,
        lambda v: {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t1", "status": "completed",
                   "result": "done"},
        lambda v: ("collab.settle", {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "t1",
                                     "status": "failed", "error": "no"}),
        count=count("SELECT COUNT(*) FROM session_collaboration_messages WHERE kind = 'completion'")),
    "collab.cancel": S(with_delivery, lambda v: {"deliveryId": v["delivery"]},
                       lambda v: ("collab.cancel", {"deliveryId": v["delivery2"]}),
                       count=count("SELECT COUNT(*) FROM turn_queue")),
    "approvals.request": S(
        with_turn, lambda v: {"sessionId": v["sid"], "turnId": "t1", "tool": "Bash", "risk": "low"},
        lambda v: ("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": "Edit", "risk": "low"}),
        count=count("SELECT COUNT(*) FROM approvals")),
    "approvals.respond": S(
        with_approval, lambda v: {"sessionId": v["sid"], "requestId": v["request"], "optionId": "allow_once"},
        lambda v: ("approvals.respond", {"sessionId": v["sid"], "requestId": v["request"], "optionId": "deny"}),
        count=decision_lines),
    "approvals.removeRule": S(with_rules, lambda v: {"ruleId": v["rule0"]},
                              lambda v: ("approvals.removeRule", {"ruleId": v["rule1"]}),
                              count=count("SELECT COUNT(*) FROM permission_rules")),
    "interactions.request": S(
        with_turn, lambda v: {"sessionId": v["sid"], "turnId": "t1", "question": "Q?", "allowFreeText": True},
        lambda v: ("interactions.request", {"sessionId": v["sid"], "turnId": "t1", "question": "Other?",
                                            "allowFreeText": True}),
        count=count("SELECT COUNT(*) FROM interactions")),
    "interactions.respond": S(
        with_interaction, lambda v: {"sessionId": v["sid"], "requestId": v["request"], "answer": {"text": "yes"}},
        lambda v: ("interactions.respond", {"sessionId": v["sid"], "requestId": v["request"],
                                            "answer": {"text": "no"}}),
        count=decision_lines),
    "projects.remove": S(with_projects, lambda v: {"projectId": v["a"]},
                         lambda v: ("projects.remove", {"projectId": v["b"]}),
                         count=count("SELECT COUNT(*) FROM projects")),
    "settings.set": S(nothing, lambda v: {"key": "k", "value": 1},
                      lambda v: ("settings.set", {"key": "k", "value": 2})),
    # configuration (issue 13)
    "settings.update": S(nothing, lambda v: {"ns": "ui", "values": {"a": 1}},
                         lambda v: ("settings.update", {"ns": "ui", "values": {"a": 2}}), count=kv_rows("ui")),
    "settings.delete": S(with_ui_keys, lambda v: {"ns": "ui", "key": "k1"},
                         lambda v: ("settings.delete", {"ns": "ui", "key": "k2"}), count=kv_rows("ui")),
    "workspace.open": S(with_files, lambda v: {"path": v["folder"]},
                        lambda v: ("workspace.open", {"path": v["folder"] + "/sub"}),
                        count=count("SELECT COUNT(*) FROM projects")),
    "projects.pin": S(with_projects, lambda v: {"projectId": v["a"], "pinned": True},
                      lambda v: ("projects.pin", {"projectId": v["b"], "pinned": True}),
                      count=count("SELECT COUNT(*) FROM projects WHERE pinned = 1")),
    "projectGroups.save": S(nothing, lambda v: {"name": "G", "roots": ["/work/g"]},
                            lambda v: ("projectGroups.save", {"name": "H", "roots": ["/work/h"]}),
                            count=kv_rows("projectGroups")),
    "projectGroups.delete": S(with_groups, lambda v: {"groupId": v["g1"]},
                              lambda v: ("projectGroups.delete", {"groupId": v["g2"]}),
                              count=kv_rows("projectGroups")),
    "projectGroups.setMemory": S(with_groups, lambda v: {"groupId": v["g1"], "memory": "remember"},
                                 lambda v: ("projectGroups.setMemory", {"groupId": v["g1"], "memory": "other"}),
                                 count=kv_rows("projectGroupMemory")),
    "skills.put": S(nothing, lambda v: {"name": "one", "version": "1", "source": "skill one"},
                    lambda v: ("skills.put", {"name": "two", "version": "1", "source": "skill two"}),
                    count=kv_rows("skills")),
    "skills.delete": S(with_skills, lambda v: {"name": "one"}, lambda v: ("skills.delete", {"name": "two"}),
                       count=kv_rows("skills")),
    "projectGroups.setInstructions": S(
        with_groups, lambda v: {"groupId": v["g1"], "instructions": "be brief"},
        lambda v: ("projectGroups.setInstructions", {"groupId": v["g1"], "instructions": "be long"}),
        count=kv_rows("projectGroupInstructions")),
    "providers.create": S(nothing, lambda v: {"id": "p1", "name": "one", "apiKey": "sk-1"},
                          # a secret alone never makes a request "different" (a replay must not confirm it)
                          lambda v: ("providers.create", {"id": "p1", "name": "two", "apiKey": "sk-1"}),
                          count=count("SELECT COUNT(*) FROM providers")),
    "providers.update": S(with_providers, lambda v: {"providerId": "p1", "apiKey": "key-new"},
                          lambda v: ("providers.update", {"providerId": "p2", "apiKey": "key-new"}),
                          count=secret_version("provider/p1")),
    "providers.delete": S(with_providers, lambda v: {"providerId": "p1"},
                          lambda v: ("providers.delete", {"providerId": "p2"}),
                          count=count("SELECT COUNT(*) FROM providers")),
    "providers.reorder": S(with_providers, lambda v: {"providerIds": ["p2", "p1"]},
                           lambda v: ("providers.reorder", {"providerIds": ["p1", "p2"]})),
    "providers.sync": S(nothing, lambda v: {"providers": [{"id": "a1", "name": "A"}]},
                        lambda v: ("providers.sync", {"providers": [{"id": "a2", "name": "B"}]}),
                        kind="plugin:acme", count=count("SELECT COUNT(*) FROM providers")),
    "models.add": S(with_providers, lambda v: {"providerId": "p1", "modelId": "m1"},
                    lambda v: ("models.add", {"providerId": "p1", "modelId": "m2"}),
                    count=count("SELECT COUNT(*) FROM models")),
    "models.remove": S(with_user_models, lambda v: {"providerId": "p1", "modelId": "m1"},
                       lambda v: ("models.remove", {"providerId": "p1", "modelId": "m2"}),
                       count=count("SELECT COUNT(*) FROM models")),
    "models.refresh": S(with_model_server, lambda v: {"providerId": "p1"},
                        lambda v: ("models.refresh", {"providerId": "p1", "timeoutMs": 5000}),
                        count=kv_rows("cache")),
    "plugins.register": S(nothing, lambda v: {"pluginId": "acme", "name": "Acme", "version": "1"},
                          lambda v: ("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "2"})),
    "plugins.setEnabled": S(with_plugins, lambda v: {"pluginId": "acme", "enabled": False},
                            lambda v: ("plugins.setEnabled", {"pluginId": "beta", "enabled": False})),
    "plugins.uninstall": S(with_plugins, lambda v: {"pluginId": "acme"},
                           lambda v: ("plugins.uninstall", {"pluginId": "beta"}),
                           count=count("SELECT COUNT(*) FROM kv WHERE ns LIKE 'plugin:%'")),
    "configSync.configure": S(nothing, lambda v: {"enabled": True, "webdavPassword": "pw-1"},
                              lambda v: ("configSync.configure", {"enabled": False, "webdavPassword": "pw-1"}),
                              count=secret_version("configSync/webdavPassword")),
    "configSync.export": S(with_sync_key, lambda v: {},
                           lambda v: ("configSync.configure", {"enabled": False})),
    "configSync.apply": S(with_bundles, lambda v: {"bundleBase64": v["b1"]},
                          lambda v: ("configSync.apply", {"bundleBase64": v["b2"]})),
    "import.sessions": S(with_claude_root, lambda v: {"source": "claude-code", "root": v["root"]},
                         lambda v: ("import.sessions", {"source": "claude-code", "root": v["root"], "dryRun": True}),
                         count=count("SELECT COUNT(*) FROM sessions")),
    "plugins.importSession": S(
        nothing, lambda v: {"sourceId": "chat", "externalId": "e1", "messages": [msg("m1", "from a plugin")]},
        lambda v: ("plugins.importSession", {"sourceId": "chat", "externalId": "e2", "messages": [msg("m1", "x")]}),
        kind="plugin:test-plugin", count=count("SELECT COUNT(*) FROM session_import_origins")),
    "sessions.trash": S(with_message, lambda v: {"sessionId": v["sid"]},
                        lambda v: ("sessions.restore", {"sessionId": v["sid"]}),
                        count=count("SELECT COUNT(*) FROM sessions WHERE deleted_at IS NOT NULL")),
    "sessions.restore": S(with_trashed, lambda v: {"sessionId": v["sid"]},
                          lambda v: ("sessions.trash", {"sessionId": v["sid"]}),
                          count=count("SELECT COUNT(*) FROM sessions WHERE deleted_at IS NOT NULL")),
    "sessions.purge": S(with_trashed, lambda v: {"sessionId": v["sid"]},
                        lambda v: ("sessions.restore", {"sessionId": v["sid"]}),
                        count=count("SELECT COUNT(*) FROM sessions")),
    "review.record": S(with_review_file, review_params,
                       lambda v: ("review.record", review_params(v, "call2")), count=review_snapshots()),
    "review.restore": S(with_review_snapshot, lambda v: {"sessionId": v["sid"], "snapshotId": v["snap"]},
                        lambda v: ("review.restore", {"sessionId": v["sid"], "snapshotId": "rv-" + "0" * 32}),
                        count=review_snapshots("restored")),
}
