"""Issue 23: a Claude Code compaction's request usage survives the file growing between two imports.

Reproduces: the recorded Claude Code 2.1.332 ``/compact`` session imported while its file ended after
the summary (before the next ``cost-state``), then again once the ``cost-state`` line was written: the
re-import writes the checkpoint again with its ``details.usage`` (same id), but ``session.get`` served
both lines as two checkpoints, the first without usage (the transcript reader and the index kept every
compaction line), so a client showed the compaction's usage as missing. A later line of a checkpoint id
now replaces the earlier one, as for messages; the result equals a fresh import of the whole file.
The file is the recorded one, cut and then completed.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.indexing import index
from store.interchange.import_write import ImportTarget
from store.interchange.importers import claude_code, discover
from store.interchange.importers.common import ParseContext
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from store.transcripts.windows import read_spans_coalesced
from tests.samplekit import NOW

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code" / "2.1.332" / "projects"
SESSION = "9617099f-8f7a-4d84-a5a8-f6641f15ae29"


def source_lines() -> list[bytes]:
    (path,) = RECORDED.glob(f"*/{SESSION}.jsonl")
    return path.read_bytes().splitlines(keepends=True)


def checkpoint_usages(target: ImportTarget, sid: str) -> list[Any]:
    """The usage of every checkpoint a reader of the transcript sees."""
    return [(c.record.get("details") or {}).get("usage") for c in read_transcript(target.transcript(sid)).compactions]


def served_usages(db: sqlite3.Connection, target: ImportTarget, sid: str) -> list[Any]:
    """The usage of every checkpoint ``session.get`` serves (the index's compaction rows)."""
    lines = read_spans_coalesced(target.transcript(sid), [(c[2], c[3]) for c in index.compaction_rows(db, sid)])
    return [(orjson.loads(line).get("details") or {}).get("usage") for line in lines]


def compaction_turns(db: sqlite3.Connection, sid: str) -> list[tuple[Any, ...]]:
    return db.execute("SELECT id, input_tokens, output_tokens FROM turns WHERE session_id = ? AND id LIKE ?",
                      (sid, f"{sid}:compaction:%")).fetchall()


@pytest.mark.parametrize("cut", ["boundary", "summary", "before-cost-state"])
def test_compaction_usage_arrives_with_a_later_cost_state(db: sqlite3.Connection, target: ImportTarget,
                                                          tmp_path: Path, cut: str) -> None:
    lines = source_lines()
    summary = next(i for i, ln in enumerate(lines) if b'"isCompactSummary":true' in ln)
    cost = next(i for i in range(summary, len(lines)) if b'"type":"cost-state"' in lines[i])
    end = {"boundary": summary, "summary": summary + 1, "before-cost-state": cost}[cut]
    path = tmp_path / "src" / "proj" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(lines[:end]))  # the file as it was when the first import read it
    (unit,) = discover("claude-code", path)
    first = import_unit(db, unit, target, now_ms=NOW)
    assert first.status == "new", first.refusal
    path.write_bytes(b"".join(lines))  # ... and then the rest
    again = import_unit(db, unit, target, now_ms=NOW + 1)
    assert again.status == "updated"

    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    whole = fresh_dir / path.name
    shutil.copy2(path, whole)
    (fresh_unit,) = discover("claude-code", whole)
    last = {r["id"]: r for r in claude_code.parse(fresh_unit, ParseContext()).records}
    (expected,) = [r for r in last.values() if r.get("type") == "compaction"]
    assert expected["details"]["usage"]  # the recorded session's compaction request has usage
    usage = expected["details"]["usage"]
    assert checkpoint_usages(target, unit.session_id) == [usage]
    assert served_usages(db, target, unit.session_id) == [usage]
    turns = compaction_turns(db, unit.session_id)
    assert [t[0] for t in turns] == [expected["id"]]
    assert turns[0][1:] == (expected["details"]["usage"]["input"], expected["details"]["usage"]["output"])
