"""protocol/README.md's examples, sent to a running host (a real process, shared by the module).

Each walk sets up the state an example needs, sends the documented request (ids adapted: the README's
``s_4f2a`` becomes the walk's own session, a host-made id such as ``q_2`` becomes the one the host
returned, ``/home/ada/src/parser`` a real directory), and checks that the reply has the documented shape
(tests/protocol/shapekit.py: the keys the schema requires, no undocumented key, the documented JSON types,
the example's types). Documented error cases are checked for their code, which must be one the method
lists. Subscriptions are checked for the documented events and payload keys."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import re
import shutil
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import ClientEvent, HostClient, RpcError, open_client
from tests.hostkit import HostProcess, start_host_process
from tests.httpkit import FakeProvider, Reply
from tests.protocol.shapekit import documented_errors, event_schema, result_schema, shape_errors
from tests.samplekit import sample_files

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "export_schema.py"


def _load_examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_schema_live", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DOC = _load_examples()
EXAMPLES: Mapping[str, tuple[dict[str, Any], dict[str, Any]]] = DOC.EXAMPLES
EVENT_EXAMPLES: Mapping[str, dict[str, Any]] = DOC.EVENT_EXAMPLES
ID_KEYS_SKIPPED = frozenset({"clientId", "bootId"})
GLOBAL_IDS = ("t_9", "t_10", "t_11", "t_40", "m_1", "m_2", "m_7", "m_14", "call_3", "call_4")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    proc = start_host_process(tmp_path_factory.mktemp("readme-live"))
    try:
        yield proc
    finally:
        proc.terminate()


class Walk:
    """A client per role, the example ids mapped to live ones, and the checks."""

    def __init__(self, clients: Mapping[str, HostClient], ids: dict[Any, Any]) -> None:
        self.clients = clients
        self.ids = ids

    def adapt(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: self.adapt(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self.adapt(v, key) for v in value]
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and key is not None:
            return self.ids.get((key, value), value)
        if isinstance(value, str):
            if value in self.ids:
                return self.ids[value]
            for doc_path, live_path in self.ids.items():  # a path under a mapped project root
                if isinstance(doc_path, str) and doc_path.startswith("/") and value.startswith(doc_path + "/"):
                    return live_path + value[len(doc_path):]
        return value

    def learn(self, doc: Any, live: Any) -> None:
        """Host-made ids the example shows map to the ones the host returned."""
        if isinstance(doc, dict) and isinstance(live, dict):
            for key in doc.keys() & live.keys():
                d, v = doc[key], live[key]
                if (key == "id" or key.endswith("Id")) and key not in ID_KEYS_SKIPPED and d != v \
                        and type(d) is type(v) and isinstance(d, (str, int)):
                    if isinstance(d, str):
                        self.ids.setdefault(d, v)
                    else:
                        self.ids.setdefault((key, d), v)
                        self.ids.setdefault(("id", d), v)
                self.learn(d, v)
        elif isinstance(doc, list) and isinstance(live, list) and doc and live:
            self.learn(doc[0], live[0])

    async def call(self, name: str, *, over: Mapping[str, Any] | None = None, drop: tuple[str, ...] = (),
                   by: str = "agent", learn: bool = True) -> Any:
        params, result = EXAMPLES[name]
        sent = {k: v for k, v in self.adapt(params).items() if k not in drop}
        sent.update(self.adapt(dict(over or {})))
        try:
            live = await self.clients[by].call(name, sent)
        except RpcError as exc:
            raise AssertionError(f"{name} {sent}: {exc.data_code} {exc}") from exc
        errors = shape_errors(result_schema(name), live, result)
        assert not errors, f"{name}: the reply departs from the README: {errors}"
        if learn:
            self.learn(result, live)
        return live

    async def error(self, name: str, params: Mapping[str, Any], code: str, *, by: str = "agent") -> None:
        assert code in documented_errors(name), f"{code} is not among {name}'s documented errors"
        with pytest.raises(RpcError) as exc:
            await self.clients[by].call(name, self.adapt(dict(params)))
        assert exc.value.data_code == code, f"{name}: {exc.value.data_code} {exc.value}"


def check_event(event: ClientEvent) -> None:
    errors = shape_errors(event_schema(event.topic), event.data, EVENT_EXAMPLES[event.topic])
    assert not errors, f"{event.topic}: the payload departs from the README: {errors}"


async def events_until(client: HostClient, topics: set[str]) -> dict[str, ClientEvent]:
    """The first event of each topic (checked against the README as it comes)."""
    seen: dict[str, ClientEvent] = {}
    with trio.fail_after(15):
        while not topics <= seen.keys():
            event = await client.next_event()
            check_event(event)
            seen.setdefault(event.topic, event)
    return seen


@asynccontextmanager
async def walk(host: HostProcess, tmp_path: Path, session_id: str) -> AsyncIterator[Walk]:
    parser, lexer = tmp_path / "parser", tmp_path / "lexer"
    parser.mkdir()
    lexer.mkdir()
    ids: dict[Any, Any] = {"s_4f2a": session_id, "/home/ada/src/parser": str(parser),
                           "/home/ada/src/lexer": str(lexer)}
    ids.update({doc_id: f"{doc_id}.{session_id}" for doc_id in GLOBAL_IDS})  # turn and message ids are host-wide
    async with open_client(host.url, host.token, client_id=f"agent-{session_id}", client_kind="agent") as agent, \
            open_client(host.url, host.token, client_id=f"ui-{session_id}", client_kind="ui") as ui, \
            open_client(host.url, host.token, client_id=f"acme-{session_id}", client_kind="plugin",
                        plugin_id="acme.tools") as plugin:
        yield Walk({"agent": agent, "ui": ui, "plugin": plugin}, ids)


async def make_session(w: Walk, **over: Any) -> dict[str, Any]:
    live: dict[str, Any] = await w.call("session.create", over={"sessionId": w.ids["s_4f2a"], **over})
    return live


# ---------------------------------------------------------------------------
# The walks


async def test_host_methods(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_host") as w:
        hello = w.clients["ui"].hello
        assert not shape_errors(result_schema("host.hello"), hello, EXAMPLES["host.hello"][1])
        await w.call("host.status")
        await w.call("host.createLoginCode", by="ui")
        await w.call("logs.append")
        hello_params = {**EXAMPLES["host.hello"][0], "token": host.token}
        await w.error("host.hello", hello_params, "ALREADY_AUTHENTICATED")

        # section 1: host.json as documented
        info = json.loads((host.data_dir / "host.json").read_text(encoding="utf-8"))
        assert {"pid", "url", "tokenFile", "startedAt"} <= info.keys()
        assert (await trio.Path(info["tokenFile"]).read_text(encoding="utf-8")).strip() == host.token
        # section 3: the error object as documented
        bad = {"sessionId": "s_host", "message": {"id": "m_x", "role": "user", "blocks": [{"type": "text"}]}}
        with pytest.raises(RpcError) as exc:
            await w.clients["agent"].call("session.appendMessage", bad)
        assert exc.value.code == -32602 and exc.value.data_code == "INVALID_PARAMS"
        assert exc.value.data["retriable"] is False
        assert exc.value.data["errors"] and all({"loc", "msg", "type"} <= e.keys() for e in exc.value.data["errors"])


async def test_session_and_turn_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_turns") as w:
        ui = w.clients["ui"]
        await ui.call("events.subscribe", {"topics": ["session.created", "session.updated", "session.deleted"]})
        await make_session(w)
        await w.call("session.list")
        await w.call("session.rename")
        await w.call("session.update")
        await w.call("events.subscribe", drop=("cursor",), by="ui",
                     over={"topics": ["session.message", "turn.started", "turn.ended", "session.inflight",
                                      "notification.created", "session.updated"]})
        await w.call("session.startTurn")
        await w.call("session.turnEnvironment")
        await w.call("session.saveInflightMessage")
        get = await w.call("session.get", over={"messageLimit": 2})
        assert get["inflight"]["turnId"] == w.ids["t_9"]
        await w.call("session.appendMessage")
        await w.call("session.endTurn")
        await events_until(ui, {"session.created", "session.updated", "turn.started", "session.message",
                                "turn.ended", "session.inflight", "notification.created"})
        await w.call("session.listTurns")
        await w.call("usage.session")
        await w.call("usage.history")
        await w.call("notifications.list")
        await w.call("notifications.markRead", by="ui")
        await w.call("notifications.markAllRead", by="ui")
        await w.call("notifications.clear", by="ui")
        sub = await ui.call("events.subscribe", {"topics": ["session.deleted"]})
        await w.call("events.unsubscribe", over={"subscriptionId": sub["subscriptionId"]}, by="ui")
        await w.error("events.unsubscribe", {"subscriptionId": sub["subscriptionId"]}, "NOT_FOUND", by="ui")
        await w.error("session.get", {"sessionId": "s_nowhere"}, "SESSION_NOT_FOUND")
        await w.error("session.endTurn", {**EXAMPLES["session.endTurn"][0], "turnId": "t_nowhere"}, "NOT_FOUND")
        await w.error("session.create", {"sessionId": w.ids["s_4f2a"]}, "CONFLICT")
        await w.call("session.delete")
        await events_until(ui, {"session.deleted"})


async def test_inflight_recovery_example(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_lost") as w:
        await make_session(w)
        await w.call("session.startTurn", over={"turnId": "t_10"})
        await w.call("session.saveInflightMessage", over={"turnId": "t_10", "message": {
            **EXAMPLES["session.saveInflightMessage"][0]["message"], "id": "m_14", "turnId": "t_10"}})
        live = await w.call("session.recoverInflight")
        assert live["action"] == "promoted"


async def test_queue_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_queue") as w:
        ui = w.clients["ui"]
        await make_session(w)
        await ui.call("events.subscribe", {"topics": ["session.queue"], "sessionId": w.ids["s_4f2a"]})
        await w.call("session.queuePush", by="ui")
        await events_until(ui, {"session.queue"})
        await w.call("session.queueList")
        await w.call("session.queueAttach")
        second = await w.call("session.queuePush", by="ui", over={"idempotencyKey": "k-18"}, learn=False)
        await w.call("session.queueReorder", over={"entryId": second["entry"]["id"]})
        await w.call("session.queuePrioritize")
        await w.error("session.queueReorder", EXAMPLES["session.queueReorder"][0], "CONFLICT")
        await w.call("session.queueRemove", over={"entryId": second["entry"]["id"]})
        await w.call("session.queueTake")
        await w.error("session.queueRemove", EXAMPLES["session.queueRemove"][0], "NOT_FOUND")


async def test_history_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_hist") as w:
        await make_session(w)
        user = EXAMPLES["session.replaceMessages"][0]["messages"][0]
        await w.call("session.appendMessage", over={"message": user}, drop=("submissionId",))
        await w.call("session.startTurn", drop=("environment",))
        await w.call("session.appendMessage")
        await w.call("session.endTurn")
        await w.call("session.tree")
        await w.call("session.context")
        await w.call("search.sessions")
        await w.call("search.query")
        await w.call("artifacts.list")
        await w.call("audit.list")
        await w.call("session.saveActiveRevision")
        await w.call("session.listRevisions")
        await w.call("session.activateRevision")
        await w.call("session.fork")
        await w.call("session.updateMetadata", by="ui")
        await w.call("session.deleteMessage")
        await w.call("session.restoreMessage")
        await w.call("session.appendCompaction")
        await w.call("session.export")
        await w.call("session.assistantEdit", by="ui")
        await w.call("session.truncateFrom")
        await w.call("session.replaceMessages")
        await w.error("session.deleteMessage", {"sessionId": "s_4f2a", "messageId": "m_nowhere"},
                      "MESSAGE_NOT_FOUND")
        await w.call("sessions.trash", by="ui")
        await w.call("sessions.listTrashed", by="ui")
        await w.call("sessions.restore", by="ui")
        await w.call("sessions.trash", by="ui", over={"submissionId": "tr-2"})
        await w.call("sessions.purge", by="ui")


async def test_attachment_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_att") as w:
        await make_session(w)
        await w.call("session.appendMessage", over={"message": EXAMPLES["session.replaceMessages"][0]["messages"][0]})
        put = await w.call("attachments.put")
        data = base64.b64decode(EXAMPLES["attachments.put"][0]["dataBase64"])
        assert put["sha256"] == hashlib.sha256(data).hexdigest()
        # The README's follow-up calls name the blob by the sha256 its put example shows.
        assert EXAMPLES["attachments.put"][1]["sha256"] == put["sha256"]
        await w.call("attachments.ref")
        await w.call("attachments.get")
        await w.call("attachments.estimate")
        await w.call("attachments.gc")
        video = host.data_dir / "scratch" / "demo.mp4"  # a folder the host may read for a client
        video.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(64))
        await w.call("attachments.importFile", over={"path": str(video)})


async def test_settings_and_project_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_proj") as w:
        ui = w.clients["ui"]
        await ui.call("events.subscribe", {"topics": ["settings.changed"]})
        await w.call("settings.set", by="ui")
        await events_until(ui, {"settings.changed"})
        await w.call("settings.get")
        await w.call("settings.getAll")
        await w.call("settings.update", by="ui")
        await w.call("settings.delete", by="ui")
        await w.call("workspace.open", by="ui")
        await w.call("workspace.get")
        await make_session(w)
        await w.call("projects.list")
        await w.call("session.resolvePath")
        await w.call("projects.pin", by="ui")
        await w.call("projectGroups.save", by="ui")
        await w.call("projectGroups.list")
        await w.call("projectGroups.setMemory", by="ui")
        await w.call("projectGroups.setInstructions", by="ui")
        await w.call("projectGroups.get")
        await w.call("projectGroups.delete", by="ui")
        await w.call("projects.remove", by="ui", over={"submissionId": f"rm-{w.ids['s_4f2a']}"})


async def test_provider_secret_and_config_examples(host: HostProcess, tmp_path: Path) -> None:
    listed = [{"id": "anthropic/claude-sonnet-4", "name": "Claude Sonnet 4", "context_length": 200000}]
    with FakeProvider(Reply(models=listed)) as server:  # the provider the examples name, on 127.0.0.1
        async with walk(host, tmp_path, "s_prov") as w:
            ui = w.clients["ui"]
            w.ids["https://openrouter.ai/api/v1"] = server.base_url
            await ui.call("events.subscribe", {"topics": ["providers.changed", "models.changed"]})
            await w.call("secrets.set", by="ui")
            await w.call("secrets.get")
            await w.call("secrets.list")
            await w.call("secrets.delete", by="ui")
            await w.call("providers.create", by="ui")
            await w.call("providers.list")
            await w.call("providers.get")
            await w.call("providers.update", by="ui")
            await w.call("models.refresh", by="ui")
            await w.call("models.add", by="ui")
            await events_until(ui, {"providers.changed", "models.changed"})
            await w.call("models.list")
            await w.call("models.remove", by="ui")
            await w.call("providers.reorder", by="ui")
            await w.call("providers.delete", by="ui")
            await w.error("providers.get", EXAMPLES["providers.get"][0], "NOT_FOUND")
            await w.call("skills.put", by="ui")
            await w.call("skills.list")
            await w.call("skills.get")
            await w.call("skills.delete", by="ui")
            await w.call("memories.list")
            await w.call("configSync.get")
            await w.error("configSync.export", EXAMPLES["configSync.export"][0], "CONFLICT", by="ui")


async def test_task_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_task") as w:
        await make_session(w)
        await w.call("tasks.create", by="ui")
        await w.call("tasks.update", by="ui")
        await w.call("tasks.list")
        await w.call("tasks.get")
        await w.call("tasks.startRun")
        await w.call("tasks.finishRun")
        await w.call("tasks.runs")
        await w.call("tasks.delete", by="ui")
        await w.error("tasks.get", EXAMPLES["tasks.get"][0], "NOT_FOUND")


async def test_approval_interaction_and_plan_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_ask") as w:
        ui, agent = w.clients["ui"], w.clients["agent"]
        await make_session(w)
        sid = w.ids["s_4f2a"]
        await ui.call("events.subscribe", {"topics": ["approval.requested", "interaction.requested",
                                                      "plan.requested"], "sessionId": sid})
        await agent.call("events.subscribe", {"topics": ["approval.resolved", "interaction.resolved",
                                                         "plan.resolved"], "sessionId": sid})
        await w.call("secrets.set", by="ui", over={"submissionId": f"sec-{sid}"})
        await w.call("session.startTurn", over={"turnId": "t_10"})
        await w.call("session.verifyEnvironment", over={"turnId": "t_10"})
        await w.call("approvals.request", over={"expiresAt": 4102444800000})
        await w.call("approvals.pending", by="ui")
        await w.call("approvals.respond", by="ui")
        await w.call("approvals.rules")
        await w.call("approvals.removeRule", by="ui")
        await w.call("interactions.request")
        await w.call("interactions.pending", by="ui")
        await w.call("interactions.respond", by="ui")
        await events_until(ui, {"approval.requested", "interaction.requested"})
        await events_until(agent, {"approval.resolved", "interaction.resolved"})
        await w.error("approvals.respond", {**EXAMPLES["approvals.respond"][0], "submissionId": "ui-a-18"},
                      "CONFLICT", by="ui")  # answered already
        await w.call("session.endTurn", over={"turnId": "t_10"})
        await w.call("session.update", over={"mode": "plan"})
        await w.call("session.startTurn", drop=("environment",))
        await w.call("plans.submit", over={"expiresAt": 4102444800000})
        await w.call("plans.pending", by="ui")
        await w.call("plans.respond", by="ui")
        await events_until(ui, {"plan.requested"})
        await events_until(agent, {"plan.resolved"})


async def test_plan_execution_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_exec") as w:
        ui = w.clients["ui"]
        await make_session(w, mode="plan")
        await ui.call("events.subscribe", {"topics": ["plan.execution"], "sessionId": w.ids["s_4f2a"]})
        await w.call("session.startTurn", drop=("environment",))
        await w.call("plans.submit", over={"expiresAt": 4102444800000})
        await w.call("plans.respond", by="ui")
        await w.call("session.endTurn")
        await w.call("session.startTurn", drop=("environment",), over={"turnId": "t_11"})
        await w.call("plans.startExecution")
        await events_until(ui, {"plan.execution"})
        await w.call("plans.finishExecution")


async def test_review_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_review") as w:
        await make_session(w)
        notes = Path(w.ids["/home/ada/src/parser"]) / "docs" / "notes.md"
        notes.parent.mkdir()
        notes.write_text("# Notes\n\nSplit it.\n")  # what the Edit tool wrote over "# Notes\n"
        recorded = await w.call("review.record")
        assert recorded["snapshot"]["before"] == EXAMPLES["review.record"][1]["snapshot"]["before"]
        await w.call("review.get")
        await w.call("review.list")
        await w.call("review.restore")
        assert notes.read_bytes() == base64.b64decode(EXAMPLES["review.record"][0]["beforeBase64"])


async def test_plugin_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_plug") as w:
        registered = await w.call("plugins.register", by="ui")
        # the example's digest is the one of the bytes it installs
        assert registered["assets"] == EXAMPLES["plugins.register"][1]["assets"]
        await w.call("plugins.list")
        await w.call("plugins.listAssets")
        await w.call("plugins.getAsset", by="plugin")
        await w.call("providers.sync", by="plugin")
        await w.call("plugins.importSession", by="plugin",
                     over={"sourceId": "chatlog", "externalId": "conv-81"})
        await w.call("plugins.listSessions", by="plugin")
        await w.call("plugins.setEnabled", by="ui")
        await w.call("plugins.uninstall", by="ui")


async def test_collaboration_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_lead") as w:
        agent = w.clients["agent"]
        w.ids["s_9c07"] = "s_reviewer"
        await make_session(w)
        await w.call("session.create", over={"sessionId": "s_reviewer", "title": "Reviewer"},
                     drop=("submissionId",), learn=False)
        await agent.call("events.subscribe", {"topics": ["collab.delivery"], "sessionId": "s_reviewer"})
        await w.call("collab.deliver", by="agent")
        await w.call("session.queueAttach", over={"sessionId": "s_reviewer"}, learn=False)
        await agent.call("session.queueTake", {"sessionId": "s_reviewer", "controllerId": "agent-1"})
        await w.call("session.startTurn", drop=("environment",),
                     over={"sessionId": "s_reviewer", "turnId": "t_40"}, learn=False)
        await w.call("collab.begin")
        await events_until(agent, {"collab.delivery"})
        await w.call("collab.settle")
        await w.call("collab.list")
        await w.call("collab.get")
        second = await w.call("collab.deliver", by="agent", over={"idempotencyKey": "review-18"}, learn=False)
        await w.call("collab.cancel", over={"deliveryId": second["delivery"]["id"]}, by="agent")


async def test_config_sync_and_import_examples(host: HostProcess, tmp_path: Path) -> None:
    async with walk(host, tmp_path, "s_sync") as w:
        await w.call("configSync.configure", by="ui")
        await w.call("configSync.get")
        exported = await w.call("configSync.export", by="ui")
        await w.call("configSync.apply", by="ui", over={"bundleBase64": exported["bundleBase64"]})
        root = tmp_path / "claude-projects"
        sample = sample_files("claude-code")[0]
        (root / "-work-sample").mkdir(parents=True)
        shutil.copy(sample, root / "-work-sample" / sample.name)
        w.ids["/home/ada/.claude/projects"] = str(root)
        ui = w.clients["ui"]
        await ui.call("events.subscribe", {"topics": ["import.progress"]})
        await w.call("import.sessions", by="ui", over={"importId": f"imp-{w.ids['s_4f2a']}"})
        await events_until(ui, {"import.progress"})


def test_every_method_example_is_walked() -> None:
    """A method added to the protocol gets its README example sent here too."""
    walked = set(re.findall(r'w\.(?:call|error)\(\s*"([A-Za-z.]+)"', Path(__file__).read_text(encoding="utf-8")))
    assert walked == set(METHODS)


async def test_prose_examples(host: HostProcess, tmp_path: Path) -> None:
    """The request examples in the README's prose (sections 5, 6)."""
    async with walk(host, tmp_path, "s_prose") as w:
        agent = w.clients["agent"]
        await make_session(w)
        logged = await agent.call("logs.append", {"source": "agent", "category": "tools", "records": [
            {"level": "info", "msg": "bash finished", "sessionId": "s_4f2a"}]})
        assert not shape_errors(result_schema("logs.append"), logged, EXAMPLES["logs.append"][1])
        assert logged["written"] == 1 and logged["file"] == "logs/agent/tools.ndjson"
        turn = await agent.call("session.startTurn", w.adapt(
            {"sessionId": "s_4f2a", "turnId": "t_9", "environment": {
                "version": 1, "executionBindings": {"modelId": "claude-sonnet-4"}},
             "input": {"messageId": "m_7", "blocks": [{"type": "text", "text": "Split the tokenizer."}]}}))
        assert not shape_errors(result_schema("session.startTurn"), turn, EXAMPLES["session.startTurn"][1])
        context = await agent.call("session.context", {"sessionId": w.ids["s_4f2a"]})
        assert not shape_errors(result_schema("session.context"), context, EXAMPLES["session.context"][1])
        assert context["turnContext"]["turnId"] == w.ids["t_9"]
        assert {"turnId", "version", "digest", "snapshot"} <= context["turnContext"].keys()
        found = await agent.call("search.query", {"query": "ECONNREFUSED", "scope": "tools", "limit": 20})
        assert not shape_errors(result_schema("search.query"), found, EXAMPLES["search.query"][1])


def _field(data: Mapping[str, Any], key: str) -> Any:
    if key == "messageId":  # session.message: the message ref's id
        return data["message"]["id"]
    return data.get(key)


async def next_of(client: HostClient, topic: str, **match: Any) -> ClientEvent:
    """The next ``topic`` event whose data matches (other events pass, each checked against the README)."""
    with trio.fail_after(15):
        while True:
            event = await client.next_event()
            check_event(event)
            if event.topic == topic and all(_field(event.data, k) == v for k, v in match.items()):
                return event


def recipe_ui_topics() -> list[str]:
    readme = (SCRIPT.parents[1] / "protocol" / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## 11. One turn, end to end"):readme.index("# Reference")]
    row = re.search(r'^\| `events\.subscribe \{topics: \[([^\]]*)\], sessionId\}` \|', section, re.M)
    assert row is not None, "section 11 no longer has the UI's subscription row"
    return re.findall(r'"([a-z.]+)"', row.group(1))


async def test_one_turn_recipe_of_section_11(host: HostProcess, tmp_path: Path) -> None:
    """protocol/README.md section 11, step by step as the table writes it (raw calls, no SDK)."""
    with FakeProvider(Reply(models=[])) as server:
        async with walk(host, tmp_path, "s_recipe") as w:
            ui, agent = w.clients["ui"], w.clients["agent"]
            await ui.call("providers.create", {"id": "recipe", "name": "Recipe", "baseUrl": server.base_url,
                                               "apiKey": "sk-recipe-0123456789"})
            # UI: session.create {title, projectPath} (and the provider the sidecar will look up)
            session = await ui.call("session.create", {"title": "One turn",
                                                       "projectPath": w.ids["/home/ada/src/parser"],
                                                       "providerId": "recipe", "modelId": "m-1"})
            sid = session["id"]
            # sidecar: events.subscribe {topics: ["session.queue"]}
            await agent.call("events.subscribe", {"topics": ["session.queue"]})
            # UI: events.subscribe {topics: [...], sessionId}, the topics as the table lists them
            await ui.call("events.subscribe", {"topics": recipe_ui_topics(), "sessionId": sid})
            # UI: session.queuePush {sessionId, principal: "user", content, permissionMode}
            await ui.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "List the files",
                                                "permissionMode": "ask"})
            # sidecar: gets session.queue with the entry; queueAttach; queueTake -> entry
            queued = await next_of(agent, "session.queue", sessionId=sid)
            assert queued.data["entries"]
            await agent.call("session.queueAttach", {"sessionId": sid, "controllerId": "sidecar-1"})
            entry = (await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "sidecar-1"}))["entry"]
            assert entry["content"] == "List the files"
            # sidecar: startTurn with the endpoint from providers.get and the key from secrets.get
            provider = (await agent.call("providers.get", {"providerId": session["providerId"]}))["provider"]
            key = (await agent.call("secrets.get", {"ref": provider["secretRef"]}))["value"]
            assert key == "sk-recipe-0123456789"
            turn_id = f"turn-{entry['id']}"
            await agent.call("session.startTurn", {
                "sessionId": sid, "turnId": turn_id, "providerId": provider["id"], "modelId": session["modelId"],
                "environment": {"version": 1, "connection": {"baseUrl": provider["baseUrl"]},
                                "credentialRefs": [provider["secretRef"]]},
                "submissionId": f"start-{turn_id}"})
            # sidecar: appendMessage the user's prompt (turnId; an id derived from the entry)
            prompt_id = f"prompt-{entry['id']}"
            prompt = {"id": prompt_id, "role": "user", "blocks": [{"type": "text", "text": entry["content"]}]}
            await agent.call("session.appendMessage", {"sessionId": sid, "turnId": turn_id, "submissionId": prompt_id,
                                                       "message": prompt})
            # sidecar: session.context -> messages and this turn's environment as turnContext
            context = await agent.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in context["messages"]] == [prompt_id]
            assert context["turnContext"]["turnId"] == turn_id
            # sidecar: checkpoints while the model streams; UI: session.inflight
            reply_id = f"reply-{entry['id']}"
            await agent.call("session.saveInflightMessage", {"sessionId": sid, "turnId": turn_id, "message": {
                "id": reply_id, "role": "assistant", "turnId": turn_id, "blocks": [{"type": "text", "text": "Look"}]}})
            await next_of(ui, "session.inflight")
            # sidecar: approval.resolved subscription, then approvals.request; UI answers approval.requested
            await agent.call("events.subscribe", {"topics": ["approval.resolved"], "sessionId": sid})
            asked = (await agent.call("approvals.request", {
                "sessionId": sid, "turnId": turn_id, "toolCallId": "call-ls", "tool": "Bash", "argsSummary": "ls",
                "risk": "low", "submissionId": "ask-call-ls"}))["request"]
            shown = await next_of(ui, "approval.requested")
            assert shown.data["request"]["requestId"] == asked["requestId"]
            await ui.call("approvals.respond", {"sessionId": sid, "requestId": asked["requestId"],
                                                "optionId": "allow_once"})
            resolved = await next_of(agent, "approval.resolved")
            assert resolved.data["request"]["status"] == "allowed"
            # sidecar: the tool row, then the final reply (same id as the checkpoints), then endTurn
            await agent.call("session.appendMessage", {"sessionId": sid, "submissionId": "tool-ls", "message": {
                "id": f"tool-{entry['id']}", "role": "assistant", "turnId": turn_id, "blocks": [
                    {"type": "tool_call", "callId": "call-ls", "name": "Bash", "args": {"command": "ls"},
                     "status": "ok", "result": "README.md"}]}})
            await agent.call("session.appendMessage", {"sessionId": sid, "submissionId": reply_id, "message": {
                "id": reply_id, "role": "assistant", "turnId": turn_id,
                "blocks": [{"type": "text", "text": "One file: README.md"}]}})
            got = await next_of(ui, "session.message", messageId=reply_id)  # the final reply
            assert got.data["record"]["blocks"] == [{"type": "text", "text": "One file: README.md"}]
            ended = await agent.call("session.endTurn", {"sessionId": sid, "turnId": turn_id, "status": "completed",
                                                         "usage": {"inputTokens": 10, "outputTokens": 5}})
            assert ended["turn"]["status"] == "completed"
            final = await next_of(ui, "turn.ended")
            assert final.data["turn"]["id"] == turn_id
            # then queueTake again: nothing waits
            assert (await agent.call("session.queueTake", {"sessionId": sid, "controllerId": "sidecar-1"})).get(
                "entry") is None
            window = await ui.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in window["messages"]][-1] == reply_id


async def test_example_requests_fail_only_with_documented_codes(tmp_path: Path) -> None:
    """Every example request, verbatim, from each kind of connection to a host that holds none of the
    examples' state: whatever fails, fails with a code the method lists (a plugin connection is refused
    what section 8.5 does not open to it, PERMISSION_DENIED)."""
    own = start_host_process(tmp_path / "data")
    try:
        undocumented: list[str] = []
        for kind, plugin_id in (("ui", None), ("agent", None), ("plugin", "acme.tools")):
            async with open_client(own.url, own.token, client_id=f"sweep-{kind}", client_kind=kind,
                                   plugin_id=plugin_id) as client:
                for name in sorted(METHODS):
                    try:
                        await client.call(name, EXAMPLES[name][0])
                    except RpcError as exc:
                        if exc.data_code not in documented_errors(name):
                            undocumented.append(f"{kind} {name}: {exc.data_code} ({exc})")
        assert not undocumented
    finally:
        own.terminate()
