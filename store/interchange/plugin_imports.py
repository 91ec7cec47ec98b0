"""Plugin imports (seed 003 §4.5, acceptance §11.20).

A plugin hands the host a session it found elsewhere (``pluginId``,
``sourceId``, ``externalId``, messages). The rules:

* **host-generated session ids**: the plugin never picks the id;
* **one origin row per session**, and ``(pluginId, sourceId, externalId)``
  is the idempotency key: importing the same key again returns the session
  the first import created and writes nothing (also when two imports race:
  the second one's transaction loses on the UNIQUE key, its transcript is
  removed and the winner's session is returned);
* **no project or model binding**: the plugin's ``projectPath``, ``modelId``
  and ``providerId`` are kept as history in ``origin_json`` and never become
  the session's ``project_id``/``model_id``/``provider_id``. Only an explicit
  ``projectId`` of a project the host already has is bound;
* **a retry answers as the first try**: a keyed import's transcript header carries its receipt record and
  its ``session_info`` line the whole origin row; after a crash between the link and the commit, boot
  indexes the transcript and rebuilds that row from it, and the retry finds its own import there
  (:func:`answer_found`: ``created: true``, as without the crash);
* **ownership-scoped reads and mutations**: :func:`require_owned` /
  :func:`list_plugin_sessions` give a plugin its own sessions only; a trashed
  session is hidden from its reads until restored (:mod:`store.trash`); an
  import naming an attachment blob (``attachments/<sha256>``, which a plugin
  cannot store, so another's) is ``PERMISSION_DENIED`` (:func:`check_request`).

The write path is :mod:`store.interchange.import_write`'s (transcript first, one
transaction, undo on failure); messages are normalized like
``session.appendMessage`` input (:func:`store.transcripts.records.normalize_message`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import receipts
from store.attachments import REF_PREFIX, blob_refs
from store.errors import InvalidInput, NotFound, PermissionDenied, SessionNotFound, StoreError
from store.ids import new_id
from store.indexing import index
from store.indexing.reconcile import read_header
from store.interchange.import_write import ImportTarget, StagedImport, apply_index, publish, stage_parsed, undo
from store.interchange.importers.common import (
    BlobSink,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    clean_title,
    finalize,
    join_id,
    stamp,
    to_ms,
)
from store.interchange.importers.common import Slot as _Slot
from store.jsonio import Readable, loads_stored, readable
from store.receipts import ReceiptKey
from store.rules import MAX_BLOCKS_PER_MESSAGE as MAX_BLOCKS
from store.rules import MAX_PLUGIN_MESSAGES, PLUGIN_ID_RE
from store.transcripts.records import normalize_message
from store.transcripts.transcript import header_receipts

__all__ = [
    "MAX_PLUGIN_MESSAGES",
    "PluginImport",
    "answer_found",
    "find_import",
    "bound_project",
    "check_request",
    "commit_plugin_import",
    "existing_result",
    "import_plugin_session",
    "list_plugin_sessions",
    "require_owned",
    "stage_plugin_import",
    "validate_plugin_id",
]


HISTORY_KEYS = ("projectPath", "modelId", "providerId")
_KEY = re.compile(r"^[^\x00-\x1f]{1,200}$")


def validate_plugin_id(value: object) -> str:
    if not isinstance(value, str) or not PLUGIN_ID_RE.fullmatch(value):
        raise InvalidInput("pluginId must be 1-64 characters from [A-Za-z0-9._-]", data={"field": "pluginId"})
    return value


def _key(value: object, name: str) -> str:
    if not isinstance(value, str) or not _KEY.fullmatch(value):
        raise InvalidInput(f"{name} must be 1-200 printable characters", data={"field": name})
    return value


@dataclass(frozen=True)
class PluginImport:
    plugin_id: str
    source_id: str
    external_id: str
    messages: Sequence[Mapping[str, Any]]
    title: str = ""
    project_id: int | None = None
    """A host-created project to bind; everything else the plugin knows stays history."""
    history: Mapping[str, Any] = field(default_factory=dict)
    source_label: str | None = None


def find_import(conn: sqlite3.Connection, plugin_id: str, source_id: str, external_id: str) -> str | None:
    row = conn.execute(
        "SELECT session_id FROM session_import_origins WHERE plugin_id = ? AND source_id = ? AND external_id = ?",
        (plugin_id, source_id, external_id)).fetchone()
    return None if row is None else str(row[0])


def _records(req: PluginImport, sid: str, now_ms: int, meta: SessionMeta) -> Iterator[_Slot]:
    seen: set[str] = set()
    for i, raw in enumerate(req.messages):
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"messages[{i}] must be an object", data={"field": f"messages[{i}]"})
        local = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else f"m{i}"
        msg = {**raw, "id": join_id(sid, local)}
        msg.pop("turnId", None)
        meta_in = msg.get("meta")
        if isinstance(meta_in, Mapping) and "receipt" in meta_in:
            msg["meta"] = {k: v for k, v in meta_in.items() if k != "receipt"}
        created = to_ms(raw.get("createdAt"))
        msg["createdAt"] = stamp(created if created is not None else now_ms)
        try:
            record = normalize_message(msg, now_ms=now_ms)
        except StoreError as exc:
            raise InvalidInput(f"messages[{i}]: {exc.message}", data={"field": f"messages[{i}]"}) from None
        meta.saw_time(to_ms(record["createdAt"]))
        replacement = record["id"] in seen
        seen.add(record["id"])
        yield _Slot(record, replacement=replacement)


def check_request(req: PluginImport) -> tuple[str, str, str]:
    """Validate the request's keys and bounds (``INVALID_PARAMS`` naming the field); its idempotency key."""
    plugin = validate_plugin_id(req.plugin_id)
    source = _key(req.source_id, "sourceId")
    external = _key(req.external_id, "externalId")
    if not isinstance(req.messages, Sequence) or len(req.messages) > MAX_PLUGIN_MESSAGES:
        raise InvalidInput(f"messages must be a list of at most {MAX_PLUGIN_MESSAGES}", data={"field": "messages"})
    for i, raw in enumerate(req.messages):
        blocks = raw.get("blocks") if isinstance(raw, Mapping) else None
        if isinstance(blocks, list) and len(blocks) > MAX_BLOCKS:
            raise InvalidInput(f"messages[{i}].blocks holds more than {MAX_BLOCKS} blocks",
                               data={"field": f"messages[{i}].blocks"})
        shas = blob_refs(raw)
        if shas:
            # A plugin stores no attachment (attachments.* is not open to it), so a blob its import names is
            # another's: its own session would refer to it, and an export of that session carry its bytes.
            raise PermissionDenied(f"messages[{i}] refers to attachment {REF_PREFIX}{min(shas)}, which plugin "
                                   f"{plugin} does not own (a plugin import carries no attachment blobs)",
                                   data={"field": f"messages[{i}]", "pluginId": plugin})
    return plugin, source, external


def existing_result(conn: sqlite3.Connection, req: PluginImport) -> dict[str, Any] | None:
    """The answer for a key imported before (``created: false``), else None."""
    plugin, source, external = check_request(req)
    existing = find_import(conn, plugin, source, external)
    if existing is None:
        return None
    return {"sessionId": existing, "created": False,
            "messageCount": index.require_session(conn, existing)["messageCount"]}


def answer_found(found: Mapping[str, Any], transcript: Path, key: ReceiptKey) -> dict[str, Any]:
    """The answer to ``key``'s request for a key imported before (``found``: :func:`existing_result`).

    ``created: true`` when the transcript's header carries ``key``'s receipt: this very request wrote it
    (its first try was killed before its commit, and boot indexed what it linked), so it answers what that
    try would have; ``IDEMPOTENCY_CONFLICT`` when the header carries the key for another request; else
    ``created: false`` (another request imported it). Reads the header: run it in a worker thread."""
    for rec in header_receipts(read_header(transcript)):
        written = receipts.key_of_record(rec)
        if written is None or (written.client_id, written.submission_id) != (key.client_id, key.submission_id):
            continue
        if (written.method, written.fingerprint) != (key.method, key.fingerprint):
            raise receipts.conflict(key, written.method)
        return {**found, "created": True}
    return dict(found)


def bound_project(conn: sqlite3.Connection, req: PluginImport) -> tuple[int, str] | None:
    """The explicit host-created project to bind (``NOT_FOUND`` for an unknown id)."""
    if req.project_id is None:
        return None
    row = conn.execute("SELECT id, path FROM projects WHERE id = ?", (req.project_id,)).fetchone()
    if row is None:
        raise NotFound(f"project {req.project_id} not found", data={"projectId": req.project_id})
    return int(row[0]), str(row[1])


def stage_plugin_import(req: PluginImport, sid: str, target: ImportTarget, project: tuple[int, str] | None, *,
                        now_ms: int, key: ReceiptKey | None = None) -> StagedImport:
    """Step 1 (file I/O, no database): the new transcript in a temp file (``INVALID_PARAMS`` if refused).
    Its header carries ``key``'s receipt record, its session_info line the origin row (see the module doc)."""
    plugin, source, external = check_request(req)
    history = {k: req.history[k] for k in HISTORY_KEYS if isinstance(req.history.get(k), str)}
    meta = SessionMeta(source, external, sid, title=clean_title(req.title),
                       label=(req.source_label or source)[:80], history=dict(history))
    meta.title_rank = 0
    report = SessionReport(source, external, sid)
    parsed = Parsed(meta, report, finalize(_records(req, sid, now_ms, meta), report, target.limits))
    try:
        return stage_parsed(parsed, sid, target, sink=BlobSink(None), spans=None, created_ms=lambda: now_ms,
                            plugin_id=plugin, project=project, imported_ms=now_ms,
                            receipt=receipts.file_record(key) if key is not None else None)
    except Refused as exc:
        raise InvalidInput(exc.message, data={"field": "messages", "reason": exc.code}) from None


def commit_plugin_import(conn: sqlite3.Connection, req: PluginImport, staged: StagedImport, *,
                         now_ms: int) -> dict[str, Any]:
    """Step 3, inside the caller's transaction: the rows, unless the key was imported meanwhile.

    ``created: false`` means another import of the same key won the race: nothing was
    written here, and the caller removes its staged transcript (:func:`store.interchange.import_write.undo`).
    """
    found = existing_result(conn, req)
    if found is not None:
        return found
    apply_index(conn, staged, now_ms=now_ms)
    return {"sessionId": staged.session_id, "created": True,
            "messageCount": sum(staged.report.messages.values())}


def import_plugin_session(conn: sqlite3.Connection, req: PluginImport, target: ImportTarget, *, now_ms: int,
                          make_id: Callable[[], str] = lambda: new_id("pl-")) -> dict[str, Any]:
    """Import (or find again) a plugin's session on one connection (tests, tools without a host):
    stage → publish → one transaction → undo on failure. Returns ``{sessionId, created, messageCount}``.

    A running host runs the same steps in the new session's actor (``runtime/handlers/plugin_imports.py``).
    """
    found = existing_result(conn, req)
    if found is not None:
        return found
    project = bound_project(conn, req)
    staged = stage_plugin_import(req, make_id(), target, project, now_ms=now_ms)
    try:
        publish(staged, faults=target.faults)
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = commit_plugin_import(conn, req, staged, now_ms=now_ms)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.IntegrityError:
        undo(staged)
        winner = existing_result(conn, req)
        if winner is None:
            raise
        return winner
    except BaseException:
        undo(staged)
        raise
    if not result["created"]:
        undo(staged)
    return result


def require_owned(conn: sqlite3.Connection, plugin_id: str, session_id: str, *,
                  include_trashed: bool = False) -> dict[str, Any]:
    """The session row, if ``plugin_id`` imported it (and, unless asked, it is not in the trash)."""
    row = index.session_row(conn, session_id)
    if row is None:
        raise SessionNotFound(f"session {session_id} not found", data={"sessionId": session_id})
    owner = conn.execute("SELECT plugin_id FROM session_import_origins WHERE session_id = ?",
                         (session_id,)).fetchone()
    if owner is None or owner[0] != plugin_id:
        raise PermissionDenied(f"session {session_id} was not imported by plugin {plugin_id}",
                               data={"sessionId": session_id, "pluginId": plugin_id})
    if row["deletedAt"] is not None and not include_trashed:
        raise SessionNotFound(f"session {session_id} is in the trash", data={"sessionId": session_id})
    return index.public_session(row)


def list_plugin_sessions(conn: sqlite3.Connection, plugin_id: str, *, source_id: str | None = None,
                         include_trashed: bool = False, limit: int = 200) -> Readable[dict[str, Any]]:
    """A plugin's own imported sessions, newest first, with their origin (history included). A session whose
    import origin is damaged is named in ``unreadable`` (session ids) instead; it counts toward ``limit``."""
    sql = ("SELECT o.session_id, o.source_id, o.external_id, o.source_label, o.origin_json "
           "FROM session_import_origins o JOIN sessions s ON s.id = o.session_id WHERE o.plugin_id = ?")
    args: list[Any] = [plugin_id]
    if source_id is not None:
        sql += " AND o.source_id = ?"
        args.append(source_id)
    if not include_trashed:
        sql += " AND s.deleted_at IS NULL"
    sql += " ORDER BY o.created_at DESC, o.session_id LIMIT ?"
    args.append(limit)
    rows = [(found, origin) for origin in conn.execute(sql, args).fetchall()
            if (found := index.session_row(conn, origin[0])) is not None]

    def listed(pair: tuple[dict[str, Any], tuple[Any, ...]]) -> dict[str, Any]:
        row, (sid, src, ext, label, origin_json) = pair
        item = index.public_session(row)
        item["origin"] = {"sourceId": src, "externalId": ext, "label": label,
                          "history": loads_stored(origin_json, f"the import origin of session {sid}", dict)
                          if origin_json else {}}
        return item

    return readable(rows, listed, lambda pair: str(pair[1][0]))
