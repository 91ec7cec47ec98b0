"""``import.sessions``: other agents' sessions into this host (seed 003 §4.5, §5).

The request is a host task (``on_host``) that owns the walk: it discovers the
sessions under the root (in a worker thread), then imports them one at a time,
**each inside its own session actor** (:data:`IMPORT_UNIT`, through
``HostContext.session_call``), so an import never races a live writer of that
session, and a new session is never started by two requests at once. In the
actor (``store/interchange/imports.py`` decides, ``store/interchange/import_write.py`` writes):

1. the index is caught up with the transcript (the actor's own reconcile);
2. *prepare* (the actor's worker thread, a read connection): refuse, or
   ``unchanged`` when the source files still hold exactly the bytes the last
   import consumed, or stage the lines to write in a temp file;
3. *publish* (the actor's worker thread): hard-link the new transcript, or
   append the staged lines (one write loop, one ``fdatasync``);
4. *index* (the DB writer, one transaction): rows, project, attachment refs and
   the origin row — a ``NORMAL`` commit: every row is derived from the
   transcript (its ``session_info`` line carries ``source`` and the origin), so
   boot rebuilds whatever a power cut takes;
5. *undo* if 3 or 4 failed: the new transcript is removed, or the appended
   bytes truncated — never a half-imported session. (When the index step timed
   out its outcome is unknown: the complete lines stay and the session's next
   catch-up indexes them from the file.)

Blobs found in a source are written while the blob store's lock is held (until
their rows are in), so ``attachments.gc`` never takes them for orphans. An actor
the import started is passivated right after its session (an import of ten
thousand sessions leaves none running). A session that cannot be imported is a
refused report, never an error of the whole request. ``import.progress`` events
carry the counts after each session and once more at the end.

Receipt: idempotent by construction (deterministic session ids; a re-import of
unchanged sources writes nothing), and the final summary is committed with the
receipt row (``ctx.commit``), so a retry after completion gets the same answer.
A retry before that commit (the host was killed, or the commit failed) answers
what a call without the crash answers too: each session a keyed request writes
carries the key and the request's answer for it in the write itself (an
``import_receipt`` line, then ``lastImport`` in its import record), so the retry
finds the sessions its first try wrote and answers them ``new`` / ``updated`` with
that try's counts, not ``unchanged`` (``store/interchange/imports.py``,
``prepare_unit``). Any other request finds them unchanged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import trio

from actors.session import SessionOp
from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import HostContext
from runtime.handlers import revisions
from runtime.kernel.actor import AskTimeout
from store.attachments import AttachmentFiles
from store.errors import InvalidInput, NotFound, StoreError, classify_os_error
from store.faults import Faults
from store.ids import derived_id, new_id
from store.indexing import index
from store.interchange.import_write import ImportTarget, StagedImport, apply_index, publish, undo
from store.interchange.importers import default_root, discover
from store.interchange.importers.common import SessionReport, SourceUnit
from store.interchange.imports import ImportSummary, finish, prepare_unit, refuse_after, resolve_unit
from store.receipts import ReceiptKey
from store.rules import MAX_IMPORT_SESSIONS

__all__ = ["IMPORT_UNIT", "Imports", "UnitCall", "import_sessions", "import_unit"]

SERVICE = "imports"
BLOBS = "blobs"
TOPIC = "import.progress"
log = logging.getLogger("pi_host")


class Imports:
    """The host's import state: one import at a time, and where imported sessions go."""

    def __init__(self, sessions_dir: Path, attachments: AttachmentFiles | None, *, faults: Faults,
                 review_root: Path | None = None) -> None:
        self.target = ImportTarget(sessions_dir, attachments, faults=faults, review_root=review_root)
        self.lock = trio.Lock()


@dataclass(frozen=True, slots=True)
class UnitCall:
    """The params of :data:`IMPORT_UNIT`: one session to import, and where to."""

    unit: SourceUnit
    """As ``resolve_unit`` gave it back (its session's actor does not resolve it again)."""
    target: ImportTarget
    receipt: ReceiptKey | None = None
    """The ``import.sessions`` request's key: its write of the session carries it (a retry finds its own)."""


# --------------------------------------------------------------------------- one session, in its actor


async def import_unit(ctx: SessionContext, call: UnitCall, key: ReceiptKey | None) -> SessionReport:
    """Import one session inside its actor (steps 1-5 of the module doc); returns its report."""
    unit, target, receipt = call.unit, call.target, call.receipt
    ctx.undelete()  # a session deleted here is imported again, like any session the index lacks
    try:
        await ctx.catch_up()
    except StoreError as exc:
        ctx.mark_stale()
        return SessionReport(unit.source, unit.external_id, ctx.sid).refuse("INDEX_CATCH_UP_FAILED", exc.message)
    now = ctx.now()
    faults = target.faults
    blobs = ctx.services.get(BLOBS)
    async with blobs.lock:
        prepared = await ctx.io_with_reader(lambda conn: prepare_unit(conn, unit, target, now_ms=now,
                                                                      receipt=receipt, resolved=True))
        staged = prepared.staged
        if staged is None:
            return prepared.report
        await ctx.close_writer()  # the transcript changes under it: no descriptor keeps the old length
        indexing = False
        try:
            if prepared.changed:
                await ctx.io(lambda: publish(staged, faults=faults))
            indexing = True
            await ctx.db(lambda conn: apply_index(conn, staged, now_ms=now), durable=False)
        except StoreError as exc:
            ctx.mark_stale()
            if not await landed(ctx, staged):
                await _undo(ctx, staged)
                return refuse_after(prepared, exc)
            # the index step failed once its commit had taken place: the session is imported (kept)
            log.warning("import of session %s: an error after its index commit: %s", ctx.sid, exc.message)
        except AskTimeout:
            # The index step's outcome is unknown: keep the published (complete, fsynced) lines; the
            # next call's catch-up indexes them from the file either way, and a re-import finds them.
            ctx.mark_stale()
            return prepared.report.refuse("TIMEOUT", "the index step did not answer in time; the transcript "
                                          "is kept and is indexed from the file on the session's next use")
        except BaseException:
            if indexing:  # cancelled (or a bug) while the index step was posted: it may still commit
                ctx.mark_stale()  # the lines stay; the next catch-up indexes them (as after a kill)
                raise
            with trio.CancelScope(shield=True):
                await _undo(ctx, staged)
            raise
    report = finish(prepared)
    if staged.revision_lines:  # references and rows changed under the memo: re-derive them on next use
        ctx.cache.pop(revisions.SYNCED, None)
        ctx.cache.pop(revisions.LIVE_REFS, None)
    row = await ctx.catch_up()
    if row is not None and report.status in ("new", "updated"):
        topic = "session.created" if report.status == "new" else "session.updated"
        ctx.publish(topic, {"session": index.public_session(row)})
    return report


async def landed(ctx: SessionContext, staged: StagedImport) -> bool:
    """After the index step failed: whether its commit took place all the same (an error once the commit
    may have happened). Then its rows name the published lines, and undoing them would lose the session."""
    try:
        row = await ctx.read(index.session_row, ctx.sid)
    except StoreError:  # not known: undone as before (the original error is the one to report)
        return False
    return row is not None and (staged.kind == "new" or int(row["_indexedLen"]) >= staged.file_end)


async def _undo(ctx: SessionContext, staged: Any) -> None:
    try:
        await ctx.io(undo, staged)
    except OSError:  # the original failure is the one to report; boot reconciles what is left
        ctx.mark_stale()


IMPORT_UNIT = SessionOp(import_unit, mutating=True, name="import.sessions", ready_check=False)
"""The session-routed internal operation (never on the wire: ``import.sessions`` posts it)."""


# --------------------------------------------------------------------------- the whole root


@dataclass
class _Found:
    units: list[SourceUnit]
    total_bytes: int
    overflow: bool


def _resolve_root(source: str, root: str | None) -> Path:
    if root is None:
        if source == "pi-host":
            raise InvalidInput("source pi-host needs a root (an exported .jsonl file or a directory of them)",
                               data={"field": "root"})
        path = default_root(source)
    else:
        if not os.path.isabs(root):
            raise InvalidInput("root must be an absolute path", data={"field": "root"})
        path = Path(root)
    if not os.path.lexists(path):
        raise NotFound(f"{path} does not exist", data={"root": str(path)})
    return Path(os.path.abspath(path))


def _discover(source: str, root: Path) -> _Found:
    try:
        units = list(islice(discover(source, root), MAX_IMPORT_SESSIONS + 1))
    except OSError as exc:
        raise classify_os_error(exc, f"list {root}") from exc
    overflow = len(units) > MAX_IMPORT_SESSIONS
    units = units[:MAX_IMPORT_SESSIONS]
    total = 0
    for unit in units:
        for path in unit.files:
            try:
                total += os.stat(path, follow_symlinks=False).st_size
            except OSError:
                pass
    return _Found(units, total, overflow)


@dataclass
class _Run:
    """One import: its totals (the store's bounded :class:`ImportSummary`, as ``import_root`` keeps) and
    what progress events and the result report of them."""

    import_id: str
    source: str
    root: str
    dry_run: bool
    total: int
    total_bytes: int
    tally: ImportSummary = field(default_factory=ImportSummary)

    def add(self, report: SessionReport) -> None:
        self.tally.add(report)

    def _head(self) -> dict[str, Any]:
        t = self.tally
        counts = {"new": 0, "updated": 0, "unchanged": 0, "refused": 0, "would-new": 0, "would-updated": 0}
        counts.update(t.statuses)
        return {"importId": self.import_id, "source": self.source, "root": self.root, "dryRun": self.dry_run,
                "total": self.total, "counts": counts, "messages": t.messages,
                "newMessages": t.new_messages, "hiddenOffBranch": t.hidden,
                "restoredOnBranch": t.restored,
                "unknownKinds": dict(t.unknown.most_common()), "unreadLines": t.unread_lines,
                "repairedLines": t.repaired_lines, "sourceBytes": t.source_bytes}

    def progress(self, report: SessionReport | None) -> dict[str, Any]:
        out = {**self._head(), "done": self.tally.done, "totalBytes": self.total_bytes, "finished": report is None}
        if report is not None:
            out["sessionId"] = report.session_id or None
            out["status"] = report.status
            out["reason"] = report.reason
        return {k: v for k, v in out.items() if v is not None}

    def result(self) -> dict[str, Any]:
        return {**self._head(), "sessions": [r.to_dict() for r in self.tally.sessions],
                "truncated": self.tally.truncated}


async def import_sessions(ctx: HostContext, p: m.ImportSessionsParams, key: ReceiptKey | None) -> Any:
    imports: Imports = ctx.services.get(SERVICE)
    root = await ctx.in_thread(_resolve_root, p.source, p.root)
    import_id = p.import_id or (derived_id("import", key.client_id, key.submission_id, prefix="imp-")[:40]
                                if key is not None else new_id("imp-"))
    async with imports.lock:
        found = await ctx.in_thread(_discover, p.source, root)
        run = _Run(import_id, p.source, str(root), p.dry_run, len(found.units), found.total_bytes)
        for unit in found.units:
            report = await _one(ctx, imports, unit, p.dry_run, key)
            run.add(report)
            ctx.publish(TOPIC, run.progress(report))
        if found.overflow:
            run.add(SessionReport(p.source).refuse(
                "TOO_MANY_SESSIONS", f"more than {MAX_IMPORT_SESSIONS} sessions under {root}: the first "
                f"{MAX_IMPORT_SESSIONS} were imported; import a subdirectory for the rest"))
        result = run.result()
        ctx.publish(TOPIC, run.progress(None))
    if key is not None:
        return await ctx.commit(lambda conn: result)
    return result


async def _one(ctx: HostContext, imports: Imports, unit: SourceUnit, dry_run: bool,
               key: ReceiptKey | None) -> SessionReport:
    target = imports.target
    if dry_run:
        now = ctx.now()
        return await ctx.read(lambda conn: prepare_unit(conn, unit, target, now_ms=now, dry_run=True).report)
    registry = ctx.services.sessions
    given = unit
    unit = await ctx.read(lambda conn: resolve_unit(conn, given))  # a session an earlier importer named
    sid = unit.session_id
    started_here = not registry.running(sid)
    try:
        report: SessionReport = await ctx.session_call(sid, IMPORT_UNIT, UnitCall(unit, target, key))
    except Exception as exc:  # noqa: BLE001 - one session's failure is its report, the import goes on
        code = getattr(exc, "code", "INTERNAL")
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        return SessionReport(unit.source, unit.external_id, sid).refuse(str(code), str(message))
    finally:
        if started_here:
            registry.release_if_idle(sid)
    return report
