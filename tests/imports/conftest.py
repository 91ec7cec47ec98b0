"""Fixtures of the import tests that run the real ``pi-host import`` against a real host."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hostkit import HostProcess, start_host_process


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostProcess]:
    """``pi-host serve --port 0`` on ``tmp_path / "data"``; stopped with SIGTERM and reaped after."""
    proc = start_host_process(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.communicate(timeout=60)
