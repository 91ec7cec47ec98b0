"""An answer (``approvals.respond`` / ``interactions.respond``) failing with ENOSPC / EIO once its decision line
is durable, retried at once in the same process: one decision line, the first try's answer.

The line (with the answer's receipt) is written before the row changes; a failed commit left the row pending,
and the retry wrote a second identical line and committed (a restart applies the first line to the pending
row, as boot does after a kill, but the live process did not). Now the catch-up that follows the failure
applies the decision lines it indexes to requests still pending, with their receipts, as boot does
(``store.approvals.apply_decision_lines``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from tests.approvals.test_approvals_host import ask, decision_lines, session_with_turn
from tests.hostkit import client_for, index_caught_up, inprocess_host

CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}


@pytest.mark.parametrize("action", ["enospc", "eio"])
@pytest.mark.parametrize("option", ["allow_once", "allow_session", "deny"])
async def test_an_answer_retried_after_its_commit_failed_is_decided_once(tmp_path: Path, option: str,
                                                                        action: str) -> None:
    params = {"optionId": option, "submissionId": "answer-1"}
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "sidecar", kind="agent") as sidecar, \
                client_for(host, "ui", kind="ui") as ui:
            sid = await session_with_turn(sidecar)
            rid = (await ask(sidecar, sid, toolCallId="call-1"))["request"]["requestId"]
            params.update(sessionId=sid, requestId=rid)
            await index_caught_up(host)
            host.faults.add("index.before_commit", nth=1, action=action)  # the line durable, the row not
            with pytest.raises(RpcError) as failed:
                await ui.call("approvals.respond", params)
            host.faults.clear()
            assert failed.value.data_code == CODES[action]
            retried = await ui.call("approvals.respond", params)
            assert await ui.call("approvals.respond", params) == retried
            with pytest.raises(RpcError) as other:  # another answer: the request is settled
                await ui.call("approvals.respond", {**params, "submissionId": "answer-2"})
            assert other.value.data_code == "CONFLICT"
            pending = (await ui.call("approvals.pending", {"sessionId": sid}))["pending"]
            rules = (await ui.call("approvals.rules", {"sessionId": sid}))["rules"]
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as ui:
            assert await ui.call("approvals.respond", params) == retried
            assert (await ui.call("approvals.rules", {"sessionId": sid}))["rules"] == rules
    status = "denied" if option == "deny" else "allowed"
    assert retried["request"]["status"] == status and retried["request"]["optionId"] == option
    assert pending == []
    assert len(rules) == (1 if option == "allow_session" else 0)
    got = [(d["id"], d["status"]) for d in decision_lines(tmp_path, sid)]
    assert got == [(rid, status)], (got, rid)
