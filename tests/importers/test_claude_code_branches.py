"""A rewound Claude Code session imports the branch Claude Code shows; the abandoned ones go to revisions.

Claude Code writes a session as an append-only file whose lines form a tree through ``uuid`` /
``parentUuid``. A rewind (Esc Esc, pick an earlier prompt) writes nothing of its own: the next prompt
the user sends names as its ``parentUuid`` the line the picked prompt hung off, and every line after
that point stays in the file. Claude Code resumes and shows the branch ending at the newest line; the
importer took every line in file order, so the abandoned turns showed interleaved with the live ones.

No shared sample or recorded fixture holds a rewind (``tests/shared_samples/README.md``: "no genuine
sample with rewind/edit branches"), so each file here is a real transcript with exactly one line
re-parented the way Claude Code writes a rewind (:func:`_rewound`):

* ``resume``: the recorded 2.1.332 ``resume``+``compact`` session (``tests/fixtures/recorded``). Its
  third prompt ("One more time: the word?") gets the ``parentUuid`` of the second prompt ("What was the
  word?"): the user rewound to the second prompt after its reply and asked the third question instead.
  The second turn is abandoned; the ``/compact`` after the third turn stays a checkpoint of the live
  branch.
* ``first``: the same session, the second prompt re-parented to ``null``: a rewind to the very first
  prompt (Claude Code then starts a new root). The first turn is abandoned.
* ``task``: the genuine 2.1.38 sample ``spotter_v2.1.38_task_agent_progress``. Its last prompt ("create
  the beads") gets the parent of the second prompt: the user rewound to before the long turn that ran
  WebSearch, parallel tool calls, AskUserQuestion and a ``Task`` subagent (``agent_progress`` lines) and
  was interrupted. That whole turn is abandoned, with its subagent rows.
* ``compact``: the genuine 2.0.76 sample ``fasthooks_v2.0.76_compaction_thinking_errors``. Its fifth
  prompt gets the fourth prompt's parent: the fourth turn (a failing ``cat``) is abandoned; the
  ``compact_boundary`` after the fifth turn (``parentUuid: null``, ``logicalParentUuid``) is not a rewind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from store.interchange import import_write, imports
from store.interchange.importers import claude_code, discover, parse
from store.interchange.importers.common import ImportLimits, ParseContext, join_id, session_id_for
from store.revisions import read_revisions
from tests.hostkit import client_for, inprocess_host
from tests.revisions.helpers import revisions_path, transcript_path
from tests.samplekit import samples_dir

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code"
RESUME = next(RECORDED.glob("2.1.332/projects/*/9617099f-8f7a-4d84-a5a8-f6641f15ae29.jsonl"))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _uuid_of(recs: list[dict[str, Any]], text: str) -> str:
    """The uuid of the one user line whose prompt starts with ``text``."""
    (uuid,) = [r["uuid"] for r in recs if r.get("type") == "user" and _text(r).startswith(text)]
    return str(uuid)


def _text(rec: Mapping[str, Any]) -> str:
    content = rec.get("message", {}).get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or () if isinstance(b, Mapping))


def _rewound(src: Path, dst: Path, prompt: str, *, like: str | None) -> Path:
    """``src`` with one change: the user line whose prompt starts with ``prompt`` hangs off the line the
    prompt starting with ``like`` hung off (a rewind to ``like``), or starts a new root (``like`` None: a
    rewind to the first prompt). Every other line is the file's own, byte for byte (that one is written
    again as compact JSON with its keys in the file's order)."""
    recs = _lines(src)
    child = _uuid_of(recs, prompt)
    parent = None if like is None else next(r["parentUuid"] for r in recs if r.get("uuid") == _uuid_of(recs, like))
    out = []
    for line in src.read_text().splitlines():
        rec = json.loads(line) if line.strip() else None
        if rec is not None and rec.get("uuid") == child:
            rec["parentUuid"] = parent
            line = json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
        out.append(line)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(line + "\n" for line in out))
    return dst


def _resume(tmp: Path) -> Path:
    return _rewound(RESUME, tmp / "cc" / RESUME.name, "One more time: the word?", like="What was the word?")


def _first(tmp: Path) -> Path:
    return _rewound(RESUME, tmp / "cc" / RESUME.name, "What was the word?", like=None)


def _task(tmp: Path) -> Path:
    src = samples_dir() / "claude-code" / "spotter_v2.1.38_task_agent_progress.jsonl"
    return _rewound(src, tmp / "cc" / src.name, "create the beads", like="Create beads (epic")


def _compact(tmp: Path) -> Path:
    src = samples_dir() / "claude-code" / "fasthooks_v2.0.76_compaction_thinking_errors.jsonl"
    return _rewound(src, tmp / "cc" / src.name, "do something requiring multiple tools",
                    like="can you run `cat nonexistent.txt`")


def _leaf_path(recs: list[dict[str, Any]]) -> set[str]:
    """An independent reading of the branch Claude Code shows: from the newest user/assistant line up the
    ``parentUuid`` chain (a compact boundary continues at its ``logicalParentUuid``)."""
    by_uuid = {r["uuid"]: r for r in recs if isinstance(r.get("uuid"), str) and not r.get("isSidechain")}
    leaf = next(r for r in reversed(recs) if r.get("type") in ("user", "assistant") and not r.get("isSidechain"))
    out: set[str] = set()
    cur: dict[str, Any] | None = leaf
    while cur is not None:
        out.add(cur["uuid"])
        parent = cur.get("parentUuid") or cur.get("logicalParentUuid")
        cur = by_uuid.get(parent) if isinstance(parent, str) else None
    return out


def _prompts(recs: list[dict[str, Any]], uuids: set[str]) -> list[str]:
    """The words the user sent on the lines in ``uuids``, in file order (no harness line, no tool result)."""
    return [_text(r) for r in recs if r.get("uuid") in uuids and r.get("type") == "user" and not r.get("isMeta")
            and not r.get("isCompactSummary") and _text(r) and not _text(r).startswith("[Request interrupted")]


async def _import(c: Any, path: Path) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": "claude-code", "root": str(path)})
    (report,) = result["sessions"]
    assert report["status"] != "refused", report
    return dict(report)


async def _window(c: Any, sid: str) -> list[dict[str, Any]]:
    window = await c.call("session.get", {"sessionId": sid, "full": True})
    return [m for m in window["messages"] if not m.get("deleted")]


def _user_texts(messages: list[dict[str, Any]]) -> list[str]:
    return ["".join(b["text"] for b in m["blocks"] if b.get("type") == "text") for m in messages
            if m["role"] == "user"]


async def _archived(c: Any, sid: str) -> list[dict[str, Any]]:
    """Every message of every archived variant, as the host's pager reads them back (``session.tree``)."""
    tree = await c.call("session.tree", {"sessionId": sid})
    return [n for n in tree["nodes"] if n["id"].startswith("rev:")]


async def _input_tokens(c: Any, sid: str) -> int:
    return int((await c.call("usage.session", {"sessionId": sid}))["total"]["inputTokens"])


def _flat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The importer as it was before branches were split: every line in file order."""
    monkeypatch.setattr(claude_code, "_scan_tree", lambda path, limits, *found: None)


def _parse(path: Path, limits: ImportLimits | None = None) -> Any:
    (unit,) = discover("claude-code", path)
    return parse(unit, ParseContext(limits or ImportLimits()))


async def test_a_rewound_session_shows_the_leaf_branch_and_archives_the_abandoned_turn(tmp_path: Path) -> None:
    path = _resume(tmp_path)
    recs = _lines(path)
    sid = session_id_for("claude-code", path.stem)
    data = tmp_path / "data"
    async with inprocess_host(data) as host, client_for(host) as c:
        report = await _import(c, path)
        assert report["status"] == "new" and report["archivedBranches"] == 1
        assert report["offBranch"] == 3  # the abandoned prompt and the two lines of its reply
        shown = await _window(c, sid)
        on_path = _leaf_path(recs)
        assert _user_texts(shown) == _prompts(recs, on_path)
        assert _user_texts(shown)[:2] == ["[[scenario:resume]] Remember the word heron.", "One more time: the word?"]
        # every shown message is a line of the leaf's path, in file order
        assert [m["id"] for m in shown] == [join_id(sid, r["uuid"]) for r in recs if r.get("uuid") in on_path
                                            and join_id(sid, r["uuid"]) in {m["id"] for m in shown}]
        assert "What was the word?" not in _user_texts(shown)
        window = await c.call("session.get", {"sessionId": sid, "full": True})
        (checkpoint,) = window["compactions"]  # the /compact after the third turn: a checkpoint, not a rewind
        assert checkpoint["throughMessageId"] == join_id(sid, _leaf_reply(recs, "One more time: the word?"))
        # the abandoned turn, read back through the pager: a variant of the live prompt it replaced
        root = join_id(sid, _uuid_of(recs, "One more time: the word?"))
        revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
        assert [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
            (root, 1, False, 2), (root, 2, True, len(shown) - 2)]
        archived = await _archived(c, sid)
        assert [n["preview"] for n in archived] == ["What was the word?", "The word was heron."]
        switched = await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": root, "revisionIndex": 1})
        assert [(r["revisionIndex"], r["isActive"]) for r in switched["revisions"]] == [(1, True), (2, False)]
        assert _user_texts(await _window(c, sid)) == ["[[scenario:resume]] Remember the word heron.",
                                                      "What was the word?"]
        await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": root, "revisionIndex": 2})
        assert [m["id"] for m in await _window(c, sid)] == [m["id"] for m in shown]
        stored = revisions_path(data, sid).read_bytes()
        assert (await _import(c, path))["status"] == "unchanged"
        path.touch()  # parsed again: nothing to write
        again = await _import(c, path)
        assert again["status"] == "unchanged" and again["archivedBranches"] == 0
        assert revisions_path(data, sid).read_bytes() == stored
    assert not list((data / "sessions").glob("*.tmp*"))


def _leaf_reply(recs: list[dict[str, Any]], prompt: str) -> str:
    """The uuid of the first assistant line answering the prompt starting with ``prompt``."""
    uuid = _uuid_of(recs, prompt)
    return str(next(r["uuid"] for r in recs if r.get("type") == "assistant" and r.get("parentUuid") == uuid))


@pytest.mark.parametrize("make", [_resume, _first, _task, _compact], ids=["resume", "first", "task", "compact"])
async def test_no_message_is_lost_and_the_import_is_deterministic(tmp_path: Path, make: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message the file-order import made is either on the live branch or in an archived one (once),
    usage counts every response as before, and two imports of the file write the same bytes."""
    path = make(tmp_path)
    recs = _lines(path)
    sid = session_id_for("claude-code", path.stem)
    written = []
    for n in range(2):
        data = tmp_path / f"data{n}"
        async with inprocess_host(data) as host, client_for(host) as c:
            report = await _import(c, path)
            assert report["status"] == "new" and report["archivedBranches"] >= 1
            live = [m["id"] for m in await _window(c, sid)]
            stored = read_revisions(revisions_path(data, sid))
            archived = {str(m["id"]) for e in stored.entries.values() if not e.live for m in e.messages}
            tokens = await _input_tokens(c, sid)
        lines = transcript_path(data, sid).read_bytes().splitlines()
        header = json.loads(lines[0])
        assert header["type"] == "session"  # its epoch names this data directory's copy
        written.append(([json.dumps({**header, "epoch": None}).encode(), *lines[1:]],
                        revisions_path(data, sid).read_bytes()))
    assert written[0] == written[1]
    on_path = _leaf_path(recs)
    with monkeypatch.context() as m:
        _flat(m)
        data = tmp_path / "flat"
        async with inprocess_host(data) as host, client_for(host) as c:
            await _import(c, path)
            flat = [x["id"] for x in await _window(c, sid)]
            assert await _input_tokens(c, sid) == tokens
    assert set(flat) == set(live) | archived  # nothing lost, nothing made up
    assert len(live) == len(set(live)) and [x for x in flat if x in set(live)] == live  # the live order is the file's
    own = archived - set(live)
    assert own and not own & {join_id(sid, u) for u in on_path}  # no line of the leaf's path is archived only


async def test_the_task_turn_goes_with_its_subagent_rows(tmp_path: Path) -> None:
    path = _task(tmp_path)
    recs = _lines(path)
    sid = session_id_for("claude-code", path.stem)
    data = tmp_path / "data"
    async with inprocess_host(data) as host, client_for(host) as c:
        report = await _import(c, path)
        assert report["archivedBranches"] == 1
        shown = await _window(c, sid)
        assert not [m for m in shown if (m.get("meta") or {}).get("agentName")]  # the Task turn left the branch
        assert [m.get("toolName") for m in shown if m["role"] == "tool"] == ["Bash"] * 4
        assert _user_texts(shown)[-1] == "create the beads"
        stored = read_revisions(revisions_path(data, sid))
        (variant,) = [e for e in stored.entries.values() if not e.live]
        names = [m.get("toolName") for m in variant.messages if m["role"] == "tool"]
        assert "Task" in names and "AskUserQuestion" in names and names.count("WebSearch") == 5
        plan = [m for m in variant.messages if (m.get("meta") or {}).get("agentName") == "Plan"]
        task_call = next(b["callId"] for m in variant.messages for b in m["blocks"]
                         if b.get("type") == "tool_call" and b["name"] == "Task")
        assert len(plan) == 10 and {m["meta"]["parentToolCallId"] for m in plan} == {task_call}
        assert variant.messages[-1]["blocks"][0]["text"] == "[Request interrupted by user]"
        assert _prompts(recs, _leaf_path(recs))[-1] == "create the beads"


async def test_a_compaction_after_the_rewind_stays_the_live_branchs_checkpoint(tmp_path: Path) -> None:
    path = _compact(tmp_path)
    recs = _lines(path)
    sid = session_id_for("claude-code", path.stem)
    async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
        report = await _import(c, path)
        assert report["archivedBranches"] == 1 and report["compactions"] == 1
        window = await c.call("session.get", {"sessionId": sid, "full": True})
        shown = [m["id"] for m in window["messages"]]
        (checkpoint,) = window["compactions"]
        assert checkpoint["throughMessageId"] in shown and checkpoint["summary"].startswith("This session is being")
        assert (await c.call("session.context", {"sessionId": sid}))["compaction"] is not None
        texts = _user_texts(await _window(c, sid))
        assert "can you run `cat nonexistent.txt`" not in texts
        assert texts[:4] == _prompts(recs, _leaf_path(recs))[:4]
        archived = [(n["role"], n["preview"][:20]) for n in await _archived(c, sid)]
        assert archived == [("user", "can you run `cat non"), ("assistant", ""), ("tool", "Bash"),
                            ("assistant", "As expected, the com")]  # thinking, the failing call, the reply


async def test_a_rewind_to_the_first_prompt_starts_a_new_root(tmp_path: Path) -> None:
    """Claude Code writes the prompt after a rewind to the first one with ``parentUuid: null``: the first
    turn is abandoned, a variant of the new first prompt."""
    path = _first(tmp_path)
    recs = _lines(path)
    sid = session_id_for("claude-code", path.stem)
    async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
        await _import(c, path)
        shown = await _window(c, sid)
        assert _user_texts(shown)[:2] == ["What was the word?", "One more time: the word?"]
        root = join_id(sid, _uuid_of(recs, "What was the word?"))
        assert shown[0]["id"] == root
        revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
        assert [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
            (root, 1, False, 2), (root, 2, True, len(shown))]
        assert [n["preview"] for n in await _archived(c, sid)] == [
            "[[scenario:resume]] Remember the word heron.", "Noted: the word is heron."]


async def test_a_rewind_after_an_import_hides_the_abandoned_turn_and_archives_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file imported before the rewind (and one imported by the file-order importer, the rewind
    already in it), then the file as it is now: the abandoned turn is hidden and kept as a variant, and
    the session ends as a fresh import makes it."""
    path = _resume(tmp_path)
    sid = session_id_for("claude-code", path.stem)
    lines = path.read_text().splitlines(keepends=True)
    rewound_at = next(i for i, line in enumerate(lines) if "One more time: the word?" in line)
    before = tmp_path / "before" / path.name
    before.parent.mkdir()
    before.write_text("".join(lines[:rewound_at]))
    fresh = tmp_path / "fresh"
    async with inprocess_host(fresh) as host, client_for(host) as c:
        await _import(c, path)
        expected = [m["id"] for m in await _window(c, sid)]
        expected_revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
    for name, first in (("grown", before), ("flat", path)):
        data = tmp_path / name
        async with inprocess_host(data) as host, client_for(host) as c:
            if name == "flat":  # the build before rules 10: the same bytes are parsed again after the upgrade
                with monkeypatch.context() as m:
                    _flat(m)
                    m.setattr(import_write, "IMPORT_RULES", 9)
                    m.setattr(imports, "IMPORT_RULES", 9)
                    await _import(c, first)
                assert "What was the word?" in _user_texts(await _window(c, sid))  # interleaved, as it was
            else:
                await _import(c, first)
            report = await _import(c, path)
            assert report["status"] == "updated" and report["archivedBranches"] == 1, report
            assert report["hiddenOffBranch"] == 2  # the abandoned prompt and its reply
            assert [m["id"] for m in await _window(c, sid)] == expected
            revs = (await c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
            assert [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in revs] == [
                (r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"]) for r in expected_revs]
            assert [n["preview"] for n in await _archived(c, sid)] == ["What was the word?", "The word was heron."]
            assert (await _import(c, path))["status"] == "unchanged"


def _main_files() -> list[Path]:
    files = sorted((samples_dir() / "claude-code").glob("*.jsonl"))
    files += sorted(p for p in RECORDED.glob("*/projects/*/*.jsonl"))
    return files


@pytest.mark.parametrize("path", _main_files(), ids=lambda p: p.name[:40])
def test_a_file_without_branches_imports_as_before(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shared sample and recorded session has no rewind (parallel tool calls, hook and agent
    progress, sidechains, compaction boundaries are no branches): the records are those of the
    file-order importer, byte for byte, and nothing follows a branch."""
    parsed = _parse(path)
    assert not parsed.follows_branch and parsed.off_branch is None
    new = [json.dumps(r, sort_keys=True) for r in parsed.records]
    report = parsed.report.to_dict()
    with monkeypatch.context() as m:
        _flat(m)
        flat = _parse(path)
        assert [json.dumps(r, sort_keys=True) for r in flat.records] == new
        assert flat.report.to_dict() == report


def test_an_untrusted_or_oversized_tree_imports_in_file_order(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the tree bound (here 10 lines) or the branch bound, or with a live path that ends at a missing
    parent, the rewound file imports as before: every line live, in file order, nothing archived; a bound
    says so in the report. A line written twice word for word is one node: the file still splits. So does a
    uuid written again saying something else (rules 13): one node, the last line written (Claude Code's
    loader keeps a map by uuid), at the first line's place."""
    path = _resume(tmp_path)
    full = _parse(path)
    assert full.follows_branch and full.off_branch is not None
    live = list(full.records)
    small = _parse(path, ImportLimits(max_tracked_ids=10))
    assert not small.follows_branch and small.off_branch is None
    flat = [r["id"] for r in small.records]
    assert len(flat) == len({*flat}) == len(live) + 2  # the abandoned prompt and its reply, interleaved
    assert small.report.files[0].skipped["branches(not split: too many records)"] == 1
    with monkeypatch.context() as m:
        m.setattr(claude_code, "MAX_BRANCHES", 0)
        bounded = _parse(path)
        assert not bounded.follows_branch and [r["id"] for r in bounded.records] == flat
        assert bounded.report.files[0].skipped["branches(not split: too many branches)"] == 1
    lines = path.read_text().splitlines()
    first_prompt = next(line for line in lines if json.loads(line).get("type") == "user")
    dup = tmp_path / "dup" / "cc" / path.name  # the first prompt's uuid on a second line saying something else
    dup.parent.mkdir(parents=True)
    other = json.loads(first_prompt)
    other["message"] = {**other["message"], "content": "another prompt under the same uuid"}
    dup.write_text("".join(line + "\n" for line in [*lines, json.dumps(other)]))
    rewritten = _parse(dup)
    assert rewritten.follows_branch
    records = list(rewritten.records)
    assert [r["id"] for r in records] == [r["id"] for r in live]
    first = next(r for r in records if r["role"] == "user")
    assert first["id"].endswith(other["uuid"]) and first["blocks"][0]["text"] == "another prompt under the same uuid"
    assert rewritten.report.files[0].skipped["rewritten uuid"] == 1
    again = tmp_path / "again" / "cc" / path.name  # the first prompt's line written twice, word for word: one node
    again.parent.mkdir(parents=True)
    again.write_text("".join(line + "\n" for line in [*lines, first_prompt]))
    repeated = _parse(again)
    assert repeated.follows_branch and [r["id"] for r in repeated.records] == [r["id"] for r in live]
    dangling = tmp_path / "dangling" / "cc" / path.name  # the first prompt names a parent the file lacks
    dangling.parent.mkdir(parents=True)
    root = json.loads(first_prompt)
    assert root["parentUuid"] is None
    dangling.write_text("".join(
        (json.dumps({**root, "parentUuid": "not-in-this-file"}) if line == first_prompt else line) + "\n"
        for line in lines))
    parsed = _parse(dangling)
    assert not parsed.follows_branch and len(list(parsed.records)) == len(flat)
