"""The OpenAI Agents SDK's own session tests, run with ``PiHostSession`` against a real host (issue 25 item 7).

Ported from openai-agents-python ``tests/memory/test_session.py`` and ``tests/memory/test_session_limit.py``
(the ``Runner`` tests that run offline with the SDK's ``ScriptedModel``), with ``SQLiteSession`` replaced by
the adapter. The SDK's ``Runner`` runs under asyncio only; ``run_sync`` makes its own event loop, which
cannot use a client connected in another one, so the ``run`` and ``run_streamed`` variants are ported.
Skipped when the SDK is not installed (``pip install pihost-client[agents]``): it is an optional extra,
not in the project's bootstrap, because it brings some twenty packages (openai, mcp, starlette, uvicorn...).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from pihost_client import Client, connect
from pihost_client.agents_session import PiHostSession
from tests.hostkit import HostProcess, start_host_process

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pihost-client[agents])")
testing = pytest.importorskip("agents.testing", reason="this openai-agents has no agents.testing.ScriptedModel")

Agent = agents.Agent
Runner = agents.Runner
RunConfig = agents.RunConfig
SessionSettings = agents.SessionSettings
ScriptedModel = testing.ScriptedModel
assistant_message = testing.assistant_message
function_call = testing.function_call

RUNNERS = ["run", "run_streamed"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("agents-sdk-host")
    proc: HostProcess = start_host_process(root)
    try:
        yield root
    finally:
        proc.terminate()
        proc.proc.communicate()


def run(data_dir: Path, scenario: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with connect(data_dir=data_dir, client_id="agents-sdk-test", backoff=0.05) as client:
            with anyio.fail_after(60):
                await scenario(client)

    anyio.run(main, backend="asyncio")


async def run_agent(runner_method: str, agent: Any, input_data: Any, **kwargs: Any) -> Any:
    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    result = Runner.run_streamed(agent, input_data, **kwargs)
    async for _ in result.stream_events():
        pass
    return result


def test_the_adapter_is_an_sdk_session(data_dir: Path) -> None:
    """The SDK's runtime-checkable ``Session`` protocol accepts the adapter."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Protocol")
        assert isinstance(session, agents.memory.Session)

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_memory_basic_functionality(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_memory_basic_functionality_parametrized: the second turn sees the first."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Basic")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("San Francisco")])
        result1 = await run_agent(runner_method, agent, "What city is the Golden Gate Bridge in?", session=session)
        assert result1.final_output == "San Francisco"
        model.enqueue([assistant_message("California")])
        result2 = await run_agent(runner_method, agent, "What state is it in?", session=session)
        assert result2.final_output == "California"
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0]["content"] == "What city is the Golden Gate Bridge in?"
        assert last_input[1]["content"][0]["text"] == "San Francisco"

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_memory_different_sessions(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_memory_different_sessions_parametrized."""

    async def scenario(client: Client) -> None:
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        one = await PiHostSession.open(client, title="Cats")
        model.enqueue([assistant_message("I like cats")])
        await run_agent(runner_method, agent, "I like cats", session=one)
        two = await PiHostSession.open(client, title="Dogs")
        model.enqueue([assistant_message("I like dogs")])
        await run_agent(runner_method, agent, "I like dogs", session=two)
        model.enqueue([assistant_message("Yes, you mentioned cats")])
        result = await run_agent(runner_method, agent, "What did I say I like?", session=one)
        assert result.final_output == "Yes, you mentioned cats"
        seen = [item.get("content") for item in model.calls[-1].input]
        assert "I like cats" in seen and "I like dogs" not in seen

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_memory_appends_list_input_by_default(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_memory_appends_list_input_by_default: the model gets history + input as stored."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="List input")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        initial_history = [{"role": "user", "content": "Earlier message"},
                           {"role": "assistant", "content": "Saved reply"}]
        await session.add_items(initial_history)
        list_input = [{"role": "user", "content": "Test message"}]
        model.enqueue([assistant_message("This should run")])
        await run_agent(runner_method, agent, list_input, session=session)
        assert model.calls[-1].input == initial_history + list_input

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_callback_prepared_input(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_callback_prepared_input (a session_input_callback filters the history)."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Callback")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        initial_history = [{"role": "user", "content": "Hello there."},
                           {"role": "assistant", "content": "Hi, I'm here to assist you."}]
        await session.add_items(initial_history)

        def only_user(history: list[Any], new_input: list[Any]) -> list[Any]:
            return [item for item in history if item["role"] == "user"] + new_input

        new_turn_input = [{"role": "user", "content": "What your name?"}]
        model.enqueue([assistant_message("I'm gpt-4o")])
        await run_agent(runner_method, agent, new_turn_input, session=session,
                        run_config=RunConfig(session_input_callback=only_user))
        assert model.calls[-1].input == [initial_history[0], new_turn_input[0]]

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_callback_repeating_history_does_not_grow_session(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_callback_repeating_history_does_not_grow_session."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Repeat")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)

        def repeat_first(history: list[Any], new_input: list[Any]) -> list[Any]:
            return history + [history[0]] + new_input if history else new_input

        for turn in range(3):
            model.enqueue([assistant_message(f"assistant {turn}")])
            await run_agent(runner_method, agent, f"user {turn}", session=session,
                            run_config=RunConfig(session_input_callback=repeat_first))
        stored = await session.get_items()
        assert [i.get("content") for i in stored if i.get("role") == "user"] == ["user 0", "user 1", "user 2"]
        assert len(stored) == 6

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_limit_parameter(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_limit_parameter and test_session_limit_zero (RunConfig session_settings)."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Limit")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for i in (1, 2, 3):
            model.enqueue([assistant_message(f"Reply {i}")])
            await run_agent(runner_method, agent, f"Message {i}", session=session)
        assert len(await session.get_items()) == 6
        model.enqueue([assistant_message("Reply 4")])
        await run_agent(runner_method, agent, "Message 4", session=session,
                        run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        last_input = model.calls[-1].input
        assert len(last_input) == 3
        assert last_input[0].get("content") == "Message 3"
        assert last_input[1].get("content")[0]["text"] == "Reply 3"
        assert last_input[2].get("content") == "Message 4"
        model.enqueue([assistant_message("Reply 5")])
        await run_agent(runner_method, agent, "Message 5", session=session,
                        run_config=RunConfig(session_settings=SessionSettings(limit=0)))
        assert [i.get("content") for i in model.calls[-1].input] == ["Message 5"]

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_session_limit_drops_unmatched_history_function_call_output(data_dir: Path, runner_method: str) -> None:
    """Port of test_session_limit_drops_unmatched_history_function_call_output."""

    async def scenario(client: Client) -> None:
        session = await PiHostSession.open(client, title="Tool pair")
        history = [
            {"role": "user", "content": "What is the weather?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}]},
        ]
        await session.add_items(history)
        assert await session.get_items(limit=2) == history[-2:]
        model = ScriptedModel()
        model.enqueue([assistant_message("Tomorrow is sunny too.")])
        agent = Agent(name="test", model=model)
        await run_agent(runner_method, agent, "What about tomorrow?", session=session,
                        run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        assert model.calls[-1].input == [history[-1], {"role": "user", "content": "What about tomorrow?"}]

    run(data_dir, scenario)


def test_runner_with_session_settings_override(data_dir: Path) -> None:
    """Port of test_runner_with_session_settings_override: RunConfig's limit beats the session's."""

    async def scenario(client: Client) -> None:
        opened = await PiHostSession.open(client, title="Override")
        session = PiHostSession(client, opened.session_id, session_settings=SessionSettings(limit=100))
        await session.add_items([{"role": "user", "content": f"Turn {i}"} for i in range(10)])
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        model.enqueue([assistant_message("Got it")])
        await Runner.run(agent, "New question", session=session,
                         run_config=RunConfig(session_settings=SessionSettings(limit=2)))
        history = [item for item in model.calls[-1].input if item.get("content") != "New question"]
        assert [item.get("content") for item in history] == ["Turn 8", "Turn 9"]

    run(data_dir, scenario)


@pytest.mark.parametrize("runner_method", RUNNERS)
def test_a_tool_run_stores_what_sqlite_session_stores(data_dir: Path, runner_method: str) -> None:
    """A run with a function tool (call, output, reply) leaves the same items in pi-host as in the SDK's own
    SQLiteSession, and the next turn's model input is the same with either."""

    def get_weather(city: str) -> str:
        return f"sunny in {city}"

    async def turn(session: Any) -> Any:
        model = ScriptedModel()
        agent = Agent(name="test", model=model, tools=[agents.function_tool(get_weather)])
        model.enqueue([function_call("get_weather", {"city": "Zürich"}, call_id="call_w")])
        model.enqueue([assistant_message("It is sunny in Zürich.")])
        await run_agent(runner_method, agent, "Weather in Zürich?", session=session)
        model.enqueue([assistant_message("You are welcome.")])
        await run_agent(runner_method, agent, "Thanks!", session=session)
        return model.calls[-1].input

    async def scenario(client: Client) -> None:
        reference = agents.SQLiteSession("reference")
        try:
            expected_input = await turn(reference)
            expected_items = await reference.get_items()
        finally:
            reference.close()
        session = await PiHostSession.open(client, title="Tools")
        assert await turn(session) == expected_input
        stored = await session.get_items()
        assert stored == expected_items
        assert [i.get("type") for i in stored].count("function_call_output") == 1
        assert await session.pop_item() == expected_items[-1]

    run(data_dir, scenario)
