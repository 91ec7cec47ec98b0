"""Wire models: valid examples pass, bad input fails with field-level errors,
unknown blocks pass through unchanged, the registry is complete."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from protocol import models as m
from protocol.blocks import BLOCK_MODELS, KNOWN_BLOCK_TYPES, required_keys
from protocol.methods import EVENTS, METHODS, dump_event, dump_result, parse_params
from protocol.models_common import MAX_BLOCKS_PER_MESSAGE, MutatingParams

BRIEF_METHODS = {
    "host.hello", "host.status", "host.createLoginCode", "logs.append",
    "session.create", "session.list", "session.get", "session.appendMessage",
    "session.rename", "session.update", "session.delete",
    "events.subscribe", "events.unsubscribe",
    "session.startTurn", "session.endTurn", "session.turnEnvironment",
    "session.saveInflightMessage",
    "notifications.list", "notifications.markRead", "notifications.markAllRead",
    "notifications.clear",
    "session.queuePush", "session.queueList", "session.queueRemove",
    "session.queuePrioritize", "session.queueReorder", "session.queueAttach",
    "session.queueTake",
    "artifacts.list",
    "session.saveActiveRevision", "session.activateRevision", "session.listRevisions",
    "session.truncateFrom", "session.replaceMessages", "session.appendCompaction",
    "session.fork", "session.deleteMessage", "session.restoreMessage",
    "session.tree", "session.context",
    "search.sessions", "search.query",
    "settings.get", "settings.set",
    "secrets.set", "secrets.get", "secrets.delete", "secrets.list",
    "attachments.put", "attachments.importFile", "attachments.ref", "attachments.estimate",
    "attachments.gc",
    "tasks.create", "tasks.update", "tasks.delete", "tasks.list", "tasks.get", "tasks.runs",
    "tasks.startRun", "tasks.finishRun",
    "plans.submit", "plans.pending", "plans.respond",
    "projects.list", "projects.remove",
    # configuration (issue 13)
    "settings.getAll", "settings.update", "settings.delete",
    "workspace.open", "workspace.get", "session.resolvePath", "projects.pin",
    "projectGroups.list", "projectGroups.get", "projectGroups.save", "projectGroups.delete",
    "projectGroups.setMemory", "projectGroups.setInstructions",
    "providers.list", "providers.get", "providers.create", "providers.update", "providers.delete",
    "providers.reorder", "providers.sync",
    "models.list", "models.add", "models.remove", "models.refresh",
    "plugins.list", "plugins.register", "plugins.setEnabled", "plugins.uninstall",
    "configSync.get", "configSync.configure", "configSync.export", "configSync.apply",
    "import.sessions", "plugins.importSession", "plugins.listSessions",
    "sessions.trash", "sessions.restore", "sessions.purge", "sessions.listTrashed", "session.export",
}  # fmt: skip
COLLABORATION_READS = {
    "approvals.pending", "approvals.rules", "interactions.pending",
    "usage.session", "usage.history", "session.listTurns", "collab.list", "collab.get",
    "session.verifyEnvironment",
}  # fmt: skip
# issue 16: live replies, pending user requests, plan execution, collaboration, usage
COLLABORATION_METHODS = {
    "session.recoverInflight",
    "approvals.request", "approvals.pending", "approvals.respond", "approvals.rules", "approvals.removeRule",
    "interactions.request", "interactions.pending", "interactions.respond",
    "plans.startExecution", "plans.finishExecution",
    "usage.session", "usage.history", "session.listTurns",
    "collab.deliver", "collab.begin", "collab.settle", "collab.cancel", "collab.list", "collab.get",
    "session.verifyEnvironment",
}  # fmt: skip
# issue 24: the rest of the spec (attachment metadata; the audit log)
SPEC_REST_READS = {"attachments.get", "audit.list", "review.get", "review.list",
                   "skills.list", "skills.get", "memories.list", "plugins.listAssets", "plugins.getAsset"}
SPEC_REST_METHODS = SPEC_REST_READS | {"review.record", "review.restore", "skills.put", "skills.delete",
                                       "session.assistantEdit", "session.updateMetadata"}


def _errors(exc: pytest.ExceptionInfo[ValidationError]) -> list[tuple[tuple[Any, ...], str]]:
    return [(tuple(e["loc"]), e["type"]) for e in exc.value.errors()]


def _append(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"sessionId": "s1", "message": message, **extra}


def _msg(blocks: list[Any], **extra: Any) -> dict[str, Any]:
    return {"id": "m1", "role": "assistant", "blocks": blocks, **extra}


# ---------------------------------------------------------------------------
# Registry


def test_registry_covers_exactly_the_protocol_methods() -> None:
    assert set(METHODS) == BRIEF_METHODS | COLLABORATION_METHODS | SPEC_REST_METHODS


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_has_models_and_metadata(name: str) -> None:
    spec = METHODS[name]
    assert spec.name == name
    assert issubclass(spec.params_model, m.Params)
    assert issubclass(spec.result_model, BaseModel)
    assert spec.summary.strip()
    assert "INVALID_PARAMS" in spec.errors and "INTERNAL" in spec.errors
    assert len(set(spec.errors)) == len(spec.errors)
    assert spec.mutating == issubclass(spec.params_model, MutatingParams)
    assert ("submission_id" in spec.params_model.model_fields) == spec.mutating


def test_mutating_flags_match_intent() -> None:
    reads = {name for name, spec in METHODS.items() if not spec.mutating}
    assert reads == {
        "host.hello", "host.status", "host.createLoginCode", "logs.append", "session.list", "session.get",
        "events.subscribe", "events.unsubscribe", "session.turnEnvironment",
        "notifications.list", "session.queueList", "artifacts.list",
        "session.listRevisions", "session.tree", "session.context",
        "search.sessions", "search.query", "settings.get",
        "secrets.get", "secrets.list", "attachments.estimate", "tasks.list", "tasks.get",
        "tasks.runs", "plans.pending", "projects.list",
        "settings.getAll", "workspace.get", "session.resolvePath", "projectGroups.list", "projectGroups.get",
        "providers.list", "providers.get", "models.list", "plugins.list", "configSync.get",
        "plugins.listSessions", "sessions.listTrashed", "session.export",
    } | COLLABORATION_READS | SPEC_REST_READS  # fmt: skip


def test_registry_is_immutable() -> None:
    with pytest.raises(TypeError):
        METHODS["x"] = METHODS["host.status"]  # type: ignore[index]


def test_every_method_and_error_code_is_in_the_readme(export_script: ModuleType) -> None:
    readme = export_script.README_PATH.read_text(encoding="utf-8")
    for name, spec in METHODS.items():
        assert f"### `{name}`" in readme, name
        for code in spec.errors:
            assert re.search(rf"^\| `{code}` \| -?\d+ \| (yes|no) \|", readme, re.M), code
    for code in (
        "PARSE_ERROR INVALID_REQUEST METHOD_NOT_FOUND INVALID_PARAMS INVALID_ID "
        "PAYLOAD_TOO_LARGE UNAUTHENTICATED SESSION_NOT_FOUND MESSAGE_NOT_FOUND NOT_FOUND "
        "CONFLICT IDEMPOTENCY_CONFLICT LIMIT_EXCEEDED BUSY TIMEOUT ACTOR_RESTARTED "
        "STORAGE_FULL IO_ERROR CORRUPT_DATA CURSOR_EXPIRED PLAN_REQUIRES_INTERACTIVE_SESSION "
        "PERMISSION_DENIED INTERNAL"
    ).split():
        assert re.search(rf"^\| `{code}` \| -?\d+ \| (yes|no) \| \S", readme, re.M), code
    for topic in EVENTS:
        assert f"`{topic}`" in readme


# ---------------------------------------------------------------------------
# The README examples are real


def test_examples_cover_every_method(export_script: ModuleType) -> None:
    assert set(export_script.EXAMPLES) == set(METHODS)
    assert set(export_script.EVENT_EXAMPLES) == set(EVENTS)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_example_params_and_result_validate(export_script: ModuleType, name: str) -> None:
    params, result = export_script.EXAMPLES[name]
    parsed = parse_params(name, params)
    assert isinstance(parsed, METHODS[name].params_model)
    # The example result is canonical: serialising it changes nothing.
    assert dump_result(name, result) == result


@pytest.mark.parametrize("topic", sorted(EVENTS))
def test_example_events_validate(export_script: ModuleType, topic: str) -> None:
    data = export_script.EVENT_EXAMPLES[topic]
    params = dump_event(topic, data, cursor=5, subscription_id="sub_1", session_id="s1")
    assert params == {
        "topic": topic,
        "cursor": 5,
        "subscriptionId": "sub_1",
        "sessionId": "s1",
        "data": data,
    }


# ---------------------------------------------------------------------------
# Rejections with field-level errors


def test_unknown_params_key_is_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_params("session.rename", {"sessionId": "s1", "title": "x", "titel": "y"})
    assert _errors(exc) == [(("titel",), "extra_forbidden")]


def test_unknown_nested_message_key_is_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg([], toolname="Write")))
    assert _errors(exc) == [(("message", "toolname"), "extra_forbidden")]


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("session.list", {"limit": "50"}, [(("limit",), "int_type")]),
        ("session.list", {"limit": True}, [(("limit",), "int_type")]),
        ("session.list", {"limit": 501}, [(("limit",), "less_than_equal")]),
        ("session.list", {"limit": 0}, [(("limit",), "greater_than_equal")]),
        ("session.get", {"sessionId": 5}, [(("sessionId",), "string_type")]),
        ("session.get", {"sessionId": "s1", "full": 1}, [(("full",), "bool_type")]),
        ("session.create", {"mode": "chat"}, [(("mode",), "literal_error")]),
        ("host.hello", {"token": "t", "clientId": "c", "clientKind": "ui"}, [(("protocol",), "missing")]),
        (
            "session.appendMessage",
            _append({"id": "m1", "role": "robot", "blocks": []}),
            [(("message", "role"), "literal_error")],
        ),
        (
            "session.appendMessage",
            _append(_msg([], createdAt="yesterday")),
            [(("message", "createdAt"), "string_pattern_mismatch")],
        ),
        (
            "session.endTurn",
            {"sessionId": "s1", "turnId": "t1", "status": "running"},
            [(("status",), "literal_error")],
        ),
        (
            "session.queueReorder",
            {"sessionId": "s1", "entryId": "q1", "direction": "left"},
            [(("direction",), "literal_error")],
        ),
        ("events.subscribe", {"topics": []}, [(("topics",), "too_short")]),
        ("events.subscribe", {"topics": ["session.nope"]}, [(("topics", 0), "literal_error")]),
        ("notifications.markRead", {"ids": []}, [(("ids",), "too_short")]),
        ("settings.get", {"ns": "a b", "key": "k"}, [(("ns",), "string_pattern_mismatch")]),
        ("settings.set", {"key": "k"}, [(("value",), "missing")]),
    ],
)
def test_wrong_types_and_values_fail_per_field(
    method: str, params: dict[str, Any], expected: list[tuple[tuple[Any, ...], str]]
) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_params(method, params)
    assert _errors(exc) == expected


@pytest.mark.parametrize(
    "bad", ["../x", "..", "a/b", "a\\b", "", "x" * 65, "x" * 300, "a b", "a\x00b", "ü", "%2e%2e"]
)
def test_bad_session_ids_are_rejected(bad: str) -> None:
    for method in ("session.get", "session.delete", "session.queueList"):
        with pytest.raises(ValidationError) as exc:
            parse_params(method, {"sessionId": bad})
        assert _errors(exc) == [(("sessionId",), "string_pattern_mismatch")]


@pytest.mark.parametrize("bad", ["", "x" * 201, "x" * 300, "a b", "a\nb", "é", "a\x00"])
def test_bad_wire_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg([], id=bad)))
    assert _errors(exc) == [(("message", "id"), "string_pattern_mismatch")]
    with pytest.raises(ValidationError) as exc:
        parse_params("session.truncateFrom", {"sessionId": "s1", "messageId": bad})
    assert _errors(exc) == [(("messageId",), "string_pattern_mismatch")]


def test_wire_ids_accept_remapped_and_uuid_forms() -> None:
    for good in ("s1:toolu_01AbC", "0b0e9c7e-1b2c-4d5e-8f90-123456789abc", "x" * 200, "a.b@c+d=e/f"):
        parsed = parse_params("session.appendMessage", _append(_msg([], id=good)))
        assert isinstance(parsed, m.AppendMessageParams)
        assert parsed.message.id == good


def test_params_are_frozen() -> None:
    parsed = parse_params("session.get", {"sessionId": "s1"})
    with pytest.raises(ValidationError):
        parsed.session_id = "s2"  # type: ignore[attr-defined]


def test_snake_case_is_accepted_and_absent_params_mean_empty() -> None:
    parsed = parse_params("session.get", {"session_id": "s1", "message_limit": 3})
    assert isinstance(parsed, m.SessionGetParams)
    assert (parsed.session_id, parsed.message_limit) == ("s1", 3)
    assert isinstance(parse_params("host.status", None), m.StatusParams)
    with pytest.raises(ValidationError):
        parse_params("host.status", ["positional"])
    with pytest.raises(KeyError):
        parse_params("no.such", {})


# ---------------------------------------------------------------------------
# Cross-field rules


@pytest.mark.parametrize(
    ("method", "params", "fragment"),
    [
        ("session.rename", {"sessionId": "s1", "title": "   "}, "1-80 characters"),
        ("session.rename", {"sessionId": "s1", "title": "x" * 81}, "1-80 characters"),
        ("session.update", {"sessionId": "s1"}, "nothing to update"),
        (
            "session.get",
            {"sessionId": "s1", "messageBefore": 3, "messageAround": "m1"},
            "at most one of messageBefore, messageAround",
        ),
        ("session.get", {"sessionId": "s1", "full": True, "messageLimit": 5}, "full cannot"),
        ("events.subscribe", {"topics": ["turn.ended", "turn.ended"]}, "must not repeat"),
        (
            "session.appendMessage",
            _append(_msg([], turnId="t1"), turnId="t2"),
            "turnId and message.turnId differ",
        ),
        (
            "session.appendMessage",
            _append(_msg([], meta={"receipt": {"clientId": "x"}})),
            "meta.receipt is reserved",
        ),
        (
            "session.replaceMessages",
            {"sessionId": "s1", "messages": [_msg([]), _msg([])]},
            "duplicate message id 'm1' at index 1",
        ),
    ],
)
def test_cross_field_rules(method: str, params: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(fragment)):
        parse_params(method, params)


def test_title_is_trimmed_and_counts_code_points() -> None:
    parsed = parse_params("session.rename", {"sessionId": "s1", "title": "  Hello  "})
    assert isinstance(parsed, m.SessionRenameParams)
    assert parsed.title == "Hello"
    cjk = parse_params("session.rename", {"sessionId": "s1", "title": "会" * 80})
    assert isinstance(cjk, m.SessionRenameParams)
    assert len(cjk.title) == 80


@pytest.mark.parametrize(("method", "params", "field"), [
    ("workspace.open", {"path": "/p", "name": "n" * 81}, "name"),
    ("workspace.open", {"path": "/p", "name": "a\x1bb"}, "name"),
    ("session.rename", {"sessionId": "s1", "title": "   "}, "title"),
])
def test_a_label_refusal_names_the_field_it_came_in(method: str, params: dict[str, Any], field: str) -> None:
    """A label's refusal reads with its own field (the loc), never as another's: a bad workspace ``name``
    was refused as "title must be 1-80 characters after trimming"."""
    with pytest.raises(ValidationError) as exc:
        parse_params(method, params)
    [err] = exc.value.errors()
    assert err["loc"] == (field,)
    assert "title" not in err["msg"]


def test_environment_snapshot_refuses_secret_values() -> None:
    env: dict[str, Any] = {"version": 1,
                           "connection": {"baseUrl": "https://x", "headers": {"Authorization": "Bearer sk-1"}}}
    with pytest.raises(ValidationError) as exc:
        parse_params("session.startTurn", {"sessionId": "s1", "environment": env})
    assert _errors(exc) == [(("environment", "connection"), "value_error")]
    assert "connection.headers.Authorization looks like a secret" in str(exc.value)

    env = {"version": 1, "executionBindings": {"shell": {"api_key": "sk-2"}}}
    with pytest.raises(ValidationError, match=r"executionBindings\.shell\.api_key looks like"):
        parse_params("session.startTurn", {"sessionId": "s1", "environment": env})

    with pytest.raises(ValidationError) as exc:
        parse_params("session.startTurn", {"sessionId": "s1", "environment": {"version": 2}})
    assert _errors(exc) == [(("environment", "version"), "literal_error")]
    for loose in (True, 1.0, "1"):  # equal to 1 in Python, never coerced (README §2)
        with pytest.raises(ValidationError, match="version must be the integer 1"):
            parse_params("session.startTurn", {"sessionId": "s1", "environment": {"version": loose}})

    ok = {
        "version": 1,
        "connection": {"baseUrl": "https://x", "apiKeyRef": "secret:openai", "token": ""},
        "toolSchemas": [{"name": "login", "parameters": {"properties": {"password": {"type": "string"}}}}],
        "credentialRefs": ["secret:provider/openai"],
    }
    parsed = parse_params("session.startTurn", {"sessionId": "s1", "environment": ok})
    assert isinstance(parsed, m.StartTurnParams)
    assert parsed.environment is not None
    assert parsed.environment.credential_refs == ["secret:provider/openai"]


# ---------------------------------------------------------------------------
# Blocks


def test_unknown_block_passes_through_byte_for_byte() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "citation", "z": 1, "a": {"nested": [None, True, 1.5, "☃"]}, "type2": None},
        {"type": "diff", "hunks": [{"type": "text", "weird": 1}]},
        {"type": "text", "text": "hi", "annotations": [{"x": None}]},
    ]
    raw = _append(_msg(blocks))
    parsed = parse_params("session.appendMessage", raw)
    dumped = parsed.model_dump(by_alias=True, exclude_none=True)
    assert dumped["message"]["blocks"] == blocks
    assert orjson.dumps(dumped["message"]["blocks"]) == orjson.dumps(blocks)
    assert dumped == raw


_json_leaf = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_unknown_type = st.text(min_size=1, max_size=20).filter(lambda t: t not in KNOWN_BLOCK_TYPES)


@settings(max_examples=150, deadline=None)
@given(block_type=_unknown_type, body=st.dictionaries(st.text(max_size=10), _json, max_size=6))
def test_any_unknown_block_round_trips(block_type: str, body: dict[str, Any]) -> None:
    block = {"type": block_type, **{k: v for k, v in body.items() if k != "type"}}
    parsed = parse_params("session.appendMessage", _append(_msg([block])))
    dumped = parsed.model_dump(by_alias=True, exclude_none=True)["message"]["blocks"]
    assert orjson.dumps(dumped) == orjson.dumps([block])


@pytest.mark.parametrize(
    ("block", "loc", "fragment"),
    [
        ({"text": "no type"}, ("message", "blocks", 0), 'non-empty string "type"'),
        ({"type": 3}, ("message", "blocks", 0), 'non-empty string "type"'),
        ({"type": ""}, ("message", "blocks", 0), 'non-empty string "type"'),
        ({"type": "text"}, ("message", "blocks", 0), 'text block: "text" is required'),
        ({"type": "text", "text": 5}, ("message", "blocks", 0), '"text" must be a string'),
        ({"type": "thinking", "text": None}, ("message", "blocks", 0), '"text" must be a string'),
        ({"type": "tool_call", "name": "Write"}, ("message", "blocks", 0), '"callId" is required'),
        (
            {"type": "tool_call", "callId": "c", "name": "W", "durationMs": -1},
            ("message", "blocks", 0),
            '"durationMs" must be a non-negative integer',
        ),
        (
            {"type": "attachment", "kind": "video", "name": "a", "ref": "r"},
            ("message", "blocks", 0),
            '"kind" must be "image" or "file"',
        ),
        (
            {"type": "hostedSearch", "status": "done", "rounds": []},
            ("message", "blocks", 0),
            '"status" must be "searching"',
        ),
        (
            {"type": "hostedSearch", "status": "failed", "rounds": {}},
            ("message", "blocks", 0),
            '"rounds" must be an array',
        ),
    ],
)
def test_known_blocks_are_checked_lightly(
    block: dict[str, Any], loc: tuple[Any, ...], fragment: str
) -> None:
    good = {"type": "text", "text": "fine"}
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg([block, good])))
    assert [tuple(e["loc"]) for e in exc.value.errors()] == [loc]
    assert fragment in str(exc.value)


def test_a_block_must_be_an_object_and_lists_are_bounded() -> None:
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg(["text"])))
    assert _errors(exc) == [(("message", "blocks", 0), "dict_type")]
    too_many = [{"type": "x"}] * (MAX_BLOCKS_PER_MESSAGE + 1)
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg(too_many)))
    assert _errors(exc) == [(("message", "blocks"), "too_long")]


def test_a_tool_call_is_named_by_its_block_or_by_its_message() -> None:
    """Seed 003 §2.1's own tool line names the tool once, in ``toolName``; with neither name it is refused."""
    call = {"type": "tool_call", "callId": "c1", "args": {}, "result": {}, "status": "success"}
    parsed = parse_params("session.appendMessage", _append(_msg([call], role="tool", toolName="Write")))
    assert parsed.model_dump(by_alias=True, exclude_unset=True)["message"]["blocks"] == [call]
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg([{"type": "text", "text": "x"}, call], role="tool")))
    assert _errors(exc) == [(("message",), "value_error")]
    assert 'blocks.1: a tool_call block needs "name" when the message has no toolName' in str(exc.value)


def test_a_message_may_carry_its_line_kind() -> None:
    """``type: "message"``, as session.get returns a message and the file spells it, is accepted and not
    kept twice (the host writes the line kind itself); any other kind is refused."""
    parsed = parse_params("session.appendMessage", _append(_msg([{"type": "text", "text": "x"}], type="message")))
    assert "type" not in parsed.model_dump(by_alias=True, exclude_unset=True)["message"]
    with pytest.raises(ValidationError) as exc:
        parse_params("session.appendMessage", _append(_msg([], type="compaction")))
    assert _errors(exc) == [(("message", "type"), "literal_error")]


def test_a_message_may_carry_the_seq_a_read_gave_it() -> None:
    """A message of a ``session.get`` read carries its ``seq``; sent back as it is, it is accepted and the
    seq is not kept (the host numbers messages itself)."""
    for method, params in (
            ("session.appendMessage", _append(_msg([{"type": "text", "text": "x"}], type="message", seq=7))),
            ("session.replaceMessages", {"sessionId": "s1", "messages": [
                _msg([{"type": "text", "text": "x"}], type="message", seq=3)]})):
        dumped = parse_params(method, params).model_dump(by_alias=True, exclude_unset=True)
        for message in dumped.get("messages") or [dumped["message"]]:
            assert "seq" not in message and "type" not in message


def test_a_reads_other_projections_are_not_input() -> None:
    """protocol/README: ``truncated``, ``deleted``, ``steering`` and ``sessionMessage`` of a read are refused
    (a cut must not be stored, a tombstone has its own methods, ``meta.steering`` is the input, provenance
    is the host's)."""
    for extra in ({"truncated": True}, {"deleted": True},
                  {"sessionMessage": {"sourceSessionId": "s2", "deliveryId": "d1"}}):
        with pytest.raises(ValidationError) as exc:
            parse_params("session.appendMessage", _append(_msg([{"type": "text", "text": "x"}], **extra)))
        assert [loc for loc, _ in _errors(exc)] == [("message", next(iter(extra)))], extra
    # a steering row as a read gives it is accepted (meta.steering kept, the projection not stored twice)
    row = _msg([{"type": "text", "text": "x"}], steering=True, meta={"steering": True})
    for method, params in (("session.appendMessage", _append(row)),
                           ("session.replaceMessages", {"sessionId": "s1", "messages": [row]})):
        dumped = parse_params(method, params).model_dump(by_alias=True, exclude_unset=True)
        for message in dumped.get("messages") or [dumped["message"]]:
            assert "steering" not in message and message["meta"] == {"steering": True}
    with pytest.raises(ValidationError) as exc:  # alone it would lose what it asks for
        parse_params("session.appendMessage", _append(_msg([{"type": "text", "text": "x"}], steering=True)))
    assert [loc for loc, _ in _errors(exc)] == [("message",)]


def test_known_blocks_with_extra_keys_are_kept() -> None:
    blocks = [
        {"type": "thinking", "text": "hm", "signature": "abc"},
        {"type": "tool_call", "callId": "c1", "name": "Write", "args": {}, "status": "success", "result": {}},
        {"type": "attachment", "kind": "image", "name": "a.png", "ref": "attachments/" + "ab" * 32, "size": 10},
        {"type": "hostedSearch", "status": "completed", "rounds": [{"id": "r", "status": "completed", "sources": []}]},
    ]
    parsed = parse_params("session.appendMessage", _append(_msg(blocks)))
    assert parsed.model_dump(by_alias=True)["message"]["blocks"] == blocks


@pytest.mark.parametrize(("ref", "ok"), [
    ("attachments/" + "0f" * 32, True), ("/home/ada/notes.txt", True), ("C:\\Users\\ada\\a.png", True),
    ("D:/w/a.png", True), ("/w/./a.png", True),
    ("attachments/ab", True), ("attachments/" + "0F" * 32, True), ("attachments/../pi.sqlite", False),
    ("attachments/a/b", False), ("attachments/", False), ("attachments/.hidden", False),
    ("../../etc/passwd", False), ("notes.txt", False), ("/w/../../etc/passwd", False), ("C:..\\x", False),
    ("", False), (" ", False), ("/w/a\x00b", False), ("/" + "a" * 5000, False),
])
def test_an_attachment_ref_is_a_blob_or_an_absolute_path(ref: str, ok: bool) -> None:
    """Seed 003 §4.7: ``ref: attachments/<sha256> or absolute path``; every method that takes an attachment
    block (messages, queued prompts) runs this one check."""
    block = {"type": "attachment", "kind": "file", "name": "a", "ref": ref}
    for method, params in (("session.appendMessage", _append(_msg([block]))),
                           ("session.queuePush", {"sessionId": "s1", "principal": "ui", "content": "x",
                                                  "permissionMode": "ask", "attachments": [block]})):
        if ok:
            parse_params(method, params)
        else:
            with pytest.raises(ValidationError, match="absolute path"):
                parse_params(method, params)


@pytest.mark.parametrize("block_type", sorted(BLOCK_MODELS))
def test_block_check_table_agrees_with_documented_models(block_type: str) -> None:
    model = BLOCK_MODELS[block_type]
    documented = {
        field.alias or name for name, field in model.model_fields.items() if field.is_required()
    } - {"type"}
    assert required_keys(block_type) == documented


# ---------------------------------------------------------------------------
# Results and events


def test_dump_result_uses_camel_case_omits_none_and_keeps_extras() -> None:
    out = dump_result(
        "session.appendMessage",
        {
            "message": {"id": "m1", "session_id": "s1", "seq": 1, "role": "user", "created_at": 5, "turn_id": None},
            "replayed": False,
            "serverNote": "kept",
        },
    )
    assert out == {
        "message": {"id": "m1", "sessionId": "s1", "seq": 1, "role": "user", "createdAt": 5},
        "replayed": False,
        "serverNote": "kept",
    }


def test_dump_result_accepts_models_and_rejects_malformed_results() -> None:
    summary = m.SessionSummary(
        id="s1", title="", mode="agent", thinking_level="off", permission_mode="inherit",
        message_count=0, created_at=1, updated_at=1,
    )  # fmt: skip
    out = dump_result("session.create", summary)
    assert out["id"] == "s1" and "deletedAt" not in out and out["pinned"] is False
    with pytest.raises(ValidationError):
        dump_result("session.create", {"id": "s1"})
    with pytest.raises(ValidationError):
        dump_result("session.delete", {"sessionId": "../x", "deleted": True})


def test_dump_event_validates_payload_and_topic() -> None:
    with pytest.raises(KeyError):
        dump_event("session.exploded", {}, cursor=1, subscription_id="s")
    with pytest.raises(ValidationError):
        dump_event("session.deleted", {"sessionId": "../x"}, cursor=1, subscription_id="s")
    out = dump_event("session.deleted", {"sessionId": "s1"}, cursor=1, subscription_id="sub")
    assert out == {"topic": "session.deleted", "cursor": 1, "subscriptionId": "sub", "data": {"sessionId": "s1"}}


@pytest.mark.parametrize("key", ["sessionMessage", "fromAgent"])
def test_a_client_cannot_forge_host_written_provenance(key: str) -> None:
    """``meta.fromAgent`` (an imported sub-agent thread's prompt from its parent agent) is host-written, like
    ``meta.sessionMessage``: an append carrying either is refused, naming the key; other meta is kept."""
    message = {"id": "m1", "role": "user", "blocks": [{"type": "text", "text": "hi"}],
               "meta": {key: {"sessionId": "s_x"}, "note": 1}}
    with pytest.raises(ValidationError, match=f"meta.{key} is provenance the host writes"):
        m.AppendMessageParams.model_validate({"sessionId": "s_1", "message": message})
    kept = m.AppendMessageParams.model_validate(
        {"sessionId": "s_1", "message": {**message, "meta": {"note": 1}}})
    assert kept.message.meta == {"note": 1}
