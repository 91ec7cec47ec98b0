"""The shared invariant checker (RELIABILITY.md §4): a history against what the host shows.

Pure: :func:`check` takes the :class:`~scripts.chaos_history.History` of a run
and an :class:`Observation` of the host's state (gathered by
``scripts/chaos_observe.py``) and returns a :class:`Report` in Jepsen's set
checker words:

* **lost**       – acknowledged, but absent (or stale) afterwards;
* **duplicated** – one effect visible more than once;
* **recovered**  – not acknowledged (indeterminate), but present once;
* **unexpected** – present but never attempted, or present although its removal
  was acknowledged / its attempt failed definitely.

Plus *problems*: every other broken invariant (index ≠ transcript, a message at
the wrong position, a turn still running after a restart, a checkpoint left
behind, search missing a message, ``integrity_check`` not ok). The run is valid
only if lost, duplicated, unexpected and problems are all empty.

Workload conventions the checker relies on (``scripts/chaos_workload.py``):

=============  =====================  ===========================================
``f``          ``key``                ``value``
=============  =====================  ===========================================
create         session id             sid, title
append         message id             sid, role, text, turnId?
checkpoint     ``<mid>#<n>``          sid, mid, turnId, text, n
start_turn     turn id                sid
end_turn       turn id                sid, status, notify
queue_push     idempotency key        sid, content
queue_remove   idempotency key        sid, entryId
rename         ``<sid>#<n>``          sid, title
settings_set   ``<setting>#<n>``      setting, value
lc_create      lifecycle key          title (= the key)
lc_append      ``<key>/m<i>``         life, sid, mid
lc_truncate    lifecycle key          life, sid (cuts from message 2)
lc_fork        lifecycle key          life, title (``<key> fork``)
lc_delete      lifecycle key          life, sid
approval_req…  tool call id           sid, turnId (``approval_request``)
approval_res…  tool call id           sid, option, requestId (``approval_respond``)
collab_deliver idempotency key        src, tgt, notify
collab_begin   ``<did>@<turnId>``     sid, did, turnId
collab_settle  ``<did>@<turnId>``     sid, did, turnId, kind, notify, src
=============  =====================  ===========================================

Collaboration: a delivery exists once per (source, key) when acknowledged,
never when its send failed; it has at most one queue admission, none once
begun; after a restart nothing is running and every queued one still has its
admission (the rest was interrupted); an acknowledged begin bound its turn and
wrote exactly one input row; an acknowledged settle left it completed with
exactly one callback when it asked for one — never two, and never one for a
completion. Approvals: an acknowledged request has its row; an acknowledged
answer left the row allowed/denied as chosen and the transcript's decision
says the same; after a restart nothing is pending.

A *lifecycle* is a scratch session driven through the file-first methods
(each step only after the one before was acknowledged): its session must
exist exactly once unless its delete was acknowledged (then: never), its fork
exactly once when acknowledged, its messages as the acknowledged appends and
truncation leave them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from scripts.chaos_history import WRITE_KINDS, History, Op, Outcome, outcomes

NOTIFICATION_CAP = 200
TOKEN_RE = re.compile(r"zq[0-9a-f]{12}")
COLLAB_INPUT = "collab-"
ABSENT: Any = object()
"""Observed value of a setting that is not set."""


@dataclass
class ObservedMessage:
    id: str
    role: str
    text: str
    seq: int | None = None


@dataclass
class ObservedSession:
    messages: list[ObservedMessage]
    """``session.get`` with ``full: true``, in transcript order."""
    file_ids: list[str]
    """Message ids as the transcript reader sees them (deduped, in order)."""
    index_rows: list[tuple[str, int]]
    """``(id, seq)`` rows of the index, ordered by seq (read-only SQLite)."""
    title: str | None
    queue_keys: list[str]
    """Idempotency keys of the session's queue entries (``session.queueList``)."""
    bad_lines: int = 0
    unreadable: str | None = None
    """What ``session.get`` answered when it met a damaged record it shows (CORRUPT_DATA: an approval
    decision's options that do not parse); ``messages`` and ``title`` are then the transcript's."""


@dataclass
class Observation:
    sessions: dict[str, ObservedSession]
    turns: dict[str, tuple[str, str]] = field(default_factory=dict)
    """turn id → (session id, status)."""
    notifications: dict[str, int] = field(default_factory=dict)
    """turn id → number of notifications for it."""
    settings: dict[str, Any] = field(default_factory=dict)
    """setting key → value (``ABSENT`` when unset)."""
    search: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """token → ``(sessionId, messageId)`` hits; only tokens the observer searched."""
    integrity: str = "ok"
    leftover_checkpoints: dict[str, str] = field(default_factory=dict)
    """message id → session id of in-flight checkpoints found on disk before this boot."""
    inflight_left: list[str] = field(default_factory=list)
    """sessions that still have an in-flight checkpoint file after boot."""
    after_restart: bool = False
    """True when the host was restarted since the last operation (fence + sweep ran)."""
    titles: dict[str, int] = field(default_factory=dict)
    """title → how many sessions carry it (every session the host lists)."""
    lives: dict[str, list[str]] = field(default_factory=dict)
    """lifecycle key → message ids of the session titled with it (when exactly one is)."""
    deliveries: dict[str, dict[str, Any]] = field(default_factory=dict)
    """ledger rows: id → source, target, kind, key, status, turnId, replyTo, notify."""
    admissions: dict[str, int] = field(default_factory=dict)
    """delivery id → turn_queue rows bound to it."""
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)
    """tool call id → sid, requestId, status."""
    decisions: dict[str, str] = field(default_factory=dict)
    """request id → status of its visible approval_decision line."""


@dataclass
class Report:
    attempted: int = 0
    acknowledged: int = 0
    lost: set[str] = field(default_factory=set)
    duplicated: set[str] = field(default_factory=set)
    recovered: set[str] = field(default_factory=set)
    unexpected: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    damaged: set[str] = field(default_factory=set)
    """Values no write produced (an id the host never issued): bytes changed in place. SQLite keeps no
    checksum, so a host cannot see such damage; only corrupt mode, which causes it, may excuse it."""
    checked_at: int = 0
    """History length when the check ran: every op before it (every acknowledgement) preceded the observation."""
    anchors: dict[str, int] = field(default_factory=dict)
    """Lost name → history index of the acknowledgement it contradicts (where the checker knows it): the loss
    happened after that point (corrupt mode excuses it only by a salvage that ran later)."""
    acked: set[int] = field(default_factory=set)
    """History indices of every acknowledgement this check covered; those not among ``anchors`` were seen
    present (an acknowledged effect the observation showed)."""

    def lose(self, name: str, acked: Outcome | None) -> None:
        """Report ``name`` lost, anchored to ``acked``'s acknowledgement when there is one."""
        self.lost.add(name)
        if acked is not None and acked.ack_index is not None:
            self.anchors[name] = acked.ack_index

    @property
    def valid(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.problems or self.damaged)

    def summary(self) -> str:
        return (f"attempted={self.attempted} acknowledged={self.acknowledged} lost={len(self.lost)} "
                f"duplicated={len(self.duplicated)} recovered={len(self.recovered)} "
                f"unexpected={len(self.unexpected)} problems={len(self.problems)}")


def _by_kind(found: dict[tuple[str, str], Outcome], kind: str) -> list[Outcome]:
    return [o for (f, _), o in found.items() if f == kind]


def check(history: History | Iterable[Op], obs: Observation) -> Report:
    ops = history.ops if isinstance(history, History) else list(history)
    found = outcomes(ops)
    report = Report()
    writes = [o for o in found.values() if o.f in WRITE_KINDS]
    report.attempted = len(writes)
    report.acknowledged = sum(1 for o in writes if o.status == "acked")
    report.checked_at = len(ops)
    report.acked = {o.ack_index for o in found.values() if o.ack_index is not None}
    if obs.integrity != "ok":
        report.problems.append(f"PRAGMA integrity_check: {obs.integrity}")
    _check_sessions_consistent(obs, report)
    _check_messages(found, obs, report)
    _check_turns(found, obs, report)
    _check_notifications(found, obs, report)
    _check_queue(found, obs, report)
    _check_registers(found, obs, report)
    _check_lifecycles(found, obs, report)
    _check_collab(found, obs, report)
    _check_approvals(found, obs, report)
    return report


def _first_acked(found: dict[tuple[str, str], Outcome], kinds: tuple[str, ...], did: str) -> Outcome | None:
    """The earliest acknowledged op of ``kinds`` about delivery ``did`` (it existed then)."""
    acked = [o for (f, _), o in found.items() if f in kinds and o.status == "acked" and o.value.get("did") == did]
    return min(acked, key=lambda o: o.ack_index or 0, default=None)


def _check_lifecycles(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    for create in _by_kind(found, "lc_create"):
        key = create.key
        delete, trunc, fork = (found.get((f, key)) for f in ("lc_delete", "lc_truncate", "lc_fork"))
        present = obs.titles.get(key, 0)
        tag = f"lifecycle {key}"
        if present > 1:
            report.duplicated.add(f"{tag}: {present} sessions")
        elif delete is not None and delete.status == "acked":
            if present:
                report.unexpected.add(f"{tag}: present after its delete was acknowledged")
        elif create.status == "acked" and not present and (delete is None or delete.status == "failed"):
            report.lost.add(f"{tag}: the acknowledged session is gone")
        elif create.status != "acked" and present:
            report.recovered.add(tag)
        forks = obs.titles.get(f"{key} fork", 0)
        if forks > 1:
            report.duplicated.add(f"{tag}: {forks} forks")
        elif fork is not None and fork.status == "acked" and forks == 0:
            report.lost.add(f"{tag}: the acknowledged fork is gone")
        elif fork is None and forks:
            report.unexpected.add(f"{tag}: a fork nobody asked for")
        ids = obs.lives.get(key)
        if present != 1 or ids is None:
            continue
        if len(ids) != len(set(ids)):
            report.duplicated.add(f"{tag}: a message twice in {ids}")
        for i in (1, 2):
            app = found.get(("lc_append", f"{key}/m{i}"))
            mid = app.value.get("mid") if app is not None else None
            cut = i == 2 and trunc is not None and trunc.status == "acked"
            if mid is not None and cut and mid in ids:
                report.unexpected.add(f"{tag}: {mid} survived an acknowledged truncateFrom")
            uncut = trunc is None or trunc.status == "failed"
            if mid is not None and app is not None and app.status == "acked" and mid not in ids and (i == 1 or uncut):
                report.lost.add(f"{tag}: acknowledged {mid} is missing")


# ---------------------------------------------------------------------------- index vs transcript


def _check_sessions_consistent(obs: Observation, report: Report) -> None:
    for sid, s in obs.sessions.items():
        if s.unreadable is not None:  # a byte changed in place in a record the read shows: damage, not a loss
            report.damaged.add(f"session:{sid}: session.get answers CORRUPT_DATA ({s.unreadable})")
        index_ids = [mid for mid, _ in s.index_rows]
        if index_ids != s.file_ids:
            report.problems.append(
                f"{sid}: index ids != transcript ids ({len(index_ids)} rows vs {len(s.file_ids)} records; "
                f"first difference at {_first_diff(index_ids, s.file_ids)})")
        bad_seq = [(mid, seq, pos) for pos, (mid, seq) in enumerate(s.index_rows) if seq != pos + 1]
        if bad_seq:
            report.problems.append(f"{sid}: index seq != position+1 for {bad_seq[:3]}")
        get_ids = [m.id for m in s.messages]
        if get_ids != s.file_ids:
            report.problems.append(
                f"{sid}: session.get ids != transcript ids (first difference at {_first_diff(get_ids, s.file_ids)})")
        if s.bad_lines:
            report.problems.append(f"{sid}: {s.bad_lines} unparsable line(s) inside the transcript")
    if obs.inflight_left:
        report.problems.append(f"in-flight checkpoints left after boot: {sorted(obs.inflight_left)}")


def _first_diff(a: list[str], b: list[str]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # lists may differ in length; tail handled below
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---------------------------------------------------------------------------- messages


def _check_messages(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    appends = {o.key: o for o in _by_kind(found, "append")}
    checkpoints: dict[str, list[Outcome]] = {}
    for o in _by_kind(found, "checkpoint"):
        checkpoints.setdefault(str(o.value["mid"]), []).append(o)
    attempted: dict[str, str] = {mid: str(o.value["sid"]) for mid, o in appends.items()}
    for mid, cps in checkpoints.items():
        attempted.setdefault(mid, str(cps[0].value["sid"]))
    # The checkpoint file holds a session's last saved reply: the newest checkpoint op
    # of each session, if one of its message's checkpoints was acknowledged, must
    # survive a restart (promoted by the boot sweep, or settled by its final append).
    newest: dict[str, Outcome] = {}
    for cps in checkpoints.values():
        for o in cps:
            sid = str(o.value["sid"])
            if sid not in newest or o.first_invoke > newest[sid].first_invoke:
                newest[sid] = o
    durable_cp = {str(o.value["mid"]) for o in newest.values()
                  if any(c.status == "acked" for c in checkpoints[str(o.value["mid"])])}
    observed: dict[str, tuple[str, int, ObservedMessage, int]] = {}  # mid → (sid, position, msg, count)
    for sid, s in obs.sessions.items():
        counts = Counter(m.id for m in s.messages)
        for pos, m in enumerate(s.messages):
            if m.id.startswith(COLLAB_INPUT):
                continue  # a delivery's input row, written by the host: _check_collab
            if m.id not in observed:
                observed[m.id] = (sid, pos, m, counts[m.id])
            if m.id not in attempted:
                report.unexpected.add(f"message:{sid}/{m.id}")
    for mid, sid in attempted.items():
        name = f"message:{sid}/{mid}"
        app = appends.get(mid)
        cps = sorted(checkpoints.get(mid, []), key=lambda o: int(o.value["n"]))
        seen = observed.get(mid)
        if seen is not None and seen[0] != sid:
            report.unexpected.add(f"{name} (found in session {seen[0]})")
            continue
        must_exist = (app is not None and app.status == "acked") or mid in obs.leftover_checkpoints or (
            obs.after_restart and mid in durable_cp)
        if seen is None:
            if must_exist:
                report.lost.add(name)
            continue
        _, pos, msg, count = seen
        if count > 1:
            report.duplicated.add(name)
        if app is not None and app.status == "failed" and not cps:
            report.unexpected.add(f"{name} (its append failed definitely)")
        if not must_exist:
            report.recovered.add(name)
        # position: an acknowledged append said where it landed
        if app is not None and app.status == "acked":
            seq = ((app.result or {}).get("message") or {}).get("seq")
            if seq is not None and seq != pos + 1:
                report.problems.append(f"{name}: acknowledged at seq {seq} but found at position {pos}")
        # content: the final text, or a checkpoint at or after the last acknowledged one
        allowed = _allowed_texts(app, cps)
        if allowed is not None and msg.text not in allowed:
            if app is not None and app.status == "acked" and not (app.result or {}).get("replayed") and not cps:
                report.lost.add(f"{name} (content)")
            else:
                report.problems.append(f"{name}: text {msg.text[:60]!r} is none of the {len(allowed)} allowed")
        # search finds it
        for token in set(TOKEN_RE.findall(msg.text)):
            hits = obs.search.get(token)
            if hits is None:
                continue
            if hits.count((sid, mid)) != 1 or len(hits) != 1:
                report.problems.append(f"{name}: search for {token} returned {hits[:3]}")


def _allowed_texts(app: Outcome | None, cps: list[Outcome]) -> set[str] | None:
    if app is not None and app.status == "acked" and not (app.result or {}).get("replayed"):
        return {str(app.value["text"])}
    allowed: set[str] = set()
    if app is not None and app.status != "failed":
        allowed.add(str(app.value["text"]))
    last_acked = max((int(c.value["n"]) for c in cps if c.status == "acked"), default=-1)
    for c in cps:
        if int(c.value["n"]) >= last_acked and c.status != "failed":
            allowed.add(str(c.value["text"]))
    if not cps and app is not None and app.status == "acked":
        allowed.add(str(app.value["text"]))
    return allowed or None


# ---------------------------------------------------------------------------- turns


def _check_turns(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    ends = {o.key: o for o in _by_kind(found, "end_turn")}
    starts = {o.key: o for o in _by_kind(found, "start_turn")}
    for tid, start in starts.items():
        name = f"turn:{start.value['sid']}/{tid}"
        seen = obs.turns.get(tid)
        end = ends.get(tid)
        status = seen[1] if seen else None
        if seen is None:
            if start.status == "acked":
                report.lose(name, start)
            continue
        if start.status != "acked":
            report.recovered.add(name)
        if end is not None and end.status == "acked":
            want = ((end.result or {}).get("turn") or {}).get("status", end.value["status"])
            if status != want:
                report.lose(f"{name} (status {status}, acknowledged {want})", end)
            continue
        allowed = {"aborted"} if obs.after_restart else {"running"}
        if end is not None and end.status != "failed":
            allowed.add(str(end.value["status"]))
        if status not in allowed:
            report.problems.append(f"{name}: status {status}, expected one of {sorted(allowed)}")
    for tid, (sid, status) in obs.turns.items():
        if tid not in starts:
            report.unexpected.add(f"turn:{sid}/{tid}")
        elif obs.after_restart and status == "running":
            report.problems.append(f"turn:{sid}/{tid} still running after a restart")


def _check_notifications(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    ends = sorted(_by_kind(found, "end_turn"), key=lambda o: o.first_invoke)
    notifying = [o for o in ends if o.status != "failed" and o.value.get("notify")
                 and o.value["status"] in ("completed", "error")]
    keys = {o.key for o in notifying}
    for tid, count in obs.notifications.items():
        if count > 1:
            report.duplicated.add(f"notification:{tid}")
        if tid not in keys and count:
            report.unexpected.add(f"notification:{tid}")
    for o in notifying:
        if o.status != "acked" or "notification" not in (o.result or {}):
            continue
        newer = sum(1 for n in notifying if n.first_invoke > (o.ack_index or 0))
        if newer >= NOTIFICATION_CAP - 8:
            continue  # may have been pruned by the newest-200 cap
        if obs.notifications.get(o.key, 0) == 0:
            report.lose(f"notification:{o.key}", o)


# ---------------------------------------------------------------------------- queue


def _check_queue(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    pushes = {o.key: o for o in _by_kind(found, "queue_push")}
    removes = {o.key: o for o in _by_kind(found, "queue_remove")}
    seen: Counter[str] = Counter()
    where: dict[str, str] = {}
    for sid, s in obs.sessions.items():
        for key in s.queue_keys:
            seen[key] += 1
            where[key] = sid
    for key in seen:
        if key not in pushes:
            report.unexpected.add(f"queue:{where[key]}/{key}")
    for key, push in pushes.items():
        name = f"queue:{push.value['sid']}/{key}"
        count = seen.get(key, 0)
        if count > 1:
            report.duplicated.add(name)
        rm = removes.get(key)
        if rm is not None and rm.status == "acked":
            if count:
                report.unexpected.add(f"{name} (its removal was acknowledged)")
            continue
        if push.status == "acked":
            # a removal that failed definitely (NOT_FOUND: the entry was already gone) took nothing away
            if count == 0 and (rm is None or rm.status == "failed"):
                report.lose(name, push)
        elif push.status == "failed":
            if count:
                report.unexpected.add(f"{name} (its push failed definitely)")
        elif count:
            report.recovered.add(name)


# ---------------------------------------------------------------------------- registers


def _check_registers(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    """Last-writer-wins registers: a session's title and each setting key."""
    titles: dict[str, list[Outcome]] = {}
    for o in _by_kind(found, "rename"):
        titles.setdefault(str(o.value["sid"]), []).append(o)
    creates = {o.key: o for o in _by_kind(found, "create")}
    for sid, ops in titles.items():
        if sid not in obs.sessions:
            continue
        initial = creates[sid].value.get("title") if sid in creates else ABSENT
        _register(f"title:{sid}", ops, "title", initial, obs.sessions[sid].title, report)
    settings: dict[str, list[Outcome]] = {}
    for o in _by_kind(found, "settings_set"):
        settings.setdefault(str(o.value["setting"]), []).append(o)
    for key, ops in settings.items():
        _register(f"setting:{key}", ops, "value", ABSENT, obs.settings.get(key, ABSENT), report)


def _register(name: str, ops: list[Outcome], field_name: str, initial: Any, observed: Any,
              report: Report) -> None:
    ops = sorted(ops, key=lambda o: o.first_invoke)
    acked = [i for i, o in enumerate(ops) if o.status == "acked"]
    start = acked[-1] if acked else 0
    allowed = [o.value[field_name] for o in ops[start:] if o.status != "failed"]
    if not acked:
        allowed.append(initial)
    if not any(observed is a or observed == a for a in allowed):
        shown = "absent" if observed is ABSENT else repr(observed)
        report.lose(f"{name} (observed {shown}, allowed {len(allowed)} values from op {start})",
                    ops[start] if acked else None)


__all__ = ["ABSENT", "Observation", "ObservedMessage", "ObservedSession", "Report", "TOKEN_RE", "check"]


# ---------------------------------------------------------------------------- collaboration


def _check_collab(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    by_key: dict[tuple[str, str], list[str]] = {}
    for did, d in obs.deliveries.items():
        if d["kind"] != "completion":
            by_key.setdefault((d["source"], d["key"]), []).append(did)
    sends = {o.key: o for o in _by_kind(found, "collab_deliver")}
    for key, send in sends.items():
        name = f"delivery:{send.value['src']}/{key}"
        ids = by_key.get((str(send.value["src"]), key), [])
        if len(ids) > 1:
            report.duplicated.add(name)
        if not ids:
            if send.status == "acked":
                report.lose(name, send)
            continue
        if send.status == "failed":
            report.unexpected.add(f"{name} (its send failed definitely)")
        elif send.status != "acked":
            report.recovered.add(name)
        if obs.deliveries[ids[0]]["target"] != send.value["tgt"]:
            report.problems.append(f"{name}: target {obs.deliveries[ids[0]]['target']}, sent to {send.value['tgt']}")
    for src, key in by_key:
        if key not in sends:
            report.unexpected.add(f"delivery:{src}/{key} (never sent)")
    inputs: Counter[str] = Counter()
    for s in obs.sessions.values():
        for mid, _ in s.index_rows:
            if mid.startswith(COLLAB_INPUT):
                inputs[mid[len(COLLAB_INPUT):]] += 1
    callbacks: Counter[str] = Counter(d["replyTo"] for d in obs.deliveries.values() if d["kind"] == "completion")
    for did, d in obs.deliveries.items():
        name = f"delivery:{did}"
        admitted = obs.admissions.get(did, 0)
        if admitted > 1:
            report.duplicated.add(f"{name}: {admitted} queue admissions")
        if d["status"] != "queued" and admitted:
            report.problems.append(f"{name}: {d['status']} but still admitted to the queue")
        if obs.after_restart and d["status"] == "running":
            report.problems.append(f"{name}: running after a restart")
        if obs.after_restart and d["status"] == "queued" and not admitted:
            report.problems.append(f"{name}: queued without an admission after a restart (not interrupted)")
        if inputs[did] > 1:
            report.duplicated.add(f"{name}: {inputs[did]} input rows")
        if callbacks[did] > 1:
            report.duplicated.add(f"{name}: {callbacks[did]} completion callbacks")
        if d["kind"] == "completion" and callbacks[did]:
            report.problems.append(f"{name}: a completion called back")
        if d["kind"] == "completion" and d["replyTo"] not in obs.deliveries:
            # a completion is written only when its delivery is settled: that delivery existed, and is gone
            # (a loss; in corrupt mode excused where the salvage skipped rows of the ledger, like any delivery)
            report.lose(f"delivery:{d['replyTo']} (completion {did} answers it)",
                        _first_acked(found, ("collab_begin", "collab_settle"), str(d["replyTo"])))
    for begin in _by_kind(found, "collab_begin"):
        did = str(begin.value["did"])
        d = obs.deliveries.get(did)
        if begin.status != "acked" or d is None:
            continue
        if d["turnId"] != begin.value["turnId"] or d["status"] == "queued":
            report.lose(f"delivery:{did} begin in {begin.value['turnId']} (turn {d['turnId']}, "
                        f"status {d['status']})", begin)
        if inputs[did] != 1:
            report.lose(f"delivery:{did} input row ({inputs[did]} rows)", begin)
    for settle in _by_kind(found, "collab_settle"):
        did = str(settle.value["did"])
        d = obs.deliveries.get(did)
        if settle.status != "acked" or d is None:
            continue
        if d["status"] != "completed":
            report.lose(f"delivery:{did} settlement (status {d['status']})", settle)
        wants = settle.value["notify"] and settle.value["kind"] != "completion" and \
            str(settle.value["src"]) in obs.sessions
        if wants and callbacks[did] != 1:
            report.lose(f"delivery:{did} callback", settle)
        if not wants and callbacks[did]:
            report.unexpected.add(f"delivery:{did}: a callback nobody asked for")


# ---------------------------------------------------------------------------- approvals


def _check_approvals(found: dict[tuple[str, str], Outcome], obs: Observation, report: Report) -> None:
    asks = {o.key: o for o in _by_kind(found, "approval_request")}
    answers = {o.key: o for o in _by_kind(found, "approval_respond")}
    for call_id, row in obs.approvals.items():
        name = f"approval:{row['sid']}/{call_id}"
        ask, answer = asks.get(call_id), answers.get(call_id)
        if ask is None:
            report.unexpected.add(f"{name} (never asked)")
            continue
        if ask.status == "failed":
            report.unexpected.add(f"{name} (its request failed definitely)")
        issued = _issued_request_id(ask, answer)
        if issued is not None and row["requestId"] != issued:
            report.damaged.add(f"{name}: request id {row['requestId']!r}, issued {issued!r}")
            continue
        status, shown = row["status"], obs.decisions.get(row["requestId"])
        if obs.after_restart and status == "pending":
            report.problems.append(f"{name}: pending after a restart")
        if status in ("allowed", "denied"):
            if answer is None or answer.status == "failed":
                report.unexpected.add(f"{name}: {status} without an answer")
            elif answer.status != "acked":
                report.recovered.add(name)
            if shown != status:
                report.problems.append(f"{name}: {status}, the transcript's decision says {shown}")
        elif shown is not None and (obs.after_restart or (answer is not None and answer.status == "acked")):
            report.problems.append(f"{name}: {status}, but the transcript records a decision ({shown})")
        if answer is not None and answer.status == "acked":
            want = "allowed" if answer.value["option"] == "allow_once" else "denied"
            if status != want:
                report.lose(f"{name}: answer (status {status}, answered {want})", answer)
    for call_id, ask in asks.items():
        if ask.status == "acked" and call_id not in obs.approvals:
            report.lose(f"approval:{ask.value['sid']}/{call_id}", ask)


def _issued_request_id(ask: Outcome, answer: Outcome | None) -> str | None:
    """The request id the host gave this tool call's approval (its acknowledged request, or the one answered)."""
    if ask.status == "acked" and isinstance(ask.result, dict):
        rid = (ask.result.get("request") or {}).get("requestId")
        if isinstance(rid, str):
            return rid
    if answer is not None and isinstance(answer.value.get("requestId"), str):
        return str(answer.value["requestId"])
    return None
