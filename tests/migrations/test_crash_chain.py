"""SIGKILL inside every step of the chain (``RT_CRASHPOINT``), then a restart.

The host kills itself at ``migrate.<from>_<to>.before_commit`` (the step's
transaction is open, its changes written but not committed) in every step and,
for the steps that take one, at ``.after_backup`` (CI-sized: every other such
step; every one under ``PIHOST_SOAK=1``, see ``tests/soak.py``). After each kill the file holds
exactly the old version's layout and rows (never a mixture); the next start
carries the chain one step further, and the last one finishes it with every
row and every transcript byte intact.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

from store.upgrade.schema import SCHEMA_VERSION
from tests.hostkit import serve_until_exit, start_host_process
from tests.migrations.dbcheck import file_layout, host_layout, open_copy, seed_layout, user_version
from tests.migrations.seedkit import after_boot, assert_rows_present, build_seed_dir, expected_rows
from tests.soak import soak

CHAIN_FROM_7 = [(7, 8), (8, 11), (11, 14), (14, 15), (15, 16), (16, 17), (17, 18), (18, 19), (19, 20), (20, 21),
                (21, 22), (22, 23), (23, 24), (24, 25), (25, 26), (26, 27), (27, 28), (28, 29), (29, 30), (30, 31),
                (31, 32)]
TAKES_BACKUP = {7, 8, 11, 14, 15, 16, 17, 18, 19, 21}
# each kill is a host start (~2 s); before_commit is killed in every step, after_backup in every other
# backup-taking step in CI (7, 11, 15, 17, 19) and in all of them under PIHOST_SOAK=1
KILLED_AFTER_BACKUP = set(sorted(TAKES_BACKUP)[::soak(2, 1)])


def _serve_until_killed(data: Path, point: str) -> int:
    return serve_until_exit(data, env={"RT_CRASHPOINT": f"{point}:1:kill"})


def _layout_of(version: int) -> object:
    return seed_layout(version) if version <= 19 else host_layout(version)


def test_sigkill_at_every_step_leaves_one_version_and_the_chain_completes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = build_seed_dir(data, 7)
    layouts = {v: _layout_of(v) for step in CHAIN_FROM_7 for v in step}
    for start, end in CHAIN_FROM_7:
        points = [f"migrate.{start}_{end}.after_backup"] if start in KILLED_AFTER_BACKUP else []
        for point in [*points, f"migrate.{start}_{end}.before_commit"]:
            assert _serve_until_killed(data, point) == -signal.SIGKILL, point
            # the old version, whole: its layout, its version number, the rows it had
            assert user_version(seed.db) == start, point
            assert file_layout(seed.db) == layouts[start], point
            with open_copy(seed.db) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                assert_rows_present(conn, {t: seed.rows[t] for t in ("providers", "secrets_meta", "notifications")})
            assert not (data / "host.json").exists()
        # the next start gets exactly one step further (it dies at the next step's point)
    host = start_host_process(data)
    host.proc.send_signal(signal.SIGTERM)
    host.proc.communicate(timeout=60)
    assert host.proc.returncode == 0
    assert user_version(seed.db) == SCHEMA_VERSION
    conn = sqlite3.connect(seed.db)
    try:
        assert_rows_present(conn, after_boot(expected_rows(seed)))
        report = json.loads(conn.execute("SELECT report_json FROM boot_reports ORDER BY started_at DESC")
                            .fetchone()[0])
    finally:
        conn.close()
    assert report["database"]["steps"] == [32]  # the last kill was inside 31→32
    assert seed.file_bytes() == seed.files
    # every step that takes a backup left one (killed after it, or before its commit), and a restart's
    # repeated backup of a version never replaces the first
    names = {p.name for p in data.iterdir() if ".bak" in p.name}
    for version in TAKES_BACKUP:
        assert f"pi.sqlite.v{version}.bak" in names
    assert not any(".tmp-" in n for n in names)


def test_sigkill_right_after_a_commit_resumes_from_the_new_version(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed = build_seed_dir(data, 10)
    assert _serve_until_killed(data, "migrate.10_11.after_commit") == -signal.SIGKILL
    assert user_version(seed.db) == 11 and file_layout(seed.db) == seed_layout(11)
    assert _serve_until_killed(data, "migrate.19_20.after_commit") == -signal.SIGKILL
    assert user_version(seed.db) == 20 and file_layout(seed.db) == host_layout(20)
    host = start_host_process(data)
    host.proc.send_signal(signal.SIGTERM)
    host.proc.communicate(timeout=60)
    conn = sqlite3.connect(seed.db)
    try:
        assert_rows_present(conn, after_boot(expected_rows(seed)))
    finally:
        conn.close()
