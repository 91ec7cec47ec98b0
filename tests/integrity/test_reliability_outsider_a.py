"""RELIABILITY.md §0, §2 (rules 1-12), §4 rows 1-9 and the shared invariant checker, read by an outsider:
black-box checks against real ``pi-host serve`` processes (SIGKILL at named crash points through
``RT_CRASHPOINT``, a real short write through ``RLIMIT_FSIZE`` set on the running host with ``prlimit``,
files damaged or deleted between runs), speaking only the documented wire protocol. Each test quotes the
claim it checks; the claims other tests already cover from the same angle are left to them."""

from __future__ import annotations

import json
import os
import random
import resource
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import error_of
from tests.hostkit import HostProcess, call_killed_at, msg, once_rebuilt, run_cli, start_host_process

CLIENT = "outsider-a"


@asynccontextmanager
async def host(data: Path, *, client_id: str = CLIENT, kind: str = "agent",
               env: dict[str, str] | None = None) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    """A ``pi-host serve`` process on ``data`` and one client; SIGKILLed on exit (the next boot recovers)."""
    proc = start_host_process(data, env=env)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id=client_id, client_kind=kind) as c:
                yield proc, c
    finally:
        proc.kill9()


async def killed_during(data: Path, spec: str, steps: Callable[[HostClient], Awaitable[object]]) -> None:
    """Run ``steps`` against a host armed with ``RT_CRASHPOINT=spec`` and make sure it died there (SIGKILL)
    before ``steps`` finished: a running turn does not outlive its host, so a turn's setup runs in the
    host that dies."""
    proc = start_host_process(data, env={"RT_CRASHPOINT": spec})
    finished = False
    try:
        with trio.fail_after(60):
            try:
                async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="agent") as c:
                    await steps(c)
                    finished = True
            except (ClientClosed, OSError):
                pass
            await trio.to_thread.run_sync(proc.reap)
    finally:
        proc.kill9()
    assert not finished, f"the host finished instead of dying at {spec}"
    assert proc.proc.returncode == -9, f"the host did not die at {spec}"


def transcript(data: Path, sid: str) -> Path:
    return data / "sessions" / f"{sid}.jsonl"


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def parsed(path: Path) -> list[dict[str, Any]]:
    """Every line of the file, each of which must parse (the invariant checker's "every file parses")."""
    return [json.loads(line) for line in lines_of(path)]


def message_ids_on_file(path: Path) -> list[str]:
    return [r["id"] for r in parsed(path) if r.get("type") == "message"]


async def ids(c: HostClient, sid: str) -> list[str]:
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    return [m["id"] for m in got["messages"]]


def temp_files(data: Path) -> list[str]:
    """Every leftover of an interrupted atomic write anywhere under the data directory."""
    return sorted(str(p.relative_to(data)) for p in data.rglob("*")
                  if ".tmp." in p.name or ".tmp-" in p.name or p.name.endswith(".tmp"))


def log_records(data: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted((data / "logs").rglob("*.ndjson")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def set_fsize_limit(pid: int, limit: int) -> None:
    """RLIMIT_FSIZE of the running host: a write past ``limit`` bytes of any file is cut short, then EFBIG
    (CPython ignores SIGXFSZ at startup, so the host is not killed by the signal: a real short write)."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))


def index_message_ids(data: Path, sid: str) -> list[str]:
    conn = sqlite3.connect(f"file:{data / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM messages WHERE session_id = ? ORDER BY seq", (sid,))]
    finally:
        conn.close()


# ------------------------------------------------------------------ §4 row 4 / rule 3: mid-file bad line

async def test_a_mid_file_bad_line_is_reported_with_its_count_in_the_boot_report_and_the_log(tmp_path: Path) -> None:
    """Rule 3: "A bad line *mid-file* is counted and reported, never silently dropped"; row 4: "a mid-file
    bad line is reported with its count". Reported where, to whom: the boot report (``host.status`` →
    ``boot``: ``reconcile.badLines``, ``damagedTranscripts``) for the UI, and the host log. A line of
    garbage lands after the last indexed line and a valid message after it, while the host is down (a torn
    line some writer appended past instead of cutting it);
    readers show every other record, export works, and the line stays on disk."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "damaged"})
        for i in range(3):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"text {i}")})
        await c.call("session.get", {"sessionId": "s1"})  # the index covers every append
    path = transcript(data, "s1")
    good = lines_of(path)
    later = json.dumps({"type": "message", "id": "m3", "role": "user", "blocks": [{"type": "text", "text": "t3"}],
                        "createdAt": "2026-07-26T09:00:00.000Z"}).encode() + b"\n"
    garbage = b'{"type":"message","id":"broken","role":"user","blo\n'
    path.write_bytes(b"".join(good) + garbage + later)
    async with host(data) as (proc, c):
        report = (await c.call("host.status", {}))["boot"]
        assert report["reconcile"]["badLines"] == 1, report["reconcile"]
        assert [(d["sessionId"], d["badLines"]) for d in report.get("damagedTranscripts", [])] == [("s1", 1)]
        assert await ids(c, "s1") == ["m0", "m1", "m2", "m3"]
        exported = await c.call("session.export", {"sessionId": "s1", "format": "jsonl"})
        assert exported["messages"] == 4
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m4", "next")})
        assert await ids(c, "s1") == ["m0", "m1", "m2", "m3", "m4"]
    assert garbage in path.read_bytes()  # kept, never silently dropped
    warned = [r for r in log_records(data) if r.get("level") == "warning" and '"s1"' in json.dumps(r)
              and '"badLines": 1' in json.dumps(r)]
    assert warned, "the damaged line is not in the host log"


# ------------------------------------------------------------------ rule 4 / row 3: no stray tmp files

async def _session_with_turn(c: HostClient, sid: str = "s1") -> None:
    await c.call("session.create", {"sessionId": sid, "title": "t"})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "question one")})
    await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "answer one", role="assistant")})


TEMP_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "rewrite.after_tmp_write": ("session.replaceMessages", {"sessionId": "s1",
                                                            "messages": [msg("u1", "question one")]}),
    "rewrite.after_tmp_fsync": ("session.truncateFrom", {"sessionId": "s1", "messageId": "a1", "mode": "regenerate"}),
    "create.after_tmp_write": ("session.create", {"sessionId": "s9", "title": "new"}),
    "fork.after_tmp_write": ("session.fork", {"sessionId": "s1", "title": "fork"}),
    "inflight.after_tmp_write": ("session.saveInflightMessage", {
        "sessionId": "s1", "turnId": "t1", "message": msg("a2", "partial", role="assistant", turnId="t1")}),
    "secrets.write.after_tmp_write": ("secrets.set", {"ref": "provider/outsider", "value": "sk-outsider"}),
    "assistantEdit.revisions.after_tmp_write": ("session.assistantEdit", {
        "sessionId": "s1", "messageId": "a1", "blocks": [{"type": "text", "text": "edited answer"}]}),
}


@pytest.mark.parametrize("point", list(TEMP_CASES))
async def test_no_stray_tmp_files_after_boot_following_a_kill_between_temp_write_and_rename(
        tmp_path: Path, point: str) -> None:
    """Rule 4: "Boot deletes stray `*.tmp.*`"; row 3: "no stray tmp files after boot". SIGKILL right
    after the temp file of an atomic replace was written (before its rename), then boot: nowhere under
    the data directory is a temp file left, and the target is wholly the old one."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await _session_with_turn(c)
    before = transcript(data, "s1").read_bytes()
    method, params = TEMP_CASES[point]

    async def steps(c: HostClient) -> None:
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call(method, {**params, "submissionId": f"k-{point}"})

    await killed_during(data, f"{point}:1", steps)
    assert temp_files(data), "the kill left no temp file: the point is not where the test thinks"
    async with host(data) as (proc, c):
        report = (await c.call("host.status", {}))["boot"]
        assert temp_files(data) == []
        assert report["tempFilesRemoved"] >= 1
        assert await ids(c, "s1") == ["u1", "a1"]
    if method in ("session.replaceMessages", "session.truncateFrom"):
        assert transcript(data, "s1").read_bytes() == before  # wholly old


# ------------------------------------------------------------------ rule 9 / row 3: the checkpoint file

@pytest.mark.parametrize("point", ["inflight.after_tmp_write", "inflight.after_tmp_fsync", "inflight.after_rename",
                                   "inflight.before_dirsync"])
async def test_a_checkpoint_replaced_under_sigkill_is_wholly_old_or_wholly_new(tmp_path: Path, point: str) -> None:
    """Rule 9: the checkpoint is "written per rule 4"; row 3: "the file is wholly old or wholly new, never
    empty or mixed". A second checkpoint of the same reply killed at each step of its replace: the boot
    promotes exactly one row for the reply, whose text is the first or the second checkpoint's, whole."""
    data = tmp_path / "data"
    data.mkdir()
    old, new = "first checkpoint " + "o" * 3000, "second checkpoint " + "n" * 6000
    async with host(data) as (proc, c):
        await _session_with_turn(c)

    async def steps(c: HostClient) -> None:
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2", "question two", turnId="t1")})
        for text in (old, new):
            await c.call("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t1",
                                                         "message": msg("a2", text, role="assistant", turnId="t1")})

    await killed_during(data, f"{point}:2", steps)
    async with host(data) as (proc, c):
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        assert temp_files(data) == []
    rows = [m for m in got["messages"] if m["id"] == "a2"]
    assert len(rows) == 1, got["messages"]
    text = rows[0]["blocks"][0]["text"]
    assert text in (old, new), text[:80]
    if point in ("inflight.after_rename", "inflight.before_dirsync"):
        assert text == new


# ------------------------------------------------------------------ rule 2 / row 5: a real short write

async def test_a_real_short_write_on_append_is_storage_full_cut_back_and_the_retry_lands_once(tmp_path: Path) -> None:
    """Rule 2: "loop os.write over short writes; on any OSError: ftruncate(fd, pre)"; row 5: "clear JSON-RPC
    error (storage_full), no ack; file truncated back to pre and still parses; writes succeed once space is
    freed". RLIMIT_FSIZE on the running host lets the kernel write a prefix of the line, then EFBIG. The
    transcript is padded (while the host is down) with lines of a kind the host does not know, so it is
    the largest file the host writes and only its append crosses the limit."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "big"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m0", "first")})
    path = transcript(data, "s1")
    pad = b"".join(json.dumps({"type": "x-outsider-pad", "n": i, "pad": "p" * 65_000}).encode() + b"\n"
                   for i in range(96))
    with path.open("ab") as fh:
        fh.write(pad)
    params = {"sessionId": "s1", "message": msg("m1", "the line that finds no room " + "z" * 2000),
              "submissionId": "short-1"}
    async with host(data) as (proc, c):
        await c.call("session.get", {"sessionId": "s1"})
        pre = path.stat().st_size
        others = max(p.stat().st_size for p in data.rglob("*") if p.is_file() and p != path)
        assert pre > others + (1 << 20), (pre, others)
        set_fsize_limit(proc.proc.pid, pre + 100)
        code, _ = await error_of(c, "session.appendMessage", params)
        assert code == "STORAGE_FULL"
        assert path.stat().st_size == pre  # cut back to pre, no partial line left
        parsed(path)
        assert await ids(c, "s1") == ["m0"]
        set_fsize_limit(proc.proc.pid, resource.RLIM_INFINITY)
        landed = await c.call("session.appendMessage", params)
        assert await c.call("session.appendMessage", params) == landed
        assert landed["message"]["seq"] == 2
        assert await ids(c, "s1") == ["m0", "m1"]
    assert message_ids_on_file(path) == ["m0", "m1"]
    async with host(data) as (proc, c):
        assert await c.call("session.appendMessage", params) == landed
        assert await ids(c, "s1") == ["m0", "m1"]


# ------------------------------------------------------------------ row 5: checkpoint on ENOSPC

async def test_a_checkpoint_that_finds_no_room_keeps_the_previous_one(tmp_path: Path) -> None:
    """Row 5: "checkpoint falls back to the previous one". The second checkpoint of a streaming reply meets
    a real short write (RLIMIT_FSIZE below its size): STORAGE_FULL; the first checkpoint is still the one
    ``session.get`` shows, no temp file is left, and after a SIGKILL the boot promotes the first one."""
    data = tmp_path / "data"
    data.mkdir()
    first = "streamed so far " + "f" * 1000
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2", "question two", turnId="t1")})
        await c.call("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t1",
                                                     "message": msg("a2", first, role="assistant", turnId="t1")})
        set_fsize_limit(proc.proc.pid, 16 * 1024)
        code, _ = await error_of(c, "session.saveInflightMessage", {
            "sessionId": "s1", "turnId": "t1",
            "message": msg("a2", first + " and much more " + "m" * 60_000, role="assistant", turnId="t1")})
        set_fsize_limit(proc.proc.pid, resource.RLIM_INFINITY)
        assert code == "STORAGE_FULL"
        view = await c.call("session.get", {"sessionId": "s1"})
        assert view["inflight"]["message"]["blocks"][0]["text"] == first
        assert [p for p in temp_files(data) if p.startswith("sessions")] == []
    async with host(data) as (proc, c):
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
    promoted = [m for m in got["messages"] if m["id"] == "a2"]
    assert [m["blocks"][0]["text"] for m in promoted] == [first]


# ------------------------------------------------------------------ rule 7 / row 6: fsync EIO

async def test_a_failed_fsync_fails_the_session_for_every_write_visibly_and_in_the_log(tmp_path: Path) -> None:
    """Rule 7: "fsync error = fatal for that file: never retry-then-ack; mark session storage failed, reject
    writes with a clear error ... next boot trusts the disk"; row 6: "no ack after the first EIO; session
    marked storage-failed; fsync is never retried and then treated as success; error visible to the client
    and in logs". ``append.fsync:1:eio`` fails the first fsync only: a host that retried the fsync would
    succeed the second time and ack. Every later write of that session's transcript (the retry, another
    append, a rename) is refused with IO_ERROR; another session writes normally; the host log
    records the failure; after a restart the session takes writes again and the failed line is absent."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await _session_with_turn(c, "s2")
    failing = {"sessionId": "s1", "message": msg("m9", "never acked"), "submissionId": "eio-1"}
    async with host(data, env={"RT_CRASHPOINT": "append.fsync:1:eio"}) as (proc, c):
        first = await error_of(c, "session.appendMessage", failing)
        assert first[0] == "IO_ERROR", first
        refused = {
            "retry": await error_of(c, "session.appendMessage", failing),
            "append": await error_of(c, "session.appendMessage", {"sessionId": "s1", "message": msg("m10", "x")}),
            "rename": await error_of(c, "session.rename", {"sessionId": "s1", "title": "renamed"}),
        }
        assert {k: v[0] for k, v in refused.items()} == dict.fromkeys(refused, "IO_ERROR"), refused
        await c.call("session.appendMessage", {"sessionId": "s2", "message": msg("s2m", "fine")})
        assert await ids(c, "s1") == ["u1", "a1"]
        got = await c.call("session.get", {"sessionId": "s1"})
        assert got["session"]["title"] == "t"
    assert message_ids_on_file(transcript(data, "s1")) == ["u1", "a1"]
    logged = [r for r in log_records(data) if r.get("level") in ("warning", "error", "critical")
              and "s1" in json.dumps(r) and "fsync" in json.dumps(r).lower()]
    assert logged, "the failed fsync is not in the host log"
    async with host(data) as (proc, c):
        again = await c.call("session.appendMessage", failing)
        assert again["message"]["seq"] == 3
        assert await ids(c, "s1") == ["u1", "a1", "m9"]


# ------------------------------------------------------------------ rule 10 / row 9: receipts

async def test_retries_get_the_identical_receipt_concurrently_after_reconnect_and_after_the_turn_ended(
        tmp_path: Path) -> None:
    """Row 9: "same (clientId, submissionId) 1–k times: concurrent, after reconnect, ... after the turn
    ended ... one effect per key; identical receipt"."""
    data = tmp_path / "data"
    data.mkdir()
    prompt = {"sessionId": "s1", "message": msg("u2", "the prompt", turnId="t1"), "submissionId": "p-1"}
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1", "submissionId": "turn-1"})
        answers: list[Any] = []

        async def send(client: HostClient) -> None:
            answers.append(await client.call("session.appendMessage", prompt))

        async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="agent") as c2:
            async with trio.open_nursery() as nursery:
                for client in (c, c2, c, c2, c):
                    nursery.start_soon(send, client)
        assert len(answers) == 5 and all(a == answers[0] for a in answers), answers
        async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="agent") as c3:
            assert await c3.call("session.appendMessage", prompt) == answers[0]
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a2", "done", role="assistant",
                                                                                   turnId="t1")})
        ended = await c.call("session.endTurn", {"sessionId": "s1", "turnId": "t1", "status": "completed",
                                                 "submissionId": "end-1"})
        assert await c.call("session.appendMessage", prompt) == answers[0]  # after the turn ended
        assert await c.call("session.endTurn", {"sessionId": "s1", "turnId": "t1", "status": "completed",
                                                "submissionId": "end-1"}) == ended
    async with host(data) as (proc, c):  # after a SIGKILL and a boot (which fences running turns)
        assert await c.call("session.appendMessage", prompt) == answers[0]
        assert await ids(c, "s1") == ["u1", "a1", "u2", "a2"]
    assert message_ids_on_file(transcript(data, "s1")).count("u2") == 1


@pytest.mark.parametrize("point", ["append.after_fsync", "index.before_commit"])
async def test_a_retry_after_a_kill_between_the_durable_write_and_the_ack_gets_the_identical_receipt(
        tmp_path: Path, point: str) -> None:
    """Rule 1: "a killed actor can leave a durable but unacked line: retries must dedupe"; rule 10:
    "Receipts durable before the ack, in the same fsynced record as the effect"; row 9: "after kill -9
    between durable write and ack". The answer after the restart equals the one a crash-free run gives
    (seq and all), the line exists once, the index agrees, and a differing payload under the key is
    refused clearly."""
    ref, data = tmp_path / "ref", tmp_path / "data"
    params = {"sessionId": "s1", "message": msg("u2", "keyed prompt"), "submissionId": "kill-1"}
    for root in (ref, data):
        root.mkdir()
        async with host(root) as (proc, c):
            await _session_with_turn(c)
    async with host(ref) as (proc, c):
        expected = await c.call("session.appendMessage", params)
    try:
        await call_killed_at(data, point, "session.appendMessage", params, client_id=CLIENT, client_kind="agent")
    except AssertionError:
        if point != "index.before_commit":
            raise  # an append is acked before its index commit: that kill may come after the answer
    async with host(data) as (proc, c):
        first = await c.call("session.appendMessage", params)
        assert await c.call("session.appendMessage", params) == first
        assert _stable(first) == _stable(expected)
        code, err = await error_of(c, "session.appendMessage", {**params, "message": msg("u3", "another prompt")})
        assert code == "IDEMPOTENCY_CONFLICT", (code, err)
        assert await ids(c, "s1") == ["u1", "a1", "u2"]
    assert message_ids_on_file(transcript(data, "s1")) == ["u1", "a1", "u2"]
    assert index_message_ids(data, "s1") == ["u1", "a1", "u2"]


def _stable(answer: Any) -> Any:
    """An append's answer without its clock readings (two runs append at different times)."""
    out = json.loads(json.dumps(answer))
    out["message"].pop("createdAt", None)
    for key in ("updatedAt",):
        out.get("session", {}).pop(key, None)
    return out


async def test_key_reuse_with_a_different_payload_is_rejected_clearly_and_changes_nothing(tmp_path: Path) -> None:
    """Row 9: "same key, different payload ... key reuse with a different payload rejected clearly":
    IDEMPOTENCY_CONFLICT (not retriable) for another message, another session, another method, also
    after a restart; nothing written, and the original key still answers its receipt."""
    data = tmp_path / "data"
    data.mkdir()
    params = {"sessionId": "s1", "message": msg("u2", "original"), "submissionId": "reuse-1"}
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await _session_with_turn(c, "s2")
        original = await c.call("session.appendMessage", params)
    variants = [
        ("session.appendMessage", {**params, "message": msg("u2", "changed text")}),
        ("session.appendMessage", {**params, "message": msg("u3", "original")}),
        ("session.appendMessage", {**params, "sessionId": "s2"}),
        ("session.rename", {"sessionId": "s1", "title": "other method", "submissionId": "reuse-1"}),
    ]
    before = {sid: transcript(data, sid).read_bytes() for sid in ("s1", "s2")}
    async with host(data) as (proc, c):
        for method, variant in variants:
            try:
                await c.call(method, variant)
            except RpcError as exc:
                assert exc.data_code == "IDEMPOTENCY_CONFLICT", (method, variant, exc.data_code)
                assert exc.retriable is False
                assert exc.message, "no message says what conflicted"
            else:
                raise AssertionError(f"{method} {variant} reused the key without a conflict")
        assert await c.call("session.appendMessage", params) == original
        listed = {s["id"]: s["title"] for s in (await c.call("session.list", {}))["sessions"]}
        assert listed == {"s1": "t", "s2": "t"}
    assert {sid: transcript(data, sid).read_bytes() for sid in ("s1", "s2")} == before


async def test_queued_turn_keys_give_one_entry_and_the_same_answer_across_a_kill(tmp_path: Path) -> None:
    """Row 9: "queued-turn keys": ``session.queuePush`` with the same principal + ``idempotencyKey`` returns
    the same entry (protocol/README), also with a fresh ``submissionId`` and after a SIGKILL; the same
    ``submissionId`` answers the identical receipt; another input under the key is IDEMPOTENCY_CONFLICT;
    one queue entry in the end."""
    data = tmp_path / "data"
    data.mkdir()
    push = {"sessionId": "s1", "principal": "ui", "idempotencyKey": "q-1", "content": "queued prompt",
            "permissionMode": "ask"}
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        first = await c.call("session.queuePush", {**push, "submissionId": "qp-1"})
        assert await c.call("session.queuePush", {**push, "submissionId": "qp-1"}) == first
        other = await c.call("session.queuePush", {**push, "submissionId": "qp-2"})
        assert other["entry"] == first["entry"]
    async with host(data) as (proc, c):
        assert await c.call("session.queuePush", {**push, "submissionId": "qp-1"}) == first
        again = await c.call("session.queuePush", push)
        assert again["entry"]["id"] == first["entry"]["id"]
        code, _ = await error_of(c, "session.queuePush", {**push, "content": "a different prompt"})
        assert code == "IDEMPOTENCY_CONFLICT"
        entries = (await c.call("session.queueList", {"sessionId": "s1"}))["entries"]
        assert [e["id"] for e in entries] == [first["entry"]["id"]]


# ------------------------------------------------------------------ rules 8 / row 8: index files deleted

@pytest.mark.parametrize("victim", ["pi.sqlite-wal", "pi.sqlite-shm", "all"])
async def test_index_files_deleted_after_a_kill_are_reconciled_and_no_transcript_is_touched(
        tmp_path: Path, victim: str) -> None:
    """Rule 8: "reconcile every boot"; row 8: "delete `.db`; delete only `-wal` (loses committed txns);
    delete `-shm` ... rebuild, or reconcile the missing rows; no transcript is touched". A SIGKILLed host
    (its WAL not checkpointed) loses the named file; the next boot answers every acknowledged message,
    search finds them, keyed retries answer their receipts, and the transcripts are byte-identical."""
    data = tmp_path / "data"
    data.mkdir()
    acked: dict[str, Any] = {}
    async with host(data) as (proc, c):
        for sid in ("s1", "s2"):
            await c.call("session.create", {"sessionId": sid, "title": f"title {sid}"})
            for i in range(3):
                p = {"sessionId": sid, "message": msg(f"{sid}m{i}", f"needle{sid} {i}"), "submissionId": f"{sid}-{i}"}
                acked[f"{sid}-{i}"] = (p, await c.call("session.appendMessage", p))
        await c.call("session.get", {"sessionId": "s2"})
    files = {sid: transcript(data, sid).read_bytes() for sid in ("s1", "s2")}
    names = ["pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"] if victim == "all" else [victim]
    for name in names:
        (data / name).unlink(missing_ok=True)
    async with host(data) as (proc, c):
        for sid in ("s1", "s2"):
            assert await ids(c, sid) == [f"{sid}m{i}" for i in range(3)]
            hits = (await c.call("search.query", {"query": f"needle{sid}"}))["results"]
            assert sorted(h["messageId"] for h in hits) == [f"{sid}m{i}" for i in range(3)]
        for p, answer in acked.values():
            assert await c.call("session.appendMessage", p) == answer
    assert {sid: transcript(data, sid).read_bytes() for sid in ("s1", "s2")} == files
    for sid in ("s1", "s2"):
        assert index_message_ids(data, sid) == [f"{sid}m{i}" for i in range(3)]



async def test_a_failed_fsync_stays_failed_after_the_session_actor_went_idle(tmp_path: Path) -> None:
    """Rule 7: "never retry-then-ack ... next boot trusts the disk"; protocol/README (IO_ERROR): "A failed
    fsync of a transcript marks that session's storage failed until the host restarts". The session's actor
    passivating after ``--idle-timeout`` forgot the mark: the retry of the very append whose fsync failed
    was then written again and acknowledged in the same process."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await _session_with_turn(c)
    failing = {"sessionId": "s1", "message": msg("m9", "never acked"), "submissionId": "eio-idle"}
    proc = start_host_process(data, "--idle-timeout", "0.3", env={"RT_CRASHPOINT": "append.fsync:1:eio"})
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="agent") as c:
                assert (await error_of(c, "session.appendMessage", failing))[0] == "IO_ERROR"
                for _ in range(100):  # until the idle actor stopped
                    if (await c.call("host.status", {}))["actors"]["sessions"] == 0:
                        break
                    await trio.sleep(0.1)
                else:
                    raise AssertionError("the session's actor never went idle")
                code, err = await error_of(c, "session.appendMessage", failing)
                assert code == "IO_ERROR", (code, err)
                assert (await error_of(c, "session.rename", {"sessionId": "s1", "title": "x"}))[0] == "IO_ERROR"
    finally:
        proc.kill9()
    assert message_ids_on_file(transcript(data, "s1")) == ["u1", "a1"]
async def test_a_bad_line_inside_the_indexed_part_is_reported_by_doctor_and_readers_survive_it(
        tmp_path: Path) -> None:
    """Rule 3 / row 4, the other way a mid-file line goes bad: one byte of an already indexed line flips
    while the host is down (the file keeps its length, so the boot's reconcile trusts its mark and does not
    rescan the file). ``pi-host doctor`` reports the line with its count; ``session.get`` marks the row
    corrupt; ``session.export`` and search keep answering (an export is a reader: never INTERNAL, the
    "host bug" code); appends go on."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "rot"})
        for i in range(4):
            await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"text {i}")})
        await c.call("session.get", {"sessionId": "s1"})
    path = transcript(data, "s1")
    raw = path.read_bytes()
    at = raw.index(b'{"type":"message","id":"m1"')
    path.write_bytes(raw[:at] + b"X" + raw[at + 1:])  # same length; the line no longer parses
    doctor = await trio.to_thread.run_sync(lambda: run_cli("--data-dir", str(data), "doctor", "--json"))
    findings = json.loads(doctor.stdout)["findings"]
    bad = [f for f in findings if f["check"] == "transcript.bad_lines" and "s1" in f["subject"]]
    assert len(bad) == 1 and bad[0]["detail"].startswith("1 line"), findings
    assert doctor.returncode != 0
    async with host(data) as (proc, c):
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        assert [m.get("id") for m in got["messages"]] == ["m0", None, "m2", "m3"]
        assert got["messages"][1].get("corrupt") is True
        exported = await c.call("session.export", {"sessionId": "s1", "format": "jsonl"})
        assert [json.loads(line).get("id") for line in exported["content"].splitlines()
                if json.loads(line).get("type") == "message"] == ["m0", "m2", "m3"]
        assert exported["messages"] == 3 and exported["unreadableLines"] == 1
        md = await c.call("session.export", {"sessionId": "s1", "format": "md"})
        assert "text 2" in md["content"]
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("m4", "next")})


# ------------------------------------------------------------------ row 7: a corrupt index between runs

@pytest.mark.parametrize("damage", ["truncated-to-a-third", "random-bytes-mid-file"])
async def test_a_corrupt_index_found_at_boot_is_quarantined_and_rebuilt_equal_to_the_transcripts(
        tmp_path: Path, damage: str) -> None:
    """Row 7: "random bytes mid-page or truncate to 1/3 (`SQLITE_CORRUPT` from `quick_check`) ... boot runs
    `PRAGMA quick_check`, quarantines db+wal+shm and rebuilds from JSONL"; figure "rows equal". The index is
    checkpointed into ``pi.sqlite`` between runs (so the damage is not masked by the WAL), then damaged; the
    next boot says it rebuilt, every session reads as its transcript, search finds every message, keyed
    retries answer their receipts, and the transcripts are untouched."""
    data = tmp_path / "data"
    data.mkdir()
    acked: list[tuple[dict[str, Any], Any]] = []
    async with host(data) as (proc, c):
        for s in range(3):
            await c.call("session.create", {"sessionId": f"s{s}", "title": f"title {s}"})
            for i in range(25):
                p = {"sessionId": f"s{s}", "message": msg(f"s{s}m{i}", f"needle{s} {i} " + "w" * (200 + 37 * i)),
                     "submissionId": f"s{s}-{i}"}
                acked.append((p, await c.call("session.appendMessage", p)))
        await c.call("session.get", {"sessionId": "s2"})
        # (from a thread: this trio loop's client answers the host's closing handshake; blocked in
        # terminate() it could not, and the host waited out its 5 s close timeout)
        assert await trio.to_thread.run_sync(proc.terminate) == 0
    conn = sqlite3.connect(data / "pi.sqlite")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    db = data / "pi.sqlite"
    size = db.stat().st_size
    if damage == "truncated-to-a-third":
        os.truncate(db, size // 3)
    else:
        with db.open("r+b") as fh:
            fh.seek(size // 2)
            fh.write(random.Random(7).randbytes(size // 8))
    files = {s: transcript(data, f"s{s}").read_bytes() for s in range(3)}
    async with host(data) as (proc, c):
        report = (await c.call("host.status", {}))["boot"]
        assert report["dbRebuilt"] is True and report["database"]["corruption"], report["database"]
        assert report["database"]["quarantined"]
        for s in range(3):
            assert await ids(c, f"s{s}") == [f"s{s}m{i}" for i in range(25)]
            hits = (await c.call("search.query", {"query": f"needle{s}", "limit": 100}))["results"]
            assert sorted(h["messageId"] for h in hits) == sorted(f"s{s}m{i}" for i in range(25))
        for p, answer in acked[::7]:
            assert await c.call("session.appendMessage", p) == answer
    assert {s: transcript(data, f"s{s}").read_bytes() for s in range(3)} == files
    for s in range(3):
        assert index_message_ids(data, f"s{s}") == [f"s{s}m{i}" for i in range(25)]


# ------------------------------------------------------------------ row 4: torn tails at every offset, one boot

TORN = (b'{"type":"message","id":"torn","role":"user","blocks":[{"type":"text","text":"never acked \xc3\xa9"}],'
        b'"createdAt":"2026-07-26T09:00:00.000Z"}\n')


async def test_a_torn_trailing_line_at_every_byte_offset_is_cut_before_the_next_append(tmp_path: Path) -> None:
    """Row 4: "truncate the last line at **every** byte offset; NUL tail (the ext4 case); garbage without a
    newline ... reader returns every complete record; boot truncates the tail before the next append";
    figure "0 misparsed, 0 glued lines after next append". One session per tail (an unacknowledged line cut
    at each offset, the whole line without its newline, 18 NUL bytes, garbage), all booted at once on a
    real host: each reads as its acknowledged messages, the next append lands whole after them, and every
    line of every file parses."""
    data = tmp_path / "data"
    data.mkdir()
    tails: dict[str, bytes] = {f"cut{k}": TORN[:k] for k in range(1, len(TORN) - 1)}
    tails |= {"nul": b"\0" * 18, "garbage": b"\x9f\x00garbage{{ no newline", "nonl": TORN[:-1]}
    async with host(data) as (proc, c):

        async def two_acked(sid: str) -> None:
            await c.call("session.create", {"sessionId": sid, "title": sid})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-0", "acked zero")})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-1", "acked one")})

        # the sessions side by side (each one's calls in order): their fsyncs overlap instead of queueing
        async with trio.open_nursery() as nursery:
            for sid in tails:
                nursery.start_soon(two_acked, sid)
        await c.call("session.get", {"sessionId": "garbage"})
        # (from a thread: this trio loop's client answers the host's closing handshake; blocked in
        # terminate() it could not, and the host waited out its 5 s close timeout)
        assert await trio.to_thread.run_sync(proc.terminate) == 0
    for sid, tail in tails.items():
        with transcript(data, sid).open("ab") as fh:
            fh.write(tail)
    async with host(data) as (proc, c):
        report = (await c.call("host.status", {}))["boot"]
        views = {sid: await ids(c, sid) for sid in tails}

        async def next_append(sid: str) -> None:
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"{sid}-2", "the next append")})

        async with trio.open_nursery() as nursery:  # one append per session, the sessions side by side
            for sid in tails:
                nursery.start_soon(next_append, sid)
        after = {sid: await ids(c, sid) for sid in tails}
    misread = {sid: v for sid, v in views.items() if v != [f"{sid}-0", f"{sid}-1"] and sid != "nonl"}
    assert misread == {}
    assert views["nonl"] in (["nonl-0", "nonl-1"], ["nonl-0", "nonl-1", "torn"])  # a whole line lacking its newline
    glued = {sid: v for sid, v in after.items() if v[:2] != [f"{sid}-0", f"{sid}-1"] or v[-1] != f"{sid}-2"}
    assert glued == {}
    for sid in tails:
        records = parsed(transcript(data, sid))  # every line parses: nothing glued to the torn bytes
        assert [r["id"] for r in records if r.get("type") == "message"][-1] == f"{sid}-2"
    assert report["reconcile"]["tornTails"] >= len(tails) - 1, report["reconcile"]


# ------------------------------------------------------------------ rules 2 and 7 under concurrent appends

async def _concurrent_appends(c: HostClient, sid: str, n: int, tag: str) -> dict[str, Any]:
    """``n`` keyed appends to ``sid`` sent at once (the session's writer may take them as one group): each
    message id → its answer, or the error code it failed with."""
    out: dict[str, Any] = {}

    async def one(i: int) -> None:
        params = {"sessionId": sid, "message": msg(f"{tag}{i}", f"{tag} {i} " + "q" * 500), "submissionId": f"{tag}{i}"}
        code, _ = await error_of(c, "session.appendMessage", params)
        out[f"{tag}{i}"] = code or "ok"

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return out


@pytest.mark.parametrize("fault", ["fsync-eio", "short-write"])
async def test_appends_in_flight_when_the_write_fails_are_none_of_them_acknowledged(tmp_path: Path,
                                                                                   fault: str) -> None:
    """Rule 7: "report unacked writes since the last good fsync as failed"; rule 2: on any OSError the file
    is cut back to ``pre``; row 5/6: "no ack". Eight appends sent at once while the first fsync fails (EIO)
    or the write finds no room (RLIMIT_FSIZE): none answers success, none is on file or in the index after a
    restart, and their retries (same keys) land once each after it."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (proc, c):
        await _session_with_turn(c)
    path = transcript(data, "s1")
    if fault == "short-write":
        with path.open("ab") as fh:  # the largest file the host writes: only the appends cross the limit
            fh.write(b"".join(json.dumps({"type": "x-outsider-pad", "n": i, "pad": "p" * 65_000}).encode() + b"\n"
                              for i in range(96)))
    env = {"RT_CRASHPOINT": "append.fsync:1:eio"} if fault == "fsync-eio" else None
    async with host(data, env=env) as (proc, c):
        await c.call("session.get", {"sessionId": "s1"})
        pre = path.stat().st_size
        if fault == "short-write":
            set_fsize_limit(proc.proc.pid, pre + 300)
        outcome = await _concurrent_appends(c, "s1", 8, "g")
        assert "ok" not in outcome.values(), outcome
        assert set(outcome.values()) == {"IO_ERROR" if fault == "fsync-eio" else "STORAGE_FULL"}, outcome
        assert path.stat().st_size == pre
        assert await ids(c, "s1") == ["u1", "a1"]
    async with host(data) as (proc, c):
        assert await ids(c, "s1") == ["u1", "a1"]
        again = await _concurrent_appends(c, "s1", 8, "g")
        assert set(again.values()) == {"ok"}, again
        assert sorted(await ids(c, "s1")) == sorted(["u1", "a1", *(f"g{i}" for i in range(8))])
    on_file = message_ids_on_file(path)
    assert sorted(on_file) == sorted(["u1", "a1", *(f"g{i}" for i in range(8))])


# ------------------------------------------------------------------ row 9: queued-turn keys across a kill

@pytest.mark.parametrize("killed", ["after-take", "prompt-durable-unacked"])
async def test_a_queued_prompt_runs_once_across_a_kill(tmp_path: Path, killed: str) -> None:
    """Row 9: "queued-turn keys ... after kill -9 between durable write and ack": protocol/README §10
    "host restart ... queueTake offers again the entry taken before the restart if no turn began with it",
    and the prompt's append carries "an id derived from the entry, so a retry cannot duplicate it". Killed
    right after the take, the entry is offered again, once; killed between the prompt line's fsync and its
    answer, the retry of that append answers (twice the same) and the transcript holds the prompt once."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data, kind="ui", client_id="ui-1") as (proc, c):
        await _session_with_turn(c)
        pushed = (await c.call("session.queuePush", {"sessionId": "s1", "principal": "user", "content": "do it",
                                                     "permissionMode": "ask", "submissionId": "push-1"}))["entry"]
    entry_id = pushed["id"]
    prompt = {"sessionId": "s1", "message": msg(f"p-{entry_id}", "do it", turnId="t1"),
              "submissionId": f"prompt-{entry_id}"}

    async def take(c: HostClient) -> Any:
        await c.call("session.queueAttach", {"sessionId": "s1", "controllerId": "agent-1"})
        return (await c.call("session.queueTake", {"sessionId": "s1", "controllerId": "agent-1"})).get("entry")

    if killed == "after-take":
        async with host(data) as (proc, c):
            assert (await take(c))["id"] == entry_id
    else:
        async def steps(c: HostClient) -> None:
            assert (await take(c))["id"] == entry_id
            await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
            await c.call("session.appendMessage", prompt)

        await killed_during(data, "append.after_fsync:1", steps)
    async with host(data) as (proc, c):
        offered = await take(c)
        if killed == "after-take":
            assert offered is not None and offered["id"] == entry_id
            await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
        else:
            assert offered is None or offered["id"] != entry_id, offered
        first = await c.call("session.appendMessage", prompt)
        assert await c.call("session.appendMessage", prompt) == first
        assert first["message"]["seq"] == 3
        assert await ids(c, "s1") == ["u1", "a1", f"p-{entry_id}"]
        assert (await c.call("session.queueList", {"sessionId": "s1"}))["entries"] == []
        assert await take(c) is None
    assert message_ids_on_file(transcript(data, "s1")).count(f"p-{entry_id}") == 1


async def test_one_key_sent_at_once_with_different_payloads_takes_effect_once(tmp_path: Path) -> None:
    """Row 9: "one effect per key ... key reuse with a different payload rejected clearly"; protocol/README
    §4: "Two requests with the same key that arrive at the same time — on one connection or two, for one
    session or two — run once". Six appends under one key on two connections at once, half with another
    message and half to another session: exactly one payload takes effect; every other request either gets
    that one's answer (the same request) or IDEMPOTENCY_CONFLICT."""
    data = tmp_path / "data"
    data.mkdir()
    variants = [{"sessionId": "s1", "message": msg("k1", "first payload"), "submissionId": "race-1"},
                {"sessionId": "s1", "message": msg("k2", "second payload"), "submissionId": "race-1"},
                {"sessionId": "s2", "message": msg("k3", "third payload"), "submissionId": "race-1"}]
    async with host(data) as (proc, c):
        await _session_with_turn(c)
        await _session_with_turn(c, "s2")
        results: list[tuple[int, Any]] = []

        async def send(client: HostClient, i: int) -> None:
            try:
                results.append((i, await client.call("session.appendMessage", variants[i])))
            except RpcError as exc:
                results.append((i, exc.data_code))

        async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="agent") as c2:
            async with trio.open_nursery() as nursery:
                for n in range(6):
                    nursery.start_soon(send, (c, c2)[n % 2], n % 3)
        wins = {i for i, r in results if isinstance(r, dict)}
        assert len(wins) == 1, results
        won = wins.pop()
        answers = [r for i, r in results if i == won]
        assert all(a == answers[0] for a in answers)
        assert {r for i, r in results if i != won} == {"IDEMPOTENCY_CONFLICT"}, results
        landed = {sid: await ids(c, sid) for sid in ("s1", "s2")}
    extra = [mid for sid in ("s1", "s2") for mid in landed[sid] if mid.startswith("k")]
    assert extra == [variants[won]["message"]["id"]], landed


async def test_an_index_corrupted_while_the_host_runs_is_rebuilt_by_the_host_itself(tmp_path: Path) -> None:
    """Row 7: "corrupt it while running ... a corruption found at runtime crashes the DB-writer actor, and
    the supervisor rebuilds". The index is checkpointed into ``pi.sqlite`` and a stretch of it overwritten
    while the host serves. The first request that meets the damage answers CORRUPT_DATA (never INTERNAL, "a
    host bug") or sees its connection closed; the same process then stops in order and starts again on the
    same port, its boot quarantines the index and rebuilds it from the transcripts, and every acknowledged
    message reads and searches again, with no restart by anyone else. The host log says why."""
    data = tmp_path / "data"
    data.mkdir()
    acked: dict[str, list[str]] = {}
    async with host(data) as (proc, c):
        for s in range(3):
            sid = f"s{s}"
            await c.call("session.create", {"sessionId": sid, "title": "t"})
            acked[sid] = []
            for i in range(30):
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                    f"{sid}m{i}", f"needle{s} " + random.Random(i).randbytes(300).hex())})
                acked[sid].append(f"{sid}m{i}")
        await c.call("session.get", {"sessionId": "s2"})
        conn = sqlite3.connect(data / "pi.sqlite")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        db = data / "pi.sqlite"
        size = db.stat().st_size
        with db.open("r+b") as fh:
            fh.seek(size // 2)
            fh.write(random.Random(11).randbytes(size // 4))
        codes: list[str | None] = []
        try:
            for _ in range(3):
                codes.append((await error_of(c, "search.query", {"query": "needle1"}))[0])
                codes.append((await error_of(c, "session.get", {"sessionId": "s1", "full": True}))[0])
        except ClientClosed as closed:
            codes.append(f"closed {closed}")
        assert "INTERNAL" not in codes, codes
        assert "CORRUPT_DATA" in codes or any(str(code).startswith("closed") for code in codes), codes
        async with once_rebuilt(proc) as again:  # the same process, the same url
            assert proc.proc.poll() is None
            for sid, want in acked.items():
                assert (await ids(again, sid))[:len(want)] == want
            found = await again.call("search.query", {"query": "needle1", "limit": 50})
            assert len(found["results"]) == 30, found
            late = await again.call("session.appendMessage", {
                "sessionId": "s1", "message": msg("late", "after the rebuild")})
            assert late["message"]["id"] == "late"
    assert any(r.get("level") == "error" and "corrupt" in json.dumps(r).lower() for r in log_records(data))
    assert list((data / "quarantine").glob("pi.sqlite.corrupt-*")), "the damaged index is kept aside"
