"""search.sessions counts in SQLite (few hazard rows) and from the sorted hits (many): same answer."""

from __future__ import annotations

import pytest

from store import search
from tests.store.search_corpus import Corpus, open_db

TEXTS = [
    "the İnteresting kilo test",  # İ: SQLite's trigram folding and str.lower() disagree
    "ſtrange long s inside the test",
    "plain the text with kilo words",
    "KILO in capitals and the rest",
    "nothing to see",
    "ınteresting dotless",
    "the the the",
]


def _build() -> Corpus:
    corpus = Corpus(open_db())
    for s in range(6):
        sid = corpus.session(title=f"session {s}")
        for i, text in enumerate(TEXTS * 3):
            corpus.message(sid, text, role="user" if i % 2 else "assistant")
    return corpus


@pytest.mark.parametrize("query", ["the", "kilo", "interesting", "İnt", "test", "str", "ſtr", "zzz"])
def test_sql_counts_equal_hit_counts(monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    corpus = _build()
    fast = search.search_sessions(corpus.conn, query, limit=3, snippets_per_session=2)
    monkeypatch.setattr(search, "HAZARD_PROBE_MAX", -1)  # force the sorted-hits path
    slow = search.search_sessions(corpus.conn, query, limit=3, snippets_per_session=2)
    assert fast == slow
    pred = search.literal_predicate(query)
    expected = sum(1 for t in TEXTS * 3 if pred(t)) * 6
    assert fast["totalMessageMatches"] == expected
