"""``pi-host chat`` shows a turn lost to a restart, and says which sessions ``/search`` searched.

Reproduces issue 25's "the chat shows nothing for a turn lost to a restart and scopes ``/search`` to the
current session silently": a turn the boot fence aborted (the host was SIGKILLed while it ran, before any reply
was checkpointed) left the pane ending on the user's message with no word of it; ``/search`` answered from the
open session only, without saying so.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import trio

from runtime.client import open_client
from tests.clients.test_chat_tmux import Tmux, _unwrapped
from tests.hostkit import msg, start_host_process


def test_a_turn_lost_to_a_restart_is_shown_and_search_says_its_scope(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is required for this test (apt-get install tmux)")
    data = tmp_path / "data"
    host = start_host_process(data)

    async def fill() -> str:
        async with open_client(host.url, host.token, client_id="lost-turn", client_kind="agent") as c:
            other = (await c.call("session.create", {"title": "Garden"}))["id"]
            await c.call("session.appendMessage", {"sessionId": other, "message": msg("g1", "plant the tulips")})
            sid = str((await c.call("session.create", {"title": "Lost turn"}))["id"])
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u0", "which tulips?")})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t_lost"})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(
                "u1", "water the tulips", turnId="t_lost")})
            return sid

    sid = trio.run(fill)
    host.kill9()  # mid-turn, nothing streamed yet: boot aborts the turn and has no reply to promote
    host.proc.communicate()
    host = start_host_process(data)
    tmux = Tmux(f"pihost-lost-{os.getpid()}")
    command = (f"{sys.executable} -m pihost_client.chat {sid} --data-dir {data} --client-id chat-lost "
               f"2>{tmp_path / 'chat.err'}")
    try:
        tmux.run("new-session", "-d", "-s", "chat", "-x", "160", "-y", "30", command)
        screen = tmux.wait(lambda s: "| connected |" in s and "you: water the tulips" in s, "the session")
        flat = _unwrapped(screen)
        assert "!! turn t_lost aborted (the host restarted while it ran); send your message again to retry" in flat

        tmux.type("/search tulips")
        screen = tmux.wait(lambda s: "search, all sessions:" in s, "the search answer")
        flat = "".join(_unwrapped(screen).split("\n"))
        assert "Garden [" in flat and "Lost turn [" in flat, flat

        tmux.type("/find tulips")
        screen = tmux.wait(lambda s: "search, this session:" in s, "the find answer")
        flat = "".join(_unwrapped(screen).split("\n"))
        assert "#1 " in flat and "#2 " in flat and "Garden" not in flat, flat
    finally:
        tmux.kill()
        host.terminate()
        host.proc.communicate()
