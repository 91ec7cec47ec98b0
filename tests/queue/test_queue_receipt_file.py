"""A keyed ``session.queuePush`` of a ~900 KB entry: its receipt row holds a stand-in, the answer a file.

Seed 003 §1.3 (the database stores no large payloads; files for payloads the host merely stores and ships).
Black-box on real ``pi-host serve`` processes: the row in SQLite stays small; a retry with the same
``submissionId`` on a new connection, after a SIGKILL and restart, and after a kill between the answer's file
and the commit answers exactly the first answer and pushes nothing again; other params under the key are
``IDEMPOTENCY_CONFLICT``; a damaged answer file is ``CORRUPT_DATA`` (never another answer, nothing pushed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError, open_client
from tests.dbkit import rows
from tests.hostkit import HostProcess, call_killed_at, start_host_process

CLIENT = "ui-big"
ENTRY_BYTES = 900_000


@asynccontextmanager
async def _host(data: Path) -> AsyncIterator[HostProcess]:
    proc = await trio.to_thread.run_sync(start_host_process, data)
    try:
        yield proc
    finally:
        await trio.to_thread.run_sync(proc.terminate)


@asynccontextmanager
async def _client(proc: HostProcess) -> AsyncIterator[HostClient]:
    async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="ui") as c:
        yield c


def _push(sid: str, sub: str, fill: str = "x") -> dict[str, Any]:
    return {"sessionId": sid, "principal": "ui", "permissionMode": "ask", "content": fill * ENTRY_BYTES,
            "submissionId": sub}


def _row_bytes(data: Path, sub: str) -> int:
    [(size,)] = rows(data, "SELECT length(CAST(response_json AS BLOB)) FROM command_receipts "
                           "WHERE client_id = ? AND submission_id = ?", CLIENT, sub)
    return int(size)


def _entries(data: Path) -> int:
    return int(rows(data, "SELECT COUNT(*) FROM turn_queue")[0][0])


def _files(data: Path) -> list[Path]:
    return sorted((data / "receipts").glob("*.json"))


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=False) == json.dumps(b, sort_keys=False)


async def test_a_large_answer_is_a_file_and_every_retry_answers_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(120):
        async with _host(data) as proc:
            async with _client(proc) as c:
                sid = (await c.call("session.create", {"title": "q"}))["id"]
                first = await c.call("session.queuePush", _push(sid, "big-1"))
            assert len(first["entry"]["content"]) == ENTRY_BYTES
            assert _row_bytes(data, "big-1") < 200  # was ~900 KB: the answer is in receipts/<sha256>.json
            assert len(_files(data)) == 1 and _files(data)[0].stat().st_size > ENTRY_BYTES
            async with _client(proc) as again:
                assert _same(await again.call("session.queuePush", _push(sid, "big-1")), first)
                with pytest.raises(RpcError) as err:
                    await again.call("session.queuePush", _push(sid, "big-1", fill="y"))
                assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            assert _entries(data) == 1
        proc = await trio.to_thread.run_sync(start_host_process, data)
        await trio.to_thread.run_sync(proc.kill9)
        async with _host(data) as proc:  # a host that starts cold: the row and its file answer
            async with _client(proc) as c:
                assert _same(await c.call("session.queuePush", _push(sid, "big-1")), first)
                with pytest.raises(RpcError) as err:
                    await c.call("session.queuePush", _push(sid, "big-1", fill="y"))
                assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
        assert _entries(data) == 1 and len(_files(data)) == 1


async def test_a_kill_after_its_file_before_its_commit_pushes_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(180):
        async with _host(data) as proc:
            async with _client(proc) as c:
                sid = (await c.call("session.create", {"title": "q"}))["id"]
        # the answer's file is written and fsynced, the transaction with the entry and the row is not committed
        await call_killed_at(data, "session.queuePush.before_commit", "session.queuePush", _push(sid, "big-2"),
                             client_id=CLIENT, client_kind="ui")
        async with _host(data) as proc:
            assert _files(data) == []  # boot removed the file no row names
            assert (await _status(proc))["boot"]["receiptFilesRemoved"] == 1
            async with _client(proc) as c:
                first = await c.call("session.queuePush", _push(sid, "big-2"))
            assert _entries(data) == 1 and _row_bytes(data, "big-2") < 200 and len(_files(data)) == 1
        proc = await trio.to_thread.run_sync(start_host_process, data)
        await trio.to_thread.run_sync(proc.kill9)
        async with _host(data) as proc:
            async with _client(proc) as c:
                assert _same(await c.call("session.queuePush", _push(sid, "big-2")), first)
        assert _entries(data) == 1 and len(_files(data)) == 1


async def test_a_damaged_answer_file_is_corrupt_data_and_pushes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with trio.fail_after(120):
        async with _host(data) as proc:
            async with _client(proc) as c:
                sid = (await c.call("session.create", {"title": "q"}))["id"]
                await c.call("session.queuePush", _push(sid, "big-3"))
        [file] = _files(data)
        body = file.read_bytes()
        file.write_bytes(body.replace(b"xxxx", b"xxxy", 1))
        async with _host(data) as proc:
            async with _client(proc) as c:
                for _ in range(2):
                    with pytest.raises(RpcError) as err:
                        await c.call("session.queuePush", _push(sid, "big-3"))
                    assert err.value.data_code == "CORRUPT_DATA", err.value
                    assert err.value.data["reason"] == "receiptFile"
                # the session answers other requests
                assert len((await c.call("session.queueList", {"sessionId": sid}))["entries"]) == 1
        assert _entries(data) == 1 and _files(data) == [file]  # a damaged file a row names is never swept


async def _status(proc: HostProcess) -> dict[str, Any]:
    async with _client(proc) as c:
        status: dict[str, Any] = await c.call("host.status")
        return status
