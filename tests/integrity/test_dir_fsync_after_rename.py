"""The directory fsync after the rename (or link) that publishes a session's file fails (EIO / ENOSPC): a
create, a whole-transcript rewrite, the first line of a revisions file. The effect is in the namespace but
its durability is unknown (RELIABILITY rule 7, ARCHITECTURE "a reply is sent only after what it
acknowledges is durable"): the call fails with IO_ERROR, the session's storage is failed, and a retry
with the same clientId + submissionId is refused as well until the host restarts, never answered from
the receipt the published file carries; after the restart (the next boot trusts the disk) the retry
answers with exactly one effect.

Found by this test: the retry caught the session up from the published file, restored the first try's
receipt from its header and answered it as a success, with no directory fsync in between. The injected
faults named ``*.after_rename`` / ``*.before_dirsync`` raise before the fsync runs; here the fsync itself
fails (``os.fsync`` of the sessions directory, once)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.client import RpcError
from tests.hostkit import client_for, create_two_exchanges, inprocess_host, msg

CLIENT = "cli-1"
CALLS: dict[str, dict[str, Any]] = {
    "session.create": {"sessionId": "s2", "title": "New"},
    "session.replaceMessages": {"sessionId": "s1", "messages": [msg("u0", "q0"), msg("z1", "new")]},
    "session.truncateFrom": {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"},
}
ERRNOS = {"eio": errno.EIO, "enospc": errno.ENOSPC}


@contextmanager
def _sessions_dir_fsync_fails(monkeypatch: pytest.MonkeyPatch, sessions: Path, err: int) -> Iterator[list[str]]:
    """The next fsync of the sessions directory fails with ``err`` (once); what each such fsync did."""
    real = os.fsync
    seen: list[str] = []

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}") == str(sessions):
            if "failed" not in seen:
                seen.append("failed")
                raise OSError(err, os.strerror(err))
            seen.append("ok")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        yield seen
    finally:
        monkeypatch.setattr(os, "fsync", real)


async def _ids(c: Any) -> list[str]:
    return [m["id"] for m in (await c.call("session.get", {"sessionId": "s1", "full": True}))["messages"]]


def _stable(method: str, answer: Any) -> Any:
    session = answer if method == "session.create" else answer["session"]
    trimmed = {k: v for k, v in session.items() if k not in ("createdAt", "updatedAt")}
    return trimmed if method == "session.create" else {**answer, "session": trimmed}


async def _crash_free(root: Path, method: str) -> tuple[Any, list[str], list[str]]:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await create_two_exchanges(c)
        answer = await c.call(method, {**CALLS[method], "submissionId": "sub-1"})
        listed = sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"])
        return answer, await _ids(c), listed


@pytest.mark.parametrize("action", list(ERRNOS))
@pytest.mark.parametrize("method", list(CALLS))
async def test_a_failed_directory_fsync_is_never_acknowledged_and_the_retry_has_one_effect(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, action: str) -> None:
    expected, expected_ids, expected_sessions = await _crash_free(tmp_path / "ref", method)
    root = tmp_path / "run"
    params = {**CALLS[method], "submissionId": "sub-1"}
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:
        await create_two_exchanges(c)
        before = await _ids(c)
        with _sessions_dir_fsync_fails(monkeypatch, root / "sessions", ERRNOS[action]) as seen:
            for attempt in ("first", "retry", "second retry"):
                with pytest.raises(RpcError) as failed:
                    answered = await c.call(method, params)
                    raise AssertionError(f"the {attempt} try answered {answered!r} with {seen}")
                assert failed.value.data_code == "IO_ERROR", (attempt, failed.value)
        assert seen[0] == "failed"
        if method != "session.create":
            await _ids(c)  # reads still answer (rule 7 refuses writes only)
            with pytest.raises(RpcError) as refused:  # another write of the session is refused too
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("x9", "later")})
            assert refused.value.data_code == "IO_ERROR"
    assert before == ["u0", "a0", "u1", "a1"]
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="agent") as c:  # the next boot
        retried = await c.call(method, params)
        assert await c.call(method, params) == retried
        assert _stable(method, retried) == _stable(method, expected)
        assert await _ids(c) == expected_ids
        assert sorted(s["id"] for s in (await c.call("session.list", {}))["sessions"]) == expected_sessions
