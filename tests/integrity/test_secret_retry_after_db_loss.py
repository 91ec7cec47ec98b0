"""A keyed ``secrets.set`` / ``secrets.delete`` retried after a lost or corrupt ``pi.sqlite`` has no second effect
(seed 000 §2.4: a completed receipt cannot be overwritten; README §4: a retry "returns the stored response and
has no other effect", across host restarts).

Secret values never enter the database (seed 003 §4.12), and neither did these methods' receipts outside it:
the rebuilt index had no row for them, so a retry ran the request again. A retried ``set`` whose secret had
been set again since (under another key) put the *old* value back; a retried ``delete`` removed a value set
after it. Now the secret's file remembers the keys that wrote it (and, once it is deleted, a small record
beside it does): the retry is answered what it was answered the first time and writes nothing.

Black-box, on real host processes, as ``test_db_loss_receipts``: the data directory is built through the
wire, the host stopped, the database removed (with its ``-wal``/``-shm``) or its header overwritten, the
host started again, the calls retried.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.hostkit import call_killed_at
from tests.integrity.test_db_loss_receipts import _damage, _on_host

REF = "provider/acme"


async def _value(c: HostClient, ref: str = REF) -> str | None:
    try:
        return str((await c.call("secrets.get", {"ref": ref}))["value"])
    except RpcError as exc:
        assert exc.data_code == "NOT_FOUND"
        return None


async def _listed(c: HostClient) -> list[str]:
    return [s["ref"] for s in (await c.call("secrets.list", {}))["secrets"]]


def _set(key: str, value: str, ref: str = REF) -> tuple[str, dict[str, Any]]:
    return "secrets.set", {"ref": ref, "value": value, "ownerKind": "provider", "ownerId": "acme",
                           "submissionId": key}


def _delete(key: str, ref: str = REF) -> tuple[str, dict[str, Any]]:
    return "secrets.delete", {"ref": ref, "submissionId": key}


async def _run(tmp_path: Path, how: str, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Make ``calls`` on a host, lose its database, retry every call (oldest first) on a new host."""
    answers: list[Any] = []

    async def build(c: HostClient) -> dict[str, Any]:
        for method, params in calls:
            answers.append(await c.call(method, params))
        return {"value": await _value(c), "listed": await _listed(c)}

    async def retry(c: HostClient) -> dict[str, Any]:
        retried = [await c.call(method, params) for method, params in calls]
        again = [await c.call(method, params) for method, params in calls]  # answered from the rows now
        state = {"value": await _value(c), "listed": await _listed(c)}
        probe = await c.call("secrets.set", {"ref": "probe", "value": "p"})  # the host still writes
        return {"retried": retried, "again": again, "state": state, "probe": probe["version"]}

    with trio.fail_after(60):
        before = await _on_host(tmp_path, build)
        _damage(tmp_path, how)
        after = await _on_host(tmp_path, retry)
    assert after["retried"] == answers, "a retry after the loss answered otherwise than the first time"
    assert after["again"] == answers
    assert after["probe"] == 1
    return {"before": before, "after": after["state"], "answers": answers}


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_set_retried_after_a_newer_set_does_not_put_the_old_value_back(tmp_path: Path, how: str) -> None:
    got = await _run(tmp_path, how, [_set("k-a", "v1"), _set("k-b", "v2")])
    assert [a["version"] for a in got["answers"]] == [1, 2]
    assert got["before"] == got["after"] == {"value": "v2", "listed": [REF]}


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_set_retried_after_a_delete_does_not_bring_the_secret_back(tmp_path: Path, how: str) -> None:
    got = await _run(tmp_path, how, [_set("k-a", "v1"), _delete("k-d")])
    assert got["answers"][1] == {"ref": REF, "deleted": True}
    assert got["before"] == got["after"] == {"value": None, "listed": []}


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
async def test_a_delete_retried_after_a_newer_set_does_not_remove_it(tmp_path: Path, how: str) -> None:
    got = await _run(tmp_path, how, [_set("k-a", "v1"), _delete("k-d"), _set("k-b", "v2")])
    assert [a.get("version") for a in got["answers"]] == [1, None, 1]
    assert got["before"] == got["after"] == {"value": "v2", "listed": [REF]}


async def test_a_delete_of_nothing_retried_after_a_set_does_not_remove_it(tmp_path: Path) -> None:
    got = await _run(tmp_path, "deleted", [_delete("k-d"), _set("k-a", "v1"), _set("k-b", "v2")])
    assert got["answers"][0] == {"ref": REF, "deleted": False}
    assert got["before"] == got["after"] == {"value": "v2", "listed": [REF]}


async def test_many_rotations_keep_every_recent_key(tmp_path: Path) -> None:
    """Set, delete and set again, many times over, under one ref: every key is answered, nothing written."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for i in range(6):
        calls += [_set(f"k-{i}a", f"v{i}a"), _set(f"k-{i}b", f"v{i}b"), _delete(f"k-{i}d")]
    calls.append(_set("k-last", "last"))
    got = await _run(tmp_path, "deleted", calls)
    assert got["before"] == got["after"] == {"value": "last", "listed": [REF]}


@pytest.mark.parametrize("point", ["secrets.set.before_commit", "secrets.delete.before_commit"])
async def test_a_call_killed_before_its_row_and_then_the_database_lost_is_answered_once(
        tmp_path: Path, point: str) -> None:
    """SIGKILL between the file and the row, then the database lost too: the killed call's retry finishes it
    once, and the call before it is still answered from the file."""
    first_method, first_params = _set("k-a", "v1")
    killed_method, killed_params = _set("k-b", "v2") if point.startswith("secrets.set") else _delete("k-d")

    async def build(c: HostClient) -> Any:
        return await c.call(first_method, first_params)

    async def retry(c: HostClient) -> dict[str, Any]:
        return {"first": await c.call(first_method, first_params),
                "killed": [await c.call(killed_method, killed_params) for _ in range(2)],
                "value": await _value(c), "listed": await _listed(c)}

    with trio.fail_after(90):
        first = await _on_host(tmp_path, build)
        await call_killed_at(tmp_path, point, killed_method, killed_params, client_id="ui-1")
        _damage(tmp_path, "deleted")
        got = await _on_host(tmp_path, retry)
    assert got["first"] == first
    if killed_method == "secrets.set":
        assert [a["version"] for a in got["killed"]] == [2, 2]
        assert (got["value"], got["listed"]) == ("v2", [REF])
    else:
        assert got["killed"] == [{"ref": REF, "deleted": True}] * 2
        assert (got["value"], got["listed"]) == (None, [])
