"""A plain in-memory model of one session's history, for the property test.

It holds what the files should say — the live message records, tombstoned
ids, compaction checkpoints, revision branches — and predicts each operation
with simple list manipulation, following the documented rules (seed 003
§2.1, §4.9, §5; seed 000 §3-4; ``actors/session_revisions.py``'s docstrings):

* a cut named by message identity; regenerate/retry/edit archive the branch
  rooted at the nearest user message at or before the cut under the root's
  stamped variant (or a new index); when the root stays, its pager stamp
  counts the variant about to be generated; a live reference whose root a
  rewrite deletes is archived in full;
* activating a variant archives the live branch first (unless the stored copy
  is the same), restores the target with a fresh stamp, keeps prefix messages;
  below its root, every family of the restored branch comes back on its newest
  full variant (seed 000 §3.2), the one it held stored first unless the same;
  a branch stored in full keeps the checkpoints anchored in it, and its
  restore writes them again after the live ones;
* saving stamps the root and stores a live reference;
* a rewrite keeps the checkpoints whose boundary survives and the tombstones
  of surviving messages;
* the model context: newest checkpoint → summary + retained tail + messages
  from firstKept (or after the boundary), minus tombstones, system notices and
  subagent rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

CREATED = "2024-01-01T00:00:00.000Z"
ARCHIVE_MODES = ("regenerate", "retry", "edit")
Key = tuple[str, int]


def record(mid: str, role: str, text: str, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "message", "id": mid, "role": role, "blocks": [{"type": "text", "text": text}],
                           "createdAt": CREATED}
    if meta:
        rec["meta"] = dict(meta)
    return rec


def wire(rec: dict[str, Any]) -> dict[str, Any]:
    """What a client sends to append ``rec``."""
    return {k: v for k, v in rec.items() if k != "type"}


def meta(rec: dict[str, Any]) -> dict[str, Any]:
    m = rec.get("meta")
    return m if isinstance(m, dict) else {}


def family(rec: dict[str, Any]) -> str:
    root = meta(rec).get("revisionRootId")
    return root if isinstance(root, str) and root else rec["id"]


def stamped(rec: dict[str, Any]) -> int | None:
    v = meta(rec).get("activeRevision")
    return v if isinstance(v, int) else None


def with_stamp(rec: dict[str, Any], count: int, active: int, root: str) -> dict[str, Any]:
    out = copy.deepcopy(rec)
    out["meta"] = {**meta(rec), "revisionCount": count, "activeRevision": active, "revisionRootId": root}
    return out


def unstamped(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in msgs:
        r = dict(m)
        if isinstance(r.get("meta"), dict):
            r["meta"] = {k: v for k, v in r["meta"].items() if k not in ("revisionCount", "activeRevision")}
        out.append(r)
    return out


def text(rec: dict[str, Any]) -> str:
    return rec["blocks"][0]["text"]


def attributed(rec: dict[str, Any]) -> bool:
    return bool(meta(rec).get("parentToolCallId") or meta(rec).get("agentName"))


@dataclass
class Checkpoint:
    id: str
    summary: str
    through: str
    first_kept: str | None
    tail: list[dict[str, Any]]

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "summary": self.summary, "throughMessageId": self.through,
                               "tokensBefore": 1, "retainedTail": [wire(t) for t in self.tail],
                               "details": {"retainedTailMode": "active_turn" if self.tail else "completed_turn"}}
        if self.first_kept is not None:
            out["firstKeptMessageId"] = self.first_kept
        return out


@dataclass
class HistoryModel:
    live: list[dict[str, Any]] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)
    entry_deleted: dict[Key, set[str]] = field(default_factory=dict)
    """An archived branch's messages the user had deleted when it left (they stay deleted)."""
    checkpoints: list[Checkpoint] = field(default_factory=list)
    entries: dict[Key, list[dict[str, Any]] | None] = field(default_factory=dict)
    """(family, index) → archived branch, or None for a live reference."""
    rows: dict[Key, int] = field(default_factory=dict)
    """(family, index) → message_count of the index row."""
    entry_checkpoints: dict[Key, list[Checkpoint]] = field(default_factory=dict)
    """(family, index) → the checkpoints anchored in the branch when it was stored in full (a restore
    writes them again, after the live ones)."""

    # ------------------------------------------------------------------ queries
    def ids(self) -> list[str]:
        return [m["id"] for m in self.live]

    def position(self, mid: str) -> int:
        return self.ids().index(mid)

    def find_root(self, fam: str, msgs: list[dict[str, Any]] | None = None) -> int | None:
        msgs = self.live if msgs is None else msgs
        fallback = None
        for i, m in enumerate(msgs):
            if m["role"] != "user":
                continue
            if family(m) == fam:
                return i
            if fallback is None and m["id"] == fam:
                fallback = i
        return fallback

    def known(self, fam: str) -> set[int]:
        return {i for (f, i) in self.rows if f == fam}

    def live_stamps(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for m in self.live:
            if m["role"] == "user" and family(m) not in out:
                out[family(m)] = stamped(m)
        return out

    def revision_rows(self) -> list[tuple[str, int, bool, int]]:
        stamps = self.live_stamps()
        return sorted((f, i, stamps.get(f) == i, n) for (f, i), n in self.rows.items())

    def full_entries(self) -> list[Key]:
        return sorted(k for k, v in self.entries.items() if v is not None)

    def context(self, live: list[dict[str, Any]] | None = None, checkpoints: list[Checkpoint] | None = None,
                deleted: set[str] | None = None) -> list[tuple[str, str, str]]:
        live = self.live if live is None else live
        cps = self.checkpoints if checkpoints is None else checkpoints
        deleted = self.deleted if deleted is None else deleted
        pos = {m["id"]: i for i, m in enumerate(live)}
        cps = [c for c in cps if c.through in pos]
        out: list[tuple[str, str, str]] = []
        start = 0
        if cps:
            cp = cps[-1]
            start = pos[cp.first_kept] if cp.first_kept in pos else pos[cp.through] + 1
            out.append((cp.id, "user", cp.summary))
            kept = {m["id"] for m in live[start:]}
            for t in cp.tail:
                if t["id"] not in kept and t["id"] not in deleted and t["role"] != "system" and not attributed(t):
                    out.append((t["id"], t["role"], text(t)))
        for m in live[start:]:
            if m["id"] not in deleted and m["role"] != "system" and not attributed(m):
                out.append((m["id"], m["role"], text(m)))
        return out

    # ------------------------------------------------------------------ operations
    def append(self, rec: dict[str, Any]) -> None:
        self.live.append(copy.deepcopy(rec))

    def _dropped_live(self, old: list[dict[str, Any]], new_ids: set[str], handled: set[Key]
                      ) -> list[tuple[str, int, list[dict[str, Any]]]]:
        out = []
        for key in sorted(k for k, v in self.entries.items() if v is None):
            if key in handled:
                continue
            p = self.find_root(key[0], old)
            if p is None or old[p]["id"] in new_ids:
                continue
            out.append((key[0], key[1], copy.deepcopy(old[p:])))
        return out

    def _commit(self, new: list[dict[str, Any]], archives: list[tuple[str, int, list[dict[str, Any]]]],
                restored: list[Checkpoint] | None = None) -> None:
        for fam, idx, branch in archives:
            self.entries[(fam, idx)] = branch
            self.rows[(fam, idx)] = len(branch)
            in_branch = {m["id"] for m in branch}
            self.entry_deleted[(fam, idx)] = self.deleted & in_branch  # its tombstones leave with it
            self.entry_checkpoints[(fam, idx)] = [copy.deepcopy(c) for c in self.checkpoints
                                                  if c.through in in_branch]
        self.live = new
        ids = {m["id"] for m in new}
        self.deleted &= ids
        held = {c.id for c in self.checkpoints}
        every = self.checkpoints + [copy.deepcopy(c) for c in restored or () if c.id not in held]
        self.checkpoints = [c for c in every if c.through in ids]

    def truncate(self, mid: str, mode: str | None) -> int:
        pos = self.position(mid)
        old = self.live
        new = copy.deepcopy(old[:pos])
        archives: list[tuple[str, int, list[dict[str, Any]]]] = []
        handled: set[Key] = set()
        if mode in ARCHIVE_MODES:
            users = [i for i in range(pos + 1) if old[i]["role"] == "user"]
            if users:
                rpos = users[-1]
                root = old[rpos]
                fam = family(root)
                known = self.known(fam)
                st = stamped(root)
                idx = st if st in known else max(known, default=0) + 1
                archives.append((fam, idx, copy.deepcopy(old[rpos:])))
                handled.add((fam, idx))
                if rpos < pos:
                    after = known | {idx}
                    new[rpos] = with_stamp(root, len(after) + 1, max(after) + 1, fam)
        archives += self._dropped_live(old, {m["id"] for m in new}, handled)
        self._commit(new, archives)
        return len(old) - pos

    def replace(self, messages: list[dict[str, Any]]) -> None:
        """replaceMessages: the new list as given; live references whose root is gone are archived."""
        archives = self._dropped_live(self.live, {m["id"] for m in messages}, set())
        self._commit(copy.deepcopy(messages), archives)

    def save(self, fam_req: str) -> Key | None:
        """None when no live user message roots the family (MESSAGE_NOT_FOUND)."""
        pos = None
        for i, m in enumerate(self.live):
            if m["id"] == fam_req:
                if m["role"] == "user" and family(m) == fam_req:
                    pos = i
                break
        if pos is None:
            pos = self.find_root(fam_req)
        if pos is None:
            return None
        root = self.live[pos]
        fam = family(root)
        known = self.known(fam)
        st = stamped(root)
        idx = st if st in known else max(known, default=0) + 1
        self.live[pos] = with_stamp(root, len(known | {idx}), idx, fam)
        self.entries[(fam, idx)] = None
        self.rows[(fam, idx)] = len(self.live) - pos
        return (fam, idx)

    def current(self, fam: str) -> int | None:
        rpos = self.find_root(fam)
        assert rpos is not None
        known = self.known(fam) | {i for (f, i) in self.entries if f == fam}
        st = stamped(self.live[rpos])
        return st if st in known else None

    def activate(self, fam_req: str, idx: int) -> bool:
        """Switch to a full archived variant; False when it is already the live one (no-op)."""
        rpos = self.find_root(fam_req)
        assert rpos is not None
        root = self.live[rpos]
        fam = family(root)
        target = self.entries[(fam, idx)]
        assert target is not None
        known = self.known(fam) | {i for (f, i) in self.entries if f == fam}
        st = stamped(root)
        current = st if st in known else None
        if current == idx:
            return False
        live_idx = current if current is not None else max(known, default=0) + 1
        live_branch = copy.deepcopy(self.live[rpos:])
        archives: list[tuple[str, int, list[dict[str, Any]]]] = []
        stored = self.entries.get((fam, live_idx))
        live_deleted = self.deleted & {m["id"] for m in live_branch}
        if stored is None or unstamped(stored) != unstamped(live_branch) or \
                self.entry_deleted.get((fam, live_idx), set()) != live_deleted:
            archives.append((fam, live_idx, live_branch))
        restored = copy.deepcopy(target)
        if restored and restored[0]["role"] == "user":
            restored[0] = with_stamp(restored[0], len(known | {live_idx}), idx, fam)
        restored, descended, deleted, checkpoints = self._newest_descendants(fam, idx, restored)
        # seed 000 §3.3, a tombstone is one node's: a restored message with the id of one leaving is the same
        # node when it holds the same content (it keeps the state it has now), another one when it does not (an
        # edit or a replace that reused the id: the leaving one's tombstone is not its own)
        leaving = {m["id"]: m for m in live_branch}
        not_its_own: set[str] = set()
        for rec in restored:
            twin = leaving.get(rec["id"])
            if twin is None:
                continue
            if (twin.get("role"), twin.get("blocks")) == (rec.get("role"), rec.get("blocks")):
                if rec["id"] in live_deleted:
                    deleted.add(rec["id"])
                else:
                    deleted.discard(rec["id"])
            elif rec["id"] in live_deleted and rec["id"] not in deleted:
                not_its_own.add(rec["id"])
        merged: dict[str, dict[str, Any]] = {}
        for rec in copy.deepcopy(self.live[:rpos]) + restored:
            merged[rec["id"]] = rec
        new = list(merged.values())
        archives += self._dropped_live(self.live, set(merged), {(fam, live_idx)})
        comes_back = deleted & {m["id"] for m in restored}
        for f, i, branch, gone, cps in descended:  # stored before the rewrite, with their own deletions
            self.entries[(f, i)] = branch
            self.rows[(f, i)] = len(branch)
            self.entry_deleted[(f, i)] = gone
            self.entry_checkpoints[(f, i)] = cps
        self._commit(new, archives, checkpoints)
        self.deleted -= not_its_own
        self.deleted |= comes_back & {m["id"] for m in new}  # the branch's deletions come back with it
        return True

    def _newest_descendants(self, fam: str, idx: int, restored: list[dict[str, Any]]) -> tuple[
            list[dict[str, Any]], list[tuple[str, int, list[dict[str, Any]], set[str], list[Checkpoint]]],
            set[str], list[Checkpoint]]:
        """Seed 000 §3.2 ("follows the newest default descendants when switching"): below the switched root,
        each family of the restored branch comes back on its newest full variant; the variant it held is
        stored first (with its deletions and checkpoints) unless the stored copy is the same."""
        out = restored
        deleted = set(self.entry_deleted.get((fam, idx), set()))
        checkpoints = [copy.deepcopy(c) for c in self.entry_checkpoints.get((fam, idx), [])]
        descended: list[tuple[str, int, list[dict[str, Any]], set[str], list[Checkpoint]]] = []
        seen = {fam}
        i = 1
        while i < len(out):
            rec = out[i]
            f = family(rec) if rec["role"] == "user" else None
            if f is None or f in seen:
                i += 1
                continue
            seen.add(f)
            st = stamped(rec)
            full = sorted(k[1] for k, v in self.entries.items() if k[0] == f and v)
            if st is None or not full or full[-1] <= st:
                i += 1
                continue
            newest = full[-1]
            tail = copy.deepcopy(out[i:])
            ids = {m["id"] for m in tail}
            gone = deleted & ids
            stored = self.entries.get((f, st))
            if stored is None or unstamped(stored) != unstamped(tail) or \
                    self.entry_deleted.get((f, st), set()) != gone:
                descended.append((f, st, tail, gone, [copy.deepcopy(c) for c in checkpoints if c.through in ids]))
            count = meta(rec).get("revisionCount")
            count = max(count if isinstance(count, int) else 0, len({k[1] for k in self.entries if k[0] == f}))
            taken = copy.deepcopy(self.entries[(f, newest)])
            assert taken is not None
            taken[0] = with_stamp(taken[0], count, newest, f)
            out = out[:i] + taken
            deleted = (deleted - ids) | self.entry_deleted.get((f, newest), set())
            checkpoints = [c for c in checkpoints if c.through not in ids] + [
                copy.deepcopy(c) for c in self.entry_checkpoints.get((f, newest), [])]
            i += 1
        return out, descended, deleted, checkpoints
