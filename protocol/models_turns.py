"""Params and results: turns and their run environment snapshots (seed 003 §4.6, seed 000 §4)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from store.rules import CREDENTIAL_NAMES, find_credential

from .blocks import Blocks
from .models_common import (
    ErrorCode,
    JsonObject,
    MutatingParams,
    Params,
    Record,
    Ref,
    Result,
    SessionId,
    TerminalTurnStatus,
    WireId,
)
from .models_records import Notification, Sha256Hex, Turn, Usage

# ---------------------------------------------------------------------------
# Run environment snapshot (seed 000 §4)

# Credentials are recognised by name (keys, header names, URL query parameters) and by
# value shape (``store/rules.py``); ``connection`` and ``executionBindings`` are checked
# here, the whole snapshot again by ``store/snapshots.py`` (tool schemas and skills are not
# scanned: a schema may legitimately describe a ``password`` field).
SECRET_KEYS: frozenset[str] = CREDENTIAL_NAMES


def _find_secret_key(value: Any, path: str, depth: int = 0) -> str | None:
    return find_credential(value, path, credential_section=True)


def _exact_integer(value: Any) -> Any:
    # Literal[1] alone takes true and 1.0 for 1 (equal in Python): never coerced (README §2)
    if type(value) is not int:
        raise ValueError("version must be the integer 1")
    return value


SnapshotVersion = Annotated[Literal[1], BeforeValidator(_exact_integer)]


class RunEnvironmentSnapshot(Record):
    """Everything a turn ran with, frozen before execution. Credential
    *references* only: secret values are refused."""

    version: SnapshotVersion
    connection: JsonObject = Field(default_factory=dict, description="Provider endpoint.")
    model: JsonObject = Field(default_factory=dict)
    parameters: JsonObject = Field(default_factory=dict)
    system_prompt: str = ""
    skills: list[JsonObject] = Field(default_factory=list, max_length=1024)
    tool_schemas: list[JsonObject] = Field(default_factory=list, max_length=4096)
    execution_bindings: JsonObject = Field(default_factory=dict)
    permission_policy: JsonObject = Field(default_factory=dict)
    browser_submission_context: JsonObject = Field(
        default_factory=dict, description="What a browser page the turn submits to (or was submitted from) "
        "needs to be the same on recovery, e.g. its origin, URL and form; credential references only.")
    credential_refs: list[WireId] = Field(default_factory=list, max_length=64)
    capabilities: JsonObject = Field(default_factory=dict, description="Capability/pricing.")

    @field_validator("connection", "execution_bindings")
    @classmethod
    def _no_secret_values(cls, value: JsonObject, info: ValidationInfo) -> JsonObject:
        found = _find_secret_key(value, to_camel(info.field_name or "snapshot"))
        if found:
            where, _, why = found.partition(": ")
            raise ValueError(
                f"{where} looks like a secret value ({why}): store a credential reference "
                "in credentialRefs instead"
            )
        return value


class RunEnvironmentView(Result):
    """A stored snapshot as read back (digest verified)."""

    version: int
    connection: JsonObject = Field(default_factory=dict)
    model: JsonObject = Field(default_factory=dict)
    parameters: JsonObject = Field(default_factory=dict)
    system_prompt: str = ""
    skills: list[JsonObject] = Field(default_factory=list)
    tool_schemas: list[JsonObject] = Field(default_factory=list)
    execution_bindings: JsonObject = Field(default_factory=dict)
    permission_policy: JsonObject = Field(default_factory=dict)
    browser_submission_context: JsonObject = Field(default_factory=dict)
    credential_refs: list[str] = Field(default_factory=list)
    capabilities: JsonObject = Field(default_factory=dict)


# ---------------------------------------------------------------------------
# Turns


class TurnInput(Record):
    """The message the turn runs on, as the model gets it (seed 000 §4 "normalized input")."""

    message_id: WireId = Field(description="The id the input message has (or will have) in the transcript.")
    blocks: Blocks


class TurnInputView(Result):
    message_id: WireId
    blocks: Blocks
    digest: Sha256Hex = Field(description="SHA-256 of the normalized input (canonical JSON of messageId and "
                                          "blocks).")


class StartTurnParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId | None = Field(default=None, description="Generated when absent.")
    provider_id: Ref | None = None
    model_id: Ref | None = None
    environment: RunEnvironmentSnapshot | None = None
    input: TurnInput | None = Field(
        default=None, description="The turn's normalized input, bound to the environment snapshot (needs "
        "`environment`): recovery refuses the snapshot for another message under that id.")
    retry_of: WireId | None = Field(
        default=None, description="An ended turn of this session that this one retries (retry lineage)."
    )


class EndTurnParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId
    status: TerminalTurnStatus
    error_code: ErrorCode | None = None
    usage: Usage | None = None
    create_notification: bool = Field(
        default=True,
        description="Insert a task.completed/task.failed notification "
        "(never for aborted). Pass false when the session is on screen.",
    )


class EndTurnResult(Result):
    turn: Turn
    notification: Notification | None = Field(
        default=None, description="Present only when this call created it."
    )


class TurnEnvironmentParams(Params):
    turn_id: WireId


class TurnEnvironmentResult(Result):
    version: int
    digest: Sha256Hex
    snapshot: RunEnvironmentView
    input: TurnInputView | None = Field(default=None, description="The bound input, digest verified.")


class VerifyEnvironmentParams(Params):
    session_id: SessionId
    turn_id: WireId


class VerifyEnvironmentResult(Result):
    """The snapshot still binds: the same provider connection, session bindings and credential references."""

    turn_id: str
    digest: Sha256Hex
    version: int
    input_digest: Sha256Hex | None = Field(
        default=None, description="The bound input's digest (the transcript's message of that id matches it).")


__all__ = [
    "EndTurnParams",
    "VerifyEnvironmentParams",
    "VerifyEnvironmentResult",
    "EndTurnResult",
    "RunEnvironmentSnapshot",
    "RunEnvironmentView",
    "SECRET_KEYS",
    "StartTurnParams",
    "TurnEnvironmentParams",
    "TurnEnvironmentResult",
    "TurnInput",
    "TurnInputView",
]
