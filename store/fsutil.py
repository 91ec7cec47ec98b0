"""Durable file primitives (RELIABILITY.md §2 rules 4-6).

Synchronous; callers run these in a worker thread. Every create, rename and
unlink is followed by an fsync of the parent directory, because without it a
new or replaced file can vanish after a power cut together with its acked
content.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat

from store.errors import Conflict, NotDurable, classify_os_error
from store.faults import NO_FAULTS, Faults

__all__ = [
    "TEMP_MARKER",
    "is_temp_name",
    "NotRegularFile",
    "atomic_write",
    "fsync_dir",
    "published_fsync_dir",
    "open_nofollow",
    "remove_file_durable",
    "sweep_temp_files",
    "write_all",
]

TEMP_MARKER = ".tmp."
"""Temp files are named ``<name>.tmp.<hex>``; boot removes stray ones."""

_TEMP_NAME = re.compile(r"\.tmp\.[0-9a-f]+\Z")


def is_temp_name(name: str) -> bool:
    """``name`` is one of our temp files (``<name>.tmp.<hex>``): a plugin's asset bundle whose plugin id
    merely contains ``.tmp.`` (``x.tmp.y.json``) is not."""
    return _TEMP_NAME.search(name) is not None


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a create/rename/unlink inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def published_fsync_dir(directory: str | os.PathLike[str], published: str | os.PathLike[str]) -> None:
    """:func:`fsync_dir` after ``published`` appeared in ``directory`` (a rename, a link, a create): its
    failure is :class:`~store.errors.NotDurable` (the effect is there, its durability unknown)."""
    try:
        fsync_dir(directory)
    except OSError as exc:
        raise NotDurable(f"fsync of the directory of {os.fspath(published)} failed ({exc.strerror or exc}); "
                         "the file is in place but may not survive a power cut",
                         data={"path": os.fspath(published), "errno": exc.errno}) from exc


class NotRegularFile(OSError):
    """A path the host opens as a data file is a FIFO, a device, a socket or a directory."""


def open_nofollow(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` of a *regular file* that never follows a symlink at the last component
    (``ELOOP``) and never blocks: ``O_NONBLOCK`` makes opening a FIFO or a device return at
    once (it changes nothing for a regular file), and ``fstat`` refuses anything else
    (:class:`NotRegularFile`, errno ``ENXIO``) before a byte is read or written."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.ENXIO, "not a regular file", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte, looping over short writes (they are real: RELIABILITY §2.2)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # pragma: no cover - os.write raises instead
            raise OSError(errno.EIO, "write returned 0 bytes")
        view = view[written:]


def _parent(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    faults: Faults = NO_FAULTS,
    point_prefix: str = "rewrite",
    exclusive: bool = False,
) -> None:
    """Replace ``path`` with ``data``: the file is wholly old or wholly new, never a mix.

    With ``exclusive`` the file must not exist yet: it is published with
    ``link`` instead of ``replace`` (:class:`~store.errors.Conflict` if the name
    is taken), so it appears whole or not at all and never overwrites.

    Sibling temp ``<name>.tmp.<hex>`` (``O_EXCL``, 0600) → write → fsync →
    ``os.replace`` → fsync the directory. On an ``OSError`` the temp file is
    removed and :class:`~store.errors.StorageFull` / :class:`~store.errors.IOFailure`
    is raised; a failed directory fsync (the new file already in place) is
    :class:`~store.errors.NotDurable`. Any other exception (an injected crash) leaves the temp file for
    :func:`sweep_temp_files`, exactly as a real crash would.
    """
    target = os.fspath(path)
    directory = _parent(target)
    tmp = f"{target}{TEMP_MARKER}{secrets.token_hex(6)}"
    renamed = False
    try:
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # the umask cannot be trusted to leave 0600
            write_all(fd, data)
            faults.point(f"{point_prefix}.after_tmp_write")
            os.fsync(fd)
            faults.point(f"{point_prefix}.after_tmp_fsync")
        finally:
            os.close(fd)
        if exclusive:
            try:
                os.link(tmp, target)
            except FileExistsError:
                _unlink_quietly(tmp)
                raise Conflict(f"{target} already exists", data={"path": target}) from None
            renamed = True
            _unlink_quietly(tmp)
        else:
            os.replace(tmp, target)
            renamed = True
        faults.point(f"{point_prefix}.after_rename")
        faults.point(f"{point_prefix}.before_dirsync")
        published_fsync_dir(directory, target)
    except OSError as exc:
        if not renamed:
            _unlink_quietly(tmp)
        raise classify_os_error(exc, f"atomic write of {target}") from exc


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # best effort: boot's sweep_temp_files removes what is left


def sweep_temp_files(directory: str | os.PathLike[str]) -> list[str]:
    """Remove stray ``*.tmp.*`` files left by interrupted atomic writes; return their paths.

    Only entries directly in ``directory`` are considered; subdirectories are
    never entered or removed. Used at boot, before anything writes.
    """
    removed: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not is_temp_name(entry.name) or entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append(entry.path)
    if removed:
        fsync_dir(directory)
    return removed


def remove_file_durable(path: str | os.PathLike[str]) -> bool:
    """Unlink ``path`` and fsync its directory. Returns False if it did not exist."""
    target = os.fspath(path)
    try:
        try:
            os.unlink(target)
        except FileNotFoundError:
            return False
        fsync_dir(_parent(target))
    except OSError as exc:
        raise classify_os_error(exc, f"remove {target}") from exc
    return True
