"""One import reads each Claude Code subagent file from the disk once.

Reproduces: every pass over a ``<session>/subagents/agent-*.jsonl`` file opened it again: the scan for uuids
written again, the peek at its first time stamp, the conversion of the live transcript, and for a rewound
session each abandoned branch's conversion, twice (once for the branch's revision, once for the ids the
session's lines become): 7 or 5 opens of the recorded 2.1.197 subagent file in the rewound sessions
:mod:`tests.importers.test_claude_code_subagent_branches` builds (its ``Task`` call on the abandoned branch or
the live one), 3 without a rewind. Counted through
:func:`store.interchange.importers.reader.open_source`, the one place a source file is opened.

The main transcript likewise: its read-ahead, its conversion, each abandoned branch's conversion (twice) and a
line read back alone for each uuid written again or branch leaf each opened it (5 opens in the rewound session
here, 65 of the 49 kB schema-coverage sample); now one read into the session's snapshot, when it fits.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from store.interchange.importers import claude_code, reader
from store.interchange.imports import import_root
from tests.importers.test_claude_code_subagent_branches import AGENT_FILE, PROJECT, SUBAGENT, _session
from tests.samplekit import NOW, import_workspace, untouched_samples

__all__ = ["untouched_samples"]


def _opens(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    real = reader.open_source

    def counting(path: Path) -> int:
        counts[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(reader, "open_source", counting)
    return counts


@pytest.mark.parametrize("agent_first", [True, False])
def test_a_rewound_session_reads_its_subagent_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        agent_first: bool) -> None:
    root = _session(tmp_path, agent_first=agent_first).parent.parent
    opens = _opens(monkeypatch)
    with import_workspace() as (_, db, target):
        (rep,) = import_root(db, "claude-code", root, target, now_ms=lambda: NOW).sessions
        assert rep.status == "new" and rep.off_branch  # a rewound session: a branch was archived
        assert opens[AGENT_FILE.name] == 1


def test_a_session_reads_its_subagent_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "projects" / PROJECT.name
    shutil.copytree(PROJECT / SUBAGENT, project / SUBAGENT)
    shutil.copyfile(PROJECT / f"{SUBAGENT}.jsonl", project / f"{SUBAGENT}.jsonl")
    opens = _opens(monkeypatch)
    with import_workspace() as (_, db, target):
        (rep,) = import_root(db, "claude-code", tmp_path / "projects", target, now_ms=lambda: NOW).sessions
        assert rep.status == "new" and any(f.path.endswith(AGENT_FILE.name) and f.lines for f in rep.files)
        assert opens[AGENT_FILE.name] == 1


# --------------------------------------------------------------------------- the main transcript

SCHEMA_SAMPLE = "claude-code/agent-sessions_CURATED_schema_coverage.jsonl"
"""A real transcript with many uuids written again (each read back alone from the disk before: 62 opens)."""
PEEKED = 1
"""A first import peeks at the main transcript's ``sessionId`` (8 KiB) before it parses it: the id an earlier
importer gave a renamed file (:func:`store.interchange.importers.former_ids`), looked up before the unit goes to
its session (in a running host, before it is routed to the session's actor)."""


def test_a_rewound_session_reads_its_main_transcript_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    main = _session(tmp_path, agent_first=True)
    opens = _opens(monkeypatch)
    with import_workspace() as (_, db, target):
        (rep,) = import_root(db, "claude-code", main.parent.parent, target, now_ms=lambda: NOW).sessions
        assert rep.status == "new" and rep.off_branch
        assert opens[main.name] == PEEKED + 1
        opens.clear()
        with open(main, "ab") as f:  # the session goes on: one more line, read with the rest
            f.write(main.read_bytes().splitlines(keepends=True)[-1])
        (again,) = import_root(db, "claude-code", main.parent.parent, target, now_ms=lambda: NOW).sessions
        assert again.status in ("updated", "unchanged") and opens[main.name] == 1


def test_a_transcript_with_uuids_written_again_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           untouched_samples: Path) -> None:
    project = tmp_path / "projects" / "-work-demo"
    project.mkdir(parents=True)
    main = Path(shutil.copy(untouched_samples / SCHEMA_SAMPLE, project / "5e55a000-0000-4000-8000-000000000001.jsonl"))
    opens = _opens(monkeypatch)
    with import_workspace() as (_, db, target):
        (rep,) = import_root(db, "claude-code", tmp_path / "projects", target, now_ms=lambda: NOW).sessions
        assert rep.status == "new"
        assert opens[main.name] == PEEKED + 1
        opens.clear()
        with open(main, "ab") as f:
            f.write(main.read_bytes().splitlines(keepends=True)[-1])
        (again,) = import_root(db, "claude-code", tmp_path / "projects", target, now_ms=lambda: NOW).sessions
        assert again.status in ("updated", "unchanged") and opens[main.name] == 1


def test_past_the_snapshot_bound_the_passes_read_the_file_alike(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    main = _session(tmp_path, agent_first=False)
    shown = []
    for bound in (claude_code.MAX_SNAPSHOT_BYTES, 0):
        monkeypatch.setattr(claude_code, "MAX_SNAPSHOT_BYTES", bound)
        opens = _opens(monkeypatch)
        with import_workspace() as (_, db, target):
            (rep,) = import_root(db, "claude-code", main.parent.parent, target, now_ms=lambda: NOW).sessions
            assert rep.status == "new" and rep.off_branch
            shown.append(target.transcript(rep.session_id).read_bytes().split(b"\n", 1)[1])  # past the header
        assert (opens[main.name] == PEEKED + 1) == bool(bound)  # no room: each pass reads the file, as before
    assert shown[0] == shown[1]
