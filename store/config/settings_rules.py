"""What each ``kv`` namespace accepts (seed 003 §4.1, §7): pure validation, no I/O.

``plan_write(ns, current, changes, ...)`` decides every ``settings.set`` /
``update`` / ``delete`` before anything is written: the rows to store or delete,
the keys that changed (for ``settings.changed``) and the value each requested
key now has. A bad value raises :class:`~store.errors.InvalidInput` naming the
field (``data.field``), so nothing is written.

Namespaces:

* ``app`` — the settings blob ``kv(app, settings)``; a key of ``app`` is a field
  of that blob (partial updates merge). Known fields are validated
  (:data:`APP_FIELDS`); reads normalize them (:func:`app_view`): a missing,
  malformed or out-of-range ``largePasteThreshold`` reads as 600, a missing
  ``thinkingDisplayMode`` as ``detailed``, unusable values as absent, and a
  stored ``promptEnhancementSystemPrompt`` is dropped on every read and write.
  Other fields are kept as they are (bounded). ``currentProjectId`` and
  ``providers.order`` are separate rows owned by ``workspace.open`` and
  ``providers.reorder``.
* ``ui`` — renderer state; ``cache`` — ``recentModels`` (a bounded MRU list of
  ``{providerId, modelId}``) and host-owned refresh stamps
  (``modelRefresh:<providerId>``, written by ``models.refresh``);
  ``plugin:<id>`` — one plugin's settings. Each has its own value and key bounds.
* ``projectMemory`` — key: a project path (normalized to its canonical form),
  value: memory (``store/project_memory.py``).
* ``projectGroups``, ``projectGroupMemory``, ``projectGroupInstructions``,
  ``configSync``, ``skills``, ``skillVersions`` — host-owned: written only by their own methods;
  ``projectIds`` (``issued``: the highest project id issued) — written by the host alone.
* any other namespace — a new config domain (seed §4.1), generically bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from store.errors import InvalidInput, PayloadTooLarge
from store.indexing.index import normalize_project_path
from store.jsonio import dumps_exact
from store.project_memory import EMPTY, normalize_memory
from store.rules import (
    LARGE_PASTE_DEFAULT,
    LARGE_PASTE_MAX,
    LARGE_PASTE_MIN,
    MAX_APP_SETTINGS_BYTES,
    MAX_APP_SETTINGS_KEYS,
    MAX_CACHE_KEYS,
    MAX_CACHE_VALUE_BYTES,
    MAX_OTHER_KEYS,
    MAX_OTHER_VALUE_BYTES,
    MAX_PATH_CHARS,
    MAX_PLUGIN_KEYS,
    MAX_PLUGIN_VALUE_BYTES,
    MAX_RECENT_MODELS,
    MAX_REF_CHARS,
    MAX_SETTING_KEY_CHARS,
    MAX_UI_KEYS,
    MAX_UI_VALUE_BYTES,
    PLUGIN_ID_RE,
    PROMPT_TEMPLATE_MAX_CHARS,
    is_credential_value,
)
from store.upgrade.seed_schemas import MODES, SHELL_CATALOG

__all__ = [
    "APP_FIELDS",
    "APP_NS",
    "APP_SETTINGS_KEY",
    "DELETE",
    "DRAFT_VARIABLE",
    "KvPlan",
    "NsRules",
    "app_view",
    "canonical_key",
    "check_key",
    "canonical_path",
    "check_bundle_app",
    "clean_app",
    "plugin_of",
    "plan_write",
    "rules_for",
]

APP_NS: Final = "app"
APP_SETTINGS_KEY: Final = "settings"
DRAFT_VARIABLE: Final = "{{draft}}"
PROXY_MODES: Final = ("system", "none", "manual")
PROXY_SCHEMES: Final = ("http", "https", "socks5", "socks5h")
THINKING_DISPLAY_MODES: Final = ("detailed", "compact")
THINKING_LEVELS: Final = ("off", "minimal", "low", "medium", "high", "xhigh", "max", "omit")
DROPPED_APP_FIELDS: Final = ("promptEnhancementSystemPrompt",)
"""Stored by older builds, no longer read: dropped on every read and write."""
MAX_BYPASS: Final = 64
MAX_ATTACHMENT_BUDGET: Final = 1 << 40
MAX_ATTACHMENT_GRACE_MS: Final = 365 * 24 * 3600 * 1000

HOST_OWNED_APP_KEYS: Final[Mapping[str, str]] = {
    APP_SETTINGS_KEY: "settings.set/settings.update (one field at a time)",
    "currentProjectId": "workspace.open",
    "providers.order": "providers.reorder",
}
HOST_OWNED_NAMESPACES: Final[Mapping[str, str]] = {
    "projectGroups": "projectGroups.save / projectGroups.delete",
    "projectGroupMemory": "projectGroups.setMemory",
    "projectGroupInstructions": "projectGroups.setInstructions",
    "configSync": "configSync.configure",
    "skills": "skills.put / skills.delete",
    "skillVersions": "skills.put / skills.delete",
    "projectIds": "the host (the highest project id issued)",
}
REFRESH_STAMP_PREFIX: Final = "modelRefresh:"
RECENT_MODELS_KEY: Final = "recentModels"


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE: Final = _Delete()
"""A change that removes a key."""


class _Bad(Exception):
    """A field's value breaks its rule (turned into ``InvalidInput`` naming the field)."""


class _Drop:
    pass


_DROP: Final = _Drop()
"""A valid write that stores no key (a blank template)."""


def _bad(ns: str, key: str, reason: str) -> InvalidInput:
    where = key if ns == APP_NS else f"{ns}.{key}"
    return InvalidInput(f"{where}: {reason}", data={"field": key, "ns": ns})


# -- app fields -------------------------------------------------------------------


def _large_paste(value: Any, platform: str) -> Any:
    if type(value) is int and LARGE_PASTE_MIN <= value <= LARGE_PASTE_MAX:
        return value
    raise _Bad(f"must be an integer from {LARGE_PASTE_MIN} to {LARGE_PASTE_MAX}")


def _thinking_display(value: Any, platform: str) -> Any:
    if value in THINKING_DISPLAY_MODES and isinstance(value, str):
        return value
    raise _Bad(f"must be one of {', '.join(THINKING_DISPLAY_MODES)}")


def _user_template(value: Any, platform: str) -> Any:
    if not isinstance(value, str):
        raise _Bad("must be a string")
    if not value.strip():
        return _DROP  # blank = the built-in default: no key
    if len(value) > PROMPT_TEMPLATE_MAX_CHARS:
        raise _Bad(f"must not exceed {PROMPT_TEMPLATE_MAX_CHARS} characters")
    if DRAFT_VARIABLE not in value:
        raise _Bad(f"must contain {DRAFT_VARIABLE}")
    return value


def _boolean(value: Any, platform: str) -> Any:
    if isinstance(value, bool):
        return value
    raise _Bad("must be true or false")


def _pin(value: Any, platform: str) -> Any:
    if not isinstance(value, str) or len(value) > MAX_REF_CHARS or any(ord(c) < 0x20 for c in value):
        raise _Bad(f"must be an id of at most {MAX_REF_CHARS} characters")
    return value if value.strip() else _DROP


def _thinking_level(value: Any, platform: str) -> Any:
    if isinstance(value, str) and value in THINKING_LEVELS:
        return value
    raise _Bad(f"must be one of {', '.join(THINKING_LEVELS)}")


def _mode(value: Any, platform: str) -> Any:
    if isinstance(value, str) and value in MODES:
        return value
    raise _Bad(f"must be one of {', '.join(MODES)}")


def _shell(value: Any, platform: str) -> Any:
    known = SHELL_CATALOG.get(platform, ())
    if isinstance(value, str) and value in known:
        return value
    others = sorted(p for p, ids in SHELL_CATALOG.items() if value in ids) if isinstance(value, str) else []
    if others:
        raise _Bad(f"{value!r} is a shell of {', '.join(others)}, not of {platform} (known: {', '.join(known)})")
    raise _Bad(f"must be a shell id of {platform}: {', '.join(known) or 'none'}")


def _proxy(value: Any, platform: str) -> Any:
    if not isinstance(value, dict) or set(value) - {"mode", "url", "bypass"}:
        raise _Bad("must be an object {mode, url?, bypass?}")
    mode = value.get("mode")
    if mode not in PROXY_MODES or not isinstance(mode, str):
        raise _Bad(f"mode must be one of {', '.join(PROXY_MODES)}")
    out: dict[str, Any] = {"mode": mode}
    url = value.get("url")
    if url is not None:
        if not isinstance(url, str) or len(url) > 2048:
            raise _Bad("url must be a string of at most 2048 characters")
        parts = urlsplit(url)
        if parts.scheme not in PROXY_SCHEMES or not parts.hostname:
            raise _Bad(f"url must be {'|'.join(PROXY_SCHEMES)}://host[:port]")
        try:
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            raise _Bad("url has an invalid port") from None
        why = is_credential_value(url)  # secret values never reach SQLite (seed 003 §10.3)
        if why:
            raise _Bad(f"url must not carry a credential ({why})")
        out["url"] = url
    elif mode == "manual":
        raise _Bad("url is required when mode is manual")
    bypass = value.get("bypass")
    if bypass is not None:
        if not isinstance(bypass, list) or len(bypass) > MAX_BYPASS:
            raise _Bad(f"bypass must be a list of at most {MAX_BYPASS} host patterns")
        for item in bypass:
            if not isinstance(item, str) or not 1 <= len(item) <= 253 or any(c.isspace() for c in item):
                raise _Bad("each bypass entry must be a host pattern of 1-253 characters without spaces")
        out["bypass"] = list(bypass)
    return out


def _budget(value: Any, platform: str) -> Any:
    if type(value) is int and 1 <= value <= MAX_ATTACHMENT_BUDGET:
        return value
    raise _Bad(f"must be an integer from 1 to {MAX_ATTACHMENT_BUDGET}")


def _grace(value: Any, platform: str) -> Any:
    if type(value) is int and 0 <= value <= MAX_ATTACHMENT_GRACE_MS:
        return value
    raise _Bad(f"must be an integer from 0 to {MAX_ATTACHMENT_GRACE_MS} (milliseconds)")


Rule = Callable[[Any, str], Any]

APP_FIELDS: Final[Mapping[str, Rule]] = {
    "largePasteThreshold": _large_paste,
    "thinkingDisplayMode": _thinking_display,
    "promptEnhancementCustomTemplate": _boolean,
    "promptEnhancementUserTemplate": _user_template,
    "promptEnhancementProviderId": _pin,
    "promptEnhancementModelId": _pin,
    "promptEnhancementThinkingLevel": _thinking_level,
    "networkProxy": _proxy,
    "defaultMode": _mode,
    "defaultCommandShell": _shell,
    "attachmentBudgetBytes": _budget,
    "attachmentUnreferencedGraceMs": _grace,
}
APP_DEFAULTS: Final[Mapping[str, Any]] = {"largePasteThreshold": LARGE_PASTE_DEFAULT,
                                         "thinkingDisplayMode": "detailed"}


def clean_app(stored: Any, platform: str) -> dict[str, Any]:
    """The stored blob without what no reader may see: dropped fields and unusable known values."""
    if not isinstance(stored, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in stored.items():
        if key in DROPPED_APP_FIELDS:
            continue
        rule = APP_FIELDS.get(key)
        if rule is None:
            out[key] = value
            continue
        try:
            checked = rule(value, platform)
        except _Bad:
            continue
        if checked is not _DROP:
            out[key] = checked
    return out


def check_bundle_app(settings: Mapping[str, Any]) -> None:
    """Refuse app settings a config-sync bundle carries that no writer may store: a known field whose value
    its rule refuses on every platform (``largePasteThreshold: 0``) is ``INVALID_PARAMS`` naming the field,
    as ``settings.update`` answers. A value only another platform takes (its shell) is left to
    :func:`clean_app`, which drops it here."""
    for key, value in settings.items():
        rule = APP_FIELDS.get(key)
        if rule is None or key in DROPPED_APP_FIELDS:
            continue
        problems: list[str] = []
        for platform in SHELL_CATALOG:
            try:
                rule(value, platform)
            except _Bad as exc:
                problems.append(str(exc))
            else:
                break
        else:
            raise _bad(APP_NS, key, f"{problems[0] if problems else 'unusable'} (in the config-sync bundle)")


def app_view(stored: Any, platform: str) -> dict[str, Any]:
    """What ``settings.get`` answers for the app blob: cleaned, defaults filled in."""
    view = clean_app(stored, platform)
    for key, default in APP_DEFAULTS.items():
        view.setdefault(key, default)
    return view


# -- the other namespaces ---------------------------------------------------------


@dataclass(frozen=True)
class NsRules:
    kind: str
    """app | ui | cache | plugin | memory | owned | other"""
    max_value_bytes: int
    max_keys: int
    owner: str | None = None
    """For a host-owned namespace: the method that writes it."""

    @property
    def listable(self) -> bool:
        """``settings.getAll`` may return the whole namespace (its key count is bounded small)."""
        return self.kind in ("app", "ui", "cache", "plugin", "other")


def rules_for(ns: str) -> NsRules:
    if ns == APP_NS:
        return NsRules("app", MAX_APP_SETTINGS_BYTES, MAX_APP_SETTINGS_KEYS)
    if ns == "ui":
        return NsRules("ui", MAX_UI_VALUE_BYTES, MAX_UI_KEYS)
    if ns == "cache":
        return NsRules("cache", MAX_CACHE_VALUE_BYTES, MAX_CACHE_KEYS)
    if ns.startswith("plugin:"):
        return NsRules("plugin", MAX_PLUGIN_VALUE_BYTES, MAX_PLUGIN_KEYS)
    if ns == "projectMemory":
        return NsRules("memory", MAX_OTHER_VALUE_BYTES, 0)
    if ns in HOST_OWNED_NAMESPACES:
        return NsRules("owned", MAX_OTHER_VALUE_BYTES, 0, owner=HOST_OWNED_NAMESPACES[ns])
    return NsRules("other", MAX_OTHER_VALUE_BYTES, MAX_OTHER_KEYS)


def check_key(ns: str, key: Any) -> None:
    """A key's length: 1-MAX_SETTING_KEY_CHARS characters, or a project path of up to MAX_PATH_CHARS in
    ``projectMemory`` (seed 003 §4.2: memory for every project path, and a project path may be that long)."""
    limit = MAX_PATH_CHARS if ns == "projectMemory" else MAX_SETTING_KEY_CHARS
    if not isinstance(key, str) or not 1 <= len(key) <= limit:
        raise InvalidInput(f"keys of {ns} must be 1-{limit} characters", data={"ns": ns, "field": key})


def canonical_key(ns: str, key: str) -> str:
    """The key as stored: project memory is keyed by the canonical project path."""
    if ns == "projectMemory":
        return canonical_path(key)
    return key


def canonical_path(path: str) -> str:
    """Seed §4.2: trimmed, separators normalized to ``/``, trailing separators removed."""
    return normalize_project_path(path)


def _size(value: Any) -> int:
    return len(dumps_exact(value))  # as stored: a seed-era integer beyond 64 bits included


def _recent_models(value: Any) -> Any:
    if not isinstance(value, list) or len(value) > MAX_RECENT_MODELS:
        raise _Bad(f"must be a list of at most {MAX_RECENT_MODELS} {{providerId, modelId}} entries, newest first")
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != {"providerId", "modelId"}:
            raise _Bad(f"entry {i} must be exactly {{providerId, modelId}}")
        ref = (item["providerId"], item["modelId"])
        if not all(isinstance(r, str) and 1 <= len(r) <= MAX_REF_CHARS for r in ref):
            raise _Bad(f"entry {i}: providerId and modelId must be ids of 1-{MAX_REF_CHARS} characters")
        if ref in seen:
            raise _Bad(f"entry {i} repeats {ref[0]}/{ref[1]}")
        seen.add(ref)
    return value


# -- plans ------------------------------------------------------------------------


@dataclass
class KvPlan:
    """What a settings write does: rows to upsert or delete, and what the caller sees."""

    ns: str
    rows: dict[str, Any] = field(default_factory=dict)
    """stored key -> new value, or :data:`DELETE`"""
    changed: list[str] = field(default_factory=list)
    """keys (as clients name them) whose stored value changed"""
    values: dict[str, Any] = field(default_factory=dict)
    """requested key -> the value it now holds (None: no key stored)"""


def plan_write(ns: str, current: Mapping[str, Any], changes: Mapping[str, Any], *, existing_keys: int,
               now_ms: int, platform: str) -> KvPlan:
    """Decide a write of ``changes`` (key -> value or :data:`DELETE`) to ``ns``.

    ``current``: the stored values this write can touch — for ``app`` the blob
    under ``"settings"``, otherwise the stored value of each (canonical) key
    that exists; ``existing_keys``: how many keys ``ns`` holds now.
    """
    rules = rules_for(ns)
    if rules.kind == "plugin" and not PLUGIN_ID_RE.match(ns.removeprefix("plugin:")):
        # seed 003 §4.1: uninstall = DELETE WHERE ns = plugin:<id>; no plugin id could ever clear it
        raise InvalidInput(f"ns {ns!r}: plugin:<id> needs a plugin id ({PLUGIN_ID_RE.pattern})",
                           data={"field": "ns", "ns": ns})
    if rules.kind == "owned":
        key = next(iter(changes), "")
        raise InvalidInput(f"{ns}.{key}: namespace {ns} is host-owned, written by {rules.owner}",
                           data={"field": key, "ns": ns, "owner": rules.owner})
    for key in changes:
        check_key(ns, key)
    if rules.kind == "app":
        return _plan_app(current.get(APP_SETTINGS_KEY), changes, platform)
    plan = KvPlan(ns)
    added: set[str] = set()
    removed: set[str] = set()
    for key, value in changes.items():
        stored_key = canonical_key(ns, key)
        if ns == "projectMemory" and (not stored_key or len(stored_key) > MAX_PATH_CHARS):
            raise _bad(ns, key, f"must be a project path of 1-{MAX_PATH_CHARS} characters")
        if rules.kind == "cache" and key.startswith(REFRESH_STAMP_PREFIX):  # set, update or delete alike
            raise _bad(ns, key, "refresh stamps are written by models.refresh")
        if value is DELETE:
            new: Any = DELETE
        else:
            new = _plain_value(ns, rules, key, value, now_ms)
        exists = stored_key in current
        if new is DELETE:
            if exists:
                removed.add(stored_key)
        elif not exists:
            added.add(stored_key)
        plan.rows[stored_key] = new
        plan.values[key] = None if new is DELETE else new
        if new is DELETE and not exists:
            continue
        if new is DELETE or not exists or current.get(stored_key) != new:  # a new key set to null is new too
            plan.changed.append(stored_key)
    if rules.max_keys and existing_keys + len(added) - len(removed) > rules.max_keys and added:
        key = sorted(added)[0]
        raise _bad(ns, key, f"namespace {ns} may hold at most {rules.max_keys} keys")
    plan.changed = sorted(set(plan.changed))
    return plan


def _plain_value(ns: str, rules: NsRules, key: str, value: Any, now_ms: int) -> Any:
    if rules.kind == "memory":
        memory = normalize_memory(value, now_ms, field=key)
        return DELETE if memory is EMPTY else memory
    if rules.kind == "cache":
        if key == RECENT_MODELS_KEY:
            try:
                value = _recent_models(value)
            except _Bad as exc:
                raise _bad(ns, key, str(exc)) from None
    size = _size(value)
    if size > rules.max_value_bytes:
        raise PayloadTooLarge(f"{ns}.{key}: {size} bytes, at most {rules.max_value_bytes}",
                              data={"field": key, "ns": ns, "limit": rules.max_value_bytes})
    return value


def _plan_app(stored: Any, changes: Mapping[str, Any], platform: str) -> KvPlan:
    raw = stored if isinstance(stored, dict) else {}
    blob = clean_app(raw, platform)
    plan = KvPlan(APP_NS)
    for key, value in changes.items():
        owner = HOST_OWNED_APP_KEYS.get(key)
        if owner is not None:
            raise InvalidInput(f"{key}: host-owned, written by {owner}", data={"field": key, "ns": APP_NS,
                                                                            "owner": owner})
        if value is DELETE or key in DROPPED_APP_FIELDS:
            blob.pop(key, None)
            continue
        rule = APP_FIELDS.get(key)
        if rule is None:
            checked = value
        else:
            try:
                checked = rule(value, platform)
            except _Bad as exc:
                raise _bad(APP_NS, key, str(exc)) from None
        if checked is _DROP:
            blob.pop(key, None)
        else:
            blob[key] = checked
    first = next(iter(changes), "")
    if len(blob) > MAX_APP_SETTINGS_KEYS:
        raise InvalidInput(f"{first}: the app settings hold at most {MAX_APP_SETTINGS_KEYS} keys",
                           data={"field": first, "ns": APP_NS})
    size = _size(blob)
    if size > MAX_APP_SETTINGS_BYTES:
        raise PayloadTooLarge(f"{first}: the app settings would be {size} bytes, at most {MAX_APP_SETTINGS_BYTES}",
                              data={"field": first, "ns": APP_NS, "limit": MAX_APP_SETTINGS_BYTES})
    plan.changed = sorted(k for k in set(raw) | set(blob) if k not in blob or k not in raw or raw[k] != blob[k])
    if plan.changed or not isinstance(stored, dict):
        plan.rows[APP_SETTINGS_KEY] = blob if blob else DELETE
    view = app_view(blob, platform)
    plan.values = {key: view.get(key) for key in changes}
    return plan


def plugin_of(ns: str) -> str | None:
    """The plugin id of a ``plugin:<id>`` namespace (None for any other namespace)."""
    if ns.startswith("plugin:"):
        return ns.removeprefix("plugin:")
    return None
