#!/usr/bin/env python3
"""Import benchmark: a generated Claude Code projects directory through the real importer.

    python scripts/bench_import.py                        # small: 20 MB in 8 sessions
    python scripts/bench_import.py --size-mb 1024 --sessions 64 --out DIR

Generates ``~/.claude/projects``-shaped files (streamed to disk, so generating
costs no memory): prompts, replies split over several lines per API response,
thinking with signatures, tool calls with results of log-normal sizes, a few
subagent files. Then ``store.imports.import_root`` imports the whole tree
into a fresh data directory (transcripts, SQLite index with FTS5, origin
rows) and the script reports messages/s, MB/s of source read, and the process's
peak RSS (``ru_maxrss``) measured in a child process that does only the import,
so the generator's memory is not counted. The target is bounded memory: the
peak RSS must stay under 300 MB whatever the size of the directory; a second
import of the unchanged tree (the fingerprint check) is timed too.

Prints the figures as JSON, writes ``DIR/bench_import.json`` and returns the
dict from :func:`run` (``scripts/bench`` may import it).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(ROOT))

RSS_TARGET_MB = 300.0
WORDS = ("the function returns a value when the request reaches the server and the index answers the query "
         "so that each session message can be found again build test error config database model user code "
         "数据库 検索 エラー").split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def generate(root: Path, *, size_bytes: int, sessions: int, seed: int = 7) -> dict[str, int]:
    """Write a projects tree of about ``size_bytes`` spread over ``sessions`` sessions."""
    rng = random.Random(seed)
    per_session = size_bytes // max(1, sessions)
    totals = {"files": 0, "bytes": 0, "lines": 0}
    for s in range(sessions):
        project = root / f"-work-project-{s % 4}"
        project.mkdir(parents=True, exist_ok=True)
        sid = f"{s:08x}-0000-4000-8000-{s:012x}"
        files = [(project / f"{sid}.jsonl", False)]
        if s % 4 == 0:
            (project / sid / "subagents").mkdir(parents=True, exist_ok=True)
            files.append((project / sid / "subagents" / "agent-a1b2c3.jsonl", True))
        for path, sub in files:
            budget = per_session // (5 if sub else 1)
            written = 0
            parent: str | None = None
            n = 0
            with open(path, "wb") as fh:
                while written < budget:
                    base = {"parentUuid": parent, "isSidechain": sub, "userType": "external",
                            "cwd": f"/work/project-{s % 4}", "sessionId": sid, "version": "2.1.50",
                            "timestamp": f"2026-05-{1 + s % 28:02d}T10:{n // 3600 % 60:02d}:{n % 60:02d}.000Z"}
                    if sub:
                        base["agentId"] = "a1b2c3"
                    lines = []
                    uid = f"{s:06x}{n:010x}-u"
                    lines.append({**base, "type": "user", "uuid": uid,
                                  "message": {"role": "user", "content": _text(rng, int(rng.lognormvariate(3, 1)))}})
                    api = f"msg_{s}_{n}"
                    prev = uid
                    for kind in ("thinking", "text"):
                        aid = f"{s:06x}{n:010x}-{kind[0]}"
                        block = ({"type": "thinking", "thinking": _text(rng, 40), "signature": "E" * 200}
                                 if kind == "thinking" else {"type": "text", "text": _text(rng, int(
                                     rng.lognormvariate(4, 1)))})
                        lines.append({**base, "type": "assistant", "uuid": aid, "parentUuid": prev,
                                      "message": {"id": api, "role": "assistant", "model": "claude-bench",
                                                  "content": [block], "usage": {"input_tokens": 10,
                                                                                "output_tokens": 20}}})
                        prev = aid
                    for t in range(rng.randint(0, 3)):
                        tool_id = f"toolu_{s}_{n}_{t}"
                        tid = f"{s:06x}{n:010x}-t{t}"
                        lines.append({**base, "type": "assistant", "uuid": tid, "parentUuid": prev,
                                      "message": {"id": api, "role": "assistant", "model": "claude-bench",
                                                  "content": [{"type": "tool_use", "id": tool_id, "name": "Bash",
                                                               "input": {"command": _text(rng, 6)}}]}})
                        rid = f"{s:06x}{n:010x}-r{t}"
                        size = min(200_000, int(math.exp(rng.gauss(6.5, 1.5))))
                        lines.append({**base, "type": "user", "uuid": rid, "parentUuid": tid,
                                      "message": {"role": "user", "content": [
                                          {"type": "tool_result", "tool_use_id": tool_id,
                                           "content": ("x" * 60 + "\n") * (size // 61 + 1)}]},
                                      "toolUseResult": {"stdout": "…"}})
                        prev = rid
                    if n % 7 == 0:
                        lines.append({"type": "file-history-snapshot", "messageId": uid,
                                      "snapshot": {"trackedFileBackups": {}}})
                    for obj in lines:
                        data = _line(obj)
                        fh.write(data)
                        written += len(data)
                        totals["lines"] += 1
                    parent = prev
                    n += 1
            totals["files"] += 1
            totals["bytes"] += written
    return totals


def _import_child(projects: str, data_dir: str) -> None:
    """Runs in a child process: import the tree, print the figures (RSS is this process's only)."""
    import sqlite3

    from store.attachments import AttachmentFiles
    from store.database import apply_pragmas
    from store.import_write import ImportTarget
    from store.imports import import_root
    from store.schema import apply_schema

    root = Path(data_dir)
    (root / "sessions").mkdir(parents=True)
    (root / "attachments").mkdir()
    conn = sqlite3.connect(root / "pi.sqlite", isolation_level=None)
    apply_pragmas(conn)
    apply_schema(conn)
    target = ImportTarget(root / "sessions", AttachmentFiles(root / "attachments"))
    clock = lambda: int(time.time() * 1000)  # noqa: E731
    t0 = time.perf_counter()
    first = import_root(conn, "claude-code", Path(projects), target, now_ms=clock)
    t1 = time.perf_counter()
    second = import_root(conn, "claude-code", Path(projects), target, now_ms=clock)
    t2 = time.perf_counter()
    messages = sum(sum(r.messages.values()) for r in first.sessions)
    consumed = sum(f.consumed for r in first.sessions for f in r.files)
    print(json.dumps({
        "counts": first.counts(), "again": second.counts(), "messages": messages, "sourceBytes": consumed,
        "importSeconds": t1 - t0, "reimportSeconds": t2 - t1,
        "transcriptBytes": sum(p.stat().st_size for p in (root / "sessions").iterdir()),
        "dbBytes": (root / "pi.sqlite").stat().st_size,
        "peakRssMb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))
    conn.close()


def run(*, size_mb: float = 20, sessions: int = 8, out: Path | None = None, keep: bool = False) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    try:
        projects = work / "projects"
        gen_t0 = time.perf_counter()
        shape = generate(projects, size_bytes=int(size_mb * 1024 * 1024), sessions=sessions)
        gen_s = time.perf_counter() - gen_t0
        proc = subprocess.run([sys.executable, __file__, "--child", str(projects), str(work / "data")],
                              capture_output=True, text=True, check=True, cwd=ROOT)
        figures = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    mb = figures["sourceBytes"] / (1024 * 1024)
    result = {
        "bench": "import", "source": "claude-code", "generated": shape, "generateSeconds": round(gen_s, 2),
        **figures,
        "messagesPerSecond": round(figures["messages"] / figures["importSeconds"], 1),
        "mbPerSecond": round(mb / figures["importSeconds"], 2),
        "reimportMbPerSecond": round(mb / max(figures["reimportSeconds"], 1e-9), 2),
        "rssTargetMb": RSS_TARGET_MB,
        "boundedMemory": figures["peakRssMb"] < RSS_TARGET_MB,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_import.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--child"]:
        _import_child(args[1], args[2])
        return {}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=20)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the generated tree and data directory")
    opts = parser.parse_args(args)
    result = run(size_mb=opts.size_mb, sessions=opts.sessions, out=opts.out, keep=opts.keep)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
