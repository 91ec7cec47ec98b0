"""RELIABILITY row 7 with ARCHITECTURE "Durability" (DB-only state's commit precedes its reply): an index found
corrupt is quarantined and rebuilt from the transcripts, and the DB-only rows its quarantined copy still reads
back are salvaged into the rebuilt one (``store/indexing/salvage.py``): settings, providers and models,
permission rules, scheduled tasks, queued prompts, notifications, turns, receipts of DB-only methods. The
damage lands where random damage mostly lands, in the FTS5 trigram index: at boot (a page of its data
table overwritten, ``quick_check`` finds it) and under the serving host (search meets it, CORRUPT_DATA, the
host restarts itself). Before the salvage all of these read back empty after the rebuild."""

from __future__ import annotations

import base64
import hashlib
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.session_context import session_info_line
from protocol.models_host import BootReport
from runtime.boot import run_boot
from runtime.client import ClientClosed, HostClient, RpcError, open_client
from runtime.datadir import DataDir
from store.faults import NO_FAULTS
from store.indexing.salvage import SALVAGE_FROM_VERSION, SALVAGED, salvage
from store.transcripts.transcript import create_transcript
from store.upgrade.migrations import ddl_for_version
from store.upgrade.schema import SCHEMA_VERSION, apply_schema
from tests.acceptance.outsiderkit import error_of
from tests.dbkit import NOW
from tests.hostkit import start_host_process
from tests.integrity.test_reliability_outsider_a import host, ids, msg


async def _write_state(c: HostClient, ui: HostClient, root: Path) -> dict[str, Any]:
    """DB-only state of every kind, through the wire; what a retry of each keyed write must answer."""
    await c.call("session.create", {"sessionId": "s1", "title": "Salvage me", "projectPath": str(root / "p2")})
    await c.call("session.create", {"sessionId": "s2", "title": "Queue"})
    for i in range(6):
        await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"needle {i} words")})
    appended = await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("mk", "needle keyed"),
                                                      "submissionId": "ap-1"})
    # a project no session names (the visible workspace, pinned) and a session's project, pinned
    opened = await c.call("workspace.open", {"path": str(root / "p1")})
    await c.call("projects.pin", {"projectId": opened["currentProjectId"], "pinned": True})
    listed = (await c.call("projects.list", {}))["projects"]
    await c.call("projects.pin", {"projectId": next(p["id"] for p in listed if p["path"].endswith("p2")),
                                  "pinned": True})
    await c.call("settings.set", {"ns": "ui", "key": "sidebarWidth", "value": 280, "submissionId": "set-1"})
    await c.call("settings.set", {"ns": "app", "key": "theme", "value": {"name": "dark"}})
    await c.call("providers.create", {"id": "orx", "name": "OrX", "baseUrl": "https://example.invalid/v1",
                                      "apiKey": "sk-test-0123456789abcdef", "submissionId": "prov-1"})
    await c.call("models.add", {"providerId": "orx", "modelId": "my/finetune", "displayName": "Mine",
                                "contextWindow": 32768})
    task = await c.call("tasks.create", {"title": "Digest", "prompt": "Summarize", "submissionId": "task-1"})
    q1 = await c.call("session.queuePush", {"sessionId": "s2", "principal": "ui", "content": "first queued",
                                            "permissionMode": "ask", "submissionId": "qp-1"})
    await c.call("session.queuePush", {"sessionId": "s2", "principal": "ui", "content": "second queued",
                                       "permissionMode": "ask", "idempotencyKey": "k-2"})
    # a turn that ends: its turn row and its notification; a permission rule from a UI's answer
    await c.call("session.startTurn", {"sessionId": "s1", "turnId": "t1"})
    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("u1", "question", turnId="t1")})
    asked = await c.call("approvals.request", {"sessionId": "s1", "turnId": "t1", "toolCallId": "call1",
                                               "tool": "Bash", "risk": "low"})
    await ui.call("approvals.respond", {"sessionId": "s1", "requestId": asked["request"]["requestId"],
                                        "optionId": "allow_project"})
    asked = await c.call("approvals.request", {"sessionId": "s1", "turnId": "t1", "toolCallId": "call2",
                                               "tool": "Read", "risk": "low"})
    await ui.call("approvals.respond", {"sessionId": "s1", "requestId": asked["request"]["requestId"],
                                        "optionId": "allow_session"})
    asked = await c.call("approvals.request", {"sessionId": "s1", "turnId": "t1", "toolCallId": "call3",
                                               "tool": "Write", "risk": "high"})
    await ui.call("approvals.respond", {"sessionId": "s1", "requestId": asked["request"]["requestId"],
                                        "optionId": "deny"})  # an audit row: tool_denied
    await c.call("session.appendMessage", {"sessionId": "s1", "message": msg("a1", "answer", role="assistant",
                                                                          turnId="t1")})
    await c.call("session.endTurn", {"sessionId": "s1", "turnId": "t1", "status": "completed"})
    # a blob with its seed 000 §2.3 metadata, referred to by a message: the file holds only its bytes
    put = await c.call("attachments.put", {
        "name": "shot.png", "mimeType": "image/png", "dataBase64": base64.b64encode(_BLOB).decode(),
        "kind": "screenshot", "trust": "user", "provenance": "capture", "source": "https://example.org/docs",
        "runId": "t1", "meta": {"width": 1280, "height": 800}})
    assert put["sha256"] == _BLOB_SHA
    message = msg("shot", "a screenshot")
    message["blocks"].append({"type": "attachment", "kind": "image", "name": "shot.png",
                              "ref": f"attachments/{_BLOB_SHA}"})
    await c.call("session.appendMessage", {"sessionId": "s1", "message": message})
    await c.call("search.query", {"query": "needle", "limit": 50})  # indexed: the read barrier
    return {"task": task, "queue": q1, "append": appended}


_BLOB = b"\x89PNG a screenshot's bytes"
_BLOB_SHA = hashlib.sha256(_BLOB).hexdigest()


async def _read_state(c: HostClient) -> dict[str, Any]:
    tasks = (await c.call("tasks.list", {}))
    projects = {p["id"]: p for p in (await c.call("projects.list", {}))["projects"]}
    current = (await c.call("workspace.get", {})).get("currentProjectId")
    return {
        "projects": sorted((Path(p["path"]).name, p["pinned"]) for p in projects.values()),
        "workspace": Path(projects[current]["path"]).name if current in projects else current,
        "sidebar": (await c.call("settings.get", {"ns": "ui", "key": "sidebarWidth"}))["value"],
        "theme": (await c.call("settings.get", {"ns": "app", "key": "theme"}))["value"],
        "provider": {k: v for k, v in (await c.call("providers.get", {"providerId": "orx"})).items()
                     if k in ("id", "name", "baseUrl", "hasApiKey")},
        "models": sorted(m["modelId"] for m in (await c.call("models.list", {"providerId": "orx"}))["models"]),
        "tasks": sorted(t["id"] for t in tasks["tasks"]),
        "queue": [e["content"] for e in (await c.call("session.queueList", {"sessionId": "s2"}))["entries"]],
        "rules": sorted((r["scope"], r["tool"], r["decision"], Path(projects[r["projectId"]]["path"]).name
                         if r.get("projectId") in projects else r.get("projectId"))
                        for r in (await c.call("approvals.rules", {}))["rules"]),
        "notifications": sorted(n["turnId"] for n in (await c.call("notifications.list", {}))["notifications"]),
        "audit": sorted((e["kind"], e.get("sessionId")) for e in
                        (await c.call("audit.list", {"kind": "tool_denied", "limit": 50}))["entries"]),
        "s1": await ids(c, "s1"),
        # a turn its lines name: the rebuild restores it from them (ended, how unknown), the salvage as it was
        "turns": [(t["id"], t["status"], t.get("errorCode")) for t in
                  (await c.call("session.listTurns", {"sessionId": "s1"}))["turns"]],
        "titles": sorted(s["title"] for s in (await c.call("session.list", {}))["sessions"]),
        "search": sorted(r["messageId"] for r in
                         (await c.call("search.query", {"query": "needle", "limit": 50}))["results"]),
        # its last use is the file's mtime once the row is adopted again
        "blob": {k: v for k, v in (await c.call("attachments.get", {"sha256": _BLOB_SHA})).items()
                 if k != "lastUsedAt"},
    }


def _damage_fts_pages(db: Path) -> None:
    """Overwrite the root page of the FTS5 index's data table (a shadow table): nothing else is touched."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages_fts_data'").fetchone()[0]
    finally:
        conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


@pytest.mark.parametrize("where", ["boot", "serving", "boot-killed-mid-salvage"])
async def test_db_only_state_survives_a_corrupt_index(tmp_path: Path, where: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    proc = start_host_process(data)
    try:
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="agent-1", client_kind="agent") as c, \
                    open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as ui:
                answers = await _write_state(c, ui, tmp_path)
                before = await _read_state(c)
                if where == "serving":  # the FTS5 index's leaf blocks malformed: a search meets them
                    conn = sqlite3.connect(data / "pi.sqlite", timeout=10, isolation_level=None)
                    conn.execute("UPDATE messages_fts_data SET block = X'ffffffff' WHERE id > 10")
                    conn.close()
                    code, _ = await error_of(c, "search.query", {"query": "needle"})
                    assert code == "CORRUPT_DATA"
        if where.startswith("boot"):
            assert proc.terminate() == 0
            _damage_fts_pages(data / "pi.sqlite")
            if where == "boot-killed-mid-salvage":  # the next boot finds the mark and salvages again
                # killed once every table committed, before the settling and the mark's removal: the copy
                # runs again over its own rows (nothing doubled, the audit log's rows included)
                with pytest.raises(RuntimeError, match="exited with -9"):
                    start_host_process(data, env={"RT_CRASHPOINT": f"salvage.after_table:{len(SALVAGED)}"},
                                       timeout=30)
            proc = start_host_process(data)
        assert before["queue"] == ["first queued", "second queued"] and len(before["rules"]) == 2
        assert before["notifications"] and before["workspace"] == "p1" and before["audit"] == [("tool_denied", "s1")]
        assert before["projects"] == [("p1", True), ("p2", True)]
        after = await _after_rebuild(proc)
        assert after["state"] == before, (after["state"], after["boot"])
        boot = after["boot"]
        assert boot["dbRebuilt"] is (where != "boot-killed-mid-salvage")
        tables = ("projects", "kv", "providers", "models", "scheduled_tasks", "turn_queue", "permission_rules",
                  "notifications", "turns", "command_receipts", "audit_log", "attachment_blobs")
        for table in () if where == "boot-killed-mid-salvage" else tables:
            assert boot["salvaged"].get(table), (table, boot.get("salvaged"), boot.get("salvage"))

        # keyed DB-only writes retried after the restart answer from their receipts, never run again
        with trio.fail_after(60):
            async with open_client(proc.url, proc.token, client_id="agent-1", client_kind="agent") as c:
                again = await c.call("tasks.create", {"title": "Digest", "prompt": "Summarize",
                                                      "submissionId": "task-1"})
                assert again["id"] == answers["task"]["id"]
                pushed = await c.call("session.queuePush", {"sessionId": "s2", "principal": "ui",
                                                            "content": "first queued", "permissionMode": "ask",
                                                            "submissionId": "qp-1"})
                assert pushed["entry"]["id"] == answers["queue"]["entry"]["id"]
                # an append's receipt is its line's: the rebuild restores it, the salvage leaves it alone
                assert await c.call("session.appendMessage", {
                    "sessionId": "s1", "message": msg("mk", "needle keyed"), "submissionId": "ap-1"}) \
                    == answers["append"]
                assert await _read_state(c) == before
    finally:
        proc.kill9()
    assert list((data / "quarantine").glob("pi.sqlite.corrupt-*")), "the damaged index stays in quarantine"
    # a second restart changes nothing
    async with host(data) as (_proc, c):
        assert await _read_state(c) == before
        boot = (await c.call("host.status", {}))["boot"]
        assert not boot["dbRebuilt"] and "salvage" not in boot


async def _after_rebuild(proc: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        while True:
            try:
                async with open_client(proc.url, proc.token, client_id="agent-2", client_kind="agent") as c:
                    boot = (await c.call("host.status", {}))["boot"]
                    if "salvage" in boot:
                        return {"boot": boot, "state": await _read_state(c)}
            except (OSError, ClientClosed, RpcError):
                pass
            await trio.sleep(0.2)


def _make(path: Path, rows: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    apply_schema(conn)
    conn.execute("BEGIN")
    for i in range(rows):
        conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('ui', ?, ?, 1)",
                     (f"k{i:05d}", f'"{"x" * 200}"'))
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('ui', 'bad-json', '{nope', 1)")
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('ui', 'bad-text', "
                 "CAST(X'22ff22' AS TEXT), 1)")
    conn.execute("INSERT INTO turn_queue(id, session_id, principal, input_hash, content, permission_mode, position, "
                 "created_at) VALUES ('q1', 'gone', 'ui', 'h', 'c', 'ask', 1, 1)")
    for key, method in (("k1", "settings.set"), ("k2", "session.appendMessage")):
        conn.execute("INSERT INTO command_receipts(client_id, submission_id, method, status, response_json, "
                     "fingerprint, created_at) VALUES ('c', ?, ?, 'ok', '{}', 'fp', 1)", (key, method))
    conn.execute("COMMIT")
    conn.close()


def test_salvage_of_a_damaged_db_only_table_copies_what_reads_back(tmp_path: Path) -> None:
    """The kv b-tree itself damaged midway: the rows before the damage and those after it (found from the
    table's other end) are copied, only the damaged page's rows are lost, nothing is invented, the bad rows
    are counted, an orphan is skipped, and the quarantined file is never written."""
    src = tmp_path / "old.sqlite"
    _make(src, 2000)
    conn = sqlite3.connect(src)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("SELECT pageno FROM dbstat WHERE name = 'kv' AND pagetype = 'leaf' "
                         "ORDER BY path").fetchall()
    conn.close()
    victim = pages[len(pages) // 2][0]
    with open(src, "r+b") as f:
        f.seek((victim - 1) * page_size)
        f.write(b"\xa5" * page_size)
    before = src.read_bytes()
    dst_path = tmp_path / "new.sqlite"
    dst = sqlite3.connect(dst_path, isolation_level=None)
    apply_schema(dst)
    out = salvage(dst, src, now_ms=5)
    assert src.read_bytes() == before
    copied = dst.execute("SELECT key, value_json FROM kv WHERE ns = 'ui' ORDER BY key").fetchall()
    assert 0 < out.copied["kv"] == len(copied) < 2000, out
    assert all(v == f'"{"x" * 200}"' for _, v in copied)
    every = [f"k{i:05d}" for i in range(2000)]
    keys = [k for k, _ in copied]
    first_lost = next(i for i, k in enumerate(every) if k not in keys)
    lost = 2000 - len(keys)
    # a prefix and a suffix, nothing invented: only the damaged page's rows (a 4 KiB leaf holds ~17) are gone
    assert keys == every[:first_lost] + every[first_lost + lost:], out
    assert 0 < first_lost and first_lost + lost < 2000 and lost < 40, (first_lost, lost)
    assert out.skipped["kv"] == {"badJson": 1, "badText": 1, "readError": 1}, out
    assert out.skipped["turn_queue"] == {"orphans": 1}
    assert dst.execute("SELECT COUNT(*) FROM turn_queue").fetchone()[0] == 0
    # a DB-only method's receipt is copied; an append's is its line's (the rebuild's), never copied
    assert dst.execute("SELECT submission_id FROM command_receipts").fetchall() == [("k1",)]
    dst.close()
    # a file of a layout older than the salvage knows (or newer than this build) is left alone
    for version in (SALVAGE_FROM_VERSION - 1, SCHEMA_VERSION + 1):
        other = tmp_path / f"other{version}.sqlite"
        c2 = sqlite3.connect(other)
        c2.execute(f"PRAGMA user_version = {version}")
        c2.close()
        dst = sqlite3.connect(tmp_path / f"new{version}.sqlite", isolation_level=None)
        apply_schema(dst)
        assert "schema version" in (salvage(dst, other, now_ms=5).skipped_reason or "")
        dst.close()


def test_an_index_of_the_previous_layout_found_corrupt_at_an_upgrade_is_salvaged(tmp_path: Path) -> None:
    """The first start of a newer build finds the index corrupt before migrating it: the quarantined file is
    of the older layout. Every layout from SALVAGE_FROM_VERSION on has this build's salvaged tables, column for
    column, so its DB-only rows are copied (before: only the current version was salvaged, and a corrupt
    index met at the upgrade lost them all)."""
    old = tmp_path / "v31.sqlite"
    conn = sqlite3.connect(old, isolation_level=None)
    for statement in ddl_for_version(SALVAGE_FROM_VERSION):
        conn.execute(statement)
    conn.execute(f"PRAGMA user_version = {SALVAGE_FROM_VERSION}")
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('ui', 'sidebarWidth', '280', 1)")
    conn.close()
    fresh = sqlite3.connect(":memory:", isolation_level=None)
    apply_schema(fresh)
    for table, _why in SALVAGED:  # the layouts agree on every salvaged table
        assert _table_columns(conn := sqlite3.connect(old), table) == _table_columns(fresh, table), table
        conn.close()
    fresh.close()
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    out = salvage(dst, old, now_ms=5)
    assert out.skipped_reason is None and out.copied["kv"] == 1, out
    assert dst.execute("SELECT value_json FROM kv WHERE key = 'sidebarWidth'").fetchone() == ("280",)
    dst.close()


def _table_columns(conn: sqlite3.Connection, table: str) -> list[tuple[object, ...]]:
    return [tuple(r[1:]) for r in conn.execute(f"PRAGMA table_info({table})")]


def test_rows_only_in_the_wal_are_salvaged_and_the_quarantined_pair_is_never_written(tmp_path: Path) -> None:
    """A host killed before a checkpoint leaves committed rows in ``-wal`` only: they are read through a
    private copy of the pair (opening the quarantined WAL would write its ``-shm``)."""
    live = tmp_path / "live.sqlite"
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    apply_schema(conn)
    conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES ('ui', 'only-in-wal', '1', 1)")
    quarantine = tmp_path / "quarantine"
    quarantine.mkdir()
    src = quarantine / "pi.sqlite.corrupt-1"
    shutil.copyfile(live, src)  # the writer still open: the row is in the WAL alone
    shutil.copyfile(f"{live}-wal", f"{src}-wal")
    conn.close()
    before = {p.name: p.read_bytes() for p in quarantine.iterdir()}
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    out = salvage(dst, src, now_ms=5)
    assert out.copied["kv"] == 1, out
    assert dst.execute("SELECT value_json FROM kv WHERE key = 'only-in-wal'").fetchone() == ("1",)
    dst.close()
    assert {p.name: p.read_bytes() for p in quarantine.iterdir()} == before


def test_the_boot_goes_on_when_the_salvage_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = DataDir(tmp_path / "data")
    data.ensure()
    create_transcript(data.transcript("s-a"), "s-a", NOW,
                      body_lines=[session_info_line({"title": "kept"}, NOW)])
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW)
    assert "salvage" not in boot.report  # a missing file is no corruption: nothing to salvage
    boot.conn.close()
    _damage_fts_pages(data.db_path)

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("salvage bug")

    monkeypatch.setattr("runtime.boot.salvage", broken)
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW)
    try:
        assert boot.report["dbRebuilt"] is True
        assert boot.report["salvage"]["failed"] == "RuntimeError: salvage bug"
        assert boot.conn.execute("SELECT title FROM sessions").fetchall() == [("kept",)]
    finally:
        boot.conn.close()


def test_a_column_name_that_is_not_utf8_loses_its_table_not_the_salvage(tmp_path: Path) -> None:
    """A damaged byte in a table's CREATE statement (found by scripts/chaos --mode corrupt): the
    column name no longer decodes. That table is reported unreadable; every other table is still copied
    (before: a UnicodeDecodeError failed the whole salvage, and every DB-only row was lost)."""
    src = tmp_path / "old.sqlite"
    _make(src, 20)
    raw = src.read_bytes()
    assert raw.count(b"usage_json") == 1  # only in the turns table's CREATE statement
    src.write_bytes(raw.replace(b"usage_json", b"usa\xdce_json"))
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    try:
        out = salvage(dst, src, now_ms=5)
        assert "turns" in out.errors, out
        assert out.skipped["turns"] == {"readError": 1}, out  # so boot.salvageSkipped names it
        assert out.copied["kv"] == 20, out
        assert dst.execute("SELECT submission_id FROM command_receipts").fetchall() == [("k1",)]
    finally:
        dst.close()


def test_one_malformed_create_statement_loses_its_table_not_the_salvage(tmp_path: Path) -> None:
    """A damaged CREATE statement that no longer parses (found by scripts/chaos --mode corrupt): SQLite
    refuses the whole schema ("malformed database schema"), so the salvage skipped every table. Read with
    the broken entry ignored, only that table is lost."""
    src = tmp_path / "old.sqlite"
    _make(src, 20)
    raw = src.read_bytes()
    at = raw.index(b"CREATE TABLE models (")
    src.write_bytes(raw[:at] + b"CREATE TABLE models )" + raw[at + 21:])
    before = src.read_bytes()
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    try:
        out = salvage(dst, src, now_ms=5)
        assert out.skipped_reason is None, out
        assert "models" in out.errors, out
        assert out.skipped["models"] == {"readError": 1}, out
        assert out.copied["kv"] == 20, out
    finally:
        dst.close()
    assert src.read_bytes() == before


def _audit_log_source(src: Path, rows: int) -> tuple[int, list[int]]:
    """A fresh index at ``src`` holding ``rows`` test rows of the audit log (a rowid table, no foreign keys):
    its page size and the audit log's leaf pages in key order."""
    conn = sqlite3.connect(src, isolation_level=None)
    apply_schema(conn)
    conn.execute("BEGIN")
    for i in range(rows):
        conn.execute("INSERT INTO audit_log(ts, kind, session_id, payload_json) VALUES (?, 'test', ?, ?)",
                     (1000 + i, f"t{i:05d}", f'{{"pad": "{"y" * 150}"}}'))
    conn.execute("COMMIT")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    leaves = [int(r[0]) for r in conn.execute("SELECT pageno FROM dbstat WHERE name = 'audit_log' "
                                              "AND pagetype = 'leaf' ORDER BY path")]
    conn.close()
    return page_size, leaves


def test_a_rowid_table_damaged_midway_keeps_its_rows_on_both_sides_in_order(tmp_path: Path) -> None:
    """A rowid table (the audit log, copied in id order under new ids) with a leaf page a third of the way
    in destroyed: the rows before it and after it come back in their order, and the failure is a
    ``readError``. With a second page near the end destroyed too, the rows between the two went with them
    (two thirds of the table, all readable: neither scan from an end reaches them); the table's index names
    their rowids, so they come back too, and only the two pages' rows are lost."""
    src = tmp_path / "old.sqlite"
    page_size, leaves = _audit_log_source(src, 3000)
    every = [f"t{i:05d}" for i in range(3000)]
    for n, victims in enumerate(([leaves[len(leaves) // 3]], [leaves[len(leaves) // 3], leaves[-3]])):
        damaged = tmp_path / f"old{n}.sqlite"
        damaged.write_bytes(src.read_bytes())
        with open(damaged, "r+b") as f:
            for victim in victims:
                f.seek((victim - 1) * page_size)
                f.write(b"\x5a" * page_size)
        dst = sqlite3.connect(tmp_path / f"new{n}.sqlite", isolation_level=None)
        apply_schema(dst)
        out = salvage(dst, damaged, now_ms=5)
        targets = [r[0] for r in dst.execute("SELECT session_id FROM audit_log WHERE kind = 'test' ORDER BY id")]
        dst.close()
        assert targets == sorted(targets) and set(targets) <= set(every), out  # in order, nothing invented
        assert targets[0] == "t00000" and targets[-1] == "t02999", out  # both ends read back
        # the scan's failure, then each row the index names that does not read: every row is accounted for
        assert len(targets) + out.skipped["audit_log"]["readError"] - 1 == 3000, out
        assert set(out.skipped["audit_log"]) == {"readError"}, out
        # only the damaged leaves' rows (~22 of ~160 bytes on a 4 KiB page each) are lost
        assert 3000 - 25 * len(victims) < len(targets) < 3000, len(targets)


def test_rows_a_damaged_leaf_hides_from_every_read_are_counted_as_hidden(tmp_path: Path) -> None:
    """A changed byte that lowers a leaf's cell count leaves that leaf's last rows out of every scan of the table,
    with every page otherwise well formed: no read fails, so the salvage copied the rest and said nothing, and
    a loss that the boot report does not name is silent. The table's full indexes still count those rows: the
    salvage reports the difference as ``hidden``."""
    src = tmp_path / "old.sqlite"
    page_size, leaves = _audit_log_source(src, 600)
    leaf = leaves[2]
    with open(src, "r+b") as f:  # a table leaf's header: its cell count at bytes 3-4, big-endian
        f.seek((leaf - 1) * page_size + 3)
        cells = int.from_bytes(f.read(2), "big")
        f.seek((leaf - 1) * page_size + 3)
        f.write((cells - 2).to_bytes(2, "big"))
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    out = salvage(dst, src, now_ms=5)
    copied = dst.execute("SELECT count(*) FROM audit_log WHERE kind = 'test'").fetchone()[0]
    dst.close()
    assert copied == 598 and out.copied["audit_log"] == 598, out
    assert out.skipped["audit_log"] == {"hidden": 2}, out


def _notifications_source(src: Path, rows: int) -> tuple[int, int, list[tuple[int, int]]]:
    """A fresh index at ``src`` holding ``rows`` notifications of one session (``s``): its page size, the
    notifications table's root page and its leaves (page, cell count) in key order."""
    conn = sqlite3.connect(src, isolation_level=None)
    apply_schema(conn)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s', 'chaos s', 1, 1)")
    for i in range(rows):
        conn.execute("INSERT INTO notifications(id, kind, session_id, session_title, turn_id, created_at) "
                      "VALUES (?, 'task.completed', 's', 'chaos s', ?, ?)", (f"n_{i:05d}", f"s.t{i}", 1000 + i))
    conn.execute("COMMIT")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    root = int(conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'notifications'").fetchone()[0])
    leaves = [(int(r[0]), int(r[1])) for r in conn.execute(
        "SELECT pageno, ncell FROM dbstat WHERE name = 'notifications' AND pagetype = 'leaf' ORDER BY path")]
    conn.close()
    return page_size, root, leaves


@pytest.mark.parametrize("pointer", ["leaf cell", "interior cell"])
def test_rows_a_damaged_pointer_hides_behind_rows_it_shows_twice_are_counted_as_hidden(
        tmp_path: Path, pointer: str) -> None:
    """Found by scripts/chaos --mode corrupt (seed 1498681220: an acknowledged notification missing after the
    salvage, which named no notification skipped): a changed byte makes a pointer name another well formed
    cell of the same table, a leaf's cell pointer its neighbour's cell, or an interior cell's child pointer the
    sibling leaf. No read fails: the rows behind the old pointer are hidden from every read, and the rows it
    names now are read twice. The second copy of each is left out as ``kept`` (which the boot report does not
    count: a row the rebuild wrote), and a table scan counts as many rows as the table's indexes, so the
    hidden ones were lost silently. They are counted as ``hidden``: the rowids the indexes name that no scan
    finds."""
    src = tmp_path / "old.sqlite"
    page_size, root, leaves = _notifications_source(src, 30 if pointer == "leaf cell" else 200)
    data = bytearray(src.read_bytes())
    if pointer == "leaf cell":  # the newest row's cell pointer (the last) names the cell before it
        assert leaves == [(root, 30)]
        at = (root - 1) * page_size + 8 + 2 * 29
        data[at:at + 2] = data[at - 2:at]
        hidden = twice = 1
    else:  # the child pointer of an interior cell names the leaf left of its own
        at = (root - 1) * page_size
        assert data[at] == 5  # an interior table page: the cell pointers follow its 12-byte header
        cells = [int.from_bytes(data[at + 12 + 2 * i:at + 14 + 2 * i], "big") for i in range(len(leaves) - 1)]
        # a leaf of no more rows than the one named twice: the scan counts no fewer rows than the indexes hold
        k = next(i for i in range(1, len(cells)) if leaves[i][1] <= leaves[i - 1][1])
        data[at + cells[k]:at + cells[k] + 4] = leaves[k - 1][0].to_bytes(4, "big")
        hidden, twice = leaves[k][1], leaves[k - 1][1]
    damaged = tmp_path / "damaged.sqlite"
    damaged.write_bytes(bytes(data))
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    dst.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES ('s', 'chaos s', 1, 1)")
    out = salvage(dst, damaged, now_ms=5)
    copied = dst.execute("SELECT count(*) FROM notifications").fetchone()[0]
    dst.close()
    rows = 30 if pointer == "leaf cell" else 200
    assert copied == out.copied["notifications"] == rows - hidden, out
    assert out.skipped["notifications"] == {"kept": twice, "hidden": hidden}, out


def test_a_row_whose_changed_byte_breaks_a_check_constraint_is_a_bad_value_not_kept(tmp_path: Path) -> None:
    """A random byte turned an approval's ``risk`` from ``low`` into ``lOw`` (corrupt mode, seed 1467108257): the
    row reads back well formed, the schema's CHECK refuses it, and OR IGNORE left it out silently, counted as
    ``kept`` (a row the rebuild wrote wins), which the boot report does not count as lost. It is ``badValue``
    now; a row the rebuilt index holds already stays ``kept``."""
    src = tmp_path / "old.sqlite"
    conn = sqlite3.connect(src, isolation_level=None)
    apply_schema(conn)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for rid, tool, decision in (("r-good", "Bash", "allow"), ("r-flipped", "Read", "aLlow"),
                                ("r-rebuilt", "Write", "deny")):
        conn.execute("INSERT INTO permission_rules(id, scope, tool, decision, created_at) "
                     "VALUES (?, 'global', ?, ?, 1)", (rid, tool, decision))
    conn.close()
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    dst.execute("INSERT INTO permission_rules(id, scope, tool, decision, created_at) "
                "VALUES ('r-rebuilt', 'global', 'Write', 'deny', 2)")
    out = salvage(dst, src, now_ms=5)
    rows = sorted(r[0] for r in dst.execute("SELECT id FROM permission_rules"))
    dst.close()
    assert rows == ["r-good", "r-rebuilt"], rows
    assert out.copied["permission_rules"] == 1 and out.skipped["permission_rules"] == {"badValue": 1, "kept": 1}, out


def _booted_with_quarantine(tmp_path: Path) -> tuple[DataDir, Path]:
    """A data directory booted once with one session, and its quarantine folder."""
    data = DataDir(tmp_path / "data")
    data.ensure()
    create_transcript(data.transcript("s-a"), "s-a", NOW, body_lines=[session_info_line({"title": "kept"}, NOW)])
    run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW).conn.close()
    q = data.quarantine_dir
    q.mkdir(exist_ok=True)
    return data, q


def test_quarantine_keeps_the_newest_three_index_copies_and_every_transcript_quarantine(tmp_path: Path) -> None:
    """Each corrupt index is moved whole into quarantine/ (as large as the index); a failing disk can make one
    per restart. Once the newest copy's salvage is done, boot deletes all but the newest 3 copies (by the time
    in their names, sidecars with them) and a kill's leftover ``.salvage-*`` scratch folder; a transcript's
    quarantined lines and checkpoints are never touched, nor a copy whose salvage is still owed."""
    data, q = _booted_with_quarantine(tmp_path)
    old = [f"pi.sqlite.corrupt-{NOW - 5000 + i}" for i in range(4)] + [f"pi.sqlite.corrupt-{NOW - 4000}.{NOW}"]
    for name in old:
        (q / name).write_bytes(b"x")
        (q / f"{name}-wal").write_bytes(b"w")
    user_files = ["s-a.jsonl.torn-5", "s-a.jsonl.inflight.7", "pi.sqlite.v30.bak", "notes.txt"]
    for name in user_files:
        (q / name).write_bytes(b"keep")
    (q / ".salvage-abc").mkdir()
    (q / ".salvage-abc" / "pi.sqlite").write_bytes(b"scratch")
    _damage_fts_pages(data.db_path)
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW)
    try:
        assert boot.report["dbRebuilt"] is True and "salvaged" in boot.report
        assert boot.report["quarantinePruned"] == 3  # 5 older + the new one: the newest 3 stay
        BootReport.model_validate(boot.report)  # as host.status serves it
    finally:
        boot.conn.close()
    left = sorted(p.name for p in q.iterdir())
    newest = [n for n in left if n.startswith("pi.sqlite.corrupt-") and not n.endswith(("-wal", "-shm"))]
    assert len(newest) == 3 and f"pi.sqlite.corrupt-{NOW - 4000}.{NOW}" in newest, left  # the new one + 2 old
    assert f"pi.sqlite.corrupt-{NOW - 5000 + 3}" in newest, left
    assert all(f"{n}-wal" in left for n in newest if n in old), left  # sidecars stay with their copy
    assert not any(n.startswith(f"pi.sqlite.corrupt-{NOW - 5000 + i}") for i in range(3) for n in left), left
    assert set(user_files) <= set(left) and ".salvage-abc" not in left


def test_a_boot_told_to_keep_quarantined_copies_prunes_none(tmp_path: Path) -> None:
    """``pi-host serve --keep-quarantined`` (``HostConfig.keep_quarantined``, for chaos runs whose losses are
    inspected in the copies afterwards): boot deletes no quarantined copy of the index, however many."""
    from runtime.cli import _parser
    from runtime.cli_serve import host_config

    data, q = _booted_with_quarantine(tmp_path)
    old = [f"pi.sqlite.corrupt-{NOW - 5000 + i}" for i in range(5)]
    for name in old:
        (q / name).write_bytes(b"x")
    _damage_fts_pages(data.db_path)
    boot = run_boot(data, faults=NO_FAULTS, now_ms=lambda: NOW, keep_quarantined=True)
    try:
        assert boot.report["dbRebuilt"] is True and "salvaged" in boot.report
        assert "quarantinePruned" not in boot.report
    finally:
        boot.conn.close()
    copies = [p.name for p in q.iterdir() if p.name.startswith("pi.sqlite.corrupt-") and "-" not in p.name[18:]]
    assert set(old) < set(copies) and len(copies) == 6, copies
    # the flag reaches the host's configuration; without it the newest few are kept, as before
    args = _parser().parse_args(["serve", "--keep-quarantined"])
    assert host_config(args, data).keep_quarantined is True
    assert host_config(_parser().parse_args(["serve"]), data).keep_quarantined is False


def test_a_copy_whose_salvage_is_owed_is_never_pruned(tmp_path: Path) -> None:
    from store.indexing.database import prune_quarantined

    q = tmp_path / "quarantine"
    q.mkdir()
    names = [f"pi.sqlite.corrupt-{t}" for t in (100, 200, 300, 400, 500)]
    for name in names:
        (q / name).write_bytes(b"x")
    assert prune_quarantined(q, "pi.sqlite", protect=q / names[0]) == [names[1]]
    assert sorted(p.name for p in q.iterdir()) == [names[0], *names[2:]]
    assert prune_quarantined(tmp_path / "none", "pi.sqlite") == []


@pytest.mark.parametrize("point", ["quarantine.after_rename", "db.quarantine.before_move", "db.quarantine.after_move",
                                   "boot.before_salvage_mark"])
async def test_a_boot_killed_between_quarantining_the_index_and_marking_its_salvage_still_salvages(
        tmp_path: Path, point: str) -> None:
    """Found by scripts/chaos --mode corrupt: a host killed right after it moved the corrupt index into
    quarantine/ and before the rebuilt index held the salvage's mark (its first transaction) booted next on a
    missing index, created it fresh, and salvaged nothing: every DB-only row (here a setting) was lost, and
    the quarantined copy was later pruned. The salvage is now owed in a file written before the move."""
    data = tmp_path / "data"
    data.mkdir()
    async with host(data) as (_proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        await c.call("settings.set", {"ns": "ui", "key": "sidebarWidth", "value": 321})
    _damage_fts_pages(data / "pi.sqlite")
    with pytest.raises(RuntimeError, match="exited with -9"):
        start_host_process(data, env={"RT_CRASHPOINT": f"{point}:1:kill"}, timeout=30)
    async with host(data) as (_proc, c):
        boot = (await c.call("host.status", {}))["boot"]
        assert boot.get("salvaged", {}).get("kv"), (boot["database"], boot.get("salvage"))
        assert (await c.call("settings.get", {"ns": "ui", "key": "sidebarWidth"}))["value"] == 321
    assert not (data / "quarantine" / "salvage-owed.json").exists()


async def test_a_boot_killed_before_a_fresh_index_s_first_transaction_still_treats_it_as_made_anew(
        tmp_path: Path) -> None:
    """An index lost (deleted, not corrupt): boot creates it fresh and owes it the steps of an index made anew
    (blob rows adopted from the files, the project-id floor, a new cursor identity, the deleted log,
    secrets_meta). Killed before its first transaction, the next boot found a well-formed empty index and took it
    for an ordinary one: blobs a message refers to had no rows (the GC takes such a file for an orphan of an
    interrupted put). The schema's own transaction now flags the index until those steps have run."""
    import base64

    data = tmp_path / "data"
    data.mkdir()
    body = b"attachment bytes kept across a lost index"
    async with host(data) as (_proc, c):
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        put = await c.call("attachments.put", {"name": "n.txt", "mimeType": "text/plain",
                                               "dataBase64": base64.b64encode(body).decode()})
        message = msg("m1", "see the file")
        message["blocks"].append({"type": "attachment", "kind": "file", "name": "n.txt",
                                  "ref": f"attachments/{put['sha256']}"})
        await c.call("session.appendMessage", {"sessionId": "s1", "message": message})
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
        (data / name).unlink(missing_ok=True)
    with pytest.raises(RuntimeError, match="exited with -9"):
        start_host_process(data, env={"RT_CRASHPOINT": "boot.before_salvage_mark:1:kill"}, timeout=30)
    async with host(data) as (_proc, c):
        boot = (await c.call("host.status", {}))["boot"]
        assert not boot["database"]["createdFresh"]  # the killed boot made it
        assert boot["attachmentsAdopted"] and boot["attachmentsAdopted"]["adopted"] == 1, boot["attachmentsAdopted"]
        assert "projectIdFloor" in boot
        got = await c.call("attachments.get", {"sha256": put["sha256"]})
        assert got["sha256"] == put["sha256"]
    async with host(data) as (_proc, c):  # the steps ran once: an ordinary start after that
        boot = (await c.call("host.status", {}))["boot"]
        assert boot["attachmentsAdopted"] is None and "projectIdFloor" not in boot, boot


def _ledger_source(src: Path, rows: int) -> tuple[int, list[int]]:
    """A fresh index at ``src`` holding ``rows`` collaboration deliveries (a rowid table with a text primary
    key): its page size and the leaf pages of the primary key's index, in key order."""
    conn = sqlite3.connect(src, isolation_level=None)
    apply_schema(conn)
    conn.execute("BEGIN")
    for sid in ("sa", "sb"):
        conn.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?, 't', 1, 1)", (sid,))
    for i in range(rows):
        conn.execute(
            "INSERT INTO session_collaboration_messages(id, plugin_id, source_session_id, source_title, "
            "target_session_id, target_title, kind, content, status, idempotency_key, remaining_hops, "
            "permission_ceiling, created_at, updated_at) VALUES (?, 'chaos', 'sa', 't', 'sb', 't', 'task', ?, "
            "'completed', ?, 4, 'ask', 1, 1)", (f"d{i:05d}", "c" * 100, f"key-{i:05d}"))
    conn.execute("COMMIT")
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    leaves = [int(r[0]) for r in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'sqlite_autoindex_session_collaboration_messages_1' "
        "AND pagetype = 'leaf' ORDER BY path")]
    conn.close()
    return page_size, leaves


@pytest.mark.parametrize("where", ["cell pointers", "entry text", "entry text and rowid"])
def test_rows_whose_index_entries_are_damaged_are_salvaged_whole(tmp_path: Path, where: str) -> None:
    """Corrupt mode's lead: a delivery acknowledged before the damage was gone after the rebuild although its
    row read back whole. The damage was in a page of the table's *index*, not of the table: ``integrity_check``
    names the rows whose entries it held as missing from that index, and the salvage left them out as
    ``inconsistent`` (a byte changed inside the row) when the row was right and its index entry wrong. An index
    whose b-tree no longer reads, or whose entry holds text that is not UTF-8 where the row's is, cannot testify
    against a row: every delivery comes back. (A byte changed inside a row stays ``inconsistent``:
    test_integrity_sweep.py.)"""
    src = tmp_path / "old.sqlite"
    page_size, leaves = _ledger_source(src, 600)
    leaf = leaves[len(leaves) // 2]
    with open(src, "r+b") as f:
        f.seek((leaf - 1) * page_size)
        page = f.read(page_size)
        if where == "cell pointers":  # cell offsets out of range: the index's b-tree no longer reads
            at, length = 200, 8
        else:  # one entry's id (and, with it, the rowid stored right after it) overwritten
            at = page.find(b"d00")
            assert at > 0
            length = 6 if where == "entry text" else 8
        f.seek((leaf - 1) * page_size + at)
        f.write(b"\xa5" * length)
    conn = sqlite3.connect(src)
    problems = [str(r[0]) for r in conn.execute("PRAGMA integrity_check(session_collaboration_messages)")]
    conn.close()
    assert any("missing from index sqlite_autoindex_session_collaboration_messages_1" in p for p in problems)
    dst = sqlite3.connect(tmp_path / "new.sqlite", isolation_level=None)
    apply_schema(dst)
    for sid in ("sa", "sb"):
        dst.execute("INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?, 't', 1, 1)", (sid,))
    out = salvage(dst, src, now_ms=5)
    ids = [r[0] for r in dst.execute("SELECT id FROM session_collaboration_messages ORDER BY id")]
    dst.close()
    assert ids == [f"d{i:05d}" for i in range(600)], (len(ids), out)
    assert out.copied["session_collaboration_messages"] == 600
    assert "session_collaboration_messages" not in out.skipped, out
