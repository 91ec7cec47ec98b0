"""The host's NDJSON log rotates at the file layer within its size and age bounds (seed 003 §8)."""

from __future__ import annotations

import json
import logging
import os
import queue
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from runtime.logs import (
    LOG_NAME,
    DroppingQueueHandler,
    LogRotation,
    NdjsonFormatter,
    RotatingNdjsonHandler,
    setup_logging,
    teardown_logging,
)
from tests.threadkit import on_trio_thread

DAY = 86_400.0


class Clock:
    def __init__(self, now: float = 1_780_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    log = logging.getLogger("pi_host.test_rotation")
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log
    for h in list(log.handlers):
        log.removeHandler(h)
        h.close()


def _handler(logs: Path, logger: logging.Logger, rotation: LogRotation, clock: Clock) -> RotatingNdjsonHandler:
    handler = RotatingNdjsonHandler(logs, rotation, clock=clock)
    handler.setFormatter(NdjsonFormatter())
    logger.addHandler(handler)
    return handler


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_defaults_are_the_documented_bounds() -> None:
    assert LogRotation() == LogRotation(max_bytes=10 * 1024 * 1024, max_age_s=86_400.0, keep_files=10,
                                        keep_days=14.0)
    with pytest.raises(ValueError):
        LogRotation(max_bytes=0)


def test_a_file_rotates_before_it_would_pass_max_bytes(tmp_path: Path, logger: logging.Logger) -> None:
    clock = Clock()
    handler = _handler(tmp_path, logger, LogRotation(max_bytes=2048, keep_files=50), clock)
    for i in range(100):
        logger.info("record %03d %s", i, "x" * 60)
        clock.now += 1
    files = [*handler.rotated_files(), tmp_path / LOG_NAME]
    assert len(files) > 3
    assert all(p.stat().st_size <= 2048 for p in files)
    # every record exactly once, in order, across the rotated files (oldest first) and the live one
    messages = [r["msg"] for p in files for r in _records(p)]
    assert messages == [f"record {i:03d} {'x' * 60}" for i in range(100)]


def test_a_file_rotates_once_its_first_record_is_older_than_max_age(tmp_path: Path,
                                                                   logger: logging.Logger) -> None:
    clock = Clock()
    handler = _handler(tmp_path, logger, LogRotation(max_age_s=3600), clock)
    logger.info("first")
    clock.now += 3599
    logger.info("same file")
    assert handler.rotated_files() == []
    clock.now += 1
    logger.info("new file")
    (rotated,) = handler.rotated_files()
    assert [r["msg"] for r in _records(rotated)] == ["first", "same file"]
    assert [r["msg"] for r in _records(tmp_path / LOG_NAME)] == ["new file"]
    assert rotated.name.startswith(f"{LOG_NAME}.2026")  # named by the UTC time its first record was written


def test_an_old_file_left_by_the_last_run_rotates_on_the_first_record(tmp_path: Path,
                                                                      logger: logging.Logger) -> None:
    clock = Clock()
    (tmp_path / LOG_NAME).write_text(json.dumps({"ts": int((clock.now - 2 * DAY) * 1000), "msg": "old"}) + "\n")
    handler = _handler(tmp_path, logger, LogRotation(), clock)
    logger.info("after restart")
    assert [[r["msg"] for r in _records(p)] for p in handler.rotated_files()] == [["old"]]


def test_only_keep_files_rotated_files_are_kept(tmp_path: Path, logger: logging.Logger) -> None:
    clock = Clock()
    handler = _handler(tmp_path, logger, LogRotation(max_bytes=1024, keep_files=3), clock)
    for i in range(200):
        logger.info("line %d %s", i, "y" * 80)
        clock.now += 1
    assert len(handler.rotated_files()) == 3
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert total <= 4 * 1024
    assert _records(tmp_path / LOG_NAME)[-1]["msg"] == f"line 199 {'y' * 80}"  # the newest are kept


def test_rotated_files_older_than_keep_days_are_deleted(tmp_path: Path, logger: logging.Logger) -> None:
    clock = Clock()
    handler = _handler(tmp_path, logger, LogRotation(max_age_s=DAY, keep_days=3), clock)
    for day in range(6):
        logger.info("day %d", day)
        clock.now += DAY
    logger.info("today")
    kept = [[r["msg"] for r in _records(p)] for p in handler.rotated_files()]
    assert kept == [["day 3"], ["day 4"], ["day 5"]]  # started less than 3 days before "today"
    assert [r["msg"] for r in _records(tmp_path / LOG_NAME)] == ["today"]


def test_log_files_are_created_0600_whatever_the_umask(tmp_path: Path, logger: logging.Logger) -> None:
    old = os.umask(0)
    try:
        clock = Clock()
        handler = _handler(tmp_path, logger, LogRotation(max_bytes=1024), clock)
        for i in range(40):
            logger.info("line %d %s", i, "z" * 50)
    finally:
        os.umask(old)
    for path in [*handler.rotated_files(), tmp_path / LOG_NAME]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_rotation_touches_no_other_file(tmp_path: Path, logger: logging.Logger) -> None:
    """Other logs (the app's, the agent's) and look-alike names stay; nothing outside logs/ is visited."""
    others = {"app/main.ndjson": b"electron\n", "agent/run.ndjson": b"agent\n", "host.ndjson.bak": b"mine\n",
              "host.ndjson.notes": b"notes\n"}
    for rel, data in others.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
        os.utime(tmp_path / rel, (0, 0))  # very old: an age sweep would take them
    clock = Clock()
    _handler(tmp_path, logger, LogRotation(max_bytes=1024, keep_files=1, keep_days=1), clock)
    for i in range(100):
        logger.info("line %d %s", i, "w" * 80)
        clock.now += DAY
    assert {rel: (tmp_path / rel).read_bytes() for rel in others} == others


def test_setup_logging_writes_host_ndjson_with_the_given_bounds(tmp_path: Path) -> None:
    logs = setup_logging(tmp_path, stderr=False, rotation=LogRotation(max_bytes=4096))
    try:
        (file_handler,) = logs.handlers
        assert isinstance(file_handler, RotatingNdjsonHandler) and file_handler.rotation.max_bytes == 4096
        logging.getLogger("pi_host").info("hello %s", "there", extra={"sessionId": "s1"})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("store.x").exception("failed")
    finally:
        teardown_logging(logs)  # writes what is queued
    hello, failed = _records(tmp_path / "host" / LOG_NAME)  # seed §2: logs/host/<category>
    assert hello["msg"] == "hello there" and hello["sessionId"] == "s1"
    assert failed["logger"] == "store.x" and failed["level"] == "error" and "ValueError: boom" in failed["exc"]


async def test_the_trio_thread_never_writes_or_rotates_the_log(tmp_path: Path) -> None:
    """The host logs from the trio thread; the records are written, and the file rotated (listed, renamed,
    pruned), by the log's writer thread, never on the trio loop (a slow disk or a full stderr pipe would stall
    every request). A clean stop writes every record queued before it."""
    logs = setup_logging(tmp_path, stderr=False, rotation=LogRotation(max_bytes=2048, keep_files=100))
    seen: list[tuple[str, bool]] = []
    file = logs.file
    emit, rotate = file.emit, file._rotate

    def emit_seen(record: logging.LogRecord) -> None:
        seen.append(("write", on_trio_thread()))
        emit(record)

    def rotate_seen(now: float) -> None:
        seen.append(("rotate", on_trio_thread()))
        rotate(now)

    file.emit = emit_seen  # type: ignore[method-assign]
    file._rotate = rotate_seen  # type: ignore[method-assign]
    log = logging.getLogger("pi_host.test_writer")
    try:
        for i in range(100):
            log.info("record %03d %s", i, "x" * 60)
            await trio.lowlevel.checkpoint()
    finally:
        teardown_logging(logs)
    assert {what for what, _ in seen} == {"write", "rotate"}
    assert [what for what, on_trio in seen if on_trio] == []
    files = [*file.rotated_files(), tmp_path / "host" / LOG_NAME]
    assert [r["msg"] for p in files for r in _records(p)] == [f"record {i:03d} {'x' * 60}" for i in range(100)]


def test_a_full_log_queue_drops_and_counts_and_never_waits(tmp_path: Path) -> None:
    """The queue to the writer thread is bounded: a record that finds it full is dropped at once and counted
    (the caller, the trio thread among them, never waits), and the next record that gets in is followed by a
    warning saying how many were lost."""
    records: queue.Queue[logging.LogRecord | None] = queue.Queue(3)
    handler = DroppingQueueHandler(records)
    log = logging.getLogger("pi_host.test_full_queue")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i in range(5):
            log.warning("r%d", i)
        assert handler.dropped == 2 and records.qsize() == 3
        assert [records.get_nowait().getMessage() for _ in range(3)] == ["r0", "r1", "r2"]  # type: ignore[union-attr]
        log.warning("after %s", "room")
        after, notice = records.get_nowait(), records.get_nowait()
        assert after is not None and after.getMessage() == "after room" and after.args is None
        assert notice is not None and notice.__dict__["droppedRecords"] == 2 and "2 log records" in notice.msg
        assert handler.dropped == 2
    finally:
        log.removeHandler(handler)


def test_a_full_disk_drops_records_with_one_line_on_stderr_and_no_torn_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC on the host log: logging's traceback per record buried the host's own STORAGE_FULL line on a
    full disk. Now one line says records are dropped; a record cut part way leaves no line joined to the next."""
    h = RotatingNdjsonHandler(tmp_path, LogRotation())
    h.setFormatter(NdjsonFormatter())
    real_write = os.write
    state = {"full": False, "partial": True}

    def write(fd: int, data: memoryview | bytes) -> int:
        if not state["full"]:
            return real_write(fd, data)
        if state["partial"]:  # the first failing record gets a few bytes out
            state["partial"] = False
            return real_write(fd, bytes(data[:7]))
        raise OSError(28, "No space left on device")

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("pi_host", logging.INFO, __file__, 1, msg, None, None)

    try:
        h.emit(record("before"))
        monkeypatch.setattr("runtime.logs.os.write", write)
        state["full"] = True
        for i in range(5):
            h.emit(record(f"lost {i}"))
        assert h.dropped == 5
        state["full"] = False
        h.emit(record("after"))
        assert h.dropped == 0
    finally:
        h.close()
    err = capsys.readouterr().err
    assert err.count("records are dropped") == 1 and "Traceback" not in err
    lines = (tmp_path / LOG_NAME).read_bytes().split(b"\n")
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line)["msg"] if line else None)
        except ValueError:
            parsed.append("<torn>")
    assert [p for p in parsed if p is not None] == ["before", "<torn>", "after"]
