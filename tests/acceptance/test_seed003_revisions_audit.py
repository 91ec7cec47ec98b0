"""Seed 003 §2.1 (``sessions/<id>.revisions.jsonl``), §4.9 (``message_revisions``) and §11 item 13, probed by an
outsider against real ``pi-host serve`` processes over WebSocket: what a test written from the seed's text alone
(and protocol/README's ``session.saveActiveRevision`` / ``activateRevision`` / ``listRevisions`` /
``truncateFrom``) holds the host to. Each docstring quotes the line it checks.

Older tests already hold some clauses, each in its own way: the constant-size reference lines and the
prefix-only growth of the file through switches (tests/revisions/test_revisions_host.py,
test_seed003_reads_outsider.py ``test_revisions_file_is_only_appended_through_switches_retries_and_a_kill``,
test_seed003_acceptance_adversarial.py ``test_item13_repeated_turns_over_one_live_branch_...``), the legacy file
(test_store_revisions.py, test_seed003_reads_outsider.py, ``test_item13_a_legacy_revisions_file_...``), the D307
refreshes and the failed-turn variant (test_revisions_host.py), the dropped-reference writer
(test_rewrites_host.py, ``test_item13_a_referenced_branch_dropped_by_a_rewrite_...``) and kills inside rewrites
(tests/revisions/test_rewrite_crash.py, test_crash_activate.py, test_seed003_write_paths_outsider.py). New
here: one kill-and-retry matrix over the three methods with exact line counts, the database lost under a
richer branch set, a revisions file restored from a backup and edited by hand while the host was stopped, an
edit whose ``meta.revisionRootId`` names the chosen id of a root the host stored as ``{sessionId}:{id}``, and
the refusals checked byte-for-byte.

Message ids are the host's, not a session's: an id another session holds is stored as ``{sessionId}:{id}``,
and a branch whose ids another session took since it left the transcript comes back with those ids so spelled
(tests/revisions/test_restore_taken_ids.py).
The probes on the shared host run one after another and read ids through :func:`_plain`; the kill matrix tags
each session's ids.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, code_of, data_dir, real_host, say, shared_host
from tests.hostkit import HostProcess, call_killed_at, msg


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each works in a session of its own)."""
    yield from shared_host(tmp_path_factory, "revisions-audit")


# ------------------------------------------------------------------------------------------------ helpers

def _revisions(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.revisions.jsonl"


def _transcript(root: Path, sid: str) -> Path:
    return root / "sessions" / f"{sid}.jsonl"


def _bytes(path: Path) -> bytes:
    return path.read_bytes() if path.exists() else b""


def _plain(sid: str, mid: str) -> str:
    """A message id as the test chose it: an id another session of the host already holds is stored as
    ``{sessionId}:{id}`` (README ``session.appendMessage``), and the shared host's sessions reuse ids."""
    return mid.removeprefix(f"{sid}:")


def _lines(root: Path, sid: str) -> list[dict[str, Any]]:
    """The revisions file's records, in order (§2.1: one JSON object a line), ids as the test chose them."""
    out = []
    for raw in _bytes(_revisions(root, sid)).splitlines():
        line = json.loads(raw)
        line["rootUserId"] = _plain(sid, line["rootUserId"])
        for m in line.get("messages", ()):
            m["id"] = _plain(sid, m["id"])
        out.append(line)
    return out


def _shape(line: dict[str, Any]) -> tuple[Any, ...]:
    """A line without its time: kind, key and the branch it stores (ids and texts of its messages)."""
    return (line["type"], line["rootUserId"], line["revisionIndex"],
            tuple((m["id"], _text(m)) for m in line.get("messages", ())))


def _newest(root: Path, sid: str) -> dict[tuple[str, int], dict[str, Any]]:
    """§4.9: "last record for (rootUserId, revisionIndex) wins"."""
    return {(ln["rootUserId"], ln["revisionIndex"]): ln for ln in _lines(root, sid)}


def _text(m: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in m.get("blocks", ()))


def _drop_database(root: Path) -> None:
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (root / name).unlink(missing_ok=True)


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    """The call's result, validated against the method's result model."""
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


async def _rows(c: HostClient, sid: str, root: str | None = None) -> list[tuple[str, int, bool, int]]:
    """``session.listRevisions`` as (rootUserId, revisionIndex, isActive, messageCount)."""
    params: dict[str, Any] = {"sessionId": sid} if root is None else {"sessionId": sid, "rootUserId": root}
    got = (await _call(c, "session.listRevisions", params))["revisions"]
    return [(_plain(sid, r["rootUserId"]), r["revisionIndex"], r["isActive"], r["messageCount"]) for r in got]


async def _live(c: HostClient, sid: str) -> list[tuple[str, str]]:
    """The live transcript (``session.get``) as (id, text)."""
    page = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    return [(_plain(sid, m["id"]), _text(m)) for m in page["messages"]]


async def _stamp(c: HostClient, sid: str, mid: str) -> tuple[Any, Any]:
    """§4.9: the live root's pager metadata (revisionCount, activeRevision)."""
    page = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    meta = next(m for m in page["messages"] if _plain(sid, m["id"]) == mid).get("meta") or {}
    return meta.get("revisionCount"), meta.get("activeRevision")


async def _branches(c: HostClient, sid: str, family: str) -> dict[int, list[tuple[str, str]]]:
    """Every variant of the family the pager offers, as the live transcript shows it once activated; the
    variant that was active is activated again at the end (§11.13: "the pager can restore any archived
    branch")."""
    rows = await _rows(c, sid, family)
    active = next((idx for _, idx, on, _ in rows if on), None)
    out = {}
    for _, idx, _, _ in rows:
        await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": family, "revisionIndex": idx})
        out[idx] = await _live(c, sid)
    if active is not None:
        await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": family, "revisionIndex": active})
    return out


async def _references_name_only_live_branches(c: HostClient, root: Path, sid: str) -> None:
    """§2.1: "A branch that is no longer live therefore always ends with a stored payload, and a reader only
    ever resolves a reference for the branch that is live right now": every key whose newest line is a
    ``revision_live`` reference is the variant its family's live root is stamped with."""
    live = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    stamps = {_plain(sid, (m.get("meta") or {}).get("revisionRootId", m["id"])):
              (m.get("meta") or {}).get("activeRevision") for m in live["messages"] if m["role"] == "user"}
    for (family, idx), line in _newest(root, sid).items():
        if line["type"] == "revision_live":
            assert stamps.get(family) == idx, (family, idx, stamps)


async def _turn(c: HostClient, sid: str, q: str, a: str) -> None:
    await say(c, sid, q, f"question {q}")
    await say(c, sid, a, f"answer {a}", "assistant")


# ------------------------------------------------------------------------------- §2.1 the file's bytes

async def test_live_turns_cost_constant_lines_and_switches_only_append(shared: HostProcess) -> None:
    """§11.13: "switching branches never rewrites the revisions file. A branch that is still live is
    referenced, not copied, so repeated turns over one branch cost the file nothing". §2.1: "A reference line is
    constant-sized ... and does not grow with the branch it names". Eight finished turns over one live branch
    (each ``saveActiveRevision`` of its root) add one ``revision_live`` line each, all of one size although the
    branch grew from 2 to 9 messages; through a regenerate and three switches every later byte string of the
    file starts with every earlier one."""
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared) as c:
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            sizes, before = [], b""
            for n in range(8):
                if n:
                    await say(c, sid, f"f{n}", f"follow-up {n}")
                await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
                now = _bytes(_revisions(root, sid))
                assert now.startswith(before) and now.count(b"\n") == before.count(b"\n") + 1
                added = json.loads(now[len(before):])
                assert added["type"] == "revision_live" and "messages" not in added and "turns" not in added
                sizes.append(len(now) - len(before))
                before = now
            assert len(set(sizes)) == 1, sizes
            assert await _rows(c, sid) == [("u1", 1, True, 9)]
            steps: list[tuple[str, dict[str, Any]]] = [
                ("session.truncateFrom", {"messageId": "a1", "mode": "regenerate"}),
                ("session.appendMessage", {"message": msg("a1b", "answer a1b", role="assistant")}),
                ("session.saveActiveRevision", {"rootUserId": "u1"}),
                ("session.activateRevision", {"rootUserId": "u1", "revisionIndex": 1}),
                ("session.activateRevision", {"rootUserId": "u1", "revisionIndex": 2}),
                ("session.activateRevision", {"rootUserId": "u1", "revisionIndex": 1}),
            ]
            for method, params in steps:
                await _call(c, method, {"sessionId": sid, **params})
                now = _bytes(_revisions(root, sid))
                assert now.startswith(before), method
                before = now
                await _references_name_only_live_branches(c, root, sid)
            assert [i for i, _ in await _live(c, sid)] == ["u1", "a1", *(f"f{n}" for n in range(1, 8))]
            assert await _stamp(c, sid, "u1") == (2, 1)


# ------------------------------------------------------------------------- §2.1 the three writers

async def test_every_writer_stores_a_referenced_branch_in_full_before_the_rewrite_drops_it(
        shared: HostProcess) -> None:
    """§2.1: "archive_live_branch (revision switch) and archive_discarded_regenerate_branch (regenerate,
    edit) each write the full revision line before the rewrite that stops holding the branch, and
    archive_dropped_live_branches — reached through replace_messages — does the same when a rewrite deletes
    the root turn itself". Each of the four rewrites leaves a branch that was only referenced: afterwards its
    newest line is a full ``revision`` holding exactly that branch, and activating it brings it back."""
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared) as c:
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            await _turn(c, sid, "u2", "a2")

            def full(family: str, idx: int) -> list[str]:
                line = _newest(root, sid)[(family, idx)]
                assert line["type"] == "revision", line
                return [m["id"] for m in line["messages"]]

            # regenerate: u2's saved (referenced) variant 1 leaves with a2
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            assert _newest(root, sid)[("u2", 1)]["type"] == "revision_live"
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a2", "mode": "regenerate"})
            assert full("u2", 1) == ["u2", "a2"]
            await say(c, sid, "a2b", "answer a2b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u2"})
            # switch: u2's variant 2 (referenced) leaves for variant 1
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1})
            assert full("u2", 2) == ["u2", "a2b"]
            await _references_name_only_live_branches(c, root, sid)
            # edit: u1's referenced variant leaves with everything after it
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            assert full("u1", 1) == ["u1", "a1", "u2", "a2"]
            assert await _live(c, sid) == []
            await say(c, sid, "u1", "question u1, edited")
            await say(c, sid, "a1e", "answer a1e", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await say(c, sid, "u3", "question u3")
            await say(c, sid, "a3", "answer a3", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u3"})
            # replaceMessages deleting the referenced root u3 itself
            page = await _call(c, "session.get", {"sessionId": sid, "full": True})
            kept = [{k: m[k] for k in ("id", "role", "blocks", "meta") if k in m} for m in page["messages"][:2]]
            assert [_plain(sid, m["id"]) for m in kept] == ["u1", "a1e"]
            await _call(c, "session.replaceMessages", {"sessionId": sid, "messages": kept})
            assert full("u3", 1) == ["u3", "a3"]
            await _references_name_only_live_branches(c, root, sid)
            branches = await _branches(c, sid, "u1")
            # README "Switching follows the newest descendants": u2 comes back on its newest variant (a2b)
            assert [i for i, _ in branches[1]] == ["u1", "a1", "u2", "a2b"]
            assert branches[1][0] == ("u1", "question u1")
            assert [i for i, _ in branches[max(branches)]] == ["u1", "a1e"]
            await _references_name_only_live_branches(c, root, sid)


# ----------------------------------------------------------------------------------- §4.9 D307 refreshes

async def test_d307_every_discarding_operation_first_writes_the_grown_branch_back(shared: HostProcess) -> None:
    """§4.9: "every operation that discards the live branch first writes it back over the revision it belongs
    to (D307): session.activateRevision re-archives the live branch ... session.truncateFrom archives the
    discarded tail ... (refreshing the stamped variant, or minting an inactive one), and
    session.saveActiveRevision refreshes an already-archived index instead of skipping it ... The variant
    named by the live root's activeRevision stamp is the one refreshed; a stamped variant with no index row yet
    (its turn failed before archive) is stored as its own new variant, never over a previous one."""
    with trio.fail_after(60):
        async with client(shared) as c:
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            # truncateFrom with nothing saved mints an inactive variant
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            assert await _rows(c, sid) == [("u1", 1, False, 2)]
            await say(c, sid, "a1b", "answer a1b", "assistant")
            saved = await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert saved["revision"]["revisionIndex"] == 2
            # saveActiveRevision refreshes the archived index: the count follows, no new variant
            await _turn(c, sid, "u2", "a2")
            again = await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert (again["revision"]["revisionIndex"], again["revision"]["messageCount"]) == (2, 4)
            assert await _rows(c, sid, "u1") == [("u1", 1, False, 2), ("u1", 2, True, 4)]
            # the branch grows after its archive; activateRevision writes the grown one back first
            await _turn(c, sid, "u3", "a3")
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            assert await _rows(c, sid, "u1") == [("u1", 1, True, 2), ("u1", 2, False, 6)]
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            assert [i for i, _ in await _live(c, sid)] == ["u1", "a1b", "u2", "a2", "u3", "a3"]
            # truncateFrom refreshes the stamped variant with what grew on it
            await say(c, sid, "u4", "question u4")
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1b", "mode": "regenerate"})
            assert await _rows(c, sid, "u1") == [("u1", 1, False, 2), ("u1", 2, False, 7)]
            # the next regenerate fails before its archive: the stamped variant 3 has no row ...
            assert await _stamp(c, sid, "u1") == (3, 3)
            await say(c, sid, "e1", "boom", "assistant")
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "e1", "mode": "retry"})
            # ... and is stored as its own variant, never over 1 or 2
            assert await _rows(c, sid, "u1") == [("u1", 1, False, 2), ("u1", 2, False, 7), ("u1", 3, False, 2)]
            await say(c, sid, "a1c", "answer a1c", "assistant")
            last = await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert last["revision"]["revisionIndex"] == 4
            assert await _stamp(c, sid, "u1") == (4, 4)
            branches = await _branches(c, sid, "u1")
            assert {k: [i for i, _ in v] for k, v in branches.items()} == {
                1: ["u1", "a1"], 2: ["u1", "a1b", "u2", "a2", "u3", "a3", "u4"], 3: ["u1", "e1"], 4: ["u1", "a1c"]}


async def test_an_edit_under_a_new_id_keeps_one_family(shared: HostProcess) -> None:
    """§4.9: "root_user_id is the stable regenerate-family key. Live rewritten user prompts may carry a new
    message id, but meta.revisionRootId keeps pointing at the original family so later regenerates append to
    one set." An edit of u1 sent as u1x naming ``revisionRootId: u1``, then a regenerate of its reply: one
    family ``u1`` with three variants, listed under either id, each restorable. Another session holds the id
    u1 too, so this session's u1 is stored as ``{sessionId}:u1`` (README ``session.appendMessage``: "every
    method that takes a message id accepts the id you chose"): the edit naming u1 joins that family (it
    made a second family ``u1`` beside it, and listing or switching by u1 found neither)."""
    with trio.fail_after(60):
        async with client(shared) as c:
            other = (await _call(c, "session.create", {}))["id"]
            await say(c, other, "u1", "the other session's u1")
            sid = (await _call(c, "session.create", {}))["id"]
            assert (await say(c, sid, "u1", "question u1"))["message"]["id"] == f"{sid}:u1"
            await say(c, sid, "a1", "answer a1", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
            await say(c, sid, "u1x", "question u1, edited", meta={"revisionRootId": "u1"})
            await say(c, sid, "a1x", "answer a1x", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1x"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1x", "mode": "regenerate"})
            await say(c, sid, "a1y", "answer a1y", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1x"})
            listed = await _rows(c, sid)
            assert listed == [("u1", 1, False, 2), ("u1", 2, False, 2), ("u1", 3, True, 2)]
            assert await _rows(c, sid, "u1x") == listed
            branches = await _branches(c, sid, "u1")
            assert branches == {1: [("u1", "question u1"), ("a1", "answer a1")],
                                2: [("u1x", "question u1, edited"), ("a1x", "answer a1x")],
                                3: [("u1x", "question u1, edited"), ("a1y", "answer a1y")]}


async def test_a_save_stamps_only_the_roots_line_and_appends_made_meanwhile_survive(shared: HostProcess) -> None:
    """§4.9: "The stamp rewrites only the root's own transcript line, and the file is re-read at write time,
    so an assistant or tool line appended by the persistence outbox in the meantime survives." The transcript's
    bytes before a save are a prefix of its bytes after (nothing else rewritten); saves racing appends on a
    second connection lose none of them."""
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared) as c, client(shared, "outbox", kind="agent") as outbox:
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            before = _transcript(root, sid).read_bytes()
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            after = _transcript(root, sid).read_bytes()
            assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1
            assert _plain(sid, json.loads(after[len(before):])["id"]) == "u1"
            appended = [f"t{n}" for n in range(12)]

            async def appends() -> None:
                for mid in appended:
                    await say(outbox, sid, mid, f"tool output {mid}", "assistant")

            async def saves() -> None:
                for _ in range(6):
                    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(appends)
                nursery.start_soon(saves)
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            assert [i for i, _ in await _live(c, sid)] == ["u1", "a1", *appended]
            assert await _rows(c, sid) == [("u1", 1, True, 2 + len(appended))]
            assert await _stamp(c, sid, "u1") == (1, 1)


# ------------------------------------------------------------------------------------------ refusals

async def test_bad_input_is_refused_with_a_clear_code_and_changes_nothing(shared: HostProcess) -> None:
    """README ``session.activateRevision`` / ``saveActiveRevision`` / ``truncateFrom``, and the project's rule
    "Bad input gets a clear error and changes nothing": an unknown root or a message that roots no family (an
    assistant reply) is ``MESSAGE_NOT_FOUND``, index 0 ``INVALID_PARAMS``, an index past the family's count
    ``NOT_FOUND``, an unknown session ``SESSION_NOT_FOUND``; the transcript, the revisions file and the
    listing are byte-for-byte what they were."""
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared) as c:
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            files = (_bytes(_transcript(root, sid)), _bytes(_revisions(root, sid)))
            listed = await _call(c, "session.listRevisions", {"sessionId": sid})
            activate = "session.activateRevision"
            refused: list[tuple[str, dict[str, Any], str]] = [
                (activate, {"rootUserId": "nope", "revisionIndex": 1}, "MESSAGE_NOT_FOUND"),
                (activate, {"rootUserId": "a1b", "revisionIndex": 1}, "MESSAGE_NOT_FOUND"),
                (activate, {"rootUserId": "u1", "revisionIndex": 0}, "INVALID_PARAMS"),
                (activate, {"rootUserId": "u1", "revisionIndex": -1}, "INVALID_PARAMS"),
                (activate, {"rootUserId": "u1", "revisionIndex": 3}, "NOT_FOUND"),
                (activate, {"rootUserId": "u1", "revisionIndex": 2**40}, "NOT_FOUND"),
                (activate, {"rootUserId": "u1", "revisionIndex": "1"}, "INVALID_PARAMS"),
                (activate, {"rootUserId": "", "revisionIndex": 1}, "INVALID_PARAMS"),
                ("session.saveActiveRevision", {"rootUserId": "nope"}, "MESSAGE_NOT_FOUND"),
                ("session.saveActiveRevision", {"rootUserId": "a1b"}, "MESSAGE_NOT_FOUND"),
                ("session.truncateFrom", {"messageId": "nope", "mode": "regenerate"}, "MESSAGE_NOT_FOUND"),
            ]
            for n, (method, params, code) in enumerate(refused):
                got = await code_of(c, method, {"sessionId": sid, **params, "submissionId": f"bad-{n}"})
                assert got == code, (method, params, got)
                assert (_bytes(_transcript(root, sid)), _bytes(_revisions(root, sid))) == files, (method, params)
            assert await code_of(c, activate, {"sessionId": "no-such-session", "rootUserId": "u1",
                                               "revisionIndex": 1}) == "SESSION_NOT_FOUND"
            assert await _call(c, "session.listRevisions", {"sessionId": sid}) == listed
            assert [i for i, _ in await _live(c, sid)] == ["u1", "a1b"]
            assert await _stamp(c, sid, "u1") == (2, 2)


# ------------------------------------------------------------------------ SIGKILL and a keyed retry

KILLS: dict[str, list[str]] = {
    "activate": ["revisions.after_write", "rewrite.after_rename", "session.activateRevision.after_commit"],
    "truncate": ["session.truncateFrom.before_commit", "revisions.after_write", "rewrite.after_tmp_fsync"],
    "save": ["append.after_fsync", "revisions.after_write", "session.saveActiveRevision.before_commit"],
}
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "activate": ("session.activateRevision", {"rootUserId": "u1", "revisionIndex": 1, "submissionId": "K-act"}),
    "truncate": ("session.truncateFrom", {"messageId": "a1b", "mode": "regenerate", "submissionId": "K-cut"}),
    "save": ("session.saveActiveRevision", {"rootUserId": "u2", "submissionId": "K-save"}),
}
GROWN = [("u1", "question u1"), ("a1b", "answer a1b"), ("u2", "question u2"), ("a2", "answer a2")]
# what each call leaves, written from the seed: (live transcript, listRevisions, the lines it appends)
EXPECTED: dict[str, tuple[list[str], list[tuple[str, int, bool, int]], list[tuple[Any, ...]]]] = {
    # the live branch (variant 2, grown by u2/a2 since its save) is stored in full, then variant 1 is live
    "activate": (["u1", "a1"], [("u1", 1, True, 2), ("u1", 2, False, 4)],
                 [("revision", "u1", 2, tuple(GROWN))]),
    # the discarded tail refreshes the stamped variant 2 with what grew on it
    "truncate": (["u1"], [("u1", 1, False, 2), ("u1", 2, False, 4)], [("revision", "u1", 2, tuple(GROWN))]),
    # u2's first save: its own family, a reference line
    "save": (["u1", "a1b", "u2", "a2"], [("u1", 1, False, 2), ("u1", 2, True, 2), ("u2", 1, True, 2)],
             [("revision_live", "u2", 1, ())]),
}


def _tag(name: str) -> str:
    """The prefix of the ids of ``name``'s session: a message id is the host's, not the session's, so the
    three sessions of one data directory could not each hold a1 (a restore of a branch whose id another
    session took since is refused)."""
    return f"{name}."


def _untag(value: Any, tag: str) -> Any:
    """``value`` (ids, texts, nested in tuples and lists) with ``tag`` taken out."""
    if isinstance(value, str):
        return value.replace(tag, "")
    if isinstance(value, tuple | list):
        return type(value)(_untag(v, tag) for v in value)
    if isinstance(value, dict):
        return {k: _untag(v, tag) for k, v in value.items()}
    return value


def _tagged(params: dict[str, Any], tag: str) -> dict[str, Any]:
    return {k: f"{tag}{v}" if k in ("rootUserId", "messageId") else v for k, v in params.items()}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A stopped data directory with one session per method, ids tagged by it: u1/a1 saved as variant 1,
    regenerated to a1b saved as variant 2, then u2/a2 appended (the branch grew after its archive)."""
    root = tmp_path_factory.mktemp("revisions-kill") / "data"
    root.mkdir()

    async def build() -> dict[str, str]:
        sids = {}
        async with real_host(root) as (_, c):
            for name in CALLS:
                t = _tag(name)
                sid = (await c.call("session.create", {}))["id"]
                await _turn(c, sid, f"{t}u1", f"{t}a1")
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": f"{t}u1"})
                await c.call("session.truncateFrom", {"sessionId": sid, "messageId": f"{t}a1", "mode": "regenerate"})
                await say(c, sid, f"{t}a1b", f"answer {t}a1b", "assistant")
                await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": f"{t}u1"})
                await _turn(c, sid, f"{t}u2", f"{t}a2")
                sids[name] = sid
        return sids

    return root, trio.run(build)


@pytest.mark.parametrize("moment", range(3))
async def test_a_kill_inside_each_revision_write_and_a_keyed_retry_make_exactly_one_effect(
        tmp_path: Path, template: tuple[Path, dict[str, str]], moment: int) -> None:
    """§4.9 / README receipts, and the architecture's "SIGKILL ... Design every write path so either is
    survivable": ``activateRevision``, ``truncateFrom`` and ``saveActiveRevision`` each killed at one moment
    of its write (the full line written, the rewrite renamed or its temp file synced, the stamp line synced,
    the reference written, before or after the commit); after the restart the same call with the same
    ``submissionId`` makes the effect the seed describes exactly once: the live transcript, the listing, the
    root's stamp and the lines appended to the revisions file are what one clean call leaves (no line twice,
    no message duplicated); a second retry answers the first retry's answer; every variant still comes back
    whole."""
    source, sids = template
    root = tmp_path / "data"
    shutil.copytree(source, root)
    before = {name: _lines(root, sid) for name, sid in sids.items()}
    with trio.fail_after(150):
        for name, sid in sids.items():
            method, params = CALLS[name]
            await call_killed_at(root, KILLS[name][moment], method, {"sessionId": sid, **_tagged(params, _tag(name))},
                                 client_id="outsider")
        async with real_host(root) as (_, c):
            for name, sid in sids.items():
                t, (method, params) = _tag(name), CALLS[name]
                where, call = (name, KILLS[name][moment]), {"sessionId": sid, **_tagged(params, t)}
                live, rows, appended = EXPECTED[name]
                answer = await _call(c, method, call)
                assert await _call(c, method, call) == answer, where
                ids = _untag([i for i, _ in await _live(c, sid)], t)
                assert ids == live, (where, ids)
                assert _untag(await _rows(c, sid), t) == rows, where
                now = _lines(root, sid)
                assert now[:len(before[name])] == before[name], where
                assert [_untag(_shape(ln), t) for ln in now[len(before[name]):]] == appended, where
                await _references_name_only_live_branches(c, root, sid)
                branches = _untag(await _branches(c, sid, f"{t}u1"), t)
                assert branches[1] == [("u1", "question u1"), ("a1", "answer a1")], where
                assert branches[2] == GROWN, where


# --------------------------------------------------------------------- the index lost and rebuilt

async def _branch_set(c: HostClient, sid: str) -> None:
    """Two families: u1 (regenerated twice, edited under a new id, a message deleted in one variant) and u3
    (its reply regenerated)."""
    await _turn(c, sid, "u1", "a1")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
    await say(c, sid, "a1b", "answer a1b", "assistant")
    await _turn(c, sid, "u2", "a2")
    await _call(c, "session.deleteMessage", {"sessionId": sid, "messageId": "a2"})
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
    await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "u1", "mode": "edit"})
    await say(c, sid, "u1x", "question u1, edited", meta={"revisionRootId": "u1"})
    await say(c, sid, "a1x", "answer a1x", "assistant")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1x"})
    await _turn(c, sid, "u3", "a3")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u3"})
    await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a3", "mode": "regenerate"})
    await say(c, sid, "a3b", "answer a3b", "assistant")
    await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u3"})
    await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2,
                                                "submissionId": "switch-1"})


async def _picture(c: HostClient, sid: str) -> dict[str, Any]:
    """Everything a user sees of the branches: the listing (with times), the live transcript with its
    deleted flags and pager stamps, and every variant's contents."""
    listed = (await _call(c, "session.listRevisions", {"sessionId": sid}))["revisions"]
    page = await _call(c, "session.get", {"sessionId": sid, "messageLimit": 200})
    live = [(_plain(sid, m["id"]), _text(m), bool(m.get("deleted")), (m.get("meta") or {}).get("revisionCount"),
             (m.get("meta") or {}).get("activeRevision")) for m in page["messages"]]
    return {"listed": listed, "live": live, "u1": await _branches(c, sid, "u1")}


async def test_the_index_lost_and_rebuilt_lists_and_restores_the_same_branches(tmp_path: Path) -> None:
    """§4.9: "the branch payload lives in the append-only sessions/<id>.revisions.jsonl (§2.1), keyed by
    (rootUserId, revisionIndex)" and seed 003 goal 2, "SQLite is an index": with pi.sqlite and its WAL
    deleted while the host is stopped, the rebuilt index lists the same rows (times too), the live roots carry
    the same revisionCount / activeRevision, every variant restores with the same messages and deletions, and
    a keyed switch made before the loss is answered again, not made twice."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid = (await _call(c, "session.create", {}))["id"]
            await _branch_set(c, sid)
            seen = await _picture(c, sid)
            assert [(r["rootUserId"], r["revisionIndex"], r["isActive"]) for r in seen["listed"]] == [
                ("u1", 1, False), ("u1", 2, True), ("u1", 3, False), ("u3", 1, False), ("u3", 2, False)]
            assert [(i, d) for i, _, d, _, _ in seen["live"]] == [
                ("u1", False), ("a1b", False), ("u2", False), ("a2", True)]
            proc.kill9()
        file_before = _bytes(_revisions(root, sid))
        _drop_database(root)
        async with real_host(root) as (proc, c):
            assert await _picture(c, sid) == seen
            again = await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1",
                                                               "revisionIndex": 2, "submissionId": "switch-1"})
            assert [(r["revisionIndex"], r["isActive"]) for r in again["revisions"]] == [(1, False), (2, True),
                                                                                         (3, False)]
            assert _bytes(_revisions(root, sid)).startswith(file_before)


# ------------------------------------------------------------- the file changed while the host was stopped

async def test_a_revisions_file_restored_from_a_backup_and_edited_while_stopped_is_what_list_revisions_shows(
        tmp_path: Path) -> None:
    """§4.9: "One row is one linear branch rooted at a user turn; the branch payload lives in the append-only
    sessions/<id>.revisions.jsonl" — the rows index the file. While the host was stopped, the file was
    restored from an older backup (it lacks variant 3, archived since) and then edited by hand (its stored
    variant 1 renumbered 5, that reply's text changed): the listing names exactly the file's variants 2 and 5
    (it listed 1 and 3 beside them: the index kept every row the file no longer names), equals the listing an
    index rebuilt from the same files shows, and variant 5 restores the edited messages."""
    root = data_dir(tmp_path)
    with trio.fail_after(120):
        async with real_host(root) as (_, c):
            sid = (await _call(c, "session.create", {}))["id"]
            await _turn(c, sid, "u1", "a1")
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            backup = _bytes(_revisions(root, sid))
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1b", "mode": "regenerate"})
            await say(c, sid, "a1c", "answer a1c", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1c", "mode": "regenerate"})
            await say(c, sid, "a1d", "answer a1d", "assistant")
            assert await _rows(c, sid) == [("u1", 1, False, 2), ("u1", 2, False, 2), ("u1", 3, False, 2)]
        edited = []
        for raw in backup.splitlines():
            line = json.loads(raw)
            if line["type"] == "revision" and line["revisionIndex"] == 1:
                line["revisionIndex"] = 5
                for m in line["messages"]:
                    if m["id"] == "a1":
                        m["blocks"] = [{"type": "text", "text": "answer a1, edited by hand"}]
            edited.append(json.dumps(line, separators=(",", ":")) + "\n")
        _revisions(root, sid).write_text("".join(edited))
        keys = sorted({(ln["rootUserId"], ln["revisionIndex"]) for ln in _lines(root, sid)})
        assert keys == [("u1", 2), ("u1", 5)]
        async with real_host(root) as (_, c):
            shown = await _rows(c, sid)
            assert [(r, i) for r, i, _, _ in shown] == keys
        _drop_database(root)
        async with real_host(root) as (_, c):
            assert await _rows(c, sid) == shown
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 5})
            assert await _live(c, sid) == [("u1", "question u1"), ("a1", "answer a1, edited by hand")]
