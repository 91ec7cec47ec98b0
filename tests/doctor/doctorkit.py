"""A data directory a real host wrote (sessions, attachments, secrets, receipts), and ways to damage it."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from runtime.datadir import DataDir
from store.doctor.doctor import run_doctor
from store.doctor.doctor_report import DoctorReport
from tests.hostkit import client_for, inprocess_host, msg, run_cli

ATTACHMENT = b"doctor attachment bytes\n" * 10
ATTACHMENT_SHA = hashlib.sha256(ATTACHMENT).hexdigest()
SECRET_REF = "provider/doctor"


async def _fill(root: Path) -> None:
    async with inprocess_host(root) as running, client_for(running, "doctor-kit") as c:
        await c.call("session.create", {"sessionId": "alpha", "title": "Alpha"})
        await c.call("session.create", {"sessionId": "beta", "title": "Beta"})
        put = await c.call("attachments.put", {"name": "notes.txt", "mimeType": "text/plain",
                                               "dataBase64": base64.b64encode(ATTACHMENT).decode()})
        assert put["sha256"] == ATTACHMENT_SHA, put
        for i in range(4):
            message = msg(f"a{i}", f"alpha message {i} 数据库", role="user" if i % 2 == 0 else "assistant")
            if i == 1:
                message["blocks"].append({"type": "attachment", "kind": "file", "name": "notes.txt",
                                          "ref": f"attachments/{ATTACHMENT_SHA}"})
            await c.call("session.appendMessage", {"sessionId": "alpha", "submissionId": f"sub-a{i}",
                                                   "message": message})
        await c.call("attachments.ref", {"sha256": ATTACHMENT_SHA, "sessionId": "alpha", "messageId": "a1"})
        for i in range(3):
            await c.call("session.appendMessage", {"sessionId": "beta", "message": msg(f"b{i}", f"beta {i}")})
        await c.call("session.deleteMessage", {"sessionId": "beta", "messageId": "b1"})
        await c.call("session.appendMessage", {"sessionId": "beta", "message": {
            "id": "t1", "role": "tool", "toolName": "Bash", "blocks": [
                {"type": "tool_call", "callId": "c1", "name": "Bash", "args": {"command": "make"},
                 "status": "error", "result": "OperationalError: database is locked"}]}})
        await c.call("secrets.set", {"ref": SECRET_REF, "value": "s3cret"})
        await c.call("settings.set", {"key": "language", "value": "en", "submissionId": "set-1"})


def build_template(root: Path) -> Path:
    trio.run(_fill, root)
    return root


def copy_dir(template: Path, target: Path) -> DataDir:
    shutil.copytree(template, target, symlinks=True)
    return DataDir(target)


def doctor(data: DataDir, *, repair: bool = False) -> DoctorReport:
    return run_doctor(data, repair=repair, now_ms=int(time.time() * 1000))


def cli(data: DataDir, *args: str) -> subprocess.CompletedProcess[str]:
    """``pi-host doctor`` on ``data`` (forked like a test host, :func:`tests.hostkit.run_cli`)."""
    return run_cli("--data-dir", str(data.root), "doctor", *args)


def db(data: DataDir) -> sqlite3.Connection:
    conn = sqlite3.connect(data.db_path, isolation_level=None)
    conn.execute("PRAGMA trusted_schema = ON")
    return conn


def put_kv(data: DataDir, ns: str, key: str, value_json: str | bytes) -> None:
    """``kv(ns, key)`` stored as ``value_json`` exactly (inserted, or written over), as damage leaves it."""
    conn = db(data)
    try:
        conn.execute("INSERT INTO kv(ns, key, value_json, updated_at) VALUES (?, ?, ?, 1) ON CONFLICT(ns, key) "
                     "DO UPDATE SET value_json = excluded.value_json", (ns, key, value_json))
    finally:
        conn.close()


def checks(report: DoctorReport, severity: str | None = None) -> list[str]:
    return sorted(f.check for f in report.findings if severity is None or str(f.severity) == severity)


def problems(report: DoctorReport) -> list[tuple[str, str, str, bool]]:
    """(check, subject, severity, repaired) of everything that is not merely info."""
    return sorted((f.check, f.subject, str(f.severity), f.repaired) for f in report.findings
                  if str(f.severity) != "info")


def snapshot(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if name in ("host.lock",):
                continue
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


def row(data: DataDir, sql: str, *args: Any) -> Any:
    conn = db(data)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
