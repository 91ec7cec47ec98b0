"""store/context.py: buildSessionContext and the conversation tree (pure)."""

from __future__ import annotations

from typing import Any

from store.context import StoredBranch, build_session_context, build_tree, context_blocks, preview


def m(mid: str, role: str = "user", text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": role,
            "blocks": [{"type": "text", "text": text if text is not None else f"text {mid}"}], **extra}


def cp(cid: str, through: str, first_kept: str | None = None, tail: list[Any] | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"type": "compaction", "id": cid, "summary": f"sum {cid}", "throughMessageId": through,
                           "tokensBefore": 1, "retainedTail": tail or [],
                           "details": {"retainedTailMode": "active_turn" if tail else "completed_turn"}}
    if first_kept is not None:
        rec["firstKeptMessageId"] = first_kept
    return rec


def ctx_ids(out: dict[str, Any]) -> list[str]:
    return [x["id"] for x in out["messages"]]


def test_context_skips_tombstones_system_and_subagent_rows() -> None:
    recs = [
        m("u1"), m("a1", "assistant"), m("n1", "system"),
        m("s1", "assistant", meta={"parentToolCallId": "c1"}),
        m("s2", "tool", meta={"agentName": "reviewer"}),
        m("u2"), m("a2", "assistant"),
    ]
    out = build_session_context(recs, [], {"u2"})
    assert ctx_ids(out) == ["u1", "a1", "a2"]
    assert out["compaction"] is None


def test_context_blocks_are_provider_neutral() -> None:
    rec = m("a1", "assistant")
    rec["blocks"] = [
        {"type": "thinking", "text": "private"},
        {"type": "text", "text": "answer"},
        {"type": "tool_call", "callId": "c1", "name": "Read", "args": {"p": 1}, "result": "ok"},
        {"type": "attachment", "kind": "file", "name": "f", "ref": "attachments/x"},
        {"type": "hostedSearch", "status": "completed", "rounds": []},
        {"type": "future-block", "x": 1},
    ]
    assert [b["type"] for b in context_blocks(rec)] == ["text", "tool_call", "attachment"]
    # replay asked for by the message: thinking comes back as reasoning
    asks = {**rec, "meta": {"replayReasoning": True}}
    assert [b["type"] for b in context_blocks(asks)] == ["reasoning", "text", "tool_call", "attachment"]
    assert context_blocks(asks)[0]["text"] == "private"
    # or by the block's own provider replay state
    signed = {**rec, "blocks": [{"type": "thinking", "text": "t", "signature": "sig"}]}
    assert context_blocks(signed) == [{"type": "reasoning", "text": "t", "signature": "sig"}]


def test_message_with_no_context_blocks_is_dropped() -> None:
    only_thinking = m("a1", "assistant")
    only_thinking["blocks"] = [{"type": "thinking", "text": "x"}]
    assert ctx_ids(build_session_context([m("u1"), only_thinking], [], ())) == ["u1"]


def test_newest_valid_checkpoint_starts_the_context() -> None:
    recs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant"), m("u3"), m("a3", "assistant")]
    comps = [cp("c1", "a1"), cp("c2", "a2"), cp("c3", "gone")]
    out = build_session_context(recs, comps, ())
    assert out["compaction"]["id"] == "c2"  # c3's anchor is gone: dropped per record
    assert ctx_ids(out) == ["c2", "u3", "a3"]
    summary = out["messages"][0]
    assert summary["role"] == "user" and summary["compactionSummary"] is True
    assert summary["blocks"] == [{"type": "text", "text": "sum c2"}]


def test_first_kept_message_is_inclusive() -> None:
    recs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant"), m("u3")]
    out = build_session_context(recs, [cp("c1", "a2", first_kept="u2")], ())
    assert ctx_ids(out) == ["c1", "u2", "a2", "u3"]
    # a firstKept that no longer exists falls back to "after the boundary"
    out = build_session_context(recs, [cp("c1", "a2", first_kept="zz")], ())
    assert ctx_ids(out) == ["c1", "u3"]


def test_retained_tail_follows_summary_unless_kept_in_full_or_tombstoned() -> None:
    recs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant"), m("a3", "assistant")]
    tail_u2 = m("u2", text="truncated u2")
    out = build_session_context(recs, [cp("c1", "a2", tail=[tail_u2])], ())
    assert ctx_ids(out) == ["c1", "u2", "a3"]
    assert out["messages"][1]["blocks"][0]["text"] == "truncated u2"  # the bounded tail copy is the model view
    # the tail message is in the kept range: the full line wins, no duplicate
    out = build_session_context(recs, [cp("c1", "a2", first_kept="u2", tail=[tail_u2])], ())
    assert ctx_ids(out) == ["c1", "u2", "a2", "a3"]
    assert out["messages"][1]["blocks"][0]["text"] == "text u2"
    # a tombstoned message is hidden in its tail copy too
    out = build_session_context(recs, [cp("c1", "a2", tail=[tail_u2])], {"u2"})
    assert ctx_ids(out) == ["c1", "a3"]
    # a tail message stored without an id (accepted before it was refused) is left out, never an id-less
    # context message (session.context answered INTERNAL for good)
    no_id = {"role": "user", "blocks": [{"type": "text", "text": "q"}]}
    out = build_session_context(recs, [cp("c1", "a2", tail=[no_id, tail_u2])], ())
    assert ctx_ids(out) == ["c1", "u2", "a3"]


def test_a_tombstoned_call_takes_its_results_out_of_the_context() -> None:
    def call(mid: str, role: str, *cids: str) -> dict[str, Any]:
        blocks = [{"type": "tool_call", "callId": c, "name": "Read", **({"result": "r"} if role == "tool" else {})}
                  for c in cids]
        return {"type": "message", "id": mid, "role": role, "blocks": blocks}

    recs = [m("u1"), call("a1", "assistant", "c1"), call("t1", "tool", "c1"), call("a2", "assistant", "c2"),
            call("t2", "tool", "c2")]
    assert ctx_ids(build_session_context(recs, [], {"a1"})) == ["u1", "a2", "t2"]
    assert ctx_ids(build_session_context(recs, [], {"t2"})) == ["u1", "a1", "t1", "a2"]  # the call stays
    # a call another kept message still makes keeps its result; a self-contained tool row is its own call
    assert ctx_ids(build_session_context([*recs, call("a3", "assistant", "c1")], [], {"a1"})) == [
        "u1", "t1", "a2", "t2", "a3"]
    # the call tombstoned in a checkpoint's retained tail
    tail = call("a1", "assistant", "c1")
    out = build_session_context(recs, [cp("k1", "a1", tail=[tail])], {"a1"})
    assert ctx_ids(out) == ["k1", "a2", "t2"]


def test_a_first_kept_message_after_the_boundary_never_skips_messages() -> None:
    recs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant")]
    out = build_session_context(recs, [cp("c1", "a1", first_kept="a2")], ())
    assert ctx_ids(out) == ["c1", "u2", "a2"]


def test_context_message_fields() -> None:
    rec = m("t1", "tool", toolName="Read", turnId="T1", createdAt="2024-01-01T00:00:00.000Z",
            meta={"receipt": {"clientId": "c"}, "usage": {}})
    out = build_session_context([rec], [], ())["messages"][0]
    assert out == {"id": "t1", "role": "tool", "blocks": rec["blocks"], "toolName": "Read", "turnId": "T1",
                   "createdAt": "2024-01-01T00:00:00.000Z"}


# --------------------------------------------------------------------------- tree


def by_id(tree: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["id"]: n for n in tree["nodes"]}


def assert_parents_first(tree: dict[str, Any]) -> None:
    seen: set[str] = set()
    for n in tree["nodes"]:
        assert n["parentId"] is None or n["parentId"] in seen, n
        seen.add(n["id"])


def test_linear_tree_and_tombstone_reconnection() -> None:
    recs = [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant")]
    tree = build_tree(recs, {"a1"})
    nodes = by_id(tree)
    assert [n["id"] for n in tree["nodes"]] == ["u1", "a1", "u2", "a2"]
    assert nodes["u1"]["parentId"] is None
    assert nodes["a1"]["parentId"] == "u1" and nodes["a1"]["deleted"] and not nodes["a1"]["active"]
    assert nodes["u2"]["parentId"] == "u1"  # reconnected to the visible ancestor
    assert nodes["a2"]["parentId"] == "u2" and nodes["a2"]["active"]
    assert tree["activeLeafId"] == "a2"
    assert_parents_first(tree)


def test_regenerated_replies_hang_under_the_user_message_ordered_by_revision() -> None:
    """Seed 000 §3.2: "Regeneration appends a new assistant branch under the user message." A branch
    whose stored root is the live user message (same id, role, blocks) goes on under that message."""
    stamp = {"revisionCount": 3, "activeRevision": 3, "revisionRootId": "u2"}
    recs = [m("u1"), m("a1", "assistant"), m("u2", meta=stamp), m("a2c", "assistant")]
    branches = [
        StoredBranch("u2", 2, [m("u2"), m("a2b", "assistant")]),
        StoredBranch("u2", 1, [m("u2"), m("a2a", "assistant"), m("u3"), m("a3", "assistant")]),
        StoredBranch("u2", 3, [], live=True),  # the live reference: not a separate branch
    ]
    tree = build_tree(recs, (), branches)
    assert_parents_first(tree)
    nodes = by_id(tree)
    assert [n["id"] for n in tree["nodes"] if n["parentId"] == "a1"] == ["u2"]  # one user message
    kids = [n["id"] for n in tree["nodes"] if n["parentId"] == "u2"]
    assert kids == ["rev:u2:1:a2a", "rev:u2:2:a2b", "a2c"]  # siblings by revision index, the live one 3
    assert nodes["u2"]["revisionIndex"] == 3 and nodes["u2"]["active"]
    assert nodes["a2c"]["revisionIndex"] == 3 and nodes["a2c"]["active"]
    assert nodes["rev:u2:1:u3"]["parentId"] == "rev:u2:1:a2a"
    assert nodes["rev:u2:1:a3"]["revisionIndex"] == 1 and not nodes["rev:u2:1:a3"]["active"]
    assert nodes["rev:u2:2:a2b"]["messageId"] == "a2b"
    assert tree["activeLeafId"] == "a2c"
    assert all(n["active"] == (not n["id"].startswith("rev:")) for n in tree["nodes"])
    assert sum(1 for n in tree["nodes"] if n["parentId"] is None) == 1  # one root (seed 000 §3.4)


def test_an_edited_user_message_is_a_sibling_under_the_original_parent() -> None:
    """Seed 000 §3.2: "Editing a user message appends a sibling under the original parent." A branch whose
    stored root differs from the live one (the text was edited) keeps its own user message."""
    stamp = {"revisionCount": 2, "activeRevision": 2, "revisionRootId": "u2"}
    recs = [m("u1"), m("a1", "assistant"), m("u2", text="edited", meta=stamp), m("a2b", "assistant")]
    branches = [StoredBranch("u2", 1, [m("u2", text="first"), m("a2a", "assistant")])]
    tree = build_tree(recs, (), branches)
    assert_parents_first(tree)
    nodes = by_id(tree)
    assert [n["id"] for n in tree["nodes"] if n["parentId"] == "a1"] == ["rev:u2:1:u2", "u2"]
    assert nodes["rev:u2:1:a2a"]["parentId"] == "rev:u2:1:u2"
    assert nodes["rev:u2:1:u2"]["preview"] == "first" and nodes["u2"]["preview"] == "edited"


def test_stored_copy_of_the_live_variant_is_not_duplicated() -> None:
    stamp = {"revisionCount": 2, "activeRevision": 1, "revisionRootId": "u1"}
    recs = [m("u1", meta=stamp), m("a1", "assistant")]
    branches = [StoredBranch("u1", 1, [m("u1"), m("a1", "assistant")]),
                StoredBranch("u1", 2, [m("u1"), m("a1b", "assistant")])]
    tree = build_tree(recs, (), branches)
    assert [n["id"] for n in tree["nodes"]] == ["u1", "a1", "rev:u1:2:a1b"]
    assert by_id(tree)["rev:u1:2:a1b"]["parentId"] == "u1" and by_id(tree)["a1"]["revisionIndex"] == 1


def test_nested_branch_hangs_inside_its_archived_parent_branch() -> None:
    recs = [m("u1"), m("a1x", "assistant")]
    branches = [
        StoredBranch("u1", 1, [m("u1"), m("a1", "assistant"), m("u2"), m("a2", "assistant")]),
        StoredBranch("u2", 1, [m("u2"), m("a2old", "assistant")]),
        StoredBranch("orphan", 1, [m("orphan"), m("ao", "assistant")]),
    ]
    tree = build_tree(recs, (), branches)
    assert_parents_first(tree)
    nodes = by_id(tree)
    assert nodes["rev:u1:1:a1"]["parentId"] == "u1"  # regenerated under the live u1
    assert nodes["rev:u2:1:a2old"]["parentId"] == "rev:u1:1:u2"  # under the archived u2 it regenerated
    assert "rev:u2:1:u2" not in nodes
    assert nodes["rev:orphan:1:orphan"]["parentId"] is None


def test_preview_is_text_or_tool_name() -> None:
    assert preview(m("x", text="a\n\n b" + "c" * 500))[:4] == "a bc"
    assert len(preview(m("x", text="c" * 500))) == 120
    tool = {"id": "t", "role": "assistant", "blocks": [{"type": "thinking", "text": "secret"},
                                                       {"type": "tool_call", "callId": "1", "name": "Bash"}]}
    assert preview(tool) == "Bash"
