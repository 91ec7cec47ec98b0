"""The logs layout (seed 003 §2): "logs/ # NDJSON app/<category>, host/<category>, agent/<category> logs".

The host writes ``logs/host/host.ndjson``; the app and the agent sidecar
append theirs with ``logs.append`` into ``logs/app/<category>.ndjson`` and
``logs/agent/<category>.ndjson``, rotated by size, files 0600, every call
bounded and its category checked before a path is built.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol import models as m
from runtime.client import RpcError
from runtime.logs import LOG_NAME, ClientLogLimits, ClientLogs, setup_logging, teardown_logging
from store.errors import InvalidInput, IOFailure, LimitExceeded
from tests.hostkit import client_for, inprocess_host, start_host_process


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


async def _error(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def test_app_and_agent_records_land_in_their_category_files(tmp_path: Path) -> None:
    """§2: "logs/ # NDJSON app/<category>, host/<category>, agent/<category> logs" - one file per
    source and category, one line per record, files 0600 in 0700 folders."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host:
            async with client_for(host, "desktop", kind="ui") as ui:
                got = await ui.call("logs.append", {"source": "app", "category": "renderer",
                                                    "records": [{"level": "info", "msg": "window shown"}]})
                m.LogsAppendResult.model_validate(got)
                assert (got["written"], got["file"]) == (1, "logs/app/renderer.ndjson")
            async with client_for(host, "sidecar", kind="agent") as agent:
                records = [{"level": "info", "msg": f"tool {i}", "sessionId": "s1"} for i in range(3)]
                got = await agent.call("logs.append", {"source": "agent", "category": "tools", "records": records})
                assert got["written"] == 3
    logs = tmp_path / "logs"
    app = _lines(logs / "app" / "renderer.ndjson")
    assert [(r["clientId"], r["record"]) for r in app] == [("desktop", {"level": "info", "msg": "window shown"})]
    agent_lines = _lines(logs / "agent" / "tools.ndjson")
    assert [r["record"] for r in agent_lines] == records and all(isinstance(r["ts"], int) for r in agent_lines)
    assert got["bytes"] == (logs / "agent" / "tools.ndjson").stat().st_size
    for path in (logs / "app" / "renderer.ndjson", logs / "agent" / "tools.ndjson"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in ("app", "agent"):
        assert stat.S_IMODE((logs / folder).stat().st_mode) == 0o700
    # the host's own log (host/host.ndjson) is set up by `pi-host serve`: test_an_older_top_level_host_log_moves_
    # into_host and tests/hostile/test_secret_edges.py::test_log_files_are_created_0600 (a real process)


def test_category_files_rotate_within_their_bounds(tmp_path: Path) -> None:
    """§2 ("rotated", issue 24 part 7): past max_bytes a category file rotates to .1, .2, ...; only
    keep_files rotated files stay, so a category never takes more than (keep_files + 1) x max_bytes."""
    old = os.umask(0o022)
    try:
        sink = ClientLogs(tmp_path, ClientLogLimits(max_bytes=2048, keep_files=2))
        for i in range(200):
            sink.append("agent", "chatty", [json.dumps({"i": i, "pad": "x" * 60})])
    finally:
        os.umask(old)
    folder = tmp_path / "agent"
    assert sorted(os.listdir(folder)) == ["chatty.ndjson", "chatty.ndjson.1", "chatty.ndjson.2"]
    assert all(p.stat().st_size <= 2048 for p in folder.iterdir())
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())  # rotated and new alike
    assert json.loads((folder / "chatty.ndjson").read_text().splitlines()[-1])["i"] == 199  # newest kept
    older = [json.loads(line)["i"] for line in (folder / "chatty.ndjson.1").read_text().splitlines()]
    newer = [json.loads(line)["i"] for line in (folder / "chatty.ndjson").read_text().splitlines()]
    assert max(older) < min(newer)


@pytest.mark.parametrize("category", ["../escape", "A", "", "a/b", ".hidden", "-dash", "x" * 65, "tab\t", "é"])
async def test_a_bad_category_is_refused_before_any_path_is_built(tmp_path: Path, category: str) -> None:
    """§2 and issue 24 part 7: "category validated against a strict pattern before any path is built" -
    INVALID_PARAMS, nothing created inside or outside logs/."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            # this test's folder whole, and what lies beside it (the worker's other tests' folders are not
            # walked: they grow with the run)
            before = _files(tmp_path), set(os.listdir(tmp_path.parent))
            err = await _error(c.call("logs.append", {"source": "app", "category": category,
                                                      "records": [{"msg": "x"}]}))
            assert err.data_code == "INVALID_PARAMS"
            assert _files(tmp_path) - before[0] <= {str(Path("logs") / "host" / LOG_NAME)}
            assert set(os.listdir(tmp_path.parent)) == before[1]
    assert not (tmp_path / "logs" / "app").exists()
    with pytest.raises(InvalidInput):  # the host's own check, behind the model's
        ClientLogs(tmp_path / "logs").path("app", category)
    with pytest.raises(InvalidInput):
        ClientLogs(tmp_path / "logs").path("host", "fine")  # the host's folder is not the clients'


async def test_each_call_is_bounded_and_refused_whole(tmp_path: Path) -> None:
    """Issue 24 part 7: "per-call byte/record limits beside the wire model" - too many records, one
    record too big, or too many bytes together: refused, nothing written."""
    big = {"msg": "y" * (m.MAX_LOG_RECORD_BYTES + 1)}
    near = {"msg": "z" * (m.MAX_LOG_RECORD_BYTES - 100)}
    count = m.MAX_LOG_APPEND_BYTES // m.MAX_LOG_RECORD_BYTES + 2
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for records, code in (([{"msg": "x"}] * (m.MAX_LOG_RECORDS + 1), "INVALID_PARAMS"),
                                  ([], "INVALID_PARAMS"),
                                  ([{"msg": "ok"}, big], "PAYLOAD_TOO_LARGE"),
                                  ([near] * count, "PAYLOAD_TOO_LARGE")):
                err = await _error(c.call("logs.append", {"source": "agent", "category": "bounded",
                                                          "records": records}))
                assert err.data_code == code
            ok = await c.call("logs.append", {"source": "agent", "category": "bounded",
                                              "records": [{"msg": "x"}] * m.MAX_LOG_RECORDS})
            assert ok["written"] == m.MAX_LOG_RECORDS
    assert len(_lines(tmp_path / "logs" / "agent" / "bounded.ndjson")) == m.MAX_LOG_RECORDS


async def test_a_connection_writes_its_own_source_only(tmp_path: Path) -> None:
    """§2: app/ is the app's, agent/ the sidecar's: a ui connection cannot write agent/ and an agent
    connection cannot write app/ (PERMISSION_DENIED, nothing written)."""
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host:
            async with client_for(host, "desktop", kind="ui") as ui:
                err = await _error(ui.call("logs.append", {"source": "agent", "category": "x",
                                                           "records": [{"m": 1}]}))
                assert err.data_code == "PERMISSION_DENIED"
            async with client_for(host, "sidecar", kind="agent") as agent:
                err = await _error(agent.call("logs.append", {"source": "app", "category": "x",
                                                              "records": [{"m": 1}]}))
                assert err.data_code == "PERMISSION_DENIED"
            async with client_for(host) as c:
                err = await _error(c.call("logs.append", {"source": "host", "category": "x",
                                                          "records": [{"m": 1}]}))
                assert err.data_code == "INVALID_PARAMS"  # the host's log is written by the host only
    assert not (tmp_path / "logs" / "app").exists() and not (tmp_path / "logs" / "agent").exists()


def test_categories_per_source_are_bounded(tmp_path: Path) -> None:
    """Issue 24 part 7 ("bounded"): a client cannot create files without end - at most max_categories
    per source; existing categories keep working."""
    sink = ClientLogs(tmp_path, ClientLogLimits(max_categories=2))
    sink.append("app", "one", ["{}"])
    sink.append("app", "two", ["{}"])
    with pytest.raises(LimitExceeded):
        sink.append("app", "three", ["{}"])
    sink.append("app", "one", ['{"again": true}'])
    sink.append("agent", "one", ["{}"])  # the other source has its own budget
    assert sorted(os.listdir(tmp_path / "app")) == ["one.ndjson", "two.ndjson"]
    assert (tmp_path / "app" / "one.ndjson").read_text() == '{}\n{"again": true}\n'


def test_a_symlinked_category_file_is_not_followed(tmp_path: Path) -> None:
    """§2 (files 0600, host-owned): a category file replaced by a symlink is refused (IO_ERROR), the
    link's target is neither written nor chmod'ed."""
    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    outside.chmod(0o644)
    (tmp_path / "logs" / "agent").mkdir(parents=True)
    (tmp_path / "logs" / "agent" / "evil.ndjson").symlink_to(outside)
    with pytest.raises(IOFailure):
        ClientLogs(tmp_path / "logs").append("agent", "evil", ["{}"])
    assert outside.read_text() == "mine\n" and stat.S_IMODE(outside.stat().st_mode) == 0o644


def test_an_older_top_level_host_log_moves_into_host(tmp_path: Path) -> None:
    """§2: the host's log is host/<category>: a logs/host.ndjson (and its rotated files) an older host
    wrote is moved into logs/host/ at start; other files in logs/ stay."""
    (tmp_path / LOG_NAME).write_text(json.dumps({"ts": int(time.time() * 1000), "msg": "old"}) + "\n")
    (tmp_path / f"{LOG_NAME}.20260101T000000.000Z").write_text('{"ts": 0, "msg": "older"}\n')
    (tmp_path / "notes.txt").write_text("keep\n")
    logs = setup_logging(tmp_path, stderr=False)
    try:
        logging.getLogger("pi_host").info("new")
    finally:
        teardown_logging(logs)
    assert [r["msg"] for r in _lines(tmp_path / "host" / LOG_NAME)] == ["old", "new"]
    assert (tmp_path / "host" / f"{LOG_NAME}.20260101T000000.000Z").exists()
    assert sorted(os.listdir(tmp_path)) == ["host", "notes.txt"]


async def test_sigterm_leaves_the_host_log_complete(tmp_path: Path) -> None:
    """The host's records are written by a writer thread from a queue: a SIGTERM (an orderly stop) still
    leaves every record in the file, the last ones of the shutdown included (serve stops the writer, which
    writes what is queued, before the process exits)."""
    host = await trio.to_thread.run_sync(lambda: start_host_process(tmp_path))
    try:
        # host.json comes before the freeze and the read warm-up: a SIGTERM then is "stop asked for before the
        # host serves" (an orderly stop all the same); this test is about the serving host's shutdown records
        log_file = tmp_path / "logs" / "host" / LOG_NAME
        with trio.fail_after(30):
            for _ in itertools.count():
                if log_file.exists() and "listening" in [r["msg"] for r in _lines(log_file)]:
                    break
                await trio.sleep(0.02)
        assert await trio.to_thread.run_sync(host.terminate) == 0
    finally:
        await trio.to_thread.run_sync(host.kill9)
    messages = [r["msg"] for r in _lines(tmp_path / "logs" / "host" / LOG_NAME)]
    assert "listening" in messages and "shutting down" in messages
    assert messages.index("shutting down") < messages.index("shutdown: actors ended")
