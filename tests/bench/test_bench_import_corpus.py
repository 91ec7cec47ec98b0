"""The import bench's generated Claude Code tree is what Claude Code writes: one uuid per line.

The generator gave a reply's thinking line and its text line the same uuid (``-{kind[0]}``: "t" for both), so
every turn was a "uuid written again" to the importer (the last line wins: the thinking block was dropped) and
the bench timed that rule's extra reads instead of a plain import."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from scripts.bench_import import generate


def test_each_generated_line_has_its_own_uuid(tmp_path: Path) -> None:
    totals = generate(tmp_path, size_bytes=400_000, sessions=4)
    files = sorted(tmp_path.rglob("*.jsonl"))
    assert len(files) == totals["files"] and totals["lines"] > 100, totals
    for path in files:
        uuids = Counter(json.loads(line)["uuid"] for line in path.read_text().splitlines()
                        if "uuid" in json.loads(line))
        repeated = [u for u, n in uuids.items() if n > 1]
        assert not repeated, (path.name, repeated[:3])
        kinds = Counter(block["type"] for line in path.read_text().splitlines()
                        for block in (json.loads(line).get("message", {}).get("content") or [])
                        if isinstance(block, dict))
        assert kinds["thinking"] and kinds["text"], kinds
