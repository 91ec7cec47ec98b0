"""The receipt book's recent answers are bounded in bytes, not only in number.

A completed, durable answer stays in memory for cheap replays (``ReceiptBook``), at most 4,096 of them. Counted
only by number, 4,096 answers of a ``tasks.create`` with a 1 MiB prompt (or a queue answer of 8 MiB) held
gigabytes: "every queue is bounded, in bytes where bytes matter". The book now also keeps them within
``keep_bytes`` of their approximate JSON size, and an answer larger than the budget alone is not kept at all:
its receipt row in the database answers a retry, byte for byte the same.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import trio

from protocol.jsonrpc import Encoded, json_size_upto
from runtime.receipts import KEEP_BYTES, Claim, ReceiptBook, Replayed
from store.receipts import ReceiptKey
from tests.hostkit import client_for, index_caught_up, inprocess_host


def _key(n: int) -> ReceiptKey:
    return ReceiptKey("c", f"s{n}", "tasks.create", "fp")


async def _answered(book: ReceiptBook, n: int, response: Any) -> None:
    claim = await book.claim(_key(n))
    assert isinstance(claim, Claim)
    claim.complete(response)


def test_approx_size_counts_strings_bytes_and_items_and_stops_past_its_limit() -> None:
    assert json_size_upto({"a": "x" * 1000, "b": [1, 2, "yy"]}, 10**9) >= 1000
    assert json_size_upto(Encoded(b"x" * 5000), 10**9) >= 5000
    nested = [{"k": ["z" * 100]}] * 100_000  # ~10 MB: the walk stops once past the limit
    assert json_size_upto(nested, 10**9) > 10_000_000
    assert json_size_upto(nested, 1000) > 1000


async def test_recent_answers_stay_within_the_byte_budget_oldest_forgotten_first() -> None:
    book = ReceiptBook(keep=4096, keep_bytes=100_000)
    for n in range(30):
        await _answered(book, n, {"task": {"prompt": "p" * 10_000}})
    kept = book.statistics()["recent"]
    assert 5 <= kept <= 10, kept  # ~10 KB each within 100 KB, not the 30 the count bound allowed
    newest = await book.claim(_key(29))
    assert isinstance(newest, Replayed) and newest.response["task"]["prompt"] == "p" * 10_000
    oldest = await book.claim(_key(0))  # forgotten: the caller's claim, which then reads the database's row
    assert isinstance(oldest, Claim)
    oldest.release()


async def test_an_answer_over_the_whole_budget_is_not_kept_and_evicts_nothing() -> None:
    book = ReceiptBook(keep=4096, keep_bytes=100_000)
    await _answered(book, 1, {"small": True})
    await _answered(book, 2, {"prompt": "p" * 200_000})
    assert book.statistics()["recent"] == 1
    assert isinstance(await book.claim(_key(1)), Replayed)
    again = await book.claim(_key(2))
    assert isinstance(again, Claim)
    again.release()


async def test_big_keyed_answers_on_a_host_are_bounded_and_a_retry_still_gets_the_same_answer(
        tmp_path: Path) -> None:
    prompt = "q" * 1_000_000  # tasks.create answers its task, prompt included: ~1 MB each
    n = KEEP_BYTES // len(prompt) + 8
    with trio.fail_after(300):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "big") as c:
            first = await c.call("tasks.create", {"title": "t0", "prompt": prompt, "submissionId": "big-0"})
            for i in range(1, n):
                await c.call("tasks.create", {"title": f"t{i}", "prompt": prompt, "submissionId": f"big-{i}"})
            await index_caught_up(host)
            stats = host.pipeline.book.statistics()
            assert stats["recent"] < n - 4, stats  # ~32 answers of ~1 MB within 32 MiB, not all of them
            assert await c.call("tasks.create", {"title": "t0", "prompt": prompt, "submissionId": "big-0"}) == first
    with sqlite3.connect(tmp_path / "data" / "pi.sqlite") as db:  # the retry answered from the row: no new task
        assert db.execute("SELECT count(*) FROM scheduled_tasks").fetchone()[0] == n


async def test_pinned_answers_retire_once_the_index_covers_them_in_any_order_of_pinning() -> None:
    """A pinned answer (its receipt not yet in the database) is replayed from memory; ``retire_through(seq)``
    moves exactly those pinned at or below ``seq`` to the recent answers, whatever order they were pinned in
    (the retirement takes them from a heap by sequence, not by walking every pin on every covered commit)."""
    book = ReceiptBook()
    untils = [5, 3, 9, 3, 7, 1, 12]
    for n, until in enumerate(untils):
        claim = await book.claim(_key(n))
        assert isinstance(claim, Claim)
        claim.complete({"n": n}, pin_until=until)
    assert book.statistics()["pinned"] == len(untils)
    for seq in (0, 3, 4, 8, 12):
        book.retire_through(seq)
        assert book.statistics()["pinned"] == sum(1 for u in untils if u > seq), seq
        assert book.statistics()["recent"] == sum(1 for u in untils if u <= seq), seq
    for n in range(len(untils)):
        replay = await book.claim(_key(n))
        assert isinstance(replay, Replayed) and replay.response == {"n": n}
