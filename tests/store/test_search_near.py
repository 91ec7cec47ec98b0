"""The NEAR rewrite of a trigram phrase matches exactly the phrase's rows (real FTS5 tables).

``near_rewrite`` relies on FTS5's NEAR window and on the trigram tokenizer's
one-token-per-character positions; these tests check both against SQLite
itself, with texts built to put the two halves at every offset FTS5 could
accept, not only where the phrase would put them.
"""

from __future__ import annotations

import sqlite3

from hypothesis import given, settings
from hypothesis import strategies as st

from store.search.search_text import fts_phrase, near_rewrite, near_rewrites

ALPHABET = "ab t"
FILLER = "x"  # not in ALPHABET: it never completes a trigram of the phrase


def _fts(texts: list[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='trigram')")
    conn.executemany("INSERT INTO t(rowid, text) VALUES (?, ?)", list(enumerate(texts, start=1)))
    return conn


def _match(conn: sqlite3.Connection, expr: str) -> set[int]:
    return {r[0] for r in conn.execute("SELECT rowid FROM t WHERE t MATCH ?", (expr,))}


def _overlays(a: str, b: str, span: int) -> list[str]:
    """Texts holding ``a`` at 0 and ``b`` at each offset in -span..span where they agree."""
    out = []
    for d in range(-span, span + 1):
        start = min(0, d)
        cells = [FILLER] * (max(len(a), d + len(b)) - start)
        ok = True
        for i, ch in enumerate(a):
            cells[i - start] = ch
        for i, ch in enumerate(b):
            at = d + i - start
            if cells[at] not in (FILLER, ch):
                ok = False
                break
            cells[at] = ch
        if ok:
            out.append(FILLER * 2 + "".join(cells) + FILLER * 2)
    return out


@settings(max_examples=150, deadline=None)
@given(
    phrase=st.text(alphabet=ALPHABET, min_size=5, max_size=10),
    noise=st.lists(st.text(alphabet=ALPHABET + "AB", min_size=3, max_size=40), max_size=30),
)
def test_near_rewrite_matches_exactly_the_phrase_rows(phrase: str, noise: list[str]) -> None:
    for skip in range(len(phrase) - 2):
        rewritten = near_rewrite(phrase, skip)
        if rewritten is None:
            continue
        a, b = phrase[: skip + 2], phrase[skip + 1 :]
        texts = _overlays(a, b, len(phrase) + 4) + noise + [t.upper() for t in noise] + [phrase.upper()]
        conn = _fts(texts)
        expected = {i for i, text in enumerate(texts, start=1) if phrase in text.lower()}
        assert _match(conn, fts_phrase(phrase)) == expected
        assert _match(conn, rewritten) == expected, (phrase, skip, rewritten)


def test_near_rewrite_is_refused_where_it_cannot_be_proven() -> None:
    assert near_rewrite("abcd", 1) is None  # 2 trigrams: nothing to leave out
    assert near_rewrite("t to the", 0) is None and near_rewrite("t to the", 5) is None  # ends stay
    assert near_rewrite("aaaaaaa", 2) is None  # every overlap agrees: "aaaa" near "aaaa" proves nothing
    assert near_rewrites("aaaaaaa") == {}
    assert near_rewrite("t to the", 4) == 'NEAR("t to t" "the", 1)'
    assert near_rewrite('a "q" b', 2) == 'NEAR("a ""q" "q"" b", 1)'
    assert near_rewrites("t to the")[4] == 'NEAR("t to t" "the", 1)'


def test_a_real_false_friend_is_not_matched() -> None:
    # "the" right before "t to t" (offset -4 from the phrase's point of view) is
    # inside FTS5's window only if the window were wider than near_rewrite assumes.
    conn = _fts(["thet to t", "t to the", "t to tXthe", "the t to t"])
    assert _match(conn, 'NEAR("t to t" "the", 1)') == {2}
