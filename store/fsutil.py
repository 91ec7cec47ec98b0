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
import sqlite3
import stat
import threading

from store.errors import Conflict, NotDurable, classify_os_error
from store.faults import NO_FAULTS, Faults

__all__ = [
    "TEMP_MARKER",
    "is_temp_name",
    "NotRegularFile",
    "OwedSyncs",
    "atomic_write",
    "fsync_dir",
    "published_fsync_dir",
    "open_nofollow",
    "owner_only",
    "owner_only_fd",
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


class OwedSyncs:
    """The directories of one store whose fsync failed after a file in them was published or removed: that
    change is in place, its durability unknown, and a retry that finds it there (nothing left to write)
    must not be acknowledged on it. RELIABILITY rule 7 (an fsync error is fatal for what it covered; never
    retry-then-ack: a later fsync that succeeds proves nothing, the kernel may have dropped the failed
    writeback): the store calls :meth:`pay` before anything it answers, and while a directory is owed
    :meth:`pay` raises :class:`~store.errors.NotDurable` (``IO_ERROR``) without trying again, for the rest
    of the process. Memory only: the next boot trusts the disk. A directory that no longer exists is
    dropped (what it held went with it). One per store (the object that serializes its writers), never
    module-level; thread-safe (stores run in worker threads)."""

    def __init__(self) -> None:
        self._owed: dict[str, str] = {}
        self._lock = threading.Lock()

    def owe(self, directory: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
        """``directory``'s fsync failed after ``path`` in it was published or removed."""
        with self._lock:
            self._owed.setdefault(os.fspath(directory), os.fspath(path))

    def owed(self) -> list[str]:
        with self._lock:
            return sorted(self._owed)

    def pay(self) -> None:
        """:class:`~store.errors.NotDurable` while a directory is owed (until the host restarts)."""
        with self._lock:
            for directory in [d for d in self._owed if not os.path.isdir(d)]:
                del self._owed[directory]  # gone with what it held: nothing left to make durable
            owed = sorted(self._owed.items())
        if owed:
            directory, path = owed[0]
            raise NotDurable(f"an fsync of the directory of {path} failed earlier in this run: writes there are "
                             "refused until the host restarts (the change is in place, its durability unknown)",
                             data={"path": path})


def published_fsync_dir(directory: str | os.PathLike[str], published: str | os.PathLike[str],
                        *, owed: OwedSyncs | None = None) -> None:
    """:func:`fsync_dir` after ``published`` appeared in ``directory`` (a rename, a link, a create): its
    failure is :class:`~store.errors.NotDurable` (the effect is there, its durability unknown), and
    ``owed`` records that the directory's fsync is owed (:class:`OwedSyncs`)."""
    try:
        fsync_dir(directory)
    except OSError as exc:
        if owed is not None:
            owed.owe(directory, published)
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


_CANNOT_CHMOD = frozenset({errno.EPERM, errno.EROFS, errno.ENOTSUP, errno.EOPNOTSUPP})


def owner_only(path: str | os.PathLike[str]) -> bool:
    """Make a regular file the host keeps (its index and what SQLite derives from it) ``0600`` when its mode
    lets anyone but the owner in (a file an earlier build or a copy left ``0644``); whether it changed. A path
    that is gone or not a regular file is left alone, and so is a file system that keeps no modes (or a file
    another user owns: ``EPERM``, read-only, no ``chmod``): the data directory itself is ``0700`` there."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or not stat.S_IMODE(st.st_mode) & 0o077:
            return False
        os.chmod(path, 0o600)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in _CANNOT_CHMOD:
            return False
        raise classify_os_error(exc, f"making {os.fspath(path)} owner-only") from exc
    return True


def owner_only_fd(fd: int, what: str) -> bool:
    """:func:`owner_only` for a file the host holds open (a transcript or a revisions file an earlier app
    created ``0644`` and the host now appends to): ``fchmod`` to ``0600`` when anyone but the owner may read it;
    whether it changed. Left alone where modes cannot be set (as :func:`owner_only`)."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not stat.S_IMODE(st.st_mode) & 0o077:
            return False
        os.fchmod(fd, 0o600)
    except OSError as exc:
        if exc.errno in _CANNOT_CHMOD:
            return False
        raise classify_os_error(exc, f"making {what} owner-only") from exc
    return True


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
    owed: OwedSyncs | None = None,
) -> None:
    """Replace ``path`` with ``data``: the file is wholly old or wholly new, never a mix.

    With ``exclusive`` the file must not exist yet: it is published with
    ``link`` instead of ``replace`` (:class:`~store.errors.Conflict` if the name
    is taken), so it appears whole or not at all and never overwrites.

    Sibling temp ``<name>.tmp.<hex>`` (``O_EXCL``, 0600) → write → fsync →
    ``os.replace`` → fsync the directory. On an ``OSError`` the temp file is
    removed and :class:`~store.errors.StorageFull` / :class:`~store.errors.IOFailure`
    is raised; a failed directory fsync (the new file already in place) is
    :class:`~store.errors.NotDurable` (``owed``, when given, then records the directory: see
    :class:`OwedSyncs`). Any other exception (an injected crash) leaves the temp file for
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
        published_fsync_dir(directory, target, owed=owed)
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


def remove_file_durable(path: str | os.PathLike[str], *, owed: OwedSyncs | None = None,
                        faults: Faults = NO_FAULTS, point_prefix: str | None = None) -> bool:
    """Unlink ``path`` and fsync its directory. Returns False if it did not exist. A failed fsync (the
    file gone, its removal's durability unknown) raises as any I/O error does; ``owed`` records it.
    ``point_prefix``: fault points ``<prefix>.before_unlink`` and ``<prefix>.before_dirsync``."""
    target = os.fspath(path)
    try:
        try:
            if point_prefix is not None:
                faults.point(f"{point_prefix}.before_unlink")
            os.unlink(target)
        except FileNotFoundError:
            return False
        directory = _parent(target)
        try:
            if point_prefix is not None:
                faults.point(f"{point_prefix}.before_dirsync")
            fsync_dir(directory)
        except OSError:
            if owed is not None:
                owed.owe(directory, target)
            raise
    except OSError as exc:
        raise classify_os_error(exc, f"remove {target}") from exc
    return True


def database_folder(conn: sqlite3.Connection) -> str | None:
    """The folder of ``conn``'s main database file: the data directory (None for a database in memory)."""
    for _, name, file in conn.execute("PRAGMA database_list"):
        if name == "main" and file:
            return os.path.dirname(str(file))
    return None
