"""Seed 003 §2.0 review snapshots, §2 ``review-changes/`` and ``scratch/`` lines, §4.10 artifacts, §11.10 and the
fork bullets about copied scratch files, probed by an outsider against real ``pi-host serve`` processes.

The in-process suites (tests/review, tests/artifacts_paths, tests/turns/test_artifacts_host.py,
tests/history/test_fork_host.py, tests/projects/test_workspace.py) hold most rules; this file holds what they
hold only in-process or without a restart: the boot sweep of a hand-made orphan in a stopped host's data
directory (also once the database is lost), a session's own root for ``review.record`` and artifacts after
``workspace.open`` switched project and after a restart, refusals that change nothing, and a fork's copied
scratch files across a restart. Each docstring quotes the line it holds the host to.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from runtime.client import HostClient
from tests.acceptance.outsiderkit import (
    artifact_paths,
    code_of,
    data_dir,
    drop_database,
    error_of,
    real_host,
    say,
    write_tool,
)

BEFORE = b"before\n"
AFTER = b"after the edit\n"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _record(sid: str, path: str = "notes.md", before: bytes | None = BEFORE, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "path": path, "beforeBase64": None if before is None else _b64(before),
            "toolName": "Edit", "toolCallId": "call-1", "messageId": "m1", **extra}


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    """The call's result, validated against the method's result model."""
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


def _project(tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    root.mkdir()
    (root / "notes.md").write_bytes(AFTER)
    return root


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path → bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}





# ---------------------------------------------------------------------------------- §2.0 sweep and delete

async def test_boot_sweeps_a_hand_made_orphan_and_never_a_live_sessions_snapshots(tmp_path: Path) -> None:
    """§2.0: "The host removes a session's snapshot directory with session.delete and sweeps directories whose
    session no longer exists at startup." A snapshot directory made by hand in a stopped host's data directory
    (for a session that never existed) is gone after the boot; the live session's snapshot stays, listed and
    restorable; the deleted session's directory went with session.delete. Then the database is lost: the
    sessions come back from their transcripts and the sweep of that boot still removes no live session's
    snapshot."""
    root, ws = data_dir(tmp_path), _project(tmp_path, "proj")
    with trio.fail_after(120):
        async with real_host(root, kind="agent") as (proc, c):
            keep = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            gone = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            await say(c, keep, "u1", "edit the notes")
            kept = (await _call(c, "review.record", _record(keep)))["snapshot"]
            await _call(c, "review.record", _record(gone))
            assert (root / "review-changes" / gone / "").is_dir()
            await c.call("session.delete", {"sessionId": gone})
            assert not (root / "review-changes" / gone).exists()
            proc.kill9()
        ghost = root / "review-changes" / "ghost-session" / ("rv-" + "b" * 32)
        ghost.mkdir(parents=True)
        (ghost / "before").write_bytes(b"orphaned\n")
        (ghost / "meta.json").write_bytes(b"{}")
        kept_files = _tree(root / "review-changes" / keep)
        async with real_host(root, kind="agent") as (proc, c):
            assert (await c.call("host.status"))["boot"]["scratchSwept"] >= 1
            listed = (await _call(c, "review.list", {"sessionId": keep}))["snapshots"]
            assert [s["snapshotId"] for s in listed] == [kept["snapshotId"]]
            proc.kill9()
        assert sorted(os.listdir(root / "review-changes")) == [keep]
        assert _tree(root / "review-changes" / keep) == kept_files
        drop_database(root)
        async with real_host(root, kind="agent") as (proc, c):
            assert keep in {s["id"] for s in (await c.call("session.list", {}))["sessions"]}
            listed = (await _call(c, "review.list", {"sessionId": keep}))["snapshots"]
            assert [s["snapshotId"] for s in listed] == [kept["snapshotId"]]
            await _call(c, "review.restore", {"sessionId": keep, "snapshotId": kept["snapshotId"]})
    assert (ws / "notes.md").read_bytes() == BEFORE
    assert sorted(os.listdir(root / "review-changes")) == [keep]


# ----------------------------------------------------------------------------------- §2.0 refusals

async def test_bad_snapshot_ids_huge_before_bytes_and_foreign_snapshots_are_refused_and_change_nothing(
        tmp_path: Path) -> None:
    """§2.0 / README ``review.*``: ``review.get`` / ``review.restore`` of an id that is not a snapshot id
    (a climb out of the session's folder, an empty or malformed one) is ``INVALID_PARAMS``, one the session
    does not hold (another session's) ``NOT_FOUND``; before bytes over 4 MiB are ``PAYLOAD_TOO_LARGE``
    ("the card then has no undo"), before bytes that are not base64 ``INVALID_PARAMS``, an unknown session
    ``SESSION_NOT_FOUND``. None of them writes a snapshot or touches the workspace."""
    root, ws = data_dir(tmp_path), _project(tmp_path, "proj")
    with trio.fail_after(120):
        async with real_host(root, kind="agent") as (proc, c):
            mine = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            other = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            theirs = (await _call(c, "review.record", _record(other)))["snapshot"]["snapshotId"]
            (ws / "notes.md").write_bytes(AFTER)  # the other session's snapshot is restorable as is
            data_before, ws_before = _tree(root / "review-changes"), _tree(ws)
            for bad in ("", "rv-", "../" + other + "/" + theirs, theirs + "/../" + theirs, "rv-" + "g" * 32,
                        theirs.upper(), theirs + "\n", "rv-" + "0" * 31, "/etc/passwd"):
                for method in ("review.get", "review.restore"):
                    code = await code_of(c, method, {"sessionId": mine, "snapshotId": bad})
                    assert code == "INVALID_PARAMS", (method, bad, code)
            for method in ("review.get", "review.restore"):
                assert await code_of(c, method, {"sessionId": mine, "snapshotId": theirs}) == "NOT_FOUND"
                assert await code_of(c, method, {"sessionId": "no-such", "snapshotId": theirs}) == \
                    "SESSION_NOT_FOUND"
            huge = b"\0" * (4 * 1024 * 1024 + 1)
            assert await code_of(c, "review.record", _record(mine, before=huge)) == "PAYLOAD_TOO_LARGE"
            bad_b64 = {**_record(mine), "beforeBase64": "not base64!"}
            assert await code_of(c, "review.record", bad_b64) == "INVALID_PARAMS"
            for path in ("../proj/../outside.md", "/etc/hostname", "..\\outside.md"):
                code, data = await error_of(c, "review.record", _record(mine, path=path))
                assert (code, data.get("reason")) == ("INVALID_PARAMS", "outside_workspace"), path
            assert (await _call(c, "review.list", {"sessionId": mine}))["snapshots"] == []
            assert _tree(root / "review-changes") == data_before and _tree(ws) == ws_before
            # the refusals left the other session's snapshot as it was: still restorable
            await _call(c, "review.restore", {"sessionId": other, "snapshotId": theirs})
    assert (ws / "notes.md").read_bytes() == BEFORE


# --------------------------------------------------------------------- §11.10: the session's own root

async def test_review_and_artifacts_resolve_the_sessions_root_after_a_workspace_switch_and_a_restart(
        tmp_path: Path) -> None:
    """§11.10: "A tool call for session A resolves A's persisted project root even after the visible workspace
    switches to project B"; §4.10: artifacts are "absolute, workspace-resolved" (README: "a relative path is
    joined to the session's project root"). After ``workspace.open`` of B, a relative ``review.record`` and
    a relative Write of session A land in A (B's same-named file is untouched), and so they do after a restart
    and once the database is lost and rebuilt from the transcripts."""
    root = data_dir(tmp_path)
    a, b = _project(tmp_path, "project-a"), _project(tmp_path, "project-b")
    (b / "notes.md").write_bytes(b"project b's own notes\n")
    with trio.fail_after(150):
        async with real_host(root) as (proc, c):
            sa = (await c.call("session.create", {"title": "A", "projectPath": str(a)}))["id"]
            sb = (await c.call("session.create", {"title": "B", "projectPath": str(b)}))["id"]
            await c.call("workspace.open", {"path": str(a)})
            await c.call("session.appendMessage", {"sessionId": sa, "message": write_tool("w1", "out/first.md")})
            await c.call("workspace.open", {"path": str(b)})
            assert (await c.call("workspace.get", {}))["project"]["path"] == str(b)
            rec = await _call(c, "review.record", _record(sa))
            assert rec["review"]["path"] == str(a / "notes.md")
            await c.call("session.appendMessage", {"sessionId": sa, "message": write_tool("w2", "./src\\x.py")})
            await c.call("session.appendMessage", {"sessionId": sb, "message": write_tool("w3", "out/first.md")})
            expected = [f"{a}/out/first.md", f"{a}/src/x.py"]
            assert await artifact_paths(c, sa) == expected
            assert await artifact_paths(c, sb) == [f"{b}/out/first.md"]
            proc.kill9()
        for lost in (False, True):
            if lost:
                drop_database(root)
            async with real_host(root) as (proc, c):
                if not lost:
                    assert (await c.call("workspace.get", {}))["project"]["path"] == str(b)
                assert await artifact_paths(c, sa) == expected, lost
                assert await artifact_paths(c, sb) == [f"{b}/out/first.md"], lost
                resolved = await c.call("session.resolvePath", {"sessionId": sa, "path": "notes.md"})
                assert resolved["root"] == str(a) and resolved["path"] == str(a / "notes.md"), lost
                (a / "notes.md").write_bytes(AFTER)
                again = await _call(c, "review.record", _record(sa, messageId=f"m-{lost}"))
                assert again["review"]["path"] == str(a / "notes.md") and \
                    again["review"]["afterSha256"] == hashlib.sha256(AFTER).hexdigest(), lost
                listed = (await _call(c, "review.list", {"sessionId": sa}))["snapshots"]
                assert {s["path"] for s in listed} == {str(a / "notes.md")}, lost
                proc.kill9()
    assert (b / "notes.md").read_bytes() == b"project b's own notes\n"
    assert not (root / "review-changes" / sb).exists()


# ----------------------------------------------------------------------------- fork and scratch copies

async def test_a_fork_copies_referenced_scratch_files_which_outlive_the_source_and_a_restart(
        tmp_path: Path) -> None:
    """Fork bullets: "Forks copy existing referenced files from scratch/<sourceId>/pasted/ to
    scratch/<childId>/pasted/ and rewrite message/checkpoint paths before indexing. Source deletion cannot
    remove the child copies. Unreferenced files (...) and other scratch outputs are excluded. (...) Handled
    fork failures remove copied inputs and child transcripts." A refused fork (an unknown message) leaves
    no child scratch folder; the child's copy survives the source's deletion and a restart (its sweep)."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            pasted = root / "scratch" / sid / "pasted"
            pasted.mkdir(parents=True)
            (pasted / "a.txt").write_bytes(b"A")
            (pasted / "unreferenced.txt").write_bytes(b"U")
            (root / "scratch" / sid / "output.log").write_bytes(b"other scratch output")
            await c.call("session.appendMessage", {"sessionId": sid, "message": {
                "id": "u1", "role": "user", "blocks": [
                    {"type": "attachment", "kind": "file", "name": "a.txt", "ref": str(pasted / "a.txt")},
                    {"type": "text", "text": f"see {pasted / 'a.txt'}"}]}})
            await say(c, sid, "a1", "ok", "assistant")
            scratch_before = sorted(os.listdir(root / "scratch"))
            assert await code_of(c, "session.fork", {"sessionId": sid, "throughMessageId": "nope"}) == \
                "MESSAGE_NOT_FOUND"
            assert sorted(os.listdir(root / "scratch")) == scratch_before
            child = (await c.call("session.fork", {"sessionId": sid}))["id"]
            child_pasted = root / "scratch" / child / "pasted"
            assert _tree(root / "scratch" / child) == {"pasted/a.txt": b"A"}
            got = await c.call("session.get", {"sessionId": child})
            blocks = got["messages"][0]["blocks"]
            assert blocks[0]["ref"] == str(child_pasted / "a.txt")
            assert blocks[1]["text"] == f"see {child_pasted / 'a.txt'}"
            await c.call("session.delete", {"sessionId": sid})
            assert not (root / "scratch" / sid).exists()
            assert (child_pasted / "a.txt").read_bytes() == b"A"
            proc.kill9()
        async with real_host(root) as (proc, c):
            got = await c.call("session.get", {"sessionId": child})
            assert got["messages"][0]["blocks"][0]["ref"] == str(child_pasted / "a.txt")
    assert (child_pasted / "a.txt").read_bytes() == b"A"


async def test_a_rewrite_after_the_session_moved_adds_no_artifact_nobody_wrote(tmp_path: Path) -> None:
    """§4.10 "path -- absolute, workspace-resolved" / README: a relative path "is joined to the session's
    project root (...) so every listed path can be opened", one row per file. A Write of ``x.md`` while the
    session's root is A is listed as ``A/x.md``; ``session.update`` moves the session to B; a regenerate then
    rewrites the transcript. The listing stays ``[A/x.md]``, also after a restart: the rewrite re-read the
    Write's line and added ``B/x.md``, a file no tool wrote."""
    root = data_dir(tmp_path)
    a, b = _project(tmp_path, "project-a"), _project(tmp_path, "project-b")
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(a)}))["id"]
            await say(c, sid, "u1", "write x")
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w1", "x.md")})
            await say(c, sid, "a1", "done", "assistant")
            await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
            assert await artifact_paths(c, sid) == [f"{a}/x.md"]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            assert await artifact_paths(c, sid) == [f"{a}/x.md"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w2", "y.md")})
            assert await artifact_paths(c, sid) == [f"{a}/x.md", f"{b}/y.md"]
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert await artifact_paths(c, sid) == [f"{a}/x.md", f"{b}/y.md"]


async def test_a_rebuilt_index_lists_an_artifact_where_the_live_index_listed_it(tmp_path: Path) -> None:
    """§4.10 "path -- absolute, workspace-resolved" / README: a relative path "is joined to the session's
    project root (...) so every listed path can be opened". A Write of ``x.md`` while the session's root is A
    is listed as ``A/x.md``; ``session.update`` then moves the session to B. Once the database is lost and
    rebuilt from the transcript, the listing still names ``A/x.md`` (the file the tool wrote), not ``B/x.md``,
    a file that does not exist: the root-changing ``session_info`` lines stand where they were written."""
    root = data_dir(tmp_path)
    a, b = _project(tmp_path, "project-a"), _project(tmp_path, "project-b")
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(a)}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w1", "x.md")})
            await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w2", "y.md")})
            live = await artifact_paths(c, sid)
            assert live == [f"{a}/x.md", f"{b}/y.md"]
            proc.kill9()
        drop_database(root)
        async with real_host(root) as (proc, c):
            assert await artifact_paths(c, sid) == live


async def test_a_rebuilt_index_lists_an_artifact_where_the_live_index_listed_it_after_a_rewrite(
        tmp_path: Path) -> None:
    """As above, with a rewrite (a regenerate's truncate) between the root change and the loss of the database:
    a rewrite keeps only the newest ``session_info`` line, so the root ``x.md`` was written under was no longer
    in the file and the rebuilt listing named ``B/x.md``. The rewrite writes the root each kept line was
    written under before it; the listing is the live one, after the rewrite, after a restart and after the
    database is lost (twice: a second rewrite of a rewritten file keeps them too)."""
    root = data_dir(tmp_path)
    a, b = _project(tmp_path, "project-a"), _project(tmp_path, "project-b")
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid = (await c.call("session.create", {"projectPath": str(a)}))["id"]
            await say(c, sid, "u1", "write x")
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w1", "x.md")})
            await say(c, sid, "a1", "done", "assistant")
            await c.call("session.update", {"sessionId": sid, "projectPath": str(b)})
            await say(c, sid, "u2", "write y")
            await c.call("session.appendMessage", {"sessionId": sid, "message": write_tool("w2", "y.md")})
            await say(c, sid, "a2", "done", "assistant")
            live = await artifact_paths(c, sid)
            assert live == [f"{a}/x.md", f"{b}/y.md"]
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            assert await artifact_paths(c, sid) == live
            proc.kill9()
        drop_database(root)
        async with real_host(root) as (proc, c):
            assert await artifact_paths(c, sid) == live
            await say(c, sid, "a3", "again", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a3", "mode": "regenerate"})
            assert await artifact_paths(c, sid) == live
            proc.kill9()
        drop_database(root)
        async with real_host(root) as (proc, c):
            assert await artifact_paths(c, sid) == live
            got = await _call(c, "session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == ["u1", "w1", "a1", "u2", "w2"]
            assert got["session"]["projectPath"] == str(b)  # the session's settings are the newest line's
