"""Attachments (seed 000 §2.3, §5): content-addressed blobs under ``attachments/<sha256>``.

``put`` / ``importFile`` write the blob first (hashing while copying, in the
blob store's own worker thread; writers serialized by its lock), then one
transaction with the index row and the receipt. A blob is named by its
content, so a retry after a crash between the two writes the same bytes to
the same name and gets the same answer: the effect happens once; a blob whose
row never landed is an orphan that ``attachments.gc`` removes.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import trio

from protocol import models as m
from runtime.context import HostContext, ReadContext, WriterContext
from store import attachments
from store.errors import InvalidInput, NotFound, PayloadTooLarge
from store.faults import Faults
from store.indexing import index
from store.receipts import ReceiptKey

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Blobs", "estimate", "gc", "get", "import_file", "put", "ref"]

SERVICE = "blobs"


class Blobs:
    """The blob files with their one writer lock and their own worker thread."""

    def __init__(self, directory: Any, *, faults: Faults, import_roots: Sequence[str] = ()) -> None:
        self.files = attachments.AttachmentFiles(directory, faults=faults)
        self.import_roots = tuple(import_roots)
        self.lock = trio.Lock()
        self._thread = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self._thread)


def _blob_result(sha: str, size: int, name: str | None, mime: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"ref": attachments.ref_for(sha), "sha256": sha, "size": size}
    if name is not None:
        out["name"] = name
    if mime is not None:
        out["mimeType"] = mime
    return out


def _meta(p: m.BlobMetadata) -> attachments.BlobMeta:
    return attachments.BlobMeta(kind=p.kind, trust=p.trust, provenance=p.provenance, source=p.source,
                                run_id=p.run_id, meta=p.meta)


async def _store(ctx: HostContext, write: Callable[[], tuple[str, int]], name: str | None,
                 mime: str | None, meta: attachments.BlobMeta) -> Any:
    blobs: Blobs = ctx.services.get(SERVICE)
    async with blobs.lock:
        sha, size = await blobs.run(write)
        now = ctx.now()
        # the metadata beside the bytes too, before the answer: a database rebuilt from the files reads it back
        prior = await ctx.read(attachments.row_meta, sha)
        await blobs.run(blobs.files.write_meta, sha, mime, meta, now, prior)

        def effect(conn: Any) -> Any:
            attachments.record_blob(conn, sha, size, mime, now, meta)
            stored = attachments.blob_row(conn, sha)  # the first writer's metadata stays: answer what is stored
            kept = stored.get("mimeType") if stored is not None else None
            return _blob_result(sha, size, name, kept if isinstance(kept, str) else mime)

        return await ctx.commit(effect)


def _decoded(data_base64: str) -> bytes:
    try:
        data = base64.b64decode(data_base64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("dataBase64 is not valid base64", data={"field": "dataBase64"}) from None
    if len(data) > attachments.MAX_PUT_BYTES:
        raise PayloadTooLarge(f"attachment is larger than {attachments.MAX_PUT_BYTES} bytes; use "
                              "attachments.importFile", data={"field": "dataBase64"})
    return data


async def put(ctx: HostContext, p: m.AttachmentsPutParams, key: ReceiptKey | None) -> Any:
    # megabytes of base64: a worker thread's work, not the trio loop's (the hash is the blob store's thread's)
    data = await ctx.in_thread(_decoded, p.data_base64)
    blobs: Blobs = ctx.services.get(SERVICE)
    return await _store(ctx, lambda: blobs.files.put_bytes(data), p.name, p.mime_type, _meta(p))


async def import_file(ctx: HostContext, p: m.AttachmentsImportParams, key: ReceiptKey | None) -> Any:
    """Only files under an allowed folder (``store.safe_open.open_under``): the session's project, the data
    directory's ``scratch/`` and the configured import roots; never the rest of the data directory."""
    blobs: Blobs = ctx.services.get(SERVICE)
    data_dir = ctx.services.data_dir
    roots = [str(data_dir.scratch_root), *blobs.import_roots]
    if p.session_id is not None:
        row = await ctx.read(index.require_session, p.session_id)
        if row.get("projectPath"):
            roots.insert(0, str(row["projectPath"]))
    budget = await ctx.read(attachments.budget_bytes)
    exclude = [str(data_dir.root)]
    return await _store(ctx, lambda: blobs.files.import_file(p.path, max_bytes=budget, roots=roots, exclude=exclude),
                        p.name, p.mime_type, _meta(p))


def ref(ctx: WriterContext, p: m.AttachmentsRefParams, key: ReceiptKey | None) -> Any:
    created = attachments.record_ref(ctx.conn, p.sha256, p.session_id, p.message_id, ctx.now)
    out: dict[str, Any] = {"sha256": p.sha256, "sessionId": p.session_id, "created": created}
    if p.message_id is not None:
        out["messageId"] = p.message_id
    return out


def get(ctx: ReadContext, p: m.AttachmentsGetParams) -> Any:
    """A blob's metadata (seed 000 §2.3), deletion state and references; an evicted blob is a tombstone."""
    out = attachments.blob_wire(ctx.conn, p.sha256)
    if out is None:
        raise NotFound(f"attachment {p.sha256} not found", data={"sha256": p.sha256})
    return out


def estimate(ctx: ReadContext, p: m.AttachmentsEstimateParams) -> Any:
    """Usage of the blobs whose bytes are here (a blob file deleted by hand no longer counts, GC or not)."""
    return attachments.estimate(ctx.conn, check_bytes=True).to_wire()


async def gc(ctx: HostContext, p: m.AttachmentsGcParams, key: ReceiptKey | None) -> Any:
    """Sweep blobs nothing references any more (last used before the grace), then evict over budget
    (never the active session's blocks' blobs), references marked before bytes go;
    references are derived from the session files and the queue first; repair orphans and lost bytes.
    The answer is recorded with the marks under the receipt key: a retry after a crash finishes the
    same eviction and answers it (``attachments.collect``)."""
    blobs: Blobs = ctx.services.get(SERVICE)
    db = ctx.services.db
    sessions_dir = ctx.services.data_dir.sessions_dir
    now = ctx.now()

    def write(fn: Callable[[Any], Any]) -> Any:
        return trio.from_thread.run(lambda: db.write(fn, durable=True))

    def finalize(conn: Any, result: dict[str, Any]) -> Any:
        # the answer as the marking transaction recorded it (a retry after a crash answers the same)
        out = {k: result[k] for k in ("evicted", "freedBytes", "orphansRemoved", "estimate")}
        out["unreferencedEvicted"] = result.get("unreferencedEvicted", [])  # absent: an older build's pending GC
        if result.get("scanIncomplete"):  # sessions whose files could not be read whole: nothing swept
            out["scanIncomplete"] = result["scanIncomplete"]
        return ctx.with_receipt(lambda _conn: out)(conn)

    async with blobs.lock:
        answer = await blobs.run(lambda: attachments.collect(blobs.files, write, budget=None,
                                                             active_session_id=p.active_session_id,
                                                             finalize=finalize, sessions_dir=sessions_dir,
                                                             now_ms=now, receipt=key))
    if isinstance(answer, dict) and answer.get("scanIncomplete"):
        logger.warning("attachments.gc: the files of %d session(s) could not be read whole (an over-long or "
                       "damaged line, an unreadable file): no unreferenced blob was swept; sessions: %s",
                       len(answer["scanIncomplete"]), ", ".join(answer["scanIncomplete"]),
                       extra={"sessionIds": answer["scanIncomplete"]})
    return answer
