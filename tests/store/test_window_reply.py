"""``store.transcripts.window_reply``: the encoded ``session.get`` reply equals the parse-and-project reference.

The reference below is written independently of the module: every line parsed,
the receipt stripped from ``meta``, the deleted flag, ``seq``, ``turnId`` (only
where the line has none), the content cap (not for the ``messageAround``
target), a corrupt line shown as a placeholder. Hypothesis draws lines that hit
every reason the byte path must fall back to parsing (and damage done to a line after it was
indexed: zeroed, torn, overwritten in place, glued to the next), and lines that must not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from store.jsonio import dumps_line
from store.transcripts import window_reply
from store.transcripts.records import INTERNAL_META, projects_new_keys, wire_record
from store.transcripts.window_reply import MAX_CHUNK, describe_line, encode_window, with_field

SESSION = {"id": "s", "title": "t", "messageCount": 0}
TEXTS = st.sampled_from(["hi", "x" * 40, 'quoted "seq" and "receipt" and "turnId"', "日本語テキスト", "a\\b\nc",
                         "}", '","seq":9}'])


def _reference(lines: list[bytes], rows: list[tuple[Any, ...]], content_limit: int | None,
               target_pos: int | None) -> list[dict[str, Any]]:
    out = []
    for line, row in zip(lines, rows, strict=True):
        try:
            rec = orjson.loads(line)
            if not isinstance(rec, dict):
                raise ValueError
        except ValueError:
            rec = {"type": "message", "id": None, "corrupt": True}
        meta = rec.get("meta")
        if isinstance(meta, dict) and isinstance(meta.get("sessionMessage"), dict):
            rec["sessionMessage"] = meta["sessionMessage"]
        if isinstance(meta, dict) and "receipt" in meta:
            rest = {k: v for k, v in meta.items() if k != "receipt"}
            if rest:
                rec["meta"] = rest
            else:
                del rec["meta"]
        if row[3]:
            rec["deleted"] = True
        rec["seq"] = row[0]
        if row[4] is not None and "turnId" not in rec:
            rec["turnId"] = row[4]
        # the selected message (seed 003 §5): its text blocks alone bypass the cap
        selected = target_pos is not None and row[0] - 1 == target_pos and rec.get("role") in ("user", "assistant")
        if content_limit and isinstance(rec.get("blocks"), list):
            blocks, cut = [], False
            for block in rec["blocks"]:
                if isinstance(block, dict):
                    text = None if selected and block.get("type") == "text" else block.get("text")
                    if isinstance(text, str) and len(text) > content_limit:
                        block = {**block, "text": text[:content_limit], "truncated": True, "fullLength": len(text)}
                        cut = True
                    result = block.get("result")
                    if isinstance(result, str) and len(result) > content_limit:
                        block = {**block, "result": result[:content_limit], "truncated": True}
                        cut = True
                blocks.append(block)
            rec["blocks"] = blocks
            if cut:
                rec["truncated"] = True  # README §6: a message that was cut says so itself
        out.append(rec)
    return out


@st.composite
def _line(draw: st.DrawFn, i: int) -> tuple[bytes, bytes, dict[str, Any] | None]:
    """(the bytes the file holds, the bytes that were indexed, the record they were indexed from)."""
    kind = draw(st.sampled_from(["plain", "receipt", "meta", "metafirst", "seq", "turn", "nested", "result",
                                 "other", "array", "provenance"]))
    rec: dict[str, Any] = {"type": "message", "id": f"m{i}", "role": draw(st.sampled_from(["user", "assistant",
                                                                                             "tool"])),
                           "blocks": [{"type": "text", "text": draw(TEXTS)}]}
    if kind == "receipt":
        rec["meta"] = {"receipt": {"clientId": "cli", "submissionId": f"sub{i}", "fingerprint": "ab"}}
    elif kind == "meta":
        rec["meta"] = {"parentToolCallId": "call-1", "status": "done", "receipt": {"c": "x"}}
    elif kind == "metafirst":  # a client's own meta, placed before the blocks
        rec = {"type": "message", "id": f"m{i}", "meta": {"receipt": {"c": "x"}, "k": 1}, "role": "user",
               "blocks": rec["blocks"]}
    elif kind == "seq":
        rec["seq"] = 999
    elif kind == "turn":
        rec["turnId"] = "own-turn"
    elif kind == "nested":
        rec["blocks"].append({"type": "tool_call", "callId": "c", "name": "n",
                              "input": {"seq": 1, "turnId": "t", "receipt": {"x": 1}, "meta": {"receipt": 2}}})
        if draw(st.booleans()):
            rec["meta"] = {"note": ',"meta":{', "receipt": {"c": "cli"}}
    elif kind == "result":
        rec["blocks"] = [{"type": "tool_result", "callId": "c", "result": draw(TEXTS)}]
    elif kind == "provenance":  # a collaboration input row: projected as top-level sessionMessage
        rec["meta"] = {"sessionMessage": {"deliveryId": f"d{i}", "kind": "task"},
                       **({"receipt": {"c": "x"}} if draw(st.booleans()) else {})}
    if kind == "array":
        return b"[1,2]\n", b"[1,2]\n", None
    line = dumps_line(rec)
    if kind == "other":  # another encoder's spacing: described as unusable, parsed
        line = json.dumps(rec).encode() + b"\n"
    held = line
    damage = draw(st.sampled_from(["none"] * 6 + ["zeroed", "torn", "overwritten", "glued"]))
    if damage == "zeroed":  # a block of zeros where the line was (same length)
        held = b"\x00" * len(line)
    elif damage == "torn":  # the line lost its end
        held = line[: draw(st.integers(1, 20))]
    elif damage == "overwritten":  # same length, other printable bytes: only the CRC sees it
        k = draw(st.integers(0, len(line) - 2))
        held = line[:k] + (b"#" if line[k:k + 1] != b"#" else b"%") + line[k + 1:]
    elif damage == "glued":  # the newline between two lines lost
        held = line[:-1] + dumps_line({**rec, "id": f"g{i}"})
    return held, line, rec


@st.composite
def _window(draw: st.DrawFn) -> tuple[list[bytes], list[tuple[Any, ...]], int | None, int | None]:
    n = draw(st.integers(0, 12))
    drawn = [draw(_line(i)) for i in range(n)]
    body = [held for held, _, _ in drawn]
    rows = []
    offset = 0
    for i, (held, indexed, rec) in enumerate(drawn):
        deleted = int(draw(st.booleans()) and draw(st.booleans()))
        turn = draw(st.sampled_from([None, "t1", 'quo"te']))
        wire, crc = describe_line(indexed, rec) if rec is not None else (None, None)
        if draw(st.integers(0, 5)) == 0:
            wire, crc = None, None  # a row indexed before v25
        rows.append((i + 1, offset, len(held), deleted, turn, wire, crc))
        offset += len(held)
    limit = draw(st.sampled_from([None, 1, 5, 30, 10_000]))
    target = draw(st.sampled_from([None, *range(n)]))
    return body, rows, limit, target


@settings(max_examples=500, deadline=None)
@given(window=_window())
def test_the_encoded_reply_is_the_parsed_projection(tmp_path_factory: Any, window: Any) -> None:
    body, rows, limit, target = window
    path = Path(tmp_path_factory.mktemp("w")) / "s.jsonl"
    path.write_bytes(b"".join(body))
    reply, found = encode_window(path, SESSION, rows, [], start=0, end=len(rows), total=len(rows) + 3,
                                 content_limit=limit, target_pos=target)
    got = orjson.loads(reply)
    want = _reference([b[:-1] if b.endswith(b"\n") else b for b in body], rows, limit, target)
    assert got["messages"] == want
    assert got["session"] == SESSION and got["compactions"] == []
    assert (got["messageStart"], got["messageEnd"], got["totalMessages"]) == (0, len(rows), len(rows) + 3)
    assert got["hasMoreAfter"] is True and got["hasMoreBefore"] is False
    if target is not None:
        assert found == want[target]
    else:
        assert found is None


def test_a_described_line_goes_out_as_its_own_bytes(tmp_path: Path) -> None:
    """The fast path is taken (not only correct): the reply holds the line's bytes verbatim."""
    rec = {"type": "message", "id": "m1", "role": "user", "blocks": [{"type": "text", "text": "a  b\u00e9"}],
           "meta": {"status": "ok", "receipt": {"clientId": "c", "submissionId": "s"}}}
    line = dumps_line(rec)
    wire, crc = describe_line(line, rec)
    assert wire is not None
    path = tmp_path / "s.jsonl"
    path.write_bytes(line)
    reply, _ = encode_window(path, SESSION, [(1, 0, len(line), 0, "t9", wire, crc)], [], start=0, end=1, total=1,
                             content_limit=None)
    head = line[: line.index(b',"receipt":')]
    assert head + b'},"seq":1,"turnId":"t9"}' in reply
    assert orjson.loads(reply)["messages"][0]["meta"] == {"status": "ok"}
    for refused in ({**rec, "seq": 3}, {**rec, "meta": {"receipt": {"c": 1}, "status": "ok"}}):
        assert describe_line(dumps_line(refused), refused)[0] is None


def test_reads_in_chunks_and_keeps_lines_that_cross_no_chunk_boundary(tmp_path: Path) -> None:
    big = "y" * (MAX_CHUNK // 3)
    lines = [dumps_line({"type": "message", "id": f"b{i}", "role": "user", "blocks": [{"type": "text", "text": big}]})
             for i in range(7)]
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(lines))
    rows, offset = [], 0
    for i, line in enumerate(lines):
        rows.append((i + 1, offset, len(line), 0, None, *describe_line(line, orjson.loads(line))))
        offset += len(line)
    reply, _ = encode_window(path, SESSION, rows, [], start=0, end=7, total=7, content_limit=None)
    got = orjson.loads(reply)["messages"]
    assert [(m["id"], m["seq"], len(m["blocks"][0]["text"])) for m in got] == [(f"b{i}", i + 1, len(big))
                                                                               for i in range(7)]


def test_rows_whose_lengths_add_up_to_the_run_but_one_lies_outside_it(tmp_path: Path) -> None:
    """Five lines of one length; the rows point at lines 0, 4 and 2 (a file the host never writes, a
    row order no longer the file's): their lengths add up to the bytes from the first row's line to the
    last row's end, so one read serves the run, and the row whose line lies past it is read alone."""
    lines = [dumps_line({"type": "message", "id": f"l{i}", "role": "user", "blocks": [{"type": "text", "text": "z"}]})
             for i in range(5)]
    assert len({len(line) for line in lines}) == 1
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(lines))
    size = len(lines[0])
    rows = [(seq, line_no * size, size, 0, None, *describe_line(lines[line_no], orjson.loads(lines[line_no])))
            for seq, line_no in ((1, 0), (2, 4), (3, 2))]
    assert sum(r[2] for r in rows) == rows[-1][1] + rows[-1][2] - rows[0][1]
    reply, _ = encode_window(path, SESSION, rows, [], start=0, end=3, total=3, content_limit=None)
    assert [(m["id"], m["seq"]) for m in orjson.loads(reply)["messages"]] == [("l0", 1), ("l4", 2), ("l2", 3)]


def test_compactions_and_an_extra_field(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    comp = dumps_line({"type": "compaction", "id": "c1", "summary": "so far", "firstKeptId": "m1",
                       "meta": {"receipt": {"c": "a", "s": "b", "f": "c"}}})
    path.write_bytes(comp)
    reply, _ = encode_window(path, SESSION, [], [comp], start=0, end=0, total=0, content_limit=None)
    got = orjson.loads(with_field(reply, "navigationParent", {"id": "p"}))
    assert got["messages"] == [] and got["navigationParent"] == {"id": "p"}
    assert [c["id"] for c in got["compactions"]] == ["c1"] and "meta" not in got["compactions"][0]


def test_a_line_whose_projection_lifts_keys_out_of_meta_is_not_described() -> None:
    """``describe_line`` tells a record ``wire_record`` adds top-level keys to (provenance, steering) without
    building the projection: the same answer as comparing the keys of the projection itself."""
    base = {"type": "message", "id": "m1", "role": "user", "blocks": [{"type": "text", "text": "hi"}]}
    provenance = {"deliveryId": "d1", "kind": "task"}
    metas: list[Any] = [None, "x", {}, {"status": "ok"}, {"steering": True}, {"steering": "yes"},
                        {"sessionMessage": provenance}, {"sessionMessage": "d1"},
                        {"sessionMessage": provenance, "steering": True}]
    for meta in metas:
        for top in ({}, {"steering": True}, {"sessionMessage": provenance},
                    {"steering": True, "sessionMessage": provenance}):
            rec = {**base, **top, **({} if meta is None else {"meta": meta})}
            lifts = any(key not in rec for key in wire_record(rec))
            assert projects_new_keys(rec) is lifts, rec
            wire, _ = describe_line(dumps_line(rec), rec)
            if lifts:
                assert wire is None, rec
    assert describe_line(dumps_line(base), base)[0] is not None


def test_a_line_with_host_only_meta_besides_its_receipt_is_parsed_and_stripped(tmp_path: Path) -> None:
    """A collaboration input's deliver answer (``meta.collabDelivered``) is the host's, like the receipt: a line
    holding it never goes out as its own bytes, even without the provenance that would have it parsed anyway."""
    rec = {"type": "message", "id": "m1", "role": "user", "blocks": [{"type": "text", "text": "task"}],
           "meta": {"status": "ok", INTERNAL_META[1]: {"response": {"delivery": {"id": "col_1"}}},
                    "receipt": {"clientId": "c", "submissionId": "s"}}}
    line = dumps_line(rec)
    wire, crc = describe_line(line, rec)
    assert wire is None
    path = tmp_path / "s.jsonl"
    path.write_bytes(line)
    reply, _ = encode_window(path, SESSION, [(1, 0, len(line), 0, "t9", wire, crc)], [], start=0, end=1, total=1,
                             content_limit=None)
    assert orjson.loads(reply)["messages"][0]["meta"] == {"status": "ok"}


@settings(max_examples=300, deadline=None)
@given(window=_window(), chunk=st.integers(1, 400))
def test_windows_over_the_chunk_size_read_in_runs_and_reply_the_same(tmp_path_factory: Any, window: Any,
                                                                     chunk: int) -> None:
    """A window over ``MAX_CHUNK`` (a whole-history page) is read in runs cut by a binary search over the
    rows' ends: the same runs the row-by-row cut finds, and the same reply (here with a chunk of a few lines,
    so a window of a dozen is cut many times, a line longer than a chunk alone)."""
    body, rows, limit, target = window
    path = Path(tmp_path_factory.mktemp("w")) / "s.jsonl"
    path.write_bytes(b"".join(body))
    with patch.object(window_reply, "MAX_CHUNK", chunk):
        if rows:
            assert window_reply._runs(rows) == window_reply._chunks(rows)
        reply, _ = encode_window(path, SESSION, rows, [], start=0, end=len(rows), total=len(rows),
                                 content_limit=limit, target_pos=target)
    want = _reference([b[:-1] if b.endswith(b"\n") else b for b in body], rows, limit, target)
    assert orjson.loads(reply)["messages"] == want


def test_rows_out_of_file_order_over_the_chunk_size_are_each_read(tmp_path: Path) -> None:
    """Rows whose lengths add up to their span but whose lines are out of the file's order, in a window over
    the chunk size: every row's line is served, from its run's bytes or read alone."""
    lines = [dumps_line({"type": "message", "id": f"l{i}", "role": "user", "blocks": [{"type": "text", "text": "z"}]})
             for i in range(6)]
    size = len(lines[0])
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(lines))
    order = (0, 3, 1, 4, 2, 5)
    rows = [(seq, line_no * size, size, 0, None, *describe_line(lines[line_no], orjson.loads(lines[line_no])))
            for seq, line_no in enumerate(order, 1)]
    with patch.object(window_reply, "MAX_CHUNK", 2 * size):
        reply, _ = encode_window(path, SESSION, rows, [], start=0, end=6, total=6, content_limit=None)
    assert [m["id"] for m in orjson.loads(reply)["messages"]] == [f"l{i}" for i in order]
