"""What an imported session's origin row says about its history, projected onto session rows.

The ``session_import_origins`` row (seed 003 §4.5) keeps what the source knew of the session as
history JSON; three parts of it are served with the session (``session.list``, ``session.get``):

* ``historyModel`` — the provider/model the imported history named last (a tool import's messages,
  or what a plugin sent as ``history``). It is shown, never bound: the session's own
  ``providerId``/``modelId`` stay what the host set (a host tool import binds the history's model
  there too; a plugin import never does, §4.5).
* ``historyGit`` — the git state the source recorded with the session (Claude Code's ``gitBranch`` on every
  line: the branch last seen, and every branch in order when it changed; Codex's ``session_meta.git``: branch,
  commit, repository URL). History, like ``historyModel``: the project's checkout may be elsewhere now.
* ``spawnedBy`` — for a child thread/session a tool spawned (Codex ``spawn_agent``, opencode
  ``task``): the parent's host session id (a pure function of the parent's external id, so it is
  right whichever of the two was imported first), the spawning tool call's id when the source
  records it (the ``toolCallId`` of the parent's tool call block) and the agent's name. The parent's
  tool call record carries ``meta.childSessionId``, the way back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from store.indexing.sql_lists import in_chunks

SPAWN_KEYS = ("sessionId", "toolCallId", "agentName")
GIT_KEYS = ("branch", "commit", "repositoryUrl")


def origin_row(conn: sqlite3.Connection, session_id: str) -> dict[str, Any] | None:
    """A session's ``session_import_origins`` row, its history JSON as a dict (``{}`` when unreadable)."""
    row = conn.execute(
        "SELECT plugin_id, source_id, external_id, source_label, origin_json, created_at "
        "FROM session_import_origins WHERE session_id = ?", (session_id,)).fetchone()
    if row is None:
        return None
    try:
        origin = orjson.loads(row[4]) if row[4] else {}
    except orjson.JSONDecodeError:
        origin = {}
    return {"pluginId": row[0], "sourceId": row[1], "externalId": row[2], "label": row[3],
            "origin": origin if isinstance(origin, dict) else {}, "createdAt": row[5]}


def project(origin: Mapping[str, Any]) -> dict[str, Any]:
    """The session-row fields an origin's history JSON yields (none when it names nothing)."""
    out: dict[str, Any] = {}
    model = origin.get("modelId")
    if isinstance(model, str) and model:
        hist: dict[str, str] = {"modelId": model}
        provider = origin.get("providerId")
        if isinstance(provider, str) and provider:
            hist["providerId"] = provider
        out["historyModel"] = hist
    git = origin.get("git")
    if isinstance(git, Mapping):
        kept: dict[str, Any] = {k: git[k] for k in GIT_KEYS if isinstance(git.get(k), str) and git[k]}
        branches = git.get("branches")
        if isinstance(branches, list) and all(isinstance(b, str) for b in branches) and len(branches) > 1:
            kept["branches"] = list(branches)
        if kept:
            out["historyGit"] = kept
    spawn = origin.get("spawnedBy")
    if isinstance(spawn, Mapping) and isinstance(spawn.get("sessionId"), str):
        out["spawnedBy"] = {k: spawn[k] for k in SPAWN_KEYS if isinstance(spawn.get(k), str) and spawn[k]}
    return out


def attach(conn: sqlite3.Connection, rows: Iterable[dict[str, Any]]) -> None:
    """Set ``historyModel`` / ``historyGit`` / ``spawnedBy`` on the imported ones of ``rows`` (in place)."""
    by_id = {r["id"]: r for r in rows if r.get("source")}
    for marks, chunk in in_chunks(list(by_id)):
        for sid, origin_json in conn.execute(
                f"SELECT session_id, origin_json FROM session_import_origins WHERE session_id IN ({marks})", chunk):
            try:
                origin = orjson.loads(origin_json) if origin_json else {}
            except orjson.JSONDecodeError:
                continue  # a damaged history shows nothing rather than failing the listing
            if isinstance(origin, dict):
                by_id[sid].update(project(origin))
