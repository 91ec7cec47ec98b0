"""``import.sessions`` SIGKILLed between a session's transcript write and its index commit, restarted, retried
with the same clientId + submissionId: the sessions end as a crash-free import leaves them.

An import writes a session's transcript (links a new one, or appends a grown source's new lines), then commits
its index rows in one transaction: the messages, the usage turn rows of the responses, the session's model and
the origin row. Killed in between, boot indexes the transcript's messages (and rebuilds the origin row from the
``session_info`` line), but turn rows and the model are the import's alone. The retry parsed the source again,
found every line already in the transcript, wrote nothing and so recorded nothing: the session kept no turns
(``session.listTurns`` empty, no ``latestTurn``, ``usage.session`` zero) and no model (``modelId``,
``providerId``, ``historyModel`` null) for good. Now a re-import records what the lines it finds held lack.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import call_killed_at, client_for, index_caught_up, inprocess_host

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code" / "2.1.197" / "projects"
CLIENT = "importer-1"
SUBMISSION = "imp-crash-1"

# (scenario, point, nth): "fresh" imports six new sessions; "grown" re-imports a session whose source grew
POINTS = [
    ("fresh", "import.after_link", 1),  # the first session's transcript linked, nothing committed
    ("fresh", "import.after_link", 4),  # three sessions committed, the fourth linked
    ("fresh", "index.before_commit", 1),  # the first session's index transaction, not committed
    ("grown", "import.after_append_write", 1),  # the grown session's new lines written, not committed
    ("grown", "index.before_commit", 1),
]


def _params(src: Path) -> dict[str, Any]:
    return {"source": "claude-code", "root": str(src), "submissionId": SUBMISSION}


def _biggest(src: Path) -> Path:
    return max((p for p in src.rglob("*.jsonl") if "subagents" not in p.parts), key=lambda p: p.stat().st_size)


async def _setup(tmp: Path, scenario: str) -> tuple[Path, Path]:
    """A copy of the recorded Claude Code projects and a data directory; "grown": its biggest session imported
    from the first half of its file, then the file back whole (the call re-imports it)."""
    src, data = tmp / "projects", tmp / "data"
    shutil.copytree(SOURCE, src)
    if scenario == "grown":
        big = _biggest(src)
        whole = big.read_bytes()
        lines = whole.splitlines(keepends=True)
        big.write_bytes(b"".join(lines[: len(lines) // 2]))
        async with inprocess_host(data) as host, client_for(host, CLIENT, "ui") as c:
            await c.call("import.sessions", {"source": "claude-code", "root": str(src)})
            await index_caught_up(host)
        big.write_bytes(whole)
    return src, data


def _transcripts(data: Path) -> dict[str, list[bytes]]:
    """Each session's transcript lines after its header (the header's epoch is the file's own), an
    ``import_receipt`` line's request fingerprint left out (it hashes the params: the root is each run's own)."""
    out = {}
    for path in sorted((data / "sessions").glob("*.jsonl")):
        if not path.name.endswith(".revisions.jsonl"):
            out[path.name] = [_without_fingerprint(line) for line in path.read_bytes().splitlines(keepends=True)[1:]]
    return out


def _without_fingerprint(line: bytes) -> bytes:
    if not line.startswith(b'{"type":"import_receipt"'):
        return line
    rec = orjson.loads(line)
    rec["receipt"]["fingerprint"] = "<fingerprint>"
    return orjson.dumps(rec) + b"\n"


async def _state(c: HostClient, data: Path) -> dict[str, Any]:
    """What a person sees of the imported sessions: summaries, messages, turns, usage, and the files."""
    sessions = (await c.call("session.list", {}))["sessions"]
    out: dict[str, Any] = {"transcripts": _transcripts(data)}
    for s in sessions:
        sid = s["id"]
        turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
        got = await c.call("session.get", {"sessionId": sid, "full": True})
        out[sid] = {
            "summary": {k: v for k, v in s.items() if k != "updatedAt"},
            "turns": turns,
            "usage": await c.call("usage.session", {"sessionId": sid}),
            "messages": [orjson.dumps(m, option=orjson.OPT_SORT_KEYS) for m in got["messages"]],
        }
    return out


async def _crash_free(tmp: Path, scenario: str) -> tuple[Any, dict[str, Any]]:
    src, data = await _setup(tmp, scenario)
    async with inprocess_host(data) as host, client_for(host, CLIENT, "ui") as c:
        answer = await c.call("import.sessions", _params(src))
        await index_caught_up(host)
        return answer, await _state(c, data)


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any]]]:
    return {scenario: trio.run(_crash_free, tmp_path_factory.mktemp(f"ref-{scenario}"), scenario)
            for scenario in ("fresh", "grown")}


async def _killed_during_import(src: Path, data: Path, point: str, nth: int) -> None:
    await call_killed_at(data, point, "import.sessions", _params(src), nth=nth, client_id=CLIENT)


def test_a_crash_free_import_records_turns_and_models(references: dict[str, tuple[Any, dict[str, Any]]]) -> None:
    """What the crash cases compare against holds what they lost (else the comparison proves nothing)."""
    for scenario, (answer, state) in references.items():
        assert answer["counts"]["refused"] == 0, scenario
        sessions = [v for k, v in state.items() if k != "transcripts"]
        assert sessions and all(s["turns"] for s in sessions), scenario
        assert all(s["summary"]["latestTurn"] and s["summary"]["modelId"] and s["summary"]["providerId"]
                   and s["summary"]["historyModel"] for s in sessions), scenario
        assert all(s["usage"]["total"]["turns"] == len(s["turns"]) for s in sessions), scenario


@pytest.mark.parametrize(("scenario", "point", "nth"), POINTS)
async def test_an_import_killed_before_its_commit_is_kept_as_without_the_crash(
        tmp_path: Path, references: dict[str, tuple[Any, dict[str, Any]]], scenario: str, point: str,
        nth: int) -> None:
    _, ref_state = references[scenario]
    src, data = await _setup(tmp_path, scenario)
    await _killed_during_import(src, data, point, nth)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "ui") as c:
            first = await c.call("import.sessions", _params(src))
            assert first["counts"]["refused"] == 0
            assert await c.call("import.sessions", _params(src)) == first  # the retry's answer, kept
            await index_caught_up(host)
            state = await _state(c, data)
    for name, lines in state["transcripts"].items():
        record_ids = [orjson.loads(line).get("id") for line in lines]
        twice = [rid for rid, n in Counter(record_ids).items() if rid is not None and n > 1]
        assert not twice, f"{name}: lines written twice for {twice}"
    assert state.keys() == ref_state.keys()
    for key, ref in ref_state.items():
        assert state[key] == ref, f"killed at {point}:{nth}: {key} differs from a crash-free import's"
