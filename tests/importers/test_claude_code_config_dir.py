"""``pi-host import claude-code ~/.claude``: the config directory (what ``CLAUDE_CONFIG_DIR`` names) given
instead of its ``projects/`` folder. Reproduces: the importer took the config directory's own folders
(``projects``, ``todos``...) for project directories and its top-level ``history.jsonl`` for a session,
and the import said "nothing found" (or refused the history file) with no hint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from store.interchange.importers import claude_code
from store.interchange.importers.common import ParseContext

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "claude-code" / "2.1.332"


def _units(root: Path) -> list[tuple[str, tuple[str, ...]]]:
    return [(u.external_id, tuple(str(p.relative_to(root if root.is_dir() else root.parent)) for p in u.files))
            for u in claude_code.discover(root)]


def test_the_config_directory_reads_as_its_projects_root(tmp_path: Path) -> None:
    config = tmp_path / ".claude"
    shutil.copytree(RECORDED / "projects", config / "projects")
    (config / "todos").mkdir()
    (config / "history.jsonl").write_text(json.dumps({"display": "hello", "pastedContents": {},
                                                      "timestamp": 1764633600000, "project": "/w/p"}) + "\n")
    (config / "settings.json").write_text("{}")
    from_config = [(u.external_id, u.files) for u in claude_code.discover(config)]
    from_projects = [(u.external_id, u.files) for u in claude_code.discover(config / "projects")]
    assert from_config == from_projects and len(from_config) == 6
    assert all("history" not in str(p) for u in claude_code.discover(config) for p in u.files)
    for unit in claude_code.discover(config):  # each one parses as a session with messages
        parsed = claude_code.parse(unit, ParseContext())
        assert any(rec.get("type") == "message" for rec in parsed.records), unit.external_id


def test_a_projects_root_and_a_project_directory_are_unchanged(tmp_path: Path) -> None:
    projects = RECORDED / "projects"
    (project,) = [p for p in projects.iterdir() if p.is_dir()]
    assert [u.external_id for u in claude_code.discover(projects)] == [u.external_id for u in
                                                                       claude_code.discover(project)]
