"""``pi-host doctor``: stored settings (the ``kv`` table) the host refuses to read.

A stored value that no longer reads is CORRUPT_DATA for its key, never read as unset
(``store.config.settings``). For most namespaces a ``settings.set`` / ``settings.delete``
writes over it, but the app settings blob ``kv(app, settings)`` (every app setting is a
field of it) and the config-sync settings ``kv(configSync, settings)`` have no repair over
the wire: every read and write of them refuses while they are damaged.

Check ``settings.damaged`` (repairable): every ``kv`` row read the way the host reads it
(:func:`read_as_host`: the store's own readers, no second copy of their rules): a value that
is not JSON, in any namespace (``app``, ``ui``, ``plugin:<id>``, ...); the app blob or the
config-sync settings that are not a JSON object; a skill record that is not an object
(``stored_skill``) or a skill version's digest record that is not one with a ``sha256``
(``stored_version``), a project group record that is not an object (``stored_group``) or group
instructions that are not text (``stored_instructions``); a project or group memory ``memory_view`` refuses.

Repair, per record: its stored bytes, exactly, go to ``quarantine/kv.<ns>.<key>.<ms>``
(``<ns>`` and ``<key>`` in a file-name-safe form, with a short hash of the original when
that had to change it; written whole or not at all, file and directory fsync'd, never over
another file) and only then is the row deleted, in its own transaction. A doctor killed during that write
leaves its temp file (``<name>.tmp.<hex>``, the row kept): the next doctor names it (``temp.files``) and its
``--repair``, like the next boot, removes it (``store.indexing.database.QUARANTINE_WRITE_TEMP``, which knows
this name's form: change both together). The host then reads
the record as unset (the defaults) and a write sets it again. A project group's memory and
instructions (keyed by its id, read and written only through its record) are never deleted with
a repaired group record: each is named as ``settings.groupRowKept`` (info) by that repair.

Check ``settings.groupRowOrphaned`` (info): every such memory or instructions row whose group record is missing
or damaged, on any run (a later one than the repair's too); ``--repair`` keeps it (see
:func:`_unreached_group_rows`).
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from pathlib import Path

from store.config.config_sync import SETTINGS_KEY as SYNC_SETTINGS_KEY
from store.config.config_sync import stored_settings
from store.config.settings import app_blob, get_value
from store.config.settings_rules import APP_NS, APP_SETTINGS_KEY
from store.doctor.doctor_report import DoctorReport, Finding, Severity
from store.doctor.doctor_sessions import DataDirPaths
from store.errors import KV_REPAIR, Conflict, DamagedRecord, StoreError
from store.fsutil import atomic_write, fsync_dir
from store.project_groups import GROUPS_NS, INSTRUCTIONS_NS, MEMORY_NS, stored_group, stored_instructions
from store.project_memory import memory_view
from store.skills import MEMORY_SCOPES, SKILLS_NS, VERSIONS_NS, stored_skill, stored_version

__all__ = ["kv_records", "quarantine_name", "read_as_host"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_NAME_PART = 60

_CONSEQUENCE = {
    (APP_NS, APP_SETTINGS_KEY): "every app setting is a field of it: each read and write of app settings (and "
                                "attachments.gc/estimate/importFile, models.refresh) is CORRUPT_DATA until it is "
                                "repaired; after repair every app setting reads as its default",
    SYNC_SETTINGS_KEY: "configSync.get and configSync.configure are CORRUPT_DATA until it is repaired; after "
                       "repair config sync reads as not configured (configure it again)",
}


def read_as_host(conn: sqlite3.Connection, ns: str, key: str) -> None:
    """Read ``kv(ns, key)`` as the host's readers of it do: ``DamagedRecord`` when they would refuse it."""
    if (ns, key) == (APP_NS, APP_SETTINGS_KEY):
        app_blob(conn)
    elif (ns, key) == SYNC_SETTINGS_KEY:
        stored_settings(conn)
    elif ns == SKILLS_NS:
        stored_skill(conn, key)
    elif ns == VERSIONS_NS:
        stored_version(conn, key)
    elif ns == GROUPS_NS:
        stored_group(conn, key)
    elif ns == INSTRUCTIONS_NS:
        stored_instructions(conn, key)
    elif ns in MEMORY_SCOPES.values():
        found = get_value(conn, ns, key)
        memory_view(found[0] if found is not None else None, f"setting {ns}/{key}", kv=(ns, key))
    else:
        get_value(conn, ns, key)


def _safe(text: str) -> str:
    safe = _UNSAFE.sub("_", text).strip("_")[:_NAME_PART] or "_"
    if safe != text:
        safe += "-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return safe


def quarantine_name(ns: str, key: str, now_ms: int) -> str:
    """``kv.<ns>.<key>.<now_ms>``: the record's names in a file-name-safe form (a short hash of the original
    appended when that form had to change it, so two keys never share a name)."""
    return f"kv.{_safe(ns)}.{_safe(key)}.{now_ms}"


def _set_aside(quarantine_dir: Path, name: str, raw: bytes) -> Path:
    """``raw`` in a new file ``quarantine_dir/name`` (``-<n>`` when taken), durable before this returns."""
    if not quarantine_dir.is_dir():
        quarantine_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fsync_dir(quarantine_dir.parent)
    n = 0
    while True:
        target = quarantine_dir / (name if n == 0 else f"{name}-{n}")
        try:
            atomic_write(target, raw, exclusive=True)
        except Conflict:
            n += 1
            continue
        return target


def _why(exc: DamagedRecord) -> str:
    """The refusal without its pointer to doctor (this is doctor)."""
    return exc.message.split(f"; `{KV_REPAIR}`", 1)[0]


def kv_records(conn: sqlite3.Connection, paths: DataDirPaths, report: DoctorReport, *, repair: bool,
               now_ms: int) -> None:
    rows = [(str(r[0]), str(r[1])) for r in conn.execute("SELECT ns, key FROM kv ORDER BY ns, key").fetchall()]
    report.count("settings", len(rows))
    for ns, key in rows:
        try:
            read_as_host(conn, ns, key)
        except DamagedRecord as exc:
            _damaged(conn, paths, report, ns, key, _why(exc), repair=repair, now_ms=now_ms)
    _unreached_group_rows(conn, report)


def _damaged(conn: sqlite3.Connection, paths: DataDirPaths, report: DoctorReport, ns: str, key: str, why: str, *,
             repair: bool, now_ms: int) -> None:
    raw = conn.execute("SELECT CAST(value_json AS BLOB) FROM kv WHERE ns = ? AND key = ?", (ns, key)).fetchone()[0]
    raw = bytes(raw or b"")
    consequence = _CONSEQUENCE.get((ns, key), "a read of it is CORRUPT_DATA until it is written over or repaired")
    kept = _group_rows(conn, key) if ns == GROUPS_NS else []
    if ns == GROUPS_NS:
        consequence += (" (repair removes this group's record alone: its memory and instructions rows, keyed by its "
                        f"id, stay ({', '.join(f'kv {n}/{k}' for n, k in kept) or 'none stored'}) but no group "
                        "reads them after it; projectGroups.delete over the wire removes all three)")
    finding = report.add("settings.damaged", f"kv {ns}/{key}", f"{why}; {consequence}. Repair sets the stored "
                         f"{len(raw)} byte(s) aside in quarantine/ and deletes the row, so the host reads it as "
                         "unset and a write sets it again", Severity.REPAIRABLE, ns=ns, key=key, bytes=len(raw))
    if not repair:
        return
    try:
        target = _set_aside(paths.quarantine_dir, quarantine_name(ns, key, now_ms), raw)
    except (StoreError, OSError) as exc:  # nothing is deleted whose bytes are not safely aside
        finding.data["repairError"] = str(exc)
        return
    finding.data["movedTo"] = str(target)
    finding.detail += f"; its bytes are in {target}"
    conn.execute("BEGIN IMMEDIATE")
    try:
        deleted = conn.execute("DELETE FROM kv WHERE ns = ? AND key = ? AND CAST(value_json AS BLOB) = ?",
                               (ns, key, raw)).rowcount
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    finding.repaired = deleted == 1
    if finding.repaired and kept:
        _report_kept(report, finding, key, kept)


def _group_rows(conn: sqlite3.Connection, group_id: str) -> list[tuple[str, str]]:
    """The ``kv`` rows keyed by ``group_id`` that only its group record reaches (memory, instructions)."""
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT ns, key FROM kv WHERE ns IN (?, ?) AND key = ? ORDER BY ns", (MEMORY_NS, INSTRUCTIONS_NS, group_id))]


def _group_row_what(ns: str, group_id: str) -> str:
    return f"the {'memory' if ns == MEMORY_NS else 'instructions'} of project group {group_id}"


def _reach(ns: str, group_id: str) -> str:
    return (f"settings.get {{ns: {ns}, key: {group_id}}} reads it, projectGroups.delete {{groupId: {group_id}}} "
            "removes it")


def _unreached_group_rows(conn: sqlite3.Connection, report: DoctorReport) -> None:
    """Check ``settings.groupRowOrphaned`` (info): a group's memory or instructions row whose group record is
    missing or damaged, so no ``projectGroups.*`` call reads or writes it (a repair of that record earlier, a
    salvage that did not carry it, a record damaged now). ``--repair`` leaves it: it is the user's text, intact,
    and the wire still reads it (``settings.get``) and removes it (``projectGroups.delete``); a group record
    cannot be made up for it (its name and roots are gone). A row this run's repair already named
    (``settings.groupRowKept``) is not named twice."""
    named = {(f.data["ns"], f.data["key"]) for f in report.findings if f.check == "settings.groupRowKept"}
    rows = conn.execute("SELECT ns, key FROM kv WHERE ns IN (?, ?) ORDER BY key, ns", (MEMORY_NS, INSTRUCTIONS_NS))
    for ns, key in [(str(r[0]), str(r[1])) for r in rows.fetchall()]:
        if (ns, key) in named:
            continue
        try:
            if stored_group(conn, key) is not None:
                continue
            group = "missing"
        except DamagedRecord:
            group = "damaged"
        state = ("there is no record of that group" if group == "missing" else
                 "that group's record is damaged (settings.damaged)")
        report.add("settings.groupRowOrphaned", f"kv {ns}/{key}",
                   f"{_group_row_what(ns, key)}: {state}, so no group reads or writes it (projectGroups.get of "
                   f"the group is {'NOT_FOUND' if group == 'missing' else 'CORRUPT_DATA'}); kept, repair "
                   f"leaves it (user text); {_reach(ns, key)}", Severity.INFO, ns=ns, key=key, groupId=key,
                   group=group)


def _report_kept(report: DoctorReport, finding: Finding, group_id: str, kept: list[tuple[str, str]]) -> None:
    """A repaired group record's memory and instructions stay (user data, never deleted by doctor), but
    ``projectGroups.get`` / ``setMemory`` / ``setInstructions`` read and write them only through that record:
    each is named (``settings.groupRowKept``, info) so a person can read it and remove it."""
    finding.data["keptRows"] = [{"ns": n, "key": k} for n, k in kept]
    finding.detail += f"; kept, reached by no group now: {', '.join(f'kv {n}/{k}' for n, k in kept)}"
    for ns, key in kept:
        report.add("settings.groupRowKept", f"kv {ns}/{key}",
                   f"{_group_row_what(ns, group_id)}, whose damaged record --repair set aside: kept, but no group "
                   f"reads it now (projectGroups.get of the group is NOT_FOUND); {_reach(ns, group_id)}",
                   Severity.INFO, ns=ns, key=key, groupId=group_id)
