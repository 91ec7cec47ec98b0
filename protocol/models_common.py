"""Shared building blocks of the wire models: base classes, scalar types, limits.

Wire conventions (README "Conventions"):

* camelCase on the wire (``sessionId``); snake_case names are accepted too.
* Params are strict: unknown keys fail (``extra_forbidden``), and no type
  coercion happens (``"50"`` is not an integer).
* Results tolerate extra keys so the host can grow a result without a protocol
  bump; ``None`` values are omitted when a result is serialised.
* Fields ending in ``At`` are integer Unix milliseconds, except inside
  transcript records (messages, compactions), which keep the RFC 3339 string
  written in the transcript file.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

# ---------------------------------------------------------------------------
# Limits: defined once in store/rules.py (the storage layer checks the same ones).
from store.rules import (  # noqa: E402 - re-exported for the models
    MAX_ATTACHMENTS,
    MAX_BLOCKS_PER_MESSAGE,
    MAX_CURSOR_CHARS,
    MAX_IDS_PER_CALL,
    MAX_MESSAGES_PER_REPLACE,
    MAX_PATH_CHARS,
    MAX_QUERY_CHARS,
    MAX_REF_CHARS,
    MAX_REPLY_BYTES,
    MAX_RETAINED_TAIL,
    MAX_TEXT_FIELD,
    MAX_TITLE_CHARS,
    MAX_TOKEN_CHARS,
    MAX_TOPICS,
    MAX_WINDOW,
    NATIVE_SESSION_ID_RE,
    PLUGIN_ID_RE,
    SESSION_ID_RE,
    SESSION_REF_RE,
    WIRE_ID_RE,
    is_absolute_path,
    label_problem,
    path_problem,
)

__all__ = [
    "MAX_ATTACHMENTS",
    "MAX_BLOCKS_PER_MESSAGE",
    "MAX_CURSOR_CHARS",
    "MAX_IDS_PER_CALL",
    "MAX_MESSAGES_PER_REPLACE",
    "MAX_PATH_CHARS",
    "MAX_QUERY_CHARS",
    "MAX_REF_CHARS",
    "MAX_REPLY_BYTES",
    "MAX_RETAINED_TAIL",
    "MAX_TEXT_FIELD",
    "MAX_TITLE_CHARS",
    "MAX_TOKEN_CHARS",
    "MAX_TOPICS",
    "MAX_WINDOW",
]

# ---------------------------------------------------------------------------
# Base classes


class WireModel(BaseModel):
    """Common config: camelCase aliases, snake_case accepted, immutable.

    Built on first use (``defer_build``): importing the ~600 wire models cost ~0.3 s of pydantic schema building
    in every process, where a CLI command uses a few of them; ``pi-host serve`` builds them all before boot
    (:func:`protocol.models.build_all`), so no request pays for it."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        defer_build=True,
    )


class Params(WireModel):
    """Method params: strict types, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Record(Params):
    """A record a client sends inside params (message, compaction): strict too."""


class Result(WireModel):
    """Method results and event payloads: extra keys allowed and kept."""

    model_config = ConfigDict(extra="allow")


class MutatingParams(Params):
    """Params of a mutating method: an optional command receipt key.

    With the connection's ``clientId`` it keys a receipt; a retry with the same
    key returns the stored response (ARCHITECTURE "Command receipts").
    """

    submission_id: Annotated[str, StringConstraints(min_length=1, max_length=200)] | None = (
        Field(
            default=None,
            description="Command receipt key (1-200 chars). A retry with the same "
            "clientId + submissionId returns the stored response.",
        )
    )


# ---------------------------------------------------------------------------
# Scalar types

SessionId = Annotated[
    str,
    StringConstraints(pattern=SESSION_ID_RE.pattern),
    Field(description="Session id (becomes a file name)."),
]
NativeSessionId = Annotated[
    str,
    StringConstraints(pattern=NATIVE_SESSION_ID_RE.pattern),
    Field(description="A native pi session (`native-pi:<pi id>`, read-only, seed §12); never a file name here."),
]
SessionRef = Annotated[
    str,
    StringConstraints(pattern=SESSION_REF_RE.pattern),
    Field(description="A host session id, or a native pi session id (`native-pi:...`) where the method "
          "supports native sessions."),
]
WireId = Annotated[
    str,
    StringConstraints(pattern=WIRE_ID_RE.pattern),
    Field(description="Message/turn/entry id."),
]
Ref = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_REF_CHARS),
    Field(description="Loose reference (provider id, model id, principal): 1-200 chars."),
]
Cursor = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_CURSOR_CHARS),
    Field(description="Opaque pagination cursor returned as nextCursor."),
]
def _check_fs_path(value: str) -> str:
    """No NUL, at most 4096 UTF-8 bytes, no component over 255 bytes (else INVALID_PARAMS, not an OSError)."""
    problem = path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _check_absolute(value: str) -> str:
    if not is_absolute_path(value.strip()):
        raise ValueError("must be an absolute path (starting with / or, on Windows, a drive such as C:\\); "
                         "a blank or relative path names no project")
    return value


ProjectPath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS),
                        AfterValidator(_check_fs_path)]
ProjectRoot = Annotated[ProjectPath, AfterValidator(_check_absolute),
                        Field(description="An absolute path (/... or a Windows drive C:\\...); stored canonical: "
                              "trimmed, '/' separators, no trailing '/'.")]
"""A project's root (session.create/update ``projectPath``, project group roots, ``workspace.open``): absolute."""
FsPath = Annotated[str, StringConstraints(min_length=2, max_length=MAX_PATH_CHARS), AfterValidator(_check_fs_path)]
PluginId = Annotated[
    str,
    StringConstraints(pattern=PLUGIN_ID_RE.pattern),
    Field(description="Plugin id (1-64 of A-Z a-z 0-9 _ . -, starting with a letter or digit)."),
]
ErrorCode = Annotated[str, StringConstraints(min_length=1, max_length=200)]
TimestampMs = Annotated[int, Field(ge=0, description="Unix time in milliseconds.")]
Count = Annotated[int, Field(ge=0)]

_RFC3339 = (
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)
Rfc3339 = Annotated[
    str,
    StringConstraints(pattern=_RFC3339),
    Field(description="RFC 3339 timestamp, as written in the transcript file."),
]


def label_rule(what: str) -> AfterValidator:
    """The one rule of a user-visible label (a session title, a task title, a provider name): ``store.rules.
    label_problem`` (not blank, no control character but tab, line feed and carriage return) refuses it as
    INVALID_PARAMS. It only refuses: the value is kept as sent (a session title is then trimmed by ``Title``)."""

    def check(value: str) -> str:
        problem = label_problem(value)
        if problem is not None:
            raise ValueError(f"{what} {problem}")
        return value

    return AfterValidator(check)


def _check_title(value: str) -> str:
    trimmed = value.strip()
    if not 1 <= len(trimmed) <= MAX_TITLE_CHARS:  # the error's loc names the field (a title, a name)
        raise ValueError(f"must be 1-{MAX_TITLE_CHARS} characters after trimming")
    problem = label_problem(value)  # checked before trimming: a trailing U+001F is no whitespace to drop
    if problem is not None:
        raise ValueError(problem)
    return trimmed


Title = Annotated[
    str,
    StringConstraints(max_length=4 * MAX_TITLE_CHARS),
    AfterValidator(_check_title),
    Field(description="Trimmed, 1-80 Unicode code points; no control character but tab, line feed and "
          "carriage return (a NUL, ESC ... is INVALID_PARAMS).",
          json_schema_extra={"x-trimmedLength": [1, MAX_TITLE_CHARS]}),
]
JsonObject = dict[str, Any]

# ---------------------------------------------------------------------------
# Vocabularies (seed 003 §4.5, §4.6, §4.14)

Role = Literal["user", "assistant", "tool", "system"]
Mode = Literal["plan", "agent", "goal"]
ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max", "omit"]
PermissionMode = Literal["inherit", "ask", "accept-edits", "auto"]
TurnStatus = Literal["running", "completed", "aborted", "error"]
TerminalTurnStatus = Literal["completed", "aborted", "error"]
NotificationKind = Literal["task.completed", "task.failed"]
ClientKind = Literal["ui", "agent", "cli", "test", "plugin"]
HelloClientKind = Literal["ui", "agent", "sidecar", "cli", "test", "plugin"]
"""What host.hello takes: ``sidecar`` is ARCHITECTURE.md's name for the agent sidecar, the same kind as
``agent`` (the connection is an ``agent`` one from then on)."""
ArtifactOp = Literal["write", "edit", "delete"]
TruncateMode = Literal["regenerate", "edit", "retry"]
Topic = Literal[
    "session.created",
    "session.updated",
    "session.deleted",
    "session.message",
    "session.queue",
    "notification.created",
    "turn.started",
    "turn.ended",
    "task.due",
    "plan.requested",
    "plan.resolved",
    "session.inflight",
    "approval.requested",
    "approval.resolved",
    "interaction.requested",
    "interaction.resolved",
    "plan.execution",
    "collab.delivery",
    "settings.changed",
    "providers.changed",
    "models.changed",
    "import.progress",
]
