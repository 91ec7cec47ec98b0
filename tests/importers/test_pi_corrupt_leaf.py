"""A pi session whose leaf does not reach a root falls back to the highest reachable leaf, with a
system notice (seed 000 §3.4).

Reproduces: the importer walked from the file's last entry and stopped at a dangling parent or a
cycle, so a session whose newest entry was corrupt imported a fragment that does not start at the
conversation's beginning (or nothing), and said so nowhere.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from store.interchange.import_write import ImportTarget
from store.interchange.importers.pi import highest_reachable_leaf
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from tests.importers.test_pi_branches import STAGE_3, entry, shown, unit, write
from tests.samplekit import NOW

BRANCH_A = ["q1", "a1", "q2 on A", "a2 on A", "q3 back on A", "a3 on A"]


def notices(target: ImportTarget, sid: str) -> list[dict[str, Any]]:
    t = read_transcript(target.transcript(sid))
    return [m.record for m in t.messages if m.record["role"] == "system"]


def test_a_dangling_leaf_falls_back_to_the_highest_reachable_leaf_with_a_notice(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """Seed 000 §3.4: "On load, leafId must reach a root. Corrupt data falls back to the highest-sequence
    reachable leaf and produces a system notice. Walk length is bounded by node count." """
    corrupt = [*STAGE_3, entry("e9", "gone", "user", "orphan", 9)]  # the leaf's parent is not in the file
    sid = import_unit(db, unit(write(tmp_path / "pi" / "s.jsonl", corrupt)), target, now_ms=NOW).session_id
    texts = shown(target, sid)
    assert texts[:-1] == BRANCH_A  # e8's branch: the newest entry whose chain reaches the root
    (notice,) = notices(target, sid)
    assert notice == read_transcript(target.transcript(sid)).messages[-1].record
    assert notice["meta"]["importedKind"] == "pi/corrupt_leaf"
    assert notice["meta"]["corruptLeaf"] == {"leaf": "e9", "fallback": "e8", "reason": "dangling parent gone"}
    assert "e9" in notice["blocks"][0]["text"] and "e8" in notice["blocks"][0]["text"]


def test_a_parent_cycle_at_the_leaf_falls_back_too(tmp_path: Path, db: sqlite3.Connection,
                                                   target: ImportTarget) -> None:
    """Seed 000 §3.4: "Corrupt data falls back to the highest-sequence reachable leaf and produces a system
    notice. Walk length is bounded by node count." — a cycle ends the walk instead of looping."""
    cyclic = [*STAGE_3, entry("e9", "e10", "user", "loop a", 9), entry("e10", "e9", "assistant", "loop b", 10)]
    sid = import_unit(db, unit(write(tmp_path / "pi" / "s.jsonl", cyclic)), target, now_ms=NOW).session_id
    assert shown(target, sid)[:-1] == BRANCH_A
    (notice,) = notices(target, sid)
    assert notice["meta"]["corruptLeaf"]["fallback"] == "e8"
    assert notice["meta"]["corruptLeaf"]["reason"].startswith("parent cycle at ")


def test_an_intact_leaf_gets_no_notice(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """Seed 000 §3.4: "On load, leafId must reach a root." — when it does, that is the branch: no notice."""
    sid = import_unit(db, unit(write(tmp_path / "pi" / "s.jsonl", STAGE_3)), target, now_ms=NOW).session_id
    assert shown(target, sid) == BRANCH_A and notices(target, sid) == []


def test_highest_reachable_leaf_is_linear_and_bounded() -> None:
    """Seed 000 §3.4: "Walk length is bounded by node count." — every entry is visited once, cycles and
    dangling chains included; nothing reaches a root → no fallback."""
    n = 50_000
    parents: dict[str, str | None] = {"r": None, **{f"k{i}": (f"k{i - 1}" if i else "r") for i in range(n)}}
    parents.update({"c1": "c2", "c2": "c1", "d": "nowhere"})
    order = ["r", *(f"k{i}" for i in range(n)), "c1", "c2", "d"]
    assert highest_reachable_leaf(parents, order) == f"k{n - 1}"
    assert highest_reachable_leaf({"c1": "c2", "c2": "c1", "d": "x"}, ["c1", "c2", "d"]) is None


def test_a_repaired_file_hides_the_notice_on_reimport(tmp_path: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    """Seed 000 §3.4 "Corrupt data falls back ... and produces a system notice": the notice belongs to the
    corrupt state; once the file's leaf reaches the root again, a re-import converges on the repaired
    branch (the notice is hidden) instead of taking the file for an older copy."""
    path = tmp_path / "pi" / "s.jsonl"
    sid = import_unit(db, unit(write(path, [*STAGE_3, entry("e9", "gone", "user", "orphan", 9)])), target,
                      now_ms=NOW).session_id
    assert len(notices(target, sid)) == 1
    again = import_unit(db, unit(write(path, [*STAGE_3, entry("e9", "e8", "user", "q4 on A", 9)])), target,
                        now_ms=NOW + 1)
    assert not again.older_copy
    assert shown(target, sid) == [*BRANCH_A, "q4 on A"]


RECORDED_PI = next((Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "pi" / "0.73.1").glob(
    "sessions/*/*_01a234ad-dfe8-7038-b380-b3ff8f231306.jsonl"))
"""The recorded pi 0.73.1 ``basics`` session: plain, thinking, tool-ok and tool-fail turns, one line each."""


def _crashed(dst: Path) -> Path:
    """The recorded session as pi leaves it after a crash while writing the tool-ok turn's reply and a resume:
    that line's first half without its newline (the write stopped there), then the next prompt pi appended on
    resume right after those bytes, hanging off the last intact entry (the tool result: the torn entry was
    skipped when pi loaded the file). Every other line is the file's own."""
    lines = RECORDED_PI.read_bytes().splitlines(keepends=True)
    torn_at = next(i for i, line in enumerate(lines) if b"The tool answered: fidelity-ok" in line)
    torn, resumed = json.loads(lines[torn_at]), json.loads(lines[torn_at + 1])
    assert resumed["parentId"] == torn["id"] and resumed["message"]["role"] == "user"
    resumed["parentId"] = torn["parentId"]
    cut = lines[torn_at][: len(lines[torn_at]) // 2]
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(b"".join([*lines[:torn_at], cut, json.dumps(resumed, separators=(",", ":")).encode() + b"\n",
                              *lines[torn_at + 2:]]))
    return dst


def test_an_entry_written_after_a_torn_line_keeps_the_newer_part_with_a_notice(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """Seed 000 §3.4: "On load, leafId must reach a root. Corrupt data falls back to the highest-sequence
    reachable leaf and produces a system notice." The entry pi wrote on resume (behind the torn bytes) is
    read, so the newest leaf reaches the root: the turns after the crash are shown, not hidden behind a
    fallback to the entry before it; the lost entry is a notice where it was."""
    path = _crashed(tmp_path / "pi" / RECORDED_PI.name)
    outcome = import_unit(db, unit(path), target, now_ms=NOW)
    t = read_transcript(target.transcript(outcome.session_id))
    texts = [(m.record["role"], (m.record["blocks"][0].get("text") or m.record.get("toolName") or "")[:30])
             for m in t.messages if m.id not in t.deleted_ids]
    assert texts[-4:] == [("system", "An entry of this session was c"), ("user", "[tool-fail] read a file that i"),
                          ("tool", "read"), ("assistant", "The tool answered: ENOENT: no ")]
    assert not [m for m in t.messages if (m.record.get("meta") or {}).get("importedKind") == "pi/corrupt_leaf"]
    assert "The tool answered: fidelity-ok" not in [x for _, x in texts]  # the torn reply itself is lost
    assert outcome.files[0].skipped["torn entry"] == 1
    again = import_unit(db, unit(path), target, now_ms=NOW + 1)
    assert again.status == "unchanged"
