"""A failed model request Claude Code showed comes in as a ``system`` notice, not a skip count.

Claude Code writes a ``system`` line with ``subtype: api_error`` (a request failed, a retry under way) or
``subtype: error`` and the error as a structure (``error``: ``message``, ``formatted``, ``status``, the API's
body), no text ``content``. The CURATED Claude Code sample has four ``api_error`` lines (48, 56, 58, 74) and one
``error`` line (``sys-nested-1``). Reproduces: they were counted as skipped ``system/api_error`` /
``system/error`` lines, so the session did not say a request had failed (or why).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from tests.samplekit import import_new

CURATED = "claude-code/agent-sessions_CURATED_schema_coverage.jsonl"


def test_api_errors_are_system_notices(untouched_samples: Path, db: sqlite3.Connection, target: ImportTarget,
                                       tmp_path: Path) -> None:
    path = untouched_samples / CURATED
    raw = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    rep, messages = import_new(db, target, "claude-code", path)
    assert "system/api_error" not in rep.files[0].skipped and "system/error" not in rep.files[0].skipped
    errors = [m for m in messages if (m.get("meta") or {}).get("importedKind") in ("system/api_error", "system/error")]
    assert all(m["role"] == "system" for m in errors)
    assert [m["meta"]["error"] for m in errors] == [
        r["error"] for r in raw if r.get("type") == "system" and isinstance(r.get("error"), dict)]
    assert len(errors) == 5
    nested = next(m for m in messages if m["id"].endswith(":sys-nested-1"))
    assert nested["meta"]["importedKind"] == "system/error" and nested["meta"]["error"]["status"] == 429
    texts = [m["blocks"][0]["text"] for m in errors]
    assert "API error: authentication_error: [trimmed for fixture]" in texts  # the API's body, when no text
    assert all(m["meta"]["maxRetries"] == 0 for m in errors if m["meta"]["importedKind"] == "system/api_error")

    out = tmp_path / "export.md"
    with out.open("wb") as fh:
        export_session(db, target.transcript(rep.session_id), rep.session_id, fh, ExportOptions(format="md"))
    assert "API error: authentication_error: [trimmed for fixture]" in out.read_text()
