"""The ``host`` fixture of the client tests: one ``pi-host serve`` process per test (``Host``), started by the
test itself, SIGCONT'd if a test stopped it and killed at the end (a module may define its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clients.test_client_holds_up import Host


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    h = Host(tmp_path / "data")
    try:
        yield h
    finally:
        h.cleanup()
