"""Seed 003 §4.1 (kv namespaces), §4.3 (providers), §4.4 (the model catalog), §4.12 (secrets_meta), §10 (secret
values never in SQLite, exports exclude secrets) and §11 items 8 and 9, audited from the spec's text and
protocol/README.md §8 alone, against real ``pi-host serve`` processes over WebSocket and real servers on
127.0.0.1 that the host asks for a model list.

Held elsewhere and not repeated here: the §4.3 defaults, a keyed create's retry and the key only in the secret
store (test_seed003_config_outsider.py, tests/providers/test_providers.py); a config or baseUrl carrying a
credential, a refresh refused with 401/403/500/not-JSON/a plain delay, the proxy, the model-id rule
(tests/providers/test_providers.py); every fault point of providers.create/update/delete killed and retried
(tests/integrity/test_crash_matrix.py, the long tail under ``PIHOST_SOAK=1``); secrets.set/delete killed at
each step (tests/secrets/test_crash_retry_answers.py); exports redacting stored values
(test_seed003_config_outsider.py); §11.8 beside look-alike plugin ids, an uninstall killed at each step
(test_seed003_config_outsider.py, tests/plugins/test_crash_retry_answers.py); §11.9 after a SIGKILL
(test_seed003_config_outsider.py, tests/projects/test_workspace.py).

What this module adds: a provider that answers garbage, slowly, or with huge or compressed bodies (each a
clear code, the old catalog and its stamp kept, the host's memory bounded, no redirect followed) or that answers
after its provider was deleted; provider create/update/delete and a plugin's sync SIGKILLed at several moments
in the default suite run (not only the soak) and retried to one effect; a deleted provider's id starting over
with no models, no refresh stamp and no key, whether the user deleted it or its plugin stopped declaring it;
every secret value written through every door (secrets.set, provider keys, a rotated and a deleted key, the
WebDAV password, a replay carrying another value, refused requests carrying one) grepped as raw bytes (and
base64, hex, UTF-16) in every file of the data directory, the WAL of a killed host included, in exports, the
config-sync bundle (and the host it is applied on), events, the audit log and doctor's output; who may read a
secret value and who may touch whose provider rows; a sweep of bad input that must change nothing; the
uninstall of a plugin's fullest namespace never seen half done; and a sidebar reset that changes nothing else.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.acceptance.outsiderkit import client, code_of, data_dir, real_host, say, shared_host
from tests.dbkit import rows
from tests.hostkit import HostProcess, call_killed_at, run_cli, start_host_process
from tests.httpkit import FakeProvider, Reply
from tests.pipeline import probe

MODELS = [{"id": "gpt-a", "object": "model"}, {"id": "gpt-b", "context_length": 128000}, {"id": "gpt-c"}]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each uses ids of its own)."""
    yield from shared_host(tmp_path_factory, "providers-audit")


def secret_files(root: Path) -> list[str]:
    """The secret store's value files (§4.12 "blob files are sha256-named"; not its key, traces or records)."""
    return sorted(p.name for p in (root / "secrets").iterdir()
                  if p.is_file() and re.fullmatch(r"[0-9a-f]{64}\.sec", p.name))


async def refused(c: HostClient, method: str, params: dict[str, Any]) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await c.call(method, params)
    return exc.value


# ------------------------------------------------------------------------------------------------------------
# A provider that misbehaves: a TCP server on 127.0.0.1 whose every answer is a script of raw bytes and pauses.

Script = Callable[[trio.SocketStream], Awaitable[None]]


def http(status: int, body: bytes, *headers: str) -> bytes:
    head = [f"HTTP/1.1 {status} Whatever", f"Content-Length: {len(body)}", "Content-Type: application/json",
            "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def send(raw: bytes) -> Script:
    async def script(stream: trio.SocketStream) -> None:
        await stream.send_all(raw)
    return script


def drip(head: bytes, byte: bytes = b" ") -> Script:
    """``head`` at once, then one byte every 50 ms for as long as the host listens (a slow-loris provider)."""
    async def script(stream: trio.SocketStream) -> None:
        await stream.send_all(head)
        for _ in range(2400):  # two minutes at most: the host gives up long before
            await trio.sleep(0.05)
            await stream.send_all(byte)
    return script


async def silent(stream: trio.SocketStream) -> None:
    """Read the request, answer nothing, until the host hangs up."""
    while await stream.receive_some(4096):
        pass


def chunked(body: bytes, *headers: str) -> Script:
    head = "\r\n".join(["HTTP/1.1 200 OK", "Transfer-Encoding: chunked", "Content-Type: application/json",
                        *headers]) + "\r\n\r\n"

    async def script(stream: trio.SocketStream) -> None:
        await stream.send_all(head.encode())
        for i in range(0, len(body), 1 << 16):
            part = body[i:i + (1 << 16)]
            await stream.send_all(b"%x\r\n" % len(part) + part + b"\r\n")
        await stream.send_all(b"0\r\n\r\n")
    return script


class Misbehaving:
    """Answers each request with ``script``; ``heads`` records every request head it read."""

    def __init__(self) -> None:
        self.script: Script = send(http(200, json.dumps({"data": MODELS}).encode()))
        self.heads: list[bytes] = []
        self.port = 0

    async def _serve(self, stream: trio.SocketStream) -> None:
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                got = await stream.receive_some(4096)
                if not got:
                    return
                head += got
            self.heads.append(head)
            await self.script(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the host hung up (its deadline, its size cap)
        finally:
            await stream.aclose()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Misbehaving]:
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._serve, 0, host="127.0.0.1"))
            self.port = listeners[0].socket.getsockname()[1]
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    def url(self, path: str = "v1") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"


def peak_rss_kib(proc: HostProcess) -> int:
    """The host process's resident-memory high-water mark (``VmHWM``)."""
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def zeros_gzip(mib: int) -> bytes:
    """A gzip member of ``mib`` MiB of zero bytes (about 1,000 times smaller)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1 << 20)
    return b"".join([*(packer.compress(block) for _ in range(mib)), packer.flush()])


BAD, LATE = "PROVIDER_BAD_REPLY", "PROVIDER_TIMEOUT"


async def test_a_refresh_against_garbage_slow_or_huge_replies_is_a_clear_error_and_keeps_the_old_catalog(
        tmp_path: Path) -> None:
    """README §8.4: "Only a readable 2xx model list is written ... Otherwise nothing is written and the error
    says why": PROVIDER_TIMEOUT "within timeoutMs" ("Bound on the whole HTTP exchange": a provider dripping
    its headers or body a byte at a time is cut at the deadline too), PROVIDER_BAD_REPLY for "another status,
    not JSON, no data list ... more than 5,000 models or 8 MiB". A body compressed to look small is the same 8
    MiB body: the host never holds more than about that, however well the provider's zeros compress (its
    resident peak stays well under the bomb's size), and bytes that do not decode are a bad reply, not an
    internal error. A redirect is another status: not followed, so the key goes nowhere else. After each
    refusal the catalog, its refresh stamp and every other row and file are as they were, and the key never
    shows in an error; a good list (gzip-encoded too) is taken afterwards. A provider deleted while its refresh
    waits for the list gets nothing written for it when the list comes (``NOT_FOUND``, no model, no stamp)."""
    root = data_dir(tmp_path)
    key = "sk-misbehave-5e1d9c"
    bomb = zeros_gzip(64)
    listing = json.dumps({"data": MODELS}).encode()
    deep = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    many = json.dumps({"data": [{"id": f"m{i}"} for i in range(5001)]}).encode()
    huge = b'{"data": [' + b" " * (9 << 20) + b"]}"
    with trio.fail_after(240):
        async with Misbehaving().running() as server, real_host(root) as (proc, c):
            await c.call("providers.create", {"id": "hp", "name": "Hostile", "baseUrl": server.url(),
                                              "apiKey": key})
            first = await c.call("models.refresh", {"providerId": "hp"})
            assert first["listed"] == 3
            catalog = await c.call("models.list", {"providerId": "hp"})
            stamp = await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:hp"})
            state = probe.state(root)
            steal = server.url("steal")
            scenarios: list[tuple[str, Script, tuple[str, ...], int]] = [
                ("gzip bomb", send(http(200, bomb, "Content-Encoding: gzip")), (BAD,), 20_000),
                ("gzip of a gzip bomb", send(http(200, gzip.compress(bomb), "Content-Encoding: gzip, gzip")),
                 (BAD,), 20_000),
                ("gzip that is not gzip", send(http(200, b"this is not gzip at all" * 20, "Content-Encoding: gzip")),
                 (BAD,), 20_000),
                ("deflate that is not deflate", send(http(200, b"\x00\x01garbage" * 50, "Content-Encoding: deflate")),
                 (BAD,), 20_000),
                ("gzip cut short", send(http(200, gzip.compress(listing)[:-12], "Content-Encoding: gzip")),
                 (BAD,), 20_000),
                ("an encoding nobody asked for", send(http(200, b"\x1b\x00garbage", "Content-Encoding: br")),
                 (BAD,), 20_000),
                ("html", send(http(200, b"<html><body>Welcome to nginx!</body></html>")), (BAD,), 20_000),
                ("binary", send(http(200, bytes(range(256)) * 64)), (BAD,), 20_000),
                ("bad utf-8", send(http(200, b'{"data": [{"id": "\xff\xfe\xfd"}]}')), (BAD,), 20_000),
                ("json nested 100,000 deep", send(http(200, deep)), (BAD,), 20_000),
                ("5,001 models", send(http(200, many)), (BAD,), 20_000),
                ("9 MiB with a length", send(http(200, huge)), (BAD,), 20_000),
                ("9 MiB chunked", chunked(huge), (BAD,), 20_000),
                ("a redirect", send(http(302, b"", f"Location: {steal}/models")), (BAD,), 20_000),
                ("not http at all", send(b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256))), (BAD,), 20_000),
                ("a body cut short", send(http(200, listing)[:-40]), (BAD,), 20_000),
                ("silence", silent, (LATE,), 500),
                ("headers a byte at a time", drip(b"HTTP/1.1 200 OK\r\n", b"X"), (LATE,), 500),
                ("a body a byte at a time", drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"), (LATE,),
                 500),
            ]
            for name, script, codes, timeout_ms in scenarios:
                server.script = script
                before = peak_rss_kib(proc)
                failed = await refused(c, "models.refresh", {"providerId": "hp", "timeoutMs": timeout_ms})
                grew_mib = (peak_rss_kib(proc) - before) / 1024
                assert failed.data_code in codes, (name, failed.data_code, failed.message)
                assert failed.message and key not in failed.message and key not in json.dumps(failed.data)
                assert grew_mib < 40, f"{name}: the host's resident peak grew by {grew_mib:.0f} MiB"
                assert await c.call("models.list", {"providerId": "hp"}) == catalog, name
                assert await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:hp"}) == stamp, name
                assert probe.state(root) == state, f"{name}: a refused refresh wrote something"
            assert not [h for h in server.heads if b"/steal" in h], "the host followed a redirect"
            assert {h.split(b" ")[1] for h in server.heads} == {b"/v1/models"}
            assert all(f"authorization: bearer {key}".encode() in h.lower() for h in server.heads)
            server.script = send(http(200, gzip.compress(json.dumps({"data": [*MODELS, {"id": "gpt-d"}]}).encode()),
                                      "Content-Encoding: gzip"))
            assert (await c.call("models.refresh", {"providerId": "hp"}))["listed"] == 4
            server.script = send(http(200, zlib.compress(listing), "Content-Encoding: deflate"))
            assert (await c.call("models.refresh", {"providerId": "hp"}))["deprecated"] == ["gpt-d"]

            # deleted while its refresh waits for the provider: the late list lands nowhere
            arrived, release = trio.Event(), trio.Event()

            async def late(stream: trio.SocketStream) -> None:
                arrived.set()
                await release.wait()
                await stream.send_all(http(200, listing))

            server.script = late
            outcome: list[str | None] = []

            async def refresh() -> None:
                outcome.append(await code_of(c, "models.refresh", {"providerId": "hp"}))

            async with trio.open_nursery() as nursery, client(proc, "deleter", "ui") as other:
                nursery.start_soon(refresh)
                await arrived.wait()
                await other.call("providers.delete", {"providerId": "hp"})
                release.set()
            assert outcome == ["NOT_FOUND"]
            assert rows(root, "SELECT COUNT(*) FROM models WHERE provider_id = 'hp'") == [(0,)]
            assert "value" not in await c.call("settings.get", {"ns": "cache", "key": "modelRefresh:hp"})


# ------------------------------------------------------------------------------------------------------------
# Who may do what (README §1 clientKind, §8.3, §8.5; secrets.get "clientKind agent or ui only")

async def test_only_the_ui_and_the_agent_read_a_secret_value_and_a_plugin_touches_no_secret(
        shared: HostProcess) -> None:
    """README ``secrets.get``: "Decrypt one secret (clientKind agent or ui only)"; ``sidecar`` "is the same as
    agent"; §8.5 a plugin "may call only settings.* on its own plugin:<id> namespace, providers.list / get /
    sync and models.list for its own rows" and "anything else ... is PERMISSION_DENIED"; §3 such a message
    starts with ``PERMISSION_DENIED: ``. No ``providers.*`` result carries the key, whoever asks. A refusal
    changes nothing (every row and file as it was) and never echoes the value."""
    value = "sk-roles-" + "4b7e" * 8
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, "roles-ui", "ui") as ui:
            await ui.call("providers.create", {"id": "roles", "name": "Roles", "apiKey": value})
            await ui.call("secrets.set", {"ref": "mcp/roles", "value": value, "ownerKind": "mcp"})
            await ui.call("secrets.set", {"ref": "plain/roles", "value": value})
            plain = [m for m in (await ui.call("secrets.list", {}))["secrets"] if m["ref"] == "plain/roles"]
            # §4.12: owner_kind DEFAULT 'provider', kind DEFAULT 'api_key', backend file_fallback
            assert [(m["ownerKind"], m["kind"], m["backend"], m.get("ownerId")) for m in plain] == [
                ("provider", "api_key", "file_fallback", None)]
            for kind in ("ui", "agent", "sidecar"):
                async with client(shared, f"roles-{kind}", kind) as c:
                    for ref in ("provider/roles", "mcp/roles"):
                        assert (await c.call("secrets.get", {"ref": ref}))["value"] == value, (kind, ref)
                    assert value not in json.dumps(await c.call("providers.get", {"providerId": "roles"}))
                    assert value not in json.dumps(await c.call("providers.list", {}))
            state = probe.state(root)
            for kind in ("cli", "test"):
                async with client(shared, f"roles-{kind}", kind) as c:
                    denied = await refused(c, "secrets.get", {"ref": "provider/roles"})
                    assert denied.data_code == "PERMISSION_DENIED", kind
                    assert denied.message.startswith("PERMISSION_DENIED: ") and value not in denied.message
                    listed = (await c.call("secrets.list", {"ownerKind": "mcp"}))["secrets"]  # bookkeeping only
                    assert [m["ref"] for m in listed] == ["mcp/roles"] and value not in json.dumps(listed)
            async with client(shared, "roles-plugin", "plugin", "roles.plugin") as plugin:
                for method, params in (
                        ("secrets.get", {"ref": "provider/roles"}), ("secrets.list", {}),
                        ("secrets.set", {"ref": "provider/roles", "value": "overwritten"}),
                        ("secrets.delete", {"ref": "mcp/roles"}),
                        ("providers.get", {"providerId": "roles"}),
                        ("providers.create", {"id": "mine", "name": "Mine", "apiKey": "x"}),
                        ("providers.update", {"providerId": "roles", "apiKey": "stolen"}),
                        ("providers.delete", {"providerId": "roles"}),
                        ("providers.reorder", {"providerIds": ["roles"]}),
                        ("models.add", {"providerId": "roles", "modelId": "m"}),
                        ("models.refresh", {"providerId": "roles"}),
                        ("models.list", {"providerId": "roles"}),
                        ("settings.get", {"ns": "app", "key": "settings"}),
                        ("configSync.get", {}),
                        ("events.subscribe", {"topics": ["providers.changed"]})):
                    denied = await refused(plugin, method, params)
                    assert denied.data_code == "PERMISSION_DENIED", (method, denied.data_code)
                    assert denied.message.startswith("PERMISSION_DENIED: "), method
                    assert value not in denied.message and value not in json.dumps(denied.data), method
                assert (await plugin.call("providers.list", {}))["providers"] == []
                assert [m for m in (await plugin.call("models.list", {}))["models"]] == []
            assert probe.state(root) == state, "a refused call changed something"
            assert (await ui.call("secrets.get", {"ref": "mcp/roles"}))["value"] == value


async def test_a_plugins_rows_and_the_users_rows_each_answer_only_to_their_owner(shared: HostProcess) -> None:
    """§4.3 owner_plugin_id: "the plugin refreshes its own fields on every load, while the user path may edit
    or delete only the rows it owns"; README §8.3 "the user path may not edit or delete them
    (PERMISSION_DENIED); a plugin may not touch a user row or another plugin's"; §8.5 uninstall "releases the
    plugin's provider rows to the user" (then the user may edit and delete them). A row the plugin stops
    declaring is "deleted" (README ``providers.sync``) as a user's is: its models and the key the user stored
    for it go too, so a provider made later under its id does not inherit that key."""
    with trio.fail_after(60):
        async with client(shared, "own-ui", "ui") as ui, client(shared, "own-a", "plugin", "own.a") as a, \
                client(shared, "own-b", "plugin", "own.b") as b:
            await ui.call("providers.create", {"id": "own-user", "name": "User's"})
            await ui.call("plugins.register", {"pluginId": "own.a", "name": "A", "version": "1"})
            synced = await a.call("providers.sync", {"providers": [{"id": "own-a-gw", "name": "A gateway",
                                                                    "baseUrl": "http://127.0.0.1:9/v1"}]})
            assert [(p["id"], p["ownerPluginId"], p["hasApiKey"]) for p in synced["providers"]] == [
                ("own-a-gw", "own.a", False)]
            await ui.call("models.add", {"providerId": "own-a-gw", "modelId": "a-model"})
            await ui.call("models.add", {"providerId": "own-user", "modelId": "u-model"})
            state = probe.state(shared.data_dir)
            for method, params in (("providers.update", {"providerId": "own-a-gw", "name": "mine now"}),
                                   ("providers.update", {"providerId": "own-a-gw", "apiKey": "sk-planted"}),
                                   ("providers.delete", {"providerId": "own-a-gw"})):
                assert await code_of(ui, method, params) == "PERMISSION_DENIED", method
            for method, params in (("providers.get", {"providerId": "own-user"}),
                                   ("providers.get", {"providerId": "own-a-gw"}),
                                   ("models.list", {"providerId": "own-a-gw"}),
                                   ("providers.sync", {"providers": [{"id": "own-a-gw", "name": "taken"}]}),
                                   ("providers.sync", {"providers": [{"id": "own-user", "name": "taken"}]})):
                assert await code_of(b, method, params) == "PERMISSION_DENIED", method
            assert await code_of(a, "providers.get", {"providerId": "own-user"}) == "PERMISSION_DENIED"
            assert await code_of(a, "providers.sync", {"providers": [
                {"id": "own-user", "name": "taken"}]}) == "PERMISSION_DENIED"
            assert probe.state(shared.data_dir) == state
            assert [p["id"] for p in (await a.call("providers.list", {}))["providers"]] == ["own-a-gw"]
            assert [m["modelId"] for m in (await a.call("models.list", {}))["models"]] == ["a-model"]
            assert (await b.call("providers.list", {}))["providers"] == []
            # the user gives a plugin's second gateway a key (its row's secretRef follows the store); the plugin
            # then stops declaring it: the row goes with its models and its key, as a deleted provider's do
            await a.call("providers.sync", {"providers": [{"id": "own-a-gw", "name": "A gateway",
                                                           "baseUrl": "http://127.0.0.1:9/v1"},
                                                          {"id": "own-a-gw2", "name": "A second gateway"}]})
            await ui.call("secrets.set", {"ref": "provider/own-a-gw2", "value": "sk-for-a-gateway-73a1",
                                          "ownerKind": "provider", "ownerId": "own-a-gw2"})
            await ui.call("models.add", {"providerId": "own-a-gw2", "modelId": "gw2-model"})
            assert (await a.call("providers.get", {"providerId": "own-a-gw2"}))["provider"]["hasApiKey"] is True
            files = secret_files(shared.data_dir)
            dropped = await a.call("providers.sync", {"providers": [{"id": "own-a-gw", "name": "A gateway",
                                                                     "baseUrl": "http://127.0.0.1:9/v1"}]})
            assert dropped["removed"] == ["own-a-gw2"]
            assert await code_of(ui, "secrets.get", {"ref": "provider/own-a-gw2"}) == "NOT_FOUND"
            assert [m for m in (await ui.call("secrets.list", {}))["secrets"] if m["ref"] == "provider/own-a-gw2"] == []
            assert len(secret_files(shared.data_dir)) == len(files) - 1
            assert [m for m in (await ui.call("models.list", {}))["models"] if m["providerId"] == "own-a-gw2"] == []
            mine = (await ui.call("providers.create", {"id": "own-a-gw2", "name": "Mine now"}))["provider"]
            assert mine["hasApiKey"] is False, "a new provider under the id got the plugin row's old key"
            await ui.call("providers.delete", {"providerId": "own-a-gw2"})
            out = await ui.call("plugins.uninstall", {"pluginId": "own.a"})
            assert out["providersReleased"] == ["own-a-gw"]
            released = (await ui.call("providers.get", {"providerId": "own-a-gw"}))["provider"]
            assert released.get("ownerPluginId") is None
            assert await code_of(a, "providers.get", {"providerId": "own-a-gw"}) == "PERMISSION_DENIED"
            renamed = await ui.call("providers.update", {"providerId": "own-a-gw", "name": "the user's now"})
            assert renamed["provider"]["name"] == "the user's now"
            assert (await ui.call("providers.delete", {"providerId": "own-a-gw"}))["deleted"] is True


# ------------------------------------------------------------------------------------------------------------
# Bad input: a clear code, nothing changed

BAD_INPUT: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("providers.create", {"id": "no-name"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "a b", "name": "X"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "x" * 201, "name": "X"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "blank", "name": " \t "}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "nul", "name": "a\u0000b"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "file", "name": "X", "baseUrl": "file:///etc/passwd"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "js", "name": "X", "baseUrl": "javascript:alert(1)"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "creds", "name": "X", "baseUrl": "https://ada:hunter2@llm.example/v1"},
     ("INVALID_PARAMS",)),
    ("providers.create", {"id": "hdr", "name": "X", "config": {"headers": {"Authorization": "Bearer sk-x"}}},
     ("INVALID_PARAMS",)),
    ("providers.create", {"id": "big", "name": "X", "config": {"note": "n" * 70_000}},
     ("INVALID_PARAMS", "PAYLOAD_TOO_LARGE")),
    ("providers.create", {"id": "cfg", "name": "X", "config": ["not", "an", "object"]}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "lf", "name": "X", "apiKey": "sk-line\nbreak"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "empty", "name": "X", "apiKey": ""}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "long", "name": "X", "apiKey": "k" * 65_537}, ("INVALID_PARAMS", "PAYLOAD_TOO_LARGE")),
    ("providers.create", {"id": "typed", "name": "X", "enabled": "true"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "extra", "name": "X", "secret": "sk-x"}, ("INVALID_PARAMS",)),
    ("providers.create", {"id": "bad-keep", "name": "Again"}, ("CONFLICT",)),
    ("providers.update", {"providerId": "nobody", "name": "X"}, ("NOT_FOUND",)),
    ("providers.update", {"providerId": "bad-keep", "name": None}, ("INVALID_PARAMS",)),
    ("providers.update", {"providerId": "bad-keep", "config": None}, ("INVALID_PARAMS",)),
    ("providers.update", {"providerId": "bad-keep", "apiKey": "tab\there"}, ("INVALID_PARAMS",)),
    ("providers.update", {"providerId": "bad-keep", "baseUrl": "https://llm.example/v1?api_key=abc123"},
     ("INVALID_PARAMS",)),
    ("providers.delete", {"providerId": "nobody"}, ("NOT_FOUND",)),
    ("providers.delete", {"providerId": "../bad-keep"}, ("NOT_FOUND",)),
    ("providers.reorder", {"providerIds": ["bad-keep", "bad-keep"]}, ("INVALID_PARAMS",)),
    ("models.add", {"providerId": "nobody", "modelId": "m"}, ("NOT_FOUND",)),
    ("models.add", {"providerId": "bad-keep", "modelId": " "}, ("INVALID_PARAMS",)),
    ("models.add", {"providerId": "bad-keep", "modelId": "m", "contextWindow": 0}, ("INVALID_PARAMS",)),
    ("models.add", {"providerId": "bad-keep", "modelId": "m", "capabilities": [1]}, ("INVALID_PARAMS",)),
    ("models.add", {"providerId": "bad-keep", "modelId": "m", "capabilities": ["c"] * 65}, ("INVALID_PARAMS",)),
    ("models.remove", {"providerId": "bad-keep", "modelId": "discovered-one"}, ("INVALID_PARAMS",)),
    ("models.refresh", {"providerId": "bad-keep", "timeoutMs": 99}, ("INVALID_PARAMS",)),
    ("models.refresh", {"providerId": "bad-keep", "timeoutMs": 120_001}, ("INVALID_PARAMS",)),
    ("models.refresh", {"providerId": "nobody"}, ("NOT_FOUND",)),
    ("models.refresh", {"providerId": "bad-no-url"}, ("INVALID_PARAMS",)),
    ("secrets.set", {"ref": "", "value": "v"}, ("INVALID_PARAMS",)),
    ("secrets.set", {"ref": "a\nb", "value": "v"}, ("INVALID_PARAMS",)),
    ("secrets.set", {"ref": "\u00e9" * 257, "value": "v"}, ("INVALID_PARAMS",)),
    ("secrets.set", {"ref": "big", "value": "v" * 65_537}, ("INVALID_PARAMS", "PAYLOAD_TOO_LARGE")),
    ("secrets.set", {"ref": "configSync/vaultKey", "value": "not a vault key"}, ("INVALID_PARAMS",)),
    ("secrets.get", {"ref": "never/set"}, ("NOT_FOUND",)),
    ("settings.set", {"ns": "cache", "key": "modelRefresh:bad-keep", "value": {"listed": 1}}, ("INVALID_PARAMS",)),
    ("settings.delete", {"ns": "cache", "key": "modelRefresh:bad-keep"}, ("INVALID_PARAMS",)),
    ("settings.update", {"ns": "cache", "values": {"modelRefresh:bad-keep": None}}, ("INVALID_PARAMS",)),
    ("settings.update", {"ns": "cache", "values": {"modelRefresh:other": {"listed": 9}}}, ("INVALID_PARAMS",)),
    ("settings.delete", {"ns": "app", "key": "providers.order"}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "cache", "key": "recentModels",
                      "value": [{"providerId": "p", "modelId": f"m{i}"} for i in range(21)]}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "cache", "key": "recentModels",
                      "value": [{"providerId": "p", "modelId": "m"}] * 2}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "cache", "key": "recentModels", "value": "p/m"}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "app", "key": "providers.order", "value": ["bad-keep"]}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "app", "key": "currentProjectId", "value": 1}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "plugin:", "key": "k", "value": 1}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "plugin:../x", "key": "k", "value": 1}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "configSync", "key": "settings", "value": {}}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "ui", "key": "", "value": 1}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "ui", "key": "k" * 513, "value": 1}, ("INVALID_PARAMS",)),
    ("settings.set", {"ns": "ui", "key": "panel", "value": "v" * 70_000}, ("PAYLOAD_TOO_LARGE",)),
    ("settings.set", {"ns": "app", "key": "networkProxy",
                      "value": {"mode": "manual", "url": "http://ada:hunter2@proxy.example:8080"}},
     ("INVALID_PARAMS",)),
    ("settings.update", {"ns": "ui", "values": {"ok": 1, "": 2}}, ("INVALID_PARAMS",)),
    ("plugins.uninstall", {"pluginId": "../x"}, ("INVALID_PARAMS",)),
]


async def test_bad_input_is_refused_with_a_clear_code_and_changes_nothing(shared: HostProcess) -> None:
    """README §8: "Everything below is durable before the reply, and every refusal changes nothing"; §2
    "Params are strict. An unknown key fails ... Types are never coerced"; the limits of §7/§8.1/§8.3/§8.4
    (a name not blank and without control characters, a config object ≤ 64 KiB without credentials, an
    http(s) baseUrl without credentials, an API key without control characters, ids by their pattern,
    refresh stamps "that only models.refresh writes", ``recentModels`` "at most 20 distinct",
    ``providers.order`` written "only by providers.reorder", host-owned namespaces). Each call gets its
    code, a message, and changes no row and no file; the values sent never come back in the error."""
    root = shared.data_dir
    with trio.fail_after(90), FakeProvider(Reply(models=[{"id": "discovered-one"}])) as server:
        async with client(shared, "bad-ui", "ui") as ui:
            await ui.call("providers.create", {"id": "bad-keep", "name": "Keep", "baseUrl": server.base_url,
                                               "apiKey": "sk-bad-keep-0001"})
            await ui.call("providers.create", {"id": "bad-no-url", "name": "No URL"})
            await ui.call("models.refresh", {"providerId": "bad-keep"})
            await ui.call("providers.reorder", {"providerIds": ["bad-no-url", "bad-keep"]})
            state = probe.state(root)
            for method, params, codes in BAD_INPUT:
                failed = await refused(ui, method, params)
                assert failed.data_code in codes, (method, params if len(str(params)) < 300 else "...",
                                                   failed.data_code, failed.message)
                assert failed.message, method
                for sent in ("sk-line\nbreak", "tab\there", "hunter2", "sk-x", "abc123"):
                    if sent in json.dumps(params):
                        assert sent not in failed.message and sent not in json.dumps(failed.data), (method, sent)
            assert probe.state(root) == state, "a refused call changed something"
            keep = (await ui.call("providers.get", {"providerId": "bad-keep"}))["provider"]
            assert (keep["name"], keep["hasApiKey"]) == ("Keep", True)
            assert (await ui.call("secrets.get", {"ref": "provider/bad-keep"}))["value"] == "sk-bad-keep-0001"


# ------------------------------------------------------------------------------------------------------------
# A deleted provider takes its models and its key with it

async def test_a_deleted_provider_takes_its_models_and_key_and_its_id_starts_over_empty(shared: HostProcess) -> None:
    """§4.4 models "REFERENCES providers(id) ON DELETE CASCADE"; README ``providers.delete``: "Delete a user
    provider, its models and its stored key"; §4.12 secrets_meta is the registry of which secrets exist. After
    the delete nothing of it lists, its value file is gone from secrets/, and a new provider under the same id
    starts with no model, no refresh stamp (§4.1 cache "model-refresh stamps": its catalog's, gone with the
    catalog), no key and no stale credential sent to the provider (it is refused as a stranger)."""
    key = "sk-doomed-" + "93ae" * 6
    root = shared.data_dir
    with trio.fail_after(60), FakeProvider(Reply(models=MODELS, api_key=key)) as server:
        async with client(shared, "doom-ui", "ui") as ui:
            files = secret_files(root)
            await ui.call("providers.create", {"id": "doomed", "name": "Doomed", "baseUrl": server.base_url,
                                               "apiKey": key})
            assert len(secret_files(root)) == len(files) + 1
            await ui.call("models.refresh", {"providerId": "doomed"})
            await ui.call("models.add", {"providerId": "doomed", "modelId": "mine", "displayName": "Mine"})
            assert len((await ui.call("models.list", {"providerId": "doomed"}))["models"]) == 4
            assert await ui.call("providers.delete", {"providerId": "doomed"}) == {"providerId": "doomed",
                                                                                   "deleted": True}
            assert await code_of(ui, "providers.get", {"providerId": "doomed"}) == "NOT_FOUND"
            assert await code_of(ui, "models.list", {"providerId": "doomed"}) in ("NOT_FOUND", None)
            assert [m for m in (await ui.call("models.list", {}))["models"] if m["providerId"] == "doomed"] == []
            assert await code_of(ui, "secrets.get", {"ref": "provider/doomed"}) == "NOT_FOUND"
            assert [m for m in (await ui.call("secrets.list", {}))["secrets"] if m["ref"] == "provider/doomed"] == []
            assert secret_files(root) == files
            assert rows(root, "SELECT COUNT(*) FROM models WHERE provider_id = 'doomed'") == [(0,)]
            # its catalog's refresh stamp (kv(cache, modelRefresh:<id>)) goes with the catalog: a new provider
            # under the id must not read as refreshed, with 3 models listed, before its first refresh
            assert "value" not in await ui.call("settings.get", {"ns": "cache", "key": "modelRefresh:doomed"})
            again = (await ui.call("providers.create", {"id": "doomed", "name": "Reborn",
                                                        "baseUrl": server.base_url}))["provider"]
            assert again["hasApiKey"] is False and again.get("secretRef") is None
            assert (await ui.call("models.list", {"providerId": "doomed"}))["models"] == []
            assert await code_of(ui, "models.refresh", {"providerId": "doomed"}) == "PROVIDER_UNAUTHORIZED"
            assert server.requests[-1] == ("/v1/models", None)
            assert await code_of(ui, "secrets.get", {"ref": "provider/doomed"}) == "NOT_FOUND"


# ------------------------------------------------------------------------------------------------------------
# §11 item 8 (plugin uninstall clears kv(plugin:<id>) in one statement) and item 9 (sidebar reset)

async def test_an_uninstall_of_a_full_plugin_namespace_is_never_seen_half_done(shared: HostProcess) -> None:
    """§11.8 "Plugin uninstall clears kv(plugin:<id>) in one statement" (§4.1 "uninstall = DELETE WHERE ns =
    ?"): a reader polling the namespace while the uninstall runs sees all of its keys or none, never part; the
    namespace at its cap of 256 keys goes whole; the plugin's other state (another plugin's namespace, the
    app settings) stays; the answer names every key it removed."""
    keys = {f"k{i:03}": {"i": i, "pad": "p" * 200} for i in range(256)}
    with trio.fail_after(90):
        async with client(shared, "full-ui", "ui") as ui, client(shared, "full-reader", "ui") as reader:
            await ui.call("plugins.register", {"pluginId": "full.ns", "name": "Full", "version": "1"})
            async with client(shared, "full-rt", "plugin", "full.ns") as plugin:
                for i in range(0, 256, 64):
                    await plugin.call("settings.update", {"ns": "plugin:full.ns",
                                                          "values": dict(list(keys.items())[i:i + 64])})
                over = await refused(plugin, "settings.set", {"ns": "plugin:full.ns", "key": "one-more", "value": 1})
                assert over.data_code in ("LIMIT_EXCEEDED", "INVALID_PARAMS")
            await ui.call("settings.set", {"ns": "plugin:full.ns2", "key": "stays", "value": 1})
            seen: list[int] = []
            done = trio.Event()

            async def poll() -> None:
                while not done.is_set():
                    got = await reader.call("settings.getAll", {"ns": "plugin:full.ns"})
                    seen.append(len(got.get("values") or {}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                await trio.sleep(0.05)
                out = await ui.call("plugins.uninstall", {"pluginId": "full.ns"})
                await trio.sleep(0.05)
                done.set()
            assert sorted(out["settingsRemoved"]) == sorted(keys)
            assert set(seen) <= {0, 256} and seen[-1] == 0, sorted(set(seen))
            assert rows(shared.data_dir, "SELECT COUNT(*) FROM kv WHERE ns = 'plugin:full.ns'") == [(0,)]
            assert (await ui.call("settings.get", {"ns": "plugin:full.ns2", "key": "stays"}))["value"] == 1


def _all_but_ui(state: dict[str, Any]) -> dict[str, Any]:
    """A :func:`tests.pipeline.probe.state` without the kv rows of the ``ui`` namespace."""
    db = dict(state["db"])
    db["kv"] = [r for r in db["kv"] if not r.startswith("('ui',")]
    return {"db": db, "files": state["files"]}


async def test_a_sidebar_reset_changes_nothing_but_the_preferences_and_a_renderer_restart_keeps_them(
        shared: HostProcess) -> None:
    """§11.9 "Resetting sidebar preferences changes no projects, sessions, or transcript data; retained paths and
    organization choices survive a normal renderer restart when preferences are available"; §4.1 the record
    "never contains transcript content, tool arguments, provider configuration, or secrets. Clearing it changes
    presentation only", and the selected workspace is kv(app, currentProjectId), "restored through
    workspace.get". A reset clears every key the renderer kept in kv(ui); then every other row of every table
    and every file of the data directory is byte for byte as before, and a renderer that reconnects (its
    restart) finds its preferences and the workspace as it left them."""
    root = shared.data_dir
    with trio.fail_after(60):
        async with client(shared, "side-ui", "ui") as ui:
            a = (await ui.call("workspace.open", {"path": "/side/a"}))["project"]
            await ui.call("projects.pin", {"projectId": a["id"], "pinned": True})
            s1 = (await ui.call("session.create", {"projectPath": "/side/a", "title": "one"}))["id"]
            await say(ui, s1, "u1", "keep me")
            await ui.call("workspace.open", {"path": "/side/b"})
            prefs = {"sessionMeta": {s1: {"pinned": True, "order": 2}}, "projectMeta": {"/side/a": {"collapsed": True}},
                     "projectSort": "manual", "sessionView": {"sort": "name", "archived": True},
                     "openProjectPaths": ["/side/a", "/side/b"]}
            await ui.call("settings.update", {"ns": "ui", "values": {"sidebarPreferences": prefs, "width": 280}})
            workspace = await ui.call("workspace.get", {})
        async with client(shared, "side-ui", "ui") as ui:  # a renderer restart with its preferences available
            assert (await ui.call("settings.get", {"ns": "ui", "key": "sidebarPreferences"}))["value"] == prefs
            assert await ui.call("workspace.get", {}) == workspace
            before = _all_but_ui(probe.state(root))
            session = await ui.call("session.get", {"sessionId": s1, "full": True})
            kept = (await ui.call("settings.getAll", {"ns": "ui"}))["values"]
            for k in kept:
                await ui.call("settings.delete", {"ns": "ui", "key": k})
            assert (await ui.call("settings.getAll", {"ns": "ui"})).get("values") in ({}, None)
            assert _all_but_ui(probe.state(root)) == before, "a sidebar reset changed host data"
        async with client(shared, "side-ui", "ui") as ui:
            assert await ui.call("workspace.get", {}) == workspace
            assert await ui.call("session.get", {"sessionId": s1, "full": True}) == session
            pinned = {p["id"]: p["pinned"] for p in (await ui.call("projects.list", {}))["projects"]}
            assert pinned[a["id"]] is True


# ------------------------------------------------------------------------------------------------------------
# §10: secret values never in SQLite, logs, exports, or any file of the data directory in plain text

def spellings(value: str) -> dict[str, bytes]:
    """The ways a value could sit in a file unencrypted."""
    raw = value.encode()
    return {"utf-8": raw, "utf-16": value.encode("utf-16-le"), "base64": base64.b64encode(raw).rstrip(b"="),
            "base64url": base64.urlsafe_b64encode(raw).rstrip(b"="), "hex": raw.hex().encode(),
            "HEX": raw.hex().upper().encode()}


def plain_copies(root: Path, values: dict[str, str]) -> list[str]:
    """Every (file, value, spelling) of the data directory holding one of ``values`` unencrypted."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for name, value in values.items():
            for how, needle in spellings(value).items():
                if needle in data:
                    found.append(f"{path.relative_to(root)}: {name} ({how})")
    return found


def free_of(blob: Any, values: dict[str, str], where: str) -> None:
    text = blob if isinstance(blob, str | bytes) else json.dumps(blob)
    data = text.encode() if isinstance(text, str) else text
    for name, value in values.items():
        for how, needle in spellings(value).items():
            assert needle not in data, f"{where} holds {name} ({how})"


async def test_no_secret_value_is_ever_in_plain_text_in_the_data_directory_logs_exports_or_events(
        tmp_path: Path) -> None:
    """§10.3 "Secret values never in SQLite; only secrets_meta bookkeeping", §10.4 "Exported sessions exclude
    secrets by default", §4.12 "Secret values never enter the DB ... AES-256-GCM ciphertexts under secrets/"
    and "blob files are sha256-named and otherwise unenumerable"; README §4 "receipts hold a keyed MAC of it".
    Every door a value comes in by: ``secrets.set`` (and a replay of its key carrying another value, and a
    conflicting reuse of the key), a provider's key at create, its rotation, a provider created and deleted
    with its key, the WebDAV password; a turn naming the key by reference and one refused for carrying it.
    Afterwards no file of the data directory (pi.sqlite, its -wal and -shm of a host killed with SIGKILL, logs,
    receipts, config-sync, every other) holds any of them as UTF-8, UTF-16, base64 or hex, nor does a session
    export, the config-sync bundle, the audit log, host.status, an event a subscriber heard, an error, or
    ``pi-host doctor``'s report; and again after a clean restart folded the WAL in. The values are still there
    for the one who may read them."""
    values = {"provider key": "sk-plain-" + "c0ffee12" * 4, "rotated key": "rot-" + "9d8c7b6a" * 4,
              "mcp token": "mcp-" + "a1b2c3d4" * 4, "replayed value": "replay-" + "5e6f7a8b" * 4,
              "conflicting value": "conflict-" + "0badf00d" * 4, "webdav password": "dav-" + "feedbeef" * 4,
              "deleted key": "gone-" + "deadc0de" * 4, "refused key": "refused-" + "77665544" * 4,
              "proxy password": "proxypw-" + "31415926" * 4, "url password": "urlpw-" + "27182818" * 4,
              "header key": "hdrkey-" + "16180339" * 4}
    vault_key = base64.b64encode(bytes(range(32))).decode()
    root = data_dir(tmp_path)
    with trio.fail_after(120), FakeProvider(Reply(models=MODELS, api_key=values["provider key"])) as server:
        async with real_host(root) as (proc, ui), client(proc, "watcher", "ui") as watch, \
                client(proc, "agent-1", "agent") as agent:
            await watch.subscribe(["providers.changed", "models.changed", "settings.changed"])
            made = {"id": "p1", "name": "One", "baseUrl": server.base_url, "apiKey": values["provider key"],
                    "submissionId": "c-1"}
            answers = [await ui.call("providers.create", made), await ui.call("providers.create", made)]
            answers.append(await ui.call("models.refresh", {"providerId": "p1"}))
            rotate = {"providerId": "p1", "apiKey": values["rotated key"], "submissionId": "u-1"}
            answers += [await ui.call("providers.update", rotate), await ui.call("providers.update", rotate)]
            mcp = {"ref": "mcp/tool", "value": values["mcp token"], "ownerKind": "mcp", "submissionId": "s-1"}
            answers.append(await ui.call("secrets.set", mcp))
            answers.append(await ui.call("secrets.set", {**mcp, "value": values["replayed value"]}))
            conflict = await refused(ui, "secrets.set", {**mcp, "ref": "mcp/other",
                                                         "value": values["conflicting value"]})
            assert conflict.data_code == "IDEMPOTENCY_CONFLICT"
            free_of([conflict.message, conflict.data], values, "the conflict's error")
            answers.append(await ui.call("configSync.configure", {
                "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada", "vaultKey": vault_key,
                "webdavPassword": values["webdav password"], "submissionId": "cs-1"}))
            for method, params in (  # refused, and the value they carried is not kept anywhere either
                    ("providers.create", {"id": "p3", "name": "Three", "apiKey": values["refused key"] + "\n"}),
                    ("providers.update", {"providerId": "p1", "apiKey": values["refused key"] * 2000}),
                    ("providers.create", {"id": "p3", "name": "Three",
                                          "baseUrl": f"https://ada:{values['url password']}@llm.example/v1"}),
                    ("providers.create", {"id": "p3", "name": "Three",
                                          "config": {"headers": {"X-Api-Key": values["header key"]}}}),
                    ("settings.set", {"key": "networkProxy", "value": {
                        "mode": "manual", "url": f"http://ada:{values['proxy password']}@proxy.example:8080"}})):
                failed = await refused(ui, method, params)
                assert failed.data_code in ("INVALID_PARAMS", "PAYLOAD_TOO_LARGE"), (method, failed.data_code)
                free_of([failed.message, failed.data], values, f"{method}'s refusal")
            await ui.call("providers.create", {"id": "p2", "name": "Two", "apiKey": values["deleted key"]})
            answers.append(await ui.call("providers.delete", {"providerId": "p2", "submissionId": "d-1"}))
            sid = (await ui.call("session.create", {"title": "run"}))["id"]
            env = {"version": 1, "connection": {"baseUrl": server.base_url}, "model": {"id": "gpt-a"},
                   "credentialRefs": ["provider/p1"]}
            answers.append(await agent.call("session.startTurn", {"sessionId": sid, "turnId": "t1",
                                                                  "providerId": "p1", "modelId": "gpt-a",
                                                                  "environment": env}))
            leaky = await refused(agent, "session.startTurn", {
                "sessionId": sid, "turnId": "t2", "environment": {
                    **env, "connection": {"baseUrl": server.base_url,
                                          "headers": {"Authorization": f"Bearer {values['rotated key']}"}}}})
            assert leaky.data_code == "INVALID_PARAMS"
            free_of([leaky.message, leaky.data], values, "the refused turn's error")
            await say(agent, sid, "u1", "list the models", turnId="t1")
            await say(agent, sid, "a1", "three of them", "assistant", turnId="t1")
            await agent.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            free_of(answers, values, "an answer")
            for fmt in ("md", "html", "jsonl"):
                free_of((await ui.call("session.export", {"sessionId": sid, "format": fmt}))["content"], values,
                        f"the {fmt} export")
            bundle = await ui.call("configSync.export", {})
            free_of(base64.b64decode(bundle["bundleBase64"]), values, "the config-sync bundle")
            free_of(await ui.call("audit.list", {"limit": 500}), values, "the audit log")
            free_of(await ui.call("host.status", {}), values, "host.status")
            free_of(await ui.call("secrets.list", {}), values, "secrets.list")
            heard = []
            with trio.move_on_after(1):
                while True:
                    heard.append((await watch.next_event()).data)
            assert heard, "the watcher heard no event"
            free_of(heard, values, "an event")
            # the values are there for the ones who may read them
            assert (await agent.call("secrets.get", {"ref": "provider/p1"}))["value"] == values["rotated key"]
            assert (await ui.call("secrets.get", {"ref": "mcp/tool"}))["value"] == values["mcp token"]
            assert await code_of(ui, "secrets.get", {"ref": "mcp/other"}) == "NOT_FOUND"
            assert await code_of(ui, "secrets.get", {"ref": "provider/p2"}) == "NOT_FOUND"
            assert (root / "pi.sqlite-wal").stat().st_size > 0
        # the host was SIGKILLed: the WAL still holds the recent pages
        assert plain_copies(root, values) == []
        names = [p.name for p in (root / "secrets").iterdir()]
        assert not [n for n in names if "p1" in n or "mcp" in n or "tool" in n], names
        for path in [root / "secrets", *(root / "secrets").iterdir()]:  # owner-only, the machine key beside them
            assert path.stat().st_mode & 0o077 == 0, f"{path.name}: {oct(path.stat().st_mode)}"
        report = run_cli("--data-dir", str(root), "doctor", "--json")
        free_of(report.stdout + report.stderr, values, "pi-host doctor's report")
        restarted = start_host_process(root)
        try:
            async with client(restarted, "ui-2", "ui") as ui:
                assert (await ui.call("secrets.get", {"ref": "configSync/webdavPassword"}))["value"] == \
                    values["webdav password"]
        finally:
            assert restarted.terminate() == 0  # a clean stop folds the WAL into pi.sqlite
        assert plain_copies(root, values) == []
        # README §8.7: the bundle carries "user providers *without keys*": another host applying it gets p1 keyless
        (tmp_path / "other").mkdir()
        other = data_dir(tmp_path / "other")
        async with real_host(other) as (_proc, there):
            await there.call("configSync.configure", {"vaultKey": vault_key})
            await there.call("configSync.apply", {"bundleBase64": bundle["bundleBase64"]})
            synced = (await there.call("providers.get", {"providerId": "p1"}))["provider"]
            assert synced["hasApiKey"] is False and synced["name"] == "One"
            assert [m["ref"] for m in (await there.call("secrets.list", {}))["secrets"]] == ["configSync/vaultKey"]
            assert await code_of(there, "secrets.get", {"ref": "provider/p1"}) == "NOT_FOUND"
        assert plain_copies(other, values) == []


# ------------------------------------------------------------------------------------------------------------
# Provider writes SIGKILLed at several moments and retried: exactly one effect

CELLS = [
    ("providers.create", "secrets.write.after_rename"),  # the key's file is in place, no row yet
    ("providers.create", "providers.create.before_commit"),
    ("providers.create", "providers.create.after_commit"),  # done, the answer never sent
    ("providers.update", "secrets.write.after_tmp_fsync"),  # the new key not in place yet
    ("providers.update", "providers.update.before_commit"),  # the new key in place, the row not changed
    ("providers.update", "providers.update.after_commit"),
    ("providers.delete", "providers.delete.before_commit"),  # the key's file gone, the row still there
    ("providers.delete", "providers.delete.after_commit"),
]
OLD, NEW = "sk-before-" + "11aa" * 6, "sk-after-" + "22bb" * 6


def _shape(provider: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in provider.items() if k not in ("id", "secretRef", "createdAt", "updatedAt")}


async def test_provider_writes_killed_at_each_moment_and_retried_have_exactly_one_effect(tmp_path: Path) -> None:
    """README §4: "A retry with the same key returns the stored response and has no other effect. This holds
    across reconnects and host restarts", and "a host crash can never leave an effect without its receipt";
    §4.3 the key lives in the secret store. A providers.create / update / delete SIGKILLed at a moment of its
    write (the key's file written or not, the row committed or not, the answer sent or not), the host started
    again and the call retried twice with its submissionId: both retries answer alike and as a crash-free call
    does (shape and values), and there is exactly one effect: one row, one secrets_meta entry and one value
    file per key, the new key readable, the old one gone, a deleted provider's models and key gone; no other
    provider is touched. The same for a plugin's ``providers.sync`` that drops its row killed before it
    commits."""
    root = data_dir(tmp_path)
    with trio.fail_after(300):
        async with real_host(root, client_id="crash-ui") as (_proc, c):
            reference = {
                "providers.create": await c.call("providers.create", {"id": "ref-c", "name": "Made", "apiKey": NEW}),
                "providers.update": None, "providers.delete": None}
            for i, (method, _point) in enumerate(CELLS):
                if method != "providers.create":
                    await c.call("providers.create", {"id": f"k{i}", "name": "Before", "apiKey": OLD})
                    await c.call("models.add", {"providerId": f"k{i}", "modelId": "kept-model"})
            async with client(_proc, "crash-pl", "plugin", "crash.pl") as plugin:  # a plugin's row with a key
                await plugin.call("providers.sync", {"providers": [{"id": "pg", "name": "Plugin gateway"}]})
            await c.call("secrets.set", {"ref": "provider/pg", "value": OLD})
            await c.call("providers.create", {"id": "ref-u", "name": "Before", "apiKey": OLD})
            reference["providers.update"] = await c.call("providers.update", {"providerId": "ref-u", "name": "Renamed",
                                                                              "apiKey": NEW})
        expected_ids = {"ref-c", "ref-u", "pg"} | {f"k{i}" for i, (m, _) in enumerate(CELLS)
                                                   if m != "providers.create"}
        for i, (method, point) in enumerate(CELLS):
            pid = f"k{i}"
            params: dict[str, Any] = {
                "providers.create": {"id": pid, "name": "Made", "apiKey": NEW},
                "providers.update": {"providerId": pid, "name": "Renamed", "apiKey": NEW},
                "providers.delete": {"providerId": pid},
            }[method] | {"submissionId": f"s-{i}"}
            files = secret_files(root)
            await call_killed_at(root, point, method, params, client_id="crash-ui")
            async with real_host(root, client_id="crash-ui") as (_proc, c):
                first = await c.call(method, params)
                assert await c.call(method, params) == first, (method, point)
                ref = f"provider/{pid}"
                metas = [m for m in (await c.call("secrets.list", {}))["secrets"] if m["ref"] == ref]
                if method == "providers.delete":
                    assert first == {"providerId": pid, "deleted": True}, point
                    assert await code_of(c, "providers.get", {"providerId": pid}) == "NOT_FOUND", point
                    assert [m for m in (await c.call("models.list", {}))["models"] if m["providerId"] == pid] == []
                    assert await code_of(c, "secrets.get", {"ref": ref}) == "NOT_FOUND", point
                    assert metas == [] and len(secret_files(root)) == len(files) - 1, point
                    expected_ids.discard(pid)
                    listed = [p["id"] for p in (await c.call("providers.list", {}))["providers"]]
                    assert sorted(listed) == sorted(expected_ids), point
                    continue
                if method == "providers.create":
                    expected_ids.add(pid)
                    assert len(secret_files(root)) == len(files) + 1, point
                else:
                    assert secret_files(root) == files, point
                    models = (await c.call("models.list", {"providerId": pid}))["models"]
                    assert [m["modelId"] for m in models] == ["kept-model"], point
                assert _shape(first["provider"]) == _shape(reference[method]["provider"]), point
                got = (await c.call("providers.get", {"providerId": pid}))["provider"]
                assert (got["name"], got["hasApiKey"], got["secretRef"]) == (first["provider"]["name"], True, ref)
                assert (await c.call("secrets.get", {"ref": ref}))["value"] == NEW, point
                assert [(m["ownerKind"], m["ownerId"], m["backend"]) for m in metas] == [
                    ("provider", pid, "file_fallback")], point
                listed = [p["id"] for p in (await c.call("providers.list", {}))["providers"]]
                assert sorted(listed) == sorted(expected_ids), point
        # the plugin stops declaring its row (README providers.sync: deleted, with the key the user stored for it),
        # killed once the key's file went and before the rows commit
        sync = {"providers": [], "submissionId": "sync-1"}
        files = secret_files(root)
        await call_killed_at(root, "providers.sync.before_commit", "providers.sync", sync, client_id="crash-pl",
                             client_kind="plugin", plugin_id="crash.pl")
        async with real_host(root, "plugin", "crash-pl", "crash.pl") as (proc, plugin), \
                client(proc, "crash-ui", "ui") as c:
            first = await plugin.call("providers.sync", sync)
            assert await plugin.call("providers.sync", sync) == first
            assert (first["providers"], first["removed"]) == ([], ["pg"])
            assert await code_of(c, "providers.get", {"providerId": "pg"}) == "NOT_FOUND"
            assert await code_of(c, "secrets.get", {"ref": "provider/pg"}) == "NOT_FOUND"
            assert len(secret_files(root)) == len(files) - 1
            expected_ids.discard("pg")
        async with real_host(root, client_id="crash-ui") as (_proc, c):
            listed = (await c.call("providers.list", {}))["providers"]
            assert sorted(p["id"] for p in listed) == sorted(expected_ids)
            keyed = sorted(p["secretRef"] for p in listed if p["hasApiKey"])
            assert sorted(m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]) == keyed
            assert len(secret_files(root)) == len(keyed)
            for ref in keyed:
                assert (await c.call("secrets.get", {"ref": ref}))["value"] == NEW, ref
