"""Native pi forks through any message a read shows, and a native fork killed before it finished, black-box
against real ``pi-host serve --native-pi-root DIR`` processes (protocol/README.md §9).

* A pi assistant entry that calls tools is shown as one message per call (``<entry>.<i>``, each with the
  result pi recorded for it) after the entry's own text message. ``session.fork`` through such a message
  answered ``MESSAGE_NOT_FOUND`` (the message id was looked up as a whole entry id). Now a fork through any
  message ``session.get`` shows holds exactly the shown messages up to and including it (same ids but for
  the session's own, same content, same order): the entry's earlier calls, with their results, stay; its
  later calls go. A keyed retry answers the same child, also after a kill before its receipt.
* A native fork stages its child in a dot-file beside the parent and hard-links it to its final name. A
  SIGKILL between the two left the staging file in pi's folder for good; boot now removes such a file (and
  only files provably a fork's staging file), and the retry of the fork makes exactly one session.

The recorded pi 0.73.1 sessions (``tests/fixtures/recorded/pi``) hold assistant entries with one tool call
each (the message ``<entry>.0``) and none with several, so the file with several (``two_calls``) is built by
the format those recordings show: an assistant entry with three ``toolCall`` blocks, then one ``toolResult``
entry per call, each parented to the entry before it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import data_dir, killed_during
from tests.acceptance.test_seed003_native_pi_audit import (
    RECORDED,
    _as_shown,
    damaged_trees,
    native_host,
    native_ids,
    tree,
)

PROJECT = "--tmp-record-pi-project--"
BASICS = "native-pi:01a234ad-dfe8-7038-b380-b3ff8f231306"  # recorded: bash and read calls, one per entry
TWO_CALLS = "native-pi:two-calls"
OUT_OF_ORDER = "native-pi:out-of-order"
STAGE_KILL = "nativeFork.after_stage:1"
LINK_KILL = "nativeFork.after_link:1"


def _entry(kind: str, eid: str, parent: str | None, ts: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "id": eid, "parentId": parent, "timestamp": ts, **fields}


def _result(eid: str, parent: str, call: str, tool: str, text: str, ms: int, *, error: bool = False) -> dict[str, Any]:
    return _entry("message", eid, parent, f"2026-12-02T03:00:0{ms % 10}.000Z", message={
        "role": "toolResult", "toolCallId": call, "toolName": tool, "content": [{"type": "text", "text": text}],
        "isError": error, "timestamp": 1796184000000 + ms})


def multi_call_lines(session_id: str, *, results_order: tuple[int, ...] = (0, 1, 2)) -> bytes:
    """A pi v3 session (pi 0.73.1's entry format, as recorded) whose assistant entry calls three tools at once:
    a text block and three ``toolCall`` blocks, then a ``toolResult`` entry per call (in ``results_order``),
    then the final answer."""
    usage = {"input": 120, "output": 30, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 150,
             "cost": {"input": 0.00012, "output": 0.00006, "cacheRead": 0, "cacheWrite": 0, "total": 0.00018}}
    calls = [("call_multi_1", "read", {"path": "a.txt"}), ("call_multi_2", "read", {"path": "b.txt"}),
             ("call_multi_3", "bash", {"command": "echo three"})]
    outputs = ["contents of a", "ENOENT: no such file or directory, access 'b.txt'", "three\n"]
    entries = [
        {"type": "session", "version": 3, "id": session_id, "timestamp": "2026-12-02T03:00:00.000Z",
         "cwd": "/tmp/record-pi/project"},
        _entry("model_change", "m1000001", None, "2026-12-02T03:00:00.100Z", provider="fake", modelId="fake-model"),
        _entry("message", "u1000001", "m1000001", "2026-12-02T03:00:00.200Z", message={
            "role": "user", "content": [{"type": "text", "text": "[tools] read a and b, and echo three"}],
            "timestamp": 1796184000200}),
        _entry("message", "a1000001", "u1000001", "2026-12-02T03:00:00.300Z", message={
            "role": "assistant", "content": [{"type": "text", "text": "Reading both and echoing."}, *[
                {"type": "toolCall", "id": cid, "name": name, "arguments": args} for cid, name, args in calls]],
            "api": "openai-completions", "provider": "fake", "model": "fake-model", "usage": usage,
            "stopReason": "toolUse", "timestamp": 1796184000300, "responseId": "chatcmpl-multi-1"}),
    ]
    parent = "a1000001"
    for n, i in enumerate(results_order):
        eid = f"r100000{n + 1}"
        entries.append(_result(eid, parent, calls[i][0], calls[i][1], outputs[i], 4 + n, error=i == 1))
        parent = eid
    entries.append(_entry("message", "a1000002", parent, "2026-12-02T03:00:08.000Z", message={
        "role": "assistant", "content": [{"type": "text", "text": "a, no b, three"}], "api": "openai-completions",
        "provider": "fake", "model": "fake-model", "usage": usage, "stopReason": "stop",
        "timestamp": 1796184008000, "responseId": "chatcmpl-multi-2"}))
    return b"".join(json.dumps(e, separators=(",", ":")).encode() + b"\n" for e in entries)


def make_root(tmp_path: Path) -> Path:
    """A pi root with the recorded sessions and the two built ones with several calls in one entry."""
    root = tmp_path / "pi"
    project = root / PROJECT
    project.mkdir(parents=True)
    for src in sorted(RECORDED.rglob("*.jsonl")):
        shutil.copyfile(src, project / src.name)
    (project / "2026-12-02T03-00-00-000Z_two-calls.jsonl").write_bytes(multi_call_lines("two-calls"))
    (project / "2026-12-02T03-01-00-000Z_out-of-order.jsonl").write_bytes(
        multi_call_lines("out-of-order", results_order=(1, 0, 2)))
    return root


async def shown(c: HostClient, sid: str) -> list[str]:
    return _as_shown(await c.call("session.get", {"sessionId": sid, "full": True}))


def staging_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.tmp"))


async def test_a_fork_through_any_shown_message_holds_what_the_read_showed_up_to_it(tmp_path: Path) -> None:
    """Every message of the recorded basics session and of the built multi-call sessions (results in call
    order, and out of it): the fork through it reads as the parent's read up to and including it, its keyed
    retry answers the same child, and each fork wrote exactly one file (the parent untouched)."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    before = tree(pi_root)
    with trio.fail_after(180):
        async with native_host(data, pi_root) as (proc, c):
            assert {BASICS, TWO_CALLS, OUT_OF_ORDER} <= set(await native_ids(c))
            forks = 0
            for sid in (BASICS, TWO_CALLS, OUT_OF_ORDER):
                page = await c.call("session.get", {"sessionId": sid, "full": True})
                parent = _as_shown(page)
                ids = [m["id"] for m in page["messages"]]
                if sid != BASICS:
                    local = [i.removeprefix(f"{sid}:") for i in ids]
                    assert local == ["u1000001", "a1000001", "a1000001.0", "a1000001.1", "a1000001.2",
                                     "a1000002"]
                    assert [m["blocks"][0].get("result") for m in page["messages"][2:5]] == [
                        "contents of a", "ENOENT: no such file or directory, access 'b.txt'", "three\n"]
                else:
                    assert any(i.endswith(".0") for i in ids)  # the recorded one-call entries
                for k, mid in enumerate(ids):
                    params = {"sessionId": sid, "throughMessageId": mid, "submissionId": f"{sid}-{k}"}
                    child = await c.call("session.fork", params)
                    forks += 1
                    assert await shown(c, child["id"]) == parent[: k + 1], (sid, mid)
                    assert await c.call("session.fork", params) == child  # the keyed retry: the same child
            proc.kill9()
    after = tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert len(after) == len(before) + forks and staging_files(pi_root) == []


async def test_a_keyed_fork_through_a_tool_message_killed_before_its_receipt_is_found_by_its_retry(
        tmp_path: Path) -> None:
    """The child of a fork through ``<entry>.1`` (its middle call) is published, then the host dies before
    the receipt commits: the retry on a restarted host rebuilds that child, finds it the same and answers it;
    no second file."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    before = tree(pi_root)
    params = {"sessionId": TWO_CALLS, "throughMessageId": f"{TWO_CALLS}:a1000001.1", "submissionId": "mid-call"}
    with trio.fail_after(120):
        await killed_during(data, "session.fork.before_commit:1", [("session.fork", params)],
                            serve_args=("--native-pi-root", str(pi_root)))
        published = tree(pi_root)
        assert len(published) == len(before) + 1
        async with native_host(data, pi_root) as (proc, c):
            child = await c.call("session.fork", params)
            assert (await shown(c, child["id"])) == (await shown(c, TWO_CALLS))[:4]
            assert await c.call("session.fork", params) == child
            proc.kill9()
    assert tree(pi_root) == published
    [new] = [k for k in published if k not in before]
    assert new.endswith(f"_{child['id'].removeprefix('native-pi:')}.jsonl")


async def test_a_fork_through_a_notice_of_damage_holds_what_the_read_showed_before_it(tmp_path: Path) -> None:
    """The notices a read adds for a damaged file are messages it shows too: through a torn-entry notice
    (shown before the entry recovered from behind the torn bytes) the child holds every message before it
    (the child's lines are whole, so it has no such notice); through a corrupt-leaf notice (shown after the
    fallback branch) it holds the whole branch shown. Both answered MESSAGE_NOT_FOUND, and so did a fork
    through the message of the entry recovered from behind the torn bytes (its line was not read as the read
    reads it)."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    folder = pi_root / PROJECT
    lines = multi_call_lines("torn-calls").splitlines(keepends=True)
    torn = b'{"type":"message","id":"zz000001","parentId":"r1000003","message":{"role":"u'
    (folder / "2026-12-02T03-02-00-000Z_torn-calls.jsonl").write_bytes(b"".join([*lines[:-1], torn, lines[-1]]))
    (folder / "2026-12-02T03-03-00-000Z_self-leaf.jsonl").write_bytes(
        damaged_trees(sorted(RECORDED.rglob("*.jsonl"))[1])["self-leaf"])
    with trio.fail_after(120):
        async with native_host(data, pi_root) as (proc, c):
            page = await c.call("session.get", {"sessionId": "native-pi:torn-calls", "full": True})
            at = next(i for i, m in enumerate(page["messages"])
                      if (m.get("meta") or {}).get("importedKind") == "pi/torn_entry")
            assert at == 5  # after the three calls, before the answer recovered from behind the torn bytes
            child = await c.call("session.fork", {"sessionId": "native-pi:torn-calls",
                                                  "throughMessageId": page["messages"][at]["id"]})
            assert await shown(c, child["id"]) == _as_shown(page)[:at]
            # the answer recovered from behind the torn bytes: every message but the notice
            child = await c.call("session.fork", {"sessionId": "native-pi:torn-calls",
                                                  "throughMessageId": page["messages"][at + 1]["id"]})
            assert await shown(c, child["id"]) == _as_shown(page)[:at] + _as_shown(page)[at + 1:]
            page = await c.call("session.get", {"sessionId": "native-pi:dmg-self-leaf", "full": True})
            notice = page["messages"][-1]
            assert "fallback" in notice["meta"]["corruptLeaf"]
            child = await c.call("session.fork", {"sessionId": "native-pi:dmg-self-leaf",
                                                  "throughMessageId": notice["id"]})
            assert await shown(c, child["id"]) == _as_shown(page)
            proc.kill9()


def plant_staging(folder: Path, name: str, body: bytes, mode: int = 0o600) -> Path:
    path = folder / name
    path.write_bytes(body)
    os.chmod(path, mode)
    return path


async def test_a_fork_killed_after_staging_leaves_nothing_after_a_restart_and_its_retry_forks_once(
        tmp_path: Path) -> None:
    """SIGKILL at ``nativeFork.after_stage`` (the staging file written and fsynced, not linked): the restart's
    boot removes it (``boot.nativeForkStagingRemoved``), and a partial one planted as a kill during its write
    would leave it; look-alikes that are not provably a fork's staging file stay. The retry forks once."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    folder = pi_root / PROJECT
    before = tree(pi_root)
    params = {"sessionId": TWO_CALLS, "throughMessageId": f"{TWO_CALLS}:a1000001.0", "submissionId": "staged"}
    with trio.fail_after(120):
        await killed_during(data, STAGE_KILL, [("session.fork", params)],
                            serve_args=("--native-pi-root", str(pi_root)))
        [left] = staging_files(pi_root)
        staged = (pi_root / left).read_bytes()
        assert len(tree(pi_root)) == len(before) + 1  # the staging file only: nothing published
        # as a kill in the middle of another fork's staging write would leave it: a prefix of its child
        cid = "0f0f0f0f-1111-4222-8333-444444444444"
        header = (b'{"type":"session","version":3,"id":"' + cid.encode()
                  + b'","timestamp":"2026-12-02T04:05:06.789Z","cwd":"/tmp"}\n')
        partial = plant_staging(folder, f".2026-12-02T04-05-06-789Z_{cid}.jsonl.fork-0123456789ab.tmp", header[:30])
        # look-alikes: another header under a staging name, a staging name with another mode, another name
        foreign = [plant_staging(folder, f".2026-12-02T04-05-06-789Z_{cid}.jsonl.fork-aaaaaaaaaaaa.tmp",
                                 b'{"type":"session","version":3,"id":"someone-else"}\n'),
                   plant_staging(folder, f".2026-12-02T04-05-06-789Z_{cid}.jsonl.fork-bbbbbbbbbbbb.tmp", header,
                                 mode=0o644),
                   plant_staging(folder, "notes.fork-cccccccccccc.tmp", header)]
        keep = {str(p.relative_to(pi_root)): p.read_bytes() for p in foreign}
        async with native_host(data, pi_root) as (proc, c):
            status = await c.call("host.status", {})
            assert status["boot"]["nativeForkStagingRemoved"] == 2
            assert staging_files(pi_root) == sorted(k for k in keep if k.split("/")[-1].startswith("."))
            assert not (pi_root / left).exists() and not partial.exists()
            child = await c.call("session.fork", params)
            assert (await shown(c, child["id"])) == (await shown(c, TWO_CALLS))[:3]
            assert await c.call("session.fork", params) == child
            proc.kill9()
    after = tree(pi_root)
    assert {k: v[0] for k, v in after.items() if k in keep} == keep  # never removed, never changed
    new = sorted(k for k in after if k not in before and k not in keep)
    assert len(new) == 1 and new[0].endswith(f"_{child['id'].removeprefix('native-pi:')}.jsonl")
    assert after[new[0]][0].split(b"\n")[1:] == staged.split(b"\n")[1:]  # what the killed attempt staged


async def test_a_fork_killed_after_its_link_keeps_its_child_and_loses_the_staging_name(tmp_path: Path) -> None:
    """SIGKILL at ``nativeFork.after_link`` (the child published under its final name, the staging name not
    yet removed): the restart removes the staging name only; the retry answers the published child and writes
    no second one."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    before = tree(pi_root)
    params = {"sessionId": BASICS, "title": "linked", "submissionId": "linked"}
    with trio.fail_after(120):
        await killed_during(data, LINK_KILL, [("session.fork", params)], serve_args=("--native-pi-root", str(pi_root)))
        assert len(staging_files(pi_root)) == 1
        published = [k for k in tree(pi_root) if k not in before and k.endswith(".jsonl")]
        assert len(published) == 1
        async with native_host(data, pi_root) as (proc, c):
            assert (await c.call("host.status", {}))["boot"]["nativeForkStagingRemoved"] == 1
            assert staging_files(pi_root) == []
            child = await c.call("session.fork", params)
            assert published[0].endswith(f"_{child['id'].removeprefix('native-pi:')}.jsonl")
            assert await shown(c, child["id"]) == await shown(c, BASICS)
            proc.kill9()
    after = tree(pi_root)
    assert sorted(k for k in after if k not in before) == published
