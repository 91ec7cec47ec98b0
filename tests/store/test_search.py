"""search.sessions / search.query over the real schema (seed 003 §4.8, §11.7, §11.12)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store.errors import InvalidId, InvalidInput, SessionNotFound
from store.search.search import literal_predicate, normalize_query, search_messages, search_sessions, snippet
from store.search.search_text import (
    ASCII_LOWERING_NON_ASCII,
    CASELESS_LOWER_TARGETS,
    MAX_QUERY_CHARS,
    WHITE_SPACE,
    fold,
    plan_query,
)
from tests.store.search_corpus import Corpus, open_db


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    c = open_db()
    yield c
    c.close()


@pytest.fixture
def corpus(conn: sqlite3.Connection) -> Corpus:
    return Corpus(conn)


def session_ids(result: dict[str, Any]) -> list[str]:
    return [r["sessionId"] for r in result["results"]]


def message_ids(result: dict[str, Any]) -> list[str]:
    return [r["messageId"] for r in result["results"]]


# --- normalize_query -----------------------------------------------------------


def test_normalize_query_strips_and_bounds() -> None:
    assert normalize_query("  数据库 \n") == "数据库"
    assert normalize_query("x" * MAX_QUERY_CHARS) == "x" * MAX_QUERY_CHARS
    # only Unicode White_Space is trimmed: the information separators are text a query can look for
    assert normalize_query("\x1e") == "\x1e" and normalize_query(" \x1fsep\u3000") == "\x1fsep"
    assert {chr(c) for c in range(0x110000) if chr(c).isspace()} - set(WHITE_SPACE) == set("\x1c\x1d\x1e\x1f")
    for bad in ["", "   \t\n", "x" * (MAX_QUERY_CHARS + 1), "a\x00b", "a\ud800b"]:
        with pytest.raises(InvalidInput) as info:
            normalize_query(bad)
        assert info.value.code == "INVALID_PARAMS"


def test_search_rejects_bad_paging_arguments(conn: sqlite3.Connection) -> None:
    for kwargs in ({"limit": 0}, {"limit": 101}, {"limit": True}, {"snippets_per_session": -1}):
        with pytest.raises(InvalidInput):
            search_sessions(conn, "abc", **kwargs)
    with pytest.raises(InvalidInput):
        search_messages(conn, "abc", limit=501)
    with pytest.raises(InvalidId):
        search_messages(conn, "abc", session_id="../etc")


# --- the literal predicate --------------------------------------------------------


def test_predicate_folds_unicode_case_not_just_ascii() -> None:
    assert literal_predicate("ÄPFEL")("Grüne äpfel schmecken")
    assert literal_predicate("äpfel")("GRÜNE ÄPFEL")
    assert literal_predicate("ΑΘΗΝΑ")("στην αθηνα")
    assert literal_predicate("hello")("say HeLLo there")
    assert not literal_predicate("apfel")("äpfel")  # no accent stripping
    assert not literal_predicate("x")(None)  # tool rows never match
    with pytest.raises(InvalidInput):
        literal_predicate("")


def test_predicate_sharp_s_follows_lower_not_casefold() -> None:
    # Documented choice: str.lower (JS toLowerCase), so ß is not expanded to ss.
    assert not literal_predicate("STRASSE")("die straße")
    assert not literal_predicate("straße")("DIE STRASSE")
    assert literal_predicate("STRAẞE")("die straße")  # capital sharp s U+1E9E
    assert literal_predicate("STRASSE")("die strasse")


def test_predicate_turkish_i_is_not_locale_tailored() -> None:
    assert literal_predicate("ISTANBUL")("istanbul")
    assert not literal_predicate("ISTANBUL")("ıstanbul")  # dotless ı is its own letter
    assert literal_predicate("ıstanbul")("ISTANBUL") is False
    assert literal_predicate("İSTANBUL")("i̇stanbul")  # İ lowers to i + U+0307
    assert not literal_predicate("İSTANBUL")("istanbul")
    assert literal_predicate("İstanbul")("İSTANBUL")
    assert literal_predicate("ABI")("ABİ")  # "i" is the start of İ's expansion


def test_predicate_greek_final_sigma_is_context_free() -> None:
    assert "ΟΣ".lower() == "ος" and "ΟΣΑ".lower() == "οσα"  # why plain lower() is not enough
    assert literal_predicate("ΟΣ")("ΟΣΑ")
    for q in ["ΟΔΟΣ", "οδος", "οδοσ"]:
        for text in ["η ΟΔΟΣ εδω", "η οδος", "η οδοσ"]:
            assert literal_predicate(q)(text), (q, text)


def test_predicate_characters_are_literal() -> None:
    assert not literal_predicate("50%")("500 items")
    assert literal_predicate("50%")("up 50% today")
    assert not literal_predicate("a_b")("axb")
    assert literal_predicate('say "hi"')('they say "hi" twice')
    assert literal_predicate("C:\\dir")("path C:\\dir\\x")
    assert not literal_predicate("C:\\dir")("path C:/dir")


def test_fold_tables_match_this_pythons_unicode_data() -> None:
    lowering_to_ascii: dict[str, str] = {}
    caseless_targets: set[str] = set()
    for cp in range(0x110000):
        ch = chr(cp)
        low = ch.lower()
        if low == ch:
            continue
        if cp >= 128 and any(ord(x) < 128 for x in low):
            lowering_to_ascii[ch] = low
        caseless_targets.update(
            x for x in low if ord(x) >= 128 and x.lower() == x and x.upper() == x
        )
    assert lowering_to_ascii == ASCII_LOWERING_NON_ASCII
    assert caseless_targets == CASELESS_LOWER_TARGETS


def test_query_plans() -> None:
    assert plan_query("ab").fts is None  # too short for trigrams
    assert plan_query("abc").fts == '"abc"'
    assert plan_query('a"b').fts == '"a""b"'
    assert plan_query("数据库").fts == '"数据库"'
    assert plan_query("ÄPFEL").fts is None  # non-ASCII case mapping → predicate scan
    assert plan_query("ABI").fts == '"abi" OR "abİ"'
    assert plan_query("key").hazard_chars == ("\u212a",)


# --- snippets ---------------------------------------------------------------------


def test_snippet_is_centered_on_a_match_far_from_the_start() -> None:
    text = "lorem ipsum " * 400 + "the NEEDLE is here" + " dolor sit" * 300
    out = snippet(text, "needle", width=60)
    assert "NEEDLE" in out
    assert out.startswith("…") and out.endswith("…")
    assert len(out) <= 62
    body = out.strip("…")
    centre = body.index("NEEDLE") + len("NEEDLE") / 2
    assert abs(centre - len(body) / 2) <= 2


def test_snippet_short_cjk_query_and_edges() -> None:
    text = "这是一个很长的句子。" * 50 + "我们需要优化数据库连接池" + "其他内容。" * 50
    out = snippet(text, "优化", width=20)
    assert "优化" in out and out.startswith("…") and out.endswith("…")
    assert snippet("短文本里有数据库", "数据库") == "短文本里有数据库"  # nothing cut, no ellipsis
    assert snippet("start match then lots of other words", "start", width=10) == "start matc…"
    assert snippet("x" * 50 + "END", "end", width=10) == "…xxxxxxxEND"
    assert snippet("line one\nline two", "two") == "line one line two"
    assert snippet("abc", "zzz") == "abc"


def test_snippet_maps_folded_positions_back_through_length_changes() -> None:
    # Each İ lowers to two code points: positions in folded text drift right.
    text = "İ" * 300 + " target word " + "İ" * 300
    out = snippet(text, "TARGET", width=30)
    assert "target word" in out
    assert snippet("xİy", "İ", width=1) == "…İ…"
    # A match longer than the window starts at the match.
    long_q = "abcdefghij" * 3
    assert snippet("zz " + long_q + " zz", long_q, width=10) == "…abcdefghij…"


# --- search.sessions ----------------------------------------------------------------


def test_ascii_and_cjk_substrings_across_sessions(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session(title="backend")
    b = corpus.session(title="后端")
    c = corpus.session(title="other")
    corpus.message(a, "我们需要优化数据库连接池的性能")
    corpus.message(b, "数据库")
    corpus.message(b, "The database connection pool is slow", role="assistant")
    corpus.message(c, "nothing relevant here")

    res = search_sessions(conn, "数据库")
    assert sorted(session_ids(res)) == sorted([a, b])
    assert res["totalMessageMatches"] == 2
    assert search_sessions(conn, "优化")["results"][0]["sessionId"] == a  # 2-char CJK
    assert session_ids(search_sessions(conn, "优化数据库连接"))  == [a]
    assert session_ids(search_sessions(conn, "CONNECTION POOL")) == [b]
    assert session_ids(search_sessions(conn, "ase conn")) == [b]
    hit = search_sessions(conn, "connection")["results"][0]
    assert hit["snippets"][0]["role"] == "assistant"
    assert "connection" in hit["snippets"][0]["snippet"]


def test_one_and_two_character_queries(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session()
    b = corpus.session()
    corpus.message(a, "x marks the spot")
    corpus.message(b, "Go is fine")
    corpus.message(b, "so is Rust")
    assert session_ids(search_sessions(conn, "x")) == [a]
    res = search_sessions(conn, "go")
    assert session_ids(res) == [b] and res["results"][0]["messageMatches"] == 1
    res = search_sessions(conn, "IS")
    assert session_ids(res) == [b] and res["results"][0]["messageMatches"] == 2
    assert search_sessions(conn, "q")["results"] == []


def test_unicode_case_folding_in_sessions(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session()
    corpus.message(a, "Ich esse gern äpfel und birnen")
    b = corpus.session()
    corpus.message(b, "Die straße ist lang")
    c = corpus.session()
    corpus.message(c, "\u212aey point")  # KELVIN SIGN lowers to ASCII k
    d = corpus.session()
    corpus.message(d, "ABİ geldi")
    assert session_ids(search_sessions(conn, "ÄPFEL")) == [a]
    assert session_ids(search_sessions(conn, "äpfel und")) == [a]
    assert search_sessions(conn, "STRASSE")["results"] == []
    assert session_ids(search_sessions(conn, "STRAẞE")) == [b]
    # ASCII queries on the trigram path still find the two non-ASCII letters that lower to ASCII.
    assert session_ids(search_sessions(conn, "key point")) == [c]
    assert session_ids(search_sessions(conn, "KEY")) == [c]
    assert session_ids(search_sessions(conn, "abi")) == [d]
    assert search_sessions(conn, "abig")["results"] == []


def test_special_characters_are_literal_in_sql_and_fts(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session()
    corpus.message(a, "we shipped 500 units")
    b = corpus.session()
    corpus.message(b, "growth was 50% this year")
    c = corpus.session()
    corpus.message(c, 'she said "hello" and file_name and C:\\temp\\x')
    d = corpus.session()
    corpus.message(d, "fileXname and C:/temp and NEAR(x y) AND *")
    assert session_ids(search_sessions(conn, "50%")) == [b]
    assert session_ids(search_sessions(conn, "%")) == [b]
    assert session_ids(search_sessions(conn, "_")) == [c]
    assert session_ids(search_sessions(conn, "file_name")) == [c]
    assert session_ids(search_sessions(conn, '"hello"')) == [c]
    assert session_ids(search_sessions(conn, '"')) == [c]
    assert session_ids(search_sessions(conn, "C:\\temp")) == [c]
    assert session_ids(search_sessions(conn, "\\")) == [c]
    assert session_ids(search_sessions(conn, "NEAR(x")) == [d]
    assert session_ids(search_sessions(conn, "AND *")) == [d]
    assert session_ids(search_messages(conn, "50%")) == [b]


def test_counts_every_match_before_paging(corpus: Corpus, conn: sqlite3.Connection) -> None:
    big = corpus.session(title="big")
    for i in range(30):
        corpus.message(big, f"message {i} mentions the kubernetes cluster", role="user" if i % 2 else "assistant")
    small = corpus.session(title="small")  # more recent, so it is on page 1
    corpus.message(small, "one kubernetes mention")
    first = search_sessions(conn, "kubernetes", limit=1, snippets_per_session=3)
    assert first["totalSessions"] == 2
    assert first["totalMessageMatches"] == 31
    assert session_ids(first) == [small]
    second = search_sessions(conn, "kubernetes", limit=1, snippets_per_session=3, cursor=first["nextCursor"])
    (hit,) = second["results"]
    assert hit["sessionId"] == big and hit["messageMatches"] == 30
    assert [s["seq"] for s in hit["snippets"]] == [1, 2, 3]  # first matches in transcript order
    assert second["totalMessageMatches"] == 31 and second["nextCursor"] is None
    # The short-query scan path counts the same way.
    assert search_sessions(conn, "s ", limit=1, cursor=None)["totalMessageMatches"] == 31


def test_snippets_of_a_long_session_with_sparse_matches(corpus: Corpus, conn: sqlite3.Connection) -> None:
    # 1,500 rows and 5 matches: the first 3 matches come from one pass over the
    # trigram candidates rather than a scan of the whole session.
    long = corpus.session()
    match_seqs = [100, 400, 700, 1000, 1300]
    for seq in range(1, 1501):
        corpus.message(long, f"zeppelin {seq}" if seq in match_seqs else f"filler {seq}",
                       deleted=seq == 1000)
    dense = corpus.session()
    for seq in range(1, 11):
        corpus.message(dense, f"zeppelin dense {seq}")
    res = search_sessions(conn, "ZEPPELIN", snippets_per_session=3)
    by_id = {r["sessionId"]: r for r in res["results"]}
    assert by_id[long]["messageMatches"] == 4
    assert [s["seq"] for s in by_id[long]["snippets"]] == [100, 400, 700]
    assert [s["seq"] for s in by_id[dense]["snippets"]] == [1, 2, 3]
    assert res["totalMessageMatches"] == 14


def test_deleted_sessions_tombstones_tools_system_and_thinking_never_match(
    corpus: Corpus, conn: sqlite3.Connection
) -> None:
    live = corpus.session(title="live")
    trashed = corpus.session(title="zebra trashed", deleted_at=5)
    corpus.message(trashed, "zebra in the trash")
    corpus.message(live, "zebra tombstoned", deleted=True)
    corpus.message(live, "zebra from a tool", role="tool")  # tool rows have NULL text
    corpus.message(live, "zebra system notice", role="system")
    corpus.message(live, "the final answer", role="assistant", thinking="zebra reasoning ZZTHINK")
    assert conn.execute("SELECT count(*) FROM messages WHERE text IS NULL").fetchone()[0] == 1
    for q in ["zebra", "ze", "ZZTHINK", "reasoning", "tool"]:
        res = search_sessions(conn, q)
        assert res["results"] == [] and res["totalSessions"] == 0, q
        assert res["totalMessageMatches"] == 0
        assert search_messages(conn, q)["results"] == [], q
    assert session_ids(search_sessions(conn, "final answer")) == [live]
    with pytest.raises(SessionNotFound):
        search_messages(conn, "zebra", session_id=trashed)


def test_title_and_project_matches_are_reported_separately(corpus: Corpus, conn: sqlite3.Connection) -> None:
    proj = corpus.project("/home/me/work/Payments-Service", "Payments-Service")
    titled = corpus.session(title="Refactor PAYMENTS flow")
    in_project = corpus.session(title="misc", project_id=proj)
    body = corpus.session(title="other")
    corpus.message(body, "payments are processed nightly")
    corpus.message(titled, "unrelated words")
    res = search_sessions(conn, "payments")
    by_id = {r["sessionId"]: r for r in res["results"]}
    assert by_id[titled]["titleMatch"] and not by_id[titled]["projectMatch"]
    assert by_id[titled]["messageMatches"] == 0 and by_id[titled]["snippets"] == []
    assert by_id[in_project]["projectMatch"] and not by_id[in_project]["titleMatch"]
    assert by_id[in_project]["projectPath"] == "/home/me/work/Payments-Service"
    assert by_id[body]["messageMatches"] == 1 and not by_id[body]["titleMatch"]
    assert res["totalSessions"] == 3 and res["totalMessageMatches"] == 1
    assert session_ids(search_sessions(conn, "me/work")) == [in_project]  # path, not only name


def test_sessions_ordered_by_recent_activity(corpus: Corpus, conn: sqlite3.Connection) -> None:
    old = corpus.session(updated_at=10)
    new = corpus.session(updated_at=10)
    corpus.message(old, "alpha one", created_at=5)
    corpus.message(new, "alpha two", created_at=6)
    # Equal updated_at: ties broken by id, descending.
    assert session_ids(search_sessions(conn, "alpha")) == sorted([old, new], reverse=True)
    corpus.message(old, "alpha three", created_at=99)
    assert session_ids(search_sessions(conn, "alpha")) == [old, new]


def test_session_cursor_visits_every_session_once_while_sessions_arrive(
    corpus: Corpus, conn: sqlite3.Connection
) -> None:
    originals = set()
    for i in range(25):
        sid = corpus.session(title=f"t{i}")
        corpus.message(sid, f"shared topic {i}")
        originals.add(sid)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        res = search_sessions(conn, "shared topic", limit=4, cursor=cursor)
        seen.extend(session_ids(res))
        pages += 1
        # New matching sessions arrive between pages: they sort before the cursor.
        newcomer = corpus.session()
        corpus.message(newcomer, "shared topic newcomer")
        cursor = res["nextCursor"]
        if cursor is None:
            break
    assert pages == 7
    assert len(seen) == len(set(seen)) == 25
    assert set(seen) == originals


def test_message_search_newest_first_with_stable_cursor(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session()
    b = corpus.session()
    expected: list[tuple[int, int, str]] = []
    for i in range(23):
        sid = a if i % 3 else b
        created = 1000 + (i // 2)  # ties on created_at are broken by mid
        mid_id, mid = corpus.message(sid, f"needle number {i}", created_at=created,
                                     role="assistant" if i % 2 else "user")
        expected.append((created, mid, mid_id))
    expected.sort(reverse=True)
    got: list[str] = []
    cursor = None
    while True:
        res = search_messages(conn, "NEEDLE", limit=5, cursor=cursor)
        got.extend(message_ids(res))
        late_sid = corpus.session()
        corpus.message(late_sid, "needle arriving late", created_at=5000)
        cursor = res["nextCursor"]
        if cursor is None:
            break
    assert got == [e[2] for e in expected]
    first = search_messages(conn, "needle", limit=1)["results"][0]
    assert set(first) == {"sessionId", "messageId", "role", "seq", "snippet", "createdAt"}
    assert first["createdAt"] == 5000


def test_message_search_within_one_session(corpus: Corpus, conn: sqlite3.Connection) -> None:
    a = corpus.session()
    b = corpus.session()
    corpus.message(a, "redis cache", created_at=1)
    corpus.message(b, "redis cache too", created_at=2)
    corpus.message(a, "more redis", created_at=3)
    res = search_messages(conn, "redis", session_id=a)
    assert [r["seq"] for r in res["results"]] == [2, 1]
    assert {r["sessionId"] for r in res["results"]} == {a}
    with pytest.raises(SessionNotFound):
        search_messages(conn, "redis", session_id="nope")


def test_cursor_is_bound_to_its_query(corpus: Corpus, conn: sqlite3.Connection) -> None:
    for _ in range(3):
        sid = corpus.session()
        corpus.message(sid, "abc def")
    cur = search_sessions(conn, "abc", limit=1)["nextCursor"]
    assert cur is not None
    assert search_sessions(conn, "ABC", limit=1, cursor=cur)["results"]  # same folded query
    for bad_call in (
        lambda: search_sessions(conn, "def", limit=1, cursor=cur),
        lambda: search_messages(conn, "abc", cursor=cur),
        lambda: search_sessions(conn, "abc", cursor="!!not-a-cursor"),
        lambda: search_sessions(conn, "abc", cursor="W10"),  # valid base64 of "[]"
    ):
        with pytest.raises(InvalidInput):
            bad_call()


def test_works_on_a_read_only_connection(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    writer = open_db(db)
    corpus = Corpus(writer)
    sid = corpus.session(title="ro")
    corpus.message(sid, "read only search works")
    writer.close()
    ro = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        ro.execute("PRAGMA query_only = ON")
        assert session_ids(search_sessions(ro, "only search")) == [sid]
        assert session_ids(search_sessions(ro, "ÖNLY"))  == []
        assert message_ids(search_messages(ro, "ly"))
        assert ro.in_transaction is False  # the read snapshot is closed again
    finally:
        ro.close()


def test_runs_inside_a_callers_open_transaction(corpus: Corpus, conn: sqlite3.Connection) -> None:
    sid = corpus.session()
    conn.execute("BEGIN")
    corpus.message(sid, "uncommitted but visible to this connection")
    assert session_ids(search_sessions(conn, "uncommitted")) == [sid]
    assert conn.in_transaction  # not committed or rolled back by search
    conn.execute("ROLLBACK")
    assert search_sessions(conn, "uncommitted")["results"] == []


def test_fold_is_per_code_point() -> None:
    s = "ΟΔΟΣ İK ß Σa ς"
    assert fold(s) == "".join(fold(ch) for ch in s)
