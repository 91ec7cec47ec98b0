"""Seed 003 §4.2 (projects), §4.5 (sessions), §4.7a (subagent attribution), §4.8 (messages_fts), §5 (write
paths) and §11 items 7, 10, 11 and 12, audited from the spec's text and protocol/README against real
``pi-host serve`` processes over WebSocket. What this module adds: search answers compared with a brute-force
scan of the transcripts (``session.get``) for queries an FTS engine would trip on; the repair point of a message
whose index commit a SIGKILL took; what trash, restore, purge and delete remove (files, index rows, blobs) and
when; a project renamed, a session moved between projects and a project removed with sessions attached;
list and search paging while writes land between the pages; bad input refused with nothing changed.

Already held elsewhere (not repeated): canonical project paths and the upsert (test_seed003_config_outsider),
§11.10 across a SIGKILL and §11.11 for every level with a stale retry (test_seed003_config_outsider), §11.12
round-trip and thinking kept out of search through rewrites and a rebuild (test_seed003_reads_outsider,
test_seed003_acceptance_adversarial item 12), §11.7 needles spanning two messages and a delete killed midway
(test_seed003_acceptance_adversarial), §11.4 healed by a later rewrite (test_seed003_reads_outsider), paging
with one frozen timestamp (integrity/test_paging_under_writes), projects.remove killed midway
(projects/test_remove_crash_retry).

Found: a query was trimmed with ``str.strip()``, which also takes U+001C-U+001F (control characters, not
Unicode whitespace): "\x1e" was refused as empty and "\x1fsep" searched for "sep" (fixed in
store/search/search_text); sessions.restore of a session not in the trash answered it unchanged but still
appended a session_info line (fixed in runtime/handlers/trash: it writes nothing, test_seed003_trash_outsider
holds its keyed retry)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from tests.acceptance.outsiderkit import (
    all_pages,
    client,
    code_of,
    data_dir,
    error_of,
    file_block,
    put_file,
    real_host,
    say,
    shared_host,
)
from tests.hostkit import HostProcess, call_killed_at, msg


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each uses sessions and project paths of its own)."""
    yield from shared_host(tmp_path_factory, "sessions-audit")


# Unicode's White_Space property: what "trimmed of leading and trailing whitespace" takes off a query. The
# information separators U+001C-U+001F are control characters, not whitespace.
_WHITE_SPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                "\u2028\u2029\u202f\u205f\u3000")


def _fold(s: str) -> str:
    """protocol/README §6 "Search matching": Unicode default lowercase, final sigma as sigma."""
    return s.lower().replace("\u03c2", "\u03c3")


def _answer_text(m: dict[str, Any]) -> str:
    return "".join(b["text"] for b in m["blocks"] if b.get("type") == "text")


async def _transcripts(c: HostClient) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Every listed (not trashed) session: its summary and its whole transcript."""
    out = {}
    for s in await all_pages(c, "session.list", "sessions", limit=500):
        out[s["id"]] = (s, (await c.call("session.get", {"sessionId": s["id"], "full": True}))["messages"])
    return out


def _expected(corpus: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], query: str
              ) -> tuple[set[tuple[str, str]], dict[str, tuple[bool, bool, int]]]:
    """The brute-force answer: the (session, message) pairs of user/assistant answer text holding the query,
    and per session (titleMatch, projectMatch, messageMatches) for every session matching at all."""
    needle = _fold(query.strip(_WHITE_SPACE))
    hits: set[tuple[str, str]] = set()
    per: dict[str, tuple[bool, bool, int]] = {}
    for sid, (summary, messages) in corpus.items():
        mine = {(sid, m["id"]) for m in messages
                if m["role"] in ("user", "assistant") and needle in _fold(_answer_text(m))}
        hits |= mine
        title = needle in _fold(summary.get("title") or "")
        project = needle in _fold(summary.get("projectPath") or "")
        if title or project or mine:
            per[sid] = (title, project, len(mine))
    return hits, per


# --------------------------------------------------------------------------- §4.8 search, §11.7, §11.12

_CORPUS: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "q-ascii": ({"title": "Plain ASCII", "projectPath": "/audit/search/one"}, [
        msg("qa1", "The Zebra crossed the road"),
        msg("qa2", "zebra ZEBRA zEbRa", role="assistant"),
        msg("qa3", 'It is 50% of a_b, back\\slash and "quoted" text'),
        msg("qa4", "", role="assistant", blocks=[{"type": "thinking", "text": "zebra hidden 東京 secret-thought"},
                                                 {"type": "text", "text": "answer with NEAR(x y) and col:val"}]),
        msg("qa5", "tool", role="tool", toolName="Bash",
            blocks=[{"type": "tool_call", "callId": "qc1", "name": "Bash", "args": {"cmd": "zebra"},
                     "result": "zebra in tool output", "status": "ok"}]),
        msg("qa6", "zebra system note", role="system"),
        msg("qa7", "x* ^start -minus a OR b AND c {braces} [brackets], sep"),
    ]),
    "q-cjk": ({"title": "日本語のセッション", "projectPath": "/audit/search/二"}, [
        msg("qc1", "私は東京都庁で働く"),
        msg("qc2", "京都と東京", role="assistant"),
        msg("qc3", "emoji 🧪 test 🧪x and 👩\u200d👩\u200d👧 family"),
        msg("qc4", "café with e\u0301 combining: cafe\u0301", role="assistant"),
        msg("qc5", "control \x07bell \x1b[31mred\x1b[0m tab\there \x1fsep\x1e end\x7f"),
        msg("qc6", "delegate found zebra and 東京", role="assistant",
            meta={"parentToolCallId": "task-1", "agentName": "code-reviewer"}),
    ]),
    "q-greek": ({"title": "Greek and Turkish ΟΔΟΣ"}, [
        msg("qg1", "İstanbul ISTANBUL ıstanbul"),
        msg("qg2", "ΟΔΟΣ οδος ΟΣΑ straße STRASSE Meſſage", role="assistant"),
    ]),
}

_TRASHED = ("q-trash", "zebra 東京 🧪 in the trash")

_QUERIES = [
    "a", "ab", "z", "ZE", "zebra", "ZEBRA", "Zebra crossed", "  zebra  ", "\tzebra\n", "東", "東京", "京都",
    "都庁で", "のセ", "🧪", "🧪x", "👩\u200d👩", "\u0301", "e\u0301", "é", "café", "CAFE\u0301", '"', '"quoted"',
    '""', "AND", "a OR b", "OR", "NEAR(x y)", "col:val", "x*", "*", "^start", "-minus", "{braces}", "[", "(",
    "50%", "%", "_", "a_b", "\\", "back\\slash", "\x07", "\x07bell", "\x1b[31m", "tab\there", "\x1fsep", "\x1e",
    "\x7f", "secret-thought", "hidden", "İstanbul", "istanbul", "ISTANBUL", "ı", "i\u0307", "straße", "STRASSE",
    "ΟΣΑ", "οδοσ", "ος", "ωμέγα:", "ſſ", "mess", "delegate", "tool output", "system note", "trash", "Plain",
    "search/二",
]


async def test_search_answers_equal_a_brute_force_scan_of_the_transcripts(shared: HostProcess) -> None:
    """§4.8: search.sessions "counts every matching indexed user/assistant message", "treats title/project
    matches separately from body counts", excludes trashed sessions; "FTS queries are quoted literals and
    all candidates are verified with a host-owned Unicode lowercase literal predicate"; "Short queries and
    non-ASCII case mappings use that predicate directly"; "%, _, quotes, and backslashes are literal text".
    §4.7 thinking stays out of the derived text and tool rows have none; §4.7a attributed rows are ordinary
    index rows. Every query's hits (search.query, all pages) and per-session counts (search.sessions, all
    pages) equal a scan of every transcript, for 1-2 character, case-folded, CJK, emoji, combining-mark,
    FTS-operator and control-character queries."""
    with trio.fail_after(120):
        async with client(shared, kind="agent") as c:
            for sid, (fields, messages) in _CORPUS.items():
                await c.call("session.create", {"sessionId": sid, **fields})
                for m in messages:
                    await c.call("session.appendMessage", {"sessionId": sid, "message": m})
            await c.call("session.rename", {"sessionId": "q-greek", "title": "  Ωμέγα: Greek and Turkish ΟΔΟΣ "})
            await c.call("session.create", {"sessionId": _TRASHED[0], "title": "zebra trash"})
            await say(c, _TRASHED[0], "qt1", _TRASHED[1])
            await c.call("sessions.trash", {"sessionId": _TRASHED[0]})
            corpus = await _transcripts(c)
            assert _TRASHED[0] not in corpus and set(_CORPUS) <= set(corpus)
            wrong: list[tuple[str, Any]] = []
            for query in _QUERIES:
                hits, per = _expected(corpus, query)
                code, data = await error_of(c, "search.query", {"query": query, "limit": 1})
                if code is not None:
                    wrong.append((query, (code, data)))
                    continue
                got = await all_pages(c, "search.query", "results", {"query": query}, limit=7)
                pairs = [(h["sessionId"], h["messageId"]) for h in got]
                assert len(pairs) == len(set(pairs)), (query, pairs)
                if set(pairs) != hits:
                    wrong.append((query, set(pairs) ^ hits))
                    continue
                pages = []
                ask: dict[str, Any] = {"query": query, "limit": 2}
                while True:
                    page = await c.call("search.sessions", ask)
                    pages.append(page)
                    if not page.get("nextCursor"):
                        break
                    ask = {"query": query, "limit": 2, "cursor": page["nextCursor"]}
                found = [r for p in pages for r in p["results"]]
                assert len(found) == len({r["sessionId"] for r in found}), query
                assert {r["sessionId"]: (r["titleMatch"], r["projectMatch"], r["messageMatches"])
                        for r in found} == per, query
                assert {(p["totalSessions"], p["totalMessageMatches"]) for p in pages} == {
                    (len(per), sum(n for _t, _p, n in per.values()))}, query
                for r in found:
                    assert {s["messageId"] for s in r["snippets"]} <= {m for s, m in hits if s == r["sessionId"]}
            assert wrong == []
            # the thinking and the attribution round-trip beside the answer (§11.12, §4.7a)
            view = corpus["q-ascii"][1]
            assert [b["type"] for b in view[3]["blocks"]] == ["thinking", "text"]
            assert view[3]["blocks"][0]["text"] == "zebra hidden 東京 secret-thought"
            assert corpus["q-cjk"][1][5]["meta"] == {"parentToolCallId": "task-1", "agentName": "code-reviewer"}


async def test_search_queries_that_are_no_text_are_refused(shared: HostProcess) -> None:
    """protocol/README search.query / search.sessions: query "Literal text, trimmed of leading and trailing
    whitespace", 1-500 characters: whitespace only, empty, over 500 and NUL are INVALID_PARAMS on both."""
    with trio.fail_after(30):
        async with client(shared) as c:
            for query in ("", "   ", "\t\n\u3000", "x" * 501, "a\x00b"):
                for method in ("search.query", "search.sessions"):
                    assert await code_of(c, method, {"query": query}) == "INVALID_PARAMS", (method, query)
            assert await code_of(c, "search.query", {"query": "x" * 500}) is None


# ------------------------------------------------ §2.1 / §5 a SIGKILL between file append and index commit


async def _found_once(c: HostClient, sid: str, query: str, mid: str) -> None:
    """``query`` finds ``mid`` in ``sid`` exactly once, in both search methods, and nothing else."""
    hits = [(h["sessionId"], h["messageId"]) for h in
            await all_pages(c, "search.query", "results", {"query": query})]
    assert hits == [(sid, mid)], (query, hits)
    (found,) = (await c.call("search.sessions", {"query": query}))["results"]
    assert (found["sessionId"], found["messageMatches"]) == (sid, 1), (query, found)


async def _ids(c: HostClient, sid: str) -> list[str]:
    return [m["id"] for m in (await c.call("session.get", {"sessionId": sid, "full": True}))["messages"]]


async def test_a_message_whose_index_commit_a_sigkill_took_is_searched_once_from_the_restart_on(
        tmp_path: Path) -> None:
    """§2.1 "the file is written before the DB index transaction. A crash between the two costs one derived
    index row — never content"; §11.4 / protocol/README "After a crash the host indexes whatever the
    transcripts hold that the index does not, before it accepts connections": the message the crash left
    unindexed (a SIGKILL after its line's fsync, and a line an outside writer put in the file of a stopped
    host) renders and is found from the first call after the restart, once — never twice, neither after
    the outbox's retry of the same append, a rewrite nor a second restart. Its thinking stays out of search
    (§11.12), the session's thinking level (§11.11) and a delegate row's attribution (§4.7a) survive every
    restart, and session.context leaves the delegate row out."""
    root = data_dir(tmp_path)
    lost = msg("lost1", "東京タワー zebracorn", role="assistant",
               blocks=[{"type": "thinking", "text": "hidden quasarthought"},
                       {"type": "text", "text": "東京タワー zebracorn"}])
    with trio.fail_after(180):
        async with real_host(root, client_id="test") as (proc, c):
            sid = (await c.call("session.create", {"thinkingLevel": "xhigh", "projectPath": "/audit/kill"}))["id"]
            await say(c, sid, "u1", "before the crash")
            await say(c, sid, "d1", "delegate row", role="assistant",
                      meta={"parentToolCallId": "task-9", "agentName": "explorer"})
            proc.kill9()
        append = {"sessionId": sid, "message": lost, "submissionId": "out-1"}
        await call_killed_at(root, "append.after_fsync", "session.appendMessage", append)
        async with real_host(root, client_id="test") as (proc, c):
            assert await _ids(c, sid) == ["u1", "d1", "lost1"]
            await _found_once(c, sid, "zebracorn", "lost1")
            await _found_once(c, sid, "タワー", "lost1")
            assert (await c.call("search.query", {"query": "quasarthought"}))["results"] == []
            again = await c.call("session.appendMessage", append)  # the outbox retries it
            assert again["message"]["id"] == "lost1"
            await _found_once(c, sid, "zebracorn", "lost1")
            session = (await c.call("session.get", {"sessionId": sid}))["session"]
            assert (session["messageCount"], session["thinkingLevel"]) == (3, "xhigh")
            await say(c, sid, "u2", "after the crash")
            await c.call("session.truncateFrom", {"sessionId": sid, "messageId": "u2", "mode": "edit"})
            await _found_once(c, sid, "zebracorn", "lost1")
            proc.kill9()
        # an outside writer: one whole message line in a stopped host's transcript, the index never told
        line = {"type": "message", "id": "hand1", "role": "assistant", "createdAt": "2026-07-26T09:00:00.000Z",
                "blocks": [{"type": "thinking", "text": "handthought"}, {"type": "text", "text": "手書き handwritten"}]}
        with (root / "sessions" / f"{sid}.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
        for _restart in range(2):
            async with real_host(root, client_id="test") as (proc, c):
                assert await _ids(c, sid) == ["u1", "d1", "lost1", "hand1"]
                await _found_once(c, sid, "zebracorn", "lost1")
                await _found_once(c, sid, "手書き", "hand1")
                assert (await c.call("search.query", {"query": "handthought"}))["results"] == []
                full = (await c.call("session.get", {"sessionId": sid, "full": True}))
                assert (full["session"]["messageCount"], full["session"]["thinkingLevel"]) == (4, "xhigh")
                assert full["messages"][1]["meta"] == {"parentToolCallId": "task-9", "agentName": "explorer"}
                assert full["messages"][2]["blocks"] == lost["blocks"]
                context = [m["id"] for m in (await c.call("session.context", {"sessionId": sid}))["messages"]]
                assert "d1" not in context and "lost1" in context
                proc.kill9()


# ----------------------------------------------- §4.5 trash, §5 session delete, §11.7 files and index rows


async def _rich_session(c: HostClient, sid: str, word: str, blobs: list[dict[str, Any]]) -> None:
    """A session holding ``word`` in its answers, an attachment of each blob, an archived regenerate branch
    holding a delegate row (revisions file), a context checkpoint and a streaming checkpoint (inflight file)."""
    await c.call("session.create", {"sessionId": sid, "title": f"{word} session"})
    await c.call("session.appendMessage", {"sessionId": sid, "message": {
        "id": f"{sid}-u1", "role": "user",
        "blocks": [{"type": "text", "text": f"{word} question"}, *(file_block(b) for b in blobs)]}})
    await say(c, sid, f"{sid}-a1", f"first {word} reply", role="assistant")
    await say(c, sid, f"{sid}-d1", f"{word} from a delegate", role="assistant",
              meta={"parentToolCallId": "task-1", "agentName": "helper"})
    await c.call("session.saveActiveRevision", {"sessionId": sid, "rootUserId": f"{sid}-u1"})
    await c.call("session.truncateFrom", {"sessionId": sid, "messageId": f"{sid}-a1", "mode": "regenerate"})
    await say(c, sid, f"{sid}-a2", f"second {word} reply", role="assistant")
    await c.call("session.appendCompaction", {"sessionId": sid, "compaction": {
        "id": f"{sid}-cp", "summary": "summary", "firstKeptMessageId": f"{sid}-a2",
        "throughMessageId": f"{sid}-a2", "tokensBefore": 100, "retainedTail": [],
        "details": {"retainedTailMode": "completed_turn"}}})
    await c.call("session.startTurn", {"sessionId": sid, "turnId": f"{sid}-t9"})
    await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": f"{sid}-t9", "message": msg(
        f"{sid}-a9", f"{word} streaming", role="assistant", turnId=f"{sid}-t9")})


def _files(root: Path, sid: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (root / "sessions").iterdir() if p.name.startswith(f"{sid}.")}


async def _view(c: HostClient, sid: str) -> dict[str, Any]:
    """What a reader sees of the session: its transcript and checkpoints, branches, and search hits."""
    full = await c.call("session.get", {"sessionId": sid, "full": True})
    word = full["session"]["title"].split()[0]
    return {"messages": full["messages"], "compactions": full["compactions"], "inflight": full.get("inflight"),
            "summary": {k: v for k, v in full["session"].items() if k != "updatedAt"},
            "revisions": await c.call("session.listRevisions", {"sessionId": sid, "rootUserId": f"{sid}-u1"}),
            "hits": sorted(h["messageId"] for h in await all_pages(c, "search.query", "results", {"query": word}))}


async def test_trash_restore_purge_and_delete_remove_files_rows_and_blobs_exactly_when_documented(
        tmp_path: Path) -> None:
    """protocol/README §9 Trash: "sessions.trash hides a session from session.list, plugin reads and search;
    its transcript, rows and origin stay, and sessions.restore brings it back exactly" (each call appends a
    session_info line: the transcript grows, nothing else changes); "sessions.purge removes a trashed session
    for good (rows, origin, files; CONFLICT unless it is in the trash)". §5 session delete: "remove both
    session files after row delete", "DELETE FROM sessions (cascades)"; §11.7 "deleting a session removes its
    index entries and both session files"; §4.7a "a deleted session takes its delegate rows with it" and
    "regenerate archives them with the branch". Attachments (§6): a blob stays while a session that exists,
    the trash included, holds it, and the first attachments.gc past the grace after a purge or delete sweeps
    the blobs only that session used. A SIGKILL and restart brings nothing back; the database holds no row
    and no FTS entry of either session."""
    root = data_dir(tmp_path)
    with trio.fail_after(180):
        async with real_host(root) as (proc, c):
            await c.call("settings.set", {"ns": "app", "key": "attachmentUnreferencedGraceMs", "value": 0})
            only_p, only_d, shared_blob = [await put_file(c, bytes([n])) for n in (1, 2, 3)]
            await _rich_session(c, "purged", "quokka", [only_p, shared_blob])
            await _rich_session(c, "deleted", "wombat", [only_d, shared_blob])
            await c.call("session.create", {"sessionId": "kept", "title": "kept"})
            await c.call("session.appendMessage", {"sessionId": "kept", "message": {
                "id": "k1", "role": "user", "blocks": [{"type": "text", "text": "quokka wombat kept"},
                                                       file_block(shared_blob)]}})
            files = _files(root, "purged")
            assert set(files) == {"purged.jsonl", "purged.revisions.jsonl", "purged.inflight.json"}
            before = await _view(c, "purged")
            assert before["hits"] == ["k1", "purged-a2", "purged-u1"]
            assert before["compactions"][0]["id"] == "purged-cp" and before["inflight"]["message"]["id"] == "purged-a9"
            assert [(r["revisionIndex"], r["isActive"], r["messageCount"])
                    for r in before["revisions"]["revisions"]] == [(1, False, 3)]
            archived = [json.loads(x) for x in files["purged.revisions.jsonl"].splitlines()]
            (branch,) = [x for x in archived if x["type"] == "revision"]
            assert [m["id"] for m in branch["messages"]] == ["purged-u1", "purged-a1", "purged-d1"]
            assert branch["messages"][2]["meta"] == {"parentToolCallId": "task-1", "agentName": "helper"}

            # purging what is not in the trash is refused and changes nothing
            assert await code_of(c, "sessions.purge", {"sessionId": "purged"}) == "CONFLICT"
            assert _files(root, "purged") == files and await _view(c, "purged") == before

            trashed = (await c.call("sessions.trash", {"sessionId": "purged"}))["session"]
            assert trashed["deletedAt"] > 0
            now = _files(root, "purged")
            assert now["purged.jsonl"].startswith(files["purged.jsonl"])
            assert {k: v for k, v in now.items() if k != "purged.jsonl"} == {
                k: v for k, v in files.items() if k != "purged.jsonl"}
            assert "purged" not in {s["id"] for s in await all_pages(c, "session.list", "sessions")}
            assert [s["id"] for s in (await c.call("sessions.listTrashed", {}))["sessions"]] == ["purged"]
            assert sorted(h["messageId"] for h in await all_pages(c, "search.query", "results",
                                                                 {"query": "quokka"})) == ["k1"]
            assert {r["sessionId"] for r in (await c.call("search.sessions", {"query": "quokka"}))["results"]} == {
                "kept"}
            gc = await c.call("attachments.gc", {})
            assert gc["unreferencedEvicted"] == []  # the trash still holds its blobs

            await c.call("sessions.restore", {"sessionId": "purged"})
            assert await _view(c, "purged") == before

            await c.call("sessions.trash", {"sessionId": "purged"})
            assert await c.call("sessions.purge", {"sessionId": "purged"}) == {"sessionId": "purged", "purged": True}
            assert await c.call("session.delete", {"sessionId": "deleted"}) == {"sessionId": "deleted",
                                                                               "deleted": True}
            for sid, word in (("purged", "quokka"), ("deleted", "wombat")):
                assert _files(root, sid) == {}
                assert await code_of(c, "session.get", {"sessionId": sid}) == "SESSION_NOT_FOUND"
                assert await code_of(c, "sessions.restore", {"sessionId": sid}) == "SESSION_NOT_FOUND"
                hits = await all_pages(c, "search.query", "results", {"query": word})
                assert [h["messageId"] for h in hits] == ["k1"], word
                assert (await c.call("search.sessions", {"query": f"{word} reply"}))["results"] == []
            assert (await c.call("sessions.listTrashed", {}))["sessions"] == []
            gc = await c.call("attachments.gc", {})
            assert sorted(gc["unreferencedEvicted"]) == sorted([only_p["sha256"], only_d["sha256"]])
            assert {p.name.split(".")[0] for p in (root / "attachments").iterdir() if not p.name.startswith(".")} == {
                shared_blob["sha256"]}
            proc.kill9()
        async with real_host(root) as (proc, c):
            assert [s["id"] for s in await all_pages(c, "session.list", "sessions")] == ["kept"]
            assert [h["messageId"] for h in await all_pages(c, "search.query", "results", {"query": "quokka"})] == [
                "k1"]
            assert _files(root, "purged") == {} and _files(root, "deleted") == {}
            proc.kill9()
    db = sqlite3.connect(root / "pi.sqlite")
    try:
        for sid in ("purged", "deleted"):
            assert db.execute("SELECT count(*) FROM messages WHERE session_id = ?", (sid,)).fetchone() == (0,)
            assert db.execute("SELECT count(*) FROM sessions WHERE id = ?", (sid,)).fetchone() == (0,)
        for word in ("quokka", "wombat", "streaming", "delegate", "first", "second"):
            indexed = db.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH ?",
                                 (f'"{word}"',)).fetchone()[0]
            assert indexed == (1 if word in ("quokka", "wombat") else 0), word
    finally:
        db.close()


# ------------------------------------------------------------- §4.2 projects, §4.5 project_id, §11.10


async def _projects(c: HostClient) -> dict[str, dict[str, Any]]:
    return {p["path"]: p for p in (await c.call("projects.list", {}))["projects"]}


async def test_a_project_renamed_a_session_moved_and_a_project_removed_with_sessions_attached(
        shared: HostProcess, tmp_path: Path) -> None:
    """§4.2 "Rows are auto-upserted by path whenever a workspace is opened" (workspace.open with a name renames
    the row in place), "projects.list is the Project archive index source of truth", "The current visible
    workspace is kv(app, currentProjectId)", project memory in kv(projectMemory, <path>); §4.5 "project_id is
    also the tool-root authority for that session" (§11.10: after the workspace switches, and after the
    session moved to another project), "Forking a session ... retaining the exact project_id, provider/model,
    mode, thinking, and permission configuration"; §5 projects.remove: "remove each owned session's files after its row
    delete ... plus the project row and its projectMemory kv entry; the project folder on disk is never
    touched"; protocol/README §8.2 "The id of a removed project is never issued again"."""
    pa, pb = tmp_path / "proj-a", tmp_path / "proj-b"
    pa.mkdir()
    (pa / "keep.txt").write_text("mine")
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            a = (await c.call("workspace.open", {"path": str(pa)}))["project"]
            assert (a["path"], a["name"]) == (str(pa), "proj-a")
            await c.call("settings.set", {"ns": "projectMemory", "key": str(pa), "value": "remember A"})
            assert "value" in await c.call("settings.get", {"ns": "projectMemory", "key": str(pa)})
            s1 = await c.call("session.create", {"projectPath": str(pa), "title": "one"})
            s2 = await c.call("session.create", {"projectPath": f"{pa}/", "title": "two"})
            s3 = await c.call("session.create", {"projectPath": str(pb), "title": "three"})
            assert s1["projectId"] == s2["projectId"] == a["id"] != s3["projectId"]
            for s in (s1, s2, s3):
                await say(c, s["id"], f"{s['id']}-m", "ocelot sighting")
            renamed = (await c.call("workspace.open", {"path": str(pa), "name": "  Renamed A  "}))["project"]
            assert (renamed["id"], renamed["name"], renamed["sessionCount"]) == (a["id"], "Renamed A", 2)
            assert (await _projects(c))[str(pa)]["name"] == "Renamed A"
            assert {(s["projectId"], s["projectPath"]) for s in
                    (await c.call("session.list", {"projectId": a["id"]}))["sessions"]} == {(a["id"], str(pa))}

            b = (await c.call("workspace.open", {"path": str(pb)}))["project"]
            assert (await c.call("workspace.get", {}))["currentProjectId"] == b["id"] == s3["projectId"]
            r = await c.call("session.resolvePath", {"sessionId": s1["id"], "path": "src/../keep.txt"})
            assert (r["root"], r["path"], r["insideRoot"], r["projectId"]) == (str(pa), str(pa / "keep.txt"),
                                                                                 True, a["id"])

            moved = await c.call("session.update", {"sessionId": s2["id"], "projectPath": f"{pb}//"})
            assert (moved["projectId"], moved["projectPath"]) == (b["id"], str(pb))
            r = await c.call("session.resolvePath", {"sessionId": s2["id"], "path": "x.py"})
            assert (r["root"], r["path"], r["projectId"]) == (str(pb), str(pb / "x.py"), b["id"])
            counts = {k: v["sessionCount"] for k, v in (await _projects(c)).items() if k in (str(pa), str(pb))}
            assert counts == {str(pa): 1, str(pb): 2}
            assert [s["id"] for s in (await c.call("session.list", {"projectId": a["id"]}))["sessions"]] == [
                s1["id"]]
            await c.call("session.update", {"sessionId": s2["id"], "thinkingLevel": "max", "mode": "plan",
                                            "permissionMode": "ask"})
            fork = await c.call("session.fork", {"sessionId": s2["id"]})
            fork = fork.get("session", fork)
            keep = ("projectId", "projectPath", "thinkingLevel", "mode", "permissionMode")
            assert {k: fork[k] for k in keep} == {k: moved[k] for k in keep} | {
                "thinkingLevel": "max", "mode": "plan", "permissionMode": "ask"}
            r = await c.call("session.resolvePath", {"sessionId": fork["id"], "path": "x.py"})
            assert r["root"] == str(pb)
            found = {x["sessionId"]: x["projectMatch"] for x in
                     (await c.call("search.sessions", {"query": "proj-b"}))["results"]}
            assert found == {s2["id"]: True, s3["id"]: True, fork["id"]: True}
            before = await c.call("session.get", {"sessionId": s2["id"], "full": True})
            assert await code_of(c, "session.update", {"sessionId": s2["id"], "projectPath": "proj-a"}) == (
                "INVALID_PARAMS")
            assert await c.call("session.get", {"sessionId": s2["id"], "full": True}) == before

            removed = await c.call("projects.remove", {"projectId": a["id"]})
            assert removed == {"projectId": a["id"], "path": str(pa), "deletedSessions": [s1["id"]]}
            assert _files(shared.data_dir, s1["id"]) == {}
            assert await code_of(c, "session.get", {"sessionId": s1["id"]}) == "SESSION_NOT_FOUND"
            hits = {h["sessionId"] for h in await all_pages(c, "search.query", "results", {"query": "ocelot"})}
            assert hits == {s2["id"], s3["id"], fork["id"]}
            assert str(pa) not in await _projects(c)
            assert "value" not in await c.call("settings.get", {"ns": "projectMemory", "key": str(pa)})
            assert (pa / "keep.txt").read_text() == "mine"
            assert (await c.call("session.get", {"sessionId": s2["id"], "full": True}))["messages"] == before[
                "messages"]
            assert await code_of(c, "projects.remove", {"projectId": a["id"]}) == "NOT_FOUND"
            assert await code_of(c, "projects.pin", {"projectId": a["id"], "pinned": True}) == "NOT_FOUND"
            assert await code_of(c, "session.list", {"projectId": a["id"]}) in (None, "NOT_FOUND")
            again = (await c.call("workspace.open", {"path": str(pa)}))["project"]
            assert again["id"] != a["id"] and again["sessionCount"] == 0 and again["name"] == "proj-a"


# ------------------------------------------------------------------ paging while writes land between pages


async def test_session_list_and_search_pages_miss_and_repeat_nothing_while_others_write(
        shared: HostProcess) -> None:
    """protocol/README session.list: "Pages follow (updatedAt, id): no session appears on two pages, and one
    updated while you page moves ahead of your cursor"; §4.8 search pages. A UI pages (small pages) while an
    agent connection creates sessions, appends to old and new ones and adds matches, between every two page
    reads and concurrently with them: no row is on two pages, and every row that existed unchanged for the
    whole paging is on one."""
    with trio.fail_after(120):
        async with client(shared, kind="agent") as agent, client(shared, client_id="pager") as ui:
            pid = (await agent.call("workspace.open", {"path": "/audit/paging"}))["project"]["id"]
            old = [(await agent.call("session.create", {"projectPath": "/audit/paging"}))["id"] for _ in range(18)]
            for i, sid in enumerate(old[:6]):
                for j in range(3):
                    await say(agent, sid, f"{sid}-p{j}", f"pangolin {i}.{j}")
            old_hits = {(sid, f"{sid}-p{j}") for sid in old[:6] for j in range(3)}
            touched: set[str] = set()
            writes = 0

            async def write(n: int) -> None:
                nonlocal writes
                for _ in range(n):
                    writes += 1
                    new = (await agent.call("session.create", {"projectPath": "/audit/paging"}))["id"]
                    await say(agent, new, f"{new}-p", "pangolin new")
                    target = old[(writes * 7) % len(old)]
                    touched.add(target)
                    await say(agent, target, f"{target}-w{writes}", "pangolin touch")

            async def page_all(method: str, key: str, params: dict[str, Any], limit: int) -> list[dict[str, Any]]:
                rows: list[dict[str, Any]] = []
                ask: dict[str, Any] = {**params, "limit": limit}
                while True:
                    page = await ui.call(method, ask)
                    rows += page[key]
                    if not page.get("nextCursor"):
                        return rows
                    await write(1)
                    ask = {**params, "limit": limit, "cursor": page["nextCursor"]}

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, 6)
                listed = [s["id"] for s in await page_all("session.list", "sessions", {"projectId": pid}, 4)]
            assert len(listed) == len(set(listed)), listed
            assert set(old) - touched <= set(listed)
            assert set(old) - touched, "every old session was touched: the check above checked nothing"

            touched.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, 6)
                hits = [(h["sessionId"], h["messageId"]) for h in
                        await page_all("search.query", "results", {"query": "pangolin"}, 5)]
            assert len(hits) == len(set(hits)), hits
            assert old_hits <= set(hits)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, 6)
                found = [r["sessionId"] for r in
                         await page_all("search.sessions", "results", {"query": "pangolin"}, 3)]
            assert len(found) == len(set(found)), found
            assert set(old[:6]) - touched <= set(found)


# ---------------------------------------------------------------------- bad input changes nothing


async def _state(c: HostClient, root: Path) -> Any:
    """Everything a bad call could have changed: lists, projects, the workspace, the trash, the files."""
    return (await all_pages(c, "session.list", "sessions", limit=500), await c.call("projects.list", {}),
            await c.call("workspace.get", {}), await c.call("sessions.listTrashed", {}),
            {p.name: p.read_bytes() for p in sorted((root / "sessions").iterdir())})


async def test_bad_input_is_refused_with_a_stable_code_and_changes_nothing(shared: HostProcess) -> None:
    """STYLE "Bad input gets a clear error and changes nothing"; protocol/README's parameter rules for the
    session, project, workspace and search methods (patterns, bounds, absolute project paths, titles of 1-80
    code points without control characters, known enum values), their documented codes for an unknown id
    (SESSION_NOT_FOUND, NOT_FOUND), a purge outside the trash (CONFLICT), a relative path in a session
    without a project (CONFLICT, data.reason no_project_root) and a garbled cursor (INVALID_CURSOR)."""
    with trio.fail_after(60):
        async with client(shared, kind="agent") as c:
            plain = (await c.call("session.create", {"title": "bad-input target"}))["id"]
            await say(c, plain, f"{plain}-m", "armadillo")
            await c.call("workspace.open", {"path": "/audit/bad"})
            pid = (await c.call("session.create", {"projectPath": "/audit/bad"}))["projectId"]
            before = await _state(c, shared.data_dir)
            blank_ref = {"id": "bad-att", "role": "user", "blocks": [{"type": "attachment", "kind": "file",
                                                                      "name": "x", "ref": "../../etc/passwd"}]}
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("session.create", {"projectPath": "relative/p"}, "INVALID_PARAMS"),
                ("session.create", {"projectPath": "   "}, "INVALID_PARAMS"),
                ("session.create", {"title": "x" * 81}, "INVALID_PARAMS"),
                ("session.create", {"title": "   "}, "INVALID_PARAMS"),
                ("session.create", {"title": "a\x00b"}, "INVALID_PARAMS"),
                ("session.create", {"title": "\x1btitle"}, "INVALID_PARAMS"),
                ("session.create", {"title": "\x1ftitle"}, "INVALID_PARAMS"),
                ("session.create", {"sessionId": "../evil"}, "INVALID_PARAMS"),
                ("session.create", {"sessionId": plain}, "CONFLICT"),
                ("session.create", {"thinkingLevel": "extreme"}, "INVALID_PARAMS"),
                ("session.create", {"mode": "chat"}, "INVALID_PARAMS"),
                ("session.create", {"permissionMode": "yolo"}, "INVALID_PARAMS"),
                ("session.rename", {"sessionId": plain, "title": "  \t "}, "INVALID_PARAMS"),
                ("session.rename", {"sessionId": plain, "title": "é" * 81}, "INVALID_PARAMS"),
                ("session.rename", {"sessionId": "never-was", "title": "x"}, "SESSION_NOT_FOUND"),
                ("session.update", {"sessionId": plain, "projectPath": "rel/x"}, "INVALID_PARAMS"),
                ("session.update", {"sessionId": plain, "thinkingLevel": "HIGH"}, "INVALID_PARAMS"),
                ("session.update", {"sessionId": "never-was", "thinkingLevel": "high"}, "SESSION_NOT_FOUND"),
                ("session.delete", {"sessionId": "never-was"}, "SESSION_NOT_FOUND"),
                ("session.delete", {"sessionId": "a/b"}, "INVALID_PARAMS"),
                ("session.appendMessage", {"sessionId": "never-was", "message": msg("z1", "x")}, "SESSION_NOT_FOUND"),
                ("session.appendMessage", {"sessionId": plain, "message": blank_ref}, "INVALID_PARAMS"),
                ("sessions.trash", {"sessionId": "never-was"}, "SESSION_NOT_FOUND"),
                ("sessions.purge", {"sessionId": plain}, "CONFLICT"),
                ("session.resolvePath", {"sessionId": plain, "path": "src/x.py"}, "CONFLICT"),
                ("projects.remove", {"projectId": 2**40}, "NOT_FOUND"),
                ("projects.remove", {"projectId": 0}, "INVALID_PARAMS"),
                ("projects.remove", {"projectId": str(pid)}, "INVALID_PARAMS"),
                ("projects.pin", {"projectId": 2**40, "pinned": True}, "NOT_FOUND"),
                ("workspace.open", {"path": "relative"}, "INVALID_PARAMS"),
                ("workspace.open", {"path": ""}, "INVALID_PARAMS"),
                ("workspace.open", {"path": "/audit/bad", "name": "   "}, "INVALID_PARAMS"),
                ("workspace.open", {"path": "/audit/bad", "name": "a\x1bb"}, "INVALID_PARAMS"),
                ("session.list", {"limit": 0}, "INVALID_PARAMS"),
                ("session.list", {"limit": 501}, "INVALID_PARAMS"),
                ("session.list", {"projectId": 0}, "INVALID_PARAMS"),
                ("session.list", {"cursor": "not-a-cursor"}, "INVALID_CURSOR"),
                ("search.query", {"query": "armadillo", "sessionId": "never-was"}, "SESSION_NOT_FOUND"),
                ("search.query", {"query": "armadillo", "limit": 501}, "INVALID_PARAMS"),
                ("search.query", {"query": "armadillo", "cursor": "zz"}, "INVALID_CURSOR"),
                ("search.query", {"query": "armadillo", "scope": "thinking"}, "INVALID_PARAMS"),
                ("search.sessions", {"query": "armadillo", "limit": 101}, "INVALID_PARAMS"),
            ]
            wrong = []
            for method, params, expected in cases:
                code, data = await error_of(c, method, params)
                if code != expected:
                    wrong.append((method, params, code, data))
            assert wrong == []
            code, data = await error_of(c, "session.resolvePath", {"sessionId": plain, "path": "src/x.py"})
            assert data.get("reason") == "no_project_root"
            # a cursor of one query is refused for another
            page = await c.call("search.query", {"query": "armadillo", "limit": 1})
            if page.get("nextCursor"):
                assert await code_of(c, "search.query", {"query": "pangolin", "cursor": page["nextCursor"]}) in (
                    "INVALID_CURSOR",)
            assert await _state(c, shared.data_dir) == before
            # restoring what is not in the trash is no error (no CONFLICT is documented) and changes nothing,
            # its transcript included (README §9: only a call that changes the trash state writes a line)
            restored = (await c.call("sessions.restore", {"sessionId": plain}))["session"]
            assert restored.get("deletedAt") is None
            assert await _state(c, shared.data_dir) == before
