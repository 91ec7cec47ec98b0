"""secrets.set / secrets.delete killed at each point, restarted, retried: one effect and the crash-free answer.

A `pi-host serve` process SIGKILLs itself at a named point (``RT_CRASHPOINT``) inside the keyed call; a
host started on its data directory in this process retries the same clientId + submissionId. The file
is written (or removed) before the row and the receipt commit, so a kill between the two left the
effect without its receipt: the retry re-ran the request, and ``secrets.set`` answered (and wrote) the
*next* version (2 where a crash-free run answers 1), ``secrets.delete`` answered ``deleted: false``.
Now the file names the request that wrote it (a keyed MAC of its receipt key, in the authenticated
header) and a keyed delete leaves an empty trace of itself: the retry finds its own effect and answers
what the first try would have.
"""

from __future__ import annotations

import os
import sqlite3
import struct
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runtime.client import ClientClosed, RpcError, open_client
from store import receipts
from store.config import secrets as s
from store.config.secrets_meta_rebuild import rebuild_secrets_meta, scan_secret_files
from store.errors import CorruptData, NotFound
from store.faults import Faults, InjectedFault
from store.receipts import ReceiptKey
from tests.dbkit import tx
from tests.hostkit import client_for, inprocess_host, start_host_process

CLIENT, REF = "settings-ui", "provider/acme"
NOW = 1_785_056_400_000
# the file is in place (renamed, maybe not yet dir-synced) or the row is about to commit: the effect happened
SET_AFTER_FILE = ["secrets.write.after_rename", "secrets.write.before_dirsync", "secrets.set.before_commit",
                  "secrets.set.after_commit"]
DELETE_AFTER_FILE = ["secrets.delete.after_aside", "secrets.delete.before_commit", "secrets.delete.after_commit"]


async def _killed_during(root: Path, point: str, method: str, params: dict[str, Any]) -> None:
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{point}:1"})
    with trio.fail_after(60):
        try:
            async with open_client(crashing.url, crashing.token, client_id=CLIENT, client_kind="ui") as c:
                await c.call(method, params)
        except (ClientClosed, OSError):
            pass
        await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9, f"the host did not die at {point}"


async def _setup(root: Path, *, existing: bool) -> None:
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
        await c.call("secrets.set", {"ref": "other", "value": "untouched"})
        if existing:
            await c.call("secrets.set", {"ref": REF, "value": "old-key"})


def _version(root: Path, ref: str) -> int:
    return s.SecretStore(root / "secrets").get(ref).version


@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
@pytest.mark.parametrize("point", SET_AFTER_FILE)
async def test_a_set_killed_after_its_file_is_retried_to_its_version_once(
        tmp_path: Path, point: str, existing: bool) -> None:
    await _setup(tmp_path, existing=existing)
    expected = 2 if existing else 1  # what a crash-free run answers
    keyed = {"ref": REF, "value": "new-key", "ownerKind": "provider", "ownerId": "acme", "submissionId": "set-1"}
    await _killed_during(tmp_path, point, "secrets.set", keyed)
    assert _version(tmp_path, REF) == expected  # the file was written once before the kill
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            first = await c.call("secrets.set", keyed)
            assert (first["ref"], first["version"]) == (REF, expected)
            assert await c.call("secrets.set", keyed) == first
            # a replay carrying another value is answered the same and does not write it (README §4)
            assert await c.call("secrets.set", {**keyed, "value": "typo"}) == first
            assert (await c.call("secrets.get", {"ref": REF}))["value"] == "new-key"
            listed = {m["ref"]: m for m in (await c.call("secrets.list", {}))["secrets"]}
            assert (listed[REF]["ownerKind"], listed[REF]["ownerId"]) == ("provider", "acme")
            assert (await c.call("secrets.get", {"ref": "other"}))["value"] == "untouched"
            # the next write is the next version: the retry wrote nothing
            assert (await c.call("secrets.set", {"ref": REF, "value": "later"}))["version"] == expected + 1


@pytest.mark.parametrize("point", ["secrets.write.after_tmp_fsync"])
async def test_a_set_killed_before_its_file_is_retried_to_one_write(tmp_path: Path, point: str) -> None:
    await _setup(tmp_path, existing=True)
    keyed = {"ref": REF, "value": "new-key", "submissionId": "set-1"}
    await _killed_during(tmp_path, point, "secrets.set", keyed)
    assert _version(tmp_path, REF) == 1
    async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
        assert (await c.call("secrets.set", keyed))["version"] == 2
        assert (await c.call("secrets.set", keyed))["version"] == 2
        assert (await c.call("secrets.get", {"ref": REF}))["value"] == "new-key"
    assert _version(tmp_path, REF) == 2


@pytest.mark.parametrize("point", DELETE_AFTER_FILE)
async def test_a_delete_killed_after_the_value_is_gone_is_retried_to_deleted_true(
        tmp_path: Path, point: str) -> None:
    await _setup(tmp_path, existing=True)
    keyed = {"ref": REF, "submissionId": "del-1"}
    await _killed_during(tmp_path, point, "secrets.delete", keyed)
    path = s.SecretStore(tmp_path / "secrets").path_for(REF)
    # the trace (a receipt record, never a value) is durable before the file goes
    assert path.exists() == (point == "secrets.delete.after_aside")
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            first = await c.call("secrets.delete", keyed)
            assert first == {"ref": REF, "deleted": True}
            assert await c.call("secrets.delete", keyed) == first
            with pytest.raises(RpcError) as info:
                await c.call("secrets.get", {"ref": REF})
            assert info.value.data_code == "NOT_FOUND"
            assert REF not in {m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]}
            assert (await c.call("secrets.get", {"ref": "other"}))["value"] == "untouched"
            # a new delete (another key) of the gone ref deletes nothing
            assert (await c.call("secrets.delete", {"ref": REF, "submissionId": "del-2"}))["deleted"] is False
    # nothing of the deleted secret is left (the trace went with the commit, or at the restart's boot)
    assert [p.name for p in (tmp_path / "secrets").iterdir() if p.name.startswith(path.name)] == []


async def test_a_delete_cut_before_its_file_went_and_never_retried_leaves_the_secret_whole(tmp_path: Path) -> None:
    """Found in review: the first version renamed the file to its trace before writing the receipt record
    into it; killed between the two and never retried, the value stayed on disk under the trace's name,
    hidden from every read and from any later delete. Now the trace is written first and never holds a
    value: the secret stays readable under its own name, boot drops the trace, a later delete deletes it."""
    await _setup(tmp_path, existing=True)
    keyed = {"ref": REF, "submissionId": "del-1"}
    await _killed_during(tmp_path, "secrets.delete.after_aside", "secrets.delete", keyed)
    traces = list((tmp_path / "secrets").glob("*.deleting-*"))
    assert [orjson.loads(t.read_bytes())["submissionId"] for t in traces] == ["del-1"]  # a record, no ciphertext
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            assert (await c.call("secrets.get", {"ref": REF}))["value"] == "old-key"
            assert REF in {m["ref"] for m in (await c.call("secrets.list", {}))["secrets"]}
    assert not list((tmp_path / "secrets").glob("*.deleting-*"))  # boot dropped it: the file is still there
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host, CLIENT, kind="ui") as c:
            assert await c.call("secrets.delete", {"ref": REF, "submissionId": "del-7"}) == \
                {"ref": REF, "deleted": True}


# -- the store, in process ------------------------------------------------------------------------

KEY = ReceiptKey("c1", "sub-1", "secrets.delete", "f" * 64)


def test_a_keyed_delete_of_a_tampered_file_keeps_it_and_its_retry_answers_true(tmp_path: Path) -> None:
    faults = Faults()
    faults.add("secrets.delete.after_aside")
    st = s.SecretStore(tmp_path / "secrets", faults=faults)
    st.set("r", "value", now_ms=NOW)
    bad = bytearray(st.path_for("r").read_bytes())
    bad[-1] ^= 1
    st.path_for("r").write_bytes(bytes(bad))
    with pytest.raises(InjectedFault):
        st.delete("r", now_ms=NOW, receipt=KEY)  # cut short after the file left its name
    assert not st.path_for("r").exists()
    assert st.delete("r", now_ms=NOW, receipt=KEY) is True  # the retry finds its own trace and finishes
    traces = [p for p in st.directory.iterdir() if ".deleting-" in p.name]
    assert [orjson.loads(p.read_bytes())["submissionId"] for p in traces] == ["sub-1"]  # a record, no value
    assert st.delete("r", now_ms=NOW, receipt=KEY) is True
    kept = [p for p in st.directory.iterdir() if ".tampered-" in p.name]
    assert [p.read_bytes() for p in kept] == [bytes(bad)]  # kept for inspection, never destroyed
    assert st.delete("r", now_ms=NOW, receipt=ReceiptKey("c1", "sub-2", "secrets.delete", "f" * 64)) is False
    st.forget_delete("r", KEY)
    assert sorted(p.name for p in st.directory.iterdir() if p.name.startswith(st.path_for("r").name)) == \
        sorted(p.name for p in kept)


def test_a_set_finds_only_its_own_write(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    assert st.set("r", "a", now_ms=NOW, receipt=KEY) == 1
    assert st.set("r", "a", now_ms=NOW, receipt=KEY) == 1  # its own write: not written again
    assert st.set("r", "b", now_ms=NOW) == 2
    other = ReceiptKey("c1", "sub-2", "secrets.set", "f" * 64)
    assert st.set("r", "c", now_ms=NOW, receipt=other) == 3  # another key's write is not taken for its own
    assert st.get("r") == s.StoredSecret("r", 3, "c")
    # KEY wrote version 1 and the file holds a later write now: a retry of KEY whose receipt row a lost
    # database took is answered its version and does not put its old value back
    assert st.put("r", "a", now_ms=NOW + 1, receipt=KEY) == s.SetOutcome(1, NOW, "earlier")
    assert st.get("r") == s.StoredSecret("r", 3, "c")


def _v1_file(key: bytes, ref: str, version: int, value: str) -> bytes:
    nonce, ref_b = os.urandom(12), ref.encode()
    aad = b"pi-secret/v1\x00" + ref_b + b"\x00" + str(version).encode()
    return b"PISEC01\n" + struct.pack(">IH", version, len(ref_b)) + ref_b + nonce + \
        AESGCM(key).encrypt(nonce, value.encode(), aad)


def test_files_of_the_first_format_are_read_and_replaced(tmp_path: Path) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    st.set("other", "x", now_ms=NOW)
    st.path_for("r").write_bytes(_v1_file(st.key(), "r", 4, "old"))
    assert st.get("r") == s.StoredSecret("r", 4, "old")
    assert {f.ref: f.version for f in scan_secret_files(st.directory)[0]} == {"other": 1, "r": 4}
    assert st.set("r", "new", now_ms=NOW, receipt=KEY) == 5
    assert st.get("r").value == "new"
    forged = bytearray(st.path_for("r").read_bytes())
    forged[7] = ord("1")  # the new file read as the first format: refused, never garbage
    st.path_for("r").write_bytes(bytes(forged))
    with pytest.raises(CorruptData):
        st.get("r")
    with pytest.raises(NotFound):
        st.get("missing")


def test_boot_removes_a_trace_whose_receipt_committed_and_keeps_one_whose_retry_is_due(
        tmp_path: Path, conn: sqlite3.Connection) -> None:
    st = s.SecretStore(tmp_path / "secrets")
    done, due = KEY, ReceiptKey("c1", "sub-2", "secrets.delete", "f" * 64)
    for ref, key in (("a", done), ("b", due)):
        st.set(ref, "v", now_ms=NOW)
        assert st.delete(ref, now_ms=NOW, receipt=key) is True
    write = tx(conn)
    write(lambda c: receipts.store(c, done, {"ref": "a", "deleted": True}, session_id=None, now_ms=NOW))
    out = write(lambda c: rebuild_secrets_meta(c, st.directory, db_rebuilt=False))
    assert out["tracesRemoved"] == 1
    assert [p.name for p in st.directory.iterdir() if ".deleting-" in p.name] == [st._trace("b", due).name]
    assert "tracesRemoved" not in write(lambda c: rebuild_secrets_meta(c, st.directory, db_rebuilt=False))
