"""Boot on a full disk, black box: real ``pi-host serve`` processes on a small tmpfs data directory.

Whatever recovery boot must write (a database quarantined and rebuilt from the transcripts, a database
created anew, a migration and its backup, an in-flight reply promoted into its transcript) either
finishes or the start fails with exit code 5 and a ``STORAGE_FULL`` message: never a traceback, an
IO_ERROR or a host serving a partial index. Not one transcript byte changes; once space is back the
next start succeeds and every acknowledged message reads back exactly once."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import subprocess
import tarfile
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError, open_client
from tests.hostile.test_full_disk import fill, fold_wal, small_disk
from tests.hostkit import REPO, HostProcess, msg, run_cli, start_host_process

pytestmark = pytest.mark.slow

UPGRADES = REPO / "tests" / "fixtures" / "upgrades"


def _sums(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _boot_once(data: Path, fault: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A start that must end by itself (a refusal): ``pi-host serve`` (forked, ``run_cli``), its output
    captured; ``fault``: ``RT_CRASHPOINT``. A start that serves instead is killed after 60 s (and fails the
    caller's check)."""
    argv = ("--data-dir", str(data), "serve", "--port", "0", "--quiet")
    try:
        return run_cli(*argv, env={"RT_CRASHPOINT": fault} if fault else None, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, -9, "", f"(still serving after {timeout:g} s: killed)")


def _refused_full(proc: subprocess.CompletedProcess[str]) -> None:
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 5, (proc.returncode, proc.stderr[-3000:])
    assert last.startswith("pi-host: cannot open the data directory: STORAGE_FULL: "), last
    assert "host.json" not in last, last  # refused by boot's recovery, not after it (by the gateway's files)
    assert "Traceback" not in proc.stderr.split("--- Logging error ---")[0], proc.stderr[-3000:]


async def _on(data: Path, work: Any, **kw: Any) -> Any:
    host: HostProcess = await trio.to_thread.run_sync(lambda: start_host_process(data, **kw))
    try:
        async with open_client(host.url, host.token, client_id="ui-1", client_kind="ui") as c:
            return await work(c)
    finally:
        await trio.to_thread.run_sync(host.terminate)


async def _fill_through_the_wire(data: Path) -> dict[str, list[str]]:
    acked: dict[str, list[str]] = {}

    async def work(c: Any) -> None:
        sids = [(await c.call("session.create", {"title": f"s{i}"}))["id"] for i in range(3)]
        n = 0
        while True:
            for sid in sids:
                try:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                        f"m{n}", os.urandom(3000).hex())})
                except RpcError as exc:
                    assert exc.data_code == "STORAGE_FULL", exc
                    return
                acked.setdefault(sid, []).append(f"m{n}")
                n += 1

    await _on(data, work)
    return acked


async def _reads(data: Path, sessions: list[str]) -> tuple[dict[str, list[str]], dict[str, Any]]:
    async def work(c: Any) -> tuple[dict[str, list[str]], dict[str, Any]]:
        out = {}
        for sid in sessions:
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 5000})
            out[sid] = [m["id"] for m in got["messages"]]
        return out, (await c.call("host.status", {}))["boot"]

    result: tuple[dict[str, list[str]], dict[str, Any]] = await _on(data, work)
    return result


def _damage(data: Path, how: str) -> None:
    db = data / "pi.sqlite"
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        return
    # the header overwritten in place (no space freed), and the WAL's too: a WAL copy of page 1 would
    # otherwise hide the damage from SQLite
    for path in (db, Path(f"{db}-wal")):
        if path.exists() and path.stat().st_size:
            with open(path, "r+b") as fh:
                fh.write(b"not an SQLite header, garbage!!!" * 2)


@pytest.mark.parametrize("how", ["corrupt", "deleted"])
async def test_a_rebuild_on_a_full_disk_fails_storage_full_and_succeeds_once_space_is_back(
        tmp_path: Path, how: str) -> None:
    """Found: with the disk full, the quarantine of a corrupt ``pi.sqlite`` (or a lost one) left boot
    creating a database there was no room for; the start failed with ``IO_ERROR: cannot prepare ...:
    database or disk is full`` (exit 5) instead of STORAGE_FULL. Now STORAGE_FULL; the transcripts are
    untouched, and with room the next start rebuilds the index. A corrupt file is not moved while the disk
    is full: the note owing its salvage (``quarantine/salvage-owed.json``) is written before the move and
    there is no room for it, so it stays in place (a file moved without it would be found missing at the
    next start, and its DB-only rows never salvaged); with room it is quarantined and salvaged."""
    with small_disk("tmpfs", tmp_path, size_mb=6) as mnt, trio.fail_after(300):
        data = mnt / "data"
        acked = await _fill_through_the_wire(data)
        assert sum(map(len, acked.values())) > 20
        _damage(data, how)
        await trio.to_thread.run_sync(fill, mnt / "filler")  # what deleting the database freed: full again
        before = _sums(data / "sessions")
        for _ in range(2):  # a second refused start changes nothing either
            _refused_full(await trio.to_thread.run_sync(_boot_once, data))
            assert _sums(data / "sessions") == before
        if how == "corrupt":
            assert (data / "pi.sqlite").exists()
            assert not any(p.name.startswith("pi.sqlite.corrupt-") for p in (data / "quarantine").iterdir())
        (mnt / "filler").unlink()
        await trio.run_process(["mount", "-o", "remount,size=64m", str(mnt)], capture_stdout=True)
        got, boot = await _reads(data, sorted(acked))
        assert got == acked
        if how == "corrupt":
            assert boot["database"]["quarantined"] and "salvage" in boot, boot["database"]
        assert boot["reconcile"]["errors"] == 0 and boot["reconcile"]["full"] == 3, boot["reconcile"]
        assert _sums(data / "sessions") == before


async def test_a_rebuild_that_runs_out_of_space_part_way_fails_storage_full(tmp_path: Path) -> None:
    """Room for a new database but not for the whole index: reconcile's first failed transaction used to
    be counted as a session "not repaired" and the host served with sessions missing from the index; now
    the start fails STORAGE_FULL, and with room the next one indexes every session."""
    with small_disk("tmpfs", tmp_path, size_mb=8) as mnt, trio.fail_after(300):
        data = mnt / "data"
        scratch = mnt / "scratch"
        scratch.write_bytes(b"\0" * (2 << 20))
        acked = await _fill_through_the_wire(data)
        _damage(data, "deleted")
        before = _sums(data / "sessions")
        # free some room: enough for the schema, far too little for ~6 MB of transcripts' index
        scratch.unlink()
        await trio.to_thread.run_sync(fill, scratch)
        os.truncate(scratch, max(0, scratch.stat().st_size - (1536 << 10)))
        _refused_full(await trio.to_thread.run_sync(_boot_once, data))
        assert _sums(data / "sessions") == before
        scratch.unlink()
        await trio.run_process(["mount", "-o", "remount,size=64m", str(mnt)], capture_stdout=True)
        got, boot = await _reads(data, sorted(acked))
        assert got == acked and boot["reconcile"]["errors"] == 0
        assert _sums(data / "sessions") == before


async def test_a_migration_on_a_full_disk_fails_storage_full_and_runs_once_space_is_back(tmp_path: Path) -> None:
    """An earlier build's data directory (schema 23) on a full disk: the migration's backup has no room."""
    tarball = UPGRADES / "v23-d6f1e45.tar.gz"
    with small_disk("tmpfs", tmp_path, size_mb=8) as mnt, trio.fail_after(300):
        with tarfile.open(tarball) as tar:
            tar.extractall(mnt, filter="data")
        data = mnt / "data"
        before = _sums(data / "sessions")
        db_before = hashlib.sha256((data / "pi.sqlite").read_bytes()).hexdigest()
        await trio.to_thread.run_sync(fill, mnt / "filler")
        _refused_full(await trio.to_thread.run_sync(_boot_once, data))
        assert _sums(data / "sessions") == before
        assert hashlib.sha256((data / "pi.sqlite").read_bytes()).hexdigest() == db_before
        (mnt / "filler").unlink()
        manifest = json.loads(tarball.with_name("v23-d6f1e45.json").read_text())
        got, boot = await _reads(data, sorted(manifest["sessions"]))
        assert boot["database"]["migratedFrom"] == 23 and boot["reconcile"]["errors"] == 0
        for sid, want in manifest["sessions"].items():
            promoted = [manifest["turn"]["inflightId"]] if sid == manifest["turn"]["sessionId"] else []
            assert got[sid] == [m["id"] for m in want["messages"]] + promoted, sid


async def _stream_a_reply(host: HostProcess, partial: str) -> str:
    """A new session whose turn ``turn1`` is streaming reply ``r1`` (``partial`` so far, an in-flight
    checkpoint) after prompt ``u1``; its id."""
    async with open_client(host.url, host.token, client_id="ui-1", client_kind="ui") as c:
        sid: str = (await c.call("session.create", {"title": "streaming"}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "question")})
        await c.call("session.startTurn", {"sessionId": sid, "turnId": "turn1"})
        await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "turn1", "message": msg(
            "r1", partial, role="assistant")})
    return sid


async def test_an_inflight_promotion_on_a_full_disk_fails_storage_full_then_lands_once(tmp_path: Path) -> None:
    """A turn streaming a reply (``saveInflightMessage``) when the host is SIGKILLed, restarted with the disk
    full: the boot sweep's promotion is a transcript append. Found: the sweep counted the ENOSPC as an
    error and the host served, the reply left behind as a checkpoint to be appended after whatever the
    session got next. Now the start fails STORAGE_FULL; with room the reply lands once, aborted."""
    with small_disk("tmpfs", tmp_path, size_mb=8) as mnt, trio.fail_after(300):
        data = mnt / "data"
        host = await trio.to_thread.run_sync(start_host_process, data)
        try:
            sid = await _stream_a_reply(host, "partial answer " + "x" * 20_000)
            fold_wal(data / "pi.sqlite")  # no WAL for boot to fold and write in its room: the disk stays full
            await trio.to_thread.run_sync(fill, mnt / "filler")
        finally:
            await trio.to_thread.run_sync(host.kill9)
        before = _sums(data / "sessions")
        assert any(name.endswith(".inflight.json") for name in before), before
        _refused_full(await trio.to_thread.run_sync(_boot_once, data))
        assert _sums(data / "sessions") == before
        (mnt / "filler").unlink()
        for _ in range(2):  # promoted once, and not again by the next start
            got, boot = await _reads(data, [sid])
            assert got == {sid: ["u1", "r1"]}, got
        assert boot["inflight"]["errors"] == []


async def test_an_inflight_promotion_whose_append_finds_no_room_fails_storage_full(tmp_path: Path) -> None:
    """The sweep's own append failing ENOSPC (injected: room for the database, none for the line). Found:
    the sweep counted it in ``inflight.errors`` and the host served, the turn aborted without its reply and
    the checkpoint left to be appended after whatever the session got next. Now the start fails
    STORAGE_FULL with the transcript untouched; the next start promotes the reply once."""
    data = tmp_path / "data"
    host = await trio.to_thread.run_sync(start_host_process, data)
    try:
        sid = await _stream_a_reply(host, "partial answer")
    finally:
        await trio.to_thread.run_sync(host.kill9)
    before = _sums(data / "sessions")
    _refused_full(await trio.to_thread.run_sync(_boot_once, data, "append.before_write:1:enospc"))
    assert _sums(data / "sessions") == before
    for _ in range(2):
        got, boot = await _reads(data, [sid])
        assert got == {sid: ["u1", "r1"]}, got
    assert boot["inflight"]["errors"] == []


async def _fill_from_many_connections(data: Path, sessions: int = 6, writers: int = 2) -> dict[str, list[str]]:
    """Appends of ~1 KB of words from ``writers`` connections per session at once until one answers
    STORAGE_FULL: the DB writer's batches fail while shorter transcript lines still fit, so the index trails
    its transcripts and the last checkpoints, which had no room to grow the database, leave a large WAL. The
    host is then killed: a clean stop on that disk sometimes found room to fold the WAL at its close (the
    writes it freed decide that), and then the next start was not short of room at all (2 in 8 runs here)."""
    rnd = random.Random(7)
    words = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(2, 9)))
             for _ in range(5000)]
    acked: dict[str, list[str]] = {}
    full = trio.Event()
    count = itertools.count()
    host: HostProcess = await trio.to_thread.run_sync(lambda: start_host_process(data))
    try:
        async with open_client(host.url, host.token, client_id="ui-1", client_kind="ui") as c:
            sids = [(await c.call("session.create", {"title": f"s{i}"}))["id"] for i in range(sessions)]

        async def writer(sid: str, w: int) -> None:
            async with open_client(host.url, host.token, client_id=f"w{w}-{sid}", client_kind="ui") as c:
                while not full.is_set():
                    mid = f"m{next(count)}"
                    text = " ".join(rnd.choice(words) for _ in range(170))
                    try:
                        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(mid, text)})
                    except RpcError as exc:
                        assert exc.data_code == "STORAGE_FULL", exc
                        full.set()
                        return
                    acked.setdefault(sid, []).append(mid)

        async with trio.open_nursery() as nursery:
            for sid in sids:
                for w in range(writers):
                    nursery.start_soon(writer, sid, w)
    finally:
        await trio.to_thread.run_sync(host.kill9)
    return acked


async def _start_with_room_for_the_catch_up(mnt: Path, data: Path) -> HostProcess:
    """A start on the disk as it is; if it runs out of room in its catch-up, 4 MiB more freed, up to 3 times.
    The room a refused start names is the fold's: the fold gives the WAL's bytes back for the catch-up, which is
    enough when the host that filled the disk had indexed all but a little; when its index trailed further (a
    loaded machine) the catch-up ran out (not named yet: noted). Each start that ran out kept what it indexed."""
    for attempt in range(4):
        try:
            return await trio.to_thread.run_sync(lambda: start_host_process(data))
        except RuntimeError as exc:
            assert "STORAGE_FULL: recovering the data directory at boot" in str(exc) and attempt < 3, exc
            await _free_up_to(mnt, _free(mnt) + (4 << 20))
    raise AssertionError("unreachable")


def _used(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bfree * st.f_frsize


async def _free_up_to(mnt: Path, want: int) -> None:
    """Grow the tmpfs so that ``want`` bytes (whole pages) are free: what deleting files elsewhere would do."""
    size_kib = -(-(_used(mnt) + want) // 4096) * 4
    await trio.run_process(["mount", "-o", f"remount,size={size_kib}k", str(mnt)], capture_stdout=True)
    assert _free(mnt) >= want


_NEEDS = re.compile(r"needs (\d+) bytes free")
"""The room a refused start names."""


def _named_need(proc: subprocess.CompletedProcess[str]) -> int:
    found = _NEEDS.search(proc.stderr)
    assert found, proc.stderr[-3000:]
    return int(found.group(1))


async def test_a_boot_after_a_full_disk_needs_the_room_it_names_and_a_refused_one_writes_nothing(
        tmp_path: Path) -> None:
    """Found by hand (24 MiB tmpfs): after appends filled the disk, 12 MiB had to be freed over four starts
    before one served, where 1 MiB was enough. The host that filled the disk leaves a large WAL (its last
    checkpoints had no room to grow the database); each start appended its commits to it, their automatic
    checkpoints grew the database into whatever was freed and failed part way, and the start that failed kept
    that room. Now a start folds the WAL into the database first, when there is room for the database's growth
    (and then has the WAL's bytes for its own work), and otherwise refuses STORAGE_FULL naming the room it needs
    and writes nothing, not even by closing; and its catch-up of the transcript lines the index lacks defers
    FTS5's merges (one folds a level's segments in a single transaction: 8.2 MB of WAL for a 70 KB tail).
    Here: two refused starts leave the disk's use exactly as it was (the second with half the room named
    free); once the room named is free, the next start serves (given, when the index trailed far, room for its
    catch-up, which the named room does not count yet: ``_start_with_room_for_the_catch_up``), every
    acknowledged message is there once and indexed, and an append works and is found. A fill whose disk had room
    left for the fold is not this case (its first start goes on): another disk is filled, up to three."""
    for setup in range(3):
        (tmp_path / f"setup-{setup}").mkdir()
        with small_disk("tmpfs", tmp_path / f"setup-{setup}", size_mb=12) as mnt, trio.fail_after(300):
            data = mnt / "data"
            acked = await _fill_from_many_connections(data)
            assert sum(map(len, acked.values())) > 200
            before = _sums(data / "sessions")
            used = _used(mnt)
            # a refusal takes a second or two; a start still running after 20 s is serving (the case below)
            refused = await trio.to_thread.run_sync(partial(_boot_once, data, timeout=20 if setup < 2 else 60))
            if _NEEDS.search(refused.stderr) is None and setup < 2:
                # the disk this fill left had room for the fold (its last failed writes gave some back): that start
                # went on past it (and served, or ran out in its catch-up), not the case here; fill another disk
                continue
            await _full_disk_case(mnt, data, acked, before, used, refused)
            return


async def _full_disk_case(mnt: Path, data: Path, acked: dict[str, list[str]], before: Any, used: int,
                          refused: subprocess.CompletedProcess[str]) -> None:
    _refused_full(refused)
    assert _used(mnt) == used
    need = _named_need(refused)
    await _free_up_to(mnt, need // 2)  # half of it: refused again, and the half stays free
    again = await trio.to_thread.run_sync(_boot_once, data)
    _refused_full(again)
    assert _used(mnt) == used and _named_need(again) == need
    assert _sums(data / "sessions") == before

    await _free_up_to(mnt, need)  # the room named, no more: the fold gives the WAL's bytes for the catch-up
    host = await _start_with_room_for_the_catch_up(mnt, data)
    try:
        async with open_client(host.url, host.token, client_id="ui-1", client_kind="ui") as c:
            listed = {s["id"]: s for s in (await c.call("session.list", {"limit": 50}))["sessions"]}
            for sid, ids in acked.items():
                got = await c.call("session.get", {"sessionId": sid, "messageLimit": 5000})
                seen = [m["id"] for m in got["messages"]]
                assert sorted(seen) == sorted(ids), sid  # each once (two writers: their own order)
                assert got["totalMessages"] == listed[sid]["messageCount"] == len(ids)  # the index's count
            sid = sorted(acked)[0]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "after", "appended after the boot: qzxwvj")})
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 5000})
            assert [m["id"] for m in got["messages"]][-1] == "after"
            hits = await c.call("search.sessions", {"query": "qzxwvj"})
            assert [r["sessionId"] for r in hits["results"]] == [sid]
            boot = (await c.call("host.status", {}))["boot"]
    finally:
        await trio.to_thread.run_sync(host.terminate)
    assert boot["reconcile"]["errors"] == 0 and boot["walFold"]["folded"], boot
    # a 12 MiB disk stays short of room for a merge of the index: merges stay deferred after a catch-up (when
    # the host that filled the disk had indexed every line it acknowledged, there is none: a run under load met
    # that, and the flag is then rightly left alone)
    if boot["reconcile"]["indexedMessages"]:
        assert boot["mergesDeferred"] is True, boot
