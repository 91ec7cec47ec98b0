"""The boot's read warm-up (``runtime/handlers/sessions.warm_reads``): before the host starts, the newest
page of its last-updated session is read a few times through the pipeline, so that a client's first
``session.get`` finds the read path warm. It reads only: it starts no actor, changes nothing a client
sees, and an error or a read the actor would have to serve ends it quietly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.handlers import sessions
from store.transcripts import windows
from tests.hostkit import REPO, client_for, inprocess_host, msg
from tests.turns.turnkit import new_session


async def _two_sessions(root: Path) -> tuple[str, str]:
    """An older session with messages, then a newer one with messages, then a newest one without any."""
    async with inprocess_host(root) as host, client_for(host) as c:
        older, newer = await new_session(c, "older"), await new_session(c, "newer")
        for sid in (older, newer):
            for i in range(3):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-m{i}", f"t{i}")})
        await new_session(c, "empty")
        await host.services.index_log.barrier()
        return older, newer


def _note_cold_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sessions ``windows.read_cold`` reads, in order (the warm-up's reads and a client's cold ones)."""
    read: list[str] = []
    real_cold = windows.read_cold

    def noting_cold(conn: Any, sid: str, *args: Any, **kwargs: Any) -> Any:
        read.append(sid)
        return real_cold(conn, sid, *args, **kwargs)

    monkeypatch.setattr(windows, "read_cold", noting_cold)
    return read


async def test_the_host_reads_its_last_updated_sessions_newest_page_before_it_starts_and_starts_no_actor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(60):
        _, newer = await _two_sessions(tmp_path)
        read = _note_cold_reads(monkeypatch)
        monkeypatch.setattr(sessions, "WARM_BUDGET", 60.0)  # a slow test machine still makes every read
        async with inprocess_host(tmp_path, warm_reads=5) as host:
            at_start = list(read)
            assert at_start == [newer] * 5  # before the host started: the newest session that has messages
            assert host.registry.running(newer) is False
            async with client_for(host) as c:
                page = await c.call("session.get", {"sessionId": newer, "messageLimit": 50})
            assert [m["id"] for m in page["messages"]] == [f"{newer}-m{i}" for i in range(3)]
            assert host.registry.running(newer) is False


async def test_no_warm_up_when_it_is_off_or_there_is_nothing_to_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    read = _note_cold_reads(monkeypatch)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "empty"):
            assert read == []  # no session at all
        await _two_sessions(tmp_path / "off")
        read.clear()
        async with inprocess_host(tmp_path / "off", warm_reads=0):
            assert read == []


async def test_a_read_the_actor_would_serve_ends_the_warm_up_without_starting_the_actor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_direct`` declines the read (here: it always does): the warm-up stops there, before the pipeline
    would hand the read to a newly started actor."""
    with trio.fail_after(60):
        _, newer = await _two_sessions(tmp_path)
        asked: list[str] = []

        async def declining(services: Any, p: Any, caller: Any) -> Any:
            asked.append(p.session_id)
            return None

        monkeypatch.setattr(sessions, "get_direct", declining)
        async with inprocess_host(tmp_path) as host:
            assert asked == [newer]
            assert host.registry.running(newer) is False


async def test_an_error_ends_the_warm_up_and_the_host_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with trio.fail_after(60):
        _, newer = await _two_sessions(tmp_path)
        calls: list[str] = []

        def failing(conn: Any, sid: str, *args: Any, **kwargs: Any) -> Any:
            calls.append(sid)
            raise OSError("the disk went away")

        monkeypatch.setattr(windows, "read_cold", failing)
        async with inprocess_host(tmp_path) as host:
            assert calls == [newer]
            assert "read warm-up stopped after 0 reads" in caplog.text
            assert host.registry.running(newer) is False


_WARM_AFTER_FREEZE = textwrap.dedent("""
    import gc
    import sys
    from pathlib import Path

    import trio

    from runtime.handlers import sessions
    from store.transcripts import windows
    from tests.host.test_read_warmup import _two_sessions
    from tests.hostkit import inprocess_host


    async def main(root: Path) -> None:
        await _two_sessions(root)
        frozen_at: list[int] = []
        real_cold = windows.read_cold

        def noting_cold(conn, sid, *args, **kwargs):
            frozen_at.append(gc.get_freeze_count())
            return real_cold(conn, sid, *args, **kwargs)

        windows.read_cold = noting_cold
        sessions.WARM_BUDGET = 60.0  # a slow test machine still makes every read
        assert gc.get_freeze_count() == 0
        async with inprocess_host(root, warm_reads=3, freeze_boot=True):
            assert len(frozen_at) == 3 and all(n > 0 for n in frozen_at), frozen_at
        print("ok")


    trio.run(main, Path(sys.argv[1]))
""")


def test_boot_freezes_its_objects_before_the_warm_up_as_serve_has_it(tmp_path: Path) -> None:
    """``HostConfig.freeze_boot`` (``pi-host serve`` sets it): the full collection that freezes boot's survivors
    runs before the read warm-up, not after it. It walks every object the process holds, and run after the
    warm-up it left the read path cold again (measured: a fresh host's first get over a warm one, 1.31x with
    the collection after the warm-up, 1.21x with it before). In a fresh interpreter: the freeze is process-wide."""
    from runtime.cli import _parser
    from runtime.cli_serve import host_config
    from runtime.datadir import DataDir

    args = _parser().parse_args(["--data-dir", str(tmp_path / "serve"), "serve"])
    assert host_config(args, DataDir(tmp_path / "serve")).freeze_boot is True
    proc = subprocess.run([sys.executable, "-c", _WARM_AFTER_FREEZE, str(tmp_path / "data")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
