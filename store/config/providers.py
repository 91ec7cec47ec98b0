"""Providers (seed 003 §4.3, §10, "Provider display order"): rows, config rules, order, plugin sync.

A provider row never holds a secret: the API key lives in the secret store
under ``secret_ref`` (``provider/<id>``), and ``config_json`` is refused when a
key in it looks like a credential (``apiKey``, ``authorization``, ``*token``...)
or a header would carry one. Rows with ``owner_plugin_id`` belong to that
plugin: it refreshes them with ``providers.sync`` (upsert what it declares,
delete what it no longer declares); the user path edits and deletes only rows
without an owner.

Display order: ``kv(app, "providers.order")`` holds an ordered id list written
only by ``providers.reorder``. Listing follows it; ids it does not name follow
in creation order, ids of deleted rows are skipped.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from store.config.settings import delete_value, get_value, set_value
from store.config.settings_rules import REFRESH_STAMP_PREFIX
from store.errors import Conflict, InvalidInput, LimitExceeded, NotFound, PayloadTooLarge
from store.jsonio import Readable, loads_stored, readable
from store.rules import MAX_PROVIDER_CONFIG_BYTES, MAX_PROVIDERS, is_credential_value
from store.snapshots import find_secret
from store.stamps import after_newest

__all__ = [
    "ORDER_KEY",
    "PROVIDER_FIELDS",
    "delete_provider",
    "get_provider",
    "insert_provider",
    "list_providers",
    "order_ids",
    "provider_head",
    "provider_view",
    "follow_key",
    "follow_stored_keys",
    "secret_ref_for",
    "set_order",
    "update_provider",
    "validate_base_url",
    "validate_config",
]

ORDER_KEY: Final = ("app", "providers.order")
MAX_HEADERS: Final = 64
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
_CREDENTIAL_HEADERS: Final = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"})

# wire name -> column (secret_ref, owner_plugin_id and the times are the host's)
PROVIDER_FIELDS: Final[Mapping[str, str]] = {
    "name": "name",
    "vendorKey": "vendor_key",
    "type": "type",
    "protocol": "protocol",
    "apiStyle": "api_style",
    "authKind": "auth_kind",
    "baseUrl": "base_url",
    "enabled": "enabled",
    "defaultModelId": "default_model_id",
    "config": "config_json",
}
_COLUMNS = ("id, name, vendor_key, type, protocol, api_style, auth_kind, base_url, enabled, secret_ref, "
            "default_model_id, config_json, created_at, updated_at, owner_plugin_id")


_KEY_PREFIX = "provider/"


def secret_ref_for(provider_id: str) -> str:
    return f"{_KEY_PREFIX}{provider_id}"


def validate_base_url(url: object, field: str = "baseUrl", *, instead: str = "set apiKey instead") -> str:
    """``url`` if it is an http(s) URL with a host that carries no credential (never stored in SQLite);
    ``instead`` says where the credential goes."""
    if not isinstance(url, str) or len(url) > 2048:
        raise InvalidInput(f"{field} must be a URL of at most 2048 characters", data={"field": field})
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in url):
        raise InvalidInput(f"{field} must not contain spaces or control characters", data={"field": field})
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unbalanced "[" (Invalid IPv6 URL)
        raise InvalidInput(f"{field} is not a valid URL", data={"field": field}) from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(f"{field} must be an http:// or https:// URL with a host", data={"field": field})
    try:
        host.encode("idna")  # what the resolver will do: a label over 63 characters fails there
    except UnicodeError:
        raise InvalidInput(f"{field} has an invalid host name", data={"field": field}) from None
    if parts.username or parts.password:
        raise InvalidInput(f"{field} must not carry credentials; {instead}", data={"field": field})
    why = is_credential_value(url)  # a key in the query (?key=, ?api_key=, ?sig=): never stored in SQLite
    if why:
        raise InvalidInput(f"{field} must not carry credentials ({why}); {instead}", data={"field": field})
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise InvalidInput(f"{field} has an invalid port", data={"field": field}) from None
    return url


def validate_config(config: object) -> dict[str, Any]:
    """``config_json``: an object within 64 KiB, valid headers, and no credential anywhere."""
    if not isinstance(config, dict):
        raise InvalidInput("config must be a JSON object", data={"field": "config"})
    size = len(orjson.dumps(config))
    if size > MAX_PROVIDER_CONFIG_BYTES:
        raise PayloadTooLarge(f"config is {size} bytes, at most {MAX_PROVIDER_CONFIG_BYTES}",
                              data={"field": "config", "limit": MAX_PROVIDER_CONFIG_BYTES})
    headers = config.get("headers")
    if headers is not None:
        if not isinstance(headers, dict) or len(headers) > MAX_HEADERS:
            raise InvalidInput(f"config.headers must be an object of at most {MAX_HEADERS} headers",
                               data={"field": "config.headers"})
        for name, value in headers.items():
            where = f"config.headers.{name}"
            if not _HEADER_NAME.fullmatch(name):
                raise InvalidInput(f"{where}: not a valid header name", data={"field": where})
            if not isinstance(value, str) or len(value) > 4096 or "\r" in value or "\n" in value:
                raise InvalidInput(f"{where}: a header value is one line of at most 4096 characters",
                                   data={"field": where})
            if name.lower() in _CREDENTIAL_HEADERS:
                raise InvalidInput(f"{where}: credentials go to apiKey (the secret store), never into config",
                                   data={"field": where})
    timeout = config.get("timeoutMs")
    if timeout is not None and not (type(timeout) is int and 100 <= timeout <= 600_000):
        raise InvalidInput("config.timeoutMs must be an integer from 100 to 600000", data={"field": "config.timeoutMs"})
    found = find_secret({"connection": config})
    if found is not None:
        where = "config" + found.removeprefix("connection")
        raise InvalidInput(f"{where} looks like a credential; set apiKey instead (kept in the secret store)",
                           data={"field": where})
    return config


def _row(row: Sequence[Any]) -> dict[str, Any]:
    """A provider row; ``DamagedRecord`` (CORRUPT_DATA) when its ``config_json`` no longer parses as an object
    (the host writes only checked objects): never shown, nor used for a request, as ``{}``."""
    (pid, name, vendor, typ, proto, style, auth, base, enabled, secret_ref, default_model, config,
     created, updated, owner) = row
    parsed: dict[str, Any] = loads_stored(config, f"provider {pid}'s config_json", dict)
    return {"id": pid, "name": name, "vendorKey": vendor, "type": typ, "protocol": proto, "apiStyle": style,
            "authKind": auth, "baseUrl": base, "enabled": bool(enabled), "secretRef": secret_ref,
            "defaultModelId": default_model, "config": parsed,
            "createdAt": created, "updatedAt": updated, "ownerPluginId": owner}


def provider_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row as the wire shows it: the key's reference and whether one is set, never the key."""
    out = {k: v for k, v in row.items() if v is not None}
    out["hasApiKey"] = row.get("secretRef") is not None
    return out


def follow_key(conn: sqlite3.Connection, ref: str, *, stored: bool, now_ms: int) -> str | None:
    """``secrets.set`` / ``secrets.delete`` of ``ref``: when it is a provider's key reference
    (:func:`secret_ref_for`), that provider's ``secret_ref`` follows (``hasApiKey``), so a key deleted
    through the secret store is not still announced and one stored there is. The provider id changed."""
    if not ref.startswith(_KEY_PREFIX):
        return None
    provider_id = ref[len(_KEY_PREFIX):]
    value = ref if stored else None
    changed = conn.execute("UPDATE providers SET secret_ref = ?, updated_at = ? WHERE id = ? AND secret_ref IS NOT ?",
                           (value, now_ms, provider_id, value)).rowcount
    return provider_id if changed else None


def follow_stored_keys(conn: sqlite3.Connection, *, now_ms: int) -> list[str]:
    """Boot, after ``secrets_meta`` was repaired from the ``secrets/*.sec`` files (the source of truth
    for which keys exist): every provider's ``secret_ref`` says whether its key is stored. A crash
    between a key file's write or unlink and the row (``providers.update`` of ``apiKey``) left
    ``hasApiKey`` saying the opposite of the store. Only a row without a reference or with this host's
    own (``provider/<id>``) follows: another reference (a seed-era ``provider:<id>`` whose ciphertext
    this store cannot read, kept with its bytes) is left as it is. The ids changed."""
    want = ("CASE WHEN EXISTS (SELECT 1 FROM secrets_meta s WHERE s.secret_ref = ? || providers.id) "
            "THEN ? || providers.id END")
    changed = [str(r[0]) for r in conn.execute(
        f"UPDATE providers SET secret_ref = ({want}), updated_at = ? "  # noqa: S608 - fixed fragments
        f"WHERE (secret_ref IS NULL OR secret_ref = ? || id) AND secret_ref IS NOT ({want}) RETURNING id",
        (_KEY_PREFIX, _KEY_PREFIX, now_ms, _KEY_PREFIX, _KEY_PREFIX, _KEY_PREFIX)).fetchall()]
    return changed


def provider_head(conn: sqlite3.Connection, provider_id: str) -> dict[str, Any]:
    """The columns of a row that a write checks (``id``, ``ownerPluginId``, ``secretRef``, ``updatedAt``), read
    whatever its ``config_json`` holds: an update that sets ``config`` and a delete reach a damaged row."""
    row = conn.execute("SELECT id, owner_plugin_id, secret_ref, updated_at FROM providers WHERE id = ?",
                       (provider_id,)).fetchone()
    if row is None:
        raise NotFound(f"provider {provider_id!r} not found", data={"providerId": provider_id})
    return {"id": row[0], "ownerPluginId": row[1], "secretRef": row[2], "updatedAt": row[3]}


def get_provider(conn: sqlite3.Connection, provider_id: str) -> dict[str, Any]:
    """The row; ``DamagedRecord`` (CORRUPT_DATA) when its stored config is damaged."""
    row = conn.execute(f"SELECT {_COLUMNS} FROM providers WHERE id = ?", (provider_id,)).fetchone()  # noqa: S608
    if row is None:
        raise NotFound(f"provider {provider_id!r} not found", data={"providerId": provider_id})
    return _row(row)


def order_ids(conn: sqlite3.Connection) -> list[str]:
    found = get_value(conn, *ORDER_KEY, lenient=True)
    value = found[0] if found else None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def list_providers(conn: sqlite3.Connection, *, owner: str | None = None) -> Readable[dict[str, Any]]:
    """Every row in display order (``owner``: only that plugin's rows); a row whose config is damaged is named in
    ``unreadable`` (creation order), not listed."""
    sql = f"SELECT {_COLUMNS} FROM providers"  # noqa: S608
    args: tuple[Any, ...] = ()
    if owner is not None:
        sql += " WHERE owner_plugin_id = ?"
        args = (owner,)
    listed = readable(conn.execute(sql + " ORDER BY created_at, id", args).fetchall(), _row, lambda r: str(r[0]))
    rank = {pid: i for i, pid in enumerate(dict.fromkeys(order_ids(conn)))}
    rows = sorted(listed.items, key=lambda r: (0, rank[r["id"]]) if r["id"] in rank else (1, 0))
    return Readable(rows, listed.unreadable)


def _count(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COUNT(*) FROM providers").fetchone()[0])


def _column_value(wire: str, value: Any) -> Any:
    if wire == "config":
        return orjson.dumps(value).decode()
    if wire == "enabled":
        return 1 if value else 0
    return value


def insert_provider(conn: sqlite3.Connection, provider_id: str, fields: Mapping[str, Any], *,
                    secret_ref: str | None, owner: str | None, now_ms: int) -> dict[str, Any]:
    if conn.execute("SELECT 1 FROM providers WHERE id = ?", (provider_id,)).fetchone() is not None:
        raise Conflict(f"provider {provider_id!r} already exists", data={"providerId": provider_id})
    if _count(conn) >= MAX_PROVIDERS:
        raise LimitExceeded(f"at most {MAX_PROVIDERS} providers", data={"limit": MAX_PROVIDERS})
    # after every provider so far: the list's fallback order is creation order (seed 003 "Provider display
    # order"), by (created_at, id); rows made in one millisecond or on a clock stepped back keep it
    created = after_newest(conn, "SELECT MAX(created_at) FROM providers", (), now_ms)
    cols = ["id", "secret_ref", "owner_plugin_id", "created_at", "updated_at"]
    vals: list[Any] = [provider_id, secret_ref, owner, created, created]
    for wire, value in fields.items():
        if value is not None:
            cols.append(PROVIDER_FIELDS[wire])
            vals.append(_column_value(wire, value))
    conn.execute(f"INSERT INTO providers({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", vals)  # noqa: S608
    return get_provider(conn, provider_id)


def update_provider(conn: sqlite3.Connection, provider_id: str, changes: Mapping[str, Any], *, now_ms: int,
                    secret_ref: Any = ..., owner: Any = ...) -> None:
    """Set the given wire fields (a ``None`` clears a nullable column); ``...`` leaves a host column. A ``config``
    written over a damaged one repairs the row (:func:`get_provider` reads it again)."""
    sets: list[str] = ["updated_at = ?"]
    vals: list[Any] = [now_ms]
    for wire, value in changes.items():
        sets.append(f"{PROVIDER_FIELDS[wire]} = ?")
        vals.append(_column_value(wire, value) if value is not None else None)
    if secret_ref is not ...:
        sets.append("secret_ref = ?")
        vals.append(secret_ref)
    if owner is not ...:
        sets.append("owner_plugin_id = ?")
        vals.append(owner)
    conn.execute(f"UPDATE providers SET {', '.join(sets)} WHERE id = ?", (*vals, provider_id))  # noqa: S608


def delete_provider(conn: sqlite3.Connection, provider_id: str, now_ms: int) -> None:
    """Delete the row (its models cascade, and its catalog's refresh stamp goes with them) and drop its id
    from the saved display order: a new provider created later under the same id is new, lists after the
    ordered ones and has never been refreshed."""
    conn.execute("DELETE FROM providers WHERE id = ?", (provider_id,))
    delete_value(conn, "cache", f"{REFRESH_STAMP_PREFIX}{provider_id}")
    order = order_ids(conn)
    if provider_id in order:
        set_value(conn, *ORDER_KEY, [pid for pid in order if pid != provider_id], now_ms)


def set_order(conn: sqlite3.Connection, ids: Iterable[str], now_ms: int) -> list[str]:
    """Save the display order; the ids saved (in order) are returned.

    An id no provider has is ignored (seed 003 §8: "deleted IDs are ignored"): a renderer whose
    list still shows a provider another client deleted reorders the rest, and the saved array
    never names a row that is gone."""
    wanted = list(ids)
    if len(set(wanted)) != len(wanted):
        raise InvalidInput("providerIds must not repeat an id", data={"field": "providerIds"})
    known = {r[0] for r in conn.execute("SELECT id FROM providers")}
    saved = [pid for pid in wanted if pid in known]
    set_value(conn, *ORDER_KEY, saved, now_ms)
    return saved
