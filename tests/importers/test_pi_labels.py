"""A bookmark a person set in pi's tree view comes in as a notice naming the message it marks.

pi appends a ``label`` entry (``{"type": "label", "id", "parentId", "timestamp", "targetId", "label"}``; no
``label``: the bookmark taken off) when the person labels an entry (``/label``, the tree view). None of the
shared pi samples holds one, so the test appends pi's shape to a real sample
(``pi/agent-history_pi-smoke_session_info_REDACTED.jsonl``), marking its assistant reply. Reproduces: the entry
was counted as skipped, the bookmark gone from the imported session.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from store.interchange.export import ExportOptions, export_session
from store.interchange.import_write import ImportTarget
from tests.samplekit import import_new

SAMPLE = "pi/agent-history_pi-smoke_session_info_REDACTED.jsonl"


def test_a_label_is_a_notice_naming_its_message(untouched_samples: Path, db: sqlite3.Connection,
                                                target: ImportTarget, tmp_path: Path) -> None:
    data = (untouched_samples / SAMPLE).read_bytes()
    leaf = orjson.loads(data.splitlines()[-1])["id"]
    labels = [
        {"type": "label", "id": "a1b2c3d4", "parentId": leaf, "timestamp": "2026-06-05T05:25:00.000Z",
         "targetId": "65697c71", "label": "smoke answer"},
        {"type": "label", "id": "a1b2c3d5", "parentId": "a1b2c3d4", "timestamp": "2026-06-05T05:25:01.000Z",
         "targetId": "e2e044ff", "label": None},
    ]
    name = "2026-06-05T05-24-28-246Z_019e963d-6bd6-7ade-8a49-256ac3391bdd.jsonl"
    path = tmp_path / "sessions" / "--tmp-agent-history--" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(data + b"".join(orjson.dumps(x) + b"\n" for x in labels))
    rep, messages = import_new(db, target, "pi", path)
    assert "label" not in rep.files[0].skipped
    assert [m["role"] for m in messages] == ["user", "assistant", "system", "system"]
    reply, set_, cleared = messages[1], messages[2], messages[3]
    assert set_["meta"] == {"importedKind": "pi/label", "targetMessageId": reply["id"], "label": "smoke answer"}
    assert set_["blocks"] == [{"type": "text", "text": "Label: smoke answer"}]
    assert cleared["meta"] == {"importedKind": "pi/label", "targetMessageId": messages[0]["id"]}
    assert cleared["blocks"] == [{"type": "text", "text": "Label removed"}]

    out = tmp_path / "export.md"
    with out.open("wb") as fh:
        export_session(db, target.transcript(rep.session_id), rep.session_id, fh, ExportOptions(format="md"))
    assert "Label: smoke answer" in out.read_text()
