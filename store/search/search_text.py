"""Literal, Unicode-aware text matching for search (seed 003 §4.8). Pure: no SQL.

The one matching rule
---------------------
A text matches a query when ``fold(query)`` occurs in ``fold(text)``, where::

    fold(s) = s.lower() with every "ς" (Greek final sigma) replaced by "σ"

Why ``lower`` and not ``casefold``: the seed asks for a "Unicode lowercase
literal predicate" that stays consistent with renderer highlighting, which
uses JavaScript's ``toLowerCase`` (the same Unicode default lowercase mapping
as Python's ``str.lower``). Consequences, all tested:

* ``ÄPFEL`` finds ``äpfel``; ``ΑΘΗΝΑ`` finds ``αθηνα``.
* ``ß`` has no one-letter uppercase in ``lower``'s world, so ``STRASSE`` does
  **not** find ``straße`` (``casefold`` would), and ``straße`` does not find
  ``STRASSE``. ``STRAẞE`` (capital sharp s, U+1E9E) does find ``straße``.
* Turkish: no locale tailoring. ``I`` lowers to ``i`` and ``İ`` (U+0130) to
  ``i`` + combining dot above (U+0307). So ``ISTANBUL`` finds ``istanbul`` but
  not ``ıstanbul`` (dotless ``ı`` is its own letter), ``İSTANBUL`` finds
  ``i̇stanbul`` but not ``istanbul``, and ``ABI`` finds ``ABİ`` (the ``i`` is
  the start of ``İ``'s expansion).
* Greek final sigma: ``str.lower`` picks ``σ`` or ``ς`` for ``Σ`` from context,
  which would make a literal substring of a text fail to find it (``ΟΣ`` →
  ``ος`` but ``ΟΣΑ`` → ``οσα``). Folding ``ς`` to ``σ`` makes the mapping
  context-free, so **every literal substring of a text finds that text**:
  ``ΟΔΟΣ``, ``οδος`` and ``οδοσ`` all find each other.
* No Unicode normalisation: ``é`` (U+00E9) and ``e`` + U+0301 are different.
* ``%``, ``_``, ``"``, ``\\`` and every other character are literal.

Because ``fold`` is a per-code-point mapping, ``snippet`` can map a match in
folded space back to original indices (only ``İ`` changes length).
"""

from __future__ import annotations

import bisect
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from store.errors import InvalidInput

MAX_QUERY_CHARS = 500

# Non-ASCII code points whose ``lower()`` contains ASCII characters, and the
# non-ASCII caseless characters that some other character lowers to.
# Both are facts about the running Python's Unicode tables; a test recomputes
# them over every code point so a Unicode upgrade that changes them fails loudly.
ASCII_LOWERING_NON_ASCII: dict[str, str] = {"\u0130": "i\u0307", "\u212a": "k"}
CASELESS_LOWER_TARGETS: frozenset[str] = frozenset({"\u0307"})

# SQLite's UTF-8 reader (LIKE, the trigram tokenizer) turns the noncharacters
# U+FFFE/U+FFFF into U+FFFD, so SQL cannot tell these three apart: a query
# holding one is matched by the Python predicate alone (never "plain").
SQLITE_UTF8_REPLACED: frozenset[str] = frozenset({"\ufffd", "\ufffe", "\uffff"})

# Where SQLite's trigram tokenizer folding (its built-in Unicode tables) and
# :func:`fold` disagree in a way a plain query can see: characters c with
# sqlite_fold(c) != fold(c) where either side holds a character a plain query
# can contain. İ (ours: "i" + U+0307, SQLite: itself) and ſ (ours: itself,
# SQLite: "s"). A text without them matches a plain query exactly when the
# trigram phrase matches it; searchable rows holding one are listed in
# ``search_hazard`` and checked with the predicate. A fact about the linked
# SQLite and the running Python: a test recomputes it over every code point.
TRIGRAM_TEXT_HAZARDS: tuple[str, ...] = ("\u0130", "\u017f")

_ELLIPSIS = "\u2026"
_WHITESPACE_TO_SPACE = str.maketrans({"\n": " ", "\r": " ", "\t": " ", "\v": " ", "\f": " ", "\x85": " ",
                                      "\u2028": " ", "\u2029": " "})


def fold(s: str) -> str:
    """The search case folding (see module docstring). Context-free per code point."""
    return s.lower().replace("\u03c2", "\u03c3")


# Unicode's White_Space property: what "trimmed of leading and trailing whitespace" takes off a query.
# ``str.strip()`` also takes the information separators U+001C-U+001F, control characters a text can hold
# and a query must then find ("\x1e" alone was refused as empty; "\x1fsep" searched for "sep").
WHITE_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)


def normalize_query(q: str) -> str:
    """Strip surrounding whitespace (:data:`WHITE_SPACE`) and validate: 1..500 code points, no NUL, no
    surrogates."""
    if not isinstance(q, str):
        raise InvalidInput("query must be a string", data={"field": "query"})
    stripped = q.strip(WHITE_SPACE)
    if not stripped:
        raise InvalidInput("query must not be empty", data={"field": "query"})
    if len(stripped) > MAX_QUERY_CHARS:
        raise InvalidInput(
            f"query is {len(stripped)} characters; at most {MAX_QUERY_CHARS} allowed",
            data={"field": "query", "max": MAX_QUERY_CHARS},
        )
    if "\x00" in stripped:
        raise InvalidInput("query must not contain NUL characters", data={"field": "query"})
    if any("\ud800" <= ch <= "\udfff" for ch in stripped):
        raise InvalidInput("query must not contain lone surrogates", data={"field": "query"})
    return stripped


def literal_predicate(query: str) -> Callable[[str | None], bool]:
    """``pred(text)`` is True when ``text`` contains ``query`` under :func:`fold`.

    ``None`` (tool rows) never matches. The query is used as given (callers pass
    :func:`normalize_query` output); an empty query is rejected.
    """
    if not query:
        raise InvalidInput("query must not be empty", data={"field": "query"})
    needle = fold(query)

    def pred(text: str | None) -> bool:
        return text is not None and needle in fold(text)

    return pred


def fold_contains(text: str | None, folded_needle: str | None) -> bool:
    """Same as ``literal_predicate`` with an already folded needle (for SQL functions)."""
    if text is None or not folded_needle:
        return False
    return folded_needle in fold(text)


def _is_caseless(ch: str) -> bool:
    return ch.lower() == ch and ch.upper() == ch and ch not in CASELESS_LOWER_TARGETS


@dataclass(frozen=True)
class QueryPlan:
    """How SQL can find the texts a query matches.

    ``plain``: every folded character is ASCII or a non-ASCII character without
    case (CJK, digits, most punctuation). Then SQLite's ASCII-only ``lower()``
    plus ``instr`` is exactly the predicate, except for texts containing ``İ``
    or ``K`` (the only non-ASCII characters that lower to ASCII), which
    ``hazard_chars`` names so SQL can hand those rows to the Python predicate.
    A query that is not plain (non-ASCII case mappings) is matched by the
    Python predicate alone.

    ``fts``: an FTS5 MATCH expression (quoted literal phrases) whose results are
    a superset of the predicate's matches, or None when the trigram index
    cannot be used (fewer than 3 characters, or not plain).

    ``fts_exact``: the trigram hits ARE the predicate's matches, except rows
    listed in ``search_hazard`` (texts holding a TRIGRAM_TEXT_HAZARDS
    character), which must be checked with the predicate. Holds whenever
    ``fts`` is set; a separate name so callers say which property they rely on.
    """

    query: str
    folded: str
    plain: bool
    needs_lower: bool
    hazard_chars: tuple[str, ...]
    fts: str | None
    fts_exact: bool = False
    fts_phrases: tuple[str, ...] = ()
    """The folded strings whose quoted phrases, OR-ed, make ``fts``."""


def fts_phrase(s: str) -> str:
    """``s`` as an FTS5 string literal (a phrase of its trigrams)."""
    return '"' + s.replace('"', '""') + '"'


def near_rewrite(phrase: str, skip: int) -> str | None:
    """An FTS5 expression equivalent to the trigram phrase ``phrase`` that does
    not read the trigram starting at character ``skip``, or None if that
    cannot be proven.

    The phrase's trigrams sit at consecutive token positions 0..k-1 (the
    trigram tokenizer emits one token per character). ``NEAR(A B, 1)`` with
    ``A = phrase[:skip+2]`` (tokens 0..skip-1) and ``B = phrase[skip+1:]``
    (tokens skip+1..k-1) matches when B starts ``d`` tokens after A with
    ``-(len B + 1) <= d <= len A + 1`` (FTS5's window: every phrase starts at
    most its length plus 1 before the last one to start). At ``d = len A + 1``
    A and B cover every character of the phrase, so the skipped trigram is
    there too: a phrase match. Every other allowed ``d`` makes A and B share at
    least one character; if each of those overlaps disagrees somewhere, no text
    can hold A and B that way, and the NEAR matches exactly the phrase's rows.
    Checked against real FTS5 tables in ``tests/store/test_search_near.py``.
    """
    k = len(phrase) - 2
    if not 1 <= skip <= k - 2:
        return None
    a, b = phrase[: skip + 2], phrase[skip + 1 :]
    la, lb = len(a) - 2, len(b) - 2
    for d in range(-(lb + 1), la + 2):
        if d == la + 1:
            continue
        lo, hi = max(0, d), min(len(a), d + len(b))
        if lo >= hi or all(a[x] == b[x - d] for x in range(lo, hi)):
            return None
    return f"NEAR({fts_phrase(a)} {fts_phrase(b)}, 1)"


def near_rewrites(phrase: str) -> dict[int, str]:
    """Every proven :func:`near_rewrite` of ``phrase``, by the position of the trigram it leaves out."""
    out: dict[int, str] = {}
    for i in range(1, len(phrase) - 3):
        rewritten = near_rewrite(phrase, i)
        if rewritten is not None:
            out[i] = rewritten
    return out


def plan_query(query: str) -> QueryPlan:
    folded = fold(query)
    plain = all(ord(ch) < 128 or (_is_caseless(ch) and ch not in SQLITE_UTF8_REPLACED) for ch in folded)
    needs_lower = plain and any("a" <= ch <= "z" for ch in folded)
    hazards: list[str] = []
    if plain:
        for src, lowered in ASCII_LOWERING_NON_ASCII.items():
            if any(ch in folded for ch in lowered if ord(ch) < 128):
                hazards.append(src)
    fts: str | None = None
    phrases: tuple[str, ...] = ()
    if plain and len(folded) >= 3:
        # The trigram tokenizer folds case with SQLite's own (simple) Unicode
        # folding, which maps K to k but leaves İ alone. In folded text İ is
        # "i" + U+0307; a plain query never contains U+0307, so İ can only take
        # part in a match as the query's LAST character: add that phrase too.
        phrases = (folded, folded[:-1] + "\u0130") if folded.endswith("i") else (folded,)
        fts = " OR ".join(fts_phrase(p) for p in phrases)
    return QueryPlan(query, folded, plain, needs_lower, tuple(hazards), fts, fts is not None, phrases)


def _fold_offsets(text: str) -> list[int] | None:
    """Start offset in ``fold(text)`` of each original code point (plus the end),
    or None when folding preserves length (then offsets are the identity)."""
    offsets = [0]
    total = 0
    changed = False
    for ch in text:
        n = len(fold(ch))
        changed = changed or n != 1
        total += n
        offsets.append(total)
    return offsets if changed else None


def find_literal(text: str, query: str) -> tuple[int, int] | None:
    """``(start, end)`` code-point span in ``text`` of the first match, or None.

    The match is found in folded space and mapped back to original indices;
    a match that begins or ends inside a character's expansion (``İ``) covers
    that whole character.
    """
    needle = fold(query)
    if not needle:
        return None
    folded = fold(text)
    pos = folded.find(needle)
    if pos < 0:
        return None
    end = pos + len(needle)
    if len(folded) == len(text):
        return pos, end
    offsets = _fold_offsets(text)
    assert offsets is not None
    start_i = bisect.bisect_right(offsets, pos) - 1
    end_i = bisect.bisect_left(offsets, end)
    return start_i, end_i


_ZWJ = "\u200d"
_MAX_CLUSTER_WIDEN = 32
"""How far a snippet window is widened on each side to keep a grapheme cluster whole."""


def _is_regional_indicator(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _joins_previous(text: str, i: int) -> bool:
    """Whether ``text[i]`` belongs to the grapheme cluster of ``text[i - 1]`` (``0 < i < len(text)``): a
    cut between them would show a stray mark, joiner or modifier, or half a flag.

    A close approximation of the extended grapheme cluster rules (UAX #29) from the characters alone:
    marks (every general category M, spacing marks too), a zero-width joiner and the character after
    it, variation selectors, emoji modifiers, tag characters, and the second regional indicator of a
    pair (counted from the start of its run)."""
    ch = text[i]
    if unicodedata.category(ch)[0] == "M" or ch == _ZWJ or text[i - 1] == _ZWJ:
        return True
    if ("\ufe00" <= ch <= "\ufe0f" or "\U000e0100" <= ch <= "\U000e01ef" or "\U0001f3fb" <= ch <= "\U0001f3ff"
            or "\U000e0020" <= ch <= "\U000e007f"):
        return True
    if _is_regional_indicator(ch):
        run = 0
        while i - run - 1 >= 0 and _is_regional_indicator(text[i - run - 1]):
            run += 1
        return run % 2 == 1
    return False


def snippet(text: str, query: str, *, width: int = 120) -> str:
    """A window of about ``width`` code points of ``text`` around the first match.

    The match is centred when it fits, and always inside the window (a match
    longer than ``width`` is shown from its start). ``…`` marks each side that
    was cut. Newlines (U+2028, U+2029 and NEL too) and tabs become spaces. A window never starts or ends in
    the middle of a grapheme cluster (a combining sequence, a ZWJ emoji sequence,
    a flag's regional-indicator pair, an emoji with its modifier, variation
    selector or tags: see :func:`_joins_previous`), unless the cluster runs on
    for more than ``_MAX_CLUSTER_WIDEN`` code points (a run of marks: the
    window would be the whole run). Without a match, the start of the text.
    """
    if width < 1:
        raise InvalidInput("snippet width must be at least 1", data={"field": "width"})
    span = find_literal(text, query) if query else None
    if span is None:
        start, end = 0, min(len(text), width)
    else:
        m_start, m_end = span
        m_len = m_end - m_start
        if m_len >= width:
            start, end = m_start, m_start + width
        else:
            start = max(0, m_start - (width - m_len) // 2)
            end = min(len(text), start + width)
            start = max(0, end - width)
    floor, ceiling = max(0, start - _MAX_CLUSTER_WIDEN), min(len(text), end + _MAX_CLUSTER_WIDEN)
    while start > floor and _joins_previous(text, start):
        start -= 1
    while end < ceiling and _joins_previous(text, end):
        end += 1
    body = text[start:end].translate(_WHITESPACE_TO_SPACE)
    return (_ELLIPSIS if start > 0 else "") + body + (_ELLIPSIS if end < len(text) else "")
