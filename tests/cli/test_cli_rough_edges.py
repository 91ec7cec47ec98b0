"""The CLI's rough edges left by the outsider pass (tests/cli/test_cli_outsider.py), each fixed with a test here:
README's "every read takes ``--json``" (``status`` printed JSON either way), ``follow``'s exit on Ctrl-C, paging
``sessions`` online and offline (``--cursor``), offline ``show`` refusing a malformed id as the host does, and
shell completion of ``settings``' verbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import trio

from runtime.client import open_client
from tests.hostkit import REPO, HostProcess, msg


def cli(data: Path | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    head = ["--data-dir", str(data)] if data is not None else []
    return subprocess.run([sys.executable, "-m", "runtime.cli", *head, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def _seed(host: HostProcess, count: int = 1) -> list[str]:
    async def go() -> list[str]:
        ids = []
        async with open_client(host.url, host.token, client_id="cli-rough", client_kind="test") as c:
            for i in range(count):
                sid = str((await c.call("session.create", {"title": f"Rough {i}"}))["id"])
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"hello {i}")})
                ids.append(sid)
        return ids

    return trio.run(go)


def test_status_prints_a_summary_for_a_person_and_the_whole_result_with_json(host: HostProcess) -> None:
    """README: "every read takes --json" (and prints text for a person without it); ``status`` printed the
    whole host.status JSON either way."""
    _seed(host)
    whole = cli(host.data_dir, "status", "--json")
    assert whole.returncode == 0, whole.stderr
    parsed = json.loads(whole.stdout)
    assert parsed["version"] and parsed["boot"]["sessionsScanned"] >= 0
    brief = cli(host.data_dir, "status")
    assert brief.returncode == 0, brief.stderr
    lines = brief.stdout.splitlines()
    assert not brief.stdout.lstrip().startswith("{") and 3 <= len(lines) <= 8, brief.stdout
    assert lines[0].startswith(f"pi-host {parsed['version']}  up ") and parsed["bootId"] in lines[0]
    assert any(line.startswith("actors: ") for line in lines)
    assert any(line.startswith("boot: last stop ") for line in lines)
