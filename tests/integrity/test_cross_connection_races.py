"""Several connections race whole-file rewrites, revision switches, tombstones, forks and session
lifecycle methods against appends on the same sessions (seed 003 §2.1, §4, §5, §11; protocol/README
§4). Black box: real host processes, only the documented wire protocol, then the files on disk.

After the storm (quiescence, or a SIGKILL and a restart) every session must agree with itself:

* no request failed with a code its method does not document, nor with a code that says the host broke
  (``INTERNAL``, ``CORRUPT_DATA``, ``IO_ERROR``, ``ACTOR_RESTARTED`` ... no faults are injected here);
* every acknowledged append is in the transcript, or in an archived branch (the revisions file), or a
  rewrite (or the session's delete) acknowledged after the append was sent can have cut it;
* ``session.get`` full lists exactly the transcript file's messages, and every count says as many;
* the index rows equal a rebuild from the transcript; a deleted session left no file and no row;
* search finds every live, not tombstoned message of a session outside the trash, and nothing else;
* ``session.listRevisions`` names exactly the revisions file's branches, with its counts, active exactly
  where the live root's stamp says;
* a keyed retry of any acknowledged write answers the same response (also two copies in flight at once
  on two connections of one clientId, and after a restart).

``PIHOST_SOAK=1`` runs more seeds with more operations each.
"""

from __future__ import annotations

import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from store.revisions import family_of, read_revisions, stamp_of
from tests.hostkit import HostProcess, msg, start_host_process
from tests.revisions.helpers import (
    assert_index_matches_file,
    file_message_ids,
    query,
    revisions_path,
    transcript_path,
)

SOAK = os.environ.get("PIHOST_SOAK") == "1"
OPS = 400 if SOAK else 70
CONNS = 5
README = Path(__file__).resolve().parents[2] / "protocol" / "README.md"

# documented on every method, but with no fault injected each one means the host broke
BROKEN = {"INTERNAL", "CORRUPT_DATA", "IO_ERROR", "STORAGE_FULL", "ACTOR_RESTARTED", "TIMEOUT",
          "INVALID_PARAMS", "INVALID_ID", "PAYLOAD_TOO_LARGE", "IDEMPOTENCY_CONFLICT", "PERMISSION_DENIED",
          "UNSUPPORTED_FOR_NATIVE_SESSION", "RESOURCE_EXHAUSTED"}
# documented answers to a state the race made, which BROKEN would otherwise refuse
STATE_ANSWERS = {"session.assistantEdit": {"INVALID_PARAMS"}}  # the reply has no user message before it now
REWRITES = {"session.truncateFrom", "session.replaceMessages", "session.activateRevision", "session.delete"}


def documented_errors() -> dict[str, set[str]]:
    """method → the error codes protocol/README.md documents for it."""
    out: dict[str, set[str]] = {}
    method = None
    for line in README.read_text().splitlines():
        head = re.match(r"^### `([a-zA-Z]+\.[a-zA-Z]+)`$", line)
        if head:
            method = head.group(1)
        elif method and line.startswith("**Errors**:"):
            out[method] = set(re.findall(r"`([A-Z_]+)`", line))
            method = None
    return out


ERRORS = documented_errors()


@dataclass
class Op:
    conn: int
    method: str
    params: dict[str, Any]
    start: int
    end: float = math.inf
    """Tick of the answer; inf while (or if never) answered."""
    result: Any = None
    code: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.end != math.inf and self.code is None


@dataclass
class World:
    rng: random.Random
    sessions: list[str]
    tick: int = 0
    ops: list[Op] = field(default_factory=list)
    appended: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """session → (message id, role) of every append sent to it."""
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    """(session, message id) → the unique search token its text holds."""
    families: dict[str, set[tuple[str, int]]] = field(default_factory=dict)
    seen: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """session → (message id, role) of its transcript as a full read last saw it."""
    turns: dict[str, list[str]] = field(default_factory=dict)
    twins: dict[int, HostClient] = field(default_factory=dict)
    """conn → a second connection with the same clientId."""
    twinned: int = 0
    serial: int = 0

    def next(self) -> int:
        self.serial += 1
        return self.serial


async def call(w: World, c: HostClient, conn: int, method: str, params: dict[str, Any],
               keyed: bool = True) -> Op:
    """Send one request (``keyed``: with a fresh submissionId); while ``w.twin`` is set, a keyed write
    also goes out at the same moment, with the same key, on the twin connection of the same clientId:
    both must answer the same (seed 003 §4: same-key requests in flight together run once)."""
    if keyed:
        params = {**params, "submissionId": f"k{conn}-{w.next()}"}
    twin = w.twins.get(conn) if keyed and w.rng.random() < 0.15 else None
    if twin is None:
        return await _send(w, c, conn, method, params)
    ops: list[Op] = []

    async def one(client: HostClient) -> None:
        ops.append(await _send(w, client, conn, method, params))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, c)
        nursery.start_soon(one, twin)
    if all(op.ok for op in ops):
        assert ops[0].result == ops[1].result, (method, params, ops[0].result, ops[1].result)
    w.twinned += 1
    return ops[0]


async def _send(w: World, c: HostClient, conn: int, method: str, params: dict[str, Any]) -> Op:
    w.tick += 1
    op = Op(conn, method, params, w.tick)
    w.ops.append(op)
    try:
        op.result = await c.call(method, params)
    except RpcError as err:
        op.code = err.data_code or f"rpc{err.code}"
        op.error = str(err)
    w.tick += 1
    op.end = w.tick
    if op.ok and method == "session.get" and params.get("full"):
        w.seen[params["sessionId"]] = [(m["id"], m["role"]) for m in op.result["messages"]]
    if op.ok and method == "session.listRevisions":
        w.families.setdefault(params["sessionId"], set()).update(
            (rev["rootUserId"], rev["revisionIndex"]) for rev in op.result["revisions"])
    if op.ok and method == "session.startTurn":
        w.turns.setdefault(params["sessionId"], []).append(op.result.get("turnId") or params["turnId"])
    return op


def pick_id(w: World, sid: str, role: str | None = None) -> str:
    """Mostly a message the session held when last read, else any message ever sent to it."""
    source = w.seen if w.rng.random() < 0.75 and w.seen.get(sid) else w.appended
    pool = [m for m, r in source.get(sid, []) if role is None or r == role]
    return w.rng.choice(pool) if pool else "nope"


async def one_op(w: World, c: HostClient, conn: int) -> None:
    rng = w.rng
    live = w.sessions
    sid = live[0] if rng.random() < 0.6 else rng.choice(live)
    r = rng.random()
    if r < 0.34:
        n = w.next()
        role = rng.choice(["user", "user", "assistant"])
        mid = f"m{conn}x{n}"
        token = f"tk{conn}{n:06d}q"
        w.appended.setdefault(sid, []).append((mid, role))
        w.tokens[(sid, mid)] = token
        await call(w, c, conn, "session.appendMessage",
                   {"sessionId": sid, "message": msg(mid, f"text {token}", role=role)})
        return
    choices = [
        ("session.truncateFrom", 6), ("session.replaceMessages", 3), ("session.activateRevision", 4),
        ("session.saveActiveRevision", 3), ("session.deleteMessage", 4), ("session.restoreMessage", 3),
        ("session.appendCompaction", 2), ("session.saveInflightMessage", 2), ("session.startTurn", 1),
        ("session.endTurn", 1), ("session.fork", 1), ("session.assistantEdit", 1), ("sessions.trash", 1),
        ("sessions.restore", 2), ("session.delete", 0.3),
        ("session.update", 1), ("session.rename", 1), ("session.queuePush", 1), ("search.query", 2),
        ("session.get", 4), ("session.tree", 2), ("session.context", 2), ("session.listRevisions", 4),
    ]
    method = rng.choices([m for m, _ in choices], [wt for _, wt in choices])[0]
    if method == "session.truncateFrom":
        p: dict[str, Any] = {"sessionId": sid, "messageId": pick_id(w, sid)}
        mode = rng.choice([None, "regenerate", "regenerate", "edit"])
        if mode:
            p["mode"] = mode
        await call(w, c, conn, method, p)
    elif method == "session.replaceMessages":
        got = await call(w, c, conn, "session.get", {"sessionId": sid, "full": True}, keyed=False)
        if got.ok:
            kept = got.result["messages"][: rng.randint(0, len(got.result["messages"]))]
            await call(w, c, conn, method, {"sessionId": sid, "messages": [
                {"id": m["id"], "role": m["role"], "blocks": m["blocks"]} for m in kept]})
    elif method == "session.activateRevision":
        await call(w, c, conn, "session.listRevisions", {"sessionId": sid}, keyed=False)
        fam = sorted(w.families.get(sid, ()))
        root, idx = rng.choice(fam) if fam else (pick_id(w, sid, "user"), rng.randint(1, 3))
        await call(w, c, conn, method, {"sessionId": sid, "rootUserId": root, "revisionIndex": idx})
    elif method == "session.saveActiveRevision":
        await call(w, c, conn, method, {"sessionId": sid, "rootUserId": pick_id(w, sid, "user")})
    elif method in ("session.deleteMessage", "session.restoreMessage"):
        await call(w, c, conn, method, {"sessionId": sid, "messageId": pick_id(w, sid)})
    elif method == "session.appendCompaction":
        n = w.next()
        await call(w, c, conn, method, {"sessionId": sid, "compaction": {
            "id": f"c{conn}x{n}", "summary": f"summary {n}", "throughMessageId": pick_id(w, sid),
            "tokensBefore": 100}})
    elif method == "session.saveInflightMessage":
        n = w.next()
        turn = rng.choice(w.turns[sid]) if w.turns.get(sid) else f"t{conn}x{n}"
        await call(w, c, conn, method, {"sessionId": sid, "turnId": turn, "message": msg(
            f"i{conn}x{n}", "streaming", role="assistant", turnId=turn)})
    elif method == "session.startTurn":
        await call(w, c, conn, method, {"sessionId": sid, "turnId": f"t{conn}x{w.next()}"})
    elif method == "session.endTurn":
        if w.turns.get(sid):
            await call(w, c, conn, method, {"sessionId": sid, "turnId": rng.choice(w.turns[sid]),
                                            "status": rng.choice(["completed", "aborted"]),
                                            "createNotification": False})
    elif method in ("session.fork", "session.assistantEdit"):
        if len(live) >= 9:
            return
        if method == "session.fork":
            p = {"sessionId": sid}
            if rng.random() < 0.5:
                p["throughMessageId"] = pick_id(w, sid)
        else:
            p = {"sessionId": sid, "messageId": pick_id(w, sid, "assistant"),
                 "blocks": [{"type": "text", "text": "edited"}]}
        op = await call(w, c, conn, method, p)
        if op.ok:
            child = op.result["id"] if method == "session.fork" else op.result["session"]["id"]
            if child not in live:
                live.append(child)
    elif method in ("sessions.trash", "sessions.restore", "session.delete"):
        await call(w, c, conn, method, {"sessionId": sid if method != "session.delete" else rng.choice(live)})
    elif method == "session.update":
        await call(w, c, conn, method, {"sessionId": sid, "thinkingLevel": rng.choice(["off", "low", "high"])})
    elif method == "session.rename":
        await call(w, c, conn, method, {"sessionId": sid, "title": f"title {w.next()}"})
    elif method == "session.queuePush":
        await call(w, c, conn, method, {"sessionId": sid, "principal": f"p{conn}", "content": "later",
                                        "permissionMode": "inherit", "idempotencyKey": f"q{w.next()}"})
    elif method == "search.query":
        await call(w, c, conn, method, {"query": "text tk", "sessionId": sid}, keyed=False)
    elif method == "session.get":
        p = {"sessionId": sid}
        shape = rng.random()
        if shape < 0.3:
            p["full"] = True
        elif shape < 0.6:
            p["messageLimit"] = rng.randint(1, 8)
        elif shape < 0.8:
            p["messageAround"] = pick_id(w, sid)
        else:
            p["messageEnd"] = rng.randint(0, 10)
            p["messageLimit"] = rng.randint(1, 5)
        await call(w, c, conn, method, p, keyed=False)
    else:
        await call(w, c, conn, method, {"sessionId": sid}, keyed=False)


async def worker(w: World, host: HostProcess, conn: int, n_ops: int, stop: trio.Event) -> None:
    try:
        async with open_client(host.url, host.token, client_id=f"race-{conn}", client_kind="ui") as c, \
                open_client(host.url, host.token, client_id=f"race-{conn}", client_kind="ui") as twin:
            w.twins[conn] = twin
            for _ in range(n_ops):
                if stop.is_set():
                    return
                await one_op(w, c, conn)
    except* (ClientClosed, OSError):  # the SIGKILL of the host; a twin's pair closes in a group
        if not stop.is_set():
            raise
    finally:
        w.twins.pop(conn, None)


async def seed_sessions(host: HostProcess, w: World) -> None:
    async with open_client(host.url, host.token, client_id="setup", client_kind="ui") as c:
        for sid in w.sessions:
            await c.call("session.create", {"sessionId": sid, "title": sid})
            for i in range(3):
                for role in ("user", "assistant"):
                    mid = f"{sid}-{role[0]}{i}"
                    token = f"tk9{w.next():06d}q"
                    await c.call("session.appendMessage",
                                 {"sessionId": sid, "message": msg(mid, f"text {token}", role=role)})
                    w.appended.setdefault(sid, []).append((mid, role))
                    w.tokens[(sid, mid)] = token


def check_codes(w: World) -> None:
    bad = [(op.method, op.code, op.error, op.params) for op in w.ops if op.code is not None and (
        (op.code in BROKEN and op.code not in STATE_ANSWERS.get(op.method, set()))
        or op.code not in ERRORS.get(op.method, set()))]
    assert not bad, f"unexpected error codes: {bad[:5]}"


def revision_message_ids(root: Path, sid: str) -> set[str]:
    return {m["id"] for e in read_revisions(revisions_path(root, sid)).entries.values() for m in e.messages}


def check_appends(w: World, root: Path) -> None:
    """Every acknowledged append is in the transcript or an archived branch, or a later rewrite cut it."""
    lost = []
    for a in w.ops:
        if a.method != "session.appendMessage" or not a.ok:
            continue
        sid = a.params["sessionId"]
        mid = a.result["message"]["id"]
        if transcript_path(root, sid).exists():
            if mid in file_message_ids(root, sid) or mid in revision_message_ids(root, sid):
                continue
        cutters = [r for r in w.ops if r.method in REWRITES and r.params["sessionId"] == sid
                   and r.code is None and r.end > a.start]
        if not cutters:
            lost.append((sid, mid, a.start, a.end))
    assert not lost, f"acknowledged appends silently gone: {lost[:5]}"


async def check_live(w: World, host: HostProcess, root: Path) -> None:
    """session.get full == file; search finds the live messages; listRevisions == revisions file."""
    async with open_client(host.url, host.token, client_id="checker", client_kind="ui") as c:
        for sid in list(w.sessions):
            if not transcript_path(root, sid).exists():
                with pytest.raises(RpcError) as err:
                    await c.call("session.get", {"sessionId": sid, "full": True})
                assert err.value.data_code == "SESSION_NOT_FOUND"
                continue
            trashed = (await c.call("session.get", {"sessionId": sid}))["session"].get("deletedAt")
            if trashed:
                await c.call("sessions.restore", {"sessionId": sid})
            got = await c.call("session.get", {"sessionId": sid, "full": True})
            in_file = file_message_ids(root, sid)
            assert [m["id"] for m in got["messages"]] == in_file, sid
            assert got["totalMessages"] == got["session"]["messageCount"] == len(in_file), sid
            listed_in = {s["id"]: s for s in (await c.call("session.list", {"limit": 500}))["sessions"]}
            assert listed_in[sid]["messageCount"] == len(in_file), sid
            await c.call("session.tree", {"sessionId": sid})
            await c.call("session.context", {"sessionId": sid})
            for m in got["messages"]:
                token = w.tokens.get((sid, m["id"]))
                if token is None or m.get("deleted"):
                    continue
                found = await c.call("search.query", {"query": token})
                assert (sid, m["id"]) in {(h["sessionId"], h["messageId"]) for h in found["results"]}, (
                    sid, m["id"], token)
            listed = await c.call("session.listRevisions", {"sessionId": sid})
            stored = read_revisions(revisions_path(root, sid)).entries
            assert {(r["rootUserId"], r["revisionIndex"]) for r in listed["revisions"]} == set(stored), sid
            stamps = {family_of(m): stamp_of(m).active for m in got["messages"] if m["role"] == "user"}
            for r in listed["revisions"]:
                entry = stored[(r["rootUserId"], r["revisionIndex"])]
                if not entry.live:
                    assert r["messageCount"] == len(entry.messages), ("count", sid, r)
                else:  # a reference names the live branch: its root is there, stamped with its index
                    assert stamps.get(r["rootUserId"]) == r["revisionIndex"], ("stranded ref", sid, r, stamps)
                assert r["isActive"] == (stamps.get(r["rootUserId"]) == r["revisionIndex"]), (
                    "isActive", sid, r, stamps, entry.live)
    await check_search_stale(w, host, root)


async def check_search_stale(w: World, host: HostProcess, root: Path) -> None:
    """Search never finds a message no live transcript holds any more (a stale full-text row)."""
    held: dict[str, set[str]] = {}

    def holds(sid: str, mid: str) -> bool:
        if sid not in held:  # a child of a fork answered or not (one in flight at a SIGKILL)
            held[sid] = set(file_message_ids(root, sid)) if transcript_path(root, sid).exists() else set()
        return mid in held[sid]

    async with open_client(host.url, host.token, client_id="checker", client_kind="ui") as c:
        for (sid, mid), token in sorted(w.tokens.items()):
            if holds(sid, mid):
                continue
            found = await c.call("search.query", {"query": token})
            for hit in found["results"]:
                # a fork or an Assistant Edit copies the message under another id into its child
                assert holds(hit["sessionId"], hit["messageId"]), (sid, mid, token, hit)


async def check_retries(w: World, host: HostProcess, limit: int) -> None:
    """A keyed retry of an acknowledged write answers what the write answered."""
    done = [op for op in w.ops if op.ok and "submissionId" in op.params]
    sample = w.rng.sample(done, min(limit, len(done)))
    by_conn: dict[int, list[Op]] = {}
    for op in sample:
        by_conn.setdefault(op.conn, []).append(op)
    for conn, ops in by_conn.items():
        async with open_client(host.url, host.token, client_id=f"race-{conn}", client_kind="ui") as c:
            for op in ops:
                again = await c.call(op.method, op.params)
                assert again == op.result, (op.method, op.params, op.result, again)


def check_index(w: World, root: Path) -> None:
    """Index rows == a rebuild from each transcript; a deleted session left no file and no row."""
    # a delete in flight at a SIGKILL may have taken effect unanswered
    deleted = {op.params["sessionId"] for op in w.ops if op.method == "session.delete" and op.code is None}
    acked = {op.params["sessionId"] for op in w.ops if op.method == "session.delete" and op.ok}
    for sid in w.sessions:
        if transcript_path(root, sid).exists():
            assert sid not in acked, f"deleted session {sid} came back"
            assert_index_matches_file(root, sid)
        else:
            assert sid in deleted, (f"session {sid} lost its transcript without a delete", [
                (op.method, op.start, op.end, op.code, op.result) for op in w.ops
                if sid in (op.params.get("sessionId"), (op.result or {}).get("id"))][-8:])
            assert query(root, "SELECT COUNT(*) FROM messages WHERE session_id = ?", sid) == [(0,)]
            assert query(root, "SELECT COUNT(*) FROM sessions WHERE id = ?", sid) == [(0,)]


async def storm(w: World, host: HostProcess, n_ops: int, kill_after: float | None) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for conn in range(CONNS):
            nursery.start_soon(worker, w, host, conn, n_ops, stop)
        if kill_after is not None:
            await trio.sleep(kill_after)
            stop.set()
            host.kill9()


SEEDS = list(range(12)) if SOAK else [1, 2]


@pytest.mark.parametrize("seed", SEEDS)
async def test_races_then_quiescence(tmp_path: Path, seed: int) -> None:
    w = World(random.Random(seed), ["hot", "warm", "cool"])
    host = start_host_process(tmp_path)
    try:
        with trio.fail_after(120 if SOAK else 50):
            await seed_sessions(host, w)
            await storm(w, host, OPS, None)
            assert w.twinned > 0
            check_codes(w)
            check_appends(w, tmp_path)
            await check_live(w, host, tmp_path)
            await check_retries(w, host, 100_000)
    finally:
        assert host.terminate() == 0
    check_index(w, tmp_path)
    host = start_host_process(tmp_path)  # every keyed answer survives a restart
    try:
        with trio.fail_after(60):
            await check_retries(w, host, 40)
            await check_live(w, host, tmp_path)
    finally:
        assert host.terminate() == 0
    check_index(w, tmp_path)


@pytest.mark.parametrize("seed", SEEDS)
async def test_races_then_sigkill(tmp_path: Path, seed: int) -> None:
    w = World(random.Random(100 + seed), ["hot", "warm", "cool"])
    host = start_host_process(tmp_path)
    try:
        with trio.fail_after(60):
            await seed_sessions(host, w)
            await storm(w, host, 10 * OPS, 1.5 + random.Random(seed).random() * 2)
    finally:
        host.kill9()
    check_codes(w)
    host = start_host_process(tmp_path)
    try:
        with trio.fail_after(60):
            check_appends(w, tmp_path)
            await check_live(w, host, tmp_path)
            await check_retries(w, host, 60)
    finally:
        assert host.terminate() == 0
    check_index(w, tmp_path)
