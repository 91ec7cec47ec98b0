"""Properties of session.get windows: one read from the transcript alone is the window the index
serves, and pages read end to end hold every message once.

``session.get`` reads its window from the file (``windows.read_file_window``) while the index cannot
take the session's acknowledged appends (a full disk). A reader must not see another conversation
then: for any transcript — new messages, replaced lines, tombstones and restores, compaction
checkpoints, ``session_info`` lines — and any window request (newest page, ``messageBefore``,
``messageEnd``, ``messageAround``, ``contentLimit``, ``maxBytes``), the reply from the file equals
the reply from the index (``windows.read_warm``), apart from the session summary's derived fields.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.errors import StoreError
from store.indexing import index
from store.indexing.database import in_transaction
from store.indexing.reconcile import apply_plan, plan_reconcile
from store.jsonio import dumps_line
from store.transcripts import windows
from store.transcripts.transcript import TranscriptWriter, create_transcript
from tests.dbkit import NOW, fresh_db

SID = "win"
TEXTS = ("hello", "a longer reply " * 6, "数据库 text", "")

# (kind, slot, text index, flag)
Step = tuple[str, int, int, int]


def _lines(steps: list[Step]) -> list[bytes]:
    ids: list[str] = []
    out: list[bytes] = []
    for n, (kind, slot, text, flag) in enumerate(steps):
        if kind in ("replace", "tombstone", "restore", "compaction") and ids:
            mid = ids[slot % len(ids)]
            if kind == "replace":
                out.append(dumps_line({"type": "message", "id": mid, "role": "assistant", "createdAt": NOW,
                                       "blocks": [{"type": "text", "text": f"edited {TEXTS[text]}"}]}))
            elif kind == "compaction":
                out.append(dumps_line({"type": "compaction", "id": f"c{slot % 3}", "summary": f"summary {n}",
                                       "throughMessageId": mid, "tokensBefore": 10 + n}))
            else:
                out.append(dumps_line({"type": "tombstone", "id": f"t{n}", "messageId": mid,
                                       "deleted": kind == "tombstone"}))
            continue
        if kind == "info":
            out.append(dumps_line({"type": "session_info", "title": f"title {n}"}))
            continue
        mid = f"m{n}"
        ids.append(mid)
        rec: dict[str, Any] = {"type": "message", "id": mid, "role": "user" if flag % 2 else "assistant",
                               "createdAt": NOW + n, "blocks": [{"type": "text", "text": TEXTS[text]}]}
        if flag >= 2:
            rec["turnId"] = f"turn{flag}"
        out.append(dumps_line(rec))
    return out


def _reply(read: Any) -> Any:
    """The decoded reply without its session summary, or the error's code."""
    try:
        w = read()
    except StoreError as exc:
        return ("error", exc.code)
    if w.missing_target:
        return ("missing",)
    got = orjson.loads(w.reply)
    got.pop("session")
    return got


@contextmanager
def _indexed(steps: list[Step]) -> Iterator[tuple[Path, sqlite3.Connection, dict[str, Any], int]]:
    """The transcript of ``steps``, an index built from it, the session's row and message count."""
    with tempfile.TemporaryDirectory() as tmp:
        path, conn = _build(Path(tmp), steps)
        try:
            row = index.session_row(conn, SID)
            assert row is not None
            yield path, conn, row, int(row["messageCount"])
        finally:
            conn.close()


def _build(tmp: Path, steps: list[Step]) -> tuple[Path, sqlite3.Connection]:
    path = tmp / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    lines = _lines(steps)
    if lines:
        writer = TranscriptWriter.open(path)
        try:
            writer.append(lines)
        finally:
            writer.close()
    conn = fresh_db(tmp / "db.sqlite")
    plan = plan_reconcile(path, 0, None)
    in_transaction(conn, lambda c: apply_plan(c, SID, plan, now_ms=NOW))
    return path, conn


STEPS = st.lists(st.tuples(st.sampled_from(("new", "new", "new", "replace", "tombstone", "restore", "compaction",
                                             "info")),
                           st.integers(0, 20), st.integers(0, len(TEXTS) - 1), st.integers(0, 3)),
                 min_size=0, max_size=30)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=STEPS,
    anchor=st.sampled_from(("newest", "before", "start", "around")),
    at=st.integers(0, 35),
    limit=st.one_of(st.none(), st.integers(1, 12)),
    content_limit=st.one_of(st.none(), st.integers(1, 40)),
    max_bytes=st.one_of(st.none(), st.integers(600, 4000)),
)
def test_the_window_from_the_file_is_the_window_from_the_index(steps: list[Step], anchor: str, at: int,
                                                                 limit: int | None, content_limit: int | None,
                                                                 max_bytes: int | None) -> None:
    with _indexed(steps) as (path, conn, row, total):
        around = f"m{at}" if anchor == "around" else None
        req = windows.WindowRequest(
            before=at if anchor == "before" else None, start=at if anchor == "start" else None,
            limit=limit, content_limit=content_limit, around=around, max_bytes=max_bytes)
        from_index = _reply(lambda: windows.read_warm(conn, SID, path, total, req, row))
        from_file = _reply(lambda: windows.read_file_window(path, req, row, max_file_bytes=1 << 24))
        assert from_file == from_index


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, forward=st.booleans(), limit=st.one_of(st.none(), st.integers(1, 7)),
       max_bytes=st.one_of(st.none(), st.integers(700, 3000)), from_file=st.booleans())
def test_paging_through_a_transcript_reads_each_message_once(steps: list[Step], forward: bool, limit: int | None,
                                                             max_bytes: int | None, from_file: bool) -> None:
    """Pages read forward (``messageEnd``) or backward (``messageBefore``), cut by ``messageLimit`` and/or
    ``maxBytes``, end to end hold the whole transcript's messages once each, in order."""
    if limit is None and max_bytes is None:
        limit = 4
    with _indexed(steps) as (path, conn, row, total):
        def read(req: windows.WindowRequest) -> Any:
            if from_file:
                w = windows.read_file_window(path, req, row, max_file_bytes=1 << 24)
            else:
                w = windows.read_warm(conn, SID, path, total, req, row)
            return orjson.loads(w.reply)

        whole = read(windows.WindowRequest())["messages"]
        pages: list[list[Any]] = []
        at = 0 if forward else total
        for _ in range(total + 2):
            try:
                got = read(windows.WindowRequest(start=at if forward else None, before=None if forward else at,
                                                 limit=limit, max_bytes=max_bytes))
            except StoreError as exc:  # one message over the budget: the documented refusal
                assert exc.code == "PAYLOAD_TOO_LARGE" and max_bytes is not None
                return
            pages.append(got["messages"])
            if forward:
                assert got["messageStart"] == at
                at = got["messageEnd"]
                if not got["hasMoreAfter"]:
                    break
            else:
                assert got["messageEnd"] == at
                at = got["messageStart"]
                if not got["hasMoreBefore"]:
                    break
        else:
            raise AssertionError("paging did not end")
        ordered = pages if forward else pages[::-1]
        assert [m for page in ordered for m in page] == whole
        assert [m["seq"] for m in whole] == list(range(1, total + 1))


def test_a_transcript_over_the_bound_is_payload_too_large(tmp_path: Path) -> None:
    path = tmp_path / f"{SID}.jsonl"
    create_transcript(path, SID, NOW)
    writer = TranscriptWriter.open(path)
    try:
        writer.append(_lines([("new", 0, 1, 1)] * 20))
    finally:
        writer.close()
    with pytest.raises(StoreError) as exc:
        windows.read_file_window(path, windows.WindowRequest(limit=5), {"id": SID}, max_file_bytes=1000)
    assert exc.value.code == "PAYLOAD_TOO_LARGE"
