"""Logging: NDJSON under ``<dataDir>/logs/{host,app,agent}/<category>``, human lines to stderr.

Layout (seed 003 §2): ``logs/host/host.ndjson`` is the host's own log;
``logs/app/<category>.ndjson`` and ``logs/agent/<category>.ndjson`` hold what
the desktop app and the agent sidecar send with ``logs.append``
(:class:`ClientLogs`). A ``logs/host.ndjson`` an older host left at the top is
moved into ``logs/host/`` at start.

The host's file:

The NDJSON file rotates at the file layer (seed 003 §8, D082) within the
bounds of a :class:`LogRotation` passed in as configuration:

* a file is rotated before a record would take it past ``max_bytes``, and
  once its first record is older than ``max_age_s``;
* a rotated file is renamed ``host.ndjson.<UTC start time>`` (names sort by
  age) and a new ``host.ndjson`` is started;
* rotated files beyond the newest ``keep_files``, and rotated files that were
  started more than ``keep_days`` ago (the time in their name), are deleted.

So the host's log never takes more than ``(keep_files + 1) × max_bytes`` and
holds at most ``keep_days`` of history. Only ``host.ndjson`` and its rotated
``host.ndjson.<stamp>`` files are ever touched by it. Log files (all of
them) are created 0600 (``O_CREAT`` with mode 0600, then ``fchmod``: the umask
cannot be trusted). A log write that fails is reported by :mod:`logging` and
never breaks the host.

Who writes: no thread that logs touches a file. :func:`setup_logging` gives the
loggers a :class:`DroppingQueueHandler`, which puts each record (its message
formatted then) on a bounded queue (``LOG_QUEUE`` records) and returns; one
listener thread (``logging.handlers.QueueListener``) writes them to the file and
stderr and does the rotation's listing and renames. So the trio thread never
waits for a disk or a pipe. A full queue (a disk slower than the records come)
never makes the caller wait either: the record is dropped and counted
(``dropped``), and once the queue takes records again a warning says how many
were lost. :meth:`HostLogging.stop` (the end of ``serve``, also registered with
``atexit``) writes everything queued before it returns: a clean shutdown, or a
SIGTERM (an orderly stop), leaves a complete log; a SIGKILL loses what was still
queued (microseconds' worth, as the process's other unwritten buffers).
"""

from __future__ import annotations

import atexit
import calendar
import copy
import errno
import logging
import logging.handlers
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import TextIOWrapper
from pathlib import Path
from typing import Any

import orjson

from store.errors import InvalidInput, IOFailure, LimitExceeded, StorageFull

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}

LOG_NAME = "host.ndjson"
_ROTATED_RE = re.compile(rf"^{re.escape(LOG_NAME)}\.(\d{{8}}T\d{{6}}\.\d{{3}}Z)(?:-\d+)?$")


@dataclass(frozen=True)
class LogRotation:
    """Size and age bounds of the host's NDJSON log (defaults: 10 MiB, 1 day per file; 10 files, 14 days)."""

    max_bytes: int = 10 * 1024 * 1024
    max_age_s: float = 86_400.0
    keep_files: int = 10
    keep_days: float = 14.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1024 or self.max_age_s <= 0 or self.keep_files < 1 or self.keep_days <= 0:
            raise ValueError(f"log rotation bounds out of range: {self}")


class NdjsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def _open_log(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _stamp(seconds: float) -> str:
    ms = int(seconds * 1000)
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _parse_stamp(stamp: str) -> float:
    """Inverse of :func:`_stamp` (UTC)."""
    whole = calendar.timegm(time.strptime(stamp[:15], "%Y%m%dT%H%M%S"))
    return whole + int(stamp[16:19]) / 1000


def _first_record_time(path: Path) -> float | None:
    """When the file's first record was written (its ``ts``), or None for an empty/unreadable file."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 16)
        ts = orjson.loads(first).get("ts")
    except (OSError, ValueError, AttributeError):
        return None
    return ts / 1000 if isinstance(ts, int | float) else None


class RotatingNdjsonHandler(logging.Handler):
    """One NDJSON line per record into ``<dir>/host.ndjson``, rotated within :class:`LogRotation`."""

    def __init__(self, logs_dir: Path, rotation: LogRotation, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.directory = Path(logs_dir)
        self.path = self.directory / LOG_NAME
        self.rotation = rotation
        self._clock = clock
        self._fd: int | None = None
        self._size = 0
        self._started: float | None = None
        self.dropped = 0
        """Records lost to write errors (a full disk) since the last one written."""
        self._torn = False
        self._open()

    def _open(self) -> None:
        self._fd = _open_log(self.path)
        self._size = os.fstat(self._fd).st_size
        self._started = _first_record_time(self.path) if self._size else None
        if self._size and self._started is None:
            self._started = os.stat(self.path).st_mtime

    def _reopen(self) -> int:
        self._open()
        if self._fd is None:
            raise OSError(f"cannot open {self.path}")
        return self._fd

    def rotated_files(self) -> list[Path]:
        """The rotated files, oldest first."""
        return sorted(self.directory / n for n in os.listdir(self.directory) if _ROTATED_RE.fullmatch(n))

    def _rotate(self, now: float) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        base = self.directory / f"{LOG_NAME}.{_stamp(self._started if self._started is not None else now)}"
        target, n = base, 1
        while target.exists():
            target = base.with_name(f"{base.name}-{n}")
            n += 1
        os.rename(self.path, target)
        self._open()
        self._prune(now)

    def _prune(self, now: float) -> None:
        rotated = self.rotated_files()
        doomed = set(rotated[: max(0, len(rotated) - self.rotation.keep_files)])
        cutoff = now - self.rotation.keep_days * 86_400
        for path in rotated:
            match = _ROTATED_RE.fullmatch(path.name)
            if match is not None and _parse_stamp(match.group(1)) < cutoff:
                doomed.add(path)
        for path in doomed:
            path.unlink(missing_ok=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = (self.format(record) + "\n").encode("utf-8")
            now = self._clock()
            if self._size and (
                self._size + len(line) > self.rotation.max_bytes
                or (self._started is not None and now - self._started >= self.rotation.max_age_s)
            ):
                self._rotate(now)
            fd = self._fd if self._fd is not None else self._reopen()
            if self._torn:  # the last record stopped part way: this one starts a line of its own
                line = b"\n" + line
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                self._torn = True
                view = view[written:]
            self._torn = False
            if not self._size:
                self._started = now
            self._size += len(line)
            self.dropped = 0
        except OSError as exc:
            # A full disk (or a vanished directory) fails every record: one line on stderr when it starts,
            # not logging's traceback per record burying the host's own error; the next record written
            # ends the episode.
            if not self.dropped:
                print(f"pi-host: cannot write the host log {self.path}: {exc.strerror or exc}; "
                      "records are dropped until it can be written", file=sys.stderr, flush=True)
            self.dropped += 1
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.acquire()
        try:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        finally:
            self.release()
        super().close()


# -- the app's and the agent's logs (logs.append) -----------------------------------------

CLIENT_SOURCES = ("app", "agent")
HOST_CATEGORY_DIR = "host"
CATEGORY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")  # protocol.models_logs.LOG_CATEGORY_PATTERN


@dataclass(frozen=True)
class ClientLogLimits:
    """Per category file: rotated past ``max_bytes``, ``keep_files`` rotated files kept (``.1`` newest);
    at most ``max_categories`` files per source."""

    max_bytes: int = 5 * 1024 * 1024
    keep_files: int = 5
    max_categories: int = 64


class _CategoryFile(logging.handlers.RotatingFileHandler):
    """The stdlib's size-rotating file, opened 0600 without following a symlink; write errors raise."""

    def _open(self) -> TextIOWrapper:
        stream = os.fdopen(_open_log(Path(self.baseFilename)), "a", encoding="utf-8")
        assert isinstance(stream, TextIOWrapper)
        return stream

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        raise  # noqa: PLE0704 - called inside emit's except block: the caller reports it


class ClientLogs:
    """The ``logs/app/`` and ``logs/agent/`` category files (thread-safe; call from a worker thread).

    A file is opened for one call and closed after it (nothing stays open to
    leak at shutdown); one lock serializes the calls, so a rotation never
    races another write.
    """

    def __init__(self, logs_dir: Path, limits: ClientLogLimits = ClientLogLimits()) -> None:
        self.logs_dir = Path(logs_dir)
        self.limits = limits
        self._lock = threading.Lock()

    def path(self, source: str, category: str) -> Path:
        """``logs/<source>/<category>.ndjson``; source and category checked before the path is built."""
        if source not in CLIENT_SOURCES:
            raise InvalidInput(f"source must be one of {', '.join(CLIENT_SOURCES)}", data={"field": "source"})
        if not CATEGORY_RE.fullmatch(category):
            raise InvalidInput("category must be 1-64 of a-z, 0-9, - and _ (starting with a letter or digit)",
                               data={"field": "category"})
        return self.logs_dir / source / f"{category}.ndjson"

    def append(self, source: str, category: str, lines: Sequence[str]) -> int:
        """Append NDJSON ``lines`` (no newline) to the category's file; the bytes written."""
        path = self.path(source, category)
        with self._lock:
            handler: _CategoryFile | None = None
            try:
                self._check_new_category(source, category, path)
                handler = _CategoryFile(path, maxBytes=self.limits.max_bytes, backupCount=self.limits.keep_files,
                                        encoding="utf-8", delay=True)
                handler.setFormatter(logging.Formatter("%(message)s"))
                total = 0
                for line in lines:
                    handler.emit(logging.makeLogRecord({"msg": line}))
                    total += len(line.encode("utf-8")) + 1
                return total
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StorageFull(f"no space left for {path.name}", data={"category": category}) from None
                raise IOFailure(f"cannot write the {source} log {category}: {exc.strerror or exc}",
                                data={"category": category}) from None
            finally:
                if handler is not None:
                    handler.close()

    def _check_new_category(self, source: str, category: str, path: Path) -> None:
        folder = path.parent
        folder.mkdir(mode=0o700, exist_ok=True)
        if os.path.lexists(path):
            return
        known = sum(1 for n in os.listdir(folder) if n.endswith(".ndjson"))
        if known >= self.limits.max_categories:
            raise LimitExceeded(f"the {source} logs already have {known} categories "
                                f"(at most {self.limits.max_categories})",
                                data={"category": category, "limit": self.limits.max_categories})


def _move_legacy_host_log(logs_dir: Path, host_dir: Path) -> None:
    """An older host wrote ``logs/host.ndjson`` (+ rotated files) at the top: move them to ``logs/host/``."""
    for name in os.listdir(logs_dir):
        if (name == LOG_NAME or _ROTATED_RE.fullmatch(name)) and os.path.isfile(logs_dir / name):
            target = host_dir / name
            if not target.exists():
                os.rename(logs_dir / name, target)


OTHER_LOGGERS = ("actors", "runtime", "store", "protocol", "trio", "trio_websocket")
LOG_QUEUE = 4096
"""Records waiting for the log's writer thread at most (beyond: dropped and counted)."""


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """Hands each record to the writer thread through a bounded queue; never waits, never does I/O.

    The message is formatted here (its arguments may change once the caller goes on); the record's
    other fields (extras, a traceback) go as they are, for the writer's formatters. A record that
    finds the queue full is dropped and counted; the next one that gets in is followed by a warning
    saying how many were lost."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None]) -> None:
        super().__init__(records)
        self.dropped = 0
        """Records dropped because the queue was full, since the start."""
        self._unreported = 0
        self._count_lock = threading.Lock()  # any thread may log

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)
        record.message = record.getMessage()
        record.msg, record.args = record.message, None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            with self._count_lock:
                self.dropped += 1
                self._unreported += 1
            return
        if self._unreported:
            with self._count_lock:
                lost, self._unreported = self._unreported, 0
            notice = logging.makeLogRecord({
                "name": "pi_host", "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": f"{lost} log records were dropped: the log's queue was full", "droppedRecords": lost})
            try:
                self.queue.put_nowait(notice)
            except queue.Full:
                with self._count_lock:
                    self._unreported += lost


class _Listener(logging.handlers.QueueListener):
    """The writer thread. Its stop waits for room for the end mark (a full queue raised ``queue.Full``
    there): it runs at the end of ``serve``, never on the trio loop."""

    def __init__(self, records: queue.Queue[logging.LogRecord | None], *handlers: logging.Handler) -> None:
        super().__init__(records, *handlers, respect_handler_level=True)
        self._records = records

    def enqueue_sentinel(self) -> None:
        self._records.put(None)  # QueueListener's end mark (its _sentinel)


class HostLogging:
    """What :func:`setup_logging` set up: the writing ``handlers`` (the NDJSON file first, then stderr),
    the ``queue_handler`` the loggers have, and the writer thread."""

    def __init__(self, handlers: list[logging.Handler], queue_handler: DroppingQueueHandler,
                 listener: logging.handlers.QueueListener) -> None:
        self.handlers = handlers
        self.queue_handler = queue_handler
        self._listener: logging.handlers.QueueListener | None = listener
        self._lock = threading.Lock()

    @property
    def file(self) -> RotatingNdjsonHandler:
        handler = self.handlers[0]
        assert isinstance(handler, RotatingNdjsonHandler)
        return handler

    def stop(self) -> None:
        """Write everything logged so far and stop the writer thread (idempotent); records logged
        after it are dropped (counted)."""
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()
            for h in self.handlers:
                h.flush()


def teardown_logging(logs: HostLogging) -> None:
    """Stop the writer (everything queued is written), detach and close what :func:`setup_logging`
    attached (tests)."""
    logs.stop()
    for name in ("pi_host", *OTHER_LOGGERS):
        logging.getLogger(name).removeHandler(logs.queue_handler)
    logs.queue_handler.close()
    for h in logs.handlers:
        h.close()


def setup_logging(
    logs_dir: Path,
    *,
    stderr: bool = True,
    level: int = logging.INFO,
    rotation: LogRotation | None = None,
) -> HostLogging:
    root = logging.getLogger("pi_host")
    root.setLevel(level)
    root.propagate = False
    handlers: list[logging.Handler] = []
    logs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    host_dir = logs_dir / HOST_CATEGORY_DIR
    host_dir.mkdir(mode=0o700, exist_ok=True)
    try:
        _move_legacy_host_log(logs_dir, host_dir)
    except OSError as exc:
        print(f"pi-host: could not move the old host log into {host_dir}: {exc}", file=sys.stderr)
    file_handler = RotatingNdjsonHandler(host_dir, rotation or LogRotation())
    file_handler.setFormatter(NdjsonFormatter())
    handlers.append(file_handler)
    if stderr:
        human = logging.StreamHandler(sys.stderr)
        human.setFormatter(logging.Formatter("%(asctime)s pi-host %(levelname)s %(message)s", "%H:%M:%S"))
        human.addFilter(_human_loggers)
        handlers.append(human)
    records: queue.Queue[logging.LogRecord | None] = queue.Queue(LOG_QUEUE)
    queued = DroppingQueueHandler(records)
    listener = _Listener(records, *handlers)
    logs = HostLogging(handlers, queued, listener)
    root.addHandler(queued)
    # Our other packages log under their module names, trio's accept loop under "trio" (an
    # EMFILE storm logs a traceback every 0.1 s): all of it goes to the bounded, rotated file,
    # never to Python's last-resort stderr handler — a full stderr pipe would stall the host
    # (stderr shows ours and our packages', not trio's: ``_human_loggers``).
    for name in OTHER_LOGGERS:
        other = logging.getLogger(name)
        other.propagate = False
        other.addHandler(queued)
    logging.Formatter.converter = time.gmtime
    listener.start()
    atexit.register(logs.stop)  # an exit that skips serve's own stop still writes what was queued
    return logs


def _human_loggers(record: logging.LogRecord) -> bool:
    """stderr shows the host's records and its packages', not trio's or trio-websocket's (the file has them)."""
    return record.name.partition(".")[0] not in ("trio", "trio_websocket")
