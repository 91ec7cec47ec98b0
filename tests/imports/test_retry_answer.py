"""``import.sessions`` killed, or failed with a storage error, at any fault point it passes, then retried with the
same clientId + submissionId: the retry answers exactly what a crash-free single call answers (the counts, every
session's report, the import id), and the sessions read as that call leaves them.

The retry used to answer what *it* did: a session the first try had written (its transcript linked, or its lines
appended, with or without the index commit) was found whole and counted ``unchanged``, not ``new`` / ``updated``
(killed at ``import.sessions.before_commit:1``, ``counts.new`` was 0 where a crash-free call says 6). Now a keyed
write of a session ends with an ``import_receipt`` line (the key and what the request answers for the session),
the session's import record keeps it (reconcile copies it there when the index commit was lost), and the same
request's retry answers it. Another request re-importing the same sources still answers ``unchanged``.

The fault points an import passes (``store/interchange/import_write.py``, ``store/revisions.py``,
``store/indexing/group_commit.py``, ``runtime/context.py``): ``import.after_link`` (a new transcript linked),
``import.after_append_write`` (a grown source's lines appended), ``revisions.after_write`` (a pi source's
abandoned branches appended to the revisions store), ``index.before_commit`` / ``index.after_commit`` (each
session's index transaction, the last one the summary's receipt commit), ``import.sessions.before_commit`` /
``import.sessions.after_commit``. (Blobs an import finds are stored by ``AttachmentFiles.put_bytes``, which has
no fault point.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import RpcError
from tests.hostkit import call_killed_at, client_for, index_caught_up, inprocess_host
from tests.imports import test_crash_retry as base

SESSIONS = 6
FINAL = SESSIONS + 1
"""The DB commit that holds the summary's receipt row (one index transaction per new session before it)."""
PI = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "pi" / "0.73.1" / "sessions"
PI_BRANCHING = "2026-12-02T02-55-56-729Z_01a234ae-2138-74d0-915b-820c7db7af9d.jsonl"
"""The recorded pi session with two branches: its first 11 lines hold the first one only."""
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
OTHERS = {"codex": RECORDED / "codex" / "0.171.0" / "sessions", "opencode": RECORDED / "opencode" / "1.18.33"}
"""Sources imported whole (Codex: a spawned thread linked to its parent; opencode: one database of sessions)."""
SCENARIOS = ("fresh", "grown", "pi", "pi-moved", *OTHERS)

# (scenario, point, nth): "fresh" imports six new Claude Code sessions, "grown" re-imports the one whose source
# grew; "pi" imports three pi sessions (one keeps the branch its file left in the revisions store), "pi-moved"
# re-imports that one after its file grew a second branch (its lines appended, the first branch archived)
KILLS = [
    ("fresh", "import.after_link", 1),
    ("fresh", "import.after_link", 4),
    ("fresh", "import.after_link", SESSIONS),
    ("fresh", "index.before_commit", 1),
    ("fresh", "index.before_commit", 4),
    ("fresh", "index.after_commit", 1),
    ("fresh", "index.after_commit", SESSIONS),
    ("fresh", "index.before_commit", FINAL),
    ("fresh", "index.after_commit", FINAL),
    ("fresh", "import.sessions.before_commit", 1),
    ("fresh", "import.sessions.after_commit", 1),
    ("grown", "import.after_append_write", 1),
    ("grown", "index.before_commit", 1),
    ("grown", "index.after_commit", 1),
    ("grown", "import.sessions.before_commit", 1),
    ("grown", "import.sessions.after_commit", 1),
    ("pi", "import.after_link", 2),
    ("pi", "revisions.after_write", 1),
    ("pi", "index.before_commit", 2),
    ("pi", "import.sessions.before_commit", 1),
    ("pi-moved", "import.after_append_write", 1),
    ("pi-moved", "revisions.after_write", 1),
    ("pi-moved", "index.before_commit", 1),
    ("pi-moved", "index.after_commit", 1),
    ("pi-moved", "import.sessions.before_commit", 1),
    ("codex", "import.after_link", 3),
    ("codex", "index.before_commit", 3),
    ("codex", "import.sessions.before_commit", 1),
    ("opencode", "import.after_link", 2),
    ("opencode", "index.before_commit", 2),
    ("opencode", "import.sessions.before_commit", 1),
]

# Failures that end the call with an error (its receipt not committed, or committed and the reply failed), or
# that fail a session's index commit once it took place (the session is kept, the call answers). A failure
# *before* a session's commit refuses that session: the refusal is the call's answer, and its retry replays it.
FAILS = [
    ("fresh", "import.sessions.before_commit", 1),
    ("fresh", "import.sessions.after_commit", 1),
    ("fresh", "index.before_commit", FINAL),
    ("fresh", "index.after_commit", FINAL),
    ("fresh", "index.after_commit", 1),
    ("fresh", "index.after_commit", 3),
    ("grown", "import.sessions.before_commit", 1),
    ("grown", "index.after_commit", 1),
    ("pi-moved", "import.sessions.before_commit", 1),
    ("pi-moved", "index.after_commit", 1),
]
CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}


def _answer(answer: Any, src: Path) -> Any:
    """The answer with the source root (a temporary directory of each run) spelled the same."""
    return orjson.loads(orjson.dumps(answer).replace(str(src).encode(), b"<src>"))


def _params(src: Path, scenario: str) -> dict[str, Any]:
    source = "pi" if scenario.startswith("pi") else scenario if scenario in OTHERS else "claude-code"
    return {**base._params(src), "source": source}


async def _setup(tmp: Path, scenario: str) -> tuple[Path, Path]:
    """The sources and a data directory (see :data:`KILLS`); a re-import's first import done (unkeyed)."""
    if scenario in OTHERS:
        src = tmp / scenario
        shutil.copytree(OTHERS[scenario], src)
        return src, tmp / "data"
    if not scenario.startswith("pi"):
        return await base._setup(tmp, scenario)
    src, data = tmp / "pi", tmp / "data"
    shutil.copytree(PI, src)
    if scenario == "pi-moved":
        (branching,) = src.rglob(PI_BRANCHING)
        whole = branching.read_bytes()
        branching.write_bytes(b"".join(whole.splitlines(keepends=True)[:11]))
        async with inprocess_host(data) as host, client_for(host, base.CLIENT, "ui") as c:
            await c.call("import.sessions", {"source": "pi", "root": str(src)})
            await index_caught_up(host)
        branching.write_bytes(whole)
    return src, data


async def _reference(tmp: Path, scenario: str) -> tuple[Any, dict[str, Any]]:
    src, data = await _setup(tmp, scenario)
    async with inprocess_host(data) as host, client_for(host, base.CLIENT, "ui") as c:
        answer = await c.call("import.sessions", _params(src, scenario))
        await index_caught_up(host)
        return _answer(answer, src), await _state(c, data)


async def _state(c: Any, data: Path) -> dict[str, Any]:
    """:func:`tests.imports.test_crash_retry._state`, and each session's revisions (its archived branches; their
    ``createdAt`` is the clock's when the import ran)."""
    out = await base._state(c, data)
    for sid in [k for k in out if k != "transcripts"]:
        revisions = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
        out[sid]["revisions"] = [{k: v for k, v in r.items() if k != "createdAt"} for r in revisions]
    return out


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any]]]:
    return {scenario: trio.run(_reference, tmp_path_factory.mktemp(f"ref-{scenario}"), scenario)
            for scenario in SCENARIOS}


def _same_as_crash_free(got: tuple[Any, dict[str, Any]], ref: tuple[Any, dict[str, Any]], what: str) -> None:
    answer, state = got
    ref_answer, ref_state = ref
    assert answer["counts"] == ref_answer["counts"], f"{what}: the retry's counts differ from a crash-free call's"
    assert answer == ref_answer, f"{what}: the retry's answer differs from a crash-free call's"
    assert state.keys() == ref_state.keys(), what
    for key, value in ref_state.items():
        assert state[key] == value, f"{what}: {key} differs from a crash-free import's"


def test_the_reference_writes_what_the_cases_compare(references: dict[str, tuple[Any, dict[str, Any]]]) -> None:
    fresh, grown = references["fresh"][0], references["grown"][0]
    assert fresh["counts"]["new"] == SESSIONS and fresh["counts"]["refused"] == 0
    assert grown["counts"]["updated"] == 1 and grown["counts"]["unchanged"] == SESSIONS - 1
    assert all(s["newRecords"] > 0 and s["appendedBytes"] > 0 for s in fresh["sessions"])
    pi, moved = references["pi"][0], references["pi-moved"][0]
    assert pi["counts"]["new"] == 3 and sum(s["archivedBranches"] for s in pi["sessions"]) == 1
    assert moved["counts"]["updated"] == 1 and moved["counts"]["unchanged"] == 2
    assert sum(s["archivedBranches"] for s in moved["sessions"]) == 1
    for name in OTHERS:
        assert references[name][0]["counts"]["new"] > 1 and references[name][0]["counts"]["refused"] == 0, name


@pytest.mark.parametrize(("scenario", "point", "nth"), KILLS)
async def test_a_retry_after_a_kill_answers_as_a_crash_free_call(
        tmp_path: Path, references: dict[str, tuple[Any, dict[str, Any]]], scenario: str, point: str,
        nth: int) -> None:
    src, data = await _setup(tmp_path, scenario)
    await call_killed_at(data, point, "import.sessions", _params(src, scenario), nth=nth, client_id=base.CLIENT)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, base.CLIENT, "ui") as c:
            retried = await c.call("import.sessions", _params(src, scenario))
            assert await c.call("import.sessions", _params(src, scenario)) == retried
            await index_caught_up(host)
            state = await _state(c, data)
    _same_as_crash_free((_answer(retried, src), state), references[scenario], f"killed at {point}:{nth}")


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize(("scenario", "point", "nth"), FAILS)
async def test_a_retry_after_a_storage_error_answers_as_a_crash_free_call(
        tmp_path: Path, references: dict[str, tuple[Any, dict[str, Any]]], scenario: str, point: str, nth: int,
        action: str) -> None:
    src, data = await _setup(tmp_path, scenario)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, base.CLIENT, "ui") as c:
            await index_caught_up(host)
            host.faults.add(point, nth=nth, action=action)
            try:
                first: Any = await c.call("import.sessions", _params(src, scenario))
            except RpcError as failed:
                assert failed.data_code == CODES[action]
                first = None
            assert host.faults.hits(point) >= nth, "the fault did not fire inside the import"
            host.faults.clear()
            retried = await c.call("import.sessions", _params(src, scenario))
            if first is not None:
                assert retried == first
            await index_caught_up(host)
            state = await _state(c, data)
    _same_as_crash_free((_answer(retried, src), state), references[scenario], f"{action} at {point}:{nth}")


@pytest.mark.parametrize("other", ["another-submission", None])
async def test_another_request_for_the_same_sources_answers_unchanged(tmp_path: Path, other: str | None) -> None:
    """The answer a keyed import recorded is its own: a request with another key, or none, finds the sessions
    that import wrote unchanged, before and after that import's retry; and a session it wrote is ``new`` to it
    alone (a retry after a kill with the other request in between still answers ``new``)."""
    src, data = await base._setup(tmp_path, "fresh")
    await call_killed_at(data, "import.sessions.before_commit", "import.sessions", base._params(src),
                         client_id=base.CLIENT)
    params = {"source": "claude-code", "root": str(src)}
    if other is not None:
        params["submissionId"] = other
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, base.CLIENT, "ui") as c:
            before = await c.call("import.sessions", params)
            retried = await c.call("import.sessions", base._params(src))
            after = await c.call("import.sessions", {**params, "submissionId": "a-third-one"})
    for answer in (before, after):
        assert answer["counts"]["unchanged"] == SESSIONS and answer["counts"]["new"] == 0
        assert all(s["newRecords"] == 0 and s["appendedBytes"] == 0 for s in answer["sessions"])
    assert retried["counts"]["new"] == SESSIONS
    assert all(s["status"] == "new" and s["newRecords"] > 0 for s in retried["sessions"])
