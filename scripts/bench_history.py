"""Whole-history reads (issue 12): every message of one large session through ``session.get``.

The session is built through the real write path (an in-process host whose session
actor receives ``session.appendMessage`` calls in groups, as ``bench_windows`` does).
Then its whole history is read the way the protocol allows for a session this large: a
reply is at most ``MAX_REPLY_BYTES`` (16 MiB), so a whole read is forward pages
(``messageEnd`` from the previous page, ``messageLimit`` ``MAX_WINDOW``, ``maxBytes``
``MAX_REPLY_BYTES``) until ``hasMoreAfter`` is false — the same requests a client sends:

* in-process: ``host.pipeline.call("session.get", page, decode=False)`` per page, timed as
  the handler's results come back (``protocol.jsonrpc.Encoded``,
  the reply encoded once from the transcript's bytes; any bytes-like value or one
  with ``.raw``/``.data`` counts as pre-encoded, a dict is taken as it is); "including
  decode" adds decoding it to Python objects (what ``pipeline.call`` does by
  default for in-process callers), reported without a target;
* over WebSocket: a ``pi-host serve`` subprocess on the same data directory after
  the in-process host stopped, ``runtime.client`` ``call(...)``, timed from send to the
  decoded reply;

each against the time to parse the whole transcript file with orjson, line by line,
in the same process, the two alternating rep by rep (median of the reps). Every
reply is checked: all messages, in the transcript's order (first and last ids
included).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import trio
from bench_common import (
    Corpus,
    Section,
    Sizes,
    Target,
    call_context,
    inprocess_host,
    median,
    ratio,
    rnd,
    shown,
    start_host_process,
)

from protocol.jsonrpc import gc_paused
from runtime.client import open_client
from runtime.host import RunningHost
from store.rules import MAX_REPLY_BYTES, MAX_WINDOW

SID = "history"
GROUP = 256  # asks in flight at once while building: the session actor's batch limit
IN_PROCESS_TARGET = 1.0
WEBSOCKET_TARGET = 1.5
UPKEEP_AFTER = 0.25  # seconds without writes before the DB writer merges the search index (host default 2)
QUIET_SECS = 1.0     # no merge step for this long: the index is merged, reads are timed on a quiet host
QUIET_DEADLINE = 600.0
_ENCODED = (bytes, bytearray, memoryview, str)
PAGE = {"messageLimit": MAX_WINDOW, "maxBytes": MAX_REPLY_BYTES}
_BOUNDS = re.compile(rb'"messageEnd":(\d+),"hasMoreBefore":(?:true|false),"hasMoreAfter":(true|false)')


def _mid(i: int) -> str:
    return f"{SID}-{i:06d}"


async def _build(host: RunningHost, sid: str, n: int, corpus: Corpus) -> None:
    await host.pipeline.call("session.create", {"sessionId": sid, "title": f"history {n}"}, call_context())
    for start in range(0, n, GROUP):
        batch = [corpus.message(_mid(i), i) for i in range(start, min(n, start + GROUP))]
        async with trio.open_nursery() as nursery:
            for m in batch:
                nursery.start_soon(host.pipeline.call, "session.appendMessage", {"sessionId": sid, "message": m},
                                   call_context())


def encoded_payload(result: Any) -> Any:
    """The JSON text of a pre-encoded result (bytes-like, or held in ``.raw`` / ``.data``), else None."""
    if isinstance(result, _ENCODED):
        return result
    for attr in ("raw", "data"):
        inner = getattr(result, attr, None)
        if isinstance(inner, _ENCODED):
            return inner
    return None


def decode_result(result: Any) -> Any:
    """The result as Python objects: decoded if it came pre-encoded, as it is otherwise."""
    payload = encoded_payload(result)
    return result if payload is None else orjson.loads(payload)


def transcript_ids(path: Path) -> list[str]:
    """Message ids in file order (a grouped build interleaves each group's appends)."""
    ids: list[str] = []
    with open(path, "rb") as fh:
        for line in fh:
            rec = orjson.loads(line)
            if rec.get("type") == "message":
                ids.append(rec["id"])
    return ids


def page_bounds(result: Any) -> tuple[int, bool]:
    """``(messageEnd, hasMoreAfter)`` of one page, read from a pre-encoded reply's own bytes (its last
    fields) without decoding the page."""
    payload = encoded_payload(result)
    if payload is None:
        return int(result["messageEnd"]), bool(result["hasMoreAfter"])
    raw = bytes(payload[-512:]) if not isinstance(payload, str) else payload[-512:].encode()
    found = _BOUNDS.search(raw)
    if found is None:
        raise AssertionError("a page's reply does not end with its bounds")
    return int(found.group(1)), found.group(2) == b"true"


async def read_pages(call: Callable[[dict[str, Any]], Awaitable[Any]]) -> list[Any]:
    """The whole history as forward pages: ``messageEnd`` from each page's end until ``hasMoreAfter`` is
    false."""
    pages: list[Any] = []
    end = 0
    while True:
        page = await call({"sessionId": SID, "messageEnd": end, **PAGE})
        pages.append(page)
        end, more = page_bounds(page)
        if not more:
            return pages


def joined(pages: list[Any]) -> dict[str, Any]:
    """The pages as one history (decoded): their messages in order, the last page's totals."""
    decoded = [decode_result(p) for p in pages]
    return {"messages": [m for p in decoded for m in p["messages"]], "totalMessages": decoded[-1]["totalMessages"]}


def check_history(got: Any, ids: list[str]) -> None:
    """The pages hold the whole session: every message, in file order (so the first and the last too)."""
    msgs = got["messages"]
    seen = [m.get("id") for m in msgs]
    if got["totalMessages"] != len(ids) or seen != ids:
        ends = (seen[0], seen[-1]) if seen else (None, None)
        raise AssertionError(f"whole-history read returned {len(msgs)} of {got['totalMessages']} messages "
                             f"({ends[0]}..{ends[1]}), expected {len(ids)} ({ids[0]}..{ids[-1]})")


async def wait_upkeep_done(status: Callable[[], Awaitable[Any]]) -> tuple[int, float]:
    """Wait until the DB writer's idle upkeep (FTS5 merges of what the build left) has stopped:
    its step count unchanged for ``QUIET_SECS``. Returns (steps, seconds waited)."""
    t0 = time.perf_counter()
    last, since = -1, t0
    while True:
        steps = int((await status())["dbWriter"]["searchUpkeepSteps"])
        now = time.perf_counter()
        if steps != last:
            last, since = steps, now
        elif now - since >= QUIET_SECS:
            return steps, now - t0
        if now - t0 > QUIET_DEADLINE:
            raise AssertionError(f"search upkeep still merging after {QUIET_DEADLINE} s ({steps} steps)")
        await trio.sleep(0.1)


def parse_whole_file(path: Path) -> tuple[float, int]:
    """The baseline: read the transcript and orjson-parse every line into a list of records (what any
    reader of a whole history holds at the end), in the caller's process."""
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        records = [orjson.loads(line) for line in fh]
    secs = time.perf_counter() - t0
    return secs, len(records)


def parse_discarding(path: Path) -> float:
    """The same parse, each record dropped at once (the allocator reuses its memory): reported only."""
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        for line in fh:
            orjson.loads(line)
    return time.perf_counter() - t0


def parse_gc_paused(path: Path) -> float:
    """The baseline's parse with the cyclic garbage collector paused (no collections while the list
    grows, as ``protocol.jsonrpc.loads_large`` decodes a large reply): reported only."""
    with gc_paused():
        t0 = time.perf_counter()
        with open(path, "rb") as fh:
            records = [orjson.loads(line) for line in fh]
        secs = time.perf_counter() - t0
    del records
    return secs


def read_file_bytes(path: Path) -> float:
    """Read the transcript's bytes into memory, nothing else: the floor under any whole read of it."""
    t0 = time.perf_counter()
    with open(path, "rb") as fh:
        data = fh.read()
    secs = time.perf_counter() - t0
    del data
    return secs


async def _alternate(path: Path, reps: int, read: Callable[[], Awaitable[float]],
                     discarding: list[tuple[float, float]] | None,
                     raw_reads: list[float] | None = None) -> tuple[list[float], list[float]]:
    """``reps`` rounds of (parse the file, one timed read), the order flipping every round; with
    ``raw_reads``, each round also reads the file's bytes alone (timed apart)."""
    parse: list[float] = []
    reads: list[float] = []
    if discarding is not None:
        discarding.append((parse_discarding(path), parse_gc_paused(path)))
    for r in range(reps):
        if raw_reads is not None:
            raw_reads.append(read_file_bytes(path))
        if r % 2:
            reads.append(await read())
            parse.append(parse_whole_file(path)[0])
        else:
            parse.append(parse_whole_file(path)[0])
            reads.append(await read())
    return parse, reads


async def _in_process(root: Path, n: int, reps: int) -> dict[str, Any]:
    path = root / "sessions" / f"{SID}.jsonl"
    decode: list[float] = []
    discarding: list[tuple[float, float]] = []
    raw_reads: list[float] = []
    counts: list[int] = []
    kinds: set[str] = set()
    async with inprocess_host(root, search_upkeep_after=UPKEEP_AFTER) as host:
        t0 = time.perf_counter()
        await _build(host, SID, n, Corpus(seed=23))
        build = time.perf_counter() - t0
        await host.services.index_log.barrier()
        steps, quiet = await wait_upkeep_done(partial(host.pipeline.call, "host.status", {}, call_context()))
        ids = await trio.to_thread.run_sync(transcript_ids, path)
        if sorted(ids) != [_mid(i) for i in range(n)]:
            raise AssertionError(f"the transcript holds {len(ids)} messages, not the {n} appended")

        async def page(params: dict[str, Any]) -> Any:
            return await host.pipeline.call("session.get", params, call_context(), decode=False)

        async def read() -> float:
            t0 = time.perf_counter()
            pages = await read_pages(page)
            secs = time.perf_counter() - t0
            kinds.update(type(p).__name__ for p in pages)
            counts.append(len(pages))
            t1 = time.perf_counter()
            got = joined(pages)
            if any(encoded_payload(p) is not None for p in pages):
                decode.append(time.perf_counter() - t1)
            check_history(got, ids)
            return secs

        first = await read()  # warm-up: the first read after the build
        decode.clear()
        parse, reads = await _alternate(path, reps, read, discarding, raw_reads)
    return {"buildSecs": build, "first": first, "parse": parse, "reads": reads, "decode": decode, "pages": counts,
            "discarding": discarding, "rawReads": raw_reads,
            "resultTypes": sorted(kinds), "upkeepSteps": steps, "upkeepWaitSecs": quiet, "ids": ids}


async def _websocket(url: str, token: str, path: Path, file_bytes: int, ids: list[str],
                     reps: int) -> dict[str, Any]:
    limit = 4 * MAX_REPLY_BYTES  # a page is at most MAX_REPLY_BYTES; room to spare
    async with open_client(url, token, client_id="bench-history", max_message_size=limit) as client:
        await wait_upkeep_done(partial(client.call, "host.status", {}))

        async def page(params: dict[str, Any]) -> Any:
            return await client.call("session.get", params)

        async def read() -> float:
            t0 = time.perf_counter()
            pages = await read_pages(page)
            secs = time.perf_counter() - t0
            check_history(joined(pages), ids)
            return secs

        first = await read()  # the fresh process's first read: its actor starts, the layout is read cold
        parse, reads = await _alternate(path, reps, read, None)
    return {"first": first, "parse": parse, "reads": reads}


def run_history(sizes: Sizes, work: Path) -> Section:
    n = sizes.history_messages
    sec = Section("history", f"Whole-history read of a {n:,}-message session (session.get, forward pages)")
    root = work / "history"
    inproc = trio.run(_in_process, root, n, sizes.history_reps)
    path = root / "sessions" / f"{SID}.jsonl"
    proc = start_host_process(root, "--search-upkeep-after", str(UPKEEP_AFTER))
    try:
        ws = trio.run(_websocket, proc.url, proc.token, path, path.stat().st_size, inproc["ids"],
                      sizes.history_reps)
    finally:
        proc.stop()
    in_parse, in_read = median(inproc["parse"]), median(inproc["reads"])
    ws_parse, ws_read = median(ws["parse"]), median(ws["reads"])
    pre_encoded = bool(inproc["decode"])
    in_process: dict[str, Any] = {
        "resultType": ", ".join(inproc["resultTypes"]),
        "pages": max(inproc["pages"]) if inproc["pages"] else 0,
        "preEncoded": pre_encoded,
        "firstReadMs": rnd(inproc["first"] * 1000),
        "medianMs": rnd(in_read * 1000),
        "parseWholeFileMs": rnd(in_parse * 1000),
        "parseDiscardingEachRecordMs": rnd(inproc["discarding"][0][0] * 1000),
        "parseGcPausedMs": rnd(inproc["discarding"][0][1] * 1000),
        "ratioToParseDiscarding": rnd(ratio(in_read, inproc["discarding"][0][0])),
        "ratioToParseGcPaused": rnd(ratio(in_read, inproc["discarding"][0][1])),
        "ratioToParse": rnd(ratio(in_read, in_parse)),
        "readFileBytesMs": rnd(median(inproc["rawReads"]) * 1000),
        "readFileBytesRatioToParse": rnd(ratio(median(inproc["rawReads"]), in_parse)),
    }
    with_decode = in_read
    if pre_encoded:
        with_decode = median([r + d for r, d in zip(inproc["reads"], inproc["decode"], strict=True)])
        in_process["includingDecodeMs"] = rnd(with_decode * 1000)
        in_process["includingDecodeRatioToParse"] = rnd(ratio(with_decode, in_parse))
    sec.figures = {
        "session": {"messages": n, "fileMB": rnd(path.stat().st_size / 2**20), "buildSecs": rnd(inproc["buildSecs"]),
                    "buildMsgsPerSec": rnd(n / inproc["buildSecs"]), "reps": sizes.history_reps,
                    "searchUpkeepSteps": inproc["upkeepSteps"], "upkeepWaitSecs": rnd(inproc["upkeepWaitSecs"])},
        "inProcess": in_process,
        "webSocket": {"freshProcessFirstReadMs": rnd(ws["first"] * 1000), "medianMs": rnd(ws_read * 1000),
                      "parseWholeFileMs": rnd(ws_parse * 1000), "ratioToParse": rnd(ratio(ws_read, ws_parse)),
                      "ratioToInProcess": rnd(ratio(ws_read, in_read)),
                      # the client holds decoded records: the in-process read, decoded, one page after the other
                      # (a reference, not a bound: over the socket the read-ahead overlaps the client's decode)
                      "inProcessDecodedRatioToParse": rnd(ratio(with_decode, in_parse))},
    }
    sec.targets = [
        Target(f"whole history in-process, {n:,} msgs / parse the file with orjson (time)", ratio(in_read, in_parse),
               "<=", IN_PROCESS_TARGET, f"floor in this run: reading the file's bytes alone, "
               f"{shown(in_process['readFileBytesMs'])} ms = "
               f"{shown(in_process['readFileBytesRatioToParse'])}x the parse"),
        Target(f"whole history over WebSocket, {n:,} msgs / parse the file with orjson (time)",
               ratio(ws_read, ws_parse), "<=", WEBSOCKET_TARGET, "reference in this run (not a bound: over the "
               "socket the host reads the next page ahead while the client decodes this one): the same pages "
               "in-process"
               f"{', decoded' if pre_encoded else ''} (no socket), {shown(rnd(with_decode * 1000))} ms = "
               f"{shown(rnd(ratio(with_decode, in_parse)))}x the parse"),
    ]
    sec.notes = [
        "parse: open the transcript and orjson.loads every line (header included) into a list of records (what "
        "a reader of the whole history holds; parseDiscardingEachRecordMs drops each record at once instead, "
        "parseGcPausedMs keeps them with the garbage collector paused; both once, before the reps, reported "
        "without a target), in the process that times the read (the bench process, also for "
        "WebSocket: it is the client); parse and read alternate rep by "
        f"rep, order flipped every rep; medians of {sizes.history_reps} reps after one warm-up read",
        f"a whole read is forward pages (messageEnd, messageLimit {MAX_WINDOW}, maxBytes {MAX_REPLY_BYTES}: a reply "
        "is capped at 16 MiB) until hasMoreAfter is false; in-process: pipeline.call('session.get', page, "
        "decode=False) per page, timed as they return (resultType; a pre-encoded page's messageEnd/hasMoreAfter "
        "are read from its last bytes); when pages come pre-encoded, includingDecode adds orjson-decoding them "
        "(no target)",
        "WebSocket: a pi-host serve subprocess on the same data directory after the in-process host stopped "
        "cleanly; timed from send to the reply decoded by runtime.client; freshProcessFirstReadMs is its first "
        "read (actor start, cold layout); the OS page cache is not dropped",
        f"reads are timed on a quiet host: both hosts run with search_upkeep_after={UPKEEP_AFTER} s and the "
        f"timing starts once no FTS5 merge step happened for {QUIET_SECS} s (the build's index merged, as an "
        "idle host leaves it; upkeepWaitSecs is that wait)",
        "floors: readFileBytesMs is the transcript's bytes read into memory alone (open + one read, each rep "
        "beside the parse), under any whole read of it. A reference, not a floor: inProcessDecodedRatioToParse "
        "is the in-process read plus orjson-decoding its pages one after the other (what the WebSocket client "
        "also holds, without the socket) over the in-process parse; over the socket the host reads the next "
        "page ahead while the client decodes this one, so the WebSocket read can be under it",
        "every reply is checked: totalMessages equals the session's message count and the reply's message ids "
        "are the transcript's, in file order (first and last included); the transcript holds every id appended",
    ]
    return sec
