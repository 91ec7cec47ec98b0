"""Secrets around the edges (issue 18 "Secrets around the edges" findings)."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host, start_host_process


async def _start(c: HostClient, sid: str, n: int, env: dict[str, Any]) -> Any:
    return await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t{n}",
                                              "environment": {"version": 1, **env}})


async def _refused(c: HostClient, sid: str, n: int, env: dict[str, Any]) -> str:
    with pytest.raises(RpcError) as exc:
        await _start(c, sid, n, env)
    return exc.value.data_code


REFUSED: list[dict[str, Any]] = [
    {"connection": {"headers": {"Proxy-Authorization": "Basic dXNlcjpwYXNzd29yZA=="}}},  # the finding
    {"connection": {"key": "3f9a8b7c6d5e4f3a"}},  # the finding: a key named `key`
    {"model": {"key": "3f9a8b7c6d5e4f3a"}},  # `key` outside a credential section: by its name alone
    {"connection": {"baseUrl": "https://api.example/v1?key=3f9a8b7c6d5e4f3a"}},  # ?key= whatever the value's shape
    {"connection": {"baseUrl": "https://api.example/v1?alt=json&access_token=3f9a8b7c6d5e4f3a"}},
    {"connection": {"baseUrl": "https://blob.example/c?sv=2022-11-02&sig=3f9a8b7c6d5e4f3a"}},  # a presigned URL
    {"connection": {"baseUrl": "https://generativelanguage.example/v1?key=AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY"}},
    {"connection": {"baseUrl": "https://api.example/v1?alt=json&api_key=abcdef123456"}},
    {"connection": {"baseUrl": "https://user:hunter2hunter2@proxy.example:8080/"}},
    {"connection": {"headers": [["X-Api-Key", "abcdef123456"]]}},
    {"connection": {"headers": [{"name": "Cookie", "value": "session=abcdef123456"}]}},
    {"connection": {"headers": {"X-Goog-Api-Key": "abcdef123456"}}},
    {"executionBindings": {"env": {"GITHUB_TOKEN": "x1y2z3"}}},
    {"executionBindings": {"env": {"AZURE_OPENAI_KEY": "x1y2z3"}}},
    {"parameters": {"extra": "Bearer abcdefghijklmnop"}},
    {"model": {"note": "sk-proj-abcdefghijklmnopqrstuvwx"}},
    {"capabilities": {"jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abcdefghijklmnop"}},
    {"parameters": {"pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIE..."}},
]
ALLOWED: list[dict[str, Any]] = [
    {"connection": {"baseUrl": "https://api.example/v1", "headers": {"Accept": "application/json"}},
     "parameters": {"eosToken": "</s>", "maxTokens": 4096, "topK": 40}, "model": {"id": "claude-sonnet-4"},
     "credentialRefs": ["provider.anthropic"]},
    {"toolSchemas": [{"name": "login", "parameters": {"properties": {"password": {"type": "string"}}}}]},
]


async def test_snapshot_filter_refuses_credentials_by_name_and_shape(tmp_path: Path) -> None:
    """Findings "the run-environment filter stores a Proxy-Authorization header, a key named key and a
    ?key= URL parameter in plaintext": every credential-looking header, key, query parameter or value
    shape is INVALID_PARAMS and nothing is stored; ordinary settings still pass."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "env"}))["id"]
            for n, env in enumerate(REFUSED):
                assert await _refused(c, sid, n, env) == "INVALID_PARAMS", env
            for n, env in enumerate(ALLOWED, start=100):
                turn = await _start(c, sid, n, env)
                await c.call("session.endTurn", {"sessionId": sid, "turnId": turn["turn"]["turnId"]
                                                 if "turn" in turn else f"t{n}", "status": "completed"})
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    try:
        stored = [r[0] for r in conn.execute("SELECT snapshot_json FROM run_snapshots")]
    finally:
        conn.close()
    assert len(stored) == len(ALLOWED)
    blob = "\n".join(stored)
    for needle in ("dXNlcjpwYXNzd29yZA", "3f9a8b7c6d5e4f3a", "AIzaSy", "hunter2", "x1y2z3", "abcdef123456"):
        assert needle not in blob


async def test_missing_machine_key_is_not_silently_replaced(tmp_path: Path) -> None:
    """Finding "deleting .machine-key makes the next secrets.set silently create a new key so every older
    secret becomes unreadable": CORRUPT_DATA with a recovery hint, no new key; with no secret left, a
    key is created as before."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/a", "value": "sk-old-value-1"})
        key_file = tmp_path / "secrets" / ".machine-key"
        key_file.unlink()
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            for method, params in (("secrets.set", {"ref": "provider/b", "value": "v"}),
                                   ("secrets.get", {"ref": "provider/a"})):
                with pytest.raises(RpcError) as exc:
                    await c.call(method, params)
                assert exc.value.data_code == "CORRUPT_DATA", method
                assert exc.value.data.get("reason") == "missing_key"
                assert ".machine-key" in exc.value.message and "backup" in exc.value.message
            assert not key_file.exists()
            assert [n for n in os.listdir(tmp_path / "secrets") if n.endswith(".sec")]  # kept as they were
            # the user gives the old secrets up: the next set makes a key
            for name in os.listdir(tmp_path / "secrets"):
                if name.endswith(".sec"):
                    os.rename(tmp_path / "secrets" / name, tmp_path / name)
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/b", "value": "fresh"})
            assert (await c.call("secrets.get", {"ref": "provider/b"}))["value"] == "fresh"
            assert key_file.exists()


async def test_replayed_secret_set_does_not_confirm_a_value(tmp_path: Path) -> None:
    """Finding "a replayed submissionId on secrets.set confirms a guessed secret value (replay if right,
    conflict if wrong)": a right and a wrong guess get byte-identical answers, the stored value is
    unchanged, and the receipt row holds no digest of the value."""
    value = "sk-live-correct-horse-battery"
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host:
            async with client_for(host, client_id="victim", kind="ui") as victim:
                first = await victim.call("secrets.set", {"ref": "provider/x", "value": value,
                                                          "submissionId": "set-1"})
            async with client_for(host, client_id="victim", kind="cli") as attacker:
                right = await attacker.call("secrets.set", {"ref": "provider/x", "value": value,
                                                            "submissionId": "set-1"})
                wrong = await attacker.call("secrets.set", {"ref": "provider/x", "value": "guess",
                                                            "submissionId": "set-1"})
                assert right == wrong == first
                with pytest.raises(RpcError) as exc:  # a conflict only for another ref, whatever the value
                    await attacker.call("secrets.set", {"ref": "provider/y", "value": value,
                                                        "submissionId": "set-1"})
                assert exc.value.data_code == "IDEMPOTENCY_CONFLICT"
            async with client_for(host, client_id="reader", kind="ui") as reader:
                assert (await reader.call("secrets.get", {"ref": "provider/x"}))["value"] == value
    conn = sqlite3.connect(tmp_path / "pi.sqlite")
    try:
        fp = conn.execute("SELECT fingerprint FROM command_receipts WHERE submission_id = 'set-1'").fetchone()[0]
    finally:
        conn.close()
    from store import receipts

    plain = receipts.fingerprint("secrets.set", {"ref": "provider/x"})
    assert fp != plain  # keyed: nobody can recompute it to test a guess offline


async def test_log_files_are_created_0600(tmp_path: Path) -> None:
    """Finding "logs/host.ndjson is created 0644": the host's log file is 0600 whatever the umask."""
    old = os.umask(0o022)
    try:
        host = await trio.to_thread.run_sync(start_host_process, tmp_path)
    finally:
        os.umask(old)
    try:
        log = tmp_path / "logs" / "host" / "host.ndjson"
        assert log.exists()
        assert stat.S_IMODE(log.stat().st_mode) == 0o600
        assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == 0o700
    finally:
        await trio.to_thread.run_sync(host.kill9)
        for pipe in (host.proc.stdout, host.proc.stderr):
            if pipe is not None:
                pipe.close()
