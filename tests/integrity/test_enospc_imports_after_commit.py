"""An import whose index commit took place and then failed (an ``EIO`` / ``ENOSPC`` once the commit may have
happened: the outcome the caller is told is unknown) keeps the transcript its rows name.

The index step answers a ``StoreError`` for an error after its ``COMMIT`` as for one before it. The import
undid its published transcript on any ``StoreError``: its rows stayed, naming a file that no longer existed,
and the imported session read as empty (``import.sessions``) or its messages were gone for good
(``plugins.importSession``, whose retry answered ``created: true`` from the committed receipt). Now an undo
first reads whether the rows landed; they did, so the transcript stays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from tests.hostkit import client_for, index_caught_up, inprocess_host
from tests.imports import test_crash_retry as imports
from tests.plugin_imports import test_crash_retry as plugin

CODES = {"enospc": "STORAGE_FULL", "eio": "IO_ERROR"}
ACTIONS = pytest.mark.parametrize("action", ["enospc", "eio"])


@ACTIONS
async def test_a_plugin_import_that_failed_after_its_commit_keeps_its_messages(tmp_path: Path, action: str) -> None:
    root = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, plugin.CLIENT, plugin.KIND) as c:
            await index_caught_up(host)
            host.faults.add("index.after_commit", nth=1, action=action)
            with pytest.raises(RpcError) as failed:
                await c.call("plugins.importSession", plugin.PARAMS)
            host.faults.clear()
            assert failed.value.data_code == CODES[action]
            retried = await c.call("plugins.importSession", plugin.PARAMS)
            assert retried["created"] is True and retried["messageCount"] == 2
            got = await c.call("session.get", {"sessionId": retried["sessionId"], "full": True})
            assert [m["id"] for m in got["messages"]] == [f"{retried['sessionId']}:{i}" for i in ("u1", "a1")]
        async with inprocess_host(root) as host, client_for(host, plugin.CLIENT, plugin.KIND) as c:
            got = await c.call("session.get", {"sessionId": retried["sessionId"], "full": True})
            assert [m["id"] for m in got["messages"]] == [f"{retried['sessionId']}:{i}" for i in ("u1", "a1")]
            assert await c.call("plugins.importSession", plugin.PARAMS) == retried


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    return trio.run(imports._crash_free, tmp_path_factory.mktemp("ref-fresh"), "fresh")


@ACTIONS
@pytest.mark.parametrize("nth", [1, 3])
async def test_an_import_that_failed_after_a_commit_ends_as_a_crash_free_import(
        tmp_path: Path, reference: tuple[Any, dict[str, Any]], action: str, nth: int) -> None:
    _, ref_state = reference
    src, data = await imports._setup(tmp_path, "fresh")
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, imports.CLIENT, "ui") as c:
            await index_caught_up(host)
            host.faults.add("index.after_commit", nth=nth, action=action)
            await c.call("import.sessions", imports._params(src))
            assert host.faults.hits("index.after_commit") >= nth  # the fault fired inside the import
            host.faults.clear()
            await index_caught_up(host)
            states = [await imports._state(c, data)]
        async with inprocess_host(data) as host, client_for(host, imports.CLIENT, "ui") as c:
            states.append(await imports._state(c, data))  # after a restart, before any re-import
    for when, state in zip(("at once", "after a restart"), states, strict=True):
        assert state.keys() == ref_state.keys(), when
        for key, ref in ref_state.items():
            assert state[key] == ref, f"{action} after commit {nth}, {when}: {key} differs from a crash-free import's"
