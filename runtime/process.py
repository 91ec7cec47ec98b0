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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource

__all__ = ["MMAP_THRESHOLD", "raise_fd_limit", "tune_allocator"]

log = logging.getLogger("pi_host")

M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20


def tune_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold; False where the C library is not glibc (nothing changes)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
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
