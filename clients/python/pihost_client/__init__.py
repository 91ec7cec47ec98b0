"""pihost_client: a typed client for pi-host's WebSocket JSON-RPC protocol (asyncio and trio).

See :mod:`pihost_client.client` for reconnect, resubscribe and retries; the
typed methods (``client.session.get(...)``) and wire types are generated from
the host's route table and models (``_generated.py``).
"""

from __future__ import annotations

from . import types
from ._generated import EVENT_PAYLOADS, MAX_JSON_DEPTH, MUTATING, PROTOCOL_VERSION, RETRIABLE_CODES
from .client import Client, Event, Resync, RpcError, Subscription, connect
from .errors import CallTimeout, ConnectionLost, HostNotRunning, HostRefused, HostUnavailable
from .hostinfo import HostInfo, default_data_dir, read_host_info

__version__ = "0.1.0"

__all__ = [
    "EVENT_PAYLOADS",
    "MAX_JSON_DEPTH",
    "MUTATING",
    "PROTOCOL_VERSION",
    "RETRIABLE_CODES",
    "CallTimeout",
    "Client",
    "ConnectionLost",
    "Event",
    "HostInfo",
    "HostNotRunning",
    "HostRefused",
    "HostUnavailable",
    "Resync",
    "RpcError",
    "Subscription",
    "connect",
    "default_data_dir",
    "read_host_info",
    "types",
]
