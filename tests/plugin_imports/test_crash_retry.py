"""``plugins.importSession`` SIGKILLed at each step, restarted, retried with the same clientId + submissionId.

The import stages the transcript, links it, then commits the rows, the origin row and the receipt in one
transaction. Killed after the link (before the commit), boot indexes the orphan transcript with the origin
its ``session_info`` line carries. The retry used to answer ``created: false`` ("imported before; nothing was
written") where the crash-free run answers ``created: true``, and the origin row boot rebuilt had lost the
origin's history (title, importRules, files, the model the messages named) and its time. Now the transcript
header carries the receipt record (the retry finds its own import: ``created: true``) and the
``session_info`` line the whole origin row, so both are what a crash-free run leaves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient, RpcError
from tests.dbkit import rows as _rows
from tests.hostkit import call_killed_at, client_for, index_caught_up, inprocess_host, msg

PLUGIN = "chat-plugin"
CLIENT = "plugin-rt"
KIND = f"plugin:{PLUGIN}"
PARAMS: dict[str, Any] = {
    "sourceId": "chatlog", "externalId": "conv-81", "title": "Parser ideas", "sourceLabel": "Chat Log",
    # no providerId in the history: the one the messages name fills it (a crash-free import's rule)
    "history": {"projectPath": "/elsewhere/parser", "modelId": "gpt-x"},
    "messages": [msg("u1", "how do I split the lexer"),
                 msg("a1", "move it to lexer.py", role="assistant", meta={"providerId": "oai", "modelId": "gpt-y"})],
    "submissionId": "imp-1",
}

POINTS = [
    ("import.after_link", 1),  # the transcript is published, nothing committed: boot indexes it
    ("plugins.importSession.before_commit", 1),  # the same, from the pipeline's side
    ("plugins.importSession.after_commit", 1),  # committed, not answered
]


def _origin_row(root: Path) -> dict[str, Any]:
    """The session's one origin row (its history parsed), with the session's own creation time."""
    rows = _rows(root, "SELECT o.plugin_id, o.source_id, o.external_id, o.session_id, o.source_label, "
                       "o.origin_json, o.created_at, s.created_at FROM session_import_origins o "
                       "JOIN sessions s ON s.id = o.session_id")
    assert len(rows) == 1, rows
    plugin, source, external, sid, label, origin, at, session_at = rows[0]
    return {"pluginId": plugin, "sourceId": source, "externalId": external, "sessionId": sid, "label": label,
            "origin": orjson.loads(origin), "createdAt": at, "sessionCreatedAt": session_at}


async def _state(c: HostClient, root: Path, sid: str) -> dict[str, Any]:
    """What a person sees of the import, and the rows and files it made."""
    listed = (await c.call("plugins.listSessions", {"includeTrashed": True}))["sessions"]
    for item in listed:
        for key in ("createdAt", "updatedAt"):
            item.pop(key, None)
    got = await c.call("session.get", {"sessionId": sid, "full": True})
    files = sorted(p.name for p in (root / "sessions").iterdir() if not p.name.startswith("."))
    return {"listed": listed, "messages": [(m["id"], m["role"]) for m in got["messages"]],
            "files": files, "sessions": _rows(root, "SELECT id, title, source, project_id, model_id FROM sessions"),
            "receipts": _rows(root, "SELECT method, response_json FROM command_receipts WHERE submission_id = ?",
                              PARAMS["submissionId"])}


async def _crash_free(root: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    async with inprocess_host(root) as host, client_for(host, CLIENT, KIND) as c:
        answer = await c.call("plugins.importSession", PARAMS)
        assert await c.call("plugins.importSession", PARAMS) == answer
        await index_caught_up(host)
        state = await _state(c, root, answer["sessionId"])
    return answer, state, _origin_row(root)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    return trio.run(_crash_free, tmp_path_factory.mktemp("import-ref") / "data")


async def _killed_during_import(root: Path, point: str, nth: int) -> None:
    await call_killed_at(root, point, "plugins.importSession", PARAMS, nth=nth, client_id=CLIENT,
                         client_kind="plugin", plugin_id=PLUGIN)


def test_a_crash_free_import_keeps_its_whole_origin(reference: tuple[Any, dict[str, Any], dict[str, Any]]) -> None:
    answer, state, origin = reference
    assert answer == {"sessionId": answer["sessionId"], "created": True, "messageCount": 2}
    assert origin["origin"] == {"files": {}, "projectPath": "/elsewhere/parser", "title": "Parser ideas",
                                "modelId": "gpt-x", "importRules": origin["origin"]["importRules"],
                                "providerId": "oai"}
    assert origin["createdAt"] == origin["sessionCreatedAt"]  # the import's time (messages carry none)
    assert len(state["receipts"]) == 1


@pytest.mark.parametrize(("point", "nth"), POINTS)
async def test_an_import_killed_at_any_step_is_answered_and_kept_as_without_the_crash(
        tmp_path: Path, reference: tuple[Any, dict[str, Any], dict[str, Any]], point: str, nth: int) -> None:
    ref_answer, ref_state, ref_origin = reference
    root = tmp_path / "data"
    await _killed_during_import(root, point, nth)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, KIND) as c:
            first = await c.call("plugins.importSession", PARAMS)
            assert first == ref_answer, f"killed at {point}:{nth}: the retry's answer is not the crash-free one"
            assert await c.call("plugins.importSession", PARAMS) == first
            # a new request for the same key is the "imported before" answer, as without the crash
            other = await c.call("plugins.importSession", {**PARAMS, "submissionId": "imp-2"})
            assert other == {**ref_answer, "created": False}
            await index_caught_up(host)
            state = await _state(c, root, first["sessionId"])
    assert state == ref_state
    origin = _origin_row(root)
    assert {k: v for k, v in origin.items() if k not in ("createdAt", "sessionCreatedAt")} == \
        {k: v for k, v in ref_origin.items() if k not in ("createdAt", "sessionCreatedAt")}
    assert origin["createdAt"] == origin["sessionCreatedAt"], "the origin row's time is not the import's"


async def test_another_request_with_the_key_of_a_killed_import_is_an_idempotency_conflict(tmp_path: Path) -> None:
    """The receipt the header carries is the request's: the same key with other params is not its retry."""
    root = tmp_path / "data"
    await _killed_during_import(root, "import.after_link", 1)
    with trio.fail_after(60):
        async with inprocess_host(root) as host, client_for(host, CLIENT, KIND) as c:
            with pytest.raises(RpcError) as err:
                await c.call("plugins.importSession", {**PARAMS, "title": "Another title"})
            assert err.value.data_code == "IDEMPOTENCY_CONFLICT"
            assert (await c.call("plugins.importSession", PARAMS))["created"] is True
