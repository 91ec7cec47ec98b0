"""The rules both the wire (``protocol/``) and the storage layer (``store/``) apply, once.

The bottom module of the project: it imports nothing of it (``tests/test_layering.py``
checks), so ``protocol/`` and ``store/`` both import it and neither imports the other.

* **Limits** — every documented limit of the wire protocol (``protocol/README.md``
  lists them). The wire models use them in their ``Field`` bounds and the storage
  layer checks the same constants, so a bound is never checked twice with two numbers.
* **Id patterns** — ids that become file names or must match them, checked before
  any path is built (RELIABILITY.md row 14: no path traversal, ever). The checks that
  raise the store's ``InvalidId`` are in ``store/ids.py``.
* **Paths** — the canonical form of a project path and what counts as absolute
  (a project root on the wire, an attachment block's path reference).
* **Credential detection** — names and value shapes that look like a credential
  (pure; the run-environment filter of the wire models and the stored snapshots use it);
  the section below says how.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

# ---------------------------------------------------------------------- limits

MAX_BLOCKS_PER_MESSAGE: Final = 4096
MAX_MESSAGES_PER_REPLACE: Final = 100_000
MAX_RETAINED_TAIL: Final = 1000
MAX_ATTACHMENTS: Final = 64
MAX_IDS_PER_CALL: Final = 1000
MAX_TOPICS: Final = 16
MAX_TEXT_FIELD: Final = 1_000_000  # queued prompt content, settings keys are far smaller
MAX_TITLE_CHARS: Final = 80
MAX_PATH_CHARS: Final = 4096
MAX_REF_CHARS: Final = 200
MAX_CURSOR_CHARS: Final = 512
MAX_QUERY_CHARS: Final = 500
MAX_TOKEN_CHARS: Final = 512
MAX_JSON_DEPTH: Final = 64
"""Containers a request frame may nest, the request object being level 1 (deeper is ``PARSE_ERROR``: the
gateway's ``store.jsonio.loads_strict``; the Python client refuses such params before sending them)."""

DEFAULT_WINDOW: Final = 100
"""``session.get`` without ``messageLimit`` (UI clients; a sidecar gets the whole transcript)."""
MAX_WINDOW: Final = 5000
"""Largest ``messageLimit`` of ``session.get``."""
MAX_SESSION_PAGE: Final = 500
"""Largest ``limit`` of ``session.list`` (and of ``pi-host sessions`` offline)."""
EVENT_RECORD_MAX: Final = 8 * 1024
"""A ``session.message`` event carries the record only up to this many bytes (else by ref only)."""

# -- review-change snapshots (seed 003 §2.0: review-changes/<sessionId>/<snapshotId>/)
MAX_REVIEW_FILE_BYTES: Final = 4 * 1024 * 1024
"""A snapshot's ``before`` bytes, and the workspace file it is taken of, at most this many bytes."""
MAX_REVIEW_SNAPSHOTS: Final = 1000
"""Snapshots one session keeps; one more is ``LIMIT_EXCEEDED`` (the card then shows no undo)."""
MAX_REVIEW_META_BYTES: Final = 64 * 1024
"""A ``meta.json`` larger than this is not read (CORRUPT_DATA)."""

# -- configuration (settings, providers, the model catalog, projects, plugins, config sync)
MAX_SETTING_KEY_CHARS: Final = 512
MAX_SETTINGS_PER_UPDATE: Final = 100
"""Keys one ``settings.update`` may change at once."""
MAX_APP_SETTINGS_BYTES: Final = 256 * 1024
"""The ``kv(app, settings)`` blob, serialized."""
MAX_APP_SETTINGS_KEYS: Final = 500
MAX_UI_VALUE_BYTES: Final = 64 * 1024
MAX_UI_KEYS: Final = 500
MAX_CACHE_VALUE_BYTES: Final = 16 * 1024
MAX_CACHE_KEYS: Final = 200
MAX_PLUGIN_VALUE_BYTES: Final = 64 * 1024
MAX_PLUGIN_KEYS: Final = 256
"""Keys of one ``plugin:<id>`` namespace."""
MAX_OTHER_VALUE_BYTES: Final = 256 * 1024
MAX_OTHER_KEYS: Final = 1000
MAX_TAGS: Final = 32
"""Thread metadata (seed 000 §2.1): tags per session, each at most ``MAX_TAG_CHARS`` code points."""
MAX_TAG_CHARS: Final = 64
MAX_FOLDER_CHARS: Final = 256
MAX_PRESET_CHARS: Final = 128
MAX_THREAD_ORIGINS: Final = 200
"""Origins reached or approved by one thread, each at most ``MAX_ORIGIN_CHARS`` code points."""
MAX_ORIGIN_CHARS: Final = 512
MAX_RECENT_MODELS: Final = 20
"""``kv(cache, recentModels)``: the bounded most-recently-used model list."""
LARGE_PASTE_DEFAULT: Final = 600
LARGE_PASTE_MIN: Final = 1
LARGE_PASTE_MAX: Final = 1_000_000
PROMPT_TEMPLATE_MAX_CHARS: Final = 8000
"""``PROMPT_ENHANCEMENT_TEMPLATE_MAX_LENGTH`` (code points)."""
MAX_MEMORY_BYTES: Final = 32 * 1024
"""Project (and group) memory: the derived plain content, UTF-8."""
MAX_MEMORY_ENTRIES: Final = 200
MAX_MEMORY_LIST: Final = 500
"""Memories one ``memories.list`` page returns (``limit`` defaults to 100)."""
MAX_SKILLS: Final = 200
"""Skills the host stores (``kv(skills)``, one key per skill name)."""
MAX_SKILL_SOURCE_BYTES: Final = 64 * 1024
"""A skill's source text (its SKILL.md), UTF-8."""
MAX_SKILL_DESCRIPTION_CHARS: Final = 1024
MAX_SKILL_VERSION_CHARS: Final = 64
MAX_SKILL_ORIGIN_CHARS: Final = 500
MAX_PLUGIN_ASSETS: Final = 64
"""Assets one plugin installs (``plugins.register``)."""
MAX_PLUGIN_ASSET_BYTES: Final = 1024 * 1024
"""One plugin asset's bytes."""
MAX_PLUGIN_ASSETS_TOTAL_BYTES: Final = 4 * 1024 * 1024
"""All of one plugin's assets together."""
PLUGIN_ASSET_TYPES: Final = ("image/png", "image/jpeg", "image/gif", "image/webp", "text/plain", "text/markdown",
                             "text/css", "application/json")
"""Media types a plugin asset may have (each checked against its bytes; no SVG or HTML: nothing executable)."""
MAX_GROUP_ROOTS: Final = 64
MAX_PROVIDERS: Final = 1000
MAX_PROVIDER_CONFIG_BYTES: Final = 64 * 1024
MAX_MODELS_PER_PROVIDER: Final = 5000
MAX_MODEL_LIST_BYTES: Final = 8 * 1024 * 1024
"""Largest ``GET {baseUrl}/models`` body models.refresh reads."""
DEFAULT_REFRESH_TIMEOUT_MS: Final = 15_000
MAX_SKIPPED_MODELS_SHOWN: Final = 20
"""Entries of a provider's model list that ``models.refresh`` left out, named one by one in its result (the rest
only counted)."""
MAX_BUNDLE_BYTES: Final = 4 * 1024 * 1024
"""A config-sync bundle (ciphertext)."""
MAX_IMPORT_SESSIONS: Final = 100_000
"""Sessions one ``import.sessions`` call imports (the rest is reported refused: import a subdirectory)."""
MAX_IMPORT_REPORTS: Final = 1000
"""Per-session reports an ``import.sessions`` result carries (refused ones first)."""
MAX_PLUGIN_MESSAGES: Final = 100_000
"""Messages of one ``plugins.importSession`` (the params size cap usually binds first)."""
MAX_EXPORT_INLINE_BYTES: Final = 16 * 1024 * 1024
"""A ``session.export`` answered inline; a larger export needs ``outPath``."""

# -- reply budgets (protocol/README.md "Limits"; the gateway enforces them on encoded bytes)
MAX_REPLY_BYTES: Final = 16 * 1024 * 1024
"""Largest single reply. Also the default and the maximum ``maxBytes`` of a window read."""
MAX_BATCH_REPLY_BYTES: Final = 32 * 1024 * 1024
"""Largest reply to one JSON-RPC batch (the sum of its entries' replies)."""
MIN_BATCH_SHARE_BYTES: Final = 32 * 1024
"""A window read inside a batch without its own ``maxBytes`` gets an equal share of the batch's
budget, at least this much (else the batch is refused whole before any entry runs)."""
MAX_WHOLE_READ_BYTES: Final = 16 * 1024 * 1024
"""``session.context`` / ``session.tree`` read the whole transcript: refused beyond this many bytes."""
READ_AHEAD_BYTES: Final = 2 * MAX_REPLY_BYTES
"""Forward ``session.get`` pages read ahead (the page after the one just answered) and held for the
next call, all sessions together: a page that does not fit is not read ahead."""
READ_AHEAD_SECONDS: Final = 1.0
"""How long a page read ahead is held for its session's next call before it is dropped."""
MAX_PATH_BYTES: Final = 4096
"""A filesystem path in params: UTF-8 bytes in all (PATH_MAX), no NUL."""
MAX_PATH_COMPONENT_BYTES: Final = 255
"""One component of such a path (NAME_MAX)."""

# ---------------------------------------------------------------------- id patterns

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# A native pi session (seed 003 §12): an opaque id that never becomes a file name here (the
# catalog looks it up in its listing of the configured pi root; no path is built from it).
NATIVE_SESSION_ID_RE = re.compile(r"^native-pi:[A-Za-z0-9_\-.@+=]{1,120}$")
# Either kind, where a method accepts both (the routing splits them before anything else happens).
SESSION_REF_RE = re.compile(r"^(?:[A-Za-z0-9_-]{1,64}|native-pi:[A-Za-z0-9_\-.@+=]{1,120})$")
# Message / turn / other wire ids: printable, bounded, no control characters.
WIRE_ID_RE = re.compile(r"^[A-Za-z0-9_\-:.@+=/]{1,200}$")
REVIEW_SNAPSHOT_ID_RE = re.compile(r"^rv-[0-9a-f]{32}$")
"""A review snapshot id: its directory name under ``review-changes/<sessionId>/``."""
COLLAB_INPUT_ID_PREFIX: Final = "collab-"
"""The id of a delivery's input line in its target is this prefix + the delivery id
(``store/collab.py``): the host writes such lines (``collab.begin``), a client never sends one."""
TURN_INDEX_LOST: Final = "INDEX_LOST"
"""The ``errorCode`` of a turn whose row a rebuilt index restored from the lines naming it (``store.turns``:
its row and how it ended went with a lost database)."""
TURN_ENDED: Final = ("completed", "aborted", "error")
"""The statuses of an ended turn (``store.turns.TERMINAL``)."""


def not_ended_sql(column: str, ended: tuple[str, ...]) -> str:
    """SQL: ``column`` holds none of the ``ended`` values. What "may be running" means for a record with a
    status: a status outside its set (a damaged record) is not proof the work ended."""
    return f"{column} NOT IN ({', '.join(repr(s) for s in ended)})"


def turn_may_be_running(column: str = "status") -> str:
    """SQL: a turn "may be running" unless its stored status says it ended. A status outside its set (a damaged
    record) is not proof the turn ended: a second turn beside it, or a queue entry handed out under it, could
    run beside the one it was; the boot fence aborts it, its end settles it."""
    return not_ended_sql(column, TURN_ENDED)


PLUGIN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""Plugin ids (they name the ``plugin:<id>`` kv namespace)."""
SKILL_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
"""A skill name (its ``kv(skills)`` key): lowercase letters, digits and inner hyphens, at most 64."""
SKILL_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
PLUGIN_ASSET_PATH_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}(?:/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}){0,3}$")
"""A plugin asset's name: up to 4 relative segments, none starting with a dot (no ``..``, no hidden files)."""

# ---------------------------------------------------------------------- paths

DRIVE_RE = re.compile(r"^[A-Za-z]:/")


def canonical_project_path(path: str) -> str:
    """Seed 003 §4.2: a project path is stored trimmed, separators normalized to ``/``, trailing
    separators removed (the key of ``projects.path`` and of the project's memory). A root keeps its one
    separator: ``/`` stays ``/`` and a drive root ``C:\\`` is ``C:/`` (``C:`` alone is drive-relative)."""
    p = path.strip().replace("\\", "/")
    keep = 3 if DRIVE_RE.match(p) else 1
    while len(p) > keep and p.endswith("/"):
        p = p[:-1]
    return p


def is_absolute_path(path: str) -> bool:
    """``/...`` or a Windows drive (``C:/...``, ``C:\\...``). A blank path, a relative one and a
    drive-relative one (``C:dir``) are not: a project root or an attachment path reference must be one."""
    p = path.replace("\\", "/")
    return p.startswith("/") or bool(DRIVE_RE.match(p))


def path_problem(value: str) -> str | None:
    """Why ``value`` is no filesystem path a client may send (a NUL, over ``MAX_PATH_BYTES`` UTF-8 bytes,
    a component over ``MAX_PATH_COMPONENT_BYTES``), else ``None``: refused as INVALID_PARAMS, never an
    OSError later. The wire's path types and a task's ``config.workspacePath`` check this one rule."""
    if "\x00" in value:
        return "a path must not contain a NUL character"
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_PATH_BYTES:
        return f"a path must be at most {MAX_PATH_BYTES} bytes of UTF-8"
    if any(len(part) > MAX_PATH_COMPONENT_BYTES for part in raw.split(b"/")):
        return f"a path component must be at most {MAX_PATH_COMPONENT_BYTES} bytes"
    return None


def model_id_problem(value: str) -> str | None:
    """Why ``value`` is no model id (``models.model_id``, seed 003 §4.4: custom ids always allowed), else ``None``:
    1-``MAX_REF_CHARS`` characters, not blank, no control character (C0 or DEL: a NUL, a newline). Any other
    character is allowed (``org/model``, ``llama3:8b``, ``model@2024``, ``gpt-4.1``, inner spaces). ``models.add``
    refuses such an id as INVALID_PARAMS; ``models.refresh`` skips a provider's entry listing one (and says so)."""
    if not 1 <= len(value) <= MAX_REF_CHARS:
        return f"a model id must be 1-{MAX_REF_CHARS} characters"
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        return "a model id must not contain a control character (a NUL, a newline ...)"
    if not value.strip():
        return "a model id must not be blank"
    return None


LABEL_CONTROLS_KEPT: Final = frozenset("\t\n\r")
"""The control characters a label may hold: the whitespace a pasted line carries (a title ending in a tab reads
back exactly, tests/hostile/test_unicode_wire.py)."""


def label_problem(value: str) -> str | None:
    """Why ``value`` is no user-visible label (a session title, a task title, a provider name), else ``None``: blank
    (only whitespace: " ", U+3000 ...), or holding a control character other than tab, line feed and carriage
    return (a NUL, ESC, any other C0, DEL). The wire refuses such a label as INVALID_PARAMS and writes nothing; it
    never rewrites one (what is stored reads back exactly, session titles aside: those are stored trimmed). Its
    length bound is the field's own. A row stored before the rule (an older database, an import, a config-sync
    bundle) still lists, reads, renames and deletes: only what a client sends is checked."""
    bad = next((c for c in value if (ord(c) < 0x20 or c == "\x7f") and c not in LABEL_CONTROLS_KEPT), None)
    if bad is not None:
        return (f"must not contain the control character U+{ord(bad):04X} "
                "(tab, line feed and carriage return are allowed)")
    if not value.strip():
        return "must not be blank"
    return None


def text_problem(value: object, max_chars: int) -> str | None:
    """Why ``value`` is not a string of 1..``max_chars`` characters (a wire field declared with
    ``StringConstraints(min_length=1, max_length=max_chars)``), else ``None``. The store checks a value
    that reaches it another way (inside a JSON object) with the same bound."""
    if not isinstance(value, str):
        return "must be a string"
    if not value:
        return "must not be empty"
    if len(value) > max_chars:
        return f"must be at most {max_chars} characters"
    return None


# ---------------------------------------------------------------------- credential detection
# A run environment snapshot must hold credential *references*, never values
# (seed 000 §4). A fixed list of keys misses ``Proxy-Authorization``, a key
# called ``key`` or a ``?key=`` in a URL, so the check has two halves:
#
# * **names** — a key, header name or URL query parameter whose normalised name
#   (lower case, ``-``/``_``/spaces removed) is a credential name
#   (:data:`CREDENTIAL_NAMES`), ends with a credential suffix
#   (:data:`CREDENTIAL_SUFFIXES`: ``X-Api-Key``, ``OPENAI_API_KEY``,
#   ``client_secret``, ``Proxy-Authorization``), or, where credentials end up
#   (``connection``, ``executionBindings``), ends with ``token``/``key``;
# * **values** — a string shaped like a credential whatever its name: an HTTP
#   auth scheme with a credential (``Bearer …``, ``Basic …``), a JWT, a PEM
#   private key, well-known token prefixes (``sk-…``, ``ghp_…``, ``xoxb-…``,
#   ``AKIA…``, ``AIza…``), a URL with a password in it or with a credential
#   query parameter.
#
# Headers given as ``[name, value]`` pairs or ``{"name": .., "value": ..}``
# objects are checked by their name too.

CREDENTIAL_NAMES: frozenset[str] = frozenset({
    "key", "apikey", "token", "secret", "password", "passwd", "pwd", "passphrase",
    "authorization", "proxyauthorization", "authentication", "cookie", "setcookie", "credential",
    "credentials", "bearer", "xamzcredential", "xamzsecuritytoken",
    "sessiontoken", "privatekey", "clientsecret", "accesskey", "secretkey",
})
# In a URL's query string a signature is a credential too (presigned URLs); as a key it is not
# (a thinking block's ``signature`` is the model's, not a secret).
QUERY_NAMES: frozenset[str] = frozenset({"sig", "signature", "xamzsignature", "googsignature", "accesstoken",
                                         "authtoken", "apikey", "key", "token", "code"})
CREDENTIAL_SUFFIXES: tuple[str, ...] = (
    "apikey", "password", "passwd", "secret", "accesstoken", "refreshtoken", "authtoken", "idtoken",
    "sessiontoken", "bearertoken", "privatekey", "secretkey", "accesskey", "authorization", "cookie",
    "credential", "credentials", "bearer",
)
# Where credentials would end up, any name ending like these is one too (``GITHUB_TOKEN``,
# ``azureKey``); elsewhere they must match exactly (``eosToken: "</s>"``, ``topKey`` are not).
_SECTION_SUFFIXES: tuple[str, ...] = ("token", "key")

_AUTH_SCHEME = re.compile(r"^\s*(bearer|basic|digest|token|apikey|negotiate|ntlm|aws4-hmac-sha256)\s+\S{8,}",
                          re.IGNORECASE)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])("
    r"sk-[A-Za-z0-9_-]{16,}|sk_(live|test)_[A-Za-z0-9]{16,}|rk_(live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"
    r")"
)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_MAX_DEPTH = 64


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-.]", "", name).lower()


def is_credential_name(name: str, *, credential_section: bool = False) -> bool:
    norm = _norm(name)
    if not norm:
        return False
    if norm in CREDENTIAL_NAMES or norm.endswith(CREDENTIAL_SUFFIXES):
        return True
    return credential_section and norm.endswith(_SECTION_SUFFIXES)


def _url_credential(value: str) -> str | None:
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return None
    if parts.password:
        return "a password in the URL"
    for name, _ in parse_qsl(parts.query, keep_blank_values=False):
        if is_credential_name(name) or _norm(name) in QUERY_NAMES:
            return f"the query parameter {name!r}"
    for name, _ in parse_qsl(parts.fragment, keep_blank_values=False):
        if is_credential_name(name) or _norm(name) in QUERY_NAMES:
            return f"the fragment parameter {name!r}"
    return None


def is_credential_value(value: str) -> str | None:
    """Why ``value`` looks like a credential (``None`` if it does not)."""
    if len(value) < 8:
        return None
    if _AUTH_SCHEME.match(value):
        return "an HTTP authorization value"
    if _PEM.search(value):
        return "a private key"
    if _JWT.search(value):
        return "a JSON Web Token"
    if _PREFIXED.search(value):
        return "an API token"
    if _URL.match(value):
        return _url_credential(value)
    return None


def _pair(value: Any) -> tuple[str, Any] | None:
    """A header written as ``[name, value]`` or ``{"name": .., "value": ..}``."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        return value[0], value[1]
    if isinstance(value, Mapping) and isinstance(value.get("name"), str) and "value" in value:
        return value["name"], value["value"]
    return None


def _filled(value: Any) -> bool:
    return value not in (None, "", [], {}) and not isinstance(value, bool)


def find_credential(value: Any, path: str, *, credential_section: bool = False) -> str | None:
    """``"<path>: <why>"`` for the first credential in ``value`` (a JSON value), else ``None``."""
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > _MAX_DEPTH:
            continue
        if isinstance(item, str):
            why = is_credential_value(item)
            if why:
                return f"{where}: {why}"
        elif isinstance(item, Mapping):
            pair = _pair(item)
            if pair is not None and _filled(pair[1]) and is_credential_name(pair[0],
                                                                            credential_section=credential_section):
                return f"{where}: a {pair[0]!r} credential"
            for key, inner in item.items():
                here = f"{where}.{key}"
                if isinstance(key, str) and _filled(inner) and is_credential_name(
                        key, credential_section=credential_section) and not isinstance(inner, (Mapping, list)):
                    return f"{here}: a credential name"
                stack.append((inner, here, depth + 1))
        elif isinstance(item, list):
            pair = _pair(item)
            if pair is not None and _filled(pair[1]) and is_credential_name(pair[0],
                                                                            credential_section=credential_section):
                return f"{where}: a {pair[0]!r} credential"
            stack.extend((inner, f"{where}[{i}]", depth + 1) for i, inner in enumerate(item))
    return None


def credential_names(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that are credential names (for messages and tests)."""
    return [n for n in names if is_credential_name(n)]
