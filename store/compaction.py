"""Compaction checkpoint records: validation and normalisation (seed 003 §2.1, D203, ADR 0256).

A compaction line is a model-context checkpoint, not a message. This module
decides what a valid record looks like when it is appended, how a legacy record
is read, and which records stay valid against a set of message ids. Pure
functions, no I/O.

Rules kept here:

* ``throughMessageId`` is the durable boundary; a record whose boundary no
  longer exists is dropped, per record (:func:`still_valid`).
* ``retainedTail`` holds at most the latest user message for an active turn
  (``details.retainedTailMode = "active_turn"``) and nothing after a completed
  turn (``"completed_turn"``). A legacy record (no mode) is normalised to its
  latest user message. A tail message over the retention limit is stored in
  marked, truncated form (the transcript keeps the original).
* ``details.fallback`` may only be ``"retained_tail"`` (automatic compaction
  failed) and then carries a short recovery summary.
* ``details.retainedReasoning`` is a bounded list of prior thinking turns with
  text and thinking only (no tool-call pairs).
* Every other ``details`` key (generation, family, ...) is opaque and kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from store.errors import InvalidInput
from store.ids import validate_wire_id
from store.transcripts.records import ms_to_rfc3339

TAIL_MODES = ("active_turn", "completed_turn")
FALLBACK_VALUES = ("retained_tail",)
REASONING_BLOCK_TYPES = ("text", "thinking")


@dataclass(frozen=True)
class CompactionLimits:
    """Bounds applied when a checkpoint is appended (configuration, passed in)."""

    retained_text_chars: int = 64_000
    """Per text block of the retained tail message; longer text is truncated and marked."""
    reasoning_entries: int = 16
    """At most this many retainedReasoning turns are kept (the newest)."""
    reasoning_text_chars: int = 32_000
    """Per text/thinking block of a retainedReasoning entry."""
    fallback_summary_chars: int = 4_000
    """A fallback checkpoint's summary is a short recovery note."""
    summary_chars: int = 1_000_000


DEFAULT_LIMITS = CompactionLimits()


def _invalid(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, data={"field": field})


def _opt_id(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    return validate_wire_id(value, f"compaction.{key}")


def _truncate_blocks(blocks: Sequence[Any], limit: int, allowed: tuple[str, ...] | None) -> tuple[list[Any], bool]:
    out: list[Any] = []
    truncated = False
    for block in blocks:
        if not isinstance(block, Mapping):
            continue
        if allowed is not None and block.get("type") not in allowed:
            continue
        new = dict(block)
        text = new.get("text")
        if isinstance(text, str) and len(text) > limit:
            new["text"] = text[:limit]
            new["truncated"] = True
            new["fullLength"] = len(text)
            truncated = True
        out.append(new)
    return out, truncated


def _tail_message(raw: Any, limits: CompactionLimits, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _invalid(f"{where} must be a message object", where)
    if not isinstance(raw.get("id"), str):  # session.context hands each one on as a message: an id, a role
        raise _invalid(f"{where}.id is required: a retained message keeps its message id", f"{where}.id")
    validate_wire_id(raw["id"], f"{where}.id")
    if not isinstance(raw.get("role"), str) or not raw["role"]:
        raise _invalid(f"{where}.role is required", f"{where}.role")
    blocks = raw.get("blocks")
    if not isinstance(blocks, list):
        raise _invalid(f"{where}.blocks must be a list", f"{where}.blocks")
    kept, truncated = _truncate_blocks(blocks, limits.retained_text_chars, None)
    msg = dict(raw)
    msg["blocks"] = kept
    if truncated:
        meta = dict(msg["meta"]) if isinstance(msg.get("meta"), Mapping) else {}
        meta["retainedTruncated"] = True
        msg["meta"] = meta
    return msg


def _latest_user(tail: Sequence[Any]) -> list[Any]:
    for item in reversed(tail):
        if isinstance(item, Mapping) and item.get("role") == "user":
            return [item]
    return []


def _reasoning(raw: Any, limits: CompactionLimits) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _invalid("details.retainedReasoning must be a list", "compaction.details.retainedReasoning")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(raw):
        where = f"compaction.details.retainedReasoning[{i}]"
        if not isinstance(entry, Mapping):
            raise _invalid(f"{where} must be an object", where)
        if isinstance(entry.get("blocks"), list):
            blocks, _ = _truncate_blocks(entry["blocks"], limits.reasoning_text_chars, REASONING_BLOCK_TYPES)
            kept: dict[str, Any] = {"role": "assistant", "blocks": blocks}
            if isinstance(entry.get("id"), str):
                kept["id"] = entry["id"]
        else:
            kept = {}
            for key in ("text", "thinking"):
                value = entry.get(key)
                if value is None:
                    continue
                if not isinstance(value, str):
                    raise _invalid(f"{where}.{key} must be a string", f"{where}.{key}")
                kept[key] = value[: limits.reasoning_text_chars]
            if not kept:
                raise _invalid(f"{where} needs text, thinking or blocks", where)
        out.append(kept)
    return out[-limits.reasoning_entries :] if limits.reasoning_entries > 0 else []


def normalize_details(raw: Any, tail: list[Any], limits: CompactionLimits) -> tuple[dict[str, Any], list[Any]]:
    """Validate ``details`` and bound the tail by its mode. Returns (details, tail)."""
    if raw is None:
        details: dict[str, Any] = {}
    elif isinstance(raw, Mapping):
        details = dict(raw)
    else:
        raise _invalid("compaction.details must be an object", "compaction.details")
    mode = details.get("retainedTailMode")
    if mode is None:
        tail = _latest_user(tail)  # legacy: normalised to its latest user message
        details["retainedTailMode"] = "active_turn" if tail else "completed_turn"
    elif mode not in TAIL_MODES:
        raise _invalid(f"details.retainedTailMode must be one of {', '.join(TAIL_MODES)}",
                       "compaction.details.retainedTailMode")
    elif mode == "completed_turn" and tail:
        raise _invalid("a completed_turn checkpoint has an empty retainedTail", "compaction.retainedTail")
    elif mode == "active_turn":
        if len(tail) > 1:
            raise _invalid("an active_turn checkpoint retains at most the latest user message",
                           "compaction.retainedTail")
        if tail and (not isinstance(tail[0], Mapping) or tail[0].get("role") != "user"):
            raise _invalid("an active_turn retainedTail holds a user message", "compaction.retainedTail")
    fallback = details.get("fallback")
    if fallback is not None and fallback not in FALLBACK_VALUES:
        raise _invalid(f"details.fallback must be one of {', '.join(FALLBACK_VALUES)}",
                       "compaction.details.fallback")
    if "retainedReasoning" in details:
        details["retainedReasoning"] = _reasoning(details["retainedReasoning"], limits)
    return details, tail


def normalize_compaction(
    raw: object, *, now_ms: int, limits: CompactionLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """The canonical ``compaction`` line record for an incoming checkpoint.

    ``type`` first and ``id`` second; unknown top-level keys are kept (lossless).
    Raises :class:`InvalidInput` for anything the rules above refuse.
    """
    if not isinstance(raw, Mapping):
        raise _invalid("compaction must be an object", "compaction")
    cid = validate_wire_id(raw.get("id"), "compaction.id")
    through = validate_wire_id(raw.get("throughMessageId"), "compaction.throughMessageId")
    first_kept = _opt_id(raw, "firstKeptMessageId")
    summary = raw.get("summary")
    if not isinstance(summary, str):
        raise _invalid("compaction.summary must be a string", "compaction.summary")
    if len(summary) > limits.summary_chars:
        raise _invalid(f"compaction.summary is longer than {limits.summary_chars} characters", "compaction.summary")
    tokens = raw.get("tokensBefore", 0)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise _invalid("compaction.tokensBefore must be a non-negative integer", "compaction.tokensBefore")
    tail_raw = raw.get("retainedTail", [])
    if not isinstance(tail_raw, list):
        raise _invalid("compaction.retainedTail must be a list", "compaction.retainedTail")
    details, tail = normalize_details(raw.get("details"), list(tail_raw), limits)
    if details.get("fallback") is not None and len(summary) > limits.fallback_summary_chars:
        raise _invalid(
            f"a fallback checkpoint carries a short recovery summary (at most {limits.fallback_summary_chars} "
            "characters)", "compaction.summary")
    tail = [_tail_message(m, limits, f"compaction.retainedTail[{i}]") for i, m in enumerate(tail)]
    record: dict[str, Any] = {"type": "compaction", "id": cid, "summary": summary}
    if first_kept is not None:
        record["firstKeptMessageId"] = first_kept
    record["throughMessageId"] = through
    record["tokensBefore"] = tokens
    record["retainedTail"] = tail
    for key, value in raw.items():
        if key not in record and key not in ("type", "details") and value is not None:
            record[key] = value
    if not isinstance(record.get("createdAt"), str):
        record["createdAt"] = ms_to_rfc3339(now_ms)
    record["details"] = details
    return record


def normalize_on_read(record: Mapping[str, Any]) -> dict[str, Any]:
    """A stored record as readers return it: a legacy tail reduced to its latest user message, and a
    tail over the bound its mode names (a line the append rules never saw: another program's) read
    within it — a completed turn's empty, an active turn's at most its latest user message.

    Never raises: a stored record is shown as well as it can be, not refused.
    """
    out = dict(record)
    details = out.get("details")
    details = dict(details) if isinstance(details, Mapping) else {}
    raw = out.get("retainedTail")
    tail = list(raw) if isinstance(raw, list) else []
    mode = details.get("retainedTailMode")
    if mode not in TAIL_MODES:
        tail = _latest_user(tail)
        details["retainedTailMode"] = "active_turn" if tail else "completed_turn"
        out["retainedTail"] = tail
        out["details"] = details
    elif mode == "completed_turn" and tail:
        out["retainedTail"] = []
    elif mode == "active_turn" and tail and (latest := _latest_user(tail)) != tail:
        out["retainedTail"] = latest
    return out


def still_valid(record: Mapping[str, Any], message_ids: Iterable[str] | set[str]) -> bool:
    """A checkpoint is valid while its ``throughMessageId`` anchor exists."""
    ids = message_ids if isinstance(message_ids, (set, frozenset)) else set(message_ids)
    through = record.get("throughMessageId")
    return isinstance(through, str) and through in ids


def split_valid(
    records: Sequence[Mapping[str, Any]], message_ids: Iterable[str]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(kept, dropped), each in the given (file) order."""
    ids = set(message_ids)
    kept: list[Mapping[str, Any]] = []
    dropped: list[Mapping[str, Any]] = []
    for rec in records:
        (kept if still_valid(rec, ids) else dropped).append(rec)
    return kept, dropped


__all__ = [
    "CompactionLimits",
    "DEFAULT_LIMITS",
    "FALLBACK_VALUES",
    "TAIL_MODES",
    "normalize_compaction",
    "normalize_details",
    "normalize_on_read",
    "split_valid",
    "still_valid",
]
