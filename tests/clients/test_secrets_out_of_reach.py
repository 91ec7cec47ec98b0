"""Secrets stay out of reach of the agent's tools, and out of exports.

Reproduces issue 25's "the tour leaks the host's token": the tour ran
``chat --project /tmp/pi-tour``, also the data directory, so ``list files``
showed ``host.token secrets/ pi.sqlite``, ``read host.token`` was offered as
"risk low" and, once allowed, the token was in the transcript, search and the
inspector; ``export --format html`` reported redactions yet held the token
twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from pihost_client import connect
from pihost_client.agent import Sidecar
from pihost_client.agent_model import FakeModel
from pihost_client.agent_tools import ToolError, check_tool, run_tool
from tests.clients.test_agent import _turn
from tests.hostkit import inprocess_host, msg


def test_the_tools_refuse_data_directories_and_credential_files(tmp_path: Path) -> None:
    """Issue 25: a project root that is (or lies in) a data directory, the protected directory, and
    credential-shaped files are refused; ordinary files and public keys are not."""
    data = tmp_path / "data"
    (data / "secrets").mkdir(parents=True)
    (data / "host.token").write_text("ab" * 32 + "\n")
    (data / "project").mkdir()
    (data / "project" / "a.txt").write_text("a")
    for root, tool, path in ((data, "list_dir", "."), (data, "read_file", "host.token"),
                             (data, "list_dir", "secrets"), (data / "project", "read_file", "a.txt")):
        with pytest.raises(ToolError, match="pi-host data directory"):
            run_tool(tool, {"path": path}, str(root))

    project = tmp_path / "project"
    (project / "secrets").mkdir(parents=True)
    (project / "nested" / ".ssh").mkdir(parents=True)
    for name in ("notes.txt", "id_ed25519.pub", ".env", ".env.local", "deploy.token", "server.pem", "id_rsa",
                 "secrets/db.txt", "nested/.ssh/config", ".netrc"):
        (project / name).write_text("x")
    assert run_tool("read_file", {"path": "notes.txt"}, str(project)) == "x"
    assert run_tool("read_file", {"path": "id_ed25519.pub"}, str(project)) == "x"
    for name in (".env", ".env.local", "deploy.token", "server.pem", "id_rsa", "secrets/db.txt",
                 "nested/.ssh/config", ".netrc", "secrets"):
        with pytest.raises(ToolError, match="looks like a credential file"):
            check_tool("read_file", {"path": name}, str(project))
    (project / "link-to-env").symlink_to(project / ".env")
    with pytest.raises(ToolError, match="credential file"):
        run_tool("read_file", {"path": "link-to-env"}, str(project))
    with pytest.raises(ToolError, match="host's data directory"):
        run_tool("list_dir", {"path": "nested"}, str(project), protected=[str(project / "nested")])


async def test_the_agent_refuses_host_token_unasked_and_exports_hold_no_token(tmp_path: Path) -> None:
    """Issue 25: with the data directory as the project root, ``read host.token`` and ``list files`` are
    refused without a permission prompt and the token is nowhere in the session; a token that reached a
    transcript anyway (pasted, or read by an older sidecar) is redacted from every export format."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, trio.open_nursery() as nursery:
            async with connect(host.url, host.token, client_id="agent-secrets", client_kind="agent") as agent, \
                    connect(host.url, host.token, client_id="ui-secrets", client_kind="ui") as ui:
                nursery.start_soon(Sidecar(agent, FakeModel(delay=0, words=2), "agent-secrets",
                                           protected=(str(data),)).run)
                sid = (await ui.session.create(title="leaky tour", project_path=str(data)))["id"]
                for prompt in ("read host.token", "list files"):
                    asked, turn = await _turn(ui, sid, prompt, "ask", None)  # None: a prompt fails the test
                    assert asked == [] and turn["status"] == "completed"
                page = await ui.session.get(session_id=sid)
                calls = [b for m in page["messages"] for b in m["blocks"] if b["type"] == "tool_call"]
                assert [(b["name"], b["status"]) for b in calls] == [("read_file", "error"), ("list_dir", "error")]
                assert all("data directory" in b["result"] for b in calls)
                assert host.token not in repr(page)
                assert "secrets/" not in repr(page) and "pi.sqlite" not in repr(page)

                await ui.session.append_message(session_id=sid, message=msg(
                    "pasted", f"my token is {host.token}, and again:{host.token}"))
                assert host.token in repr(await ui.session.get(session_id=sid))  # the leak to redact
                for fmt in ("md", "html", "jsonl"):
                    exported = await ui.session.export(session_id=sid, format=fmt)
                    assert host.token not in exported["content"], fmt
                    assert exported["redactions"] >= 2, (fmt, exported["redactions"])
                nursery.cancel_scope.cancel()
