"""A record nested past what the transcript writer encodes (orjson writes 254 levels, parses 1024) from any
source: that record is left out and counted, the rest of the session comes in (it refused the whole session,
INVALID_PARAMS "record cannot be encoded as a transcript line"). A Codex tool call's arguments are a JSON
string the importer parses and an opencode row is a database value, so no line-level check sees them."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.interchange.import_write import ImportTarget, _writable
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import SessionReport, count_output
from store.interchange.imports import ImportSummary, import_unit
from store.transcripts.transcript import read_transcript
from tests.importers import gen
from tests.samplekit import NOW


def deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = {"a": value}
    return value


CONV: list[gen.Event] = [gen.User("hello"),
                         gen.Response((("text", "hi"),), (gen.Tool("Bash", {"x": deep(300)}, "ran", False),)),
                         gen.User("after the deep call")]


def source(kind: str, tmp_path: Path) -> Path:
    if kind == "claude-code":
        path = tmp_path / "s.jsonl"
        path.write_bytes(b"".join(gen.claude_code_lines(CONV)))
    elif kind == "codex":
        path = tmp_path / "rollout-2026-01-01T00-00-00-01900000-0000-7000-8000-00000000c0de.jsonl"
        path.write_bytes(b"".join(gen.codex_lines(CONV)))
    elif kind == "pi":
        path = tmp_path / "p.jsonl"
        path.write_bytes(b"".join(gen.pi_lines(CONV)))
    else:
        info, messages = gen.opencode_docs(CONV)
        path = gen.write_opencode_db(tmp_path / "opencode.db", info, messages)
    return path


@pytest.mark.parametrize("kind", ["claude-code", "codex", "pi", "opencode"])
def test_a_record_nested_too_deep_to_write_is_left_out_and_the_session_comes_in(
        kind: str, tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    [unit] = IMPORTERS[kind].discover(source(kind, tmp_path))
    dry = import_unit(db, unit, target, now_ms=NOW, dry_run=True)  # what it would be: the same counts
    assert dry.status == "would-new" and dict(dry.messages) == {"user": 2, "assistant": 1}
    [unit] = IMPORTERS[kind].discover(source(kind, tmp_path))
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert rep.status == "new", (rep.reason, rep.message)
    assert dict(rep.skipped_blocks) == {"message(cannot be written)": 1}
    texts = [b.get("text") for m in read_transcript(target.transcript(rep.session_id)).messages
             for b in m.record["blocks"] if b["type"] == "text"]
    assert texts[0] == "hello" and texts[-1] == "after the deep call" and "hi" in texts
    assert rep.new_messages == 3
    # the report's counts say what the session holds: the record left out is not among its messages
    assert dict(rep.messages) == {"user": 2, "assistant": 1} and rep.to_dict()["messages"] == {"user": 2,
                                                                                                "assistant": 1}
    summary = ImportSummary()
    summary.add(rep)
    assert summary.messages == summary.new_messages == 3


def test_a_replacement_line_decides_with_the_line_it_replaces() -> None:
    """The counts tally a message once, at its first line (a replacement line of the same id is not counted):
    a message is taken out of them only when no line of its id could be written."""
    def m(mid: str, nest: int = 0) -> dict[str, Any]:
        return {"type": "message", "id": mid, "role": "user",
                "blocks": [{"type": "text", "text": mid, **({"x": deep(nest)} if nest else {})}]}

    first = [m("ok"), m("late", 300), m("kept", 0), m("gone", 300)]  # counted as the parser emits them
    again = [m("late"), m("kept", 300), m("gone", 300)]  # replacement lines: never counted
    report = SessionReport("pi")
    for rec in first:
        count_output(report, rec)
    records = [first[0], first[1], again[0], first[2], again[1], first[3], again[2]]
    written = [rec["id"] for rec, _ in _writable(records, report)]
    assert written == ["ok", "late", "kept"]
    assert dict(report.messages) == {"user": 3}  # ok, late (its replacement came in), kept (its first line)
    assert report.skipped_blocks == {"message(cannot be written)": 4}
