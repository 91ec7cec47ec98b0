"""The model catalog (seed 003 §4.4): ``models`` rows, the refresh reply format and its upsert.

``models.refresh`` reads an OpenAI-compatible ``GET {baseUrl}/models`` reply::

    {"object": "list", "data": [{"id": "gpt-4o", "object": "model", "owned_by": "openai"}, ...]}

:func:`decode_model_list` undoes the reply's ``Content-Encoding`` (none,
``identity``, ``gzip``/``x-gzip`` or ``deflate``; the host asks for no other),
inflating at most ``MAX_MODEL_LIST_BYTES`` + 1 bytes whatever the compressed
size, so a small compressed body cannot make the host hold a large one; more,
bytes that do not decode, a stream cut short, stacked or other encodings are
:class:`BadProviderReply`. :func:`parse_model_list` turns the body into rows or raises
:class:`BadProviderReply` (not JSON, no ``data`` list, too many entries, or
entries none of which is a usable model) — then nothing is written. An entry
that is not an object, has no string ``id`` or an id that breaks the model-id
rule (``store.rules.model_id_problem``) is skipped, counted and named (the
first ``MAX_SKIPPED_MODELS_SHOWN``) with its reason; the others are kept. Optional hints
per entry: ``name``/``display_name``, ``context_window``/``context_length``,
``max_output_tokens``/``max_completion_tokens`` (also under ``top_provider``),
``deprecated``.

:func:`apply_refresh` upserts ``source='discovered'`` rows in one transaction
and never touches a ``source='user'`` (or ``bundled``) row; a discovered row the
provider no longer lists is kept and flagged ``deprecated``. The refresh stamp
goes to ``kv(cache, modelRefresh:<providerId>)`` in the same transaction.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from store.config.settings import set_value
from store.config.settings_rules import REFRESH_STAMP_PREFIX
from store.errors import DamagedRecord, InvalidInput, LimitExceeded, NotFound, StoreError
from store.jsonio import Readable, loads_stored, readable, stored_value
from store.rules import (
    MAX_MODEL_LIST_BYTES,
    MAX_MODELS_PER_PROVIDER,
    MAX_REF_CHARS,
    MAX_SKIPPED_MODELS_SHOWN,
    model_id_problem,
)

__all__ = [
    "BadProviderReply",
    "DiscoveredModel",
    "ModelList",
    "ProviderTimeout",
    "ProviderUnauthorized",
    "ProviderUnreachable",
    "SkippedModel",
    "ACCEPTED_ENCODINGS",
    "apply_refresh",
    "decode_model_list",
    "delete_user_model",
    "list_models",
    "parse_model_list",
    "proxy_for",
    "upsert_user_model",
]

SOURCES: Final = ("bundled", "discovered", "user")
ACCEPTED_ENCODINGS: Final = "gzip, deflate"
"""The ``Accept-Encoding`` of a refresh: what :func:`decode_model_list` reads."""
_INFLATE_BITS: Final = {"gzip": zlib.MAX_WBITS | 16, "x-gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}
_COLUMNS = ("provider_id, model_id, display_name, source, capabilities_json, context_window, max_output_tokens, "
            "deprecated, updated_at")


class BadProviderReply(StoreError):
    """The provider answered, but not with a model list this host can read."""

    code = "PROVIDER_BAD_REPLY"


@dataclass(frozen=True)
class DiscoveredModel:
    model_id: str
    display_name: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    deprecated: bool = False


@dataclass(frozen=True)
class SkippedModel:
    """An entry of the provider's list left out: its place in ``data``, why, and its id (the first
    ``MAX_REF_CHARS`` characters) when it is a string."""

    index: int
    reason: str
    model_id: str | None = None

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "reason": self.reason}
        if self.model_id is not None:
            out["modelId"] = self.model_id
        return out


@dataclass(frozen=True)
class ModelList:
    """A provider's model list as read: the models kept (each id once, the last listing wins) and the entries
    skipped (``skipped`` counts them all, ``shown`` names the first ``MAX_SKIPPED_MODELS_SHOWN``)."""

    models: list[DiscoveredModel]
    skipped: int = 0
    shown: tuple[SkippedModel, ...] = ()

    def skipped_view(self) -> dict[str, Any] | None:
        """The result's ``skippedModels``; ``None`` when nothing was skipped."""
        if not self.skipped:
            return None
        return {"count": self.skipped, "entries": [s.view() for s in self.shown]}


def _int_hint(entry: Mapping[str, Any], *names: str) -> int | None:
    top = entry.get("top_provider")
    for source in (entry, top if isinstance(top, dict) else {}):
        for name in names:
            value = source.get(name)
            if type(value) is int and 0 < value < 1 << 40:
                return value
    return None


def _entry_problem(entry: object) -> str | None:
    """Why a model list entry is no model this host keeps, else ``None``."""
    if not isinstance(entry, dict):
        return "not an object"
    mid = entry.get("id")
    if not isinstance(mid, str):
        return "no id: a model id must be a string"
    return model_id_problem(mid)


def decode_model_list(raw: bytes, content_encoding: str | None) -> bytes:
    """The model list a provider sent as ``raw`` bytes with the header ``Content-Encoding: content_encoding``,
    decoded; at most ``MAX_MODEL_LIST_BYTES`` (:class:`BadProviderReply` beyond, or when it does not decode)."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        body = raw
    elif len(codings) > 1 or codings[0] not in _INFLATE_BITS:
        raise BadProviderReply(f"the provider's model list is sent with Content-Encoding {content_encoding!r}; "
                               f"this host reads {ACCEPTED_ENCODINGS} or none",
                               data={"contentEncoding": (content_encoding or "")[:200]})
    else:
        body = _inflate(raw, codings[0])
    if len(body) > MAX_MODEL_LIST_BYTES:
        raise BadProviderReply(f"the provider's model list is larger than {MAX_MODEL_LIST_BYTES} bytes")
    return body


def _inflate(raw: bytes, coding: str) -> bytes:
    """``raw`` inflated, never more than one byte past the cap (a deflate body without its zlib header, as some
    servers send it, is read as the raw stream it is)."""
    tries = [_INFLATE_BITS[coding]] + ([-zlib.MAX_WBITS] if coding == "deflate" else [])
    for bits in tries:
        inflater = zlib.decompressobj(bits)
        try:
            body = inflater.decompress(raw, MAX_MODEL_LIST_BYTES + 1)
        except zlib.error:
            continue
        if len(body) > MAX_MODEL_LIST_BYTES:
            return body  # the caller refuses it; the rest is never inflated
        if not inflater.eof:
            raise BadProviderReply(f"the provider's model list ends before its {coding} stream does")
        return body
    raise BadProviderReply(f"the provider's model list does not decode as {coding}, its Content-Encoding")


def parse_model_list(body: bytes) -> ModelList:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BadProviderReply("the provider's model list is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise BadProviderReply('the provider\'s model list is not {"data": [...]}')
    entries = doc["data"]
    if len(entries) > MAX_MODELS_PER_PROVIDER:
        raise BadProviderReply(f"the provider lists {len(entries)} models, at most {MAX_MODELS_PER_PROVIDER}")
    out: dict[str, DiscoveredModel] = {}
    skipped: list[SkippedModel] = []
    skipped_count = 0
    for i, entry in enumerate(entries):
        problem = _entry_problem(entry)
        if problem is not None:
            skipped_count += 1
            if len(skipped) < MAX_SKIPPED_MODELS_SHOWN:
                listed = entry.get("id") if isinstance(entry, dict) else None
                skipped.append(SkippedModel(i, problem, listed[:MAX_REF_CHARS] if isinstance(listed, str) else None))
            continue
        mid = entry["id"]
        name = entry.get("display_name", entry.get("name"))
        display = name if isinstance(name, str) and name.strip() and len(name) <= 200 else mid
        out[mid] = DiscoveredModel(
            mid, display.strip(),
            context_window=_int_hint(entry, "context_window", "context_length"),
            max_output_tokens=_int_hint(entry, "max_output_tokens", "max_completion_tokens"),
            deprecated=entry.get("deprecated") is True,
        )
    if entries and not out:  # entries, but no model among them: not a model list this host reads
        first = skipped[0]
        raise BadProviderReply(f"no entry of the provider's model list is a model this host can keep "
                               f"({skipped_count} skipped; entry {first.index}: {first.reason})")
    return ModelList(list(out.values()), skipped_count, tuple(skipped))


def _model(row: tuple[Any, ...]) -> dict[str, Any]:
    """A model row; ``DamagedRecord`` (CORRUPT_DATA) when its capabilities no longer parse as a list of strings
    or its source is outside its set (the host writes no other)."""
    pid, mid, name, source, caps, ctx, max_out, deprecated, updated = row
    capabilities = loads_stored(caps, f"model {pid}/{mid}'s capabilities_json", list)
    if not all(isinstance(c, str) for c in capabilities):
        raise DamagedRecord(f"model {pid}/{mid}'s capabilities_json holds an entry that is not a string")
    out: dict[str, Any] = {"providerId": pid, "modelId": mid, "displayName": name,
                           "source": stored_value(source, SOURCES, f"model {pid}/{mid}'s source"),
                           "capabilities": capabilities, "deprecated": bool(deprecated), "updatedAt": updated}
    if ctx is not None:
        out["contextWindow"] = ctx
    if max_out is not None:
        out["maxOutputTokens"] = max_out
    return out


def list_models(conn: sqlite3.Connection, provider_id: str | None = None,
                providers: list[str] | None = None) -> Readable[dict[str, Any]]:
    """By provider, then model id; a model whose record is damaged is named in ``unreadable`` as
    ``<providerId>/<modelId>``, not listed."""
    sql = f"SELECT {_COLUMNS} FROM models"  # noqa: S608
    args: list[Any] = []
    if provider_id is not None:
        sql += " WHERE provider_id = ?"
        args.append(provider_id)
    elif providers is not None:
        sql += f" WHERE provider_id IN ({', '.join('?' * len(providers))})"
        args.extend(providers)
    rows = conn.execute(sql + " ORDER BY provider_id, model_id", args).fetchall()
    return readable(rows, _model, lambda r: f"{r[0]}/{r[1]}")


def _require_provider(conn: sqlite3.Connection, provider_id: str) -> None:
    if conn.execute("SELECT 1 FROM providers WHERE id = ?", (provider_id,)).fetchone() is None:
        raise NotFound(f"provider {provider_id!r} not found", data={"providerId": provider_id})


def upsert_user_model(conn: sqlite3.Connection, provider_id: str, model_id: str, *, display_name: str | None,
                      capabilities: list[str], context_window: int | None, max_output_tokens: int | None,
                      now_ms: int) -> dict[str, Any]:
    """A user-added model (``source='user'``): a discovered row of that id becomes the user's."""
    _require_provider(conn, provider_id)
    count = conn.execute("SELECT COUNT(*) FROM models WHERE provider_id = ?", (provider_id,)).fetchone()[0]
    exists = conn.execute("SELECT 1 FROM models WHERE provider_id = ? AND model_id = ?",
                          (provider_id, model_id)).fetchone()
    if exists is None and count >= MAX_MODELS_PER_PROVIDER:
        raise LimitExceeded(f"at most {MAX_MODELS_PER_PROVIDER} models per provider",
                            data={"limit": MAX_MODELS_PER_PROVIDER})
    conn.execute(
        "INSERT INTO models(provider_id, model_id, display_name, source, capabilities_json, context_window, "
        "max_output_tokens, deprecated, updated_at) VALUES (?, ?, ?, 'user', ?, ?, ?, 0, ?) "
        "ON CONFLICT(provider_id, model_id) DO UPDATE SET display_name = excluded.display_name, source = 'user', "
        "capabilities_json = excluded.capabilities_json, context_window = excluded.context_window, "
        "max_output_tokens = excluded.max_output_tokens, deprecated = 0, updated_at = excluded.updated_at",
        (provider_id, model_id, display_name or model_id, orjson.dumps(capabilities).decode(), context_window,
         max_output_tokens, now_ms))
    row = conn.execute(f"SELECT {_COLUMNS} FROM models WHERE provider_id = ? AND model_id = ?",  # noqa: S608
                       (provider_id, model_id)).fetchone()
    return _model(row)


def delete_user_model(conn: sqlite3.Connection, provider_id: str, model_id: str) -> bool:
    row = conn.execute("SELECT source FROM models WHERE provider_id = ? AND model_id = ?",
                       (provider_id, model_id)).fetchone()
    if row is None:
        return False
    if row[0] != "user":
        raise InvalidInput(f"model {provider_id}/{model_id} is {row[0]}: models.refresh manages it",
                           data={"field": "modelId", "source": row[0]})
    conn.execute("DELETE FROM models WHERE provider_id = ? AND model_id = ?", (provider_id, model_id))
    return True


def apply_refresh(conn: sqlite3.Connection, provider_id: str, found: list[DiscoveredModel],
                  now_ms: int) -> dict[str, Any]:
    """Upsert the discovered rows; flag the discovered rows no longer listed; stamp the refresh."""
    _require_provider(conn, provider_id)
    stored = {mid: source for mid, source in conn.execute(
        "SELECT model_id, source FROM models WHERE provider_id = ?", (provider_id,))}
    listed = {m.model_id for m in found}
    added = updated = kept = 0
    for m in found:
        source = stored.get(m.model_id)
        if source is not None and source != "discovered":
            kept += 1  # a user (or bundled) row is never overwritten
            continue
        conn.execute(
            "INSERT INTO models(provider_id, model_id, display_name, source, context_window, max_output_tokens, "
            "deprecated, updated_at) VALUES (?, ?, ?, 'discovered', ?, ?, ?, ?) "
            "ON CONFLICT(provider_id, model_id) DO UPDATE SET display_name = excluded.display_name, "
            "context_window = excluded.context_window, max_output_tokens = excluded.max_output_tokens, "
            "deprecated = excluded.deprecated, updated_at = excluded.updated_at",
            (provider_id, m.model_id, m.display_name, m.context_window, m.max_output_tokens, int(m.deprecated),
             now_ms))
        if source is None:
            added += 1
        else:
            updated += 1
    gone = sorted(mid for mid, source in stored.items() if source == "discovered" and mid not in listed)
    for mid in gone:
        conn.execute("UPDATE models SET deprecated = 1, updated_at = ? WHERE provider_id = ? AND model_id = ? "
                     "AND deprecated = 0", (now_ms, provider_id, mid))
    stamp = {"refreshedAt": now_ms, "listed": len(found), "added": added, "updated": updated,
             "userKept": kept, "deprecated": gone}
    set_value(conn, "cache", f"{REFRESH_STAMP_PREFIX}{provider_id}", stamp, now_ms)
    return stamp


class ProviderUnauthorized(StoreError):
    """The provider refused the key (HTTP 401/403)."""

    code = "PROVIDER_UNAUTHORIZED"


class ProviderTimeout(StoreError):
    """The provider did not answer in time."""

    code = "PROVIDER_TIMEOUT"
    retriable = True


class ProviderUnreachable(StoreError):
    """No connection to the provider (refused, reset, DNS, TLS, proxy). One that took the connection and answered
    bytes that are no HTTP reply, or cut its reply short by closing, was reached: :class:`BadProviderReply`."""

    code = "PROVIDER_UNREACHABLE"
    retriable = True


def proxy_for(host: str, setting: Any) -> tuple[str | None, bool]:
    """(proxy URL, trust the environment's proxy variables) for a request to ``host``.

    ``setting`` is the app settings' validated ``networkProxy`` (or None):
    ``system`` (default) follows the environment, ``none`` goes direct,
    ``manual`` uses ``url`` unless ``host`` matches a ``bypass`` pattern
    (``example.com``, ``*.example.com`` or ``.example.com``; ``*`` = every host).
    """
    if not isinstance(setting, dict) or setting.get("mode") in (None, "system"):
        return None, True
    if setting["mode"] == "none":
        return None, False
    host = host.lower().rstrip(".")
    for pattern in setting.get("bypass", []):
        pat = pattern.lower().rstrip(".")
        if pat == "*" or host == pat.lstrip("*.") or (pat.startswith(("*.", ".")) and host.endswith(pat.lstrip("*"))):
            return None, False
    return str(setting["url"]), False
