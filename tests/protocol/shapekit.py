"""Compare a live reply with the README's example and the published schema (tests/protocol live checks).

A live value has the documented shape when every key the schema requires is there, every key it carries
is one the schema documents (see ``_open`` for the maps any key may join), an optional key is present,
``null`` or absent, and each value has the documented JSON type (the example's type where it shows one)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCHEMA: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "protocol" / "schema.json").read_text(encoding="utf-8"))
_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    for name, kind in _JSON_TYPES.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _resolve(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _branches(schema: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    schema = _resolve(schema)
    alts = schema.get("anyOf") or schema.get("oneOf")
    if not alts:
        return [schema]
    return [b for alt in alts for b in _branches(alt)]


def _type_ok(schema: Mapping[str, Any], live: Any) -> bool:
    declared = schema.get("type")
    if "const" in schema:
        return bool(live == schema["const"])
    if "enum" in schema:
        return live in schema["enum"]
    if declared is None:
        return True
    names = declared if isinstance(declared, list) else [declared]
    kind = _json_type(live)
    return kind in names or (kind == "integer" and "number" in names)


def _open(schema: Mapping[str, Any]) -> bool:
    """A map any key may join: no documented properties, a content block of the open vocabulary (only its
    ``type`` declared), or a record that says so ("Keys may grow", "more counters may appear")."""
    props = schema.get("properties", {})
    says = schema.get("description", "").lower()
    return not props or set(props) == {"type"} or "keys may grow" in says or "counters may appear" in says


def _tag(schema: Mapping[str, Any]) -> Any:
    schema = _resolve(schema)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum") or ()
    return enum[0] if len(enum) == 1 else None


def _pick(schema: Mapping[str, Any], live: Any) -> Mapping[str, Any] | None:
    fitting = [b for b in _branches(schema) if _type_ok(b, live)]
    if isinstance(live, dict) and len(fitting) > 1:
        for b in fitting:  # a discriminated union: the branch whose tag value (a const) the value carries
            tags = {k: _tag(p) for k, p in b.get("properties", {}).items() if _tag(p) is not None}
            if tags and all(live.get(k) == v for k, v in tags.items()):
                return b
    return fitting[0] if fitting else None


def _example_item(example: Any, live: Any) -> Any:
    if not isinstance(example, list) or not example:
        return None
    if isinstance(live, dict):
        for tag in ("type", "kind", "role"):
            for cand in example:
                if isinstance(cand, dict) and tag in live and cand.get(tag) == live.get(tag):
                    return cand
    return example[0]


def shape_errors(schema: Mapping[str, Any], live: Any, example: Any = None, path: str = "$") -> list[str]:
    """Where ``live`` departs from the documented shape (empty: it matches)."""
    branch = _pick(schema, live)
    if branch is None:
        return [f"{path}: {_json_type(live)} {json.dumps(live)[:80]} is not a documented type"]
    if example is not None and live is not None and _json_type(example) != _json_type(live) \
            and {_json_type(example), _json_type(live)} != {"integer", "number"}:
        return [f"{path}: the example shows {_json_type(example)}, the host sent {_json_type(live)}"]
    errors: list[str] = []
    if isinstance(live, dict):
        props: Mapping[str, Any] = branch.get("properties", {})
        extra = branch.get("additionalProperties")
        for key in branch.get("required", ()):
            if key not in live:
                errors.append(f"{path}.{key}: required, absent")
        for key, value in live.items():
            sub_example = example.get(key) if isinstance(example, dict) else None
            if key in props:
                if value is None:
                    if key in branch.get("required", ()) and _pick(props[key], None) is None:
                        errors.append(f"{path}.{key}: required, null")
                    continue
                errors += shape_errors(props[key], value, sub_example, f"{path}.{key}")
            elif not _open(branch):
                errors.append(f"{path}.{key}: not documented ({json.dumps(value)[:60]})")
            elif isinstance(extra, dict):
                errors += shape_errors(extra, value, sub_example, f"{path}.{key}")
    elif isinstance(live, list) and "items" in branch:
        for i, item in enumerate(live):
            errors += shape_errors(branch["items"], item, _example_item(example, item), f"{path}[{i}]")
    return errors


def result_schema(method: str) -> Mapping[str, Any]:
    return dict(SCHEMA["methods"][method]["result"])


def event_schema(topic: str) -> Mapping[str, Any]:
    return dict(SCHEMA["events"]["topics"][topic])


def documented_errors(method: str) -> list[str]:
    return list(SCHEMA["methods"][method]["errors"])
