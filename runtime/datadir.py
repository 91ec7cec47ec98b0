"""Data directory resolution, layout and the one-host-per-directory lock.

Two installations run side by side (seed 003 §2, D599): a packaged app keeps
its tree in ``~/.pi-desktop``, a development build (``pi-host --dev``, which
``./scripts/serve`` passes) in ``~/.pi-desktop-dev``. ``--data-dir`` and then
``PI_DESKTOP_DATA_DIR`` replace either root outright; the result is absolute.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal

from store.attachments import ATTACHMENTS_DIR
from store.errors import classify_os_error
from store.ids import validate_session_id
from store.receipts import RECEIPTS_DIR
from store.transcripts.session_files import SessionPaths

SUBDIRS = (
    "sessions",
    "secrets",
    "config-sync",
    "attachments",
    "plugins",
    "logs",
    "cache",
    "crash-dumps",
    "review-changes",
    "scratch",
    "quarantine",
    RECEIPTS_DIR,
)


SESSION_PATHS_KEPT = 1024
"""Sessions whose :class:`SessionPaths` a :class:`DataDir` keeps (``DataDir.session_paths``)."""

PACKAGED_ROOT = ".pi-desktop"
DEV_ROOT = ".pi-desktop-dev"
# Why the host serves the root it serves: --data-dir, PI_DESKTOP_DATA_DIR, --dev's default, the packaged default.
RootSource = Literal["flag", "env", "dev", "packaged"]


NOT_A_FOLDER = "it is not a folder"
"""Why a data directory that is a file (or other non-folder) cannot be used."""


class DataDirLocked(RuntimeError):
    """Another host already owns this data directory."""


class DataDirUnsafe(RuntimeError):
    """A folder of the data directory is a symlink (or not a folder): refused, never followed or chmod'ed."""


@dataclass(frozen=True)
class DataDir:
    root: Path

    @classmethod
    def resolve(cls, flag: str | None, env: Mapping[str, str], *, dev: bool = False) -> DataDir:
        """``--data-dir`` > ``PI_DESKTOP_DATA_DIR`` > ``~/.pi-desktop-dev`` (dev) or ``~/.pi-desktop``."""
        return cls.locate(flag, env, dev=dev)[0]

    @classmethod
    def locate(cls, flag: str | None, env: Mapping[str, str], *, dev: bool = False) -> tuple[DataDir, RootSource]:
        """:meth:`resolve`, and which rule chose the root."""
        source: RootSource
        if flag:
            raw, source = flag, "flag"
        elif env.get("PI_DESKTOP_DATA_DIR"):
            raw, source = env["PI_DESKTOP_DATA_DIR"], "env"
        else:
            home = env.get("HOME") or os.path.expanduser("~")
            raw, source = (os.path.join(home, DEV_ROOT), "dev") if dev else (os.path.join(home, PACKAGED_ROOT),
                                                                             "packaged")
        return cls(Path(os.path.abspath(os.path.expanduser(raw)))), source

    @staticmethod
    def describe(root: Path, source: RootSource) -> str:
        """The host's first output line: which root it serves, and why."""
        if source == "packaged":
            return (f"pi-host: serving the default data directory {root} (the desktop app's data); "
                    f"--data-dir DIR serves another, --dev the development root ~/{DEV_ROOT}")
        if source == "dev":
            return (f"pi-host: serving the development data directory {root} (--dev); "
                    f"the desktop app's ~/{PACKAGED_ROOT} is not touched")
        why = "--data-dir" if source == "flag" else "PI_DESKTOP_DATA_DIR"
        return f"pi-host: serving the data directory {root} ({why})"

    def ensure(self) -> None:
        """Create the directory tree of seed §2 with owner-only permissions.

        The root may be a symlink (a data directory kept on another disk); a folder
        *inside* it that is a symlink or not a directory is refused with
        :class:`DataDirUnsafe` before anything is opened through it: following it
        would read, index and chmod files outside the data directory.
        """
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for name in SUBDIRS:
            path = self.root / name
            try:
                path.mkdir(mode=0o700)
            except FileExistsError:
                pass
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode):
                what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a folder"
                raise DataDirUnsafe(
                    f"{path} is {what}: pi-host refuses data-directory folders it would have to follow "
                    f"out of {self.root} (move the real folder to {path}, or remove the link)")
            os.chmod(path, 0o700, follow_symlinks=False)

    # files -----------------------------------------------------------------
    @property
    def db_path(self) -> Path:
        return self.root / "pi.sqlite"

    @cached_property
    def sessions_dir(self) -> Path:
        return self.root / "sessions"

    @cached_property
    def scratch_root(self) -> Path:
        return self.root / "scratch"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def attachments_dir(self) -> Path:
        return self.root / ATTACHMENTS_DIR

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    @cached_property
    def review_changes_dir(self) -> Path:
        return self.root / "review-changes"

    @property
    def lock_path(self) -> Path:
        return self.root / "host.lock"

    @property
    def token_path(self) -> Path:
        return self.root / "host.token"

    @property
    def host_json_path(self) -> Path:
        return self.root / "host.json"

    @property
    def clean_shutdown_path(self) -> Path:
        return self.root / "clean-shutdown"

    @property
    def index_corrupt_path(self) -> Path:
        """Written when a host stops because it met its index corrupt: the next boot rebuilds it, even if that
        stop was not followed by the in-process restart (a signal came meanwhile)."""
        return self.root / "index-corrupt"

    # per session (ids validated before any path is built) -------------------
    def transcript(self, session_id: str) -> Path:
        return self.session_paths(session_id).transcript

    def deleted_transcript(self, session_id: str) -> Path:
        """Where an older build renamed a transcript while deleting it."""
        return self.session_paths(session_id).legacy_deleted

    def delete_marker(self, session_id: str) -> Path:
        return self.session_paths(session_id).delete_marker

    def revisions(self, session_id: str) -> Path:
        return self.session_paths(session_id).revisions

    def inflight(self, session_id: str) -> Path:
        return self.session_paths(session_id).inflight

    def scratch(self, session_id: str) -> Path:
        return self.session_paths(session_id).scratch

    def review_changes(self, session_id: str) -> Path:
        return self.session_paths(session_id).review_changes

    def transcript_path(self, session_id: str) -> Path:
        """The transcript of one session (a read-pool thread may ask: builds nothing shared)."""
        return self.session_paths(session_id).transcript

    def unusable(self, why: str) -> str:
        """The one line every command prints when it cannot use this folder as a data directory (``why``: e.g.
        :data:`NOT_A_FOLDER`)."""
        return f"pi-host: cannot use {self.root} as the data directory: {why}"

    def session_paths(self, session_id: str) -> SessionPaths:
        """Every path of one session, each joined when first asked for (see ``SessionPaths``).

        Kept per session id (at most :data:`SESSION_PATHS_KEPT`, then forgotten all at once): a read
        asks for them on every request, and building them again (the id's check, two ``pathlib``
        joins and each path's string for the worker thread's ``open``) cost 15 us of a 0.3 ms
        ``session.get``. A ``SessionPaths`` holds nothing but paths, so sharing it is safe."""
        kept = self._session_paths_kept
        paths = kept.get(session_id) if isinstance(session_id, str) else None
        if paths is None:
            paths = SessionPaths(validate_session_id(session_id), self.sessions_dir, self.scratch_root,
                                 self.review_changes_dir)
            if len(kept) >= SESSION_PATHS_KEPT:
                kept.clear()
            kept[session_id] = paths
        return paths

    @cached_property
    def _session_paths_kept(self) -> dict[str, SessionPaths]:
        return {}


_LOCK_ATTEMPTS = 8


def _same_file(fd: int, path: Path) -> bool:
    """``fd`` is the file at ``path`` now (not one unlinked or replaced since it was opened)."""
    try:
        there = os.lstat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


class DataDirLock:
    """An exclusive ``flock`` on ``host.lock``; the kernel drops it on SIGKILL."""

    def __init__(self, data_dir: DataDir) -> None:
        self._data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        path = self._data_dir.lock_path
        for _ in range(_LOCK_ATTEMPTS):
            fd = self._lock(path)
            if _same_file(fd, path):
                break
            # The file was unlinked (``pi-host doctor`` removes a lock file it created) between our open and
            # our flock: a lock on it excludes nobody. Open the file now at the path and lock that.
            os.close(fd)
        else:
            raise DataDirLocked(f"the lock file {path} keeps being replaced; is another program removing it?")
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:  # a full disk (STORAGE_FULL), an I/O error: said as such, not a traceback
            os.close(fd)  # and the lock with it
            raise classify_os_error(exc, f"write the lock file {path}") from exc
        self._fd = fd

    def _lock(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                owner = ""
                try:
                    owner = path.read_text().strip()
                except OSError:
                    pass
                raise DataDirLocked(
                    f"data directory {self._data_dir.root} is already in use by another "
                    f"pi-host{f' (pid {owner})' if owner else ''}"
                ) from None
            raise
        return fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


@contextmanager
def held_leaving_no_file(data_dir: DataDir) -> Iterator[None]:
    """Hold the data directory's lock; a ``host.lock`` created here is unlinked before it is released
    (``pi-host doctor``, and a host's start before it decides to serve, leave no file that was not there).

    Whether the file was there is decided atomically (``O_EXCL``), so a lock file a
    host created is never removed; ours is removed while we still hold it, so no
    host can be holding it then.
    """
    created = _create_if_absent(data_dir.lock_path)
    try:
        lock = DataDirLock(data_dir)
        lock.acquire()  # DataDirLocked: a host took the file meanwhile; it stays, it is the host's now
        try:
            yield
        finally:
            try:
                if created is not None:
                    _unlink_if_same(data_dir.lock_path, created)
            finally:
                lock.release()
    finally:
        if created is not None:
            os.close(created)


def _create_if_absent(path: Path) -> int | None:
    """An fd of ``path`` when this call created it; None when it already existed."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return None


def _unlink_if_same(path: Path, fd: int) -> None:
    """Remove ``path`` if it is still the file ``fd`` was opened on."""
    mine = os.fstat(fd)
    try:
        there = os.lstat(path)
    except FileNotFoundError:
        return
    if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
        path.unlink()
