"""A pi session's abandoned branches stay reachable through the revisions store (issue 23 item 2).

The file is the recorded tree session (pi 0.73.1, ``tests/fixtures/recorded``): two turns, a compaction,
a turn, a ``!bash``, then pi's own ``navigateTree`` to the first reply with a branch summary, a tool call
on that second branch, a return to the first branch's leaf, a turn there and a session name. A user who
moves between the branches later is written the way pi writes it: the next entry's ``parentId`` is the
leaf navigated to.

Reproduces: a fresh import brought only the current branch: the second branch's turns were nowhere and
``usage.session`` said 510 input tokens against pi's 750 over the whole file; while a branch switch hid
the first branch, that branch's compaction checkpoint was still served (``session.context`` started from
it, ``session.get`` listed it); an older copy must still hide nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "pi"
SECOND_BRANCH = "[tool-ok] a question on the second branch"
FIRST_BRANCH_END = "Reply to: back on the first branch"


def _tree_file() -> Path:
    for manifest in sorted(RECORDED.glob("*/manifest.json")):
        for entry in json.loads(manifest.read_text())["files"]:
            if entry["scenario"] == "tree":
                return manifest.parent / entry["file"]
    raise AssertionError("no recorded pi tree session")


TREE = _tree_file()
LINES = TREE.read_text().splitlines()
ENTRIES = [json.loads(line) for line in LINES]
SID = session_id_for("pi", ENTRIES[0]["id"])
SECOND_LEAF = next(e["id"] for e in ENTRIES if "The tool answered" in json.dumps(e))
FIRST_LEAF = ENTRIES[-1]["id"]


def _turn(eid: str, parent: str, text: str, second: int) -> list[str]:
    """A user question and its reply, as pi appends them after the leaf ``parent``."""
    ts = f"2026-12-02T03:00:{second:02d}.000Z"
    user = {"type": "message", "id": f"{eid}u", "parentId": parent, "timestamp": ts,
            "message": {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 0}}
    reply = {"type": "message", "id": f"{eid}a", "parentId": f"{eid}u", "timestamp": ts,
             "message": {"role": "assistant", "content": [{"type": "text", "text": f"Reply to: {text}"}],
                         "api": "openai-completions", "provider": "fake", "model": "fake-model",
                         "usage": {"input": 1000, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 1001},
                         "stopReason": "stop", "timestamp": 0}}
    user["message"]["timestamp"] = reply["message"]["timestamp"] = 1796180400000 + second * 1000
    return [json.dumps(user), json.dumps(reply)]


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _pi_input(lines: list[str]) -> int:
    """pi's own footer: the input tokens of every assistant entry of the file, on the branch or not."""
    out = 0
    for line in lines[1:]:
        e = json.loads(line)
        if e.get("type") == "message" and e["message"].get("role") == "assistant":
            out += e["message"]["usage"]["input"]
    return out


async def _import(c: Any, path: Path) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": "pi", "root": str(path)})
    (report,) = result["sessions"]
    assert report["status"] != "refused", report
    return dict(report)


async def _shown(c: Any) -> list[str]:
    window = await c.call("session.get", {"sessionId": SID, "full": True})
    return [b["text"] for m in window["messages"] if not m.get("deleted")
            for b in m["blocks"] if b.get("type") == "text"]


async def _archived(c: Any) -> list[str]:
    """The previews of every node of an archived branch (``session.tree``)."""
    tree = await c.call("session.tree", {"sessionId": SID})
    return [n["preview"] for n in tree["nodes"] if n["id"].startswith("rev:")]


async def _input_tokens(c: Any) -> int:
    return int((await c.call("usage.session", {"sessionId": SID}))["total"]["inputTokens"])


async def _served(c: Any) -> tuple[bool, int]:
    """Whether ``session.context`` starts from a checkpoint, and how many ``session.get`` lists."""
    context = await c.call("session.context", {"sessionId": SID})
    window = await c.call("session.get", {"sessionId": SID, "full": True})
    return context["compaction"] is not None, len(window["compactions"])


def _no_temp_files(data: Path) -> None:
    assert not [p.name for p in (data / "sessions").glob("*.tmp*")]


async def test_fresh_import_keeps_the_abandoned_branch_in_revisions_with_its_usage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with inprocess_host(data) as host, client_for(host) as c:
        report = await _import(c, TREE)
        assert report["status"] == "new" and report["archivedBranches"] == 1
        shown = await _shown(c)
        assert shown[-1] == FIRST_BRANCH_END and SECOND_BRANCH not in shown  # not in the main transcript
        (rev,) = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
        # attributed to where it left the current branch: the first branch's second question
        assert rev["rootUserId"] == f"{SID}:3122bc57" and not rev["isActive"]
        assert rev["messageCount"] == 4  # the branch summary, the question, the tool call, the reply
        archived = await _archived(c)
        assert SECOND_BRANCH in archived and "The tool answered: fidelity-ok" in archived
        assert await _input_tokens(c) == _pi_input(LINES) == 750  # pi's footer, over the whole file
        assert (await _import(c, TREE))["status"] == "unchanged"
        assert len((await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]) == 1
    _no_temp_files(data)


async def test_branch_switch_and_back_loses_nothing(tmp_path: Path) -> None:
    """pi's navigateTree to the second branch (a turn there), then back to the first (a turn there)."""
    data = tmp_path / "data"
    work = tmp_path / "pi" / TREE.name
    on_second = [*LINES, *_turn("b2", SECOND_LEAF, "a turn on the second branch again", 1)]
    back = [*on_second, *_turn("b1", FIRST_LEAF, "a turn back on the first branch", 2)]
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, _write(work, LINES))
        first_shown = await _shown(c)
        moved = await _import(c, _write(work, on_second))
        assert moved["status"] == "updated" and moved["archivedBranches"] == 1
        shown = await _shown(c)
        assert SECOND_BRANCH in shown and shown[-1] == "Reply to: a turn on the second branch again"
        assert FIRST_BRANCH_END not in shown
        archived = await _archived(c)
        assert FIRST_BRANCH_END in archived and "a question after the compaction" in archived
        assert await _input_tokens(c) == _pi_input(on_second)
        returned = await _import(c, _write(work, back))
        assert returned["status"] == "updated" and returned["archivedBranches"] == 1
        shown = await _shown(c)
        assert shown == [*first_shown, "a turn back on the first branch", "Reply to: a turn back on the first branch"]
        archived = await _archived(c)
        for text in (SECOND_BRANCH, "Reply to: a turn on the second branch again", FIRST_BRANCH_END):
            assert text in archived  # both directions are kept
        assert await _input_tokens(c) == _pi_input(back)
        assert (await _import(c, work))["status"] == "unchanged"
        work.touch()  # parsed again (mtime), nothing new
        again = await _import(c, work)
        assert again["status"] == "unchanged" and again["archivedBranches"] == 0
    _no_temp_files(data)


async def test_a_hidden_branchs_compaction_is_not_served(tmp_path: Path) -> None:
    data = tmp_path / "data"
    work = tmp_path / "pi" / TREE.name
    on_second = [*LINES, *_turn("b2", SECOND_LEAF, "a turn on the second branch again", 1)]
    back = [*on_second, *_turn("b1", FIRST_LEAF, "a turn back on the first branch", 2)]
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, _write(work, LINES))
        assert await _served(c) == (True, 1)
        await _import(c, _write(work, on_second))
        assert await _served(c) == (False, 0)  # the first branch, and its checkpoint, are hidden
        context = await c.call("session.context", {"sessionId": SID})
        texts = [b["text"] for m in context["messages"] for b in m["blocks"] if b.get("type") == "text"]
        assert texts[0] == "first question on the tree session" and SECOND_BRANCH in texts
    for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):  # the index rebuilt from the files agrees
        (data / name).unlink(missing_ok=True)
    async with inprocess_host(data) as host, client_for(host) as c:
        assert await _served(c) == (False, 0)
        await _import(c, _write(work, back))
        assert await _served(c) == (True, 1)  # back on the first branch: served again, once


async def test_an_older_copy_hides_nothing_and_keeps_the_branches(tmp_path: Path) -> None:
    data = tmp_path / "data"
    older = _write(tmp_path / "backup" / TREE.name,
                   LINES[: next(i for i, line in enumerate(LINES) if "The tool answered" in line) + 1])
    async with inprocess_host(data) as host, client_for(host) as c:
        await _import(c, TREE)
        shown = await _shown(c)
        revisions = (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"]
        copy = await _import(c, older)  # a backup taken while the second branch was current
        assert copy["olderCopy"] and copy["archivedBranches"] == 0
        assert await _shown(c) == shown  # its branch's turns are kept hidden: nothing the newest file shows is
        assert (await c.call("session.listRevisions", {"sessionId": SID}))["revisions"] == revisions
        assert await _input_tokens(c) == _pi_input(LINES)
        assert (await _import(c, TREE))["status"] == "unchanged"
        assert await _shown(c) == shown
    _no_temp_files(data)
