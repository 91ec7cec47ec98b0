"""What a ``session.get`` served without the session actor costs its in-process caller in scheduling, and
what it still guarantees (``Pipeline.call`` after ``Route.direct``; ``DataDir.session_paths``).

The read is one read-pool hop from the caller's own task: the caller is resumed once, when the worker
thread delivers the page, and ``Pipeline.call`` returns it without another pass of the scheduler (each
pass after a hop met the worker thread still finishing: measured in the bench, 70 us of CPU per get). A
cancellation that arrives during the hop is still raised by the call.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.gateway_types import CallContext
from runtime import datadir
from runtime.datadir import DataDir
from runtime.handlers import sessions
from store.errors import InvalidId
from tests.hostkit import client_for, inprocess_host, msg, passivate
from tests.turns.turnkit import new_session

CALLER = CallContext(connection_id=0, client_id="in-process", client_kind="test", protocol=1)


class _Steps(trio.abc.Instrument):
    """Counts the steps (resumptions) of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def _session_without_actor(host: Any, c: Any) -> str:
    sid = await new_session(c)
    for i in range(3):
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
    await host.services.index_log.barrier()
    await passivate(host, sid)
    return sid


async def test_a_direct_read_resumes_its_in_process_caller_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await _session_without_actor(host, c)
            steps = _Steps(trio.lowlevel.current_task())
            trio.lowlevel.add_instrument(steps)
            try:
                page = await host.pipeline.call("session.get", {"sessionId": sid, "messageLimit": 2},
                                                CALLER)
            finally:
                trio.lowlevel.remove_instrument(steps)
            assert [m["id"] for m in page["messages"]] == ["m1", "m2"] and page["totalMessages"] == 3
            assert host.registry.running(sid) is False  # served by the direct read, no actor started
            assert steps.steps == 1  # the hop's wake-up; no second pass after the answer


async def test_a_direct_read_cancelled_during_its_hop_still_raises_cancelled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await _session_without_actor(host, c)
            token = trio.lowlevel.current_trio_token()
            real = sessions._read_cold
            read = threading.Event()
            with trio.CancelScope() as scope:
                def cancelled_meanwhile(*args: Any) -> Any:
                    got = real(*args)
                    trio.from_thread.run_sync(scope.cancel, trio_token=token)  # while the read is in the thread
                    read.set()
                    return got

                monkeypatch.setattr(sessions, "_read_cold", cancelled_meanwhile)
                await host.pipeline.call("session.get", {"sessionId": sid, "messageLimit": 2}, CALLER)
            assert read.is_set() and scope.cancelled_caught  # the page was read; the call raised Cancelled
            monkeypatch.setattr(sessions, "_read_cold", real)
            assert host.pipeline.in_flight == 0  # answered and counted out all the same
            page = await host.pipeline.call("session.get", {"sessionId": sid, "messageLimit": 2}, CALLER)
            assert [m["id"] for m in page["messages"]] == ["m1", "m2"]


def test_session_paths_are_kept_per_id_bounded_and_ids_still_checked(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = DataDir(tmp_path)
    first = data_dir.session_paths("s1")
    assert data_dir.session_paths("s1") is first  # kept: built once per id
    assert first.transcript == tmp_path / "sessions" / "s1.jsonl"
    assert DataDir(tmp_path).session_paths("s1") is not first  # per data directory instance
    for bad in ("../x", "", "a/b", 5, ["s1"], None):
        with pytest.raises(InvalidId):
            data_dir.session_paths(bad)  # type: ignore[arg-type]
    monkeypatch.setattr(datadir, "SESSION_PATHS_KEPT", 3)
    for i in range(10):
        assert data_dir.session_paths(f"t{i}").session_id == f"t{i}"
        assert len(data_dir._session_paths_kept) <= 3
