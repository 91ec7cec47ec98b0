"""Transient events (live previews): coalescing, throttled per subscriber, never out of order.

Virtual time (``autojump_clock``): the throttle is measured on trio's clock.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors.events import Event, EventBus, Subscription


def _supersedes(event: Event) -> str | None:
    return f"msg:{event.data['id']}" if event.topic == "final" else None


async def _pending(sub: Subscription) -> list[Event]:
    """Everything the subscriber can get right now (without waiting for a throttle)."""
    got: list[Event] = []
    while True:
        try:
            got.append(sub.receive_nowait())
        except trio.WouldBlock:
            return got


async def test_first_preview_goes_out_at_once_then_the_newest_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = EventBus(transient_interval=0.25)
    sub = bus.subscribe(["preview"])
    bus.publish_transient("preview", {"text": "a"}, key="m1")
    first = await sub.receive()
    assert first.data == {"text": "a"} and first.transient and first.cursor == 0
    for text in ("ab", "abc", "abcd"):  # within the interval: each replaces the one before
        bus.publish_transient("preview", {"text": text}, key="m1")
    t0 = trio.current_time()
    second = await sub.receive()
    assert second.data == {"text": "abcd"}
    assert trio.current_time() - t0 == pytest.approx(0.25)
    assert sub.statistics().transient_coalesced == 2


async def test_the_rate_per_subscriber_is_bounded_and_the_last_preview_arrives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = EventBus(transient_interval=0.25)
    sub = bus.subscribe(["preview"])
    got: list[tuple[float, str]] = []

    async def reader() -> None:
        while True:
            event = await sub.receive()
            got.append((trio.current_time(), event.data["text"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        start = trio.current_time()
        for i in range(100):  # a checkpoint every 10 ms for one second
            bus.publish_transient("preview", {"text": f"t{i}"}, key="m1")
            await trio.sleep(0.01)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert got[-1][1] == "t99"  # the newest wins
    assert len(got) <= 1 + 1.0 / 0.25 + 1
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:], strict=False)]
    assert all(gap >= 0.25 - 1e-9 for gap in gaps)
    assert got[0][0] == start  # the first one was not delayed


async def test_keys_are_throttled_independently(autojump_clock: trio.testing.MockClock) -> None:
    bus = EventBus(transient_interval=1.0)
    sub = bus.subscribe(["preview"])
    bus.publish_transient("preview", {"k": "a1"}, key="a")
    bus.publish_transient("preview", {"k": "b1"}, key="b")
    assert [e.data["k"] for e in await _pending(sub)] == ["a1", "b1"]
    bus.publish_transient("preview", {"k": "a2"}, key="a")
    assert await _pending(sub) == []  # a's interval has not passed


async def test_a_preview_never_overtakes_an_earlier_event_and_never_holds_back_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = EventBus(transient_interval=0.25)
    sub = bus.subscribe(["preview", "n"])
    bus.publish("n", {"i": 1})
    bus.publish_transient("preview", {"text": "p1"}, key="m1")
    bus.publish("n", {"i": 2})
    order = [(e.topic, e.data) for e in await _pending(sub)]
    assert order == [("n", {"i": 1}), ("preview", {"text": "p1"}), ("n", {"i": 2})]
    bus.publish_transient("preview", {"text": "p2"}, key="m1")  # throttled ...
    bus.publish("n", {"i": 3})  # ... and does not hold this one back
    assert [(e.topic, e.data) for e in await _pending(sub)] == [("n", {"i": 3})]
    await trio.sleep(0.25)
    later = await _pending(sub)
    assert [e.data for e in later] == [{"text": "p2"}] and later[0].cursor == 3  # repeats the newest cursor


async def test_a_superseding_event_drops_the_pending_preview(autojump_clock: trio.testing.MockClock) -> None:
    bus = EventBus(transient_interval=0.25, supersedes=_supersedes)
    sub = bus.subscribe(["preview", "final"])
    bus.publish_transient("preview", {"text": "par"}, key="msg:m1")
    assert len(await _pending(sub)) == 1
    bus.publish_transient("preview", {"text": "partial"}, key="msg:m1")  # waits for its interval
    bus.publish("final", {"id": "m1", "text": "partial and final"})
    await trio.sleep(1)
    assert [(e.topic, e.data["text"]) for e in await _pending(sub)] == [("final", "partial and final")]


async def test_previews_are_never_replayed_and_keep_the_cursor_sequence(autojump_clock: trio.testing.MockClock) -> None:
    bus = EventBus()
    bus.publish("n", {"i": 1})
    bus.publish_transient("preview", {"text": "x"}, key="m1")
    bus.publish("n", {"i": 2})
    assert bus.head_cursor == 2 and bus.statistics().backlog_used == 2
    resumed = bus.subscribe(["*"], cursor=0)
    assert [(e.topic, e.cursor) for e in await _pending(resumed)] == [("n", 1), ("n", 2)]
    assert resumed.last_cursor == 2


async def test_pending_keys_are_bounded_per_subscriber(autojump_clock: trio.testing.MockClock) -> None:
    bus = EventBus(subscriber_queue=4, transient_keys=8)
    sub = bus.subscribe(["preview"])
    for i in range(1000):  # a subscriber that does not read: bounded, never overflowed
        bus.publish_transient("preview", {"i": i}, key=f"m{i % 50}")
    stats = sub.statistics()
    assert stats.transient_pending == 8 and not stats.overflowed
    got = await _pending(sub)
    assert sorted(e.data["i"] for e in got) == list(range(992, 1000))  # the newest keys, newest content


async def test_validate_runs_before_anything_is_published() -> None:
    def validate(topic: str, data: dict[str, object]) -> None:
        if "bad" in data:
            raise ValueError(f"{topic} payload does not match its model")

    bus = EventBus(validate=validate)
    sub = bus.subscribe(["*"])
    with pytest.raises(ValueError, match="does not match"):
        bus.publish("n", {"bad": 1})
    with pytest.raises(ValueError, match="does not match"):
        bus.publish_transient("preview", {"bad": 1}, key="k")
    assert bus.head_cursor == 0 and sub.queued() == 0 and sub.statistics().transient_pending == 0


async def test_cancelling_a_receive_loses_no_event(autojump_clock: trio.testing.MockClock) -> None:
    bus = EventBus()
    sub = bus.subscribe(["n"])
    bus.publish("n", {"i": 1})
    with trio.CancelScope() as scope:
        scope.cancel()
        await sub.receive()
    assert (await sub.receive()).data == {"i": 1}
