"""An older copy of a session's file under the same root changes nothing, and the root's imports converge.

A Claude Code session is named by its file name, so two project folders holding ``<session>.jsonl`` (the
folder copied when the project moved, and Claude Code writing on in the copy; a backup) are one session.
With the codemie samples (``claude-code/codemie_v2.1.7_growing_file_turn1.jsonl`` is a byte prefix of
``..._turn2.jsonl``; turn1's last ``tool_use`` has no result yet) in two folders, reproduces: the older copy's
records were written as replacements of the newer ones, so the session showed the last tool call without
its result again, and every later import of the root wrote both again (each "updated", the transcript
growing by two replacement lines per import, never unchanged).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.interchange.import_write import ImportTarget
from store.interchange.importers import discover
from store.interchange.importers.common import SessionReport
from store.interchange.imports import import_root, same_path_older_copy, sources_unchanged
from store.interchange.origin_history import origin_row
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW

TURN1 = "claude-code/codemie_v2.1.7_growing_file_turn1.jsonl"
TURN2 = "claude-code/codemie_v2.1.7_growing_file_turn2.jsonl"
NAME = "0b9c6e2a-0000-4000-8000-000000c0de01.jsonl"


@pytest.mark.parametrize("newer_first", [True, False])
def test_an_older_copy_in_another_folder_changes_nothing(newer_first: bool, tmp_path: Path,
                                                         untouched_samples: Path, db: sqlite3.Connection,
                                                         target: ImportTarget) -> None:
    root = tmp_path / "projects"
    first, second = (TURN2, TURN1) if newer_first else (TURN1, TURN2)
    for folder, sample in (("-work-a", first), ("-work-b", second)):
        (root / folder).mkdir(parents=True)
        shutil.copy(untouched_samples / sample, root / folder / NAME)
    older = str(root / ("-work-b" if newer_first else "-work-a") / NAME)
    newer = str(root / ("-work-a" if newer_first else "-work-b") / NAME)
    sizes = []
    for attempt in range(3):
        reports = import_root(db, "claude-code", root, target, now_ms=lambda: NOW).sessions
        assert len({r.session_id for r in reports}) == 1
        sid = reports[0].session_id
        by_file = {r.files[0].path if r.files else None: r for r in reports}
        messages = [m.record for m in read_transcript(target.transcript(sid)).messages]
        tools = [m for m in messages if m["role"] == "tool"]
        assert len(messages) == 26 and len(tools) == 14
        assert all("result" in t["blocks"][0] for t in tools)  # the last call keeps its result
        sizes.append(target.transcript(sid).stat().st_size)
        if attempt or newer_first:
            (copy,) = [r for r in reports if r.older_copy]
            assert copy.status == "unchanged" and copy.message is not None and newer in copy.message
            assert older not in by_file  # not read past the comparison
        if attempt:
            assert [r.status for r in reports] == ["unchanged", "unchanged"]
        elif not newer_first:  # the older file came first: the newer one adds what it holds
            assert by_file[newer].status == "updated" and by_file[newer].new_messages == 11
    assert sizes[0] == sizes[1] == sizes[2]


def test_a_copy_that_holds_more_is_imported(tmp_path: Path, untouched_samples: Path, db: sqlite3.Connection,
                                            target: ImportTarget) -> None:
    """A copy that is no prefix of the file imported before (it went on differently) is read as before."""
    root = tmp_path / "projects"
    (root / "-work-a").mkdir(parents=True)
    shutil.copy(untouched_samples / TURN1, root / "-work-a" / NAME)
    (rep,) = import_root(db, "claude-code", root, target, now_ms=lambda: NOW).sessions
    shutil.rmtree(root / "-work-a")
    (root / "-work-b").mkdir()
    data = (untouched_samples / TURN1).read_bytes()
    cut = data.rindex(b"\n", 0, len(data) - 1) + 1
    went_on = data[cut:].replace(b'"type":"assistant"', b'"type":"assistant" ', 1)  # its last line differs
    (root / "-work-b" / NAME).write_bytes(data[:cut] + went_on)
    (again,) = import_root(db, "claude-code", root, target, now_ms=lambda: NOW).sessions
    assert again.session_id == rep.session_id and not again.older_copy and again.files


def _import(db: sqlite3.Connection, root: Path, target: ImportTarget) -> SessionReport:
    (rep,) = import_root(db, "claude-code", root, target, now_ms=lambda: NOW).sessions
    return rep


def _shown(target: ImportTarget, sid: str) -> list[dict[str, Any]]:
    return [m.record for m in read_transcript(target.transcript(sid)).messages]


def test_an_older_copy_put_back_at_the_same_path_changes_nothing(tmp_path: Path, untouched_samples: Path,
                                                                 db: sqlite3.Connection,
                                                                 target: ImportTarget) -> None:
    """The same file, imported as turn1 then as turn2, then turn1 put back at that path (a backup restored, a
    sync conflict): it is what an earlier import read there, a strict byte prefix of what the last one read,
    so it is answered ``unchanged`` with ``olderCopy``, as a copy at another path is. Reproduces: its records
    were written as replacements and the last tool call showed without its result again. The newer file put
    back, and grown past it, imports what is new as usual."""
    root = tmp_path / "projects"
    (root / "-work-a").mkdir(parents=True)
    path = root / "-work-a" / NAME
    turn1, turn2 = (untouched_samples / TURN1).read_bytes(), (untouched_samples / TURN2).read_bytes()
    assert turn2.startswith(turn1)
    path.write_bytes(turn1)
    assert _import(db, root, target).status == "new"
    path.write_bytes(turn2)
    rep = _import(db, root, target)
    assert rep.status == "updated" and rep.new_messages == 11
    sid = rep.session_id
    size = target.transcript(sid).stat().st_size
    for _ in range(2):
        path.write_bytes(turn1)
        again = _import(db, root, target)
        assert again.status == "unchanged" and again.older_copy and not again.files
        assert again.new_records == again.replaced_records == again.appended_bytes == 0
        assert again.message is not None and str(path) in again.message
        assert target.transcript(sid).stat().st_size == size
    messages = _shown(target, sid)
    tools = [m for m in messages if m["role"] == "tool"]
    assert len(messages) == 26 and len(tools) == 14
    assert all("result" in t["blocks"][0] for t in tools)  # the last call keeps its result

    path.write_bytes(turn2)  # the newer one restored: nothing in it is new either
    assert _import(db, root, target).status in ("unchanged", "updated")
    assert target.transcript(sid).stat().st_size == size
    last = orjson.loads(turn2.splitlines()[-1])
    line = {**{k: last[k] for k in ("isSidechain", "userType", "cwd", "sessionId", "version", "gitBranch")},
            "parentUuid": last["uuid"], "type": "user", "uuid": "0b9c6e2a-0000-4000-8000-00000000feed",
            "timestamp": "2026-01-14T19:30:00.000Z", "message": {"role": "user", "content": "and one more"}}
    path.write_bytes(turn2 + orjson.dumps(line) + b"\n")  # grown: the new prompt comes in
    grown = _import(db, root, target)
    assert grown.status == "updated" and grown.new_messages == 1 and not grown.older_copy
    assert [m for m in _shown(target, sid) if m["role"] == "user"][-1]["blocks"][0]["text"] == "and one more"
    path.write_bytes(turn1)  # still an older copy of the grown file
    assert _import(db, root, target).older_copy


def test_a_shorter_file_rewritten_at_the_same_path_is_read(tmp_path: Path, untouched_samples: Path,
                                                            db: sqlite3.Connection, target: ImportTarget) -> None:
    """A file made shorter by its tool (Claude Code's compaction, pi rewriting it) is no earlier state of it:
    no byte prefix of what was read, it is read as before, never answered as an older copy."""
    root = tmp_path / "projects"
    (root / "-work-a").mkdir(parents=True)
    path = root / "-work-a" / NAME
    turn1, turn2 = (untouched_samples / TURN1).read_bytes(), (untouched_samples / TURN2).read_bytes()
    path.write_bytes(turn1)
    _import(db, root, target)
    path.write_bytes(turn2)
    _import(db, root, target)
    cut = turn1.rindex(b"\n", 0, len(turn1) - 1) + 1
    went_on = turn1[cut:].replace(b'"timestamp":"2026', b'"timestamp":"2027', 1)  # its last line differs
    assert went_on != turn1[cut:] and len(went_on) == len(turn1) - cut  # as long as the earlier state, other bytes
    path.write_bytes(turn1[:cut] + went_on)
    again = _import(db, root, target)
    assert not again.older_copy and again.files and again.status in ("unchanged", "updated")


@pytest.mark.parametrize("consumed", ["32701", None, [32701]])
def test_an_entry_whose_consumed_is_no_byte_count_reads_the_file_again(consumed: object, tmp_path: Path,
                                                                       untouched_samples: Path,
                                                                       db: sqlite3.Connection,
                                                                       target: ImportTarget) -> None:
    """A damaged origin entry (its ``consumed`` not a byte count) made the unchanged and older-copy checks raise
    (``int()`` of it: TypeError for null or a list, ValueError for a string that is no number) so the import of
    the session raised instead of answering, or took a string of digits for the count. The file holds nothing as
    read then: it is parsed again, nothing is written, and the entry is whole again."""
    root = tmp_path / "projects"
    (root / "-work-a").mkdir(parents=True)
    path = root / "-work-a" / NAME
    shutil.copy(untouched_samples / TURN1, path)
    sid = _import(db, root, target).session_id
    (unit,) = discover("claude-code", root)
    origin = origin_row(db, sid)
    assert origin is not None
    good = origin["origin"]
    damaged = {**good, "files": {str(path): {**good["files"][str(path)], "consumed": consumed}}}
    assert sources_unchanged(unit, good) and not sources_unchanged(unit, damaged)
    assert same_path_older_copy(unit, damaged) is None
    with db:
        db.execute("UPDATE session_import_origins SET origin_json = ? WHERE session_id = ?",
                   (orjson.dumps(damaged), sid))
    size = target.transcript(sid).stat().st_size
    again = _import(db, root, target)
    assert again.status == "unchanged" and again.files and not again.older_copy  # parsed again, nothing written
    assert target.transcript(sid).stat().st_size == size
    repaired = origin_row(db, sid)
    assert repaired is not None and repaired["origin"]["files"][str(path)]["consumed"] == path.stat().st_size
    assert not _import(db, root, target).files  # unchanged, not parsed
