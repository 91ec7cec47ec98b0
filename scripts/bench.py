#!/usr/bin/env python3
"""pi-host benchmark report: every figure a ratio measured in the same run.

    scripts/bench                      # full sizes (takes minutes)
    scripts/bench --quick              # CI-sized
    scripts/bench --out DIR --only appends,gateway

Sections: durable appends (in-process, against the raw fsync loop and the
``SQLiteSession`` baseline of ``scripts/bench_baselines.py``) · newest-50 window
reads (warm and in a fresh process) · SQLite synchronous FULL vs NORMAL ·
WebSocket gateway (the same baselines, JSON-RPC batches and the index catching
up) · whole-history reads (``scripts/bench_history.py``) · search
(``scripts/bench_search.py``) · revisions growth (``scripts/bench_revisions.py``,
when present) · import of a generated Claude Code directory
(``scripts/bench_import.py``) · CLI start-up: ``pi-host --version`` and an offline
``sessions`` against ``python -c pass`` (``scripts/bench_cli.py``). Every rate has its
CPU per operation next to it. Writes ``DIR/report.json`` and ``DIR/report.md``
(default ``bench-results/``), after every section, so a long run leaves a
partial report. Targets are printed as PASS/MISS next to the measured ratio; a
MISS never fails the run, a section that crashes does (exit status 1, the
traceback is in the report).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from bench_common import ROOT, SIZES, Section, Sizes, Target, machine_info, rnd, shown  # noqa: E402 - after the sys.path setup above
from bench_report import render_markdown  # noqa: E402 - after the sys.path setup above

from runtime.process import tune_allocator  # noqa: E402 - after the sys.path setup above

SectionFn = Callable[[Sizes, Path], Section]
SECTION_KEYS = ("appends", "windows", "synchronous", "gateway", "history", "search", "revisions", "import", "cli")


def _load_script(name: str) -> ModuleType | None:
    """Import ``scripts/<name>.py`` if it exists (other engineers own these)."""
    if not (SCRIPTS / f"{name}.py").exists():
        return None
    return importlib.import_module(name)  # SCRIPTS is on sys.path


def run_search(sizes: Sizes, work: Path) -> Section:
    sec = Section("search", "Search (scripts/bench_search.py)")
    module = _load_script("bench_search")
    if module is None:
        sec.skipped = "scripts/bench_search.py is not present"
        return sec
    out = work / "search"
    res: dict[str, Any] = module.run(messages=sizes.search_messages, sessions=sizes.search_sessions, out=out,
                                     queries=sizes.search_queries, reps=sizes.search_reps,
                                     brute_queries=sizes.search_brute)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{res['database']}{suffix}").unlink(missing_ok=True)
    latency = res["searchSessions"]
    sec.figures = {
        "build": res["build"],
        "idleUpkeep": res["idleUpkeep"],
        "asBuiltBeforeUpkeep": res["asBuilt"],
        "searchSessions": {kind: {k: v for k, v in row.items() if k not in ("examples", "countMismatchesVsBrute")}
                           for kind, row in latency.items()},
        "countsAgreeWithBruteForce": res["countsAgreeWithBruteForce"],
        "searchQueryNewestFirst": res["searchQuery"],
    }
    p95_goal = float(getattr(module, "P95_TARGET_MS", 100.0))
    speed_goal = float(getattr(module, "SPEEDUP_TARGET", 50.0))
    for kind, row in latency.items():
        if kind == "2char":
            continue  # issue 6: 1-2 character queries are reported as measured
        sec.targets.append(Target(f"search.sessions {kind} p95 (ms)", row["p95ms"], "<=", p95_goal))
    for kind, row in latency.items():
        if kind == "2char":
            continue
        sec.targets.append(Target(f"search.sessions {kind}: speedup vs brute-force scan", row["speedupP50"], ">=",
                                  speed_goal))
    mismatches = sum(len(row["countMismatchesVsBrute"]) for row in latency.values())
    sec.targets.append(Target("queries whose counts differ from the brute-force scan", mismatches, "<=", 0))
    sec.notes = [
        f"corpus: {sizes.search_messages:,} messages in {sizes.search_sessions:,} sessions, built by bench_search",
        "2-char queries are reported as measured (no target); searchQueryNewestFirst is search.query "
        "(global, newest first, limit 50), one run per query, reported as measured (no target)",
        "latencies and targets are measured after the DB writer's idle upkeep "
        "(store/search/search_upkeep.py: FTS5 merge steps until none is left, as a host does after 2 s "
        "without writes); asBuiltBeforeUpkeep is the same "
        "measurement on the index as the bulk build left it",
        "examples: " + "; ".join(f"{k}: {', '.join(map(repr, v['examples'][:3]))}" for k, v in latency.items()),
    ]
    _index_variants(sizes, work, sec)
    return sec


def _index_variants(sizes: Sizes, work: Path, sec: Section) -> None:
    """The trigram index variants side by side (scripts/bench_index_variants.py), on both corpora
    of a ``history_messages``-message session; the disk target is the schema's own variant's."""
    module = _load_script("bench_index_variants")
    if module is None:
        return
    tables = []
    # The smoke-test size builds the floors, the layout before and the schema's own, on one corpus.
    tiny = sizes.name == "tiny"
    only = ("(before)", "(v22 layout)") if tiny else ()
    for corpus in ("history",) if tiny else ("history", "zipf"):
        res: dict[str, Any] = module.run(messages=sizes.history_messages, sessions=1, queries=sizes.search_queries,
                                         reps=sizes.search_reps, brute_queries=sizes.search_brute,
                                         out=work / f"index-variants-{corpus}", corpus_kind=corpus, only=only)
        sec.figures[f"indexVariants_{corpus}"] = res
        tables.append(module.table(res))
        schema_row = next((r for r in res["variants"] if r.get("schema")), None)
        if schema_row is not None:
            sec.targets.append(Target(
                f"{corpus} corpus, {sizes.history_messages:,}-message session: disk per message, transcript + "
                f"index (B), schema's index ({schema_row['variant']})",
                schema_row["diskBytesPerMessage"], "<=", 3000.0,
                f"floor without a trigram index: {res['variants'][0]['diskBytesPerMessage']:.0f} B; with an "
                f"index that keeps positions (8-character p95 needs them: see the detail=none row), at least "
                f"{res['variants'][0]['diskBytesPerMessage'] + res['trigramPositionsPerMessage']:.0f} B (one byte "
                f"for each of the {res['trigramPositionsPerMessage']:.0f} trigram positions per message)"))
    sec.notes.append("trigram index variants (scripts/bench_index_variants.py), each built on the same corpus:\n"
                     + "\n\n".join(tables))


def run_revisions(sizes: Sizes, work: Path) -> Section:
    sec = Section("revisions", "Revisions growth (scripts/bench_revisions.py)")
    module = _load_script("bench_revisions")
    if module is None:
        sec.skipped = "scripts/bench_revisions.py is not present yet"
        return sec
    res: dict[str, Any] = module.run(sizes.revision_turns, sizes.revision_bytes, None)
    growth = res["growthPerTurn"]
    steady = growth[1:] if len(growth) > 1 else growth
    sec.figures = {
        "turns": res["turns"], "messageBytes": res["messageBytes"],
        "steadyGrowthBytesPerTurn": res["steadyGrowthBytes"],
        "finalRevisionsBytes": res["finalRevisionsBytes"],
        "naiveRevisionsBytes": res["naiveRevisionsBytes"],
        "naiveOverActual": rnd(res["naiveRevisionsBytes"] / res["finalRevisionsBytes"])
        if res["finalRevisionsBytes"] else None,
        "transcriptBytes": res["transcriptBytes"],
        "revisionsBytesAfterEachTurn": res["revisionsBytesPerTurn"],
        "growthPerTurn": growth,
    }
    spread = max(steady) / min(steady) if steady and min(steady) > 0 else None
    sec.targets = [Target("revisions growth per finished turn: max / min over turns 3..N", spread, "<=", 1.01,
                          "constant growth for a live branch (a line that grew with its branch would double it "
                          "by turn 40); the goal leaves room for a counter's next decimal digit (the refresh "
                          "line's message count reaching 10 adds one byte)")]
    sec.notes = [f"{res['turns']} regenerate-and-continue turns of {res['messageBytes']} B messages, one branch"]
    return sec


def run_import(sizes: Sizes, work: Path) -> Section:
    sec = Section("import", "Import (scripts/bench_import.py): a generated Claude Code projects directory")
    module = _load_script("bench_import")
    if module is None:
        sec.skipped = "scripts/bench_import.py is not present"
        return sec
    res: dict[str, Any] = module.run(size_mb=sizes.import_mb, sessions=sizes.import_sessions, work=work)
    goal = float(res["rssTargetMb"])
    keep = ("messages", "sourceBytes", "importSeconds", "messagesPerSecond", "mbPerSecond", "reimportSeconds",
            "reimportMbPerSecond", "peakRssMb", "baselineRssMb", "ratioToBulkIndexBuild", "transcriptBytes",
            "dbBytes", "counts")
    sec.figures = {"generated": res["generated"], "generateSeconds": res["generateSeconds"],
                   "bulkIndex": res["bulkIndex"]}
    for via, label in (("host", "import.sessions on pi-host serve"), ("store", "import_root alone (no host)")):
        figures = res.get(via)
        if figures is None:
            continue
        sec.figures[via] = {k: (rnd(v) if isinstance(v, float) else v) for k, v in figures.items() if k in keep}
        sec.targets.append(Target(f"{label}: peak RSS (MB) for {sizes.import_mb:g} MB of sources", figures["peakRssMb"],
                                  "<=", goal, "bounded memory whatever the size of the directory; floor in this "
                                  f"run: the RSS before the import, {shown(rnd(figures.get('baselineRssMb')))} MB"))
    sec.notes = [
        f"{res['generated']['files']} files, {res['generated']['bytes'] / 2**20:.0f} MB, "
        f"{res['generated']['lines']:,} lines in {sizes.import_sessions} sessions (a quarter with a subagent file): "
        "prompts, responses split over several lines, thinking with signatures, tool calls with results of "
        "log-normal sizes",
        "host: one import.sessions call over WebSocket (each session in its own actor: stage, link/append, one "
        "index transaction in the DB writer); peak RSS is the host process's VmHWM (its baseline after boot is "
        "baselineRssMb); reimport: the same call again on the unchanged tree (fingerprints only)",
        "store: store.interchange.imports.import_root alone in a child process, one connection: "
        "the floor under the host path; peak RSS is the child's own VmHWM (ru_maxrss would carry the bench "
        "driver's peak over fork + exec), baselineRssMb its RSS once the store's modules are loaded",
        "ratioToBulkIndexBuild: messages/s of the import over this run's bulk index build rate (bench_search's "
        "build_database for as many messages: only the index rows, no parsing, no transcript), reported as "
        "measured",
    ]
    return sec


def _sections() -> dict[str, SectionFn]:
    from bench_appends import run_appends, run_synchronous
    from bench_cli import run_cli
    from bench_gateway import run_gateway
    from bench_history import run_history
    from bench_windows import run_windows

    return {"appends": run_appends, "windows": run_windows, "synchronous": run_synchronous,
            "gateway": run_gateway, "history": run_history, "search": run_search, "revisions": run_revisions,
            "import": run_import, "cli": run_cli}


def _link(sec: Section, done: dict[str, Any]) -> None:
    """Figures one section takes from another that ran before it in this run: the WebSocket host's
    CPU per append sits beside the in-process one of the appends section."""
    if sec.key == "gateway" and not sec.error and "appends" in done:
        from bench_gateway import link_in_process

        link_in_process(sec, done["appends"])


def _write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(render_markdown(report))


def run(size: Sizes, out: Path, work: Path, only: Sequence[str], keep_work: bool) -> dict[str, Any]:
    started = time.perf_counter()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    report: dict[str, Any] = {
        "meta": {"size": size.name, "startedAt": datetime.now(UTC).isoformat(timespec="seconds"),
                 "wallSeconds": 0.0, "complete": False, "machine": machine_info(work),
                 "command": " ".join(sys.argv)},
        "sections": {},
    }
    fns = _sections()
    try:
        for key in only:
            print(f"== {key} ...", flush=True)
            t0 = time.perf_counter()
            try:
                sec = fns[key](size, work)
                _link(sec, report["sections"])
            except Exception:  # noqa: BLE001 - recorded in the report, the run goes on
                sec = Section(key, key, error=traceback.format_exc())
            sec.seconds = time.perf_counter() - t0
            report["sections"][key] = sec.to_json()
            report["meta"]["wallSeconds"] = round(time.perf_counter() - started, 1)
            _write(out, report)
            _print_section(sec)
        report["meta"]["complete"] = True
        report["meta"]["wallSeconds"] = round(time.perf_counter() - started, 1)
        _write(out, report)
    finally:
        if not keep_work:
            shutil.rmtree(work, ignore_errors=True)
    return report


def _print_section(sec: Section) -> None:
    print(f"== {sec.title} ({sec.seconds:.1f} s)", flush=True)
    if sec.skipped:
        print(f"  skipped: {sec.skipped}")
    if sec.error:
        print("  ERROR:\n" + sec.error)
    for t in sec.targets:
        print(t.line())
    print(flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (same as --size quick)")
    ap.add_argument("--size", choices=sorted(SIZES), default=None, help="size preset (default: full)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results", help="report directory")
    ap.add_argument("--work", type=Path, default=None,
                    help="scratch data directory (default: OUT/work); its filesystem is the one measured")
    ap.add_argument("--keep-work", action="store_true", help="keep the scratch data directory")
    ap.add_argument("--only", default=",".join(SECTION_KEYS),
                    help=f"comma-separated sections to run, in order (default: all: {','.join(SECTION_KEYS)})")
    args = ap.parse_args(argv)
    if args.quick and args.size not in (None, "quick"):
        ap.error("--quick conflicts with --size " + args.size)
    size = SIZES[args.size or ("quick" if args.quick else "full")]
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTION_KEYS]
    if unknown:
        ap.error(f"unknown section(s): {', '.join(unknown)} (known: {', '.join(SECTION_KEYS)})")
    out = args.out.resolve()
    work = (args.work or out / "work").resolve()
    # the allocator as `pi-host serve` has it (runtime/process.py), before any thread: the in-process host and
    # every baseline measured in this process run on it, as the served host does
    tune_allocator()
    report = run(size, out, work, only, args.keep_work)
    targets = [t for s in report["sections"].values() for t in s["targets"]]
    misses = sum(t["verdict"] == "MISS" for t in targets)
    errors = [k for k, s in report["sections"].items() if s["error"]]
    print(f"report: {out / 'report.md'} and report.json; {len(targets) - misses} PASS, {misses} MISS, "
          f"{len(errors)} section error(s); wall {report['meta']['wallSeconds']} s")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
