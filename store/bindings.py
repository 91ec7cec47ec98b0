"""Run environment binding checks (seed 000 §4): may a turn's snapshot still be recovered?

Recovery (a sidecar resuming or re-running a turn from its stored
``RunEnvironmentSnapshot``) must run against the same world the snapshot
froze. :func:`drift` compares the snapshot's *bindings* with the current state:

* ``connection`` against the provider row it names (``providers``), or,
  when it names none, the turn's own provider (``session.startTurn``'s
  ``providerId``) while the host holds it: ``providerId``, ``baseUrl``,
  ``type``, ``protocol``, ``apiStyle``, ``credentialRef`` (the provider's
  ``secret_ref``) — only the keys the snapshot holds; a provider the
  connection names that is gone is drift;
* ``executionBindings`` against the session row: ``sessionId``,
  ``projectPath`` (normalized), ``providerId``, ``modelId``, ``mode``,
  ``permissionMode``;
* the turn's input (when the snapshot is bound to one): the transcript's
  message of that id must be the stored normalized input;
* every ``credentialRefs`` entry must still exist as a reference
  (``secrets_meta``). A secret *rotated* behind the same reference (a new
  value, a new version) is not drift: only references are compared, never
  values (the snapshot never holds one).

Pure comparison plus the SQL that gathers the current state.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Final

from store.errors import NotFound, StoreError
from store.indexing.index import normalize_project_path, require_session
from store.snapshots import input_digest_of, load_snapshot

__all__ = ["EnvironmentDrift", "drift", "verify"]

_PROVIDER_KEYS: Final = {"baseUrl": "base_url", "type": "type", "protocol": "protocol", "apiStyle": "api_style",
                         "credentialRef": "secret_ref"}
_SESSION_KEYS: Final = ("sessionId", "projectPath", "providerId", "modelId", "mode", "permissionMode")


class EnvironmentDrift(StoreError):
    """The snapshot's bindings no longer match the provider or session: recovery is refused."""

    code = "ENVIRONMENT_DRIFT"


def _provider(conn: sqlite3.Connection, provider_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT id, base_url, type, protocol, api_style, secret_ref FROM providers WHERE id = ?",
                       (provider_id,)).fetchone()
    if row is None:
        return None
    return dict(zip(("id", "base_url", "type", "protocol", "api_style", "secret_ref"), row, strict=True))


def drift(snapshot: Mapping[str, Any], *, provider: Mapping[str, Any] | None, provider_id: str | None,
          session: Mapping[str, Any], refs_present: set[str]) -> list[dict[str, Any]]:
    """Every binding that differs: ``{field, snapshot, current}`` (pure)."""
    out: list[dict[str, Any]] = []

    def differs(field: str, want: Any, have: Any) -> None:
        if want != have:
            out.append({"field": field, "snapshot": want, "current": have})

    connection = snapshot.get("connection") or {}
    if isinstance(connection, Mapping) and connection:
        if provider_id is not None and provider is None:
            differs("connection.providerId", provider_id, None)
        elif provider is not None:
            for key, column in _PROVIDER_KEYS.items():
                if key in connection:
                    differs(f"connection.{key}", connection[key], provider.get(column))
    bindings = snapshot.get("executionBindings") or {}
    if isinstance(bindings, Mapping):
        current = {"sessionId": session.get("id"), "projectPath": session.get("projectPath"),
                   "providerId": session.get("providerId"), "modelId": session.get("modelId"),
                   "mode": session.get("mode"), "permissionMode": session.get("permissionMode")}
        for key in _SESSION_KEYS:
            if key not in bindings:
                continue
            want = bindings[key]
            if key == "projectPath" and isinstance(want, str):
                want = normalize_project_path(want)
            differs(f"executionBindings.{key}", want, current[key])
    for i, ref in enumerate(snapshot.get("credentialRefs") or ()):
        if ref not in refs_present:
            out.append({"field": f"credentialRefs[{i}]", "snapshot": ref, "current": None})
    return out


def verify(conn: sqlite3.Connection, session_id: str, turn_id: str,
           input_record: Callable[[str], Mapping[str, Any] | None] | None = None) -> dict[str, Any]:
    """The snapshot of ``turn_id`` (digest verified), checked against the current state; raises on drift.

    ``input_record(messageId)``: the transcript's message of that id (None when it is not there). When
    the snapshot is bound to an input (seed 000 §4 "stores normalized input ... Recovery rejects ...
    binding drift"), that message must be the stored input: another one is drift (``input``); a message
    not (yet) in the transcript is none (recovery runs on the stored input).
    """
    session = require_session(conn, session_id)
    turn = conn.execute("SELECT session_id, provider_id FROM turns WHERE id = ?", (turn_id,)).fetchone()
    if turn is None or turn[0] != session_id:
        raise NotFound(f"turn {turn_id} not found in session {session_id}", data={"turnId": turn_id})
    stored = load_snapshot(conn, turn_id)  # NOT_FOUND / CORRUPT_DATA (digest, version, size)
    snapshot = stored["snapshot"]
    connection = snapshot.get("connection") or {}
    provider_id = connection.get("providerId") if isinstance(connection, Mapping) else None
    provider = _provider(conn, provider_id) if isinstance(provider_id, str) else None
    if not isinstance(provider_id, str):
        # A connection that names no provider is the endpoint of the turn's own (``startTurn.providerId``, as
        # the reference sidecar and the README's example send it): it binds to that provider while the host
        # holds it. The turn's id is a loose reference (a provider the host never held binds nothing), so
        # its absence is not drift; a provider the connection names itself is.
        provider_id = None
        provider = _provider(conn, turn[1]) if isinstance(turn[1], str) else None
    refs = [r for r in snapshot.get("credentialRefs") or () if isinstance(r, str)]
    present = {r[0] for r in conn.execute(
        f"SELECT secret_ref FROM secrets_meta WHERE secret_ref IN ({','.join('?' * len(refs))})", refs)} if refs \
        else set()
    found = drift(snapshot, provider=provider, provider_id=provider_id, session=session, refs_present=present)
    bound = stored.get("input")
    if bound is not None and input_record is not None:
        rec = input_record(bound["messageId"])
        if rec is not None:
            actual = input_digest_of(bound["messageId"], rec)
            if actual != bound["digest"]:
                found.append({"field": "input", "snapshot": bound["digest"], "current": actual})
    if found:
        raise EnvironmentDrift(
            f"turn {turn_id}'s environment no longer matches: {', '.join(d['field'] for d in found)} changed",
            data={"turnId": turn_id, "drift": found})
    out = {"turnId": turn_id, "digest": stored["digest"], "version": stored["version"]}
    if bound is not None:
        out["inputDigest"] = bound["digest"]
    return out
