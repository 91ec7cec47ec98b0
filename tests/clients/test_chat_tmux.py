"""The reference sidecar (fake model) and ``pi-host chat`` in a real terminal (tmux).

The agent asks for permission before its first tool call and the chat
answers it (``/always``: a project rule, so the next call is not asked);
a turn streams into the chat; the host is SIGKILLed mid-reply and restarted;
the chat reconnects, shows the reply boot promoted from the checkpoint
(``[interrupted]``) and goes on with the next turn. Pane captures are saved
under ``test-artifacts/chat/``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.artifacts import artifact_dir
from tests.hostkit import REPO, HostProcess, start_host_process


class Tmux:
    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.socket_path: Path | None = None
        """Where the server's socket was, once :meth:`kill` removed it."""

    def run(self, *args: str) -> str:
        proc = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30,
                              check=True)
        return proc.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "chat")

    def type(self, text: str) -> None:
        self.run("send-keys", "-t", "chat", "-l", text)
        self.run("send-keys", "-t", "chat", "Enter")

    def kill(self) -> None:
        """Stop the tmux server and remove its socket, which ``kill-server`` leaves behind (one file per test
        in ``/tmp/tmux-<uid>/`` each run)."""
        try:
            path = Path(self.run("display-message", "-p", "#{socket_path}").strip())
        except subprocess.CalledProcessError:  # no server answers (its session ended): tmux's own default path
            path = Path(os.environ.get("TMUX_TMPDIR") or "/tmp").resolve() / f"tmux-{os.getuid()}" / self.socket
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False)
        path.unlink(missing_ok=True)
        self.socket_path = path

    def wait(self, ok: Callable[[str], bool], what: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            if ok(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the chat never showed {what}; screen:\n{text}")
            time.sleep(0.1)


@contextmanager
def tmux_chat(data: Path, project: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is required for this test (apt-get install tmux)")
    tmux = Tmux(f"pihost-test-{os.getpid()}")
    command = (f"{sys.executable} -m pihost_client.chat --data-dir {data} --project {project} "
               f"--title 'tmux chat' --client-id chat-test 2>{data.parent / 'chat.err'}")
    tmux.run("new-session", "-d", "-s", "chat", "-x", "120", "-y", "45", command)
    try:
        yield tmux
    finally:
        tmux.kill()


def _unwrapped(screen: str) -> str:
    """The pane wraps long lines at 120 columns: join them back for matching."""
    return "".join(line.ljust(120)[:120] if len(line) >= 120 else line + "\n" for line in screen.splitlines())


def _stop(host: HostProcess) -> None:
    host.terminate()
    host.proc.communicate()


def test_a_reply_survives_a_host_kill_in_the_chat(tmp_path: Path) -> None:
    data, project = tmp_path / "data", tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("remember the milk\n")
    (project / "src").mkdir()
    shots = artifact_dir("chat")
    host = start_host_process(data)
    agent_log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(
        [sys.executable, "-m", "pihost_client.agent", "--data-dir", str(data), "--controller-id", "agent-test",
         "--fake-delay", "0.12", "--fake-words", "60", "--checkpoint-every", "0.2"],
        cwd=REPO, stdout=agent_log, stderr=subprocess.STDOUT)
    try:
        with tmux_chat(data, project) as tmux:
            tmux.wait(lambda s: "| connected |" in s, "the connected status line")

            tmux.type("list files")
            screen = tmux.wait(lambda s: "permission? the agent wants to run list_dir . (risk low)" in s,
                               "the agent's permission prompt")
            assert "[done]" not in screen  # the tool waits for the answer
            (shots / "0-permission.txt").write_text(screen)
            tmux.type("/always")
            screen = tmux.wait(lambda s: "[done]" in s, "the reply to 'list files'")
            flat = _unwrapped(screen)
            assert "permission?" not in flat
            assert "you: list files" in flat
            assert "[tool list_dir(.) ok: notes.txt src/]" in flat
            assert "The tool answered: notes.txt src/" in flat
            (shots / "1-tool-call.txt").write_text(screen)

            tmux.type("tell me a long story")
            screen = tmux.wait(lambda s: "assistant [streaming]: You said: tell me a long story. The host keeps"
                               in _unwrapped(s), "the reply streaming")
            (shots / "2-streaming.txt").write_text(screen)
            host.kill9()
            host.proc.communicate()
            screen = tmux.wait(lambda s: "reconnecting..." in s, "that the host is gone")
            (shots / "3-host-killed.txt").write_text(screen)

            host = start_host_process(data)
            screen = tmux.wait(lambda s: "assistant [interrupted]: You said: tell me a long story." in _unwrapped(s)
                               and "| connected |" in s, "the promoted reply")
            (shots / "4-promoted.txt").write_text(screen)
            promoted = _unwrapped(screen).split("assistant [interrupted]: ", 1)[1].split("\n", 1)[0].strip()
            assert "[done]" not in promoted  # cut mid-reply, as streamed up to the last checkpoint
            status = json.loads(subprocess.run(
                [sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "status", "--json"],
                cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout)
            assert status["boot"]["inflightPromoted"] == 1

            tmux.type("and now?")
            screen = tmux.wait(lambda s: "assistant: You said: and now?." in _unwrapped(s)
                               and _unwrapped(s).count("[done]") == 2, "the next turn's reply")
            (shots / "5-continued.txt").write_text(screen)
            flat = _unwrapped(screen)
            assert flat.index("assistant [interrupted]") < flat.index("you: and now?")

            tmux.type("ls")  # "/always" stored a rule for the project: no prompt this time
            screen = tmux.wait(lambda s: "you: ls" in _unwrapped(s)
                               and "[done]" in _unwrapped(s).rsplit("you: ls", 1)[1], "the reply to 'ls'")
            tail = _unwrapped(screen).rsplit("you: ls", 1)[1]
            assert "[tool list_dir(.) ok: notes.txt src/]" in tail and "permission?" not in tail

            tmux.type("/search milk")
            screen = tmux.wait(lambda s: "-- search, all sessions:" in s, "search results")
            tmux.type("/branches")
            screen = tmux.wait(lambda s: "-- branches: none (no regenerated replies)" in s, "the branch list")
            tmux.type("/sessions")
            screen = tmux.wait(lambda s: "-- sessions:" in s and "(tmux chat," in s, "the session list")
            (shots / "6-sessions.txt").write_text(screen)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        agent_log.close()
        _stop(host)
    assert tmux.socket_path is not None and not tmux.socket_path.exists(), tmux.socket_path
    log = (tmp_path / "agent.log").read_text()
    assert "ended elsewhere (a host restart or a recovery); dropped" in log, log
