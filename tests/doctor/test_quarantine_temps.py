"""A doctor killed while it set a damaged setting's bytes aside leaves a temp file in ``quarantine/``
(``kv.<ns>.<key>.<ms>.tmp.<hex>``, the row kept: it goes only once its copy is in place). Before, nothing
removed it: boot swept temp files in every folder it writes but ``quarantine/``, and doctor listed it as a
quarantined file "kept for inspection", for good. Now doctor names it (``temp.files``, repairable) and
``--repair`` removes it, and so does the next boot, each by the exact name such a write gives: never a finished
copy, not even the copy of a key ``tmp`` (``kv.ui.tmp.<ms>``), which the generic temp-name rule would take for
one."""

from __future__ import annotations

import functools

import pytest
import trio

from runtime.datadir import DataDir
from store.doctor import doctor_settings
from store.doctor.doctor import run_doctor
from store.doctor.doctor_report import EXIT_CLEAN, EXIT_REPAIRABLE
from store.doctor.doctor_settings import quarantine_name
from store.faults import Faults, InjectedFault
from store.fsutil import TEMP_MARKER, atomic_write, is_temp_name
from store.indexing.database import QUARANTINE_WRITE_TEMP
from tests.doctor.doctorkit import problems, put_kv, row
from tests.hostkit import inprocess_host


def _crashed_repair(data: DataDir, monkeypatch: pytest.MonkeyPatch, now_ms: int) -> str:
    """``doctor --repair`` killed between its copy's temp write and the link that publishes it: the name of the
    temp file it leaves (made by the repair itself, not by this test)."""
    before = set(_state(data))
    crash = Faults()
    crash.add("rewrite.after_tmp_fsync")
    monkeypatch.setattr(doctor_settings, "atomic_write", functools.partial(atomic_write, faults=crash))
    with pytest.raises(InjectedFault):
        run_doctor(data, repair=True, now_ms=now_ms)
    monkeypatch.undo()
    left = sorted(set(_state(data)) - before)
    assert len(left) == 1, left
    return left[0]


def _state(data: DataDir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in data.quarantine_dir.iterdir()}


def test_a_killed_repairs_temp_file_is_named_and_removed_and_finished_copies_stay(
        data: DataDir, monkeypatch: pytest.MonkeyPatch) -> None:
    put_kv(data, "ui", "tmp", '{"open": tr')
    first = run_doctor(data, repair=True, now_ms=1_765_000_000_000)
    finished = quarantine_name("ui", "tmp", 1_765_000_000_000)
    assert [f.data["movedTo"] for f in first.findings if f.repaired and f.check == "settings.damaged"] == [
        str(data.quarantine_dir / finished)]
    assert is_temp_name(finished)  # the generic rule would sweep this finished copy
    put_kv(data, "app", "settings", '{"language": "e')
    temp = _crashed_repair(data, monkeypatch, 1_765_000_000_500)
    assert temp.startswith(quarantine_name("app", "settings", 1_765_000_000_500) + TEMP_MARKER)
    assert QUARANTINE_WRITE_TEMP.fullmatch(temp) and not QUARANTINE_WRITE_TEMP.fullmatch(finished)
    assert row(data, "SELECT count(*) FROM kv WHERE ns = 'app' AND key = 'settings'") == [(1,)]  # kept: not aside
    before = _state(data)

    found = run_doctor(data, repair=False, now_ms=1_765_000_001_000)
    assert found.exit_code == EXIT_REPAIRABLE
    assert problems(found) == [("settings.damaged", "kv app/settings", "repairable", False),
                               ("temp.files", "quarantine", "repairable", False)]
    assert next(f for f in found.findings if f.check == "temp.files").data["names"] == [temp]
    assert [f.subject for f in found.findings if f.check == "quarantine.file"] == [f"quarantine/{finished}"]
    assert _state(data) == before  # a check writes nothing

    fixed = run_doctor(data, repair=True, now_ms=1_765_000_002_000)
    assert next(f for f in fixed.findings if f.check == "temp.files").repaired
    after = _state(data)
    assert temp not in after and after[finished] == before[finished]
    copy = quarantine_name("app", "settings", 1_765_000_002_000)
    assert after[copy] == b'{"language": "e'  # this run's repair finished what the killed one began
    assert run_doctor(data, repair=False, now_ms=1_765_000_003_000).exit_code == EXIT_CLEAN


def test_boot_removes_a_killed_repairs_temp_file_and_keeps_every_finished_copy(
        data: DataDir, monkeypatch: pytest.MonkeyPatch) -> None:
    put_kv(data, "ui", "tmp", "[")
    run_doctor(data, repair=True, now_ms=1_765_000_000_000)
    put_kv(data, "plugin:acme", "state", "\x00{")
    temp = _crashed_repair(data, monkeypatch, 1_765_000_000_700)
    before = _state(data)
    assert temp in before

    async def boot() -> int:
        async with inprocess_host(data.root) as host:
            return int(host.boot.report["tempFilesRemoved"])

    assert trio.run(boot) == 1
    assert _state(data) == {k: v for k, v in before.items() if k != temp}
