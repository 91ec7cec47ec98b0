"""An export of an imported session keeps what the session view carries from its origin history.

A session imported from another agent is served with its origin history (seed 003 §4.5): ``historyModel``,
``historyGit``, ``spawnedBy``, and its project path. A pi-host JSONL export imported into another host must give
them back. Reproduces: the export's ``session_info`` carried ``historyGit`` only, so ``spawnedBy`` was lost and
``historyModel`` came back only when a message happened to name the model.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from store.attachments import AttachmentFiles
from store.indexing import index
from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.common import session_id_for
from store.interchange.imports import import_root, import_unit
from tests.importers.test_child_links import CODEX, CODEX_CHILD
from tests.samplekit import NOW, open_db

FIELDS = ("historyModel", "historyGit", "spawnedBy", "projectPath")


def _export(db: sqlite3.Connection, target: ImportTarget, sid: str, out: Path, fmt: str) -> Path:
    with out.open("wb") as fh:
        export_session(db, target.transcript(sid), sid, fh, ExportOptions(format=fmt))
    return out


def _reimport(out: Path, tmp_path: Path) -> dict[str, Any]:
    """``out`` imported into a fresh host (its own database and sessions directory): the session it gives."""
    (tmp_path / "other").mkdir()
    fresh = open_db(tmp_path / "other" / "pi.sqlite")
    try:
        (tmp_path / "other" / "sessions").mkdir()
        (tmp_path / "other" / "blobs").mkdir()
        other = ImportTarget(tmp_path / "other" / "sessions", AttachmentFiles(tmp_path / "other" / "blobs"))
        (unit,) = IMPORTERS["pi-host"].discover(out)
        rep = import_unit(fresh, unit, other, now_ms=NOW)
        assert rep.status == "new"
        return dict(index.require_session(fresh, rep.session_id))
    finally:
        fresh.close()


def test_codex_child_history_survives_export_and_reimport(db: sqlite3.Connection, target: ImportTarget,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "src" / "sessions"
    shutil.copytree(CODEX, root)
    assert not import_root(db, "codex", root, target, now_ms=lambda: NOW).counts().get("refused")
    sid = session_id_for("codex", CODEX_CHILD)
    before = index.require_session(db, sid)
    assert all(before.get(k) for k in ("historyModel", "spawnedBy", "projectPath")), before
    out = _export(db, target, sid, tmp_path / "child.jsonl", "jsonl")
    info = orjson.loads(out.read_bytes().splitlines()[1])
    assert info["type"] == "session_info"
    for key in FIELDS:
        assert info.get(key) == before.get(key), key
    after = _reimport(out, tmp_path)
    for key in FIELDS:
        assert after.get(key) == before.get(key), key
    # the messages need not name the model: the session_info line alone gives historyModel back
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    for line in lines:
        if isinstance(line.get("meta"), dict):
            line["meta"] = {k: v for k, v in line["meta"].items() if k not in ("modelId", "providerId")}
        if line.get("type") == "turn":  # a turn names its model too (its usage's), never the history's
            line.pop("modelId", None)
            line.pop("providerId", None)
    bare = tmp_path / "bare" / "child.jsonl"
    bare.parent.mkdir()
    bare.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    assert b"gpt-fixture" not in bare.read_bytes().split(b"\n", 2)[2]
    assert _reimport(bare, tmp_path / "bare")["historyModel"] == before["historyModel"]
    # the Markdown and HTML headers name the history's model and the parent session, as they name its git state
    spawn = before["spawnedBy"]
    md = _export(db, target, sid, tmp_path / "child.md", "md").read_text()
    model = before["historyModel"]
    assert f"History model: `{model['providerId']}/{model['modelId']}`" in md
    assert f"Spawned by: `{spawn['sessionId']}`" in md
    page = _export(db, target, sid, tmp_path / "child.html", "html").read_text()
    assert f"Spawned by <code>{spawn['sessionId']}</code>" in page
