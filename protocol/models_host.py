"""Params and results: host.hello, host.status."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator, model_validator

from .models_common import (
    MAX_TOKEN_CHARS,
    ClientKind,
    Count,
    HelloClientKind,
    Params,
    PluginId,
    Result,
    TimestampMs,
    WireId,
)

# ---------------------------------------------------------------------------
# host.*


class HelloParams(Params):
    token: Annotated[str, StringConstraints(min_length=1, max_length=MAX_TOKEN_CHARS)] = Field(
        description="Contents of <dataDir>/host.token."
    )
    client_id: WireId = Field(description="Stable per client install; keys command receipts.")
    client_kind: HelloClientKind = Field(
        description="Who is calling. `sidecar` (ARCHITECTURE.md's name for the agent sidecar) is the same as "
        "`agent`: the connection is an agent one."
    )
    protocol: int = Field(ge=1, description="Protocol version the client speaks.")
    plugin_id: PluginId | None = Field(
        default=None,
        description="Required with clientKind plugin (and only then): the connection's reads and writes are "
        "scoped to what that plugin owns.",
    )

    @field_validator("client_kind", mode="after")
    @classmethod
    def _one_name_per_kind(cls, kind: HelloClientKind) -> ClientKind:
        return "agent" if kind == "sidecar" else kind

    @model_validator(mode="after")
    def _plugin_identity(self) -> HelloParams:
        if (self.client_kind == "plugin") != (self.plugin_id is not None):
            raise ValueError("pluginId is required with clientKind plugin, and only with it")
        return self


class HelloResult(Result):
    protocol: int
    client_id: str = Field(description="The clientId this connection authenticated with.")
    connection_id: int = Field(description="This connection's number on the host (logs, statistics).")
    host_version: str
    boot_id: str = Field(description="New at every host start: event cursors of another bootId do not resume.")
    server_time: TimestampMs


class StatusParams(Params):
    pass


class ActorStats(Result):
    sessions: Count = Field(description="Live session actors.")
    total: Count = Field(description="All live actors.")
    restarts: Count = Field(description="Restarts since boot.")


class DbWriterStats(Result):
    queue_depth: Count
    peak_depth: Count
    batches: Count
    ops: Count | None = None
    max_batch: Count | None = None
    full_commits: Count | None = None
    normal_commits: Count | None = None
    search_upkeep_steps: Count | None = Field(
        default=None, description="Idle merge steps of the search index since start (store/search/search_upkeep.py)."
    )
    integrity_checks: Count | None = Field(
        default=None, description="Tables the idle integrity sweep checked since start (`serve --integrity-sweep`)."
    )
    integrity_passes: Count | None = Field(
        default=None, description="Whole passes of the idle integrity sweep since start."
    )


class BootReport(Result):
    """What boot recovery found and repaired. Keys may grow."""

    duration_ms: Count | None = None
    clean_shutdown: bool | None = None
    sessions_scanned: Count | None = None
    index_rows_added: Count | None = None
    index_rows_removed: Count | None = None
    torn_tails: Count | None = None
    inflight_promoted: Count | None = None
    turns_aborted: Count | None = None
    temp_files_removed: Count | None = None
    native_fork_staging_removed: Count | None = Field(
        default=None, description="Only with --native-pi-root: staging files of native forks killed before they "
        "finished, removed from the pi session folders (also counted in tempFilesRemoved)."
    )
    db_rebuilt: bool | None = None
    secrets_meta_rebuilt: Count | None = Field(
        default=None, description="secrets_meta rows restored from the secrets/*.sec file headers."
    )
    salvaged: dict[str, Count] | None = Field(
        default=None,
        description="Only after an index quarantined as corrupt: DB-only rows copied from the quarantined file "
        "into the rebuilt index, by table (tables with none left out); `salvage` holds the details.",
    )
    salvage_skipped: dict[str, Count] | None = Field(
        default=None,
        description="Only after an index quarantined as corrupt: rows of the quarantined file not copied, by "
        "table (a text value not UTF-8, JSON that does not parse, a reference to a session or row the rebuild "
        "does not have), plus one for each stretch of a table's pages that failed to read (its rows are lost; "
        "the rows on both sides of it are copied).",
    )
    quarantine_pruned: Count | None = Field(
        default=None,
        description="Older quarantined copies of a corrupt index deleted at this boot: `quarantine/` keeps the "
        "newest 3 (each is as large as the index), never one whose salvage is still owed.",
    )
    salvage: dict[str, Any] | None = Field(
        default=None,
        description="Only after an index quarantined as corrupt: the salvage's details (`copied`, `skipped` by "
        "reason, `errors`, `notSalvaged` with its reason, or `failed`).",
    )
    wal_fold: dict[str, Any] | None = Field(
        default=None,
        description="The boot's fold of the index's write-ahead log into the database: `walBytes`, `growth`, "
        "`free` and `folded` (a start without room for `growth` fails STORAGE_FULL, exit status 5).",
    )
    merges_deferred: bool | None = Field(
        default=None,
        description="True while the search index's merges are deferred for want of disk room (each commit adds "
        "its own segment; idle merges fold them in bounded steps) until a start finds room.",
    )
    inflight: dict[str, Any] | None = Field(
        default=None,
        description="The in-flight checkpoint sweep: `promoted` (count) and `promotedIds`, `removed`, "
        "`quarantined`, `errors`; a streaming row settled without a checkpoint is listed with "
        "`from: \"reservation\"`.",
    )
    retention: dict[str, Any] | None = Field(
        default=None,
        description="Rows pruned at this boot: `auditPruned` (audit rows older than --audit-retention-days, 90 "
        "by default), `taskRunsPruned` (beyond the newest 100 per task), `notificationsPruned` (beyond the newest "
        "200).",
    )
    scratch_swept: Count | None = Field(
        default=None,
        description="Folders of sessions that no longer exist removed from `review-changes/` and `scratch/`.",
    )
    scratch_not_swept: list[dict[str, Any]] | None = Field(
        default=None,
        description="Present when not empty: each entry the sweep left, `{path, reason}` (not a folder, or one "
        "that failed to go); boot goes on either way.",
    )


class PipelineStats(Result):
    in_flight: Count = Field(description="Requests submitted and not yet answered.")
    running: Count = Field(description="Receipt claims whose first attempt is still running.")
    pinned: Count = Field(description="Completed receipts held in memory until the index covers them.")
    recent: Count = Field(description="Completed receipts remembered for fast replays.")


class LoginCodeParams(Params):
    pass


class LoginCodeResult(Result):
    """A one-time code the browser inspector exchanges for the token (``POST /login``)."""

    code: str = Field(description="Valid once, for expiresInMs.")
    expires_in_ms: Count
    url: str = Field(description="The inspector with the code in its fragment (never sent to a server; "
                     "the page removes it from the address bar at once).")


class IndexStats(Result):
    """How far the index trails acknowledged appends (the read barrier's bookkeeping)."""

    acknowledged: Count = Field(description="Appends acknowledged since start (host-wide sequence).")
    covered: Count = Field(description="Highest sequence the index's committed batches cover.")
    lag_ops: Count
    lag_bytes: Count
    max_lag_ops: Count = Field(description="The largest lag seen since start.")
    max_lag_bytes: Count
    read_waits: Count = Field(description="Reads that waited for the index to cover earlier appends.")
    append_stalls: Count = Field(description="Appends that waited because the lag reached its bound.")
    bound_ops: Count = Field(description="The lag bound: appends wait beyond it.")
    bound_bytes: Count


class DiskStats(Result):
    free_bytes: Count = Field(description="Bytes an unprivileged writer can still use on the data directory's disk.")
    total_bytes: Count
    warn_below_bytes: Count = Field(description="The threshold (serve --disk-warn-below, default 512 MiB).")
    warning: bool = Field(description="freeBytes is under the threshold: writes may soon be STORAGE_FULL.")


class GatewayStats(Result):
    connections: Count
    unauthenticated: Count = Field(description="Connections that have not said host.hello yet.")
    evicted_unauthenticated: Count = Field(description="Silent connections closed to admit newer ones.")
    slow_consumer_closes: Count
    keepalive_closes: Count = Field(
        description="Connections closed (1011) for sending nothing, not even a pong, after a ping.")
    outbound_bytes: Count = Field(description="Encoded bytes waiting for sockets, all connections.")
    peak_outbound_bytes: Count
    oversized_replies: Count = Field(description="Replies answered PAYLOAD_TOO_LARGE by the reply caps.")


class TrioStats(Result):
    """The trio thread's hand-offs since start (only with ``serve --count-task-steps``, a diagnostic)."""

    task_steps: Count = Field(description="Task steps run (each one a task switch on the trio thread).")
    io_waits: Count = Field(description="Passes of trio's run loop through its I/O wait (epoll_wait).")


class StatusResult(Result):
    version: str
    boot_id: str
    started_at: TimestampMs
    uptime_ms: Count
    actors: ActorStats
    db_writer: DbWriterStats
    pipeline: PipelineStats
    index: IndexStats | None = None
    data_dir_bytes: Count
    disk: DiskStats | None = None
    gateway: GatewayStats | None = None
    trio: TrioStats | None = Field(default=None, description="Only with serve --count-task-steps.")
    boot: BootReport


__all__ = [
    "ActorStats",
    "BootReport",
    "DbWriterStats",
    "DiskStats",
    "GatewayStats",
    "HelloParams",
    "LoginCodeParams",
    "LoginCodeResult",
    "HelloResult",
    "IndexStats",
    "PipelineStats",
    "StatusParams",
    "StatusResult",
    "TrioStats",
]
