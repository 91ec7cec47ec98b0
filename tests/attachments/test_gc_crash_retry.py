"""``attachments.gc`` retried after the host died mid-GC answers what a crash-free GC answers.

The GC marks its victims in one transaction, unlinks their bytes, and stores its receipt in a last
transaction. A host killed anywhere after the marks committed used to leave the eviction done (the
retry's GC finished the unlinking) but the retry answered ``{"evicted": [], "freedBytes": 0}``: the
first attempt's victims were no longer over budget, so the retry found nothing to do. Now the answer
is recorded with the marks under the receipt key and the retry finishes that GC and answers it.

Each case: the same data directory is copied before the GC; a crash-free GC on the copy gives the
reference answer; a real host process on the original is killed at the point, a host restarts there
and the same ``clientId`` + ``submissionId`` is retried.
"""

from __future__ import annotations

import base64
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import ClientClosed, HostClient, RpcError, open_client
from tests.hostkit import client_for, index_caught_up, inprocess_host, msg, start_host_process

CLIENT = "ui-gc"
SUBMISSION = "gc-1"

# every moment after the marking transaction committed and before the receipt did
POINTS_AFTER_MARK = [
    "attachments.gc.after_mark:1",       # marks committed, nothing unlinked
    "index.before_commit:2",             # the late-reference transaction (1b) not committed
    "index.after_commit:1",              # the marking transaction just committed
    "index.after_commit:2",              # 1b committed
    "index.before_commit:3",             # the tombstones + receipt transaction not committed
    "attachments.gc.after_unlink:1",     # one blob unlinked
    "attachments.gc.after_unlink:3",     # every blob unlinked
    "attachments.gc.before_commit:1",    # inside the last transaction, before its commit
]


def _att(sha: str) -> dict[str, Any]:
    return {"type": "attachment", "kind": "file", "name": "a.txt", "ref": f"attachments/{sha}",
            "mimeType": "text/plain", "size": 29}


async def _setup(root: Path) -> dict[str, Any]:
    """Three blobs over a 20-byte budget, none used by the active session: the first referenced by a
    block of the other session's transcript, the second by a client reference."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
        active = (await c.call("session.create", {"title": "active"}))["id"]
        other = (await c.call("session.create", {"title": "other"}))["id"]
        shas = []
        for i in range(3):
            data = base64.b64encode(f"blob number {i} with some bytes".encode()).decode()
            got = await c.call("attachments.put", {"name": f"{i}.txt", "mimeType": "text/plain", "dataBase64": data})
            shas.append(got["sha256"])
        await c.call("session.appendMessage", {"sessionId": other, "message": msg(
            "m-block", "see", blocks=[{"type": "text", "text": "see"}, _att(shas[0])])})
        await c.call("attachments.ref", {"sha256": shas[1], "sessionId": other, "messageId": "m-block"})
        await c.call("settings.set", {"ns": "app", "key": "attachmentBudgetBytes", "value": 20})
        await index_caught_up(host)
    return {"activeSessionId": active, "submissionId": SUBMISSION, "shas": shas}


def _params(setup: dict[str, Any]) -> dict[str, Any]:
    return {"activeSessionId": setup["activeSessionId"], "submissionId": setup["submissionId"]}


async def _blob_states(c: HostClient, shas: list[str]) -> dict[str, Any]:
    out = {}
    for sha in shas:
        got = await c.call("attachments.get", {"sha256": sha})
        got.pop("evictedAt", None)  # when it happened differs between the runs
        out[sha] = got
    return out


async def _reference(root: Path, setup: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The crash-free answer (and the blob states after it) on a copy of the data directory."""
    async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
        answer = await c.call("attachments.gc", _params(setup))
        return answer, await _blob_states(c, setup["shas"])


async def _killed_during_gc(root: Path, point: str, params: dict[str, Any], *, client_id: str = CLIENT) -> None:
    """A host process that SIGKILLs itself at ``point`` while it runs the keyed ``attachments.gc``."""
    name, _, nth = point.partition(":")
    crashing = start_host_process(root, env={"RT_CRASHPOINT": f"{name}:{nth}"})
    answered = None
    try:
        async with open_client(crashing.url, crashing.token, client_id=client_id, client_kind="ui") as c:
            answered = await c.call("attachments.gc", params)
    except (ClientClosed, OSError):
        pass
    await trio.to_thread.run_sync(lambda: crashing.proc.communicate(timeout=30))
    assert crashing.proc.returncode == -9 and answered is None, f"the host did not die at {point}"


def _pending_rows(root: Path) -> int:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        return int(conn.execute("SELECT COUNT(*) FROM kv WHERE ns = 'pi-host/attachments.gc'").fetchone()[0])
    finally:
        conn.close()


async def _crashed_and_reference(tmp_path: Path, point: str) -> tuple[Path, dict[str, Any], dict[str, Any],
                                                                        dict[str, Any]]:
    root, copy = tmp_path / "data", tmp_path / "reference"
    setup = await _setup(root)
    shutil.copytree(root, copy)
    answer, states = await _reference(copy, setup)
    assert sorted(answer["evicted"]) == sorted(setup["shas"]) and answer["freedBytes"] == 87  # 29 bytes each
    await _killed_during_gc(root, point, _params(setup))
    return root, setup, answer, states


@pytest.mark.parametrize("point", POINTS_AFTER_MARK)
async def test_a_gc_retried_after_a_crash_answers_the_crash_free_eviction_once(tmp_path: Path, point: str) -> None:
    with trio.fail_after(120):
        root, setup, reference, reference_states = await _crashed_and_reference(tmp_path, point)
        shas = setup["shas"]
        async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
            # the host died between the marks and the receipt: every victim marked, none a tombstone yet
            assert {s["deletionState"] for s in (await _blob_states(c, shas)).values()} == {"evicting"}
            assert await c.call("attachments.gc", _params(setup)) == reference
            assert await c.call("attachments.gc", _params(setup)) == reference  # the receipt, again
            # the effect: every victim's bytes gone, its row a tombstone, every reference to it marked
            assert [sha for sha in shas if (root / "attachments" / sha).exists()] == []
            states = await _blob_states(c, shas)
            assert states == reference_states
            assert all(s["deletionState"] == "evicted" for s in states.values())
            assert [(r["origin"], r["evicted"]) for r in states[shas[0]]["references"]] == [("transcript", True)]
            assert [(r["origin"], r["evicted"]) for r in states[shas[1]]["references"]] == [("client", True)]
            # evicted once: a later GC finds nothing left to evict or remove
            later = await c.call("attachments.gc", {"activeSessionId": setup["activeSessionId"],
                                                    "submissionId": "gc-2"})
            assert (later["evicted"], later["freedBytes"], later["orphansRemoved"]) == ([], 0, 0)
            assert later["estimate"] == reference["estimate"]
        assert _pending_rows(root) == 0


async def test_a_different_gc_under_the_crashed_submission_id_is_a_conflict(tmp_path: Path) -> None:
    with trio.fail_after(120):
        root, setup, reference, _ = await _crashed_and_reference(tmp_path, "attachments.gc.after_mark:1")
        async with inprocess_host(root) as host, client_for(host, CLIENT, kind="ui") as c:
            with pytest.raises(RpcError) as err:
                await c.call("attachments.gc", {"submissionId": SUBMISSION})  # no active session: another request
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            assert await c.call("attachments.gc", _params(setup)) == reference
