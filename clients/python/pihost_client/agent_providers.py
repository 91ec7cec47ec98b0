"""Where the reference sidecar's model comes from: the host's provider store.

A turn runs against the session's provider (``SessionSummary.providerId``,
else the sidecar's ``--provider``) and model (``modelId``, else ``--model``,
else the provider's ``defaultModelId``). The endpoint is the provider row's
``baseUrl`` (``providers.get``); the API key is read from the secret store
(``secrets.get`` of the row's ``secretRef``) for each turn, so a key rotated in
the app is used by the next turn, and never written anywhere by the sidecar.
The turn's run environment records the connection and the credential
*reference* only, so ``session.verifyEnvironment`` can later check that the
turn still binds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .agent_model import Model, ModelError, OpenAIModel
from .client import Client, RpcError

__all__ = ["SPOKEN_PROTOCOLS", "ProviderStore", "Resolved"]

SPOKEN_PROTOCOLS = frozenset({"openai_compatible", "openai"})
"""Provider protocols the sidecar's model client speaks (``/chat/completions``, streamed)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    model: Model
    provider_id: str | None
    environment: dict[str, Any]
    """``connection`` and ``credentialRefs`` for the run environment snapshot."""


@dataclass
class ProviderStore:
    client: Client
    provider_id: str | None = None
    model_id: str | None = None

    async def resolve(self, session: Mapping[str, Any]) -> Resolved:
        """The model for one turn of ``session``; :class:`ModelError` says what is missing."""
        pid = session.get("providerId") or self.provider_id
        if not pid:
            raise ModelError("the session names no provider and the sidecar was started without --provider")
        try:
            provider = dict((await self.client.providers.get(provider_id=str(pid)))["provider"])
        except RpcError as exc:
            raise ModelError(f"provider {pid}: {exc.data_code}: {exc.message}") from None
        if provider["protocol"] not in SPOKEN_PROTOCOLS:
            raise ModelError(f"provider {pid} speaks {provider['protocol']}; this sidecar speaks openai_compatible")
        base_url = provider.get("baseUrl")
        if not base_url:
            raise ModelError(f"provider {pid} has no baseUrl")
        model_id = session.get("modelId") or self.model_id or provider.get("defaultModelId")
        if not model_id:
            raise ModelError(f"no model: the session names none, and neither --model nor provider {pid}'s default")
        ref = provider.get("secretRef")
        key: str | None = None
        if provider.get("hasApiKey") and ref:
            try:
                key = (await self.client.secrets.get(ref=str(ref)))["value"]
            except RpcError as exc:
                raise ModelError(f"provider {pid}'s API key: {exc.data_code}: {exc.message}") from None
        connection: dict[str, Any] = {"providerId": str(pid), "baseUrl": base_url, "type": provider["type"],
                                      "protocol": provider["protocol"], "apiStyle": provider.get("apiStyle"),
                                      "credentialRef": ref}
        return Resolved(OpenAIModel(str(model_id), base_url=str(base_url), api_key=key), str(pid),
                        {"connection": connection, "credentialRefs": [ref] if key is not None else []})
