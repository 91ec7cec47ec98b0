"""One Claude Code transcript is one host session, whichever route imports it.

A transcript can be imported as a single-file root or through its project folder (``~/.claude``,
``projects/``, one project); a subagent file (``<session>/subagents/agent-*.jsonl``) can be given
alone too. Every route must name the session the same way: a renamed file (its name is not the
``sessionId`` its lines carry) became two sessions with the same messages, and a subagent file
given alone rewrote its parent session with the links to the spawning ``Task`` call dropped.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient
from scripts.fixtures.fidelity_run import recordings
from store.attachments import AttachmentFiles
from store.indexing.database import apply_pragmas
from store.interchange.import_write import ImportTarget
from store.interchange.importers.common import SourceUnit, session_id_for
from store.interchange.imports import import_root, import_unit
from tests.hostkit import client_for, inprocess_host
from tests.samplekit import NOW, db, rows, target, untouched_samples

__all__ = ["db", "target", "untouched_samples"]

SOURCE = "claude-code"
RENAMED = "claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl"
"""A real transcript whose file name is not the ``sessionId`` its lines carry (7 messages)."""
SUBAGENT_RECORDINGS = [folder for folder in recordings(SOURCE)
                       if any(f["role"] == "subagent"
                              for f in orjson.loads((folder / "manifest.json").read_bytes())["files"])]


def in_project(tmp: Path, sample: Path) -> Path:
    """``sample`` copied into a project folder of a ``projects/`` root (the sample keeps its name)."""
    project = tmp / "projects" / "-work-demo"
    project.mkdir(parents=True)
    return Path(shutil.copy(sample, project / sample.name))


def lines_session_id(path: Path) -> str:
    return next(str(rec["sessionId"]) for rec in map(orjson.loads, path.read_bytes().splitlines())
                if isinstance(rec.get("sessionId"), str))


def recorded_projects(tmp: Path, folder: Path) -> tuple[Path, Path, Path]:
    """The recording's ``projects/`` copied under ``tmp``: (root, a main transcript, one of its subagent files)."""
    shutil.copytree(folder / "projects", tmp / "projects")
    entry = next(f for f in orjson.loads((folder / "manifest.json").read_bytes())["files"]
                 if f["role"] == "subagent")
    sub = tmp / entry["path"]
    main = sub.parent.parent.with_suffix(".jsonl")
    assert main.is_file() and main.stem == entry["session"]
    return tmp / "projects", main, sub


async def call_import(c: HostClient, root: Path) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("import.sessions", {"source": SOURCE, "root": str(root)})
    return result


def statuses(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["sessionId"], s["status"]) for s in result["sessions"]]


async def shown(c: HostClient, sid: str) -> list[tuple[str, str, Any, Any]]:
    """Each message of the session: id, role and its subagent attribution."""
    page = await c.call("session.get", {"sessionId": sid, "full": True})
    return [(m["id"], m["role"], (m.get("meta") or {}).get("agentName"), (m.get("meta") or {}).get("parentToolCallId"))
            for m in page["messages"]]


async def listed(c: HostClient) -> list[tuple[str, int]]:
    return [(s["id"], s["messageCount"]) for s in (await c.call("session.list", {"limit": 100}))["sessions"]]


# --------------------------------------------------------------------------- a renamed transcript


@pytest.mark.parametrize("order", [("file", "folder"), ("folder", "file")])
async def test_a_renamed_transcript_is_one_session_by_file_or_by_folder(tmp_path: Path, order: tuple[str, str],
                                                                        untouched_samples: Path) -> None:
    path = in_project(tmp_path, untouched_samples / RENAMED)
    assert lines_session_id(path) != path.stem
    roots = {"file": path, "folder": tmp_path / "projects"}
    with trio.fail_after(90):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            first = await call_import(c, roots[order[0]])
            sid = session_id_for(SOURCE, path.stem)  # the id the folder route always gave it
            assert statuses(first) == [(sid, "new")]
            before = await shown(c, sid)
            for route in (order[1], *order):  # the other route, then both again
                again = await call_import(c, roots[route])
                assert statuses(again) == [(sid, "unchanged")], route
            assert await listed(c) == [(sid, 7)]
            assert await shown(c, sid) == before
            hits = await c.call("search.sessions", {"query": "phx.server"})
            assert [r["sessionId"] for r in hits["results"]] == [sid]


def test_a_session_the_file_route_named_after_its_lines_is_found_again(tmp_path: Path, db: sqlite3.Connection,
                                                                       target: ImportTarget,
                                                                       untouched_samples: Path) -> None:
    """Before, a renamed file given as the root was named by its lines' ``sessionId``: both routes find
    that session through its import record (it lists the file) instead of starting a second one."""
    sample = untouched_samples / RENAMED
    path = in_project(tmp_path, sample)
    data = sample.read_bytes()
    path.write_bytes(b"".join(data.splitlines(keepends=True)[:4]))  # an earlier state of the file
    earlier = import_unit(db, SourceUnit(SOURCE, lines_session_id(path), (path,)), target, now_ms=NOW)
    assert earlier.status == "new"
    sid = earlier.session_id
    for root in (path, tmp_path / "projects"):
        same = import_root(db, SOURCE, root, target, now_ms=lambda: NOW)
        assert [(r.session_id, r.status) for r in same.sessions] == [(sid, "unchanged")]
    path.write_bytes(data)  # the transcript grew
    grown = import_root(db, SOURCE, tmp_path / "projects", target, now_ms=lambda: NOW)
    assert [(r.session_id, r.status) for r in grown.sessions] == [(sid, "updated")]
    for root in (path, tmp_path / "projects"):
        assert import_root(db, SOURCE, root, target, now_ms=lambda: NOW).counts() == {"unchanged": 1}
    assert rows(db, "SELECT id FROM sessions") == [(sid,)]
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ? AND deleted = 0", sid) == [(7,)]


async def test_the_running_host_updates_a_session_the_file_route_named_after_its_lines(
        tmp_path: Path, untouched_samples: Path) -> None:
    """The same through ``import.sessions``: the host routes the grown file to the old-named session."""
    sample = untouched_samples / RENAMED
    path = in_project(tmp_path, sample)
    data = sample.read_bytes()
    path.write_bytes(b"".join(data.splitlines(keepends=True)[:4]))
    home = tmp_path / "data"
    async with inprocess_host(home):
        pass  # the data directory's layout
    conn = sqlite3.connect(home / "pi.sqlite", isolation_level=None)
    try:
        apply_pragmas(conn)
        target = ImportTarget(home / "sessions", AttachmentFiles(home / "attachments"))
        earlier = import_unit(conn, SourceUnit(SOURCE, lines_session_id(path), (path,)), target, now_ms=NOW)
    finally:
        conn.close()
    assert earlier.status == "new"
    sid = earlier.session_id
    path.write_bytes(data)  # the transcript grew
    with trio.fail_after(90):
        async with inprocess_host(home) as host, client_for(host) as c:
            for root in (path, tmp_path / "projects"):
                first = root == path
                assert statuses(await call_import(c, root)) == [(sid, "updated" if first else "unchanged")]
            assert await listed(c) == [(sid, 7)]


# --------------------------------------------------------------------------- a subagent file given alone


@pytest.mark.parametrize("folder", SUBAGENT_RECORDINGS, ids=[f.name for f in SUBAGENT_RECORDINGS])
@pytest.mark.parametrize("order", [("main", "subagent"), ("subagent", "main")])
async def test_a_subagent_file_alone_imports_its_whole_session(tmp_path: Path, folder: Path,
                                                               order: tuple[str, str]) -> None:
    projects, main, sub = recorded_projects(tmp_path, folder)
    roots = {"main": main, "subagent": sub}
    sid = session_id_for(SOURCE, main.stem)
    with trio.fail_after(90):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            whole = await call_import(c, projects)
            assert (sid, "new") in statuses(whole)
            expected = await shown(c, sid)
            assert any(parent for *_, parent in expected)  # the subagent's rows point at their Task call
        async with inprocess_host(tmp_path / "data2") as host, client_for(host) as c:
            first = await call_import(c, roots[order[0]])
            assert statuses(first) == [(sid, "new")]
            assert await shown(c, sid) == expected
            second = await call_import(c, roots[order[1]])
            assert statuses(second) == [(sid, "unchanged")]
            assert await shown(c, sid) == expected
            everything = await call_import(c, projects)  # the import record lists the session's every file
            assert (sid, "unchanged") in statuses(everything)
            assert await shown(c, sid) == expected


@pytest.mark.parametrize("folder", SUBAGENT_RECORDINGS, ids=[f.name for f in SUBAGENT_RECORDINGS])
async def test_without_its_main_transcript_a_subagent_file_keeps_the_imported_session(tmp_path: Path,
                                                                                     folder: Path) -> None:
    projects, main, sub = recorded_projects(tmp_path, folder)
    sid = session_id_for(SOURCE, main.stem)
    with trio.fail_after(90):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            await call_import(c, projects)
            expected = await shown(c, sid)
            main.unlink()
            for root in (sub, projects):
                kept = await call_import(c, root)
                report = next(s for s in kept["sessions"] if s["sessionId"] == sid)
                assert (report["status"], report["replacedRecords"]) == ("unchanged", 0), root
                assert await shown(c, sid) == expected
        async with inprocess_host(tmp_path / "data2") as host, client_for(host) as c:
            alone = await call_import(c, sub)  # never imported with its parent: the subagent rows are all there is
            assert statuses(alone) == [(sid, "new")]
            rows_alone = await shown(c, sid)
            assert rows_alone and {role for _, role, name, _ in rows_alone if name is None} <= {"system"}
            assert (sid, "unchanged") in statuses(await call_import(c, projects))


async def test_the_running_host_asks_for_a_new_transcripts_former_id_once(
        tmp_path: Path, untouched_samples: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``import.sessions`` resolved a unit (``resolve_unit``) before routing it to its session's actor, whose
    ``prepare_unit`` resolved it again: a first import of a Claude Code transcript peeked at its ``sessionId``
    (``former_ids``) twice. The actor takes the unit as resolved: once per import, a dry run once too."""
    from store.interchange import imports as store_imports

    path = in_project(tmp_path, untouched_samples / RENAMED)
    asked: list[str] = []
    real = store_imports.former_ids

    def counted(unit: SourceUnit) -> tuple[str, ...]:
        asked.append(str(unit.files[0]))
        return real(unit)

    monkeypatch.setattr(store_imports, "former_ids", counted)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            dry = await c.call("import.sessions", {"source": SOURCE, "root": str(path), "dryRun": True})
            assert [s["status"] for s in dry["sessions"]] == ["would-new"]
            assert asked == [str(path)]
            asked.clear()
            result = await c.call("import.sessions", {"source": SOURCE, "root": str(path)})
            assert [s["status"] for s in result["sessions"]] == ["new"]
            assert asked == [str(path)]  # before: twice
