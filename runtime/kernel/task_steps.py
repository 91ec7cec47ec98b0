"""Counting the trio thread's hand-offs (a diagnostic, off unless ``serve --count-task-steps``).

``scripts/bench`` reads them from ``host.status.trio`` around a workload, to report task steps (each
one a task switch on the trio thread) and I/O waits (each one a pass of trio's run loop through
``epoll_wait``) per request of a host in another process, as it counts them in-process
(issue 26 item 3). Installed as a trio instrument: about a microsecond per task step while on,
nothing while off.
"""

from __future__ import annotations

import trio

__all__ = ["TaskSteps"]


class TaskSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.task_steps = 0
        self.io_waits = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.task_steps += 1

    def before_io_wait(self, timeout: float) -> None:
        self.io_waits += 1

    def statistics(self) -> dict[str, int]:
        return {"taskSteps": self.task_steps, "ioWaits": self.io_waits}
