"""A full disk on a real small filesystem (issue 18 "Full disk" findings): tmpfs and a loop-mounted ext4
image, as root; skipped with the reason where mounting is not permitted."""

from __future__ import annotations

import base64
import errno
import os
import random
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from runtime.datadir import DataDir
from scripts.chaos_powercut import LoopMount, PowerCutUnavailable, unavailable_reason
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter
from tests.hostkit import REPO, client_for, inprocess_host, msg, run_cli


@contextmanager
def small_disk(kind: str, where: Path, size_mb: int = 24) -> Iterator[Path]:
    mnt = where / "mnt"
    mnt.mkdir()
    if kind == "tmpfs":
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(mnt)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"mount -t tmpfs not permitted here: {proc.stderr.strip()}")
        try:
            yield mnt
        finally:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        return
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    disk = LoopMount(where / "disk.img", mnt, size_mb=size_mb)
    try:
        disk.create()
    except PowerCutUnavailable as exc:
        pytest.skip(f"loop-mounted ext4 not permitted here: {exc}")
    try:
        yield mnt
    finally:
        # An in-process host stopped by cancellation (tests/hostkit.inprocess_host) leaves its
        # session actors' transcript writers open until this process exits: unmount lazily.
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        disk.mounted = False
        disk.destroy()


def fold_wal(db_path: Path) -> None:
    """Copy the WAL of a host's index into its database and cut it to nothing (``wal_checkpoint(TRUNCATE)``,
    beside a running host): a disk filled after it holds no WAL whose bytes a checkpoint could give back (boot
    folds the WAL first; a stop's last checkpoint deletes it)."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert not busy
    finally:
        conn.close()


def held_reader(db_path: Path) -> sqlite3.Connection:
    """A read-only connection to a host's index that has read (the caller closes it): held across the host's
    stop, the host's writer is not the last connection to close, so SQLite's checkpoint on closing the last one
    does not delete the WAL and ``-shm``, whose bytes would make room on a disk filled before the stop (boot
    folds the WAL into the database, so that checkpoint no longer needs room to grow the database)."""
    conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def fill(path: Path) -> int:
    """Write until ENOSPC (down to single bytes); returns the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as fh:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            block = b"\0" * chunk
            while True:
                try:
                    fh.write(block)
                    written += chunk
                except OSError as exc:
                    assert exc.errno in (errno.ENOSPC, errno.EDQUOT), exc
                    break
        try:
            os.fsync(fh.fileno())
        except OSError:
            pass
    return written


Write = Callable[[HostClient, dict[str, Any], int], Awaitable[Any]]


def _writes(project: Path) -> dict[str, Write]:
    """One call of every write kind: transcript lines, new files, rewrites, the revisions file, artifacts,
    secrets, blobs and DB-only rows. ``v`` holds ids from the setup; ``n`` makes each call distinct."""
    blob = base64.b64encode(os.urandom(200_000)).decode()

    async def w(c: HostClient, method: str, params: dict[str, Any]) -> Any:
        return await c.call(method, params)

    return {
        "session.create": lambda c, v, n: w(c, "session.create", {"title": f"new {n}"}),
        "session.appendMessage": lambda c, v, n: w(c, "session.appendMessage", {
            "sessionId": v["sid"], "message": msg(f"full-{n}", "x" * 50_000)}),
        "session.rename": lambda c, v, n: w(c, "session.rename", {"sessionId": v["sid"], "title": f"t{n}"}),
        "session.saveInflightMessage": lambda c, v, n: w(c, "session.saveInflightMessage", {
            "sessionId": v["sid"], "turnId": "turn1", "message": msg(f"in-{n}", "y" * 50_000, role="assistant")}),
        "session.appendCompaction": lambda c, v, n: w(c, "session.appendCompaction", {
            "sessionId": v["sid"], "compaction": {"id": f"cp{n}", "summary": "s" * 50_000,
                                                  "firstKeptMessageId": "a1", "throughMessageId": "a0",
                                                  "tokensBefore": 10}}),
        "session.fork": lambda c, v, n: w(c, "session.fork", {"sessionId": v["sid"], "title": f"fork {n}"}),
        "session.replaceMessages": lambda c, v, n: w(c, "session.replaceMessages", {
            "sessionId": v["other"], "messages": [msg("r1", "z" * 60_000)]}),
        "session.deleteMessage": lambda c, v, n: w(c, "session.deleteMessage", {
            "sessionId": v["sid"], "messageId": "a1"}),
        "session.queuePush": lambda c, v, n: w(c, "session.queuePush", {
            "sessionId": v["sid"], "principal": "ui", "content": "q" * 50_000, "permissionMode": "ask"}),
        "settings.set": lambda c, v, n: w(c, "settings.set", {"ns": "app", "key": f"k{n}", "value": "v" * 50_000}),
        "secrets.set": lambda c, v, n: w(c, "secrets.set", {"ref": f"provider/{n}", "value": "sk-" + "s" * 40_000}),
        "attachments.put": lambda c, v, n: w(c, "attachments.put", {"name": "a", "mimeType": "x/y",
                                                                    "dataBase64": blob}),
        "tasks.create": lambda c, v, n: w(c, "tasks.create", {"title": f"t{n}", "prompt": "p" * 50_000}),
        # issue 16's writes: approvals, interactions, collaboration deliveries
        "approvals.request": lambda c, v, n: w(c, "approvals.request", {
            "sessionId": v["sid"], "turnId": "turn1", "tool": f"Tool{n}", "risk": "low",
            "argsSummary": "a" * 2000}),
        "interactions.request": lambda c, v, n: w(c, "interactions.request", {
            "sessionId": v["sid"], "turnId": "turn1", "question": "q" * 2000, "allowFreeText": True}),
        "collab.deliver": lambda c, v, n: w(c, "collab.deliver", {
            "pluginId": "pl", "sourceSessionId": v["other"], "targetSessionId": v["sid"], "kind": "task",
            "content": "c" * 50_000, "idempotencyKey": f"full-{n}"}),
        "plans.submit": lambda c, v, n: w(c, "plans.submit", {
            "sessionId": v["plan"], "turnId": "pt", "toolCallId": f"call-{n}", "kind": "plan",
            "markdown": "# plan\n" + "m" * 200_000, "title": "T", "question": "Q?",
            "workspaceRoot": str(project)}),
    }


async def _setup(c: HostClient, project: Path) -> dict[str, Any]:
    sid = (await c.call("session.create", {"title": "main"}))["id"]
    for i in range(3):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"a{i}", f"acked {i} needle")})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": "turn1"})
    other = (await c.call("session.create", {"title": "other"}))["id"]
    await c.call("session.appendMessage", {"sessionId": other, "message": msg("o1", "other")})
    plan = (await c.call("session.create", {"title": "plan", "projectPath": str(project), "mode": "plan"}))["id"]
    return {"sid": sid, "other": other, "plan": plan}


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
async def test_full_disk_is_storage_full_reads_work_and_writes_recover(tmp_path: Path, kind: str) -> None:
    """Findings "on a full tmpfs and a full ext4 image ... 30/30 and 20/30 failed writes answered IO_ERROR
    (not retriable) instead of STORAGE_FULL" and "even session.get failed with 'index commit failed' while
    the disk was full": every write kind fails with STORAGE_FULL (retriable) or succeeds, never another
    code; reads keep working; host.status warns; after freeing space every write works; nothing
    acknowledged is lost across a restart."""
    with small_disk(kind, tmp_path) as mnt, trio.fail_after(240):
        data, project = mnt / "data", mnt / "project"
        project.mkdir()
        acked: list[str] = ["a0", "a1", "a2"]
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            v = await _setup(c, project)
            writes = _writes(project)
            filler = mnt / "filler"
            await trio.to_thread.run_sync(fill, filler)
            outcomes: dict[str, list[str]] = {}
            for n in range(3):
                for name, write in writes.items():
                    try:
                        result = await write(c, v, n)
                        outcomes.setdefault(name, []).append("ok")
                        if name == "session.appendMessage":
                            acked.append(f"full-{n}")
                        del result
                    except RpcError as exc:
                        outcomes.setdefault(name, []).append(exc.data_code)
                        assert exc.data_code == "STORAGE_FULL" and exc.retriable, (name, exc.data_code, exc.message)
                await trio.to_thread.run_sync(fill, mnt / f"filler-{n}")  # whatever a success freed up
            refused = {name for name, codes in outcomes.items() if "STORAGE_FULL" in codes}
            for must in ("session.create", "session.appendMessage", "session.fork", "secrets.set",
                         "attachments.put", "plans.submit", "session.replaceMessages", "approvals.request",
                         "interactions.request", "collab.deliver"):
                assert must in refused, (must, outcomes[must])
            # reads keep working while the disk is full
            got = await c.call("session.get", {"sessionId": v["sid"]})
            assert [m["id"] for m in got["messages"]][:3] == ["a0", "a1", "a2"]
            assert (await c.call("session.get", {"sessionId": v["other"], "messageLimit": 5}))["messages"]
            assert len((await c.call("session.list", {}))["sessions"]) >= 3
            assert (await c.call("search.query", {"query": "needle"}))["results"]
            await c.call("settings.get", {"ns": "app", "key": "k0"})
            await c.call("secrets.list", {})
            for method in ("approvals.pending", "interactions.pending", "usage.session"):  # issue 16's reads
                await c.call(method, {"sessionId": v["sid"]})
            await c.call("collab.list", {"sessionId": v["sid"]})
            status = await c.call("host.status", {})
            assert status["disk"]["warning"] is True and status["disk"]["freeBytes"] < 1 << 20
            # space comes back: every write kind works again
            for leftover in mnt.glob("filler*"):
                leftover.unlink()
            for write in writes.values():
                await write(c, v, 10)

            acked.append("full-10")
        async with inprocess_host(data) as host, client_for(host) as c:  # restart: nothing acked lost
            got = await c.call("session.get", {"sessionId": v["sid"], "messageLimit": 5000})
            ids = [m["id"] for m in got["messages"]]
            assert all(mid in ids for mid in acked), (acked, ids)
            assert (await c.call("host.status", {}))["boot"]["reconcile"]["errors"] == 0



@pytest.mark.parametrize("hold", [0.05, 0.25])
async def test_a_disk_that_fills_during_appends_answers_storage_full_then_recovers(tmp_path: Path,
                                                                                  hold: float) -> None:
    """Found by hand on a 12 MB tmpfs: appends streaming until the disk filled left their index ops
    failing; the next append of the session (its catch-up reads the index) and every read of it waited
    as long as the disk stayed full, and the connection's later requests behind them. Now they answer
    STORAGE_FULL (retriable) within seconds, host.status still answers, session.get serves every
    acknowledged message from the transcript (it failed STORAGE_FULL), and once the filesystem grows
    the same append goes through; nothing acknowledged is lost or doubled across a restart.

    ``hold`` 0.25 (the DB writer's index hold, ``HostConfig.index_hold``): the appends ran further ahead
    of the index before the disk filled, and the catch-up once it grew to 64 MB indexed them all in one
    transaction: a 20-38 MB WAL over a 19-27 MB index for 5-9 MB of transcript, which filled the disk
    again (the restart failed STORAGE_FULL). Now it commits in bounded slices (``store.indexing.backlog``)."""
    with small_disk("tmpfs", tmp_path, size_mb=12) as mnt, trio.fail_after(180):
        data = mnt / "data"
        acked: list[str] = []
        async with inprocess_host(data, index_hold=hold) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "fills"}))["id"]
            await trio.to_thread.run_sync(lambda: (mnt / "filler").write_bytes(b"\0" * (2 << 20)))
            n = 0
            while True:  # ~12 KB lines: the index fills the disk as well as the transcript
                try:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                        f"m{n}", os.urandom(6000).hex())})
                    acked.append(f"m{n}")
                    n += 1
                except RpcError as exc:
                    assert exc.data_code == "STORAGE_FULL" and exc.retriable, exc
                    break
            assert acked
            for method, params in [("session.appendMessage", {"sessionId": sid, "message": msg(f"m{n}", "small")}),
                                   ("session.list", {"limit": 5})]:
                with trio.fail_after(10):  # before: waited as long as the disk stayed full
                    try:
                        await c.call(method, params)
                    except RpcError as exc:
                        assert exc.data_code == "STORAGE_FULL" and exc.retriable, (method, exc)
                    else:
                        if method == "session.appendMessage":  # a small line can still fit: acknowledged
                            acked.append(f"m{n}")
                            n += 1
            with trio.fail_after(10):
                assert (await c.call("host.status", {}))["disk"]["warning"] is True
            with trio.fail_after(10):  # the acknowledged appends the index cannot take: read from the transcript
                got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
                assert [m["id"] for m in got["messages"]] == acked
                assert got["totalMessages"] == got["session"]["messageCount"] == len(acked)
                page = await c.call("session.get", {"sessionId": sid, "messageLimit": 5})
                assert [m["id"] for m in page["messages"]] == acked[-5:] and page["hasMoreBefore"]
            (mnt / "filler").unlink()
            await trio.run_process(["mount", "-o", "remount,size=64m", str(mnt)], capture_stdout=True,
                                   capture_stderr=True)
            with trio.fail_after(30):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{n}", "small")})
            acked.append(f"m{n}")
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert [m["id"] for m in got["messages"]] == acked
        # restart: nothing acknowledged lost or doubled
        async with inprocess_host(data, index_hold=hold) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert [m["id"] for m in got["messages"]] == acked


def test_serve_on_a_full_disk_says_so_in_one_line(tmp_path: Path) -> None:
    """Found by hand: ``pi-host serve`` on a full disk died with a trio ExceptionGroup traceback (the
    lock file's pid write, ENOSPC). Now it is the documented start failure: one line, STORAGE_FULL,
    exit status 5."""
    with small_disk("tmpfs", tmp_path, size_mb=4) as mnt:
        fill(mnt / "filler")
        done = run_cli("--data-dir", str(mnt / "data"), "serve", "--port", "0", "--quiet", timeout=60)
        assert done.returncode == 5, done.stderr
        assert "Traceback" not in done.stderr and "STORAGE_FULL" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


async def test_reads_while_the_index_cannot_take_appends_come_from_the_transcript(tmp_path: Path) -> None:
    """The same stall without a small filesystem, everywhere: every index commit fails with ENOSPC
    (``index.before_commit:*:enospc``) after two appends. session.get failed STORAGE_FULL for the
    acknowledged appends the index could not take (its read waited for them); now it serves them from
    the transcript — the newest page, a ``messageAround`` page, on another connection too — with the
    file's count, and the index takes them once commits succeed again."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "stalled"}))["id"]
            acked = []
            for i in range(2):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"tokindexed{i}")})
                acked.append(f"m{i}")
            assert (await c.call("session.list", {"limit": 5}))["sessions"][0]["messageCount"] == 2
            host.faults.add("index.before_commit", None, "enospc")
            for i in range(2, 8):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"tokstalled{i}")})
                acked.append(f"m{i}")
            with pytest.raises(RpcError) as listed:  # index-backed: must see them, cannot
                await c.call("session.list", {"limit": 5})
            assert listed.value.data_code == "STORAGE_FULL" and listed.value.retriable
            async with client_for(host, "reader") as r:
                for client in (c, r):
                    got = await client.call("session.get", {"sessionId": sid, "messageLimit": 50})
                    assert [m["id"] for m in got["messages"]] == acked
                    assert [m["seq"] for m in got["messages"]] == list(range(1, 9))
                    assert got["totalMessages"] == got["session"]["messageCount"] == 8
                page = await r.call("session.get", {"sessionId": sid, "messageAround": "m5", "messageLimit": 3})
                assert [m["id"] for m in page["messages"]] == ["m4", "m5", "m6"]
                assert page["hasMoreBefore"] and page["hasMoreAfter"]
            host.faults.clear()
            with trio.fail_after(20):  # the repairs go through: index-backed reads see every append
                while True:
                    try:
                        listed_now = (await c.call("session.list", {"limit": 5}))["sessions"]
                        break
                    except RpcError as exc:
                        assert exc.data_code == "STORAGE_FULL", exc
                        await trio.sleep(0.05)
            assert listed_now[0]["messageCount"] == 8
            found = await c.call("search.query", {"query": "tokstalled7"})
            assert [h["messageId"] for h in found["results"]] == ["m7"]
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 50})
            assert [m["id"] for m in got["messages"]] == acked


async def test_a_host_stopped_while_the_disk_is_full_stops_and_the_next_boot_checks(tmp_path: Path) -> None:
    """Found by hand: ``pi-host serve`` stopped (SIGTERM) on a full disk exited 5 with "cannot open the data
    directory: STORAGE_FULL" — the clean-shutdown marker's write raised StorageFull, which the stop let out
    (it only expected OSError), and host.json stayed behind. Now the stop ends normally without the
    marker and removes host.json; the next boot treats it as unclean and every acknowledged message is there."""
    with small_disk("tmpfs", tmp_path, size_mb=8) as mnt, trio.fail_after(120):
        data = mnt / "data"
        acked: list[str] = []
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "full at stop"}))["id"]
            for n in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{n}", "kept")})
                acked.append(f"m{n}")
            reader = held_reader(data / "pi.sqlite")
            await trio.to_thread.run_sync(fill, mnt / "filler")
        reader.close()
        assert not (data / "clean-shutdown").exists() and not (data / "host.json").exists()
        (mnt / "filler").unlink()
        async with inprocess_host(data) as host, client_for(host) as c:
            assert host.boot.report["cleanShutdown"] is False
            got = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in got["messages"]] == acked


def test_serve_stopped_on_a_full_disk_says_the_stop_was_not_recorded(tmp_path: Path) -> None:
    """The same stop through ``pi-host serve`` (SIGTERM): exit status 0, no traceback, and one line saying
    the clean shutdown could not be recorded, instead of "cannot open the data directory" and status 5."""
    with small_disk("tmpfs", tmp_path, size_mb=8) as mnt:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(mnt / "data"), "serve",
                                 "--port", "0", "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and "listening on" in proc.stdout.readline()
            reader = held_reader(mnt / "data" / "pi.sqlite")
            fill(mnt / "filler")
            proc.terminate()
            _out, err = proc.communicate(timeout=60)
            reader.close()
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "could not record a clean shutdown" in err, err
        assert not (mnt / "data" / "host.json").exists()


def _prose_lines(n: int) -> list[bytes]:
    """``n`` message lines of ~13 KB of prose (deterministic: the index they make has one size)."""
    rng = random.Random(11)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))) for _ in range(4000)]
    return [dumps_line({"type": "message", "id": f"late{i}", "role": "user", "createdAt": "2026-01-01T00:00:00Z",
                        "blocks": [{"type": "text", "text": " ".join(rng.choice(words) for _ in range(1800))}]})
            for i in range(n)]


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def test_a_restart_far_behind_its_transcript_needs_room_for_the_index_not_twice(tmp_path: Path) -> None:
    """A host killed with 6 MB of acknowledged lines its index never took (their ops lost) restarts on a
    disk with room for the index they make plus 12 MB, not for that index twice: boot's reconcile indexes
    them in bounded commits, the WAL checkpointed between them. Before, one transaction put all ~28 MB of
    their index pages in the WAL before any reached the database file: boot failed STORAGE_FULL."""
    seed = tmp_path / "seed"
    async with inprocess_host(seed) as host, client_for(host) as c:
        sid = (await c.call("session.create", {"title": "far behind"}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "before the crash")})
    lines = _prose_lines(480)
    writer = TranscriptWriter.open(DataDir(seed).transcript(sid))
    try:
        for i in range(0, len(lines), 40):
            writer.append(lines[i:i + 40])
    finally:
        writer.close()
    before = _tree_bytes(seed)
    # what the index takes once they are in it: the same restart on a disk with room
    roomy = tmp_path / "roomy"
    shutil.copytree(seed, roomy)
    async with inprocess_host(roomy) as host, client_for(host) as c:
        assert (await c.call("session.get", {"sessionId": sid, "messageLimit": 5}))["totalMessages"] == 481
    with sqlite3.connect(roomy / "pi.sqlite") as side:
        side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    grown = _tree_bytes(roomy) - before
    assert grown > 20 << 20, grown  # the index the lines make: ~28 MB
    size_mb = (before + grown + (12 << 20)) // (1 << 20) + 1
    with small_disk("tmpfs", tmp_path, size_mb=size_mb) as mnt, trio.fail_after(180):
        data = mnt / "data"
        await trio.to_thread.run_sync(lambda: shutil.copytree(seed, data))
        async with inprocess_host(data) as host, client_for(host) as c:
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1000})
            assert [m["id"] for m in got["messages"]] == ["m0", *(f"late{i}" for i in range(480))]
            assert (await c.call("search.query", {"query": "before the crash"}))["results"]
            assert (await c.call("host.status", {}))["boot"]["reconcile"]["tail"] == 1
