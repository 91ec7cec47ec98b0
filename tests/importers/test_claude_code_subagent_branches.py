"""A Claude Code subagent file's rows follow the branch of the ``Task`` call that started the subagent.

Reproduces: in a rewound session, the rows of ``<session>/subagents/agent-<id>.jsonl`` stayed in the live
transcript when the ``Agent`` call that started them was on the abandoned branch (only inline
``agent_progress`` rows moved with it), and the abandoned branch's revision lacked them.

The files are the recorded Claude Code 2.1.197 sessions (``tests/fixtures/recorded``): the ``subagent``
session (an ``Agent`` call, its subagent file, the call's result naming the agent) and the ``plain`` one,
joined into one session file the way Claude Code writes a rewind to the first prompt: the later prompt
starts a new root (``parentUuid: null``) in the same file, every earlier line stays. Each line is the
CLI's own; only ``sessionId`` (the joined session's) and, for the later part, ``timestamp`` (moved after
the earlier part, as a later prompt is written later) change.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from store.interchange import import_write, imports
from store.interchange.importers import claude_code, discover, parse
from store.interchange.importers.common import ParseContext, session_id_for
from store.revisions import read_revisions
from tests.hostkit import client_for, inprocess_host
from tests.revisions.helpers import revisions_path

PROJECT = (Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code" / "2.1.197" / "projects"
           / "-tmp-record-claude-code-5i6txzfu-work")
SUBAGENT = "b83c4cc4-f14b-49df-a64f-c754c837379f"
PLAIN = "3dcb9e04-4445-4326-abaa-41da3267233e"
AGENT_FILE = PROJECT / SUBAGENT / "subagents" / "agent-abe5a39f1de77961d.jsonl"
CALL_NAME = "Agent"


def _records(path: Path, *, sid: str, shift: timedelta = timedelta(0)) -> list[str]:
    out = []
    for raw in path.read_text().splitlines():
        rec = json.loads(raw)
        if "sessionId" in rec:
            rec["sessionId"] = sid
        if shift and isinstance(rec.get("timestamp"), str):
            ts = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")) + shift
            rec["timestamp"] = ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
        out.append(json.dumps(rec, ensure_ascii=False, separators=(",", ":")))
    return out


def _session(tmp: Path, *, agent_first: bool) -> Path:
    """One session file: the subagent turn then (rewound to the first prompt) the plain turn, or the other way
    round; the subagent file beside it."""
    project = tmp / "projects" / "-tmp-record-claude-code-5i6txzfu-work"
    (project / SUBAGENT / "subagents").mkdir(parents=True)
    shutil.copyfile(AGENT_FILE, project / SUBAGENT / "subagents" / AGENT_FILE.name)
    agent = _records(PROJECT / f"{SUBAGENT}.jsonl", sid=SUBAGENT)
    if agent_first:  # the plain session was recorded first: its turn moves after the subagent's
        lines = agent + _records(PROJECT / f"{PLAIN}.jsonl", sid=SUBAGENT, shift=timedelta(seconds=20))
    else:
        lines = _records(PROJECT / f"{PLAIN}.jsonl", sid=SUBAGENT) + agent
    main = project / f"{SUBAGENT}.jsonl"
    main.write_text("".join(line + "\n" for line in lines))
    return main


def _parse(path: Path) -> Any:
    (unit,) = discover("claude-code", path.parent)
    assert len(unit.files) == 2  # the main transcript and its subagent file
    return parse(unit, ParseContext())


def _attributed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("type") == "message" and (r.get("meta") or {}).get("agentName")]


def _call_id(records: list[dict[str, Any]]) -> str | None:
    return next((b["callId"] for r in records if r.get("type") == "message" for b in r["blocks"]
                 if b.get("type") == "tool_call" and b.get("name") == CALL_NAME), None)


def test_a_rewound_agent_calls_subagent_rows_go_with_its_branch(tmp_path: Path) -> None:
    parsed = _parse(_session(tmp_path, agent_first=True))
    live = list(parsed.records)
    assert parsed.off_branch is not None
    (branch,) = [records for _, records in parsed.off_branch()]
    assert _call_id(live) is None and _call_id(branch) is not None  # the Agent call is on the abandoned branch
    assert _attributed(live) == []  # none of its subagent's rows shows in the live transcript
    rows = _attributed(branch)
    assert len(rows) == 4 and {r["meta"]["parentToolCallId"] for r in rows} == {_call_id(branch)}
    texts = [b.get("text") for r in rows for b in r["blocks"] if b.get("type") == "text"]
    assert texts[0] == "[[scenario:subagent-child]] Run echo child-ok and report what it printed."
    ids = [r["id"] for r in branch]
    assert len(ids) == len(set(ids))
    # the branch shows the subagent between the call and the reply, as the live transcript did
    call_at = next(i for i, r in enumerate(branch) if r.get("type") == "message" and r["role"] == "tool")
    assert call_at < ids.index(rows[0]["id"]) and ids.index(rows[-1]["id"]) < len(ids) - 1
    assert parsed.report.off_branch >= 6  # the subagent file's lines are counted off the branch


def test_a_live_agent_calls_subagent_rows_stay_live(tmp_path: Path) -> None:
    parsed = _parse(_session(tmp_path, agent_first=False))
    live = list(parsed.records)
    assert parsed.off_branch is not None
    (branch,) = [records for _, records in parsed.off_branch()]
    assert _call_id(live) is not None and _call_id(branch) is None
    assert len(_attributed(live)) == 4 and _attributed(branch) == []


async def test_a_session_imported_before_moves_the_rows_on_reimport(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported by the build before rules 11 (the subagent rows live), the unchanged files are parsed again once:
    the rows leave the transcript and are in the abandoned branch's revision."""
    main = _session(tmp_path, agent_first=True)
    sid = session_id_for("claude-code", SUBAGENT)
    data = tmp_path / "data"
    root = str(main.parent)
    async with inprocess_host(data) as host, client_for(host) as c:
        with monkeypatch.context() as m:
            m.setattr(claude_code, "_agent_id", lambda path: None)  # the old build: no Task call is known
            m.setattr(import_write, "IMPORT_RULES", 10)
            m.setattr(imports, "IMPORT_RULES", 10)
            await c.call("import.sessions", {"source": "claude-code", "root": root})
        window = await c.call("session.get", {"sessionId": sid, "full": True})
        assert len(_attributed([{**m, "type": "message"} for m in window["messages"] if not m.get("deleted")])) == 4
        result = await c.call("import.sessions", {"source": "claude-code", "root": root})
        (report,) = result["sessions"]
        assert report["status"] == "updated" and report["hiddenOffBranch"] == 4, report
        window = await c.call("session.get", {"sessionId": sid, "full": True})
        assert _attributed([{**m, "type": "message"} for m in window["messages"] if not m.get("deleted")]) == []
    stored = read_revisions(revisions_path(data, sid))
    # the abandoned branch's variant holds its Agent call with the subagent's rows (the store also keeps, append
    # only, the variant it held before and what the transcript showed before: nothing once shown is lost)
    branches = [[{**m, "type": "message"} for m in e.messages] for e in stored.entries.values() if not e.live]
    with_call = [b for b in branches if _call_id(b) is not None]
    assert len(_attributed(with_call[-1])) == 4
