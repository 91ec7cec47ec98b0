"""Skills and the memory listing (seed 000 §2 ``skills, memories``; seed 003 §9 "new config domain → kv namespace").

Skills live in ``kv(skills, <name>)``, one key per skill, host-owned (written
only by ``skills.put`` / ``skills.delete``, never by ``settings.*``)::

    {"name": "release-notes", "version": "1.2.0",
     "source": "---\\nname: release-notes\\n...",     # the skill's source text (its SKILL.md)
     "description": "Draft release notes",           # optional
     "origin": "~/.pi/skills/release-notes",          # optional: where it came from
     "sha256": "<hex of source>", "sizeBytes": 812,
     "createdAt": 1785056400000, "updatedAt": 1785056400000}

Rules (limits: ``store/rules.py``):

* the name is the key (:data:`~store.rules.SKILL_NAME_RE`), the version a
  bounded token, the source non-empty text of at most
  :data:`~store.rules.MAX_SKILL_SOURCE_BYTES` without NUL characters;
* a name and version identify one source, for good: every ``name@version``
  ever stored keeps its digest in ``kv(skillVersions, <name>@<version>)``
  (``{sha256, sizeBytes, createdAt}``, host-owned), also after a newer version
  replaced it and after ``skills.delete``. A put of a stored version with other
  source is ``CONFLICT`` (bump the version) and changes nothing, so what a run
  environment snapshot recorded as ``name@version`` never silently changes
  (seed 000 §4 fixes the Skill content of a run). A skill stored before these
  rows existed is held to the version its ``kv(skills)`` row holds, and that
  digest is recorded when a put or a delete replaces it (no migration);
* the same put again changes nothing (``changed: false``, ``updatedAt`` kept); a
  put of an older version with its own source makes it current again;
* at most :data:`~store.rules.MAX_SKILLS` skills (``LIMIT_EXCEEDED``).

Memories are the existing project and group memory (``kv(projectMemory)``,
``kv(projectGroupMemory)``, ``store/project_memory.py``; written by
``settings.set`` and ``projectGroups.setMemory``): :func:`list_memories` is the
listing those namespaces lacked.
"""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any, Final

import orjson

from store.config.settings import delete_value, get_object, get_value, set_value
from store.errors import Conflict, DamagedRecord, InvalidInput, LimitExceeded, PayloadTooLarge, damaged_setting
from store.jsonio import Readable, loads_stored, readable
from store.project_memory import memory_view
from store.rules import (
    MAX_SKILL_DESCRIPTION_CHARS,
    MAX_SKILL_ORIGIN_CHARS,
    MAX_SKILL_SOURCE_BYTES,
    MAX_SKILLS,
    SKILL_NAME_RE,
    SKILL_VERSION_RE,
)

__all__ = [
    "MEMORY_SCOPES",
    "SKILLS_NS",
    "VERSIONS_NS",
    "delete_skill",
    "get_skill",
    "list_memories",
    "list_skills",
    "put_skill",
    "stored_skill",
    "stored_version",
    "validate_skill_name",
]

SKILLS_NS: Final = "skills"
VERSIONS_NS: Final = "skillVersions"
MEMORY_SCOPES: Final = {"project": "projectMemory", "group": "projectGroupMemory"}
_META: Final = ("name", "version", "description", "origin", "sha256", "sizeBytes", "createdAt", "updatedAt")


def _bad(field: str, reason: str) -> InvalidInput:
    return InvalidInput(f"{field}: {reason}", data={"field": field})


def validate_skill_name(name: object) -> str:
    if not isinstance(name, str) or not SKILL_NAME_RE.fullmatch(name):
        raise _bad("name", "must be lowercase letters, digits and inner hyphens, at most 64 characters")
    return name


def _text(value: object, field: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise _bad(field, f"must be text of at most {limit} characters without NUL")
    return value.strip() or None


def _checked(name: object, version: object, source: object, description: object,
             origin: object) -> dict[str, Any]:
    out: dict[str, Any] = {"name": validate_skill_name(name)}
    if not isinstance(version, str) or not SKILL_VERSION_RE.fullmatch(version):
        raise _bad("version", "must be 1-64 characters of letters, digits and . + _ - (starting alphanumeric)")
    out["version"] = version
    if not isinstance(source, str) or not source.strip() or "\x00" in source:
        raise _bad("source", "must be non-empty text without NUL")
    raw = source.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_SKILL_SOURCE_BYTES:
        raise PayloadTooLarge(f"source: {len(raw)} bytes, at most {MAX_SKILL_SOURCE_BYTES}",
                              data={"field": "source", "limit": MAX_SKILL_SOURCE_BYTES})
    out["source"] = source
    for field, value, limit in (("description", description, MAX_SKILL_DESCRIPTION_CHARS),
                                ("origin", origin, MAX_SKILL_ORIGIN_CHARS)):
        text = _text(value, field, limit)
        if text is not None:
            out[field] = text
    out["sha256"] = hashlib.sha256(raw).hexdigest()
    out["sizeBytes"] = len(raw)
    return out


def _version_key(name: str, version: str) -> str:
    return f"{name}@{version}"


def _stored_digest(conn: sqlite3.Connection, name: str, version: str, current: dict[str, Any] | None) -> str | None:
    """The digest ``name@version`` was stored with: its ``kv(skillVersions)`` row, else (a skill stored by an
    older build) the current row when it holds that version."""
    found = stored_version(conn, _version_key(name, version))
    if found is not None:
        return str(found["sha256"])
    if current is not None and current.get("version") == version and isinstance(current.get("sha256"), str):
        return str(current["sha256"])
    return None


def stored_version(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    """The recorded digest of ``kv(skillVersions, key)`` (``<name>@<version>``), None when none is recorded;
    ``DamagedRecord`` naming the row (``store.errors.damaged_setting``) when it is not an object with a text
    ``sha256``: the one source that version may name is then unknown, so a put of it is refused rather than
    taken (the record is never written over: the first digest stays), until ``pi-host doctor --repair``."""
    what = f"the recorded source digest of skill {key}"
    found = get_object(conn, VERSIONS_NS, key, what)
    if found is not None and not isinstance(found[0].get("sha256"), str):
        raise damaged_setting(VERSIONS_NS, key, "an object without a text sha256", what)
    return found[0] if found is not None else None


def _remember(conn: sqlite3.Connection, skill: dict[str, Any], now_ms: int) -> None:
    """Record ``skill``'s name@version digest unless it is recorded already (the first one stays)."""
    name, version = skill.get("name"), skill.get("version")
    if not isinstance(name, str) or not isinstance(version, str) or not isinstance(skill.get("sha256"), str):
        return
    record = {"sha256": skill["sha256"], "sizeBytes": skill.get("sizeBytes"),
              "createdAt": skill.get("updatedAt") if isinstance(skill.get("updatedAt"), int) else now_ms}
    conn.execute("INSERT OR IGNORE INTO kv(ns, key, value_json, updated_at) VALUES (?,?,?,?)",
                 (VERSIONS_NS, _version_key(name, version), orjson.dumps(record).decode(), now_ms))


def put_skill(conn: sqlite3.Connection, *, name: object, version: object, source: object,
              description: object = None, origin: object = None, now_ms: int,
              updated_at: int | None = None) -> tuple[dict[str, Any], bool]:
    """Store a skill; (the stored skill, whether anything changed). Raises before writing on a bad value.
    ``updated_at`` (default ``now_ms``) is the skill's edit time: ``configSync.apply`` keeps the one the bundle
    carries, so "newest wins" compares edits, not the moments a copy arrived on some device."""
    new = _checked(name, version, source, description, origin)
    found = get_value(conn, SKILLS_NS, new["name"], lenient=True)
    old = found[0] if found is not None and isinstance(found[0], dict) else None
    digest = _stored_digest(conn, new["name"], new["version"], old)
    if digest is not None and digest != new["sha256"]:
        raise Conflict(f"skill {new['name']} version {new['version']} was stored with other source: "
                       "a new source needs a new version",
                       data={"name": new["name"], "version": new["version"], "sha256": digest})
    if old is None:
        count = int(conn.execute("SELECT COUNT(*) FROM kv WHERE ns = ?", (SKILLS_NS,)).fetchone()[0])
        if count >= MAX_SKILLS:
            raise LimitExceeded(f"at most {MAX_SKILLS} skills: delete one first",
                                data={"field": "name", "limit": MAX_SKILLS})
    created = old.get("createdAt") if old is not None and isinstance(old.get("createdAt"), int) else now_ms
    if old is not None and {k: v for k, v in old.items() if k not in ("createdAt", "updatedAt")} == new:
        return old, False
    stored = {**new, "createdAt": created, "updatedAt": now_ms if updated_at is None else updated_at}
    if old is not None:
        _remember(conn, old, now_ms)  # a row an older build stored: its version keeps its source too
    _remember(conn, stored, now_ms)
    set_value(conn, SKILLS_NS, new["name"], stored, now_ms)
    return stored, True


def get_skill(conn: sqlite3.Connection, name: str, *, checked: bool = False) -> dict[str, Any] | None:
    """The stored skill, None when there is none. A record that no longer parses as an object is None too (a
    put writes over it, a delete removes it), or with ``checked`` (``skills.get``) ``DamagedRecord``
    (CORRUPT_DATA)."""
    return stored_skill(conn, validate_skill_name(name), checked=checked)


def stored_skill(conn: sqlite3.Connection, key: str, *, checked: bool = True) -> dict[str, Any] | None:
    """The record of ``kv(skills, key)`` as :func:`get_skill` reads it (``key`` unchecked: ``pi-host doctor``
    reads every stored row): with ``checked``, a record that is not JSON or not an object is ``DamagedRecord``
    naming the row (``store.errors.damaged_setting``: data ``ns``, ``key``, ``repair``)."""
    try:
        found = get_object(conn, SKILLS_NS, key, f"skill {key}'s stored record")
    except DamagedRecord:
        if checked:
            raise
        return None
    return found[0] if found is not None else None


def list_skills(conn: sqlite3.Connection) -> Readable[dict[str, Any]]:
    """Every skill's metadata (no source), by name; at most :data:`MAX_SKILLS` rows exist. A skill whose record
    no longer parses as an object is named in ``unreadable`` (skill names)."""
    fields = ", ".join(f"CASE WHEN ok THEN json_extract(value_json, '$.{f}') END" for f in _META)
    rows = conn.execute(
        f"SELECT key, ok, {fields} FROM (SELECT key, value_json, CASE WHEN json_valid(value_json) "
        "THEN json_type(value_json) = 'object' ELSE 0 END AS ok FROM kv WHERE ns = ?) ORDER BY key LIMIT ?",
        (SKILLS_NS, MAX_SKILLS)).fetchall()
    return readable(rows, _meta_of, lambda r: str(r[0]))


def _meta_of(row: tuple[Any, ...]) -> dict[str, Any]:
    if not row[1]:
        raise DamagedRecord(f"skill {row[0]}'s stored record no longer reads")
    item = {f: v for f, v in zip(_META, row[2:], strict=True) if v is not None}
    item["name"] = row[0]
    return item


def delete_skill(conn: sqlite3.Connection, name: str, *, now_ms: int) -> bool:
    """Remove the skill; the digests of its versions stay (a later put of one of them must bring its source)."""
    current = get_skill(conn, name)
    if current is not None:
        _remember(conn, current, now_ms)
    return delete_value(conn, SKILLS_NS, validate_skill_name(name))


def list_memories(conn: sqlite3.Connection, scope: str, *, after: str | None,
                  limit: int) -> list[tuple[str, dict[str, Any] | None]]:
    """One page of the stored memories of ``scope`` (project paths or group ids, key order, after ``after``):
    (key, summary) pairs, the summary None when the stored memory is damaged (the caller names it).

    Each summary: key, entry count, content size, updatedAt; the content itself is
    read with ``settings.get`` / ``projectGroups.get``.
    """
    ns = MEMORY_SCOPES.get(scope)
    if ns is None:
        raise _bad("scope", f"must be one of {', '.join(MEMORY_SCOPES)}")
    out: list[tuple[str, dict[str, Any] | None]] = []
    for key, raw, updated in conn.execute(
            "SELECT key, value_json, updated_at FROM kv WHERE ns = ? AND key > ? ORDER BY key LIMIT ?",
            (ns, after or "", limit)).fetchall():
        try:
            view = memory_view(loads_stored(raw, f"memory {ns}/{key}"), f"memory {ns}/{key}")
        except DamagedRecord:
            out.append((str(key), None))
            continue
        out.append((str(key), {"scope": scope, "key": key, "entries": len(view["entries"]),
                               "contentBytes": len(view["content"].encode("utf-8")), "updatedAt": int(updated)}))
    return out
