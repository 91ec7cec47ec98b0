"""The checker itself: a checker that cannot fail proves nothing.

Synthetic histories against synthetic observations; every kind of violation
the chaos runs look for must be reported under its own name.
"""

from __future__ import annotations

from typing import Any

from scripts.chaos_checker import ABSENT, Observation, ObservedMessage, ObservedSession, check
from scripts.chaos_corrupt import damaged_tables, excused
from scripts.chaos_history import History, outcomes
from scripts.chaos_run import Totals

SID = "s1"


def _append(h: History, mid: str, text: str, outcome: str, seq: int | None = None, replayed: bool = False) -> None:
    op = h.invoke("w0", "append", mid, {"sid": SID, "role": "user", "text": text})
    result: Any = {"message": {"id": mid, "seq": seq}, "replayed": replayed} if outcome == "ok" else {"code": "X"}
    h.complete(op, outcome, result)  # type: ignore[arg-type]


def _session(ids: list[str], texts: dict[str, str] | None = None, **kw: Any) -> ObservedSession:
    texts = texts or {}
    msgs = [ObservedMessage(mid, "user", texts.get(mid, f"text {mid}"), i + 1) for i, mid in enumerate(ids)]
    file_ids = kw.pop("file_ids", [m for m in dict.fromkeys(ids)])
    index_rows = kw.pop("index_rows", [(mid, i + 1) for i, mid in enumerate(file_ids)])
    return ObservedSession(messages=msgs, file_ids=file_ids, index_rows=index_rows, title=kw.pop("title", None),
                           queue_keys=kw.pop("queue_keys", []))


def _history_three() -> History:
    h = History()
    _append(h, "m1", "text m1", "ok", seq=1)
    _append(h, "m2", "text m2", "ok", seq=2)
    _append(h, "m3", "text m3", "ok", seq=3)
    return h


def test_a_clean_history_is_valid() -> None:
    report = check(_history_three(), Observation({SID: _session(["m1", "m2", "m3"])}))
    assert report.valid, report
    assert report.acknowledged == 3 and report.attempted == 3


def test_lost_and_duplicated_writes_are_reported() -> None:
    h = _history_three()
    # m2 acknowledged but gone; m3 shows up twice
    obs = Observation({SID: _session(["m1", "m3", "m3"], file_ids=["m1", "m3"])})
    report = check(h, obs)
    assert not report.valid
    assert report.lost == {f"message:{SID}/m2"}
    assert report.duplicated == {f"message:{SID}/m3"}


def test_indeterminate_attempts_may_be_absent_or_recovered_once() -> None:
    h = _history_three()
    _append(h, "m4", "text m4", "info")
    _append(h, "m5", "text m5", "info")
    report = check(h, Observation({SID: _session(["m1", "m2", "m3", "m4"])}))
    assert report.valid, report
    assert report.recovered == {f"message:{SID}/m4"}
    twice = check(h, Observation({SID: _session(["m1", "m2", "m3", "m4", "m4"], file_ids=["m1", "m2", "m3", "m4"])}))
    assert twice.duplicated == {f"message:{SID}/m4"}


def test_a_retry_acknowledges_the_same_key_once() -> None:
    h = _history_three()
    _append(h, "m4", "text m4", "info")
    _append(h, "m4", "text m4", "ok", seq=4)  # the retry with the same submissionId
    found = outcomes(h.ops)[("append", "m4")]
    assert found.status == "acked" and found.attempts == 2
    assert check(h, Observation({SID: _session(["m1", "m2", "m3", "m4"])})).valid
    assert check(h, Observation({SID: _session(["m1", "m2", "m3"])})).lost == {f"message:{SID}/m4"}


def test_unexpected_messages_wrong_positions_and_changed_text() -> None:
    h = _history_three()
    report = check(h, Observation({SID: _session(["m1", "m2", "m3", "ghost"])}))
    assert report.unexpected == {f"message:{SID}/ghost"}
    moved = check(h, Observation({SID: _session(["m2", "m1", "m3"])}))
    assert any("acknowledged at seq 1 but found at position 1" in p for p in moved.problems)
    changed = check(h, Observation({SID: _session(["m1", "m2", "m3"], texts={"m2": "something else"})}))
    assert changed.lost == {f"message:{SID}/m2 (content)"}


def test_index_must_equal_transcript() -> None:
    h = _history_three()
    missing_row = check(h, Observation({SID: _session(["m1", "m2", "m3"], index_rows=[("m1", 1), ("m3", 2)])}))
    assert any("index ids != transcript ids" in p for p in missing_row.problems)
    bad_seq = check(h, Observation({SID: _session(["m1", "m2", "m3"], index_rows=[("m1", 1), ("m2", 2), ("m3", 5)])}))
    assert any("seq != position+1" in p for p in bad_seq.problems)
    corrupt = check(h, Observation({SID: _session(["m1", "m2", "m3"])}, integrity="*** page 3 is never used"))
    assert any("integrity_check" in p for p in corrupt.problems)


def test_search_must_find_every_message_once() -> None:
    h = History()
    op = h.invoke("w0", "append", "m1", {"sid": SID, "role": "user", "text": "hi zq0123456789ab"})
    h.complete(op, "ok", {"message": {"id": "m1", "seq": 1}, "replayed": False})
    sess = _session(["m1"], texts={"m1": "hi zq0123456789ab"})
    assert check(h, Observation({SID: sess}, search={"zq0123456789ab": [(SID, "m1")]})).valid
    missed = check(h, Observation({SID: sess}, search={"zq0123456789ab": []}))
    assert any("search for zq0123456789ab" in p for p in missed.problems)


def _turn(h: History, tid: str, *, start: str = "ok", end: str | None = None, status: str = "completed") -> None:
    op = h.invoke("w0", "start_turn", tid, {"sid": SID})
    h.complete(op, start, {"id": tid, "status": "running"})  # type: ignore[arg-type]
    if end is not None:
        op = h.invoke("w0", "end_turn", tid, {"sid": SID, "status": status, "notify": True})
        result = {"turn": {"id": tid, "status": status}, "notification": {"turnId": tid}}
        h.complete(op, end, result if end == "ok" else None)  # type: ignore[arg-type]


def test_running_turns_must_be_aborted_after_a_restart() -> None:
    h = History()
    _turn(h, "t1", end="ok")
    _turn(h, "t2")  # running when the host died
    _turn(h, "t3", end="info")  # its end may or may not have landed
    good = Observation({SID: _session([])}, turns={"t1": (SID, "completed"), "t2": (SID, "aborted"),
                                                  "t3": (SID, "completed")},
                       notifications={"t1": 1, "t3": 1}, after_restart=True)
    assert check(h, good).valid
    still = Observation({SID: _session([])}, turns={"t1": (SID, "completed"), "t2": (SID, "running"),
                                                   "t3": (SID, "aborted")},
                        notifications={"t1": 1}, after_restart=True)
    assert any("t2" in p for p in check(h, still).problems)
    lost_end = Observation({SID: _session([])}, turns={"t1": (SID, "aborted"), "t2": (SID, "aborted")},
                           notifications={"t1": 1}, after_restart=True)
    assert any(name.startswith("turn:s1/t1") for name in check(h, lost_end).lost)
    lost_turn = Observation({SID: _session([])}, turns={"t1": (SID, "completed")}, notifications={"t1": 1},
                            after_restart=True)
    assert f"turn:{SID}/t2" in check(h, lost_turn).lost


def test_notifications_lost_or_duplicated() -> None:
    h = History()
    _turn(h, "t1", end="ok")
    report = check(h, Observation({SID: _session([])}, turns={"t1": (SID, "completed")}, notifications={}))
    assert report.lost == {"notification:t1"}
    report = check(h, Observation({SID: _session([])}, turns={"t1": (SID, "completed")}, notifications={"t1": 2}))
    assert report.duplicated == {"notification:t1"}


def _checkpoint(h: History, mid: str, n: int, text: str, outcome: str) -> None:
    op = h.invoke("w0", "checkpoint", f"{mid}#{n}", {"sid": SID, "mid": mid, "turnId": "t1", "text": text, "n": n})
    h.complete(op, outcome, {"saved": True} if outcome == "ok" else None)  # type: ignore[arg-type]


def test_leftover_checkpoint_promoted_once_with_no_acked_text_lost() -> None:
    h = History()
    _turn(h, "t1")
    _checkpoint(h, "a1", 0, "reply", "ok")
    _checkpoint(h, "a1", 1, "reply w1", "ok")
    _checkpoint(h, "a1", 2, "reply w1 w2", "info")
    base = {"turns": {"t1": (SID, "aborted")}, "after_restart": True, "leftover_checkpoints": {"a1": SID}}
    assert check(h, Observation({SID: _session(["a1"], texts={"a1": "reply w1 w2"})}, **base)).valid
    assert check(h, Observation({SID: _session(["a1"], texts={"a1": "reply w1"})}, **base)).valid
    stale = check(h, Observation({SID: _session(["a1"], texts={"a1": "reply"})}, **base))
    assert any("none of the" in p for p in stale.problems)  # an acknowledged checkpoint's text was lost
    assert check(h, Observation({SID: _session([])}, **base)).lost == {f"message:{SID}/a1"}
    double = check(h, Observation({SID: _session(["a1", "a1"], file_ids=["a1"], texts={"a1": "reply w1"})}, **base))
    assert double.duplicated == {f"message:{SID}/a1"}
    left = check(h, Observation({SID: _session(["a1"], texts={"a1": "reply w1"})}, inflight_left=[SID], **base))
    assert any("left after boot" in p for p in left.problems)


def test_queue_entries_lost_duplicated_or_resurrected() -> None:
    h = History()
    for key, outcome in (("q1", "ok"), ("q2", "ok"), ("q3", "info")):
        op = h.invoke("w0", "queue_push", key, {"sid": SID, "content": key})
        h.complete(op, outcome, {"entry": {"id": key}} if outcome == "ok" else None)  # type: ignore[arg-type]
    op = h.invoke("w0", "queue_remove", "q2", {"sid": SID, "entryId": "q2"})
    h.complete(op, "ok", {})
    assert check(h, Observation({SID: _session([], queue_keys=["q1", "q3"])})).valid
    report = check(h, Observation({SID: _session([], queue_keys=["q3", "q3", "q2"])}))
    assert report.lost == {f"queue:{SID}/q1"}
    assert report.duplicated == {f"queue:{SID}/q3"}
    assert any("q2" in name for name in report.unexpected)


def test_an_acknowledged_queue_entry_is_lost_when_its_removal_failed_definitely() -> None:
    # the removal answered NOT_FOUND: it removed nothing, so the entry went missing before it (not excused)
    h = History()
    op = h.invoke("w0", "queue_push", "q1", {"sid": SID, "content": "q1"})
    h.complete(op, "ok", {"entry": {"id": "q1"}})
    op = h.invoke("w0", "queue_remove", "q1", {"sid": SID, "entryId": "q1"})
    h.complete(op, "fail", {"code": "NOT_FOUND"})
    assert check(h, Observation({SID: _session([], queue_keys=["q1"])})).valid
    report = check(h, Observation({SID: _session([])}))
    assert report.lost == {f"queue:{SID}/q1"}
    assert report.anchors[f"queue:{SID}/q1"] == 1  # anchored to the push's acknowledgement
    # an indeterminate removal may have taken it: absent is allowed then
    op = h.invoke("w0", "queue_remove", "q1", {"sid": SID, "entryId": "q1"})
    h.complete(op, "info", {"error": "ClientClosed"})
    assert check(h, Observation({SID: _session([])})).valid


def test_registers_keep_the_last_acknowledged_write() -> None:
    h = History()
    for n, outcome in ((1, "ok"), (2, "ok"), (3, "info")):
        op = h.invoke("w0", "settings_set", f"k#{n}", {"setting": "k", "value": {"n": n}})
        h.complete(op, outcome, {} if outcome == "ok" else None)  # type: ignore[arg-type]
    for value in ({"n": 2}, {"n": 3}):
        assert check(h, Observation({}, settings={"k": value})).valid
    assert check(h, Observation({}, settings={"k": {"n": 1}})).lost
    assert check(h, Observation({}, settings={"k": ABSENT})).lost


def _op(h: History, f: str, key: str, value: dict[str, Any], outcome: str = "ok", result: Any = None) -> None:
    op = h.invoke("w0", f, key, value)
    h.complete(op, outcome, result if outcome == "ok" else {"code": "X"})  # type: ignore[arg-type]


def _delivery(source: str, target: str, key: str, status: str, **kw: Any) -> dict[str, Any]:
    return {"source": source, "target": target, "kind": kw.pop("kind", "task"), "key": key, "status": status,
            "turnId": kw.pop("turnId", None), "replyTo": kw.pop("replyTo", None), "notify": kw.pop("notify", True)}


def test_collaboration_deliveries_lost_duplicated_or_called_back_twice() -> None:
    h = History()
    _op(h, "collab_deliver", "k1", {"src": "a", "tgt": SID, "notify": True})
    _op(h, "collab_deliver", "k2", {"src": "a", "tgt": SID, "notify": True})
    _op(h, "collab_deliver", "k3", {"src": "a", "tgt": SID, "notify": False}, "fail")
    _op(h, "collab_begin", "d1@t0", {"sid": SID, "did": "d1", "turnId": "t0"}, "info")  # lost with the host
    _op(h, "collab_begin", "d1@t1", {"sid": SID, "did": "d1", "turnId": "t1"})  # begun again, by t1
    _op(h, "collab_settle", "d1@t1", {"sid": SID, "did": "d1", "turnId": "t1", "kind": "task", "notify": True,
                                      "src": "a"})
    sessions = {SID: _session([], index_rows=[("collab-d1", 1)], file_ids=["collab-d1"]), "a": _session([])}
    sessions[SID].messages = [ObservedMessage("collab-d1", "user", "task", 1)]
    clean = Observation(sessions, deliveries={
        "d1": _delivery("a", SID, "k1", "completed", turnId="t1"),
        "c1": _delivery(SID, "a", "completion:d1", "queued", kind="completion", replyTo="d1", notify=False),
        "d2": _delivery("a", SID, "k2", "queued"),
    }, admissions={"d2": 1, "c1": 1})
    assert check(h, clean).valid, check(h, clean)
    broken = Observation(sessions, deliveries={
        "d1": _delivery("a", SID, "k1", "completed", turnId="t1"),
        "c1": _delivery(SID, "a", "completion:d1", "queued", kind="completion", replyTo="d1"),
        "c2": _delivery(SID, "a", "completion:d1x", "queued", kind="completion", replyTo="d1"),
        "d3": _delivery("a", SID, "k3", "queued"),
        "d9": _delivery("a", SID, "k9", "queued"),
    }, admissions={"d3": 2})
    report = check(h, broken)
    assert "delivery:a/k2" in report.lost  # acknowledged, gone
    assert "delivery:d1: 2 completion callbacks" in report.duplicated
    assert "delivery:d3: 2 queue admissions" in report.duplicated
    assert {"delivery:a/k3 (its send failed definitely)", "delivery:a/k9 (never sent)"} <= report.unexpected
    after = Observation(sessions, after_restart=True, deliveries={
        "d1": _delivery("a", SID, "k1", "running", turnId="t1"),
        "d2": _delivery("a", SID, "k2", "queued"),
    })
    problems = check(h, after).problems
    assert any("running after a restart" in p for p in problems)
    assert any("queued without an admission after a restart" in p for p in problems)
    assert "delivery:d1 settlement (status running)" in check(h, after).lost


def test_approvals_lost_unexpected_or_disagreeing_with_the_transcript() -> None:
    h = History()
    _op(h, "approval_request", "c1", {"sid": SID, "turnId": "t1"}, result={"request": {"requestId": "r1"}})
    _op(h, "approval_respond", "c1", {"sid": SID, "option": "deny", "requestId": "r1"})
    _op(h, "approval_request", "c2", {"sid": SID, "turnId": "t1"})
    sessions = {SID: _session([])}
    ok = Observation(sessions, approvals={"c1": {"sid": SID, "requestId": "r1", "status": "denied"},
                                          "c2": {"sid": SID, "requestId": "r2", "status": "pending"}},
                     decisions={"r1": "denied"})
    assert check(h, ok).valid
    bad = Observation(sessions, after_restart=True,
                      approvals={"c1": {"sid": SID, "requestId": "r1", "status": "allowed"},
                                 "c2": {"sid": SID, "requestId": "r2", "status": "pending"},
                                 "c3": {"sid": SID, "requestId": "r3", "status": "denied"}},
                      decisions={"r1": "denied"})
    report = check(h, bad)
    assert f"approval:{SID}/c1: answer (status allowed, answered denied)" in report.lost
    assert f"approval:{SID}/c3 (never asked)" in report.unexpected
    assert any("pending after a restart" in p for p in report.problems)
    assert any("the transcript's decision says denied" in p for p in report.problems)
    assert f"approval:{SID}/c2" not in report.lost
    gone = Observation(sessions, approvals={})
    assert {f"approval:{SID}/c1", f"approval:{SID}/c2"} <= check(h, gone).lost


def test_a_request_id_the_host_never_issued_is_damage_not_a_lost_decision() -> None:
    """Corrupt mode's seed 1164112365 met this: a random byte changed ``apr_…`` into ``a#r_…`` inside a row
    of the approvals table; the page stayed well formed, so the salvage copied it. No write produces such a
    value, so it is reported as damaged (excused only where the run damages the index itself)."""
    h = History()
    _op(h, "approval_request", "c1", {"sid": SID, "turnId": "t1"}, result={"request": {"requestId": "apr_1"}})
    _op(h, "approval_respond", "c1", {"sid": SID, "option": "deny", "requestId": "apr_1"})
    obs = Observation({SID: _session([])}, after_restart=True,
                      approvals={"c1": {"sid": SID, "requestId": "a#r_1", "status": "denied"}},
                      decisions={"apr_1": "denied"})
    report = check(h, obs)
    assert report.damaged == {f"approval:{SID}/c1: request id 'a#r_1', issued 'apr_1'"}
    assert not report.problems and not report.lost and not report.valid
    corrupt, other = Totals(corrupt=True), Totals()
    corrupt.add(report)
    other.add(report)
    assert corrupt.valid and corrupt.damaged_lost == report.damaged
    assert not other.valid and set(other.problems) == report.damaged


def test_a_completion_whose_delivery_is_gone_is_a_lost_delivery_excused_by_damage_to_its_table() -> None:
    """Corrupt mode reported "a completion of an unknown delivery" as a problem: a damaged page of the ledger
    took the settled delivery (the salvage skipped it and said so) and kept its completion. The delivery's
    loss was excused by the damage; the completion's finding was not, although it says the same. It is now
    that delivery's loss, excused like any other where the ledger was damaged, counted as lost otherwise."""
    h = History()
    obs = Observation({SID: _session([]), "a": _session([])}, deliveries={
        "c1": _delivery(SID, "a", "completion:d1", "queued", kind="completion", replyTo="d1", notify=False),
    }, admissions={"c1": 1})
    report = check(h, obs)
    assert report.lost == {"delivery:d1 (completion c1 answers it)"} and not report.problems, report
    corrupt = Totals(corrupt=True)
    corrupt.salvages.salvaged(len(h.ops), {"session_collaboration_messages"})
    corrupt.add(report)
    assert corrupt.valid and corrupt.damaged_lost == report.lost
    other = Totals()
    other.add(report)
    assert not other.valid and other.lost == report.lost


def _push(h: History, key: str) -> None:
    _op(h, "queue_push", key, {"sid": SID, "content": key}, result={"entry": {"id": key}})


def test_a_salvage_excuses_only_what_was_acknowledged_before_it_ran() -> None:
    """Corrupt mode excused a lost DB-only row whenever any salvage so far had skipped rows of its table (or
    had failed to open the quarantined file: every DB-only table), for the rest of the run: after 2 of 6 runs'
    failed salvages every later DB-only loss was damage. A salvage now excuses only what was acknowledged
    before it ran; a row acknowledged after the last salvage and missing is lost."""
    h = History()
    _push(h, "q1")
    totals = Totals(corrupt=True)
    totals.salvages.salvaged(len(h.ops), damaged_tables({"salvage": {"failed": True}}), "boot-2")
    _push(h, "q2")  # acknowledged after the salvage
    op = h.invoke("w0", "settings_set", "k#1", {"setting": "k", "value": 1})
    h.complete(op, "ok", {})
    report = check(h, Observation({SID: _session([])}, settings={"k": ABSENT}))
    assert report.lost == {f"queue:{SID}/q1", f"queue:{SID}/q2", "setting:k (observed absent, allowed 1 values "
                                                                     "from op 0)"}, report
    totals.add(report)
    assert totals.damaged_lost == {f"queue:{SID}/q1"}
    assert totals.lost == {f"queue:{SID}/q2", "setting:k (observed absent, allowed 1 values from op 0)"}
    assert not totals.valid
    # the same boot's report seen again later (a second look in the same check) is not a new salvage
    totals.salvages.salvaged(len(h.ops), damaged_tables({"salvage": {"failed": True}}), "boot-2")
    again = Totals(corrupt=True, salvages=totals.salvages)
    again.add(check(h, Observation({SID: _session([])}, settings={"k": 1})))
    assert again.lost == {f"queue:{SID}/q2"} and again.damaged_lost == {f"queue:{SID}/q1"}


def test_a_row_seen_present_after_a_salvage_is_not_excused_by_it_later() -> None:
    """An acknowledged row a check saw present after a salvage survived that salvage: if it goes missing
    later, only a later salvage explains it."""
    h = History()
    _push(h, "q1")
    totals = Totals(corrupt=True)
    totals.salvages.salvaged(len(h.ops), {"turn_queue"}, "boot-2")
    totals.add(check(h, Observation({SID: _session([], queue_keys=["q1"])})))
    assert totals.valid and not totals.damaged_lost
    _push(h, "q2")
    gone = check(h, Observation({SID: _session([], queue_keys=["q2"])}))
    assert gone.lost == {f"queue:{SID}/q1"}
    later = Totals(corrupt=True, salvages=totals.salvages)
    later.add(gone)
    assert later.lost == {f"queue:{SID}/q1"} and not later.damaged_lost
    totals.salvages.salvaged(len(h.ops), {"turn_queue"}, "boot-3")  # a second salvage, after the sighting
    excused_now = Totals(corrupt=True, salvages=totals.salvages)
    excused_now.add(gone)
    assert excused_now.damaged_lost == {f"queue:{SID}/q1"} and excused_now.valid
    other_table = Totals(corrupt=True)
    other_table.salvages.salvaged(len(h.ops), {"notifications"}, "boot-4")
    other_table.add(gone)
    assert other_table.lost == {f"queue:{SID}/q1"}


def test_a_receipt_replay_is_excused_only_by_a_salvage_after_its_acknowledgement() -> None:
    text = "receipt replay: session.queuePush k1: stored response changed: entry: 'a' -> 'b'"
    before = Totals(corrupt=True)
    before.salvages.salvaged(3, {"command_receipts"}, "boot-2")
    before.problem(text, anchor=5, at=9)
    assert set(before.problems) == {text} and not before.damaged_lost
    after = Totals(corrupt=True)
    after.salvages.salvaged(7, {"command_receipts"}, "boot-2")
    after.problem(text, anchor=5, at=9)
    assert after.damaged_lost == {"session.queuePush k1"} and not after.problems


def test_a_delivery_whose_turn_row_the_damage_took_is_excused_by_the_turns_table() -> None:
    """The salvage clears a delivery's turn binding when its turn row is gone (ON DELETE SET NULL)."""
    lost = "delivery:col_1 begin in s.w1 (turn None, status completed)"
    assert excused(lost, {"turns"})
    assert not excused(lost, {"notifications"})


async def test_a_replay_the_host_answers_only_with_stopping_is_counted_not_a_mismatch() -> None:
    """Found by corrupt mode: a receipt replay that met the host stopping (SHUTTING_DOWN, or CORRUPT_DATA
    ``index_corrupt``: the protocol says reconnect and retry with the same submissionId) was reported as a
    changed receipt. It is now counted as unanswered; any other error is still a mismatch."""
    import random

    from runtime.client import RpcError
    from scripts.chaos_workload import Pending, Worker, WorkloadConfig

    answers = iter([RpcError(-32004, "SHUTTING_DOWN", "stopping", {}),
                    RpcError(-32005, "CORRUPT_DATA", "corrupt", {"reason": "index_corrupt"}),
                    RpcError(-32005, "CORRUPT_DATA", "bad record", {})])

    class Client:
        async def call(self, method: str, params: dict[str, Any]) -> Any:
            raise next(answers)

    w = Worker("w", "s", random.Random(1), History(), WorkloadConfig())
    w.acked = [Pending("append", f"k{i}", {}, "session.appendMessage", {"n": i}) for i in range(3)]
    mismatches = await w.replay_receipts(Client(), 3)  # type: ignore[arg-type]
    assert w.replays_unanswered == 2
    assert len(mismatches) == 1 and mismatches[0].endswith("retry failed with CORRUPT_DATA"), mismatches


async def test_a_session_get_that_meets_a_damaged_record_is_damage_observed_from_the_transcript(
        tmp_path: Any) -> None:
    """Corrupt mode's seed 298758022 met this: a byte changed in place inside an approval's ``options_json``
    (``"allow",mremember"``), on a page that stays well formed. ``session.get`` shows that decision, so it
    answers CORRUPT_DATA for the record (the host keeps serving that index: RELIABILITY.md row 7), and the
    observer raised it: the run ended with a traceback and no verdict. The session is now observed in its
    transcript and reported as damaged (excused only where the run damages the index itself); a CORRUPT_DATA
    of the whole index (the host restarts) is still raised to the runner."""
    import random

    import pytest
    import trio

    from runtime.client import RpcError
    from scripts.chaos_observe import ObserveNotes, observe
    from scripts.chaos_workload import Worker, WorkloadConfig
    from tests.hostkit import client_for, inprocess_host, msg

    h = _history_three()
    damaged = RpcError(-32005, "CORRUPT_DATA", "approval apr_1's options_json is unreadable", {})
    whole = RpcError(-32005, "CORRUPT_DATA", "the index database is corrupt", {"reason": "index_corrupt"})

    class Damaged:
        def __init__(self, inner: Any, error: RpcError) -> None:
            self.inner, self.error = inner, error

        async def call(self, method: str, params: dict[str, Any]) -> Any:
            if method == "session.get" and params.get("sessionId") == SID:
                raise self.error
            return await self.inner.call(method, params)

    root = tmp_path / "data"
    worker = Worker("w0", SID, random.Random(1), h, WorkloadConfig())
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": SID, "title": "kept"})
            for mid in ("m1", "m2", "m3"):
                await c.call("session.appendMessage", {"sessionId": SID, "message": msg(mid, f"text {mid}")})
            obs = await observe(Damaged(c, damaged), [worker], root, after_restart=False,  # type: ignore[arg-type]
                                leftover={}, notes=ObserveNotes(), rng=random.Random(1))
            with pytest.raises(RpcError, match="index database is corrupt"):
                await observe(Damaged(c, whole), [worker], root, after_restart=False,  # type: ignore[arg-type]
                              leftover={}, notes=ObserveNotes(), rng=random.Random(1))
    seen = obs.sessions[SID]
    assert seen.unreadable == "approval apr_1's options_json is unreadable"
    assert [m.id for m in seen.messages] == ["m1", "m2", "m3"] and seen.title == "kept"
    report = check(h, obs)
    assert report.damaged == {f"session:{SID}: session.get answers CORRUPT_DATA ({seen.unreadable})"}
    assert not report.lost and not report.problems and not report.valid, report
    corrupt, other = Totals(corrupt=True), Totals()
    corrupt.add(report)
    other.add(report)
    assert corrupt.valid and corrupt.damaged_lost == report.damaged
    assert not other.valid and set(other.problems) == report.damaged
