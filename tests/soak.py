"""Soak sizes: how much work a slow test does.

The suite runs CI-sized by default, so it stays fast; the same tests run full-sized (the sizes they had
before, or more) when the environment sets ``PIHOST_SOAK=1``::

    PIHOST_SOAK=1 ./scripts/test tests/hostile/test_memory.py

A test picks its size with ``soak(ci, full)``: the CI size must still exercise what the test checks (every
assertion stays; only counts, repeats and samples shrink).
"""

from __future__ import annotations

import os


def soaking() -> bool:
    """Whether this run is a soak run (``PIHOST_SOAK=1``)."""
    return os.environ.get("PIHOST_SOAK") == "1"


def soak(ci: int, full: int) -> int:
    """``full`` under ``PIHOST_SOAK=1``, else ``ci``."""
    return full if soaking() else ci
