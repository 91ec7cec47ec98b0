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
MAX_IMPORT_SESSIONS: Final = 100_000
"""Sessions one ``import.sessions`` call imports (the rest is reported refused: import a subdirectory)."""
MAX_IMPORT_REPORTS: Final = 1000
"""Per-session reports an ``import.sessions`` result carries (refused ones first)."""
MAX_PLUGIN_MESSAGES: Final = 100_000
"""Messages of one ``plugins.importSession`` (the params size cap usually binds first)."""
MAX_EXPORT_INLINE_BYTES: Final = 16 * 1024 * 1024
"""A ``session.export`` answered inline; a larger export needs ``outPath``."""
