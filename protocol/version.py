"""The wire protocol's version (``host.hello``'s ``protocol``), alone so that ``pi-host --version`` can name it
without importing the method registry and its models."""

from __future__ import annotations

__all__ = ["PROTOCOL_VERSION"]

PROTOCOL_VERSION = 1
