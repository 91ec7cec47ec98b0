"""Files the host opens for a client or finds in its data directory (issue 18 "Files outside the data
directory", "Blocking paths" and "Planted symlinks" findings)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError
from runtime.datadir import DataDir, DataDirUnsafe
from tests.hostkit import client_for, inprocess_host, msg, run_cli, start_host_process

MARKDOWN = "# Plan\n\n1. do it\n"


async def _code(c: HostClient, method: str, params: dict[str, Any]) -> str:
    with pytest.raises(RpcError) as exc:
        await c.call(method, params)
    return exc.value.data_code


def _blobs(root: Path) -> list[str]:
    """The blob files (not temp files, nor the metadata file beside each blob)."""
    return sorted(n for n in os.listdir(root / "attachments") if ".tmp." not in n and not n.endswith(".meta"))


async def test_import_file_reads_only_under_allowed_roots(tmp_path: Path) -> None:
    """Finding "attachments.importFile copies any readable file given an absolute path — /etc/passwd,
    /proc/self/environ, the host's own host.token": only the session's project, scratch/ and configured
    roots are readable, the data directory never (even inside a project), no symlink is followed."""
    data = tmp_path / "data"
    project = tmp_path / "project"  # its parent (tmp_path) also holds the data directory
    (project / "sub").mkdir(parents=True)
    (project / "ok.txt").write_bytes(b"project file")
    (project / "sub" / "deep.txt").write_bytes(b"deep file")
    os.symlink("/etc/passwd", project / "passwd-link")
    os.symlink("/etc", project / "etc-link")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(project)}))["id"]
            wide = (await c.call("session.create", {"title": "w", "projectPath": str(tmp_path)}))["id"]
            for path in ("/etc/passwd", "/proc/self/environ", str(data / "host.token")):
                assert await _code(c, "attachments.importFile", {"path": path}) == "PERMISSION_DENIED", path
                assert await _code(c, "attachments.importFile", {"path": path, "sessionId": sid}) == \
                    "PERMISSION_DENIED", path
            # a project that contains the data directory still does not open the data directory
            for name in ("host.token", "pi.sqlite", "secrets/.machine-key"):
                got = await _code(c, "attachments.importFile", {"path": str(data / name), "sessionId": wide})
                assert got == "PERMISSION_DENIED", name
            traversal = f"{project}/../../../../etc/passwd"
            assert await _code(c, "attachments.importFile", {"path": traversal, "sessionId": sid}) == \
                "PERMISSION_DENIED"
            for link in ("passwd-link", "etc-link/passwd"):
                assert await _code(c, "attachments.importFile", {"path": f"{project}/{link}", "sessionId": sid}) == \
                    "INVALID_PARAMS", link
            assert await _code(c, "attachments.importFile", {"path": f"{project}/missing", "sessionId": sid}) == \
                "NOT_FOUND"
            assert await _code(c, "attachments.importFile", {"path": str(project / "sub"), "sessionId": sid}) == \
                "INVALID_PARAMS"
            assert _blobs(data) == []
            ok = await c.call("attachments.importFile", {"path": str(project / "ok.txt"), "sessionId": sid})
            deep = await c.call("attachments.importFile", {"path": str(project / "sub" / "deep.txt"),
                                                           "sessionId": sid})
            scratch = data / "scratch" / sid
            scratch.mkdir(parents=True, exist_ok=True)
            (scratch / "pasted.txt").write_bytes(b"pasted")
            pasted = await c.call("attachments.importFile", {"path": str(scratch / "pasted.txt")})
            assert _blobs(data) == sorted({ok["sha256"], deep["sha256"], pasted["sha256"]})


async def test_import_roots_from_config(tmp_path: Path) -> None:
    """Configured import roots (serve --import-root) are readable without a session."""
    extra = tmp_path / "shared"
    extra.mkdir()
    (extra / "f.bin").write_bytes(b"x" * 100)
    with trio.fail_after(30):
        async with inprocess_host(tmp_path / "data", import_roots=(str(extra),)) as host, client_for(host) as c:
            assert (await c.call("attachments.importFile", {"path": str(extra / "f.bin")}))["size"] == 100


async def test_fifo_given_to_import_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """Finding "a FIFO given to attachments.importFile blocks the blob worker forever (every later
    attachments.* call gets no reply, SIGTERM hangs)": refused at once, the blob store keeps serving,
    and the host stops on SIGTERM."""
    project = tmp_path / "project"
    project.mkdir()
    fifo = project / "pipe"
    os.mkfifo(fifo)
    (project / "dev-null-link").symlink_to("/dev/null")
    host = await trio.to_thread.run_sync(start_host_process, tmp_path / "data")
    try:
        from runtime.client import open_client

        with trio.fail_after(20):
            async with open_client(host.url, host.token, client_id="fifo", client_kind="test") as c:
                sid = (await c.call("session.create", {"title": "p", "projectPath": str(project)}))["id"]
                for _ in range(3):
                    assert await _code(c, "attachments.importFile", {"path": str(fifo), "sessionId": sid}) == \
                        "INVALID_PARAMS"
                put = await c.call("attachments.put", {"name": "a", "mimeType": "text/plain", "dataBase64": "YQ=="})
                assert put["size"] == 1
        code = await trio.to_thread.run_sync(lambda: host.terminate(timeout=30))
        assert code == 0
    finally:
        await trio.to_thread.run_sync(host.kill9)
        for pipe in (host.proc.stdout, host.proc.stderr):
            if pipe is not None:
                pipe.close()


async def test_plan_artifact_replaced_by_a_fifo_does_not_wedge_the_session(tmp_path: Path) -> None:
    """Finding "a plan artifact replaced by a FIFO (an agent can write the workspace) wedges the session
    actor (plans.respond times out, then session.get never answers)": CORRUPT_DATA at once, the session
    keeps answering, the row stays pending."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with trio.fail_after(20):
        async with inprocess_host(tmp_path / "data") as host, client_for(host) as c:
            sid = (await c.call("session.create", {"title": "p", "projectPath": str(ws), "mode": "plan"}))["id"]
            req = await c.call("plans.submit", {"sessionId": sid, "turnId": "t1", "toolCallId": "c1", "kind": "plan",
                                                "markdown": MARKDOWN, "title": "T", "question": "Q?",
                                                "workspaceRoot": str(ws)})
            art = ws / req["artifactPath"]
            for swap in ("fifo", "symlink-dir"):
                if swap == "fifo":
                    art.unlink()
                    os.mkfifo(art)
                else:  # the plan folder itself replaced by a symlink to a copy
                    art.unlink()
                    real = ws / "elsewhere"
                    real.mkdir()
                    (real / art.name).write_text(MARKDOWN)
                    (ws / ".pi" / "plan").rmdir()
                    (ws / ".pi" / "plan").symlink_to(real)
                with trio.fail_after(5):
                    got = await _code(c, "plans.respond", {"requestId": req["requestId"], "action": "approve"})
                assert got == "CORRUPT_DATA", swap
                with trio.fail_after(5):
                    assert (await c.call("session.get", {"sessionId": sid}))["session"]["id"] == sid
            assert (await c.call("plans.pending", {}))["pending"][0]["status"] == "pending"


def _transcript(sid: str, text: str) -> bytes:
    return (b'{"type":"session","schema":1,"sessionId":"' + sid.encode() + b'","createdAt":"2026-01-01T00:00:00.000Z",'
            b'"epoch":"e1"}\n{"type":"message","id":"m1","role":"user","createdAt":"2026-01-01T00:00:00.000Z",'
            b'"blocks":[{"type":"text","text":"' + text.encode() + b'"}]}\n')


async def test_boot_refuses_a_symlinked_transcript(tmp_path: Path) -> None:
    """Finding "boot follows a symlinked transcript and indexes the outside file's content into
    search": the link is refused and reported, its target never read or indexed."""
    data = tmp_path / "data"
    DataDir(data).ensure()
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes(_transcript("planted", "outsidesecret"))
    (data / "sessions" / "planted.jsonl").symlink_to(outside)
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            assert (await c.call("search.query", {"query": "outsidesecret"}))["results"] == []
            ids = [s["id"] for s in (await c.call("session.list", {}))["sessions"]]
            assert "planted" not in ids
            errors = host.boot.report.get("reconcileErrors", [])
            assert [e["sessionId"] for e in errors] == ["planted"] and "symbolic link" in errors[0]["error"]
            sid = (await c.call("session.create", {"title": "ok"}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", "insidetext")})
            assert len((await c.call("search.query", {"query": "insidetext"}))["results"]) == 1
    assert outside.read_bytes() == _transcript("planted", "outsidesecret")


async def test_boot_survives_a_transcript_linked_to_dev_zero(tmp_path: Path) -> None:
    """Finding "a transcript symlinked to /dev/zero makes boot read without bound and the host fails to
    start": boot refuses it without reading, the host starts, the session is reported."""
    data = tmp_path / "data"
    DataDir(data).ensure()
    (data / "sessions" / "zero.jsonl").symlink_to("/dev/zero")
    os.mkfifo(data / "sessions" / "fifo.jsonl")
    with trio.fail_after(30):
        async with inprocess_host(data) as host, client_for(host) as c:
            errors = sorted(e["sessionId"] for e in host.boot.report.get("reconcileErrors", []))
            assert errors == ["fifo", "zero"]
            status = await c.call("host.status", {})
            assert status["boot"]["reconcile"]["errors"] == 2


@pytest.mark.parametrize("folder", ["sessions", "logs", "secrets", "attachments"])
def test_symlinked_data_directory_folders_are_refused(tmp_path: Path, folder: str) -> None:
    """Finding "a symlinked sessions/ directory is followed and the target chmod'ed": the host refuses
    to start with a one-line message, and the link's target keeps its mode and content."""
    data = tmp_path / "data"
    data.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    target.chmod(0o755)
    (data / folder).symlink_to(target)
    with pytest.raises(DataDirUnsafe, match="symbolic link"):
        DataDir(data).ensure()
    proc = run_cli("--data-dir", str(data), "serve", "--port", "0", "--quiet", timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "symbolic link" in lines[0] and folder in lines[0], proc.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert sorted(os.listdir(target)) == ["keep.txt"]
