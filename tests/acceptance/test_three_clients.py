"""Three real clients on one real host process: a streaming sidecar, a subscribed UI, a UI that
connects mid-reply; a permission prompt answered by the first UI; then SIGKILL mid-request.

Every event a client receives is validated against its protocol model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from protocol.methods import EVENTS
from runtime.client import ClientEvent, HostClient, RpcError, open_client
from tests.hostkit import start_host_process

THROTTLE = 0.25  # the host's default session.inflight interval
SLACK = 0.35  # scheduling on a shared 2-core machine
CHECKPOINT_EVERY = 0.1



class Ui:
    """What a UI shows: the reply being streamed, the messages, the prompts; with receive times."""

    def __init__(self, client: HostClient, sid: str) -> None:
        self.client, self.sid = client, sid
        self.previews: list[tuple[float, str, str]] = []  # (time, message id, text)
        self.finals: list[tuple[float, str, str]] = []
        self.prompts: list[dict[str, Any]] = []
        self.resolved: list[dict[str, Any]] = []
        self.got_prompt = trio.Event()

    def show_page(self, page: dict[str, Any]) -> None:
        live = page.get("inflight")
        if live is not None:
            m = live["message"]
            self.previews.append((trio.current_time(), m["id"], m["blocks"][0]["text"]))

    async def run(self) -> None:
        async for event in self.client:
            _validate(event)
            data = event.data
            if event.topic == "session.inflight":
                assert event.transient
                m = data["message"]
                self.previews.append((trio.current_time(), m["id"], m["blocks"][0]["text"]))
            elif event.topic == "session.message" and data["message"]["role"] == "assistant":
                self.finals.append((trio.current_time(), data["message"]["id"], data["record"]["blocks"][0]["text"]))
            elif event.topic == "approval.requested":
                self.prompts.append(data["request"])
                self.got_prompt.set()
            elif event.topic == "approval.resolved":
                self.resolved.append(data["request"])


def _validate(event: ClientEvent) -> None:
    EVENTS[event.topic].model_validate(event.data)


def _text(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n + 1))


def _check_latency(ui: Ui, acks: list[tuple[float, int]], mid: str, since: float) -> None:
    """Every acknowledged checkpoint, a newer one, or the final message was on screen within one
    throttle period (a preview still pending when the final lands is dropped: the final is newer)."""
    shown = [(t, len(text.split()) - 1) for t, m, text in ui.previews if m == mid]
    shown += [(t, 10**6) for t, m, _ in ui.finals if m == mid]
    shown.sort()
    for acked_at, k in acks:
        if acked_at < since:
            continue
        first = next((t for t, n in shown if n >= k and t >= since - 1), None)
        assert first is not None, f"checkpoint {k} never shown"
        assert first - acked_at <= THROTTLE + SLACK, f"checkpoint {k} shown {first - acked_at:.3f}s late"


async def test_three_clients_stream_prompt_and_survive_a_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(120):
        proc = await trio.to_thread.run_sync(start_host_process, data)
        killed = False
        try:
            async with open_client(proc.url, proc.token, client_id="sidecar", client_kind="agent") as sc, \
                    open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as c1, \
                    trio.open_nursery() as nursery:
                sid = (await sc.call("session.create", {"title": "three clients"}))["id"]
                await sc.call("events.subscribe", {"topics": ["approval.resolved"], "sessionId": sid})
                ui1 = Ui(c1, sid)
                await c1.subscribe(["session.inflight", "session.message", "approval.requested",
                                    "approval.resolved"], session_id=sid)
                nursery.start_soon(ui1.run)
                await sc.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
                await sc.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "submissionId": "u1",
                                                        "message": {"id": "u1", "role": "user",
                                                                    "blocks": [{"type": "text", "text": "explain"}]}})
                acks: list[tuple[float, int]] = []
                ui2: Ui | None = None
                joined_at = 0.0
                async with open_client(proc.url, proc.token, client_id="ui-2", client_kind="ui") as c2:
                    for k in range(20):  # 2 s of streaming, a checkpoint every 100 ms
                        await sc.call("session.saveInflightMessage", {
                            "sessionId": sid, "turnId": "t1", "submissionId": f"cp-{k}",
                            "message": {"id": "a1", "role": "assistant",
                                        "blocks": [{"type": "text", "text": _text(k)}]}})
                        acks.append((trio.current_time(), k))
                        if k == 8:  # the second UI connects mid-reply: the page shows the partial reply
                            ui2 = Ui(c2, sid)
                            joined_at = trio.current_time()
                            ui2.show_page(await c2.call("session.get", {"sessionId": sid}))
                            assert ui2.previews and ui2.previews[0][1] == "a1"
                            assert len(ui2.previews[0][2].split()) - 1 >= 8
                            await c2.subscribe(["session.inflight", "session.message"], session_id=sid)
                            nursery.start_soon(ui2.run)
                        await trio.sleep(CHECKPOINT_EVERY)
                    await sc.call("session.appendMessage", {
                        "sessionId": sid, "turnId": "t1", "submissionId": "a1",
                        "message": {"id": "a1", "role": "assistant", "blocks": [{"type": "text", "text": _text(25)}]}})
                    await trio.sleep(THROTTLE + SLACK)
                    assert ui2 is not None
                    for ui, since in ((ui1, 0.0), (ui2, joined_at)):
                        _check_latency(ui, acks, "a1", since)
                        assert [(m, t) for _, m, t in ui.finals] == [("a1", _text(25))]  # the final, once
                        final_at = ui.finals[0][0]
                        assert all(t <= final_at for t, m, _ in ui.previews if m == "a1")  # no preview after it
                        assert len(ui.previews[-1][2].split()) >= 15  # the partial text grew on screen
                    assert len(ui1.previews) < 20  # coalesced: fewer previews than checkpoints
                await sc.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})

                # a permission prompt answered by the first UI unblocks the sidecar
                await sc.call("session.startTurn", {"sessionId": sid, "turnId": "t2"})
                asked = await sc.call("approvals.request", {"sessionId": sid, "turnId": "t2", "tool": "Bash",
                                                            "argsSummary": "make test", "risk": "medium"})
                with trio.fail_after(5):
                    await ui1.got_prompt.wait()
                assert ui1.prompts[0]["requestId"] == asked["request"]["requestId"]
                await c1.call("approvals.respond", {"sessionId": sid, "requestId": ui1.prompts[0]["requestId"],
                                                    "optionId": "allow_once"})
                with trio.fail_after(5):
                    async for event in sc:
                        _validate(event)
                        if event.topic == "approval.resolved":
                            assert event.data["request"]["status"] == "allowed"
                            break

                # streaming goes on, a second prompt is pending ... and the host is SIGKILLed
                for k in range(4):
                    await sc.call("session.saveInflightMessage", {
                        "sessionId": sid, "turnId": "t2",
                        "message": {"id": "a2", "role": "assistant", "blocks": [{"type": "text", "text": _text(k)}]}})
                    await trio.sleep(CHECKPOINT_EVERY)
                second = await sc.call("approvals.request", {"sessionId": sid, "turnId": "t2", "tool": "Write",
                                                             "argsSummary": "write out.txt", "risk": "high"})
                pending_id = second["request"]["requestId"]
                await trio.to_thread.run_sync(proc.kill9)
                killed = True
                nursery.cancel_scope.cancel()
        finally:
            if not killed:
                await trio.to_thread.run_sync(proc.kill9)
        proc = await trio.to_thread.run_sync(start_host_process, data)
        try:
            async with open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as c1:
                assert (await c1.call("approvals.pending", {"sessionId": sid})) == {"pending": []}
                try:
                    await c1.call("approvals.respond", {"sessionId": sid, "requestId": pending_id,
                                                        "optionId": "allow_once"})
                except RpcError as exc:
                    assert exc.data_code == "CONFLICT" and exc.data["status"] == "interrupted"
                else:
                    raise AssertionError("a late answer was accepted")
                page = await c1.call("session.get", {"sessionId": sid})
                texts = {m["id"]: (m["blocks"][0]["text"], (m.get("meta") or {}).get("status"))
                         for m in page["messages"]}
                # nothing is lost: every acknowledged row, and the last checkpoint promoted as aborted
                assert texts["u1"] == ("explain", None) and texts["a1"] == (_text(25), None)
                assert texts["a2"] == (_text(3), "aborted")
                assert {d["requestId"]: d["status"] for d in page["decisions"]} == {
                    asked["request"]["requestId"]: "allowed", pending_id: "interrupted"}
                assert "inflight" not in page
                listed = await c1.call("session.listTurns", {"sessionId": sid})
                turns = {t["id"]: t["status"] for t in listed["turns"]}
                assert turns == {"t1": "completed", "t2": "aborted"}
        finally:
            await trio.to_thread.run_sync(proc.terminate)
