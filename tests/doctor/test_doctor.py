"""``pi-host doctor`` on data directories damaged on purpose, one way each (issue 14, item 3).

The directory is written by a real host (sessions, a tombstone, an attachment
and its reference, a secret, receipts). Each test breaks one thing, then: the
check finds it (and, without ``--repair``, changes no byte); ``--repair`` fixes
what can be fixed from the files; a run after that is clean, or reports only
the damage nothing can repair.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from runtime.datadir import DataDir
from store.doctor.doctor_report import EXIT_CLEAN, EXIT_DAMAGED, EXIT_REPAIRABLE
from tests.doctor.doctorkit import (
    ATTACHMENT_SHA,
    SECRET_REF,
    checks,
    db,
    doctor,
    problems,
    row,
    snapshot,
)


def _exec(data: DataDir, *statements: str) -> None:
    conn = db(data)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def _transcript(data: DataDir, sid: str) -> Path:
    return data.sessions_dir / f"{sid}.jsonl"


def _found_then_repaired(data: DataDir, check: str, *, subject: str | None = None) -> None:
    """Found without --repair (no byte changed), repaired with it, clean afterwards."""
    before = snapshot(data.root)
    found = doctor(data)
    assert found.exit_code == EXIT_REPAIRABLE, problems(found)
    hit = [f for f in found.findings if f.check == check and (subject is None or f.subject == subject)]
    assert hit and all(str(f.severity) == "repairable" and not f.repaired for f in hit), problems(found)
    assert snapshot(data.root) == before, "doctor without --repair changed a file"
    fixed = doctor(data, repair=True)
    assert fixed.exit_code == EXIT_REPAIRABLE
    assert all(f.repaired for f in fixed.findings if str(f.severity) == "repairable"), problems(fixed)
    again = doctor(data)
    assert again.exit_code == EXIT_CLEAN, problems(again)


def test_a_clean_directory_is_reported_clean_and_left_alone(data: DataDir) -> None:
    before = snapshot(data.root)
    report = doctor(data)
    assert report.exit_code == EXIT_CLEAN and report.findings == []
    assert report.checked == {"sessions": 2, "transcripts": 2, "attachments": 1, "secrets": 1, "receipts": 4,
                              "settings": 2}
    assert snapshot(data.root) == before
    assert doctor(data, repair=True).findings == []


# --- the database ---------------------------------------------------------------


def test_index_pages_out_of_step_with_their_table_are_rebuilt(data: DataDir) -> None:
    conn = db(data)
    conn.execute("CREATE INDEX doctor_spare ON sessions(updated_at DESC) WHERE 0")
    a, b = (conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (n,)).fetchone()[0]
            for n in ("idx_sessions_updated", "doctor_spare"))
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = 'idx_sessions_updated'", (b,))
    conn.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = 'doctor_spare'", (a,))
    conn.close()
    _found_then_repaired(data, "sqlite.integrity")


def test_a_damaged_table_page_is_damage_doctor_cannot_repair(data: DataDir) -> None:
    conn = db(data)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'kv'").fetchone()[0]
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(data.db_path, "r+b") as fh:
        fh.seek((root - 1) * page + 8)
        fh.write(b"\xff" * 64)
    report = doctor(data, repair=True)
    assert report.exit_code == EXIT_DAMAGED
    assert [f.check for f in report.findings if str(f.severity) == "damaged"] == ["sqlite.integrity"]


@pytest.mark.parametrize(("statement", "column"), [
    # the damage tests/integrity/test_index_damage_kinds.py writes under a serving host (a random stretch over
    # pi.sqlite left its pages well formed): the host's first read of it answers CORRUPT_DATA and rebuilds
    ("UPDATE messages SET text = CAST(X'6e6565646c653120ff' AS TEXT) WHERE id = 'a2'", "messages.text"),
    ("UPDATE sessions SET title = CAST(X'41ff' AS TEXT) WHERE id = 'alpha'", "sessions.title"),
    # a column doctor's own checks read: it stopped with a traceback
    ("UPDATE command_receipts SET response_json = CAST(X'7bff7d' AS TEXT) WHERE submission_id = 'sub-a1'",
     "command_receipts.response_json"),
])
def test_a_text_value_that_is_not_utf8_is_damage_not_clean(data: DataDir, statement: str, column: str) -> None:
    """SQLite's pages are well formed, so ``integrity_check`` says ok; doctor called such an index clean
    (or stopped with a traceback) while the running host treats it as damage (``is_corruption``)."""
    _exec(data, statement)
    before = snapshot(data.root)
    report = doctor(data)
    assert report.exit_code == EXIT_DAMAGED, problems(report)
    found = [f for f in report.findings if f.check == "sqlite.text"]
    assert len(found) == 1 and found[0].data["columns"] == {column: 1}, problems(report)
    assert snapshot(data.root) == before, "doctor without --repair changed a file"
    assert doctor(data, repair=True).exit_code == EXIT_DAMAGED  # nothing here can put the text back


def test_a_corrupt_search_index_is_rebuilt_from_the_messages(data: DataDir) -> None:
    _exec(data, "UPDATE messages_fts_data SET block = randomblob(length(block)) WHERE id > 10")
    _found_then_repaired(data, "fts.index")
    assert row(data, "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH '\"数据库\"'") == [(4,)]


def test_a_message_missing_from_the_search_index_is_put_back(data: DataDir) -> None:
    mid, text = row(data, "SELECT mid, text FROM messages WHERE id = 'a2'")[0]
    conn = db(data)
    conn.execute("INSERT INTO messages_fts(messages_fts, rowid, text) VALUES ('delete', ?, ?)", (mid, text))
    conn.close()
    report = doctor(data)
    assert [f.data.get("missing") for f in report.findings if f.check == "fts.index"] == [1]
    _found_then_repaired(data, "fts.index")


def test_a_corrupt_tool_output_index_is_rebuilt_from_tool_output(data: DataDir) -> None:
    """Tool output search (v28) had no doctor check: a damaged ``tool_fts`` went unreported."""
    _exec(data, "UPDATE tool_fts_data SET block = randomblob(length(block)) WHERE id > 10")
    _found_then_repaired(data, "fts.toolIndex")
    assert row(data, "SELECT id FROM tool_fts_docsize") == row(data, "SELECT mid FROM tool_output")


def test_tool_output_rows_out_of_step_are_dropped_and_put_back(data: DataDir) -> None:
    """An output row whose message is gone is dropped; an output row missing from ``tool_fts`` is put back."""
    mid, text = row(data, "SELECT mid, text FROM tool_output")[0]
    _exec(data, "DROP TRIGGER tool_output_ai",
          f"INSERT INTO tool_output(mid, text) VALUES ({mid + 1000}, 'orphan output')",
          f"INSERT INTO tool_fts(tool_fts, rowid, text) VALUES ('delete', {mid}, '{text}')")
    report = doctor(data)
    found = [f.data for f in report.findings if f.check == "fts.toolIndex"]
    assert [(d.get("orphanOutput"), d.get("missing")) for d in found] == [(1, 2)]
    _exec(data, """CREATE TRIGGER tool_output_ai AFTER INSERT ON tool_output
  BEGIN INSERT INTO tool_fts(rowid, text) VALUES (new.mid, new.text); END""")
    _found_then_repaired(data, "fts.toolIndex")
    assert row(data, "SELECT mid FROM tool_output") == [(mid,)]
    assert row(data, "SELECT id FROM tool_fts_docsize") == [(mid,)]


# --- index vs transcript -----------------------------------------------------------


@pytest.mark.parametrize(("damage", "key"), [
    ("DELETE FROM messages WHERE id = 'a2'", "missingCount"),
    ("INSERT INTO messages(mid, id, session_id, seq, role, text, created_at) SELECT (ordinal << 24) + 9, "
     "'ghost', id, 9, 'user', 'not in the file', 1 FROM sessions WHERE id = 'alpha'", "staleCount"),
    ("UPDATE messages SET seq = seq + 20, mid = mid + 20 WHERE id = 'a3'", "seqGaps"),
    ("UPDATE messages SET line_offset = line_offset + 3 WHERE id = 'a1'", "offsetsNotOnLineStart"),
    ("UPDATE messages SET deleted = 0 WHERE id = 'b1'", "wrongTombstoneFlags"),
    ("UPDATE sessions SET indexed_len = indexed_len + 4096 WHERE id = 'alpha'", "indexedPastEnd"),
])
def test_index_rows_that_disagree_with_the_transcript_are_reindexed(data: DataDir, damage: str, key: str) -> None:
    _exec(data, damage)
    report = doctor(data)
    found = [f for f in report.findings if f.check == "index.session"]
    assert len(found) == 1 and key in found[0].data, problems(report)
    transcript = _transcript(data, "alpha").read_bytes()
    _found_then_repaired(data, "index.session")
    assert _transcript(data, "alpha").read_bytes() == transcript  # the file is the source; never touched
    assert row(data, "SELECT id, seq FROM messages WHERE session_id = 'alpha' ORDER BY seq") == [
        ("a0", 1), ("a1", 2), ("a2", 3), ("a3", 4)]


def test_a_torn_tail_is_quarantined_and_cut(data: DataDir) -> None:
    path = _transcript(data, "beta")
    good = path.read_bytes()
    path.write_bytes(good + b'{"type":"message","id":"b9","ro')
    _found_then_repaired(data, "transcript.torn_tail")
    assert path.read_bytes() == good
    torn = [p for p in data.sessions_dir.iterdir() if p.name.startswith("beta.jsonl.torn-")]
    assert [p.read_bytes() for p in torn] == [b'{"type":"message","id":"b9","ro']
    assert checks(doctor(data)) == ["quarantine.torn_tail"]  # kept and reported, never deleted


def test_a_bad_line_in_the_middle_is_damage_and_is_kept(data: DataDir) -> None:
    path = _transcript(data, "beta")
    lines = path.read_bytes().splitlines(keepends=True)
    damaged = b"".join([*lines[:2], b"{not json at all}\n", *lines[2:]])
    path.write_bytes(damaged)
    report = doctor(data, repair=True)
    assert report.exit_code == EXIT_DAMAGED
    bad = [f for f in report.findings if f.check == "transcript.bad_lines"]
    assert len(bad) == 1 and bad[0].data["offsets"] == [len(lines[0]) + len(lines[1])]
    assert path.read_bytes() == damaged


def test_an_orphan_transcript_is_reindexed_never_deleted(data: DataDir) -> None:
    _exec(data, "DELETE FROM sessions WHERE id = 'beta'")
    transcript = _transcript(data, "beta").read_bytes()
    _found_then_repaired(data, "transcript.orphan")
    assert _transcript(data, "beta").read_bytes() == transcript
    assert row(data, "SELECT id, deleted FROM messages WHERE session_id = 'beta' ORDER BY seq") == [
        ("b0", 0), ("b1", 1), ("b2", 0), ("t1", 0)]
    assert row(data, "SELECT m.id FROM tool_output JOIN messages AS m USING (mid)") == [("t1",)]


def test_a_row_whose_transcript_is_gone_is_damage(data: DataDir) -> None:
    _transcript(data, "beta").unlink()
    report = doctor(data, repair=True)
    assert report.exit_code == EXIT_DAMAGED and checks(report, "damaged") == ["transcript.missing"]


# --- orphans around the transcripts -------------------------------------------------


def test_orphan_checkpoint_revisions_scratch_and_review_snapshot(data: DataDir) -> None:
    (data.sessions_dir / "ghost.inflight.json").write_bytes(b'{"schema":1}')
    (data.sessions_dir / "ghost.revisions.jsonl").write_bytes(b'{"type":"revision"}\n')
    (data.scratch_root / "ghost" / "pasted").mkdir(parents=True)
    (data.scratch_root / "ghost" / "pasted" / "p.txt").write_bytes(b"x")
    (data.review_changes_dir / "ghost" / "snap").mkdir(parents=True)
    (data.review_changes_dir / "ghost" / "snap" / "meta.json").write_bytes(b"{}")
    (data.sessions_dir / "alpha.jsonl.tmp.abc123").write_bytes(b"half a rewrite")
    report = doctor(data)
    assert checks(report, "repairable") == ["orphan.inflight", "orphan.review_changes", "orphan.revisions",
                                            "orphan.scratch", "temp.files"]
    fixed = doctor(data, repair=True)
    assert all(f.repaired for f in fixed.findings if str(f.severity) == "repairable")
    assert sorted(p.name.rsplit(".", 1)[0] for p in data.quarantine_dir.iterdir()) == [
        "ghost.inflight.json", "ghost.revisions.jsonl"]
    assert not (data.scratch_root / "ghost").exists() and not (data.review_changes_dir / "ghost").exists()
    assert not (data.sessions_dir / "alpha.jsonl.tmp.abc123").exists()
    after = doctor(data)
    assert after.exit_code == EXIT_CLEAN and checks(after) == ["quarantine.file", "quarantine.file"]


# --- attachments -----------------------------------------------------------------


def test_an_attachment_file_without_its_row_is_recorded(data: DataDir) -> None:
    _exec(data, "DELETE FROM attachment_refs", "DELETE FROM attachment_blobs")
    _found_then_repaired(data, "attachments.unindexed")
    assert row(data, "SELECT sha256, size_bytes FROM attachment_blobs") == [(ATTACHMENT_SHA, 240)]


@pytest.mark.parametrize(("damage", "expected"), [
    ("lose-bytes", ["attachments.block_without_bytes", "attachments.missing_bytes"]),
    ("change-bytes", ["attachments.corrupt"]),
    ("lose-row-and-bytes", ["attachments.block_without_bytes", "attachments.ref_without_bytes"]),
])
def test_attachment_bytes_that_are_gone_or_changed_are_damage(data: DataDir, damage: str,
                                                              expected: list[str]) -> None:
    blob = data.attachments_dir / ATTACHMENT_SHA
    if damage == "change-bytes":
        blob.write_bytes(b"something else entirely")
    else:
        blob.unlink()
    if damage == "lose-row-and-bytes":
        _exec(data, "DELETE FROM attachment_blobs")
    report = doctor(data, repair=True)
    assert report.exit_code == EXIT_DAMAGED
    assert checks(report, "damaged") == expected


# --- secrets ------------------------------------------------------------------------


def _secret_file(data: DataDir) -> Path:
    return data.secrets_dir / (hashlib.sha256(SECRET_REF.encode()).hexdigest() + ".sec")


def test_a_secrets_meta_row_without_its_file_is_removed(data: DataDir) -> None:
    _secret_file(data).unlink()
    _found_then_repaired(data, "secrets.row_without_file")
    assert row(data, "SELECT count(*) FROM secrets_meta") == [(0,)]


def test_a_secret_file_without_its_row_gets_one(data: DataDir) -> None:
    _exec(data, "DELETE FROM secrets_meta")
    _found_then_repaired(data, "secrets.file_without_row")
    assert row(data, "SELECT secret_ref FROM secrets_meta") == [(SECRET_REF,)]


def test_a_swapped_secret_file_and_an_open_key_file_are_damage(data: DataDir) -> None:
    other = data.secrets_dir / (hashlib.sha256(b"provider/other").hexdigest() + ".sec")
    shutil.copyfile(_secret_file(data), other)
    os.chmod(data.secrets_dir / ".machine-key", 0o644)
    report = doctor(data, repair=True)
    assert report.exit_code == EXIT_DAMAGED
    assert checks(report, "damaged") == ["secrets.key", "secrets.unreadable"]
    assert other.exists()  # kept for inspection


# --- receipts -----------------------------------------------------------------------


def test_a_receipt_whose_message_is_gone_is_dropped(data: DataDir) -> None:
    path = _transcript(data, "alpha")
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(line for line in lines if b'"id":"a3"' not in line))
    report = doctor(data)
    gone = [f for f in report.findings if f.check == "receipts.effect_gone"]
    assert [(f.data["sessionId"], f.data["messageId"]) for f in gone] == [("alpha", "a3")]
    doctor(data, repair=True)
    assert row(data, "SELECT submission_id FROM command_receipts WHERE submission_id LIKE 'sub-a%' "
                     "ORDER BY submission_id") == [("sub-a0",), ("sub-a1",), ("sub-a2",)]
    assert doctor(data).exit_code == EXIT_CLEAN


def test_a_message_kept_in_the_revisions_file_keeps_its_receipt(data: DataDir) -> None:
    path = _transcript(data, "alpha")
    lines = path.read_bytes().splitlines(keepends=True)
    archived = next(line for line in lines if b'"id":"a3"' in line)
    path.write_bytes(b"".join(line for line in lines if line is not archived))
    record = json.loads(archived)
    revision = {"type": "revision", "rootUserId": "a2", "revisionIndex": 1, "createdAt": "2026-01-01T00:00:00Z",
                "messages": [record], "turns": {}}
    (data.sessions_dir / "alpha.revisions.jsonl").write_text(json.dumps(revision) + "\n")
    assert "receipts.effect_gone" not in checks(doctor(data))


# --- other schema versions ------------------------------------------------------------


def test_a_seed_era_database_is_checked_but_left_to_the_migration(tmp_path: Path) -> None:
    from tests.migrations.seedkit import build_seed_dir

    seed = build_seed_dir(tmp_path / "seed", 10)
    before = snapshot(seed.root)
    report = doctor(DataDir(seed.root), repair=True)
    assert report.exit_code == EXIT_CLEAN and report.schema_version == 10
    assert checks(report) == ["schema.version"]
    assert snapshot(seed.root) == before  # nothing to repair: not even the migration runs here



def test_repairs_touch_nothing_else(data: DataDir) -> None:
    """A repair of one session leaves the other session's rows, the secrets and the settings as they were."""
    keep = row(data, "SELECT * FROM messages WHERE session_id = 'beta' ORDER BY seq")
    settings = row(data, "SELECT * FROM kv")
    _exec(data, "DELETE FROM messages WHERE id = 'a0'")
    doctor(data, repair=True)
    assert row(data, "SELECT * FROM messages WHERE session_id = 'beta' ORDER BY seq") == keep
    assert row(data, "SELECT * FROM kv") == settings
