"""Exact search for a query holding U+FFFD, though the index stores a NUL as U+FFFD (seed 003 §4.8).

SQLite's trigram tokenizer and ``LIKE`` stop reading a value at a NUL, so the index's derived text
(``messages.text``, ``tool_output.text``) holds :data:`~store.transcripts.records.NUL_STAND_IN`
(U+FFFD) where the message holds a NUL (:func:`store.transcripts.records.searchable`, one character
for one: same length, same positions). Only a query holding U+FFFD itself can tell them apart: for
such a query, a row whose stored text matches AND holds U+FFFD is checked against the message's real
text, read from its transcript line (``messages.line_offset``/``line_len``). Every other row and every
other query is decided by the stored text alone, as before: ordinary searches pay nothing.

:class:`LineTexts` is that check, registered as the SQL function ``pihost_line_contains`` for the
read snapshot of one search (``store/search/search.py`` ``_match_sql`` uses it in place of the
stored-text predicate), so counts, pages, cursors and snippets of every search path see one answer.
It reads lazily, only the rows SQL asks about, one line at a time (bounded memory), and keeps the
transcript of the last session it read open (candidates of one session come one after another in
``mid`` order, so a session's lines cost one open).

A line that cannot be verified — the session has no transcript path here, the file is missing or
unreadable, the span is past its end, the line does not parse, names another message, or derives a
text whose stored form is not the row's text (the file changed under the index) — keeps the index's
answer: the row matches as its stored text says. A search never fails and never drops a hit because
of one line; the cost is the old over-count for that row alone (a NUL and a file fault together).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store.errors import StoreError
from store.indexing.index import tool_output_raw
from store.jsonio import loads_line
from store.search.search_text import fold, fold_contains
from store.transcripts.records import NUL_STAND_IN, answer_text, searchable
from store.transcripts.transcript import read_spans

__all__ = ["LINE_FN", "KIND_TEXT", "KIND_TOOL", "LineTexts", "needs_lines"]

LINE_FN = "pihost_line_contains"
KIND_TEXT = 0
"""``messages.text``: the message's answer text (:func:`store.transcripts.records.answer_text`)."""
KIND_TOOL = 1
"""``tool_output.text``: the tool row's output (:func:`store.indexing.index.tool_output_raw`)."""

TranscriptPath = Callable[[str], Path]


def needs_lines(folded_query: str) -> bool:
    """Can the stand-in make the stored text match where the message does not (the query holds U+FFFD)?"""
    return NUL_STAND_IN in folded_query


class LineTexts:
    """The real texts of indexed rows, from their transcript lines, for one read snapshot.

    ``transcript(session_id)`` is the session's transcript path; ``None``: no transcripts here (every
    row keeps its stored text's answer). Call :meth:`close` when the snapshot ends.
    """

    def __init__(self, transcript: TranscriptPath | None) -> None:
        self._transcript = transcript
        self._open: tuple[str, Path, int] | None = None

    def close(self) -> None:
        """Close the open transcript; later checks keep the stored text's answer (the SQL function
        stays registered on the pooled connection until the next search registers its own)."""
        self._transcript = None
        self._close_fd()

    def _close_fd(self) -> None:
        if self._open is not None:
            fd = self._open[2]
            self._open = None
            os.close(fd)

    def contains(self, stored: str | None, folded_query: str | None, session_id: str | None,
                 message_id: str | None, offset: int | None, length: int | None, kind: int) -> bool:
        """The SQL function: does the row's text match the (folded) query?"""
        if not fold_contains(stored, folded_query):
            return False
        assert stored is not None and folded_query is not None
        if NUL_STAND_IN not in stored or not needs_lines(folded_query):
            return True
        real = self.real_text(stored, session_id, message_id, offset, length, kind)
        return real is None or folded_query in fold(real)

    def real_text(self, stored: str, session_id: str | None, message_id: str | None, offset: int | None,
                  length: int | None, kind: int) -> str | None:
        """The text ``stored`` stands for, read from the row's line; None when that cannot be verified
        (see the module docstring), or ``stored`` itself when it holds no stand-in."""
        if NUL_STAND_IN not in stored:
            return stored
        if (self._transcript is None or session_id is None or message_id is None or offset is None
                or length is None):
            return None
        try:
            path, fd = self._file(session_id)
            line = read_spans(path, [(int(offset), int(length))], fd=fd)[0]
            record = loads_line(line)
        except (OSError, StoreError, ValueError):
            return None
        line_id = record.get("id")
        if not isinstance(line_id, str) or message_id not in (line_id, f"{session_id}:{line_id}"):
            return None  # another message's line (a D444 id keeps its session prefix in the index only)
        real = tool_output_raw(record) if kind == KIND_TOOL else answer_text(record)
        return real if real is not None and searchable(real) == stored else None

    def _file(self, session_id: str) -> tuple[Path, int]:
        """The session's transcript, open (the last session's stays open for its next rows)."""
        if self._open is not None and self._open[0] == session_id:
            return self._open[1], self._open[2]
        self._close_fd()
        assert self._transcript is not None
        path = self._transcript(session_id)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        self._open = (session_id, path, fd)
        return path, fd

    def register(self, conn: Any) -> None:
        """Make :meth:`contains` the SQL function :data:`LINE_FN` of ``conn``."""
        conn.create_function(LINE_FN, 7, self.contains, deterministic=False)
