"""The source line reader (store/interchange/importers/reader.py): what a line is at the edges of a file."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from store.interchange.importers.reader import LineReader
from tests.hostkit import client_for, inprocess_host
from tests.samplekit import samples_dir

BOM = b"\xef\xbb\xbf"


def read(path: Path, **kw: object) -> tuple[list[bytes | None], LineReader]:
    reader = LineReader(path, max_line_bytes=1 << 20, chunk=7, **kw)  # type: ignore[arg-type]
    return [line.data for line in reader], reader


def test_a_last_line_without_its_newline_is_read_when_it_is_one_json_object(tmp_path: Path) -> None:
    """A complete record whose writer (or an editor) dropped the final newline was a torn tail, never
    imported, and a re-import said unchanged. A prefix of a line never parses as a whole object, so such a
    line is complete; a cut one stays a torn tail."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"a":1}\n{"b":2}')
    got, reader = read(path)
    assert got == [b'{"a":1}', b'{"b":2}'] and reader.consumed == path.stat().st_size
    assert reader.torn_tail_bytes == 0
    path.write_bytes(b'{"a":1}\n{"b":')
    got, reader = read(path)
    assert got == [b'{"a":1}'] and reader.consumed == 8 and reader.torn_tail_bytes == 5
    path.write_bytes(b'{"a":1}\n{"b":2}')  # the host's own files: a line without its newline is torn
    got, reader = read(path, unterminated_last_line=False)
    assert got == [b'{"a":1}'] and reader.torn_tail_bytes == 7


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(BOM + b'{"a":1}\n' + BOM + b'{"b":2}\n')
    got, reader = read(path)
    assert got == [b'{"a":1}', BOM + b'{"b":2}']  # only before the first line
    assert reader.consumed == path.stat().st_size


@pytest.mark.parametrize("tail", [b'{"b":2}', b'{"b":', b"y" * 30])
def test_the_digest_at_a_mark_is_the_prefix_digest_of_the_bytes_read(tmp_path: Path, tail: bytes) -> None:
    """A re-import's earlier state (the digest where the last import stopped) is taken on the parse's read:
    at any offset it consumes (inside a line too: a last line read without its newline that got one since),
    past chunk boundaries and over-long lines; none past what it consumed, nor for a reader not from byte 0."""
    path = tmp_path / "s.jsonl"
    data = b'{"a":1}\n' + b"x" * 40 + b'\n{"c":3}\n' + tail
    path.write_bytes(data)
    for mark in range(1, len(data) + 2):
        reader = LineReader(path, max_line_bytes=16, chunk=7, mark=mark)
        lines = [line.data for line in reader]
        assert lines[:3] == [b'{"a":1}', None, b'{"c":3}']
        assert reader.sha256 == hashlib.sha256(data[:reader.consumed]).hexdigest()
        want = (mark, hashlib.sha256(data[:mark]).hexdigest()) if mark <= reader.consumed else None
        assert reader.at_mark == want, mark
    assert reader.consumed == (len(data) if tail == b'{"b":2}' else len(data) - len(tail))
    later = LineReader(path, max_line_bytes=16, chunk=7, start=8, mark=20)
    assert [line.offset for line in later][:2] == [8, 49] and later.consumed > 20 and later.at_mark is None


async def _served(data: Path, tool: str, folder: Path) -> tuple[str, list[str], int, str]:
    """Import ``folder`` into a host on ``data``; (session id, message ids, checkpoints, a re-import's status)."""
    async with inprocess_host(data) as host, client_for(host) as c:
        first = (await c.call("import.sessions", {"source": tool, "root": str(folder)}))["sessions"][0]
        page = await c.call("session.get", {"sessionId": first["sessionId"], "full": True})
        again = (await c.call("import.sessions", {"source": tool, "root": str(folder)}))["sessions"][0]
        return first["sessionId"], [m["id"] for m in page["messages"]], len(page["compactions"]), again["status"]


@pytest.mark.parametrize("damage", ["no final newline", "byte order mark"])
async def test_a_sample_with_an_editors_damage_imports_whole(tmp_path: Path, damage: str) -> None:
    """Claude Code, Codex and pi samples without their final newline lost their last record for good (the
    re-import said unchanged); with a byte order mark, Codex took its id from the file name and pi refused
    the file. Each serves what the undamaged file serves, and a re-import is unchanged."""
    src = samples_dir()
    samples = {"claude-code": src / "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl",
               "pi": src / "pi/agent-sessions_stub_provider_compaction.jsonl",
               "codex": sorted((src / "codex").glob("*.jsonl"))[0]}
    with trio.fail_after(120):
        for tool, sample in samples.items():
            raw = sample.read_bytes()
            served = []
            for name, data in (("clean", raw), ("damaged", raw[:-1] if damage == "no final newline" else BOM + raw)):
                folder = tmp_path / tool / name
                folder.mkdir(parents=True)
                (folder / sample.name).write_bytes(data)
                served.append(await _served(tmp_path / tool / f"data-{name}", tool, folder))
            (sid, ids, checkpoints, status), (clean_sid, clean_ids, clean_checkpoints, _) = served[1], served[0]
            # the same session, messages and checkpoints (Codex names a message by its line's offset,
            # which the mark moves: the count is compared)
            assert (sid, len(ids), checkpoints) == (clean_sid, len(clean_ids), clean_checkpoints), (tool, served)
            assert status == "unchanged" and ids, tool


async def test_a_reimport_of_a_touched_codex_file_is_unchanged(tmp_path: Path) -> None:
    """A Codex reply line gets its turn's usage from a later token_count: the importer gives that record
    twice, first without usage. A re-import of the unchanged file (its mtime touched) compared the first
    version with the held line, found it changed, and appended both versions again, every time (858 bytes
    a round, for ever). Only a record's last version is compared: unchanged, nothing written."""
    sample = samples_dir() / "codex" / "agent-sessions_CURATED_schema_coverage_compacted.jsonl"
    head = b"".join(sample.read_bytes().splitlines(keepends=True)[:22])
    src = tmp_path / "src"
    src.mkdir()
    path = src / "rollout-x.jsonl"
    with trio.fail_after(60):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sizes = []
            for _ in range(3):
                path.write_bytes(head)  # the same bytes, a new mtime
                got = (await c.call("import.sessions", {"source": "codex", "root": str(path)}))["sessions"][0]
                sizes.append((tmp_path / "data" / "sessions" / f"{got['sessionId']}.jsonl").stat().st_size)
            assert got["status"] == "unchanged" and got.get("replacedRecords", 0) == 0, got
            assert sizes[0] == sizes[1] == sizes[2]


def test_a_lone_surrogate_escape_reads_as_a_replacement_character_not_a_bad_line(tmp_path: Path) -> None:
    """JavaScript's JSON.stringify writes half of a split surrogate pair as an escape (a prompt or a tool
    output cut at a UTF-16 unit), so Claude Code and pi files hold them. Such a line was a bad line: its
    message was dropped, and in a pi header the whole session was refused. It is read with U+FFFD in the
    half's place; an escaped backslash before ``u`` is no escape, and a line bad for another reason stays
    bad."""
    import json

    from store.attachments import AttachmentFiles
    from store.interchange.import_write import ImportTarget
    from store.interchange.importers.reader import parse_object
    from store.interchange.imports import import_root
    from store.transcripts.transcript import read_transcript
    from tests.samplekit import NOW, open_db

    assert parse_object(b'{"a":"x\\ud83d","b":"\\ud83d\\ude00","c":"\\\\ud800"}') == \
        {"a": "x\ufffd", "b": "\U0001f600", "c": "\\ud800"}
    assert parse_object(b'{"a":NaN,"b":"\\ud800"}') is None
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
    (claude,) = recorded.joinpath("claude-code").rglob("f4c39419-*.jsonl")
    (pi,) = recorded.joinpath("pi").rglob("*01a234ad-dfe8-*.jsonl")
    for n, (source, path, says) in enumerate([("claude-code", claude, b"The command printed fixture-ok"),
                                              ("pi", pi, b"Reply to: hello there")]):
        lines = path.read_bytes().splitlines()
        lines[0] = lines[0][:-1] + b',"futureField":"\\udc00"}'
        (at,) = [i for i, line in enumerate(lines) if says in line]
        lines[at] = lines[at].replace(says, says + b" \\ud83d")
        assert json.loads(lines[at]) and json.loads(lines[0])  # JSON, as JavaScript reads it
        src = tmp_path / f"src{n}" / path.name
        src.parent.mkdir()
        src.write_bytes(b"\n".join(lines) + b"\n")
        (tmp_path / f"t{n}").mkdir()
        target = ImportTarget(tmp_path / f"t{n}", AttachmentFiles(tmp_path / f"b{n}"))
        conn = open_db(tmp_path / f"pi{n}.sqlite")
        try:
            (rep,) = import_root(conn, source, src, target, now_ms=lambda: NOW).sessions
        finally:
            conn.close()
        assert rep.status == "new", rep.to_dict()
        assert rep.files[0].bad_lines == 0
        texts = [b["text"] for m in read_transcript(target.transcript(rep.session_id)).messages
                 for b in m.record["blocks"] if b["type"] == "text"]
        assert any(t.startswith(says.decode() + " \ufffd") for t in texts), texts


def test_a_symlinked_session_file_is_refused_saying_so(tmp_path: Path) -> None:
    """Reproduces: a session file that is a symbolic link (the importer opens sources with ``O_NOFOLLOW``) was
    refused as "IO_ERROR: stage import of cc-...: Too many levels of symbolic links", which reads as a link loop
    (or a fault of the host's storage) and does not say what to do."""
    from store.attachments import AttachmentFiles
    from store.interchange.import_write import ImportTarget
    from store.interchange.imports import import_root
    from tests.importers import gen
    from tests.samplekit import NOW, open_db

    real = tmp_path / "elsewhere" / "5e550000-0000-4000-8000-00000000abcd.jsonl"
    real.parent.mkdir()
    real.write_bytes(b"".join(gen.claude_code_lines([gen.User("hello"), gen.Response((("text", "hi"),), ())])))
    project = tmp_path / "projects" / "-w"
    project.mkdir(parents=True)
    (project / real.name).symlink_to(real)
    (tmp_path / "t").mkdir()
    conn = open_db(tmp_path / "pi.sqlite")
    try:
        (rep,) = import_root(conn, "claude-code", tmp_path / "projects",
                             ImportTarget(tmp_path / "t", AttachmentFiles(tmp_path / "b")), now_ms=lambda: NOW).sessions
    finally:
        conn.close()
    assert rep.status == "refused"
    assert rep.message is not None and f"{project / real.name} is a symbolic link" in rep.message
    assert "import the file it points to" in rep.message
