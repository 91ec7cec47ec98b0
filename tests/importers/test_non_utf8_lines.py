"""A source line with a byte that is not UTF-8 keeps its message, with U+FFFD in the byte's place.

Claude Code and pi read their own files as Node's ``fs.readFile(path, "utf8")`` does: a byte sequence that is
not UTF-8 (a damaged byte, a text some tool wrote in Latin-1) reads as U+FFFD and the rest of the line as
written, so the tool shows the session whole. Reproduces: the importer counted such a line as a bad line and
dropped its whole message. In a pi file it cost more: the one bad byte in the prompt of
``pi/agent-sessions_stub_provider_compaction.jsonl`` line 7 left the reply after it with a missing parent, so
the transcript showed the branch before it (the last prompt and reply off the transcript, a "corrupt leaf"
notice in their place). The repair is counted per file (``repairedLines``); a line that is not JSON stays a
bad line.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store.interchange import import_write, imports
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.reader import parse_object
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from tests.importers.test_samples import EXPECTED
from tests.samplekit import NOW

# (sample, the text of one message its damaged line holds)
CASES = [
    ("pi/agent-sessions_stub_provider_compaction.jsonl", b"Add one concise follow-up sentence."),
    ("claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl", b"ok can you create a hello_world.py file"),
    ("codex/codemie_exec-0.77.0_shell_reasoning_ghost_snapshot.jsonl",
     b"what is current repository about? summarize purpuse and explain goals"),
]


def damaged_copy(tmp_path: Path, sample: Path, says: bytes) -> Path:
    """``sample`` with a Latin-1 byte (not UTF-8) in front of ``says`` on the first line that holds it."""
    lines = sample.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if says in line)
    lines[at] = lines[at].replace(says, b"\xe9" + says)
    folder = tmp_path / ("-w-p" if sample.parent.name == "claude-code" else "src")
    folder.mkdir()
    path = folder / sample.name
    path.write_bytes(b"".join(lines))
    return path


def texts(target: ImportTarget, sid: str) -> list[str]:
    return [b["text"] for m in read_transcript(target.transcript(sid)).messages for b in m.record["blocks"]
            if b["type"] == "text"]


def import_file(db: sqlite3.Connection, target: ImportTarget, path: Path, source: str) -> Any:
    (unit,) = IMPORTERS[source].discover(path)
    return import_unit(db, unit, target, now_ms=NOW)


@pytest.mark.parametrize(("name", "says"), CASES)
def test_a_line_with_a_byte_that_is_not_utf8_keeps_its_message(name: str, says: bytes, tmp_path: Path,
                                                                untouched_samples: Path, db: sqlite3.Connection,
                                                                target: ImportTarget) -> None:
    sample = untouched_samples / name
    source = sample.parent.name
    rep = import_file(db, target, damaged_copy(tmp_path, sample, says), source)
    assert (rep.files[0].bad_lines, rep.files[0].repaired_lines) == (0, 1)
    assert rep.files[0].to_dict()["repairedLines"] == 1
    got = texts(target, rep.session_id)
    assert any(t.startswith("\ufffd" + says.decode()) for t in got), got
    assert dict(rep.messages) == EXPECTED[name].roles  # what the undamaged sample gives
    assert all(m.record.get("meta", {}).get("importedKind") != "pi/corrupt_leaf"
               for m in read_transcript(target.transcript(rep.session_id)).messages)


def test_a_damaged_pi_file_imported_before_shows_its_branch_again(tmp_path: Path, untouched_samples: Path,
                                                                   db: sqlite3.Connection, target: ImportTarget,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Import rules 17: the unchanged file is parsed again, its last prompt and reply are back on the
    transcript and the fallback notice is hidden."""
    name, says = CASES[0]
    path = damaged_copy(tmp_path, untouched_samples / name, says)
    with monkeypatch.context() as m:
        m.setattr("store.interchange.importers.reader._parse", _strict)  # the rules-16 reader
        m.setattr(import_write, "IMPORT_RULES", 16)
        m.setattr(imports, "IMPORT_RULES", 16)
        first = import_file(db, target, path, "pi")
    assert first.files[0].bad_lines == 1
    assert "\ufffd" + says.decode() not in texts(target, first.session_id)
    again = import_file(db, target, path, "pi")
    assert again.status == "updated"
    transcript = read_transcript(target.transcript(again.session_id))
    hidden = transcript.deleted_ids
    shown = [m.record for m in transcript.messages if m.record["id"] not in hidden]
    assert "\ufffd" + says.decode() in [b["text"] for m in shown for b in m["blocks"] if b["type"] == "text"]
    assert [m["role"] for m in shown] == ["user", "assistant", "user", "assistant"]  # the notice is hidden


def _strict(data: bytes) -> tuple[dict[str, Any] | None, bool]:
    import orjson

    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None, False
    return (value, False) if isinstance(value, dict) else (None, False)


def test_parse_object_reads_bytes_that_are_not_utf8_as_replacement_characters() -> None:
    assert parse_object(b'{"a":"caf\xe9 \xff\xfe ok","b":"\\ud83d"}') == {"a": "caf\ufffd \ufffd\ufffd ok",
                                                                          "b": "\ufffd"}
    assert parse_object(b'{"a":\xff}') is None  # not JSON once read: still a bad line
    assert parse_object(b"\x00\xff\xfe garbage") is None
