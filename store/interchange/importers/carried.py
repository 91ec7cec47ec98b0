"""The bytes a pi-host JSONL export carries beside its lines (protocol/README.md §9), read back on import.

* ``blob`` lines: an attachment's bytes in parts (``sha256``, ``size``, ``offset``, ``data`` in base64; the
  first part also ``mimeType`` and ``kind``), or one ``{"sha256", "evicted": true}`` line for a blob the
  exporting host no longer held. The parts go to a temp file as they come (never held whole), hashed on the
  way, and are stored through the attachment store under their name only when they hash to it: a blob whose
  bytes do not match is counted (``skippedBlocks["blob(sha256 mismatch)"]``) and never stored. A blob already
  here (content-addressed) is not written again; one that no imported block refers to, or larger than the
  attachment budget (as ``attachments.importFile``), is not stored either.
* ``review_snapshot`` lines: a review snapshot's ``meta.json`` (``snapshot``) and ``before`` bytes
  (``beforeBase64``, null when the tool created the file), checked against the hashes and sizes the snapshot
  names, then staged through the review store under the copy's session (``sessionId`` the copy's,
  ``messageId`` namespaced as its messages are; :class:`store.review.StagedSnapshots`: published with the
  import's lines, gone when it is refused or undone); a snapshot already there is left as it is. Its
  ``workspacePath`` (its path relative to the exporting session's workspace) is re-rooted on the copy's
  workspace; one that is not a relative path inside it is invalid. Without it the absolute ``path`` stays.

Every blob the imported blocks refer to whose bytes are neither carried nor here is :attr:`BlobSink.lost`: the
import records it evicted, so the copy's blocks say so at once, as a rebuilt index would
(``store.upgrade.attachment_adopt.mark_lost_blobs``). An older export without these lines imports as before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from store import review
from store.attachments import BLOB_KINDS, NO_META, BlobMeta, BlobStream, blob_refs, ref_for
from store.errors import DamagedRecord
from store.interchange.importers.common import BlobRef, ParseContext, join_id
from store.interchange.importers.report import SessionReport
from store.rules import MAX_REVIEW_FILE_BYTES, MAX_REVIEW_META_BYTES, MAX_REVIEW_SNAPSHOTS

__all__ = ["CARRIED", "CarriedLines"]

CARRIED = frozenset({"blob", "review_snapshot"})
_SHA = re.compile(r"^[0-9a-f]{64}$")
_MAX_MIME = 100


@dataclass
class _Open:
    """The blob whose parts are being read."""

    sha: str
    size: int
    mime: str | None
    kind: str | None
    written: int = 0
    stream: BlobStream | None = None
    digest: Any = None
    skip: bool = False
    """Its parts are read past: the bytes are here already, or it is not to be stored."""


class CarriedLines:
    """One export file's ``blob`` and ``review_snapshot`` lines (see the module doc)."""

    def __init__(self, ctx: ParseContext, sid: str, report: SessionReport,
                 workspace: Callable[[], str | None] = lambda: None) -> None:
        self.sink = ctx.blobs
        self.reviews = ctx.reviews
        self.workspace = workspace
        """The copy's workspace root, asked when a snapshot names its ``workspacePath``."""
        self.sid = sid
        self.report = report
        self.refs: set[str] = set()
        self.done: set[str] = set()
        self.cur: _Open | None = None
        self.reviews_seen = 0
        self.reviews_here: int | None = None
        """The snapshots the copy's review folder holds (listed once, then counted as they are written): a
        file of thousands of snapshot lines past the limit never lists the folder once per line."""

    # -- what the imported blocks refer to ------------------------------------------------------------
    def referenced(self, record: Mapping[str, Any]) -> None:
        self.refs.update(blob_refs(record))

    # -- lines --------------------------------------------------------------------------------------------
    def line(self, rec: Mapping[str, Any]) -> None:
        if rec.get("type") == "blob":
            self._blob(rec)
        else:
            self._review(rec)

    def _count(self, what: str) -> None:
        self.report.skipped_blocks[what] += 1

    def _blob(self, rec: Mapping[str, Any]) -> None:
        sha = rec.get("sha256")
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            self._count("blob(invalid)")
            return
        if rec.get("evicted") is True:  # the exporting host had no bytes: nothing to store (lost unless here)
            return
        size, offset, data = rec.get("size"), rec.get("offset"), rec.get("data")
        if type(size) is not int or size < 0 or type(offset) is not int or not isinstance(data, str):
            self._count("blob(invalid)")
            return
        if offset == 0:
            self._abandon("blob(truncated)")
            self._start(sha, size, rec)
            if self.cur is None:  # an empty blob: stored (or refused) with its first line
                return
        cur = self.cur
        if cur is None or cur.sha != sha or cur.size != size:
            self._count("blob(part out of order)")
            return
        if cur.skip:
            return
        if cur.written != offset:
            self._abandon("blob(part out of order)")
            return
        try:
            part = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            self._abandon("blob(bad base64)")
            return
        if cur.written + len(part) > cur.size:
            self._abandon("blob(sha256 mismatch)")
            return
        if cur.stream is not None:
            cur.stream.write(part)
        else:
            cur.digest.update(part)
        cur.written += len(part)
        if cur.written == cur.size:
            self._finish(cur)

    def _start(self, sha: str, size: int, rec: Mapping[str, Any]) -> None:
        mime = rec.get("mimeType") if isinstance(rec.get("mimeType"), str) and rec["mimeType"] else None
        if mime is not None and len(mime) > _MAX_MIME:
            mime = None
        kind = rec.get("kind") if rec.get("kind") in BLOB_KINDS else None
        cur = _Open(sha, size, mime, kind)
        self.cur = cur
        files = self.sink.files
        if sha in self.done:
            cur.skip = True  # its bytes came once already
        elif sha not in self.refs:
            cur.skip = True
            self._count("blob(unreferenced)")
        elif size > self.sink.max_carried_bytes:
            cur.skip = True
            self._count("blob(too large)")
        elif files is not None and files.present(sha, size):
            cur.skip = True  # content-addressed: the bytes are here, nothing is written
            self._stored(cur)
        elif files is not None:
            cur.stream = files.stream()
        else:
            cur.digest = hashlib.sha256()
        if not cur.skip and size == 0:
            self._finish(cur)

    def _finish(self, cur: _Open) -> None:
        self.cur = None
        if cur.stream is not None:
            ok = cur.stream.finish(cur.sha)
        else:
            ok = cur.digest.hexdigest() == cur.sha
        if not ok:
            self._count("blob(sha256 mismatch)")
            return
        self._stored(cur)

    def _stored(self, cur: _Open) -> None:
        self.done.add(cur.sha)
        files = self.sink.files
        if files is not None:  # the metadata beside the bytes (a database rebuilt from the files reads it)
            files.write_meta(cur.sha, cur.mime, BlobMeta(kind=cur.kind) if cur.kind else NO_META, None)
        self.sink.carried.append(BlobRef(ref_for(cur.sha), cur.sha, cur.size, cur.mime or "application/octet-stream"))

    def _abandon(self, why: str) -> None:
        cur, self.cur = self.cur, None
        if cur is None:
            return
        if cur.stream is not None:
            cur.stream.abort()
        if not cur.skip:
            self._count(why)

    def _review(self, rec: Mapping[str, Any]) -> None:
        snap, encoded = rec.get("snapshot"), rec.get("beforeBase64")
        if not isinstance(snap, Mapping) or not review.well_formed(snap) or \
                not (encoded is None or isinstance(encoded, str)):
            self._count("review_snapshot(invalid)")
            return
        before: bytes | None = None
        if encoded is not None:
            try:
                before = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                self._count("review_snapshot(invalid)")
                return
        side = snap["before"]
        if (before is None) != (not side["exists"]) or (before is not None and (
                len(before) > MAX_REVIEW_FILE_BYTES or len(before) != side.get("size")
                or hashlib.sha256(before).hexdigest() != side["sha256"])):
            self._count("review_snapshot(hash mismatch)")
            return
        meta = dict(snap)
        meta["sessionId"] = self.sid
        if isinstance(meta.get("messageId"), str) and meta["messageId"]:
            meta["messageId"] = join_id(self.sid, meta["messageId"])
        for key in ("receipt", "restore", "workspacePath"):
            meta.pop(key, None)
        if "workspacePath" in snap:  # a path inside the exporting session's workspace: re-rooted on the copy's
            root = self.workspace()
            path = review.rerooted(root, snap["workspacePath"]) if root else None
            if path is None and root:
                self._count("review_snapshot(invalid)")
                return
            if path is not None:
                meta["path"] = path
        if len(orjson.dumps(meta)) > MAX_REVIEW_META_BYTES:
            self._count("review_snapshot(invalid)")
            return
        self.reviews_seen += 1
        if self.reviews is None:
            return
        directory = self.reviews.session_dir
        try:
            if review.load_meta(directory, meta["snapshotId"]) is not None:
                return  # imported before: left as it is
        except DamagedRecord:
            self._count("review_snapshot(damaged here)")
            return
        if self.reviews_here is None:
            self.reviews_here = review.count_snapshots(directory)
        if self.reviews_here >= MAX_REVIEW_SNAPSHOTS:
            self._count("review_snapshot(limit)")
            return
        if self.reviews.stage(meta, before):
            self.reviews_here += 1

    # -- end of the file ----------------------------------------------------------------------------------
    def close(self) -> None:
        """An unfinished blob is dropped; the blobs the blocks refer to that are neither carried nor here are
        :attr:`BlobSink.lost` (when the import writes: a dry run stores nothing)."""
        self._abandon("blob(truncated)")
        files = self.sink.files
        if files is None:
            return
        self.sink.lost.update(sha for sha in self.refs - self.done if not files.exists(sha))

    def abort(self) -> None:
        """The parse stopped early (refused, or its consumer left): no temp file stays behind."""
        cur, self.cur = self.cur, None
        if cur is not None and cur.stream is not None:
            cur.stream.abort()
