"""Pipeline edges of issue 22 (item 3): a receipt wait and the reader; the same-id race.

* A duplicate request (same clientId and submissionId) waits for the first one
  to finish and is answered from it. It waited inside the gateway's reader
  (``submit`` returned only once the request was in its target's mailbox), so
  its connection read no frame at all while the original ran — head-of-line
  blocking of everything else on that connection.
* Two appends of one message id to two sessions at once: the one whose index op
  came second is remapped to ``{sessionId}:{id}`` by the index (D444), so the
  receipt stored for it (and every replay) answered another id than its caller
  was given. The pipeline now lets one session at a time write an id
  (``Route.message_ids``): the second waits for the first's answer and remaps.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from runtime.client import HostClient, RpcError
from runtime.handlers import secrets
from runtime.host import RunningHost, run_host
from runtime.pipeline import _MessageIds
from runtime.routes import ROUTES
from tests.eventkit import count_events
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.hostkit import test_config as host_config


def _slowed_secrets_set() -> tuple[trio.Event, trio.Event, dict[str, Any]]:
    """The route table with a ``secrets.set`` that sets ``entered`` and then waits for ``gate``."""
    entered, gate = trio.Event(), trio.Event()

    async def slow_set(ctx: Any, p: Any, key: Any) -> Any:
        entered.set()
        await gate.wait()
        return await secrets.set_secret(ctx, p, key)

    return entered, gate, {**ROUTES, "secrets.set": replace(ROUTES["secrets.set"], handler=slow_set)}


async def test_a_duplicate_waiting_for_its_receipt_does_not_hold_the_reader(tmp_path: Path) -> None:
    """Reproduces: a duplicate's receipt wait blocked its connection's reader while the original ran."""
    entered, gate, routes = _slowed_secrets_set()
    params = {"ref": "dup", "value": "v", "submissionId": "s-dup"}
    answers: list[Any] = []

    async def send(c: HostClient) -> None:
        answers.append(await c.call("secrets.set", params))

    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            host: RunningHost = await outer.start(functools.partial(
                run_host, host_config(tmp_path / "data"), routes=routes))
            async with client_for(host, "same") as first, client_for(host, "same") as second, \
                    trio.open_nursery() as calls:
                calls.start_soon(send, first)
                await entered.wait()
                calls.start_soon(send, second)  # the duplicate: waits for the first to finish
                await trio.testing.wait_all_tasks_blocked()
                with trio.fail_after(5):  # the duplicate's connection still reads and answers frames
                    subscribed = await second.call("events.subscribe", {"topics": ["session.message"]})
                    with pytest.raises(RpcError) as bad:
                        await second.call("settings.get", {"key": 5})
                assert subscribed["subscriptionId"]
                assert bad.value.code == -32602
                assert answers == [] and not gate.is_set()
                gate.set()
            assert len(answers) == 2 and answers[0] == answers[1]
            assert answers[0]["version"] == 1  # one effect
            outer.cancel_scope.cancel()


async def test_requests_a_closed_connection_had_not_dispatched_never_run(tmp_path: Path) -> None:
    """Requests queued behind a slow write are dropped when their connection closes: nobody reads
    their answers, and a heavy batch from a client that left must not keep the host busy."""
    entered, gate, routes = _slowed_secrets_set()

    async def send(c: HostClient) -> None:
        await c.pipelined([("secrets.set", {"ref": "slow", "value": "v"}),
                           ("settings.set", {"key": "largePasteThreshold", "value": 777})])

    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            host: RunningHost = await outer.start(functools.partial(
                run_host, host_config(tmp_path / "data"), routes=routes))
            async with client_for(host, "leaves") as c, trio.open_nursery() as calls:
                calls.start_soon(send, c)
                await entered.wait()
                await trio.testing.wait_all_tasks_blocked()
                calls.cancel_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()  # the host saw the connection close
            gate.set()
            await host.pipeline.drained()
            async with client_for(host, "after") as after:
                assert (await after.call("secrets.list", {}))["secrets"][0]["ref"] == "slow"  # it ran on
                assert (await after.call("settings.get", {"key": "largePasteThreshold"})).get("value") != 777
            outer.cancel_scope.cancel()


async def _append(c: HostClient, sid: str, key: str, mid: str) -> Any:
    try:
        return await c.call("session.appendMessage",
                            {"sessionId": sid, "submissionId": key, "message": msg(mid, f"text of {mid}")})
    except RpcError as exc:
        return ("error", exc.data_code)


async def test_same_message_id_appended_to_two_sessions_at_once_replays_what_each_caller_got(
        tmp_path: Path) -> None:
    """Reproduces: concurrent appends of one message id to two sessions; the index remapped the later one
    (``{sessionId}:{id}``), so its stored receipt — replayed after a restart — named another id than the
    answer its caller got."""
    root = tmp_path / "data"
    answered: dict[tuple[str, str, str], Any] = {}
    with trio.fail_after(90):
        async with inprocess_host(root) as host, client_for(host, "same") as a, client_for(host, "same") as b:
            one = (await a.call("session.create", {"title": "one"}))["id"]
            two = (await a.call("session.create", {"title": "two"}))["id"]
            for r in range(8):
                mid = f"m{r}"
                sends = [(a, one, f"k{r}-one"), (b, two, f"k{r}-two")]

                async def send(c: HostClient, sid: str, key: str, mid: str = mid) -> None:
                    answered[(sid, key, mid)] = await _append(c, sid, key, mid)

                async with trio.open_nursery() as nursery:
                    for c, sid, key in sends:
                        nursery.start_soon(send, c, sid, key)
            await index_caught_up(host)
        async with inprocess_host(root) as host, client_for(host, "same") as c:
            replayed = {(sid, key, mid): await _append(c, sid, key, mid) for sid, key, mid in answered}
    mismatched = {k: (answered[k], replayed[k]) for k in answered if answered[k] != replayed[k]}
    assert not mismatched


async def test_a_message_id_claim_builds_an_event_only_when_another_session_waits_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``_MessageIds`` (one session at a time writes an id): an uncontended claim, every append's, builds no
    event; a second session's claim of a held id waits for the first's release and then goes on."""
    ids = _MessageIds()
    events = count_events(monkeypatch)
    for i in range(5):
        (await ids.claim("s1", (f"m{i}",)))()
    assert events.built == 0
    release = await ids.claim("s1", ("shared",))
    got: list[str] = []

    async def other() -> None:
        (await ids.claim("s2", ("shared",)))()
        got.append("s2")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        await trio.testing.wait_all_tasks_blocked()
        assert got == [] and events.built == 1
        release()
    assert got == ["s2"]
    (await ids.claim("s3", ("shared",)))()  # released by both: free again
