"""A full in-process host whose wall clock (``now_ms``) the test sets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from runtime.host import RunningHost, run_host
from tests.hostkit import test_config


class SetClock:
    """Wall-clock ms that only move when the test moves them."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@asynccontextmanager
async def host_at(root: Path, clock: SetClock, **overrides: Any) -> AsyncIterator[RunningHost]:
    async with trio.open_nursery() as nursery:
        running: RunningHost = await nursery.start(partial(run_host, test_config(root, **overrides), now_ms=clock))
        try:
            yield running
        finally:
            nursery.cancel_scope.cancel()
