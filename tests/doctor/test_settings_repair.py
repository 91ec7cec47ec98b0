"""``pi-host doctor``: a stored setting the host refuses to read (``settings.damaged``).

The app settings blob and the config-sync settings have no repair over the wire (every read and write of them
is CORRUPT_DATA while they are damaged); before, only editing SQLite by hand got a user out. Doctor finds every
``kv`` row the host's own readers refuse, and ``--repair`` sets its exact bytes aside in ``quarantine/`` and
deletes the row, so the host reads the record as unset (its defaults) and a write sets it again.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from runtime.datadir import DataDir
from store.doctor import doctor_settings
from store.doctor.doctor import run_doctor
from store.doctor.doctor_report import EXIT_CLEAN, EXIT_REPAIRABLE
from store.doctor.doctor_settings import quarantine_name, read_as_host
from store.errors import KV_REPAIR, IOFailure
from tests.doctor.doctorkit import cli, doctor, problems, put_kv, row, snapshot
from tests.hostkit import client_for, inprocess_host
from tests.turns.turnkit import rpc_error


def _kv(data: DataDir) -> dict[tuple[str, str], bytes]:
    return {(r[0], r[1]): bytes(r[2]) for r in row(data, "SELECT ns, key, CAST(value_json AS BLOB) FROM kv")}


DAMAGE = [
    ("app", "settings", '{"language": "e'),  # cut: not JSON
    ("app", "settings", "[1200]"),  # JSON, but the blob is an object
    ("configSync", "settings", '"enabled"'),
    ("projectMemory", "/w/a b", '{"format": "entries-v1", "entries": [{"x": 1}]}'),  # memory_view refuses it
    ("projectGroupMemory", "g1", "7"),
    ("skills", "release-notes", '["a skill"]'),  # JSON, but a skill record is an object (skills.get refuses it)
    ("skillVersions", "release-notes@1.0.0", '{"sizeBytes": 812}'),  # a version's digest record has a sha256
    ("projectGroups", "g-1", '"Parser"'),  # JSON, but a group record is an object (projectGroups.get refuses it)
    ("projectGroupInstructions", "g-1", '{"text": "be brief"}'),  # JSON, but instructions are text
    ("ui", "panel", '{"open": tr'),
    ("plugin:acme", "state", "\x00{"),
]


@pytest.mark.parametrize(("ns", "key", "stored"), DAMAGE, ids=[f"{n}/{k}:{i}" for i, (n, k, _) in enumerate(DAMAGE)])
def test_a_damaged_setting_is_found_then_set_aside_and_deleted(data: DataDir, ns: str, key: str,
                                                               stored: str) -> None:
    put_kv(data, "ui", "fine", '[1, 2]')  # any JSON is a healthy value of a namespace the host does not own
    put_kv(data, ns, key, stored)
    before = snapshot(data.root)
    kept = {k: v for k, v in _kv(data).items() if k != (ns, key)}

    found = doctor(data)
    assert found.exit_code == EXIT_REPAIRABLE
    assert problems(found) == [("settings.damaged", f"kv {ns}/{key}", "repairable", False)]
    finding = next(f for f in found.findings if f.check == "settings.damaged")
    assert (finding.data["ns"], finding.data["key"]) == (ns, key)
    assert KV_REPAIR not in finding.detail  # the refusal's reason, not its pointer back to doctor
    assert snapshot(data.root) == before, "doctor without --repair changed a file"

    fixed = doctor(data, repair=True)
    finding = next(f for f in fixed.findings if f.check == "settings.damaged")
    assert finding.repaired, problems(fixed)
    moved = Path(finding.data["movedTo"])
    assert moved.parent == data.quarantine_dir and moved.name.startswith(quarantine_name(ns, key, 0)[:-1])
    assert str(moved) in finding.detail
    assert moved.read_bytes() == stored.encode("utf-8")  # the exact bytes, set aside before the row went
    assert _kv(data) == kept  # that row alone is gone
    conn = sqlite3.connect(data.db_path)
    try:
        read_as_host(conn, ns, key)  # reads as unset now
    finally:
        conn.close()

    again = doctor(data)
    assert again.exit_code == EXIT_CLEAN, problems(again)
    assert [f.subject for f in again.findings if f.check == "quarantine.file"] == [f"quarantine/{moved.name}"]


def test_quarantine_names_are_safe_distinct_and_never_reused(data: DataDir) -> None:
    assert quarantine_name("app", "settings", 5) == "kv.app.settings.5"
    odd = quarantine_name("plugin:acme", "/w/a b/../x", 5)
    assert "/" not in odd and ".." not in odd and odd.startswith("kv.plugin_acme-")
    assert quarantine_name("ui", "a b", 5) != quarantine_name("ui", "a_b", 5)
    put_kv(data, "app", "settings", "{")
    data.quarantine_dir.mkdir(exist_ok=True)
    name = quarantine_name("app", "settings", 7)
    (data.quarantine_dir / name).write_bytes(b"an earlier run's")
    report = run_doctor(data, repair=True, now_ms=7)
    finding = next(f for f in report.findings if f.check == "settings.damaged")
    assert finding.repaired and finding.data["movedTo"] == str(data.quarantine_dir / f"{name}-1")
    assert (data.quarantine_dir / name).read_bytes() == b"an earlier run's"
    assert (data.quarantine_dir / f"{name}-1").read_bytes() == b"{"


def test_bytes_that_cannot_be_set_aside_keep_their_row(data: DataDir, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row goes only once its bytes are durably in quarantine/: a failed write of them deletes nothing."""
    put_kv(data, "app", "settings", "{")

    def no_room(*_args: object, **_kwargs: object) -> None:
        raise IOFailure("fsync failed")

    monkeypatch.setattr(doctor_settings, "atomic_write", no_room)
    report = doctor(data, repair=True)
    finding = next(f for f in report.findings if f.check == "settings.damaged")
    assert not finding.repaired and "fsync failed" in finding.data["repairError"] and "movedTo" not in finding.data
    assert _kv(data)[("app", "settings")] == b"{"
    monkeypatch.undo()
    assert next(f for f in doctor(data, repair=True).findings if f.check == "settings.damaged").repaired


def _stop_damage(root: Path, ns: str, key: str, stored: str) -> None:
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        with conn:
            assert conn.execute("UPDATE kv SET value_json = ? WHERE ns = ? AND key = ?",
                                (stored, ns, key)).rowcount == 1
    finally:
        conn.close()


def test_end_to_end_a_damaged_app_blob_is_repaired_by_doctor_and_set_again(tmp_path: Path) -> None:
    """Set → stop → damage → doctor reports it (exit 1) → --repair → the next host reads defaults and sets."""
    root = tmp_path / "data"
    cut = '{"largePasteThreshold": 12'

    async def before() -> dict[str, object]:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            defaults = (await ui.call("settings.getAll", {}))["values"]
            await ui.call("settings.update", {"values": {"largePasteThreshold": 1200,
                                                         "thinkingDisplayMode": "compact"}})
            await ui.call("configSync.configure", {"enabled": True, "webdavUrl": "https://dav.example/pi"})
            assert (await ui.call("settings.getAll", {}))["values"] != defaults
        return dict(defaults)

    async def damaged() -> None:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            assert (await ui.call("settings.getAll", {}))["unreadable"] == ["settings"]  # the defaults, named
            for method, params in (("settings.set", {"key": "language", "value": "de"}), ("configSync.get", {})):
                err = await rpc_error(ui.call(method, params))
                assert err.data_code == "CORRUPT_DATA", method
                assert err.data["repair"] == KV_REPAIR and KV_REPAIR in str(err), method

    async def after(defaults: dict[str, object]) -> None:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            assert (await ui.call("settings.getAll", {}))["values"] == defaults
            assert (await ui.call("configSync.get", {}))["settings"] == {"enabled": False}
            await ui.call("settings.set", {"key": "largePasteThreshold", "value": 900})
            assert (await ui.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 900
            await ui.call("configSync.configure", {"enabled": True, "webdavUrl": "https://dav.example/again"})

    defaults = trio.run(before)
    _stop_damage(root, "app", "settings", cut)
    _stop_damage(root, "configSync", "settings", "[]")
    trio.run(damaged)

    data = DataDir(root)
    checked = cli(data, "--json")
    assert checked.returncode == EXIT_REPAIRABLE, checked.stderr
    report = json.loads(checked.stdout)
    damaged_rows = sorted(f["subject"] for f in report["findings"] if f["check"] == "settings.damaged")
    assert damaged_rows == ["kv app/settings", "kv configSync/settings"]
    assert all(f["severity"] == "repairable" for f in report["findings"] if f["check"] == "settings.damaged")
    text = cli(data)
    assert text.returncode == EXIT_REPAIRABLE and "settings.damaged  kv app/settings" in text.stdout

    repaired = cli(data, "--repair", "--json")
    assert repaired.returncode == EXIT_REPAIRABLE, repaired.stderr  # the doctor's convention: 1 when repairable
    moved = {f["subject"]: Path(f["data"]["movedTo"]) for f in json.loads(repaired.stdout)["findings"]
             if f["check"] == "settings.damaged" and f["repaired"]}
    assert moved["kv app/settings"].read_bytes() == cut.encode()
    assert moved["kv configSync/settings"].read_bytes() == b"[]"
    assert cli(data).returncode == EXIT_CLEAN

    trio.run(after, defaults)


def test_repair_of_a_damaged_group_record_names_the_memory_and_instructions_it_leaves(tmp_path: Path) -> None:
    """A group's memory and instructions are keyed by its id and reached only through its record: after
    --repair sets a damaged record aside, projectGroups.get of the group is NOT_FOUND and setMemory /
    setInstructions refuse, so those rows would sit unreachable by any group, unnamed. Doctor keeps them (user
    data) and names each (``settings.groupRowKept``, info, and ``keptRows`` of the repaired finding); the wire
    still reads them (settings.get) and projectGroups.delete removes them."""
    root = tmp_path / "data"
    (tmp_path / "proj").mkdir()

    async def before() -> str:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            gid = str((await ui.call("projectGroups.save", {"name": "G", "roots": [str(tmp_path / "proj")]}))
                      ["group"]["id"])
            await ui.call("projectGroups.setMemory", {"groupId": gid, "memory": "group notes"})
            await ui.call("projectGroups.setInstructions", {"groupId": gid, "instructions": "be brief"})
            return gid

    gid = trio.run(before)
    _stop_damage(root, "projectGroups", gid, '["G"]')
    data = DataDir(root)
    rows = {k: v for k, v in _kv(data).items() if k[1] == gid and k[0] != "projectGroups"}
    assert sorted(rows) == [("projectGroupInstructions", gid), ("projectGroupMemory", gid)]

    found = next(f for f in doctor(data).findings if f.check == "settings.damaged")
    assert f"kv projectGroupMemory/{gid}" in found.detail and f"kv projectGroupInstructions/{gid}" in found.detail
    fixed = doctor(data, repair=True)
    finding = next(f for f in fixed.findings if f.check == "settings.damaged")
    assert finding.repaired and finding.data["keptRows"] == [{"ns": "projectGroupInstructions", "key": gid},
                                                              {"ns": "projectGroupMemory", "key": gid}]
    kept = sorted((f.subject, str(f.severity), f.data["groupId"]) for f in fixed.findings
                  if f.check == "settings.groupRowKept")
    assert kept == [(f"kv projectGroupInstructions/{gid}", "info", gid), (f"kv projectGroupMemory/{gid}", "info", gid)]
    assert {k: v for k, v in _kv(data).items() if k[1] == gid} == rows  # the record alone went, the rest byte-exact
    assert doctor(data).exit_code == EXIT_CLEAN

    async def after() -> None:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            assert (await rpc_error(ui.call("projectGroups.get", {"groupId": gid}))).data_code == "NOT_FOUND"
            refused = await rpc_error(ui.call("projectGroups.setInstructions", {"groupId": gid, "instructions": "x"}))
            assert refused.data_code == "NOT_FOUND"
            got = await ui.call("settings.get", {"ns": "projectGroupInstructions", "key": gid})
            assert got["value"] == "be brief"
            assert (await ui.call("projectGroups.delete", {"groupId": gid}))["deleted"] is False
            assert (await ui.call("settings.get", {"ns": "projectGroupMemory", "key": gid})).get("value") is None

    trio.run(after)
    assert not [k for k in _kv(data) if k[1] == gid]


def _orphaned(report: dict[str, object]) -> list[tuple[str, str, str, str]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return sorted((f["subject"], f["severity"], f["data"]["groupId"], f["data"]["group"]) for f in findings
                  if f["check"] == "settings.groupRowOrphaned")


def test_a_later_doctor_run_names_group_rows_whose_record_is_damaged_or_gone_and_keeps_them(tmp_path: Path) -> None:
    """After the repair that set a damaged group record aside, its memory and instructions rows sat unreached by
    any group, and only that repair's report named them: every later ``pi-host doctor`` ran clean and silent.
    Now each run names such rows (``settings.groupRowOrphaned``, info: exit 0 when nothing else is wrong), whether
    the record is damaged (before the repair) or gone (after it, or lost otherwise); ``--repair`` keeps them (the
    user's text, still read by settings.get and removed by projectGroups.delete)."""
    root = tmp_path / "data"
    for name in ("p1", "p2"):
        (tmp_path / name).mkdir()

    async def before() -> tuple[str, str]:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            ids = []
            for name in ("p1", "p2"):
                saved = await ui.call("projectGroups.save", {"name": name, "roots": [str(tmp_path / name)]})
                gid = str(saved["group"]["id"])
                await ui.call("projectGroups.setMemory", {"groupId": gid, "memory": f"{name} notes"})
                await ui.call("projectGroups.setInstructions", {"groupId": gid, "instructions": f"{name}: brief"})
                ids.append(gid)
            return ids[0], ids[1]

    damaged, lost = trio.run(before)
    _stop_damage(root, "projectGroups", damaged, '["p1"]')
    conn = sqlite3.connect(root / "pi.sqlite")
    try:
        with conn:
            conn.execute("DELETE FROM kv WHERE ns = 'projectGroups' AND key = ?", (lost,))
    finally:
        conn.close()
    data = DataDir(root)
    rows = {k: v for k, v in _kv(data).items() if k[0] != "projectGroups"}
    gone = [(f"kv projectGroupInstructions/{lost}", "info", lost, "missing"),
            (f"kv projectGroupMemory/{lost}", "info", lost, "missing")]

    checked = cli(data, "--json")
    assert checked.returncode == EXIT_REPAIRABLE, checked.stderr  # the damaged record, as before
    assert _orphaned(json.loads(checked.stdout)) == sorted(
        [(f"kv projectGroupInstructions/{damaged}", "info", damaged, "damaged"),
         (f"kv projectGroupMemory/{damaged}", "info", damaged, "damaged"), *gone])
    text = cli(data)
    assert f"settings.groupRowOrphaned  kv projectGroupMemory/{lost}" in text.stdout

    repaired = json.loads(cli(data, "--repair", "--json").stdout)
    assert sorted(f["subject"] for f in repaired["findings"] if f["check"] == "settings.groupRowKept") == [
        f"kv projectGroupInstructions/{damaged}", f"kv projectGroupMemory/{damaged}"]
    assert _orphaned(repaired) == gone  # the rows this repair named are not named twice

    for args in (("--json",), ("--repair", "--json")):  # any later run, checking or repairing
        later = cli(data, *args)
        assert later.returncode == EXIT_CLEAN, later.stdout
        assert _orphaned(json.loads(later.stdout)) == sorted(
            [(f"kv projectGroupInstructions/{damaged}", "info", damaged, "missing"),
             (f"kv projectGroupMemory/{damaged}", "info", damaged, "missing"), *gone])
        assert {k: v for k, v in _kv(data).items() if k[0] != "projectGroups"} == rows  # kept, byte-exact

    async def after() -> None:
        async with inprocess_host(root) as host, client_for(host, "ui", kind="ui") as ui:
            got = await ui.call("settings.get", {"ns": "projectGroupInstructions", "key": lost})
            assert got["value"] == "p2: brief"
            for gid in (damaged, lost):
                await ui.call("projectGroups.delete", {"groupId": gid})

    trio.run(after)
    cleared = cli(data, "--json")
    assert cleared.returncode == EXIT_CLEAN and _orphaned(json.loads(cleared.stdout)) == []
