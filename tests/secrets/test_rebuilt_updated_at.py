"""``secrets.list`` after a lost database shows the ``updatedAt`` it showed before (seed 003 §4.12).

Boot rebuilds ``secrets_meta`` from the ``secrets/*.sec`` headers. The row's ``updated_at`` came from the
file's mtime, which a copy, a restore or a backup tool moves: the listing after the rebuild showed other
times than before the loss. A format-3 file's authenticated header records the time its write answered
(what ``secrets.set`` answered and stored as ``updatedAt``); the rebuild takes it from there, and falls
back to the mtime for the earlier formats (and a header without a usable time).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import trio
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from store.config import secrets as s
from store.config.secrets_meta_rebuild import rebuild_secrets_meta, scan_secret_files
from tests.hostkit import client_for, inprocess_host
from tests.scheduler.schedkit import open_db

NOW = 1_785_056_400_000
OLD_MTIME_NS = 1_600_000_000_123 * 1_000_000  # 2020: the files were copied back with other mtimes


def _age_files(directory: Path) -> None:
    for name in os.listdir(directory):
        if name.endswith(".sec"):
            os.utime(directory / name, ns=(OLD_MTIME_NS, OLD_MTIME_NS))


async def test_a_listing_after_the_database_was_lost_shows_the_times_it_showed_before(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            await c.call("secrets.set", {"ref": "provider/openai", "value": "sk-1"})
            await trio.sleep(0.01)
            answered = await c.call("secrets.set", {"ref": "provider/openai", "value": "sk-2"})
            await c.call("secrets.set", {"ref": "provider/anthropic", "value": "sk-ant"})
            before = {m["ref"]: m["updatedAt"] for m in (await c.call("secrets.list", {}))["secrets"]}
            assert before["provider/openai"] == answered["updatedAt"]
        _age_files(tmp_path / "secrets")
        for name in ("pi.sqlite", "pi.sqlite-wal", "pi.sqlite-shm"):
            (tmp_path / name).unlink(missing_ok=True)
        async with inprocess_host(tmp_path) as host, client_for(host, "ui", kind="ui") as c:
            assert host.boot.report["secrets"]["added"] == 2
            after = {m["ref"]: m["updatedAt"] for m in (await c.call("secrets.list", {}))["secrets"]}
            assert after == before
            assert all(at != OLD_MTIME_NS // 1_000_000 for at in after.values())


def _v1_file(key: bytes, ref: str, version: int, value: str) -> bytes:
    nonce, ref_b = os.urandom(12), ref.encode()
    aad = b"pi-secret/v1\x00" + ref_b + b"\x00" + str(version).encode()
    return b"PISEC01\n" + struct.pack(">IH", version, len(ref_b)) + ref_b + nonce + \
        AESGCM(key).encrypt(nonce, value.encode(), aad)


def _v2_file(key: bytes, ref: str, version: int, value: str) -> bytes:
    nonce, ref_b, receipt = os.urandom(12), ref.encode(), bytes(32)
    aad = b"pi-secret/v2\x00" + ref_b + b"\x00" + str(version).encode() + b"\x00" + receipt
    return b"PISEC02\n" + struct.pack(">IH", version, len(ref_b)) + ref_b + receipt + nonce + \
        AESGCM(key).encrypt(nonce, value.encode(), aad)


def test_the_header_time_is_used_and_older_formats_fall_back_to_the_mtime(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    st.set("v3", "x", now_ms=NOW)
    key = st.key()
    st.path_for("v1").write_bytes(_v1_file(key, "v1", 1, "old"))
    st.path_for("v2").write_bytes(_v2_file(key, "v2", 2, "old"))
    st.path_for("zero").write_bytes(s.encode_file(key, "zero", 1, "x"))  # format 3 written without a time
    st.path_for("huge").write_bytes(s.encode_file(key, "huge", 1, "x", written_at=2**64 - 1))  # no wire time
    assert st.get("v2").value == "old" and st.get("huge").value == "x"
    _age_files(st.directory)
    old_ms = OLD_MTIME_NS // 1_000_000
    found = {f.ref: f.updated_at for f in scan_secret_files(st.directory)[0]}
    assert found == {"v3": NOW, "v1": old_ms, "v2": old_ms, "zero": old_ms, "huge": old_ms}
    with open_db(tmp_path / "pi.sqlite") as db:
        db.tx(lambda c: rebuild_secrets_meta(c, st.directory, db_rebuilt=True))
        rows = {m["ref"]: m["updatedAt"] for m in s.list_meta(db.conn)}
    assert rows == found
