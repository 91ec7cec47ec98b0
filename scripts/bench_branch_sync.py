#!/usr/bin/env python3
"""First branch call of a session actor incarnation on a long session (issue 26).

    python scripts/bench_branch_sync.py                    # 500 and 50,000 messages
    python scripts/bench_branch_sync.py --sizes 500 5000 --rounds 5

For each size: a session with one saved branch (``u0``, two variants) and then ``size`` messages, written
as lines while the host is stopped and indexed by its boot (so building a large session takes seconds, not
one call per message). Then, ``rounds`` times: stop the session's actor (as its idle timeout would) and
time the first ``session.listRevisions`` of the next incarnation (the actor's start included), and a second
call of the same incarnation. Prints the median milliseconds as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.jsonio import dumps_line  # noqa: E402 - after the sys.path setup above
from tests.hostkit import client_for, inprocess_host, msg, passivate  # noqa: E402 - after the sys.path setup


async def _build(root: Path) -> str:
    async with inprocess_host(root) as host, client_for(host) as c:
        sid: str = (await c.call("session.create", {}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u0", "question")})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a0", "answer", role="assistant")})
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u0"})
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a0", "mode": "regenerate"})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a0b", "again", role="assistant")})
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u0"})
    return sid


def _grow(path: Path, count: int) -> None:
    lines = []
    for n in range(count):
        role = "user" if n % 2 == 0 else "assistant"
        rec = {"type": "message", **msg(f"m{n}", f"message {n} " + "x" * 200, role=role),
               "createdAt": "2026-01-01T00:00:00.000Z"}
        lines.append(dumps_line(rec))
    with path.open("ab") as f:
        f.write(b"".join(lines))


async def _measure(root: Path, sid: str, rounds: int) -> dict[str, float]:
    first: list[float] = []
    again: list[float] = []
    async with inprocess_host(root, session_idle_timeout=600.0) as host, client_for(host) as c:
        await c.call("session.listRevisions", {"sessionId": sid})  # boot's catch-up done, the actor started
        for _ in range(rounds):
            await passivate(host, sid)
            t0 = time.perf_counter()
            got = await c.call("session.listRevisions", {"sessionId": sid})
            first.append((time.perf_counter() - t0) * 1000)
            assert [(r["rootUserId"], r["revisionIndex"]) for r in got["revisions"]] == [("u0", 1), ("u0", 2)]
            t0 = time.perf_counter()
            await c.call("session.listRevisions", {"sessionId": sid})
            again.append((time.perf_counter() - t0) * 1000)
    return {"firstListRevisionsMs": round(statistics.median(first), 1),
            "secondListRevisionsMs": round(statistics.median(again), 1)}


async def run(sizes: list[int], rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "data"
            sid = await _build(root)
            _grow(root / "sessions" / f"{sid}.jsonl", size)
            out[str(size)] = await _measure(root, sid, rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 50_000])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(json.dumps(trio.run(run, args.sizes, args.rounds), indent=1))


if __name__ == "__main__":
    main()
