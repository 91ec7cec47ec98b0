"""Seed 003 §11.20 and the recoverable trash (``sessions.trash`` / ``restore`` / ``purge``)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.errors import Conflict, InvalidInput, NotFound, PermissionDenied, SessionNotFound
from store.indexing import index, reconcile
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from store.interchange.plugin_imports import PluginImport, import_plugin_session, list_plugin_sessions, require_owned
from store.search.search import search_messages, search_sessions
from store.transcripts.session_files import SessionPaths
from store.transcripts.transcript import read_transcript
from store.trash import list_trashed, purge_session, restore_session, trash_session
from tests.importers import gen
from tests.samplekit import NOW, rows, tx

MESSAGES: list[dict[str, Any]] = [
    {"id": "m1", "role": "user", "blocks": [{"type": "text", "text": "plugin kaleidoscope question"}],
     "createdAt": "2026-02-01T10:00:00.000Z"},
    {"id": "m2", "role": "assistant", "blocks": [{"type": "thinking", "text": "hmm"},
                                                  {"type": "text", "text": "plugin answer"}],
     "createdAt": "2026-02-01T10:00:05.000Z", "meta": {"modelId": "their-model"}},
]
HISTORY = {"projectPath": "/their/project", "modelId": "their-model", "providerId": "their-provider"}


def request(**overrides: Any) -> PluginImport:
    base: dict[str, Any] = {"plugin_id": "chat-export", "source_id": "chatgpt", "external_id": "conv-42",
                            "messages": MESSAGES, "title": "From the plugin", "history": HISTORY}
    base.update(overrides)
    return PluginImport(**base)


def files(target: ImportTarget, sid: str) -> SessionPaths:
    from runtime.datadir import DataDir

    return DataDir(target.sessions_dir.parent).session_paths(sid)


def test_seed_11_20_plugin_imports(db: sqlite3.Connection, target: ImportTarget) -> None:
    """§11.20: host-generated ids, one origin row per session, (pluginId, source, externalId) idempotency,
    no project or model binding unless an explicit host-created projectId is supplied, ownership-scoped
    reads and mutations, recoverable trash before purge."""
    ids = iter(["pl-generated-1", "pl-generated-2", "pl-generated-3"])
    first = import_plugin_session(db, request(), target, now_ms=NOW, make_id=lambda: next(ids))
    # host-generated session id (not derived from anything the plugin sent)
    assert first == {"sessionId": "pl-generated-1", "created": True, "messageCount": 2}
    sid = first["sessionId"]
    # idempotent on (pluginId, sourceId, externalId): nothing new, the same session
    again = import_plugin_session(db, request(messages=MESSAGES[:1]), target, now_ms=NOW + 1,
                                  make_id=lambda: next(ids))
    assert again == {"sessionId": sid, "created": False, "messageCount": 2}
    assert sorted(p.name for p in target.sessions_dir.iterdir()) == [f"{sid}.jsonl"]
    # ... but the key is per plugin and per source
    other_plugin = import_plugin_session(db, request(plugin_id="other-plugin"), target, now_ms=NOW,
                                         make_id=lambda: next(ids))
    assert other_plugin["created"] and other_plugin["sessionId"] != sid
    # one origin row per session, with the historical values as history only
    assert rows(db, "SELECT plugin_id, source_id, external_id FROM session_import_origins WHERE session_id = ?",
                sid) == [("chat-export", "chatgpt", "conv-42")]
    assert rows(db, "SELECT COUNT(*) FROM session_import_origins") == [(2,)]
    row = index.require_session(db, sid)
    assert (row["projectId"], row["modelId"], row["providerId"]) == (None, None, None)
    assert rows(db, "SELECT COUNT(*) FROM projects") == [(0,)]
    (listed,) = list_plugin_sessions(db, "chat-export").items
    assert listed["origin"]["history"]["projectPath"] == "/their/project"
    assert listed["origin"]["history"]["modelId"] == "their-model"
    assert row["source"] == "chatgpt" and row["title"] == "From the plugin"
    # an explicit, host-created project is bound — only that one
    project_id = tx(db, lambda c: index.upsert_project(c, "/host/project", NOW))
    bound = import_plugin_session(db, request(external_id="conv-43", project_id=project_id), target, now_ms=NOW,
                                  make_id=lambda: next(ids))
    bound_row = index.require_session(db, bound["sessionId"])
    assert (bound_row["projectId"], bound_row["projectPath"]) == (project_id, "/host/project")
    assert (bound_row["modelId"], bound_row["providerId"]) == (None, None)
    with pytest.raises(NotFound):
        import_plugin_session(db, request(external_id="conv-44", project_id=999), target, now_ms=NOW)
    # ownership-scoped reads and mutations
    assert require_owned(db, "chat-export", sid)["id"] == sid
    for foreign in ("other-plugin", "a-third-plugin"):
        with pytest.raises(PermissionDenied):
            require_owned(db, foreign, sid)
        with pytest.raises(PermissionDenied):
            tx(db, lambda c, f=foreign: trash_session(c, sid, now_ms=NOW, plugin_id=f))
    assert [s["id"] for s in list_plugin_sessions(db, "other-plugin").items] == [other_plugin["sessionId"]]
    # recoverable trash before purge
    with pytest.raises(Conflict):
        purge_session(db, files(target, sid), plugin_id="chat-export")
    tx(db, lambda c: trash_session(c, sid, now_ms=NOW + 10, plugin_id="chat-export"))
    with pytest.raises(SessionNotFound):
        require_owned(db, "chat-export", sid)
    assert target.transcript(sid).exists() and rows(db, "SELECT COUNT(*) FROM session_import_origins "
                                                        "WHERE session_id = ?", sid) == [(1,)]
    tx(db, lambda c: restore_session(c, sid, plugin_id="chat-export"))
    assert require_owned(db, "chat-export", sid)["deletedAt"] is None
    tx(db, lambda c: trash_session(c, sid, now_ms=NOW + 20, plugin_id="chat-export"))
    with pytest.raises(PermissionDenied):
        purge_session(db, files(target, sid), plugin_id="other-plugin")
    assert purge_session(db, files(target, sid), plugin_id="chat-export") == {"sessionId": sid, "purged": True}
    assert not target.transcript(sid).exists()
    assert rows(db, "SELECT COUNT(*) FROM session_import_origins WHERE session_id = ?", sid) == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM messages WHERE session_id = ?", sid) == [(0,)]


def test_plugin_messages_are_validated_and_namespaced(db: sqlite3.Connection, target: ImportTarget) -> None:
    for bad in ([{"id": "x", "role": "robot", "blocks": []}], [{"id": "x", "role": "user", "blocks": [{"t": 1}]}],
                ["not a message"], []):
        with pytest.raises(InvalidInput):
            import_plugin_session(db, request(external_id=f"bad-{len(str(bad))}", messages=bad), target,
                                  now_ms=NOW)
    assert list(target.sessions_dir.iterdir()) == [] and rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    with pytest.raises(InvalidInput):
        import_plugin_session(db, request(plugin_id="../etc"), target, now_ms=NOW)
    out = import_plugin_session(db, request(), target, now_ms=NOW)
    recs = [m.record for m in read_transcript(target.transcript(out["sessionId"])).messages]
    assert [r["id"] for r in recs] == [f"{out['sessionId']}:m1", f"{out['sessionId']}:m2"]
    assert recs[1]["blocks"] == MESSAGES[1]["blocks"]


def test_a_racing_second_import_of_one_key_loses_cleanly(db: sqlite3.Connection, target: ImportTarget,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two imports of one key that both looked before either committed: the second one's transaction
    fails on UNIQUE(plugin_id, source_id, external_id), its transcript is removed, the winner returned."""
    import store.interchange.plugin_imports as mod

    winner = import_plugin_session(db, request(), target, now_ms=NOW, make_id=lambda: "pl-winner")
    looks = {"n": 0}
    real = mod.find_import

    def looked_too_early(*args: Any) -> Any:
        looks["n"] += 1
        return None if looks["n"] == 1 else real(*args)

    monkeypatch.setattr(mod, "find_import", looked_too_early)
    loser = import_plugin_session(db, request(), target, now_ms=NOW, make_id=lambda: "pl-loser")
    assert loser == {"sessionId": "pl-winner", "created": False, "messageCount": 2}
    assert winner["sessionId"] == "pl-winner"
    assert [p.name for p in target.sessions_dir.iterdir()] == ["pl-winner.jsonl"]
    assert rows(db, "SELECT id FROM sessions") == [("pl-winner",)]


def test_trash_hides_from_lists_and_search_and_restore_brings_it_back(tmp_path: Path, db: sqlite3.Connection,
                                                                      target: ImportTarget) -> None:
    src = tmp_path / "s.jsonl"
    src.write_bytes(b"".join(gen.codex_lines([gen.User("zebra crossing question"),
                                              gen.Response((("text", "zebra answer"),), ())])))
    (unit,) = IMPORTERS["codex"].discover(src)
    rep = import_unit(db, unit, target, now_ms=NOW)
    sid = rep.session_id
    transcript = target.transcript(sid).read_bytes()

    def listed() -> list[str]:
        return [s["id"] for s in index.list_sessions(db, limit=50, cursor=None)[0]]

    assert listed() == [sid] and search_messages(db, "zebra")["results"]
    tx(db, lambda c: trash_session(c, sid, now_ms=NOW + 1))
    first_mark = index.require_session(db, sid)["deletedAt"]
    tx(db, lambda c: trash_session(c, sid, now_ms=NOW + 99))  # idempotent: the first mark stays
    assert index.require_session(db, sid)["deletedAt"] == first_mark == NOW + 1
    assert listed() == []
    assert search_messages(db, "zebra")["results"] == []
    assert search_sessions(db, "zebra")["results"] == []
    assert [s["id"] for s in list_trashed(db)] == [sid]
    assert target.transcript(sid).read_bytes() == transcript
    # a re-import of a trashed session does not bring it back
    os.utime(src, ns=(1, 1))
    import_unit(db, unit, target, now_ms=NOW + 2)
    assert listed() == []
    tx(db, lambda c: restore_session(c, sid))
    assert listed() == [sid] and search_messages(db, "zebra")["results"]
    # purge: only from the trash, then the row, the origin, the index rows and the files go
    with pytest.raises(Conflict):
        purge_session(db, files(target, sid))
    tx(db, lambda c: trash_session(c, sid, now_ms=NOW + 3))
    scratch = files(target, sid).scratch
    scratch.mkdir(parents=True)
    (scratch / "note.txt").write_text("x")
    purge_session(db, files(target, sid))
    assert not target.transcript(sid).exists() and not scratch.exists()
    assert rows(db, "SELECT COUNT(*) FROM sessions") == [(0,)]
    assert rows(db, "SELECT COUNT(*) FROM messages") == [(0,)]
    with pytest.raises(SessionNotFound):
        tx(db, lambda c: trash_session(c, sid, now_ms=NOW))


def test_an_index_rebuild_restores_the_origin_and_the_plugins_scope(tmp_path: Path, db: sqlite3.Connection,
                                                                     target: ImportTarget) -> None:
    out = import_plugin_session(db, request(), target, now_ms=NOW)
    sid = out["sessionId"]
    db.execute("DELETE FROM sessions")  # the index is lost; the transcript is the truth
    plan = reconcile.plan_reconcile(target.transcript(sid), 0, None)
    tx(db, lambda c: reconcile.apply_plan(c, sid, plan, now_ms=NOW))
    assert require_owned(db, "chat-export", sid)["source"] == "chatgpt"
    row = index.require_session(db, sid)
    assert (row["projectId"], row["modelId"]) == (None, None)
    (listed,) = list_plugin_sessions(db, "chat-export").items
    assert listed["origin"]["history"]["projectPath"] == "/their/project"


def test_plugin_import_history_model_is_listed_not_bound(db: sqlite3.Connection, target: ImportTarget) -> None:
    """Issue 23 §4: a plugin import's history model was kept only in its origin JSON; ``session.list`` now
    shows it as ``historyModel`` (as for a tool import) while ``providerId``/``modelId`` stay unbound (§4.5)."""
    from protocol.models_records import SessionSummary

    sid = import_plugin_session(db, request(), target, now_ms=NOW, make_id=lambda: "pl-hist-1")["sessionId"]
    items, _, _ = index.list_sessions(db, limit=10, cursor=None)
    (listed,) = [i for i in items if i["id"] == sid]
    assert listed["historyModel"] == {"providerId": "their-provider", "modelId": "their-model"}
    assert (listed["providerId"], listed["modelId"]) == (None, None)
    assert index.require_session(db, sid)["historyModel"] == listed["historyModel"]
    wire = SessionSummary.model_validate(index.public_session(listed)).model_dump(by_alias=True, exclude_none=True)
    assert wire["historyModel"] == {"providerId": "their-provider", "modelId": "their-model"}
    assert "modelId" not in wire and "spawnedBy" not in wire
