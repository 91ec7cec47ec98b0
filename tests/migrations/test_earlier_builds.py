"""``pi-host serve`` on data directories EARLIER PI-HOST BUILDS wrote, black box (an in-place upgrade).

Each fixture under tests/fixtures/upgrades is a data directory a real earlier build (its own schema
version, transcript line formats, receipts, checkpoints, queue leases, attachments, search layout) left
behind when it was SIGKILLed mid-state, with a manifest of what that build acknowledged
(scripts/record_upgrade_fixtures writes both). The current build boots on it as a process of its own and:

* every acknowledged message of every live session reads back exactly once, in order, with its text;
  a distinctive word is found by search; the renamed title, the compaction, the fork are there;
* every keyed call the old build answered (``clientId`` + ``submissionId``), retried with the same params,
  answers what the old build answered and writes nothing (the reads before and after are identical);
* the deleted session stays deleted (a retry of its create or append does not bring it back);
* the secret and the attachment read back; the queue entries wait, held for a controller (seed 003 §4.x
  boot fence; an entry a v30+ build leased is offered again);
* the turn the kill cut is aborted and its streaming checkpoint promoted once, as an aborted assistant
  message under it (§2.1, D299); the pending approval / plan is interrupted, not replayed (§11.18);
* a new append works; after SIGTERM and a restart every read is identical; ``pi-host doctor`` on the
  upgraded directory reports no damage.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, RpcError, open_client
from tests.hostkit import REPO, HostProcess, run_cli, start_host_process

FIXTURES = REPO / "tests" / "fixtures" / "upgrades"
TARBALLS = sorted(FIXTURES.glob("*.tar.gz"))


def _manifest(tarball: Path) -> dict[str, Any]:
    return dict(json.loads(tarball.with_name(tarball.name.removesuffix(".tar.gz") + ".json").read_text()))


def _extract(tarball: Path, into: Path) -> Path:
    with tarfile.open(tarball) as tar:
        tar.extractall(into, filter="data")
    return into / "data"


def _stop(host: HostProcess) -> None:
    assert host.terminate(60) == 0


def _texts(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message["blocks"] if b.get("type") == "text")


def _live(manifest: dict[str, Any]) -> list[str]:
    return sorted(manifest["sessions"])


async def _reads(c: HostClient, manifest: dict[str, Any]) -> dict[str, Any]:
    """Everything the upgrade must keep, as the current build answers it."""
    out: dict[str, Any] = {"sessions": {}}
    for sid in _live(manifest):
        got = await c.call("session.get", {"sessionId": sid, "full": True})
        out["sessions"][sid] = {
            "title": got["session"]["title"],
            "messages": [(m["id"], m["role"], _texts(m), (m.get("meta") or {}).get("status"), m.get("turnId"))
                         for m in got["messages"]],
            "compactions": sorted(x["id"] for x in got.get("compactions") or []),
        }
    listed: list[str] = []
    cursor = None
    while True:
        page = await c.call("session.list", {"limit": 500, **({"cursor": cursor} if cursor else {})})
        listed += [s["id"] for s in page["sessions"]]
        cursor = page.get("nextCursor")
        if not cursor:
            break
    out["listed"] = sorted(listed)
    out["search"] = sorted((h["sessionId"], h["messageId"])
                           for h in (await c.call("search.query", {"query": manifest["search"]["word"]}))["results"])
    out["inflightSearch"] = sorted((h["sessionId"], h["messageId"])
                                   for h in (await c.call("search.query", {"query": "gloamingfinch"}))["results"])
    if "secret" in manifest:
        out["secret"] = (await c.call("secrets.get", {"ref": manifest["secret"]["ref"]}))["value"]
    att = await c.call("attachments.get", {"sha256": manifest["attachment"]["sha256"]})
    out["attachment"] = {k: att.get(k) for k in ("sha256", "size", "deleted", "evicted")}
    queue = await c.call("session.queueList", {"sessionId": manifest["queue"]["sessionId"]})
    out["queue"] = {"ids": [e["id"] for e in queue["entries"]], "contents": [e["content"] for e in queue["entries"]],
                    "held": queue["held"]}
    turns = await c.call("session.listTurns", {"sessionId": manifest["turn"]["sessionId"]})
    out["turns"] = sorted((t["id"], t["status"]) for t in turns["turns"])
    out["approvals"] = (await c.call("approvals.pending", {}))["pending"]
    out["plans"] = (await c.call("plans.pending", {}))["pending"]
    out["revisions"] = [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"])
                        for r in (await c.call("session.listRevisions", {"sessionId": "up_beta"}))["revisions"]]
    return out


def _check_reads(seen: dict[str, Any], manifest: dict[str, Any], data: Path) -> None:
    turn = manifest["turn"]
    for sid, old in manifest["sessions"].items():
        new = seen["sessions"][sid]
        ids = [m[0] for m in new["messages"]]
        assert len(ids) == len(set(ids)), f"{sid}: a message is read twice: {ids}"
        acknowledged = [(m["id"], m["role"], m["text"]) for m in old["messages"]]
        kept = [m[:3] for m in new["messages"] if m[0] != turn["inflightId"]]
        assert kept[:len(acknowledged)] == acknowledged, f"{sid}: acknowledged messages lost or reordered"
        assert new["title"] == old["title"], sid
    # the kill cut turn-t1 mid-stream: the turn is aborted, its checkpoint promoted once, as aborted, last
    turn_messages = seen["sessions"][turn["sessionId"]]["messages"]
    assert turn_messages[-1][0] == turn["inflightId"], turn_messages
    assert turn_messages[-1][1:] == ("assistant", "turn partial reply with a gloamingfinch", "aborted",
                                     turn["turnId"])
    assert not (data / "sessions" / f"{turn['sessionId']}.inflight.json").exists()
    assert (turn["turnId"], "aborted") in seen["turns"]
    assert seen["approvals"] == [] and seen["plans"] == []
    # search, rename, compaction, fork, delete
    assert (manifest["search"]["sessionId"], manifest["search"]["messageId"]) in seen["search"]
    assert seen["inflightSearch"] == [(turn["sessionId"], turn["inflightId"])]
    assert seen["sessions"][manifest["renamed"]["sessionId"]]["title"] == manifest["renamed"]["title"]
    assert seen["sessions"]["up_gamma"]["compactions"] == [manifest["compaction"]["id"]]
    for sid in manifest["deleted"]:
        assert sid not in seen["listed"] and not (data / "sessions" / f"{sid}.jsonl").exists()
    assert set(manifest["sessions"]) <= set(seen["listed"])
    assert seen["revisions"] == [(r["rootUserId"], r["revisionIndex"], r["isActive"], r["messageCount"])
                                 for r in manifest["revisions"]]
    # secret, attachment, queue
    if "secret" in manifest:
        assert seen["secret"] == manifest["secret"]["value"]
    att = manifest["attachment"]
    assert seen["attachment"]["sha256"] == att["sha256"] and seen["attachment"]["size"] == att["size"]
    assert not seen["attachment"]["deleted"] and not seen["attachment"]["evicted"]
    q = manifest["queue"]
    waiting = [e["id"] for e in q["listed"]["entries"]]
    if manifest["schemaVersion"] >= 30:  # a leased entry is offered again after a restart, first
        assert waiting == q["entries"][1:] and q["taken"] == q["entries"][0]
        assert seen["queue"]["ids"] == [q["taken"], *waiting]
    else:  # the build deleted what it handed out
        assert seen["queue"]["ids"] == waiting
    assert seen["queue"]["held"] is True


# An attach is connection state the host keeps in memory (runtime/handlers/queue.py attach_replayed): after
# a restart a keyed retry attaches again (the queue is held; no controller is known), and no build before
# v30 kept a receipt of it. Its retries run last (they release the held queue) and must attach.
ATTACH = "session.queueAttach"


async def _retry_all(host: HostProcess, manifest: dict[str, Any], *, attach: bool) -> list[str]:
    """Retry every keyed call with its clientId, submissionId and params: the old build's answer, or
    (for a deleted session's calls) a refusal; returns what differed. ``attach``: the attaches only."""
    diffs: list[str] = []
    clients: dict[str, HostClient] = {}
    async with open_client(host.url, host.token, client_id=manifest["clients"]["ui"], client_kind="ui") as ui, \
            open_client(host.url, host.token, client_id=manifest["clients"]["agent"], client_kind="agent") as agent:
        clients = {manifest["clients"]["ui"]: ui, manifest["clients"]["agent"]: agent}
        for call in manifest["keyed"]:
            if (call["method"] == ATTACH) != attach:
                continue
            where = f"{call['method']} {call['params']['submissionId']}"
            try:
                answer = await clients[call["clientId"]].call(call["method"], call["params"])
            except RpcError as exc:
                deleted = call["params"].get("sessionId") in manifest["deleted"]
                if not (deleted and exc.data_code == "SESSION_NOT_FOUND"):
                    diffs.append(f"{where}: {exc}")
                continue
            if attach:
                if answer.get("controllerId") != call["params"]["controllerId"]:
                    diffs.append(f"{where}: did not attach: {answer!r}")
            elif answer != call["result"]:
                diffs.append(f"{where}: answered {answer!r}, the old build {call['result']!r}")
    return diffs


async def _first_boot(host: HostProcess, manifest: dict[str, Any], data: Path) -> dict[str, Any]:
    async with open_client(host.url, host.token, client_id="upgrade-check", client_kind="ui") as c:
        before = await _reads(c, manifest)
        _check_reads(before, manifest, data)
        files = {p.name: p.read_bytes() for p in (data / "sessions").iterdir()}
        diffs = await _retry_all(host, manifest, attach=False)
        assert diffs == [], "\n".join(diffs)
        after = await _reads(c, manifest)
        assert after == before, "a retry changed what reads answer"
        assert {p.name: p.read_bytes() for p in (data / "sessions").iterdir()} == files, "a retry wrote a line"
        for sid in manifest["deleted"]:
            with pytest.raises(RpcError) as refused:
                await c.call("session.get", {"sessionId": sid})
            assert refused.value.data_code == "SESSION_NOT_FOUND"
        # a new append works on the upgraded directory
        new = await c.call("session.appendMessage", {
            "sessionId": "up_alpha", "submissionId": "after-upgrade",
            "message": {"id": "alpha-u3", "role": "user", "blocks": [{"type": "text", "text": "after the upgrade"}]}})
        assert new["replayed"] is False
        final = await _reads(c, manifest)
    assert await _retry_all(host, manifest, attach=True) == []  # last: attaching releases the held queue
    return final


async def _second_boot(host: HostProcess, manifest: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    async with open_client(host.url, host.token, client_id="upgrade-check", client_kind="ui") as c:
        seen = await _reads(c, manifest)
    return seen, await _retry_all(host, manifest, attach=False) + await _retry_all(host, manifest, attach=True)


@pytest.mark.parametrize("tarball", TARBALLS, ids=[t.name.removesuffix(".tar.gz") for t in TARBALLS])
def test_current_build_boots_an_earlier_builds_data_dir(tmp_path: Path, tarball: Path) -> None:
    manifest = _manifest(tarball)
    data = _extract(tarball, tmp_path)
    host = start_host_process(data)
    try:
        first = trio.run(_first_boot, host, manifest, data)
    finally:
        _stop(host)
    assert first["sessions"]["up_alpha"]["messages"][-1][:3] == ("alpha-u3", "user", "after the upgrade")
    host = start_host_process(data)
    try:
        second, diffs = trio.run(_second_boot, host, manifest)
    finally:
        _stop(host)
    assert second == first, "a restart changed what reads answer"
    assert diffs == [], "\n".join(diffs)
    doctor = run_cli("--data-dir", str(data), "doctor", "--json")
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 0, report


def test_every_fixture_has_its_manifest() -> None:
    assert len(TARBALLS) >= 6
    for tarball in TARBALLS:
        manifest = _manifest(tarball)
        assert tarball.name.startswith(f"v{manifest['schemaVersion']}-{manifest['commit'][:7]}")
        assert tarball.stat().st_size < 300 * 1024, f"{tarball.name} grew past 300 KiB"
