"""actors/events.py: cursors, backlog replay, filters, bounded subscribers."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors.events import EVENT_BYTES_ESTIMATE, CursorExpired, EventBus, InvalidTopics, SubscriberOverflow, Subscription


async def drain(sub: Subscription, n: int) -> list[int]:
    return [(await sub.receive()).cursor for _ in range(n)]


async def test_subscriber_sees_every_event_after_subscribing_in_order() -> None:
    bus = EventBus()
    bus.publish("t", {"before": True})
    sub = bus.subscribe(["t"])
    cursors = [bus.publish("t", {"i": i}) for i in range(20)]
    assert cursors == list(range(2, 22))
    events = [await sub.receive() for _ in range(20)]
    assert [e.cursor for e in events] == cursors
    assert [e.data["i"] for e in events] == list(range(20))
    assert sub.start_cursor == 1


async def test_topic_patterns_and_session_filter() -> None:
    bus = EventBus()
    exact = bus.subscribe(["session.appended"])
    prefix = bus.subscribe(["session.*"])
    everything = bus.subscribe(["*"])
    only_s1 = bus.subscribe(["session.*"], session_id="s1")
    bus.publish("session.appended", {}, session_id="s1")
    bus.publish("session.deleted", {}, session_id="s2")
    bus.publish("host.status", {})
    assert exact.queued() == 1 and prefix.queued() == 2 and everything.queued() == 3 and only_s1.queued() == 1
    assert (await only_s1.receive()).session_id == "s1"


async def test_resume_by_cursor_is_gap_free() -> None:
    bus = EventBus(backlog=100)
    first = bus.subscribe(["t"])
    for i in range(10):
        bus.publish("t", {"i": i})
    seen = await drain(first, 4)
    first.close()
    for i in range(10, 15):
        bus.publish("t", {"i": i})
    resumed = bus.subscribe(["t"], cursor=seen[-1])
    bus.publish("t", {"i": 15})
    rest = await drain(resumed, 12)
    assert seen + rest == list(range(1, 17))
    assert resumed.queued() == 0


async def test_cursor_expired_when_backlog_no_longer_holds_it() -> None:
    bus = EventBus(backlog=5)
    for i in range(10):
        bus.publish("t", {"i": i})
    bus.subscribe(["t"], cursor=5)  # events 6..10 retained: fine
    with pytest.raises(CursorExpired) as info:
        bus.subscribe(["t"], cursor=3)
    assert info.value.code == "CURSOR_EXPIRED"
    assert info.value.data == {"cursor": 3, "oldestCursor": 6, "headCursor": 10}
    with pytest.raises(CursorExpired):  # a cursor from the future (previous boot)
        bus.subscribe(["t"], cursor=11)


async def test_overflow_marks_subscriber_without_blocking_publisher() -> None:
    bus = EventBus(subscriber_queue=3)
    slow = bus.subscribe(["t"])
    fast = bus.subscribe(["t"])
    for i in range(3):
        bus.publish("t", {"i": i})
    assert await drain(fast, 3) == [1, 2, 3]
    bus.publish("t", {"i": 3})  # slow's queue is full: overflow, publish returns at once
    assert slow.overflowed and not fast.overflowed
    assert bus.statistics().subscribers == 1
    assert bus.statistics().overflowed_total == 1
    with pytest.raises(SubscriberOverflow) as info:
        await slow.receive()
    assert info.value.data == {"cursor": 0}
    await slow.wait_overflowed()  # returns immediately
    assert (await fast.receive()).cursor == 4
    stats = bus.statistics()
    assert stats.peak_subscriber_queue <= 3 and stats.head_cursor == 4


async def test_backlog_is_a_bounded_ring() -> None:
    bus = EventBus(backlog=4)
    for i in range(100):
        bus.publish("t", {"i": i})
    stats = bus.statistics()
    assert (stats.backlog_used, stats.oldest_cursor, stats.head_cursor) == (4, 97, 100)


async def test_close_ends_receiver_and_is_idempotent() -> None:
    bus = EventBus()
    sub = bus.subscribe(["t"])
    async with trio.open_nursery() as nursery:
        got: list[type[BaseException]] = []

        async def reader() -> None:
            try:
                await sub.receive()
            except trio.EndOfChannel:
                got.append(trio.EndOfChannel)

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        sub.close()
        sub.close()
    assert got == [trio.EndOfChannel]
    assert bus.statistics().subscribers == 0


@pytest.mark.parametrize("topics", [[], "t", [""], [1], ["x" * 500]])
def test_invalid_topics_rejected(topics: object) -> None:
    with pytest.raises(InvalidTopics):
        EventBus().subscribe(topics)  # type: ignore[arg-type]



async def test_backlog_is_bounded_by_bytes_too() -> None:
    """A burst of large records shortens how far back a client can resume; it never grows the host."""
    bus = EventBus(backlog=1000, backlog_bytes=10_000)
    for _ in range(10):
        bus.publish("session.message", {"n": 1}, size=4000)
    stats = bus.statistics()
    assert (stats.backlog_used, stats.backlog_bytes, stats.oldest_cursor) == (2, 8000, 9)
    with pytest.raises(CursorExpired):
        bus.subscribe(["session.message"], cursor=7)
    bus.subscribe(["session.message"], cursor=8)  # the oldest kept event is 9: replay from 8 works
    for _ in range(100):  # small events weigh at least EVENT_BYTES_ESTIMATE
        bus.publish("session.queue", {})
    stats = bus.statistics()
    assert stats.backlog_bytes <= 10_000 and stats.backlog_used == 10_000 // EVENT_BYTES_ESTIMATE
    one = EventBus(backlog=10, backlog_bytes=100)
    one.publish("session.message", {}, size=1_000_000)  # larger than the bound: the newest stays resumable
    assert one.statistics().backlog_used == 1


async def test_an_unsized_event_is_weighed_by_its_payload() -> None:
    """A ``session.queue`` event carries every entry's prompt (up to ~8 MB) and was published without
    ``size``: the backlog counted it as EVENT_BYTES_ESTIMATE (512 bytes), so 1,000 of them could hold gigabytes
    past the 16 MiB bound. An unsized event now weighs a bounded count of its JSON."""
    bus = EventBus(backlog=1000, backlog_bytes=10_000_000)
    prompt = "p" * 900_000
    for _ in range(40):
        bus.publish("session.queue", {"entries": [{"prompt": prompt}, {"prompt": prompt}, {"prompt": prompt}]})
    stats = bus.statistics()
    assert stats.backlog_bytes <= 10_000_000 and stats.backlog_used == 3, stats
    assert stats.backlog_bytes >= 2 * 3 * 900_000, stats  # the kept ones are counted at their weight
    bus.publish("session.queue", {"entries": []})  # a small one still weighs the estimate, no more
    assert bus.statistics().backlog_bytes - stats.backlog_bytes <= EVENT_BYTES_ESTIMATE
