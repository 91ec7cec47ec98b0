"""The pure parts of the catalog: the model-list format and the proxy choice."""

from __future__ import annotations

import pytest

from store.config.catalog import BadProviderReply, parse_model_list, proxy_for


def test_parse_model_list_reads_ids_and_hints_and_dedupes() -> None:
    found = parse_model_list(b'{"object": "list", "data": [{"id": "a"}, {"id": "b", "display_name": " B ", '
                             b'"context_window": 8192, "top_provider": {"max_completion_tokens": 4096}}, '
                             b'{"id": "a", "deprecated": true}]}')
    assert [(m.model_id, m.display_name, m.context_window, m.max_output_tokens, m.deprecated) for m in found] == [
        ("a", "a", None, None, True), ("b", "B", 8192, 4096, False)]


@pytest.mark.parametrize("body", [b"", b"[]", b'{"data": {}}', b'{"data": [1]}', b'{"data": [{"id": ""}]}',
                                  b'{"data": [{"id": "x\\u0000"}]}', b'{"data": [{"id": " "}]}',
                                  b'{"data": [{"id": "%s"}]}' % (b"x" * 201)])
def test_parse_model_list_refuses_malformed_bodies(body: bytes) -> None:
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
