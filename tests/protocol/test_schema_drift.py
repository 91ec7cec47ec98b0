"""The committed protocol/schema.json and README reference match the models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from protocol.methods import EVENTS, METHODS


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_committed_schema_matches_models(export_script: ModuleType) -> None:
    expected = export_script.render_schema(export_script.build_schema())
    committed = export_script.SCHEMA_PATH.read_text(encoding="utf-8")
    assert committed == expected, "protocol/schema.json is stale: run scripts/export_schema.py"


def test_committed_readme_reference_matches_models(export_script: ModuleType) -> None:
    readme = export_script.README_PATH.read_text(encoding="utf-8")
    reference = export_script.render_reference(export_script.build_schema())
    assert export_script.splice_readme(readme, reference) == readme, (
        "protocol/README.md reference is stale: run scripts/export_schema.py"
    )


def test_check_mode_passes_on_committed_files(export_script: ModuleType) -> None:
    assert export_script.main(["--check"]) == 0


def test_export_is_deterministic(export_script: ModuleType) -> None:
    first = export_script.render_schema(export_script.build_schema())
    second = export_script.render_schema(export_script.build_schema())
    assert first == second
    doc = json.loads(first)
    assert list(doc) == sorted(doc)


def test_schema_covers_every_method_event_and_block(export_script: ModuleType) -> None:
    doc = json.loads(export_script.SCHEMA_PATH.read_text(encoding="utf-8"))
    assert set(doc["methods"]) == set(METHODS)
    assert set(doc["events"]["topics"]) == set(EVENTS)
    assert set(doc["blocks"]["known"]) == {"text", "thinking", "tool_call", "attachment", "hostedSearch"}
    for name, entry in doc["methods"].items():
        assert entry["mutating"] == METHODS[name].mutating
        assert entry["errors"] == list(METHODS[name].errors)
        assert {"params", "result", "summary"} <= set(entry)


def test_every_ref_resolves(export_script: ModuleType) -> None:
    doc = json.loads(export_script.SCHEMA_PATH.read_text(encoding="utf-8"))
    refs = set(_refs(doc))
    assert refs, "expected $refs in the schema"
    for ref in refs:
        assert ref.startswith("#/$defs/"), ref
        assert ref.removeprefix("#/$defs/") in doc["$defs"], ref


def test_params_schemas_forbid_unknown_keys(export_script: ModuleType) -> None:
    doc = json.loads(export_script.SCHEMA_PATH.read_text(encoding="utf-8"))
    for name, entry in doc["methods"].items():
        params = doc["$defs"][entry["params"]["$ref"].removeprefix("#/$defs/")]
        assert params.get("additionalProperties") is False, name
        props = params.get("properties", {})
        assert ("submissionId" in props) == METHODS[name].mutating, name


def test_splice_requires_markers(export_script: ModuleType) -> None:
    with pytest.raises(ValueError, match="markers"):
        export_script.splice_readme("# no markers here\n", "x")
