"""A message line of many MiB parsed for a capped read without holding its large strings whole.

``orjson`` sizes its parse by the input: a 17 MiB line costs some 240 MiB while it
is parsed, and its text is a 17 MiB string besides, all to keep the first
``contentLimit`` characters of it. :func:`parse_capped` reads such a line in
place instead: every string literal over :data:`BIG_STRING` bytes (found with one
regular-expression scan of the bytes) is left out of what is parsed, and stands
there as a placeholder; where ``records.cap_content`` cuts (a block's ``text``, a
tool call's ``args`` / ``result``) the placeholder becomes the literal's own
decoded prefix, and a cut text block's ``fullLength`` is counted from the
literal's bytes in bounded chunks. A large literal anywhere else (``meta``, a key,
an unknown field), or one that is not valid JSON text, gives ``None``: the caller
parses the line whole, as it always did. Pure, no I/O.
"""

from __future__ import annotations

import codecs
import os
import re
from typing import Any, Final

import orjson

__all__ = ["BIG_STRING", "parse_capped"]

BIG_STRING: Final = 64 * 1024
"""A string literal at least this long (bytes, quotes included) is not parsed whole."""
_MAX_STRINGS: Final = 1 << 20
"""More string literals than this in one line: parsed whole (the scan would cost more than it saves)."""
_CHUNK: Final = 1 << 20
_WIDEST: Final = 12
"""The most bytes one decoded character takes in a JSON string literal (an escaped surrogate pair)."""
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
_VALID_ESCAPE = re.compile(
    rb'\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|u(?![dD][89a-fA-F])[0-9a-fA-F]{4}|["\\/bfnrt])')
"""An escape a JSON parser reads as one character: a surrogate pair, another ``\\uXXXX``, a one-letter one."""
_BAD_ESCAPE = re.compile(rb'\\[^"\\/bfnrtu]')
_SHORT_UNICODE = re.compile(rb"\\u(?![0-9a-fA-F]{4})")
_IN_ESCAPE = frozenset(b'\\u0123456789abcdefABCDEF"/bfnrt')
_CONTROL = bytes(range(0x20))
_CAPPED = ("args", "result")


def parse_capped(line: bytes | memoryview, content_limit: int) -> tuple[dict[str, Any], bool] | None:
    """The record of ``line`` with its large strings already cut to ``content_limit`` characters where
    ``cap_content`` cuts (text blocks marked ``truncated`` with their ``fullLength``; ``args`` / ``result``
    left one character over the cap, so ``cap_content`` cuts and marks them), and whether a text block was
    cut here. ``None``: the line has no string literal over :data:`BIG_STRING` bytes that needs it, or one
    this cannot place (the caller parses the line whole)."""
    view = memoryview(line)
    keep = _WIDEST * (content_limit + 2)  # bytes that decode to more than content_limit + 1 characters
    pieces: list[bytes | memoryview] = []
    big: dict[str, memoryview] = {}
    nonce = os.urandom(8).hex()
    prev = 0
    for count, m in enumerate(_STRING.finditer(view)):
        if count >= _MAX_STRINGS:
            return None
        start, end = m.span()
        if end - start < max(BIG_STRING, keep + 2):
            continue
        name = f"\x00pi-host-cut-{nonce}-{len(big)}"
        big[name] = view[start + 1:end - 1]
        pieces += (view[prev:start], orjson.dumps(name))
        prev = end
    if not big:
        return None
    pieces.append(view[prev:])
    try:
        record = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict):
        return None
    prefixes: dict[str, str] = {}
    lengths: dict[str, int] = {}
    for name, literal in big.items():  # each must be valid JSON text, as a whole parse checks
        prefix, length = _prefix(literal, keep), _length(literal)
        if prefix is None or length is None or len(prefix) <= content_limit:
            return None
        prefixes[name], lengths[name] = prefix, length
    cut_text = False
    blocks = record.get("blocks")
    for block in blocks if isinstance(blocks, list) else ():
        if not isinstance(block, dict):
            continue
        text = block.get("text")
        if isinstance(text, str) and text in big:
            block["text"] = prefixes[text][:content_limit]
            block["truncated"] = True
            block["fullLength"] = lengths[text]
            cut_text = True
        for field in _CAPPED:
            value = block.get(field)
            if isinstance(value, str):
                block[field] = prefixes.get(value, value)
            elif isinstance(value, list | dict):
                _substitute(value, prefixes)
    if _holds(record, big):
        return None
    return record, cut_text


def _prefix(literal: memoryview, keep: int) -> str | None:
    """The decoded start of a string literal's body: at least ``keep // 12`` characters of it."""
    for cut in range(min(keep, len(literal)), max(0, keep - _WIDEST) - 1, -1):
        try:  # a cut inside an escape, a UTF-8 sequence or a surrogate pair does not decode: one byte less
            value = orjson.loads(b'"' + bytes(literal[:cut]) + b'"')
        except orjson.JSONDecodeError:
            continue
        return value if isinstance(value, str) else None
    return None


def _length(literal: memoryview) -> int | None:
    """Characters a string literal's body decodes to (as ``len`` of the parsed ``str``), counted in chunks;
    ``None`` when it is not a valid JSON string body (what a whole parse refuses), or when no chunk end
    could be placed outside an escape (a run of escape characters thousands of bytes long: parsed whole)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    chars, at, size = 0, 0, len(literal)
    try:
        while at < size:
            end = size if size - at <= _CHUNK else _chunk_end(literal, at + _CHUNK)
            if end <= at:
                return None
            chunk = bytes(literal[at:end])
            if len(chunk.translate(None, _CONTROL)) != len(chunk):
                return None  # a raw control character: a parser refuses it
            chars += len(decoder.decode(chunk))
            saved = _escape_bytes_saved(chunk)
            if saved is None:
                return None
            chars -= saved
            at = end
        chars += len(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        return None
    return chars


def _escape_bytes_saved(chunk: bytes) -> int | None:
    """How many fewer characters the escapes of ``chunk`` (no escape split at its ends) decode to than
    they are spelled with; ``None`` when one is not a valid JSON escape. Counted with ``bytes`` methods
    (a string of code has an escape every few bytes: a match apiece would cost seconds)."""
    rest = chunk.replace(b"\\\\", b"")  # escaped backslashes, paired from the left as a parser reads them
    saved = (len(chunk) - len(rest)) // 2
    escapes = rest.count(b"\\")
    if not escapes:
        return saved
    unicode = rest.count(b"\\u")
    if _BAD_ESCAPE.search(rest):
        return None  # an escape letter a parser refuses
    if not unicode:
        return saved + escapes
    if b"\\ud" in rest or b"\\uD" in rest:  # surrogates, maybe paired: matched one by one
        kept, matched = _VALID_ESCAPE.subn(b"", rest)
        return None if b"\\" in kept else saved + (len(rest) - len(kept)) - matched
    if _SHORT_UNICODE.search(rest):
        return None
    return saved + escapes + 4 * unicode  # a one-letter escape saves one character, a \\uXXXX five


def _chunk_end(literal: memoryview, near: int) -> int:
    """A position at or before ``near`` that no escape spans: just after a byte no escape holds (else 0)."""
    for pos in range(near, max(0, near - 4096), -1):
        if literal[pos - 1] not in _IN_ESCAPE:
            return pos
    return 0


def _substitute(value: list[Any] | dict[str, Any], prefixes: dict[str, str]) -> None:
    """Each placeholder in ``value`` (a value just parsed: changed in place) replaced by its literal's
    decoded prefix. Iterative: a value may nest as deep as the parser allows."""
    stack: list[list[Any] | dict[str, Any]] = [value]
    while stack:
        node = stack.pop()
        for key, item in enumerate(node) if isinstance(node, list) else list(node.items()):
            if isinstance(item, str):
                if item in prefixes:
                    node[key] = prefixes[item]  # type: ignore[index]
            elif isinstance(item, list | dict):
                stack.append(item)


def _holds(value: Any, big: dict[str, memoryview]) -> bool:
    """Whether a placeholder is left anywhere in ``value`` (keys included)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if node in big:
                return True
        elif isinstance(node, list):
            stack += node
        elif isinstance(node, dict):
            if any(k in big for k in node):
                return True
            stack += node.values()
    return False
