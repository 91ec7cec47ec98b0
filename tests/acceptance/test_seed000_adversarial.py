"""Seed 000 read by an adversarial outsider, second pass: the variants a tester writing from the seed's text
would try that the first pass (test_seed000_outsider.py) does not — receipts retried after a SIGKILL and
after the database was lost, concurrent duplicates of one key, a history whose every message is
tombstoned, an orphaned subtree newer than the reachable leaf, the attachment budget at exactly its value
and one byte under, a snapshot tampered with on disk or sized at its limit, and branch switching that must
follow the newest descendants. Every test runs against real ``pi-host serve`` processes (SIGKILL between
steps) and speaks only the wire protocol of protocol/README.md."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import (
    assert_snapshot_refused,
    code_of,
    ctx_ids,
    data_dir,
    error_of,
    file_block,
    nested_branches,
    put_file,
    real_host,
    say,
)
from tests.hostkit import HostProcess, call_killed_at, msg
from tests.importers.test_pi_branches import HEADER, STAGE_3, entry


def lose_database(data: Path) -> None:
    """The index database is gone (a reset, a lost disk): every ``pi.sqlite*`` file is removed."""
    for path in data.glob("pi.sqlite*"):
        path.unlink()


def second_client(proc: HostProcess, client_id: str = "outsider", kind: str = "ui") -> Any:
    """Another connection to the same host process."""
    return open_client(proc.url, proc.token, client_id=client_id, client_kind=kind)


async def tree(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = await c.call("session.tree", {"sessionId": sid})
    return result


def transcript_lines(data: Path, sid: str) -> list[dict[str, Any]]:
    (path,) = [p for p in data.rglob(f"{sid}*.jsonl") if "revisions" not in p.name]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------ receipts x tombstones (§2.4, §3.3)

async def test_a_keyed_tombstone_retried_after_kill9_and_a_lost_database_is_answered_and_undoes_nothing(
        tmp_path: Path) -> None:
    """Seed 000 §2.4: "A completed receipt cannot be overwritten", and a retry with the same clientId +
    submissionId returns the stored response and does nothing else — across restarts. A tombstone keyed
    ``del-1`` is undone by ``restoreMessage`` (another key); the host is SIGKILLed and its database lost; the
    retry of ``del-1`` answers ``deleted: true`` again but must not hide the message a second time, and the
    same key sent with the restore's method is a conflict."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "question")
            await say(c, sid, "a1", "answer", "assistant")
            first = await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1",
                                                           "submissionId": "del-1"})
            assert first == {"messageId": "a1", "deleted": True}
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1", "submissionId": "res-1"})
            assert await ctx_ids(c, sid) == ["u1", "a1"]
        lose_database(data)
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["u1", "a1"]
            again = await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1",
                                                           "submissionId": "del-1"})
            assert again == first
            assert await ctx_ids(c, sid) == ["u1", "a1"], "the retry hid the restored message again"
            assert await code_of(c, "session.restoreMessage", {"sessionId": sid, "messageId": "a1",
                                                               "submissionId": "del-1"}) == "IDEMPOTENCY_CONFLICT"
            assert await code_of(c, "session.deleteMessage", {"sessionId": sid, "messageId": "u1",
                                                              "submissionId": "del-1"}) == "IDEMPOTENCY_CONFLICT"
            assert await ctx_ids(c, sid) == ["u1", "a1"]


async def test_one_key_sent_on_two_connections_at_once_writes_one_tombstone(tmp_path: Path) -> None:
    """Seed 000 §2.4 and protocol/README §4: two requests with the same clientId + submissionId that arrive
    at the same time run once; both get the one stored response. Eight concurrent copies of a keyed
    ``deleteMessage`` over two connections of one client leave exactly one tombstone line."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "question")
            await say(c, sid, "a1", "answer", "assistant")
            answers: list[Any] = []
            async with second_client(proc) as d:
                async def one(client: HostClient) -> None:
                    answers.append(await client.call("session.deleteMessage", {
                        "sessionId": sid, "messageId": "a1", "submissionId": "race-del"}))
                async with trio.open_nursery() as nursery:
                    for i in range(8):
                        nursery.start_soon(one, c if i % 2 else d)
            assert answers == [{"messageId": "a1", "deleted": True}] * 8
            before = transcript_lines(data, sid)
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["u1"]
            assert (await tree(c, sid))["activeLeafId"] == "u1"
    kinds = [line.get("type") for line in before]
    assert sum(1 for k in kinds if k not in ("session", "message", "session_info")) == 1, kinds


async def test_a_history_whose_every_message_is_tombstoned_derives_nothing_and_the_next_message_is_a_root(
        tmp_path: Path) -> None:
    """Seed 000 §3.3 + §4: context derivation skips tombstones and reconnects children to the visible
    ancestor. When nothing is visible, the derived history is empty and the leaf has no visible ancestor
    (also after a SIGKILL); a message appended then starts a new root, and restoring one tombstone brings
    exactly it back before the new message."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            for mid, role in (("u1", "user"), ("a1", "assistant"), ("u2", "user")):
                await say(c, sid, mid, f"text of {mid}", role)
            for mid in ("u2", "u1", "a1"):
                await c.call("session.deleteMessage", {"sessionId": sid, "messageId": mid})
            assert await ctx_ids(c, sid) == []
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == []
            t = await tree(c, sid)
            assert t.get("activeLeafId") is None
            assert all(n["deleted"] for n in t["nodes"])
            await say(c, sid, "u3", "fresh start")
            nodes = {n["id"]: n for n in (await tree(c, sid))["nodes"]}
            assert nodes["u3"].get("parentId") is None
            assert (await tree(c, sid))["activeLeafId"] == "u3"
            assert await ctx_ids(c, sid) == ["u3"]
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1"})
            assert await ctx_ids(c, sid) == ["a1", "u3"]
            nodes = {n["id"]: n for n in (await tree(c, sid))["nodes"]}
            assert nodes["u3"]["parentId"] == "a1"


async def test_a_tombstoned_leaf_survives_kill9_and_a_lost_database_and_restores_in_place(tmp_path: Path) -> None:
    """Seed 000 §1 "recovery replays nodes rather than deserializing a separate snapshot" and §3.3: the
    tombstone of the leaf is a durable node; after a SIGKILL and the loss of the database the replayed tree
    still ends at the visible ancestor, and restoring the message makes it the leaf again."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "q1")
            await say(c, sid, "a1", "r1", "assistant")
            await say(c, sid, "u2", "q2")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
        lose_database(data)
        async with real_host(data) as (_proc, c):
            t = await tree(c, sid)
            assert t["activeLeafId"] == "a1"
            assert {n["id"]: n["deleted"] for n in t["nodes"]} == {"u1": False, "a1": False, "u2": True}
            assert await ctx_ids(c, sid) == ["u1", "a1"]
            await c.call("session.restoreMessage", {"sessionId": sid, "messageId": "u2"})
            assert (await tree(c, sid))["activeLeafId"] == "u2"
            assert await ctx_ids(c, sid) == ["u1", "a1", "u2"]


async def test_a_keyed_tombstone_killed_after_its_line_is_durable_keeps_its_receipt(tmp_path: Path) -> None:
    """Seed 000 §2.4 + §3.3, SIGKILL at the worst moment: the tombstone line of a keyed ``deleteMessage`` is
    fsynced and the host dies before it answers (and before any index commit). The effect never exists
    without its receipt: after the restart the retry answers ``deleted: true`` and writes no second
    tombstone, and the same key naming another message is IDEMPOTENCY_CONFLICT and hides nothing."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "question")
            await say(c, sid, "a1", "answer", "assistant")
        params = {"sessionId": sid, "messageId": "a1", "submissionId": "del-k"}
        await call_killed_at(data, "append.after_fsync", "session.deleteMessage", params, client_id="outsider")
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["u1"]
            assert await code_of(c, "session.deleteMessage", {**params, "messageId": "u1"}) == "IDEMPOTENCY_CONFLICT"
            assert await c.call("session.deleteMessage", params) == {"messageId": "a1", "deleted": True}
            assert await ctx_ids(c, sid) == ["u1"]
    lines = transcript_lines(data, sid)
    assert sum(1 for line in lines if line.get("type") not in ("session", "message", "session_info")) == 1


async def test_a_keyed_regenerate_killed_after_archiving_makes_one_sibling_once(tmp_path: Path) -> None:
    """Seed 000 §3.2 ("Regeneration appends a new assistant branch under the user message") + §2.4, SIGKILL at
    the worst moment: the regenerate's archive of the cut reply is written and the host dies before the
    transcript is rewritten. After the restart the keyed retry answers once and the tree holds the old reply
    as exactly one archived sibling — never two copies, never lost."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "q", "question")
            await say(c, sid, "r0", "first reply", "assistant")
        params = {"sessionId": sid, "messageId": "r0", "mode": "regenerate", "submissionId": "regen-k"}
        await call_killed_at(data, "revisions.after_write", "session.truncateFrom", params, client_id="outsider")
        async with real_host(data) as (_proc, c):
            first = await c.call("session.truncateFrom", params)
            assert await c.call("session.truncateFrom", params) == first
            await say(c, sid, "r1", "second reply", "assistant")
            t = await tree(c, sid)
            replies = [(n["messageId"], n["active"]) for n in t["nodes"] if n["role"] == "assistant"]
            assert replies == [("r0", False), ("r1", True)], t
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q", "r0"]


async def test_a_stale_keyed_edit_retried_after_later_rewrites_and_a_lost_database_changes_nothing(
        tmp_path: Path) -> None:
    """Seed 000 §2.4 + §3.2: an edit keyed ``edit-1`` is followed by a regenerate keyed ``regen-2`` (each
    rewrite archives a branch); the host is SIGKILLed and its database lost. The late retry of ``edit-1``
    answers what it answered and cuts nothing: the newest branch stays the visible history."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "q", "question")
            await say(c, sid, "r0", "reply", "assistant")
            edit = {"sessionId": sid, "messageId": "q", "mode": "edit", "submissionId": "edit-1"}
            first = await c.call("session.truncateFrom", edit)
            await say(c, sid, "q", "question, edited")
            await say(c, sid, "r1", "reply to the edit", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "r1", "mode": "regenerate",
                                                  "submissionId": "regen-2"})
            await say(c, sid, "r2", "regenerated reply", "assistant")
        lose_database(data)
        async with real_host(data) as (_proc, c):
            again = await c.call("session.truncateFrom", edit)
            assert again["removed"] == first["removed"]
            assert again["session"]["id"] == first["session"]["id"]
            assert await ctx_ids(c, sid) == ["q", "r2"]
            assert (await tree(c, sid))["activeLeafId"] == "r2"


# ---------------------------------------------------------------------------------- branches (§3.2)

async def test_switching_back_to_a_branch_follows_its_newest_descendants(tmp_path: Path) -> None:
    """Seed 000 §3.2: "The branch selector orders siblings by sequence and follows the newest default
    descendants when switching." Branch B of the first reply itself grew a regenerated second reply; after
    switching to branch A and back to B, the history ends at B's newest second reply, not its first. The
    same holds after a SIGKILL."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await nested_branches(c, sid)
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2x"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 1})
            assert await ctx_ids(c, sid) == ["q1", "a1"]
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "q1", "revisionIndex": 2})
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2x"]
            assert (await tree(c, sid))["activeLeafId"] == "b2x"
        async with real_host(data) as (_proc, c):
            assert await ctx_ids(c, sid) == ["q1", "b1", "q2", "b2x"]
            t = await tree(c, sid)
            assert t["activeLeafId"] == "b2x"
            seconds = [n["messageId"] for n in t["nodes"] if n.get("parentId") == "q2"]
            assert seconds == ["b2", "b2x"]


# ---------------------------------------------------------------------------------- integrity (§3.4)

def _pi_file(root: Path, entries: list[dict[str, Any]]) -> Path:
    sid = "019e19b4-0000-7000-8000-00000000ad00"
    path = root / "orphans" / f"2026-05-12T01-02-27-657Z_{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in [{**HEADER, "id": sid}, *entries]))
    return path


async def test_an_orphaned_subtree_newer_than_every_reachable_leaf_is_not_the_fallback_and_one_notice_stays(
        tmp_path: Path) -> None:
    """Seed 000 §3.4: "Corrupt data falls back to the highest-sequence reachable leaf and produces a system
    notice." The file's last entries form a subtree under a missing parent (e9 → e10 → e11): the highest
    sequence overall is unreachable, so the fallback is e8, the highest *reachable* leaf. The notice is
    produced once: a SIGKILL, the loss of the database and a second import of the unchanged file do not
    add another."""
    data = data_dir(tmp_path)
    entries = [*STAGE_3, entry("e9", "gone", "user", "orphan q", 9),
               entry("e10", "e9", "assistant", "orphan a", 10), entry("e11", "e10", "user", "orphan q2", 11)]
    source = _pi_file(tmp_path / "src", entries)

    async def check(c: HostClient, sid: str) -> None:
        page = await c.call("session.get", {"sessionId": sid, "full": True})
        notices = [m for m in page["messages"] if m["role"] == "system"]
        assert len(notices) == 1, notices
        assert notices[0]["meta"]["corruptLeaf"]["fallback"] == "e8"
        ctx = await c.call("session.context", {"sessionId": sid})
        assert [m["blocks"][0]["text"] for m in ctx["messages"]][-1] == "a3 on A"
        assert "system" not in {m["role"] for m in ctx["messages"]}

    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            await c.call("import.sessions", {"source": "pi", "root": str(source)})
            (sid,) = [s["id"] for s in (await c.call("session.list", {"limit": 50}))["sessions"]]
            await check(c, sid)
        lose_database(data)
        async with real_host(data) as (_proc, c):
            await check(c, sid)
            again = await c.call("import.sessions", {"source": "pi", "root": str(source)})
            assert again["counts"]["new"] == 0
            await check(c, sid)
        async with real_host(data) as (_proc, c):
            await check(c, sid)


# -------------------------------------------------------------------------- snapshots (§4)

def _env(**extra: Any) -> dict[str, Any]:
    return {"version": 1, "connection": {"baseUrl": "https://api.example.test", "apiStyle": "messages"},
            "model": {"id": "m1"}, "systemPrompt": "be careful", "credentialRefs": ["provider/p1"],
            "browserSubmissionContext": {"origin": "https://app.example", "url": "https://app.example/form",
                                         "method": "POST", "cookieRef": "secret:browser-session"}, **extra}


async def test_a_keyed_start_turn_retried_after_kill9_answers_the_stored_snapshot_and_a_changed_one_conflicts(
        tmp_path: Path) -> None:
    """Seed 000 §2.4 + §4: the snapshot is fixed before execution under its digest; a retry of the keyed
    ``startTurn`` after a SIGKILL answers the stored response (same digest) whatever the restart did to the
    turn, and the same key with a snapshot that differs only in its browser submission context is an
    IDEMPOTENCY_CONFLICT that stores nothing."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            params = {"sessionId": sid, "turnId": "t1", "environment": _env(), "submissionId": "start-1"}
            first = await c.call("session.startTurn", params)
        async with real_host(data, kind="agent") as (_proc, c):
            again = await c.call("session.startTurn", params)
            assert again == first
            changed = {**params, "environment": _env(browserSubmissionContext={"origin": "https://other.example"})}
            assert await code_of(c, "session.startTurn", changed) == "IDEMPOTENCY_CONFLICT"
            stored = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert stored["digest"] == first["environmentDigest"]
            assert stored["snapshot"]["browserSubmissionContext"]["origin"] == "https://app.example"


async def test_a_snapshot_edited_on_disk_under_its_old_digest_is_refused_after_a_restart(tmp_path: Path) -> None:
    """Seed 000 §4: "Recovery rejects ... digest mismatch". The stored snapshot's browser submission context
    is changed behind the host's back (digest and version untouched); after a SIGKILL and restart every
    reader refuses it with CORRUPT_DATA, and an untouched sibling turn still reads back."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-ok", "environment": _env()})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t-ok", "status": "completed"})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t-bad", "environment": _env()})
            await say(c, sid, "u1", "go", turnId="t-bad")
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t-bad", "status": "completed"})
    conn = sqlite3.connect(data / "pi.sqlite")
    with conn:
        (raw,) = conn.execute("SELECT snapshot_json FROM run_snapshots WHERE turn_id = 't-bad'").fetchone()
        tampered = raw.replace("https://app.example/form", "https://evil.example/form")
        assert tampered != raw
        conn.execute("UPDATE run_snapshots SET snapshot_json = ? WHERE turn_id = 't-bad'", (tampered,))
    conn.close()
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            await assert_snapshot_refused(c, sid, "t-bad")
            ok = await c.call("session.turnEnvironment", {"turnId": "t-ok"})
            assert ok["snapshot"]["browserSubmissionContext"]["url"] == "https://app.example/form"


def _canonical_size(snapshot: dict[str, Any]) -> int:
    """The size of canonical JSON as an outsider computes it: sorted keys, no whitespace, UTF-8."""
    return len(json.dumps(snapshot, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def _nested(levels: int) -> dict[str, Any]:
    """An object ``levels`` objects deep."""
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"n": value}
    return value


async def test_snapshot_size_and_depth_limits_refuse_only_past_the_limit(tmp_path: Path) -> None:
    """Seed 000 §4 "Recovery rejects ... oversized structure" with protocol/README §7's limit (1 MiB of
    canonical JSON, nesting depth 32), at the edges: a snapshot of exactly 1,048,576 bytes of canonical JSON
    (leaving most sections out) and one exactly 32 levels deep are stored and read back verified after a
    SIGKILL; one byte more, or one level more, is refused and stores nothing. (The host used to count the
    empty sections it fills in for what the client left out, and refused the exact-limit snapshot.)"""
    data = data_dir(tmp_path)
    limit = 1024 * 1024
    exact: dict[str, Any] = {"version": 1, "systemPrompt": "", "model": {"id": "m1"}}
    exact["systemPrompt"] = "p" * (limit - _canonical_size(exact))
    assert _canonical_size(exact) == limit
    over = {**exact, "systemPrompt": exact["systemPrompt"] + "p"}
    deep = {"version": 1, "parameters": _nested(31)}  # the snapshot object is the first level
    too_deep = {"version": 1, "parameters": _nested(32)}
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            started = {}
            for turn, env in (("t-exact", exact), ("t-deep", deep)):
                started[turn] = await c.call("session.startTurn", {"sessionId": sid, "turnId": turn,
                                                                   "environment": env})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn, "status": "completed"})
            code, err = await error_of(c, "session.startTurn", {"sessionId": sid, "turnId": "t-over",
                                                                 "environment": over})
            assert (code, err.get("size"), err.get("limit")) == ("PAYLOAD_TOO_LARGE", limit + 1, limit)
            code, _ = await error_of(c, "session.startTurn", {"sessionId": sid, "turnId": "t-too-deep",
                                                              "environment": too_deep})
            assert code == "INVALID_PARAMS"
        async with real_host(data, kind="agent") as (_proc, c):
            for turn in ("t-exact", "t-deep"):
                back = await c.call("session.turnEnvironment", {"turnId": turn})
                assert back["digest"] == started[turn]["environmentDigest"]
            assert (await c.call("session.turnEnvironment", {"turnId": "t-exact"}))["snapshot"]["systemPrompt"] \
                == exact["systemPrompt"]
            assert await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t-exact"})
            for gone in ("t-over", "t-too-deep"):
                assert await code_of(c, "session.turnEnvironment", {"turnId": gone}) == "NOT_FOUND"


async def test_a_secret_rotated_twice_across_kills_still_verifies_and_a_swapped_reference_is_drift(
        tmp_path: Path) -> None:
    """Seed 000 §4: recovery allows "encrypted values behind the same reference to rotate" but rejects
    binding drift. The secret behind the snapshot's reference is rotated twice, with a SIGKILL after each;
    verification still passes with the same digest, and the snapshot never holds a secret value. A
    reference that is gone is drift."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            await c.call("secrets.set", {"ref": "provider/p1", "value": "first-value"})
            sid = (await c.call("session.create", {}))["id"]
            started = await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": _env()})
        for value in ("second-value", "third-value"):
            async with real_host(data, kind="agent") as (_proc, c):
                await c.call("secrets.set", {"ref": "provider/p1", "value": value})
        async with real_host(data, kind="agent") as (_proc, c):
            verified = await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert verified["digest"] == started["environmentDigest"]
            stored = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert not any(v in json.dumps(stored) for v in ("first-value", "second-value", "third-value"))
            await c.call("secrets.delete", {"ref": "provider/p1"})
            code, err = await error_of(c, "session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
            assert code == "ENVIRONMENT_DRIFT"
            assert [d["field"] for d in err["drift"]] == ["credentialRefs[0]"]


# ----------------------------------------------------------------------- attachments budget (§2.3, §5)


async def test_the_budget_is_200_mb_and_eviction_starts_only_one_byte_past_it(tmp_path: Path) -> None:
    """Seed 000 §2.3/§5: a separate 200 MB management budget; cleanup removes the oldest attachments outside
    the active Thread "after the 200 MB budget". The default budget is 200 MB (209,715,200 bytes); usage of
    exactly the budget evicts nothing, a budget one byte below usage evicts exactly the oldest blob outside
    the active session — and a keyed retry of that GC after a SIGKILL answers the same and evicts nothing
    more, although usage is still over a budget lowered meanwhile."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            assert (await c.call("attachments.estimate", {}))["budgetBytes"] == 200 * 1024 * 1024
            active = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            blobs = [await put_file(c, bytes([fill])) for fill in b"abc"]
            mine = await put_file(c, b"m")
            for i, blob in enumerate(blobs):
                await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                    f"o{i}", "x", blocks=[file_block(blob)])})
            await c.call("session.appendMessage", {"sessionId": active, "message": msg(
                "k1", "x", blocks=[file_block(mine)])})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 4000})
            at = await c.call("attachments.gc", {"activeSessionId": active})
            assert at["evicted"] == [] and at["estimate"]["usedBytes"] == 4000
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 3999})
            over = await c.call("attachments.gc", {"activeSessionId": active, "submissionId": "gc-1"})
            assert over["evicted"] == [blobs[0]["sha256"]]
            assert over["estimate"]["usedBytes"] == 3000
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 1000})
        async with real_host(data) as (_proc, c):
            again = await c.call("attachments.gc", {"activeSessionId": active, "submissionId": "gc-1"})
            assert again == over
            states = [(await c.call("attachments.get", {"sha256": b["sha256"]}))["deletionState"]
                      for b in (*blobs, mine)]
            assert states == ["evicted", "live", "live", "live"]
            assert await code_of(c, "attachments.gc", {"activeSessionId": other,
                                                       "submissionId": "gc-1"}) == "IDEMPOTENCY_CONFLICT"


async def test_the_default_budget_holds_exactly_200_mb_and_one_byte_more_evicts(tmp_path: Path) -> None:
    """Seed 000 §2.3/§5 at the default budget itself: a 200 MB blob (209,715,200 bytes, imported from a
    sparse file) fills the budget exactly — 100 %, a warning, and GC evicts nothing; one more byte stored
    puts usage one byte past the budget, and GC then evicts the oldest blob outside the active session (the
    big one, not the newer byte the active session holds)."""
    data = tmp_path / "data"
    (data / "scratch").mkdir(parents=True)
    big_file = data / "scratch" / "big.bin"
    with big_file.open("wb") as f:
        f.truncate(200 * 1024 * 1024)
    with trio.fail_after(90):
        async with real_host(data) as (_proc, c):
            big = await c.call("attachments.importFile", {"path": str(big_file), "mimeType": "application/x-raw"})
            big_file.unlink()
            assert big["size"] == 209_715_200
            at = await c.call("attachments.estimate", {})
            assert (at["usedBytes"], at["budgetBytes"], at["percent"], at["warning"]) == (
                209_715_200, 209_715_200, 100.0, True)
            active = (await c.call("session.create", {}))["id"]
            assert (await c.call("attachments.gc", {"activeSessionId": active}))["evicted"] == []
            byte = await put_file(c, b"!", 1)
            await c.call("session.appendMessage", {"sessionId": active, "message": msg(
                "k1", "x", blocks=[file_block(byte)])})
            gc = await c.call("attachments.gc", {"activeSessionId": active})
            assert gc["evicted"] == [big["sha256"]]
            assert gc["estimate"]["usedBytes"] == 1
            assert (await c.call("attachments.get", {"sha256": byte["sha256"]}))["deletionState"] == "live"


async def test_an_evicted_blobs_references_stay_marked_after_the_database_is_lost(tmp_path: Path) -> None:
    """Seed 000 §2.3: "Eviction marks references before deleting bytes" — the marks are what tell a reader
    the bytes are gone. After an eviction, a SIGKILL and the loss of the database, the rebuilt host must
    not show the block as if its bytes were there: ``session.get`` and ``session.context`` read it back
    ``evicted: true`` and ``attachments.get`` says ``evicted``; storing the bytes again revives it and
    clears the marks. (The marks used to live in the database only: the block read back unmarked and
    ``attachments.get`` answered NOT_FOUND.)"""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            active = (await c.call("session.create", {}))["id"]
            other = (await c.call("session.create", {}))["id"]
            gone = await put_file(c, b"g")
            await c.call("session.appendMessage", {"sessionId": other, "message": msg(
                "o1", "x", blocks=[{"type": "text", "text": "see"}, file_block(gone)])})
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 10})
            assert (await c.call("attachments.gc", {"activeSessionId": active}))["evicted"] == [gone["sha256"]]
        lose_database(data)
        async with real_host(data) as (_proc, c):
            (message,) = (await c.call("session.get", {"sessionId": other}))["messages"]
            assert message["blocks"][1].get("evicted") is True
            (message,) = (await c.call("session.context", {"sessionId": other}))["messages"]
            assert [b.get("evicted") for b in message["blocks"] if b["type"] == "attachment"] == [True]
            assert (await c.call("attachments.get", {"sha256": gone["sha256"]}))["deletionState"] == "evicted"
            assert (await c.call("attachments.estimate", {}))["usedBytes"] == 0
            await put_file(c, b"g")
            assert (await c.call("attachments.get", {"sha256": gone["sha256"]}))["deletionState"] == "live"
            assert (await c.call("attachments.estimate", {}))["usedBytes"] == 1000
            (message,) = (await c.call("session.get", {"sessionId": other}))["messages"]
            assert "evicted" not in message["blocks"][1]


async def test_concurrent_copies_of_a_keyed_gc_evict_once_and_answer_alike(tmp_path: Path) -> None:
    """Seed 000 §5 with §2.4: four copies of one keyed ``attachments.gc`` sent at once on two connections run
    once: every copy answers the same eviction (the oldest blob outside the active session, which brings
    usage under the budget), and no copy evicts another blob."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (proc, c):
            active = (await c.call("session.create", {}))["id"]
            blobs = [await put_file(c, bytes([fill])) for fill in b"xyz"]
            await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 2500})
            answers: list[Any] = []
            async with second_client(proc) as d:
                async def one(client: HostClient) -> None:
                    answers.append(await client.call("attachments.gc", {"activeSessionId": active,
                                                                        "submissionId": "gc-race"}))
                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(one, c if i % 2 else d)
            assert len(answers) == 4 and all(a == answers[0] for a in answers)
            assert answers[0]["evicted"] == [blobs[0]["sha256"]]
            states = [(await c.call("attachments.get", {"sha256": b["sha256"]}))["deletionState"] for b in blobs]
            assert states == ["evicted", "live", "live"]


# ------------------------------------------------------------------- approvals and interactions

async def test_racing_answers_to_one_approval_leave_one_winner_and_a_keyed_answer_replays_after_kill9(
        tmp_path: Path) -> None:
    """Seed 000 §2 (approvals, interactions: pending and resolved user RPC state) with §2.4: two UIs answer
    one approval at once with different keys — exactly one wins, the other is CONFLICT. The winner's keyed
    answer, retried after a SIGKILL, is answered from its receipt (not refused as interrupted or answered);
    a question answered the same way replays too."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc):
            sid = (await sc.call("session.create", {}))["id"]
            await sc.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            rid = (await sc.call("approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                       "risk": "high"}))["request"]["requestId"]
            qid = (await sc.call("interactions.request", {"sessionId": sid, "turnId": "t1", "question": "which?",
                                                          "allowFreeText": True}))["request"]["requestId"]
            outcomes: dict[str, Any] = {}
            async with second_client(proc, "ui-a") as ua, second_client(proc, "ui-b") as ub:
                async def answer(ui: HostClient, key: str, option: str) -> None:
                    outcomes[key] = await error_of(ui, "approvals.respond", {
                        "sessionId": sid, "requestId": rid, "optionId": option, "submissionId": key})
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(answer, ua, "ans-a", "allow_once")
                    nursery.start_soon(answer, ub, "ans-b", "deny")
                codes = sorted(str(code) for code, _ in outcomes.values())
                assert codes == ["CONFLICT", "None"], outcomes
                winner = "ans-a" if outcomes["ans-a"][0] is None else "ans-b"
                option = "allow_once" if winner == "ans-a" else "deny"
                won = await (ua if winner == "ans-a" else ub).call("approvals.respond", {
                    "sessionId": sid, "requestId": rid, "optionId": option, "submissionId": winner})
                said = await ua.call("interactions.respond", {"sessionId": sid, "requestId": qid, "answer": {
                    "choiceIds": [], "text": "the first"}, "submissionId": "say-1"})
        async with real_host(data, client_id="ui-a" if winner == "ans-a" else "ui-b") as (_proc, ui):
            assert await ui.call("approvals.respond", {"sessionId": sid, "requestId": rid, "optionId": option,
                                                       "submissionId": winner}) == won
        async with real_host(data, client_id="ui-a") as (_proc, ui):
            assert await ui.call("interactions.respond", {"sessionId": sid, "requestId": qid, "answer": {
                "choiceIds": [], "text": "the first"}, "submissionId": "say-1"}) == said
            code, err = await error_of(ui, "interactions.respond", {"sessionId": sid, "requestId": qid, "answer": {
                "choiceIds": [], "text": "another"}, "submissionId": "say-2"})
            assert code == "CONFLICT"


# ------------------------------------------------------------------------------ more receipts (§2.4)

async def test_a_key_belongs_to_its_client_and_a_failure_leaves_no_receipt(tmp_path: Path) -> None:
    """Seed 000 §2.4: "The receipt key is clientId + submissionId." Another client sending the same
    submissionId is another request: it runs (no replay, no conflict). And only a terminal success is
    stored: a keyed tombstone of a message that does not exist yet fails, and its retry once the message
    exists runs for real."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, client_id="client-a") as (proc, a):
            sid = (await a.call("session.create", {}))["id"]
            await say(a, sid, "u1", "question")
            assert await code_of(a, "session.deleteMessage", {"sessionId": sid, "messageId": "a1",
                                                              "submissionId": "k"}) == "MESSAGE_NOT_FOUND"
            await say(a, sid, "a1", "answer", "assistant")
            assert await a.call("session.deleteMessage", {"sessionId": sid, "messageId": "a1",
                                                          "submissionId": "k"}) == {"messageId": "a1", "deleted": True}
            assert await ctx_ids(a, sid) == ["u1"]
            async with second_client(proc, "client-b") as b:
                assert await b.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1",
                                                               "submissionId": "k"}) == {"messageId": "a1",
                                                                                         "deleted": False}
            assert await ctx_ids(a, sid) == ["u1", "a1"]
        async with real_host(data, client_id="client-b") as (_proc, b):
            assert await b.call("session.restoreMessage", {"sessionId": sid, "messageId": "a1",
                                                           "submissionId": "k"}) == {"messageId": "a1",
                                                                                     "deleted": False}
            assert await code_of(b, "session.deleteMessage", {"sessionId": sid, "messageId": "a1",
                                                              "submissionId": "k"}) == "IDEMPOTENCY_CONFLICT"
            assert await ctx_ids(b, sid) == ["u1", "a1"]


async def test_concurrent_copies_of_a_keyed_start_turn_start_one_turn(tmp_path: Path) -> None:
    """Seed 000 §2.4 + §4: six copies of one keyed ``startTurn`` (with its snapshot) sent at once on two
    connections start one turn with one snapshot; every copy gets the same answer, and a differently keyed
    start of another turn meanwhile is a CONFLICT (one running turn per session)."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            params = {"sessionId": sid, "turnId": "t1", "environment": _env(), "submissionId": "start-race"}
            answers: list[Any] = []
            async with second_client(proc, kind="agent") as d:
                async def one(client: HostClient) -> None:
                    answers.append(await client.call("session.startTurn", params))
                async with trio.open_nursery() as nursery:
                    for i in range(6):
                        nursery.start_soon(one, c if i % 2 else d)
            assert len(answers) == 6 and all(a == answers[0] for a in answers)
            assert await code_of(c, "session.startTurn", {"sessionId": sid, "turnId": "t2",
                                                          "submissionId": "start-other"}) == "CONFLICT"
            turns = (await c.call("session.listTurns", {"sessionId": sid}))["turns"]
            assert [t["id"] for t in turns] == ["t1"]


# ------------------------------------------------------------------------------ tombstone x rewrite

async def test_a_tombstone_does_not_hide_a_new_message_that_reuses_the_id_after_an_edit(tmp_path: Path) -> None:
    """Seed 000 §3.2 + §3.3: a tombstone hides one node. The user deletes their last prompt, then edits it
    (the edit reuses the id, as the first pass's root edits do): the edited prompt is a new sibling node and
    must be visible, in the tree and in the context, also after a SIGKILL; the deleted original stays
    deleted on its archived branch."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u1", "q1")
            await say(c, sid, "a1", "r1", "assistant")
            await say(c, sid, "u2", "q2 original")
            await say(c, sid, "a2", "r2", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "u2"})
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
            await say(c, sid, "u2", "q2 edited")
            assert await ctx_ids(c, sid) == ["u1", "a1", "u2"]
        async with real_host(data) as (_proc, c):
            ctx = await c.call("session.context", {"sessionId": sid})
            assert [m["id"] for m in ctx["messages"]] == ["u1", "a1", "u2"]
            assert ctx["messages"][-1]["blocks"][0]["text"] == "q2 edited"
            t = await tree(c, sid)
            assert t["activeLeafId"] == "u2"
            live = [n for n in t["nodes"] if n["active"]]
            assert [(n["messageId"], n["deleted"]) for n in live] == [("u1", False), ("a1", False), ("u2", False)]


# ------------------------------------------------------------------------------ thread delete (§3.3)

async def test_appends_racing_a_thread_delete_never_resurrect_it(tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete first stops admission ... then deletes Thread nodes ..." Twenty appends
    on two other connections race a keyed delete: whatever was admitted before it goes with the session,
    everything after it is SESSION_NOT_FOUND, and after a SIGKILL and a restart the session is still gone
    (no stub, no transcript) while the delete's retry answers what it answered."""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data) as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await say(c, sid, "u0", "before")
            codes: list[str | None] = []
            deleted: list[Any] = []
            async with second_client(proc, "writer-1") as w1, second_client(proc, "writer-2") as w2:
                async def append(client: HostClient, i: int) -> None:
                    codes.append(await code_of(client, "session.appendMessage", {
                        "sessionId": sid, "message": msg(f"m{i}", f"racing {i}")}))
                async def delete() -> None:
                    await trio.sleep(0.01)
                    deleted.append(await c.call("session.delete", {"sessionId": sid, "submissionId": "del-t"}))
                async with trio.open_nursery() as nursery:
                    for i in range(20):
                        nursery.start_soon(append, w1 if i % 2 else w2, i)
                    nursery.start_soon(delete)
                assert set(codes) <= {None, "SESSION_NOT_FOUND"}, codes
                for client in (w1, w2):
                    assert await code_of(client, "session.appendMessage", {
                        "sessionId": sid, "message": msg("late", "late")}) == "SESSION_NOT_FOUND"
        async with real_host(data) as (_proc, c):
            assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
            assert await code_of(c, "session.appendMessage", {
                "sessionId": sid, "message": msg("later", "later")}) == "SESSION_NOT_FOUND"
            assert await c.call("session.delete", {"sessionId": sid, "submissionId": "del-t"}) == deleted[0]
            assert sid not in json.dumps(await c.call("session.list", {"limit": 50}))
    assert not [p for p in data.rglob(f"*{sid}*") if p.suffix == ".jsonl"]


async def test_a_retry_with_its_params_in_another_key_order_is_the_same_request(tmp_path: Path) -> None:
    """Seed 000 §2.4: the fingerprint is of the request, not of its bytes on the wire (transport identity
    excluded). A keyed startTurn and a keyed append retried after a SIGKILL with every object's keys in
    reverse order — nested snapshot sections and message blocks included — are replays, not conflicts."""
    data = data_dir(tmp_path)

    def reversed_keys(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reversed_keys(value[k]) for k in reversed(list(value))}
        if isinstance(value, list):
            return [reversed_keys(v) for v in value]
        return value

    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            start = {"sessionId": sid, "turnId": "t1", "environment": _env(parameters={"a": 1, "b": {"c": 2, "d": 3}}),
                     "submissionId": "start-order"}
            append = {"sessionId": sid, "submissionId": "append-order", "message": msg(
                "m1", "hello", blocks=[{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}],
                turnId="t1")}
            started = await c.call("session.startTurn", start)
            appended = await c.call("session.appendMessage", append)
        async with real_host(data, kind="agent") as (_proc, c):
            assert await c.call("session.startTurn", reversed_keys(start)) == started
            assert await c.call("session.appendMessage", reversed_keys(append)) == appended
            page = await c.call("session.get", {"sessionId": sid})
            assert [m["id"] for m in page["messages"]] == ["m1"]


async def test_a_thread_deleted_mid_turn_is_not_brought_back_by_its_checkpoint_after_kill9(tmp_path: Path) -> None:
    """Seed 000 §3.3: "thread.delete first stops admission and active or recovered execution, then deletes
    Thread nodes, attachments, Runs, approvals, interactions ...". A session is deleted while its turn
    streams (a checkpoint saved, a question pending); the sidecar's late calls are refused; after a SIGKILL
    the boot's in-flight sweep must not promote the checkpoint into a resurrected session, and nothing of
    the turn is left to answer."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, kind="agent", client_id="sidecar") as (proc, sc):
            sid = (await sc.call("session.create", {}))["id"]
            await say(sc, sid, "u1", "question")
            await sc.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": _env()})
            await sc.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                          "message": msg("a1", "partial", role="assistant")})
            qid = (await sc.call("interactions.request", {"sessionId": sid, "turnId": "t1", "question": "which?",
                                                          "allowFreeText": True}))["request"]["requestId"]
            async with second_client(proc, "ui") as ui:
                await ui.call("session.delete", {"sessionId": sid})
                assert await code_of(ui, "interactions.respond", {"sessionId": sid, "requestId": qid, "answer": {
                    "choiceIds": [], "text": "late"}}) is not None
            for method, params in (
                    ("session.saveInflightMessage", {"sessionId": sid, "turnId": "t1",
                                                     "message": msg("a1", "more", role="assistant")}),
                    ("session.appendMessage", {"sessionId": sid, "message": msg("a1", "final", role="assistant",
                                                                                 turnId="t1")})):
                assert await code_of(sc, method, params) == "SESSION_NOT_FOUND", method
        async with real_host(data, kind="agent", client_id="sidecar") as (_proc, sc):
            assert await code_of(sc, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
            assert sid not in json.dumps(await sc.call("session.list", {"limit": 50}))
            assert (await sc.call("interactions.pending", {}))["pending"] == []
            assert await code_of(sc, "session.turnEnvironment", {"turnId": "t1"}) == "NOT_FOUND"
            status = await sc.call("host.status", {})
            assert sid not in json.dumps(status.get("boot", {}).get("inflight", []))
    assert not [p for p in data.rglob(f"*{sid}*") if p.is_file()]


async def test_one_message_id_in_two_threads_is_tombstoned_only_where_it_was_deleted(tmp_path: Path) -> None:
    """Seed 000 §3.3/§3.4 ("A parent must exist in the same Thread"): nodes belong to their Thread. Two
    sessions each hold a message the client named ``m1``; tombstoning it in the second hides it there only,
    also after a SIGKILL and the loss of the database; restoring it there brings it back there only."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data) as (_proc, c):
            first = (await c.call("session.create", {}))["id"]
            second = (await c.call("session.create", {}))["id"]
            for sid in (first, second):
                await say(c, sid, "m1", f"hello from {sid}")
                await say(c, sid, "m2", "reply", "assistant")
            await c.call("session.deleteMessage", {"sessionId": second, "messageId": "m1"})
        lose_database(data)
        async with real_host(data) as (_proc, c):
            assert len(await ctx_ids(c, first)) == 2
            assert len(await ctx_ids(c, second)) == 1
            first_tree = await tree(c, first)
            assert not any(n["deleted"] for n in first_tree["nodes"])
            await c.call("session.restoreMessage", {"sessionId": second, "messageId": "m1"})
            await c.call("session.deleteMessage", {"sessionId": first, "messageId": "m2"})
            assert len(await ctx_ids(c, second)) == 2
            assert len(await ctx_ids(c, first)) == 1


async def test_a_receipt_keeps_a_fingerprint_not_the_input_text(tmp_path: Path) -> None:
    """Seed 000 §2.4: the receipt "stores command type, status, terminal response, and an optional SHA-256
    request fingerprint. The fingerprint excludes transport identity and does not copy input text." After
    keyed calls whose input carries text their answers do not echo (an append, a start with a system prompt,
    a queued prompt), no receipt — neither the database rows nor the receipt an append carries in its
    transcript line — holds that text; the fingerprint is a SHA-256 hex digest. Checked after a SIGKILL."""
    data = data_dir(tmp_path)
    marker = "zq-unrepeatable-input-text-7f3a"
    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "submissionId": "r-append",
                                                   "message": msg("m1", f"user says {marker}")})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "submissionId": "r-start",
                                               "environment": _env(systemPrompt=f"prompt {marker}")})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed",
                                             "submissionId": "r-end"})
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        rows = conn.execute("SELECT submission_id, method, status, response_json, fingerprint "
                            "FROM command_receipts WHERE submission_id LIKE 'r-%'").fetchall()
    finally:
        conn.close()
    assert {r[0] for r in rows} == {"r-append", "r-start", "r-end"}
    for submission, _method, _status, response, fingerprint in rows:
        assert marker not in (response or "") and marker not in fingerprint, submission
        assert len(fingerprint) == 64 and int(fingerprint, 16) >= 0, submission
    (line,) = [line for line in transcript_lines(data, sid) if line.get("id") == "m1"]
    assert json.dumps(line).count(marker) == 1  # the message itself, not a copy in its receipt


async def test_a_replayed_secret_write_never_rolls_a_rotated_secret_back(tmp_path: Path) -> None:
    """Seed 000 §4 ("allowing encrypted values behind the same reference to rotate") with §2.4: the secret
    behind a snapshot's reference is set (key ``sec-1``) and rotated (key ``sec-2``); after a SIGKILL the
    first write is retried with its key and its old value. The retry is answered from its receipt and must
    not put the old value back: the reference still holds the rotated one and the snapshot still verifies.
    (After the loss of the database such a stale retry is not recognised: protocol/README §4 keeps only the
    latest write's receipt in the secret's file.)"""
    data = data_dir(tmp_path)
    with trio.fail_after(90):
        async with real_host(data, kind="agent") as (_proc, c):
            first = await c.call("secrets.set", {"ref": "provider/p1", "value": "old-value", "submissionId": "sec-1"})
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": _env()})
            await c.call("secrets.set", {"ref": "provider/p1", "value": "rotated-value", "submissionId": "sec-2"})
        async with real_host(data, kind="agent") as (_proc, c):
            again = await c.call("secrets.set", {"ref": "provider/p1", "value": "old-value", "submissionId": "sec-1"})
            assert again == first
            assert (await c.call("secrets.get", {"ref": "provider/p1"}))["value"] == "rotated-value"
            await c.call("session.verifyEnvironment", {"sessionId": sid, "turnId": "t1"})
