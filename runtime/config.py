"""Host configuration: one frozen object built by the CLI and passed down."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runtime.datadir import DataDir

DEFAULT_PORT = 7777


@dataclass(frozen=True)
class HostConfig:
    data_dir: DataDir
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    rebuild_index: bool = False
    """Quarantine the index at boot and rebuild it from the files, whatever its check says (the restart after
    the running host met a corrupt index: RELIABILITY.md row 7)."""
    allowed_origins: frozenset[str] = field(default_factory=frozenset)
    session_idle_timeout: float = 300.0
    max_sessions_active: int = 2048
    ask_timeout: float = 60.0
    db_batch_limit: int = 512
    db_mailbox: int = 4096
    session_mailbox: int = 512
    session_batch_limit: int = 256
    read_pool_size: int = 12
    # Read connections boot opens (and prepares: ~3 ms of CPU each): sequential reads reuse the newest freed one,
    # so only concurrent reads need more, and they open theirs on first need (all 12 at boot were a third of a
    # new host's database work; the suite's profile).
    read_pool_warm: int = 2
    warm_reads: int = 12  # boot: the newest page of the last-updated session read this often (0: none)
    # Boot's last steps: what boot left alive is collected and frozen (runtime.process.freeze_boot_objects, as
    # `pi-host serve` sets it), then the read warm-up; the collection walks every object and left the
    # warm-up's read path cold when it came after it (a first get over a warm one: 1.31x, 1.21x now; DESIGN.md).
    freeze_boot: bool = False
    faults_spec: str | None = None
    audit_retention_days: int = 90
    # Boot keeps every quarantined copy of a corrupt index, not the newest few (diagnostics: chaos runs).
    keep_quarantined: bool = False
    restart_intensity: int = 20  # core actors (db-writer): past this many restarts per period the host exits
    restart_period: float = 10.0
    # Session actors are many and rebuilt from their files; a burst of session crashes is
    # answered per request (ACTOR_RESTARTED), only a storm this large escalates.
    session_restart_intensity: int = 1000
    synchronous: str | None = None  # None = FULL/NORMAL chosen per batch; "FULL"/"NORMAL" forces one
    # Seconds the DB writer must be idle before it merges search index segments (None = never).
    search_upkeep_after: float | None = 2.0
    # The idle integrity sweep (actors/integrity_sweep.py): a pass over the index, table by table, this many
    # seconds after the last (None = never); each table waits until the DB writer was idle integrity_sweep_after s.
    integrity_sweep_interval: float | None = 3600.0
    integrity_sweep_first: float = 60.0  # the first pass, this many seconds after boot (at most the interval)
    integrity_sweep_after: float = 5.0
    # Seconds between two returns of the heap's free memory to the kernel (runtime.process.release_free_memory;
    # None = never). `pi-host serve` tunes the allocator to reuse large blocks (runtime.process) and sets this.
    memory_trim_interval: float | None = None
    max_frame_bytes: int = 16 * 1024 * 1024
    max_params_bytes: int = 8 * 1024 * 1024
    log_to_stderr: bool = True
    # Appends are acknowledged after their transcript fsync; their index rows may trail by at
    # most this much (bytes of lines, operations) before new appends wait.
    index_lag_bytes: int = 64 * 1024 * 1024
    index_lag_ops: int = 50_000
    # Seconds the DB writer may hold index rows nobody reads yet, to commit more at once (0 = never);
    # a read that needs them, an append waiting for room or any durable request ends the hold at once.
    index_hold: float = 0.05
    # Shutdown: requests in flight get this long to finish; then each actor gets
    # shutdown_grace seconds after its stop request before it is cancelled.
    shutdown_deadline: float = 10.0
    shutdown_grace: float = 5.0
    validate_results: bool = False  # check every result and event payload against its protocol model (tests)
    # Diagnostics: count the trio thread's task steps and I/O waits (host.status.trio; scripts/bench).
    count_task_steps: bool = False
    # A client whose last connection closed is gone once no connection of it came back within this
    # many seconds (a sidecar that reconnects keeps what it took from the turn queue meanwhile).
    client_gone_after: float = 5.0
    # session.inflight previews reach one subscriber at most this often per message (seconds).
    inflight_event_interval: float = 0.25
    # The event backlog clients resume from (events.subscribe with a cursor): at most this many
    # events and about this many bytes of their payloads (the oldest leave first).
    event_backlog: int = 10_000
    event_backlog_bytes: int = 16 * 1024 * 1024
    # host.status warns when the data directory's disk has less free space than this.
    disk_warn_below_bytes: int = 512 * 1024 * 1024
    # Folders attachments.importFile may read besides the session's project and scratch/.
    import_roots: tuple[str, ...] = ()
    # Per connection: encoded bytes waiting for the socket before a client that does not
    # read is closed (1008), and connections that have not said host.hello yet.
    max_outbound_bytes: int = 32 * 1024 * 1024
    max_unauthenticated: int = 128
    # After host.hello the host pings each connection this often and closes (1011) one that sent nothing,
    # not even the pong, for ping_timeout seconds after a ping (None: no pings).
    ping_interval: float | None = 20.0
    ping_timeout: float = 20.0
    # A pi session root (~/.pi/agent/sessions) listed read-only as native-pi:<id> sessions (seed §12); None: none.
    native_pi_root: Path | None = None
