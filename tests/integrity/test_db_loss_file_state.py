"""A lost or corrupt ``pi.sqlite`` keeps what the session files hold beyond messages: the trash state of a
session, and an imported session's model and usage.

Black-box, on a real host process, as ``test_db_loss_receipts``: the data directory is built through the
wire, the host stopped, the database removed (with its ``-wal``/``-shm``) or its header overwritten, the
host started again, and the reads compared.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import msg
from tests.importers import gen
from tests.imports.test_import_rpc import sample_tree
from tests.integrity.test_db_loss_receipts import _damage, _on_host
from tests.samplekit import untouched_samples

__all__ = ["untouched_samples"]

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


async def _trash_reads(c: HostClient) -> dict[str, Any]:
    listed = (await c.call("session.list", {"limit": 100}))["sessions"]
    trashed = (await c.call("sessions.listTrashed", {}))["sessions"]
    found = (await c.call("search.sessions", {"query": "zebra"}))["results"]
    return {"listed": sorted(s["id"] for s in listed),
            "trashed": [(s["id"], s["deletedAt"]) for s in trashed],
            "search": sorted(r["sessionId"] for r in found)}


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_trashed_session_stays_in_the_trash_after_a_database_loss(tmp_path: Path, how: str) -> None:
    """Reproduces: trash was a database column only, so a rebuilt index listed a trashed session again (in
    ``session.list`` and search) and ``sessions.listTrashed`` no longer did; a purge then refused it."""
    keyed: list[tuple[str, dict[str, Any], Any]] = []

    async def build(c: HostClient) -> dict[str, Any]:
        async def call(method: str, params: dict[str, Any]) -> None:
            keyed.append((method, params, await c.call(method, params)))

        for sid in ("s1", "s2", "s3"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-u", f"zebra {sid}")})
        await call("sessions.trash", {"sessionId": "s1", "submissionId": "k-t1"})
        await c.call("session.rename", {"sessionId": "s1", "title": "renamed in the trash"})  # a later line
        await call("sessions.trash", {"sessionId": "s2", "submissionId": "k-t2"})
        await call("sessions.restore", {"sessionId": "s2", "submissionId": "k-r2"})
        await c.call("session.rename", {"sessionId": "s2", "title": "renamed after the restore"})
        await call("sessions.trash", {"sessionId": "s3", "submissionId": "k-t3"})
        await call("sessions.trash", {"sessionId": "s3", "submissionId": "k-t3b"})  # again: keeps its time
        # a whole-file rewrite of a trashed session keeps its newest session_info line, and so the trash
        await c.call("session.create", {"sessionId": "s4", "title": "s4"})
        await c.call("session.appendMessage", {"sessionId": "s4", "message": msg("s4-u", "zebra s4")})
        await c.call("session.appendMessage", {"sessionId": "s4", "message": msg("s4-a", "hi", role="assistant")})
        await c.call("sessions.trash", {"sessionId": "s4"})
        await c.call("session.truncateFrom", {"sessionId": "s4", "messageId": "s4-a", "mode": "regenerate"})
        return await _trash_reads(c)

    async def after(c: HostClient) -> tuple[dict[str, Any], list[tuple[Any, Any]], dict[str, Any]]:
        reads = await _trash_reads(c)
        retried = [(await c.call(method, params), answer) for method, params, answer in keyed]
        assert await _trash_reads(c) == reads  # answered: s2 was not trashed again
        purged = await c.call("sessions.purge", {"sessionId": "s1"})
        assert purged == {"sessionId": "s1", "purged": True}
        return reads, retried, await _trash_reads(c)

    with trio.fail_after(90):
        before = await _on_host(tmp_path, build)
        assert before["listed"] == ["s2"] and [sid for sid, _ in before["trashed"]] == ["s4", "s3", "s1"]
        assert before["search"] == ["s2"]
        _damage(tmp_path, how)
        reads, retried, purged = await _on_host(tmp_path, after)
    assert reads == before
    # each retry is answered as its first try was, with the trash time it recorded (s2 was restored since); the
    # rest of an answer rebuilt from a file is the session as the file left it (s1 and s2 were renamed since;
    # a rebuilt row's updatedAt is its newest message's time)
    def same(session: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in session.items() if k not in ("title", "updatedAt")}

    assert [same(got["session"]) for got, _ in retried] == [same(answer["session"]) for _, answer in retried]
    s3_at, s1_at = before["trashed"][1][1], before["trashed"][2][1]
    assert [got["session"]["deletedAt"] for got, _ in retried] == [s1_at, retried[1][1]["session"]["deletedAt"],
                                                                   None, s3_at, s3_at]
    assert retried[1][0]["session"]["deletedAt"] is not None
    assert purged == {"listed": ["s2"], "trashed": before["trashed"][:2], "search": ["s2"]}
    assert not (tmp_path / "sessions" / "s1.jsonl").exists()


async def _import_reads(c: HostClient) -> dict[str, Any]:
    listed = (await c.call("session.list", {"limit": 200}))["sessions"]
    out: dict[str, Any] = {}
    for s in listed:
        usage = await c.call("usage.session", {"sessionId": s["id"]})
        out[s["id"]] = {"source": s.get("source"), "providerId": s.get("providerId"), "modelId": s.get("modelId"),
                        "historyModel": s.get("historyModel"), "usage": usage}
    return out


def _sources(tmp: Path) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for source in ("claude-code", "codex", "pi"):
        tree, _ = sample_tree(tmp, source)
        calls.append({"source": source, "root": str(tree)})
    # real files, some with abandoned branches (their usage is kept in the revisions file)
    for tool, top in (("claude-code", "projects"), ("codex", "sessions"), ("pi", "sessions")):
        for version in sorted(p for p in (RECORDED / tool).iterdir() if p.is_dir()):
            dest = tmp / f"recorded-{tool}-{version.name}"
            shutil.copytree(version / top, dest)
            calls.append({"source": tool, "root": str(dest)})
    for db in sorted((RECORDED / "opencode").glob("*/*.db")):
        dest = tmp / f"recorded-opencode-{db.parent.name}"
        dest.mkdir()
        shutil.copy(db, dest / db.name)
        calls.append({"source": "opencode", "root": str(dest / db.name)})
    return calls


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_an_imported_session_keeps_its_model_and_usage_after_a_database_loss(
        tmp_path: Path, how: str, untouched_samples: Path) -> None:
    """Reproduces: an imported session's model (``providerId``/``modelId``, ``historyModel``) and its usage
    turn rows came from the import's database rows only; after a rebuild the session had no model and
    ``usage.session`` answered 0."""
    calls = _sources(tmp_path / "src")
    grow = tmp_path / "grow" / "-gen-project" / "gen-cc-session.jsonl"
    lines = gen.claude_code_lines([gen.User("a"), gen.Response((("text", "one"),), ()), gen.User("b"),
                                   gen.Response((("text", "two"),), ())])

    async def build(c: HostClient) -> dict[str, Any]:
        for params in calls:
            result = await c.call("import.sessions", params)
            assert result["counts"]["refused"] == 0, (params, result["counts"])
        # a file that grew: the first import binds its model, the re-import's lines name a later one (the history's)
        grow.parent.mkdir(parents=True)
        grow.write_bytes(b"".join(lines[:2]))
        first = await c.call("import.sessions", {"source": "claude-code", "root": str(grow.parent.parent)})
        grow.write_bytes(b"".join(lines[:3]) + lines[3].replace(b'"claude-gen"', b'"claude-later"'))
        again = await c.call("import.sessions", {"source": "claude-code", "root": str(grow.parent.parent)})
        assert (first["counts"]["new"], again["counts"]["updated"]) == (1, 1)
        # the host continues an imported session: its lines name another model, which is no history's
        sid = next(s["id"] for s in (await c.call("session.list", {"limit": 200}))["sessions"]
                   if s["source"] == "claude-code" and s.get("modelId"))
        usage = {"input": 7, "output": 5, "cacheRead": 0, "cacheWrite": 0, "reasoning": 0, "totalTokens": 12}
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("host-u", "go on")})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
            "host-a", "done", role="assistant",
            meta={"modelId": "host-model", "providerId": "host", "usage": usage, "usageRaw": usage})})
        return await _import_reads(c)

    with trio.fail_after(240):
        before = await _on_host(tmp_path / "data", build)
        assert {v["source"] for v in before.values()} == {"claude-code", "codex", "pi", "opencode"}
        assert sum(1 for v in before.values() if v["usage"]["total"]["turns"]) > 10
        assert sum(1 for v in before.values() if v["modelId"]) > 10
        grown = next(v for v in before.values() if v["historyModel"] == {"modelId": "claude-later",
                                                                          "providerId": "anthropic"})
        assert grown["modelId"] == "claude-gen"
        _damage(tmp_path / "data", how)
        after = await _on_host(tmp_path / "data", _import_reads)
    assert after == before
