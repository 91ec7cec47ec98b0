"""What an index rebuilt from the files gives back of an imported session beyond its messages.

An import (:mod:`store.interchange.import_write`, step 3) records, besides the index rows of the lines it
wrote, things it derives from those lines: a turn row per response (or checkpoint) whose usage the source
reported (``meta.usage`` with ``meta.usageRaw`` beside it; ``details`` on a checkpoint), also for the
responses of the branches it archived in the revisions file; the model the history named last (the origin
row's ``providerId``/``modelId``, served as ``historyModel``); and, for a host import, the session's own
``providerId``/``modelId`` (bound once, by the first import that names a model). All of it is in the
session's files, so a rebuilt index (a lost or corrupt database: the session's row is gone) derives it
again here, the way the import did, and the session reads as before the loss.

Only the lines an import wrote count: their ids are ``<sessionId>:<source id>``
(:func:`store.interchange.importers.common.join_id`). A turn a host ran in the session is database state
and is not rebuilt (its lines carry no ``usageRaw``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from store.indexing.index import CompactionRecord, IndexRecord
from store.interchange.import_write import (
    HOST_IMPORTER,
    carries_usage,
    named_model,
    record_compaction_usage,
    record_usage,
)
from store.revisions import RevisionFile

__all__ = ["restore_imported"]


def _imported(session_id: str, rec: Mapping[str, Any]) -> bool:
    rid = rec.get("id")
    return isinstance(rid, str) and rid.startswith(f"{session_id}:")


def _last_model(records: Iterable[Mapping[str, Any]]) -> tuple[str | None, str] | None:
    model: tuple[str | None, str] | None = None
    for rec in records:
        model = named_model(rec) or model
    return model


def restore_imported(conn: sqlite3.Connection, session_id: str, info: Mapping[str, Any] | None,
                     messages: Sequence[IndexRecord], compactions: Sequence[CompactionRecord],
                     archived: RevisionFile | None, *, first_import_end: int | None,
                     settings: Mapping[str, Any]) -> dict[str, int]:
    """Put back what the import derived from the lines of an imported session whose row a rebuild just
    inserted (its origin row restored from the ``importOrigin`` its ``session_info`` line carries).

    ``messages``/``compactions``: every such line of the transcript in file order (a replacement line
    after the line it replaces, as the imports wrote them); ``archived``: the revisions file;
    ``first_import_end``: the offset of the first import's ``session_info`` line (the first import's
    lines are those before it); ``settings``: what the session's ``session_info`` lines set (a model a
    host line records is the session's, not the history's). Returns ``{"usageTurns": n}``: the responses and
    checkpoints whose usage got a turn row."""
    origin = (info or {}).get("importOrigin")
    if not isinstance(origin, Mapping) or not isinstance(origin.get("pluginId"), str):
        return {"usageTurns": 0}
    mine = [item.record for item in messages if _imported(session_id, item.record)]
    record_usage(conn, session_id, mine)
    comps = [c for c in compactions if _imported(session_id, c.record)]
    record_compaction_usage(conn, session_id, comps)
    branches: list[Mapping[str, Any]] = []
    if archived is not None:  # an archived branch's responses count like the transcript's (the import's rule)
        for entry in archived.entries.values():
            if not entry.live:
                branches.extend(m for m in entry.messages if _imported(session_id, m))
        record_usage(conn, session_id, branches)
    turns = len({str(r["id"]) for r in [*mine, *(c.record for c in comps), *branches] if carries_usage(r)})
    last = _last_model(mine)
    if last is not None:
        _fill_history_model(conn, session_id, last)
    if origin["pluginId"] == HOST_IMPORTER and settings.get("modelId") is None:
        # bound by the first import that named a model (later ones never rebind it): the first import's
        # lines are those before its session_info line; if they name none, a later import's did
        first = _last_model(item.record for item in messages if _imported(session_id, item.record)
                            and (first_import_end is None or item.offset < first_import_end))
        bound = first or last
        if bound is not None:
            conn.execute("UPDATE sessions SET provider_id = ?, model_id = ? WHERE id = ? AND model_id IS NULL",
                         (bound[0], bound[1], session_id))
    return {"usageTurns": turns}


def _fill_history_model(conn: sqlite3.Connection, session_id: str, model: tuple[str | None, str | None]) -> None:
    """The origin row's ``providerId``/``modelId``: what the source's own history says wins, the model the
    imported lines named last fills in what it leaves out (``import_write._origin_history``)."""
    row = conn.execute("SELECT origin_json FROM session_import_origins WHERE session_id = ?",
                       (session_id,)).fetchone()
    if row is None:
        return
    try:
        origin = orjson.loads(row[0]) if row[0] else {}
    except orjson.JSONDecodeError:
        return
    if not isinstance(origin, dict):
        return
    changed = False
    for key, value in zip(("providerId", "modelId"), model, strict=True):
        if value is not None and not origin.get(key):
            origin[key] = value
            changed = True
    if changed:
        conn.execute("UPDATE session_import_origins SET origin_json = ? WHERE session_id = ?",
                     (orjson.dumps(origin).decode(), session_id))
