"""Values for SQL ``IN (...)`` lists, in chunks below SQLite's host-parameter limit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

IN_LIST_CHUNK = 500


def in_chunks(values: Sequence[T]) -> Iterator[tuple[str, Sequence[T]]]:
    """``(placeholders, chunk)`` for each run of at most :data:`IN_LIST_CHUNK` values,
    where ``placeholders`` is ``"?,?,…"`` with one mark per value of the chunk."""
    for start in range(0, len(values), IN_LIST_CHUNK):
        chunk = values[start : start + IN_LIST_CHUNK]
        yield ",".join("?" for _ in chunk), chunk
