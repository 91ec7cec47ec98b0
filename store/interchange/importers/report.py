"""Import reports: per source file and per session (what the CLI's --json prints)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_UNKNOWN_KINDS", "FileReport", "SessionReport", "unknown_kinds"]

MAX_UNKNOWN_KINDS = 50
"""How many distinct unknown record kinds an import summary lists."""


def _counter_dict(counter: Counter[str]) -> dict[str, int]:
    return dict(sorted(counter.items()))


@dataclass
class FileReport:
    """What one source file held and what the importer did with it."""

    path: str
    size: int = 0
    consumed: int = 0
    """Bytes up to the end of the last complete line (what a re-import compares)."""
    sha256: str = ""
    """SHA-256 of the consumed bytes."""
    at_mark: tuple[int, str] | None = None
    """A re-import's: ``(offset, SHA-256 of the bytes before it)`` at the offset the last import consumed to,
    taken by the reader on its way (``LineReader(mark=...)``); None when not asked or not reached."""
    mtime_ns: int = 0
    lines: int = 0
    blank_lines: int = 0
    bad_lines: int = 0
    repaired_lines: int = 0
    """Lines read once repaired: bytes that are not UTF-8, or a lone surrogate escape, each read as U+FFFD."""
    oversized_lines: int = 0
    torn_tail_bytes: int = 0
    roots: int = 0
    dangling_parents: int = 0
    record_types: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    """Known record kinds that hold nothing this host stores (hooks, snapshots, queue ops...)."""
    unknown: Counter[str] = field(default_factory=Counter)
    """Record kinds the importer does not know (counted and skipped, never an error)."""
    reference: bool = False
    """Read only for a link (a Codex child thread's parent rollout): none of its lines are this session's,
    it is fingerprinted so that a change of it reads the session again."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "size": self.size, "consumed": self.consumed, "lines": self.lines,
            "blankLines": self.blank_lines, "badLines": self.bad_lines, "repairedLines": self.repaired_lines,
            "oversizedLines": self.oversized_lines,
            "tornTailBytes": self.torn_tail_bytes, "roots": self.roots, "danglingParents": self.dangling_parents,
            "recordTypes": _counter_dict(self.record_types), "skipped": _counter_dict(self.skipped),
            "unknown": _counter_dict(self.unknown), **({"reference": True} if self.reference else {}),
        }


@dataclass
class SessionReport:
    """The per-session (per-file for single-file tools) import report."""

    source: str
    external_id: str = ""
    session_id: str = ""
    status: str = "pending"
    """``new`` | ``updated`` | ``unchanged`` | ``refused`` (``would-*`` in a dry run)."""
    reason: str | None = None
    message: str | None = None
    messages: Counter[str] = field(default_factory=Counter)
    """Messages produced, by role, minus those the writer left out (``skipped_blocks``): what the
    session holds from the source."""
    tool_calls: int = 0
    """Tool calls the session holds from the source (``tool_call`` blocks of the lines written, each message's
    last line; a call left out because it cannot be written is not one, a result without its call is an
    ``orphan_results``): counted by the writer (``common.tool_tally``), like ``messages`` what the session holds."""
    tool_results: int = 0
    """Of ``tool_calls``, those that hold their result."""
    unpaired_tool_calls: int = 0
    orphan_results: int = 0
    thinking_blocks: int = 0
    compactions: int = 0
    compactions_dropped: int = 0
    attributed: int = 0
    """Subagent / sidechain rows (meta.parentToolCallId / meta.agentName)."""
    attachments: int = 0
    """Attachment blocks the session holds from the source (each message's last line written, tool results
    included): counted by the writer (``common.attachment_tally``), as ``tool_calls`` is."""
    replay_dropped: int = 0
    forced_flushes: int = 0
    off_branch: int = 0
    hidden_off_branch: int = 0
    """Messages imported before that left the current branch: tombstoned by this import."""
    restored_on_branch: int = 0
    """Messages an earlier import hid that are on the current branch again: restored by this import."""
    archived_branches: int = 0
    """Branches the source holds off its current one that this import added to the revisions store."""
    older_copy: bool = False
    """The source lacks messages imported before (an older copy): no message was hidden or restored."""
    skipped_blocks: Counter[str] = field(default_factory=Counter)
    new_records: int = 0
    """Records this import added to the transcript: messages and compaction checkpoints (``new_messages`` plus
    the new checkpoints). A tombstone line written with a message (a pi-host export's prompt deleted on the
    first host) is the message's state, not a record; ``replaced_records`` / ``unchanged_records`` count
    records of the same kinds whose line the transcript held before."""
    new_messages: int = 0
    """Messages this import added to the transcript (``messages`` counts what the session holds from the
    source, added now or by an earlier import)."""
    replaced_records: int = 0
    unchanged_records: int = 0
    appended_bytes: int = 0
    files: list[FileReport] = field(default_factory=list)
    content_fingerprint: str = ""
    """A digest of the session's source content, taken before parsing, for sources whose files are
    shared by many sessions (opencode's database, its per-message JSON files); empty otherwise."""

    def refuse(self, code: str, message: str) -> SessionReport:
        self.status = "refused"
        self.reason = code
        self.message = message
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "externalId": self.external_id, "sessionId": self.session_id,
            "status": self.status, "reason": self.reason, "message": self.message,
            "messages": _counter_dict(self.messages), "toolCalls": self.tool_calls,
            "toolResults": self.tool_results, "unpairedToolCalls": self.unpaired_tool_calls,
            "orphanResults": self.orphan_results, "thinkingBlocks": self.thinking_blocks,
            "compactions": self.compactions, "compactionsDropped": self.compactions_dropped,
            "attributed": self.attributed, "attachments": self.attachments, "replayDropped": self.replay_dropped,
            "forcedFlushes": self.forced_flushes, "offBranch": self.off_branch,
            "hiddenOffBranch": self.hidden_off_branch, "restoredOnBranch": self.restored_on_branch,
            "archivedBranches": self.archived_branches,
            "olderCopy": self.older_copy,
            "skippedBlocks": _counter_dict(self.skipped_blocks), "newRecords": self.new_records,
            "newMessages": self.new_messages,
            "replacedRecords": self.replaced_records, "unchangedRecords": self.unchanged_records,
            "appendedBytes": self.appended_bytes, "files": [f.to_dict() for f in self.files],
        }


def unknown_kinds(report: SessionReport) -> Counter[str]:
    """Every record kind the importer did not know, over the session's files."""
    out: Counter[str] = Counter()
    for file in report.files:
        out.update(file.unknown)
    return out
