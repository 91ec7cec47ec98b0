"""A query holding U+FFFD against texts whose NUL the index stores as U+FFFD (store/search/stand_in.py).

Rows go through the real indexer from real transcript lines (a file per session, each row's
``line_offset``/``line_len`` its line), so the check reads what a host reads.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.indexing import index
from store.indexing.index import IndexRecord
from store.search.search import search_messages, search_sessions
from tests.dbkit import NOW

FFFD = "\ufffd"


class Transcripts:
    """Session transcripts under one directory; counts the paths search asks for."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.asked: list[str] = []

    def path(self, sid: str) -> Path:
        return self.root / f"{sid}.jsonl"

    def __call__(self, sid: str) -> Path:
        self.asked.append(sid)
        return self.path(sid)


@pytest.fixture
def files(tmp_path: Path) -> Transcripts:
    return Transcripts(tmp_path)


def text_row(mid: str, text: str, role: str = "user") -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": role, "createdAt": None, "blocks": [{"type": "text", "text": text}]}


def tool_row(mid: str, result: str) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": "tool", "toolName": "Bash", "createdAt": None, "blocks": [
        {"type": "tool_call", "callId": f"c-{mid}", "name": "Bash", "args": {}, "status": "ok", "result": result}]}


def add(conn: sqlite3.Connection, files: Transcripts, sid: str, *records: dict[str, Any]) -> None:
    """Append the records to the session's transcript and index them from their lines."""
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone() is None:
        index.insert_session(conn, sid, now_ms=NOW, title=f"session {sid}")
    path = files.path(sid)
    items = []
    with path.open("ab") as f:
        for r in records:
            line = orjson.dumps(r) + b"\n"
            items.append(IndexRecord(r, offset=f.tell(), length=len(line), line=line))
            f.write(line)
    conn.execute("BEGIN")
    index.index_messages(conn, sid, items, indexed_len=None, file_epoch=None, now_ms=NOW)
    conn.execute("COMMIT")


def ids(result: dict[str, Any]) -> list[str]:
    return sorted(r["messageId"] for r in result["results"])


def counts(result: dict[str, Any]) -> dict[str, int]:
    return {r["sessionId"]: r["messageMatches"] for r in result["results"]}


def test_a_nul_is_no_replacement_character_in_another_message(conn: sqlite3.Connection, files: Transcripts) -> None:
    add(conn, files, "s1", text_row("nul", "nul\x00x"), text_row("real", f"real {FFFD} here"))
    add(conn, files, "s2", text_row("nul2", "only \x00 here"))
    assert ids(search_messages(conn, FFFD, transcript=files)) == ["real"]
    assert ids(search_messages(conn, FFFD, session_id="s1", transcript=files)) == ["real"]
    assert ids(search_messages(conn, FFFD, session_id="s2", transcript=files)) == []
    found = search_sessions(conn, FFFD, transcript=files)
    assert counts(found) == {"s1": 1}
    assert found["totalMessageMatches"] == 1 and found["totalSessions"] == 1
    assert [s["messageId"] for s in found["results"][0]["snippets"]] == ["real"]
    # without transcripts the stored text decides (the old over-count): the check is what changed
    assert ids(search_messages(conn, FFFD)) == ["nul", "nul2", "real"]


def test_a_nul_and_a_replacement_character_in_one_message(conn: sqlite3.Connection, files: Transcripts) -> None:
    far = "y" * 300
    add(conn, files, "s1", text_row("both", f"ax\x00b {far} cy{FFFD}d end"))
    assert ids(search_messages(conn, FFFD, transcript=files)) == ["both"]
    assert ids(search_messages(conn, f"y{FFFD}d", transcript=files)) == ["both"]
    assert ids(search_messages(conn, f"x{FFFD}", transcript=files)) == []  # that one is the NUL
    assert ids(search_messages(conn, f"x{FFFD}b", transcript=files)) == []
    assert search_sessions(conn, f"x{FFFD}", transcript=files)["totalMessageMatches"] == 0
    # the snippet is cut around the real U+FFFD 300 characters on, not the NUL's stand-in at the start
    (hit,) = search_messages(conn, FFFD, transcript=files)["results"]
    assert f"cy{FFFD}d end" in hit["snippet"] and hit["snippet"].startswith("\u2026")
    (session,) = search_sessions(conn, FFFD, transcript=files)["results"]
    assert session["messageMatches"] == 1 and session["snippets"][0]["snippet"] == hit["snippet"]
    assert "\x00" not in hit["snippet"]


def test_case_folding_around_them(conn: sqlite3.Connection, files: Transcripts) -> None:
    add(conn, files, "s1", text_row("nul", "AB\x00CD"), text_row("real", f"AB{FFFD}CD"),
        text_row("greek", f"ΟΣ{FFFD}Σ"), text_row("greek-nul", "ΟΣ\x00Σ"))
    for query in (f"b{FFFD}c", f"B{FFFD}C", f"ab{FFFD}cd", f"{FFFD}c", f"b{FFFD}"):
        assert ids(search_messages(conn, query, transcript=files)) == ["real"], query
        assert search_sessions(conn, query, transcript=files)["totalMessageMatches"] == 1, query
    for query in (f"σ{FFFD}", f"ος{FFFD}σ", f"Σ{FFFD}ς"):
        assert ids(search_messages(conn, query, transcript=files)) == ["greek"], query
    assert ids(search_messages(conn, "b\ufffe", transcript=files)) == []  # U+FFFE is no stand-in
    assert ids(search_messages(conn, "ab", transcript=files)) == ["nul", "real"]


def test_short_queries_take_the_scan_and_are_exact(conn: sqlite3.Connection, files: Transcripts) -> None:
    """Under 3 characters (the LIKE/scan path) and at 3 and more: every query holding U+FFFD is
    checked the same way; a long session's newest-first walk too."""
    rows = [text_row(f"m{i}", f"pad {i} " + ("\x00" if i % 2 else FFFD) + " tail") for i in range(40)]
    add(conn, files, "s1", *rows)
    real = sorted(f"m{i}" for i in range(0, 40, 2))
    for query in (FFFD, f" {FFFD}", f"{FFFD} t", f"0 {FFFD} tail"):
        want = [m for m in real if f"{query}" in next(r for r in rows if r["id"] == m)["blocks"][0]["text"]]
        got: list[str] = []
        cursor = None
        while True:  # paged: every page full and exact
            page = search_messages(conn, query, limit=3, cursor=cursor, transcript=files)
            got += [r["messageId"] for r in page["results"]]
            cursor = page["nextCursor"]
            if cursor is None:
                break
            assert len(page["results"]) == 3
        assert sorted(got) == want, query
        assert search_sessions(conn, query, transcript=files)["totalMessageMatches"] == len(want), query


def test_ordinary_queries_read_no_line(conn: sqlite3.Connection, files: Transcripts) -> None:
    add(conn, files, "s1", text_row("nul", "nul\x00x tail"), text_row("real", f"real {FFFD} tail"),
        text_row("plain", "no marks tail"))
    for query in ("tail", "ta", "TAIL", "äil", "x tail"):
        search_messages(conn, query, transcript=files)
        search_sessions(conn, query, transcript=files)
    assert files.asked == []
    # a query holding U+FFFD reads only the rows whose stored text holds one and matches
    search_sessions(conn, FFFD, snippets_per_session=0, transcript=files)
    assert files.asked == ["s1"]  # one open for "nul" and "real" (not "plain": no U+FFFD)


def test_an_unreadable_line_keeps_the_index_answer_and_the_other_hits(
        conn: sqlite3.Connection, files: Transcripts) -> None:
    """A row whose line cannot be verified matches as its stored text says (the over-count of one row);
    the search neither fails nor loses the other sessions' answers."""
    add(conn, files, "good", text_row("g-nul", "a\x00b"), text_row("g-real", f"a{FFFD}b"))
    add(conn, files, "gone", text_row("x-nul", "a\x00b"))
    add(conn, files, "junk", text_row("j-nul", "a\x00b"))
    add(conn, files, "moved", text_row("v-nul", "a\x00b"))
    add(conn, files, "other", text_row("o-other", "a\x00c"), text_row("o-nul", "a\x00b"))
    files.path("gone").unlink()  # missing file
    files.path("junk").write_bytes(b"\xff" * files.path("junk").stat().st_size)  # not JSON
    files.path("moved").write_bytes(b"")  # the span is past the end
    # another message's line at the span: o-nul's span now holds o-other's line
    lines = files.path("other").read_bytes().splitlines(keepends=True)
    files.path("other").write_bytes(lines[0] + lines[0])
    found = search_sessions(conn, f"a{FFFD}b", transcript=files)
    assert counts(found) == {"good": 1, "gone": 1, "junk": 1, "moved": 1, "other": 1}
    assert ids(search_messages(conn, f"a{FFFD}b", transcript=files)) == ["g-real", "j-nul", "o-nul", "v-nul", "x-nul"]
    assert ids(search_messages(conn, f"a{FFFD}b", session_id="good", transcript=files)) == ["g-real"]


def test_tool_output_scope(conn: sqlite3.Connection, files: Transcripts) -> None:
    add(conn, files, "s1", tool_row("t-nul", "out\x00put"), tool_row("t-real", f"out{FFFD}put"),
        text_row("u-nul", "out\x00put"))
    assert ids(search_messages(conn, f"t{FFFD}p", scope="tools", transcript=files)) == ["t-real"]
    assert ids(search_messages(conn, f"t{FFFD}p", transcript=files)) == []
    found = search_sessions(conn, f"t{FFFD}p", scope="tools", transcript=files)
    assert counts(found) == {"s1": 1}
    assert [s["messageId"] for s in found["results"][0]["snippets"]] == ["t-real"]
