"""An OpenAI Agents SDK ``Session`` kept in pi-host: ``Runner.run(agent, text, session=PiHostSession(...))``.

::

    async with connect(data_dir=data_dir, client_id="my-agents-app") as client:
        session = await PiHostSession.open(client, "support-42", title="Support")
        result = await Runner.run(agent, "Where is my parcel?", session=session)

It implements the SDK's session protocol (``agents.memory.Session``: ``get_items``, ``add_items``,
``pop_item``, ``clear_session``, ``session_id``, ``session_settings``) on :class:`~pihost_client.Client`,
without importing the SDK (install ``pihost-client[agents]`` to have it). Like the client, it runs under
asyncio and trio; the SDK's ``Runner`` itself runs under asyncio (use ``Runner.run``/``run_streamed`` inside
the event loop the client was connected in, not ``run_sync``).

How items are stored:

* **One item, one message.** Each item (a Responses API input item: a message with role and content, a
  ``function_call``, a ``function_call_output``, ``reasoning``, ...) becomes one transcript message whose
  ``meta.agentsItem`` holds the item exactly as given (its JSON form), so :meth:`PiHostSession.get_items`
  returns what :meth:`PiHostSession.add_items` was given. The message's ``blocks`` are a projection for people
  and search: the text of a message item as ``text`` blocks (indexed: ``search.query`` finds it), reasoning
  summaries as ``thinking`` blocks, a function call as a ``tool_call`` block, a tool output as a ``tool``
  message. Messages in the session that the adapter did not write (typed in another client) are read as
  plain ``{"role", "content"}`` items from their text; messages without text are skipped.
* **Exactly once.** Every write carries its own ``submissionId`` (and each message its own id), chosen before
  the first attempt: when the connection drops before the answer, the client resends the same request after
  reconnecting and the host answers it from its receipt instead of applying it twice. ``add_items`` writes
  its items in order, one ``session.appendMessage`` each; when it fails part way (or is cancelled), the items
  before the failure are stored and the rest are not — calling it again with the same items stores them
  again.
* **Nothing acknowledged is lost.** :meth:`PiHostSession.pop_item` hides the newest item with a tombstone
  (``session.deleteMessage``): it leaves the context and the SDK's history, but the line stays in the
  transcript and ``session.restoreMessage`` brings it back. :meth:`PiHostSession.clear_session` tombstones
  every item, newest first (so a clear that fails part way leaves an older prefix, like a few pops), rather
  than truncating or deleting the session: the session keeps its id, settings and everything it held.
* **One writer per session.** Calls on one :class:`PiHostSession` are serialized (a lock); two processes
  popping the same session at once may both return the same newest item.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

import anyio

from ._generated import TranscriptMessage
from .client import Client, RpcError

__all__ = ["ITEM_META_KEY", "PiHostSession", "item_to_message", "message_to_item"]

ITEM_META_KEY = "agentsItem"
"""The key of a message's ``meta`` that holds the SDK item exactly as it was added."""

PAGE = 500
"""Messages read per ``session.get`` page (the host caps a page by bytes too)."""

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text_parts(content: Any) -> list[str]:
    """The text of a message item's ``content`` (a string or a list of content parts)."""
    if isinstance(content, str):
        return [content] if content else []
    texts: list[str] = []
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            for key in ("text", "refusal"):
                value = part.get(key)
                if isinstance(value, str) and value:
                    texts.append(value)
                    break
            else:
                if part.get("type") == "input_file" and isinstance(part.get("filename"), str):
                    texts.append(f"[file: {part['filename']}]")
                elif part.get("type") == "input_image":
                    texts.append("[image]")
    return texts


def _role_of(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind in (None, "message"):
        role = item.get("role")
        if isinstance(role, str) and role in _ROLES:
            return _ROLES[role]
        return "user"
    if isinstance(kind, str) and kind.endswith("_output"):
        return "tool"
    if kind == "mcp_approval_response":
        return "user"
    return "assistant"


def _blocks_of(item: Mapping[str, Any], role: str) -> list[dict[str, Any]]:
    kind = item.get("type")
    if kind in (None, "message"):
        return [{"type": "text", "text": text} for text in _text_parts(item.get("content"))]
    if kind == "reasoning":
        texts = _text_parts(item.get("summary")) + _text_parts(item.get("content"))
        return [{"type": "thinking", "text": text} for text in texts]
    if kind == "function_call":
        raw = item.get("arguments")
        args: Any = raw
        if isinstance(raw, str):
            try:
                args = json.loads(raw)
            except ValueError:
                args = raw
        return [{"type": "tool_call", "callId": str(item.get("call_id", "")), "name": str(item.get("name", "")),
                 "args": args}]
    if role == "tool":
        output = item.get("output")
        texts = [output] if isinstance(output, str) and output else _text_parts(output)
        return [{"type": "text", "text": text} for text in texts]
    return []


def item_to_message(item: Mapping[str, Any], message_id: str) -> TranscriptMessage:
    """The transcript message that stores ``item`` (a JSON-ready mapping) under ``message_id``."""
    role = _role_of(item)
    return cast(TranscriptMessage, {"id": message_id, "role": role, "blocks": _blocks_of(item, role),
                                    "meta": {ITEM_META_KEY: dict(item)}})


def message_to_item(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The SDK item a stored message holds: exactly the added item, or for a message another client wrote,
    ``{"role", "content"}`` from its text (None when it has none, or is a tool message)."""
    meta = message.get("meta")
    if isinstance(meta, Mapping):
        item = meta.get(ITEM_META_KEY)
        if isinstance(item, dict):
            return item
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        return None
    blocks = message.get("blocks")
    texts = [str(b["text"]) for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"
             and isinstance(b.get("text"), str) and b["text"]] if isinstance(blocks, list) else []
    if not texts:
        return None
    return {"role": role, "content": "\n".join(texts)}


def _json_item(item: Any) -> dict[str, Any]:
    """The item's JSON form (what the host stores and gives back); a bad item raises before anything is written."""
    if not isinstance(item, Mapping):
        dump = getattr(item, "model_dump", None)  # an SDK / openai pydantic model
        if not callable(dump):
            raise TypeError(f"a session item must be a mapping (a Responses API input item), not {type(item).__name__}")
        item = dump(mode="json", exclude_unset=True)
    data = json.loads(json.dumps(item, ensure_ascii=False, allow_nan=False))
    if not isinstance(data, dict):
        raise TypeError("a session item must be a JSON object")
    return data


class PiHostSession:
    """An Agents SDK session (``agents.memory.Session``) stored in one pi-host session. See the module docs."""

    session_settings: Any = None
    """An ``agents.SessionSettings`` (or None): its ``limit`` is the default of :meth:`get_items`."""

    def __init__(self, client: Client, session_id: str, *, session_settings: Any = None,
                 page_size: int = PAGE) -> None:
        self.client = client
        self.session_id = session_id
        self.session_settings = session_settings
        self.page_size = page_size
        """Messages per ``session.get`` page (1 to 5000)."""
        self._lock = anyio.Lock()

    @classmethod
    async def open(cls, client: Client, session_id: str | None = None, *, title: str | None = None,
                   project_path: str | None = None, session_settings: Any = None) -> PiHostSession:
        """The pi-host session ``session_id``, created (with ``title``) when it does not exist yet; a new one
        when ``session_id`` is None."""
        if session_id is not None:
            try:
                await client.session.get(session_id=session_id, message_limit=1)
                return cls(client, session_id, session_settings=session_settings)
            except RpcError as exc:
                if exc.data_code != "SESSION_NOT_FOUND":
                    raise
        try:
            created = await client.session.create(session_id=session_id, title=title or "Agents SDK session",
                                                  project_path=project_path, submission_id=_submission("create"))
        except RpcError as exc:
            if session_id is None or exc.data_code != "CONFLICT":
                raise
            return cls(client, session_id, session_settings=session_settings)  # created meanwhile by another
        return cls(client, created["id"], session_settings=session_settings)

    # -- the SDK's session protocol ----------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The history in order, or its newest ``limit`` items (``limit`` None: ``session_settings.limit``,
        else all; 0: none; negative: all)."""
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        if limit is not None and limit < 0:
            limit = None
        if limit == 0:
            return []
        async with self._lock:
            newest = [item for _, item in await self._newest(limit)]
        newest.reverse()
        return newest

    async def add_items(self, items: Sequence[Any]) -> None:
        """Append ``items`` in order, one message each (every append with its own submissionId)."""
        prepared = [_json_item(item) for item in items]  # all checked before the first write
        if not prepared:
            return
        async with self._lock:
            for item in prepared:
                message_id = f"oa_{uuid.uuid4().hex}"
                await self.client.session.append_message(
                    session_id=self.session_id, message=item_to_message(item, message_id),
                    submission_id=_submission("add"))

    async def pop_item(self) -> dict[str, Any] | None:
        """Hide the newest item (a tombstone: ``session.restoreMessage`` undoes it) and return it; None when
        the history is empty."""
        async with self._lock:
            newest = await self._newest(1)
            if not newest:
                return None
            message_id, item = newest[0]
            await self.client.session.delete_message(session_id=self.session_id, message_id=message_id,
                                                     submission_id=_submission("pop"))
            return item

    async def clear_session(self) -> None:
        """Hide every item, newest first (tombstones; the session and its lines stay)."""
        async with self._lock:
            for message_id, _ in await self._newest(None):
                await self.client.session.delete_message(session_id=self.session_id, message_id=message_id,
                                                         submission_id=_submission("clear"))

    # -- reading -----------------------------------------------------------------
    async def _newest(self, limit: int | None) -> list[tuple[str, dict[str, Any]]]:
        """Up to ``limit`` live items (all when None) as (message id, item), newest first: pages read
        backwards from the end of the transcript, tombstoned messages skipped."""
        found: list[tuple[str, dict[str, Any]]] = []
        before: int | None = None
        size = self.page_size if limit is None else min(self.page_size, limit + 8)
        while True:
            page = await self.client.session.get(session_id=self.session_id, message_before=before,
                                                 message_limit=size)
            for message in reversed(page["messages"]):
                if message.get("deleted") or message.get("inflight"):
                    continue
                item = message_to_item(message)
                if item is None:
                    continue
                found.append((message["id"], item))
                if limit is not None and len(found) >= limit:
                    return found
            start = page["messageStart"]
            if not page["hasMoreBefore"] or start <= 0:
                return found
            before = start


def _submission(what: str) -> str:
    return f"agents-{what}-{uuid.uuid4().hex}"
