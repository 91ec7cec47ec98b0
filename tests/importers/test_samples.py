"""Every third-party sample imports, with a per-file report that says what it held (../shared/samples).

The expected figures are read off the samples (see their README) and checked
two ways: against the import report, and against the rows the index and the
transcript really hold. Independent counts taken straight from the raw JSON
(tool_use blocks, matched tool_result blocks, thinking blocks) back them up.
The samples are never modified: ``untouched_samples`` checks SHA256SUMS
before and after.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from protocol.blocks import check_block
from store.context import build_session_context, is_attributed
from store.interchange.import_write import HOST_IMPORTER, ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import SourceUnit
from store.interchange.imports import import_unit, origin_row
from store.search.search import search_messages
from store.transcripts.records import extract_text, normalize_message
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, assert_checksums, rows, sample_files, samples_dir


@dataclass(frozen=True)
class Expect:
    roles: dict[str, int]
    tool_calls: int = 0
    results: int = 0
    unpaired: int = 0
    orphans: int = 0
    thinking: int = 0
    compactions: int = 0
    attributed: int = 0
    dangling: int = 0
    roots: int = 1
    skipped_blocks: dict[str, int] = field(default_factory=dict)
    replaced: int = 0


# How each figure follows from the sample (README "What each exercises"):
# user = typed prompts (tool_result-only lines are not messages; isMeta lines are system notices;
# the isCompactSummary line is the checkpoint's summary), assistant = API responses up to each tool_use,
# tool = one row per tool_use (its result folded in).
EXPECTED: dict[str, Expect] = {
    "claude-code/agent-history_v2.1.152_REDACTED_sdk_cli_last_prompt.jsonl":
        Expect({"user": 1, "assistant": 1}),
    # hand-made ids: a tool_use without an id (never paired), two results without tool_use_id (orphans),
    # an unknown "fallback" block and an image whose data is not base64 (both reported as skipped blocks);
    # line 39 is a prompt typed while the agent worked (a queued_command attachment): a user message.
    "claude-code/agent-sessions_CURATED_schema_coverage.jsonl":
        # system: 2 notices with text, 4 api_error lines and a system/error (import rules 19), two hook errors
        # (hook_non_blocking_error, hook_blocking_error attachments: import rules 23)
        Expect({"user": 7, "assistant": 8, "tool": 5, "system": 9}, tool_calls=3, results=1, unpaired=1, orphans=2,
               thinking=6, compactions=2, attributed=7, roots=6,
               skipped_blocks={"assistant/fallback": 1, "image(bad base64)": 1}),
    # 22 inline sidechain lines under two Task calls: 2 prompts + 3 replies + 9 tool rows.
    "claude-code/ccviewer_v1.0.108_inline_sidechains.jsonl":
        Expect({"user": 3, "system": 1, "assistant": 7, "tool": 21}, tool_calls=21, results=21, attributed=14,
               roots=3),
    # the last tool_use's result was not written yet when this snapshot was taken
    "claude-code/codemie_v2.1.7_growing_file_turn1.jsonl":
        Expect({"user": 1, "assistant": 7, "tool": 7}, tool_calls=7, results=6, unpaired=1, thinking=7),
    "claude-code/codemie_v2.1.7_growing_file_turn2.jsonl":
        Expect({"user": 1, "assistant": 11, "tool": 14}, tool_calls=14, results=14, thinking=11),
    # /compact: boundary (a second root) + summary → one checkpoint; one isMeta caveat → system
    "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl":
        Expect({"user": 7, "assistant": 12, "tool": 10, "system": 1}, tool_calls=10, results=10, thinking=12,
               compactions=1, roots=2),
    "claude-code/fasthooks_v2.0.76_subagent_warmup_sidechain.jsonl":
        Expect({"user": 1, "assistant": 1}, attributed=2),
    # one response split over five lines (text, thinking, text | tool_use, tool_use); two local_command lines
    "claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl":
        Expect({"user": 2, "assistant": 1, "tool": 2, "system": 2}, tool_calls=2, results=2, thinking=1),
    # 19 agent_progress lines: the Plan subagent's prompt and 9 tool calls (attributed), inside the parent
    "claude-code/spotter_v2.1.38_task_agent_progress.jsonl":
        Expect({"user": 4, "system": 1, "assistant": 7, "tool": 25}, tool_calls=25, results=25, thinking=4,
               attributed=10),
    "claude-code/spotter_v2.1.38_tool_heavy_queue_ops.jsonl":
        Expect({"user": 6, "tool": 6, "assistant": 2, "system": 3}, tool_calls=6, results=6, thinking=1),
    # every first line points into the parent session (not included): 3 dangling parents, no root
    "claude-code/spotter_v2.1.39_subagent_file_acompact.jsonl":
        Expect({"system": 3, "user": 1, "assistant": 1}, attributed=5, dangling=3, roots=0),
    "claude-code/spotter_v2.1.39_subagent_file_websearch.jsonl":
        Expect({"user": 1, "assistant": 3, "tool": 12}, tool_calls=12, results=12, attributed=16),
    # developer message + the injected AGENTS.md/environment context → system notices
    "codex/agent-history_exec-0.135.0_REDACTED_task_lifecycle.jsonl":
        Expect({"system": 2, "user": 1, "assistant": 1}, roots=0),
    # seven session_meta lines, six compacted records, repeated trimmed call ids
    "codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl":
        # system: an injected context item, 3 review results, an error, an aborted turn (import rules 19)
        Expect({"user": 1, "assistant": 4, "tool": 7, "system": 6}, tool_calls=6, results=5, unpaired=1, orphans=1,
               thinking=2, compactions=6, roots=0, skipped_blocks={"input_image(not inline)": 2}, replaced=1),
    "codex/codemie_exec-0.77.0_shell_reasoning_ghost_snapshot.jsonl":
        Expect({"system": 2, "user": 1, "assistant": 3, "tool": 3}, tool_calls=3, results=3, thinking=3, roots=0),
    # abandoned mid tool call: the last function_call never gets its output
    "codex/localpush_desktop-0.104_REDACTED_dangling_function_call.jsonl":
        Expect({"system": 4, "user": 4, "assistant": 1, "tool": 1}, tool_calls=1, unpaired=1, thinking=1, roots=0),
    "codex/localpush_desktop-0.104_REDACTED_multi_turn_apply_patch_web_search.jsonl":
        Expect({"system": 10, "user": 10, "assistant": 70, "tool": 104}, tool_calls=104, results=104, thinking=69,
               roots=0),
    "codex/localpush_desktop-0.104_REDACTED_single_turn.jsonl":
        Expect({"system": 4, "user": 3, "assistant": 6, "tool": 5}, tool_calls=5, results=5, thinking=6, roots=0),
    "pi/agent-history_pi-smoke_session_info_REDACTED.jsonl":
        Expect({"user": 1, "assistant": 1}),
    "pi/agent-sessions_stub_provider_compaction.jsonl":
        Expect({"user": 2, "assistant": 2}, compactions=2),
    # the custom entry's parent "evt-root" is not in the file: reported, the branch ends there
    "pi/ccrider_SEMI-SYNTHETIC_redacted_custom_entry_dangling_parent.jsonl":
        Expect({"user": 1, "assistant": 2, "tool": 1}, tool_calls=1, results=1, thinking=1, dangling=1, roots=0),
}


def unit_for(path: Path) -> SourceUnit:
    source = path.parent.name
    units = list(IMPORTERS[source].discover(path))
    assert len(units) == 1
    return units[0]


def import_sample(db: sqlite3.Connection, target: ImportTarget, path: Path) -> Any:
    return import_unit(db, unit_for(path), target, now_ms=NOW)


def transcript_records(target: ImportTarget, sid: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    t = read_transcript(target.transcript(sid))
    assert t.bad_lines == 0 and not t.torn_tail
    return [m.record for m in t.messages], [c.record for c in t.compactions]


def raw_lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def test_the_table_covers_every_sample(untouched_samples: Path) -> None:
    names = {f"{p.parent.name}/{p.name}" for src in ("claude-code", "codex", "pi") for p in sample_files(src)}
    assert names == set(EXPECTED)
    assert len(names) == 21
    assert assert_checksums(untouched_samples) == 21


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_imports_with_its_report(name: str, untouched_samples: Path, db: sqlite3.Connection,
                                        target: ImportTarget) -> None:
    path = untouched_samples / name
    expect = EXPECTED[name]
    rep = import_sample(db, target, path)
    assert rep.status == "new", rep.to_dict()
    assert dict(rep.messages) == expect.roles
    assert (rep.tool_calls, rep.tool_results, rep.unpaired_tool_calls, rep.orphan_results) == (
        expect.tool_calls, expect.results, expect.unpaired, expect.orphans)
    assert rep.thinking_blocks == expect.thinking
    assert rep.compactions == expect.compactions
    # what this first import wrote is what the session holds: a record written again under its id (a reply
    # given its usage after it left the parser) is one message, not a new one more
    assert (rep.new_messages, rep.new_records, rep.replaced_records) == (
        sum(expect.roles.values()), sum(expect.roles.values()) + expect.compactions, expect.replaced)
    assert rep.attributed == expect.attributed
    assert dict(rep.skipped_blocks) == expect.skipped_blocks
    first = rep.files[0]
    assert (first.dangling_parents, first.roots) == (expect.dangling, expect.roots)
    assert first.bad_lines == first.oversized_lines == first.torn_tail_bytes == 0
    assert first.consumed == path.stat().st_size

    sid = rep.session_id
    # the index holds exactly what the report says, under the import's source and origin
    by_role = dict(rows(db, "SELECT role, COUNT(*) FROM messages WHERE session_id = ? GROUP BY role", sid))
    assert by_role == expect.roles
    assert rows(db, "SELECT source, last_seq FROM sessions WHERE id = ?", sid) == [
        (path.parent.name, sum(expect.roles.values()))]
    assert rows(db, "SELECT COUNT(*) FROM compactions WHERE session_id = ?", sid) == [(expect.compactions,)]
    origin = origin_row(db, sid)
    assert origin is not None and origin["pluginId"] == HOST_IMPORTER and origin["sourceId"] == path.parent.name
    assert origin["origin"]["files"][str(path)]["consumed"] == path.stat().st_size

    # the transcript is this host's format: every record normalizes unchanged, every block passes the checks
    messages, compactions = transcript_records(target, sid)
    assert Counter(m["role"] for m in messages) == Counter(expect.roles)
    assert len(compactions) == expect.compactions
    ids = {m["id"] for m in messages}
    for record in messages:
        assert normalize_message(record, now_ms=0) == record
        for block in record["blocks"]:
            assert check_block(dict(block)) == block
        assert record["id"].startswith(f"{sid}:")
    for comp in compactions:
        assert comp["throughMessageId"] in ids
        assert comp.get("firstKeptMessageId") is None or comp["firstKeptMessageId"] in ids

    # importing the same bytes again changes nothing
    before = target.transcript(sid).read_bytes()
    again = import_sample(db, target, path)
    assert again.status == "unchanged"
    assert target.transcript(sid).read_bytes() == before


def _raw_tool_stats(name: str, path: Path) -> tuple[int, int, int]:
    """(tool calls, results that name a known call, thinking blocks) counted straight from the raw JSON."""
    calls: set[str] = set()
    n_calls = results = thinking = 0
    source = path.parent.name
    for rec in raw_lines(path):
        if source == "claude-code":
            items = [rec]
            data = rec.get("data")
            if rec.get("type") == "progress" and isinstance(data, Mapping) and data.get("type") == "agent_progress":
                items = [data.get("message") or {}]
            for item in items:
                content = (item.get("message") or {}).get("content") if isinstance(item.get("message"), Mapping) \
                    else None
                for block in content if isinstance(content, list) else ():
                    if block.get("type") == "tool_use":
                        n_calls += 1
                        if block.get("id"):
                            calls.add(block["id"])
                    elif block.get("type") == "tool_result" and block.get("tool_use_id") in calls:
                        results += 1
                        calls.discard(block["tool_use_id"])
                    elif block.get("type") in ("thinking", "redacted_thinking"):
                        thinking += 1
        elif source == "codex":
            p = rec.get("payload") or {}
            if rec.get("type") == "response_item":
                if p.get("type") in ("function_call", "custom_tool_call", "local_shell_call", "tool_search_call"):
                    n_calls += 1
                    calls.add(p.get("call_id"))
                elif p.get("type", "").endswith("_output") and p.get("call_id") in calls:
                    results += 1
                    calls.discard(p["call_id"])
                elif p.get("type") == "reasoning":
                    thinking += 1
        else:
            msg = rec.get("message") or {}
            for block in msg.get("content") or () if isinstance(msg.get("content"), list) else ():
                if block.get("type") == "toolCall":
                    n_calls += 1
                    calls.add(block["id"])
                elif block.get("type") == "thinking":
                    thinking += 1
            if msg.get("role") == "toolResult" and msg.get("toolCallId") in calls:
                results += 1
    return n_calls, results, thinking


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tool_calls_are_paired_with_their_results(name: str, untouched_samples: Path, db: sqlite3.Connection,
                                                  target: ImportTarget) -> None:
    path = untouched_samples / name
    rep = import_sample(db, target, path)
    n_calls, n_results, n_thinking = _raw_tool_stats(name, path)
    assert (rep.tool_calls, rep.tool_results, rep.thinking_blocks) == (n_calls, n_results, n_thinking)
    messages, _ = transcript_records(target, rep.session_id)
    tool_rows = [m for m in messages if m["role"] == "tool" and not m.get("meta", {}).get("orphanResult")]
    assert len(tool_rows) == n_calls
    with_result = [m for m in tool_rows if "result" in m["blocks"][0]]
    assert len(with_result) == n_results
    for row in with_result:
        block = row["blocks"][0]
        assert block["type"] == "tool_call" and block["status"] in ("ok", "error", "denied")
        assert row["toolName"] == block["name"]
    # an error result keeps its error status and feeds tool_info's is_error flag
    errors = {m["id"] for m in with_result if m["blocks"][0]["status"] != "ok"}
    assert {r[0] for r in rows(db, "SELECT id FROM messages WHERE session_id = ? AND is_error = 1",
                               rep.session_id)} >= errors


THINKING_SAMPLES = sorted(n for n, e in EXPECTED.items() if e.thinking and "REDACTED" not in n and "CURATED" not in n)


@pytest.mark.parametrize("name", THINKING_SAMPLES)
def test_thinking_stays_out_of_search(name: str, untouched_samples: Path, db: sqlite3.Connection,
                                      target: ImportTarget) -> None:
    rep = import_sample(db, target, untouched_samples / name)
    messages, _ = transcript_records(target, rep.session_id)
    texts = "\n".join(extract_text(m) or "" for m in messages)
    probes = []
    for m in messages:
        for block in m["blocks"]:
            if block["type"] == "thinking" and len(block["text"]) >= 8:
                words = block["text"].split()
                probe = " ".join(words[2:6]) if len(words) > 6 else block["text"]
                if len(probe) >= 12 and probe not in texts:
                    probes.append(probe)
    assert probes, "the sample holds thinking text to probe"
    for probe in probes[:5]:
        assert search_messages(db, probe, session_id=rep.session_id)["results"] == []
    answer = next(m for m in messages if m["role"] in ("user", "assistant") and len(extract_text(m) or "") > 20)
    word_probe = (extract_text(answer) or "")[:20]
    hits = search_messages(db, word_probe, session_id=rep.session_id)["results"]
    assert answer["id"] in {h["messageId"] for h in hits}


def test_claude_code_compaction_becomes_a_checkpoint(untouched_samples: Path, db: sqlite3.Connection,
                                                     target: ImportTarget) -> None:
    path = untouched_samples / "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl"
    rep = import_sample(db, target, path)
    messages, compactions = transcript_records(target, rep.session_id)
    (cp,) = compactions
    raw = raw_lines(path)
    boundary = next(r for r in raw if r.get("subtype") == "compact_boundary")
    summary = next(r for r in raw if r.get("isCompactSummary"))
    assert cp["tokensBefore"] == boundary["compactMetadata"]["preTokens"] == 21558
    assert cp["details"]["trigger"] == "manual"
    assert cp["summary"] == summary["message"]["content"]
    assert cp["summary"].startswith("This session is being continued")
    # the summary is the checkpoint's text, not a chat message; the boundary follows the last reply before it
    assert all("This session is being continued" not in (extract_text(m) or "") for m in messages)
    ids = [m["id"] for m in messages]
    last_before = [r for r in raw[: raw.index(boundary)] if r.get("type") in ("assistant", "user")]
    assert ids.index(cp["throughMessageId"]) >= ids.index(f"{rep.session_id}:{last_before[0]['uuid']}")
    ctx = build_session_context(messages, compactions, [])
    assert ctx["compaction"]["id"] == cp["id"]
    assert ctx["messages"][0]["blocks"][0]["text"] == cp["summary"]


def test_pi_compactions_keep_their_first_kept_entry(untouched_samples: Path, db: sqlite3.Connection,
                                                    target: ImportTarget) -> None:
    rep = import_sample(db, target, untouched_samples / "pi/agent-sessions_stub_provider_compaction.jsonl")
    messages, compactions = transcript_records(target, rep.session_id)
    sid = rep.session_id
    assert [c["throughMessageId"] for c in compactions] == [f"{sid}:22a2720e", f"{sid}:4a666296"]
    # firstKeptEntryId names the model_change entry; the first message at or after it is kept
    assert {c["firstKeptMessageId"] for c in compactions} == {f"{sid}:30c6a75f"}
    assert [c["tokensBefore"] for c in compactions] == [19, 19]


def test_codex_compacted_records_become_checkpoints(untouched_samples: Path, db: sqlite3.Connection,
                                                    target: ImportTarget) -> None:
    path = untouched_samples / "codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl"
    rep = import_sample(db, target, path)
    _, compactions = transcript_records(target, rep.session_id)
    raw = [r for r in raw_lines(path) if r.get("type") == "compacted"]
    assert [c["summary"] for c in compactions] == [r["payload"]["message"] for r in raw]
    assert [c["details"].get("replacementHistoryItems") for c in compactions] == [
        len(r["payload"].get("replacement_history") or []) if "replacement_history" in r["payload"] else None
        for r in raw]


def test_inline_sidechains_are_attributed_to_their_task_call(untouched_samples: Path, db: sqlite3.Connection,
                                                             target: ImportTarget) -> None:
    path = untouched_samples / "claude-code/ccviewer_v1.0.108_inline_sidechains.jsonl"
    rep = import_sample(db, target, path)
    messages, _ = transcript_records(target, rep.session_id)
    raw = raw_lines(path)
    tasks = {b["input"]["prompt"]: b["id"] for r in raw if r.get("type") == "assistant"
             for b in r["message"]["content"] if b.get("type") == "tool_use" and b["name"] == "Task"
             and "prompt" in b["input"]}
    sidechain_ids = {f"{rep.session_id}:{r['uuid']}" for r in raw if r.get("isSidechain")}
    attributed = [m for m in messages if is_attributed(m)]
    assert len(attributed) == 14
    assert {m["meta"]["parentToolCallId"] for m in attributed} == set(tasks.values())
    assert {m["meta"]["agentName"] for m in attributed} == {"general-purpose"}
    assert {m["id"] for m in attributed if m["role"] != "tool"} <= sidechain_ids
    # the main conversation is not attributed, and model context leaves the delegate's rows out
    assert not any(is_attributed(m) for m in messages if m["id"] not in sidechain_ids and m["role"] != "tool"
                   and m not in attributed)
    ctx_ids = {m["id"] for m in build_session_context(messages, [], [])["messages"]}
    assert ctx_ids.isdisjoint(m["id"] for m in attributed)


def test_agent_progress_rows_nest_under_the_task_call(untouched_samples: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    path = untouched_samples / "claude-code/spotter_v2.1.38_task_agent_progress.jsonl"
    rep = import_sample(db, target, path)
    messages, _ = transcript_records(target, rep.session_id)
    attributed = [m for m in messages if is_attributed(m)]
    assert {(m["meta"]["parentToolCallId"], m["meta"]["agentName"]) for m in attributed} == {
        ("toolu_01Cz2Pnv7qNcnK1ZiocxWhQX", "Plan")}
    task_row = next(m for m in messages if m["role"] == "tool" and m["blocks"][0]["callId"] ==
                    "toolu_01Cz2Pnv7qNcnK1ZiocxWhQX")
    assert task_row["toolName"] == "Task" and not is_attributed(task_row)
    assert task_row["blocks"][0]["status"] == "ok"
    assert messages.index(task_row) < min(messages.index(m) for m in attributed)


@pytest.mark.parametrize("name", ["claude-code/spotter_v2.1.39_subagent_file_acompact.jsonl",
                                  "claude-code/spotter_v2.1.39_subagent_file_websearch.jsonl",
                                  "claude-code/fasthooks_v2.0.76_subagent_warmup_sidechain.jsonl"])
def test_subagent_files_are_attributed_to_their_agent(name: str, untouched_samples: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    path = untouched_samples / name
    rep = import_sample(db, target, path)
    messages, _ = transcript_records(target, rep.session_id)
    agents = {r["agentId"] for r in raw_lines(path) if "agentId" in r}
    assert len(agents) == 1
    assert {m["meta"]["agentName"] for m in messages} == agents
    # the session is the parent's (a subagent line carries the parent's sessionId)
    assert rep.external_id == raw_lines(path)[0]["sessionId"]


def test_dangling_parents_and_skips_are_reported_and_the_rest_imports(untouched_samples: Path,
                                                                      db: sqlite3.Connection,
                                                                      target: ImportTarget) -> None:
    pi_rep = import_sample(db, target, untouched_samples /
                           "pi/ccrider_SEMI-SYNTHETIC_redacted_custom_entry_dangling_parent.jsonl")
    assert pi_rep.status == "new" and pi_rep.files[0].dangling_parents == 1
    assert dict(pi_rep.files[0].skipped) == {"custom": 1}
    messages, _ = transcript_records(target, pi_rep.session_id)
    assert [m["id"].split(":", 1)[1] for m in messages] == [
        "evt-user", "evt-assistant-text", "evt-assistant-toolcall", "evt-assistant-toolcall.0"]
    assert messages[2]["blocks"][0]["signature"] == "redacted-signature"

    cc = import_sample(db, target, untouched_samples / "claude-code/agent-sessions_CURATED_schema_coverage.jsonl")
    report = cc.files[0].to_dict()
    assert report["unknown"] == {}
    # of 38: a queued prompt (line 39) is a user message, two hook errors (lines 75, 79) are system notices
    assert report["skipped"]["attachment"] == 35
    for kind in ("worktree-state", "bridge-session", "pr-link", "frame-link"):
        assert kind in report["skipped"], kind
    # its permission-mode line (bypassPermissions) is a mode change; the next prompt says its own (ask): that wins
    assert report["skipped"]["permission-mode(superseded)"] == 1 and "permission-mode" not in report["skipped"]
    assert cc.status == "new"
    title = rows(db, "SELECT title FROM sessions WHERE id = ?", cc.session_id)[0][0]
    assert title == "Stage0 small fixture"  # custom-title beats ai-title and the summary line

    cx = import_sample(db, target, untouched_samples / "codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl")
    assert cx.files[0].skipped["session_meta(additional)"] == 6
    assert cx.files[0].unknown == Counter()


def test_images_become_attachment_refs_with_their_bytes_stored(untouched_samples: Path, tmp_path: Path,
                                                               db: sqlite3.Connection, target: ImportTarget) -> None:
    import base64

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"imported image bytes").decode()
    line = {"type": "user", "uuid": "u-img", "parentUuid": None, "sessionId": "img-session", "cwd": "/w",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "user", "content": [{"type": "text", "text": "look"},
                                                    {"type": "image", "source": {"type": "base64",
                                                                                 "media_type": "image/png",
                                                                                 "data": png}}]}}
    src = tmp_path / "img.jsonl"
    src.write_bytes(orjson.dumps(line) + b"\n")
    rep = import_unit(db, next(IMPORTERS["claude-code"].discover(src)), target, now_ms=NOW)
    assert rep.status == "new" and rep.attachments == 1
    (msg,), _ = transcript_records(target, rep.session_id)
    att = msg["blocks"][1]
    assert att["type"] == "attachment" and att["kind"] == "image" and att["mimeType"] == "image/png"
    sha = att["ref"].removeprefix("attachments/")
    assert target.attachments is not None and target.attachments.path(sha).read_bytes() == base64.b64decode(png)
    assert rows(db, "SELECT session_id, message_id FROM attachment_refs WHERE sha256 = ?", sha) == [
        (rep.session_id, msg["id"])]
    assert png not in target.transcript(rep.session_id).read_text()


def test_samples_are_still_byte_identical(untouched_samples: Path) -> None:
    assert assert_checksums(samples_dir()) == 21


@pytest.mark.parametrize("name", [n for n in EXPECTED if n.startswith("claude-code/")])
def test_claude_code_usage_is_each_responses_last_report(name: str, untouched_samples: Path,
                                                         db: sqlite3.Connection, target: ImportTarget) -> None:
    """Claude Code writes one line per content block, each with the response's usage as it stood then: the
    2.0.76 sample's response ``…9xxTLt8Y`` reports 3 output tokens on its thinking and first tool_use lines and
    993 on its last. The imported record carries the last report (it was the first line's: 990 of the
    sample's 1,480 output tokens were missing from ``usage.*``)."""
    path = untouched_samples / name
    last: dict[str, int] = {}
    for r in raw_lines(path):
        data = r.get("data") if r.get("type") == "progress" else None
        if isinstance(data, dict) and data.get("type") == "agent_progress" and isinstance(data.get("message"), dict):
            r = data["message"]  # a subagent's response embedded in its parent's transcript
        message = r.get("message")
        if r.get("type") != "assistant" or not isinstance(message, dict) or message.get("model") == "<synthetic>":
            continue
        if isinstance(message.get("usage"), dict) and message.get("id"):
            last[str(message["id"])] = int(message["usage"].get("output_tokens") or 0)
    rep = import_sample(db, target, path)
    messages, _ = transcript_records(target, rep.session_id)
    credited = [m["meta"]["usageRaw"] for m in messages if "usageRaw" in (m.get("meta") or {})]
    assert sum(int(u.get("output_tokens") or 0) for u in credited) == sum(last.values())
    assert len(credited) == len(last)
    (turn_out,) = db.execute("SELECT TOTAL(output_tokens) FROM turns WHERE session_id = ?",
                             (rep.session_id,)).fetchone()
    assert int(turn_out) == sum(last.values())


def test_a_claude_code_session_imported_with_first_line_usage_is_corrected_by_the_next_import(
        untouched_samples: Path, db: sqlite3.Connection, target: ImportTarget, monkeypatch: pytest.MonkeyPatch) -> None:
    """Import rules 11: a session the previous rules imported (each response's usage from its first line) is
    parsed again on the next import; its records carry the last reports and ``usage.*`` counts each response
    once, with the same messages served."""
    from store.interchange import import_write, imports
    from store.interchange.importers import claude_code

    path = untouched_samples / "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl"
    with monkeypatch.context() as m:  # the rules-10 importer: a usage record was written as soon as it could be
        m.setattr(claude_code._FileConverter, "_may_continue_response", lambda self, rec, kind: False)
        m.setattr(import_write, "IMPORT_RULES", 10)
        m.setattr(imports, "IMPORT_RULES", 10)
        rep = import_sample(db, target, path)
    total = "SELECT TOTAL(output_tokens), COUNT(*) FROM turns WHERE session_id = ?"
    assert db.execute(total, (rep.session_id,)).fetchone() == (490.0, 12)
    before, _ = transcript_records(target, rep.session_id)
    again = import_sample(db, target, path)
    assert again.session_id == rep.session_id
    assert db.execute(total, (rep.session_id,)).fetchone() == (1480.0, 12)
    after, _ = transcript_records(target, rep.session_id)
    assert [m["id"] for m in after] == [m["id"] for m in before]
