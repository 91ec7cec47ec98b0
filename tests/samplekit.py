"""The third-party session samples (``../shared/samples``): where they are, and proof they stay unmodified.

The samples live beside the repository (``<some parent>/shared/samples``); the
``PI_HOST_SAMPLES`` environment variable overrides the search. Every test that
reads them goes through :func:`samples_dir`, and :func:`assert_checksums`
verifies each file against ``SHA256SUMS`` (importers only ever read them).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from store.attachments import AttachmentFiles
from store.indexing.database import in_transaction
from store.interchange.import_write import ImportTarget
from store.interchange.importers import IMPORTERS
from store.interchange.importers.report import SessionReport
from store.interchange.imports import import_unit
from store.transcripts.transcript import read_transcript
from tests.schema_image import fresh_file_db

REPO = Path(__file__).resolve().parents[1]
NOW = 1_785_056_400_000
T = TypeVar("T")


def find_samples() -> Path | None:
    override = os.environ.get("PI_HOST_SAMPLES")
    if override:
        return Path(override)
    for parent in REPO.parents:
        candidate = parent / "shared" / "samples"
        if (candidate / "SHA256SUMS").is_file():
            return candidate
    vendored = REPO / "tests" / "shared_samples"  # the same files, copied in for clean clones
    return vendored if (vendored / "SHA256SUMS").is_file() else None


def samples_dir() -> Path:
    found = find_samples()
    if found is None:
        pytest.skip("the shared session samples (../shared/samples with SHA256SUMS) are not on this machine")
    return found


def checksums(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (root / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split(None, 1)
            out[name.strip()] = digest
    return out


def assert_checksums(root: Path) -> int:
    """Every file listed in SHA256SUMS still has its checksum; returns how many were checked."""
    listed = checksums(root)
    assert listed, "SHA256SUMS lists no file"
    for name, digest in listed.items():
        actual = hashlib.sha256((root / name).read_bytes()).hexdigest()
        assert actual == digest, f"sample {name} was modified"
    return len(listed)


def sample_files(source: str) -> list[Path]:
    root = samples_dir()
    return sorted(root.joinpath(name) for name in checksums(root) if name.startswith(f"{source}/"))


def open_db(path: Path) -> sqlite3.Connection:
    """A new database at ``path`` with the host's pragmas and the whole schema (a copy, tests/schema_image.py)."""
    return fresh_file_db(path)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = open_db(tmp_path / "pi.sqlite")
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def target(tmp_path: Path) -> ImportTarget:
    sessions = tmp_path / "sessions"
    blobs = tmp_path / "attachments"
    sessions.mkdir()
    blobs.mkdir()
    return ImportTarget(sessions, AttachmentFiles(blobs))


@contextmanager
def import_workspace() -> Iterator[tuple[Path, sqlite3.Connection, ImportTarget]]:
    """A fresh import target outside pytest's fixtures (hypothesis examples need one each): ``root`` with
    ``sessions/``, ``blobs/`` and ``src/`` (for the test's sources), the index open on ``root/pi.sqlite``."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("sessions", "blobs", "src"):
            (root / name).mkdir()
        conn = open_db(root / "pi.sqlite")
        try:
            yield root, conn, ImportTarget(root / "sessions", AttachmentFiles(root / "blobs"))
        finally:
            conn.close()


@pytest.fixture(scope="session", autouse=False)
def untouched_samples() -> Iterator[Path]:
    """The samples directory, checked against SHA256SUMS before and after the tests that use it."""
    root = samples_dir()
    assert_checksums(root)
    yield root
    assert_checksums(root)


def tx(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    return in_transaction(conn, fn)


def rows(conn: sqlite3.Connection, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    return conn.execute(sql, args).fetchall()


def import_new(db: sqlite3.Connection, target: ImportTarget, source: str,
               path: Path) -> tuple[SessionReport, list[dict[str, Any]]]:
    """Import the one session file ``path`` with the ``source`` importer into a database that never saw it:
    its report (status ``new``, asserted) and the records of the transcript it wrote."""
    (unit,) = IMPORTERS[source].discover(path)
    rep = import_unit(db, unit, target, now_ms=NOW)
    assert rep.status == "new", rep.status
    return rep, [m.record for m in read_transcript(target.transcript(rep.session_id)).messages]
