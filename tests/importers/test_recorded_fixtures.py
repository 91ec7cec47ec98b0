"""The session files today's CLIs really wrote (``tests/fixtures/recorded``, ``scripts/record_fixtures``).

For every recorded tool version: the import through a real in-process host takes every session, a
re-import (and another after every file's mtime changed) reports every one ``unchanged`` and leaves no
temp file, and ``scripts/fidelity``'s comparison
(an independent reader of the source against what the host serves) finds nothing lost, distorted or
extra. The recordings themselves are checked to hold what their scenarios claim (thinking, a failed tool
call, a subagent), so a re-recording that silently lost a scenario fails here. No network, no npm.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from scripts.fixtures import TOOLS, module_for
from scripts.fixtures.common import FIXTURES
from scripts.fixtures.fidelity import Result, SourceSession, compare
from scripts.fixtures.fidelity_run import check_recording, recordings
from store.interchange.importers import discover, parse
from store.interchange.importers.common import ParseContext

RECORDED = [(tool, folder) for tool in TOOLS if tool not in ("pi", "opencode")
            for folder in recordings(tool)]
"""Claude Code and Codex (pi and opencode have their own runner: tests/importers/test_recorded_pi_opencode.py)."""
IDS = [f"{tool}-{folder.name}" for tool, folder in RECORDED]


def manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def test_claude_code_and_codex_recordings_are_present() -> None:
    recorded = {tool for tool, _ in RECORDED}
    assert {"claude-code", "codex"} <= recorded, f"recorded fixtures missing under {FIXTURES}"


@pytest.mark.parametrize(("tool", "folder"), RECORDED, ids=IDS)
def test_recorded_sessions_import_reimport_unchanged_and_fidelity_is_exact(tool: str, folder: Path) -> None:
    man = manifest(folder)
    sessions = {f["session"] for f in man["files"]}
    checked = check_recording(tool, folder)
    first, second = checked.first, checked.second
    assert first["counts"].get("new") == len(sessions), first["counts"]
    assert not first["counts"].get("refused"), [r for r in first["sessions"] if r["status"] == "refused"]
    assert second["counts"].get("unchanged") == len(sessions), second["counts"]
    assert second.get("newMessages", 0) == 0
    assert checked.touched["counts"].get("unchanged") == len(sessions), checked.touched["counts"]  # mtime only
    assert checked.temp_files == []
    res = checked.result
    assert res.sessions == len(sessions) and res.items > len(sessions)
    assert res.ok, "\n".join(f"{d.kind}: {d.session}: {d.detail}" for d in res.diffs)
    assert res.exact == res.items


def source_sessions(tool: str, folder: Path) -> list[SourceSession]:
    reader = module_for("fidelity", tool)
    assert reader is not None
    man = manifest(folder)
    by_session: dict[str, list[Path]] = {}
    for f in man["files"]:
        by_session.setdefault(f["session"], []).append(folder / f["path"])
    out = []
    for files in by_session.values():
        source = reader.read_session(sorted(files, key=lambda p: "subagents" in p.parts))
        if hasattr(reader, "tool_totals"):
            reader.tool_totals(man, source)
        out.append(source)
    return out


@pytest.mark.parametrize(("tool", "folder"), RECORDED, ids=IDS)
def test_the_recordings_hold_what_their_scenarios_claim(tool: str, folder: Path) -> None:
    man = manifest(folder)
    scenarios = {s for f in man["files"] for s in f["scenarios"]}
    items = [item for source in source_sessions(tool, folder) for item in source.items]
    kinds = {item.kind for item in items}
    assert {"user", "assistant"} <= kinds
    if "thinking" in scenarios:
        assert "thinking" in kinds
    if "tool-ok" in scenarios:
        assert any(i.kind == "result" and not i.attrs["error"] for i in items)
    if "tool-fail" in scenarios:
        assert any(i.kind == "result" and i.attrs["error"] for i in items)
    if "subagent" in scenarios and tool == "claude-code":
        assert any(i.sub for i in items)  # subagent rows, attributed to the Agent call that started them
    if "compact" in scenarios:
        assert "compaction" in kinds
    if "resume" in scenarios:
        (resumed,) = [f for f in man["files"] if "resume" in f["scenarios"]]
        assert resumed["role"] == "session"
    for scenario, why in man.get("impossible", {}).items():
        assert why, scenario


@pytest.mark.parametrize(("tool", "folder"), RECORDED, ids=IDS)
def test_the_comparison_sees_a_lost_and_a_distorted_item(tool: str, folder: Path) -> None:
    """The fidelity check is not vacuous: on the importer's own records (what the host would serve) it is
    exact, and it reports a dropped message as lost and a flipped error flag as distorted."""
    reader = module_for("fidelity", tool)
    assert reader is not None
    root = folder / manifest(folder)["importRoot"]
    flipped_any = False
    for unit in discover(tool, root):
        last: dict[str, dict[str, Any]] = {}
        for rec in parse(unit, ParseContext()).records:
            last[rec["id"]] = rec
        served = [r for r in last.values() if r.get("type") == "message"]
        compactions = [r for r in last.values() if r.get("type") == "compaction"]
        # a Codex child thread's unit also names its parent's rollout, read only for the link
        source = reader.read_session([p for p in unit.files if ("parentFile", str(p)) not in unit.locator])
        exact = Result()
        compare("s", source, served, None, exact, compactions)
        assert exact.ok, [d.detail for d in exact.diffs]
        tools = [i for i, r in enumerate(served) if r.get("role") == "tool" and "status" in r["blocks"][0]]
        if not tools:
            continue
        broken = copy.deepcopy(served)
        block = broken[tools[0]]["blocks"][0]
        block["status"] = "ok" if block["status"] == "error" else "error"
        users = [i for i, r in enumerate(broken) if r.get("role") == "user"]
        del broken[users[0]]
        res = Result()
        compare("s", source, broken, None, res, compactions)
        assert res.count("lost") >= 1 and res.count("distorted") >= 1, [d.detail for d in res.diffs]
        flipped_any = True
    assert flipped_any
