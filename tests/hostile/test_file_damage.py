"""Damage to the host's own files other than the index (RELIABILITY.md rules 3, 9, §4 rows 4 and 15, the
shared invariant checker's "every file parses"; seed 003: the transcript is the source of truth, checkpoints,
secrets; seed 000: snapshots and attachments). Each kind of file a host writes (a transcript, its revisions
file, an in-flight checkpoint, a secret and its receipts, the machine key, a review snapshot's meta.json
and before bytes, an attachment blob, the plugin registry, host.json / host.lock / host.token, the host
log) is damaged with a seeded generator while the host is down (and, for the per-session files, under a
serving host too); then the methods that read it run, then a restart. Whatever the damage:

- no answer is INTERNAL ("a host bug") and the host log records no unexpected exception;
- the boot finishes, or refuses with a documented exit status and one ``pi-host:`` line;
- the host keeps serving the undamaged session: every acknowledged message of it reads back, and it takes
  a write.

``PIHOST_SOAK=1`` runs more seeds per kind."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.models_review import ReviewListResult
from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import HostProcess, msg, run_cli, start_host_process

CLIENT = "damage"
SOAK = os.environ.get("PIHOST_SOAK") == "1"
SEEDS = range(int(os.environ.get("PIHOST_DAMAGE_SEEDS", "12"))) if SOAK else range(1)

# what the template data directory holds (the undamaged session is ``s2``)
S1_ACKED = ["u0", "a0", "u1", "a1", "u2", "a2b"]
S2_ACKED = ["x0", "x1", "x2", "x3"]
SECRET_REF = "provider/damage"
GONE_REF = "provider/gone"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
ASSET = base64.b64encode(b"# readme\n").decode()


async def _populate(c: HostClient, project: Path) -> dict[str, str]:
    await c.call("session.create", {"sessionId": "s1", "title": "damaged", "projectPath": str(project)})
    await c.call("session.create", {"sessionId": "s2", "title": "untouched"})
    for i in range(3):
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"u{i}", f"question {i} naïve ✓")})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(
            f"a{i}", f"answer {i} " + "é" * 40, role="assistant")})
    for i in range(4):
        await c.call("session.appendMessage", {"sessionId": "s2", "message": msg(f"x{i}", f"kept {i}")})
    await c.call("session.saveActiveRevision", {"sessionId": "s1", "rootUserId": "u2"})
    await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "a2", "mode": "regenerate"})
    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a2b", "again", role="assistant")})
    await c.call("session.assistantEdit", {"sessionId": "s1", "messageId": "a1",
                                           "blocks": [{"type": "text", "text": "edited answer"}]})
    await c.call("secrets.set", {"ref": SECRET_REF, "value": "sk-damage-1"})
    await c.call("secrets.set", {"ref": GONE_REF, "value": "sk-gone", "submissionId": "gone-set"})
    await c.call("secrets.delete", {"ref": GONE_REF, "submissionId": "gone-del"})
    blob = await c.call("attachments.put", {"name": "a.txt", "mimeType": "text/plain",
                                            "dataBase64": base64.b64encode(b"attached bytes").decode()})
    image = await c.call("attachments.put", {"name": "dot.png", "mimeType": "image/png", "dataBase64": PNG})
    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u2x", "see attached", blocks=[
        {"type": "text", "text": "see attached"},
        {"type": "attachment", "kind": "file", "name": "a.txt", "ref": blob["ref"]},
        {"type": "attachment", "kind": "image", "name": "dot.png", "ref": image["ref"]}])})
    await c.call("session.create", {"sessionId": "s3", "title": "gone", "submissionId": "s3-create"})
    await c.call("session.appendMessage", {"sessionId": "s3", "message": msg("g0", "gone")})
    await c.call("session.delete", {"sessionId": "s3", "submissionId": "s3-delete"})
    review = await c.call("review.record", {
        "sessionId": "s1", "path": str(project / "f.txt"), "beforeBase64": base64.b64encode(b"old\n").decode(),
        "toolName": "Edit"})
    await c.call("plugins.register", {"pluginId": "acme", "name": "acme", "version": "1", "assets": [
        {"path": "README.md", "mediaType": "text/markdown", "dataBase64": ASSET}]})
    await c.call("configSync.configure", {"enabled": False})
    bundle = await c.call("configSync.export", {})
    await c.call("configSync.apply", {"bundleBase64": bundle["bundleBase64"]})
    await c.call("settings.set", {"key": "ui.theme", "value": "dark"})
    await c.call("configSync.export", {})
    await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u3", "question 3", turnId="t1")})
    await c.call("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t1", "message": msg(
        "a3", "partial answer", role="assistant", turnId="t1")})
    return {"sha256": blob["sha256"], "snapshotId": review["snapshot"]["snapshotId"], "bundle": bundle["bundleBase64"]}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A data directory left by a SIGKILLed host with one file of every kind (a turn open, a checkpoint
    saved), and what the reads need to name in it."""
    root = tmp_path_factory.mktemp("damage-template")
    data, project = root / "data", root / "project"
    data.mkdir()
    project.mkdir()
    (project / "f.txt").write_text("new text\n")
    names: dict[str, str] = {}

    async def build() -> None:
        async with _host(data) as (_, c):
            names.update(await _populate(c, project))

    trio.run(build)
    return data, names


@asynccontextmanager
async def _host(data: Path) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="ui") as c:
                yield proc, c
    finally:
        proc.kill9()


# ------------------------------------------------------------------ the files

def _one(pattern: str) -> Callable[[Path], Path]:
    def find(data: Path) -> Path:
        found = sorted(data.glob(pattern))
        assert len(found) == 1, (pattern, found)
        return found[0]
    return find


FILES: dict[str, Callable[[Path], Path]] = {
    "transcript": _one("sessions/s1.jsonl"),
    "revisions": _one("sessions/s1.revisions.jsonl"),
    "inflight": _one("sessions/s1.inflight.json"),
    "secret": lambda data: _secret(data, SECRET_REF, ".sec"),
    "secret-receipts": lambda data: _secret(data, GONE_REF, ".receipts"),
    "machine-key": _one("secrets/.machine-key"),
    "review-meta": _one("review-changes/s1/*/meta.json"),
    "review-before": _one("review-changes/s1/*/before"),
    "attachment": lambda data: data / "attachments" / hashlib.sha256(b"attached bytes").hexdigest(),
    "image": lambda data: data / "attachments" / hashlib.sha256(base64.b64decode(PNG)).hexdigest(),
    "deleted-log": _one("sessions/deleted-sessions.log"),
    "plugin-registry": _one("plugins/registry.json"),
    "plugin-assets": _one("plugins/*/acme.json"),
    "sync-pending": _one("config-sync/pending.bin"),
    "sync-base": _one("config-sync/base.bin"),
    "host-json": _one("host.json"),
    "host-lock": _one("host.lock"),
    "host-token": _one("host.token"),
    "host-log": _one("logs/host/host.ndjson"),
}


def _secret(data: Path, ref: str, suffix: str) -> Path:
    path = data / "secrets" / (hashlib.sha256(ref.encode()).hexdigest() + suffix)
    assert path.exists(), path
    return path


# ------------------------------------------------------------------ the damage (bytes in, bytes out)

def _mid(rng: random.Random, body: bytes) -> int:
    return rng.randrange(len(body) // 4, max(len(body) // 4 + 1, 3 * len(body) // 4)) if body else 0


def flip_byte(rng: random.Random, body: bytes) -> bytes:
    if not body:
        return b"\xff"
    at = _mid(rng, body)
    return body[:at] + bytes([body[at] ^ (1 << rng.randrange(8))]) + body[at + 1:]


def random_bytes(rng: random.Random, body: bytes) -> bytes:
    at = _mid(rng, body)
    return body[:at] + rng.randbytes(rng.randrange(1, 200)) + body[at + rng.randrange(0, 64):]


def nul_run(rng: random.Random, body: bytes) -> bytes:
    at = _mid(rng, body)
    return body[:at] + b"\0" * rng.randrange(1, 300) + body[at:]


def cut(rng: random.Random, body: bytes) -> bytes:
    """A line cut: a stretch out of the middle (lines glued), or the file cut short."""
    if rng.random() < 0.5:
        return body[:rng.randrange(0, max(1, len(body)))]
    at = _mid(rng, body)
    return body[:at] + body[at + rng.randrange(1, 80):]


def bad_utf8(rng: random.Random, body: bytes) -> bytes:
    """Invalid UTF-8 inside a JSON string (or anywhere, in a file with no strings)."""
    spots = [i for i in range(len(body)) if body[i:i + 1] == b'"']
    bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"])
    if len(spots) >= 2:
        at = rng.choice(spots[1:]) if len(spots) > 1 else spots[0]
        return body[:at] + bad + body[at:]
    at = _mid(rng, body)
    return body[:at] + bad + body[at:]


WRONG_SHAPES = [b"[]", b"{}", b'"text"', b"null", b"42", b'{"type":"message","id":7}',
                b'{"type":"message","id":"w1","role":"user","blocks":"not a list"}',
                b'{"type":"message","id":"w2","role":"wizard","blocks":[{"type":"text","text":5}]}',
                b'{"type":"session","schema":"x","sessionId":["s1"]}',
                b'{"type":"revision","rootUserId":5,"revisionIndex":"one","messages":{}}',
                b'{"type":"revision_live","rootUserId":"u2","revisionIndex":-1,"messageCount":1e309}',
                b'{"schema":1,"sessionId":"s1","turnId":"t1","savedAt":"soon","message":[]}',
                b'{"version":1,"snapshotId":"rv-0","state":"recorded","before":7}',
                b'{"plugins":{"acme":"x"},"version":"9"}',
                b'{"type":"message","id":"w3","role":"user","blocks":[{"type":"image","ref":"../../etc/passwd"}]}',
                b'{"a":' * 3000 + b"1" + b"}" * 3000, b'{"n": ' + b"9" * 5000 + b"}"]


def wrong_shape(rng: random.Random, body: bytes) -> bytes:
    """A valid JSON line of the wrong shape: between two lines of a line file, or the whole of a file."""
    line = rng.choice(WRONG_SHAPES)
    starts = [0] + [i + 1 for i in range(len(body) - 1) if body[i:i + 1] == b"\n"]
    if len(starts) > 2:
        at = rng.choice(starts[1:])
        return body[:at] + line + b"\n" + body[at:]
    return line + (b"\n" if rng.random() < 0.5 else b"")


def head(rng: random.Random, body: bytes) -> bytes:
    """The first bytes (a transcript's session header, a file's magic, a JSON file's opening) changed."""
    at = rng.randrange(0, max(1, min(len(body), 64)))
    spoil = rng.choice([b"\0" * rng.randrange(1, 16), rng.randbytes(rng.randrange(1, 16)), b"\n", b""])
    return body[:at] + spoil + body[at + rng.randrange(0, 16):]


def tail(rng: random.Random, body: bytes) -> bytes:
    """The last bytes: cut inside the last line, garbage or a NUL run after it (a torn write)."""
    keep = body[:max(0, len(body) - rng.randrange(1, 40))] if rng.random() < 0.5 else body
    return keep + rng.choice([b"", b"\0" * rng.randrange(1, 64), rng.randbytes(rng.randrange(1, 64))])


OTHER_VALUES: list[Any] = [None, 0, -1, 2 ** 70, 1.5, "", "x", True, [], {}, [1, "a"], {"k": None}]


def _retype_value(rng: random.Random, value: Any) -> Any:
    """``value`` with one node somewhere inside it given another type, or one key removed."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        if rng.random() < 0.25:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: _retype_value(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.7:
        at = rng.randrange(len(value))
        return [*value[:at], _retype_value(rng, value[at]), *value[at + 1:]]
    return rng.choice([v for v in OTHER_VALUES if type(v) is not type(value)])


def retype(rng: random.Random, body: bytes) -> bytes:
    """Valid JSON that keeps its keys but one value has another type (or a key is gone): in one line of a
    line file, or in a JSON file; bytes that are not JSON get a wrong-shape line instead."""
    lines = body.split(b"\n")
    parsed = []
    for i, line in enumerate(lines):
        try:
            parsed.append((i, json.loads(line)))
        except (ValueError, RecursionError):
            continue
    if not parsed:
        return wrong_shape(rng, body)
    i, value = rng.choice(parsed)
    lines[i] = json.dumps(_retype_value(rng, value)).encode()
    return b"\n".join(lines)


DAMAGE: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "flip": flip_byte, "random": random_bytes, "nul": nul_run, "cut": cut, "utf8": bad_utf8, "shape": wrong_shape,
    "head": head, "tail": tail, "retype": retype,
}


def oversize_line(body: bytes) -> bytes:
    """A line past the reader's line limit (64 MiB) in the middle of a line file."""
    starts = [i + 1 for i in range(len(body) - 1) if body[i:i + 1] == b"\n"]
    at = starts[len(starts) // 2]
    huge = b'{"type":"message","id":"huge","role":"user","blocks":[{"type":"text","text":"' + b"h" * (65 << 20)
    return body[:at] + huge + b'"}]}\n' + body[at:]


# ------------------------------------------------------------------ the reads and the checks

def _reads(names: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("host.status", {}),
        ("session.list", {}),
        ("session.get", {"sessionId": "s1", "full": True}),
        ("session.get", {"sessionId": "s1"}),
        ("session.listRevisions", {"sessionId": "s1"}),
        ("session.tree", {"sessionId": "s1"}),
        ("session.context", {"sessionId": "s1"}),
        ("session.listTurns", {"sessionId": "s1"}),
        ("session.export", {"sessionId": "s1", "format": "jsonl"}),
        ("session.export", {"sessionId": "s1", "format": "md"}),
        ("session.export", {"sessionId": "s1", "format": "html"}),
        ("attachments.estimate", {}),
        ("session.delete", {"sessionId": "s3", "submissionId": "s3-delete"}),
        ("session.create", {"sessionId": "s3", "title": "gone", "submissionId": "s3-create"}),
        ("search.query", {"query": "question"}),
        ("secrets.list", {}),
        ("secrets.get", {"ref": SECRET_REF}),
        ("secrets.delete", {"ref": GONE_REF, "submissionId": "gone-del"}),
        ("attachments.get", {"sha256": names["sha256"]}),
        ("review.list", {"sessionId": "s1"}),
        ("review.get", {"sessionId": "s1", "snapshotId": names["snapshotId"], "includeBefore": True}),
        ("plugins.list", {}),
        ("plugins.getAsset", {"pluginId": "acme", "path": "README.md"}),
        ("session.queueList", {"sessionId": "s1"}),
        ("configSync.get", {}),
        ("configSync.export", {}),
        ("configSync.apply", {"bundleBase64": names["bundle"]}),
        ("session.activateRevision", {"sessionId": "s1", "rootUserId": "u2", "revisionIndex": 1}),
        ("session.appendMessage", {"sessionId": "s1", "message": msg("later", "after the damage")}),
        ("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t1", "message": msg(
            "a3", "partial answer, more", role="assistant", turnId="t1")}),
        ("secrets.set", {"ref": SECRET_REF, "value": "sk-damage-2"}),
        ("plugins.register", {"pluginId": "beta", "name": "beta", "version": "1"}),
        ("review.restore", {"sessionId": "s1", "snapshotId": names["snapshotId"]}),
    ]


async def _drive(c: HostClient, names: dict[str, str], codes: list[str]) -> None:
    for method, params in _reads(names):
        try:
            await c.call(method, params)
            codes.append("ok")
        except RpcError as failed:
            codes.append(f"{method}:{failed.data_code}")


async def _undamaged_serves(c: HostClient, tag: str) -> None:
    got = await c.call("session.get", {"sessionId": "s2", "full": True})
    have = [m["id"] for m in got["messages"]]
    assert have[:len(S2_ACKED)] == S2_ACKED, have
    await c.call("session.appendMessage", {"sessionId": "s2", "message": msg(f"y-{tag}", "still served")})


def _log_problems(data: Path) -> list[str]:
    bad: list[str] = []
    for path in sorted((data / "logs").rglob("*.ndjson")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # a line the test itself damaged
                continue
            text = json.dumps(record)
            if not isinstance(record, dict):
                continue
            if "unexpected exception" in text or "INTERNAL" in text or record.get("level") == "critical" \
                    or "actor crashed" in text.lower():
                bad.append(text[:2000])
    return bad


async def _boot_and_read(data: Path, names: dict[str, str], tag: str) -> list[str]:
    """One host on ``data``: every read, then the undamaged session; the codes answered. A boot that
    refuses must say so with a documented status and one line."""
    codes: list[str] = []
    try:
        proc = start_host_process(data)
    except RuntimeError as refused:
        text = str(refused)
        assert "Traceback" not in text, text[-3000:]
        status = text.split("host exited with ", 1)[1].split(":", 1)[0]
        assert status in ("2", "5"), text[-3000:]
        lines = [ln for ln in text.split(":", 1)[1].strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("pi-host:"), text[-3000:]
        return [f"refused:{status}"]
    try:
        with trio.fail_after(90):
            async with open_client(proc.url, proc.token, client_id=CLIENT, client_kind="ui") as c:
                await _drive(c, names, codes)
                await _undamaged_serves(c, tag)
    finally:
        assert proc.proc.poll() is None, "the host died"
        proc.kill9()
    return codes


def _check(codes: list[str], data: Path) -> None:
    if os.environ.get("PIHOST_DAMAGE_DEBUG"):
        print("CODES", sorted(set(codes)))
    assert not [c for c in codes if c.endswith(":INTERNAL")], codes
    assert _log_problems(data) == []


# ------------------------------------------------------------------ between two hosts

CASES = [(kind, damage, seed) for i, kind in enumerate(FILES) for j, damage in enumerate(DAMAGE) for seed in SEEDS
         if SOAK or (i + j) % 2 == 0]  # CI: half the damages per kind, in turn (PIHOST_SOAK=1: all, 12 seeds)
HALF = len(CASES) // 2
"""The cases up to HALF run in this module, the others (with the lost index's cases) in
test_file_damage_more.py and the serving host's cases in test_file_damage_serving.py: a module runs whole
on one worker (``--dist loadfile``), and this one took over four minutes of one; the three run side by side
(each builds its own ``template``)."""


@pytest.mark.parametrize(("kind", "damage", "seed"), CASES[:HALF])
async def test_a_file_damaged_between_two_hosts(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                                kind: str, damage: str, seed: int) -> None:
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES[kind](data)
    rng = random.Random(f"{kind}/{damage}/{seed}")
    target.write_bytes(DAMAGE[damage](rng, target.read_bytes()))
    first = await _boot_and_read(data, names, "first")
    _check(first, data)
    second = await _boot_and_read(data, names, "second")
    _check(second, data)


@pytest.mark.parametrize("body", [b"\xff" * 64 + b"\n", b"a" * 600 + b"\n", b"\xc3(" + b"b" * 62],
                         ids=["not-utf8", "too-long", "bad-sequence"])
async def test_a_host_token_no_client_could_send_is_replaced_at_boot(
        tmp_path: Path, template: tuple[Path, dict[str, str]], body: bytes) -> None:
    """``host.token`` that is not UTF-8, or longer than ``host.hello`` takes (512 characters), holds no token
    a client could send: the boot replaces it (as it does a short one) instead of dying with a traceback or
    serving a token nobody can present. (The template's host left a token and the undamaged session ``s2``.)"""
    src, _ = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    assert len((data / "host.token").read_text().strip()) == 64
    (data / "host.token").write_bytes(body)
    async with _host(data) as (proc, c):
        await _undamaged_serves(c, "token")
    token = (data / "host.token").read_bytes()
    assert token != body and len(token.decode().strip()) == 64


INDEX_LOST_CASES = [(kind, list(DAMAGE)[(i + k) % len(DAMAGE)]) for i, kind in enumerate(FILES)
                    for k in (range(len(DAMAGE)) if SOAK else (0,))]


async def a_file_damaged_and_the_index_lost(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                            kind: str, damage: str) -> None:
    """The damage, and the index gone too (RELIABILITY row 8): the boot rebuilds the index from the files,
    the damaged one among them, which is the path that reads every file from its first byte."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES[kind](data)
    rng = random.Random(f"lost/{kind}/{damage}")
    target.write_bytes(DAMAGE[damage](rng, target.read_bytes()))
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (data / name).unlink(missing_ok=True)
    _check(await _boot_and_read(data, names, "first"), data)
    _check(await _boot_and_read(data, names, "second"), data)


# ------------------------------------------------------------------ under a serving host

SERVING = [kind for kind in FILES if kind not in ("host-lock", "host-token", "machine-key")]
SERVING_CASES = [(kind, damage, seed) for i, kind in enumerate(SERVING) for j, damage in enumerate(DAMAGE)
                 for seed in SEEDS if SOAK or (i + j) % 3 == 0]  # CI: a third of the damages per kind, in turn


def _live_reads() -> list[tuple[str, dict[str, Any]]]:
    """What reads (or rewrites) a live checkpoint and an open turn, besides :func:`_reads`."""
    return [
        ("session.get", {"sessionId": "s1"}),
        ("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t2", "message": msg(
            "a4", "second partial, longer", role="assistant", turnId="t2")}),
        ("session.recoverInflight", {"sessionId": "s1", "turnId": "t2"}),
        ("session.endTurn", {"sessionId": "s1", "turnId": "t2", "status": "completed"}),
    ]


async def a_file_damaged_under_a_serving_host(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                             kind: str, damage: str, seed: int) -> None:
    """The same damage while a host serves (with a turn open and its checkpoint saved): the reads after it
    answer, or fail with a stable code; the host keeps serving the undamaged session; the next boot too."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    codes: list[str] = []
    async with _host(data) as (proc, c):
        await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t2"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u4", "question 4", turnId="t2")})
        await c.call("session.saveInflightMessage", {"sessionId": "s1", "turnId": "t2", "message": msg(
            "a4", "second partial", role="assistant", turnId="t2")})
        await c.call("session.get", {"sessionId": "s2"})  # the index covers every append
        target = FILES[kind](data)
        rng = random.Random(f"serving/{kind}/{damage}/{seed}")
        target.write_bytes(DAMAGE[damage](rng, target.read_bytes()))
        try:
            for method, params in _live_reads() + _reads(names):
                try:
                    await c.call(method, params)
                    codes.append("ok")
                except RpcError as failed:
                    codes.append(f"{method}:{failed.data_code}")
        except ClientClosed as closed:
            codes.append(f"closed {closed}")
        assert proc.proc.poll() is None, "the host died"
        async with open_client(proc.url, proc.token, client_id="other", client_kind="ui") as other:
            await _undamaged_serves(other, "serving")
    _check(codes, data)
    _check(await _boot_and_read(data, names, "after"), data)


# ------------------------------------------------------------------ valid JSON of the wrong shape, line by line

def _line(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


MESSAGE_SHAPES: list[bytes] = [
    _line(type="message", id="w", role="user", blocks="not a list"),
    _line(type="message", id="w", role="user", blocks=["text", 5, None]),
    _line(type="message", id="w", role="user", blocks={"type": "text"}),
    _line(type="message", id="w", role="user", blocks=None),
    _line(type="message", id="w", role="user"),
    _line(type="message", id="w", role=5, blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role={"k": None}, blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role=["user"], blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role=None, blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="a0", role={"k": None}, blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], turnId={"t": 1}),
    _line(type="message", id="w", role="tool", toolName={"n": 1}, blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role="wizard", blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": 5}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": ["a"]}]),
    _line(type="message", id="w", role="user", blocks=[{"type": 7, "text": "x"}]),
    _line(type="message", id="w", role="user", blocks=[{"text": "no type"}]),
    _line(type="message", id="w", role="assistant",
          blocks=[{"type": "tool_call", "name": 5, "arguments": "x", "id": 3}]),
    _line(type="message", id="w", role="tool", blocks=[{"type": "tool_result", "content": 5, "isError": "yes",
                                                       "toolCallId": ["x"]}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "attachment", "ref": 5, "name": None, "kind": 1}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "attachment", "ref": "attachments/../../etc/passwd",
                                                       "name": "x", "kind": "file"}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "image", "ref": "/etc/passwd", "mimeType": 5}]),
    _line(type="message", id="w", role="assistant", blocks=[{"type": "thinking", "text": None}]),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], createdAt=5),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], createdAt="99999-99-99"),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], createdAt=1e308),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], meta="not a dict"),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], meta={"usage": "lots",
                                                                                            "revisionCount": "2"}),
    _line(type="message", id="w", role="assistant", blocks=[{"type": "text", "text": "x"}], turnId=5),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}], seq=-3, deleted="yes"),
    _line(type="message", id="", role="user", blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="../../x", role="user", blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="w" * 5000, role="user", blocks=[{"type": "text", "text": "x"}]),
    _line(type="message", id="u1", role="user", blocks="dup of a good id"),
    _line(type="message", id=5, role="user", blocks=[]),
    _line(type="message", id="w", role="user", blocks=[{"type": "text", "text": "x"}] * 5000),
    _line(type="compaction", id=5, summary=None, firstKeptMessageId=7, tokensBefore="many"),
    _line(type="compaction", id="cp", summary="s", firstKeptMessageId="u1", throughMessageId="a1",
          retainedTail="x", details=[]),
    _line(type="tombstone", messageId="u1", deleted="no", receipt=[1]),
    _line(type="tombstone", messageId=["u1"]),
    _line(type="tombstone", messageId="a0", deleted=True, receipt={"method": 5, "clientId": None}),
    _line(type="session_info", title=5, projectPath=["x"], pinned="yes", receipt={"x": 1}),
    _line(type="session_info", importOrigin="x", importHistory=5),
    _line(type="session", schema="x", sessionId=["s1"], epoch=5),
    _line(type="import_receipt", units="x"),
    _line(type="approval_decision", requestId=5, decision=["allow"]),
    _line(type=["message"], id="w"),
    b"[]", b"{}", b'"text"', b"null", b"42", b"true",
    b'{"type":"message","id":"w","role":"user","blocks":[{"type":"text","text":"\\ud800"}]}',
    b'{"type":"message","id":"w","id":"v","role":"user","blocks":[]}',
    b'{"type":"message","id":"w","role":"user","blocks":[{"type":"text","text":NaN}]}',
    b'{"type":"message","id":"w","role":"user","blocks":[],"n":' + b"9" * 5000 + b"}",
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
]

REVISION_SHAPES: list[bytes] = [
    _line(type="revision", rootUserId=5, revisionIndex="one", messages={}),
    _line(type="revision", rootUserId="u2", revisionIndex=1, messages="x"),
    _line(type="revision", rootUserId="u2", revisionIndex=2, messages=[5, None, "x"]),
    _line(type="revision", rootUserId="u2", revisionIndex=2, messages=[{"type": "message", "id": 5}]),
    _line(type="revision", rootUserId="u2", revisionIndex=2, messages=[{"type": "message", "id": "r", "role": "user",
                                                                       "blocks": "x"}]),
    _line(type="revision", rootUserId="u2", revisionIndex=-1, messages=[], createdAt=[]),
    _line(type="revision", rootUserId="u2", revisionIndex=1e309, messages=[]),
    _line(type="revision_live", rootUserId="u2", revisionIndex=-1, messageCount="x"),
    _line(type="revision_live", rootUserId=None, revisionIndex=None),
    _line(type="revision_live", rootUserId="u2", revisionIndex=2 ** 70, messageCount=2 ** 70),
    _line(type=5), b"[]", b"{}", b"null", b'"x"',
]


def _insert_mid(body: bytes, line: bytes) -> bytes:
    starts = [i + 1 for i in range(len(body) - 1) if body[i:i + 1] == b"\n"]
    at = starts[len(starts) // 2]
    return body[:at] + line + b"\n" + body[at:]


SHAPE_CASES = [("transcript", i) for i in range(len(MESSAGE_SHAPES)) if SOAK or i % 3 == 0 or i < 16] + \
    [("revisions", i) for i in range(len(REVISION_SHAPES)) if SOAK or i % 2 == 0]


@pytest.mark.parametrize(("kind", "index"), SHAPE_CASES)
async def test_a_valid_json_line_of_the_wrong_shape(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                                    kind: str, index: int) -> None:
    """Each line is valid JSON but not what the host writes (a wrong type for a field, a missing field, an
    unknown record kind, a lone surrogate, NaN, a duplicate key, a 5000-digit number, deep nesting), put
    in the middle of a transcript or a revisions file between two hosts."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES[kind](data)
    line = (MESSAGE_SHAPES if kind == "transcript" else REVISION_SHAPES)[index]
    target.write_bytes(_insert_mid(target.read_bytes(), line))
    _check(await _boot_and_read(data, names, "first"), data)
    _check(await _boot_and_read(data, names, "second"), data)


NEWEST_INFO_SHAPES: dict[str, bytes] = {
    "project-a-number": _line(type="session_info", projectPath=5),
    "every-setting-mistyped": _line(type="session_info", title=5, projectPath=["x"], providerId=7, modelId={},
                                    mode=[], thinkingLevel=3, permissionMode=True),
    "modes-unknown": _line(type="session_info", mode="yolo", thinkingLevel="ultra", permissionMode="yolo"),
}


@pytest.mark.parametrize("shape", list(NEWEST_INFO_SHAPES))
async def test_the_newest_session_info_line_with_mistyped_settings(
        tmp_path: Path, template: tuple[Path, dict[str, str]], shape: str) -> None:
    """The newest ``session_info`` line (the one whose settings the row takes) with a setting of the wrong
    JSON type, between two hosts: boot reconciled the grown transcript and crashed (``AttributeError: 'int'
    object has no attribute 'strip'`` canonicalizing the project path; found by
    ``test_a_file_damaged_between_two_hosts[transcript-retype-5]`` under PIHOST_SOAK=1). A mistyped setting
    sets nothing; a project path that is not text names no project."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES["transcript"](data)
    target.write_bytes(target.read_bytes() + NEWEST_INFO_SHAPES[shape] + b"\n")
    _check(await _boot_and_read(data, names, "first"), data)
    _check(await _boot_and_read(data, names, "second"), data)


REVIEW_META_CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "before-renamed": lambda m: m.__setitem__("bdfore", m.pop("before")),
    "before-a-string": lambda m: m.__setitem__("before", "x"),
    "after-without-hash": lambda m: m["after"].pop("sha256"),
    "exists-a-string": lambda m: m["before"].__setitem__("exists", "yes"),
    "created-at-a-string": lambda m: m.__setitem__("createdAt", "soon"),
    "path-a-number": lambda m: m.__setitem__("path", 5),
    "restore-a-string": lambda m: m.__setitem__("restore", "x"),
    "restored-at-missing": lambda m: m.update(state="restored", restore={"receipt": 5}),
}


@pytest.mark.parametrize("change", list(REVIEW_META_CHANGES))
async def test_a_review_meta_json_that_parses_but_lost_its_shape(
        tmp_path: Path, template: tuple[Path, dict[str, str]], change: str) -> None:
    """A snapshot's ``meta.json`` that still parses, with a key or a type changed (one flipped byte in a key
    does it): review.get / restore answer CORRUPT_DATA, as for one that does not parse, never INTERNAL (a
    KeyError on ``meta["before"]``); review.list answers, the snapshot named in ``unreadable`` (one damaged
    snapshot never hides the others)."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES["review-meta"](data)
    meta = json.loads(target.read_bytes())
    REVIEW_META_CHANGES[change](meta)
    target.write_bytes(json.dumps(meta).encode() + b"\n")
    snap = {"sessionId": "s1", "snapshotId": names["snapshotId"]}
    async with _host(data) as (_, c):
        for method, params in (("review.get", {**snap, "includeBefore": True}), ("review.restore", snap)):
            with pytest.raises(RpcError) as failed:
                await c.call(method, params)
            assert failed.value.data_code == "CORRUPT_DATA", (method, failed.value.data_code)
        listed = ReviewListResult.model_validate(await c.call("review.list", {"sessionId": "s1"}))
        assert listed.snapshots == [] and listed.unreadable == [names["snapshotId"]]
        await _undamaged_serves(c, "review")
    assert _log_problems(data) == []


@pytest.mark.parametrize("kind", ["transcript", "revisions"] if SOAK else ["transcript"])
async def test_a_line_far_over_the_line_limit(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                              kind: str) -> None:
    """A line past the readers' 64 MiB line limit in the middle of a transcript or a revisions file (a
    runaway writer, a file glued to another): the boot and the reads go on, never INTERNAL, and the
    undamaged session serves."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES[kind](data)
    target.write_bytes(oversize_line(target.read_bytes()))
    _check(await _boot_and_read(data, names, "first"), data)
    _check(await _boot_and_read(data, names, "second"), data)


async def test_a_line_over_the_line_limit_stays_out_of_a_rewritten_transcript(
        tmp_path: Path, template: tuple[Path, dict[str, str]]) -> None:
    """The boot scan skips (and counts) a line past the 64 MiB line limit; a rewrite of the whole file
    (``session.truncateFrom``) read it as a message and wrote it back, the index then held it, and
    ``session.get`` of the whole history answered PAYLOAD_TOO_LARGE while paged reads worked. The line is
    unreadable damage everywhere: the rewrite keeps it aside (``<sid>.jsonl.dropped-<ms>``) and leaves it out."""
    src, _ = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    target = FILES["transcript"](data)
    target.write_bytes(oversize_line(target.read_bytes()))
    body = target.read_bytes()
    assert body.index(b'"id":"huge"') < body.index(b'"id":"u3"')  # the rewrite below keeps what is before u3
    async with _host(data) as (_, c):
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        before = [m["id"] for m in got["messages"]]
        assert before[:len(S1_ACKED)] == S1_ACKED and "u3" in before and "huge" not in before, before
        kept = before[:before.index("u3")]
        await c.call("session.truncateFrom", {"sessionId": "s1", "messageId": "u3", "mode": "edit"})
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        assert [m["id"] for m in got["messages"]] == kept
        page = await c.call("session.get", {"sessionId": "s1", "messageLimit": 2})
        assert page["totalMessages"] == len(kept), page
    assert b'"id":"huge"' not in target.read_bytes()
    aside = sorted(data.glob("sessions/s1.jsonl.dropped-*"))
    assert len(aside) == 1 and aside[0].stat().st_size > 64 << 20, aside  # kept, never lost
    async with _host(data) as (_, c):  # a rebuilt view agrees: the index follows the file
        got = await c.call("session.get", {"sessionId": "s1", "full": True})
        assert [m["id"] for m in got["messages"]] == kept
    assert _log_problems(data) == []


def _rewrite_messages(target: Path, ids: tuple[str, ...], change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Rewrite in place the lines of the messages ``ids`` as ``change`` makes them (an acknowledged line damaged)."""
    lines = target.read_bytes().splitlines(keepends=True)
    for i, line in enumerate(lines):
        record = json.loads(line)
        if record.get("id") in ids:
            lines[i] = json.dumps(change(record)).encode() + b"\n"
    target.write_bytes(b"".join(lines))


@pytest.mark.parametrize("blocks", [1, -1, 1.5, True, 2 ** 70, "text", {"type": "text", "text": "x"}, None],
                         ids=["one", "minus-one", "float", "true", "huge", "string", "object", "null"])
async def test_a_message_line_whose_blocks_are_not_a_list(tmp_path: Path, template: tuple[Path, dict[str, str]],
                                                          blocks: Any) -> None:
    """An acknowledged message's line rewritten in place with ``blocks`` of another type (a number is not
    iterable): the boot that re-indexes the transcript finishes (it died with a TypeError, every time: a
    boot loop), and the reads and rewrites of the session answer."""
    src, names = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    _rewrite_messages(FILES["transcript"](data), ("u1", "u2"), lambda r: {**r, "blocks": blocks})
    _check(await _boot_and_read(data, names, "first"), data)
    _check(await _boot_and_read(data, names, "second"), data)


# ------------------------------------------------------------------ the offline CLI on a damaged directory

CLI_DAMAGE: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "blocks-a-number": lambda r: {**r, "blocks": 5},
    "blocks-of-strings": lambda r: {**r, "blocks": ["text", 5]},
    "meta-a-string": lambda r: {**r, "meta": "not a dict"},
    "role-an-object": lambda r: {**r, "role": {"k": None}},
}


@pytest.mark.parametrize("damage", list(CLI_DAMAGE))
def test_the_offline_cli_reads_a_damaged_transcript_without_a_traceback(
        tmp_path: Path, template: tuple[Path, dict[str, str]], damage: str) -> None:
    """``pi-host show / sessions / search / doctor`` with no host running read the files themselves: an
    acknowledged line rewritten with a field of another type prints the session (or one clear line and a
    non-zero status), never a traceback to the person at the terminal."""
    src, _ = template
    data = tmp_path / "data"
    shutil.copytree(src, data, symlinks=True)
    _rewrite_messages(FILES["transcript"](data), ("u1", "a1"), CLI_DAMAGE[damage])
    for argv in (["show", "s1"], ["show", "s2"], ["sessions"], ["search", "question"], ["doctor"]):
        done = run_cli("--data-dir", str(data), *argv, errors="replace")
        said = done.stdout + done.stderr
        assert "Traceback" not in said, (argv, said[-3000:])
        if argv == ["show", "s2"]:
            assert done.returncode == 0 and all(f"kept {i}" in said for i in range(4)), said
