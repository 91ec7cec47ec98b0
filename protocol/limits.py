"""Every documented limit of the wire protocol, in one place (no imports).

The wire models use these in their ``Field`` bounds and the storage layer
imports the same constants, so a bound is never checked twice with two
numbers. ``protocol/README.md`` lists them.
"""

from __future__ import annotations

from typing import Final

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

DEFAULT_WINDOW: Final = 100
"""``session.get`` without ``messageLimit`` (UI clients; a sidecar gets the whole transcript)."""
MAX_WINDOW: Final = 5000
"""Largest ``messageLimit`` of ``session.get``."""
EVENT_RECORD_MAX: Final = 8 * 1024
"""A ``session.message`` event carries the record only up to this many bytes (else by ref only)."""

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
MAX_GROUP_ROOTS: Final = 64
MAX_PROVIDERS: Final = 1000
MAX_PROVIDER_CONFIG_BYTES: Final = 64 * 1024
MAX_MODELS_PER_PROVIDER: Final = 5000
MAX_MODEL_LIST_BYTES: Final = 8 * 1024 * 1024
"""Largest ``GET {baseUrl}/models`` body models.refresh reads."""
DEFAULT_REFRESH_TIMEOUT_MS: Final = 15_000
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
MAX_PATH_BYTES: Final = 4096
"""A filesystem path in params: UTF-8 bytes in all (PATH_MAX), no NUL."""
MAX_PATH_COMPONENT_BYTES: Final = 255
"""One component of such a path (NAME_MAX)."""
