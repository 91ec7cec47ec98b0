"""``scripts/fidelity``'s Claude Code reader accounts for rewound branches on its own.

Reproduces: the reader went through a session file in file order, so a rewound file's abandoned turns
(kept by the host in the revisions store, not in the transcript) were reported lost. The files are the
rewound real transcripts of ``test_claude_code_branches`` and ``test_claude_code_subagent_branches`` (a
subagent whose Agent call was rewound). The reader walks the branches itself (``uuid``/``parentUuid``);
the comparison is the one ``scripts/fidelity`` runs, against what a real host serves.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from scripts.fixtures import fidelity_claude_code
from scripts.fixtures._fidelity_host import archived_previews
from scripts.fixtures.fidelity import Result, compare
from store.interchange.importers import discover
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host
from tests.importers.test_claude_code_branches import _compact, _first, _main_files, _resume, _task
from tests.importers.test_claude_code_subagent_branches import _session


def _subagent(tmp: Path) -> Path:
    return _session(tmp, agent_first=True)


CASES: dict[str, Callable[[Path], Path]] = {"resume": _resume, "first": _first, "task": _task, "compact": _compact,
                                            "subagent": _subagent}


def source_archived(path: Path, tmp: Path) -> list[str]:
    (unit,) = discover("claude-code", path.parent if "subagent" in str(tmp) else path)
    return fidelity_claude_code.read_session(list(unit.files)).archived or []


async def _check(path: Path, tmp: Path) -> tuple[Result, Any]:
    (unit,) = discover("claude-code", path.parent if "subagent" in str(tmp) else path)
    sid = session_id_for("claude-code", path.stem)
    async with inprocess_host(tmp / "data") as host, client_for(host) as c:
        result = await c.call("import.sessions", {"source": "claude-code", "root": str(path)})
        (report,) = result["sessions"]
        got = await c.call("session.get", {"sessionId": sid, "full": True})
        totals = (await c.call("usage.session", {"sessionId": sid}))["total"]
        archived = await archived_previews(c, sid)
    source = fidelity_claude_code.read_session(list(unit.files))
    out = Result()
    compare(path.name, source, got["messages"], {"input": totals["inputTokens"], "output": totals["outputTokens"]},
            out, got.get("compactions") or [], got["session"], archived)
    return out, report


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_rewound_files_abandoned_turns_are_archived_not_lost(tmp_path: Path, case: str) -> None:
    path = CASES[case](tmp_path / case)
    result, report = await _check(path, tmp_path / case)
    assert report["archivedBranches"] >= 1
    diffs = [f"{d.kind}: {d.detail}" for d in result.diffs]
    assert diffs == []
    assert result.items > 0 and result.exact >= result.items - 2
    assert source_archived(path, tmp_path / case)


async def test_an_abandoned_text_missing_from_the_archive_is_lost(tmp_path: Path) -> None:
    """Not vacuous: without the archived nodes, each abandoned text is reported lost."""
    path = _resume(tmp_path)
    (unit,) = discover("claude-code", path)
    source = fidelity_claude_code.read_session(list(unit.files))
    assert source.archived == ["What was the word?", "The word was heron."]
    result = Result()
    compare("s", source, [], None, result, (), None, [])
    assert [d.detail for d in result.diffs if "abandoned" in d.detail] == [
        "abandoned-branch text 'What was the word?': no archived node has it",
        "abandoned-branch text 'The word was heron.': no archived node has it"]


def test_no_shared_sample_or_recording_reads_as_rewound() -> None:
    """Parallel tool calls, hooks, agent progress, sidechains and checkpoints are no branches for the reader
    either (a curated file whose path ends at a missing parent is read as one branch, as the importer does)."""
    assert [f.name for f in _main_files() if fidelity_claude_code._abandoned(fidelity_claude_code._lines(f))] == []
