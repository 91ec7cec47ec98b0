"""``pi-host doctor`` as a user runs it: exit codes, ``--json``, the lock, the progress bar."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

from runtime.datadir import DataDir
from tests.doctor.doctorkit import ATTACHMENT_SHA, cli, db, snapshot
from tests.hostkit import REPO, start_host_process


def test_exit_codes_clean_repairable_repaired_damaged(data: DataDir) -> None:
    clean = cli(data)
    assert clean.returncode == 0 and "result: clean (exit 0)" in clean.stdout
    conn = db(data)
    conn.execute("DELETE FROM messages WHERE id = 'a1'")
    conn.close()
    found = cli(data)
    assert found.returncode == 1 and "[repairable] index.session  session alpha" in found.stdout
    assert "run with --repair" in found.stdout
    repaired = cli(data, "--repair")
    assert repaired.returncode == 1 and "(repaired)" in repaired.stdout
    assert cli(data).returncode == 0
    (data.attachments_dir / ATTACHMENT_SHA).unlink()
    damaged = cli(data, "--repair")
    assert damaged.returncode == 2 and "[DAMAGED] attachments.missing_bytes" in damaged.stdout


def test_json_report(data: DataDir) -> None:
    (data.scratch_root / "ghost").mkdir()
    done = cli(data, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == report["exitCode"] == 1
    assert report["schemaVersion"] >= 23 and report["repair"] is False
    assert report["summary"] == {"info": 0, "repairable": 1, "repaired": 0, "damaged": 0}
    assert [(f["check"], f["subject"], f["severity"]) for f in report["findings"]] == [
        ("orphan.scratch", "scratch/ghost", "repairable")]
    assert report["checked"]["sessions"] == 2


def test_refuses_a_directory_a_running_host_holds(data: DataDir) -> None:
    host = start_host_process(data.root)
    try:
        before = snapshot(data.root)
        done = cli(data, "--repair")
        assert done.returncode == 3
        assert "refusing" in done.stderr and "already in use by another pi-host" in done.stderr
        assert done.stdout == ""
    finally:
        host.proc.send_signal(signal.SIGTERM)
        host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0
    assert {k for k in before if k.startswith("sessions/")} == {k for k in snapshot(data.root)
                                                                if k.startswith("sessions/")}
    assert cli(data).returncode == 0  # stopped: now it runs


def test_refuses_something_that_is_not_a_directory(tmp_path: Path) -> None:
    done = cli(DataDir(tmp_path / "nowhere"))
    assert done.returncode == 3 and "is not a directory" in done.stderr


def _run_on_a_terminal(data: DataDir, *args: str) -> str:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data.root), "doctor", *args],
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


def test_progress_bar_only_on_a_terminal(data: DataDir) -> None:
    on_tty = _run_on_a_terminal(data)
    assert "doctor: sessions    [" in on_tty and "2/2" in on_tty
    assert "result: clean (exit 0)" in on_tty
    piped = cli(data)
    assert "[" not in piped.stdout.split("result:")[0].replace("[info]", "") and "\r" not in piped.stdout
    assert "doctor: sessions" not in piped.stdout + piped.stderr
    as_json = _run_on_a_terminal(data, "--json")
    assert "doctor: sessions" not in as_json
    assert json.loads(as_json)["exitCode"] == 0


def test_refuses_a_folder_that_holds_no_pi_host_data(tmp_path: Path) -> None:
    """A folder given by mistake (neither ``pi.sqlite`` nor ``sessions/``) was reported "clean" with an info that
    the next start would create an index: as if its data had been checked. Now it is refused (exit 3), says what
    is missing, and is left as it was; a data directory that only lost its index (``sessions/`` kept) is still
    checked."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a data directory")
    done = cli(DataDir(folder))
    assert done.returncode == 3 and done.stdout == ""
    assert "holds no pi-host data" in done.stderr and "pi.sqlite" in done.stderr and "sessions/" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    (folder / "sessions").mkdir()
    lost_index = cli(DataDir(folder))
    assert lost_index.returncode == 0 and "schema.missing" in lost_index.stdout, lost_index.stdout
