"""``search.query`` over every session for a query the trigram index cannot answer (under 3 characters, or a
non-ASCII case mapping) asks the newest rows first (``_newest_first``).

Reproduces: typing two letters into a search box scanned every message (1M messages: 620 ms for ``"es"``)
although the newest few hundred rows held the page. The work is counted in SQLite VM steps (a progress
handler), not in time: the page from the newest rows costs a small part of the scan; a query whose hits are
old, sparse or none still gets the page the whole scan gives, in order, paged with cursors.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import store.search.search as search_module
from store.indexing import index
from store.indexing.index import IndexRecord
from store.jsonio import now_rfc3339
from store.search.search import search_messages
from tests.store.search_corpus import Corpus, open_db, patched

MESSAGES = 3_000


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    """3,000 messages over 10 sessions, time-ordered: every seventh one says "needle" (hits everywhere); the
    oldest 20 say "ÄPFEL" (a query the Python predicate answers); one session is in the trash."""
    db = open_db()
    corpus = Corpus(db)
    sessions = [corpus.session() for _ in range(10)]
    db.execute("BEGIN")
    for n in range(MESSAGES):
        text = f"message {n} " + ("needle here" if n % 7 == 0 else "hay") + (" äpfel" if n < 20 else "")
        corpus.message(sessions[n % 10], text, role="assistant" if n % 2 else "user", created_at=1_000_000 + n)
    db.execute("COMMIT")
    db.execute("UPDATE sessions SET deleted_at = 1 WHERE id = ?", (sessions[3],))
    try:
        yield db
    finally:
        db.close()


def _steps(db: sqlite3.Connection, query: str, **kw: object) -> tuple[list[str], int]:
    """The page's message texts' numbers and the SQLite VM steps it took (in units of 100)."""
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    db.set_progress_handler(tick, 100)
    try:
        res = search_messages(db, query, **kw)  # type: ignore[arg-type]
    finally:
        db.set_progress_handler(None, 0)
    return [r["snippet"].split()[1] for r in res["results"]], count[0]


def _pages(db: sqlite3.Connection, query: str, limit: int) -> list[str]:
    got: list[str] = []
    cursor = None
    while True:
        res = search_messages(db, query, limit=limit, cursor=cursor)
        got.extend(r["snippet"].split()[1] for r in res["results"])
        cursor = res["nextCursor"]
        if cursor is None:
            return got


def _scan_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "_RECENT_ROWS", 10**9)  # no row past the window: the scan alone


def test_a_short_query_with_many_hits_reads_the_newest_rows_only(conn: sqlite3.Connection,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_module, "_RECENT_ROWS", 500)
    newest = [str(n) for n in _needles()][:20]
    walked, walked_steps = _steps(conn, "ne", limit=20)
    assert walked == newest
    with monkeypatch.context() as m:
        _scan_only(m)
        scanned, scan_steps = _steps(conn, "ne", limit=20)
    assert scanned == newest
    assert walked_steps * 5 < scan_steps, (walked_steps, scan_steps)


def test_a_phrase_in_very_many_messages_reads_the_newest_rows_only(conn: sqlite3.Connection,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """"needle here" (a phrase: more than 3 characters) is in every seventh message: past the bound of
    _many_hits the newest rows are walked, trashed sessions left out; under it the hits read once are
    looked up."""
    monkeypatch.setattr(search_module, "_RECENT_ROWS", 500)
    monkeypatch.setattr(search_module, "_WALK_MIN_HITS", 50)  # the bound: 50 hits (no messages counted)
    monkeypatch.setattr(search_module, "_all_rows", lambda _conn: 0)
    walked, walked_steps = _steps(conn, "needle here", limit=20)
    assert walked == [str(n) for n in _needles()][:20]
    with monkeypatch.context() as m:
        m.setattr(search_module, "_WALK_MIN_HITS", 10**9)  # the bound never reached: every hit looked up
        looked_up, lookup_steps = _steps(conn, "needle here", limit=20)
    assert looked_up == walked
    assert walked_steps < lookup_steps, (walked_steps, lookup_steps)
    for window in (1, 7, 3_000):
        with monkeypatch.context() as m:
            m.setattr(search_module, "_RECENT_ROWS", window)
            assert _pages(conn, "needle here", 37) == [str(n) for n in _needles()]


def test_a_short_query_in_a_large_session_reads_its_newest_rows_only(conn: sqlite3.Connection,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """In one session the walk goes over the newest messages of every session (their index entries alone)."""
    monkeypatch.setattr(search_module, "_SESSION_WALK_MIN_ROWS", 100)
    monkeypatch.setattr(search_module, "_RECENT_SESSION_ROWS", 600)
    newest = [str(n) for n in range(MESSAGES - 10, -1, -10)][:20]  # session s1: every tenth message
    walked, walked_steps = _steps(conn, "ss", limit=20, session_id="s1")
    assert walked == newest
    with monkeypatch.context() as m:
        m.setattr(search_module, "_SESSION_WALK_MIN_ROWS", 10**9)  # the session's rows, every one
        scanned, scan_steps = _steps(conn, "ss", limit=20, session_id="s1")
    assert scanned == newest
    assert walked_steps * 2 < scan_steps, (walked_steps, scan_steps)


def test_a_page_past_the_window_is_finished_by_the_scan_in_order(conn: sqlite3.Connection,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Hits in the window and older ones in one page; hits only older than the window; no hit at all; every
    page after a cursor: each page equals the scan's, and paging visits each hit once."""
    for query, limit in (("ne", 37), ("ÄP", 3), ("ÄP", 50), ("zz", 5), ("e ", 400)):
        with monkeypatch.context() as m:
            _scan_only(m)
            expected = _pages(conn, query, limit)
        for window in (1, 50, 290, 2_999, 3_000):
            with monkeypatch.context() as m:
                m.setattr(search_module, "_RECENT_ROWS", window)
                assert _pages(conn, query, limit) == expected, (query, limit, window)
    assert _pages(conn, "ne", 37) == [str(n) for n in _needles()] and len(_pages(conn, "ÄP", 3)) == 18


def _needles() -> list[int]:
    """The numbers of the messages that say "needle", newest first, but those of session 3 (in the trash)."""
    return [n for n in range(MESSAGES - 1, -1, -1) if n % 7 == 0 and n % 10 != 3]


# --------------------------------------------------------------------------- scope "tools"

TOOL_ALPHABET = "abé K"
WINDOWS = {"whole query": {"_RECENT_ROWS": 10**9, "_RECENT_TOOL_ROWS": 10**9, "_WALK_MIN_HITS": 10**9},
           "newest first, small windows": {"_RECENT_ROWS": 3, "_RECENT_TOOL_ROWS": 2, "_WALK_MIN_HITS": 0},
           "newest first, one row": {"_RECENT_ROWS": 1, "_RECENT_TOOL_ROWS": 1, "_WALK_MIN_HITS": 0},
           "dense hits forced": {"_RECENT_ROWS": 2, "_dense_tools": lambda *_: True},
           "as chosen": {}}

tool_rows = st.lists(
    st.tuples(st.integers(0, 2),  # session
              st.sampled_from(["tool", "tool", "user"]),
              st.text(alphabet=TOOL_ALPHABET, min_size=1, max_size=12),
              st.integers(1, 6),  # created second (ties are common)
              st.booleans()),  # tombstoned afterwards
    min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tool_rows, st.text(alphabet=TOOL_ALPHABET, min_size=1, max_size=4), st.integers(1, 4), st.booleans())
def test_tool_output_pages_are_the_whole_querys_in_every_window(
        rows: list[tuple[int, str, str, int, bool]], query: str, limit: int, trash_one: bool) -> None:
    """Tool rows (through the real indexer) with text rows between them, tombstones and a trashed session:
    every window and the dense-hits rule page the same ids, in the same order, as the whole query."""
    assume(query.strip())
    db = open_db()
    try:
        for n, (s, role, text, second, _) in enumerate(rows):
            sid = f"s{s}"
            if db.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
                index.insert_session(db, sid, now_ms=1, title=sid)
            block = ({"type": "tool_call", "callId": f"c{n}", "name": "Bash", "args": {}, "status": "ok",
                      "result": text} if role == "tool" else {"type": "text", "text": text})
            record = {"type": "message", "id": f"m{n}", "role": role, "blocks": [block],
                      "createdAt": now_rfc3339(1_785_056_400_000 + second * 1000)}
            db.execute("BEGIN")
            index.index_messages(db, sid, [IndexRecord(record, offset=n * 100, length=100)], indexed_len=None,
                                 file_epoch=None, now_ms=1)
            db.execute("COMMIT")
        for n, (s, _, _, _, gone) in enumerate(rows):
            if gone:
                index.set_deleted(db, f"s{s}", f"m{n}", True)
        if trash_one:
            db.execute("UPDATE sessions SET deleted_at = 1 WHERE id = 's1'")
        pages = {}
        for name, patches in WINDOWS.items():
            with contextlib.ExitStack() as stack:
                for attr, value in patches.items():
                    stack.enter_context(patched(search_module, attr, value))
                pages[name] = _tool_pages(db, query, limit)
        assert all(got == pages["whole query"] for got in pages.values()), pages
    finally:
        db.close()


def _tool_pages(db: sqlite3.Connection, query: str, limit: int) -> list[str]:
    got: list[str] = []
    cursor = None
    while True:
        res = search_messages(db, query, limit=limit, cursor=cursor, scope="tools")
        got.extend(r["messageId"] for r in res["results"])
        cursor = res["nextCursor"]
        if cursor is None:
            return got
