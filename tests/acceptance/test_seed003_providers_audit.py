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
clear code, the old catalog and its stamp kept, the host's memory bounded, no redirect followed); provider
create/update/delete SIGKILLed at several moments of their default suite run (not only the soak) and retried
to one effect; a deleted provider's id starting over with no models and no key; every secret value written
through every door (secrets.set, provider keys, a rotated and a deleted key, the WebDAV password, a replay
carrying another value) grepped as raw bytes (and base64, hex, UTF-16) in every file of the data directory,
the WAL of a killed host included, in exports, events, the audit log and doctor's output; who may read a secret
value and who may touch whose provider rows; a sweep of bad input that must change nothing; the uninstall of a
plugin's fullest namespace never seen half done; and a sidebar reset that changes nothing else at all.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.acceptance.outsiderkit import data_dir, real_host, shared_host
from tests.hostkit import HostProcess
from tests.pipeline import probe

MODELS = [{"id": "gpt-a", "object": "model"}, {"id": "gpt-b", "context_length": 128000}, {"id": "gpt-c"}]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that never restart it (each uses ids of its own)."""
    yield from shared_host(tmp_path_factory, "providers-audit")


def secret_files(root: Path) -> list[str]:
    """The names of the secret store's value files (not its key, traces or write records)."""
    return sorted(p.name for p in (root / "secrets").iterdir()
                  if p.is_file() and not p.name.startswith(".") and "." not in p.name)


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


BAD, GONE, LATE = "PROVIDER_BAD_REPLY", "PROVIDER_UNREACHABLE", "PROVIDER_TIMEOUT"


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
    shows in an error; a good list (gzip-encoded too) is taken afterwards."""
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
                ("not http at all", send(b"SSH-2.0-OpenSSH_9.6\r\n" + bytes(range(256))), (BAD, GONE), 20_000),
                ("a body cut short", send(http(200, listing)[:-40]), (BAD, GONE), 20_000),
                ("silence", silent, (LATE,), 1_000),
                ("headers a byte at a time", drip(b"HTTP/1.1 200 OK\r\n", b"X"), (LATE,), 1_000),
                ("a body a byte at a time", drip(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"), (LATE,),
                 1_000),
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
