"""Named fault points (FoundationDB's BUGGIFY, RELIABILITY.md tier B).

Storage code calls ``faults.point("append.after_write")`` at each step of a
write path. In production the object is :data:`NO_FAULTS` and the call does
nothing. Tests and chaos runs build a :class:`Faults` from a spec such as
``"append.after_write:3:kill"`` (also read from ``RT_CRASHPOINT``): the 3rd time
that point is reached, the process SIGKILLs itself. Actions:

* ``kill``   – ``os.kill(os.getpid(), SIGKILL)`` (default)
* ``raise``  – raise :class:`InjectedFault` (an exception the caller did not expect)
* ``eio``    – raise ``OSError(EIO)``
* ``enospc`` – raise ``OSError(ENOSPC)``

Several rules may be given, separated by commas. An ``nth`` of ``*`` fires
every time. Nothing here is module-level mutable state: each host builds its own.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from dataclasses import dataclass, field


class InjectedFault(RuntimeError):
    """Raised at a fault point whose action is ``raise``."""


@dataclass
class _Rule:
    name: str
    nth: int | None  # None = every time
    action: str


@dataclass
class Faults:
    rules: list[_Rule] = field(default_factory=list)
    _hits: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    enabled: bool = True

    @classmethod
    def parse(cls, spec: str | None) -> Faults:
        if not spec:
            return cls(enabled=False)
        rules: list[_Rule] = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            bits = part.split(":")
            name = bits[0]
            nth: int | None = 1
            action = "kill"
            if len(bits) > 1 and bits[1]:
                nth = None if bits[1] == "*" else int(bits[1])
            if len(bits) > 2 and bits[2]:
                action = bits[2]
            if action not in ("kill", "raise", "eio", "enospc"):
                raise ValueError(f"unknown fault action {action!r} in {part!r}")
            rules.append(_Rule(name, nth, action))
        return cls(rules=rules, enabled=bool(rules))

    def add(self, name: str, nth: int | None = 1, action: str = "raise") -> None:
        """Arm a rule at run time (tests)."""
        self.rules.append(_Rule(name, nth, action))
        self.enabled = True

    def clear(self) -> None:
        self.rules.clear()
        self._hits.clear()
        self.enabled = False

    def hits(self, name: str) -> int:
        return self._hits.get(name, 0)

    def counts(self) -> dict[str, int]:
        """How often each point was reached so far (counted while any rule is armed; tests)."""
        with self._lock:
            return dict(self._hits)

    def point(self, name: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            count = self._hits.get(name, 0) + 1
            self._hits[name] = count
            fire = None
            for rule in self.rules:
                if rule.name == name and (rule.nth is None or rule.nth == count):
                    fire = rule.action
                    break
        if fire is None:
            return
        if fire == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fire == "raise":
            raise InjectedFault(f"injected fault at {name} (hit {count})")
        if fire == "eio":
            raise OSError(errno.EIO, f"injected EIO at {name}")
        if fire == "enospc":
            raise OSError(errno.ENOSPC, f"injected ENOSPC at {name}")


NO_FAULTS = Faults(enabled=False)
"""Shared do-nothing instance; never armed (use ``Faults()`` for a test instance)."""
