"""JSON in and out of the storage layer.

Two directions with different contracts:

* :func:`loads_strict` parses *client input*. It accepts only what the
  transcript writer can always encode again (RELIABILITY.md rule 12): no
  ``NaN``/``Infinity``, no duplicate object keys, no lone surrogates, no invalid
  UTF-8, bounded nesting and bounded integer size. orjson does the parsing (it
  already rejects NaN, lone surrogates and bad UTF-8, and stops at depth 1024
  without recursion); the remaining checks run as C-speed passes over the raw
  text with the string contents blanked out.
* :func:`dumps_line` / :func:`loads_line` write and read one transcript line
  (docs/DESIGN.md "Transcript file format"): orjson, ``type`` first, ``id``
  second, ``\\n`` terminated.
* :func:`loads_stored` reads back a JSON column of the index. The host writes
  only valid JSON there, so a value that does not parse (or is not the shape
  the host wrote) is damage of that one record: ``CorruptData`` naming it,
  never a host bug. The index is not quarantined for it: the tables that
  hold JSON are mostly state only the database holds (tasks, turns, settings),
  which a rebuild from the transcripts would lose. :func:`stored_value` is the
  same for a value outside its column's set, and :func:`readable` decodes a
  listing's rows one by one: a damaged record is left out and named, never the
  whole listing lost for it.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from store.errors import DamagedRecord, InvalidInput
from store.rules import MAX_JSON_DEPTH

__all__ = [
    "IntegerOutOfRange",
    "NestingTooDeep",
    "Readable",
    "StrictJSONError",
    "dumps_exact",
    "dumps_line",
    "loads_exact",
    "loads_line",
    "loads_stored",
    "loads_strict",
    "now_rfc3339",
    "readable",
    "stored_value",
]

_Row = TypeVar("_Row")
_Item = TypeVar("_Item")
_Other = TypeVar("_Other")

# bytes.translate tables for the structural pre-scan.
_NON_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_BRACES_TO_BRACKETS = bytes.maketrans(b"{}", b"[]")
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
# orjson loses precision above 64 bits (it returns a float); any run of 20+
# digits outside strings sends the document down the exact (stdlib) path.
_LONG_DIGIT_RUN = b"0" * 20
# With ``int64=True`` a run of 19 digits may already be outside int64 (orjson keeps
# such values up to 2**64 - 1 as ints and turns smaller negatives into floats).
_INT64_DIGIT_RUN = b"0" * 19
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
# An integer token (not a fraction or exponent part) in the structural text.
_INT_TOKEN_RE = re.compile(rb"(?<![0-9.eE+\-])-?[0-9]+(?![0-9.eE])")


class StrictJSONError(InvalidInput):
    """Client JSON was malformed or outside the strict profile; nothing changed."""

    code = "PARSE_ERROR"


class IntegerOutOfRange(StrictJSONError):
    """Well-formed JSON holding an integer outside the signed 64-bit range (everything else was valid)."""


class NestingTooDeep(StrictJSONError):
    """Well-formed JSON nested deeper than the caller's ``max_depth`` (orjson parsed it; duplicate keys and
    integer sizes were not checked yet)."""


def _fail(message: str) -> StrictJSONError:
    return StrictJSONError(f"invalid JSON: {message}")


def _structure(raw: bytes) -> bytes:
    """The text of a *valid* JSON document with every string literal removed.

    Escaped backslashes and escaped quotes can only occur inside strings, so
    deleting them leaves every remaining ``"`` a string delimiter; splitting on
    ``"`` then alternates outside/inside. All C-speed, no per-character loop.
    """
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(raw.split(b'"')[0::2])


def _nesting_exceeds(structure: bytes, max_depth: int) -> bool:
    """True if the container nesting of ``structure`` is deeper than ``max_depth``.

    Each pass deletes the innermost empty containers (``bytes.replace`` does not
    rescan its own output), so the number of passes is the depth; we stop after
    ``max_depth`` passes. Only valid JSON reaches here: brackets balance.
    """
    brackets = structure.translate(_BRACES_TO_BRACKETS, _NON_BRACKETS)
    if len(brackets) // 2 <= max_depth:
        return False
    for _ in range(max_depth):
        brackets = brackets.replace(b"[]", b"")
        if not brackets:
            return False
    return True


def _reject_constant(name: str) -> Any:
    raise _fail(f"{name} is not allowed")


def _pairs_no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _fail(f"duplicate object key {key[:80]!r}")
            seen.add(key)
    return result


def _exact_parse(text: bytes, max_int_digits: int) -> Any:
    """Slow exact path for documents holding integers beyond 64 bits."""

    def parse_int(token: str) -> int:
        digits = len(token) - (token[0] == "-")
        if digits > max_int_digits:
            raise _fail(f"integer with {digits} digits (limit {max_int_digits})")
        return int(token)

    return json.loads(
        text.decode("utf-8"),
        object_pairs_hook=_pairs_no_duplicates,
        parse_constant=_reject_constant,
        parse_int=parse_int,
    )


def loads_strict(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH, max_int_digits: int = 64,
                 int64: bool = False) -> Any:
    """Parse untrusted JSON under the strict profile, or raise :class:`StrictJSONError`.

    Rejects NaN/Infinity, duplicate object keys (at any depth), lone surrogates
    (escaped or raw), invalid UTF-8, nesting deeper than ``max_depth`` containers
    (``[]`` is depth 1; orjson itself stops at 1024 without recursion) and
    integers longer than ``max_int_digits`` digits (orjson caps this at 309:
    longer integers overflow its float path). Integers beyond 64 bits are
    returned exactly (orjson would round them to floats); note that
    :func:`dumps_line` only writes 64-bit integers. With ``int64`` every integer
    must fit a signed 64-bit integer (what the transcript and SQLite store
    losslessly): ``-9999999999999999999`` is refused, never read back as ``-1e+19``.
    """
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _fail(f"lone surrogate at character {exc.start}") from None
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        raise _fail(f"expected bytes or str, got {type(data).__name__}")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "infinity" in str(exc):  # an integer of 310+ digits overflows the float path
            structure = _structure(raw)
            # with int64, an integer this long is out of range: say so (IntegerOutOfRange) when it is the
            # document's only fault, as for the shorter ones below
            out_of_range = int64 and _strict_but_for_long_ints(raw, structure, max_depth)
            _check_int_digits(structure, max_int_digits, out_of_range=out_of_range)
        raise _fail(str(exc)) from None

    structure = _structure(raw)
    if _nesting_exceeds(structure, max_depth):
        raise NestingTooDeep(f"invalid JSON: nesting deeper than {max_depth}")
    if b":" in structure and _has_duplicate_keys(raw, structure, value):
        _raise_duplicate_key(raw)
    zeroed = structure.translate(_DIGITS_TO_ZERO)
    if int64 and _INT64_DIGIT_RUN in zeroed:
        _check_int64(structure)
    if _LONG_DIGIT_RUN in zeroed:
        _check_int_digits(structure, max_int_digits)
        value = _exact_parse(raw, max_int_digits)
    return value


def _check_int64(structure: bytes) -> None:
    for match in _INT_TOKEN_RE.finditer(structure):
        token = match.group()
        if len(token) >= 19 and not _INT64_MIN <= int(token) <= _INT64_MAX:
            raise IntegerOutOfRange(f"invalid JSON: integer {token[:40].decode()} is outside the signed 64-bit range")


def _check_int_digits(structure: bytes, max_int_digits: int, *, out_of_range: bool = False) -> None:
    for match in _INT_TOKEN_RE.finditer(structure):
        token = match.group()
        digits = len(token) - token.startswith(b"-")
        if digits > max_int_digits:
            if out_of_range:
                raise IntegerOutOfRange(f"invalid JSON: integer with {digits} digits is outside the signed "
                                        "64-bit range")
            raise _fail(f"integer with {digits} digits (limit {max_int_digits})")


def _strict_but_for_long_ints(raw: bytes, structure: bytes, max_depth: int) -> bool:
    """Is ``raw`` strict JSON once every integer is read as 0 (orjson stopped at an over-long one, so the rest
    of the document was never checked)?"""
    if _nesting_exceeds(structure, max_depth):
        return False
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs_no_duplicates,
                           parse_constant=_reject_constant, parse_int=lambda _token: 0)
        orjson.dumps(value)  # a lone surrogate escape does not encode
    except (ValueError, RecursionError, StrictJSONError, orjson.JSONEncodeError):
        return False
    return True


def _has_duplicate_keys(raw: bytes, structure: bytes, value: Any) -> bool:
    """Did orjson's keep-last merge drop keys? Compare key counts, not keys.

    Every ':' outside strings separates a key from its value, so the input holds
    ``structure.count(":")`` keys. orjson's re-encoding of ``value`` holds one
    key per surviving entry. Colons inside strings cancel out between the two
    texts unless the input spelled one as an escape (``\\u003a``); then count
    the re-encoding's structure too.
    """
    keys_in = structure.count(b":")
    again = orjson.dumps(value)
    if b"\\u003" in raw:
        keys_out = _structure(again).count(b":")
    else:
        keys_out = keys_in - (raw.count(b":") - again.count(b":"))
    return keys_out != keys_in


def _raise_duplicate_key(raw: bytes) -> None:
    """Find and report the duplicate key (slow path, only when one exists)."""
    json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs_no_duplicates)
    raise _fail("duplicate object key")


def _ordered(record: Mapping[str, Any]) -> Mapping[str, Any]:
    keys = iter(record)
    first = next(keys, None)
    if first != "type":
        if "type" not in record:
            raise InvalidInput("transcript line needs a 'type' key")
    elif isinstance(record, dict) and ("id" not in record or next(keys, None) == "id"):
        return record
    out: dict[str, Any] = {"type": record["type"]}
    if "id" in record:
        out["id"] = record["id"]
    for key, value in record.items():
        if key not in out:
            out[key] = value
    return out


def _find_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def dumps_line(record: Mapping[str, Any]) -> bytes:
    """Encode one transcript line: ``type`` first, ``id`` second, ``\\n`` at the end."""
    ordered = _ordered(record)
    try:
        line = orjson.dumps(ordered, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError as exc:  # orjson.JSONEncodeError subclasses TypeError
        raise InvalidInput(f"record cannot be encoded as a transcript line: {exc}") from None
    # orjson writes NaN/Infinity as null; only look for them when a null is present.
    if b"null" in line and _find_non_finite(ordered):
        raise InvalidInput("record cannot be encoded as a transcript line: NaN/Infinity")
    return line


def loads_line(line: bytes | memoryview) -> dict[str, Any]:
    """Parse one transcript line; ``ValueError`` if it is not a JSON object."""
    value = orjson.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"transcript line is a {type(value).__name__}, not an object")
    return value


def loads_exact(raw: str | bytes) -> Any:
    """``orjson.loads`` of a value the host stored (a settings value), but an integer literal beyond 64 bits is
    read exactly, not as the float orjson makes of it: a seed-era value the guarded migration kept exact (up to
    309 digits, ``store.upgrade.seed_migrations.LEGACY_JSON_MAX_INT_DIGITS``) must survive a later write of
    another key byte for byte (:func:`dumps_exact` writes it back as it was). Raises ``orjson.JSONDecodeError``
    as orjson does (an integer of 310+ digits included)."""
    value = orjson.loads(raw)
    data = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)  # orjson refused lone surrogates
    if _LONG_DIGIT_RUN in data.translate(_DIGITS_TO_ZERO) and \
            _LONG_DIGIT_RUN in _structure(data).translate(_DIGITS_TO_ZERO):
        value = json.loads(data.decode("utf-8"))  # the same document (orjson read it), integers exact
    return value


def dumps_exact(value: Any, *, sort_keys: bool = False) -> bytes:
    """``orjson.dumps``, but a value holding an integer beyond 64 bits (read by :func:`loads_exact`) is written
    with that integer's exact literal (the stdlib encoder, compact) instead of failing."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                          sort_keys=sort_keys).encode("utf-8")


def loads_stored(raw: str | bytes, what: str, shape: type | None = None, *, exact: bool = False) -> Any:
    """A JSON value the host wrote into an index column; ``DamagedRecord`` (``CorruptData``) naming ``what``
    (the record) when it does not parse or is not of ``shape``. ``exact``: a column a seed-era value may fill
    (a task's ``config_json``), whose integers beyond 64 bits are read exactly (:func:`loads_exact`), so
    writing the value back (:func:`dumps_exact`) keeps them."""
    try:
        value = loads_exact(raw) if exact else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DamagedRecord(f"{what} is unreadable: {exc}") from None
    if shape is not None and not isinstance(value, shape):
        raise DamagedRecord(f"{what} is a JSON {type(value).__name__}, not {shape.__name__}")
    return value


def stored_value(value: Any, allowed: Collection[str], what: str) -> str:
    """A value of a column with a fixed set (a status, a risk) as the host wrote it; ``DamagedRecord`` naming
    ``what`` when a changed byte left it outside the set (SQLite checks a CHECK on writes only)."""
    if value not in allowed:
        raise DamagedRecord(f"{what} is {value!r}, not one of {', '.join(allowed)}")
    return str(value)


@dataclass(frozen=True, slots=True)
class Readable(Generic[_Item]):
    """A listing's records that read, and the ids of those that do not (:func:`readable`)."""

    items: list[_Item]
    unreadable: list[str]
    """Ids of the damaged records, in the listing's order: left out of ``items``."""

    def map(self, fn: Callable[[_Item], _Other]) -> Readable[_Other]:
        """The same listing with each readable record passed through ``fn`` (the wire shape)."""
        return Readable([fn(item) for item in self.items], self.unreadable)

    def result(self, key: str, **more: Any) -> dict[str, Any]:
        """The wire result: the records under ``key``, and ``unreadable`` when a record was left out."""
        out: dict[str, Any] = {key: self.items, **more}
        if self.unreadable:
            out["unreadable"] = self.unreadable
        return out


def readable(rows: Iterable[_Row], decode: Callable[[_Row], _Item], id_of: Callable[[_Row], str]) -> Readable[_Item]:
    """Decode a listing's rows one by one: a row whose record is damaged (:class:`DamagedRecord`) is left out
    and named, so one record's damage never hides the others (the caller reads every row first: a raise
    mid-iteration would leave its statement open)."""
    items: list[_Item] = []
    unreadable: list[str] = []
    for row in rows:
        try:
            items.append(decode(row))
        except DamagedRecord:
            unreadable.append(id_of(row))
    return Readable(items, unreadable)


def now_rfc3339(ms: int) -> str:
    """Unix milliseconds as RFC3339 with milliseconds and ``Z``: ``2026-07-26T09:00:00.000Z``."""
    seconds, millis = divmod(int(ms), 1000)
    t = time.gmtime(seconds)  # half the cost of datetime arithmetic and format (one call per appended message)
    return f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{millis:03d}Z"
