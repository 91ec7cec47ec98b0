"""What the CLI's test files share: a host process on ``tmp_path / "data"`` for one test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostkit import HostProcess, start_host_process


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    """``pi-host serve --port 0`` on ``tmp_path / "data"``; SIGTERMed and reaped (its pipes drained) after."""
    proc = start_host_process(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.terminate()
