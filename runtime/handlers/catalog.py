"""The model catalog (seed 003 §4.4): ``models.list`` / ``add`` / ``remove`` / ``refresh``.

``models.refresh {providerId}`` asks the provider for its models over its
OpenAI-compatible ``GET {baseUrl}/models`` (``Authorization: Bearer <key>``
from the secret store, the provider's ``config.headers``, the app's
``networkProxy``), with httpx on trio (through anyio) and one deadline for the
whole exchange. Only a readable 2xx reply reaches the database: a refused key
(``PROVIDER_UNAUTHORIZED``), no answer in time (``PROVIDER_TIMEOUT``), no
connection (``PROVIDER_UNREACHABLE``) or a reply that is not a model list
(``PROVIDER_BAD_REPLY``, also any other status, and bytes that are no HTTP reply or one cut short by the
provider's close) writes nothing. Entries of
the list that are no model (no string id, an id breaking the model-id rule)
are skipped and reported in the answer's ``skippedModels``. Then one
transaction upserts the discovered rows (``store/catalog.apply_refresh``: user
rows are never touched), the refresh stamp and the receipt; a retry repeats
the fetch and the same upsert (idempotent by construction).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import trio

from protocol import models as m
from runtime.context import HostContext, ReadContext, WriterContext
from store.config import catalog, providers
from store.config import settings as kv
from store.config.settings_rules import clean_app
from store.errors import InvalidInput, NotFound
from store.receipts import ReceiptKey
from store.rules import MAX_MODEL_LIST_BYTES
from store.upgrade.seed_migrations import current_platform

from .plugins import require_owner
from .secrets import SERVICE as VAULT
from .secrets import Vault

__all__ = ["add", "fetch_model_list", "list_models", "refresh", "remove"]

TOPIC = "models.changed"


def list_models(ctx: ReadContext, p: m.ModelsListParams) -> Any:
    plugin = ctx.caller.plugin_id
    if plugin is None:
        return catalog.list_models(ctx.conn, p.provider_id).result("models")
    if p.provider_id is not None:
        row = providers.provider_head(ctx.conn, p.provider_id)
        require_owner(ctx.caller, row["ownerPluginId"], what=f"provider {p.provider_id}")
        return catalog.list_models(ctx.conn, p.provider_id).result("models")
    listed = providers.list_providers(ctx.conn, owner=plugin)  # a provider's models list whatever its config holds
    own = [*(r["id"] for r in listed.items), *listed.unreadable]
    return catalog.list_models(ctx.conn, providers=own).result("models") if own else {"models": []}


def add(ctx: WriterContext, p: m.ModelsAddParams, key: ReceiptKey | None) -> Any:
    model = catalog.upsert_user_model(ctx.conn, p.provider_id, p.model_id, display_name=p.display_name,
                                      capabilities=list(p.capabilities), context_window=p.context_window,
                                      max_output_tokens=p.max_output_tokens, now_ms=ctx.now)
    ctx.publish(TOPIC, {"providerId": p.provider_id})
    return {"model": model}


def remove(ctx: WriterContext, p: m.ModelsRemoveParams, key: ReceiptKey | None) -> Any:
    deleted = catalog.delete_user_model(ctx.conn, p.provider_id, p.model_id)
    if deleted:
        ctx.publish(TOPIC, {"providerId": p.provider_id})
    return {"providerId": p.provider_id, "modelId": p.model_id, "deleted": deleted}


def _target(conn: Any, provider_id: str) -> tuple[dict[str, Any], Any]:
    row = providers.get_provider(conn, provider_id)
    found = kv.app_blob(conn)
    proxy = clean_app(found[0] if found else None, current_platform()).get("networkProxy")
    return row, proxy


async def fetch_model_list(url: str, headers: dict[str, str], *, timeout_s: float,
                           proxy: Any) -> tuple[bytes, str | None]:
    """GET ``url``: the raw body of a 2xx reply (at most ``MAX_MODEL_LIST_BYTES``, still in its
    ``Content-Encoding``) and that header, else a clear error. The body is never decoded here: httpx would
    inflate a chunk of a few KiB to whatever it holds, and answer bytes that do not inflate with an error
    of its own (``store.config.catalog.decode_model_list`` decodes it, bounded, off the trio loop)."""
    # httpx (with the click, pygments and http.* modules it brings) is imported by the first refresh, not by the
    # host's boot: about 30 ms of a start that no other method needs (tests/host/test_boot_imports.py).
    import httpx

    try:
        proxy_url, trust_env = catalog.proxy_for(urlsplit(url).hostname or "", proxy)
    except ValueError:  # urlsplit: an unbalanced "[" in the host
        raise InvalidInput("the provider's baseUrl is not a valid URL", data={"field": "baseUrl"}) from None
    try:
        with trio.fail_after(timeout_s):
            async with httpx.AsyncClient(timeout=timeout_s, proxy=proxy_url, trust_env=trust_env,
                                         follow_redirects=False) as client:
                try:
                    request = client.build_request("GET", url, headers=headers)
                except (httpx.InvalidURL, UnicodeError) as exc:  # the message could echo a header value
                    # A control character or a bad host in baseUrl (InvalidURL, or IDNA's UnicodeError
                    # for a label over 63 characters), a header that is not ASCII (UnicodeEncodeError):
                    # stored before, refused now, never INTERNAL.
                    raise InvalidInput(f"the provider's baseUrl or headers cannot make a request "
                                       f"({type(exc).__name__})", data={"field": "baseUrl"}) from None
                reply = await client.send(request, stream=True)
                try:
                    if reply.status_code in (401, 403):
                        raise catalog.ProviderUnauthorized(
                            f"the provider refused the API key (HTTP {reply.status_code})",
                            data={"status": reply.status_code})
                    if not 200 <= reply.status_code < 300:
                        raise catalog.BadProviderReply(f"the provider answered HTTP {reply.status_code}",
                                                       data={"status": reply.status_code})
                    body = bytearray()
                    async for chunk in reply.aiter_raw():
                        body += chunk
                        if len(body) > MAX_MODEL_LIST_BYTES:
                            raise catalog.BadProviderReply(
                                f"the provider's model list is larger than {MAX_MODEL_LIST_BYTES} bytes")
                    return bytes(body), reply.headers.get("Content-Encoding")
                finally:
                    await reply.aclose()
    except (trio.TooSlowError, httpx.TimeoutException):
        raise catalog.ProviderTimeout(f"the provider did not answer within {timeout_s:g} s",
                                      data={"timeoutMs": int(timeout_s * 1000)}) from None
    except UnicodeError:  # the resolver's IDNA encoding of a host stored before it was checked
        raise InvalidInput("the provider's baseUrl has an invalid host name", data={"field": "baseUrl"}) from None
    except httpx.RemoteProtocolError as exc:
        # It took the connection and answered bytes that are no HTTP reply, or cut its reply short (headers, a
        # body shorter than its length, a chunked body without its last chunk), or hung up without one: reachable,
        # its reply is bad. (httpx tells a close before any reply from bytes with no end of headers, another
        # protocol's banner, by neither type nor message; each refresh has a connection of its own, so no stale
        # kept-alive one is closed under it.) The parser's message is not echoed: it quotes what was sent.
        raise catalog.BadProviderReply(f"the provider's reply is not readable HTTP (another protocol, or cut "
                                       f"short by its close): {type(exc).__name__}",
                                       data={"error": type(exc).__name__}) from None
    except httpx.TransportError as exc:  # connect, read, proxy errors
        raise catalog.ProviderUnreachable(f"cannot reach the provider: {type(exc).__name__}",
                                          data={"error": type(exc).__name__}) from None


def _read_model_list(raw: bytes, encoding: str | None) -> catalog.ModelList:
    return catalog.parse_model_list(catalog.decode_model_list(raw, encoding))


def _header_safe(value: str) -> bool:
    """Whether ``value`` can go in an HTTP header as it is: printable ASCII (and tabs)."""
    return value.isascii() and all(ch == "\t" or " " <= ch <= "~" for ch in value)


async def refresh(ctx: HostContext, p: m.ModelsRefreshParams, key: ReceiptKey | None) -> Any:
    pid = p.provider_id
    row, proxy = await ctx.read(_target, pid)
    base = row.get("baseUrl")
    if not base:
        raise InvalidInput(f"provider {pid!r} has no baseUrl to list models from", data={"field": "baseUrl"})
    headers = {"Accept": "application/json", "Accept-Encoding": catalog.ACCEPTED_ENCODINGS,
               **row["config"].get("headers", {})}
    ref = row.get("secretRef")
    if ref is not None:
        vault: Vault = ctx.services.get(VAULT)
        try:
            secret = await vault.run(vault.store.get, ref)
        except NotFound:
            secret = None
        if secret is not None:
            if not _header_safe(secret.value):
                # httpx would refuse the header with a message about the baseUrl or headers; the value
                # itself is never echoed
                raise InvalidInput(f"provider {pid!r}'s API key holds a character an HTTP header cannot "
                                   "carry (not ASCII, or a control character: a pasted placeholder such as "
                                   "'…'?); set the key again", data={"field": "apiKey"})
            headers["Authorization"] = f"Bearer {secret.value}"
    raw, encoding = await fetch_model_list(base.rstrip("/") + "/models", headers, timeout_s=p.timeout_ms / 1000,
                                           proxy=proxy)
    found = await ctx.in_thread(_read_model_list, raw, encoding)  # up to 8 MiB to inflate and parse: not on the loop
    now = ctx.now()
    skipped = found.skipped_view()  # in the answer (and its receipt), not in the stored refresh stamp
    extra = {} if skipped is None else {"skippedModels": skipped}
    answer = await ctx.commit(lambda conn: {"providerId": pid,
                                            **catalog.apply_refresh(conn, pid, found.models, now), **extra})
    ctx.publish(TOPIC, {"providerId": pid})
    return answer
