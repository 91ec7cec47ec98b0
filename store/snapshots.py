"""Run environment snapshots (seed 000 §4): canonical form, digest, bounds, secret check.

A snapshot freezes what a turn ran with (connection, model, parameters, system
prompt, skills, tool schemas, bindings, permission policy, browser submission context,
capabilities). It is
stored as canonical JSON (sorted keys, orjson, UTF-8) with its SHA-256 digest
and byte size, and verified on every read: an unknown version, a digest or
size mismatch, or an oversized/too-deep structure is ``CORRUPT_DATA``.

Secrets are never stored: only credential *references*. A key that names a
secret (``apiKey``, ``password``, ``token`` ...) holding a non-empty string is
refused with ``INVALID_PARAMS`` before anything is written. Tool schemas,
skills and the system prompt are not scanned (descriptions and instructions:
a schema may legitimately describe a ``password`` field). Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from store.errors import Conflict, CorruptData, InvalidInput, NotFound, PayloadTooLarge
from store.rules import find_credential, is_credential_name

SNAPSHOT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({SNAPSHOT_VERSION})
MAX_SNAPSHOT_BYTES = 1024 * 1024
MAX_SNAPSHOT_DEPTH = 32
# The limit applies to the snapshot as the client sent it (protocol/README §7: "1 MiB of canonical
# JSON"); the stored form also holds the sections the client left out, filled with their empty
# defaults (``"skills":[]``, ``"browserSubmissionContext":{}`` ...: about 200 bytes). A stored
# record may exceed the limit by that much and no more.
DEFAULT_SECTIONS_SLACK_BYTES = 1024
MAX_STORED_SNAPSHOT_BYTES = MAX_SNAPSHOT_BYTES + DEFAULT_SECTIONS_SLACK_BYTES

# A key names a secret when, lower-cased without "-"/"_", it equals one of these or
# ends with one (``X-Api-Key``, ``OPENAI_API_KEY``, ``client_secret``) ...
SECRET_SUFFIXES: tuple[str, ...] = (
    "apikey", "password", "passwd", "secret", "accesstoken", "refreshtoken", "authtoken", "idtoken",
    "sessiontoken", "bearertoken", "privatekey", "secretkey", "bearer",
)
SECRET_KEYS: frozenset[str] = frozenset({*SECRET_SUFFIXES, "token", "authorization", "cookie"})
# ... and, where credentials would end up (endpoint and execution bindings), any
# key ending in "token" (``GITHUB_TOKEN``); elsewhere "token" must match exactly
# (``eosToken: "</s>"`` is a sampling parameter, not a credential).
CREDENTIAL_SECTIONS = frozenset({"connection", "executionBindings"})
# Sections whose content is descriptive (schemas, instructions), not configuration.
UNSCANNED_SECTIONS = frozenset({"toolSchemas", "skills", "systemPrompt"})


@dataclass(frozen=True)
class PreparedSnapshot:
    version: int
    digest: str
    json_text: str
    size: int


def canonical_bytes(snapshot: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(snapshot, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise InvalidInput(f"environment snapshot is not JSON-serialisable: {exc}",
                           data={"field": "environment"}) from None


def depth_of(value: Any, limit: int = MAX_SNAPSHOT_DEPTH + 1) -> int:
    """Nesting depth of a JSON value (a scalar is 0), capped at ``limit`` (iterative)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest >= limit:
            return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def is_secret_key(key: str, *, credential_section: bool) -> bool:
    return is_credential_name(key, credential_section=credential_section)


def find_secret_detail(snapshot: Mapping[str, Any]) -> str | None:
    """``"<path>: <why>"`` of the first value that looks like a credential (by its name or its shape)."""
    for key, value in snapshot.items():
        if key in UNSCANNED_SECTIONS:
            continue
        found = find_credential(value, key, credential_section=key in CREDENTIAL_SECTIONS)
        if found is not None:
            return found
    return None


def find_secret(snapshot: Mapping[str, Any]) -> str | None:
    """Path of the first value that looks like a credential, else None."""
    found = find_secret_detail(snapshot)
    return None if found is None else found.partition(": ")[0]


def prepare_snapshot(snapshot: Mapping[str, Any], *, max_bytes: int = MAX_SNAPSHOT_BYTES,
                     sent: Mapping[str, Any] | None = None) -> PreparedSnapshot:
    """Validate a snapshot and produce its stored form (canonical JSON + SHA-256). ``sent`` is the snapshot
    as the client gave it (without the sections filled with defaults): the size limit measures that, so a
    snapshot of exactly ``max_bytes`` is accepted whatever it leaves out."""
    if not isinstance(snapshot, Mapping):
        raise InvalidInput("environment must be an object", data={"field": "environment"})
    version = snapshot.get("version")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise InvalidInput(
            f"environment.version {version!r} is not supported (supported: {sorted(SUPPORTED_VERSIONS)})",
            data={"field": "environment.version"},
        )
    if depth_of(snapshot) > MAX_SNAPSHOT_DEPTH:
        raise InvalidInput(f"environment is nested deeper than {MAX_SNAPSHOT_DEPTH} levels",
                           data={"field": "environment"})
    secret = find_secret_detail(snapshot)
    if secret is not None:
        where, _, why = secret.partition(": ")
        raise InvalidInput(
            f"environment.{where} looks like a secret value ({why}): store a credential reference "
            "(credentialRefs) instead",
            data={"field": f"environment.{where}"},
        )
    body = canonical_bytes(snapshot)
    measured = len(body) if sent is None else len(canonical_bytes(sent))
    if measured > max_bytes or len(body) > max_bytes + DEFAULT_SECTIONS_SLACK_BYTES:
        raise PayloadTooLarge(
            f"environment snapshot is {measured} bytes; the limit is {max_bytes}",
            data={"field": "environment", "size": measured, "limit": max_bytes},
        )
    return PreparedSnapshot(int(version), hashlib.sha256(body).hexdigest(), body.decode(), len(body))


def verify_snapshot(
    version: int, digest: str, json_text: str, size: int, *, max_bytes: int = MAX_STORED_SNAPSHOT_BYTES
) -> dict[str, Any]:
    """Check a stored snapshot; return it parsed. Any mismatch raises ``CorruptData``."""
    if version not in SUPPORTED_VERSIONS:
        raise CorruptData(f"stored environment snapshot has unknown version {version!r}",
                          data={"version": version})
    body = json_text.encode()
    if len(body) != size or size > max_bytes:
        raise CorruptData(
            f"stored environment snapshot size {len(body)} does not match its record ({size}) "
            f"or exceeds {max_bytes} bytes",
            data={"size": len(body), "recorded": size},
        )
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest:
        raise CorruptData("stored environment snapshot failed its SHA-256 digest check",
                          data={"expected": digest, "actual": actual})
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CorruptData(f"stored environment snapshot is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or value.get("version") != version:
        raise CorruptData("stored environment snapshot does not carry its recorded version")
    if depth_of(value) > MAX_SNAPSHOT_DEPTH:
        raise CorruptData(f"stored environment snapshot is nested deeper than {MAX_SNAPSHOT_DEPTH} levels")
    return value


# ---------------------------------------------------------------------------
# SQL (runs inside the caller's transaction)


def store_snapshot(conn: sqlite3.Connection, turn_id: str, snap: PreparedSnapshot, now_ms: int) -> None:
    conn.execute(
        "INSERT INTO run_snapshots(turn_id, version, digest, snapshot_json, size_bytes, created_at) "
        "VALUES (?,?,?,?,?,?)",
        (turn_id, snap.version, snap.digest, snap.json_text, snap.size, now_ms),
    )


def load_snapshot(conn: sqlite3.Connection, turn_id: str) -> dict[str, Any]:
    """``{"version", "digest", "snapshot"}`` (+ ``"input"`` when bound) for a turn, verified; NOT_FOUND
    when absent, CORRUPT_DATA when the snapshot or its input fails its digest."""
    row = conn.execute(
        "SELECT version, digest, snapshot_json, size_bytes, input_json, input_digest FROM run_snapshots "
        "WHERE turn_id = ?", (turn_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"turn {turn_id} has no stored environment snapshot", data={"turnId": turn_id})
    version, digest, text, size, input_text, input_digest = row
    snapshot = verify_snapshot(version, digest, text, size)
    out: dict[str, Any] = {"version": version, "digest": digest, "snapshot": snapshot}
    if input_text is not None or input_digest is not None:
        out["input"] = {**verify_input(input_text, input_digest), "digest": input_digest}
    return out


# ---------------------------------------------------------------------------
# The turn's normalized input, bound to its snapshot (seed 000 §4)
#
#   "Before execution, runTurn stores normalized input and a versioned RunEnvironmentSnapshot with a
#    SHA-256 integrity digest. ... Recovery rejects invalid versions, digest mismatch, binding drift,
#    or oversized structure"
#
# The input is the message the turn runs on, normalized to ``{"messageId", "blocks"}`` (canonical JSON,
# sorted keys) and stored beside the snapshot with its own SHA-256. Recovery checks it twice: the stored
# input against its digest (CORRUPT_DATA), and the transcript's message of that id, when it is there,
# against the stored input (a different message is binding drift: the snapshot is not reused for it).


@dataclass(frozen=True)
class PreparedInput:
    message_id: str
    digest: str
    json_text: str


def normalized_input(message_id: str, blocks: Any) -> dict[str, Any]:
    return {"messageId": message_id, "blocks": blocks}


def prepare_input(message_id: str, blocks: Any, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> PreparedInput:
    """The stored form of a turn's input (bounded like a snapshot)."""
    if not isinstance(blocks, list):
        raise InvalidInput("input.blocks must be a list", data={"field": "input.blocks"})
    value = normalized_input(message_id, blocks)
    if depth_of(value) > MAX_SNAPSHOT_DEPTH:
        raise InvalidInput(f"input is nested deeper than {MAX_SNAPSHOT_DEPTH} levels", data={"field": "input"})
    body = canonical_bytes(value)
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"turn input is {len(body)} bytes; the limit is {max_bytes}",
                              data={"field": "input", "size": len(body), "limit": max_bytes})
    return PreparedInput(message_id, hashlib.sha256(body).hexdigest(), body.decode())


def input_digest_of(message_id: str, record: Mapping[str, Any]) -> str:
    """The digest a transcript message has as the input ``message_id`` (its blocks, normalized)."""
    return hashlib.sha256(canonical_bytes(normalized_input(message_id, record.get("blocks")))).hexdigest()


def verify_input(json_text: str | None, digest: str | None) -> dict[str, Any]:
    """A stored input, checked against its digest; CORRUPT_DATA on any mismatch."""
    if not isinstance(json_text, str) or not isinstance(digest, str):
        raise CorruptData("stored turn input is incomplete (input or digest missing)")
    body = json_text.encode()
    if len(body) > MAX_SNAPSHOT_BYTES or hashlib.sha256(body).hexdigest() != digest:
        raise CorruptData("stored turn input failed its SHA-256 digest check", data={"expected": digest})
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise CorruptData(f"stored turn input is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("messageId"), str) \
            or not isinstance(value.get("blocks"), list):
        raise CorruptData("stored turn input is not a {messageId, blocks} object")
    return value


def bind_input(conn: sqlite3.Connection, turn_id: str, prepared: PreparedInput) -> None:
    """Store the input beside the turn's snapshot (once: another input for the same turn is CONFLICT)."""
    row = conn.execute("SELECT input_digest FROM run_snapshots WHERE turn_id = ?", (turn_id,)).fetchone()
    if row is None:
        raise InvalidInput(f"turn {turn_id} has no environment snapshot to bind an input to",
                           data={"field": "input", "turnId": turn_id})
    if row[0] is not None:
        if row[0] != prepared.digest:
            raise Conflict(f"turn {turn_id} is already bound to another input",
                           data={"turnId": turn_id, "field": "input"})
        return
    conn.execute("UPDATE run_snapshots SET input_json = ?, input_digest = ? WHERE turn_id = ?",
                 (prepared.json_text, prepared.digest, turn_id))
