"""A failed model request Claude Code showed comes in as a ``system`` notice, not a skip count.

Claude Code writes a ``system`` line with ``subtype: api_error`` (a request failed, a retry under way) or
``subtype: error`` and the error as a structure (``error``: ``message``, ``formatted``, ``status``, the API's
body), no text ``content``. The CURATED Claude Code sample has four ``api_error`` lines (48, 56, 58, 74) and one
``error`` line (``sys-nested-1``). Reproduces: they were counted as skipped ``system/api_error`` /
``system/error`` lines, so the session did not say a request had failed (or why).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from tests.samplekit import import_new

CURATED = "claude-code/agent-sessions_CURATED_schema_coverage.jsonl"


def test_api_errors_are_system_notices(untouched_samples: Path, db: sqlite3.Connection, target: ImportTarget,
                                       tmp_path: Path) -> None:
    path = untouched_samples / CURATED
    raw = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    rep, messages = import_new(db, target, "claude-code", path)
    assert "system/api_error" not in rep.files[0].skipped and "system/error" not in rep.files[0].skipped
    errors = [m for m in messages if (m.get("meta") or {}).get("importedKind") in ("system/api_error", "system/error")]
    assert all(m["role"] == "system" for m in errors)
    assert [m["meta"]["error"] for m in errors] == [
        r["error"] for r in raw if r.get("type") == "system" and isinstance(r.get("error"), dict)]
    assert len(errors) == 5
    nested = next(m for m in messages if m["id"].endswith(":sys-nested-1"))
    assert nested["meta"]["importedKind"] == "system/error" and nested["meta"]["error"]["status"] == 429
    texts = [m["blocks"][0]["text"] for m in errors]
    assert "API error: authentication_error: [trimmed for fixture]" in texts  # the API's body, when no text
    assert all(m["meta"]["maxRetries"] == 0 for m in errors if m["meta"]["importedKind"] == "system/api_error")

    out = tmp_path / "export.md"
    with out.open("wb") as fh:
        export_session(db, target.transcript(rep.session_id), rep.session_id, fh, ExportOptions(format="md"))
    assert "API error: authentication_error: [trimmed for fixture]" in out.read_text()


FASTHOOKS = "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl"


def test_stop_hook_errors_and_a_stop_they_prevented_are_system_notices(
        untouched_samples: Path, db: sqlite3.Connection, target: ImportTarget, tmp_path: Path) -> None:
    """A Stop hook that failed or stopped the agent: Claude Code prints ``Stop hook error: <error>`` (the
    ``stop_hook_summary`` line's ``hookErrors``) and a hook's ``stopReason`` when it prevented continuation
    (``preventedContinuation``). The genuine 2.0.76 sample's five summaries are clean (``hookErrors: []``); two of
    them are given an outcome here, in the shape Claude Code writes. Reproduces: every ``stop_hook_summary`` was
    counted as skipped, so the session never said that a hook had failed or stopped the agent."""
    lines = (untouched_samples / FASTHOOKS).read_bytes().splitlines()
    raw = [orjson.loads(line) for line in lines]
    summaries = [i for i, r in enumerate(raw) if r.get("subtype") == "stop_hook_summary"]
    assert len(summaries) == 5
    failed, stopped = summaries[0], summaries[2]
    raw[failed]["hookErrors"] = ["JSON validation failed", "hook timed out"]
    raw[stopped].update(preventedContinuation=True, stopReason="the tests are failing")
    path = tmp_path / "c45af7b1-cb7c-4e51-93db-8cbb250a877a.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in raw))

    rep, messages = import_new(db, target, "claude-code", path)
    assert rep.files[0].skipped["system/stop_hook_summary"] == 3  # the clean ones
    notices = [m for m in messages if (m.get("meta") or {}).get("importedKind") == "system/stop_hook_summary"]
    assert [(m["id"].split(":", 1)[1], m["role"], [b["text"] for b in m["blocks"]]) for m in notices] == [
        (raw[failed]["uuid"], "system", ["Stop hook error: JSON validation failed\nStop hook error: hook timed out"]),
        (raw[stopped]["uuid"], "system", ["Stop hook prevented continuation: the tests are failing"]),
    ]
    assert [m["createdAt"] for m in notices] == [raw[failed]["timestamp"], raw[stopped]["timestamp"]]
    # each in its turn: after the reply the hook ran on, before the next prompt
    for notice in notices:
        at = messages.index(notice)
        assert (messages[at - 1]["role"], messages[at + 1]["role"]) == ("assistant", "user")
    assert dict(rep.messages)["system"] == 1 + 2  # the isMeta caveat and the two notices


def test_hook_errors_claude_code_showed_are_system_notices(
        untouched_samples: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """A hook that failed on a tool call or a prompt: Claude Code 2.1 writes an ``attachment`` line
    (``hook_non_blocking_error``: the hook's ``stderr``/``exitCode``; ``hook_blocking_error``: the reason it
    blocked with) and shows ``<hookName> hook error: <stderr>`` (``Exit code N`` when it wrote none) /
    ``<hookName> hook blocking error: <reason>``. The CURATED sample has one of each (lines 75, 79).
    Reproduces: they were counted among the skipped attachments, so the session never said a hook had failed."""
    path = untouched_samples / CURATED
    raw = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    rep, messages = import_new(db, target, "claude-code", path)
    assert rep.files[0].skipped["attachment"] == 37 - 2
    notices = [m for m in messages if str((m.get("meta") or {}).get("importedKind")).startswith("attachment/")]
    assert [(m["role"], m["meta"]["importedKind"], m["blocks"][0]["text"]) for m in notices] == [
        ("system", "attachment/hook_non_blocking_error", "[trimmed for fixture] hook error: [trimmed for fixture]"),
        ("system", "attachment/hook_blocking_error",
         "[trimmed for fixture] hook blocking error: [trimmed for fixture]"),
    ]
    assert [r["attachment"]["type"] for r in raw if r.get("type") == "attachment"
            and r["attachment"]["type"] in ("hook_non_blocking_error", "hook_blocking_error")] == [
        "hook_non_blocking_error", "hook_blocking_error"]
    assert dict(rep.messages)["system"] == 7 + 2
