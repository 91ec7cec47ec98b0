"""Compare a transcript file with what the index says it covers, and plan the repair.

The index records, per session, the transcript ``epoch`` (a token in the header
that changes whenever the whole file is rewritten) and ``indexed_len`` (bytes
of the file its rows cover). A clean boot is one header read and one ``stat``
per session; a longer file with the same epoch is indexed from ``indexed_len``;
anything else (other epoch, shorter file) is reindexed in full.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import orjson

from store import approvals, artifacts, assistant_edit, orphans, receipts, thread_meta, trash, turns
from store.collab import DELIVERED_META
from store.config.settings_rules import THINKING_LEVELS
from store.errors import CorruptData, classify_os_error
from store.fsutil import open_nofollow
from store.ids import remapped_message_id
from store.indexing import index
from store.indexing.index import CompactionRecord, IndexRecord
from store.indexing.sql_lists import in_chunks
from store.interchange.import_rebuild import restore_imported
from store.interchange.origin_history import origin_row
from store.jsonio import loads_line, now_rfc3339
from store.queue import PERMISSION_MODES
from store.queue import forget_session as forget_queue
from store.revisions import (
    RevisionFile,
    family_of,
    live_stamps,
    read_revisions,
    restore_rows,
    revision_rows,
    sync_active,
)
from store.rules import COLLAB_INPUT_ID_PREFIX
from store.transcripts.deleted_log import LoggedDelete
from store.transcripts.records import Root, meta_of, rfc3339_to_ms, root_named
from store.transcripts.session_files import REVISIONS_SUFFIX, PendingDelete
from store.transcripts.transcript import (
    IMPORT_RECEIPT,
    MAX_LINE_BYTES,
    bounded_lines,
    header_artifacts,
    header_receipts,
)


@dataclass
class TailScan:
    """Complete lines from a start offset to the last complete line."""

    start: int
    end: int
    messages: list[IndexRecord] = field(default_factory=list)
    compactions: list[CompactionRecord] = field(default_factory=list)
    tombstones: dict[str, bool] = field(default_factory=dict)
    session_info: dict[str, Any] | None = None
    header: dict[str, Any] | None = None
    bad_lines: list[int] = field(default_factory=list)
    unknown_lines: int = 0
    torn_tail_bytes: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """``approval_decision`` lines, in file order (applied to a request still pending: an answer whose row
    did not commit after its line did; ``store.approvals.apply_decision_lines``)."""
    import_receipt: dict[str, Any] | None = None
    """The newest ``import_receipt`` line: which keyed ``import.sessions`` request wrote the session last, and
    its answer for it (:func:`restore_last_import`)."""
    line_receipts: list[dict[str, Any]] = field(default_factory=list)
    """Receipts that ``tombstone`` and ``session_info`` lines carry (``receipt``): the effect and its
    receipt in one fsynced line; a reconcile restores a row the database lost (:func:`restore_receipt`)."""
    first_import_info: int | None = None
    """Offset of the first ``session_info`` line naming an ``importOrigin``: the line a new import's write
    ends with (the lines before it are that import's; :func:`store.interchange.import_rebuild.restore_imported`)."""
    root: Root | None = None
    """The project root the scanned lines so far leave in effect (``records.root_named``; None: none of them
    names one). Each message line's ``IndexRecord.root`` is the one in effect where it stands."""


@dataclass
class ReconcilePlan:
    kind: str  # "clean" | "tail" | "full" | "missing"
    file_len: int = 0
    epoch: str | None = None
    scan: TailScan | None = None
    revisions: RevisionFile | None = None
    """The session's revisions file, read when the header carries an ``activateRevision`` receipt: its
    response lists the branch rows, which must follow the files before it is rebuilt."""
    archived: RevisionFile | None = None
    """The session's revisions file on a full reindex (None: no such file): the archived branches keep the
    lines a regenerate or an edit took out of the transcript, each with the ``meta.receipt`` its append
    wrote, which a rebuilt index must still answer (:func:`restore_archived_receipts`)."""


_SCAN_CHUNK = 8 << 20


def open_transcript(path: Path) -> int:
    """A transcript is a regular file reached without a symlink (a planted link is refused, never followed)."""
    try:
        return open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise classify_os_error(exc, f"read transcript {path}") from None
        raise CorruptData(f"transcript {path} is a symbolic link or not a regular file: refused, not read "
                          f"({exc.strerror or exc})",
                          data={"path": str(path), "reason": "not_a_regular_file"}) from None


def read_header(path: Path) -> dict[str, Any] | None:
    """Parse the first line (the session header); None if absent or unreadable."""
    try:
        fd = open_transcript(path)
    except FileNotFoundError:
        return None
    try:
        return header_of(fd)
    finally:
        os.close(fd)


def header_of(fd: int) -> dict[str, Any] | None:
    """:func:`read_header` of a transcript open as ``fd`` (read from offset 0; its position moves)."""
    os.lseek(fd, 0, os.SEEK_SET)
    head = b""
    nl = -1
    while nl < 0 and len(head) < 1 << 20:  # the header line only, in small reads
        chunk = os.read(fd, 4096 if not head else len(head))
        if not chunk:
            break
        head += chunk
        nl = head.find(b"\n")
    if nl < 0:
        return None
    line = head[: nl + 1]
    try:
        rec = loads_line(line)
    except ValueError:
        return None
    return rec if rec.get("type") == "session" else None


_EPOCH_KEY: Final = b'"epoch":"'
_HEAD_PEEK: Final = 4096


def header_start(fd: int) -> dict[str, Any] | None:
    """The header's leading fields, its ``epoch`` among them, without parsing the rest of the line: what the
    clean-file check of every window read needs. A header carries the receipts and the collaboration answers
    of earlier rewrites and the session's artifact rows (tens of KiB: parsing 30 KB of it costs ~65 us, a
    fifth of a window read), but its first fields are scalars written in a fixed order (``header_line``):
    the first 4 KiB cut right after the epoch's value and closed is a JSON object of them. Anything else
    (no epoch there, an escape in it, a header of another shape) is read whole, by :func:`header_of`."""
    os.lseek(fd, 0, os.SEEK_SET)
    head = os.read(fd, _HEAD_PEEK)
    at = head.find(_EPOCH_KEY)
    end = head.find(b'"', at + len(_EPOCH_KEY)) if at > 0 else -1
    if end > 0 and b"\\" not in head[at:end] and b"\n" not in head[:end]:
        try:
            rec = orjson.loads(head[: end + 1] + b"}")
        except orjson.JSONDecodeError:
            rec = None
        if isinstance(rec, dict) and rec.get("type") == "session" and isinstance(rec.get("epoch"), str):
            return rec
    return header_of(fd)


def scan_from(path: Path, start: int, stop: int | None = None) -> TailScan:
    """Parse every complete line from byte ``start`` (which must be a line start).

    The file is opened without following a symlink and read in bounded chunks up
    to the size ``fstat`` reports when it is opened (or to ``stop``, a line end,
    when that comes first).
    """
    fd = open_transcript(path)
    try:
        size = os.fstat(fd).st_size
        if stop is not None:
            size = min(size, stop)
        scan = TailScan(start=start, end=start)
        for offset, end, line, rest_blank in bounded_lines(fd, start, size, limit=MAX_LINE_BYTES,
                                                           chunk=_SCAN_CHUNK):
            if line is None:
                scan.torn_tail_bytes = size - offset
                break
            scan.end = end
            if not line:
                scan.bad_lines.append(offset)
                continue
            try:
                rec = loads_line(line)
            except ValueError:
                if rest_blank and line.strip(b"\x00\n") == b"":
                    scan.torn_tail_bytes = size - offset
                    scan.end = offset
                    break
                scan.bad_lines.append(offset)
                continue
            _take(scan, rec, offset, line)
    finally:
        os.close(fd)
    return scan


def scan_lines(lines: Sequence[bytes], start: int, records: Sequence[Mapping[str, Any]] | None = None) -> TailScan:
    """The scan of lines already in memory (just written at ``start``): what :func:`scan_from` would find.

    ``records``: the lines parsed already (one per line), so nothing is parsed twice.
    """
    scan = TailScan(start=start, end=start)
    offset = start
    for i, line in enumerate(lines):
        rec = dict(records[i]) if records is not None else loads_line(line)
        _take(scan, rec, offset, line)
        offset += len(line)
    scan.end = offset
    return scan


def _take(scan: TailScan, rec: dict[str, Any], offset: int, line: bytes) -> None:
    kind = rec.get("type")
    if kind == "message" and isinstance(rec.get("id"), str):
        scan.messages.append(IndexRecord(rec, offset, len(line), line=line, root=scan.root))
        # a collaboration input (its id the host's, never a client's): its deliver's receipt
        delivered = meta_of(rec).get(DELIVERED_META) if rec["id"].startswith(COLLAB_INPUT_ID_PREFIX) else None
        if isinstance(delivered, dict) and isinstance(delivered.get("receipt"), dict):
            scan.line_receipts.append(delivered["receipt"])
    elif kind == "compaction":
        scan.compactions.append(CompactionRecord(rec, offset, len(line)))
    elif kind == "tombstone" and isinstance(rec.get("messageId"), str):
        scan.tombstones[rec["messageId"]] = bool(rec.get("deleted", True))
        if isinstance(rec.get("receipt"), dict):
            scan.line_receipts.append(rec["receipt"])
    elif kind == "session_info":
        carried = rec.pop("receipt", None)
        scan.session_info = {**(scan.session_info or {}), **rec}
        scan.root = root_named(rec) or scan.root
        if scan.first_import_info is None and "importOrigin" in rec:
            scan.first_import_info = offset
        if isinstance(carried, dict):
            scan.line_receipts.append(carried)
    elif kind == "session" and offset == 0:
        scan.header = rec
    elif kind == IMPORT_RECEIPT:
        scan.import_receipt = rec
    elif kind == "approval_decision":
        scan.decisions.append(rec)  # a user's decision (store/approvals.py): the database holds its state
    else:
        scan.unknown_lines += 1


def dedupe(messages: list[IndexRecord]) -> list[IndexRecord]:
    """Keep-last content at first position (the transcript reader rule)."""
    order: dict[str, int] = {}
    out: list[IndexRecord] = []
    for item in messages:
        mid = item.record["id"]
        if mid in order:
            out[order[mid]] = item
        else:
            order[mid] = len(out)
            out.append(item)
    return out


def plan_reconcile(path: Path, indexed_len: int, file_epoch: str | None) -> ReconcilePlan:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ReconcilePlan(kind="missing")
    if not stat.S_ISREG(st.st_mode):
        raise CorruptData(f"transcript {path} is a symbolic link or not a regular file: refused, not read",
                          data={"path": str(path), "reason": "not_a_regular_file"})
    size = st.st_size
    header = read_header(path)
    epoch = header.get("epoch") if header else None
    if header is not None and epoch == file_epoch and indexed_len > 0 and size >= indexed_len:
        if size == indexed_len:
            return ReconcilePlan(kind="clean", file_len=size, epoch=epoch)
        scan = scan_from(path, indexed_len)
        if scan.end == indexed_len:
            return ReconcilePlan(kind="clean", file_len=indexed_len, epoch=epoch, scan=scan)
        return ReconcilePlan(kind="tail", file_len=scan.end, epoch=epoch, scan=scan)
    scan = scan_from(path, 0)
    revisions_path = path.with_name(f"{path.name.removesuffix('.jsonl')}{REVISIONS_SUFFIX}")
    archived = read_revisions(revisions_path, tool_lines=True) if os.path.lexists(revisions_path) else None
    revisions = None
    if any(rec.get("method") == "session.activateRevision" for rec in header_receipts(scan.header)):
        revisions = archived if archived is not None else RevisionFile()
    return ReconcilePlan(kind="full", file_len=scan.end, epoch=(scan.header or {}).get("epoch"), scan=scan,
                         revisions=revisions, archived=archived)


def plan_catch_up(path: Path, indexed_len: int, file_epoch: str | None, *, far: int) -> ReconcilePlan:
    """:func:`plan_reconcile` for a catch-up that indexes a far tail in bounded steps
    (``store.indexing.backlog``): a tail more than ``far`` bytes past the index's mark, in the file the
    mark counts, is not read here (its lines are read a slice at a time by the steps, and the rest from
    the mark they leave): the plan is ``tail`` with no scan and the file's size as ``file_len``, which the
    caller plans again from the mark before applying (:func:`replan_from_mark`). Anything else is
    :func:`plan_reconcile`'s plan. Without this, a catch-up held every line of the tail parsed at once
    before the steps read them again: memory grew with the tail (up to the index lag, 64 MiB of lines)."""
    try:
        size = os.lstat(path).st_size
    except FileNotFoundError:
        return ReconcilePlan(kind="missing")
    if indexed_len > 0 and size - indexed_len > far:
        header = read_header(path)
        if header is not None and header.get("epoch") == file_epoch:
            return ReconcilePlan(kind="tail", file_len=size, epoch=file_epoch)
    return plan_reconcile(path, indexed_len, file_epoch)


def replan_from_mark(conn: Any, session_id: str, path: Path, plan: ReconcilePlan,
                     planned_from: tuple[int, str | None]) -> ReconcilePlan:
    """``plan`` (made from the mark ``planned_from``) as it stands in the transaction about to apply it:
    planned again from the session's mark when bounded steps moved it meanwhile, or when ``plan`` is a
    far tail :func:`plan_catch_up` left unread (the steps leave at most their budget past the mark)."""
    if plan.kind != "tail":
        return plan
    mark = index.index_mark(conn, session_id)
    if mark is None:  # the row went meanwhile: the whole file, as a session the index does not know
        return plan_reconcile(path, 0, None) if plan.scan is None else plan
    if mark != planned_from or plan.scan is None:
        return plan_reconcile(path, mark[0], mark[1])
    return plan


def clean_plan(fd: int, indexed_len: int, file_epoch: str | None) -> ReconcilePlan | None:
    """:func:`plan_reconcile`'s answer for a transcript open as ``fd`` (:func:`open_transcript`) when it is
    the usual one, ``clean`` with nothing past the index's mark: its size is the mark and its header's epoch
    the index's. ``None`` otherwise (ask :func:`plan_reconcile`). A reader that goes on to read the window
    uses the same descriptor: one open, no ``lstat`` (``open_transcript`` refuses what ``lstat`` would)."""
    size = os.fstat(fd).st_size
    if indexed_len <= 0 or size != indexed_len:
        return None
    header = header_start(fd)
    if header is None or header.get("epoch") != file_epoch:
        return None
    return ReconcilePlan(kind="clean", file_len=size, epoch=file_epoch)


def plan_missing_bytes(path: Path, indexed_len: int, epoch: str | None, stop: int) -> ReconcilePlan:
    """The bytes ``[indexed_len, stop)`` of a transcript whose index stops short of ``stop`` (a line
    end): a tail plan for exactly them, to apply before an op indexes the lines from ``stop`` on."""
    scan = scan_from(path, indexed_len, stop)
    return ReconcilePlan(kind="tail", file_len=scan.end, epoch=epoch, scan=scan)


def repair_session(conn: Any, session_id: str, path: Path, *, now_ms: int) -> dict[str, Any]:
    """Bring one session's index in line with its transcript (the DB writer's repair of a failed
    deferred index op): index whatever lies past the mark. Nothing to do for a session the user
    deleted meanwhile; a row that vanished under its live transcript otherwise (seed 003 §5, D318:
    the op failed for want of it) is put back and the transcript indexed whole."""
    mark = index.index_mark(conn, session_id)
    if mark is None:
        if orphans.was_deleted(conn, session_id):
            return {"kind": "gone"}
        plan = plan_reconcile(path, 0, None)
        return {"kind": "gone"} if plan.kind == "missing" else apply_plan(conn, session_id, plan, now_ms=now_ms)
    plan = plan_reconcile(path, mark[0], mark[1])
    if plan.kind == "missing" or (plan.kind == "clean" and plan.file_len == mark[0]):
        return {"kind": plan.kind}
    return apply_plan(conn, session_id, plan, now_ms=now_ms)


_BACK_CHUNK = 16 << 10
_BACK_LIMIT = 16 << 20


def last_message_line(path: Path, size: int) -> tuple[int, int] | None | bool:
    """The span ``(offset, length)`` of the transcript's last message line within its first ``size``
    bytes, read backwards in growing windows: ``None`` if it has no message line, ``False`` if none
    was found within the bound (a very long run of other lines at the end: not checked here)."""
    fd = open_transcript(path)
    try:
        window = min(size, _BACK_CHUNK)
        while True:
            start = size - window
            os.lseek(fd, start, os.SEEK_SET)
            data = b""
            while len(data) < window:
                chunk = os.read(fd, window - len(data))
                if not chunk:
                    break
                data += chunk
            pos = data.rfind(b"\n") + 1  # a torn tail after the last newline is no line
            first = 0  # where the first complete line of the window starts (the window may cut one)
            if start > 0:
                cut = data.find(b"\n")
                first = cut + 1 if cut >= 0 else len(data)
            while pos > first:
                nl = data.rfind(b"\n", first, pos - 1)
                begin = nl + 1 if nl >= 0 else first
                line = data[begin:pos]
                try:
                    rec = loads_line(line)
                except ValueError:
                    rec = {}
                if rec.get("type") == "message" and isinstance(rec.get("id"), str):
                    return start + begin, len(line)
                pos = begin
            if start == 0:
                return None
            if window >= _BACK_LIMIT:
                return False
            window = min(size, window * 4)
    finally:
        os.close(fd)


def verify_clean(conn: Any, session_id: str, path: Path, plan: ReconcilePlan) -> ReconcilePlan:
    """A "clean" verdict (the mark equals the file's length) checked against the file itself.

    The mark says the index covers every byte; the file's last message line must then have its
    row. If it has not (a mark moved over lines that were never indexed), the verdict is a full
    reindex instead: an acknowledged line no read can see is lost data.
    """
    if plan.kind != "clean":
        return plan
    span = last_message_line(path, plan.file_len)
    if span is None:
        ok = not index.has_messages(conn, session_id)
    elif span is False:
        ok = False
    else:
        assert isinstance(span, tuple)
        ok = index.has_message_line(conn, session_id, span[0], span[1])
    if ok:
        return plan
    scan = scan_from(path, 0)
    return ReconcilePlan(kind="full", file_len=scan.end, epoch=(scan.header or {}).get("epoch"), scan=scan)


def session_info_settings(info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The session settings a ``session_info`` line sets. A value of another JSON type than the setting's,
    or a thinking level or permission mode the host does not know (a line damaged by hand), sets nothing; a
    ``projectPath`` that is not text names no project, as :func:`store.transcripts.records.root_named`
    reads it for the lines after it."""
    if not info:
        return {}
    settings: dict[str, Any] = {}
    for k in ("title", "projectPath", "providerId", "modelId", "mode", "thinkingLevel", "permissionMode"):
        if k not in info:
            continue
        value = info[k]
        if isinstance(value, str) or (value is None and k in ("projectPath", "providerId", "modelId")):
            settings[k] = value
        elif k == "projectPath":
            settings[k] = None
    if settings.get("thinkingLevel") not in (None, *THINKING_LEVELS):
        del settings["thinkingLevel"]
    if settings.get("permissionMode") not in (None, *PERMISSION_MODES):
        del settings["permissionMode"]
    return settings


def imported_source(info: Mapping[str, Any] | None) -> str | None:
    """The ``source`` an import wrote into the session_info line (kept across an index rebuild)."""
    value = (info or {}).get("source")
    return value if isinstance(value, str) and value else None


def restore_import_origin(conn: Any, session_id: str, info: Mapping[str, Any] | None, *, now_ms: int) -> bool:
    """Re-create the session_import_origins row an import recorded in its session_info line (a plugin's
    import records the row whole: its ``history`` is the row's origin_json, ``importedAt`` its time)."""
    origin = (info or {}).get("importOrigin")
    if not isinstance(origin, Mapping):
        return False
    keys = ("pluginId", "sourceId", "externalId")
    if not all(isinstance(origin.get(k), str) for k in keys):
        return False
    raw = origin.get("history")
    history: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    label = origin.get("label") if isinstance(origin.get("label"), str) else None
    at = origin.get("importedAt")
    conn.execute(
        "INSERT OR IGNORE INTO session_import_origins(plugin_id, source_id, external_id, session_id, source_label, "
        "origin_json, created_at) VALUES (?,?,?,?,?,?,?)",
        (origin["pluginId"], origin["sourceId"], origin["externalId"], session_id, label,
         orjson.dumps(dict(history)).decode(), at if type(at) is int and at >= 0 else now_ms),
    )
    return True


def restore_last_import(conn: Any, session_id: str, line: Mapping[str, Any]) -> None:
    """Record in the session's import record (``origin_json.lastImport``) the keyed import an
    ``import_receipt`` line names: the lines it ends were written by that request, whose index commit the
    database lost (a kill between the write and the commit). The request's retry then finds its own write
    there and answers it as its first try would have (``store.interchange.imports.prepare_unit``)."""
    receipt, answer = line.get("receipt"), line.get("answer")
    if not isinstance(receipt, Mapping) or receipts.key_of_record(receipt) is None or not isinstance(answer, Mapping):
        return
    row = origin_row(conn, session_id)
    if row is None:
        return
    origin = dict(row["origin"])
    origin["lastImport"] = {"receipt": dict(receipt), "answer": dict(answer)}
    conn.execute("UPDATE session_import_origins SET origin_json = ? WHERE session_id = ?",
                 (orjson.dumps(origin).decode(), session_id))


def _insert_row(conn: Any, session_id: str, header: Mapping[str, Any] | None, info: Mapping[str, Any] | None, *,
                file_epoch: str | None, now_ms: int) -> None:
    """The row of a session the index lacks, as its header and newest ``session_info`` line say."""
    settings = session_info_settings(info)
    index.insert_session(
        conn,
        session_id,
        now_ms=now_ms,
        created_at_ms=rfc3339_to_ms((header or {}).get("createdAt"), now_ms),
        title=str(settings.get("title") or ""),
        project_path=settings.get("projectPath"),
        settings=settings,
        file_epoch=file_epoch,
        source=imported_source(info),
    )
    restore_import_origin(conn, session_id, info, now_ms=now_ms)


def _restore_meta(conn: Any, session_id: str, info: Mapping[str, Any] | None, *, now_ms: int) -> None:
    thread_meta.restore_from_info(conn, session_id, info, now_ms=now_ms)
    trash.restore_from_info(conn, session_id, info)


def created_answer(conn: Any, session_id: str, created_at_ms: int, info_line: bytes, *,
                   now_ms: int) -> dict[str, Any]:
    """The summary ``session.create``'s commit will answer for a new transcript made of a header created at
    ``created_at_ms`` and the ``session_info`` line ``info_line``: the rows :func:`apply_plan` inserts for it,
    read and rolled back (:func:`store.indexing.index.dry_run`). The id of its project, when ``info`` names a
    new one, is reserved for good first (:func:`store.indexing.index.reserve_project_id`), not its row: the
    project id the answer names is then the one the commit gives it, and a create that fails leaves no
    project behind."""
    info = loads_line(info_line)
    path = session_info_settings(info).get("projectPath")
    if path:
        index.reserve_project_id(conn, path, now_ms)
    header = {"createdAt": now_rfc3339(created_at_ms)}

    def insert(c: Any) -> dict[str, Any]:
        _insert_row(c, session_id, header, info, file_epoch=None, now_ms=now_ms)
        _restore_meta(c, session_id, info, now_ms=now_ms)
        return index.public_session(index.require_session(c, session_id))

    return index.dry_run(conn, insert)


def restore_lost_turns(conn: Any, session_id: str, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Before ``records`` are indexed: the turns whose row the database lost with the rows of the lines naming
    them get a row again (:func:`store.turns.restore_named`: ``aborted``, ``INDEX_LOST``), so the rows link to
    them and a retried start does not run them anew. The whole database lost (the session's row too: no line
    has a row), or only its newest commits (a lost ``-wal``, the main file kept): a turn's row commits before
    any line naming it is appended, so a line the index lacks naming a turn with no row lost it with the
    database. A turn a line the index holds names is left alone: that line was appended while the turn had
    no row (never started), and the rows linked to none. The ids restored."""
    ids = sorted({mid for rec in records if isinstance(mid := rec.get("id"), str)}
                 | {remapped_message_id(session_id, mid) for rec in records
                    if isinstance(mid := rec.get("id"), str)})
    held: set[str] = set()
    rows = conn.execute("SELECT 1 FROM messages WHERE session_id = ? LIMIT 1", (session_id,)).fetchone()
    for marks, chunk in in_chunks(ids if rows is not None else []):  # a rebuilt session has none yet
        held.update(r[0] for r in conn.execute(
            f"SELECT id FROM messages WHERE session_id = ? AND id IN ({marks})", (session_id, *chunk)))

    def has_row(rec: Mapping[str, Any]) -> bool:
        mid = rec.get("id")
        return isinstance(mid, str) and (mid in held or remapped_message_id(session_id, mid) in held)

    named_by_held = {rec.get("turnId") for rec in records if has_row(rec)}
    return turns.restore_named(conn, session_id, (rec for rec in records
                                                  if not has_row(rec) and rec.get("turnId") not in named_by_held))


def apply_plan(conn: Any, session_id: str, plan: ReconcilePlan, *, now_ms: int) -> dict[str, Any]:
    """Bring the index in line with the transcript (runs in the DB writer's transaction).

    A receipt the file's header carries (the transcript was created, forked or
    rewritten by a request with a ``submissionId``; a rewrite's header also
    carries the receipts of the rewrites before it) gets its row back if the
    database lost it, so a retry after a crash is answered from it.

    Returns a small report: ``{"kind", "restoredRow", "indexed", "removed", "restoredReceipt"}``.
    """
    report: dict[str, Any] = {"kind": plan.kind, "restoredRow": False, "indexed": 0, "removed": 0,
                              "restoredReceipt": False}
    row = index.session_row(conn, session_id)
    scan = plan.scan
    if plan.kind == "missing":
        # The transcript is gone (the source of truth has no messages): the index
        # must not claim any. The row (title, settings) stays; the next append
        # starts a new file.
        if row is not None and (row["_indexedLen"] or row["messageCount"]):
            before = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]
            index.clear_session_index(conn, session_id)
            index.set_index_mark(conn, session_id, 0, None)
            report["removed"] = before
        return report
    if plan.kind == "clean" or scan is None:
        if row is not None and plan.kind == "clean" and row["_indexedLen"] != plan.file_len:
            index.set_index_mark(conn, session_id, plan.file_len, plan.epoch)
        return report
    settings = session_info_settings(scan.session_info)
    # a tail's lines before any session_info line of its own stand under the root its row holds before them
    under = Root(artifacts.session_root(conn, session_id)) if row is not None and plan.kind != "full" else None
    if row is None:
        _insert_row(conn, session_id, scan.header, scan.session_info, file_epoch=plan.epoch, now_ms=now_ms)
        report["restoredRow"] = True
    elif settings:
        index.update_session_settings(conn, session_id, settings, now_ms=now_ms)
    _restore_meta(conn, session_id, scan.session_info, now_ms=now_ms)
    if scan.import_receipt is not None:
        restore_last_import(conn, session_id, scan.import_receipt)
    if plan.kind == "full":
        before = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)).fetchone()[0]
        msgs = dedupe(scan.messages)
        deleted = [mid for mid, flag in scan.tombstones.items() if flag]
        restore_lost_turns(conn, session_id, [item.record for item in msgs])
        index.reindex_session(
            conn, session_id, msgs, scan.compactions, deleted,
            indexed_len=plan.file_len, file_epoch=plan.epoch, now_ms=now_ms,
        )
        report["indexed"] = len(msgs)
        report["removed"] = max(0, before - len(msgs))
        if msgs:
            last = conn.execute(
                "SELECT MAX(created_at) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
            if last is not None:
                conn.execute(
                    "UPDATE sessions SET updated_at = MAX(updated_at, ?) WHERE id = ?", (last, session_id)
                )
        written = scan.header.get("writtenAt") if scan.header is not None else None
        if isinstance(written, int) and not isinstance(written, bool):  # a rewrite's time: as its commit set it
            index.touch_session(conn, session_id, written)
    else:
        restore_lost_turns(conn, session_id, [item.record for item in scan.messages])
        tail = scan.messages if under is None else [item if item.root is not None else replace(item, root=under)
                                                     for item in scan.messages]
        index.index_messages(
            conn, session_id, tail, indexed_len=plan.file_len, file_epoch=plan.epoch,
            now_ms=now_ms, touch=False,
        )
        if scan.messages:  # the row moves as the appends' own commits would have moved it (as in "full")
            newest = max(rfc3339_to_ms(item.record.get("createdAt"), now_ms) for item in scan.messages)
            index.touch_session(conn, session_id, newest)
        index.index_compactions(conn, session_id, scan.compactions, now_ms)
        for mid, flag in scan.tombstones.items():
            index.set_deleted(conn, session_id, mid, flag)
        report["indexed"] = len(scan.messages)
    if plan.revisions is not None and plan.kind == "full":
        # the branch rows as the files say, before an activateRevision response is rebuilt from them (a
        # crash after the rewrite, before the rows changed, left them as they were before the switch)
        records = [item.record for item in dedupe(scan.messages)]
        restore_rows(conn, session_id, plan.revisions, records, now_ms)
        sync_active(conn, session_id, live_stamps(records))
    if scan.header is not None:
        own = scan.header.get("receipt")
        # the earlier rewrites' receipts the header carried forward (``receipts``), then its own
        for rec in header_receipts(scan.header):
            restored = restore_receipt(conn, session_id, rec, now_ms=now_ms)
            if rec == own:
                report["restoredReceipt"] = restored
    for carried in scan.line_receipts:  # a crash between a line's fsync and its receipt's commit
        restore_receipt(conn, session_id, carried, now_ms=now_ms)
    if plan.kind == "full" and scan.header is not None:
        # the rows an older host's last rewrite's header carries: a cut took their lines out of every file (seed
        # 003 §4.10; this host carries them in the revisions file, below)
        artifacts.restore_carried(conn, session_id, header_artifacts(scan.header))
    if plan.archived is not None and plan.kind == "full":
        # the files the archived branches' Write/Edit lines produced: the live index listed them when they were
        # written and a regenerate, an edit or a switch took nothing from the list (seed 003 §4.10)
        artifacts.record_archived(conn, session_id, plan.archived.tool_lines, now_ms)
        # and the rows a rewrite's cut or an import carried there (``artifact`` lines), after every line: of
        # one time the carried row, the live index's, wins
        artifacts.restore_carried(conn, session_id, plan.archived.artifacts.values())
        for carried in plan.archived.line_receipts:  # a keyed saveActiveRevision's, on its reference line
            restore_receipt(conn, session_id, carried, now_ms=now_ms)
        restore_archived_receipts(conn, session_id, plan.archived, [item.record for item in dedupe(scan.messages)],
                                  now_ms=now_ms)
    if scan.decisions:  # the same for an answer's decision line: its row and its receipt
        approvals.apply_decision_lines(conn, session_id, scan.decisions, now_ms)
    if report["restoredRow"] and plan.kind == "full":
        # an imported session's usage turn rows and model, derived from its lines as the import derived them
        restore_imported(conn, session_id, scan.session_info, scan.messages, scan.compactions, plan.archived,
                         first_import_end=scan.first_import_info, settings=settings)
    return report


def restore_archived_receipts(conn: Any, session_id: str, archived: RevisionFile,
                              live: Sequence[Mapping[str, Any]], *, now_ms: int) -> int:
    """The append receipts of lines that left the transcript for an archived branch (a regenerate, an
    edit, ``activateRevision``): rows a rebuilt index lost, so a retried append is answered, not written
    again at the end of the transcript. Runs after the live lines' own receipts were restored (one of
    those wins: a receipt is never overwritten).

    The answer is the one the append gave: the ``seq`` its receipt recorded (``extra.seq``), or, for a
    line written before receipts recorded it, its place in the transcript then, which is the family's
    place now (the branch hung under the same parent) plus its place in the branch. Such an older line
    whose family no live user message continues is skipped (its place is unknown: a retry writes again).
    The turn is not bound (turn rows are database state, as for a live line's rebuilt receipt). Returns
    the rows added."""
    family_seq: dict[str, int] = {}
    for seq, rec in enumerate(live, start=1):
        if rec.get("role") == "user":
            family_seq.setdefault(family_of(rec), seq)
    added = 0
    for (root, _index), entry in sorted(archived.entries.items()):
        start = family_seq.get(root)
        if entry.live:
            continue
        for offset, rec in enumerate(entry.messages):
            meta = rec.get("meta")
            carried = meta.get("receipt") if isinstance(meta, Mapping) else None
            key = receipts.key_of_record(carried, default_method="session.appendMessage")
            if (key is None or not isinstance(rec.get("id"), str)
                    or receipts.exists(conn, key.client_id, key.submission_id)):
                continue
            extra = carried.get("extra") if isinstance(carried, Mapping) else None
            said = extra.get("seq") if isinstance(extra, Mapping) else None
            if isinstance(said, int) and not isinstance(said, bool) and said >= 1:
                seq = said
            elif start is not None:
                seq = start + offset
            else:
                continue
            index.store_append_receipt(conn, session_id, rec, index.message_ref(session_id, seq, rec, None), now_ms)
            added += 1
    return added


ANSWER_CARRIED: Final[Mapping[str, str | None]] = {
    "session.create": None, "session.fork": None, "session.rename": None, "session.update": None,
    "session.updateMetadata": None, "sessions.trash": "session", "sessions.restore": "session",
    "session.truncateFrom": "session", "session.replaceMessages": "session", "session.activateRevision": "session",
    "session.assistantEdit": "session", "plans.respond": "session",
}
"""The methods whose receipt in a transcript carries the answer they gave (``extra.response``), and where
that answer names its session: the summary itself (None) or under that key."""


def carried_answer(method: Any, session_id: str, extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer a receipt in a transcript carries (``extra.response``), if it is one of ``method``'s about
    ``session_id``; ``None`` for a receipt written before the field (or not trusted: another session's)."""
    if not isinstance(method, str) or method not in ANSWER_CARRIED:
        return None
    said = extra.get("response")
    if not isinstance(said, Mapping):
        return None
    where = ANSWER_CARRIED[method]
    summary = said if where is None else said.get(where)
    if not isinstance(summary, Mapping) or summary.get("id") != session_id:
        return None
    return dict(said)


def _approval_stands(conn: Any, extra: Mapping[str, Any]) -> bool:
    """Whether the plan approval a ``plans.respond`` answer names still has its row: the answer that receipt
    carries counts only once the row is gone with a lost database. Its mode line is written before the row
    changes: while the row is there, a commit that failed or never came is finished by the retry (or by
    boot, ``store/plan_recovery.py``), which answers then."""
    said = extra.get("response")
    approval = said.get("approval") if isinstance(said, Mapping) else None
    rid = approval.get("requestId") if isinstance(approval, Mapping) else None
    return not isinstance(rid, str) or conn.execute(
        "SELECT 1 FROM plan_approvals WHERE request_id = ?", (rid,)).fetchone() is not None


def rebuild_response(conn: Any, session_id: str, rec: Mapping[str, Any]) -> Any | None:
    """The terminal response of a file-carried receipt, from the state its file left behind; the answer it
    carries (``extra.response``, :data:`ANSWER_CARRIED`) when it does.

    ``None`` when the method's response cannot be rebuilt from that state
    (then no row is restored and a retry runs the request again).
    """
    method = rec.get("method")
    raw_extra = rec.get("extra")
    extra: Mapping[str, Any] = raw_extra if isinstance(raw_extra, Mapping) else {}
    if method == "session.delete":
        return {"sessionId": session_id, "deleted": True}
    if method in ("session.deleteMessage", "session.restoreMessage"):
        asked = extra.get("messageId")
        return {"messageId": asked, "deleted": method == "session.deleteMessage"} if isinstance(asked, str) else None
    if method == "sessions.purge":
        return {"sessionId": session_id, "purged": True}
    if method == "session.appendMessage":  # a line a rewrite dropped: its header carries the answer it gave
        said = extra.get("response")
        return dict(said) if isinstance(said, Mapping) and isinstance(said.get("message"), Mapping) else None
    if method == "collab.deliver":  # its delivery's input line carries the answer it gave
        said = extra.get("response")
        return dict(said) if isinstance(said, Mapping) and isinstance(said.get("delivery"), Mapping) else None
    if method == "session.saveActiveRevision":  # its reference line carries the answer it gave
        said = extra.get("response")
        return dict(said) if isinstance(said, Mapping) and isinstance(said.get("revision"), Mapping) else None
    if method == "plans.respond" and _approval_stands(conn, extra):
        return None  # its commit failed or never came, the database whole: the retry (or boot) finishes it
    row = index.session_row(conn, session_id)
    if row is None:
        return None
    said = carried_answer(method, session_id, extra)
    if said is not None:
        return said
    summary = index.public_session(row)
    if method in ("session.create", "session.fork", "session.rename", "session.update", "session.updateMetadata"):
        return summary
    if method == "session.assistantEdit":
        return assistant_edit.response(summary, extra)
    if method in ("sessions.trash", "sessions.restore"):
        # the time its line recorded: a restore since then does not change what the trash answered
        says, at = trash.trashed_at_of(extra)
        if method == "sessions.trash" and (not says or at is None):
            return None
        return {"session": {**summary, "deletedAt": at if method == "sessions.trash" else None}}
    if method == "session.replaceMessages":
        return {"session": summary}
    if method == "session.truncateFrom":
        removed = extra.get("removed")
        if not isinstance(removed, int) or isinstance(removed, bool):
            return None
        return {"session": summary, "removed": removed}
    if method == "session.activateRevision":
        root = extra.get("rootUserId")
        if not isinstance(root, str):
            return None
        return {"session": summary, "revisions": revision_rows(conn, session_id, root)}
    return None


def forget_deleted(conn: Any, pending: PendingDelete, *, now_ms: int) -> None:
    """A delete that began (its marker) and did not finish, on the index: the session's rows and queue
    gone, the receipt the marker carries recorded (boot, and a session actor catching up)."""
    sid = pending.session_id
    index.delete_session_rows(conn, sid, now_ms=now_ms)
    forget_queue(conn, sid)
    if pending.receipt is not None:
        restore_receipt(conn, sid, {"method": "session.delete", **pending.receipt}, now_ms=now_ms)


def forget_logged(conn: Any, entries: Iterable[LoggedDelete], live: Container[str]) -> int:
    """A database rebuilt from the files (boot): each id the deleted-sessions log names, unless a session
    of that id lives again (its transcript is in ``live``), is a deleted id again (``known_sessions``), its
    delete's receipt restored and the receipts of the requests that made it (with their answers): their
    retries are answered as before the loss, the session stays deleted. Returns how many ids."""
    seen: set[str] = set()
    for entry in entries:  # in file order: the newest line of an id sets its deletion time
        sid = entry.session_id
        if sid in live:
            continue
        seen.add(sid)
        index.delete_session_rows(conn, sid, now_ms=entry.deleted_at)
        forget_queue(conn, sid)
        if entry.receipt is not None:
            restore_receipt(conn, sid, {"method": "session.delete", **entry.receipt}, now_ms=entry.deleted_at)
        for rec in entry.created:
            key = receipts.key_of_record(rec)
            if key is not None and "response" in rec and not receipts.exists(conn, key.client_id, key.submission_id):
                receipts.store(conn, key, rec["response"], session_id=sid, now_ms=entry.deleted_at)
    return len(seen)


def restore_receipt(conn: Any, session_id: str, rec: Any, *, now_ms: int) -> bool:
    """Rebuild the row of a receipt a file carries, if the database lost it. True if a row was added."""
    key = receipts.key_of_record(rec)
    if key is None or receipts.exists(conn, key.client_id, key.submission_id):
        return False
    response = rebuild_response(conn, session_id, rec)
    if response is None:
        return False
    receipts.store(conn, key, response, session_id=session_id, now_ms=now_ms)
    return True
