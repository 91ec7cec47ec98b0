"""A pi-desktop data directory at any seed schema version (seed 003 §2, §4, §7).

The DDL comes from ``seed_sql/v<n>.sql`` (written by hand out of the seed,
never from this host's ``store.upgrade.schema``); the rows fill every table the version
has: sessions in each mode, the settings blob with every setting the seed
names, tasks of each cadence with ``chat`` modes, plan approvals of each state,
providers, models, secrets bookkeeping, notifications, queue entries and
collaboration rows where the version has them. Each session gets a transcript
in the seed's own line format (a header without ``epoch``, a line written
before ``type`` came first, a tool line without ``createdAt``, a compaction
line), a revisions file, a scratch directory and a review snapshot; the
secrets directory holds seed-layout ciphertexts (``secrets/<sha256(ref)>``).

:func:`expected_rows` says what every row must look like after the chain
(the guarded step's mappings and the defaults of added columns);
:func:`after_boot` adds what the boot fence does to it (seed §3, §11.18).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store import tasks

SEED_SQL = Path(__file__).resolve().parent / "seed_sql"
VERSIONS = (7, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19)
DAY_MS = 86_400_000

PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "kv": ("ns", "key"),
    "projects": ("id",),
    "providers": ("id",),
    "models": ("provider_id", "model_id"),
    "sessions": ("id",),
    "session_import_origins": ("session_id",),
    "turns": ("id",),
    "plan_approvals": ("request_id",),
    "turn_queue": ("id",),
    "session_collaboration_links": ("session_id",),
    "session_collaboration_messages": ("id",),
    "messages": ("id",),
    "message_revisions": ("id",),
    "artifacts": ("session_id", "path"),
    "scheduled_tasks": ("id",),
    "task_runs": ("id",),
    "secrets_meta": ("secret_ref",),
    "audit_log": ("id",),
    "notifications": ("id",),
}

# The settings the seed names for the app blob (§4.1, §7, §11, D340, ADR 0121).
SHELL_FOR_PLATFORM = {"linux": "bash", "darwin": "zsh", "win32": "powershell"}


def seed_sql(version: int) -> str:
    return (SEED_SQL / f"v{version}.sql").read_text(encoding="utf-8")


def section(version: int, marker: str) -> str:
    """The statements between ``-- <marker>`` and the next ``-- §`` heading of a seed SQL file."""
    text = seed_sql(version)
    start = text.index(f"-- {marker}\n")
    end = text.find("\n-- §", start + 1)
    return text[start : end if end >= 0 else len(text)]


def seed_tables(version: int) -> set[str]:
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(seed_sql(version))
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                if not r[0].startswith("messages_fts")}
    finally:
        conn.close()


def create_seed_db(path: Path, version: int, *, statements: str | None = None) -> None:
    """The file a seed-era host-core creates: §3 bootstrap, the DDL, ``user_version``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(statements if statements is not None else seed_sql(version))
        conn.execute(f"PRAGMA user_version = {version}")
    finally:
        conn.close()


def _rfc(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@dataclass
class Msg:
    id: str
    role: str
    blocks: list[dict[str, Any]]
    created: int | None  # None: the line has no createdAt (older tool lines)
    row_created: int
    text: str | None
    turn_id: str | None = None
    tool_name: str | None = None
    is_error: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    legacy_order: bool = False  # `type` written after the payload
    index_id: str | None = None  # the index row's id when it differs (D444)


@dataclass
class SeedDir:
    root: Path
    version: int
    platform: str
    rows: dict[str, list[dict[str, Any]]]
    files: dict[str, bytes]

    @property
    def db(self) -> Path:
        return self.root / "pi.sqlite"

    def file_bytes(self) -> dict[str, bytes]:
        """The current bytes of every file the fixture wrote (besides the database)."""
        return {rel: (self.root / rel).read_bytes() for rel in self.files}


def _sessions(version: int, base: int) -> list[dict[str, Any]]:
    if version == 7:
        modes = {"s-alpha": "chat", "s-beta": "agent", "s-gamma": "chat", "s-delta": "agent"}
    elif version <= 10:
        modes = {"s-alpha": "chat", "s-beta": "agent", "s-gamma": "plan", "s-delta": "chat"}
    else:
        modes = {"s-alpha": "plan", "s-beta": "agent", "s-gamma": "goal", "s-delta": "plan"}
    rows = [
        {"id": "s-alpha", "title": "迁移 alpha", "project_id": 1, "provider_id": "p-openai", "model_id": "gpt-x",
         "mode": modes["s-alpha"], "thinking_level": "high", "permission_mode": "ask", "source": None,
         "pinned": 1, "last_seq": 5, "created_at": base, "updated_at": base + 60_000},
        {"id": "s-beta", "title": "beta", "project_id": 2, "provider_id": "pi", "model_id": "pi-default",
         "mode": modes["s-beta"], "thinking_level": "off", "permission_mode": "auto", "source": "claude-code",
         "pinned": 0, "last_seq": 2, "created_at": base + 1_000, "updated_at": base + 70_000},
        {"id": "s-gamma", "title": "", "project_id": None, "provider_id": None, "model_id": None,
         "mode": modes["s-gamma"], "thinking_level": "medium", "permission_mode": "inherit", "source": "codex",
         "pinned": 0, "last_seq": 1, "created_at": base + 2_000, "updated_at": base + 80_000},
        {"id": "s-delta", "title": "empty delta", "project_id": 1, "provider_id": "p-local", "model_id": "llama",
         "mode": modes["s-delta"], "thinking_level": "xhigh", "permission_mode": "accept-edits", "source": None,
         "pinned": 0, "last_seq": 0, "created_at": base + 3_000, "updated_at": base + 3_000},
    ]
    if version >= 14:
        for row in rows:
            row["deleted_at"] = None
        rows += [
            {"id": "s-import", "title": "imported", "project_id": None, "provider_id": None, "model_id": None,
             "mode": "agent", "thinking_level": "low", "permission_mode": "inherit", "source": "pi", "pinned": 0,
             "last_seq": 1, "created_at": base + 4_000, "updated_at": base + 90_000, "deleted_at": None},
            {"id": "s-trash", "title": "trashed plugin session", "project_id": None, "provider_id": None,
             "model_id": None, "mode": "agent", "thinking_level": "minimal", "permission_mode": "inherit",
             "source": "pi", "pinned": 0, "last_seq": 1, "created_at": base + 5_000, "updated_at": base + 95_000,
             "deleted_at": base + 96_000},
        ]
    if version >= 19:  # §4.5 / ADR 0295: send no thinking override
        next(r for r in rows if r["id"] == "s-import")["thinking_level"] = "omit"
    return rows


def _messages(version: int, base: int) -> dict[str, list[Msg]]:
    out: dict[str, list[Msg]] = {
        "s-alpha": [
            Msg("m-a1", "user", [{"type": "text", "text": "你好，请把数据库迁移到新版本"}],
                base + 10_000, base + 10_000, "你好，请把数据库迁移到新版本"),
            Msg("m-a2", "assistant", [{"type": "thinking", "text": "secret reasoning"},
                                      {"type": "text", "text": "Migration plan ready."}],
                base + 11_000, base + 11_000, "Migration plan ready.", turn_id="t-alpha-1",
                extra={"meta": {"usage": {"input": 120, "output": 40}, "modelId": "gpt-x"}}),
            Msg("m-a3", "tool", [{"type": "tool_call", "callId": "c1", "name": "Write",
                                  "args": {"path": "/work/alpha/README.md"}, "result": {"ok": True},
                                  "status": "ok"}],
                None, base + 12_000, None, turn_id="t-alpha-1", tool_name="Write", extra={"toolName": "Write"}),
            Msg("m-a4", "user", [{"type": "text", "text": "legacy line order"}], base + 13_000, base + 13_000,
                "legacy line order", legacy_order=True),
            Msg("m-a5", "assistant", [{"type": "text", "text": "failed reply"}], base + 14_000, base + 14_000,
                "failed reply", turn_id="t-alpha-2", is_error=1,
                extra={"meta": {"status": "error", "isError": True}}),
        ],
        "s-beta": [
            Msg("m-shared", "user", [{"type": "text", "text": "see attached"},
                                     {"type": "attachment", "kind": "file", "name": "notes.txt",
                                      "ref": f"attachments/{ATTACHMENT_SHA}", "mimeType": "text/plain",
                                      "size": len(ATTACHMENT_BYTES)}],
                base + 20_000, base + 20_000, "see attached"),
            Msg("m-b2", "assistant", [{"type": "text", "text": "Noted."}], base + 21_000, base + 21_000, "Noted.",
                turn_id="t-beta-1"),
        ],
        "s-gamma": [
            Msg("m-shared", "user", [{"type": "text", "text": "same id, other session"}], base + 30_000,
                base + 30_000, "same id, other session", index_id="s-gamma:m-shared"),
        ],
        "s-delta": [],
    }
    if version >= 14:
        out["s-import"] = [Msg("m-i1", "user", [{"type": "text", "text": "imported prompt"}], base + 40_000,
                               base + 40_000, "imported prompt")]
        out["s-trash"] = [Msg("m-t1", "user", [{"type": "text", "text": "trashed prompt"}], base + 41_000,
                              base + 41_000, "trashed prompt")]
    return out


ATTACHMENT_BYTES = b"attachment bytes \xe2\x9c\x93\n"
ATTACHMENT_SHA = hashlib.sha256(ATTACHMENT_BYTES).hexdigest()


def _transcript(sid: str, created: int, msgs: list[Msg], *, compaction: bool) -> bytes:
    lines = [_line({"type": "session", "schema": 1, "sessionId": sid, "createdAt": _rfc(created)})]
    for m in msgs:
        rec: dict[str, Any] = {"type": "message", "id": m.id, "role": m.role}
        if m.created is not None:
            rec["createdAt"] = _rfc(m.created)
        rec["blocks"] = m.blocks
        rec.update(m.extra)
        if m.legacy_order:
            rec = {k: v for k, v in rec.items() if k != "type"} | {"type": "message"}
        lines.append(_line(rec))
    if compaction:
        lines.append(_line({"type": "compaction", "id": "cp1", "summary": "earlier work summarised",
                            "firstKeptMessageId": "m-a4", "throughMessageId": "m-a3", "tokensBefore": 917000,
                            "retainedTail": [], "providerId": "p-openai", "modelId": "gpt-x",
                            "createdAt": _rfc(created + 13_500)}))
    return b"".join(lines)


def _settings(version: int, platform: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "defaultMode": "chat" if version <= 10 else "plan",
        "defaultCommandShell": SHELL_FOR_PLATFORM[platform],
        "thinkingDisplayMode": "compact",
        "promptEnhancementCustomTemplate": True,
        "promptEnhancementUserTemplate": "Improve this prompt: {{draft}}",
        "promptEnhancementProviderId": "p-openai",
        "promptEnhancementModelId": "gpt-x",
        "promptEnhancementThinkingLevel": "low",
        "promptEnhancementSystemPrompt": "no longer read",
        "largePasteThreshold": 1200,
        "networkProxy": {"mode": "manual", "url": "http://127.0.0.1:3128", "bypass": ["localhost"]},
        "language": "zh-CN",
    }
    if version <= 10:
        settings["planApprovalPermissionMode"] = "accept-edits"
    return settings


def build_rows(version: int, base: int, platform: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table ``version`` has (messages come from the transcripts)."""
    tables = seed_tables(version)
    chat_or_plan = "chat" if version <= 10 else "plan"
    rows: dict[str, list[dict[str, Any]]] = {}
    rows["kv"] = [
        {"ns": "app", "key": "settings", "value_json": json.dumps(_settings(version, platform), ensure_ascii=False),
         "updated_at": base},
        {"ns": "app", "key": "currentProjectId", "value_json": "1", "updated_at": base},
        {"ns": "app", "key": "providers.order", "value_json": '["p-openai","p-local"]', "updated_at": base},
        {"ns": "ui", "key": "sidebar", "value_json": '{"collapsed":false}', "updated_at": base},
        {"ns": "cache", "key": "recentModels", "value_json": '[["p-openai","gpt-x"]]', "updated_at": base},
        {"ns": "plugin:acme", "key": "config", "value_json": '{"enabled":true,"mode":"chat"}', "updated_at": base},
        {"ns": "projectMemory", "key": "/work/alpha",
         "value_json": json.dumps({"format": "entries-v1", "entries": [{"title": "db", "body": "use WAL"}],
                                   "content": "use WAL", "updatedAt": base}), "updated_at": base},
        {"ns": "projectGroups", "key": "g-1",
         "value_json": json.dumps({"id": "g-1", "name": "work", "roots": ["/work/alpha", "/work/beta"],
                                   "primaryRoot": "/work/alpha", "detachedPaths": []}), "updated_at": base},
        {"ns": "configSync", "key": "state", "value_json": '{"enabled":false}', "updated_at": base},
    ]
    rows["projects"] = [
        {"id": 1, "path": "/work/alpha", "name": "alpha", "pinned": 0, "created_at": base, "last_opened_at": base},
        {"id": 2, "path": "/work/beta", "name": "beta", "pinned": 1, "created_at": base, "last_opened_at": base + 5},
    ]
    rows["providers"] = [
        {"id": "p-openai", "name": "OpenAI", "vendor_key": "openai", "type": "openai_compatible",
         "protocol": "openai_responses", "api_style": "responses", "auth_kind": "api_key", "base_url": None,
         "enabled": 1, "secret_ref": "provider:p-openai", "default_model_id": "gpt-x",
         "config_json": '{"headers":{"x-org":"acme"}}', "created_at": base, "updated_at": base},
        {"id": "p-local", "name": "Local", "vendor_key": "custom", "type": "openai_compatible",
         "protocol": "openai_compatible", "api_style": None, "auth_kind": "api_key_and_base_url",
         "base_url": "http://127.0.0.1:11434/v1", "enabled": 0, "secret_ref": None, "default_model_id": None,
         "config_json": "{}", "created_at": base + 1, "updated_at": base + 2},
    ]
    if version >= 17:
        for row in rows["providers"]:
            row["owner_plugin_id"] = None
        rows["providers"].append(
            {"id": "p-plugin", "name": "Plugin provider", "vendor_key": "custom", "type": "openai_compatible",
             "protocol": "openai_compatible", "api_style": None, "auth_kind": "none", "base_url": None,
             "enabled": 1, "secret_ref": None, "default_model_id": None, "config_json": "{}",
             "created_at": base + 3, "updated_at": base + 3, "owner_plugin_id": "acme"})
    rows["models"] = [
        {"provider_id": "p-openai", "model_id": "gpt-x", "display_name": "GPT X", "source": "bundled",
         "capabilities_json": '["vision","tools"]', "context_window": 200000, "max_output_tokens": 32000,
         "deprecated": 0, "updated_at": base},
        {"provider_id": "p-openai", "model_id": "gpt-mini", "display_name": "GPT mini", "source": "discovered",
         "capabilities_json": "[]", "context_window": None, "max_output_tokens": None, "deprecated": 1,
         "updated_at": base},
        {"provider_id": "p-local", "model_id": "llama", "display_name": "Llama", "source": "user",
         "capabilities_json": '["tools"]', "context_window": 8192, "max_output_tokens": 2048, "deprecated": 0,
         "updated_at": base},
    ]
    rows["sessions"] = _sessions(version, base)
    if "session_import_origins" in tables:
        rows["session_import_origins"] = [
            {"plugin_id": "acme", "source_id": "claude", "external_id": "ext-1", "session_id": "s-import",
             "source_label": "Claude Code", "origin_json": '{"projectPath":"/old","modelId":"m"}',
             "created_at": base + 4_000},
            {"plugin_id": "acme", "source_id": "claude", "external_id": "ext-2", "session_id": "s-trash",
             "source_label": None, "origin_json": None, "created_at": base + 5_000},
        ]
    rows["turns"] = [
        {"id": "t-alpha-1", "session_id": "s-alpha", "status": "completed", "provider_id": "p-openai",
         "model_id": "gpt-x", "error_code": None, "input_tokens": 120, "output_tokens": 40,
         "usage_json": '{"cached":10}', "started_at": base + 10_500, "ended_at": base + 12_500},
        {"id": "t-alpha-2", "session_id": "s-alpha", "status": "error", "provider_id": "p-openai",
         "model_id": "gpt-x", "error_code": "PROVIDER_ERROR", "input_tokens": 5, "output_tokens": 0,
         "usage_json": None, "started_at": base + 13_500, "ended_at": base + 14_500},
        {"id": "t-beta-1", "session_id": "s-beta", "status": "aborted", "provider_id": "pi", "model_id": None,
         "error_code": None, "input_tokens": 0, "output_tokens": 0, "usage_json": None,
         "started_at": base + 20_500, "ended_at": base + 21_500},
        {"id": "t-gamma-1", "session_id": "s-gamma", "status": "running", "provider_id": None, "model_id": None,
         "error_code": None, "input_tokens": 0, "output_tokens": 0, "usage_json": None,
         "started_at": base + 30_500, "ended_at": None},
    ]
    if "plan_approvals" in tables:
        rows["plan_approvals"] = _plan_approvals(version, base)
    if "turn_queue" in tables:
        queue = [
            {"id": "q-1", "session_id": "s-alpha", "principal": "agent-host", "idempotency_key": "k1",
             "input_hash": "h1", "content": "next prompt", "attachments_json": None, "permission_mode": "ask",
             "position": 1, "created_at": base + 15_000},
            {"id": "q-2", "session_id": "s-alpha", "principal": "agent-host", "idempotency_key": None,
             "input_hash": "h2", "content": "send now", "attachments_json": '[{"ref":"scratch/x"}]',
             "permission_mode": "auto", "position": 2, "created_at": base + 15_500},
        ]
        if version >= 16:
            for row in queue:
                row["session_message_id"] = None
            queue.append({"id": "q-3", "session_id": "s-beta", "principal": "plugin:acme",
                          "idempotency_key": "cm-1", "input_hash": "h3", "content": "delegated task",
                          "attachments_json": None, "permission_mode": "ask", "position": 1,
                          "created_at": base + 16_000, "session_message_id": "cm-1"})
        if version >= 18:  # §4.6b / ADR 0265: q-2 was promoted with "send now"
            for row in queue:
                row["priority"] = 1 if row["id"] == "q-2" else None
        rows["turn_queue"] = queue
    if "session_collaboration_links" in tables:
        rows["session_collaboration_links"] = [
            {"session_id": "s-beta", "created_by_session_id": "s-alpha", "plugin_id": "acme",
             "created_at": base + 16_000}]
        collab = {"plugin_id": "acme", "notify_on_completion": 0, "remaining_hops": 2,
                  "permission_ceiling": "ask", "result": None, "error": None, "reply_to_message_id": None}
        rows["session_collaboration_messages"] = [
            {**collab, "id": "cm-1", "source_session_id": "s-alpha", "source_title": "迁移 alpha",
             "target_session_id": "s-beta", "target_title": "beta", "kind": "task", "content": "delegated task",
             "status": "queued", "notify_on_completion": 1, "turn_id": None, "idempotency_key": "idem-1",
             "created_at": base + 16_000, "updated_at": base + 16_000},
            {**collab, "id": "cm-2", "source_session_id": "s-gone", "source_title": "deleted sender",
             "target_session_id": "s-gamma", "target_title": "", "kind": "message", "content": "running work",
             "status": "running", "turn_id": "t-gamma-1", "idempotency_key": "idem-2",
             "created_at": base + 30_400, "updated_at": base + 30_500},
            {**collab, "id": "cm-3", "source_session_id": "s-beta", "source_title": "beta",
             "target_session_id": "s-alpha", "target_title": "迁移 alpha", "kind": "completion",
             "content": "done", "status": "completed", "turn_id": None, "reply_to_message_id": "cm-0",
             "idempotency_key": "idem-3", "remaining_hops": 0, "result": "all good",
             "created_at": base + 17_000, "updated_at": base + 17_500},
        ]
    rows["message_revisions"] = [
        {"id": "rev-alpha-1", "session_id": "s-alpha", "root_user_id": "m-a1", "revision_index": 1,
         "is_active": 0, "message_count": 1, "created_at": base + 12_600}]
    rows["artifacts"] = [
        {"session_id": "s-alpha", "path": "/work/alpha/README.md", "op": "write", "turn_id": "t-alpha-1",
         "updated_at": base + 12_000},
        {"session_id": "s-alpha", "path": "/work/alpha/old.txt", "op": "delete", "turn_id": None,
         "updated_at": base + 12_100},
    ]
    rows["scheduled_tasks"] = [
        {"id": "task-manual", "title": "Manual", "prompt": "summarise", "cadence": "manual", "enabled": 1,
         "project_id": 1, "config_json": json.dumps({"mode": chat_or_plan, "extension": {"mode": "chat"},
                                                     "notify": "always"}),
         "last_run_at": base + 50_000, "created_at": base, "updated_at": base},
        {"id": "task-hourly", "title": "Hourly", "prompt": "check", "cadence": "hourly", "enabled": 1,
         "project_id": None, "config_json": json.dumps({"mode": "agent", "nextRunAt": base + 30 * DAY_MS}),
         "last_run_at": None, "created_at": base, "updated_at": base},
        {"id": "task-daily", "title": "Daily", "prompt": "report", "cadence": "daily", "enabled": 0,
         "project_id": 2, "config_json": json.dumps({
             "mode": "chat" if version <= 10 else "goal", "schedule": {"hour": 9, "minute": 30},
             "workspacePath": "/work/beta", "permissionMode": "ask", "providerId": "p-openai",
             "modelId": "gpt-x", "thinkingLevel": "high"}),
         "last_run_at": None, "created_at": base, "updated_at": base + 1},
        {"id": "task-weekly", "title": "Weekly", "prompt": "plan the week", "cadence": "weekly", "enabled": 1,
         "project_id": None, "config_json": json.dumps({"schedule": {"hour": 8, "minute": 0, "weekday": 1},
                                                        "weekdays": [1, 3, 5]}),
         "last_run_at": None, "created_at": base, "updated_at": base},
    ]
    rows["task_runs"] = [
        {"id": "run-1", "task_id": "task-manual", "session_id": "s-alpha", "status": "completed",
         "error_code": None, "started_at": base + 50_000, "ended_at": base + 51_000},
        {"id": "run-2", "task_id": "task-hourly", "session_id": None, "status": "running", "error_code": None,
         "started_at": base + 52_000, "ended_at": None},
        {"id": "run-3", "task_id": "task-daily", "session_id": "s-beta", "status": "error",
         "error_code": "PLAN_REQUIRES_INTERACTIVE_SESSION", "started_at": base + 53_000, "ended_at": base + 53_001},
    ]
    rows["secrets_meta"] = [
        {"secret_ref": "provider:p-openai", "owner_kind": "provider", "owner_id": "p-openai", "kind": "api_key",
         "backend": "file_fallback", "updated_at": base},
        {"secret_ref": "plugin:acme:token", "owner_kind": "plugin", "owner_id": "acme", "kind": "token",
         "backend": "file_fallback", "updated_at": base + 1},
    ]
    rows["audit_log"] = [
        {"id": 1, "ts": base + 12_000, "kind": "tool_execute", "session_id": "s-alpha",
         "payload_json": '{"tool":"Write","path":"/work/alpha/README.md"}'},
        {"id": 2, "ts": base + 12_050, "kind": "tool_denied", "session_id": "s-beta", "payload_json": "{}"},
        {"id": 3, "ts": base + 12_060, "kind": "settings_changed", "session_id": None,
         "payload_json": '{"key":"language"}'},
    ]
    rows["notifications"] = [
        {"id": "n-1", "kind": "task.completed", "session_id": "s-alpha", "session_title": "迁移 alpha",
         "turn_id": "t-alpha-1", "error_code": None, "created_at": base + 12_500, "read_at": base + 13_000},
        {"id": "n-2", "kind": "task.failed", "session_id": "s-alpha", "session_title": "",
         "turn_id": "t-alpha-2", "error_code": "PROVIDER_ERROR", "created_at": base + 14_500, "read_at": None},
    ]
    missing = tables - set(rows) - {"messages"}
    assert not missing, f"fixture has no rows for {missing}"
    return rows


def _plan_approvals(version: int, base: int) -> list[dict[str, Any]]:
    common = {"action": None, "target_permission_mode": None, "feedback": None, "expires_at": None,
              "resolved_at": None, "error_code": None}
    rows = [
        {**common, "request_id": "pa-1", "session_id": "s-gamma", "turn_id": "t-gamma-1",
         "tool_call_id": "call-pa-1", "plan_json": "# Plan\n\n1. migrate\n", "status": "pending",
         "created_at": base + 30_600, "updated_at": base + 30_600, "expires_at": base + 30_600 + 3_600_000},
        {**common, "request_id": "pa-2", "session_id": "s-alpha", "turn_id": "t-alpha-1",
         "tool_call_id": "call-pa-2", "plan_json": "# Approved plan\n", "status": "approved", "action": "approve",
         "target_permission_mode": "auto", "created_at": base + 10_600, "updated_at": base + 10_700,
         "resolved_at": base + 10_700},
        {**common, "request_id": "pa-3", "session_id": "s-alpha", "turn_id": "t-alpha-2",
         "tool_call_id": "call-pa-3", "plan_json": "# Rejected\n", "status": "rejected", "action": "reject",
         "feedback": "no", "created_at": base + 13_600, "updated_at": base + 13_700, "resolved_at": base + 13_700},
        {**common, "request_id": "pa-4", "session_id": "s-beta", "turn_id": "t-beta-1",
         "tool_call_id": "call-pa-4", "plan_json": "# Expired\n", "status": "expired",
         "created_at": base + 20_600, "updated_at": base + 20_700, "expires_at": base + 20_650,
         "error_code": "EXPIRED"},
        {**common, "request_id": "pa-5", "session_id": "s-beta", "turn_id": "t-beta-1",
         "tool_call_id": "call-pa-5", "plan_json": "# Interrupted\n", "status": "interrupted",
         "created_at": base + 20_800, "updated_at": base + 20_900, "resolved_at": base + 20_900},
        {**common, "request_id": "pa-6", "session_id": "s-delta", "turn_id": "t-delta-0",
         "tool_call_id": "call-pa-6", "plan_json": "# Changes\n", "status": "changes_requested",
         "action": "request_changes", "feedback": "shorter please", "created_at": base + 3_100,
         "updated_at": base + 3_200, "resolved_at": base + 3_200},
    ]
    if version >= 9:
        for i, row in enumerate(rows):
            row["title"] = f"Plan {i + 1}"
            row["question"] = "Proceed?" if i % 2 == 0 else ""
    if version >= 10:
        for row in rows:
            row["artifact_relative_path"] = None
            row["artifact_sha256"] = None
            row["artifact_size_bytes"] = None
        rows[1].update({"artifact_relative_path": ".pi/plan/approved-1.md",
                        "artifact_sha256": hashlib.sha256(b"# Approved plan\n").hexdigest(),
                        "artifact_size_bytes": len(b"# Approved plan\n")})
    if version >= 11:
        for row in rows:
            row.update({"kind": "plan", "version": 1, "execution_id": None, "execution_state": None})
        rows[1].update({"execution_id": "exec-2", "execution_state": "queued"})
        rows[2].update({"kind": "goal", "artifact_relative_path": ".pi/goal/rejected.md"})
        rows.append({**common, "request_id": "pa-7", "session_id": "s-beta", "turn_id": "t-beta-1",
                     "tool_call_id": "call-pa-7", "kind": "goal", "plan_json": "# Goal\n", "title": "Goal",
                     "question": "", "status": "approved", "action": "approve", "target_permission_mode": "ask",
                     "created_at": base + 21_000, "updated_at": base + 21_100, "resolved_at": base + 21_100,
                     "artifact_relative_path": ".pi/goal/g.md", "artifact_sha256": "0" * 64,
                     "artifact_size_bytes": 7, "version": 2, "execution_id": "exec-7",
                     "execution_state": "running"})
        rows.append({**common, "request_id": "pa-8", "session_id": "s-alpha", "turn_id": "t-alpha-1",
                     "tool_call_id": "call-pa-8", "kind": "plan", "plan_json": "# Done\n", "title": "Done",
                     "question": "", "status": "approved", "action": "approve", "target_permission_mode": "ask",
                     "created_at": base + 11_100, "updated_at": base + 11_200, "resolved_at": base + 11_200,
                     "artifact_relative_path": None, "artifact_sha256": None, "artifact_size_bytes": None,
                     "version": 1, "execution_id": "exec-8", "execution_state": "completed"})
    return rows


def _insert(conn: sqlite3.Connection, table: str, row: dict[str, Any]) -> None:
    columns = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    unknown = set(row) - columns
    assert not unknown, f"fixture bug: {table} has no column(s) {unknown}"
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(row.values()))


TABLE_ORDER = ("kv", "projects", "providers", "models", "sessions", "session_import_origins", "turns",
               "plan_approvals", "turn_queue", "session_collaboration_links", "session_collaboration_messages",
               "messages", "message_revisions", "artifacts", "scheduled_tasks", "task_runs", "secrets_meta",
               "audit_log", "notifications")


def _write(root: Path, rel: str, data: bytes, files: dict[str, bytes]) -> None:
    path = root / rel
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    files[rel] = data


def build_seed_dir(
    root: Path,
    version: int,
    *,
    platform: str = "linux",
    base_ms: int | None = None,
    tweak: Callable[[dict[str, list[dict[str, Any]]]], None] | None = None,
    statements: str | None = None,
) -> SeedDir:
    """A complete seed-era data directory at ``version``; ``tweak`` may edit the rows first."""
    base = base_ms if base_ms is not None else int(time.time() * 1000) - DAY_MS
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    rows = build_rows(version, base, platform)
    files: dict[str, bytes] = {}
    msgs = _messages(version, base)
    message_rows: list[dict[str, Any]] = []
    mid = 0
    for srow in rows["sessions"]:
        sid = srow["id"]
        session_msgs = msgs[sid]
        assert srow["last_seq"] == len(session_msgs), sid
        for seq, m in enumerate(session_msgs, start=1):
            mid += 1
            message_rows.append({"mid": mid, "id": m.index_id or m.id, "session_id": sid, "turn_id": m.turn_id,
                                 "seq": seq, "role": m.role, "tool_name": m.tool_name, "is_error": m.is_error,
                                 "text": m.text, "created_at": m.row_created})
        _write(root, f"sessions/{sid}.jsonl",
               _transcript(sid, srow["created_at"], session_msgs, compaction=sid == "s-alpha"), files)
    rows["messages"] = message_rows
    _write(root, "sessions/s-alpha.revisions.jsonl", _line({
        "type": "revision", "rootUserId": "m-a1", "revisionIndex": 1, "createdAt": _rfc(base + 12_600),
        "messages": [{"type": "message", "id": "m-a2-old", "role": "assistant", "createdAt": _rfc(base + 10_900),
                      "blocks": [{"type": "text", "text": "an earlier variant"}]}],
        "turns": {"m-a2-old": "t-alpha-1"}}), files)
    _write(root, f"attachments/{ATTACHMENT_SHA}", ATTACHMENT_BYTES, files)
    _write(root, "scratch/s-alpha/pasted/paste-1.txt", b"pasted text\n", files)
    _write(root, "review-changes/s-alpha/snap-1/before", b"old README\n", files)
    _write(root, "review-changes/s-alpha/snap-1/meta.json",
           _line({"path": "/work/alpha/README.md", "sessionId": "s-alpha"}), files)
    _write(root, "secrets/.machine-key", bytes(range(32)), files)
    for secret in rows["secrets_meta"]:
        digest = hashlib.sha256(secret["secret_ref"].encode()).hexdigest()
        _write(root, f"secrets/{digest}", b"seed-format ciphertext for " + secret["secret_ref"].encode(), files)
    _write(root, "logs/app/main.ndjson", _line({"ts": base, "level": "info", "msg": "electron log"}), files)
    if tweak is not None:
        tweak(rows)
    create_seed_db(root / "pi.sqlite", version, statements=statements)
    conn = sqlite3.connect(root / "pi.sqlite", isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("BEGIN")
        for table in TABLE_ORDER:
            for row in rows.get(table, []):
                _insert(conn, table, row)
        conn.execute("COMMIT")
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    finally:
        conn.close()
    for name in ("pi.sqlite-wal", "pi.sqlite-shm"):
        assert not (root / name).exists(), "the fixture database must be closed cleanly (WAL checkpointed)"
    return SeedDir(root=root, version=version, platform=platform, rows=rows, files=files)


# --- what the migrated database must hold --------------------------------------


def _map_mode(value: Any) -> Any:
    return "plan" if value == "chat" else value


def expected_rows(seed: SeedDir) -> dict[str, list[dict[str, Any]]]:
    """Every seed row as the chain must leave it: the guarded mappings, added columns' defaults."""
    out = copy.deepcopy(seed.rows)
    if seed.version <= 10:
        for row in out["sessions"]:
            row["mode"] = _map_mode(row["mode"])
        for row in out["kv"]:
            if (row["ns"], row["key"]) == ("app", "settings"):
                settings = json.loads(row["value_json"])
                settings["defaultMode"] = _map_mode(settings["defaultMode"])
                settings.pop("planApprovalPermissionMode", None)
                row["value_json"] = settings  # compared parsed (key order kept, spacing free)
        for row in out["scheduled_tasks"]:
            config = json.loads(row["config_json"])
            if config.get("mode") == "chat":
                config["mode"] = "plan"
                row["config_json"] = config
    for row in out.get("plan_approvals", []):
        row.setdefault("kind", "plan")
        row.setdefault("title", "")
        row.setdefault("question", "")
        row.setdefault("version", 1)
        for col in ("artifact_relative_path", "artifact_sha256", "artifact_size_bytes", "execution_id",
                    "execution_state"):
            row.setdefault(col, None)
    for row in out["sessions"]:
        row.setdefault("deleted_at", None)
    for row in out.get("turn_queue", []):
        row.setdefault("session_message_id", None)
        row.setdefault("priority", None)
    for row in out["providers"]:
        row.setdefault("owner_plugin_id", None)
    for row in out["messages"]:
        row.pop("mid")  # renumbered by the v22 search layout: (ordinal << 24) + seq
    return out


BOOT_SET = object()
"""Marker: the boot fence sets this column to its own time."""


class _EarlierSlot:
    """Matches an integer slot earlier than ``than`` (compared inside a parsed ``config_json``)."""

    def __init__(self, than: int) -> None:
        self.than = than

    def __eq__(self, other: object) -> bool:
        return type(other) is int and other < self.than

    def __repr__(self) -> str:
        return f"<a slot before {self.than}>"


class _ArmedSlot:
    """Matches the slot boot computes for a row with a saved schedule and no stored one: an integer
    within a week and a day of now (a daily, weekly or hourly slot counted from the boot's clock)."""

    def __init__(self) -> None:
        self.now_ms = int(time.time() * 1000)

    def __eq__(self, other: object) -> bool:
        return type(other) is int and abs(other - self.now_ms) <= 8 * 86_400_000

    def __repr__(self) -> str:
        return "<a slot computed at boot>"


def after_boot(expected: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """What the boot fence (seed §3, §11.18) does to the migrated rows; nothing is replayed. And the
    scheduler's first look: an armed hourly slot far off (30 days on) is beyond what an hourly cadence can
    reach from now, so it is moved back within the hour (``store.schedule.beyond_reach``), firing nothing.
    Only a row with a saved ``schedule`` is armed (§4.11 "Absence of schedule leaves legacy tasks unarmed"):
    the seed's legacy hourly row has none, so it keeps every field as migrated, its stored slot too. A row
    with a saved schedule but no stored slot is armed by boot (``store.schedule.arm_unslotted``): its slot
    is computed from the boot's clock, every other field kept."""
    out = copy.deepcopy(expected)
    for row in out.get("scheduled_tasks", []):
        raw = row.get("config_json")
        config = json.loads(raw) if isinstance(raw, str) else raw if isinstance(raw, dict) else None
        if isinstance(config, dict) and not isinstance(config.get("nextRunAt"), int) \
                and tasks.has_schedule(str(row.get("cadence")), config) \
                and tasks.next_run_at(str(row.get("cadence")), config, int(time.time() * 1000)) is not None:
            row["config_json"] = {**config, "nextRunAt": _ArmedSlot()}
        if row.get("cadence") == "hourly" and row.get("enabled") and isinstance(config, dict) \
                and isinstance(config.get("schedule"), dict) and isinstance(config.get("nextRunAt"), int):
            row["config_json"] = {**config, "nextRunAt": _EarlierSlot(config["nextRunAt"])}
    for row in out["turns"]:
        if row["status"] == "running":
            row.update({"status": "aborted", "error_code": "INTERRUPTED", "ended_at": BOOT_SET})
    for row in out.get("plan_approvals", []):
        if row["status"] == "pending" and row.get("expires_at") is not None:
            # past its deadline (the seed's rows are old): expired at its deadline, not interrupted
            row.update({"status": "expired", "updated_at": BOOT_SET, "resolved_at": row["expires_at"],
                        "error_code": "EXPIRED"})
        elif row["status"] == "pending":
            row.update({"status": "interrupted", "updated_at": BOOT_SET, "resolved_at": BOOT_SET})
        if row["execution_state"] in ("queued", "running"):
            row.update({"execution_state": "interrupted", "updated_at": BOOT_SET})
    for row in out["task_runs"]:
        if row["status"] == "running":
            row.update({"status": "aborted", "error_code": "INTERRUPTED", "ended_at": BOOT_SET})
    admitted = {q.get("session_message_id") for q in out.get("turn_queue", [])}
    for row in out.get("session_collaboration_messages", []):
        if row["status"] == "running" or (row["status"] == "queued" and row["id"] not in admitted):
            row.update({"status": "interrupted", "updated_at": BOOT_SET})
    return out


def assert_rows_present(conn: sqlite3.Connection, expected: dict[str, list[dict[str, Any]]],
                        *, tables: Iterable[str] | None = None) -> None:
    """Every expected row is in ``conn``'s database, column by column (not counts)."""
    for table in tables if tables is not None else expected:
        key = PRIMARY_KEYS[table]
        for row in expected[table]:
            where = " AND ".join(f"{k} = ?" for k in key)
            cols = list(row)
            found = conn.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE {where}",
                                 tuple(row[k] for k in key)).fetchone()
            assert found is not None, f"{table} row {[row[k] for k in key]} is gone"
            for col, got in zip(cols, found, strict=True):
                want = row[col]
                if want is BOOT_SET:
                    assert got is not None, f"{table}.{col} of {[row[k] for k in key]} was not set"
                elif isinstance(want, dict):
                    assert json.loads(got) == want, f"{table}.{col} of {[row[k] for k in key]}: {got!r}"
                else:
                    assert got == want, f"{table}.{col} of {[row[k] for k in key]}: {got!r} != {want!r}"
