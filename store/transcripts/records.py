"""Transcript message records: normalisation, derived index fields, projections.

A *record* is the dict written as one ``message`` line (docs/DESIGN.md). This
module decides what the index derives from it (final-answer text without
thinking, promoted tool name / error flag, timestamps) and how a record is
projected onto the wire. Pure functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from store.errors import InvalidInput
from store.ids import validate_wire_id
from store.jsonio import now_rfc3339
from store.rules import MAX_BLOCKS_PER_MESSAGE, canonical_project_path

ROLES = ("user", "assistant", "tool", "system")


ms_to_rfc3339 = now_rfc3339
"""Unix ms → the RFC 3339 spelling transcript files use (one implementation: store.jsonio)."""


def rfc3339_to_ms(value: object, default: int) -> int:
    ms = rfc3339_ms(value)
    return default if ms is None else ms


def rfc3339_ms(value: object) -> int | None:
    """Unix ms of an RFC 3339 time, None when ``value`` is not one (:func:`rfc3339_to_ms` without its
    default: a caller needing the time under two defaults parses it once)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        text = value[:-1] + "+00:00" if value.endswith("Z") else value
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def normalize_message(raw: Mapping[str, Any], *, now_ms: int, turn_id: str | None = None) -> dict[str, Any]:
    """Build the canonical transcript record for an incoming message.

    Keeps every key the client sent (lossless, open block vocabulary) but puts
    ``type`` and ``id`` first and fills ``createdAt`` when missing.
    """
    if not isinstance(raw, Mapping):
        raise InvalidInput("message must be an object")
    msg_id = validate_wire_id(raw.get("id"), "message.id")
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidInput(f"message.role must be one of {', '.join(ROLES)}", data={"field": "message.role"})
    blocks = raw.get("blocks")
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS_PER_MESSAGE:
        raise InvalidInput(f"message.blocks must be a list of at most {MAX_BLOCKS_PER_MESSAGE} blocks",
                           data={"field": "message.blocks"})
    for i, block in enumerate(blocks):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise InvalidInput(f"message.blocks[{i}] must be an object with a string 'type'",
                               data={"field": f"message.blocks[{i}]"})
    meta = raw.get("meta")
    if meta is not None and not isinstance(meta, Mapping):
        raise InvalidInput("message.meta must be an object", data={"field": "message.meta"})
    return message_record(raw, msg_id, now_ms=now_ms, turn_id=turn_id)


def message_record(fields: Mapping[str, Any], msg_id: str, *, now_ms: int,
                   turn_id: str | None = None) -> dict[str, Any]:
    """The canonical record of a message whose fields are valid already (:func:`normalize_message`
    checked them, or the protocol model they were dumped from did: an append is validated once).

    ``type`` and ``id`` first, then every other key as sent; ``createdAt`` filled when missing.
    """
    record: dict[str, Any] = {"type": "message", "id": msg_id}
    for key, value in fields.items():
        if key in ("type", "id"):
            continue
        record[key] = value
    if not isinstance(record.get("createdAt"), str):
        record["createdAt"] = ms_to_rfc3339(now_ms)
    if turn_id is not None and "turnId" not in record:
        record["turnId"] = turn_id
    return record


NUL_STAND_IN = "\ufffd"
"""What a NUL becomes in the derived search text: SQLite's trigram tokenizer and LIKE stop reading a
value at a NUL, so text after one would never be found. Queries never hold a NUL (refused), so only a
query holding U+FFFD itself matches the stand-in; search checks such a match against the message's line
(``store/search/stand_in.py``). The transcript keeps the NUL."""


def searchable(text: str) -> str:
    """``text`` as the index stores it for search (a NUL replaced by :data:`NUL_STAND_IN`)."""
    return text.replace("\x00", NUL_STAND_IN) if "\x00" in text else text


def blocks_of(record: Mapping[str, Any]) -> list[Any]:
    """The record's blocks: its ``blocks`` list, none when that is missing or not a list (a line damaged or
    written behind the host's back: a number there is not iterable, a string would iterate its characters)."""
    blocks = record.get("blocks")
    return blocks if isinstance(blocks, list) else []


def extract_text(record: Mapping[str, Any]) -> str | None:
    """Final answer text for search/preview: text blocks only, never thinking; None for tools.
    As the index stores it (:func:`searchable`)."""
    text = answer_text(record)
    return None if text is None else searchable(text)


def answer_text(record: Mapping[str, Any]) -> str | None:
    """:func:`extract_text` as the message holds it: a NUL kept (what search checks a query holding
    :data:`NUL_STAND_IN` against, ``store/search/stand_in.py``)."""
    if record.get("role") == "tool":
        return None
    parts: list[str] = []
    for block in blocks_of(record):
        if isinstance(block, Mapping) and block.get("type") == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                parts.append(text)
    if not parts:
        return None
    return "\n".join(parts)


def tool_info(record: Mapping[str, Any]) -> tuple[str | None, bool]:
    """Promoted ``tool_name`` and ``is_error`` for the index row."""
    name = record.get("toolName") if isinstance(record.get("toolName"), str) else None
    is_error = False
    for block in blocks_of(record):
        if isinstance(block, Mapping) and block.get("type") == "tool_call":
            if name is None and isinstance(block.get("name"), str):
                name = block["name"]
            if block.get("status") in ("error", "denied") or block.get("isError") is True:
                is_error = True
    meta = record.get("meta")
    if isinstance(meta, Mapping) and meta.get("isError") is True:
        is_error = True
    return name, is_error


# -- the project root a line was written under (seed 003 §4.10: artifact paths are workspace-resolved) ----


@dataclass(frozen=True, slots=True)
class Root:
    """The session's project root where a line stands in its transcript (``path`` None: it had none then).

    The rule, one for the live index and a rebuild: a line was written under the ``projectPath`` of the
    nearest ``session_info`` line before it that names one (:func:`root_named`). A line no such line
    precedes (a file written before rewrites kept them, an import's lines) has no ``Root``: it resolves
    against the session's root as the index holds it when the line is indexed. A rewrite writes a
    ``session_info`` line naming the root before each kept line whose root differs from the line before it
    (``store.transcripts.rewrite.plan_rewrite``), so the rule gives every line the root it was written under
    whatever rewrites came after."""

    path: str | None


def root_named(info: Mapping[str, Any]) -> Root | None:
    """The root a ``session_info`` record sets for the lines after it; None when it names no ``projectPath``."""
    if "projectPath" not in info:
        return None
    path = info["projectPath"]
    folded = canonical_project_path(path) if isinstance(path, str) else ""
    return Root(folded or None)


def root_line(root: Root) -> dict[str, Any]:
    """The ``session_info`` record a rewrite writes to set ``root`` for the lines after it (nothing else)."""
    return {"type": "session_info", "projectPath": root.path}


def meta_of(record: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = record.get("meta")
    return meta if isinstance(meta, Mapping) else {}


def receipt_of(record: Mapping[str, Any]) -> Mapping[str, Any] | None:
    receipt = meta_of(record).get("receipt")
    return receipt if isinstance(receipt, Mapping) else None


def is_streaming(record: Mapping[str, Any]) -> bool:
    return meta_of(record).get("status") == "streaming"


def awaits_final(record: Mapping[str, Any]) -> bool:
    """A line that the terminal assistant append of its id replaces (seed 003 §5: the narrow
    exception to idempotent replay): a streaming reservation, or a reply promoted from its in-flight
    checkpoint (``meta.recoveredFrom``: what had streamed when the host stopped; the sidecar's final
    append, arriving after the restart, carries the whole reply and must not be dropped)."""
    if record.get("role") != "assistant":
        return False  # only a reply streams: a user's or a tool's line is settled whatever its meta says
    meta = meta_of(record)
    return meta.get("status") == "streaming" or meta.get("recoveredFrom") == "inflight"


def with_receipt(record: dict[str, Any], receipt: Mapping[str, Any]) -> dict[str, Any]:
    meta = dict(meta_of(record))
    meta["receipt"] = dict(receipt)
    out = dict(record)
    out["meta"] = meta
    return out


def with_internal_meta(record: dict[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (a client's new version of a line, as ``session.replaceMessages`` sends it) with the
    host-only meta (:data:`INTERNAL_META`) the line it replaces holds: the client never sees it (it is not on
    the wire, and a client cannot set it), so a rewrite from the client's records would drop it otherwise. A
    line's receipt, and a collaboration input's deliver answer, stay as durable as the line."""
    kept = {k: v for k, v in meta_of(before).items() if k in INTERNAL_META and k not in meta_of(record)}
    if not kept:
        return record
    out = dict(record)
    out["meta"] = {**meta_of(record), **kept}
    return out


def _projected(meta: Any) -> tuple[bool, bool]:
    """What :func:`wire_record` lifts out of ``meta`` to the top level: (provenance, steering)."""
    if not isinstance(meta, Mapping):
        return False, False
    return isinstance(meta.get("sessionMessage"), Mapping), meta.get("steering") is True


def projects_new_keys(record: Mapping[str, Any]) -> bool:
    """Whether :func:`wire_record` of ``record`` holds a top-level key ``record`` has not (it lifts
    provenance or steering out of ``meta``), told without building the projection."""
    provenance, steering = _projected(record.get("meta"))
    return (provenance and "sessionMessage" not in record) or (steering and "steering" not in record)


INTERNAL_META: Final = ("receipt", "collabDelivered")
"""``meta`` keys only the host reads: a receipt, and a collaboration input's deliver answer
(``store.collab.DELIVERED_META``)."""


def wire_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as clients see it: the internal receipt (and deliver answer) is stripped from meta; collaboration
    provenance (``meta.sessionMessage``, host-written) is projected as ``sessionMessage`` and an
    accepted steering input (``meta.steering: true``) as ``steering`` (seed 003, active-turn steering)."""
    out = dict(record)
    meta: Any = record.get("meta")
    provenance, steering = _projected(meta)
    if provenance:
        out["sessionMessage"] = dict(meta["sessionMessage"])
    if steering:
        out["steering"] = True
    if isinstance(meta, Mapping) and any(k in meta for k in INTERNAL_META):
        stripped = {k: v for k, v in meta.items() if k not in INTERNAL_META}
        if stripped:
            out["meta"] = stripped
        else:
            out.pop("meta", None)
    return out


_CAPPED_VALUES = ("args", "result")
"""A tool call's input and output: a string, or any JSON value (a structured tool result)."""


def _cut_value(value: Any, limit: int) -> str | None:
    """``value`` cut to ``limit`` characters, or None when it fits. A structured value is measured
    and cut as its compact JSON text (the cut is that text's prefix: a string)."""
    if isinstance(value, str):
        return value[:limit] if len(value) > limit else None
    if isinstance(value, bool | int | float):
        return None
    try:
        encoded = orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # an integer wider than 64 bits, say: the stdlib encoder takes any
        encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return encoded[:limit] if len(encoded) > limit else None


def cap_content(record: dict[str, Any], content_limit: int | None, *, selected: bool = False) -> dict[str, Any]:
    """Apply the display cap to a wire projection (never to the file). ``selected``: the explicitly
    selected user/assistant message (``messageAround``'s target), whose text blocks alone bypass the cap
    (seed 003 §5: "Only the explicitly selected user/assistant text bypasses the display cap"): its
    thinking and tool call args/results are capped like any other message's."""
    if selected and record.get("role") not in ("user", "assistant"):
        selected = False
    if not content_limit:
        return record
    blocks = record.get("blocks")
    if not isinstance(blocks, list):
        return record
    capped: list[Any] = []
    changed = False
    for block in blocks:
        if isinstance(block, dict):
            text = None if selected and block.get("type") == "text" else block.get("text")
            if isinstance(text, str) and len(text) > content_limit:
                block = dict(block)
                block["text"] = text[:content_limit]
                block["truncated"] = True
                block["fullLength"] = len(text)
                changed = True
            for field in _CAPPED_VALUES:
                value = block.get(field)
                cut = _cut_value(value, content_limit) if value is not None else None
                if cut is not None:
                    block = dict(block)
                    block[field] = cut
                    block["truncated"] = True
                    changed = True
        capped.append(block)
    if not changed:
        return record
    out = dict(record)
    out["blocks"] = capped
    out["truncated"] = True  # README §6: "A message that was cut has truncated: true" (its blocks say which)
    return out
