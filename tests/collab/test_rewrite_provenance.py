"""A rewrite (``session.replaceMessages``) keeps host-written provenance exactly (``store.collab.check_rewrite``):
``meta.sessionMessage`` (collaboration input) and ``meta.fromAgent`` (an imported sub-agent thread's
prompt from its parent agent) are never added, stripped or edited; the line may be dropped whole."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from protocol.models_records import HOST_META_KEYS
from runtime.client import RpcError
from store.collab import HOST_PROVENANCE, check_rewrite
from store.errors import PermissionDenied
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host
from tests.importers.test_child_links import CODEX, CODEX_CHILD

PROVENANCE = {"sessionMessage": {"deliveryId": "col_1", "fromSessionId": "lead"},
              "fromAgent": {"sessionId": "parent", "toolCallId": "call_1"}}


def _rec(mid: str, text: str, meta: dict[str, Any] | None = None, role: str = "user") -> dict[str, Any]:
    out: dict[str, Any] = {"type": "message", "id": mid, "role": role, "blocks": [{"type": "text", "text": text}]}
    if meta is not None:
        out["meta"] = meta
    return out


def test_the_store_guards_every_key_the_wire_refuses() -> None:
    assert set(HOST_PROVENANCE) == HOST_META_KEYS


@pytest.mark.parametrize("key", sorted(PROVENANCE))
def test_host_provenance_is_kept_exactly_or_dropped_whole(key: str) -> None:
    held = _rec("p1", "review this", {key: PROVENANCE[key]})
    other = _rec("a1", "on it", role="assistant")
    old = {"p1": held, "a1": other}
    check_rewrite(old, [held, other])  # kept exactly
    check_rewrite(old, [other])  # dropped whole
    refused = {
        "stripped": [_rec("p1", "review this", {}), other],
        "edited": [_rec("p1", "something else", {key: PROVENANCE[key]}), other],
        "changed": [_rec("p1", "review this", {key: {**PROVENANCE[key], "sessionId": "forged"}}), other],
        "planted": [held, _rec("a1", "on it", {key: PROVENANCE[key]}, role="assistant")],
        "new line": [held, other, _rec("n1", "hello", {key: PROVENANCE[key]})],
    }
    for name, body in refused.items():
        with pytest.raises(PermissionDenied) as caught:
            check_rewrite(old, body)
        assert f"meta.{key}" in str(caught.value) or "provenance" in str(caught.value) or \
            "cannot be edited" in str(caught.value), name


async def test_a_recorded_codex_subagent_prompt_keeps_its_provenance_through_replace_messages(tmp_path: Path) -> None:
    """On the real host, with the sub-agent thread Codex 0.171.0 recorded: its first prompt, imported with
    ``meta.fromAgent``, cannot lose or change it through ``session.replaceMessages``; kept exactly it can."""
    root = tmp_path / "sessions"
    shutil.copytree(CODEX, root)
    async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
        await c.call("import.sessions", {"source": "codex", "root": str(root)})
        sid = session_id_for("codex", CODEX_CHILD)
        page = await c.call("session.get", {"sessionId": sid, "messageLimit": 100})
        held = [{k: v for k, v in m.items() if k in ("id", "role", "blocks", "meta", "createdAt", "turnId")}
                for m in page["messages"]]
        (prompt_at,) = [i for i, m in enumerate(held) if "fromAgent" in (m.get("meta") or {})]
        prompt = held[prompt_at]
        meta = prompt["meta"]
        for changed in ({**prompt, "meta": {k: v for k, v in meta.items() if k != "fromAgent"}},
                        {**prompt, "meta": {**meta, "fromAgent": {**meta["fromAgent"], "sessionId": "forged"}}},
                        {**prompt, "blocks": [{"type": "text", "text": "something else"}]}):
            body = [*held[:prompt_at], changed, *held[prompt_at + 1:]]
            with pytest.raises(RpcError) as caught:
                await c.call("session.replaceMessages", {"sessionId": sid, "messages": body})
            assert caught.value.data_code == "PERMISSION_DENIED"
        await c.call("session.replaceMessages", {"sessionId": sid, "messages": held})  # kept exactly: fine
        again = await c.call("session.get", {"sessionId": sid, "messageLimit": 100})
        assert [m["id"] for m in again["messages"]] == [m["id"] for m in held]
