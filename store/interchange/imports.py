"""Importing sessions: one session, or every session under a tool's root (seed 003 §4.5, §5).

:func:`import_unit` decides what an import of one :class:`SourceUnit` must
do and runs :mod:`store.interchange.import_write`'s steps in order: a source whose files
still hold exactly the bytes the last import consumed (the fingerprints in the
origin row) is ``unchanged`` without being parsed, and so is one that holds exactly what an earlier
import read from it when the last one read more (an older copy put back: the row keeps each file's
earlier states that are byte prefixes of the last, :func:`earlier_states`); an index that trails its
transcript is caught up first (reconcile); then stage → publish → one
transaction, with the undo on failure. :func:`import_root` does it for every
session a tool keeps under a root, one transaction per session, with a
progress callback. Bad input never raises: it is a refused report. A unit whose transcript an
earlier version of its importer named otherwise is imported into that session (:func:`resolve_unit`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from store import attachments, receipts
from store.errors import StoreError
from store.fsutil import open_nofollow
from store.indexing import index, reconcile
from store.indexing.database import in_transaction
from store.interchange.import_write import (
    HOST_IMPORTER,
    IMPORT_RULES,
    ImportTarget,
    Spans,
    StagedImport,
    apply_answer,
    apply_index,
    publish,
    stage,
    undo,
    valid_answer,
)
from store.interchange.importers import (
    content_fingerprint,
    discover,
    diverged_from,
    file_names,
    former_ids,
    kept_as_imported,
    named_as_before,
)
from store.interchange.importers.common import Refused, SessionReport, SourceUnit, session_id_for
from store.interchange.importers.report import MAX_UNKNOWN_KINDS, FileReport, unknown_kinds
from store.interchange.origin_history import origin_row
from store.jsonio import loads_line
from store.receipts import ReceiptKey
from store.rules import MAX_IMPORT_REPORTS
from store.transcripts.transcript import read_first_line

__all__ = [
    "ImportSummary",
    "PreparedImport",
    "existing_spans",
    "finish",
    "import_root",
    "import_unit",
    "origin_row",
    "prepare_unit",
    "prior_answer",
    "refuse_after",
    "resolve_unit",
    "sources_unchanged",
]


# --------------------------------------------------------------------------- what the index knows


def existing_spans(conn: sqlite3.Connection, session_id: str) -> Spans:
    """``ids -> (line_offset, line_len)`` of the newest line holding each id (messages and checkpoints)."""

    def lookup(ids: Sequence[str]) -> Mapping[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for i in range(0, len(ids), 500):
            chunk = list(ids[i : i + 500])
            marks = ",".join("?" * len(chunk))
            for mid, off, ln in conn.execute(
                f"SELECT id, line_offset, line_len FROM messages WHERE session_id = ? AND id IN ({marks})",
                (session_id, *chunk),
            ):
                if off is not None:
                    out[mid] = (off, ln)
            for cid, off, ln in conn.execute(
                f"SELECT id, MAX(line_offset), line_len FROM compactions WHERE session_id = ? AND id IN ({marks}) "
                "GROUP BY id",
                (session_id, *chunk),
            ):
                out[cid] = (off, ln)
        return out

    return lookup


def prior_answer(origin: Mapping[str, Any] | None, key: ReceiptKey | None) -> dict[str, Any] | None:
    """The answer ``key``'s request recorded for a session it wrote (``origin``: the session's import record,
    :func:`origin_row`'s ``origin``), if the newest keyed write of the session is that request's: its retry
    (after a kill, or an error before its receipt committed) answers what that write did. None for any other
    request, keyed or not."""
    last = origin.get("lastImport") if origin is not None and key is not None else None
    if not isinstance(last, Mapping):
        return None
    written = receipts.key_of_record(last.get("receipt"))
    if written != key:
        return None
    return valid_answer(last.get("answer"))


def _imported_files(origin: Mapping[str, Any] | None) -> set[str]:
    """The source files an import record lists (its ``origin.files`` keys)."""
    files = origin.get("files") if origin is not None else None
    return set(files) if isinstance(files, Mapping) else set()


def resolve_unit(conn: sqlite3.Connection, unit: SourceUnit) -> SourceUnit:
    """``unit`` under the external id its transcript was imported with, when that is not its own.

    An importer that changed how it names a session (:func:`~store.interchange.importers.former_ids`)
    finds the session an earlier import created the way every import finds its session: by the id the
    external id gives, and that session's import record. A former id counts when the record is this
    source's host import and lists the unit's primary file, so a copy of a transcript elsewhere never
    joins the session of its original. The unit comes back unchanged when a session has its own id.

    A file whose name other files share (a Claude Code session copied into another project folder: the longest
    file is named plainly, the others ``<name>@<path digest>``, :func:`~store.interchange.importers.file_names`)
    stays the session it was first imported as: the import record of either name that lists the file names it,
    whichever file is the longest now; and a file not imported yet is the copy when the plain name's record lists
    another file of that name that is still there and has parted ways with it. So a copy grown past its original
    neither takes the original's session nor leaves the original's file to start a second one.
    """
    if not unit.files:
        return unit
    primary = str(unit.files[0])
    names = file_names(unit)
    if names is not None:
        own, copy = names
        plain_row = None
        for external in names:
            row = origin_row(conn, session_id_for(unit.source, external))
            if row is None or row["pluginId"] != HOST_IMPORTER or row["sourceId"] != unit.source:
                continue
            if primary in _imported_files(row["origin"]):
                return unit if external == unit.external_id else replace(unit, external_id=external)
            if external == own:
                plain_row = row
        if (unit.external_id == own and plain_row is not None
                and any(diverged_from(unit, Path(p)) for p in _imported_files(plain_row["origin"]))):
            return replace(unit, external_id=copy)
    if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (unit.session_id,)).fetchone():
        return unit
    for external in former_ids(unit):
        row = origin_row(conn, session_id_for(unit.source, external))
        if (row is not None and row["pluginId"] == HOST_IMPORTER and row["sourceId"] == unit.source
                and primary in _imported_files(row["origin"])):
            return replace(unit, external_id=external)
    return unit


def _fingerprint(path: Path, consumed: int) -> str | None:
    """SHA-256 of the first ``consumed`` bytes (None when the file is shorter or unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO: never blocks
    except OSError:
        return None
    try:
        digest = hashlib.sha256()
        left = consumed
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                return None
            digest.update(chunk)
            left -= len(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


_Named = tuple[Path, Mapping[str, Any], os.stat_result]
"""A source file, its entry in the import record (``size``, ``mtimeNs``, ``consumed``, ``sha256``, ``earlier``)
and its status now."""


def sources_unchanged(unit: SourceUnit, origin: Mapping[str, Any] | None) -> bool:
    """True when every source file still holds exactly the bytes the last import consumed."""
    if not origin or origin.get("importRules") != IMPORT_RULES:
        return False
    content = origin.get("contentFingerprint")
    if isinstance(content, str) and content:
        return content_fingerprint(unit) == content
    entries = _named_files(unit, origin)
    return entries is not None and all(st.st_mtime_ns == seen.get("mtimeNs") and _holds_as_read(path, seen, st)
                                       for path, seen, st in entries)


def _named_files(unit: SourceUnit, origin: Mapping[str, Any] | None) -> list[_Named] | None:
    """Each file of ``unit`` with its entry in the import record and its own status (a link not followed), when
    the record names exactly the unit's files and each is still a regular file (one replaced by a FIFO, a device,
    a folder is read again, and refused there); None otherwise."""
    files = origin.get("files") if origin is not None else None
    if not isinstance(files, Mapping) or set(files) != {str(p) for p in unit.files}:
        return None
    out = []
    for path in unit.files:
        seen = files[str(path)]
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        if not isinstance(seen, Mapping) or not stat.S_ISREG(st.st_mode):
            return None
        out.append((path, seen, st))
    return out


def _holds_as_read(path: Path, seen: Mapping[str, Any], st: os.stat_result) -> bool:
    """Whether a file holds exactly the bytes the last import consumed from it (``seen``, its entry): the size it
    had, and the digest of its first ``consumed`` bytes. An entry whose ``consumed`` is not a byte count (a
    damaged record) holds nothing: the file is read again."""
    consumed = seen.get("consumed")
    return (st.st_size == seen.get("size") and type(consumed) is int
            and _fingerprint(path, consumed) == seen.get("sha256"))


MAX_EARLIER_STATES = 32
"""How many earlier states of a source file (``[consumed, sha256]``, the newest last) its origin entry keeps."""


def consumed_before(origin: Mapping[str, Any] | None) -> dict[str, int]:
    """Per source file of an import record, the offset the last import consumed to (the ``mark`` whose prefix
    digest a re-import's parse keeps for :func:`earlier_states`)."""
    files = origin.get("files") if origin is not None else None
    out: dict[str, int] = {}
    for path, seen in files.items() if isinstance(files, Mapping) else ():
        consumed = seen.get("consumed") if isinstance(seen, Mapping) else None
        if type(consumed) is int and consumed > 0:
            out[path] = consumed
    return out


def earlier_states(files: Iterable[FileReport], origin: Mapping[str, Any] | None) -> dict[str, list[list[Any]]]:
    """Per file this import read: what the earlier imports read from it (``[consumed, sha256]`` each), when
    that is a strict byte prefix of what this import read (the file grew by appending), bounded by
    :data:`MAX_EARLIER_STATES`. A file rewritten since (Claude Code's compaction, pi rewriting it) starts
    over: its earlier states are no prefix of it. The digest at the earlier length is the one the parse's
    reader took on its way (``FileReport.at_mark``: :func:`consumed_before` gave it the offset), so it is of
    the very bytes the parse read, and the file is not read again. A file whose report lacks it (a reader
    not given the mark) is read again in one pass up to what the parse consumed, the digest taken at the
    earlier length on the way, and kept only when the whole digest is the parse's."""
    seen_files = origin.get("files") if origin is not None else None
    out: dict[str, list[list[Any]]] = {}
    for f in files:
        seen = seen_files.get(f.path) if isinstance(seen_files, Mapping) else None
        if f.reference or not f.sha256 or not isinstance(seen, Mapping):
            continue
        consumed, sha = seen.get("consumed"), seen.get("sha256")
        if type(consumed) is not int or not isinstance(sha, str) or not 0 < consumed <= f.consumed:
            continue
        before = seen.get("earlier")
        kept = [list(e) for e in before if _state(e)] if isinstance(before, list) else []
        if consumed == f.consumed:
            if sha == f.sha256 and kept:  # the same bytes (another file of the session changed)
                out[f.path] = kept
        elif (f.at_mark[1] if f.at_mark is not None and f.at_mark[0] == consumed
              else _prefix_digest(Path(f.path), consumed, f.consumed, f.sha256)) == sha:
            out[f.path] = [*kept, [consumed, sha]][-MAX_EARLIER_STATES:]
    return out


def _state(value: object) -> bool:
    return (isinstance(value, list) and len(value) == 2 and type(value[0]) is int and value[0] > 0
            and isinstance(value[1], str))


def _prefix_digest(path: Path, mark: int, length: int, whole: str) -> str | None:
    """SHA-256 of the first ``mark`` bytes of ``path``, when its first ``length`` bytes hash to ``whole``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        at_mark: str | None = None
        pos = 0
        while pos < length:
            chunk = os.read(fd, min(length - pos, (mark - pos) if pos < mark else 1 << 20, 1 << 20))
            if not chunk:
                return None
            digest.update(chunk)
            pos += len(chunk)
            if pos == mark:
                at_mark = digest.hexdigest()
        return at_mark if digest.hexdigest() == whole else None
    except OSError:
        return None
    finally:
        os.close(fd)


def same_path_older_copy(unit: SourceUnit, origin: Mapping[str, Any] | None) -> str | None:
    """The file of ``unit`` that now holds exactly what an earlier import of this session read from that
    very path (a ``[consumed, sha256]`` of its origin entry's ``earlier``: a strict byte prefix of what the
    last import read there), when every other file of the unit holds what the last import read: an older
    copy put back at the same path (restored from a backup, a sync conflict). None otherwise (a grown file,
    a rewritten one, a file the record does not name)."""
    entries = _named_files(unit, origin)
    if entries is None:
        return None
    older = None
    for path, seen, st in entries:
        if _holds_as_read(path, seen, st):
            continue
        earlier = seen.get("earlier")
        digests = {e[1] for e in earlier if _state(e) and e[0] == st.st_size} if isinstance(earlier, list) else set()
        if not digests or _fingerprint(path, st.st_size) not in digests:
            return None
        older = str(path)
    return older


def older_copy_of(unit: SourceUnit, origin: Mapping[str, Any] | None) -> str | None:
    """The file this session was last imported from, when ``unit``'s files are an older copy of it: each is
    another path than the import record's files, with the name of one of them, and its bytes are the start
    of what that file held when it was imported (a snapshot taken earlier, a project folder copied before
    Claude Code wrote on in the copy, a backup). None otherwise (a file of the record among them, a copy
    that holds something the newer file does not, an unreadable file).

    Such a copy has nothing new for the session, only older forms of its records (a tool call still without
    its result, a reply's first blocks): written as replacements they hid what the newer file had given, and
    the next import of the newer file wrote it back, at every import, for as long as both copies lie under
    the root."""
    files = origin.get("files") if origin is not None else None
    if not isinstance(files, Mapping) or not unit.files:
        return None
    by_name: dict[str, tuple[str, int]] = {}
    for path, seen in files.items():
        consumed = seen.get("consumed") if isinstance(seen, Mapping) else None
        if isinstance(consumed, int) and not isinstance(consumed, bool):
            by_name.setdefault(Path(path).name, (path, consumed))
    newer = None
    for file in unit.files:
        found = by_name.get(file.name)
        if str(file) in files or found is None or not _starts(found[0], file, found[1]):
            return None
        newer = newer or found[0]
    return newer


def _starts(newer: str, older: Path, consumed: int) -> bool:
    """Whether the bytes of ``older`` (at most ``consumed`` of them) are the first bytes of ``newer``."""
    fds: list[int] = []
    try:
        for path in (newer, older):
            fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK))
            if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
                return False
        left = os.fstat(fds[1]).st_size
        if left > consumed:
            return False
        while left > 0:
            want = min(left, 1 << 20)
            a, b = os.read(fds[0], want), os.read(fds[1], want)
            if not b or a != b:
                return False
            left -= len(b)
        return True
    except OSError:
        return False
    finally:
        for fd in fds:
            os.close(fd)


# --------------------------------------------------------------------------- one session, a whole root


def _catch_up(conn: sqlite3.Connection, target: ImportTarget, sid: str, row: Mapping[str, Any] | None,
              now_ms: int) -> None:
    """Bring the index in line with an existing transcript before comparing against it."""
    path = target.transcript(sid)
    if not path.exists():
        return
    if row is not None:
        fd = open_nofollow(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            first = read_first_line(fd)
        finally:
            os.close(fd)
        header = loads_line(first) if first else {}
        if row["_indexedLen"] == size and row["_fileEpoch"] == header.get("epoch"):
            return
    plan = reconcile.plan_reconcile(path, row["_indexedLen"] if row else 0, row["_fileEpoch"] if row else None)
    in_transaction(conn, lambda c: reconcile.apply_plan(c, sid, plan, now_ms=now_ms))


@dataclass
class PreparedImport:
    """What :func:`prepare_unit` decided: a final report, or staged lines to publish and index."""

    report: SessionReport
    staged: StagedImport | None = None
    status: str = ""
    """What the session becomes once ``staged`` is published and indexed (``new`` | ``updated`` | ``unchanged``)."""

    @property
    def changed(self) -> bool:
        return self.staged is not None and self.staged.has_writes


def prepare_unit(conn: sqlite3.Connection, unit: SourceUnit, target: ImportTarget, *, now_ms: int,
                 dry_run: bool = False, receipt: ReceiptKey | None = None, resolved: bool = False) -> PreparedImport:
    """Decide and stage one session's import (reads only: ``conn`` may be a read-only connection).

    Unchanged sources and refusals come back as a final report; otherwise the
    lines to write are staged (nothing visible yet) and the caller publishes
    them (:func:`store.interchange.import_write.publish`), runs :func:`store.interchange.import_write.apply_index`
    in one transaction and calls :func:`finish` — or :func:`store.interchange.import_write.undo`
    on failure. The index must already cover the transcript (the caller caught it up).
    Never raises for bad input.

    ``receipt``: the key of the request (``import.sessions`` with a ``submissionId``). Its write ends with an
    ``import_receipt`` line, and the session's import record keeps the key and its answer
    (``lastImport``). When that record names this very request, the session holds what an earlier try of it
    wrote: it is parsed again (never ``unchanged`` unread) and answered as that try would have been.

    ``resolved``: the caller gave ``unit`` as :func:`resolve_unit` gave it back (the offline :func:`import_unit`,
    the host's ``import.sessions`` before it routes the unit to its session's actor), and it is not resolved again:
    a first import of a Claude Code transcript peeks at its ``sessionId`` once, not twice.
    """
    earlier = unit if resolved else resolve_unit(conn, unit)
    if earlier is not unit:
        return _prepare_elsewhere(conn, earlier, target, now_ms=now_ms, dry_run=dry_run)
    sid = unit.session_id
    report = SessionReport(unit.source, unit.external_id, sid)
    row = index.session_row(conn, sid)
    if row is not None and row["source"] != unit.source:
        return PreparedImport(report.refuse("CONFLICT", f"session {sid} exists and was not imported from "
                                            f"{unit.source}"))
    origin = origin_row(conn, sid)
    prior = prior_answer(origin["origin"], receipt) if row is not None and origin is not None and not dry_run \
        else None
    try:
        unchanged = prior is None and row is not None and origin is not None and sources_unchanged(unit,
                                                                                                   origin["origin"])
    except OSError as exc:
        return PreparedImport(report.refuse("READ_ERROR", str(exc)))
    if unchanged:
        report.status = "unchanged"
        return PreparedImport(report)
    newer = older_copy_of(unit, origin["origin"]) if prior is None and row is not None and origin else None
    if newer is not None:
        report.status = "unchanged"
        report.older_copy = True
        report.message = f"an older copy of {newer}, which this session was imported from: nothing in it is new"
        return PreparedImport(report)
    try:
        put_back = same_path_older_copy(unit, origin["origin"]) if prior is None and row is not None and origin \
            else None
    except OSError as exc:
        return PreparedImport(report.refuse("READ_ERROR", str(exc)))
    if put_back is not None:
        report.status = "unchanged"
        report.older_copy = True
        report.message = (f"{put_back} holds what an earlier import read from it, and this session was imported "
                          "since from more of it: an older copy, nothing in it is new")
        return PreparedImport(report)
    kept = kept_as_imported(unit, _imported_files(origin["origin"])) if row is not None and origin else None
    if kept is not None:  # e.g. subagent files without the main transcript the session was imported with
        report.status = "unchanged"
        report.message = kept
        return PreparedImport(report)
    spans = existing_spans(conn, sid) if row is not None else None
    if row is not None:  # named as the import that made the session named them (e.g. Codex by byte offset)
        unit = named_as_before(unit, lambda pattern: conn.execute(
            "SELECT 1 FROM messages WHERE session_id = ? AND id GLOB ? LIMIT 1", (sid, pattern)).fetchone() is not None)

    def known_ids() -> Iterator[tuple[str, bool]]:
        for mid, deleted in conn.execute("SELECT id, deleted FROM messages WHERE session_id = ? ORDER BY seq",
                                         (sid,)):
            yield mid, bool(deleted)

    def known_compactions() -> Iterator[str]:
        for (cid,) in conn.execute("SELECT DISTINCT id FROM compactions WHERE session_id = ?", (sid,)):
            yield cid

    marks = consumed_before(origin["origin"]) if not dry_run and origin is not None else None
    try:
        staged = stage(unit, target, spans=spans, dry_run=dry_run, created_ms=lambda: now_ms,
                       known_ids=known_ids if row is not None else None,
                       known_compactions=known_compactions if row is not None else None,
                       import_receipt=receipts.file_record(receipt) if receipt is not None else None, prior=prior,
                       consumed_before=marks, blob_budget=attachments.budget_bytes(conn),
                       workspace=row.get("projectPath") or None if row is not None else None)
    except Refused as exc:
        return PreparedImport(exc.report if exc.report is not None else report.refuse(exc.code, exc.message))
    except OSError as exc:
        return PreparedImport(report.refuse("READ_ERROR", str(exc)))
    except StoreError as exc:
        return PreparedImport(report.refuse(exc.code, exc.message))
    report = staged.report
    changed = staged.has_writes
    if not dry_run and origin is not None:  # the origin row is written whether lines are or not
        staged.earlier = earlier_states(report.files, origin["origin"])
    status = "new" if staged.kind == "new" else ("updated" if changed else "unchanged")
    if dry_run:
        report.status = f"would-{status}" if status != "unchanged" else "unchanged"
        return PreparedImport(report)
    report.appended_bytes = staged.body_end - staged.body_start
    if staged.answer is not None:  # a keyed import's answer (an earlier try's, on a retry)
        apply_answer(report, staged.answer)
        status = staged.answer["status"]
    return PreparedImport(report, staged, status)


def _prepare_elsewhere(conn: sqlite3.Connection, unit: SourceUnit, target: ImportTarget, *, now_ms: int,
                      dry_run: bool) -> PreparedImport:
    """:func:`prepare_unit` of a unit :func:`resolve_unit` gave back under another session's id than the
    one it was called for (a caller that routes by ``unit.session_id`` without resolving first, e.g. to
    that session's actor). Reading that session is safe: a dry run, or an import of sources it holds
    already (``unchanged``). Writing it is not (it may have a live writer elsewhere): refused, and no
    second session is started either.
    """
    if dry_run:
        return prepare_unit(conn, unit, target, now_ms=now_ms, dry_run=True)
    sid = unit.session_id
    report = SessionReport(unit.source, unit.external_id, sid)
    row = origin_row(conn, sid)
    try:
        unchanged = row is not None and sources_unchanged(unit, row["origin"])
    except OSError as exc:
        return PreparedImport(report.refuse("READ_ERROR", str(exc)))
    if unchanged:
        report.status = "unchanged"
        return PreparedImport(report)
    return PreparedImport(report.refuse(
        "IMPORTED_AS_OTHER_SESSION", f"{unit.files[0]} changed since it was imported as session {sid} (under the "
        "id an earlier version of the importer gave it); this import was not routed to that session, so nothing "
        "was written and no second session was started"))


def finish(prepared: PreparedImport) -> SessionReport:
    """The report of a prepared import that was published and indexed."""
    prepared.report.status = prepared.status
    return prepared.report


def refuse_after(prepared: PreparedImport, exc: StoreError) -> SessionReport:
    """The report of a prepared import whose publish or index step failed (the caller undid it)."""
    return prepared.report.refuse(exc.code, exc.message)


def import_unit(conn: sqlite3.Connection, unit: SourceUnit, target: ImportTarget, *, now_ms: int,
                dry_run: bool = False) -> SessionReport:
    """Import one session on one connection (stage → publish → one transaction → report): the
    offline path (tests, the benchmark). A running host runs the same steps in the session's actor
    (``runtime/handlers/imports.py``). Never raises for bad input."""
    unit = resolve_unit(conn, unit)
    if not dry_run:
        sid = unit.session_id
        try:
            _catch_up(conn, target, sid, index.session_row(conn, sid), now_ms)
        except (StoreError, OSError, ValueError) as exc:
            return SessionReport(unit.source, unit.external_id, sid).refuse("INDEX_CATCH_UP_FAILED", str(exc))
    prepared = prepare_unit(conn, unit, target, now_ms=now_ms, dry_run=dry_run, resolved=True)
    staged = prepared.staged
    if staged is None:
        return prepared.report
    try:
        if prepared.changed:
            publish(staged, faults=target.faults)
        in_transaction(conn, lambda c: apply_index(c, staged, now_ms=now_ms))
    except StoreError as exc:
        undo(staged)
        return refuse_after(prepared, exc)
    except BaseException:
        undo(staged)
        raise
    return finish(prepared)


@dataclass
class ImportSummary:
    """The running totals of an import of many sessions, and at most ``max_reports`` of their reports
    (the refused first): what an import holds stays bounded whatever the number of sessions. The host's
    ``import.sessions`` keeps its totals in one of these too (``runtime/handlers/imports.py``)."""

    max_reports: int = MAX_IMPORT_REPORTS
    done: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    messages: int = 0
    """Messages of the sessions not refused."""
    new_messages: int = 0
    hidden: int = 0
    restored: int = 0
    unknown: Counter[str] = field(default_factory=Counter)
    """Record kinds no importer knew, at most ``MAX_UNKNOWN_KINDS`` of them."""
    source_bytes: int = 0
    unread_lines: int = 0
    """Source lines of the sessions not refused that were skipped unread: not JSON, or over the line bound."""
    repaired_lines: int = 0
    """Source lines of the sessions not refused read with bytes that are not UTF-8 replaced."""
    refused: list[SessionReport] = field(default_factory=list)
    others: list[SessionReport] = field(default_factory=list)

    def add(self, report: SessionReport) -> None:
        self.done += 1
        self.statuses[report.status] += 1
        if report.status != "refused":
            self.messages += sum(report.messages.values())
            self.new_messages += report.new_messages
            self.hidden += report.hidden_off_branch
            self.restored += report.restored_on_branch
            self.unread_lines += sum(f.bad_lines + f.oversized_lines for f in report.files)
            self.repaired_lines += sum(f.repaired_lines for f in report.files)
        for kind, n in unknown_kinds(report).items():
            if kind in self.unknown or len(self.unknown) < MAX_UNKNOWN_KINDS:
                self.unknown[kind] += n
        self.source_bytes += sum(f.consumed for f in report.files)
        bucket = self.refused if report.status == "refused" else self.others
        if len(bucket) < self.max_reports:
            bucket.append(report)

    @property
    def sessions(self) -> list[SessionReport]:
        """The kept reports, the refused first (in the order they came), at most ``max_reports``."""
        return (self.refused + self.others)[: self.max_reports]

    @property
    def truncated(self) -> bool:
        return self.done > len(self.sessions)

    def counts(self) -> dict[str, int]:
        return {status: n for status, n in self.statuses.items() if n}

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts(), "sessions": [r.to_dict() for r in self.sessions],
                "truncated": self.truncated}


def import_root(conn: sqlite3.Connection, source: str, root: Path, target: ImportTarget, *, now_ms: Callable[[], int],
                dry_run: bool = False, progress: Callable[[int, SessionReport], None] | None = None,
                units: Iterable[SourceUnit] | None = None) -> ImportSummary:
    """Import every session under ``root`` (one transaction per session); ``progress`` after each.

    Streams: the sessions are discovered lazily and imported one at a time, each through the steps the
    host's ``import.sessions`` runs in the session's actor (:func:`prepare_unit`, then publish and
    :func:`~store.interchange.import_write.apply_index` in batches of index rows), and only the
    bounded :class:`ImportSummary` outlives a session."""
    summary = ImportSummary()
    try:
        found = units if units is not None else discover(source, Path(os.path.abspath(root)))
        for n, unit in enumerate(found, start=1):
            rep = import_unit(conn, unit, target, now_ms=now_ms(), dry_run=dry_run)
            summary.add(rep)
            if progress is not None:
                progress(n, rep)
    except OSError as exc:
        rep = SessionReport(source).refuse("READ_ERROR", f"cannot list {root}: {exc.strerror or exc}")
        summary.add(rep)
    return summary
