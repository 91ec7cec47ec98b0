"""All wire models in one namespace (re-exports of the ``models_*`` modules).

Split by area to keep modules small:

* :mod:`protocol.models_common`  base classes, scalar types, vocabularies, limits
* :mod:`protocol.blocks`         the open block vocabulary
* :mod:`protocol.models_records` shared records (messages, sessions, turns ...)
* :mod:`protocol.models_session` host.*, session lifecycle, windows, appends
* :mod:`protocol.models_turns`   turns, environment snapshots, in-flight, notifications
* :mod:`protocol.models_queue`   the turn queue
* :mod:`protocol.models_history` revisions, rewrites, compaction, fork, tree, context
* :mod:`protocol.models_misc`    events.subscribe, artifacts, search, settings
* :mod:`protocol.models_store`   secrets, attachments, scheduled tasks, plan approvals, projects
* :mod:`protocol.models_events`  event notification payloads
"""

from __future__ import annotations

from .blocks import BLOCK_MODELS, KNOWN_BLOCK_TYPES, Block, Blocks, check_block
from .models_common import MutatingParams, Params, Record, Result, WireModel
from .models_events import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_events import __all__ as _events_all
from .models_history import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_history import __all__ as _history_all
from .models_misc import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_misc import __all__ as _misc_all
from .models_queue import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_queue import __all__ as _queue_all
from .models_records import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_records import __all__ as _records_all
from .models_session import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_session import __all__ as _session_all
from .models_store import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_store import __all__ as _store_all
from .models_turns import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_turns import __all__ as _turns_all

__all__ = [
    "BLOCK_MODELS",
    "Block",
    "Blocks",
    "KNOWN_BLOCK_TYPES",
    "MutatingParams",
    "Params",
    "Record",
    "Result",
    "WireModel",
    "check_block",
    *_events_all,
    *_history_all,
    *_misc_all,
    *_queue_all,
    *_records_all,
    *_session_all,
    *_store_all,
    *_turns_all,
]
