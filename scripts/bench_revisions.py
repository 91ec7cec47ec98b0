#!/usr/bin/env python3
"""Revisions growth benchmark: 40 regenerate-and-continue turns on one branch.

    python scripts/bench_revisions.py                 # 40 turns, 2 KB messages
    python scripts/bench_revisions.py --turns 100 --message-bytes 8192 --out DIR

Runs a real in-process host (boot, actors, gateway) on a temporary data
directory and drives it over the WebSocket client. The first turn is
regenerated once, so family ``u001`` has an archived variant and a live one.
Every later turn: append the prompt and the reply, regenerate the reply
(``session.truncateFrom`` mode ``regenerate`` archives the discarded tail),
append the new reply, then ``session.saveActiveRevision`` for the new turn's
family *and* for ``u001`` — whose live branch now holds every turn since.

Reports the revisions file size after every finished turn and its per-turn
growth, which must be constant for a live branch (a ``revision_live`` reference
line instead of a copy of the growing suffix), plus what the naive design (a
full ``revision`` line for ``u001``'s branch per turn) would have written.

Prints the figures as JSON, writes ``DIR/bench_revisions.json`` when ``--out``
is given and returns the dict from :func:`run`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.client import open_client  # noqa: E402 - after the sys.path setup above
from runtime.config import HostConfig  # noqa: E402 - after the sys.path setup above
from runtime.datadir import DataDir  # noqa: E402 - after the sys.path setup above
from runtime.host import run_host  # noqa: E402 - after the sys.path setup above
from store.revisions import revision_line  # noqa: E402 - after the sys.path setup above


def _msg(mid: str, role: str, size: int) -> dict[str, Any]:
    text = (f"{mid} " * (size // (len(mid) + 1) + 1))[:size]
    return {"id": mid, "role": role, "blocks": [{"type": "text", "text": text}],
            "createdAt": "2026-01-01T00:00:00.000Z"}


async def _drive(root: Path, turns: int, size: int) -> dict[str, Any]:
    cfg = replace(HostConfig(data_dir=DataDir(root), port=0), session_idle_timeout=600.0, integrity_sweep_interval=None)
    rev_path = trio.Path(root / "sessions" / "bench.revisions.jsonl")  # stat off the loop: the host runs on it
    sizes: list[int] = []
    naive = 0
    branch: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        host = await nursery.start(run_host, cfg)
        async with open_client(host.url, host.token, client_id="bench") as c:
            sid = "bench"
            await c.call("session.create", {"sessionId": sid, "title": "bench"})

            async def append(m: dict[str, Any]) -> None:
                await c.call("session.appendMessage", {"sessionId": sid, "message": m})

            for i in range(1, turns + 1):
                u, a, a2 = _msg(f"u{i:03d}", "user", size), _msg(f"a{i:03d}", "assistant", size), \
                    _msg(f"b{i:03d}", "assistant", size)
                await append(u)
                await append(a)
                if i == 1:
                    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": u["id"]})
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": a["id"], "mode": "regenerate"})
                await append(a2)
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": u["id"]})
                if i > 1:
                    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u001"})
                branch += [u, a2]
                naive += len(revision_line("u001", 2, branch, {}, created_at_ms=0))
                sizes.append((await rev_path.stat()).st_size)
            revs = await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": "u001"})
        transcript = (await trio.Path(root / "sessions" / "bench.jsonl").stat()).st_size
        nursery.cancel_scope.cancel()
    growth = [b - a for a, b in pairwise(sizes)]
    steady = growth[1:] if len(growth) > 1 else growth
    return {
        "turns": turns,
        "messageBytes": size,
        "revisionsBytesPerTurn": sizes,
        "growthPerTurn": growth,
        "constantGrowth": len(set(steady)) <= 1,
        "steadyGrowthBytes": steady[0] if steady else 0,
        "finalRevisionsBytes": sizes[-1] if sizes else 0,
        "naiveRevisionsBytes": naive,
        "transcriptBytes": transcript,
        "u001Variants": [(r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs["revisions"]],
        "seconds": round(time.perf_counter() - t0, 3),
    }


def run(turns: int = 40, message_bytes: int = 2048, out: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-rev-") as tmp:
        result = trio.run(_drive, Path(tmp), turns, message_bytes)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_revisions.json").write_text(json.dumps(result, indent=2))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--message-bytes", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = run(args.turns, args.message_bytes, args.out)
    print(json.dumps(result))
    return 0 if result["constantGrowth"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
