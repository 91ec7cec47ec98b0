"""Wire error codes and the one place exceptions become JSON-RPC error objects.

Every error object on the wire looks like::

    {"code": <int>, "message": <str>, "data": {"code": <STABLE_STRING>, "retriable": <bool>, ...}}

``error.code`` is the JSON-RPC numeric code; ``error.data.code`` is the stable
string clients switch on. The table below is the contract:

=============  ==========================================================  =========
numeric        string codes                                                retriable
=============  ==========================================================  =========
-32700         PARSE_ERROR                                                 no
-32600         INVALID_REQUEST                                             no
-32601         METHOD_NOT_FOUND                                            no
-32602         INVALID_PARAMS, INVALID_ID, INVALID_CURSOR,             no
               UNSUPPORTED_PROTOCOL
-32603         INTERNAL                                                    no
-32000         (any other string code an exception carries)                no
-32001         UNAUTHENTICATED                                             no
-32002         NOT_FOUND, SESSION_NOT_FOUND, MESSAGE_NOT_FOUND              no
-32003         CONFLICT, IDEMPOTENCY_CONFLICT, LIMIT_EXCEEDED,              no
               PLAN_REQUIRES_INTERACTIVE_SESSION, ALREADY_AUTHENTICATED,
               ENVIRONMENT_DRIFT, UNSUPPORTED_FOR_NATIVE_SESSION, FILE_CHANGED
-32004         BUSY, TIMEOUT, ACTOR_RESTARTED, SHUTTING_DOWN,               yes
               RESOURCE_EXHAUSTED
-32005         STORAGE_FULL (yes), IO_ERROR, CORRUPT_DATA, SCHEMA_TOO_NEW,  see row
               UNSUPPORTED_SQLITE
-32006         PAYLOAD_TOO_LARGE                                           no
-32007         CURSOR_EXPIRED                                              no
-32008         PERMISSION_DENIED                                           no
-32009         PROVIDER_TIMEOUT (yes), PROVIDER_UNREACHABLE (yes),         see row
               PROVIDER_UNAUTHORIZED, PROVIDER_BAD_REPLY
=============  ==========================================================  =========

This module does no I/O and imports neither trio nor the store: anything with a
string ``.code`` attribute maps by that code (optional ``.data`` dict,
``.message`` str and ``.retriable`` bool are honoured), pydantic's
``ValidationError`` maps to INVALID_PARAMS, an ``OSError`` of a full or failing disk
(ENOSPC, EDQUOT, EFBIG, EIO; EMFILE, ENFILE) to its code, everything else to INTERNAL with a
generic message (the traceback is logged, never sent). A corrupt index carries its code
(``store.indexing.group_commit.IndexCorrupt``, raised where the database is read and written).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import orjson
from pydantic import ValidationError

logger = logging.getLogger(__name__)

__all__ = [
    "RpcErrorCode",
    "RpcErrorSpec",
    "RpcFailure",
    "MethodNotFound",
    "error_object",
    "INTERNAL_MESSAGE",
]

INTERNAL_MESSAGE: Final = "internal error"
_STORAGE_ERRNOS: Final[Mapping[int, str]] = MappingProxyType({
    errno.ENOSPC: "STORAGE_FULL", errno.EDQUOT: "STORAGE_FULL", errno.EFBIG: "STORAGE_FULL",
    errno.EMFILE: "RESOURCE_EXHAUSTED", errno.ENFILE: "RESOURCE_EXHAUSTED", errno.EIO: "IO_ERROR",
})
"""An ``OSError`` that reached here unclassified (``store.errors.classify_os_error`` is the usual place)."""
_MAX_VALIDATION_ERRORS: Final = 20
_MAX_MESSAGE_CHARS: Final = 500


@dataclass(frozen=True, slots=True)
class RpcErrorSpec:
    """How one stable string code appears on the wire."""

    numeric: int
    retriable: bool


class RpcErrorCode:
    """The code table: stable string code -> (JSON-RPC numeric code, retriable)."""

    PARSE_ERROR: Final = "PARSE_ERROR"
    INVALID_REQUEST: Final = "INVALID_REQUEST"
    METHOD_NOT_FOUND: Final = "METHOD_NOT_FOUND"
    INVALID_PARAMS: Final = "INVALID_PARAMS"
    INTERNAL: Final = "INTERNAL"
    UNAUTHENTICATED: Final = "UNAUTHENTICATED"
    PAYLOAD_TOO_LARGE: Final = "PAYLOAD_TOO_LARGE"
    CURSOR_EXPIRED: Final = "CURSOR_EXPIRED"

    APPLICATION_DEFAULT: Final = RpcErrorSpec(-32000, False)

    TABLE: Final[Mapping[str, RpcErrorSpec]] = MappingProxyType(
        {
            "PARSE_ERROR": RpcErrorSpec(-32700, False),
            "INVALID_REQUEST": RpcErrorSpec(-32600, False),
            "METHOD_NOT_FOUND": RpcErrorSpec(-32601, False),
            "INVALID_PARAMS": RpcErrorSpec(-32602, False),
            "INVALID_ID": RpcErrorSpec(-32602, False),
            "INVALID_CURSOR": RpcErrorSpec(-32602, False),
            "UNSUPPORTED_PROTOCOL": RpcErrorSpec(-32602, False),
            "INTERNAL": RpcErrorSpec(-32603, False),
            "UNAUTHENTICATED": RpcErrorSpec(-32001, False),
            "NOT_FOUND": RpcErrorSpec(-32002, False),
            "SESSION_NOT_FOUND": RpcErrorSpec(-32002, False),
            "MESSAGE_NOT_FOUND": RpcErrorSpec(-32002, False),
            "CONFLICT": RpcErrorSpec(-32003, False),
            "IDEMPOTENCY_CONFLICT": RpcErrorSpec(-32003, False),
            "LIMIT_EXCEEDED": RpcErrorSpec(-32003, False),
            "PLAN_REQUIRES_INTERACTIVE_SESSION": RpcErrorSpec(-32003, False),
            "ENVIRONMENT_DRIFT": RpcErrorSpec(-32003, False),
            "FILE_CHANGED": RpcErrorSpec(-32003, False),
            "ALREADY_AUTHENTICATED": RpcErrorSpec(-32003, False),
            "UNSUPPORTED_FOR_NATIVE_SESSION": RpcErrorSpec(-32003, False),
            "BUSY": RpcErrorSpec(-32004, True),
            "TIMEOUT": RpcErrorSpec(-32004, True),
            "ACTOR_RESTARTED": RpcErrorSpec(-32004, True),
            "SHUTTING_DOWN": RpcErrorSpec(-32004, True),
            "STORAGE_FULL": RpcErrorSpec(-32005, True),
            "IO_ERROR": RpcErrorSpec(-32005, False),
            "CORRUPT_DATA": RpcErrorSpec(-32005, False),
            "SCHEMA_TOO_NEW": RpcErrorSpec(-32005, False),
            "UNSUPPORTED_SQLITE": RpcErrorSpec(-32005, False),
            "PAYLOAD_TOO_LARGE": RpcErrorSpec(-32006, False),
            "CURSOR_EXPIRED": RpcErrorSpec(-32007, False),
            "PERMISSION_DENIED": RpcErrorSpec(-32008, False),
            "RESOURCE_EXHAUSTED": RpcErrorSpec(-32004, True),
            "PROVIDER_TIMEOUT": RpcErrorSpec(-32009, True),
            "PROVIDER_UNREACHABLE": RpcErrorSpec(-32009, True),
            "PROVIDER_UNAUTHORIZED": RpcErrorSpec(-32009, False),
            "PROVIDER_BAD_REPLY": RpcErrorSpec(-32009, False),
        }
    )

    @classmethod
    def spec(cls, code: str) -> RpcErrorSpec:
        """The wire spec for ``code``; unknown codes get -32000, not retriable."""
        return cls.TABLE.get(code, cls.APPLICATION_DEFAULT)


class RpcFailure(Exception):
    """An error raised by the gateway itself (or anyone) with an explicit code."""

    def __init__(self, code: str, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = dict(data or {})


class MethodNotFound(RpcFailure):
    """The dispatcher does not know ``method`` (JSON-RPC -32601)."""

    _PREFIX = "method not found: "

    def __init__(self, method: str) -> None:
        # Tolerate callers that pass a ready-made message instead of the method name.
        method = method.removeprefix(self._PREFIX)[:100]
        super().__init__(RpcErrorCode.METHOD_NOT_FOUND, f"{self._PREFIX}{method}", data={"method": method})


def _json_safe(data: Mapping[str, Any]) -> dict[str, Any]:
    """Keep only the entries of ``data`` that orjson can serialize."""
    safe: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            continue
        try:
            orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):
            continue
        safe[key] = value
    return safe


def _validation_errors(exc: ValidationError) -> list[dict[str, str]]:
    compact: list[dict[str, str]] = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = ".".join(str(part) for part in err.get("loc", ()))
        compact.append({"loc": loc, "msg": str(err.get("msg", "")), "type": str(err.get("type", ""))})
        if len(compact) >= _MAX_VALIDATION_ERRORS:
            break
    return compact


def _leaf(exc: BaseException) -> BaseException:
    """Unwrap exception groups that hold exactly one exception."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


PREFIXED_CODES: frozenset[str] = frozenset({"PERMISSION_DENIED"})
"""Codes whose message starts with ``<CODE>: ``: seed 003 D597, the desktop outbox drops a permanently refused
append "whose host error carries a PERMISSION_DENIED: prefix" (and keeps draining) by the message text."""


def _build(code: str, message: str, extra: Mapping[str, Any], retriable: bool = False) -> dict[str, Any]:
    spec = RpcErrorCode.spec(code)
    if code in PREFIXED_CODES and not message.startswith(f"{code}:"):
        message = f"{code}: {message}"
    data = _json_safe(extra)
    data["code"] = code
    data["retriable"] = spec.retriable or retriable
    return {"code": spec.numeric, "message": message[:_MAX_MESSAGE_CHARS], "data": data}


def error_object(exc: BaseException) -> dict[str, Any]:
    """Translate ``exc`` into a JSON-RPC error object. The one place this happens.

    ``BaseException``s that are not ``Exception``s (``trio.Cancelled``,
    ``KeyboardInterrupt``...) are never mapped: they are re-raised unchanged.
    """
    leaf = _leaf(exc)
    if not isinstance(leaf, Exception):
        raise leaf
    if isinstance(leaf, ValidationError):
        return _build(
            RpcErrorCode.INVALID_PARAMS,
            f"invalid params: {leaf.error_count()} error(s)",
            {"errors": _validation_errors(leaf)},
        )
    code = getattr(leaf, "code", None)
    if isinstance(code, str) and code:
        message = getattr(leaf, "message", None)
        if not isinstance(message, str) or not message:
            message = str(leaf) or code.lower().replace("_", " ")
        data = getattr(leaf, "data", None)
        retriable = getattr(leaf, "retriable", False)
        return _build(
            code,
            message,
            data if isinstance(data, Mapping) else {},
            retriable is True,
        )
    storage = _STORAGE_ERRNOS.get(leaf.errno or 0) if isinstance(leaf, OSError) else None
    if storage is not None and isinstance(leaf, OSError):
        # a storage failure no layer classified: said as what it is (retry, free space), not INTERNAL
        logger.warning("unclassified storage error while handling a request", exc_info=leaf)
        # strerror only: str(leaf) would carry the file's path to the client
        return _build(storage, f"storage error: {leaf.strerror or storage.lower()}", {"errno": leaf.errno})
    logger.error("unexpected exception while handling a request", exc_info=leaf)
    return _build(RpcErrorCode.INTERNAL, INTERNAL_MESSAGE, {})
