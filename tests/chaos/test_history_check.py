"""The history checker of ``scripts/chaos --mode history`` (``scripts/chaos_history_check.py``) on
hand-made histories: each anomaly it exists for must be flagged, and clean histories (including
concurrent writers, indeterminate outcomes and definite failures) must pass."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from scripts.chaos_history import History, Op
from scripts.chaos_history_check import RECOVERY, Findings, check, main, parse_ops


class H:
    """A tiny history builder: ``w`` writes, ``r`` reads, ``rec`` recoveries, as invoke/complete pairs."""

    def __init__(self) -> None:
        self.h = History()
        self.n = 0

    def invoke(self, conn: str, f: str, key: str, writes: list[list[Any]] | None = None,
               reads: bool = False, pipelined: bool = False) -> Op:
        value: dict[str, Any] = {"conn": conn}
        if writes:
            value["writes"] = writes
        if reads:
            value["reads"] = [f]
        if pipelined:
            value["pipelined"] = True
        return self.h.invoke(conn.split(".")[0], f, key, value)

    def done(self, op: Op, type_: str = "ok", result: Any = None) -> None:
        self.h.complete(op, type_, result)  # type: ignore[arg-type]

    def w(self, conn: str, key: str, *writes: list[Any], outcome: str = "ok") -> None:
        self.done(self.invoke(conn, "write", key, list(writes)), outcome)

    def r(self, conn: str, obs: dict[str, Any]) -> None:
        self.n += 1
        self.done(self.invoke(conn, "read", f"{conn}/r{self.n}", reads=True), "ok", {"obs": obs})

    def rec(self, obs: dict[str, Any], index: dict[str, dict[str, list[str]]] | None = None) -> None:
        self.n += 1
        op = self.h.invoke("checker", RECOVERY, f"rec{self.n}", {"conn": f"checker.{self.n}"})
        self.h.complete(op, "ok", {"obs": obs, "index": index or {}})

    def check(self) -> Findings:
        return check(self.h.ops)


def _only(f: Findings, kind: str) -> None:
    counts = {"lost": len(f.lost), "duplicated": len(f.duplicated), "unexpected": len(f.unexpected),
              "stale_reads": len(f.stale_reads), "regressions": len(f.regressions),
              "index_mismatch": len(f.index_mismatch)}
    assert counts[kind] >= 1, (kind, f.details())
    assert all(v == 0 for k, v in counts.items() if k != kind), f.details()


# ------------------------------------------------------------------------------ must be flagged


def test_an_acknowledged_append_missing_at_recovery_is_lost() -> None:
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    h.w("a.1", "m2", ["add", "msgs:s", "m2"])
    h.rec({"msgs:s": ["m1"]})
    f = h.check()
    _only(f, "lost")
    assert "msgs:s#m2" in f.lost[0]
    assert f.line().startswith("ops=2 lost=1 duplicated=0 stale_reads=0 regressions=0 index_mismatch=0")


def test_an_acknowledged_register_write_overwritten_by_an_older_one_is_lost() -> None:
    h = H()
    h.w("a.1", "t1", ["set", "title:s", "one"])
    h.w("b.1", "t2", ["set", "title:s", "two"])  # started after t1 was acknowledged: it wins
    h.rec({"title:s": "one"})
    _only(h.check(), "lost")


def test_an_acknowledged_removal_undone_is_lost() -> None:
    h = H()
    h.w("a.1", "q1", ["add", "queue:s", "k1"])
    h.w("a.1", "q1-rm", ["remove", "queue:s", "k1"])
    h.rec({"queue:s": ["k1"]})
    _only(h.check(), "lost")


def test_an_effect_seen_twice_is_duplicated() -> None:
    h = H()
    op = h.invoke("a.1", "write", "m1", [["add", "msgs:s", "m1"]])
    h.done(op, "info", {"error": "ClientClosed"})
    op = h.invoke("a.2", "write", "m1", [["add", "msgs:s", "m1"]])  # the retry, same key
    h.done(op, "ok")
    h.rec({"msgs:s": ["m1", "m1"]})
    _only(h.check(), "duplicated")


def test_a_read_missing_its_connections_acknowledged_write_is_stale() -> None:
    h = H()
    h.w("a.1", "s1", ["set", "setting:k", "v1"])
    h.w("a.1", "s2", ["set", "setting:k", "v2"])
    h.r("a.1", {"setting:k": "v1"})
    f = h.check()
    _only(f, "stale_reads")
    assert "setting:k" in f.stale_reads[0]


def test_a_pipelined_read_behind_an_acknowledged_write_that_misses_it_is_stale() -> None:
    """Frame order, not completion order: the read was sent right behind the write."""
    h = H()
    w = h.invoke("a.1", "write", "t1", [["add", "tasks", "T1"]])
    r = h.invoke("a.1", "read", "a.1/r1", reads=True, pipelined=True)
    h.done(w, "ok")
    h.done(r, "ok", {"obs": {"tasks": []}})
    f = h.check()
    _only(f, "stale_reads")
    assert "(pipelined)" in f.stale_reads[0]


def test_a_read_older_than_the_previous_read_on_the_connection_is_a_regression() -> None:
    h = H()
    h.w("a.1", "s1", ["set", "setting:k", "v1"])
    h.w("b.1", "s2", ["set", "setting:k", "v2"])
    h.r("c.1", {"setting:k": "v2"})
    h.r("c.1", {"setting:k": "v1"})  # v1 finished before v2 began: back in time
    _only(h.check(), "regressions")


def test_an_element_vanishing_between_two_reads_is_a_regression() -> None:
    h = H()
    op = h.invoke("a.1", "write", "m1", [["add", "msgs:s", "m1"]])
    h.done(op, "info", {"code": "ACTOR_RESTARTED"})  # unknown to the writer, so never "stale"
    h.r("c.1", {"msgs:s": ["m1"]})
    h.r("c.1", {"msgs:s": []})
    _only(h.check(), "regressions")


def test_index_ids_that_differ_from_the_transcript_are_a_mismatch() -> None:
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    h.rec({"msgs:s": ["m1"]}, index={"s": {"transcript": ["m1", "m2"], "db": ["m1"], "get": ["m1", "m2"]}})
    f = h.check()
    _only(f, "index_mismatch")
    assert len(f.index_mismatch) == 1 and "db ids" in f.index_mismatch[0]


def test_an_effect_whose_call_failed_definitely_is_unexpected() -> None:
    h = H()
    h.w("a.1", "q1", ["add", "queue:s", "k1"], outcome="fail")
    h.rec({"queue:s": ["k1"]})
    _only(h.check(), "unexpected")


def test_an_element_nobody_added_is_unexpected() -> None:
    h = H()
    h.w("a.1", "q1", ["add", "queue:s", "k1"])
    h.rec({"queue:s": ["k1", "k9"]})
    _only(h.check(), "unexpected")


# ------------------------------------------------------------------------------ must pass


def test_a_clean_history_passes() -> None:
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    h.r("a.1", {"msgs:s": ["m1"], "title:s": None})
    h.w("a.1", "d1", ["set", "del:m1", True, False])
    h.r("a.1", {"msgs:s": ["m1"], "del:m1": True})
    h.w("a.1", "d2", ["set", "del:m1", False, False])
    h.r("a.1", {"msgs:s": ["m1"], "del:m1": False})
    h.w("a.1", "q1", ["add", "queue:s", "k1"])
    h.w("a.1", "q1-rm", ["remove", "queue:s", "k1"])
    h.r("a.1", {"queue:s": []})
    h.rec({"msgs:s": ["m1"], "del:m1": False, "queue:s": []},
          index={"s": {"transcript": ["m1"], "db": ["m1"], "get": ["m1"]}})
    f = h.check()
    assert f.anomalies == 0, f.details()
    assert f.line() == "ops=9 lost=0 duplicated=0 stale_reads=0 regressions=0 index_mismatch=0"


def test_concurrent_writers_may_land_in_either_order() -> None:
    h = H()
    a = h.invoke("a.1", "write", "s1", [["set", "setting:k", "va"]])
    b = h.invoke("b.1", "write", "s2", [["set", "setting:k", "vb"]])
    h.done(b, "ok")
    h.done(a, "ok")
    h.r("a.1", {"setting:k": "vb"})  # b may have been applied after a
    h.r("b.1", {"setting:k": "vb"})
    h.rec({"setting:k": "vb"})
    assert h.check().anomalies == 0


def test_a_write_of_unknown_outcome_may_or_may_not_be_there() -> None:
    for present in (True, False):
        h = H()
        op = h.invoke("a.1", "write", "m1", [["add", "msgs:s", "m1"]])
        h.done(op, "info", {"error": "ClientClosed"})
        h.rec({"msgs:s": ["m1"] if present else []})
        assert h.check().anomalies == 0


def test_a_later_write_by_another_connection_explains_a_read() -> None:
    h = H()
    h.w("a.1", "q1", ["add", "queue:s", "k1"])
    rm = h.invoke("b.1", "write", "q1-rm", [["remove", "queue:s", "k1"]])
    h.r("a.1", {"queue:s": []})  # b's removal (in flight) explains it: not stale
    h.done(rm, "ok")
    assert h.check().anomalies == 0


def test_a_definitely_failed_write_need_not_be_seen() -> None:
    h = H()
    h.w("a.1", "s1", ["set", "setting:k", "v1"])
    h.w("a.1", "s2", ["set", "setting:k", "v2"], outcome="fail")
    h.r("a.1", {"setting:k": "v1"})
    h.rec({"setting:k": "v1"})
    assert h.check().anomalies == 0


def test_a_dumped_history_checks_the_same(tmp_path) -> None:
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    h.rec({"msgs:s": []})
    path = tmp_path / "history.jsonl"
    h.h.dump(path)
    ops = parse_ops(orjson.loads(line) for line in path.read_bytes().splitlines())
    assert check(ops).line() == h.check().line() == (
        "ops=1 lost=1 duplicated=0 stale_reads=0 regressions=0 index_mismatch=0")


def test_a_completion_without_its_invoke_is_refused() -> None:
    h = History()
    h.add("a", "ok", "write", "k", {"conn": "a.1"})
    with pytest.raises(ValueError):
        check(h.ops)


def test_the_command_line_checks_a_dumped_history(tmp_path, capsys) -> None:
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    h.rec({"msgs:s": ["m1"]})
    clean = tmp_path / "clean.jsonl"
    h.h.dump(clean)
    assert main([str(clean)]) == 0
    h.rec({"msgs:s": []})
    lossy = tmp_path / "lossy.jsonl"
    h.h.dump(lossy)
    assert main([str(lossy)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ops=1 lost=1 duplicated=0 stale_reads=0 regressions=0 index_mismatch=0")


def test_a_loss_and_a_mismatch_seen_at_several_recoveries_count_once() -> None:
    """The figures count effects and sessions, not how many recoveries still showed them."""
    h = H()
    h.w("a.1", "m1", ["add", "msgs:s", "m1"])
    for _ in range(3):
        h.rec({"msgs:s": []}, index={"s": {"transcript": ["m1"], "db": [], "get": []}})
    f = h.check()
    assert (len(f.lost), len(f.index_mismatch)) == (1, 1), f.details()
    assert "and at 2 later recoveries" in f.lost[0]
    assert "and 5 more views" in f.index_mismatch[0]
