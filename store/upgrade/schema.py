"""The SQLite index schema (seed 003 §4 plus docs/DESIGN.md "SQLite" additions).

The DDL is kept as an ordered tuple of single statements so that it can run
one ``execute`` at a time inside an explicit transaction (``executescript``
would COMMIT first). ``SCHEMA_VERSION`` is what ``PRAGMA user_version`` holds
once a database carries exactly this DDL.

Version history kept here (older layouts are archived, never migrated; see
``store.upgrade.migrations``):

* v20 — seed §4 tables (incl. v16 collaboration ledger, v17 provider owner,
  v18 queue priority, v19 ``omit`` thinking level) plus our additions:
  transcript offsets on ``messages``/``sessions``, ``compactions``,
  ``command_receipts``, ``run_snapshots``, ``attachment_blobs``/``_refs``.
* v21 — adds ``boot_reports`` and ``idx_messages_turn`` (additive).
* v22 — search layout (seed §4.8 at 1M messages): ``sessions.ordinal`` (a
  unique, never-NULL number per session), ``messages.mid = (ordinal << 24) +
  seq`` (enforced by triggers, so a session's rows are one rowid range and the
  owning session of a trigram hit is ``rowid >> 24``), ``messages_fts`` becomes
  contentless and holds exactly the searchable rows (user/assistant, text not
  NULL, not tombstoned), ``search_hazard`` lists the searchable rows whose text
  holds a character the trigram folding treats differently from ours.
* v23 — ``idx_messages_created`` on ``messages(created_at)`` (additive): a
  global ``search.query`` for a trigram in a large share of all messages walks
  it newest first and asks the trigram index about each row, instead of
  looking up every hit's row to sort them.
* v24 — pending user requests and their outcomes (additive): ``approvals``
  (tool permission prompts), ``interactions`` (ask-the-user questions),
  ``permission_rules`` (what the user chose to always allow or deny), the
  execution lifecycle of an approved plan/goal on ``plan_approvals``
  (``execution_turn_id``, ``execution_outcome`` ...: the seed's
  ``execution_state`` keeps its own vocabulary), and on ``turns`` the
  promoted cost (``cost_micros``) and retry lineage (``retry_of``).
* v25 — ``messages.wire_cut`` and ``messages.line_crc`` (additive, NULL for
  rows indexed before): how many leading bytes of the message's line a
  ``session.get`` reply sends as they are, and the line's CRC-32, so a window
  reply reuses the line's bytes without parsing or scanning them
  (``store/transcripts/window_reply.py``).
* v26 — attachment metadata and deletion state (additive; seed 000 §2.3):
  ``attachment_blobs`` gains ``kind``, ``trust``, ``provenance``, ``source``,
  ``run_id`` (the run/turn that produced it), ``meta_json`` (page or image
  metadata), ``deletion_state`` (``live`` | ``evicting`` | ``evicted``: an
  evicted blob keeps its row as a tombstone) and ``evicted_at``;
  ``attachment_refs`` gains ``origin`` (``client`` or where a GC scan found
  it: ``transcript`` | ``revision`` | ``checkpoint`` | ``queue``) and
  ``evicted_at`` (the reference was marked before the bytes went).
* v27 — seed 000 thread metadata (``thread_meta``) and the turn input bound
  to its run snapshot (``run_snapshots.input_json``/``input_digest``).
* v28 — tool output search (opt-in, ``scope: "tools"``): ``tool_output``
  (a tool row's output text, bounded, keyed by ``messages.mid``) and its own
  trigram index ``tool_fts`` (contentless, ``detail=none``), kept in step by
  triggers; the default index is unchanged.
* v29 — ``known_sessions``: every session id the host created, with the time
  the user deleted (or purged) it, written in the transactions that insert and
  delete its row (no foreign key: it outlives the row). An append to a session
  whose row and transcript are both gone restores it as a stub when the id is
  known and not deleted (seed 003 §5, D318; ``store/orphans.py``). The step
  fills it from the sessions there are.
* v30 — ``turn_queue`` leases: ``lease`` (NULL while the entry waits;
  ``taken`` once ``queueTake`` handed it out, ``offered`` when a restart or a
  new controller must be offered it again, ``started`` once a turn began with
  it), ``lease_turn_id`` (that turn) and ``lease_seq`` (the session's last seq
  when it was handed out). A handed-out entry leaves the queue only when its
  turn ran or the controller asked for the next one (``store/queue.py``).
* v31 — ``turn_queue.lease_client``: the client ids a handed-out entry was
  handed to (a JSON array, in hand-out order; once a turn began with it, that
  turn's starter). Only a turn one of them starts carries the entry, and what
  the last taker took and began no turn with is offered again once that client
  is gone (``store/queue.py``). NULL for entries handed out before the step.
* v32 — ``idx_messages_window`` on ``messages(session_id, seq)`` carrying
  every column a window reply reads of a row (byte span, tombstone, turn,
  wire cut, CRC; additive): a page of a session is read from a few index
  pages instead of one table page per fat row (the rows hold the searchable
  text), which is most of what the first read of a session in a new process
  costs the database (``store/transcripts/windows.py``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Sequence

from store.search.search_text import TRIGRAM_TEXT_HAZARDS

SCHEMA_VERSION = 32

# --- seed §4.1 – §4.5 -------------------------------------------------------

_KV = """
CREATE TABLE kv (
  ns         TEXT NOT NULL,
  key        TEXT NOT NULL,
  value_json TEXT NOT NULL,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (ns, key)
) WITHOUT ROWID
"""

_PROJECTS = """
CREATE TABLE projects (
  id             INTEGER PRIMARY KEY,
  path           TEXT NOT NULL UNIQUE,
  name           TEXT NOT NULL,
  pinned         INTEGER NOT NULL DEFAULT 0,
  created_at     INTEGER NOT NULL,
  last_opened_at INTEGER NOT NULL
)
"""

_PROVIDERS = """
CREATE TABLE providers (
  id               TEXT PRIMARY KEY,
  name             TEXT NOT NULL,
  vendor_key       TEXT NOT NULL DEFAULT 'custom',
  type             TEXT NOT NULL DEFAULT 'openai_compatible',
  protocol         TEXT NOT NULL DEFAULT 'openai_compatible',
  api_style        TEXT,
  auth_kind        TEXT NOT NULL DEFAULT 'api_key_and_base_url',
  base_url         TEXT,
  enabled          INTEGER NOT NULL DEFAULT 1,
  secret_ref       TEXT,
  default_model_id TEXT,
  config_json      TEXT NOT NULL DEFAULT '{}',
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  owner_plugin_id  TEXT
)
"""

_IDX_PROVIDERS_OWNER = """
CREATE INDEX idx_providers_owner ON providers(owner_plugin_id)
  WHERE owner_plugin_id IS NOT NULL
"""

_MODELS = """
CREATE TABLE models (
  provider_id       TEXT NOT NULL REFERENCES providers(id) ON DELETE CASCADE,
  model_id          TEXT NOT NULL,
  display_name      TEXT NOT NULL,
  source            TEXT NOT NULL DEFAULT 'user',
  capabilities_json TEXT NOT NULL DEFAULT '[]',
  context_window    INTEGER,
  max_output_tokens INTEGER,
  deprecated        INTEGER NOT NULL DEFAULT 0,
  updated_at        INTEGER NOT NULL,
  PRIMARY KEY (provider_id, model_id)
) WITHOUT ROWID
"""

# Additions: indexed_len (transcript bytes the index covers) and file_epoch
# (the header epoch the stored byte offsets belong to).
_SESSIONS = """
CREATE TABLE sessions (
  id          TEXT PRIMARY KEY,
  title       TEXT NOT NULL DEFAULT '',
  project_id  INTEGER REFERENCES projects(id) ON DELETE SET NULL,
  provider_id TEXT,
  model_id    TEXT,
  mode        TEXT NOT NULL DEFAULT 'agent',
  thinking_level TEXT NOT NULL DEFAULT 'off'
                CHECK (thinking_level IN ('off', 'minimal', 'low', 'medium',
                                          'high', 'xhigh', 'max', 'omit')),
  permission_mode TEXT NOT NULL DEFAULT 'inherit'
                CHECK (permission_mode IN ('inherit', 'ask', 'accept-edits', 'auto')),
  source      TEXT,
  deleted_at  INTEGER,
  pinned      INTEGER NOT NULL DEFAULT 0,
  last_seq    INTEGER NOT NULL DEFAULT 0,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  indexed_len INTEGER NOT NULL DEFAULT 0,
  file_epoch  TEXT
)
"""

_IDX_SESSIONS = (
    "CREATE INDEX idx_sessions_updated ON sessions(updated_at DESC)",
    "CREATE INDEX idx_sessions_project ON sessions(project_id) WHERE project_id IS NOT NULL",
    "CREATE INDEX idx_sessions_deleted ON sessions(deleted_at) WHERE deleted_at IS NOT NULL",
)

_SESSION_IMPORT_ORIGINS = """
CREATE TABLE session_import_origins (
  plugin_id    TEXT NOT NULL,
  source_id    TEXT NOT NULL,
  external_id  TEXT NOT NULL,
  session_id   TEXT NOT NULL UNIQUE REFERENCES sessions(id) ON DELETE CASCADE,
  source_label TEXT,
  origin_json  TEXT,
  created_at   INTEGER NOT NULL,
  UNIQUE(plugin_id, source_id, external_id)
)
"""

_IDX_SESSION_IMPORT_ORIGINS = """
CREATE INDEX idx_session_import_origins_plugin
  ON session_import_origins(plugin_id, source_id, created_at DESC)
"""

# --- seed §4.6 – §4.6c ------------------------------------------------------

_TURNS = """
CREATE TABLE turns (
  id            TEXT PRIMARY KEY,
  session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  status        TEXT NOT NULL DEFAULT 'running',
  provider_id   TEXT,
  model_id      TEXT,
  error_code    TEXT,
  input_tokens  INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0,
  usage_json    TEXT,
  started_at    INTEGER NOT NULL,
  ended_at      INTEGER
)
"""

_IDX_TURNS = (
    "CREATE INDEX idx_turns_session ON turns(session_id, started_at DESC)",
    "CREATE INDEX idx_turns_ended_at ON turns(ended_at DESC)",
)

_PLAN_APPROVALS = """
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
  target_permission_mode   TEXT CHECK (target_permission_mode IN ('ask', 'accept-edits', 'auto')),
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
"""

_IDX_PLAN_APPROVALS = (
    "CREATE INDEX idx_plan_approvals_session ON plan_approvals(session_id, created_at DESC)",
    "CREATE INDEX idx_plan_approvals_pending ON plan_approvals(status, created_at DESC)",
    """CREATE UNIQUE INDEX idx_plan_approvals_one_pending_session
  ON plan_approvals(session_id) WHERE status = 'pending'""",
    """CREATE INDEX idx_plan_approvals_execution_queue
  ON plan_approvals(execution_state, created_at DESC)
  WHERE execution_state IN ('queued', 'running')""",
    """CREATE INDEX idx_plan_approvals_execution_id
  ON plan_approvals(execution_id) WHERE execution_id IS NOT NULL""",
)

# priority: schema v18 (NULL until "send now"); session_message_id: schema v16
# binding to a session_collaboration_messages row (no FK in the seed).
_TURN_QUEUE = """
CREATE TABLE turn_queue (
  id                 TEXT PRIMARY KEY,
  session_id         TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  principal          TEXT NOT NULL,
  idempotency_key    TEXT,
  input_hash         TEXT NOT NULL,
  content            TEXT NOT NULL,
  attachments_json   TEXT,
  permission_mode    TEXT NOT NULL,
  position           INTEGER NOT NULL,
  priority           INTEGER,
  session_message_id TEXT,
  created_at         INTEGER NOT NULL
)
"""

_IDX_TURN_QUEUE = (
    "CREATE INDEX idx_turn_queue_session ON turn_queue(session_id, position)",
    """CREATE UNIQUE INDEX idx_turn_queue_idempotency
  ON turn_queue(session_id, principal, idempotency_key)
  WHERE idempotency_key IS NOT NULL""",
)

_COLLAB_LINKS = """
CREATE TABLE session_collaboration_links (
  session_id            TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
  created_by_session_id TEXT NOT NULL,
  plugin_id             TEXT NOT NULL,
  created_at            INTEGER NOT NULL
)
"""

_COLLAB_MESSAGES = """
CREATE TABLE session_collaboration_messages (
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
)
"""

_IDX_COLLAB = (
    """CREATE UNIQUE INDEX idx_session_collaboration_turn
  ON session_collaboration_messages(turn_id) WHERE turn_id IS NOT NULL""",
    """CREATE UNIQUE INDEX idx_session_collaboration_receipt
  ON session_collaboration_messages(reply_to_message_id)
  WHERE kind = 'completion'""",
)

# --- seed §4.7 – §4.8: messages + FTS5 trigram -------------------------------

# Additions: line_offset/line_len locate the newest transcript line holding
# the message; deleted marks a tombstoned message (search/context skip it).
_MESSAGES = """
CREATE TABLE messages (
  mid          INTEGER PRIMARY KEY,
  id           TEXT NOT NULL UNIQUE,
  session_id   TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id      TEXT REFERENCES turns(id) ON DELETE SET NULL,
  seq          INTEGER NOT NULL,
  role         TEXT NOT NULL,
  tool_name    TEXT,
  is_error     INTEGER NOT NULL DEFAULT 0,
  text         TEXT,
  created_at   INTEGER NOT NULL,
  line_offset  INTEGER,
  line_len     INTEGER,
  deleted      INTEGER NOT NULL DEFAULT 0,
  UNIQUE (session_id, seq)
)
"""

_MESSAGES_FTS = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
  text,
  content='messages', content_rowid='mid',
  tokenize='trigram'
)
"""

_TRIGGERS_FTS = (
    """CREATE TRIGGER messages_ai AFTER INSERT ON messages WHEN new.text IS NOT NULL
  BEGIN INSERT INTO messages_fts(rowid, text) VALUES (new.mid, new.text); END""",
    """CREATE TRIGGER messages_ad AFTER DELETE ON messages WHEN old.text IS NOT NULL
  BEGIN INSERT INTO messages_fts(messages_fts, rowid, text)
        VALUES ('delete', old.mid, old.text); END""",
    """CREATE TRIGGER messages_au AFTER UPDATE OF text ON messages
  BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, text)
      SELECT 'delete', old.mid, old.text WHERE old.text IS NOT NULL;
    INSERT INTO messages_fts(rowid, text)
      SELECT new.mid, new.text WHERE new.text IS NOT NULL;
  END""",
)

# --- seed §4.9 – §4.14 ------------------------------------------------------

_MESSAGE_REVISIONS = """
CREATE TABLE message_revisions (
  id              TEXT PRIMARY KEY,
  session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  root_user_id    TEXT NOT NULL,
  revision_index  INTEGER NOT NULL,
  is_active       INTEGER NOT NULL DEFAULT 0,
  message_count   INTEGER NOT NULL DEFAULT 0,
  created_at      INTEGER NOT NULL,
  UNIQUE (session_id, root_user_id, revision_index)
)
"""

_IDX_MESSAGE_REVISIONS = """
CREATE INDEX idx_message_revisions_root
  ON message_revisions(session_id, root_user_id, revision_index)
"""

_ARTIFACTS = """
CREATE TABLE artifacts (
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  path       TEXT NOT NULL,
  op         TEXT NOT NULL,
  turn_id    TEXT,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (session_id, path)
) WITHOUT ROWID
"""

_IDX_ARTIFACTS = "CREATE INDEX idx_artifacts_time ON artifacts(updated_at DESC)"

_SCHEDULED_TASKS = """
CREATE TABLE scheduled_tasks (
  id          TEXT PRIMARY KEY,
  title       TEXT NOT NULL,
  prompt      TEXT NOT NULL,
  cadence     TEXT NOT NULL DEFAULT 'manual',
  enabled     INTEGER NOT NULL DEFAULT 1,
  project_id  INTEGER REFERENCES projects(id) ON DELETE SET NULL,
  config_json TEXT NOT NULL DEFAULT '{}',
  last_run_at INTEGER,
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL
)
"""

_TASK_RUNS = """
CREATE TABLE task_runs (
  id         TEXT PRIMARY KEY,
  task_id    TEXT NOT NULL REFERENCES scheduled_tasks(id) ON DELETE CASCADE,
  session_id TEXT REFERENCES sessions(id) ON DELETE SET NULL,
  status     TEXT NOT NULL DEFAULT 'running',
  error_code TEXT,
  started_at INTEGER NOT NULL,
  ended_at   INTEGER
)
"""

_IDX_TASK_RUNS = "CREATE INDEX idx_task_runs ON task_runs(task_id, started_at DESC)"

_SECRETS_META = """
CREATE TABLE secrets_meta (
  secret_ref TEXT PRIMARY KEY,
  owner_kind TEXT NOT NULL DEFAULT 'provider',
  owner_id   TEXT,
  kind       TEXT NOT NULL DEFAULT 'api_key',
  backend    TEXT NOT NULL,
  updated_at INTEGER NOT NULL
) WITHOUT ROWID
"""

_AUDIT_LOG = """
CREATE TABLE audit_log (
  id           INTEGER PRIMARY KEY,
  ts           INTEGER NOT NULL,
  kind         TEXT NOT NULL,
  session_id   TEXT,
  payload_json TEXT NOT NULL DEFAULT '{}'
)
"""

_IDX_AUDIT = (
    "CREATE INDEX idx_audit_ts ON audit_log(ts)",
    """CREATE INDEX idx_audit_session ON audit_log(session_id, ts)
  WHERE session_id IS NOT NULL""",
)

_NOTIFICATIONS = """
CREATE TABLE notifications (
  id            TEXT PRIMARY KEY,
  kind          TEXT NOT NULL
                  CHECK (kind IN ('task.completed', 'task.failed')),
  session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  session_title TEXT NOT NULL,
  turn_id       TEXT NOT NULL UNIQUE,
  error_code    TEXT,
  created_at    INTEGER NOT NULL,
  read_at       INTEGER
)
"""

_IDX_NOTIFICATIONS = (
    "CREATE INDEX idx_notifications_created ON notifications(created_at DESC)",
    """CREATE INDEX idx_notifications_unread
  ON notifications(created_at DESC) WHERE read_at IS NULL""",
)

# --- our additions (docs/DESIGN.md "SQLite") ---------------------------------

_COMPACTIONS = """
CREATE TABLE compactions (
  session_id            TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  id                    TEXT NOT NULL,
  through_message_id    TEXT,
  first_kept_message_id TEXT,
  line_offset           INTEGER NOT NULL,
  line_len              INTEGER NOT NULL,
  created_at            INTEGER NOT NULL,
  PRIMARY KEY (session_id, line_offset)
) WITHOUT ROWID
"""

# No foreign key on purpose: the receipt of a session.delete outlives its session.
_COMMAND_RECEIPTS = """
CREATE TABLE command_receipts (
  client_id     TEXT NOT NULL,
  submission_id TEXT NOT NULL,
  method        TEXT NOT NULL,
  status        TEXT NOT NULL,
  response_json TEXT,
  fingerprint   TEXT NOT NULL,
  session_id    TEXT,
  created_at    INTEGER NOT NULL,
  PRIMARY KEY (client_id, submission_id)
) WITHOUT ROWID
"""

_IDX_COMMAND_RECEIPTS = (
    "CREATE INDEX idx_command_receipts_created ON command_receipts(created_at)",
)

_RUN_SNAPSHOTS = """
CREATE TABLE run_snapshots (
  turn_id       TEXT PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
  version       INTEGER NOT NULL,
  digest        TEXT NOT NULL,
  snapshot_json TEXT NOT NULL,
  size_bytes    INTEGER NOT NULL,
  created_at    INTEGER NOT NULL
)
"""

_ATTACHMENT_BLOBS = """
CREATE TABLE attachment_blobs (
  sha256              TEXT PRIMARY KEY,
  size_bytes          INTEGER NOT NULL,
  mime_type           TEXT,
  created_at          INTEGER NOT NULL,
  last_used_at        INTEGER NOT NULL,
  marked_for_eviction INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID
"""

_ATTACHMENT_REFS = """
CREATE TABLE attachment_refs (
  sha256     TEXT NOT NULL,
  session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  message_id TEXT,
  PRIMARY KEY (sha256, session_id, message_id)
)
"""

_IDX_ATTACHMENTS = (
    # eviction order: oldest first
    "CREATE INDEX idx_attachment_blobs_lru ON attachment_blobs(last_used_at)",
    # session cascade deletes and "referenced by the active session" lookups
    "CREATE INDEX idx_attachment_refs_session ON attachment_refs(session_id)",
)

# --- v21 additions -----------------------------------------------------------

_BOOT_REPORTS = """
CREATE TABLE boot_reports (
  boot_id     TEXT PRIMARY KEY,
  started_at  INTEGER NOT NULL,
  report_json TEXT NOT NULL
)
"""

_IDX_MESSAGES_TURN = (
    "CREATE INDEX idx_messages_turn ON messages(turn_id) WHERE turn_id IS NOT NULL"
)


_IDX_MESSAGES_CREATED = "CREATE INDEX idx_messages_created ON messages(created_at)"

# --- v24: pending user requests, plan execution, usage -----------------------

# A tool-permission prompt of a running turn (seed 000 §2 approvals).
_APPROVALS = """
CREATE TABLE approvals (
  request_id    TEXT PRIMARY KEY,
  session_id    TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id       TEXT NOT NULL,
  tool_call_id  TEXT,
  tool          TEXT NOT NULL,
  args_summary  TEXT NOT NULL DEFAULT '',
  risk          TEXT NOT NULL CHECK (risk IN ('low', 'medium', 'high')),
  options_json  TEXT NOT NULL,
  requested_by  TEXT NOT NULL,
  status        TEXT NOT NULL CHECK (status IN
    ('pending', 'allowed', 'denied', 'expired', 'interrupted', 'cancelled')),
  option_id     TEXT,
  rule_id       TEXT,
  responded_by  TEXT,
  created_at    INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  expires_at    INTEGER,
  resolved_at   INTEGER
)
"""

# An ask-the-user question of a running turn (seed 000 §2 interactions).
_INTERACTIONS = """
CREATE TABLE interactions (
  request_id      TEXT PRIMARY KEY,
  session_id      TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
  turn_id         TEXT NOT NULL,
  tool_call_id    TEXT,
  question        TEXT NOT NULL,
  choices_json    TEXT NOT NULL DEFAULT '[]',
  multiple        INTEGER NOT NULL DEFAULT 0,
  allow_free_text INTEGER NOT NULL DEFAULT 0,
  requested_by    TEXT NOT NULL,
  status          TEXT NOT NULL CHECK (status IN
    ('pending', 'answered', 'expired', 'interrupted', 'cancelled')),
  answer_json     TEXT,
  responded_by    TEXT,
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL,
  expires_at      INTEGER,
  resolved_at     INTEGER
)
"""

# "Always allow this tool in this project": consulted by approvals.request.
_PERMISSION_RULES = """
CREATE TABLE permission_rules (
  id                TEXT PRIMARY KEY,
  scope             TEXT NOT NULL CHECK (scope IN ('session', 'project', 'global')),
  session_id        TEXT REFERENCES sessions(id) ON DELETE CASCADE,
  project_id        INTEGER REFERENCES projects(id) ON DELETE CASCADE,
  tool              TEXT NOT NULL,
  decision          TEXT NOT NULL CHECK (decision IN ('allow', 'deny')),
  source_request_id TEXT,
  created_at        INTEGER NOT NULL
)
"""

_IDX_USER_REQUESTS = (
    "CREATE INDEX idx_approvals_session ON approvals(session_id, created_at DESC)",
    "CREATE INDEX idx_approvals_pending ON approvals(created_at DESC) WHERE status = 'pending'",
    """CREATE UNIQUE INDEX idx_approvals_tool_call
  ON approvals(session_id, tool_call_id) WHERE tool_call_id IS NOT NULL""",
    "CREATE INDEX idx_interactions_session ON interactions(session_id, created_at DESC)",
    "CREATE INDEX idx_interactions_pending ON interactions(created_at DESC) WHERE status = 'pending'",
    """CREATE UNIQUE INDEX idx_interactions_tool_call
  ON interactions(session_id, tool_call_id) WHERE tool_call_id IS NOT NULL""",
    """CREATE UNIQUE INDEX idx_permission_rules_scope
  ON permission_rules(scope, COALESCE(session_id, ''), COALESCE(project_id, 0), tool)""",
)

# seed §4.6a keeps execution_state at queued/running/completed/interrupted; the
# lifecycle bound to the executing turn (completed | failed | cancelled) is
# recorded beside it (``store/plans.py``).
_PLAN_EXECUTION_COLUMNS = (
    "ALTER TABLE plan_approvals ADD COLUMN execution_turn_id TEXT",
    """ALTER TABLE plan_approvals ADD COLUMN execution_outcome TEXT
  CHECK (execution_outcome IN ('completed', 'failed', 'cancelled', 'interrupted'))""",
    "ALTER TABLE plan_approvals ADD COLUMN execution_error_code TEXT",
    "ALTER TABLE plan_approvals ADD COLUMN execution_started_at INTEGER",
    "ALTER TABLE plan_approvals ADD COLUMN execution_ended_at INTEGER",
)

# seed §4.6: "anything filtered or summed is a promoted column by rule".
_TURN_USAGE_COLUMNS = (
    "ALTER TABLE turns ADD COLUMN cost_micros INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE turns ADD COLUMN retry_of TEXT",
)


# --- v22: search layout ---------------------------------------------------------

MID_SEQ_BITS = 24
MAX_SEQ = (1 << MID_SEQ_BITS) - 1
"""Largest ``seq`` a session can hold: ``mid`` keeps it in its low 24 bits."""

_SESSIONS_ORDINAL = "ALTER TABLE sessions ADD COLUMN ordinal INTEGER"
_IDX_SESSIONS_ORDINAL = "CREATE UNIQUE INDEX idx_sessions_ordinal ON sessions(ordinal)"
# Every session gets the next ordinal when inserted without one (MAX is one
# index probe). A deleted session's rows are gone with it (ON DELETE CASCADE),
# so reusing the largest ordinal after its session is deleted is harmless.
_TRIGGER_SESSIONS_ORDINAL = """
CREATE TRIGGER sessions_ordinal AFTER INSERT ON sessions WHEN new.ordinal IS NULL
  BEGIN UPDATE sessions SET ordinal = (SELECT IFNULL(MAX(ordinal), 0) + 1 FROM sessions)
        WHERE id = new.id; END
"""

_MID_OK = (
    f"new.seq BETWEEN 1 AND {MAX_SEQ} AND new.mid IS "
    f"((SELECT ordinal FROM sessions WHERE id = new.session_id) << {MID_SEQ_BITS}) + new.seq"
)
_MID_ERROR = (
    "messages.mid must be (sessions.ordinal << 24) + seq with 1 <= seq <= 16777215 "
    "(store.indexing.index computes it)"
)
_TRIGGERS_MID = (
    f"""CREATE TRIGGER messages_mid_insert BEFORE INSERT ON messages WHEN NOT ({_MID_OK})
  BEGIN SELECT RAISE(ABORT, '{_MID_ERROR}'); END""",
    f"""CREATE TRIGGER messages_mid_update BEFORE UPDATE OF mid, seq, session_id ON messages
  WHEN NOT ({_MID_OK})
  BEGIN SELECT RAISE(ABORT, '{_MID_ERROR}'); END""",
)

# Contentless: the index holds exactly the searchable rows (not a mirror of
# ``messages``), so 'rebuild' is impossible by construction; a removal must
# pass the exact indexed text, which the triggers take from the OLD row.
_MESSAGES_FTS_V22 = """
CREATE VIRTUAL TABLE messages_fts USING fts5(
  text,
  content='',
  tokenize='trigram'
)
"""

_SEARCH_HAZARD = "CREATE TABLE search_hazard (mid INTEGER PRIMARY KEY)"


def searchable_sql(row: str) -> str:
    """SQL true when ``row`` (``new``/``old``/a table alias) belongs in ``messages_fts``."""
    return f"{row}.text IS NOT NULL AND {row}.role IN ('user', 'assistant') AND {row}.deleted = 0"


def hazard_sql(row: str) -> str:
    """SQL true when ``row``'s text holds a character of TRIGRAM_TEXT_HAZARDS."""
    return "(" + " OR ".join(f"instr({row}.text, char({ord(ch)})) > 0" for ch in TRIGRAM_TEXT_HAZARDS) + ")"


def _fts_in(row: str) -> str:
    return (
        f"INSERT INTO messages_fts(rowid, text) SELECT {row}.mid, {row}.text WHERE {searchable_sql(row)};\n"
        f"    INSERT INTO search_hazard(mid) SELECT {row}.mid WHERE {searchable_sql(row)} AND {hazard_sql(row)};"
    )


def _fts_out(row: str) -> str:
    return (
        f"INSERT INTO messages_fts(messages_fts, rowid, text) SELECT 'delete', {row}.mid, {row}.text "
        f"WHERE {searchable_sql(row)};\n"
        f"    DELETE FROM search_hazard WHERE mid = {row}.mid;"
    )


_TRIGGERS_FTS_V22 = (
    f"""CREATE TRIGGER messages_ai AFTER INSERT ON messages WHEN {searchable_sql('new')}
  BEGIN
    {_fts_in('new')}
  END""",
    f"""CREATE TRIGGER messages_ad AFTER DELETE ON messages WHEN {searchable_sql('old')}
  BEGIN
    {_fts_out('old')}
  END""",
    f"""CREATE TRIGGER messages_au AFTER UPDATE OF text, role, deleted ON messages
  BEGIN
    {_fts_out('old')}
    {_fts_in('new')}
  END""",
)


def _strip(statements: Sequence[str]) -> tuple[str, ...]:
    return tuple(statement.strip() for statement in statements)


_DDL_V20_PARTS: tuple[str, ...] = (
    _KV,
    _PROJECTS,
    _PROVIDERS,
    _IDX_PROVIDERS_OWNER,
    _MODELS,
    _SESSIONS,
    *_IDX_SESSIONS,
    _SESSION_IMPORT_ORIGINS,
    _IDX_SESSION_IMPORT_ORIGINS,
    _TURNS,
    *_IDX_TURNS,
    _PLAN_APPROVALS,
    *_IDX_PLAN_APPROVALS,
    _TURN_QUEUE,
    *_IDX_TURN_QUEUE,
    _COLLAB_LINKS,
    _COLLAB_MESSAGES,
    *_IDX_COLLAB,
    _MESSAGES,
    _MESSAGES_FTS,
    *_TRIGGERS_FTS,
    _MESSAGE_REVISIONS,
    _IDX_MESSAGE_REVISIONS,
    _ARTIFACTS,
    _IDX_ARTIFACTS,
    _SCHEDULED_TASKS,
    _TASK_RUNS,
    _IDX_TASK_RUNS,
    _SECRETS_META,
    _AUDIT_LOG,
    *_IDX_AUDIT,
    _NOTIFICATIONS,
    *_IDX_NOTIFICATIONS,
    _COMPACTIONS,
    _COMMAND_RECEIPTS,
    *_IDX_COMMAND_RECEIPTS,
    _RUN_SNAPSHOTS,
    _ATTACHMENT_BLOBS,
    _ATTACHMENT_REFS,
    *_IDX_ATTACHMENTS,
)

DDL_V20: tuple[str, ...] = _strip(_DDL_V20_PARTS)
"""The v20 layout: v21 without ``boot_reports`` and ``idx_messages_turn``."""

V21_ADDITIONS: tuple[str, ...] = _strip((_BOOT_REPORTS, _IDX_MESSAGES_TURN))
"""What the v20→v21 step creates (additive)."""

DDL_V21: tuple[str, ...] = DDL_V20 + V21_ADDITIONS
"""The v21 layout."""

V22_SESSIONS: tuple[str, ...] = _strip((_SESSIONS_ORDINAL, _IDX_SESSIONS_ORDINAL, _TRIGGER_SESSIONS_ORDINAL))
"""v22 on ``sessions``: the ordinal column, its unique index, its allocation trigger."""

V22_MESSAGES_FTS: str = _MESSAGES_FTS_V22.strip()
V22_SEARCH_HAZARD: str = _SEARCH_HAZARD
V22_MESSAGE_TRIGGERS: tuple[str, ...] = _strip((*_TRIGGERS_MID, *_TRIGGERS_FTS_V22))
"""v22 triggers on ``messages``: mid encoding checks, searchable-only FTS sync."""

DDL_V22: tuple[str, ...] = (
    *_strip(tuple(p for p in _DDL_V20_PARTS if p != _MESSAGES_FTS and p not in _TRIGGERS_FTS)),
    *V21_ADDITIONS,
    *V22_SESSIONS,
    V22_MESSAGES_FTS,
    V22_SEARCH_HAZARD,
    *V22_MESSAGE_TRIGGERS,
)
"""The v22 layout."""

V23_ADDITIONS: tuple[str, ...] = (_IDX_MESSAGES_CREATED,)
"""What the v22→v23 step creates (additive)."""

DDL_V23: tuple[str, ...] = DDL_V22 + V23_ADDITIONS
"""The v23 layout."""

V24_ADDITIONS: tuple[str, ...] = _strip((
    _APPROVALS, _INTERACTIONS, _PERMISSION_RULES, *_IDX_USER_REQUESTS,
    *_PLAN_EXECUTION_COLUMNS, *_TURN_USAGE_COLUMNS,
))
"""What the v23→v24 step creates (additive: new tables, new nullable/defaulted columns)."""

DDL_V24: tuple[str, ...] = DDL_V23 + V24_ADDITIONS
"""The v24 layout."""

V25_ADDITIONS: tuple[str, ...] = (
    "ALTER TABLE messages ADD COLUMN wire_cut INTEGER",
    "ALTER TABLE messages ADD COLUMN line_crc INTEGER",
)
"""What the v24→v25 step adds (nullable columns: older rows take the parsing path)."""

DDL_V25: tuple[str, ...] = DDL_V24 + V25_ADDITIONS
"""The v25 layout."""

V26_ADDITIONS: tuple[str, ...] = (
    "ALTER TABLE attachment_blobs ADD COLUMN kind TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN trust TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN provenance TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN source TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN run_id TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN meta_json TEXT",
    "ALTER TABLE attachment_blobs ADD COLUMN deletion_state TEXT NOT NULL DEFAULT 'live' "
    "CHECK (deletion_state IN ('live', 'evicting', 'evicted'))",
    "ALTER TABLE attachment_blobs ADD COLUMN evicted_at INTEGER",
    "ALTER TABLE attachment_refs ADD COLUMN origin TEXT NOT NULL DEFAULT 'client'",
    "ALTER TABLE attachment_refs ADD COLUMN evicted_at INTEGER",
    "CREATE INDEX idx_attachment_refs_evicted ON attachment_refs(session_id, message_id) "
    "WHERE evicted_at IS NOT NULL",
)
"""What the v25→v26 step adds (nullable or defaulted columns, a partial index: additive)."""

DDL_V26: tuple[str, ...] = DDL_V25 + V26_ADDITIONS
"""The v26 layout."""

V27_ADDITIONS: tuple[str, ...] = (
    """CREATE TABLE thread_meta (
  session_id       TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
  tags_json        TEXT NOT NULL DEFAULT '[]',
  folder           TEXT,
  preset           TEXT,
  archived         INTEGER NOT NULL DEFAULT 0,
  parent_thread_id TEXT,                        -- loose ref: the parent may be deleted
  origins_json     TEXT NOT NULL DEFAULT '[]',
  updated_at       INTEGER NOT NULL
) WITHOUT ROWID""",
    "ALTER TABLE run_snapshots ADD COLUMN input_json TEXT",
    "ALTER TABLE run_snapshots ADD COLUMN input_digest TEXT",
)
"""What the v26→v27 step adds: seed 000 §2.1 thread metadata, one row per session that has any
(a new table: additive; the transcript's ``session_info`` line carries the same object, ``thread``,
so a rebuilt index keeps it), and seed 000 §4's turn input bound to its run snapshot (nullable
columns: older snapshots have none)."""

DDL_V27: tuple[str, ...] = DDL_V26 + V27_ADDITIONS
"""The v27 layout."""

# --- v28: tool output search (opt-in) ----------------------------------------------
#
# Tool rows keep ``messages.text`` NULL (seed §4.7: the default index holds
# user/assistant text only). Their output text, bounded, lives in its own table
# and its own trigram index, so ``search.* scope "tools"`` never touches the
# default index or its figures. No positions (``detail=none``): every query's
# candidates are checked against ``tool_output.text`` with the search predicate.
# A message row's deletion takes its output row along (a trigger, not a foreign
# key: ``messages`` tables are rebuilt by migrations).
_TOOL_OUTPUT = "CREATE TABLE tool_output (mid INTEGER PRIMARY KEY, text TEXT NOT NULL)"
_TOOL_FTS = """
CREATE VIRTUAL TABLE tool_fts USING fts5(
  text,
  content='', detail=none,
  tokenize='trigram'
)
"""
_TRIGGERS_TOOL = (
    """CREATE TRIGGER tool_output_ai AFTER INSERT ON tool_output
  BEGIN INSERT INTO tool_fts(rowid, text) VALUES (new.mid, new.text); END""",
    """CREATE TRIGGER tool_output_ad AFTER DELETE ON tool_output
  BEGIN INSERT INTO tool_fts(tool_fts, rowid, text) VALUES ('delete', old.mid, old.text); END""",
    """CREATE TRIGGER tool_output_au AFTER UPDATE ON tool_output
  BEGIN
    INSERT INTO tool_fts(tool_fts, rowid, text) VALUES ('delete', old.mid, old.text);
    INSERT INTO tool_fts(rowid, text) VALUES (new.mid, new.text);
  END""",
    """CREATE TRIGGER messages_tool_output_ad AFTER DELETE ON messages
  BEGIN DELETE FROM tool_output WHERE mid = old.mid; END""",
)

V28_TOOL_SEARCH: tuple[str, ...] = _strip((_TOOL_OUTPUT, _TOOL_FTS, *_TRIGGERS_TOOL))
"""What the v28 step creates for tool output search."""

DDL_V28: tuple[str, ...] = DDL_V27 + V28_TOOL_SEARCH
"""The v28 layout."""

# --- v29: known sessions (seed 003 §5, D318) ---------------------------------------
V29_KNOWN_SESSIONS: tuple[str, ...] = (
    """CREATE TABLE known_sessions (
  id         TEXT PRIMARY KEY,                  -- no foreign key: it outlives the row
  created_at INTEGER NOT NULL,
  deleted_at INTEGER                            -- the user deleted or purged it
) WITHOUT ROWID""",
)
"""What the v29 step creates: every session id the host created (``store/orphans.py``)."""

DDL_V29: tuple[str, ...] = DDL_V28 + V29_KNOWN_SESSIONS
"""The v29 layout."""

# --- v30: turn queue leases ----------------------------------------------------------
V30_QUEUE_LEASES: tuple[str, ...] = (
    "ALTER TABLE turn_queue ADD COLUMN lease TEXT",           # NULL | taken | offered | started
    "ALTER TABLE turn_queue ADD COLUMN lease_turn_id TEXT",   # the turn that began with the entry
    "ALTER TABLE turn_queue ADD COLUMN lease_seq INTEGER",    # the session's last seq when handed out
)
"""What the v30 step adds: a handed-out queue entry stays until its turn ran (``store/queue.py``)."""

DDL_V30: tuple[str, ...] = DDL_V29 + V30_QUEUE_LEASES
"""The v30 layout."""

# --- v31: who took a handed-out queue entry -------------------------------------------
V31_LEASE_CLIENT: tuple[str, ...] = (
    "ALTER TABLE turn_queue ADD COLUMN lease_client TEXT",    # JSON array: the clients it was handed to
)
"""What the v31 step adds: only a client an entry was handed to starts a turn with it (``store/queue.py``)."""

DDL_V31: tuple[str, ...] = DDL_V30 + V31_LEASE_CLIENT
"""The v31 layout."""

# --- v32: the window reads' covering index ---------------------------------------------
V32_WINDOW_INDEX: tuple[str, ...] = (
    "CREATE INDEX idx_messages_window ON messages"
    "(session_id, seq, line_offset, line_len, deleted, turn_id, wire_cut, line_crc)",
)
"""What the v32 step adds: ``index.window_spans`` reads a page from the index alone."""

DDL: tuple[str, ...] = DDL_V31 + V32_WINDOW_INDEX
"""The full current DDL (``SCHEMA_VERSION``), in creation order."""

_ADD_COLUMN = re.compile(r"ALTER\s+TABLE\s+(\w+)\s+ADD\s+(?:COLUMN\s+)?(.*)", re.IGNORECASE | re.DOTALL)
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(\w+)\s*\(", re.IGNORECASE)
_TABLE_CONSTRAINT = re.compile(r"\s*(?:CONSTRAINT|PRIMARY|UNIQUE|CHECK|FOREIGN)\b", re.IGNORECASE)


def _column_insert_at(create: str) -> int:
    """Where SQLite's ``ALTER TABLE … ADD COLUMN`` puts ``, <column>`` in a table's stored ``CREATE TABLE``: before
    the comma that starts the table constraints, or else before the parenthesis that closes the definitions."""
    opening = create.index("(")
    depth, quote, at = 0, "", opening
    for at in range(opening, len(create)):
        ch = create[at]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`[":
            quote = "]" if ch == "[" else ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return at
        elif ch == "," and depth == 1 and _TABLE_CONSTRAINT.match(create, at + 1):
            return at
    raise ValueError(f"no closing parenthesis in {create[:60]!r}")


def _fold_added_columns(statements: Sequence[str]) -> tuple[str, ...]:
    """``statements`` with each ``ALTER TABLE t ADD COLUMN c`` written into ``t``'s ``CREATE TABLE`` as SQLite's
    ALTER writes it (the same ``sqlite_master`` text, the same columns in the same order).

    A fresh database is made by the whole DDL, and an ALTER makes SQLite read the whole schema again: 26 of
    them cost about half of ``apply_schema`` (~1.3 ms each, measured), where the one statement costs nothing
    more. ``tests/store/test_schema.py`` holds the folded schema to the one the statements make one by one."""
    out = list(statements)
    tables = {m.group(1).lower(): i for i, st in enumerate(out) if (m := _CREATE_TABLE.match(st))}
    folded: set[int] = set()
    for j, st in enumerate(statements):
        m = _ADD_COLUMN.match(st)
        i = tables.get(m.group(1).lower(), j) if m is not None else j
        if m is None or i >= j:
            continue
        at, column = _column_insert_at(out[i]), m.group(2).rstrip("; \t\r\n")
        out[i] = f"{out[i][:at]}, {column}{out[i][at:]}"
        folded.add(j)
    return tuple(st for j, st in enumerate(out) if j not in folded)


FRESH_DDL: tuple[str, ...] = _fold_added_columns(DDL)
""":data:`DDL` with its added columns written into their tables: what :func:`apply_schema` runs on a new
database (the same schema, made in half the time)."""


def message_mid(ordinal: int, seq: int) -> int:
    """``messages.mid`` of a session's ``seq`` (see v22 in the module docstring)."""
    return (ordinal << MID_SEQ_BITS) + seq


def apply_schema(
    conn: sqlite3.Connection,
    *,
    statements: Sequence[str] = FRESH_DDL,
    version: int = SCHEMA_VERSION,
    then: Callable[[sqlite3.Connection], None] | None = None,
) -> None:
    """Create the schema on an empty database in ONE transaction (``then``: more writes inside it).

    ``conn`` must be in autocommit mode (``isolation_level=None``) and the
    database must hold no schema objects and ``user_version`` 0. The PRAGMAs
    (notably ``auto_vacuum``) must already be applied. Either every statement
    and ``PRAGMA user_version = version`` commit together, or nothing does.
    ``statements``/``version`` exist so that tests and migrations can build an
    older layout (see ``store.upgrade.migrations.ddl_for_version``).
    """
    if conn.isolation_level is not None:
        raise ValueError("apply_schema needs a connection opened with isolation_level=None")
    if conn.in_transaction:
        raise ValueError("apply_schema must not run inside an open transaction")
    conn.execute("BEGIN IMMEDIATE")
    try:
        existing = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        current = conn.execute("PRAGMA user_version").fetchone()[0]
        if existing or current:
            raise ValueError(
                f"apply_schema needs an empty database; found {existing} schema "
                f"objects and user_version {current}"
            )
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {int(version)}")
        if then is not None:
            then(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
