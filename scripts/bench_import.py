#!/usr/bin/env python3
"""Import benchmark: a generated Claude Code projects directory through the real importer.

    python scripts/bench_import.py                        # small: 20 MB in 8 sessions
    python scripts/bench_import.py --size-mb 1024 --sessions 64 --out DIR [--via host,store]

Generates ``~/.claude/projects``-shaped files (streamed to disk, so generating
costs no memory): prompts, replies split over several lines per API response,
thinking with signatures, tool calls with results of log-normal sizes, a few
subagent files. Then imports the whole tree into a fresh data directory
(transcripts, SQLite index with FTS5, origin rows), two ways:

* ``host``: ``import.sessions`` over WebSocket on a ``pi-host serve`` process
  (each session in its actor, index rows through the DB writer) — the peak RSS
  is the host process's ``VmHWM``;
* ``store``: ``store.interchange.imports.import_root`` alone in a child process (the floor
  under the host path) — its own ``VmHWM`` too. Not ``ru_maxrss``: Linux carries a process's
  peak over ``fork`` + ``exec`` into the child's ``RUSAGE_SELF`` figure, so the child would report
  the bench driver's peak (811 MB in a full run of every section) instead of its own.

Each reports messages/s, MB/s of source read and the peak RSS (the generator's
memory is never counted). The target is bounded memory: the peak RSS must stay
under 300 MB whatever the size of the directory. A second import of the
unchanged tree (the fingerprint check) is timed too, and the message rate is set
against this machine's bulk index build rate in the same run
(``bench_search.build_database``: the index rows alone, as many messages).

Prints the figures as JSON, writes ``DIR/bench_import.json`` and returns the
dict from :func:`run`; ``scripts/bench`` runs it as its ``import`` section (:func:`run_section`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
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
if str(ROOT / "scripts") not in sys.path:  # bench_common, bench_search
    sys.path.insert(0, str(ROOT / "scripts"))

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
                        aid = f"{s:06x}{n:010x}-{kind[:2]}"  # "th", "te": one uuid per line
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
    from store.indexing.database import apply_pragmas
    from store.interchange.import_write import ImportTarget
    from store.interchange.imports import import_root
    from store.upgrade.schema import apply_schema

    base = _proc_status(os.getpid())  # after the imports, as the host's baseline is after its boot
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
    print(json.dumps({
        "counts": first.counts(), "again": second.counts(), "messages": first.messages,
        "sourceBytes": first.source_bytes,
        "importSeconds": t1 - t0, "reimportSeconds": t2 - t1,
        "transcriptBytes": sum(p.stat().st_size for p in (root / "sessions").iterdir()),
        "dbBytes": (root / "pi.sqlite").stat().st_size,
        "baselineRssMb": base.get("VmRSS", 0.0), "peakRssMb": _peak_rss_mb(),
    }))
    conn.close()


def _proc_status(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM of a process, in MB (from /proc/<pid>/status; empty where there is no /proc)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


def _peak_rss_mb() -> float:
    """This process's own peak RSS in MB: ``VmHWM`` belongs to the address space ``exec`` made, whereas
    ``ru_maxrss`` (the fallback without /proc) starts from the parent's peak on Linux."""
    hwm = _proc_status(os.getpid()).get("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


async def _call_import(url: str, token: str, projects: Path) -> tuple[dict[str, Any], float]:
    from runtime.client import open_client

    async with open_client(url, token, client_id="bench-import", client_kind="cli") as c:
        t0 = time.perf_counter()
        result: dict[str, Any] = await c.call("import.sessions", {"source": "claude-code", "root": str(projects)})
        return result, time.perf_counter() - t0


def _import_via_host(projects: Path, data_dir: Path) -> dict[str, Any]:
    """``import.sessions`` on a ``pi-host serve`` process: the user's path; the host's own peak RSS."""
    import trio
    from bench_common import start_host_process

    data_dir.mkdir(parents=True)
    proc = start_host_process(data_dir)
    try:
        base = _proc_status(proc.proc.pid)
        first, seconds = trio.run(_call_import, proc.url, proc.token, projects)
        again, reseconds = trio.run(_call_import, proc.url, proc.token, projects)
        peak = _proc_status(proc.proc.pid)
    finally:
        proc.stop()
    return {
        "counts": first["counts"], "again": again["counts"], "messages": first["messages"],
        "sourceBytes": first["sourceBytes"], "importSeconds": seconds, "reimportSeconds": reseconds,
        "transcriptBytes": sum(p.stat().st_size for p in (data_dir / "sessions").glob("*.jsonl")),
        "dbBytes": (data_dir / "pi.sqlite").stat().st_size,
        "baselineRssMb": base.get("VmRSS", 0.0), "peakRssMb": peak.get("VmHWM", 0.0),
    }


def _import_in_child(projects: Path, data_dir: Path) -> dict[str, Any]:
    """``store.interchange.imports.import_root`` alone in a child process (no host): the floor under the host path."""
    proc = subprocess.run([sys.executable, __file__, "--child", str(projects), str(data_dir)],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    figures: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return figures


def _rates(figures: dict[str, Any]) -> dict[str, Any]:
    mb = figures["sourceBytes"] / (1024 * 1024)
    return {
        **figures,
        "messagesPerSecond": round(figures["messages"] / figures["importSeconds"], 1),
        "mbPerSecond": round(mb / figures["importSeconds"], 2),
        "reimportMbPerSecond": round(mb / max(figures["reimportSeconds"], 1e-9), 2),
        "boundedMemory": figures["peakRssMb"] < RSS_TARGET_MB,
    }


def bulk_index_rate(messages: int, work: Path) -> dict[str, Any]:
    """The bulk index build rate of this machine in this run (``bench_search.build_database``: messages
    rows with their FTS5 rows in batches, nothing else), for as many messages as the import wrote."""
    import bench_search

    n = max(2_000, min(messages, 1_000_000))
    out = work / "bulk-index"
    out.mkdir(parents=True, exist_ok=True)
    cfg = bench_search.Config(n, max(1, n // 200), out, 1, 1, 0, 7)
    build, _, _ = bench_search.build_database(cfg, out / "bulk.sqlite", random.Random(7))
    shutil.rmtree(out, ignore_errors=True)
    return {"messages": n, "indexBuildMsgsPerSec": build["indexBuildMsgsPerSec"]}


def run(*, size_mb: float = 20, sessions: int = 8, out: Path | None = None, keep: bool = False,
        via: Sequence[str] = ("host", "store"), work: Path | None = None) -> dict[str, Any]:
    """Generate the tree, import it ``via`` the host and/or the store alone, and the bulk index rate."""
    work = Path(tempfile.mkdtemp(prefix="bench-import-", dir=work))
    try:
        projects = work / "projects"
        gen_t0 = time.perf_counter()
        shape = generate(projects, size_bytes=int(size_mb * 1024 * 1024), sessions=sessions)
        gen_s = time.perf_counter() - gen_t0
        result: dict[str, Any] = {"bench": "import", "source": "claude-code", "generated": shape,
                                  "generateSeconds": round(gen_s, 2), "rssTargetMb": RSS_TARGET_MB}
        if "host" in via:
            result["host"] = _rates(_import_via_host(projects, work / "host-data"))
        if "store" in via:
            result["store"] = _rates(_import_in_child(projects, work / "store-data"))
        messages = max(r["messages"] for k, r in result.items() if k in ("host", "store"))
        result["bulkIndex"] = bulk_index_rate(messages, work)
        for key in ("host", "store"):
            if key in result and result["bulkIndex"]["indexBuildMsgsPerSec"]:
                result[key]["ratioToBulkIndexBuild"] = round(
                    result[key]["messagesPerSecond"] / result["bulkIndex"]["indexBuildMsgsPerSec"], 3)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
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
    parser.add_argument("--via", default="host,store", help="host (import.sessions on pi-host serve), store "
                        "(import_root alone in a child process), or both")
    opts = parser.parse_args(args)
    result = run(size_mb=opts.size_mb, sessions=opts.sessions, out=opts.out, keep=opts.keep,
                 via=[v.strip() for v in opts.via.split(",") if v.strip()])
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
