"""Property: search results equal a brute-force Python scan with the same predicate.

Random corpora mix ASCII, CJK, accented Latin-1 and the characters whose case
mapping is unusual (İ ı K ß ẞ Σ σ ς ſ), so every SQL path (trigram index,
ASCII ``lower`` + ``instr``, Python predicate) is compared with the scan.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import store.search.search as search_module
from store.search.search import (
    MAX_MESSAGE_LIMIT,
    MAX_SNIPPETS_PER_SESSION,
    literal_predicate,
    normalize_query,
    search_messages,
    search_sessions,
    snippet,
)
from store.search.search_text import find_literal, fold
from tests.store.search_corpus import Corpus, open_db, patched

ALPHABET = (
    "abcABC xyzXYZ iIkK 0129 %_\"\\'*-:()"
    "数据库连接池优化性能"
    "äöüÄÖÜéÉàçñß"
    "İıKẞΣσςſ\u0307\ufffd\ufffe"
)
ROLES = ("user", "assistant", "tool", "system")

# A second, tiny alphabet made of the characters whose lowercase involves ASCII
# from non-ASCII (İ → i + U+0307, K → k) and their neighbours, so the cases where
# SQLite's folding and ours disagree come up often instead of almost never.
HAZARD_ALPHABET = "abiIİıkKK xsSſ"
# Characters the trigram path handles (ASCII and caseless CJK).
PLAIN_ALPHABET = "abcABC xyz 09%_\"\\数据库连接"

texts = st.text(alphabet=ALPHABET, min_size=0, max_size=40) | st.text(alphabet=HAZARD_ALPHABET, max_size=20)


@dataclass(frozen=True)
class Msg:
    role: str
    text: str | None
    deleted: bool
    created_at: int


@dataclass(frozen=True)
class Sess:
    title: str
    project: str | None
    trashed: bool
    updated_at: int
    messages: tuple[Msg, ...]


THEMED: st.SearchStrategy[str | tuple[str, str]] = texts | st.tuples(texts, texts)
"""A text, or the two halves around the example's theme (:func:`_themed`): often sharing ``theme`` makes a query
drawn from it match several messages of a session (counts, paging, snippet limits). The strategies are built
once, not per example around its theme (building and validating them took a fifth of this module's CPU); the
draws are the same: the same three branches, the halves drawn in the same order."""
RAW_MESSAGE = st.tuples(st.sampled_from(ROLES), THEMED, st.sampled_from([False, False, False, True]),
                        st.integers(1, 30))
RAW_CORPUS = st.lists(st.tuples(THEMED, st.none() | texts.map(lambda t: "/p/" + t),
                                st.sampled_from([False, False, False, True]), st.integers(1, 20),
                                st.lists(RAW_MESSAGE, max_size=6)), min_size=1, max_size=6)


def _themed(text: str | tuple[str, str], theme: str) -> str:
    return text if isinstance(text, str) else text[0] + theme + text[1]


def corpus(raw: list[Any], theme: str) -> list[Sess]:
    """The sessions ``RAW_CORPUS`` drew, their texts themed."""
    return [Sess(_themed(title, theme), project, trashed, updated_at,
                 tuple(Msg(role, _themed(text, theme), deleted, created) for role, text, deleted, created in messages))
            for title, project, trashed, updated_at, messages in raw]


def _ascii_skeleton(s: str) -> str:
    """Each character replaced by the first character of its folding: "ABİ" → "abi", "Key" → "key"."""
    return "".join(fold(ch)[:1] for ch in s)


# Ways to turn a substring of the corpus into a query that should still find it
# (or, for upper(), deliberately may not: ß → SS).
QUERY_TRANSFORMS = (lambda s: s, str.upper, str.lower, str.swapcase, _ascii_skeleton)


@st.composite
def corpus_and_query(draw: st.DrawFn) -> tuple[list[Sess], str]:
    theme = draw(
        st.text(alphabet=ALPHABET, min_size=3, max_size=8) | st.text(alphabet=PLAIN_ALPHABET, min_size=3, max_size=8)
    )
    sessions = corpus(draw(RAW_CORPUS), theme)
    pool = [m.text for s in sessions for m in s.messages if m.text] + [s.title for s in sessions if s.title]
    pick = draw(st.sampled_from(("theme", "corpus", "random")))
    if pick == "theme":
        query = draw(st.sampled_from(QUERY_TRANSFORMS))(theme)
    elif pick == "corpus" and pool:
        source = draw(st.sampled_from(pool))
        start = draw(st.integers(0, len(source) - 1))
        end = draw(st.integers(start + 1, min(len(source), start + 12)))
        query = draw(st.sampled_from(QUERY_TRANSFORMS))(source[start:end])
    else:
        query = draw(st.text(alphabet=ALPHABET, min_size=1, max_size=6))
    if not query.strip():
        query = "a" + query
    return sessions, query


@dataclass
class Built:
    conn: sqlite3.Connection
    # (session id, updated_at, title, project path, [(message id, mid, seq, role, text, deleted, created)])
    sessions: list[tuple[str, int, str, str | None, bool, list[tuple[str, int, int, str, str | None, bool, int]]]]


def build(sessions: list[Sess]) -> Built:
    conn = open_db()
    corpus = Corpus(conn)
    built: list[Any] = []
    for i, s in enumerate(sessions):
        pid = corpus.project(s.project + f"#{i}", s.project) if s.project is not None else None
        sid = corpus.session(f"s{i:02d}", title=s.title, project_id=pid, deleted_at=1 if s.trashed else None)
        rows = []
        for j, m in enumerate(s.messages):
            text = m.text if m.text else None
            mid_id, mid = corpus.message(sid, text, role=m.role, deleted=m.deleted, created_at=m.created_at,
                                         thinking="hidden " + (m.text or ""))
            stored = conn.execute("SELECT text FROM messages WHERE mid = ?", (mid,)).fetchone()[0]
            rows.append((mid_id, mid, j + 1, m.role, stored, m.deleted, m.created_at))
        conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (s.updated_at, sid))
        path = s.project + f"#{i}" if s.project is not None else None
        built.append((sid, s.updated_at, s.title, path, s.trashed, rows))
    return Built(conn, built)


def brute_sessions(b: Built, query: str, snippets: int) -> list[dict[str, Any]]:
    pred = literal_predicate(query)
    out = []
    for sid, updated, title, path, trashed, rows in b.sessions:
        if trashed:
            continue
        hits = [r for r in rows if r[3] in ("user", "assistant") and not r[5] and pred(r[4])]
        name = path.rsplit("#", 1)[0] if path else None
        tm, pm = pred(title), bool(path) and (pred(path) or pred(name))
        if hits or tm or pm:
            out.append({
                "sessionId": sid, "title": title, "projectPath": path, "titleMatch": tm,
                "projectMatch": pm, "messageMatches": len(hits),
                "snippets": [{"messageId": r[0], "role": r[3], "seq": r[2], "snippet": snippet(r[4], query)}
                             for r in sorted(hits, key=lambda r: r[2])[:snippets]],
                "_key": (updated, sid),
            })
    out.sort(key=lambda r: r["_key"], reverse=True)
    for r in out:
        del r["_key"]
    return out


def brute_messages(b: Built, query: str, session_id: str | None = None) -> list[str]:
    pred = literal_predicate(query)
    hits = [
        (r[6], r[1], r[0])
        for sid, _, _, _, trashed, rows in b.sessions
        if not trashed and (session_id is None or sid == session_id)
        for r in rows
        if r[3] in ("user", "assistant") and not r[5] and pred(r[4])
    ]
    return [h[2] for h in sorted(hits, reverse=True)]


PROPERTY_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(corpus_and_query(), st.integers(1, 3), st.integers(0, 3))
def test_search_sessions_equals_brute_force(data: tuple[list[Sess], str], limit: int, snippets: int) -> None:
    sessions, raw_query = data
    query = normalize_query(raw_query)
    b = build(sessions)
    with contextlib.closing(b.conn):
        expected = brute_sessions(b, query, snippets)
        got: list[dict[str, Any]] = []
        cursor = None
        while True:
            res = search_sessions(b.conn, raw_query, limit=limit, cursor=cursor, snippets_per_session=snippets)
            assert res["totalSessions"] == len(expected)
            assert res["totalMessageMatches"] == sum(r["messageMatches"] for r in expected)
            assert len(res["results"]) <= limit
            got.extend(res["results"])
            cursor = res["nextCursor"]
            if cursor is None:
                break
        assert got == expected


# store.search.search picks how it gathers trigram matches by query length, hazard-row
# count and number of candidate sessions; each mode is forced here on the same
# random corpora, so every path is held to the brute-force scan.
SEARCH_MODES = {
    "every hit read, sessions by key": {"_COUNTS_MODE_MAX_CHARS": 0, "_PAGE_BY_KEY_MAX": 10**9},
    "counts in SQL, sessions streamed": {"_COUNTS_MODE_MAX_CHARS": 10**9, "_PAGE_BY_KEY_MAX": 0},
    "every hit read, sessions streamed": {"_COUNTS_MODE_MAX_CHARS": 0, "_PAGE_BY_KEY_MAX": 0},
    "too many hazard rows to probe": {"_COUNTS_MODE_MAX_CHARS": 10**9, "_HAZARD_PROBE_MAX": -1},
}


@pytest.mark.parametrize("mode", list(SEARCH_MODES))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus_and_query(), st.integers(1, 3), st.integers(0, 3))
def test_every_search_mode_equals_brute_force(
    mode: str, data: tuple[list[Sess], str], limit: int, snippets: int
) -> None:
    sessions, raw_query = data
    query = normalize_query(raw_query)
    b = build(sessions)
    with contextlib.closing(b.conn), contextlib.ExitStack() as patches:
        for name, value in SEARCH_MODES[mode].items():
            patches.enter_context(patched(search_module, name, value))
        expected = brute_sessions(b, query, snippets)
        got: list[dict[str, Any]] = []
        cursor = None
        while True:
            res = search_sessions(b.conn, raw_query, limit=limit, cursor=cursor, snippets_per_session=snippets)
            assert (res["totalSessions"], res["totalMessageMatches"]) == (
                len(expected), sum(r["messageMatches"] for r in expected))
            got.extend(res["results"])
            cursor = res["nextCursor"]
            if cursor is None:
                break
        assert got == expected


# search.query walks idx_messages_created for queries matching a large share of
# all messages; forced here for every trigram query.
MESSAGE_MODES = {
    "as chosen": {},
    "walk newest first": {"_WALK_MAX_CHARS": 10**9, "_WALK_MIN_HITS": 0, "_WALK_ROW_COST": 0},
    # a scanned query asks the newest rows first: a window of one and of three rows (the scan finishes
    # the page, or the window holds it whole)
    "newest row first": {"_RECENT_ROWS": 1},
    "newest rows first": {"_RECENT_ROWS": 3},
    # one session's newest rows first (a scanned query, and a trigram query with enough hits in it)
    "a session's newest row first": {"_SESSION_WALK_MIN_ROWS": 0, "_RECENT_SESSION_ROWS": 1, "_WALK_MIN_HITS": 0},
    "a session's newest rows first": {"_SESSION_WALK_MIN_ROWS": 0, "_RECENT_SESSION_ROWS": 4, "_WALK_MIN_HITS": 0},
    # every query with a hit walks: phrases (and trigrams) newest first, in a window of two rows
    "every hit walked, newest rows first": {"_RECENT_ROWS": 2, "_WALK_MIN_HITS": 0, "_all_rows": lambda conn: 0},
}


@pytest.mark.parametrize("mode", list(MESSAGE_MODES))
@PROPERTY_SETTINGS
@given(corpus_and_query(), st.integers(1, 4))
def test_search_messages_equals_brute_force(mode: str, data: tuple[list[Sess], str], limit: int) -> None:
    sessions, raw_query = data
    query = normalize_query(raw_query)
    b = build(sessions)
    with contextlib.ExitStack() as patches:
        for name, value in MESSAGE_MODES[mode].items():
            patches.enter_context(patched(search_module, name, value))
        _check_search_messages(b, raw_query, query, limit)


def _check_search_messages(b: Built, raw_query: str, query: str, limit: int) -> None:
    try:
        scopes: list[str | None] = [None] + [s[0] for s in b.sessions if not s[4]][:2]
        for scope in scopes:
            got: list[str] = []
            cursor = None
            while True:
                res = search_messages(b.conn, raw_query, session_id=scope, limit=limit, cursor=cursor)
                got.extend(r["messageId"] for r in res["results"])
                for r in res["results"]:
                    assert find_literal(r["snippet"], query) is not None or len(query) > 120
                cursor = res["nextCursor"]
                if cursor is None:
                    break
            assert got == brute_messages(b, query, scope)
    finally:
        b.conn.close()


@given(st.text(alphabet=ALPHABET, min_size=1, max_size=60), st.data())
def test_every_literal_substring_finds_its_text(text: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    assert literal_predicate(text[start:end])(text)
    assert fold(text) == "".join(fold(ch) for ch in text)


@given(
    st.text(alphabet=ALPHABET + "\n", max_size=300),
    st.text(alphabet=ALPHABET, min_size=1, max_size=8),
    st.text(alphabet=ALPHABET + "\n", max_size=300),
    st.integers(8, 80),
)
def test_snippet_always_contains_the_first_match(before: str, needle: str, after: str, width: int) -> None:
    text = before + needle + after
    span = find_literal(text, needle)
    assert span is not None
    out = snippet(text, needle, width=width)
    flat = text.replace("\n", " ")
    shown = flat[span[0]:span[1]]
    body = out.removeprefix("…").removesuffix("…")
    assert body in flat
    if span[1] - span[0] <= width:
        assert shown in body
    if not out.startswith("…"):
        assert flat.startswith(body)
    if not out.endswith("…"):
        assert flat.endswith(body)
    assert len(body) <= width + text.count("\u0307")  # combining marks are kept whole


# Mostly ASCII around one İ or K, so a query ending at the hazard is plain ASCII.
hazard_bodies = st.builds(
    lambda a, h, c: a + h + c,
    st.text(alphabet="abkixs IKS", max_size=8),
    st.sampled_from("İKſ"),
    st.text(alphabet="abkixs IKİſ", max_size=8),
) | st.text(alphabet=HAZARD_ALPHABET, min_size=1, max_size=20)


@pytest.mark.parametrize("mode", ["default", *SEARCH_MODES])
@PROPERTY_SETTINGS
@given(st.lists(hazard_bodies, min_size=1, max_size=6), st.data())
def test_trigram_path_agrees_with_predicate_on_case_hazards(
    mode: str, bodies: list[str], data: st.DataObject
) -> None:
    source = data.draw(st.sampled_from(bodies))
    hazards = [i + 1 for i, ch in enumerate(source) if ch in "İKſ"]
    # Often end the query right after a hazard character (where İ can match).
    end = data.draw(st.sampled_from(hazards) if hazards and data.draw(st.booleans()) else st.integers(1, len(source)))
    start = data.draw(st.integers(0, end - 1))
    transform = data.draw(st.sampled_from((_ascii_skeleton, *QUERY_TRANSFORMS)))
    query = transform(source[start:end])
    assume(query.strip() != "")
    messages = tuple(Msg("user", body, False, i) for i, body in enumerate(bodies))
    b = build([Sess("", None, False, 1, messages)])
    with contextlib.closing(b.conn), contextlib.ExitStack() as patches:
        for name, value in SEARCH_MODES.get(mode, {}).items():
            patches.enter_context(patched(search_module, name, value))
        got = [r["messageId"] for r in search_messages(b.conn, query, limit=MAX_MESSAGE_LIMIT)["results"]]
        assert got == brute_messages(b, normalize_query(query))
        res = search_sessions(b.conn, query, snippets_per_session=MAX_SNIPPETS_PER_SESSION)
        assert res["totalMessageMatches"] == len(got)
        shown = [s["messageId"] for r in res["results"] for s in r["snippets"]]
        assert shown == sorted(got, key=lambda m: [r[0] for r in b.sessions[0][5]].index(m))[:MAX_SNIPPETS_PER_SESSION]


@pytest.mark.parametrize("mode", ["default", *SEARCH_MODES])
@pytest.mark.parametrize("query", ["asb", "asbx"])
def test_a_rejected_hazard_hit_is_neither_counted_nor_shown(mode: str, query: str) -> None:
    # SQLite's trigram folding reads ſ (long s) as "s"; the search predicate does not.
    texts = ["aſbx before", "asbx first real match", "aſbx again", "asbx second"]
    b = build([Sess("", None, False, 1, tuple(Msg("user", t, False, i) for i, t in enumerate(texts)))])
    with contextlib.closing(b.conn), contextlib.ExitStack() as patches:
        for name, value in SEARCH_MODES.get(mode, {}).items():
            patches.enter_context(patched(search_module, name, value))
        res = search_sessions(b.conn, query, snippets_per_session=1)
        assert (res["totalSessions"], res["totalMessageMatches"]) == (1, 2)
        assert [s["seq"] for s in res["results"][0]["snippets"]] == [2]
        res = search_sessions(b.conn, query, snippets_per_session=2)
        assert [s["seq"] for s in res["results"][0]["snippets"]] == [2, 4]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=60), st.booleans())
def test_run_counts_counts_every_number(numbers: list[int], ascending: bool) -> None:
    """``run_counts`` (a regular-expression match per run of one number) counts what ``Counter`` counts,
    for runs in FTS5's ascending order and for numbers in any order (a run met twice adds up); prefixes
    of one another side by side (``12,123``, ``123,12``) are told apart."""
    if ascending:
        numbers = sorted(numbers)
    assert search_module.run_counts(",".join(map(str, numbers))) == Counter(numbers)


@pytest.mark.parametrize("joined", ["12,12,123,123,123,1234", "123,12,12,1,-1", "7, 7,7", "5,5,+5", "0,00,0"])
def test_run_counts_of_items_it_cannot_match_count_them_one_by_one(joined: str) -> None:
    """A sign, a space or a leading zero: the items are counted as ``int`` reads them, as before."""
    assert search_module.run_counts(joined) == Counter(int(item) for item in joined.split(","))
