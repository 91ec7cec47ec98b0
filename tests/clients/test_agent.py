"""The reference sidecar against a real OpenAI-compatible endpoint (a local HTTP server) and its tools."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, cast

import pytest
import trio

from pihost_client import Client, Event, RpcError, connect
from pihost_client.agent import Sidecar, permission_mode
from pihost_client.agent_model import FakeModel, OpenAIModel
from pihost_client.agent_providers import ProviderStore
from pihost_client.agent_tools import ToolError, run_tool
from tests.hostkit import inprocess_host


def _sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@contextmanager
def chat_completions() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """``POST /v1/chat/completions`` streaming: a list_dir tool call first, then text naming its result."""
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            tool_results = [m for m in body["messages"] if m.get("role") == "tool"]
            if not tool_results:
                payload = _sse({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {
                    "name": "list_dir", "arguments": '{"pa'}}]}}]},
                    {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "."}'}}]}}]},
                    {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 2}})
            else:
                payload = _sse({"choices": [{"delta": {"content": "The folder holds "}}]},
                               {"choices": [{"delta": {"content": tool_results[-1]["content"]}}]},
                               {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 5}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_a_queued_turn_runs_against_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.txt").write_text("a")
    with chat_completions() as (base_url, seen), trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="agent-openai", client_kind="agent") as agent:
                model = OpenAIModel("gpt-test", base_url=base_url, api_key="sk-local-test")
                nursery.start_soon(Sidecar(agent, model, "agent-openai").run)
                async with connect(host.url, host.token, client_id="ui-openai", client_kind="ui") as ui:
                    sid = (await ui.session.create(title="endpoint", project_path=str(project)))["id"]
                    async with ui.subscribe(["turn.ended", "approval.requested"], session_id=sid) as events:
                        await ui.session.queue_push(session_id=sid, principal="user", content="what is here?",
                                                    permission_mode="ask")
                        asked = await events.next()  # the sidecar asks before it lists the folder
                        assert isinstance(asked, Event) and asked.topic == "approval.requested"
                        request = asked.data["request"]
                        assert (request["tool"], request["argsSummary"], request["requestedBy"]) == (
                            "list_dir", "list_dir .", "agent-openai")
                        assert len(seen) == 1  # the model asked; the tool has not run
                        await ui.approvals.respond(session_id=sid, request_id=request["requestId"],
                                                   option_id="allow_once")
                        ended = await events.next()
                    assert isinstance(ended, Event) and ended.data["turn"]["status"] == "completed"
                    assert ended.data["turn"]["inputTokens"] == 31 and ended.data["turn"]["outputTokens"] == 7
                    page = await ui.session.get(session_id=sid)
                nursery.cancel_scope.cancel()
    user, tool_round, final = page["messages"]
    assert user["blocks"] == [{"type": "text", "text": "what is here?"}]
    call = tool_round["blocks"][0]
    assert (call["type"], call["name"], call["args"], call["status"], call["result"]) == (
        "tool_call", "list_dir", {"path": "."}, "ok", "a.txt")
    assert final["blocks"] == [{"type": "text", "text": "The folder holds a.txt"}]
    assert [s["path"] for s in seen] == ["/v1/chat/completions"] * 2
    assert {s["auth"] for s in seen} == {"Bearer sk-local-test"}
    assert seen[0]["body"]["stream"] is True and seen[0]["body"]["tools"][0]["function"]["name"] == "read_file"
    assert seen[1]["body"]["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}


async def _turn(ui: Client, sid: str, content: str, mode: Literal["ask", "auto"],
                answer: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Queue one turn; answer each permission prompt with ``answer``; the approval events and the turn."""
    approvals: list[dict[str, Any]] = []
    async with ui.subscribe(["turn.ended", "approval.requested", "approval.resolved"], session_id=sid) as events:
        await ui.session.queue_push(session_id=sid, principal="user", content=content, permission_mode=mode)
        async for ev in events:
            assert isinstance(ev, Event)
            if ev.topic == "turn.ended":
                return approvals, ev.data["turn"]
            approvals.append({"topic": ev.topic, **ev.data["request"]})
            if ev.topic == "approval.requested":
                assert answer is not None, f"the sidecar asked in {mode} mode"
                await ui.approvals.respond(session_id=sid, request_id=ev.data["request"]["requestId"],
                                           option_id=answer)
    raise AssertionError("the subscription ended")


async def test_the_sidecar_asks_before_a_tool_runs_and_obeys_the_answer(tmp_path: Path) -> None:
    """ask: a denied call is recorded as denied and the tool never runs; "always allow in this
    project" stores a rule that answers the next request at once; auto mode and --approve auto
    never ask."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.txt").write_text("a")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="agent-ask", client_kind="agent") as agent, \
                    connect(host.url, host.token, client_id="ui-ask", client_kind="ui") as ui:
                nursery.start_soon(Sidecar(agent, FakeModel(delay=0, words=2), "agent-ask").run)
                sid = (await ui.session.create(title="ask", project_path=str(project)))["id"]

                asked, turn = await _turn(ui, sid, "ls", "ask", "deny")
                assert turn["status"] == "completed"
                assert [(a["topic"], a["status"]) for a in asked] == [
                    ("approval.requested", "pending"), ("approval.resolved", "denied")]
                denied = (await ui.session.get(session_id=sid))["messages"][1]["blocks"][0]
                assert (denied["name"], denied["status"]) == ("list_dir", "denied")
                assert "a.txt" not in denied["result"] and "did not allow" in denied["result"]

                asked, _ = await _turn(ui, sid, "ls", "ask", "allow_project")
                assert [a["status"] for a in asked] == ["pending", "allowed"]
                rules = (await ui.approvals.rules(session_id=sid))["rules"]
                assert [(r["scope"], r["tool"], r["decision"]) for r in rules] == [("project", "list_dir", "allow")]

                asked, _ = await _turn(ui, sid, "ls", "ask", None)  # the rule answers: no prompt
                assert [(a["topic"], a["status"], a["respondedBy"]) for a in asked] == [
                    ("approval.resolved", "allowed", "rule")]
                asked, _ = await _turn(ui, sid, "read a.txt", "auto", None)
                assert asked == []
                page = await ui.session.get(session_id=sid)
                assert [b["status"] for m in page["messages"] for b in m["blocks"] if b["type"] == "tool_call"] == [
                    "denied", "ok", "ok", "ok"]
                assert (await ui.approvals.pending(session_id=sid))["pending"] == []
                nursery.cancel_scope.cancel()

        async with inprocess_host(tmp_path / "data2") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="agent-auto", client_kind="agent") as agent, \
                    connect(host.url, host.token, client_id="ui-auto", client_kind="ui") as ui:
                nursery.start_soon(Sidecar(agent, FakeModel(delay=0, words=2), "agent-auto", approve="auto").run)
                sid = (await ui.session.create(title="auto", project_path=str(project)))["id"]
                asked, turn = await _turn(ui, sid, "ls", "ask", None)
                assert asked == [] and turn["status"] == "completed"
                nursery.cancel_scope.cancel()


async def test_the_endpoint_and_key_come_from_the_hosts_provider_store(tmp_path: Path) -> None:
    """No --base-url: the session's provider row gives the endpoint, the secret store its key (read per
    turn, so a rotated key is used by the next turn); the run environment records the connection and
    the credential reference, and verifies. A session with no provider fails its turn, saying why."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.txt").write_text("a")
    with chat_completions() as (base_url, seen), trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="agent-store", client_kind="agent") as agent, \
                    connect(host.url, host.token, client_id="ui-store", client_kind="ui") as ui:
                provider = (await ui.providers.create(name="Local", base_url=base_url, api_key="sk-from-store",
                                                      default_model_id="gpt-default"))["provider"]
                nursery.start_soon(Sidecar(agent, None, "agent-store", providers=ProviderStore(agent),
                                           approve="auto").run)
                sid = (await ui.session.create(title="store", project_path=str(project),
                                               provider_id=provider["id"], model_id="gpt-session"))["id"]
                _, turn = await _turn(ui, sid, "what is here?", "ask", None)
                assert turn["status"] == "completed"
                assert {s["auth"] for s in seen} == {"Bearer sk-from-store"}
                assert {s["body"]["model"] for s in seen} == {"gpt-session"}
                env = (await ui.session.turn_environment(turn_id=turn["id"]))["snapshot"]
                assert env["connection"]["baseUrl"] == base_url
                assert env["credentialRefs"] == [provider["secretRef"]]
                assert "sk-from-store" not in repr(env)
                await ui.session.verify_environment(session_id=sid, turn_id=turn["id"])

                await ui.providers.update(provider_id=provider["id"], api_key="sk-rotated")
                seen.clear()
                _, turn = await _turn(ui, sid, "and now?", "ask", None)
                assert turn["status"] == "completed" and {s["auth"] for s in seen} == {"Bearer sk-rotated"}
                # the snapshot binds the turn to its session's project and its provider's endpoint (seed 000 §4
                # "Recovery rejects ... binding drift"): a moved project or base URL is drift, as the host checks it
                await ui.session.verify_environment(session_id=sid, turn_id=turn["id"])
                elsewhere = tmp_path / "elsewhere"
                elsewhere.mkdir()
                await ui.session.update(session_id=sid, project_path=str(elsewhere))
                assert await _drift(ui, sid, turn["id"]) == ["executionBindings.projectPath"]
                await ui.session.update(session_id=sid, project_path=str(project))
                await ui.providers.update(provider_id=provider["id"], base_url="http://127.0.0.1:9/v1")
                assert await _drift(ui, sid, turn["id"]) == ["connection.baseUrl"]
                await ui.providers.update(provider_id=provider["id"], base_url=base_url)

                bare = (await ui.session.create(title="no provider"))["id"]
                _, turn = await _turn(ui, bare, "hello", "ask", None)
                assert (turn["status"], turn["errorCode"]) == ("error", "MODEL_ERROR")
                nursery.cancel_scope.cancel()


async def _drift(ui: Client, sid: str, turn_id: str) -> list[str]:
    """The fields ``session.verifyEnvironment`` names drifted (it must refuse the snapshot)."""
    with pytest.raises(RpcError) as info:
        await ui.session.verify_environment(session_id=sid, turn_id=turn_id)
    assert info.value.data_code == "ENVIRONMENT_DRIFT"
    return [d["field"] for d in info.value.data["drift"]]


def test_the_permission_mode_comes_from_the_entry_then_the_session() -> None:
    assert permission_mode({"permissionMode": "auto"}, {"permissionMode": "ask"}, "ask") == "auto"
    assert permission_mode({"permissionMode": "inherit"}, {"permissionMode": "accept-edits"}, "ask") == "accept-edits"
    assert permission_mode({"permissionMode": "inherit"}, {"permissionMode": "inherit"}, "ask") == "ask"
    assert permission_mode({"permissionMode": "ask"}, {}, "auto") == "auto"


def test_tools_stay_inside_the_project_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "in.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "link").symlink_to(tmp_path / "secret.txt")
    assert run_tool("read_file", {"path": "in.txt"}, str(root)) == "inside"
    assert run_tool("list_dir", {"path": "."}, str(root)) == "in.txt link"
    for path in ("../secret.txt", "/etc/passwd", "link"):
        with pytest.raises(ToolError, match="outside the project root"):
            run_tool("read_file", {"path": path}, str(root))
    with pytest.raises(ToolError, match="no project root"):
        run_tool("list_dir", {"path": "."}, None)


async def _dead_sidecar(host: Any, sid: str, client_id: str, *, start: bool = False,
                        prompt: str | None = None) -> dict[str, Any]:
    """An agent connection that attaches and takes the next prompt (then starts its turn, then appends
    ``prompt`` to it), and is gone: the entry it took."""
    async with connect(host.url, host.token, client_id=client_id, client_kind="agent") as dead:
        await dead.session.queue_attach(session_id=sid, controller_id=client_id)
        entry = (await dead.session.queue_take(session_id=sid, controller_id=client_id))["entry"]
        assert entry is not None
        turn = f"t_{entry['id']}"
        if start:
            await dead.session.start_turn(session_id=sid, turn_id=turn,
                                          environment=cast(Any, {"version": 1, "model": {"id": "m"}}))
        if prompt is not None:
            await dead.session.append_message(session_id=sid, message={
                "id": f"u_{entry['id']}", "role": "user", "turnId": turn, "blocks": [{"type": "text", "text": prompt}]})
        return dict(entry)


async def test_a_restarted_sidecar_runs_the_prompt_its_earlier_run_took_and_never_started(tmp_path: Path) -> None:
    """Its earlier run (same controller id) took a prompt and died before the turn: the restarted sidecar
    skipped queueAttach when a ``session.queue`` event already named it, and its first take consumed that
    prompt (the host counts a take after a take as the controller moving on). It attaches once per
    session and process now; the attach offers the prompt again (and so does the host when the dead
    run's connection closes: the startup scan finds it listed)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ui", client_kind="ui") as ui:
                sid = (await ui.session.create(title="restart"))["id"]
                await ui.session.queue_push(session_id=sid, principal="user", content="first", permission_mode="auto")
                assert (await _dead_sidecar(host, sid, "ctl"))["content"] == "first"
                async with connect(host.url, host.token, client_id="ctl", client_kind="agent") as agent, \
                        ui.subscribe(["turn.ended"], session_id=sid) as events:
                    nursery.start_soon(Sidecar(agent, FakeModel(delay=0.001), "ctl").run)
                    await trio.sleep(1)
                    await ui.session.queue_push(session_id=sid, principal="user", content="second",
                                                permission_mode="auto")
                    for _ in range(2):
                        ended = await events.next()
                        assert isinstance(ended, Event) and ended.data["turn"]["status"] == "completed"
                    page = await ui.session.get(session_id=sid, full=True)
                    nursery.cancel_scope.cancel()
    prompts = [m["blocks"][0]["text"] for m in page["messages"] if m["role"] == "user"]
    assert prompts == ["first", "second"]


async def test_the_host_recovers_a_queue_turn_a_gone_sidecar_left_running(tmp_path: Path) -> None:
    """A sidecar killed mid-turn left its turn running: every later take answered ``turnRunning`` and the
    queue waited forever (until someone called recoverInflight by hand). Once that sidecar is gone (no
    connection of it came back within the grace) the host recovers the queue turn it was running; the
    next sidecar (another id) goes on with the queue."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", client_gone_after=0.5) as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ui", client_kind="ui") as ui:
                sid = (await ui.session.create(title="lost"))["id"]
                await ui.session.queue_push(session_id=sid, principal="user", content="first", permission_mode="auto")
                lost = f"t_{(await _dead_sidecar(host, sid, 'old', start=True, prompt='first'))['id']}"
                async with connect(host.url, host.token, client_id="new", client_kind="agent") as agent, \
                        ui.subscribe(["turn.ended"], session_id=sid) as events:
                    nursery.start_soon(Sidecar(agent, FakeModel(delay=0.001), "new").run)
                    await ui.session.queue_push(session_id=sid, principal="user", content="second",
                                                permission_mode="auto")
                    ended: dict[str, dict[str, Any]] = {}
                    while len(ended) < 2:
                        got = await events.next()
                        assert isinstance(got, Event)
                        ended[got.data["turn"]["id"]] = got.data["turn"]
                    page = await ui.session.get(session_id=sid, full=True)
                    nursery.cancel_scope.cancel()
                gone = ended.pop(lost)
                assert (gone["status"], gone["errorCode"]) == ("aborted", "SIDECAR_LOST")
                assert [t["status"] for t in ended.values()] == ["completed"]
    prompts = [m["blocks"][0]["text"] for m in page["messages"] if m["role"] == "user"]
    assert prompts == ["first", "second"]


@pytest.mark.parametrize(("started", "same_id"), [(False, True), (True, False), (True, True)])
async def test_a_new_sidecar_finds_what_a_dead_one_left_without_a_push(tmp_path: Path, started: bool,
                                                                      same_id: bool) -> None:
    """Found by an end-to-end chaos probe: a sidecar restarted under the same id within the host's grace
    (its supervisor, or the default id) never attached the session whose prompt its earlier run took, and
    a dead sidecar's running turn that carried the last prompt kept the queue waiting, until something was
    pushed. The startup scan attaches sessions the host still names this controller id for and recovers
    the queue turn its earlier run left running; another id's turn is the host's to recover once that
    sidecar is gone (here after 1 s)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data", client_gone_after=1.0) as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ui", client_kind="ui") as ui:
                sid = (await ui.session.create(title="left"))["id"]
                await ui.session.queue_push(session_id=sid, principal="user", content="first", permission_mode="auto")
                await _dead_sidecar(host, sid, "ctl", start=started)
                new_id = "ctl" if same_id else "ctl-2"
                async with connect(host.url, host.token, client_id=new_id, client_kind="agent") as agent, \
                        ui.subscribe(["turn.ended"], session_id=sid) as events:
                    nursery.start_soon(Sidecar(agent, FakeModel(delay=0.001), new_id).run)
                    with trio.fail_after(4):  # before the host's 5 s grace could offer anything again
                        while True:
                            got = await events.next()
                            assert isinstance(got, Event)
                            if got.data["turn"]["status"] == "completed":
                                break
                    page = await ui.session.get(session_id=sid, full=True)
                    nursery.cancel_scope.cancel()
    assert [m["blocks"][0]["text"] for m in page["messages"] if m["role"] == "user"] == ["first"]



async def test_a_new_sidecar_leaves_the_turn_a_live_sidecar_runs(tmp_path: Path) -> None:
    """A second sidecar (another id) starting while the first runs a queue turn does not cut that turn:
    only a turn an earlier run under its own id left, or the host for a sidecar that is gone, ends it."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data", client_gone_after=0.5) as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ui", client_kind="ui") as ui, \
                    connect(host.url, host.token, client_id="a", client_kind="agent") as a:
                sid = (await ui.session.create(title="two"))["id"]
                await ui.session.queue_push(session_id=sid, principal="user", content="first", permission_mode="auto")
                await a.session.queue_attach(session_id=sid, controller_id="a")
                entry = (await a.session.queue_take(session_id=sid, controller_id="a"))["entry"]
                assert entry is not None
                turn = f"t_{entry['id']}"
                await a.session.start_turn(session_id=sid, turn_id=turn,
                                           environment=cast(Any, {"version": 1, "model": {"id": "m"}}))
                async with connect(host.url, host.token, client_id="b", client_kind="agent") as b:
                    nursery.start_soon(Sidecar(b, FakeModel(delay=0.001), "b").run)
                    await trio.sleep(1.5)
                    latest = (await ui.session.list_turns(session_id=sid, limit=1))["turns"][0]
                    assert (latest["id"], latest["status"]) == (turn, "running")
                    nursery.cancel_scope.cancel()
                await a.session.end_turn(session_id=sid, turn_id=turn, status="completed")


async def test_two_live_sidecars_deliver_every_prompt_once(tmp_path: Path) -> None:
    """Found by a probe: with two live sidecars (other ids) and prompts waiting, each one took the queue
    back on every session.queue event naming the other (an attach offers again what the other took), so
    they alternated forever, a delivered prompt was handed out again and the rest never ran. A sidecar
    leaves a session another live sidecar attached since, until the host says it is held (that sidecar
    gone)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", client_gone_after=0.5) as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ui", client_kind="ui") as ui, \
                    connect(host.url, host.token, client_id="a", client_kind="agent") as a, \
                    connect(host.url, host.token, client_id="b", client_kind="agent") as b:
                sid = (await ui.session.create(title="two"))["id"]
                async with ui.subscribe(["turn.ended"], session_id=sid) as events:
                    nursery.start_soon(Sidecar(a, FakeModel(delay=0.01), "a").run)
                    await ui.session.queue_push(session_id=sid, principal="user", content="p0", permission_mode="auto")
                    await trio.sleep(0.2)
                    nursery.start_soon(Sidecar(b, FakeModel(delay=0.01), "b").run)
                    for i in range(1, 5):
                        await ui.session.queue_push(session_id=sid, principal="user", content=f"p{i}",
                                                    permission_mode="auto")
                    completed = 0
                    while completed < 5:
                        got = await events.next()
                        assert isinstance(got, Event)
                        completed += got.data["turn"]["status"] == "completed"
                page = await ui.session.get(session_id=sid, full=True)
                assert (await ui.session.queue_list(session_id=sid))["entries"] == []
                nursery.cancel_scope.cancel()
    prompts = sorted(m["blocks"][0]["text"] for m in page["messages"] if m["role"] == "user")
    assert prompts == [f"p{i}" for i in range(5)]


async def test_a_delivery_admitted_to_the_queue_runs_as_collaboration_input_not_as_a_typed_prompt(
        tmp_path: Path) -> None:
    """Seed 003 §4.6c: "Collaboration provenance is stored in the transcript line's meta as sessionMessage ...
    Host validation prevents ... stripped ... collaboration input from becoming ordinary human input", and
    "turn_id is assigned when the target actually begins the delivery". The sidecar took a delivery's
    admission like any prompt and appended its content as a user message of its own: the row had no
    provenance and the delivery stayed queued with no admission (interrupted at the next start). It begins
    the delivery (``collab.begin``): the input row carries ``sessionMessage``, the delivery is bound to the
    turn, and the turn's end settles it (the source's callback is queued)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="ctl", client_kind="agent") as agent, \
                    connect(host.url, host.token, client_id="ui", client_kind="ui") as ui:
                lead = (await ui.session.create(title="lead"))["id"]
                rev = (await ui.session.create(title="rev"))["id"]
                async with ui.subscribe(["turn.ended"], session_id=rev) as events:
                    nursery.start_soon(Sidecar(agent, FakeModel(delay=0, words=2), "ctl").run)
                    sent = await ui.collab.deliver(plugin_id="team", source_session_id=lead, target_session_id=rev,
                                                   kind="task", content="review the parser",
                                                   notify_on_completion=True, idempotency_key="k1")
                    ended = await events.next()
                    assert isinstance(ended, Event) and ended.data["turn"]["status"] == "completed"
                    turn_id = ended.data["turn"]["id"]
                page = await ui.session.get(session_id=rev, full=True)
                first = page["messages"][0]
                assert first["role"] == "user" and first["blocks"][0]["text"] == "review the parser"
                assert first.get("sessionMessage", {}).get("deliveryId") == sent["delivery"]["id"]
                assert [m["id"] for m in page["messages"] if m["role"] == "user"] == [first["id"]]
                got = await ui.collab.get(delivery_id=sent["delivery"]["id"])
                assert (got["status"], got.get("turnId")) == ("completed", turn_id)
                assert got.get("callbackId") is not None
                nursery.cancel_scope.cancel()
