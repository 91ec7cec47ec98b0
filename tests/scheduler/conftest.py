"""Fixtures of the scheduler tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def set_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``set_tz("IST-5:30")``: the host local timezone for this test (POSIX TZ), restored afterwards."""
    def apply(tz: str) -> None:
        monkeypatch.setenv("TZ", tz)
        time.tzset()

    yield apply
    monkeypatch.undo()
    time.tzset()
