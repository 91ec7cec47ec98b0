"""Durable file primitives (store/fsutil.py): atomic replace, temp sweep, no-follow opens."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from store.errors import IOFailure, NotDurable, StorageFull
from store.faults import Faults, InjectedFault
from store.fsutil import (
    OwedSyncs,
    atomic_write,
    fsync_dir,
    open_nofollow,
    owner_only,
    remove_file_durable,
    sweep_temp_files,
    write_all,
)

POINTS = ["after_tmp_write", "after_tmp_fsync", "after_rename", "before_dirsync"]
BEFORE_RENAME = {"after_tmp_write", "after_tmp_fsync"}

OLD = b"old content\n" * 50
NEW = b"new content, different length\n" * 70


def temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp." in p.name)


def test_atomic_write_creates_0600_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    old_umask = os.umask(0)
    try:
        atomic_write(target, OLD)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == OLD
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    atomic_write(target, NEW)
    assert target.read_bytes() == NEW
    assert temps(tmp_path) == []


@pytest.mark.parametrize("point", POINTS)
def test_crash_at_each_point_leaves_old_or_new_never_a_mix(tmp_path: Path, point: str) -> None:
    target = tmp_path / "s.jsonl"
    atomic_write(target, OLD)
    faults = Faults()
    faults.add(f"rewrite.{point}", 1, "raise")
    with pytest.raises(InjectedFault):
        atomic_write(target, NEW, faults=faults)
    expected = OLD if point in BEFORE_RENAME else NEW
    assert target.read_bytes() == expected
    stray = temps(tmp_path)
    if point in BEFORE_RENAME:
        assert len(stray) == 1 and stray[0].startswith("s.jsonl.tmp.")
    else:
        assert stray == []
    # boot: the sweep removes the stray temp, the file itself is untouched
    removed = sweep_temp_files(tmp_path)
    assert sorted(Path(p).name for p in removed) == stray
    assert temps(tmp_path) == []
    assert target.read_bytes() == expected


_CHILD = """
import sys
from store.faults import Faults
from store.fsutil import atomic_write
atomic_write(sys.argv[1], b"NEW" * 1000, faults=Faults.parse(sys.argv[2]))
print("not killed")
"""


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_at_each_point_leaves_old_or_new(tmp_path: Path, point: str) -> None:
    target = tmp_path / "s.jsonl"
    atomic_write(target, OLD)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(target), f"rewrite.{point}:1:kill"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -9, proc.stderr.decode()
    assert target.read_bytes() in (OLD, b"NEW" * 1000)
    assert target.read_bytes() == (OLD if point in BEFORE_RENAME else b"NEW" * 1000)
    sweep_temp_files(tmp_path)
    assert temps(tmp_path) == []


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize(("action", "error"), [("eio", IOFailure), ("enospc", StorageFull)])
def test_os_error_at_each_point_is_classified_and_cleans_up(
    tmp_path: Path, point: str, action: str, error: type[Exception]
) -> None:
    target = tmp_path / "s.jsonl"
    atomic_write(target, OLD)
    faults = Faults()
    faults.add(f"rewrite.{point}", 1, action)
    with pytest.raises(error) as info:
        atomic_write(target, NEW, faults=faults)
    assert "s.jsonl" in str(info.value)
    assert target.read_bytes() == (OLD if point in BEFORE_RENAME else NEW)
    assert temps(tmp_path) == []  # nothing left for the sweep


def test_point_prefix_names_the_fault_points(tmp_path: Path) -> None:
    faults = Faults()
    faults.add("inflight.after_tmp_fsync", 1, "raise")
    with pytest.raises(InjectedFault):
        atomic_write(tmp_path / "x.inflight.json", b"{}", faults=faults, point_prefix="inflight")
    assert faults.hits("inflight.after_tmp_write") == 1


def test_atomic_write_into_missing_directory_is_io_failure(tmp_path: Path) -> None:
    with pytest.raises(IOFailure):
        atomic_write(tmp_path / "nope" / "f", b"x")


def test_sweep_only_touches_temp_files_in_that_directory(tmp_path: Path) -> None:
    keep = ["a.jsonl", "a.revisions.jsonl", "a.jsonl.torn-123", "tmp", "x.tmp"]
    for name in keep:
        (tmp_path / name).write_bytes(b"k")
    (tmp_path / "sub.tmp.dir").mkdir()
    (tmp_path / "sub.tmp.dir" / "inner.tmp.1").write_bytes(b"x")
    for name in ("a.jsonl.tmp.0a1b", "host.json.tmp.ff"):
        (tmp_path / name).write_bytes(b"t")
    removed = sweep_temp_files(tmp_path)
    assert sorted(Path(p).name for p in removed) == ["a.jsonl.tmp.0a1b", "host.json.tmp.ff"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*keep, "sub.tmp.dir"])
    assert (tmp_path / "sub.tmp.dir" / "inner.tmp.1").exists()
    assert sweep_temp_files(tmp_path) == []


def test_sweep_removes_a_planted_symlink_not_its_target(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "sentinel"
    sentinel.write_bytes(b"keep me")
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "s.jsonl.tmp.1").symlink_to(sentinel)
    assert len(sweep_temp_files(sessions)) == 1
    assert sentinel.read_bytes() == b"keep me"


def test_open_nofollow_refuses_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OSError) as info:
        open_nofollow(link, os.O_RDONLY)
    assert info.value.errno == errno.ELOOP
    fd = open_nofollow(real, os.O_RDONLY)
    try:
        assert os.get_inheritable(fd) is False  # O_CLOEXEC
    finally:
        os.close(fd)


def test_remove_file_durable(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    assert remove_file_durable(f) is True
    assert not f.exists()
    assert remove_file_durable(f) is False  # missing is fine


def test_fsync_dir_and_write_all(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(NotADirectoryError):
        (tmp_path / "plain").write_bytes(b"")
        fsync_dir(tmp_path / "plain")
    r, w = os.pipe()
    try:
        write_all(w, b"abc" * 10)
        assert os.read(r, 100) == b"abc" * 10
    finally:
        os.close(r)
        os.close(w)


def _dir_fsync_fails(monkeypatch: pytest.MonkeyPatch, directory: Path, err: int) -> list[str]:
    """Every fsync of ``directory`` fails with ``err`` until the list returned gets ``"stop"``."""
    real, seen = os.fsync, []

    def fsync(fd: int) -> None:
        if "stop" not in seen and stat.S_ISDIR(os.fstat(fd).st_mode) \
                and os.readlink(f"/proc/self/fd/{fd}") == str(directory):
            seen.append("failed")
            raise OSError(err, os.strerror(err))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_a_failed_directory_fsync_is_owed_until_the_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """RELIABILITY rule 7: never retry-then-ack. A later fsync that succeeds proves nothing (the failed
    writeback may be dropped), so the directory stays owed for the rest of the process."""
    owed = OwedSyncs()
    target, gone = tmp_path / "f", tmp_path / "g"
    gone.write_bytes(b"x")
    seen = _dir_fsync_fails(monkeypatch, tmp_path, err)
    with pytest.raises(NotDurable) as published:  # in place, durability unknown: IO_ERROR even for ENOSPC
        atomic_write(target, NEW, owed=owed)
    assert published.value.code == "IO_ERROR" and target.read_bytes() == NEW
    with pytest.raises(StorageFull if err == errno.ENOSPC else IOFailure):  # an unlink's: as documented
        remove_file_durable(gone, owed=owed)
    assert not gone.exists() and owed.owed() == [str(tmp_path)]
    with pytest.raises(NotDurable):
        owed.pay()
    failed = len(seen)
    seen.append("stop")
    atomic_write(tmp_path / "h", OLD, owed=owed)  # another write's own fsync succeeds now
    with pytest.raises(NotDurable) as refused:
        owed.pay()
    assert refused.value.code == "IO_ERROR" and "restarts" in refused.value.message
    assert owed.owed() == [str(tmp_path)] and seen[failed:] == ["stop"]  # never fsynced again to pay it
    OwedSyncs().pay()  # the next process trusts the disk


def test_an_owed_directory_that_vanished_is_dropped(tmp_path: Path) -> None:
    owed = OwedSyncs()
    sub = tmp_path / "sub"
    sub.mkdir()
    owed.owe(sub, sub / "b")
    with pytest.raises(NotDurable):
        owed.pay()
    sub.rmdir()
    owed.pay()
    assert owed.owed() == []


def test_owner_only_tightens_a_loose_file_and_leaves_the_rest(tmp_path: Path) -> None:
    loose, tight, target = tmp_path / "loose", tmp_path / "tight", tmp_path / "target"
    for path, mode in ((loose, 0o644), (tight, 0o600), (target, 0o644)):
        path.write_bytes(b"x")
        os.chmod(path, mode)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert owner_only(loose) is True and stat.S_IMODE(loose.stat().st_mode) == 0o600
    assert owner_only(tight) is False and stat.S_IMODE(tight.stat().st_mode) == 0o600
    assert owner_only(tmp_path / "gone") is False
    assert owner_only(link) is False and stat.S_IMODE(target.stat().st_mode) == 0o644  # never through a link
    assert owner_only(tmp_path) is False  # not a regular file
