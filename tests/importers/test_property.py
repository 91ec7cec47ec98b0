"""Property tests: generated transcripts in every format import to the intended messages.

* a generated conversation imports to exactly the messages (and checkpoints)
  its generator intended, in every tool's format (pi in v1, v2 and v3);
* importing the same source again changes nothing (no byte, no row), also
  when the file's mtime changed and the parse runs again;
* a source that grew adds only lines for what is new or changed (the
  transcript written before is a byte prefix of the one after), and ends
  equal to importing the grown source fresh;
* cutting a source file at any byte never crashes the importer.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import ImportLimits, ParseContext, Refused, SourceUnit
from store.interchange.imports import import_root, import_unit
from store.transcripts.transcript import read_transcript
from tests.importers import gen
from tests.samplekit import NOW, import_workspace
from tests.soak import soak, soaking

SETTINGS = settings(max_examples=soak(40, 400), deadline=None, suppress_health_check=[HealthCheck.too_slow])

LINE_FORMATS: dict[str, Callable[[list[gen.Event]], list[bytes]]] = {
    "claude-code": gen.claude_code_lines,
    "codex": gen.codex_lines,
    "pi": gen.pi_lines,
    "pi-v2": lambda conv: gen.pi_lines(conv, version=2),
    "pi-v1": lambda conv: gen.pi_lines(conv, version=1),
    "pi-branched": lambda conv: gen.pi_lines(conv, detour_after=len(conv) - 1),
}
FORMATS = [*LINE_FORMATS, "opencode-json", "opencode-db"]


def source_of(fmt: str) -> str:
    return "pi" if fmt.startswith("pi") else ("opencode" if fmt.startswith("opencode") else fmt)


def write(fmt: str, conv: list[gen.Event], where: Path, *, cut: int | None = None) -> Path:
    """Render ``conv`` (its first ``cut`` lines / messages) and return the path to import."""
    if fmt in LINE_FORMATS:
        lines = LINE_FORMATS[fmt](conv)
        path = where / "session.jsonl"
        path.write_bytes(b"".join(lines[:cut] if cut is not None else lines))
        return path
    info, messages = gen.opencode_docs(conv)
    shown = messages[:cut] if cut is not None else messages
    if fmt == "opencode-json":
        return gen.write_opencode_json(where / "opencode", info, shown)
    return gen.write_opencode_db(where / "opencode.db", info, shown)


def length(fmt: str, conv: list[gen.Event]) -> int:
    return len(LINE_FORMATS[fmt](conv)) if fmt in LINE_FORMATS else len(gen.opencode_docs(conv)[1])


def only_unit(fmt: str, path: Path) -> SourceUnit:
    (unit,) = IMPORTERS[source_of(fmt)].discover(path)
    return unit


def held(target: ImportTarget, sid: str) -> tuple[list[gen.Proj], list[tuple[str, int]], list[str]]:
    t = read_transcript(target.transcript(sid))
    records = [m.record for m in t.messages if m.id not in t.deleted_ids]
    ids = [r["id"] for r in records]
    comps = [(c.record["summary"], ids.index(c.record["throughMessageId"])) for c in t.compactions]
    return [gen.project_message(r) for r in records], comps, ids


def index_state(conn: sqlite3.Connection, sid: str) -> list[Any]:
    return [
        conn.execute("SELECT id, seq, role, text, tool_name, is_error, line_offset, line_len FROM messages "
                     "WHERE session_id = ? ORDER BY seq", (sid,)).fetchall(),
        conn.execute("SELECT id, through_message_id, line_offset FROM compactions WHERE session_id = ? "
                     "ORDER BY line_offset", (sid,)).fetchall(),
        conn.execute("SELECT last_seq, indexed_len, file_epoch, updated_at, source, title FROM sessions WHERE id = ?",
                     (sid,)).fetchall(),
    ]


def visible_rows(conn: sqlite3.Connection, sid: str) -> list[Any]:
    return conn.execute("SELECT id, role, text, tool_name, is_error FROM messages WHERE session_id = ? AND deleted = 0 "
                        "ORDER BY seq", (sid,)).fetchall()


@SETTINGS
@given(fmt=st.sampled_from(FORMATS), conv=gen.conversations(), window=st.sampled_from([1, 2, 1024]))
def test_generated_transcript_imports_to_the_intended_messages(fmt: str, conv: list[gen.Event], window: int) -> None:
    """``window`` bounds the look-behind that pairs calls with results: past it a call is written without
    its result and the result comes as a replacement line; readers see the same messages either way."""
    with import_workspace() as (root, conn, base):
        target = dataclasses.replace(base, limits=ImportLimits(max_pending_records=window))
        rep = import_unit(conn, only_unit(fmt, write(fmt, conv, root)), target, now_ms=NOW)
        want_msgs, want_comps = gen.expected(conv)
        assert rep.status == "new", rep.to_dict()
        msgs, comps, _ = held(target, rep.session_id)
        assert msgs == want_msgs
        assert comps == want_comps
        assert sum(rep.messages.values()) == len(want_msgs)
        assert conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ?", (rep.session_id,)).fetchone()[0] \
            == len(want_msgs)
        assert rep.unpaired_tool_calls == 0 and rep.orphan_results == 0
        assert rep.off_branch == (2 if fmt == "pi-branched" else 0)


@SETTINGS
@given(fmt=st.sampled_from(FORMATS), conv=gen.conversations())
def test_reimport_changes_nothing(fmt: str, conv: list[gen.Event]) -> None:
    with import_workspace() as (root, conn, target):
        src = write(fmt, conv, root)
        first = import_unit(conn, only_unit(fmt, src), target, now_ms=NOW)
        assert first.status == "new"
        before = (target.transcript(first.session_id).read_bytes(), index_state(conn, first.session_id))
        again = import_unit(conn, only_unit(fmt, src), target, now_ms=NOW + 1000)
        assert again.status == "unchanged"
        # a changed mtime defeats the fingerprint shortcut: the parse runs, and still nothing is written
        for path in [src] if src.is_file() else list(src.rglob("*.json")):
            os.utime(path, ns=(NOW * 1_000_000, NOW * 1_000_000 + 7))
        third = import_unit(conn, only_unit(fmt, src), target, now_ms=NOW + 2000)
        assert third.status == "unchanged"
        assert third.appended_bytes == 0 and third.new_records == third.replaced_records == 0
        assert (target.transcript(first.session_id).read_bytes(), index_state(conn, first.session_id)) == before
        assert conn.execute("SELECT COUNT(*) FROM session_import_origins").fetchone()[0] == 1


@SETTINGS
@given(fmt=st.sampled_from(FORMATS), conv=gen.conversations(), data=st.data())
def test_grown_source_adds_only_its_new_lines(fmt: str, conv: list[gen.Event], data: st.DataObject) -> None:
    total = length(fmt, conv)
    cut = data.draw(st.integers(min_value=1 if source_of(fmt) != "pi" else 2, max_value=total), label="cut")
    with import_workspace() as (root, conn, target):
        src = write(fmt, conv, root, cut=cut)
        first = import_unit(conn, only_unit(fmt, src), target, now_ms=NOW)
        if first.status == "refused":  # a prefix may hold no message yet
            assert first.reason == "EMPTY_SESSION"
            before = b""
        else:
            before = target.transcript(first.session_id).read_bytes()
        src = write(fmt, conv, root)
        grown = import_unit(conn, only_unit(fmt, src), target, now_ms=NOW + 1000)
        sid = grown.session_id
        after = target.transcript(sid).read_bytes()
        if before:
            assert after.startswith(before), "the transcript written before is kept byte for byte"
            assert grown.status in ("updated", "unchanged")
            appended = after[len(before):].count(b"\n")
            assert appended == grown.new_records + grown.replaced_records + grown.hidden_off_branch
        want_msgs, want_comps = gen.expected(conv)
        msgs, comps, ids = held(target, sid)
        assert msgs == want_msgs and comps == want_comps
        with import_workspace() as (root2, conn2, target2):
            fresh = import_unit(conn2, only_unit(fmt, src), target2, now_ms=NOW)
            assert held(target2, fresh.session_id)[2] == ids
            assert visible_rows(conn2, sid) == visible_rows(conn, sid)


@settings(max_examples=soak(60, 600), deadline=None)
@given(fmt=st.sampled_from(list(LINE_FORMATS)), conv=gen.conversations(), data=st.data())
def test_truncating_a_generated_source_at_any_byte_never_crashes(fmt: str, conv: list[gen.Event],
                                                                 data: st.DataObject) -> None:
    body = b"".join(LINE_FORMATS[fmt](conv))
    cut = data.draw(st.integers(min_value=0, max_value=len(body)), label="cut")
    with import_workspace() as (root, conn, target):
        path = root / "cut.jsonl"
        path.write_bytes(body[:cut])
        summary = import_root(conn, source_of(fmt), path, target, now_ms=lambda: NOW)
        (rep,) = summary.sessions
        assert rep.status in ("new", "refused")
        if rep.status == "refused":
            assert rep.reason in ("EMPTY_SESSION", "NOT_A_SESSION_FILE")
            assert list(target.sessions_dir.iterdir()) == []
        else:
            assert rep.files[0].consumed + rep.files[0].torn_tail_bytes == cut


def parse_all(source: str, path: Path) -> None:
    for unit in IMPORTERS[source].discover(path):
        try:
            for _ in IMPORTERS[source].parse(unit, ParseContext()).records:
                pass
        except Refused:
            pass


def cut_points(data: bytes) -> list[int]:
    """Where to cut a sample. CI-sized: the first and last 32 bytes, every line boundary (just after each
    newline), just before the newline of every line (of every k-th line when there are more than 100) and an
    even stride of about 100 cuts. Under ``PIHOST_SOAK=1``: every byte (about an hour over all samples)."""
    if soaking():
        return list(range(len(data) + 1))
    newlines = [at for at, byte in enumerate(data) if byte == ord("\n")]
    edges = {*range(min(33, len(data) + 1)), *range(max(0, len(data) - 32), len(data) + 1)}
    boundaries = {at + 1 for at in newlines}
    torn_newline = set(newlines[::max(1, len(newlines) // 100)])
    stride = set(range(0, len(data) + 1, max(1, len(data) // 100)))
    return sorted(edges | boundaries | torn_newline | stride)


def test_truncating_every_small_sample_at_every_byte_never_crashes(tmp_path: Path) -> None:
    from tests.samplekit import sample_files

    checked = 0
    for source in ("claude-code", "codex", "pi"):
        for sample in sample_files(source):
            data = sample.read_bytes()
            cut_path = tmp_path / f"{source}-{sample.name}"
            for cut in cut_points(data):
                # a new file each time: rewriting one in place (truncate, then write) makes ext4 flush the
                # old blocks first (auto_da_alloc), about 5 ms a cut
                cut_path.unlink(missing_ok=True)
                cut_path.write_bytes(data[:cut])
                parse_all(source, cut_path)
                checked += 1
    assert checked > soak(4_000, 1_000_000)
