#!/usr/bin/env python3
"""CLI start-up benchmark: what a command costs against starting Python at all.

    python scripts/bench_cli.py [--sessions 50] [--reps 20] [--out DIR]

Each command runs in a fresh interpreter, the way the ``pi-host`` console script
runs it (``from runtime.cli import main``), against ``python -c pass`` in the same
run, interleaved round by round so a busy machine slows every command alike:

* ``pi-host --version``;
* ``pi-host sessions`` offline (no host runs: the data directory is read through
  the store), on a data directory a real host filled with ``--sessions`` sessions;
* ``pi-host sessions --ids`` offline: what shell completion runs on every Tab;
* ``python -c "import runtime.host"``: the import every command paid before the
  CLI imported a command's module only when it runs (the reference, not a command).

Figures are medians of wall and CPU time (the child's ``rusage``) in ms; the
ratios to ``python -c pass`` are the results (no timed assertion anywhere).
``scripts/bench`` runs it as its ``cli`` section (:func:`run_cli`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:  # bench_common
    sys.path.insert(0, str(ROOT / "scripts"))

import trio  # noqa: E402 - after the sys.path setup above
from bench_common import Section, Sizes, Target, inprocess_host, median, ratio, rnd  # noqa: E402 - after the sys.path setup above

from runtime.client import open_client  # noqa: E402 - after the sys.path setup above

PI_HOST = "import sys; from runtime.cli import main; sys.exit(main())"
"""What the installed ``pi-host`` console script runs."""

VERSION_OVER_PASS = 5.0
SESSIONS_OVER_PASS = 10.0


def commands(data_dir: Path) -> dict[str, list[str]]:
    py = sys.executable
    dd = ["--data-dir", str(data_dir)]
    return {
        "pythonPass": [py, "-c", "pass"],
        "version": [py, "-c", PI_HOST, "--version"],
        "sessionsOffline": [py, "-c", PI_HOST, *dd, "sessions"],
        "sessionIdsOffline": [py, "-c", PI_HOST, *dd, "sessions", "--ids"],
        "hostImport": [py, "-c", "import runtime.host"],
    }


def _run_once(argv: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run; a failing command raises (a broken command is no figure)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-3:])} exited with {proc.returncode}: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


async def _fill(data_dir: Path, sessions: int) -> None:
    """A real host writes ``sessions`` sessions of one message each, then stops cleanly."""
    async with inprocess_host(data_dir) as host:
        async with open_client(host.url, host.token, client_id="bench-cli", client_kind="cli") as c:
            for i in range(sessions):
                sid = (await c.call("session.create", {"title": f"bench cli {i}"}))["id"]
                message = {"id": f"m{i}", "role": "user", "blocks": [{"type": "text", "text": f"hello {i}"}]}
                await c.call("session.appendMessage", {"sessionId": sid, "message": message})


def run(*, sessions: int, reps: int, work: Path) -> dict[str, Any]:
    data_dir = work / "cli-data"
    if data_dir.exists():
        shutil.rmtree(data_dir)
    trio.run(_fill, data_dir, sessions)
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    cmds = commands(data_dir)
    for argv in cmds.values():  # warm the page cache and the bytecode caches: steady state only
        _run_once(argv, env)
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    cpus: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(reps):
        for key, argv in cmds.items():
            wall, cpu = _run_once(argv, env)
            walls[key].append(wall)
            cpus[key].append(cpu)
    wall_ms = {k: median(v) * 1000 for k, v in walls.items()}
    cpu_ms = {k: median(v) * 1000 for k, v in cpus.items()}
    base = wall_ms["pythonPass"]
    shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "sessions": sessions,
        "reps": reps,
        "wallMs": {k: rnd(v) for k, v in wall_ms.items()},
        "cpuMs": {k: rnd(v) for k, v in cpu_ms.items()},
        "overPythonPass": {k: rnd(ratio(v, base)) for k, v in wall_ms.items() if k != "pythonPass"},
        "versionOverHostImport": rnd(ratio(wall_ms["version"], wall_ms["hostImport"])),
    }


def run_cli(sizes: Sizes, work: Path) -> Section:
    sec = Section("cli", "CLI start-up (scripts/bench_cli.py): commands against `python -c pass`")
    res = run(sessions=sizes.sessions, reps=sizes.cli_reps, work=work)
    sec.figures = res
    over = res["overPythonPass"]
    sec.targets = [
        Target("pi-host --version: wall time over python -c pass", over["version"], "<=", VERSION_OVER_PASS),
        Target("pi-host sessions (offline): wall time over python -c pass", over["sessionsOffline"], "<=",
               SESSIONS_OVER_PASS),
        Target("pi-host sessions --ids (offline, completion): wall time over python -c pass",
               over["sessionIdsOffline"], "<=", SESSIONS_OVER_PASS),
    ]
    sec.notes = [
        f"medians of {res['reps']} rounds, each round runs every command once in a fresh interpreter "
        "(interleaved, after one warm-up run each); CPU is the child's user + system time",
        f"offline reads: a data directory a real host filled with {res['sessions']} sessions, then stopped",
        "hostImport (python -c 'import runtime.host') is what every command imported before; "
        "versionOverHostImport sets --version against it",
    ]
    return sec


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.out / "work-cli"
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = run(sessions=args.sessions, reps=args.reps, work=work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(res, indent=2))
    (args.out / "bench_cli.json").write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
