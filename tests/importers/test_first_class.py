"""Imported sessions are first-class (issue 23 item 4): their usage is counted, in one shape; show marks tombstones.

Reproduces: usage screens showed 0 for all imported history (``usage.*`` rolls up ``turns``, and an
import wrote none); per-message usage came in four raw shapes (Anthropic, Codex, pi, opencode);
``pi-host show`` printed tombstoned messages with no marker. Real samples where they have the shape.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from runtime.cli_client import print_window
from store import usage
from store.indexing import index
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from store.transcripts import windows
from store.transcripts.transcript import read_transcript
from tests.importers.test_pi_branches import STAGE_1, STAGE_2, unit, write
from tests.samplekit import NOW, rows, sample_files

SHAPE = {"input", "output", "cacheRead", "cacheWrite", "reasoning", "totalTokens"}


def imported_usage(db: sqlite3.Connection, target: ImportTarget, path: Path, source: str) -> list[tuple[Any, ...]]:
    """(sid, [(normalised, raw, meta)] of the assistant messages with usage) for every unit of a sample."""
    out = []
    for u in IMPORTERS[source].discover(path):
        rep = import_unit(db, u, target, now_ms=NOW)
        if rep.session_id is None or not target.transcript(rep.session_id).exists():
            continue
        metas = [m.record.get("meta") or {} for m in read_transcript(target.transcript(rep.session_id)).messages
                 if m.record["role"] in ("assistant", "tool")]
        out.append((rep.session_id, [(m["usage"], m["usageRaw"], m) for m in metas if "usageRaw" in m]))
    return out


@pytest.mark.parametrize("source", ["claude-code", "codex", "pi"])
def test_imported_usage_is_one_shape_and_counted_by_usage_rollups(source: str, db: sqlite3.Connection,
                                                                   target: ImportTarget) -> None:
    counted = 0
    for path in sample_files(source):
        for sid, reports in imported_usage(db, target, path, source):
            for norm, raw, _ in reports:
                assert set(norm) - {"cost"} == SHAPE
                if source == "claude-code":
                    assert (norm["input"], norm["output"], norm["cacheRead"], norm["cacheWrite"]) == (
                        raw.get("input_tokens", 0), raw.get("output_tokens", 0),
                        raw.get("cache_read_input_tokens", 0), raw.get("cache_creation_input_tokens", 0))
                elif source == "codex":
                    assert norm["input"] + norm["cacheRead"] == raw.get("input_tokens", 0)
                    assert (norm["output"], norm["reasoning"]) == (raw.get("output_tokens", 0),
                                                                   raw.get("reasoning_output_tokens", 0))
                else:
                    assert {k: norm[k] for k in ("input", "output", "cacheRead", "cacheWrite")} == {
                        k: raw.get(k, 0) for k in ("input", "output", "cacheRead", "cacheWrite")}
            rollup = usage.session_usage(db, sid)["total"]
            assert rollup["turns"] == len(reports)
            assert rollup["inputTokens"] == sum(n["input"] for n, _, _ in reports)
            assert rollup["outputTokens"] == sum(n["output"] for n, _, _ in reports)
            counted += rollup["outputTokens"]
    assert counted > 0  # the samples hold real usage, and it is counted


def test_reimport_counts_each_response_once_and_by_its_model(db: sqlite3.Connection, target: ImportTarget) -> None:
    (path,) = [p for p in sample_files("claude-code") if p.name == "spotter_v2.1.38_task_agent_progress.jsonl"]
    ((sid, reports),) = imported_usage(db, target, path, "claude-code")
    before = usage.session_usage(db, sid)
    # one turn per API response (Claude Code repeats a response's usage on each content-block line), those
    # that only called tools included, the subagent's (embedded in progress lines) too
    responses: dict[str, int] = {}
    for raw_line in path.read_text().splitlines():
        rec = json.loads(raw_line)
        inner = (rec.get("data") or {}).get("message") if rec.get("type") == "progress" else rec
        msg = (inner or {}).get("message")
        if isinstance(msg, dict) and msg.get("role") == "assistant" and msg.get("usage"):
            responses[msg["id"]] = msg["usage"]["output_tokens"]
    assert before["total"]["turns"] == len(responses) > 10
    assert before["total"]["outputTokens"] == sum(responses.values())
    ((_, again),) = imported_usage(db, target, path, "claude-code")
    assert usage.session_usage(db, sid) == before and len(again) == len(reports)
    # the parent's model and the subagent's (its responses are usage the user paid for too)
    models = {(m["providerId"], m["modelId"]) for m in before["byModel"]}
    assert models == {("anthropic", "claude-opus-4-6"), ("anthropic", "claude-haiku-4-5-20251001")}
    # the token history puts them on the day they happened (2026-02-10)
    days = usage.history(db, now_ms=1770768000000, days=7, session_id=sid)  # 2026-02-11T00:00Z
    assert [(d["day"], d["outputTokens"]) for d in days] == [("2026-02-10", before["total"]["outputTokens"])]


def test_opencode_usage_shape_counts_reasoning_in_output() -> None:
    """opencode's ``message.tokens`` keeps reasoning apart from output and the cost in ``message.cost``."""
    from store.interchange.importers.usage_shape import normalize_usage
    tokens = {"input": 120, "output": 30, "reasoning": 50, "cache": {"read": 1000, "write": 7}}
    assert normalize_usage("opencode", tokens, cost=0.0125) == {
        "input": 120, "output": 80, "cacheRead": 1000, "cacheWrite": 7, "reasoning": 50, "totalTokens": 1207,
        "cost": {"total": 0.0125}}


def test_show_marks_tombstoned_messages(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pi" / "s.jsonl"
    import_unit(db, unit(write(path, STAGE_1)), target, now_ms=NOW)
    rep = import_unit(db, unit(write(path, STAGE_2)), target, now_ms=NOW + 1)  # /tree: A's q2/a2 leave the branch
    sid = rep.session_id
    assert sid is not None and rep.hidden_off_branch == 2
    req = windows.WindowRequest(before=None, start=None, limit=50, content_limit=None, around=None)
    window = windows.read_cold(db, sid, target.transcript(sid), req)
    print_window(json.loads(window.reply), argparse.Namespace(json=False))
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [x for x in lines if "[deleted]" in x] == [x for x in lines if x.endswith(("q2 on A", "a2 on A"))]
    assert len([x for x in lines if "[deleted]" in x]) == 2
    assert any(x.endswith("user: q2 on B") for x in lines)


def test_session_list_shows_the_model_the_history_used(db: sqlite3.Connection, target: ImportTarget) -> None:
    """No imported session had a model in the session list; a host import now binds the last one its
    history used (as it binds the project path), and the origin keeps it as history."""
    (path,) = [p for p in sample_files("claude-code") if p.name == "spotter_v2.1.38_task_agent_progress.jsonl"]
    ((sid, _),) = imported_usage(db, target, path, "claude-code")
    (listed,) = [s for s in index.list_sessions(db, limit=10, cursor=None)[0] if s["id"] == sid]
    assert (index.public_session(listed)["providerId"], index.public_session(listed)["modelId"]) == (
        "anthropic", "claude-opus-4-6")
    (origin,) = rows(db, "SELECT origin_json FROM session_import_origins WHERE session_id = ?", sid)
    assert {k: json.loads(origin[0])[k] for k in ("providerId", "modelId")} == {
        "providerId": "anthropic", "modelId": "claude-opus-4-6"}
