"""The pure parts of the catalog: the model-list format and the proxy choice."""

from __future__ import annotations

import orjson
import pytest

from store.config.catalog import BadProviderReply, parse_model_list, proxy_for
from store.rules import MAX_REF_CHARS, MAX_SKIPPED_MODELS_SHOWN


def test_parse_model_list_reads_ids_and_hints_and_dedupes() -> None:
    found = parse_model_list(b'{"object": "list", "data": [{"id": "a"}, {"id": "b", "display_name": " B ", '
                             b'"context_window": 8192, "top_provider": {"max_completion_tokens": 4096}}, '
                             b'{"id": "a", "deprecated": true}]}')
    assert [(m.model_id, m.display_name, m.context_window, m.max_output_tokens, m.deprecated)
            for m in found.models] == [("a", "a", None, None, True), ("b", "B", 8192, 4096, False)]
    assert (found.skipped, found.skipped_view()) == (0, None)


def test_parse_model_list_skips_the_entries_that_are_no_model_and_keeps_the_others() -> None:
    """One entry with a blank id (or a NUL, 201 characters, no id, not an object) made the whole list
    PROVIDER_BAD_REPLY; now it is skipped, counted and named with its reason, and the good ids are kept."""
    listed = [{"id": "good-a"}, {"id": " "}, {"id": "x\u0000"}, {"id": "y" * 201}, {"id": 7}, "m-str",
              {"name": "no id"}, {"id": "good-b"}]
    found = parse_model_list(orjson.dumps({"data": listed}))
    assert [m.model_id for m in found.models] == ["good-a", "good-b"]
    assert found.skipped_view() == {"count": 6, "entries": [
        {"index": 1, "reason": "a model id must not be blank", "modelId": " "},
        {"index": 2, "reason": "a model id must not contain a control character (a NUL, a newline ...)",
         "modelId": "x\u0000"},
        {"index": 3, "reason": f"a model id must be 1-{MAX_REF_CHARS} characters", "modelId": "y" * MAX_REF_CHARS},
        {"index": 4, "reason": "no id: a model id must be a string"},
        {"index": 5, "reason": "not an object"},
        {"index": 6, "reason": "no id: a model id must be a string"}]}
    many = parse_model_list(orjson.dumps({"data": [{"id": "ok"}] + [{"id": ""}] * 100}))
    assert many.skipped == 100 and len(many.shown) == MAX_SKIPPED_MODELS_SHOWN
    assert parse_model_list(b'{"data": []}').models == []  # a provider with no models: a list all the same


@pytest.mark.parametrize("body", [b"", b"[]", b'{"data": {}}', b'{"data": [1]}', b'{"data": [{"id": ""}]}',
                                  b'{"data": [{"id": "x\\u0000"}]}', b'{"data": [{"id": " "}]}',
                                  b'{"data": [{"id": "%s"}]}' % (b"x" * 201), b'{"data": [{"id": " "}, "x"]}'])
def test_parse_model_list_refuses_malformed_bodies(body: bytes) -> None:
    """Not a list of models: not JSON, no data list, or entries of which none is a model."""
    with pytest.raises(BadProviderReply):
        parse_model_list(body)


@pytest.mark.parametrize(("host", "setting", "expected"), [
    ("api.example.com", None, (None, True)),
    ("api.example.com", {"mode": "system"}, (None, True)),
    ("api.example.com", {"mode": "none"}, (None, False)),
    ("api.example.com", {"mode": "manual", "url": "http://p:1"}, ("http://p:1", False)),
    ("api.example.com", {"mode": "manual", "url": "http://p:1", "bypass": ["*.example.com"]}, (None, False)),
    ("example.com", {"mode": "manual", "url": "http://p:1", "bypass": [".example.com"]}, (None, False)),
    ("badexample.com", {"mode": "manual", "url": "http://p:1", "bypass": ["*.example.com"]}, ("http://p:1", False)),
    ("LOCALHOST", {"mode": "manual", "url": "http://p:1", "bypass": ["localhost"]}, (None, False)),
    ("anything", {"mode": "manual", "url": "http://p:1", "bypass": ["*"]}, (None, False)),
])
def test_proxy_for(host: str, setting: object, expected: tuple[str | None, bool]) -> None:
    assert proxy_for(host, setting) == expected
