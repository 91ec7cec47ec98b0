"""Writing an imported session: transcript first, one index transaction second (seed 003 §5, §4.5).

(:mod:`store.interchange.imports` decides what an import must do and calls these steps.)

For each session an importer yields, in order:

1. **stage** (file I/O, no database writes): the records stream into a new
   transcript ``<sid>.jsonl.tmp.<hex>`` (header, the records, a
   ``session_info`` line with the title, project path and ``source``) — or, for
   a session imported before, only the records that are new or whose line
   differs from the one the transcript holds (same id → readers keep the last
   line in place) go to a staging file. Nothing is visible yet; a refusal or a
   crash leaves only a temp file that boot sweeps.
2. **publish**: the new transcript is hard-linked to ``<sid>.jsonl`` (never
   over an existing file) and the directory fsynced; staged lines are appended
   with one write loop and one ``fdatasync``.
   A branch-following source (pi) also hands over the branches off its current one: they become
   full ``revision`` lines kept in memory (:func:`_archive_off_branch`), the branch on its current
   one a ``revision_live`` reference whose root line gets the pager stamp as a same-id replacement
   line in the staging file (:func:`_stamp_families`); the revision lines are appended to
   ``<sid>.revisions.jsonl`` after the transcript at publish and cut back by undo.
3. **index** (one transaction, the caller's): the session row (``source``,
   title, project upserted from the cwd by normalized path, created/updated
   times of the conversation), the index rows of exactly the lines written
   (streamed back from the file in batches), the attachment refs, and the
   ``session_import_origins`` row holding the source files' fingerprints and
   the historical values (model, provider, cwd) that never become bindings; the
   ``message_revisions`` rows and usage turn rows of the archived branches.
4. **undo** on any failure after publish: the new transcript is removed, or
   the appended bytes are truncated away — never a half-imported session.

A keyed ``import.sessions`` request (a ``submissionId``) ends each session's write with an
``import_receipt`` line: its receipt record and its answer for the session (:func:`answer_of`: the status
and the counts of what the write did). The index step keeps both in the origin row (``lastImport``;
reconcile puts them there from the line when a kill took that step), so the same request's retry finds the
write as its own and answers it as the first try would have, where it would otherwise find every line held
and answer ``unchanged`` (``store.interchange.imports.prepare_unit``).

A re-import whose source files are byte-identical to the fingerprints in the
origin row (or, for opencode, whose session rows/files digest to the same
``contentFingerprint``) is ``unchanged`` without parsing. A parse that finds
nothing new removes its staging file at once: no outcome leaves a temp file. A grown file is parsed again and
only its new lines (plus replacements of records that changed, e.g. a tool call
whose result arrived) are appended; the turn rows the held lines' usage lacks and the model they name are
recorded too (an import killed between its write and its commit left its lines to boot, which indexes only
their messages: the retry holds every line and writes none). The staging file and ``<sid>.jsonl`` are
owned by the session's actor in a running host: stage/publish/undo of an
existing session must run there (the DB step in the DB writer).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from store import artifacts, attachments, thread_meta, turns
from store.attachments import AttachmentFiles
from store.config.settings_rules import THINKING_LEVELS
from store.errors import Conflict, InvalidInput, StoreError, classify_os_error
from store.faults import NO_FAULTS, Faults
from store.fsutil import TEMP_MARKER, fsync_dir, open_nofollow, remove_file_durable, write_all
from store.ids import validate_session_id
from store.indexing import index
from store.interchange.importers import parse
from store.interchange.importers.common import (
    DEFAULT_LIMITS,
    Archived,
    BlobRef,
    BlobSink,
    ImportLimits,
    ParseContext,
    Parsed,
    Refused,
    SessionMeta,
    SessionReport,
    SourceUnit,
    attachment_tally,
    join_id,
    stamp,
    tool_tally,
    uncount_output,
)
from store.interchange.importers.reader import LineReader
from store.jsonio import dumps_line, loads_line
from store.review import StagedSnapshots
from store.revisions import (
    PAGER_KEYS,
    REVISION_LIVE,
    ROOTS,
    RevisionEntry,
    RevisionFile,
    append_revision_lines,
    artifact_line,
    entry_of_line,
    find_root,
    hidden_by_import,
    payload_digest,
    read_revisions,
    revision_line,
    revision_live_line,
    set_active,
    stamp_of,
    upsert_row,
    with_stamp,
)
from store.tombstones import TOMBSTONE, tombstone_line
from store.transcripts.records import Root, rfc3339_to_ms, root_line, root_named
from store.transcripts.transcript import IMPORT_RECEIPT, header_line, read_transcript

__all__ = [
    "ANSWER_FIELDS",
    "HOST_IMPORTER",
    "IMPORT_RULES",
    "ImportTarget",
    "Spans",
    "StagedImport",
    "answer_of",
    "apply_answer",
    "apply_index",
    "carries_usage",
    "import_receipt_line",
    "named_model",
    "publish",
    "record_compaction_usage",
    "record_usage",
    "stage",
    "stage_parsed",
    "undo",
    "upsert_origin",
    "valid_answer",
]

IMPORT_RULES = 23
"""Version of what an import makes of a source (kept in the origin row as ``importRules``). A session
imported under older rules is parsed again even when its files are unchanged: 2 = a branch-following
source's visibility converges on its current branch (issue 23); an older import may have hidden
messages that are on the branch. 3 = usage in one shape with the raw report beside it, one turn row
per response with usage (counted by ``usage.*``), Claude Code subagent rows at their time position.
4 = Codex: one assistant message per model response (a reply after the previous response's usage report
starts a new one), ``<subagent_notification>`` items are system notices, ``cache_write_input_tokens`` are
cache writes, not input; Claude Code: a ``<task-notification>`` user line (``origin.kind``) is a system
notice, a compaction's request usage (``cost-state`` growth) is on its checkpoint (found by
``scripts/fidelity``). 5 = pi and opencode replies that only call tools keep their usage (on the first
call), opencode's summarizing response is counted, its synthetic text is marked and a pending revert is
followed; a source's new title (pi's session_info) renames a session the user did not rename. 6 = a Codex
``spawn_agent`` thread and an opencode ``task`` child session are linked to the spawning call: the parent's
call record holds ``meta.childSessionId``, the child's origin ``spawnedBy`` (parent session, call, agent). 7 = pi:
the branches off the file's current one are kept in the revisions store and their responses counted by
``usage.*`` (usage over the whole file, as pi's footer); a checkpoint on a hidden branch is hidden with it.
8 = pi: each family of branches looks as the host's regenerate leaves it: the branch on the file's current
branch is a variant too (a ``revision_live`` reference, ``is_active``), the root's line carries the pager
stamp (``revisionCount``/``activeRevision``), a reference whose branch the file left is stored in full, and
a branch that starts with pi's branch summary belongs to the user turn before it (restorable); Codex: a
spawned thread's prompt from its parent agent carries ``meta.fromAgent``. 9 = Codex: a web search's
results (the ``web_search_end`` event) are the sources of its ``hostedSearch`` round. 10 = Claude Code:
a rewound file's transcript is the branch Claude Code shows (the newest conversation line's), its
abandoned branches are kept in the revisions store as pi's are (it imported every line in file order). 11 =
Claude Code: a subagent file's rows follow the branch of the ``Task`` call that started it (a rewound file
kept them live when the call was on an abandoned branch); pi: an entry pi appended behind a torn line (a crash,
then a resume) is read, so the turns after it are shown instead of a fallback to the branch before it; Claude
Code: a response's usage is its last line's report (each line repeats the report as it stood when that block was
written; the first line's was kept once the record was written, e.g. 3 of a response's 993 output tokens). 12 =
Claude Code: a line that repeats an earlier line of its ``uuid`` word for word is that message written again (shown
once, as Claude Code does; it was a second message ``<uuid>@<offset>``, and a rewound file holding one imported
every branch live); a re-import of a rewound file hides such a copy an earlier import made. 13 = Claude Code: a
line that writes an earlier line's ``uuid`` again saying something else (same ``type``, main transcript) is that
message too, the last line written at the first one's place (Claude Code's loader keeps a map by uuid: the last line
set); it was a second message ``<uuid>@<offset>`` after the rest, and a rewound file holding one imported every
branch live. A re-import hides such a copy an earlier import made. 14 = Claude Code: so is such a line of an
inline sidechain (1.x), of a subagent file (Claude Code loads an agent's file by the same map by uuid) and of a main
transcript imported in file order past a bound of its tree (too many records or branches) or with an untrusted
tree; each was still a second message ``<uuid>@<offset>``. A re-import hides such a copy an earlier import made.
15 = Claude Code: a subagent file's line under the uuid of a main-transcript line (a forked agent's copy of the
conversation it forked) is not converted: it took the main line's id and, written later, replaced it as a row of the
subagent; a re-import gives the main transcript's line back. 16 = Claude Code: a prompt typed while the agent worked
(a ``queued_command`` attachment line, which has no ``user`` line) is a ``user`` message; it was counted as a skipped
attachment. 17 = a source line holding bytes that are not UTF-8 is read with U+FFFD in their place (as the
tools' own loaders read it; counted as ``repairedLines``); it was a bad line, its message missing (and in a pi file the
turns after it moved off the transcript: their parent was missing). 18 = Codex: an image the model made
(``image_generation_call``) is an image attachment of its response's assistant message; it was counted as skipped.
19 = what a person saw in the other tool and an import dropped is kept: Codex ``error``, ``turn_aborted`` and
``exited_review_mode`` (a review's findings) events are ``system`` notices (``meta.importedKind`` ``codex/<event>``,
the findings also as ``meta.review``); they were counted as skipped events. Claude Code ``system`` lines holding
an ``error`` (``api_error``: a failed request, a retry under way; ``error``) are ``system`` notices with the error's
text and ``meta.error``; they were counted as skipped. A Claude Code tool call's ``toolUseResult`` (an edit's patch
and original file, a command's output streams) is its tool record's ``meta.toolUseResult`` (strings of one past
256 KiB cut and counted); only the text the model saw was kept. The git state a source recorded (Claude Code's
``gitBranch`` on every line, Codex's ``session_meta.git``) is the origin history's ``git``, served as
``historyGit``; it was dropped. A pi ``label`` entry (a bookmark) is a ``system`` notice with ``meta.label`` and
``meta.targetMessageId``; it was counted as skipped. A Claude Code user line's ``permissionMode`` and ``todos``, when
they differ from the line before, are the meta of the message the line becomes; they were dropped. A Claude Code
``document`` block (a PDF, a text file; in a prompt or a tool result) is a file attachment, its bytes a blob; it was
counted as skipped. 20 = Claude Code: a ``toolUseResult`` past 256 KiB is kept whole as well, a JSON blob that the tool
record's ``meta.toolUseResultBlob`` references (the cut ``meta.toolUseResult`` its preview); the rest was dropped.
21 = Claude Code: a ``permission-mode`` line's mode is the ``meta.permissionMode`` of the next user line's message
when that line names no mode of its own; it was counted as skipped. 22 = Claude Code: a ``stop_hook_summary`` saying a
Stop hook failed (``hookErrors``) or stopped the agent (``preventedContinuation``) is a ``system`` notice
(``system/stop_hook_summary``); it was counted as skipped. 23 = Claude Code: an ``attachment`` line of a hook that
failed (``hook_non_blocking_error``, ``hook_blocking_error``) is a ``system`` notice (``attachment/<type>``); it was
counted as skipped."""

HOST_IMPORTER = ""
"""``session_import_origins.plugin_id`` of the host's own importers (no plugin id is empty)."""
INDEX_BATCH = 512
NO_ROOT = Root(None)
"""A session without a project root (``records.Root``)."""
MAX_TRACKED_NEW = 1_000_000
"""New message ids a re-import remembers for :func:`_converge_branch` (a bounded list)."""
_WRITE_BUFFER = 1 << 20

Spans = Callable[[Sequence[str]], Mapping[str, tuple[int, int]]]


@dataclass(frozen=True)
class ImportTarget:
    """Where imported sessions go (configuration, passed in)."""

    sessions_dir: Path
    attachments: AttachmentFiles | None = None
    limits: ImportLimits = DEFAULT_LIMITS
    faults: Faults = field(default_factory=lambda: NO_FAULTS)
    review_root: Path | None = None
    """``review-changes/``: where a pi-host export's review snapshots go (None: verified, not stored)."""

    def transcript(self, session_id: str) -> Path:
        return self.sessions_dir / f"{validate_session_id(session_id)}.jsonl"

    def revisions(self, session_id: str) -> Path:
        """The session's revisions store (seed 003 §4.9), where a source's abandoned branches go."""
        return self.sessions_dir / f"{validate_session_id(session_id)}.revisions.jsonl"


@dataclass
class StagedImport:
    session_id: str
    report: SessionReport
    meta: SessionMeta
    kind: str
    """``new`` | ``append``."""
    transcript: Path
    temp: Path | None = None
    epoch: str | None = None
    pre_length: int = 0
    """Transcript length before the append (0 for a new transcript)."""
    body_start: int = 0
    """Offset of the first written line in the published transcript."""
    body_end: int = 0
    """Offset just past the last written record line."""
    file_end: int = 0
    """Length of the published transcript (a new one ends with its session_info line)."""
    blobs: list[tuple[BlobRef, str]] = field(default_factory=list)
    carried_blobs: list[BlobRef] = field(default_factory=list)
    """Blobs a pi-host export carried, verified and stored (:mod:`store.interchange.importers.carried`)."""
    lost_blobs: list[str] = field(default_factory=list)
    """Blobs the written blocks refer to whose bytes are neither carried nor here: recorded evicted."""
    earlier: dict[str, list[list[Any]]] = field(default_factory=dict)
    """Per source file: ``[consumed, sha256]`` of what earlier imports read from it, each a strict byte prefix of
    what this one read (the origin's ``files.<path>.earlier``; see ``store.interchange.imports.earlier_states``)."""
    identity: tuple[int, int] | None = None
    published: bool = False
    plugin_id: str = HOST_IMPORTER
    project_id: int | None = None
    """A plugin import's explicit, host-created project (host imports bind ``meta.cwd`` instead)."""
    history_model: tuple[str | None, str] | None = None
    """(provider, model) of the last written message that names one (kept in the origin history)."""
    source_model: tuple[str | None, str] | None = None
    """A re-import's: (provider, model) of the last message the source gives that names one, whether its line
    is written or already held (what the history names when the written lines name none)."""
    held_usage: list[tuple[str, tuple[int, int]]] = field(default_factory=list)
    """A re-import's: ``(id, line span)`` of the line the transcript already holds for each record the source
    gives that carries a response's or checkpoint's usage (its turn row is recorded if the index lacks it:
    see :func:`_record_held_usage`)."""
    project_path: str | None = None
    receipt: Mapping[str, Any] | None = None
    """The receipt record of the request that writes a new transcript (a plugin import's), carried in its
    header as ``session.create`` carries its own."""
    import_receipt: Mapping[str, Any] | None = None
    """The receipt record of a keyed ``import.sessions`` request: its write ends with an ``import_receipt``
    line naming it and :attr:`answer` (see :func:`answer_of`)."""
    prior: Mapping[str, Any] | None = None
    """The answer the same request recorded for this session on an earlier try (a retry after a crash)."""
    answer: dict[str, Any] | None = None
    """A keyed import's answer for this session (:data:`ANSWER_FIELDS`): this write's, or, on a retry, the
    earlier try's (with what this one adds). The report takes it (``store.interchange.imports``)."""
    imported_ms: int | None = None
    """When a plugin's import commits (its origin row's ``created_at``), carried in the session_info line."""
    revisions: Path | None = None
    revision_lines: list[bytes] = field(default_factory=list)
    """Full ``revision`` lines of the source's abandoned branches this import adds (see
    :func:`_archive_off_branch`), appended to ``revisions`` by :func:`publish`."""
    revision_rows: list[tuple[str, int, int]] = field(default_factory=list)
    """``(rootUserId, revisionIndex, messageCount)`` of each line: its ``message_revisions`` row."""
    revision_records: list[dict[str, Any]] = field(default_factory=list)
    """The messages of those branches that carry a response's usage (counted like the transcript's)."""
    revision_active: list[tuple[str, int]] = field(default_factory=list)
    """``(rootUserId, revisionIndex)`` of each family whose root is on the source's current branch: the
    variant that branch is (``is_active``; see :func:`_stamp_families`)."""
    revision_created: dict[tuple[str, int], int] = field(default_factory=dict)
    """A pi-host export's archived branches: when each was archived (its line's ``createdAt``), its row's
    ``created_at`` (as a rebuilt index gives it: ``store.revisions.rows_from_file``); others get the import's time."""
    carried_artifacts: list[dict[str, Any]] = field(default_factory=list)
    """A pi-host export's artifact rows (``artifact`` lines, turns namespaced): restored by :func:`apply_index`,
    those the copy's revisions file does not carry yet also appended there (:func:`_carry_artifacts`)."""
    carried_turns: list[dict[str, Any]] = field(default_factory=list)
    """A pi-host export's turns (``turn`` lines, ids namespaced): the copy's turn rows (:func:`apply_index`)."""
    revisions_pre: int | None = None
    """Length of the revisions file before :func:`publish` appended (None: nothing appended)."""
    revisions_end: int = 0
    reviews: StagedSnapshots | None = None
    """The review snapshots a pi-host export carried in, staged until :func:`publish`."""

    @property
    def has_writes(self) -> bool:
        """Anything to publish: transcript lines, revision lines or staged review snapshots."""
        return self.body_end > self.body_start or bool(self.revision_lines) or bool(
            self.reviews is not None and self.reviews.staged)


# --------------------------------------------------------------------------- a keyed import's answer


ANSWER_FIELDS = {"newRecords": "new_records", "newMessages": "new_messages", "replacedRecords": "replaced_records",
                 "unchangedRecords": "unchanged_records", "appendedBytes": "appended_bytes",
                 "hiddenOffBranch": "hidden_off_branch", "restoredOnBranch": "restored_on_branch",
                 "archivedBranches": "archived_branches"}
"""The counts of a session's report that say what its write did (the rest say what the source holds: a
retry that parses the same source finds them again), with ``status`` and ``olderCopy`` the answer a keyed
import records for each session it writes."""
_ADDED = ("newRecords", "newMessages", "replacedRecords", "appendedBytes", "hiddenOffBranch", "restoredOnBranch",
          "archivedBranches")


def answer_of(staged: StagedImport, prior: Mapping[str, Any] | None) -> dict[str, Any]:
    """A keyed import's answer for the session it staged (``staged.body_end`` set).

    Without ``prior``: this write's status and counts. With ``prior`` (the answer the same request recorded
    for the session on an earlier try that wrote it and then died, or failed before its receipt committed):
    that answer when this try writes no transcript line (the session holds what the earlier try wrote, so
    this one finds it all held; revision lines it writes are those the earlier try staged and counted, then
    died before appending), else that answer plus what this try adds (the source changed between the
    tries)."""
    r = staged.report
    mine: dict[str, Any] = {"status": "new" if staged.kind == "new" else ("updated" if staged.has_writes
                                                                           else "unchanged")}
    mine.update({key: getattr(r, attr) for key, attr in ANSWER_FIELDS.items()})
    mine["appendedBytes"] = staged.body_end - staged.body_start
    mine["olderCopy"] = r.older_copy
    if prior is None:
        return mine
    if staged.body_end == staged.body_start:
        return dict(prior)
    out = dict(prior)
    for key in _ADDED:
        out[key] = prior[key] + mine[key]
    out["olderCopy"] = prior["olderCopy"] or mine["olderCopy"]
    return out


def valid_answer(value: object) -> dict[str, Any] | None:
    """``value`` if it is an answer :func:`answer_of` made for a write (as read back from a file or a row)."""
    if not isinstance(value, Mapping) or value.get("status") not in ("new", "updated"):
        return None
    for key in ANSWER_FIELDS:
        n = value.get(key)
        if type(n) is not int or n < 0:
            return None
    if type(value.get("olderCopy")) is not bool:
        return None
    return {"status": value["status"], **{key: value[key] for key in ANSWER_FIELDS}, "olderCopy": value["olderCopy"]}


def apply_answer(report: SessionReport, answer: Mapping[str, Any]) -> None:
    """Put a keyed import's answer (:func:`answer_of`) into the session's report (not its status)."""
    for key, attr in ANSWER_FIELDS.items():
        setattr(report, attr, answer[key])
    report.older_copy = answer["olderCopy"]


def import_receipt_line(receipt: Mapping[str, Any], answer: Mapping[str, Any]) -> bytes:
    """The line that ends a keyed import's write of a session (``IMPORT_RECEIPT``): whose write it is and
    what that request answers for the session."""
    return dumps_line({"type": IMPORT_RECEIPT, "receipt": dict(receipt), "answer": dict(answer)})


# --------------------------------------------------------------------------- stage


class _Out:
    """Buffered writer of transcript lines to a new file (O_EXCL, 0600), tracking its length."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600) if path is not None else None
        if self.fd is not None:
            os.fchmod(self.fd, 0o600)
        self.buf: list[bytes] = []
        self.buffered = 0
        self.length = 0

    def write(self, line: bytes) -> None:
        self.length += len(line)
        if self.fd is None:
            return
        self.buf.append(line)
        self.buffered += len(line)
        if self.buffered >= _WRITE_BUFFER:
            self.flush()

    def flush(self) -> None:
        if self.fd is not None and self.buf:
            write_all(self.fd, b"".join(self.buf))
        self.buf, self.buffered = [], 0

    def close(self, *, sync: bool) -> tuple[int, int] | None:
        if self.fd is None:
            return None
        try:
            self.flush()
            if sync:
                os.fsync(self.fd)
            st = os.fstat(self.fd)
            return st.st_dev, st.st_ino
        finally:
            os.close(self.fd)
            self.fd = None


def _temp_name(transcript: Path, tag: str) -> Path:
    return transcript.with_name(f"{transcript.name}{tag}{TEMP_MARKER}{secrets.token_hex(6)}")


def origin_record(staged: StagedImport) -> dict[str, Any]:
    """Who imported the session and from where (also in the session_info line: survives an index rebuild).

    A plugin's import is written once, whole (never re-imported): its line carries the whole origin row as
    the commit writes it (``history``: the row's ``origin_json``; ``importedAt``: its ``created_at``), so a
    crash between the link and the commit leaves boot what it needs to rebuild that row unchanged."""
    meta = staged.meta
    rec: dict[str, Any] = {"pluginId": staged.plugin_id, "sourceId": meta.source, "externalId": meta.external_id,
                           "label": meta.label or meta.source, "history": {"projectPath": meta.cwd, **meta.history}}
    if staged.plugin_id != HOST_IMPORTER:
        rec["history"] = _origin_history(staged)
        if staged.imported_ms is not None:
            rec["importedAt"] = staged.imported_ms
    return rec


def carried_settings(meta: SessionMeta) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(settings, thread metadata) a new copy of a pi-host export takes from it (``SessionMeta.carried``): its
    thinking level and its thread's tags, folder, preset, archive flag and parent; each left out when it does
    not validate. Written into the new session's ``session_info`` line too, so a rebuilt index keeps them."""
    level = meta.carried.get("thinkingLevel")
    settings = {"thinkingLevel": level} if level in THINKING_LEVELS else {}
    raw = meta.carried.get("thread")
    thread = None
    if isinstance(raw, Mapping):
        try:
            thread = thread_meta.normalize(raw)
        except InvalidInput:
            thread = None
    return settings, None if thread is None or thread_meta.is_empty(thread) else thread


def _session_info(staged: StagedImport) -> bytes:
    meta = staged.meta
    rec: dict[str, Any] = {"type": "session_info", "title": meta.title}
    bound = staged.project_path if staged.plugin_id != HOST_IMPORTER else meta.cwd
    if bound:
        rec["projectPath"] = bound
    settings, thread = carried_settings(meta)
    rec.update(settings)
    if thread is not None:
        rec["thread"] = thread
    rec["source"] = meta.source
    rec["importOrigin"] = origin_record(staged)
    rec["updatedAt"] = stamp(meta.updated_ms)
    return dumps_line(rec)


def _old_line(fd: int, span: tuple[int, int]) -> bytes:
    offset, length = span
    data = os.pread(fd, length, offset)
    while len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def stage(
    unit: SourceUnit,
    target: ImportTarget,
    *,
    spans: Spans | None,
    dry_run: bool = False,
    created_ms: Callable[[], int] | None = None,
    known_ids: Callable[[], Iterable[tuple[str, bool]]] | None = None,
    known_compactions: Callable[[], Iterable[str]] | None = None,
    import_receipt: Mapping[str, Any] | None = None,
    prior: Mapping[str, Any] | None = None,
    consumed_before: Mapping[str, int] | None = None,
    blob_budget: int = attachments.DEFAULT_BUDGET_BYTES,
    workspace: str | None = None,
) -> StagedImport:
    """Parse ``unit`` and write what must be written to a temp file (see the module doc).

    ``spans`` is None for a session the index does not know (a new transcript),
    else the lookup of the lines the transcript already holds; ``known_ids``
    lists the session's message ids with their ``deleted`` flag (for a source
    that follows a branch, visibility converges on it: see :func:`_converge_branch`) and
    ``known_compactions`` the ids of its checkpoints the index serves. Raises
    :class:`Refused` (nothing left behind, ``exc.report`` set) or a
    :class:`StoreError` for I/O. ``import_receipt``: a keyed request's receipt record, ``prior``: the answer
    it recorded for this session before (see :func:`answer_of`). ``consumed_before``: per source file, the
    offset the last import consumed to, whose prefix digest the parse keeps (:attr:`ParseContext.consumed_before`).
    ``blob_budget``: the attachment budget, the largest blob a pi-host export may carry in. ``workspace``: a
    re-import's, the copy's workspace root (a carried review snapshot is re-rooted on it; a new copy's is the
    export's ``projectPath``). The review snapshots an export carries are staged (:class:`StagedSnapshots`),
    published by :func:`publish`, removed by :func:`undo` or at once when the import is refused here.
    """
    sink = BlobSink(target.attachments.put_bytes_kept if target.attachments is not None and not dry_run else None,
                    files=target.attachments if not dry_run else None, max_carried_bytes=blob_budget)
    reviews = StagedSnapshots(target.review_root / validate_session_id(unit.session_id)) \
        if target.review_root is not None and not dry_run else None
    try:
        parsed = parse(unit, ParseContext(target.limits, sink, consumed_before or {}, reviews=reviews,
                                          workspace=workspace))
        staged = stage_parsed(parsed, unit.session_id, target, sink=sink, spans=spans, dry_run=dry_run,
                              created_ms=created_ms, known_ids=known_ids, known_compactions=known_compactions,
                              import_receipt=import_receipt, prior=prior,
                              root=root_named({"projectPath": workspace or None}))
    except BaseException:
        if reviews is not None:  # refused or failed: the snapshots it staged go at once
            reviews.discard()
        raise
    staged.reviews = reviews
    return staged


def stage_parsed(
    parsed: Parsed,
    session_id: str,
    target: ImportTarget,
    *,
    sink: BlobSink,
    spans: Spans | None,
    dry_run: bool = False,
    created_ms: Callable[[], int] | None = None,
    known_ids: Callable[[], Iterable[tuple[str, bool]]] | None = None,
    known_compactions: Callable[[], Iterable[str]] | None = None,
    plugin_id: str = HOST_IMPORTER,
    project: tuple[int, str] | None = None,
    receipt: Mapping[str, Any] | None = None,
    imported_ms: int | None = None,
    import_receipt: Mapping[str, Any] | None = None,
    prior: Mapping[str, Any] | None = None,
    root: Root | None = None,
) -> StagedImport:
    """:func:`stage` for records from any producer (an importer, a plugin's messages). ``receipt`` and
    ``imported_ms``: a plugin import's (see :class:`StagedImport`). ``root``: a re-import's, the session's
    root now (the one its transcript's lines leave in effect; :func:`_write_changes`)."""
    try:
        return _stage(parsed, session_id, target, sink, spans=spans, dry_run=dry_run, created_ms=created_ms,
                      known_ids=known_ids, known_compactions=known_compactions, plugin_id=plugin_id,
                      project=project, receipt=receipt, imported_ms=imported_ms,
                      import_receipt=None if dry_run else import_receipt, prior=prior, root=root)
    except Refused as exc:
        exc.report = parsed.report.refuse(exc.code, exc.message)
        raise


def _stage(parsed: Parsed, sid: str, target: ImportTarget, sink: BlobSink, *, spans: Spans | None, dry_run: bool,
           created_ms: Callable[[], int] | None, known_ids: Callable[[], Iterable[tuple[str, bool]]] | None,
           known_compactions: Callable[[], Iterable[str]] | None, plugin_id: str,
           project: tuple[int, str] | None, receipt: Mapping[str, Any] | None = None,
           imported_ms: int | None = None, import_receipt: Mapping[str, Any] | None = None,
           prior: Mapping[str, Any] | None = None, root: Root | None = None) -> StagedImport:
    transcript = target.transcript(sid)
    kind = "new" if spans is None else "append"
    temp = None if dry_run else _temp_name(transcript, "" if kind == "new" else ".import")
    try:
        out = _Out(temp)
    except OSError as exc:
        raise classify_os_error(exc, f"create {temp}") from exc
    staged = StagedImport(sid, parsed.report, parsed.meta, kind, transcript, temp, plugin_id=plugin_id,
                          project_id=project[0] if project else None, project_path=project[1] if project else None,
                          receipt=receipt, imported_ms=imported_ms, revisions=target.revisions(sid),
                          import_receipt=import_receipt, prior=prior)
    live = _LiveOrder()
    ok = False
    try:
        records = _writable(parsed.records, staged.report)
        if parsed.off_branch is not None:
            records = live.tap(records)
        if kind == "new":
            _write_new(records, out, staged, created_ms)
        else:
            assert spans is not None
            follows = parsed.follows_branch
            _write_changes(records, out, staged, spans, known_ids if follows else None, parsed.source_ids,
                           known_compactions if follows else None, root=root or NO_ROOT)
        if parsed.off_branch is not None and not staged.report.older_copy:
            old = _OldLive(staged)
            families = _archive_off_branch(parsed.off_branch, staged, live, old)
            _stamp_families(families, staged, live, old, out, spans,
                            parsed.source_ids() if parsed.source_ids is not None else None)
        if parsed.archived is not None and not staged.report.older_copy:
            _carry_archived(parsed.archived(), staged)
        if parsed.carried_turns is not None:
            staged.carried_turns = parsed.carried_turns()
        if kind == "new":
            staged.body_end = out.length
            out.write(_session_info(staged))
        else:
            staged.body_end = staged.pre_length + out.length
        if import_receipt is not None:
            staged.answer = answer_of(staged, prior)
            # the request's receipt rides with its write (ARCHITECTURE.md), once: a retry that only appends the
            # revision lines its first try counted and did not append has nothing new to say
            if staged.body_end > staged.body_start or (prior is None and staged.revision_lines):
                out.write(import_receipt_line(import_receipt, staged.answer))
        staged.file_end = out.length if kind == "new" else staged.pre_length + out.length
        staged.identity = out.close(sync=kind == "new")
        staged.blobs = list(sink.stored)
        staged.carried_blobs, staged.lost_blobs = list(sink.carried), sorted(sink.lost)
        ok = True
    except OSError as exc:
        raise classify_os_error(exc, f"stage import of {sid}") from exc
    finally:
        if not ok:
            try:
                out.close(sync=False)
            except OSError:
                pass
            if temp is not None:
                _unlink(temp)
    if kind == "append":
        if out.length == 0 and temp is not None:  # nothing new: nothing to publish, no temp file left behind
            _unlink(temp)
            staged.temp = None
    return staged


def _write_new(records: Iterator[tuple[dict[str, Any], bytes]], out: _Out, staged: StagedImport,
               created_ms: Callable[[], int] | None) -> None:
    lead: list[tuple[dict[str, Any], bytes]] = []  # root lines before the first record (a pi-host export's)
    first = next(records, None)
    while first is not None and first[0].get("type") == "session_info":
        lead.append(first)
        first = next(records, None)
    if first is None:
        raise Refused("EMPTY_SESSION", "the session holds no messages")
    meta = staged.meta
    created = meta.created_ms if meta.created_ms is not None else (created_ms() if created_ms else 0)
    header, parsed_header = header_line(staged.session_id, created, receipt=staged.receipt)
    staged.epoch = parsed_header.epoch
    out.write(header)
    staged.body_start = len(header)
    count = messages = 0
    seen: set[tuple[Any, Any]] = set()  # (type, id) of every record written: a later line of one replaces it
    last: tuple[Any, Any] | None = None  # the last message's, in the order readers keep
    for record, line in itertools.chain(lead, (first,), records):
        out.write(line)
        if record.get("type") in (TOMBSTONE, "session_info"):  # a message's state, written with it, or the root
            continue  # the lines after it stand under (records.Root): not a record of its own
        key = (record.get("type"), record.get("id"))
        if key in seen:  # a record given more after it left the parser (a reply's usage): the same record, at
            staged.report.replaced_records += 1  # its first line's place (readers keep the last line's content)
            if key == last:
                staged.history_model = named_model(record) or staged.history_model
            continue
        seen.add(key)
        count += 1
        if record.get("type") == "message":
            messages += 1
            last = key
            # the model the written messages name last: apply_index finds the same one reading them back
            staged.history_model = named_model(record) or staged.history_model
    staged.report.new_records = count
    staged.report.new_messages = messages
    staged.body_end = out.length  # then the pager stamps, if any, and the session_info line (:func:`_stage`)


def _writable(records: Iterable[dict[str, Any]], report: SessionReport) -> Iterator[tuple[dict[str, Any], bytes]]:
    """Each record with its transcript line; one the writer cannot encode is left out and counted
    (``skippedBlocks["<type>(cannot be written)"]``), the session kept, as a line that is not JSON is: a
    source's value nested past the encoder's depth (orjson writes 254 levels and parses 1024; a tool's
    arguments, a database row, a line of an export) parses, and its importer builds the record from it. The
    line is the one written (no record is encoded twice), and a record left out is left out of the branch
    order too (:class:`_LiveOrder`), and out of the report's message counts (``messages`` by role,
    ``compactions``, ...: they say what the session holds) unless a line of the same id is written (a
    replacement line, which the counts never counted on its own). The report's ``tool_calls`` /
    ``tool_results`` are counted here, from the lines written (:func:`tool_tally` of each id's last line, the
    one readers keep): a call left out, or a second line of a call (its result, a repeat of the same call id),
    is what the session holds, once; so is ``attachments`` (:func:`attachment_tally`)."""
    written: set[tuple[Any, str]] = set()
    left_out: dict[tuple[Any, str], dict[str, Any]] = {}  # the first (the counted) record of an id left out
    tools: dict[tuple[Any, str], tuple[int, int]] = {}  # tool_tally of the last line written of an id holding calls
    attachments: dict[tuple[Any, str], int] = {}  # attachment_tally of the last line written of an id holding some
    for record in records:
        rid = record.get("id")
        key = (record.get("type"), rid) if isinstance(rid, str) else None
        try:
            line = dumps_line(record)
        except InvalidInput:
            report.skipped_blocks[f"{str(record.get('type'))[:40]}(cannot be written)"] += 1
            if key is not None and key not in written:
                left_out.setdefault(key, record)
            continue
        if key is not None:
            written.add(key)
            left_out.pop(key, None)
            tally = tool_tally(record)
            if tally != (0, 0) or key in tools:
                tools[key] = tally
            held = attachment_tally(record)
            if held or key in attachments:
                attachments[key] = held
        yield record, line
    for record in left_out.values():
        uncount_output(report, record)
    report.tool_calls = sum(calls for calls, _ in tools.values())
    report.tool_results = sum(results for _, results in tools.values())
    report.attachments = sum(attachments.values())


def _write_changes(records: Iterator[tuple[dict[str, Any], bytes]], out: _Out, staged: StagedImport, spans: Spans,
                   known_ids: Callable[[], Iterable[tuple[str, bool]]] | None,
                   source_ids: Callable[[], set[str]] | None = None,
                   known_compactions: Callable[[], Iterable[str]] | None = None, *,
                   root: Root = NO_ROOT) -> None:
    """Write only records whose line the transcript does not already hold, byte for byte.

    A source's root lines (a pi-host export's positional ``session_info`` lines) are not records: a message
    line written gets a root line before it when the root it stood under in the source is not the one in
    effect where it lands (``records.Root``; ``root``: the session's now, in effect at the transcript's end),
    and after the last one the session's root is named again if another is in effect, so the session's
    newest ``projectPath`` stays its own."""
    try:
        fd = open_nofollow(staged.transcript, os.O_RDONLY)
    except OSError as exc:
        raise classify_os_error(exc, f"read {staged.transcript}") from exc
    try:
        staged.pre_length = os.fstat(fd).st_size
        staged.body_start = staged.pre_length
        batch: list[tuple[dict[str, Any], bytes, Root | None]] = []
        batched = 0
        written: dict[str, bytes] = {}  # id -> digest of the line written for it (not the line: bounded)
        new_ids: list[str] = []
        new_compactions: list[str] = []
        # A held line the source now gives otherwise waits here until the stream ends: a later version of
        # the same record may follow (Codex attaches a turn's usage to its reply lines later), and only the
        # last one is compared with the held line. Written at once past _PENDING_BYTES.
        # id -> (its newest line, the held line, the root it stands under in the source)
        pending: dict[str, tuple[bytes, bytes, Root | None]] = {}
        pending_bytes = [0]
        fresh: list[str | None] = [None]  # the message this import wrote last as new (its tombstone follows it)
        in_effect = [root]  # the root the transcript's lines leave in effect where the next line lands

        def put(line: bytes, under: Root | None) -> None:
            if under is not None and under != in_effect[0]:
                out.write(dumps_line(root_line(under)))
                in_effect[0] = under
            out.write(line)

        def settle_pending() -> None:
            for rid, (line, held, under) in pending.items():
                if line == held:  # the stream came back to what the transcript holds
                    staged.report.unchanged_records += 1
                    continue
                staged.report.replaced_records += 1
                put(line, under)
                if len(written) < 100_000:
                    written[rid] = _line_digest(line)
            pending.clear()
            pending_bytes[0] = 0

        def flush() -> None:
            known = spans([r["id"] for r, _, _ in batch if r["id"] not in pending])
            for record, line, under in batch:
                rid = record["id"]
                under = under if record.get("type") == "message" else None
                if record.get("type") == TOMBSTONE:  # a message's, written with it only (a re-import leaves the
                    if record.get("messageId") == fresh[0]:  # copy's own restore of it standing)
                        out.write(line)
                    continue
                if rid in pending:
                    held = pending[rid][1]
                    if held != line and record.get("role") == "user":
                        line = _carry_stamp(record, held, line)
                    pending_bytes[0] += len(line) - len(pending[rid][0])
                    pending[rid] = (line, held, under)
                    continue
                if rid in written:
                    digest = _line_digest(line)
                    if written[rid] != digest:  # a later version of a record this import wrote: a line more
                        staged.report.replaced_records += 1
                        put(line, under)
                        written[rid] = digest
                    continue
                span = known.get(rid)
                if span is not None:
                    if carries_usage(record) and len(staged.held_usage) < MAX_TRACKED_NEW:
                        staged.held_usage.append((rid, span))
                    held = _old_line(fd, span)
                    if held != line and record.get("role") == "user":
                        line = _carry_stamp(record, held, line)
                    if held == line:
                        staged.report.unchanged_records += 1
                        continue
                    pending[rid] = (line, held, under)
                    pending_bytes[0] += len(line) + len(held)
                    if pending_bytes[0] > _PENDING_BYTES:
                        settle_pending()
                    continue
                staged.report.new_records += 1
                if record.get("type") == "message":
                    staged.report.new_messages += 1
                    fresh[0] = rid
                    if len(new_ids) < MAX_TRACKED_NEW:
                        new_ids.append(rid)
                elif record.get("type") == "compaction" and len(new_compactions) < MAX_TRACKED_NEW:
                    new_compactions.append(rid)  # new, or hidden before (a hidden checkpoint has no row)
                put(line, under)
                if len(written) < 100_000:
                    written[rid] = _line_digest(line)
            batch.clear()

        on_branch: set[str] | None = set() if known_ids is not None else None
        stream: Root | None = None  # the root the source's lines leave in effect (None: none named yet)
        for record, line in records:
            if record.get("type") == "session_info":  # a root line: written before a record it roots (put)
                stream = root_named(record) or stream
                continue
            batch.append((record, line, stream))
            if record.get("type") == "message":
                staged.source_model = named_model(record) or staged.source_model
            batched += len(line)
            if on_branch is not None and record.get("type") in ("message", "compaction"):
                on_branch.add(record["id"])
            if len(batch) >= INDEX_BATCH or batched >= _WRITE_BUFFER:
                flush()
                batched = 0
        flush()
        settle_pending()
        if in_effect[0] != root:  # the session's newest projectPath is its own
            out.write(dumps_line(root_line(root)))
        if known_ids is not None and on_branch is not None:
            _converge_branch(out, staged, on_branch, new_ids, known_ids, source_ids() if source_ids else None,
                             new_compactions, known_compactions)
    finally:
        os.close(fd)


_PENDING_BYTES = 16 << 20
"""Changed held lines (and their held copies) :func:`_write_changes` keeps back at most, in bytes."""


def _line_digest(line: bytes) -> bytes:
    """What :func:`_write_changes` remembers of a line it wrote: a serialized line holds an allocation
    several times its length, so keeping 100,000 of them took gigabytes on a re-import of a grown session."""
    return hashlib.blake2b(line, digest_size=16).digest()


def _converge_branch(out: _Out, staged: StagedImport, on_branch: set[str], new_ids: list[str],
                     known_ids: Callable[[], Iterable[tuple[str, bool]]], in_source: set[str] | None,
                     new_compactions: Sequence[str] = (),
                     known_compactions: Callable[[], Iterable[str]] | None = None) -> None:
    """Make the session show the source's current branch (pi), by tombstone lines only.

    The rule, for the messages and compaction checkpoints this source imported before (ids
    ``<sid>:...``; a message a host client added is never touched):

    * the source file lacks some of them (an older copy, a backup, a truncated file): what the
      session shows does not change. Nothing is hidden or restored, and messages of the copy the
      session never had (its branch when the copy was taken, which the newer file had left) are
      added but hidden like off-branch ones, so a later import restores them if they are on its branch;
    * else one that the file holds off its current branch and is visible is hidden
      (``<sid>:off-branch:...`` tombstone), and one that is on the branch but hidden *by an import*
      (its newest tombstone is such a line) is restored (``deleted: false``); a message the user
      deleted in the host stays deleted. A hidden checkpoint is not served (its index rows go: see
      :func:`store.indexing.index.set_deleted`); one that is on the branch again is written again
      (it has no row, so it reads as new) and restored.

    The branch the file left is kept whole in the revisions store (:func:`_archive_off_branch`).
    """
    sid = staged.session_id
    own = f"{sid}:"
    known = [(mid, deleted) for mid, deleted in known_ids() if mid.startswith(own)]
    when = staged.meta.updated_ms or 0

    def hide(mid: str) -> None:
        tid = join_id(sid, "off-branch", mid.rsplit(":", 1)[-1], when)
        out.write(tombstone_line(tid, mid, True, created_at_ms=when))

    if in_source is not None and any(mid not in in_source and mid not in on_branch for mid, _ in known):
        staged.report.older_copy = True
        for mid in new_ids:
            hide(mid)
            staged.report.hidden_off_branch += 1
        for cid in new_compactions:
            hide(cid)
        return
    to_restore = [mid for mid, deleted in known if deleted and mid in on_branch]
    wanted = set(to_restore) | set(new_compactions)
    hidden_by_import = _hidden_by_import(staged.transcript, staged.pre_length, sid, wanted) if wanted else set()
    for mid in [*to_restore, *new_compactions]:
        if mid in hidden_by_import:
            tid = join_id(sid, "on-branch", mid.rsplit(":", 1)[-1], when)
            out.write(tombstone_line(tid, mid, False, created_at_ms=when))
            staged.report.restored_on_branch += mid not in new_compactions
    for mid, deleted in known:
        if not deleted and mid not in on_branch:
            hide(mid)
            staged.report.hidden_off_branch += 1
    for cid in sorted(set(known_compactions()) if known_compactions is not None else ()):
        if cid.startswith(own) and cid not in on_branch:
            hide(cid)


class _LiveOrder:
    """The current branch as the records stream past: message ``(id, role)`` in order, checkpoint ids."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []
        self.compactions: set[str] = set()
        self._seen: set[str] = set()

    def tap(self, records: Iterator[tuple[dict[str, Any], bytes]]) -> Iterator[tuple[dict[str, Any], bytes]]:
        for record, line in records:
            rid = record.get("id")
            if isinstance(rid, str) and rid not in self._seen:  # a replacement line keeps the first position
                self._seen.add(rid)
                if record.get("type") == "message":
                    self.messages.append((rid, str(record.get("role"))))
                elif record.get("type") == "compaction":
                    self.compactions.add(rid)
            yield record, line


def _carry_stamp(record: Mapping[str, Any], held: bytes, line: bytes) -> bytes:
    """``record``'s line with the pager stamp the transcript's line for it holds (the stamp is the host's:
    a re-import neither strips it nor reads it as a change of the source)."""
    try:
        before = loads_line(held)
    except ValueError:
        return line
    meta = before.get("meta")
    stamp = {k: meta[k] for k in PAGER_KEYS if k in meta} if isinstance(meta, Mapping) else {}
    if not stamp:
        return line
    mine = record.get("meta")
    return dumps_line({**record, "meta": {**(mine if isinstance(mine, Mapping) else {}), **stamp}})


@dataclass
class _Variant:
    idx: int
    ids: list[str] | None
    """Message ids of a stored branch; None for a ``revision_live`` reference (the live branch)."""
    payload: list[bytes] | None


class _OldLive:
    """The transcript as it was before this import, read at most once and only when a ``revision_live``
    reference must be resolved (the source's current branch changed)."""

    def __init__(self, staged: StagedImport) -> None:
        self.staged = staged
        self._messages: list[dict[str, Any]] | None = None
        self.compactions: list[dict[str, Any]] = []

    def _load(self) -> list[dict[str, Any]]:
        if self._messages is None:
            self._messages = []
            if self.staged.kind == "append":
                t = read_transcript(self.staged.transcript)
                hidden = hidden_by_import(self.staged.session_id, {
                    mid: {"id": tomb.id, "deleted": tomb.deleted} for mid, tomb in t.tombstones.items()})
                # the branch a reference names is what was shown: not the other branches an import hid
                self._messages = [m.record for m in t.messages if m.id not in hidden]
                self.compactions = [dict(c.record) for c in t.compactions if c.record.get("id") not in hidden]
        return self._messages

    def switch_position(self, order: Sequence[tuple[str, str]]) -> int:
        """Where the branch changed: the position, in the new ``order``, of the user turn the change is
        attributed to (as :func:`_archive_off_branch` attributes a branch: a side that goes on with
        another message than a user turn belongs to the user turn before)."""
        before = self._load()
        d = next((i for i, (rec, (mid, _)) in enumerate(zip(before, order, strict=False)) if rec["id"] != mid),
                 min(len(before), len(order)))
        pos = next((i for i in range(min(d, len(order) - 1), -1, -1) if order[i][1] == "user"), 0)
        if pos == d and d < len(before) and before[d].get("role") != "user":
            pos = next((i for i in range(d - 1, -1, -1) if order[i][1] == "user"), pos)
        return pos

    def branch(self, root: str) -> list[dict[str, Any]] | None:
        """The branch the live root of ``root`` carried before this import (None: no such root)."""
        messages = self._load()
        pos = find_root(messages, root)
        return None if pos is None else [dict(m) for m in messages[pos:]]


def _archive_off_branch(off_branch: Callable[[], Iterator[tuple[str, list[dict[str, Any]]]]],
                        staged: StagedImport, live: _LiveOrder, old: _OldLive) -> dict[str, list[_Variant]]:
    """Keep each branch the source holds off its current one in the revisions store (seed 003 §4.9).

    A branch is attributed to where it left the current one, the way the host keeps a regenerate or
    edit branch: its family is the live user message at or before the first live message it does not
    share (``rootUserId``), and its payload is what would replace the live transcript from that user
    message on (the shared messages from the root, then the branch's own, then its checkpoints under
    ``compactions``). A payload always starts with a user message, as a host-made variant does (its
    restore stamps that message as the family's root): a branch whose own part starts with another
    message (pi's branch summary after ``/tree``) belongs to the user message before. A branch with no
    live user message before it is a family of its own (keyed by its first message). A branch the store
    already holds byte for byte in its family is not written again (its row and usage rows are,
    idempotently: they heal an index that lost them); one that grew from a stored one (a message added
    after it was archived) refreshes that variant, and the branch that was live before this import (the
    source moved to another) is stored in full over its ``revision_live`` reference; any other is a new
    variant (the next ``revisionIndex``). The store is append-only, so nothing a source once showed is
    lost, and a re-import of the same file adds nothing.

    Returns every family the store holds after this import (for :func:`_stamp_families`).
    """
    assert staged.revisions is not None
    order = live.messages
    when = staged.meta.updated_ms or 0
    stored = read_revisions(staged.revisions)
    families = _stored_families(stored)

    for leaf, records in off_branch():
        msgs = [r for r in records if r.get("type") == "message"]
        ids = {str(r["id"]) for r in msgs}
        k = next((i for i, (mid, _) in enumerate(order) if mid not in ids), len(order))
        rpos = next((i for i in range(min(k, len(order) - 1), -1, -1) if order[i][1] == "user"), None)
        if rpos == k:
            own = next((r for r in msgs if str(r["id"]) not in {mid for mid, _ in order[:k]}), None)
            if own is not None and own.get("role") != "user":  # restorable only from the user turn before
                rpos = next((i for i in range(k - 1, -1, -1) if order[i][1] == "user"), rpos)
        prefix = {mid for mid, _ in order[:rpos if rpos is not None else k]}
        branch = [r for r in msgs if str(r["id"]) not in prefix]
        if not branch:
            continue
        root = order[rpos][0] if rpos is not None else str(branch[0]["id"])
        try:
            payload = _payload(branch)
        except InvalidInput:  # a message of it nested past what can be written (:func:`_writable`)
            staged.report.skipped_blocks[_UNWRITABLE_BRANCH] += 1
            continue
        variants = families.setdefault(root, [])
        usage = [m for m in branch if "usageRaw" in (m.get("meta") or {})]
        same = next((v.idx for v in variants if v.payload == payload), None)
        if same is not None:  # stored already: its row and usage rows again (the index may have lost them)
            staged.revision_rows.append((root, same, len(branch)))
            staged.revision_records.extend(usage)
            continue
        branch_ids = [str(m["id"]) for m in branch]
        grown = next((v.idx for v in variants if v.ids is not None
                      and len(v.ids) < len(branch_ids) and branch_ids[:len(v.ids)] == v.ids), None)
        ref = next((v for v in variants if v.ids is None), None)
        if grown is None and ref is not None:  # the branch that was live until now left the transcript
            before = old.branch(root)
            if before is not None and branch_ids[:len(before)] == [str(m["id"]) for m in before]:
                grown = ref.idx
        idx = grown if grown is not None else max((v.idx for v in variants), default=0) + 1
        comps = [r for r in records if r.get("type") == "compaction" and r.get("id") not in live.compactions]
        extra: dict[str, Any] = {"importedFrom": staged.meta.source, "sourceLeaf": leaf}
        if comps:
            extra["compactions"] = comps
        line = _branch_line(staged, root, idx, branch, when, extra)
        if line is None:
            continue
        staged.revision_lines.append(line)
        staged.revision_rows.append((root, idx, len(branch)))
        staged.revision_records.extend(usage)
        variants[:] = [v for v in variants if v.idx != idx] + [_Variant(idx, branch_ids, payload)]
        staged.report.archived_branches += 1
    return families


def _carry_archived(archived: Archived, staged: StagedImport) -> None:
    """A pi-host export's archived branches into the copy's revisions file under the keys they had (seed 003
    §4.9): each one the file does not hold as it is becomes a line (``revision_line`` /
    ``revision_live_line``, appended by :func:`publish`), each gets its ``message_revisions`` row (again,
    idempotently) and the variant its family's live root is stamped with is the active one. A key whose
    newest line the copy wrote itself (a regenerate or a switch made in the copy: its line names no
    ``importedFrom``) is the copy's and is left as it is. Responses of a branch carrying an imported usage
    report count as the transcript's (:func:`record_usage`)."""
    assert staged.revisions is not None
    stored = read_revisions(staged.revisions, records=True)
    keys: set[tuple[str, int]] = set()
    for branch in archived.branches:
        root, idx, when = str(branch["rootUserId"]), int(branch["revisionIndex"]), int(branch["createdAt"])
        extra: dict[str, Any] = {"importedFrom": staged.meta.source}
        if branch["type"] == REVISION_LIVE:
            count = branch.get("messageCount")
            line = revision_live_line(root, idx, created_at_ms=when, message_count=count, extra=extra)
        else:
            messages = branch["messages"]
            if comps := branch.get("compactions"):
                extra["compactions"] = comps
            if deleted := branch.get("deleted"):  # its root, tombstoned on the first host (carried content-free)
                extra["deleted"] = deleted
            if roots := branch.get(ROOTS):  # the root each message stood under (store.revisions.ROOTS)
                extra[ROOTS] = roots
            encoded = _branch_line(staged, root, idx, messages, when, extra)
            if encoded is None:
                continue
            line, count = encoded, len(messages)
            staged.revision_records.extend(m for m in messages if carries_usage(m))
        entry = entry_of_line(line[:-1])
        assert entry is not None
        keys.add(entry.key)
        held = stored.get(root, idx)
        held_rec = stored.records.get(entry.key, {})
        if held is not None and "importedFrom" not in held_rec:
            continue  # the copy's own
        staged.revision_rows.append((root, idx, count if isinstance(count, int) else 0))
        if when > 0:
            staged.revision_created[entry.key] = when
        if held is not None and held.live == entry.live and (
                held.message_count == entry.message_count if entry.live else
                payload_digest(held) == payload_digest(entry)):
            continue
        staged.revision_lines.append(line)
        staged.report.archived_branches += 1
    for root, active in sorted(archived.active.items()):
        if (root, active) in keys:
            staged.revision_active.append((root, active))
    _carry_artifacts(archived, staged, stored)


def _carry_artifacts(archived: Archived, staged: StagedImport, stored: RevisionFile) -> None:
    """A pi-host export's artifact rows (its ``artifact`` lines) into the copy's revisions file, as a rewrite
    carries a cut's rows there (``store.revisions.ARTIFACT``): every row the session listed, so the copy lists
    them too, with their turn (the copy's lines name none) and those whose line a cut took out of every file,
    also after its index is rebuilt. A row the file already carries at its time or later (an earlier import of
    the same export, a cut on the copy since) is not written again; every row is restored in the index
    (:func:`apply_index`), as a rebuild restores it."""
    held = artifacts.carried_of(stored.artifacts)
    for path, row in sorted(archived.artifacts.items(), key=lambda item: (item[1]["updatedAt"], item[0])):
        staged.carried_artifacts.append(row)
        kept = held.get(path)
        if kept is None or kept[2] < row["updatedAt"]:
            staged.revision_lines.append(artifact_line(row))


_UNWRITABLE_BRANCH = "revision(cannot be written)"


def _branch_line(staged: StagedImport, root: str, idx: int, messages: Sequence[Mapping[str, Any]], when: int,
                 extra: dict[str, Any]) -> bytes | None:
    """An archived branch's ``revision`` line; None, counted, when it cannot be written: its messages nest
    two levels deeper there than in the transcript (:func:`_writable`)."""
    try:
        return revision_line(root, idx, messages, {}, created_at_ms=when, extra=extra)
    except InvalidInput:
        staged.report.skipped_blocks[_UNWRITABLE_BRANCH] += 1
        return None


def _stored_families(stored: RevisionFile) -> dict[str, list[_Variant]]:
    out: dict[str, list[_Variant]] = {}
    for (root, _), entry in sorted(stored.entries.items()):
        out.setdefault(root, []).append(_variant(entry))
    return out


def _variant(entry: RevisionEntry) -> _Variant:
    if entry.live:
        return _Variant(entry.revision_index, None, None)
    return _Variant(entry.revision_index, [str(m["id"]) for m in entry.messages], _payload(entry.messages))


def _payload(messages: Iterable[Mapping[str, Any]]) -> list[bytes]:
    """A branch's lines as compared: without the pager stamp (a branch the host archived carries its root's;
    the source's records never do)."""
    out = []
    for m in messages:
        meta = m.get("meta")
        if isinstance(meta, Mapping) and any(k in meta for k in PAGER_KEYS):
            rest = {k: v for k, v in meta.items() if k not in PAGER_KEYS}
            m = {k: v for k, v in m.items() if k != "meta"} | ({"meta": rest} if rest else {})
        out.append(dumps_line(m))
    return out


def _restorable(variant: _Variant) -> bool:
    """A variant the host can switch to and back: a reference, or a payload that starts with a user turn
    (an import under rules 7 filed a pi branch summary's branch under the turn after it; that variant
    stays listed, but its family is not paged)."""
    return variant.payload is None or (bool(variant.payload) and loads_line(variant.payload[0]).get("role") == "user")


def _stamp_families(families: Mapping[str, list[_Variant]], staged: StagedImport, live: _LiveOrder, old: _OldLive,
                    out: _Out, spans: Spans | None, source_ids: set[str] | None) -> None:
    """Make each family look as the host's own regenerate leaves it (seed 003 §4.9, acceptance 13).

    For a family whose root is on the source's current branch, the branch from that root on is one of
    its variants: the variant whose ``revision_live`` reference already names it (the source only grew),
    else a stored variant it equals or grew from (the source moved back to it), else a new one (the next
    ``revisionIndex``). That variant gets a ``revision_live`` reference (not a second copy of the
    transcript), ``is_active`` and the root's pager stamp (``revisionCount`` = the family's variants,
    ``activeRevision`` = it), written as a same-id replacement line of the root only when it changes.
    A reference whose branch is no longer live (the source moved to another branch) is stored in full
    first, from the transcript as it was, as ``session.activateRevision`` does (D307): no reference is
    left naming a branch the transcript no longer shows. A family rooted at a message the source never
    had (the host's own regenerate in the imported session) is the host's alone: it is not touched.
    """
    order = live.messages
    pos_of = {mid: i for i, (mid, _) in enumerate(order)}
    moved = staged.report.hidden_off_branch > 0 or staged.report.restored_on_branch > 0
    switch = old.switch_position(order) if moved and any(v.ids is None for vs in families.values() for v in vs) \
        else len(order)
    when = staged.meta.updated_ms or 0
    wanted: dict[str, tuple[int, int]] = {}
    for root, variants in sorted(families.items()):
        if source_ids is not None and root not in source_ids:
            continue
        ref = next((v for v in variants if v.ids is None), None)
        rpos = pos_of.get(root)
        live_ids = [mid for mid, _ in order[rpos:]] if rpos is not None and order[rpos][1] == "user" else None
        # a family rooted before the change keeps its live variant: its reference names the live suffix,
        # whichever branch of a family inside it is shown (as a switch inside the host leaves it)
        if ref is not None and (live_ids is None or (rpos is not None and rpos >= switch)):
            before = old.branch(root)
            if live_ids is None or before is None or live_ids[:len(before)] != [str(m["id"]) for m in before]:
                if before is not None:  # the referenced branch left the transcript: its payload, stored
                    extra: dict[str, Any] = {"importedFrom": staged.meta.source}
                    ids = {m["id"] for m in before}
                    if comps := [c for c in old.compactions if c.get("throughMessageId") in ids]:
                        extra["compactions"] = comps
                    line = _branch_line(staged, root, ref.idx, before, when, extra)
                    if line is None:
                        continue
                    staged.revision_lines.append(line)
                    staged.revision_rows.append((root, ref.idx, len(before)))
                    variants[:] = [v for v in variants if v is not ref] + [
                        _Variant(ref.idx, [str(m["id"]) for m in before], _payload(before))]
                ref = None
        if live_ids is None or not any(_restorable(v) for v in variants):
            continue
        match = [v for v in variants if v.ids and live_ids[:len(v.ids)] == v.ids]
        best = max(match, key=lambda v: (len(v.ids or ()), v.idx)) if match else None
        if ref is not None:
            idx = ref.idx
        elif best is not None and best.ids == live_ids:  # stored as it is (a switch in the host leaves it so)
            idx = best.idx
        else:  # the branch grew from a stored variant, or is a new one: referenced, not copied
            idx = best.idx if best is not None else max((v.idx for v in variants), default=0) + 1
            staged.revision_lines.append(revision_live_line(root, idx, created_at_ms=when,
                                                            message_count=len(live_ids)))
            variants[:] = [v for v in variants if v.idx != idx] + [_Variant(idx, None, None)]
        staged.revision_rows.append((root, idx, len(live_ids)))
        staged.revision_active.append((root, idx))
        wanted[root] = (len({v.idx for v in variants}), idx)
    if not wanted:
        return
    held = _root_records(staged, out, spans, sorted(wanted))
    for root, (count, active) in sorted(wanted.items()):
        rec = held.get(root)
        if rec is None:
            if out.path is None:  # a dry run of a new session: nothing to read back, but a line is due
                out.write(b"\n")
            continue
        current = stamp_of(rec)
        if (current.count, current.active, current.root) == (count, active, root):
            continue
        out.write(dumps_line(with_stamp(rec, count=count, active=active, root=root)))
        if staged.kind == "append":
            staged.report.replaced_records += 1


def _root_records(staged: StagedImport, out: _Out, spans: Spans | None,
                  ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The newest line of each of ``ids`` this import leaves: written by it (the staging file) or held by
    the transcript (its indexed span)."""
    found: dict[str, dict[str, Any]] = {}
    needles = [b'"id":' + orjson.dumps(mid) for mid in ids]
    if out.path is not None:
        out.flush()
        for line in LineReader(out.path, max_line_bytes=DEFAULT_LIMITS.max_line_bytes, unterminated_last_line=False):
            if line.data is None or not any(n in line.data for n in needles):
                continue
            rec = loads_line(line.data)
            if rec.get("type") == "message" and rec.get("id") in ids:
                found[str(rec["id"])] = rec
    missing = [mid for mid in ids if mid not in found]
    if missing and spans is not None and staged.kind == "append":
        known = spans(missing)
        fd = open_nofollow(staged.transcript, os.O_RDONLY)
        try:
            for mid, span in known.items():
                found[mid] = loads_line(_old_line(fd, span))
        finally:
            os.close(fd)
    return found


_TOMBSTONE_START = b'{"type":"tombstone"'


def _hidden_by_import(transcript: Path, length: int, sid: str, wanted: set[str]) -> set[str]:
    """Of ``wanted``, the messages whose newest tombstone in the transcript is an import's off-branch one."""
    prefix = join_id(sid, "off-branch") + ":"
    newest: dict[str, bool] = {}
    reader = LineReader(transcript, max_line_bytes=DEFAULT_LIMITS.max_line_bytes, end=length,
                        unterminated_last_line=False)
    for line in reader:
        if line.data is None or not line.data.startswith(_TOMBSTONE_START):
            continue
        try:
            rec = loads_line(line.data)
        except (StoreError, ValueError):
            continue
        mid = rec.get("messageId")
        if isinstance(mid, str) and mid in wanted:
            tid = rec.get("id")
            newest[mid] = rec.get("deleted", True) is not False and isinstance(tid, str) and tid.startswith(prefix)
    return {mid for mid, by_import in newest.items() if by_import}


# --------------------------------------------------------------------------- publish / undo


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def publish(staged: StagedImport, *, faults: Faults = NO_FAULTS) -> None:
    """Make the staged lines part of the transcript (step 2), then append the revision lines of the
    source's abandoned branches (one write, one fsync); an append with nothing staged is a no-op."""
    _publish_transcript(staged, faults)
    if staged.revision_lines and staged.revisions is not None:
        try:
            before: int | None = os.stat(staged.revisions, follow_symlinks=False).st_size
        except FileNotFoundError:
            before = None
        try:
            end = append_revision_lines(staged.revisions, staged.revision_lines, faults=faults)
        except BaseException:
            _cut_revisions(staged.revisions, before)  # whatever stopped the append: none of its lines stay
            raise
        staged.revisions_pre = end - sum(len(line) for line in staged.revision_lines)
        staged.revisions_end = end
    if staged.reviews is not None:
        staged.reviews.publish()


def _publish_transcript(staged: StagedImport, faults: Faults) -> None:
    if staged.temp is None and staged.kind == "append" and staged.file_end == staged.pre_length:
        return
    assert staged.temp is not None
    if staged.kind == "new":
        try:
            os.link(staged.temp, staged.transcript)
        except FileExistsError:
            _unlink(staged.temp)
            raise Conflict(f"transcript {staged.transcript} appeared while importing",
                           data={"sessionId": staged.session_id}) from None
        except OSError as exc:
            _unlink(staged.temp)
            raise classify_os_error(exc, f"publish {staged.transcript}") from exc
        staged.published = True
        _unlink(staged.temp)
        try:
            faults.point("import.after_link")
            fsync_dir(staged.transcript.parent)
        except OSError as exc:  # the caller undoes what is published (``staged.published``)
            raise classify_os_error(exc, f"publish {staged.transcript}") from exc
        return
    try:
        _append_file(staged, faults)
    finally:
        _unlink(staged.temp)


def _append_file(staged: StagedImport, faults: Faults) -> None:
    assert staged.temp is not None
    length = staged.file_end - staged.pre_length
    if length == 0:
        return
    try:
        fd = open_nofollow(staged.transcript, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        raise classify_os_error(exc, f"open {staged.transcript}") from exc
    try:
        if os.fstat(fd).st_size != staged.pre_length:
            raise Conflict(f"transcript {staged.transcript} changed while importing",
                           data={"sessionId": staged.session_id})
        src = os.open(staged.temp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        staged.published = True
        try:
            while chunk := os.read(src, _WRITE_BUFFER):
                write_all(fd, chunk)
            faults.point("import.after_append_write")
            os.fdatasync(fd)
        except OSError as exc:
            _truncate(fd, staged.pre_length)
            staged.published = False
            raise classify_os_error(exc, f"append to {staged.transcript}") from exc
        finally:
            os.close(src)
    finally:
        os.close(fd)


def _undo_revisions(staged: StagedImport) -> None:
    """Cut the revision lines this import appended (only if nothing was appended after them)."""
    if staged.revisions_pre is None or staged.revisions is None:
        return
    try:
        fd = open_nofollow(staged.revisions, os.O_WRONLY)
    except OSError:
        return
    try:
        if os.fstat(fd).st_size == staged.revisions_end:
            _truncate(fd, staged.revisions_pre)
    finally:
        os.close(fd)
    if staged.revisions_pre == 0:
        _remove_if_empty(staged.revisions)
    staged.revisions_pre = None


def _cut_revisions(path: Path, before: int | None) -> None:
    """Back to ``before`` bytes (None: the file did not exist, so it goes)."""
    try:
        if before is None:
            remove_file_durable(path)
            return
        fd = open_nofollow(path, os.O_WRONLY)
    except (OSError, StoreError):
        return
    try:
        if os.fstat(fd).st_size > before:
            _truncate(fd, before)
    finally:
        os.close(fd)


def _remove_if_empty(path: Path) -> None:
    try:
        if os.stat(path, follow_symlinks=False).st_size == 0:
            remove_file_durable(path)
    except (OSError, StoreError):
        pass


def _truncate(fd: int, length: int) -> None:
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    except OSError:
        pass


def undo(staged: StagedImport) -> None:
    """Take back a published import whose index step failed (step 4). Never touches foreign bytes."""
    if staged.temp is not None:
        _unlink(staged.temp)
    if staged.reviews is not None:
        staged.reviews.discard()
    _undo_revisions(staged)
    if not staged.published:
        return
    if staged.kind == "new":
        try:
            st = os.stat(staged.transcript, follow_symlinks=False)
        except FileNotFoundError:
            return
        if (st.st_dev, st.st_ino) == staged.identity:
            remove_file_durable(staged.transcript)
    else:
        fd = open_nofollow(staged.transcript, os.O_WRONLY)
        try:
            if os.fstat(fd).st_size == staged.file_end:
                _truncate(fd, staged.pre_length)
        finally:
            os.close(fd)
    staged.published = False


# --------------------------------------------------------------------------- index


def _index_lines(staged: StagedImport,
                 limits: ImportLimits) -> Iterator[tuple[int, list[Any], list[Any], list[tuple[str, bool]]]]:
    """Batches of (end offset, message IndexRecords, CompactionRecords, tombstones) read back from the file,
    each at most ``INDEX_BATCH`` records or about ``_WRITE_BUFFER`` bytes of lines (one line may exceed it)."""
    reader = LineReader(staged.transcript, max_line_bytes=limits.max_line_bytes, start=staged.body_start,
                        unterminated_last_line=False,
                        end=staged.body_end)
    msgs: list[Any] = []
    comps: list[Any] = []
    tombs: list[tuple[str, bool]] = []
    end = staged.body_start
    held = 0  # bytes of the lines in the batch: a batch is bounded in bytes as well as in records
    root: Root | None = None  # the root the lines so far leave in effect (None: the session's, records.Root)
    for line in reader:
        if line.data is None:
            raise StoreError(f"{staged.transcript}: a written line is over the line limit")
        rec = loads_line(line.data)
        end = line.offset + line.length
        if rec.get("type") == "message":
            whole = line.data + b"\n" if line.length == len(line.data) + 1 else None  # the line as the file holds it
            msgs.append(index.IndexRecord(rec, line.offset, line.length, line=whole, root=root))
        elif rec.get("type") == "session_info":
            root = root_named(rec) or root
        elif rec.get("type") == "compaction":
            comps.append(index.CompactionRecord(rec, line.offset, line.length))
        elif rec.get("type") == "tombstone":
            tombs.append((str(rec.get("messageId")), rec.get("deleted", True) is not False))
        held += line.length
        if len(msgs) + len(comps) + len(tombs) >= INDEX_BATCH or held >= _WRITE_BUFFER:
            yield end, msgs, comps, tombs
            msgs, comps, tombs = [], [], []
            held = 0
    yield end, msgs, comps, tombs


def apply_index(conn: sqlite3.Connection, staged: StagedImport, *, now_ms: int) -> None:
    """Step 3, inside the caller's transaction."""
    sid = staged.session_id
    meta = staged.meta
    if staged.kind == "new":
        host = staged.plugin_id == HOST_IMPORTER
        settings, thread = carried_settings(meta)
        index.insert_session(conn, sid, now_ms=now_ms, created_at_ms=meta.created_ms or now_ms,
                             title=meta.title, project_path=meta.cwd if host else None, file_epoch=staged.epoch,
                             source=meta.source, settings=settings)
        if thread is not None:
            thread_meta.upsert(conn, sid, thread, now_ms=now_ms)
        if staged.project_id is not None:
            conn.execute("UPDATE sessions SET project_id = ? WHERE id = ?", (staged.project_id, sid))
    else:
        row = index.require_session(conn, sid)
        staged.epoch = row["_fileEpoch"]
        if not staged.report.older_copy:  # an older copy names the session as it was then
            _follow_title(conn, sid, row.get("title"), meta.title)
    model: tuple[str | None, str] | None = None
    record_carried_blobs(conn, staged, now_ms)  # before the lines: their blocks' references find the rows
    if staged.body_end > staged.body_start:
        for end, msgs, comps, tombs in _index_lines(staged, DEFAULT_LIMITS):
            index.index_messages(conn, sid, msgs, indexed_len=end, file_epoch=staged.epoch, now_ms=now_ms,
                                 touch=False, audit_effects=False)
            model = record_usage(conn, sid, msgs) or model
            record_compaction_usage(conn, sid, comps)
            index.index_compactions(conn, sid, comps, now_ms)
            for mid, flag in tombs:
                index.set_deleted(conn, sid, mid, flag)
    if staged.file_end > staged.body_start:  # lines written (an import_receipt line may be all of them)
        index.set_index_mark(conn, sid, staged.file_end, staged.epoch)
    last = conn.execute("SELECT MAX(created_at) FROM messages WHERE session_id = ?", (sid,)).fetchone()[0]
    if last is not None:
        conn.execute("UPDATE sessions SET updated_at = MAX(updated_at, ?) WHERE id = ?", (last, sid))
    if staged.held_usage:
        _record_held_usage(conn, staged)
    if model is None and staged.kind == "append" and not staged.report.older_copy:
        # the lines the source still gives name it: the first import's, or those of an import killed before
        # its commit (boot indexed them; this import writes them no more, but their model is its to record)
        model = staged.source_model
    if model is not None:
        staged.history_model = model
        if staged.plugin_id == HOST_IMPORTER:
            # the model the history used last is the session's model, as its project path is (a host
            # import binds both); never one the user set since, never for a plugin import (§4.5)
            conn.execute("UPDATE sessions SET provider_id = ?, model_id = ? WHERE id = ? AND model_id IS NULL",
                         (model[0], model[1], sid))
    for root, idx, count in staged.revision_rows:
        upsert_row(conn, sid, root, idx, message_count=count,
                   now_ms=staged.revision_created.get((root, idx), now_ms))
    for root, idx in staged.revision_active:  # the variant the root's pager stamp names (seed 003 §4.9)
        set_active(conn, sid, root, idx)
    # the files the archived branches' Write/Edit lines produced, listed as a rebuild from the copy's files lists them
    artifacts.record_archived_lines(conn, sid, staged.revision_lines, now_ms)
    # the rows a pi-host export carried (a retry's too, whose lines its first try appended), after every line:
    # of one time the carried row, the first host's, wins, as in a rebuild
    artifacts.restore_carried(conn, sid, staged.carried_artifacts)
    if staged.revision_records:  # an abandoned branch's responses count like the transcript's (one row each)
        record_usage(conn, sid, staged.revision_records)
    for turn in staged.carried_turns:  # the first host's turns, as it stored them (after: they win)
        turns.record_carried(conn, session_id=sid, turn=turn)
    for blob, message_id in staged.blobs:
        attachments.record_blob(conn, blob.sha256, blob.size, blob.mime_type, now_ms)
        attachments.record_ref(conn, blob.sha256, sid, message_id, now_ms)
    write_origin(conn, staged, now_ms=now_ms)


def record_carried_blobs(conn: sqlite3.Connection, staged: StagedImport, now_ms: int) -> None:
    """The rows of the blobs a pi-host export carried (live: their bytes are stored), and a tombstone
    (``evicted``, size unknown: 0, as ``store.upgrade.attachment_adopt.mark_lost_blobs`` gives one) for each
    blob the written blocks refer to that is neither carried nor here: indexing the lines then records their
    references (``attachments.record_block_refs``), marked for the lost ones, so the copy's blocks say
    ``evicted`` at once, as a rebuilt index would."""
    for blob in staged.carried_blobs:
        attachments.record_blob(conn, blob.sha256, blob.size, blob.mime_type, now_ms)
    for sha in staged.lost_blobs:
        conn.execute("INSERT OR IGNORE INTO attachment_blobs(sha256, size_bytes, mime_type, created_at, "
                     "last_used_at, deletion_state, evicted_at) VALUES (?, 0, NULL, ?, ?, 'evicted', ?)",
                     (sha, now_ms, now_ms, now_ms))


def record_usage(conn: sqlite3.Connection, sid: str,
                  msgs: Sequence[index.IndexRecord | Mapping[str, Any]]) -> tuple[str | None, str] | None:
    """A turn row per imported response with usage (normalised by the importer: ``usageRaw`` beside it; a
    response that only called tools has it on its first tool record). Returns the last (provider, model)
    the messages name."""
    model: tuple[str | None, str] | None = None
    for msg in msgs:
        rec = msg.record if isinstance(msg, index.IndexRecord) else msg
        meta = rec.get("meta")
        model = named_model(rec) or model
        if rec.get("role") not in ("assistant", "tool") or not isinstance(meta, Mapping) or "usageRaw" not in meta:
            continue
        usage = meta.get("usage")
        if not isinstance(usage, Mapping):
            continue
        provider_id, model_id = meta.get("providerId"), meta.get("modelId")
        turns.record_imported_usage(conn, session_id=sid, turn_id=str(rec["id"]),
                                    provider_id=provider_id if isinstance(provider_id, str) else None,
                                    model_id=model_id if isinstance(model_id, str) else None, usage=usage,
                                    at_ms=max(0, rfc3339_to_ms(str(rec.get("createdAt")), 0)))
    return model


def carries_usage(rec: Mapping[str, Any]) -> bool:
    """A response (or a checkpoint's request) whose usage becomes a turn row (:func:`record_usage`,
    :func:`record_compaction_usage`)."""
    if rec.get("type") == "compaction":
        details = rec.get("details")
        return isinstance(details, Mapping) and "usageRaw" in details and isinstance(details.get("usage"), Mapping)
    meta = rec.get("meta")
    return (rec.get("role") in ("assistant", "tool") and isinstance(meta, Mapping) and "usageRaw" in meta
            and isinstance(meta.get("usage"), Mapping))


def _record_held_usage(conn: sqlite3.Connection, staged: StagedImport) -> None:
    """The turn rows the held lines that carry usage lack (none, after a clean import).

    An import killed after writing its lines and before its commit left them to boot, which indexes their
    messages but not their usage (turn rows are the import's alone); the retry finds every line held and
    writes none, so it records their turn rows from the lines themselves here."""
    sid = staged.session_id
    missing: list[tuple[int, int]] = []
    for i in range(0, len(staged.held_usage), 500):
        chunk = staged.held_usage[i : i + 500]
        marks = ",".join("?" * len(chunk))
        have = {tid for (tid,) in conn.execute(f"SELECT id FROM turns WHERE session_id = ? AND id IN ({marks})",
                                               (sid, *(rid for rid, _ in chunk)))}
        missing.extend(span for rid, span in chunk if rid not in have)
    if not missing:
        return
    try:
        fd = open_nofollow(staged.transcript, os.O_RDONLY)
    except OSError as exc:
        raise classify_os_error(exc, f"read {staged.transcript}") from exc
    try:
        for offset, length in missing:
            rec = loads_line(_old_line(fd, (offset, length)))
            if rec.get("type") == "compaction":
                record_compaction_usage(conn, sid, [index.CompactionRecord(rec, offset, length)])
            else:
                record_usage(conn, sid, [rec])
    finally:
        os.close(fd)


def named_model(rec: Mapping[str, Any]) -> tuple[str | None, str] | None:
    """(provider, model) a message's ``meta`` names, if it names a model."""
    meta = rec.get("meta")
    if (isinstance(meta, Mapping) and isinstance(meta.get("modelId"), str) and meta["modelId"]
            and meta["modelId"] != "<synthetic>"):
        provider = meta.get("providerId")
        return (provider if isinstance(provider, str) and provider else None, meta["modelId"])
    return None


def _follow_title(conn: sqlite3.Connection, sid: str, current: object, title: str | None) -> None:
    """A source that renamed the session since the last import (pi's ``session_info``, an opencode title)
    renames it here too, unless the session's title is no longer the one the last import gave it (the
    user renamed it in the host: theirs wins)."""
    row = conn.execute("SELECT origin_json FROM session_import_origins WHERE session_id = ?", (sid,)).fetchone()
    try:
        origin = orjson.loads(row[0]) if row is not None and row[0] else {}
    except orjson.JSONDecodeError:
        return
    before = origin.get("title") if isinstance(origin, dict) else None
    if title and isinstance(before, str) and title != before and current == before:
        conn.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, sid))


def record_compaction_usage(conn: sqlite3.Connection, sid: str, comps: Sequence[index.CompactionRecord]) -> None:
    """A turn row per imported checkpoint whose request's usage the source recorded (``details.usage``,
    raw beside it: Claude Code's ``cost-state`` growth across a compaction, opencode's summarizing response),
    as for a response."""
    for comp in comps:
        rec = comp.record
        details = rec.get("details")
        if not isinstance(details, Mapping) or "usageRaw" not in details or not isinstance(details.get("usage"),
                                                                                            Mapping):
            continue
        provider_id, model_id = details.get("providerId"), details.get("modelId")
        turns.record_imported_usage(conn, session_id=sid, turn_id=str(rec["id"]),
                                    provider_id=provider_id if isinstance(provider_id, str) else None,
                                    model_id=model_id if isinstance(model_id, str) else None, usage=details["usage"],
                                    at_ms=max(0, rfc3339_to_ms(str(rec.get("createdAt")), 0)))


def _origin_history(staged: StagedImport) -> dict[str, Any]:
    """The origin row's ``origin_json`` as this import leaves it (before a re-import's fallback to the
    model the row named before: :func:`write_origin`)."""
    meta = staged.meta
    files = {f.path: {"size": f.size, "mtimeNs": f.mtime_ns, "consumed": f.consumed, "sha256": f.sha256,
                      **({"earlier": staged.earlier[f.path]} if staged.earlier.get(f.path) else {})}
             for f in staged.report.files if f.sha256}
    origin: dict[str, Any] = {"files": files, "projectPath": meta.cwd, "title": meta.title, **meta.history,
                              "importRules": IMPORT_RULES}
    if staged.report.content_fingerprint:
        origin["contentFingerprint"] = staged.report.content_fingerprint
    if meta.thinking_level:
        origin["thinkingLevel"] = meta.thinking_level
    if staged.history_model is not None:  # what the source says about itself (a plugin's history) wins
        for key, value in zip(("providerId", "modelId"), staged.history_model, strict=True):
            if value is not None and not origin.get(key):
                origin[key] = value
    return origin


def write_origin(conn: sqlite3.Connection, staged: StagedImport, *, now_ms: int) -> None:
    meta = staged.meta
    origin = _origin_history(staged)
    row = conn.execute("SELECT origin_json FROM session_import_origins WHERE session_id = ?",
                       (staged.session_id,)).fetchone()
    before = orjson.loads(row[0]) if row and row[0] else {}
    if not isinstance(before, dict):
        before = {}
    if staged.history_model is None:  # a re-import whose new lines name no model keeps the one the history named before
        for key in ("providerId", "modelId"):
            if key in before and key not in origin:
                origin[key] = before[key]
    if "git" in before and "git" not in origin:  # a re-import of lines that name none keeps what was read before
        origin["git"] = before["git"]
    if staged.import_receipt is not None and staged.answer is not None and staged.has_writes:
        origin["lastImport"] = {"receipt": dict(staged.import_receipt), "answer": staged.answer}
    elif "lastImport" in before:  # the newest keyed write's, until another keyed request writes the session
        origin["lastImport"] = before["lastImport"]
    upsert_origin(conn, staged.plugin_id, meta.source, meta.external_id, staged.session_id,
                  meta.label or meta.source, origin, now_ms)


def upsert_origin(conn: sqlite3.Connection, plugin_id: str, source_id: str, external_id: str, session_id: str,
                  label: str, origin: Mapping[str, Any], now_ms: int) -> None:
    """The ``session_import_origins`` row of a session (one per session; the history is JSON)."""
    conn.execute(
        "INSERT INTO session_import_origins(plugin_id, source_id, external_id, session_id, source_label, "
        "origin_json, created_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT(session_id) DO UPDATE SET "
        "source_label = excluded.source_label, origin_json = excluded.origin_json",
        (plugin_id, source_id, external_id, session_id, label, orjson.dumps(origin).decode(), now_ms),
    )
