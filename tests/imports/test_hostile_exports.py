"""Hand-crafted hostile pi-host JSONL exports (protocol/README.md §9: ``blob``, ``review_snapshot``, ``revision``,
``revision_live`` and ``turn`` lines) imported into a real host: a file a person received from anyone. Each
import answers (a report, never INTERNAL, never a crash), stores nothing it should not (no blob whose bytes do
not hash to its name, nothing outside the copy's own folders, no other session's rows changed) and leaves the
host usable (the copy reads, a new session takes messages, a clean export imports after it)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from store import review
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host, msg

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PNG_SHA = hashlib.sha256(PNG).hexdigest()
CREATED = "2026-04-01T10:00:00.000Z"
SRC = "src-hostile"


def h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def header(sid: str = SRC) -> dict[str, Any]:
    return {"type": "session", "schema": 1, "sessionId": sid, "createdAt": CREATED}


def user(mid: str, text: str, *, sha: str | None = None, **extra: Any) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if sha is not None:
        blocks.append({"type": "attachment", "kind": "image", "name": "p.png", "ref": f"attachments/{sha}",
                       "mimeType": "image/png", "size": len(PNG)})
    return {"type": "message", "id": mid, "role": "user", "createdAt": CREATED, "blocks": blocks, **extra}


def reply(mid: str, text: str) -> dict[str, Any]:
    return {"type": "message", "id": mid, "role": "assistant", "createdAt": CREATED,
            "blocks": [{"type": "text", "text": text}]}


def base(sid: str = SRC) -> list[dict[str, Any]]:
    """A session whose first prompt carries the picture: header, two messages."""
    return [header(sid), user("u1", "look at this heron", sha=PNG_SHA), reply("a1", "a fine heron")]


def blob_lines(data: bytes, *, sha: str | None = None, part: int = 1 << 20) -> list[dict[str, Any]]:
    sha = sha if sha is not None else h(data)
    out = []
    for off in range(0, max(len(data), 1), part):
        line: dict[str, Any] = {"type": "blob", "sha256": sha, "size": len(data), "offset": off,
                                "data": b64(data[off:off + part])}
        if off == 0:
            line |= {"mimeType": "image/png", "kind": "image"}
        out.append(line)
    return out


def write(path: Path, lines: list[dict[str, Any] | bytes]) -> Path:
    with open(path, "wb") as fh:
        for ln in lines:
            # the standard library writes what orjson would refuse (integers past 64 bits, deep nesting)
            fh.write(ln if isinstance(ln, bytes) else json.dumps(ln, separators=(",", ":")).encode() + b"\n")
    return path


@dataclass
class Host:
    root: Path
    c: HostClient
    tmp: Path

    @property
    def blobs(self) -> Path:
        return self.root / "attachments"

    def blob_names(self) -> list[str]:
        return sorted(n for n in os.listdir(self.blobs) if len(n) == 64) if self.blobs.exists() else []

    def stray_files(self) -> list[str]:
        """Every file under the data dir's attachments that is neither a blob nor its meta (a temp left)."""
        if not self.blobs.exists():
            return []
        return sorted(n for n in os.listdir(self.blobs) if len(n) != 64 and not n.endswith(".meta"))

    async def load(self, lines: list[dict[str, Any] | bytes], name: str = "export.jsonl") -> dict[str, Any]:
        path = write(self.tmp / name, lines)
        result: dict[str, Any] = await self.c.call("import.sessions", {"source": "pi-host", "root": str(path)})
        return result

    async def one(self, lines: list[dict[str, Any] | bytes], name: str = "export.jsonl") -> dict[str, Any]:
        """Import ``lines``; the one session report (asserting the import answered)."""
        result = await self.load(lines, name)
        [rep] = result["sessions"]
        return rep  # type: ignore[no-any-return]

    async def usable(self, sid: str | None = None) -> None:
        """The host still serves: the copy reads, a new session takes a message, a clean export imports."""
        if sid is not None:
            got = await self.c.call("session.get", {"sessionId": sid, "full": True})
            assert got["messages"], got
            await self.c.call("session.listRevisions", {"sessionId": sid})
            await self.c.call("usage.session", {"sessionId": sid})
            await self.c.call("review.list", {"sessionId": sid})
            await self.c.call("session.appendMessage", {"sessionId": sid, "message": msg("later", "still here")})
        probe = f"probe-{os.urandom(4).hex()}"
        await self.c.call("session.create", {"sessionId": probe, "title": "probe"})
        await self.c.call("session.appendMessage", {"sessionId": probe, "message": msg("p1", "ping")})
        clean = f"clean-{os.urandom(4).hex()}"
        rep = await self.one([*base(clean), *blob_lines(PNG)], f"{clean}.jsonl")
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))


@asynccontextmanager
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    root = tmp_path / "data"
    root.mkdir()
    with trio.fail_after(120):
        async with inprocess_host(root) as running, client_for(running) as c:
            yield Host(root, c, tmp_path)


def copy_id(src: str = SRC) -> str:
    return session_id_for("pi-host", src)


def skipped(rep: dict[str, Any]) -> dict[str, int]:
    return rep.get("skippedBlocks") or {}


# -- blob lines -----------------------------------------------------------------------------------------------


async def test_a_blob_whose_parts_carry_other_bytes_than_its_name_is_never_stored(tmp_path: Path) -> None:
    forged = bytearray(PNG)
    forged[100] ^= 0xFF
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), *blob_lines(bytes(forged), sha=PNG_SHA, part=300)])
        assert rep["status"] == "new" and skipped(rep) == {"blob(sha256 mismatch)": 1}, rep
        assert hst.blob_names() == [] and hst.stray_files() == []
        got = await hst.c.call("session.get", {"sessionId": copy_id(), "full": True})
        [att] = [b for m in got["messages"] for b in m["blocks"] if b["type"] == "attachment"]
        assert att.get("evicted") is True  # the copy says at once that the bytes are not here
        await hst.usable(copy_id())
        assert hst.blob_names() == [PNG_SHA]  # the clean export's bytes, verified


async def test_a_blob_that_never_ends_is_dropped_without_a_temp_file(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        endless = {"type": "blob", "sha256": PNG_SHA, "size": 10 << 20, "offset": 0, "data": b64(PNG),
                   "mimeType": "image/png"}
        rep = await hst.one([*base(), endless])
        assert rep["status"] == "new" and skipped(rep) == {"blob(truncated)": 1}, rep
        # started again by another blob's first part, then the file ends in the middle of a part line
        other = blob_lines(b"other bytes")
        rep = await hst.one([*base("src-2"), user("u2", "second", sha=h(b"other bytes")), endless, *other,
                             {**endless, "offset": 0}, b'{"type": "blob", "sha256": "' + PNG_SHA.encode()],
                            "endless2.jsonl")
        assert rep["status"] == "new" and skipped(rep)["blob(truncated)"] == 2, rep
        assert hst.blob_names() == [h(b"other bytes")] and hst.stray_files() == []
        await hst.usable(copy_id())


async def test_ten_thousand_tiny_blob_lines_are_counted_and_stored_only_when_whole(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    sha = h(data)
    unreferenced = [{"type": "blob", "sha256": h(bytes([i % 256, i // 256])), "size": 2, "offset": 0,
                     "data": b64(bytes([i % 256, i // 256]))} for i in range(10_000)]
    repeated = [blob_lines(PNG)[0]] * 10_000  # the same blob over and over
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), user("u2", "bytes", sha=sha), *blob_lines(data, part=1), *repeated,
                             *unreferenced])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        assert skipped(rep) == {"blob(unreferenced)": 10_000}, skipped(rep)
        assert hst.blob_names() == sorted([sha, PNG_SHA]) and hst.stray_files() == []
        assert (hst.blobs / sha).read_bytes() == data
        await hst.usable(copy_id())


async def test_a_blob_part_that_is_not_base64_or_over_its_size_is_dropped(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        bad = {**blob_lines(PNG)[0], "data": "not*base64!"}
        rep = await hst.one([*base(), bad])
        assert skipped(rep) == {"blob(bad base64)": 1}, rep
        # more bytes than the blob's size (a part of 300 KiB for a blob said to be 10 bytes)
        over = {**blob_lines(PNG)[0], "size": 10, "data": b64(os.urandom(300 << 10))}
        rep = await hst.one([*base("src-2"), over], "over.jsonl")
        assert skipped(rep) == {"blob(sha256 mismatch)": 1}, rep
        # a size over the attachment budget: never stored, never even started
        await hst.c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 100})
        rep = await hst.one([*base("src-3"), *blob_lines(PNG)], "budget.jsonl")
        assert skipped(rep) == {"blob(too large)": 1}, rep
        assert hst.blob_names() == [] and hst.stray_files() == []
        await hst.c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 200_000_000})
        await hst.usable(copy_id())


@pytest.mark.parametrize("name", ["../../x", "../../" + "a" * 58, PNG_SHA.upper(), PNG_SHA[:63], "a" * 63 + "/",
                                  "/" + "a" * 63, PNG_SHA + "\n", ""])
async def test_a_blob_whose_name_is_not_a_sha256_is_refused_and_writes_nowhere(tmp_path: Path, name: str) -> None:
    async with host(tmp_path) as hst:
        ref_sha = name if name.strip() else PNG_SHA
        lines = [header(), user("u1", "look", sha=ref_sha), *blob_lines(PNG, sha=name)]
        rep = await hst.one(lines)
        assert rep["status"] in ("new", "refused"), rep
        if rep["status"] == "new":
            assert skipped(rep).get("blob(invalid)") == 1, rep
        assert hst.blob_names() == [] and hst.stray_files() == []
        assert not (tmp_path / "x").exists() and not (hst.root / "x").exists()
        await hst.usable()


async def internal_free(call: Any) -> Any:
    """The answer of an RPC that may refuse: any error but INTERNAL (returned as the error)."""
    try:
        return await call
    except RpcError as exc:
        assert exc.code != "INTERNAL", exc
        return exc


# -- review_snapshot lines ------------------------------------------------------------------------------------

BEFORE = b"# notes, before\n"
AFTER = b"# notes, after\n"


def snapshot(snapshot_id: str, *, path: str = "/w/notes.md", session_id: str = SRC, message_id: str = "a1",
             created: int = 1_775_000_000_000) -> dict[str, Any]:
    meta = review.new_meta(snapshot_id=snapshot_id, session_id=session_id, path=path, tool_name="Write",
                           tool_call_id="c1", message_id=message_id, turn_id="t1", before=BEFORE, after=AFTER,
                           now_ms=created, key=None)
    return {"type": "review_snapshot", "snapshot": meta, "beforeBase64": b64(BEFORE)}


def rv(i: int) -> str:
    return "rv-" + f"{i:032x}"


async def test_a_review_snapshot_cannot_leave_its_folder_or_land_in_another_session(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(AFTER)  # what a restore of a snapshot naming it would overwrite
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with host(tmp_path) as hst:
        await hst.c.call("session.create", {"sessionId": "other", "title": "someone else's"})
        escapes = [{**snapshot(rv(1)), "snapshot": {**snapshot(rv(1))["snapshot"], "snapshotId": "../other/" + rv(1)}},
                   {**snapshot(rv(2)), "snapshot": {**snapshot(rv(2))["snapshot"], "snapshotId": "../../" + rv(2)}},
                   {**snapshot(rv(3)), "snapshot": {**snapshot(rv(3))["snapshot"], "snapshotId": rv(3) + "/.."}}]
        named = snapshot(rv(4), session_id="other", message_id="../../other")  # names another session
        outside = snapshot(rv(5), path=str(victim))  # a restore would write outside the copy's workspace
        info = {"type": "session_info", "title": "hostile", "projectPath": str(workspace)}
        rep = await hst.one([*base(), info, *escapes, named, outside])
        assert rep["status"] == "new" and skipped(rep) == {"review_snapshot(invalid)": 3}, rep
        sid = copy_id()
        assert sorted(os.listdir(hst.root / "review-changes")) == [sid]
        assert sorted(os.listdir(hst.root / "review-changes" / sid)) == [rv(4), rv(5)]
        listed = (await hst.c.call("review.list", {"sessionId": sid}))["snapshots"]
        assert {s["sessionId"] for s in listed} == {sid}
        assert (await hst.c.call("review.list", {"sessionId": "other"}))["snapshots"] == []
        answer = await internal_free(hst.c.call("review.restore", {"sessionId": sid, "snapshotId": rv(5),
                                                                   "submissionId": "r5"}))
        assert isinstance(answer, RpcError), answer  # refused: the path is not under the copy's workspace
        assert victim.read_bytes() == AFTER
        await hst.usable(sid)


async def test_a_review_snapshots_workspace_path_is_re_rooted_and_cannot_leave_the_workspace(tmp_path: Path) -> None:
    """``workspacePath`` (a snapshot's path relative to the exporting session's workspace) is re-rooted on the
    copy's workspace (a new copy's: the export's ``projectPath``); one that is absolute or climbs out of it is
    an invalid line, never a path outside the workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with host(tmp_path) as hst:
        def rel(i: int, relative: Any) -> dict[str, Any]:
            line = snapshot(rv(i), path="/elsewhere/notes.md")
            return {**line, "snapshot": {**line["snapshot"], "workspacePath": relative}}

        info = {"type": "session_info", "title": "hostile", "projectPath": str(workspace)}
        bad = [rel(2, "../victim.txt"), rel(3, str(tmp_path / "victim.txt")), rel(4, ""), rel(5, "a/../.."),
               rel(6, None), rel(7, ["notes.md"])]
        rep = await hst.one([*base(), info, rel(1, "docs/notes.md"), *bad])
        assert rep["status"] == "new" and skipped(rep) == {"review_snapshot(invalid)": len(bad)}, rep
        [snap] = (await hst.c.call("review.list", {"sessionId": copy_id()}))["snapshots"]
        assert snap["snapshotId"] == rv(1) and snap["path"] == str(workspace / "docs" / "notes.md"), snap
        await hst.usable(copy_id())


async def test_thousands_of_review_snapshots_stop_at_the_per_session_limit(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """1,200 snapshots and 3,000 lines past the limit: 1,000 stored, the rest counted; the folder is listed once
    per import, not once per line (each listing of 1,000 snapshots stats them all: a file of a few hundred
    thousand lines past the limit held the one import slot for many minutes)."""
    listings: list[Path] = []
    count = review.count_snapshots

    def counted(directory: Path) -> int:
        listings.append(directory)
        return count(directory)

    monkeypatch.setattr(review, "count_snapshots", counted)
    async with host(tmp_path) as hst:
        snaps = [snapshot(rv(i), created=1_775_000_000_000 + i) for i in range(1_200)]
        rep = await hst.one([*base(), *snaps, *[snaps[-1]] * 3_000])
        assert rep["status"] == "new" and skipped(rep) == {"review_snapshot(limit)": 3_200}, rep
        assert len(listings) == 1, len(listings)
        assert len(os.listdir(hst.root / "review-changes" / copy_id())) == 1_000
        again = await hst.one([*base(), *snaps, reply("a2", "grown")], "grown.jsonl")  # a grown export
        assert again["status"] in ("updated", "new"), again
        assert len(os.listdir(hst.root / "review-changes" / copy_id())) == 1_000
        await hst.usable(copy_id())


# -- revision / revision_live lines ---------------------------------------------------------------------------


def revision(root: str, idx: Any, messages: list[dict[str, Any]], kind: str = "revision") -> dict[str, Any]:
    line: dict[str, Any] = {"type": kind, "rootUserId": root, "revisionIndex": idx, "createdAt": CREATED}
    if kind == "revision":
        line["messages"] = messages
    else:
        line["messageCount"] = len(messages)
    return line


@pytest.mark.parametrize("idx", [0, -1, "1", 1.5, True, None, 2**63, 2**64 + 1])
async def test_a_revision_with_an_index_that_is_not_a_small_positive_int_is_skipped(tmp_path: Path, idx: Any) -> None:
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), revision("u1", idx, [reply("old", "an older answer")]),
                             revision("u1", idx, [], kind="revision_live")])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        assert (await hst.c.call("session.listRevisions", {"sessionId": copy_id()}))["revisions"] == []
        await hst.usable(copy_id())


async def test_a_revision_count_too_large_for_the_index_is_skipped(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        live = {**revision("u1", 2, [], kind="revision_live"), "messageCount": 2**63}
        rep = await hst.one([*base(), revision("u1", 1, [reply("old", "an older answer")]), live])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        await hst.usable(copy_id())


async def test_a_revision_of_a_root_not_in_the_session_or_repeating_live_ids_answers(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        stray = revision("nobody", 1, [user("nobody", "a root that is not here"), reply("x1", "ghost")])
        repeats = revision("u1", 1, [user("u1", "the same id as the live prompt"), reply("a1", "and answer")])
        rep = await hst.one([*base(), stray, repeats, revision("u1", 2, [], kind="revision_live")])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        sid = copy_id()
        before = await hst.c.call("session.get", {"sessionId": sid, "full": True})
        revs = (await hst.c.call("session.listRevisions", {"sessionId": sid}))["revisions"]
        for rev in revs:
            answer = await internal_free(hst.c.call("session.activateRevision", {
                "sessionId": sid, "rootUserId": rev["rootUserId"], "revisionIndex": rev["revisionIndex"],
                "submissionId": f"act-{rev['rootUserId']}-{rev['revisionIndex']}"}))
            got = await hst.c.call("session.get", {"sessionId": sid, "full": True})
            ids = [m["id"] for m in got["messages"]]
            assert len(ids) == len(set(ids)), (answer, ids)  # never one message id twice on the transcript
        assert before["messages"]
        await hst.usable(sid)


# -- turn lines -----------------------------------------------------------------------------------------------


def turn(tid: str, **over: Any) -> dict[str, Any]:
    return {"type": "turn", "id": tid, "status": "completed", "inputTokens": 10, "outputTokens": 5, "costMicros": 7,
            "startedAt": 1_775_000_000_000, "endedAt": 1_775_000_001_000, **over}


ABSURD = [{"inputTokens": -5}, {"outputTokens": "12"}, {"costMicros": 1e300}, {"costMicros": 2**64 - 1},
          {"inputTokens": 2**63}, {"startedAt": "yesterday"}, {"endedAt": 1e300}, {"status": "running"},
          {"usage": {"inputTokens": 2**64 - 1}}, {"usage": "lots"}, {"retryOf": 12}, {"id": ""}]


async def test_turns_with_absurd_numbers_are_skipped_and_the_usage_stays_sane(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        lines = [turn(f"t{i}", **over) for i, over in enumerate(ABSURD)]
        rep = await hst.one([*base(), turn("good"), *lines])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        usage = (await hst.c.call("usage.session", {"sessionId": copy_id()}))["total"]
        assert 10 <= usage["inputTokens"] < 2**62 and 5 <= usage["outputTokens"] < 2**62, usage
        await hst.usable(copy_id())


async def test_a_turn_usage_nested_too_deep_to_store_is_skipped(tmp_path: Path) -> None:
    deep: Any = 1
    for _ in range(300):
        deep = {"a": deep}
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), turn("deep", usage=deep)])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        await hst.usable(copy_id())


async def test_a_turn_id_colliding_with_another_sessions_turn_leaves_that_turn_alone(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        first = await hst.one([*base("src-a"), turn("t1", inputTokens=111)], "a.jsonl")
        assert first["status"] == "new", first
        a_usage = (await hst.c.call("usage.session", {"sessionId": copy_id("src-a")}))["total"]
        # b's turn is namespaced as b's: whatever its id spells (a's namespaced id included), a's row stays
        rep = await hst.one([*base("src-b"), turn("t1", inputTokens=999), turn(f"{copy_id('src-a')}:t1",
                                                                               inputTokens=999)], "b.jsonl")
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        assert (await hst.c.call("usage.session", {"sessionId": copy_id("src-a")}))["total"] == a_usage
        await hst.usable(copy_id("src-b"))


# -- order, torn lines, re-imports ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["blob", "review_snapshot", "revision", "turn"])
async def test_a_carried_line_before_the_session_header_refuses_the_file_and_stores_nothing(
        tmp_path: Path, kind: str) -> None:
    first = {"blob": blob_lines(PNG)[0], "review_snapshot": snapshot(rv(1)),
             "revision": revision("u1", 1, [reply("old", "older")]), "turn": turn("t1")}[kind]
    async with host(tmp_path) as hst:
        rep = await hst.one([first, *base(), *blob_lines(PNG)])
        assert rep["status"] == "refused" and rep["reason"] == "NOT_A_SESSION_FILE", rep
        assert hst.blob_names() == [] and hst.stray_files() == []
        assert not (hst.root / "review-changes" / copy_id()).exists()
        assert isinstance(await internal_free(hst.c.call("session.get", {"sessionId": copy_id()})), RpcError)
        await hst.usable()


async def test_carried_lines_after_a_torn_line_still_count(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        torn = b'{"type": "blob", "sha256": "' + PNG_SHA.encode() + b'", "si\n'
        lines: list[dict[str, Any] | bytes] = [*base(), torn, *blob_lines(PNG, part=300), b"\xff\xfe not json\n",
                                               snapshot(rv(1)), turn("t1")]
        rep = await hst.one(lines)
        assert rep["status"] == "new" and not skipped(rep), rep
        assert hst.blob_names() == [PNG_SHA] and (hst.blobs / PNG_SHA).read_bytes() == PNG
        assert [s["snapshotId"] for s in (await hst.c.call("review.list", {"sessionId": copy_id()}))["snapshots"]] \
            == [rv(1)]
        await hst.usable(copy_id())


async def test_the_same_export_twice_is_unchanged_and_one_changed_blob_byte_is_refused(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        lines: list[dict[str, Any] | bytes] = [*base(), *blob_lines(PNG, part=300), snapshot(rv(1)), turn("t1")]
        rep = await hst.one(lines)
        assert rep["status"] == "new" and not skipped(rep), rep
        stored = os.stat(hst.blobs / PNG_SHA)
        again = await hst.one(lines)  # the same file, unchanged
        assert again["status"] == "unchanged", again
        forged = [dict(ln) for ln in lines if isinstance(ln, dict)]
        part = next(ln for ln in forged if ln["type"] == "blob" and ln["offset"] == 300)
        data = bytearray(base64.b64decode(part["data"]))
        data[7] ^= 0x01
        part["data"] = b64(bytes(data))
        changed = await hst.one([*forged], "changed.jsonl")
        assert changed["sessionId"] == copy_id() and changed["status"] != "refused", changed
        # the blob is here already (content-addressed): the forged parts are read past, never written over it
        after = os.stat(hst.blobs / PNG_SHA)
        assert (after.st_ino, after.st_mtime_ns) == (stored.st_ino, stored.st_mtime_ns)
        assert (hst.blobs / PNG_SHA).read_bytes() == PNG and hst.stray_files() == []
        await hst.usable(copy_id())


async def test_a_changed_blob_byte_on_a_host_without_the_blob_is_refused(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        parts = blob_lines(PNG, part=300)
        data = bytearray(base64.b64decode(parts[-1]["data"]))
        data[-1] ^= 0x01
        parts[-1] = {**parts[-1], "data": b64(bytes(data))}
        rep = await hst.one([*base(), *parts])
        assert skipped(rep) == {"blob(sha256 mismatch)": 1}, rep
        assert hst.blob_names() == [] and hst.stray_files() == []
        await hst.usable(copy_id())


# -- message-shaped content the index cannot hold ------------------------------------------------------------


def deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = {"a": value}
    return value


async def test_a_message_or_revision_nested_too_deep_to_write_back_answers(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        nested = {**reply("a2", "deep"), "meta": deep(300)}
        rep = await hst.one([*base(), nested, revision("u1", 1, [{**reply("old", "older"), "meta": deep(300)}])])
        assert rep["status"] in ("new", "refused"), rep
        assert rep.get("reason") != "INTERNAL", (rep.get("reason"), rep.get("message"))
        await hst.usable(copy_id() if rep["status"] == "new" else None)


async def test_a_known_blob_claimed_under_another_mime_type_keeps_its_own(tmp_path: Path) -> None:
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), *blob_lines(PNG)])
        assert rep["status"] == "new" and hst.blob_names() == [PNG_SHA], rep
        meta = (hst.blobs / f"{PNG_SHA}.meta").read_bytes()
        claimed = [{**ln, "mimeType": "text/html", "kind": "file"} if ln["offset"] == 0 else ln
                   for ln in blob_lines(PNG)]
        rep = await hst.one([*base("src-2"), *claimed], "claimed.jsonl")
        assert rep["status"] == "new" and not skipped(rep), rep
        assert (hst.blobs / f"{PNG_SHA}.meta").read_bytes() == meta
        got = await hst.c.call("session.get", {"sessionId": copy_id("src-2"), "full": True})
        [att] = [b for m in got["messages"] for b in m["blocks"] if b["type"] == "attachment"]
        assert att["mimeType"] == "image/png" and not att.get("evicted"), att
        await hst.usable(copy_id("src-2"))


async def test_a_message_nested_too_deep_is_skipped_and_the_rest_comes_in(tmp_path: Path) -> None:
    """A line nested past what the transcript writer encodes (orjson parses 1024 levels, writes 254) is left
    out and counted, as a line that is not JSON is: the session comes in without it (it was refused whole)."""
    async with host(tmp_path) as hst:
        rep = await hst.one([*base(), {**reply("a2", "deep"), "meta": deep(300)},
                             revision("u1", 1, [{**reply("old", "older"), "meta": deep(300)}]),
                             user("u3", "and after it"), reply("a3", "still here")])
        assert rep["status"] == "new", (rep.get("reason"), rep.get("message"))
        assert rep["skippedBlocks"] == {"message(cannot be written)": 1, "revision(cannot be written)": 1}, rep
        got = await hst.c.call("session.get", {"sessionId": copy_id(), "full": True})
        assert [m["id"].rsplit(":", 1)[1] for m in got["messages"]] == ["u1", "a1", "u3", "a3"]
        await hst.usable(copy_id())
