"""``pi-host chat`` leaves on ``/quit``, Ctrl-C and Ctrl-D, in a real terminal (tmux).

Reproduces issue 25's "``pi-host chat`` never exits": each of the three
cleared the screen but the process stayed at 100 % CPU, because
``follow_forever`` cancelled its own task but never its inner
``chat.follow()`` task, which kept resubscribing on the closing client. Here
the chat runs under ``sh`` in a tmux pane that prints the chat's exit status
when it ends; each way out must print it within a few seconds, with status 0.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.clients.test_chat_tmux import Tmux
from tests.hostkit import HostProcess, start_host_process


def _chat_then_exit_status(tmux: Tmux, data: Path, err: Path) -> None:
    chat = (f"{shlex.quote(sys.executable)} -m pihost_client.chat --data-dir {shlex.quote(str(data))} "
            f"--title exits --client-id chat-exit 2>{shlex.quote(str(err))}")
    tmux.run("new-session", "-d", "-s", "chat", "-x", "100", "-y", "30",
             f"sh -c {shlex.quote(chat + '; echo chat-exited-with-$?; sleep 600')}")


@pytest.mark.slow  # three chats in a terminal, one after another, on one host
def test_the_chat_exits_on_quit_ctrl_c_and_ctrl_d(tmp_path: Path) -> None:
    """Issue 25: /quit, Ctrl-C and Ctrl-D end the chat process (it used to spin at 100 % CPU for ever)."""
    if shutil.which("tmux") is None:
        pytest.fail("tmux is required for this test (apt-get install tmux)")
    host: HostProcess = start_host_process(tmp_path / "data")
    err = tmp_path / "chat.err"
    try:
        for n, how in enumerate(("/quit", "C-c", "C-d")):
            # a socket of its own each round: a killed tmux server may not have left its socket yet
            tmux = Tmux(f"pihost-exit-{os.getpid()}-{n}")
            try:
                _chat_then_exit_status(tmux, tmp_path / "data", err)
                tmux.wait(lambda s: "| connected |" in s, "the connected status line")
                time.sleep(0.5)  # the event stream is up and following
                if how == "/quit":
                    tmux.type("/quit")
                else:
                    tmux.run("send-keys", "-t", "chat", how)
                screen = tmux.wait(lambda s: "chat-exited-with-" in s, f"an exit after {how}", timeout=5)
                assert "chat-exited-with-0" in screen, screen + err.read_text()
                assert err.read_text() == "", err.read_text()
            finally:
                tmux.kill()
    finally:
        host.terminate()
        host.proc.communicate()
