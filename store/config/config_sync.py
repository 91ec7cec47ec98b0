"""Portable configuration sync (seed 003 §1.3): settings, bundle format, export and apply.

Settings live in ``kv(configSync, settings)`` (no secret in it): ``enabled``,
``webdavUrl``, ``webdavUsername``, ``remoteDir``, ``vaultKeyRef`` and
``webdavPasswordRef``. The vault key (32 random bytes, base64) and the WebDAV
password are secrets (``configSync/vaultKey``, ``configSync/webdavPassword``).

Bundle file format (``config-sync/pending.bin``: the last export,
``config-sync/base.bin``: the last applied bundle), replaced with temp file +
rename, never served to clients::

    MAGIC "PICFG01\\n" (8) | key id (8) = SHA-256(vault key)[:8] | nonce (12) | AES-256-GCM ciphertext + tag (16)

The AAD is ``MAGIC + key id``, so every byte is authenticated: a flipped byte
anywhere, a truncated file or another vault key's bundle is refused
(``CORRUPT_DATA``, ``data.reason`` ``tampered`` / ``foreign_key``) before
anything is written. The plaintext is the portable document
(:func:`export_portable`): the app settings, user provider rows without
secrets, the display order, user-added models, projects (path, name, pinned),
project groups, project and group memory, group instructions, skills (name,
version, source, description, origin, updatedAt). Apply merges it
in ONE transaction (it adds and updates, never deletes; a local provider
row's key stays local; a skill is taken when this host lacks it or holds an
older ``updatedAt``, through ``skills.put``'s rules; groups, memories and skills
keep the times the bundle carries); a document that breaks any
rule (settings, provider config, memory, a group root another group holds, a
skill version that names other source here, a group's or a memory's time that
is not an integer count of milliseconds) is refused whole.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets as _random
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from store import project_groups, skills
from store.config import catalog, providers
from store.config.settings import app_blob, get_object, get_value, namespace_rows, set_value
from store.config.settings_rules import APP_NS, APP_SETTINGS_KEY, check_bundle_app, clean_app, plan_write
from store.errors import (
    Conflict,
    CorruptData,
    DamagedRecord,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    classify_os_error,
)
from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, open_nofollow, remove_file_durable
from store.indexing import index
from store.jsonio import dumps_exact, loads_exact
from store.project_memory import memory_view, normalize_memory
from store.receipts import ReceiptKey, key_of_record
from store.rules import MAX_BUNDLE_BYTES
from store.safe_open import read_bounded

__all__ = [
    "BASE_FILE",
    "EXPORT_RECEIPT_FILE",
    "MAGIC",
    "MERGED_NAMESPACES",
    "PENDING_FILE",
    "PASSWORD_REF",
    "SETTINGS_KEY",
    "VAULT_KEY_REF",
    "apply_portable",
    "bundle_info",
    "decode_bundle",
    "decode_vault_key",
    "encode_bundle",
    "export_answer",
    "export_portable",
    "export_stand_in",
    "exported_answer",
    "model_providers",
    "new_vault_key",
    "read_bundle",
    "restore_bundle",
    "stored_settings",
    "write_bundle",
    "write_export_receipt",
]

MAGIC: Final = b"PICFG01\n"
KEY_ID_BYTES: Final = 8
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
BASE_FILE: Final = "base.bin"
PENDING_FILE: Final = "pending.bin"
SETTINGS_KEY: Final = ("configSync", "settings")
MERGED_NAMESPACES: Final = (APP_NS, "projectMemory", project_groups.GROUPS_NS, project_groups.MEMORY_NS,
                            project_groups.INSTRUCTIONS_NS, skills.SKILLS_NS)
"""The kv namespaces :func:`apply_portable` may write (the app blob and the provider order are both ``app``)."""
VAULT_KEY_REF: Final = "configSync/vaultKey"
PASSWORD_REF: Final = "configSync/webdavPassword"
DOC_SCHEMA: Final = 1
_MAX_ROWS: Final = 100_000


def stored_settings(conn: sqlite3.Connection) -> dict[str, Any]:
    """The stored config-sync settings (``{"enabled": false}`` when none); ``DamagedRecord`` (CORRUPT_DATA, data
    ``ns``, ``key`` and ``repair``) when they no longer read as an object: never shown as unset, nor a configure
    merged into that empty view (which would drop the WebDAV address, user and folder it did not send)."""
    found = get_object(conn, *SETTINGS_KEY)
    return {"enabled": False} if found is None else dict(found[0])


def new_vault_key() -> str:
    return base64.b64encode(_random.token_bytes(32)).decode("ascii")


def decode_vault_key(text: str) -> bytes:
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise InvalidInput("vaultKey must be 32 bytes, base64-encoded", data={"field": "vaultKey"})
    return key


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()[:KEY_ID_BYTES]


def encode_bundle(key: bytes, doc: dict[str, Any], *, nonce: bytes | None = None) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # not at boot: see decode_bundle

    plain = dumps_exact(doc, sort_keys=True)  # a seed-era integer beyond 64 bits in the settings: exact
    nonce = nonce if nonce is not None else _random.token_bytes(NONCE_BYTES)
    head = MAGIC + _key_id(key)
    blob = head + nonce + AESGCM(key).encrypt(nonce, plain, head)
    if len(blob) > MAX_BUNDLE_BYTES:
        raise PayloadTooLarge(f"the bundle would be {len(blob)} bytes, at most {MAX_BUNDLE_BYTES}",
                              data={"limit": MAX_BUNDLE_BYTES})
    return blob


def decode_bundle(key: bytes, blob: bytes) -> dict[str, Any]:
    """Verify and decrypt a bundle; any mismatch raises ``CorruptData`` and returns nothing."""
    # cryptography is imported by the first bundle, not when the host boots (tests/host/test_boot_imports.py)
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    def refuse(reason: str, text: str) -> CorruptData:
        return CorruptData(f"config-sync bundle refused: {text}", data={"reason": reason})

    head = len(MAGIC) + KEY_ID_BYTES
    magic = blob[: len(MAGIC)]
    if magic != MAGIC and magic[:5] == MAGIC[:5] and magic[5:7].isdigit() and magic[7:] == b"\n":
        # another version of this format (an older build's, or a newer one's): README "a bundle of a format
        # this host does not read (data.reason: unsupported)", not a damaged one
        raise refuse("unsupported", f"format {magic[:7].decode()} (this host reads {MAGIC[:7].decode()})")
    if len(blob) < head + NONCE_BYTES + TAG_BYTES or magic != MAGIC:
        raise refuse("tampered", "not a bundle, or truncated")
    if len(blob) > MAX_BUNDLE_BYTES:
        raise refuse("tampered", f"larger than {MAX_BUNDLE_BYTES} bytes")
    if blob[len(MAGIC):head] != _key_id(key):
        raise refuse("foreign_key", "it was encrypted with another vault key")
    nonce = blob[head: head + NONCE_BYTES]
    try:
        plain = AESGCM(key).decrypt(nonce, blob[head + NONCE_BYTES:], blob[:head])
    except InvalidTag:
        raise refuse("tampered", "authentication failed (the bytes were changed)") from None
    try:
        doc = loads_exact(plain)
    except orjson.JSONDecodeError:  # pragma: no cover - authenticated bytes a host wrote
        raise refuse("tampered", "the document is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != DOC_SCHEMA:
        raise refuse("unsupported", f"document schema {doc.get('schema') if isinstance(doc, dict) else '?'}")
    return doc


def write_bundle(directory: Path, name: str, blob: bytes, *, faults: Faults = NO_FAULTS) -> None:
    """Replace the bundle file ``name`` with ``blob`` (temp file + rename; fault points
    ``configSync.<name>.after_tmp_write`` ... ``before_dirsync``)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(directory / name, blob, faults=faults, point_prefix=f"configSync.{name}")


def read_bundle(directory: Path, name: str) -> bytes | None:
    """The bytes of a bundle file (``None``: there is none)."""
    return _read_small(directory / name, MAX_BUNDLE_BYTES)


def _read_small(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path``, at most ``limit`` of them (``None``: there is no such file; a symlink is refused)."""
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise classify_os_error(exc, f"read {path}") from exc
    try:
        return read_bounded(fd, limit, path=str(path))
    finally:
        os.close(fd)


def restore_bundle(directory: Path, name: str, previous: bytes | None, *, faults: Faults = NO_FAULTS) -> None:
    """Put back what :func:`read_bundle` found (``None``: remove the file), durably."""
    if previous is None:
        remove_file_durable(directory / name)
    else:
        write_bundle(directory, name, previous, faults=faults)


EXPORT_RECEIPT_FILE: Final = "pending.receipt"
"""Beside ``pending.bin``: the receipt record of the keyed export that wrote it, with its answer but the bundle
(``{"clientId", "submissionId", "fingerprint", "method", "extra": {"response": {sha256, bytes, exportedAt}}}``).
The export's receipt row is a database row: after the database was lost, its retry is answered from here
(:func:`exported_answer`) as long as ``pending.bin`` still holds that bundle, instead of exporting a new one
(a fresh nonce, and what the loss left) over it."""
_MAX_EXPORT_RECEIPT: Final = 64 * 1024
_STAND_IN_FIELDS: Final = ("sha256", "bytes", "exportedAt")


def export_stand_in(answer: Mapping[str, Any]) -> dict[str, Any]:
    """What a keyed export's receipt (its row, and :data:`EXPORT_RECEIPT_FILE`) keeps of its answer: everything
    but the bundle, whose bytes stay in ``pending.bin`` (seed 003 §1.3: the database stores no large payloads).
    :func:`export_answer` rebuilds the answer from it."""
    return {k: answer[k] for k in _STAND_IN_FIELDS}


def _damaged(blob: bytes | None, vault_key: bytes | None) -> bool:
    """Whether ``pending.bin`` (``blob``) is gone or fails authentication under ``vault_key``: not a bundle a
    later export wrote (that one opens, or names another key or format). Without the key: not known (False)."""
    if blob is None:
        return True  # exports replace it (temp file + rename), never remove it
    if vault_key is None:
        return False
    try:
        decode_bundle(vault_key, blob)
    except CorruptData as exc:
        return exc.data.get("reason") == "tampered"
    return False


def export_answer(directory: Path, stored: Any, vault_key: bytes | None = None) -> dict[str, Any]:
    """The answer a keyed export gave, rebuilt from its receipt's :func:`export_stand_in` and ``pending.bin``:
    byte for byte the bundle it answered, as long as ``pending.bin`` still holds it (its SHA-256). Once another
    export replaced it, the bundle is gone, and the retry is ``CONFLICT`` (``data.reason: "superseded"``, with
    the bundle's ``sha256``): never another bundle as if it were this one. When ``pending.bin`` is gone, or its
    bytes fail authentication under ``vault_key`` (damaged on disk, not replaced), the reason is ``damaged``.
    A row a build before the stand-in stored holds the whole answer: that answer."""
    if isinstance(stored, Mapping) and isinstance(stored.get("bundleBase64"), str):
        return dict(stored)
    if not isinstance(stored, Mapping) or not all(k in stored for k in _STAND_IN_FIELDS):
        raise CorruptData("the stored answer of this export is damaged", data={"reason": "receipt"})
    blob = read_bundle(directory, PENDING_FILE)
    if blob is None or len(blob) != stored["bytes"] or hashlib.sha256(blob).hexdigest() != stored["sha256"]:
        if _damaged(blob, vault_key):
            raise Conflict(f"the bundle this export answered is gone or damaged on disk ({PENDING_FILE}): export "
                           "again under a new submissionId", data={"reason": "damaged", "sha256": stored["sha256"]})
        raise Conflict("the bundle this export answered was replaced by a later export and is gone: export again "
                       "under a new submissionId", data={"reason": "superseded", "sha256": stored["sha256"]})
    return {"bundleBase64": base64.b64encode(blob).decode("ascii"), "sha256": stored["sha256"],
            "bytes": len(blob), "exportedAt": stored["exportedAt"]}


def write_export_receipt(directory: Path, record: Mapping[str, Any], *, faults: Faults = NO_FAULTS) -> None:
    """Record the keyed export whose bundle ``pending.bin`` holds now (durable: temp file + rename)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(directory / EXPORT_RECEIPT_FILE, orjson.dumps(dict(record)) + b"\n", faults=faults,
                 point_prefix="configSync.pending.receipt")


def exported_answer(directory: Path, key: ReceiptKey) -> dict[str, Any] | None:
    """What the keyed export ``key`` answered, if :data:`EXPORT_RECEIPT_FILE` names it and ``pending.bin`` still
    holds the bundle it wrote (its SHA-256); ``None`` otherwise (another export wrote since: run again).
    The same key with another request is ``IDEMPOTENCY_CONFLICT``."""
    raw = _read_small(directory / EXPORT_RECEIPT_FILE, _MAX_EXPORT_RECEIPT)
    if raw is None:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    found = key_of_record(record)
    if found is None or (found.client_id, found.submission_id) != (key.client_id, key.submission_id):
        return None
    if (found.method, found.fingerprint) != (key.method, key.fingerprint):
        raise IdempotencyConflict("submissionId was already used for another request",
                                  data={"submissionId": key.submission_id})
    extra = record.get("extra")
    said = extra.get("response") if isinstance(extra, Mapping) else None
    try:
        return export_answer(directory, said)
    except (Conflict, CorruptData):
        return None


def bundle_info(directory: Path, name: str) -> dict[str, Any] | None:
    try:
        st = os.stat(directory / name)
    except FileNotFoundError:
        return None
    return {"bytes": st.st_size, "writtenAt": int(st.st_mtime * 1000)}


# -- the portable document ------------------------------------------------------------


def _portable_memory(rows: Mapping[str, Any]) -> dict[str, Any]:
    """Memory rows as they read (``memory_view``), the form apply takes: a row of another writer's entry shape
    (a seed-era ``{title, body}`` entry list beside its derived content) travels as the one entry it reads as,
    where its raw value made the other host refuse the whole bundle; a row that cannot be read (damaged) stays
    home, as a damaged group record does. Text travels as text."""
    out: dict[str, Any] = {}
    for key, value in rows.items():
        if isinstance(value, str):
            out[key] = value
            continue
        try:
            view = memory_view(value)
        except DamagedRecord:
            continue
        out[key] = {k: view[k] for k in ("format", "entries", "content", "updatedAt") if k in view}
    return out


def export_portable(conn: sqlite3.Connection, now_ms: int, platform: str) -> dict[str, Any]:
    found = app_blob(conn)
    rows = [r for r in providers.list_providers(conn).items if r["ownerPluginId"] is None]  # a damaged one: not
    provider_docs = [{k: r[k] for k in ("id", *providers.PROVIDER_FIELDS) if r.get(k) is not None} for r in rows]
    user_models = [m for m in catalog.list_models(conn, providers=[r["id"] for r in rows]).items
                   if m["source"] == "user"]
    projects = [{"path": path, "name": name, "pinned": bool(pinned)}
                for path, name, pinned in conn.execute("SELECT path, name, pinned FROM projects ORDER BY path")]
    ns_rows = {ns: {k: v for k, (v, _) in namespace_rows(conn, ns, _MAX_ROWS)[0].items()}
               for ns in ("projectMemory", project_groups.GROUPS_NS, project_groups.MEMORY_NS,
                          project_groups.INSTRUCTIONS_NS)}
    # a group travels with its record: a record that is not an object (damaged) stays home, and so do memory
    # and instructions rows whose group record is gone (pi-host doctor --repair of a damaged one keeps them,
    # and names them): apply refuses instructions for a group it does not know, and with them the whole bundle
    groups = {gid: record for gid, record in ns_rows[project_groups.GROUPS_NS].items() if isinstance(record, dict)}
    for ns in (project_groups.MEMORY_NS, project_groups.INSTRUCTIONS_NS):
        ns_rows[ns] = {gid: value for gid, value in ns_rows[ns].items() if gid in groups}
    for ns in ("projectMemory", project_groups.MEMORY_NS):
        ns_rows[ns] = _portable_memory(ns_rows[ns])
    return {
        "schema": DOC_SCHEMA,
        "exportedAt": now_ms,
        "settings": clean_app(found[0] if found else None, platform),
        "providers": provider_docs,
        "providersOrder": providers.order_ids(conn),
        "models": [{k: m[k] for k in ("providerId", "modelId", "displayName", "capabilities", "contextWindow",
                                      "maxOutputTokens") if k in m} for m in user_models],
        "projects": projects,
        "projectGroups": list(groups.values()),
        "projectMemory": ns_rows["projectMemory"],
        "projectGroupMemory": ns_rows[project_groups.MEMORY_NS],
        "projectGroupInstructions": ns_rows[project_groups.INSTRUCTIONS_NS],
        "skills": [_portable_skill(conn, item["name"]) for item in skills.list_skills(conn).items],
    }


_SKILL_FIELDS: Final = ("name", "version", "source", "description", "origin", "updatedAt")


def _portable_skill(conn: sqlite3.Connection, name: str) -> dict[str, Any]:
    stored = skills.get_skill(conn, name) or {}
    return {k: stored[k] for k in _SKILL_FIELDS if k in stored}


def _apply_skill(conn: sqlite3.Connection, item: Any, now_ms: int) -> bool:
    """Newest wins: a skill this host lacks, or holds with an older ``updatedAt``, is put with the bundle's
    ``updatedAt`` (its rules apply: a version naming other source here is ``CONFLICT``); a local one as new or
    newer is kept."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidInput("bundle.skills: each entry needs a name", data={"field": "bundle.skills"})
    local = skills.get_skill(conn, item["name"])
    theirs = item.get("updatedAt")
    stamped = _is_time(theirs)
    if local is not None and (not stamped or local.get("updatedAt", 0) >= theirs):
        return False
    # the copy keeps the bundle's edit time: stamped with the apply's clock, a copy relayed through another
    # device would read newer than an edit made elsewhere after the original, and win over it
    _, changed = skills.put_skill(conn, name=item["name"], version=item.get("version"), source=item.get("source"),
                                  description=item.get("description"), origin=item.get("origin"), now_ms=now_ms,
                                  updated_at=theirs if stamped else None)
    return changed


def _section(doc: dict[str, Any], name: str, kind: type) -> Any:
    value = doc.get(name, kind())
    if not isinstance(value, kind):
        raise InvalidInput(f"bundle.{name} must be a {kind.__name__}", data={"field": f"bundle.{name}"})
    return value


def _apply_provider(conn: sqlite3.Connection, item: Any, now_ms: int) -> bool:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not isinstance(item.get("name"), str):
        raise InvalidInput("bundle.providers: each entry needs an id and a name", data={"field": "bundle.providers"})
    fields = {k: item[k] for k in providers.PROVIDER_FIELDS if k in item}
    if "baseUrl" in fields and fields["baseUrl"] is not None:
        providers.validate_base_url(fields["baseUrl"], "bundle.providers.baseUrl")
    if "config" in fields:
        providers.validate_config(fields["config"])
    try:
        current = providers.provider_head(conn, item["id"])
    except NotFound:
        providers.insert_provider(conn, item["id"], fields, secret_ref=None, owner=None, now_ms=now_ms)
        return True
    if current["ownerPluginId"] is not None:
        return False  # a plugin's row here: the plugin refreshes it
    providers.update_provider(conn, item["id"], fields, now_ms=now_ms)
    return True


def _is_time(value: Any) -> bool:
    """A sane time in milliseconds: an integer (not a bool) from 0 to below 2**63."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _bundle_times(item: Mapping[str, Any], fields: tuple[str, ...], where: str) -> dict[str, int]:
    """The times ``item`` carries (an absent one is left out: the apply's clock stands in); one that is not a
    sane time in milliseconds refuses the bundle, as its other bad values do."""
    for name in fields:
        if name in item and not _is_time(item[name]):
            raise InvalidInput(f"{where}.{name} must be a time in milliseconds (an integer, 0 to 2**63-1)",
                               data={"field": f"{where}.{name}"})
    return {name: item[name] for name in fields if name in item}


def _put_group(conn: sqlite3.Connection, record: Any, now_ms: int) -> None:
    """Create or update a group as the bundle carries it, with its ``createdAt`` / ``updatedAt``: its times
    travel with it (stamped with the apply's clock, a copy would read as edited when it arrived)."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        raise InvalidInput("bundle.projectGroups: each entry needs an id", data={"field": "bundle.projectGroups"})
    times = _bundle_times(record, ("createdAt", "updatedAt"), "bundle.projectGroups")
    gid = record["id"]
    exists = get_value(conn, project_groups.GROUPS_NS, gid, lenient=True) is not None
    saved = project_groups.save_group(conn, gid if exists else None, str(record.get("name", "")),
                                      list(record.get("roots", [])), record.get("primaryRoot"),
                                      new_id=gid, now_ms=now_ms)
    detached = [p for p in record.get("detachedPaths", []) if isinstance(p, str) and p not in saved["roots"]]
    merged = list(dict.fromkeys([*saved.get("detachedPaths", []), *detached]))
    if merged:
        saved["detachedPaths"] = merged[-project_groups.MAX_DETACHED:]
    if merged or times:
        saved.update(times)
        set_value(conn, project_groups.GROUPS_NS, gid, saved, now_ms)


def model_providers(doc: dict[str, Any]) -> list[str]:
    """The providers whose user models a verified document carries (their catalogs change on apply)."""
    models = doc.get("models")
    items = models if isinstance(models, list) else []
    return sorted({item["providerId"] for item in items
                   if isinstance(item, dict) and isinstance(item.get("providerId"), str)})


def check_portable(conn: sqlite3.Connection, doc: dict[str, Any], now_ms: int, platform: str) -> None:
    """Merge ``doc`` under a savepoint and roll it back: raise the error of the rule it breaks (as
    :func:`apply_portable` would), change nothing either way. ``configSync.apply`` runs it before it writes
    ``base.bin``, so a bundle the merge refuses never becomes the base, not even across a crash."""
    conn.execute("SAVEPOINT config_sync_check")
    try:
        apply_portable(conn, doc, now_ms, platform)
    finally:
        conn.execute("ROLLBACK TO config_sync_check")
        conn.execute("RELEASE config_sync_check")


def apply_portable(conn: sqlite3.Connection, doc: dict[str, Any], now_ms: int, platform: str) -> dict[str, int]:
    """Merge a verified document in the caller's transaction; a rule it breaks refuses it whole."""
    counts = {"settings": 0, "providers": 0, "models": 0, "projects": 0, "projectGroups": 0, "memory": 0,
              "skills": 0}
    settings = _section(doc, "settings", dict)
    if settings:
        found = app_blob(conn)
        check_bundle_app(settings)  # a value no writer may store refuses the bundle, as settings.update would
        changes = clean_app(settings, platform)
        plan = plan_write(APP_NS, {APP_SETTINGS_KEY: found[0]} if found else {}, changes, existing_keys=0,
                          now_ms=now_ms, platform=platform)
        for key, value in plan.rows.items():
            if isinstance(value, dict):
                set_value(conn, APP_NS, key, value, now_ms)
        counts["settings"] = len(plan.changed)
    for item in _section(doc, "providers", list):
        counts["providers"] += _apply_provider(conn, item, now_ms)
    order = [pid for pid in _section(doc, "providersOrder", list) if isinstance(pid, str)]
    if order:
        known = {r[0] for r in conn.execute("SELECT id FROM providers")}
        providers.set_order(conn, [pid for pid in dict.fromkeys(order) if pid in known], now_ms)
    for item in _section(doc, "models", list):
        if not isinstance(item, dict) or not isinstance(item.get("providerId"), str) \
                or not isinstance(item.get("modelId"), str):
            raise InvalidInput("bundle.models: each entry needs providerId and modelId",
                               data={"field": "bundle.models"})
        caps = item.get("capabilities", [])
        catalog.upsert_user_model(conn, item["providerId"], item["modelId"], display_name=item.get("displayName"),
                                  capabilities=caps if isinstance(caps, list) else [],
                                  context_window=item.get("contextWindow"),
                                  max_output_tokens=item.get("maxOutputTokens"), now_ms=now_ms)
        counts["models"] += 1
    for item in _section(doc, "projects", list):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not item["path"].strip():
            raise InvalidInput("bundle.projects: each entry needs a path", data={"field": "bundle.projects"})
        pid = index.upsert_project(conn, item["path"], now_ms)
        if isinstance(item.get("name"), str) and item["name"].strip():
            conn.execute("UPDATE projects SET name = ? WHERE id = ?", (item["name"].strip(), pid))
        if isinstance(item.get("pinned"), bool):
            conn.execute("UPDATE projects SET pinned = ? WHERE id = ?", (int(item["pinned"]), pid))
        counts["projects"] += 1
    for record in _section(doc, "projectGroups", list):
        _put_group(conn, record, now_ms)
        counts["projectGroups"] += 1
    for ns, section in (("projectMemory", "projectMemory"), (project_groups.MEMORY_NS, "projectGroupMemory")):
        for key, value in _section(doc, section, dict).items():
            stored_key = index.normalize_project_path(key) if ns == "projectMemory" else key
            times = _bundle_times(value, ("updatedAt",), f"bundle.{section}") if isinstance(value, dict) else {}
            memory = normalize_memory(value, now_ms, field=f"bundle.{section}")
            if not isinstance(memory, dict):  # EMPTY
                continue  # apply adds and updates, never deletes: an empty memory leaves the local one
            memory.update(times)  # its edit time travels with it (text carries none: the apply's clock)
            set_value(conn, ns, stored_key, memory, now_ms)
            counts["memory"] += 1
    for gid, text in _section(doc, "projectGroupInstructions", dict).items():
        if not isinstance(text, str):
            raise InvalidInput("bundle.projectGroupInstructions: values are text",
                               data={"field": "bundle.projectGroupInstructions"})
        if get_value(conn, project_groups.GROUPS_NS, gid, lenient=True) is None:
            raise Conflict(f"bundle.projectGroupInstructions names unknown group {gid!r}", data={"groupId": gid})
        project_groups.set_instructions(conn, gid, text, now_ms)
    for item in _section(doc, "skills", list):
        counts["skills"] += _apply_skill(conn, item, now_ms)
    return counts
