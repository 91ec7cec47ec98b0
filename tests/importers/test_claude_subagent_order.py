"""Claude Code subagent rows come at their time position, attributed to their Task call (issue 23 item 3).

Reproduces: the rows of ``<session>/subagents/agent-<id>.jsonl`` were appended after the whole parent
conversation as plain user/assistant rows, so ``pi-host show`` printed the subagent's prompt last, as
if the user had typed it. The subagent file is the real Claude Code 2.1.39 sample
(``spotter_v2.1.39_subagent_file_websearch.jsonl``, agent ``aac57f5``); the parent file around it has
the shape of Claude Code 2.1.x main transcripts (a ``Task`` call, its result with
``toolUseResult.agentId`` written after the subagent finished).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from runtime.cli_client import print_window
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from store.transcripts import windows
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, sample_files

SID = "ae4a77f8-0000-4000-8000-000000000001"
CALL = "toolu_task_0001"


def line(kind: str, uuid: str, parent: str | None, ts: str, message: dict[str, Any],
         **extra: Any) -> dict[str, Any]:
    return {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": SID, "timestamp": ts,
            "isSidechain": False, "cwd": "/tmp/project", "version": "2.1.39", "message": message, **extra}


def main_file() -> list[dict[str, Any]]:
    task = {"type": "tool_use", "id": CALL, "name": "Task",
            "input": {"description": "versions", "subagent_type": "general-purpose", "prompt": "Search hex.pm"}}
    return [
        line("user", "u1", None, "2026-02-12T14:12:30.000Z", {"role": "user", "content": "find the versions"}),
        line("assistant", "a1", "u1", "2026-02-12T14:12:32.000Z",
             {"id": "msg_1", "role": "assistant", "model": "claude-opus-4-6", "content": [task]}),
        line("user", "r1", "a1", "2026-02-12T14:13:06.000Z",
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": CALL,
                                            "content": [{"type": "text", "text": "the report"}]}]},
             toolUseResult={"agentId": "aac57f5", "status": "completed"}),
        line("assistant", "a2", "r1", "2026-02-12T14:13:10.000Z",
             {"id": "msg_2", "role": "assistant", "model": "claude-opus-4-6",
              "content": [{"type": "text", "text": "Here are the versions."}]}),
        line("user", "u2", "a2", "2026-02-12T14:14:00.000Z", {"role": "user", "content": "thanks"}),
    ]


@pytest.fixture
def session(tmp_path: Path) -> Path:
    (sample,) = [p for p in sample_files("claude-code") if p.name == "spotter_v2.1.39_subagent_file_websearch.jsonl"]
    project = tmp_path / "projects" / "-tmp-project"
    (project / SID / "subagents").mkdir(parents=True)
    shutil.copyfile(sample, project / SID / "subagents" / "agent-aac57f5.jsonl")
    (project / f"{SID}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in main_file()))
    return project


def test_subagent_rows_follow_their_task_call_and_precede_its_result(session: Path, db: sqlite3.Connection,
                                                                     target: ImportTarget,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (unit,) = IMPORTERS["claude-code"].discover(session)
    outcome = import_unit(db, unit, target, now_ms=NOW)
    messages = read_transcript(target.transcript(outcome.session_id)).messages
    records = [m.record for m in messages]
    attributed = [i for i, r in enumerate(records) if (r.get("meta") or {}).get("agentName")]
    task = next(i for i, r in enumerate(records) if r["role"] == "tool" and r["blocks"][0]["callId"] == CALL)
    reply = next(i for i, r in enumerate(records) if r["role"] == "assistant"
                 and r["blocks"][0].get("text") == "Here are the versions.")
    thanks = next(i for i, r in enumerate(records) if r["role"] == "user" and r["blocks"][0].get("text") == "thanks")
    assert len(attributed) == 16  # the sample: its prompt, 3 assistant texts, 12 tool calls with their results
    # the subagent ran between the Task call and the parent's next reply, not after the whole conversation
    assert task < min(attributed) and max(attributed) < reply < thanks
    prompt = records[min(attributed)]
    assert prompt["role"] == "user" and prompt["blocks"][0]["text"].startswith("Search hex.pm for the latest")
    assert all(records[i]["meta"] == {**records[i]["meta"], "parentToolCallId": CALL, "agentName": "general-purpose"}
               for i in attributed)
    # what `pi-host show` prints: the subagent's prompt is labelled, never a bare "user:" line
    req = windows.WindowRequest(before=None, start=None, limit=100, content_limit=None, around=None)
    window = windows.read_cold(db, outcome.session_id, target.transcript(outcome.session_id), req)
    print_window(json.loads(window.reply), argparse.Namespace(json=False))
    out = capsys.readouterr().out.splitlines()
    prompt_line = next(x for x in out if "Search hex.pm for the latest" in x)
    assert "user [subagent general-purpose]:" in prompt_line
    assert out[-1].endswith("user: thanks")
