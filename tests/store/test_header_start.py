"""The clean-file check reads a transcript header's leading fields, not the whole line
(``store.indexing.reconcile.header_start``): a header carrying carried receipts, collaboration answers and
256 artifact rows (~30 KB) made every window read parse it whole (~65 us of a ~330 us read)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from store.indexing.reconcile import clean_plan, header_of, header_start
from store.transcripts.transcript import header_line

ROWS = [{"path": f"/home/ada/src/p/module_{i:04d}/file_{i}.py", "op": "edit", "turnId": f"t-{i:08x}",
         "updatedAt": 1_796_644_647_182 + i} for i in range(256)]


def _file(tmp_path: Path, header: bytes, body: bytes = b'{"type":"message","id":"m1"}\n') -> int:
    path = tmp_path / "s.jsonl"
    path.write_bytes(header + body)
    return os.open(path, os.O_RDONLY)


def test_a_long_header_is_read_up_to_its_epoch_and_agrees_with_the_whole_read(tmp_path: Path) -> None:
    plain, parsed = header_line("s1", 1_796_644_600_000)
    line = orjson.dumps({**orjson.loads(plain), "artifacts": ROWS}) + b"\n"  # as an older host's rewrite wrote it
    assert len(line) > 20_000
    fd = _file(tmp_path, line)
    try:
        start, whole = header_start(fd), header_of(fd)
        assert whole is not None and start is not None
        assert start["epoch"] == whole["epoch"] == parsed.epoch and start["type"] == "session"
        assert "artifacts" not in start and start == {k: whole[k] for k in start}
        size = os.fstat(fd).st_size
        plan = clean_plan(fd, size, parsed.epoch)
        assert plan is not None and plan.kind == "clean" and plan.epoch == parsed.epoch
        assert clean_plan(fd, size, "another-epoch") is None
    finally:
        os.close(fd)


def test_a_header_of_another_shape_is_read_whole(tmp_path: Path) -> None:
    # an "epoch" key nested before the header's own: the cut is no JSON object, so the line is read whole
    odd = orjson.dumps({"type": "session", "receipt": {"epoch": "nested"}, "sessionId": "s1", "epoch": "own",
                        "artifacts": ROWS}) + b"\n"
    fd = _file(tmp_path, odd)
    try:
        got = header_start(fd)
        assert got is not None and got["epoch"] == "own" and len(got["artifacts"]) == 256
    finally:
        os.close(fd)
    for first in (b'{"type":"message","epoch":"e1"}\n', b"not json\n", b""):
        fd = _file(tmp_path, first, b"")
        try:
            assert header_start(fd) is None
        finally:
            os.close(fd)
