"""``messageAround``'s ``navigationParent`` (the Task row owning a nested target) looks at every line naming the
call id: the call's own line, holding its result, and its subagent's messages (their ``meta.parentToolCallId``).
Imported, such a line may hold tens of MiB (``import.sessions`` takes lines up to 32 MiB). Before, each was
parsed whole: a parse costs some 14 times a line's bytes, so one lookup through a 17 MiB result briefly held
hundreds of MiB to show its first ``contentLimit`` characters. Now such a line is parsed without its large
strings (``big_line.parse_capped``), for the check and for the row shown, which is the same row."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import orjson

from store.jsonio import loads_line
from store.transcripts.records import cap_content, wire_record
from store.transcripts.windows import find_tool_call_line, navigation_parent

BIG = 17 * 1024 * 1024
TEXT = "".join(f"{i:09d}," for i in range(BIG // 10)) + "NEEDLEATEND"
LIMIT = 1000


def _line(rec: dict[str, Any]) -> bytes:
    return orjson.dumps(rec) + b"\n"


def _transcript(tmp_path: Path) -> tuple[Path, bytes]:
    """m0 (text), m1 the Task call with a 17 MiB result, m2 its subagent's call with one too, m3 (text); the
    bytes of m1's line."""
    task = _line({"type": "message", "id": "m1", "role": "assistant", "blocks": [
        {"type": "text", "text": "delegating"},
        {"type": "tool_call", "callId": "call-task", "name": "Task", "args": {"prompt": "look"}, "result": TEXT}]})
    lines = [
        _line({"type": "message", "id": "m0", "role": "user", "blocks": [{"type": "text", "text": "go"}]}),
        task,
        _line({"type": "message", "id": "m2", "role": "assistant", "meta": {"parentToolCallId": "call-task"},
               "blocks": [{"type": "tool_call", "callId": "call-sub", "name": "Read", "args": {"path": "a"},
                           "result": TEXT}]}),
        _line({"type": "message", "id": "m3", "role": "assistant", "blocks": [{"type": "text", "text": "done"}]}),
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(lines))
    return path, task


def test_the_navigation_parent_of_a_nested_target_is_found_without_parsing_its_big_lines_whole(
        tmp_path: Path) -> None:
    path, task = _transcript(tmp_path)
    whole = cap_content(wire_record(loads_line(task)), LIMIT)  # the row as a whole parse shows it
    tracemalloc.start()
    try:
        got = navigation_parent(path, "call-task", LIMIT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got == whole
    assert got is not None and got["blocks"][1]["result"].startswith(TEXT[:LIMIT // 2])
    assert peak < 3 * len(task), peak  # a line's own bytes, as read (a parse of one costs some 14 times them)


def test_the_lookup_answers_as_before(tmp_path: Path) -> None:
    path, task = _transcript(tmp_path)
    assert find_tool_call_line(path, "call-task") == loads_line(task)
    assert navigation_parent(path, "call-sub", LIMIT) is not None
    assert navigation_parent(path, "call-none", LIMIT) is None
    assert navigation_parent(path, "call-task", None) == wire_record(loads_line(task))
