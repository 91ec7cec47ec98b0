"""A collaboration delivery that began leaves one trace a lost database does not take: its input line
(``collab-<deliveryId>``) and the deliver's answer it carries (``meta.collabDelivered``, host-only). Every
rewrite of the target keeps that trace: a ``session.replaceMessages`` (whose records come from a client, which
never sees the meta) keeps it in the line, and a rewrite that drops the line from the live transcript (a cut,
or an edit above it archiving its branch) keeps it in the new header (``collabDelivered``, carried by every
later rewrite). So a retry of the deliver after the loss answers its first answer and delivers nothing again.

Black-box, on a real host process (``tests/integrity/test_db_loss_receipts.py``'s harness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import msg
from tests.integrity.test_db_loss_receipts import _damage, _on_host, deliver_and_run
from tests.revisions.helpers import transcript_path

DELIVER = {"pluginId": "team", "sourceSessionId": "src", "targetSessionId": "tgt", "kind": "task",
           "content": "review it", "idempotencyKey": "k1", "notifyOnCompletion": True}
KEYED = {**DELIVER, "submissionId": "k-deliver"}


async def _rewrite(c: HostClient, how: str, did: str) -> None:
    """Rewrite the target's transcript as ``how`` says, after its delivery began and ended."""
    if how == "replace":  # the client's own records, as session.get gave them, one message more
        got = (await c.call("session.get", {"sessionId": "tgt"}))["messages"]
        keep = [{k: v for k, v in m.items() if k in ("id", "role", "blocks", "createdAt", "turnId", "meta")}
                for m in got]
        await c.call("session.replaceMessages", {"sessionId": "tgt", "messages": [*keep, msg("u3", "added")]})
    elif how == "edit-above":  # the input line's branch is archived into the revisions file
        await c.call("session.truncateFrom", {"sessionId": "tgt", "messageId": "u0", "mode": "edit"})
    elif how == "cut":  # the input line is cut without an archive
        await c.call("session.truncateFrom", {"sessionId": "tgt", "messageId": f"collab-{did}"})
    else:  # cut, then rewritten again: the header's entry rides on
        await c.call("session.truncateFrom", {"sessionId": "tgt", "messageId": f"collab-{did}"})
        await c.call("session.appendMessage", {"sessionId": "tgt", "message": msg("u4", "again")})
        await c.call("session.rename", {"sessionId": "tgt", "title": "renamed"})
        await c.call("session.truncateFrom", {"sessionId": "tgt", "messageId": "u4"})


@pytest.mark.parametrize("rewrite", ["replace", "edit-above", "cut", "cut-then-rewritten"])
@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_delivery_whose_input_line_was_rewritten_is_not_delivered_again_after_the_loss(
        tmp_path: Path, how: str, rewrite: str) -> None:
    """Before, ``replaceMessages`` wrote the client's records without the line's ``meta.collabDelivered``,
    and a cut or an archived branch took the line from the live transcript: after the loss the keyed retry
    and the retry by ``idempotencyKey`` found no trace, and queued the task in the target again."""

    async def build(c: HostClient) -> Any:
        for sid in ("src", "tgt"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
        await c.call("session.appendMessage", {"sessionId": "tgt", "message": msg("u0", "hello")})
        await c.call("session.appendMessage", {"sessionId": "tgt", "message": msg("a0", "hi", role="assistant")})
        first = await c.call("collab.deliver", KEYED)
        did = first["delivery"]["id"]
        await c.call("session.startTurn", {"sessionId": "tgt", "turnId": "t1"})
        await c.call("collab.begin", {"sessionId": "tgt", "deliveryId": did, "turnId": "t1"})
        await c.call("session.appendMessage", {"sessionId": "tgt", "turnId": "t1",
                                               "message": msg("a1", "done", role="assistant")})
        await c.call("session.endTurn", {"sessionId": "tgt", "turnId": "t1", "status": "completed"})
        await c.call("session.appendMessage", {"sessionId": "tgt", "message": msg("u2", "more")})
        await _rewrite(c, rewrite, did)
        assert await c.call("collab.deliver", KEYED) == first  # the database whole: its rows answer
        return first

    async def retry(c: HostClient) -> Any:
        again = await c.call("collab.deliver", KEYED)
        unkeyed = await c.call("collab.deliver", DELIVER)
        return again, unkeyed, (await c.call("session.queueList", {"sessionId": "tgt"}))["entries"]

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build)
        transcript = transcript_path(tmp_path, "tgt").read_bytes()
        _damage(tmp_path, how)
        again, unkeyed, queued = await _on_host(tmp_path, retry)
    assert first["replayed"] is False
    assert again == first
    assert unkeyed["replayed"] is True and unkeyed["delivery"]["id"] == first["delivery"]["id"]
    assert queued == []  # not queued again
    assert transcript_path(tmp_path, "tgt").read_bytes() == transcript


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_large_task_cut_from_the_transcript_keeps_its_header_small(tmp_path: Path, how: str) -> None:
    """A delivery's answer holds its task's content (up to a million characters) twice, and its receipt a copy
    of the answer: a header keeping that whole for each cut line outgrew what a header may be (1 MiB), and the
    session could not be opened again. The header keeps the answers without the content (its hash instead),
    and the retry, which carries the content again, is answered whole."""
    big = {**KEYED, "content": "x" * 900_000}

    async def build(c: HostClient) -> Any:
        for sid in ("src", "tgt"):
            await c.call("session.create", {"sessionId": sid, "title": sid})
        first = await deliver_and_run(c, big)
        await c.call("session.truncateFrom", {"sessionId": "tgt", "messageId": f"collab-{first['delivery']['id']}"})
        return first

    async def retry(c: HostClient) -> Any:
        with pytest.raises(RpcError) as other:  # the key's delivery had other content
            await c.call("collab.deliver", {**DELIVER, "content": "y"})
        assert other.value.data_code == "IDEMPOTENCY_CONFLICT"
        return (await c.call("collab.deliver", big), (await c.call("session.get", {"sessionId": "tgt"}))["session"],
                (await c.call("session.queueList", {"sessionId": "tgt"}))["entries"])

    with trio.fail_after(60):
        first = await _on_host(tmp_path, build)
        header = transcript_path(tmp_path, "tgt").read_bytes().split(b"\n", 1)[0]
        _damage(tmp_path, how)
        again, session, queued = await _on_host(tmp_path, retry)
    assert len(header) < 16_384
    assert again == first and session["messageCount"] == 0 and queued == []


async def test_a_client_cannot_write_the_host_only_deliver_answer(tmp_path: Path) -> None:
    """``meta.collabDelivered`` is the host's (a rebuilt index restores the receipt it holds): a client's
    message carrying it is refused, as one carrying ``meta.receipt`` is."""
    forged = {"response": {"delivery": {"id": "col_x"}},
              "receipt": {"clientId": "ui-1", "submissionId": "k-other", "fingerprint": "0" * 64,
                          "method": "session.rename", "extra": {"response": {"title": "forged"}}}}

    async def work(c: HostClient) -> list[str | None]:
        await c.call("session.create", {"sessionId": "s1", "title": "t"})
        codes: list[str | None] = []
        message = msg("u1", "hi", meta={"collabDelivered": forged})
        for method, params in (("session.appendMessage", {"sessionId": "s1", "message": message}),
                               ("session.replaceMessages", {"sessionId": "s1", "messages": [message]})):
            with pytest.raises(RpcError) as refused:
                await c.call(method, params)
            codes.append(refused.value.data_code)
        return codes

    with trio.fail_after(60):
        assert await _on_host(tmp_path, work) == ["INVALID_PARAMS", "INVALID_PARAMS"]
