"""``pi-host import <tool> PATH`` given the tool's home (``~/.claude``, ``~/.codex``, ``~/.pi/agent``: what
``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``PI_CODING_AGENT_DIR`` name; for opencode the XDG data home) instead
of its sessions folder.

Reproduces: Claude Code's importer took the config directory's own folders (``projects``, ``todos``...)
for project directories and its top-level ``history.jsonl`` for a session, so the import said "nothing
found" or refused the history file; Codex's read every ``.jsonl`` under its home and refused its prompt
history ``history.jsonl`` ("not a Codex rollout"), so the import exited 1 with every session imported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from store.interchange.importers import claude_code, codex, opencode, pi
from store.interchange.importers.common import ParseContext

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
RECORDED = FIXTURES / "claude-code" / "2.1.332"


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


def test_codex_home_reads_its_sessions_and_archived_sessions_not_its_history(tmp_path: Path) -> None:
    home = tmp_path / ".codex"
    shutil.copytree(FIXTURES / "codex" / "0.171.0" / "sessions", home / "sessions")
    rollouts = sorted((home / "sessions").rglob("*.jsonl"))
    (home / "archived_sessions").mkdir()
    archived = rollouts[-1].rename(home / "archived_sessions" / rollouts[-1].name)  # as `codex` archives one
    (home / "history.jsonl").write_text(json.dumps({"session_id": "0199a1b2-0000-7000-8000-000000000001",
                                                    "ts": 1764633600, "text": "hello"}) + "\n")
    (home / "config.toml").write_text("")
    units = list(codex.discover(home))
    files = sorted(u.files[0] for u in units)
    assert files == sorted([*rollouts[:-1], archived]) and len(units) == 8
    for unit in units:
        parsed = codex.parse(unit, ParseContext())
        assert any(rec.get("type") == "message" for rec in parsed.records), unit.external_id
    # a sessions folder itself is read whole, as before: the seven rollouts left in it
    assert sorted(u.files[0] for u in codex.discover(home / "sessions")) == rollouts[:-1]


def test_pi_agent_dir_reads_as_its_sessions_folder(tmp_path: Path) -> None:
    agent = tmp_path / ".pi" / "agent"
    shutil.copytree(FIXTURES / "pi" / "0.73.1" / "sessions", agent / "sessions")
    (agent / "settings.json").write_text("{}")
    from_agent = [(u.external_id, u.files) for u in pi.discover(agent)]
    assert from_agent == [(u.external_id, u.files) for u in pi.discover(agent / "sessions")]
    assert len(from_agent) == 3


def test_the_xdg_data_home_reads_as_its_opencode_folder(tmp_path: Path) -> None:
    share = tmp_path / ".local" / "share"
    (share / "opencode").mkdir(parents=True)
    shutil.copy(FIXTURES / "opencode" / "1.18.33" / "opencode.db", share / "opencode" / "opencode.db")
    (share / "applications").mkdir()  # another program's folder beside it
    from_share = [(u.external_id, u.files) for u in opencode.discover(share)]
    assert from_share == [(u.external_id, u.files) for u in opencode.discover(share / "opencode")]
    assert len(from_share) == 5
