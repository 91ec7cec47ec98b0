"""Issue 23: a data directory imported under older import rules ends as a fresh import makes it.

Reproduces: sessions imported before ``IMPORT_RULES`` 4 (Claude Code checkpoints without their
request's usage) and 6 (no link between a Codex/opencode child session and its spawning call) are parsed
again on the next import because the origin row names older rules; the records that differ are written
again with the same id. The Claude Code checkpoint was then served twice (its old line without usage and
the new one), so the upgraded directory differed from a fresh import. For every recorded tool version
(Claude Code, Codex, pi, opencode): the older import is the recorded files imported with what those rules
did not write yet taken out of the records and the origin; the re-import must then serve exactly what a
fresh import into an empty directory serves — the same visible messages in the same order, the same
checkpoints, the same usage rows and the same session and origin rows: nothing duplicated, nothing lost.
Rules 8 (a pi branch family with its live variant, ``is_active`` and the root's pager stamp; a Codex child's
prompt marked as the parent agent's): an import under rules 7 (or 3) had neither; upgraded, the revisions
store, its rows and the stamped root line are what a fresh import makes.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.fixtures import TOOLS
from scripts.fixtures.fidelity_run import recordings
from store.attachments import AttachmentFiles
from store.indexing import index
from store.interchange import import_write
from store.interchange.import_write import ImportTarget
from store.interchange.importers.common import Parsed
from store.interchange.imports import import_root
from store.revisions import read_revisions
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, open_db

RECORDED = [(tool, folder, rules) for tool in TOOLS for folder in recordings(tool) for rules in (3, 7)]


def older(record: dict[str, Any], rules: int) -> dict[str, Any]:
    """A record as ``rules`` wrote it: 3 = no checkpoint usage (rules 4), no child session link (rules 6);
    both: no mark on a Codex child's prompt from its parent agent (rules 8)."""
    out = dict(record)
    gone = {"fromAgent"} | ({"childSessionId"} if rules < 6 else set())
    if rules < 4 and out.get("type") == "compaction" and isinstance(out.get("details"), dict):
        out["details"] = {k: v for k, v in out["details"].items()
                          if k not in ("usage", "usageRaw", "providerId", "modelId")}
    if isinstance(out.get("meta"), dict) and gone & set(out["meta"]):
        out["meta"] = {k: v for k, v in out["meta"].items() if k not in gone}
    return out


def older_parse(real: Any, rules: int) -> Any:
    def parse(unit: Any, ctx: Any) -> Parsed:
        parsed = real(unit, ctx)

        def records() -> Iterator[dict[str, Any]]:
            for rec in parsed.records:
                yield older(rec, rules)
            if rules < 6:
                parsed.meta.history.pop("spawnedBy", None)

        if rules < 7:  # no revisions store for a pi file's other branches
            return Parsed(parsed.meta, parsed.report, records(), parsed.follows_branch)
        return Parsed(parsed.meta, parsed.report, records(), parsed.follows_branch, parsed.source_ids,
                      parsed.off_branch)
    return parse


def data_dir(base: Path) -> tuple[sqlite3.Connection, ImportTarget]:
    (base / "sessions").mkdir(parents=True)
    (base / "attachments").mkdir()
    return open_db(base / "pi.sqlite"), ImportTarget(base / "sessions", AttachmentFiles(base / "attachments"))


def served(conn: sqlite3.Connection, target: ImportTarget) -> dict[str, Any]:
    """What a client is served of every session: rows, visible messages in order, checkpoints, usage rows."""
    out: dict[str, Any] = {}
    for sid, in conn.execute("SELECT id FROM sessions ORDER BY id").fetchall():
        session = index.public_session(index.require_session(conn, sid))
        t = read_transcript(target.transcript(sid))
        deleted = t.deleted_ids
        rows = conn.execute("SELECT id, role, deleted FROM messages WHERE session_id = ? ORDER BY seq",
                            (sid,)).fetchall()
        origin = conn.execute("SELECT plugin_id, source_id, external_id, source_label, origin_json "
                              "FROM session_import_origins WHERE session_id = ?", (sid,)).fetchone()
        turns = conn.execute("SELECT id, status, provider_id, model_id, input_tokens, output_tokens, usage_json "
                             "FROM turns WHERE session_id = ? ORDER BY id", (sid,)).fetchall()
        out[sid] = {
            "session": {k: v for k, v in session.items() if k != "updatedAt"},
            "messages": [dict(m.record) for m in t.messages if m.id not in deleted],
            "rows": [r for r in rows if not r[2]],
            "compactions": [dict(c.record) for c in t.compactions],
            "turns": turns,
            "origin": (*origin[:4], json.loads(origin[4])),
            "revisions": conn.execute("SELECT root_user_id, revision_index, is_active, message_count FROM "
                                      "message_revisions WHERE session_id = ? ORDER BY 1, 2", (sid,)).fetchall(),
            "stored": {key: (e.live, e.messages) for key, e in read_revisions(target.revisions(sid)).entries.items()},
        }
    return out


@pytest.mark.parametrize(("tool", "folder", "old_rules"), RECORDED,
                         ids=[f"{t}-{f.name}-rules{r}" for t, f, r in RECORDED])
def test_an_older_import_is_parsed_again_and_ends_as_a_fresh_import(tool: str, folder: Path, old_rules: int,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "source"
    shutil.copytree(folder, root)
    src = root / json.loads((folder / "manifest.json").read_text()).get(
        "importRoot", {"pi": "sessions", "opencode": "opencode.db"}.get(tool, "."))
    old_db, old_target = data_dir(tmp_path / "upgraded")
    with monkeypatch.context() as m:
        m.setattr(import_write, "IMPORT_RULES", old_rules)
        m.setattr(import_write, "parse", older_parse(import_write.parse, old_rules))
        m.setattr(import_write, "_stamp_families", lambda *args: None)  # no live variants, no pager stamps
        before = import_root(old_db, tool, src, old_target, now_ms=lambda: NOW)
    assert not before.counts().get("refused")
    assert {json.loads(r[0])["importRules"] for r in old_db.execute("SELECT origin_json FROM session_import_origins")
            } == {old_rules}
    upgraded = import_root(old_db, tool, src, old_target, now_ms=lambda: NOW)
    assert not upgraded.counts().get("refused")
    # parsed again (not skipped as unchanged by its fingerprints): the origin names the current rules
    assert {json.loads(r[0])["importRules"] for r in old_db.execute("SELECT origin_json FROM session_import_origins")
            } == {import_write.IMPORT_RULES}
    fresh_db, fresh_target = data_dir(tmp_path / "fresh")
    assert not import_root(fresh_db, tool, src, fresh_target, now_ms=lambda: NOW).counts().get("refused")
    got, want = served(old_db, old_target), served(fresh_db, fresh_target)
    assert got.keys() == want.keys()
    for sid in want:
        assert got[sid] == want[sid], sid
    again = import_root(old_db, tool, src, old_target, now_ms=lambda: NOW + 1)
    assert again.counts() == {"unchanged": len(want)}
