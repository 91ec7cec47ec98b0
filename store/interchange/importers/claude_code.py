"""Claude Code transcripts: ``~/.claude/projects/<project>/<session>.jsonl`` (+ ``<session>/subagents/*.jsonl``).

A session is named by its main transcript's file name whichever root imports it (a file, its project
folder, ``~/.claude``); a subagent file given alone imports its whole session (:func:`_main_unit`,
:func:`_file_unit`). A file of that name in another project folder of the projects root is a session of its
own, ``<name>@<digest of its path>``, with its own project, unless its bytes are the start of the longest
one's (an older copy, which adds nothing): Claude Code resumes a session only from the folder of the current
directory, so a session goes on elsewhere by its file being copied there, and the copy grows under the same
id while the original may grow too (:func:`_copy_name`).

One JSON object per line. What becomes what:

* ``user`` / ``assistant`` lines (``message.content`` as in the Anthropic
  Messages API) become ``user`` / ``assistant`` messages. Consecutive
  assistant lines of one API response (same ``message.id``; Claude Code writes
  one line per content block) merge into one assistant message until a
  ``tool_use`` block; each ``tool_use`` becomes a ``tool`` message holding one
  ``tool_call`` block, completed by the ``tool_result`` that arrives in a later
  user line (``is_error`` → ``error``; a refused permission → ``denied``); the
  line's ``toolUseResult`` (the tool's own record: a patch, the original file,
  output streams) goes with it as ``meta.toolUseResult``, bounded.
  ``thinking`` keeps its ``signature`` (and ``redacted_thinking`` its data) as
  replay state; it never reaches the search text (records.extract_text).
  Images become attachment blocks whose bytes go to the blob sink; so do
  ``document`` blocks (a PDF, a text file), as ``kind: "file"``.
  ``isMeta`` user lines (caveats, reminders injected by the harness) and user
  lines whose ``origin.kind`` is the harness's (``task-notification``: a
  background agent finished) become ``system`` notices. A prompt typed while
  the agent worked has no ``user`` line: Claude Code writes it as an
  ``attachment`` line (``queued_command``, ``commandMode: prompt``, from a
  human) and folds it into the running turn; it becomes a ``user`` message
  under that line's uuid. A hook that failed (``hook_non_blocking_error``,
  ``hook_blocking_error``) is a ``system`` notice worded as Claude Code shows
  it (``<hookName> hook error: <stderr>``). Every other attachment is counted
  as skipped.
* ``permissionMode`` and ``todos`` (on every user line): where they change, ``meta.permissionMode`` /
  ``meta.todos`` of the message the line becomes; a ``permission-mode`` line's mode is such a change, taken by
  the next user line that names no mode of its own;
* ``gitBranch`` (on every line): the origin history's ``git`` (the branch last seen, every branch in order),
  served as ``historyGit``;
* usage: each API response's ``usage`` (repeated on every line of the response)
  goes once on the first record the response produced, a tool record when it
  only called tools; :func:`.common.finalize` puts it in the one shape of
  :mod:`.usage_shape` with the raw report beside it.
* ``system``/``compact_boundary`` followed by the ``isCompactSummary`` user
  line becomes one compaction checkpoint (``throughMessageId`` = the last
  message before the boundary; the summary is the checkpoint text, not a
  message). The compaction request's usage, in no message, is the growth of
  the ``cost-state`` totals (2.1.3xx) across it: ``details.usage``. Other
  ``system`` lines with a text ``content`` become ``system`` notices, and so do
  those holding an ``error`` (``api_error``: a failed request, a retry under way;
  ``error``): the error's text as Claude Code formats it, its structure as
  ``meta.error``; so does a ``stop_hook_summary`` saying a Stop hook failed
  (``hookErrors``: ``Stop hook error: <error>``, as Claude Code prints it) or
  stopped the agent (``preventedContinuation``, its ``stopReason``); the rest
  (a clean hook summary, ``turn_duration``, ...) are counted as skipped.
* Subagent rows are attributed (seed 003 §4.7a): lines of a
  ``subagents/agent-<id>.jsonl`` file and ``progress``/``agent_progress``
  lines (the subagent's messages embedded in the parent, with
  ``parentToolUseID``) get ``meta.agentName`` (the ``Task`` call's
  ``subagent_type``, else the agent id) and ``meta.parentToolCallId`` when the
  spawning ``Task`` call is known; inline sidechains of Claude Code 1.x
  (``isSidechain`` with ``parentUuid: null`` roots) are matched to the ``Task``
  call whose ``prompt`` equals the root's text. A forked agent (a compaction, a side question, a fork
  subagent) writes the conversation it forked at the head of its file under the main transcript's uuids;
  those lines are the main transcript's, which the session shows as they are: the copies are counted
  (``inherited uuid``), not converted (they took the main lines' ids and replaced them as subagent rows).
* A ``user`` / ``assistant`` / ``system`` line that repeats an earlier line of the file word for word
  (its ``uuid``, parent and message; only its time may differ: a resume re-recording the chain, an
  echoed prompt, a retried write) is that message written again: Claude Code's loader keeps one entry
  per uuid and shows it once, so the first line is the message and the repeat is counted as skipped
  (``repeated uuid``), also when it arrives in a later import of the grown file; in the tree it is the
  same node. A uuid written again saying something else (a line of the main transcript of the same
  ``type``) is one message too, the last line written at the first one's place: Claude Code's loader
  keeps a map by uuid, so the last line set is the entry it shows, with that line's parent (``Jm`` in
  2.0.76's ``cli.js``, the transcript loader of 2.1.3xx likewise); the other lines are counted as
  skipped (``rewritten uuid``). So it is for an inline sidechain line (the same map holds them), for a
  line of a subagent file (Claude Code loads an agent's file by the same loader: ``getAgentTranscript``,
  and writes it without dropping uuids it wrote before: a resumed agent records its transcript again),
  and for a main transcript imported in file order (past a bound of its tree, or with an untrusted tree:
  the loader keys a large file's lines by uuid too). Lines of other types under one uuid (hand-made
  data) keep each line as a message of its own (``<uuid>@<offset>``); past :data:`MAX_TREE_RECORDS`
  uuids of a file, or :data:`MAX_REPEATED_IDS` such uuids, a line is not followed (as before).
* ``summary`` / ``custom-title`` / ``ai-title`` lines name the session;
  snapshots, hook progress, queue operations, the request and cost records of
  2.1.3xx (``api-request*``, ``cost-state``, ``tools-used``) and the other
  bookkeeping lines are counted as skipped; unknown types are counted as unknown.
* The ``parentUuid`` chain is checked in bounded memory: roots and dangling
  parents (a parent that never appears, e.g. a subagent file whose first
  lines point into its parent session) are reported per file. Lines of one
  file are imported in file order (Claude Code appends in time order); the
  subagent files are merged into the main file's records at their time
  position (by ``createdAt``), so a subagent's rows follow the ``Task`` call
  that spawned it instead of trailing the whole conversation.
* Branches: a rewind (Esc Esc to an earlier prompt, an edit) writes nothing of its own; the next
  prompt names as ``parentUuid`` the line the picked prompt hung off, and the abandoned lines stay in
  the file. Claude Code shows and resumes the branch of the newest conversation line, so that is the
  transcript; every other branch goes to the host's revisions store as pi's do (``Parsed.off_branch``,
  :mod:`store.interchange.import_write`), its responses counted by ``usage.*``. A first pass
  (:class:`_Tree`: a few machine words per line, no text) walks the main file's non-sidechain tree from
  the leaf (the last ``user``/``assistant`` line; a ``compact_boundary`` without a parent continues at its
  ``logicalParentUuid``: a compaction is no rewind) and keeps with that path what hangs off it without
  being another turn, as Claude Code's loader does: lines that are no conversation (``progress`` with
  the subagent rows of ``agent_progress``, hooks, attachments, ``system`` lines), the other lines of a
  response on the path (parallel tool calls share its ``message.id``) and the tool results under them,
  a checkpoint's summary. Every conversation line off it is on an abandoned branch: the newest such line
  is a leaf, its branch is found the same way, and so on (each converted like the live one, from its
  root, with the inline sidechain and subagent rows the live transcript shows before it diverges).
  Inline sidechains stay in the live transcript; a subagent file's rows follow the ``Task`` call that
  started it (the live transcript when the call is on the live path or not known, else the revision of the
  abandoned branch holding it, whole). The file imports in file order, every
  line live, as before, when it has no branch, when its tree cannot be trusted to say which is live (a
  ``uuid`` on two lines that say different things, a live path ending at a missing parent or in a cycle), or past
  :data:`MAX_TREE_RECORDS` / :data:`MAX_BRANCHES` / :data:`MAX_BRANCH_WORK` (then its report's
  ``skipped`` names the bound).
* A subagent file is read from the disk once per import (:func:`_snapshots`, up to :data:`MAX_SNAPSHOT_BYTES`
  of them): its rewrites scan, first time stamp and every conversion (live, each abandoned branch) read those bytes.
"""

from __future__ import annotations

import bisect
import functools
import glob
import hashlib
import heapq
import re
from array import array
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from store.interchange.importers.common import (
    EPOCH_STAMP,
    ChainTracker,
    Emitter,
    FileReport,
    ImportLimits,
    LineReader,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    Slot,
    SourceUnit,
    bounded_replay,
    bounded_structure,
    bounded_value,
    bytes_attachment,
    file_report,
    finalize,
    image_attachment,
    join_id,
    json_value_ok,
    message_record,
    parse_counted,
    parse_object,
    peek_field,
    stamp,
    text_block,
    to_ms,
)
from store.interchange.importers.reader import PEEK_CHUNK, Snapshot, read_snapshot, read_span
from store.interchange.importers.usage_shape import normalize_usage

SOURCE = "claude-code"
SKIPPED_TYPES = frozenset({
    "file-history-snapshot", "queue-operation", "last-prompt", "attachment", "permission-mode", "mode",
    "agent-name", "pr-link", "frame-link", "worktree-state", "relocated", "bridge-session", "started", "result",
    "atis-latch", "agent-setting", "tag",
    # Claude Code 2.1.3xx: the requests it sent (shape, blobs, params, and from 2.1.337 the route: provider
    # and credential kind), the run's cost and tools used
    "api-request", "api-request-blob", "api-request-shape", "api-request-route", "cost-state", "tools-used",
})
COST_KEYS = {"inputTokens": "input_tokens", "outputTokens": "output_tokens",
             "cacheReadInputTokens": "cache_read_input_tokens",
             "cacheCreationInputTokens": "cache_creation_input_tokens"}
"""``cost-state`` ``modelUsage`` figures → the Anthropic ``usage`` keys of a response."""
HARNESS_ORIGINS = frozenset({"task-notification"})
"""``origin.kind`` of ``user`` lines the harness writes (a finished background agent's
``<task-notification>``): system notices, never the user's words."""
CONVERSATION_TYPES = frozenset({"user", "assistant", "system"})
KNOWN_TYPES = frozenset({"user", "assistant", "system", "summary", "progress", "custom-title", "ai-title",
                         *SKIPPED_TYPES})
DENIED_PREFIX = "The user doesn't want to proceed"
_COMMAND = re.compile(
    r"<command-name>\s*([^<]{1,80}?)\s*</command-name>(?:.*?<command-args>([^<]{0,80})</command-args>)?", re.S)
MAX_TASKS = 100_000
MAX_HOOK_ERRORS = 100
"""Errors of one ``stop_hook_summary`` line made into its notice (one per hook that ran; a line lists a few)."""


def discover(root: Path) -> Iterator[SourceUnit]:
    """Sessions under a projects root, a project directory, or one file. Claude Code's config directory
    (``~/.claude``, ``CLAUDE_CONFIG_DIR``: it holds ``projects/``) is read as its projects root: its own
    top-level files (the prompt history, settings) are not sessions.

    Every route names a session alike (see :func:`_file_unit`), so a file imported alone and then through
    its folder, or the other way round, is one session."""
    if root.is_dir() and (root / "projects").is_dir():
        root = root / "projects"  # no project directory has that name: a project's folder starts with "-"
    if root.is_file():
        yield _file_unit(root)
        return
    single = any(root.glob("*.jsonl"))
    projects = [root] if single else sorted(p for p in root.iterdir() if p.is_dir())
    listed = [(project, {p.stem: p for p in sorted(project.glob("*.jsonl")) if p.is_file()}) for project in projects]
    folders: dict[str, list[Path]] = {}
    for _, mains in listed:
        for main in mains.values():
            folders.setdefault(main.name, []).append(main)
    for project, mains in listed:
        for main in mains.values():
            yield _main_unit(main, None if single else folders[main.name])
        for folder in sorted(p for p in project.iterdir() if p.is_dir() and p.name not in mains):
            if _subagent_files(folder):  # subagent files whose main transcript is gone
                yield _orphan_unit(folder)


SUBAGENTS = "subagents"
"""The folder of a session's subagent transcripts: ``<project>/<session>/subagents/agent-<id>.jsonl``."""


def _subagent_files(session_folder: Path) -> tuple[Path, ...]:
    return tuple(sorted((session_folder / SUBAGENTS).glob("*.jsonl")))


def _main_unit(main: Path, same_name: list[Path] | None = None) -> SourceUnit:
    """A main transcript with its subagent files, named by its file name (in another project folder than
    its session's own file: :func:`_copy_name`).

    The identity rule of every route. Claude Code writes a session to ``<sessionId>.jsonl`` and finds it
    again by that name, so for its own files the name and the lines' ``sessionId`` agree. A renamed file
    is named by its name too: that is what a folder import (the common route: ``~/.claude``) has always
    named it, and a folder may hold several copies of one session (two snapshots of a growing file, a
    backup) that only their names tell apart; named by their ``sessionId`` they would overwrite each
    other in one session. A single-file import named a renamed file by its lines' ``sessionId`` before:
    :func:`former_ids` gives that name, so the import finds such a session again
    (:func:`store.interchange.imports.resolve_unit`) instead of starting a second one.

    ``same_name``: the files of that name in every project folder of the projects root (the root route
    lists them once); None: looked up beside the file's project folder, so every route names a file alike.
    """
    if same_name is None:
        try:
            same_name = sorted(p for p in main.parent.parent.glob(f"*/{glob.escape(main.name)}") if p.is_file())
        except OSError:
            same_name = [main]
    return SourceUnit(SOURCE, _copy_name(main, same_name), (main, *_subagent_files(main.with_suffix(""))))


COPY_MARK = "@"
"""Separates a session id from the digest of the file's path in a copy's external id (:func:`_copy_name`)."""


def _copy_name(main: Path, same_name: list[Path]) -> str:
    """The external id of ``main`` when other project folders hold a file of its name.

    Claude Code files a session under the folder of the directory it was started in and ``--resume <id>``
    looks for ``<id>.jsonl`` in the current directory's folder only, so a session goes on in another
    directory by its file being copied there (by hand, by a tool) and resumed: Claude Code appends to the
    copy under the same session id and uuids, and the original may go on in its own folder. In each folder
    it shows that folder's file, so each is a session of its own: the longest file (then the first by path)
    is the session, named by its file name; a file whose bytes are the start of that one's (an older copy:
    a backup, a folder copied before Claude Code wrote on in the original) holds nothing more and is named
    alike, the import answers it ``unchanged`` (:func:`store.interchange.imports.older_copy_of`); every
    other file is the session of its own folder, named ``<file name>@<digest of its path>``, its project the
    directory its own lines were written in. The shared start is in both sessions, as it is in both files."""
    if len(same_name) < 2:
        return main.stem
    sizes = []
    for path in same_name:
        try:
            sizes.append((-path.stat().st_size, str(path), path))
        except OSError:
            continue
    if not sizes:
        return main.stem
    own = min(sizes)[2]
    if own == main or _starts_with(own, main):
        return main.stem
    return _copy_id(main)


def _copy_id(main: Path) -> str:
    """``<file name>@<digest of its path>``: the external id of a main transcript that is not its session's own file."""
    digest = hashlib.sha256(str(main.absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{main.stem}{COPY_MARK}{digest}"


def file_names(unit: SourceUnit) -> tuple[str, str] | None:
    """The two external ids a main transcript's unit may have been imported as: its file name (the session's own
    file) and :func:`_copy_id` of its path (a copy in another folder); None for a unit without its main transcript.

    Which file of a name is the session's own (:func:`_copy_name`) is decided from the files as they are now, but
    once a file was imported it stays the session it was imported as: a copy that later grows past the original
    keeps its ``@`` id, the original its plain one (:func:`store.interchange.imports.resolve_unit` finds each file
    in the import records of both ids)."""
    if not _has_main(unit):
        return None
    return unit.files[0].stem, _copy_id(unit.files[0])


def diverged_from(unit: SourceUnit, other: Path) -> bool:
    """Whether ``other`` (a file of the unit's main transcript's name that holds the session of the plain id) is
    another existing file whose bytes and the unit's part ways: neither is the start of the other (an older copy
    adds nothing to the session; a file that starts with the other's bytes goes on with it)."""
    main = unit.files[0]
    if other.name != main.name or other == main or not other.is_file():
        return False
    return not _starts_with(other, main) and not _starts_with(main, other)


def _starts_with(longer: Path, shorter: Path) -> bool:
    """Whether the bytes of ``shorter`` are the first bytes of ``longer`` (False when either cannot be read)."""
    try:
        with open(longer, "rb") as a, open(shorter, "rb") as b:
            while True:
                chunk = b.read(1 << 20)
                if not chunk:
                    return True
                if a.read(len(chunk)) != chunk:
                    return False
    except OSError:
        return False


def _is_copy(unit: SourceUnit) -> bool:
    """Whether ``unit`` is a main transcript in another folder than its session's own file (:func:`_copy_name`)."""
    return bool(unit.files) and unit.external_id.startswith(f"{unit.files[0].stem}{COPY_MARK}")


def _orphan_unit(session_folder: Path) -> SourceUnit:
    """The subagent files of a session whose main transcript is not there (named by their folder, the
    session's id); see :func:`kept_as_imported` for a session imported with its main transcript before."""
    return SourceUnit(SOURCE, session_folder.name, _subagent_files(session_folder))


def _file_unit(path: Path) -> SourceUnit:
    """The session a single-file root belongs to, named as a folder import names it.

    A subagent file given alone (``<dir>/<session>/subagents/agent-*.jsonl``; its lines carry the
    parent's ``sessionId``) imports its whole session: the main transcript ``<dir>/<session>.jsonl`` with
    every subagent file, the unit the folder route yields. A user pointing at one agent's file expects
    the conversation it belongs to, and its rows need the main transcript's ``Task`` calls for their
    links: imported alone they lost them and replaced the parent's linked rows. Without the main
    transcript it is the folder route's unit of the session's subagent files, which never rewrites a
    session imported with its main transcript (:func:`kept_as_imported`).
    """
    if path.suffix == ".jsonl" and path.parent.name == SUBAGENTS:
        session_folder = path.parent.parent
        main = session_folder.with_name(f"{session_folder.name}.jsonl")
        return _main_unit(main) if main.is_file() else _orphan_unit(session_folder)
    if _is_agent_transcript(path):  # an agent's file moved out of its session's folder: its parent is unknown
        return SourceUnit(SOURCE, peek_field(path, ("sessionId",)) or path.stem, (path,))
    return _main_unit(path)


def _is_agent_transcript(path: Path) -> bool:
    """Whether the file is one subagent's transcript: its first line with ``isSidechain`` is a sidechain
    naming its agent (a main transcript's is not; Claude Code 1.x inline sidechains come later)."""
    try:
        reader = LineReader(path, max_line_bytes=8 << 20, chunk=PEEK_CHUNK, digest=False)
        for n, line in enumerate(reader):
            rec = parse_object(line.data) if line.data is not None else None
            if rec is not None and "isSidechain" in rec:
                return rec["isSidechain"] is True and isinstance(rec.get("agentId"), str) and bool(rec["agentId"])
            if n >= 64:
                break
    except OSError:
        pass
    return False


def _has_main(unit: SourceUnit) -> bool:
    """Whether the unit holds its session's main transcript (named by its file name: :func:`_main_unit`)."""
    return bool(unit.files) and (unit.files[0].stem == unit.external_id or _is_copy(unit))


def former_ids(unit: SourceUnit) -> tuple[str, ...]:
    """The external ids an earlier version of this importer gave the unit's session by another route.

    A single-file root was named by its lines' ``sessionId``: for a renamed main transcript that is
    another session id than its name gives (:func:`_main_unit`)."""
    if not _has_main(unit) or _is_copy(unit):
        return ()
    named = peek_field(unit.files[0], ("sessionId",))
    return (named,) if named and named != unit.external_id else ()


def kept_as_imported(unit: SourceUnit, imported: Collection[str]) -> str | None:
    """Why an import of ``unit`` must leave its existing session as it is (None: import it).

    ``imported`` are the files the session's import record lists. A unit of subagent files only, for a
    session imported with its main transcript (named ``<session>.jsonl``, not in the unit: gone, or the
    subagent file was given alone away from it): the links of the subagent rows to the ``Task`` calls
    that spawned them come from the main transcript, so without it the import would replace the linked
    rows with unlinked ones. Nothing is written; importing the main transcript or its folder updates it.
    """
    if _has_main(unit):
        return None
    have = {str(p) for p in unit.files}
    main = next((p for p in imported if Path(p).name == f"{unit.external_id}.jsonl" and p not in have), None)
    if main is None:
        return None
    return (f"the session was imported with its main transcript {main}, which this import does not hold: its "
            "subagent files alone would drop their rows' links to the Task calls that spawned them, so the "
            "session is kept as imported (import the main transcript or its project folder to update it)")


@dataclass
class _Task:
    agent_type: str | None
    prompt: str | None
    matched: bool = False


@dataclass
class _Shared:
    """State that spans the files of one session."""

    tasks: dict[str, _Task] = field(default_factory=dict)
    agents: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    """agentId -> (parentToolCallId, agentName), learned from agent_progress lines and Task results."""
    recognized: bool = False
    known_tasks: dict[str, str | None] = field(default_factory=dict)
    """Task call id -> subagent_type, read ahead by :func:`_learn_agents`."""
    task_lines: dict[str, int] = field(default_factory=dict)
    """Task call id -> offset of the main transcript's (non-sidechain) line holding it, read ahead by
    :func:`_learn_agents`: the branch a subagent file's rows follow."""
    repeated_ids: set[str] = field(default_factory=set)
    """The ids earlier importers gave the lines that repeat an earlier line's uuid (``<uuid>@<offset>``):
    a session imported then holds them, and they are the file's own (:func:`parse`'s ``source_ids``), so a
    re-import hides them as lines off the branch instead of reading the file as an older copy."""


@dataclass
class _Group:
    api_id: object
    slot: Slot


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    sid = unit.session_id
    meta = SessionMeta(SOURCE, unit.external_id, sid)
    report = SessionReport(SOURCE, unit.external_id, sid)
    shared = _Shared()

    files = unit.files[: ctx.limits.max_files_per_session]
    snapshots = _snapshots(files)
    main_snapshot = snapshots.get(files[0]) if files else None
    sub_uuids: set[int] = set()
    sub_rewritten = {path: found for path in files[1:]
                     if (found := _scan_rewrites(path, ctx.limits, sub_uuids, snapshots.get(path)))}
    """Each subagent file's uuids written again saying something else (Claude Code loads an agent's file as it
    loads the main transcript: a map by uuid, the last line set)."""
    inherited: set[int] = set()
    """The uuids of main-transcript lines that a subagent file writes too (:meth:`_FileConverter.inherited_line`)."""
    scanned = _scan_tree(files[0], ctx.limits, shared, sub_uuids, inherited, main_snapshot) if files else None
    split = scanned if isinstance(scanned, _Split) else None
    rewritten = scanned.rewritten if isinstance(scanned, _Split | _OneBranch) else {}
    not_split = scanned if isinstance(scanned, str) else scanned.not_split if isinstance(scanned, _OneBranch) else None

    def primary() -> Iterator[Slot]:
        conv = _FileConverter(ctx, meta, report, shared, sid, files[0], primary=True, rewritten=rewritten,
                              home=files[0].parent.name if _is_copy(unit) else None, snapshot=main_snapshot)
        if not_split is not None:
            conv.file.skipped[f"branches(not split: {not_split})"] += 1
        yield from conv.run(split.live_select if split is not None else None)
        if not shared.recognized:
            if conv.file.lines == conv.file.blank_lines:
                raise Refused("EMPTY_SESSION", f"{files[0]} holds no complete line")
            raise Refused("NOT_A_SESSION_FILE", f"{files[0]} is not a Claude Code transcript")

    def task_line(path: Path) -> int | None:
        """The offset of the main transcript line holding the Task call that started the subagent of
        ``path`` (None: not known; its rows then go as before, with the live transcript)."""
        agent = _agent_id(path)
        link = shared.agents.get(agent) if agent else None
        return shared.task_lines.get(link[0]) if link is not None and link[0] else None

    def subagent(path: Path) -> Iterator[Slot]:
        at = task_line(path) if split is not None else None
        off = split is not None and at is not None and at in split.skip  # its Task call was rewound
        conv = _FileConverter(ctx, meta, report, shared, sid, path, primary=False, rewritten=sub_rewritten.get(path),
                              inherited=inherited, snapshot=snapshots.get(path))
        yield from conv.run(_none if off else None)

    subs = [(_first_time(path, snapshots.get(path)), path) for path in files[1:]]

    def records() -> Iterator[Slot]:
        if not files:
            return
        yield from merge_in_time(primary(), [(start, functools.partial(subagent, path)) for start, path in subs])

    if split is None and not rewritten and not sub_rewritten:
        return Parsed(meta, report, finalize(records(), report, ctx.limits))

    live_ids: set[str] = set()

    def live() -> Iterator[dict[str, Any]]:
        for record in finalize(records(), report, ctx.limits):
            if isinstance(record.get("id"), str):
                live_ids.add(record["id"])
            yield record

    if split is None:  # one branch, a uuid written again: an earlier import's second message of it is hidden
        return Parsed(meta, report, live(), follows_branch=True, source_ids=lambda: live_ids | shared.repeated_ids)

    def branch(b: _Branch) -> list[dict[str, Any]]:
        """One abandoned branch's records: the path from its root to its leaf with what hangs off it, converted
        as the live branch is, with the records the live transcript shows before the branch left it (inline
        sidechain lines, subagent files' rows) so its shared part reads as the live one. Scratch state."""
        scratch = SessionReport(SOURCE, unit.external_id, sid)
        bmeta = SessionMeta(SOURCE, unit.external_id, sid)
        bshared = _Shared(agents=dict(shared.agents), recognized=True, known_tasks=dict(shared.known_tasks))

        lines = split.lines(b)

        def main() -> Iterator[Slot]:
            conv = _FileConverter(ctx, bmeta, scratch, bshared, sid, files[0], primary=False, rewritten=rewritten,
                                  snapshot=main_snapshot)
            yield from conv.run(lines.select, end=lines.end, unparsed=lines.unparsed)

        def sub(path: Path) -> Iterator[Slot]:
            at = task_line(path)
            own = at is not None and at in lines.members and at in split.skip  # started on this branch's own part
            if at is not None and at not in lines.members:
                return  # started on another branch (the live one after this one left it, or another abandoned one)
            for slot in _FileConverter(ctx, bmeta, scratch, bshared, sid, path, primary=False,
                                       rewritten=sub_rewritten.get(path), inherited=inherited,
                                       snapshot=snapshots.get(path)).run():
                if not own and (lines.cutoff is None or slot.record.get("createdAt", EPOCH_STAMP) >= lines.cutoff):
                    return
                yield slot

        merged = merge_in_time(main(), [(start, functools.partial(sub, path)) for start, path in subs])
        return list(finalize(merged, scratch, ctx.limits))

    def off_branch() -> Iterator[tuple[str, list[dict[str, Any]]]]:
        for b in split.branches:
            yield b.leaf, branch(b)

    branch_ids: list[set[str]] = []

    def source_ids() -> set[str]:
        """Every id a line of the files becomes, on the live branch or off it (once the records are read)."""
        if not branch_ids:
            branch_ids.append({r["id"] for b in split.branches for r in branch(b) if isinstance(r.get("id"), str)})
        return live_ids | branch_ids[0] | shared.repeated_ids

    return Parsed(meta, report, live(), follows_branch=True, source_ids=source_ids, off_branch=off_branch)


# --------------------------------------------------------------------------- the conversation tree

MAX_TREE_RECORDS = 2_000_000
"""Records of a main transcript's ``uuid``/``parentUuid`` tree kept to split it into branches (about 200
bytes each, no text); a longer file imports in file order, every record live, as before branches were split."""
MAX_REPEATED_IDS = 100_000
"""Ids of repeated-uuid lines one session remembers for the branch convergence (:attr:`_Shared.repeated_ids`)."""
MAX_INHERITED_IDS = 2_000_000
"""Uuids of the subagent files' message lines one session checks against its main transcript (a forked agent's
copy of the conversation it forked: :meth:`_FileConverter.inherited_line`); past it a copy is converted as before."""
MAX_BRANCHES = 1_000
"""Abandoned branches one file may hand over; past it the file imports in file order."""
MAX_BRANCH_WORK = 5_000_000
"""Branches × tree records one file may cost (each branch is converted by one more read of the file up to
its end): a file of 100,000 lines splits at most 50 branches; past it the file imports in file order."""
TOO_MANY = "too many records", "too many branches"
"""Why a file with branches imported in file order (counted in its report's ``skipped``)."""

_PROMPT, _RESULT, _ASSISTANT, _SUMMARY, _OTHER, _BOUNDARY = range(6)
"""Node kinds: a user line with words (a turn record), one holding only ``tool_result`` blocks, an assistant
line, the ``isCompactSummary`` user line, any other line of the chain (system, progress, attachment), a
``compact_boundary``."""
_TURNS = (_PROMPT, _RESULT, _ASSISTANT, _SUMMARY)
_ROOT, _DANGLING = -1, -2
_LIVE, _OFF = 1, 2


def _digest(value: str) -> int:
    return int.from_bytes(hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big",
                          signed=True) or 1


_SAME_LINE_FIELDS = ("type", "parentUuid", "isSidechain", "isMeta", "isCompactSummary", "subtype", "content",
                     "message")
"""What a line says as a message (not when it was written): two lines of one uuid that agree on these are the
same message written twice."""


def _says(rec: Mapping[str, Any]) -> bytes:
    """What a conversation line says (:data:`_SAME_LINE_FIELDS`), serialized to compare."""
    fields = [rec.get(k) for k in _SAME_LINE_FIELDS]
    try:
        return orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # a value orjson cannot write again (e.g. a huge integer)
        return repr(fields).encode("utf-8", "surrogatepass")


_SAME, _REWRITTEN, _OTHER_KIND = range(3)
"""How a line relates to the line its uuid had before (:func:`_written_again`)."""


def _written_again(path: Path, span: tuple[int, int], rec: Mapping[str, Any], snapshot: Snapshot | None = None) -> int:
    """A line whose uuid an earlier line (at ``span`` of ``path``) has: :data:`_SAME` (it says the same, a message
    written again), :data:`_REWRITTEN` (the same ``type`` saying something else: Claude Code's loader keeps the
    last line set, a map by uuid) or :data:`_OTHER_KIND` (another type, hand-made data; or unreadable)."""
    if _same_line(path, span, rec, snapshot):
        return _SAME
    current = _read_record(path, *span, snapshot)
    return _REWRITTEN if current is not None and current.get("type") == rec.get("type") else _OTHER_KIND


def _same_line(path: Path, span: tuple[int, int], rec: Mapping[str, Any], snapshot: Snapshot | None = None) -> bool:
    """Whether the line at ``span`` (offset, end) of ``path`` says what ``rec`` says (:func:`_says`). Read
    only for a line whose uuid came before, which is rare: the first line of each uuid is kept as its span."""
    first = _read_record(path, *span, snapshot)
    return first is not None and _says(first) == _says(rec)


def _read_record(path: Path, offset: int, end: int, snapshot: Snapshot | None = None) -> dict[str, Any] | None:
    """The record of the line at ``offset``..``end`` of ``path`` (None: unreadable): from the file's snapshot
    (:func:`_snapshots`) when there is one, else read alone."""
    try:
        return parse_object(read_span(path, offset, end, snapshot))
    except OSError:
        return None


def _node_kind(rec: Mapping[str, Any]) -> int:
    kind = rec.get("type")
    if kind == "assistant":
        return _ASSISTANT
    if kind == "user":
        if rec.get("isCompactSummary") is True:
            return _SUMMARY
        message = rec.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and content and all(
                isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content):
            return _RESULT
        return _PROMPT
    if kind == "system" and rec.get("subtype") == "compact_boundary":
        return _BOUNDARY
    return _OTHER


@dataclass
class _Branch:
    """One abandoned branch of the main transcript, as :func:`parse`'s ``off_branch`` converts it (its lines
    are resolved when it is converted, :meth:`_Split.lines`: one branch's set in memory at a time)."""

    node: int
    """Its leaf: the newest conversation line of the branch."""
    leaf: str = ""
    """The leaf's ``uuid`` (``sourceLeaf`` of its revision line)."""


@dataclass(frozen=True)
class _Lines:
    """The lines of one branch: the path from its root to its leaf and what hangs off that path."""

    members: frozenset[int]
    """Offsets of its tree lines."""
    end: int
    """Offset just past its last line."""
    diverge: int
    """Offset of its first line the live branch does not hold."""
    cutoff: str | None
    """The time of that line (stamp): the subagent rows before it are the live transcript's, shared."""
    nodes: array[int]
    """Offsets of every tree line of the file (sorted): a line in none of them is parsed for bookkeeping."""

    def unparsed(self, offset: int) -> bool:
        """A tree line of another branch: left without parsing it."""
        if offset in self.members:
            return False
        i = bisect.bisect_left(self.nodes, offset)
        return i < len(self.nodes) and self.nodes[i] == offset

    def select(self, offset: int, rec: Mapping[str, Any]) -> bool:
        if offset in self.members:
            return True
        if rec.get("isSidechain") is True:  # an inline sidechain (1.x) the live transcript shows before it
            return offset < self.diverge
        uuid = rec.get("uuid")
        return not (isinstance(uuid, str) and uuid)  # bookkeeping lines (titles, cost-state)


class _Split:
    """A main transcript with abandoned branches: the lines off the live branch and the branches."""

    def __init__(self, tree: _Tree, skip: frozenset[int], branches: list[_Branch]) -> None:
        self.tree = tree
        self.skip = skip
        """Offsets of the lines the live transcript leaves out (each is in a branch)."""
        self.branches = branches
        self.rewritten: Rewritten = {}
        """:attr:`_Tree.rewritten` (set by :func:`_scan_tree`)."""

    def live_select(self, offset: int, rec: Mapping[str, Any]) -> bool:
        return offset not in self.skip

    def lines(self, branch: _Branch) -> _Lines:
        tree = self.tree
        members, _ = tree.cover(branch.node)
        first = min((m for m in members if tree.state[m] != _LIVE), key=lambda m: tree.offsets[m])
        ms = tree.times[first]
        return _Lines(frozenset(tree.offsets[m] for m in members), max(tree.ends[m] for m in members),
                      tree.offsets[first], stamp(ms) if ms >= 0 else None, tree.offsets)


class _Tree:
    """Pass 1 over a main transcript: the tree its non-sidechain lines form through ``uuid``/``parentUuid``.

    Per line a few machine words (digests, offsets, kind), no text; :meth:`split` resolves the live branch
    and the abandoned ones (see the module docstring)."""

    def __init__(self, limit: int, path: Path, wanted: Collection[int] = (),
                 inherited: set[int] | None = None, snapshot: Snapshot | None = None) -> None:
        self.limit = limit
        self.path = path
        self.snapshot = snapshot
        """The file's bytes as :func:`_snapshots` read them (None: read from the disk)."""
        self.wanted = wanted
        """The uuids of the subagent files' message lines (:func:`_scan_rewrites`)."""
        self.inherited: set[int] = inherited if inherited is not None else set()
        """Those of them a line of this file has (its sidechain lines aside): a forked agent's copy."""
        self.index: dict[int, int] = {}
        self.offsets = array("q")
        self.ends = array("q")
        self.parent_keys = array("q")
        self.groups = array("q")
        self.times = array("q")
        self.kinds = bytearray()
        self.logical: dict[int, int] = {}
        """Node of a compact boundary without a parent → its ``logicalParentUuid`` digest (0: none)."""
        self.failed: str | None = None
        self.rewritten: dict[int, tuple[int, int, int]] = {}
        """uuid digest -> (offset of its first line, offset and end of its last) for a uuid written again saying
        something else: Claude Code's loader keeps the last line of a uuid (a map by uuid), at the first one's
        place; the node keeps the first line's offset and takes the last line's parent, kind and time. Inline
        sidechain lines (:attr:`side`) are counted here too; so are the uuids of a tree that failed (past a
        bound, or untrusted): the loader keeps its map by uuid whatever the file's size or shape."""
        self.side = _Rewrites(path, limit, self.rewritten, snapshot)
        """The inline sidechain lines (Claude Code 1.x): no node of the tree, each uuid's first line."""
        self.complete = False
        """The whole file was read (:attr:`rewritten` names every such uuid)."""
        self.parents = array("q")
        self.first_child = array("q")
        self.next_sibling = array("q")
        self.state = bytearray()
        """Per node: 0 not placed yet, :data:`_LIVE`, :data:`_OFF` (on an abandoned branch)."""

    def add(self, rec: Mapping[str, Any], offset: int, end: int) -> None:
        """One line. Once the tree failed (past a bound, untrusted) no node is added, but the uuids written again
        among the lines it holds are still found (:attr:`rewritten`)."""
        uuid = rec.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            return
        key = _digest(uuid)
        if rec.get("isSidechain") is True:
            if key not in self.index:
                self.side.add(key, rec, offset, end)
            return
        if self.wanted and key in self.wanted:
            self.inherited.add(key)
        parent = rec.get("parentUuid")
        parent_key = _digest(parent) if isinstance(parent, str) and parent else 0
        if key in self.index:
            node = self.index[key]
            last = self.rewritten.get(key)
            span = (last[1], last[2]) if last else (self.offsets[node], self.ends[node])
            again = _written_again(self.path, span, rec, self.snapshot)
            if again == _SAME:
                return  # the same line written again: one node, as Claude Code keeps one message per uuid
            if again == _OTHER_KIND or (last is None and len(self.rewritten) >= MAX_REPEATED_IDS):
                # lines of other kinds under one uuid (hand-made data, a placeholder uuid) are no message
                # written again; past the bound which one is on the branch is not known
                self.failed = self.failed or "duplicate uuid"
                return
            self.rewritten[key] = (self.offsets[node], offset, end)  # the last line written is the message
            self.parent_keys[node] = parent_key
            self.kinds[node] = _node_kind(rec)
            message = rec.get("message")
            api_id = message.get("id") if self.kinds[node] == _ASSISTANT and isinstance(message, Mapping) else None
            self.groups[node] = _digest(api_id) if isinstance(api_id, str) and api_id else 0
            self.times[node] = to_ms(rec.get("timestamp")) or -1
            self.logical.pop(node, None)
            if self.kinds[node] == _BOUNDARY and not parent_key:
                logical = rec.get("logicalParentUuid")
                self.logical[node] = _digest(logical) if isinstance(logical, str) and logical else 0
            return
        if self.failed is not None:
            return
        if len(self.index) >= self.limit:
            self.failed = TOO_MANY[0]
            return
        node = len(self.offsets)
        self.index[key] = node
        kind = _node_kind(rec)
        self.offsets.append(offset)
        self.ends.append(end)
        self.parent_keys.append(parent_key)
        message = rec.get("message")
        api_id = message.get("id") if kind == _ASSISTANT and isinstance(message, Mapping) else None
        self.groups.append(_digest(api_id) if isinstance(api_id, str) and api_id else 0)
        self.times.append(to_ms(rec.get("timestamp")) or -1)
        self.kinds.append(kind)
        if kind == _BOUNDARY and not self.parent_keys[node]:
            logical = rec.get("logicalParentUuid")
            self.logical[node] = _digest(logical) if isinstance(logical, str) and logical else 0

    def link(self) -> None:
        """Parents as node numbers (the digests are dropped), children lists."""
        n = len(self.offsets)
        kinds = self.kinds
        parents = array("q", [_ROOT]) * n
        last_turn = _ROOT
        for i in range(n):
            pk = self.parent_keys[i]
            if pk:
                parents[i] = self.index.get(pk, _DANGLING)
            elif i in self.logical:  # a compact boundary continues the conversation it summarised
                lk = self.logical[i]
                p = self.index.get(lk, _DANGLING) if lk else _DANGLING
                parents[i] = p if p >= 0 else last_turn
            if kinds[i] in _TURNS:
                last_turn = i
        self.index, self.parent_keys, self.logical = {}, array("q"), {}
        first_child = array("q", [-1]) * n
        next_sibling = array("q", [-1]) * n
        for i in range(n - 1, -1, -1):
            p = parents[i]
            if p >= 0:
                next_sibling[i] = first_child[p]
                first_child[p] = i
        self.parents, self.first_child, self.next_sibling = parents, first_child, next_sibling
        self.state = bytearray(n)

    def cover(self, start: int, *, new_only: bool = False) -> tuple[set[int], bool]:
        """The path from ``start`` to its root, and what hangs off it without being another turn: lines
        that are no conversation (hooks, progress, attachments, system lines), the other lines of a
        response on the path (parallel tool calls share its ``message.id``) and the tool results under
        them, a checkpoint's summary (what Claude Code's own loader keeps beside the path). ``new_only``:
        stop at lines already placed (they and what hangs off them are). The flag: the path reached a root."""
        parents, kinds, groups, state = self.parents, self.kinds, self.groups, self.state
        path: list[int] = []
        members: set[int] = set()
        cur = start
        while cur >= 0 and cur not in members and not (new_only and state[cur]):
            members.add(cur)
            path.append(cur)
            cur = parents[cur]
        reached = cur == _ROOT
        wanted = {groups[i] for i in path if groups[i]}
        stack = path
        while stack:
            p = stack.pop()
            c = self.first_child[p]
            while c >= 0:
                k = kinds[c]
                if c not in members and not (new_only and state[c]) and (
                        k in (_OTHER, _BOUNDARY) or (k == _RESULT and kinds[p] == _ASSISTANT)
                        or (k == _SUMMARY and kinds[p] == _BOUNDARY)
                        or (k == _ASSISTANT and groups[c] != 0 and groups[c] in wanted)):
                    members.add(c)
                    stack.append(c)
                c = self.next_sibling[c]
        return members, reached

    def split(self) -> _Split | None:
        """The live branch (from the newest conversation line, as Claude Code resumes it) and every
        abandoned one; None when the file has none, or its tree cannot be trusted to say so (a duplicate
        uuid, a live path that ends at a missing parent or in a cycle, past the bounds): then every line is
        live, in file order, as before branches were split. O(lines): each line is placed once."""
        if self.failed is not None:
            return None
        n = len(self.offsets)
        kinds = self.kinds
        leaf = next((i for i in range(n - 1, -1, -1) if kinds[i] in _TURNS), None)
        if leaf is None:
            return None
        self.link()
        live, reached = self.cover(leaf)
        if not reached:
            self.failed = "the live path ends at a missing parent or in a cycle"
            return None
        state = self.state
        for i in live:
            state[i] = _LIVE
        found: list[int] = []
        for i in range(n - 1, -1, -1):
            if kinds[i] not in _TURNS or state[i]:
                continue
            if len(found) >= MAX_BRANCHES or (len(found) + 1) * n > MAX_BRANCH_WORK:
                self.failed = TOO_MANY[1]
                return None
            members, _ = self.cover(i, new_only=True)
            for m in members:
                state[m] = _OFF
            found.append(i)
        if not found:
            return None
        return _Split(self, frozenset(self.offsets[i] for i in range(n) if state[i] == _OFF),
                      [_Branch(i) for i in sorted(found)])


def _scan_tree(path: Path, limits: ImportLimits, shared: _Shared, sub_uuids: Collection[int] = (),
               inherited: set[int] | None = None, snapshot: Snapshot | None = None) -> _Split | _OneBranch | str | None:
    """Pass 1 over the main transcript: its branches; None: it imports in file order (see :meth:`_Tree.split`),
    or one of :data:`TOO_MANY` when that is because of a bound. A file that is no Claude Code transcript, or
    cannot be read, has none (the conversion says why). The uuids written again saying something else
    (:attr:`_Tree.rewritten`, known once the whole file was read) ride on the split, or on a
    :class:`_OneBranch` when the file has no other branch or is not split (in file order, past a bound).
    ``inherited`` receives those of ``sub_uuids`` (the subagent files' message uuids) a line of the file has."""
    tree = _Tree(min(limits.max_tracked_ids, MAX_TREE_RECORDS), path, sub_uuids, inherited, snapshot)
    split = _split_tree(tree, path, limits, shared)
    rewritten = tree.rewritten if tree.complete else {}
    if isinstance(split, _Split):
        split.rewritten = rewritten
    elif rewritten:
        return _OneBranch(rewritten, split)
    return split


Rewritten = Mapping[int, tuple[int, int, int]]
"""uuid digest -> (offset of its first line, offset and end of its last line): :attr:`_Tree.rewritten`."""


@dataclass(frozen=True)
class _OneBranch:
    """A main transcript imported in file order (no abandoned branch, or not split) whose uuids include some
    written again saying something else (:attr:`_Tree.rewritten`)."""

    rewritten: Rewritten
    not_split: str | None = None
    """Why a file with branches imports in file order (one of :data:`TOO_MANY`); None: no other reason to say."""


class _Rewrites:
    """The uuids written again saying something else among lines that are no node of the main transcript's tree
    (its inline sidechain lines, a subagent file's lines): the first line of each uuid (a few machine words, up
    to ``limit`` uuids; past it a line is a message of its own, as before) and, in ``found``, the last line of
    each uuid written again (:attr:`_Tree.rewritten`)."""

    def __init__(self, path: Path, limit: int, found: dict[int, tuple[int, int, int]],
                 snapshot: Snapshot | None = None) -> None:
        self.path, self.limit, self.found, self.snapshot = path, limit, found, snapshot
        self.index: dict[int, int] = {}
        self.spans = array("q")
        """Offset and end of each uuid's first line, two per uuid."""

    def add(self, key: int, rec: Mapping[str, Any], offset: int, end: int) -> None:
        at = self.index.get(key)
        if at is None:
            if len(self.index) < self.limit:
                self.index[key] = len(self.spans)
                self.spans.extend((offset, end))
            return
        first = self.spans[at]
        last = self.found.get(key)
        span = (last[1], last[2]) if last else (first, self.spans[at + 1])
        if (_written_again(self.path, span, rec, self.snapshot) == _REWRITTEN
                and (last is not None or len(self.found) < MAX_REPEATED_IDS)):
            self.found[key] = (first, offset, end)


_MESSAGE_MARK = re.compile(rb'"type":"(?:user|assistant|system)"')
"""Bytes every line Claude Code writes of a message holds (compact JSON; a quote inside a string is escaped, so no
text says them): :func:`_scan_rewrites` parses no other line (attachments, the request records: most bytes of a
2.1.3xx agent file; their uuid written again makes no message). A line written otherwise (spaced JSON, by hand)
is not followed: each such line stays a message of its own, as before. On a 28.8 MB agent file the scan took
85 ms of CPU parsing every line with a uuid, 52 ms so (reading its lines alone: 30 ms)."""


MAX_SNAPSHOT_BYTES = 64 << 20
"""Bytes of a session's files held in memory so that each is read from the disk once (:func:`_snapshots`). The main
transcript's passes: the read-ahead (:func:`_split_tree`), the live conversion, each abandoned branch's conversion
(twice: its revision, then the ids its lines become), and a line read back alone for each uuid written again or
branch leaf (62 opens of the 49 kB schema-coverage sample, 3 of most). A subagent file's: the rewrites scan, the
first time stamp, the live conversion and each abandoned branch's conversion."""


def _snapshots(paths: Collection[Path]) -> dict[Path, Snapshot]:
    """The session's files (the main transcript first) read once each, in order, while they fit
    :data:`MAX_SNAPSHOT_BYTES` together (a file past it, or one that cannot be read, is left to the passes: each reads
    it, and the conversion reports the error)."""
    out: dict[Path, Snapshot] = {}
    room = MAX_SNAPSHOT_BYTES
    for path in paths:
        try:
            if path.stat().st_size > room:  # not opened only to be left to the passes
                continue
            snap = read_snapshot(path, room)
        except OSError:
            continue
        if snap is not None:
            out[path] = snap
            room -= len(snap.data)
    return out


def _scan_rewrites(path: Path, limits: ImportLimits, uuids: set[int], snapshot: Snapshot | None = None) -> Rewritten:
    """A subagent file's uuids written again saying something else (:class:`_Rewrites`): Claude Code loads an
    agent's transcript as it loads the main one (``getAgentTranscript``: ``loadTranscriptFile``, a map by uuid),
    so the last line set is the message. Empty when the file cannot be read (the conversion says why). The uuids
    of its message lines go to ``uuids`` (up to :data:`MAX_INHERITED_IDS` in all)."""
    found: dict[int, tuple[int, int, int]] = {}
    side = _Rewrites(path, min(limits.max_tracked_ids, MAX_TREE_RECORDS), found, snapshot)
    try:
        for line in LineReader(path, max_line_bytes=limits.max_line_bytes, chunk=limits.read_chunk, snapshot=snapshot):
            if line.data is None or not _MESSAGE_MARK.search(line.data) or b'"uuid"' not in line.data:
                continue
            rec = parse_object(line.data)
            uuid = rec.get("uuid") if rec is not None else None
            if rec is not None and isinstance(uuid, str) and uuid:
                side.add(_digest(uuid), rec, line.offset, line.offset + line.length)
    except OSError:
        return {}
    room = MAX_INHERITED_IDS - len(uuids)
    if room > 0:
        uuids.update(side.index if len(side.index) <= room else list(side.index)[:room])
    return found


def _split_tree(tree: _Tree, path: Path, limits: ImportLimits, shared: _Shared) -> _Split | str | None:
    """The one read-ahead pass over the main transcript: its tree (:class:`_Tree`) and which ``Task`` call spawned
    which agent (:func:`_learn_agents`); the conversion reads the file once more. A branch's leaf ``uuid`` is read
    back from its line alone."""
    try:
        reader = LineReader(path, max_line_bytes=limits.max_line_bytes, chunk=limits.read_chunk, digest=False,
                            snapshot=tree.snapshot)
        recognized = False
        parsed = 0
        for line in reader:
            if line.data is None or not line.data.strip():
                continue
            rec = parse_object(line.data)
            if rec is None:
                continue
            parsed += 1
            recognized = recognized or rec.get("type") in KNOWN_TYPES
            if not recognized and parsed >= limits.recognize_within_lines:
                return None  # the conversion refuses the file at the same line
            tree.add(rec, line.offset, line.offset + line.length)
            if _AGENT_MARKS.search(line.data):
                _learn_agents(rec, line.offset, shared)
        tree.complete = True  # a failed tree still finds the uuids written again (the loader's map by uuid)
        split = tree.split()
        if split is None:
            return tree.failed if tree.failed in TOO_MANY else None
        spans = [(tree.offsets[b.node], tree.ends[b.node]) for b in split.branches]
        leaves = [_read_record(path, *span, tree.snapshot) for span in spans]
    except OSError:
        return None
    for b, (offset, _), rec in zip(split.branches, spans, leaves, strict=True):
        uuid = rec.get("uuid") if rec is not None else None
        b.leaf = uuid if isinstance(uuid, str) else f"L{offset}"
    return split


_Start = Callable[[], Iterator[Slot]]


def merge_in_time(main: Iterator[Slot], later: list[tuple[str, _Start]]) -> Iterator[Slot]:
    """The records of the main file and of the subagent files, each subagent's at its time position.

    Each stream keeps its own order; among streams the record with the earliest ``createdAt`` goes
    first (a record without a time takes its stream's previous one). A subagent file is opened only
    when the merge reaches its first timestamp, so only the subagents running at one time are open.
    """
    pending = sorted(later, key=lambda item: item[0])
    heap: list[tuple[str, int, int, Slot, Iterator[Slot]]] = []
    last: dict[int, str] = {}
    counter = 0

    def pull(stream: int, it: Iterator[Slot]) -> None:
        nonlocal counter
        slot = next(it, None)
        if slot is None:
            return
        created = slot.record.get("createdAt")
        key = created if isinstance(created, str) and created != EPOCH_STAMP else last.get(stream, "")
        key = max(key, last.get(stream, ""))
        last[stream] = key
        counter += 1
        heapq.heappush(heap, (key, stream, counter, slot, it))

    pull(0, main)
    started = 0
    while heap or started < len(pending):
        if started < len(pending) and (not heap or pending[started][0] <= heap[0][0]):
            started += 1
            pull(started, pending[started - 1][1]())
            continue
        _, stream, _, slot, it = heapq.heappop(heap)
        yield slot
        pull(stream, it)


def _none(offset: int, rec: Mapping[str, Any]) -> bool:
    """The selection of a file none of whose lines are on the branch (a subagent whose Task call is off it)."""
    return False


def _agent_id(path: Path) -> str | None:
    """The agent id of a subagent file: its name (``agent-<id>.jsonl``), else its lines' ``agentId``."""
    if path.stem.startswith("agent-") and len(path.stem) > len("agent-"):
        return path.stem[len("agent-"):]
    return peek_field(path, ("agentId",))


def _first_time(path: Path, snapshot: Snapshot | None = None) -> str:
    """The canonical stamp of a subagent file's first timestamp ("" when it has none: it goes first)."""
    ms = to_ms(peek_field(path, ("timestamp",), snapshot=snapshot))
    return stamp(ms) if ms is not None else ""


_AGENT_MARKS = re.compile(rb'"(?:agentId|subagent_type|Task|Agent)"')
"""Bytes of a line that may name an agent or a Task call (the only lines :func:`_learn_agents` reads). One search:
four ``in`` tests over each line took 0.40 s of CPU on a 126 MB transcript, the search 0.17 s."""


def _learn_agents(rec: Mapping[str, Any], offset: int, shared: _Shared) -> None:
    """Which ``Task`` call spawned which agent id, read ahead from a line of the main file (at ``offset``) naming
    an agent or a Task call (:data:`_AGENT_MARKS`), in the pass that reads its tree (:func:`_split_tree`).

    The link (``toolUseResult.agentId`` of the Task result, ``agentId`` of ``agent_progress``
    lines) is written when the subagent has finished, after its rows; the subagent files are
    merged in at their time position, so it is known before the main file is converted. A Task call's
    line offset says which branch its subagent's rows follow.
    """
    if len(shared.agents) >= MAX_TASKS or len(shared.tasks) >= MAX_TASKS:
        return
    message = rec.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, Mapping):
            continue
        args = block.get("input")
        if (block.get("type") == "tool_use" and block.get("name") in ("Task", "Agent")
                and isinstance(block.get("id"), str) and isinstance(args, Mapping)):
            kind = args.get("subagent_type")
            shared.known_tasks[block["id"]] = kind if isinstance(kind, str) and kind else None
            if rec.get("isSidechain") is not True:
                shared.task_lines.setdefault(block["id"], offset)
        extra = rec.get("toolUseResult")
        call_id = block.get("tool_use_id")
        if (block.get("type") == "tool_result" and isinstance(call_id, str) and isinstance(extra, Mapping)
                and isinstance(extra.get("agentId"), str) and extra["agentId"]):
            shared.agents[extra["agentId"]] = (call_id, shared.known_tasks.get(call_id) or extra["agentId"])
    data = rec.get("data")
    parent = rec.get("parentToolUseID")
    if (rec.get("type") == "progress" and isinstance(data, Mapping) and isinstance(parent, str)
            and isinstance(data.get("agentId"), str) and data["agentId"]):
        shared.agents.setdefault(data["agentId"], (parent, shared.known_tasks.get(parent) or data["agentId"]))


class _FileConverter:
    def __init__(self, ctx: ParseContext, meta: SessionMeta, report: SessionReport, shared: _Shared, sid: str,
                 path: Path, *, primary: bool, rewritten: Rewritten | None = None,
                 inherited: Collection[int] = (), home: str | None = None, snapshot: Snapshot | None = None) -> None:
        self.ctx, self.meta, self.report, self.shared, self.sid, self.path = ctx, meta, report, shared, sid, path
        self.primary = primary
        self.inherited = inherited
        """For a subagent file: the uuids of main-transcript lines it writes too (:meth:`inherited_line`)."""
        self.rewritten: Rewritten = rewritten or {}
        """The main transcript's uuids written again saying something else (:attr:`_Tree.rewritten`)."""
        self.file = FileReport(str(path))
        report.files.append(self.file)
        self.emitter = Emitter(ctx.limits, report)
        self.chain = ChainTracker(ctx.limits.max_tracked_ids)
        self.first_lines: dict[int, tuple[int, int]] = {}
        """uuid digest -> (offset, end) of the first conversation line of that uuid."""
        self.embedded = ChainTracker(ctx.limits.max_tracked_ids)
        """Ids of subagent messages embedded in progress lines (their own chain, not this file's)."""
        self.pending: dict[str, Slot] = {}
        self.line_state: dict[str, Any] = {}
        """The ``permissionMode`` and ``todos`` the last converted user line carried (:meth:`state_change`)."""
        self.announced_mode: str | None = None
        """The mode of a ``permission-mode`` line no user line has taken yet (:meth:`state_change`)."""
        self.group: _Group | None = None
        self.compaction: Slot | None = None
        self.sidechains: dict[str, tuple[str | None, str]] = {}
        self.usage_owner: tuple[object, Slot] | None = None
        """The API response whose usage was credited last and the record holding it."""
        self.cost_seen: dict[str, int] | None = None
        """The last ``cost-state`` line's token totals (cumulative over the session, raw Anthropic keys)."""
        self.uncosted: dict[object, dict[str, int]] = {}
        """Usage of the API responses seen since that line (per ``message.id``)."""
        self.compaction_cost: tuple[Slot, dict[str, int], frozenset[object]] | None = None
        """A summarised checkpoint (still held), the totals before its request and the responses those
        include, until the next cost-state."""
        self.parsed_lines = 0
        self.home = home
        self.snapshot = snapshot
        """The file's bytes as :func:`_snapshots` read them (None: read from the disk)."""
        """A copy's project folder name (:func:`_copy_name`): the session's project is the first ``cwd`` that
        folder names (the directory Claude Code went on in), not the copied lines' (None once seen)."""

    # ------------------------------------------------------------------ driver
    def run(self, select: Callable[[int, Mapping[str, Any]], bool] | None = None, end: int | None = None,
            unparsed: Callable[[int], bool] | None = None) -> Iterator[Slot]:
        """``select``: the lines of one branch (:class:`_Split`, :class:`_Lines`), the others only counted;
        ``unparsed``: lines not even parsed (another branch's, in a branch's conversion)."""
        reader = LineReader(self.path, max_line_bytes=self.ctx.limits.max_line_bytes, chunk=self.ctx.limits.read_chunk,
                            end=end, mark=self.ctx.mark(self.path), snapshot=self.snapshot)
        for line in reader:
            self.file.lines += 1
            if line.data is None:
                self.file.oversized_lines += 1
                continue
            if not line.data.strip():
                self.file.blank_lines += 1
                continue
            if unparsed is not None and unparsed(line.offset):
                continue
            rec = parse_counted(line.data, self.file)
            if rec is None:
                self.file.bad_lines += 1
                continue
            self.parsed_lines += 1
            if select is not None and not select(line.offset, rec):
                self.off_branch(rec, (line.offset, line.offset + line.length))
                continue
            self.take(rec, line.offset, line.length)
            if (self.primary and not self.shared.recognized
                    and self.parsed_lines >= self.ctx.limits.recognize_within_lines):
                raise Refused("NOT_A_SESSION_FILE", f"{self.path} is not a Claude Code transcript")
            yield from self.emitter.ready()
        self.close()
        if self.announced_mode is not None:
            self.file.skipped["permission-mode(no later message)"] += 1
            self.announced_mode = None
        yield from self.emitter.finish()
        file_report(reader, self.file)
        self.file.roots = self.chain.roots
        self.file.dangling_parents = self.chain.dangling

    def off_branch(self, rec: Mapping[str, Any], span: tuple[int, int]) -> None:
        """A line of another branch: counted as it was before branches were split (type, chain), not converted."""
        kind = rec.get("type")
        self.file.record_types[kind if isinstance(kind, str) else "<no type>"] += 1
        if kind in KNOWN_TYPES:
            self.shared.recognized = True
        if self.inherited and self.inherited_line(rec):
            return
        if self.rewritten:
            last = self.last_written(dict(rec), span[0])  # a copy only in a file that has such a uuid
            if last is None:
                return
            rec = last
        duplicate = False
        if "uuid" in rec or "parentUuid" in rec:
            duplicate = self.chain.add(rec.get("uuid"), rec.get("parentUuid"))
        if kind in CONVERSATION_TYPES:
            self.same_line_again(rec, span, duplicate)
        self.report.off_branch += 1

    def close(self) -> None:
        self.close_group()
        self.unpin_usage()
        if self.compaction is not None and self.emitter.discard(self.compaction):
            # a boundary at the very end whose summary line is not written yet: the checkpoint is
            # imported once the summary is there (a later line of a checkpoint id replaces it, but an
            # empty checkpoint would be served until then)
            self.report.compactions_dropped += 1
            self.compaction = None
        self.release_compaction()
        self.release_compaction_cost()
        self.report.unpaired_tool_calls += len(self.pending)
        self.pending.clear()

    # ------------------------------------------------------------------ helpers
    def close_group(self) -> None:
        if self.group is not None:
            self.group.slot.held = False
            self.group = None

    def release_compaction(self) -> None:
        if self.compaction is not None:
            self.compaction.held = False
            self.compaction = None

    def release_compaction_cost(self) -> None:
        if self.compaction_cost is not None:
            self.compaction_cost[0].held = False
            self.compaction_cost = None

    def cost_state(self, rec: Mapping[str, Any]) -> None:
        """A ``cost-state`` line (Claude Code 2.1.3xx): the session's token totals so far, per model.

        The request ``/compact`` (or an automatic compaction) sends is in no message: its usage is the
        growth of these totals from before the checkpoint to the first ``cost-state`` after its summary,
        less the responses written in between, put on the checkpoint as ``details.usage`` (raw beside
        it) so ``usage.*`` counts it like a response. The checkpoint is held until then (Claude Code
        writes a ``cost-state`` after every request; the end of the file releases it without).
        """
        models = rec.get("modelUsage")
        if not isinstance(models, Mapping):
            return
        totals = dict.fromkeys(COST_KEYS.values(), 0)
        top: tuple[int, str] | None = None
        for model, figures in models.items():
            if not isinstance(figures, Mapping):
                continue
            for theirs, ours in COST_KEYS.items():
                value = figures.get(theirs)
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                    totals[ours] += value
            size = sum(v for v in (figures.get(k) for k in COST_KEYS) if isinstance(v, int))
            if isinstance(model, str) and (top is None or size > top[0]):
                top = (size, model)
        pending = self.compaction_cost
        if pending is not None:
            slot, before, counted = pending
            delta = {k: totals[k] - before[k] for k in totals}
            for api_id, usage in self.uncosted.items():
                if api_id not in counted:
                    for key in delta:
                        delta[key] -= usage.get(key, 0)
            if all(v >= 0 for v in delta.values()) and any(delta.values()) and not slot.drained:
                details = {**(slot.record.get("details") or {}), "usageRaw": delta,
                           "usage": normalize_usage(SOURCE, delta), "providerId": "anthropic"}
                if top is not None:
                    details["modelId"] = top[1]
                slot.record["details"] = details
            slot.held = False
            self.compaction_cost = None
        self.cost_seen, self.uncosted = totals, {}

    def msg_id(self, uuid: object, offset: int, duplicate: bool) -> str:
        if isinstance(uuid, str) and uuid and not duplicate:
            return join_id(self.sid, uuid)
        return join_id(self.sid, f"{uuid}@{offset}" if isinstance(uuid, str) else f"L{offset}")

    # ------------------------------------------------------------------ records
    def take(self, rec: dict[str, Any], offset: int, length: int) -> None:
        kind = rec.get("type")
        kind_name = kind if isinstance(kind, str) else "<no type>"
        self.file.record_types[kind_name] += 1
        if kind in KNOWN_TYPES:
            self.shared.recognized = True
        if self.inherited and self.inherited_line(rec):
            return
        if self.rewritten:
            last = self.last_written(rec, offset)
            if last is None:
                return
            rec = last
            kind = rec.get("type")
        if self.usage_owner is not None and self.usage_owner[1].pinned and not self._may_continue_response(rec, kind):
            self.unpin_usage()
        duplicate = False
        if "uuid" in rec or "parentUuid" in rec:
            duplicate = self.chain.add(rec.get("uuid"), rec.get("parentUuid"))
        if kind in CONVERSATION_TYPES and self.same_line_again(rec, (offset, offset + length), duplicate):
            self.repeated(rec, offset)
            return
        ts = to_ms(rec.get("timestamp"))
        self.meta.saw_time(ts)
        if isinstance(rec.get("cwd"), str) and rec["cwd"]:
            if self.meta.cwd is None:
                self.meta.cwd = rec["cwd"]
            if self.home is not None and _project_folder(rec["cwd"]) == self.home:
                self.meta.cwd, self.home = rec["cwd"], None
        if "gitBranch" in rec:
            self.meta.saw_git(rec["gitBranch"])
        if isinstance(rec.get("version"), str) and not self.meta.label:
            self.meta.label = f"Claude Code {rec['version']}"[:80]
        if kind in ("user", "assistant"):
            message = rec.get("message")
            if not isinstance(message, Mapping):
                self.file.unknown[f"{kind}(no message)"] += 1
                return
            attribution = self.attribution(rec)
            self.conversation(rec, message, attribution, offset, length, duplicate, ts)
        elif kind == "progress":
            self.progress(rec, offset, length)
        elif kind == "system":
            self.system(rec, offset, duplicate, ts)
        elif kind == "summary":
            self.meta.offer_title(rec.get("summary"), 2)
        elif kind == "custom-title":
            self.meta.offer_title(rec.get("customTitle"), 0, replace=True)
        elif kind == "ai-title":
            self.meta.offer_title(rec.get("aiTitle"), 1, replace=True)
        elif kind == "attachment" and (prompt := _queued_prompt(rec)) is not None:
            self.queued_prompt(rec, prompt, offset, length, duplicate, ts)
        elif kind == "attachment" and (notice := _hook_error(rec)) is not None:
            self.close_group()
            self.release_compaction()
            self.emitter.push(message_record(self.msg_id(rec.get("uuid"), offset, duplicate), "system", ts,
                                             [text_block(notice[1])], meta={"importedKind": f"attachment/{notice[0]}"}))
        elif kind == "permission-mode" and _mode(rec.get("permissionMode")) is not None:
            if self.announced_mode is not None:
                self.file.skipped["permission-mode(superseded)"] += 1
            self.announced_mode = rec["permissionMode"]
        elif kind in SKIPPED_TYPES:
            if kind == "cost-state":
                self.cost_state(rec)
            self.file.skipped[kind_name] += 1
        else:
            self.file.unknown[kind_name] += 1

    def queued_prompt(self, rec: Mapping[str, Any], prompt: str | list[Any], offset: int, length: int,
                      duplicate: bool, ts: int | None) -> None:
        """A prompt the person typed while the agent worked: Claude Code folds it into the running turn as a
        ``queued_command`` attachment and writes no ``user`` line for it (:func:`_queued_prompt`). It is a
        ``user`` message under the attachment line's uuid; the same line written again is counted
        (``repeated uuid``), as a conversation line's repeat is."""
        if duplicate:
            self.repeated(rec, offset)
            return
        self.close_group()
        self.release_compaction()
        self.user({"uuid": rec.get("uuid")}, prompt, self.attribution(rec), offset, length, duplicate, ts)

    def same_line_again(self, rec: Mapping[str, Any], span: tuple[int, int], duplicate: bool) -> bool:
        """Whether a conversation line (at ``span``: offset, end) repeats an earlier line of its uuid word for
        word (:func:`_same_line`); the first line of a uuid is remembered (bounded: past
        :data:`MAX_TREE_RECORDS` lines none is)."""
        uuid = rec.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            return False
        key = _digest(uuid)
        if duplicate:
            first = self.first_lines.get(key)
            return first is not None and _same_line(self.path, first, rec, self.snapshot)
        if len(self.first_lines) < MAX_TREE_RECORDS:
            self.first_lines[key] = span
        return False

    def inherited_line(self, rec: Mapping[str, Any]) -> bool:
        """A subagent file's line under the uuid of a main-transcript line: a forked agent (a compaction, a side
        question, a fork subagent) writes the conversation it forked at the head of its file under the main
        transcript's uuids (Claude Code writes an agent's lines without dropping uuids the session holds: its
        fork-inherited parent messages share the main transcript's uuids). The session Claude Code shows
        is the main transcript's line; the copy, which took its id (``<uuid>``) and replaced it with the agent's
        attribution, is counted (``inherited uuid``), not converted."""
        uuid = rec.get("uuid")
        if isinstance(uuid, str) and uuid and _digest(uuid) in self.inherited:
            self.file.skipped["inherited uuid"] += 1
            return True
        return False

    def last_written(self, rec: dict[str, Any], offset: int) -> dict[str, Any] | None:
        """A line of a uuid written again saying something else (:attr:`rewritten`): at its first line's place
        the last line written (what Claude Code's loader keeps: one entry per uuid, the last one set); every
        other line of it is counted (``rewritten uuid``), not converted (it was a message of its own,
        ``<uuid>@<offset>``, before rules 13: :attr:`_Shared.repeated_ids` keeps those ids known). Any other
        line is ``rec`` itself."""
        uuid = rec.get("uuid")
        found = self.rewritten.get(_digest(uuid)) if isinstance(uuid, str) and uuid else None
        if found is None:
            return rec
        first, at, end = found
        if offset == first:
            last = _read_record(self.path, at, end, self.snapshot)
            return last if last is not None and last.get("uuid") == uuid else rec
        self.file.skipped["rewritten uuid"] += 1
        if len(self.shared.repeated_ids) < MAX_REPEATED_IDS:
            self.shared.repeated_ids.add(join_id(self.sid, f"{uuid}@{offset}"))
        return None

    def repeated(self, rec: Mapping[str, Any], offset: int) -> None:
        """A conversation line whose ``uuid`` an earlier line of the file has: the same message written again
        (Claude Code's loader keeps one entry per uuid, so it shows it once). It was taken with the first line;
        this one is counted, not converted (it became a message of its own, ``<uuid>@<offset>``, before:
        :attr:`_Shared.repeated_ids` keeps those ids known to the branch convergence)."""
        self.file.skipped["repeated uuid"] += 1
        if len(self.shared.repeated_ids) < MAX_REPEATED_IDS:
            uuid = rec.get("uuid")
            self.shared.repeated_ids.add(join_id(self.sid, f"{uuid}@{offset}"))

    def attribution(self, rec: Mapping[str, Any]) -> dict[str, str]:
        """§4.7a meta for a subagent row ({} for the main conversation)."""
        if rec.get("isSidechain") is not True:
            return {}
        agent_id = rec.get("agentId")
        if isinstance(agent_id, str) and agent_id:
            parent, name = self.shared.agents.get(agent_id, (None, agent_id))
            return _attr(parent, name)
        uuid, parent_uuid = rec.get("uuid"), rec.get("parentUuid")
        found = self.sidechains.get(parent_uuid) if isinstance(parent_uuid, str) else None
        if found is None:
            found = self.match_task(rec)
        if isinstance(uuid, str) and len(self.sidechains) < self.ctx.limits.max_tracked_ids:
            self.sidechains[uuid] = found
        return _attr(*found)

    def match_task(self, rec: Mapping[str, Any]) -> tuple[str | None, str]:
        """The Task call whose prompt is this sidechain root's text (Claude Code 1.x inline sidechains)."""
        message = rec.get("message")
        text = _plain_text(message.get("content")) if isinstance(message, Mapping) else None
        if text:
            for call_id, task in reversed(self.shared.tasks.items()):
                if not task.matched and task.prompt is not None and task.prompt.strip() == text.strip():
                    task.matched = True
                    return call_id, task.agent_type or "sidechain"
        return None, "sidechain"

    def progress(self, rec: Mapping[str, Any], offset: int, length: int) -> None:
        data = rec.get("data")
        data_type = data.get("type") if isinstance(data, Mapping) else None
        if data_type != "agent_progress" or not isinstance(data, Mapping):
            self.file.skipped[f"progress/{data_type}"] += 1
            return
        inner = data.get("message")
        if not isinstance(inner, Mapping) or not isinstance(inner.get("message"), Mapping):
            self.file.skipped["progress/agent_progress(empty)"] += 1
            return
        parent_call = rec.get("parentToolUseID")
        parent_call = parent_call if isinstance(parent_call, str) and parent_call else None
        agent_id = data.get("agentId")
        task = self.shared.tasks.get(parent_call) if parent_call else None
        name = (task.agent_type if task else None) or (agent_id if isinstance(agent_id, str) else "subagent")
        if isinstance(agent_id, str) and agent_id:
            self.shared.agents[agent_id] = (parent_call, name)
        kind = inner.get("type")
        if kind not in ("user", "assistant"):
            self.file.skipped["progress/agent_progress(other)"] += 1
            return
        duplicate = self.embedded.add(inner.get("uuid"), inner.get("parentUuid")) if "uuid" in inner else False
        ts = to_ms(inner.get("timestamp")) or to_ms(rec.get("timestamp"))
        merged = {**inner, "type": kind}
        self.conversation(merged, inner["message"], _attr(parent_call, name), offset, length, duplicate, ts)

    def system(self, rec: Mapping[str, Any], offset: int, duplicate: bool, ts: int | None) -> None:
        subtype = rec.get("subtype")
        self.close_group()
        if subtype == "compact_boundary":
            self.release_compaction()
            self.release_compaction_cost()
            through = self.emitter.last_message_id
            if through is None:
                self.report.compactions_dropped += 1
                return
            cm = rec.get("compactMetadata")
            cm = cm if isinstance(cm, Mapping) else {}
            tokens = cm.get("preTokens")
            details: dict[str, Any] = {"retainedTailMode": "completed_turn", "importedFrom": SOURCE}
            if isinstance(cm.get("trigger"), str):
                details["trigger"] = cm["trigger"]
            content = rec.get("content")
            record: dict[str, Any] = {
                "type": "compaction",
                "id": join_id(self.sid, "compaction", rec["uuid"] if isinstance(rec.get("uuid"), str) and not duplicate
                              else f"L{offset}"),
                "summary": content if isinstance(content, str) else "",
                "throughMessageId": through,
                "tokensBefore": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0
                else 0,
                "retainedTail": [],
                "createdAt": stamp(ts), "details": details,
            }
            self.compaction = self.emitter.push(record, held=True)
            return
        content = rec.get("content")
        if isinstance(content, str) and content.strip():
            self.release_compaction()
            meta = {"importedKind": f"system/{subtype}"} if isinstance(subtype, str) else {}
            record = message_record(self.msg_id(rec.get("uuid"), offset, duplicate), "system", ts,
                                    [text_block(content)], meta=meta)
            self.emitter.push(record)
        elif isinstance(rec.get("error"), Mapping):
            self.release_compaction()
            self.api_error(rec, subtype, offset, duplicate, ts)
        elif subtype == "stop_hook_summary" and (text := _stop_hook_outcome(rec)):
            self.release_compaction()
            self.emitter.push(message_record(self.msg_id(rec.get("uuid"), offset, duplicate), "system", ts,
                                             [text_block(text)], meta={"importedKind": "system/stop_hook_summary"}))
        else:
            self.file.skipped[f"system/{subtype}"] += 1

    def api_error(self, rec: Mapping[str, Any], subtype: object, offset: int, duplicate: bool,
                  ts: int | None) -> None:
        """A failed model request Claude Code showed (``system``/``api_error``, a retry under way, or
        ``system``/``error``): a ``system`` notice with the error's text as Claude Code formats it and its
        structure (``meta.error``, bounded) and the retry it was (``retryAttempt``/``maxRetries``)."""
        error = rec["error"]
        text = next((error[k] for k in ("formatted", "message") if isinstance(error.get(k), str) and error[k]), "")
        if not text:
            status = error.get("status")
            text = "API error" + (f" (status {status})" if isinstance(status, int) and status else "")
            inner: object = error.get("error")
            for _ in range(3):  # the API's body: {"type": "error", "error": {"type", "message"}}
                if not isinstance(inner, Mapping):
                    break
                if isinstance(inner.get("message"), str) and inner["message"]:
                    kind = inner.get("type")
                    text += f": {kind}" if isinstance(kind, str) and kind else ""
                    text += f": {inner['message']}"
                    break
                inner = inner.get("error")
        meta: dict[str, Any] = {"importedKind": f"system/{subtype}" if isinstance(subtype, str) else "system/error"}
        if bounded_value(error):
            meta["error"] = error
        else:
            self.report.skipped_blocks[f"system/{subtype}(error structure too large, text kept)"] += 1
        for key in ("retryAttempt", "maxRetries", "retryInMs"):
            value = rec.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                meta[key] = value
        attempt, most = meta.get("retryAttempt"), meta.get("maxRetries")
        if isinstance(attempt, int) and isinstance(most, int) and most > 0:
            text += f" · retry {attempt}/{most}"
        self.emitter.push(message_record(self.msg_id(rec.get("uuid"), offset, duplicate), "system", ts,
                                         [text_block(text)], meta=meta))

    # ------------------------------------------------------------------ conversation
    def conversation(self, rec: Mapping[str, Any], message: Mapping[str, Any], attribution: dict[str, str],
                     offset: int, length: int, duplicate: bool, ts: int | None) -> None:
        kind = rec.get("type")
        content = message.get("content")
        if kind == "user":
            self.close_group()
            if rec.get("isCompactSummary") is True and self.compaction is not None:
                summary = _plain_text(content) or ""
                self.compaction.record["summary"] = summary
                if self.cost_seen is None:
                    self.release_compaction()
                    return
                before = dict(self.cost_seen)
                for usage in self.uncosted.values():
                    for key in before:
                        before[key] += usage.get(key, 0)
                self.release_compaction_cost()
                self.compaction_cost = (self.compaction, before, frozenset(self.uncosted))  # held until a cost-state
                self.compaction = None
                return
            self.release_compaction()
            self.user(rec, content, attribution, offset, length, duplicate, ts)
        else:
            self.release_compaction()
            self.assistant(rec, message, attribution, offset, length, duplicate, ts)

    def user(self, rec: Mapping[str, Any], content: Any, attribution: dict[str, str], offset: int, length: int,
             duplicate: bool, ts: int | None) -> None:
        msg_id = self.msg_id(rec.get("uuid"), offset, duplicate)
        blocks: list[dict[str, Any]] = []
        if isinstance(content, str):
            if content:
                blocks.append(text_block(content))
        elif isinstance(content, list):
            for i, block in enumerate(content):
                if not isinstance(block, Mapping):
                    continue
                kind = block.get("type")
                if kind == "text" and isinstance(block.get("text"), str):
                    blocks.append(text_block(block["text"]))
                elif kind == "image":
                    att = self.image(block, msg_id, f"image-{i + 1}")
                    if att is not None:
                        blocks.append(att)
                elif kind == "tool_result":
                    self.tool_result(block, rec, attribution, offset, i, ts)
                elif kind == "document":
                    att = self.document(block, msg_id, f"document-{i + 1}")
                    if att is not None:
                        blocks.append(att)
                else:
                    self.report.skipped_blocks[f"user/{kind}"] += 1
        else:
            self.report.skipped_blocks["user/<no content>"] += 1
        if not blocks:
            return
        is_meta = rec.get("isMeta") is True
        origin = rec.get("origin")
        harness = origin.get("kind") if isinstance(origin, Mapping) and origin.get("kind") in HARNESS_ORIGINS else None
        role = "system" if is_meta or harness else "user"
        meta: dict[str, Any] = {**attribution, **self.state_change(rec)}
        if is_meta:
            meta["importedKind"] = "isMeta"
        elif harness:
            meta["importedKind"] = f"origin/{harness}"
        else:
            first = next((b["text"] for b in blocks if b.get("type") == "text"), "").lstrip()
            command = _COMMAND.search(first) if first.startswith("<") else None
            if command is not None:
                self.meta.offer_title(f"{command.group(1)} {command.group(2) or ''}", 6)
            elif not first.startswith(("[Request interrupted", "<")):
                self.meta.offer_title(first, 7 if attribution else 5)
        self.emitter.push(message_record(msg_id, role, ts, blocks, meta=meta), weight=length)

    def image(self, block: Mapping[str, Any], msg_id: str, name: str) -> dict[str, Any] | None:
        source = block.get("source")
        if not isinstance(source, Mapping) or source.get("type") != "base64":
            self.report.skipped_blocks["image(not base64)"] += 1
            return None
        return image_attachment(self.ctx, self.report, source.get("data"), source.get("media_type"), name, msg_id)

    def document(self, block: Mapping[str, Any], msg_id: str, name: str) -> dict[str, Any] | None:
        """A ``document`` block (a PDF or text file sent to the model: an @-mentioned file, a PDF the Read tool
        returned) as a file attachment, its bytes a blob: ``base64`` data as it is, ``text`` data as UTF-8. A
        document by URL or made of content blocks is counted (``document(<source type>)``)."""
        source = block.get("source")
        kind = source.get("type") if isinstance(source, Mapping) else None
        title = block.get("title")
        if isinstance(title, str) and title.strip() and len(title) <= 255:
            name = title.strip()
        if not isinstance(source, Mapping) or kind not in ("base64", "text"):
            self.report.skipped_blocks[f"document({kind if isinstance(kind, str) else 'no source'})"] += 1
            return None
        mime = source.get("media_type")
        if kind == "base64":
            return image_attachment(self.ctx, self.report, source.get("data"), mime, name, msg_id, kind="file",
                                    label="document")
        text = source.get("data")
        if not isinstance(text, str) or len(text) > self.ctx.limits.max_image_bytes:
            self.report.skipped_blocks["document(too large)" if isinstance(text, str) else "document(no data)"] += 1
            return None
        return bytes_attachment(self.ctx, self.report, text.encode("utf-8", "replace"),
                                mime if isinstance(mime, str) and mime else "text/plain", name, msg_id)

    def assistant(self, rec: Mapping[str, Any], message: Mapping[str, Any], attribution: dict[str, str],
                  offset: int, length: int, duplicate: bool, ts: int | None) -> None:
        content = message.get("content")
        api_id = message.get("id")
        if self.group is not None and (api_id is None or self.group.api_id != api_id):
            self.close_group()
        model = message.get("model")
        meta: dict[str, Any] = dict(attribution)
        if isinstance(model, str) and model:
            meta["modelId"] = model
            meta["providerId"] = "anthropic"
            if model != "<synthetic>":
                self.meta.history.setdefault("modelIds", [])
                if model not in self.meta.history["modelIds"] and len(self.meta.history["modelIds"]) < 20:
                    self.meta.history["modelIds"].append(model)
        usage = dict(message["usage"]) if isinstance(message.get("usage"), Mapping) else None
        if usage is not None and api_id is not None and model != "<synthetic>":
            self.uncosted[api_id] = {k: v for k in COST_KEYS.values()
                                     if isinstance(v := usage.get(k), int) and not isinstance(v, bool)}
        if isinstance(message.get("stop_reason"), str):
            meta["stopReason"] = message["stop_reason"]
        items = content if isinstance(content, list) else ([{"type": "text", "text": content}]
                                                           if isinstance(content, str) else [])
        made: Slot | None = None
        for i, block in enumerate(items):
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            converted = self.assistant_block(block, kind)
            if converted is not None:
                self.add_to_group(converted, rec, api_id, meta, offset, length, duplicate, ts)
                made = made or (self.group.slot if self.group is not None else None)
            elif kind == "tool_use":
                self.close_group()
                slot = self.tool_use(block, rec, attribution, offset, i, ts, length)
                made = made or slot
            else:
                self.report.skipped_blocks[f"assistant/{kind}"] += 1
        if usage is not None:
            self.credit_usage(api_id, {**{k: meta[k] for k in ("modelId", "providerId") if k in meta}, "usage": usage},
                              made)

    def credit_usage(self, api_id: object, values: dict[str, Any], made: Slot | None) -> None:
        """One API response's usage on the first record it produced, once.

        Claude Code writes one line per content block, each repeating the response's usage as it stood
        when the block was written: a later line's report is larger (2.0.x: 3 output tokens on the
        thinking and first tool_use lines, 993 on the last), and the last one is the response's. A
        response that only calls tools produces only tool records, and one that writes text, calls a
        tool and writes again produces two groups: its usage still goes on one record, which stays
        pinned (not written) while the lines that follow can be the same response's
        (:meth:`_may_continue_response`), so each later line of it refreshes the report in place. Past
        the import's pending bounds the record is written as it is (a forced flush), with the report
        it has then.
        """
        owner = self.usage_owner
        if owner is not None and api_id is not None and owner[0] == api_id:
            if not owner[1].drained:
                owner[1].record["meta"] = {**(owner[1].record.get("meta") or {}), **values}
            return
        self.unpin_usage()
        if made is None:
            return
        made.record["meta"] = {**(made.record.get("meta") or {}), **values}
        made.pinned = api_id is not None
        self.usage_owner = (api_id, made)

    def unpin_usage(self) -> None:
        if self.usage_owner is not None:
            self.usage_owner[1].pinned = False

    def _may_continue_response(self, rec: Mapping[str, Any], kind: object) -> bool:
        """Whether a line can come between two lines of the response whose usage record is pinned:
        another line of that response, the results of its tool calls, a hook's progress, bookkeeping.
        Any other line (a prompt, another response, a subagent's row, a system line) ends it."""
        assert self.usage_owner is not None
        if kind == "assistant":
            message = rec.get("message")
            return isinstance(message, Mapping) and message.get("id") == self.usage_owner[0]
        if kind == "user":
            message = rec.get("message")
            content = message.get("content") if isinstance(message, Mapping) else None
            return (isinstance(content, list) and bool(content)
                    and all(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content))
        if kind == "progress":
            data = rec.get("data")
            return not (isinstance(data, Mapping) and data.get("type") == "agent_progress")
        if kind == "attachment":
            return _queued_prompt(rec) is None and _hook_error(rec) is None
        return kind in SKIPPED_TYPES

    def assistant_block(self, block: Mapping[str, Any], kind: object) -> dict[str, Any] | None:
        if kind == "text" and isinstance(block.get("text"), str):
            return text_block(block["text"])
        if kind == "thinking" and isinstance(block.get("thinking"), str):
            out: dict[str, Any] = {"type": "thinking", "text": block["thinking"]}
            sig = bounded_replay(self.ctx, self.report, block.get("signature"))
            if sig is not None:
                out["signature"] = sig
            return out
        if kind == "redacted_thinking":
            data = bounded_replay(self.ctx, self.report, block.get("data"))
            return {"type": "thinking", "text": "", "redacted": data} if data is not None else None
        return None

    def add_to_group(self, block: dict[str, Any], rec: Mapping[str, Any], api_id: object, meta: dict[str, Any],
                     offset: int, length: int, duplicate: bool, ts: int | None) -> None:
        if self.group is None:
            record = message_record(self.msg_id(rec.get("uuid"), offset, duplicate), "assistant", ts, [], meta=meta)
            self.group = _Group(api_id, self.emitter.push(record, held=True, weight=length))
        record = self.group.slot.record
        record["blocks"].append(block)
        if meta:
            record["meta"] = {**record.get("meta", {}), **meta}

    # ------------------------------------------------------------------ tools
    def tool_use(self, block: Mapping[str, Any], rec: Mapping[str, Any], attribution: dict[str, str], offset: int,
                 index: int, ts: int | None, length: int) -> Slot:
        call_id = block.get("id")
        name = block.get("name") if isinstance(block.get("name"), str) and block.get("name") else "unknown"
        args = block.get("input") if json_value_ok(block.get("input")) else None
        has_id = isinstance(call_id, str) and bool(call_id)
        key = call_id if isinstance(call_id, str) and call_id else f"{offset}.{index}"
        tool_block: dict[str, Any] = {"type": "tool_call", "callId": key, "name": name, "args": args}
        record = message_record(join_id(self.sid, "tool", key), "tool", ts, [tool_block], tool_name=name,
                                meta=attribution)
        slot = self.emitter.push(record, held=has_id, weight=length)
        if has_id:
            if key in self.pending:
                self.report.unpaired_tool_calls += 1
            self.pending[key] = slot
            if len(self.pending) > self.ctx.limits.max_pending_records * 4:
                oldest = next(iter(self.pending))
                self.pending.pop(oldest).held = False
                self.report.unpaired_tool_calls += 1
        if name in ("Task", "Agent") and isinstance(args, Mapping) and has_id and len(self.shared.tasks) < MAX_TASKS:
            agent_type = args.get("subagent_type")
            prompt = args.get("prompt")
            self.shared.tasks[key] = _Task(agent_type if isinstance(agent_type, str) else None,
                                           prompt if isinstance(prompt, str) else None)
        return slot

    def tool_result(self, block: Mapping[str, Any], rec: Mapping[str, Any], attribution: dict[str, str],
                    offset: int, index: int, ts: int | None) -> None:
        call_id = block.get("tool_use_id")
        result = self.result_value(block.get("content"), call_id, offset, index)
        is_error = block.get("is_error") is True
        status = "error" if is_error else "ok"
        if is_error and isinstance(result, str) and result.startswith(DENIED_PREFIX):
            status = "denied"
        slot = self.pending.pop(call_id, None) if isinstance(call_id, str) else None
        extra = rec.get("toolUseResult")
        if isinstance(extra, Mapping) and isinstance(extra.get("agentId"), str) and isinstance(call_id, str):
            task = self.shared.tasks.get(call_id)
            self.shared.agents[extra["agentId"]] = (call_id, (task.agent_type if task else None) or extra["agentId"])
        key = call_id if isinstance(call_id, str) and call_id else f"{offset}.{index}"
        owner = str(slot.record["id"]) if slot is not None else join_id(self.sid, "result", key)
        kept = {**self.structured_result(extra, rec, result, owner), **self.state_change(rec)}
        if slot is None:
            self.report.orphan_results += 1
            orphan = {"type": "tool_call", "callId": key, "name": "unknown", "args": None, "result": result,
                      "status": status, "completedAt": stamp(ts)}
            self.emitter.push(message_record(join_id(self.sid, "result", key), "tool", ts, [orphan],
                                             tool_name="unknown", meta={**attribution, **kept, "orphanResult": True}))
            return
        old = slot.record
        tool_block = {**old["blocks"][0], "result": result, "status": status, "completedAt": stamp(ts)}
        new = {**old, "blocks": [tool_block]}
        if kept:
            new["meta"] = {**(old.get("meta") or {}), **kept}
        self.emitter.replace(slot, new)
        slot.held = False

    def state_change(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        """What a user line says of the session's state that differs from the line before: the permission mode
        the line was written under (``permissionMode``: default, plan, acceptEdits, ...) and the agent's todo
        list (``todos``; an empty list after a full one: cleared), for the meta of the message the line becomes
        (the first one, when it becomes several). Each line repeats them, so only a change is kept; a todo list
        past ``MAX_META_VALUE_BYTES`` is counted (``todos(too large)``). A ``permission-mode`` line (Claude Code
        writes one where the mode is set) is such a change too: the next user line that names no mode of its
        own takes it; one that names another is what it was written under (``permission-mode(superseded)``)."""
        out: dict[str, Any] = {}
        mode, announced = _mode(rec.get("permissionMode")), self.announced_mode
        self.announced_mode = None
        if announced is not None and mode is not None and mode != announced:
            self.file.skipped["permission-mode(superseded)"] += 1
        mode = mode or announced
        if mode is not None and self.line_state.get("permissionMode") != mode:
            self.line_state["permissionMode"] = out["permissionMode"] = mode
        todos = rec.get("todos")
        if isinstance(todos, list) and todos != self.line_state.get("todos", []):
            self.line_state["todos"] = todos
            if bounded_value(todos):
                out["todos"] = todos
            else:
                self.report.skipped_blocks["todos(too large)"] += 1
        return out

    def structured_result(self, extra: object, rec: Mapping[str, Any], result: Any,
                          message_id: str) -> dict[str, Any]:
        """The tool's own record of what it did (``toolUseResult``: an edit's ``structuredPatch`` and
        ``originalFileContents``, a command's ``stdout``/``stderr``/``interrupted``, a search's hits), which the
        text the model saw leaves out, as the tool record's ``meta.toolUseResult``. Bounded by
        :func:`.common.bounded_structure`: the strings of a larger one are cut (``meta.toolUseResultCutChars``,
        counted in ``skippedBlocks`` as ``toolUseResult(cut)``), one that does not fit even so is counted as
        ``toolUseResult(too large)``. Either way the whole value is kept too, as a blob (its JSON,
        ``application/json``) that ``meta.toolUseResultBlob`` references (``ref``, ``mimeType``, ``size``, as an
        attachment block), the cut copy its preview; one past ``max_image_bytes`` is not
        (``toolUseResult(blob too large)``), nor one JSON cannot write. A plain string that repeats the result is
        not kept twice; a line with several ``tool_result`` blocks does not say whose it is
        (``toolUseResult(several results)``)."""
        if extra is None or (isinstance(extra, str) and (not extra or extra == result)):
            return {}
        content = rec.get("message", {}).get("content") if isinstance(rec.get("message"), Mapping) else None
        if isinstance(content, list) and sum(
                isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content) > 1:
            self.report.skipped_blocks["toolUseResult(several results)"] += 1
            return {}
        bounded = bounded_structure(extra)
        if bounded is not None and not bounded[1]:
            return {"toolUseResult": bounded[0]}
        out: dict[str, Any] = {}
        if bounded is None:
            self.report.skipped_blocks["toolUseResult(too large)"] += 1
        else:
            self.report.skipped_blocks["toolUseResult(cut)"] += 1
            out = {"toolUseResult": bounded[0], "toolUseResultCutChars": bounded[1]}
        try:
            whole = orjson.dumps(extra)
        except orjson.JSONEncodeError:  # an integer past 64 bits, nesting too deep: counted above
            return out
        if len(whole) > self.ctx.limits.max_image_bytes:
            self.report.skipped_blocks["toolUseResult(blob too large)"] += 1
            return out
        blob = self.ctx.blobs.add(whole, "application/json", message_id)
        out["toolUseResultBlob"] = {"ref": blob.ref, "mimeType": "application/json", "size": blob.size}
        return out

    def result_value(self, content: Any, call_id: object, offset: int, index: int) -> Any:
        if isinstance(content, str) or content is None:
            return content if content is not None else ""
        if not isinstance(content, list):
            return content if json_value_ok(content) else None
        texts: list[str] = []
        blocks: list[dict[str, Any]] = []
        for i, item in enumerate(content):
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
                blocks.append(text_block(item["text"]))
            elif item.get("type") in ("image", "document"):
                key = call_id if isinstance(call_id, str) and call_id else f"{offset}.{index}"
                if item.get("type") == "image":
                    att = self.image(item, join_id(self.sid, "tool", key), f"result-image-{i + 1}")
                else:
                    att = self.document(item, join_id(self.sid, "tool", key), f"result-document-{i + 1}")
                if att is not None:
                    blocks.append(att)
            else:
                self.report.skipped_blocks[f"tool_result/{item.get('type')}"] += 1
        if len(blocks) == len(texts):
            return "\n".join(texts)
        return blocks


def _project_folder(cwd: str) -> str:
    """The name of the projects folder Claude Code files a session started in ``cwd`` under."""
    return re.sub(r"[^a-zA-Z0-9]", "-", cwd)


def _attr(parent: str | None, name: str) -> dict[str, str]:
    out = {"agentName": name}
    if parent:
        out["parentToolCallId"] = parent
    return out


def _queued_prompt(rec: Mapping[str, Any]) -> str | list[Any] | None:
    """The words of an ``attachment`` line that is a prompt the person typed while the agent worked
    (``queued_command``, ``commandMode: prompt``, from a human: no ``origin`` or ``origin.kind: human``, not
    ``isMeta``); None for any other attachment (a peer session's message, a task notification, reminders)."""
    attachment = rec.get("attachment")
    if not isinstance(attachment, Mapping) or attachment.get("type") != "queued_command":
        return None
    origin = attachment.get("origin")
    if attachment.get("commandMode") != "prompt" or attachment.get("isMeta") is True or (
            origin is not None and not (isinstance(origin, Mapping) and origin.get("kind") == "human")):
        return None
    prompt = attachment.get("prompt")
    return prompt if isinstance(prompt, (str, list)) and prompt else None


def _hook_error(rec: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(attachment type, text)`` of an ``attachment`` line reporting a hook that failed, as Claude Code shows
    it: ``<hookName> hook error: <stderr>`` (``Exit code N`` when it wrote none) for ``hook_non_blocking_error``,
    ``<hookName> hook blocking error: <reason>`` for ``hook_blocking_error``; None for any other attachment."""
    attachment = rec.get("attachment")
    if not isinstance(attachment, Mapping):
        return None
    kind = attachment.get("type")
    name = next((attachment[k] for k in ("hookName", "hookEvent") if isinstance(attachment.get(k), str)
                 and attachment[k].strip()), "Hook")
    if kind == "hook_non_blocking_error":
        stderr, code = attachment.get("stderr"), attachment.get("exitCode")
        detail = stderr.strip() if isinstance(stderr, str) and stderr.strip() else (
            f"Exit code {code}" if isinstance(code, int) and not isinstance(code, bool) else "")
        return kind, f"{name} hook error" + (f": {detail}" if detail else "")
    if kind == "hook_blocking_error":
        block = attachment.get("blockingError")
        reason = block.get("blockingError") if isinstance(block, Mapping) else block
        detail = reason.strip() if isinstance(reason, str) else ""
        return kind, f"{name} hook blocking error" + (f": {detail}" if detail else "")
    return None


def _stop_hook_outcome(rec: Mapping[str, Any]) -> str | None:
    """What Claude Code printed for a ``stop_hook_summary`` line: ``Stop hook error: <error>`` per entry of
    ``hookErrors``, and the ``stopReason`` of a hook that prevented continuation; None for a clean run (the usual
    line: ``hookErrors: []``, only the commands that ran), which is bookkeeping."""
    errors = rec.get("hookErrors")
    out = [f"Stop hook error: {e}" for e in (errors if isinstance(errors, list) else [])
           if isinstance(e, str) and e.strip()][:MAX_HOOK_ERRORS]
    if rec.get("preventedContinuation") is True:
        reason = rec.get("stopReason")
        out.append("Stop hook prevented continuation" + (f": {reason}" if isinstance(reason, str) and reason.strip()
                                                         else ""))
    return "\n".join(out) or None


def _mode(value: object) -> str | None:
    """A permission mode as a line names it (default, plan, acceptEdits, ...), None when it names none."""
    return value if isinstance(value, str) and value and len(value) <= 100 else None


def _plain_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b["text"] for b in content if isinstance(b, Mapping) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)]
        return "\n".join(texts) if texts else None
    return None


__all__ = ["SOURCE", "discover", "former_ids", "kept_as_imported", "parse"]
