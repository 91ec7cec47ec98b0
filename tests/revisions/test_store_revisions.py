"""Unit tests for store/revisions.py, store/transcripts/rewrite.py and store/compaction.py (pure, no trio)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import orjson
import pytest

from store.compaction import normalize_compaction, normalize_on_read, split_valid
from store.errors import InvalidInput
from store.faults import Faults, InjectedFault
from store.indexing.reconcile import dedupe, scan_from
from store.jsonio import dumps_line, loads_line
from store.revisions import (
    SYNC_MARK_NS,
    ArchivedDeletion,
    SyncMark,
    append_revision_lines,
    archived_deletion_lines,
    drop_sync_mark,
    entry_of_line,
    find_root,
    live_stamps,
    parse_revisions,
    payload_digest,
    read_revisions,
    read_sync_mark,
    resolve,
    respell,
    revision_line,
    revision_live_line,
    revisions_fingerprint,
    rows_from_file,
    transcript_tail,
    with_stamp,
    write_sync_mark,
)
from store.transcripts.rewrite import apply_rewrite, load_live, plan_rewrite
from store.transcripts.transcript import create_transcript


def m(mid: str, role: str = "user", **extra: object) -> dict:
    return {"type": "message", "id": mid, "role": role, "createdAt": "2026-01-01T00:00:00.000Z",
            "blocks": [{"type": "text", "text": f"text {mid}"}], **extra}


# ---------------------------------------------------------------- revisions file


def test_legacy_file_reads_back_message_for_message(tmp_path):
    legacy = [
        {"rootUserId": "u1", "revisionIndex": 1, "createdAt": "2025-01-01T00:00:00Z", "type": "revision",
         "messages": [m("u1"), m("a1", "assistant", meta={"usage": {"in": 3}})]},
        {"type": "revision", "rootUserId": "u1", "revisionIndex": 2, "createdAt": "2025-01-02T00:00:00Z",
         "messages": [m("u1"), m("a1b", "assistant")], "turns": {"a1b": "t2"}},
    ]
    path = tmp_path / "s.revisions.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in legacy))
    rf = read_revisions(path)
    assert [e.revision_index for e in rf.family("u1")] == [1, 2]
    for rec, entry in zip(legacy, rf.family("u1"), strict=True):
        assert list(entry.messages) == rec["messages"] and not entry.live
    assert rf.get("u1", 2).turns == {"a1b": "t2"}


def test_last_record_wins_and_reference_resolves_to_live_suffix():
    data = b"".join([
        revision_line("u1", 1, [m("u1"), m("a1", "assistant")], {}, created_at_ms=1000),
        revision_live_line("u1", 2, created_at_ms=2000),
        b'{"type":"future_kind","x":1}\n',
        revision_line("u1", 1, [m("u1"), m("a1", "assistant"), m("u9")], {"a1": "t1"}, created_at_ms=3000),
        b'{"type":"revision","rootUserId":"u1","revisio',  # torn tail
    ])
    rf = parse_revisions(data)
    assert rf.torn_tail and rf.unknown_lines == 1
    assert [x["id"] for x in rf.get("u1", 1).messages] == ["u1", "a1", "u9"]
    assert rf.first_seen_ms[("u1", 1)] == 1000
    root = m("u1", meta={"revisionCount": 2, "activeRevision": 2, "revisionRootId": "u1"})
    live = [m("u0"), m("a0", "assistant"), root, m("a1c", "assistant")]
    branch = resolve(rf.get("u1", 2), live, {"a1c": "t3", "a0": "t0"})
    assert branch is not None and [x["id"] for x in branch.messages] == ["u1", "a1c"]
    assert branch.turns == {"a1c": "t3"}
    assert rows_from_file(rf, live) == [("u1", 1, 3, 1000), ("u1", 2, 2, 2000)]
    assert resolve(rf.get("u1", 2), [m("u0")], {}) is None


def test_a_reference_resolves_only_while_the_live_root_is_stamped_with_its_variant():
    """A ``revision_live`` line names its branch by key alone: the live suffix is that branch only while the
    root's ``activeRevision`` is its index. A stale one (a file restored from a backup, the root since stamped
    with another variant, or not stamped) resolves to nothing and a rebuilt row counts no messages."""
    rf = parse_revisions(revision_live_line("u1", 2, created_at_ms=2000))
    for meta in ({"revisionCount": 3, "activeRevision": 3, "revisionRootId": "u1"}, {}):
        live = [m("u1", meta=meta), m("a1c", "assistant")]
        assert resolve(rf.get("u1", 2), live, {}) is None
        assert rows_from_file(rf, live) == [("u1", 2, 0, 2000)]


def test_reference_line_is_constant_size():
    sizes = {len(revision_live_line("0b0e1234-aaaa-bbbb-cccc-0123456789ab", i, created_at_ms=1_700_000_000_000 + i))
             for i in range(1, 10)}
    assert len(sizes) == 1 and sizes.pop() < 160


def test_append_repairs_torn_tail_and_rolls_back(tmp_path):
    path = tmp_path / "s.revisions.jsonl"
    first = revision_live_line("u1", 1, created_at_ms=1)
    append_revision_lines(path, [first])
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    with open(path, "ab") as fh:
        fh.write(b'{"type":"revision_live","root')  # a crash mid-append
    second = revision_live_line("u1", 2, created_at_ms=2)
    n = append_revision_lines(path, [second])
    assert path.read_bytes() == first + second and n == len(first + second)
    faults = Faults()
    faults.add("revisions.after_write", action="eio")
    with pytest.raises(Exception) as err:
        append_revision_lines(path, [revision_live_line("u1", 3, created_at_ms=3)], faults=faults)
    assert getattr(err.value, "code", None) == "IO_ERROR"
    assert path.read_bytes() == first + second


def test_families_and_stamps():
    live = [m("u1"), m("a1", "assistant"), m("u2x", meta={"revisionRootId": "u2", "activeRevision": 3}),
            m("a2", "assistant")]
    assert find_root(live, "u2") == 2 and find_root(live, "u1") == 0 and find_root(live, "zz") is None
    assert live_stamps(live) == {"u1": None, "u2": 3}
    stamped = with_stamp(live[0], count=2, active=2, root="u1")
    assert stamped["meta"] == {"revisionCount": 2, "activeRevision": 2, "revisionRootId": "u1"}
    assert stamped["blocks"] == live[0]["blocks"] and "meta" not in live[0]


# ---------------------------------------------------------------- rewrite planning


def test_plan_keeps_valid_compactions_after_their_boundary_in_order(tmp_path):
    msgs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant")]
    comps = [
        {"type": "compaction", "id": "c1", "throughMessageId": "a2", "summary": "s"},
        {"type": "compaction", "id": "c2", "throughMessageId": "a1", "summary": "s"},
        {"type": "compaction", "id": "gone", "throughMessageId": "a9", "summary": "s"},
    ]
    tomb = {"a1": {"type": "tombstone", "id": "t1", "messageId": "a1", "deleted": True}}
    info = {"type": "session_info", "title": "T"}
    plan = plan_rewrite(msgs, comps, tombstones=tomb, session_info=info)
    assert plan.dropped_compactions == ["gone"] and plan.deleted_ids == ["a1"]
    kinds = [orjson.loads(line)["type"] + ":" + str(orjson.loads(line).get("id")) for line in plan.body]
    assert kinds == ["message:u1", "message:a1", "tombstone:t1", "message:u2", "message:a2",
                     "compaction:c1", "compaction:c2", "session_info:None"]
    path = tmp_path / "s.jsonl"
    create_transcript(path, "s", 1000)
    out = apply_rewrite(path, "s", 1000, plan)
    data = path.read_bytes()
    assert out.file_len == len(data)
    for item in out.messages + out.compactions:
        assert orjson.loads(data[item.offset:item.offset + item.length]) == item.record
    scan = scan_from(path, 0)
    assert [x.record["id"] for x in dedupe(scan.messages)] == ["u1", "a1", "u2", "a2"]
    live = load_live(path)
    assert live.ids == ["u1", "a1", "u2", "a2"] and live.session_info["title"] == "T"
    assert live.epoch == out.epoch and live.created_at_ms == 1000
    with pytest.raises(ValueError):
        plan_rewrite([m("u1"), m("u1")])


def test_plan_writes_unknown_kinds_again_after_the_message_they_followed(tmp_path):
    """Lines of kinds this version does not know (seed 003 §9) ride through a rewrite byte for byte while the
    message they followed survives; the offsets of the others are left out for the caller to keep aside."""
    path = tmp_path / "s.jsonl"
    create_transcript(path, "s", 1000)
    first = b'{"type":"future","id":"f0","n":1.0}\n'
    later = b'{"type":"future","id":"f1","n":123456789012345678901234567890}\n'
    gone = b'{"type":"future","id":"f2"}\n'
    with path.open("ab") as f:
        f.write(first + dumps_line(m("u1")) + dumps_line(m("a1", "assistant")) + later
                + dumps_line(m("u2")) + gone + b'{"no_type":1}\n' + b'{"type":"session","id":"x"}\n')
    live = load_live(path)
    assert [(anchor, line) for anchor, _, line in live.unknown] == [(None, first), ("a1", later), ("u2", gone)]
    assert len(live.dropped_offsets) == 2  # no kind at all, a second header: damaged, kept aside as before
    plan = plan_rewrite([m("a1", "assistant"), m("u1")], opaque=live.unknown)
    assert plan.body[0] == first and plan.body[2] == later
    assert plan.left_out == [live.unknown[2][1]]
    out = apply_rewrite(path, "s", 1000, plan)
    data = path.read_bytes()
    for item in out.messages:
        assert orjson.loads(data[item.offset:item.offset + item.length]) == item.record
    assert load_live(path).ids == ["a1", "u1"] and first in data and later in data and gone not in data


def test_rewrite_crash_before_rename_leaves_old_file(tmp_path):
    path = tmp_path / "s.jsonl"
    create_transcript(path, "s", 1000)
    before = path.read_bytes()
    faults = Faults()
    faults.add("rewrite.after_tmp_fsync", action="raise")
    with pytest.raises(InjectedFault):
        apply_rewrite(path, "s", 1000, plan_rewrite([m("u1")]), faults=faults)
    assert path.read_bytes() == before


def test_a_payload_digest_names_what_a_line_stores_not_when():
    """Two lines of one variant written at different times store the same payload; a different deleted set,
    checkpoint or message is another payload (``runtime/handlers/revisions.archive`` writes only those)."""
    msgs = [m("u1"), m("a1", "assistant")]

    def digest(at: int, **extra: object) -> str:
        entry = entry_of_line(revision_line("u1", 1, msgs, {"a1": "t1"}, created_at_ms=at, extra=extra or None))
        assert entry is not None
        return payload_digest(entry)

    assert digest(1) == digest(2)
    assert len({digest(1), digest(1, deleted=["a1"]), digest(1, compactions=[{"type": "compaction", "id": "c"}])}) == 3
    stored = parse_revisions(revision_line("u1", 1, msgs, {}, created_at_ms=5)
                             + revision_live_line("u2", 1, created_at_ms=5)).stored_digests()
    assert list(stored) == [("u1", 1)]
    assert entry_of_line(b"not json\n") is None


# ---------------------------------------------------------------- compaction records


def test_normalize_compaction_rules():
    rec = normalize_compaction({"id": "c1", "summary": "s", "throughMessageId": "a1", "tokensBefore": 5,
                                "retainedTail": [m("u0"), m("u1"), m("a1", "assistant")]}, now_ms=0)
    assert list(rec)[:2] == ["type", "id"] and rec["type"] == "compaction"
    assert [x["id"] for x in rec["retainedTail"]] == ["u1"]
    assert rec["details"]["retainedTailMode"] == "active_turn"
    empty = normalize_compaction({"id": "c", "summary": "s", "throughMessageId": "a", "tokensBefore": 0}, now_ms=0)
    assert empty["retainedTail"] == [] and empty["details"]["retainedTailMode"] == "completed_turn"
    long = normalize_compaction({"id": "c", "summary": "s", "throughMessageId": "a", "tokensBefore": 0,
                                 "retainedTail": [{"id": "u", "role": "user",
                                                   "blocks": [{"type": "text", "text": "x" * 70_000}]}],
                                 "details": {"retainedTailMode": "active_turn"}}, now_ms=0)
    tail = long["retainedTail"][0]
    assert len(tail["blocks"][0]["text"]) == 64_000 and tail["blocks"][0]["truncated"] is True
    assert tail["meta"]["retainedTruncated"] is True
    reasoning_in = [{"role": "assistant", "blocks": [
        {"type": "thinking", "text": "t"}, {"type": "tool_call", "callId": "x"}, {"type": "text", "text": "y"}]}]
    reasoning = normalize_compaction({"id": "c", "summary": "s", "throughMessageId": "a", "tokensBefore": 0,
                                      "details": {"retainedReasoning": reasoning_in + [
                                          {"text": str(i)} for i in range(30)]}},
                                     now_ms=0)
    rr = reasoning["details"]["retainedReasoning"]
    assert len(rr) == 16 and rr[-1] == {"text": "29"}
    fb = normalize_compaction({"id": "c", "summary": "short", "throughMessageId": "a", "tokensBefore": 0,
                               "details": {"fallback": "retained_tail"}}, now_ms=0)
    assert fb["details"]["fallback"] == "retained_tail"
    for bad in ({"fallback": "retained_tail", "_summary": "x" * 5000}, {"retainedTailMode": "x"},
                {"fallback": "summary"}):
        summary = bad.pop("_summary", "s")
        with pytest.raises(InvalidInput):
            normalize_compaction({"id": "c", "summary": summary, "throughMessageId": "a", "tokensBefore": 0,
                                  "details": bad}, now_ms=0)
    with pytest.raises(InvalidInput):
        normalize_compaction({"id": "c", "summary": "s", "throughMessageId": "a", "tokensBefore": -1}, now_ms=0)
    dumps_line(rec)


def test_legacy_records_normalized_on_read_and_validity_per_record():
    legacy = {"type": "compaction", "id": "c", "throughMessageId": "a1",
              "retainedTail": [m("u1"), m("a1", "assistant")]}
    assert [x["id"] for x in normalize_on_read(legacy)["retainedTail"]] == ["u1"]
    modern = {**legacy, "retainedTail": [m("u1")], "details": {"retainedTailMode": "active_turn"}}
    assert normalize_on_read(modern) == modern
    kept, dropped = split_valid([legacy, {**legacy, "id": "d", "throughMessageId": "zz"}], ["u1", "a1"])
    assert [x["id"] for x in kept] == ["c"] and [x["id"] for x in dropped] == ["d"]


def test_archived_deletion_lines_refresh_only_full_branches_holding_the_message(tmp_path):
    path = tmp_path / "s.revisions.jsonl"
    a = [{"id": "u1", "role": "user"}, {"id": "a1", "role": "assistant"}]
    b = [{"id": "u1", "role": "user"}, {"id": "a2", "role": "assistant"}]
    whole = (revision_line("u1", 1, a, {"a1": "t1"}, created_at_ms=1_000, extra={"importedFrom": "x"})
             + revision_line("u1", 2, b, {}, created_at_ms=2_000)
             + revision_live_line("u1", 3, created_at_ms=3_000))
    path.write_bytes(whole + b'{"type":"revision","rootUs')  # a torn tail is skipped
    got = archived_deletion_lines(path, ["a1"], True, created_at_ms=9_000)
    assert got.found and len(got.lines) == 1 and got.carried is None
    rec = loads_line(got.lines[0])
    assert rec["deleted"] == ["a1"] and rec["importedFrom"] == "x" and rec["turns"] == {"a1": "t1"}
    assert rec["messages"] == a and (rec["rootUserId"], rec["revisionIndex"]) == ("u1", 1)
    assert "receipts" not in rec
    # the root user message is on both full branches; restoring what is not deleted writes nothing
    both = archived_deletion_lines(path, ["u1"], True, created_at_ms=9_000)
    assert both.found and sorted(loads_line(x)["revisionIndex"] for x in both.lines) == [1, 2]
    assert archived_deletion_lines(path, ["a2"], False, created_at_ms=9_000) == ArchivedDeletion(True, [])
    assert archived_deletion_lines(path, ["zz"], True, created_at_ms=9_000) == ArchivedDeletion(False, [])
    assert not archived_deletion_lines(tmp_path / "missing", ["a1"], True, created_at_ms=9_000).found
    # the receipt rides on the refreshed line; the reader takes that line; a later refresh keeps it
    receipt = {"clientId": "c", "submissionId": "s1", "fingerprint": "f", "method": "session.deleteMessage",
               "extra": {"messageId": "a1"}}
    keyed = archived_deletion_lines(path, ["a1"], True, created_at_ms=9_000, receipt=receipt)
    assert loads_line(keyed.lines[0])["receipts"] == [receipt]
    path.write_bytes(whole + keyed.lines[0])
    entry = read_revisions(path).get("u1", 1)
    assert entry is not None and entry.deleted == frozenset({"a1"}) and entry.messages == tuple(a)
    again = archived_deletion_lines(path, ["a1"], True, created_at_ms=9_100, receipt=receipt)
    assert again == ArchivedDeletion(True, [], receipt)  # its own effect: nothing to write
    restored = archived_deletion_lines(path, ["a1"], False, created_at_ms=9_500)
    out = loads_line(restored.lines[0])
    assert "deleted" not in out and out["receipts"] == [receipt]


# ---------------------------------------------------------------- respell (ids another session took)


def test_respell_spells_taken_ids_and_every_reference_to_them() -> None:
    """A restored branch's ids another session took become ``{sessionId}:{id}``, and so do its turns map, its
    deleted ids and its checkpoints' anchors and tail copies; other ids, the family key and the inputs stay."""
    msgs = [m("u1", meta={"revisionRootId": "u1"}), m("a1", "assistant"), m("u2"), m("a2", "assistant")]
    cp = {"type": "compaction", "id": "c1", "throughMessageId": "a1", "firstKeptMessageId": "u1",
          "retainedTail": [m("a1", "assistant")]}
    got = respell("S", {"a1", "u1"}, msgs, {"a1": "t1", "a2": "t2"}, [cp], {"a1", "a2"})
    assert [x["id"] for x in got.messages] == ["S:u1", "S:a1", "u2", "a2"]
    assert got.messages[0]["meta"] == {"revisionRootId": "u1"}  # the family key, as the file keys it
    assert got.turns == {"S:a1": "t1", "a2": "t2"}
    assert got.deleted == {"S:a1", "a2"}
    assert got.compactions[0]["throughMessageId"] == "S:a1" and got.compactions[0]["firstKeptMessageId"] == "S:u1"
    assert [x["id"] for x in got.compactions[0]["retainedTail"]] == ["S:a1"]
    assert msgs[1]["id"] == "a1" and cp["throughMessageId"] == "a1"  # the inputs are not changed
    assert respell("S", set(), msgs, {}, [cp], set()).messages == msgs


def test_a_revision_line_keeps_the_root_each_message_stood_under() -> None:
    """``revisions.ROOTS``: one entry where the root changes; read back per message; a line without it (an
    older one) has none and digests as it did; an entry naming no message of the branch is skipped."""
    from store.revisions import ROOTS, entry_of_line, payload_digest, revision_line, roots_field
    from store.transcripts.records import Root

    msgs = [{"type": "message", "id": i, "role": r, "blocks": []} for i, r in
            (("u1", "user"), ("w1", "tool"), ("a1", "assistant"), ("w2", "tool"))]
    roots: dict[str, Root | None] = {"u1": Root("/a"), "w1": Root("/a"), "a1": Root("/b/"), "w2": Root(None)}
    line = revision_line("u1", 1, msgs, {}, created_at_ms=0, roots=roots)
    rec = loads_line(line[:-1])
    assert rec[ROOTS] == [["u1", "/a"], ["a1", "/b/"], ["w2", None]]
    entry = entry_of_line(line[:-1])
    assert entry is not None
    assert dict(entry.roots) == {"u1": Root("/a"), "w1": Root("/a"), "a1": Root("/b"), "w2": Root(None)}
    older = entry_of_line(revision_line("u1", 1, msgs, {}, created_at_ms=0)[:-1])
    assert older is not None and not older.roots and payload_digest(older) != payload_digest(entry)
    assert roots_field(msgs[2:], entry.roots) == [["a1", "/b"], ["w2", None]]  # a branch cut: its own first
    rec[ROOTS] = [["gone", "/c"], ["w1", "/d"]]
    moved = entry_of_line(dumps_line(rec)[:-1])
    assert moved is not None and dict(moved.roots) == {"w1": Root("/d"), "a1": Root("/d"), "w2": Root("/d")}


def test_a_sync_mark_reads_back_and_a_damaged_one_reads_as_none(tmp_path: Path) -> None:
    """Issue 26: the mark of what a session's branch rows were synced against is a ``kv`` row; a value this
    build cannot read (not JSON, a field of the wrong type) is no mark (the next sync reads in full), never an
    error; the revisions file's fingerprint changes with any byte and reads a prefix."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE kv (ns TEXT NOT NULL, key TEXT NOT NULL, value_json TEXT NOT NULL, "
                 "updated_at INTEGER NOT NULL, PRIMARY KEY (ns, key)) WITHOUT ROWID")
    mark = SyncMark("e1", 120, "ab", "10:cd", {"u1": ["e1", "e0"]})
    write_sync_mark(conn, "s1", mark, 1)
    assert read_sync_mark(conn, "s1") == SyncMark("e1", 120, "ab", "10:cd", {"u1": ["e0", "e1"]})
    assert read_sync_mark(conn, "s2") is None
    for damaged in ("not json", "[]", '{"epoch":1,"upto":1,"tail":"","revisions":"","aliases":{}}',
                    '{"epoch":null,"upto":-1,"tail":"","revisions":"","aliases":{}}',
                    '{"epoch":null,"upto":true,"tail":"","revisions":"","aliases":{}}',
                    '{"epoch":null,"upto":1,"tail":"","revisions":"","aliases":{"u1":[1]}}'):
        conn.execute("UPDATE kv SET value_json = ? WHERE ns = ? AND key = ?", (damaged, SYNC_MARK_NS, "s1"))
        assert read_sync_mark(conn, "s1") is None, damaged
    drop_sync_mark(conn, "s1")
    assert conn.execute("SELECT COUNT(*) FROM kv").fetchone()[0] == 0

    path = tmp_path / "s.revisions.jsonl"
    assert revisions_fingerprint(path) == "0:" and revisions_fingerprint(path, 5) == ""
    path.write_bytes(b'{"a":1}\n')
    whole = revisions_fingerprint(path)
    path.write_bytes(b'{"a":1}\n{"b":2}\n')
    assert revisions_fingerprint(path, 8) == whole != revisions_fingerprint(path)
    path.write_bytes(b'{"a":2}\n{"b":2}\n')
    assert revisions_fingerprint(path, 8) != whole
    assert transcript_tail(path, 8) != transcript_tail(path, 16) and transcript_tail(path, 17) == ""
