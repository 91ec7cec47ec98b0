"""Codex events a person saw and would miss come in as ``system`` notices where they happened.

The CURATED Codex sample (``codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl``) has a review's
findings (``exited_review_mode``, lines 45, 46 and 93), an ``error`` (line 73) and a ``turn_aborted`` (line 20).
Reproduces: each was counted as a skipped ``event_msg`` and missing from the session, so the review the user
asked for, a failed request and an interrupted turn were gone with only a count to say so.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

import orjson
import pytest

from store.interchange import import_write, imports
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS, codex
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, import_new

CURATED = "codex/agent-sessions_CURATED_schema_coverage_compacted.jsonl"


def test_review_findings_errors_and_aborted_turns_are_notices(untouched_samples: Path, db: sqlite3.Connection,
                                                              target: ImportTarget) -> None:
    path = untouched_samples / CURATED
    raw = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    rep, messages = import_new(db, target, "codex", path)
    skipped = rep.files[0].skipped
    for kind in ("error", "turn_aborted", "exited_review_mode"):
        assert f"event_msg/{kind}" not in skipped, kind
    notices = {kind: [m for m in messages if (m.get("meta") or {}).get("importedKind") == f"codex/{kind}"]
               for kind in ("error", "turn_aborted", "exited_review_mode")}
    assert all(m["role"] == "system" for found in notices.values() for m in found)

    reviews = notices["exited_review_mode"]
    assert [m["meta"]["review"] for m in reviews] == [raw[n - 1]["payload"]["review_output"] for n in (45, 46, 93)]
    assert [len(m["meta"]["review"]["findings"]) for m in reviews] == [0, 1, 4]
    first, one, two = (m["blocks"][0]["text"] for m in reviews)
    assert "No findings." in first
    assert "1. [P0] [trimmed for fixture] ([trimmed for fixture]:0-0)" in one
    assert "4. [P0] [trimmed for fixture]" in two

    (error,) = notices["error"]
    assert error["blocks"] == [{"type": "text", "text": raw[72]["payload"]["message"]}]
    assert error["meta"]["errorInfo"] == raw[72]["payload"]["codex_error_info"]
    (aborted,) = notices["turn_aborted"]
    assert aborted["blocks"][0]["text"] == "Turn aborted (interrupted)" and aborted["meta"]["reason"] == "interrupted"
    # in file order: the aborted turn's notice comes before the review notices
    ids = [m["id"] for m in messages]
    assert ids.index(aborted["id"]) < ids.index(reviews[0]["id"]) < ids.index(error["id"]) < ids.index(reviews[2]["id"])


def test_a_session_imported_under_rules_18_gets_the_notices(untouched_samples: Path, tmp_path: Path,
                                                            db: sqlite3.Connection, target: ImportTarget,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Import rules 19: the unchanged rollout of a session the rules-18 importer imported is parsed again and
    the notices it skipped are added; a third import finds it unchanged."""
    (unit,) = IMPORTERS["codex"].discover(untouched_samples / CURATED)
    with monkeypatch.context() as m:
        m.setattr(codex._Converter, "notice_event", lambda self, *args: False)
        m.setattr(import_write, "IMPORT_RULES", 18)
        m.setattr(imports, "IMPORT_RULES", 18)
        first = import_unit(db, unit, target, now_ms=NOW)
    sid = first.session_id
    before = [m.record for m in read_transcript(target.transcript(sid)).messages]
    assert not any((m.get("meta") or {}).get("importedKind", "").startswith("codex/e") for m in before)
    again = import_unit(db, unit, target, now_ms=NOW)
    assert again.status == "updated" and again.new_messages == 5
    after = [m.record for m in read_transcript(target.transcript(sid)).messages]
    kinds = Counter((m.get("meta") or {}).get("importedKind") for m in after)
    assert (kinds["codex/error"], kinds["codex/turn_aborted"], kinds["codex/exited_review_mode"]) == (1, 1, 3)
    assert import_unit(db, unit, target, now_ms=NOW).status == "unchanged"
