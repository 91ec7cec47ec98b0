"""One Claude Code session file name in two project folders: each folder's file is a session of its own.

Claude Code files a transcript under the folder of the directory it was started in
(``projects/<cwd with every other character than a letter or digit as "-">/<sessionId>.jsonl``) and
``--resume <id>`` looks for it there only, so going on with a session in another directory is done by
copying ``<id>.jsonl`` into that directory's folder and resuming it there: Claude Code appends to the copy
under the same session id, while the original may go on in its own folder. Both files then start with the
same lines (same uuids) and end differently; in each folder Claude Code shows that folder's file.

Built from the recorded 2.1.332 ``resume``/``compact`` session: the original went on in its folder (the
whole recording); the copy, taken after the second turn, went on in another directory with its own third
turn (the recording's third turn re-written there: new uuids, the other ``cwd``). Reproduces: both files
were named by their file name and merged into one session, the project of the one imported first.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import orjson

from store.indexing import index
from store.interchange.import_write import ImportTarget
from store.interchange.importers import discover
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_root
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, db, import_workspace, target

__all__ = ["db", "target"]

RECORDED = (Path(__file__).parents[1] / "fixtures" / "recorded" / "claude-code" / "2.1.332" / "projects"
            / "-tmp-record-claude-code-knbzrbze-work" / "9617099f-8f7a-4d84-a5a8-f6641f15ae29.jsonl")
SESSION = RECORDED.stem
HOME = "/tmp/record-claude-code-knbzrbze/work"
ELSEWHERE = "/tmp/record-claude-code-knbzrbze/elsewhere"
COPIED = 31
"""Lines of the recording the copy holds before it went on (two turns, up to the third prompt's queue lines)."""
THIRD_TURN = slice(31, 38)
"""The recording's third turn ("One more time: the word?" and its answer): what the copy went on with."""


def _went_on_elsewhere(lines: list[bytes]) -> list[bytes]:
    """The recording's third turn as the copy's own: written in ``ELSEWHERE`` under new uuids."""
    tail = [orjson.loads(line) for line in lines[THIRD_TURN]]
    renamed = {rec["uuid"]: f"e15e0000-0000-4000-8000-{n:012d}" for n, rec in enumerate(tail) if "uuid" in rec}
    out = []
    for rec in tail:
        if "cwd" in rec:
            rec["cwd"] = ELSEWHERE
        for key in ("uuid", "parentUuid"):
            if rec.get(key) in renamed:
                rec[key] = renamed[rec[key]]
        out.append(orjson.dumps(rec) + b"\n")
    return out


def _layout(root: Path) -> tuple[Path, Path]:
    lines = RECORDED.read_bytes().splitlines(keepends=True)
    original = root / "-tmp-record-claude-code-knbzrbze-work" / RECORDED.name
    copy = root / "-tmp-record-claude-code-knbzrbze-elsewhere" / RECORDED.name
    for path in (original, copy):
        path.parent.mkdir(parents=True)
    original.write_bytes(b"".join(lines))
    copy.write_bytes(b"".join(lines[:COPIED] + _went_on_elsewhere(lines)))
    return original, copy


def _ids(target: ImportTarget, sid: str) -> list[str]:
    return [m.record["id"] for m in read_transcript(target.transcript(sid)).messages]


def _said(target: ImportTarget, sid: str) -> list[tuple[str, bytes]]:
    return [(m.record["role"], orjson.dumps(m.record.get("blocks")))
            for m in read_transcript(target.transcript(sid)).messages]


def test_each_folder_is_a_session_of_its_own(tmp_path: Path, db: sqlite3.Connection, target: ImportTarget) -> None:
    original, copy = _layout(tmp_path / "projects")
    alone = tmp_path / "alone"  # each file imported by itself: what its session must hold
    alone_said: list[list[tuple[str, bytes]]] = []
    for n, path in enumerate((original, copy)):
        (alone / str(n) / path.parent.name).mkdir(parents=True)
        shutil.copy(path, alone / str(n) / path.parent.name / path.name)
    summary = import_root(db, "claude-code", tmp_path / "projects", target, now_ms=lambda: NOW)
    assert sorted(r.status for r in summary.sessions) == ["new", "new"]
    units = {u.files[0]: u.external_id for u in discover("claude-code", tmp_path / "projects")}
    assert units[original] == SESSION and units[copy].startswith(f"{SESSION}@")
    own, other = session_id_for("claude-code", SESSION), session_id_for("claude-code", units[copy])
    assert {r.session_id for r in summary.sessions} == {own, other}
    shown = {sid: _said(target, sid) for sid in (own, other)}
    for n in (0, 1):  # into a workspace of their own, where each is the session of its file name
        with import_workspace() as (_, scratch, alone_target):
            (rep,) = import_root(scratch, "claude-code", alone / str(n), alone_target, now_ms=lambda: NOW).sessions
            alone_said.append(_said(alone_target, rep.session_id))
    assert shown[own] == alone_said[0] and shown[other] == alone_said[1]
    assert len(shown[own]) > len(shown[other])
    assert shown[other][:-2] == shown[own][:len(shown[other]) - 2]  # the copied start, then its own turn
    assert sum("e15e0000" in i for i in _ids(target, other)) == 2
    assert not any("e15e0000" in i for i in _ids(target, own))
    for sid, path in ((own, HOME), (other, ELSEWHERE)):
        row = index.session_row(db, sid)
        assert row is not None and row["projectPath"] == path
    again = import_root(db, "claude-code", tmp_path / "projects", target, now_ms=lambda: NOW)
    assert [r.status for r in again.sessions] == ["unchanged", "unchanged"]


def test_the_copy_is_named_alike_through_its_project_folder_or_as_a_file(tmp_path: Path) -> None:
    original, copy = _layout(tmp_path / "projects")
    whole = {u.files[0]: u.external_id for u in discover("claude-code", tmp_path / "projects")}
    for route in (copy.parent, copy, original.parent, original):
        (unit,) = [u for u in discover("claude-code", route) if u.files[0] in (original, copy)]
        assert unit.external_id == whole[unit.files[0]]
