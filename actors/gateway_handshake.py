"""Pure checks of a WebSocket upgrade request (RELIABILITY.md §5, row 13).

- ``Origin``: absent (non-browser client) is allowed; the host's own origin
  (``http://127.0.0.1:PORT``, ``http://localhost:PORT``, ``http://[::1]:PORT``
  with the bound port: the inspector it serves) is allowed; ``null`` and other
  IP-literal origins are always refused; anything else must match the
  allow-list exactly (``--allow-origin``).
- ``Host``: must be ``127.0.0.1:PORT``, ``localhost:PORT`` or ``[::1]:PORT`` with the
  bound port (DNS-rebinding defence). A missing or repeated header is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Refusal", "check_origin", "check_host", "check_upgrade", "self_origins"]

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    reason: str


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def self_origins(port: int | None) -> frozenset[str]:
    """The origins of the pages this host serves itself (same origin as the gateway)."""
    if port is None:
        return frozenset()
    return frozenset(f"http://{name}:{port}" for name in _LOOPBACK_NAMES)


def check_origin(origins: list[str], allowed: frozenset[str]) -> Refusal | None:
    """``origins``: every ``Origin`` header value of the request (usually 0 or 1)."""
    if not origins:
        return None
    if len(origins) > 1:
        return Refusal(403, "multiple Origin headers")
    origin = origins[0].strip()
    if origin.lower() == "null":
        return Refusal(403, "Origin 'null' is not allowed")
    try:
        host = urlsplit(origin).hostname or ""
    except ValueError:
        return Refusal(403, "malformed Origin")
    if not host or _is_ip_literal(host):
        return Refusal(403, "IP-literal or host-less Origin is not allowed")
    if origin not in allowed:
        return Refusal(403, f"Origin {origin} is not allowed; to let that page in, start the host "
                            f"with --allow-origin {origin}")
    return None


def check_host(host: str | None, port: int | None) -> Refusal | None:
    if host is None or port is None:
        return Refusal(403, "missing Host header")
    expected = {f"{name}:{port}" for name in _LOOPBACK_NAMES}
    if host.strip().lower() not in expected:
        return Refusal(403, "Host header must be a loopback name with the bound port")
    return None


def check_upgrade(
    headers: Iterable[tuple[bytes, bytes]],
    host: str | None,
    *,
    port: int | None,
    allowed_origins: frozenset[str],
) -> Refusal | None:
    """Check Host first (rebinding), then Origin. ``headers`` exclude Host (wsproto strips it)."""
    refusal = check_host(host, port)
    if refusal is not None:
        return refusal
    origins: list[str] = []
    for name, value in headers:
        if name.lower() == b"origin":
            try:
                origins.append(value.decode("ascii"))
            except UnicodeDecodeError:
                return Refusal(403, "malformed Origin")
    if len(origins) == 1 and origins[0].strip() in self_origins(port):
        return None
    return check_origin(origins, allowed_origins)
