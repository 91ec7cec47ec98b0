"""A rewrite (``session.replaceMessages``) keeps host-written provenance exactly (``store.collab.check_rewrite``):
``meta.sessionMessage`` (collaboration input) and ``meta.fromAgent`` (an imported sub-agent thread's
prompt from its parent agent) are never added, stripped or edited; the line may be dropped whole."""

from __future__ import annotations

from typing import Any

import pytest

from protocol.models_records import HOST_META_KEYS
from store.collab import HOST_PROVENANCE, check_rewrite
from store.errors import PermissionDenied

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
