"""Params and results: import.sessions (other agents' sessions into this host, seed 003 §4.5, §5)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from store.rules import MAX_IMPORT_REPORTS

from .models_common import (
    Count,
    MutatingParams,
    ProjectPath,
    Result,
    SessionId,
    WireId,
)

ImportSource = Literal["claude-code", "codex", "pi", "opencode", "pi-host"]


class ImportSessionsParams(MutatingParams):
    source: ImportSource = Field(
        description="claude-code (~/.claude/projects), codex (~/.codex/sessions), pi (~/.pi/agent/sessions), "
        "opencode (~/.local/share/opencode), pi-host (this host's JSONL export; root required)."
    )
    root: ProjectPath | None = Field(
        default=None,
        description="Absolute path of the directory (or single file) to import; default: the tool's usual "
        "root as the host process sees it (the tool's own environment overrides honoured).",
    )
    dry_run: bool = Field(default=False, description="Parse and report; write nothing.")
    import_id: WireId | None = Field(
        default=None,
        description="Echoed in every import.progress event of this import (the host makes one when absent).",
    )


class ImportCounts(Result):
    """Sessions by outcome (``would-new`` / ``would-updated`` in a dry run)."""

    new: Count = 0
    updated: Count = 0
    unchanged: Count = 0
    refused: Count = 0
    would_new: Count = Field(default=0, alias="would-new")
    would_updated: Count = Field(default=0, alias="would-updated")


class ImportSessionReport(Result):
    """One session's report (store/interchange/importers/report.py); more counters may appear."""

    source: str
    external_id: str
    session_id: str
    status: Literal["new", "updated", "unchanged", "refused", "would-new", "would-updated"]
    reason: str | None = Field(default=None, description="A refusal's stable code (NOT_A_SESSION_FILE, ...).")
    message: str | None = None
    messages: dict[str, Count] = Field(description="Messages by role, as the transcript holds them (a record "
                                       "left out because it cannot be written is counted in skippedBlocks only).")
    tool_calls: Count = Field(default=0, description="Tool calls the session's messages hold from the source, as "
                              "messages counts them: each message's last line (a call and the later line with its "
                              "result are one call); a call left out because it cannot be written is not counted, "
                              "nor a result the source holds without its call (orphanResults).")
    tool_results: Count = Field(default=0, description="Of toolCalls, those that hold their result (ok, error or "
                                "denied).")
    thinking_blocks: Count = Field(default=0, description="Thinking blocks of the messages counted in messages.")
    compactions: Count = Field(default=0, description="Compaction checkpoints the transcript holds from the source.")
    attributed: Count = Field(default=0, description="Subagent / sidechain rows.")
    new_records: Count = Field(default=0, description="Records this import added to the transcript: messages and "
                               "compaction checkpoints (newMessages plus the new checkpoints). A tombstone line "
                               "written with a message (an export's prompt deleted on the first host) is that "
                               "message's state, not a record: not counted.")
    new_messages: Count = Field(default=0, description="Messages this import added to the transcript (a re-import "
                                "of unchanged files adds none).")


class ImportSessionsResult(Result):
    import_id: WireId
    source: str
    root: str
    dry_run: bool
    total: Count = Field(description="Sessions found under the root.")
    counts: ImportCounts
    messages: Count = Field(description="Messages of the sessions imported (or that would be), as their "
                            "transcripts hold them: a record left out because it cannot be written (skippedBlocks) "
                            "is not counted.")
    new_messages: Count = Field(description="Messages this import added (a re-import of unchanged files adds none).")
    hidden_off_branch: Count = Field(description="Messages hidden because the source holds them off its active branch.")
    restored_on_branch: Count = Field(
        description="Messages an earlier import hid that are on the source's active branch again (shown again).")
    unknown_kinds: dict[str, Count] = Field(
        description="Source record kinds the importer does not know, with how often each was skipped.")
    unread_lines: Count = Field(
        default=0, description="Source lines skipped unread in the sessions imported (or that would be): not JSON, "
        "or over the line size limit; each session's files[].badLines / oversizedLines say where.")
    repaired_lines: Count = Field(
        default=0, description="Source lines read with U+FFFD in place of bytes that are not UTF-8 or of a lone "
        "surrogate escape (files[].repairedLines).")
    source_bytes: Count = Field(description="Bytes of source files read.")
    sessions: list[ImportSessionReport] = Field(
        description=f"Per-session reports, refused ones first; at most {MAX_IMPORT_REPORTS}."
    )
    truncated: bool = Field(description="More sessions were reported than `sessions` holds.")


class ImportProgress(Result):
    """``import.progress``: one per session done, and a last one with ``finished: true``."""

    import_id: WireId
    source: str
    root: str
    dry_run: bool
    done: Count
    total: Count
    counts: ImportCounts
    messages: Count
    new_messages: Count = Field(default=0, description="Messages this import added so far.")
    hidden_off_branch: Count = Field(
        default=0, description="Messages hidden so far because the source holds them off its active branch.")
    restored_on_branch: Count = Field(
        default=0, description="Messages an earlier import hid that are on the source's active branch again, so far.")
    unknown_kinds: dict[str, Count] = Field(
        default_factory=dict, description="Source record kinds the importer does not know, skipped so far.")
    unread_lines: Count = Field(default=0, description="Source lines skipped unread so far.")
    repaired_lines: Count = Field(default=0, description="Source lines read with bytes replaced so far.")
    source_bytes: Count
    total_bytes: Count = Field(description="Bytes of every source file found (the progress bar's 100 %).")
    session_id: SessionId | None = Field(default=None, description="The session just done.")
    status: str | None = None
    reason: str | None = None
    finished: bool = False


__all__ = [
    "ImportCounts",
    "ImportProgress",
    "ImportSessionReport",
    "ImportSessionsParams",
    "ImportSessionsResult",
    "ImportSource",
]
