"""The history state machine, extended with what its reads and its receipts promise.

:class:`~tests.history.test_history_property.HistoryMachine` checks the files, the index rows, the
revision rows and ``session.context`` after every step. This machine runs the same rules (and that
invariant) and adds:

* ``db_loss``: stop the host, delete ``pi.sqlite`` (+ ``-wal``, ``-shm``) and start it again. Boot
  rebuilds the index from the transcripts and the revisions files (ARCHITECTURE.md "Durability":
  a missing ``pi.sqlite`` is rebuilt from the files; seed 003 §11.13: revisions live in
  ``<id>.revisions.jsonl``); tombstones and compaction checkpoints are transcript lines, so the
  model (every read it predicts) is unchanged;
* ``retry_last`` (and ``retry_earlier``, any earlier keyed write): every write is keyed
  (``submissionId``); one is sent again on a new connection with the same ``clientId`` and the same
  params, right away, after a restart or after a lost database: the answer equals the first answer and
  nothing changes (seed 000 §2.4, protocol/README.md §4). After a lost database only the methods whose
  receipt rides in a file (README §4's table: create / fork in the new header, appendMessage in its
  line or an archived branch's copy of it, truncateFrom / replaceMessages / activateRevision in the
  rewritten header) are retried; the others' receipts were database rows. A header receipt's answer is
  rebuilt from the session's current row (``rebuild_response``), so for an earlier one of those only
  what it did is compared (see :func:`stable`);
* ``search_agrees``: every message text carries a marker and a unique token; searching the marker in
  the session finds exactly the live, not tombstoned user/assistant messages (seed 003 §4.8: the
  index holds user/assistant text; tombstoned rows never match; archived branches are not in the
  transcript), ``search.sessions`` counts them, and each recent token (live or gone: truncated away,
  tombstoned, replaced, archived) finds its message exactly when it is searchable; the same for tool
  rows' output (``scope: "tools"``) and for the copies in fork children;
* ``paging_agrees``: reading the session backwards (``messageBefore`` + a small ``messageLimit``) and
  forwards (``messageEnd``) rebuilds exactly the full read, with the same seqs.

CI-sized (derandomized, a fixed number of examples and steps); ``PIHOST_SOAK=1`` runs more.
"""

from __future__ import annotations

import copy
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import trio
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.history.history_model import HistoryModel, text
from tests.history.test_history_property import SID, HistoryMachine, ThreadHost, wire
from tests.hostkit import RunningHost, client_for, inprocess_host
from tests.soak import soak

MARK = "zqmark"
SEARCHABLE = ("user", "assistant")
KEYED = frozenset({"session.create", "session.appendMessage", "session.truncateFrom", "session.saveActiveRevision",
                   "session.activateRevision", "session.appendCompaction", "session.deleteMessage",
                   "session.restoreMessage", "session.replaceMessages", "session.fork"})
FILE_RECEIPTS = frozenset({"session.create", "session.appendMessage", "session.truncateFrom", "session.replaceMessages",
                           "session.activateRevision", "session.fork"})
"""Keyed writes whose receipt rides in a file (protocol/README.md §4): a retry after a lost database is
still answered from the receipt (the request is not run again)."""
REBUILT = frozenset({"session.create", "session.fork", "session.truncateFrom", "session.replaceMessages",
                     "session.activateRevision"})
"""Receipts a lost database gets back from a transcript header, their answer rebuilt from the session's
current row (store/indexing/reconcile.py ``rebuild_response``)."""


def stable(method: str, answer: dict[str, Any]) -> Any:
    """What an answer rebuilt from a header keeps of the first one: whose it is and what it did."""
    if method in ("session.create", "session.fork"):
        return answer["id"]
    return (answer["session"]["id"], answer.get("removed"),
            [r["rootUserId"] for r in answer.get("revisions", [])][:1])


@dataclass
class Write:
    method: str
    params: dict[str, Any]
    answer: Any
    db_lost: bool = False
    """The database was lost since this write."""
    replaced: bool = False
    """A replaceMessages came after it (its lines are the client's copies: no receipt in them)."""


class ReadsHost(ThreadHost):
    """:class:`ThreadHost` that keeps the running host, to open more connections and to lose its database."""

    def __init__(self, root: Path) -> None:
        self.running: RunningHost | None = None
        super().__init__(root)

    @asynccontextmanager
    async def _opened(self) -> AsyncIterator[None]:
        try:
            async with inprocess_host(self.root) as host, client_for(host) as c:
                self.running, self.client = host, c
                yield
        finally:
            self.running, self.client = None, None

    def call_fresh(self, method: str, params: dict[str, Any]) -> Any:
        """One call on a new connection with the same ``clientId`` as the main one."""
        async def go() -> Any:
            assert self.running is not None
            with trio.fail_after(30):
                async with client_for(self.running) as c:
                    return await c.call(method, params)

        return self.run(go)

    def lose_db(self) -> None:
        self.stop()
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (self.root / name).unlink(missing_ok=True)
        self.start()


def tokens_of(rec: dict[str, Any]) -> list[str]:
    return [w for w in text(rec).split() if w.startswith(MARK)]


class ReadsMachine(HistoryMachine):
    def __init__(self) -> None:  # noqa: D107 - the parent's, with a ReadsHost
        RuleBasedStateMachine.__init__(self)
        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name)
        self.rhost = ReadsHost(self.root)
        self.host = self.rhost
        self.model = HistoryModel()
        self.n = 0
        self.subs = 0
        self.children: list[tuple[str, int]] = []
        """(fork child id, how many of its messages a search finds), oldest first."""
        self.writes: list[Write] = []
        """Every keyed write that succeeded, oldest first."""
        self.issued: list[tuple[str, str]] = []
        """(token, message id), oldest first."""

    # ------------------------------------------------------------------ keyed writes, tokened texts
    @initialize()
    def create(self) -> None:
        self.call("session.create", title="prop")

    def call(self, method: str, **params: Any) -> Any:
        full = {"sessionId": SID, **params}
        if method in KEYED:
            self.subs += 1
            full["submissionId"] = f"sub-{self.subs}"
        out = self.host.call(method, full)
        if method == "session.fork":
            through = params.get("throughMessageId")
            prefix = self.model.live[: self.model.position(through) + 1] if through else self.model.live
            self.children.append((out["id"], sum(1 for m in prefix if m["role"] in SEARCHABLE
                                                 and m["id"] not in self.model.deleted and tokens_of(m))))
        if method == "session.replaceMessages":
            for w in self.writes:
                w.replaced = True
        if method in KEYED:
            self.writes.append(Write(method, copy.deepcopy(full), copy.deepcopy(out)))
        return out

    def token(self, mid: str) -> str:
        tok = f"{MARK}{uuid.uuid4().hex[:12]}"
        self.issued.append((tok, mid))
        return tok

    def tokened(self, rec: dict[str, Any], base: str | None = None) -> dict[str, Any]:
        out = copy.deepcopy(rec)
        body = text(rec) if base is None else base
        out["blocks"][0]["text"] = f"{body} {self.token(rec['id'])}"
        return out

    def _record(self, role: str) -> dict[str, Any]:
        return self.tokened(super()._record(role))

    def append(self, rec: dict[str, Any]) -> None:
        super().append(rec if tokens_of(rec) else self.tokened(rec))

    @precondition(lambda self: bool(self.model.live))
    @rule(keep=st.lists(st.booleans(), min_size=1, max_size=80), change=st.integers(0, 1_000), add=st.booleans())
    def replace_messages(self, keep: list[bool], change: int, add: bool) -> None:
        """The parent's rule, with a new token in the changed text (the old one must stop matching)."""
        live = self.model.live
        new = [dict(m) for i, m in enumerate(live) if keep[i % len(keep)]]
        if new:
            j = change % len(new)
            new[j] = self.tokened(new[j], f"changed {new[j]['id']}")
        if add:
            new.append(self._record("assistant"))
        out = self.call("session.replaceMessages", messages=[wire(m) for m in new])
        self.model.replace(new)
        assert out["session"]["messageCount"] == len(new)

    # ------------------------------------------------------------------ new rules
    @rule()
    def db_loss(self) -> None:
        self.rhost.lose_db()
        for w in self.writes:
            w.db_lost = True

    def retry(self, w: Write) -> None:
        """Send ``w`` again on a new connection: the first answer, and (the invariants check) no change."""
        if w.db_lost and w.method not in FILE_RECEIPTS:
            return  # its receipt was a database row (README §4): nothing promises its answer now
        if w.db_lost and w.method == "session.appendMessage" and (
                w.replaced or w.params["message"]["id"] not in self.held()):
            return  # the line that carried its receipt is gone (a plain truncate dropped it)
        got = self.rhost.call_fresh(w.method, w.params)
        if w.db_lost and w.method in REBUILT and w is not self.writes[-1]:
            # A receipt row rebuilt from a transcript header answers with the session as it is now
            # (store/receipts.py; README §4 promises the stored answer across a lost database only
            # where it says so): the request is still not run again, and what it did is answered.
            assert stable(w.method, got) == stable(w.method, w.answer), w.method
        else:
            assert got == w.answer, w.method

    def held(self) -> set[str]:
        """Ids of the lines the transcript and the archived branches hold (reconcile restores an append's
        receipt from either: ``restore_archived_receipts``)."""
        return set(self.model.ids()) | {m["id"] for k in self.model.full_entries() for m in self.model.entries[k] or ()}

    @precondition(lambda self: bool(self.writes))
    @rule()
    def retry_last(self) -> None:
        self.retry(self.writes[-1])

    @precondition(lambda self: bool(self.writes))
    @rule()
    def retry_last_after_restart(self) -> None:
        self.host.restart()
        self.retry(self.writes[-1])

    @precondition(lambda self: bool(self.writes))
    @rule()
    def retry_last_after_db_loss(self) -> None:
        self.db_loss()
        self.retry(self.writes[-1])

    @precondition(lambda self: bool(self.writes))
    @rule(i=st.integers(0, 1_000))
    def retry_earlier(self, i: int) -> None:
        """Any earlier keyed write whose receipt is still there (later writes may have rewritten,
        truncated or archived what it did): still its first answer, and nothing else."""
        self.retry(self.pick(self.writes, i))

    # ------------------------------------------------------------------ new invariants
    def searchable(self) -> dict[str, str]:
        """token → id of every message a search finds."""
        return {tok: m["id"] for m in self.model.live
                if m["role"] in SEARCHABLE and m["id"] not in self.model.deleted for tok in tokens_of(m)}

    def query(self, query: str, session: str | None, scope: str = "messages") -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": query, "limit": 500, "scope": scope}
        if session is not None:
            params["sessionId"] = session
        hits: list[dict[str, Any]] = []
        while True:
            got = self.host.call("search.query", params)
            hits += got["results"]
            if not got.get("nextCursor"):
                return hits
            params["cursor"] = got["nextCursor"]

    @invariant()
    def search_agrees(self) -> None:
        found = self.searchable()
        want = sorted(found.values())
        pos = {m["id"]: (i + 1, m["role"]) for i, m in enumerate(self.model.live)}
        hits = self.query(MARK, SID)
        assert sorted(h["messageId"] for h in hits) == want
        assert all((h["seq"], h["role"]) == pos[h["messageId"]] for h in hits)
        res = self.host.call("search.sessions", {"query": MARK, "limit": 100})["results"]
        mine = [r for r in res if r["sessionId"] == SID]
        assert (mine[0]["messageMatches"] if mine else 0) == len(want)
        tool_found = {tok: m["id"] for m in self.model.live
                      if m["role"] == "tool" and m["id"] not in self.model.deleted for tok in tokens_of(m)}
        tools = sorted(tool_found.values())
        tool_hits = self.query(MARK, SID, "tools")  # a tool row's text blocks are its output (README §6)
        assert sorted(h["messageId"] for h in tool_hits) == tools
        assert all((h["seq"], h["role"]) == pos[h["messageId"]] for h in tool_hits)
        for child, count in self.children[-2:]:  # a fork's copies are found in the child, as its own rows
            assert len({h["messageId"] for h in self.query(MARK, child)}) == count, child
        live = {tok for m in self.model.live for tok in tokens_of(m)}
        gone = [(t, mid) for t, mid in self.issued if t not in found and t not in tool_found]
        alive = [(t, mid) for t, mid in self.issued if t in found or t in tool_found]
        for tok, mid in alive[-3:] + gone[-3:]:
            for scope, where in (("messages", found), ("tools", tool_found)):
                ids = [h["messageId"] for h in self.query(tok, None, scope) if h["sessionId"] == SID]
                assert ids == ([mid] if tok in where else []), (scope, tok, mid, tok in live)

    @invariant()
    def paging_agrees(self) -> None:
        full = self.call("session.get", full=True)
        whole = full["messages"]
        limit = 1 + len(self.issued) % 3
        back: list[dict[str, Any]] = []
        page = self.call("session.get", messageLimit=limit)
        while True:
            assert page["totalMessages"] == len(whole)
            assert page["compactions"] == full["compactions"]  # every checkpoint, whichever window
            back = page["messages"] + back
            if not page["hasMoreBefore"]:
                break
            page = self.call("session.get", messageBefore=page["messageStart"], messageLimit=limit)
        assert back == whole
        fwd: list[dict[str, Any]] = []
        end = 0
        while True:
            page = self.call("session.get", messageEnd=end, messageLimit=limit)
            assert page["messageStart"] == end
            assert (page["totalMessages"], page["compactions"]) == (len(whole), full["compactions"])
            fwd += page["messages"]
            end = page["messageEnd"]
            if not page["hasMoreAfter"]:
                break
        assert fwd == whole
        assert [m["seq"] for m in whole] == list(range(1, len(whole) + 1))


def test_reads_and_retries_match_the_model() -> None:
    run_state_machine_as_test(
        ReadsMachine,
        settings=settings(max_examples=soak(8, 60), stateful_step_count=soak(40, 80), deadline=None,
                          derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]),
    )
