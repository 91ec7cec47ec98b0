"""Opening files the host reads on someone else's behalf, safely (ARCHITECTURE.md "Gateway and protocol").

A path that comes from a request (an attachment to import, a workspace's plan
artifact) or from a data directory someone else could write into (a planted
symlink, a FIFO) must never make the host read outside where it may, block
forever, or read without bound. Every such open goes through here:

* :func:`check_path` — a path from params: text without NUL, absolute when
  asked, at most ``MAX_PATH_BYTES`` UTF-8 bytes and ``MAX_PATH_COMPONENT_BYTES``
  per component (``INVALID_PARAMS`` instead of ``ValueError`` or
  ``ENAMETOOLONG``);
* :func:`open_under` — walk from an allowed root one component at a time with
  ``O_NOFOLLOW`` (``openat``), so no symlink anywhere below the root is
  followed; the file itself is opened ``O_RDONLY | O_NOFOLLOW | O_NONBLOCK``
  (a FIFO or device never blocks the open) and ``fstat``-checked: a regular
  file, at most ``max_bytes`` — before a single byte is read;
* :func:`open_regular` — the same for a path the host built itself (its own
  data directory): last component ``O_NOFOLLOW``, non-blocking, regular;
* :func:`read_bounded` — read a file opened that way, never past its size at
  open time nor ``max_bytes``;
* :func:`path_error` — every ``OSError`` on such a path as a stable code.

Synchronous (callers run it in a worker thread).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from typing import Any

import orjson

from store.errors import (
    InvalidInput,
    IOFailure,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    StoreError,
    classify_os_error,
)
from store.rules import MAX_PATH_BYTES, MAX_PATH_COMPONENT_BYTES

__all__ = ["check_path", "is_under", "open_regular", "open_under", "path_error", "read_bounded", "read_json_file"]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def check_path(path: object, *, field: str = "path", absolute: bool = True) -> str:
    """A filesystem path from params, or ``INVALID_PARAMS`` naming ``field``."""
    def bad(reason: str) -> InvalidInput:
        return InvalidInput(f"{field} {reason}", data={"field": field})

    if not isinstance(path, str) or not path:
        raise bad("must be a non-empty string")
    if "\x00" in path:
        raise bad("must not contain a NUL character")
    try:
        raw = path.encode("utf-8")
    except UnicodeEncodeError:
        raise bad("is not valid Unicode text") from None
    if len(raw) > MAX_PATH_BYTES:
        raise bad(f"is longer than {MAX_PATH_BYTES} bytes")
    if any(len(part) > MAX_PATH_COMPONENT_BYTES for part in raw.split(b"/")):
        raise bad(f"has a component longer than {MAX_PATH_COMPONENT_BYTES} bytes")
    if absolute and not os.path.isabs(path):
        raise bad("must be an absolute path")
    return path


def path_error(exc: OSError, path: str, *, field: str = "path", what: str = "open") -> StoreError:
    """The stable error for an ``OSError`` on a path from input (never ``INTERNAL``)."""
    code = exc.errno
    data = {"field": field, "path": path, "errno": code}
    reason = exc.strerror or type(exc).__name__
    if code == errno.ENOENT:
        return NotFound(f"{path} does not exist", data=data)
    if code in (errno.ELOOP, errno.ENOTDIR):
        return InvalidInput(f"{path} is not a plain path to a file (a symbolic link or a non-directory is on "
                            f"the way; symlinks are not followed)", data=data)
    if code in (errno.ENAMETOOLONG, errno.EINVAL):
        return InvalidInput(f"{field} is not a usable path ({reason})", data=data)
    if code in (errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.ETXTBSY):
        return InvalidInput(f"{path} is not a regular file", data=data)
    if code in (errno.EACCES, errno.EPERM):
        return PermissionDenied(f"{what} {path}: permission denied", data=data)
    return classify_os_error(exc, f"{what} {path}")


def is_under(path: str, roots: Iterable[str]) -> str | None:
    """The root ``path`` lies under (lexically, after normalising ``..``), else ``None``."""
    norm = os.path.normpath(path)
    for root in roots:
        base = os.path.normpath(root)
        if norm == base or norm.startswith(base.rstrip("/") + "/"):
            return base
    return None


def _regular(fd: int, path: str, max_bytes: int | None, field: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"{path} is not a regular file", data={"field": field, "path": path})
    if max_bytes is not None and st.st_size > max_bytes:
        raise PayloadTooLarge(f"{path} is {st.st_size} bytes, over the limit of {max_bytes}",
                              data={"field": field, "path": path, "size": st.st_size, "limit": max_bytes})
    return st


def open_under(path: str, roots: Iterable[str], *, max_bytes: int | None, field: str = "path") -> int:
    """Open ``path`` for reading if it is a regular file under one of ``roots`` reached without symlinks.

    Returns the descriptor (the caller closes it). ``PERMISSION_DENIED`` when
    the path lies under no allowed root.
    """
    check_path(path, field=field)
    root_list = [os.path.normpath(r) for r in roots]
    base = is_under(path, root_list)
    if base is None:
        raise PermissionDenied(
            f"{path} is outside the folders this host may read for you: "
            f"{', '.join(root_list) if root_list else '(none configured)'}",
            data={"field": field, "path": path, "allowedRoots": root_list})
    rel = os.path.relpath(os.path.normpath(path), base)
    parts = [] if rel == "." else rel.split(os.sep)
    if not parts:
        raise InvalidInput(f"{path} is a folder, not a file", data={"field": field, "path": path})
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            for part in parts[:-1]:
                fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=fds[-1])
        except OSError as exc:
            raise path_error(exc, path, field=field) from None
    finally:
        for d in fds:
            os.close(d)
    return _checked(fd, path, max_bytes, field)


def open_regular(path: str | os.PathLike[str], *, max_bytes: int | None = None, field: str = "path") -> int:
    """Open a path the host built (its data directory) for reading: no symlink, no FIFO, bounded."""
    text = os.fspath(path)
    try:
        fd = os.open(text, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise path_error(exc, text, field=field) from None
    return _checked(fd, text, max_bytes, field)


def _checked(fd: int, path: str, max_bytes: int | None, field: str) -> int:
    try:
        _regular(fd, path, max_bytes, field)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(fd: int, max_bytes: int, *, path: str = "", start: int = 0) -> bytes:
    """Read from ``start`` to the end, at most the file's size at this moment and ``max_bytes``.

    A file that grows while it is read is not followed past what ``fstat``
    said; one larger than ``max_bytes`` is ``PAYLOAD_TOO_LARGE``.
    """
    try:
        size = os.fstat(fd).st_size
        want = max(0, size - start)
        if want > max_bytes:
            raise PayloadTooLarge(f"{path or 'file'} holds {want} bytes to read, over the limit of {max_bytes}",
                                  data={"path": path, "size": want, "limit": max_bytes})
        chunks: list[bytes] = []
        pos = start
        end = start + want
        while pos < end:
            chunk = os.pread(fd, min(_CHUNK, end - pos), pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise IOFailure(f"read {path or 'file'}: {exc.strerror or exc}", data={"errno": exc.errno}) from None


def read_json_file(path: str | os.PathLike[str], max_bytes: int) -> Any:
    """The JSON value of the regular file at ``path`` (at most ``max_bytes``, never through a symlink);
    ``None`` when there is no file or its bytes are not JSON (a record file a crash left half written is
    then replaced by its next write)."""
    try:
        fd = open_regular(path, max_bytes=max_bytes)
    except FileNotFoundError:
        return None
    try:
        raw = read_bounded(fd, max_bytes, path=os.fspath(path))
    finally:
        os.close(fd)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
