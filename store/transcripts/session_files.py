"""The files of one session and the delete protocol.

A whole-session delete is physical (seed 000 §3.3) and must survive a crash at
any step without resurrecting the session or losing the delete's receipt:

1. :func:`write_delete_marker` — ``sessions/<id>.deleting`` (atomic write,
   fsynced, directory fsynced) holding the session id, the request's
   receipt record and the receipts (with their answers) of the requests that
   made the session. From here on the delete *has happened*: boot finishes it.
2. the DB transaction: the session's rows go, the receipt row is stored;
3. :func:`finish_delete` — first the id's line in the deleted-sessions log
   (``store/transcripts/deleted_log.py``: what keeps it deleted if the
   database is lost), then transcript, revisions, in-flight checkpoint,
   scratch and review snapshots removed, the marker last.

Boot runs :func:`pending_deletes` → (rows + receipt, :func:`finish_delete`)
for every marker it finds, and also finishes a delete of an older build that
renamed the transcript to ``<id>.jsonl.deleted`` instead of writing a marker.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from store.faults import NO_FAULTS, Faults
from store.fsutil import atomic_write, remove_file_durable
from store.plans import INTENT_SUFFIX
from store.rules import SESSION_ID_RE
from store.transcripts import deleted_log

__all__ = [
    "DELETE_MARKER_SUFFIX",
    "INFLIGHT_SUFFIX",
    "REVISIONS_SUFFIX",
    "TRANSCRIPT_SUFFIX",
    "PendingDelete",
    "SessionPaths",
    "finish_delete",
    "pending_delete",
    "pending_deletes",
    "sweep_session_folders",
    "withdraw_delete_marker",
    "write_delete_marker",
]

DELETE_MARKER_SUFFIX = ".deleting"
LEGACY_DELETED_SUFFIX = ".jsonl.deleted"


TRANSCRIPT_SUFFIX = ".jsonl"
REVISIONS_SUFFIX = ".revisions.jsonl"
INFLIGHT_SUFFIX = ".inflight.json"


class SessionPaths:
    """Every path one session owns (built by the data directory, ids already validated).

    Each path is joined on first use: a session actor is built by the first
    request of its session (a first read waits for it) and a read touches two
    of these paths, not nine.
    """

    __slots__ = ("__dict__", "_review_root", "_scratch_root", "_sessions", "session_id")

    def __init__(self, session_id: str, sessions_dir: Path, scratch_root: Path, review_root: Path) -> None:
        self.session_id = session_id
        self._sessions = sessions_dir
        self._scratch_root = scratch_root
        self._review_root = review_root

    @cached_property
    def transcript(self) -> Path:
        return self._sessions / f"{self.session_id}{TRANSCRIPT_SUFFIX}"

    @cached_property
    def revisions(self) -> Path:
        return self._sessions / f"{self.session_id}{REVISIONS_SUFFIX}"

    @cached_property
    def inflight(self) -> Path:
        return self._sessions / f"{self.session_id}{INFLIGHT_SUFFIX}"

    @cached_property
    def delete_marker(self) -> Path:
        return self._sessions / f"{self.session_id}{DELETE_MARKER_SUFFIX}"

    @cached_property
    def legacy_deleted(self) -> Path:
        return self._sessions / f"{self.session_id}{LEGACY_DELETED_SUFFIX}"

    @property
    def sessions_dir(self) -> Path:
        return self._sessions

    @cached_property
    def plan_intent(self) -> Path:
        return self._sessions / f"{self.session_id}{INTENT_SUFFIX}"

    @cached_property
    def scratch(self) -> Path:
        return self._scratch_root / self.session_id

    @cached_property
    def review_changes(self) -> Path:
        return self._review_root / self.session_id

    def __repr__(self) -> str:
        return f"SessionPaths({self.session_id!r} in {self._sessions})"


@dataclass(frozen=True, slots=True)
class PendingDelete:
    session_id: str
    receipt: Mapping[str, Any] | None


def write_delete_marker(paths: SessionPaths, receipt: Mapping[str, Any] | None,
                        created: Sequence[Mapping[str, Any]] = ()) -> None:
    """Step 1 of a delete: the durable record that it happened (and of its receipt). ``created``: the
    receipt records, with their answers, of the requests that made the session (``store.orphans.created_receipts``),
    carried into the deleted-sessions log."""
    body: dict[str, Any] = {"type": "session_delete", "sessionId": paths.session_id}
    if receipt is not None:
        body["receipt"] = dict(receipt)
    if created:
        body["created"] = [dict(r) for r in created]
    atomic_write(paths.delete_marker, orjson.dumps(body) + b"\n")


def withdraw_delete_marker(paths: SessionPaths) -> None:
    """A delete whose rows were not removed (its commit failed): its marker goes, so that neither the
    next boot nor the session's next catch-up finishes a delete the caller was told did not happen."""
    remove_file_durable(paths.delete_marker)


def finish_delete(paths: SessionPaths, *, now_ms: int | None = None, faults: Faults = NO_FAULTS) -> None:
    """Last step of a delete (also run by boot for an interrupted one): the id's line in the
    deleted-sessions log (durable before anything goes, from the marker), then every file, the marker
    last. ``now_ms`` (default: the wall clock): the time the line records. Fault point
    ``session_delete.after_log``."""
    at = int(time.time() * 1000) if now_ms is None else now_ms
    marker = _read_marker_body(paths.delete_marker) if os.path.lexists(paths.delete_marker) else None
    deleted_log.append(paths.sessions_dir, deleted_log.entry_of_marker(marker, paths.session_id, at))
    faults.point("session_delete.after_log")
    for path in (paths.legacy_deleted, paths.transcript, paths.revisions, paths.inflight, paths.plan_intent):
        remove_file_durable(path)
    for directory in (paths.scratch, paths.review_changes):
        shutil.rmtree(directory, ignore_errors=True)
    remove_file_durable(paths.delete_marker)


@dataclass
class FolderSweep:
    """What :func:`sweep_session_folders` did: the folders it removed, and the entries it left (each
    ``{"path": "<label>/<name>", "reason": ...}``)."""

    removed: int = 0
    left: list[dict[str, str]] = field(default_factory=list)


def sweep_session_folders(roots: Sequence[tuple[Path, str]], existing: Container[str]) -> FolderSweep:
    """Boot: remove the per-session folders (``scratch/<id>``, ``review-changes/<id>``) of sessions that no
    longer exist. ``roots``: each folder holding them with its label. Only what went is counted; an entry
    that is not a folder (a stray plain file, a symbolic link: not a session's, left alone) or that failed
    to go (its error) is named in ``left``, and the sweep goes on."""
    out = FolderSweep()
    for root, label in roots:
        try:
            names = sorted(os.listdir(root))
        except FileNotFoundError:
            continue
        for name in names:
            if name in existing:
                continue
            path = root / name
            if path.is_symlink() or not path.is_dir():
                out.left.append({"path": f"{label}/{name}", "reason": "not a directory"})
                continue
            errors = _remove_tree(path)
            if os.path.lexists(path):
                out.left.append({"path": f"{label}/{name}", "reason": errors[0] if errors else "still there"})
            else:
                out.removed += 1
    return out


def _remove_tree(path: Path) -> list[str]:
    """``rmtree`` that goes on past what it cannot remove: the errors, in order."""
    errors: list[str] = []
    shutil.rmtree(path, onerror=lambda _fn, where, info: errors.append(f"{where}: {info[1]}"))
    return errors


def _read_marker_body(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as fh:
            value = orjson.loads(fh.read(1 << 20))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _read_marker(path: Path) -> Mapping[str, Any] | None:
    value = _read_marker_body(path)
    receipt = value.get("receipt") if value is not None else None
    return receipt if isinstance(receipt, Mapping) else None


def pending_delete(paths: SessionPaths) -> PendingDelete | None:
    """This session's delete that began (its marker) and did not finish, if one did."""
    if not os.path.lexists(paths.delete_marker):
        return None
    return PendingDelete(paths.session_id, _read_marker(paths.delete_marker))


def pending_deletes(sessions_dir: Path) -> list[PendingDelete]:
    """Deletes that began (a marker, or an older build's renamed transcript) and did not finish."""
    out: dict[str, PendingDelete] = {}
    for name in sorted(os.listdir(sessions_dir)):
        if name.endswith(DELETE_MARKER_SUFFIX):
            sid = name[: -len(DELETE_MARKER_SUFFIX)]
            if SESSION_ID_RE.fullmatch(sid):
                out[sid] = PendingDelete(sid, _read_marker(sessions_dir / name))
        elif name.endswith(LEGACY_DELETED_SUFFIX):
            sid = name[: -len(LEGACY_DELETED_SUFFIX)]
            if SESSION_ID_RE.fullmatch(sid) and sid not in out:
                out[sid] = PendingDelete(sid, None)
    return list(out.values())
