"""Who may call what (protocol/README.md §1 "Who may call what"), against a real ``pi-host serve`` process.

ARCHITECTURE.md: "A plugin's reads and writes are scoped to what it owns (its `kv(plugin:<id>)`, its provider
rows, its imported sessions); everything else is `PERMISSION_DENIED`"; seed 003 §11.20: plugin imports have
"ownership-scoped reads/mutations". Every route not opened to plugins is refused to one (generated from the
route table, with each method's README example params, so the refusal is the role's, not the params'); a
plugin hears no event but its own namespace's; and a plugin import may not name an attachment blob, which it
cannot store (``attachments.*`` is not open to it) and which is therefore another's: a JSONL or HTML export of
the imported session would otherwise hand the plugin that blob's bytes."""

from __future__ import annotations

import base64
import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from runtime.client import ClientEvent, HostClient, RpcError, open_client
from runtime.routes import ROUTES, Via
from tests.hostkit import HostProcess, msg, start_host_process

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "export_schema.py"


def _examples() -> Mapping[str, tuple[dict[str, Any], dict[str, Any]]]:
    spec = importlib.util.spec_from_file_location("export_schema_roles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    examples: Mapping[str, tuple[dict[str, Any], dict[str, Any]]] = module.EXAMPLES
    return examples


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    proc = start_host_process(tmp_path_factory.mktemp("roles"))
    try:
        yield proc
    finally:
        proc.terminate()


async def _code(c: HostClient, method: str, params: dict[str, Any]) -> str | None:
    try:
        await c.call(method, params)
    except RpcError as exc:
        return exc.data_code
    return None


async def test_every_route_not_opened_to_plugins_is_permission_denied_to_one(host: HostProcess) -> None:
    examples = _examples()
    closed = sorted(name for name, route in ROUTES.items() if not route.plugins and route.via is not Via.CONNECTION)
    assert len(closed) > 100 and not set(closed) - set(examples)
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="roles-p", client_kind="plugin",
                               plugin_id="acme.roles") as p:
            answers = {name: await _code(p, name, examples[name][0]) for name in closed}
    assert {name: code for name, code in answers.items() if code != "PERMISSION_DENIED"} == {}


async def test_a_method_closed_to_plugins_is_refused_whatever_its_params(host: HostProcess) -> None:
    """README §8.5: "anything else ... is `PERMISSION_DENIED`": the method is refused before its params are
    looked at, so a plugin is never told INVALID_PARAMS or UNSUPPORTED_FOR_NATIVE_SESSION for a method it may
    not call at all (it was, the params checked first)."""
    closed = sorted(name for name, route in ROUTES.items() if not route.plugins and route.via is not Via.CONNECTION)
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="roles-p2", client_kind="plugin",
                               plugin_id="acme.roles") as p:
            answers = {name: await _code(p, name, {}) for name in closed}
            answers["session.delete native"] = await _code(p, "session.delete", {"sessionId": "native-pi:abc"})
            answers["search.query junk"] = await _code(p, "search.query", {"query": 7, "bogus": True})
    assert {name: code for name, code in answers.items() if code != "PERMISSION_DENIED"} == {}


async def test_a_plugin_hears_only_its_own_namespace(host: HostProcess) -> None:
    """README §8.5: "`events.subscribe` to `settings.changed` only (it hears its own `plugin:<id>` namespace,
    never another's: events are reads too)"."""
    with trio.fail_after(30):
        async with open_client(host.url, host.token, client_id="roles-ui", client_kind="ui") as ui, \
                open_client(host.url, host.token, client_id="roles-a", client_kind="plugin",
                            plugin_id="acme.alpha") as alpha, \
                open_client(host.url, host.token, client_id="roles-b", client_kind="plugin",
                            plugin_id="acme.beta") as beta:
            for topics in (["session.created"], ["session.message"], ["approval.requested"],
                           ["providers.changed"], ["settings.changed", "session.updated"]):
                assert await _code(alpha, "events.subscribe", {"topics": topics}) == "PERMISSION_DENIED", topics
            await alpha.subscribe(["settings.changed"])
            await beta.call("settings.set", {"ns": "plugin:acme.beta", "key": "k", "value": 1})
            await ui.call("settings.set", {"ns": "ui", "key": "roles", "value": 1})
            await ui.call("session.create", {"title": "the user's"})
            await alpha.call("settings.set", {"ns": "plugin:acme.alpha", "key": "k", "value": 2})
            first: ClientEvent = await alpha.next_event()  # the others' changes came first: none reached it
            assert (first.topic, first.data["ns"]) == ("settings.changed", "plugin:acme.alpha"), first


async def test_a_plugin_import_may_not_name_an_attachment_blob(host: HostProcess) -> None:
    """Seed 003 §11.20 "ownership-scoped reads": a blob a UI stored is not the plugin's. Without the refusal,
    an import naming its ``attachments/<sha256>`` made the plugin's own session refer to it, and
    ``session.export`` (JSONL carries the bytes, HTML inlines them) read them back to the plugin."""
    data = b"\x89PNG\r\n\x1a\n the user's screenshot, not the plugin's"
    with trio.fail_after(30):
        async with open_client(host.url, host.token, client_id="roles-ui2", client_kind="ui") as ui, \
                open_client(host.url, host.token, client_id="roles-c", client_kind="plugin",
                            plugin_id="acme.gamma") as gamma:
            put = await ui.call("attachments.put", {"name": "shot.png", "mimeType": "image/png",
                                                    "dataBase64": base64.b64encode(data).decode()})
            block = {"type": "attachment", "kind": "image", "name": "shot.png", "ref": put["ref"],
                     "mimeType": "image/png", "size": len(data)}
            nested = {"type": "toolResult", "toolCallId": "call_1", "content": [block]}
            for i, blocks in enumerate(([{"type": "text", "text": "look"}, block], [nested])):
                message = {**msg("u1", "x"), "blocks": blocks}
                params = {"sourceId": "chatlog", "externalId": f"with-blob-{i}", "messages": [message]}
                with pytest.raises(RpcError) as err:
                    await gamma.call("plugins.importSession", params)
                assert err.value.data_code == "PERMISSION_DENIED", err.value
                assert err.value.data is not None and err.value.data.get("field") == "messages[0]", err.value
            assert (await gamma.call("plugins.listSessions", {}))["sessions"] == []  # nothing imported
            # an import without one goes on as before; a path reference is only text to the host
            path_block = {**block, "ref": "/home/ada/shot.png"}
            made = await gamma.call("plugins.importSession", {
                "sourceId": "chatlog", "externalId": "plain",
                "messages": [{**msg("u1", "x"), "blocks": [{"type": "text", "text": "hi"}, path_block]}]})
            assert made["created"] is True
            for fmt in ("jsonl", "html"):
                out = (await gamma.call("session.export", {"sessionId": made["sessionId"], "format": fmt}))
                assert base64.b64encode(data).decode()[:24] not in out["content"], fmt


async def test_a_plugin_export_is_answered_inline_never_written_to_a_path(host: HostProcess,
                                                                           tmp_path: Path) -> None:
    """A plugin's writes are scoped to what it owns (ARCHITECTURE.md "Gateway and protocol"); a file anywhere
    the user may write is not, and the export's content is the plugin's own words: ``outPath`` made the host
    create a new file of the plugin's choosing (``~/.ssh/authorized_keys`` when absent, an autostart entry).
    It is ``PERMISSION_DENIED`` (field ``outPath``), as ``includeSecrets`` is; inline answers stay."""
    target = tmp_path / "plugin-chose-this.md"
    with trio.fail_after(30):
        async with open_client(host.url, host.token, client_id="roles-d", client_kind="plugin",
                               plugin_id="acme.delta") as delta:
            made = await delta.call("plugins.importSession", {
                "sourceId": "chatlog", "externalId": "to-file", "messages": [msg("u1", "ssh-ed25519 AAAA planted")]})
            sid = made["sessionId"]
            with pytest.raises(RpcError) as err:
                await delta.call("session.export", {"sessionId": sid, "format": "md", "outPath": str(target)})
            assert err.value.data_code == "PERMISSION_DENIED" and err.value.data.get("field") == "outPath", err.value
            assert not target.exists()
            inline = await delta.call("session.export", {"sessionId": sid, "format": "md"})
            assert "ssh-ed25519 AAAA planted" in inline["content"]
        async with open_client(host.url, host.token, client_id="roles-ui3", client_kind="ui") as ui:
            written = await ui.call("session.export", {"sessionId": sid, "format": "md", "outPath": str(target)})
            assert written["path"] == str(target) and "planted" in target.read_text()  # the user chooses paths


async def test_only_a_ui_answers_a_user_request(host: HostProcess, tmp_path: Path) -> None:
    """Approvals and interactions are "pending and resolved user RPC state" (seed 000 §2), "pushed to UI
    clients" (ARCHITECTURE.md "From seed 000"); README §10 "A running turn's sidecar asks; a UI answers", and
    seed 003 §11.19: "no background path auto-approves" a plan or goal. The command line (``clientKind: cli``:
    the host's own tools, scripts) is no UI: it answered all three. Now ``PERMISSION_DENIED`` for ``cli`` as
    for ``agent``, the request still pending; a UI (or ``test``, standing in for one) answers."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="roles-agent", client_kind="agent") as agent, \
                open_client(host.url, host.token, client_id="roles-cli", client_kind="cli") as cli, \
                open_client(host.url, host.token, client_id="roles-ui4", client_kind="ui") as ui:
            sid = (await agent.call("session.create", {"title": "asks"}))["id"]
            await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            asked = (await agent.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                            "argsSummary": "run it", "risk": "medium"}))["request"]
            question = (await agent.call("interactions.request", {"sessionId": sid, "turnId": "t1",
                                                                  "question": "which?", "allowFreeText": True}))
            plan_sid = (await agent.call("session.create", {"title": "plan", "projectPath": str(ws),
                                                            "mode": "plan"}))["id"]
            plan = await agent.call("plans.submit", {"sessionId": plan_sid, "turnId": "t0", "toolCallId": "c1",
                                                     "kind": "plan", "markdown": "# Plan\n\n1. do it\n",
                                                     "workspaceRoot": str(ws)})
            answers = (
                ("approvals.respond", {"sessionId": sid, "requestId": asked["requestId"], "optionId": "allow_once"}),
                ("interactions.respond", {"sessionId": sid, "requestId": question["request"]["requestId"],
                                          "answer": {"text": "this one"}}),
                ("plans.respond", {"requestId": plan["requestId"], "action": "approve"}),
            )
            for kind, who in (("agent", agent), ("cli", cli)):
                for method, params in answers:
                    with pytest.raises(RpcError) as err:
                        await who.call(method, params)
                    assert err.value.data_code == "PERMISSION_DENIED", (kind, method, err.value)
            assert [r["requestId"] for r in (await ui.call("approvals.pending", {"sessionId": sid}))["pending"]] \
                == [asked["requestId"]]
            assert len((await ui.call("interactions.pending", {"sessionId": sid}))["pending"]) == 1
            assert [r["requestId"] for r in (await ui.call("plans.pending", {}))["pending"]] == [plan["requestId"]]
            for method, params in answers:
                await ui.call(method, params)
            assert (await ui.call("approvals.pending", {"sessionId": sid}))["pending"] == []


async def test_the_kind_gated_rows_of_the_matrix(host: HostProcess) -> None:
    """README §1 "Who may call what": the rows that differ between ``ui``, ``agent``, ``cli`` and ``test`` (the
    sidecar reads a provider key and a UI the config-sync vault key, the command line and tests no secret;
    only the sidecar controls a queue; each of app and sidecar writes its own logs; the sidecar reads whole
    transcripts by default, everyone else the newest 100 messages)."""
    kinds = ("ui", "agent", "cli", "test")
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="roles-setup", client_kind="ui") as setup:
            await setup.call("secrets.set", {"ref": "provider/roles", "value": "sk-roles-0001"})
            sid = (await setup.call("session.create", {"title": "long"}))["id"]
            for i in range(101):
                await setup.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"line {i}")})
        got: dict[str, dict[str, Any]] = {}
        for kind in kinds:
            async with open_client(host.url, host.token, client_id=f"roles-k-{kind}", client_kind=kind) as c:
                row: dict[str, Any] = {"secrets.get": await _code(c, "secrets.get", {"ref": "provider/roles"})}
                for source in ("app", "agent"):
                    row[f"logs.{source}"] = await _code(c, "logs.append", {
                        "source": source, "category": "roles", "records": [{"level": "info", "msg": kind}]})
                row["queueAttach"] = await _code(c, "session.queueAttach", {"sessionId": sid,
                                                                            "controllerId": f"ctl-{kind}"})
                row["window"] = len((await c.call("session.get", {"sessionId": sid}))["messages"])
                got[kind] = row
    assert got == {
        "ui": {"secrets.get": None, "logs.app": None, "logs.agent": "PERMISSION_DENIED", "queueAttach": "CONFLICT",
               "window": 100},
        "agent": {"secrets.get": None, "logs.app": "PERMISSION_DENIED", "logs.agent": None, "queueAttach": None,
                  "window": 101},
        "cli": {"secrets.get": "PERMISSION_DENIED", "logs.app": None, "logs.agent": None,
                "queueAttach": "CONFLICT", "window": 100},
        "test": {"secrets.get": "PERMISSION_DENIED", "logs.app": None, "logs.agent": None,
                 "queueAttach": "CONFLICT", "window": 100},
    }
