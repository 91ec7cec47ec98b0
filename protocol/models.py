"""All wire models in one namespace (re-exports of the ``models_*`` modules).

One module per capability, the same word as its handlers (``runtime/handlers/<capability>.py``)
and its storage (``store/<capability>.py``) where those exist:

* :mod:`protocol.models_common`   base classes, scalar types, vocabularies (limits: :mod:`store.rules`)
* :mod:`protocol.blocks`          the open block vocabulary
* :mod:`protocol.models_records`  shared records (messages, sessions, turns ...)
* :mod:`protocol.models_host`     host.hello, host.status
* :mod:`protocol.models_session`  session lifecycle and windows
* :mod:`protocol.models_appends`  session.appendMessage
* :mod:`protocol.models_turns`    turns and run environment snapshots
* :mod:`protocol.models_inflight` in-flight checkpoints
* :mod:`protocol.models_notifications` the inbox
* :mod:`protocol.models_queue`    the turn queue
* :mod:`protocol.models_revisions` regenerate branches and rewrites
* :mod:`protocol.models_compaction`, ``models_fork``, ``models_tombstones``, ``models_context``
* :mod:`protocol.models_subscriptions` events.subscribe; :mod:`protocol.models_events` event payloads
* :mod:`protocol.models_artifacts`, ``models_audit``, ``models_search``, ``models_settings``
* :mod:`protocol.models_secrets`, ``models_attachments``, ``models_tasks``, ``models_plans``, ``models_projects``
* :mod:`protocol.models_usage` token and cost rollups
* :mod:`protocol.models_collab` the session collaboration ledger
* :mod:`protocol.models_approvals` pending user requests (approvals, interactions, permission rules)
* :mod:`protocol.models_imports`, ``models_plugin_imports``, ``models_trash``, ``models_export`` (history in and out)
* :mod:`protocol.models_skills` skills and the memory listing (seed 000 §2)
* :mod:`protocol.models_workspace`, ``models_project_groups``, ``models_providers``, ``models_catalog``,
  ``models_plugins``, ``models_config_sync`` (configuration)
"""

from __future__ import annotations

from .blocks import BLOCK_MODELS, KNOWN_BLOCK_TYPES, Block, Blocks, check_block
from .models_appends import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_appends import __all__ as _appends_all
from .models_approvals import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_approvals import __all__ as _approvals_all
from .models_artifacts import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_artifacts import __all__ as _artifacts_all
from .models_attachments import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_attachments import __all__ as _attachments_all
from .models_audit import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_audit import __all__ as _audit_all
from .models_catalog import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_catalog import __all__ as _catalog_all
from .models_collab import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_collab import __all__ as _collab_all
from .models_common import MutatingParams, Params, Record, Result, WireModel
from .models_compaction import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_compaction import __all__ as _compaction_all
from .models_config_sync import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_context import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_context import __all__ as _context_all
from .models_events import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_events import __all__ as _events_all
from .models_export import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_export import __all__ as _exports_all
from .models_fork import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_fork import __all__ as _fork_all
from .models_host import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_host import __all__ as _host_all
from .models_imports import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_imports import __all__ as _imports_all
from .models_inflight import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_inflight import __all__ as _inflight_all
from .models_logs import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_logs import __all__ as _logs_all
from .models_notifications import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_notifications import __all__ as _notifications_all
from .models_plans import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_plans import __all__ as _plans_all
from .models_plugin_imports import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_plugin_imports import __all__ as _plugin_imports_all
from .models_plugins import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_project_groups import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_projects import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_projects import __all__ as _projects_all
from .models_providers import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_queue import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_queue import __all__ as _queue_all
from .models_records import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_records import __all__ as _records_all
from .models_review import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_review import __all__ as _review_all
from .models_revisions import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_revisions import __all__ as _revisions_all
from .models_search import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_search import __all__ as _search_all
from .models_secrets import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_secrets import __all__ as _secrets_all
from .models_session import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_session import __all__ as _session_all
from .models_settings import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_settings import __all__ as _settings_all
from .models_skills import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_skills import __all__ as _skills_all
from .models_subscriptions import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_subscriptions import __all__ as _subscriptions_all
from .models_tasks import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_tasks import __all__ as _tasks_all
from .models_tombstones import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_tombstones import __all__ as _tombstones_all
from .models_trash import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_trash import __all__ as _trash_all
from .models_turns import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_turns import __all__ as _turns_all
from .models_usage import *  # noqa: F403 - re-export facade; __all__ below lists every name
from .models_usage import __all__ as _usage_all
from .models_workspace import *  # noqa: F403 - re-export facade; __all__ below lists every name

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
    *_appends_all,
    *_approvals_all,
    *_artifacts_all,
    *_audit_all,
    *_attachments_all,
    *_collab_all,
    *_compaction_all,
    *_context_all,
    *_events_all,
    *_exports_all,
    *_fork_all,
    *_host_all,
    *_imports_all,
    *_inflight_all,
    *_notifications_all,
    *_plans_all,
    *_plugin_imports_all,
    *_projects_all,
    *_queue_all,
    *_records_all,
    *_revisions_all,
    *_review_all,
    *_search_all,
    *_skills_all,
    *_secrets_all,
    *_session_all,
    *_settings_all,
    *_subscriptions_all,
    *_logs_all,
    *_tasks_all,
    *_tombstones_all,
    *_trash_all,
    *_turns_all,
    *_usage_all,
    *_catalog_all,
]


def build_all() -> int:
    """Build every wire model not built yet (they are built on first use, ``WireModel``'s ``defer_build``); the
    number built. ``pi-host serve`` runs it before boot, so no request's first use builds one."""
    from pydantic import BaseModel

    built = 0
    pending: list[type[BaseModel]] = [BaseModel]
    seen: set[type[BaseModel]] = set()
    while pending:
        for cls in pending.pop().__subclasses__():
            if cls in seen:
                continue
            seen.add(cls)
            pending.append(cls)
            if cls.__module__.startswith("protocol.") and not cls.__pydantic_complete__ \
                    and not cls.__pydantic_generic_metadata__["parameters"]:
                cls.model_rebuild()
                built += 1
    return built

