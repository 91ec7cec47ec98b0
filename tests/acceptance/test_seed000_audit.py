"""Seed 000 audited by an outsider, third pass: the rules the earlier outsider files hold only loosely,
probed against real ``pi-host serve`` processes with data damaged on disk while the host is stopped.

How the seed maps onto this host (docs: ARCHITECTURE.md "From seed 000", which wins where the two differ):
the live transcript is a chain (a line's parent is the previous visible line, so a live line cannot name a
missing parent or close a cycle); ``parentId`` exists only in ``session.tree``'s projection of the live
chain plus the archived revision branches (``sessions/<id>.revisions.jsonl``). Corrupt tree data in the
host's own format is therefore a damaged revisions file: a branch that repeats a message, or a branch
stored twice. Seed 000 §3.4: "Walk length is bounded by node count" — the tree must come back, each node
once, whatever the file holds."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from tests.acceptance.outsiderkit import assert_snapshot_refused, data_dir, real_host, say
from tests.hostkit import msg


def _revisions_file(data: Path, sid: str) -> Path:
    (path,) = data.rglob(f"{sid}.revisions.jsonl")
    return path


async def _regenerated(c: Any) -> str:
    """q1 → a1 → q2 → a2, then a1 regenerated as b1: one archived branch of four messages under q1."""
    sid = str((await c.call("session.create", {}))["id"])
    await say(c, sid, "q1", "first question")
    await say(c, sid, "a1", "reply A", "assistant")
    await say(c, sid, "q2", "second question")
    await say(c, sid, "a2", "second reply", "assistant")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
    await say(c, sid, "b1", "reply B", "assistant")
    return sid


def _repeat_a_message(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The branch's reply a1 appears again after q2: its node would be its own grandparent."""
    (branch,) = lines
    branch["messages"] = [*branch["messages"], branch["messages"][1]]
    return [branch]


def _store_twice(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same archived branch written twice (a replayed archive line): 40 copies."""
    return lines * 40


@pytest.mark.parametrize("damage", [_repeat_a_message, _store_twice], ids=["repeated message", "branch twice"])
async def test_a_damaged_revisions_file_yields_a_tree_of_each_node_once_without_hanging(
        tmp_path: Path, damage: Any) -> None:
    """Seed 000 §3.4: "A parent must exist ... Corrupt data falls back ... Walk length is bounded by node
    count." A revisions file damaged while the host is stopped (a message repeated inside its branch: a
    parent cycle among the projected nodes; or the branch stored many times over) still gives a tree after
    the restart, promptly, in which every node id is unique, every parent is a node of the tree or null,
    and the live chain and its leaf are untouched; switching to the damaged branch shows each of its
    messages once. (The projection used to walk the repeated node's
    children forever, and to visit a branch stored n times n^depth times.)"""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = await _regenerated(c)
            before = await c.call("session.tree", {"sessionId": sid})
    path = _revisions_file(data, sid)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in damage(lines)))
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            after = await c.call("session.tree", {"sessionId": sid})
            ids = [n["id"] for n in after["nodes"]]
            assert len(ids) == len(set(ids))
            assert all(n["parentId"] is None or n["parentId"] in set(ids) for n in after["nodes"])
            assert ids == [n["id"] for n in before["nodes"]]
            assert after["activeLeafId"] == before["activeLeafId"] == "b1"
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "b1"]
            # switching to the damaged branch brings each of its messages back once
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 1})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "a1", "q2", "a2"]
            ids = [n["id"] for n in (await c.call("session.tree", {"sessionId": sid}))["nodes"]]
            assert len(ids) == len(set(ids)) and {"q1", "a1", "q2", "a2"} <= set(ids)


# ------------------------------------------------------------------------------------ session context (§4)

def _env(model: str, **extra: Any) -> dict[str, Any]:
    return {"version": 1, "model": {"id": model}, "systemPrompt": f"prompt for {model}",
            "credentialRefs": ["provider/p1"], **extra}


async def _turn(c: Any, sid: str, turn: str, n: int) -> None:
    """A whole turn: its snapshot, a prompt and a reply tied to it, ended."""
    await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": _env(f"m-{turn}")})
    await say(c, sid, f"q{n}", f"question {n}", turnId=turn)
    await say(c, sid, f"a{n}", f"answer {n}", "assistant", turnId=turn)
    await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed"})


async def test_the_context_is_the_leaf_to_root_path_reversed_with_the_turn_context_of_the_active_branch(
        tmp_path: Path) -> None:
    """Seed 000 §4: buildSessionContext "reverses the leaf-to-root path, omits tombstones and system notices,
    and produces provider-neutral messages plus the latest Turn context". Two turns, then the second one's
    prompt tombstoned: the context runs root first without it, and its Turn context is still the second
    turn's (a tombstone hides a message, not the turn it ran in). After the first reply is regenerated (the
    second turn now lives only in an archived branch) and a SIGKILL, the context is the new path and its
    Turn context the first turn's, the one newest on the active branch; switching back to the first
    branch leaves its prompt deleted and makes the second turn's context the latest again."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("secrets.set", {"ref": "provider/p1", "value": "ctx-secret-value"})
            sid = str((await c.call("session.create", {}))["id"])
            await _turn(c, sid, "t1", 1)
            await _turn(c, sid, "t2", 2)
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "q2"})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "a1", "a2"]
            assert ctx["turnContext"]["turnId"] == "t2"
            assert ctx["turnContext"]["snapshot"]["model"] == {"id": "m-t2"}
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "b1", "answer 1 again", "assistant", turnId="t1")
        async with real_host(data, kind="agent") as (_proc, c):
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "b1"]
            assert "system" not in {m["role"] for m in ctx["messages"]}
            assert ctx["turnContext"]["turnId"] == "t1"
            assert ctx["turnContext"]["snapshot"]["model"] == {"id": "m-t1"}
            # switching back to the first branch: its prompt stays deleted, its turn is the latest again
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 1})
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["q1", "a1", "a2"]
            assert ctx["turnContext"]["turnId"] == "t2"


# ---------------------------------------------------------------------------------------- snapshots (§4)

def _grep(data: Path, needle: bytes) -> list[str]:
    """Every file under the data directory whose bytes hold ``needle`` (the database, its WAL, the
    transcripts, the secret store: everything)."""
    return sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file() and needle in p.read_bytes())


async def test_no_secret_value_reaches_any_file_of_the_data_directory_across_rotations_and_kills(
        tmp_path: Path) -> None:
    """Seed 000 §4: "Secrets are not copied into the snapshot. It stores credential references ... allowing
    encrypted values behind the same reference to rotate." A secret set, used by a turn's snapshot by
    reference, rotated, and the host SIGKILLed after each step: no file of the data directory — database,
    WAL, transcript, revisions, secret store — holds either value in the clear, and the turn still verifies
    under the digest startTurn answered. The secret writes are keyed, so their receipts (database rows,
    the encrypted file's header, the receipts file a deleted secret leaves) are in the files too, and a
    replay of the first keyed write after a keyed delete writes no value either (seed 000 §2.4: the
    fingerprint "does not copy input text")."""
    data = data_dir(tmp_path)
    first, second = b"zq-first-secret-4d1c9e", b"zq-second-secret-8b27aa"
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("secrets.set", {"ref": "provider/p1", "value": first.decode(), "submissionId": "s-1"})
            sid = str((await c.call("session.create", {}))["id"])
            await say(c, sid, "q1", "go")
            started = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1",
                                                         "environment": _env("m1")})
            await say(c, sid, "a1", "done", "assistant", turnId="t1")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
        assert _grep(data, first) == []
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("secrets.set", {"ref": "provider/p1", "value": second.decode(), "submissionId": "s-2"})
        assert _grep(data, first) == [] and _grep(data, second) == []
        async with real_host(data, kind="agent") as (_proc, c):
            verified = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert verified["digest"] == started["environmentDigest"]
            await c.call("secrets.delete", {"ref": "provider/p1", "submissionId": "s-3"})
            await c.call("secrets.set", {"ref": "provider/p1", "value": first.decode(), "submissionId": "s-1"})
        assert _grep(data, first) == [] and _grep(data, second) == []


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


@pytest.mark.parametrize("shape", ["too deep", "too big"])
async def test_an_oversized_snapshot_written_on_disk_under_a_matching_digest_is_refused_after_a_restart(
        tmp_path: Path, shape: str) -> None:
    """Seed 000 §4: "Recovery rejects ... oversized structure". The stored snapshot is replaced while the
    host is stopped by one nested 40 levels deep, or one of 2 MiB, with its size and SHA-256 digest
    recomputed so that only the structure is wrong: every reader refuses it with CORRUPT_DATA after the
    restart (the context too: it is the latest turn on the active branch), and the untouched turn beside it
    reads back."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = str((await c.call("session.create", {}))["id"])
            for turn in ("t-ok", "t-bad"):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": turn, "environment": _env("m1")})
                await say(c, sid, f"q-{turn}", "go", turnId=turn)
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed"})
    bad = {**_env("m1"), "parameters": _deep(40)} if shape == "too deep" \
        else {**_env("m1"), "systemPrompt": "p" * (2 * 1024 * 1024)}
    body = orjson.dumps(bad, option=orjson.OPT_SORT_KEYS)
    conn = sqlite3.connect(data / "pi.sqlite")
    with conn:
        assert conn.execute("UPDATE run_snapshots SET snapshot_json = ?, size_bytes = ?, digest = ? "
                            "WHERE turn_id = 't-bad'",
                            (body.decode(), len(body), hashlib.sha256(body).hexdigest())).rowcount == 1
    conn.close()
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            await assert_snapshot_refused(c, sid, "t-bad")
            ok = await c.call("session.turnEnvironment", {"turnId": "t-ok"})
            assert ok["snapshot"]["model"] == {"id": "m1"}


# ----------------------------------------------------------------------------------------- receipts (§2.4)

async def _cut_by_replace(c: Any, sid: str) -> None:
    await c.call("session.replaceMessages", {"sessionId": sid, "messages": [msg("m3", "next")]})


async def _cut_by_truncate(c: Any, sid: str) -> None:
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "m1"})


@pytest.mark.parametrize("cut", [_cut_by_replace, _cut_by_truncate], ids=["replaceMessages", "truncateFrom"])
async def test_a_keyed_append_whose_line_a_rewrite_dropped_is_answered_after_a_lost_database(
        tmp_path: Path, cut: Any) -> None:
    """Seed 000 §2.4: "A completed receipt cannot be overwritten"; ARCHITECTURE.md: a receipt is as durable
    as its effect, and an append's rides in its line. A keyed append, then a rewrite that leaves its line out
    without archiving it (``session.replaceMessages`` without it, ``session.truncateFrom`` at it with no
    mode), a SIGKILL and a lost database: the retry answers the first answer and appends nothing. (It used
    to append the message again, at a new seq, answered ``replayed: false``: the receipt went with the line;
    the rewritten header now carries it with its answer.)"""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = str((await c.call("session.create", {}))["id"])
            keyed = {"sessionId": sid, "submissionId": "r-1", "message": msg("m1", "hello")}
            first = await c.call("session.appendMessage", keyed)
            await say(c, sid, "m2", "reply", "assistant")
            await say(c, sid, "m3", "next")
            await cut(c, sid)
            before = [m["id"] for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]]
        for path in data.glob("pi.sqlite*"):
            path.unlink()
        async with real_host(data, kind="agent") as (_proc, c):
            again = await c.call("session.appendMessage", keyed)
            after = [m["id"] for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]]
            assert after == before
            assert again["message"]["seq"] == first["message"]["seq"]
