"""Command receipts, generated from the route table: one test per mutating method.

For each method (``scenarios.SCENARIOS``, which must cover every mutating
route): two requests with the same key sent at once on two connections run
the effect once and get one response; a retry returns the identical response
and changes nothing in the data directory; another request with that key is
``IDEMPOTENCY_CONFLICT`` and changes nothing; after a restart the retry is
still answered from the receipt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import RpcError
from runtime.routes import ROUTES, Via
from store import receipts
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.pipeline import probe
from tests.pipeline.scenarios import SCENARIOS
from tests.threadkit import on_trio_thread

MUTATING = sorted(name for name, spec in METHODS.items() if spec.mutating)


def test_every_mutating_route_has_a_scenario() -> None:
    assert set(SCENARIOS) == set(MUTATING)
    assert all(ROUTES[name].via is not Via.CONNECTION for name in MUTATING)


async def _call(c: Any, method: str, params: dict[str, Any]) -> Any:
    try:
        return ("ok", await c.call(method, params))
    except RpcError as exc:
        return ("error", exc.data_code, exc.message)


@pytest.mark.parametrize("method", MUTATING)
async def test_receipt(tmp_path: Path, method: str) -> None:
    scenario = SCENARIOS[method]
    root = tmp_path / "data"
    key = {"submissionId": f"sub-{method}"}
    with trio.fail_after(60):
        # the setup runs as the client that then sends the keyed request (its own submissionIds): what it
        # holds is its own, as a queue controller it attached, which only the attaching client may take from
        async with inprocess_host(root) as host, client_for(host, "same", kind=scenario.kind) as setup:
            v = await scenario.setup(setup, root)
            params = {**scenario.params(v), **key}
            before = scenario.count(root, v) if scenario.count else None
            async with client_for(host, "same", kind=scenario.kind) as a, \
                    client_for(host, "same", kind=scenario.kind) as b:
                answers: list[Any] = [None, None]

                async def send(i: int, c: Any) -> None:
                    answers[i] = await _call(c, method, params)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(send, 0, a)
                    nursery.start_soon(send, 1, b)
                assert answers[0][0] == "ok", answers[0]
                assert answers[0] == answers[1], "two requests with one key must get one answer"
                first = answers[0][1]
                once = scenario.count(root, v) if scenario.count else None
                if scenario.count:
                    assert before is not None and once is not None
                    assert abs(once - before) == 1, f"{method}: {before} -> {once}: not exactly one effect"
                await index_caught_up(host)
                state = probe.state(root)
                assert await a.call(method, params) == first
                await index_caught_up(host)
                assert probe.state(root) == state, f"{method}: a retry changed the data directory"
                other_method, other = scenario.other(v)
                with pytest.raises(RpcError) as err:
                    await b.call(other_method, {**other, **key})
                assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
                await index_caught_up(host)
                assert probe.state(root) == state, f"{method}: a conflicting request changed the data directory"
                if scenario.count:
                    assert scenario.count(root, v) == once
        async with inprocess_host(root) as host, client_for(host, "same", kind=scenario.kind) as again:
            await index_caught_up(host)
            state = probe.state(root)  # after boot (its fence may have changed rows, e.g. interrupted approvals)
            assert await again.call(method, params) == first, f"{method}: the receipt did not survive a restart"
            await index_caught_up(host)
            assert probe.state(root) == state


@pytest.mark.parametrize("method", ["session.appendMessage", "session.rename", "session.truncateFrom"])
async def test_a_retry_after_the_session_was_deleted_is_answered_from_its_receipt(tmp_path: Path,
                                                                                   method: str) -> None:
    """A completed request's answer outlives its session (and the host process)."""
    scenario = SCENARIOS[method]
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, "same") as c:
            v = await scenario.setup(c, root)
            params = {**scenario.params(v), "submissionId": "before-delete"}
            first = await c.call(method, params)
            await c.call("session.delete", {"sessionId": v["sid"]})
        async with inprocess_host(root) as host, client_for(host, "same") as c:
            assert await c.call(method, params) == first
            with pytest.raises(RpcError) as err:
                await c.call(method, {**params, "submissionId": "after-delete"})
            assert err.value.data_code == "SESSION_NOT_FOUND"


async def test_a_retry_spelling_its_params_in_snake_case_is_the_same_request(tmp_path: Path) -> None:
    """README §2 accepts snake_case spellings of params, and §4 fingerprints "the method and its params":
    a retry of an append whose fields are spelled session_id / message was IDEMPOTENCY_CONFLICT (a raw-key
    fingerprint). The fingerprint takes the wire spelling, so it is answered from its receipt; other
    params under the same key are still a conflict."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {}))["id"]
            record = {"id": "m1", "role": "user", "blocks": [{"type": "text", "text": "hi"}]}
            first = await c.call("session.appendMessage", {"sessionId": sid, "message": record, "submissionId": "k"})
            again = await c.call("session.appendMessage", {"session_id": sid, "message": record,
                                                           "submission_id": "k"})
            assert again == first
            with pytest.raises(RpcError) as err:
                await c.call("session.appendMessage", {"session_id": sid, "message": {**record, "id": "m2"},
                                                       "submission_id": "k"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            assert [m["id"] for m in page["messages"]] == ["m1"]


async def test_long_params_are_fingerprinted_off_the_trio_thread(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyed request's receipt fingerprint (its params as sorted JSON, SHA-256) grows with the params: a
    message of megabytes is fingerprinted in a worker thread, never on the trio loop; a small append keeps
    its synchronous fast path (fingerprinted on the loop, no thread hop). The receipt means the same: the
    same key with the same params is answered from it, with other params IDEMPOTENCY_CONFLICT."""
    seen: list[tuple[str, bool]] = []
    fingerprint = receipts.fingerprint

    def fingerprint_seen(method: str, params: Any) -> str:
        text = params["message"]["blocks"][0]["text"]
        seen.append(("long" if len(text) > 100_000 else "short", on_trio_thread()))
        return fingerprint(method, params)

    monkeypatch.setattr(receipts, "fingerprint", fingerprint_seen)
    long_text = "x" * 1_500_000
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "keyed"}))["id"]

            def append(mid: str, text: str, key: str) -> Any:
                return _call(c, "session.appendMessage",
                             {"sessionId": sid, "message": msg(mid, text), "submissionId": key})

            small = await append("m1", "hello", "k-small")
            large = await append("m2", long_text, "k-large")
            assert small[0] == "ok" and large[0] == "ok", (small, large)
            assert await append("m2", long_text, "k-large") == large  # the same answer, from the receipt
            assert await append("m1", "hello", "k-small") == small
            conflict = await append("m2", long_text + "y", "k-large")
            assert conflict[:2] == ("error", "IDEMPOTENCY_CONFLICT")
            assert (await append("m3", long_text, "k-small"))[:2] == ("error", "IDEMPOTENCY_CONFLICT")
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["m1", "m2"]
    assert sorted(set(seen)) == [("long", False), ("short", True)]
