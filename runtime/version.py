"""The host's version, alone so that ``pi-host --version`` can print it without importing the host."""

from __future__ import annotations

__all__ = ["VERSION"]

VERSION = "0.1.0"
