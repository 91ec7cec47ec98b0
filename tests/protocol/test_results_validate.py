"""Every method's real result validates against its result model and the committed schema.

One host, every routed method called with a valid request after the state it
needs (``tests/pipeline/scenarios.py`` for the mutating ones, the table below
for reads), plus the connection methods. Each raw result, as the wire carried
it, must validate against

* its pydantic result model, and
* ``protocol/schema.json`` (the committed file), *closed*: every object of a
  named model may hold only the keys its schema declares — so a field the
  host sends but the schema omits (or one the schema names but the host
  spells differently, like ``position`` for ``seq``) fails here.

The test fails when a routed method has no request here, so a new method
cannot skip it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import trio

from protocol.blocks import BLOCK_MODELS
from protocol.methods import METHODS
from runtime.client import HostClient
from runtime.routes import ROUTES, Via
from tests.hostkit import client_for, inprocess_host
from tests.pipeline import scenarios as sc

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "protocol" / "schema.json").read_text("utf-8"))
OPEN_DEFS = {"Block", *(m.__name__ for m in BLOCK_MODELS.values()), "HostedSearchRound", "HostedSearchSource",
             "BootReport", "ToolTokenUsage", "Usage", "RunEnvironmentView", "ImportSessionReport"}
"""Records open by contract (blocks keep unknown keys, usage keeps provider keys, the boot report and an
import's per-session report grow counters)."""


def closed_defs() -> dict[str, Any]:
    defs = copy.deepcopy(SCHEMA["$defs"])
    for name, schema in defs.items():
        if name not in OPEN_DEFS and isinstance(schema.get("properties"), dict):
            schema["additionalProperties"] = False
    return defs


DEFS = closed_defs()


def check(method: str, result: Any) -> None:
    spec = METHODS[method]
    spec.result_model.model_validate(result)
    target = SCHEMA["methods"][method]["result"]
    jsonschema.Draft202012Validator({"$defs": DEFS, **target}).validate(result)


DATA_SHA256 = hashlib.sha256(base64.b64decode(sc.DATA)).hexdigest()
Read = tuple[sc.Setup, Callable[[sc.Vars], dict[str, Any]], str]


async def with_everything(c: HostClient, root: Path) -> sc.Vars:
    v = await sc.with_variants(c, root)
    sid = v["sid"]
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "tr1", "environment": {
        "version": 1, "model": {"id": "fake"}, "systemPrompt": "be brief", "credentialRefs": ["provider:fake"]}})
    await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "tr1", "message": {
        "id": "live1", "role": "assistant", "blocks": [{"type": "text", "text": "partial"}]}})
    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
        "id": "c1", "summary": "so far", "throughMessageId": "u1", "firstKeptMessageId": "u1",
        "tokensBefore": 10}})
    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u0"})
    await c.call("session.endTurn", {"sessionId": sid, "turnId": "tr1", "status": "completed",
                                     "usage": {"inputTokens": 3, "outputTokens": 5}})
    v.update(await sc.with_entries(c, root))
    v.update(await sc.with_run(c, root))
    await sc.with_secret(c, root)
    await c.call("settings.set", {"key": "theme", "value": {"dark": True}})
    await c.call("attachments.put", {"name": "a.txt", "mimeType": "text/plain", "dataBase64": sc.DATA})
    v["plan"] = await sc.with_plan(c, root / "plan")
    await sc.with_user_models(c, root)
    v.update(await sc.with_groups(c, root))
    await sc.with_plugins(c, root)
    await sc.with_skills(c, root)
    await c.call("settings.set", {"ns": "projectMemory", "key": "/work/one", "value": "remember"})
    v.update(await sc.with_files(c, root))
    await c.call("workspace.open", {"path": v["folder"]})
    v["rooted"] = await sc.new_session(c, projectPath=v["folder"])
    await sc.with_trashed(c, root)
    v["sid"] = sid
    return v


async def with_plugin_session(c: HostClient, root: Path) -> sc.Vars:
    await c.call("plugins.importSession", {"sourceId": "chat", "externalId": "e1",
                                           "messages": [sc.msg("m1", "from a plugin")]})
    return {}


def once(setup: sc.Setup) -> sc.Setup:
    """The rich state is built once per host; every read after the first reuses it."""
    made: list[sc.Vars] = []

    async def cached(c: HostClient, root: Path) -> sc.Vars:
        if not made:
            made.append(await setup(c, root))
        return made[0]

    return cached


EVERYTHING: sc.Setup = once(with_everything)


async def with_requests(c: HostClient, root: Path) -> sc.Vars:
    """A running turn with a pending approval, a rule, a pending question and a begun delivery."""
    v = {"sid": await sc.new_session(c), "src": await sc.new_session(c)}
    await c.call("session.startTurn", {"sessionId": v["sid"], "turnId": "rq1", "environment": {
        "version": 1, "model": {"id": "fake"}, "systemPrompt": "be brief"}})
    await c.call("approvals.request", {"sessionId": v["sid"], "turnId": "rq1", "tool": "Bash", "risk": "low"})
    asked = await c.call("approvals.request", {"sessionId": v["sid"], "turnId": "rq1", "tool": "Edit",
                                               "risk": "low"})
    await c.call("approvals.respond", {"sessionId": v["sid"], "optionId": "allow_session",
                                       "requestId": asked["request"]["requestId"]})
    await c.call("interactions.request", {"sessionId": v["sid"], "turnId": "rq1", "question": "Which?",
                                          "choices": [{"id": "a", "label": "A"}], "allowFreeText": True})
    v["delivery"] = (await c.call("collab.deliver", sc.deliver_params(v)))["delivery"]["id"]
    await c.call("collab.begin", {"sessionId": v["sid"], "deliveryId": v["delivery"], "turnId": "rq1"})
    return v


REQUESTS: sc.Setup = once(with_requests)

READS: dict[str, Read] = {
    "host.status": (sc.nothing, lambda v: {}, "test"),
    "host.createLoginCode": (sc.nothing, lambda v: {}, "cli"),
    "logs.append": (sc.nothing, lambda v: {"source": "agent", "category": "tools", "records": [{"msg": "x"}]},
                    "agent"),
    "session.list": (EVERYTHING, lambda v: {"limit": 50}, "test"),
    "session.get": (EVERYTHING, lambda v: {"sessionId": v["sid"], "messageLimit": 3, "contentLimit": 4}, "test"),
    "session.turnEnvironment": (EVERYTHING, lambda v: {"turnId": "tr1"}, "test"),
    "notifications.list": (EVERYTHING, lambda v: {}, "test"),
    "artifacts.list": (EVERYTHING, lambda v: {}, "test"),
    "audit.list": (REQUESTS, lambda v: {"sessionId": v["sid"]}, "test"),
    "session.queueList": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "session.listRevisions": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "session.tree": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "session.context": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "search.sessions": (EVERYTHING, lambda v: {"query": "second"}, "test"),
    "search.query": (EVERYTHING, lambda v: {"query": "second"}, "test"),
    "secrets.get": (EVERYTHING, lambda v: {"ref": "k1"}, "ui"),
    "secrets.list": (EVERYTHING, lambda v: {}, "test"),
    "attachments.estimate": (EVERYTHING, lambda v: {}, "test"),
    "attachments.get": (EVERYTHING, lambda v: {"sha256": DATA_SHA256}, "test"),
    "tasks.list": (EVERYTHING, lambda v: {}, "test"),
    "tasks.get": (EVERYTHING, lambda v: {"taskId": v["task"]}, "test"),
    "tasks.runs": (EVERYTHING, lambda v: {"taskId": v["task"]}, "test"),
    "plans.pending": (EVERYTHING, lambda v: {}, "test"),
    "projects.list": (EVERYTHING, lambda v: {}, "test"),
    "settings.get": (EVERYTHING, lambda v: {"key": "theme"}, "test"),
    "settings.getAll": (EVERYTHING, lambda v: {"ns": "app"}, "test"),
    "configSync.get": (EVERYTHING, lambda v: {}, "test"),
    "models.list": (EVERYTHING, lambda v: {"providerId": "p1"}, "test"),
    "plugins.list": (EVERYTHING, lambda v: {}, "test"),
    "projectGroups.get": (EVERYTHING, lambda v: {"groupId": v["g1"]}, "test"),
    "projectGroups.list": (EVERYTHING, lambda v: {}, "test"),
    "providers.get": (EVERYTHING, lambda v: {"providerId": "p1"}, "test"),
    "providers.list": (EVERYTHING, lambda v: {}, "test"),
    "session.resolvePath": (EVERYTHING, lambda v: {"sessionId": v["rooted"], "path": "src/a.py"}, "test"),
    "workspace.get": (EVERYTHING, lambda v: {}, "test"),
    "session.export": (EVERYTHING, lambda v: {"sessionId": v["sid"], "format": "md"}, "test"),
    "sessions.listTrashed": (EVERYTHING, lambda v: {}, "test"),
    "plugins.listSessions": (with_plugin_session, lambda v: {}, "plugin:acme"),
    "approvals.pending": (REQUESTS, lambda v: {"sessionId": v["sid"]}, "test"),
    "approvals.rules": (REQUESTS, lambda v: {}, "test"),
    "interactions.pending": (REQUESTS, lambda v: {}, "test"),
    "collab.list": (REQUESTS, lambda v: {"sessionId": v["sid"]}, "test"),
    "collab.get": (REQUESTS, lambda v: {"deliveryId": v["delivery"]}, "test"),
    "session.listTurns": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "session.verifyEnvironment": (REQUESTS, lambda v: {"sessionId": v["sid"], "turnId": "rq1"}, "test"),
    "usage.session": (EVERYTHING, lambda v: {"sessionId": v["sid"]}, "test"),
    "usage.history": (EVERYTHING, lambda v: {"days": 7}, "test"),
    "review.get": (sc.with_review_snapshot, lambda v: {"sessionId": v["sid"], "snapshotId": v["snap"],
                                                        "includeBefore": True}, "test"),
    "review.list": (sc.with_review_snapshot, lambda v: {"sessionId": v["sid"]}, "test"),
    "skills.list": (EVERYTHING, lambda v: {}, "test"),
    "skills.get": (EVERYTHING, lambda v: {"name": "one"}, "test"),
    "memories.list": (EVERYTHING, lambda v: {"limit": 1}, "test"),
    "plugins.listAssets": (EVERYTHING, lambda v: {}, "plugin:acme"),
    "plugins.getAsset": (EVERYTHING, lambda v: {"pluginId": "beta", "path": "README.md"}, "test"),
}


def test_every_routed_method_has_a_request_here() -> None:
    routed = {n for n, r in ROUTES.items() if r.via is not Via.CONNECTION}
    covered = set(READS) | {n for n in sc.SCENARIOS if METHODS[n].mutating}
    assert routed - covered == set()


def test_closed_schema_rejects_an_undeclared_key() -> None:
    """The closing has teeth: a message projected with ``position`` instead of ``seq`` fails."""
    good = {"id": "m1", "role": "user", "blocks": [], "seq": 1}
    ui = {"$defs": DEFS, "$ref": "#/$defs/UiMessage"}
    jsonschema.Draft202012Validator(ui).validate(good)
    errors = list(jsonschema.Draft202012Validator(ui).iter_errors({**good, "undeclaredField": 1}))
    assert errors and "undeclaredField" in errors[0].message


def _client(host: Any, kind: str) -> Any:
    """``kind`` is a clientKind, or ``plugin:<id>`` for a plugin connection (the scenarios' spelling)."""
    if kind.startswith("plugin:"):
        plugin = kind.split(":", 1)[1]
        return client_for(host, client_id=f"results-{plugin}", kind="plugin", plugin_id=plugin)
    return client_for(host, client_id=f"results-{kind}", kind=kind)


def _failure(method: str, result: Any) -> str | None:
    try:
        check(method, result)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"{method} (schema) at {where or '<root>'}: {exc.message}"
    except ValueError as exc:
        return f"{method} (model): {exc}"
    return None


async def _run(c_for: Callable[[str], Any], method: str, setup: sc.Setup, params: Callable[[sc.Vars], dict[str, Any]],
               kind: str, root: Path) -> str | None:
    await trio.Path(root).mkdir(parents=True, exist_ok=True)
    async with c_for(kind) as c:
        v = await setup(c, root)
        result = await c.call(method, params(v))
    return _failure(method, result)


async def test_every_result_validates_against_its_model_and_the_committed_schema(tmp_path: Path) -> None:
    failures: list[str | None] = []
    with trio.fail_after(240):
        async with inprocess_host(tmp_path / "data") as host:
            def c_for(kind: str) -> Any:
                return _client(host, kind)

            async with c_for("test") as c:
                failures.append(_failure("host.hello", c.hello))
                sub = await c.call("events.subscribe", {"topics": ["session.message"]})
                failures.append(_failure("events.subscribe", sub))
                failures.append(_failure("events.unsubscribe", await c.call(
                    "events.unsubscribe", {"subscriptionId": sub["subscriptionId"]})))
            for method, (setup, params, kind) in READS.items():
                failures.append(await _run(c_for, method, setup, params, kind, tmp_path / method))
        for method, scenario in sc.SCENARIOS.items():  # each on a fresh host: scenarios reuse turn ids
            if not METHODS[method].mutating:
                continue
            async with inprocess_host(tmp_path / f"data-{method}") as host:
                def c_for(kind: str) -> Any:
                    return _client(host, kind)

                failures.append(await _run(c_for, method, scenario.setup, scenario.params, scenario.kind,
                                           tmp_path / method))
    found = [f for f in failures if f is not None]
    assert found == [], "\n".join(found)
