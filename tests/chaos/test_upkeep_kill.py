"""SIGKILL inside and right after a search-index merge step of the idle DB writer
(RT_CRASHPOINT): nothing acknowledged is lost, search counts what was written, the FTS
index passes FTS5's integrity check."""

from __future__ import annotations

import random
import signal
import sqlite3
from pathlib import Path
from typing import Any

import trio

from runtime.client import ClientClosed, open_client
from runtime.datadir import DataDir
from tests.hostkit import HostProcess, msg, start_host_process

WORDS = ["alpha", "beta", "gamma", "delta", "the", "to", "of", "merge", "segment", "検索", "索引", "données"]
QUERIES = ["the", "gamma de", "検索", "merge seg", "a the"]


def _client(proc: HostProcess) -> Any:
    return open_client(proc.url, proc.token, client_id="upkeep-kill", client_kind="test")


async def _searches(c: Any) -> list[Any]:
    out = []
    for q in QUERIES:
        res = await c.call("search.sessions", {"query": q, "limit": 100})
        out.append((res["totalSessions"], res["totalMessageMatches"],
                    sorted((r["sessionId"], r["messageMatches"]) for r in res["results"])))
    return out


def _expected(texts: dict[str, str]) -> list[int]:
    return [sum(1 for t in texts.values() if q in t.lower()) for q in QUERIES]


async def _fill(proc: HostProcess, rng: random.Random, texts: dict[str, str], maybe: dict[str, str],
                n: int) -> None:
    """Append ``n`` messages, one DB transaction each (many small FTS segments).

    ``texts`` gets the acknowledged ones; on a loaded machine the writer may idle
    long enough to reach the crash point before the last append, whose message
    then goes to ``maybe`` (written or not, never twice).
    """
    try:
        async with _client(proc) as c:
            sessions = [(await c.call("session.create", {"title": f"k{i}"}))["id"] for i in range(3)]
            for _ in range(n):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
                mid = f"m{len(texts) + len(maybe)}"
                maybe[mid] = text
                await c.call("session.appendMessage", {"sessionId": rng.choice(sessions), "message": msg(mid, text)})
                texts[mid] = maybe.pop(mid)
    except (ClientClosed, OSError):
        pass


def test_sigkill_during_search_upkeep_loses_nothing(tmp_path: Path) -> None:
    rng = random.Random(11)
    texts: dict[str, str] = {}
    maybe: dict[str, str] = {}
    data = tmp_path / "data"
    # SIGKILL inside a merge transaction (before its COMMIT), then right after one
    for point in ("upkeep.before_commit", "upkeep.after_commit"):
        proc = start_host_process(data, "--search-upkeep-after", "0.5", env={"RT_CRASHPOINT": f"{point}:1:kill"})
        trio.run(_fill, proc, rng, texts, maybe, 150)
        proc.proc.communicate(timeout=60)  # the idle writer reaches the crash point by itself
        assert proc.proc.returncode == -signal.SIGKILL

    proc = start_host_process(data, "--search-upkeep-after", "0")  # no upkeep: check the state as left

    async def check() -> None:
        async with _client(proc) as c:
            listed = await c.call("session.list", {"limit": 100})
            ids: list[str] = []
            for s in listed["sessions"]:
                got = await c.call("session.get", {"sessionId": s["id"], "messageLimit": 1000})
                ids += [m["id"] for m in got["messages"]]
            assert len(ids) == len(set(ids))  # nothing twice
            assert set(texts) <= set(ids) <= set(texts) | set(maybe)  # every acknowledged message
            found = await _searches(c)
            assert [f[1] for f in found] == _expected({i: {**texts, **maybe}[i] for i in ids})

    trio.run(check)
    proc.proc.send_signal(signal.SIGTERM)
    proc.proc.communicate(timeout=60)
    assert proc.proc.returncode == 0
    conn = sqlite3.connect(DataDir(data).db_path)
    try:
        conn.execute("PRAGMA trusted_schema = ON")
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")  # raises if damaged
        assert conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
    finally:
        conn.close()
