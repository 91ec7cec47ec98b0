"""Record shapes shared by several methods and events.

Client-sent records (``TranscriptMessage``, ``Compaction``) are strict: they
end up in the transcript file. Host-produced projections (``SessionSummary``,
``UiMessage``, ``Turn`` ...) are results: extra keys are kept.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from store.rules import (
    COLLAB_INPUT_ID_PREFIX,
    MAX_FOLDER_CHARS,
    MAX_ORIGIN_CHARS,
    MAX_PRESET_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_THREAD_ORIGINS,
)

from .blocks import Blocks, check_block
from .models_common import (
    MAX_ATTACHMENTS,
    MAX_RETAINED_TAIL,
    Count,
    ErrorCode,
    JsonObject,
    Mode,
    NotificationKind,
    PermissionMode,
    Record,
    Ref,
    Result,
    Rfc3339,
    Role,
    SessionId,
    SessionRef,
    ThinkingLevel,
    TimestampMs,
    TurnStatus,
    WireId,
)

RESERVED_META_KEYS: frozenset[str] = frozenset({"receipt", "collabDelivered"})
"""Host-only meta (``store.transcripts.records.INTERNAL_META``), refused in any message a client sends: a line's
receipt, and a collaboration input's deliver answer (a rebuilt index restores receipts from both)."""
HOST_META_KEYS: frozenset[str] = frozenset({"sessionMessage", "fromAgent"})
"""Written by the host only, refused in a client's new message: ``sessionMessage`` (collaboration
provenance, collab.begin) and ``fromAgent`` (an imported sub-agent thread's prompt from its parent agent)."""


def refuse_host_meta(message: TranscriptMessage) -> TranscriptMessage:
    """A client cannot forge host-written metadata (:data:`HOST_META_KEYS`) in a message it sends, nor take
    the id of a collaboration input line (``collab-<deliveryId>``: the line ``collab.begin`` writes, which a
    later begin would take for its own), nor name one as the message it revises (``meta.revisionRootId``:
    its words would become a variant of that input, seed 003 §4.6c "edited, or regenerated")."""
    if message.id.startswith(COLLAB_INPUT_ID_PREFIX):
        raise ValueError(f"message ids starting with {COLLAB_INPUT_ID_PREFIX!r} are the collaboration input lines "
                         "the host writes (collab.begin); a client cannot use one")
    if message.meta and (forged := sorted(HOST_META_KEYS.intersection(message.meta))):
        raise ValueError(f"meta.{forged[0]} is provenance the host writes (meta.sessionMessage: collab.begin; "
                         "meta.fromAgent: an import of a sub-agent thread); a client cannot set it")
    if message.meta and revises_collaboration_input(message.meta):
        raise ValueError("meta.revisionRootId names a collaboration input line (collab-<deliveryId>); a message "
                         "cannot take its place as a revision of it")
    return message


def revises_collaboration_input(meta: Any) -> bool:
    """Whether ``meta.revisionRootId`` names a collaboration input line: a message carrying it would be a
    variant of that input (its edit or regeneration), which only the host's own line can be."""
    root = meta.get("revisionRootId") if isinstance(meta, dict) else None
    return isinstance(root, str) and root.startswith(COLLAB_INPUT_ID_PREFIX)

STEERING_STRIPPED_META_KEYS: frozenset[str] = HOST_META_KEYS | {"session_message", "from_agent"}
"""What a steering input's ``meta`` loses: the host-written provenance keys, in the wire's spelling and in
the seed's (``session_message``: "has any client-supplied session_message stripped")."""


def strip_steering_provenance(data: Any) -> Any:
    """Raw append params: a steering input (``meta.steering: true``) is extra human input, even when it
    steers a turn that runs a collaboration delivery; it never inherits a delivery's origin, so a
    client-supplied ``meta.sessionMessage`` (or ``session_message``) in it is stripped (seed 003,
    active-turn steering). Any other message carrying ``meta.sessionMessage`` is refused
    (:func:`refuse_host_meta`)."""
    if not isinstance(data, dict):
        return data
    message = data.get("message")
    if not isinstance(message, dict):
        return data
    meta = message.get("meta")
    if (not isinstance(meta, dict) or meta.get("steering") is not True
            or not STEERING_STRIPPED_META_KEYS.intersection(meta)):
        return data
    kept = {k: v for k, v in meta.items() if k not in STEERING_STRIPPED_META_KEYS}
    return {**data, "message": {**message, "meta": kept}}


# ---------------------------------------------------------------------------
# Client-sent transcript records


class TranscriptMessage(Record):
    """A message as stored in the transcript file (seed 003 §2.1): lossless."""

    type: Literal["message"] | None = Field(
        default=None, exclude=True,
        description='Optional: the line kind, as session.get returns a message and the file spells it '
        '("message" only). The host writes it on every message line either way.')
    seq: int | None = Field(
        default=None, exclude=True,
        description="Optional and ignored: the ordinal a session.get read gives every message, so a message "
        "of a read can be sent back as it is. The host assigns seq itself (file order) and never stores "
        "this one.")
    steering: Literal[True] | None = Field(
        default=None, exclude=True,
        description="Optional: the projection of meta.steering a read gives a steering row, accepted when "
        "meta.steering is true too (meta.steering is what the host keeps).")
    id: WireId
    role: Role
    blocks: Blocks
    created_at: Rfc3339 | None = Field(
        default=None, description="RFC 3339; the host stamps the current time when absent."
    )
    tool_name: Ref | None = None
    turn_id: WireId | None = None
    meta: JsonObject | None = Field(
        default=None,
        description="Parsed metadata: usage, modelId, providerId, status, error, "
        "revision fields, steering, parentToolCallId, agentName ... "
        "'receipt' and 'collabDelivered' are reserved for the host.",
    )

    @field_validator("meta")
    @classmethod
    def _no_reserved_meta(cls, meta: JsonObject | None) -> JsonObject | None:
        if meta:
            reserved = RESERVED_META_KEYS.intersection(meta)
            if reserved:
                raise ValueError(f"meta.{min(reserved)} is reserved for the host")
        return meta

    @model_validator(mode="after")
    def _steering_is_meta(self) -> TranscriptMessage:
        if self.steering and (self.meta or {}).get("steering") is not True:
            raise ValueError("steering is a read's projection of meta.steering: send meta.steering: true")
        return self

    @model_validator(mode="after")
    def _tool_calls_are_named(self) -> TranscriptMessage:
        """A ``tool_call`` block names its tool, or the message does (``toolName``, as in seed 003 §2.1)."""
        if self.tool_name is None:
            for i, block in enumerate(self.blocks):
                if block.get("type") == "tool_call" and "name" not in block:
                    raise ValueError(f'blocks.{i}: a tool_call block needs "name" when the message has no toolName')
        return self


class Compaction(Record):
    """A model-context checkpoint line (seed 003 §2.1)."""

    id: WireId
    summary: str
    first_kept_message_id: WireId | None = Field(
        default=None, description="First message the summary keeps: at or before throughMessageId in the "
        "transcript, or the one right after it; one further on is INVALID_PARAMS.")
    through_message_id: WireId = Field(description="Durable transcript boundary.")
    tokens_before: Count
    retained_tail: list[JsonObject] = Field(
        default_factory=list,
        max_length=MAX_RETAINED_TAIL,
        description="Message records kept after the summary (at most the latest "
        "user message for an active turn; empty after a completed turn).",
    )
    provider_id: Ref | None = None
    model_id: Ref | None = None
    created_at: Rfc3339 | None = None
    details: JsonObject | None = Field(
        default=None,
        description="retainedTailMode, retainedReasoning, fallback, generation, family ...",
    )

    @field_validator("retained_tail")
    @classmethod
    def _tail_blocks(cls, tail: list[JsonObject]) -> list[JsonObject]:
        """A retained message's blocks pass a message's block checks (bytes inline refused: transient
        base64 never enters the transcript, seed 003 §4.7); its id and role are the store's rules."""
        out: list[JsonObject] = []
        for i, item in enumerate(tail):
            blocks = item.get("blocks")
            if isinstance(blocks, list):
                checked: list[Any] = []
                for j, block in enumerate(blocks):
                    if not isinstance(block, dict):
                        raise ValueError(f"retainedTail[{i}].blocks[{j}] must be an object")
                    try:
                        checked.append(check_block(block))
                    except ValueError as exc:
                        raise ValueError(f"retainedTail[{i}].blocks[{j}]: {exc}") from None
                item = {**item, "blocks": checked}
            out.append(item)
        return out


# ---------------------------------------------------------------------------
# Host-produced projections


class LatestTurn(Result):
    id: str
    status: TurnStatus
    error_code: str | None = None
    ended_at: TimestampMs | None = None


class NativeInfo(Result):
    """What a native pi session is (seed 003 §12)."""

    version: int = Field(description="pi session format version (1-3).")
    read_only: Literal[True] = True


TagText = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TAG_CHARS, strip_whitespace=True)]


class ThreadOrigin(Result):
    """An origin the thread reached, or that the user approved for it."""

    origin: Annotated[str, StringConstraints(min_length=1, max_length=MAX_ORIGIN_CHARS, strip_whitespace=True)]
    status: Literal["reached", "approved"]


class ThreadMeta(Result):
    """Seed 000 §2.1 thread metadata (title, timestamps and pin are the summary's own fields)."""

    tags: list[TagText] = Field(default_factory=list, max_length=MAX_TAGS,
                                description=f"At most {MAX_TAGS}, each 1-{MAX_TAG_CHARS} code points; "
                                            "repeats (case-insensitive) dropped, order kept.")
    folder: str | None = Field(default=None, max_length=MAX_FOLDER_CHARS)
    preset: str | None = Field(default=None, max_length=MAX_PRESET_CHARS)
    archived: bool = False
    parent_thread_id: SessionId | None = Field(
        default=None, description="The thread this one came from (a loose reference: it may be deleted).")
    origins: list[ThreadOrigin] = Field(default_factory=list, max_length=MAX_THREAD_ORIGINS,
                                        description="Origins reached or approved by the thread, one per origin.")


class HistoryModel(Result):
    """The provider/model an imported session's history named last (its origin row): shown, never a
    binding (seed 003 §4.5; the session's own ``providerId``/``modelId`` are what the host binds)."""

    provider_id: str | None = None
    model_id: str


class HistoryGit(Result):
    """The git state an imported session's source recorded (its origin row): the branch last seen, every
    branch in the order seen when it changed during the session, the commit and the repository URL when the
    source names them (Claude Code records the branch on each line; Codex the branch, commit and repository
    once). History, never a binding: the project's checkout may be elsewhere now."""

    branch: str | None = None
    branches: list[str] | None = Field(default=None, max_length=20)
    commit: str | None = None
    repository_url: str | None = None


class SpawnLink(Result):
    """The parent of an imported child thread/session (a Codex ``spawn_agent`` thread, an opencode ``task``
    session): the parent's session id (valid whichever was imported first; it may not be imported at all),
    the spawning tool call (``toolCallId`` of its ``tool_call`` block; that record's ``meta.childSessionId``
    names this session) and the agent's name, when the source records them."""

    session_id: SessionId
    tool_call_id: str | None = None
    agent_name: str | None = None


class SessionSummary(Result):
    """A session. ``source`` badges an imported one (claude-code, codex, pi, opencode, pi-host, a plugin's
    source id); ``source: "native-pi"`` with ``native`` set is a native pi session, read-only, whose id is a
    `native-pi:...` id (it has no host settings: ``mode``/``permissionMode`` are the host defaults)."""

    id: SessionRef
    title: str
    project_id: int | None = None
    project_path: str | None = None
    provider_id: str | None = None
    model_id: str | None = None
    mode: Mode
    thinking_level: ThinkingLevel
    permission_mode: PermissionMode
    message_count: Count = Field(description="Durable message count (sessions.last_seq).")
    created_at: TimestampMs
    updated_at: TimestampMs
    pinned: bool = False
    deleted_at: TimestampMs | None = Field(default=None, description="Set while the session is in the trash.")
    source: str | None = Field(default=None, description="Import origin (null for sessions made here).")
    native: NativeInfo | None = None
    state: Literal["awaiting_approval", "queued", "running", "planning"] | None = Field(
        default=None,
        description="Projected (seed §4.5): a pending plan/goal approval not past its expiresAt → "
        "awaiting_approval; its approved "
        "execution queued/running → that; else planning in plan/goal mode; absent for an idle agent session.",
    )
    contract_kind: Literal["plan", "goal"] | None = Field(
        default=None, description="The kind of contract the state is about."
    )
    latest_turn: LatestTurn | None = Field(
        default=None, description="The newest turn (failed/aborted badges); absent before the first turn."
    )
    unreadable: list[Literal["state", "contractKind", "latestTurn"]] | None = Field(
        default=None,
        description="Derived fields left out because the stored value they come from is damaged (an execution's "
        "state: it may be running; the pending approval's kind; the newest turn's status; outside their sets): "
        "the rest of the summary reads. Absent when every part reads.",
    )
    thread: ThreadMeta | None = Field(
        default=None, description="Tags, folder, preset, archive flag, parent thread and origins "
        "(session.updateMetadata); absent while none is set.")
    history_model: HistoryModel | None = Field(
        default=None, description="Imported sessions: the model the history named last (never a binding).")
    history_git: HistoryGit | None = Field(
        default=None, description="Imported sessions: the git branch (and commit, repository) the source recorded.")
    spawned_by: SpawnLink | None = Field(
        default=None, description="An imported child thread/session: the parent session and tool call that "
        "spawned it.")


class MessageRef(Result):
    """Where an appended message landed in the index."""

    id: str
    session_id: SessionId
    seq: int = Field(ge=1, description="Per-session ordinal (position + 1).")
    turn_id: str | None = None
    role: Role
    created_at: TimestampMs


class UiMessageBase(Result):
    """What a displayed message holds, stored or streaming (see :class:`UiMessage`, :class:`InflightUiMessage`)."""

    type: Literal["message"] | None = Field(default=None, description="The transcript line kind.")
    id: str
    role: Role
    blocks: list[JsonObject]
    created_at: str | None = None
    tool_name: str | None = None
    turn_id: str | None = None
    meta: JsonObject | None = None
    steering: bool | None = None
    truncated: bool | None = Field(
        default=None, description="True when contentLimit capped this projection."
    )
    deleted: bool | None = Field(default=None, description="Tombstoned (hidden from context).")
    inflight: bool | None = Field(
        default=None, description="A streaming reply's checkpoint, not (yet) a transcript row."
    )
    session_message: JsonObject | None = Field(
        default=None,
        description="Collaboration provenance (meta.sessionMessage, written by the host): "
        "this user row is a delivery from another session, not human input.",
    )


class UiMessage(UiMessageBase):
    """A stored message projected for display; content may be capped (contentLimit). Every stored message has
    its ``seq``."""

    seq: int = Field(ge=1, description="Per-session ordinal: the 0-based physical position in the transcript + 1.")


class InflightUiMessage(UiMessageBase):
    """A streaming reply's newest checkpoint, projected for display: not a transcript row yet, so it has no
    ``seq`` (its final row gets one); ``inflight`` is true."""


class CompactionView(Result):
    """A still-valid compaction checkpoint as returned to clients."""

    type: Literal["compaction"] | None = Field(default=None, description="The transcript line kind.")
    id: str
    summary: str
    first_kept_message_id: str | None = None
    through_message_id: str
    tokens_before: Count
    retained_tail: list[JsonObject] = Field(default_factory=list)
    provider_id: str | None = None
    model_id: str | None = None
    created_at: str | None = None
    details: JsonObject | None = None


class Turn(Result):
    id: str
    session_id: SessionId
    status: TurnStatus
    provider_id: str | None = None
    model_id: str | None = None
    started_at: TimestampMs
    ended_at: TimestampMs | None = None
    error_code: str | None = None
    input_tokens: Count = 0
    output_tokens: Count = 0
    usage: JsonObject | None = Field(default=None, description="Full provider usage.")
    environment_digest: str | None = Field(
        default=None, description="SHA-256 (hex) of the stored RunEnvironmentSnapshot."
    )
    cost_micros: Count = Field(
        default=0, description="usage.cost.total in millionths of the provider's currency unit."
    )
    retry_of: str | None = Field(default=None, description="The earlier turn this one retries (lineage).")


class Notification(Result):
    id: str
    kind: NotificationKind
    session_id: SessionId
    session_title: str = Field(description="Snapshot at creation; may be empty.")
    turn_id: str
    error_code: ErrorCode | None = None
    created_at: TimestampMs
    read_at: TimestampMs | None = None


class QueueEntry(Result):
    id: str
    session_id: SessionId
    principal: str
    idempotency_key: str | None = None
    input_hash: str
    content: str
    attachments: list[JsonObject] = Field(default_factory=list, max_length=MAX_ATTACHMENTS)
    permission_mode: PermissionMode
    position: int = Field(description="Per-session, only grows.")
    priority: int | None = Field(default=None, description="Set by queuePrioritize.")
    session_message_id: str | None = Field(
        default=None, description="Collaboration ledger row this admission is bound to."
    )
    created_at: TimestampMs


BranchUnavailable = Literal["root_missing", "stale_reference"]
"""Why ``session.activateRevision`` cannot switch to an archived branch now (absent: it can)."""

UNAVAILABLE_DESCRIPTION = (
    "Present when session.activateRevision cannot switch to this branch now: root_missing (no live user "
    "message roots its family: an edit that named no root, or its root deleted; the switch answers "
    "MESSAGE_NOT_FOUND), stale_reference (its revisions line is a reference to a live branch, but the live "
    "root is stamped with another variant, as after restoring the revisions file from a backup: the branch "
    "is not stored, the switch answers CORRUPT_DATA).")


class RevisionInfo(Result):
    root_user_id: str
    revision_index: int = Field(ge=1)
    is_active: bool
    message_count: Count
    created_at: TimestampMs
    unavailable: BranchUnavailable | None = Field(
        default=None, description="session.listRevisions only. " + UNAVAILABLE_DESCRIPTION)


class Usage(Record):
    """Per-turn usage rollup; provider-specific keys are kept as given."""

    model_config = ConfigDict(extra="allow")

    input_tokens: Count | None = None
    output_tokens: Count | None = None


Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]

__all__ = [
    "TagText",
    "ThreadMeta",
    "ThreadOrigin",
    "Compaction",
    "CompactionView",
    "LatestTurn",
    "MessageRef",
    "Notification",
    "QueueEntry",
    "HOST_META_KEYS",
    "RESERVED_META_KEYS",
    "STEERING_STRIPPED_META_KEYS",
    "BranchUnavailable",
    "RevisionInfo",
    "UNAVAILABLE_DESCRIPTION",
    "NativeInfo",
    "SessionSummary",
    "Sha256Hex",
    "TranscriptMessage",
    "Turn",
    "InflightUiMessage",
    "UiMessage",
    "UiMessageBase",
    "Usage",
    "refuse_host_meta",
    "revises_collaboration_input",
    "strip_steering_provenance",
]
