"""A uuid written again saying something else is one message wherever Claude Code's loader reads it: the last
line written, at the first line's place.

Claude Code loads a transcript into a map by uuid (``loadTranscriptFile``: ``messages.set(entry.uuid, entry)``
for every user/assistant/attachment/system line, sidechain or not; a JavaScript map keeps a key at its first
insertion and takes the last value set). It loads a subagent's file the same way (``getAgentTranscript``:
``loadTranscriptFile`` of ``subagents/agent-<id>.jsonl``), and it writes such a file without deduplicating
uuids ("Skip dedup for agent sidechain LOCAL writes"; a resumed agent records its transcript again). A file
past the size where Claude Code reads it another way (``walkChainBeforeParse`` for a large file) still keys
its lines by uuid, the last line winning. Rules 13 (6978bc6) made the main transcript's lines one message
the same way, but only while its tree was split: an inline sidechain line (Claude Code 1.x), a line of a
subagent file, and any line of a file imported in file order because it is past a bound of the tree stayed
a second message ``<uuid>@<offset>``.

Every file here is a real one copied with one line appended (the line of a real record, its text and time
changed, as a rewrite writes it): the genuine 1.0.108 sample with inline sidechains, the recorded 2.1.332
``subagent`` session with its subagent file, and the recorded 2.1.332 ``resume`` session rewound (the file
of :mod:`tests.importers.test_claude_code_branches`) for the bounds. A session imported under rules 13
converges on one import under the current rules: the copy is hidden, the message holds the last text.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from store.interchange import import_write, imports
from store.interchange.importers import claude_code, discover, parse
from store.interchange.importers.common import ImportLimits, ParseContext, join_id, session_id_for
from tests.hostkit import client_for, inprocess_host
from tests.importers.test_claude_code_branches import _resume
from tests.samplekit import samples_dir

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code"
SUBAGENT_MAIN = next(RECORDED.glob("2.1.332/projects/*/e566c5b5-eb9c-4a97-8bf9-ce1ae66b6e32.jsonl"))
"""The recorded ``subagent`` session: an Agent call, ``subagents/agent-<id>.jsonl`` (+ ``.meta.json``) beside it."""
INLINE = "ccviewer_v1.0.108_inline_sidechains.jsonl"
"""The genuine 1.0.108 sample: two Task sidechains written inline (``isSidechain: true``) in the main file."""
NEW_TEXT = "Rewritten: the summary as the last line says it."
TIMEOUT = 60


def _said_otherwise(line: str, text: str, *, later: bool = True) -> str:
    """``line`` written again under its uuid, its text ``text`` (one text block); ``later``: a minute later."""
    rec = json.loads(line)
    if later:
        when = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")) + timedelta(minutes=1)
        rec["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    content = rec["message"]["content"]
    rec["message"] = {**rec["message"], "content": text if isinstance(content, str) else [
        {**b, "text": text} if isinstance(b, dict) and b.get("type") == "text" else b for b in content]}
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"))


def _text(record: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in record.get("blocks", ()) if b.get("type") == "text")


@dataclass
class _Parsed:
    messages: list[dict[str, Any]]
    report: Any
    follows_branch: bool


def _parse(path: Path, limits: ImportLimits | None = None) -> _Parsed:
    (unit,) = discover("claude-code", path)
    parsed = parse(unit, ParseContext(limits or ImportLimits()))
    messages = [r for r in parsed.records if r.get("type") == "message"]
    return _Parsed(messages, parsed.report, parsed.follows_branch)


def _inline(tmp: Path) -> tuple[Path, Path, str]:
    """The inline-sidechain sample as it is, and a copy whose first sidechain's summary reply (an assistant
    line with ``isSidechain: true``) is written again at the end saying something else; its uuid."""
    src = samples_dir() / "claude-code" / INLINE
    lines = src.read_text().splitlines()
    reply = next(ln for ln in lines if json.loads(ln).get("isSidechain") is True
                 and "Package.json Analysis Summary" in ln and json.loads(ln)["type"] == "assistant")
    plain = tmp / "plain" / INLINE
    changed = tmp / "changed" / INLINE
    for path, extra in ((plain, []), (changed, [_said_otherwise(reply, NEW_TEXT)])):
        path.parent.mkdir(parents=True)
        path.write_text("".join(line + "\n" for line in [*lines, *extra]))
    return plain, changed, str(json.loads(reply)["uuid"])


def _subagent(tmp: Path, name: str, *, rewrite: str | None) -> tuple[Path, str]:
    """A copy of the recorded subagent session (main transcript, subagent file, its meta); ``rewrite``: the
    subagent's last reply (``"assistant"``) or its prompt (``"user"``) written again at the end of its file
    saying something else. That line's uuid."""
    project = tmp / name / "projects" / SUBAGENT_MAIN.parent.name
    shutil.copytree(SUBAGENT_MAIN.with_suffix(""), project / SUBAGENT_MAIN.stem)
    shutil.copyfile(SUBAGENT_MAIN, project / SUBAGENT_MAIN.name)
    (agent,) = (project / SUBAGENT_MAIN.stem / "subagents").glob("agent-*.jsonl")
    lines = agent.read_text().splitlines()
    kind = rewrite or "assistant"
    line = next(ln for ln in (reversed(lines) if kind == "assistant" else lines) if json.loads(ln).get("type") == kind)
    if rewrite:  # as a resumed agent records its transcript again: each message keeps its own time
        agent.write_text("".join(ln + "\n" for ln in [*lines, _said_otherwise(line, NEW_TEXT, later=False)]))
    return project / SUBAGENT_MAIN.name, str(json.loads(line)["uuid"])


def _assert_one_message(before: _Parsed, after: _Parsed, sid: str, uuid: str) -> dict[str, Any]:
    """``after`` is ``before`` with the message of ``uuid`` holding :data:`NEW_TEXT` at its place: the same ids
    in the same order (no ``<uuid>@<offset>``), every other message alike, the other line counted skipped.
    That message."""
    old, new = before.messages, after.messages
    assert [r["id"] for r in new] == [r["id"] for r in old]
    at = next(i for i, r in enumerate(new) if r["id"] == join_id(sid, uuid))
    assert _text(new[at]) == NEW_TEXT and _text(old[at]) != NEW_TEXT
    assert new[at].get("meta") == old[at].get("meta")  # a subagent row keeps its attribution
    assert [r for i, r in enumerate(new) if i != at] == [r for i, r in enumerate(old) if i != at]
    assert sum(f.skipped["rewritten uuid"] for f in after.report.files) == 1
    return new[at]


def test_an_inline_sidechain_line_written_again_is_one_message_the_last(tmp_path: Path) -> None:
    plain, changed, uuid = _inline(tmp_path)
    sid = session_id_for("claude-code", changed.stem)
    row = _assert_one_message(_parse(plain), _parse(changed), sid, uuid)
    assert row["meta"]["agentName"] and row["meta"]["parentToolCallId"]  # still the Task call's sidechain


@pytest.mark.parametrize("kind", ["assistant", "user"])
def test_a_subagent_file_line_written_again_is_one_message_the_last(tmp_path: Path, kind: str) -> None:
    """The subagent's reply written again right after itself merged into it as one more block of the same
    response (its text doubled); its prompt written again was a second message after the reply."""
    plain, _ = _subagent(tmp_path, "plain", rewrite=None)
    changed, uuid = _subagent(tmp_path, "changed", rewrite=kind)
    sid = session_id_for("claude-code", changed.stem)
    after = _parse(changed)
    row = _assert_one_message(_parse(plain), after, sid, uuid)
    assert row["meta"]["parentToolCallId"] == "toolu_fake0004"  # the Agent call that started it
    assert after.follows_branch  # a re-import hides the copy an earlier import made (see below)


def _rewound_with(tmp: Path, name: str, extra: list[str]) -> Path:
    """The rewound recorded ``resume`` session (two branches) with ``extra`` lines appended."""
    path = _resume(tmp / name)
    lines = path.read_text().splitlines()
    path.write_text("".join(line + "\n" for line in [*lines, *extra]))
    return path


def _first_prompt(path: Path) -> str:
    return next(ln for ln in path.read_text().splitlines() if json.loads(ln).get("type") == "user")


def test_a_file_imported_in_file_order_keeps_one_message_per_uuid_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the tree's record bound (here 10 lines) or its branch bound the rewound file imports in file order,
    every line live, as before; a uuid written again saying something else is still one message, the last
    line written, at the first one's place. So it already was for a live path that ends at a missing parent
    (the tree read the whole file then): asserted here too. A uuid on lines of two types (hand-made data)
    leaves that uuid's lines as they were, and no longer turns off the rule for the file's other uuids."""
    plain = _rewound_with(tmp_path, "plain", [])
    sid = session_id_for("claude-code", plain.stem)
    first = _first_prompt(plain)
    uuid = str(json.loads(first)["uuid"])
    changed = _rewound_with(tmp_path, "changed", [_said_otherwise(first, NEW_TEXT)])
    small = ImportLimits(max_tracked_ids=10)
    before, after = _parse(plain, small), _parse(changed, small)
    assert not before.follows_branch and before.report.files[0].skipped["branches(not split: too many records)"]
    assert after.report.files[0].skipped["branches(not split: too many records)"] == 1
    _assert_one_message(before, after, sid, uuid)
    with monkeypatch.context() as m:
        m.setattr(claude_code, "MAX_BRANCHES", 0)
        before, after = _parse(plain), _parse(changed)
        assert after.report.files[0].skipped["branches(not split: too many branches)"] == 1
        _assert_one_message(before, after, sid, uuid)
    root = json.dumps({**json.loads(first), "parentUuid": "not-in-this-file"})  # the live path ends there
    dangling = [root if line == first else line for line in plain.read_text().splitlines()]
    plain_dangling = _rewound_with(tmp_path, "plain-dangling", [])
    plain_dangling.write_text("".join(line + "\n" for line in dangling))
    changed_dangling = _rewound_with(tmp_path, "changed-dangling", [])
    changed_dangling.write_text("".join(line + "\n" for line in [*dangling, _said_otherwise(root, NEW_TEXT)]))
    _assert_one_message(_parse(plain_dangling), _parse(changed_dangling), sid, uuid)
    # hand-made: the reply's uuid also on a user line; the first prompt's uuid written again as above
    reply = next(ln for ln in plain.read_text().splitlines() if json.loads(ln).get("type") == "assistant")
    other_kind = json.dumps({**json.loads(first), "uuid": json.loads(reply)["uuid"]})
    mixed_plain = _rewound_with(tmp_path, "mixed-plain", [other_kind])
    mixed = _rewound_with(tmp_path, "mixed", [other_kind, _said_otherwise(first, NEW_TEXT)])
    before, after = _parse(mixed_plain), _parse(mixed)
    assert not after.report.files[0].skipped.get("branches(not split: too many records)")
    assert sum(1 for r in after.messages if "@" in r["id"]) == 1  # the user line under the reply's uuid
    _assert_one_message(before, after, sid, uuid)


# --------------------------------------------------------------------------- a session imported under rules 13


async def _import(c: Any, root: Path) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": "claude-code", "root": str(root)})
    assert result["counts"]["refused"] == 0, result
    return dict(result)


async def _shown(c: Any, sid: str) -> list[tuple[str, str]]:
    window = await c.call("session.get", {"sessionId": sid, "full": True})
    return [(m["id"], "".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text"))
            for m in window["messages"] if not m.get("deleted")]


async def _converges(tmp: Path, monkeypatch: pytest.MonkeyPatch, root: Path, sid: str, uuid: str) -> None:
    """``root`` imported by the importer of rules 13 (the line written again a message of its own, after the
    rest) and then by the current one: the unchanged file is parsed again, the copy is hidden, the message
    holds the last line's text at its place, as a fresh import shows it; a restart serves the same and a
    further import is ``unchanged``."""
    async with inprocess_host(tmp / "fresh") as host, client_for(host) as c:
        await _import(c, root)
        fresh = await _shown(c, sid)
    assert len({m for m, _ in fresh}) == len(fresh) and (join_id(sid, uuid), NEW_TEXT) in fresh
    data = tmp / "data"
    with monkeypatch.context() as m:
        m.setattr(claude_code, "MAX_REPEATED_IDS", 0)  # no uuid written again is one message here: rules 13
        m.setattr(import_write, "IMPORT_RULES", 13)
        m.setattr(imports, "IMPORT_RULES", 13)
        async with inprocess_host(data) as host, client_for(host) as c:
            await _import(c, root)
            before = await _shown(c, sid)
            assert len(before) == len(fresh) + 1 and any(mid.startswith(join_id(sid, f"{uuid}@")) for mid, _ in before)
    async with inprocess_host(data) as host, client_for(host) as c:
        again = await _import(c, root)
        (report,) = again["sessions"]
        assert report["status"] == "updated" and report["hiddenOffBranch"] == 1, report
        assert again["newMessages"] == 0
        assert await _shown(c, sid) == fresh
    async with inprocess_host(data) as host, client_for(host) as c:
        assert await _shown(c, sid) == fresh
        assert (await _import(c, root))["counts"]["unchanged"] == 1


async def test_an_inline_sidechain_copy_imported_under_rules_13_is_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, changed, uuid = _inline(tmp_path)
    with trio.fail_after(TIMEOUT):
        await _converges(tmp_path, monkeypatch, changed, session_id_for("claude-code", changed.stem), uuid)


async def test_a_subagent_file_copy_imported_under_rules_13_is_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changed, uuid = _subagent(tmp_path, "changed", rewrite="user")
    with trio.fail_after(TIMEOUT):
        await _converges(tmp_path, monkeypatch, changed.parent.parent, session_id_for("claude-code", changed.stem),
                         uuid)


async def test_a_file_in_file_order_copy_imported_under_rules_13_is_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _rewound_with(tmp_path, "plain", [])
    first = _first_prompt(plain)
    changed = _rewound_with(tmp_path, "changed", [_said_otherwise(first, NEW_TEXT)])
    monkeypatch.setattr(claude_code, "MAX_BRANCHES", 0)  # past the branch bound: in file order
    with trio.fail_after(TIMEOUT):
        await _converges(tmp_path, monkeypatch, changed, session_id_for("claude-code", changed.stem),
                         str(json.loads(first)["uuid"]))


# --------------------------------------------------------------------------- a forked agent's copy of the conversation


def _forked(tmp: Path, name: str) -> tuple[Path, list[tuple[str, str]]]:
    """A copy of the recorded subagent session whose subagent file starts with the main transcript's messages
    before the Agent call, as a forked agent writes the conversation it forked (``runForkedAgent``:
    ``recordSidechainTranscript(forkContextMessages + prompt)``; each line the main one's, with ``isSidechain``,
    the agent's ``agentId`` and the chain threaded through them; the agent's own first line hangs off the last).
    The genuine 2.1.39 ``agent-acompact`` sample starts so: lines of the parent conversation, their parents in
    the parent session. The inherited lines' uuids and types."""
    main, _ = _subagent(tmp, name, rewrite=None)
    (agent,) = (main.with_suffix("") / "subagents").glob("agent-*.jsonl")
    recs = [json.loads(ln) for ln in main.read_text().splitlines()]
    call = next(i for i, r in enumerate(recs) if r.get("type") == "assistant")
    forked, parent = [], None
    for r in recs[:call]:
        if r.get("type") in ("user", "assistant", "attachment"):
            forked.append({**r, "parentUuid": parent, "isSidechain": True, "agentId": agent.stem[len("agent-"):]})
            parent = r["uuid"]
    own = agent.read_text().splitlines()
    first = {**json.loads(own[0]), "parentUuid": parent}
    agent.write_text("".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in forked)
                     + json.dumps(first, ensure_ascii=False, separators=(",", ":")) + "\n"
                     + "".join(ln + "\n" for ln in own[1:]))
    return main, [(r["uuid"], r["type"]) for r in forked]


def test_a_forked_agents_copy_of_the_conversation_leaves_the_main_transcripts_lines_as_they_are(
        tmp_path: Path) -> None:
    """The copy took the main line's id and, coming later, was its last line: the user's prompt became a row of
    the subagent (``meta.agentName``). The session is what it is without the copy; the copy's lines are counted."""
    plain, _ = _subagent(tmp_path, "plain", rewrite=None)
    changed, uuids = _forked(tmp_path, "forked")
    before, after = _parse(plain), _parse(changed)
    assert [r["id"] for r in after.messages] == [r["id"] for r in before.messages]
    assert after.messages == before.messages
    said = [r for r in uuids if r[1] in ("user", "assistant")]  # an attachment line makes no message anyway
    assert sum(f.skipped["inherited uuid"] for f in after.report.files) == len(said) > 0


async def test_a_forked_agents_copy_imported_under_rules_14_gives_the_lines_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    changed, _ = _forked(tmp_path, "forked")
    sid = session_id_for("claude-code", changed.stem)
    root = changed.parent.parent
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(tmp_path / "fresh") as host, client_for(host) as c:
            await _import(c, root)
            fresh = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
        prompt = fresh[0]
        assert prompt["role"] == "user" and "agentName" not in (prompt.get("meta") or {})
        data = tmp_path / "data"
        with monkeypatch.context() as m:
            m.setattr(claude_code, "MAX_INHERITED_IDS", 0)  # the copy is converted: rules 14
            m.setattr(import_write, "IMPORT_RULES", 14)
            m.setattr(imports, "IMPORT_RULES", 14)
            async with inprocess_host(data) as host, client_for(host) as c:
                await _import(c, root)
                before = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
                assert before[0]["id"] == prompt["id"] and before[0]["meta"]["agentName"]  # the prompt, the agent's
        async with inprocess_host(data) as host, client_for(host) as c:
            again = await _import(c, root)
            assert again["sessions"][0]["status"] == "updated" and again["newMessages"] == 0
            shown = await _shown(c, sid)
            assert shown == [(m["id"], "".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text"))
                             for m in fresh]
            window = (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]
            assert [m.get("meta") for m in window] == [m.get("meta") for m in fresh]
        async with inprocess_host(data) as host, client_for(host) as c:
            assert (await _import(c, root))["counts"]["unchanged"] == 1
