"""Process-wide settings of a serving host: allocator and descriptor limits (called once by ``serve``).

* **Allocator.** glibc's malloc by default gives each worker thread an arena
  of its own (up to 8 per core; the read pool alone has 12 threads) and moves
  its mmap threshold with every large block freed, so RSS climbed to the
  high-water mark of every thread. An earlier version fixed the threshold at 1 MiB: every
  large buffer its own mapping, returned when freed; but then every large
  buffer is fresh memory, and a whole-history read of 60 MB took 32,000 page
  faults (~40 % of its CPU in the served host: 197 ms against 114 ms without
  them, measured on the bench's 50,000-message session). Now
  (:func:`tune_allocator`): **one arena** for every thread (their Python code
  holds the GIL anyway, so they seldom contend for it), large blocks up to
  :data:`MMAP_THRESHOLD` (32 MiB: over the 16 MiB reply cap and a page's
  reads) come from its heap and are reused, and free memory at the heap's top
  is given back past :data:`TRIM_THRESHOLD` (64 MiB). What a burst leaves free
  below that is given back by :func:`release_free_memory` (``malloc_trim``,
  which also returns free pages inside the heap), which a serving host calls
  every ``HostConfig.memory_trim_interval`` seconds from a worker thread. So
  RSS is bounded by what is live plus 64 MiB while reads run, and returns to
  what is live when they stop.
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

__all__ = ["GC_GEN0_THRESHOLD", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "freeze_boot_objects", "raise_fd_limit",
           "release_free_memory", "tune_allocator"]

log = logging.getLogger("pi_host")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20
ARENA_MAX = 1
GC_GEN0_THRESHOLD = 20_000


def _libc() -> ctypes.CDLL | None:
    # the symbols the interpreter is linked with, the C library's among them: no library search
    # (``ctypes.util.find_library`` runs ``ldconfig -p`` in a subprocess, ~10 ms of every host's start)
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator(threshold: int = MMAP_THRESHOLD, *, trim_threshold: int = TRIM_THRESHOLD,
                   arenas: int = ARENA_MAX) -> bool:
    """glibc's arena count, mmap threshold and trim threshold (the module's docstring says why); False where the
    C library is not glibc (nothing changes). Call before the process starts threads: an arena a thread took
    already stays its own."""
    libc = _libc()
    if libc is None:
        return False
    return all([bool(libc.mallopt(M_ARENA_MAX, arenas)), bool(libc.mallopt(M_MMAP_THRESHOLD, threshold)),
                bool(libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))])


def release_free_memory() -> bool:
    """Give the kernel back the free memory of the heap (``malloc_trim(0)``: its top and the free pages inside it);
    True if any was. Blocking (it walks the heap under the arena's lock): call it from a worker thread."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))


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
