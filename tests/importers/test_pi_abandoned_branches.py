"""A pi session's abandoned branches stay reachable through the revisions store (issue 23 item 2).

The file is the recorded tree session (pi 0.73.1, ``tests/fixtures/recorded``): two turns, a compaction,
a turn, a ``!bash``, then pi's own ``navigateTree`` to the first reply with a branch summary, a tool call
on that second branch, a return to the first branch's leaf, a turn there and a session name. A user who
moves between the branches later is written the way pi writes it: the next entry's ``parentId`` is the
leaf navigated to.

Reproduces: a fresh import brought only the current branch: the second branch's turns were nowhere and
``usage.session`` said 510 input tokens against pi's 750 over the whole file; while a branch switch hid
the first branch, that branch's compaction checkpoint was still served (``session.context`` started from
it, ``session.get`` listed it); an older copy must still hide nothing. Then (acceptance 13 on an import):
the family's root line had no pager stamp, so every imported variant listed ``isActive: false`` and the
live branch had no variant; the second branch (it starts with pi's branch summary) was filed under the
turn after the summary, so switching to it lost the family and there was no way back; the round trip
dropped the first branch's compaction checkpoint for good.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.faults import Faults, InjectedFault
from store.interchange import import_write
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_unit
from store.revisions import append_revision_lines, read_revisions, revision_line, upsert_row
from store.transcripts.transcript import read_transcript
from tests.hostkit import client_for, inprocess_host, msg
from tests.revisions.helpers import revision_kinds, revisions_path
from tests.samplekit import NOW, open_db, rows

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "pi"
SECOND_BRANCH = "[tool-ok] a question on the second branch"
FIRST_BRANCH_END = "Reply to: back on the first branch"


def _tree_file() -> Path:
    for manifest in sorted(RECORDED.glob("*/manifest.json")):
        for entry in json.loads(manifest.read_text())["files"]:
            if entry["scenario"] == "tree":
                return manifest.parent / entry["file"]
    raise AssertionError("no recorded pi tree session")


TREE = _tree_file()
LINES = TREE.read_text().splitlines()
ENTRIES = [json.loads(line) for line in LINES]
SID = session_id_for("pi", ENTRIES[0]["id"])
SECOND_LEAF = next(e["id"] for e in ENTRIES if "The tool answered" in json.dumps(e))
FIRST_LEAF = ENTRIES[-1]["id"]
ROOT = SID + ":" + next(e["id"] for e in ENTRIES if "first question on the tree session" in json.dumps(e))
"""The family of both branches: the second left the first after the first reply, with pi's branch summary
(a variant starts with its user turn, so the family is the first question's)."""


def _turn(eid: str, parent: str, text: str, second: int) -> list[str]:
    """A user question and its reply, as pi appends them after the leaf ``parent``."""
    ts = f"2026-12-02T03:00:{second:02d}.000Z"
    user = {"type": "message", "id": f"{eid}u", "parentId": parent, "timestamp": ts,
            "message": {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 0}}
    reply = {"type": "message", "id": f"{eid}a", "parentId": f"{eid}u", "timestamp": ts,
             "message": {"role": "assistant", "content": [{"type": "text", "text": f"Reply to: {text}"}],
                         "api": "openai-completions", "provider": "fake", "model": "fake-model",
                         "usage": {"input": 1000, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 1001},
                         "stopReason": "stop", "timestamp": 0}}
    user["message"]["timestamp"] = reply["message"]["timestamp"] = 1796180400000 + second * 1000
    return [json.dumps(user), json.dumps(reply)]


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _pi_input(lines: list[str]) -> int:
    """pi's own footer: the input tokens of every assistant entry of the file, on the branch or not."""
    out = 0
    for line in lines[1:]:
        e = json.loads(line)
        if e.get("type") == "message" and e["message"].get("role") == "assistant":
            out += e["message"]["usage"]["input"]
    return out


async def _import(c: Any, path: Path) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": "pi", "root": str(path)})
    (report,) = result["sessions"]
    assert report["status"] != "refused", report
    return dict(report)


async def _shown(c: Any) -> list[str]:
    window = await c.call("session.get", {"sessionId": SID, "full": True})
    return [b["text"] for m in window["messages"] if not m.get("deleted")
            for b in m["blocks"] if b.get("type") == "text"]


async def _archived(c: Any) -> list[str]:
    """The previews of every node of an archived branch (``session.tree``)."""
    tree = await c.call("session.tree", {"sessionId": SID})
    return [n["preview"] for n in tree["nodes"] if n["id"].startswith("rev:")]


async def _input_tokens(c: Any) -> int:
    return int((await c.call("usage.session", {"sessionId": SID}))["total"]["inputTokens"])


async def _served(c: Any) -> tuple[bool, int]:
    """Whether ``session.context`` starts from a checkpoint, and how many ``session.get`` lists."""
    context = await c.call("session.context", {"sessionId": SID})
    window = await c.call("session.get", {"sessionId": SID, "full": True})
    return context["compaction"] is not None, len(window["compactions"])


async def _family(c: Any, data: Path, sid: str, root: str) -> dict[str, Any]:
    """What a client and the files hold of a regenerate family: its variants (index, active), the root
    line's pager stamp, and per variant whether the newest revisions record is a live reference."""
    revs = (await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": root}))["revisions"]
    window = await c.call("session.get", {"sessionId": sid, "full": True})
    meta = next(m for m in window["messages"] if m["id"] == root).get("meta") or {}
    return {"variants": [(r["revisionIndex"], r["isActive"]) for r in revs],
            "stamp": {k: meta.get(k) for k in ("revisionCount", "activeRevision", "revisionRootId")},
            "references": {idx: live for (fam, idx), live in revision_kinds(data, sid).items() if fam == root}}


def _no_temp_files(data: Path) -> None:
    assert not [p.name for p in (data / "sessions").glob("*.tmp*")]


async def test_fresh_import_keeps_the_abandoned_branch_in_revisions_with_its_usage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with inprocess_host(data) as host, client_for(host) as c:
        report = await _import(c, TREE)
        assert report["status"] == "new" and report["archivedBranches"] == 1
        shown = await _shown(c)
        assert shown[-1] == FIRST_BRANCH_END and SECOND_BRANCH not in shown  # not in the main transcript
        revs = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
        # attributed to where it left the current branch: after the first reply, so (it starts with pi's
        # branch summary) the first question's family; the live branch is the family's other variant
        assert [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
            (ROOT, 1, False, 6),  # the question, its reply, the branch summary, the question, the tool call, the reply
            (ROOT, 2, True, 9)]  # the first branch, from the first question on
        imported = await _family(c, data, SID, ROOT)
        assert imported == {"variants": [(1, False), (2, True)],
                            "stamp": {"revisionCount": 2, "activeRevision": 2, "revisionRootId": ROOT},
                            "references": {1: False, 2: True}}
        archived = await _archived(c)
        assert SECOND_BRANCH in archived and "The tool answered: fidelity-ok" in archived
        assert await _input_tokens(c) == _pi_input(LINES) == 750  # pi's footer, over the whole file
        stored = revisions_path(data, SID).read_bytes()
        assert (await _import(c, TREE))["status"] == "unchanged"
        TREE_COPY = tmp_path / "pi" / TREE.name  # parsed again (a new path): still nothing to write
        _write(TREE_COPY, LINES)
        again = await _import(c, TREE_COPY)
        assert again["status"] == "unchanged" and again["archivedBranches"] == 0
        assert revisions_path(data, SID).read_bytes() == stored and await _family(c, data, SID, ROOT) == imported
        # the same shape as a family the host made itself: a turn, its save, a regenerate, the new reply's save
        sid = (await c.call("session.create", {"title": "regenerated"}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "q")})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a1", "a", role="assistant")})
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
        await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("a2", "b", role="assistant")})
        await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
        host_made = await _family(c, data, sid, "u1")
        assert host_made == {**imported, "stamp": {**imported["stamp"], "revisionRootId": "u1"}}
    _no_temp_files(data)


async def test_an_imported_family_pages_to_the_old_branch_and_back_losing_nothing(tmp_path: Path) -> None:
    """session.activateRevision to the archived pi branch and back: the live branch is stored in full before it
    leaves (D307), the transcript is the same after the round trip, and a re-import finds nothing to do."""
    data = tmp_path / "data"
    work = _write(tmp_path / "pi" / TREE.name, LINES)
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, work)
        window = await c.call("session.get", {"sessionId": SID, "full": True})
        first = [(m["id"], m["blocks"]) for m in window["messages"]]
        checkpoint = window["compactions"]
        shown = await _shown(c)
        assert await _served(c) == (True, 1)
        a = await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": ROOT, "revisionIndex": 1})
        assert [(r["revisionIndex"], r["isActive"]) for r in a["revisions"]] == [(1, True), (2, False)]
        switched = await _shown(c)
        assert switched[:2] == shown[:2] and switched[-1] == "The tool answered: fidelity-ok"
        assert SECOND_BRANCH in switched and FIRST_BRANCH_END not in switched
        assert await _family(c, data, SID, ROOT) == {
            "variants": [(1, True), (2, False)],
            "stamp": {"revisionCount": 2, "activeRevision": 1, "revisionRootId": ROOT},
            "references": {1: False, 2: False}}  # the first branch left the transcript: stored in full
        assert FIRST_BRANCH_END in await _archived(c)
        assert await _served(c) == (False, 0)  # the first branch's checkpoint left with it (stored with it)
        b = await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": ROOT, "revisionIndex": 2})
        assert [(r["revisionIndex"], r["isActive"]) for r in b["revisions"]] == [(1, False), (2, True)]
        assert await _shown(c) == shown
        window = await c.call("session.get", {"sessionId": SID, "full": True})
        assert [(m["id"], m["blocks"]) for m in window["messages"]] == first
        assert window["compactions"] == checkpoint and await _served(c) == (True, 1)  # and came back with it
        assert SECOND_BRANCH in await _archived(c)
        assert await _input_tokens(c) == _pi_input(LINES)
        stored = revisions_path(data, SID).read_bytes()
        work.touch()  # parsed again: the variants are the store's already, the transcript holds the file's branch
        again = await _import(c, work)
        assert again["status"] == "unchanged" and again["archivedBranches"] == 0
        assert revisions_path(data, SID).read_bytes() == stored
        assert await _shown(c) == shown
        assert (await _family(c, data, SID, ROOT))["variants"] == [(1, False), (2, True)]
    _no_temp_files(data)


async def test_branch_switch_and_back_loses_nothing(tmp_path: Path) -> None:
    """pi's navigateTree to the second branch (a turn there), then back to the first (a turn there)."""
    data = tmp_path / "data"
    work = tmp_path / "pi" / TREE.name
    on_second = [*LINES, *_turn("b2", SECOND_LEAF, "a turn on the second branch again", 1)]
    back = [*on_second, *_turn("b1", FIRST_LEAF, "a turn back on the first branch", 2)]
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, _write(work, LINES))
        first_shown = await _shown(c)
        moved = await _import(c, _write(work, on_second))
        assert moved["status"] == "updated" and moved["archivedBranches"] == 1
        # the second branch is the family's live variant now; the first is stored in full over its reference
        assert await _family(c, data, SID, ROOT) == {
            "variants": [(1, True), (2, False)],
            "stamp": {"revisionCount": 2, "activeRevision": 1, "revisionRootId": ROOT},
            "references": {1: True, 2: False}}
        shown = await _shown(c)
        assert SECOND_BRANCH in shown and shown[-1] == "Reply to: a turn on the second branch again"
        assert FIRST_BRANCH_END not in shown
        archived = await _archived(c)
        assert FIRST_BRANCH_END in archived and "a question after the compaction" in archived
        assert await _input_tokens(c) == _pi_input(on_second)
        returned = await _import(c, _write(work, back))
        assert returned["status"] == "updated" and returned["archivedBranches"] == 1
        family = await _family(c, data, SID, ROOT)
        assert family == {"variants": [(1, False), (2, True)],
                          "stamp": {"revisionCount": 2, "activeRevision": 2, "revisionRootId": ROOT},
                          "references": {1: False, 2: True}}
        stored = revisions_path(data, SID).read_bytes()
        shown = await _shown(c)
        assert shown == [*first_shown, "a turn back on the first branch", "Reply to: a turn back on the first branch"]
        archived = await _archived(c)
        for text in (SECOND_BRANCH, "Reply to: a turn on the second branch again"):
            assert text in archived  # both directions are kept: the second branch archived, the first one live
        assert FIRST_BRANCH_END in shown and FIRST_BRANCH_END not in archived  # (its stored copy is the live variant)
        assert await _input_tokens(c) == _pi_input(back)
        assert (await _import(c, work))["status"] == "unchanged"
        work.touch()  # parsed again (mtime), nothing new
        again = await _import(c, work)
        assert again["status"] == "unchanged" and again["archivedBranches"] == 0
        assert revisions_path(data, SID).read_bytes() == stored and await _family(c, data, SID, ROOT) == family
        # and the host pages it like its own: to the second branch (with its turn) and back. The messages the
        # imports hid (the other branch's) are no part of the branch that leaves; the restored ones show again
        await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": ROOT, "revisionIndex": 1})
        switched = await _shown(c)
        assert switched[-1] == "Reply to: a turn on the second branch again" and FIRST_BRANCH_END not in switched
        await c.call("session.activateRevision", {"sessionId": SID, "rootUserId": ROOT, "revisionIndex": 2})
        assert await _shown(c) == shown
        window = await c.call("session.get", {"sessionId": SID, "full": True})
        assert not [m["id"] for m in window["messages"] if m.get("deleted")]  # nothing hidden stays behind
    _no_temp_files(data)


async def test_a_hidden_branchs_compaction_is_not_served(tmp_path: Path) -> None:
    data = tmp_path / "data"
    work = tmp_path / "pi" / TREE.name
    on_second = [*LINES, *_turn("b2", SECOND_LEAF, "a turn on the second branch again", 1)]
    back = [*on_second, *_turn("b1", FIRST_LEAF, "a turn back on the first branch", 2)]
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, _write(work, LINES))
        assert await _served(c) == (True, 1)
        await _import(c, _write(work, on_second))
        assert await _served(c) == (False, 0)  # the first branch, and its checkpoint, are hidden
        context = await c.call("session.context", {"sessionId": SID})
        texts = [b["text"] for m in context["messages"] for b in m["blocks"] if b.get("type") == "text"]
        assert texts[0] == "first question on the tree session" and SECOND_BRANCH in texts
        child = await c.call("session.fork", {"sessionId": SID})  # a fork does not take the hidden checkpoint
        child_window = await c.call("session.get", {"sessionId": child["id"], "full": True})
        assert child_window["compactions"] == []
        assert (await c.call("session.context", {"sessionId": child["id"]}))["compaction"] is None
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):  # the index rebuilt from the files agrees
        (data / name).unlink(missing_ok=True)
    async with inprocess_host(data) as host, client_for(host) as c:
        assert await _served(c) == (False, 0)
        await _import(c, _write(work, back))
        assert await _served(c) == (True, 1)  # back on the first branch: served again, once
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):  # its line is in the file twice now
        (data / name).unlink(missing_ok=True)
    async with inprocess_host(data) as host, client_for(host) as c:
        assert await _served(c) == (True, 1)


async def test_an_older_copy_hides_nothing_and_keeps_the_branches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    older = _write(tmp_path / "backup" / TREE.name,
                   LINES[: next(i for i, line in enumerate(LINES) if "The tool answered" in line) + 1])
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, TREE)
        shown = await _shown(c)
        revisions = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
        copy = await _import(c, older)  # a backup taken while the second branch was current
        assert copy["olderCopy"] and copy["archivedBranches"] == 0
        assert await _shown(c) == shown  # its branch's turns are kept hidden: nothing the newest file shows is
        assert (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"] == revisions
        assert await _input_tokens(c) == _pi_input(LINES)
        assert (await _import(c, TREE))["status"] == "unchanged"
        assert await _shown(c) == shown
    _no_temp_files(data)


# --------------------------------------------------------------------------- a wider tree, offline


def _entry(eid: str, parent: str | None, role: str, text: str, second: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}],
                               "timestamp": 1778547780000 + second * 1000}
    if role == "assistant":
        message.update({"api": "openai-completions", "provider": "stub", "model": "stub-model", "stopReason": "stop",
                        "usage": {"input": 10 * second, "output": 1, "cacheRead": 0, "cacheWrite": 0,
                                  "totalTokens": 10 * second + 1}})
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": f"2026-05-12T01:03:{second:02d}.000Z",
            "message": message}


# q1 was answered twice (a1, then a1' by a regenerate-like /tree to q1); from a1 the user asked q2A and q2B;
# under B, q3B and q3B' (a sub-branch inside the abandoned branch); the file's leaf is a3A on branch A.
WIDE = [_entry("e1", None, "user", "q1", 1), _entry("e2", "e1", "assistant", "a1", 2),
        _entry("e3", "e2", "user", "q2A", 3), _entry("e4", "e3", "assistant", "a2A", 4),
        _entry("e5", "e1", "assistant", "a1 again", 5),
        _entry("e6", "e2", "user", "q2B", 6), _entry("e7", "e6", "assistant", "a2B", 7),
        _entry("e8", "e7", "user", "q3B", 8), _entry("e9", "e8", "assistant", "a3B", 9),
        _entry("e10", "e7", "user", "q3B'", 10), _entry("e11", "e10", "assistant", "a3B'", 11),
        _entry("e12", "e4", "user", "q3A", 12), _entry("e13", "e12", "assistant", "a3A", 13)]
WIDE_HEADER = {"type": "session", "version": 3, "id": "019e19b4-0000-7000-8000-0000000wide1",
               "timestamp": "2026-05-12T01:02:27.657Z", "cwd": "/tmp/project"}


def _wide_state(target: ImportTarget, sid: str) -> tuple[list[str], dict[tuple[str, int], list[str]]]:
    t = read_transcript(target.transcript(sid))
    shown = [m.record["blocks"][0]["text"] for m in t.messages if m.id not in t.deleted_ids]
    rf = read_revisions(target.revisions(sid))
    stored = {(root.rsplit(":", 1)[-1], idx): [m["blocks"][0]["text"] for m in e.messages]
              for (root, idx), e in rf.entries.items()}
    return shown, stored


def _stamps(target: ImportTarget, sid: str) -> dict[str, tuple[int, int]]:
    """Root (short id) → the pager stamp (revisionCount, activeRevision) its transcript line carries."""
    t = read_transcript(target.transcript(sid))
    out = {}
    for m in t.messages:
        meta = m.record.get("meta") or {}
        if "activeRevision" in meta:
            assert meta["revisionRootId"] == m.id
            out[m.id.rsplit(":", 1)[-1]] = (meta["revisionCount"], meta["activeRevision"])
    return out


def test_every_branch_of_a_wider_tree_is_kept_once_and_a_switch_loses_nothing(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """Branches off a user message (another answer) and inside an abandoned branch, then a switch into one."""
    path = tmp_path / "pi" / "wide.jsonl"
    _write(path, [json.dumps(e) for e in [WIDE_HEADER, *WIDE]])
    (unit,) = IMPORTERS["pi"].discover(path)
    first = import_unit(db, unit, target, now_ms=NOW)
    sid = first.session_id
    assert first.archived_branches == 3
    shown, stored = _wide_state(target, sid)
    assert shown == ["q1", "a1", "q2A", "a2A", "q3A", "a3A"]
    assert stored == {("e1", 1): ["q1", "a1 again"],  # the other answer to q1: the family of q1, from q1 on
                      ("e1", 2): [],  # the live branch from q1: a reference
                      ("e3", 1): ["q2B", "a2B", "q3B", "a3B"],  # left after a1: the family of q2A
                      ("e3", 2): ["q2B", "a2B", "q3B'", "a3B'"],
                      ("e3", 3): []}
    assert sorted(rows(db, "SELECT root_user_id, revision_index, is_active, message_count FROM message_revisions "
                           "WHERE session_id = ?", sid)) == [
        (f"{sid}:e1", 1, 0, 2), (f"{sid}:e1", 2, 1, 6),
        (f"{sid}:e3", 1, 0, 4), (f"{sid}:e3", 2, 0, 4), (f"{sid}:e3", 3, 1, 4)]
    assert _stamps(target, sid) == {"e1": (2, 2), "e3": (3, 3)}
    every_reply = sum(e["message"]["usage"]["input"] for e in WIDE if e["message"]["role"] == "assistant")
    assert rows(db, "SELECT SUM(input_tokens) FROM turns WHERE session_id = ?", sid) == [(every_reply,)]
    # pi's /tree to a3B', a turn there
    moved = [*WIDE, _entry("e14", "e11", "user", "q4B'", 14)]
    _write(path, [json.dumps(e) for e in [WIDE_HEADER, *moved]])
    (unit,) = IMPORTERS["pi"].discover(path)
    second = import_unit(db, unit, target, now_ms=NOW + 1)
    assert second.status == "updated" and second.archived_branches == 2
    shown, stored = _wide_state(target, sid)
    assert shown == ["q1", "a1", "q2B", "a2B", "q3B'", "a3B'", "q4B'"]
    assert stored[("e6", 1)] == ["q2A", "a2A", "q3A", "a3A"]  # branch A, from where B left it
    assert stored[("e10", 1)] == ["q3B", "a3B"]
    # q2A left the transcript: the branch its reference named is stored in full (no reference is stranded);
    # q1's family changed nowhere near its root: its reference still names the live branch from q1
    assert stored[("e3", 3)] == ["q2A", "a2A", "q3A", "a3A"] and stored[("e1", 2)] == []
    assert stored[("e6", 2)] == stored[("e10", 2)] == []  # the live branches of the new families
    assert len(stored) == 9
    assert sorted(rows(db, "SELECT root_user_id, revision_index FROM message_revisions WHERE session_id = ? "
                           "AND is_active = 1", sid)) == [(f"{sid}:e1", 2), (f"{sid}:e10", 2), (f"{sid}:e3", 3),
                                                          (f"{sid}:e6", 2)]  # e3: as its (hidden) root's stamp says
    assert _stamps(target, sid) == {"e1": (2, 2), "e3": (3, 3), "e6": (2, 2), "e10": (2, 2)}
    texts = {e["message"]["content"][0]["text"] for e in moved}
    kept = set(shown) | {t for msgs in stored.values() for t in msgs}
    assert kept == texts  # every message of the file: on the branch, or in a revision
    (unit,) = IMPORTERS["pi"].discover(path)
    path.touch()
    assert import_unit(db, unit, target, now_ms=NOW + 2).status == "unchanged"
    assert _wide_state(target, sid)[1] == stored


def test_a_failed_revisions_append_leaves_nothing_and_the_retry_imports_it_all(tmp_path: Path,
                                                                               db: sqlite3.Connection) -> None:
    """An I/O error while the abandoned branches are appended: the import is refused and undone (no
    transcript, no revisions file, no temp file for a new session; the transcript cut back for an existing
    one), and the next import does it all."""
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    faults = Faults()
    target = ImportTarget(sessions, faults=faults)
    path = _write(tmp_path / "pi" / "wide.jsonl", [json.dumps(e) for e in [WIDE_HEADER, *WIDE]])
    (unit,) = IMPORTERS["pi"].discover(path)
    faults.add("revisions.after_write", 1, "eio")
    refused = import_unit(db, unit, target, now_ms=NOW)
    assert refused.status == "refused" and refused.reason == "IO_ERROR"
    assert sorted(p.name for p in sessions.iterdir()) == []
    assert rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    faults.clear()
    faults.add("revisions.after_write", 1, "raise")  # an error nobody expected: undone all the same
    with pytest.raises(InjectedFault):
        import_unit(db, unit, target, now_ms=NOW)
    assert sorted(p.name for p in sessions.iterdir()) == []
    faults.clear()
    sid = import_unit(db, unit, target, now_ms=NOW).session_id
    good = _wide_state(target, sid)
    moved = [*WIDE, _entry("e14", "e11", "user", "q4B'", 14)]
    _write(path, [json.dumps(e) for e in [WIDE_HEADER, *moved]])
    (unit,) = IMPORTERS["pi"].discover(path)
    before = (target.transcript(sid).read_bytes(), target.revisions(sid).read_bytes())
    faults.add("revisions.after_write", 1, "eio")
    assert import_unit(db, unit, target, now_ms=NOW + 1).status == "refused"
    assert (target.transcript(sid).read_bytes(), target.revisions(sid).read_bytes()) == before
    assert _wide_state(target, sid) == good
    faults.clear()
    assert import_unit(db, unit, target, now_ms=NOW + 2).status == "updated"
    shown, stored = _wide_state(target, sid)
    assert shown[-1] == "q4B'" and len(stored) == 9
    assert not [p.name for p in sessions.iterdir() if ".tmp" in p.name]


def test_a_rules_7_family_of_the_branch_after_a_summary_is_listed_but_not_paged(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rules 7 filed the tree's second branch (it starts with pi's branch summary) under the turn after the
    summary (``3122bc57``), as ``[summary, question, tool call, reply]``: restoring it would lose the family
    (no user turn to stamp). Upgraded, the branch is filed under the first question as a fresh import files
    it and that family is paged; the old variant stays listed (the store is append-only) but its family gets
    no live variant and no stamp, so nothing can switch to it."""
    path = _write(tmp_path / "pi" / TREE.name, LINES)
    (unit,) = IMPORTERS["pi"].discover(path)
    with monkeypatch.context() as m:  # rules 7, minus its revisions (written below as rules 7 wrote them)
        m.setattr(import_write, "IMPORT_RULES", 7)
        m.setattr(import_write, "_stamp_families", lambda *args: None)
        m.setattr(import_write, "_archive_off_branch", lambda *args: {})
        assert import_unit(db, unit, target, now_ms=NOW).status == "new"
    assert read_revisions(target.revisions(SID)).entries == {}
    records = {r["id"]: r for r in _tree_records(tmp_path, db)}
    legacy = [records[f"{SID}:{key}"] for key in ("0e99eaca", "4f214d4f", "c5f8c47a.0", "78acc440")]
    old_root = f"{SID}:3122bc57"
    append_revision_lines(target.revisions(SID), [revision_line(old_root, 1, legacy, {}, created_at_ms=NOW)])
    upsert_row(db, SID, old_root, 1, message_count=4, now_ms=NOW)
    db.commit()
    path.touch()
    assert import_unit(db, unit, target, now_ms=NOW + 1).status == "updated"  # parsed again: rules 8
    assert rows(db, "SELECT root_user_id, revision_index, is_active, message_count FROM message_revisions "
                    "WHERE session_id = ? ORDER BY 1, 2", SID) == [
        (old_root, 1, 0, 4), (ROOT, 1, 0, 6), (ROOT, 2, 1, 9)]
    assert _stamps(target, SID) == {ROOT.rsplit(":", 1)[-1]: (2, 2)}
    entries = read_revisions(target.revisions(SID)).entries
    assert {k: e.live for k, e in entries.items()} == {(old_root, 1): False, (ROOT, 1): False, (ROOT, 2): True}
    path.touch()
    assert import_unit(db, unit, target, now_ms=NOW + 2).status == "unchanged"


def _tree_records(tmp_path: Path, db: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every message record the tree file's second branch becomes (a fresh import of a file whose leaf is it)."""
    second = _write(tmp_path / "second" / TREE.name,
                    LINES[: next(i for i, line in enumerate(LINES) if "The tool answered" in line) + 1])
    scratch = ImportTarget(tmp_path / "scratch")
    scratch.sessions_dir.mkdir()
    conn = open_db(tmp_path / "scratch.sqlite")
    try:
        (unit,) = IMPORTERS["pi"].discover(second)
        import_unit(conn, unit, scratch, now_ms=NOW)
    finally:
        conn.close()
    return [dict(m.record) for m in read_transcript(scratch.transcript(SID)).messages]
