"""What the CLI's test files share: a host process on ``tmp_path / "data"`` for one test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostkit import HostProcess, served


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    """``pi-host serve --port 0`` on ``tmp_path / "data"``; SIGTERMed and reaped (its pipes drained) after."""
    with served(tmp_path / "data") as proc:
        yield proc
