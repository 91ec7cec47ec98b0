"""``pi-host doctor``: every transcript against its index rows, and what lies around them.

Per session (the union of ``sessions`` rows and ``sessions/*.jsonl`` files):

* the header is there; a torn tail (a partial last line, a NUL run) is
  repairable — moved into a ``.torn-<ms>`` quarantine file and cut, exactly as
  the session actor does before its next append; an unparsable line in the
  middle is damage (kept and skipped by readers, never dropped);
* index rows against the transcript: messages with no row, rows with no
  message, ``seq`` gaps or rows out of order, byte offsets that do not point at
  their message's line (or not even at a line start), tombstone flags that
  disagree, an ``indexed_len`` past the end of the file — all repairable by
  re-indexing the session from its transcript (``store.indexing.reconcile``);
* a transcript whose row is gone (an orphan) is reported and, with repair,
  re-indexed — its row comes back; a transcript is never deleted;
* a row claiming messages whose transcript is gone is damage (the content is).

Around them: quarantine files (``.torn-*`` and ``quarantine/``) and interrupted
deletes are reported; orphan in-flight checkpoints and revision files (their
session has neither row nor transcript) are moved to ``quarantine/``, orphan
``scratch/`` and ``review-changes/`` directories removed (as boot does), review
snapshot folders a record killed before its ``meta.json`` left removed (as boot
does), the workspace temp file of a restore killed before its rename removed,
stray temp files removed.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from store.doctor.doctor_report import DoctorReport, Progress, Severity
from store.fsutil import fsync_dir, is_temp_name, remove_file_durable, sweep_temp_files
from store.ids import remapped_message_id
from store.indexing.database import quarantine_temp_files, sweep_quarantine_temps
from store.indexing.index import IndexRecord
from store.indexing.reconcile import ReconcilePlan, TailScan, apply_plan, dedupe, read_header, scan_from
from store.review import remove_snapshot_dir, stray_restore_temps, unpublished_snapshots
from store.rules import SESSION_ID_RE
from store.transcripts.records import blocks_of
from store.transcripts.transcript import DROPPED_MARKER, TranscriptWriter

INFLIGHT_SUFFIX = ".inflight.json"
REVISIONS_SUFFIX = ".revisions.jsonl"
TORN_MARKER = ".jsonl.torn-"
DELETED_SUFFIX = ".jsonl.deleted"


class DataDirPaths(Protocol):
    """The data directory layout doctor reads (``runtime.datadir.DataDir`` has it)."""

    @property
    def root(self) -> Path: ...
    @property
    def db_path(self) -> Path: ...
    @property
    def sessions_dir(self) -> Path: ...
    @property
    def attachments_dir(self) -> Path: ...
    @property
    def secrets_dir(self) -> Path: ...
    @property
    def scratch_root(self) -> Path: ...
    @property
    def review_changes_dir(self) -> Path: ...
    @property
    def quarantine_dir(self) -> Path: ...


@dataclass
class SessionFacts:
    """What the session pass learned, for the checks that come after it."""

    message_ids: dict[str, set[str]] = field(default_factory=dict)
    """Per session: every message id its transcript holds (and its D444 spelling)."""
    attachment_refs: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """sha256 → (session, message) of every ``attachments/<sha>`` block ref in a transcript."""


def _names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def transcript_ids(sessions_dir: Path) -> set[str]:
    out = set()
    for name in _names(sessions_dir):
        if name.endswith(".jsonl") and not name.endswith(REVISIONS_SUFFIX):
            sid = name[: -len(".jsonl")]
            if SESSION_ID_RE.fullmatch(sid):
                out.add(sid)
    return out


def session_rows(conn: sqlite3.Connection) -> dict[str, tuple[int, str | None, int]]:
    return {r[0]: (int(r[1] or 0), r[2], int(r[3] or 0))
            for r in conn.execute("SELECT id, indexed_len, file_epoch, last_seq FROM sessions")}


def _line_start(path: Path, offset: int) -> bool:
    if offset == 0:
        return True
    with open(path, "rb") as fh:
        fh.seek(offset - 1)
        return fh.read(1) == b"\n"


def compare_index(conn: sqlite3.Connection, sid: str, path: Path, scan: TailScan,
                  indexed_len: int) -> dict[str, Any]:
    """Differences between a session's index rows and its transcript (empty when they agree)."""
    records = dedupe(scan.messages)
    rows = {r[0]: r[1:] for r in conn.execute(
        "SELECT id, seq, line_offset, line_len, deleted FROM messages WHERE session_id = ?", (sid,))}
    matched: set[str] = set()
    missing, wrong_seq, wrong_offset, off_line, wrong_deleted = [], 0, 0, 0, 0
    for position, item in enumerate(records):
        rid = item.record["id"]
        spelled = remapped_message_id(sid, rid)
        key = rid if rid in rows else spelled if spelled in rows else None
        if key is None:
            missing.append(rid)
            continue
        matched.add(key)
        seq, offset, length, deleted = rows[key]
        wrong_seq += int(seq != position + 1)
        if (offset, length) != (item.offset, item.length):
            wrong_offset += 1
            off_line += int(offset is None or not _line_start(path, int(offset)))
        wrong_deleted += int(bool(deleted) != bool(scan.tombstones.get(rid, False)))
    stale = sorted(set(rows) - matched)
    seqs = sorted(int(v[0]) for v in rows.values())
    gaps = seqs != list(range(1, len(seqs) + 1))
    diff: dict[str, Any] = {}
    if missing:
        diff["missingRows"] = missing[:20]
        diff["missingCount"] = len(missing)
    if stale:
        diff["staleRows"] = stale[:20]
        diff["staleCount"] = len(stale)
    if gaps:
        diff["seqGaps"] = True
    if wrong_seq:
        diff["rowsOutOfOrder"] = wrong_seq
    if wrong_offset:
        diff["wrongOffsets"] = wrong_offset
    if off_line:
        diff["offsetsNotOnLineStart"] = off_line
    if wrong_deleted:
        diff["wrongTombstoneFlags"] = wrong_deleted
    if indexed_len > scan.end:
        diff["indexedPastEnd"] = {"indexedLen": indexed_len, "fileLen": scan.end}
    return diff


def _describe(diff: dict[str, Any]) -> str:
    parts = []
    if "missingCount" in diff:
        parts.append(f"{diff['missingCount']} message(s) without an index row")
    if "staleCount" in diff:
        parts.append(f"{diff['staleCount']} index row(s) the transcript does not have")
    if diff.get("seqGaps"):
        parts.append("gaps in seq")
    if "rowsOutOfOrder" in diff:
        parts.append(f"{diff['rowsOutOfOrder']} row(s) out of transcript order")
    if "wrongOffsets" in diff:
        extra = f", {diff['offsetsNotOnLineStart']} not on a line start" if "offsetsNotOnLineStart" in diff else ""
        parts.append(f"{diff['wrongOffsets']} byte offset(s) pointing elsewhere{extra}")
    if "wrongTombstoneFlags" in diff:
        parts.append(f"{diff['wrongTombstoneFlags']} tombstone flag(s) that disagree")
    if "indexedPastEnd" in diff:
        parts.append("indexed_len past the end of the file")
    return "; ".join(parts)


def _reindex(conn: sqlite3.Connection, sid: str, scan: TailScan, now_ms: int) -> None:
    epoch = (scan.header or {}).get("epoch")
    plan = ReconcilePlan(kind="full", file_len=scan.end, epoch=epoch if isinstance(epoch, str) else None, scan=scan)
    conn.execute("BEGIN IMMEDIATE")
    try:
        apply_plan(conn, sid, plan, now_ms=now_ms)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _collect(facts: SessionFacts, sid: str, records: Iterable[IndexRecord]) -> None:
    ids = facts.message_ids.setdefault(sid, set())
    for item in records:
        rid = item.record["id"]
        ids.update((rid, remapped_message_id(sid, rid)))
        for block in blocks_of(item.record):
            ref = block.get("ref") if isinstance(block, dict) and block.get("type") == "attachment" else None
            if isinstance(ref, str) and ref.startswith("attachments/"):
                facts.attachment_refs.setdefault(ref[len("attachments/"):], []).append((sid, rid))


def check_session(conn: sqlite3.Connection | None, paths: DataDirPaths, sid: str,
                  row: tuple[int, str | None, int] | None, report: DoctorReport, facts: SessionFacts,
                  *, repair: bool, now_ms: int) -> None:
    path = paths.sessions_dir / f"{sid}.jsonl"
    subject = f"session {sid}"
    if not path.exists():
        if row is None or conn is None:
            return
        claimed = conn.execute("SELECT count(*) FROM messages WHERE session_id = ?", (sid,)).fetchone()[0]
        if claimed or row[2]:
            report.add("transcript.missing", subject,
                       f"the index holds {claimed} message row(s) (message count {row[2]}) but "
                       f"sessions/{sid}.jsonl is gone: that content is lost", Severity.DAMAGED, rows=claimed)
        return
    report.count("transcripts")
    if read_header(path) is None:
        report.add("transcript.header", subject, f"sessions/{sid}.jsonl does not start with a session header "
                   "line; it is kept, readers cannot use it", Severity.DAMAGED)
        return
    scan = scan_from(path, 0)
    if scan.torn_tail_bytes:
        finding = report.add("transcript.torn_tail", subject,
                             f"{scan.torn_tail_bytes} byte(s) after the last complete line (a torn append); "
                             "repair moves them into a .torn-<ms> quarantine file and cuts the file there",
                             Severity.REPAIRABLE, bytes=scan.torn_tail_bytes)
        if repair:
            TranscriptWriter.open(path, clock_ms=lambda: now_ms).close()
            finding.repaired = True
            scan = scan_from(path, 0)
    if scan.bad_lines:
        report.add("transcript.bad_lines", subject,
                   f"{len(scan.bad_lines)} line(s) in the middle that do not parse (kept; readers skip them)",
                   Severity.DAMAGED, offsets=scan.bad_lines[:20])
    _collect(facts, sid, dedupe(scan.messages))
    if conn is None:
        return
    if row is None:
        finding = report.add("transcript.orphan", subject,
                             f"sessions/{sid}.jsonl has no session row; repair re-indexes it (the row comes "
                             "back from the file), it is never deleted", Severity.REPAIRABLE,
                             messages=len(dedupe(scan.messages)))
        if repair:
            _reindex(conn, sid, scan, now_ms)
            finding.repaired = True
        return
    diff = compare_index(conn, sid, path, scan, row[0])
    if diff:
        finding = report.add("index.session", subject, _describe(diff) + "; repair re-indexes the session "
                             "from its transcript", Severity.REPAIRABLE, **diff)
        if repair:
            _reindex(conn, sid, scan, now_ms)
            finding.repaired = not compare_index(conn, sid, path, scan_from(path, 0),
                                                 session_rows(conn)[sid][0])


def check_sessions(conn: sqlite3.Connection | None, paths: DataDirPaths, report: DoctorReport, *,
                   repair: bool, now_ms: int, progress: Progress | None) -> SessionFacts:
    facts = SessionFacts()
    rows = session_rows(conn) if conn is not None else {}
    for sid in sorted(rows):
        if not SESSION_ID_RE.fullmatch(sid):
            report.add("index.session_id", f"session {sid!r}", "a session row whose id cannot be a file name "
                       "(ids match ^[A-Za-z0-9_-]{1,64}$); no file is looked up for it", Severity.DAMAGED)
    ids = sorted((set(rows) | transcript_ids(paths.sessions_dir)) - {s for s in rows
                                                                     if not SESSION_ID_RE.fullmatch(s)})
    for done, sid in enumerate(ids, start=1):
        check_session(conn, paths, sid, rows.get(sid), report, facts, repair=repair, now_ms=now_ms)
        report.count("sessions")
        if progress is not None:
            progress("sessions", done, len(ids))
    return facts


def _move_to_quarantine(path: Path, quarantine_dir: Path, now_ms: int) -> Path:
    quarantine_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = quarantine_dir / f"{path.name}.{now_ms}"
    n = 1
    while target.exists():
        target = quarantine_dir / f"{path.name}.{now_ms}-{n}"
        n += 1
    os.replace(path, target)
    fsync_dir(path.parent)
    fsync_dir(quarantine_dir)
    return target


def check_surroundings(conn: sqlite3.Connection | None, paths: DataDirPaths, report: DoctorReport, *,
                       repair: bool, now_ms: int) -> None:
    """Quarantine files, interrupted deletes, orphan checkpoints/revisions/scratch/review snapshots, temp files."""
    live = set(session_rows(conn)) if conn is not None else None
    transcripts = transcript_ids(paths.sessions_dir)
    for name in _names(paths.sessions_dir):
        path = paths.sessions_dir / name
        if TORN_MARKER in name:
            report.add("quarantine.torn_tail", f"sessions/{name}", f"{path.stat().st_size} byte(s) once cut "
                       "from the end of a transcript; kept for inspection", Severity.INFO)
        elif DROPPED_MARKER in name:
            report.add("quarantine.dropped_lines", f"sessions/{name}", f"{path.stat().st_size} byte(s) of lines "
                       "a rewrite could not carry over (damaged, or of a kind this version does not know); "
                       "kept for inspection", Severity.INFO)
        elif name.endswith(DELETED_SUFFIX):
            report.add("transcript.delete_pending", f"sessions/{name}", "a session delete that was "
                       "interrupted; the next start finishes it", Severity.INFO)
        elif live is not None and (name.endswith(INFLIGHT_SUFFIX) or name.endswith(REVISIONS_SUFFIX)):
            suffix = INFLIGHT_SUFFIX if name.endswith(INFLIGHT_SUFFIX) else REVISIONS_SUFFIX
            sid = name[: -len(suffix)]
            if sid in live or sid in transcripts:
                continue
            kind = "inflight" if suffix == INFLIGHT_SUFFIX else "revisions"
            finding = report.add(f"orphan.{kind}", f"sessions/{name}", f"its session {sid} has neither a row nor "
                                 "a transcript; repair moves it to quarantine/", Severity.REPAIRABLE)
            if repair:
                finding.data["movedTo"] = str(_move_to_quarantine(path, paths.quarantine_dir, now_ms))
                finding.repaired = True
    leftovers = quarantine_temp_files(paths.quarantine_dir)
    for name in _names(paths.quarantine_dir):
        if name in leftovers:
            continue
        report.add("quarantine.file", f"quarantine/{name}", "kept for inspection (a corrupt database copy, "
                   "a checkpoint boot could not use, or a damaged setting's bytes doctor set aside: kv.*)",
                   Severity.INFO)
    for name in _names(paths.review_changes_dir):  # before an orphan folder goes: its metas name the temps
        folder = paths.review_changes_dir / name
        if not folder.is_dir() or folder.is_symlink():
            continue
        for tmp in stray_restore_temps(folder):
            finding = report.add("review.restore_temp", tmp, "the temp file of a review.restore killed before its "
                                 "rename, in the workspace (its name is the snapshot's, never a user's file); "
                                 "repair removes it", Severity.REPAIRABLE, sessionId=name)
            if repair:
                remove_file_durable(tmp)
                finding.repaired = True
    if live is not None:
        for root, label in ((paths.scratch_root, "scratch"), (paths.review_changes_dir, "review-changes")):
            for name in _names(root):
                if name in live or not (root / name).is_dir():
                    continue
                finding = report.add(f"orphan.{label.replace('-', '_')}", f"{label}/{name}",
                                     f"its session {name} is gone; repair removes the directory (as the "
                                     "startup sweep does)", Severity.REPAIRABLE)
                if repair:
                    shutil.rmtree(root / name)
                    finding.repaired = True
    for half in unpublished_snapshots(paths.review_changes_dir):
        if live is not None and half.parent.name not in live:
            continue  # its whole session folder is an orphan, found above
        size = sum(p.lstat().st_size for p in half.iterdir())
        finding = report.add("review.unpublished", str(half.relative_to(paths.root)),
                             f"a review snapshot whose record was killed before its meta.json ({size} byte(s) "
                             "nothing lists or reads); repair removes it (as the startup sweep does)",
                             Severity.REPAIRABLE)
        if repair:
            remove_snapshot_dir(half)
            finding.repaired = True
    for directory in (paths.sessions_dir, paths.secrets_dir, paths.attachments_dir):
        stray = [n for n in _names(directory) if is_temp_name(n) and (directory / n).is_file()]
        if stray:
            finding = report.add("temp.files", str(directory.relative_to(paths.root)),
                                 f"{len(stray)} stray temp file(s) of interrupted writes; repair removes them",
                                 Severity.REPAIRABLE, names=stray[:20])
            if repair:
                sweep_temp_files(directory)
                finding.repaired = True
    if leftovers:  # a killed write into quarantine/ (doctor's own set-aside copy, boot's salvage marker)
        finding = report.add("temp.files", "quarantine", f"{len(leftovers)} temp file(s) of interrupted writes "
                             "(every finished copy is kept); repair removes them", Severity.REPAIRABLE,
                             names=leftovers[:20])
        if repair:
            sweep_quarantine_temps(paths.quarantine_dir)
            finding.repaired = True
