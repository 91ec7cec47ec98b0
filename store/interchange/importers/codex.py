"""OpenAI Codex CLI rollouts: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl``.

Each line is ``{"timestamp", "type", "payload"}``. The conversation is the
``response_item`` lines (what was sent to and returned by the model);
``event_msg`` lines are UI events that mostly repeat it and are skipped,
except the ones below that carry usage, a command's status or the model.
What becomes what:

* ``message`` items: ``user`` → user, ``assistant`` → assistant (``phase``
  kept in meta), ``developer``/``system`` and the harness-injected user items
  (``<environment_context>``, AGENTS.md instructions, ``<subagent_notification>``) → ``system`` notices;
* ``reasoning`` → a ``thinking`` block (summary text) with
  ``encrypted_content`` as bounded replay state; reasoning, assistant text,
  ``web_search_call`` (a ``hostedSearch`` block) and ``image_generation_call``
  (the image the model made: an image attachment) of one model response form
  one assistant message (a response ends at its usage report or a tool output);
* ``function_call`` / ``custom_tool_call`` / ``local_shell_call`` /
  ``tool_search_call`` → a ``tool`` message completed by the matching
  ``*_output`` item (``call_id``); a shell output whose metadata reports a
  non-zero exit code is ``error``;
* a command's outcome: the output's exit code (the old JSON shape's
  ``metadata.exit_code``, the current text's "Process exited with code N"),
  and the ``item_completed`` ``CommandExecution`` / ``exec_command_end``
  events (``status`` failed/declined, ``exit_code``), whichever order they
  come in;
* usage: each model response's usage goes on the first message it produced
  (its assistant message, or its first tool call when it only called tools):
  the ``token_usage_record`` line of that ``response_id`` (exact), else the
  ``token_count`` event's ``last_token_usage`` — one report per response;
* ``thread_settings_applied`` carries the model and provider like ``turn_context``;
* ``compacted`` → a compaction checkpoint (``message`` is the summary);
* events a person saw in Codex's transcript view: ``error`` (its message), ``turn_aborted`` (the reason) and
  ``exited_review_mode`` (a review's verdict and findings, rendered as Codex lists them; the structure as
  ``meta.review``) → ``system`` notices with ``meta.importedKind`` ``codex/<event>``;
* ``session_meta`` (the first one) names the session and its cwd, its ``git`` (branch, commit, repository URL)
  is the origin history's ``git``, served as ``historyGit``;
  ``turn_context`` carries the model; ``ghost_snapshot``, ``world_state`` and
  the other bookkeeping kinds are counted as skipped, unknown kinds as
  unknown.

A spawned agent's thread (``session_meta.parent_thread_id`` / ``source.subagent.thread_spawn``) is a
session of its own, as in Codex, linked both ways: the parent's ``spawn_agent`` record has
``meta.childSessionId`` (the child's host id, from the call's ``item_completed`` ``receiver_thread_ids``
or its ``{"agent_id"}`` output), the child's origin history ``spawnedBy`` (the parent's host id, the
agent's nickname and, when the parent's rollout is under the same root, the ``spawn_agent`` call id),
served as ``spawnedBy`` with the session. The thread's prompt is the parent agent's words, not the
user's: a ``user`` message of a turn the parent started (``task_started.turn_attribution.parent_turn_id``;
a rollout without turn attribution: the thread's first prompt) keeps role ``user`` and carries
``meta.fromAgent`` ``{sessionId, toolCallId?}`` (the parent session and its spawning call). The child's
rollout does not name the spawning call (only the parent's turn), so ``toolCallId`` is known only when
the parent's rollout is under the same root.

Rollouts written before ``session_meta`` existed (a bare first line with
``id``/``timestamp``, then bare items) are read the same way.

Names: a record is named by the line it comes from, ``H<digest>`` of that line's JSON value (keys sorted, its
``ordinal`` left out; ``.<n>`` for the n-th repeat of a line), so a re-import of a rollout whose earlier part
changed since (an earlier line of another length, CRLF line ends, lines cut at a compaction) finds every line
it holds and adds only the new ones. Importers before named a record by its line's byte offset (``L<offset>``),
which a change of any earlier line's length moved: the re-import added every later line again. A session
imported that way keeps those names (:func:`named_as_before`), or its lines would all come in a second time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from store.interchange.importers.common import (
    Emitter,
    FileReport,
    LineReader,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    Slot,
    SourceUnit,
    bounded_replay,
    bounded_value,
    file_report,
    finalize,
    join_id,
    json_value_ok,
    message_record,
    parse_counted,
    parse_object,
    session_id_for,
    stamp,
    text_block,
    to_ms,
)

SOURCE = "codex"
TOP_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted",
                       "token_usage_record"})
ITEM_TYPES = frozenset({
    "message", "reasoning", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
    "local_shell_call", "web_search_call", "tool_search_call", "tool_search_output",
})
SKIPPED_ITEMS = frozenset({"ghost_snapshot", "agent_message"})
SKIPPED_TOP = frozenset({"world_state", "inter_agent_communication_metadata"})
CALL_TYPES = {"function_call": "function", "custom_tool_call": "custom", "local_shell_call": "local_shell",
              "tool_search_call": "tool_search"}
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output", "tool_search_output",
                          "local_shell_call_output"})
CONTEXT_PREFIXES = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions", "<INSTRUCTIONS>",
                    "<permissions instructions>", "<subagent_notification>")
"""Harness-injected ``user`` items: system notices, never the user's words (``<subagent_notification>``:
a spawned agent's result, injected into its parent thread when it finishes)."""
TEXT_TYPES = frozenset({"input_text", "output_text", "text", "refusal"})
_UUID_TAIL = re.compile(r"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$")
_DATA_URL = re.compile(r"^data:([\w.+/-]{1,100});base64,", re.ASCII)
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"))


def _image_type(data: bytes) -> str | None:
    """The image type of ``data`` by its first bytes (PNG, JPEG, GIF, WebP); None: not one of those."""
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    return "image/webp" if data[:4] == b"RIFF" and data[8:12] == b"WEBP" else None
SEARCH_KINDS = {"search": "search", "open_page": "openPage", "find_in_page": "findInPage"}
FAILED_STATUSES = frozenset({"failed", "declined"})
"""``CommandExecution`` item statuses that mean the command did not succeed (Codex
``CommandExecutionStatus``: inProgress | completed | failed | declined)."""
MAX_TRACKED_CALLS = 4096
"""Completed tool calls remembered for a late ``item_completed`` status (oldest forgotten first)."""
_EXIT_LINE = re.compile(r"^Process exited with code (-?\d+)\s*$", re.MULTILINE)


LINE_IDS = "lineIds"
""":attr:`SourceUnit.locator` key: ``offset`` when the session's records are named by byte offset."""
_OFFSET_IDS = "L[0-9]*"


def named_as_before(unit: SourceUnit, holds: Callable[[str], bool]) -> SourceUnit:
    """``unit``, told to name its records by byte offset when its session was imported so (``holds(glob)``:
    whether the session has a message whose id matches the GLOB pattern). Importers before content ids named a
    line ``L<offset>``; their sessions keep those names, or every record would come in a second time."""
    if holds(f"{unit.session_id}:{_OFFSET_IDS}"):
        return replace(unit, locator=(*unit.locator, (LINE_IDS, "offset")))
    return unit


def discover(root: Path) -> Iterator[SourceUnit]:
    """One unit per rollout. A spawned agent's thread whose parent's rollout is under the same root gets
    the parent's file as its second file: the spawning call is read from it (and a change of it
    re-reads the child, so the link does not depend on which of the two was written or imported first)."""
    files = [root] if root.is_file() else sorted(p for top in _rollout_roots(root) for p in top.rglob("*.jsonl")
                                                 if p.is_file())
    heads = [(path, *_head(path)) for path in files]
    by_thread = {ext: path for path, ext, _parent in heads}
    for path, ext, parent in heads:
        parent_file = by_thread.get(parent) if parent is not None else None
        if parent_file is not None and parent_file != path:
            yield SourceUnit(SOURCE, ext, (path, parent_file), (("parentFile", str(parent_file)),))
        else:
            yield SourceUnit(SOURCE, ext, (path,))


def _rollout_roots(root: Path) -> list[Path]:
    """Where the rollouts under ``root`` are: Codex's home (``~/.codex``, ``CODEX_HOME``: it holds
    ``sessions/``) is read as its ``sessions/`` and ``archived_sessions/`` folders, not its own files
    (the prompt history ``history.jsonl`` is no rollout); any other folder whole."""
    if (root / "sessions").is_dir():
        return [p for p in (root / "sessions", root / "archived_sessions") if p.is_dir()]
    return [root]


def _external_id(path: Path) -> str:
    return _head(path)[0]


def _head(path: Path) -> tuple[str, str | None]:
    """(thread id, parent thread id of a spawned agent's thread) from the rollout's first line."""
    try:
        reader = LineReader(path, max_line_bytes=8 << 20, chunk=1 << 16)
        for line in reader:
            rec = parse_object(line.data) if line.data is not None else None
            if rec is not None:
                payload = rec.get("payload")
                if rec.get("type") == "session_meta" and isinstance(payload, Mapping):
                    if isinstance(payload.get("id"), str) and payload["id"]:
                        return str(payload["id"]), _spawn(payload)[0]
                elif "type" not in rec and isinstance(rec.get("id"), str) and rec["id"]:
                    return str(rec["id"]), None
            break
    except OSError:
        pass
    match = _UUID_TAIL.search(path.stem)
    return (match.group(1) if match else path.stem), None


def _spawn(payload: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(parent thread id, agent nickname) of a spawned agent's ``session_meta`` (``parent_thread_id``, or
    ``source.subagent.thread_spawn``); (None, None) for a thread the user started."""
    source = payload.get("source")
    sub = source.get("subagent") if isinstance(source, Mapping) else None
    spawn = sub.get("thread_spawn") if isinstance(sub, Mapping) else None
    spawn = spawn if isinstance(spawn, Mapping) else {}
    parent = payload.get("parent_thread_id") or spawn.get("parent_thread_id")
    nick = payload.get("agent_nickname") or spawn.get("agent_nickname") or spawn.get("agent_role")
    return (parent if isinstance(parent, str) and parent else None), (nick if isinstance(nick, str) and nick else None)


def _spawned_child(item: Mapping[str, Any]) -> str | None:
    """The thread a ``spawn_agent`` call started: its ``item_completed`` ``CollabAgentToolCall``
    (``receiver_thread_ids``) or its output (``{"agent_id": ...}``)."""
    receivers = item.get("receiver_thread_ids")
    if isinstance(receivers, list) and receivers and isinstance(receivers[0], str) and receivers[0]:
        return receivers[0]
    out = item.get("output")
    if isinstance(out, str) and out.lstrip().startswith("{") and "agent_id" in out:
        try:
            parsed = orjson.loads(out)
        except orjson.JSONDecodeError:
            return None
        agent = parsed.get("agent_id") if isinstance(parsed, Mapping) else None
        return agent if isinstance(agent, str) and agent else None
    return None


def _spawning_call(path: Path, child: str, ctx: ParseContext, file: FileReport) -> str | None:
    """The call id of the parent's ``spawn_agent`` call that started ``child`` (read from the parent's
    rollout: only lines naming the child are parsed)."""
    needle = child.encode()
    found: str | None = None
    try:
        reader = LineReader(path, max_line_bytes=ctx.limits.max_line_bytes, chunk=ctx.limits.read_chunk)
        for line in reader:
            if found is not None or line.data is None or needle not in line.data:
                continue
            rec = parse_object(line.data)
            payload = rec.get("payload") if rec is not None else None
            if not isinstance(payload, Mapping):
                continue
            item = payload.get("item") if payload.get("type") == "item_completed" else payload
            if not isinstance(item, Mapping) or _spawned_child(item) != child:
                continue
            call = item.get("id") if payload.get("type") == "item_completed" else item.get("call_id")
            if isinstance(call, str) and call:
                found = call
        file_report(reader, file)
    except OSError:
        return None
    return found


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    sid = unit.session_id
    meta = SessionMeta(SOURCE, unit.external_id, sid)
    report = SessionReport(SOURCE, unit.external_id, sid)
    conv = _Converter(ctx, meta, report, sid, unit.files[0])
    conv.offset_ids = dict(unit.locator).get(LINE_IDS) == "offset"
    parent_file = dict(unit.locator).get("parentFile")
    conv.parent_file = Path(parent_file) if parent_file else None
    return Parsed(meta, report, finalize(conv.run(), report, ctx.limits))


class _Converter:
    def __init__(self, ctx: ParseContext, meta: SessionMeta, report: SessionReport, sid: str, path: Path) -> None:
        self.ctx, self.meta, self.report, self.sid, self.path = ctx, meta, report, sid, path
        self.file = FileReport(str(path))
        report.files.append(self.file)
        self.emitter = Emitter(ctx.limits, report)
        self.pending: dict[str, Slot] = {}
        self.group: Slot | None = None
        self.group_saw_output = False
        self.recognized = False
        self.model: str | None = None
        self.provider: str | None = None
        self.parsed = 0
        self.session_metas = 0
        # one model response's usage goes on one message: the first the response produced (its
        # assistant message, or its first tool call when it only called tools)
        self.resp_target: Slot | None = None
        self.resp_usage: str | None = None
        """Where the current response's usage came from: ``record`` (token_usage_record), ``count``."""
        self.resp_id: str | None = None
        self.exec_results: dict[str, tuple[bool, int | None]] = {}
        """call id → (failed, exit code) from ``item_completed`` / ``exec_command_end`` events."""
        self.done_calls: dict[str, Slot] = {}
        """call id → the completed tool slot (a status event may follow the output)."""
        self.parent_file: Path | None = None
        """The parent's rollout of a spawned agent's thread (discovered under the same root)."""
        self.spawn_link: dict[str, str] | None = None
        """``{sessionId, toolCallId?}`` of the parent agent of a spawned thread (``meta.fromAgent``)."""
        self.turn_from_parent: bool | None = None
        """Whether the current turn was started by the parent agent (None: the rollout does not say)."""
        self.prompts = 0
        self.offset_ids = False
        """Name records by their line's byte offset (``L<offset>``), as importers before content ids did: the
        session was imported that way (:func:`named_as_before`)."""
        self.seen_lines: set[bytes] = set()
        self.repeats: dict[bytes, int] = {}
        """Digests of the item lines read, and how often a line seen before came again (:meth:`line_id`)."""

    def line_id(self, rec: Mapping[str, Any], offset: int) -> str:
        """The name of what a line becomes: ``H<digest>`` of the line's JSON value (sorted keys, without the
        ``ordinal`` a rewrite may renumber), ``.<n>`` for its n-th repeat; so a rollout whose earlier part
        changed (a line's length, CRLF line ends, lines taken out) names every line as before."""
        if self.offset_ids:
            return f"L{offset}"
        value = {k: v for k, v in rec.items() if k != "ordinal"}
        try:
            data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):  # e.g. an integer past 64 bits
            data = repr(sorted(value.items(), key=lambda kv: kv[0])).encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(data, digest_size=10).digest()
        name = f"H{digest.hex()}"
        if digest not in self.seen_lines:
            if len(self.seen_lines) < self.ctx.limits.max_tracked_ids:
                self.seen_lines.add(digest)
            return name
        n = self.repeats.get(digest, 0) + 1
        self.repeats[digest] = n
        return f"{name}.{n}"

    def run(self) -> Iterator[Slot]:
        reader = LineReader(self.path, max_line_bytes=self.ctx.limits.max_line_bytes, chunk=self.ctx.limits.read_chunk,
                            mark=self.ctx.mark(self.path))
        for line in reader:
            self.file.lines += 1
            if line.data is None:
                self.file.oversized_lines += 1
                continue
            if not line.data.strip():
                self.file.blank_lines += 1
                continue
            rec = parse_counted(line.data, self.file)
            if rec is None:
                self.file.bad_lines += 1
                continue
            self.parsed += 1
            self.take(rec, line.offset, line.length)
            if not self.recognized and self.parsed >= self.ctx.limits.recognize_within_lines:
                break
            yield from self.emitter.ready()
        if not self.recognized:
            if self.file.lines == self.file.blank_lines:
                raise Refused("EMPTY_SESSION", f"{self.path} holds no complete line")
            raise Refused("NOT_A_SESSION_FILE", f"{self.path} is not a Codex rollout")
        self.close_group()
        self.report.unpaired_tool_calls += len(self.pending)
        self.pending.clear()
        yield from self.emitter.finish()
        file_report(reader, self.file)

    # ------------------------------------------------------------------ helpers
    def close_group(self) -> None:
        if self.group is not None:
            self.group.held = False
            self.group = None

    def group_slot(self, msg_id: str, ts: int | None, length: int) -> Slot:
        # a tool output, or the usage report that ends the group's response (the next item is another
        # response's, even with only event_msg lines between, as before a compaction's summary reply)
        if self.group is not None and (self.group_saw_output or self.resp_usage is not None):
            self.close_group()
        if self.group is None:
            meta: dict[str, Any] = {}
            if self.model:
                meta["modelId"] = self.model
            if self.provider:
                meta["providerId"] = self.provider
            self.group = self.emitter.push(message_record(msg_id, "assistant", ts, [], meta=meta), held=True,
                                           weight=length)
            self.group_saw_output = False
        self.response_output(self.group)
        return self.group

    # ------------------------------------------------------------------ usage per response
    def response_output(self, slot: Slot) -> None:
        """An item of a model response was emitted; after a usage report, it starts the next response."""
        if self.resp_usage is not None:
            self.end_response()
        if self.resp_target is None:
            self.resp_target = slot

    def end_response(self) -> None:
        self.resp_target, self.resp_usage, self.resp_id = None, None, None

    def set_meta(self, slot: Slot, **values: Any) -> None:
        record = slot.record
        self.emitter.replace(slot, {**record, "meta": {**(record.get("meta") or {}), **values}})

    def attach_usage(self, usage: Mapping[str, Any], source: str, response_id: str | None) -> bool:
        """Put one response's usage on its first message, once (a token_usage_record wins over the
        token_count event of the same response; a second report of either kind is a duplicate)."""
        target = self.resp_target
        if target is None or not json_value_ok(usage):
            return False
        if self.resp_usage == "record" or (self.resp_usage == "count" and source == "count"):
            return False
        values: dict[str, Any] = {"usage": dict(usage)}
        if response_id:
            values["responseId"] = response_id
        self.set_meta(target, **values)
        self.resp_usage, self.resp_id = source, response_id
        return True

    # ------------------------------------------------------------------ lines
    def take(self, rec: dict[str, Any], offset: int, length: int) -> None:
        kind = rec.get("type")
        payload = rec.get("payload")
        ts = to_ms(rec.get("timestamp"))
        if kind is None and self.parsed == 1 and isinstance(rec.get("id"), str):
            kind, payload = "session_meta", rec  # a rollout from before session_meta existed
        elif isinstance(kind, str) and kind in ITEM_TYPES and "payload" not in rec:
            kind, payload = "response_item", rec  # ... whose items were bare lines
        kind_name = kind if isinstance(kind, str) else "<no type>"
        self.file.record_types[kind_name] += 1
        if kind in TOP_TYPES:
            self.recognized = True
        if not isinstance(payload, Mapping):
            if kind in TOP_TYPES:
                self.file.skipped[f"{kind_name}(no payload)"] += 1
            else:
                self.file.unknown[kind_name] += 1
            return
        self.meta.saw_time(ts)
        if kind == "session_meta":
            self.session_meta(payload, ts)
        elif kind == "turn_context":
            self.close_group()
            self.end_response()
            self.saw_model(payload.get("model"))
            if self.meta.cwd is None and isinstance(payload.get("cwd"), str) and payload["cwd"].startswith("/"):
                self.meta.cwd = payload["cwd"]
        elif kind == "token_usage_record":
            self.usage_record(payload)
        elif kind == "response_item":
            self.item(payload, self.line_id(rec, offset), length, ts)
        elif kind == "compacted":
            self.compacted(payload, self.line_id(rec, offset), ts)
        elif kind == "event_msg":
            if not self.notice_event(payload, rec, offset, length, ts):
                self.event(payload)
        elif kind in SKIPPED_TOP:
            self.file.skipped[kind_name] += 1
        else:
            self.file.unknown[kind_name] += 1

    def saw_model(self, model: object) -> None:
        if isinstance(model, str) and model:
            self.model = model
            models = self.meta.history.setdefault("modelIds", [])
            if model not in models and len(models) < 20:
                models.append(model)

    def usage_record(self, payload: Mapping[str, Any]) -> None:
        """``token_usage_record``: the exact usage of one response, keyed by ``response_id``.

        Shape (openai/codex, codex-rs protocol ``TokenUsageRecord``, persisted as
        ``RolloutItem::TokenUsageRecord`` by core's ``record_observed_response_completed``):
        ``{thread_id, turn_id, session_id, root_turn_id, response_id, usage, turn_token_usage,
        thread_token_usage, attribution: {model, model_provider, ...}, completed_at_ms}``; ``usage``
        is the response's own figures, the two others cumulative (never added).
        """
        usage = payload.get("usage")
        rid = payload.get("response_id")
        response_id = rid if isinstance(rid, str) and rid else None
        if response_id is not None and response_id == self.resp_id:
            self.file.skipped["token_usage_record(duplicate)"] += 1
            return
        if not isinstance(usage, Mapping) or not self.attach_usage(usage, "record", response_id):
            self.file.skipped["token_usage_record(no message)"] += 1

    def session_meta(self, payload: Mapping[str, Any], ts: int | None) -> None:
        self.session_metas += 1
        if self.session_metas > 1:
            self.file.skipped["session_meta(additional)"] += 1
            return
        cwd = payload.get("cwd")
        if isinstance(cwd, str) and cwd.startswith("/"):
            self.meta.cwd = cwd
        version = payload.get("cli_version")
        origin = payload.get("originator")
        label = "Codex" + (f" {version}" if isinstance(version, str) else "") + (
            f" ({origin})" if isinstance(origin, str) else "")
        self.meta.label = label[:80]
        if isinstance(payload.get("model_provider"), str):
            self.provider = payload["model_provider"]
            self.meta.history["providerId"] = self.provider
        self.meta.saw_time(to_ms(payload.get("timestamp")))
        git = payload.get("git")
        if isinstance(git, Mapping):
            self.meta.saw_git(git.get("branch"), git.get("commit_hash"), git.get("repository_url"))
        parent, nick = _spawn(payload)
        if parent is not None:
            link = {"sessionId": session_id_for(SOURCE, parent)}
            if nick is not None:
                link["agentName"] = nick[:200]
            if self.parent_file is not None:
                parent_report = FileReport(str(self.parent_file), reference=True)
                call = _spawning_call(self.parent_file, self.meta.external_id, self.ctx, parent_report)
                if parent_report.sha256:
                    self.report.files.append(parent_report)  # fingerprinted: a change re-reads the link
                if call is not None:
                    link["toolCallId"] = call
            self.meta.history["spawnedBy"] = link
            self.spawn_link = {k: v for k, v in link.items() if k in ("sessionId", "toolCallId")}

    def spawned(self, item: Mapping[str, Any], call_id: object) -> None:
        """A ``spawn_agent`` call's child thread: ``meta.childSessionId`` on the call's record."""
        child = _spawned_child(item)
        slot = (self.pending.get(call_id) or self.done_calls.get(call_id)) if isinstance(call_id, str) else None
        if child is None or slot is None:
            return
        child_sid = session_id_for(SOURCE, child)
        if (slot.record.get("meta") or {}).get("childSessionId") != child_sid:
            self.set_meta(slot, childSessionId=child_sid)

    def notice_event(self, payload: Mapping[str, Any], rec: Mapping[str, Any], offset: int, length: int,
                     ts: int | None) -> bool:
        """An event a person saw in Codex and would miss: an ``error``, a ``turn_aborted`` (interrupted), a
        review's findings (``exited_review_mode``), as a ``system`` notice (``meta.importedKind``
        ``codex/<event>``) where it happened. False: not one of those (an exited review without a review is
        counted as skipped by :meth:`event`)."""
        kind = payload.get("type")
        meta: dict[str, Any] = {"importedKind": f"codex/{kind}"}
        if kind == "error":
            message = payload.get("message")
            text = message if isinstance(message, str) and message else "error"
            info = payload.get("codex_error_info")
            if info is not None and json_value_ok(info) and bounded_value(info):
                meta["errorInfo"] = info
        elif kind == "turn_aborted":
            reason = payload.get("reason")
            text = f"Turn aborted ({reason})" if isinstance(reason, str) and reason else "Turn aborted"
            if isinstance(reason, str) and reason:
                meta["reason"] = reason[:200]
        elif kind == "exited_review_mode":
            review = payload.get("review_output")
            if not isinstance(review, Mapping):
                return False
            text = _review_text(review)
            if json_value_ok(review) and bounded_value(review):
                meta["review"] = review
            else:
                self.report.skipped_blocks["exited_review_mode(structure too large, text kept)"] += 1
        else:
            return False
        self.emitter.push(message_record(join_id(self.sid, self.line_id(rec, offset)), "system", ts,
                                         [text_block(text)], meta=meta), weight=length)
        return True

    def event(self, payload: Mapping[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "token_count":
            info = payload.get("info")
            usage = info.get("last_token_usage") if isinstance(info, Mapping) else None
            if isinstance(usage, Mapping) and self.attach_usage(usage, "count", None):
                return
        elif kind == "item_completed":
            item = payload.get("item")
            if isinstance(item, Mapping) and item.get("type") == "CommandExecution":
                self.exec_status(item.get("id"), item.get("status"),
                                 item.get("exit_code", item.get("exitCode")))
                return
            if (isinstance(item, Mapping) and item.get("type") == "CollabAgentToolCall"
                    and item.get("tool") == "spawn_agent"):
                self.spawned(item, item.get("id"))
        elif kind == "exec_command_end":
            self.exec_status(payload.get("call_id"), payload.get("status"), payload.get("exit_code"))
            return
        elif kind == "web_search_end" and self.search_sources(payload):
            return
        elif kind == "thread_settings_applied":
            settings = payload.get("thread_settings")
            if isinstance(settings, Mapping):
                self.saw_model(settings.get("model"))
                if isinstance(settings.get("model_provider_id"), str) and settings["model_provider_id"]:
                    self.provider = settings["model_provider_id"]
                    self.meta.history["providerId"] = self.provider
                return
        elif kind == "task_started":
            attribution = payload.get("turn_attribution")
            if isinstance(attribution, Mapping):
                self.turn_from_parent = bool(attribution.get("parent_turn_id"))
        elif kind == "user_message":
            self.meta.offer_title(payload.get("message"), 4)  # what was typed (items also hold injected context)
        elif kind == "thread_name_updated":
            self.meta.offer_title(payload.get("thread_name") or payload.get("name"), 0, replace=True)
        self.file.skipped[f"event_msg/{kind}"] += 1

    # ------------------------------------------------------------------ items
    def item(self, item: Mapping[str, Any], line_id: str, length: int, ts: int | None) -> None:
        kind = item.get("type")
        msg_id = join_id(self.sid, line_id)
        if kind == "message":
            self.message(item, msg_id, ts, length)
        elif kind == "reasoning":
            self.reasoning(item, msg_id, ts, length)
        elif kind == "web_search_call":
            self.group_slot(msg_id, ts, length).record["blocks"].append(self.search_block(item, line_id))
        elif kind == "image_generation_call":
            self.generated_image(item, msg_id, ts, length)
        elif isinstance(kind, str) and kind in CALL_TYPES:
            self.call(item, kind, msg_id, ts, length)
        elif kind in OUTPUT_TYPES:
            self.output(item, msg_id, ts)
        elif kind in SKIPPED_ITEMS:
            self.file.skipped[f"response_item/{kind}"] += 1
        else:
            self.file.unknown[f"response_item/{kind}"] += 1

    def message(self, item: Mapping[str, Any], msg_id: str, ts: int | None, length: int) -> None:
        role = item.get("role")
        blocks = self.content_blocks(item.get("content"), msg_id)
        if role == "assistant":
            group = self.group_slot(msg_id, ts, length)
            group.record["blocks"].extend(blocks)
            if isinstance(item.get("phase"), str):
                group.record.setdefault("meta", {})["phase"] = item["phase"]
            return
        self.close_group()
        if not blocks:
            return
        first = next((b["text"] for b in blocks if b.get("type") == "text"), "")
        if role == "user" and not first.lstrip().startswith(CONTEXT_PREFIXES):
            self.meta.offer_title(first, 5)
            meta = None
            if self.spawn_link is not None and (self.turn_from_parent if self.turn_from_parent is not None
                                                else self.prompts == 0):
                meta = {"fromAgent": dict(self.spawn_link)}  # the parent agent's prompt, not the user's
            self.prompts += 1
            self.emitter.push(message_record(msg_id, "user", ts, blocks, meta=meta), weight=length)
        elif role in ("user", "developer", "system"):
            self.emitter.push(message_record(msg_id, "system", ts, blocks, meta={"importedKind": f"codex/{role}"}),
                              weight=length)
        else:
            self.file.unknown[f"message/{role}"] += 1

    def content_blocks(self, content: Any, msg_id: str) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if isinstance(content, str):
            return [text_block(content)] if content else []
        if not isinstance(content, list):
            return blocks
        for i, part in enumerate(content):
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            text = part.get("text") if kind != "refusal" else part.get("refusal")
            if kind in TEXT_TYPES and isinstance(text, str):
                blocks.append(text_block(text))
            elif kind == "input_image":
                att = self.image(part.get("image_url"), msg_id, f"image-{i + 1}")
                if att is not None:
                    blocks.append(att)
            else:
                self.report.skipped_blocks[f"message/{kind}"] += 1
        return blocks

    def image(self, url: object, msg_id: str, name: str) -> dict[str, Any] | None:
        if not isinstance(url, str) or not (match := _DATA_URL.match(url)):
            self.report.skipped_blocks["input_image(not inline)"] += 1
            return None
        payload = url[match.end():]
        if len(payload) * 3 // 4 > self.ctx.limits.max_image_bytes:
            self.report.skipped_blocks["image(too large)"] += 1
            return None
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            self.report.skipped_blocks["image(bad base64)"] += 1
            return None
        blob = self.ctx.blobs.add(data, match.group(1), msg_id)
        return {"type": "attachment", "kind": "image", "name": name, "ref": blob.ref, "mimeType": blob.mime_type,
                "size": blob.size}

    def generated_image(self, item: Mapping[str, Any], msg_id: str, ts: int | None, length: int) -> None:
        """An image the model made with Codex's image generation tool: the item's ``result`` is the image
        (base64) and joins its response's assistant message as an image attachment (its bytes to the blob
        sink). An item without an image (failed, cut, not an image) is counted as skipped."""
        data = item.get("result")
        if isinstance(data, str) and len(data) * 3 // 4 > self.ctx.limits.max_image_bytes:
            self.report.skipped_blocks["image(too large)"] += 1
            return
        try:
            raw = base64.b64decode(data, validate=True) if isinstance(data, str) and data else b""
        except (binascii.Error, ValueError):
            raw = b""
        mime = _image_type(raw)
        if mime is None:
            self.file.skipped["response_item/image_generation_call(no image)"] += 1
            return
        group = self.group_slot(msg_id, ts, length)
        blob = self.ctx.blobs.add(raw, mime, group.record["id"])
        group.record["blocks"].append({"type": "attachment", "kind": "image", "name": "generated-image",
                                       "ref": blob.ref, "mimeType": blob.mime_type, "size": blob.size})

    def reasoning(self, item: Mapping[str, Any], msg_id: str, ts: int | None, length: int) -> None:
        texts: list[str] = []
        for source in (item.get("summary"), item.get("content")):
            if isinstance(source, list):
                texts.extend(p["text"] for p in source if isinstance(p, Mapping) and isinstance(p.get("text"), str))
        block: dict[str, Any] = {"type": "thinking", "text": "\n\n".join(texts)}
        encrypted = bounded_replay(self.ctx, self.report, item.get("encrypted_content"))
        if encrypted is not None:
            block["replay"] = {"encryptedContent": encrypted}
        self.group_slot(msg_id, ts, length).record["blocks"].append(block)

    def search_block(self, item: Mapping[str, Any], line_id: str) -> dict[str, Any]:
        action = item.get("action")
        action = action if isinstance(action, Mapping) else {}
        raw_status = item.get("status")
        status = "failed" if raw_status == "failed" else ("searching" if raw_status == "in_progress" else "completed")
        round_: dict[str, Any] = {"id": str(item.get("id") or line_id)[:200], "status": status, "sources": []}
        kind = SEARCH_KINDS.get(str(action.get("type")))
        if kind:
            round_["kind"] = kind
        for key in ("query", "url"):
            if isinstance(action.get(key), str):
                round_[key] = action[key]
        return {"type": "hostedSearch", "status": status, "rounds": [round_]}

    def search_sources(self, payload: Mapping[str, Any]) -> bool:
        """A ``web_search_end`` event's results become the sources of the search round it ends: the newest
        round of the open response that has none yet (the event follows its ``web_search_call`` item; their
        ids differ). False: no such round (the event is counted as skipped)."""
        results = payload.get("results")
        if self.group is None or not isinstance(results, list):
            return False
        sources = [_search_source(r) for r in results if isinstance(r, Mapping) and isinstance(r.get("url"), str)]
        for block in reversed(self.group.record["blocks"]):
            if block.get("type") != "hostedSearch":
                continue
            round_ = block["rounds"][-1]
            if round_["sources"]:
                return False
            round_["sources"] = sources
            return True
        return False

    def call(self, item: Mapping[str, Any], kind: str, msg_id: str, ts: int | None, length: int) -> None:
        call_id = item.get("call_id")
        name = item.get("name") if isinstance(item.get("name"), str) and item.get("name") else CALL_TYPES[kind]
        if kind == "function_call":
            args = _json_arg(item.get("arguments"))
        elif kind == "custom_tool_call":
            args = {"input": item.get("input")} if isinstance(item.get("input"), str) else None
        elif kind == "local_shell_call":
            args = item.get("action") if json_value_ok(item.get("action")) else None
        else:
            args = item.get("arguments") if json_value_ok(item.get("arguments")) else None
        key = call_id if isinstance(call_id, str) and call_id else msg_id
        block: dict[str, Any] = {"type": "tool_call", "callId": key, "name": name, "args": args}
        meta: dict[str, Any] = {}
        if self.group is None:  # a response that only calls tools: its model is kept on the call
            if self.model:
                meta["modelId"] = self.model
            if self.provider:
                meta["providerId"] = self.provider
        record = message_record(msg_id, "tool", ts, [block], tool_name=name, meta=meta)
        held = isinstance(call_id, str) and bool(call_id)
        slot = self.emitter.push(record, held=held, weight=length)
        self.response_output(slot)
        if held:
            previous = self.pending.pop(key, None)
            if previous is not None:  # the same call id again (seen in curated fixtures)
                previous.held = False
                self.report.unpaired_tool_calls += 1
            self.pending[key] = slot

    def output(self, item: Mapping[str, Any], msg_id: str, ts: int | None) -> None:
        call_id = item.get("call_id")
        if self.group is not None:
            self.group_saw_output = True
        result, exit_code, failed = self.output_value(item.get("output") if "output" in item else item.get("tools"),
                                                      msg_id)
        if isinstance(call_id, str) and call_id in self.exec_results:  # the structured status came first
            event_failed, event_code = self.exec_results.pop(call_id)
            failed = failed or event_failed
            exit_code = event_code if event_code is not None else exit_code
        status = "error" if failed or (isinstance(exit_code, int) and exit_code != 0) else "ok"
        slot = self.pending.pop(call_id, None) if isinstance(call_id, str) else None
        if slot is None:
            self.report.orphan_results += 1
            block = {"type": "tool_call", "callId": call_id if isinstance(call_id, str) and call_id else msg_id,
                     "name": "unknown", "args": None, "result": result, "status": status, "completedAt": stamp(ts)}
            self.emitter.push(message_record(msg_id, "tool", ts, [block], tool_name="unknown",
                                             meta={"orphanResult": True}))
            return
        old = slot.record
        block = {**old["blocks"][0], "result": result, "status": status, "completedAt": stamp(ts)}
        if exit_code is not None:
            block["exitCode"] = exit_code
        self.emitter.replace(slot, {**old, "blocks": [block]})
        slot.held = False
        if isinstance(call_id, str):
            self.done_calls[call_id] = slot
            if len(self.done_calls) > MAX_TRACKED_CALLS:
                del self.done_calls[next(iter(self.done_calls))]
        if block.get("name") == "spawn_agent":
            self.spawned(item, call_id)

    def exec_status(self, call_id: object, status: object, exit_code: object) -> None:
        """A command's structured outcome (``item_completed`` ``CommandExecution`` / ``exec_command_end``).

        Current Codex returns the model plain text ("Process exited with code 1") as the tool output,
        so this event is what says the command failed. Item shape (openai/codex,
        codex-rs/protocol/src/items.rs ``CommandExecutionItem``): ``id`` (the call id), ``status``
        (inProgress | completed | failed | declined), ``exit_code`` / ``exitCode``. It may come before
        or after the ``function_call_output``; an error is never turned back into ok.
        """
        if not isinstance(call_id, str) or not call_id:
            self.file.skipped["event_msg/item_completed(no id)"] += 1
            return
        code = exit_code if isinstance(exit_code, int) and not isinstance(exit_code, bool) else None
        failed = status in FAILED_STATUSES or (code is not None and code != 0)
        slot = self.done_calls.get(call_id)
        if slot is None:
            if len(self.exec_results) < MAX_TRACKED_CALLS:
                self.exec_results[call_id] = (failed, code)
            return
        block = slot.record["blocks"][0]
        new = dict(block)
        if failed:
            new["status"] = "error"
        if code is not None:
            new["exitCode"] = code
        if new != block:
            self.emitter.replace(slot, {**slot.record, "blocks": [new]})

    def output_value(self, out: Any, msg_id: str) -> tuple[Any, int | None, bool]:
        """(result, exit code, failed) of a tool output in any of the shapes rollouts use."""
        if isinstance(out, str):
            stripped = out.lstrip()
            if stripped.startswith("{"):
                try:
                    parsed = orjson.loads(out)
                except orjson.JSONDecodeError:
                    parsed = None
                if isinstance(parsed, Mapping) and isinstance(parsed.get("output"), str):
                    md = parsed.get("metadata")
                    code = md.get("exit_code") if isinstance(md, Mapping) else None
                    exit_code = code if isinstance(code, int) and not isinstance(code, bool) else None
                    return parsed["output"], exit_code, False
            # the current plain-text shape of exec_command outputs: "...\nProcess exited with code N\n..."
            head = out[:4096]
            found = _EXIT_LINE.search(head) if "Output:" in head or head.startswith("Chunk ID:") else None
            return out, (int(found.group(1)) if found else None), False
        if isinstance(out, Mapping):
            failed = out.get("success") is False
            if isinstance(out.get("text"), str):
                return out["text"], None, failed
            if "content" in out:
                inner, code, _ = self.output_value(out["content"], msg_id)
                return inner, code, failed
            return (dict(out) if json_value_ok(out) else None), None, failed
        if isinstance(out, list):
            texts = [p["text"] for p in out if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
            if len(texts) == len(out):
                return "\n".join(texts), None, False
            return (out if json_value_ok(out) else None), None, False
        return (out if json_value_ok(out) else None), None, False

    def compacted(self, payload: Mapping[str, Any], line_id: str, ts: int | None) -> None:
        self.close_group()
        through = self.emitter.last_message_id
        if through is None:
            self.report.compactions_dropped += 1
            return
        summary = payload.get("message")
        history = payload.get("replacement_history")
        details: dict[str, Any] = {"retainedTailMode": "completed_turn", "importedFrom": SOURCE}
        if isinstance(history, list):
            details["replacementHistoryItems"] = len(history)
        record = {"type": "compaction", "id": join_id(self.sid, "compaction", line_id),
                  "summary": summary if isinstance(summary, str) else "", "throughMessageId": through,
                  "tokensBefore": 0, "retainedTail": [], "createdAt": stamp(ts), "details": details}
        self.emitter.push(record)


def _review_text(review: Mapping[str, Any]) -> str:
    """A review's findings as Codex lists them: the verdict, then each finding's priority, title, place and body."""
    lines = ["Code review"]
    verdict = review.get("overall_correctness")
    explanation = review.get("overall_explanation")
    head = ": ".join(v for v in (verdict, explanation) if isinstance(v, str) and v)
    if head:
        lines.append(head)
    findings = review.get("findings")
    findings = [f for f in findings if isinstance(f, Mapping)] if isinstance(findings, list) else []
    if not findings:
        lines.append("No findings.")
    for n, finding in enumerate(findings, 1):
        title = finding.get("title") if isinstance(finding.get("title"), str) else ""
        priority = finding.get("priority")
        tag = f"[P{priority}] " if isinstance(priority, int) and not isinstance(priority, bool) else ""
        where = ""
        loc = finding.get("code_location")
        if isinstance(loc, Mapping) and isinstance(loc.get("absolute_file_path"), str):
            where = f" ({loc['absolute_file_path']}"
            span = loc.get("line_range")
            if isinstance(span, Mapping) and isinstance(span.get("start"), int) and isinstance(span.get("end"), int):
                where += f":{span['start']}-{span['end']}"
            where += ")"
        lines.append(f"{n}. {tag}{title}{where}")
        body = finding.get("body")
        if isinstance(body, str) and body:
            lines.append(body)
    return "\n".join(lines)


def _search_source(result: Mapping[str, Any]) -> dict[str, Any]:
    """One web search result as a ``hostedSearch`` source: its url and title, with the snippet and
    domain Codex showed kept beside them."""
    source: dict[str, Any] = {"url": result["url"]}
    for key in ("title", "snippet", "domain"):
        if isinstance(result.get(key), str):
            source[key] = result[key]
    return source


def _json_arg(value: Any) -> Any:
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, (dict, list)) else value
    return value if json_value_ok(value) else None


__all__ = ["LINE_IDS", "SOURCE", "discover", "named_as_before", "parse"]
