"""The directory fsync after a file other than a session's was published (or removed) fails: the secret
store, the plugin registry and asset bundles, attachment blobs, config sync's bundles, plan artifacts.
The call answers IO_ERROR (its file in place, its durability unknown). Its retry (the same submissionId)
is never acknowledged on that fsync (RELIABILITY rule 7: never retry-then-ack): a retry that would find
the effect in place is refused until the host restarts, then answered once; one that writes its file
again is answered once its own fsyncs succeed.

Found by this test: a retry that found the first try's state already in place ("the same registration
again: nothing to write", the delete recorded in the secret's ``.receipts``, the same asset set, a blob
already present) wrote nothing, so nothing fsynced the directory, and answered success. The stores now
remember the directory whose fsync is owed (``store.fsutil.OwedSyncs``) and refuse until the restart.
Session files are ``test_dir_fsync_after_rename.py``'s (their storage fails until the
restart)."""

from __future__ import annotations

import base64
import errno
import os
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime.client import HostClient, RpcError
from tests.hostkit import client_for, inprocess_host

CLIENT = "ui-fsync"
README = base64.b64encode(b"# hi\n").decode()
MARKDOWN = "# Plan\n\n1. Split the tokenizer\n"


@dataclass
class DirFsync:
    """``os.fsync`` of ``directory``: while :attr:`failing`, the first ``skip`` succeed and every later one
    fails with ``err``; then all succeed. :attr:`seen` is what each did."""

    directory: str
    skip: int = 0
    err: int = errno.EIO
    failing: bool = True
    seen: list[str] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = os.fsync

        def fsync(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}") == self.directory:
                if self.failing and self.skip <= 0:
                    self.seen.append("failed")
                    raise OSError(self.err, os.strerror(self.err))
                self.skip -= 1
                self.seen.append("ok")
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


Setup = Callable[[HostClient, Path], Awaitable[dict[str, Any]]]


async def _nothing(c: HostClient, root: Path) -> dict[str, Any]:
    return {}


async def _registered(c: HostClient, root: Path) -> dict[str, Any]:
    await c.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1", "assets": [
        {"path": "README.md", "mediaType": "text/markdown", "dataBase64": README}]})
    return {}


async def _secret(c: HostClient, root: Path) -> dict[str, Any]:
    await c.call("secrets.set", {"ref": "provider/acme", "value": "sk-1"})
    return {}


async def _configured(c: HostClient, root: Path) -> dict[str, Any]:
    await c.call("configSync.configure", {"enabled": True})
    return {}


async def _exported(c: HostClient, root: Path) -> dict[str, Any]:
    await _configured(c, root)
    return {"bundleBase64": (await c.call("configSync.export", {}))["bundleBase64"]}


async def _plan_session(c: HostClient, root: Path) -> dict[str, Any]:
    ws = root.parent / "ws"
    ws.mkdir(exist_ok=True)
    sid = (await c.call("session.create", {"title": "plan", "projectPath": str(ws), "mode": "plan"}))["id"]
    return {"sessionId": sid, "workspaceRoot": str(ws)}


@dataclass(frozen=True)
class Case:
    method: str
    params: dict[str, Any]
    directory: str
    """Relative to the data dir; ``../ws/...``: the plan's workspace."""
    skip: int = 0
    """Directory fsyncs the first try passes before the one that fails."""
    setup: Setup = _nothing


CASES = {
    "plugins.register": Case("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1"}, "plugins"),
    "plugins.register.assets": Case("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                                         "assets": [{"path": "README.md", "mediaType": "text/markdown",
                                                                     "dataBase64": README}]}, "plugins/assets"),
    "plugins.setEnabled": Case("plugins.setEnabled", {"pluginId": "acme", "enabled": False}, "plugins",
                               setup=_registered),
    # the intent's fsync passes, the registry's fails
    "plugins.uninstall": Case("plugins.uninstall", {"pluginId": "acme"}, "plugins", skip=1, setup=_registered),
    # the registry's fsync passes (another directory), the one after the asset bundle's unlink fails
    "plugins.uninstall.assets": Case("plugins.uninstall", {"pluginId": "acme"}, "plugins/assets",
                                     setup=_registered),
    "secrets.set": Case("secrets.set", {"ref": "provider/acme", "value": "sk-2"}, "secrets", setup=_secret),
    # the .receipts record's and the trace's fsyncs pass, the one after the file's unlink fails
    "secrets.delete": Case("secrets.delete", {"ref": "provider/acme"}, "secrets", skip=2, setup=_secret),
    "configSync.export": Case("configSync.export", {}, "config-sync", setup=_configured),
    "configSync.apply": Case("configSync.apply", {}, "config-sync", setup=_exported),
    "attachments.put": Case("attachments.put", {"name": "a.txt", "mimeType": "text/plain",
                                                "dataBase64": base64.b64encode(b"attached").decode()}, "attachments"),
    "plans.submit": Case("plans.submit", {"turnId": "t1", "toolCallId": "c1", "kind": "plan", "markdown": MARKDOWN,
                                          "title": "Split", "question": "Proceed?"}, "../ws/.pi/plan",
                         setup=_plan_session),
}


async def _state(c: HostClient, root: Path, case: Case, params: dict[str, Any]) -> Any:
    """What the effect left, to compare with a run without faults."""
    if case.method.startswith("plugins."):
        plugins = (await c.call("plugins.list", {}))["plugins"]
        assets = (await c.call("plugins.listAssets", {"pluginId": "acme"}))["assets"]
        return [{k: v for k, v in p.items() if k not in ("installedAt", "updatedAt")} for p in plugins], assets
    if case.method.startswith("secrets."):
        listed = [s["ref"] for s in (await c.call("secrets.list", {}))["secrets"]]
        try:
            value = (await c.call("secrets.get", {"ref": "provider/acme"}))["value"]
        except RpcError as exc:
            value = exc.data_code
        return listed, value
    if case.method == "plans.submit":
        pending = (await c.call("plans.pending", {"sessionId": params["sessionId"]}))["pending"]
        files = sorted(os.listdir(Path(params["workspaceRoot"]) / ".pi" / "plan"))
        return len(pending), len(files)
    if case.method.startswith("attachments."):
        return sorted(os.listdir(root / "attachments"))
    return (await c.call("configSync.get", {}))["settings"]


UNSTABLE = frozenset({"installedAt", "updatedAt", "exportedAt", "createdAt", "requestId", "artifactPath", "sessionId",
                      "expiresAt", "bundleBase64", "sha256"})


def _stable(answer: Any) -> Any:
    """An answer without the times and ids a second run cannot repeat."""
    if isinstance(answer, dict):
        return {k: _stable(v) for k, v in answer.items() if k not in UNSTABLE}
    if isinstance(answer, list):
        return [_stable(v) for v in answer]
    return answer


async def _crash_free(root: Path, case: Case) -> tuple[Any, Any]:
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
        params = {**case.params, **await case.setup(c, root), "submissionId": "sub-1"}
        answer = await c.call(case.method, params)
        return _stable(answer), await _state(c, root, case, params)


def _failing(root: Path, case: Case, err: int) -> DirFsync:
    return DirFsync(os.path.normpath(root / case.directory), skip=case.skip, err=err)


ERRNOS = {"eio": errno.EIO, "enospc": errno.ENOSPC}
REFUSED = {"eio": {"IO_ERROR"}, "enospc": {"IO_ERROR", "STORAGE_FULL"}}
"""What the tries answer while the fsync fails. ENOSPC, as documented: a failed fsync after a publish is
IO_ERROR (the file is in place), after an unlink or of a plan artifact (removed again) STORAGE_FULL."""


REWRITTEN = frozenset({"configSync.export", "configSync.apply", "plans.submit"})
"""Whose retry writes its file again (a new temp file, its own fsyncs): answered in the same run once
those succeed. The others would find the first try's effect in place and write nothing: refused until
the host restarts (RELIABILITY rule 7, never retry-then-ack; ``store.fsutil.OwedSyncs``)."""


@pytest.mark.parametrize("action", list(ERRNOS))
@pytest.mark.parametrize("name", list(CASES))
async def test_a_retry_is_never_acknowledged_on_a_failed_directory_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, action: str) -> None:
    case = CASES[name]
    expected, expected_state = await _crash_free(tmp_path / "ref" / "data", case)
    root = tmp_path / "run" / "data"
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
        params = {**case.params, **await case.setup(c, root), "submissionId": "sub-1"}
        faults = _failing(root, case, ERRNOS[action])
        faults.install(monkeypatch)
        for attempt in ("first", "retry"):
            with pytest.raises(RpcError) as failed:
                answered = await c.call(case.method, params)
                raise AssertionError(f"the {attempt} try answered {answered!r} while the fsync failed: {faults.seen}")
            assert failed.value.data_code in REFUSED[action], (attempt, failed.value)
        assert "failed" in faults.seen
        faults.failing = False
        if name in REWRITTEN:
            failed_so_far = len(faults.seen)
            answer = await c.call(case.method, params)
            assert "ok" in faults.seen[failed_so_far:], "acknowledged with no directory fsync since the failure"
            await _answered_once(c, root, case, params, answer, expected, expected_state)
            return
        with pytest.raises(RpcError) as refused:  # a fsync that succeeds now proves nothing: until the restart
            answered = await c.call(case.method, params)
            raise AssertionError(f"the retry answered {answered!r} on a failed fsync: {faults.seen}")
        assert refused.value.data_code == "IO_ERROR", refused.value
    monkeypatch.undo()
    async with inprocess_host(root) as host, client_for(host, CLIENT, "ui") as c:
        answer = await c.call(case.method, params)  # the next boot trusts the disk
        await _answered_once(c, root, case, params, answer, expected, expected_state)


async def _answered_once(c: HostClient, root: Path, case: Case, params: dict[str, Any], answer: Any,
                         expected: Any, expected_state: Any) -> None:
    assert await c.call(case.method, params) == answer  # its receipt: no second effect
    assert _stable(answer) == expected
    assert await _state(c, root, case, params) == expected_state
