"""The write side of an import: growth, refusals, failure injection, crash recovery, idempotency.

Seed 003 §5: the transcript is written first, the index second, and a failure
leaves neither half behind; §4.5: deterministic ids, ``source`` for the badge,
the project upserted from the cwd by normalized path, re-imports create
neither another session nor another project row.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.fsutil import sweep_temp_files
from store.indexing import index, reconcile
from store.interchange import imports
from store.interchange.import_write import ImportTarget, publish, stage
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import ImportLimits, SourceUnit, session_id_for
from store.interchange.imports import import_root, import_unit
from store.jsonio import dumps_line
from store.search.search import search_messages
from store.transcripts.transcript import TranscriptWriter, read_transcript
from tests.importers import gen
from tests.samplekit import NOW, open_db, rows, samples_dir, tx


def unit(source: str, path: Path) -> SourceUnit:
    (only,) = IMPORTERS[source].discover(path)
    return only


def visible(target: ImportTarget, sid: str) -> list[dict[str, Any]]:
    t = read_transcript(target.transcript(sid))
    return [m.record for m in t.messages if m.id not in t.deleted_ids]


def cc_line(uuid: str, parent: str | None, kind: str, content: Any, **extra: Any) -> bytes:
    rec = {"type": kind, "uuid": uuid, "parentUuid": parent, "sessionId": "s-write", "cwd": "/w/proj",
           "timestamp": f"2026-03-01T10:00:{len(uuid) % 60:02d}.000Z",
           "message": {"role": kind, "content": content, **({"id": f"api-{uuid}"} if kind == "assistant" else {})},
           **extra}
    return json.dumps(rec).encode() + b"\n"


def test_a_growing_claude_code_file_appends_only_what_is_new(tmp_path: Path, db: sqlite3.Connection,
                                                             target: ImportTarget) -> None:
    samples = samples_dir() / "claude-code"
    turn1 = (samples / "codemie_v2.1.7_growing_file_turn1.jsonl").read_bytes()
    turn2 = (samples / "codemie_v2.1.7_growing_file_turn2.jsonl").read_bytes()
    assert turn2.startswith(turn1)
    live = tmp_path / "e9fb405b-live.jsonl"
    live.write_bytes(turn1)
    first = import_unit(db, unit("claude-code", live), target, now_ms=NOW)
    assert first.status == "new" and first.unpaired_tool_calls == 1
    before = target.transcript(first.session_id).read_bytes()
    before_rows = rows(db, "SELECT id, seq FROM messages WHERE session_id = ? ORDER BY seq", first.session_id)

    live.write_bytes(turn2)
    grown = import_unit(db, unit("claude-code", live), target, now_ms=NOW + 1)
    assert grown.status == "updated" and grown.session_id == first.session_id
    after = target.transcript(first.session_id).read_bytes()
    assert after.startswith(before)
    # the tool call whose result arrived in turn 2 is written again (replaced in place), the rest is new
    assert grown.replaced_records >= 1
    assert grown.new_records == 26 - 15
    assert after[len(before):].count(b"\n") == grown.new_records + grown.replaced_records
    after_rows = rows(db, "SELECT id, seq FROM messages WHERE session_id = ? ORDER BY seq", first.session_id)
    assert after_rows[: len(before_rows)] == before_rows  # earlier rows keep their positions
    assert all("result" in m["blocks"][0] for m in visible(target, first.session_id) if m["role"] == "tool")

    # the same content imported fresh gives the same visible records (ids, order, content)
    fresh = tmp_path / "fresh"
    (fresh / "sessions").mkdir(parents=True)
    fresh_target = ImportTarget(fresh / "sessions")
    conn2 = open_db(fresh / "pi.sqlite")
    try:
        import_unit(conn2, unit("claude-code", live), fresh_target, now_ms=NOW)
        assert visible(fresh_target, first.session_id) == visible(target, first.session_id)
    finally:
        conn2.close()


def test_a_pi_session_that_switched_branch_hides_what_left_the_branch(tmp_path: Path, db: sqlite3.Connection,
                                                                      target: ImportTarget) -> None:
    conv: list[gen.Event] = [gen.User("keep me"), gen.User("continue here")]
    lines = gen.pi_lines(conv, detour_after=1)
    # header, model_change, "keep me", "abandoned", "gone", "continue here"
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"".join(lines[:5]))  # pi's leaf is "gone": the detour is the current branch
    first = import_unit(db, unit("pi", path), target, now_ms=NOW)
    assert [m["blocks"][0]["text"] for m in visible(target, first.session_id)] == ["keep me", "abandoned", "gone"]
    # the user also continued the imported session in this host
    host_msg = {"type": "message", "id": "host-added-1", "role": "user", "createdAt": "2026-05-01T00:00:00.000Z",
                "blocks": [{"type": "text", "text": "asked in pi-host"}]}
    with TranscriptWriter.open(target.transcript(first.session_id)) as writer:
        off, end = writer.append([dumps_line(host_msg)])
    tx(db, lambda c: index.index_messages(c, first.session_id, [index.IndexRecord(host_msg, off, end - off)],
                                          indexed_len=end, file_epoch=index.require_session(
                                              c, first.session_id)["_fileEpoch"], now_ms=NOW))
    path.write_bytes(b"".join(lines))  # the user went back in /tree and continued from "keep me"
    grown = import_unit(db, unit("pi", path), target, now_ms=NOW + 1)
    assert grown.status == "updated" and grown.hidden_off_branch == 2 and grown.off_branch == 2
    assert [m["blocks"][0]["text"] for m in visible(target, first.session_id)] == [
        "keep me", "asked in pi-host", "continue here"]
    assert search_messages(db, "abandoned", session_id=first.session_id)["results"] == []
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ? AND deleted = 1", first.session_id) == [(2,)]


def test_a_torn_last_line_is_left_for_the_next_import(tmp_path: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    lines = [cc_line("u1", None, "user", "first prompt"), cc_line("a1", "u1", "assistant",
                                                                  [{"type": "text", "text": "first answer"}])]
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines[0] + lines[1][:-15])
    rep = import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    assert rep.status == "new" and dict(rep.messages) == {"user": 1}
    assert rep.files[0].torn_tail_bytes == len(lines[1]) - 15 and rep.files[0].consumed == len(lines[0])
    path.write_bytes(lines[0] + lines[1])
    again = import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    assert again.status == "updated" and again.new_records == 1
    assert [m["role"] for m in visible(target, rep.session_id)] == ["user", "assistant"]


def test_an_oversized_line_is_skipped_and_reported(tmp_path: Path, db: sqlite3.Connection) -> None:
    big = cc_line("a-big", "u1", "assistant", [{"type": "text", "text": "x" * 5000}])
    path = tmp_path / "s.jsonl"
    path.write_bytes(cc_line("u1", None, "user", "hello") + big + cc_line("u2", "a-big", "user", "after"))
    (tmp_path / "sessions").mkdir()
    small = ImportTarget(tmp_path / "sessions", limits=ImportLimits(max_line_bytes=1000))
    rep = import_unit(db, unit("claude-code", path), small, now_ms=NOW)
    assert rep.status == "new"
    assert rep.files[0].oversized_lines == 1 and rep.files[0].consumed == path.stat().st_size
    assert [m["blocks"][0]["text"] for m in visible(small, rep.session_id)] == ["hello", "after"]
    # the chain check saw no parent for u2 (the skipped line was never read)
    assert rep.files[0].dangling_parents == 1


@pytest.mark.parametrize(("source", "content", "reason"), [
    ("claude-code", b"not json at all\n" * 80, "NOT_A_SESSION_FILE"),
    ("claude-code", b'{"hello": "world"}\n' * 80, "NOT_A_SESSION_FILE"),
    ("codex", b'{"type": "something"}\n' * 80, "NOT_A_SESSION_FILE"),
    ("pi", b'{"type": "message"}\n', "NOT_A_SESSION_FILE"),
    ("pi", b'{"type": "session", "version": 4, "id": "x", "cwd": "/w"}\n', "UNSUPPORTED_VERSION"),
    ("pi", b'{"type": "session", "version": 3, "id": "x", "cwd": "/w"}\n', "EMPTY_SESSION"),
    ("claude-code", b"", "EMPTY_SESSION"),
    ("pi-host", b'{"type": "message", "id": "m1", "role": "user", "blocks": []}\n', "NOT_A_SESSION_FILE"),
])
def test_a_file_that_is_not_the_format_is_refused_and_leaves_nothing(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget, source: str, content: bytes,
        reason: str) -> None:
    path = tmp_path / "input.jsonl"
    path.write_bytes(content)
    (rep,) = import_root(db, source, path, target, now_ms=lambda: NOW).sessions
    assert (rep.status, rep.reason) == ("refused", reason)
    assert list(target.sessions_dir.iterdir()) == []
    assert rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM session_import_origins") == [(0,)]


def _failing_index(db: sqlite3.Connection) -> None:
    db.execute("CREATE TEMP TRIGGER fail_import BEFORE INSERT ON session_import_origins "
               "BEGIN SELECT RAISE(ABORT, 'disk I/O error (injected)'); END")


def test_an_index_failure_after_a_new_transcript_removes_it(tmp_path: Path, db: sqlite3.Connection,
                                                            target: ImportTarget) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.claude_code_lines([gen.User("hello"), gen.Response((("text", "hi"),), ())])))
    _failing_index(db)
    with pytest.raises(sqlite3.IntegrityError):
        import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    assert list(target.sessions_dir.iterdir()) == []
    assert rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    db.execute("DROP TRIGGER fail_import")
    assert import_unit(db, unit("claude-code", path), target, now_ms=NOW).status == "new"


def test_the_index_is_read_back_in_batches_bounded_in_bytes(tmp_path: Path, db: sqlite3.Connection,
                                                            target: ImportTarget,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The index step reads the written transcript back in batches: a batch is bounded in bytes too, so
    large messages are never all held at once (before, only 512 records bounded a batch, whatever size)."""
    from store.interchange import import_write

    big = "x" * 200_000
    conv: list[Any] = []
    for i in range(8):
        conv += [gen.User(f"question {i} {big}"), gen.Response((("text", f"answer {i} {big}"),), ())]
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.claude_code_lines(conv)))
    batches: list[int] = []
    real = import_write.index.index_messages

    def counting(conn: sqlite3.Connection, sid: str, msgs: Any, **kw: Any) -> Any:
        batches.append(sum(m.length for m in msgs))
        return real(conn, sid, msgs, **kw)

    monkeypatch.setattr(import_write.index, "index_messages", counting)
    report = import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    assert report.status == "new"
    assert len(batches) >= 3 and max(batches) < import_write._WRITE_BUFFER + 300_000
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ?", report.session_id) == [(16,)]
    assert search_messages(db, "answer 7")  # every batch was indexed


def test_an_index_failure_after_an_append_truncates_it_back(tmp_path: Path, db: sqlite3.Connection,
                                                            target: ImportTarget) -> None:
    conv = [gen.User("one"), gen.Response((("text", "two"),), ()), gen.User("three")]
    lines = gen.claude_code_lines(conv)
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(lines[:2]))
    first = import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    before = target.transcript(first.session_id).read_bytes()
    index_before = rows(db, "SELECT id, seq, line_offset FROM messages ORDER BY seq")
    path.write_bytes(b"".join(lines))
    _failing_index(db)
    with pytest.raises(sqlite3.IntegrityError):
        import_unit(db, unit("claude-code", path), target, now_ms=NOW + 1)
    assert target.transcript(first.session_id).read_bytes() == before
    assert rows(db, "SELECT id, seq, line_offset FROM messages ORDER BY seq") == index_before
    assert sorted(p.name for p in target.sessions_dir.iterdir()) == [f"{first.session_id}.jsonl"]


def test_a_crash_between_transcript_and_index_is_repaired_and_keeps_the_source(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.pi_lines([gen.User("hello pi"), gen.Response((("text", "hi"),), ())])))
    u = unit("pi", path)
    staged = stage(u, target, spans=None, created_ms=lambda: NOW)
    publish(staged)  # ... and the process dies before the index transaction
    sid = u.session_id
    plan = reconcile.plan_reconcile(target.transcript(sid), 0, None)
    report = tx(db, lambda c: reconcile.apply_plan(c, sid, plan, now_ms=NOW))
    assert report["restoredRow"] is True
    assert rows(db, "SELECT source, title, last_seq FROM sessions WHERE id = ?", sid) == [("pi", "hello pi", 2)]
    # the next import finds the transcript already complete: nothing is written twice
    before = target.transcript(sid).read_bytes()
    again = import_unit(db, u, target, now_ms=NOW)
    assert again.status == "unchanged" and target.transcript(sid).read_bytes() == before
    assert rows(db, "SELECT COUNT(*) FROM session_import_origins WHERE session_id = ?", sid) == [(1,)]


def test_a_refused_stage_leaves_only_a_temp_file_that_boot_sweeps(tmp_path: Path, target: ImportTarget) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.claude_code_lines([gen.User("a"), gen.Response((("text", "b"),), ())])))
    staged = stage(unit("claude-code", path), target, spans=None, created_ms=lambda: NOW)
    assert staged.temp is not None and staged.temp.exists()  # staged, never published (a crash here)
    assert [p.name for p in target.sessions_dir.iterdir()] == [staged.temp.name]
    assert sweep_temp_files(target.sessions_dir) == [str(staged.temp)]
    assert list(target.sessions_dir.iterdir()) == []


def test_an_unchanged_source_is_not_even_parsed(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.codex_lines([gen.User("q"), gen.Response((("text", "a"),), ())])))
    assert import_unit(db, unit("codex", path), target, now_ms=NOW).status == "new"

    def no_parse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an unchanged source must not be parsed")

    monkeypatch.setattr(imports, "stage", no_parse)
    assert import_unit(db, unit("codex", path), target, now_ms=NOW).status == "unchanged"


def test_a_session_id_held_by_a_host_session_is_refused(tmp_path: Path, db: sqlite3.Connection,
                                                        target: ImportTarget) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(gen.pi_lines([gen.User("x")])))
    u = unit("pi", path)
    db.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?, 'mine', 1, 1)", (u.session_id,))
    rep = import_unit(db, u, target, now_ms=NOW)
    assert (rep.status, rep.reason) == ("refused", "CONFLICT")
    assert list(target.sessions_dir.iterdir()) == []


def test_dry_run_writes_nothing_and_says_what_would_happen(tmp_path: Path, db: sqlite3.Connection,
                                                           target: ImportTarget) -> None:
    lines = gen.claude_code_lines([gen.User("a"), gen.Response((("text", "b"),), ()), gen.User("c")])
    path = tmp_path / "s.jsonl"
    path.write_bytes(lines[0])
    rep = import_unit(db, unit("claude-code", path), target, now_ms=NOW, dry_run=True)
    assert rep.status == "would-new" and dict(rep.messages) == {"user": 1}
    assert list(target.sessions_dir.iterdir()) == [] and rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    import_unit(db, unit("claude-code", path), target, now_ms=NOW)
    before = target.transcript(rep.session_id).read_bytes()
    path.write_bytes(b"".join(lines))
    dry = import_unit(db, unit("claude-code", path), target, now_ms=NOW, dry_run=True)
    assert dry.status == "would-updated" and dry.new_records == 2
    assert target.transcript(rep.session_id).read_bytes() == before
    assert sorted(p.name for p in target.sessions_dir.iterdir()) == [f"{rep.session_id}.jsonl"]


def test_ids_projects_and_times(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_bytes(b"".join(gen.pi_lines([gen.User("in a")], session="session-a")))
    b.write_bytes(b"".join(gen.pi_lines([gen.User("in b"), gen.Response((("text", "ok"),), ())],
                                        session="session-b")).replace(b'"/gen/project"', b'"/gen/project/"'))
    ra = import_unit(db, unit("pi", a), target, now_ms=NOW)
    rb = import_unit(db, unit("pi", b), target, now_ms=NOW)
    assert ra.session_id == session_id_for("pi", "session-a") != rb.session_id == session_id_for("pi", "session-b")
    assert session_id_for("pi", "session-a") != session_id_for("codex", "session-a")
    # "/gen/project" and "/gen/project/" are one project; a re-import makes no other
    assert rows(db, "SELECT path FROM projects") == [("/gen/project",)]
    assert rows(db, "SELECT COUNT(DISTINCT project_id) FROM sessions") == [(1,)]
    import_unit(db, unit("pi", b), target, now_ms=NOW + 5)
    assert rows(db, "SELECT COUNT(*) FROM projects") == [(1,)] and rows(db, "SELECT COUNT(*) FROM sessions") == [(2,)]
    # created/updated are the conversation's times, not the import's
    created, updated = rows(db, "SELECT created_at, updated_at FROM sessions WHERE id = ?", rb.session_id)[0]
    last = max(r[0] for r in rows(db, "SELECT created_at FROM messages WHERE session_id = ?", rb.session_id))
    assert created == gen.BASE_MS and updated == last < NOW


def test_an_imported_relative_or_blank_cwd_is_data_and_still_imports(tmp_path: Path, db: sqlite3.Connection,
                                                                     target: ImportTarget) -> None:
    """The wire refuses a blank or relative ``projectPath`` (protocol ProjectRoot); another agent's file
    may record any cwd: that is history, imported as the file holds it (a relative cwd is its project key,
    a blank one binds no project)."""
    rel, blank = tmp_path / "rel.jsonl", tmp_path / "blank.jsonl"
    rel.write_bytes(b"".join(gen.pi_lines([gen.User("rel")], session="session-r")).replace(
        b'"/gen/project"', b'"gen/project"'))
    blank.write_bytes(b"".join(gen.pi_lines([gen.User("blank")], session="session-b")).replace(
        b'"/gen/project"', b'""'))
    r, b = import_unit(db, unit("pi", rel), target, now_ms=NOW), import_unit(db, unit("pi", blank), target, now_ms=NOW)
    assert r.status == b.status == "new"
    assert rows(db, "SELECT s.id, p.path FROM sessions s LEFT JOIN projects p ON p.id = s.project_id "
                    "ORDER BY s.id") == sorted([(r.session_id, "gen/project"), (b.session_id, None)])


def test_a_claude_code_projects_tree_merges_subagent_files_into_their_session(
        tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    samples = samples_dir() / "claude-code"
    projects = tmp_path / "projects"
    project = projects / "-home-user-app"
    sub = project / "ae4a77f8-aedd-4bc1-888f-c94edc91af04" / "subagents"
    sub.mkdir(parents=True)
    shutil.copy(samples / "spotter_v2.1.38_tool_heavy_queue_ops.jsonl", project / "d6e0bada-main.jsonl")
    shutil.copy(samples / "spotter_v2.1.39_subagent_file_websearch.jsonl", sub / "agent-aac57f5.jsonl")
    shutil.copy(samples / "spotter_v2.1.38_short_hooks_local_command.jsonl",
                project / "ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl")
    seen: list[tuple[int, str]] = []
    summary = import_root(db, "claude-code", projects, target, now_ms=lambda: NOW,
                          progress=lambda n, rep: seen.append((n, rep.status)))
    assert summary.counts() == {"new": 2}
    assert seen == [(1, "new"), (2, "new")]
    merged = next(r for r in summary.sessions if r.external_id == "ae4a77f8-aedd-4bc1-888f-c94edc91af04")
    assert [Path(f.path).name for f in merged.files] == ["ae4a77f8-aedd-4bc1-888f-c94edc91af04.jsonl",
                                                         "agent-aac57f5.jsonl"]
    assert merged.attributed == 16 and sum(merged.messages.values()) == 7 + 16
    # imported sessions are searchable at once
    hit = search_messages(db, "phx.server")["results"]
    assert merged.session_id in {h["sessionId"] for h in hit}
    again = import_root(db, "claude-code", projects, target, now_ms=lambda: NOW)
    assert again.counts() == {"unchanged": 2}


def test_a_grown_import_counts_every_line_it_appends(tmp_path: Path, db: sqlite3.Connection,
                                                      target: ImportTarget) -> None:
    """A record written twice by one import (Claude Code wrote a tool call's line twice: the call goes
    out without its result, then again with it) appended two lines but counted one: the report's
    ``newRecords + replacedRecords`` fell short of the lines the transcript grew by."""
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code"
    (path,) = recorded.rglob("f4c39419-*.jsonl")
    lines = path.read_bytes().splitlines(keepends=True)
    (call,) = [i for i, line in enumerate(lines) if b'"tool_use","id":"toolu_fake0002"' in line]
    lines.insert(call + 1, lines[call])  # the same line again, as a crash-and-resume may leave it
    src = tmp_path / path.name
    src.write_bytes(b"".join(lines[:call - 2]))
    first = import_unit(db, unit("claude-code", src), target, now_ms=NOW)
    before = target.transcript(first.session_id).read_bytes()
    src.write_bytes(b"".join(lines))
    grown = import_unit(db, unit("claude-code", src), target, now_ms=NOW + 1000)
    after = target.transcript(first.session_id).read_bytes()
    assert grown.status == "updated" and after.startswith(before)
    appended = after[len(before):].count(b"\n")
    assert appended == grown.new_records + grown.replaced_records + grown.hidden_off_branch, grown.to_dict()
