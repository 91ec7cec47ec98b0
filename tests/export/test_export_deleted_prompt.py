"""A deleted prompt that keys archived reply branches (protocol/README.md §9, seed 000 §3.2/§3.3), black-box on a
real host: a JSONL export carries it as a content-free tombstone record — its id, role, place, pager stamp and
``deleted: true`` — in the transcript and as the root of each branch, so the imported copy pages and switches as
the first host does and shows the prompt deleted; its text never leaves the host (not in the JSONL bytes, nor in
Markdown or HTML, of the original or of the copy); the copy's own export is the original's, ids namespaced; a
re-import of the same export changes nothing; a deleted message no branch is keyed by stays out entirely."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import client, ctx_ids, say, shared_host
from tests.hostkit import HostProcess

SECRET = "ultraviolet-prompt-words"
OLD = "the-first-wording-of-it"
SIDE = "an-unrelated-deleted-aside"
PAGER = {"revisionCount", "activeRevision", "revisionRootId"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    yield from shared_host(tmp_path_factory, "export-deleted-prompt")


async def export(c: HostClient, sid: str, out: Path, fmt: str = "jsonl") -> bytes:
    await c.call("session.export", {"sessionId": sid, "format": fmt, "outPath": str(out)})
    return await trio.Path(out).read_bytes()


def lines(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


async def window(c: HostClient, sid: str, *, but: tuple[str, ...] = ()) -> list[tuple[str, bool]]:
    """(id, deleted) of the session's messages, ``but`` left out."""
    page = await c.call("session.get", {"sessionId": sid})
    return [(m["id"], bool(m.get("deleted"))) for m in page["messages"] if m["id"] not in but]


async def regenerated(c: HostClient, prefix: str, *, switched: bool) -> str:
    """intro / hello / the prompt (deleted) / reply one (archived) / reply two, an aside and the first prompt
    (no branch is keyed by it) deleted too;
    ``switched``: the pager was used after the delete (every branch line then names the prompt deleted)."""
    sid = str((await c.call("session.create", {}))["id"])
    await say(c, sid, f"{prefix}-u0", "intro")
    await say(c, sid, f"{prefix}-a0", f"hello {SIDE}", "assistant")
    await say(c, sid, f"{prefix}-u1", f"the prompt {SECRET}")
    await say(c, sid, f"{prefix}-a1", "reply one", "assistant")
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": f"{prefix}-a1", "mode": "regenerate"})
    await say(c, sid, f"{prefix}-a2", "reply two", "assistant")
    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": f"{prefix}-u1"})
    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": f"{prefix}-a0"})
    await c.call("session.deleteMessage", {"sessionId": sid, "messageId": f"{prefix}-u0"})
    if switched:
        for index in (1, 2):
            await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": f"{prefix}-u1",
                                                      "revisionIndex": index})
    return sid


@pytest.mark.parametrize("switched", [False, True])
async def test_a_deleted_prompt_crosses_content_free_and_the_copy_switches_as_the_original(
        shared: HostProcess, tmp_path: Path, switched: bool) -> None:
    prefix = f"p{int(switched)}"
    aside = (f"{prefix}-u0", f"{prefix}-a0")  # deleted too, but no branch is keyed by them: the copy never holds them
    with trio.fail_after(60):
        async with client(shared, f"ui-dp-{prefix}") as c:
            sid = await regenerated(c, prefix, switched=switched)
            data = await export(c, sid, tmp_path / "export.jsonl")
            assert SECRET.encode() not in data and SIDE.encode() not in data
            records = lines(data)
            prompt = [r for r in records if r.get("id") == f"{prefix}-u1"]
            assert prompt == [{"type": "message", "id": f"{prefix}-u1", "role": "user",
                               "createdAt": prompt[0]["createdAt"], "meta": prompt[0]["meta"], "deleted": True}]
            assert set(prompt[0]["meta"]) == PAGER
            for gone in aside:  # deleted, and no branch is keyed by them: left out entirely
                assert f'"{gone}"'.encode() not in data and b"intro" not in data
            branches = [r for r in records if r["type"] == "revision"]
            assert branches
            for branch in branches:  # each branch's root is the same content-free record (a pager stamp at most)
                root_record = dict(branch["messages"][0])
                assert set(root_record.pop("meta", {})) <= PAGER
                assert root_record == {"type": "message", "id": f"{prefix}-u1", "role": "user",
                                       "createdAt": prompt[0]["createdAt"], "deleted": True}
            for fmt in ("md", "html"):  # the other exporters still leave it out
                rendered = await export(c, sid, tmp_path / f"export.{fmt}", fmt)
                assert SECRET.encode() not in rendered and b"reply two" in rendered, fmt

            imported = await c.call("import.sessions", {"source": "pi-host", "root": str(tmp_path / "export.jsonl")})
            copy = imported["sessions"][0]["sessionId"]
            root = f"{copy}:{prefix}-u1"
            # the copy's own export is the original's, ids namespaced, and holds no more of the prompt
            of_copy = await export(c, copy, tmp_path / "copy.jsonl")
            assert SECRET.encode() not in of_copy
            body = [r for r in records if r["type"] in ("message", "revision")]
            assert [r for r in lines(of_copy) if r["type"] in ("message", "revision")] \
                == orjson.loads(orjson.dumps(body).replace(f'"{prefix}-'.encode(), f'"{copy}:{prefix}-'.encode()))
            for fmt in ("md", "html"):
                rendered = await export(c, copy, tmp_path / f"copy.{fmt}", fmt)
                assert SECRET.encode() not in rendered, fmt
            assert [r["revisionIndex"] for r in (await c.call("session.listRevisions",
                                                              {"sessionId": copy}))["revisions"]] \
                == [r["revisionIndex"] for r in (await c.call("session.listRevisions",
                                                              {"sessionId": sid}))["revisions"]]
            assert await window(c, copy) == [
                (f"{copy}:{mid}", gone) for mid, gone in await window(c, sid, but=aside)]
            assert await ctx_ids(c, copy) == [f"{copy}:{mid}" for mid in await ctx_ids(c, sid)]
            for index in (1, 2, 1):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": f"{prefix}-u1",
                                                          "revisionIndex": index})
                await c.call("session.activateRevision", {"sessionId": copy, "rootUserId": root,
                                                          "revisionIndex": index})
                assert (root, True) in await window(c, copy)  # the prompt shows, deleted
                assert await window(c, copy) == [
                (f"{copy}:{mid}", gone) for mid, gone in await window(c, sid, but=aside)]
                assert await ctx_ids(c, copy) == [f"{copy}:{mid}" for mid in await ctx_ids(c, sid)]
            assert (await c.call("search.query", {"query": SECRET}))["results"] == []

            for n, at in enumerate((sid, copy)):  # both still export it content-free, nothing more
                assert SECRET.encode() not in await export(c, at, tmp_path / f"after-{n}.jsonl")

            # a re-import of the same export changes nothing (the prompt's tombstone is not written twice)
            redo = await c.call("import.sessions", {"source": "pi-host", "root": str(tmp_path / "export.jsonl")})
            assert redo["sessions"][0]["status"] == "unchanged"


async def test_an_edited_prompt_deleted_keeps_its_earlier_wording_in_the_branch(
        shared: HostProcess, tmp_path: Path) -> None:
    """An edit that reuses the prompt's id is another node (seed 000 §3.3: a tombstone is one node's): deleting
    the new wording leaves the first one, archived in its branch, as it is — exported with its text, and the
    copy switches to it and shows it, as the first host does."""
    with trio.fail_after(60):
        async with client(shared, "ui-dp-edit") as c:
            sid = str((await c.call("session.create", {}))["id"])
            await say(c, sid, "e-u0", "intro")
            await say(c, sid, "e-a0", "hello", "assistant")
            await say(c, sid, "e-u1", OLD)
            await say(c, sid, "e-a1", "reply one", "assistant")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "e-u1", "mode": "edit"})
            await say(c, sid, "e-u1", f"the new wording {SECRET}")
            await say(c, sid, "e-a2", "reply two", "assistant")
            await c.call("session.deleteMessage", {"sessionId": sid, "messageId": "e-u1"})
            data = await export(c, sid, tmp_path / "export.jsonl")
            assert SECRET.encode() not in data and OLD.encode() in data
            imported = await c.call("import.sessions", {"source": "pi-host", "root": str(tmp_path / "export.jsonl")})
            copy = imported["sessions"][0]["sessionId"]
            for index in (1, 2, 1):
                await c.call("session.activateRevision", {"sessionId": sid, "rootUserId": "e-u1",
                                                          "revisionIndex": index})
                await c.call("session.activateRevision", {"sessionId": copy, "rootUserId": f"{copy}:e-u1",
                                                          "revisionIndex": index})
                assert await window(c, copy) == [(f"{copy}:{mid}", gone) for mid, gone in await window(c, sid)]
                assert await ctx_ids(c, copy) == [f"{copy}:{mid}" for mid in await ctx_ids(c, sid)]
            shown = (await c.call("session.get", {"sessionId": copy}))["messages"][2]
            assert shown["blocks"] == [{"type": "text", "text": OLD}] and not shown.get("deleted")
