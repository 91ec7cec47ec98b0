"""Which thread ran a piece of work: the "never block the trio loop" tests patch a heavy function with
:func:`on_trio_thread` recorded before each call and check it ran in a worker thread."""

from __future__ import annotations

import trio

__all__ = ["on_trio_thread"]


def on_trio_thread() -> bool:
    """Whether the calling thread is running a trio task (the host's loop), not a worker thread."""
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True
