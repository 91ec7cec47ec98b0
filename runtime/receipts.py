"""Receipt claims: one effect per ``(clientId, submissionId)``, even for requests in flight.

The database (``store/receipts.py``) holds completed receipts; this book holds
what the database cannot say yet:

* a request with a key *claims* it before its effect runs. A second request
  with the same key that arrives meanwhile waits for the first and is then
  answered from it (or refused with ``IDEMPOTENCY_CONFLICT`` when it is a
  different request); so two concurrent requests with one key — on one
  session or on two — run the effect once;
* a completed claim keeps the terminal response until the database surely
  holds the receipt (``pin`` until an index sequence covers it: an append's
  receipt rides in its line and reaches ``command_receipts`` with the index
  rows), then it is *retired*; a bounded number of recent unpinned answers
  stay for cheap replays (at most ``keep`` of them and ``keep_bytes`` of their
  approximate JSON size: an answer larger than that is not kept at all, the
  database's row answers its retry);
* a failed request releases its claim: a waiter (or a later retry) runs the
  request itself.

Single trio thread, no locks. Bounded: claims in flight are bounded by the
requests in flight, pinned ones by the index lag bound, the rest by ``keep``
and ``keep_bytes``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import trio

from protocol.jsonrpc import json_size_upto
from store.receipts import ReceiptKey, conflict

__all__ = ["KEEP_BYTES", "Claim", "ReceiptBook", "Replayed"]

_Id = tuple[str, str]

KEEP_BYTES = 32 * 1024 * 1024
"""The recent answers' budget (their JSON size, ``protocol.jsonrpc.json_size_upto``): 4,096 answers of a
queue's 8 MiB would be 32 GiB."""


@dataclass
class _Entry:
    key: ReceiptKey
    done: bool = False
    response: Any = None
    pinned_until: int | None = None
    finished: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, slots=True)
class Replayed:
    """The key's request already completed here: answer with ``response``."""

    response: Any


class Claim:
    """The right to run the request of ``key``; settle it exactly once."""

    __slots__ = ("_book", "_entry", "_settled")

    def __init__(self, book: ReceiptBook, entry: _Entry) -> None:
        self._book = book
        self._entry = entry
        self._settled = False

    @property
    def key(self) -> ReceiptKey:
        return self._entry.key

    def complete(self, response: Any, *, pin_until: int | None = None) -> None:
        """The request succeeded with ``response`` (durable in the database, or at ``pin_until``)."""
        if self._settled:
            return
        self._settled = True
        self._book._complete(self._entry, response, pin_until)

    def release(self) -> None:
        """The request failed: forget the claim; a waiter runs the request itself."""
        if self._settled:
            return
        self._settled = True
        self._book._release(self._entry)


class ReceiptBook:
    def __init__(self, *, keep: int = 4096, keep_bytes: int = KEEP_BYTES) -> None:
        self._entries: dict[_Id, _Entry] = {}
        self._recent: OrderedDict[_Id, int] = OrderedDict()  # done and unpinned, oldest first: their sizes
        self._recent_bytes = 0
        self._pinned: dict[_Id, int] = {}
        self._pin_order: list[tuple[int, _Id]] = []
        """``(until, ident)`` of every pin, a heap: :meth:`retire_through` takes only those it retires."""
        self._keep = keep
        self._keep_bytes = keep_bytes

    async def claim(self, key: ReceiptKey) -> Claim | Replayed:
        """Claim ``key``, or wait for the request holding it and replay its answer.

        Raises ``IDEMPOTENCY_CONFLICT`` when the key is held (or was answered
        here) for a different request.
        """
        ident = (key.client_id, key.submission_id)
        while True:
            entry = self._entries.get(ident)
            if entry is None:
                entry = _Entry(key)
                self._entries[ident] = entry
                return Claim(self, entry)
            if entry.key.fingerprint != key.fingerprint or entry.key.method != key.method:
                raise conflict(key, entry.key.method)
            if entry.done:
                return Replayed(entry.response)
            await entry.finished.wait()

    def claim_nowait(self, key: ReceiptKey) -> Claim | None:
        """Claim ``key`` if nobody holds it and no answer of it is remembered; ``None`` otherwise
        (then :meth:`claim` says what to do: wait, replay or refuse)."""
        ident = (key.client_id, key.submission_id)
        if ident in self._entries:
            return None
        entry = _Entry(key)
        self._entries[ident] = entry
        return Claim(self, entry)

    def retire_through(self, seq: int) -> None:
        """Every pinned answer whose receipt row the index now holds (``seq`` covered) may go."""
        order = self._pin_order
        while order and order[0][0] <= seq:
            until, ident = heapq.heappop(order)
            if self._pinned.get(ident) == until:
                del self._pinned[ident]
                self._remember(ident)

    def statistics(self) -> dict[str, int]:
        running = sum(1 for e in self._entries.values() if not e.done)
        return {"running": running, "pinned": len(self._pinned), "recent": len(self._recent)}

    # -- internals -------------------------------------------------------------
    def _complete(self, entry: _Entry, response: Any, pin_until: int | None) -> None:
        entry.done = True
        entry.response = response
        ident = (entry.key.client_id, entry.key.submission_id)
        if pin_until is not None:
            self._pinned[ident] = pin_until
            heapq.heappush(self._pin_order, (pin_until, ident))
        else:
            self._remember(ident)
        entry.finished.set()

    def _remember(self, ident: _Id) -> None:
        """Keep a durable answer for cheap replays, within ``keep`` answers and ``keep_bytes``; its receipt
        row is in the database, so forgetting it (even at once, when it alone is over the budget) loses
        nothing: a retry reads the row."""
        entry = self._entries.get(ident)
        size = json_size_upto(entry.response, self._keep_bytes) if entry is not None else 0
        if size > self._keep_bytes:
            self._entries.pop(ident, None)
            return
        self._recent[ident] = size
        self._recent_bytes += size
        while len(self._recent) > self._keep or self._recent_bytes > self._keep_bytes:
            old, old_size = self._recent.popitem(last=False)
            self._recent_bytes -= old_size
            self._entries.pop(old, None)

    def _release(self, entry: _Entry) -> None:
        ident = (entry.key.client_id, entry.key.submission_id)
        if self._entries.get(ident) is entry:
            del self._entries[ident]
        entry.finished.set()
