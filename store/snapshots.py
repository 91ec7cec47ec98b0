"""Run environment snapshots (seed 000 §4): canonical form, digest, bounds, secret check.

A snapshot freezes what a turn ran with (connection, model, parameters, system
prompt, skills, tool schemas, bindings, permission policy, capabilities). It is
stored as canonical JSON (sorted keys, orjson, UTF-8) with its SHA-256 digest
and byte size, and verified on every read: an unknown version, a digest or
size mismatch, or an oversized/too-deep structure is ``CORRUPT_DATA``.

Secrets are never stored: only credential *references*. A key that names a
secret (``apiKey``, ``password``, ``token`` ...) holding a non-empty string is
refused with ``INVALID_PARAMS`` before anything is written. Tool schemas and
skills are not scanned (a schema may legitimately describe a ``password``
field). Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from store.errors import CorruptData, InvalidInput, NotFound, PayloadTooLarge
from store.rules import find_credential, is_credential_name

SNAPSHOT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({SNAPSHOT_VERSION})
MAX_SNAPSHOT_BYTES = 1024 * 1024
MAX_SNAPSHOT_DEPTH = 32

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


def prepare_snapshot(snapshot: Mapping[str, Any], *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> PreparedSnapshot:
    """Validate a snapshot and produce its stored form (canonical JSON + SHA-256)."""
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
    if len(body) > max_bytes:
        raise PayloadTooLarge(
            f"environment snapshot is {len(body)} bytes; the limit is {max_bytes}",
            data={"field": "environment", "size": len(body), "limit": max_bytes},
        )
    return PreparedSnapshot(int(version), hashlib.sha256(body).hexdigest(), body.decode(), len(body))


def verify_snapshot(
    version: int, digest: str, json_text: str, size: int, *, max_bytes: int = MAX_SNAPSHOT_BYTES
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
    """``{"version", "digest", "snapshot"}`` for a turn, verified; NOT_FOUND when absent."""
    row = conn.execute(
        "SELECT version, digest, snapshot_json, size_bytes FROM run_snapshots WHERE turn_id = ?", (turn_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"turn {turn_id} has no stored environment snapshot", data={"turnId": turn_id})
    version, digest, text, size = row
    snapshot = verify_snapshot(version, digest, text, size)
    return {"version": version, "digest": digest, "snapshot": snapshot}
