"""A native pi file whose last line has no newline (seed 003 §12): a last line that is one complete JSON
object is an entry like any other (listing, ``session.get``, ``session.fork``); one that does not parse is a
torn tail and is skipped. The pi file is never modified, and a fork's child is well-formed (every line ends
with a newline)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient
from tests.hostkit import client_for, inprocess_host
from tests.importers import gen

SID = "native-pi:s-unterminated"
NAME = "2026-01-01T00-00-00-000Z_s-unterminated.jsonl"
EARLIER = ["hello", "hi there", "more"]


def base_lines() -> list[bytes]:
    """A v3 session (with an abandoned branch) and a custom entry with unknown fields on the current branch."""
    conv: list[gen.Event] = [gen.User("hello"), gen.Response((("text", "hi there"),), ()), gen.User("more")]
    lines = gen.pi_lines(conv, session="s-unterminated", detour_after=2)
    custom = {"type": "custom", "customType": "ext", "id": "c0000001", "parentId": orjson.loads(lines[-1])["id"],
              "timestamp": "2026-01-01T00:00:00.000Z", "data": {"x": 1}, "weird": True}
    return [*lines, orjson.dumps(custom) + b"\n"]


LAST_USER = orjson.dumps({
    "type": "message", "id": "c0000002", "parentId": "c0000001", "timestamp": "2026-01-01T00:00:01.000Z",
    "message": {"role": "user", "content": [{"type": "text", "text": "after custom"}]}, "unknownField": 42})


def write_root(tmp_path: Path, tail: bytes) -> tuple[Path, Path, bytes]:
    root = tmp_path / "pi-sessions"
    project = root / "--work-demo--"
    project.mkdir(parents=True)
    body = b"".join(base_lines()) + tail
    path = project / NAME
    path.write_bytes(body)
    return root, path, body


def texts(page: dict[str, Any]) -> list[str]:
    return [m["blocks"][0]["text"] for m in page["messages"]]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_well_formed(data: bytes) -> list[dict[str, Any]]:
    """Every line of a child ends with a newline and is one JSON object."""
    assert data.endswith(b"\n")
    lines = data.split(b"\n")[:-1]
    out = [orjson.loads(line) for line in lines]
    assert all(isinstance(rec, dict) for rec in out)
    return out


def children(parent: Path) -> list[Path]:
    return sorted(p for p in parent.parent.iterdir() if p.name != parent.name)


async def list_entry(c: HostClient, sid: str) -> dict[str, Any]:
    listed = (await c.call("session.list", {"limit": 50}))["sessions"]
    return next(s for s in listed if s["id"] == sid)


@pytest.mark.parametrize("newline", [False, True], ids=["no-newline", "newline"])
async def test_get_and_list_read_a_complete_last_line_without_newline(tmp_path: Path, newline: bool) -> None:
    root, path, body = write_root(tmp_path, LAST_USER + (b"\n" if newline else b""))
    before = digest(path)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, \
                client_for(host, kind="ui") as c:
            page = await c.call("session.get", {"sessionId": SID})
            assert texts(page) == [*EARLIER, "after custom"]
            assert page["totalMessages"] == 4 and page["messages"][-1]["role"] == "user"
            assert (await list_entry(c, SID))["messageCount"] == 4
            last = await c.call("session.get", {"sessionId": SID, "messageLimit": 1})
            assert texts(last) == ["after custom"] and last["messages"][0]["seq"] == 4
            md = await c.call("session.export", {"sessionId": SID, "format": "md"})
            assert md["messages"] == 4 and "after custom" in md["content"]
    assert path.read_bytes() == body and digest(path) == before  # read in place, never repaired


@pytest.mark.parametrize("title", ["kid", None], ids=["titled", "untitled"])
async def test_fork_keeps_a_complete_last_line_without_newline(tmp_path: Path, title: str | None) -> None:
    root, path, body = write_root(tmp_path, LAST_USER)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, \
                client_for(host, kind="ui") as c:
            child = await c.call("session.fork", {"sessionId": SID, **({"title": title} if title else {})})
            assert child["messageCount"] == 4
            assert texts(await c.call("session.get", {"sessionId": child["id"]}))[-1] == "after custom"
            [written] = children(path)
            data = written.read_bytes()
            records = assert_well_formed(data)
            # the parent's last entry is copied byte for byte (unknown fields kept), now with its newline
            assert LAST_USER + b"\n" in data and records[-1 if title is None else -2]["id"] == "c0000002"
            assert any(rec.get("weird") is True for rec in records)
            if title is not None:
                assert records[-1]["type"] == "session_info" and records[-1]["parentId"] == "c0000002"
            # a fork through the unterminated entry's message finds it too
            page = await c.call("session.get", {"sessionId": SID})
            early = await c.call("session.fork", {"sessionId": SID, "throughMessageId": page["messages"][-1]["id"]})
            assert texts(await c.call("session.get", {"sessionId": early["id"]})) == [*EARLIER, "after custom"]
            for written in children(path):
                assert_well_formed(written.read_bytes())
    assert path.read_bytes() == body  # the parent is only read


TORN = {
    "truncated-object": LAST_USER[:-7],
    "not-an-object": b"[1, 2, 3]",
    "garbage": b"\x00\xffnot json",
    "blank": b"   ",
}


@pytest.mark.parametrize("tail", list(TORN.values()), ids=list(TORN))
async def test_a_torn_last_line_is_still_skipped(tmp_path: Path, tail: bytes) -> None:
    root, path, body = write_root(tmp_path, tail)
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, \
                client_for(host, kind="ui") as c:
            page = await c.call("session.get", {"sessionId": SID})
            assert texts(page) == EARLIER and page["totalMessages"] == 3
            assert (await list_entry(c, SID))["messageCount"] == 3
            child = await c.call("session.fork", {"sessionId": SID, "title": "kid"})
            assert texts(await c.call("session.get", {"sessionId": child["id"]})) == EARLIER
            [written] = children(path)
            data = written.read_bytes()
            records = assert_well_formed(data)
            assert tail not in data or not tail.strip()  # the torn bytes are not copied
            assert records[-2]["id"] == "c0000001"  # the branch ends at the last complete entry
    assert path.read_bytes() == body


async def test_a_header_without_newline_is_read_as_the_header(tmp_path: Path) -> None:
    root = tmp_path / "pi-sessions"
    project = root / "--work-demo--"
    project.mkdir(parents=True)
    header = base_lines()[0].rstrip(b"\n")
    path = project / NAME
    path.write_bytes(header)
    (project / "2026-01-02T00-00-00-000Z_torn.jsonl").write_bytes(header[:-3])
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data", native_pi_root=root) as host, \
                client_for(host, kind="ui") as c:
            listed = [s for s in (await c.call("session.list", {"limit": 50}))["sessions"]
                      if s["source"] == "native-pi"]
            assert [(s["id"], s["messageCount"]) for s in listed] == [(SID, 0)]  # the torn one is not a session
            page = await c.call("session.get", {"sessionId": SID})
            assert page["totalMessages"] == 0 and page["session"]["projectPath"] == "/gen/project"
    assert path.read_bytes() == header


RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "pi"


def place(root: Path, recorded: Path, *, cut: bool) -> tuple[Path, Path]:
    """A copy of ``recorded`` under a native root, its final newline cut off when ``cut``."""
    path = root / recorded.parent.name / recorded.name
    path.parent.mkdir(parents=True)
    body = recorded.read_bytes()
    assert body.endswith(b"\n")
    path.write_bytes(body[:-1] if cut else body)
    return root, path


@pytest.mark.parametrize("recorded", sorted(RECORDED.glob("*/sessions/*/*.jsonl")), ids=lambda p: p.name[:30])
async def test_a_recorded_pi_file_reads_the_same_without_its_last_newline(tmp_path: Path, recorded: Path) -> None:
    """Files the real pi CLI wrote: with the final newline cut, listing, the whole history and a fork
    read exactly what the file with it reads (the newline is the only difference), and neither is changed."""
    seen = []
    for cut in (False, True):
        root, path = place(tmp_path / f"cut-{cut}" / "pi", recorded, cut=cut)
        before = digest(path)
        with trio.fail_after(60):
            async with inprocess_host(tmp_path / f"cut-{cut}" / "data", native_pi_root=root) as host, \
                    client_for(host, "ui", kind="ui") as c:
                native = [s for s in (await c.call("session.list", {"limit": 50}))["sessions"]
                          if s.get("source") == "native-pi"]
                pages = [await c.call("session.get", {"sessionId": s["id"], "full": True}) for s in native]
                forked = await c.call("session.fork", {"sessionId": native[0]["id"]}) if native else None
        assert digest(path) == before
        forked_messages = None
        if forked is not None:
            assert_well_formed(next(p for p in children(path) if p.name.endswith(".jsonl")).read_bytes())
            forked_messages = forked.get("messageCount")
        seen.append(([(s["id"], s["messageCount"]) for s in native], [p["messages"] for p in pages],
                     forked_messages))
    assert seen[0] == seen[1]
    assert seen[0][0], "the recorded file is listed"
