"""Strict client JSON and transcript line encoding (store/jsonio.py)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.errors import InvalidInput
from store.jsonio import IntegerOutOfRange, StrictJSONError, dumps_line, loads_line, loads_strict, now_rfc3339

# ----------------------------------------------------------------- loads_strict: rejections


@pytest.mark.parametrize(
    "doc",
    [
        b"NaN",
        b"[1, NaN]",
        b'{"a": Infinity}',
        b"[-Infinity]",
        b"1e400",  # overflows to infinity
    ],
)
def test_rejects_non_finite_numbers(doc: bytes) -> None:
    with pytest.raises(StrictJSONError) as info:
        loads_strict(doc)
    assert info.value.code == "PARSE_ERROR"


@pytest.mark.parametrize(
    "doc",
    [
        b'{"a": 1, "a": 2}',
        b'{"a": 1, "b": {"k": [1, {"x": 1, "x": 1}]}}',  # deep duplicate, same value
        b'[{"ok": 1}, {"k": "v:1", "k": "w"}]',  # colon inside the dropped value
        b'{"a\\u003a": 1, "a:": 2}',  # escaped colon in a key, keys equal after decoding
        b'{"\\u0061": 1, "a": 2}',  # same key spelled two ways
        b'{"a" : 1, "a"\n:\n2}',
    ],
)
def test_rejects_duplicate_keys_at_any_depth(doc: bytes) -> None:
    with pytest.raises(StrictJSONError, match="duplicate object key"):
        loads_strict(doc)


def test_duplicate_keys_in_different_objects_are_fine() -> None:
    doc = b'[{"a": 1}, {"a": 2}, {"b": {"a": "x:y\\":z"}}]'
    assert loads_strict(doc) == json.loads(doc)


@pytest.mark.parametrize(
    "doc",
    [
        b'"\\ud800"',  # escaped lone high surrogate
        b'"\\udc00"',  # escaped lone low surrogate
        b'{"k": "a\\udc00\\ud800b"}',  # reversed pair
        b'"\xed\xa0\x80"',  # raw (CESU-style) surrogate bytes
        '"\ud800"',  # raw lone surrogate in a str
        '{"\udfff": 1}',
    ],
)
def test_rejects_lone_surrogates(doc: bytes | str) -> None:
    with pytest.raises(StrictJSONError):
        loads_strict(doc)


def test_accepts_valid_surrogate_pair() -> None:
    assert loads_strict(b'"\\ud83d\\ude00"') == "\U0001f600"


@pytest.mark.parametrize("doc", [b'"\xff"', b'{"a": "\xc3"}', b"\xef\xbb\xbf{}"])
def test_rejects_invalid_utf8_and_bom(doc: bytes) -> None:
    with pytest.raises(StrictJSONError):
        loads_strict(doc)


def test_depth_bound_is_exact() -> None:
    assert loads_strict(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(StrictJSONError, match="nesting deeper than 64"):
        loads_strict(b"[" * 65 + b"]" * 65)
    mixed = b'{"a":' * 10 + b"[" * 10 + b"1" + b"]" * 10 + b"}" * 10
    assert loads_strict(mixed, max_depth=20) is not None
    with pytest.raises(StrictJSONError):
        loads_strict(mixed, max_depth=19)


def test_depth_counts_structure_not_brackets_inside_strings() -> None:
    doc = orjson.dumps({"text": "[[[[{{{{" * 50, "n": [[1]]})
    assert loads_strict(doc, max_depth=3)["n"] == [[1]]


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_very_deep_nesting_is_a_parse_error_not_recursion(depth: int) -> None:
    for doc in (b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth, b"[" * depth):
        with pytest.raises(StrictJSONError):
            loads_strict(doc)


def test_huge_integers_are_bounded() -> None:
    with pytest.raises(StrictJSONError, match="5000 digits"):
        loads_strict(b"1" * 5000)
    with pytest.raises(StrictJSONError, match="65 digits"):
        loads_strict(b'{"a": [-' + b"9" * 65 + b"]}")
    with pytest.raises(StrictJSONError):
        loads_strict(b"[" + b"7" * 30 + b"]", max_int_digits=20)


@pytest.mark.parametrize("digits", [40, 309, 310, 400, 5000])
def test_an_over_long_integer_is_out_of_int64_range_when_it_is_the_only_fault(digits: int) -> None:
    """protocol/README.md §2: a huge integer in otherwise valid JSON is answered with the request's own id
    (IntegerOutOfRange); 310+ digits took orjson's infinity path and lost that (RELIABILITY.md row 11)."""
    big = "9" * digits
    with pytest.raises(IntegerOutOfRange):
        loads_strict(f'{{"id": 2, "p": {{"k": -{big}, "s": "x"}}}}', max_int_digits=20, int64=True)
    for rest in ('"k": NaN', '"k": 1, "k": 2', '"k": "\\ud800"', '"k": ' + "[" * 70 + "]" * 70, '"k": '):
        with pytest.raises(StrictJSONError) as err:
            loads_strict(f'{{"id": 2, "p": {{"n": {big}, {rest}}}}}', max_int_digits=20, int64=True)
        assert not isinstance(err.value, IntegerOutOfRange), rest


def test_big_integers_within_bound_are_exact() -> None:
    big = 123456789012345678901234567890
    assert loads_strict(f'{{"a": [{big}, -{big}, 1.5e300, 7]}}'.encode()) == {
        "a": [big, -big, 1.5e300, 7]
    }


def test_long_digit_runs_in_strings_and_fractions_are_not_integers() -> None:
    doc = b'{"s": "' + b"9" * 200 + b'", "f": 0.' + b"1" * 100 + b', "e": 1' + b"0" * 80 + b".5}"
    value = loads_strict(doc, max_int_digits=19)
    assert value["s"] == "9" * 200
    assert isinstance(value["f"], float) and isinstance(value["e"], float)


@pytest.mark.parametrize("doc", [b"", b"{", b'{"a":1}}', b"[1,]", b"'x'", b"{a:1}", b"1 2", b'"\\x"'])
def test_rejects_malformed(doc: bytes) -> None:
    with pytest.raises(StrictJSONError):
        loads_strict(doc)


def test_strict_error_is_invalid_input_with_clear_message() -> None:
    with pytest.raises(InvalidInput) as info:
        loads_strict(b'{"a": 1, "a": 2}')
    assert info.value.code == "PARSE_ERROR"
    assert "'a'" in info.value.message


def test_accepts_ordinary_documents_identically_to_stdlib() -> None:
    doc = (
        b'{"jsonrpc":"2.0","id":7,"method":"session.appendMessage","params":'
        b'{"text":"caf\\u00e9 \\"q\\" \\\\ back\\\\","xs":[1,-2,3.25,true,false,null],'
        b'"nested":{"type":{"type":"x"}},"emoji":"\xf0\x9f\x98\x80"}}'
    )
    assert loads_strict(doc) == json.loads(doc)
    assert loads_strict(doc.decode()) == json.loads(doc)


json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_loads_strict_accepts_what_stdlib_writes(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
        assert loads_strict(text) == json.loads(text)


# ----------------------------------------------------------------- dumps_line / loads_line


def test_dumps_line_key_order_and_newline() -> None:
    line = dumps_line({"role": "user", "id": "m1", "blocks": [], "type": "message", "meta": {"a": 1}})
    assert line == b'{"type":"message","id":"m1","role":"user","blocks":[],"meta":{"a":1}}\n'
    assert dumps_line({"title": "t", "type": "session_info"}) == b'{"type":"session_info","title":"t"}\n'
    assert dumps_line({"type": "message", "id": "x"}) == b'{"type":"message","id":"x"}\n'


def test_dumps_line_accepts_any_mapping() -> None:
    from types import MappingProxyType

    assert dumps_line(MappingProxyType({"type": "m", "id": "1"})) == b'{"type":"m","id":"1"}\n'


def test_dumps_line_writes_utf8_not_escapes() -> None:
    assert dumps_line({"type": "m", "t": "héllo\n"}) == '{"type":"m","t":"héllo\\n"}\n'.encode()


@pytest.mark.parametrize(
    "record",
    [
        {"type": "m", "t": "\ud800"},
        {"type": "m", "x": {1: "non-str key"}},
        {"type": "m", "x": [float("nan")]},
        {"type": "m", "x": {"y": float("inf")}},
        {"type": "m", "x": 2**64},
        {"type": "m", "x": object()},
        {"no_type": 1},
    ],
)
def test_dumps_line_rejects_unencodable(record: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        dumps_line(record)


def test_dumps_line_allows_real_nulls() -> None:
    assert dumps_line({"type": "m", "x": None, "s": "null"}) == b'{"type":"m","x":null,"s":"null"}\n'


def test_loads_line_rejects_non_objects() -> None:
    with pytest.raises(ValueError):
        loads_line(b"[1]\n")
    with pytest.raises(ValueError):
        loads_line(b'{"type":"message"')
    assert loads_line(b'{"type":"x"}\n') == {"type": "x"}


line_records = st.dictionaries(
    st.text(max_size=10).filter(lambda k: k not in ("type", "id")),
    json_values,
    max_size=6,
).flatmap(
    lambda rest: st.builds(
        lambda kind, ident, with_id: {"type": kind, **({"id": ident} if with_id else {}), **rest},
        st.text(max_size=12),
        st.text(max_size=12),
        st.booleans(),
    )
)


@settings(max_examples=200, deadline=None)
@given(line_records)
def test_dumps_line_round_trips(record: dict[str, Any]) -> None:
    line = dumps_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.startswith(b'{"type":')
    back = loads_line(line)
    assert back == record
    leading = ["type", "id"] if "id" in record else ["type"]
    assert list(back)[: len(leading)] == leading
    # what the writer writes, the strict reader accepts unchanged
    assert loads_strict(line) == record


# ----------------------------------------------------------------- timestamps


def test_now_rfc3339() -> None:
    assert now_rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert now_rfc3339(1785056400007) == "2026-07-26T09:00:00.007Z"
    assert now_rfc3339(1785056400999) == "2026-07-26T09:00:00.999Z"
