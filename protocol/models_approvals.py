"""Params and results: pending user requests — approvals.*, interactions.* (seed 000 §2).

A running turn's sidecar asks the user: a tool permission (``approvals.request``)
or a question (``interactions.request``). The request waits durably until a UI
answers it once (``*.respond``), it expires, its turn ends, or a host restart
interrupts it. Permission rules the user chose ("always allow this tool in this
project") answer later requests at once.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .models_common import (
    MutatingParams,
    Params,
    Record,
    Ref,
    Result,
    SessionId,
    TimestampMs,
    WireId,
)

Risk = Literal["low", "medium", "high"]
Remember = Literal["once", "session", "project", "global"]
RuleScope = Literal["session", "project", "global"]
OptionId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]
Label = Annotated[str, StringConstraints(max_length=500)]

# ---------------------------------------------------------------------------
# approvals


class ApprovalOption(Record):
    """One answer a permission prompt offers."""

    id: OptionId
    label: Label = ""
    decision: Literal["allow", "deny"]
    remember: Remember = Field(
        default="once",
        description="once: this call only; session/project/global: also store a permission rule for the tool.",
    )


class ApprovalOptionView(Result):
    id: str
    label: str
    decision: Literal["allow", "deny"]
    remember: Remember


class ApprovalsRequestParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId = Field(description="The running turn that needs the permission.")
    tool_call_id: WireId | None = Field(
        default=None, description="A retried request for the same tool call returns the first one."
    )
    tool: Ref = Field(description="Tool name; permission rules match it exactly.")
    args_summary: Annotated[str, StringConstraints(max_length=4000)] = Field(
        default="", description="What the call will do, for the prompt (never the raw arguments)."
    )
    risk: Risk
    options: list[ApprovalOption] | None = Field(
        default=None,
        max_length=8,
        description="Default: allow once, always allow in this project (when the session has one), "
        "always allow in this session, deny. Options you give need unique ids and at least one deny option, and "
        "remember: project needs a session with a project (else INVALID_PARAMS, nothing asked).",
    )
    expires_at: TimestampMs | None = Field(default=None, description="Absolute deadline; later answers are refused.")


ApprovalStatus = Literal["pending", "allowed", "denied", "expired", "interrupted", "cancelled"]


class ApprovalRequest(Result):
    kind: Literal["approval"] = "approval"
    request_id: str
    session_id: SessionId
    turn_id: str
    tool_call_id: str | None = None
    tool: str
    args_summary: str
    risk: Risk
    options: list[ApprovalOptionView]
    requested_by: str = Field(description="clientId of the sidecar that asked.")
    status: ApprovalStatus = Field(
        description="allowed/denied: answered (by a UI, or at once by ruleId); expired: past expiresAt; "
        "cancelled: its turn ended; interrupted: a host restart came first."
    )
    option_id: str | None = None
    rule_id: str | None = Field(default=None, description="The rule that answered it, or that its answer stored.")
    responded_by: str | None = Field(default=None, description="clientId of the UI that answered, or 'rule'.")
    created_at: TimestampMs
    updated_at: TimestampMs
    expires_at: TimestampMs | None = None
    resolved_at: TimestampMs | None = None
    unreadable: list[Literal["options", "risk", "status"]] | None = Field(
        default=None,
        description="Only on a request whose stored record is damaged, as a deny, a cancel or an expiry of it "
        "answers or announces it: the fields that no longer read, each shown by a stand-in "
        "(options [], risk high, status pending for a request never settled). Absent when every field reads.",
    )


class PermissionRule(Result):
    id: str
    scope: RuleScope
    session_id: SessionId | None = None
    project_id: int | None = None
    tool: str
    decision: Literal["allow", "deny"]
    source_request_id: str | None = None
    created_at: TimestampMs


class ApprovalsRequestResult(Result):
    request: ApprovalRequest = Field(description="pending, or already allowed/denied by a rule.")
    rule: PermissionRule | None = Field(default=None, description="The rule that answered it at once.")


class ApprovalsPendingParams(Params):
    session_id: SessionId | None = Field(default=None, description="One session's; all sessions' when absent.")


class ApprovalsPendingResult(Result):
    pending: list[ApprovalRequest] = Field(description="Only pending, unexpired rows, newest first.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Request ids of pending approvals whose stored record is damaged (a JSON column that no "
        "longer parses, a value outside its set, a status outside its set of a request never settled): left "
        "out of pending, so the others still list. Such a request "
        "can still be denied (approvals.respond with optionId deny). Absent when every record reads.",
    )


class ApprovalsRespondParams(MutatingParams):
    session_id: SessionId = Field(description="The session the UI answers for; another session's request is refused.")
    request_id: WireId
    option_id: OptionId = Field(description="One of the request's options.")


class ApprovalsRespondResult(Result):
    request: ApprovalRequest
    rule: PermissionRule | None = Field(default=None, description="The rule this answer stored (remember ≠ once).")


class ApprovalsRulesParams(Params):
    session_id: SessionId | None = Field(
        default=None, description="The rules that apply to this session (its own, its project's, global)."
    )


class ApprovalsRulesResult(Result):
    rules: list[PermissionRule] = Field(description="Oldest first (createdAt, then id).")


class ApprovalsRemoveRuleParams(MutatingParams):
    rule_id: WireId


class ApprovalsRemoveRuleResult(Result):
    removed: bool


# ---------------------------------------------------------------------------
# interactions


class InteractionChoice(Record):
    id: OptionId
    label: Label


class InteractionChoiceView(Result):
    id: str
    label: str


class InteractionsRequestParams(MutatingParams):
    session_id: SessionId
    turn_id: WireId
    tool_call_id: WireId | None = None
    question: Annotated[str, StringConstraints(min_length=1, max_length=4000)]
    choices: list[InteractionChoice] = Field(default_factory=list, max_length=32)
    multiple: bool = Field(default=False, description="More than one choice may be picked.")
    allow_free_text: bool = False
    expires_at: TimestampMs | None = None


class InteractionAnswer(Record):
    choice_ids: list[OptionId] = Field(default_factory=list, max_length=32)
    text: Annotated[str, StringConstraints(max_length=20_000)] | None = None


class InteractionAnswerView(Result):
    choice_ids: list[str] = Field(default_factory=list)
    text: str | None = None


InteractionStatus = Literal["pending", "answered", "expired", "interrupted", "cancelled"]


class InteractionRequest(Result):
    kind: Literal["interaction"] = "interaction"
    request_id: str
    session_id: SessionId
    turn_id: str
    tool_call_id: str | None = None
    question: str
    choices: list[InteractionChoiceView]
    multiple: bool
    allow_free_text: bool
    requested_by: str
    status: InteractionStatus
    answer: InteractionAnswerView | None = None
    responded_by: str | None = None
    created_at: TimestampMs
    updated_at: TimestampMs
    expires_at: TimestampMs | None = None
    resolved_at: TimestampMs | None = None
    unreadable: list[Literal["choices", "answer", "status"]] | None = Field(
        default=None,
        description="Only on a question whose stored record is damaged, as a cancel or an expiry of it announces "
        "it: the fields that no longer read, each shown by a stand-in (choices [], "
        "no answer, status pending for a question never settled). Absent when every field reads.",
    )


class InteractionsRequestResult(Result):
    request: InteractionRequest


class InteractionsPendingParams(Params):
    session_id: SessionId | None = None


class InteractionsPendingResult(Result):
    pending: list[InteractionRequest] = Field(description="Only pending, unexpired rows, newest first.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Request ids of pending questions whose stored record is damaged (a JSON column that no "
        "longer parses, a value outside its set, a status outside its set of a request never settled): left "
        "out of pending, so the others still list. Absent when "
        "every record reads.",
    )


class InteractionsRespondParams(MutatingParams):
    session_id: SessionId
    request_id: WireId
    answer: InteractionAnswer


class InteractionsRespondResult(Result):
    request: InteractionRequest


UserRequest = Annotated[ApprovalRequest | InteractionRequest, Field(discriminator="kind")]
"""An approval or an interaction (``kind`` tells them apart)."""


__all__ = [
    "ApprovalOption",
    "ApprovalOptionView",
    "ApprovalRequest",
    "ApprovalsPendingParams",
    "ApprovalsPendingResult",
    "ApprovalsRemoveRuleParams",
    "ApprovalsRemoveRuleResult",
    "ApprovalsRequestParams",
    "ApprovalsRequestResult",
    "ApprovalsRespondParams",
    "ApprovalsRespondResult",
    "ApprovalsRulesParams",
    "ApprovalsRulesResult",
    "InteractionAnswer",
    "InteractionAnswerView",
    "InteractionChoice",
    "InteractionChoiceView",
    "InteractionRequest",
    "InteractionsPendingParams",
    "InteractionsPendingResult",
    "InteractionsRequestParams",
    "InteractionsRequestResult",
    "InteractionsRespondParams",
    "InteractionsRespondResult",
    "PermissionRule",
    "UserRequest",
]
