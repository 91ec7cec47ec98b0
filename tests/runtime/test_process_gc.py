"""``runtime.process.freeze_boot_objects``: what boot left alive is exempt from later collections.

The check runs in a fresh interpreter with one thread, as ``pi-host serve`` calls it once boot is done:
in the test process other threads (the test runner's, hosts' worker threads) may be inside a
collection at that moment, and ``gc.collect()`` then returns at once without collecting.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.hostkit import REPO

_CHECK = textwrap.dedent("""
    import gc
    import weakref

    from runtime.process import GC_GEN0_THRESHOLD, freeze_boot_objects


    class Node:
        def __init__(self) -> None:
            self.me = self  # a reference cycle: only the cyclic collector frees it


    alive = Node()
    garbage = weakref.ref(Node())  # unreachable at once, kept only by its own cycle
    assert garbage() is not None
    gen1, gen2 = gc.get_threshold()[1:]
    frozen = freeze_boot_objects()
    assert frozen == gc.get_freeze_count() > 0, frozen
    assert gc.get_threshold() == (GC_GEN0_THRESHOLD, gen1, gen2), gc.get_threshold()
    assert garbage() is None, "boot's garbage was frozen instead of collected"
    assert gc.is_tracked(alive)
    assert all(o is not alive for o in gc.get_objects()), "a survivor is still in a generation collections walk"
    later = weakref.ref(Node())  # what is allocated afterwards is collected as usual
    gc.collect()
    assert later() is None
    print("ok", frozen)
""")


def test_survivors_are_frozen_and_garbage_is_collected_first() -> None:
    """Reproduces the cost measured in issue 26: every full collection walked boot's ~80,000 objects
    again (48 ms CPU each). Boot's cyclic garbage must be freed first, never frozen."""
    proc = subprocess.run([sys.executable, "-c", _CHECK], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok ")


_AFTER_A_FREEZE = textwrap.dedent("""
    import gc

    from runtime.process import freeze_boot_objects

    gc.collect()
    gc.freeze()  # as a host forked from a warm parent does first (tests/host_fork.py)
    before = gc.get_freeze_count()
    kept = [[i] for i in range(1000)]  # boot's own survivors: 1,001 tracked objects
    frozen = freeze_boot_objects()
    assert 1001 <= frozen < before, (frozen, before)
    assert gc.get_freeze_count() == before + frozen, (gc.get_freeze_count(), before, frozen)
    print("ok", frozen)
""")


def test_the_count_is_of_what_this_call_froze() -> None:
    """The figure boot logs is what this call froze, counted in the generations: ``gc.get_freeze_count()``
    walks the whole permanent generation, which in a host forked from a warm parent holds the parent's
    objects too (it took more time than the collection itself)."""
    proc = subprocess.run([sys.executable, "-c", _AFTER_A_FREEZE], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok ")
