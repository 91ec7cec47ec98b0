"""Session export: Markdown, one self-contained HTML page, or this host's JSONL (seed 003 §10.4).

The export streams: messages are read window by window from the transcript
through their index spans (``messages.line_offset``), tombstoned ones left
out, so memory does not grow with the session. Checkpoints are placed right
after their ``throughMessageId``; the turns' run environment snapshots
(verified against their digests) close the export.

A checkpoint whose ``throughMessageId`` is tombstoned stays valid (the
message is still in the transcript: ``session.get`` and ``session.context``
keep serving it), so it is exported too, where that message stood: after the
nearest exported message before it, or before every message when there is
none. The export holds no tombstoned message, so the record's references to
tombstoned messages move onto exported ones and the JSONL reads back to the
same model context: ``throughMessageId`` names that nearest message before
(kept as it is when there is none), ``firstKeptMessageId`` the nearest
exported message at or after it, and ``retainedTail`` leaves a tombstoned
message out (as ``session.context`` does).

**Secrets are excluded by default** (seed 003 §10.4): every credential
reference (``credentialRef(s)``/``secretRef(s)`` keys) is removed, the value
of any key that names a secret (``apiKey``, ``token``, ``password``... the
run-snapshot rule of :func:`store.snapshots.is_secret_key`) is replaced by
``[redacted]``, and every occurrence of a value the secret store holds
(``secret_values``, decrypted by the caller: :func:`secret_values`) is
replaced in any string — message text, tool arguments and results, metadata,
checkpoints, snapshots. The caller adds the host's own bearer token to those
values (:func:`host_token`: a token a tool read into a transcript, or pasted),
so it is redacted by its exact value; other text merely shaped like it (a
``sha256`` a user typed, a content address) is exported as written.
``include_secrets`` turns all of that off. Thinking blocks are left out
unless ``include_thinking``.

The JSONL form is the transcript format (docs/DESIGN.md): a ``session``
header, a ``session_info`` line, the message and compaction lines (a message
written under another project root than the session's now preceded by a bare
``session_info`` line naming that root, as a rewrite writes them: ``_RootLines``), one
``environment`` line per snapshot (a line kind readers skip), then the
session's archived regenerate/edit branches (seed 003 §4.9) as the revisions
file holds them: one ``revision`` (a branch stored in full) or
``revision_live`` (a reference to the live suffix) line per
``(rootUserId, revisionIndex)``, its newest line (:func:`archived_lines`; a tombstoned prompt that roots one
of these families is carried content-free, in the transcript and as a branch's root: :func:`withheld`),
one ``turn`` line per ended turn (its status, model, token counts, cost
and usage report: what ``usage.*`` sums), one ``artifact`` line per artifact row of the session
(``{"type": "artifact", "path", "op", "turnId", "updatedAt"}``, oldest first: ``artifacts.list``'s rows, those
whose Write/Edit line a cut took out of every file included, which no line of the export gives back), then the
bytes it carries
(:func:`write_carried`): ``blob`` lines with the bytes of every attachment its
blocks (archived branches' included) refer to, a part of :data:`BLOB_CHUNK`
bytes each (one ``evicted`` line for a blob this host no longer holds), and one
``review_snapshot`` line per review snapshot of the session. An older reader
counts the new kinds as unknown line kinds and skips them. It imports back with
the ``pi-host`` importer (:mod:`store.interchange.importers.carried` verifies
and stores the bytes). Rendering of Markdown and HTML lives in
:mod:`store.interchange.export_render`.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import io
import logging
import os
import re
import secrets
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import orjson

from store import artifacts, review
from store.attachments import AttachmentFiles, blob_refs, blob_row, mark_evicted_blocks
from store.config.secrets import SecretStore, list_meta
from store.errors import Conflict, CorruptData, InvalidInput, NotFound, PayloadTooLarge, classify_os_error
from store.fsutil import fsync_dir, open_nofollow
from store.indexing import index
from store.jsonio import dumps_line, loads_line, now_rfc3339
from store.revisions import (
    ARTIFACT,
    PAGER_KEYS,
    REVISION,
    REVISION_LIVE,
    ROOTS,
    entry_of_line,
    family_of,
    roots_field,
    roots_of,
)
from store.rules import TURN_ENDED
from store.snapshots import is_secret_key, load_snapshot
from store.transcripts.records import Root, root_line, root_named, wire_record
from store.transcripts.session_files import REVISIONS_SUFFIX
from store.transcripts.transcript import MAX_LINE_BYTES, bounded_lines, read_spans

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "FORMATS",
    "Carried",
    "InlineBuffer",
    "export_to_new_file",
    "ExportOptions",
    "ExportReport",
    "Redactor",
    "export_records",
    "export_session",
    "host_token",
    "secret_values",
]

FORMATS = ("md", "html", "jsonl")
REDACTED = "[redacted]"
REF_KEYS = frozenset({"credentialref", "credentialrefs", "secretref", "secretrefs"})
MIN_SECRET_CHARS = 4
MIN_HOST_TOKEN_CHARS = 32
"""``runtime/boot.py:load_or_create_token`` replaces a shorter ``host.token``: it is not the token."""
WINDOW = 256
READ_BYTES = 4 * 1024 * 1024
"""At most this many bytes of transcript lines are read at once (one line more when a single line is larger):
a window of 256 rows can hold 256 large messages, and the export's memory must not grow with them."""
LIVE = "deleted = 0 AND line_offset IS NOT NULL"
"""A message row the export writes (``SessionView.records``)."""


@dataclass(frozen=True)
class ExportOptions:
    format: str = "md"
    include_thinking: bool = False
    include_secrets: bool = False
    secret_values: tuple[str, ...] = ()
    """Values the secret store holds and the host's own token (:func:`host_token`); any occurrence is
    replaced (ignored with ``include_secrets``)."""
    attachments: AttachmentFiles | None = None
    """HTML only: image bytes to inline as data: URIs (never a network fetch)."""
    max_inline_image_bytes: int = 2 * 1024 * 1024
    exported_at_ms: int = 0
    review_dir: Path | None = None
    """JSONL: the session's ``review-changes/<sessionId>/``, whose snapshots the export carries."""


@dataclass
class ExportReport:
    format: str
    messages: int = 0
    compactions: int = 0
    environments: int = 0
    redactions: int = 0
    thinking_omitted: int = 0
    bytes: int = 0
    unreadable_lines: int = 0
    blobs: int = 0
    """JSONL: attachment blobs whose bytes the export carries (``blob`` lines)."""
    blobs_evicted: int = 0
    """JSONL: referenced blobs this host no longer holds, exported as evicted."""
    review_snapshots: int = 0
    review_unreadable: int = 0
    """JSONL: review snapshots left out because their ``meta.json`` or ``before`` bytes no longer read back."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": self.format, "messages": self.messages, "compactions": self.compactions,
                               "environments": self.environments, "redactions": self.redactions,
                               "thinkingOmitted": self.thinking_omitted, "bytes": self.bytes}
        if self.unreadable_lines:
            out["unreadableLines"] = self.unreadable_lines
        out.update(_carried_counts(self))
        return out


def _carried_counts(report: ExportReport) -> dict[str, int]:
    """The JSONL export's carried bytes, keys left out when zero (``blobs``, ``blobsEvicted``,
    ``reviewSnapshots``, ``reviewUnreadable``)."""
    counts = {"blobs": report.blobs, "blobsEvicted": report.blobs_evicted,
              "reviewSnapshots": report.review_snapshots, "reviewUnreadable": report.review_unreadable}
    return {key: value for key, value in counts.items() if value}


def secret_values(conn: sqlite3.Connection, store: SecretStore) -> tuple[str, ...]:
    """Every value the secret store holds (a tampered entry is skipped: it cannot leak what it cannot decrypt)."""
    out: list[str] = []
    for meta in list_meta(conn):
        try:
            out.append(store.get(str(meta["ref"])).value)
        except (NotFound, CorruptData):
            continue
    return tuple(out)


def host_token(path: Path) -> tuple[str, ...]:
    """The host's bearer token from ``host.token`` (its trailing newline is not part of it), to redact by
    its exact value; none when the file is missing or not a token (the host replaces such a file at boot)."""
    try:
        token = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ()
    return (token,) if len(token) >= MIN_HOST_TOKEN_CHARS else ()


def _norm(key: str) -> str:
    return key.replace("-", "").replace("_", "").lower()


class Redactor:
    """Removes credential references and secret values from any JSON value (see the module doc)."""

    def __init__(self, values: Iterable[str], *, enabled: bool = True) -> None:
        self.enabled = enabled
        wanted = sorted({v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET_CHARS}, key=len,
                        reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in wanted)) if wanted else None
        self.count = 0

    def text(self, value: str) -> str:
        if not self.enabled:
            return value
        if self._pattern is None:
            return value
        out, n = self._pattern.subn(REDACTED, value)
        self.count += n
        return out

    def value(self, value: Any) -> Any:
        if not self.enabled:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, Mapping):
            out: dict[str, Any] = {}
            for key, inner in value.items():
                if _norm(str(key)) in REF_KEYS:  # left out either way; counted when it referred to something
                    if inner is not None and inner != "" and inner != [] and inner != {}:
                        self.count += 1
                    continue
                if isinstance(inner, str) and inner and is_secret_key(str(key), credential_section=False):
                    out[key] = REDACTED
                    self.count += 1
                    continue
                out[key] = self.value(inner)
            return out
        return value


# --------------------------------------------------------------------------- reading the session


@dataclass
class SessionView:
    """What an export reads: the session row, then messages with their checkpoints, then environments."""

    row: dict[str, Any]
    path: Path
    conn: sqlite3.Connection
    checkpoints: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    families: frozenset[str] = frozenset()
    """JSONL: the families the export's archived branches are keyed by (:func:`archived_families`): a
    tombstoned user message rooting one of them is exported content-free (:func:`withheld`)."""
    roots: tuple[list[int], list[Root]] = ([], [])
    """JSONL: offsets of the transcript's ``session_info`` lines that name a project root, and those roots
    (:func:`positional_roots`): the root each exported line was written under (``records.Root``)."""
    unreadable: int = 0
    """Indexed lines that no longer parse (bit rot, an outside edit): left out and counted, never fatal
    (RELIABILITY rule 3: readers skip a bad mid-file line; it is reported, never silently dropped)."""

    def _parsed(self, raw: bytes) -> dict[str, Any] | None:
        try:
            return loads_line(raw)
        except ValueError:
            self.unreadable += 1
            return None

    def records(self) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]], Root | None]]:
        """(message record, the checkpoints whose boundary it is, the root its line stands under), in transcript
        order, tombstoned ones out."""
        sid = self.row["id"]
        total = self.row["messageCount"]
        start = 0
        carried: list[dict[str, Any]] = []  # the checkpoints after an unreadable line: after the next message
        rooted: set[str] = set()  # the families a user message exported so far roots (find_root: the first)
        while start < total:
            window = index.window_rows(self.conn, sid, start, start + WINDOW)
            if not window:
                break
            # the rows LIVE selects, and the tombstoned ones when an archived branch may be keyed by one
            live = [r for r in window if r[2] is not None and (not r[4] or self.families)]
            for row, raw in self._lines(live):
                parsed = self._parsed(raw) if not row[4] else _quietly_parsed(raw)
                if parsed is None:
                    if not row[4]:
                        carried.extend(self.checkpoints.pop(row[1], []))
                    continue
                if parsed.get("role") == "user":
                    family = family_of(parsed)
                    if row[4]:
                        if family in rooted or not ({family, str(parsed.get("id"))} & self.families):
                            continue
                        rooted.add(family)
                        yield withheld(parsed), [], self._root_at(row[2])
                        continue
                    rooted.add(family)
                elif row[4]:
                    continue
                record = mark_evicted_blocks(self.conn, parsed)  # seed 000 §2.3, as session.get
                yield record, [*carried, *self.checkpoints.pop(row[1], [])], self._root_at(row[2])
                carried = []
            start = window[-1][0]

    def _root_at(self, offset: int) -> Root | None:
        """The root a line at ``offset`` stands under: the nearest root-naming ``session_info`` line's before it
        (None: no such line precedes it, or :attr:`roots` was not read)."""
        offsets, roots = self.roots
        at = bisect.bisect_left(offsets, offset)
        return roots[at - 1] if at else None

    def _lines(self, rows: list[tuple[Any, ...]]) -> Iterator[tuple[tuple[Any, ...], bytes]]:
        """(row, its transcript line) for each row, read :data:`READ_BYTES` at a time."""
        batch: list[tuple[Any, ...]] = []
        held = 0
        for row in [*rows, None]:
            if batch and (row is None or held + row[3] > READ_BYTES):
                yield from zip(batch, read_spans(self.path, [(r[2], r[3]) for r in batch]), strict=True)
                batch, held = [], 0
            if row is not None:
                batch.append(row)
                held += row[3]

    def load_checkpoints(self) -> int:
        """Every valid checkpoint (``index.compaction_rows``, as ``session.get``), under the id of the
        exported message it follows (``""``: before every message), re-anchored (see the module doc)."""
        rows = index.compaction_rows(self.conn, self.row["id"])
        for _row, raw in zip(rows, read_spans(self.path, [(r[2], r[3]) for r in rows]), strict=True):
            parsed = self._parsed(raw)
            if parsed is None:
                continue
            after, record = self._re_anchored(parsed)
            self.checkpoints.setdefault(after, []).append(record)
        return len(rows)

    def _re_anchored(self, record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the exported message ``record`` follows, ``""`` for none; the record with its references to
        tombstoned messages moved onto exported ones)."""
        out = dict(record)
        after = ""
        through = record.get("throughMessageId")
        seq = self._seq(through)
        if seq is not None:
            after = self._live_near(seq, before=True) or ""
            if after:
                out["throughMessageId"] = after
        first = record.get("firstKeptMessageId")
        seq = self._seq(first)
        if seq is not None and (kept := self._live_near(seq, before=False)) is not None:
            out["firstKeptMessageId"] = kept
        tail = record.get("retainedTail")
        if isinstance(tail, list):
            gone = self._tombstoned([m["id"] for m in tail if isinstance(m, Mapping) and isinstance(m.get("id"), str)])
            if gone:
                out["retainedTail"] = [m for m in tail if not (isinstance(m, Mapping) and m.get("id") in gone)]
        return after, out

    def live_message(self, message_id: str, *, deleted: bool = False) -> dict[str, Any] | None:
        """The transcript's record of ``message_id`` when the export holds it (indexed, not tombstoned);
        ``deleted``: when it is indexed and tombstoned instead."""
        state = LIVE if not deleted else "deleted = 1 AND line_offset IS NOT NULL"
        hit = self.conn.execute(
            f"SELECT line_offset, line_len FROM messages WHERE session_id = ? AND id = ? AND {state}",
            (self.row["id"], message_id)).fetchone()
        if hit is None or hit[0] is None:
            return None
        return self._parsed(read_spans(self.path, [(int(hit[0]), int(hit[1]))])[0])

    def _seq(self, message_id: Any) -> int | None:
        if not isinstance(message_id, str):
            return None
        hit = self.conn.execute("SELECT seq FROM messages WHERE session_id = ? AND id = ?",
                                (self.row["id"], message_id)).fetchone()
        return None if hit is None else int(hit[0])

    def _live_near(self, seq: int, *, before: bool) -> str | None:
        """The exported message at ``seq``, else the nearest one before it (``before``) or after it."""
        sql = (f"SELECT id FROM messages WHERE session_id = ? AND seq <= ? AND {LIVE} ORDER BY seq DESC LIMIT 1"
               if before else
               f"SELECT id FROM messages WHERE session_id = ? AND seq >= ? AND {LIVE} ORDER BY seq LIMIT 1")
        hit = self.conn.execute(sql, (self.row["id"], seq)).fetchone()
        return None if hit is None else str(hit[0])

    def deleted_since(self, messages: Iterable[Mapping[str, Any]]) -> set[str]:
        """Of an archived branch's ``messages``, those that are one node with a tombstoned message of the
        transcript (the same id, role and blocks: the prompt a regenerate's replies share, deleted after
        this branch left). A switch restores them deleted (``_settle_deletions``), so they are deleted."""
        held = {str(m["id"]): m for m in messages if isinstance(m.get("id"), str)}
        out: set[str] = set()
        for mid in self._tombstoned(list(held)):
            live = self.live_message(mid, deleted=True)
            if live is not None and (live.get("role"), live.get("blocks")) == (held[mid].get("role"),
                                                                               held[mid].get("blocks")):
                out.add(mid)
        return out

    def _tombstoned(self, ids: list[str]) -> frozenset[str]:
        if not ids:
            return frozenset()
        marks = ", ".join("?" * len(ids))
        return frozenset(str(r[0]) for r in self.conn.execute(
            f"SELECT id FROM messages WHERE session_id = ? AND deleted = 1 AND id IN ({marks})",
            (self.row["id"], *ids)))

    def turns(self) -> Iterator[dict[str, Any]]:
        """The session's ended turns as exported (``turn`` lines): what ``usage.*`` and ``session.listTurns``
        read of each (seed 003 §4.6), the turn still running left out (it has no usage yet). A stored usage
        report that no longer parses is left out of its line, its promoted counts kept."""
        for (tid, status, provider, model, error, tin, tout, usage_json, micros, started, ended,
             retry_of) in self.conn.execute(
                "SELECT id, status, provider_id, model_id, error_code, input_tokens, output_tokens, usage_json, "
                "cost_micros, started_at, ended_at, retry_of FROM turns WHERE session_id = ? AND status IN "
                f"({', '.join('?' * len(TURN_ENDED))}) ORDER BY started_at, id", (self.row["id"], *TURN_ENDED)):
            out: dict[str, Any] = {"type": "turn", "id": tid, "status": status}
            for key, value in (("providerId", provider), ("modelId", model), ("errorCode", error),
                               ("retryOf", retry_of)):
                if value is not None:
                    out[key] = value
            out.update({"inputTokens": tin or 0, "outputTokens": tout or 0, "costMicros": micros or 0})
            try:
                usage = orjson.loads(usage_json) if usage_json else None
            except orjson.JSONDecodeError:
                usage = None
            if isinstance(usage, dict):
                out["usage"] = usage
            out["startedAt"] = now_rfc3339(int(started or 0))
            if ended is not None:
                out["endedAt"] = now_rfc3339(int(ended))
            yield out

    def environments(self) -> Iterator[dict[str, Any]]:
        for (turn_id,) in self.conn.execute(
                "SELECT t.id FROM turns t JOIN run_snapshots s ON s.turn_id = t.id WHERE t.session_id = ? "
                "ORDER BY t.started_at, t.id", (self.row["id"],)).fetchall():
            snap = load_snapshot(self.conn, turn_id)
            yield {"turnId": turn_id, "digest": snap["digest"], "snapshot": snap["snapshot"]}


def _quietly_parsed(raw: bytes) -> dict[str, Any] | None:
    """A tombstoned message's line, read only to see whether a branch is keyed by it: one that no longer
    parses is left out as every tombstoned line was, not counted as an exported line lost."""
    try:
        return loads_line(raw)
    except ValueError:
        return None


def withheld(record: Mapping[str, Any]) -> dict[str, Any]:
    """A tombstoned message as a JSONL export carries it when an archived branch is keyed by it: content-free
    (its id, role, ``createdAt``, its pager stamp and ``deleted: true``; no blocks, no other meta: no deleted
    message's content leaves the host). Its place in the export is its place in the transcript."""
    out: dict[str, Any] = {"type": "message", "id": record.get("id"), "role": record.get("role")}
    if isinstance(record.get("createdAt"), str):
        out["createdAt"] = record["createdAt"]
    meta = record.get("meta")
    stamp = {k: meta[k] for k in PAGER_KEYS if k in meta} if isinstance(meta, Mapping) else {}
    if stamp:
        out["meta"] = stamp
    out["deleted"] = True
    return out


def is_withheld(record: Mapping[str, Any]) -> bool:
    """A content-free record of a tombstoned message (:func:`withheld`)."""
    return record.get("deleted") is True and "blocks" not in record


def prepare_record(record: Mapping[str, Any], options: ExportOptions, redactor: Redactor,
                   report: ExportReport) -> dict[str, Any]:
    """The record as exported: receipt stripped, thinking dropped unless asked, secrets out."""
    out = wire_record(record)
    blocks = out.get("blocks")
    if isinstance(blocks, list) and not options.include_thinking:
        out["blocks"] = _without_thinking(blocks, report)
    return dict(redactor.value(out))


def _without_thinking(blocks: list[Any], report: ExportReport) -> list[Any]:
    kept = [b for b in blocks if not (isinstance(b, Mapping) and b.get("type") == "thinking")]
    report.thinking_omitted += len(blocks) - len(kept)
    return kept


def prepare_checkpoint(checkpoint: Mapping[str, Any], options: ExportOptions, redactor: Redactor,
                       report: ExportReport) -> dict[str, Any]:
    """A compaction checkpoint as exported: like a message, its thinking is left out unless asked, in its
    retained messages and in ``details.retainedReasoning`` (prior thinking turns), and secrets are out."""
    out = dict(checkpoint)
    if not options.include_thinking:
        tail = out.get("retainedTail")
        if isinstance(tail, list):
            out["retainedTail"] = [
                {**m, "blocks": _without_thinking(m["blocks"], report)}
                if isinstance(m, Mapping) and isinstance(m.get("blocks"), list) else m for m in tail]
        details = out.get("details")
        reasoning = details.get("retainedReasoning") if isinstance(details, Mapping) else None
        if isinstance(details, Mapping) and isinstance(reasoning, list):
            entries: list[Any] = []
            for entry in reasoning:
                if isinstance(entry, Mapping) and isinstance(entry.get("blocks"), list):
                    entry = {**entry, "blocks": _without_thinking(entry["blocks"], report)}
                elif isinstance(entry, Mapping) and "thinking" in entry:
                    report.thinking_omitted += 1
                    entry = {k: v for k, v in entry.items() if k != "thinking"}
                    if not entry:
                        continue
                entries.append(entry)
            out["details"] = {**details, "retainedReasoning": entries}
    return dict(redactor.value(out))


REVISION_KEYS = ("type", "rootUserId", "revisionIndex", "createdAt")
"""What an exported archived branch keeps of its revisions line besides ``messages``/``compactions``
(``revision``) or ``messageCount`` (``revision_live``): the host's turn ids, the receipts of deletes and an
earlier import's provenance stay on the host."""


def archived_lines(path: Path, view: SessionView | None = None) -> Iterator[dict[str, Any]]:
    """The newest line of each ``(rootUserId, revisionIndex)`` of the revisions file ``path`` (seed 003 §4.9),
    in key order, as exported: a ``revision`` line without the messages that are deleted (those its
    ``deleted`` names, and one it shares with the transcript that is tombstoned there: the export holds no
    deleted message's content) but its root, which keys it, carried content-free (:func:`withheld`), and
    without its host-side keys (:data:`REVISION_KEYS`); a ``revision_live`` reference with its
    ``messageCount``. A missing file has none. Memory stays bounded: a first pass keeps only each key's newest
    span, then the lines are read :data:`READ_BYTES` at a time (one line more when a single line is larger), as
    the transcript's are. A line that no longer parses is counted in ``view``."""
    fd = _open_revisions(path)
    if fd is None:
        return
    try:
        newest = _newest_spans(fd)
        spans = [newest[key] for key in sorted(newest)]
        batch: list[tuple[int, int]] = []
        held = 0
        for span in [*spans, None]:
            if batch and (span is None or held + span[1] > READ_BYTES):
                for raw in read_spans(path, batch, fd=fd):
                    try:
                        rec = loads_line(raw)
                    except ValueError:
                        if view is not None:
                            view.unreadable += 1
                        continue
                    yield _archived(rec, view)
                batch, held = [], 0
            if span is not None:
                batch.append(span)
                held += span[1]
    finally:
        os.close(fd)


def archived_families(path: Path) -> frozenset[str]:
    """The families (``rootUserId``) the archived branches of the revisions file ``path`` are keyed by."""
    fd = _open_revisions(path)
    if fd is None:
        return frozenset()
    try:
        return frozenset(root for root, _ in _newest_spans(fd))
    finally:
        os.close(fd)


def positional_roots(path: Path) -> tuple[list[int], list[Root]]:
    """(offsets, roots) of the transcript ``path``'s ``session_info`` lines that name a project root
    (``records.root_named``), in file order: what :meth:`SessionView._root_at` looks a line's root up in. One
    pass over the file, a line at a time (only the lines naming ``session_info`` are parsed); memory holds one
    entry per such line. A missing file has none."""
    offsets: list[int] = []
    roots: list[Root] = []
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return offsets, roots
    except OSError as exc:
        raise classify_os_error(exc, f"read {path}") from exc
    try:
        for start, _end, line, _ in bounded_lines(fd, 0, os.fstat(fd).st_size, limit=MAX_LINE_BYTES):
            if not line or b'"session_info"' not in line:
                continue
            try:
                rec = loads_line(line[:-1])
            except ValueError:
                continue
            root = root_named(rec) if rec.get("type") == "session_info" else None
            if root is not None:
                offsets.append(start)
                roots.append(root)
    finally:
        os.close(fd)
    return offsets, roots


def _open_revisions(path: Path) -> int | None:
    try:
        return open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise classify_os_error(exc, f"read revisions {path}") from exc


def _newest_spans(fd: int) -> dict[tuple[str, int], tuple[int, int]]:
    """``(offset, length)`` of the newest line of each key of an open revisions file."""
    newest: dict[tuple[str, int], tuple[int, int]] = {}
    for start, end, line, _ in bounded_lines(fd, 0, os.fstat(fd).st_size, limit=MAX_LINE_BYTES):
        if not line:  # a torn tail or an over-long line: never a branch
            continue
        entry = entry_of_line(line[:-1])
        if entry is not None:
            newest[entry.key] = (start, end - start)
    return newest


def _archived(rec: Mapping[str, Any], view: SessionView | None = None) -> dict[str, Any]:
    out = {k: rec[k] for k in REVISION_KEYS if k in rec}
    if rec.get("type") == REVISION_LIVE:
        if "messageCount" in rec:
            out["messageCount"] = rec["messageCount"]
        return out
    raw = rec.get("deleted")
    gone = {d for d in raw if isinstance(d, str)} if isinstance(raw, list) else set()
    messages = [m for m in rec.get("messages") or () if isinstance(m, Mapping)]
    first = messages[0] if messages else None
    if view is not None and first is not None and first.get("role") == "user" and first.get("id") in gone:
        # the prompt a regenerate's reply branches share: deleted when this branch left, but the live transcript
        # shows that same prompt now (restored since): its state is the live one (a switch restores it so), and
        # without it the branch would lose its prompt on the copy
        live = view.live_message(str(first["id"]))
        if live is not None and (live.get("role"), live.get("blocks")) == (first.get("role"), first.get("blocks")):
            gone.discard(str(first["id"]))
    if view is not None:  # deleted after this branch left, in the transcript (the prompt it shares with it)
        gone |= view.deleted_since(messages)
    # a deleted message is left out, but the branch's root, which keys it: that one is carried content-free
    kept: list[Mapping[str, Any]] = []
    for m in messages:
        if m.get("id") not in gone:
            kept.append(m)
        elif m is first and m.get("role") == "user":
            kept.append(withheld(m))
    out["messages"] = kept
    if changes := roots_field(kept, roots_of(rec)):  # the root each message stood under (store.revisions.ROOTS)
        out[ROOTS] = changes
    comps = rec.get("compactions")
    if isinstance(comps, list) and comps:
        out["compactions"] = comps
    return out


def prepare_revision(branch: Mapping[str, Any], options: ExportOptions, redactor: Redactor,
                     report: ExportReport) -> dict[str, Any]:
    """An archived branch as exported: its messages and checkpoints as the transcript's are
    (:func:`prepare_record`, :func:`prepare_checkpoint`)."""
    out = dict(branch)
    if out.get("type") == REVISION:
        out["messages"] = [prepare_record(m, options, redactor, report) for m in out.get("messages") or ()]
        if "compactions" in out:
            out["compactions"] = [prepare_checkpoint(c, options, redactor, report) for c in out["compactions"]]
    return dict(redactor.value(out))


def export_session(conn: sqlite3.Connection, transcript: Path, session_id: str, out: BinaryIO,
                   options: ExportOptions) -> ExportReport:
    """Write one session to ``out`` in ``options.format``. The index must cover the transcript."""
    _check_format(options)
    row = index.require_session(conn, session_id)
    view = SessionView(row, transcript, conn)
    view.load_checkpoints()
    if options.format == "jsonl":  # the root each line was written under (the export's positional root lines)
        view.roots = positional_roots(transcript)
    revisions = transcript.with_name(f"{session_id}{REVISIONS_SUFFIX}")
    if options.format == "jsonl" and conn.execute(
            "SELECT 1 FROM messages WHERE session_id = ? AND deleted = 1 AND role = 'user' LIMIT 1",
            (session_id,)).fetchone() is not None:
        view.families = archived_families(revisions)  # a tombstoned prompt may key an archived branch
    session = index.public_session(row)
    session["messageCount"] = conn.execute("SELECT COUNT(*) FROM messages WHERE session_id = ? AND deleted = 0",
                                           (session_id,)).fetchone()[0]
    orphans = view.checkpoints.pop("", [])
    carried = Carried(conn, options.attachments, options.review_dir) if options.format == "jsonl" else None
    report = export_records(session, view.records(), orphans, view.environments(), out, options,
                            archived=archived_lines(revisions, view), turns=view.turns(), carried=carried,
                            artifact_rows=artifacts.session_rows(conn, session_id) if options.format == "jsonl" else ())
    report.unreadable_lines = view.unreadable
    return report


def export_records(session: Mapping[str, Any],
                   records: Iterable[tuple[dict[str, Any], list[dict[str, Any]], Root | None]],
                   orphan_checkpoints: Iterable[Mapping[str, Any]], environments: Iterable[Mapping[str, Any]],
                   out: BinaryIO, options: ExportOptions, archived: Iterable[Mapping[str, Any]] = (),
                   turns: Iterable[Mapping[str, Any]] = (), *, carried: Carried | None = None,
                   artifact_rows: Iterable[Mapping[str, Any]] = ()) -> ExportReport:
    """The export of any session view: its summary, (message, the checkpoints after it, the root its line was
    written under) in order, checkpoints without a boundary, then run environments (a native pi session has
    none), then (JSONL only) the archived branches ``archived`` yields (:func:`archived_lines`) and the turns
    ``turns`` yields (``SessionView.turns``) and one ``artifact`` line per row of ``artifact_rows`` (the session's
    artifact rows, ``store.artifacts.session_rows``); a JSONL export given ``carried`` ends with the bytes its
    blocks (the archived branches' included) refer to and the session's review snapshots (:func:`write_carried`)."""
    _check_format(options)
    report = ExportReport(options.format)
    redactor = Redactor(options.secret_values, enabled=not options.include_secrets)
    if options.format == "jsonl":
        writer: Any = _JsonlWriter(out, options)
    else:
        from store.interchange.export_render import HtmlWriter, MarkdownWriter

        writer = (MarkdownWriter if options.format == "md" else HtmlWriter)(out, options)
    shas: set[str] = set()  # the blobs the exported lines refer to (a JSONL export with ``carried``)
    carry = carried is not None and options.format == "jsonl"
    info = redactor.value(dict(session))
    writer.begin(info)
    roots = _RootLines(writer, redactor, info) if options.format == "jsonl" else None
    for cp in orphan_checkpoints:
        writer.checkpoint(_referring(prepare_checkpoint(cp, options, redactor, report), shas, carry))
        report.compactions += 1
    for record, checkpoints, root in records:
        if roots is not None:
            roots.before(root)
        writer.message(_referring(prepare_record(record, options, redactor, report), shas, carry))
        report.messages += not is_withheld(record)
        for cp in checkpoints:
            writer.checkpoint(_referring(prepare_checkpoint(cp, options, redactor, report), shas, carry))
            report.compactions += 1
    if roots is not None:
        roots.close()
    for env in environments:
        writer.environment(redactor.value(env))
        report.environments += 1
    if options.format == "jsonl":
        for branch in archived:
            line = prepare_revision(branch, options, redactor, report)
            for m in line.get("messages") or ():
                _referring(m, shas, carry)
            writer.revision(line)
        for turn in turns:
            writer.turn(redactor.value(turn))
        for row in artifact_rows:
            writer.carry(redactor.value({"type": ARTIFACT, **row}))
    if carry:
        assert carried is not None
        root = session.get("projectPath")
        write_carried(writer, carried, shas, report, workspace=root if isinstance(root, str) else None)
    writer.end()
    report.redactions = redactor.count
    report.bytes = writer.written
    return report


class _RootLines:
    """The positional root lines of a JSONL export (protocol/README.md §9): the transcript's rule
    (``records.Root``) kept across the copy. The ``session_info`` line after the header names the session's
    root, which the lines after it stand under; before a message written under another root a bare
    ``{"type": "session_info", "projectPath": <root>}`` line names that one, and after the last message, when
    the root in effect is not the session's, one more names the session's again (the newest ``projectPath`` of
    the file is the session's: an importer that reads the lines as settings, an older one, binds the copy where
    it did before). A line no root-naming line preceded on this host (``root`` None: one written before roots
    were kept) stands under the one in effect, as before."""

    def __init__(self, writer: _JsonlWriter, redactor: Redactor, info: Mapping[str, Any]) -> None:
        self.writer = writer
        self.redactor = redactor
        path = info.get("projectPath")
        self.session = root_named({"projectPath": path if isinstance(path, str) else None}) or Root(None)
        self.in_effect = self.session

    def before(self, root: Root | None) -> None:
        if root is not None and root != self.in_effect:  # (the line after the header names the session's, or none)
            self.writer.carry(self.redactor.value(root_line(root)))
            self.in_effect = root

    def close(self) -> None:
        if self.in_effect != self.session:
            self.writer.carry(self.redactor.value(root_line(self.session)))
            self.in_effect = self.session


# --------------------------------------------------------------------------- the bytes a JSONL export carries

BLOB_CHUNK = 192 * 1024
"""Bytes of a blob per ``blob`` line (256 KiB of base64): a blob of any size is read and written a part at a
time, never held whole, and each line stays far below an importer's line limit."""


@dataclass(frozen=True)
class Carried:
    """Where a JSONL export reads the bytes it carries: the blob rows, the attachment store and the session's
    review snapshots (``review-changes/<sessionId>/``)."""

    conn: sqlite3.Connection
    files: AttachmentFiles | None
    review_dir: Path | None


def _referring(record: dict[str, Any], shas: set[str], carry: bool) -> dict[str, Any]:
    """``record``, the blobs its blocks refer to added to ``shas`` (when the export carries them)."""
    if carry:
        shas.update(blob_refs(record))
    return record


def write_carried(writer: _JsonlWriter, source: Carried, shas: Iterable[str], report: ExportReport, *,
                  workspace: str | None = None) -> None:
    """The ``blob`` lines of every blob in ``shas`` (sorted, each once), then one ``review_snapshot`` line per
    published snapshot of the session (protocol/README.md §9), ``workspace`` the session's project root."""
    if source.files is not None:  # without the store (an offline export) the bytes are not known: no lines
        for sha in sorted(shas):
            _write_blob(writer, source, source.files, sha, report)
    if source.review_dir is not None:
        _write_reviews(writer, source.review_dir, report, workspace)


def _write_blob(writer: _JsonlWriter, source: Carried, files: AttachmentFiles, sha: str,
                report: ExportReport) -> None:
    """One blob as ``blob`` lines of :data:`BLOB_CHUNK` bytes each (``offset``, ``data`` in base64, ``size`` the
    whole; the first also names its ``mimeType`` and ``kind``); a blob this host evicted or lost is one line
    ``{"evicted": true}``: its bytes are not here to carry, and the copy says so as this host does."""
    row = blob_row(source.conn, sha)
    fd: int | None = None
    if row is None or row["deletionState"] == "live":
        try:
            fd = open_nofollow(files.path(sha), os.O_RDONLY)
        except FileNotFoundError:
            fd = None
        except OSError as exc:
            raise classify_os_error(exc, f"read attachment {sha}") from exc
    if fd is not None and not _holds(fd, sha, files):
        os.close(fd)  # its bytes were changed by hand: they are not this blob's, and are not carried as its
        fd = None
    if fd is None:
        writer.carry({"type": "blob", "sha256": sha, "evicted": True})
        report.blobs_evicted += 1
        return
    try:
        size = os.fstat(fd).st_size
        first: dict[str, Any] = {}
        for key in ("mimeType", "kind"):
            if row is not None and isinstance(row.get(key), str):
                first[key] = row[key]
        offset = 0
        while True:
            chunk = os.read(fd, BLOB_CHUNK)
            if not chunk and offset > 0:  # shorter than it was (an outside edit): the copy refuses the parts
                break
            writer.carry({"type": "blob", "sha256": sha, "size": size, **(first if offset == 0 else {}),
                          "offset": offset, "data": base64.b64encode(chunk).decode("ascii")})
            offset += len(chunk)
            if offset >= size or not chunk:
                break
    except OSError as exc:
        raise classify_os_error(exc, f"read attachment {sha}") from exc
    finally:
        os.close(fd)
    report.blobs += 1


def _holds(fd: int, sha: str, files: AttachmentFiles) -> bool:
    """Whether the blob file open at ``fd`` still hashes to its name (read through once, a part at a time; left
    at its start). A file changed by hand (a digest mismatch: no read of the host verifies a blob's bytes
    otherwise) is logged and exported as a blob this host does not hold."""
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, BLOB_CHUNK):
            digest.update(chunk)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError as exc:
        os.close(fd)
        raise classify_os_error(exc, f"read attachment {sha}") from exc
    if digest.hexdigest() == sha:
        return True
    logger.warning("attachment %s no longer hashes to its name (its bytes were changed outside the host): "
                   "exported as a blob this host does not hold", files.path(sha))
    return False


REVIEW_LEFT_OUT = frozenset({"receipt", "restore"})
"""``meta.json`` fields that are this host's own (a call's receipt, a restore's intent): not exported."""


def _write_reviews(writer: _JsonlWriter, directory: Path, report: ExportReport, workspace: str | None) -> None:
    """One ``review_snapshot`` line per published snapshot (oldest first): its ``snapshot`` (the ``meta.json``
    without :data:`REVIEW_LEFT_OUT`, with ``workspacePath``, its path relative to the session's ``workspace``,
    when it lies inside it: the copy re-roots it on its own) and its ``before`` bytes in base64 (null when the
    tool created the file), checked against their hash first; a snapshot that no longer reads back is left
    out and counted."""
    listing = review.list_snapshots(directory)
    report.review_unreadable += len(listing.unreadable)
    for meta in listing.items:
        try:
            before = review.read_before(directory, meta)
        except CorruptData:
            report.review_unreadable += 1
            continue
        snapshot = {k: v for k, v in meta.items() if k not in REVIEW_LEFT_OUT}
        relative = review.workspace_relative(workspace, str(meta["path"]))
        if relative is not None:
            snapshot["workspacePath"] = relative
        writer.carry({"type": "review_snapshot", "snapshot": snapshot,
                      "beforeBase64": None if before is None else base64.b64encode(before).decode("ascii")})
        report.review_snapshots += 1


def _check_format(options: ExportOptions) -> None:
    if options.format not in FORMATS:
        raise InvalidInput(f"format must be one of {', '.join(FORMATS)}", data={"field": "format"})


# --------------------------------------------------------------------------- where an export goes


class InlineBuffer(io.BytesIO):
    """An in-memory export bounded to ``limit`` bytes (``PAYLOAD_TOO_LARGE`` past it: use a file)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.limit:
            raise PayloadTooLarge(f"the export is larger than {self.limit} bytes: give outPath to write it to a file",
                                  data={"limit": self.limit})
        return super().write(data)


def export_to_new_file(path: Path, produce: Callable[[BinaryIO], T]) -> T:
    """Write an export to a NEW file ``path`` (never over an existing one: ``CONFLICT``).

    ``produce`` streams into a temp file in the same directory (``O_EXCL``, no
    symlink, 0600), which is fsynced, then hard-linked to ``path`` (``link``
    never replaces a file) and the directory fsynced; on any failure the temp
    file is removed and ``path`` does not exist.
    """
    if not path.is_absolute():
        raise InvalidInput("outPath must be an absolute path", data={"field": "outPath"})
    directory = path.parent
    if not directory.is_dir():
        raise NotFound(f"directory {directory} does not exist", data={"field": "outPath"})
    if os.path.lexists(path):
        raise Conflict(f"{path} exists; an export never replaces a file", data={"field": "outPath"})
    temp = directory / f".{path.name}.export-{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise classify_os_error(exc, f"create {temp}") from exc
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            result = produce(fh)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(temp, path)
        except FileExistsError:
            raise Conflict(f"{path} appeared while exporting; it was left as it is",
                           data={"field": "outPath"}) from None
        fsync_dir(directory)
        return result
    except OSError as exc:
        raise classify_os_error(exc, f"export to {path}") from exc
    finally:
        try:
            os.unlink(temp)
        except OSError:
            pass


class _JsonlWriter:
    def __init__(self, out: BinaryIO, options: ExportOptions) -> None:
        self.out = out
        self.options = options
        self.written = 0

    def _line(self, record: Mapping[str, Any]) -> None:
        data = dumps_line(record)
        self.out.write(data)
        self.written += len(data)

    def begin(self, session: Mapping[str, Any]) -> None:
        self._line({"type": "session", "schema": 1, "sessionId": session["id"],
                    "createdAt": now_rfc3339(int(session["createdAt"])),
                    "exportedAt": now_rfc3339(self.options.exported_at_ms), "exportedBy": "pi-host"})
        info: dict[str, Any] = {"type": "session_info", "title": session.get("title") or ""}
        for key in ("projectPath", "source", "providerId", "modelId", "mode", "thinkingLevel", "permissionMode",
                    "historyModel", "historyGit", "spawnedBy", "thread"):
            if session.get(key) is not None:
                info[key] = session[key]
        info["updatedAt"] = now_rfc3339(int(session["updatedAt"]))
        self._line(info)

    def message(self, record: Mapping[str, Any]) -> None:
        self._line(record)

    def checkpoint(self, record: Mapping[str, Any]) -> None:
        self._line(record)

    def environment(self, env: Mapping[str, Any]) -> None:
        self._line({"type": "environment", **env})

    def revision(self, record: Mapping[str, Any]) -> None:
        self._line(record)

    def turn(self, record: Mapping[str, Any]) -> None:
        self._line(record)

    def carry(self, line: Mapping[str, Any]) -> None:
        """A ``blob``, ``review_snapshot``, ``artifact`` or positional root line."""
        self._line(line)

    def end(self) -> None:
        return None
