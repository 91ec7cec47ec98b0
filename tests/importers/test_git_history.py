"""The git branch (and commit, repository) another agent recorded with a session comes in with it.

Claude Code writes ``gitBranch`` on every line (the branch checked out when the line was written); Codex writes
``session_meta.git`` (``branch``, ``commit_hash``, ``repository_url``) once. They are kept in the session's
origin history (seed 003 §4.5) and served with the session as ``historyGit``. Reproduces: both were dropped
without a count, so which branch or commit a session worked on was lost on import.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.indexing import index
from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.imports import import_unit
from tests.samplekit import NOW


def _import(db: sqlite3.Connection, target: ImportTarget, path: Path) -> str:
    (unit,) = IMPORTERS[path.parent.name].discover(path)
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert rep.status == "new"
    return rep.session_id


def test_codex_session_meta_git_is_served_with_the_session(untouched_samples: Path, db: sqlite3.Connection,
                                                           target: ImportTarget, tmp_path: Path) -> None:
    path = untouched_samples / "codex/codemie_exec-0.77.0_shell_reasoning_ghost_snapshot.jsonl"
    sid = _import(db, target, path)
    expected = {"branch": "codex", "commit": "02942347cadda24d3080fbfbc2d13295bb3a496d",
                "repositoryUrl": "git@github.com:codemie-ai/codemie-code.git"}
    assert index.require_session(db, sid)["historyGit"] == expected
    assert index.list_sessions(db, limit=10, cursor=None)[0][0]["historyGit"] == expected

    out = tmp_path / "export.jsonl"
    with out.open("wb") as fh:
        export_session(db, target.transcript(sid), sid, fh, ExportOptions(format="jsonl"))
    info = orjson.loads(out.read_bytes().splitlines()[1])
    assert info["type"] == "session_info" and info["historyGit"] == expected
    md = tmp_path / "export.md"
    with md.open("wb") as fh:
        export_session(db, target.transcript(sid), sid, fh, ExportOptions(format="md"))
    assert "Git: `codex @ 02942347cadd`" in md.read_text()
    # the export imported again (into another host) keeps it
    (unit,) = IMPORTERS["pi-host"].discover(out)
    again = import_unit(db, unit, target, now_ms=NOW)
    assert again.status == "new" and index.require_session(db, again.session_id)["historyGit"] == expected


def test_claude_code_git_branch_is_served_with_the_session(untouched_samples: Path, db: sqlite3.Connection,
                                                           target: ImportTarget) -> None:
    one = _import(db, target, untouched_samples / "claude-code/spotter_v2.1.38_short_hooks_local_command.jsonl")
    assert index.require_session(db, one)["historyGit"] == {"branch": "master"}
    # the branch changed during the session: the last one, and every one in the order seen
    changed = _import(db, target, untouched_samples / "claude-code/agent-sessions_CURATED_schema_coverage.jsonl")
    git = index.require_session(db, changed)["historyGit"]
    assert git["branches"] == ["main", "[trimmed for fixture]"] and git["branch"] in git["branches"]
    # an empty gitBranch (not in a repository) names nothing
    none = _import(db, target, untouched_samples / "claude-code/fasthooks_v2.0.76_compaction_thinking_errors.jsonl")
    assert "historyGit" not in index.require_session(db, none)
