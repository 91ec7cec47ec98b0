"""Re-import checks never open a source replaced by something that blocks (issue 18 "Blocking paths",
applied to import.sessions: a source file an earlier import consumed, swapped for a FIFO with the same
size and mtime, made the unchanged-check's open block the worker thread forever)."""

from __future__ import annotations

import os
from pathlib import Path

import trio

from store.interchange.importers.common import SourceUnit
from store.interchange.imports import sources_unchanged


async def test_a_source_replaced_by_a_fifo_is_changed_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "session.jsonl"
    os.mkfifo(fifo)
    st = os.stat(fifo)
    origin = {"files": {str(fifo): {"size": st.st_size, "mtimeNs": st.st_mtime_ns, "consumed": 0,
                                    "sha256": "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}}
    unit = SourceUnit(source="pi", external_id="x", files=(fifo,))
    with trio.fail_after(5):
        unchanged = await trio.to_thread.run_sync(sources_unchanged, unit, origin, abandon_on_cancel=True)
    assert unchanged is False
