"""store/fork.py: id/tool-call remapping, checkpoints, tombstones, pasted inputs (pure + file steps)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from store.errors import Conflict, MessageNotFound
from store.faults import Faults, InjectedFault
from store.fork import (
    copy_pasted,
    derived_id,
    plan_fork,
    remove_child_files,
    resolve_pasted,
    write_child_transcript,
)
from store.indexing.reconcile import dedupe, scan_from
from store.jsonio import loads_line
from store.tombstones import deleted_ids, tombstone_lines_for

SRC, CHILD = "src", "child"
INFO = {"type": "session_info", "title": "t", "mode": "agent"}


def m(mid: str, role: str = "user", **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": role, "blocks": [{"type": "text", "text": mid}], **extra}


def transcript() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    msgs = [
        m("u1", meta={"receipt": {"clientId": "c", "submissionId": "s", "fingerprint": "f"},
                      "revisionCount": 2, "activeRevision": 2, "revisionRootId": "u1", "usage": {"x": 1}},
          turnId="T1"),
        {"type": "message", "id": "a1", "role": "assistant", "turnId": "T1", "blocks": [
            {"type": "thinking", "text": "hm"},
            {"type": "tool_call", "callId": "call-1", "name": "Task", "args": {"prompt": "go"}},
        ]},
        m("s1", "assistant", meta={"parentToolCallId": "call-1", "agentName": "reviewer"}),
        {"type": "message", "id": "t1", "role": "tool", "toolName": "Task",
         "blocks": [{"type": "tool_result", "toolCallId": "call-1", "text": "done"}]},
        m("u2"),
        m("a2", "assistant"),
    ]
    comps = [
        {"type": "compaction", "id": "c1", "summary": "s", "firstKeptMessageId": "s1", "throughMessageId": "t1",
         "tokensBefore": 5, "retainedTail": [m("u1")], "details": {"retainedTailMode": "active_turn"}},
        {"type": "compaction", "id": "c2", "summary": "s2", "throughMessageId": "a2", "tokensBefore": 9,
         "retainedTail": [], "details": {"retainedTailMode": "completed_turn"}},
        {"type": "compaction", "id": "c0", "summary": "dangling", "throughMessageId": "gone", "tokensBefore": 1},
    ]
    return msgs, comps


def test_ids_and_tool_call_ids_are_remapped_consistently() -> None:
    msgs, comps = transcript()
    plan = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, now_ms=0)
    new = plan.plan.messages
    old_ids = [x["id"] for x in msgs]
    assert [x["id"] for x in new] == [derived_id(CHILD, "message", i) for i in old_ids]
    assert plan.id_map == dict(zip(old_ids, [x["id"] for x in new], strict=True))
    assert not set(plan.id_map.values()) & set(old_ids)
    call = new[1]["blocks"][1]["callId"]
    assert call == derived_id(CHILD, "call", "call-1") != "call-1"
    assert new[2]["meta"]["parentToolCallId"] == call
    assert new[2]["meta"]["agentName"] == "reviewer"
    assert new[3]["blocks"][0]["toolCallId"] == call
    # deterministic: the same fork plans the same ids
    again = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, now_ms=0)
    assert again.plan.body == plan.plan.body
    # another child gets other ids
    other = plan_fork(SRC, "child2", msgs, comps, {}, INFO, now_ms=0)
    assert not set(other.id_map.values()) & set(plan.id_map.values())


def test_source_only_metadata_is_dropped_and_content_kept() -> None:
    msgs, comps = transcript()
    new = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, now_ms=0).plan.messages
    assert new[0]["meta"] == {"usage": {"x": 1}}  # receipt and pager stamp gone
    assert "turnId" not in new[0] and "turnId" not in new[1]
    assert new[1]["blocks"][0] == {"type": "thinking", "text": "hm"}
    assert new[1]["blocks"][1]["args"] == {"prompt": "go"}
    assert msgs[0]["meta"]["revisionCount"] == 2  # the source records are not mutated


def test_checkpoints_copied_only_when_their_boundary_is_included() -> None:
    msgs, comps = transcript()
    whole = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, now_ms=0)
    assert [c["id"] for c in whole.plan.compactions] == [derived_id(CHILD, "k-compaction", c) for c in ("c1", "c2")]
    c1 = whole.plan.compactions[0]
    assert c1["throughMessageId"] == whole.id_map["t1"]
    assert c1["firstKeptMessageId"] == whole.id_map["s1"]
    assert c1["retainedTail"][0]["id"] == whole.id_map["u1"]
    assert whole.dropped_compactions == ["c0"]
    prefix = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, through_message_id="u2", now_ms=0)
    assert [x["id"] for x in prefix.plan.messages] == [prefix.id_map[i] for i in ("u1", "a1", "s1", "t1", "u2")]
    assert [c["throughMessageId"] for c in prefix.plan.compactions] == [prefix.id_map["t1"]]
    cut = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, through_message_id="s1", now_ms=0)
    assert cut.plan.compactions == []
    # the first-kept anchor outside the prefix is dropped from a copied checkpoint
    odd = [{**comps[0], "firstKeptMessageId": "a2"}]
    odd_plan = plan_fork(SRC, CHILD, msgs, odd, {}, INFO, through_message_id="u2", now_ms=0)
    assert "firstKeptMessageId" not in odd_plan.plan.compactions[0]


def test_unknown_boundary_is_message_not_found() -> None:
    msgs, comps = transcript()
    with pytest.raises(MessageNotFound):
        plan_fork(SRC, CHILD, msgs, comps, {}, INFO, through_message_id="nope", now_ms=0)


def test_tombstones_follow_included_messages() -> None:
    msgs, comps = transcript()
    tombs = {"a1": {"deleted": True}, "u2": {"deleted": False}, "a2": {"deleted": True}}
    plan = plan_fork(SRC, CHILD, msgs, comps, tombs, INFO, through_message_id="u2", now_ms=0)
    assert plan.plan.deleted_ids == [plan.id_map["a1"]]
    lines = [loads_line(b) for b in plan.plan.body]
    tomb = [x for x in lines if x["type"] == "tombstone"]
    assert [(t["messageId"], t["deleted"]) for t in tomb] == [(plan.id_map["a1"], True)]
    assert lines[-1]["type"] == "session_info"


def test_tombstone_lines_for_rewrites() -> None:
    recs = [m("a"), m("b"), m("c")]
    out = tombstone_lines_for(recs, {"c", "a", "zz"}, created_at_ms=0)
    assert [mid for mid, _ in out] == ["a", "c"]
    assert loads_line(out[0][1])["messageId"] == "a" and loads_line(out[0][1])["deleted"] is True
    assert deleted_ids({"a": {"deleted": True}, "b": {"deleted": False}, "c": True}) == {"a", "c"}


def test_scratch_paths_rewritten_and_collected(tmp_path: Path) -> None:
    base = f"/data/scratch/{SRC}/pasted/"
    msgs = [
        {"type": "message", "id": "u1", "role": "user", "blocks": [
            {"type": "attachment", "kind": "file", "name": "n", "ref": base + "my file.txt"},
            {"type": "text", "text": f"see {base}a.png. and scratch/{SRC}/pasted/sub/b.txt"},
            {"type": "text", "text": f"not mine: /x/scratch/other/pasted/c.txt, /x/myscratch/{SRC}/pasted/d"},
        ]},
    ]
    plan = plan_fork(SRC, CHILD, msgs, [], {}, INFO, now_ms=0)
    blocks = plan.plan.messages[0]["blocks"]
    assert blocks[0]["ref"] == f"/data/scratch/{CHILD}/pasted/my file.txt"
    assert blocks[1]["text"] == f"see /data/scratch/{CHILD}/pasted/a.png. and scratch/{CHILD}/pasted/sub/b.txt"
    assert blocks[2]["text"] == msgs[0]["blocks"][2]["text"]
    src = tmp_path / "scratch" / SRC / "pasted"
    (src / "sub").mkdir(parents=True)
    for name in ("my file.txt", "a.png", "sub/b.txt", "unreferenced.txt"):
        (src / name).write_text(name)
    os.symlink("/etc/passwd", src / "link.txt")
    names = resolve_pasted(src, plan.pasted_refs | {"link.txt", "../../etc/passwd", "missing.txt"})
    assert names == ["a.png", "my file.txt", "sub/b.txt"]
    dst = tmp_path / "scratch" / CHILD / "pasted"
    copy_pasted(src, dst, names)
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file()) == names
    assert (dst / "sub" / "b.txt").read_text() == "sub/b.txt"
    assert (dst / "a.png").stat().st_mode & 0o777 == 0o600
    remove_child_files(tmp_path / "child.jsonl", tmp_path / "scratch" / CHILD)
    assert not (tmp_path / "scratch" / CHILD).exists()
    assert src.joinpath("a.png").exists()


def test_child_transcript_is_written_atomically_with_spans(tmp_path: Path) -> None:
    msgs, comps = transcript()
    plan = plan_fork(SRC, CHILD, msgs, comps, {"a1": {"deleted": True}}, INFO, now_ms=0)
    path = tmp_path / "child.jsonl"
    written = write_child_transcript(path, CHILD, 1000, plan.plan)
    data = path.read_bytes()
    assert written.file_len == len(data)
    for item in written.messages + written.compactions:
        assert loads_line(data[item.offset: item.offset + item.length])["id"] == item.record["id"]
    scan = scan_from(path, 0)
    assert [x.record["id"] for x in dedupe(scan.messages)] == [x["id"] for x in plan.plan.messages]
    assert scan.header["sessionId"] == CHILD and scan.header["epoch"] == written.epoch
    assert scan.tombstones == {plan.id_map["a1"]: True}
    with pytest.raises(Conflict):
        write_child_transcript(path, CHILD, 1000, plan.plan)


def test_failed_child_write_leaves_nothing_after_cleanup(tmp_path: Path) -> None:
    msgs, comps = transcript()
    plan = plan_fork(SRC, CHILD, msgs, comps, {}, INFO, now_ms=0)
    faults = Faults()
    faults.add("fork.after_tmp_write", action="raise")
    path = tmp_path / "child.jsonl"
    with pytest.raises(InjectedFault):
        write_child_transcript(path, CHILD, 1000, plan.plan, faults=faults)
    assert [p.name for p in tmp_path.iterdir()] != []  # the temp file an injected crash leaves
    remove_child_files(path, tmp_path / "scratch" / CHILD)
    assert list(tmp_path.iterdir()) == []
