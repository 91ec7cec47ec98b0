"""``pi-host follow`` draws every event it is sent as one line, whatever shape its payload has.

An in-flight checkpoint's blocks are objects when this host validated them (``session.saveInflightMessage``),
but a checkpoint file is read back too (a damaged one, or one an older writer left), and follow may talk to
another version of the host: a block that is a string or a number, blocks that are not a list, a message
that is not an object stopped follow with a traceback (``AttributeError: 'str' object has no attribute
'get'``). Such parts are left out of the line; the rest is drawn."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.cli_online import FOLLOW_TOPICS, _event_line

WEIRD: list[Any] = ["text", 7, 1.5, True, None, ["x"], {"type": "text", "text": 9}]


@pytest.mark.parametrize("blocks", [
    ["partial", 42, {"type": "text", "text": "kept words"}],
    [3.5, None, ["nested"], {"type": "text", "text": ["not", "text"]}, {"type": "text", "text": "kept words"}],
    "kept words as a string", 17, None, {"type": "text", "text": "kept words"},
], ids=["string-and-number", "mixed", "string", "number", "null", "object"])
def test_an_inflight_preview_whose_blocks_are_not_objects_is_drawn(blocks: Any) -> None:
    line = _event_line("session.inflight", 5, {"sessionId": "s1", "turnId": "t1",
                                               "message": {"id": "a3", "blocks": blocks, "inflight": True}})
    assert line.startswith("[5] session.inflight a3:"), line
    if isinstance(blocks, list):
        assert line.endswith("kept words"), line


@pytest.mark.parametrize("topic", FOLLOW_TOPICS)
@pytest.mark.parametrize("payload", WEIRD)
def test_every_topic_draws_a_payload_of_any_shape(topic: str, payload: Any) -> None:
    for data in ({"message": payload, "turn": payload, "request": payload, "entries": payload, "held": payload},
                 {"message": {"id": payload, "seq": payload, "role": payload, "blocks": payload}}, payload):
        line = _event_line(topic, 9, data)
        assert line.startswith(f"[9] {topic}"), line
