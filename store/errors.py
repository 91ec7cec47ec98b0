"""Errors raised by the synchronous storage layer.

Every error carries a stable string ``code`` that the gateway copies into
``error.data.code``. The storage layer never imports the gateway: it only
names what went wrong; the edge decides how to say it on the wire.
"""

from __future__ import annotations

from typing import Any


class StoreError(Exception):
    """Base class: a storage operation failed with a stable, documented code."""

    code: str = "INTERNAL"
    retriable: bool = False

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = dict(data or {})


class InvalidInput(StoreError):
    """The request is malformed or violates a documented bound; nothing changed."""

    code = "INVALID_PARAMS"


class InvalidId(InvalidInput):
    """An id that would become a file name (or must match one) is not valid."""

    code = "INVALID_ID"


class InvalidCursor(InvalidInput):
    """A paging cursor that this host did not issue for this list (forged, foreign or stale)."""

    code = "INVALID_CURSOR"


class PayloadTooLarge(InvalidInput):
    code = "PAYLOAD_TOO_LARGE"


class NotFound(StoreError):
    code = "NOT_FOUND"


class SessionNotFound(NotFound):
    code = "SESSION_NOT_FOUND"


class MessageNotFound(NotFound):
    code = "MESSAGE_NOT_FOUND"


class Conflict(StoreError):
    """The request conflicts with durable state (e.g. a state machine refuses it)."""

    code = "CONFLICT"


class TranscriptChanged(Conflict):
    """A transcript's writer found its file replaced, removed or written by someone else; it wrote
    nothing. Reopened, the file decides again (the session actor retries an append group once)."""


class IdempotencyConflict(Conflict):
    """Same idempotency key, different request fingerprint."""

    code = "IDEMPOTENCY_CONFLICT"


class LimitExceeded(Conflict):
    """A documented capacity limit (e.g. 8 queued turns per session) is reached."""

    code = "LIMIT_EXCEEDED"


class PlanRequiresInteractiveSession(Conflict):
    """A scheduled/unattended run of a Plan or Goal task or session (seed 003 §4.11)."""

    code = "PLAN_REQUIRES_INTERACTIVE_SESSION"


class PermissionDenied(StoreError):
    """The calling client may not do this (e.g. read a secret value)."""

    code = "PERMISSION_DENIED"


class StorageFull(StoreError):
    """ENOSPC / EDQUOT / EFBIG: the write was rolled back, nothing acknowledged."""

    code = "STORAGE_FULL"
    retriable = True


class ResourceExhausted(StoreError):
    """The process is out of a resource it needs for this request (file descriptors): retry shortly."""

    code = "RESOURCE_EXHAUSTED"
    retriable = True


class IOFailure(StoreError):
    """An I/O error (EIO, failed fsync). The file is marked failed until reopened."""

    code = "IO_ERROR"


class NotDurable(IOFailure):
    """The effect is in place (a rename or a link published it, or a file was created) but the fsync of
    its directory failed: whether it survives a power cut is unknown. RELIABILITY rule 7: fatal for that
    file, never retried then acknowledged (the owner fails its storage until the host restarts). Always
    ``IO_ERROR``, an ENOSPC too: ``STORAGE_FULL`` says nothing was written."""



class CorruptData(StoreError):
    """Durable data failed validation (digest mismatch, unreadable database...)."""

    code = "CORRUPT_DATA"


class DamagedRecord(CorruptData):
    """One record that only the database holds does not read: a JSON column that no longer parses or has
    another shape than the host wrote, or a value outside its column's set. Its single-record getter answers
    ``CORRUPT_DATA``; a listing leaves the record out and names it (``unreadable``)."""


KV_REPAIR = "pi-host doctor --repair"
"""The way out named by every damaged ``kv`` record's CORRUPT_DATA (``data.repair``): the offline doctor sets the
stored bytes aside in ``quarantine/`` and deletes the row, so the host reads the record as unset again."""


def damaged_setting(ns: str, key: str, why: str, what: str | None = None) -> DamagedRecord:
    """``kv(ns, key)`` does not read (``why``): CORRUPT_DATA with ``data`` ``ns``, ``key`` and ``repair``
    (:data:`KV_REPAIR`); ``what`` names the record in the message (default ``setting <ns>/<key>``)."""
    return DamagedRecord(f"{what or f'setting {ns}/{key}'} is unreadable: {why}; `{KV_REPAIR}` on the stopped "
                         "host sets it aside (quarantine/) so it reads as unset again",
                         data={"ns": ns, "key": key, "repair": KV_REPAIR})


class SchemaTooNew(StoreError):
    code = "SCHEMA_TOO_NEW"


class UnsupportedSQLite(StoreError):
    code = "UNSUPPORTED_SQLITE"


def classify_os_error(exc: OSError, what: str) -> StoreError:
    """Map an OSError from a write path to StorageFull, ResourceExhausted or IOFailure."""
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return StorageFull(f"{what}: no space left ({exc.strerror})", data={"errno": exc.errno})
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        return ResourceExhausted(f"{what}: too many open files ({exc.strerror}); retry shortly",
                                 data={"errno": exc.errno})
    return IOFailure(f"{what}: {exc.strerror or exc}", data={"errno": exc.errno})
