"""A forked test host (tests/host_fork.py) left running by a failing test must not hang the test process's exit:
multiprocessing joins its live children at exit, and a host waits for a signal that never comes. The exit kills
it, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.hostkit import REPO

_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from tests.host_fork import ForkedHost

    if __name__ == "__main__":
        data = Path(sys.argv[1])
        host = ForkedHost(["--data-dir", str(data), "serve", "--port", "0", "--quiet"], dict(os.environ), Path.cwd())
        deadline = time.monotonic() + 60
        while not (data / "host.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        print(host.pid, flush=True)
        # no stop, no reap: as a test that failed before its cleanup
""")


def test_a_host_left_running_is_killed_at_exit_not_waited_for(tmp_path: Path) -> None:
    script = tmp_path / "leave_a_host.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "data")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    assert json.loads((tmp_path / "data" / "host.json").read_text())["pid"] == pid  # it was serving
    assert "killed 1 forked host(s) still running at exit" in done.stderr, done.stderr
    assert time.monotonic() - t0 < 60
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"the host {pid} still runs")
