"""Rules of seed 003 that worked but had no test of their own (issue 24, "untested though working"):
new-session defaults, a rename keeping ``updatedAt``, ``PI_DESKTOP_DATA_DIR`` made absolute, ``\\`` → ``/``
in paths, and the boot sweeps of scratch and review-changes folders of sessions that no longer exist."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from protocol.models_records import SessionSummary
from runtime.datadir import DataDir
from store.workspace import resolve_under
from tests.hostkit import client_for, inprocess_host, msg


async def test_a_new_session_defaults_to_agent_mode_thinking_off_and_inherited_permissions(tmp_path: Path) -> None:
    """Seed 003 §4.5 (sessions DDL): ``mode DEFAULT 'agent'``, ``thinking_level DEFAULT 'off'``,
    ``permission_mode DEFAULT 'inherit'``."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            created = SessionSummary.model_validate(await c.call("session.create", {}))
            listed = SessionSummary.model_validate(
                (await c.call("session.get", {"sessionId": created.id}))["session"])
    for summary in (created, listed):
        assert (summary.mode, summary.thinking_level, summary.permission_mode) == ("agent", "off", "inherit")


async def test_a_manual_rename_keeps_updated_at_and_the_transcript(tmp_path: Path) -> None:
    """Seed 003 §4.5: "A manual rename does not update updated_at, so changing a label cannot reorder recent
    activity; transcript rows, message count, and session state remain unchanged.\""""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            older = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": older, "message": msg("m1", "first")})
            newer = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": newer, "message": msg("m2", "second")})
            before = SessionSummary.model_validate((await c.call("session.get", {"sessionId": older}))["session"])
            order_before = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            await trio.sleep(0.05)  # a real clock: a moved updated_at would show
            await c.call("session.rename", {"sessionId": older, "title": "  Renamed label  "})
            got = await c.call("session.get", {"sessionId": older})
            after = SessionSummary.model_validate(got["session"])
            order_after = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
    assert after.title == "Renamed label"
    assert after.updated_at == before.updated_at and after.message_count == before.message_count == 1
    assert [m["id"] for m in got["messages"]] == ["m1"]
    assert order_after == order_before and order_before.index(newer) < order_before.index(older)


def test_pi_desktop_data_dir_is_made_absolute(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Seed 003 §2: "PI_DESKTOP_DATA_DIR replaces either root outright and is resolved to an absolute path
    before it reaches host-core"."""
    monkeypatch.chdir(tmp_path)
    for dev in (False, True):
        root, source = DataDir.locate(None, {"PI_DESKTOP_DATA_DIR": "rel/data", "HOME": "/nowhere"}, dev=dev)
        assert source == "env" and root.root == tmp_path / "rel" / "data" and root.root.is_absolute()
    home, _ = DataDir.locate(None, {"PI_DESKTOP_DATA_DIR": "~/x", "HOME": os.environ.get("HOME", "/")})
    assert home.root.is_absolute() and "~" not in str(home.root)


def test_backslashes_in_paths_become_slashes_before_resolution() -> None:
    """Seed 003 (paths): a Windows-style ``\\`` separator is stored and compared as ``/``; a ``..`` spelled with
    backslashes cannot leave the root."""
    assert resolve_under("/work/p", "src\\a.txt") == ("/work/p/src/a.txt", True)
    assert resolve_under("/work/p", "..\\..\\etc\\passwd") == ("/etc/passwd", False)
    assert resolve_under("/work/p", "/work/p\\sub\\..\\b.txt") == ("/work/p/b.txt", True)


async def test_boot_sweeps_scratch_and_review_changes_of_sessions_that_no_longer_exist(tmp_path: Path) -> None:
    """Seed 003 §2.0/§8: scratch and review-changes folders belong to a session; boot removes those whose
    session is gone and keeps the others."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            live = (await c.call("session.create", {}))["id"]
    data = DataDir(tmp_path)
    for root in (data.scratch_root, data.review_changes_dir):
        (root / live).mkdir(parents=True, exist_ok=True)
        (root / live / "keep.txt").write_text("kept")
        (root / "s_gone").mkdir(parents=True, exist_ok=True)
        (root / "s_gone" / "stale.txt").write_text("stale")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            status = await c.call("host.status", {})
    for root in (data.scratch_root, data.review_changes_dir):
        assert (root / live / "keep.txt").read_text() == "kept"
        assert not (root / "s_gone").exists()
    assert status["boot"]["scratchSwept"] == 2  # one folder under each root


async def test_the_boot_sweep_counts_only_what_it_removed_and_names_what_it_left(tmp_path: Path) -> None:
    """The startup sweep of ``scratch/`` and ``review-changes/`` counts a folder it removed, not a stray
    plain file it cannot remove as a session folder: that one stays, is named in the report, and boot
    goes on (it counted the file as swept and said nothing)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("session.create", {})
    data = DataDir(tmp_path)
    (data.review_changes_dir / "s_gone").mkdir(parents=True, exist_ok=True)
    (data.review_changes_dir / "s_gone" / "stale.txt").write_text("stale")
    (data.review_changes_dir / "stray.txt").write_text("not a session folder")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            status = await c.call("host.status", {})
    assert not (data.review_changes_dir / "s_gone").exists()
    assert (data.review_changes_dir / "stray.txt").read_text() == "not a session folder"
    assert status["boot"]["scratchSwept"] == 1
    assert status["boot"]["scratchNotSwept"] == [
        {"path": "review-changes/stray.txt", "reason": "not a directory"}]
