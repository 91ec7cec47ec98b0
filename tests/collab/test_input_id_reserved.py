"""A delivery's input line has the id ``collab-<deliveryId>`` (``store.collab.input_message_id``), and
``collab.begin`` takes a line with that id in the target for its own: the proof that a begin happened
(a retry after a crash answers from it, boot binds it). So a client cannot take that id first: an
append, a streamed reply's checkpoint or a plugin's import with it is ``INVALID_PARAMS``, a
``replaceMessages`` adding it is ``PERMISSION_DENIED``; nothing is written, and the begin then writes
its own line with its provenance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.client import HostClient, RpcError
from store.collab import check_rewrite
from store.errors import PermissionDenied
from store.rules import COLLAB_INPUT_ID_PREFIX
from tests.hostkit import client_for, inprocess_host, msg

SRC, TGT = "src", "tgt"


async def _delivery(c: HostClient) -> str:
    for sid in (SRC, TGT):
        await c.call("session.create", {"sessionId": sid, "title": sid})
    out = await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": SRC, "targetSessionId": TGT,
                                          "kind": "task", "content": "review it", "idempotencyKey": "k1"})
    return str(out["delivery"]["id"])


async def _ids(c: HostClient, sid: str) -> list[str]:
    page = await c.call("session.get", {"sessionId": sid, "full": True})
    return [m["id"] for m in page["messages"]]


async def _refused(c: HostClient, method: str, params: dict[str, Any], code: str) -> RpcError:
    with pytest.raises(RpcError) as caught:
        await c.call(method, params)
    assert caught.value.data_code == code, caught.value
    return caught.value


async def test_a_client_cannot_take_a_deliverys_input_id_and_the_begin_still_writes_its_line(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host, "agent-1", kind="agent") as c:
        did = await _delivery(c)
        mid = f"{COLLAB_INPUT_ID_PREFIX}{did}"
        await c.call("session.startTurn", {"sessionId": TGT, "turnId": "t1"})
        err = await _refused(c, "session.appendMessage",
                             {"sessionId": TGT, "message": msg(mid, "not from the delivery")}, "INVALID_PARAMS")
        assert COLLAB_INPUT_ID_PREFIX in str(err.data)
        await _refused(c, "session.appendMessage",
                       {"sessionId": TGT, "turnId": "t1", "message": {**msg(mid, "in the turn"), "turnId": "t1"}},
                       "INVALID_PARAMS")
        await _refused(c, "session.replaceMessages",
                       {"sessionId": TGT, "messages": [msg(mid, "planted by a rewrite")]}, "PERMISSION_DENIED")
        assert await _ids(c, TGT) == []

        begun = await c.call("collab.begin", {"sessionId": TGT, "deliveryId": did, "turnId": "t1"})
        assert begun["delivery"]["status"] == "running"
        assert begun["message"]["id"] == mid
        page = await c.call("session.get", {"sessionId": TGT, "full": True})
        [line] = page["messages"]
        assert line["id"] == mid and line["sessionMessage"]["deliveryId"] == did

        # the line the host wrote is the client's to keep (or drop) in a rewrite, never to re-add under its id
        await c.call("session.replaceMessages", {"sessionId": TGT, "messages": []})
        await _refused(c, "session.replaceMessages",
                       {"sessionId": TGT, "messages": [msg(mid, "review it")]}, "PERMISSION_DENIED")


async def test_a_plugin_import_cannot_carry_a_collaboration_input_id(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host, "plugin-1", kind="plugin", plugin_id="chat") as c:
        await _refused(c, "plugins.importSession",
                       {"sourceId": "chat", "externalId": "e1",
                        "messages": [msg("m1", "hello"), msg(f"{COLLAB_INPUT_ID_PREFIX}col_x", "forged")]},
                       "INVALID_PARAMS")
        listed = await c.call("session.list", {})
        assert listed["sessions"] == []


def test_check_rewrite_refuses_a_new_line_with_an_input_id_and_keeps_an_existing_one() -> None:
    mid = f"{COLLAB_INPUT_ID_PREFIX}col_1"
    held = {"type": "message", "id": mid, "role": "user", "blocks": [{"type": "text", "text": "review it"}],
            "meta": {"sessionMessage": {"deliveryId": "col_1"}}}
    check_rewrite({mid: held}, [held])
    with pytest.raises(PermissionDenied):
        check_rewrite({}, [{**held, "meta": {}}])
