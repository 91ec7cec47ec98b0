"""The transcript file store (store/transcripts/transcript.py): RELIABILITY.md §4 rows 3-6."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import store.transcripts.transcript as transcript_mod
from store.errors import (
    Conflict,
    CorruptData,
    InvalidId,
    InvalidInput,
    IOFailure,
    NotFound,
    StorageFull,
    TranscriptChanged,
)
from store.faults import Faults, InjectedFault
from store.fsutil import sweep_temp_files
from store.jsonio import dumps_line, loads_line
from store.transcripts.layout import scan_layout, spans
from store.transcripts.transcript import (
    ReadStats,
    TranscriptWriter,
    create_transcript,
    read_spans,
    read_transcript,
    rewrite_transcript,
)

T0 = 1785056400000


def message(mid: str, text: str = "hello", **extra: Any) -> bytes:
    record = {
        "type": "message",
        "id": mid,
        "role": "user",
        "createdAt": "2026-07-26T09:00:00.000Z",
        "blocks": [{"type": "text", "text": text}],
        **extra,
    }
    return dumps_line(record)


def ids(path: Path) -> list[str]:
    return [m.id for m in read_transcript(path).messages]


@pytest.fixture
def session(tmp_path: Path) -> Path:
    """A transcript with a header and three messages."""
    path = tmp_path / "s1.jsonl"
    create_transcript(path, "s1", T0)
    with TranscriptWriter.open(path) as writer:
        writer.append([message("m0"), message("m1"), message("m2")])
    return path


@pytest.fixture
def writer(session: Path) -> Iterator[TranscriptWriter]:
    w = TranscriptWriter.open(session)
    yield w
    w.close()


# ----------------------------------------------------------------- create


def test_create_writes_header_with_fresh_epoch(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ha = create_transcript(a, "a", T0)
    hb = create_transcript(b, "b", T0 + 5)
    assert ha.epoch and hb.epoch and ha.epoch != hb.epoch
    first = loads_line(a.read_bytes())
    assert list(first) == ["type", "schema", "sessionId", "createdAt", "epoch"]
    assert first == {
        "type": "session",
        "schema": 1,
        "sessionId": "a",
        "createdAt": "2026-07-26T09:00:00.000Z",
        "epoch": ha.epoch,
    }
    assert ha.length == a.stat().st_size
    assert stat.S_IMODE(a.stat().st_mode) == 0o600
    t = read_transcript(a)
    assert t.header == ha and t.messages == [] and not t.torn_tail


def test_create_refuses_to_overwrite(session: Path) -> None:
    before = session.read_bytes()
    with pytest.raises(Conflict):
        create_transcript(session, "s1", T0)
    assert session.read_bytes() == before


def test_create_validates_session_id(tmp_path: Path) -> None:
    with pytest.raises(InvalidId):
        create_transcript(tmp_path / "x.jsonl", "../x", T0)
    assert list(tmp_path.iterdir()) == []


def test_create_failure_removes_the_partial_file(tmp_path: Path) -> None:
    faults = Faults()
    faults.add("create.after_tmp_write", 1, "enospc")
    with pytest.raises(StorageFull):
        create_transcript(tmp_path / "s.jsonl", "s", T0, faults=faults)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------- append


def test_append_returns_offsets_and_is_readable(session: Path, writer: TranscriptWriter) -> None:
    pre = writer.length
    lines = [message("m3"), message("m4", "second")]
    first, new_len = writer.append(lines)
    assert (first, new_len) == (pre, pre + len(lines[0]) + len(lines[1]))
    assert session.stat().st_size == new_len == writer.length
    t = read_transcript(session)
    assert [m.id for m in t.messages] == ["m0", "m1", "m2", "m3", "m4"]
    m4 = t.message("m4")
    assert m4 is not None and m4.offset == pre + len(lines[0]) and m4.length == len(lines[1])
    assert writer.append([]) == (new_len, new_len)


@pytest.mark.parametrize("bad", [b'{"type":"message"}', b'{"a":1}\n{"b":2}\n', b"\n\n"])
def test_append_requires_single_complete_lines(writer: TranscriptWriter, bad: bytes) -> None:
    before = writer.length
    with pytest.raises(InvalidInput):
        writer.append([message("ok"), bad])
    assert writer.length == before and not writer.failed


@pytest.mark.parametrize(
    ("action", "error", "code"), [("enospc", StorageFull, "STORAGE_FULL"), ("eio", IOFailure, "IO_ERROR")])
def test_append_rolls_back_on_write_error(
    session: Path, action: str, error: type[Exception], code: str
) -> None:
    faults = Faults()
    faults.add("append.after_write", 1, action)
    with TranscriptWriter.open(session, faults=faults) as w:
        pre = w.length
        with pytest.raises(error) as info:
            w.append([message("m3", "x" * 500), message("m4")])
        assert info.value.code == code  # type: ignore[attr-defined]
        assert session.stat().st_size == pre == w.length
        t = read_transcript(session)
        assert [m.id for m in t.messages] == ["m0", "m1", "m2"] and t.bad_lines == 0 and not t.torn_tail
        # the writer is still usable once the condition clears
        assert not w.failed
        w.append([message("m3")])
    assert ids(session) == ["m0", "m1", "m2", "m3"]


def test_real_short_write_under_rlimit_fsize(session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RLIMIT_FSIZE with SIGXFSZ ignored: the kernel writes a prefix, then EFBIG."""
    returned: list[tuple[int, int]] = []
    real_write = os.write

    def spy(fd: int, data: Any) -> int:
        n = real_write(fd, data)
        returned.append((len(data), n))
        return n

    big = message("big", "y" * 300)
    with TranscriptWriter.open(session) as w:
        pre = w.length
        monkeypatch.setattr(os, "write", spy)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        caught: BaseException | None = None
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (pre + 55, hard))
            try:
                w.append([big])
            except StorageFull as exc:
                caught = exc
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old_handler)
            monkeypatch.undo()
        assert isinstance(caught, StorageFull), caught
        assert caught.data["errno"] == errno.EFBIG
        assert returned[0] == (len(big), 55)  # a genuine short write came first
        assert session.stat().st_size == pre
        w.append([message("m3")])  # space is back
    t = read_transcript(session)
    assert [m.id for m in t.messages] == ["m0", "m1", "m2", "m3"] and t.bad_lines == 0


def test_fsync_failure_is_never_retried_and_poisons_the_writer(
    session: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def failing_fdatasync(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    w = TranscriptWriter.open(session)
    pre = w.length
    monkeypatch.setattr(transcript_mod.os, "fdatasync", failing_fdatasync)
    with pytest.raises(IOFailure) as info:
        w.append([message("m3")])
    assert "fsync" in info.value.message
    assert len(calls) == 1  # never retried
    assert w.failed
    assert session.stat().st_size == pre  # truncated back, best effort
    with pytest.raises(IOFailure, match="reopened"):
        w.append([message("m4")])
    assert len(calls) == 1  # the refused append did not even try
    assert session.stat().st_size == pre
    w.close()
    monkeypatch.undo()
    # a new writer re-validates the tail and works
    with TranscriptWriter.open(session) as w2:
        assert not w2.failed and w2.last_repair is None
        w2.append([message("m3")])
    assert ids(session) == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize(("point", "durable"), [("append.fsync", False), ("append.after_fsync", True)])
def test_an_error_after_the_fsync_stops_the_writer_but_leaves_the_storage_sound(
    session: Path, point: str, durable: bool
) -> None:
    """EIO at the fsync is rule 7 (the storage fails, the line is cut back); EIO after it leaves the line
    durable and the file sound: the writer stops, but it does not say the storage failed."""
    faults = Faults()
    faults.add(point, 1, "eio")
    w = TranscriptWriter.open(session, faults=faults)
    pre = w.length
    with pytest.raises(IOFailure):
        w.append([message("m3")])
    assert w.failed and w.storage_failed is not durable
    with pytest.raises(IOFailure):
        w.append([message("m4")])
    w.close()
    assert ids(session) == (["m0", "m1", "m2", "m3"] if durable else ["m0", "m1", "m2"])
    assert session.stat().st_size == (w.length if durable else pre)
    with TranscriptWriter.open(session) as w2:
        assert w2.last_repair is None and w2.length == session.stat().st_size
        w2.append([message("m5")])
    assert ids(session)[-1] == "m5"


def test_injected_crash_mid_append_poisons_writer_and_reopen_recovers(session: Path) -> None:
    faults = Faults()
    faults.add("append.after_write", 1, "raise")
    w = TranscriptWriter.open(session, faults=faults)
    with pytest.raises(InjectedFault):
        w.append([message("m3")])
    assert w.failed
    with pytest.raises(IOFailure):
        w.append([message("m4")])
    w.close()
    # the written-but-unacked line is complete: it stays (retries dedupe by id)
    with TranscriptWriter.open(session) as w2:
        w2.append([message("m3", "retry")])
    t = read_transcript(session)
    assert [m.id for m in t.messages] == ["m0", "m1", "m2", "m3"]
    m3 = t.message("m3")
    assert m3 is not None and m3.record["blocks"][0]["text"] == "retry"


def test_close_is_idempotent_and_refuses_later_appends(writer: TranscriptWriter) -> None:
    writer.close()
    writer.close()
    assert writer.closed
    with pytest.raises(IOFailure, match="closed"):
        writer.append([message("m9")])


def test_writer_refuses_a_replaced_file(session: Path) -> None:
    with TranscriptWriter.open(session) as w:
        rewrite_transcript(session, "s1", T0, [message("n0")])
        with pytest.raises(Conflict, match="replaced"):
            w.append([message("m3")])
        assert w.failed
    assert ids(session) == ["n0"]


@pytest.mark.parametrize("change", ["grown", "cut"])
def test_writer_refuses_a_file_another_program_changed(session: Path, change: str) -> None:
    """Same file, another length than the writer left: the planned lines' offsets would be wrong."""
    with TranscriptWriter.open(session) as w:
        w.append([message("m1")])
        if change == "grown":
            with open(session, "ab") as f:
                f.write(message("by-hand"))
        else:
            os.truncate(session, w.length - 3)
        before = session.read_bytes()
        with pytest.raises(TranscriptChanged, match="changed under its writer"):
            w.append([message("m2")])
        assert w.failed and session.read_bytes() == before  # nothing written


def test_open_errors(tmp_path: Path, session: Path) -> None:
    with pytest.raises(NotFound):
        TranscriptWriter.open(tmp_path / "missing.jsonl")
    link = tmp_path / "link.jsonl"
    link.symlink_to(session)
    with pytest.raises(CorruptData, match="symlink"):
        TranscriptWriter.open(link)
    headless = tmp_path / "headless.jsonl"
    headless.write_bytes(message("m0"))
    with pytest.raises(CorruptData, match="header"):
        TranscriptWriter.open(headless)
    assert headless.read_bytes() == message("m0")


def test_legacy_header_without_epoch(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_bytes(b'{"type":"session","schema":1,"sessionId":"old","createdAt":"x"}\n' + message("m0"))
    with TranscriptWriter.open(path) as w:
        assert w.epoch is None and w.header.session_id == "old"
        w.append([message("m1")])
    assert ids(path) == ["m0", "m1"]


# ----------------------------------------------------------------- torn tails (row 4)

BASE_IDS = ["m0", "m1", "m2"]
LAST = message("m3", "tail", toolName="Write", meta={"nested": {"type": "message", "id": "fake"}})
GARBAGE = bytes(b for b in range(256) if b != 0x0A) * 2


def _torn_cases() -> Iterator[tuple[str, int]]:
    for k in range(1, len(LAST)):  # every proper prefix of the last line (no newline yet)
        yield "partial", k
    for k in range(1, len(LAST) + 1):
        yield "nul", k
        yield "garbage", k


def _tail(kind: str, k: int) -> bytes:
    if kind == "partial":
        return LAST[:k]
    if kind == "nul":
        return b"\x00" * k
    return GARBAGE[:k]


@pytest.fixture
def ram_session(tmp_path: Path) -> Iterator[Path]:
    """Like ``session`` but on tmpfs when available: ~500 repair cycles with real
    fsync calls, which tmpfs makes cheap (the logic under test is byte-level)."""
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    try:
        path = root / "s1.jsonl"
        create_transcript(path, "s1", T0)
        with TranscriptWriter.open(path) as writer:
            writer.append([message("m0"), message("m1"), message("m2")])
        yield path
    finally:
        if root != tmp_path:
            shutil.rmtree(root)


def test_torn_tail_at_every_offset_and_kind(ram_session: Path) -> None:
    session = ram_session
    base = session.read_bytes()
    cases = list(_torn_cases())
    assert len(cases) == 3 * len(LAST) - 1
    for n, (kind, k) in enumerate(cases):
        tail = _tail(kind, k)
        session.write_bytes(base + tail)
        # readers: every complete record, torn tail skipped, nothing "bad"
        t = read_transcript(session)
        assert [m.id for m in t.messages] == BASE_IDS, (kind, k)
        assert t.torn_tail and t.valid_length == len(base) and t.bad_lines == 0, (kind, k)
        # the writer quarantines exactly the torn bytes, then truncates
        with TranscriptWriter.open(session, clock_ms=lambda n=n: 1000 + n) as w:
            repair = w.last_repair
            assert repair is not None, (kind, k)
            assert (repair.original_length, repair.valid_length) == (len(base) + k, len(base))
            assert Path(repair.quarantine_path).name == f"s1.jsonl.torn-{1000 + n}"
            assert Path(repair.quarantine_path).read_bytes() == tail, (kind, k)
            assert session.read_bytes() == base and w.length == len(base)
            # ... and the next append is never glued to garbage
            w.append([message("m4")])
        t = read_transcript(session)
        assert [m.id for m in t.messages] == [*BASE_IDS, "m4"], (kind, k)
        assert t.bad_lines == 0 and not t.torn_tail and t.unknown_lines == 0, (kind, k)
        assert session.read_bytes() == base + message("m4")
        os.unlink(repair.quarantine_path)


def test_complete_garbage_lines_at_the_end_are_quarantined_too(session: Path) -> None:
    base = session.read_bytes()
    tail = b"\x00" * 18 + b"\n" + b'{"type":"message","id":"m9"\n' + b"\x00\x00"
    session.write_bytes(base + tail)
    t = read_transcript(session)
    assert [m.id for m in t.messages] == BASE_IDS and t.bad_lines == 2 and t.torn_tail
    with TranscriptWriter.open(session) as w:
        assert w.last_repair is not None
        assert Path(w.last_repair.quarantine_path).read_bytes() == tail
        assert w.length == len(base)


def test_tail_repair_scans_back_across_blocks(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    create_transcript(path, "big", T0)
    with TranscriptWriter.open(path) as w:
        w.append([message("huge", "z" * 200_000)])
    good = path.read_bytes()
    tail = b"\x00" * 150_000
    path.write_bytes(good + tail)
    with TranscriptWriter.open(path) as w:
        assert w.last_repair is not None and w.last_repair.torn_length == len(tail)
        assert w.length == len(good)


def test_repair_of_a_file_with_only_a_torn_header(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"session","sch')
    with pytest.raises(CorruptData, match="header"):
        TranscriptWriter.open(path, clock_ms=lambda: 7)
    assert path.read_bytes() == b""
    assert (tmp_path / "t.jsonl.torn-7").read_bytes() == b'{"type":"session","sch'


def test_quarantine_names_do_not_collide(session: Path) -> None:
    base = session.read_bytes()
    for tail in (b"\x00", b"xx"):
        session.write_bytes(base + tail)
        TranscriptWriter.open(session, clock_ms=lambda: 5).close()
    assert (session.parent / "s1.jsonl.torn-5").read_bytes() == b"\x00"
    assert (session.parent / "s1.jsonl.torn-5-1").read_bytes() == b"xx"


# ----------------------------------------------------------------- readers


def test_reader_dedupes_keep_last_content_at_first_position(session: Path, writer: TranscriptWriter) -> None:
    writer.append([message("m3"), message("m1", "replaced"), message("m4"), message("m1", "again")])
    t = read_transcript(session)
    assert [m.id for m in t.messages] == ["m0", "m1", "m2", "m3", "m4"]
    m1 = t.messages[1]
    assert m1.record["blocks"][0]["text"] == "again"
    data = session.read_bytes()
    assert data[m1.offset : m1.offset + m1.length] == message("m1", "again")
    assert t.positions == {"m0": 0, "m1": 1, "m2": 2, "m3": 3, "m4": 4}


def test_reader_skips_unknown_kinds_and_reports_bad_lines(session: Path, writer: TranscriptWriter) -> None:
    pre = writer.length
    writer.append(
        [
            dumps_line({"type": "future_kind", "id": "m0", "payload": {"type": "message"}}),
            dumps_line({"type": "session", "sessionId": "s1"}),  # a header mid-file
            b"this is not json\n",
            b'{"type":"message","blocks":[]}\n',  # a message without an id
            message("m3"),
        ]
    )
    data = session.read_bytes()
    t = read_transcript(session)
    assert [m.id for m in t.messages] == ["m0", "m1", "m2", "m3"]
    assert t.unknown_lines == 2
    assert t.bad_lines == 2
    not_json = data.index(b"this is not json")
    assert t.bad_line_offsets == [not_json, not_json + len(b"this is not json\n")]
    assert t.message("m0") is not None and t.message("m0").record["role"] == "user"  # type: ignore[union-attr]
    assert not t.torn_tail and t.valid_length == len(data) > pre


def test_reader_compactions_tombstones_and_session_info(session: Path, writer: TranscriptWriter) -> None:
    c1 = dumps_line({"type": "compaction", "id": "c1", "summary": "s1", "throughMessageId": "m1"})
    c2 = dumps_line({"type": "compaction", "id": "c2", "summary": "s2", "throughMessageId": "m2"})

    def tomb(tid: str, mid: str, deleted: bool) -> bytes:
        return dumps_line({"type": "tombstone", "id": tid, "messageId": mid, "deleted": deleted, "createdAt": "x"})

    def info(title: str) -> bytes:
        return dumps_line({"type": "session_info", "title": title, "updatedAt": "x"})

    first, _ = writer.append([c1, tomb("t1", "m1", True), info("A"), tomb("t2", "m2", True), c2])
    writer.append([tomb("t3", "m1", False), info("B")])
    t = read_transcript(session)
    assert [(c.id, c.offset, c.length) for c in t.compactions] == [
        ("c1", first, len(c1)),
        ("c2", first + len(c1) + 2 * len(tomb("t1", "m1", True)) + len(info("A")), len(c2)),
    ]
    assert t.deleted_ids == {"m2"}
    assert t.tombstones["m1"].id == "t3" and t.tombstones["m1"].deleted is False
    assert t.session_info is not None and t.session_info["title"] == "B"
    assert [m.id for m in t.messages] == ["m0", "m1", "m2"]  # tombstones hide nothing here


def test_reader_never_modifies_the_file(session: Path) -> None:
    session.write_bytes(session.read_bytes() + b"\x00\x00torn")
    before = session.read_bytes()
    read_transcript(session)
    scan_layout(session)
    assert session.read_bytes() == before
    assert [p.name for p in session.parent.iterdir()] == ["s1.jsonl"]


def test_read_missing_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        read_transcript(tmp_path / "nope.jsonl")
    with pytest.raises(NotFound):
        read_spans(tmp_path / "nope.jsonl", [(0, 1)])


# ----------------------------------------------------------------- rewrite (row 3)

REWRITE_POINTS = ["after_tmp_write", "after_tmp_fsync", "after_rename", "before_dirsync"]


@pytest.mark.parametrize("point", REWRITE_POINTS)
def test_rewrite_crash_leaves_old_or_new_never_a_mix(session: Path, point: str) -> None:
    old_bytes = session.read_bytes()
    old = read_transcript(session)
    faults = Faults()
    faults.add(f"rewrite.{point}", 1, "raise")
    with pytest.raises(InjectedFault):
        rewrite_transcript(session, "s1", T0, [message("m0"), message("m2", "edited")], faults=faults)
    now = read_transcript(session)
    assert now.bad_lines == 0 and not now.torn_tail
    if point in ("after_tmp_write", "after_tmp_fsync"):
        assert session.read_bytes() == old_bytes
        assert len(sweep_temp_files(session.parent)) == 1
    else:
        assert now.header is not None and old.header is not None
        assert now.header.epoch != old.header.epoch
        assert [m.id for m in now.messages] == ["m0", "m2"]
        assert sweep_temp_files(session.parent) == []
    assert [p.name for p in session.parent.iterdir()] == ["s1.jsonl"]


def test_rewrite_replaces_header_epoch_and_body(session: Path) -> None:
    old = read_transcript(session)
    header = rewrite_transcript(session, "s1", T0, [message("a"), message("b")])
    t = read_transcript(session)
    assert t.header == header and old.header is not None and header.epoch != old.header.epoch
    assert [m.id for m in t.messages] == ["a", "b"]
    assert stat.S_IMODE(session.stat().st_mode) == 0o600
    with TranscriptWriter.open(session) as w:
        assert w.epoch == header.epoch


def test_rewrite_rejects_bad_body_lines(session: Path) -> None:
    before = session.read_bytes()
    with pytest.raises(InvalidInput):
        rewrite_transcript(session, "s1", T0, [b'{"type":"message","id":"x"}'])
    assert session.read_bytes() == before


# ----------------------------------------------------------------- span reads


def test_window_of_5000_messages_reads_only_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    create_transcript(path, "long", T0)
    lines = [message(f"m{i}", f"message number {i} " + "x" * (i % 97)) for i in range(5000)]
    with TranscriptWriter.open(path) as w:
        w.append(lines)
    layout = scan_layout(path)
    assert layout.message_count == 5000
    window = spans(layout, 3000, 3050)
    stats = ReadStats()
    blobs = read_spans(path, window, stats=stats)
    assert [loads_line(b)["id"] for b in blobs] == [f"m{i}" for i in range(3000, 3050)]
    assert blobs == lines[3000:3050]
    assert stats.opens == 1 and stats.reads == 50
    assert stats.bytes_read == sum(len(line) for line in lines[3000:3050])
    assert stats.bytes_read * 50 < path.stat().st_size  # < 2% of the file


def test_read_spans_past_the_end_means_stale_layout(session: Path) -> None:
    size = session.stat().st_size
    with pytest.raises(CorruptData, match="stale"):
        read_spans(session, [(size - 5, 10)])
