"""Codex rollouts as current Codex CLIs write them (issue 23, Codex, medium).

Reproduces: a failed ``exec_command`` (exit 1) imported as ``status: ok`` (the current output is plain
text, the structured status is in ``event_msg`` ``item_completed``, which was skipped); the usage of a
response that only calls a tool was dropped (host totals 50-66 % of Codex's own), and the
``token_usage_record`` lines that hold it per ``response_id`` were not read.

Shapes not in the shared samples come from the public Codex source:
* ``item_completed`` ``CommandExecution``: openai/codex ``codex-rs/protocol/src/items.rs``
  (``CommandExecutionItem``: ``id`` is the call id, ``status`` inProgress|completed|failed|declined,
  ``exitCode`` in camelCase there; the curated sample in samples/codex has ``exit_code``);
* ``token_usage_record``: openai/codex codex-rs protocol ``TokenUsageRecord`` (``thread_id``,
  ``turn_id``, ``session_id``, ``root_turn_id``, ``response_id``, ``usage``, ``turn_token_usage``,
  ``thread_token_usage``, ``attribution``, ``completed_at_ms``), persisted as
  ``RolloutItem::TokenUsageRecord`` by core's ``record_observed_response_completed``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.interchange.import_write import ImportTarget
from store.interchange.importers import codex
from store.interchange.importers.common import ParseContext
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, sample_files

SID = "019f0000-0000-7000-8000-0000000c0de5"
TS = "2026-09-01T10:00:00.000Z"
FAILED_TEXT = ("Chunk ID: 3f2a\nWall time: 0.0021 seconds\nProcess exited with code 1\nOriginal token count: 4\n"
               "Output:\nls: cannot access 'nope': No such file or directory\n")
OK_TEXT = ("Chunk ID: 3f2b\nWall time: 0.0019 seconds\nProcess exited with code 0\nOriginal token count: 2\n"
           "Output:\na.txt\n")


def line(kind: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"timestamp": TS, "type": kind, **extra, "payload": payload}


def head() -> list[dict[str, Any]]:
    return [
        line("session_meta", {"id": SID, "timestamp": TS, "cwd": "/w/p", "originator": "codex_cli_rs",
                              "cli_version": "0.170.0", "model_provider": "openai"}),
        line("event_msg", {"type": "thread_settings_applied", "thread_settings": {
            "cwd": "/w/p", "model": "gpt-test", "model_provider_id": "openai", "reasoning_effort": "medium"}}),
        line("turn_context", {"turn_id": "t1", "cwd": "/w/p", "model": "gpt-test"}, ordinal=1),
        line("world_state", {"full": True, "state": {"model": "gpt-test"}}, ordinal=2),
        line("response_item", {"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": "list the files"}]}, ordinal=3),
    ]


def call(call_id: str) -> dict[str, Any]:
    return line("response_item", {"type": "function_call", "name": "exec_command", "call_id": call_id,
                                  "arguments": json.dumps({"cmd": "ls nope"})})


def output(call_id: str, text: str) -> dict[str, Any]:
    return line("response_item", {"type": "function_call_output", "call_id": call_id, "output": text})


def completed(call_id: str, status: str, code: int, *, camel: bool = False) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "CommandExecution", "id": call_id, "command": ["bash", "-lc", "ls nope"],
                            "cwd": "/w/p", "parsed_cmd": [], "source": "agent", "status": status,
                            "aggregated_output": "ls: cannot access 'nope'"}
    item["exitCode" if camel else "exit_code"] = code
    return line("event_msg", {"type": "item_completed", "thread_id": SID, "turn_id": "t1", "item": item,
                              "completed_at_ms": 0})


def usage(inp: int, out: int) -> dict[str, Any]:
    return {"input_tokens": inp, "cached_input_tokens": 0, "output_tokens": out, "reasoning_output_tokens": 0,
            "total_tokens": inp + out}


def usage_record(response_id: str, inp: int, out: int) -> dict[str, Any]:
    return line("token_usage_record", {
        "thread_id": SID, "turn_id": "t1", "session_id": SID, "root_turn_id": "t1", "response_id": response_id,
        "usage": usage(inp, out), "turn_token_usage": usage(inp * 10, out * 10),
        "thread_token_usage": usage(inp * 100, out * 100),
        "attribution": {"model": "gpt-test", "model_provider": "openai"}, "completed_at_ms": 1})


def token_count(inp: int, out: int) -> dict[str, Any]:
    return line("event_msg", {"type": "token_count", "info": {"last_token_usage": usage(inp, out),
                                                              "total_token_usage": usage(inp * 7, out * 7)}})


def parse(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], Any]:
    path = tmp_path / f"rollout-2026-09-01T10-00-00-{SID}.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    parsed = codex.parse(next(codex.discover(path)), ParseContext())
    records = list(parsed.records)
    last: dict[str, dict[str, Any]] = {}
    for rec in records:  # readers keep the last line per id
        last[rec["id"]] = rec
    return list(last.values()), parsed.report


def tool(records: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    (block,) = [r["blocks"][0] for r in records if r.get("role") == "tool" and r["blocks"][0]["callId"] == call_id]
    return block


@pytest.mark.parametrize("order", ["event-after-output", "event-before-output", "camel-case"])
def test_a_failed_exec_command_is_an_error_with_its_exit_code(tmp_path: Path, order: str) -> None:
    events = {
        "event-after-output": [call("c1"), output("c1", "boom"), completed("c1", "failed", 1)],
        "event-before-output": [call("c1"), completed("c1", "failed", 1), output("c1", "boom")],
        "camel-case": [call("c1"), output("c1", "boom"), completed("c1", "failed", 1, camel=True)],
    }[order]
    records, report = parse(tmp_path, [*head(), *events])
    block = tool(records, "c1")
    assert (block["status"], block["exitCode"], block["result"]) == ("error", 1, "boom")
    assert dict(report.files[0].unknown) == {}


def test_the_plain_text_output_and_exec_command_end_carry_the_exit_code(tmp_path: Path) -> None:
    ended = line("event_msg", {"type": "exec_command_end", "call_id": "c3", "exit_code": 2, "stdout": "",
                               "stderr": "x", "aggregated_output": "x"})
    records, _ = parse(tmp_path, [*head(), call("c1"), output("c1", FAILED_TEXT), call("c2"), output("c2", OK_TEXT),
                                  call("c3"), ended, output("c3", "x"),
                                  call("c4"), output("c4", "fine"), completed("c4", "completed", 0)])
    assert (tool(records, "c1")["status"], tool(records, "c1")["exitCode"]) == ("error", 1)
    assert (tool(records, "c2")["status"], tool(records, "c2")["exitCode"]) == ("ok", 0)
    assert (tool(records, "c3")["status"], tool(records, "c3")["exitCode"]) == ("error", 2)
    assert (tool(records, "c4")["status"], tool(records, "c4")["exitCode"]) == ("ok", 0)


def test_tool_only_responses_keep_their_usage_once_per_response(tmp_path: Path) -> None:
    assistant = line("response_item", {"type": "message", "role": "assistant",
                                       "content": [{"type": "output_text", "text": "done"}]})
    lines = [*head(),
             # response r1 only calls a tool: the record and the token_count event report it twice
             call("c1"), usage_record("r1", 100, 10), token_count(100, 10), output("c1", OK_TEXT),
             # response r2 answers: the token_count event comes first, the exact record after it
             assistant, token_count(999, 99), usage_record("r2", 200, 20),
             # a usage record of a response that produced nothing (a compaction request): not counted
             usage_record("r3", 5, 5)]
    records, report = parse(tmp_path, lines)
    with_usage = [r for r in records if (r.get("meta") or {}).get("usage")]
    assert [(r["role"], r["meta"]["responseId"], r["meta"]["usageRaw"]["total_tokens"]) for r in with_usage] == [
        ("tool", "r1", 110), ("assistant", "r2", 220)]
    assert with_usage[0]["meta"]["modelId"] == "gpt-test"  # thread_settings_applied named the model
    files = report.files[0]
    assert dict(files.unknown) == {}  # world_state, thread_settings_applied, token_usage_record, ordinal
    assert files.skipped["token_usage_record(no message)"] == 1


@pytest.mark.parametrize("name", ["localpush_desktop-0.104_REDACTED_multi_turn_apply_patch_web_search.jsonl",
                                  "localpush_desktop-0.104_REDACTED_single_turn.jsonl"])
def test_real_rollouts_import_exactly_codex_own_token_totals(name: str, tmp_path: Path, db: sqlite3.Connection,
                                                              target: ImportTarget) -> None:
    """The sum of the imported per-message usage equals the rollout's last cumulative total."""
    found = [p for p in sample_files("codex") if p.name == name]
    if not found:
        pytest.skip(f"sample {name} not here")
    path = found[0]
    total: dict[str, int] = {}
    for raw in path.read_text().splitlines():
        rec = json.loads(raw)
        payload = rec.get("payload") or {}
        if payload.get("type") == "token_count" and isinstance(payload.get("info"), dict):
            total = payload["info"]["total_token_usage"]
    rep = import_unit(db, next(codex.discover(path)), target, now_ms=NOW)
    t = read_transcript(target.transcript(rep.session_id))
    sums = {k: 0 for k in ("input_tokens", "cached_input_tokens", "output_tokens", "total_tokens")}
    for m in t.messages:
        got = (m.record.get("meta") or {}).get("usageRaw") or {}
        for k in sums:
            sums[k] += int(got.get(k, 0))
    assert sums == {k: total[k] for k in sums}


def say(text: str, msg_id: str) -> dict[str, Any]:
    return line("response_item", {"type": "message", "role": "assistant", "id": msg_id,
                                  "content": [{"type": "output_text", "text": text, "annotations": []}]})


def test_two_responses_of_two_turns_stay_two_messages_each_with_its_usage(tmp_path: Path) -> None:
    """Reproduces (scripts/fidelity on the recorded codex 0.171.0 compaction rollout): an assistant reply, its
    ``token_usage_record``, then the next turn's first response (here the automatic compaction's summary
    reply, after only ``event_msg`` lines) was merged into the previous reply's message: its text took the
    earlier timestamp and its usage replaced the earlier response's (host totals short by one response)."""
    turn_two = [line("event_msg", {"type": "task_complete", "turn_id": "t1"}),
                line("event_msg", {"type": "task_started", "turn_id": "t2"}),
                {**say("Checkpoint summary: teal.", "m2"), "timestamp": "2026-09-01T10:00:05.000Z"},
                usage_record("r2", 300, 7)]
    records, _ = parse(tmp_path, [*head(), say("Noted: teal.", "m1"), usage_record("r1", 100, 5), *turn_two])
    replies = [r for r in records if r.get("role") == "assistant"]
    assert [[b["text"] for b in r["blocks"]] for r in replies] == [["Noted: teal."], ["Checkpoint summary: teal."]]
    assert [r["createdAt"] for r in replies] == ["2026-09-01T10:00:00.000Z", "2026-09-01T10:00:05.000Z"]
    assert [r["meta"]["responseId"] for r in replies] == ["r1", "r2"]
    assert [r["meta"]["usage"]["input"] for r in replies] == [100, 300]


def test_a_subagent_notification_is_not_the_users_own_words(tmp_path: Path) -> None:
    """Reproduces (scripts/fidelity on the recorded codex 0.171.0 subagent rollout): Codex injects a finished
    subagent's result as a ``user`` item ``<subagent_notification>...``; it was imported as a user message,
    shown as if the user had typed it (it has no ``item_completed`` ``UserMessage``, unlike typed text)."""
    note = line("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": (
        '<subagent_notification>\n{"agent_path":"019f-child","status":{"completed":"done"}}\n'
        "</subagent_notification>")}]})
    records, _ = parse(tmp_path, [*head(), note])
    users = [r["blocks"][0]["text"] for r in records if r.get("role") == "user"]
    assert users == ["list the files"]
    (notice,) = [r for r in records if "subagent_notification" in r["blocks"][0].get("text", "")]
    assert notice["role"] == "system" and notice["meta"]["importedKind"] == "codex/user"


def test_cache_written_prompt_tokens_are_cache_write_not_input(tmp_path: Path) -> None:
    """Reproduces (scripts/fidelity on the codex 0.171.0 recording, its fake model reporting
    ``input_tokens_details.cache_write_tokens``): Codex 0.171 writes ``cache_write_input_tokens`` inside
    ``input_tokens`` (its own split is cache read, cache write, other); the import counted them as plain
    input and reported no cache write, so every such response's input was too high by the written tokens."""
    raw = {"input_tokens": 1747, "cached_input_tokens": 200, "cache_write_input_tokens": 77, "output_tokens": 41,
           "reasoning_output_tokens": 0, "total_tokens": 1788}
    record = line("token_usage_record", {"thread_id": SID, "turn_id": "t1", "response_id": "r1", "usage": raw})
    records, _ = parse(tmp_path, [*head(), say("done", "m1"), record])
    (reply,) = [r for r in records if r.get("role") == "assistant"]
    assert reply["meta"]["usage"] == {"input": 1470, "output": 41, "cacheRead": 200, "cacheWrite": 77, "reasoning": 0,
                                      "totalTokens": 1788}
    assert reply["meta"]["usageRaw"] == raw


def test_web_search_results_are_the_sources_of_their_round(tmp_path: Path) -> None:
    """Found by the stop 41 audit: the curated Codex sample's ``web_search_end`` results (title, url,
    snippet) were skipped, so the imported ``hostedSearch`` round had no sources. Shapes as in
    samples/codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl lines 14-15."""
    action = {"type": "search", "query": "example", "queries": ["example"], "url": None, "pattern": None}
    searched = line("response_item", {"type": "web_search_call", "id": "ws-1", "status": "completed",
                                      "action": action})
    ended = line("event_msg", {"type": "web_search_end", "call_id": "call-4", "query": "example", "action": action,
                               "results": [{"type": "result", "title": "Example", "url": "https://example.invalid",
                                            "domain": "example.invalid", "snippet": "[trimmed]", "ref_id": "r1",
                                            "thumbnail_url": None},
                                           {"type": "result", "url": "https://b.invalid"}, {"title": "no url"}]})
    answer = line("response_item", {"type": "message", "role": "assistant",
                                    "content": [{"type": "output_text", "text": "found it"}]})
    records, report = parse(tmp_path, [*head(), searched, ended, answer])
    (reply,) = [r for r in records if r.get("role") == "assistant"]
    search, text = reply["blocks"]
    assert text == {"type": "text", "text": "found it"}
    assert search["rounds"] == [{"id": "ws-1", "status": "completed", "kind": "search", "query": "example",
                                 "sources": [{"url": "https://example.invalid", "title": "Example",
                                              "snippet": "[trimmed]", "domain": "example.invalid"},
                                             {"url": "https://b.invalid"}]}]
    assert "event_msg/web_search_end" not in report.files[0].skipped
    # a second end event for the same round (or one with no round open) changes nothing and is skipped
    records, report = parse(tmp_path, [*head(), searched, ended, ended, answer])
    (reply,) = [r for r in records if r.get("role") == "assistant"]
    assert len(reply["blocks"][0]["rounds"][0]["sources"]) == 2
    assert report.files[0].skipped["event_msg/web_search_end"] == 1
