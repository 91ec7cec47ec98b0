"""The event bus: cursor-numbered events, a bounded replay backlog, bounded subscribers.

``publish()`` is synchronous and never blocks (call it from the trio thread): it
assigns the next cursor, appends to a ring backlog and offers the event to every
matching subscriber. A subscriber whose queue is full is *overflowed*: it gets
nothing more and its reader learns it (``SubscriberOverflow``,
``wait_overflowed()``); the gateway then closes that connection (1013) and the
client resubscribes with the last cursor it saw, which replays the gap from the
backlog, or fails with ``CURSOR_EXPIRED`` if the backlog no longer holds it.
Memory is bounded by ``backlog + subscribers * (subscriber_queue + transient_keys)``
event references, and the backlog also by bytes: ``backlog_bytes`` of the events'
``size`` (what the publisher says its payload weighs — a ``session.message``
passes its record's line length — or else a bounded count of its JSON, at least
``EVENT_BYTES_ESTIMATE``); the oldest events
leave first, so a burst of large records shortens how far back a client can
resume instead of growing the host.

**Transient events** (``publish_transient``: live previews such as an in-flight
checkpoint of a streaming reply) are coalescing and throttled *per subscriber*:

* they are not numbered (their ``cursor`` repeats the newest numbered event the
  subscriber got, so a client's resume cursor stays right and never goes
  back), never in the backlog, never replayed;
* each has a ``key`` (e.g. session + message id); a subscriber holds at most one
  undelivered event per key — a newer one replaces it (the newest wins);
* a key is delivered to a subscriber at most once per ``transient_interval``
  seconds; the newest pending one goes out when the interval has passed;
* a transient event is never delivered before a numbered event that was
  published before it, and a numbered event that *supersedes* its key (the
  ``supersedes`` function of the bus, e.g. the final ``session.message`` of the
  same message) drops the pending one, so a preview never follows the final;
* at most ``transient_keys`` keys wait per subscriber (the oldest is dropped
  beyond that: the next preview of that key replaces it anyway).

Topics: a subscription lists exact topic names, ``"*"`` (everything) or
``"prefix.*"`` (every topic starting with ``"prefix."``). With ``session_id`` set
it only sees events published with that session id.

Cursors start at 1 for each bus (each host boot); a cursor from the future (e.g.
from a previous boot) is treated as expired so the client resynchronises.

``validate`` (tests): called with ``(topic, data)`` before anything is
published; whatever it raises reaches the publisher (a payload that does not
match its protocol model is a host bug).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import trio

from protocol.jsonrpc import json_size_upto

__all__ = [
    "Event",
    "EventBus",
    "EventBusStatistics",
    "EventWire",
    "Subscription",
    "SubscriptionStatistics",
    "CursorExpired",
    "SubscriberOverflow",
    "InvalidTopics",
    "TRANSIENT_INTERVAL",
    "EVENT_BYTES_ESTIMATE",
]

TRANSIENT_INTERVAL: Final = 0.25
"""Default: a transient key reaches one subscriber at most every 250 ms."""
TRANSIENT_KEYS: Final = 64

MAX_TOPICS: Final = 64
MAX_TOPIC_CHARS: Final = 128
EVENT_BYTES_ESTIMATE: Final = 512
"""What an event weighs in the backlog's byte bound when its publisher does not say (and at least)."""


class CursorExpired(Exception):
    """The requested resume cursor is no longer (or not yet) in the backlog."""

    code = "CURSOR_EXPIRED"

    def __init__(self, cursor: int, oldest: int, head: int) -> None:
        super().__init__(
            f"cursor {cursor} cannot be resumed: retained events are {oldest}..{head}; "
            "resubscribe without a cursor and resynchronise"
        )
        self.message = str(self)
        self.data = {"cursor": cursor, "oldestCursor": oldest, "headCursor": head}


class SubscriberOverflow(Exception):
    """The subscriber did not keep up and its bounded queue overflowed."""

    code = "SUBSCRIBER_OVERFLOW"

    def __init__(self, last_delivered: int) -> None:
        super().__init__(f"subscriber overflowed; resume from cursor {last_delivered}")
        self.message = str(self)
        self.data = {"cursor": last_delivered}


class InvalidTopics(ValueError):
    code = "INVALID_PARAMS"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = {}


class EventWire:
    """One event's encoding, shared by every subscriber of every connection (the gateway's: a long
    event's ``data`` is encoded once, in a worker thread, not once per subscriber on the trio loop)."""

    __slots__ = ("long", "data", "ready")

    def __init__(self) -> None:
        self.long: bool | None = None
        """Whether ``data`` is long enough to be encoded off the trio loop (``None``: not looked at yet)."""
        self.data: bytes | None = None
        """``data`` as JSON once encoded (``b""``: it holds something JSON cannot)."""
        self.ready: trio.Event | None = None
        """Set when the encoding under way ended (``data`` stays ``None`` if it was cancelled)."""


@dataclass(frozen=True, slots=True)
class Event:
    cursor: int
    topic: str
    data: dict[str, Any]
    session_id: str | None = None
    key: str | None = None
    """Transient events only: the coalescing key (not numbered, never replayed)."""
    size: int = 0
    """What the event weighs in the backlog's byte bound (numbered events)."""
    wire: EventWire = field(default_factory=EventWire, compare=False, repr=False)

    @property
    def transient(self) -> bool:
        return self.key is not None


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    subscription_id: int
    queued: int
    capacity: int
    delivered: int
    overflowed: bool
    transient_pending: int = 0
    transient_coalesced: int = 0
    """Transient events replaced by a newer one (or dropped) before delivery."""


@dataclass(frozen=True, slots=True)
class EventBusStatistics:
    head_cursor: int
    oldest_cursor: int
    backlog_used: int
    backlog_capacity: int
    backlog_bytes: int
    backlog_bytes_capacity: int
    subscribers: int
    published_total: int
    overflowed_total: int
    peak_subscriber_queue: int
    transient_published: int = 0


def _validate_topics(topics: Iterable[str]) -> frozenset[str]:
    if isinstance(topics, str):
        raise InvalidTopics("topics must be a list of strings, not a string")
    result = frozenset(topics)
    if not result:
        raise InvalidTopics("topics must not be empty")
    if len(result) > MAX_TOPICS:
        raise InvalidTopics(f"at most {MAX_TOPICS} topics per subscription")
    for topic in result:
        if not isinstance(topic, str) or not topic or len(topic) > MAX_TOPIC_CHARS:
            raise InvalidTopics(f"each topic must be a non-empty string of at most {MAX_TOPIC_CHARS} chars")
    return result


def _matches(patterns: frozenset[str], topic: str) -> bool:
    if topic in patterns or "*" in patterns:
        return True
    return any(p.endswith(".*") and topic.startswith(p[:-1]) for p in patterns)


@dataclass(eq=False)
class Subscription:
    """One subscriber's bounded view of the bus. Receive with :meth:`receive`."""

    id: int
    topics: frozenset[str]
    session_id: str | None
    start_cursor: int  # bus head when subscribed; replayed events come before it
    _bus: EventBus
    _capacity: int
    accept: Callable[[Event], bool] | None = None
    """Beyond topics and session: which events this subscriber may see at all (a plugin: its own data)."""
    _interval: float = TRANSIENT_INTERVAL
    _max_keys: int = TRANSIENT_KEYS
    _replay: deque[Event] = field(default_factory=deque)
    _queue: deque[Event] = field(default_factory=deque)
    _latest: dict[str, Event] = field(default_factory=dict)
    """Transient key → the newest undelivered event of that key (insertion order = age)."""
    _due: dict[str, float] = field(default_factory=dict)
    """Transient key → the earliest time its next event may be delivered."""
    _wake: trio.Event = field(default_factory=trio.Event)
    _overflowed: trio.Event = field(default_factory=trio.Event)
    _closed: bool = False
    _delivered: int = 0
    _coalesced: int = 0
    _last_cursor: int = 0

    def wants(self, event: Event) -> bool:
        if self.session_id is not None and event.session_id != self.session_id:
            return False
        if self.accept is not None and not self.accept(event):
            return False
        return _matches(self.topics, event.topic)

    @property
    def overflowed(self) -> bool:
        return self._overflowed.is_set()

    @property
    def last_cursor(self) -> int:
        """Cursor of the last event handed out by :meth:`receive` (0 if none)."""
        return self._last_cursor

    def _notify(self) -> None:
        self._wake.set()

    def _offer(self, event: Event, supersedes: str | None = None) -> bool:
        """A numbered event (called by the bus). Returns False when this offer overflowed the queue."""
        if self._overflowed.is_set() or self._closed:
            return True
        if len(self._queue) >= self._capacity:
            self._overflowed.set()
            self._notify()
            return False
        if supersedes is not None and self._latest.pop(supersedes, None) is not None:
            self._coalesced += 1
        self._queue.append(event)
        self._notify()
        return True

    def _offer_transient(self, event: Event) -> None:
        """A transient event (called by the bus): the newest per key wins."""
        if self._overflowed.is_set() or self._closed:
            return
        assert event.key is not None
        if self._latest.pop(event.key, None) is not None:
            self._coalesced += 1
        elif len(self._latest) >= self._max_keys:
            oldest = next(iter(self._latest))
            del self._latest[oldest]
            self._coalesced += 1
        self._latest[event.key] = event
        if len(self._due) > 4 * self._max_keys:
            now = trio.current_time()
            self._due = {k: t for k, t in self._due.items() if t > now or k in self._latest}
        self._notify()

    def queued(self) -> int:
        return len(self._replay) + len(self._queue)

    def _take(self, now: float) -> Event | None:
        """The next deliverable event, in order (a due transient before later numbered ones)."""
        best: Event | None = None
        for key, event in self._latest.items():
            if self._due.get(key, -math.inf) <= now and (best is None or event.cursor < best.cursor):
                best = event
        head = self._queue[0] if self._queue else None
        if head is not None and (best is None or head.cursor <= best.cursor):
            return self._queue.popleft()
        if best is not None:
            assert best.key is not None
            del self._latest[best.key]
            self._due[best.key] = now + self._interval
        return best

    def _next_due(self) -> float:
        return min((self._due.get(k, -math.inf) for k in self._latest), default=math.inf)

    def receive_nowait(self) -> Event:
        """The next event if one is deliverable now; ``trio.WouldBlock`` otherwise."""
        if self._overflowed.is_set():
            raise SubscriberOverflow(self._last_cursor)
        if self._closed:
            raise trio.EndOfChannel
        event = self._replay.popleft() if self._replay else self._take(trio.current_time())
        if event is None:
            raise trio.WouldBlock
        return self._handed_out(event)

    def _handed_out(self, event: Event) -> Event:
        self._delivered += 1
        if event.transient and event.cursor < self._last_cursor:
            # what this subscriber saw last: its cursor sequence never goes back
            event = replace(event, cursor=self._last_cursor)
        self._last_cursor = max(self._last_cursor, event.cursor)
        return event

    async def receive(self) -> Event:
        """Next event in cursor order (transient ones as their interval allows).

        Raises ``SubscriberOverflow`` once overflowed and ``trio.EndOfChannel``
        after :meth:`close`.
        """
        while True:
            if self._overflowed.is_set():
                raise SubscriberOverflow(self._last_cursor)
            if self._closed:
                raise trio.EndOfChannel
            # a cancellation lands before an event is taken, never between taking and returning it
            await trio.lowlevel.checkpoint_if_cancelled()
            if self._replay:
                event = self._replay.popleft()
                await trio.lowlevel.cancel_shielded_checkpoint()
                break
            found = self._take(trio.current_time())
            if found is not None:
                event = found
                await trio.lowlevel.cancel_shielded_checkpoint()
                break
            self._wake = trio.Event()
            with trio.move_on_at(self._next_due()):
                await self._wake.wait()
        return self._handed_out(event)

    async def wait_overflowed(self) -> None:
        await self._overflowed.wait()

    def close(self) -> None:
        """Unsubscribe (idempotent). Pending receivers get ``EndOfChannel``."""
        self._bus._remove(self)
        self._closed = True
        self._queue.clear()
        self._latest.clear()
        self._replay.clear()
        self._notify()

    def statistics(self) -> SubscriptionStatistics:
        return SubscriptionStatistics(
            subscription_id=self.id,
            queued=self.queued(),
            capacity=self._capacity,
            delivered=self._delivered,
            overflowed=self.overflowed,
            transient_pending=len(self._latest),
            transient_coalesced=self._coalesced,
        )


class EventBus:
    """Publish/subscribe with monotonically increasing cursors and bounded memory."""

    def __init__(
        self,
        backlog: int = 10_000,
        subscriber_queue: int = 1024,
        *,
        backlog_bytes: int = 16 * 1024 * 1024,
        transient_interval: float = TRANSIENT_INTERVAL,
        transient_keys: int = TRANSIENT_KEYS,
        supersedes: Callable[[Event], str | None] | None = None,
        validate: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        if backlog < 1 or subscriber_queue < 1 or transient_keys < 1 or backlog_bytes < 1:
            raise ValueError("backlog, backlog_bytes, subscriber_queue and transient_keys must be >= 1")
        if transient_interval < 0:
            raise ValueError("transient_interval must be >= 0")
        self._backlog: deque[Event] = deque()
        self._backlog_max = backlog
        self._backlog_bytes_max = backlog_bytes
        self._backlog_bytes = 0
        self._subscriber_queue = subscriber_queue
        self._transient_interval = transient_interval
        self._transient_keys = transient_keys
        self._supersedes = supersedes
        self._validate = validate
        self._transient_published = 0
        self._subscribers: dict[int, Subscription] = {}
        self._ids = itertools.count(1)
        self._head = 0
        self._overflowed_total = 0
        self._peak_queue = 0

    @property
    def head_cursor(self) -> int:
        return self._head

    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None,
                size: int | None = None) -> int:
        """Record and fan out one event; never blocks. Returns its cursor. ``size``: what its payload
        weighs in bytes, about, for the backlog's byte bound (default: a bounded count of ``data``'s JSON;
        at least ``EVENT_BYTES_ESTIMATE`` either way)."""
        if self._validate is not None:
            self._validate(topic, data)
        self._head += 1
        # unsized: weighed by a bounded count of its JSON (a glance for a small payload; a session.queue
        # event carries every entry's prompt, megabytes), so no publisher can slip past the byte bound
        weight = max(json_size_upto(data, self._backlog_bytes_max) if size is None else size, EVENT_BYTES_ESTIMATE)
        event = Event(cursor=self._head, topic=topic, data=data, session_id=session_id, size=weight)
        self._backlog.append(event)
        self._backlog_bytes += weight
        while len(self._backlog) > 1 and (len(self._backlog) > self._backlog_max
                                          or self._backlog_bytes > self._backlog_bytes_max):
            self._backlog_bytes -= self._backlog.popleft().size
        if not self._subscribers:  # kept in the backlog for a resume; nobody to offer it to now
            return event.cursor
        supersedes = self._supersedes(event) if self._supersedes is not None else None
        for sub in list(self._subscribers.values()):
            if not sub.wants(event):
                continue
            if not sub._offer(event, supersedes):
                self._overflowed_total += 1
                self._subscribers.pop(sub.id, None)
            else:
                self._peak_queue = max(self._peak_queue, sub.queued())
        return event.cursor

    def publish_transient(self, topic: str, data: dict[str, Any], *, key: str,
                          session_id: str | None = None) -> None:
        """Offer a transient (coalescing, throttled, unnumbered) event; never blocks."""
        if self._validate is not None:
            self._validate(topic, data)
        self._transient_published += 1
        event = Event(cursor=self._head, topic=topic, data=data, session_id=session_id, key=key)
        for sub in list(self._subscribers.values()):
            if sub.wants(event):
                sub._offer_transient(event)

    def _oldest(self) -> int:
        return self._backlog[0].cursor if self._backlog else self._head + 1

    def subscribe(
        self,
        topics: Iterable[str],
        *,
        session_id: str | None = None,
        cursor: int | None = None,
        accept: Callable[[Event], bool] | None = None,
    ) -> Subscription:
        """Subscribe; with ``cursor``, first replay retained matching events after it. ``accept``: which
        events the subscriber may see at all, whatever its topics (replayed ones too)."""
        patterns = _validate_topics(topics)
        replay: deque[Event] = deque()
        if cursor is not None:
            if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
                raise InvalidTopics("cursor must be a non-negative integer")
            oldest = self._oldest()
            if cursor > self._head or cursor + 1 < oldest:
                raise CursorExpired(cursor, oldest, self._head)
        sub = Subscription(
            id=next(self._ids),
            topics=patterns,
            session_id=session_id,
            start_cursor=self._head,
            _bus=self,
            _capacity=self._subscriber_queue,
            accept=accept,
            _interval=self._transient_interval,
            _max_keys=self._transient_keys,
            _replay=replay,
        )
        if cursor is not None:
            replay.extend(e for e in self._backlog if e.cursor > cursor and sub.wants(e))
        self._subscribers[sub.id] = sub
        return sub

    def _remove(self, sub: Subscription) -> None:
        self._subscribers.pop(sub.id, None)

    def statistics(self) -> EventBusStatistics:
        return EventBusStatistics(
            head_cursor=self._head,
            oldest_cursor=self._oldest(),
            backlog_used=len(self._backlog),
            backlog_capacity=self._backlog_max,
            backlog_bytes=self._backlog_bytes,
            backlog_bytes_capacity=self._backlog_bytes_max,
            subscribers=len(self._subscribers),
            published_total=self._head,
            overflowed_total=self._overflowed_total,
            peak_subscriber_queue=self._peak_queue,
            transient_published=self._transient_published,
        )
