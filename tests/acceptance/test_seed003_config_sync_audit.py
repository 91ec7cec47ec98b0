"""Seed 003 §1.3 (portable configuration sync), §4.1 (kv namespaces) and §7's ``largePasteThreshold`` rule,
audited by an outsider: black-box against real ``pi-host serve`` processes over WebSocket. Each test quotes
the sentence it checks.

Already held elsewhere, so not repeated here: the sync settings as the one ``kv(configSync, settings)`` row,
the secrets only under ``secrets/`` (plain UTF-8) and never in an answer or error, a flipped byte, a cut, two
glued bundles and another host's key refused with nothing changed, bad ``bundleBase64`` input, a SIGKILL at
every temp-file step of ``pending.bin`` / ``pending.receipt`` / ``base.bin`` with the keyed retry landing once,
the files' modes and no plugin or HTTP route serving them, and an apply leaving sessions, transcripts and schema
alone (``test_seed003_config_sync_outsider.py``); the apply crash matrix (``tests/config_sync/test_apply_crash``);
the export receipt's ``superseded`` retry (``tests/config_sync/test_export_receipt``); the merge rules and every
single bit flip (``tests/config_sync/test_config_sync``); the settings rules themselves
(``tests/settings/test_settings_rules``).

What this module adds: the bundle files hold no secret and no setting in any plain encoding (UTF-16, base64,
hex too); a ``pending.bin`` swapped in from another host or damaged on disk never answers a keyed retry; a
bundle of another format version (an older or newer document schema, or another magic) is refused as
``unsupported``; an apply over local changes made since the base holds exactly what the README promises
(adds and updates, never deletes; skills: the newest edit wins, also when a copy passed through a third
device); export → apply → export is stable; no configSync call, refused ones included, changes the schema or
a transcript; which client kinds may call the configSync methods; and ``largePasteThreshold`` through a bundle
(writes validate 1-1,000,000; a stored value reads as 600 when unusable and such a host's bundle still applies).

Found and fixed with it: an applied skill took the apply's clock as its ``updatedAt`` (a copy then beat a
later edit made elsewhere), and so did an applied group (``createdAt`` too) and memory; a bundle's unusable
app setting was dropped and the rest applied, not refused; another format version's magic was ``tampered``,
not ``unsupported``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio

from runtime.client import HostClient
from store.config import config_sync as sync
from tests.acceptance.outsiderkit import client, data_dir, error_of, real_host, say
from tests.dbkit import rows as _db
from tests.hostkit import start_host_process
from tests.pipeline import probe

VAULT_KEY = base64.b64encode(hashlib.sha256(b"audit vault key").digest()).decode()
PASSWORD = "dav-audit-pw-" + "Kx7Qe" * 5
CLIENT = "auditor"


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def _key() -> bytes:
    return base64.b64decode(VAULT_KEY)


def _plain_forms(text: str) -> list[bytes]:
    """``text`` as UTF-8, UTF-16 (both orders), hex, and base64 at each of the three alignments (the inner,
    alignment-independent part of each); only runs of 6 bytes or more."""
    raw = text.encode()
    forms = [raw, text.encode("utf-16-le"), text.encode("utf-16-be"), raw.hex().encode()]
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw)
        forms.append(encoded[4:-4])  # past the padding's chars at both ends: the same in any stream
    return [form for form in forms if len(form) >= 6]  # shorter runs turn up in random bytes by chance


def _schema(data: Path) -> list[tuple[Any, ...]]:
    return [*_db(data, "SELECT type, name, sql FROM sqlite_master ORDER BY name"), *_db(data, "PRAGMA user_version")]


# ------------------------------------------------------------------ nothing in plain text


async def test_the_bundle_files_hold_no_secret_and_no_setting_in_any_plain_encoding(tmp_path: Path) -> None:
    """§1.3: "config-sync/base.bin and config-sync/pending.bin are authenticated encrypted bundles ... not
    renderer- or sidecar-readable files"; "The vault key reference and WebDAV password use the existing
    encrypted secret store". Neither file (nor the export's receipt beside them) holds a secret, a setting's
    value, a memory, a skill's source or a provider's key as UTF-8, UTF-16, hex or base64."""
    data = data_dir(tmp_path)
    markers = {
        "password": PASSWORD, "vault key": VAULT_KEY, "api key": "sk-audit-apikey-Vw3nR8",
        "template": "Rewrite-audit-Mq4 {{draft}}", "proxy": "http://proxy-audit-zt9.example:3128",
        "memory": "memory-audit-Hj2 uses pnpm", "skill": "skill-source-audit-Pp5",
        "instructions": "instructions-audit-Lc8", "threshold": "987653",
    }
    with trio.fail_after(60):
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY, "webdavPassword": PASSWORD,
                                                  "webdavUrl": "https://dav.example/pi", "webdavUsername": "ada"})
            await c.call("settings.update", {"values": {
                "largePasteThreshold": 987653, "promptEnhancementUserTemplate": markers["template"],
                "networkProxy": {"mode": "manual", "url": markers["proxy"]}}})
            await c.call("providers.create", {"id": "p", "name": "P", "baseUrl": "https://api.example/v1",
                                              "apiKey": markers["api key"]})
            await c.call("settings.set", {"ns": "projectMemory", "key": str(tmp_path / "proj"),
                                          "value": markers["memory"]})
            group = (await c.call("projectGroups.save", {"name": "G", "roots": [str(tmp_path / "g")]}))["group"]
            await c.call("projectGroups.setInstructions", {"groupId": group["id"],
                                                           "instructions": markers["instructions"]})
            await c.call("skills.put", {"name": "notes", "version": "1", "source": markers["skill"]})
            exported = await c.call("configSync.export", {"submissionId": "exp"})
            await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"], "submissionId": "ap"})
    folder = data / "config-sync"
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert {"base.bin", "pending.bin"} <= set(files), files.keys()
    blob = base64.b64decode(exported["bundleBase64"])
    assert files["pending.bin"] == blob and files["base.bin"] == blob
    for name, content in files.items():
        for what, text in markers.items():
            for form in _plain_forms(text):
                assert form not in content, f"{name} holds the {what} in plain text ({form[:24]!r})"
    # the ciphertext is opaque: no field name of the document either
    for field in ("largePasteThreshold", "providers", "skills", "settings", "projectGroupInstructions"):
        for form in _plain_forms(field):
            assert form not in blob, field


# ------------------------------------------------------------------ what is on disk is what a retry answers


@pytest.mark.parametrize(("how", "reason"), [("swapped-from-another-host", "superseded"),
                                             ("byte-flipped", "damaged"), ("truncated", "damaged"),
                                             ("removed", "damaged")])
async def test_a_pending_bundle_replaced_on_disk_never_answers_a_keyed_retry(tmp_path: Path, how: str,
                                                                             reason: str) -> None:
    """§1.3: "config-sync/pending.bin [is an] authenticated encrypted bundle"; README configSync.export: "A
    retry answered from the row reads the bundle back from pending.bin, byte for byte the answer the first call
    got, also after a restart; once another export replaced pending.bin that bundle is gone, and the retry is
    CONFLICT". A ``pending.bin`` swapped with another host's, or changed on disk, is not the answered bundle:
    after a restart the keyed retry never hands those bytes out as its answer: it is CONFLICT naming the
    answered bundle's sha256, and writes nothing. Its ``data.reason`` says which: ``superseded`` when another
    bundle stands there, ``damaged`` when the bytes there fail authentication or are gone (both read
    ``superseded`` before, as if a later export had replaced them)."""
    other = tmp_path / "other"
    other.mkdir()
    data = data_dir(tmp_path)
    keyed = {"submissionId": "exp-k"}
    with trio.fail_after(90):
        async with real_host(other) as (_p, c):
            await c.call("configSync.configure", {})  # its own vault key
            foreign = base64.b64decode((await c.call("configSync.export", {}))["bundleBase64"])
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 900})
            first = await c.call("configSync.export", keyed)
        pending = data / "config-sync" / "pending.bin"
        mine = pending.read_bytes()
        if how == "swapped-from-another-host":
            pending.write_bytes(foreign)
        elif how == "byte-flipped":
            pending.write_bytes(mine[:40] + bytes([mine[40] ^ 0x01]) + mine[41:])
        elif how == "truncated":
            pending.write_bytes(mine[: len(mine) // 2])
        else:
            pending.unlink()
        on_disk = pending.read_bytes() if pending.exists() else None
        async with real_host(data, client_id=CLIENT) as (_p, c):
            before = probe.state(data)
            code, err = await error_of(c, "configSync.export", keyed)
            assert (code, err.get("reason"), err.get("sha256")) == ("CONFLICT", reason, first["sha256"]), err
            assert probe.state(data) == before, "a refused retry wrote something"
            assert (pending.read_bytes() if pending.exists() else None) == on_disk
            # the host's own bundle (the answer) still applies; the bytes on disk do not
            await c.call("configSync.apply", {"bundleBase64": first["bundleBase64"]})
            if on_disk is not None:
                bad_code, _ = await error_of(c, "configSync.apply", {"bundleBase64": _b64(on_disk)})
                assert bad_code == "CORRUPT_DATA"


# ------------------------------------------------------------------ other format versions


def _with_magic(key: bytes, magic: bytes, doc: dict[str, Any]) -> bytes:
    """A bundle laid out as ours but under another magic (another format version), sealed with ``key``."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    head = magic + hashlib.sha256(key).digest()[:8]
    nonce = os.urandom(12)
    return head + nonce + AESGCM(key).encrypt(nonce, orjson.dumps(doc), head)


async def test_a_bundle_of_an_older_or_newer_format_is_refused_as_unsupported_and_changes_nothing(
        tmp_path: Path) -> None:
    """README §8.7: "A changed byte, a truncated bundle or one made with another vault key is CORRUPT_DATA
    (data.reason tampered / foreign_key), and so is a bundle of a format this host does not read (data.reason:
    "unsupported"); each changes nothing." A bundle sealed with this host's own vault key but of another
    document schema (older, newer, missing, not a number) or another format magic is ``unsupported``."""
    data = data_dir(tmp_path)
    key = _key()
    settings = {"largePasteThreshold": 4242}
    cases = {
        "schema 0": sync.encode_bundle(key, {"schema": 0, "settings": settings}),
        "schema 2": sync.encode_bundle(key, {"schema": 2, "settings": settings}),
        "schema '1'": sync.encode_bundle(key, {"schema": "1", "settings": settings}),
        "no schema": sync.encode_bundle(key, {"settings": settings}),
        "a list": sync.encode_bundle(key, [{"schema": 1}]),  # type: ignore[arg-type]
        "magic 02": _with_magic(key, b"PICFG02\n", {"schema": 1, "settings": settings}),
        "magic 00": _with_magic(key, b"PICFG00\n", {"schema": 1, "settings": settings}),
    }
    with trio.fail_after(60):
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.apply", {"bundleBase64": (await c.call("configSync.export", {}))["bundleBase64"]})
            before = probe.state(data)
            for name, blob in cases.items():
                code, err = await error_of(c, "configSync.apply", {"bundleBase64": _b64(blob),
                                                                   "submissionId": f"v-{name}"})
                assert (code, err.get("reason")) == ("CORRUPT_DATA", "unsupported"), (name, code, err)
                assert probe.state(data) == before, f"the {name} bundle changed something"
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 600


# ------------------------------------------------------------------ local changes since the base


async def test_an_apply_over_local_changes_since_the_base_adds_and_updates_and_never_deletes(tmp_path: Path) -> None:
    """README §8.7: "merges it in one transaction (it adds and updates, never deletes; a skill is taken only
    when this host lacks it or holds it with an older updatedAt ...)". Changes made here since the base: a
    setting the bundle also carries takes the bundle's value, a setting it does not carry stays, a provider
    deleted here comes back, one added here stays, a skill edited here since (newer) is kept, an older local
    one is replaced, and a local-only skill stays."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with trio.fail_after(90):
        async with real_host(a, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.update", {"values": {"largePasteThreshold": 900, "thinkingDisplayMode": "compact"}})
            await c.call("providers.create", {"id": "shared", "name": "Shared", "baseUrl": "http://127.0.0.1:1/v1"})
            await c.call("skills.put", {"name": "edited-there", "version": "1", "source": "there v1"})
            base = (await c.call("configSync.export", {}))["bundleBase64"]
            await c.call("skills.put", {"name": "edited-there", "version": "2", "source": "there v2"})
            await c.call("skills.put", {"name": "edited-here", "version": "1", "source": "here v1 (from there)"})
            later = (await c.call("configSync.export", {}))["bundleBase64"]
            there = {s["name"]: s for s in [(await c.call("skills.get", {"name": n}))["skill"]
                                            for n in ("edited-there", "edited-here")]}
        async with real_host(b, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.apply", {"bundleBase64": base})
            # local changes since the base
            await c.call("settings.update", {"values": {"largePasteThreshold": 1200, "defaultMode": "plan"}})
            await c.call("providers.delete", {"providerId": "shared"})
            await c.call("providers.create", {"id": "mine", "name": "Mine", "baseUrl": "http://127.0.0.1:2/v1"})
            await c.call("skills.put", {"name": "edited-here", "version": "7", "source": "here v7"})
            await c.call("skills.put", {"name": "only-here", "version": "1", "source": "only here"})
            here = (await c.call("skills.get", {"name": "edited-here"}))["skill"]
            assert here["updatedAt"] >= there["edited-here"]["updatedAt"]
            out = await c.call("configSync.apply", {"bundleBase64": later, "submissionId": "ap-later"})
            values = (await c.call("settings.getAll", {"ns": "app"}))["values"]
            assert (values["largePasteThreshold"], values["thinkingDisplayMode"], values.get("defaultMode")) \
                == (900, "compact", "plan")
            ids = sorted(p["id"] for p in (await c.call("providers.list", {}))["providers"])
            assert ids == ["mine", "shared"], ids
            got = {n: (await c.call("skills.get", {"name": n}))["skill"]
                   for n in ("edited-there", "edited-here", "only-here")}
            assert (got["edited-there"]["version"], got["edited-there"]["source"]) == ("2", "there v2")
            assert got["edited-there"]["updatedAt"] == there["edited-there"]["updatedAt"]
            assert got["edited-here"] == here, "an older copy replaced a newer local edit"
            assert got["only-here"]["source"] == "only here"
            assert out["applied"]["skills"] == 1, out


async def test_the_newest_skill_edit_wins_even_when_the_older_one_is_relayed_by_a_third_device(
        tmp_path: Path) -> None:
    """README §8.7: a skill "keeps the bundle's updatedAt, so the newest edit wins however many devices a copy
    passed through". Device A edits a skill, device C edits it later; device B takes A's copy after C's edit
    and exports it; C applies B's bundle and keeps its own newer edit. (Before the fix B stored the copy with
    the time it arrived there, newer than C's edit, and C lost its edit.)"""
    roots = {name: tmp_path / name for name in "abc"}
    for root in roots.values():
        root.mkdir()
    with trio.fail_after(90):
        async with real_host(roots["a"], client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("skills.put", {"name": "notes", "version": "1", "source": "A's v1"})
            from_a = (await c.call("configSync.export", {}))["bundleBase64"]
            a_edit = (await c.call("skills.get", {"name": "notes"}))["skill"]["updatedAt"]
        async with real_host(roots["c"], client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("skills.put", {"name": "notes", "version": "2", "source": "C's v2, the newest edit"})
            c_edit = (await c.call("skills.get", {"name": "notes"}))["skill"]
        assert c_edit["updatedAt"] >= a_edit
        async with real_host(roots["b"], client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.apply", {"bundleBase64": from_a})
            relayed = (await c.call("skills.get", {"name": "notes"}))["skill"]
            assert relayed["updatedAt"] == a_edit, "the copy took the time it arrived, not A's edit time"
            from_b = (await c.call("configSync.export", {}))["bundleBase64"]
        async with real_host(roots["c"], client_id=CLIENT) as (_p, c):
            out = await c.call("configSync.apply", {"bundleBase64": from_b})
            assert out["applied"]["skills"] == 0
            assert (await c.call("skills.get", {"name": "notes"}))["skill"] == c_edit


async def test_applied_groups_and_memories_keep_the_bundle_times_and_a_bad_time_refuses_the_bundle(
        tmp_path: Path) -> None:
    """README §8.7: an applied group and memory keep the bundle's ``createdAt`` / ``updatedAt``, as a skill
    keeps its ``updatedAt``: an item's times travel with it (a later newest-wins comparison needs them). They
    were stamped with the applying host's clock. A time that is not an integer count of milliseconds in range
    (a string, a bool, a float, a negative one, one past 64 bits) refuses the bundle whole: nothing changes.
    The stamps are fixed numbers, never compared with a host's clock."""
    data = data_dir(tmp_path)
    project = str(tmp_path / "parser")
    group = {"id": "g-synced", "name": "Parser", "roots": [project, str(tmp_path / "lexer")],
             "primaryRoot": project, "createdAt": 1_000, "updatedAt": 2_000}

    def memory(text: str, at: Any) -> dict[str, Any]:
        return {"format": "entries-v1", "entries": [{"id": "e1", "title": "", "content": text}], "updatedAt": at}

    doc = {"schema": 1, "projects": [{"path": project}], "projectGroups": [group],
           "projectGroupMemory": {"g-synced": memory("shared memory", 3_000)},
           "projectMemory": {project: memory("use pnpm", 4_000)}}
    with trio.fail_after(90):
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.apply", {"bundleBase64": _b64(sync.encode_bundle(_key(), doc))})
            got = await c.call("projectGroups.get", {"groupId": "g-synced"})
            assert (got["group"]["createdAt"], got["group"]["updatedAt"]) == (1_000, 2_000), got["group"]
            assert got["memory"]["updatedAt"] == 3_000, got["memory"]
            mem = (await c.call("settings.get", {"ns": "projectMemory", "key": project}))["value"]
            assert mem["updatedAt"] == 4_000, mem
            # they travel on: this host's export carries them as it took them
            out = sync.decode_bundle(_key(), base64.b64decode((await c.call("configSync.export", {}))["bundleBase64"]))
            assert [(g["createdAt"], g["updatedAt"]) for g in out["projectGroups"]] == [(1_000, 2_000)]
            assert out["projectGroupMemory"]["g-synced"]["updatedAt"] == 3_000
            assert out["projectMemory"][project]["updatedAt"] == 4_000
            before = probe.state(data)
            for bad in ("5000", True, 5000.5, -1, 2**63, None):
                for broken in (
                    doc | {"projectGroups": [group | {"updatedAt": bad}]},
                    doc | {"projectGroups": [group | {"createdAt": bad}]},
                    doc | {"projectGroupMemory": {"g-synced": memory("shared memory", bad)}},
                    doc | {"projectMemory": {project: memory("use pnpm", bad)}},
                ):
                    code, err = await error_of(c, "configSync.apply",
                                               {"bundleBase64": _b64(sync.encode_bundle(_key(), broken))})
                    assert code == "INVALID_PARAMS" and str(err.get("field", "")).endswith("At"), (bad, err)
                    assert probe.state(data) == before, bad


# ------------------------------------------------------------------ a stable round trip


async def _fill(c: HostClient, tmp: Path) -> None:
    await c.call("settings.update", {"values": {"largePasteThreshold": 1500, "thinkingDisplayMode": "compact"}})
    await c.call("providers.create", {"id": "or", "name": "OR", "baseUrl": "https://api.example/v1",
                                      "apiKey": "sk-round-trip"})
    await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": "http://127.0.0.1:8080/v1"})
    await c.call("providers.reorder", {"providerIds": ["local", "or"]})
    await c.call("models.add", {"providerId": "or", "modelId": "my/model", "displayName": "Mine"})
    project = (await c.call("workspace.open", {"path": str(tmp / "parser")}))["project"]
    await c.call("projects.pin", {"projectId": project["id"], "pinned": True})
    await c.call("settings.set", {"ns": "projectMemory", "key": str(tmp / "parser"), "value": "use pnpm"})
    group = (await c.call("projectGroups.save", {"name": "Parser", "roots": [str(tmp / "parser"),
                                                                             str(tmp / "lexer")]}))["group"]
    await c.call("projectGroups.setMemory", {"groupId": group["id"], "memory": "shared memory"})
    await c.call("projectGroups.setInstructions", {"groupId": group["id"], "instructions": "run both suites"})
    await c.call("skills.put", {"name": "release-notes", "version": "1.0.0", "source": "---\nname: rn\n---\n"})


def _doc(bundle: str) -> dict[str, Any]:
    """The bundle's document, its export time aside: a group's, a memory's and a skill's times travel with
    them (an applied group and memory were stamped with the applying host's clock)."""
    doc: dict[str, Any] = sync.decode_bundle(_key(), base64.b64decode(bundle))
    doc.pop("exportedAt")
    return doc


async def test_export_apply_export_is_a_stable_round_trip(tmp_path: Path) -> None:
    """README §8.7: "configSync.export encrypts the portable configuration ... configSync.apply verifies and
    decrypts a bundle ... and merges it". What A exports, B applies and exports again is the same document (its
    export time aside: the items' own times travel with them), and so is what A then exports after applying B's;
    a second apply changes nothing."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with trio.fail_after(90):
        async with real_host(a, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await _fill(c, tmp_path)
            first = (await c.call("configSync.export", {}))["bundleBase64"]
        async with real_host(b, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("configSync.apply", {"bundleBase64": first})
            second = (await c.call("configSync.export", {}))["bundleBase64"]
            assert _doc(second) == _doc(first)
            before = probe.state(b)
            await c.call("configSync.apply", {"bundleBase64": second})
            after = probe.state(b)
            assert {k: v for k, v in after["files"].items() if not k.startswith("config-sync")} \
                == {k: v for k, v in before["files"].items() if not k.startswith("config-sync")}
            assert _doc((await c.call("configSync.export", {}))["bundleBase64"]) == _doc(first)
        async with real_host(a, client_id=CLIENT) as (_p, c):
            await c.call("configSync.apply", {"bundleBase64": second})
            assert _doc((await c.call("configSync.export", {}))["bundleBase64"]) == _doc(first)


# ------------------------------------------------------------------ no schema or transcript change


async def test_no_config_sync_call_refused_or_not_changes_the_schema_a_session_or_a_transcript(
        tmp_path: Path) -> None:
    """§1.3: "Sync revisions and resources remain remote immutable objects and do not change the SQLite schema
    or transcript retention." Every configSync method, the refused calls too (a foreign bundle, bad input, an
    unsupported bundle, a configure of a bad key), leaves the schema, the session rows and every transcript
    byte as they were."""
    other, data = tmp_path / "other", data_dir(tmp_path)
    other.mkdir()
    with trio.fail_after(90):
        async with real_host(other) as (_p, c):
            await c.call("configSync.configure", {})
            foreign = (await c.call("configSync.export", {}))["bundleBase64"]
        proc = start_host_process(data)
        try:
            async with client(proc, client_id=CLIENT) as c:
                await c.call("session.create", {"sessionId": "s1", "title": "kept"})
                await say(c, "s1", "m1", "hello")
                await say(c, "s1", "m2", "hi", "assistant")
            assert proc.terminate() == 0  # a clean stop: the message index is written before the next boot
        finally:
            if proc.proc.poll() is None:
                proc.kill9()
        async with real_host(data, client_id=CLIENT) as (_p, c):
            def snapshot() -> dict[str, Any]:
                state = probe.state(data)
                return {"schema": _schema(data),
                        "sessionRows": {t: r for t, r in state["db"].items()
                                        if t.startswith(("session", "message", "turn"))},
                        "transcripts": {p: d for p, d in state["files"].items() if p.startswith("sessions")}}

            before = snapshot()
            assert before["transcripts"]
            calls: list[tuple[str, dict[str, Any]]] = [
                ("configSync.get", {}),
                ("configSync.apply", {"bundleBase64": foreign}),  # not configured yet: CONFLICT
                ("configSync.configure", {"vaultKey": VAULT_KEY, "webdavPassword": PASSWORD, "enabled": True}),
                ("configSync.configure", {"vaultKey": "short"}),
                ("configSync.export", {"submissionId": "e1"}),
                ("configSync.apply", {"bundleBase64": foreign}),
                ("configSync.apply", {"bundleBase64": "not base64!"}),
                ("configSync.apply", {"bundleBase64": _b64(sync.encode_bundle(_key(), {"schema": 9}))}),
                ("configSync.export", {"submissionId": "e1"}),
                ("configSync.configure", {"enabled": False}),
                ("configSync.get", {}),
            ]
            for method, params in calls:
                await error_of(c, method, params)
                assert snapshot() == before, (method, params)
            bundle = (await c.call("configSync.export", {}))["bundleBase64"]
            await c.call("configSync.apply", {"bundleBase64": bundle})
            assert snapshot() == before
            assert [m["id"] for m in (await c.call("session.context", {"sessionId": "s1"}))["messages"]] \
                == ["m1", "m2"]


# ------------------------------------------------------------------ who may call


async def test_every_client_kind_but_a_plugin_may_use_config_sync_and_a_plugin_changes_nothing(
        tmp_path: Path) -> None:
    """README: "clientKind is one of ui, agent ..., cli, test or plugin; a plugin ... connection is scoped to
    what that plugin owns" and "Every other route answers a plugin PERMISSION_DENIED"; configSync names no
    other restriction. A ui, agent, sidecar, cli or test connection gets, configures, exports and applies; a
    plugin connection (whatever its id) is PERMISSION_DENIED on each, and nothing changes."""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, client_id=CLIENT) as (proc, ui):
            await ui.call("configSync.configure", {"vaultKey": VAULT_KEY})
            for kind in ("ui", "agent", "sidecar", "cli", "test"):
                async with client(proc, client_id=f"{kind}-1", kind=kind) as c:
                    got = await c.call("configSync.get", {})
                    assert got["hasVaultKey"] is True, kind
                    await c.call("configSync.configure", {"enabled": kind != "test", "submissionId": f"c-{kind}"})
                    exported = await c.call("configSync.export", {"submissionId": f"e-{kind}"})
                    applied = await c.call("configSync.apply", {"bundleBase64": exported["bundleBase64"]})
                    assert applied["sha256"] == exported["sha256"], kind
            bundle = (await ui.call("configSync.export", {}))["bundleBase64"]
            before = probe.state(data)
            for plugin_id in ("acme.tools", "configSync", "pi-host"):
                async with client(proc, client_id=f"{plugin_id}-rt", kind="plugin", plugin_id=plugin_id) as p:
                    for method, params in (("configSync.get", {}),
                                           ("configSync.configure", {"enabled": True, "vaultKey": VAULT_KEY}),
                                           ("configSync.export", {"submissionId": "p"}),
                                           ("configSync.apply", {"bundleBase64": bundle, "submissionId": "p"}),
                                           ("settings.set", {"ns": "configSync", "key": "settings",
                                                             "value": {"enabled": True}})):
                        code, err = await error_of(p, method, params)
                        assert code == "PERMISSION_DENIED", (plugin_id, method, code, err)
            assert probe.state(data) == before, "a plugin's refused sync call changed something"


# ------------------------------------------------------------------ largePasteThreshold through a bundle


async def test_a_bundle_carrying_a_large_paste_threshold_a_write_would_refuse_is_refused_whole(
        tmp_path: Path) -> None:
    """§7: "settings writes validate the integer range of 1–1,000,000"; README §8.7: "A bundle whose content
    breaks a rule is refused whole with that rule's own error, as the method that writes the thing would
    answer ... and changes nothing". (Before the fix the apply dropped the value and applied the rest.)"""
    data = data_dir(tmp_path)
    with trio.fail_after(60):
        async with real_host(data, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.set", {"key": "largePasteThreshold", "value": 777})
            for bad in (0, -1, 1_000_001, "600", True, 600.0, None, [600]):
                set_code, _ = await error_of(c, "settings.set", {"key": "largePasteThreshold", "value": bad})
                before = probe.state(data)
                doc = {"schema": 1, "settings": {"largePasteThreshold": bad, "thinkingDisplayMode": "compact"},
                       "projects": [{"path": str(tmp_path / "p")}]}
                code, err = await error_of(c, "configSync.apply",
                                           {"bundleBase64": _b64(sync.encode_bundle(_key(), doc))})
                assert code == set_code == "INVALID_PARAMS", (bad, code, set_code, err)
                assert err.get("field") == "largePasteThreshold", (bad, err)
                assert probe.state(data) == before, bad
            assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 777
            assert (await c.call("settings.get", {"key": "thinkingDisplayMode"}))["value"] == "detailed"


async def test_large_paste_threshold_edges_travel_and_an_unusable_stored_one_reads_600_on_both_hosts(
        tmp_path: Path) -> None:
    """§7: "Host settings reads normalize a missing, malformed, or out-of-range value to 600, and settings
    writes validate the integer range of 1–1,000,000." The edges 1 and 1,000,000 travel as they are (beside
    another platform's shell, which is left out here, not a reason to refuse the bundle); a host
    whose stored value is malformed or out of range reads 600, its bundle still applies elsewhere (not refused
    whole for a value its own reads replace), and the other host then reads 600 too, or keeps its own."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with trio.fail_after(120):
        async with real_host(b, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            for edge in (1, 1_000_000):
                # a shell of another platform is no broken rule: that device's setting, left out here
                doc = {"schema": 1, "settings": {"largePasteThreshold": edge, "defaultCommandShell": "cmd"}}
                await c.call("configSync.apply", {"bundleBase64": _b64(sync.encode_bundle(_key(), doc))})
                assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == edge
                assert "value" not in await c.call("settings.get", {"key": "defaultCommandShell"})
        async with real_host(a, client_id=CLIENT) as (_p, c):
            await c.call("configSync.configure", {"vaultKey": VAULT_KEY})
            await c.call("settings.update", {"values": {"largePasteThreshold": 321, "thinkingDisplayMode": "compact"}})
        for stored in ('"600"', "0", "1000001"):
            conn = sqlite3.connect(a / "pi.sqlite")
            try:
                with conn:
                    conn.execute("UPDATE kv SET value_json = json_set(value_json, '$.largePasteThreshold', "
                                 "json(?)) WHERE ns = 'app' AND key = 'settings'", (stored,))
            finally:
                conn.close()
            async with real_host(a, client_id=CLIENT) as (_p, c):
                assert (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"] == 600, stored
                values = (await c.call("settings.getAll", {"ns": "app"}))["values"]
                assert values["largePasteThreshold"] == 600, stored
                bundle = (await c.call("configSync.export", {}))["bundleBase64"]
            async with real_host(b, client_id=CLIENT) as (_p, c):
                await c.call("settings.set", {"key": "largePasteThreshold", "value": 4321})
                await c.call("configSync.apply", {"bundleBase64": bundle})
                got = (await c.call("settings.get", {"key": "largePasteThreshold"}))["value"]
                assert got in (600, 4321), (stored, got)
                assert (await c.call("settings.get", {"key": "thinkingDisplayMode"}))["value"] == "compact"
