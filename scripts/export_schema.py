#!/usr/bin/env python3
"""Export the wire protocol: ``protocol/schema.json`` and the generated part of
``protocol/README.md``.

    python scripts/export_schema.py           # rewrite both files
    python scripts/export_schema.py --check   # exit 1 if either is out of date

Both outputs are deterministic (sorted keys, registry order), so a diff means
the models changed. ``tests/protocol/test_schema_drift.py`` runs the same
builders in memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402 - after the sys.path setup above
from pydantic.json_schema import JsonSchemaMode, models_json_schema  # noqa: E402 - after the sys.path setup above

from protocol.blocks import BLOCK_MODELS, block_json_schema  # noqa: E402 - after the sys.path setup above
from protocol.errors import RpcErrorCode  # noqa: E402 - after the sys.path setup above
from protocol.methods import (  # noqa: E402 - after the sys.path setup above
    EVENT_METHOD,
    EVENTS,
    METHODS,
    PROTOCOL_VERSION,
    dump_event,
)
from protocol.models import EventParams  # noqa: E402 - after the sys.path setup above
from protocol.models_events import HOST_TOPICS  # noqa: E402 - after the sys.path setup above

SCHEMA_PATH = ROOT / "protocol" / "schema.json"
README_PATH = ROOT / "protocol" / "README.md"
BEGIN = "<!-- BEGIN GENERATED REFERENCE (scripts/export_schema.py) -->"
END = "<!-- END GENERATED REFERENCE -->"
REF_PREFIX = "#/$defs/"

# ---------------------------------------------------------------------------
# schema.json


def _all_models() -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    pairs: list[tuple[type[BaseModel], JsonSchemaMode]] = []
    for spec in METHODS.values():
        pairs.append((spec.params_model, "validation"))
        pairs.append((spec.result_model, "serialization"))
    pairs.extend((model, "serialization") for model in EVENTS.values())
    pairs.append((EventParams, "serialization"))
    pairs.extend((model, "validation") for model in BLOCK_MODELS.values())
    return list(dict.fromkeys(pairs))


def build_schema() -> dict[str, Any]:
    """The whole protocol as one JSON document (key order not yet sorted)."""
    keys, top = models_json_schema(_all_models(), ref_template=REF_PREFIX + "{model}")

    def ref(model: type[BaseModel], mode: JsonSchemaMode) -> dict[str, Any]:
        return dict(keys[(model, mode)])

    defs: dict[str, Any] = dict(top.get("$defs", {}))
    defs["Block"] = block_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pi-host wire protocol",
        "protocolVersion": PROTOCOL_VERSION,
        "methods": {
            spec.name: {
                "summary": spec.summary,
                "mutating": spec.mutating,
                "errors": list(spec.errors),
                "params": ref(spec.params_model, "validation"),
                "result": ref(spec.result_model, "serialization"),
            }
            for spec in METHODS.values()
        },
        "events": {
            "method": EVENT_METHOD,
            "params": ref(EventParams, "serialization"),
            "topics": {topic: ref(model, "serialization") for topic, model in EVENTS.items()},
        },
        "blocks": {
            "block": {"$ref": REF_PREFIX + "Block"},
            "known": {name: ref(model, "validation") for name, model in BLOCK_MODELS.items()},
        },
        "$defs": defs,
    }


def render_schema(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------
# README reference section


def _def_name(schema: Mapping[str, Any]) -> str | None:
    target = schema.get("$ref")
    if isinstance(target, str) and target.startswith(REF_PREFIX):
        return target[len(REF_PREFIX) :]
    return None


def _type_str(schema: Mapping[str, Any]) -> str:
    name = _def_name(schema)
    if name:
        return f"[{name}](#{name.lower()})"
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " \\| ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        parts = [_type_str(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return " \\| ".join(parts) if parts else "null"
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items", {})
        return f"{_type_str(items) if items else 'any'}[]"
    if kind == "object":
        return "object"
    if isinstance(kind, str):
        return kind
    return "any"


def _constraints(schema: Mapping[str, Any]) -> list[str]:
    if "anyOf" in schema:
        found: list[str] = []
        for option in schema["anyOf"]:
            found.extend(_constraints(option))
        return found
    notes: list[str] = []
    for key, label in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
    ):
        if key in schema:
            notes.append(f"{label} {schema[key]}")
    if "pattern" in schema:
        notes.append(f"`{schema['pattern']}`")
    trimmed = schema.get("x-trimmedLength")  # a label: its bound holds once trimmed (protocol Title)
    if isinstance(trimmed, list) and len(trimmed) == 2:
        notes = [n for n in notes if not n.startswith("max length")]
        notes.append(f"{trimmed[0]}-{trimmed[1]} characters after trimming, at most {schema.get('maxLength')} "
                     "before")
    return notes


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _field_table(model_schema: Mapping[str, Any]) -> list[str]:
    props: Mapping[str, Any] = model_schema.get("properties", {})
    if not props:
        return ["_(no fields)_", ""]
    required = set(model_schema.get("required", ()))
    lines = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in props.items():
        notes = _constraints(prop)
        if "default" in prop and prop["default"] is not None:
            notes.append(f"default `{json.dumps(prop['default'])}`")
        desc = prop.get("description", "")
        if not desc and "anyOf" in prop:
            desc = next((o.get("description", "") for o in prop["anyOf"] if "description" in o), "")
        text = desc
        if notes:
            text = f"{text} ({', '.join(notes)})" if text else ", ".join(notes)
        lines.append(
            f"| `{name}` | {_type_str(prop)} | {'yes' if name in required else ''} | {_cell(text)} |"
        )
    lines.append("")
    return lines


def _json_block(value: Any) -> list[str]:
    return ["```json", json.dumps(value, ensure_ascii=False, indent=None), "```"]


def _example_lines(method: str, params: Any, result: Any) -> list[str]:
    request = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    response = {"jsonrpc": "2.0", "id": 7, "result": result}
    return ["Example:", "", *_json_block(request), *_json_block(response), ""]


def _error_section() -> list[str]:
    lines = [
        "### Error codes",
        "",
        "| `error.data.code` | `error.code` | retriable | meaning |",
        "|---|---|---|---|",
    ]
    table = RpcErrorCode.TABLE
    for code in (*ERROR_MEANINGS, *(c for c in table if c not in ERROR_MEANINGS)):
        spec = RpcErrorCode.spec(code)
        retriable = "yes" if spec.retriable else "no"
        lines.append(
            f"| `{code}` | {spec.numeric} | {retriable} | {_cell(ERROR_MEANINGS.get(code, ''))} |"
        )
    lines.append("")
    return lines


def render_reference(doc: Mapping[str, Any]) -> str:
    """The generated part of README.md: errors, methods, events, records, blocks."""
    defs: Mapping[str, Any] = doc["$defs"]
    lines: list[str] = [BEGIN, "", *_error_section(), "## Methods", ""]
    for name, entry in doc["methods"].items():
        spec = METHODS[name]
        params_name = _def_name(entry["params"]) or ""
        result_name = _def_name(entry["result"]) or ""
        kind = (
            "mutating — accepts `submissionId`"
            if spec.mutating
            else "read-only / connection state"
        )
        lines += [f"### `{name}`", "", f"{spec.summary} _({kind})_", ""]
        lines += [f"**Params** (`{params_name}`):", "", *_field_table(defs[params_name])]
        lines += [f"**Result**: [{result_name}](#{result_name.lower()})", ""]
        lines += ["**Errors**: " + ", ".join(f"`{c}`" for c in spec.errors), ""]
        params, result = EXAMPLES[name]
        lines += _example_lines(name, params, result)

    lines += ["## Events", "", "Notification `params` (`EventParams`):", ""]
    lines += _field_table(defs["EventParams"])
    lines += ["| topic | `data` |", "|---|---|"]
    for topic, ref in doc["events"]["topics"].items():
        lines.append(f"| `{topic}` | {_type_str(ref)} |")
    lines += ["", "Examples (`params` of the notification):", ""]
    for cursor, (topic, data) in enumerate(EVENT_EXAMPLES.items(), start=1040):
        params = dump_event(topic, data, cursor=cursor, subscription_id="sub-1",
                            session_id=None if topic in HOST_TOPICS else "s_4f2a")
        lines += [f"`{topic}`:", "", *_json_block(params), ""]

    lines += ["## Records", "", "Results, nested records and event payloads, A-Z.", ""]
    for def_name in sorted(defs):
        if def_name == "Block" or def_name.endswith("Params"):
            continue
        schema = defs[def_name]
        lines += [f"### {def_name}", ""]
        description = schema.get("description")
        if description:
            lines += [" ".join(description.split()), ""]
        if def_name in BLOCK_MODELS_BY_TITLE:
            lines += ["_Other keys are kept unchanged._", ""]
        elif schema.get("additionalProperties") is True:
            lines += ["_More keys may appear; ignore the ones you do not know._", ""]
        lines += _field_table(schema)

    lines += ["## Block vocabulary", ""]
    lines += [" ".join(defs["Block"]["description"].split()), ""]
    lines += ["| `type` | record |", "|---|---|"]
    for block_type, ref in doc["blocks"]["known"].items():
        lines.append(f"| `{block_type}` | {_type_str(ref)} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


BLOCK_MODELS_BY_TITLE = frozenset(model.__name__ for model in BLOCK_MODELS.values())


def splice_readme(readme: str, reference: str) -> str:
    """Replace the generated section of ``readme`` (or fail if markers are missing)."""
    start = readme.find(BEGIN)
    stop = readme.find(END)
    if start < 0 or stop < start:
        raise ValueError(f"README is missing the {BEGIN!r} ... {END!r} markers")
    return readme[:start] + reference + readme[stop + len(END) + 1 :]


# ---------------------------------------------------------------------------
# Reference data: error meanings and one example per method. Examples are
# validated against the models by tests/protocol/test_models.py.

ERROR_MEANINGS: dict[str, str] = {
    "PARSE_ERROR": "The frame is not valid strict JSON (NaN, duplicate keys, lone surrogates, too deep).",
    "INVALID_REQUEST": "Not a JSON-RPC 2.0 request object (or an empty batch).",
    "METHOD_NOT_FOUND": "No such method.",
    "INVALID_PARAMS": "Params failed validation; `error.data.errors` lists `{loc, msg, type}` per field.",
    "INVALID_ID": "An id (session id, message id ...) does not match its pattern.",
    "INVALID_CURSOR": "A paging cursor this host did not issue for this list and query (forged, foreign or stale).",
    "PAYLOAD_TOO_LARGE": "Frame, params or a stored structure is over its size limit.",
    "UNAUTHENTICATED": "The first request was not a valid `host.hello`; the connection closes.",
    "SESSION_NOT_FOUND": "No session with that id.",
    "MESSAGE_NOT_FOUND": "No message with that id in the session (a cut or anchor is never guessed).",
    "NOT_FOUND": "Another named thing (turn, queue entry, revision, subscription) does not exist.",
    "CONFLICT": "The request conflicts with current state (e.g. id already exists, reorder of a promoted entry, a "
                "prompt for a turn that was aborted; a "
                "transcript another program wrote to or replaced: nothing was written, the next call finds it "
                "reconciled).",
    "IDEMPOTENCY_CONFLICT": "`submissionId` (or queue `idempotencyKey`) reused with a different request.",
    "LIMIT_EXCEEDED": "A documented capacity limit is reached (8 queued turns per session ...).",
    "ENVIRONMENT_DRIFT": "A turn's run environment snapshot no longer matches the provider, the session or its "
    "credential references (`error.data.drift` lists `{field, snapshot, current}`); a rotated secret is not drift.",
    "BUSY": "The target actor's mailbox is full. Retry after a short backoff.",
    "TIMEOUT": "No reply in time; the effect may or may not have happened. Retry with the same `submissionId`.",
    "ACTOR_RESTARTED": "The actor handling the request crashed and was restarted. Retry with the same `submissionId`.",
    "STORAGE_FULL": "Disk full; nothing was acknowledged. Retry once space is freed.",
    "IO_ERROR": ("An I/O error (EIO). A failed fsync of a transcript marks that session's storage failed until the "
                 "host restarts (its appends, its transcript rewrites and revision saves, and its "
                 "`session.saveInflightMessage` checkpoints are then refused with this code); so does a failed fsync "
                 "of the sessions directory after a file of the session was created or replaced (the effect is in "
                 "place, its durability unknown: a retry with the same `submissionId` is refused too, and answered "
                 "after the restart). While the storage is failed, the retry of a write the session acknowledged "
                 "*before* the failure (its line or file and directory were fsynced, its receipt committed) is still "
                 "answered from its receipt, with the answer the restart gives; the failed write's own retry, a "
                 "receipt restored from the session's files since the failure, and every new write are refused until "
                 "the restart. A failed fsync of a directory after another file was created, replaced or removed (a "
                 "secret's, the plugin registry, a plugin's assets, an attachment's bytes) fails that call, and that "
                 "store's later writes (a retry with the same `submissionId` too) are refused with this code until the"
                 " host restarts (the effect is in place, its durability unknown; after the restart the retry is "
                 "answered once); any other I/O error fails this call only (a failed write is rolled back)."),
    "RESOURCE_EXHAUSTED": "The host ran out of file descriptors for this request; nothing changed. Retry shortly.",
    "CORRUPT_DATA": "Durable data failed validation (digest mismatch, unreadable record; `data.reason: "
                    "\"index_corrupt\"`: the index database went corrupt while the host runs; `pi-host serve` then "
                    "restarts itself in the same process and port on an index rebuilt from the transcripts: "
                    "reconnect and retry with the same `submissionId`).",
    "CURSOR_EXPIRED": "The pagination or event cursor is no longer valid; start again without it.",
    "PLAN_REQUIRES_INTERACTIVE_SESSION": ("A Plan/Goal run was started unattended, or Plan/Goal work (a turn, a "
                                          "proposal) was attempted in a session a running task run is bound to; "
                                          "switch the session to agent mode or end the run."),
    "PERMISSION_DENIED": "The caller may not do this (a plugin outside what it owns, a user editing a plugin's "
                         "row ...).",
    "INTERNAL": "A host bug. The message is generic; details are in the host log.",
    "UNSUPPORTED_PROTOCOL": "`host.hello` asked for a protocol version the host does not speak.",
    "ALREADY_AUTHENTICATED": "`host.hello` sent twice on one connection.",
    "SHUTTING_DOWN": "The host is stopping; reconnect to the next instance (see `host.json`).",
    "SCHEMA_TOO_NEW": "The database was written by a newer host. Met where the database is opened, never an "
                      "answer to a request: `pi-host serve` exits with it (status 5) before it serves.",
    "UNSUPPORTED_SQLITE": "The SQLite library is too old (trigram tokenizer needs 3.34+). Met where the database "
                          "is opened, never an answer to a request: `pi-host serve` exits with it (status 5).",
    "PROVIDER_UNAUTHORIZED": "The provider refused the API key (HTTP 401/403); nothing was written.",
    "PROVIDER_TIMEOUT": "The provider did not answer within timeoutMs; nothing was written. Retry later.",
    "PROVIDER_UNREACHABLE": ("No connection to the provider (refused, reset, DNS, TLS, proxy); nothing was "
                             "written."),
    "PROVIDER_BAD_REPLY": ("The provider's answer is not a model list (status, JSON, shape), or no readable HTTP "
                           "reply at all (another protocol, cut short by its close); nothing was written."),
    "UNSUPPORTED_FOR_NATIVE_SESSION": "The method does not apply to a native pi session (`native-pi:...`, owned by "
    "pi): only session.list, session.get, session.fork and session.export do; fork it to change it.",
    "FILE_CHANGED": "`review.restore`: the workspace file is no longer what the tool wrote (by SHA-256; "
                    "`data.expectedSha256` / `data.actualSha256`); nothing was restored.",
}

_SESSION = {
    "id": "s_4f2a",
    "title": "Refactor the parser",
    "projectId": 3,
    "projectPath": "/home/ada/src/parser",
    "providerId": "anthropic",
    "modelId": "claude-sonnet-4",
    "mode": "agent",
    "thinkingLevel": "medium",
    "permissionMode": "inherit",
    "messageCount": 12,
    "createdAt": 1785056400000,
    "updatedAt": 1785056712000,
    "pinned": False,
}
_TURN = {
    "id": "t_9",
    "sessionId": "s_4f2a",
    "status": "running",
    "providerId": "anthropic",
    "modelId": "claude-sonnet-4",
    "startedAt": 1785056700000,
    "inputTokens": 0,
    "outputTokens": 0,
    "costMicros": 0,
}
_ENDED_TURN = {
    **_TURN,
    "status": "completed",
    "endedAt": 1785056712000,
    "inputTokens": 1830,
    "outputTokens": 412,
    "usage": {"inputTokens": 1830, "outputTokens": 412, "cacheRead": 1024, "cost": {"total": 0.0117}},
    "costMicros": 11700,
}
_NOTIFICATION = {
    "id": "n_31",
    "kind": "task.completed",
    "sessionId": "s_4f2a",
    "sessionTitle": "Refactor the parser",
    "turnId": "t_9",
    "createdAt": 1785056712000,
}
_ENTRY = {
    "id": "q_2",
    "sessionId": "s_4f2a",
    "principal": "ui",
    "idempotencyKey": "k-17",
    "inputHash": "9b74c9897bac770ffc029102a200c5de",
    "content": "Now add tests",
    "attachments": [],
    "permissionMode": "ask",
    "position": 2,
    "createdAt": 1785056705000,
}
_USER_MESSAGE = {
    "id": "m_1",
    "role": "user",
    "createdAt": "2026-07-26T09:00:00.000Z",
    "blocks": [{"type": "text", "text": "Split the tokenizer out of parser.py"}],
}
_ASSISTANT_MESSAGE = {
    "id": "m_2",
    "role": "assistant",
    "createdAt": "2026-07-26T09:00:04.120Z",
    "turnId": "t_9",
    "blocks": [
        {"type": "thinking", "text": "The tokenizer is the first 80 lines."},
        {"type": "text", "text": "Done: tokenizer.py now holds the lexer."},
    ],
    "meta": {"usage": {"input": 1830, "output": 412}, "modelId": "claude-sonnet-4"},
}
_COMPACTION = {
    "id": "cp_1",
    "summary": "The user asked to split the tokenizer; done in tokenizer.py.",
    "firstKeptMessageId": "m_2",
    "throughMessageId": "m_2",
    "tokensBefore": 91700,
    "retainedTail": [],
    "details": {"retainedTailMode": "completed_turn"},
}
_REVISION = {
    "rootUserId": "m_1",
    "revisionIndex": 1,
    "isActive": True,
    "messageCount": 3,
    "createdAt": 1785056712000,
}
_MESSAGE_REF = {
    "id": "m_2",
    "sessionId": "s_4f2a",
    "seq": 2,
    "turnId": "t_9",
    "role": "assistant",
    "createdAt": 1785056404120,
}
_INFLIGHT = {
    "sessionId": "s_4f2a",
    "turnId": "t_10",
    "savedAt": 1785056701500,
    "message": {
        "type": "message",
        "id": "m_14",
        "role": "assistant",
        "createdAt": "2026-07-26T09:05:01.200Z",
        "turnId": "t_10",
        "blocks": [{"type": "text", "text": "Reading parser.py: the tokenizer starts at"}],
        "inflight": True,
    },
}

_APPROVAL_OPTIONS = [
    {"id": "allow_once", "label": "Allow once", "decision": "allow", "remember": "once"},
    {"id": "allow_project", "label": "Always allow in this project", "decision": "allow", "remember": "project"},
    {"id": "allow_session", "label": "Always allow in this session", "decision": "allow", "remember": "session"},
    {"id": "deny", "label": "Deny", "decision": "deny", "remember": "once"},
]
_APPROVAL = {
    "kind": "approval",
    "requestId": "apr_7b21",
    "sessionId": "s_4f2a",
    "turnId": "t_10",
    "toolCallId": "call_3",
    "tool": "Bash",
    "argsSummary": "pytest -q tests/parser",
    "risk": "medium",
    "options": _APPROVAL_OPTIONS,
    "requestedBy": "sidecar-1",
    "status": "pending",
    "createdAt": 1785056702000,
    "updatedAt": 1785056702000,
    "expiresAt": 1785057002000,
}
_RULE = {
    "id": "rule_apr_7b21",
    "scope": "project",
    "projectId": 3,
    "tool": "Bash",
    "decision": "allow",
    "sourceRequestId": "apr_7b21",
    "createdAt": 1785056709000,
}
_ALLOWED = {**_APPROVAL, "status": "allowed", "optionId": "allow_project", "ruleId": "rule_apr_7b21",
            "respondedBy": "ui-7d2e", "updatedAt": 1785056709000, "resolvedAt": 1785056709000}
_INTERACTION = {
    "kind": "interaction",
    "requestId": "ask_19c4",
    "sessionId": "s_4f2a",
    "turnId": "t_10",
    "toolCallId": "call_4",
    "question": "Keep the old tokenizer API as a shim?",
    "choices": [{"id": "yes", "label": "Yes, keep a shim"}, {"id": "no", "label": "No, update the callers"}],
    "multiple": False,
    "allowFreeText": True,
    "requestedBy": "sidecar-1",
    "status": "pending",
    "createdAt": 1785056712000,
    "updatedAt": 1785056712000,
}
_ANSWERED = {**_INTERACTION, "status": "answered", "answer": {"choiceIds": ["no"], "text": "and bump the version"},
             "respondedBy": "ui-7d2e", "updatedAt": 1785056720000, "resolvedAt": 1785056720000}

_PLAN_APPROVED = {"requestId": "plan_5e0d", "sessionId": "s_4f2a", "turnId": "t_9", "toolCallId": "call_3",
                  "kind": "plan", "title": "Split the tokenizer", "question": "Proceed?",
                  "status": "approved", "action": "approve", "targetPermissionMode": "accept-edits",
                  "createdAt": 1785056400000, "updatedAt": 1785056500000, "expiresAt": 1785060000000,
                  "resolvedAt": 1785056500000, "artifactPath": ".pi/plan/20260726-090000-3f9a0c1b2d4e.md",
                  "artifactSha256": "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592",
                  "artifactSize": 34, "version": 2, "executionId": "exec_22a1", "executionState": "queued"}

_DELIVERY = {
    "id": "col_5a1c",
    "pluginId": "team-lead",
    "kind": "task",
    "content": "Review the tokenizer split in parser.py and list risky call sites",
    "status": "queued",
    "notifyOnCompletion": True,
    "idempotencyKey": "review-17",
    "remainingHops": 4,
    "permissionCeiling": "accept-edits",
    "createdAt": 1785056800000,
    "updatedAt": 1785056800000,
    "source": {"sessionId": "s_4f2a", "title": "Refactor the parser", "available": True},
    "target": {"sessionId": "s_9c07", "title": "Reviewer", "available": True},
}
_DELIVERY_RUNNING = {**_DELIVERY, "status": "running", "turnId": "t_40", "updatedAt": 1785056805000}
_DELIVERY_DONE = {**_DELIVERY_RUNNING, "status": "completed", "result": "Three call sites use the old API: …",
                  "updatedAt": 1785056900000, "callbackId": "col_77e0"}
_CALLBACK = {
    "id": "col_77e0", "pluginId": "team-lead", "kind": "completion",
    "content": "[completed] Three call sites use the old API: …", "status": "queued", "notifyOnCompletion": False,
    "replyToMessageId": "col_5a1c", "idempotencyKey": "completion:col_5a1c", "remainingHops": 0,
    "permissionCeiling": "accept-edits", "createdAt": 1785056900000, "updatedAt": 1785056900000,
    "source": {"sessionId": "s_9c07", "title": "Reviewer", "available": True},
    "target": {"sessionId": "s_4f2a", "title": "Refactor the parser", "available": True},
}

_PROJECT = {"id": 3, "path": "/home/ada/src/parser", "name": "parser", "pinned": False,
            "createdAt": 1785056000000, "lastOpenedAt": 1785056400000, "sessionCount": 2,
            "trashedSessionCount": 0}
_GROUP = {"id": "g-5e0d", "name": "Parser", "roots": ["/home/ada/src/parser", "/home/ada/src/lexer"],
          "primaryRoot": "/home/ada/src/parser", "createdAt": 1785056400000, "updatedAt": 1785056400000}
_MEMORY = {"format": "entries-v1", "entries": [{"id": "e1", "title": "Build", "content": "make -j4"}],
           "content": "## Build\n\nmake -j4", "updatedAt": 1785056400000}
_PROVIDER = {"id": "openrouter", "name": "OpenRouter", "vendorKey": "custom", "type": "openai_compatible",
             "protocol": "openai_compatible", "authKind": "api_key_and_base_url",
             "baseUrl": "https://openrouter.ai/api/v1", "enabled": True,
             "config": {"headers": {"HTTP-Referer": "https://pi.desktop"}}, "hasApiKey": True,
             "secretRef": "provider/openrouter", "createdAt": 1785056400000, "updatedAt": 1785056400000}
_MODEL = {"providerId": "openrouter", "modelId": "anthropic/claude-sonnet-4", "displayName": "Claude Sonnet 4",
          "source": "discovered", "capabilities": [], "contextWindow": 200000, "maxOutputTokens": 64000,
          "deprecated": False, "updatedAt": 1785056400000}
_PLUGIN = {"id": "acme.tools", "name": "Acme tools", "version": "1.2.0", "enabled": True,
           "installedAt": 1785056400000, "updatedAt": 1785056400000}
_SYNC_STATE = {"settings": {"enabled": True, "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada",
                            "vaultKeyRef": "configSync/vaultKey", "webdavPasswordRef": "configSync/webdavPassword"},
               "hasVaultKey": True, "hasWebdavPassword": True}
_IMPORT_COUNTS = {"new": 1, "updated": 0, "unchanged": 0, "refused": 1, "would-new": 0, "would-updated": 0}
_IMPORT_REPORT = {
    "source": "claude-code", "externalId": "7f3c2e1a-9b8d-4c6e-a5f4-3e2d1c0b9a87",
    "sessionId": "cc-1d4e8f0a2b3c5d6e7f8091a2b3c4d5e6", "status": "new",
    "messages": {"assistant": 51, "user": 45}, "toolCalls": 22, "toolResults": 22, "thinkingBlocks": 9,
    "compactions": 1, "attributed": 4, "unpairedToolCalls": 0, "newRecords": 97, "newMessages": 96,
}
_IMPORT_REFUSED = {
    "source": "claude-code", "externalId": "notes", "sessionId": "cc-0b9a8c7d6e5f40312233445566778899",
    "status": "refused", "reason": "NOT_A_SESSION_FILE", "message": "no line of the file is a Claude Code record",
    "messages": {}, "toolCalls": 0, "toolResults": 0, "thinkingBlocks": 0, "compactions": 0, "attributed": 0,
    "newRecords": 0, "newMessages": 0,
}

_REVIEW_SNAPSHOT: dict[str, Any] = {
    "snapshotId": "rv-5d41402abc4b2a76b9719d911017c592", "sessionId": "s_4f2a",
    "path": "/home/ada/proj/docs/notes.md", "toolName": "Edit", "toolCallId": "call_3", "messageId": "m_7",
    "turnId": "t_9", "createdAt": 1767229200000, "state": "recorded",
    "before": {"exists": True, "sha256": "365d0b84ae63c2afc293dedd2b00bdf0dc8d6ef70c9297d90f9e5682ab0d72ee", "size": 8},
    "after": {"exists": True, "sha256": "b788fd46bc7d16b8d62ecab37888f683932d2823372f995bf4d05c9e46889ddb",
              "size": 15},
}

_ASSET_B64 = "iVBORw0KGgoAAAAAAAAAAA=="
_ASSET_META = {"path": "icons/logo.png", "mediaType": "image/png", "size": 16,
               "sha256": "d9c9bcbbba3f78d5acb0e0223861c44f79e918c161d4ea7b571f5cc6df50797f"}
_SKILL_SOURCE = "---\nname: release-notes\ndescription: Draft release notes\n---\n\nRead CHANGELOG.md, then ...\n"
_SKILL_META = {"name": "release-notes", "version": "1.2.0", "description": "Draft release notes from the changelog",
               "origin": "~/.pi/agent/skills/release-notes",
               "sha256": "336b4e07268775857fd726b4926d2e3a3721752b47838908030d0b7e7e22f06c", "sizeBytes": 90,
               "createdAt": 1785056400000, "updatedAt": 1785056400000}
EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "host.hello": (
        {"token": "3f1c…e9", "clientId": "ui-7d2e", "clientKind": "ui", "protocol": 1},
        {"protocol": 1, "clientId": "ui-7d2e", "connectionId": 4, "hostVersion": "0.1.0", "bootId": "b_51c0",
         "serverTime": 1785056400000},
    ),
    "host.createLoginCode": (
        {},
        {"code": "Jc3u9kqR0bVZ2xTt1w8yQm4nHs6dLp0a", "expiresInMs": 60000,
         "url": "http://127.0.0.1:7777/#code=Jc3u9kqR0bVZ2xTt1w8yQm4nHs6dLp0a"},
    ),
    "logs.append": (
        {"source": "agent", "category": "tools",
         "records": [{"level": "info", "msg": "bash finished", "sessionId": "s_4f2a", "exitCode": 0},
                     {"level": "warn", "msg": "read truncated at 2000 lines", "sessionId": "s_4f2a"}]},
        {"written": 2, "bytes": 231, "file": "logs/agent/tools.ndjson"},
    ),
    "host.status": (
        {},
        {
            "version": "0.1.0",
            "bootId": "b_51c0",
            "startedAt": 1785056000000,
            "uptimeMs": 400000,
            "actors": {"sessions": 3, "total": 7, "restarts": 0},
            "dbWriter": {"queueDepth": 0, "peakDepth": 14, "batches": 912},
            "pipeline": {"inFlight": 0, "running": 0, "pinned": 0, "recent": 37},
            "dataDirBytes": 48213004,
            "boot": {"durationMs": 84, "cleanShutdown": True, "sessionsScanned": 41},
        },
    ),
    "session.create": (
        {"title": "Refactor the parser", "projectPath": "/home/ada/src/parser", "submissionId": "c-1"},
        {**_SESSION, "messageCount": 0, "updatedAt": 1785056400000},
    ),
    "session.list": (
        {"limit": 2},
        {"sessions": [_SESSION], "nextCursor": "eyJ1IjoxNzg1MDU2NzEyMDAwfQ"},
    ),
    "session.get": (
        {"sessionId": "s_4f2a", "messageLimit": 2, "contentLimit": 2000},
        {
            "session": _SESSION,
            "messages": [{**_USER_MESSAGE, "seq": 11}, {**_ASSISTANT_MESSAGE, "seq": 12}],
            "compactions": [_COMPACTION],
            "messageStart": 10,
            "messageEnd": 12,
            "hasMoreBefore": True,
            "hasMoreAfter": False,
            "totalMessages": 12,
            "inflight": _INFLIGHT,
        },
    ),
    "session.appendMessage": (
        {"sessionId": "s_4f2a", "message": _ASSISTANT_MESSAGE, "submissionId": "out-118"},
        {"message": _MESSAGE_REF, "replayed": False},
    ),
    "session.rename": (
        {"sessionId": "s_4f2a", "title": "  Parser refactor  "},
        {**_SESSION, "title": "Parser refactor"},
    ),
    "session.update": (
        {"sessionId": "s_4f2a", "modelId": "claude-opus-4", "thinkingLevel": "high"},
        {**_SESSION, "modelId": "claude-opus-4", "thinkingLevel": "high"},
    ),
    "session.delete": ({"sessionId": "s_4f2a"}, {"sessionId": "s_4f2a", "deleted": True}),
    "events.subscribe": (
        {"topics": ["session.message", "turn.ended"], "sessionId": "s_4f2a", "cursor": 1041},
        {"subscriptionId": "sub-1", "cursor": 1045},
    ),
    "events.unsubscribe": ({"subscriptionId": "sub-1"}, {"ok": True}),
    "session.startTurn": (
        {
            "sessionId": "s_4f2a",
            "turnId": "t_9",
            "providerId": "anthropic",
            "modelId": "claude-sonnet-4",
            "environment": {
                "version": 1,
                "connection": {"baseUrl": "https://api.anthropic.com", "apiStyle": "messages"},
                "model": {"id": "claude-sonnet-4", "contextWindow": 200000},
                "parameters": {"maxTokens": 8192},
                "systemPrompt": "You are a careful coding agent.",
                "credentialRefs": ["provider/anthropic"],
            },
        },
        {**_TURN, "environmentDigest": "5d41402abc4b2a76b9719d911017c592" * 2},
    ),
    "session.endTurn": (
        {
            "sessionId": "s_4f2a",
            "turnId": "t_9",
            "status": "completed",
            "usage": {"inputTokens": 1830, "outputTokens": 412, "cacheRead": 1024},
        },
        {"turn": _ENDED_TURN, "notification": _NOTIFICATION},
    ),
    "session.turnEnvironment": (
        {"turnId": "t_9"},
        {
            "version": 1,
            "digest": "5d41402abc4b2a76b9719d911017c592" * 2,
            "snapshot": {
                "version": 1,
                "connection": {"baseUrl": "https://api.anthropic.com", "apiStyle": "messages"},
                "model": {"id": "claude-sonnet-4", "contextWindow": 200000},
                "parameters": {"maxTokens": 8192},
                "systemPrompt": "You are a careful coding agent.",
                "skills": [],
                "toolSchemas": [{"name": "Write", "parameters": {"type": "object"}}],
                "executionBindings": {"cwd": "/home/ada/src/parser"},
                "permissionPolicy": {"mode": "ask"},
                "browserSubmissionContext": {},
                "credentialRefs": ["provider/anthropic"],
                "capabilities": {"vision": True},
            },
        },
    ),
    "session.saveInflightMessage": (
        {
            "sessionId": "s_4f2a",
            "turnId": "t_9",
            "message": {**_ASSISTANT_MESSAGE, "meta": {"status": "streaming"}},
        },
        {"saved": True},
    ),
    "session.recoverInflight": (
        {"sessionId": "s_4f2a", "turnId": "t_10", "submissionId": "lost-t_10"},
        {
            "action": "promoted",
            "message": {**_MESSAGE_REF, "id": "m_14", "seq": 14, "turnId": "t_10", "createdAt": 1785056701200},
            "turn": {**_TURN, "id": "t_10", "status": "aborted", "errorCode": "SIDECAR_LOST",
                     "endedAt": 1785056702000},
        },
    ),
    "notifications.list": (
        {"unreadOnly": True, "limit": 20},
        {"notifications": [_NOTIFICATION], "unreadCount": 1},
    ),
    "notifications.markRead": ({"ids": ["n_31"]}, {"updated": 1}),
    "notifications.markAllRead": ({}, {"updated": 4}),
    "notifications.clear": ({"ids": ["n_31"]}, {"deleted": 1}),
    "session.queuePush": (
        {
            "sessionId": "s_4f2a",
            "principal": "ui",
            "idempotencyKey": "k-17",
            "content": "Now add tests",
            "permissionMode": "ask",
        },
        {"entry": _ENTRY, "replayed": False},
    ),
    "session.queueList": ({"sessionId": "s_4f2a"}, {"entries": [_ENTRY], "held": False, "controllerId": "agent-1"}),
    "session.queueRemove": ({"sessionId": "s_4f2a", "entryId": "q_2"}, {"entries": [], "held": False}),
    "session.queuePrioritize": (
        {"sessionId": "s_4f2a", "entryId": "q_2"},
        {"entries": [{**_ENTRY, "priority": 1}], "held": False},
    ),
    "session.queueReorder": (
        {"sessionId": "s_4f2a", "entryId": "q_2", "direction": "up"},
        {"entries": [_ENTRY], "held": False},
    ),
    "session.queueAttach": (
        {"sessionId": "s_4f2a", "controllerId": "agent-1"},
        {"entries": [_ENTRY], "held": False, "controllerId": "agent-1"},
    ),
    "session.queueTake": ({"sessionId": "s_4f2a", "controllerId": "agent-1"}, {"entry": _ENTRY}),
    "artifacts.list": (
        {"sessionId": "s_4f2a", "limit": 1},
        {
            "artifacts": [
                {
                    "sessionId": "s_4f2a",
                    "path": "/home/ada/src/parser/tokenizer.py",
                    "op": "write",
                    "turnId": "t_9",
                    "updatedAt": 1785056710000,
                }
            ],
            "nextCursor": "YXJ0OjI",
        },
    ),
    "session.saveActiveRevision": ({"sessionId": "s_4f2a", "rootUserId": "m_1"}, {"revision": _REVISION}),
    "session.activateRevision": (
        {"sessionId": "s_4f2a", "rootUserId": "m_1", "revisionIndex": 1},
        {"session": _SESSION, "revisions": [_REVISION, {**_REVISION, "revisionIndex": 2, "isActive": False}]},
    ),
    "session.listRevisions": ({"sessionId": "s_4f2a", "rootUserId": "m_1"}, {"revisions": [_REVISION]}),
    "session.truncateFrom": (
        {"sessionId": "s_4f2a", "messageId": "m_2", "mode": "regenerate"},
        {"session": {**_SESSION, "messageCount": 11}, "removed": 1},
    ),
    "session.replaceMessages": (
        {"sessionId": "s_4f2a", "messages": [_USER_MESSAGE]},
        {"session": {**_SESSION, "messageCount": 1}},
    ),
    "session.appendCompaction": ({"sessionId": "s_4f2a", "compaction": _COMPACTION}, {"compaction": _COMPACTION}),
    "session.fork": (
        {"sessionId": "s_4f2a", "throughMessageId": "m_1", "title": "Parser, take two"},
        {**_SESSION, "id": "s_77b0", "title": "Parser, take two", "messageCount": 1},
    ),
    "session.updateMetadata": (
        {"sessionId": "s_4f2a", "tags": ["parser", "work"], "folder": "Clients/Acme", "archived": True,
         "origins": [{"origin": "https://docs.python.org", "status": "approved"}]},
        {**_SESSION, "thread": {"tags": ["parser", "work"], "folder": "Clients/Acme", "archived": True,
                                "origins": [{"origin": "https://docs.python.org", "status": "approved"}]}},
    ),
    "session.assistantEdit": (
        {"sessionId": "s_4f2a", "messageId": "m_2", "blocks": [{"type": "text", "text": "Split it in two files."}],
         "title": "Parser, edited", "submissionId": "edit-1"},
        {"session": {**_SESSION, "id": "s_9c1d", "title": "Parser, edited", "messageCount": 2},
         "messageId": "e3b9a41c07d2e5f60a1b2c3d4e5f60718", "originalMessageId": "m52c0e1f9a8b7c6d5e4f3a2b1c0d9e8f7",
         "rootUserId": "m0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d", "revisionIndex": 2, "originalRevisionIndex": 1},
    ),
    "session.deleteMessage": ({"sessionId": "s_4f2a", "messageId": "m_2"}, {"messageId": "m_2", "deleted": True}),
    "session.restoreMessage": ({"sessionId": "s_4f2a", "messageId": "m_2"}, {"messageId": "m_2", "deleted": False}),
    "session.tree": (
        {"sessionId": "s_4f2a"},
        {
            "nodes": [
                {"id": "m_1", "messageId": "m_1", "role": "user", "revisionIndex": 2,
                 "active": True, "deleted": False, "preview": "Split the tokenizer"},
                {
                    "id": "rev:m_1:1:m_2a",
                    "messageId": "m_2a",
                    "parentId": "m_1",
                    "role": "assistant",
                    "revisionIndex": 1,
                    "active": False,
                    "deleted": False,
                    "preview": "I could not find parser.py",
                },
                {
                    "id": "m_2",
                    "messageId": "m_2",
                    "parentId": "m_1",
                    "role": "assistant",
                    "revisionIndex": 2,
                    "active": True,
                    "deleted": False,
                    "preview": "Done: tokenizer.py now holds…",
                },
            ],
            "activeLeafId": "m_2",
        },
    ),
    "session.context": (
        {"sessionId": "s_4f2a"},
        {"messages": [_USER_MESSAGE, {k: v for k, v in _ASSISTANT_MESSAGE.items() if k != "meta"}]},
    ),
    "search.sessions": (
        {"query": "tokenizer", "limit": 10},
        {
            "results": [
                {
                    "sessionId": "s_4f2a",
                    "title": "Refactor the parser",
                    "projectPath": "/home/ada/src/parser",
                    "titleMatch": False,
                    "projectMatch": False,
                    "messageMatches": 2,
                    "snippets": [
                        {"messageId": "m_1", "role": "user", "seq": 1, "snippet": "Split the tokenizer out of…"}
                    ],
                }
            ],
            "totalSessions": 1,
            "totalMessageMatches": 2,
        },
    ),
    "search.query": (
        {"query": "tokenizer", "sessionId": "s_4f2a"},
        {
            "results": [
                {
                    "sessionId": "s_4f2a",
                    "messageId": "m_2",
                    "role": "assistant",
                    "seq": 2,
                    "snippet": "Done: tokenizer.py now holds…",
                    "createdAt": 1785056404120,
                }
            ]
        },
    ),
    "settings.get": (
        {"key": "largePasteThreshold"},
        {"ns": "app", "key": "largePasteThreshold", "value": 600, "updatedAt": 1785056000000},
    ),
    "settings.set": (
        {"ns": "ui", "key": "sidebarWidth", "value": 280, "submissionId": "set-4"},
        {"ns": "ui", "key": "sidebarWidth", "value": 280, "changed": ["sidebarWidth"], "updatedAt": 1785056401000},
    ),
    # -- secrets, attachments, tasks, plans, projects (runtime/methods_store.py)
    "secrets.set": (
        {"ref": "provider/anthropic", "value": "sk-ant-…", "ownerKind": "provider", "ownerId": "anthropic",
         "submissionId": "sec-1"},
        {"ref": "provider/anthropic", "updatedAt": 1785056400000, "version": 1},
    ),
    "secrets.get": ({"ref": "provider/anthropic"}, {"ref": "provider/anthropic", "value": "sk-ant-…"}),
    "secrets.delete": ({"ref": "provider/anthropic"}, {"ref": "provider/anthropic", "deleted": True}),
    "secrets.list": (
        {"ownerKind": "provider"},
        {"secrets": [{"ref": "provider/anthropic", "ownerKind": "provider", "ownerId": "anthropic",
                      "kind": "api_key", "backend": "file_fallback", "updatedAt": 1785056400000}]},
    ),
    "audit.list": (
        {"sessionId": "s_4f2a", "kind": "tool_denied", "since": 1767225600000, "limit": 1},
        {"entries": [{"id": 812, "ts": 1767229200000, "kind": "tool_denied", "sessionId": "s_4f2a",
                      "payload": {"requestId": "apr_7", "tool": "Bash", "by": "user", "turnId": "t_9",
                                  "toolCallId": "call_3", "optionId": "deny"}}],
         "nextCursor": "WzIsImF1ZGl0IiwiOWIyZiIsWzE3NjcyMjkyMDAwMDAsODEyXV0"},
    ),
    "review.record": (
        {"sessionId": "s_4f2a", "path": "docs/notes.md", "beforeBase64": "IyBOb3Rlcwo=", "toolName": "Edit",
         "toolCallId": "call_3", "messageId": "m_7", "turnId": "t_9", "submissionId": "rv-1"},
        {"snapshot": _REVIEW_SNAPSHOT,
         "review": {"snapshotId": "rv-5d41402abc4b2a76b9719d911017c592", "path": "/home/ada/proj/docs/notes.md",
                    "beforeSha256": "365d0b84ae63c2afc293dedd2b00bdf0dc8d6ef70c9297d90f9e5682ab0d72ee",
                    "afterSha256": "b788fd46bc7d16b8d62ecab37888f683932d2823372f995bf4d05c9e46889ddb",
                    "created": False}},
    ),
    "review.get": (
        {"sessionId": "s_4f2a", "snapshotId": "rv-5d41402abc4b2a76b9719d911017c592", "includeBefore": True},
        {"snapshot": _REVIEW_SNAPSHOT, "beforeBase64": "IyBOb3Rlcwo="},
    ),
    "review.list": (
        {"sessionId": "s_4f2a", "messageId": "m_7"},
        {"snapshots": [_REVIEW_SNAPSHOT], "truncated": False},
    ),
    "review.restore": (
        {"sessionId": "s_4f2a", "snapshotId": "rv-5d41402abc4b2a76b9719d911017c592", "submissionId": "rv-2"},
        {"snapshot": {**_REVIEW_SNAPSHOT, "state": "restored", "restoredAt": 1767229260000}},
    ),
    "attachments.put": (
        {"name": "diagram.png", "mimeType": "image/png", "dataBase64": "iVBORw0KGgo=", "submissionId": "att-1"},
        {"ref": "attachments/4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6",
         "sha256": "4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6", "size": 8,
         "name": "diagram.png", "mimeType": "image/png"},
    ),
    "attachments.importFile": (
        {"path": "/home/ada/Videos/demo.mp4", "mimeType": "video/mp4"},
        {"ref": "attachments/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
         "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "size": 48213377,
         "mimeType": "video/mp4"},
    ),
    "attachments.ref": (
        {"sha256": "4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6", "sessionId": "s_4f2a",
         "messageId": "m_1"},
        {"sha256": "4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6", "sessionId": "s_4f2a",
         "messageId": "m_1", "created": True},
    ),
    "attachments.get": (
        {"sha256": "4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6"},
        {"ref": "attachments/4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6",
         "sha256": "4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6", "size": 8,
         "mimeType": "image/png", "kind": "screenshot", "trust": "user", "provenance": "capture",
         "source": "https://example.org/docs", "runId": "t_9", "meta": {"width": 1280, "height": 800},
         "createdAt": 1767225600000, "lastUsedAt": 1767229200000, "deletionState": "evicted",
         "evictedAt": 1767315600000,
         "references": [{"sessionId": "s_4f2a", "messageId": "m_1", "origin": "transcript", "evicted": True}],
         "referencesTruncated": False},
    ),
    "attachments.estimate": (
        {},
        {"usedBytes": 178257920, "budgetBytes": 209715200, "percent": 85.0, "warning": True, "blobs": 41},
    ),
    "attachments.gc": (
        {"activeSessionId": "s_4f2a"},
        {"evicted": ["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"],
         "unreferencedEvicted": ["60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752"],
         "freedBytes": 48313377, "orphansRemoved": 0,
         "estimate": {"usedBytes": 129944543, "budgetBytes": 209715200, "percent": 61.96, "warning": False,
                      "blobs": 39}},
    ),
    "tasks.create": (
        {"title": "Morning digest", "prompt": "Summarize yesterday's commits", "cadence": "daily",
         "schedule": {"hour": 8, "minute": 30}, "workspacePath": "/home/ada/src/parser", "thinkingLevel": "low",
         "submissionId": "task-1"},
        {"id": "task_7c1e", "title": "Morning digest", "prompt": "Summarize yesterday's commits",
         "cadence": "daily", "enabled": True, "mode": "agent",
         "config": {"schedule": {"hour": 8, "minute": 30}, "workspacePath": "/home/ada/src/parser",
                    "thinkingLevel": "low", "mode": "agent", "calendarConfigured": True},
         "schedule": {"hour": 8, "minute": 30}, "workspacePath": "/home/ada/src/parser", "thinkingLevel": "low",
         "calendarConfigured": True, "nextRunAt": "2026-07-27T08:30:00.000Z",
         "createdAt": 1785056400000, "updatedAt": 1785056400000},
    ),
    "tasks.update": (
        {"taskId": "task_7c1e", "enabled": False, "permissionMode": "ask"},
        {"id": "task_7c1e", "title": "Morning digest", "prompt": "Summarize yesterday's commits",
         "cadence": "daily", "enabled": False, "mode": "agent",
         "config": {"schedule": {"hour": 8, "minute": 30}, "workspacePath": "/home/ada/src/parser",
                    "thinkingLevel": "low", "mode": "agent", "calendarConfigured": True, "permissionMode": "ask"},
         "schedule": {"hour": 8, "minute": 30}, "workspacePath": "/home/ada/src/parser", "thinkingLevel": "low",
         "permissionMode": "ask", "calendarConfigured": True, "nextRunAt": "2026-07-27T08:30:00.000Z",
         "createdAt": 1785056400000, "updatedAt": 1785056460000},
    ),
    "tasks.delete": ({"taskId": "task_7c1e"}, {"taskId": "task_7c1e", "deleted": True}),
    "tasks.list": (
        {},
        {"tasks": [{"id": "task_7c1e", "title": "Morning digest", "prompt": "Summarize yesterday's commits",
                    "cadence": "manual", "enabled": True, "mode": "agent", "config": {"mode": "agent"},
                    "calendarConfigured": False, "createdAt": 1785056400000, "updatedAt": 1785056400000}]},
    ),
    "tasks.get": (
        {"taskId": "task_7c1e"},
        {"id": "task_7c1e", "title": "Morning digest", "prompt": "Summarize yesterday's commits",
         "cadence": "manual", "enabled": True, "mode": "agent", "config": {"mode": "agent"},
         "calendarConfigured": False, "createdAt": 1785056400000, "updatedAt": 1785056400000},
    ),
    "tasks.runs": (
        {"taskId": "task_7c1e"},
        {"runs": [{"id": "run_01", "taskId": "task_7c1e", "sessionId": "s_4f2a", "status": "completed",
                   "startedAt": 1785133800000, "endedAt": 1785133860000}]},
    ),
    "tasks.startRun": (
        {"taskId": "task_7c1e", "sessionId": "s_4f2a"},
        {"id": "run_01", "taskId": "task_7c1e", "sessionId": "s_4f2a", "status": "running",
         "startedAt": 1785133800000,
         "settings": {"trigger": "manual", "mode": "agent", "permissionMode": "inherit", "thinkingLevel": "low",
                      "workspacePath": "/home/ada/src/parser"}},
    ),
    "tasks.finishRun": (
        {"runId": "run_01", "status": "completed"},
        {"id": "run_01", "taskId": "task_7c1e", "sessionId": "s_4f2a", "status": "completed",
         "startedAt": 1785133800000, "endedAt": 1785133860000},
    ),
    "plans.submit": (
        {"sessionId": "s_4f2a", "turnId": "t_9", "toolCallId": "call_3", "kind": "plan",
         "markdown": "# Plan\n\n1. Split the tokenizer\n", "title": "Split the tokenizer",
         "question": "Proceed?", "workspaceRoot": "/home/ada/src/parser", "expiresAt": 1785060000000},
        {"requestId": "plan_5e0d", "sessionId": "s_4f2a", "turnId": "t_9", "toolCallId": "call_3",
         "kind": "plan", "title": "Split the tokenizer", "question": "Proceed?", "status": "pending",
         "createdAt": 1785056400000, "updatedAt": 1785056400000, "expiresAt": 1785060000000,
         "artifactPath": ".pi/plan/20260726-090000-3f9a0c1b2d4e.md",
         "artifactSha256": "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592",
         "artifactSize": 34, "version": 1},
    ),
    "plans.pending": (
        {},
        {"pending": [{"requestId": "plan_5e0d", "sessionId": "s_4f2a", "turnId": "t_9", "toolCallId": "call_3",
                      "kind": "plan", "title": "Split the tokenizer", "question": "Proceed?",
                      "status": "pending", "createdAt": 1785056400000, "updatedAt": 1785056400000,
                      "expiresAt": 1785060000000, "artifactPath": ".pi/plan/20260726-090000-3f9a0c1b2d4e.md",
                      "artifactSha256": "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592",
                      "artifactSize": 34, "version": 1}]},
    ),
    "plans.respond": (
        {"requestId": "plan_5e0d", "action": "approve", "targetPermissionMode": "accept-edits",
         "submissionId": "ans-1"},
        {"approval": _PLAN_APPROVED,
         "session": {**_SESSION, "mode": "agent", "permissionMode": "accept-edits", "state": "queued",
                     "contractKind": "plan"}},
    ),
    "plans.startExecution": (
        {"sessionId": "s_4f2a", "executionId": "exec_22a1", "turnId": "t_11"},
        {"approval": {**_PLAN_APPROVED, "executionState": "running", "executionTurnId": "t_11",
                      "executionStartedAt": 1785056800000, "updatedAt": 1785056800000},
         "session": {**_SESSION, "state": "running", "contractKind": "plan"}},
    ),
    "plans.finishExecution": (
        {"sessionId": "s_4f2a", "executionId": "exec_22a1", "turnId": "t_11", "outcome": "completed"},
        {"approval": {**_PLAN_APPROVED, "executionState": "completed", "executionTurnId": "t_11",
                      "executionStartedAt": 1785056800000, "executionEndedAt": 1785056900000,
                      "updatedAt": 1785056900000},
         "session": {**_SESSION, "latestTurn": {"id": "t_11", "status": "completed", "endedAt": 1785056900000}}},
    ),
    "collab.deliver": (
        {"pluginId": "team-lead", "sourceSessionId": "s_4f2a", "targetSessionId": "s_9c07", "kind": "task",
         "content": "Review the tokenizer split in parser.py and list risky call sites",
         "notifyOnCompletion": True, "idempotencyKey": "review-17"},
        {"delivery": _DELIVERY, "replayed": False,
         "entry": {**_ENTRY, "id": "q_9", "sessionId": "s_9c07", "principal": "plugin:team-lead",
                   "idempotencyKey": "collab:col_5a1c", "content": _DELIVERY["content"],
                   "permissionMode": "accept-edits", "position": 1,
                   "sessionMessageId": "col_5a1c", "createdAt": 1785056800000}},
    ),
    "collab.begin": (
        {"sessionId": "s_9c07", "deliveryId": "col_5a1c", "turnId": "t_40"},
        {"delivery": _DELIVERY_RUNNING,
         "message": {"id": "collab-col_5a1c", "sessionId": "s_9c07", "seq": 1, "turnId": "t_40", "role": "user",
                     "createdAt": 1785056805000}},
    ),
    "collab.settle": (
        {"sessionId": "s_9c07", "deliveryId": "col_5a1c", "turnId": "t_40", "status": "completed",
         "result": "Three call sites use the old API: …"},
        {"delivery": _DELIVERY_DONE, "callback": _CALLBACK},
    ),
    "collab.cancel": (
        {"deliveryId": "col_5a1c"},
        {"delivery": {**_DELIVERY, "status": "cancelled", "updatedAt": 1785056803000}},
    ),
    "collab.list": (
        {"sessionId": "s_4f2a", "direction": "incoming"},
        {"deliveries": [_CALLBACK]},
    ),
    "collab.get": (
        {"deliveryId": "col_5a1c"},
        {**_DELIVERY_DONE, "source": {"sessionId": "s_4f2a", "title": "Refactor the parser", "available": False}},
    ),
    "session.verifyEnvironment": (
        {"sessionId": "s_4f2a", "turnId": "t_9"},
        {"turnId": "t_9", "digest": "4f1c0b9d2e6a7c3b8a5d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d", "version": 1,
         "inputDigest": "9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"},
    ),
    "usage.session": (
        {"sessionId": "s_4f2a"},
        {"sessionId": "s_4f2a",
         "total": {"turns": 14, "inputTokens": 48210, "outputTokens": 9120, "costMicros": 412300, "failedTurns": 1,
                   "abortedTurns": 2},
         "byModel": [{"providerId": "anthropic", "modelId": "claude-sonnet-4", "turns": 12, "inputTokens": 40110,
                      "outputTokens": 8020, "costMicros": 370100, "failedTurns": 1, "abortedTurns": 2},
                     {"providerId": "anthropic", "modelId": "claude-haiku-4", "turns": 2, "inputTokens": 8100,
                      "outputTokens": 1100, "costMicros": 42200, "failedTurns": 0, "abortedTurns": 0}]},
    ),
    "usage.history": (
        {"days": 7, "utcOffsetMinutes": 120},
        {"days": [{"day": "2026-07-25", "turns": 9, "inputTokens": 30100, "outputTokens": 5200, "costMicros": 261000,
                   "failedTurns": 0, "abortedTurns": 1},
                  {"day": "2026-07-26", "turns": 5, "inputTokens": 18110, "outputTokens": 3920, "costMicros": 151300,
                   "failedTurns": 1, "abortedTurns": 1}]},
    ),
    "session.listTurns": (
        {"sessionId": "s_4f2a", "limit": 2},
        {"turns": [{**_ENDED_TURN, "id": "t_10", "retryOf": "t_9", "startedAt": 1785056713000,
                    "endedAt": 1785056730000},
                   {**_ENDED_TURN, "status": "error", "errorCode": "RATE_LIMITED"}],
         "nextCursor": "WzIsInR1cm5zIiwiOWQxZSIsWzE3ODUwNTY3MDAwMDAsInRfOSJdXQ"},
    ),
    "approvals.request": (
        {"sessionId": "s_4f2a", "turnId": "t_10", "toolCallId": "call_3", "tool": "Bash",
         "argsSummary": "pytest -q tests/parser", "risk": "medium", "expiresAt": 1785057002000,
         "submissionId": "ask-call_3"},
        {"request": _APPROVAL},
    ),
    "approvals.pending": ({"sessionId": "s_4f2a"}, {"pending": [_APPROVAL]}),
    "approvals.respond": (
        {"sessionId": "s_4f2a", "requestId": "apr_7b21", "optionId": "allow_project", "submissionId": "ui-a-17"},
        {"request": _ALLOWED, "rule": _RULE},
    ),
    "approvals.rules": ({"sessionId": "s_4f2a"}, {"rules": [_RULE]}),
    "approvals.removeRule": ({"ruleId": "rule_apr_7b21"}, {"removed": True}),
    "interactions.request": (
        {"sessionId": "s_4f2a", "turnId": "t_10", "toolCallId": "call_4",
         "question": "Keep the old tokenizer API as a shim?",
         "choices": [{"id": "yes", "label": "Yes, keep a shim"}, {"id": "no", "label": "No, update the callers"}],
         "allowFreeText": True},
        {"request": _INTERACTION},
    ),
    "interactions.pending": ({}, {"pending": [_INTERACTION]}),
    "interactions.respond": (
        {"sessionId": "s_4f2a", "requestId": "ask_19c4",
         "answer": {"choiceIds": ["no"], "text": "and bump the version"}},
        {"request": _ANSWERED},
    ),
    "projects.list": (
        {},
        {"projects": [{"id": 3, "path": "/home/ada/src/parser", "name": "parser", "pinned": False,
                       "createdAt": 1785056400000, "lastOpenedAt": 1785056712000, "sessionCount": 4,
                       "trashedSessionCount": 1}]},
    ),
    "projects.remove": (
        {"projectId": 3, "submissionId": "rm-3"},
        {"projectId": 3, "path": "/home/ada/src/parser", "deletedSessions": ["s_4f2a", "s_77b0"]},
    ),
    # -- configuration (issue 13)
    "settings.getAll": (
        {"ns": "app"},
        {"ns": "app", "values": {"largePasteThreshold": 600, "thinkingDisplayMode": "compact",
                                 "defaultMode": "agent"}, "updatedAt": 1785056401000},
    ),
    "settings.update": (
        {"values": {"largePasteThreshold": 1200, "promptEnhancementUserTemplate": "   "}, "submissionId": "set-5"},
        {"ns": "app", "values": {"largePasteThreshold": 1200, "promptEnhancementUserTemplate": None},
         "changed": ["largePasteThreshold"], "updatedAt": 1785056402000},
    ),
    "settings.delete": (
        {"ns": "ui", "key": "sidebarWidth"},
        {"ns": "ui", "key": "sidebarWidth", "deleted": True, "changed": ["sidebarWidth"]},
    ),
    "workspace.open": (
        {"path": "/home/ada/src/parser/", "submissionId": "ws-1"},
        {"currentProjectId": 3, "project": _PROJECT},
    ),
    "workspace.get": ({}, {"currentProjectId": 3, "project": _PROJECT}),
    "session.resolvePath": (
        {"sessionId": "s_4f2a", "path": "src/../README.md"},
        {"sessionId": "s_4f2a", "projectId": 3, "root": "/home/ada/src/parser",
         "path": "/home/ada/src/parser/README.md", "insideRoot": True},
    ),
    "projects.pin": ({"projectId": 3, "pinned": True}, {"project": {**_PROJECT, "pinned": True}}),
    "projectGroups.list": ({}, {"groups": [_GROUP]}),
    "projectGroups.get": (
        {"groupId": "g-5e0d"},
        {"group": _GROUP, "memory": _MEMORY, "instructions": "Run the tests of both roots."},
    ),
    "projectGroups.save": (
        {"name": "Parser", "roots": ["/home/ada/src/parser", "/home/ada/src/lexer"], "submissionId": "grp-1"},
        {"group": _GROUP},
    ),
    "projectGroups.delete": ({"groupId": "g-5e0d"}, {"groupId": "g-5e0d", "deleted": True}),
    "projectGroups.setMemory": (
        {"groupId": "g-5e0d", "memory": {"format": "entries-v1",
                                         "entries": [{"title": "Build", "content": "make -j4"}]}},
        {"groupId": "g-5e0d", "memory": _MEMORY},
    ),
    "projectGroups.setInstructions": (
        {"groupId": "g-5e0d", "instructions": "Run the tests of both roots."},
        {"groupId": "g-5e0d", "instructions": "Run the tests of both roots."},
    ),
    "providers.list": ({}, {"providers": [_PROVIDER]}),
    "providers.get": ({"providerId": "openrouter"}, {"provider": _PROVIDER}),
    "providers.create": (
        {"id": "openrouter", "name": "OpenRouter", "baseUrl": "https://openrouter.ai/api/v1",
         "apiKey": "sk-or-v1-0123456789abcdef", "config": {"headers": {"HTTP-Referer": "https://pi.desktop"}},
         "submissionId": "prov-1"},
        {"provider": _PROVIDER},
    ),
    "providers.update": (
        {"providerId": "openrouter", "defaultModelId": "anthropic/claude-sonnet-4"},
        {"provider": {**_PROVIDER, "defaultModelId": "anthropic/claude-sonnet-4"}},
    ),
    "providers.delete": ({"providerId": "openrouter"}, {"providerId": "openrouter", "deleted": True}),
    "providers.reorder": (
        {"providerIds": ["openrouter", "local-llama"]}, {"providerIds": ["openrouter", "local-llama"]},
    ),
    "providers.sync": (
        {"providers": [{"id": "acme-gateway", "name": "Acme gateway", "baseUrl": "https://llm.acme.example/v1"}]},
        {"providers": [{"id": "acme-gateway", "name": "Acme gateway", "vendorKey": "custom",
                        "type": "openai_compatible", "protocol": "openai_compatible",
                        "authKind": "api_key_and_base_url", "baseUrl": "https://llm.acme.example/v1",
                        "enabled": True, "config": {}, "hasApiKey": False, "ownerPluginId": "acme.tools",
                        "createdAt": 1785056400000, "updatedAt": 1785056400000}], "removed": []},
    ),
    "models.list": ({"providerId": "openrouter"}, {"models": [_MODEL]}),
    "models.add": (
        {"providerId": "openrouter", "modelId": "my/finetune", "displayName": "My finetune",
         "contextWindow": 32768},
        {"model": {"providerId": "openrouter", "modelId": "my/finetune", "displayName": "My finetune",
                   "source": "user", "capabilities": [], "contextWindow": 32768, "deprecated": False,
                   "updatedAt": 1785056400000}},
    ),
    "models.remove": (
        {"providerId": "openrouter", "modelId": "my/finetune"},
        {"providerId": "openrouter", "modelId": "my/finetune", "deleted": True},
    ),
    "models.refresh": (
        {"providerId": "openrouter", "submissionId": "refresh-1"},
        {"providerId": "openrouter", "refreshedAt": 1785056400000, "listed": 312, "added": 310, "updated": 0,
         "userKept": 2, "deprecated": []},
    ),
    "plugins.list": ({}, {"plugins": [_PLUGIN]}),
    "plugins.register": (
        {"pluginId": "acme.tools", "name": "Acme tools", "version": "1.2.0",
         "assets": [{"path": "icons/logo.png", "mediaType": "image/png", "dataBase64": _ASSET_B64}]},
        {"plugin": _PLUGIN, "assets": [_ASSET_META]},
    ),
    "plugins.listAssets": ({"pluginId": "acme.tools"}, {"pluginId": "acme.tools", "assets": [_ASSET_META]}),
    "plugins.getAsset": (
        {"path": "icons/logo.png"},
        {"pluginId": "acme.tools", "asset": {**_ASSET_META, "dataBase64": _ASSET_B64}},
    ),
    "plugins.setEnabled": (
        {"pluginId": "acme.tools", "enabled": False},
        {"plugin": {**_PLUGIN, "enabled": False, "updatedAt": 1785056500000}},
    ),
    "plugins.uninstall": (
        {"pluginId": "acme.tools", "submissionId": "un-1"},
        {"pluginId": "acme.tools", "registryEntryRemoved": True, "settingsRemoved": ["lastSync", "token.ref"],
         "providersReleased": ["acme-gateway"]},
    ),
    "skills.list": ({}, {"skills": [_SKILL_META]}),
    "skills.get": ({"name": "release-notes"}, {"skill": {**_SKILL_META, "source": _SKILL_SOURCE}}),
    "skills.put": (
        {"name": "release-notes", "version": "1.2.0", "source": _SKILL_SOURCE,
         "description": "Draft release notes from the changelog", "origin": "~/.pi/agent/skills/release-notes",
         "submissionId": "sk-1"},
        {"skill": _SKILL_META, "changed": True},
    ),
    "skills.delete": ({"name": "release-notes", "submissionId": "sk-2"}, {"name": "release-notes", "deleted": True}),
    "memories.list": (
        {"scope": "project", "limit": 2},
        {"memories": [{"scope": "project", "key": "/home/ada/src/app", "entries": 2, "contentBytes": 318,
                       "updatedAt": 1785056400000},
                      {"scope": "project", "key": "/home/ada/src/parser", "entries": 1, "contentBytes": 42,
                       "updatedAt": 1785056300000}],
         "nextAfter": "/home/ada/src/parser"},
    ),
    "configSync.get": ({}, _SYNC_STATE),
    "configSync.configure": (
        {"enabled": True, "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada", "webdavPassword": "…"},
        _SYNC_STATE,
    ),
    "configSync.export": (
        {"submissionId": "export-1"},
        {"bundleBase64": "UElDRkcwMQo…", "sha256": "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592",
         "bytes": 2048, "exportedAt": 1785056400000},
    ),
    "configSync.apply": (
        {"bundleBase64": "UElDRkcwMQo…", "submissionId": "apply-1"},
        {"sha256": "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592",
         "applied": {"settings": 3, "providers": 1, "models": 0, "projects": 2, "projectGroups": 1, "memory": 1,
                     "skills": 0}},
    ),
    "import.sessions": (
        {"source": "claude-code", "root": "/home/ada/.claude/projects", "importId": "imp-1", "submissionId": "i-1"},
        {"importId": "imp-1", "source": "claude-code", "root": "/home/ada/.claude/projects", "dryRun": False,
         "total": 2, "counts": _IMPORT_COUNTS, "messages": 96, "newMessages": 96, "hiddenOffBranch": 0,
         "restoredOnBranch": 0, "unknownKinds": {"world_state": 3}, "unreadLines": 0, "repairedLines": 0,
         "sourceBytes": 482113,
         "sessions": [_IMPORT_REFUSED, _IMPORT_REPORT], "truncated": False},
    ),
    "plugins.importSession": (
        {"sourceId": "chatlog", "externalId": "conv-81", "title": "Parser ideas", "history":
         {"projectPath": "/elsewhere/parser", "modelId": "gpt-x"}, "messages": [_USER_MESSAGE],
         "submissionId": "pi-1"},
        {"sessionId": "pl-5b1e0c9a7d3f42e8a1b6c0d9e8f7a6b5", "created": True, "messageCount": 1},
    ),
    "plugins.listSessions": (
        {"sourceId": "chatlog"},
        {"sessions": [{**{k: v for k, v in _SESSION.items() if k not in ("projectId", "projectPath", "providerId",
                                                                         "modelId")},
                       "id": "pl-5b1e0c9a7d3f42e8a1b6c0d9e8f7a6b5", "source": "chatlog",
                       "origin": {"sourceId": "chatlog", "externalId": "conv-81", "label": "chatlog",
                                  "history": {"projectPath": "/elsewhere/parser", "modelId": "gpt-x"}}}]},
    ),
    "sessions.trash": (
        {"sessionId": "s_4f2a", "submissionId": "tr-1"},
        {"session": {**_SESSION, "deletedAt": 1785056800000}},
    ),
    "sessions.restore": (
        {"sessionId": "s_4f2a", "submissionId": "rs-1"},
        {"session": _SESSION},
    ),
    "sessions.purge": (
        {"sessionId": "s_4f2a", "submissionId": "pg-1"},
        {"sessionId": "s_4f2a", "purged": True},
    ),
    "sessions.listTrashed": (
        {"limit": 20},
        {"sessions": [{**_SESSION, "deletedAt": 1785056800000}]},
    ),
    "session.export": (
        {"sessionId": "s_4f2a", "format": "md"},
        {"format": "md", "content": "# Refactor the parser\n\n**User** ...", "bytes": 4120, "messages": 12,
         "compactions": 1, "environments": 0, "redactions": 2, "thinkingOmitted": 3},
    ),
}

EVENT_EXAMPLES: dict[str, dict[str, Any]] = {
    "session.created": {"session": _SESSION},
    "session.updated": {"session": _SESSION},
    "session.deleted": {"sessionId": "s_4f2a"},
    "session.message": {"message": _MESSAGE_REF, "replaced": False,
                        "record": {"type": "message", **_ASSISTANT_MESSAGE}},
    "session.queue": {"sessionId": "s_4f2a", "entries": [_ENTRY], "held": False},
    "notification.created": {"notification": _NOTIFICATION},
    "turn.started": {"turn": _TURN},
    "turn.ended": {"turn": _ENDED_TURN, "notification": _NOTIFICATION},
    "task.due": {"taskId": "task_7c1e", "runId": "run_01", "title": "Weekly digest",
                 "prompt": "Summarize this week's commits", "mode": "agent", "projectId": 3,
                 "providerId": "anthropic", "modelId": "claude-sonnet", "permissionMode": "ask",
                 "thinkingLevel": "off", "workspacePath": "/home/ada/src/parser", "scheduledFor": 1785133800000,
                 "startedAt": 1785133800000},
    "plan.requested": {"approval": EXAMPLES["plans.submit"][1]},
    "plan.resolved": {"requestId": "plan_5e0d", "sessionId": "s_4f2a", "status": "approved"},
    "plan.execution": {"approval": {**_PLAN_APPROVED, "executionState": "running", "executionTurnId": "t_11",
                                    "executionStartedAt": 1785056800000, "updatedAt": 1785056800000}},
    "session.inflight": _INFLIGHT,
    "approval.requested": {"request": _APPROVAL},
    "approval.resolved": {"request": _ALLOWED, "rule": _RULE},
    "interaction.requested": {"request": _INTERACTION},
    "interaction.resolved": {"request": _ANSWERED},
    "collab.delivery": {"delivery": _DELIVERY_RUNNING},
    "settings.changed": {"ns": "app", "keys": ["largePasteThreshold"]},
    "providers.changed": {"providerIds": ["openrouter"]},
    "models.changed": {"providerId": "openrouter"},
    "import.progress": {"importId": "imp-1", "source": "claude-code", "root": "/home/ada/.claude/projects",
                        "dryRun": False, "done": 1, "total": 2, "counts": {**_IMPORT_COUNTS, "refused": 0},
                        "messages": 96, "newMessages": 96, "hiddenOffBranch": 0, "restoredOnBranch": 0,
                        "unknownKinds": {"world_state": 3}, "unreadLines": 0, "repairedLines": 0,
                        "sourceBytes": 480100, "totalBytes": 482113,
                        "sessionId": "cc-1d4e8f0a2b3c5d6e7f8091a2b3c4d5e6", "status": "new", "finished": False},
}


# ---------------------------------------------------------------------------
# CLI


def outputs() -> dict[Path, str]:
    """Every generated file and its expected content."""
    doc = build_schema()
    readme = README_PATH.read_text(encoding="utf-8")
    return {
        SCHEMA_PATH: render_schema(doc),
        README_PATH: splice_readme(readme, render_reference(doc)),
    }


def _stale(expected: Mapping[Path, str]) -> Iterable[Path]:
    for path, text in expected.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            yield path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    args = parser.parse_args(argv)
    expected = outputs()
    stale = list(_stale(expected))
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run scripts/export_schema.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(expected[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
