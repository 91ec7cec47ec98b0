"""The method registry: every JSON-RPC method, its models and its metadata.

The gateway looks a method up in :data:`METHODS`, validates params with
:func:`parse_params`, and serialises what the actor returned with
:func:`dump_result`. Error codes are the stable ``error.data.code`` strings
(``protocol/errors.py`` owns their numeric codes and retriability).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from . import models as m
from .models_common import MutatingParams
from .version import PROTOCOL_VERSION

EVENT_METHOD = "event"


@dataclass(frozen=True, slots=True)
class MethodSpec:
    name: str
    params_model: type[BaseModel]
    result_model: type[BaseModel]
    mutating: bool
    summary: str
    errors: tuple[str, ...]
    session_keys: frozenset[str] = frozenset()
    """The params (both spellings) that name a session: a native pi session id in one is refused before
    validation with ``UNSUPPORTED_FOR_NATIVE_SESSION`` (``runtime/pipeline.py``), a code the method then lists."""


def _codes(*groups: tuple[str, ...]) -> tuple[str, ...]:
    """Concatenate code groups, first occurrence wins."""
    return tuple(dict.fromkeys(code for group in groups for code in group))


# Every method can fail these ways (PAYLOAD_TOO_LARGE: a reply over the reply cap; PERMISSION_DENIED: a
# plugin connection calling a method or reaching data not opened to it, README section 8.5).
_ANY = ("INVALID_PARAMS", "INTERNAL", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")
# Work handed to an actor (mailbox full, no reply in time, actor died, out of file descriptors).
_ACTOR = ("BUSY", "TIMEOUT", "ACTOR_RESTARTED", "SHUTTING_DOWN", "RESOURCE_EXHAUSTED")
_DB_READ = _codes(_ANY, _ACTOR, ("CORRUPT_DATA",))
_DB_WRITE = _codes(_DB_READ, ("IDEMPOTENCY_CONFLICT", "STORAGE_FULL", "IO_ERROR"))
# A native pi session id (`native-pi:...`) is refused by every session method that does not support it.
_SESSION_READ = _codes(_DB_READ, ("INVALID_ID", "SESSION_NOT_FOUND", "IO_ERROR", "UNSUPPORTED_FOR_NATIVE_SESSION",
                                   "STORAGE_FULL"))
# A read that waits for the index to cover every acknowledged append (README section 4): while the disk is full
# (or failing) the wait ends with that error instead of lasting as long (actors/index_log.wait_covered).
_INDEXED = ("STORAGE_FULL", "IO_ERROR")
_SESSION_WRITE = _codes(
    _SESSION_READ, ("IDEMPOTENCY_CONFLICT", "STORAGE_FULL", "PAYLOAD_TOO_LARGE")
)
_PAGED = ("CURSOR_EXPIRED", "INVALID_CURSOR")  # a malformed, forged or foreign cursor: INVALID_CURSOR


def session_keys(params: type[BaseModel]) -> frozenset[str]:
    """The keys of ``params`` that name a session (``sessionId``, ``sourceSessionId`` ...), in their wire
    (camelCase) and Python spellings."""
    keys: set[str] = set()
    for name, field in params.model_fields.items():
        wire = field.alias or name
        if wire == "sessionId" or wire.endswith("SessionId"):
            keys.update((wire, name))
    return frozenset(keys)


def _spec(
    name: str,
    params: type[BaseModel],
    result: type[BaseModel],
    summary: str,
    errors: tuple[str, ...],
) -> MethodSpec:
    mutating = issubclass(params, MutatingParams)
    keys = session_keys(params)
    if keys:  # a native pi session id in one is refused (README section 2, "Ids")
        errors = _codes(errors, ("UNSUPPORTED_FOR_NATIVE_SESSION",))
    return MethodSpec(name, params, result, mutating, summary, errors, keys)


_SPECS: tuple[MethodSpec, ...] = (
    # -- host ---------------------------------------------------------------
    _spec(
        "host.hello",
        m.HelloParams,
        m.HelloResult,
        "Authenticate the connection. Must be the first request.",
        (
            "INVALID_PARAMS",
            "UNAUTHENTICATED",
            "UNSUPPORTED_PROTOCOL",
            "ALREADY_AUTHENTICATED",
            "INTERNAL",
        ),
    ),
    _spec(
        "host.status",
        m.StatusParams,
        m.StatusResult,
        "Versions, uptime, actor and DB-writer statistics, boot recovery report.",
        _codes(_ANY, _ACTOR),
    ),
    _spec(
        "host.createLoginCode",
        m.LoginCodeParams,
        m.LoginCodeResult,
        "A one-time login code for the browser inspector (what `pi-host open` uses).",
        _codes(_ANY, _ACTOR),
    ),
    _spec(
        "logs.append",
        m.LogsAppendParams,
        m.LogsAppendResult,
        "Append the app's or the agent sidecar's records to logs/<source>/<category>.ndjson (rotated, 0600).",
        _codes(_ANY, _ACTOR, ("PERMISSION_DENIED", "LIMIT_EXCEEDED", "STORAGE_FULL", "IO_ERROR")),
    ),
    # -- sessions -----------------------------------------------------------
    _spec(
        "session.create",
        m.SessionCreateParams,
        m.SessionSummary,
        "Create an empty session (header line + index row).",
        _codes(_DB_WRITE, ("INVALID_ID", "CONFLICT")),
    ),
    _spec(
        "session.list",
        m.SessionListParams,
        m.SessionListResult,
        "Sessions by updatedAt, newest first; trashed sessions excluded. Pages follow (updatedAt, id): no "
        "session appears on two pages, and one updated while you page moves ahead of your cursor (to the "
        "first page; the `session.message` event of a new message says so, a `session.updated` event any other "
        "change), so a UI that pages keeps its list with those events.",
        _codes(_DB_READ, _PAGED, _INDEXED),
    ),
    _spec(
        "session.get",
        m.SessionGetParams,
        m.SessionGetResult,
        "A bounded window of the transcript plus every valid compaction.",
        _codes(_SESSION_READ, ("MESSAGE_NOT_FOUND",)),
    ),
    _spec(
        "session.appendMessage",
        m.AppendMessageParams,
        m.AppendMessageResult,
        "Append one message to an existing session (durable before the reply); replays are no-ops.",
        _codes(_SESSION_WRITE, ("CONFLICT", "PERMISSION_DENIED")),
    ),
    _spec(
        "session.rename",
        m.SessionRenameParams,
        m.SessionSummary,
        "Set the title (trimmed, 1-80 characters); updatedAt is unchanged.",
        _SESSION_WRITE,
    ),
    _spec(
        "session.update",
        m.SessionUpdateParams,
        m.SessionSummary,
        "Change provider/model, mode, thinking level, permission mode or project; a mode change that would "
        "break a pending plan/goal contract is CONFLICT.",
        _codes(_SESSION_WRITE, ("CONFLICT",)),
    ),
    _spec(
        "session.updateMetadata",
        m.SessionUpdateMetadataParams,
        m.SessionSummary,
        "Set thread metadata (tags, folder, preset, archive flag, parent thread, origins); the summary "
        "carries it as `thread`.",
        _SESSION_WRITE,
    ),
    _spec(
        "session.delete",
        m.SessionDeleteParams,
        m.SessionDeleteResult,
        "Delete the session, its index rows and both transcript files.",
        _SESSION_WRITE,
    ),
    # -- events -------------------------------------------------------------
    _spec(
        "events.subscribe",
        m.SubscribeParams,
        m.SubscribeResult,
        "Receive 'event' notifications for topics, optionally resuming at a cursor. A plugin connection may "
        "subscribe to settings.changed only and hears its own plugin:<id> namespace (else PERMISSION_DENIED).",
        _codes(_ANY, ("INVALID_ID", "CURSOR_EXPIRED", "LIMIT_EXCEEDED", "UNSUPPORTED_FOR_NATIVE_SESSION")),
    ),
    _spec(
        "events.unsubscribe",
        m.UnsubscribeParams,
        m.OkResult,
        "Stop a subscription of this connection.",
        _codes(_ANY, ("NOT_FOUND",)),
    ),
    # -- turns --------------------------------------------------------------
    _spec(
        "session.startTurn",
        m.StartTurnParams,
        m.Turn,
        "Record a running turn, optionally with its run environment snapshot; in a plan/goal session that a "
        "running task run is bound to it is PLAN_REQUIRES_INTERACTIVE_SESSION.",
        # NOT_FOUND: retryOf names no turn of the session (CONFLICT: one still running)
        _codes(_SESSION_WRITE, ("CONFLICT", "PLAN_REQUIRES_INTERACTIVE_SESSION", "NOT_FOUND")),
    ),
    _spec(
        "session.endTurn",
        m.EndTurnParams,
        m.EndTurnResult,
        "Finish a turn (completed/aborted/error) and maybe create its notification.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "session.turnEnvironment",
        m.TurnEnvironmentParams,
        m.TurnEnvironmentResult,
        "Read a turn's environment snapshot back, digest verified.",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "session.saveInflightMessage",
        m.SaveInflightParams,
        m.SaveInflightResult,
        "Checkpoint the streaming assistant reply (atomic replace).",
        _codes(_SESSION_WRITE, ("CONFLICT", "NOT_FOUND")),
    ),
    _spec(
        "session.recoverInflight",
        m.RecoverInflightParams,
        m.RecoverInflightResult,
        "The sidecar is gone: settle the leftover checkpoint (with none, the turn's streaming reservation) "
        "as the boot sweep would; a running turn ends aborted. A turnId of another session, or one this "
        "session has no trace of, is NOT_FOUND (as session.endTurn).",
        _codes(_SESSION_WRITE, ("CONFLICT", "NOT_FOUND")),
    ),
    # -- notifications ------------------------------------------------------
    _spec(
        "notifications.list",
        m.NotificationsListParams,
        m.NotificationsListResult,
        "The notification inbox, newest first, with the unread count (a trashed session's are left out).",
        _codes(_DB_READ, _PAGED),
    ),
    _spec(
        "notifications.markRead",
        m.NotificationsMarkReadParams,
        m.UpdatedResult,
        "Mark notifications read (idempotent).",
        _DB_WRITE,
    ),
    _spec(
        "notifications.markAllRead",
        m.NotificationsMarkAllReadParams,
        m.UpdatedResult,
        "Mark every notification in the inbox read.",
        _DB_WRITE,
    ),
    _spec(
        "notifications.clear",
        m.NotificationsClearParams,
        m.DeletedResult,
        "Delete the given notifications, or all of the inbox's.",
        _DB_WRITE,
    ),
    # -- queue --------------------------------------------------------------
    _spec(
        "session.queuePush",
        m.QueuePushParams,
        m.QueuePushResult,
        "Queue a prompt behind the active turn (at most 8 per session). In a Plan/Goal session while a task run "
        "bound to it is running: PLAN_REQUIRES_INTERACTIVE_SESSION, nothing queued.",
        _codes(_SESSION_WRITE, ("LIMIT_EXCEEDED", "PLAN_REQUIRES_INTERACTIVE_SESSION")),
    ),
    _spec(
        "session.queueList",
        m.QueueListParams,
        m.QueueState,
        "The session's queue in delivery order and whether it is held.",
        _SESSION_READ,
    ),
    _spec(
        "session.queueRemove",
        m.QueueEntryParams,
        m.QueueState,
        "Remove one entry; the others keep their positions. A queued collaboration delivery the entry admitted "
        "is cancelled with it (collab.delivery to both ends).",
        _codes(_SESSION_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "session.queuePrioritize",
        m.QueueEntryParams,
        m.QueueState,
        "'Send now': deliver this entry before unpromoted ones.",
        _codes(_SESSION_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "session.queueReorder",
        m.QueueReorderParams,
        m.QueueState,
        "Swap an unpromoted entry with its neighbour; a promoted entry, or one with no unpromoted neighbour that way "
        "(the first moved up, the last moved down), is CONFLICT and nothing moves.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "session.queueAttach",
        m.QueueControllerParams,
        m.QueueState,
        "Become the session's queue controller; releases a held queue (what was taken and no turn "
        "began with is offered again).",
        _codes(_SESSION_WRITE, ("CONFLICT",)),
    ),
    _spec(
        "session.queueTake",
        m.QueueControllerParams,
        m.QueueTakeResult,
        "Hand out the next entry after a terminal turn event (controller only); it is leased until its turn ran.",
        _codes(_SESSION_WRITE, ("CONFLICT",)),
    ),
    # -- artifacts ----------------------------------------------------------
    _spec(
        "artifacts.list",
        m.ArtifactsListParams,
        m.ArtifactsListResult,
        "Files sessions produced, newest first.",
        _codes(_DB_READ, _PAGED, ("INVALID_ID",), _INDEXED),
    ),
    _spec(
        "audit.list",
        m.AuditListParams,
        m.AuditListResult,
        "The audit log (tool_execute, tool_denied, …), newest first; by session, kind and time range.",
        _codes(_DB_READ, _PAGED, ("INVALID_CURSOR", "INVALID_ID"), _INDEXED),
    ),
    # -- revisions and rewrites --------------------------------------------
    _spec(
        "session.saveActiveRevision",
        m.SaveActiveRevisionParams,
        m.RevisionResult,
        "Archive the live branch of a regenerate family (reference line).",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND",)),
    ),
    _spec(
        "session.activateRevision",
        m.ActivateRevisionParams,
        m.ActivateRevisionResult,
        "Switch the live transcript to an archived branch.",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND", "NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "session.listRevisions",
        m.ListRevisionsParams,
        m.ListRevisionsResult,
        "Archived branches, per family.",
        _SESSION_READ,
    ),
    _spec(
        "session.truncateFrom",
        m.TruncateFromParams,
        m.TruncateFromResult,
        "Cut the transcript at a named message (regenerate, edit, retry).",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND", "PERMISSION_DENIED")),
    ),
    _spec(
        "session.replaceMessages",
        m.ReplaceMessagesParams,
        m.SessionResult,
        "Atomically rewrite the whole transcript with these messages.",
        _codes(_SESSION_WRITE, ("PERMISSION_DENIED", "CONFLICT")),
    ),
    _spec(
        "session.appendCompaction",
        m.AppendCompactionParams,
        m.AppendCompactionResult,
        "Append a model-context checkpoint line. Its throughMessageId and firstKeptMessageId must be messages "
        "of the session (MESSAGE_NOT_FOUND); a firstKeptMessageId further than one message past throughMessageId "
        "(messages between neither summarized nor kept) is INVALID_PARAMS (field compaction.firstKeptMessageId), "
        "nothing written.",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "session.fork",
        m.ForkParams,
        m.SessionSummary,
        "Copy the transcript (or a prefix) into a new independent session.",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND",)),
    ),
    _spec(
        "session.assistantEdit",
        m.AssistantEditParams,
        m.AssistantEditResult,
        "Assistant Edit: fork through an assistant reply with its content replaced; the child's revisions "
        "hold the original and the edited tail.",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "session.deleteMessage",
        m.MessageIdParams,
        m.TombstoneResult,
        "Hide a message with a tombstone line (reversible). A message only an archived branch holds (a "
        "regenerate or edit moved it out of the transcript) is tombstoned on that branch's revision line: "
        "activating the branch brings it back deleted (no session.message event).",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND",)),
    ),
    _spec(
        "session.restoreMessage",
        m.MessageIdParams,
        m.TombstoneResult,
        "Undo deleteMessage.",
        _codes(_SESSION_WRITE, ("MESSAGE_NOT_FOUND",)),
    ),
    _spec(
        "session.tree",
        m.SessionReadParams,
        m.TreeResult,
        "The conversation tree: live transcript plus archived branches.",
        _SESSION_READ,
    ),
    _spec(
        "session.context",
        m.SessionReadParams,
        m.ContextResult,
        "Provider-neutral model context (buildSessionContext).",
        _SESSION_READ,
    ),
    # -- search -------------------------------------------------------------
    _spec(
        "search.sessions",
        m.SearchSessionsParams,
        m.SearchSessionsResult,
        "Find sessions by title, project path and message text.",
        _codes(_DB_READ, _PAGED, ("INVALID_CURSOR",), _INDEXED),
    ),
    _spec(
        "search.query",
        m.SearchQueryParams,
        m.SearchQueryResult,
        "Find messages (optionally within one session).",
        _codes(_DB_READ, _PAGED, ("INVALID_CURSOR", "INVALID_ID", "SESSION_NOT_FOUND"), _INDEXED),
    ),
    # -- secrets (seed 003 §4.12) ------------------------------------------
    _spec(
        "secrets.set",
        m.SecretsSetParams,
        m.SecretsSetResult,
        "Encrypt and store a secret value (file backend); the value is never echoed. The value of "
        "`configSync/vaultKey` must be a vault key (32 bytes, base64): anything else is INVALID_PARAMS "
        "(field `value`) and nothing is stored.",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE",)),
    ),
    _spec(
        "secrets.get",
        m.SecretsRefParams,
        m.SecretsGetResult,
        "Decrypt one secret (clientKind agent or ui only); tampering is CORRUPT_DATA.",
        _codes(_DB_READ, ("NOT_FOUND", "PERMISSION_DENIED", "IO_ERROR")),
    ),
    _spec(
        "secrets.delete",
        m.SecretsDeleteParams,
        m.SecretsDeleteResult,
        "Remove a secret's file and its bookkeeping row.",
        _DB_WRITE,
    ),
    _spec(
        "secrets.list",
        m.SecretsListParams,
        m.SecretsListResult,
        "Which secrets exist (secrets_meta); never values.",
        _DB_READ,
    ),
    # -- review-change snapshots (seed 003 §2.0) -------------------------------
    _spec(
        "review.record",
        m.ReviewRecordParams,
        m.ReviewRecordResult,
        "Record a Write/Edit tool's previous bytes under review-changes/<sid>/<snapshotId>/ (bounded); "
        "the result's review record goes into the tool result's details.review.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "LIMIT_EXCEEDED")),
    ),
    _spec(
        "review.get",
        m.ReviewGetParams,
        m.ReviewGetResult,
        "One review snapshot (path, hashes, state, owner), with its before bytes on request.",
        _codes(_SESSION_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "review.list",
        m.ReviewListParams,
        m.ReviewListResult,
        "A session's review snapshots, oldest first (optionally one message's).",
        _SESSION_READ,
    ),
    _spec(
        "review.restore",
        m.ReviewRestoreParams,
        m.ReviewRestoreResult,
        "Put a snapshot's before bytes back into the workspace; FILE_CHANGED when the file is no longer "
        "what the tool wrote (by hash).",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "FILE_CHANGED")),
    ),
    # -- attachments (seed 000 §2.3, §5) -------------------------------------
    _spec(
        "attachments.put",
        m.AttachmentsPutParams,
        m.AttachmentBlob,
        "Store bytes (base64, at most 4 MiB) content-addressed under attachments/<sha256>.",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE",)),
    ),
    _spec(
        "attachments.importFile",
        m.AttachmentsImportParams,
        m.AttachmentBlob,
        "Copy a local file into the blob store as a stream (hash while copying).",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE", "NOT_FOUND")),
    ),
    _spec(
        "attachments.ref",
        m.AttachmentsRefParams,
        m.AttachmentsRefResult,
        "Record that a session (message) references a stored blob.",
        _codes(_DB_WRITE, ("NOT_FOUND", "SESSION_NOT_FOUND", "INVALID_ID")),
    ),
    _spec(
        "attachments.get",
        m.AttachmentsGetParams,
        m.AttachmentsGetResult,
        "A blob's metadata (kind, trust, provenance, source, run, page/image), deletion state, references.",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "attachments.estimate",
        m.AttachmentsEstimateParams,
        m.AttachmentsEstimate,
        "Blob usage against the budget; warning above 80 %.",
        _DB_READ,
    ),
    _spec(
        "attachments.gc",
        m.AttachmentsGcParams,
        m.AttachmentsGcResult,
        "Sweep blobs nothing references any more (past the grace), then evict least recently used blobs "
        "over budget (never the active session's); refs before bytes.",
        _codes(_DB_WRITE, ("UNSUPPORTED_FOR_NATIVE_SESSION",)),
    ),
    # -- scheduled tasks (seed 003 §4.11) ------------------------------------
    _spec(
        "tasks.create",
        m.TasksCreateParams,
        m.ScheduledTask,
        "Create a scheduled task (schedule, permission, model, thinking level at the top level or in config).",
        _codes(_DB_WRITE, ("CONFLICT", "NOT_FOUND")),
    ),
    _spec(
        "tasks.update",
        m.TasksUpdateParams,
        m.ScheduledTask,
        "Change a task's fields; nextRunAt is recomputed.",
        _codes(_DB_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "tasks.delete",
        m.TasksDeleteParams,
        m.TasksDeleteResult,
        "Delete a task and its run history.",
        _codes(_DB_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "tasks.list",
        m.TasksListParams,
        m.TasksListResult,
        "Every scheduled task, oldest first.",
        _DB_READ,
    ),
    _spec(
        "tasks.get",
        m.TaskIdParams,
        m.ScheduledTask,
        "One scheduled task.",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "tasks.runs",
        m.TasksRunsParams,
        m.TasksRunsResult,
        "A task's run history, newest first (last 100 kept).",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "tasks.startRun",
        m.TasksStartRunParams,
        m.TaskRun,
        "Record a running run; Plan/Goal tasks or sessions fail first with PLAN_REQUIRES_INTERACTIVE_SESSION.",
        _codes(_DB_WRITE, ("NOT_FOUND", "SESSION_NOT_FOUND", "CONFLICT", "PLAN_REQUIRES_INTERACTIVE_SESSION")),
    ),
    _spec(
        "tasks.finishRun",
        m.TasksFinishRunParams,
        m.TaskRun,
        "Settle a running run (completed/aborted/error).",
        _codes(_DB_WRITE, ("NOT_FOUND", "CONFLICT"), ("SESSION_NOT_FOUND",)),
    ),
    # -- plan / goal approvals (seed 003 §4.6a) ------------------------------
    _spec(
        "plans.submit",
        m.PlansSubmitParams,
        m.PlanApproval,
        "Write the exact Markdown to a unique .pi/<kind>/*.md and open the session's one pending approval; "
        "refused with PLAN_REQUIRES_INTERACTIVE_SESSION while a task run bound to the session is running.",
        _codes(_SESSION_WRITE, ("CONFLICT", "NOT_FOUND", "PLAN_REQUIRES_INTERACTIVE_SESSION")),
    ),
    _spec(
        "plans.pending",
        m.PlansPendingParams,
        m.PlansPendingResult,
        "Pending, unexpired plan/goal approvals only, with their original expiresAt.",
        _DB_READ,
    ),
    _spec(
        "plans.respond",
        m.PlansRespondParams,
        m.PlansRespondResult,
        "Approve (session → agent, execution queued) or reject; stale responses are CONFLICT; only a UI "
        "answers (clientKind agent or cli gets PERMISSION_DENIED).",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "PERMISSION_DENIED")),
    ),
    # -- pending user requests (seed 000 §2) ---------------------------------
    _spec(
        "approvals.request",
        m.ApprovalsRequestParams,
        m.ApprovalsRequestResult,
        "A running turn asks for a tool permission: pending, or answered at once by a permission rule.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "approvals.pending",
        m.ApprovalsPendingParams,
        m.ApprovalsPendingResult,
        "Pending, unexpired permission requests (one session's or every session's).",
        _DB_READ,
    ),
    _spec(
        "approvals.respond",
        m.ApprovalsRespondParams,
        m.ApprovalsRespondResult,
        "A UI answers a permission request once (recorded in the transcript); a second or late answer is CONFLICT.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "PERMISSION_DENIED")),
    ),
    _spec(
        "approvals.rules",
        m.ApprovalsRulesParams,
        m.ApprovalsRulesResult,
        "Stored permission rules (every one, or those that apply to a session).",
        _codes(_DB_READ, ("SESSION_NOT_FOUND",)),
    ),
    _spec(
        "approvals.removeRule",
        m.ApprovalsRemoveRuleParams,
        m.ApprovalsRemoveRuleResult,
        "Forget a permission rule (later requests for that tool ask again).",
        _DB_WRITE,
    ),
    _spec(
        "interactions.request",
        m.InteractionsRequestParams,
        m.InteractionsRequestResult,
        "A running turn asks the user a question (choices and/or free text).",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "interactions.pending",
        m.InteractionsPendingParams,
        m.InteractionsPendingResult,
        "Pending, unexpired questions (one session's or every session's).",
        _DB_READ,
    ),
    _spec(
        "interactions.respond",
        m.InteractionsRespondParams,
        m.InteractionsRespondResult,
        "A UI answers a question once (recorded in the transcript); a second or late answer is CONFLICT.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "PERMISSION_DENIED")),
    ),
    _spec(
        "plans.startExecution",
        m.PlansStartExecutionParams,
        m.PlanExecutionResult,
        "An approved plan/goal's execution starts in a running turn (queued → running).",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "plans.finishExecution",
        m.PlansFinishExecutionParams,
        m.PlanExecutionResult,
        "End an execution from its turn (completed | failed | cancelled); a queued one can only be cancelled.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    # -- the session collaboration ledger (seed 003 §4.6c) -------------------
    _spec(
        "collab.deliver",
        m.CollabDeliverParams,
        m.CollabDeliverResult,
        "Deliver a task/message from one session to another: ledger row + the target's queue admission, at once. "
        "A target in Plan/Goal mode while a task run bound to it is running: PLAN_REQUIRES_INTERACTIVE_SESSION.",
        _codes(_SESSION_WRITE, ("CONFLICT", "LIMIT_EXCEEDED", "PERMISSION_DENIED",
                                "PLAN_REQUIRES_INTERACTIVE_SESSION")),
    ),
    _spec(
        "collab.begin",
        m.CollabBeginParams,
        m.CollabBeginResult,
        "The target's running turn begins a delivery: turnId bound, the input row written with its provenance.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT", "PERMISSION_DENIED")),
    ),
    _spec(
        "collab.settle",
        m.CollabSettleParams,
        m.CollabSettleResult,
        "Settle a running delivery from its turn; at most one completion callback is queued for the source.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "collab.cancel",
        m.CollabCancelParams,
        m.CollabCancelResult,
        "Cancel a queued or running delivery (its queue admission goes; the target session stays). A cancelled "
        "one is answered as it is, changing nothing; one that already ended otherwise is CONFLICT (data.status).",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "collab.list",
        m.CollabListParams,
        m.CollabListResult,
        "Deliveries, newest first (a session's incoming/outgoing; available: false for a deleted end).",
        _codes(_DB_READ, ("INVALID_CURSOR",)),
    ),
    _spec(
        "collab.get",
        m.CollabGetParams,
        m.CollabDelivery,
        "One delivery with both ends (available: false once a session is gone).",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "session.verifyEnvironment",
        m.VerifyEnvironmentParams,
        m.VerifyEnvironmentResult,
        "Before recovering a turn: its snapshot (digest checked) must still bind to the current provider, "
        "session and credential references; drift is ENVIRONMENT_DRIFT, a rotated secret passes.",
        _codes(_SESSION_READ, ("NOT_FOUND", "ENVIRONMENT_DRIFT")),
    ),
    # -- usage (seed 003 §4.6) ------------------------------------------------
    _spec(
        "usage.session",
        m.UsageSessionParams,
        m.UsageSessionResult,
        "A session's tokens and cost: totals and one rollup per provider/model.",
        _codes(_DB_READ, ("SESSION_NOT_FOUND",)),
    ),
    _spec(
        "usage.history",
        m.UsageHistoryParams,
        m.UsageHistoryResult,
        "Tokens and cost per day of the turns that ended in the last N days (idx_turns_ended_at).",
        _codes(_DB_READ, ("SESSION_NOT_FOUND",)),
    ),
    _spec(
        "session.listTurns",
        m.ListTurnsParams,
        m.ListTurnsResult,
        "A session's turns, newest first, with status, usage and retry lineage (retryOf).",
        _codes(_DB_READ, ("SESSION_NOT_FOUND", "INVALID_CURSOR")),
    ),
    # -- projects (seed 003 §4.2) ----------------------------------------------
    _spec(
        "projects.list",
        m.ProjectsListParams,
        m.ProjectsListResult,
        "The Project archive index.",
        _DB_READ,
    ),
    _spec(
        "projects.remove",
        m.ProjectsRemoveParams,
        m.ProjectsRemoveResult,
        "Delete a project's sessions (rows and files), those in the trash too, its row and project memory; "
        "never its folder.",
        _codes(_SESSION_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    # -- settings -----------------------------------------------------------
    _spec(
        "settings.get",
        m.SettingsGetParams,
        m.SettingsGetResult,
        "Read one key of a kv namespace (app: one field of the settings blob, normalized).",
        _codes(_DB_READ, ("PERMISSION_DENIED",)),
    ),
    _spec(
        "settings.set",
        m.SettingsSetParams,
        m.SettingsSetResult,
        "Write one key of a kv namespace, by its rules (app: one field of the settings blob, merged).",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    # -- configuration: settings, workspace, projects, providers, models, plugins, sync (issue 13)
    _spec(
        "settings.getAll",
        m.SettingsGetAllParams,
        m.SettingsGetAllResult,
        "Every key of a small namespace (app: the normalized settings blob, defaults filled in).",
        _codes(_DB_READ, ("PERMISSION_DENIED",)),
    ),
    _spec(
        "settings.update",
        m.SettingsUpdateParams,
        m.SettingsUpdateResult,
        "Write several keys of one namespace at once (merged; all or none).",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "settings.delete",
        m.SettingsDeleteParams,
        m.SettingsDeleteResult,
        "Remove one key (app: one field of the settings blob).",
        _codes(_DB_WRITE, ("PERMISSION_DENIED",)),
    ),
    # -- skills and memories (seed 000 §2 ``skills, memories``) -------------------------------
    _spec(
        "skills.list",
        m.SkillsListParams,
        m.SkillsListResult,
        "Every stored skill's name, version, digest and size (no source).",
        _DB_READ,
    ),
    _spec(
        "skills.get",
        m.SkillsGetParams,
        m.SkillResult,
        "One skill with its source text.",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "skills.put",
        m.SkillsPutParams,
        m.SkillsPutResult,
        "Store a skill by name (bounded); one version names one source (other source: CONFLICT).",
        _codes(_DB_WRITE, ("CONFLICT", "LIMIT_EXCEEDED", "PAYLOAD_TOO_LARGE")),
    ),
    _spec(
        "skills.delete",
        m.SkillsDeleteParams,
        m.SkillsDeleteResult,
        "Remove a skill (deleted: false when it was not stored).",
        _DB_WRITE,
    ),
    _spec(
        "memories.list",
        m.MemoriesListParams,
        m.MemoriesListResult,
        "One page of stored project (or group) memories: key, entry count, size, updatedAt.",
        _DB_READ,
    ),
    _spec(
        "workspace.open",
        m.WorkspaceOpenParams,
        m.WorkspaceResult,
        "Upsert the project by its canonical path and make it the visible workspace (kv(app, currentProjectId)).",
        _DB_WRITE,
    ),
    _spec(
        "workspace.get",
        m.WorkspaceGetParams,
        m.WorkspaceResult,
        "The visible workspace (restores currentProjectId; changes nothing).",
        _DB_READ,
    ),
    _spec(
        "session.resolvePath",
        m.SessionResolvePathParams,
        m.SessionResolvePathResult,
        "A session's own persisted project root (never the visible workspace) and a path resolved against it. "
        "In a session without a project, a relative path is CONFLICT (data.reason: no_project_root); an "
        "absolute one comes back folded, insideRoot false.",
        _codes(_DB_READ, ("SESSION_NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "projects.pin",
        m.ProjectsPinParams,
        m.ProjectResult,
        "Pin or unpin a project row.",
        _codes(_DB_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "projectGroups.list",
        m.ProjectGroupsListParams,
        m.ProjectGroupsListResult,
        "Stored project groups, then path projects projected as legacy single-root groups.",
        _DB_READ,
    ),
    _spec(
        "projectGroups.get",
        m.ProjectGroupsGetParams,
        m.ProjectGroupsGetResult,
        "One group with its memory and instructions.",
        _codes(_DB_READ, ("NOT_FOUND",)),
    ),
    _spec(
        "projectGroups.save",
        m.ProjectGroupsSaveParams,
        m.ProjectGroupResult,
        "Create a group or replace its name, roots and primary root (removed roots become detached paths). "
        "Roots are distinct once canonical and primaryRoot is one of them; a legacy project:<id> projection is "
        "read-only (each INVALID_PARAMS naming the field); a root another group holds is CONFLICT.",
        _codes(_DB_WRITE, ("NOT_FOUND", "CONFLICT")),
    ),
    _spec(
        "projectGroups.delete",
        m.ProjectGroupsDeleteParams,
        m.ProjectGroupsDeleteResult,
        "Delete a group record with its memory and instructions (sessions and files stay).",
        _DB_WRITE,
    ),
    _spec(
        "projectGroups.setMemory",
        m.ProjectGroupsSetMemoryParams,
        m.ProjectGroupsMemoryResult,
        "Set a group's memory (entries-v1 or text, at most 32 KiB of content; empty removes it).",
        _codes(_DB_WRITE, ("NOT_FOUND", "PAYLOAD_TOO_LARGE")),
    ),
    _spec(
        "projectGroups.setInstructions",
        m.ProjectGroupsSetInstructionsParams,
        m.ProjectGroupsInstructionsResult,
        "Set a group's shared instructions (at most 32 KiB; blank removes them).",
        _codes(_DB_WRITE, ("NOT_FOUND", "PAYLOAD_TOO_LARGE")),
    ),
    _spec(
        "providers.list",
        m.ProvidersListParams,
        m.ProvidersListResult,
        "Provider rows in display order (a plugin sees only its own); never an API key.",
        _DB_READ,
    ),
    _spec(
        "providers.get",
        m.ProvidersGetParams,
        m.ProviderResult,
        "One provider row; never its API key.",
        _codes(_DB_READ, ("NOT_FOUND", "PERMISSION_DENIED")),
    ),
    _spec(
        "providers.create",
        m.ProvidersCreateParams,
        m.ProviderResult,
        "Create a user provider; its apiKey goes to the secret store only.",
        _codes(_DB_WRITE, ("CONFLICT", "LIMIT_EXCEEDED", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "providers.update",
        m.ProvidersUpdateParams,
        m.ProviderResult,
        "Edit a user provider (not a plugin's row); apiKey replaces or (null) removes the stored key.",
        _codes(_DB_WRITE, ("NOT_FOUND", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "providers.delete",
        m.ProvidersDeleteParams,
        m.ProvidersDeleteResult,
        "Delete a user provider, its models and its stored key.",
        _codes(_DB_WRITE, ("NOT_FOUND", "PERMISSION_DENIED")),
    ),
    _spec(
        "providers.reorder",
        m.ProvidersReorderParams,
        m.ProvidersReorderResult,
        "Set the display order (kv(app, providers.order)); ids no provider has are ignored.",
        _DB_WRITE,
    ),
    _spec(
        "providers.sync",
        m.ProvidersSyncParams,
        m.ProvidersSyncResult,
        "A plugin declares its providers: its rows are upserted, the ones it no longer declares deleted.",
        _codes(_DB_WRITE, ("CONFLICT", "LIMIT_EXCEEDED", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "models.list",
        m.ModelsListParams,
        m.ModelsListResult,
        "The model catalog (one provider's, or all; a plugin sees its own providers' models).",
        _codes(_DB_READ, ("NOT_FOUND", "PERMISSION_DENIED")),
    ),
    _spec(
        "models.add",
        m.ModelsAddParams,
        m.ModelResult,
        "Add (or take over) a model as source=user; refreshes never overwrite it.",
        _codes(_DB_WRITE, ("NOT_FOUND", "LIMIT_EXCEEDED")),
    ),
    _spec(
        "models.remove",
        m.ModelsRemoveParams,
        m.ModelsRemoveResult,
        "Remove a user-added model (discovered ones are managed by models.refresh).",
        _DB_WRITE,
    ),
    _spec(
        "models.refresh",
        m.ModelsRefreshParams,
        m.ModelsRefreshResult,
        "Fetch GET {baseUrl}/models with the provider's key; upsert discovered rows (user rows untouched).",
        _codes(_DB_WRITE, ("NOT_FOUND", "PROVIDER_UNAUTHORIZED", "PROVIDER_TIMEOUT", "PROVIDER_UNREACHABLE",
                           "PROVIDER_BAD_REPLY")),
    ),
    _spec(
        "plugins.list",
        m.PluginsListParams,
        m.PluginsListResult,
        "The entries of plugins/registry.json.",
        _codes(_ANY, _ACTOR, ("CORRUPT_DATA", "IO_ERROR")),
    ),
    _spec(
        "plugins.register",
        m.PluginsRegisterParams,
        m.PluginResult,
        "Add or update a plugin's registry entry (the file is replaced atomically); `assets` installs its "
        "validated read-only assets, replacing the whole set.",
        _codes(_DB_WRITE, ("PAYLOAD_TOO_LARGE",)),
    ),
    _spec(
        "plugins.setEnabled",
        m.PluginsSetEnabledParams,
        m.PluginResult,
        "Enable or disable a registered plugin.",
        _codes(_DB_WRITE, ("NOT_FOUND",)),
    ),
    _spec(
        "plugins.uninstall",
        m.PluginsUninstallParams,
        m.PluginsUninstallResult,
        "Remove the registry entry, delete kv(plugin:<id>) in one statement, release its provider rows.",
        _DB_WRITE,
    ),
    _spec(
        "plugins.listAssets",
        m.PluginsListAssetsParams,
        m.PluginsListAssetsResult,
        "A plugin's installed read-only assets (no bytes); a plugin connection sees only its own.",
        _codes(_ANY, _ACTOR, ("CORRUPT_DATA", "IO_ERROR", "PERMISSION_DENIED")),
    ),
    _spec(
        "plugins.getAsset",
        m.PluginsGetAssetParams,
        m.PluginsGetAssetResult,
        "One installed asset with its bytes, digest verified; a plugin connection reads only its own.",
        _codes(_ANY, _ACTOR, ("CORRUPT_DATA", "IO_ERROR", "NOT_FOUND", "PERMISSION_DENIED")),
    ),
    _spec(
        "configSync.get",
        m.ConfigSyncGetParams,
        m.ConfigSyncState,
        "Sync settings (refs only, never a secret) and which bundles exist.",
        _codes(_DB_READ, ("IO_ERROR",)),
    ),
    _spec(
        "configSync.configure",
        m.ConfigSyncConfigureParams,
        m.ConfigSyncState,
        "Set sync settings; the WebDAV password and the vault key go to the secret store.",
        _DB_WRITE,
    ),
    _spec(
        "configSync.export",
        m.ConfigSyncExportParams,
        m.ConfigSyncExportResult,
        "Encrypt the portable configuration into a bundle (written to config-sync/pending.bin).",
        _codes(_DB_WRITE, ("CONFLICT", "PAYLOAD_TOO_LARGE")),
    ),
    _spec(
        "configSync.apply",
        m.ConfigSyncApplyParams,
        m.ConfigSyncApplyResult,
        "Verify, decrypt and merge a bundle in one transaction; a tampered or foreign-keyed one changes nothing.",
        _codes(_DB_WRITE, ("CONFLICT", "NOT_FOUND", "PAYLOAD_TOO_LARGE", "LIMIT_EXCEEDED")),
    ),
    # -- history in and out: imports, plugin imports, trash, export (seed 003 §4.5, §10.4, §12) --------
    _spec(
        "import.sessions",
        m.ImportSessionsParams,
        m.ImportSessionsResult,
        "Import every session of another agent under a root (one transaction per session; import.progress "
        "events); a re-import appends only what is new.",
        _codes(_DB_WRITE, ("NOT_FOUND", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "plugins.importSession",
        m.PluginImportSessionParams,
        m.PluginImportSessionResult,
        "A plugin imports one session (host-generated id; pluginId + sourceId + externalId is idempotent).",
        _codes(_DB_WRITE, ("NOT_FOUND", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
    _spec(
        "plugins.listSessions",
        m.PluginListSessionsParams,
        m.PluginListSessionsResult,
        "The calling plugin's imported sessions with their origin (trashed ones only when asked).",
        _codes(_DB_READ, ("PERMISSION_DENIED",), _INDEXED),
    ),
    _spec(
        "sessions.trash",
        m.TrashParams,
        m.TrashResult,
        "Move a session to the trash: hidden from lists, plugin reads, search and the notification inbox; "
        "nothing is removed.",
        _codes(_SESSION_WRITE, ("PERMISSION_DENIED",)),
    ),
    _spec(
        "sessions.restore",
        m.TrashParams,
        m.TrashResult,
        "Bring a session back from the trash, exactly as it was.",
        _codes(_SESSION_WRITE, ("PERMISSION_DENIED",)),
    ),
    _spec(
        "sessions.purge",
        m.TrashParams,
        m.PurgeResult,
        "Remove a trashed session for good: its rows, transcript and origin.",
        _codes(_SESSION_WRITE, ("CONFLICT", "PERMISSION_DENIED")),
    ),
    _spec(
        "sessions.listTrashed",
        m.ListTrashedParams,
        m.ListTrashedResult,
        "Sessions in the trash, most recently trashed first (a plugin sees only its own).",
        _codes(_DB_READ, _INDEXED),
    ),
    _spec(
        "session.export",
        m.SessionExportParams,
        m.SessionExportResult,
        "Markdown, a self-contained HTML page or this host's JSONL; secrets and thinking excluded by default.",
        # NOT_FOUND: outPath's directory does not exist
        _codes(_SESSION_READ, ("CONFLICT", "NOT_FOUND", "PAYLOAD_TOO_LARGE", "PERMISSION_DENIED")),
    ),
)

METHODS: Mapping[str, MethodSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
EVENTS: Mapping[str, type[BaseModel]] = m.EVENT_PAYLOADS


def get_spec(method: str) -> MethodSpec:
    """The spec of ``method``; ``KeyError`` if unknown (→ METHOD_NOT_FOUND)."""
    return METHODS[method]


def parse_params(method: str, raw: Any) -> BaseModel:
    """Validate the params of ``method``.

    ``raw`` is the decoded JSON ``params`` (omitted params count as ``{}``).
    Raises ``KeyError`` for an unknown method and ``pydantic.ValidationError``
    (→ INVALID_PARAMS, with field-level ``errors()``) for bad params.
    """
    spec = METHODS[method]
    return spec.params_model.model_validate({} if raw is None else raw)


def dump_result(method: str, obj: Any) -> dict[str, Any]:
    """Serialise what a handler returned as the JSON ``result`` of ``method``.

    ``obj`` may be the result model, another model, or a plain mapping; it is
    validated against the result model (a mismatch is a host bug and raises
    ``pydantic.ValidationError``). camelCase keys, ``None`` values omitted.
    """
    model = METHODS[method].result_model
    if isinstance(obj, model):
        result = obj
    else:
        result = model.model_validate(obj.model_dump(by_alias=True) if isinstance(obj, BaseModel) else obj)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def dump_event(
    topic: str,
    data: Any,
    *,
    cursor: int,
    subscription_id: str,
    session_id: str | None = None,
) -> dict[str, Any]:
    """The ``params`` of an ``event`` notification for ``topic``.

    ``data`` is validated against the topic's payload model (``KeyError`` for
    an unknown topic).
    """
    payload_model = EVENTS[topic]
    if not isinstance(data, payload_model):
        if isinstance(data, BaseModel):
            data = data.model_dump(by_alias=True)
        data = payload_model.model_validate(data)
    params = m.EventParams(
        topic=topic,  # type: ignore[arg-type]  # checked by the Literal
        cursor=cursor,
        subscription_id=subscription_id,
        session_id=session_id,
        data=data.model_dump(mode="json", by_alias=True, exclude_none=True),
    )
    return params.model_dump(mode="json", by_alias=True, exclude_none=True)


__all__ = [
    "EVENTS",
    "EVENT_METHOD",
    "METHODS",
    "MethodSpec",
    "PROTOCOL_VERSION",
    "dump_event",
    "dump_result",
    "get_spec",
    "parse_params",
]
