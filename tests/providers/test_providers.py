"""Providers and the model catalog against a real HTTP server on 127.0.0.1 (seed 003 §4.3, §4.4, §10)."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol import models as m
from runtime.client import HostClient, RpcError
from store.config import catalog
from store.config.secrets import SecretStore
from tests.acceptance.test_seed003_providers_audit import Misbehaving, Script, http, send
from tests.dbkit import rows as _rows
from tests.hostkit import client_for, inprocess_host
from tests.httpkit import FakeProvider, Reply
from tests.pipeline import probe
from tests.threadkit import on_trio_thread

KEY = "sk-test-9f1c3a7d5e2b4c6a8e0d"
MODELS = [{"id": "gpt-a", "object": "model"}, {"id": "gpt-b", "name": "GPT B", "context_length": 128000},
          {"id": "mine", "object": "model"}]


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def _provider(c: HostClient, server: FakeProvider, pid: str = "local", **extra: Any) -> dict[str, Any]:
    params = {"id": pid, "name": "Local", "baseUrl": server.base_url, "apiKey": KEY, **extra}
    return dict((await c.call("providers.create", params))["provider"])


async def test_provider_crud_never_returns_the_key_and_keeps_it_only_in_the_secret_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS, api_key=KEY)) as server:
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            created = await _provider(c, server, config={"headers": {"HTTP-Referer": "https://pi.desktop"}})
            assert created["hasApiKey"] is True and created["secretRef"] == "provider/local"
            assert KEY not in repr(created)
            assert (await c.call("providers.get", {"providerId": "local"}))["provider"] == created
            await c.call("models.refresh", {"providerId": "local"})
            assert server.requests == [("/v1/models", f"Bearer {KEY}")]
            updated = (await c.call("providers.update", {"providerId": "local", "name": "Renamed",
                                                         "defaultModelId": "gpt-a"}))["provider"]
            assert updated["name"] == "Renamed" and updated["hasApiKey"] is True
            listed = (await c.call("providers.list", {}))["providers"]
            assert KEY not in repr(listed)
            assert (await c.call("secrets.get", {"ref": "provider/local"}))["value"] == KEY  # the UI/sidecar path
        async with inprocess_host(data) as host:
            pass  # a restart: the WAL is folded into pi.sqlite, logs are written
    key = KEY.encode()
    found = [str(p.relative_to(data)) for p in data.rglob("*") if p.is_file() and key in p.read_bytes()]
    assert found == [], f"the API key is in plain text in {found}"
    for encoded in (base64.b64encode(key), key.hex().encode()):
        assert not [p for p in data.rglob("*") if p.is_file() and encoded in p.read_bytes()]
    assert SecretStore(data / "secrets").get("provider/local").value == KEY  # ciphertext that decrypts
    assert _rows(data, "SELECT secret_ref FROM providers") == [("provider/local",)]


async def test_a_removed_key_is_gone_and_a_deleted_provider_takes_its_models_and_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS)) as server:
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await _provider(c, server)
            await c.call("models.refresh", {"providerId": "local"})
            cleared = (await c.call("providers.update", {"providerId": "local", "apiKey": None}))["provider"]
            assert cleared["hasApiKey"] is False and "secretRef" not in cleared
            assert not SecretStore(data / "secrets").exists("provider/local")
            await c.call("providers.update", {"providerId": "local", "apiKey": "sk-second"})
            assert (await c.call("providers.delete", {"providerId": "local"})) == {"providerId": "local",
                                                                                  "deleted": True}
            assert (await c.call("models.list", {}))["models"] == []
            assert not SecretStore(data / "secrets").exists("provider/local")
            assert (await c.call("secrets.list", {}))["secrets"] == []
            assert (await _err(c.call("providers.get", {"providerId": "local"}))).data_code == "NOT_FOUND"


@pytest.mark.parametrize(("config", "field"), [
    ({"apiKey": "sk-x"}, "config.apiKey"),
    ({"headers": {"Authorization": "Bearer sk-x"}}, "config.headers.Authorization"),
    ({"headers": {"x-api-key": "sk-x"}}, "config.headers.x-api-key"),
    ({"nested": {"client_secret": "s"}}, "config.nested.client_secret"),
    ({"headers": {"bad name": "v"}}, "config.headers.bad name"),
    ({"headers": {"X-Ok": "two\nlines"}}, "config.headers.X-Ok"),
    ({"headers": ["X-A"]}, "config.headers"),
    ({"timeoutMs": 5}, "config.timeoutMs"),
])
async def test_provider_config_is_validated_and_a_refusal_changes_nothing(tmp_path: Path, config: dict[str, Any],
                                                                         field: str) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "keep", "name": "Keep"})
            state = probe.state(data)
            err = await _err(c.call("providers.create", {"id": "p", "name": "P", "config": config, "apiKey": "k"}))
            assert err.data_code == "INVALID_PARAMS" and err.data["field"] == field
            err = await _err(c.call("providers.update", {"providerId": "keep", "config": config}))
            assert err.data_code == "INVALID_PARAMS"
            bad_url = await _err(c.call("providers.create", {"id": "q", "name": "Q", "baseUrl": "ftp://x"}))
            assert bad_url.data_code == "INVALID_PARAMS"
            creds = await _err(c.call("providers.create", {"id": "q", "name": "Q", "baseUrl": "https://u:p@x/v1"}))
            assert creds.data_code == "INVALID_PARAMS"
            # a key in the query is a credential too: seed 003 §10.3, secret values never in SQLite
            for query in ("?key=AIzaSyA1234567890abcdefghijklmnopqrstu", "?api_key=abc123", "?sig=abc123"):
                creds = await _err(c.call("providers.create", {"id": "q", "name": "Q",
                                                               "baseUrl": f"https://gen.example/v1{query}"}))
                assert creds.data_code == "INVALID_PARAMS" and creds.data["field"] == "baseUrl"
                creds = await _err(c.call("providers.update", {"providerId": "keep",
                                                               "baseUrl": f"https://gen.example/v1{query}"}))
                assert creds.data_code == "INVALID_PARAMS"
            proxy = await _err(c.call("settings.set", {"key": "networkProxy", "value": {
                "mode": "manual", "url": "http://alice:hunter2secret@proxy.example:8080"}}))
            assert proxy.data_code == "INVALID_PARAMS" and "credential" in str(proxy)
            assert probe.state(data) == state
            await c.call("settings.set", {"key": "networkProxy", "value": {  # a user name alone is no secret
                "mode": "manual", "url": "http://alice@proxy.example:8080"}})
            assert (await c.call("providers.create", {"id": "v", "name": "V",  # other query parameters are fine
                                                      "baseUrl": "https://x.example/v1?api-version=2024-06-01"}))


async def test_reorder_owns_the_display_order(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            for pid in ("a", "b", "c"):
                await c.call("providers.create", {"id": pid, "name": pid.upper()})

            async def order() -> list[str]:
                return [p["id"] for p in (await c.call("providers.list", {}))["providers"]]

            assert await order() == ["a", "b", "c"]  # no saved order: creation order
            await c.call("providers.reorder", {"providerIds": ["c", "a"]})
            assert await order() == ["c", "a", "b"]  # ids it does not name follow
            await c.call("providers.create", {"id": "d", "name": "D"})
            assert await order() == ["c", "a", "b", "d"]  # new ids follow the saved ones
            await c.call("providers.delete", {"providerId": "c"})
            assert await order() == ["a", "b", "d"]  # a deleted id leaves the saved order
            assert (await c.call("settings.get", {"key": "providers.order"}))["value"] == ["a"]
            # a new provider under the deleted one's id is new: it follows, it does not take the old slot
            await c.call("providers.create", {"id": "c", "name": "C again"})
            assert await order() == ["a", "b", "d", "c"]  # in creation order, after the saved ones
            await c.call("providers.delete", {"providerId": "c"})
            # a stale list naming the deleted provider: its id is ignored, the rest is saved
            assert await c.call("providers.reorder", {"providerIds": ["d", "c", "b"]}) == {"providerIds": ["d", "b"]}
            assert await order() == ["d", "b", "a"]
            assert (await c.call("settings.get", {"key": "providers.order"}))["value"] == ["d", "b"]
            assert (await _err(c.call("providers.reorder", {"providerIds": ["a", "a"]}))).data_code \
                == "INVALID_PARAMS"
            owned = await _err(c.call("settings.set", {"key": "providers.order", "value": ["b"]}))
            assert owned.data_code == "INVALID_PARAMS"


async def test_refresh_upserts_discovered_rows_and_a_user_row_survives_ten_refreshes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS, api_key=KEY)) as server:
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await _provider(c, server)
            user = (await c.call("models.add", {"providerId": "local", "modelId": "mine", "displayName": "My model",
                                                "contextWindow": 4096, "capabilities": ["tools"]}))["model"]
            row = _rows(data, "SELECT * FROM models WHERE model_id = 'mine'")
            first = await c.call("models.refresh", {"providerId": "local"})
            assert (first["listed"], first["added"], first["userKept"]) == (3, 2, 1)
            for i in range(10):
                if i == 5:
                    server.reply.models = [*MODELS[1:], {"id": "gpt-c"}]  # gpt-a leaves the list
                await c.call("models.refresh", {"providerId": "local"})
            assert _rows(data, "SELECT * FROM models WHERE model_id = 'mine'") == row, "a refresh touched a user row"
            models = {m["modelId"]: m for m in (await c.call("models.list", {"providerId": "local"}))["models"]}
            assert models["mine"] == user
            assert models["gpt-b"]["displayName"] == "GPT B" and models["gpt-b"]["contextWindow"] == 128000
            assert models["gpt-a"]["source"] == "discovered" and models["gpt-a"]["deprecated"] is True  # kept
            assert models["gpt-c"]["deprecated"] is False
            server.reply.models = MODELS
            await c.call("models.refresh", {"providerId": "local"})
            back = {m["modelId"]: m for m in (await c.call("models.list", {}))["models"]}
            assert back["gpt-a"]["deprecated"] is False
            stamp = (await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:local"}))["value"]
            assert stamp["listed"] == 3 and stamp["userKept"] == 1
            removed = await _err(c.call("models.remove", {"providerId": "local", "modelId": "gpt-a"}))
            assert removed.data_code == "INVALID_PARAMS"  # discovered rows are the refresh's
            assert (await c.call("models.remove", {"providerId": "local", "modelId": "mine"}))["deleted"] is True
            assert len(server.requests) == 12


@pytest.mark.parametrize(("reply", "code"), [
    (Reply(models=MODELS, api_key="another-key"), "PROVIDER_UNAUTHORIZED"),
    (Reply(status=403), "PROVIDER_UNAUTHORIZED"),
    (Reply(delay=5.0), "PROVIDER_TIMEOUT"),
    (Reply(body=b"<html>not json</html>"), "PROVIDER_BAD_REPLY"),
    (Reply(body=b'{"models": []}'), "PROVIDER_BAD_REPLY"),
    (Reply(body=b'{"data": [{"name": "no id"}]}'), "PROVIDER_BAD_REPLY"),
    (Reply(body=b'{"data": [{"id": 7}]}'), "PROVIDER_BAD_REPLY"),
    (Reply(body=b'{"data": "x"}'), "PROVIDER_BAD_REPLY"),
    (Reply(status=500), "PROVIDER_BAD_REPLY"),
], ids=["401", "403", "timeout", "not-json", "no-data", "entry-without-id", "id-not-text", "data-not-list", "500"])
async def test_a_failed_refresh_is_a_clear_error_and_writes_nothing(tmp_path: Path, reply: Reply, code: str) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS)) as server:
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await _provider(c, server)
            await c.call("models.refresh", {"providerId": "local"})  # something stored already
            state = probe.state(data)
            server.reply = reply
            # 0.5 s only where the timeout is the point (the fake waits 5 s); a loaded machine gets 10 s
            timeout_ms = 500 if code == "PROVIDER_TIMEOUT" else 10_000
            err = await _err(c.call("models.refresh", {"providerId": "local", "timeoutMs": timeout_ms,
                                                       "submissionId": "r-1"}))
            assert err.data_code == code, err
            assert probe.state(data) == state, f"a failed refresh ({code}) wrote something"
            server.reply = Reply(models=MODELS)  # the same key may be retried once the provider is back
            assert (await c.call("models.refresh", {"providerId": "local", "timeoutMs": timeout_ms,
                                                    "submissionId": "r-1"}))["listed"] == 3


async def test_an_unreachable_provider_is_retriable_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(30):
        server = FakeProvider()
        base = server.base_url
        server.close()  # nothing listens on that port now
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "gone", "name": "Gone", "baseUrl": base})
            state = probe.state(data)
            err = await _err(c.call("models.refresh", {"providerId": "gone"}))
            assert err.data_code == "PROVIDER_UNREACHABLE" and err.retriable
            assert probe.state(data) == state
            await c.call("providers.create", {"id": "nourl", "name": "No URL"})
            assert (await _err(c.call("models.refresh", {"providerId": "nourl"}))).data_code == "INVALID_PARAMS"


async def _close_at_once(stream: trio.SocketStream) -> None:
    """Read the request, answer nothing, hang up."""


async def test_a_reply_that_breaks_http_is_a_bad_reply(tmp_path: Path) -> None:
    """A provider that took the connection and answered bytes that are no HTTP reply (another protocol's
    banner, headers or a body cut short by its close, a chunked body without its last chunk, or a close before
    any reply: httpx cannot tell it from a banner with no end of headers) is reachable: its reply is bad,
    ``PROVIDER_BAD_REPLY`` (not retriable), as for a body that is no model list. They were
    ``PROVIDER_UNREACHABLE`` (retriable: a client tried again and got the same garbage). A refused connection
    stays ``PROVIDER_UNREACHABLE`` (test_an_unreachable_provider_is_retriable_and_writes_nothing). Nothing is
    written."""
    data = tmp_path / "data"
    listing = json.dumps({"data": MODELS}).encode()
    cut_chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                   + b"%x\r\n" % len(listing) + listing + b"\r\n")  # no last chunk, then the close
    scenarios: list[tuple[str, Script, str]] = [
        ("not http at all", send(b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256))), "PROVIDER_BAD_REPLY"),
        ("a body cut short", send(http(200, listing)[:-40]), "PROVIDER_BAD_REPLY"),
        ("headers cut short", send(http(200, listing)[:30]), "PROVIDER_BAD_REPLY"),
        ("a chunked body cut short", send(cut_chunked), "PROVIDER_BAD_REPLY"),
        ("a hang-up without a reply", _close_at_once, "PROVIDER_BAD_REPLY"),
    ]
    with trio.fail_after(60):
        async with Misbehaving().running() as server, inprocess_host(data) as host, \
                client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "odd", "name": "Odd", "baseUrl": server.url(), "apiKey": KEY})
            assert (await c.call("models.refresh", {"providerId": "odd"}))["listed"] == 3
            state = probe.state(data)
            for name, script, code in scenarios:
                server.script = script
                err = await _err(c.call("models.refresh", {"providerId": "odd"}))
                assert (err.data_code, err.retriable) == (code, code == "PROVIDER_UNREACHABLE"), (name, err.message)
                assert KEY not in err.message and KEY not in json.dumps(err.data), name
                assert probe.state(data) == state, f"{name}: a refused refresh wrote something"


async def test_refresh_goes_through_the_configured_proxy(tmp_path: Path) -> None:
    """networkProxy mode manual: the request goes to the proxy (here the fake, which sees the full URL)."""
    closed = FakeProvider()
    target = closed.base_url  # a loopback port nothing listens on any more
    closed.close()
    with trio.fail_after(30), FakeProvider(Reply(models=MODELS)) as proxy:
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            proxy_url = proxy.base_url.removesuffix("/v1")
            await c.call("settings.set", {"key": "networkProxy", "value": {"mode": "manual", "url": proxy_url}})
            await c.call("providers.create", {"id": "far", "name": "Far", "baseUrl": target})
            err = await _err(c.call("models.refresh", {"providerId": "far"}))
            assert proxy.requests and proxy.requests[0][0] == f"{target}/models"
            assert err.data_code == "PROVIDER_BAD_REPLY"  # the fake proxy answers 404 for a full URL
            await c.call("settings.set", {"key": "networkProxy", "value": {
                "mode": "manual", "url": proxy_url, "bypass": ["127.0.0.1"]}})
            assert (await _err(c.call("models.refresh", {"providerId": "far"}))).data_code == "PROVIDER_UNREACHABLE"
            assert len(proxy.requests) == 1


@pytest.mark.parametrize(("base", "config"), [
    ("http://127.0.0.1:9/a\x1db", None),  # found by scripts/chaos --mode fuzz: httpx.InvalidURL was INTERNAL
    ("http://[::1/v1", None),  # urlsplit's ValueError was INTERNAL in providers.create
    ("http://" + "a" * 300 + "/v1", None),  # an IDNA label over 63 characters: UnicodeError at connect
    ("ftp://127.0.0.1:9/v1", None),
    ("http:///v1", None),
    ("http://127.0.0.1:9/v1", {"headers": {"X-Note": "caf\u00e9"}}),  # not ASCII: UnicodeEncodeError
])
async def test_a_base_url_or_header_that_cannot_make_a_request_is_a_clear_error(
        tmp_path: Path, base: str, config: dict[str, Any] | None) -> None:
    """Issue 18 "no INTERNAL reachable from input", for the providers: a baseUrl or header that cannot make
    a request is refused by providers.create (INVALID_PARAMS, nothing stored) or, stored before the check
    existed, makes models.refresh answer INVALID_PARAMS or PROVIDER_UNREACHABLE and write nothing."""
    data = tmp_path / "data"
    params: dict[str, Any] = {"id": "odd", "name": "Odd", "baseUrl": base, **({"config": config} if config else {})}
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            try:
                await c.call("providers.create", params)
            except RpcError as exc:
                assert exc.data_code == "INVALID_PARAMS", exc.message
                assert _rows(data, "SELECT COUNT(*) FROM providers WHERE id = 'odd'") == [(0,)]
                await c.call("providers.create", {**params, "baseUrl": "http://127.0.0.1:9/v1"})
                stored_before = True
            else:
                stored_before = False
        if stored_before:  # as an older host would have stored it
            conn = sqlite3.connect(data / "pi.sqlite")
            with conn:
                conn.execute("UPDATE providers SET base_url = ? WHERE id = 'odd'", (base,))
            conn.close()
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            state = probe.state(data)
            err = await _err(c.call("models.refresh", {"providerId": "odd", "timeoutMs": 2000}))
            assert err.data_code in ("INVALID_PARAMS", "PROVIDER_UNREACHABLE"), (err.data_code, err.message)
            assert probe.state(data) == state


@pytest.mark.parametrize("api_key", ["sk-or-\u2026", "sk-caf\u00e9", "sk-\u00a0pasted"])
async def test_an_api_key_an_http_header_cannot_carry_is_named_as_the_key(tmp_path: Path, api_key: str) -> None:
    """The README's providers.create example key ends in '…' (a placeholder a newcomer pastes as it is): it is
    stored (keys are not checked), and models.refresh answered INVALID_PARAMS blaming the baseUrl or headers.
    It names the key now, without echoing it, and writes nothing."""
    data = tmp_path / "data"
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "odd", "name": "Odd", "baseUrl": "http://127.0.0.1:9/v1",
                                              "apiKey": api_key})
            state = probe.state(data)
            err = await _err(c.call("models.refresh", {"providerId": "odd", "timeoutMs": 2000}))
            assert err.data_code == "INVALID_PARAMS" and err.data["field"] == "apiKey", err.message
            assert "API key" in err.message and api_key not in err.message
            assert probe.state(data) == state


async def test_a_model_list_is_parsed_off_the_trio_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A provider's model list (up to 8 MiB of JSON) is parsed in a worker thread, never on the trio loop
    (every other request of the host waits while it runs there)."""
    seen: list[bool] = []
    parse = catalog.parse_model_list

    def parse_seen(body: bytes) -> Any:
        seen.append(on_trio_thread())
        return parse(body)

    monkeypatch.setattr(catalog, "parse_model_list", parse_seen)
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS)) as server:
        async with inprocess_host(tmp_path / "data") as host, client_for(host, kind="ui") as c:
            await _provider(c, server)
            await c.call("models.refresh", {"providerId": "local"})
            listed = (await c.call("models.list", {"providerId": "local"}))["models"]
            assert {m["modelId"] for m in listed} == {"gpt-a", "gpt-b", "mine"}
    assert seen == [False]


BAD_MODEL_IDS = [" ", "\u3000", "\u0000", "gpt\u0000", "a\nb", "m\u007f", "x" * 201]
ODD_MODEL_IDS = ["openai/gpt-4.1", "llama3:8b", "claude-3@20240229", "accounts/f/models/llama v3", "é" * 200]


async def test_one_model_id_rule_for_models_add_and_models_refresh(tmp_path: Path) -> None:
    """One model-id rule (store.rules.model_id_problem): a blank id, a control character or 201 characters is
    INVALID_PARAMS from models.add, with nothing written. models.refresh of a provider list naming one used to
    be PROVIDER_BAD_REPLY as a whole, so one odd entry hid every good model: now the entry is skipped, the
    others are kept, and the result's skippedModels says which and why (a retry with the same submissionId
    answers the same); a list with nothing but such entries is still PROVIDER_BAD_REPLY and writes nothing. The
    ids real catalogs use are taken by both. A database that already holds such an id (written before the
    rule) still lists it, and models.remove takes it away."""
    data = tmp_path / "data"
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS)) as server:
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            await _provider(c, server)
            state = probe.state(data)
            for bad in BAD_MODEL_IDS:
                err = await _err(c.call("models.add", {"providerId": "local", "modelId": bad}))
                assert err.data_code == "INVALID_PARAMS" and "modelId" in str(err.data), (bad, err, err.data)
                server.reply = Reply(models=[{"id": bad}, {"id": "x\u0000"}])
                err = await _err(c.call("models.refresh", {"providerId": "local"}))
                assert err.data_code == "PROVIDER_BAD_REPLY", (bad, err)
                assert probe.state(data) == state, f"a refused model id {bad!r} wrote something"
            for i, bad in enumerate(BAD_MODEL_IDS):
                server.reply = Reply(models=[*MODELS[:2], {"id": bad}, MODELS[2]])
                params = {"providerId": "local", "submissionId": f"r-{i}"}
                done = await c.call("models.refresh", params)
                m.ModelsRefreshResult.model_validate(done)
                assert done["listed"] == 3 and done["skippedModels"]["count"] == 1, (bad, done)
                [skipped] = done["skippedModels"]["entries"]
                assert (skipped["index"], skipped["modelId"]) == (2, bad[:200]) and "model id" in skipped["reason"]
                assert await c.call("models.refresh", params) == done  # the receipt's answer
                listed = (await c.call("models.list", {"providerId": "local"}))["models"]
                assert sorted(x["modelId"] for x in listed) == ["gpt-a", "gpt-b", "mine"], bad
            stamp = await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:local"})
            assert "skippedModels" not in stamp["value"]  # the answer says it; the stored stamp stays small
            server.reply = Reply(models=MODELS)
            assert "skippedModels" not in await c.call("models.refresh", {"providerId": "local"})
            for odd in ODD_MODEL_IDS:
                assert (await c.call("models.add", {"providerId": "local", "modelId": odd}))["model"]["modelId"] == odd
            server.reply = Reply(models=[{"id": odd} for odd in ODD_MODEL_IDS[:-1]] + [{"id": "new/one:x@y.z"}])
            assert (await c.call("models.refresh", {"providerId": "local"}))["added"] == 1
    with sqlite3.connect(data / "pi.sqlite") as db:  # an id written before the rule
        db.execute("INSERT INTO models(provider_id, model_id, display_name, updated_at) VALUES ('local', ' ', ' ', 1)")
    db.close()
    async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
        listed = (await c.call("models.list", {"providerId": "local"}))["models"]
        assert " " in [m["modelId"] for m in listed]
        assert (await c.call("models.remove", {"providerId": "local", "modelId": " "}))["deleted"] is True
