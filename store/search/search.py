"""Session discovery and message search over the SQLite index (seed 003 §4.8).

``search_sessions`` (``search.sessions``) and ``search_messages``
(``search.query``) share one matching rule, the literal predicate of
:mod:`store.search.search_text`: a user or assistant message matches when its indexed
``text`` (final answer text only; thinking is never indexed, tool rows have
NULL text) contains the query under Unicode lowercase folding. Tombstoned
messages (``deleted = 1``) and sessions in the trash (``deleted_at`` set) never
match. Subagent rows (§4.7a) are ordinary rows and match like any other.

How SQL finds the matches (every path returns exactly the predicate's set):

* ≥ 3 characters, all ASCII or caseless (CJK, digits, punctuation): the
  trigram index ``messages_fts`` (schema v22: it holds exactly the searchable
  rows, and ``rowid >> 24`` is the owning session's ``ordinal``) with a quoted
  literal phrase. A trigram phrase match IS the predicate for such queries
  (SQLite folds ASCII case like ``lower()``), except for texts holding one of
  ``search_text.TRIGRAM_TEXT_HAZARDS`` (listed in ``search_hazard``), which
  are checked with the Python predicate. ``search.sessions`` therefore counts
  from the FTS doclist alone: no row lookups, no text read, except for the
  hazard rows and the snippets of the returned page. A 3-character query (one
  trigram) is counted per session inside SQLite (the hits' ``rowid >> 24``
  joined into one string and counted by a C ``Counter``), and each page
  session's first hits come from a rowid-range read of the same doclist; a
  longer phrase (a costlier position merge, far fewer hits) is read once and
  every hit's rowid counted in Python; from 5 characters on, the phrase is
  usually rewritten to an exactly equivalent ``NEAR`` of its two halves that
  leaves its most common trigram unread (``_fts_expression``,
  ``search_text.near_rewrite``). With many candidate sessions the
  session rows are read in page order only until the page is full.
  ``search.query`` looks up each hit's row for its newest-first order but
  reads no text except for hazard rows; a trigram with very many hits instead
  walks ``idx_messages_created`` newest first (``_dense``). A longer phrase's
  hits are read up to the bound of ``_walk_bound`` (and looked up from that one
  read when fewer); past it the newest rows are walked, each checked with the
  scan's predicate (``_newest_first``).
* Shorter queries: a scan over ``messages.text`` verified in SQL with
  ``text LIKE '%folded%'`` (escaped; SQLite's LIKE folds ASCII case only) or
  ``instr`` and, for the few texts holding ``İ`` or ``K`` (the only non-ASCII
  characters that lower to ASCII), with the Python predicate.
* Queries whose case mapping is non-ASCII (``ÄPFEL``, ``ΣΟΦΙΑ``), or that hold
  U+FFFD..U+FFFF (SQLite reads all three as U+FFFD): the Python predicate
  (registered with ``create_function``) over ``messages.text``, because the
  trigram tokenizer's own case folding differs from ours. A query holding
  U+FFFD itself: the index stores a NUL as U+FFFD, so a row whose stored text
  matches and holds U+FFFD is checked against its transcript line
  (:mod:`store.search.stand_in`, the ``transcript`` argument), in the same SQL
  predicate (counts, pages, cursors) and for its snippet.
* ``search.query`` over every session with either of those two: the newest rows
  are walked first through ``idx_messages_created`` and the scan runs only for
  what they leave of a page (``_newest_first``), so a short query that
  matches many messages answers from the newest few hundred rows. The same for
  ``scope: "tools"``: a scanned query, and a trigram query with many candidates
  in ``tool_fts`` (``_dense_tools``). And in one session of many messages, for
  a scanned query or a trigram query with many hits in it
  (``_many_hits``): the walk goes over the newest messages of the whole
  index, reading the rows of that session only.

Nothing here writes: both functions work on read-only connections and run
their statements in one read transaction (a consistent snapshot) unless the
caller already has one open.

Paging is keyset-based (see :mod:`store.indexing.cursors`): sessions are ordered
by most recent activity ``(updated_at DESC, id DESC)`` and messages newest
first ``(created_at DESC, mid DESC)``; a new session or message sorts before
any outstanding cursor, so it never shifts a page boundary. (A session whose
``updated_at`` changes while a client pages moves like any recency-ordered
list.) Counts (``messageMatches``, ``totalSessions``,
``totalMessageMatches``) cover every match, not just the page.
"""

from __future__ import annotations

import bisect
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from store.errors import InvalidInput, SessionNotFound
from store.ids import validate_session_id
from store.indexing.cursors import decode_cursor, encode_cursor, index_identity, query_fingerprint
from store.indexing.sql_lists import in_chunks
from store.search.search_text import (
    QueryPlan,
    find_literal,
    fold_contains,
    fts_phrase,
    literal_predicate,
    near_rewrites,
    normalize_query,
    plan_query,
    snippet,
)
from store.search.stand_in import KIND_TEXT, KIND_TOOL, LINE_FN, LineTexts, TranscriptPath, needs_lines
from store.transcripts.records import NUL_STAND_IN as NUL_IN_INDEX
from store.transcripts.records import searchable
from store.upgrade.schema import MID_SEQ_BITS

__all__ = [
    "MAX_MESSAGE_LIMIT",
    "MAX_SESSION_LIMIT",
    "MAX_SNIPPETS_PER_SESSION",
    "SCOPES",
    "SEARCHABLE_ROLES",
    "find_literal",
    "literal_predicate",
    "normalize_query",
    "search_messages",
    "search_sessions",
    "search_tool_hits",
    "snippet",
]

SEARCHABLE_ROLES = ("user", "assistant")
SCOPES = ("messages", "tools")
"""``search.*`` scopes: user/assistant text (the default index) or tool output (schema v28)."""
MAX_SESSION_LIMIT = 100
MAX_MESSAGE_LIMIT = 500
MAX_SNIPPETS_PER_SESSION = 10
SNIPPET_WIDTH = 120

_FOLD_FN = "pihost_fold_contains"
_ROLES_SQL = "(" + ", ".join(f"'{r}'" for r in SEARCHABLE_ROLES) + ")"
_BEFORE_CURSOR = "(m.created_at, m.mid) < (:after_at, :after_mid)"
_SEARCHABLE_ROW = f"m.role IN {_ROLES_SQL} AND m.deleted = 0 AND m.text IS NOT NULL"
_LIVE_MESSAGE = f"{_SEARCHABLE_ROW} AND m.session_id NOT IN (SELECT id FROM sessions WHERE deleted_at IS NOT NULL)"
# Trigram candidates drive the loop (CROSS JOIN keeps that order) and each one
# is looked up by rowid; a scan reads the table in rowid order (NOT INDEXED: not
# via the (session_id, seq) index plus a lookup per row).
_FROM_FTS = (
    "messages_fts CROSS JOIN messages AS m NOT INDEXED ON m.mid = messages_fts.rowid "
    "WHERE messages_fts MATCH :fts AND"
)
_FROM_SCAN = "messages AS m NOT INDEXED WHERE"
# The rows of trigram hits already read (a JSON array of mids).
_FROM_HITS = "messages AS m WHERE m.mid IN (SELECT value FROM json_each(:hits)) AND"
_DETAIL_RE = re.compile(r"\bdetail\s*=\s*'?(\w+)", re.IGNORECASE)
# Newest first through idx_messages_created, each row asked of the trigram index
# (search.query for a trigram with very many hits, see _dense).
_FROM_CREATED_WALK = (
    "messages AS m INDEXED BY idx_messages_created WHERE EXISTS (SELECT 1 FROM messages_fts "
    "WHERE messages_fts MATCH :fts AND messages_fts.rowid = m.mid) AND"
)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInput(f"{name} must be an integer in {low}..{high}", data={"field": name})
    return value


def _match_sql(column: str, plan: QueryPlan) -> str:
    """A SQL boolean that is true exactly when ``column`` matches the query."""
    if column in _LINE_COLUMNS and needs_lines(plan.folded):
        # a query holding U+FFFD: rows whose stored U+FFFD may be a NUL are checked against their line
        return f"{LINE_FN}({column}, :fq, m.session_id, m.id, m.line_offset, m.line_len, {_LINE_COLUMNS[column]})"
    if not plan.plain:
        return f"{_FOLD_FN}({column}, :fq)"
    if not plan.needs_lower:
        return f"instr({column}, :fq) > 0"
    # LIKE folds ASCII case only, exactly like lower(), without copying the text.
    expr = f"{column} LIKE :like ESCAPE '\\'"
    if plan.hazard_chars:
        # CASE, not OR/AND: in a result column SQLite evaluates both operands of
        # OR/AND, which would call the Python predicate for every row.
        has = " OR ".join(f"instr({column}, :hz{i}) > 0" for i in range(len(plan.hazard_chars)))
        expr = f"(CASE WHEN {expr} THEN 1 WHEN {has} THEN {_FOLD_FN}({column}, :fq) ELSE 0 END)"
    return expr


# Derived texts that hold a NUL as U+FFFD (store/search/stand_in.py), by the SQL column (alias m: messages).
_LINE_COLUMNS = {"m.text": KIND_TEXT, "t.text": KIND_TOOL}


def _params(plan: QueryPlan) -> dict[str, Any]:
    like = plan.folded.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    params: dict[str, Any] = {"fq": plan.folded, "fts": plan.fts, "like": f"%{like}%"}
    for i, ch in enumerate(plan.hazard_chars):
        params[f"hz{i}"] = ch
    return params


@contextmanager
def _read_snapshot(conn: sqlite3.Connection, transcript: TranscriptPath | None = None) -> Iterator[LineTexts]:
    """Register the predicates and run the block in one read transaction (yields the line check of a
    query holding U+FFFD, :mod:`store.search.stand_in`)."""
    conn.create_function(_FOLD_FN, 2, fold_contains, deterministic=True)
    lines = LineTexts(transcript)
    lines.register(conn)
    try:
        if conn.in_transaction:
            yield lines
            return
        conn.execute("BEGIN")
        try:
            yield lines
        finally:
            conn.execute("ROLLBACK")  # read-only work: nothing to keep
    finally:
        lines.close()


def search_sessions(
    conn: sqlite3.Connection,
    query: str,
    *,
    limit: int = 20,
    cursor: str | None = None,
    snippets_per_session: int = 3,
    scope: str = "messages",
    transcript: TranscriptPath | None = None,
) -> dict[str, Any]:
    """``search.sessions``: sessions whose messages, title or project match.

    ``transcript(session_id)``: the session's transcript path, where a query holding U+FFFD checks the
    rows whose stored U+FFFD may stand for a NUL (:mod:`store.search.stand_in`; None: the stored text
    decides).

    ``scope="tools"`` counts and shows tool rows whose output matches instead
    of user/assistant messages (``tool_output``, see :func:`search_tool_hits`).

    Returns ``{results: [{sessionId, title, projectPath, titleMatch,
    projectMatch, messageMatches, snippets: [{messageId, role, seq,
    snippet}]}], totalSessions, totalMessageMatches, nextCursor}``.
    ``messageMatches`` counts every matching user/assistant message of the
    session; ``titleMatch``/``projectMatch`` (title, project path or name) are
    reported separately and never counted as messages. Snippets are the
    session's first matching messages in transcript order (``seq``).
    """
    q = normalize_query(query)
    _check_int("limit", limit, 1, MAX_SESSION_LIMIT)
    _check_int("snippetsPerSession", snippets_per_session, 0, MAX_SNIPPETS_PER_SESSION)
    _check_scope(scope)
    plan = plan_query(q)
    fingerprint = query_fingerprint("sessions", plan.folded, *_scope_part(scope))
    after = decode_cursor(cursor, "sessions", fingerprint, (int, str)) if cursor is not None else None
    params = _params(plan)
    with _read_snapshot(conn, transcript) as lines:
        flagged = _flagged(conn, plan, params)
        if scope == "tools":
            hits = search_tool_hits(conn, plan)
            found = _Found(plan, _counts_of_hits(hits), hits=hits, text_table="tool_output")
        elif plan.fts_exact:
            found = _trigram_matches(conn, plan, index_positions(conn))
        else:
            found = _scan_matches(conn, plan, params)
        return _sessions_reply(conn, found, flagged, after, fingerprint, limit, snippets_per_session, lines)


def _check_scope(scope: object) -> None:
    if scope not in SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(SCOPES)}", data={"field": "scope"})


def _scope_part(scope: str) -> tuple[str, ...]:
    """What a scope adds to a cursor's fingerprint (nothing for the default: old cursors stay valid)."""
    return () if scope == "messages" else (f"scope:{scope}",)


# Tool output search (schema v28): the candidates of an fts_exact plan come from
# tool_fts (every trigram of the query, no positions), the others from a scan of
# tool_output; every candidate's text is checked with the scan's exact predicate.
_FROM_TOOL_FTS = (
    "tool_fts CROSS JOIN tool_output AS t ON t.mid = tool_fts.rowid "
    "CROSS JOIN messages AS m ON m.mid = t.mid WHERE tool_fts MATCH :tfts AND"
)
_FROM_TOOL_SCAN = "tool_output AS t CROSS JOIN messages AS m ON m.mid = t.mid WHERE"


def _tool_source(plan: QueryPlan, params: dict[str, Any]) -> str:
    if plan.fts_exact:
        params["tfts"] = _candidates_expression(plan)
        return _FROM_TOOL_FTS
    return _FROM_TOOL_SCAN


def search_tool_hits(conn: sqlite3.Connection, plan: QueryPlan) -> list[int]:
    """The mids (ascending) of every tool row whose output (``tool_output.text``)
    matches, tombstoned rows excluded (trashed sessions are NOT filtered here).
    Runs inside the caller's read snapshot (:func:`_read_snapshot`)."""
    params = _params(plan)
    source = _tool_source(plan, params)
    return sorted(_joined_ints(conn, f"SELECT group_concat(m.mid) FROM {source} m.deleted = 0 AND "
                                     f"{_match_sql('t.text', plan)}", params))


def _joined_ints(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[int]:
    """The integers of a one-row ``group_concat`` query (one row crosses into Python, not one per item), in the
    order SQLite joined them; none for an empty result."""
    joined = conn.execute(sql, params).fetchone()[0]
    return [int(x) for x in joined.split(",")] if joined else []


def _flagged(conn: sqlite3.Connection, plan: QueryPlan, params: dict[str, Any]) -> dict[str, _Flag]:
    """The live sessions whose title or project (path or name) matches."""
    title_match = _match_sql("s.title", plan)
    # Projects are matched once each (a set computed once per statement), not
    # once per session; titles once per session. Title/project matches are
    # few: filtered in SQL, not fetched for every session.
    in_project = (
        "s.project_id IN (SELECT p.id FROM projects AS p "
        f"WHERE ({_match_sql('p.path', plan)}) OR ({_match_sql('p.name', plan)}))"
    )
    return {
        sid: _Flag(bool(tm), bool(pm), ordinal)
        for sid, tm, pm, ordinal in conn.execute(
            f"SELECT s.id, {title_match}, {in_project}, s.ordinal FROM sessions AS s "
            f"WHERE s.deleted_at IS NULL AND ({title_match} OR {in_project})",
            params,
        )
    }


def _sessions_reply(
    conn: sqlite3.Connection,
    found: _Found,
    flagged: dict[str, _Flag],
    after: tuple[Any, ...] | list[Any] | None,
    fingerprint: str,
    limit: int,
    snippets_per_session: int,
    lines: LineTexts,
) -> dict[str, Any]:
    """The ``search.sessions`` reply for these matches (inside the caller's read snapshot)."""
    matched, page, remaining_more = _matched_page(conn, found.counts, flagged, after, limit)
    labels = _titles_and_paths(conn, [h.session_id for h in page])
    snippets = found.snippets(conn, page, snippets_per_session, lines)
    results = [
        {
            "sessionId": h.session_id,
            "title": labels[h.session_id][0],
            "projectPath": labels[h.session_id][1],
            "titleMatch": h.title_match,
            "projectMatch": h.project_match,
            "messageMatches": h.message_matches,
            "snippets": snippets.get(h.session_id, []),
        }
        for h in page
    ]
    next_cursor = None
    if remaining_more:
        last = page[-1]
        next_cursor = encode_cursor("sessions", fingerprint, [last.updated_at, last.session_id])
    return {
        "results": results,
        "totalSessions": matched.sessions,
        "totalMessageMatches": matched.messages,
        "nextCursor": next_cursor,
    }


class _SessionHit(NamedTuple):
    updated_at: int
    session_id: str
    title_match: bool
    project_match: bool
    message_matches: int
    ordinal: int | None


class _Flag(NamedTuple):
    """A live session whose title or project matches (``ordinal`` links it to its message matches)."""

    title: bool
    project: bool
    ordinal: int | None


class _Totals(NamedTuple):
    sessions: int
    messages: int


# A 3-character query is ONE trigram: its doclist is cheap to read, so it is read
# twice (per-session counts in C, then a rowid range per page session for the
# snippets) instead of handing every hit to Python. Longer phrases cost a
# position merge of several doclists per read and usually hit far fewer rows:
# one read, every hit's rowid.
_COUNTS_MODE_MAX_CHARS = 3
# Counts mode checks hazard rows with one rowid probe of the trigram index each;
# past this many hazard rows the hits are filtered in Python instead.
_HAZARD_PROBE_MAX = 1000
# Up to this many candidate sessions their rows are fetched by key; past it the
# sessions are read in page order until the page is full.
_PAGE_BY_KEY_MAX = 500
# Phrases of 5+ characters leave their costliest skippable trigram out (see
# _fts_expression); the choice samples each candidate trigram's hits among the
# newest 1/_SAMPLE_SHARE of the sessions, for at most _SAMPLE_MAX candidates.
_SAMPLE_SHARE = 256
_SAMPLE_MAX = 6
# search.query (global) for a trigram query of at most _WALK_MAX_CHARS characters
# with many hits: walk idx_messages_created newest first, asking the trigram index
# about each row, instead of looking up every hit's row to sort them. A walked
# row costs about _WALK_ROW_COST hit lookups (measured at 1M messages: ~60 µs vs
# ~1.7 µs); see _dense for the rule.
_WALK_MAX_CHARS = 3
_WALK_ROW_COST = 35
_WALK_MIN_HITS = 1000
# search.query (global) for a query the trigram index cannot answer (under 3
# characters, or a non-ASCII case mapping): the newest _RECENT_ROWS rows are
# walked first, newest first through idx_messages_created, and the whole scan
# runs only when they hold less than a page. A query matching a share s of the
# messages stops after about limit / s rows (typing "es" into a search box); one
# that matches few pays the walk on top of the scan (measured at 1M messages:
# see _newest_first).
_RECENT_ROWS = 10_000
# The same for a tool-output query (scope "tools") that scans: a walked message
# costs several scanned output rows (tool rows are a share of all messages).
_RECENT_TOOL_ROWS = 2_500
# One session of more than _SESSION_WALK_MIN_ROWS messages (a scanned query, or a
# trigram query with many hits in it): the newest _RECENT_SESSION_ROWS messages
# of the whole index are walked (index entries of other sessions cost no row
# read), so an open, busy session answers from its newest rows; a walked row
# costs about five of the session scan's.
_RECENT_SESSION_ROWS = 2_000
_SESSION_WALK_MIN_ROWS = 8_000


@dataclass(frozen=True)
class _Found:
    """Message matches per session ordinal, and how to read a page's snippets.

    Exactly one source: ``hits`` (every matching mid, ascending), or trigram
    counts (``rejected``: hazard hits the predicate refused), or a scan
    (``params``: the query's SQL parameters).
    """

    plan: QueryPlan
    counts: dict[int, int]
    hits: list[int] | None = None
    rejected: frozenset[int] = frozenset()
    params: dict[str, Any] | None = None
    text_table: str = "messages"
    """Where the snippets' text is (``tool_output`` for tool output search)."""

    def snippets(self, conn: sqlite3.Connection, page: list[_SessionHit], n: int,
                 lines: LineTexts) -> dict[str, list[dict[str, Any]]]:
        """The first ``n`` matching messages (by seq) of each page session."""
        if n <= 0:
            return {}
        if self.params is not None:
            return _page_snippets(conn, page, self.plan, self.params, n, lines)
        wanted: list[int] = []
        for h in page:
            if h.message_matches <= 0 or h.ordinal is None:
                continue
            lo = h.ordinal << MID_SEQ_BITS
            hi = lo + (1 << MID_SEQ_BITS)
            if self.hits is not None:
                i = bisect.bisect_left(self.hits, lo)
                wanted.extend(mid for mid in self.hits[i : i + n] if mid < hi)
                continue
            if self.text_table != "messages":
                raise ValueError("counts without hits are for the messages index only")
            skip = sum(1 for mid in self.rejected if lo <= mid < hi)
            rows = conn.execute(
                "SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? AND rowid >= ? AND rowid < ? "
                "ORDER BY rowid LIMIT ?",
                (self.plan.fts, lo, hi, n + skip),
            )
            wanted.extend([r[0] for r in rows if r[0] not in self.rejected][:n])
        return _snippet_rows(conn, self.plan, wanted, lines, self.text_table)


def _fts_expression(conn: sqlite3.Connection, plan: QueryPlan) -> str:
    """``plan.fts``, with each phrase that allows it rewritten to skip one trigram.

    A phrase query reads the doclist of every trigram; one made only of common
    trigrams (``"t to the"``) reads hundreds of thousands of rows for each.
    :func:`store.search.search_text.near_rewrite` gives an exactly equivalent
    ``NEAR`` that does not read one of them; this picks the one with the most
    hits in a sample of the index (the newest sessions' rowid range), so the
    most expensive doclist is the one left out. Same rows, less reading.
    """
    if not plan.fts_phrases:
        raise ValueError("not a trigram query plan")
    parts: list[str] = []
    sample_from: int | None = None
    for phrase in plan.fts_phrases:
        rewrites = near_rewrites(phrase)
        if not rewrites:
            parts.append(fts_phrase(phrase))
            continue
        options = list(rewrites)
        if len(options) > _SAMPLE_MAX:
            step = len(options) / _SAMPLE_MAX
            options = [options[int(i * step)] for i in range(_SAMPLE_MAX)]
        if sample_from is None:
            top = conn.execute("SELECT max(ordinal) FROM sessions").fetchone()[0] or 0
            sample_from = max(0, int(top) - max(1, int(top) // _SAMPLE_SHARE) + 1) << MID_SEQ_BITS
        best, best_hits = options[0], -1
        for i in options:
            hits = conn.execute(
                "SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ? AND rowid >= ?",
                (fts_phrase(phrase[i : i + 3]), sample_from),
            ).fetchone()[0]
            if hits > best_hits:
                best, best_hits = i, hits
        parts.append(rewrites[best])
    return " OR ".join(parts)


def index_positions(conn: sqlite3.Connection) -> bool:
    """Does ``messages_fts`` keep token positions (FTS5 ``detail=full``, the default)?

    Without positions (``detail=none``/``column``) FTS5 refuses phrase and
    ``NEAR`` queries of more than one trigram: a longer query then asks for
    every one of its trigrams (``_candidates_expression``) and each candidate
    row's text is checked with the predicate in SQL (``_filtered_hits``).
    """
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()
    if row is None or not row[0]:
        return True
    match = _DETAIL_RE.search(str(row[0]))
    return match is None or match.group(1).lower() == "full"


def _candidates_expression(plan: QueryPlan) -> str:
    """An FTS5 expression for an index without positions: each phrase's distinct
    trigrams AND-ed, the phrases OR-ed. Its rows are a superset of the phrase
    query's (every trigram of a matching text is in the index)."""
    parts = []
    for phrase in plan.fts_phrases:
        grams = list(dict.fromkeys(phrase[i : i + 3] for i in range(len(phrase) - 2)))
        parts.append("(" + " AND ".join(fts_phrase(g) for g in grams) + ")")
    return " OR ".join(parts)


def _trigram_matches(conn: sqlite3.Connection, plan: QueryPlan, positions: bool) -> _Found:
    """Matches of a ``fts_exact`` plan (trashed sessions are NOT filtered here)."""
    n_hazard = int(conn.execute("SELECT count(*) FROM search_hazard").fetchone()[0])
    if len(plan.folded) <= _COUNTS_MODE_MAX_CHARS and n_hazard <= _HAZARD_PROBE_MAX:
        return _trigram_counts(conn, plan, n_hazard)
    hits = _exact_hits(conn, plan, n_hazard) if positions else _filtered_hits(conn, plan)
    return _Found(plan, _counts_of_hits(hits), hits=hits)


def _filtered_hits(conn: sqlite3.Connection, plan: QueryPlan) -> list[int]:
    """The mids (ascending) of every searchable message matching a ``fts_exact`` plan,
    from an index without positions: the rows holding all of the query's trigrams,
    each one's text checked in SQL with the scan's exact predicate (``_match_sql``,
    which also settles the hazard rows). Trashed sessions are NOT filtered here."""
    hits = _joined_ints(conn, f"SELECT group_concat(m.mid) FROM {_FROM_FTS} {_match_sql('m.text', plan)}",
                        {**_params(plan), "fts": _candidates_expression(plan)})
    hits.sort()
    return hits


def _trigram_counts(conn: sqlite3.Connection, plan: QueryPlan, n_hazard: int) -> _Found:
    """Per-ordinal counts without handing each hit to Python: SQLite concatenates
    the hits' ordinals (``rowid >> 24``) and a C ``Counter`` counts them."""
    blob = conn.execute(
        f"SELECT group_concat(rowid >> {MID_SEQ_BITS}) FROM messages_fts WHERE messages_fts MATCH ?", (plan.fts,)
    ).fetchone()[0]
    if not blob:
        return _Found(plan, {})
    counts = run_counts(blob)
    rejected: set[int] = set()
    if n_hazard:
        suspects = [
            r[0]
            for r in conn.execute(
                "SELECT rowid FROM messages_fts "
                "WHERE messages_fts MATCH ? AND rowid IN (SELECT mid FROM search_hazard)",
                (plan.fts,),
            )
        ]
        rejected = _rejected_hazards(conn, plan, suspects)
        for mid in rejected:
            ordinal = mid >> MID_SEQ_BITS
            counts[ordinal] -= 1
            if counts[ordinal] <= 0:
                del counts[ordinal]
    return _Found(plan, counts, rejected=frozenset(rejected))


_RUN = re.compile(r"(\d+)(?:,\1(?![0-9]))*")
"""One session's hits in :func:`run_counts`: a number, then the same number again after each comma."""


def run_counts(joined: str) -> dict[int, int]:
    """How many times each number occurs in ``joined``, non-negative integers joined by commas.

    FTS5 returns a query's rowids ascending, so the ordinals of one session's hits (``rowid >> 24``) come
    as one run of the same number: one regular-expression match each (the C matcher walks the run), not a
    Python string per hit as ``Counter(joined.split(","))`` made (measured at 1M messages, 40,000-90,000
    hits in some 4,800 sessions: ~35 % less time for the count, about half for 300,000 hits). A run met
    twice adds up. The matches must tile the string (each one starting right after the comma that ended
    the last); anything else (a sign, a space) and the items are counted one by one, as before."""
    counts: dict[int, int] = {}
    get = counts.get
    expected = 0
    for m in _RUN.finditer(joined):
        start, end = m.span()
        if start != expected:
            break
        first = m.group(1)
        ordinal = int(first)
        counts[ordinal] = get(ordinal, 0) + (end - start + 1) // (len(first) + 1)  # k items, k - 1 commas
        expected = end + 1
    if expected != len(joined) + 1:
        return dict(Counter(map(int, joined.split(","))))
    return counts


def _scan_matches(conn: sqlite3.Connection, plan: QueryPlan, params: dict[str, Any]) -> _Found:
    """Matches of a query the trigram index cannot answer: one scan of the live rows."""
    counts = dict(
        conn.execute(
            f"SELECT m.mid >> {MID_SEQ_BITS}, count(*) FROM {_FROM_SCAN} "
            f"{_LIVE_MESSAGE} AND {_match_sql('m.text', plan)} GROUP BY 1",
            params,
        ).fetchall()
    )
    return _Found(plan, counts, params=params)


def _counts_of_hits(hits: list[int]) -> dict[int, int]:
    """Matches per ordinal from sorted hits: one binary search per session with hits."""
    counts: dict[int, int] = {}
    i = 0
    while i < len(hits):
        ordinal = hits[i] >> MID_SEQ_BITS
        j = bisect.bisect_left(hits, (ordinal + 1) << MID_SEQ_BITS, i)
        counts[ordinal] = j - i
        i = j
    return counts


def _matched_page(
    conn: sqlite3.Connection,
    counts: dict[int, int],
    flagged: dict[str, _Flag],
    after: tuple[Any, ...] | list[Any] | None,
    limit: int,
) -> tuple[_Totals, list[_SessionHit], bool]:
    """Totals over every live matched session, the page after the cursor, and
    whether more follow. Sessions order by ``(updated_at, id)`` descending."""
    if not counts and not flagged:
        return _Totals(0, 0), [], False
    key = (after[0], after[1]) if after is not None else None

    def hit(sid: str, updated: int, ordinal: int | None) -> _SessionHit:
        flag = flagged.get(sid)
        n = counts.get(ordinal, 0) if ordinal is not None else 0
        return _SessionHit(int(updated), sid, bool(flag and flag.title), bool(flag and flag.project), n, ordinal)

    if len(counts) + len(flagged) <= _PAGE_BY_KEY_MAX:
        rows: list[tuple[str, int, int | None]] = []
        ordinals = list(counts)
        for marks, chunk in in_chunks(ordinals):
            rows += conn.execute(
                f"SELECT id, updated_at, ordinal FROM sessions WHERE deleted_at IS NULL AND ordinal IN ({marks})",
                chunk,
            ).fetchall()
        seen = {r[0] for r in rows}
        extra = [sid for sid in flagged if sid not in seen]
        if extra:
            marks = ",".join("?" for _ in extra)
            rows += conn.execute(
                f"SELECT id, updated_at, ordinal FROM sessions WHERE id IN ({marks})", extra
            ).fetchall()
        matched = sorted((hit(*r) for r in rows), key=lambda h: (h.updated_at, h.session_id), reverse=True)
        totals = _Totals(len(matched), sum(h.message_matches for h in matched))
        remaining = matched if key is None else [h for h in matched if (h.updated_at, h.session_id) < key]
        return totals, remaining[:limit], len(remaining) > limit
    # one string, not a row per session (5,000 sessions: 1.0 ms instead of 2.9)
    live = set(_joined_ints(conn, "SELECT group_concat(ordinal) FROM sessions "
                                  "WHERE deleted_at IS NULL AND ordinal IS NOT NULL"))
    live_counts = {o: n for o, n in counts.items() if o in live}
    flagged_only = sum(1 for f in flagged.values() if f.ordinal not in live_counts)
    totals = _Totals(len(live_counts) + flagged_only, sum(live_counts.values()))
    sql = "SELECT id, updated_at, ordinal FROM sessions WHERE deleted_at IS NULL"
    args: tuple[Any, ...] = ()
    if key is not None:
        sql += " AND (updated_at, id) < (?, ?)"
        args = key
    page: list[_SessionHit] = []
    for sid, updated, ordinal in conn.execute(sql + " ORDER BY updated_at DESC, id DESC", args):
        if ordinal in live_counts or sid in flagged:
            if len(page) == limit:
                return totals, page, True
            page.append(hit(sid, updated, ordinal))
    return totals, page, False


def _titles_and_paths(conn: sqlite3.Connection, session_ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """``id -> (title, project path)`` for the sessions of one page."""
    if not session_ids:
        return {}
    marks = ",".join("?" for _ in session_ids)
    return {
        sid: (title, path)
        for sid, title, path in conn.execute(
            "SELECT s.id, s.title, p.path FROM sessions AS s LEFT JOIN projects AS p ON p.id = s.project_id "
            f"WHERE s.id IN ({marks})",
            session_ids,
        )
    }


def _exact_hits(conn: sqlite3.Connection, plan: QueryPlan, n_hazard: int) -> list[int]:
    """The mids (ascending) of every searchable message matching a ``fts_exact`` plan.

    Trashed sessions are NOT filtered here (callers keep live sessions' ordinals).
    Only hits listed in ``search_hazard`` (``n_hazard`` rows) are read and checked. SQLite joins the
    rowids into one string (one row crosses into Python, not one per hit).
    """
    hits = _joined_ints(conn, "SELECT group_concat(rowid) FROM messages_fts WHERE messages_fts MATCH ?",
                        (_fts_expression(conn, plan),))
    if not hits:
        return []
    hits.sort()  # already ascending as FTS5 returns them; cheap insurance for the bisects
    if n_hazard == 0:
        return hits
    if n_hazard <= len(hits):  # read the (smaller) hazard list
        hazard = {r[0] for r in conn.execute("SELECT mid FROM search_hazard")}
        suspects = [mid for mid in hits if mid in hazard]
    else:  # probe the hazard list for each hit
        suspects = []
        for marks, chunk in in_chunks(hits):
            suspects.extend(r[0] for r in conn.execute(f"SELECT mid FROM search_hazard WHERE mid IN ({marks})", chunk))
    rejected = _rejected_hazards(conn, plan, suspects)
    return [mid for mid in hits if mid not in rejected] if rejected else hits


def _rejected_hazards(conn: sqlite3.Connection, plan: QueryPlan, suspects: list[int]) -> set[int]:
    """The hazard hits whose text does NOT satisfy the predicate."""
    if not suspects:
        return set()
    pred = literal_predicate(plan.query)
    rejected: set[int] = set()
    for marks, chunk in in_chunks(suspects):
        for mid, text in conn.execute(f"SELECT mid, text FROM messages WHERE mid IN ({marks})", chunk):
            if not pred(text):
                rejected.add(mid)
    return rejected


def _snippet_rows(
    conn: sqlite3.Connection, plan: QueryPlan, wanted: list[int], lines: LineTexts, text_table: str = "messages"
) -> dict[str, list[dict[str, Any]]]:
    """Snippets of the given mids, grouped by session, in mid (= seq) order."""
    out: dict[str, list[dict[str, Any]]] = {}
    source = "messages AS m" if text_table == "messages" else "messages AS m JOIN tool_output AS t ON t.mid = m.mid"
    column = "m.text" if text_table == "messages" else "t.text"
    for marks, chunk in in_chunks(wanted):
        for mid, sid, msg_id, role, seq, text in conn.execute(
            f"SELECT m.mid, m.session_id, m.id, m.role, m.seq, {column} FROM {source} WHERE m.mid IN ({marks}) "
            "ORDER BY m.mid",
            chunk,
        ):
            kind = KIND_TEXT if text_table == "messages" else KIND_TOOL
            out.setdefault(sid, []).append(
                {"messageId": msg_id, "role": role, "seq": seq,
                 "snippet": _snippet(conn, plan, lines, mid, text, kind)}
            )
    return out


def _page_snippets(
    conn: sqlite3.Connection,
    page: list[_SessionHit],
    plan: QueryPlan,
    params: dict[str, Any],
    n: int,
    lines: LineTexts,
) -> dict[str, list[dict[str, Any]]]:
    """The first ``n`` matching messages (by seq) of each page session, for
    queries the trigram index cannot answer: each session scanned in seq order
    until ``n`` matches."""
    if n <= 0:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for h in page:
        if h.message_matches <= 0:
            continue
        for mid, sid, msg_id, role, seq, text in conn.execute(
            f"SELECT m.mid, m.session_id, m.id, m.role, m.seq, m.text FROM messages AS m "
            f"WHERE m.session_id = :sid AND {_LIVE_MESSAGE} AND {_match_sql('m.text', plan)} "
            "ORDER BY m.seq LIMIT :n",
            {**params, "sid": h.session_id, "n": n},
        ):
            out.setdefault(sid, []).append(
                {"messageId": msg_id, "role": role, "seq": seq,
                 "snippet": _snippet(conn, plan, lines, mid, text, KIND_TEXT)}
            )
    return out


def _snippet(conn: sqlite3.Connection, plan: QueryPlan, lines: LineTexts, mid: int, text: str, kind: int) -> str:
    """The snippet of a matching row's stored ``text``. For a query holding U+FFFD, around the match in
    the message's real text (a stored U+FFFD may be a NUL the query does not match), shown as stored
    (the stand-in keeps every position; a line that cannot be verified: the stored text's first match)."""
    if needs_lines(plan.folded) and text is not None and NUL_IN_INDEX in text:
        row = conn.execute("SELECT session_id, id, line_offset, line_len FROM messages WHERE mid = ?",
                           (mid,)).fetchone()
        real = None if row is None else lines.real_text(text, row[0], row[1], row[2], row[3], kind)
        if real is not None:
            return searchable(snippet(real, plan.query, width=SNIPPET_WIDTH))
    return snippet(text, plan.query, width=SNIPPET_WIDTH)


def _dense(conn: sqlite3.Connection, plan: QueryPlan, fts: str, limit: int) -> bool:
    """Is walking ``idx_messages_created`` cheaper than looking up every hit?

    With ``h`` hits among ``n`` messages a page of ``limit`` takes about
    ``(limit + 1) * n / h`` walked rows, each costing ``_WALK_ROW_COST`` hit
    lookups, against ``h`` lookups: walk when ``h * h > _WALK_ROW_COST * (limit
    + 1) * n``. Hits are counted only up to that bound (``LIMIT``), so the
    answer costs at most that many doclist entries. ``sum(last_seq)`` counts
    every message (tool rows and trashed sessions too): an overestimate, so the
    walk is chosen only when it surely pays.
    """
    if len(plan.folded) > _WALK_MAX_CHARS:
        return False
    need = max(_WALK_MIN_HITS, math.isqrt(_WALK_ROW_COST * (limit + 1) * _all_rows(conn)) + 1)
    found = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?)", (fts, need)
    ).fetchone()[0]
    return bool(found >= need)


def search_messages(
    conn: sqlite3.Connection,
    query: str,
    *,
    session_id: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    scope: str = "messages",
    transcript: TranscriptPath | None = None,
) -> dict[str, Any]:
    """``search.query``: matching messages, newest first (``transcript``: see :func:`search_sessions`).

    ``scope="tools"``: tool rows whose output matches, newest first, the
    snippet cut from the output (see :func:`search_tool_hits`).

    Returns ``{results: [{sessionId, messageId, role, seq, snippet,
    createdAt}], nextCursor}`` (``createdAt`` in integer ms, as in the index).
    With ``session_id``, only that session (SessionNotFound if it does not
    exist or is in the trash): trigram queries read the session's mid range
    of the trigram index, other queries scan the session's rows.
    Newest-first order needs every hit's ``created_at`` (mids follow sessions,
    not time), so a global trigram query looks up each hit's row; only hazard
    rows are checked against the text. Except for a query that matches a large
    share of all messages (``"the"``): then walking ``idx_messages_created``
    newest first and asking the trigram index about each row finds a page
    after about ``limit / share`` rows (see ``_dense``).
    """
    q = normalize_query(query)
    _check_int("limit", limit, 1, MAX_MESSAGE_LIMIT)
    if session_id is not None:
        validate_session_id(session_id)
    _check_scope(scope)
    plan = plan_query(q)
    # the key holds mids (session ordinals): a cursor of an index since rebuilt is refused, never misread
    fingerprint = query_fingerprint("messages", plan.folded, session_id, *_scope_part(scope),
                                    *index_identity(conn))
    after = decode_cursor(cursor, "messages", fingerprint, (int, int)) if cursor is not None else None
    params = {**_params(plan), "sid": session_id, "lim": limit + 1}
    if scope == "tools":
        return _tool_messages(conn, plan, params, session_id, after, fingerprint, limit, transcript)
    positions = True
    if plan.fts_exact:
        # Trigram hits are searchable rows that match, except hazard rows.
        where = [f"(m.mid NOT IN (SELECT mid FROM search_hazard) OR {_FOLD_FN}(m.text, :fq))"]
        source = _FROM_FTS
        if session_id is None:
            where.append("m.session_id NOT IN (SELECT id FROM sessions WHERE deleted_at IS NOT NULL)")
        else:
            # One session: the mid range of its ordinal (FTS5 seeks to it).
            source += " messages_fts.rowid >= :lo AND messages_fts.rowid < :hi AND"
            params["lo"] = params["hi"] = 0
    elif session_id is not None:
        # One session: its (session_id, seq) index beats the global trigram index.
        where = [_LIVE_MESSAGE, _match_sql("m.text", plan)]
        source = "messages AS m WHERE m.session_id = :sid AND"
    else:
        where = [_LIVE_MESSAGE, _match_sql("m.text", plan)]
        source = _FROM_SCAN
    if after is not None:
        where.append(_BEFORE_CURSOR)
        params["after_at"], params["after_mid"] = after
    with _read_snapshot(conn, transcript) as lines:
        if plan.fts_exact and len(plan.folded) > _COUNTS_MODE_MAX_CHARS and not index_positions(conn):
            # No positions: every trigram of the query, each candidate's text checked.
            positions = False
            where[0] = _match_sql("m.text", plan)
            params["fts"] = _candidates_expression(plan)
        session_rows = 0
        walk_phrase = False
        if session_id is not None:
            live = conn.execute(
                "SELECT ordinal, last_seq FROM sessions WHERE id = ? AND deleted_at IS NULL", (session_id,)
            ).fetchone()
            if live is None:
                raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
            params["lo"] = int(live[0]) << MID_SEQ_BITS
            params["hi"] = (int(live[0]) + 1) << MID_SEQ_BITS
            session_rows = int(live[1])
        if plan.fts_exact and session_id is None:
            if positions:
                params["fts"] = _fts_expression(conn, plan)
            if _dense(conn, plan, params["fts"], limit):
                source = _FROM_CREATED_WALK
                if after is not None:
                    where.append("m.created_at <= :after_at")  # the walk starts at the cursor
            elif len(plan.folded) > _WALK_MAX_CHARS:
                # a phrase: its hits up to the walk's bound, kept when fewer (no second read); under
                # _WALK_MIN_HITS the messages need no counting
                hits = _phrase_hits(conn, params["fts"], _WALK_MIN_HITS)
                if len(hits) >= _WALK_MIN_HITS:
                    need = _walk_bound(limit, _all_rows(conn))
                    hits = _phrase_hits(conn, params["fts"], need) if need > len(hits) else hits
                    walk_phrase = len(hits) >= need
                if not walk_phrase:
                    source = _FROM_HITS
                    params["hits"] = orjson.dumps(hits).decode()
        if not plan.fts_exact and session_id is None:  # source is _FROM_SCAN
            rows = _newest_first(conn, where, params, after is not None)
        elif walk_phrase:
            # a phrase in very many messages: the newest rows first, each checked with the scan's predicate
            walk = [_LIVE_MESSAGE, _match_sql("m.text", plan)]
            if after is not None:
                walk.append(_BEFORE_CURSOR)
            rows = _newest_first(conn, where, params, after is not None, walk_where=walk, rest_source=_FROM_FTS)
        elif session_rows > _SESSION_WALK_MIN_ROWS and (
                not plan.fts_exact or _many_hits(conn, params["fts"], limit, session_rows, params)):
            # a large session: its newest rows first (the session's share of the newest messages)
            walk = [_SEARCHABLE_ROW, "m.mid >= :lo AND m.mid < :hi", _match_sql("m.text", plan)]
            if after is not None:
                walk.append(_BEFORE_CURSOR)
            rows = _newest_first(conn, where, params, after is not None, walk_where=walk, rest_source=source,
                                      window=_RECENT_SESSION_ROWS)
        else:
            rows = conn.execute(f"{_PAGE_ROWS} {source} {' AND '.join(where)} {_PAGE_ORDER}", params).fetchall()
        return _messages_reply(conn, plan, lines, rows, fingerprint, limit)


_PAGE_ROWS = "SELECT m.mid, m.id, m.session_id, m.role, m.seq, m.text, m.created_at FROM"
_TOOL_PAGE_ROWS = "SELECT m.mid, m.id, m.session_id, m.role, m.seq, t.text, m.created_at FROM"
_PAGE_ORDER = "ORDER BY m.created_at DESC, m.mid DESC LIMIT :lim"
_NEWEST_WALK = "messages AS m INDEXED BY idx_messages_created WHERE"
_TOOL_NEWEST_WALK = "messages AS m INDEXED BY idx_messages_created CROSS JOIN tool_output AS t ON t.mid = m.mid WHERE"


def _newest_first(conn: sqlite3.Connection, where: list[str], params: dict[str, Any], paged: bool, *,
                       walk_where: list[str] | None = None, select: str = _PAGE_ROWS,
                       walk_source: str = _NEWEST_WALK, rest_source: str = _FROM_SCAN,
                       window: int | None = None) -> list[Any]:
    """A ``search.query`` page that would otherwise read every match (``where`` holds the match and the
    cursor, ``:lim`` the page's rows; ``rest_source`` is how the whole query reads them; ``walk_where`` what
    a walked row must be, when ``where`` speaks of ``rest_source``'s tables: the same rows, checked on
    their own).

    The newest ``window`` messages (``_RECENT_ROWS``; after the cursor, when ``paged``) are asked first,
    walked newest first (``walk_source``); only when they hold fewer than ``:lim`` matches does
    ``rest_source`` read the older rows for the rest. Every row of the walk is newer than every row after
    it, so the page is the one the whole query gives.
    """
    after = "created_at <= :after_at AND (created_at, mid) < (:after_at, :after_mid)" if paged else "1"
    edge = conn.execute(  # the newest row past the window (index entries alone)
        f"SELECT created_at, mid FROM messages INDEXED BY idx_messages_created WHERE {after} "
        "ORDER BY created_at DESC, mid DESC LIMIT 1 OFFSET :window",
        {**params, "window": _RECENT_ROWS if window is None else window},
    ).fetchone()
    if edge is None:  # no more rows than the window: the whole query
        return conn.execute(f"{select} {rest_source} {' AND '.join(where)} {_PAGE_ORDER}", params).fetchall()
    bound = {**params, "edge_at": edge[0], "edge_mid": edge[1]}
    walk = ["m.created_at >= :edge_at", "(m.created_at, m.mid) > (:edge_at, :edge_mid)",
            *(where if walk_where is None else walk_where)]
    if paged:
        walk.insert(0, "m.created_at <= :after_at")  # the walk starts at the cursor
    recent = conn.execute(f"{select} {walk_source} {' AND '.join(walk)} {_PAGE_ORDER}", bound).fetchall()
    wanted = int(params["lim"]) - len(recent)
    if wanted <= 0:
        return list(recent)
    older = ["(m.created_at, m.mid) <= (:edge_at, :edge_mid)", *where]
    return [*recent, *conn.execute(f"{select} {rest_source} {' AND '.join(older)} {_PAGE_ORDER}",
                                   {**bound, "lim": wanted}).fetchall()]


def _live_ordinal(conn: sqlite3.Connection, session_id: str) -> int:
    live = conn.execute("SELECT ordinal FROM sessions WHERE id = ? AND deleted_at IS NULL", (session_id,)).fetchone()
    if live is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    return int(live[0])


def _tool_messages(
    conn: sqlite3.Connection,
    plan: QueryPlan,
    params: dict[str, Any],
    session_id: str | None,
    after: tuple[Any, ...] | list[Any] | None,
    fingerprint: str,
    limit: int,
    transcript: TranscriptPath | None,
) -> dict[str, Any]:
    """``search.query`` with ``scope="tools"``: tool rows whose output matches, newest first."""
    source = _tool_source(plan, params)
    where = ["m.deleted = 0", _match_sql("t.text", plan)]
    if session_id is None:
        where.append("m.session_id NOT IN (SELECT id FROM sessions WHERE deleted_at IS NOT NULL)")
    else:
        where.append("m.mid >= :lo AND m.mid < :hi")
    if after is not None:
        where.append("(m.created_at, m.mid) < (:after_at, :after_mid)")
        params["after_at"], params["after_mid"] = after
    with _read_snapshot(conn, transcript) as lines:
        if session_id is not None:
            ordinal = _live_ordinal(conn, session_id)
            params["lo"] = ordinal << MID_SEQ_BITS
            params["hi"] = (ordinal + 1) << MID_SEQ_BITS
        if session_id is None and (not plan.fts_exact or _dense_tools(conn, params["tfts"], limit)):
            rows = _newest_first(conn, where, params, after is not None, select=_TOOL_PAGE_ROWS,
                                      walk_source=_TOOL_NEWEST_WALK, rest_source=source,
                                      window=None if plan.fts_exact else _RECENT_TOOL_ROWS)
        else:
            rows = conn.execute(f"{_TOOL_PAGE_ROWS} {source} {' AND '.join(where)} {_PAGE_ORDER}", params).fetchall()
        return _messages_reply(conn, plan, lines, rows, fingerprint, limit, KIND_TOOL)


def _many_hits(conn: sqlite3.Connection, fts: str, limit: int, rows: int,
               session: dict[str, Any] | None = None) -> bool:
    """Past :func:`_walk_bound`, the trigram query's hits among ``rows`` messages: all of them, or one
    session's (its ``lo``/``hi`` mid range of the trigram index, from ``session``)."""
    need = _walk_bound(limit, rows)
    span = "" if session is None else "AND rowid >= :lo AND rowid < :hi "
    found = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM messages_fts WHERE messages_fts MATCH :fts {span}LIMIT :need)",
        {"fts": fts, "need": need, **({} if session is None else {"lo": session["lo"], "hi": session["hi"]})},
    ).fetchone()[0]
    return bool(found >= need)


def _phrase_hits(conn: sqlite3.Connection, fts: str, most: int) -> list[int]:
    """The mids of a trigram query's first ``most`` hits (rowid order)."""
    return [r[0] for r in conn.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH ? LIMIT ?",
                                       (fts, most))]


def _all_rows(conn: sqlite3.Connection) -> int:
    """Every message row (tool rows and trashed sessions too: an overestimate)."""
    return int(conn.execute("SELECT coalesce(sum(last_seq), 0) FROM sessions").fetchone()[0])


def _dense_tools(conn: sqlite3.Connection, candidates: str, limit: int) -> bool:
    """Are there enough tool-output candidates that walking the newest messages finds a page sooner than
    reading every candidate (:func:`_walk_bound`; a walked row reads a message row and an output row)?"""
    def at_least(need: int) -> bool:
        found = conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM tool_fts WHERE tool_fts MATCH ? LIMIT ?)", (candidates, need)
        ).fetchone()[0]
        return bool(found >= need)

    if not at_least(_WALK_MIN_HITS):  # few: no need to count the messages
        return False
    return at_least(_walk_bound(limit, _all_rows(conn)))


def _walk_bound(limit: int, rows: int) -> int:
    """The hits past which walking ``rows`` messages newest first finds a page sooner than reading every hit:
    with ``h`` hits a page takes about ``(limit + 1) * rows / h`` walked rows, each costing about one hit's
    lookup (a row read and the predicate), against ``h`` lookups (see :func:`_dense`)."""
    return max(_WALK_MIN_HITS, math.isqrt((limit + 1) * rows) + 1)


def _messages_reply(conn: sqlite3.Connection, plan: QueryPlan, lines: LineTexts, rows: list[Any], fingerprint: str,
                    limit: int, kind: int = KIND_TEXT) -> dict[str, Any]:
    """The ``search.query`` reply from up to ``limit + 1`` rows (mid, id, session, role, seq, text, created)."""
    page = rows[:limit]
    next_cursor = None
    if len(rows) > limit:
        last = page[-1]
        next_cursor = encode_cursor("messages", fingerprint, [int(last[6]), int(last[0])])
    return {
        "results": [
            {
                "sessionId": sid,
                "messageId": msg_id,
                "role": role,
                "seq": seq,
                "snippet": _snippet(conn, plan, lines, mid, text, kind),
                "createdAt": created,
            }
            for mid, msg_id, sid, role, seq, text, created in page
        ],
        "nextCursor": next_cursor,
    }
