"""An in-memory "might exist" filter of every ``messages.id``: an append's id lookup skips its SQL when
both spellings of a new id (the client's and ``{sessionId}:{id}``) are certainly absent.

Why: every append with a client-supplied id asks the index whether the id is a replay, a D444 remap or
a streaming reservation. That SELECT is the write hop's first statement after the DB writer's commit,
when SQLite has dropped the reader's page cache: 36-42 µs of CPU for an answer that is "no" for almost
every append. A Bloom filter answers "certainly not" in well under a microsecond.

The one rule it keeps: **no false negative**. An id present in ``messages`` (committed, as any reader's
snapshot can see it) is always "maybe" here; otherwise an append would write a second line under an id
the index already holds. False positives only cost the SQL the caller would have run anyway.

How that holds, structurally:

* The feed is a TEMP trigger on the DB writer's connection, ``AFTER INSERT`` and ``AFTER UPDATE OF id``
  on ``main.messages``, calling :meth:`MessageIds._add` (registered with ``create_function``). Every row
  written through that connection passes through it *during* its statement, so before its commit: no
  code path that writes ``messages`` through the writer (``index.index_messages``, ``PendingRows.flush``,
  reconcile/reindex/repair, imports, rewrites, remaps) can skip it, and none added later can either. If
  the function fails, the statement fails with it (no row without its entry).
* The filter is built (:meth:`MessageIds.attach`) from ``SELECT id FROM messages`` on that connection,
  in the thread that alone writes through it, after the trigger is in place: rows written before
  (boot's migrations, reconcile, salvage) are in the scan, rows written after go through the trigger.
* Until it is built, or when the connection it was built on is not the one writing (a writer that was
  reopened: a TEMP trigger lives and dies with its connection), :meth:`MessageIds.might_hold` answers
  True for every id: the SQL lookup runs, as before.
* Other connections that may write ``messages`` all run before the writer opens or with no host running
  (migrations' copy into a new table, ``doctor --repair``, which holds the data directory's lock); the
  integrity sweep's FTS check and salvage's reads write no ``messages`` row.
* Deleted rows stay in the filter (a Bloom filter forgets nothing): false positives only. A transaction
  rolled back leaves its ids in too, with the same effect.

Sizing: layers of :class:`rbloom.Bloom` (a scalable Bloom filter). The first is sized for twice the rows
it is built from (at least :data:`MIN_CAPACITY`) at :data:`FP_RATE`; when the ids added pass a layer's
capacity, a new layer of twice that capacity at half the rate takes the adds, so the false-positive rate
stays below 2 x :data:`FP_RATE` whatever the growth. Memory: about 11 bits per id of capacity at 0.5 %
(1.4 MB per million of capacity; built with twice the count, about 2.8 MB per million ids indexed).

Threads: the DB writer's thread adds (inside its statements); worker threads test. Each
:class:`rbloom.Bloom` call (``add``, ``in``) is one call into native code that runs no Python code (it
hashes a ``str`` with ``hash()``, native) and does not release the GIL: under the GIL the calls never
interleave, so a test sees a layer before or after an add, never half of one. A new layer is published
by rebinding :attr:`MessageIds._layers` to a new list before anything is added to it; a tester iterates
the list it read. An id is added before its row commits, and a tester's caller reads its snapshot (and
the index log's held ids) before it tests: what that snapshot could show, the filter already holds.
"""

from __future__ import annotations

import sqlite3

from rbloom import Bloom

__all__ = ["FP_RATE", "MIN_CAPACITY", "MessageIds"]

FP_RATE = 0.005
"""The first layer's false-positive rate (each later layer halves it: the total stays below twice this)."""
MIN_CAPACITY = 1 << 16
"""The smallest layer (about 90 KB)."""

_FUNCTION = "pi_message_ids_add"
_TRIGGERS = ("pi_message_ids_insert", "pi_message_ids_update")


class MessageIds:
    """The filter. One per writer connection (the host makes one per boot); see the module's notes."""

    def __init__(self, *, fp_rate: float = FP_RATE, min_capacity: int = MIN_CAPACITY) -> None:
        self._fp_rate = fp_rate
        self._min_capacity = min_capacity
        self._layers: list[Bloom] = []
        self._capacity = 0
        """Of the newest layer."""
        self._added = 0
        """Ids added to the newest layer."""
        self._conn: sqlite3.Connection | None = None
        """The connection whose trigger feeds it; None: not built (every id "maybe")."""

    @property
    def ready(self) -> bool:
        return self._conn is not None

    @property
    def layers(self) -> int:
        return len(self._layers)

    @property
    def capacity(self) -> int:
        """Ids the filter holds at its stated rate (all layers)."""
        return sum(self._capacity >> i for i in range(len(self._layers)))

    def might_hold(self, message_id: str) -> bool:
        """False only when no row of ``messages`` has this id (as of the newest commit of the connection
        it is attached to). Any thread."""
        if self._conn is None:
            return True
        return any(message_id in layer for layer in self._layers)

    def attached_to(self, conn: sqlite3.Connection) -> bool:
        """Built on ``conn``, whose TEMP trigger feeds it still."""
        if self._conn is not conn:
            return False
        found = conn.execute(
            f"SELECT count(*) FROM sqlite_temp_master WHERE type = 'trigger' AND name IN {_TRIGGERS!r}"
        ).fetchone()[0]
        return int(found) == len(_TRIGGERS)

    def attach(self, conn: sqlite3.Connection) -> None:
        """Feed from ``conn`` (the DB writer's connection) and build from its rows; no-op if already
        :meth:`attached_to` it. Run in the thread that alone writes through ``conn`` (never inside a
        transaction of its own: the scan is its own read)."""
        if self.attached_to(conn):
            return
        self._conn = None  # "maybe" for every id while it is (re)built
        conn.create_function(_FUNCTION, 1, self._add)
        # TEMP triggers on the main schema's table: this connection only, not in the file
        conn.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS {_TRIGGERS[0]} AFTER INSERT ON main.messages "
                     f"BEGIN SELECT {_FUNCTION}(new.id); END")
        conn.execute(f"CREATE TEMP TRIGGER IF NOT EXISTS {_TRIGGERS[1]} AFTER UPDATE OF id ON main.messages "
                     f"BEGIN SELECT {_FUNCTION}(new.id); END")
        count = int(conn.execute("SELECT count(*) FROM messages").fetchone()[0])
        capacity = max(2 * count, self._min_capacity)
        layer = Bloom(capacity, self._fp_rate)
        layer.update(r[0] if isinstance(r[0], str) else str(r[0]) for r in conn.execute("SELECT id FROM messages"))
        self._layers, self._capacity, self._added = [layer], capacity, count
        self._conn = conn

    def detach(self) -> None:
        """Every id "maybe" from now on (the writer connection is closing)."""
        self._conn = None

    def _add(self, message_id: object) -> None:
        """The trigger's function (the DB writer's thread). A non-text id (the column is TEXT NOT NULL;
        a damaged row) is added as its text, the spelling a lookup would use."""
        if not self._layers:
            return  # the trigger outlived a filter never built: nothing tests it
        if self._added >= self._capacity:
            rate = self._fp_rate / (1 << len(self._layers))
            self._layers = [*self._layers, Bloom(self._capacity * 2, rate)]  # published before any add
            self._capacity, self._added = self._capacity * 2, 0
        self._layers[-1].add(message_id if isinstance(message_id, str) else str(message_id))
        self._added += 1
