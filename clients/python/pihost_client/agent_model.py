"""Models the reference sidecar can run: a deterministic fake, or an OpenAI-compatible endpoint.

A model turns a conversation into a stream of :class:`TextDelta` and
:class:`ToolRequest` items and finishes with :class:`Finished` (token usage).

* :class:`FakeModel` (``--model fake``) needs no network: it streams a canned
  reply word by word (``delay`` seconds apart); a prompt that starts with
  ``ls`` or ``list`` asks for the ``list_dir`` tool first, one that starts
  with ``read <path>`` asks for ``read_file``. The reply ends with ``[done]``.
* :class:`OpenAIModel` streams ``POST {base_url}/chat/completions`` with
  ``stream: true`` (server-sent events) using the standard library's HTTP
  client in a worker thread, so it needs no extra dependency.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.to_thread

__all__ = ["FakeModel", "Finished", "Model", "OpenAIModel", "TextDelta", "ToolRequest", "Turn"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolRequest:
    call_id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Finished:
    input_tokens: int
    output_tokens: int


Chunk = TextDelta | ToolRequest | Finished


@dataclass
class Turn:
    """What the model sees: earlier messages (OpenAI chat shape) and this turn's tool results."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: Sequence[dict[str, Any]] = ()


class Model(Protocol):
    name: str

    def stream(self, turn: Turn) -> AsyncIterator[Chunk]: ...


_WORDS = ("The", "host", "keeps", "every", "byte", "of", "this", "reply", "durable:", "a", "checkpoint",
          "lands", "on", "disk", "while", "it", "streams,", "and", "a", "crash", "promotes", "it.")


def _tokens(text: str) -> int:
    return max(1, len(text.split()))


class FakeModel:
    """Deterministic replies for demos and tests."""

    def __init__(self, *, delay: float = 0.05, words: int = 24) -> None:
        self.name = "fake"
        self.delay = delay
        self.words = words

    async def stream(self, turn: Turn) -> AsyncIterator[Chunk]:
        prompt = next((m["content"] for m in reversed(turn.messages) if m.get("role") == "user"), "")
        results = [m for m in turn.messages if m.get("role") == "tool"]
        lowered = prompt.strip().lower()
        if not results and (lowered.startswith("ls") or lowered.startswith("list")):
            yield ToolRequest("call_1", "list_dir", {"path": "."})
        elif not results and lowered.startswith("read "):
            yield ToolRequest("call_1", "read_file", {"path": prompt.strip()[5:].strip()})
        else:
            head = f"You said: {prompt.strip()}." if not results else f"The tool answered: {results[-1]['content']}"
            words = [*head.split(), *(_WORDS[i % len(_WORDS)] for i in range(self.words)), "[done]"]
            for i, word in enumerate(words):
                await anyio.sleep(self.delay)
                yield TextDelta(word if i == 0 else " " + word)
            yield Finished(sum(_tokens(str(m.get("content", ""))) for m in turn.messages), len(words))
            return
        yield Finished(_tokens(prompt), 1)


class OpenAIModel:
    """An OpenAI-compatible ``/chat/completions`` endpoint, streamed."""

    def __init__(self, name: str, *, base_url: str, api_key: str | None, timeout: float = 120.0) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def _request(self, turn: Turn) -> urllib.request.Request:
        body: dict[str, Any] = {"model": self.name, "messages": turn.messages, "stream": True,
                                "stream_options": {"include_usage": True}}
        if turn.tools:
            body["tools"] = [{"type": "function", "function": t} for t in turn.tools]
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
                                      headers=headers, method="POST")

    async def stream(self, turn: Turn) -> AsyncIterator[Chunk]:
        send, recv = anyio.create_memory_object_stream[dict[str, Any] | BaseException | None](64)
        request = self._request(turn)

        def pump() -> None:
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - the user's URL
                    for raw in response:
                        line = raw.decode("utf-8").strip()
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        anyio.from_thread.run(send.send, json.loads(data))
                anyio.from_thread.run(send.send, None)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # the reader stopped listening (cancelled or failed)
            except (OSError, ValueError, urllib.error.URLError) as exc:
                try:
                    anyio.from_thread.run(send.send, exc)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

        calls: dict[int, dict[str, Any]] = {}
        usage = (0, 0)
        async with send, anyio.create_task_group() as tg:
            tg.start_soon(lambda: anyio.to_thread.run_sync(pump))
            async with recv:
                async for item in recv:
                    if item is None:
                        break
                    if isinstance(item, BaseException):
                        raise ModelError(f"{self.base_url}: {item}") from item
                    if isinstance(item.get("usage"), dict):
                        u = item["usage"]
                        usage = (int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)))
                    for choice in item.get("choices") or []:
                        delta = choice.get("delta") or {}
                        if delta.get("content"):
                            yield TextDelta(str(delta["content"]))
                        for call in delta.get("tool_calls") or []:
                            slot = calls.setdefault(int(call.get("index", 0)), {"id": "", "name": "", "args": ""})
                            slot["id"] = call.get("id") or slot["id"]
                            fn = call.get("function") or {}
                            slot["name"] = fn.get("name") or slot["name"]
                            slot["args"] += fn.get("arguments") or ""
        for index in sorted(calls):
            call = calls[index]
            try:
                args = json.loads(call["args"] or "{}")
            except ValueError:
                args = {"_raw": call["args"]}
            yield ToolRequest(call["id"] or f"call_{index}", call["name"], args if isinstance(args, dict) else {})
        yield Finished(*usage)


class ModelError(Exception):
    """The model endpoint failed (network, HTTP status, malformed stream)."""
