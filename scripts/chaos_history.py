"""Jepsen-style history of a chaos run: every operation as invoke → ok | fail | info.

* ``invoke`` – the client is about to send the request;
* ``ok``     – the host acknowledged it (the result is recorded);
* ``fail``   – the host answered with a definite error: the effect did not happen;
* ``info``   – indeterminate: the connection dropped, the host was killed, the
  actor restarted or the call timed out. The effect may or may not have happened.

An operation is identified by ``(f, key)`` — e.g. ``("append", "<message id>")``;
a retry of the same logical operation (same key, same ``submissionId``) is a new
invoke with the same ``(f, key)``. :func:`outcomes` folds the history into one
:class:`Outcome` per key: acknowledged if any attempt was ``ok``, failed if every
attempt failed, indeterminate otherwise. No trio, no I/O (except :meth:`History.dump`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

OpType = Literal["invoke", "ok", "fail", "info"]

# Operation kinds that change state (counted as "acknowledged writes").
WRITE_KINDS: frozenset[str] = frozenset({
    "create", "append", "checkpoint", "start_turn", "end_turn", "queue_push", "queue_remove",
    "rename", "settings_set", "lc_create", "lc_append", "lc_truncate", "lc_fork", "lc_delete",
    "approval_request", "approval_respond", "collab_deliver", "collab_begin", "collab_settle",
})


@dataclass(frozen=True, slots=True)
class Op:
    index: int
    process: str
    type: OpType
    f: str
    key: str
    value: dict[str, Any]
    result: Any = None
    cycle: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "process": self.process, "type": self.type, "f": self.f,
                "key": self.key, "value": self.value, "result": self.result, "cycle": self.cycle}


@dataclass
class History:
    """Append-only operation log (one per run)."""

    ops: list[Op] = field(default_factory=list)
    cycle: int = 0
    _counter: Any = field(default_factory=itertools.count)

    def add(self, process: str, type_: OpType, f: str, key: str, value: dict[str, Any] | None = None,
            result: Any = None) -> Op:
        op = Op(next(self._counter), process, type_, f, key, dict(value or {}), result, self.cycle)
        self.ops.append(op)
        return op

    def invoke(self, process: str, f: str, key: str, value: dict[str, Any]) -> Op:
        return self.add(process, "invoke", f, key, value)

    def complete(self, invoked: Op, type_: OpType, result: Any = None) -> Op:
        return self.add(invoked.process, type_, invoked.f, invoked.key, invoked.value, result)

    def dump(self, path: Path) -> None:
        with open(path, "wb") as fh:
            for op in self.ops:
                fh.write(orjson.dumps(op.to_json(), default=str) + b"\n")


@dataclass
class Outcome:
    """Everything the history says about one logical operation ``(f, key)``."""

    f: str
    key: str
    value: dict[str, Any]
    first_invoke: int
    status: Literal["acked", "failed", "indeterminate"] = "indeterminate"
    ack_index: int | None = None
    """History index of the first ``ok``."""
    result: Any = None
    """Result of the first ``ok``."""
    attempts: int = 0


def outcomes(ops: Iterable[Op]) -> dict[tuple[str, str], Outcome]:
    """Fold a history into one outcome per ``(f, key)``, in first-invoke order."""
    out: dict[tuple[str, str], Outcome] = {}
    completions: dict[tuple[str, str], list[OpType]] = {}
    for op in ops:
        k = (op.f, op.key)
        if op.type == "invoke":
            found = out.get(k)
            if found is None:
                out[k] = Outcome(op.f, op.key, op.value, op.index, attempts=1)
            else:
                found.attempts += 1
            continue
        found = out.get(k)
        if found is None:  # a completion without invoke: malformed history
            raise ValueError(f"history has a {op.type} for {k} without an invoke (op {op.index})")
        completions.setdefault(k, []).append(op.type)
        if op.type == "ok" and found.ack_index is None:
            found.ack_index = op.index
            found.result = op.result
    for k, found in out.items():
        kinds = completions.get(k, [])
        if found.ack_index is not None:
            found.status = "acked"
        elif kinds and all(t == "fail" for t in kinds) and len(kinds) == found.attempts:
            found.status = "failed"
        else:
            found.status = "indeterminate"
    return out


__all__ = ["History", "Op", "OpType", "Outcome", "WRITE_KINDS", "outcomes"]
