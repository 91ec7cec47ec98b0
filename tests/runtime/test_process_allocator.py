"""``runtime.process``: the allocator a serving host runs on. ``tune_allocator`` sets glibc's arena count, mmap
and trim thresholds without a library search (``ctypes.util.find_library`` runs ``ldconfig -p`` in a
subprocess: a fork and an exec per start); large blocks are then reused instead of mapped afresh (each fresh
mapping is a page fault per 4 KiB: 32,000 for a 60 MB whole-history read), and ``release_free_memory`` gives
what a burst left free back to the kernel. Each check runs in a forked child: the allocator is process-wide."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
import trio

from runtime.process import release_free_memory, tune_allocator

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt and malloc_trim are glibc's")


def _in_child(check: Callable[[], str]) -> str:
    """``check()``'s answer, run in a forked child (its allocator settings die with it)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            try:
                answer = check()
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                answer = f"error: {exc!r}"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    return answer


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_the_allocator_is_tuned_without_starting_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        started.append(args)
        raise AssertionError("tune_allocator started a process")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    assert _in_child(lambda: str(tune_allocator())) == "True"
    assert started == []


def test_large_blocks_are_reused_not_faulted_in_again() -> None:
    """A reply-sized block (8 MiB, as a whole-history page is) allocated and freed over and over: after the first,
    no page faults (with a 1 MiB mmap threshold each one was a fresh mapping: 2,048 faults every time)."""

    def faults_after_tuning() -> str:
        tune_allocator()
        size = 8 << 20
        counts = []
        for _ in range(5):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            block = bytearray(size)
            block[::4096] = b"x" * len(block[::4096])
            del block
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return ",".join(map(str, counts))

    counts = [int(c) for c in _in_child(faults_after_tuning).split(",")]
    assert counts[0] >= 1024, counts  # the first block was faulted in
    assert max(counts[1:]) < 64, counts  # the later ones reuse its pages


def test_free_memory_goes_back_to_the_kernel_when_released() -> None:
    """What a burst left free under the trim threshold stays in the process until ``release_free_memory``."""

    def rss_before_and_after() -> str:
        tune_allocator()
        blocks = [bytearray(1 << 20) for _ in range(48)]  # 48 MiB touched
        for block in blocks:
            block[::4096] = b"y" * len(block[::4096])
        held = _rss_kib()
        blocks.clear()
        kept = _rss_kib()
        released = release_free_memory()
        return f"{held},{kept},{_rss_kib()},{released}"

    held, kept, after, released = _in_child(rss_before_and_after).split(",")
    assert int(kept) > int(held) - 8 * 1024, (held, kept)  # under 64 MiB free: kept for reuse
    assert released == "True" and int(after) < int(kept) - 32 * 1024, (held, kept, after)


async def test_a_serving_host_releases_free_memory_every_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import host

    calls: list[tuple[float, bool]] = []
    three = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def released() -> bool:
        # from a worker thread: it blocks (walks the heap under the arena's lock)
        calls.append((time.monotonic(), threading.current_thread() is not threading.main_thread()))
        if len(calls) == 3:
            trio.from_thread.run_sync(three.set, trio_token=token)
        return True

    monkeypatch.setattr(host, "release_free_memory", released)
    started = time.monotonic()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host._release_free_memory_every, 0.05)
            await three.wait()
            nursery.cancel_scope.cancel()
    assert len(calls) >= 3 and all(off_loop for _, off_loop in calls)
    assert calls[0][0] - started >= 0.05 and all(b - a >= 0.05 for (a, _), (b, _) in pairwise(calls))


def test_serve_sets_the_interval_and_zero_turns_it_off() -> None:
    from runtime.cli import _parser
    from runtime.cli_serve import host_config
    from runtime.datadir import DataDir

    def interval(*argv: str) -> float | None:
        args = _parser().parse_args(["serve", *argv])
        return host_config(args, DataDir.resolve("/nonexistent-data", {})).memory_trim_interval

    assert interval() == 10.0
    assert interval("--memory-trim-interval", "2.5") == 2.5
    assert interval("--memory-trim-interval", "0") is None
