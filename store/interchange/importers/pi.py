"""pi coding agent sessions: ``~/.pi/agent/sessions/--<cwd>--/<timestamp>_<uuid>.jsonl`` (format v1–v3).

The first line is the header ``{"type":"session","version":3,"id","timestamp","cwd"}``
(v1 has no ``version``). From v2 on every entry has ``id``/``parentId`` and the
entries form a tree; the current conversation is the branch from the leaf
(the last entry of the file, as pi's SessionManager loads it) to the root.
v1 is a linear list. v3 renamed the ``hookMessage`` role to ``custom``.

The current branch is the transcript (entries off it are counted as
``offBranch``); a ``parentId`` that names no entry ends the branch and is
reported as a dangling parent. Every other branch is handed over by
``Parsed.off_branch`` (each abandoned leaf's path, converted as if it were the
leaf) and kept in the host's revisions store, its responses counted by
``usage.*``. A re-import converges on the file's current
branch (:mod:`store.interchange.import_write`): messages and checkpoints imported before that
the file holds off its branch are hidden with tombstones (their branch archived), those the import
hid that are on the branch again are restored, and a file that lacks entries
imported before (an older copy, a backup) changes no visibility at all. What becomes what:

* ``message`` entries: ``user`` → user; ``assistant`` → an assistant message
  (text, ``thinking`` with ``thinkingSignature`` as replay state) followed by
  one ``tool`` message per ``toolCall``, completed by the ``toolResult``
  message with that ``toolCallId`` (a reply that only calls tools keeps its
  model, usage and stop reason on its first ``tool`` message, so ``usage.*``
  counts every response); ``bashExecution`` (a ``!command`` the
  user ran) → a ``tool`` message (``truncated`` / ``fullOutputPath`` on its
  block, ``excludeFromContext`` of a ``!!command`` in its meta); a tool
  call's ``thoughtSignature`` → the block's ``signature``; ``custom``/``hookMessage``,
  ``branchSummary`` → ``system`` notices;
* ``compaction`` → a compaction checkpoint (``firstKeptEntryId`` mapped to
  the first message kept); ``branch_summary`` and ``custom_message`` entries →
  ``system`` notices; ``session_info`` names the session; ``model_change`` /
  ``thinking_level_change`` set the meta of later replies; a ``label`` entry (a
  bookmark set in pi's tree view) → a ``system`` notice with ``meta.label`` and
  ``meta.targetMessageId``; ``custom`` entries are counted as skipped.

:class:`PiConverter` is shared with :mod:`store.interchange.native_pi`, which reads the
same files read-only as native sessions (with its own ids); its fork copies the branch
through the same :func:`find_branch` and :func:`on_branch` the converter reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.interchange.importers.common import (
    Emitter,
    FileReport,
    Line,
    LineReader,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    Slot,
    SourceUnit,
    bounded_replay,
    file_report,
    finalize,
    image_attachment,
    join_id,
    json_value_ok,
    message_record,
    parse_counted,
    parse_object,
    stamp,
    text_block,
    to_ms,
)

SOURCE = "pi"
VERSIONS = (1, 2, 3)
SKIPPED_ENTRIES = frozenset({"custom"})
KNOWN_ENTRIES = frozenset({"message", "model_change", "thinking_level_change", "compaction", "branch_summary",
                           "custom_message", "session_info", "label", *SKIPPED_ENTRIES})
MAX_LABEL_CHARS = 1000


def discover(root: Path) -> Iterator[SourceUnit]:
    """Sessions under a sessions root, a project folder, or one file. pi's agent directory
    (``~/.pi/agent``, ``PI_CODING_AGENT_DIR``: it holds ``sessions/``) is read as that folder. A session is
    named by its header's id; of several files carrying one id, the longest is that session and each other
    is one of its own (:func:`_primaries`)."""
    if root.is_dir() and (root / "sessions").is_dir():
        root = root / "sessions"
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.jsonl") if p.is_file())
    named = [(path, _external_id(path)) for path in files]
    primary = _primaries(named)
    for path, external in named:
        yield SourceUnit(SOURCE, external if primary[external] == path else _copy_id(external, path), (path,))


def _primaries(named: list[tuple[Path, str]]) -> dict[str, Path]:
    """Per session id, the file that is the session when several files carry it (a backup, a copy that went
    on elsewhere): the longest (an older copy of a growing file is a prefix of it), then the first by path,
    never the order a folder lists its files in. The others keep their own sessions (:func:`_copy_id`)."""
    out: dict[str, tuple[int, Path]] = {}
    for path, external in named:
        try:
            size = path.stat().st_size
        except OSError:
            size = -1
        best = out.get(external)
        if best is None or size > best[0] or (size == best[0] and str(path) < str(best[1])):
            out[external] = (size, path)
    return {external: path for external, (_, path) in out.items()}


def _copy_id(external: str, path: Path) -> str:
    """The id of a file that carries another file's session id (not the session's own file): the id and a
    digest of its path, so both stay importable, each as its own session."""
    digest = hashlib.sha256(str(path.absolute()).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{external}@{digest}"


def _external_id(path: Path) -> str:
    try:
        for line in LineReader(path, max_line_bytes=1 << 20, chunk=1 << 16):
            rec = parse_object(line.data) if line.data is not None else None
            if rec is not None and rec.get("type") == "session" and isinstance(rec.get("id"), str) and rec["id"]:
                return str(rec["id"])
            break
    except OSError:
        pass
    return path.stem


def parse(unit: SourceUnit, ctx: ParseContext) -> Parsed:
    sid = unit.session_id
    path = unit.files[0]
    meta = SessionMeta(SOURCE, unit.external_id, sid)
    report = SessionReport(SOURCE, unit.external_id, sid)
    file = FileReport(str(path))
    report.files.append(file)
    limits = ctx.limits

    def reader() -> LineReader:
        return LineReader(path, max_line_bytes=limits.max_line_bytes, chunk=limits.read_chunk, mark=ctx.mark(path))

    def make_id(key: str) -> str:
        return join_id(sid, key)

    conv = PiConverter(ctx, meta, report, file, make_id)

    def source_ids() -> set[str]:
        return conv.branch.message_ids(make_id) if conv.branch is not None else set()

    def off_branch() -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """Each abandoned branch: the records of the path from the root to its leaf, converted as if that
        leaf were the file's (one more read of the file up to the leaf's line per branch; the counts go to
        a scratch report)."""
        branch = conv.branch
        if branch is None:
            return
        for leaf in branch.abandoned_leaves():
            scratch = SessionReport(SOURCE, unit.external_id, sid)
            other = PiConverter(ctx, SessionMeta(SOURCE, unit.external_id, sid), scratch, FileReport(str(path)),
                                make_id)
            yield leaf, list(finalize(other.run(reader, branch=branch.for_leaf(leaf)), scratch, limits))

    return Parsed(meta, report, finalize(conv.run(reader), report, limits), follows_branch=True,
                  source_ids=source_ids, off_branch=off_branch)


@dataclass
class Header:
    version: int
    id: str
    cwd: str | None
    timestamp: int | None
    parent_session: str | None
    raw: dict[str, Any] = field(default_factory=dict)


CORRUPT_LEAF = "corrupt-leaf"
"""Key prefix of the system notice a fallback from a corrupt leaf writes (seed 000 §3.4)."""
TORN = "torn-entry"
"""Key prefix of the system notice before an entry recovered from behind a torn one (:func:`read_entry`)."""
MAX_RECOVERY_TRIES = 64
"""Entry starts tried from the end of a line that does not parse (:func:`read_entry`)."""
_ENTRY_START = b'{"type":'


def read_entry(data: bytes, report: FileReport | None = None) -> tuple[dict[str, Any] | None, bool]:
    """A line's entry, and whether it was recovered from behind a torn one (:func:`locate_entry`)."""
    rec, start = locate_entry(data, report)
    return rec, start > 0


def locate_entry(data: bytes, report: FileReport | None = None) -> tuple[dict[str, Any] | None, int]:
    """A line's entry, and where in the line it starts (0, or past a torn start it was recovered from behind).

    pi appends each entry as one ``JSON.stringify(entry) + "\n"``. A crash in the middle of a write leaves
    the start of that line without its newline; pi skips it when it loads the file and, resumed, appends
    the next entry right after those bytes, with the last intact entry as its parent. The line then holds
    the torn start and one whole entry: without that entry every later one hangs off a parent the file
    lacks and the tree's newest leaf reaches no root (seed 000 §3.4's fallback would show the branch
    before the crash and hide everything after it). The entry is the line's longest suffix that is one
    JSON object starting as pi writes an entry (``{"type":``), found from the end (bounded). ``report``: the
    file's, which counts a line read once repaired (:func:`.reader.parse_counted`)."""
    rec = parse_counted(data, report) if report is not None else parse_object(data)
    if rec is not None:
        return rec, 0
    end = len(data)
    for _ in range(MAX_RECOVERY_TRIES):
        start = data.rfind(_ENTRY_START, 1, end)
        if start < 0:
            break
        found = parse_object(data[start:])
        if found is not None and isinstance(found.get("type"), str):
            return found, start
        end = start
    return None, 0


@dataclass
class Branch:
    """Result of the first pass: the header and the entries on the current branch."""

    header: Header
    keys: set[str]
    """Entry keys on the branch (v1: every entry)."""
    leaf: str | None
    entries: int
    end: int
    """Offset just past the last complete line the first pass saw."""
    first_kept: set[str]
    kept_index: dict[int, str] = field(default_factory=dict)
    """v1 ``firstKeptEntryIndex`` (an index into the file's entries) → entry key."""
    all_keys: frozenset[str] = frozenset()
    """Every entry key in the file, on the branch or not."""
    calls: dict[str, int] = field(default_factory=dict)
    """Entry key → tool calls of an assistant message (each becomes a message ``<key>.<i>``)."""
    corrupt_leaf: dict[str, str] | None = None
    """Seed 000 §3.4: the file's leaf did not reach a root (``leaf``, ``reason``), so the branch
    is the one of ``fallback``, the highest-sequence leaf that does (a system notice says so); without
    ``fallback`` no entry reaches a root, the leaf's chain loops and the branch is the leaf's own fragment (a
    notice says so too)."""
    parents: dict[str, str | None] = field(default_factory=dict)
    """Entry key → its parent's key (file order)."""
    ends: dict[str, int] = field(default_factory=dict)
    """Entry key → the offset just past its line (a path never reaches past its leaf's line)."""

    def abandoned_leaves(self) -> list[str]:
        """The leaves of the branches off the current one (entries no entry names as parent), in file
        order; none for v1 (a linear list)."""
        if self.header.version < 2:
            return []
        parented = {p for p in self.parents.values() if p is not None}
        return [key for key in self.parents if key not in self.keys and key not in parented]

    def for_leaf(self, leaf: str) -> Branch:
        """The branch ending at ``leaf`` of the same file (no second pass over it)."""
        keys, _ = _walk(self.parents, leaf)
        return Branch(self.header, keys, leaf, self.entries, self.ends.get(leaf, self.end), self.first_kept,
                      self.kept_index, self.all_keys, self.calls, None, self.parents, self.ends)

    def message_ids(self, make_id: Callable[[str], str]) -> set[str]:
        """Every message id an entry of the file can become (on the branch or off it)."""
        out = {make_id(key) for key in self.all_keys}
        # a corrupt-leaf notice an earlier import wrote for any entry is this file's too: a repaired file
        # then hides it as off-branch instead of reading as an older copy
        out.update(make_id(f"{CORRUPT_LEAF}:{key}") for key in self.all_keys)
        out.update(make_id(f"{TORN}:{key}") for key in self.all_keys)
        for key, n in self.calls.items():
            out.update(make_id(f"{key}.{i}") for i in range(n))
        return out


def entry_key(version: int, rec: Mapping[str, Any], offset: int) -> str | None:
    if version >= 2:
        key = rec.get("id")
        return key if isinstance(key, str) and key else None
    return f"L{offset}"


def read_header(rec: Mapping[str, Any] | None) -> Header:
    if rec is None or rec.get("type") != "session" or not isinstance(rec.get("id"), str) or not rec["id"]:
        raise Refused("NOT_A_SESSION_FILE", "the first line is not a pi session header")
    version = rec.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version not in VERSIONS:
        raise Refused("UNSUPPORTED_VERSION", f"pi session format version {version!r} is not supported (1-3)")
    cwd = rec.get("cwd")
    parent = rec.get("parentSession")
    return Header(version, rec["id"], cwd if isinstance(cwd, str) and cwd else None, to_ms(rec.get("timestamp")),
                  parent if isinstance(parent, str) else None, dict(rec))


def find_branch(lines: Iterable[Line], file: FileReport, report: SessionReport, max_ids: int,
                leaf_id: str | None = None) -> Branch:
    """Pass 1: header, tree shape, the branch from the leaf (default: the last entry) to the root."""
    header: Header | None = None
    parents: dict[str, str | None] = {}
    referenced: set[str] = set()
    index_keys: dict[int, str] = {}
    calls: dict[str, int] = {}
    first_kept_index: list[int] = []
    last: str | None = None
    parsed = 0
    end = 0
    ends: dict[str, int] = {}
    for line in lines:
        end = line.offset + line.length
        if line.data is None or not line.data.strip():
            continue
        rec, _ = read_entry(line.data) if header is not None else (parse_object(line.data), False)
        if rec is None:
            continue
        if header is None:
            header = read_header(rec)
            parsed = 1
            continue
        key = entry_key(header.version, rec, line.offset)
        if key is None:
            continue
        if len(parents) >= max_ids:
            raise Refused("TOO_MANY_ENTRIES", f"more than {max_ids} entries in one pi session")
        parent = rec.get("parentId") if header.version >= 2 else last
        parents[key] = parent if isinstance(parent, str) and parent else None
        ends[key] = end
        index_keys[parsed] = key
        parsed += 1
        last = key
        message = rec.get("message")
        if rec.get("type") == "message" and isinstance(message, Mapping) and message.get("role") == "assistant" \
                and isinstance(message.get("content"), list):
            n = sum(1 for b in message["content"] if isinstance(b, Mapping) and b.get("type") == "toolCall")
            if n:
                calls[key] = n
        if rec.get("type") == "compaction":
            if isinstance(rec.get("firstKeptEntryId"), str):
                referenced.add(rec["firstKeptEntryId"])
            elif isinstance(rec.get("firstKeptEntryIndex"), int):
                first_kept_index.append(rec["firstKeptEntryIndex"])
    if header is None:
        raise Refused("NOT_A_SESSION_FILE", "no pi session header")
    kept_index = {i: index_keys[i] for i in first_kept_index if i in index_keys}
    referenced.update(kept_index.values())
    file.roots = sum(1 for p in parents.values() if p is None)
    file.dangling_parents = sum(1 for p in parents.values() if p is not None and p not in parents)
    leaf = leaf_id if leaf_id is not None else last
    keys, reason = _walk(parents, leaf)
    corrupt: dict[str, str] | None = None
    if leaf_id is None and leaf is not None and reason is not None:
        fallback = highest_reachable_leaf(parents, list(index_keys.values()))
        if fallback is not None:
            corrupt = {"leaf": leaf, "fallback": fallback, "reason": reason}
            leaf = fallback
            keys, _ = _walk(parents, leaf)
        elif reason.startswith("parent cycle"):
            # no entry reaches a root and the leaf's chain loops: its fragment is all there is, and the
            # notice says so (a chain that only starts at a missing parent is how pi itself shows the file:
            # it is imported as it is, counted in the report's danglingParents)
            corrupt = {"leaf": leaf, "reason": reason}
    report.off_branch += len(parents) - len(keys)
    return Branch(header, keys, leaf, len(parents), end, referenced, kept_index, frozenset(parents), calls,
                  corrupt, parents, ends)


def _walk(parents: Mapping[str, str | None], leaf: str | None) -> tuple[set[str], str | None]:
    """The keys from ``leaf`` towards the root, and why the walk did not reach one (None: it did).
    Bounded by the entry count: a cycle stops at its first repeat."""
    keys: set[str] = set()
    cur = leaf
    while cur is not None and cur in parents and cur not in keys:
        keys.add(cur)
        cur = parents[cur]
    if cur is None:
        return keys, None
    return keys, f"dangling parent {cur}" if cur not in parents else f"parent cycle at {cur}"


@dataclass(frozen=True)
class OnBranch:
    """One entry of a branch as :func:`on_branch` reads it."""

    line: Line
    rec: dict[str, Any]
    key: str
    start: int
    """Where the entry starts in its line: 0, or past a torn start (:func:`locate_entry`)."""


def on_branch(lines: Iterable[Line], branch: Branch, file: FileReport) -> Iterator[OnBranch]:
    """The entries of ``branch`` in file order, up to the line its first pass ended on: the one reading of a
    branch's lines that the converter (a detail read, an import) and a native fork share, so a fork copies
    exactly the entries a read shows. Every line read is counted into ``file``."""
    for line in lines:
        if line.offset >= branch.end:
            break
        file.lines += 1
        if line.data is None:
            file.oversized_lines += 1
            continue
        if not line.data.strip():
            file.blank_lines += 1
            continue
        rec, start = locate_entry(line.data, file) if line.offset else (parse_counted(line.data, file), 0)
        if rec is None:
            file.bad_lines += 1
            continue
        if start:
            file.skipped["torn entry"] += 1
        kind = rec.get("type")
        file.record_types[kind if isinstance(kind, str) else "<no type>"] += 1
        if kind == "session" and line.offset == 0:
            continue
        key = entry_key(branch.header.version, rec, line.offset)
        if key is not None and key in branch.keys:
            yield OnBranch(line, rec, key, start)


def highest_reachable_leaf(parents: Mapping[str, str | None], order: list[str]) -> str | None:
    """The latest entry (file order = sequence) whose parent chain reaches a root; O(entries)."""
    reaches: dict[str, bool] = {}
    for start in parents:
        path: list[str] = []
        on_path: set[str] = set()
        cur: str | None = start
        while cur is not None and cur in parents and cur not in reaches and cur not in on_path:
            path.append(cur)
            on_path.add(cur)
            cur = parents[cur]
        ok = True if cur is None else reaches.get(cur, False)
        for key in path:
            reaches[key] = ok
    return next((key for key in reversed(order) if reaches.get(key)), None)


class PiConverter:
    """pi entries on the current branch → transcript records (ids from ``make_id``)."""

    def __init__(self, ctx: ParseContext, meta: SessionMeta, report: SessionReport, file: FileReport,
                 make_id: Callable[[str], str]) -> None:
        self.ctx, self.meta, self.report, self.file, self.make_id = ctx, meta, report, file, make_id
        self.emitter = Emitter(ctx.limits, report)
        self.pending: dict[str, Slot] = {}
        self.model: str | None = None
        self.provider: str | None = None
        self.first_kept: dict[str, str] = {}
        self.waiting_kept: list[str] = []
        self.branch: Branch | None = None

    def run(self, lines: Callable[[], Iterable[Line]], leaf_id: str | None = None,
            branch: Branch | None = None) -> Iterator[Slot]:
        """``branch``: the tree is known already (another leaf of a file read before): one pass, up to the
        leaf's line."""
        if branch is None:
            first = lines()
            branch = find_branch(first, self.file, self.report, self.ctx.limits.max_tracked_ids, leaf_id)
            if isinstance(first, LineReader):
                file_report(first, self.file)
        self.branch = branch
        self.start(branch.header)
        for found in on_branch(lines(), branch, self.file):
            if found.start:
                self.torn_notice(found.key, to_ms(found.rec.get("timestamp")))
            self.entry(found.rec, found.key, found.line.length)
            yield from self.emitter.ready()
        if branch.corrupt_leaf is not None:
            self.corrupt_leaf_notice(branch.corrupt_leaf)
        self.report.unpaired_tool_calls += len(self.pending)
        self.pending.clear()
        yield from self.emitter.finish()

    def corrupt_leaf_notice(self, corrupt: Mapping[str, str]) -> None:
        """Seed 000 §3.4: "Corrupt data falls back to the highest-sequence reachable leaf and produces a
        system notice." — one ``system`` message after the branch it fell back to. When no entry of the file
        reaches a root and the leaf's chain loops, there is no intact branch to fall back to: the leaf's
        fragment is shown (nothing of it is dropped) and the notice still says the data is corrupt
        (``corruptLeaf`` has no ``fallback``)."""
        if "fallback" in corrupt:
            text = (f"This session's last entry ({corrupt['leaf']}) does not lead back to the start of the "
                    f"conversation ({corrupt['reason']}); showing the newest intact branch, ending at entry "
                    f"{corrupt['fallback']}.")
        else:
            text = (f"This session's last entry ({corrupt['leaf']}) does not lead back to the start of the "
                    f"conversation ({corrupt['reason']}), and no entry of it does; showing the entries that "
                    f"lead to it, from the first one that could be read.")
        self.notice(f"{CORRUPT_LEAF}:{corrupt['leaf']}", self.meta.updated_ms, [text_block(text)],
                    {"importedKind": "pi/corrupt_leaf", "corruptLeaf": dict(corrupt)})

    def torn_notice(self, key: str, ts: int | None) -> None:
        """Seed 000 §3.4 ("Corrupt data ... produces a system notice"): an entry pi was writing when it stopped
        is lost; the notice stands where it was, before the entry recovered from behind it."""
        text = ("An entry of this session was cut short while pi was writing it (pi stopped before the line "
                "was complete) and could not be read; the conversation goes on from the entry before it.")
        self.notice(f"{TORN}:{key}", ts, [text_block(text)], {"importedKind": "pi/torn_entry", "nextEntry": key})

    def start(self, header: Header) -> None:
        self.meta.cwd = header.cwd
        self.meta.saw_time(header.timestamp)
        self.meta.label = f"pi (session format v{header.version})"
        if header.parent_session:
            self.meta.history["parentSession"] = header.parent_session

    # ------------------------------------------------------------------ entries
    def entry(self, rec: Mapping[str, Any], key: str, length: int) -> None:
        raw_kind = rec.get("type")
        # pi writes a string; a damaged or hand-edited file may hold any JSON value (an array or object
        # is unhashable: read as an unknown entry, never an error that hides the whole session)
        kind = raw_kind if isinstance(raw_kind, str) else "<no type>"
        ts = to_ms(rec.get("timestamp"))
        self.meta.saw_time(ts)
        if key in (self.branch.first_kept if self.branch else ()):
            self.waiting_kept.append(key)
        if kind == "message":
            message = rec.get("message")
            if isinstance(message, Mapping):
                self.message(message, key, to_ms(message.get("timestamp")) or ts, length)
            else:
                self.file.unknown["message(no message)"] += 1
        elif kind == "model_change":
            if isinstance(rec.get("modelId"), str):
                self.model = rec["modelId"]
                self.meta.history["modelId"] = self.model
            if isinstance(rec.get("provider"), str):
                self.provider = rec["provider"]
                self.meta.history["providerId"] = self.provider
        elif kind == "thinking_level_change":
            if isinstance(rec.get("thinkingLevel"), str):
                self.meta.thinking_level = rec["thinkingLevel"]
                self.meta.history["thinkingLevel"] = rec["thinkingLevel"]
        elif kind == "session_info":
            self.meta.offer_title(rec.get("name"), 0, replace=True)
        elif kind == "compaction":
            self.compaction(rec, key, ts)
        elif kind == "branch_summary":
            summary = rec.get("summary")
            if isinstance(summary, str) and summary:
                summary_meta = {"importedKind": "pi/branch_summary"}
                if isinstance(rec.get("fromId"), str):
                    summary_meta["fromEntryId"] = rec["fromId"]  # the leaf of the branch it summarizes
                self.notice(key, ts, [text_block(summary)], summary_meta)
        elif kind == "custom_message":
            blocks = self.content(rec.get("content"), self.make_id(key))
            if blocks:
                custom_meta: dict[str, Any] = {"importedKind": "pi/custom_message"}
                if isinstance(rec.get("customType"), str):
                    custom_meta["customType"] = rec["customType"]
                if rec.get("display") is False:
                    custom_meta["hidden"] = True
                self.notice(key, ts, blocks, custom_meta)
        elif kind == "label":
            self.label(rec, key, ts)
        elif kind in SKIPPED_ENTRIES:
            self.file.skipped[str(kind)] += 1
        else:
            self.file.unknown[str(kind)] += 1

    def label(self, rec: Mapping[str, Any], key: str, ts: int | None) -> None:
        """A bookmark the person set on an entry in pi's tree view (``/label``; no text: the label taken off):
        a ``system`` notice where it was set, ``meta.label`` its text, ``meta.targetMessageId`` the message of
        the entry it marks (``targetId``)."""
        target = rec.get("targetId")
        text = rec.get("label")
        if not isinstance(target, str) or not target or (text is not None and not isinstance(text, str)):
            self.file.skipped["label(unreadable)"] += 1
            return
        meta: dict[str, Any] = {"importedKind": "pi/label", "targetMessageId": self.make_id(target)}
        if text:
            meta["label"] = text[:MAX_LABEL_CHARS]
        self.notice(key, ts, [text_block(f"Label: {text[:MAX_LABEL_CHARS]}" if text else "Label removed")], meta)

    def push_message(self, record: dict[str, Any], *, held: bool = False, weight: int = 0) -> Slot:
        slot = self.emitter.push(record, held=held, weight=weight)
        for waiting in self.waiting_kept:
            self.first_kept[waiting] = record["id"]
        self.waiting_kept.clear()
        return slot

    def notice(self, key: str, ts: int | None, blocks: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        self.push_message(message_record(self.make_id(key), "system", ts, blocks, meta=meta))

    def message(self, message: Mapping[str, Any], key: str, ts: int | None, length: int) -> None:
        role = message.get("role")
        msg_id = self.make_id(key)
        if role == "user":
            blocks = self.content(message.get("content"), msg_id)
            if blocks:
                first = next((b["text"] for b in blocks if b.get("type") == "text"), "")
                self.meta.offer_title(first, 5)
                self.push_message(message_record(msg_id, "user", ts, blocks), weight=length)
        elif role == "assistant":
            self.assistant(message, key, msg_id, ts, length)
        elif role == "toolResult":
            self.tool_result(message, key, ts)
        elif role == "bashExecution":
            self.bash(message, key, ts)
        elif role in ("custom", "hookMessage", "branchSummary", "compactionSummary"):
            content = message.get("content") if role in ("custom", "hookMessage") else message.get("summary")
            blocks = self.content(content, msg_id)
            if blocks:
                meta: dict[str, Any] = {"importedKind": f"pi/{role}"}
                if isinstance(message.get("customType"), str):
                    meta["customType"] = message["customType"]
                if message.get("display") is False:
                    meta["hidden"] = True
                self.notice(key, ts, blocks, meta)
        else:
            self.file.unknown[f"message/{role}"] += 1

    def content(self, content: Any, msg_id: str) -> list[dict[str, Any]]:
        if isinstance(content, str):
            return [text_block(content)] if content else []
        blocks: list[dict[str, Any]] = []
        if not isinstance(content, list):
            return blocks
        for i, block in enumerate(content):
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                blocks.append(text_block(block["text"]))
            elif kind == "image":
                att = image_attachment(self.ctx, self.report, block.get("data"), block.get("mimeType"),
                                       f"image-{i + 1}", msg_id)
                if att is not None:
                    blocks.append(att)
            else:
                self.report.skipped_blocks[f"content/{kind}"] += 1
        return blocks

    def assistant(self, message: Mapping[str, Any], key: str, msg_id: str, ts: int | None, length: int) -> None:
        meta: dict[str, Any] = {}
        model = message.get("model") if isinstance(message.get("model"), str) else self.model
        provider = message.get("provider") if isinstance(message.get("provider"), str) else self.provider
        if model:
            meta["modelId"] = model
        if provider:
            meta["providerId"] = provider
        for src, dst in (("usage", "usage"), ("stopReason", "stopReason"), ("api", "api"),
                         ("responseId", "responseId"), ("responseModel", "responseModel"), ("errorMessage", "error")):
            value = message.get(src)
            if value is not None and json_value_ok(value):
                meta[dst] = value
        blocks: list[dict[str, Any]] = []
        calls: list[Mapping[str, Any]] = []
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, Mapping):
                continue
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                out = text_block(block["text"])
                sig = bounded_replay(self.ctx, self.report, block.get("textSignature"))
                if sig is not None:
                    out["textSignature"] = sig
                blocks.append(out)
            elif kind == "thinking" and isinstance(block.get("thinking"), str):
                thinking: dict[str, Any] = {"type": "thinking", "text": block["thinking"]}
                sig = bounded_replay(self.ctx, self.report, block.get("thinkingSignature"))
                if sig is not None:
                    thinking["signature"] = sig
                if block.get("redacted") is True:
                    thinking["redacted"] = True
                blocks.append(thinking)
            elif kind == "toolCall":
                calls.append(block)
            else:
                self.report.skipped_blocks[f"assistant/{kind}"] += 1
        meta_placed = False
        if blocks or not calls:
            if blocks or "error" in meta:
                self.push_message(message_record(msg_id, "assistant", ts, blocks, meta=meta), weight=length)
                meta_placed = True
            else:
                self.report.skipped_blocks["assistant(empty)"] += 1
        for i, call in enumerate(calls):
            call_id = call.get("id")
            name = call.get("name") if isinstance(call.get("name"), str) and call.get("name") else "unknown"
            args = call.get("arguments") if json_value_ok(call.get("arguments")) else None
            has_id = isinstance(call_id, str) and bool(call_id)
            cid = call_id if isinstance(call_id, str) and call_id else f"{key}.{i}"
            # a response that only called tools: its model, usage and stop reason go on its first call
            call_block: dict[str, Any] = {"type": "tool_call", "callId": cid, "name": name, "args": args}
            sig = bounded_replay(self.ctx, self.report, call.get("thoughtSignature"))
            if sig is not None:
                call_block["signature"] = sig  # provider replay state of the call (Gemini, OpenRouter)
            record = message_record(self.make_id(f"{key}.{i}"), "tool", ts, [call_block], tool_name=name,
                                    meta=meta if i == 0 and not meta_placed else None)
            slot = self.push_message(record, held=has_id, weight=length)
            if has_id:
                previous = self.pending.pop(cid, None)
                if previous is not None:
                    previous.held = False
                    self.report.unpaired_tool_calls += 1
                self.pending[cid] = slot

    def tool_result(self, message: Mapping[str, Any], key: str, ts: int | None) -> None:
        call_id = message.get("toolCallId")
        msg_id = self.make_id(key)
        blocks = self.content(message.get("content"), msg_id)
        result: Any = "\n".join(b["text"] for b in blocks) if all(b["type"] == "text" for b in blocks) else blocks
        status = "error" if message.get("isError") is True else "ok"
        slot = self.pending.pop(call_id, None) if isinstance(call_id, str) else None
        name = message.get("toolName") if isinstance(message.get("toolName"), str) else "unknown"
        extra: dict[str, Any] = {"result": result, "status": status, "completedAt": stamp(ts)}
        details = message.get("details")
        if details is not None and json_value_ok(details):
            extra["details"] = details
        if slot is None:
            self.report.orphan_results += 1
            block = {"type": "tool_call", "callId": call_id if isinstance(call_id, str) and call_id else key,
                     "name": name, "args": None, **extra}
            self.push_message(message_record(msg_id, "tool", ts, [block], tool_name=name,
                                             meta={"orphanResult": True}))
            return
        old = slot.record
        self.emitter.replace(slot, {**old, "blocks": [{**old["blocks"][0], **extra}]})
        slot.held = False

    def bash(self, message: Mapping[str, Any], key: str, ts: int | None) -> None:
        exit_code = message.get("exitCode")
        failed = message.get("cancelled") is True or (isinstance(exit_code, int) and exit_code != 0)
        output = message.get("output")
        block: dict[str, Any] = {"type": "tool_call", "callId": key, "name": "bash",
                                 "args": {"command": message.get("command")}, "result": output
                                 if isinstance(output, str) else "", "status": "error" if failed else "ok",
                                 "completedAt": stamp(ts)}
        if isinstance(exit_code, int):
            block["exitCode"] = exit_code
        if message.get("truncated") is True:
            block["truncated"] = True
            if isinstance(message.get("fullOutputPath"), str) and message["fullOutputPath"]:
                block["fullOutputPath"] = message["fullOutputPath"]
        meta: dict[str, Any] = {"importedKind": "pi/bashExecution"}
        if message.get("excludeFromContext") is True:
            meta["excludeFromContext"] = True  # a ``!!command``: pi never showed it to the model
        self.push_message(message_record(self.make_id(key), "tool", ts, [block], tool_name="bash", meta=meta))

    def compaction(self, rec: Mapping[str, Any], key: str, ts: int | None) -> None:
        through = self.emitter.last_message_id
        if through is None:
            self.report.compactions_dropped += 1
            return
        summary = rec.get("summary")
        tokens = rec.get("tokensBefore")
        details: dict[str, Any] = {"retainedTailMode": "completed_turn", "importedFrom": SOURCE}
        raw_details = rec.get("details")
        if isinstance(raw_details, Mapping):
            details["source"] = dict(raw_details)
        if rec.get("fromHook") is True:
            details["fromHook"] = True
        record: dict[str, Any] = {"type": "compaction", "id": self.make_id(f"compaction.{key}"),
                                  "summary": summary if isinstance(summary, str) else ""}
        kept_key = rec.get("firstKeptEntryId")
        index = rec.get("firstKeptEntryIndex")
        if not isinstance(kept_key, str) and isinstance(index, int) and self.branch is not None:
            kept_key = self.branch.kept_index.get(index)
        kept = self.first_kept.get(kept_key) if isinstance(kept_key, str) else None
        if kept is not None:
            record["firstKeptMessageId"] = kept
        record.update({"throughMessageId": through,
                       "tokensBefore": tokens if isinstance(tokens, int) and not isinstance(tokens, bool)
                       and tokens >= 0 else 0,
                       "retainedTail": [], "createdAt": stamp(ts), "details": details})
        self.emitter.push(record)


__all__ = ["CORRUPT_LEAF", "SOURCE", "TORN", "Branch", "Header", "OnBranch", "PiConverter", "discover",
           "find_branch", "locate_entry", "on_branch", "parse", "read_header"]
