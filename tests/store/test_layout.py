"""Transcript layout (store/transcripts/layout.py): classification without parsing, incremental refresh."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import store.transcripts.layout as layout_mod
from store.jsonio import dumps_line
from store.transcripts.layout import Layout, classify_line, scan_layout, spans
from store.transcripts.transcript import (
    TranscriptWriter,
    create_transcript,
    read_spans,
    read_transcript,
    rewrite_transcript,
)

T0 = 1785056400000


def message(mid: str, text: str = "hi", **extra: Any) -> bytes:
    return dumps_line(
        {"type": "message", "id": mid, "role": "user", "blocks": [{"type": "text", "text": text}], **extra})


# ----------------------------------------------------------------- classify_line


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"type":"message","id":"m1","role":"user"}\n', ("message", "m1")),
        (b'{"type":"compaction","id":"c1","summary":"s"}', ("compaction", "c1")),
        (b'{"type":"session_info","title":"t"}', ("session_info", None)),
        (b'{"type":"session"}', ("session", None)),
        # keys in another order; nested objects carry their own type/id
        (
            b'{"role":"tool","blocks":[{"type":"tool_call","id":"x","result":{"type":"compaction","id":"y"}}],'
            b'"id":"m2","type":"message"}',
            ("message", "m2"),
        ),
        (b'{"meta":{"type":"compaction"},"type":"message","id":"m3"}', ("message", "m3")),
        (b'{"blocks":[[[{"id":"deep"}]]],"id":"m4","type":"message"}', ("message", "m4")),
        # escaped quotes and backslashes inside strings, before the keys
        (b'{"text":"a \\"type\\":\\"compaction\\" b\\\\","type":"message","id":"m5"}', ("message", "m5")),
        (b'{"text":"}}]]{{","id":"m6","type":"message"}', ("message", "m6")),
        # escaped id / type values are unescaped
        (b'{"type":"message","id":"a\\"b\\\\c\\u00e9\\/d"}', ("message", 'a"b\\c\u00e9/d')),
        (b'{"type":"mess\\u0061ge","id":"m7"}', ("message", "m7")),
        (b'{"\\u0074ype":"message","\\u0069d":"m8"}', ("message", "m8")),
        # whitespace (legacy writers)
        (b'{ "id" : "m9" ,\n "type" : "message" }', ("message", "m9")),
        # non-string values
        (b'{"type":"message","id":5}', ("message", None)),
        (b'{"type":null,"id":"x"}', (None, "x")),
        (b'{"id":"only"}', (None, "only")),
        # not an object / obviously torn / NUL garbage
        (b"[1,2]", (None, None)),
        (b'{"type":"message","id":"m1"', (None, None)),
        (b'{"type":"message","id":"m1",\x00\x00\x00}', (None, None)),
        (b"\x00\x00\x00", (None, None)),
        (b"", (None, None)),
        (b'"type"', (None, None)),
    ],
)
def test_classify_line(line: bytes, expected: tuple[str | None, str | None]) -> None:
    assert classify_line(line) == expected


def test_classify_line_ignores_a_value_that_looks_like_a_key() -> None:
    # "type" appears as a *value* at depth 1 and as a key at depth 2
    line = b'{"kind":"type","x":{"type":"compaction","id":"no"},"type":"message","id":"yes"}'
    assert classify_line(line) == ("message", "yes")


keys = st.text(max_size=6)
nested = st.recursive(
    st.none() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3)
    | st.dictionaries(st.sampled_from(["type", "id", "x", '"', "\\"]) | keys, c, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(keys.filter(lambda k: k not in ("type", "id")), nested, max_size=4),
    st.text(max_size=10),
    st.text(max_size=10),
    st.integers(0, 5),
    st.integers(0, 5),
)
def test_classify_line_agrees_with_a_parser(
    rest: dict[str, Any], kind: str, ident: str, type_at: int, id_at: int
) -> None:
    items = list(rest.items())
    items.insert(min(type_at, len(items)), ("type", kind))
    items.insert(min(id_at, len(items)), ("id", ident))
    line = orjson.dumps(dict(items))
    assert classify_line(line) == (kind, ident)


# ----------------------------------------------------------------- scan_layout


@pytest.fixture
def session(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    create_transcript(path, "s", T0)
    with TranscriptWriter.open(path) as w:
        w.append([message(f"m{i}") for i in range(10)])
    return path


def append(path: Path, *lines: bytes) -> tuple[int, int]:
    with TranscriptWriter.open(path) as w:
        return w.append(list(lines))


def assert_matches_reader(layout: Layout, path: Path) -> None:
    t = read_transcript(path)
    assert layout.ids == [m.id for m in t.messages]
    assert list(layout.offsets) == [m.offset for m in t.messages]
    assert list(layout.lengths) == [m.length for m in t.messages]
    assert layout.positions == t.positions
    assert layout.compactions == [(c.id, c.offset, c.length) for c in t.compactions]
    assert layout.file_len == t.valid_length
    assert layout.torn_tail == t.torn_tail
    assert layout.bad_offsets == t.bad_line_offsets
    assert t.header is not None and layout.epoch == t.header.epoch and layout.header_len == t.header.length


def test_full_scan(session: Path) -> None:
    layout = scan_layout(session)
    assert layout.ids == [f"m{i}" for i in range(10)]
    assert layout.last_scan.full and layout.last_scan.bytes_scanned == session.stat().st_size
    assert layout.last_scan.lines_scanned == 11
    assert_matches_reader(layout, session)


def test_incremental_refresh_scans_only_the_tail(session: Path) -> None:
    layout = scan_layout(session)
    old_len = layout.file_len
    c = dumps_line({"type": "compaction", "id": "c1", "summary": "s", "throughMessageId": "m9"})
    tomb = dumps_line({"type": "tombstone", "id": "t1", "messageId": "m2", "deleted": True})
    first, new_len = append(session, message("m10"), c, tomb, message("m3", "replaced"))
    refreshed = scan_layout(session, layout)
    assert refreshed is layout
    assert not layout.last_scan.full
    assert layout.last_scan.bytes_scanned == new_len - old_len
    assert layout.last_scan.lines_scanned == 4
    assert layout.ids[-1] == "m10" and layout.positions["m3"] == 3
    assert layout.offsets[3] == new_len - len(message("m3", "replaced"))  # replaced in place
    assert layout.compactions == [("c1", first + len(message("m10")), len(c))]
    assert layout.specials == [("tombstone", first + len(message("m10")) + len(c), len(tomb))]
    assert_matches_reader(layout, session)
    # nothing new: nothing scanned
    scan_layout(session, layout)
    assert layout.last_scan.bytes_scanned == 0 and not layout.last_scan.full


def test_replaced_file_is_rescanned_even_at_identical_length(session: Path) -> None:
    layout = scan_layout(session)
    size = session.stat().st_size
    # same body, same length, new epoch (same hex length): only the epoch tells them apart
    body = session.read_bytes().split(b"\n", 1)[1]
    rewrite_transcript(session, "s", T0, [line + b"\n" for line in body.split(b"\n") if line])
    assert session.stat().st_size == size
    fresh = scan_layout(session, layout)
    assert fresh is not layout and fresh.last_scan.full
    assert fresh.epoch != layout.epoch
    assert_matches_reader(fresh, session)


def test_shorter_file_is_rescanned(session: Path) -> None:
    layout = scan_layout(session)
    data = session.read_bytes()
    # same epoch (the header line is kept) but shorter: e.g. a restored backup
    session.write_bytes(data[: layout.offsets[5]])
    fresh = scan_layout(session, layout)
    assert fresh.last_scan.full and fresh.ids == [f"m{i}" for i in range(5)]
    assert layout.message_count == 10  # the old layout was not touched


def test_misaligned_previous_end_is_rescanned(session: Path) -> None:
    layout = scan_layout(session)
    data = session.read_bytes()
    # same epoch, longer, but the old end is no longer a line boundary
    session.write_bytes(data[:-2] + b',"x":1}\n' + message("m10"))
    fresh = scan_layout(session, layout)
    assert fresh.last_scan.full
    assert_matches_reader(fresh, session)


def test_torn_tail_is_excluded_then_picked_up(session: Path) -> None:
    layout = scan_layout(session)
    complete_len = layout.file_len
    line = message("m10", "streaming")
    with session.open("ab") as fh:
        fh.write(line[:20])
    scan_layout(session, layout)
    assert layout.torn_tail and layout.file_len == complete_len and layout.message_count == 10
    assert_matches_reader(layout, session)
    with session.open("ab") as fh:
        fh.write(line[20:])
    scan_layout(session, layout)
    assert not layout.last_scan.full and not layout.torn_tail
    assert layout.last_scan.bytes_scanned == len(line)  # re-reads the torn part once
    assert layout.ids[-1] == "m10" and layout.file_len == complete_len + len(line)
    assert_matches_reader(layout, session)


def test_unknown_bad_and_special_lines(session: Path) -> None:
    info = dumps_line({"type": "session_info", "title": "t"})
    append(
        session,
        dumps_line({"type": "future", "id": "m0", "x": {"type": "message", "id": "zz"}}),
        b"garbage line\n",
        b'{"type":"session_info","title":\n',  # classifies, but does not parse
        info,
        dumps_line({"type": "message", "role": "user"}),  # no id
    )
    layout = scan_layout(session)
    assert layout.unknown_lines == 1
    assert len(layout.bad_offsets) == 3
    assert [kind for kind, _, _ in layout.specials] == ["session_info"]
    assert layout.ids == [f"m{i}" for i in range(10)]
    assert_matches_reader(layout, session)


def test_message_lines_are_classified_not_parsed(session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    real = layout_mod.loads_line

    def spy(line: bytes) -> dict[str, Any]:
        parsed.append(line)
        return real(line)

    monkeypatch.setattr(layout_mod, "loads_line", spy)
    append(session, dumps_line({"type": "tombstone", "id": "t", "messageId": "m1", "deleted": True}))
    scan_layout(session)
    kinds = sorted(real(line)["type"] for line in parsed)
    assert kinds == ["session", "session", "tombstone"]  # header probe + header line + tombstone


def test_spans_and_window_read(session: Path) -> None:
    layout = scan_layout(session)
    assert spans(layout, 8, 20) == [(layout.offsets[8], layout.lengths[8]), (layout.offsets[9], layout.lengths[9])]
    assert spans(layout, -5, 1) == [(layout.offsets[0], layout.lengths[0])]
    assert spans(layout, 5, 5) == []
    blobs = read_spans(session, spans(layout, 2, 4))
    assert blobs == [message("m2"), message("m3")]


def test_chunk_boundaries(session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout_mod, "_CHUNK", 7)
    append(session, message("long", "q" * 100), message("m11"))
    assert_matches_reader(scan_layout(session), session)


records = st.one_of(
    st.builds(lambda i, t: ("message", f"m{i}", t), st.integers(0, 8), st.text(max_size=5)),
    st.builds(lambda i: ("compaction", f"c{i}", ""), st.integers(0, 3)),
    st.builds(lambda i: ("tombstone", f"t{i}", ""), st.integers(0, 3)),
    st.just(("session_info", "", "")),
    st.just(("mystery", "m1", "")),
    st.just(("garbage", "", "")),
)


def encode(kind: str, ident: str, text: str) -> bytes:
    if kind == "message":
        return message(ident, text, meta={"nested": {"type": "compaction", "id": "fake"}})
    if kind == "compaction":
        return dumps_line({"type": "compaction", "id": ident, "details": {"type": "message", "id": "fake"}})
    if kind == "tombstone":
        return dumps_line({"type": "tombstone", "id": ident, "messageId": "m1", "deleted": True})
    if kind == "session_info":
        return dumps_line({"type": "session_info", "title": "t"})
    if kind == "mystery":
        return dumps_line({"type": "mystery", "id": ident})
    return b"}{ not json\n"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(records, max_size=6), min_size=1, max_size=5), st.binary(max_size=12))
def test_incremental_layout_equals_full_scan_and_reader(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[str, str, str]]], torn: bytes
) -> None:
    path = tmp_path_factory.mktemp("prop") / "p.jsonl"
    create_transcript(path, "p", T0)
    layout = scan_layout(path)
    for batch in batches:
        with path.open("ab") as fh:  # plain appends: the layout must not care who wrote
            fh.write(b"".join(encode(*r) for r in batch))
        layout = scan_layout(path, layout)
        assert_matches_reader(layout, path)
    with path.open("ab") as fh:
        fh.write(torn.replace(b"\n", b""))
    layout = scan_layout(path, layout)
    full = scan_layout(path)
    assert_matches_reader(layout, path)
    assert (layout.ids, list(layout.offsets), layout.file_len) == (full.ids, list(full.offsets), full.file_len)
