"""``runtime.process.tune_allocator``: glibc's mmap threshold is set at every host's start, without a library
search (``ctypes.util.find_library`` runs ``ldconfig -p`` in a subprocess: a fork and an exec per start)."""

from __future__ import annotations

import platform
import subprocess
from typing import Any

import pytest

from runtime.process import MMAP_THRESHOLD, tune_allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_the_threshold_is_set_without_starting_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise AssertionError("tune_allocator started a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    assert tune_allocator(MMAP_THRESHOLD) is True
    assert started == []
