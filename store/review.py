"""Message-owned review-change snapshots (seed 003 §2.0, ADR 0043): the file format and its planning.

Layout: ``review-changes/<sessionId>/<snapshotId>/`` holds

* ``before`` — the bytes the file had before a successful Write/Edit tool (absent when the tool
  created the file);
* ``meta.json`` — the workspace path (absolute, resolved under the session's root), the hashes
  and sizes before and after, the diff state (``recorded`` / ``restored``), the owner (message,
  tool call, turn) and the receipt of the call that recorded it.

``meta.json`` is published last and exclusively: a directory without it is an interrupted
record and counts for nothing; boot and ``pi-host doctor --repair`` remove it
(:func:`remove_unpublished`). A snapshot is never inferred from Git. The directory goes with
``session.delete`` (``store/transcripts/session_files.finish_delete``) and boot sweeps the ones
whose session is gone (``runtime/boot.py``).

Receipts ride with the effect (ARCHITECTURE.md): with a receipt key the snapshot id is derived
from ``(clientId, submissionId)``, so a retry after a crash between the publish and the receipt
row finds the snapshot its first attempt wrote and answers from it; a restore writes its intent
(with its receipt) into ``meta.json`` before it touches the workspace, so a retry finishes it
or answers it. Synchronous and pure of trio: callers run these in a worker thread.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from store.errors import (
    Conflict,
    CorruptData,
    DamagedRecord,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    StoreError,
    classify_os_error,
)
from store.faults import NO_FAULTS, Faults
from store.fsutil import (
    TEMP_MARKER,
    atomic_write,
    fsync_dir,
    is_temp_name,
    open_nofollow,
    sweep_temp_files,
    write_all,
)
from store.jsonio import Readable, readable
from store.receipts import ReceiptKey, file_record, key_of_record
from store.rules import MAX_REVIEW_FILE_BYTES, MAX_REVIEW_META_BYTES, REVIEW_SNAPSHOT_ID_RE, is_absolute_path
from store.workspace import resolve_under

__all__ = [
    "FORMAT_VERSION",
    "FileChanged",
    "FileState",
    "RestorePlan",
    "StagedSnapshots",
    "check_inside",
    "check_record_retry",
    "count_snapshots",
    "decode_before",
    "file_state",
    "finish_restore",
    "list_snapshots",
    "load_meta",
    "new_meta",
    "plan_restore",
    "read_before",
    "read_workspace_file",
    "record_answer",
    "remove_snapshot_dir",
    "remove_unpublished",
    "restore_answer",
    "restore_temp_path",
    "rerooted",
    "review_ref",
    "snapshot_id_for",
    "start_restore",
    "stray_restore_temps",
    "sweep_snapshot_temp_files",
    "unpublished_snapshots",
    "well_formed",
    "wire_snapshot",
    "workspace_relative",
    "write_snapshot",
]

FORMAT_VERSION: Final = 1
META: Final = "meta.json"
BEFORE: Final = "before"

FileState = tuple[bool, str | None, int]
"""``(exists, sha256 or None, size)`` of a workspace file."""


class FileChanged(Conflict):
    """The workspace file is neither what the tool wrote nor what the snapshot restores: refused."""

    code = "FILE_CHANGED"


def snapshot_id_for(key: ReceiptKey | None) -> str:
    """The snapshot's id: derived from the receipt key (a retry finds it), else random."""
    if key is None:
        return "rv-" + secrets.token_hex(16)
    digest = hashlib.sha256(f"{key.client_id}\x00{key.submission_id}".encode()).hexdigest()
    return "rv-" + digest[:32]


def _snapshot_dir(session_dir: Path, snapshot_id: str) -> Path:
    if not REVIEW_SNAPSHOT_ID_RE.fullmatch(snapshot_id):
        raise InvalidInput(f"invalid snapshot id {snapshot_id[:80]!r}", data={"field": "snapshotId"})
    return session_dir / snapshot_id


# ---------------------------------------------------------------------- the workspace side


def check_inside(root: str, path: str) -> None:
    """``path`` (already folded lexically under ``root``) must stay under ``root`` once the
    symlinks of its directories are followed: a link out of the workspace is refused."""
    real_root = os.path.realpath(root)
    real_parent = os.path.realpath(os.path.dirname(path))
    if real_parent != real_root and not real_parent.startswith(real_root.rstrip("/") + "/"):
        raise InvalidInput(f"{path} leaves the session's workspace through a link",
                           data={"field": "path", "reason": "outside_workspace"})


def read_workspace_file(root: str, path: str) -> bytes | None:
    """The file's bytes (``None`` if it does not exist), never through a final symlink, bounded."""
    check_inside(root, path)
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise InvalidInput(f"{path} is not a regular file", data={"field": "path"}) from exc
        raise classify_os_error(exc, f"read {path}") from exc
    try:
        size = os.fstat(fd).st_size
        if size > MAX_REVIEW_FILE_BYTES:
            raise PayloadTooLarge(f"{path} is over {MAX_REVIEW_FILE_BYTES} bytes: no review snapshot",
                                  data={"field": "path", "limit": MAX_REVIEW_FILE_BYTES})
        data = _read_bounded(fd, MAX_REVIEW_FILE_BYTES + 1)
        if len(data) > MAX_REVIEW_FILE_BYTES:
            raise PayloadTooLarge(f"{path} grew over {MAX_REVIEW_FILE_BYTES} bytes",
                                  data={"field": "path", "limit": MAX_REVIEW_FILE_BYTES})
        return data
    finally:
        os.close(fd)


def _read_bounded(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes, looping over short reads."""
    chunks: list[bytes] = []
    left = limit
    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _state_of(data: bytes | None) -> FileState:
    if data is None:
        return (False, None, 0)
    return (True, hashlib.sha256(data).hexdigest(), len(data))


def file_state(root: str, path: str) -> FileState:
    """What the workspace file is now: exists, hash, size."""
    return _state_of(read_workspace_file(root, path))


def restore_temp_path(path: str, snapshot_id: str) -> str:
    """The temp file a restore of ``snapshot_id`` writes next to ``path``: ``<path>.tmp.<12 hex of the id>``."""
    return f"{path}{TEMP_MARKER}{hashlib.sha256(snapshot_id.encode()).hexdigest()[:12]}"


def _write_workspace_file(path: str, data: bytes, snapshot_id: str, *, faults: Faults = NO_FAULTS) -> None:
    """Replace ``path`` with ``data`` (temp + fsync + rename + dir fsync), keeping the file's mode.

    The temp file sits in the user's workspace, so its name is the snapshot's (:func:`restore_temp_path`),
    not random: an attempt killed before its rename leaves one name, which the retry of that restore removes
    before it writes (never a file of the user's), and ``pi-host doctor`` finds (:func:`stray_restore_temps`).
    Fault point ``review.restore_file.after_tmp_write``."""
    directory = os.path.dirname(path)
    try:
        mode = stat.S_IMODE(os.lstat(path).st_mode)
    except FileNotFoundError:
        mode = 0o644
    tmp = restore_temp_path(path, snapshot_id)
    renamed = False
    try:
        try:
            os.unlink(tmp)  # an earlier attempt of this restore, killed before its rename
        except FileNotFoundError:
            pass
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            faults.point("review.restore_file.after_tmp_write")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        renamed = True
        fsync_dir(directory)
    except OSError as exc:
        if not renamed:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise classify_os_error(exc, f"restore {path}") from exc


def _remove_workspace_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise classify_os_error(exc, f"remove {path}") from exc
    fsync_dir(os.path.dirname(path))


# ---------------------------------------------------------------------- the snapshot files


def new_meta(*, snapshot_id: str, session_id: str, path: str, tool_name: str, tool_call_id: str | None,
             message_id: str | None, turn_id: str | None, before: bytes | None, after: bytes | None,
             now_ms: int, key: ReceiptKey | None) -> dict[str, Any]:
    """The ``meta.json`` of a new snapshot."""
    if after is None:
        raise NotFound(f"{path} does not exist: record a snapshot after the tool wrote it",
                       data={"path": path})
    b_exists, b_sha, b_size = _state_of(before)
    _, a_sha, a_size = _state_of(after)
    meta: dict[str, Any] = {
        "version": FORMAT_VERSION, "snapshotId": snapshot_id, "sessionId": session_id, "path": path,
        "toolName": tool_name, "createdAt": now_ms, "state": "recorded",
        "before": {"exists": b_exists, "sha256": b_sha, "size": b_size},
        "after": {"exists": True, "sha256": a_sha, "size": a_size},
    }
    for name, value in (("toolCallId", tool_call_id), ("messageId", message_id), ("turnId", turn_id)):
        if value is not None:
            meta[name] = value
    if key is not None:
        meta["receipt"] = file_record(key)
    return meta


def _mkdirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each made durable in its own parent."""
    missing: list[Path] = []
    probe = path
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        fsync_dir(directory.parent)


def write_snapshot(session_dir: Path, meta: Mapping[str, Any], before: bytes | None, *,
                   faults: Faults = NO_FAULTS) -> None:
    """Write ``before`` then publish ``meta.json`` (exclusively): the snapshot appears whole or not at all.

    A write refused on the way (disk full, an I/O error) before ``meta.json`` is published takes its half
    along (best effort: what stays, boot removes, :func:`remove_unpublished`); the error is raised as it was."""
    target = _snapshot_dir(session_dir, str(meta["snapshotId"]))
    try:
        _mkdirs(target)
    except OSError as exc:
        raise classify_os_error(exc, f"create {target}") from exc
    try:
        if before is not None:
            atomic_write(target / BEFORE, before, faults=faults, point_prefix="review.before")
        atomic_write(target / META, orjson.dumps(dict(meta)) + b"\n", faults=faults, point_prefix="review.meta",
                     exclusive=True)
    except StoreError:
        _drop_half(target)
        raise


class StagedSnapshots:
    """The review snapshots an import carries in (a pi-host export's ``review_snapshot`` lines), written as the
    parse reads them and published with the import's transcript: until then each is a folder holding its
    ``before`` and its ``meta.json`` under a temp name, an unpublished snapshot no reader lists (and boot
    removes, as a record killed before its publish: :func:`remove_unpublished`). :meth:`publish` links every
    ``meta.json`` into place (exclusively); :meth:`discard` removes every folder this import made, staged or
    published, and the session's folder when it made that too: a refused or undone import leaves none."""

    def __init__(self, session_dir: Path) -> None:
        self.session_dir = session_dir
        self.staged: dict[str, Path] = {}
        """Snapshot id -> its ``meta.json`` under its temp name."""
        self.published: list[str] = []
        self._made_dir = False

    def stage(self, meta: Mapping[str, Any], before: bytes | None, *, faults: Faults = NO_FAULTS) -> bool:
        """Write one snapshot unpublished; False when this import staged it already (a repeated line)."""
        snapshot_id = str(meta["snapshotId"])
        if snapshot_id in self.staged:
            return False
        target = _snapshot_dir(self.session_dir, snapshot_id)
        try:
            if not self.session_dir.exists():
                self._made_dir = True
            _mkdirs(target)
        except OSError as exc:
            raise classify_os_error(exc, f"create {target}") from exc
        staged = target / f"{META}{TEMP_MARKER}{secrets.token_hex(6)}"
        self.staged[snapshot_id] = staged
        try:
            if before is not None:
                atomic_write(target / BEFORE, before, faults=faults, point_prefix="review.before")
            fd = open_nofollow(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                write_all(fd, orjson.dumps(dict(meta)) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise classify_os_error(exc, f"stage {target}") from exc
        return True

    def publish(self) -> None:
        """Every staged ``meta.json`` into place (a snapshot published meanwhile under the same id stays as it
        is, this one dropped), each folder made durable."""
        for snapshot_id, staged in list(self.staged.items()):
            try:
                os.link(staged, staged.parent / META)
            except FileExistsError:
                pass
            except OSError as exc:
                raise classify_os_error(exc, f"publish {staged.parent}") from exc
            else:
                self.published.append(snapshot_id)
            del self.staged[snapshot_id]
            try:
                os.unlink(staged)
                fsync_dir(staged.parent)
            except OSError as exc:
                raise classify_os_error(exc, f"publish {staged.parent}") from exc

    def discard(self) -> None:
        """Remove what this import wrote (best effort: what a failing disk keeps, boot's sweep removes)."""
        for staged in self.staged.values():
            try:
                os.unlink(staged)
            except OSError:
                pass
            _drop_half(staged.parent)
        self.staged.clear()
        for snapshot_id in self.published:
            try:
                remove_snapshot_dir(_snapshot_dir(self.session_dir, snapshot_id))
            except OSError:
                pass
        self.published.clear()
        if self._made_dir:
            try:
                os.rmdir(self.session_dir)  # only when empty
                fsync_dir(self.session_dir.parent)
            except OSError:
                pass


def workspace_relative(root: str | None, path: str) -> str | None:
    """``path`` (absolute, folded, as a snapshot holds it) relative to the workspace ``root`` when it lies inside
    it, else None (no root, outside it, the root itself)."""
    if not root:
        return None
    resolved, inside = resolve_under(root, path)
    if not inside or resolved != path:
        return None
    base = root.replace("\\", "/").rstrip("/")
    rel = resolved[len(base):].lstrip("/") if resolved.startswith(base) else ""
    return rel or None


def rerooted(root: str, relative: object) -> str | None:
    """A carried ``workspacePath`` under ``root`` (the copy's workspace), folded; None when it is no relative
    path inside it (absolute, a ``..`` out of it, empty, a NUL)."""
    if not isinstance(relative, str) or not relative or "\x00" in relative or is_absolute_path(relative):
        return None
    resolved, inside = resolve_under(root, relative)
    base = root.replace("\\", "/").rstrip("/") or "/"
    return resolved if inside and resolved != base else None


def _drop_half(target: Path) -> None:
    """Remove ``target`` if it is still a half-written snapshot (never once ``meta.json`` is there)."""
    try:
        if _half_written(target):
            remove_snapshot_dir(target)
    except OSError:
        pass  # the failing disk refused this too: the next boot's sweep removes it


def load_meta(session_dir: Path, snapshot_id: str) -> dict[str, Any] | None:
    """A published snapshot's ``meta.json`` (``None``: no such snapshot); ``DamagedRecord`` (CORRUPT_DATA) when
    it no longer reads as the host wrote it."""
    path = _snapshot_dir(session_dir, snapshot_id) / META
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise classify_os_error(exc, f"read {path}") from exc
    try:
        raw = _read_bounded(fd, MAX_REVIEW_META_BYTES + 1)
    finally:
        os.close(fd)
    try:
        meta = orjson.loads(raw) if len(raw) <= MAX_REVIEW_META_BYTES else None
    except orjson.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict) or meta.get("snapshotId") != snapshot_id or not _well_formed(meta):
        raise DamagedRecord(f"review snapshot {snapshot_id} has an unreadable meta.json",
                            data={"snapshotId": snapshot_id})
    return meta


def _side_ok(side: Any, *, exists: bool | None = None) -> bool:
    if not isinstance(side, dict) or not isinstance(side.get("exists"), bool):
        return False
    if exists is not None and side["exists"] is not exists:
        return False
    return isinstance(side.get("sha256"), str) if side["exists"] else side.get("sha256") is None


def _well_formed(meta: Mapping[str, Any]) -> bool:
    """The fields readers and restores rely on have the types :func:`new_meta` (and a restore) write: a
    ``meta.json`` that parses but lost them (a byte changed in a key, a value of another type) is damaged."""
    intent = meta.get("restore")
    return (_side_ok(meta.get("before")) and _side_ok(meta.get("after"), exists=True)
            and isinstance(meta.get("path"), str) and type(meta.get("createdAt")) is int
            and meta.get("state") in ("recorded", "restored")
            and (intent is None or (isinstance(intent, dict) and type(intent.get("at")) is int)))


def well_formed(meta: Mapping[str, Any]) -> bool:
    """A snapshot's meta from elsewhere (an imported export) reads as :func:`new_meta` writes it."""
    return (isinstance(meta.get("snapshotId"), str) and REVIEW_SNAPSHOT_ID_RE.fullmatch(meta["snapshotId"]) is not None
            and _well_formed(meta))


def _published_ids(session_dir: Path) -> list[str]:
    try:
        names = os.listdir(session_dir)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if REVIEW_SNAPSHOT_ID_RE.fullmatch(n) and (session_dir / n / META).is_file())


def count_snapshots(session_dir: Path) -> int:
    return len(_published_ids(session_dir))


def list_snapshots(session_dir: Path) -> Readable[dict[str, Any]]:
    """Every published snapshot's meta, oldest first (``createdAt``, then id); a snapshot whose ``meta.json``
    is damaged (:func:`load_meta`'s ``DamagedRecord``) is named in ``unreadable`` (snapshot ids, in id order),
    never the others lost for it."""
    found = readable(_published_ids(session_dir), lambda sid: load_meta(session_dir, sid), str)
    metas = [m for m in found.items if m is not None]
    return Readable(sorted(metas, key=lambda m: (int(m.get("createdAt", 0)), str(m["snapshotId"]))),
                    found.unreadable)


def read_before(session_dir: Path, meta: Mapping[str, Any]) -> bytes | None:
    """The ``before`` bytes, checked against the hash in ``meta`` (``None``: the file did not exist)."""
    before = meta["before"]
    if not before.get("exists"):
        return None
    path = _snapshot_dir(session_dir, str(meta["snapshotId"])) / BEFORE
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        data = None
    except OSError as exc:
        raise classify_os_error(exc, f"read {path}") from exc
    else:
        try:
            data = _read_bounded(fd, MAX_REVIEW_FILE_BYTES + 1)
        finally:
            os.close(fd)
    if data is None or hashlib.sha256(data).hexdigest() != before.get("sha256"):
        raise CorruptData(f"review snapshot {meta['snapshotId']}: the before bytes do not match their hash",
                          data={"snapshotId": meta["snapshotId"]})
    return data


# ---------------------------------------------------------------------- answers


def wire_snapshot(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ReviewSnapshot`` wire shape (no receipts, no restore intent)."""
    keep = ("snapshotId", "sessionId", "path", "toolName", "toolCallId", "messageId", "turnId", "createdAt",
            "state", "restoredAt", "before", "after")
    return {k: meta[k] for k in keep if k in meta}


def review_ref(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The ``details.review`` record the tool result carries (it refers to the snapshot)."""
    return {"snapshotId": meta["snapshotId"], "path": meta["path"],
            "beforeSha256": meta["before"].get("sha256"), "afterSha256": meta["after"]["sha256"],
            "created": not meta["before"].get("exists")}


def record_answer(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"snapshot": wire_snapshot(meta), "review": review_ref(meta)}


def restore_answer(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"snapshot": wire_snapshot(meta)}


def check_record_retry(meta: Mapping[str, Any], key: ReceiptKey) -> dict[str, Any]:
    """A snapshot already published under this receipt key: its answer, or IDEMPOTENCY_CONFLICT. The answer
    is the one the recording gave (``recorded``), even when a restore since changed ``meta.json`` (a retry
    after the database was lost, which took the receipt row, comes here)."""
    found = key_of_record(meta.get("receipt"))
    if found != key:
        raise IdempotencyConflict(f"submissionId {key.submission_id} was already used for a different request",
                                  data={"submissionId": key.submission_id, "method": key.method})
    recorded = {k: v for k, v in meta.items() if k not in ("restoredAt", "restore")}
    return record_answer({**recorded, "state": "recorded"})


# ---------------------------------------------------------------------- restore

RestorePlan = Literal["write", "finish", "answered"]


def _same(state: FileState, side: Mapping[str, Any]) -> bool:
    exists = bool(side.get("exists"))
    return state[0] == exists and (not exists or state[1] == side.get("sha256"))


def plan_restore(meta: Mapping[str, Any], current: FileState, key: ReceiptKey | None) -> RestorePlan:
    """What a restore does, given the file now (by hash):

    * the file is what the tool wrote → ``write`` the before bytes back;
    * this call's own restore is over (its intent is in ``meta``, which says ``restored``) → ``answered``,
      whatever the file holds now (a retry after the database was lost: its receipt row went with it; the
      file changed since is not this call's to judge again);
    * it already holds the before bytes and this call's own restore intent is in ``meta`` → ``finish``
      (a retry after a crash: publish the restored state);
    * anything else → ``FILE_CHANGED`` (the user or another tool changed it since) or ``CONFLICT``
      (already restored by another call).
    """
    intent = meta.get("restore") if isinstance(meta.get("restore"), Mapping) else None
    mine = intent is not None and key is not None and key_of_record(intent.get("receipt")) == key
    if mine and meta.get("state") == "restored":
        return "answered"
    if _same(current, meta["before"]) and mine:
        return "finish"
    if _same(current, meta["after"]) and (meta.get("state") != "restored" or mine):
        return "write"
    if meta.get("state") == "restored" and _same(current, meta["before"]):
        raise Conflict(f"review snapshot {meta['snapshotId']} was already restored",
                       data={"snapshotId": meta["snapshotId"], "reason": "already_restored"})
    raise FileChanged(
        f"{meta['path']} changed since the snapshot was recorded; restoring it would lose that change",
        data={"snapshotId": meta["snapshotId"], "path": meta["path"], "expectedSha256": meta["after"]["sha256"],
              "actualSha256": current[1]},
    )


def start_restore(session_dir: Path, meta: Mapping[str, Any], key: ReceiptKey | None, now_ms: int, *,
                  faults: Faults = NO_FAULTS) -> dict[str, Any]:
    """Step 1: the restore intent (with its receipt) in ``meta.json``, before the workspace is touched.
    This call's own intent, left by a crashed first attempt, stays as it is (its time is the answer's)."""
    found = meta.get("restore")
    if key is not None and isinstance(found, Mapping) and key_of_record(found.get("receipt")) == key:
        return dict(meta)
    intent: dict[str, Any] = {"at": now_ms}
    if key is not None:
        intent["receipt"] = file_record(key)
    updated = {**meta, "restore": intent}
    target = _snapshot_dir(session_dir, str(meta["snapshotId"])) / META
    atomic_write(target, orjson.dumps(updated) + b"\n", faults=faults, point_prefix="review.restore_intent")
    return updated


def finish_restore(session_dir: Path, meta: Mapping[str, Any], root: str, before: bytes | None,
                   *, write: bool, faults: Faults = NO_FAULTS) -> dict[str, Any]:
    """Step 2 and 3: the before bytes into the workspace (or the created file removed), then
    ``meta.json`` says ``restored``."""
    path = str(meta["path"])
    if write:
        check_inside(root, path)
        if before is None:
            _remove_workspace_file(path)
        else:
            _write_workspace_file(path, before, str(meta["snapshotId"]), faults=faults)
    intent = meta.get("restore") or {}
    updated = {**meta, "state": "restored", "restoredAt": int(intent.get("at", 0))}
    target = _snapshot_dir(session_dir, str(meta["snapshotId"])) / META
    atomic_write(target, orjson.dumps(updated) + b"\n", faults=faults, point_prefix="review.restored")
    return updated


def decode_before(value: str | None) -> bytes | None:
    """The wire's base64 ``before`` (``None``: the tool created the file), bounded."""
    if value is None:
        return None
    if len(value) > (MAX_REVIEW_FILE_BYTES + 2) // 3 * 4:
        raise PayloadTooLarge(f"before is over {MAX_REVIEW_FILE_BYTES} bytes",
                              data={"field": "beforeBase64", "limit": MAX_REVIEW_FILE_BYTES})
    try:
        data = base64.b64decode(value, validate=True)
    except ValueError as exc:
        raise InvalidInput("beforeBase64 is not valid base64", data={"field": "beforeBase64"}) from exc
    if len(data) > MAX_REVIEW_FILE_BYTES:  # the text bound above still lets 1-2 bytes more through
        raise PayloadTooLarge(f"before is {len(data)} bytes, over {MAX_REVIEW_FILE_BYTES}",
                              data={"field": "beforeBase64", "limit": MAX_REVIEW_FILE_BYTES})
    return data


def sweep_snapshot_temp_files(review_root: Path) -> int:
    """Boot: remove the temp files interrupted snapshot writes left inside ``review-changes/<sid>/<rv>/``
    (the data directory's own sweep covers only its top folders). Returns how many went."""
    removed = 0
    for session in os.listdir(review_root):
        session_dir = review_root / session
        if not session_dir.is_dir() or session_dir.is_symlink():
            continue
        for snapshot in os.listdir(session_dir):
            snapshot_dir = session_dir / snapshot
            if snapshot_dir.is_dir() and not snapshot_dir.is_symlink():
                removed += len(sweep_temp_files(snapshot_dir))
    return removed


def _real_dirs(directory: Path) -> list[Path]:
    """The directories directly in ``directory`` (never through a symlink), by name."""
    try:
        with os.scandir(directory) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


def _half_written(snapshot_dir: Path) -> bool:
    """``snapshot_dir`` is what :func:`write_snapshot` leaves when it dies before ``meta.json``: no entry of that
    name of any kind (a damaged or odd one is a published snapshot's), and nothing but regular files of the
    names it writes first (``before``, the temp files of both), or nothing."""
    with os.scandir(snapshot_dir) as entries:
        found = [(e.name, e.is_file(follow_symlinks=False)) for e in entries]
    return all(regular and name != META and (name == BEFORE or is_temp_name(name)) for name, regular in found)


def unpublished_snapshots(review_root: Path) -> list[Path]:
    """The ``review-changes/<sid>/<rv>/`` folders of records killed before their ``meta.json`` was published: no
    reader lists or reads them, and no one completes them but a keyed retry, which writes both files again (its
    first attempt was never answered: the receipt row comes after ``meta.json``). Only safe to remove where no
    record can be in flight: boot before the gateway opens, doctor under the data directory's lock."""
    out: list[Path] = []
    for session_dir in _real_dirs(review_root):
        out.extend(d for d in _real_dirs(session_dir)
                   if REVIEW_SNAPSHOT_ID_RE.fullmatch(d.name) and _half_written(d))
    return out


def remove_unpublished(review_root: Path) -> int:
    """Remove every :func:`unpublished_snapshots` folder; returns how many went. A kill part way leaves a folder
    still without ``meta.json``: the next run finishes it."""
    found = unpublished_snapshots(review_root)
    for snapshot_dir in found:
        remove_snapshot_dir(snapshot_dir)
    return len(found)


def remove_snapshot_dir(snapshot_dir: Path) -> None:
    """Remove one :func:`unpublished_snapshots` folder: its files, then it, then its parent made durable."""
    with os.scandir(snapshot_dir) as entries:
        names = [e.name for e in entries]
    for name in names:
        try:
            os.unlink(snapshot_dir / name)
        except FileNotFoundError:
            pass
    os.rmdir(snapshot_dir)
    fsync_dir(snapshot_dir.parent)


def stray_restore_temps(session_dir: Path) -> list[str]:
    """The workspace temp files (:func:`restore_temp_path`) of this session's restores killed before their
    rename and never retried: regular files only (never through a final symlink). A snapshot whose
    ``meta.json`` no longer reads is skipped (its path is not to be trusted)."""
    out: list[str] = []
    for snapshot_id in _published_ids(session_dir):
        try:
            meta = load_meta(session_dir, snapshot_id)
        except DamagedRecord:
            continue
        if meta is None:
            continue
        tmp = restore_temp_path(str(meta["path"]), snapshot_id)
        try:
            if stat.S_ISREG(os.lstat(tmp).st_mode):
                out.append(tmp)
        except OSError:
            continue  # gone, or its folder is: nothing of ours to find
    return out
