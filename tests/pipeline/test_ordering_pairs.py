"""Ordering for every pair of route kinds, generated from the route table.

The promise (``protocol/README.md`` "Ordering"; ``runtime/ordering.py``): a
connection's request takes effect after every earlier mutating request of that
connection, whatever the targets — a read sees the writes sent before it, two
writes apply in frame order. A route's *kind* is its target (``runtime/routes.py``
``Via``) and whether it mutates; the classes to test are every mutating kind
followed by every kind. Each class has concrete pairs — a write, then a request
that must observe it — sent in several rounds both as one JSON-RPC batch and as
pipelined frames, on one connection, without waiting between them.

Reproduces issue 22: reads and host routes were started as background tasks and
writer routes answered once queued, so ``[settings.set, settings.get]``,
``[session.rename, session.list]``, ``[secrets.set, secrets.list]``,
``[tasks.update, tasks.get]`` and the like read stale state in most rounds.

Every route of ``ROUTES`` is either in a pair or classified in ``KINDS`` (its kind,
checked against the table): a route added without either fails the suite, and
so does a new kind pair without a case or a stated reason in ``NO_PAIR``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import HostClient, RpcError
from runtime.routes import ROUTES, Via
from tests.hostkit import client_for, inprocess_host, msg
from tests.pipeline.scenarios import (
    Vars,
    new_session,
    nothing,
    one_session,
    with_task,
    with_turn,
)

ROUNDS = 6

Calls = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Pair:
    """A write and a request that must observe it.

    ``prepare`` runs before each round (sequential calls: fresh state for the round);
    ``check`` gets the pair's results (an :class:`RpcError` in place of a failure) and
    raises ``AssertionError`` when the second did not observe the first."""

    setup: Callable[[HostClient, Path], Awaitable[Vars]]
    calls: Callable[[Vars, int], Calls]
    check: Callable[[HostClient, Vars, int, list[Any]], Awaitable[None]]
    prepare: Callable[[HostClient, Path, Vars, int], Awaitable[None]] | None = None
    kind: str = "test"


def kind_of(method: str) -> str:
    """A route's kind: its target, and whether it mutates."""
    writes = METHODS[method].mutating or ROUTES[method].writes
    return f"{ROUTES[method].via.value}:{'write' if writes else 'read'}"


# ---------------------------------------------------------------------- per-round state


def _folder(root: Path, name: str) -> Path:
    folder = root.parent / f"{root.name}-ord" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def _project_with_session(c: HostClient, root: Path, v: Vars, r: int) -> None:
    """A project (a folder with one session in it) that this round's write removes."""
    folder = _folder(root, f"p{r}")
    v["sid"] = await new_session(c, projectPath=str(folder))
    v["folder"] = str(folder)
    v["project"] = next(p["id"] for p in (await c.call("projects.list", {}))["projects"] if p["path"] == str(folder))


async def _two_sessions(c: HostClient, root: Path) -> Vars:
    return {"a": await new_session(c), "b": await new_session(c)}


async def _blob_and_session(c: HostClient, root: Path) -> Vars:
    v = await one_session(c, root)
    put = await c.call("attachments.put", {"name": "a.txt", "mimeType": "text/plain",
                                           "dataBase64": base64.b64encode(b"shared").decode()})
    v["sha"] = put["sha256"]
    return v


async def _rule(c: HostClient, root: Path, v: Vars, r: int) -> None:
    """A session rule allowing tool ``T<r>`` (this round's write removes it)."""
    asked = await c.call("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": f"T{r}", "risk": "low"})
    answered = await c.call("approvals.respond", {"sessionId": v["sid"], "optionId": "allow_session",
                                                  "requestId": asked["request"]["requestId"]})
    v["rule"] = answered["rule"]["id"]


async def _plugin(c: HostClient, root: Path, v: Vars, r: int) -> None:
    await c.call("plugins.register", {"pluginId": f"acme{r}", "name": "acme", "version": "1"})


async def _writer_ops(c: HostClient, root: Path, v: Vars, r: int) -> None:
    v["ops"] = (await c.call("host.status", {}))["dbWriter"]["ops"]


def _data(r: int) -> str:
    return base64.b64encode(f"round {r}".encode()).decode()


# ---------------------------------------------------------------------- checks


def ok(results: list[Any]) -> list[Any]:
    for result in results:
        assert not isinstance(result, RpcError), result
    return results


def refused(result: Any, code: str) -> None:
    assert isinstance(result, RpcError) and result.data_code == code, result


async def _found_message(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert [hit["messageId"] for hit in ok(res)[1]["results"]] == [f"m{r}"]


async def _session_found(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert [hit["sessionId"] for hit in ok(res)[1]["results"]] == [v["sid"]]


async def _pending_has_it(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    asked, pending = ok(res)
    assert asked["request"]["requestId"] in {p["requestId"] for p in pending["pending"]}


async def _listed_title(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    titles = {s["id"]: s["title"] for s in ok(res)[1]["sessions"]}
    assert titles[v["sid"]] == f"title {r}"


async def _window_has_it(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    got = ok(res)[1]
    assert got["totalMessages"] == r + 1 and got["messages"][-1]["id"] == f"m{r}"


async def _context_has_it(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"m{r}" in str(ok(res)[1])


async def _remapped(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    first, second = ok(res)
    assert first["message"]["id"] == f"m{r}" and second["message"].get("id") == f"{v['b']}:m{r}"


async def _second_ok(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    ok(res)


async def _removed_late_session(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"late{r}" in ok(res)[1]["deletedSessions"]


async def _setting_seen(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert ok(res)[1]["value"] == 1000 + r


async def _task_seen(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert ok(res)[1]["title"] == f"task {r}"


async def _op_counted(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert ok(res)[1]["dbWriter"]["ops"] > v["ops"]


async def _rule_gone(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    removed, asked = ok(res)
    assert removed["removed"] is True
    assert asked["request"]["status"] == "pending", asked  # the removed rule did not answer it


async def _last_write_wins(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    ok(res)
    got = await c.call("settings.get", {"key": "largePasteThreshold"})
    assert got["value"] == 3000 + r


async def _settings_removed(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert ok(res)[1]["settingsRemoved"] == ["k"]
    assert (await c.call("settings.getAll", {"ns": f"plugin:acme{r}"}))["values"] == {}


async def _secret_listed(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"ord{r}" in {s["ref"] for s in ok(res)[1]["secrets"]}


async def _provider_listed(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"p{r}" in {p["id"] for p in ok(res)[1]["providers"]}


async def _plugin_listed(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"acme{r}" in {p["id"] for p in ok(res)[1]["plugins"]}


async def _session_gone(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    removed = res[0]
    assert not isinstance(removed, RpcError) and removed["deletedSessions"] == [v["sid"]], removed
    refused(res[1], "SESSION_NOT_FOUND")


async def _secret_redacted(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert f"hunter{r}x" not in ok(res)[1]["content"]


async def _plugin_disabled(c: HostClient, v: Vars, r: int, res: list[Any]) -> None:
    assert ok(res)[1]["plugin"]["enabled"] is False


# ---------------------------------------------------------------------- the pairs

P = Pair


def _append(sid: str, r: int, text: str = "x") -> tuple[str, dict[str, Any]]:
    return ("session.appendMessage", {"sessionId": sid, "message": msg(f"m{r}", text)})


PAIRS: dict[str, Pair] = {
    # session writes
    "append->search.query": P(one_session, lambda v, r: [
        _append(v["sid"], r, f"tokord{r}q"), ("search.query", {"query": f"tokord{r}q"})], _found_message),
    "rename->search.sessions": P(one_session, lambda v, r: [
        ("session.rename", {"sessionId": v["sid"], "title": f"tokren{r}q"}),
        ("search.sessions", {"query": f"tokren{r}q"})], _session_found),
    "approvals.request->approvals.pending": P(with_turn, lambda v, r: [
        ("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": f"T{r}", "risk": "low"}),
        ("approvals.pending", {})], _pending_has_it),
    "rename->session.list": P(one_session, lambda v, r: [
        ("session.rename", {"sessionId": v["sid"], "title": f"title {r}"}), ("session.list", {})], _listed_title),
    "append->session.get": P(one_session, lambda v, r: [
        _append(v["sid"], r), ("session.get", {"sessionId": v["sid"]})], _window_has_it),
    "append->session.context": P(one_session, lambda v, r: [
        _append(v["sid"], r), ("session.context", {"sessionId": v["sid"]})], _context_has_it),
    "append in one session->append in another": P(_two_sessions, lambda v, r: [
        _append(v["a"], r), _append(v["b"], r)], _remapped),  # an id held by another session is remapped (D444)
    "create->attachments.ref": P(_blob_and_session, lambda v, r: [
        ("session.create", {"sessionId": f"new{r}", "title": "n"}),
        ("attachments.ref", {"sha256": v["sha"], "sessionId": f"new{r}"})], _second_ok),
    "create->projects.remove": P(nothing, lambda v, r: [
        ("session.create", {"sessionId": f"late{r}", "title": "late", "projectPath": v["folder"]}),
        ("projects.remove", {"projectId": v["project"]})], _removed_late_session, prepare=_project_with_session),
    # writer writes
    "settings.set->settings.get": P(nothing, lambda v, r: [
        ("settings.set", {"key": "largePasteThreshold", "value": 1000 + r}),
        ("settings.get", {"key": "largePasteThreshold"})], _setting_seen),
    "tasks.update->tasks.get": P(with_task, lambda v, r: [
        ("tasks.update", {"taskId": v["task"], "title": f"task {r}"}), ("tasks.get", {"taskId": v["task"]})],
        _task_seen),
    "settings.set->host.status": P(nothing, lambda v, r: [
        ("settings.set", {"key": "largePasteThreshold", "value": 1000 + r}), ("host.status", {})], _op_counted,
        prepare=_writer_ops),
    "approvals.removeRule->approvals.request": P(with_turn, lambda v, r: [
        ("approvals.removeRule", {"ruleId": v["rule"]}),
        ("approvals.request", {"sessionId": v["sid"], "turnId": "t1", "tool": f"T{r}", "risk": "low"})],
        _rule_gone, prepare=_rule),
    "settings.set->settings.update": P(nothing, lambda v, r: [
        ("settings.set", {"key": "largePasteThreshold", "value": 2000 + r}),
        ("settings.update", {"ns": "app", "values": {"largePasteThreshold": 3000 + r}})], _last_write_wins),
    "settings.set->plugins.uninstall": P(nothing, lambda v, r: [
        ("settings.set", {"ns": f"plugin:acme{r}", "key": "k", "value": r}),
        ("plugins.uninstall", {"pluginId": f"acme{r}"})], _settings_removed, prepare=_plugin),
    # host writes
    "secrets.set->secrets.list": P(nothing, lambda v, r: [
        ("secrets.set", {"ref": f"ord{r}", "value": "v"}), ("secrets.list", {})], _secret_listed),
    "providers.create->providers.list": P(nothing, lambda v, r: [
        ("providers.create", {"id": f"p{r}", "name": "p"}), ("providers.list", {})], _provider_listed),
    "plugins.register->plugins.list": P(nothing, lambda v, r: [
        ("plugins.register", {"pluginId": f"acme{r}", "name": "acme", "version": "1"}), ("plugins.list", {})],
        _plugin_listed),
    "projects.remove->session.get": P(nothing, lambda v, r: [
        ("projects.remove", {"projectId": v["project"]}), ("session.get", {"sessionId": v["sid"]})],
        _session_gone, prepare=_project_with_session),
    "secrets.set->session.export": P(one_session, lambda v, r: [
        ("secrets.set", {"ref": f"exp{r}", "value": f"hunter{r}x"}), ("session.export", {"sessionId": v["sid"]})],
        _secret_redacted, prepare=lambda c, root, v, r: c.call(
            "session.appendMessage", {"sessionId": v["sid"], "message": msg(f"s{r}", f"the key is hunter{r}x")})),
    "projects.remove->append": P(nothing, lambda v, r: [
        ("projects.remove", {"projectId": v["project"]}), _append(v["sid"], r)],
        _session_gone, prepare=_project_with_session),
    "providers.create->models.add": P(nothing, lambda v, r: [
        ("providers.create", {"id": f"p{r}", "name": "p"}), ("models.add", {"providerId": f"p{r}", "modelId": "m"})],
        _second_ok),
    "attachments.put->attachments.ref": P(one_session, lambda v, r: [
        ("attachments.put", {"name": "a.txt", "mimeType": "text/plain", "dataBase64": _data(r)}),
        ("attachments.ref", {"sha256": hashlib.sha256(f"round {r}".encode()).hexdigest(), "sessionId": v["sid"]})],
        _second_ok),
    "plugins.register->plugins.setEnabled": P(nothing, lambda v, r: [
        ("plugins.register", {"pluginId": f"acme{r}", "name": "acme", "version": "1"}),
        ("plugins.setEnabled", {"pluginId": f"acme{r}", "enabled": False})], _plugin_disabled),
}

NO_PAIR: dict[tuple[str, str], str] = {
    ("writer:write", "session:read"): "a session-routed read shows the transcript, the session row, the queue and "
                                      "revisions, which only session routes write: no writer-only effect to observe",
}
"""Kind pairs without a case, each with the reason none exists."""

_W = "writer:write"
_S = "session:write"
_H = "host:write"
_SR = "session:read"
_R = "reads:read"
_HR = "host:read"
_C = "connection:read"

KINDS: dict[str, str] = {
    # answered by the connection itself, outside the order: a subscription's cursor is gap-free on its own
    "host.hello": _C, "events.subscribe": _C, "events.unsubscribe": _C,
    "host.createLoginCode": _HR, "configSync.get": _HR, "secrets.get": _HR,
    "session.delete": _S, "session.startTurn": _S, "session.endTurn": _S, "session.saveInflightMessage": _S,
    "session.recoverInflight": _S, "session.update": _S, "session.updateMetadata": _S,
    "session.queuePush": _S, "session.queueRemove": _S,
    "session.queuePrioritize": _S, "session.queueReorder": _S, "session.queueAttach": _S, "session.queueTake": _S,
    "session.saveActiveRevision": _S, "session.activateRevision": _S, "session.truncateFrom": _S,
    "session.replaceMessages": _S, "session.appendCompaction": _S, "session.fork": _S, "session.assistantEdit": _S,
    "session.deleteMessage": _S,
    "session.restoreMessage": _S, "plans.submit": _S, "plans.respond": _S, "plans.startExecution": _S,
    "plans.finishExecution": _S, "approvals.respond": _S, "interactions.request": _S, "interactions.respond": _S,
    "collab.deliver": _S, "collab.begin": _S, "collab.settle": _S, "collab.cancel": _S, "sessions.trash": _S,
    "sessions.restore": _S, "sessions.purge": _S,
    "session.queueList": _SR, "session.listRevisions": _SR, "session.tree": _SR,
    "session.turnEnvironment": _R, "session.verifyEnvironment": _SR, "notifications.list": _R, "artifacts.list": _R,
    "attachments.estimate": _R, "tasks.list": _R, "tasks.runs": _R, "plans.pending": _R, "approvals.rules": _R,
    "interactions.pending": _R, "collab.list": _R, "collab.get": _R, "usage.session": _R, "usage.history": _R,
    "session.listTurns": _R, "projects.list": _R, "settings.getAll": _R, "workspace.get": _R,
    "session.resolvePath": _R, "projectGroups.list": _R, "projectGroups.get": _R, "providers.get": _R,
    "models.list": _R, "plugins.listSessions": _R, "sessions.listTrashed": _R, "attachments.get": _R,
    "audit.list": _R, "logs.append": _H,
    "review.record": _S, "review.restore": _S, "review.get": _SR, "review.list": _SR,
    "notifications.markRead": _W, "notifications.markAllRead": _W, "notifications.clear": _W, "tasks.create": _W,
    "tasks.delete": _W, "tasks.startRun": _W, "tasks.finishRun": _W, "settings.delete": _W, "workspace.open": _W,
    "projects.pin": _W, "projectGroups.save": _W, "projectGroups.delete": _W, "projectGroups.setMemory": _W,
    "projectGroups.setInstructions": _W, "providers.reorder": _W, "models.remove": _W,
    "secrets.delete": _H, "attachments.importFile": _H, "attachments.gc": _H, "providers.update": _H,
    "providers.delete": _H, "providers.sync": _H, "models.refresh": _H, "plugins.setEnabled": _H,
    "configSync.configure": _H,
    "configSync.export": _H, "configSync.apply": _H, "import.sessions": _H, "plugins.importSession": _H,
    "skills.list": _R, "skills.get": _R, "memories.list": _R, "skills.put": _W, "skills.delete": _W,
    "plugins.listAssets": _HR, "plugins.getAsset": _HR,
}
"""Routes without a pair of their own, by kind: their order comes from their kind alone
(``runtime/ordering.py`` looks at nothing else), and each kind's pairs are tested above."""


def _methods(pair: Pair) -> list[str]:
    return [name for name, _ in pair.calls(_Probe(), 0)]


class _Probe(dict[str, Any]):
    """Stands in for a scenario's variables to read a pair's method names."""

    def __missing__(self, key: str) -> str:
        return "probe"


def _class_of(pair: Pair) -> tuple[str, str]:
    first, second = _methods(pair)
    return kind_of(first), kind_of(second)


def test_every_route_is_in_a_pair_or_classified() -> None:
    paired = {name for pair in PAIRS.values() for name in _methods(pair)}
    missing = sorted(set(ROUTES) - paired - set(KINDS))
    assert not missing, f"routes with no ordering case and no classification in KINDS: {missing}"
    assert set(KINDS) <= set(ROUTES), sorted(set(KINDS) - set(ROUTES))
    wrong = {name: (said, kind_of(name)) for name, said in KINDS.items() if said != kind_of(name)}
    assert not wrong, f"classified under another kind than the route table says: {wrong}"


def test_every_kind_pair_has_a_case() -> None:
    """Every mutating kind followed by every kind the route table has (the gateway's own methods aside)."""
    kinds = {kind_of(name) for name in ROUTES if ROUTES[name].via is not Via.CONNECTION}
    needed = {(first, second) for first in kinds if first.endswith(":write") for second in kinds}
    covered = {_class_of(pair) for pair in PAIRS.values()}
    assert all(first.endswith(":write") for first, _ in covered)
    assert not (covered & set(NO_PAIR)), "a kind pair with a case needs no reason"
    missing = sorted(needed - covered - set(NO_PAIR))
    assert not missing, f"kind pairs with no ordering case: {missing}"


@pytest.mark.parametrize("framing", ["frames", "batch"])
@pytest.mark.parametrize("name", sorted(PAIRS))
async def test_the_second_request_observes_the_first(tmp_path: Path, name: str, framing: str) -> None:
    pair = PAIRS[name]
    root = tmp_path / "data"
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host, "c", kind=pair.kind) as c:
            v = await pair.setup(c, root)
            send = c.pipelined if framing == "frames" else c.batch
            for r in range(ROUNDS):
                if pair.prepare is not None:
                    await pair.prepare(c, root, v, r)
                calls = pair.calls(v, r)
                results = await send(calls)
                try:
                    await pair.check(c, v, r, results)
                except AssertionError as exc:
                    raise AssertionError(f"{name} ({_class_of(pair)}), round {r}: {calls} -> {results}") from exc
