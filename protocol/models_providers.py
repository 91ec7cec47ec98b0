"""Params and results: providers.* (seed 003 §4.3, §10, "Provider display order")."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from store.rules import MAX_PROVIDERS

from .models_common import JsonObject, MutatingParams, Params, Ref, Result, TimestampMs, WireId, label_rule
from .models_secrets import MAX_SECRET_CHARS

Name = Annotated[str, StringConstraints(min_length=1, max_length=200), label_rule("a provider name"),
                 Field(description="1-200 characters, kept as sent; blank or holding a control character other than "
                       "tab, line feed, carriage return is INVALID_PARAMS.")]
BaseUrl = Annotated[str, StringConstraints(min_length=1, max_length=2048)]
# Sent as an HTTP header value: a CR/LF (or any control character) could never be sent, and the failure
# would read as an unreachable provider.
ApiKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_SECRET_CHARS,
                                          pattern=r"^[^\x00-\x1f\x7f]+$")]


class ProviderFields(Params):
    """The user-editable columns (``config`` is ``config_json``)."""

    name: Name | None = None
    vendor_key: Ref | None = Field(default=None, description="Default custom.")
    type: Ref | None = Field(default=None, description="Default openai_compatible.")
    protocol: Ref | None = Field(default=None, description="Default openai_compatible.")
    api_style: Ref | None = None
    auth_kind: Ref | None = Field(default=None, description="Default api_key_and_base_url.")
    base_url: BaseUrl | None = Field(
        default=None, description="http(s) URL; models.refresh calls {baseUrl}/models. No credential in it "
        "(user:password@, ?key=, ?api_key=, ?sig= ...): set apiKey.")
    enabled: bool | None = None
    default_model_id: Ref | None = None
    config: JsonObject | None = Field(
        default=None, description="Provider config (headers, compatibility ...), at most 64 KiB; a credential "
        "anywhere in it is INVALID_PARAMS: keys go to apiKey.")


class Provider(Result):
    id: str
    name: str
    vendor_key: str
    type: str
    protocol: str
    api_style: str | None = None
    auth_kind: str
    base_url: str | None = None
    enabled: bool
    default_model_id: str | None = None
    config: JsonObject
    has_api_key: bool = Field(description="An API key is in the secret store (never returned by providers.*).")
    secret_ref: str | None = Field(default=None, description="Its secret-store ref (secrets.get, for the sidecar).")
    owner_plugin_id: str | None = Field(default=None, description="Set on rows a plugin declared (providers.sync).")
    created_at: TimestampMs
    updated_at: TimestampMs


class ProvidersListParams(Params):
    pass


class ProvidersListResult(Result):
    providers: list[Provider] = Field(description="In display order (providers.reorder), then creation order.")
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of providers whose stored config is damaged (it no longer parses as an object): left out "
        "of providers, so the others still list; providers.get and models.refresh of one are CORRUPT_DATA, "
        "providers.update with config writes over it, providers.delete removes it. Absent when every row reads.",
    )


class ProvidersGetParams(Params):
    provider_id: WireId


class ProviderResult(Result):
    provider: Provider


class ProvidersCreateParams(MutatingParams, ProviderFields):
    id: WireId | None = Field(default=None, description="Default: derived from the receipt key, else random.")
    name: Name
    api_key: ApiKey | None = Field(default=None, description="Stored encrypted in the secret store, never in "
                                   "SQLite; no control characters (it is sent as a header).")


class ProvidersUpdateParams(MutatingParams, ProviderFields):
    provider_id: WireId
    api_key: ApiKey | None = Field(default=None, description="A new key; null removes the stored key; absent keeps it.")


class ProvidersDeleteParams(MutatingParams):
    provider_id: WireId


class ProvidersDeleteResult(Result):
    provider_id: str
    deleted: bool


class ProvidersReorderParams(MutatingParams):
    provider_ids: list[WireId] = Field(max_length=MAX_PROVIDERS, description=(
        "The display order, each id once (a repeated id is INVALID_PARAMS); an id no provider has is ignored."))


class ProvidersReorderResult(Result):
    provider_ids: list[str]


class ProviderDeclaration(ProviderFields):
    id: WireId
    name: Name


class ProvidersSyncParams(MutatingParams):
    providers: list[ProviderDeclaration] = Field(max_length=MAX_PROVIDERS,
                                                 description="Every provider the plugin declares now.")


class ProvidersSyncResult(Result):
    providers: list[Provider] = Field(description="The plugin's rows after the sync.")
    removed: list[str] = Field(description="Rows of the plugin it no longer declares (deleted).")
    unreadable: list[str] | None = Field(
        default=None,
        description="Ids of the plugin's rows whose stored config is damaged, left out of providers (a declaration "
        "with config writes over it). Absent when every row reads.",
    )


__all__ = [
    "Provider",
    "ProviderDeclaration",
    "ProviderFields",
    "ProviderResult",
    "ProvidersCreateParams",
    "ProvidersDeleteParams",
    "ProvidersDeleteResult",
    "ProvidersGetParams",
    "ProvidersListParams",
    "ProvidersListResult",
    "ProvidersReorderParams",
    "ProvidersReorderResult",
    "ProvidersSyncParams",
    "ProvidersSyncResult",
    "ProvidersUpdateParams",
]
