"""protocol/README.md's error codes, read as a client codes its branches from them: each method's
**Errors** line (generated from ``protocol.methods``) names every code the host can answer it with, and
the error table's meanings say where a client meets each code. Each test names its finding."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import EVENTS, METHODS
from runtime.client import HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import shared_host
from tests.hostkit import HostProcess, msg

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "protocol" / "README.md").read_text(encoding="utf-8")
GUIDE = REFERENCE.split("\n# Reference\n", 1)[0]
NATIVE = "native-pi:0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"


def _session_keys(method: str) -> list[str]:
    """The params of ``method`` that name a session (the pipeline refuses a native pi id in each)."""
    fields = METHODS[method].params_model.model_fields
    return [f.alias or name for name, f in fields.items()
            if (f.alias or name) == "sessionId" or (f.alias or name).endswith("SessionId")]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from shared_host(tmp_path_factory, "error-listing")


async def _code(c: HostClient, method: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    with pytest.raises(RpcError) as failed:
        await c.call(method, params)
    return failed.value.data_code, failed.value.data


def test_every_method_naming_a_session_lists_the_native_refusal() -> None:
    """Finding: the pipeline refuses a native pi session id (``native-pi:...``) in any param naming a session
    with ``UNSUPPORTED_FOR_NATIVE_SESSION`` (§2 "Ids": "every other method refuses one"), but 18 methods with
    a ``sessionId`` (``approvals.pending``, ``attachments.ref``, ``search.query``, ``session.create``,
    ``tasks.startRun``, ``usage.session`` ...) did not list the code among their errors."""
    missing = [name for name in sorted(METHODS)
               if _session_keys(name) and "UNSUPPORTED_FOR_NATIVE_SESSION" not in METHODS[name].errors]
    assert missing == []


async def test_a_native_id_in_each_session_param_is_refused_with_a_listed_code(host: HostProcess) -> None:
    """§2 "Ids": a native pi session id in any session param of a method that does not serve one is
    ``UNSUPPORTED_FOR_NATIVE_SESSION`` (naming the method and the id), and the method lists that code."""
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="native-sweep", client_kind="agent") as c:
            for name in ("approvals.pending", "attachments.ref", "search.query", "usage.session", "audit.list"):
                [key] = _session_keys(name)
                code, data = await _code(c, name, {key: NATIVE})
                assert code == "UNSUPPORTED_FOR_NATIVE_SESSION" and code in METHODS[name].errors, name
                assert data["method"] == name and data["sessionId"] == NATIVE


@pytest.mark.parametrize("method", ["session.turnEnvironment", "settings.get", "host.status"])
async def test_a_native_id_under_a_key_the_method_does_not_take_is_an_unknown_key(
        host: HostProcess, method: str) -> None:
    """Finding: §2 "Params are strict. An unknown key fails" (``INVALID_PARAMS``, ``extra_forbidden``), yet a
    ``sessionId`` the method does not take was answered ``UNSUPPORTED_FOR_NATIVE_SESSION`` when its value
    was a native id (an ordinary id got ``INVALID_PARAMS``): ``session.turnEnvironment`` (params ``turnId``
    only), ``settings.get``, ``host.status`` — a code none of them lists. Both spellings are one answer."""
    base: dict[str, Any] = {"session.turnEnvironment": {"turnId": "t1"}, "settings.get": {"key": "theme"},
                            "host.status": {}}[method]
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id=f"unknown-key-{method}", client_kind="agent") as c:
            answers = []
            for value in (NATIVE, "s_plain"):
                code, data = await _code(c, method, {**base, "sessionId": value})
                answers.append((code, [(e["loc"], e["type"]) for e in data["errors"]]))
            assert answers == [("INVALID_PARAMS", [("sessionId", "extra_forbidden")])] * 2
            assert "INVALID_PARAMS" in METHODS[method].errors


async def test_start_turn_lists_what_a_retry_of_an_unknown_or_running_turn_gets(host: HostProcess) -> None:
    """Finding: ``session.startTurn {retryOf}`` naming a turn the session does not have is ``NOT_FOUND``
    (``data.field: "retryOf"``), a code its Errors line did not list; one still running is ``CONFLICT``."""
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="retry-of", client_kind="agent") as c:
            sid = (await c.call("session.create", {"title": "retries"}))["id"]
            code, data = await _code(c, "session.startTurn", {"sessionId": sid, "turnId": "t2", "retryOf": "nope"})
            assert (code, data.get("field")) == ("NOT_FOUND", "retryOf")
            assert code in METHODS["session.startTurn"].errors
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "go")})
            code, _ = await _code(c, "session.startTurn", {"sessionId": sid, "turnId": "t2", "retryOf": "t1"})
            assert code == "CONFLICT" and code in METHODS["session.startTurn"].errors
            assert (await c.call("session.listTurns", {"sessionId": sid}))["turns"][0]["id"] == "t1"


def test_codes_never_sent_on_the_wire_say_where_they_are_met() -> None:
    """Finding: the error table listed ``SCHEMA_TOO_NEW`` and ``UNSUPPORTED_SQLITE`` like answers a request
    can get; no request can (the host refuses to start: ``pi-host serve`` exits with the code before it
    serves). Their meanings now say so, so a client does not write a branch that never runs."""
    table = REFERENCE.split("### Error codes", 1)[1].split("## Methods", 1)[0]
    rows = {cells[0].strip("` "): cells[3] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines() if line.startswith("| `"))}
    for code in ("SCHEMA_TOO_NEW", "UNSUPPORTED_SQLITE"):
        assert "never an answer to a request" in rows[code], code
        assert not any(code in spec.errors for spec in METHODS.values()), code


# Dotted names in the guide that are fields or files, not methods or topics (`session.messageCount`: a
# summary's field; `settings.damaged`: a doctor finding; `providers.order`: a kv key; `usage.cost`: a field;
# `host.json`: the file the host writes).
NOT_WIRE_NAMES = frozenset({
    "host.json", "session.messageCount", "settings.damaged", "settings.groupRowKept", "settings.groupRowOrphaned",
    "providers.order", "usage.cost",
})


def test_every_method_and_topic_the_guide_names_exists() -> None:
    """The prose part of protocol/README.md (above the generated reference) names methods and topics by
    `area.name`; each one in an area the host serves must be a registered method or event topic, so a
    renamed or removed method cannot linger in the guide (the generated reference is checked against the
    registry by test_schema_drift)."""
    areas = {name.split(".", 1)[0] for name in (*METHODS, *EVENTS)}
    named = set(re.findall(r"`([a-zA-Z]+\.[a-zA-Z]+)\b", GUIDE))
    unknown = sorted(n for n in named if n.split(".", 1)[0] in areas and n not in METHODS and n not in EVENTS
                     and n not in NOT_WIRE_NAMES)
    assert unknown == []


def test_reads_behind_the_index_barrier_list_what_a_full_disk_answers() -> None:
    """Finding: a read that must see every acknowledged append waits for the index (§4 "When an append is
    acknowledged"); while the disk is full that wait ends with ``STORAGE_FULL`` (or ``IO_ERROR``), as the
    full-disk tests met on ``session.list`` — a code ``session.list``, ``search.*``, ``audit.list``,
    ``artifacts.list``, ``sessions.listTrashed`` and ``plugins.listSessions`` did not list. The session
    reads wait for their session's own appends the same way."""
    from runtime.routes import ROUTES, Via

    behind = sorted({name for name, route in ROUTES.items() if route.barrier} | {"session.list"}
                    | {name for name, route in ROUTES.items() if route.via is Via.SESSION})
    missing = [(name, code) for name in behind for code in ("STORAGE_FULL", "IO_ERROR")
               if code not in METHODS[name].errors]
    assert missing == []


async def test_finish_run_of_an_unknown_session_is_a_listed_code(host: HostProcess) -> None:
    """Finding: ``tasks.finishRun {sessionId}`` naming no session is ``SESSION_NOT_FOUND`` (as
    ``tasks.startRun`` lists), a code its Errors line did not list."""
    with trio.fail_after(60):
        async with open_client(host.url, host.token, client_id="finish-run", client_kind="agent") as c:
            await c.call("tasks.create", {"taskId": "t-finish", "title": "T", "prompt": "p", "cadence": "manual"})
            run = await c.call("tasks.startRun", {"taskId": "t-finish"})  # the run itself
            code, _ = await _code(c, "tasks.finishRun", {"runId": run["id"], "status": "completed",
                                                        "sessionId": "s_nope"})
            assert code == "SESSION_NOT_FOUND" and code in METHODS["tasks.finishRun"].errors
