"""The GC's reference scan reads the session files as every other reader does: line by line in bounded
chunks, a line over ``MAX_LINE_BYTES`` read past and never held whole (``bounded_lines``). A session whose
files it could not read whole (an over-long line, a damaged line, an unreadable file) may reference any
blob, so that GC sweeps nothing, keeps the session's recorded references, evicts nothing over budget when
it is the active session, and names it in ``scanIncomplete``.

Found by these tests: the scan joined chunks until a newline came, so a runaway line was held whole in
memory (and parsed); a damaged line was skipped as if it referenced nothing, so the blob only it named was
swept, and the full sync dropped the references an earlier GC had recorded from it."""

from __future__ import annotations

import logging
import sqlite3
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest

from store import attachments as a
from tests.dbkit import NOW, add_session, tx
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg

HOUR = 60 * 60 * 1000
LIMIT = 300


def _line(mid: str, *shas: str, pad: int = 0) -> bytes:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "x" * pad}]
    blocks += [{"type": "attachment", "kind": "file", "name": "f", "ref": f"attachments/{sha}", "size": 10}
               for sha in shas]
    return orjson.dumps({"type": "message", "id": mid, "role": "user", "blocks": blocks}) + b"\n"


def _damaged(line: bytes) -> bytes:
    """The line with its closing brace lost: not JSON any more, its reference text intact."""
    assert line.endswith(b"}\n")
    return line[:-2] + b"\n"


def _setup(tmp_path: Path, conn: sqlite3.Connection, count: int) -> tuple[a.AttachmentFiles, Path, list[str]]:
    files, sessions = a.AttachmentFiles(tmp_path / "attachments"), tmp_path / "sessions"
    sessions.mkdir()
    for sid in ("s1", "s2"):
        add_session(conn, sid)
    shas = []
    for i in range(count):
        sha, size = files.put_bytes(bytes([65 + i]) * 10)
        tx(conn)(lambda c, sha=sha, size=size: a.record_blob(c, sha, size, None, NOW))
        shas.append(sha)
    return files, sessions, shas


def _states(conn: sqlite3.Connection, shas: list[str]) -> list[str]:
    return [row["deletionState"] if (row := a.blob_row(conn, sha)) is not None else "none" for sha in shas]


def test_a_runaway_line_is_read_past_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MiB on one line against a 300-byte limit: the scan's peak stays under 1 MiB (two 64 KiB chunks and
    change), the references on the lines around it are found, and its session is incomplete."""
    monkeypatch.setattr(a, "MAX_LINE_BYTES", LIMIT, raising=False)
    monkeypatch.setattr(a, "_CHUNK", 64 << 10)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    before, runaway, after = "b" * 64, "r" * 64, "c" * 64
    (sessions / "s1.jsonl").write_bytes(_line("m1", before) + _line("m2", runaway, pad=16 << 20) + _line("m3", after))
    (sessions / "s2.jsonl").write_bytes(_line("n1", before))
    tracemalloc.start()
    try:
        scan = a.scan_references(sessions)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # not the 16 MiB line
    assert sorted((sha, sid, mid) for sha, sid, mid, _ in scan.refs) == [
        (before, "s1", "m1"), (before, "s2", "n1"), (after, "s1", "m3")]
    assert getattr(scan, "incomplete", None) == {"s1"}


@pytest.mark.parametrize("damage", ["damaged", "over_limit"])
def test_a_blob_named_on_or_after_an_unreadable_line_is_not_collected(
        tmp_path: Path, conn: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """s1's second line names ``on``; it is damaged (not JSON) or over the line limit. ``after`` is named
    only on the line after it, ``unused`` nowhere. Past the grace, the GC sweeps none of them (s1 may
    reference any blob), keeps the reference an earlier GC recorded from the intact line, and says why."""
    monkeypatch.setattr(a, "MAX_LINE_BYTES", LIMIT, raising=False)
    files, sessions, (kept, on, after, unused) = _setup(tmp_path, conn, 4)
    transcript = sessions / "s1.jsonl"
    intact = _line("m2", on)
    transcript.write_bytes(_line("m1", kept) + intact + _line("m3", after))
    first = a.collect(files, tx(conn), budget=None, active_session_id=None, sessions_dir=sessions, now_ms=NOW)
    assert isinstance(first, dict) and first["unreferencedEvicted"] == [] and "scanIncomplete" not in first
    assert a.refs_of(conn, on) == [("s1", "m2")]  # recorded from the intact line
    bad = _damaged(intact) if damage == "damaged" else _line("m2", on, pad=2 * LIMIT)
    transcript.write_bytes(_line("m1", kept) + bad + _line("m3", after))

    result = a.collect(files, tx(conn), budget=None, active_session_id=None, sessions_dir=sessions,
                       now_ms=NOW + 2 * HOUR)
    assert isinstance(result, dict)
    assert (result["evicted"], result["unreferencedEvicted"], result["freedBytes"]) == ([], [], 0)
    assert result.get("scanIncomplete") == ["s1"]
    assert _states(conn, [kept, on, after, unused]) == ["live"] * 4
    assert all(files.exists(sha) for sha in (kept, on, after, unused))
    assert a.refs_of(conn, on) == [("s1", "m2")]  # kept: the scan could not read that line

    transcript.write_bytes(_line("m1", kept) + _line("m3", after))  # the bad line gone (a repair)
    healed = a.collect(files, tx(conn), budget=None, active_session_id=None, sessions_dir=sessions,
                       now_ms=NOW + 3 * HOUR)
    assert isinstance(healed, dict) and "scanIncomplete" not in healed
    assert sorted(healed["unreferencedEvicted"]) == sorted([on, unused])


def test_an_active_session_read_incompletely_loses_no_blob_to_the_budget(
        tmp_path: Path, conn: sqlite3.Connection) -> None:
    """Over budget, the active session's blobs stay; when its transcript holds a damaged line naming one,
    which of them it references is not known: nothing is evicted. Another session's damage does not stop the
    budget eviction (its referenced blobs are evictable anyway), only the sweep."""
    files, sessions, (named, other) = _setup(tmp_path, conn, 2)
    (sessions / "s1.jsonl").write_bytes(_line("m1") + _damaged(_line("m2", named)))
    (sessions / "s2.jsonl").write_bytes(_line("n1", other))

    result = a.collect(files, tx(conn), budget=1, active_session_id="s1", sessions_dir=sessions, now_ms=NOW)
    assert isinstance(result, dict)
    assert (result["evicted"], result["unreferencedEvicted"], result.get("scanIncomplete")) == ([], [], ["s1"])
    assert _states(conn, [named, other]) == ["live", "live"]

    result = a.collect(files, tx(conn), budget=1, active_session_id="s2", sessions_dir=sessions, now_ms=NOW)
    assert isinstance(result, dict)
    assert (result["evicted"], result.get("scanIncomplete")) == ([named], ["s1"])


def test_an_unreadable_file_makes_its_session_incomplete(tmp_path: Path, conn: sqlite3.Connection) -> None:
    """A transcript that fails to open (here a planted symbolic link, refused, never followed) is not a
    session without references."""
    files, sessions, (held,) = _setup(tmp_path, conn, 1)
    (tmp_path / "elsewhere.jsonl").write_bytes(_line("m1", held))
    (sessions / "s1.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")  # refused, never followed
    result = a.collect(files, tx(conn), budget=None, active_session_id=None, sessions_dir=sessions,
                       now_ms=NOW + 2 * HOUR)
    assert isinstance(result, dict)
    assert (result["unreferencedEvicted"], result.get("scanIncomplete")) == ([], ["s1"])
    assert _states(conn, [held]) == ["live"]


async def test_the_gc_answer_and_the_log_name_the_sessions_read_incompletely(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with inprocess_host(tmp_path) as host, client_for(host) as c:
        sid = (await c.call("session.create", {}))["id"]
        await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "hi")})
        await index_caught_up(host)
        with (tmp_path / "sessions" / f"{sid}.jsonl").open("ab") as f:  # another program's torn write
            f.write(_damaged(_line("m2", "d" * 64)))
        with caplog.at_level(logging.WARNING):
            result = await c.call("attachments.gc", {"submissionId": "gc-1"})
        assert (result["unreferencedEvicted"], result["scanIncomplete"]) == ([], [sid])
        assert any(sid in r.getMessage() and "could not be read whole" in r.getMessage() for r in caplog.records)
        assert await c.call("attachments.gc", {"submissionId": "gc-1"}) == result
