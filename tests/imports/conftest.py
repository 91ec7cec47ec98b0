"""Fixtures of the import tests that run the real ``pi-host import`` against a real host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostkit import HostProcess, served


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    """``pi-host serve --port 0`` on ``tmp_path / "data"``; stopped with SIGTERM and reaped after."""
    with served(tmp_path / "data") as proc:
        yield proc
