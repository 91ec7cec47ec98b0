"""Claude Code transcripts as Claude Code 2.1.332 writes them (found by ``scripts/fidelity`` on the files
recorded in ``tests/fixtures/recorded/claude-code/2.1.332``).

Reproduces: a finished background agent's ``<task-notification>`` (a ``user`` line with
``origin.kind: task-notification``, injected by the harness) was imported as a user message, shown as
if the user had typed it; the new bookkeeping lines (``api-request``, ``api-request-blob``,
``api-request-shape``, ``cost-state``, ``tools-used``) were counted as unknown record kinds, so every
import summary of a current session listed them as kinds the importer does not know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from store.interchange.importers import claude_code
from store.interchange.importers.common import ParseContext

SID = "4837f936-0000-4000-8000-000000000332"
TS = "2026-12-02T03:04:01.000Z"


def line(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "sessionId": SID, "timestamp": TS, "cwd": "/w/p", "version": "2.1.332", **fields}


def user(uuid: str, parent: str | None, content: Any, **extra: Any) -> dict[str, Any]:
    return line("user", uuid=uuid, parentUuid=parent, isSidechain=False, message={"role": "user", "content": content},
                **extra)


def parse(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    project = tmp_path / "projects" / "-w-p"
    project.mkdir(parents=True)
    (project / f"{SID}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (unit,) = claude_code.discover(tmp_path / "projects")
    parsed = claude_code.parse(unit, ParseContext())
    last: dict[str, dict[str, Any]] = {}
    for rec in parsed.records:
        last[rec["id"]] = rec
    return list(last.values()), parsed.report


NOTIFICATION = ("<task-notification>\n<task-id>a71108b4fe554fea9</task-id>\n<tool-use-id>toolu_1</tool-use-id>\n"
                "<status>completed</status>\n<result>echo printed child-ok.</result>\n</task-notification>")


def test_a_task_notification_is_a_system_notice_not_the_users_words(tmp_path: Path) -> None:
    records, _ = parse(tmp_path, [
        user("u1", None, "ask a subagent"),
        user("u2", "u1", NOTIFICATION, origin={"kind": "task-notification", "producer": "session-task",
                                               "runId": "r1"}),
    ])
    assert [r["blocks"][0]["text"] for r in records if r.get("role") == "user"] == ["ask a subagent"]
    (notice,) = [r for r in records if r["blocks"][0].get("text") == NOTIFICATION]
    assert notice["role"] == "system" and notice["meta"]["importedKind"] == "origin/task-notification"


def test_the_new_bookkeeping_lines_are_skipped_not_unknown(tmp_path: Path) -> None:
    _, report = parse(tmp_path, [
        user("u1", None, "hello"),
        line("api-request-shape", shapeHash="h1", shape={"system": []}),
        line("api-request-blob", hash="b1", content=[{"type": "text", "text": "x"}]),
        line("api-request", id="q1", shapeHash="h1", params={}),
        line("tools-used", tools=["Bash"]),
        line("cost-state", totalCostUSD=0.01, modelUsage={}),
    ])
    file = report.files[0]
    assert dict(file.unknown) == {}
    assert {k: file.skipped[k] for k in ("api-request-shape", "api-request-blob", "api-request", "tools-used",
                                         "cost-state")} == dict.fromkeys(
        ("api-request-shape", "api-request-blob", "api-request", "tools-used", "cost-state"), 1)


def assistant(uuid: str, parent: str, api_id: str, text: str, inp: int, out: int) -> dict[str, Any]:
    usage = {"input_tokens": inp, "output_tokens": out, "cache_read_input_tokens": 10,
             "cache_creation_input_tokens": 5}
    return line("assistant", uuid=uuid, parentUuid=parent, isSidechain=False,
                message={"id": api_id, "role": "assistant", "model": "claude-opus-5-5", "usage": usage,
                         "content": [{"type": "text", "text": text}]})


def cost_state(inp: int, out: int, read: int, write: int) -> dict[str, Any]:
    return line("cost-state", totalCostUSD=0.01, startTime=1, modelUsage={"claude-opus-5-5": {
        "inputTokens": inp, "outputTokens": out, "thinkingTokens": 0, "cacheReadInputTokens": read,
        "cacheCreationInputTokens": write, "webSearchRequests": 0, "costUSD": 0.01}})


def test_a_compaction_requests_usage_comes_from_the_cost_state_growth(tmp_path: Path) -> None:
    """Reproduces: ``/compact``'s own request (its summary is no message) was counted nowhere, so the host's
    usage of the recorded 2.1.332 session was 1,643 input tokens short of Claude Code's ``cost-state``
    totals. Its usage is the growth of those totals across the checkpoint, less any response between."""
    records, _ = parse(tmp_path, [
        user("u1", None, "remember heron"),
        assistant("a1", "u1", "msg_1", "noted", 100, 5),
        cost_state(100, 5, 10, 5),
        line("system", subtype="compact_boundary", uuid="b1", parentUuid=None, content="Conversation compacted",
             compactMetadata={"trigger": "manual", "preTokens": 2000}),
        user("s1", "b1", "This session is being continued ... heron.", isCompactSummary=True),
        user("m1", "s1", "<local-command-caveat>Caveat</local-command-caveat>", isMeta=True),
        user("c1", "m1", "<command-name>/compact</command-name>"),
        cost_state(400, 25, 30, 45),
        user("u2", "c1", "the word?"),
        assistant("a2", "u2", "msg_2", "heron", 150, 6),
        cost_state(550, 31, 40, 50),
    ])
    (checkpoint,) = [r for r in records if r["type"] == "compaction"]
    raw = {"input_tokens": 300, "output_tokens": 20, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 40}
    assert checkpoint["details"]["usageRaw"] == raw
    assert checkpoint["details"]["usage"] == {"input": 300, "output": 20, "cacheRead": 20, "cacheWrite": 40,
                                              "reasoning": 0, "totalTokens": 380}
    assert checkpoint["details"]["modelId"] == "claude-opus-5-5"
    order = [r.get("role") or r["type"] for r in records]
    assert order.index("compaction") < order.index("system")  # still at its place, before the caveat notice


def test_without_cost_state_a_checkpoint_carries_no_usage(tmp_path: Path) -> None:
    records, _ = parse(tmp_path, [
        user("u1", None, "remember heron"),
        assistant("a1", "u1", "msg_1", "noted", 100, 5),
        line("system", subtype="compact_boundary", uuid="b1", parentUuid=None, content="Conversation compacted"),
        user("s1", "b1", "summary", isCompactSummary=True),
        user("u2", "s1", "the word?"),
    ])
    (checkpoint,) = [r for r in records if r["type"] == "compaction"]
    assert "usage" not in checkpoint["details"] and checkpoint["summary"] == "summary"
