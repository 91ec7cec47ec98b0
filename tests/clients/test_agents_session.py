"""The OpenAI Agents SDK session adapter (issue 25 item 7) against a real host, under asyncio and trio.

The SDK's own session tests (``tests/memory/test_session.py`` of openai-agents-python: the SQLiteSession
direct tests for add/get/pop/clear/limit/unicode/isolation) are ported here as protocol-shape tests: they need
no SDK. The tests that drive the SDK's ``Runner`` are in ``test_agents_sdk_runner.py`` (skipped without it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import Client, connect
from pihost_client.agents_session import ITEM_META_KEY, PiHostSession
from tests.hostkit import HostProcess, start_host_process

BACKENDS = ["asyncio", "trio"]

# every shape the SDK stores: easy messages, typed messages with content parts, tool calls and outputs,
# reasoning, unicode, SQL-ish text, nested JSON, numbers and nulls
ITEMS: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "こんにちは — what's the weather in O'Reilly, \"admin\"; DROP TABLE x;--"},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "and this picture?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need the weather tool."}],
     "encrypted_content": None},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": "{\"city\": \"Zürich\", \"days\": 2}", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21.5 °C"},
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [
        {"type": "output_text", "text": "Sunny 😊 in Zürich", "annotations": [], "logprobs": []}]},
    {"type": "function_call_output", "call_id": "call_2",
     "output": [{"type": "input_text", "text": "nested"}, {"type": "input_image", "image_url": "https://x/y.png"}]},
    {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "s", "tools": [{"name": "t", "input_schema": {}}],
     "error": None},
]


@dataclass
class Host:
    proc: HostProcess
    data_dir: Path


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    data_dir = tmp_path_factory.mktemp("agents-host")
    proc = start_host_process(data_dir)
    try:
        yield Host(proc, data_dir)
    finally:
        proc.terminate()
        proc.proc.communicate()


def run(host: Host, backend: str, scenario: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with connect(data_dir=host.data_dir, client_id=f"agents-test-{backend}", backoff=0.05) as client:
            with anyio.fail_after(60):
                await scenario(client)

    anyio.run(main, backend=backend)


def texts(items: list[dict[str, Any]]) -> list[Any]:
    return [item.get("content") for item in items]


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_items_returns_exactly_what_was_added(host: Host, backend: str) -> None:
    """Lossless mapping: every Responses item shape comes back equal (and JSON-identical), and each is one
    transcript message whose blocks project its text (text, thinking, tool_call; tool outputs as tool rows)."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Lossless")
        await session.add_items(ITEMS[:4])
        await session.add_items(ITEMS[4:])
        got = await session.get_items()
        assert got == ITEMS
        assert [json.dumps(i, sort_keys=True) for i in got] == [json.dumps(i, sort_keys=True) for i in ITEMS]
        window = await client.session.get(session_id=session.session_id, message_limit=50)
        messages = window["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "user", "assistant", "assistant", "tool",
                                                 "assistant", "tool", "assistant"]
        assert all(m["meta"][ITEM_META_KEY] == item for m, item in zip(messages, ITEMS, strict=True))
        assert messages[2]["blocks"] == [{"type": "text", "text": "and this picture?"},
                                         {"type": "text", "text": "[image]"}]
        assert messages[3]["blocks"] == [{"type": "thinking", "text": "Need the weather tool."}]
        assert messages[4]["blocks"] == [{"type": "tool_call", "callId": "call_1", "name": "get_weather",
                                          "args": {"city": "Zürich", "days": 2}}]
        assert messages[5]["blocks"] == [{"type": "text", "text": "sunny, 21.5 °C"}]
        assert messages[6]["blocks"] == [{"type": "text", "text": "Sunny 😊 in Zürich"}]

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_projected_text_is_searchable(host: Host, backend: str) -> None:
    """Text is projected to the message's text blocks, so the host's search finds an item's words."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Searchable")
        word = f"quokka{backend}"
        await session.add_items([{"role": "user", "content": f"tell me about the {word} please"}])
        while True:  # the index follows the append
            found = await client.search.query(query=word, session_id=session.session_id)
            if found["results"]:
                break
            await anyio.sleep(0.05)
        assert json.dumps(found["results"][0]).find(word) >= 0

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pop_item_removes_the_newest_with_a_reversible_tombstone(host: Host, backend: str) -> None:
    """Port of the SDK's test_sqlite_session_memory_pop_item; the popped message stays restorable."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Pop")
        assert await session.pop_item() is None
        items = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there!"},
                 {"role": "user", "content": "How are you?"}]
        await session.add_items(items)
        assert len(await session.get_items()) == 3
        assert await session.pop_item() == items[2]
        assert texts(await session.get_items()) == ["Hello", "Hi there!"]
        assert await session.pop_item() == items[1]
        assert await session.pop_item() == items[0]
        assert await session.pop_item() is None
        assert await session.get_items() == []
        # nothing acknowledged is lost: the lines are tombstoned, and restoring one brings it back
        window = await client.session.get(session_id=session.session_id, message_limit=10)
        assert [m.get("deleted") for m in window["messages"]] == [True, True, True]
        await client.session.restore_message(session_id=session.session_id, message_id=window["messages"][1]["id"])
        assert await session.get_items() == [items[1]]

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_items_with_limit(host: Host, backend: str) -> None:
    """Port of test_sqlite_session_get_items_with_limit and the session_settings limit tests."""

    @dataclass
    class Settings:  # the shape of agents.SessionSettings the adapter reads
        limit: int | None

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Limit")
        contents = ["Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3"]
        await session.add_items([{"role": "user" if i % 2 == 0 else "assistant", "content": c}
                                 for i, c in enumerate(contents)])
        assert texts(await session.get_items()) == contents
        assert texts(await session.get_items(limit=2)) == contents[-2:]
        assert texts(await session.get_items(limit=4)) == contents[-4:]
        assert texts(await session.get_items(limit=10)) == contents
        assert await session.get_items(limit=0) == []
        assert texts(await session.get_items(limit=-1)) == contents
        limited = PiHostSession(client, session.session_id, session_settings=Settings(limit=3))
        assert texts(await limited.get_items()) == contents[-3:]
        assert texts(await limited.get_items(limit=2)) == contents[-2:]  # an explicit limit wins

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pages_and_tombstones_across_page_boundaries(host: Host, backend: str) -> None:
    """A history longer than a page is read backwards page by page; popped items in the middle are skipped."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Pages")
        session = PiHostSession(client, session.session_id, page_size=3)
        items = [{"role": "user", "content": f"m{i}"} for i in range(10)]
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.pop_item() == items[9]
        assert await session.pop_item() == items[8]
        await session.add_items([{"role": "user", "content": "m10"}])
        assert texts(await session.get_items()) == [f"m{i}" for i in range(8)] + ["m10"]
        assert texts(await session.get_items(limit=5)) == ["m4", "m5", "m6", "m7", "m10"]

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_clear_session_and_separate_sessions(host: Host, backend: str) -> None:
    """Port of test_sqlite_session_memory_direct and test_session_memory_pop_different_sessions: clearing or
    popping one session leaves another alone; a cleared session keeps its id and takes new items."""

    async def scenario(client: Client) -> None:
        one = await PiHostSession.open(client, title="One")
        two = await PiHostSession.open(client, title="Two")
        await one.add_items([{"role": "user", "content": "Session 1 message"}])
        await two.add_items([{"role": "user", "content": "Session 2 message 1"},
                             {"role": "user", "content": "Session 2 message 2"}])
        assert (await two.pop_item() or {}).get("content") == "Session 2 message 2"
        assert texts(await one.get_items()) == ["Session 1 message"]
        assert texts(await two.get_items()) == ["Session 2 message 1"]
        await one.add_items([{"role": "assistant", "content": "Hi there!"}])
        await one.clear_session()
        assert await one.get_items() == []
        assert await one.pop_item() is None
        assert texts(await two.get_items()) == ["Session 2 message 1"]
        window = await client.session.get(session_id=one.session_id, message_limit=10)
        assert [m.get("deleted") for m in window["messages"]] == [True, True]  # hidden, not destroyed
        await one.add_items([{"role": "user", "content": "after clear"}])
        assert texts(await one.get_items()) == ["after clear"]
        await one.clear_session()
        await one.clear_session()  # clearing an empty session is a no-op
        assert await one.get_items() == []

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_open_by_id_creates_once_and_foreign_messages_read_as_text(host: Host, backend: str) -> None:
    """``open`` with an id creates the session the first time and reopens it after (also when several open
    it at once); messages another client wrote are read as role + text items (tool rows are skipped)."""

    async def scenario(client: Client) -> None:
        sid = f"agents-open-{backend}"
        first = await PiHostSession.open(client, sid, title="By id")
        await first.add_items([{"role": "user", "content": "from the SDK"}])
        again = await PiHostSession.open(client, sid)
        assert again.session_id == sid and texts(await again.get_items()) == ["from the SDK"]
        await client.session.append_message(session_id=sid, message={
            "id": f"ui-{backend}", "role": "assistant", "blocks": [{"type": "text", "text": "typed in the app"}]})
        await client.session.append_message(session_id=sid, message={
            "id": f"tool-{backend}", "role": "tool", "blocks": [{"type": "text", "text": "raw"}]})
        assert await again.get_items() == [{"role": "user", "content": "from the SDK"},
                                           {"role": "assistant", "content": "typed in the app"}]
        assert await again.pop_item() == {"role": "assistant", "content": "typed in the app"}
        opened: list[str] = []  # several openers of one new id at once: one session, the same id for all

        async def open_one() -> None:
            opened.append((await PiHostSession.open(client, f"agents-race-{backend}")).session_id)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(open_one)
        assert opened == [f"agents-race-{backend}"] * 3

    run(host, backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bad_item_changes_nothing(host: Host, backend: str) -> None:
    """Port of test_sqlite_session_failed_add_items_releases_write_lock: an unserializable item fails the
    whole call before any write, and the session stays usable."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Bad item")
        with pytest.raises(TypeError):
            await session.add_items([{"role": "user", "content": "fine"}, {"role": "user", "content": object()}])
        with pytest.raises(ValueError):
            await session.add_items([{"role": "user", "content": float("nan")}])
        with pytest.raises(TypeError):
            await session.add_items(["not an item"])
        assert await session.get_items() == []
        await session.add_items([{"role": "user", "content": "after failure"}])
        assert texts(await session.get_items()) == ["after failure"]
        await session.add_items([])

    run(host, backend, scenario)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_retried_after_a_crash_is_applied_once(tmp_path: Path, backend: str) -> None:
    """Exactly-once: the host is killed right after an item's append is durable (and, on a second host,
    a pop's tombstone) but before answering; the client reconnects to a restarted host and resends the
    same submissionId, answered from the receipt: no item is stored twice, none popped twice."""
    state: dict[str, HostProcess] = {"host": start_host_process(tmp_path)}

    def restart(crashpoint: str | None) -> None:
        old = state["host"]
        old.terminate()
        old.proc.communicate()
        env = {"RT_CRASHPOINT": crashpoint} if crashpoint else None
        state["host"] = start_host_process(tmp_path, env=env)

    async def restart_when_dead(done: list[bool]) -> None:
        old = state["host"]
        await anyio.to_thread.run_sync(old.proc.wait)
        old.proc.communicate()
        state["host"] = await anyio.to_thread.run_sync(start_host_process, tmp_path)
        done.append(True)

    async def main() -> None:
        async with connect(data_dir=tmp_path, client_id=f"agents-crash-{backend}", backoff=0.05) as client:
            session = await PiHostSession.open(client, title="Crash")
            items = [{"role": "user", "content": f"once {i}"} for i in range(3)]

            async def add() -> None:
                await session.add_items(items)

            async def pop() -> None:
                assert await session.pop_item() == items[2]

            for crashpoint, action in (("append.after_fsync:1:kill", add),
                                       ("session.deleteMessage.after_commit:1:kill", pop)):
                await anyio.to_thread.run_sync(restart, crashpoint)
                done: list[bool] = []
                async with anyio.create_task_group() as tg:
                    tg.start_soon(restart_when_dead, done)
                    with anyio.fail_after(60):
                        await action()
                assert done == [True]
            assert await session.get_items() == items[:2]
            window = await client.session.get(session_id=session.session_id, message_limit=10)
            assert [m.get("deleted") for m in window["messages"]] == [None, None, True]
            assert client.connects == 5

    try:
        anyio.run(main, backend=backend)
    finally:
        state["host"].terminate()
        state["host"].proc.communicate()
