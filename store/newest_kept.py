"""Keep the newest N rows of a table: the one way the host caps a list (the inbox, a task's runs).

Only rows proven older than N others go: the N-th newest row is found by a scan of the table itself
(``NOT INDEXED``) and the rows ordered before it are deleted. Never "every row the newest-first list does not
name": that list is read through an index, and a changed byte in one of its entries (its rowid now another
row's) hides a row from it while the page stays well formed; such a prune deleted an acknowledged row in a
commit that succeeded, and no later check or salvage could tell it had been there (scripts/chaos
--mode corrupt). A row some read misses is never deleted for being missed.

SQL only; runs in the caller's transaction. Table and column names are the callers' constants."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

__all__ = ["delete_past_newest"]


def delete_past_newest(conn: sqlite3.Connection, table: str, *, keep: int, stamp: str, tiebreak: str,
                       where: str = "1", params: Sequence[Any] = ()) -> int:
    """Delete the rows of ``table`` matching ``where`` that come after the ``keep`` newest ones by
    ``(stamp DESC, tiebreak DESC)``, as a scan of the table finds them (a row read twice counts once).
    The number deleted."""
    if keep <= 0:
        return conn.execute(f"DELETE FROM {table} NOT INDEXED WHERE {where}", tuple(params)).rowcount
    edge = conn.execute(
        f"SELECT DISTINCT {stamp}, {tiebreak} FROM {table} NOT INDEXED WHERE {where} "
        f"ORDER BY {stamp} DESC, {tiebreak} DESC LIMIT 1 OFFSET ?", (*params, keep - 1)).fetchone()
    if edge is None:
        return 0
    return conn.execute(
        f"DELETE FROM {table} NOT INDEXED WHERE ({where}) AND ({stamp} < ? OR ({stamp} = ? AND {tiebreak} < ?))",
        (*params, edge[0], edge[0], edge[1])).rowcount
