"""``runtime.process.freeze_boot_objects``: what boot left alive is exempt from later collections."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from runtime.process import GC_GEN0_THRESHOLD, freeze_boot_objects


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()  # the rest of the test process collects as before
        gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_survivors_are_frozen_and_garbage_is_collected_first(unfrozen: None) -> None:
    """Reproduces the cost measured in issue 26: every full collection walked boot's ~80,000 objects
    again (48 ms CPU each). Boot's cyclic garbage must be freed first, never frozen."""
    alive = _Node()
    garbage = weakref.ref(_Node())  # unreachable at once, kept only by its own cycle
    assert garbage() is not None
    gen1, gen2 = gc.get_threshold()[1:]
    frozen = freeze_boot_objects()
    assert frozen == gc.get_freeze_count() > 0
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, gen1, gen2)
    assert garbage() is None  # collected before the freeze, not frozen
    assert gc.is_tracked(alive)
    assert all(o is not alive for o in gc.get_objects())  # frozen: in no generation a collection walks
    # What is allocated afterwards is collected as usual.
    later = weakref.ref(_Node())
    gc.collect()
    assert later() is None
