"""A session whose storage failed (RELIABILITY rule 7: a failed fsync of its transcript, or of the sessions
directory after a file of it was published) still answers the retry of a write it acknowledged *before*
the failure from that write's receipt: its line (or file) and directory were fsynced and its receipt
committed, so the answer is the one the restart gives. The failed write's own retry stays refused until the
restart (its durability is unknown), and so does every new write; after the restart both answer as before.

Found by this test: every receipt answer of a failed session was refused, so a client that lost the reply of
an earlier acknowledged create or append and retried it with its submissionId got IO_ERROR until the host
restarted (within one run the pipeline's answer book replays a recent answer; an older one, or one of an
earlier run, reaches the session actor). The faults are the ones ``test_dir_fsync_after_rename`` injects
(``os.fsync`` of the sessions directory, once) and, for an append, ``os.fdatasync`` of the session's
transcript, once."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.client import RpcError
from tests.hostkit import client_for, inprocess_host, msg

CLIENT = "cli-1"
FAILING: dict[str, dict[str, Any]] = {
    "session.create": {"sessionId": "s1", "title": "Again"},  # s1 was deleted: created anew
    "session.replaceMessages": {"sessionId": "s1", "messages": [msg("u0", "q0"), msg("z1", "new")]},
    "session.truncateFrom": {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"},
    "session.appendMessage": {"sessionId": "s1", "message": msg("x9", "late")},
}
NEW = {"sessionId": "s1", "message": msg("n1", "new")}


@contextmanager
def _fsync_fails_once(monkeypatch: pytest.MonkeyPatch, name: str, target: Path) -> Iterator[list[str]]:
    """The next ``os.<name>`` (``fsync`` / ``fdatasync``) of ``target`` fails with EIO, once."""
    real = getattr(os, name)
    seen: list[str] = []

    def sync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode) == target.is_dir() and os.readlink(f"/proc/self/fd/{fd}") == str(target):
            if not seen:
                seen.append("failed")
                raise OSError(5, os.strerror(5))
            seen.append("ok")
        real(fd)

    monkeypatch.setattr(os, name, sync)
    try:
        yield seen
    finally:
        monkeypatch.setattr(os, name, real)


async def _acknowledged(c: Any, method: str) -> dict[str, tuple[str, dict[str, Any], Any]]:
    """Keyed writes of s1 acknowledged before the failure: submissionId → (method, params, answer)."""
    done: dict[str, tuple[str, dict[str, Any], Any]] = {}

    async def keyed(sub: str, m: str, params: dict[str, Any]) -> None:
        done[sub] = (m, params, await c.call(m, {**params, "submissionId": sub}))

    await keyed("sub-create", "session.create", {"sessionId": "s1", "title": "First"})
    for i, m in enumerate((msg("u0", "q0"), msg("a0", "r0", role="assistant"), msg("u1", "q1"),
                           msg("a1", "r1", role="assistant"))):
        await keyed(f"sub-append-{i}", "session.appendMessage", {"sessionId": "s1", "message": m})
    if method == "session.create":  # the failing write creates s1 anew: its earlier life was deleted
        await keyed("sub-delete", "session.delete", {"sessionId": "s1"})
    return done


async def _retries(c: Any, done: dict[str, tuple[str, dict[str, Any], Any]]) -> dict[str, Any]:
    return {sub: await c.call(m, {**params, "submissionId": sub}) for sub, (m, params, _) in done.items()}


@pytest.mark.parametrize("method", list(FAILING))
async def test_a_failed_session_answers_writes_acknowledged_before_the_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    params = {**FAILING[method], "submissionId": "sub-failing"}
    sessions = tmp_path / "sessions"
    if method == "session.appendMessage":
        name, target = "fdatasync", sessions / "s1.jsonl"
    else:
        name, target = "fsync", sessions
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
        done = await _acknowledged(c, method)
    # a later run (this process's answer book no longer holds them: the retries reach the session)
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:
        with _fsync_fails_once(monkeypatch, name, target) as seen:
            with pytest.raises(RpcError) as failed:
                await c.call(method, params)
            assert failed.value.data_code == "IO_ERROR" and seen == ["failed"], (failed.value, seen)
            # the earlier acknowledged writes: their original answers, while the storage is failed
            assert await _retries(c, done) == {sub: answer for sub, (_, _, answer) in done.items()}
            # the failed write's retry, and any new write, stay refused until the restart
            for m, attempt in ((method, params), ("session.appendMessage", {**NEW, "submissionId": "sub-new"}),
                               ("session.appendMessage", NEW)):
                with pytest.raises(RpcError) as refused:
                    answered = await c.call(m, attempt)
                    raise AssertionError(f"{m} {attempt} answered {answered!r}")
                assert refused.value.data_code == "IO_ERROR", refused.value
            assert await _retries(c, done) == {sub: answer for sub, (_, _, answer) in done.items()}
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="agent") as c:  # the restart
        assert await _retries(c, done) == {sub: answer for sub, (_, _, answer) in done.items()}
        retried = await c.call(method, params)
        assert await c.call(method, params) == retried
