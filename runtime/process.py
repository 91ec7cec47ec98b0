"""Process-wide settings of a serving host: allocator and descriptor limits (called once by ``serve``).

* **Allocator.** glibc's malloc raises its mmap threshold each time a large
  block is freed, so after one 16 MiB reply every later one comes from an
  arena heap that is rarely given back, and each worker thread has its own
  arena: RSS climbs to the high-water mark of every thread. Fixing the
  threshold at 1 MiB (``mallopt(M_MMAP_THRESHOLD)``) makes every large buffer
  (transcript reads, encoded replies) its own mapping, returned to the kernel
  when freed; this is what keeps the reply budgets a bound on RSS.
* **Descriptors.** The soft ``RLIMIT_NOFILE`` is raised to the hard limit, so
  sockets in a handshake flood do not take the descriptors transcripts and the
  database need; what still runs out is answered ``RESOURCE_EXHAUSTED``.
* **Garbage collector.** Once the host serves, what boot left alive (modules,
  pydantic schemas, routes: some 80,000 tracked objects) lives as long as the
  process. Every full (generation 2) collection walked all of them again:
  48 ms of CPU each, measured while appends run, and appends that keep objects
  alive for the index (held ids, index ops) trigger one every few thousand
  messages. :func:`freeze_boot_objects` collects boot's garbage once and moves
  the survivors to the permanent generation (``gc.freeze``), so later
  collections walk only what the host allocated since; they still run.
  The youngest generation's threshold is raised from 700 to
  :data:`GC_GEN0_THRESHOLD` net container allocations: a JSON-RPC batch of 64
  appends keeps tens of thousands of objects alive until it is answered, so at
  700 every batch ran some 4 young collections that found nothing to free and
  promoted everything to the older generations, which were then walked again
  (measured: 0.08 ms of collector time per message in a batch; 0.002 ms at
  20,000). Cyclic garbage waits longer for its collection: a few MB at most.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import resource

__all__ = ["GC_GEN0_THRESHOLD", "MMAP_THRESHOLD", "freeze_boot_objects", "raise_fd_limit", "tune_allocator"]

log = logging.getLogger("pi_host")

M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20
GC_GEN0_THRESHOLD = 20_000


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold; False where the C library is not glibc (nothing changes)."""
    try:
        # the symbols the interpreter is linked with, the C library's among them: no library search
        # (``ctypes.util.find_library`` runs ``ldconfig -p`` in a subprocess, ~10 ms of every host's start)
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))


def raise_fd_limit() -> tuple[int, int]:
    """Soft ``RLIMIT_NOFILE`` up to the hard limit; returns the limits now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit: %s", exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def freeze_boot_objects(gen0_threshold: int = GC_GEN0_THRESHOLD) -> int:
    """Collect boot's garbage, then exempt every object still alive from later collections
    (``gc.freeze``) and raise the youngest generation's threshold (the older ones keep theirs);
    returns how many objects this call froze. Call once, when boot is done."""
    gc.collect()
    # counted in the generations, not with gc.get_freeze_count(): that walks the whole permanent generation,
    # which in a host forked from a warm parent (the test suite's) holds the parent's objects too
    frozen = len(gc.get_objects())
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
    return frozen
