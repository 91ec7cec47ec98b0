"""Counting the ``trio.Event`` objects code under test builds (the hot paths build one only when a task waits)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import trio


@dataclass
class EventCount:
    built: int = 0


def count_events(monkeypatch: pytest.MonkeyPatch) -> EventCount:
    """From now on every ``trio.Event()`` built through the ``trio`` module adds one to the returned count."""
    count = EventCount()
    real = trio.Event

    def counting() -> trio.Event:
        count.built += 1
        return real()

    monkeypatch.setattr(trio, "Event", counting)
    return count
