"""``import.sessions`` over the wire: every sample through a real host, progress events, search at once,
re-imports, growth, dry runs, refusals, and the session actor as the only writer of an imported session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import dump_event
from runtime.client import HostClient, RpcError
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host, msg
from tests.importers import gen
from tests.importers.test_deep_records import source as deep_source
from tests.importers.test_samples import EXPECTED
from tests.samplekit import sample_files, untouched_samples

__all__ = ["untouched_samples"]

CONV = [gen.User("where is the tokenizer"), gen.Response((("thinking", "private musing zebra"),
                                                          ("text", "tokenizer lives in lexer.py")), ()),
        gen.User("thanks")]


def sample_tree(tmp: Path, source: str) -> tuple[Path, dict[str, str]]:
    """The samples of ``source`` laid out as that tool keeps them; {file path: sample name}."""
    root = tmp / f"{source}-root"
    names: dict[str, str] = {}
    for i, sample in enumerate(sample_files(source)):
        if source == "claude-code":
            dest = root / f"-work-sample-{i}" / sample.name
        elif source == "codex":
            dest = root / "2026" / "07" / f"{i + 1:02d}" / f"rollout-{sample.name}"
        else:
            dest = root / f"--work-sample-{i}--" / sample.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample, dest)
        names[str(dest)] = f"{source}/{sample.name}"
    return root, names


async def import_with_events(c: HostClient, params: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Call import.sessions while collecting its import.progress events (validated against their model)."""
    await c.subscribe(["import.progress"])
    events: list[dict[str, Any]] = []
    result: Any = None
    async with trio.open_nursery() as nursery:

        async def follow() -> None:
            async for ev in c:
                dump_event(ev.topic, ev.data, cursor=ev.cursor, subscription_id=ev.subscription_id)
                if ev.data.get("importId") == params.get("importId"):
                    events.append(ev.data)
                    if ev.data.get("finished"):
                        return

        nursery.start_soon(follow)
        result = await c.call("import.sessions", params)
    return result, events


@pytest.mark.parametrize("source", ["claude-code", "codex", "pi"])
async def test_every_sample_imports_over_rpc_with_its_report(tmp_path: Path, source: str,
                                                             untouched_samples: Path) -> None:
    tree, names = sample_tree(tmp_path, source)
    total_bytes = sum(os.stat(p).st_size for p in names)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            result, events = await import_with_events(c, {"source": source, "root": str(tree), "importId": "imp-a"})
            assert result["total"] == len(names) and result["counts"]["new"] == len(names), result["counts"]
            assert result["counts"]["refused"] == 0 and not result["truncated"]
            by_name = {names[r["files"][0]["path"]]: r for r in result["sessions"]}
            assert set(by_name) == set(names.values())
            for name, rep in by_name.items():
                expect = EXPECTED[name]
                assert rep["status"] == "new"
                assert rep["messages"] == expect.roles, name
                assert (rep["toolCalls"], rep["toolResults"], rep["unpairedToolCalls"], rep["orphanResults"]) == (
                    expect.tool_calls, expect.results, expect.unpaired, expect.orphans), name
                assert (rep["thinkingBlocks"], rep["compactions"], rep["attributed"]) == (
                    expect.thinking, expect.compactions, expect.attributed), name
                assert rep["files"][0]["danglingParents"] == expect.dangling, name
                assert rep["skippedBlocks"] == expect.skipped_blocks, name
            # one progress event per session with growing counts, then the final one
            assert [e["done"] for e in events] == [*range(1, len(names) + 1), len(names)]
            assert events[-1]["finished"] and events[-1]["counts"] == result["counts"]
            assert all(e["total"] == len(names) for e in events)
            assert events[-1]["sourceBytes"] == events[-1]["totalBytes"] == total_bytes
            # the import left no session actor running (each one it started was passivated)
            assert not host.registry.statistics().children
            # the sessions are listed with their source, and readable
            listed = (await c.call("session.list", {"limit": 100}))["sessions"]
            assert sorted(s["id"] for s in listed) == sorted(r["sessionId"] for r in result["sessions"])
            assert {s["source"] for s in listed} == {source}
            for rep in result["sessions"]:
                page = await c.call("session.get", {"sessionId": rep["sessionId"], "full": True})
                assert page["totalMessages"] == sum(rep["messages"].values())
            # a second import of the same bytes is a no-op
            again = await c.call("import.sessions", {"source": source, "root": str(tree)})
            assert again["counts"]["unchanged"] == len(names) and again["messages"] == 0


async def test_imported_sessions_are_searchable_at_once_and_thinking_is_not(tmp_path: Path) -> None:
    src = tmp_path / "projects" / "-work-demo"
    src.mkdir(parents=True)
    (src / "11111111-0000-4000-8000-000000000001.jsonl").write_bytes(b"".join(gen.claude_code_lines(CONV)))
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            result = await c.call("import.sessions", {"source": "claude-code", "root": str(tmp_path / "projects")})
            sid = result["sessions"][0]["sessionId"]
            hits = await c.call("search.sessions", {"query": "lexer.py"})
            assert [r["sessionId"] for r in hits["results"]] == [sid]
            assert (await c.call("search.sessions", {"query": "zebra"}))["results"] == []
            page = await c.call("session.get", {"sessionId": sid, "full": True})
            kinds = [b["type"] for m in page["messages"] for b in m["blocks"]]
            assert "thinking" in kinds  # kept in the transcript, out of search
            assert page["session"]["source"] == "claude-code"
            assert page["session"]["projectPath"] == "/gen/project"  # the cwd, bound to a project


async def test_a_grown_source_appends_only_its_new_lines_through_the_live_actor(tmp_path: Path) -> None:
    src = tmp_path / "projects" / "-work-demo"
    src.mkdir(parents=True)
    path = src / "22222222-0000-4000-8000-000000000002.jsonl"
    lines = gen.claude_code_lines(CONV)
    path.write_bytes(b"".join(lines[:2]))
    root = str(tmp_path / "projects")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            first = await c.call("import.sessions", {"source": "claude-code", "root": root})
            sid = first["sessions"][0]["sessionId"]
            assert sid == session_id_for("claude-code", path.stem)
            before = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
            transcript = tmp_path / "data" / "sessions" / f"{sid}.jsonl"
            old = transcript.read_bytes()
            # the session's actor is live (a client appended to it) while its source grows
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("note", "my own note")})
            assert host.registry.running(sid)
            with_note = transcript.read_bytes()
            path.write_bytes(b"".join(lines))
            grown = await c.call("import.sessions", {"source": "claude-code", "root": root})
            rep = grown["sessions"][0]
            assert rep["status"] == "updated" and rep["newRecords"] >= 1
            data = transcript.read_bytes()
            assert data.startswith(with_note) and with_note.startswith(old)  # appended, never rewritten
            after = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
            ids = [m["id"] for m in after]
            assert ids[: len(before)] == [m["id"] for m in before] and "note" in ids
            assert len(after) > len(before) + 1
            # the actor appends after the import without a conflict (its state followed the file)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("note2", "after the import")})
            hits = await c.call("search.sessions", {"query": "thanks"})
            assert sid in [r["sessionId"] for r in hits["results"]]
            again = await c.call("import.sessions", {"source": "claude-code", "root": root})
            assert again["counts"] == {**again["counts"], "unchanged": 1}


async def test_dry_run_writes_nothing_and_reports_what_would_happen(tmp_path: Path) -> None:
    src = tmp_path / "projects" / "-work-demo"
    src.mkdir(parents=True)
    (src / "33333333-0000-4000-8000-000000000003.jsonl").write_bytes(b"".join(gen.claude_code_lines(CONV)))
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            dry = await c.call("import.sessions", {"source": "claude-code", "root": str(tmp_path / "projects"),
                                                   "dryRun": True})
            assert dry["dryRun"] and dry["counts"]["would-new"] == 1 and dry["messages"] == 3
            assert (await c.call("session.list", {}))["sessions"] == []
            assert list((data / "sessions").iterdir()) == []
            real = await c.call("import.sessions", {"source": "claude-code", "root": str(tmp_path / "projects")})
            assert real["counts"]["new"] == 1


async def test_files_that_are_not_sessions_are_refused_per_file_and_the_rest_imports(tmp_path: Path) -> None:
    tree = tmp_path / "pi-root" / "--work--"
    tree.mkdir(parents=True)
    (tree / "good.jsonl").write_bytes(b"".join(gen.pi_lines(CONV, session="good-session")))
    (tree / "notes.jsonl").write_bytes(b'{"just": "json"}\n')
    (tree / "empty.jsonl").write_bytes(b"")
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c:
            result = await c.call("import.sessions", {"source": "pi", "root": str(tmp_path / "pi-root")})
            assert result["counts"]["new"] == 1 and result["counts"]["refused"] == 2
            refused = result["sessions"][:2]
            assert all(r["status"] == "refused" and r["reason"] for r in refused)
            assert {r["files"][0]["path"] if r["files"] else r["externalId"] for r in refused} >= {
                str(tree / "notes.jsonl")} or any(r["externalId"] == "notes" for r in refused)
            assert len(list((data / "sessions").glob("*.jsonl"))) == 1  # nothing half-imported
            with pytest.raises(RpcError) as err:
                await c.call("import.sessions", {"source": "pi", "root": str(tmp_path / "missing")})
            assert err.value.data_code == "NOT_FOUND"
            with pytest.raises(RpcError) as err:
                await c.call("import.sessions", {"source": "pi", "root": "relative/path"})
            assert err.value.data_code == "INVALID_PARAMS"


async def test_a_session_opened_during_an_import_is_never_written_twice(tmp_path: Path) -> None:
    """Many clients read the deterministic id while it is imported: one transcript, one header."""
    src = tmp_path / "projects" / "-work-demo"
    src.mkdir(parents=True)
    path = src / "44444444-0000-4000-8000-000000000004.jsonl"
    path.write_bytes(b"".join(gen.claude_code_lines(CONV * 50)))
    sid = session_id_for("claude-code", path.stem)
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host) as c, client_for(host, "reader") as r:
            seen: list[str] = []

            async def poll() -> None:
                for _ in range(200):
                    try:
                        page = await r.call("session.get", {"sessionId": sid, "messageLimit": 5})
                        seen.append(f"ok {page['totalMessages']}")
                    except RpcError as exc:
                        seen.append(exc.data_code)
                    await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                result = await c.call("import.sessions", {"source": "claude-code", "root": str(src.parent)})
            assert result["counts"]["new"] == 1
            assert set(seen) <= {"SESSION_NOT_FOUND", f"ok {sum(result['sessions'][0]['messages'].values())}"}
            headers = [ln for ln in (data / "sessions" / f"{sid}.jsonl").read_bytes().splitlines()
                       if ln.startswith(b'{"type":"session"')]
            assert len(headers) == 1


async def test_the_result_counts_the_lines_that_did_not_come_in_as_written(tmp_path: Path,
                                                                          untouched_samples: Path) -> None:
    """Reproduces: a line skipped unread (not JSON) or read with bytes that are not UTF-8 replaced was counted
    only in its session's per-file report, which a result keeps for at most 1000 sessions: a client showing
    the result's totals said nothing of it. ``unreadLines`` / ``repairedLines`` count every session's."""
    root, _ = sample_tree(tmp_path, "pi")
    files = sorted(root.rglob("*.jsonl"))
    for n, path in enumerate(files[:2]):
        lines = path.read_bytes().splitlines(keepends=True)
        lines.insert(2, b"{not json\n")
        if n == 0:
            lines[-1] = lines[-1].replace(b'"text":"', b'"text":"\xe9', 1)
        path.write_bytes(b"".join(lines))
    async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
        result, events = await import_with_events(c, {"source": "pi", "root": str(root), "importId": "lines-1"})
        assert (result["unreadLines"], result["repairedLines"]) == (2, 1)
        assert (events[-1]["unreadLines"], events[-1]["repairedLines"]) == (2, 1)
        assert sum(f["badLines"] for s in result["sessions"] for f in s["files"]) == 2
        again = await c.call("import.sessions", {"source": "pi", "root": str(root)})
        assert (again["unreadLines"], again["repairedLines"]) == (0, 0)  # nothing read: every session unchanged


async def test_the_git_state_of_an_imported_session_is_served_by_session_get_and_list(tmp_path: Path) -> None:
    """``historyGit`` (Codex ``session_meta.git``, Claude Code ``gitBranch``) over the wire: ``session.get`` and
    ``session.list`` answer it, and the test host validates both results against their protocol models."""
    root, names = sample_tree(tmp_path, "codex")
    wanted = next(path for path, name in names.items() if "codemie_exec-0.77.0" in name)
    expected = {"branch": "codex", "commit": "02942347cadda24d3080fbfbc2d13295bb3a496d",
                "repositoryUrl": "git@github.com:codemie-ai/codemie-code.git"}
    async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
        result = await c.call("import.sessions", {"source": "codex", "root": str(root)})
        (sid,) = [s["sessionId"] for s in result["sessions"] if any(f["path"] == wanted for f in s["files"])]
        got = await c.call("session.get", {"sessionId": sid})
        assert got["session"]["historyGit"] == expected
        listed = (await c.call("session.list", {"limit": 50}))["sessions"]
        assert [s["historyGit"] for s in listed if s["id"] == sid] == [expected]


@pytest.mark.parametrize("source", ["pi", "codex"])
async def test_a_record_left_out_as_unwritable_is_not_in_the_messages_count(tmp_path: Path, source: str) -> None:
    """Reproduces: a record nested past what a transcript line can hold is left out (``skippedBlocks``
    ``message(cannot be written)``) and the result's ``messages`` still counted it, one more than the
    session holds (``newMessages`` was right)."""
    root = tmp_path / "src"
    root.mkdir()
    deep_source(source, root)
    async with inprocess_host(tmp_path / "data") as host, client_for(host, "importer", "ui") as c:
        dry = await c.call("import.sessions", {"source": source, "root": str(root), "dryRun": True})
        assert dry["messages"] == 3
        result, events = await import_with_events(c, {"source": source, "root": str(root), "importId": "deep-1"})
        [rep] = result["sessions"]
        assert rep["skippedBlocks"] == {"message(cannot be written)": 1}
        assert (result["messages"], result["newMessages"]) == (3, 3) and events[-1]["messages"] == 3
        assert rep["messages"] == {"user": 2, "assistant": 1}
        got = await c.call("session.get", {"sessionId": rep["sessionId"], "full": True})
        assert len(got["messages"]) == 3
