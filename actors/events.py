"""The event bus: cursor-numbered events, a bounded replay backlog, bounded subscribers.

``publish()`` is synchronous and never blocks (call it from the trio thread): it
assigns the next cursor, appends to a ring backlog and offers the event to every
matching subscriber with ``send_nowait``. A subscriber whose queue is full is
*overflowed*: it gets nothing more and its reader learns it (``SubscriberOverflow``,
``wait_overflowed()``); the gateway then closes that connection (1013) and the
client resubscribes with the last cursor it saw, which replays the gap from the
backlog, or fails with ``CURSOR_EXPIRED`` if the backlog no longer holds it.
Memory is bounded by ``backlog + subscribers * subscriber_queue`` event references.

Topics: a subscription lists exact topic names, ``"*"`` (everything) or
``"prefix.*"`` (every topic starting with ``"prefix."``). With ``session_id`` set
it only sees events published with that session id.

Cursors start at 1 for each bus (each host boot); a cursor from the future (e.g.
from a previous boot) is treated as expired so the client resynchronises.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import trio

__all__ = [
    "Event",
    "EventBus",
    "EventBusStatistics",
    "Subscription",
    "SubscriptionStatistics",
    "CursorExpired",
    "SubscriberOverflow",
    "InvalidTopics",
]

MAX_TOPICS: Final = 64
MAX_TOPIC_CHARS: Final = 128


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


@dataclass(frozen=True, slots=True)
class Event:
    cursor: int
    topic: str
    data: dict[str, Any]
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    subscription_id: int
    queued: int
    capacity: int
    delivered: int
    overflowed: bool


@dataclass(frozen=True, slots=True)
class EventBusStatistics:
    head_cursor: int
    oldest_cursor: int
    backlog_used: int
    backlog_capacity: int
    subscribers: int
    published_total: int
    overflowed_total: int
    peak_subscriber_queue: int


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
    _send: trio.MemorySendChannel[Event]
    _recv: trio.MemoryReceiveChannel[Event]
    _capacity: int
    _replay: deque[Event] = field(default_factory=deque)
    _overflowed: trio.Event = field(default_factory=trio.Event)
    _delivered: int = 0
    _last_cursor: int = 0

    def wants(self, event: Event) -> bool:
        if self.session_id is not None and event.session_id != self.session_id:
            return False
        return _matches(self.topics, event.topic)

    @property
    def overflowed(self) -> bool:
        return self._overflowed.is_set()

    @property
    def last_cursor(self) -> int:
        """Cursor of the last event handed out by :meth:`receive` (0 if none)."""
        return self._last_cursor

    def _offer(self, event: Event) -> bool:
        """Called by the bus. Returns False when this offer overflowed the queue."""
        if self._overflowed.is_set():
            return True
        try:
            self._send.send_nowait(event)
        except trio.WouldBlock:
            self._overflowed.set()
            self._send.close()
            return False
        except trio.ClosedResourceError:
            pass
        return True

    def queued(self) -> int:
        return len(self._replay) + self._recv.statistics().current_buffer_used

    async def receive(self) -> Event:
        """Next event in cursor order.

        Raises ``SubscriberOverflow`` once overflowed and ``trio.EndOfChannel``
        after :meth:`close`.
        """
        if self._overflowed.is_set():
            raise SubscriberOverflow(self._last_cursor)
        if self._replay:
            event = self._replay.popleft()
            await trio.lowlevel.checkpoint()
        else:
            try:
                event = await self._recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                if self._overflowed.is_set():
                    raise SubscriberOverflow(self._last_cursor) from None
                raise trio.EndOfChannel from None
            if self._overflowed.is_set():
                raise SubscriberOverflow(self._last_cursor)
        self._delivered += 1
        self._last_cursor = event.cursor
        return event

    async def wait_overflowed(self) -> None:
        await self._overflowed.wait()

    def close(self) -> None:
        """Unsubscribe (idempotent). Pending receivers get ``EndOfChannel``."""
        self._bus._remove(self)
        self._send.close()
        self._recv.close()
        self._replay.clear()

    def statistics(self) -> SubscriptionStatistics:
        return SubscriptionStatistics(
            subscription_id=self.id,
            queued=self.queued(),
            capacity=self._capacity,
            delivered=self._delivered,
            overflowed=self.overflowed,
        )


class EventBus:
    """Publish/subscribe with monotonically increasing cursors and bounded memory."""

    def __init__(self, backlog: int = 10_000, subscriber_queue: int = 1024) -> None:
        if backlog < 1 or subscriber_queue < 1:
            raise ValueError("backlog and subscriber_queue must be >= 1")
        self._backlog: deque[Event] = deque(maxlen=backlog)
        self._subscriber_queue = subscriber_queue
        self._subscribers: dict[int, Subscription] = {}
        self._ids = itertools.count(1)
        self._head = 0
        self._overflowed_total = 0
        self._peak_queue = 0

    @property
    def head_cursor(self) -> int:
        return self._head

    def publish(self, topic: str, data: dict[str, Any], *, session_id: str | None = None) -> int:
        """Record and fan out one event; never blocks. Returns its cursor."""
        self._head += 1
        event = Event(cursor=self._head, topic=topic, data=data, session_id=session_id)
        self._backlog.append(event)
        for sub in list(self._subscribers.values()):
            if not sub.wants(event):
                continue
            if not sub._offer(event):
                self._overflowed_total += 1
                self._subscribers.pop(sub.id, None)
            else:
                self._peak_queue = max(self._peak_queue, sub.queued())
        return event.cursor

    def _oldest(self) -> int:
        return self._backlog[0].cursor if self._backlog else self._head + 1

    def subscribe(
        self,
        topics: Iterable[str],
        *,
        session_id: str | None = None,
        cursor: int | None = None,
    ) -> Subscription:
        """Subscribe; with ``cursor``, first replay retained matching events after it."""
        patterns = _validate_topics(topics)
        replay: deque[Event] = deque()
        if cursor is not None:
            if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
                raise InvalidTopics("cursor must be a non-negative integer")
            oldest = self._oldest()
            if cursor > self._head or cursor + 1 < oldest:
                raise CursorExpired(cursor, oldest, self._head)
        send, recv = trio.open_memory_channel[Event](self._subscriber_queue)
        sub = Subscription(
            id=next(self._ids),
            topics=patterns,
            session_id=session_id,
            start_cursor=self._head,
            _bus=self,
            _send=send,
            _recv=recv,
            _capacity=self._subscriber_queue,
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
            backlog_capacity=self._backlog.maxlen or 0,
            subscribers=len(self._subscribers),
            published_total=self._head,
            overflowed_total=self._overflowed_total,
            peak_subscriber_queue=self._peak_queue,
        )
