"""Encrypted secret store (RELIABILITY.md row 15): every tampering is detected, never garbage."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import trio

from runtime.client import RpcError
from store.config import secrets as s
from store.errors import CorruptData, NotFound
from tests.hostkit import client_for, inprocess_host

NOW = 1_785_056_400_000


def store(tmp_path: Path) -> s.SecretStore:
    return s.SecretStore(tmp_path / "secrets")


def _db_bytes(root: Path) -> bytes:
    """The SQLite database with its -wal/-shm files, concatenated."""
    return b"".join(p.read_bytes() for p in root.iterdir() if p.name.startswith("pi.sqlite"))


def test_round_trip_versions_and_key_file(tmp_path: Path) -> None:
    st = store(tmp_path)
    assert st.set("provider/anthropic", "sk-ant-é✓", now_ms=NOW) == 1
    assert st.get("provider/anthropic") == s.StoredSecret("provider/anthropic", 1, "sk-ant-é✓")
    assert st.set("provider/anthropic", "rotated", now_ms=NOW) == 2
    assert st.get("provider/anthropic").value == "rotated"
    # a second store (restart) reads what the first wrote with the same key
    assert store(tmp_path).get("provider/anthropic").value == "rotated"
    key = os.stat(st.key_path)
    assert stat.S_IMODE(key.st_mode) == 0o600 and key.st_size == 32
    assert [p.name for p in (tmp_path / "secrets").iterdir() if ".tmp." in p.name] == []
    with pytest.raises(NotFound):
        st.get("provider/missing")


def test_key_file_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        st = store(tmp_path)
        st.set("a", "b", now_ms=NOW)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(st.key_path).st_mode) == 0o600


def test_every_bit_flip_is_detected(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("provider/openai", "sk-live-0123456789", now_ms=NOW)
    path = st.path_for("provider/openai")
    good = path.read_bytes()
    flips = detected = 0
    for bit in range(len(good) * 8):
        bad = bytearray(good)
        bad[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(bad))
        flips += 1
        with pytest.raises(CorruptData, match="secret store corrupt/tampered"):
            st.get("provider/openai")
        detected += 1
        assert path.read_bytes() == bytes(bad)  # the tampered file is kept as it is
    assert flips == detected == len(good) * 8  # header + nonce + ciphertext + tag: 100 %
    path.write_bytes(good)
    assert st.get("provider/openai").value == "sk-live-0123456789"


def test_swapped_entries_are_detected_by_the_aad(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("provider/a", "value-a", now_ms=NOW)
    st.set("provider/b", "value-b", now_ms=NOW)
    pa, pb = st.path_for("provider/a"), st.path_for("provider/b")
    a, b = pa.read_bytes(), pb.read_bytes()
    # whole files swapped
    pa.write_bytes(b)
    pb.write_bytes(a)
    for ref in ("provider/a", "provider/b"):
        with pytest.raises(CorruptData, match="tampered"):
            st.get(ref)
    # only nonce + ciphertext + tag swapped, each file keeps its own header (same length refs)
    head = len(s.MAGIC) + 6 + len("provider/a")
    pa.write_bytes(a[:head] + b[head:])
    pb.write_bytes(b[:head] + a[head:])
    for ref in ("provider/a", "provider/b"):
        with pytest.raises(CorruptData, match="authentication failed"):
            st.get(ref)
    # version field rewritten (a replayed header claiming another version)
    forged = bytearray(a)
    forged[len(s.MAGIC) + 3] = 7
    pa.write_bytes(bytes(forged))
    with pytest.raises(CorruptData):
        st.get("provider/a")


def test_every_truncation_is_detected(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("r", "some secret value", now_ms=NOW)
    path = st.path_for("r")
    good = path.read_bytes()
    for size in range(len(good)):
        path.write_bytes(good[:size])
        with pytest.raises(CorruptData):
            st.get("r")


def test_wrong_key_is_detected(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("r", "v", now_ms=NOW)
    fd = os.open(st.key_path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, os.urandom(32))
    os.close(fd)
    with pytest.raises(CorruptData, match="authentication failed"):
        store(tmp_path).get("r")


def test_short_key_file_is_refused(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("r", "v", now_ms=NOW)
    fd = os.open(st.key_path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"short")
    os.close(fd)
    with pytest.raises(CorruptData, match="expected 32"):
        store(tmp_path).get("r")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_file_with_group_or_other_bits_is_refused_not_fixed(tmp_path: Path, mode: int) -> None:
    st = store(tmp_path)
    st.set("r", "v", now_ms=NOW)
    os.chmod(st.key_path, mode)
    fresh = store(tmp_path)
    with pytest.raises(CorruptData, match="refusing") as exc:
        fresh.get("r")
    assert exc.value.data["reason"] == "insecure_key_file"
    with pytest.raises(CorruptData):
        fresh.set("r", "new", now_ms=NOW)  # no write with a leaked key either
    assert stat.S_IMODE(os.stat(st.key_path).st_mode) == mode  # left for the user to decide
    os.chmod(st.key_path, 0o600)
    assert store(tmp_path).get("r").value == "v"


def test_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("r", "v", now_ms=NOW)
    real = tmp_path / "elsewhere"
    os.rename(st.key_path, real)
    os.symlink(real, st.key_path)
    with pytest.raises(CorruptData, match="symlink"):
        store(tmp_path).get("r")


def test_set_and_delete_keep_a_tampered_file_aside(tmp_path: Path) -> None:
    st = store(tmp_path)
    st.set("r", "old", now_ms=NOW)
    path = st.path_for("r")
    tampered = bytearray(path.read_bytes())
    tampered[-1] ^= 0x80
    path.write_bytes(bytes(tampered))
    st.set("r", "new", now_ms=NOW + 1)
    kept = [p for p in path.parent.iterdir() if ".tampered-" in p.name]
    assert len(kept) == 1 and kept[0].read_bytes() == bytes(tampered)
    assert st.get("r").value == "new"
    path.write_bytes(bytes(tampered))
    assert st.delete("r", now_ms=NOW + 2) is True
    assert not path.exists()
    assert sum(".tampered-" in p.name for p in path.parent.iterdir()) == 2
    assert st.delete("r", now_ms=NOW + 3) is False


def test_bad_refs_and_oversized_values_are_refused(tmp_path: Path) -> None:
    from store.errors import InvalidInput, PayloadTooLarge

    st = store(tmp_path)
    for ref in ("", "a\nb", "x" * 513):
        with pytest.raises(InvalidInput):
            st.set(ref, "v", now_ms=NOW)
    with pytest.raises(PayloadTooLarge):
        st.set("r", "x" * (s.MAX_VALUE_BYTES + 1), now_ms=NOW)


# ---------------------------------------------------------------------------
# through the host


async def test_secrets_rpc_values_never_reach_sqlite(tmp_path: Path) -> None:
    value = "sk-VERY-SECRET-4f9c2a71e0"
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host:
            async with client_for(host, client_id="ui-1", kind="ui") as c:
                r = await c.call("secrets.set", {"ref": "provider/x", "value": value, "ownerId": "x",
                                                 "submissionId": "s-1"})
                assert r["version"] == 1 and "value" not in r
                # same key: the stored response, whatever the value (a replay never confirms one);
                # another value sent with a used key is not written
                assert await c.call("secrets.set", {"ref": "provider/x", "value": value, "ownerId": "x",
                                                    "submissionId": "s-1"}) == r
                assert await c.call("secrets.set", {"ref": "provider/x", "value": "other", "ownerId": "x",
                                                    "submissionId": "s-1"}) == r
                assert (await c.call("secrets.get", {"ref": "provider/x"}))["value"] == value
                listed = await c.call("secrets.list", {})
                assert listed == {"secrets": [{"ref": "provider/x", "ownerKind": "provider", "ownerId": "x",
                                               "kind": "api_key", "backend": "file_fallback",
                                               "updatedAt": r["updatedAt"]}]}
                await c.call("secrets.set", {"ref": "provider/y", "value": value + "-y"})
                assert (await c.call("secrets.delete", {"ref": "provider/y"}))["deleted"] is True
                with pytest.raises(RpcError) as exc:
                    await c.call("secrets.get", {"ref": "provider/y"})
                assert exc.value.data_code == "NOT_FOUND"
            async with client_for(host, client_id="cli-1", kind="cli") as cli:
                with pytest.raises(RpcError) as exc:
                    await cli.call("secrets.get", {"ref": "provider/x"})
                assert exc.value.data_code == "PERMISSION_DENIED"
                assert len((await cli.call("secrets.list", {}))["secrets"]) == 1
    blob = await trio.to_thread.run_sync(_db_bytes, tmp_path)
    assert b"provider/x" in blob  # the bookkeeping is there ...
    assert value.encode() not in blob and b"VERY-SECRET" not in blob  # ... the value is not
    for p in (tmp_path / "secrets").iterdir():
        assert b"VERY-SECRET" not in p.read_bytes()


async def test_a_providers_key_changed_through_the_secret_store_shows_in_has_api_key(tmp_path: Path) -> None:
    """providers.get said hasApiKey: true after secrets.delete removed the provider's key (the sidecar then
    got NOT_FOUND), and false after secrets.set stored one under provider/<id>. The provider row's
    secret_ref follows the secret store in the same transaction, announced on providers.changed, and a
    restart reads the same."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
            await c.call("providers.create", {"id": "pa", "name": "A", "apiKey": "k-one"})
            await c.call("providers.create", {"id": "pb", "name": "B"})
            await c.subscribe(["providers.changed"])
            assert (await c.call("secrets.delete", {"ref": "provider/pa"}))["deleted"] is True
            await c.call("secrets.set", {"ref": "provider/pb", "value": "k-two", "ownerId": "pb"})
            await c.call("secrets.set", {"ref": "other/thing", "value": "v"})  # no provider's: no event
            seen = []
            async for event in c:
                seen.append(event.data["providerIds"])
                if len(seen) == 2:
                    break
            assert seen == [["pa"], ["pb"]]
    async with inprocess_host(tmp_path) as host, client_for(host, kind="ui") as c:
        got = {p["id"]: p for p in (await c.call("providers.list", {}))["providers"]}
        assert got["pa"]["hasApiKey"] is False and "secretRef" not in got["pa"]
        assert got["pb"]["hasApiKey"] is True and got["pb"]["secretRef"] == "provider/pb"
        assert (await c.call("secrets.get", {"ref": "provider/pb"}))["value"] == "k-two"


async def test_tampered_secret_is_corrupt_data_over_rpc(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host, kind="agent") as c:
            await c.call("secrets.set", {"ref": "provider/z", "value": "zzz"})
            path = s.SecretStore(tmp_path / "secrets").path_for("provider/z")
            data = bytearray(path.read_bytes())
            data[-5] ^= 1
            path.write_bytes(bytes(data))
            with pytest.raises(RpcError) as exc:
                await c.call("secrets.get", {"ref": "provider/z"})
            assert exc.value.data_code == "CORRUPT_DATA"
            assert "secret store corrupt/tampered" in exc.value.message
            assert path.read_bytes() == bytes(data)
