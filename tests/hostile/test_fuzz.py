"""The fuzzer in CI (issue 18 "Fuzzing" findings and "Fuzzing in the suite"): every method, valid-shaped
and mutated params, against a real host; afterwards the host is alive, no actor restarted, the index
passes integrity_check, every transcript line parses, and no answer was INTERNAL."""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.routes import ROUTES
from scripts.chaos_fuzz import FuzzReport, Pools, frames, fuzz_host, method_names, seed_pools, verify
from tests.hostkit import client_for, inprocess_host

FRAMES = 1500


async def _pools(host: object, root: Path) -> Pools:
    sandbox = root.parent / f"{root.name}-sandbox"
    sandbox.mkdir()
    pools = Pools(sandbox=str(sandbox))
    async with client_for(host, kind="ui") as c:  # type: ignore[arg-type]
        await seed_pools(c, pools)
    return pools


async def test_fuzzer_finds_no_internal_error(tmp_path: Path) -> None:
    """Findings "122,414 frames over all 64 methods gave 150 INTERNAL errors from five causes": a CI-sized
    run over every method ends with internal=0 crashes=0 poisoned=0."""
    with trio.fail_after(300):
        async with inprocess_host(tmp_path) as host:
            pools = await _pools(host, tmp_path)
            frame_list = await trio.to_thread.run_sync(lambda: frames(FRAMES, seed=18, pools=pools))
            report = FuzzReport()
            await fuzz_host(host.url, host.token, frame_list, report)
            async with client_for(host) as c:
                status = await c.call("host.status", {})
            verify(tmp_path, report, restarts=int(status["actors"]["restarts"]))
    methods_hit = {f.split('"method":"', 1)[1].split('"', 1)[0] for f in frame_list if '"method":"' in f}
    assert set(method_names()) == set(ROUTES) - {"host.hello"}  # every routed method, issue 16/17's included
    assert methods_hit >= set(method_names())
    assert report.answers >= FRAMES
    print(f"\n{report.last_line()} answers={report.answers} reconnects={report.reconnects} "
          f"codes={dict(report.codes.most_common())}")
    assert report.ok, (report.last_line(), report.internal_samples, report.problems, report.codes.most_common(8))
