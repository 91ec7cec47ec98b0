"""A ``review.record`` killed before its ``meta.json`` (seed 003 §2.0, ADR 0043).

``store/review.py``: "``meta.json`` is published last and exclusively: a directory without it is an
interrupted record and counts for nothing." Found as a leftover: nothing lists, reads or removes such a
folder, so a keyless record killed between its two files left its ``before`` (up to 4 MiB) in
``review-changes/<sid>/rv-<random>/`` until the session was deleted. Boot (before the gateway opens, so no
record is in flight) and ``pi-host doctor --repair`` (under the data directory's lock) now remove it;
a published snapshot is never touched, and a keyed retry (its folder is named after its receipt key, and
its first attempt was never answered) still ends with exactly one snapshot.

Each kill is real: a ``pi-host serve`` process armed with ``RT_CRASHPOINT`` SIGKILLs itself at the point.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from runtime.datadir import DataDir
from store import review
from store.doctor.doctor import run_doctor
from store.receipts import ReceiptKey, fingerprint
from tests.hostkit import call_killed_at, client_for, inprocess_host

CLIENT = "agent-rv"
AFTER = b"# Notes\n\nMore.\n"
HALF_BEFORE = b"the killed record's before bytes\n" * 64

# every step of write_snapshot before meta.json is published (a kill after its link is a whole snapshot)
HALF_POINTS = ["review.before.after_tmp_write", "review.before.after_rename", "review.meta.after_tmp_write",
               "review.meta.after_tmp_fsync"]


def _params(sid: str, before: bytes, **extra: Any) -> dict[str, Any]:
    return {"sessionId": sid, "path": "docs/notes.md", "beforeBase64": base64.b64encode(before).decode(),
            "toolName": "Edit", "toolCallId": "call_1", "messageId": "a1", **extra}


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path → bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _halves(data: Path, sid: str) -> list[str]:
    folder = data / "review-changes" / sid
    return sorted(p.name for p in folder.iterdir() if not (p / "meta.json").exists())


async def _two_finished(data: Path, ws: Path) -> tuple[str, dict[str, bytes]]:
    """A session with two published snapshots (one keyless, one keyed), and their files' bytes."""
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "notes.md").write_bytes(AFTER)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
            sid = str((await c.call("session.create", {"title": "review", "projectPath": str(ws)}))["id"])
            await c.call("review.record", _params(sid, b"# Notes\n"))
            await c.call("review.record", _params(sid, b"# Old\n", submissionId="kept-1"))
    finished = _files(data / "review-changes" / sid)
    assert len(finished) == 4  # each: its before and its meta.json
    return sid, finished


@pytest.mark.parametrize("point", HALF_POINTS)
async def test_boot_removes_what_a_keyless_record_killed_before_its_meta_left(tmp_path: Path, point: str) -> None:
    data, ws = tmp_path / "data", tmp_path / "ws"
    sid, finished = await _two_finished(data, ws)
    await call_killed_at(data, point, "review.record", _params(sid, HALF_BEFORE), client_id=CLIENT,
                         client_kind="agent")
    (half,) = _halves(data, sid)  # the leftover: a folder no reader lists, its before bytes kept
    if point != "review.before.after_tmp_write":
        assert (data / "review-changes" / sid / half / "before").read_bytes() == HALF_BEFORE
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
            assert _halves(data, sid) == []  # before the fix: the folder stayed, boot after boot
            assert (await c.call("host.status"))["boot"]["reviewHalvesRemoved"] == 1
            listed = (await c.call("review.list", {"sessionId": sid}))["snapshots"]
            assert len(listed) == 2
    assert _halves(data, sid) == []
    assert _files(data / "review-changes" / sid) == finished  # every published snapshot byte for byte
    async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
        assert (await c.call("host.status"))["boot"]["reviewHalvesRemoved"] == 0


@pytest.mark.parametrize("point", HALF_POINTS)
async def test_a_keyed_record_killed_before_its_meta_still_makes_exactly_one_snapshot(
        tmp_path: Path, point: str) -> None:
    """The keyed folder is named after the receipt key (``snapshot_id_for``): its first attempt died unanswered
    (the receipt row comes after ``meta.json``), so boot removing its half loses no answer; the retry writes the
    snapshot whole, once, and a second retry gets the same answer."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    sid, finished = await _two_finished(data, ws)
    params = _params(sid, HALF_BEFORE, submissionId="rec-1")
    await call_killed_at(data, point, "review.record", params, client_id=CLIENT, client_kind="agent")
    shown = {k: v for k, v in params.items() if k != "submissionId"}
    key = ReceiptKey(CLIENT, "rec-1", "review.record", fingerprint("review.record", shown))
    assert _halves(data, sid) == [review.snapshot_id_for(key)]
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
            assert _halves(data, sid) == []
            assert (await c.call("host.status"))["boot"]["reviewHalvesRemoved"] == 1
            first = await c.call("review.record", params)
            assert first["snapshot"]["snapshotId"] == review.snapshot_id_for(key)
            assert await c.call("review.record", params) == first
            got = await c.call("review.get", {"sessionId": sid, "snapshotId": first["snapshot"]["snapshotId"],
                                              "includeBefore": True})
            assert base64.b64decode(got["beforeBase64"]) == HALF_BEFORE
            assert len((await c.call("review.list", {"sessionId": sid}))["snapshots"]) == 3
    assert _halves(data, sid) == []
    now = _files(data / "review-changes" / sid)
    assert {k: v for k, v in now.items() if k in finished} == finished
    assert len(now) == len(finished) + 2  # the retried snapshot: its before and meta.json, nothing else


async def test_doctor_names_a_half_written_snapshot_and_repair_removes_only_it(tmp_path: Path) -> None:
    data, ws = tmp_path / "data", tmp_path / "ws"
    sid, finished = await _two_finished(data, ws)
    await call_killed_at(data, "review.before.after_rename", "review.record", _params(sid, HALF_BEFORE),
                         client_id=CLIENT, client_kind="agent")
    (half,) = _halves(data, sid)
    found = run_doctor(DataDir(data), repair=False, now_ms=int(time.time() * 1000))
    hits = [f for f in found.findings if f.check == "review.unpublished"]
    assert [(f.subject, str(f.severity), f.repaired) for f in hits] == \
        [(f"review-changes/{sid}/{half}", "repairable", False)]
    assert _halves(data, sid) == [half]  # without --repair nothing changes
    fixed = run_doctor(DataDir(data), repair=True, now_ms=int(time.time() * 1000))
    assert [f.repaired for f in fixed.findings if f.check == "review.unpublished"] == [True]
    assert _halves(data, sid) == []
    assert _files(data / "review-changes" / sid) == finished
    again = run_doctor(DataDir(data), repair=False, now_ms=int(time.time() * 1000))
    assert not [f for f in again.findings if f.check == "review.unpublished"]


def test_the_sweep_leaves_every_folder_it_did_not_write_alone(tmp_path: Path) -> None:
    """Only a snapshot-id folder with no ``meta.json`` entry of any kind and nothing but the names a record
    writes (``before`` and temp files, or nothing) goes: a damaged or odd ``meta.json`` is a published
    snapshot's (review.list names it ``unreadable``), a foreign file or name is not the host's."""
    root = tmp_path / "review-changes"
    sid = root / "s1"
    keep = {
        "damaged": {"meta.json": b"{not json", "before": b"x"},
        "dangling": {"before": b"x"},
        "foreign": {"before": b"x", "notes.txt": b"mine"},
    }
    ids = {name: "rv-" + name.encode().hex().ljust(32, "0")[:32] for name in (*keep, "half", "empty", "tmp")}
    for name, files in keep.items():
        (sid / ids[name]).mkdir(parents=True)
        for fname, body in files.items():
            (sid / ids[name] / fname).write_bytes(body)
    os.symlink(tmp_path / "nowhere", sid / ids["dangling"] / "meta.json")
    (sid / "not-a-snapshot").mkdir()
    (sid / ids["half"]).mkdir()
    (sid / ids["half"] / "before").write_bytes(b"half")
    (sid / ids["half"] / "meta.json.tmp.0123456789ab").write_bytes(b"{}")
    (sid / ids["empty"]).mkdir()
    (sid / ids["tmp"]).mkdir()
    (sid / ids["tmp"] / "before.tmp.0123456789ab").write_bytes(b"h")
    gone = {ids["half"], ids["empty"], ids["tmp"]}
    assert sorted(p.name for p in review.unpublished_snapshots(root)) == sorted(gone)
    assert review.remove_unpublished(root) == 3
    assert {ids[n] for n in keep} | {"not-a-snapshot"} == set(os.listdir(sid))
    assert (sid / ids["foreign"] / "notes.txt").read_bytes() == b"mine"


async def test_doctor_names_the_workspace_temp_of_a_restore_killed_before_its_rename(tmp_path: Path) -> None:
    """A ``review.restore`` killed after writing ``<path>.tmp.<12 hex of the snapshot id>`` in the workspace and
    before its rename left that file (up to 4 MiB, in the user's project) until a retry of that restore came;
    doctor names it (``review.restore_temp``) and ``--repair`` removes it, the file itself untouched; the
    restore then still runs through."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    sid, _ = await _two_finished(data, ws)
    notes = ws / "docs" / "notes.md"
    snaps = [d.name for d in sorted((data / "review-changes" / sid).iterdir())]
    restore = {"sessionId": sid, "snapshotId": snaps[0], "submissionId": "res-1"}
    await call_killed_at(data, "review.restore_file.after_tmp_write", "review.restore", restore, client_id=CLIENT,
                         client_kind="agent")
    tmp = review.restore_temp_path(str(notes), snaps[0])
    assert sorted(os.listdir(notes.parent)) == ["notes.md", os.path.basename(tmp)]
    assert notes.read_bytes() == AFTER
    os.symlink(tmp, review.restore_temp_path(str(notes), snaps[1]))  # not a regular file: never doctor's
    found = run_doctor(DataDir(data), repair=False, now_ms=int(time.time() * 1000))
    assert [(f.check, f.subject, str(f.severity)) for f in found.findings if f.check.startswith("review.")] == \
        [("review.restore_temp", tmp, "repairable")]
    assert os.path.basename(tmp) in os.listdir(notes.parent)  # found, nothing changed
    fixed = run_doctor(DataDir(data), repair=True, now_ms=int(time.time() * 1000))
    assert [f.repaired for f in fixed.findings if f.check == "review.restore_temp"] == [True]
    assert sorted(os.listdir(notes.parent)) == ["notes.md", os.path.basename(review.restore_temp_path(
        str(notes), snaps[1]))]
    os.unlink(review.restore_temp_path(str(notes), snaps[1]))
    assert notes.read_bytes() == AFTER
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
            done = await c.call("review.restore", restore)
            assert done["snapshot"]["state"] == "restored"
    meta = review.load_meta(data / "review-changes" / sid, snaps[0]) or {}
    assert hashlib.sha256(notes.read_bytes()).hexdigest() == meta["before"]["sha256"]
    assert os.listdir(notes.parent) == ["notes.md"]


@pytest.mark.parametrize(("point", "action", "code"), [
    ("review.meta.after_tmp_write", "enospc", "STORAGE_FULL"),
    ("review.before.after_tmp_fsync", "enospc", "STORAGE_FULL"),
    ("review.meta.after_tmp_fsync", "eio", "IO_ERROR"),
])
async def test_a_record_refused_on_the_way_takes_its_half_along(tmp_path: Path, point: str, action: str,
                                                                 code: str) -> None:
    """A record refused before its ``meta.json`` (the disk full: exactly when its ``before`` bytes matter) no
    longer keeps them until the next restart: the refusal removes its folder; published snapshots stay."""
    data, ws = tmp_path / "data", tmp_path / "ws"
    sid, finished = await _two_finished(data, ws)
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, CLIENT, "agent") as c:
            host.faults.add(point, host.faults.hits(point) + 1, action)
            with pytest.raises(RpcError) as refused:
                await c.call("review.record", _params(sid, HALF_BEFORE))
            assert refused.value.data_code == code
            assert _halves(data, sid) == []
            assert _files(data / "review-changes" / sid) == finished
            assert len((await c.call("review.list", {"sessionId": sid}))["snapshots"]) == 2
