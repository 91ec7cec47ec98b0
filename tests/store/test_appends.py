"""The pure append planner (``store/indexing/appends.py``), row by row of its table, and its gather step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from store import receipts
from store.errors import IdempotencyConflict
from store.indexing import index
from store.indexing.appends import (
    AppendRequest,
    Held,
    Known,
    Refuse,
    Replay,
    Write,
    content_of,
    gather,
    plan_appends,
)
from store.indexing.database import open_reader, open_writer
from store.jsonio import dumps_line, loads_line
from store.receipts import ReceiptKey
from store.transcripts import records
from store.transcripts.records import awaits_final, receipt_of
from store.transcripts.transcript import TranscriptWriter, create_transcript

SID = "s1"
NOW = 1_700_000_000_000
KEY = ReceiptKey("client", "sub-1", "session.appendMessage", "fp")


def message(mid: str, text: str = "x", role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"id": mid, "role": role, "blocks": [{"type": "text", "text": text}], **extra}


def streaming(mid: str) -> dict[str, Any]:
    return message(mid, "partial", "assistant", meta={"status": "streaming"})


def ref(mid: str, seq: int, sid: str = SID) -> dict[str, Any]:
    return {"id": mid, "sessionId": sid, "seq": seq, "turnId": None, "role": "assistant", "createdAt": 1}


def plan(*requests: AppendRequest, known: Known | None = None, last_seq: int = 4) -> list[Any]:
    return plan_appends(SID, requests, known or Known(), last_seq=last_seq, now_ms=NOW).outcomes


# ---------------------------------------------------------------------- the table, row by row


def test_a_new_id_is_written_with_the_next_seq() -> None:
    [out] = plan(AppendRequest(message("m1")))
    assert isinstance(out, Write) and out.seq == 5 and not out.replace and out.remapped_from is None
    assert out.response() == {"message": out.ref, "replayed": False}
    assert out.ref["id"] == "m1" and out.ref["seq"] == 5 and out.ref["sessionId"] == SID
    assert loads_line(out.line) == out.record and out.line.endswith(b"\n")


def test_a_created_at_the_plan_fills_is_not_parsed_back_for_its_ref(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's createdAt comes from ``now_ms`` when the client sent none: the ref takes ``now_ms`` as it
    is instead of parsing the string just made (one RFC 3339 parse per append); a createdAt the client
    sent is parsed. Either way the ref's time is the line's, as the index parses it."""
    parsed: list[object] = []

    def counting(value: object, default: int) -> int:
        parsed.append(value)
        return records.rfc3339_to_ms(value, default)

    monkeypatch.setattr(index, "rfc3339_to_ms", counting)
    [filled] = plan(AppendRequest(message("m1")))
    [sent] = plan(AppendRequest(message("m2", createdAt="2024-02-29T23:59:59.999Z")))
    assert isinstance(filled, Write) and isinstance(sent, Write)
    assert parsed == ["2024-02-29T23:59:59.999Z"]
    assert filled.ref["createdAt"] == NOW == records.rfc3339_ms(filled.record["createdAt"])
    assert sent.ref["createdAt"] == records.rfc3339_ms("2024-02-29T23:59:59.999Z")


@pytest.mark.parametrize("ms", [0, 1, 999, 1_000, NOW, NOW + 1, NOW + 999, 1_765_000_000_123, 4_102_444_799_999,
                                253_402_300_799_999])
def test_a_filled_created_at_parses_back_to_the_ms_it_was_made_from(ms: int) -> None:
    """What the ref's shortcut relies on: the index parses the filled string to the same ms."""
    assert records.rfc3339_ms(records.ms_to_rfc3339(ms)) == ms


def test_a_stored_receipt_is_replayed_and_writes_nothing() -> None:
    stored = {"message": ref("m1", 2), "replayed": False}
    result = plan_appends(SID, [AppendRequest(message("m1"), receipt=KEY)], Known(receipts=[stored]),
                          last_seq=4, now_ms=NOW)
    assert result.outcomes == [Replay(stored)] and result.lines == [] and result.last_seq == 4


def test_a_receipt_of_another_request_is_refused() -> None:
    conflict = IdempotencyConflict("other request")
    [out] = plan(AppendRequest(message("m1"), receipt=KEY), known=Known(receipts=[conflict]))
    assert isinstance(out, Refuse) and out.error is conflict


@pytest.mark.parametrize("bad", [
    {"id": "m1", "role": "robot", "blocks": []},
    {"id": "bad id", "role": "user", "blocks": []},
    {"id": "m1", "role": "user", "blocks": [{"text": "no type"}]},
    {"id": "m1", "role": "user", "blocks": [], "meta": {"n": float("nan")}},
])
def test_a_message_that_does_not_normalize_or_encode_is_refused_alone(bad: dict[str, Any]) -> None:
    out = plan(AppendRequest(bad), AppendRequest(message("m2")))
    assert isinstance(out[0], Refuse) and out[0].error.code in ("INVALID_PARAMS", "INVALID_ID")
    assert isinstance(out[1], Write) and out[1].seq == 5  # the refused one took no seq


def test_an_id_another_session_holds_is_remapped_d444() -> None:
    known = Known(held={"m1": Held("other", ref("m1", 9, "other"))})
    [out] = plan(AppendRequest(message("m1"), receipt=KEY), known=known)
    assert isinstance(out, Write) and out.record["id"] == f"{SID}:m1" and out.remapped_from == "m1"
    assert out.response()["remappedFrom"] == "m1" and out.ref["id"] == f"{SID}:m1"
    carried = receipt_of(out.record)
    assert carried == receipts.file_record(KEY, seq=out.seq, remappedFrom="m1")  # the seq it answered, too


def test_a_replay_of_the_remapped_id_is_a_no_op_against_the_remapped_row() -> None:
    known = Known(held={"m1": Held("other", ref("m1", 9, "other")), f"{SID}:m1": Held(SID, ref(f"{SID}:m1", 3))})
    [out] = plan(AppendRequest(message("m1")), known=known)
    assert out == Replay({"message": ref(f"{SID}:m1", 3), "replayed": True})


def test_an_id_this_session_holds_is_replayed() -> None:
    [out] = plan(AppendRequest(message("m1")), known=Known(held={"m1": Held(SID, ref("m1", 2))}))
    assert out == Replay({"message": ref("m1", 2), "replayed": True})


def test_a_terminal_assistant_replaces_a_streaming_reservation_in_place() -> None:
    known = Known(held={"a1": Held(SID, ref("a1", 2), streaming=True)})
    [out] = plan(AppendRequest(message("a1", "final", "assistant")), known=known)
    assert isinstance(out, Write) and out.replace and out.seq == 2
    assert out.ref["seq"] == 2


def test_a_late_partial_never_overwrites_a_reservation() -> None:
    known = Known(held={"a1": Held(SID, ref("a1", 2), streaming=True)})
    [out] = plan(AppendRequest(streaming("a1")), known=known)
    assert out == Replay({"message": ref("a1", 2), "replayed": True})


@pytest.mark.parametrize("role", ["user", "tool", "system"])
def test_another_role_under_a_reservations_id_is_an_idempotency_conflict(role: str) -> None:
    """A user's prompt (or a tool's output) sent under the id of a streaming reply was answered
    ``replayed: true`` and never written: acknowledged and lost. It is other content under a stored id
    (protocol README §4); within a group too."""
    known = Known(held={"a1": Held(SID, ref("a1", 2), streaming=True)})
    [out] = plan(AppendRequest(message("a1", "user text", role)), known=known)
    assert isinstance(out, Refuse) and isinstance(out.error, IdempotencyConflict)
    first, second = plan(AppendRequest(streaming("a1")), AppendRequest(message("a1", "user text", role)))
    assert isinstance(first, Write) and isinstance(second, Refuse)


def test_the_same_id_twice_in_a_group_is_written_once() -> None:
    first, second = plan(AppendRequest(message("m1")), AppendRequest(message("m1")))
    assert isinstance(first, Write) and second == Replay({"message": first.ref, "replayed": True})


def test_the_same_id_with_other_content_is_an_idempotency_conflict() -> None:
    """Issue 25 ("Wire and docs"): the same message id with different content answered ``replayed: true``.
    Within a group, and against a held row whose stored content is known: IDEMPOTENCY_CONFLICT."""
    first, second = plan(AppendRequest(message("m1")), AppendRequest(message("m1", "again")))
    assert isinstance(first, Write) and isinstance(second, Refuse)
    assert isinstance(second.error, IdempotencyConflict) and second.error.data["messageId"] == "m1"
    held = Held(SID, ref("m1", 2), content=("user", [{"type": "text", "text": "x"}]))
    same, other_text, other_role = plan(AppendRequest(message("m1")), AppendRequest(message("m1", "y")),
                                        AppendRequest(message("m1", role="assistant")),
                                        known=Known(held={"m1": held}))
    assert same == Replay({"message": ref("m1", 2), "replayed": True})
    assert isinstance(other_text, Refuse) and isinstance(other_role, Refuse)
    [unknown] = plan(AppendRequest(message("m1", "y")), known=Known(held={"m1": Held(SID, ref("m1", 2))}))
    assert isinstance(unknown, Replay)  # stored content not known (an unreadable line): replayed as before


def test_the_final_of_a_reply_promoted_from_its_checkpoint_replaces_it() -> None:
    """A power cut promoted a streaming reply from its in-flight checkpoint (``meta.recoveredFrom``);
    the sidecar's final append carries more text under the same id. Never IDEMPOTENCY_CONFLICT (the
    powercut chaos run flagged "IDEMPOTENCY_CONFLICT on identical retries"), and never dropped as a
    replay: the promoted row awaits its final (``awaits_final``, as :func:`gather` reads it) and the
    final replaces it in place."""
    promoted = message("a1", "what had streamed", "assistant")
    promoted["meta"] = {"status": "aborted", "interrupted": True, "recoveredFrom": "inflight"}
    held = Held(SID, ref("a1", 2), awaits_final(promoted), content_of(promoted))
    [out] = plan(AppendRequest(message("a1", "what had streamed and the rest", "assistant")),
                 known=Known(held={"a1": held}))
    assert isinstance(out, Write) and out.replace and out.seq == 2


def test_streaming_then_terminal_in_one_group_replaces_within_the_group() -> None:
    first, second = plan(AppendRequest(streaming("a1")), AppendRequest(message("a1", "final", "assistant")))
    assert isinstance(first, Write) and isinstance(second, Write)
    assert second.replace and second.seq == first.seq == 5
    result = plan_appends(SID, [AppendRequest(streaming("a1")), AppendRequest(message("a1", "final", "assistant"))],
                          Known(), last_seq=4, now_ms=NOW)
    assert result.last_seq == 5 and len(result.lines) == 2


def test_terminal_then_streaming_in_one_group_keeps_the_settled_one() -> None:
    first, second = plan(AppendRequest(message("a1", "final", "assistant")), AppendRequest(streaming("a1")))
    assert isinstance(first, Write) and second == Replay({"message": first.ref, "replayed": True})


def test_turn_ids_are_indexed_only_for_turns_that_exist() -> None:
    known = Known(turns=frozenset({"t1"}))
    a, b = plan(AppendRequest(message("m1"), turn_id="t1"), AppendRequest(message("m2"), turn_id="t9"), known=known)
    assert isinstance(a, Write) and isinstance(b, Write)
    assert a.ref["turnId"] == "t1" and b.ref["turnId"] is None
    assert a.record["turnId"] == "t1" and b.record["turnId"] == "t9"  # the line keeps what the client said


def test_seqs_are_dense_and_last_seq_counts_only_new_ids() -> None:
    known = Known(held={"old": Held(SID, ref("old", 1))})
    result = plan_appends(SID, [AppendRequest(message("m1")), AppendRequest(message("old")),
                                AppendRequest(message("m2"))], known, last_seq=4, now_ms=NOW)
    assert [o.seq for o in result.writes] == [5, 6] and result.last_seq == 6


# ---------------------------------------------------------------------- gather (one snapshot)


def test_gather_reads_receipts_held_ids_streaming_state_and_turns(tmp_path: Path) -> None:
    conn, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    conn.execute("BEGIN")
    index.insert_session(conn, SID, now_ms=NOW)
    index.insert_session(conn, "other", now_ms=NOW)
    conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('t1', ?, 'running', 1)", (SID,))
    conn.execute("INSERT INTO turns(id, session_id, status, started_at) VALUES ('t9', 'other', 'running', 1)")
    with TranscriptWriter.open(path) as writer:
        lines = [dumps_line({"type": "message", **streaming("a1")})]
        first, new_len = writer.append(lines)
    index.index_messages(conn, SID, [index.IndexRecord({"type": "message", **streaming("a1")}, first, len(lines[0]))],
                         indexed_len=new_len, file_epoch=None, now_ms=NOW)
    index.index_messages(conn, "other", [index.IndexRecord({"type": "message", **message("m1")}, 0, 10)],
                         indexed_len=10, file_epoch=None, now_ms=NOW)
    receipts.store(conn, KEY, {"stored": True}, session_id=SID, now_ms=NOW)
    conn.execute("COMMIT")
    requests = [
        AppendRequest(message("a1", "final", "assistant")),
        AppendRequest(message("m1"), turn_id="t1", receipt=KEY),
        AppendRequest(message("m2"), receipt=ReceiptKey("client", "sub-1", "session.appendMessage", "other")),
        AppendRequest(message("m3"), turn_id="t9"),
    ]
    known = gather(conn, path, SID, requests)
    assert known.receipts[0] is None and known.receipts[1] == {"stored": True}
    assert isinstance(known.receipts[2], IdempotencyConflict)
    assert known.held["a1"].session_id == SID and known.held["a1"].streaming is True
    assert known.held["m1"].session_id == "other"
    assert known.turns == frozenset({"t1"})  # not t9: another session's turn binds no row of this one
    conn.close()


def test_gather_reads_one_snapshot_when_a_commit_lands_between_its_reads(tmp_path: Path) -> None:
    """A receipt, an id and a turn: three statements, one read transaction. A commit by another
    connection after the first statement (the DB writer indexing another session's line with the
    same id) is not seen by the later ones: what gather returns is one state of the index."""
    writer, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    writer.execute("BEGIN")
    index.insert_session(writer, SID, now_ms=NOW)
    index.insert_session(writer, "other", now_ms=NOW)
    writer.execute("COMMIT")
    reader = open_reader(tmp_path / "pi.sqlite")
    selects: list[str] = []

    def commit_after_first_read(sql: str) -> None:  # runs as a statement starts: the second one
        if sql.lstrip().upper().startswith("SELECT"):
            selects.append(sql)
        if len(selects) == 2 and sql is selects[-1]:
            writer.execute("BEGIN")
            index.index_messages(writer, "other", [index.IndexRecord({"type": "message", **message("m1")}, 0, 10)],
                                 indexed_len=10, file_epoch=None, now_ms=NOW)
            writer.execute("COMMIT")

    reader.set_trace_callback(commit_after_first_read)
    known = gather(reader, path, SID, [AppendRequest(message("m1"), turn_id="t1", receipt=KEY)])
    reader.set_trace_callback(None)
    assert len(selects) >= 2, "the commit ran between two reads"
    assert "m1" not in known.held  # the snapshot began before the commit
    assert not reader.in_transaction
    assert gather(reader, path, SID, [AppendRequest(message("m1"), turn_id="t1", receipt=KEY)]).held[
        "m1"].session_id == "other"  # the next gather sees it
    reader.close()
    writer.close()
