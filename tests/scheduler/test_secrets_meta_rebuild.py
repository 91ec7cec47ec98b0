"""Boot rebuilds ``secrets_meta`` from the ``secrets/*.sec`` headers (index rebuilt, or rows lost)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store.config import secrets as secret_store
from store.config.secrets_meta_rebuild import rebuild_secrets_meta, scan_secret_files
from tests.dbkit import NOW
from tests.hostkit import call_killed_at, client_for, index_caught_up, inprocess_host
from tests.scheduler.schedkit import open_db


def _vault(root: Path) -> secret_store.SecretStore:
    return secret_store.SecretStore(root / "secrets")


def test_scan_trusts_only_files_whose_header_ref_matches_the_name(tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    vault.set("provider/anthropic", "sk-1", now_ms=NOW)
    vault.set("provider/anthropic", "sk-2", now_ms=NOW)  # version 2
    vault.set("mcp/github", "gh", now_ms=NOW)
    swapped = vault.path_for("plugin/x")
    swapped.write_bytes(vault.path_for("mcp/github").read_bytes())  # a header naming another ref
    (tmp_path / "secrets" / ("0" * 64 + ".sec")).write_bytes(b"not a secret file")
    (tmp_path / "secrets" / "notes.txt").write_text("ignored")
    found, skipped = scan_secret_files(tmp_path / "secrets")
    assert sorted((f.ref, f.version) for f in found) == [("mcp/github", 1), ("provider/anthropic", 2)]
    assert skipped == 2
    assert scan_secret_files(tmp_path / "missing") == ([], 0)


def test_rebuild_adds_missing_rows_and_drops_rows_without_files(tmp_path: Path) -> None:
    with open_db(tmp_path / "pi.sqlite") as db:
        _rebuild_case(db.conn, db.tx, tmp_path)


def _rebuild_case(conn: sqlite3.Connection, write: Callable[[Callable[[sqlite3.Connection], Any]], Any],
                  tmp_path: Path) -> None:
    vault = _vault(tmp_path)
    for ref in ("a", "b", "c"):
        vault.set(ref, "v", now_ms=NOW)
    write(lambda c: secret_store.upsert_meta(c, "a", owner_kind="plugin", owner_id="p1", kind="token", now_ms=NOW))
    write(lambda c: secret_store.upsert_meta(c, "gone", owner_kind=None, owner_id=None, kind=None, now_ms=NOW))
    conn.execute("INSERT INTO secrets_meta(secret_ref, backend, updated_at) VALUES ('kc', 'safe_storage', 1)")
    vault.path_for("c").write_bytes(b"tampered")  # a file is there: its row is not dropped
    write(lambda c: secret_store.upsert_meta(c, "c", owner_kind=None, owner_id=None, kind=None, now_ms=NOW))
    out = write(lambda c: rebuild_secrets_meta(c, tmp_path / "secrets", db_rebuilt=False))
    assert out == {"rebuilt": False, "files": 2, "added": 1, "removed": 1, "skipped": 1}
    rows = {m["ref"]: m for m in secret_store.list_meta(conn)}
    assert sorted(rows) == ["a", "b", "c", "kc"]
    assert (rows["a"]["ownerKind"], rows["a"].get("ownerId"), rows["a"]["kind"]) == ("plugin", "p1", "token")
    assert (rows["b"]["ownerKind"], rows["b"]["kind"], rows["b"]["backend"]) == ("provider", "api_key",
                                                                                  "file_fallback")
    assert rows["b"]["updatedAt"] == NOW  # the time its write answered, from the file header
    assert write(lambda c: rebuild_secrets_meta(c, tmp_path / "secrets", db_rebuilt=False))["added"] == 0


@pytest.mark.parametrize("damage", ["deleted", "corrupt"])
async def test_secrets_meta_is_rebuilt_with_the_index(tmp_path: Path, damage: str) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/anthropic", "value": "sk-ant-1"})
            await c.call("secrets.set", {"ref": "provider/openai", "value": "sk-oa-1"})
            await c.call("secrets.set", {"ref": "provider/openai", "value": "sk-oa-2"})
            await c.call("secrets.delete", {"ref": "provider/anthropic"})
            await c.call("secrets.set", {"ref": "mcp/github", "value": "ghp", "ownerKind": "mcp", "kind": "token"})
            before = (await c.call("secrets.list", {}))["secrets"]
            assert host.boot.report["secrets"]["added"] == 0
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        if damage == "corrupt":
            (tmp_path / "pi.sqlite").write_bytes(b"SQLite format 3\x00" + os.urandom(8192))
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            report = host.boot.report
            assert report["database"]["createdFresh"] is True  # a fresh, empty index
            assert report["dbRebuilt"] is (damage == "corrupt")  # the corrupt file was quarantined
            assert report["secrets"] == {"rebuilt": True, "files": 2, "added": 2, "removed": 0, "skipped": 0}
            assert report["secretsMetaRebuilt"] == 2
            after = (await c.call("secrets.list", {}))["secrets"]
            assert [m["ref"] for m in after] == [m["ref"] for m in before] == ["mcp/github", "provider/openai"]
            assert all(m["backend"] == "file_fallback" for m in after)
            assert (await c.call("secrets.get", {"ref": "provider/openai"}))["value"] == "sk-oa-2"
            status = await c.call("host.status", {})
            assert status["boot"]["secretsMetaRebuilt"] == 2


async def test_a_set_that_crashed_before_its_row_is_listed_after_restart(tmp_path: Path) -> None:
    """Killed with the file written and its row not committed: the outcome was never answered, and boot
    lists the value the file holds."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/a", "value": "1"})
        await call_killed_at(tmp_path, "secrets.set.before_commit", "secrets.set", {"ref": "provider/b", "value": "2"})
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            assert host.boot.report["secrets"]["added"] == 1
            assert [m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]] == ["provider/a", "provider/b"]
            assert (await c.call("secrets.get", {"ref": "provider/b"}))["value"] == "2"


async def test_a_set_answered_failed_before_its_row_leaves_the_value_it_found(tmp_path: Path) -> None:
    """Its row's commit failed and the caller was told so: the file is taken back (no new secret after a
    restart, and an overwritten one reads its old value)."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/a", "value": "1"})
            await index_caught_up(host)
            for ref, value in (("provider/b", "2"), ("provider/a", "changed")):
                host.faults.add("index.before_commit", nth=1, action="raise")  # file written, row not committed
                with pytest.raises(RpcError):
                    await c.call("secrets.set", {"ref": ref, "value": value})
                host.faults.clear()
            assert [m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]] == ["provider/a"]
            assert (await c.call("secrets.get", {"ref": "provider/a"}))["value"] == "1"
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            assert host.boot.report["secrets"]["added"] == 0
            assert [m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]] == ["provider/a"]
            assert (await c.call("secrets.get", {"ref": "provider/a"}))["value"] == "1"
