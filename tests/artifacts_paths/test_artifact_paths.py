"""Issue 24 part 6: artifact paths are absolute and workspace-resolved through the session's root (the rule of
``session.resolvePath``), and the scratch exclusion is applied after resolution (seed 003 §4.10).

Each test's docstring quotes the spec line it holds the host to.
"""

from __future__ import annotations

import posixpath
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import trio

from runtime.client import HostClient
from store import artifacts, workspace
from store.indexing import index
from store.indexing.appends import Written, index_written
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line
from store.transcripts.transcript import create_transcript
from tests.dbkit import NOW, add_session, fresh_db
from tests.hostkit import client_for, inprocess_host


def _write(mid: str, path: str, name: str = "Write") -> dict[str, Any]:
    return {"id": mid, "role": "tool", "toolName": name, "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": name, "args": {"path": path}, "status": "ok"}]}


async def _listed(c: HostClient, sid: str) -> list[str]:
    return sorted(a["path"] for a in (await c.call("artifacts.list", {"sessionId": sid}))["artifacts"])


async def test_relative_paths_are_stored_absolute_through_the_session_root(tmp_path: Path) -> None:
    """Seed 003 §4.10: "path TEXT NOT NULL, -- absolute, workspace-resolved". A tool's relative path
    (``rel/file.txt``, ``./a/../b.txt``, ``src\\x.py``) is listed as the absolute path ``session.resolvePath``
    gives for it, one row per file however it was spelled."""
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t", "projectPath": str(project)}))["id"]
            sent = ["rel/file.txt", "./a/../b.txt", "src\\x.py", str(project / "rel" / "file.txt")]
            for i, path in enumerate(sent):
                await c.call("session.appendMessage", {"sessionId": sid, "message": _write(f"m{i}", path)})
            expected = sorted({(await c.call("session.resolvePath", {"sessionId": sid, "path": p}))["path"]
                               for p in sent})
            assert expected == sorted([f"{project}/rel/file.txt", f"{project}/b.txt", f"{project}/src/x.py"])
            assert await _listed(c, sid) == expected


async def test_a_relative_path_into_scratch_does_not_escape_the_exclusion(tmp_path: Path) -> None:
    """Seed 003 §4.10: "Writes into the session scratch directory (D114) are excluded: artifacts list
    workspace deliverables only." The exclusion is applied to the resolved path, so ``../data/scratch/<sid>/x``
    from the project root is excluded like the absolute path; the write is still audited (tool_execute)."""
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t", "projectPath": str(project)}))["id"]
            scratch = host.services.data_dir.scratch_root / sid
            relative = posixpath.relpath(f"{scratch}/notes.md", str(project))  # lexical, no file system
            assert relative.startswith("..")
            await c.call("session.appendMessage", {"sessionId": sid, "message": _write("m1", relative)})
            await c.call("session.appendMessage", {"sessionId": sid, "message": _write("m2", "out/report.md")})
            assert await _listed(c, sid) == [f"{project}/out/report.md"]
            audited = (await c.call("audit.list", {"sessionId": sid, "kind": "tool_execute"}))["entries"]
            effects = {e["payload"]["messageId"]: e["payload"]["effects"] for e in audited}
            assert effects["m1"] == [{"path": str(scratch / "notes.md"), "op": "write", "artifact": False,
                                      "requested": relative}]
            assert effects["m2"][0]["artifact"] is True


def test_a_relative_path_without_a_project_root_is_not_listed(conn: sqlite3.Connection) -> None:
    """Seed 003 §4.10: "absolute, workspace-resolved" — a session with no project root has nothing to
    resolve a relative path against (``session.resolvePath`` refuses it): it is audited, never listed;
    an absolute path is folded lexically and listed."""
    add_session(conn, "s")
    for mid, path in (("m1", "rel.txt"), ("m2", "/w//x/../y.txt")):
        artifacts.record_effects(conn, "s", _write(mid, path), None, NOW, scratch="/data/scratch/s")
    assert conn.execute("SELECT path FROM artifacts").fetchall() == [("/w/y.txt",)]
    payloads = [orjson.loads(r[0]) for r in conn.execute("SELECT payload_json FROM audit_log ORDER BY id")]
    assert [p["effects"][0]["artifact"] for p in payloads] == [False, True]


def test_artifact_resolution_is_the_resolve_path_rule(conn: sqlite3.Connection) -> None:
    """Seed 003 §4.10 ("absolute, workspace-resolved") through ``session.resolvePath``'s rule: for every
    spelling, the stored path is what ``store.workspace.resolve_for_session`` answers."""
    pid = index.upsert_project(conn, "/home/ada/proj", NOW)
    add_session(conn, "s", project_id=pid)
    root = artifacts.session_root(conn, "s")
    assert root == "/home/ada/proj"
    for path in ("a.txt", "./a/./b/../c.txt", "..\\up.txt", "/abs/x", "/abs/../y", "C:/w/z", "deep/../../out"):
        assert artifacts.resolve_path(root, path) == workspace.resolve_for_session(conn, "s", path)["path"]


async def test_dot_dot_folds_below_a_windows_drive_and_never_leaves_a_relative_path(tmp_path: Path) -> None:
    """README §8.2 / seed 003 §4.10: ``session.resolvePath`` answers the path "absolute and folded ('.', '..')"
    and every listed artifact path is absolute. Under a drive root ``..`` stops at ``C:/`` as it stops at
    ``/``: ``C:/w/..`` was folded to the drive-relative ``C:`` and ``C:/w/../../x.py`` to the relative
    ``x.py`` (listed as an artifact nobody can open)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "t", "projectPath": "C:\\w"}))["id"]
            bare = (await c.call("session.create", {"title": "no root"}))["id"]
            for path, resolved, inside in (("..", "C:/", False), ("../../x.py", "C:/x.py", False),
                                           ("a\\..\\..\\..\\b", "C:/b", False), ("./y/../z", "C:/w/z", True),
                                           ("D:/q/../..", "D:/", False)):
                got = await c.call("session.resolvePath", {"sessionId": sid, "path": path})
                assert (got["path"], got["insideRoot"]) == (resolved, inside), path
            assert (await c.call("session.resolvePath", {"sessionId": bare, "path": "E:/a/../../b"}))["path"] == "E:/b"
            await c.call("session.appendMessage", {"sessionId": sid, "message": _write("m1", "../../x.py")})
            await c.call("session.appendMessage", {"sessionId": bare, "message": _write("m2", "E:\\a\\..\\..\\b")})
            assert await _listed(c, sid) == ["C:/x.py"]
            assert await _listed(c, bare) == ["E:/b"]


def _line(rec: dict[str, Any]) -> bytes:
    return dumps_line({"type": "message", **rec} if "type" not in rec else rec)


def _info(root: str) -> bytes:
    return dumps_line({"type": "session_info", "title": "t", "projectPath": root})


def _listed_rows(conn: sqlite3.Connection) -> list[str]:
    return sorted(r[0] for r in conn.execute("SELECT path FROM artifacts"))


def test_lines_caught_up_from_the_file_resolve_against_the_root_they_stand_under(tmp_path: Path) -> None:
    """Seed 003 §4.10 ("absolute, workspace-resolved") with the rule the live index and a rebuild share
    (``records.Root``): a tool line resolves against the ``projectPath`` of the ``session_info`` line before
    it. A tail the index catches up from the file (lines appended after its mark: a lost index op, a boot
    reconcile) holding ``z.md``, then a move to B, then ``y.md`` lists ``A/z.md`` and ``B/y.md``: the tail's
    settings were applied before its lines, so ``z.md`` came back as ``B/z.md``."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    path = sessions / "s.jsonl"
    create_transcript(path, "s", NOW, body_lines=[_info("/p/a"), _line(_write("w1", "x.md"))])
    with conn:
        apply_plan(conn, "s", plan_reconcile(path, 0, None), now_ms=NOW)
    assert _listed_rows(conn) == ["/p/a/x.md"]
    mark = index.index_mark(conn, "s")
    assert mark is not None
    with open(path, "ab") as fh:
        fh.write(_line(_write("w0", "z.md")) + _info("/p/b") + _line(_write("w2", "y.md")))
    with conn:
        apply_plan(conn, "s", plan_reconcile(path, mark[0], mark[1]), now_ms=NOW)
    assert _listed_rows(conn) == ["/p/a/x.md", "/p/a/z.md", "/p/b/y.md"]
    assert artifacts.session_root(conn, "s") == "/p/b"
    (tmp_path / "rebuilt").mkdir()
    rebuilt = fresh_db(tmp_path / "rebuilt" / "pi.sqlite")
    with rebuilt:
        apply_plan(rebuilt, "s", plan_reconcile(path, 0, None), now_ms=NOW)
    assert _listed_rows(rebuilt) == _listed_rows(conn)


def test_a_live_index_op_resolves_a_line_after_a_root_change_in_the_same_op_against_the_new_root(
        tmp_path: Path) -> None:
    """The same rule on the live path (``appends.index_written``): lines written together, a move to B then a
    Write of ``y.md``, list ``B/y.md`` as a rebuild of that file does; the op indexed its messages before its
    ``session_info`` line and listed ``A/y.md``."""
    conn = fresh_db(tmp_path / "pi.sqlite")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    path = sessions / "s.jsonl"
    create_transcript(path, "s", NOW, body_lines=[_info("/p/a")])
    with conn:
        apply_plan(conn, "s", plan_reconcile(path, 0, None), now_ms=NOW)
    start, epoch = index.index_mark(conn, "s") or (0, None)
    lines = [_info("/p/b"), _line(_write("w2", "y.md"))]
    with open(path, "ab") as fh:
        fh.write(b"".join(lines))
    with conn:
        index_written(conn, Written("s", path, start, start + sum(map(len, lines)), epoch, lines), now_ms=NOW)
    assert _listed_rows(conn) == ["/p/b/y.md"]
    (tmp_path / "rebuilt").mkdir()
    rebuilt = fresh_db(tmp_path / "rebuilt" / "pi.sqlite")
    with rebuilt:
        apply_plan(rebuilt, "s", plan_reconcile(path, 0, None), now_ms=NOW)
    assert _listed_rows(rebuilt) == ["/p/b/y.md"]
