"""Imported by the suite's forkserver (tests/host_fork.py ``PRELOAD``): every wire model built once, before any
host is forked from it (they are built on first use; ``pi-host serve`` builds them all as it starts)."""

from __future__ import annotations

from protocol.models import build_all

BUILT = build_all()
