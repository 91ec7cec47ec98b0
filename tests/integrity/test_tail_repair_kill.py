"""RELIABILITY.md rows 4 and 17 at the one recovery step no other test killed: ``repair.after_quarantine``, the
moment the writer's open has copied a torn tail aside (``<sid>.jsonl.torn-<ms>``) and not yet cut it off the
transcript. A host SIGKILLed there, during the append that opened the writer, then started again: the retry
of that append (same ``submissionId``) lands once, after the acknowledged lines and glued to nothing; every
line of the file parses; ``session.get`` and ``search.query`` over the wire show every acknowledged message
once with its content; the torn bytes are kept aside, never dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import msg
from tests.integrity.test_reliability_outsider_a import TORN, host, killed_during, parsed, transcript

TAILS = {"cut": TORN[:37], "nul": b"\0" * 18, "nonl": TORN[:-1]}


async def _texts(c: HostClient, sid: str) -> list[tuple[str, str]]:
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    return [(m["id"], m["blocks"][0]["text"]) for m in got["messages"]]


@pytest.mark.parametrize("tail", sorted(TAILS))
async def test_a_kill_between_the_tail_copy_and_the_cut_recovers_once_and_glues_nothing(
        tmp_path: Path, tail: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "torn"})
        for i in range(2):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"quokka acked {i}")})
        # from a thread: the loop answers the host's closing handshake meanwhile (blocked, it would wait out the
        # host's 5 s close timeout)
        assert await trio.to_thread.run_sync(proc.terminate) == 0
    with transcript(data, "s1").open("ab") as fh:
        fh.write(TAILS[tail])
    params: dict[str, Any] = {"sessionId": "s1", "submissionId": "after-the-tail",
                              "message": msg("m2", "quokka the next append")}

    async def append(c: HostClient) -> None:
        await c.call("session.appendMessage", params)

    await killed_during(data, "repair.after_quarantine:1:kill", append)
    assert transcript(data, "s1").read_bytes().endswith(TAILS[tail]), "the tail was cut before the point"
    async with host(data) as (proc, c):
        first = await c.call("session.appendMessage", params)
        again = await c.call("session.appendMessage", params)
        shown = await _texts(c, "s1")
        found = await c.call("search.query", {"query": "quokka"})
    async with host(data) as (proc, c):  # and after one more restart
        shown_later = await _texts(c, "s1")
    want = [("m0", "quokka acked 0"), ("m1", "quokka acked 1"), ("m2", "quokka the next append")]
    assert first == again and first["message"]["id"] == "m2" and first["message"]["seq"] == 3, (first, again)
    assert shown == want and shown_later == want, (shown, shown_later)
    assert sorted(r["messageId"] for r in found["results"]) == ["m0", "m1", "m2"], found
    records = parsed(transcript(data, "s1"))  # every line parses: nothing glued to the torn bytes
    assert [r["id"] for r in records if r.get("type") == "message"] == ["m0", "m1", "m2"]
    kept = sorted((data / "sessions").glob("s1.jsonl.torn-*"))
    assert kept and all(p.read_bytes() == TAILS[tail] for p in kept), [(p.name, p.read_bytes()) for p in kept]
