"""Params and results: models.* — the model catalog (seed 003 §4.4)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints

from store.rules import DEFAULT_REFRESH_TIMEOUT_MS, MAX_REF_CHARS, MAX_SKIPPED_MODELS_SHOWN, model_id_problem

from .models_common import Count, MutatingParams, Params, Ref, Result, TimestampMs, WireId


def _check_model_id(value: str) -> str:
    problem = model_id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


ModelId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_REF_CHARS),
    AfterValidator(_check_model_id),
    Field(description="A model id (models.add; models.refresh skips a provider's that breaks it): 1-200 "
          "characters, not blank, no control character (NUL, newline ...); '/', ':', '@', '.' and inner spaces "
          "are allowed."),
]


class Model(Result):
    provider_id: str
    model_id: str
    display_name: str
    source: Literal["bundled", "discovered", "user"]
    capabilities: list[str]
    context_window: int | None = None
    max_output_tokens: int | None = None
    deprecated: bool = Field(description="A discovered model the provider no longer lists (kept), or flagged by it.")
    updated_at: TimestampMs


class ModelsListParams(Params):
    provider_id: WireId | None = None


class ModelsListResult(Result):
    models: list[Model] = Field(description="By providerId, then modelId.")
    unreadable: list[str] | None = Field(
        default=None,
        description="<providerId>/<modelId> of models whose stored record is damaged (capabilities that no longer "
        "parse as a list of strings, a source outside its set): left out of models, so the others still list; "
        "models.add of its id writes over it (as the user's model). Absent when every record reads.",
    )


class ModelsAddParams(MutatingParams):
    provider_id: WireId
    model_id: ModelId
    display_name: Ref | None = None
    capabilities: list[Ref] = Field(default_factory=list, max_length=64)
    context_window: int | None = Field(default=None, ge=1, le=1 << 40)
    max_output_tokens: int | None = Field(default=None, ge=1, le=1 << 40)


class ModelResult(Result):
    model: Model


class ModelsRemoveParams(MutatingParams):
    provider_id: WireId
    model_id: Ref


class ModelsRemoveResult(Result):
    provider_id: str
    model_id: str
    deleted: bool


class ModelsRefreshParams(MutatingParams):
    provider_id: WireId
    timeout_ms: int = Field(default=DEFAULT_REFRESH_TIMEOUT_MS, ge=100, le=120_000,
                            description="Bound on the whole HTTP exchange.")


class SkippedModel(Result):
    index: Count = Field(description="Its place in the reply's data list (0 = the first).")
    reason: str = Field(description="Why it was left out: not an object, no string id, or the model-id rule "
                        "(blank, a control character, over 200 characters).")
    model_id: str | None = Field(default=None, description="The listed id, its first 200 characters; absent "
                                 "when it is no string.")


class SkippedModels(Result):
    count: Count = Field(description="Entries of the reply left out.")
    entries: list[SkippedModel] = Field(max_length=MAX_SKIPPED_MODELS_SHOWN, description=(
        f"The first {MAX_SKIPPED_MODELS_SHOWN} of them, in reply order."))


class ModelsRefreshResult(Result):
    provider_id: str
    refreshed_at: TimestampMs
    listed: Count = Field(description="Models taken from the provider's reply (each id once).")
    skipped_models: SkippedModels | None = Field(
        default=None, description="Entries of the reply that are no model this host keeps (not an object, no "
        "string id, an id the model-id rule refuses): left out, the others kept. Absent when none was. A reply "
        "whose entries are all such is PROVIDER_BAD_REPLY.")
    added: Count
    updated: Count
    user_kept: Count = Field(description="Listed models whose user row was left unchanged.")
    deprecated: list[str] = Field(description="Discovered models no longer listed: kept, flagged deprecated.")


__all__ = [
    "Model",
    "ModelId",
    "ModelResult",
    "ModelsAddParams",
    "ModelsListParams",
    "ModelsListResult",
    "ModelsRefreshParams",
    "ModelsRefreshResult",
    "ModelsRemoveParams",
    "ModelsRemoveResult",
    "SkippedModel",
    "SkippedModels",
]
