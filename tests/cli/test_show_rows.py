"""``pi-host show`` prints tool rows and one numbering.

Reproduces issue 25's "``show`` prints tool rows as a bare ``tool_call``" (an assistant row holding a tool call
printed the block's type, not the tool, its arguments or status; a tool's result row did not say which tool)
and "three numbering styles for one window" (the header said ``messages 4-6`` from the 0-based messageStart
while the rows were numbered by their 1-based ``seq``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio

from runtime.client import open_client
from tests.hostkit import REPO, msg, start_host_process


def test_show_prints_tool_calls_tool_rows_and_seq_numbering(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host = start_host_process(data)
    try:
        async def fill() -> str:
            async with open_client(host.url, host.token, client_id="show-rows", client_kind="test") as c:
                sid = str((await c.call("session.create", {"title": "Tools"}))["id"])
                rows = [
                    msg("u1", "read a.txt"),
                    msg("a1", "", role="assistant", blocks=[
                        {"type": "thinking", "text": "the user wants the file"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_call", "callId": "c1", "name": "read_file", "args": {"path": "a.txt"},
                         "status": "ok", "result": "hello"}]),
                    msg("t1", "hello", role="tool", toolName="read_file"),
                    msg("a2", "", role="assistant", blocks=[
                        {"type": "tool_call", "callId": "c2", "name": "list_files", "args": {}}]),
                ]
                for row in rows:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": row})
                return sid

        sid = trio.run(fill)
        env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
        shown = subprocess.run([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "show", sid,
                                "--limit", "3"], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    finally:
        host.terminate()
        host.proc.communicate()
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "# Tools  (messages #2-#4 of 4)",
        '[2] assistant: Let me look. | tool read_file {"path": "a.txt"} [ok]',
        "[3] tool read_file: hello",
        "[4] assistant: tool list_files {}",
    ]
