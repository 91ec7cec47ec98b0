"""Seed 003's DB-held features (§4.1 settings, §4.6b the turn queue, §4.11 scheduled tasks, §4.3 providers)
probed by an outsider from a user's side: black-box, over WebSocket, against real ``pi-host serve``
processes. Each probe quotes the sentence it checks and aims where the other outsider modules do not: odd
JSON at the edges of what the wire takes, titles and keys at their length limits in unicode, the queue
under two connections at once, and keyed writes whose host died right after the commit. Probes that need
no restart share one host (``shared``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from tests.acceptance.outsiderkit import all_at_once, client, code_of, data_dir, outcome, real_host, shared_host
from tests.hostkit import HostProcess, call_killed_at, start_host_process
from tests.httpkit import FakeProvider, Reply


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostProcess]:
    """One host for the probes that need no restart (each uses ids and keys of its own)."""
    yield from shared_host(tmp_path_factory, "dbstate")


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# ------------------------------------------------------------------------------------ §4.1 settings

async def test_a_settings_value_nested_too_deep_is_answered_under_its_own_id_and_changes_nothing(
        shared: HostProcess) -> None:
    """protocol/README "JSON input must be strict ... very deep nesting ... fail with PARSE_ERROR"; §4.1 kv
    value_json holds "JSON". A ``settings.set`` whose value is nested a few levels past the host's limit is
    well-formed JSON whose ``id`` is plain to read: the caller gets its PARSE_ERROR as the answer to its
    call (not an ``id: null`` error its client cannot match, leaving the call waiting for ever), the key
    stays as it was, and the connection serves the next call."""
    with trio.fail_after(30):
        async with client(shared) as c:
            await c.call("settings.set", {"ns": "ui", "key": "deep", "value": nested(60)})
            for depth in (63, 70, 200):
                with trio.fail_after(10):
                    with pytest.raises(RpcError) as refused:
                        await c.call("settings.set", {"ns": "ui", "key": "deep", "value": nested(depth)})
                assert refused.value.data_code == "PARSE_ERROR", depth
            assert (await c.call("settings.get", {"ns": "ui", "key": "deep"}))["value"] == nested(60)


ODD_VALUES: list[Any] = [
    2**63 - 1, -(2**63), 0, -0.0, 1.5e308, 5e-324, "", "\u0000\u202e\ufeff", "🎉" * 1000, [], {},
    {"": None, "ключ": {"深い": [True, False, None, 1, -1, 0.5]}}, nested(58),
]


async def test_odd_json_values_and_unicode_keys_round_trip_exactly_in_settings(shared: HostProcess) -> None:
    """§4.1: "A namespace (ns) holds keys with JSON values" (protocol/README 8.1: keys 1-512 characters):
    int64 edges, subnormal and huge doubles, NUL, bidi and BOM characters, astral unicode, empty containers,
    unicode keys at 512 characters, deep-but-allowed nesting. Each reads back exactly from get and getAll;
    a 513-character key is INVALID_PARAMS and writes nothing."""
    with trio.fail_after(30):
        async with client(shared) as c:
            ns = "oddjson"
            keys = [f"k{i}" for i in range(len(ODD_VALUES))] + ["🎉" * 512, "\u0000", "a/b\\c", "é" * 512]
            values = ODD_VALUES + ["astral", "nul", "slashes", "accents"]
            for key, value in zip(keys, values, strict=True):
                await c.call("settings.set", {"ns": ns, "key": key, "value": value})
            for key, value in zip(keys, values, strict=True):
                got = (await c.call("settings.get", {"ns": ns, "key": key}))["value"]
                assert got == value and type(got) is type(value), key
            every = (await c.call("settings.getAll", {"ns": ns}))["values"]
            assert every == dict(zip(keys, values, strict=True))
            assert await code_of(c, "settings.set", {"ns": ns, "key": "x" * 513, "value": 1}) == "INVALID_PARAMS"
            assert await code_of(c, "settings.update", {"ns": ns, "values": {"fine": 1, "x" * 513: 2}}) \
                == "INVALID_PARAMS"
            assert (await c.call("settings.getAll", {"ns": ns}))["values"] == every


# ------------------------------------------------------------------------------ §4.6b the turn queue

def _push(sid: str, content: str, key: str | None, principal: str = "ui") -> dict[str, Any]:
    params: dict[str, Any] = {"sessionId": sid, "principal": principal, "content": content, "permissionMode": "ask"}
    if key is not None:
        params["idempotencyKey"] = key
    return params


async def test_two_connections_pushing_reordering_and_taking_at_once_keep_the_queue_whole(
        shared: HostProcess) -> None:
    """§4.6b: "A session holds at most eight entries", "principal plus idempotency_key make a retried push
    return the same row", "position is per session and only grows", "queueReorder swaps two adjacent
    non-promoted position values"; protocol/README queueTake hands out "the next entry". Two connections
    at once: twelve pushes admit exactly eight (the rest LIMIT_EXCEEDED); the same key pushed from both
    connections at once is one row; reorders racing each other leave the same eight entries on eight
    distinct positions; two takes racing (two connections of the client that attached) hand out the first
    two entries, each once, and the other client, which never attached, takes nothing."""
    with trio.fail_after(60):
        async with client(shared, "q-one", kind="agent") as a, client(shared, "q-two", kind="agent") as b:
            sid = (await a.call("session.create", {}))["id"]
            twin = await all_at_once([(a, "session.queuePush", _push(sid, "twin ✓", "twin")),
                                      (b, "session.queuePush", _push(sid, "twin ✓", "twin"))])
            assert twin[0]["entry"]["id"] == twin[1]["entry"]["id"]
            assert sorted([twin[0]["replayed"], twin[1]["replayed"]]) == [False, True]
            pushes = [(a if i % 2 else b, "session.queuePush", _push(sid, f"p{i}", f"k{i}")) for i in range(11)]
            answers = await all_at_once(pushes)
            admitted = [x["entry"] for x in answers if isinstance(x, dict)]
            assert len(admitted) == 7 and answers.count("LIMIT_EXCEEDED") == 4, answers
            listed = (await b.call("session.queueList", {"sessionId": sid}))["entries"]
            ids = {x["id"] for x in listed}
            assert ids == {x["id"] for x in admitted} | {twin[0]["entry"]["id"]} and len(listed) == 8
            positions = [x["position"] for x in listed]
            assert positions == sorted(positions) and len(set(positions)) == 8
            moves = [(a if i % 2 else b, "session.queueReorder",
                      {"sessionId": sid, "entryId": listed[i % 8]["id"], "direction": "up" if i % 3 else "down"})
                     for i in range(16)]
            for answer in await all_at_once(moves):
                assert isinstance(answer, dict) or answer == "CONFLICT", answer
            after = (await a.call("session.queueList", {"sessionId": sid}))["entries"]
            assert {x["id"] for x in after} == ids
            assert sorted(x["position"] for x in after) == sorted(positions)
            assert [x["position"] for x in after] == sorted(x["position"] for x in after)
            ctl = {"sessionId": sid, "controllerId": "q-ctl"}
            await a.call("session.queueAttach", ctl)
            # only the client that attached takes (§4.6b "held ... until a controller attaches"): b, which
            # never attached, is refused; two connections of the attaching client race
            assert await outcome(b, "session.queueTake", ctl) == "CONFLICT"
            async with client(shared, "q-one", kind="agent") as a2:
                takes = await all_at_once([(a, "session.queueTake", ctl), (a2, "session.queueTake", ctl)])
            handed = [t["entry"]["id"] for t in takes if isinstance(t, dict) and t.get("entry")]
            # a controller's next take consumes what it took before (protocol/README: "the controller moved
            # on"): two racing takes hand out the first two entries, each once
            assert sorted(handed) == sorted(x["id"] for x in after[:2]), takes
            rest = (await b.call("session.queueList", {"sessionId": sid}))["entries"]
            assert [x["id"] for x in rest] == [x["id"] for x in after[2:]]


# ------------------------------------------------------- keyed config writes killed after their commit

async def test_keyed_config_writes_killed_after_their_commit_have_one_effect_on_retry(tmp_path: Path) -> None:
    """§11 "Every acknowledged change" and protocol/README "A retry with the same clientId + submissionId
    returns the stored response": settings.set (odd JSON under a unicode key), settings.update of the app
    blob, settings.delete, providers.create (with a key), models.add, workspace.open and projects.pin,
    each on a host SIGKILLed right after its commit (``index.after_commit``) and before it answered. On the
    next host the retry answers, a second retry answers the same, the change is there exactly once, and
    the same key with other params is IDEMPOTENCY_CONFLICT and changes nothing."""
    data = data_dir(tmp_path)
    with trio.fail_after(150):
        async with real_host(data, client_id="keyed") as (_proc, c):
            provider = (await c.call("providers.create", {"name": "base"}))["provider"]
            project = (await c.call("workspace.open", {"path": "/w/pinned"}))["project"]
            await c.call("settings.set", {"ns": "ui", "key": "doomed", "value": [1]})
        value = {"ключ": [2**63 - 1, -(2**63), "🎉\u0000", nested(40)]}
        writes: list[tuple[str, dict[str, Any]]] = [
            ("settings.set", {"ns": "ui", "key": "ключ🎉", "value": value}),
            ("settings.update", {"ns": "app", "values": {"largePasteThreshold": 1234,
                                                          "thinkingDisplayMode": "compact"}}),
            ("settings.delete", {"ns": "ui", "key": "doomed"}),
            ("providers.create", {"name": "Ünïcode ✓", "apiKey": "sk-outsider-0123456789"}),
            ("models.add", {"providerId": provider["id"], "modelId": "модель/🎉", "contextWindow": 2**40}),
            ("workspace.open", {"path": "/w/ünï/новый"}),
            ("projects.pin", {"projectId": project["id"], "pinned": True}),
        ]
        for i, (method, params) in enumerate(writes):
            keyed = {**params, "submissionId": f"keyed-{i}"}
            await call_killed_at(data, "index.after_commit", method, keyed, client_id="keyed")
        async with real_host(data, client_id="keyed") as (_proc, c):
            for i, (method, params) in enumerate(writes):
                keyed = {**params, "submissionId": f"keyed-{i}"}
                first = await c.call(method, keyed)
                assert await c.call(method, keyed) == first, method
            for i, (method, params) in enumerate(writes):
                other = {**params, "submissionId": f"keyed-{i}"}
                if method == "settings.set":
                    other["value"] = "other"
                elif method == "projects.pin":
                    other["pinned"] = False
                elif method == "settings.update":
                    other["values"] = {"largePasteThreshold": 1}
                elif method == "settings.delete":
                    other["key"] = "another"
                elif method == "providers.create":
                    other["name"] = "other"
                elif method == "models.add":
                    other["modelId"] = "other"
                else:
                    other["path"] = "/w/other"
                assert await code_of(c, method, other) == "IDEMPOTENCY_CONFLICT", method
            assert (await c.call("settings.get", {"ns": "ui", "key": "ключ🎉"}))["value"] == value
            app = (await c.call("settings.getAll", {"ns": "app"}))["values"]
            assert (app["largePasteThreshold"], app["thinkingDisplayMode"]) == (1234, "compact")
            assert "doomed" not in (await c.call("settings.getAll", {"ns": "ui"}))["values"]
            providers = (await c.call("providers.list", {}))["providers"]
            assert sorted(p["name"] for p in providers) == sorted(["base", "Ünïcode ✓"])
            assert all(p["hasApiKey"] == (p["name"] != "base") for p in providers)
            models = [m for m in (await c.call("models.list", {}))["models"] if m["providerId"] == provider["id"]]
            assert [(m["modelId"], m["contextWindow"]) for m in models] == [("модель/🎉", 2**40)]
            projects = (await c.call("projects.list", {}))["projects"]
            assert sorted((p["path"], p["pinned"]) for p in projects) == [("/w/pinned", True),
                                                                           ("/w/ünï/новый", False)]


# ------------------------------------------------------------------- §4.3 providers, §4.4 the catalog

async def test_a_refresh_from_a_real_server_keeps_unicode_ids_collapses_repeats_and_races_to_one_catalog(
        shared: HostProcess) -> None:
    """§4.4 "models — catalog cache", "Refresh (spec 13 §6/§9) upserts discovered rows", PRIMARY KEY
    (provider_id, model_id): a real HTTP server on 127.0.0.1 lists one id twice, a Cyrillic-and-emoji id, a
    200-character id and a blank-looking one (no model id: the refresh skips it, keeps the others and names it
    in skippedModels, as it does an id holding NUL). The catalog holds each id once, exactly as listed; three
    refreshes racing from two connections against a changed list leave exactly that list (no row twice,
    none left from the old one but the user's own)."""
    listed = [{"id": "a"}, {"id": "a", "name": "second"}, {"id": "модель🎉"}, {"id": "x" * 200}]
    with FakeProvider(Reply(models=[*listed, {"id": " "}])) as server, trio.fail_after(60):
        async with client(shared, "cat-one") as a, client(shared, "cat-two") as b:
            await a.call("providers.create", {"id": "uni", "name": "U", "baseUrl": server.base_url})
            await a.call("models.add", {"providerId": "uni", "modelId": "mine ✓"})
            done = await a.call("models.refresh", {"providerId": "uni"})
            assert done["listed"] == 3
            assert done["skippedModels"] == {"count": 1, "entries": [
                {"index": 4, "reason": "a model id must not be blank", "modelId": " "}]}
            ids = sorted(m["modelId"] for m in (await b.call("models.list", {"providerId": "uni"}))["models"])
            assert ids == sorted(["a", "модель🎉", "x" * 200, "mine ✓"])
            server.reply = Reply(models=[{"id": f"m{i}"} for i in range(40)])
            races = await all_at_once([(a, "models.refresh", {"providerId": "uni"}),
                                       (b, "models.refresh", {"providerId": "uni"}),
                                       (a, "models.refresh", {"providerId": "uni"})])
            assert all(isinstance(r, dict) for r in races), races
            rows = (await b.call("models.list", {"providerId": "uni"}))["models"]
            live = sorted(m["modelId"] for m in rows if not m["deprecated"])
            assert live == sorted([f"m{i}" for i in range(40)] + ["mine ✓"])
            assert len({m["modelId"] for m in rows}) == len(rows)


async def test_provider_order_under_racing_reorders_and_a_delete_stays_a_permutation(shared: HostProcess) -> None:
    """README 8.3: "providers.reorder owns the display order: list follows it, ids it does not name follow
    in creation order, deleted ids are skipped"; "a repeated id is INVALID_PARAMS". Two connections
    reorder at once while one provider is deleted: the list afterwards is one of the orders sent (minus the
    deleted id), every provider once; a repeated id changes nothing."""
    with trio.fail_after(60):
        async with client(shared, "ord-one") as a, client(shared, "ord-two") as b:
            made = [(await a.call("providers.create", {"id": f"ord{i}", "name": f"Ö{i}"}))["provider"]["id"]
                    for i in range(5)]
            others = [p["id"] for p in (await a.call("providers.list", {}))["providers"] if p["id"] not in made]
            one, two = list(reversed(made)), made[2:] + made[:2]
            answers = await all_at_once([(a, "providers.reorder", {"providerIds": one}),
                                         (b, "providers.reorder", {"providerIds": two}),
                                         (b, "providers.delete", {"providerId": made[1]})])
            assert all(isinstance(x, dict) for x in answers), answers
            order = [p["id"] for p in (await a.call("providers.list", {}))["providers"]]
            mine = [x for x in order if x in made]
            assert mine in ([x for x in one if x != made[1]], [x for x in two if x != made[1]]), mine
            assert sorted(order) == sorted([x for x in made if x != made[1]] + others)
            assert await code_of(b, "providers.reorder", {"providerIds": [made[0], made[0]]}) == "INVALID_PARAMS"
            assert [p["id"] for p in (await a.call("providers.list", {}))["providers"]] == order


async def test_a_full_namespace_refuses_a_new_key_all_or_none_and_still_takes_overwrites(shared: HostProcess) -> None:
    """protocol/README 8.1: "plugin:<id>: one plugin's settings (values ≤ 64 KiB, ≤ 256 keys)" and
    settings.update writes "several at once (all or none)". A namespace filled to 256 keys refuses an
    update that adds one more, and the other key in that same update keeps its old value; overwriting
    an existing key still works, up to exactly 64 KiB of UTF-8 JSON; two bytes more (counted in bytes,
    not characters) is PAYLOAD_TOO_LARGE and changes nothing."""
    ns = "plugin:outsider-full"
    with trio.fail_after(60):
        async with client(shared) as c:
            for start in (0, 100, 200):
                await c.call("settings.update", {"ns": ns, "values": {f"k{i}": i for i in range(start,
                                                                                           min(start + 100, 256))}})
            before = (await c.call("settings.getAll", {"ns": ns}))["values"]
            assert len(before) == 256
            code = await code_of(c, "settings.update", {"ns": ns, "values": {"k0": "changed", "k256": 1}})
            assert code in ("LIMIT_EXCEEDED", "INVALID_PARAMS", "PAYLOAD_TOO_LARGE"), code
            assert await code_of(c, "settings.set", {"ns": ns, "key": "k256", "value": 1}) == code
            assert (await c.call("settings.getAll", {"ns": ns}))["values"] == before
            # 32,767 two-byte characters and the quotes: exactly 65,536 bytes of JSON
            await c.call("settings.set", {"ns": ns, "key": "k0", "value": "é" * 32_767})
            assert await code_of(c, "settings.set", {"ns": ns, "key": "k1", "value": "é" * 32_768}) \
                == "PAYLOAD_TOO_LARGE"
            after = (await c.call("settings.getAll", {"ns": ns}))["values"]
            assert after == {**before, "k0": "é" * 32_767}


# ---------------------------------------------------------------------------- §4.14 notifications

async def test_unread_pages_list_every_unread_row_once_while_each_page_is_marked_read(shared: HostProcess) -> None:
    """§4.14 notifications (read_at NULL = unread; idx_notifications_created newest first) and README
    notifications.list ``unreadOnly`` with ``nextCursor``: an inbox that marks each page read before it
    asks for the next still gets every unread row once, newest first, with the session's unicode title
    snapshot; markAllRead then updates only the rows still unread; a cursor of another shape is
    INVALID_CURSOR."""
    with trio.fail_after(60):
        async with client(shared, "inbox-agent", kind="agent") as c:
            sid = (await c.call("session.create", {"title": "Ünï 🎉 \u202e"}))["id"]
            for i in range(20):
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"in{i:02d}"})
                await c.call("session.endTurn", {"sessionId": sid, "turnId": f"in{i:02d}",
                                                 "status": "completed" if i % 3 else "error"})
            mine = [n for n in (await c.call("notifications.list", {"limit": 200, "unreadOnly": True}))[
                "notifications"] if n["sessionId"] == sid]
            assert [n["turnId"] for n in mine] == [f"in{i:02d}" for i in reversed(range(20))]
            # each page is marked read before the next is asked for (the last page stays unread)
            seen: list[dict[str, Any]] = []
            page = await c.call("notifications.list", {"limit": 3, "unreadOnly": True})
            while True:
                seen += page["notifications"]
                if not page.get("nextCursor"):
                    break
                await c.call("notifications.markRead", {"ids": [n["id"] for n in page["notifications"]]})
                page = await c.call("notifications.list", {"limit": 3, "unreadOnly": True,
                                                           "cursor": page["nextCursor"]})
            ids = [n["id"] for n in seen]
            assert len(ids) == len(set(ids))
            assert [n["id"] for n in seen if n["sessionId"] == sid] == [n["id"] for n in mine]
            assert all(n["sessionTitle"] == "Ünï 🎉 \u202e" for n in seen if n["sessionId"] == sid)
            still_unread = (await c.call("notifications.list", {"limit": 200, "unreadOnly": True}))
            assert (await c.call("notifications.markAllRead", {}))["updated"] == len(still_unread["notifications"])
            after = await c.call("notifications.list", {"unreadOnly": True})
            assert (after["notifications"], after["unreadCount"]) == ([], 0)
            assert await code_of(c, "notifications.list", {"limit": 3, "cursor": "not-a-cursor"}) == "INVALID_CURSOR"


# ------------------------------------------------------------------- SIGKILL at an arbitrary moment

@pytest.mark.parametrize("after", [3, 11, 20])
async def test_a_kill_at_any_moment_keeps_every_acknowledged_write_once_and_retries_have_one_effect(
        tmp_path: Path, after: int) -> None:
    """§11 "every acknowledged change" survives a crash; README "A retry with the same clientId +
    submissionId returns the stored response". Two connections stream keyed writes (settings.set of odd
    JSON, tasks.create with a unicode title, session.queuePush) and the host is SIGKILLed once ``after``
    of them were answered, while the rest are in flight. On the next host every answered write is there
    exactly as answered; retrying all of them with their keys answers the acknowledged ones as before and
    leaves one row per key (a task created once, a queue entry admitted once)."""
    data = data_dir(tmp_path)
    acked: dict[str, tuple[str, dict[str, Any], Any]] = {}
    with trio.fail_after(120):
        proc = start_host_process(data)
        try:
            async with client(proc, "kill-w") as setup:
                sid = (await setup.call("session.create", {}))["id"]

            def writes(lane: int) -> list[tuple[str, str, dict[str, Any]]]:
                out: list[tuple[str, str, dict[str, Any]]] = []
                for i in range(12):
                    key = f"w{lane}-{i}"
                    if i % 3 == 0:
                        out.append((key, "settings.set", {"ns": "ui", "key": f"ключ-{key}",
                                                          "value": {"n": 2**63 - 1 - i, "s": "🎉" * i}}))
                    elif i % 3 == 1:
                        out.append((key, "tasks.create", {"taskId": f"t-{key}", "title": f"Задача {key} ✓",
                                                          "prompt": "p"}))
                    elif lane == 0:
                        out.append((key, "session.queuePush", _push(sid, f"q {key}", None)))
                    else:
                        out.append((key, "settings.set", {"ns": "ui", "key": f"other-{key}", "value": [key]}))
                return out

            killed = trio.Event()

            async def lane(n: int) -> None:
                try:
                    async with client(proc, "kill-w") as c:
                        for key, method, params in writes(n):
                            answer = await c.call(method, {**params, "submissionId": key})
                            acked[key] = (method, params, answer)
                            if len(acked) >= after and not killed.is_set():
                                killed.set()
                                proc.kill9()
                except Exception:  # the kill closes the connection mid-call
                    if not killed.is_set():
                        raise

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lane, 0)
                nursery.start_soon(lane, 1)
        finally:
            proc.kill9()
        assert len(acked) >= min(after, 24)
        async with real_host(data, client_id="kill-w") as (_proc, c):
            for key, (method, params, answer) in acked.items():
                if method == "settings.set":
                    got = await c.call("settings.get", {"ns": "ui", "key": params["key"]})
                    assert got["value"] == params["value"], key
                elif method == "tasks.create":
                    assert await c.call("tasks.get", {"taskId": params["taskId"]}) == answer, key
            queued = {x["id"] for x in (await c.call("session.queueList", {"sessionId": sid}))["entries"]}
            assert {a["entry"]["id"] for m, _p, a in acked.values() if m == "session.queuePush"} <= queued
            for lane_no in (0, 1):
                for key, method, params in writes(lane_no):
                    again = await c.call(method, {**params, "submissionId": key})
                    if key in acked:
                        assert again == acked[key][2], key
            tasks = [t["id"] for t in (await c.call("tasks.list", {}))["tasks"]]
            assert len(tasks) == len(set(tasks)) == 8
            entries = (await c.call("session.queueList", {"sessionId": sid}))["entries"]
            assert sorted(x["content"] for x in entries) == sorted(f"q w0-{i}" for i in (2, 5, 8, 11))
