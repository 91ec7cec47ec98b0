"""Times that never go back: a stamp the host orders rows by stays after the newest one already written,
whatever the wall clock says (one stepped back by NTP, a restored snapshot, a date fixed by hand).

SQL only; runs in the caller's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

__all__ = ["after_newest"]


def after_newest(conn: sqlite3.Connection, newest_sql: str, params: Sequence[Any], now_ms: int, *,
                 ties: bool = False) -> int:
    """``now_ms``, unless the newest stamp ``newest_sql`` selects (a ``SELECT MAX(...)``) is not before it:
    then 1 ms after that one. ``ties``: a newest stamp equal to ``now_ms`` is kept as it is (rows may share
    a stamp; only a clock behind them moves it)."""
    newest = conn.execute(newest_sql, tuple(params)).fetchone()[0]
    if newest is None or newest < now_ms or (ties and newest == now_ms):
        return now_ms
    return int(newest) + 1
