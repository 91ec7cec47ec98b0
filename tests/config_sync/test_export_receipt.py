"""A keyed ``configSync.export``'s receipt row holds no bundle bytes (seed 003 §1.3: "The DB stores no large
payloads"), and its exact retry still gets the answer it got the first time, byte for byte, after a SIGKILL
and a restart; once a later export replaced ``pending.bin`` the retry is a clear ``CONFLICT``
(``data.reason: "superseded"``), never another bundle as if it were the original."""

from __future__ import annotations

import base64
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import trio

from tests.acceptance.outsiderkit import data_dir, error_of, real_host

VAULT_KEY = base64.b64encode(hashlib.sha256(b"export receipt vault key").digest()).decode()
CLIENT = "exporter"
KEYED = {"submissionId": "exp-big"}


def _receipt_rows(data: Path) -> list[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{data / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        return [(str(m), str(r)) for m, r in conn.execute(
            "SELECT method, response_json FROM command_receipts WHERE submission_id = ?", (KEYED["submissionId"],))]
    finally:
        conn.close()


async def _fill(c: Any, tmp: Path) -> None:
    """Enough portable configuration for a bundle well past 64 KiB (project memory, 24 KiB each)."""
    for i in range(8):
        text = hashlib.sha256(str(i).encode()).hexdigest() * 384
        await c.call("settings.set", {"ns": "projectMemory", "key": str(tmp / f"p{i}"), "value": text})


async def test_a_keyed_exports_receipt_row_holds_no_bundle_and_its_retry_answers_the_same_bytes(
        tmp_path: Path) -> None:
    data = data_dir(tmp_path)
    pending = data / "config-sync" / "pending.bin"
    with trio.fail_after(90):
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await _fill(c, tmp_path)
            first = await c.call("configSync.export", KEYED)
        # killed (SIGKILL) on leaving real_host
        assert first["bytes"] > 128 * 1024, first["bytes"]
        [(method, row)] = _receipt_rows(data)
        assert method == "configSync.export"
        assert len(row) < 1024, f"the receipt row holds {len(row)} bytes"
        assert "bundleBase64" not in row and first["bundleBase64"][:64] not in row, row
        async with real_host(data, client_id=CLIENT) as (_p, c):
            again = await c.call("configSync.export", KEYED)
            assert again == first, "the retry after a SIGKILL did not answer the same"
            assert base64.b64decode(again["bundleBase64"]) == pending.read_bytes()
            assert await c.call("configSync.export", KEYED) == first
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 777})
            later = await c.call("configSync.export", {})  # replaces pending.bin
        assert len(_receipt_rows(data)[0][1]) < 1024
        async with real_host(data, client_id=CLIENT) as (_p, c):
            code, err = await error_of(c, "configSync.export", KEYED)
            assert code == "CONFLICT", (code, err)
            assert err["reason"] == "superseded" and err["sha256"] == first["sha256"], err
            assert pending.read_bytes() == base64.b64decode(later["bundleBase64"]), "the retry wrote pending.bin"
            # another request under the key is still refused as such
            code, err = await error_of(c, "configSync.apply", {"bundleBase64": later["bundleBase64"], **KEYED})
            assert code == "IDEMPOTENCY_CONFLICT", (code, err)
