"""Seed 000 §2 (command receipts) and seed 003 §4.9 (branches): calls of the branch methods that change
nothing write nothing, and a pager call reads no more than its answer needs. Against real hosts (a
``pi-host serve`` process; in-process where the test counts what is read).

Found: ``session.activateRevision`` of the branch already live, keyed, appended a ``session_info`` line that
changed nothing but carried the receipt (one line per call); ``sessions.trash`` / ``sessions.restore`` no-ops
had been fixed the same way before (their receipt is a database row only). ``session.listRevisions`` read
every live user message of the session on each call to mark the branches ``activateRevision`` cannot switch
to (O(session) for a pager call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import store.indexing.reconcile
import store.revisions
import store.transcripts.transcript
from protocol.methods import METHODS
from runtime.client import HostClient
from runtime.handlers import revisions as revision_handlers
from store.revisions import drop_sync_mark
from tests.acceptance.outsiderkit import code_of, data_dir, real_host, say
from tests.hostkit import client_for, inprocess_host, msg, passivate
from tests.revisions.helpers import revisions_path, transcript_path


async def _call(c: HostClient, method: str, params: dict[str, Any]) -> Any:
    result = await c.call(method, params)
    METHODS[method].result_model.model_validate(result)
    return result


def _files(root: Path, sid: str) -> tuple[bytes, bytes]:
    return transcript_path(root, sid).read_bytes(), revisions_path(root, sid).read_bytes()


async def test_activating_the_live_branch_writes_nothing_and_a_keyed_retry_answers_as_the_first(
        tmp_path: Path) -> None:
    """protocol/README §4: an ``activateRevision`` of the branch already live rewrites nothing; it writes
    nothing at all either (no ``session_info`` line: the transcript and the revisions file keep their bytes).
    Keyed, its receipt is a database row: a retry answers exactly the first answer after the session changed
    (a rename, another variant saved and made live) and after a SIGKILL and restart, and switches nothing;
    the same key for another request is ``IDEMPOTENCY_CONFLICT``."""
    root = data_dir(tmp_path)
    keyed = {"rootUserId": "u1", "revisionIndex": 1, "submissionId": "act-live"}
    with trio.fail_after(120):
        async with real_host(root) as (proc, c):
            sid: str = (await _call(c, "session.create", {}))["id"]
            keyed["sessionId"] = sid
            await say(c, sid, "u1", "question u1")
            await say(c, sid, "a1", "answer a1", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            before = _files(root, sid)
            plain = await _call(c, "session.activateRevision",
                                {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            first = await _call(c, "session.activateRevision", keyed)
            assert first == plain
            assert [(r["revisionIndex"], r["isActive"]) for r in first["revisions"]] == [(1, True)]
            assert await _call(c, "session.activateRevision", keyed) == first
            assert _files(root, sid) == before, "an activate of the live branch writes no byte"

            # the session changes since: a rename, a regenerate saved as variant 2 and live
            await _call(c, "session.rename", {"sessionId": sid, "title": "renamed since"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            changed = _files(root, sid)
            assert await _call(c, "session.activateRevision", keyed) == first  # answered: nothing switched
            assert _files(root, sid) == changed
            assert await code_of(c, "session.activateRevision", {**keyed, "revisionIndex": 2}) == "IDEMPOTENCY_CONFLICT"
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert await _call(c, "session.activateRevision", keyed) == first
            assert _files(root, sid) == changed
            live = (await _call(c, "session.get", {"sessionId": sid}))["messages"]
            assert [m["id"] for m in live] == ["u1", "a1b"]
            proc.kill9()


async def _rows(c: HostClient, sid: str) -> list[tuple[str, int, bool, str | None]]:
    got = (await _call(c, "session.listRevisions", {"sessionId": sid}))["revisions"]
    return sorted((r["rootUserId"], r["revisionIndex"], r["isActive"], r.get("unavailable")) for r in got)


async def _edited(c: HostClient, sid: str, root: str, edit: str, *, names_root: bool) -> None:
    """``root``'s turn edited: cut from ``root`` (its branch archived), ``edit`` appended in its place,
    naming ``root`` as the message it revises (``meta.revisionRootId``) or not, and answered."""
    await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": root, "mode": "edit"})
    meta = {"revisionRootId": root} if names_root else {}
    await _call(c, "session.appendMessage", {"sessionId": sid, "message": msg(edit, f"edited {root}", meta=meta)})
    await say(c, sid, f"{edit}-a", f"answer {edit}", "assistant")


async def test_listing_revisions_reads_the_roots_it_marks_not_the_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``listRevisions`` marks a branch whose family no live user message roots (``root_missing``) or whose
    reference the live root's stamp does not name (``stale_reference``). It finds each family's live root
    by the ids it can have (the family key; a message that joins the family under another id, an edit
    naming it), from the index and those lines only: after the first call (whose actor reads the
    transcript once anyway), a call reads a few lines, whatever the session's length, and answers as
    before; lines appended since are read once, a rewrite's not at all."""
    spans: list[int] = []
    scans: list[tuple[int, int | None]] = []
    read_spans, scan_from = store.transcripts.transcript.read_spans, store.indexing.reconcile.scan_from

    def counted_spans(path: Any, wanted: Any, **kw: Any) -> Any:
        spans.append(len(wanted))
        return read_spans(path, wanted, **kw)

    def counted_scan(path: Any, start: int, stop: int | None = None) -> Any:
        scans.append((start, stop))
        return scan_from(path, start, stop)

    for module in (store.revisions, revision_handlers):  # the transcript's lines read through the index
        monkeypatch.setattr(module, "read_spans", counted_spans, raising=False)
    monkeypatch.setattr(revision_handlers, "scan_from", counted_scan, raising=False)
    turns = 150
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "pager") as c:
            sid: str = (await _call(c, "session.create", {}))["id"]
            await say(c, sid, "u1", "question u1")
            await say(c, sid, "a1", "answer a1", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})  # live, referenced
            await say(c, sid, "u2", "question u2")
            await say(c, sid, "a2", "answer a2", "assistant")
            await _edited(c, sid, "u2", "e2", names_root=False)  # u2's family: no live root
            await say(c, sid, "u3", "question u3")
            await say(c, sid, "a3", "answer a3", "assistant")
            await _edited(c, sid, "u3", "e3", names_root=True)  # u3's family: its live root is e3
            for n in range(turns):
                await say(c, sid, f"t{n}", f"question t{n}")
                await say(c, sid, f"r{n}", f"answer r{n}", "assistant")
            expected = [("u1", 1, True, None), ("u2", 1, False, "root_missing"), ("u3", 1, False, None)]
            assert await _rows(c, sid) == expected
            spans.clear()
            scans.clear()
            for _ in range(3):
                assert await _rows(c, sid) == expected
            assert scans == [] and sum(spans) <= 3 * 4, (scans, spans)  # u1, u2 (two spellings), u3, e3

            # an edit of a later turn: a rewrite (its lines noted as written), then the edit appended
            await _edited(c, sid, "t100", "e100", names_root=True)
            spans.clear()
            scans.clear()
            expected = sorted([*expected, ("t100", 1, False, None)])
            assert await _rows(c, sid) == expected
            assert await _rows(c, sid) == expected
            assert len(scans) == 1 and scans[0][0] > 0, scans  # the lines appended since the rewrite, once
            assert sum(spans) <= 2 * 7, spans
            assert await code_of(c, "session.activateRevision",
                                 {"sessionId": sid, "rootUserId": "u2", "revisionIndex": 1}) == "MESSAGE_NOT_FOUND"

            # roots another session's ids made the host store under {sessionId}:{id}: saved, edited, cut
            other: str = (await _call(c, "session.create", {}))["id"]
            for mid in ("x1", "x2", "x3"):
                await say(c, other, mid, f"other {mid}")
            for mid, names_root in (("x1", None), ("x2", True), ("x3", False)):
                await say(c, sid, mid, f"taken {mid}")
                await say(c, sid, f"{mid}-a", f"answer {mid}", "assistant")
                await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": mid})
                if names_root is not None:
                    await _edited(c, sid, mid, f"{mid}e", names_root=names_root)
            looked_up = await _rows(c, sid)
            assert [row for row in looked_up if row[0] not in {r[0] for r in expected}], looked_up
            # the same answers as every live user message read (the path taken when the index trails the file)
            monkeypatch.setattr(revision_handlers, "live_roots", lambda *args: None, raising=False)
            assert await _rows(c, sid) == looked_up


async def test_the_first_branch_call_of_an_actor_reads_only_what_was_appended_since_its_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: the first branch call of each session actor incarnation re-synced the branch rows with the
    files by reading the whole transcript (and the revisions file): O(session) every time an actor started.
    A sync now marks in the database what it synced against; the next incarnation whose files are still
    what the mark says reads only the transcript lines appended since (and answers the same). A revisions
    file changed behind the host's back (edited by hand: here a line copied, and a branch's lines cut, as
    a restored backup would) is re-synced from both files whole, as before; so is a session whose mark is
    gone (a lost database has none)."""
    loads: list[str] = []
    scans: list[int] = []
    load_live, scan_from = revision_handlers.load_live, revision_handlers.scan_from

    def counted_load(path: Any, **kw: Any) -> Any:
        loads.append(str(path))
        return load_live(path, **kw)

    def counted_scan(path: Any, start: int, stop: int | None = None) -> Any:
        scans.append(start)
        return scan_from(path, start, stop)

    monkeypatch.setattr(revision_handlers, "load_live", counted_load)
    monkeypatch.setattr(revision_handlers, "scan_from", counted_scan)
    with trio.fail_after(120):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, "pager") as c:
            sid: str = (await _call(c, "session.create", {}))["id"]
            await say(c, sid, "u1", "question u1")
            await say(c, sid, "a1", "answer a1", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            await _call(c, "session.truncateFrom", {"sessionId": sid, "messageId": "a1", "mode": "regenerate"})
            await say(c, sid, "a1b", "answer a1b", "assistant")
            await _call(c, "session.saveActiveRevision", {"sessionId": sid, "rootUserId": "u1"})
            expected = [("u1", 1, False, None), ("u1", 2, True, None)]
            await passivate(host, sid)
            loads.clear()
            assert await _rows(c, sid) == expected
            assert loads == [], "the host's own branch writes moved the mark: the session is not read"

            # a switch (a rewrite: a new epoch) in one incarnation, the rows of the next follow it
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 1})
            await passivate(host, sid)
            loads.clear()
            assert await _rows(c, sid) == [("u1", 1, True, None), ("u1", 2, False, None)]
            assert loads == [], loads
            await _call(c, "session.activateRevision", {"sessionId": sid, "rootUserId": "u1", "revisionIndex": 2})
            for n in range(30):
                await say(c, sid, f"t{n}", f"question t{n}", "user" if n % 2 == 0 else "assistant")
            await passivate(host, sid)
            loads.clear()
            scans.clear()
            assert await _rows(c, sid) == expected
            assert loads == [] and len(scans) == 1 and scans[0] > 0, (loads, scans)  # the lines appended since

            # the common path: a new incarnation, the files as the mark says, then with lines appended since
            for appended in (0, 4):
                await passivate(host, sid)
                for n in range(appended):
                    await say(c, sid, f"late{n}", f"late {n}", "user" if n % 2 == 0 else "assistant")
                if appended:
                    await passivate(host, sid)
                loads.clear()
                scans.clear()
                assert await _rows(c, sid) == expected
                assert loads == [], "the whole transcript is not read on the common path"
                assert all(start > 0 for start in scans), scans
                assert len(scans) == (1 if appended else 0), scans

            # a revisions file edited by hand while no actor runs: both files read again, the rows as it says
            path = revisions_path(tmp_path / "data", sid)
            lines = path.read_bytes().splitlines(keepends=True)
            await passivate(host, sid)
            path.write_bytes(b"".join([*lines, lines[-1]]))  # the newest line copied: no row changes
            loads.clear()
            assert await _rows(c, sid) == expected
            assert len(loads) == 1, "a changed revisions file is re-synced from the whole transcript"
            await passivate(host, sid)
            path.write_bytes(b"".join(line for line in lines if b'"revisionIndex":2' not in line))
            loads.clear()
            assert await _rows(c, sid) == [("u1", 1, False, None)]  # the branch the file no longer names is gone
            assert len(loads) == 1, loads
            await passivate(host, sid)
            loads.clear()
            assert await _rows(c, sid) == [("u1", 1, False, None)]
            assert loads == [], "marked again by that sync"

            # the mark gone (as with a lost database): read in full again
            await passivate(host, sid)
            await host.services.db.write(lambda conn: drop_sync_mark(conn, sid), durable=True)
            loads.clear()
            assert await _rows(c, sid) == [("u1", 1, False, None)]
            assert len(loads) == 1, loads
