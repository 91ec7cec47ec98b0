"""ARCHITECTURE.md ("Durability", "From seed 000", "Read barriers", "Request pipeline", "Receipts ride with
their effect", "Shutdown", "Gateway and protocol") and RELIABILITY.md read by an outsider: black-box checks
against real ``pi-host serve`` processes over the documented wire protocol (protocol/README.md), with
SIGTERM, a second signal and SIGKILL + restart where the documents make a process-level claim. Each test
quotes the statement it checks."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.gateway.conftest import connect, raw_upgrade
from tests.hostkit import HostProcess, msg, start_host_process
from tests.httpkit import FakeProvider, Reply


@asynccontextmanager
async def real_host(data_dir: Path, client_id: str = "outsider", kind: str = "ui",
                    ) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    """A ``pi-host serve`` process on ``data_dir`` and a client of it; killed on exit unless stopped."""
    proc = start_host_process(data_dir)
    try:
        async with open_client(proc.url, proc.token, client_id=client_id, client_kind=kind) as c:
            yield proc, c
    finally:
        proc.kill9()


def _port(proc: HostProcess) -> int:
    return int(proc.url.rsplit(":", 1)[1].strip("/"))


async def _http_get(port: int, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP/1.1 GET; status, headers (lower-case names) and body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        name = f"127.0.0.1:{port}" if host is None else host
        head = f"GET {path} HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"
        await stream.send_all(head.encode())
        data = b""
        while True:
            chunk = await stream.receive_some(65536)
            if not chunk:
                break
            data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


def _non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (the one a default route would use), if any."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks a source address
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def _code(call: Any) -> RpcError:
    with pytest.raises(RpcError) as failed:
        await call
    return failed.value


# ------------------------------------------------------------------------------------- Gateway and protocol

async def test_first_start_writes_host_json_atomically_and_a_0600_token_kept_across_restarts(tmp_path: Path) -> None:
    """"Listens on 127.0.0.1 by default. `--port 0` picks a free port. When ready, the host writes
    `<dataDir>/host.json` atomically: {"pid", "url", "tokenFile", "startedAt"}" and "a random token in
    `<dataDir>/host.token` (mode 0600, created at first start)". A restart keeps the token (clients keep
    working from the file they read) and rewrites host.json for the new process; no temp file is left."""
    data = tmp_path / "data"
    before = int(time.time() * 1000)
    proc = start_host_process(data)
    try:
        info = json.loads((data / "host.json").read_text())
        assert set(info) >= {"pid", "url", "tokenFile", "startedAt"}, info
        assert info["pid"] == proc.proc.pid
        assert info["url"].startswith("ws://127.0.0.1:") and _port(proc) > 0
        assert Path(info["tokenFile"]) == data / "host.token"
        assert isinstance(info["startedAt"], int) and before - 5_000 <= info["startedAt"] <= time.time() * 1000
        token_file = data / "host.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        raw = token_file.read_text()
        assert raw.endswith("\n") and len(raw.strip()) == 64 and int(raw.strip(), 16) >= 0
        assert not [p.name for p in data.iterdir() if p.name.startswith("host.json") and p.name != "host.json"]
        async with open_client(proc.url, raw.strip(), client_id="first", client_kind="ui") as c:
            assert (await c.call("host.status", {}))["bootId"] == c.hello["bootId"]
        outside = _non_loopback_address()
        if outside is not None:  # loopback only: the port is closed on the machine's other addresses
            with pytest.raises(OSError):
                with trio.fail_after(5):
                    stream = await trio.open_tcp_stream(outside, _port(proc))
                    await stream.aclose()
    finally:
        assert proc.terminate() == 0
    again = start_host_process(data)
    try:
        assert (data / "host.token").read_text() == raw, "a restart made a new token"
        assert stat.S_IMODE((data / "host.token").stat().st_mode) == 0o600
        info2 = json.loads((data / "host.json").read_text())
        assert info2["pid"] == again.proc.pid != info["pid"]
        assert info2["startedAt"] >= info["startedAt"]
        async with open_client(again.url, raw.strip(), client_id="first", client_kind="ui") as c:
            await c.call("host.status", {})
    finally:
        assert again.terminate() == 0


async def test_hello_takes_every_client_kind_the_architecture_names(tmp_path: Path) -> None:
    """"Who is calling: `clientKind` is `ui`, `sidecar`, `cli` or `plugin` (with its `pluginId`)." A client
    built from ARCHITECTURE.md says hello as each of them; the sidecar is the one that runs the model, so
    it is the agent kind protocol/README.md documents (the turn queue is its to control)."""
    data = tmp_path / "data"
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            for kind, plugin_id in (("ui", None), ("sidecar", None), ("cli", None), ("plugin", "acme.tools"),
                                    ("agent", None)):
                async with open_client(proc.url, proc.token, client_id=f"c-{kind}", client_kind=kind,
                                       plugin_id=plugin_id) as c:
                    assert c.hello["clientId"] == f"c-{kind}"
                    ns = f"plugin:{plugin_id}" if plugin_id else "ui"
                    await c.call("settings.set", {"ns": ns, "key": kind, "value": kind})
                    assert (await c.call("settings.get", {"ns": ns, "key": kind}))["value"] == kind
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui, \
                    open_client(proc.url, proc.token, client_id="side", client_kind="sidecar") as side:
                sid = (await ui.call("session.create", {}))["id"]
                await ui.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "next",
                                                    "permissionMode": "ask"})
                await side.call("session.queueAttach", {"sessionId": sid, "controllerId": "side-1"})
                taken = await side.call("session.queueTake", {"sessionId": sid, "controllerId": "side-1"})
                assert taken["entry"]["content"] == "next", taken
                denied = await _code(ui.call("session.queueAttach", {"sessionId": sid, "controllerId": "ui-1"}))
                assert denied.data_code in ("CONFLICT", "PERMISSION_DENIED"), denied  # the ui is not the sidecar
    finally:
        assert proc.terminate() == 0


async def test_plain_http_health_readiness_and_the_host_header(tmp_path: Path) -> None:
    """"The same port serves plain HTTP for `GET /healthz`, `GET /readyz` ... (same origin, so the Origin
    allow-list stays empty by default)"; "a `Host` header that is not a loopback name (DNS rebinding)" is
    refused; no route answers with a CORS header another origin could use."""
    data = tmp_path / "data"
    proc = start_host_process(data)
    try:
        with trio.fail_after(30):
            port = _port(proc)
            status, headers, body = await _http_get(port, "/healthz")
            assert status == 200 and json.loads(body) == {"status": "ok"}
            assert "access-control-allow-origin" not in headers
            status, headers, body = await _http_get(port, "/readyz")
            assert status == 200 and json.loads(body) == {"status": "ready"}
            for name in (f"localhost:{port}", f"[::1]:{port}"):
                assert (await _http_get(port, "/healthz", host=name))[0] == 200, name
            for name in (f"rebind.example:{port}", "evil.example", f"127.0.0.1.nip.io:{port}"):
                assert (await _http_get(port, "/healthz", host=name))[0] == 403, name
    finally:
        assert proc.terminate() == 0


async def test_events_are_notifications_and_only_after_events_subscribe(tmp_path: Path) -> None:
    """"Server-to-client events are JSON-RPC notifications {"method": "event", "params": {"topic": ...}}
    after `events.subscribe`": a raw connection sees no event before it subscribes, then an object with no
    `id`, method `event` and a `topic` for another connection's write."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, c):
        with trio.fail_after(30):
            async with connect(proc.url) as ws:
                hello = {"jsonrpc": "2.0", "id": 1, "method": "host.hello",
                         "params": {"token": proc.token, "clientId": "raw", "clientKind": "ui", "protocol": 1}}
                await ws.send_message(json.dumps(hello))
                assert "result" in orjson.loads(await ws.get_message())
                await c.call("session.create", {"title": "before"})
                await ws.send_message(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "host.status"}))
                first = orjson.loads(await ws.get_message())
                assert first.get("id") == 2, f"an event before events.subscribe: {first}"
                await ws.send_message(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "events.subscribe",
                                                  "params": {"topics": ["session.created"]}}))
                subscribed = orjson.loads(await ws.get_message())
                assert subscribed.get("id") == 3 and "result" in subscribed, subscribed
                await c.call("session.create", {"title": "after"})
                event = orjson.loads(await ws.get_message())
                assert "id" not in event and event["jsonrpc"] == "2.0" and event["method"] == "event", event
                assert event["params"]["topic"] == "session.created", event


async def test_a_plugin_connection_is_scoped_to_what_it_owns(tmp_path: Path) -> None:
    """"A plugin's reads and writes are scoped to what it owns (its `kv(plugin:<id>)`, its provider rows,
    its imported sessions); everything else is `PERMISSION_DENIED`", with "JSON-RPC `error.code` ... plus
    `error.data.code`, a stable string"."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, ui):
        with trio.fail_after(30):
            sid = (await ui.call("session.create", {"title": "the user's"}))["id"]
            await ui.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "private words")})
            await ui.call("settings.set", {"ns": "ui", "key": "theme", "value": "dark"})
            async with open_client(proc.url, proc.token, client_id="p", client_kind="plugin",
                                   plugin_id="acme.tools") as p:
                await p.call("settings.set", {"ns": "plugin:acme.tools", "key": "k", "value": 1})
                assert (await p.call("settings.get", {"ns": "plugin:acme.tools", "key": "k"}))["value"] == 1
                listed = await p.call("session.list", {})
                assert sid not in [s["id"] for s in listed["sessions"]]
                for method, params in (
                        ("session.get", {"sessionId": sid}),
                        ("session.appendMessage", {"sessionId": sid, "message": msg("p1", "plugin words")}),
                        ("settings.get", {"ns": "ui", "key": "theme"}),
                        ("settings.set", {"ns": "plugin:other", "key": "k", "value": 2}),
                        ("search.query", {"query": "private"}),
                        ("session.delete", {"sessionId": sid})):
                    failed = await _code(p.call(method, params))
                    assert failed.data_code == "PERMISSION_DENIED", (method, failed)
                    assert -32099 <= failed.code <= -32000, (method, failed.code)
            assert [m["id"] for m in (await ui.call("session.get", {"sessionId": sid}))["messages"]] == ["u1"]


# ------------------------------------------------------------------------------------------ Request pipeline

async def test_one_connection_s_requests_take_effect_in_order_across_route_kinds(tmp_path: Path) -> None:
    """Request pipeline, 2: "a connection's request takes effect after every earlier mutating request of
    that connection, whatever its target (session actor, DB writer, read pool, host services): a read sees
    the writes sent before it, two writes apply in frame order." One batch frame and the same calls as
    back-to-back frames, on a real process."""
    data = tmp_path / "data"
    async with real_host(data) as (_proc, c):
        with trio.fail_after(60):
            for send in (c.batch, c.pipelined):
                tag = send.__name__
                sid = f"ord-{tag}"
                calls: list[tuple[str, Any]] = [
                    ("session.create", {"sessionId": sid, "title": "old"}),
                    ("session.appendMessage", {"sessionId": sid, "message": msg(f"{tag}-1", f"zebracorn {tag}")}),
                    ("search.query", {"query": f"zebracorn {tag}"}),
                    ("session.list", {}),
                    ("session.rename", {"sessionId": sid, "title": f"new {tag}"}),
                    ("session.list", {}),
                    ("settings.set", {"ns": "ui", "key": tag, "value": 1}),
                    ("settings.set", {"ns": "ui", "key": tag, "value": 2}),
                    ("settings.get", {"ns": "ui", "key": tag}),
                ]
                r = await send(calls)
                assert not isinstance(r[1], RpcError), r[1]
                assert [(h["sessionId"], h["messageId"]) for h in r[2]["results"]] == [(sid, f"{tag}-1")], r[2]
                row = [s for s in r[3]["sessions"] if s["id"] == sid]
                # a read does not hold back the writes sent after it, so it may or may not see the rename
                # (protocol/README.md, Ordering: "it may or may not see them"); it sees every earlier one
                assert row and row[0]["messageCount"] == 1 and row[0]["title"] in ("old", f"new {tag}"), row
                assert [s["title"] for s in r[5]["sessions"] if s["id"] == sid] == [f"new {tag}"]
                assert r[8]["value"] == 2, r[8]
                # the delete in a second group: a list above may not be overtaken by it (the same reason)
                r = await send([
                    ("session.delete", {"sessionId": sid}),
                    ("session.appendMessage", {"sessionId": sid, "message": msg(f"{tag}-2", "late")}),
                    ("session.get", {"sessionId": sid}),
                ])
                assert not isinstance(r[0], RpcError), r[0]
                assert isinstance(r[1], RpcError) and r[1].data_code == "SESSION_NOT_FOUND", r[1]
                assert isinstance(r[2], RpcError) and r[2].data_code == "SESSION_NOT_FOUND", r[2]


async def test_concurrent_duplicates_run_once_and_each_gets_the_first_answer(tmp_path: Path) -> None:
    """Request pipeline, 3: "claim (clientId, submissionId) before the effect (a concurrent duplicate waits
    for the first and gets its response), replay a completed one"; "the same key with a different
    fingerprint fails with IDEMPOTENCY_CONFLICT". Duplicates in one batch and on two connections of one
    clientId at once, for a file effect (create, append) and a DB-only one (settings.set)."""
    data = tmp_path / "data"
    async with real_host(data, client_id="dup") as (proc, c):
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="dup", client_kind="ui") as c2:
                create = ("session.create", {"title": "once", "submissionId": "k-create"})
                answers: list[Any] = []

                async def one(client: HostClient) -> None:
                    answers.extend(await client.batch([create, create]))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(one, c)
                    nursery.start_soon(one, c2)
                assert all(not isinstance(a, RpcError) for a in answers), answers
                assert all(a == answers[0] for a in answers), answers
                sid = answers[0]["id"]
                listed = (await c.call("session.list", {}))["sessions"]
                assert [s["id"] for s in listed if s["title"] == "once"] == [sid]

                append = ("session.appendMessage", {"sessionId": sid, "message": msg("m1", "one effect"),
                                                    "submissionId": "k-append"})
                setting = ("settings.set", {"ns": "ui", "key": "n", "value": 7, "submissionId": "k-set"})
                got: list[Any] = []

                async def two(client: HostClient) -> None:
                    got.extend(await client.batch([append, setting, append, setting]))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(two, c)
                    nursery.start_soon(two, c2)
                appends = got[0::2]
                sets = got[1::2]
                assert all(a == appends[0] for a in appends) and not isinstance(appends[0], RpcError), appends
                assert all(s == sets[0] for s in sets) and not isinstance(sets[0], RpcError), sets
                view = await c.call("session.get", {"sessionId": sid})
                assert [m["id"] for m in view["messages"]] == ["m1"]
                lines = (data / "sessions" / f"{sid}.jsonl").read_text().splitlines()
                assert sum('"m1"' in line for line in lines) == 1, lines
                other = ("session.appendMessage", {"sessionId": sid, "message": msg("m2", "another"),
                                                   "submissionId": "k-append"})
                conflict = await _code(c2.call(*other))
                assert conflict.data_code == "IDEMPOTENCY_CONFLICT" and conflict.code < -32000 + 1, conflict
                assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == ["m1"]


# -------------------------------------------------------------------- Receipts ride with their effect (SIGKILL)

@pytest.mark.parametrize(("point", "method", "params"), [
    ("append.after_fsync", "session.appendMessage",
     {"sessionId": "base", "message": msg("m3", "killed after fsync"), "submissionId": "k-app"}),
    ("index.before_commit", "session.appendMessage",
     {"sessionId": "base", "message": msg("m3", "killed before index"), "submissionId": "k-app2"}),
    ("create.before_index", "session.create", {"title": "made once", "submissionId": "k-create"}),
    ("fork.before_index", "session.fork", {"sessionId": "base", "throughMessageId": "m1", "submissionId": "k-fork"}),
    ("rewrite.before_reindex", "session.truncateFrom",
     {"sessionId": "base", "messageId": "m2", "submissionId": "k-trunc"}),
    ("session_delete.after_log", "session.delete", {"sessionId": "base", "submissionId": "k-del"}),
])
async def test_a_retry_after_a_sigkill_mid_effect_gets_the_original_answer_and_one_effect(
        tmp_path: Path, point: str, method: str, params: dict[str, Any]) -> None:
    """"If the effect is a file (append, create, fork, rewrite, delete marker ...), the receipt travels in
    that file ... and boot rebuilds the receipt row from it. A retry after a SIGKILL at any point then gets
    the original response and the effect happens once." Kill at the fault point, restart, retry with the
    same clientId + submissionId twice, restart again and retry once more: always the same answer, and the
    session list / transcript show the effect once."""
    data = tmp_path / "data"
    async with real_host(data, client_id="rk") as (proc, c):
        await c.call("session.create", {"sessionId": "base", "title": "base"})
        for mid in ("m1", "m2"):
            await c.call("session.appendMessage", {"sessionId": "base", "message": msg(mid, f"text {mid}")})
        proc.kill9()
    with trio.fail_after(90):
        first = await _answer_then_killed_at(data, point, method, params, client_id="rk")
        if point != "index.before_commit":  # every other point is before the acknowledgement
            assert first is None, f"the host answered before dying at {point}"
        answers = [] if first is None else [first]
        for _ in range(2):
            async with real_host(data, client_id="rk") as (proc, c):
                answers.append(await c.call(method, params))
                answers.append(await c.call(method, params))
                sessions = (await c.call("session.list", {}))["sessions"]
                base = [m["id"] for m in (await c.call("session.get", {"sessionId": "base"}))["messages"]] \
                    if method != "session.delete" else None
                if method != "session.delete":
                    hits = (await c.call("search.query", {"query": "text m1"}))["results"]
                proc.kill9()
        assert all(a == answers[0] for a in answers), answers
        ids = [s["id"] for s in sessions]
        if method == "session.appendMessage":
            assert base == ["m1", "m2", "m3"]
            assert sum('"m3"' in line for line in (data / "sessions" / "base.jsonl").read_text().splitlines()) == 1
        elif method == "session.create":
            assert [s["id"] for s in sessions if s["title"] == "made once"] == [answers[0]["id"]]
        elif method == "session.fork":
            assert len(ids) == 2 and answers[0]["id"] in ids and answers[0]["messageCount"] == 1, sessions
        elif method == "session.truncateFrom":
            assert base == ["m1"] and answers[0]["removed"] == 1
        else:
            assert ids == [] and answers[0] == {"sessionId": "base", "deleted": True}
        if method != "session.delete":
            assert {(h["sessionId"], h["messageId"]) for h in hits} >= {("base", "m1")}


async def _answer_then_killed_at(data_dir: Path, point: str, method: str, params: dict[str, Any], *,
                                 client_id: str) -> Any:
    """Call ``method`` on a host armed to SIGKILL itself at the first hit of ``point``; the answer if the
    host gave one before it died there (an append is acknowledged before its index rows commit), else
    ``None``. The host must have died of the SIGKILL either way."""
    crashing = start_host_process(data_dir, env={"RT_CRASHPOINT": f"{point}:1"})
    answered: Any = None
    try:
        with trio.fail_after(60):
            try:
                async with open_client(crashing.url, crashing.token, client_id=client_id,
                                       client_kind="ui") as c:
                    answered = await c.call(method, params)
                    await trio.to_thread.run_sync(crashing.reap)
            except (ClientClosed, OSError):
                await trio.to_thread.run_sync(crashing.reap)
    finally:
        crashing.kill9()
    assert crashing.proc.returncode == -9, f"the host did not die at {point}"
    return answered


# ------------------------------------------------------------------------------------------ Read barriers

async def test_another_connection_reads_an_acknowledged_append_at_once(tmp_path: Path) -> None:
    """Read barriers: "a read that needs the index (... `session.list`, `search.*`, anything counting
    messages) first waits until the published sequence covers every append acknowledged before the read
    arrived"; `host.status` reports the lag. A writer appends a burst; after each acknowledgement a second
    connection finds the message by search and counts it in session.list."""
    data = tmp_path / "data"
    async with real_host(data, client_id="writer") as (proc, w):
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="reader", client_kind="ui") as r:
                sid = (await w.call("session.create", {}))["id"]
                for i in range(25):
                    await w.call("session.appendMessage",
                                 {"sessionId": sid, "message": msg(f"m{i}", f"quokka{i:03d}xyz " + "pad " * 200)})
                    hits, listed = await r.batch([("search.query", {"query": f"quokka{i:03d}xyz"}),
                                                  ("session.list", {})])
                    assert [h["messageId"] for h in hits["results"]] == [f"m{i}"], (i, hits)
                    assert [s["messageCount"] for s in listed["sessions"] if s["id"] == sid] == [i + 1]
                index = (await r.call("host.status", {})).get("index")
                assert index is not None and {"lagOps", "lagBytes"} <= set(index), index


# ------------------------------------------------------------------------------------------------- Durability

async def test_a_torn_tail_with_nul_bytes_is_cut_before_the_next_append(tmp_path: Path) -> None:
    """Durability: "Before the first append after open, a torn tail (a partial line, or a run of NUL bytes
    after a power cut) is moved aside into a quarantine file and the transcript truncated to its last
    complete line — the next append must never land on garbage"; "Readers skip a torn trailing line".
    SIGKILL, dirty the tail by hand, restart: the read shows the acknowledged messages, the next append
    lands on a line of its own, and every line of the file parses."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, c):
        sid = (await c.call("session.create", {}))["id"]
        for i in range(3):
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"kept {i}")})
        proc.kill9()
    path = data / "sessions" / f"{sid}.jsonl"
    for tail in (b'{"type":"message","id":"half', b"\x00" * 18):
        with path.open("ab") as f:
            f.write(tail)
        async with real_host(data) as (proc, c):
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]][:3] == \
                ["m0", "m1", "m2"]
            n = len((await c.call("session.get", {"sessionId": sid}))["messages"])
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"after{n}", "clean line")})
            ids = [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]]
            assert ids == ["m0", "m1", "m2", *[f"after{k}" for k in range(3, n + 1)]], ids
            hits = (await c.call("search.query", {"query": "clean line"}))["results"]
            assert {h["messageId"] for h in hits} == {f"after{k}" for k in range(3, n + 1)}
            proc.kill9()
        raw = path.read_bytes()
        assert b"\x00" not in raw and raw.endswith(b"\n")
        for line in raw.splitlines():
            json.loads(line)
    leftovers = [p.name for p in data.rglob("*") if "quarantine" in p.name.lower() or ".torn" in p.name]
    assert leftovers, "the torn tails were not moved aside"


async def test_boot_removes_stray_temp_files_and_keeps_everything_else(tmp_path: Path) -> None:
    """Durability: "Rewrites: sibling temp file ... Boot removes stray temp files" (temp files are named
    `<name>.tmp.<hex>`, RELIABILITY §2 rule 4)."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, c):
        sid = (await c.call("session.create", {}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m0", "kept")})
        proc.kill9()
    sessions = data / "sessions"
    stray = sessions / f"{sid}.jsonl.tmp.0a1b2c3d4e5f"
    stray.write_text('{"type":"session"}\n')
    async with real_host(data) as (proc, c):
        assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == ["m0"]
        assert not stray.exists(), "boot left a stray temp file"
        # (from a thread: this trio loop's client answers the host's closing handshake; blocked in
        # terminate() it could not, and the host waited out its 5 s close timeout)
        assert await trio.to_thread.run_sync(proc.terminate) == 0


# --------------------------------------------------------------------------------------------------- Shutdown

@asynccontextmanager
async def _stuck_refresh(data: Path, delay: float) -> AsyncIterator[tuple[HostProcess, HostClient, FakeProvider,
                                                                              dict[str, Any], trio.Event]]:
    """A host with a provider whose `/models` answers after ``delay`` seconds (or when released), and a
    `models.refresh` of it in flight: the in-flight request an outsider can hold open."""
    server = FakeProvider(Reply(models=[{"id": "m-a"}], delay=delay), lifetime=120)
    proc = start_host_process(data)
    outcome: dict[str, Any] = {}
    done = trio.Event()
    try:
        async with open_client(proc.url, proc.token, client_id="slow", client_kind="ui") as c, \
                trio.open_nursery() as nursery:
            await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": server.base_url})

            async def refresh() -> None:
                try:
                    outcome["result"] = await c.call("models.refresh", {"providerId": "local", "timeoutMs": 120000,
                                                                         "submissionId": "r-1"})
                except (RpcError, ClientClosed) as exc:
                    outcome["error"] = exc
                done.set()

            nursery.start_soon(refresh)
            with trio.fail_after(30):
                while not server.requests:  # noqa: ASYNC110 - another process's progress, polled
                    await trio.sleep(0.02)
            yield proc, c, server, outcome, done
    finally:
        server.close()
        proc.kill9()


async def test_sigterm_refuses_new_work_lets_the_in_flight_request_finish_and_leaves_a_clean_marker(
        tmp_path: Path) -> None:
    """Shutdown: "First signal: the gateway stops accepting; new requests get `SHUTTING_DOWN`; in-flight
    requests finish within a deadline; ... the clean-shutdown marker is written." A refresh held open by a
    slow provider gets its real answer after SIGTERM; a new request on an open connection is SHUTTING_DOWN
    (retriable); a new connection and /readyz are refused; the next boot reports a clean shutdown."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with _stuck_refresh(data, delay=60) as (proc, c, server, outcome, done), \
                open_client(proc.url, proc.token, client_id="other", client_kind="ui") as other:
            os.kill(proc.proc.pid, signal.SIGTERM)
            while True:  # the signal is handled asynchronously: poll until the host says it is stopping
                try:
                    await other.call("settings.get", {"ns": "ui", "key": "x"})
                except RpcError as refused:
                    assert refused.data_code == "SHUTTING_DOWN" and refused.retriable, refused
                    break
                await trio.sleep(0.02)
            refused_again = await _code(c.call("session.create", {"submissionId": "late"}))
            assert refused_again.data_code == "SHUTTING_DOWN"
            assert (await _http_get(_port(proc), "/readyz"))[0] == 503
            with pytest.raises((OSError, ClientClosed, Exception)):
                async with open_client(proc.url, proc.token, client_id="new", client_kind="ui") as late:
                    await late.call("host.status", {})
            assert not done.is_set(), f"the in-flight request was cut off: {outcome}"
            server._release.set()  # the provider answers now
            await done.wait()
            assert "result" in outcome, outcome
            assert outcome["result"]["listed"] == 1
            code = await trio.to_thread.run_sync(proc.reap, 30)
            assert code == 0
    assert (data / "clean-shutdown").exists()
    async with real_host(data, client_id="slow") as (proc, c):
        boot = (await c.call("host.status", {}))["boot"]
        assert boot["cleanShutdown"] is True
        models = await c.call("models.list", {"providerId": "local"})
        assert "m-a" in json.dumps(models)
        again = await c.call("models.refresh", {"providerId": "local", "timeoutMs": 120000, "submissionId": "r-1"})
        assert again == outcome["result"], "the refresh answered before SIGTERM has no receipt"
        created = await c.call("session.create", {"submissionId": "late"})  # SHUTTING_DOWN stored nothing
        assert created["id"]


async def test_a_second_signal_cuts_the_in_flight_wait_short(tmp_path: Path) -> None:
    """Shutdown: "in-flight requests finish within a deadline ... A second signal cuts the wait short."
    A refresh whose provider never answers: after SIGTERM the host waits for it; a second SIGTERM makes it
    exit at once (well within the deadline), and the next boot starts normally."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with _stuck_refresh(data, delay=100) as (proc, c, _server, outcome, done):
            async with open_client(proc.url, proc.token, client_id="probe", client_kind="ui") as probe:
                os.kill(proc.proc.pid, signal.SIGTERM)
                while True:  # (not on the refresh's connection: its requests wait behind the refresh)
                    try:
                        await probe.call("host.status", {})
                    except RpcError as refused:
                        assert refused.data_code == "SHUTTING_DOWN", refused
                        break
                    await trio.sleep(0.02)
            await trio.sleep(1.0)
            assert proc.proc.poll() is None and not done.is_set(), "the host did not wait for the request in flight"
            started = time.monotonic()
            os.kill(proc.proc.pid, signal.SIGTERM)
            await trio.to_thread.run_sync(proc.reap, 30)
            took = time.monotonic() - started
            assert took < 5.0, f"the second signal did not cut the wait short ({took:.1f} s)"
            with trio.fail_after(5):
                await done.wait()
            assert "result" not in outcome, outcome
    async with real_host(data) as (proc, c):
        assert (await c.call("host.status", {}))["bootId"] == c.hello["bootId"]
        # (from a thread: this trio loop's client answers the host's closing handshake; blocked in
        # terminate() it could not, and the host waited out its 5 s close timeout)
        assert await trio.to_thread.run_sync(proc.terminate) == 0


# ------------------------------------------------------------------------------------- more of the same

async def test_a_first_frame_that_is_a_batch_without_hello_is_unauthenticated_and_closed(tmp_path: Path) -> None:
    """"The first request on a connection must be `host.hello` ...; anything else first gets
    `UNAUTHENTICATED` and the connection closes" — also when that first frame is a batch (JSON-RPC allows
    one "object (or batch array) per text frame"): nothing of it runs."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, c):
        with trio.fail_after(30):
            async with connect(proc.url) as ws:
                batch = [{"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {"sessionId": "sneak"}},
                         {"jsonrpc": "2.0", "id": 2, "method": "host.hello",
                          "params": {"token": proc.token, "clientId": "raw", "clientKind": "ui", "protocol": 1}}]
                await ws.send_message(json.dumps(batch))
                answer = orjson.loads(await ws.get_message())
                errors = answer if isinstance(answer, list) else [answer]
                assert any(e.get("error", {}).get("data", {}).get("code") == "UNAUTHENTICATED" for e in errors), answer
                assert not any("result" in e and e.get("id") == 1 for e in errors), answer
                with pytest.raises(Exception):  # noqa: B017 - the connection is closed, however the library says it
                    for _ in range(3):
                        await ws.get_message()
            failed = await _code(c.call("session.get", {"sessionId": "sneak"}))
            assert failed.data_code == "SESSION_NOT_FOUND"


async def test_the_host_header_must_be_a_loopback_name_with_the_host_s_own_port(tmp_path: Path) -> None:
    """"The handshake refuses ... a `Host` header that is not a loopback name (DNS rebinding)"; the
    protocol page: "a `Host` header that is not a loopback name with its port"; RELIABILITY §5: "Host must
    be one of `127.0.0.1:PORT`, `localhost:PORT` or `[::1]:PORT`" (CVE-2021-22884 bypassed an allow-list
    via `localhost6`)."""
    data = tmp_path / "data"
    proc = start_host_process(data)
    try:
        with trio.fail_after(30):
            port = _port(proc)
            for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
                assert (await _http_get(port, "/healthz", host=name))[0] == 200, name
            for name in (f"localhost6:{port}", f"127.0.0.1:{port + 1 if port < 65535 else 1}", f"127.1:{port}",
                         f"2130706433:{port}", f"localhost.evil.example:{port}", f"[::ffff:7f00:1]x:{port}", ""):
                assert (await _http_get(port, "/healthz", host=name))[0] in (400, 403), name
    finally:
        assert proc.terminate() == 0


async def test_same_key_for_two_sessions_at_once_runs_one_and_conflicts_the_other(tmp_path: Path) -> None:
    """From seed 000 / Request pipeline: "Two requests with the same key that arrive at the same time — on
    one connection or two, for one session or two — run once: the second waits for the first and gets its
    response"; a different request under that key is `IDEMPOTENCY_CONFLICT` and "a completed receipt is
    never overwritten"; "only a success is stored" (a failed try leaves no receipt)."""
    data = tmp_path / "data"
    async with real_host(data, client_id="same") as (proc, c):
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="same", client_kind="ui") as c2:
                for sid in ("a", "b"):
                    await c.call("session.create", {"sessionId": sid})
                for round_ in range(5):
                    key = f"k{round_}"
                    got: dict[str, Any] = {}

                    async def append(client: HostClient, sid: str, key: str = key, got: dict[str, Any] = got) -> None:
                        try:
                            got[sid] = await client.call("session.appendMessage", {
                                "sessionId": sid, "message": msg(f"{sid}-{key}", f"to {sid}"), "submissionId": key})
                        except RpcError as exc:
                            got[sid] = exc

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(append, c, "a")
                        nursery.start_soon(append, c2, "b")
                    ok = [sid for sid, r in got.items() if not isinstance(r, RpcError)]
                    conflicts = [r.data_code for r in got.values() if isinstance(r, RpcError)]
                    assert len(ok) == 1 and conflicts == ["IDEMPOTENCY_CONFLICT"], got
                    winner = ok[0]
                    replay = await c2.call("session.appendMessage", {
                        "sessionId": winner, "message": msg(f"{winner}-{key}", f"to {winner}"), "submissionId": key})
                    assert replay == got[winner]
                a = [m["id"] for m in (await c.call("session.get", {"sessionId": "a"}))["messages"]]
                b = [m["id"] for m in (await c.call("session.get", {"sessionId": "b"}))["messages"]]
                assert len(a) + len(b) == 5, (a, b)
                late = {"sessionId": "later", "message": msg("l1", "first try fails"), "submissionId": "k-fail"}
                assert (await _code(c.call("session.appendMessage", late))).data_code == "SESSION_NOT_FOUND"
                await c.call("session.create", {"sessionId": "later"})
                assert (await c.call("session.appendMessage", late))["message"]["id"] == "l1"


async def test_a_single_signal_waits_for_a_stuck_request_only_up_to_the_deadline(tmp_path: Path) -> None:
    """Shutdown: "in-flight requests finish within a deadline" (protocol/README: "for up to 10 seconds;
    then the connections close with code 1001"). A refresh whose provider never answers does not keep the
    host alive: it exits 0 soon after the deadline, the marker is written, host.json is gone, and the next
    boot reports a clean shutdown."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with _stuck_refresh(data, delay=100) as (proc, _c, _server, outcome, done):
            started = time.monotonic()
            os.kill(proc.proc.pid, signal.SIGTERM)
            code = await trio.to_thread.run_sync(proc.reap, 40)
            took = time.monotonic() - started
            assert code == 0
            assert 8.0 <= took <= 25.0, f"the host exited {took:.1f} s after SIGTERM"
            with trio.fail_after(5):
                await done.wait()
            assert isinstance(outcome.get("error"), (ClientClosed, RpcError)), outcome
            if isinstance(outcome["error"], ClientClosed):
                assert outcome["error"].code == 1001, outcome
    assert not (data / "host.json").exists(), "a stopped host left host.json behind"
    async with real_host(data) as (proc, c):
        assert (await c.call("host.status", {}))["boot"]["cleanShutdown"] is True


def _damage_index(db: Path, damage: str) -> None:
    """Delete the index (with its WAL), or overwrite its header with garbage (and drop the WAL)."""
    if damage == "garbage":
        with db.open("r+b") as f:
            f.write(b"this is not a database file at all" * 4)
    for suffix in ("", "-wal", "-shm") if damage == "deleted" else ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
async def test_a_lost_or_corrupt_index_is_rebuilt_from_the_files_with_the_receipts_they_carry(
        tmp_path: Path, damage: str) -> None:
    """Durability: "A corrupt or missing `pi.sqlite` is quarantined and rebuilt from the files"; "an
    append's command receipt rides in its line's `meta` ... and boot rebuilds receipt rows from lines";
    Receipts ride with their effect: "in the new header, in the rewritten file's header". After the index
    is gone, retries of a keyed create, append and truncate answer what they answered and do nothing
    again; search and the session list come back."""
    data = tmp_path / "data"
    async with real_host(data, client_id="rb") as (proc, c):
        created = await c.call("session.create", {"title": "kept", "submissionId": "k-c"})
        sid = created["id"]
        appended = []
        for i in range(4):
            appended.append(await c.call("session.appendMessage", {
                "sessionId": sid, "message": msg(f"m{i}", f"wombat{i} words"), "submissionId": f"k-a{i}"}))
        truncated = await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "m3", "submissionId": "k-t"})
        proc.kill9()
    db = data / "pi.sqlite"
    _damage_index(db, damage)
    with trio.fail_after(60):
        async with real_host(data, client_id="rb") as (proc, c):
            # (the summary a rebuilt create receipt answers is the session as it is now — messageCount and
            # updatedAt of the later appends — not the one first answered: store/receipts.py rebuilds it "from
            # the state the file left behind"; the identity of what was created is the same)
            again_created = await c.call("session.create", {"title": "kept", "submissionId": "k-c"})
            assert {k: again_created[k] for k in ("id", "title", "createdAt")} == \
                {k: created[k] for k in ("id", "title", "createdAt")}
            for i in range(3):
                again = await c.call("session.appendMessage", {
                    "sessionId": sid, "message": msg(f"m{i}", f"wombat{i} words"), "submissionId": f"k-a{i}"})
                assert again == appended[i], (i, again, appended[i])
            assert await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "m3",
                                                         "submissionId": "k-t"}) == truncated
            conflict = await _code(c.call("session.appendMessage", {
                "sessionId": sid, "message": msg("other", "x"), "submissionId": "k-a0"}))
            assert conflict.data_code == "IDEMPOTENCY_CONFLICT"
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == \
                ["m0", "m1", "m2"]
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == [sid]
            hits = (await c.call("search.query", {"query": "wombat1"}))["results"]
            assert [(h["sessionId"], h["messageId"]) for h in hits] == [(sid, "m1")]
            assert not (await c.call("search.query", {"query": "wombat3"}))["results"]
    if damage == "garbage":
        assert [p for p in data.rglob("*") if "pi.sqlite" in p.name and p != db and "corrupt" in str(p).lower()
                or "quarantine" in str(p).lower()], "the corrupt index was not kept aside"


async def test_db_only_writes_survive_a_sigkill_right_after_their_answer(tmp_path: Path) -> None:
    """Read barriers: "DB-only state (queue, approvals, receipts of DB-only methods, settings) is never
    deferred: its commit precedes its reply". SIGKILL right after the answers: the setting, the queue
    entry and the settings receipt are there after the restart."""
    data = tmp_path / "data"
    async with real_host(data, client_id="db") as (proc, c):
        sid = (await c.call("session.create", {}))["id"]
        setting = await c.call("settings.set", {"ns": "ui", "key": "pane", "value": {"w": 3}, "submissionId": "k-s"})
        pushed = await c.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "later",
                                                    "permissionMode": "ask", "submissionId": "k-q"})
        proc.kill9()
    async with real_host(data, client_id="db") as (proc, c):
        assert (await c.call("settings.get", {"ns": "ui", "key": "pane"}))["value"] == {"w": 3}
        entries = (await c.call("session.queueList", {"sessionId": sid}))["entries"]
        assert [e["content"] for e in entries] == ["later"]
        assert await c.call("settings.set", {"ns": "ui", "key": "pane", "value": {"w": 3},
                                             "submissionId": "k-s"}) == setting
        assert await c.call("session.queuePush", {"sessionId": sid, "principal": "user", "content": "later",
                                                  "permissionMode": "ask", "submissionId": "k-q"}) == pushed
        assert len((await c.call("session.queueList", {"sessionId": sid}))["entries"]) == 1


async def test_a_stop_with_an_idle_client_connected_does_not_wait(tmp_path: Path) -> None:
    """Shutdown: the waits are for requests in flight ("in-flight requests finish within a deadline"); with
    none in flight, SIGTERM stops the host at once, and the open connection is closed with 1001 ("going
    away", protocol/README) while the host is still there to finish the close handshake. Before, a stop
    with a client connected took the whole 5 s close timeout more (the gateway was cancelled with the
    close handshake under way, and nobody read the client's reply)."""
    data = tmp_path / "data"
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                await ui.call("session.create", {"sessionId": "idle"})
                started = time.monotonic()
                os.kill(proc.proc.pid, signal.SIGTERM)
                code = await trio.to_thread.run_sync(proc.reap, 30)
                took = time.monotonic() - started
                assert code == 0
                assert took < 3.0, f"the host took {took:.1f} s to stop with an idle client connected"
                with pytest.raises(ClientClosed) as closed:
                    await ui.call("host.status", {})
                assert closed.value.code == 1001, closed.value
    finally:
        proc.kill9()
    assert (data / "clean-shutdown").exists()


def _count_in(report: Any, name: str) -> int:
    """The sum of every ``name`` count anywhere in a JSON report."""
    if isinstance(report, dict):
        own = report.get(name)
        return (own if isinstance(own, int) and not isinstance(own, bool) else 0) + \
            sum(_count_in(v, name) for k, v in report.items() if k != name)
    if isinstance(report, list):
        return sum(_count_in(v, name) for v in report)
    return 0


async def test_lines_start_with_type_and_a_bad_middle_line_is_counted_kept_and_skipped(tmp_path: Path) -> None:
    """Durability: "Lines are written with `type` as their first key"; "Readers skip a torn trailing line
    and unknown line kinds, and dedupe message ids keep-last; a bad line in the middle is counted and
    reported, never silently dropped". With the host down, a garbage line goes in the middle and a later
    copy of a message (same id, other text) at the end: the read shows each id once with the later text,
    the boot report counts the bad line, and the file still holds it after the next append."""
    data = tmp_path / "data"
    async with real_host(data) as (proc, c):
        sid = (await c.call("session.create", {"title": "lines"}))["id"]
        for i in range(3):
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"text {i}")})
        await c.call("session.rename", {"sessionId": sid, "title": "renamed"})
        await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "m2"})
        proc.kill9()
    path = data / "sessions" / f"{sid}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    for line in lines:
        assert next(iter(json.loads(line))) == "type", line
    m1 = next(json.loads(line) for line in lines if json.loads(line).get("id") == "m1")
    later = json.dumps({**m1, "blocks": [{"type": "text", "text": "text 1, the later copy"}]}).encode() + b"\n"
    garbage = b'{"type":"message","id":"broken", this is not json\n'
    path.write_bytes(b"".join(lines[:2]) + garbage + b"".join(lines[2:]) + later)
    async with real_host(data) as (proc, c):
        boot = (await c.call("host.status", {}))["boot"]
        assert _count_in(boot, "badLines") >= 1, boot
        view = await c.call("session.get", {"sessionId": sid})
        ids = [m["id"] for m in view["messages"]]
        assert ids.count("m1") == 1 and "broken" not in ids, ids
        assert next(m for m in view["messages"] if m["id"] == "m1")["blocks"][0]["text"] == "text 1, the later copy"
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m3", "after the damage")})
        assert "m3" in [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]]
        proc.kill9()
    assert garbage in path.read_bytes(), "the bad line was dropped from the file"


async def test_behind_a_slow_write_the_reader_goes_on_and_a_concurrent_duplicate_waits_for_it(tmp_path: Path) -> None:
    """Request pipeline 2-3: a later request "takes effect after every earlier mutating request of that
    connection ... The reader keeps reading frames meanwhile"; "a concurrent duplicate waits for the first
    and gets its response". A refresh held open by its provider: on its connection `events.subscribe` and
    a malformed request are answered at once while a read waits behind it; the same key from another
    connection of that clientId waits too, and gets the first one's answer: the provider was asked once."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with _stuck_refresh(data, delay=60) as (proc, c, server, outcome, done), \
                open_client(proc.url, proc.token, client_id="slow", client_kind="ui") as twin, \
                trio.open_nursery() as nursery:
            answers: dict[str, Any] = {}

            async def keep(name: str, client: HostClient, method: str, params: dict[str, Any]) -> None:
                try:
                    answers[name] = await client.call(method, params)
                except RpcError as exc:
                    answers[name] = exc

            nursery.start_soon(keep, "read", c, "settings.get", {"ns": "ui", "key": "x"})
            nursery.start_soon(keep, "dup", twin, "models.refresh",
                               {"providerId": "local", "timeoutMs": 120000, "submissionId": "r-1"})
            with trio.fail_after(5):
                assert (await c.call("events.subscribe", {"topics": ["session.created"]}))["subscriptionId"]
                bad = await _code(c.call("session.get", {"sessionId": "../etc"}))
                assert bad.data_code in ("INVALID_PARAMS", "INVALID_ID"), bad
            await trio.sleep(0.5)
            assert "read" not in answers and "dup" not in answers and not done.is_set(), (answers, outcome)
            server._release.set()
            await done.wait()
            with trio.fail_after(10):
                while len(answers) < 2:  # noqa: ASYNC110 - tasks of this nursery, polled
                    await trio.sleep(0.02)
            assert "result" in outcome, outcome
            assert answers["dup"] == outcome["result"], (answers["dup"], outcome)
            assert not isinstance(answers["read"], RpcError), answers["read"]
            assert len(server.requests) == 1, server.requests


async def test_a_plugin_s_receipts_are_its_own_even_under_a_shared_client_id(tmp_path: Path) -> None:
    """From seed 000: a receipt is keyed by "the connection's `clientId` (from `host.hello`)"; protocol/README
    §4: "a plugin connection's `clientId` counts within its `pluginId`: two plugins, or a plugin and a UI,
    sharing a `clientId` never share receipts". Each gets its own effect and answer under one key, also
    after a SIGKILL and restart (the replay then comes from each one's own receipt)."""
    data = tmp_path / "data"
    key = "shared-key"

    async def each(proc: HostProcess) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        for who, plugin_id, ns in (("ui", None, "ui"), ("p1", "acme.one", "plugin:acme.one"),
                                   ("p2", "acme.two", "plugin:acme.two")):
            kind = "plugin" if plugin_id else "ui"
            async with open_client(proc.url, proc.token, client_id="same", client_kind=kind,
                                   plugin_id=plugin_id) as c:
                answers[who] = await c.call("settings.set", {"ns": ns, "key": "k", "value": who, "submissionId": key})
                other = await _code(c.call("settings.set", {"ns": ns, "key": "k", "value": "changed",
                                                            "submissionId": key}))
                assert other.data_code == "IDEMPOTENCY_CONFLICT", (who, other)
                assert (await c.call("settings.get", {"ns": ns, "key": "k"}))["value"] == who
        return answers

    with trio.fail_after(60):
        async with real_host(data) as (proc, _c):
            first = await each(proc)
            proc.kill9()
        async with real_host(data) as (proc, _c):
            assert await each(proc) == first


@pytest.mark.parametrize("point", ["append.before_write", "append.after_write", "append.after_fsync"])
async def test_an_unexpected_failure_mid_append_is_a_clear_error_and_the_keyed_retry_lands_once(
        tmp_path: Path, point: str) -> None:
    """Process and actors: "An actor that dies fails every pending `ask` with an error the gateway maps to
    a retriable JSON-RPC error; nothing is silently dropped"; Request pipeline 4: "a failed mutation marks
    its session actor for rebuild from the transcript". An unexpected exception at a step of an append:
    the client gets an error (never a hang, never a success), the same key then lands exactly once and
    reads, search and a restart agree."""
    data = tmp_path / "data"
    proc = start_host_process(data, env={"RT_CRASHPOINT": f"{point}:1:raise"})
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="ux", client_kind="ui") as c:
                sid = (await c.call("session.create", {}))["id"]
                params = {"sessionId": sid, "message": msg("m1", "okapi words"), "submissionId": "k-1"}
                first: Any
                try:
                    first = await c.call("session.appendMessage", params)
                except RpcError as exc:
                    first = exc
                retried = await c.call("session.appendMessage", params)
                if not isinstance(first, RpcError):
                    assert retried == first  # the line was durable: the failure after it may answer from it
                assert await c.call("session.appendMessage", params) == retried
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m2", "next one")})
                view = await c.call("session.get", {"sessionId": sid})
                assert [m["id"] for m in view["messages"]] == ["m1", "m2"]
                hits = (await c.call("search.query", {"query": "okapi"}))["results"]
                assert [h["messageId"] for h in hits] == ["m1"]
            assert proc.terminate() == 0
        lines = (data / "sessions" / f"{sid}.jsonl").read_text().splitlines()
        assert sum('"m1"' in line for line in lines) == 1, lines
        async with real_host(data, client_id="ux") as (again, c):
            assert await c.call("session.appendMessage", params) == retried
            assert [m["id"] for m in (await c.call("session.get", {"sessionId": sid}))["messages"]] == ["m1", "m2"]
    finally:
        proc.kill9()


async def test_the_origin_allow_list_is_exact_and_never_lets_null_or_an_ip_literal_in(tmp_path: Path) -> None:
    """"The handshake refuses a browser `Origin` not on the allow-list (config)"; protocol/README: "exact
    match; `null` and other IP-literal origins are always refused" (even when put on the list), and the
    host's own inspector origin is accepted; RELIABILITY §5 (CVE-2025-30360: IP-address origins allowed)."""
    data = tmp_path / "data"
    proc = start_host_process(data, "--allow-origin", "https://app.example", "--allow-origin", "http://10.0.0.5:3000",
                              "--allow-origin", "null")
    try:
        with trio.fail_after(30):
            port = _port(proc)
            own = f"127.0.0.1:{port}"
            for origin, status in (("https://app.example", 101), (f"http://127.0.0.1:{port}", 101),
                                   ("https://app.example.evil.example", 403), ("https://APP.example.", 403),
                                   ("http://app.example", 403), ("http://10.0.0.5:3000", 403), ("null", 403),
                                   ("https://evil.example", 403)):
                got = await raw_upgrade(port, {"Host": own, "Origin": origin})
                assert got == status, (origin, got)
            assert await raw_upgrade(port, {"Host": own}) == 101  # no Origin: not a browser
    finally:
        assert proc.terminate() == 0
