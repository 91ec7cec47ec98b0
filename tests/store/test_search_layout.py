"""Schema v22 search layout: session-ordered mids, searchable-only FTS, trigram fold hazards, v21→v22."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from store.errors import LimitExceeded
from store.indexing.database import apply_pragmas
from store.indexing.index import IndexRecord, index_messages, insert_session, reindex_session
from store.search.search import literal_predicate, search_sessions
from store.search.search_text import SQLITE_UTF8_REPLACED, TRIGRAM_TEXT_HAZARDS, fold, plan_query
from store.upgrade.migrations import ddl_for_version, migrate
from store.upgrade.schema import MAX_SEQ, SCHEMA_VERSION, message_mid
from tests.store.search_corpus import Corpus, open_db

from ._sqlite_helpers import NOW_MS, build_db, connect_plain, schema_objects, user_version


def _sqlite_trigram_fold() -> dict[int, str]:
    """Every code point's folding by the linked SQLite's trigram tokenizer (via fts5vocab)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='trigram')")
        conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        cps = [cp for cp in range(1, 0x110000) if not 0xD800 <= cp <= 0xDFFF]
        chunk = 4096
        conn.executemany(
            "INSERT INTO t(rowid, x) VALUES (?, ?)",
            ((i // chunk, "".join(chr(cp) * 3 for cp in cps[i : i + chunk])) for i in range(0, len(cps), chunk)),
        )
        out: dict[int, str] = {}
        # only the trigram c'c'c' of one code point (filtered in SQL: a third of the rows reach Python)
        for term, doc, offset in conn.execute("SELECT term, doc, offset FROM v WHERE offset % 3 = 0"):
            assert len(term) == 3 and len(set(term)) == 1
            out[cps[doc * chunk + offset // 3]] = term[0]
        assert len(out) == len(cps)
        return out
    finally:
        conn.close()


def _query_chars(cps: Iterable[int]) -> set[str]:
    """Every character a plain folded query can hold (what plan_query lets through as ``c * 3``).

    Asked of plan_query a block of characters at a time (one call per code point took most of this
    test's time): a query is plain exactly when each of its folded characters is, so a block that gets
    an FTS plan holds only query characters, and a block that does not is asked again per character
    (at least one of them must then fail, else the block answer is wrong)."""
    folded_fixed = [chr(cp) for cp in cps if fold(chr(cp)) == chr(cp)]
    out: set[str] = set()
    block = 64
    for i in range(0, len(folded_fixed), block):
        chars = folded_fixed[i : i + block]
        if plan_query("".join(ch * 3 for ch in chars)).fts is not None:
            out.update(chars)
        else:
            passing = [ch for ch in chars if plan_query(ch * 3).fts is not None]
            assert len(passing) < len(chars)
            out.update(passing)
    return out


def test_trigram_fold_hazard_tables_match_the_linked_sqlite() -> None:
    """Recomputed over every code point: a SQLite or Python upgrade that changes them fails here."""
    sqlite_fold = _sqlite_trigram_fold()
    query_chars = _query_chars(sqlite_fold)
    assert query_chars.isdisjoint(SQLITE_UTF8_REPLACED)
    assert all(sqlite_fold[ord(q)] == q for q in query_chars)  # the query side folds alike
    text_hazards = {
        chr(cp) for cp, s in sqlite_fold.items()
        if s != fold(chr(cp)) and (s in query_chars or any(ch in query_chars for ch in fold(chr(cp))))
    }  # fmt: skip
    assert text_hazards == set(TRIGRAM_TEXT_HAZARDS)
    replaced = {chr(cp) for cp, s in sqlite_fold.items() if s == "\ufffd"}
    assert replaced == SQLITE_UTF8_REPLACED


def _counts(conn: sqlite3.Connection, query: str) -> tuple[int, dict[str, int]]:
    res = search_sessions(conn, query, limit=100, snippets_per_session=10)
    return res["totalMessageMatches"], {r["sessionId"]: r["messageMatches"] for r in res["results"]}


def _brute(conn: sqlite3.Connection, query: str) -> tuple[int, dict[str, int]]:
    pred = literal_predicate(query)
    per: Counter[str] = Counter()
    for sid, text in conn.execute(
        "SELECT m.session_id, m.text FROM messages m JOIN sessions s ON s.id = m.session_id "
        "WHERE s.deleted_at IS NULL AND m.role IN ('user', 'assistant') AND m.deleted = 0"
    ):
        if pred(text):
            per[sid] += 1
    return sum(per.values()), dict(per)


HAZARD_TEXTS = [
    "street food", "ſtreet food", "STREET", "İstanbul", "istanbul trip", "ABİ", "abi",
    "x\ufffey zz", "x\ufffdy zz", "x\uffffy zz", "Kelvin 5K", "kelvin",
]  # fmt: skip


@pytest.mark.parametrize(
    "query", ["street", "treet", "ſtreet", "istanbul", "abi", "x\ufffdy", "x\ufffey", "kelvin", "5k", "zz"]
)
def test_counts_are_exact_around_trigram_fold_hazards(query: str) -> None:
    conn = open_db()
    try:
        corpus = Corpus(conn)
        a, b = corpus.session("a"), corpus.session("b")
        for i, text in enumerate(HAZARD_TEXTS):
            corpus.message(a if i % 2 else b, text)
        corpus.message(a, "street", role="tool")
        corpus.message(b, "street", deleted=True)
        assert _counts(conn, query) == _brute(conn, query)
        res = search_sessions(conn, query, snippets_per_session=10)
        pred = literal_predicate(query)
        for r in res["results"]:
            for s in r["snippets"]:
                text = conn.execute("SELECT text FROM messages WHERE id = ?", (s["messageId"],)).fetchone()[0]
                assert pred(text)
    finally:
        conn.close()


def test_query_plans_flag_exact_trigram_use() -> None:
    assert plan_query("street").fts_exact and plan_query("数据库").fts_exact and plan_query("ABI").fts_exact
    assert not plan_query("st").fts_exact  # too short
    assert not plan_query("ÄPFEL").fts_exact  # non-ASCII case mapping
    assert plan_query("x\ufffey").fts is None and not plan_query("x\ufffdyz").plain


def _rec(mid: str, text: str | None, role: str = "user") -> IndexRecord:
    blocks = [{"type": "text", "text": text}] if text is not None else []
    return IndexRecord({"type": "message", "id": mid, "role": role, "blocks": blocks}, 0, 10)


def test_index_functions_assign_session_ordered_mids_and_enforce_the_seq_limit() -> None:
    conn = open_db()
    try:
        insert_session(conn, "a", now_ms=1)
        insert_session(conn, "b", now_ms=1)
        index_messages(conn, "b", [_rec("b1", "hello there"), _rec("b2", None, "tool")],
                       indexed_len=1, file_epoch="e", now_ms=2)
        index_messages(conn, "a", [_rec("a1", "hello again")], indexed_len=1, file_epoch="e", now_ms=2)
        index_messages(conn, "b", [_rec("b1", "hello replaced")], indexed_len=2, file_epoch="e", now_ms=3)
        mids = dict(conn.execute("SELECT id, mid FROM messages").fetchall())
        assert mids == {"a1": message_mid(1, 1), "b1": message_mid(2, 1), "b2": message_mid(2, 2)}
        assert _counts(conn, "hello") == (2, {"a": 1, "b": 1})
        reindex_session(conn, "b", [_rec("b2", None, "tool"), _rec("b3", "hello anew"), _rec("b1", "hello x")],
                        [], ["b1"], indexed_len=5, file_epoch="f", now_ms=4)
        mids = dict(conn.execute("SELECT id, mid FROM messages WHERE session_id = 'b'").fetchall())
        assert mids == {"b2": message_mid(2, 1), "b3": message_mid(2, 2), "b1": message_mid(2, 3)}
        assert _counts(conn, "hello") == (2, {"a": 1, "b": 1})  # b1 is tombstoned
        conn.execute("UPDATE sessions SET last_seq = ? WHERE id = 'a'", (MAX_SEQ,))
        with pytest.raises(LimitExceeded, match="more than 16777215 messages"):
            index_messages(conn, "a", [_rec("a-late", "one too many")], indexed_len=9, file_epoch="e", now_ms=5)
    finally:
        conn.close()


def _v21_with_data(path: Path) -> None:
    """A real v21 database: rowid mids, external-content FTS over every row."""
    build_db(path, ddl_for_version(21), 21)
    conn = connect_plain(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        rows = [
            # (session, created_at, trashed, [(role, text, deleted)])
            ("old", 10, False, [("user", "migrate the street map", 0), ("tool", None, 0),
                                ("assistant", "ſtreet is not a street", 0), ("user", "gone street", 1)]),
            ("new", 30, False, [("user", "İstanbul street", 0), ("system", "street rules", 0),
                                ("assistant", "数据库迁移", 0)]),
            ("mid", 20, True, [("user", "trashed street", 0)]),
        ]
        # mids far above 1 << 24 (a long-lived index), one of them equal to a
        # v22 mid of another session: the renumbering must not collide.
        next_mid = iter([message_mid(2, 1), (5 << 24) + 3, 1, 7, (9 << 24), 11, 12, 99999999])
        for sid, created, trashed, msgs in rows:
            conn.execute(
                "INSERT INTO sessions(id, title, created_at, updated_at, deleted_at, last_seq) VALUES (?,?,?,?,?,?)",
                (sid, f"title {sid}", created, created, 1 if trashed else None, len(msgs)),
            )
            for seq, (role, text, deleted) in enumerate(msgs, start=1):
                conn.execute(
                    "INSERT INTO messages(mid, id, session_id, seq, role, text, created_at, deleted) "
                    "VALUES (?,?,?,?,?,?,?,?)",
                    (next(next_mid), f"{sid}-{seq}", sid, seq, role, text, created + seq, deleted),
                )
    finally:
        conn.close()


def test_v21_database_migrates_to_v22_renumbering_mids_and_rebuilding_search(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    _v21_with_data(db)
    plain = connect_plain(db)
    before = plain.execute(
        "SELECT id, session_id, seq, role, text, created_at, deleted FROM messages ORDER BY id"
    ).fetchall()
    plain.close()
    conn = connect_plain(db)
    try:
        apply_pragmas(conn)
        result = migrate(conn, db, now_ms=NOW_MS)
        assert result.applied == [22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32]
        assert result.backups == [tmp_path / "pi.sqlite.v21.bak"]
        assert user_version(conn) == SCHEMA_VERSION == 32
        after = conn.execute(
            "SELECT id, session_id, seq, role, text, created_at, deleted FROM messages ORDER BY id"
        ).fetchall()
        assert after == before
        ordinals = dict(conn.execute("SELECT id, ordinal FROM sessions").fetchall())
        assert ordinals == {"old": 1, "mid": 2, "new": 3}  # by created_at
        for mid, sid, seq in conn.execute("SELECT mid, session_id, seq FROM messages"):
            assert mid == message_mid(ordinals[sid], seq)
        searchable = {
            mid for mid, role, text, deleted in conn.execute("SELECT mid, role, text, deleted FROM messages")
            if text is not None and role in ("user", "assistant") and not deleted
        }  # fmt: skip
        assert {r[0] for r in conn.execute("SELECT rowid FROM messages_fts")} == searchable
        assert {r[0] for r in conn.execute("SELECT mid FROM search_hazard")} == {
            message_mid(1, 3), message_mid(3, 1)
        }
        conn.execute("INSERT INTO messages_fts(messages_fts) VALUES ('integrity-check')")
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        for query in ("street", "STREET", "ſtreet", "istanbul", "数据库", "str", "rules"):
            assert _counts(conn, query) == _brute(conn, query), query
        assert _counts(conn, "street") == (3, {"old": 2, "new": 1})
        # the migrated database keeps working: new sessions and messages get v22 mids
        insert_session(conn, "later", now_ms=NOW_MS)
        index_messages(conn, "later", [_rec("l1", "street later")], indexed_len=1, file_epoch="e", now_ms=NOW_MS)
        assert conn.execute("SELECT mid FROM messages WHERE id = 'l1'").fetchone() == (message_mid(4, 1),)
        assert _counts(conn, "street") == (4, {"old": 2, "new": 1, "later": 1})
        migrated = schema_objects(conn)
    finally:
        conn.close()
    fresh = connect_plain(tmp_path / "fresh.sqlite")
    try:
        apply_pragmas(fresh)
        migrate(fresh, tmp_path / "fresh.sqlite", now_ms=NOW_MS)
        assert migrated == schema_objects(fresh)  # same objects, same SQL as a fresh install
    finally:
        fresh.close()
    old = sqlite3.connect(f"file:{tmp_path / 'pi.sqlite.v21.bak'}?mode=ro", uri=True)
    try:
        assert user_version(old) == 21
        assert old.execute("SELECT count(*) FROM messages").fetchone()[0] == len(before)
    finally:
        old.close()


def test_v22_database_gains_the_created_at_index_without_a_backup(tmp_path: Path) -> None:
    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(22), 22)
    conn = connect_plain(db)
    try:
        apply_pragmas(conn)
        corpus = Corpus(conn)
        sid = corpus.session("s1", title="one")
        for i in range(5):
            corpus.message(sid, f"message {i} about the search index", created_at=100 + i)
        result = migrate(conn, db, now_ms=NOW_MS)
        assert result.applied == list(range(23, 33)) and result.backups == []  # additive: no backup needed
        assert user_version(conn) == SCHEMA_VERSION
        plan = conn.execute("EXPLAIN QUERY PLAN SELECT mid FROM messages ORDER BY created_at DESC").fetchall()
        assert any("idx_messages_created" in str(row[-1]) for row in plan)
        assert search_sessions(conn, "search index")["totalMessageMatches"] == 5
        fresh_root = tmp_path / "fresh"
        fresh_root.mkdir()
        fresh = open_db(fresh_root / "pi.sqlite")
        try:
            assert schema_objects(conn) == schema_objects(fresh)
        finally:
            fresh.close()
    finally:
        conn.close()


def test_v31_database_gains_the_window_index_and_a_page_is_read_from_it_alone(tmp_path: Path) -> None:
    """v32 (additive, no backup): ``idx_messages_window`` is built from the rows there are and carries every
    column ``index.window_spans`` reads, so a page of a session touches index pages only (not one table page
    per row, whose searchable text makes it fat); the rows it returns are the table's."""
    from store.indexing.index import iter_window_spans, window_spans

    db = tmp_path / "pi.sqlite"
    build_db(db, ddl_for_version(31), 31)
    conn = connect_plain(db)
    try:
        apply_pragmas(conn)
        corpus = Corpus(conn)
        sid = corpus.session("s1", title="one")
        for i in range(7):
            corpus.message(sid, f"message {i} " + "x" * 3000, created_at=100 + i, deleted=i == 3)
        conn.execute("UPDATE messages SET line_offset = seq * 4000, line_len = 3990, wire_cut = seq * 8 + 1, "
                     "line_crc = seq * 7")
        table = conn.execute(
            "SELECT seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc FROM messages NOT INDEXED "
            "WHERE session_id = ? AND seq > 2 AND seq <= 6 ORDER BY seq", (sid,)).fetchall()
        result = migrate(conn, db, now_ms=NOW_MS)
        assert result.applied == [32] and result.backups == []
        assert user_version(conn) == SCHEMA_VERSION
        assert window_spans(conn, sid, 2, 6) == table
        assert list(iter_window_spans(conn, sid, 2, 6, newest_first=True)) == table[::-1]
        for sql in ("SELECT seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc FROM messages "
                    "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
                    "SELECT seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc FROM messages "
                    "WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq DESC"):
            plan = " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (sid, 2, 6)))
            assert "COVERING INDEX idx_messages_window" in plan, plan
        fresh_root = tmp_path / "fresh"
        fresh_root.mkdir()
        fresh = open_db(fresh_root / "pi.sqlite")
        try:
            assert schema_objects(conn) == schema_objects(fresh)  # same objects, same SQL as a fresh install
        finally:
            fresh.close()
    finally:
        conn.close()
