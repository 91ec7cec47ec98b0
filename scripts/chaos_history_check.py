"""The history checker of ``scripts/chaos --mode history``: pure, no trio, no I/O.

The workload (``scripts/chaos_history_mode.py``) records every call as Jepsen-style
``invoke`` → ``ok`` / ``fail`` / ``info`` ops (:mod:`scripts.chaos_history`) and describes, in
each op's ``value``, what the call does to a small model of the host, in two shapes:

* a **register** (last writer wins): a setting, a session's title or model, a task's
  prompt, a secret's value, a message's ``deleted`` flag, an approval's answer. A write is
  ``["set", obj, value]`` or ``["set", obj, value, initial]`` (the value before any write;
  default ``None``); a read observes ``{obj: value}`` (``None``: absent).
* a **set** of client-chosen elements: a session's messages, its queue's idempotency keys, a
  source session's deliveries, the tasks' titles, the secrets' refs. A write is
  ``["add", obj, elem]`` or ``["remove", obj, elem]``; a read observes ``{obj: [elem, ...]}``
  with multiplicity (every element the call returned). Each element is a presence register
  (initially ``False``), so adds, removes and re-adds (restore) follow the register rules.

``value`` holds ``conn`` (the connection the attempt ran on), ``writes`` and ``reads``; a read's
``ok`` result holds ``{"obs": {...}}``. A *recovery* op (``f == "recovery"``, process
``checker``) is a full read taken while the workload is paused after a fault was healed; its
result also holds ``index``: per session, the message ids of its transcript file (read with
the store's reader) and of the index (``session.get`` / the SQLite rows).

``python -m scripts.chaos_history_check history.jsonl`` checks a dumped history again.

What is reported (:class:`Findings`):

* **lost** – at a recovery, an object's value is not one an acknowledged write allows: a
  value that every acknowledged write completed before the recovery has superseded (an
  acknowledged append, removal, rename, ... that is gone). Counted once per object (the first
  recovery that showed it; the text says how many later ones did too).
* **duplicated** – one element seen more than once by one read (an effect applied twice).
* **unexpected** – a value no write could have produced (an element never added, or whose
  add failed definitely).
* **stale_reads** – a read on connection C that misses an acknowledged write C sent before it
  (frame order), when no write that may have followed that one explains what it saw.
* **regressions** – on one connection, a read that shows an older state than an earlier read
  showed: every write that could have produced the later read's value finished before any
  write that could have produced the earlier one started.
* **index_mismatch** – at a recovery, a session whose index ids (``session.get``, the SQLite
  rows) differ from its transcript ids. Counted once per session, like ``lost``.

Time is the history's op index: a write may take effect anywhere between its first invoke
and its last completion (``info`` attempts included; an attempt never completed is open-ended).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scripts.chaos_history import Op

INF = 1 << 62
RECOVERY = "recovery"


@dataclass
class Write:
    """One logical write (all attempts of one ``(f, key)``) to one register."""

    name: str
    value: Any
    first_invoke: int
    last_complete: int = INF
    status: str = "indeterminate"  # acked | failed | indeterminate
    ack_index: int | None = None
    acked_conn: str | None = None
    acked_invoke: int | None = None

    @property
    def possible(self) -> bool:
        return self.status != "failed"


@dataclass
class Read:
    """One completed read (a worker's or a recovery's): what it saw of each register."""

    name: str
    conn: str
    invoke: int
    complete: int
    seen: dict[str, Any]
    counts: dict[str, Counter[Any]]
    recovery: bool = False


@dataclass
class Findings:
    ops: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    stale_reads: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    index_mismatch: list[str] = field(default_factory=list)

    @property
    def anomalies(self) -> int:
        return (len(self.lost) + len(self.duplicated) + len(self.unexpected) + len(self.stale_reads)
                + len(self.regressions) + len(self.index_mismatch))

    def line(self) -> str:
        return (f"ops={self.ops} lost={len(self.lost)} duplicated={len(self.duplicated)} "
                f"stale_reads={len(self.stale_reads)} regressions={len(self.regressions)} "
                f"index_mismatch={len(self.index_mismatch)}")

    def details(self, limit: int = 10) -> list[str]:
        out: list[str] = []
        for label, items in (("LOST", self.lost), ("DUPLICATED", self.duplicated),
                             ("UNEXPECTED", self.unexpected), ("STALE", self.stale_reads),
                             ("REGRESSION", self.regressions), ("INDEX_MISMATCH", self.index_mismatch)):
            out.extend(f"{label} {text}" for text in items[:limit])
            if len(items) > limit:
                out.append(f"{label} ... {len(items) - limit} more")
        return out


def register_name(kind: str, obj: str, elem: Any = None) -> str:
    """A register's name: the object of a ``set`` write; ``obj#elem`` for an element's presence."""
    return obj if kind == "set" else f"{obj}#{elem}"


def _collect(ops: Sequence[Op]) -> tuple[dict[str, list[Write]], dict[str, tuple[str | None, str | None, Any]],
                                         list[Read], list[Op], dict[str, set[str]]]:
    """Fold the history: writes per register, each register's (set, element, initial value),
    completed reads, recovery ops, and every element ever written to each set."""
    writes: dict[str, list[Write]] = {}
    registers: dict[str, tuple[str | None, str | None, Any]] = {}
    by_key: dict[tuple[str, str], list[Write]] = {}
    attempts: Counter[tuple[str, str]] = Counter()
    fails: Counter[tuple[str, str]] = Counter()
    reads: list[Read] = []
    recoveries: list[Op] = []
    elements: dict[str, set[str]] = {}
    open_invoke: dict[tuple[str, str, str], Op] = {}  # (process, f, key) -> the attempt in flight
    for op in ops:
        k = (op.f, op.key)
        if op.type == "invoke":
            open_invoke[(op.process, op.f, op.key)] = op
            attempts[k] += 1
            if k not in by_key:
                made: list[Write] = []
                for kind, obj, arg, *initial in op.value.get("writes", ()):
                    if kind == "set":
                        w = Write(str(obj), arg, op.index)
                        registers.setdefault(w.name, (None, None, initial[0] if initial else None))
                    elif kind in ("add", "remove"):
                        elements.setdefault(str(obj), set()).add(str(arg))
                        w = Write(register_name("elem", str(obj), arg), kind == "add", op.index)
                        registers.setdefault(w.name, (str(obj), str(arg), False))
                    else:
                        raise ValueError(f"op {op.index}: unknown write kind {kind!r}")
                    writes.setdefault(w.name, []).append(w)
                    made.append(w)
                by_key[k] = made
            for w in by_key[k]:
                w.last_complete = INF  # an attempt in flight: its effect may still come
            continue
        inv = open_invoke.pop((op.process, op.f, op.key), None)
        if inv is None:
            raise ValueError(f"history has a {op.type} for {k} without an invoke (op {op.index})")
        if op.type == "fail":
            fails[k] += 1
        for w in by_key.get(k, ()):
            w.last_complete = op.index
            if op.type == "ok" and w.ack_index is None:
                w.status, w.ack_index = "acked", op.index
                w.acked_conn, w.acked_invoke = str(inv.value.get("conn", "")), inv.index
        if op.type == "ok" and (op.value.get("reads") or op.f == RECOVERY):
            if op.f == RECOVERY:
                recoveries.append(op)
            reads.append(_read(op, inv, (op.result or {}).get("obs", {})))
    for k, made in by_key.items():
        if fails[k] and fails[k] == attempts[k]:  # every attempt answered a definite error
            for w in made:
                w.status = "failed"
    return writes, registers, reads, recoveries, elements


def _read(op: Op, inv: Op, obs: dict[str, Any]) -> Read:
    seen: dict[str, Any] = {}
    counts: dict[str, Counter[Any]] = {}
    for obj, val in obs.items():
        if isinstance(val, list):
            counts[obj] = Counter(str(e) for e in val)
        else:
            seen[obj] = val
    label = f"{op.f} {op.key}" + (" (pipelined)" if inv.value.get("pipelined") else "")
    return Read(label, str(inv.value.get("conn", op.process)), inv.index, op.index, seen, counts,
                recovery=op.f == RECOVERY)


def _observed(read: Read, name: str, set_obj: str | None, elem: str | None) -> tuple[bool, Any]:
    """(whether the read saw this register, its value)."""
    if set_obj is not None:
        c = read.counts.get(set_obj)
        if c is None:
            return False, None
        return True, c.get(str(elem), 0) > 0
    if name in read.seen:
        return True, read.seen[name]
    return False, None


def _candidates(ws: list[Write], value: Any, initial: Any) -> tuple[list[Write], bool]:
    """Writes that could have produced ``value`` (possible ones only), and whether the initial state could."""
    return [w for w in ws if w.possible and w.value == value], value == initial


def check(ops: Iterable[Op]) -> Findings:
    ops = list(ops)
    findings = Findings(ops=sum(1 for op in ops if op.type == "invoke" and op.f != RECOVERY))
    writes, registers, reads, recoveries, elements = _collect(ops)
    # duplicates and never-written elements, read by read
    dup_seen: set[str] = set()
    for r in reads:
        for obj, c in r.counts.items():
            known = elements.get(obj, set())
            for elem, n in c.items():
                if n > 1 and f"{obj}#{elem}" not in dup_seen:
                    dup_seen.add(f"{obj}#{elem}")
                    findings.duplicated.append(f"{obj} element {elem} seen {n} times by {r.name}")
                if elem not in known:
                    findings.unexpected.append(f"{obj} element {elem} never added (seen by {r.name})")
    # which reads observed each register (a set's read observes every element ever written to it)
    observers: dict[str, list[Read]] = {}
    for r in reads:
        for obj in r.seen:
            observers.setdefault(obj, []).append(r)
        for obj in r.counts:
            for elem in elements.get(obj, ()):
                observers.setdefault(register_name("elem", obj, elem), []).append(r)
    for name, (set_obj, elem, initial) in registers.items():
        ws = writes[name]
        seen_by = observers.get(name, [])
        _check_recoveries(name, ws, initial, [r for r in seen_by if r.recovery], set_obj, elem, findings)
        per_conn: dict[str, list[Read]] = {}
        for r in seen_by:
            if not r.recovery:
                per_conn.setdefault(r.conn, []).append(r)
        for conn, rs in per_conn.items():
            _check_connection(name, ws, initial, conn, rs, set_obj, elem, findings)
    # one finding per session: the first recovery whose index differed from the transcript
    mismatched: dict[str, list[str]] = {}
    for rec in recoveries:
        for sid, views in sorted(((rec.result or {}).get("index") or {}).items()):
            transcript = list(views.get("transcript", []))
            for label, ids in sorted(views.items()):
                if label != "transcript" and list(ids) != transcript:
                    missing = [i for i in transcript if i not in ids]
                    extra = [i for i in ids if i not in transcript]
                    mismatched.setdefault(sid, []).append(
                        f"{rec.key}: session {sid}: {label} ids differ from the transcript's "
                        f"(missing {missing[:5]}, extra {extra[:5]}, {len(ids)} vs {len(transcript)})")
    for texts in mismatched.values():
        findings.index_mismatch.append(texts[0] + (f" (and {len(texts) - 1} more views at later recoveries)"
                                                   if len(texts) > 1 else ""))
    return findings


def _check_recoveries(name: str, ws: list[Write], initial: Any, recs: list[Read], set_obj: str | None,
                      elem: str | None, findings: Findings) -> None:
    """At most one finding per register: the first recovery that broke it (and how many more did)."""
    first: tuple[list[str], str] | None = None
    again = 0
    for r in recs:
        ok, value = _observed(r, name, set_obj, elem)
        if not ok:
            continue
        before = [w for w in ws if w.status == "acked" and w.ack_index is not None and w.ack_index < r.invoke]
        cands, from_initial = _candidates(ws, value, initial)
        cands = [w for w in cands if w.first_invoke < r.complete]
        allowed = [w for w in cands if not any(w is not y and w.last_complete < y.first_invoke for y in before)]
        if (from_initial and not before) or allowed:
            continue
        if first is not None:
            again += 1
            continue
        text = (f"{name}: recovery {r.name} saw {value!r}; acknowledged before it: "
                f"{[(w.value, w.ack_index) for w in before][-3:]}")
        # no write could have produced it: unexpected; else an acknowledged write superseded it: lost
        first = (findings.unexpected if not cands and not from_initial else findings.lost, text)
    if first is not None:
        first[0].append(first[1] + (f" (and at {again} later recoveries)" if again else ""))


def _check_connection(name: str, ws: list[Write], initial: Any, conn: str, rs: list[Read], set_obj: str | None,
                      elem: str | None, findings: Findings) -> None:
    mine = sorted((w for w in ws if w.status == "acked" and w.acked_conn == conn),
                  key=lambda w: w.acked_invoke or 0)
    prev: tuple[Read, Any] | None = None
    for r in sorted(rs, key=lambda x: x.invoke):
        ok, value = _observed(r, name, set_obj, elem)
        if not ok:
            continue
        cands, from_initial = _candidates(ws, value, initial)
        cands = [w for w in cands if w.first_invoke < r.complete]
        # stale: the newest acknowledged write this connection sent before the read
        earlier = [w for w in mine if (w.acked_invoke or 0) < r.invoke]
        if earlier:
            last = earlier[-1]
            explained = any(w is last or w.last_complete > last.first_invoke for w in cands)
            if not explained:
                findings.stale_reads.append(
                    f"{name}: {r.name} on {conn} saw {value!r} after its own acknowledged write of "
                    f"{last.value!r} (op {last.acked_invoke})")
        # regression: the previous read on this connection saw a value only newer writes produce
        if prev is not None and prev[0].complete < r.invoke and prev[1] != value:
            p_cands, p_initial = _candidates(ws, prev[1], initial)
            if not p_initial and p_cands and (cands or from_initial):
                older = all(c.last_complete < p.first_invoke for c in cands for p in p_cands)
                if older:
                    findings.regressions.append(
                        f"{name}: {r.name} on {conn} saw {value!r} after {prev[0].name} saw {prev[1]!r}")
        prev = (r, value)


def parse_ops(rows: Iterable[dict[str, Any]]) -> list[Op]:
    """Ops from ``history.jsonl`` rows (:meth:`scripts.chaos_history.History.dump`)."""
    return [Op(int(r["index"]), str(r["process"]), r["type"], str(r["f"]), str(r["key"]), dict(r["value"] or {}),
               r.get("result"), int(r.get("cycle", 0))) for r in rows]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m scripts.chaos_history_check history.jsonl``: check a dumped history again."""
    import sys

    import orjson

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m scripts.chaos_history_check HISTORY.jsonl", file=sys.stderr)
        return 2
    with open(args[0], "rb") as fh:
        findings = check(parse_ops(orjson.loads(line) for line in fh if line.strip()))
    for line in findings.details(limit=50):
        print(line)
    print(f"unexpected={len(findings.unexpected)}")
    print(findings.line())
    return 0 if findings.anomalies == 0 else 1


__all__ = ["Findings", "INF", "RECOVERY", "check", "main", "parse_ops", "register_name"]


if __name__ == "__main__":
    raise SystemExit(main())
