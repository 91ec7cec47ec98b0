"""A pi session's import converges on the file's current branch (issue 23, pi, high).

Reproduces: messages the importer hid as off-branch never came back. Importing an older copy of a
pi session hid its newer turns, and re-importing the current file then reported ``unchanged`` while
they stayed deleted; a pi user who branched with /tree and returned to the first branch was shown a
reply to a question that was no longer visible. The files are in pi's own format (header
``{"type":"session","version":3,...}``, entries with ``id``/``parentId``, as in samples/pi).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from store.indexing import index
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import SourceUnit
from store.interchange.imports import import_unit, origin_row
from store.tombstones import tombstone_line
from store.transcripts.transcript import TranscriptWriter, read_transcript
from tests.samplekit import NOW, open_db, rows, sample_files, tx

HEADER = {"type": "session", "version": 3, "id": "019e19b4-0000-7000-8000-00000000b4a7",
          "timestamp": "2026-05-12T01:02:27.657Z", "cwd": "/tmp/project"}


def entry(eid: str, parent: str | None, role: str, text: str, second: int) -> dict[str, Any]:
    ts = f"2026-05-12T01:03:{second:02d}.000Z"
    message: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}],
                               "timestamp": 1778547780000 + second * 1000}
    if role == "assistant":
        message.update({"api": "openai-completions", "provider": "stub", "model": "stub-model",
                        "usage": {"input": 10, "output": 2, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 12},
                        "stopReason": "stop"})
    return {"type": "message", "id": eid, "parentId": parent, "timestamp": ts, "message": message}


# pi's /tree: the user answered on branch A, went back to "a1" and asked on branch B, then went back to
# A's last reply and continued there. pi appends every entry; the leaf is the last one.
STAGE_1 = [entry("e1", None, "user", "q1", 1), entry("e2", "e1", "assistant", "a1", 2),
           entry("e3", "e2", "user", "q2 on A", 3), entry("e4", "e3", "assistant", "a2 on A", 4)]
STAGE_2 = [*STAGE_1, entry("e5", "e2", "user", "q2 on B", 5), entry("e6", "e5", "assistant", "a2 on B", 6)]
STAGE_3 = [*STAGE_2, entry("e7", "e4", "user", "q3 back on A", 7), entry("e8", "e7", "assistant", "a3 on A", 8)]


def write(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in [HEADER, *entries]))
    return path


def unit(path: Path) -> SourceUnit:
    (only,) = IMPORTERS["pi"].discover(path)
    return only


def shown(target: ImportTarget, sid: str) -> list[str]:
    t = read_transcript(target.transcript(sid))
    return [m.record["blocks"][0]["text"] for m in t.messages if m.id not in t.deleted_ids]


def test_branch_switch_and_back_shows_exactly_the_current_branch(tmp_path: Path, db: sqlite3.Connection,
                                                                 target: ImportTarget) -> None:
    path = tmp_path / "pi" / "s.jsonl"
    first = import_unit(db, unit(write(path, STAGE_1)), target, now_ms=NOW)
    sid = first.session_id
    assert shown(target, sid) == ["q1", "a1", "q2 on A", "a2 on A"]
    second = import_unit(db, unit(write(path, STAGE_2)), target, now_ms=NOW + 1)
    assert (second.hidden_off_branch, second.restored_on_branch) == (2, 0)
    assert shown(target, sid) == ["q1", "a1", "q2 on B", "a2 on B"]
    third = import_unit(db, unit(write(path, STAGE_3)), target, now_ms=NOW + 2)
    assert third.status == "updated"
    assert (third.hidden_off_branch, third.restored_on_branch) == (2, 2)
    assert shown(target, sid) == ["q1", "a1", "q2 on A", "a2 on A", "q3 back on A", "a3 on A"]
    # the index agrees with the transcript, and a fresh import of the same file shows the same
    assert [r[0] for r in rows(db, "SELECT text FROM messages WHERE session_id = ? AND deleted = 0 ORDER BY seq",
                               sid)] == shown(target, sid)
    fresh_root = tmp_path / "fresh"
    fresh_root.mkdir()
    fresh_target = ImportTarget(fresh_root / "sessions")
    fresh_target.sessions_dir.mkdir()
    conn = open_db(fresh_root / "pi.sqlite")
    try:
        import_unit(conn, unit(path), fresh_target, now_ms=NOW)
        assert shown(fresh_target, sid) == shown(target, sid)
    finally:
        conn.close()
    again = import_unit(db, unit(path), target, now_ms=NOW + 3)
    assert again.status == "unchanged"


def test_an_older_copy_hides_nothing_and_the_current_file_stays_whole(tmp_path: Path, db: sqlite3.Connection,
                                                                      target: ImportTarget) -> None:
    current = write(tmp_path / "pi" / "s.jsonl", STAGE_3)
    sid = import_unit(db, unit(current), target, now_ms=NOW).session_id
    want = ["q1", "a1", "q2 on A", "a2 on A", "q3 back on A", "a3 on A"]
    assert shown(target, sid) == want
    for older in (STAGE_1, STAGE_2):  # a backup from before the branch, and one taken while on branch B
        copy = write(tmp_path / "backup" / f"s-{len(older)}.jsonl", older)
        rep = import_unit(db, unit(copy), target, now_ms=NOW + 1)
        assert rep.session_id == sid and rep.older_copy
        assert shown(target, sid) == want
        # B's turns were never imported (off the newest branch): kept in the transcript, hidden
        assert (rep.new_messages, rep.hidden_off_branch) == ((0, 0) if older is STAGE_1 else (2, 2))
    back = import_unit(db, unit(current), target, now_ms=NOW + 2)
    assert back.status == "unchanged" and shown(target, sid) == want
    # and a file that goes on from branch B later shows B (the kept turns are restored)
    on_b = [*STAGE_3, entry("e9", "e6", "user", "q3 on B", 9)]
    moved = import_unit(db, unit(write(current, on_b)), target, now_ms=NOW + 3)
    assert moved.restored_on_branch == 2
    assert shown(target, sid) == ["q1", "a1", "q2 on B", "a2 on B", "q3 on B"]


def test_a_real_pi_sample_and_a_truncated_copy_of_it(tmp_path: Path, db: sqlite3.Connection,
                                                     target: ImportTarget) -> None:
    (sample,) = [p for p in sample_files("pi") if p.name == "agent-sessions_stub_provider_compaction.jsonl"]
    current = tmp_path / "pi" / sample.name
    current.parent.mkdir()
    shutil.copyfile(sample, current)
    sid = import_unit(db, unit(current), target, now_ms=NOW).session_id
    before = shown(target, sid)
    lines = sample.read_bytes().splitlines(keepends=True)
    partial = tmp_path / "backup" / sample.name
    partial.parent.mkdir()
    partial.write_bytes(b"".join(lines[: len(lines) // 2]))
    rep = import_unit(db, unit(partial), target, now_ms=NOW + 1)
    assert rep.status == "unchanged" and rep.hidden_off_branch == 0
    assert shown(target, sid) == before
    assert import_unit(db, unit(current), target, now_ms=NOW + 2).status == "unchanged"
    assert shown(target, sid) == before


def test_a_message_the_user_deleted_in_the_host_stays_deleted(tmp_path: Path, db: sqlite3.Connection,
                                                              target: ImportTarget) -> None:
    path = tmp_path / "pi" / "s.jsonl"
    sid = import_unit(db, unit(write(path, STAGE_1)), target, now_ms=NOW).session_id
    q2 = f"{sid}:e3"
    with TranscriptWriter.open(target.transcript(sid)) as writer:
        off, end = writer.append([tombstone_line("user-delete-1", q2, True, created_at_ms=NOW)])
    tx(db, lambda c: (index.set_deleted(c, sid, q2, True), index.set_index_mark(
        c, sid, end, index.require_session(c, sid)["_fileEpoch"])))
    import_unit(db, unit(write(path, STAGE_2)), target, now_ms=NOW + 1)
    third = import_unit(db, unit(write(path, STAGE_3)), target, now_ms=NOW + 2)
    assert third.restored_on_branch == 1
    assert shown(target, sid) == ["q1", "a1", "a2 on A", "q3 back on A", "a3 on A"]


def test_messages_an_older_import_hid_come_back_although_the_file_is_unchanged(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    """Heals what the old rule left: the origin row matched the file, so the import said ``unchanged``."""
    path = write(tmp_path / "pi" / "s.jsonl", STAGE_3)
    sid = import_unit(db, unit(path), target, now_ms=NOW).session_id
    # what the old importer wrote after an older copy: off-branch tombstones for the newer turns
    hidden = [f"{sid}:e7", f"{sid}:e8"]
    with TranscriptWriter.open(target.transcript(sid)) as writer:
        off, end = writer.append([tombstone_line(f"{sid}:off-branch:{m.rsplit(':', 1)[-1]}", m, True,
                                                 created_at_ms=NOW) for m in hidden])

    def old_state(c: sqlite3.Connection) -> None:
        for m in hidden:
            index.set_deleted(c, sid, m, True)
        index.set_index_mark(c, sid, end, index.require_session(c, sid)["_fileEpoch"])
        origin = origin_row(c, sid)
        assert origin is not None
        legacy = {k: v for k, v in origin["origin"].items() if k != "importRules"}
        c.execute("UPDATE session_import_origins SET origin_json = ? WHERE session_id = ?", (json.dumps(legacy), sid))

    tx(db, old_state)
    assert shown(target, sid)[-2:] == ["q2 on A", "a2 on A"]
    healed = import_unit(db, unit(path), target, now_ms=NOW + 1)
    assert healed.status == "updated" and healed.restored_on_branch == 2
    assert shown(target, sid) == ["q1", "a1", "q2 on A", "a2 on A", "q3 back on A", "a3 on A"]
    assert import_unit(db, unit(path), target, now_ms=NOW + 2).status == "unchanged"
