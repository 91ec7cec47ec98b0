"""pihost_client against real host processes that are SIGKILLed, SIGTERMed and restarted: the client holds up.

The bar, checked black-box through the client's typed methods (answers validated against the wire models):

* every call the client reports as successful is present exactly once after any crash; a call that raised may
  be absent or present once, never twice;
* the client never hangs forever (its own timeouts bound every wait) and raises its typed errors
  (:class:`ConnectionLost` and its subclasses, :class:`RpcError`), never a raw internal exception;
* subscriptions resume after a reconnect: within one boot at their cursor with no gap, after a restart with a
  :class:`Resync` first (cursors restart with every boot: protocol/README.md section 5).

Every scenario runs under asyncio and trio (the client claims both).
"""

from __future__ import annotations

import base64
import hashlib
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import ConnectionLost, Event, HostUnavailable, Resync, RpcError, connect
from protocol.methods import METHODS
from protocol.models_events import EVENT_PAYLOADS
from tests.clients.relay import Relay
from tests.hostkit import HostProcess, start_host_process

BACKENDS = ("asyncio", "trio")


def fast(data_dir: Path, client_id: str, **options: Any) -> Any:
    """``connect()`` that reconnects quickly (a restarted host is back within a second)."""
    return connect(data_dir=data_dir, client_id=client_id, backoff=0.05, max_backoff=0.25, **options)


def valid(method: str, result: Any) -> Any:
    """``result`` after checking it against the method's result model (what the wire promises)."""
    METHODS[method].result_model.model_validate(result)
    return result


class Host:
    """The host process of one data directory, killed and restarted at will."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: HostProcess | None = None
        self.starts = 0

    async def start(self, env: dict[str, str] | None = None) -> None:
        self.proc = await anyio.to_thread.run_sync(partial(start_host_process, self.data_dir, env=env))
        self.starts += 1

    @property
    def current(self) -> HostProcess:
        assert self.proc is not None
        return self.proc

    async def kill(self) -> None:
        await anyio.to_thread.run_sync(self.current.kill9)

    async def terminate(self) -> int:
        return await anyio.to_thread.run_sync(self.current.terminate)

    async def died(self) -> int:
        """Wait for the process to exit by itself (a crash point); its exit status."""
        return await anyio.to_thread.run_sync(partial(self.current.reap, 60))

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.proc.poll() is None:
            self.proc.proc.send_signal(signal.SIGCONT)  # a test that stopped it (SIGSTOP) and failed
            self.proc.kill9()




def run(backend: str, body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body, backend=backend)


def text_message(mid: str, text: str, role: str = "user") -> Any:
    return {"id": mid, "role": role, "blocks": [{"type": "text", "text": text}]}


async def message_ids(c: Any, session_id: str) -> list[str]:
    page = valid("session.get", await c.session.get(session_id=session_id, full=True))
    return [m["id"] for m in page["messages"]]


# -- 2. the host killed exactly while a call is in flight -------------------------------------------------------
async def _killed_in_flight(host: Host, point: str, call: Callable[[Any, str], Awaitable[Any]]) -> tuple[Any, Any]:
    """Run ``call(client, submission_id)`` on a host armed to SIGKILL itself at ``point`` (after the effect, before
    the reply); a helper restarts the host once it died. The client's answer and a second retry's answer."""
    await host.start(env={"RT_CRASHPOINT": f"{point}:1:kill"})
    armed, starts = host.current, host.starts
    async with fast(host.data_dir, "in-flight") as c:
        submission = f"sub-{point}"
        boot = c.hello["bootId"]

        async def restart_when_dead() -> None:
            assert await host.died() == -9, f"the host did not die at {point}"
            await host.start()

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_when_dead)
            with anyio.fail_after(30):
                answered = await call(c, submission)
        assert armed.proc.returncode == -9 and host.starts == starts + 1
        assert c.hello["bootId"] != boot and c.connects == 2, "the answer did not come from the restarted host"
        again = await call(c, submission)
    return answered, again


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_append_in_flight_when_the_host_dies_lands_once(host: Host, backend: str) -> None:
    """SIGKILL after the append's line is fsynced, before the reply: the client's automatic retry on the restarted
    host gets the original answer from the receipt (in the line), and the message is stored once."""

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="in-flight") as c:
            sid = valid("session.create", await c.session.create(title="In flight"))["id"]
            await c.session.append_message(session_id=sid, message=text_message("m0", "before"))
        await host.terminate()

        async def append(c: Any, submission: str) -> Any:
            return valid("session.appendMessage", await c.session.append_message(
                session_id=sid, message=text_message("m1", "in flight"), submission_id=submission))

        answered, again = await _killed_in_flight(host, "append.after_fsync", append)
        assert answered == again and answered["replayed"] is False and answered["message"]["id"] == "m1"
        async with connect(data_dir=host.data_dir, client_id="reader") as fresh:
            assert await message_ids(fresh, sid) == ["m0", "m1"]
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["session.queuePush", "secrets.set"])
def test_a_db_only_call_in_flight_when_the_host_dies_applies_once(host: Host, backend: str, method: str) -> None:
    """SIGKILL right after the commit of a database-only method (its receipt in the same transaction), before the
    reply: the retry answers the original result; one queue entry, one secret version."""

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="in-flight") as c:
            sid = (await c.session.create(title="Queue"))["id"]
        await host.terminate()

        async def push(c: Any, submission: str) -> Any:
            return valid(method, await c.session.queue_push(
                session_id=sid, principal="user", content="only once", permission_mode="ask",
                submission_id=submission))

        async def set_secret(c: Any, submission: str) -> Any:
            return valid(method, await c.secrets.set(ref="provider/in-flight", value="sk-only-once",
                                                     submission_id=submission))

        answered, again = await _killed_in_flight(host, f"{method}.after_commit",
                                                  push if method == "session.queuePush" else set_secret)
        assert answered == again
        async with connect(data_dir=host.data_dir, client_id="reader") as fresh:
            if method == "session.queuePush":
                assert answered["replayed"] is False
                entries = valid("session.queueList", await fresh.session.queue_list(session_id=sid))["entries"]
                assert [(e["id"], e["content"]) for e in entries] == [(answered["entry"]["id"], "only once")]
            else:
                assert answered["version"] == 1
                listed = valid("secrets.list", await fresh.secrets.list())["secrets"]
                assert [s["ref"] for s in listed] == ["provider/in-flight"]
                # applied once: the next write of that ref is its second version
                assert (await fresh.secrets.set(ref="provider/in-flight", value="sk-next"))["version"] == 2
        await host.terminate()

    run(backend, body)


# -- 4. the host down for longer than the client's reconnect window ---------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_host_down_past_the_reconnect_window_is_a_typed_error_then_calls_work_again(host: Host,
                                                                                      backend: str) -> None:
    """The host is killed and stays down: a call waits ``reconnect_timeout`` for a connection, then raises
    HostUnavailable (a ConnectionLost, naming why it could not reconnect), a call in flight too; once the host is
    back, the same client's calls work, and the in-flight append that raised is there once (a retry with its
    submissionId gets the original answer)."""

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="down") as c:
            sid = (await c.session.create(title="Down"))["id"]
        await host.terminate()
        await host.start(env={"RT_CRASHPOINT": "append.after_fsync:1:kill"})
        async with fast(host.data_dir, "down", reconnect_timeout=1.0) as c:
            # in flight: the host dies after the fsync, before the reply, and stays down
            started = anyio.current_time()
            with anyio.fail_after(10), pytest.raises(HostUnavailable) as in_flight:
                await c.session.append_message(session_id=sid, message=text_message("m1", "in flight"),
                                               submission_id="in-flight-1")
            assert 1.0 <= anyio.current_time() - started < 8
            assert await host.died() == -9
            # not connected: a read and a write wait the window, then fail the same way
            for call in (partial(c.session.get, session_id=sid),
                         partial(c.session.rename, session_id=sid, title="while down")):
                started = anyio.current_time()
                with anyio.fail_after(10), pytest.raises(HostUnavailable) as waited:
                    await call()
                assert 1.0 <= anyio.current_time() - started < 8
            for exc in (in_flight.value, waited.value):
                assert isinstance(exc, ConnectionLost) and exc.waited == 1.0
                assert "no connection to the host within 1" in str(exc) and "not running" in str(exc), str(exc)
            await host.start()
            with anyio.fail_after(30):
                renamed = valid("session.rename", await c.session.rename(session_id=sid, title="back"))
                again = valid("session.appendMessage", await c.session.append_message(
                    session_id=sid, message=text_message("m1", "in flight"), submission_id="in-flight-1"))
            assert renamed["title"] == "back" and again["replayed"] is False and again["message"]["id"] == "m1"
            assert await message_ids(c, sid) == ["m1"]
        await host.terminate()

    run(backend, body)


# -- 5. events across a dropped connection and across a restart -------------------------------------------------
def message_event(item: Any) -> str:
    """The message id of a ``session.message`` event, after checking the event against the wire models."""
    assert isinstance(item, Event) and item.topic == "session.message" and not item.transient, item
    EVENT_PAYLOADS[item.topic].model_validate(item.data)
    return str(item.data["message"]["id"])


async def next_items(events: Any, count: int, wait: float = 15) -> list[Event | Resync]:
    got: list[Event | Resync] = []
    with anyio.fail_after(wait):
        while len(got) < count:
            got.append(await events.next())
    return got


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_resume_at_their_cursor_after_a_dropped_connection(host: Host, backend: str) -> None:
    """The connection drops while the host keeps running (same boot) and another client appends: the subscriber
    reconnects, resubscribes at its last cursor and gets every missed event, in order, no Resync, no gap."""

    async def body() -> None:
        await host.start()
        relay = Relay(int(host.current.url.rsplit(":", 1)[1].rstrip("/")))
        try:
            async with connect(data_dir=host.data_dir, client_id="writer") as writer, \
                    connect(f"ws://127.0.0.1:{relay.port}/", host.current.token, client_id="reader", backoff=0.05,
                            max_backoff=0.25) as reader:
                sid = (await writer.session.create(title="Events"))["id"]
                async with reader.subscribe(["session.message"], session_id=sid) as events:
                    for i in range(3):
                        await writer.session.append_message(session_id=sid, message=text_message(f"m{i}", "before"))
                    first = await next_items(events, 3)
                    relay.down()
                    for i in range(3, 8):
                        await writer.session.append_message(session_id=sid, message=text_message(f"m{i}", "missed"))
                    relay.up()
                    await writer.session.append_message(session_id=sid, message=text_message("m8", "after"))
                    rest = await next_items(events, 6)
                    assert reader.connects == 2 and reader.hello["bootId"] == writer.hello["bootId"]
            got = first + rest
            assert [message_event(e) for e in got] == [f"m{i}" for i in range(9)]
            cursors = [e.cursor for e in got if isinstance(e, Event)]
            assert cursors == sorted(set(cursors))
        finally:
            relay.down()
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_after_a_restart_start_with_a_resync(host: Host, backend: str) -> None:
    """SIGKILL and restart while subscribed; another client appends meanwhile and after: the subscriber's first
    item after the reconnect is a Resync (cursors restart with the boot), then the new boot's events; reloading
    then shows every acknowledged message."""

    async def body() -> None:
        await host.start()
        async with fast(host.data_dir, "reader") as reader:
            sid = (await reader.session.create(title="Restart"))["id"]
            async with reader.subscribe(["session.message"], session_id=sid) as events:
                async with fast(host.data_dir, "writer") as writer:
                    await writer.session.append_message(session_id=sid, message=text_message("m0", "before"))
                    assert [message_event(e) for e in await next_items(events, 1)] == ["m0"]
                    boot = reader.hello["bootId"]
                    await host.kill()
                    await host.start()
                    with anyio.fail_after(30):  # the writer's append waits for its own reconnect
                        await writer.session.append_message(session_id=sid, message=text_message("m1", "restarted"))
                    resync = (await next_items(events, 1))[0]
                    assert isinstance(resync, Resync) and "restarted" in resync.reason
                    await writer.session.append_message(session_id=sid, message=text_message("m2", "after"))
                    after = [message_event(e) for e in await next_items(events, 1)]
                    # m1 may land before the resubscription (covered by the Resync) or after it
                    assert after in (["m1"], ["m2"])
                    if after == ["m1"]:
                        assert [message_event(e) for e in await next_items(events, 1)] == ["m2"]
                assert await message_ids(reader, sid) == ["m0", "m1", "m2"]
                assert reader.hello["bootId"] != boot and reader.connects == 2
        await host.terminate()

    run(backend, body)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refused_subscription_does_not_stop_the_client_reconnecting(host: Host, backend: str) -> None:
    """A subscribe the host refuses (an unknown topic: INVALID_PARAMS) raises RpcError and is forgotten: the next
    reconnect does not send it again (it was: every reconnect failed on it, and the client never reconnected)."""

    async def body() -> None:
        await host.start()
        async with fast(host.data_dir, "refused", reconnect_timeout=20) as c:
            sid = (await c.session.create(title="Refused"))["id"]
            with pytest.raises(RpcError) as refused:
                async with c.subscribe(["no.such.topic"]):
                    pass
            assert refused.value.data_code == "INVALID_PARAMS"
            async with c.subscribe(["session.message"], session_id=sid) as events:
                await host.kill()
                await host.start()
                with anyio.fail_after(15):
                    await c.session.append_message(session_id=sid, message=text_message("m0", "after"))
                    items = await next_items(events, 2)
            assert isinstance(items[0], Resync) and message_event(items[1]) == "m0"
            assert c.connects == 2
        await host.terminate()

    run(backend, body)


# -- 1. a workload while the host is SIGKILLed and restarted at random points ------------------------------------
class Ledger:
    """What the client acknowledged and what raised, per intent (a key); any other exception fails the test."""

    def __init__(self) -> None:
        self.acked: dict[str, Any] = {}
        self.raised: dict[str, BaseException] = {}

    async def do(self, key: str, method: str, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            answer = await call()
        except (ConnectionLost, RpcError) as exc:  # the client's typed errors, nothing else
            self.raised[key] = exc
            return None
        self.acked[key] = valid(method, answer)
        return answer

    def once(self, key: str, count: int) -> None:
        """Acknowledged: exactly once; raised: at most once; never tried: absent."""
        if key in self.acked:
            assert count == 1, f"{key} acknowledged, present {count} times"
        elif key in self.raised:
            assert count <= 1, f"{key} raised ({self.raised[key]!r}), present {count} times"
        else:
            assert count == 0, f"{key} never sent, present {count} times"


def blob(i: int) -> tuple[str, str]:
    data = f"attachment {i}".encode()
    return base64.b64encode(data).decode(), hashlib.sha256(data).hexdigest()


async def workload(c: Any, ledger: Ledger, i: int) -> None:
    """One round of mutating calls through the typed client (each with its own submissionId)."""
    created = await ledger.do(f"create{i}", "session.create", partial(c.session.create, title=f"w{i}"))
    if created is None:
        return
    sid = created["id"]
    for j in "ab":
        await ledger.do(f"append{i}{j}", "session.appendMessage", partial(
            c.session.append_message, session_id=sid, message=text_message(f"m{i}{j}", f"round {i} {j}")))
    await ledger.do(f"queue{i}", "session.queuePush", partial(
        c.session.queue_push, session_id=sid, principal="user", content=f"q{i}", permission_mode="ask"))
    await ledger.do(f"rename{i}", "session.rename", partial(c.session.rename, session_id=sid, title=f"r{i}"))
    await ledger.do(f"update{i}", "session.update", partial(c.session.update, session_id=sid, thinking_level="high"))
    await ledger.do(f"fork{i}", "session.fork", partial(c.session.fork, session_id=sid, title=f"f{i}"))
    if f"append{i}b" in ledger.acked:
        await ledger.do(f"truncate{i}", "session.truncateFrom", partial(
            c.session.truncate_from, session_id=sid, message_id=f"m{i}b", mode="edit"))
    await ledger.do(f"secret{i}", "secrets.set", partial(c.secrets.set, ref=f"provider/w{i}", value=f"sk-{i}"))
    data, _ = blob(i)
    await ledger.do(f"attach{i}", "attachments.put", partial(
        c.attachments.put, name=f"a{i}.txt", mime_type="text/plain", data_base64=data))
    await ledger.do(f"task{i}", "tasks.create", partial(c.tasks.create, title=f"t{i}", prompt=f"task {i}"))


async def audit(c: Any, ledger: Ledger, rounds: int) -> None:
    """Read everything back through a fresh client and hold it against the ledger."""
    sessions: list[Any] = []
    cursor = None
    while True:
        page = valid("session.list", await c.session.list(limit=200, cursor=cursor))
        sessions += page["sessions"]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    titles = Counter(s["title"] for s in sessions)
    queue_contents: Counter[str] = Counter()
    for i in range(rounds):
        ledger.once(f"create{i}", titles[f"w{i}"] + titles[f"r{i}"])
        ledger.once(f"fork{i}", titles[f"f{i}"])
        created = ledger.acked.get(f"create{i}")
        if created is None:
            continue
        sid = created["id"]
        page = valid("session.get", await c.session.get(session_id=sid, full=True))
        ids = Counter(m["id"] for m in page["messages"])
        ledger.once(f"append{i}a", ids[f"m{i}a"])
        if f"truncate{i}" in ledger.acked:
            assert ids[f"m{i}b"] == 0, f"truncate{i} acknowledged, m{i}b still there"
        elif f"truncate{i}" not in ledger.raised:
            ledger.once(f"append{i}b", ids[f"m{i}b"])
        assert max(ids.values(), default=0) <= 1, ids
        summary = page["session"]
        if f"rename{i}" in ledger.acked:
            assert summary["title"] == f"r{i}"
        if f"update{i}" in ledger.acked:
            assert summary["thinkingLevel"] == "high"
        entries = valid("session.queueList", await c.session.queue_list(session_id=sid))["entries"]
        queue_contents.update(e["content"] for e in entries)
        ledger.once(f"queue{i}", queue_contents[f"q{i}"])
    refs = Counter(s["ref"] for s in valid("secrets.list", await c.secrets.list())["secrets"])
    tasks = Counter(t["title"] for t in valid("tasks.list", await c.tasks.list())["tasks"])
    for i in range(rounds):
        ledger.once(f"task{i}", tasks[f"t{i}"])
        if f"secret{i}" in ledger.acked:
            assert refs[f"provider/w{i}"] == 1
        if f"attach{i}" in ledger.acked:
            _, sha = blob(i)
            got = valid("attachments.get", await c.attachments.get(sha256=sha))
            assert got["sha256"] == sha and got["size"] == len(f"attachment {i}") and got["deletionState"] == "live"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_workload_through_random_sigkills_is_applied_exactly_once(host: Host, backend: str) -> None:
    """Rounds of create, append, queuePush, rename, update, fork, truncateFrom, secrets.set, attachments.put and
    tasks.create while the host is SIGKILLed (from outside, at random points) and restarted three times: after the
    last restart a fresh client finds every acknowledged call exactly once, every call that raised at most once."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)

    async def body() -> None:
        await host.start()
        ledger = Ledger()
        rounds = 0
        killed = anyio.Event()

        async def killer() -> None:
            for _ in range(3):
                await anyio.sleep(rng.uniform(0.2, 0.8))
                await host.kill()
                await anyio.sleep(rng.uniform(0, 0.3))
                await host.start()
            killed.set()

        async with fast(host.data_dir, "workload", reconnect_timeout=20) as c:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(killer)
                    while not killed.is_set() or rounds < 2:
                        await workload(c, ledger, rounds)
                        rounds += 1
            assert c.connects >= 2
        async with connect(data_dir=host.data_dir, client_id="auditor") as fresh:
            await audit(fresh, ledger, rounds)
        assert len(ledger.acked) > len(ledger.raised), (seed, ledger.raised)
        await host.terminate()

    try:
        run(backend, body)
    except BaseException as exc:
        exc.add_note(f"random seed {seed}")
        raise


# -- 3. SIGTERM (graceful) during a stream of calls -------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_graceful_stop_during_a_stream_of_calls_answers_or_retries_each_once(host: Host, backend: str) -> None:
    """Eight tasks stream appends (and a few queue pushes); the host gets SIGTERM (in-flight calls answered, new
    ones SHUTTING_DOWN, then the connections close with 1001) and is started again. Every call is answered, on the
    old host or by a retry on the new one (none raises), and each is stored exactly once.

    The calls sent as the 1001 close arrived raised ConnectionLost at once: their retries went to the closing
    connection again (its reader had not finished yet) and used up every attempt without yielding, so a task that
    kept calling spun and starved the event loop (cancellation never arrived)."""

    async def body() -> None:
        await host.start()
        ledger = Ledger()
        async with fast(host.data_dir, "stream", reconnect_timeout=20) as c:
            sid = (await c.session.create(title="Stream"))["id"]
            stopped = anyio.Event()
            sent: list[str] = []

            async def writer(w: int) -> None:
                n = 0
                while (not stopped.is_set() or n < 3) and n < 400:  # bounded, whatever the client does
                    key = f"m{w}-{n}"
                    sent.append(key)
                    if n == 1:  # the queue holds 8 prompts at most
                        await ledger.do(key, "session.queuePush", partial(
                            c.session.queue_push, session_id=sid, principal="user", content=key,
                            permission_mode="ask"))
                    else:
                        await ledger.do(key, "session.appendMessage", partial(
                            c.session.append_message, session_id=sid, message=text_message(key, key)))
                    n += 1

            async def stopper() -> None:
                await anyio.sleep(0.3)
                assert await host.terminate() == 0
                await host.start()
                stopped.set()

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(stopper)
                    for w in range(8):
                        tg.start_soon(writer, w)
            assert c.connects == 2
        assert not ledger.raised, Counter(repr(e) for e in ledger.raised.values())
        async with connect(data_dir=host.data_dir, client_id="auditor") as fresh:
            ids = Counter(await message_ids(fresh, sid))
            entries = valid("session.queueList", await fresh.session.queue_list(session_id=sid))["entries"]
            queued = Counter(e["content"] for e in entries)
        for key in sent:
            ledger.once(key, ids[key] + queued[key])
        await host.terminate()

    run(backend, body)


# -- 7. the Agents SDK session adapter across a host restart -----------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_agents_session_adds_each_item_once_across_a_crash(host: Host, backend: str) -> None:
    """PiHostSession.add_items while the host SIGKILLs itself after the second item's line is durable (before the
    reply) and is restarted: add_items completes, each item is stored once, get_items (through a fresh client,
    after another plain SIGKILL and restart) returns exactly what was added, in order."""
    from pihost_client.agents_session import PiHostSession

    first = [{"role": "user", "content": "Where is my parcel?"}]
    items = [{"type": "function_call", "call_id": "c1", "name": "track", "arguments": '{"id": 42}'},
             {"type": "function_call_output", "call_id": "c1", "output": "in Lyon"},
             {"role": "assistant", "content": [{"type": "output_text", "text": "It is in Lyon."}]},
             {"role": "user", "content": "Thanks"}]

    async def body() -> None:
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="agents-app") as c:
            session = await PiHostSession.open(c, "support-42", title="Support")
            await session.add_items(first)
        await host.terminate()
        await host.start(env={"RT_CRASHPOINT": "append.after_fsync:2:kill"})
        armed = host.current
        async with fast(host.data_dir, "agents-app") as c:
            session = await PiHostSession.open(c, "support-42")

            async def restart_when_dead() -> None:
                assert await host.died() == -9
                await host.start()

            async with anyio.create_task_group() as tg:
                tg.start_soon(restart_when_dead)
                with anyio.fail_after(30):
                    await session.add_items(items)
            assert armed.proc.returncode == -9 and c.connects == 2
            assert await session.get_items() == first + items
        await host.kill()
        await host.start()
        async with connect(data_dir=host.data_dir, client_id="agents-reader") as fresh:
            session = PiHostSession(fresh, "support-42")
            assert await session.get_items() == first + items
            assert await session.get_items(limit=2) == items[-2:]
            assert len(await message_ids(fresh, "support-42")) == 5
        await host.terminate()

    run(backend, body)
