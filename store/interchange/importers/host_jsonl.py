"""This host's own transcript format (a ``pi-host export --format jsonl`` file, or a transcript copy).

The lines are already transcript records (docs/DESIGN.md); importing one
gives the messages a new namespace (``<new session id>:<old id>``, so the
copy never collides with the session it came from) and maps the ids a
compaction checkpoint refers to the same way. Message lines with an id seen
before replace it (the reader rule), tombstoned messages stay out (a first
pass reads the tombstone lines: the newest per message decides, as in the
transcript; an export holds none, a transcript copy may), ``session_info``
names the session (an export of an imported session: its ``historyModel``, ``historyGit`` and ``spawnedBy``
go back into the origin history) and gives a new copy the export's ``thinkingLevel`` and ``thread`` metadata
(its ``parentThreadId`` named as the copy of that parent is, its approved ``origins`` left behind); the internal
command receipt is dropped. Each ``session_info`` line naming a project root (the full one, and an export's bare
positional ``{"type", "projectPath"}`` lines, which set nothing else) becomes such a root line in the copy where it
stands, when the root changes (``records.Root``: the copy's Write/Edit lines resolve against the folder they were
written in). The export's ``revision`` / ``revision_live`` lines (its archived
regenerate/edit branches, seed 003 §4.9) are handed over as :class:`Archived`, their ids namespaced as the
messages' (a root's ``meta.revisionRootId`` too), for the import to write under the same keys into the copy's
revisions file, with the export's ``artifact`` lines (the session's artifact rows, turn ids namespaced: the
copy lists what the session listed, the files whose lines a cut took out included); its ``turn`` lines (the
first host's usage, seed 003 §4.6) become the copy's turn rows, ids namespaced the same way. An export without
them (an older one) has none. A content-free record of a prompt
deleted on the first host that keys archived branches (``deleted: true``, no blocks: ``export.withheld``) comes
over with no blocks and tombstoned (a ``tombstone`` record after it, which the writer writes only with the
message's first line), and as a branch's root it joins that branch's ``deleted`` ids. Tombstone lines
and unknown line kinds (an export's ``environment`` lines among them) are
counted and skipped. An export's ``blob`` and ``review_snapshot`` lines (the attachment bytes and review
snapshots it carries) are verified and stored by :mod:`store.interchange.importers.carried`; the
``"evicted": true`` an export put on a block is dropped (the copy marks its blocks from what it holds). A
message's collaboration provenance (``meta.sessionMessage``, or its top-level projection; seed 003 §4.6c) is
kept only as ``meta.importedSessionMessage``: the ledger row behind it is not exported, so the copy's row is
not a delivery (a hand-made file cannot plant one); nothing reads that key as provenance.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from store.artifacts import OPS
from store.interchange.importers.carried import CARRIED, CarriedLines
from store.interchange.importers.common import (
    Archived,
    Emitter,
    FileReport,
    LineReader,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    Slot,
    SourceUnit,
    file_report,
    finalize,
    join_id,
    parse_counted,
    parse_object,
    session_id_for,
    stamp,
    to_ms,
)
from store.interchange.origin_history import SPAWN_KEYS
from store.revisions import ARTIFACT, REVISION, REVISION_LIVE, ROOTS, family_of, roots_field, roots_of, stamp_of
from store.rules import TURN_ENDED, is_absolute_path, path_problem
from store.tombstones import TOMBSTONE
from store.transcripts.records import ROLES, Root, root_line, root_named
from store.upgrade.schema import MAX_SEQ
from store.usage import INT64_MAX

SOURCE = "pi-host"
SKIPPED = frozenset({"environment", "tombstone"})
PROVENANCE = "sessionMessage"
"""Collaboration provenance (``meta.sessionMessage``, seed 003 §4.6c): only the importing host's own ledger
backs it, so a copy never carries it as such."""
IMPORTED_PROVENANCE = "importedSessionMessage"
"""Where a copy keeps the provenance its export named: inert, read back with the message's other meta."""


def discover(root: Path) -> Iterator[SourceUnit]:
    files = [root] if root.is_file() else sorted(p for p in root.glob("*.jsonl") if p.is_file()
                                                 and not p.name.endswith(".revisions.jsonl"))
    for path in files:
        external = None
        for line in LineReader(path, max_line_bytes=1 << 20, chunk=1 << 16):
            rec = parse_object(line.data) if line.data is not None else None
            if rec is not None and rec.get("type") == "session" and isinstance(rec.get("sessionId"), str):
                external = rec["sessionId"]
            break
        yield SourceUnit(SOURCE, external or path.stem, (path,))


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    sid = unit.session_id
    meta = SessionMeta(SOURCE, unit.external_id, sid, label="pi-host transcript")
    report = SessionReport(SOURCE, unit.external_id, sid)
    archived = Archived([], {})
    turns: dict[str, dict[str, Any]] = {}
    records = _records(unit.files[0], sid, ctx, meta, report, archived, turns)
    return Parsed(meta, report, finalize(records, report, ctx.limits), archived=lambda: archived,
                  carried_turns=lambda: list(turns.values()))


def _records(path: Path, sid: str, ctx: ParseContext, meta: SessionMeta, report: SessionReport,
             archived: Archived, turns: dict[str, dict[str, Any]]) -> Iterator[Slot]:
    file = FileReport(str(path))
    report.files.append(file)
    emitter = Emitter(ctx.limits, report)
    reader = LineReader(path, max_line_bytes=ctx.limits.max_line_bytes, chunk=ctx.limits.read_chunk,
                        mark=ctx.mark(path))
    seen: set[str] = set()
    hidden = _tombstoned(path, ctx)
    carried = CarriedLines(ctx, sid, report, lambda: ctx.workspace if ctx.workspace is not None else meta.cwd)
    try:
        yield from _lines(path, reader, file, emitter, carried, hidden, seen, sid, meta, report, ctx, archived, turns)
    finally:
        carried.abort()


def _lines(path: Path, reader: LineReader, file: FileReport, emitter: Emitter, carried: CarriedLines,
           hidden: frozenset[str], seen: set[str], sid: str, meta: SessionMeta, report: SessionReport,
           ctx: ParseContext, archived: Archived, turns: dict[str, dict[str, Any]]) -> Iterator[Slot]:
    header_seen = False
    in_effect: Root | None = None  # the root the lines pushed so far leave in effect (a line before any: None)
    unpaired: dict[str, int] = {}  # message id -> calls without their result in its last line (one counting several)
    for line in reader:
        file.lines += 1
        if line.data is None:
            file.oversized_lines += 1
            continue
        rec = parse_counted(line.data, file)
        if rec is None:
            file.bad_lines += 1
            continue
        kind = rec.get("type")
        file.record_types[str(kind)] += 1
        if not header_seen:
            if kind != "session" or not isinstance(rec.get("sessionId"), str):
                raise Refused("NOT_A_SESSION_FILE", f"{path} does not start with a pi-host session header")
            header_seen = True
            meta.saw_time(to_ms(rec.get("createdAt")))
            continue
        if kind == "message" and rec.get("id") in hidden:
            file.skipped["message(tombstoned)"] += 1
        elif kind == "message":
            out = _message(rec, sid)
            if out is None:
                file.unknown["message(invalid)"] += 1
                continue
            meta.saw_time(to_ms(rec.get("createdAt")))
            replacement = out["id"] in seen
            seen.add(out["id"])
            if out["role"] == "user" and family_of(out) not in archived.active:  # its live root (live_stamps)
                active = stamp_of(out).active
                if active is not None:
                    archived.active[family_of(out)] = active
            _tally_unpaired(unpaired, out)
            carried.referenced(_unmarked(out))
            emitter.push(out, replacement=replacement)
            if _withheld(rec):  # tombstoned on the first host: the copy holds it tombstoned (written once)
                emitter.push({"type": TOMBSTONE, "id": join_id(sid, "tombstone", str(rec["id"])),
                              "messageId": out["id"], "deleted": True, "createdAt": out["createdAt"]})
        elif kind == "compaction":
            out = _compaction(rec, sid)
            if out is None:
                report.compactions_dropped += 1
                continue
            carried.referenced(_unmarked(out))
            emitter.push(out)
        elif kind == "session_info":
            root = _root_of(rec)
            if root is not None and root != in_effect:  # the copy's lines after it stand under it (records.Root)
                emitter.push(root_line(root))
                in_effect = root
            if is_root_line(rec):  # names a position only: the session's settings are its full lines'
                yield from emitter.ready()
                continue
            meta.offer_title(rec.get("title"), 0, replace=True)
            if isinstance(rec.get("projectPath"), str) and rec["projectPath"]:
                meta.cwd = rec["projectPath"]
            git = rec.get("historyGit")  # an export of an imported session: the git state its source recorded
            if isinstance(git, Mapping):
                branches = git.get("branches")
                for branch in branches if isinstance(branches, list) else ():
                    meta.saw_git(branch)
                meta.saw_git(git.get("branch"), git.get("commit"), git.get("repositoryUrl"))
            _history(rec, meta)
            _carried(rec, meta)
        elif kind in (REVISION, REVISION_LIVE):
            branch = _revision(rec, sid)
            if branch is None:
                file.unknown[f"{kind}(invalid)"] += 1
            else:
                for message in branch.get("messages") or ():
                    carried.referenced(_unmarked(message))  # its blobs come over too (the export carries them)
                archived.branches.append(branch)
        elif kind == "turn":
            turn = _turn(rec, sid)
            if turn is None:
                file.unknown["turn(invalid)"] += 1
            elif len(turns) < ctx.limits.max_messages or turn["id"] in turns:
                turns[turn["id"]] = turn
            else:
                file.skipped["turn(over limit)"] += 1
        elif kind == ARTIFACT:
            row = _artifact(rec, sid)
            if row is None:
                file.unknown["artifact(invalid)"] += 1
            elif len(archived.artifacts) < ctx.limits.max_messages or row["path"] in archived.artifacts:
                held = archived.artifacts.get(row["path"])
                if held is None or row["updatedAt"] >= held["updatedAt"]:
                    archived.artifacts[row["path"]] = row
            else:
                file.skipped["artifact(over limit)"] += 1
        elif kind in CARRIED:
            carried.line(rec)
        elif kind in SKIPPED:
            file.skipped[str(kind)] += 1
        else:
            file.unknown[str(kind)] += 1
        yield from emitter.ready()
    if not header_seen:
        raise Refused("NOT_A_SESSION_FILE", f"{path} has no pi-host session header")
    carried.close()
    report.unpaired_tool_calls = sum(unpaired.values())
    yield from emitter.finish()
    file_report(reader, file)


def is_root_line(rec: Mapping[str, Any]) -> bool:
    """A bare ``{"type": "session_info", "projectPath": ...}`` line: the root the lines after it were written
    under (an export's positional root line, a rewrite's), no setting of the session's."""
    return rec.keys() == {"type", "projectPath"}


def _root_of(info: Mapping[str, Any]) -> Root | None:
    """The root a ``session_info`` line sets for the lines after it (``records.root_named``), when the copy can
    hold it: an absolute path a client could name (a relative or over-long one is no root: ignored, the lines
    after it standing under the one before), or null (no root)."""
    root = root_named(info)
    if root is None or root.path is None:
        return root
    if not is_absolute_path(root.path) or path_problem(root.path) is not None:
        return None
    return root


def _unmarked(value: Any, depth: int = 0) -> Any:
    """``value`` without the ``"evicted": true`` an export's read projection put on a block whose blob the
    exporting host no longer held (in place): the copy marks its own blocks from what it holds (a blob it
    lacks is recorded evicted, ``store.interchange.importers.carried``), and a later re-put clears that."""
    if depth > 64:
        return value
    if isinstance(value, dict):
        if value.get("evicted") is True and isinstance(value.get("ref"), str):
            del value["evicted"]
        for item in value.values():
            if isinstance(item, (dict, list)):
                _unmarked(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                _unmarked(item, depth + 1)
    return value


def _history(info: Mapping[str, Any], meta: SessionMeta) -> None:
    """An export of an imported session: the model its history named last (``historyModel``) and the session
    that spawned it (``spawnedBy``) go back into the origin history, as the source's importer put them there."""
    model = info.get("historyModel")
    if isinstance(model, Mapping) and isinstance(model.get("modelId"), str) and model["modelId"]:
        meta.history["modelId"] = model["modelId"]
        if isinstance(model.get("providerId"), str) and model["providerId"]:
            meta.history["providerId"] = model["providerId"]
    spawn = info.get("spawnedBy")
    if isinstance(spawn, Mapping) and isinstance(spawn.get("sessionId"), str) and spawn["sessionId"]:
        meta.history["spawnedBy"] = {k: spawn[k] for k in SPAWN_KEYS if isinstance(spawn.get(k), str) and spawn[k]}


def _carried(info: Mapping[str, Any], meta: SessionMeta) -> None:
    """The export's own session settings a new copy takes: its thinking level, and its thread metadata but the
    origins the person approved on the other host; a parent thread is named as the copy of it is named here
    (``session_id_for``: the link holds whichever of the two is imported first)."""
    level = info.get("thinkingLevel")
    if isinstance(level, str):
        meta.carried["thinkingLevel"] = level
    thread = info.get("thread")
    if isinstance(thread, Mapping):
        kept = {k: v for k, v in thread.items() if k != "origins"}
        parent = kept.get("parentThreadId")
        if isinstance(parent, str) and parent:
            kept["parentThreadId"] = session_id_for(SOURCE, parent)
        meta.carried["thread"] = kept


def _tombstoned(path: Path, ctx: ParseContext) -> frozenset[str]:
    """The message ids whose newest tombstone line hides them (only those lines are parsed)."""
    state: dict[str, bool] = {}
    for line in LineReader(path, max_line_bytes=ctx.limits.max_line_bytes, chunk=ctx.limits.read_chunk):
        if line.data is None or b'"tombstone"' not in line.data:
            continue
        rec = parse_object(line.data)
        if rec is not None and rec.get("type") == "tombstone" and isinstance(rec.get("messageId"), str):
            state[rec["messageId"]] = rec.get("deleted") is not False
    return frozenset(mid for mid, deleted in state.items() if deleted)


def _withheld(rec: Mapping[str, Any]) -> bool:
    """An export's content-free record of a message tombstoned on the first host, which an archived branch is
    keyed by (``store.interchange.export.withheld``): it comes over with no blocks, tombstoned."""
    return rec.get("deleted") is True and "blocks" not in rec


def _message(rec: Mapping[str, Any], sid: str) -> dict[str, Any] | None:
    mid, role, blocks = rec.get("id"), rec.get("role"), rec.get("blocks")
    withheld = _withheld(rec)
    if withheld:
        blocks = []
    if not isinstance(mid, str) or not mid or role not in ROLES or not isinstance(blocks, list):
        return None
    if not all(isinstance(b, Mapping) and isinstance(b.get("type"), str) and b["type"] for b in blocks):
        return None
    out: dict[str, Any] = {"type": "message", "id": join_id(sid, mid), "role": role,
                           "createdAt": stamp(to_ms(rec.get("createdAt")))}
    if withheld:
        out["blocks"] = blocks
    for key, value in rec.items():
        if key in ("type", "id", "role", "createdAt", "turnId", PROVENANCE) or withheld and key == "deleted":
            continue
        if key == "meta" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in ("receipt", PROVENANCE)}
            if isinstance(value.get("revisionRootId"), str) and value["revisionRootId"]:
                value["revisionRootId"] = join_id(sid, value["revisionRootId"])  # the family, as its root's id
            if not value:
                continue
        out[key] = value
    planted, kept = _provenance(rec), out.get("meta", {})
    if planted is not None and isinstance(kept, Mapping):
        out["meta"] = {**kept, IMPORTED_PROVENANCE: planted}
    return out


def _provenance(rec: Mapping[str, Any]) -> Any:
    """The collaboration provenance a message line names (``meta.sessionMessage``, or the wire's top-level
    projection of it; None: none). The copy keeps it only as ``meta.importedSessionMessage``: no delivery of
    this host's ledger backs it (an export carries no ledger rows), so it is not the copy's provenance."""
    meta = rec.get("meta")
    held = meta.get(PROVENANCE) if isinstance(meta, Mapping) else None
    return held if held is not None else rec.get(PROVENANCE)


def _revision(rec: Mapping[str, Any], sid: str) -> dict[str, Any] | None:
    """An exported archived branch with its ids namespaced (None: not one a revisions file could hold)."""
    root, idx = rec.get("rootUserId"), rec.get("revisionIndex")
    if not isinstance(root, str) or not root or type(idx) is not int or not 1 <= idx <= MAX_SEQ:
        return None  # (a variant per regenerate, each a message at least: never more than a session holds)
    out: dict[str, Any] = {"type": rec["type"], "rootUserId": join_id(sid, root), "revisionIndex": idx,
                           "createdAt": to_ms(rec.get("createdAt")) or 0}
    if rec["type"] == REVISION_LIVE:
        count = rec.get("messageCount")
        if type(count) is int and 0 <= count <= MAX_SEQ:
            out["messageCount"] = count
        return out
    raw = rec.get("messages")
    if not isinstance(raw, list):
        return None
    messages: list[dict[str, Any]] = []
    deleted: list[str] = []
    for r in raw:
        m = _message(r, sid) if isinstance(r, Mapping) else None
        if m is not None:
            messages.append(m)
            if _withheld(r):
                deleted.append(m["id"])
    if not messages:
        return None
    out["messages"] = messages
    if deleted:  # the branch's root, tombstoned on the first host: a switch to the branch shows it deleted
        out["deleted"] = sorted(deleted)
    roots = {join_id(sid, mid): root for mid, root in roots_of(rec).items() if _root_of({"projectPath": root.path})}
    if changes := roots_field(messages, roots):  # the root each message stood under: a switch writes it back
        out[ROOTS] = changes
    comps = rec.get("compactions")
    kept = [c for c in (_compaction(r, sid) for r in comps if isinstance(r, Mapping)) if c is not None] \
        if isinstance(comps, list) else []
    if kept:
        out["compactions"] = [{**c, "type": "compaction"} for c in kept]
    return out


def _artifact(rec: Mapping[str, Any], sid: str) -> dict[str, Any] | None:
    """An exported artifact row (``store.artifacts.session_rows``) as the copy carries it, its turn namespaced as
    the copy's turn rows are (None: not a row the copy could list: a path that is not absolute or holds a NUL,
    an op outside its set, a time that is no Unix ms). The path is kept as the export names it, as its lines'
    roots are (the same absolute paths the session lists)."""
    path, op, turn, at = rec.get("path"), rec.get("op"), rec.get("turnId"), rec.get("updatedAt")
    if not isinstance(path, str) or not is_absolute_path(path) or "\x00" in path or op not in OPS:
        return None
    if type(at) is not int or not 0 <= at <= INT64_MAX or not (turn is None or isinstance(turn, str) and turn):
        return None
    return {"path": path, "op": op, "turnId": None if turn is None else join_id(sid, turn), "updatedAt": at}


def _count(value: object) -> int | None:
    """A token count or cost the index can hold (an integer of a JSON line may be past SQLite's 64 bits)."""
    return value if type(value) is int and 0 <= value <= INT64_MAX else None


def _usage(value: object) -> dict[str, Any] | None:
    """An exported turn's usage report, as the index stores it (JSON text): one that could not be written
    back (nested past the encoder's depth, an integer past 64 bits) is left out, the turn kept."""
    if not isinstance(value, Mapping):
        return None
    try:
        orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return dict(value)


def _turn(rec: Mapping[str, Any], sid: str) -> dict[str, Any] | None:
    """An exported turn (its usage) with its id namespaced as the messages' are (None: not an ended turn)."""
    tid, status = rec.get("id"), rec.get("status")
    started, ended = to_ms(rec.get("startedAt")), to_ms(rec.get("endedAt"))
    tin, tout, micros = _count(rec.get("inputTokens")), _count(rec.get("outputTokens")), _count(rec.get("costMicros"))
    if not isinstance(tid, str) or not tid or status not in TURN_ENDED or started is None or ended is None \
            or tin is None or tout is None or micros is None:
        return None
    out: dict[str, Any] = {"id": join_id(sid, tid), "status": status, "inputTokens": tin, "outputTokens": tout,
                           "costMicros": micros, "startedAt": started, "endedAt": max(started, ended)}
    for key in ("providerId", "modelId", "errorCode"):
        if isinstance(rec.get(key), str) and rec[key]:
            out[key] = rec[key]
    if isinstance(rec.get("retryOf"), str) and rec["retryOf"]:
        out["retryOf"] = join_id(sid, rec["retryOf"])
    usage = _usage(rec.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


def _tally_unpaired(unpaired: dict[str, int], rec: Mapping[str, Any]) -> None:
    """The export's calls without their result in ``rec``, the latest line of its message: a call's line before
    the line holding its result, or written again, is one message (``toolCalls`` / ``toolResults`` are counted
    from the lines the import writes: ``store.interchange.importers.common.tool_tally``)."""
    n = sum(1 for block in rec.get("blocks") or () if block.get("type") == "tool_call" and "result" not in block)
    if n or rec["id"] in unpaired:
        unpaired[rec["id"]] = n


def _compaction(rec: Mapping[str, Any], sid: str) -> dict[str, Any] | None:
    cid, through = rec.get("id"), rec.get("throughMessageId")
    if not isinstance(cid, str) or not isinstance(through, str):
        return None
    out = dict(rec)
    out["id"] = join_id(sid, "compaction", cid)
    out["throughMessageId"] = join_id(sid, through)
    if isinstance(rec.get("firstKeptMessageId"), str):
        out["firstKeptMessageId"] = join_id(sid, rec["firstKeptMessageId"])
    tail = rec.get("retainedTail")
    if isinstance(tail, list):
        out["retainedTail"] = [{**m, "id": join_id(sid, m["id"])} if isinstance(m, Mapping)
                               and isinstance(m.get("id"), str) else m for m in tail]
    return out


__all__ = ["SOURCE", "discover", "parse"]
