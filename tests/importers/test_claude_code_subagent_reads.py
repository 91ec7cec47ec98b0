"""One import reads each Claude Code subagent file from the disk once.

Reproduces: every pass over a ``<session>/subagents/agent-*.jsonl`` file opened it again: the scan for uuids
written again, the peek at its first time stamp, the conversion of the live transcript, and for a rewound
session each abandoned branch's conversion, twice (once for the branch's revision, once for the ids the
session's lines become): 7 or 5 opens of the recorded 2.1.197 subagent file in the rewound sessions
:mod:`tests.importers.test_claude_code_subagent_branches` builds (its ``Task`` call on the abandoned branch or
the live one), 3 without a rewind. Counted through
:func:`store.interchange.importers.reader.open_source`, the one place a source file is opened.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest

from store.interchange.importers import reader
from store.interchange.imports import import_root
from tests.importers.test_claude_code_subagent_branches import AGENT_FILE, PROJECT, SUBAGENT, _session
from tests.samplekit import NOW, import_workspace


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
