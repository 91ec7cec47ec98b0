"""One rule for the labels a person gives things (store.rules.label_problem): a session title, a task title, a
provider name. Blank (only whitespace) or holding a control character other than tab, line feed and carriage
return (NUL, ESC, any other C0, DEL) is INVALID_PARAMS and writes nothing; what is accepted is stored as sent
(a session title trimmed, as it always was). A row stored before the rule still lists, reads, renames and deletes.

Before: a task title and a provider name of " " were stored, and a NUL or an ESC in any of the three was stored
too (a session title of "\\x00" trimmed to itself and passed the 1-80 check)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol import models as m
from runtime.client import HostClient, RpcError
from store.rules import label_problem
from tests.hostkit import client_for, inprocess_host
from tests.pipeline import probe

BLANK = (" ", "\t\n", "\u3000", "\r\n\t ")
CONTROL = ("nul\x00inside", "\x00", "esc \x1b[31m red", "bell\x07", "unit sep\x1f", "del\x7f", "\x01 start")
KEPT = ("cr\rlf\ntab\t", " padded ", "\u202e😀e\u0301 t", "\ufeffbom", "tab\tinside")


def test_label_problem_refuses_blank_and_control_characters_and_keeps_tab_newline_cr() -> None:
    for bad in BLANK + CONTROL:
        assert label_problem(bad) is not None, repr(bad)
    for good in KEPT:
        assert label_problem(good) is None, repr(good)
    assert "U+0000" in (label_problem("a\x00") or "") and "blank" in (label_problem("\u3000") or "")


async def _refused(c: HostClient, method: str, params: dict[str, Any], field: str) -> None:
    with pytest.raises(RpcError) as exc:
        await c.call(method, params)
    assert exc.value.data_code == "INVALID_PARAMS" and field in str(exc.value.data), (method, params, exc.value)


async def test_a_blank_or_control_label_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            sid = (await c.call("session.create", {"sessionId": "s1", "title": "Kept"}))["id"]
            task = await c.call("tasks.create", {"taskId": "t1", "title": "Digest", "prompt": "p"})
            await c.call("providers.create", {"id": "keep", "name": "Keep"})
            state = probe.state(data)
            for label in BLANK + CONTROL:
                await _refused(c, "tasks.create", {"title": label, "prompt": "p"}, "title")
                await _refused(c, "tasks.update", {"taskId": task["id"], "title": label}, "title")
                await _refused(c, "providers.create", {"id": "p", "name": label}, "name")
                await _refused(c, "providers.update", {"providerId": "keep", "name": label}, "name")
                await _refused(c, "session.create", {"sessionId": "s2", "title": label}, "title")
                await _refused(c, "session.rename", {"sessionId": sid, "title": label}, "title")
                assert probe.state(data) == state, f"the label {label!r} wrote something"
            for i, label in enumerate(KEPT):  # kept byte for byte (a session title trimmed, as always)
                got = await c.call("tasks.update", {"taskId": "t1", "title": label})
                assert got["title"] == label
                assert (await c.call("tasks.get", {"taskId": "t1"}))["title"] == label
                got = await c.call("providers.create", {"id": f"p{i}", "name": label})
                assert got["provider"]["name"] == label
                renamed = await c.call("session.rename", {"sessionId": sid, "title": label})
                assert renamed["title"] == label.strip()


async def test_a_stored_label_that_breaks_the_rule_still_lists_reads_renames_and_deletes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            for n in (1, 2):
                await c.call("session.create", {"sessionId": f"s{n}", "title": "t"})
                await c.call("tasks.create", {"taskId": f"t{n}", "title": "t", "prompt": "p"})
                await c.call("providers.create", {"id": f"p{n}", "name": "p"})
    with sqlite3.connect(data / "pi.sqlite") as db:  # as an older host, an import or a bundle left them
        db.execute("UPDATE sessions SET title = ? WHERE id = 's1'", ("a\x00b",))
        db.execute("UPDATE sessions SET title = ? WHERE id = 's2'", (" ",))
        db.execute("UPDATE scheduled_tasks SET title = ? WHERE id = 't1'", ("a\x00b",))
        db.execute("UPDATE scheduled_tasks SET title = ? WHERE id = 't2'", (" ",))
        db.execute("UPDATE providers SET name = ? WHERE id = 'p1'", ("a\x1bb",))
        db.execute("UPDATE providers SET name = ? WHERE id = 'p2'", (" ",))
    db.close()
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as c:
            sessions = (await c.call("session.list", {}))["sessions"]
            assert sorted(s["title"] for s in sessions) == [" ", "a\x00b"]
            assert (await c.call("session.get", {"sessionId": "s1"}))["session"]["title"] == "a\x00b"
            listed = await c.call("tasks.list", {})
            m.TasksListResult.model_validate(listed)
            assert sorted(t["title"] for t in listed["tasks"]) == [" ", "a\x00b"]
            assert (await c.call("tasks.get", {"taskId": "t2"}))["title"] == " "
            providers = await c.call("providers.list", {})
            m.ProvidersListResult.model_validate(providers)
            assert sorted(p["name"] for p in providers["providers"]) == [" ", "a\x1bb"]
            assert (await c.call("providers.get", {"providerId": "p1"}))["provider"]["name"] == "a\x1bb"
            # other fields change without the stored label being checked again
            assert (await c.call("tasks.update", {"taskId": "t1", "prompt": "q"}))["title"] == "a\x00b"
            assert (await c.call("providers.update", {"providerId": "p1", "enabled": False}))["provider"]["name"] \
                == "a\x1bb"
            # renamed to a good label, or removed
            assert (await c.call("session.rename", {"sessionId": "s1", "title": "Fixed"}))["title"] == "Fixed"
            assert (await c.call("tasks.update", {"taskId": "t1", "title": "Fixed"}))["title"] == "Fixed"
            assert (await c.call("providers.update", {"providerId": "p1", "name": "Fixed"}))["provider"]["name"] \
                == "Fixed"
            await c.call("session.delete", {"sessionId": "s2"})
            await c.call("tasks.delete", {"taskId": "t2"})
            assert (await c.call("providers.delete", {"providerId": "p2"}))["deleted"] is True
            assert [s["id"] for s in (await c.call("session.list", {}))["sessions"]] == ["s1"]
            assert [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]] == ["t1"]
            assert [p["id"] for p in (await c.call("providers.list", {}))["providers"]] == ["p1"]
