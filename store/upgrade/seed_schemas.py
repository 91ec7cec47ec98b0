"""What each step of seed 003's own migration chain creates (§4, §7).

The seed's history (``PRAGMA user_version``) is 7, 8, 9, 10, 11, 14, 15, 16,
17, 18, 19; ``store.upgrade.seed_migrations`` walks it in place and ``store.upgrade.migrations``
continues with this host's own versions (20 …). Only the statements a step
*adds* live here, spelled as seed §4 spells them; the layouts themselves are
described in docs/DESIGN.md ("Schema versions").
"""

from __future__ import annotations

SEED_VERSIONS: tuple[int, ...] = (7, 8, 9, 10, 11, 14, 15, 16, 17, 18, 19)
"""Every ``user_version`` a seed-era pi-desktop database can carry."""

SEED_GAPS: tuple[int, ...] = (12, 13)
"""Numbers no seed release wrote: a file carrying one is refused, never guessed at."""

LAST_SEED_VERSION = 19

# --- v7 → v8: the first plan_approvals table ----------------------------------

PLAN_APPROVALS_V8 = """
CREATE TABLE plan_approvals (
  request_id               TEXT PRIMARY KEY,
  session_id               TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id                  TEXT NOT NULL,
  tool_call_id             TEXT NOT NULL UNIQUE,
  plan_json                TEXT NOT NULL,
  status                   TEXT NOT NULL CHECK (status IN (
    'pending', 'approved', 'changes_requested', 'rejected',
    'expired', 'interrupted'
  )),
  action                   TEXT CHECK (action IN ('approve', 'request_changes', 'reject')),
  target_permission_mode  TEXT CHECK (target_permission_mode IN ('ask', 'accept-edits', 'auto')),
  feedback                 TEXT,
  created_at               INTEGER NOT NULL,
  updated_at               INTEGER NOT NULL,
  expires_at               INTEGER,
  resolved_at              INTEGER,
  error_code               TEXT
)
""".strip()

PLAN_APPROVALS_INDEXES_V8: tuple[str, ...] = (
    "CREATE INDEX idx_plan_approvals_session ON plan_approvals(session_id, created_at DESC)",
    "CREATE INDEX idx_plan_approvals_pending ON plan_approvals(status, created_at DESC)",
    "CREATE UNIQUE INDEX idx_plan_approvals_one_pending_session ON plan_approvals(session_id) "
    "WHERE status = 'pending'",
)

# --- v8/v9/v10 → v11: §4.6a in full -------------------------------------------

PLAN_APPROVALS_V11 = """
CREATE TABLE plan_approvals (
  request_id               TEXT PRIMARY KEY,
  session_id               TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id                  TEXT NOT NULL,
  tool_call_id             TEXT NOT NULL UNIQUE,
  kind                     TEXT NOT NULL DEFAULT 'plan'
                             CHECK (kind IN ('plan', 'goal')),
  plan_json                TEXT NOT NULL,
  title                    TEXT NOT NULL DEFAULT '',
  question                 TEXT NOT NULL DEFAULT '',
  status                   TEXT NOT NULL CHECK (status IN (
    'pending', 'approved', 'changes_requested', 'rejected',
    'expired', 'interrupted'
  )),
  action                   TEXT CHECK (action IN ('approve', 'request_changes', 'reject')),
  target_permission_mode  TEXT CHECK (target_permission_mode IN ('ask', 'accept-edits', 'auto')),
  feedback                 TEXT,
  created_at               INTEGER NOT NULL,
  updated_at               INTEGER NOT NULL,
  expires_at               INTEGER,
  resolved_at              INTEGER,
  error_code               TEXT,
  artifact_relative_path   TEXT,
  artifact_sha256          TEXT,
  artifact_size_bytes      INTEGER,
  version                  INTEGER NOT NULL DEFAULT 1,
  execution_id             TEXT UNIQUE,
  execution_state          TEXT CHECK (execution_state IN (
    'queued', 'running', 'completed', 'interrupted'
  ))
)
""".strip()

PLAN_APPROVALS_INDEXES_V11: tuple[str, ...] = (
    *PLAN_APPROVALS_INDEXES_V8,
    "CREATE INDEX idx_plan_approvals_execution_queue ON plan_approvals(execution_state, created_at DESC) "
    "WHERE execution_state IN ('queued', 'running')",
    "CREATE INDEX idx_plan_approvals_execution_id ON plan_approvals(execution_id) WHERE execution_id IS NOT NULL",
)

# --- v11 → v14: plugin trash marker and import origins -----------------------

SESSIONS_DELETED_AT = "ALTER TABLE sessions ADD COLUMN deleted_at INTEGER"

V14_ADDITIONS: tuple[str, ...] = (
    "CREATE INDEX idx_sessions_deleted ON sessions(deleted_at) WHERE deleted_at IS NOT NULL",
    """CREATE TABLE session_import_origins (
  plugin_id    TEXT NOT NULL,
  source_id    TEXT NOT NULL,
  external_id  TEXT NOT NULL,
  session_id   TEXT NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
  source_label TEXT,
  origin_json  TEXT,
  created_at   INTEGER NOT NULL,
  UNIQUE(plugin_id, source_id, external_id)
)""",
    "CREATE INDEX idx_session_import_origins_plugin ON session_import_origins(plugin_id, source_id, created_at DESC)",
)

# --- v14 → v15: the Host-owned turn queue (§4.6b without v18's priority) -----

V15_ADDITIONS: tuple[str, ...] = (
    """CREATE TABLE turn_queue (
  id               TEXT PRIMARY KEY,
  session_id       TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  principal        TEXT NOT NULL,
  idempotency_key  TEXT,
  input_hash       TEXT NOT NULL,
  content          TEXT NOT NULL,
  attachments_json TEXT,
  permission_mode  TEXT NOT NULL,
  position         INTEGER NOT NULL,
  created_at       INTEGER NOT NULL
)""",
    "CREATE INDEX idx_turn_queue_session ON turn_queue(session_id, position)",
    "CREATE UNIQUE INDEX idx_turn_queue_idempotency ON turn_queue(session_id, principal, idempotency_key) "
    "WHERE idempotency_key IS NOT NULL",
)

# --- v15 → v16: the session collaboration ledger (§4.6c) --------------------

TURN_QUEUE_SESSION_MESSAGE_ID = "ALTER TABLE turn_queue ADD COLUMN session_message_id TEXT"

V16_ADDITIONS: tuple[str, ...] = (
    """CREATE TABLE session_collaboration_links (
  session_id            TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
  created_by_session_id TEXT NOT NULL,
  plugin_id             TEXT NOT NULL,
  created_at            INTEGER NOT NULL
)""",
    """CREATE TABLE session_collaboration_messages (
  id                    TEXT PRIMARY KEY,
  plugin_id             TEXT NOT NULL,
  source_session_id     TEXT NOT NULL,
  source_title          TEXT NOT NULL,
  target_session_id     TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  target_title          TEXT NOT NULL,
  kind                  TEXT NOT NULL CHECK(kind IN ('task', 'message', 'completion')),
  content               TEXT NOT NULL,
  status                TEXT NOT NULL CHECK(status IN
    ('queued', 'running', 'completed', 'failed', 'cancelled', 'interrupted')),
  notify_on_completion  INTEGER NOT NULL DEFAULT 0,
  turn_id               TEXT REFERENCES turns(id) ON DELETE SET NULL,
  reply_to_message_id   TEXT,
  idempotency_key       TEXT NOT NULL,
  remaining_hops        INTEGER NOT NULL,
  permission_ceiling    TEXT NOT NULL CHECK(permission_ceiling IN
    ('ask', 'accept-edits', 'auto')),
  result                TEXT,
  error                 TEXT,
  created_at            INTEGER NOT NULL,
  updated_at            INTEGER NOT NULL,
  UNIQUE(plugin_id, source_session_id, idempotency_key)
)""",
    "CREATE UNIQUE INDEX idx_session_collaboration_turn ON session_collaboration_messages(turn_id) "
    "WHERE turn_id IS NOT NULL",
    "CREATE UNIQUE INDEX idx_session_collaboration_receipt ON session_collaboration_messages(reply_to_message_id) "
    "WHERE kind = 'completion'",
)

# --- v16 → v17: provider ownership (ADR 0259) ---------------------------------

PROVIDERS_OWNER = "ALTER TABLE providers ADD COLUMN owner_plugin_id TEXT"

V17_ADDITIONS: tuple[str, ...] = (
    "CREATE INDEX idx_providers_owner ON providers(owner_plugin_id) WHERE owner_plugin_id IS NOT NULL",
)

# --- v17 → v18: queue promotion (§4.6b, ADR 0265) -----------------------------

TURN_QUEUE_PRIORITY = "ALTER TABLE turn_queue ADD COLUMN priority INTEGER"
"""NULL until "send now" promotes the entry (every pre-v18 entry is unpromoted)."""

# --- v18 → v19: the ``omit`` thinking level (§4.5, ADR 0295) -------------------

THINKING_LEVELS_V19: tuple[str, ...] = ("off", "minimal", "low", "medium", "high", "xhigh", "max", "omit")
"""``sessions.thinking_level``'s CHECK list from v19 on (``omit``: send no thinking override)."""

# --- the guarded step's value rules (§7 items 1-3, 6, 7) ---------------------

MODES: tuple[str, ...] = ("plan", "goal", "agent")
LEGACY_MODES: dict[str, str] = {"chat": "plan"}
"""The one legacy operating mode and what it became (§4.5, §4.11, §7)."""

APP_SETTINGS_KEY = ("app", "settings")
"""Where the seed keeps its settings blob (§4.1: ``app`` — the settings blob)."""

LEGACY_SETTINGS_REMOVED: tuple[str, ...] = ("planApprovalPermissionMode",)

SHELL_CATALOG: dict[str, tuple[str, ...]] = {
    "linux": ("bash", "zsh", "sh", "fish", "dash", "pwsh"),
    "darwin": ("zsh", "bash", "sh", "fish", "pwsh"),
    "win32": ("powershell", "pwsh", "cmd", "git-bash", "wsl"),
}
"""Command shell catalog ids per platform (Node's ``process.platform`` names, D190).

A valid id whose executable is missing right now is kept (§7 item 7: the
runtime falls back to the first available shell)."""
