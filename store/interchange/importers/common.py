"""What every importer shares: limits, the bounded line reader, ids, blocks, the ordered emitter, reports.

An importer turns another tool's files into this host's transcript records
(docs/DESIGN.md "Transcript file format"): ``message`` records with the block
vocabulary of ``protocol/blocks.py`` and ``compaction`` records. It is a pure
parser: it reads the source files (never writes them) and yields records in
transcript order; :mod:`store.interchange.import_write` decides where they go.

Bounds (seed 000 §2: "import validation accepts only the defined bounded
structure"):

* files are read in chunks, line by line; a line longer than
  ``max_line_bytes`` is skipped without ever being held in memory (counted as
  ``oversizedLines``); an incomplete last line (a file still being written) is
  not consumed (``tornTailBytes``) so a later import picks it up;
* replay state (signatures, encrypted reasoning) is kept only up to
  ``max_replay_chars``; images up to ``max_image_bytes``;
* the look-behind window that pairs tool calls with their results holds at
  most ``max_pending_records`` records / ``max_pending_bytes`` source bytes;
  past it the oldest record is written without its result, and a result that
  arrives later is written as a replacement line with the same id (readers
  keep the last line of an id at the first line's position).

Ids are deterministic: a session id is a function of ``(source, external id)``
and a message id of the session id and the source's own id (or the byte
offset of the source line), so importing the same file twice produces the
same bytes.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from store.attachments import DEFAULT_BUDGET_BYTES, AttachmentFiles
from store.interchange.importers.reader import (
    Line,
    LineReader,
    file_report,
    open_source,
    parse_counted,
    parse_object,
    peek_field,
    read_json_file,
)
from store.interchange.importers.report import FileReport, SessionReport
from store.interchange.importers.usage_shape import normalize_usage
from store.jsonio import now_rfc3339
from store.rules import MAX_BLOCKS_PER_MESSAGE as MAX_BLOCKS
from store.rules import SESSION_ID_RE, WIRE_ID_RE
from store.transcripts.records import ROLES, rfc3339_to_ms
from store.upgrade.schema import MAX_SEQ

if TYPE_CHECKING:
    from store.review import StagedSnapshots

__all__ = [
    "SOURCES",
    "Archived",
    "ChainTracker",
    "file_report",
    "open_source",
    "parse_counted",
    "parse_object",
    "peek_field",
    "read_json_file",
    "BlobSink",
    "Emitter",
    "FileReport",
    "ImportLimits",
    "Line",
    "LineReader",
    "ParseContext",
    "Parsed",
    "Refused",
    "SessionMeta",
    "SessionReport",
    "Slot",
    "SourceUnit",
    "local_id",
    "message_record",
    "session_id_for",
    "stamp",
    "tool_tally",
    "attachment_tally",
    "uncount_output",
]

SOURCES = ("claude-code", "codex", "pi", "opencode", "pi-host")
"""Values of ``sessions.source`` an import writes (the UI badge)."""

_PREFIX = {"claude-code": "cc", "codex": "cx", "pi": "pi", "opencode": "oc", "pi-host": "ph"}
EPOCH_STAMP = now_rfc3339(0)
_LOCAL_RE = re.compile(r"[^A-Za-z0-9_\-.@+=]")
MAX_LOCAL_CHARS = 80
MAX_TITLE_CHARS = 80


@dataclass(frozen=True)
class ImportLimits:
    """Bounds of one import (configuration, passed in)."""

    max_line_bytes: int = 32 * 1024 * 1024
    max_pending_records: int = 1024
    max_pending_bytes: int = 64 * 1024 * 1024
    max_replay_chars: int = 1024 * 1024
    max_image_bytes: int = 20 * 1024 * 1024
    max_tracked_ids: int = 4_000_000
    max_messages: int = MAX_SEQ
    max_files_per_session: int = 10_000
    recognize_within_lines: int = 64
    read_chunk: int = 1 << 20


DEFAULT_LIMITS = ImportLimits()


class Refused(Exception):
    """The unit cannot be imported; nothing is written. ``code`` is stable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.report: SessionReport | None = None
        """The parse's report so far (file counts), attached where the refusal is caught."""


# --------------------------------------------------------------------------- ids and times


def session_id_for(source: str, external_id: str) -> str:
    """The host session id of an imported session: a pure function of (source, external id)."""
    digest = hashlib.sha256(f"{source}\x00{external_id}".encode()).hexdigest()[:32]
    sid = f"{_PREFIX[source]}-{digest}"
    assert SESSION_ID_RE.fullmatch(sid)
    return sid


def local_id(value: object) -> str:
    """A source id as a bounded id fragment: kept when it is short and plain, else hashed."""
    text = str(value)
    if text and len(text) <= MAX_LOCAL_CHARS and not _LOCAL_RE.search(text):
        return text
    return "h" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def join_id(session_id: str, *parts: object) -> str:
    """``<sessionId>:<part>:...``: unique across sessions by construction (no D444 remap needed)."""
    out = ":".join([session_id, *(local_id(p) for p in parts)])
    if len(out) > 200:  # pragma: no cover - parts are bounded to 80 chars each
        out = f"{session_id}:h{hashlib.sha256(out.encode()).hexdigest()[:24]}"
    assert WIRE_ID_RE.fullmatch(out), out
    return out


def to_ms(value: object) -> int | None:
    """RFC 3339 text or epoch milliseconds as integer ms; None when unusable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < 32503680000000 else None
    if isinstance(value, float):
        return int(value) if 0 <= value < 32503680000000 else None
    if isinstance(value, str) and value:
        ms = rfc3339_to_ms(value, -1)
        return ms if 0 <= ms < 32503680000000 else None
    return None


def stamp(ms: int | None) -> str:
    """The canonical RFC 3339 spelling (file and index agree); the epoch when unknown."""
    return now_rfc3339(ms) if ms is not None else EPOCH_STAMP


def clean_title(text: object) -> str:
    if not isinstance(text, str):
        return ""
    one = " ".join(text.split())
    return one[:MAX_TITLE_CHARS]


# --------------------------------------------------------------------------- records and blocks


def message_record(
    msg_id: str,
    role: str,
    created_ms: int | None,
    blocks: list[dict[str, Any]],
    *,
    tool_name: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A transcript ``message`` record (key order as the writer would put it)."""
    assert role in ROLES
    rec: dict[str, Any] = {"type": "message", "id": msg_id, "role": role, "createdAt": stamp(created_ms),
                           "blocks": blocks}
    if tool_name is not None:
        rec["toolName"] = tool_name
    if meta:
        rec["meta"] = dict(meta)
    return rec


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def json_value_ok(value: Any) -> bool:
    """True for a value the transcript writer can always encode (it came from orjson)."""
    return value is None or isinstance(value, (str, int, float, bool, list, dict))


MAX_META_VALUE_BYTES = 256 * 1024
"""The largest structured value of a source line an importer keeps in a record's ``meta`` (as JSON): a review's
findings, a tool's structured result. Past it the importer keeps what it can and counts the rest."""


def bounded_value(value: Any, limit: int = MAX_META_VALUE_BYTES) -> bool:
    """True when ``value`` (as orjson would write it) is at most ``limit`` bytes."""
    try:
        return len(orjson.dumps(value)) <= limit
    except (TypeError, orjson.JSONEncodeError):
        return False


MAX_CUT_STRING_CHARS = 16 * 1024
"""What :func:`bounded_structure` keeps of each long string of a value past ``MAX_META_VALUE_BYTES``."""
_MAX_CUT_DEPTH = 32


def bounded_structure(value: Any, limit: int = MAX_META_VALUE_BYTES) -> tuple[Any, int] | None:
    """``value`` within ``limit`` bytes as JSON, and how many characters of it were cut: as it is when it fits,
    else with every string longer than ``MAX_CUT_STRING_CHARS`` cut to that many (an edit's original file, a
    patch: the start is kept, what was dropped counted). None when even that does not fit."""
    if not json_value_ok(value):
        return None
    if bounded_value(value, limit):
        return value, 0
    dropped = 0

    def cut(item: Any, depth: int) -> Any:
        nonlocal dropped
        if isinstance(item, str):
            if len(item) > MAX_CUT_STRING_CHARS:
                dropped += len(item) - MAX_CUT_STRING_CHARS
                return item[:MAX_CUT_STRING_CHARS]
            return item
        if depth >= _MAX_CUT_DEPTH and isinstance(item, (dict, list)):
            dropped += 1
            return None
        if isinstance(item, dict):
            return {k: cut(v, depth + 1) for k, v in item.items()}
        if isinstance(item, list):
            return [cut(v, depth + 1) for v in item]
        return item

    smaller = cut(value, 0)
    return (smaller, dropped) if bounded_value(smaller, limit) else None


def decoded_size(b64: str) -> int:
    return (len(b64) * 3) // 4


# --------------------------------------------------------------------------- blobs


@dataclass(frozen=True)
class BlobRef:
    ref: str
    sha256: str
    size: int
    mime_type: str


class BlobSink:
    """Where images found in a source go. The default only hashes (pure parse, dry run)."""

    def __init__(self, put: Callable[[bytes, str], tuple[str, int]] | None = None, *,
                 files: AttachmentFiles | None = None, max_carried_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self._put = put
        self.stored: list[tuple[BlobRef, str]] = []
        """(blob, message id) for every image written, for the attachment_refs rows."""
        self.files = files
        """Where a pi-host export's carried ``blob`` lines are written (None: verified only)."""
        self.max_carried_bytes = max_carried_bytes
        """The largest carried blob stored: the attachment budget (as ``attachments.importFile``)."""
        self.carried: list[BlobRef] = []
        """Carried blobs verified and stored (their references come from the indexed blocks)."""
        self.lost: set[str] = set()
        """Blobs the imported blocks refer to whose bytes are neither carried nor here: the copy says evicted."""

    def add(self, data: bytes, mime_type: str, message_id: str) -> BlobRef:
        if self._put is not None:
            sha, size = self._put(data, mime_type)
        else:
            sha, size = hashlib.sha256(data).hexdigest(), len(data)
        blob = BlobRef(f"attachments/{sha}", sha, size, mime_type)
        self.stored.append((blob, message_id))
        return blob


@dataclass
class ParseContext:
    limits: ImportLimits = DEFAULT_LIMITS
    blobs: BlobSink = field(default_factory=BlobSink)
    consumed_before: Mapping[str, int] = field(default_factory=dict)
    """A re-import's: per source file, the offset the last import consumed to. The reader whose digest
    reports the file is given it as its ``mark`` (:meth:`mark`), so the file's earlier state is known from
    the parse's own read (``store.interchange.imports.earlier_states``)."""

    reviews: StagedSnapshots | None = None
    """Where a pi-host export's ``review_snapshot`` lines are staged, in the session's
    ``review-changes/<sessionId>/`` (published with the import; None: verified only: a pure parse, a dry run)."""
    workspace: str | None = None
    """A re-import's: the workspace root of the copy the import writes into (a carried review snapshot's
    ``workspacePath`` is re-rooted on it); None for a new copy, whose root is the export's ``projectPath``."""

    def mark(self, path: Path) -> int | None:
        return self.consumed_before.get(str(path))


def image_attachment(
    ctx: ParseContext, report: SessionReport, b64: object, mime: object, name: str, message_id: str,
    *, kind: str = "image", label: str = "image",
) -> dict[str, Any] | None:
    """An attachment block for inline base64 image data (bytes go to the blob sink); ``kind="file"`` for
    another file (a document), ``label`` naming it in the skip counts. Bounded by ``max_image_bytes``."""
    import base64
    import binascii

    if not isinstance(b64, str) or not b64:
        report.skipped_blocks[f"{label}(no data)"] += 1
        return None
    if decoded_size(b64) > ctx.limits.max_image_bytes:
        report.skipped_blocks[f"{label}(too large)"] += 1
        return None
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        report.skipped_blocks[f"{label}(bad base64)"] += 1
        return None
    return bytes_attachment(ctx, report, data, mime, name, message_id, kind=kind)


def bytes_attachment(ctx: ParseContext, report: SessionReport, data: bytes, mime: object, name: str,
                     message_id: str, *, kind: str = "file") -> dict[str, Any]:
    """An attachment block for bytes a source holds inline (they go to the blob sink)."""
    mime_type = mime if isinstance(mime, str) and mime and len(mime) <= 100 else "application/octet-stream"
    blob = ctx.blobs.add(data, mime_type, message_id)
    return {"type": "attachment", "kind": kind, "name": name, "ref": blob.ref, "mimeType": mime_type,
            "size": blob.size}


def bounded_replay(ctx: ParseContext, report: SessionReport, value: object) -> str | None:
    """Provider replay state (a signature, encrypted reasoning) if it is a bounded string."""
    if not isinstance(value, str) or not value:
        return None
    if len(value) > ctx.limits.max_replay_chars:
        report.replay_dropped += 1
        return None
    return value


# --------------------------------------------------------------------------- session facts


MAX_GIT_CHARS = 1024
"""A git branch name, commit or repository URL longer than this is not kept (no tool writes one)."""
MAX_GIT_BRANCHES = 20


@dataclass
class SessionMeta:
    """Session-level facts gathered while parsing (final once the records are exhausted)."""

    source: str
    external_id: str
    session_id: str
    title: str = ""
    title_rank: int = 99
    """Lower wins: an explicit name beats a generated summary beats the first prompt."""
    cwd: str | None = None
    created_ms: int | None = None
    updated_ms: int | None = None
    model_id: str | None = None
    provider_id: str | None = None
    thinking_level: str | None = None
    label: str = ""
    """Human label of the source (tool and version) for the origin row."""
    history: dict[str, Any] = field(default_factory=dict)
    """Historical values kept in the origin row, never bound to the session."""
    carried: dict[str, Any] = field(default_factory=dict)
    """What a pi-host export says of its own session that a new copy of it takes (``thinkingLevel``,
    ``thread``; set by :mod:`.host_jsonl` only, checked by :mod:`store.interchange.import_write`)."""

    def offer_title(self, text: object, rank: int, *, replace: bool = False) -> None:
        """Keep the best-ranked title; ``replace`` lets a later one of the same rank win (a rename)."""
        title = clean_title(text)
        if title and (rank < self.title_rank or (replace and rank == self.title_rank)):
            self.title, self.title_rank = title, rank

    def saw_git(self, branch: object = None, commit: object = None, repository: object = None) -> None:
        """The git state the source recorded (kept as the origin history's ``git``, served as ``historyGit``):
        the branch last seen, every branch seen in order (at most ``MAX_GIT_BRANCHES``), the commit and the
        repository's URL when the source names them."""
        git: dict[str, Any] = self.history.setdefault("git", {})
        if isinstance(branch, str) and branch and len(branch) <= MAX_GIT_CHARS:
            seen = git.setdefault("branches", [])
            if branch not in seen and len(seen) < MAX_GIT_BRANCHES:
                seen.append(branch)
            git["branch"] = branch
        for key, value in (("commit", commit), ("repositoryUrl", repository)):
            if isinstance(value, str) and value and len(value) <= MAX_GIT_CHARS:
                git[key] = value
        if not git:
            del self.history["git"]

    def saw_time(self, ms: int | None) -> None:
        if ms is None:
            return
        if self.created_ms is None or ms < self.created_ms:
            self.created_ms = ms
        if self.updated_ms is None or ms > self.updated_ms:
            self.updated_ms = ms


@dataclass(frozen=True)
class SourceUnit:
    """One session to import: its files (primary first) and how to find them again."""

    source: str
    external_id: str
    files: tuple[Path, ...]
    locator: tuple[tuple[str, str], ...] = ()
    """Format-specific coordinates (opencode: layout, storage root, session id)."""

    @property
    def session_id(self) -> str:
        return session_id_for(self.source, self.external_id)

    def loc(self, key: str) -> str:
        return dict(self.locator)[key]


# --------------------------------------------------------------------------- parent-chain tracking


class ChainTracker:
    """Counts roots and dangling parents of an id/parent-id chain in bounded memory.

    Ids are kept as 64-bit digests; past ``limit`` ids the check stops (reported
    as partial) instead of growing memory.
    """

    def __init__(self, limit: int) -> None:
        self._seen: set[int] = set()
        self._waiting: dict[int, int] = {}
        self._limit = limit
        self.roots = 0
        self.partial = False

    @staticmethod
    def _key(value: str) -> int:
        return int.from_bytes(hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")

    def seen_before(self, node_id: str) -> bool:
        return self._key(node_id) in self._seen

    def add(self, node_id: object, parent_id: object) -> bool:
        """Record a node; returns True when its id was already seen (a duplicate id)."""
        if self.partial:
            return False
        if len(self._seen) >= self._limit:
            self.partial = True
            return False
        duplicate = False
        if isinstance(node_id, str) and node_id:
            key = self._key(node_id)
            duplicate = key in self._seen
            self._seen.add(key)
            self._waiting.pop(key, None)
        if isinstance(parent_id, str) and parent_id:
            pkey = self._key(parent_id)
            if pkey not in self._seen:
                self._waiting[pkey] = self._waiting.get(pkey, 0) + 1
        elif parent_id is None:
            self.roots += 1
        return duplicate

    @property
    def dangling(self) -> int:
        return sum(self._waiting.values())


# --------------------------------------------------------------------------- the ordered emitter


@dataclass(eq=False)
class Slot:
    record: dict[str, Any]
    held: bool = False
    weight: int = 0
    drained: bool = False
    replacement: bool = False
    """A second line for an id already written (readers keep the last one in place)."""
    dropped: bool = False
    pinned: bool = False
    """Held back like ``held``, for another reason than a tool result: a record carrying a response's usage
    while later lines of that response may still refresh it (Claude Code)."""


class Emitter:
    """Records in transcript order; a held slot (a tool call awaiting its result) holds back the rest.

    The window is bounded: past ``max_pending_records`` / ``max_pending_bytes``
    the oldest slot is released as it is (``forced_flushes``); its owner sees
    ``slot.drained`` and writes a replacement record later if it must.
    """

    def __init__(self, limits: ImportLimits, report: SessionReport) -> None:
        self._queue: deque[Slot] = deque()
        self._weight = 0
        self._limits = limits
        self._report = report
        self.last_message_id: str | None = None

    def push(self, record: dict[str, Any], *, held: bool = False, weight: int = 0,
             replacement: bool = False) -> Slot:
        slot = Slot(record, held, weight, replacement=replacement)
        self._queue.append(slot)
        self._weight += weight
        if record.get("type") == "message":
            self.last_message_id = record["id"]
        return slot

    def replace(self, slot: Slot, record: dict[str, Any]) -> None:
        """Give a slot new content: in place while queued, else as a replacement line."""
        if slot.drained:
            self.push(record, replacement=True)
        else:
            slot.record = record

    def discard(self, slot: Slot) -> bool:
        """Take back a slot not written yet (False when it already was)."""
        if slot.drained:
            return False
        slot.dropped = True
        slot.held = False
        return True

    def ready(self) -> Iterator[Slot]:
        queue = self._queue
        while queue:
            head = queue[0]
            if head.held or head.pinned:
                if len(queue) <= self._limits.max_pending_records and self._weight <= self._limits.max_pending_bytes:
                    return
                head.held = head.pinned = False
                self._report.forced_flushes += 1
            queue.popleft()
            self._weight -= head.weight
            head.drained = True
            if not head.dropped:
                yield head

    def finish(self) -> Iterator[Slot]:
        for slot in self._queue:
            slot.held = slot.pinned = False
        yield from self.ready()

    def __len__(self) -> int:
        return len(self._queue)


def count_output(report: SessionReport, record: Mapping[str, Any], by: int = 1) -> None:
    """Tally one record as it leaves the parser (what the report's message counts mean); ``by=-1`` takes
    back the tally of a record the writer then left out (:func:`uncount_output`)."""
    if record.get("type") == "compaction":
        report.compactions += by
        return
    if record.get("type") != "message":  # a pi-host export's tombstone of a content-free message
        return
    role = str(record.get("role"))
    report.messages[role] += by
    if report.messages[role] <= 0:
        del report.messages[role]
    meta = record.get("meta")
    if isinstance(meta, Mapping) and (meta.get("parentToolCallId") or meta.get("agentName")):
        report.attributed += by
    for block in record.get("blocks") or ():
        kind = block.get("type")
        if kind == "thinking":
            report.thinking_blocks += by


def uncount_output(report: SessionReport, record: Mapping[str, Any]) -> None:
    """Take back the tally of a record the transcript writer could not write (left out, counted in
    ``skippedBlocks``): the report's message counts say what the session holds."""
    count_output(report, record, by=-1)


def attachment_tally(record: Mapping[str, Any]) -> int:
    """The attachment blocks one transcript line holds: a message's, those in a tool call's result included. The
    import writer sums them over the last line of each id it writes, as :func:`tool_tally`: the report's
    ``attachments`` say what the session holds, once, not what the importer read (a line converted and left out,
    a message written again)."""
    if record.get("type") != "message":
        return 0
    n = 0
    for block in record.get("blocks") or ():
        if block.get("type") == "attachment":
            n += 1
        elif block.get("type") == "tool_call" and isinstance(block.get("result"), list):
            n += sum(isinstance(b, Mapping) and b.get("type") == "attachment" for b in block["result"])
    return n


def tool_tally(record: Mapping[str, Any]) -> tuple[int, int]:
    """``(tool calls, those with their result)`` one transcript line holds: its ``tool_call`` blocks, and those
    of them that carry a ``result``. A result the source holds without its call (``meta.orphanResult``, counted
    in ``orphanResults``) is neither. The import writer sums them over the lines it writes, the last line of each
    id (:func:`store.interchange.import_write._writable`): the report's ``toolCalls`` / ``toolResults`` say what
    the session holds, as ``messages`` does."""
    if record.get("type") != "message":
        return 0, 0
    meta = record.get("meta")
    if isinstance(meta, Mapping) and meta.get("orphanResult") is True:
        return 0, 0
    calls = results = 0
    for block in record.get("blocks") or ():
        if block.get("type") == "tool_call":
            calls += 1
            results += "result" in block
    return calls, results


@dataclass(frozen=True)
class Archived:
    """A pi-host export's archived regenerate/edit branches (seed 003 §4.9), ids namespaced as the messages'."""

    branches: list[dict[str, Any]]
    """``revision`` / ``revision_live`` records as the revisions file holds them, one per key, in key order."""
    active: dict[str, int]
    """Family root → the variant its live root's pager stamp names (``activeRevision``)."""
    artifacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Path → the export's artifact row (its ``artifact`` lines: ``{"path", "op", "turnId", "updatedAt"}``, the
    turn namespaced as the copy's turn rows; of one path the newest), which the copy's revisions file carries."""


@dataclass
class Parsed:
    """A parse in progress: ``records`` streams; ``meta`` and ``report`` are final once it is exhausted."""

    meta: SessionMeta
    report: SessionReport
    records: Iterator[dict[str, Any]]
    follows_branch: bool = False
    """The source is a tree whose current branch is the conversation (pi): a re-import converges on
    that branch (see :mod:`store.interchange.import_write`)."""
    source_ids: Callable[[], set[str]] | None = None
    """For a branch-following source: every message id the source's entries map to, on the branch
    or off it (known once ``records`` is exhausted)."""
    off_branch: Callable[[], Iterator[tuple[str, list[dict[str, Any]]]]] | None = None
    """For a branch-following source: each branch the source holds off its current one, as
    ``(leaf key, the records of the path from the root to that leaf)`` (callable once ``records`` is
    exhausted); :mod:`store.interchange.import_write` keeps them in the revisions store."""
    archived: Callable[[], Archived] | None = None
    carried_turns: Callable[[], list[dict[str, Any]]] | None = None
    """For a pi-host export: the turns it carried (``turn`` lines: the first host's usage), ids namespaced;
    :mod:`store.interchange.import_write` records them as the copy's turn rows."""
    """For a pi-host export: the session's archived branches as its revisions file held them (callable once
    ``records`` is exhausted); :mod:`store.interchange.import_write` writes them under the same keys."""


def finalize(slots: Iterator[Slot], report: SessionReport, limits: ImportLimits) -> Iterator[dict[str, Any]]:
    """Check and count every record leaving a parser; refuse a session past the message limit."""
    for slot in slots:
        record = check_record(slot.record)
        _normalize_usage(report.source, record)
        if not slot.replacement:
            count_output(report, record)
            if record.get("type") == "message" and sum(report.messages.values()) > limits.max_messages:
                raise Refused("TOO_MANY_MESSAGES", f"more than {limits.max_messages} messages in one session")
        yield record


def _normalize_usage(source: str, record: dict[str, Any]) -> None:
    """``meta.usage`` in the one shape of :mod:`.usage_shape`; the tool's own report kept as ``usageRaw``."""
    meta = record.get("meta")
    if record.get("type") != "message" or not isinstance(meta, Mapping):
        return
    raw, earlier = meta.get("usage"), meta.get("usageRaw")
    if not isinstance(raw, Mapping):
        return
    if isinstance(earlier, Mapping) and raw == normalize_usage(source, earlier, cost=meta.get("cost")):
        return  # already normalised (a replacement line of a record that left before)
    usage = normalize_usage(source, raw, cost=meta.get("cost"))
    if usage is not None:
        record["meta"] = {**meta, "usage": usage, "usageRaw": raw}


def check_record(record: dict[str, Any]) -> dict[str, Any]:
    """The structural rules a record leaving an importer must meet (cheap, by construction)."""
    if record.get("type") == "message":
        blocks = record["blocks"]
        if len(blocks) > MAX_BLOCKS:
            del blocks[MAX_BLOCKS:]
        assert WIRE_ID_RE.fullmatch(record["id"]) and record["role"] in ROLES
    return record
