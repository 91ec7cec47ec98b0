"""session.startTurn / endTurn / turnEnvironment and the notification inbox, through the gateway."""

from __future__ import annotations

import trio

from tests.hostkit import client_for, index_caught_up, inprocess_host, msg
from tests.turns.turnkit import end, new_session, rpc_error, start


def env(**extra):
    return {"version": 1, "connection": {"baseUrl": "https://api.example", "apiKeyRef": "secret:prov1"},
            "model": {"id": "m1"}, "parameters": {"temperature": 0.2, "stop": None},
            "systemPrompt": "be brief", "credentialRefs": ["secret:prov1"], **extra}


async def test_start_turn_snapshots_provider_and_model_and_links_messages(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.update", {"sessionId": sid, "providerId": "p1", "modelId": "m1"})
            # a message naming a turn that does not exist yet is not linked
            early = await c.call("session.appendMessage",
                                 {"sessionId": sid, "turnId": "t1", "message": msg("u0", "hi")})
            assert early["message"].get("turnId") is None
            turn = await start(c, sid, "t1")
            assert turn["status"] == "running" and turn["providerId"] == "p1" and turn["modelId"] == "m1"
            # changing the session later does not change the turn's snapshot
            await c.call("session.update", {"sessionId": sid, "modelId": "m2"})
            r = await c.call("session.appendMessage", {"sessionId": sid, "turnId": "t1", "message": msg("u1", "go")})
            assert r["message"]["turnId"] == "t1"
            got = await c.call("session.get", {"sessionId": sid})
            by_id = {m["id"]: m for m in got["messages"]}
            assert by_id["u1"]["turnId"] == "t1"
            ended = await end(c, sid, "t1", usage={"inputTokens": 10, "outputTokens": 4, "cacheRead": 7})
            assert ended["turn"]["modelId"] == "m1"
            assert ended["turn"]["inputTokens"] == 10 and ended["turn"]["outputTokens"] == 4
            assert ended["turn"]["usage"] == {"inputTokens": 10, "outputTokens": 4, "cacheRead": 7}
            assert ended["turn"]["endedAt"] >= ended["turn"]["startedAt"]


async def test_generated_turn_id_and_receipt_retry_returns_same_turn(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            a = await c.call("session.startTurn", {"sessionId": sid, "submissionId": "s1"})
            b = await c.call("session.startTurn", {"sessionId": sid, "submissionId": "s1"})
            assert a["id"] == b["id"] and a["status"] == "running"
            err = await rpc_error(c.call("session.startTurn", {"sessionId": sid, "submissionId": "s1",
                                                               "providerId": "other"}))
            assert err.data_code == "IDEMPOTENCY_CONFLICT"
            # same id again in another session is a conflict
            other = await new_session(c)
            err = await rpc_error(start(c, other, a["id"]))
            assert err.data_code == "CONFLICT"


async def test_environment_snapshot_round_trip_with_digest(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            turn = await start(c, sid, "t1", environment=env())
            assert len(turn["environmentDigest"]) == 64
            back = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert back["version"] == 1 and back["digest"] == turn["environmentDigest"]
            assert back["snapshot"]["parameters"] == {"temperature": 0.2, "stop": None}
            assert back["snapshot"]["credentialRefs"] == ["secret:prov1"]
            assert back["snapshot"]["systemPrompt"] == "be brief"
            await end(c, sid, "t1")
            await start(c, sid, "t2")
            err = await rpc_error(c.call("session.turnEnvironment", {"turnId": "t2"}))
            assert err.data_code == "NOT_FOUND"
            err = await rpc_error(c.call("session.turnEnvironment", {"turnId": "nope"}))
            assert err.data_code == "NOT_FOUND"


async def test_environment_snapshot_keeps_the_browser_submission_context(tmp_path):
    """Seed 000 §4: the snapshot fixes the browser submission context too, under the digest; a secret value in it
    is refused like anywhere else in the snapshot (credential references only)."""
    browser = {"origin": "https://app.example", "url": "https://app.example/form", "method": "POST",
               "fields": [{"name": "q", "value": "parser"}], "cookieRef": "secret:browser-session"}
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            turn = await start(c, sid, "t1", environment=env(browserSubmissionContext=browser))
            back = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert back["snapshot"]["browserSubmissionContext"] == browser
            await end(c, sid, "t1")
            plain = await start(c, sid, "t2", environment=env())
            assert plain["environmentDigest"] != turn["environmentDigest"]
            again = await c.call("session.turnEnvironment", {"turnId": "t2"})
            assert again["snapshot"]["browserSubmissionContext"] == {}
            await end(c, sid, "t2")
            err = await rpc_error(start(c, sid, "t3", environment=env(browserSubmissionContext={
                "url": "https://app.example", "headers": {"Cookie": "session=abcdefghijklmnop"}})))
            assert err.data_code == "INVALID_PARAMS"


async def test_environment_snapshot_rejects_secret_values_and_unknown_version(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            for bad in (env(connection={"apiKey": "sk-live-123"}),
                        env(executionBindings={"shell": {"env": {"GITHUB_TOKEN": "x", "token": "ghp_1"}}}),
                        env(parameters={"headers": {"Authorization": "Bearer abcdefghijklmnop"}}),
                        {**env(), "version": 2}):
                err = await rpc_error(start(c, sid, "t-bad", environment=bad))
                assert err.data_code == "INVALID_PARAMS", bad
            # nothing was stored for the refused turn
            err = await rpc_error(end(c, sid, "t-bad"))
            assert err.data_code == "NOT_FOUND"
            # a tool schema may describe a password field
            schema = {"name": "login", "parameters": {"properties": {"password": {"type": "string"}}}}
            ok = await start(c, sid, "t-ok", environment=env(toolSchemas=[schema]))
            assert ok["environmentDigest"]


async def test_end_turn_notifications_once_per_turn_none_for_aborted(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c, "My task")
            await start(c, sid, "t1")
            done = await end(c, sid, "t1")
            note = done["notification"]
            assert note["kind"] == "task.completed" and note["sessionTitle"] == "My task" and note["turnId"] == "t1"
            again = await end(c, sid, "t1")
            assert "notification" not in again and again["turn"]["status"] == "completed"
            await start(c, sid, "t2")
            failed = await end(c, sid, "t2", "error", errorCode="PROVIDER_DOWN")
            assert failed["notification"]["kind"] == "task.failed"
            assert failed["notification"]["errorCode"] == "PROVIDER_DOWN"
            await start(c, sid, "t3")
            aborted = await end(c, sid, "t3", "aborted")
            assert "notification" not in aborted and aborted["turn"]["status"] == "aborted"
            await start(c, sid, "t4")
            quiet = await end(c, sid, "t4", createNotification=False)
            assert "notification" not in quiet
            # a different terminal status for a settled turn is a stale update
            err = await rpc_error(end(c, sid, "t1", "error"))
            assert err.data_code == "CONFLICT"
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["t2", "t1"]
            assert listed["unreadCount"] == 2


async def test_end_turn_events(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c, client_for(host, "watcher") as w:
            await w.subscribe(["notification.created", "turn.ended", "turn.started"])
            sid = await new_session(c)
            await start(c, sid, "t1")
            await end(c, sid, "t1")
            await end(c, sid, "t1")  # a repeat publishes nothing
            await start(c, sid, "t2")
            topics = []
            while len(topics) < 4:
                ev = await w.next_event()
                topics.append((ev.topic, ev.data))
            assert [t for t, _ in topics] == ["turn.started", "turn.ended", "notification.created", "turn.started"]
            assert topics[2][1]["notification"]["turnId"] == "t1"
            assert topics[1][1]["notification"]["turnId"] == "t1"


async def test_notification_inbox_operations_touch_nothing_else(tmp_path):
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("u1", "hello")})
            for i in range(5):
                await start(c, sid, f"t{i}")
                await end(c, sid, f"t{i}")
            transcript = (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes()
            before_session = await c.call("session.get", {"sessionId": sid})
            page1 = await c.call("notifications.list", {"limit": 2})
            assert len(page1["notifications"]) == 2 and page1["nextCursor"]
            page2 = await c.call("notifications.list", {"limit": 2, "cursor": page1["nextCursor"]})
            page3 = await c.call("notifications.list", {"limit": 2, "cursor": page2["nextCursor"]})
            assert page3.get("nextCursor") is None
            ids = [n["id"] for p in (page1, page2, page3) for n in p["notifications"]]
            assert len(set(ids)) == 5
            r = await c.call("notifications.markRead", {"ids": ids[:2]})
            assert r["updated"] == 2
            r = await c.call("notifications.markRead", {"ids": ids[:2]})
            assert r["updated"] == 0  # idempotent
            unread = await c.call("notifications.list", {"unreadOnly": True})
            assert {n["id"] for n in unread["notifications"]} == set(ids[2:]) and unread["unreadCount"] == 3
            r = await c.call("notifications.markAllRead", {})
            assert r["updated"] == 3
            listed = await c.call("notifications.list", {})
            assert listed["unreadCount"] == 0 and all(n["readAt"] for n in listed["notifications"])
            r = await c.call("notifications.clear", {"ids": [ids[0], "missing"]})
            assert r["deleted"] == 1
            r = await c.call("notifications.clear", {})
            assert r["deleted"] == 4
            assert (await c.call("notifications.list", {}))["notifications"] == []
            # sessions, turns and transcripts are untouched
            assert (tmp_path / "sessions" / f"{sid}.jsonl").read_bytes() == transcript
            after_session = await c.call("session.get", {"sessionId": sid})
            assert after_session == before_session
            again = await end(c, sid, "t0")
            assert again["turn"]["status"] == "completed" and "notification" not in again


async def test_notification_cascade_on_session_delete(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            keep, gone = await new_session(c, "keep"), await new_session(c, "gone")
            for sid, tid in ((keep, "tk"), (gone, "tg")):
                await start(c, sid, tid)
                await end(c, sid, tid)
            await c.call("session.delete", {"sessionId": gone})
            listed = await c.call("notifications.list", {})
            assert [n["turnId"] for n in listed["notifications"]] == ["tk"]


async def test_turn_update_and_notification_commit_together(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            await index_caught_up(host)
            host.faults.add("index.before_commit", nth=1, action="raise")
            await rpc_error(end(c, sid, "t1"))
            host.faults.clear()
            listed = await c.call("notifications.list", {})
            assert listed["notifications"] == [] and listed["unreadCount"] == 0
            retry = await end(c, sid, "t1")  # the turn was still running: nothing half-applied
            assert retry["turn"]["status"] == "completed" and retry["notification"]["turnId"] == "t1"
            assert len((await c.call("notifications.list", {}))["notifications"]) == 1


async def test_end_turn_receipt_replays_the_original_response(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            sid = await new_session(c)
            await start(c, sid, "t1")
            params = {"sessionId": sid, "turnId": "t1", "status": "completed", "submissionId": "end-1"}
            first = await c.call("session.endTurn", params)
            second = await c.call("session.endTurn", params)
            assert second == first and first["notification"]["turnId"] == "t1"
            assert len((await c.call("notifications.list", {}))["notifications"]) == 1
