"""protocol/README.md read as the spec a client developer codes against, by an outsider: for the methods
the rest of the suite tests least (skills, memories, project groups, permission rules, provider order,
the model catalog, plugins, tasks, usage, subscriptions), each documented claim that no other test pins —
an error code and when it comes, "every refusal changes nothing", a default, an order, a page, the
identical answer of a keyed retry, what an event carries — checked black-box against a real ``pi-host
serve`` process. Every result is validated against its pydantic result model (``protocol.methods``) and
every event's ``data`` against its payload model (``protocol.models_events``). Each test quotes what it
checks."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from protocol.methods import METHODS
from protocol.models_events import EVENT_PAYLOADS
from runtime.client import ClientEvent, HostClient, RpcError, open_client
from tests.acceptance.outsiderkit import data_dir
from tests.acceptance.outsiderkit import real_host as outsider_host
from tests.hostkit import HostProcess, msg


@asynccontextmanager
async def real_host(tmp_path: Path, kind: str = "ui") -> AsyncIterator[tuple[HostProcess, HostClient]]:
    async with outsider_host(data_dir(tmp_path), kind=kind) as pair:
        yield pair


async def call(c: HostClient, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The call's result, validated against the method's documented result model."""
    result: dict[str, Any] = await c.call(method, params or {})
    METHODS[method].result_model.model_validate(result)
    return result


async def refused(c: HostClient, method: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The error code and data of a call that must fail; the code must be one the README lists for it."""
    try:
        await c.call(method, params)
    except RpcError as failed:
        assert failed.data_code in METHODS[method].errors, (method, failed.data_code)
        return failed.data_code, failed.data
    raise AssertionError(f"{method} {params} succeeded")


async def events_until_quiet(c: HostClient, quiet: float = 0.3) -> list[ClientEvent]:
    """Every event received until none arrives for ``quiet`` seconds; each ``data`` validated against its
    topic's payload model."""
    got: list[ClientEvent] = []
    while True:
        with trio.move_on_after(quiet) as scope:
            event = await c.next_event()
        if scope.cancelled_caught:
            return got
        EVENT_PAYLOADS[event.topic].model_validate(event.data)
        got.append(event)


# ------------------------------------------------------------------------------------- the error table (§3)

README = Path(__file__).resolve().parents[2] / "protocol" / "README.md"


def test_every_error_code_the_reference_lists_says_what_it_means() -> None:
    """§3: "`error.data.code` is a **stable string**. Clients should branch on this field ... The table in
    the generated part of this page lists every string code with its numeric code": a client codes its
    branch from the meaning column, so no code (every one a method lists among its errors) may leave it
    blank."""
    table = README.read_text(encoding="utf-8").split("### Error codes", 1)[1].split("## Methods", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| `")]
    meanings = {row[0].strip("`"): row[3] for row in rows}
    listed = {code for spec in METHODS.values() for code in spec.errors}
    assert listed <= set(meanings)
    assert [code for code, meaning in meanings.items() if not meaning] == []


# ------------------------------------------------------------------------------------------- skills (§8.6)

async def test_skills_delete_get_and_keyed_retries(tmp_path: Path) -> None:
    """§8.6 and the skills.* reference: "`skills.get {name}` the whole skill (`NOT_FOUND` when not stored);
    `skills.delete {name}` answers `deleted: false` when there was nothing to delete. Writes carry command
    receipts and publish `settings.changed {ns: "skills", keys}`"; "The same put again writes nothing
    (`changed: false`)"; §4: "A retry with the same key returns the stored response and has no other
    effect ... The same key used for a different request ... fails with `IDEMPOTENCY_CONFLICT` and changes
    nothing"; "`settings.set` on `skills` is `INVALID_PARAMS` naming the owner"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.subscribe(["settings.changed"])
            put = {"name": "notes", "version": "1.0", "source": "# notes\n", "submissionId": "sk-put"}
            first = await call(c, "skills.put", put)
            assert first["changed"] is True and "source" not in first["skill"]
            assert await call(c, "skills.put", put) == first  # the keyed retry: the stored answer
            again = await call(c, "skills.put", {**put, "submissionId": "sk-put-2"})
            assert again["changed"] is False
            await call(c, "skills.put", {"name": "other", "version": "1", "source": "x"})
            events = await events_until_quiet(c)
            assert [(e.data["ns"], e.data["keys"]) for e in events] == [("skills", ["notes"]), ("skills", ["other"])]

            assert (await refused(c, "skills.get", {"name": "absent"}))[0] == "NOT_FOUND"
            assert await call(c, "skills.delete", {"name": "absent"}) == {"name": "absent", "deleted": False}
            gone = await call(c, "skills.delete", {"name": "notes", "submissionId": "sk-del"})
            assert gone == {"name": "notes", "deleted": True}
            assert [e.data for e in await events_until_quiet(c)] == [{"ns": "skills", "keys": ["notes"]}]
            assert await call(c, "skills.delete", {"name": "notes", "submissionId": "sk-del"}) == gone
            assert (await refused(c, "skills.get", {"name": "notes"}))[0] == "NOT_FOUND"
            code, _ = await refused(c, "skills.delete", {"name": "other", "submissionId": "sk-del"})
            assert code == "IDEMPOTENCY_CONFLICT"
            assert (await call(c, "skills.get", {"name": "other"}))["skill"]["source"] == "x"

            code, data = await refused(c, "settings.set", {"ns": "skills", "key": "other", "value": {"x": 1}})
            assert code == "INVALID_PARAMS"
            listed = (await call(c, "skills.list"))["skills"]
            assert [s["name"] for s in listed] == ["other"] and all("source" not in s for s in listed)
            assert await events_until_quiet(c) == []  # refusals and replays publish nothing


async def test_a_skill_version_conflict_names_the_stored_digest_and_changes_nothing(tmp_path: Path) -> None:
    """§8.6: "`skills.put` of a version ever stored under that name (the current one, an older one a newer
    put replaced, or one of a deleted skill) with other source is `CONFLICT` (bump the version;
    `data.sha256` is the stored digest) and changes nothing"; "a put of an older version with its own
    source makes it current again"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            v1 = (await call(c, "skills.put", {"name": "a", "version": "1", "source": "one"}))["skill"]
            v2 = (await call(c, "skills.put", {"name": "a", "version": "2", "source": "two"}))["skill"]
            code, data = await refused(c, "skills.put", {"name": "a", "version": "1", "source": "uno"})
            assert code == "CONFLICT" and data.get("sha256") == v1["sha256"]
            assert (await call(c, "skills.get", {"name": "a"}))["skill"]["sha256"] == v2["sha256"]
            back = await call(c, "skills.put", {"name": "a", "version": "1", "source": "one"})
            assert back["changed"] is True and back["skill"]["version"] == "1"
            await call(c, "skills.delete", {"name": "a"})
            code, data = await refused(c, "skills.put", {"name": "a", "version": "2", "source": "deux"})
            assert code == "CONFLICT" and data.get("sha256") == v2["sha256"]
            assert (await refused(c, "skills.get", {"name": "a"}))[0] == "NOT_FOUND"



async def test_at_most_200_skills_but_a_stored_one_still_updates(tmp_path: Path) -> None:
    """§8.6: "At most 200 skills (`LIMIT_EXCEEDED`; updating a stored one still works)" — the 201st name is
    refused and nothing is written; a new version of a stored skill, and a new name once one is deleted,
    are accepted."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            puts = [("skills.put", {"name": f"s{i:03d}", "version": "1", "source": f"source {i}"}) for i in range(200)]
            assert not [r for r in await c.batch(puts) if isinstance(r, RpcError)]
            code, _ = await refused(c, "skills.put", {"name": "one-more", "version": "1", "source": "x"})
            assert code == "LIMIT_EXCEEDED"
            assert (await refused(c, "skills.get", {"name": "one-more"}))[0] == "NOT_FOUND"
            bumped = await call(c, "skills.put", {"name": "s000", "version": "2", "source": "newer"})
            assert bumped["changed"] is True and bumped["skill"]["version"] == "2"
            assert len((await call(c, "skills.list"))["skills"]) == 200
            await call(c, "skills.delete", {"name": "s199"})
            assert (await call(c, "skills.put", {"name": "one-more", "version": "1", "source": "x"}))["changed"]

# ----------------------------------------------------------------------------------------- memories (§8.6)

async def test_memories_list_defaults_order_and_pages(tmp_path: Path) -> None:
    """memories.list: "`scope` ... (default `"project"`)", "`limit` ≥ 1, ≤ 500, default `100`"; §8.6:
    "pages through what is stored, by key (the canonical project path or the group id): each item has the
    entry count, the derived content's size and `updatedAt`, never the content; `nextAfter` is set when
    more may follow (pass it as `after`)"; §8.2: "memory with no entries stores no key"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            values = {f"/w/p{i:03d}": f"memory {i}" for i in range(105)}
            values["/w/p050"] = {"format": "entries-v1", "entries": [{"content": "a"}, {"title": "T", "content": "b"}]}
            names = sorted(values)  # §7: "keys per `settings.update` | 1–100 (all or none)"
            for part in (names[:100], names[100:]):
                await call(c, "settings.update", {"ns": "projectMemory", "values": {k: values[k] for k in part}})
            await call(c, "settings.set", {"ns": "projectMemory", "key": "/w/empty",
                                            "value": {"format": "entries-v1", "entries": []}})
            group = (await call(c, "projectGroups.save", {"name": "G", "roots": ["/w/g"]}))["group"]["id"]
            await call(c, "projectGroups.setMemory", {"groupId": group, "memory": "group memory"})

            page = await call(c, "memories.list")
            keys = [m["key"] for m in page["memories"]]
            assert len(keys) == 100 and keys == sorted(keys) and keys[0] == "/w/p000"
            assert all(m["scope"] == "project" and "content" not in m for m in page["memories"])
            assert page["nextAfter"] == keys[-1]
            rest = await call(c, "memories.list", {"after": page["nextAfter"]})
            assert [m["key"] for m in rest["memories"]] == sorted(values)[100:]
            assert not rest.get("nextAfter")
            item = {m["key"]: m for m in page["memories"]}["/w/p050"]
            assert item["entries"] == 2 and item["contentBytes"] > 0
            small = await call(c, "memories.list", {"limit": 1, "after": "/w/p103"})
            assert [m["key"] for m in small["memories"]] == ["/w/p104"]

            groups = await call(c, "memories.list", {"scope": "group"})
            assert [(m["scope"], m["key"], m["entries"]) for m in groups["memories"]] == [("group", group, 1)]
            assert (await refused(c, "memories.list", {"limit": 501}))[0] == "INVALID_PARAMS"
            assert (await refused(c, "memories.list", {"scope": "session"}))[0] == "INVALID_PARAMS"


# -------------------------------------------------------------------------------------- project groups (§8.2)

async def test_project_groups_save_list_get_and_their_refusals(tmp_path: Path) -> None:
    """projectGroups.save: "`groupId` Absent: create a group", "`primaryRoot` Default: the first root";
    §8.2: "stores a group's ordered canonical `roots` and `primaryRoot`; a root belongs to one group at most
    (`CONFLICT`), and a root a later save leaves out moves to `detachedPaths`. `projectGroups.list` also
    projects every path project no group claims as a read-only legacy group `project:<projectId>`";
    ProjectGroupsListResult: "Stored groups by name, then legacy projections"; "a blank or relative one
    (`INVALID_PARAMS` naming the field, nothing written)"; the save's summary: "Roots are distinct once
    canonical and primaryRoot is one of them; a legacy project:<id> projection is read-only (each
    INVALID_PARAMS naming the field)"; §8: "every refusal changes nothing"; a keyed retry of the create
    answers the same group (§4)."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            solo = (await call(c, "workspace.open", {"path": "/w/solo"}))["project"]["id"]
            claimed = (await call(c, "workspace.open", {"path": "/w/z2"}))["project"]["id"]
            create = {"name": "Zed", "roots": ["/w/z1/", "\\w\\z2"], "submissionId": "g-create"}
            zed = (await call(c, "projectGroups.save", create))["group"]
            assert zed["roots"] == ["/w/z1", "/w/z2"] and zed["primaryRoot"] == "/w/z1"
            assert (await call(c, "projectGroups.save", create))["group"] == zed
            alpha = (await call(c, "projectGroups.save", {"name": "Alpha", "roots": ["/w/a"]}))["group"]
            assert alpha["id"] != zed["id"]

            before = await call(c, "projectGroups.list")
            assert [g["id"] for g in before["groups"]] == [alpha["id"], zed["id"], f"project:{solo}"]
            legacy = before["groups"][-1]
            assert legacy["legacy"] is True and legacy["roots"] == ["/w/solo"]
            assert f"project:{claimed}" not in [g["id"] for g in before["groups"]]

            code, data = await refused(c, "projectGroups.save", {"name": "Taken", "roots": ["/w/z2/"]})
            assert code == "CONFLICT"
            code, data = await refused(c, "projectGroups.save", {"name": "Rel", "roots": ["/w/ok", "rel/x"]})
            assert code == "INVALID_PARAMS" and "roots" in str(data)
            code, _ = await refused(c, "projectGroups.save", {"name": "Ghost", "groupId": "g-ghost", "roots": ["/w/q"]})
            assert code == "NOT_FOUND"
            code, _ = await refused(c, "projectGroups.save", {**create, "name": "Other"})
            assert code == "IDEMPOTENCY_CONFLICT"
            for bad, field in (({"roots": ["/w/b", "/w/b/"]}, "roots.1"),
                               ({"roots": ["/w/b"], "primaryRoot": "/w/c"}, "primaryRoot"),
                               ({"roots": ["/w/solo"], "groupId": f"project:{solo}"}, "groupId")):
                code, data = await refused(c, "projectGroups.save", {"name": "Bad", **bad})
                assert code == "INVALID_PARAMS" and data.get("field") == field, bad
            assert await call(c, "projectGroups.list") == before

            moved = (await call(c, "projectGroups.save", {"groupId": zed["id"], "name": "Zed",
                                                          "roots": ["/w/z2"]}))["group"]
            assert moved["roots"] == ["/w/z2"] and moved["primaryRoot"] == "/w/z2"
            assert "/w/z1" in (moved.get("detachedPaths") or [])
            assert moved["createdAt"] == zed["createdAt"]
            # the detached root is free again
            await call(c, "projectGroups.save", {"name": "Free", "roots": ["/w/z1"]})

            assert (await refused(c, "projectGroups.get", {"groupId": "g-ghost"}))[0] == "NOT_FOUND"
            got = await call(c, "projectGroups.get", {"groupId": f"project:{solo}"})
            assert got["group"]["legacy"] is True and got["memory"]["entries"] == []
    entry = README.read_text(encoding="utf-8").split("### `projectGroups.save`", 1)[1].split("\n### ", 1)[0]
    assert "Roots are distinct once canonical and primaryRoot is one of them" in entry


async def test_project_group_memory_instructions_and_delete(tmp_path: Path) -> None:
    """projectGroups.setMemory: "entries-v1 or text, at most 32 KiB of content; empty removes it";
    setInstructions: "at most 32 KiB; blank removes them"; §8.2 "(at most 32 KiB, `PAYLOAD_TOO_LARGE`
    beyond)"; NOT_FOUND for a group that is not stored; projectGroups.delete: "Delete a group record with its
    memory and instructions (sessions and files stay)" — no NOT_FOUND listed: a group that is not there
    answers `deleted: false`; a keyed retry answers what the first call answered; SettingsChangedEvent lists
    projectGroups.* among its writers."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            gid = (await call(c, "projectGroups.save", {"name": "G", "roots": ["/w/g"]}))["group"]["id"]
            other = (await call(c, "projectGroups.save", {"name": "H", "roots": ["/w/h"]}))["group"]["id"]
            await c.subscribe(["settings.changed"])
            mem = await call(c, "projectGroups.setMemory", {"groupId": gid, "memory": {
                "format": "entries-v1", "entries": [{"title": "Build", "content": "make"}]}})
            assert mem["groupId"] == gid and "make" in mem["memory"]["content"]
            ins = await call(c, "projectGroups.setInstructions", {"groupId": gid, "instructions": "Run tests."})
            assert ins == {"groupId": gid, "instructions": "Run tests."}
            events = await events_until_quiet(c)
            assert events and all(e.data["ns"].startswith("projectGroup") for e in events)

            big = "x" * (32 * 1024 + 1)
            assert (await refused(c, "projectGroups.setMemory", {"groupId": gid, "memory": big}))[0] == \
                "PAYLOAD_TOO_LARGE"
            assert (await refused(c, "projectGroups.setInstructions", {"groupId": gid, "instructions": big}))[0] \
                == "PAYLOAD_TOO_LARGE"
            for method, field in (("projectGroups.setMemory", "memory"),
                                  ("projectGroups.setInstructions", "instructions")):
                assert (await refused(c, method, {"groupId": "g-ghost", field: "x"}))[0] == "NOT_FOUND"
            got = await call(c, "projectGroups.get", {"groupId": gid})
            assert got["instructions"] == "Run tests." and got["memory"]["content"] == mem["memory"]["content"]
            assert await events_until_quiet(c) == []

            await call(c, "projectGroups.setInstructions", {"groupId": other, "instructions": "  \n "})
            await call(c, "projectGroups.setMemory", {"groupId": other, "memory": "kept"})
            await call(c, "projectGroups.setMemory", {"groupId": other, "memory": ""})
            cleared = await call(c, "projectGroups.get", {"groupId": other})
            assert not cleared.get("instructions") and cleared["memory"]["entries"] == []
            assert [m["key"] for m in (await call(c, "memories.list", {"scope": "group"}))["memories"]] == [gid]

            gone = await call(c, "projectGroups.delete", {"groupId": gid, "submissionId": "g-del"})
            assert gone == {"groupId": gid, "deleted": True}
            assert await call(c, "projectGroups.delete", {"groupId": gid, "submissionId": "g-del"}) == gone
            assert await call(c, "projectGroups.delete", {"groupId": gid}) == {"groupId": gid, "deleted": False}
            assert (await refused(c, "projectGroups.delete", {"groupId": other, "submissionId": "g-del"}))[0] == \
                "IDEMPOTENCY_CONFLICT"
            assert (await refused(c, "projectGroups.get", {"groupId": gid}))[0] == "NOT_FOUND"
            assert (await call(c, "memories.list", {"scope": "group"}))["memories"] == []
            assert [g["id"] for g in (await call(c, "projectGroups.list"))["groups"]] == [other]
            got = await call(c, "settings.get", {"ns": "projectGroupInstructions", "key": gid})
            assert got.get("value") is None


# ------------------------------------------------------------------------------- providers and models (§8.3-4)

async def test_provider_order_ignores_unknown_ids_and_lists_the_rest_in_creation_order(tmp_path: Path) -> None:
    """providers.reorder: "ids no provider has are ignored"; §8.3: "`list` follows it, ids it does not name
    follow in creation order, deleted ids are skipped. An id in the request that no provider has ... is
    ignored, not refused: the reply's `providerIds` is the order saved"; §8.1: "`providers.order` [is a]
    separate row, readable here but written only by ... `providers.reorder`"; a keyed retry answers the
    stored reply; SettingsChangedEvent names providers.reorder among its writers."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            for pid in ("p1", "p2", "p3", "p4"):
                await call(c, "providers.create", {"id": pid, "name": pid.upper()})
            await c.subscribe(["settings.changed"])
            keyed = {"providerIds": ["p3", "ghost", "p1"], "submissionId": "order-1"}
            saved = await call(c, "providers.reorder", keyed)
            assert saved == {"providerIds": ["p3", "p1"]}
            [event] = await events_until_quiet(c)
            assert event.data["ns"] == "app" and "providers.order" in event.data["keys"]
            listed = [p["id"] for p in (await call(c, "providers.list"))["providers"]]
            assert listed == ["p3", "p1", "p2", "p4"]
            assert (await call(c, "settings.get", {"key": "providers.order"}))["value"] == ["p3", "p1"]
            await call(c, "providers.delete", {"providerId": "p3"})
            assert [p["id"] for p in (await call(c, "providers.list"))["providers"]] == ["p1", "p2", "p4"]
            assert await call(c, "providers.reorder", keyed) == saved  # the receipt, whatever changed since
            code, _ = await refused(c, "providers.reorder", {**keyed, "providerIds": ["p2"]})
            assert code == "IDEMPOTENCY_CONFLICT"
            code, _ = await refused(c, "settings.set", {"key": "providers.order", "value": ["p4"]})
            assert code in ("INVALID_PARAMS", "PERMISSION_DENIED")
            assert [p["id"] for p in (await call(c, "providers.list"))["providers"]] == ["p1", "p2", "p4"]
            code, data = await refused(c, "providers.reorder", {"providerIds": ["p2", "p1", "p2"]})
            assert code == "INVALID_PARAMS" and data.get("field") == "providerIds"
            assert [p["id"] for p in (await call(c, "providers.list"))["providers"]] == ["p1", "p2", "p4"]
            assert await call(c, "providers.reorder", {"providerIds": []}) == {"providerIds": []}
            assert [p["id"] for p in (await call(c, "providers.list"))["providers"]] == ["p1", "p2", "p4"]


def test_the_reference_of_providers_reorder_agrees_with_section_8_3() -> None:
    """§8.3 and the method's summary: an id no provider has "is ignored, not refused"; the generated field
    description a client reads beside it must not say the opposite ("every id must exist"), and it names
    the one refusal the host makes (a repeated id)."""
    entry = README.read_text(encoding="utf-8").split("### `providers.reorder`", 1)[1].split("\n### ", 1)[0]
    [row] = [line for line in entry.splitlines() if line.startswith("| `providerIds`")]
    assert "must exist" not in row and "ignored" in row and "INVALID_PARAMS" in row


async def test_models_remove_answers_deleted_false_for_what_is_not_there(tmp_path: Path) -> None:
    """models.remove: "Remove a user-added model (discovered ones are managed by models.refresh)"; its
    errors list no NOT_FOUND, so a model (or provider) that is not there answers `deleted: false`; a keyed
    retry answers the stored `deleted: true`; ModelsChangedEvent: "The model catalog of a provider changed
    (models.add / remove / refresh)" — and models.add of a provider that does not exist is `NOT_FOUND`."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await call(c, "providers.create", {"id": "p1", "name": "P"})
            await c.subscribe(["models.changed"])
            await call(c, "models.add", {"providerId": "p1", "modelId": "m/x", "contextWindow": 4096})
            assert [e.data for e in await events_until_quiet(c)] == [{"providerId": "p1"}]
            keyed = {"providerId": "p1", "modelId": "m/x", "submissionId": "rm-1"}
            first = await call(c, "models.remove", keyed)
            assert first == {"providerId": "p1", "modelId": "m/x", "deleted": True}
            assert [e.data for e in await events_until_quiet(c)] == [{"providerId": "p1"}]
            assert await call(c, "models.remove", keyed) == first
            assert (await call(c, "models.remove", {"providerId": "p1", "modelId": "m/x"}))["deleted"] is False
            assert (await call(c, "models.remove", {"providerId": "ghost", "modelId": "m/x"}))["deleted"] is False
            assert await events_until_quiet(c) == []
            assert (await refused(c, "models.add", {"providerId": "ghost", "modelId": "m/y"}))[0] == "NOT_FOUND"
            assert (await call(c, "models.list", {}))["models"] == []


# ------------------------------------------------------------------------------ notifications and usage (§10)

async def ended_turn(c: HostClient, sid: str, tid: str, status: str, **extra: Any) -> dict[str, Any]:
    await call(c, "session.startTurn", {"sessionId": sid, "turnId": tid})
    await call(c, "session.appendMessage", {"sessionId": sid, "turnId": tid, "message": msg(f"{tid}-u", "go")})
    return await call(c, "session.endTurn", {"sessionId": sid, "turnId": tid, "status": status, **extra})


async def test_notification_inbox_order_paging_and_keyed_bulk_writes(tmp_path: Path) -> None:
    """session.endTurn: "`createNotification` Insert a task.completed/task.failed notification (never for
    aborted) ... (default `true`)"; notifications.list: "newest first, with the unread count", "`unreadOnly`
    default `false`", cursors "pass the cursor back unchanged. A missing `nextCursor` means there are no
    more pages"; markRead "(idempotent)" with `updated` = "Rows whose readAt changed"; markAllRead "Mark
    every notification read"; clear: "All notifications when absent"; §4: a keyed retry returns the stored
    response (not a recount) and the same key for another request is IDEMPOTENCY_CONFLICT, changing
    nothing; the `notification.created` event carries the row."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await call(c, "session.create", {"title": "Inbox"}))["id"]
            await c.subscribe(["notification.created"])
            await ended_turn(c, sid, "t1", "completed")
            await ended_turn(c, sid, "t2", "error", errorCode="PROVIDER_TIMEOUT")
            await ended_turn(c, sid, "t3", "aborted")
            await ended_turn(c, sid, "t4", "completed", createNotification=False)
            await ended_turn(c, sid, "t5", "completed")
            events = await events_until_quiet(c)
            assert [(e.data["notification"]["turnId"], e.data["notification"]["kind"]) for e in events] == \
                [("t1", "task.completed"), ("t2", "task.failed"), ("t5", "task.completed")]
            assert events[1].data["notification"]["errorCode"] == "PROVIDER_TIMEOUT"
            assert all(e.session_id == sid and e.data["notification"]["sessionTitle"] == "Inbox" for e in events)

            inbox = await call(c, "notifications.list")
            assert [n["turnId"] for n in inbox["notifications"]] == ["t5", "t2", "t1"]
            assert inbox["unreadCount"] == 3 and not inbox.get("nextCursor")
            ids = {n["turnId"]: n["id"] for n in inbox["notifications"]}
            page1 = await call(c, "notifications.list", {"limit": 2})
            assert [n["turnId"] for n in page1["notifications"]] == ["t5", "t2"] and page1["nextCursor"]
            page2 = await call(c, "notifications.list", {"limit": 2, "cursor": page1["nextCursor"]})
            assert [n["turnId"] for n in page2["notifications"]] == ["t1"] and not page2.get("nextCursor")

            assert await call(c, "notifications.markRead", {"ids": [ids["t1"], "n-ghost"]}) == {"updated": 1}
            assert await call(c, "notifications.markRead", {"ids": [ids["t1"]]}) == {"updated": 0}
            unread = await call(c, "notifications.list", {"unreadOnly": True})
            assert [n["turnId"] for n in unread["notifications"]] == ["t5", "t2"] and unread["unreadCount"] == 2
            assert (await call(c, "notifications.list"))["notifications"][2]["readAt"] > 0

            all_read = await call(c, "notifications.markAllRead", {"submissionId": "read-all"})
            assert all_read == {"updated": 2}
            assert await call(c, "notifications.markAllRead", {"submissionId": "read-all"}) == all_read
            assert await call(c, "notifications.markAllRead", {}) == {"updated": 0}
            assert (await call(c, "notifications.list"))["unreadCount"] == 0

            one = await call(c, "notifications.clear", {"ids": [ids["t2"]], "submissionId": "clear-1"})
            assert one == {"deleted": 1}
            assert await call(c, "notifications.clear", {"ids": [ids["t2"]], "submissionId": "clear-1"}) == one
            code, _ = await refused(c, "notifications.clear", {"submissionId": "clear-1"})
            assert code == "IDEMPOTENCY_CONFLICT"
            assert [n["turnId"] for n in (await call(c, "notifications.list"))["notifications"]] == ["t5", "t1"]
            assert await call(c, "notifications.clear", {}) == {"deleted": 2}
            empty = await call(c, "notifications.list")
            assert (empty["notifications"], empty["unreadCount"], empty.get("nextCursor")) == ([], 0, None)
            assert await events_until_quiet(c) == []


def days_near(offset_minutes: int) -> set[str]:
    """The day (YYYY-MM-DD) at ``offset_minutes`` east of UTC, now and a minute ago (a test crossing
    midnight)."""
    now = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=offset_minutes)
    return {(now - dt.timedelta(seconds=s)).strftime("%Y-%m-%d") for s in (0, 60)}


async def test_usage_history_defaults_days_and_sessions(tmp_path: Path) -> None:
    """usage.history: "Tokens and cost per day of the turns that ended in the last N days", `days` "default
    `30`", `utcOffsetMinutes` "Where a day starts (the UI's zone) ... default `0`", `sessionId` "One
    session's; every session's when absent" (SESSION_NOT_FOUND for an unknown one); UsageHistoryResult
    "Oldest first; days without ended turns are left out"; UsageDay: `costMicros` "Sum of usage.cost.total,
    in millionths", `failedTurns` "Turns that ended with status error"; a running turn has not ended."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            assert await call(c, "usage.history") == {"days": []}
            a = (await call(c, "session.create", {}))["id"]
            b = (await call(c, "session.create", {}))["id"]
            await ended_turn(c, a, "a1", "completed",
                             usage={"inputTokens": 100, "outputTokens": 10, "cost": {"total": 0.25}})
            await ended_turn(c, a, "a2", "error", usage={"inputTokens": 5, "outputTokens": 1})
            await ended_turn(c, b, "b1", "aborted", usage={"inputTokens": 7, "outputTokens": 0})
            await call(c, "session.startTurn", {"sessionId": b, "turnId": "b2"})  # still running

            [day] = (await call(c, "usage.history"))["days"]
            assert (day["turns"], day["inputTokens"], day["outputTokens"]) == (3, 112, 11)
            assert (day["failedTurns"], day["abortedTurns"], day["costMicros"]) == (1, 1, 250000)
            assert day["day"] in days_near(0)
            [only_a] = (await call(c, "usage.history", {"sessionId": a, "days": 1}))["days"]
            assert (only_a["turns"], only_a["inputTokens"], only_a["abortedTurns"]) == (2, 105, 0)
            for offset in (-840, 840):
                shifted = (await call(c, "usage.history", {"utcOffsetMinutes": offset}))["days"]
                assert sum(d["turns"] for d in shifted) == 3
                assert shifted[-1]["day"] in days_near(offset)
            assert (await refused(c, "usage.history", {"sessionId": "ghost"}))[0] == "SESSION_NOT_FOUND"
            for bad in ({"days": 0}, {"days": 367}, {"utcOffsetMinutes": 841}, {"days": "30"}):
                assert (await refused(c, "usage.history", bad))[0] == "INVALID_PARAMS"


# ------------------------------------------------------------------------------------------- events (§5)

async def test_subscriptions_filter_resume_and_unsubscribe(tmp_path: Path) -> None:
    """§5: "`cursor` is host-wide and strictly increasing ... After a reconnect, subscribe with it to get the
    events you missed, with no gaps"; events.subscribe `sessionId` "Only events of this session (all sessions
    when absent)"; events.unsubscribe: "Stop a subscription of this connection" with NOT_FOUND for one it
    does not have (another connection's included); §7: "subscriptions per connection | 64 (`LIMIT_EXCEEDED`;
    `events.unsubscribe` makes room)"; SubscribeResult `cursor`: "Cursor of the newest event already sent or
    skipped"; topics "max items 16", each topic once."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            a = (await call(c, "session.create", {}))["id"]
            b = (await call(c, "session.create", {}))["id"]
            only_a = await call(c, "events.subscribe", {"topics": ["session.message"], "sessionId": a})
            every = await call(c, "events.subscribe", {"topics": ["session.message", "session.updated"]})
            assert only_a["subscriptionId"] != every["subscriptionId"]
            for sid, mid in ((a, "a1"), (b, "b1"), (a, "a2")):
                await call(c, "session.appendMessage", {"sessionId": sid, "message": msg(mid, "hi")})
            got = await events_until_quiet(c)
            mine = [e for e in got if e.subscription_id == only_a["subscriptionId"]]
            assert [e.data["message"]["id"] for e in mine] == ["a1", "a2"]
            assert all(e.session_id == a and e.topic == "session.message" for e in mine)
            seen = [e for e in got if e.subscription_id == every["subscriptionId"]]
            assert {e.topic for e in seen} <= {"session.message", "session.updated"}
            assert [e.data["message"]["id"] for e in seen if e.topic == "session.message"] == ["a1", "b1", "a2"]
            cursors = [e.cursor for e in seen]
            assert cursors == sorted(set(cursors)) and cursors[0] > every["cursor"]

            async with open_client(proc.url, proc.token, client_id="late", client_kind="ui") as late:
                resumed = await call(late, "events.subscribe", {"topics": ["session.message", "session.updated"],
                                                                "cursor": every["cursor"]})
                replay = await events_until_quiet(late)
                assert [(e.topic, e.cursor, e.data) for e in replay] == [(e.topic, e.cursor, e.data) for e in seen]
                assert resumed["cursor"] >= cursors[-1]
                code, _ = await refused(late, "events.unsubscribe", {"subscriptionId": every["subscriptionId"]})
                assert code == "NOT_FOUND"

            assert await call(c, "events.unsubscribe", {"subscriptionId": every["subscriptionId"]}) == {"ok": True}
            code, _ = await refused(c, "events.unsubscribe", {"subscriptionId": every["subscriptionId"]})
            assert code == "NOT_FOUND"
            await call(c, "session.appendMessage", {"sessionId": b, "message": msg("b2", "hi")})
            await call(c, "session.appendMessage", {"sessionId": a, "message": msg("a3", "hi")})
            after = await events_until_quiet(c)
            assert [(e.subscription_id, e.data["message"]["id"]) for e in after] == [(only_a["subscriptionId"], "a3")]

            more = [await call(c, "events.subscribe", {"topics": ["task.due"]}) for _ in range(63)]  # with only_a: 64
            assert (await refused(c, "events.subscribe", {"topics": ["task.due"]}))[0] == "LIMIT_EXCEEDED"
            await call(c, "events.unsubscribe", {"subscriptionId": more[0]["subscriptionId"]})
            await call(c, "events.subscribe", {"topics": ["task.due"]})
            topics = list(EVENT_PAYLOADS)[:17]
            assert (await refused(c, "events.subscribe", {"topics": topics}))[0] == "INVALID_PARAMS"
            code, _ = await refused(c, "events.subscribe", {"topics": ["task.due", "task.due"]})
            assert code == "INVALID_PARAMS"
            assert (await refused(c, "events.subscribe", {"topics": []}))[0] == "INVALID_PARAMS"


def test_the_reference_of_events_subscribe_names_its_refusal_of_a_repeated_topic() -> None:
    """The host refuses a repeated topic (INVALID_PARAMS, checked live above); the `topics` row a client
    codes against says so instead of listing only the item counts."""
    entry = README.read_text(encoding="utf-8").split("### `events.subscribe`", 1)[1].split("\n### ", 1)[0]
    [row] = [line for line in entry.splitlines() if line.startswith("| `topics`")]
    assert "repeated topic is INVALID_PARAMS" in row


# ------------------------------------------------------------------------------------ tasks and the queue

async def test_tasks_delete_takes_the_run_history_and_answers_retries_from_the_receipt(tmp_path: Path) -> None:
    """tasks.delete: "Delete a task and its run history" (NOT_FOUND listed: an unknown task); tasks.runs:
    "A task's run history, newest first"; tasks.list: "Every scheduled task, oldest first"; tasks.startRun
    answers CONFLICT for a task with a running run (its errors list it); §4: the keyed delete's retry
    answers `deleted: true` again and the same key for another task is IDEMPOTENCY_CONFLICT, changing
    nothing; the session a run used stays."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await call(c, "session.create", {}))["id"]
            for tid in ("t-b", "t-a"):
                await call(c, "tasks.create", {"taskId": tid, "title": tid, "prompt": "p"})
            assert [t["id"] for t in (await call(c, "tasks.list"))["tasks"]] == ["t-b", "t-a"]
            await call(c, "tasks.startRun", {"taskId": "t-b", "runId": "r1", "sessionId": sid})
            assert (await refused(c, "tasks.startRun", {"taskId": "t-b", "runId": "r9"}))[0] == "CONFLICT"
            await call(c, "tasks.finishRun", {"runId": "r1", "status": "completed", "sessionId": sid})
            await call(c, "tasks.startRun", {"taskId": "t-b", "runId": "r2"})
            assert [r["id"] for r in (await call(c, "tasks.runs", {"taskId": "t-b"}))["runs"]] == ["r2", "r1"]
            assert [r["id"] for r in (await call(c, "tasks.runs", {"taskId": "t-b", "limit": 1}))["runs"]] == ["r2"]

            assert (await refused(c, "tasks.delete", {"taskId": "t-ghost"}))[0] == "NOT_FOUND"
            keyed = {"taskId": "t-b", "submissionId": "del-task"}
            gone = await call(c, "tasks.delete", keyed)
            assert gone == {"taskId": "t-b", "deleted": True}
            assert await call(c, "tasks.delete", keyed) == gone
            assert (await refused(c, "tasks.delete", {**keyed, "taskId": "t-a"}))[0] == "IDEMPOTENCY_CONFLICT"
            assert [t["id"] for t in (await call(c, "tasks.list"))["tasks"]] == ["t-a"]
            for method in ("tasks.get", "tasks.runs", "tasks.delete"):
                assert (await refused(c, method, {"taskId": "t-b"}))[0] == "NOT_FOUND"
            assert (await refused(c, "tasks.finishRun", {"runId": "r2", "status": "aborted"}))[0] == "NOT_FOUND"
            assert (await call(c, "session.get", {"sessionId": sid}))["session"]["id"] == sid


async def test_queue_reorder_swaps_neighbours_and_refuses_what_it_cannot_move(tmp_path: Path) -> None:
    """session.queueReorder: "Swap an unpromoted entry with its neighbour; a promoted entry, or one with no
    unpromoted neighbour that way (the first moved up, the last moved down), is CONFLICT and nothing moves"
    (seed 003 §4.6b: "swaps two adjacent non-promoted position values and refuses a promoted entry");
    NOT_FOUND for an entry the queue
    does not hold, SESSION_NOT_FOUND for a session that does not exist; queueList "in delivery order";
    every refusal changes nothing; a keyed retry answers the stored state and does not swap again."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await call(c, "session.create", {}))["id"]
            ids = [(await call(c, "session.queuePush", {"sessionId": sid, "principal": "ui", "content": text,
                                                        "permissionMode": "ask"}))["entry"]["id"]
                   for text in ("a", "b", "c", "d")]

            async def order() -> list[str]:
                return [e["id"] for e in (await call(c, "session.queueList", {"sessionId": sid}))["entries"]]

            keyed = {"sessionId": sid, "entryId": ids[2], "direction": "up", "submissionId": "swap-1"}
            swapped = await call(c, "session.queueReorder", keyed)
            assert [e["id"] for e in swapped["entries"]] == [ids[0], ids[2], ids[1], ids[3]] == await order()
            assert await call(c, "session.queueReorder", keyed) == swapped
            assert await order() == [ids[0], ids[2], ids[1], ids[3]]
            code, _ = await refused(c, "session.queueReorder", {**keyed, "direction": "down"})
            assert code == "IDEMPOTENCY_CONFLICT"

            await call(c, "session.queuePrioritize", {"sessionId": sid, "entryId": ids[3]})
            assert await order() == [ids[3], ids[0], ids[2], ids[1]]
            before = await order()
            for entry, direction, expected in ((ids[3], "down", "CONFLICT"), ("q-ghost", "up", "NOT_FOUND"),
                                               (ids[0], "up", "CONFLICT"), (ids[1], "down", "CONFLICT")):
                code, _ = await refused(c, "session.queueReorder", {"sessionId": sid, "entryId": entry,
                                                                    "direction": direction})
                assert code == expected
            code, _ = await refused(c, "session.queueReorder", {"sessionId": "ghost", "entryId": ids[0],
                                                                "direction": "up"})
            assert code == "SESSION_NOT_FOUND"
            assert await order() == before
    entry = README.read_text(encoding="utf-8").split("### `session.queueReorder`", 1)[1].split("\n### ", 1)[0]
    assert "the first moved up, the last moved down" in entry


# ------------------------------------------------------------------------------------ permission rules (§10)

async def test_permission_rules_by_scope_and_a_keyed_remove(tmp_path: Path) -> None:
    """§10: "An option with `remember: session | project | global` also stores a rule (`approvals.rules`,
    `approvals.removeRule`)"; approvals.rules: "Stored permission rules (every one, or those that apply to a
    session)", `sessionId` "(its own, its project's, global)", SESSION_NOT_FOUND for an unknown session;
    approvals.removeRule: "Forget a permission rule (later requests for that tool ask again)" — no
    NOT_FOUND listed, so an unknown rule answers `removed: false`; §4: a keyed retry answers the stored
    `removed: true`, the same key for another rule is IDEMPOTENCY_CONFLICT and changes nothing."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (proc, agent), \
                open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
            here, there = tmp_path / "here", tmp_path / "there"
            here.mkdir()
            there.mkdir()
            sids = []
            for n, root in enumerate((here, here, there)):
                sid = (await call(agent, "session.create", {"projectPath": str(root)}))["id"]
                await call(agent, "session.startTurn", {"sessionId": sid, "turnId": f"t{n}"})
                sids.append(sid)
            a, same_project, elsewhere = sids
            options = [{"id": "s", "label": "session", "decision": "allow", "remember": "session"},
                       {"id": "p", "label": "project", "decision": "allow", "remember": "project"},
                       {"id": "g", "label": "global", "decision": "deny", "remember": "global"}]
            rules = {}
            for tool, option in (("Read", "s"), ("Edit", "p"), ("Bash", "g")):
                asked = await call(agent, "approvals.request", {"sessionId": a, "turnId": "t0", "tool": tool,
                                                               "risk": "low", "options": options})
                answered = await call(ui, "approvals.respond", {"sessionId": a, "optionId": option,
                                                               "requestId": asked["request"]["requestId"]})
                rules[tool] = answered["rule"]
            assert {r["scope"] for r in rules.values()} == {"session", "project", "global"}

            async def rule_ids(params: dict[str, Any]) -> set[str]:
                return {r["id"] for r in (await call(ui, "approvals.rules", params))["rules"]}

            every = {r["id"] for r in rules.values()}
            assert await rule_ids({}) == every == await rule_ids({"sessionId": a})
            assert await rule_ids({"sessionId": same_project}) == {rules["Edit"]["id"], rules["Bash"]["id"]}
            assert await rule_ids({"sessionId": elsewhere}) == {rules["Bash"]["id"]}
            assert (await refused(ui, "approvals.rules", {"sessionId": "ghost"}))[0] == "SESSION_NOT_FOUND"

            assert await call(ui, "approvals.removeRule", {"ruleId": "rule-ghost"}) == {"removed": False}
            keyed = {"ruleId": rules["Bash"]["id"], "submissionId": "forget-bash"}
            assert await call(ui, "approvals.removeRule", keyed) == {"removed": True}
            assert await call(ui, "approvals.removeRule", keyed) == {"removed": True}
            code, _ = await refused(ui, "approvals.removeRule", {**keyed, "ruleId": rules["Edit"]["id"]})
            assert code == "IDEMPOTENCY_CONFLICT"
            assert await rule_ids({}) == {rules["Read"]["id"], rules["Edit"]["id"]}
            again = await call(agent, "approvals.request", {"sessionId": elsewhere, "turnId": "t2", "tool": "Bash",
                                                           "risk": "low"})
            assert again["request"]["status"] == "pending"
            assert await call(ui, "approvals.removeRule", {"ruleId": rules["Bash"]["id"]}) == {"removed": False}


# ---------------------------------------------------------------------------------- attachments and plugins

async def test_attachments_estimate_counts_blobs_once_against_the_budget(tmp_path: Path) -> None:
    """attachments.estimate: "Blob usage against the budget; warning above 80 %"; AttachmentsEstimate:
    `budgetBytes` "kv(app, attachmentBudgetBytes), default 200 MB" (the example: 209715200), `warning`
    "True above 80 % of the budget"; attachments.put: "content-addressed under attachments/<sha256>", so the
    same bytes twice are one blob; §8.1: `attachmentBudgetBytes` "integer ≥ 1" (a bad value INVALID_PARAMS,
    nothing written)."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            empty = await call(c, "attachments.estimate")
            assert (empty["usedBytes"], empty["blobs"], empty["warning"]) == (0, 0, False)
            assert empty["budgetBytes"] == 209715200 and empty["percent"] == 0
            blob = {"name": "a.txt", "mimeType": "text/plain", "dataBase64": "MDEyMzQ1Njc="}  # 8 bytes
            first = await call(c, "attachments.put", blob)
            second = await call(c, "attachments.put", {**blob, "name": "b.txt"})
            assert (second["sha256"], second["ref"]) == (first["sha256"], first["ref"])
            used = await call(c, "attachments.estimate")
            assert (used["usedBytes"], used["blobs"]) == (8, 1)
            await call(c, "settings.set", {"key": "attachmentBudgetBytes", "value": 10})
            at_80 = await call(c, "attachments.estimate")
            assert (at_80["budgetBytes"], at_80["percent"], at_80["warning"]) == (10, 80.0, False)
            await call(c, "settings.set", {"key": "attachmentBudgetBytes", "value": 9})
            over = await call(c, "attachments.estimate")
            assert over["budgetBytes"] == 9 and over["percent"] > 80 and over["warning"] is True
            for bad in (0, "10", 10.5, True):
                code, _ = await refused(c, "settings.set", {"key": "attachmentBudgetBytes", "value": bad})
                assert code == "INVALID_PARAMS"
            assert (await call(c, "attachments.estimate"))["budgetBytes"] == 9


async def test_plugins_set_enabled(tmp_path: Path) -> None:
    """plugins.setEnabled: "Enable or disable a registered plugin" (NOT_FOUND: not registered), answering
    the entry (PluginResult); plugins.list shows it; §4: a keyed retry answers the stored entry and the same
    key with `enabled` flipped is IDEMPOTENCY_CONFLICT, changing nothing; plugins.register `enabled`
    "default `true`"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            code, _ = await refused(c, "plugins.setEnabled", {"pluginId": "ghost", "enabled": True})
            assert code == "NOT_FOUND"
            assert (await call(c, "plugins.list"))["plugins"] == []
            entry = (await call(c, "plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1"}))["plugin"]
            assert entry["enabled"] is True
            keyed = {"pluginId": "acme", "enabled": False, "submissionId": "off-1"}
            off = await call(c, "plugins.setEnabled", keyed)
            assert off["plugin"]["enabled"] is False and off["plugin"]["installedAt"] == entry["installedAt"]
            assert await call(c, "plugins.setEnabled", keyed) == off
            code, _ = await refused(c, "plugins.setEnabled", {**keyed, "enabled": True})
            assert code == "IDEMPOTENCY_CONFLICT"
            assert (await call(c, "plugins.list"))["plugins"] == [off["plugin"]]
            on = await call(c, "plugins.setEnabled", {"pluginId": "acme", "enabled": True})
            assert on["plugin"]["enabled"] is True
            await call(c, "plugins.uninstall", {"pluginId": "acme"})
            code, _ = await refused(c, "plugins.setEnabled", {"pluginId": "acme", "enabled": True})
            assert code == "NOT_FOUND"


# ------------------------------------------------------------------------------------ review snapshots (§6)

async def test_review_get_list_and_restore_as_documented(tmp_path: Path) -> None:
    """§6 review.*: "`review.get` reads one snapshot (`includeBefore: true` adds `beforeBase64`)" — default
    `false`, NOT_FOUND for a snapshot the session does not have; "`review.list` lists a session's snapshots
    oldest first (`messageId` keeps one message's)", `limit` default 1000, `truncated` "More snapshots
    matched than limit"; "`review.restore` puts the `before` bytes back (a file the tool created is
    removed), only while the file is exactly what the tool wrote ... Anything else is refused and changes
    nothing: `FILE_CHANGED` (`data.expectedSha256` / `data.actualSha256`) or `CONFLICT` with `data.reason:
    "already_restored"`"; §4: a keyed restore's retry answers what it answered."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            root = tmp_path / "ws"
            root.mkdir()
            sid = (await call(c, "session.create", {"projectPath": str(root)}))["id"]
            (root / "notes.md").write_bytes(b"# Notes\nmore\n")
            edit = await call(c, "review.record", {"sessionId": sid, "path": "notes.md", "toolName": "Edit",
                                                   "beforeBase64": base64.b64encode(b"# Notes\n").decode(),
                                                   "messageId": "m1", "toolCallId": "call-1"})
            (root / "new.txt").write_bytes(b"created")
            made = await call(c, "review.record", {"sessionId": sid, "path": str(root / "new.txt"),
                                                   "toolName": "Write", "beforeBase64": None, "messageId": "m2"})
            edit_id, made_id = edit["snapshot"]["snapshotId"], made["snapshot"]["snapshotId"]

            got = await call(c, "review.get", {"sessionId": sid, "snapshotId": edit_id})
            assert got["snapshot"] == edit["snapshot"] and got.get("beforeBase64") is None
            with_before = await call(c, "review.get", {"sessionId": sid, "snapshotId": edit_id, "includeBefore": True})
            assert base64.b64decode(with_before["beforeBase64"]) == b"# Notes\n"
            code, _ = await refused(c, "review.get", {"sessionId": sid, "snapshotId": "rv-" + "0" * 32})
            assert code == "NOT_FOUND"
            other = (await call(c, "session.create", {"projectPath": str(root)}))["id"]
            assert (await refused(c, "review.get", {"sessionId": other, "snapshotId": edit_id}))[0] == "NOT_FOUND"

            listed = await call(c, "review.list", {"sessionId": sid})
            expected = sorted([edit["snapshot"], made["snapshot"]], key=lambda s: (s["createdAt"], s["snapshotId"]))
            assert [s["snapshotId"] for s in listed["snapshots"]] == [s["snapshotId"] for s in expected]
            assert listed["truncated"] is False
            one = await call(c, "review.list", {"sessionId": sid, "limit": 1})
            assert len(one["snapshots"]) == 1 and one["truncated"] is True
            only_m2 = await call(c, "review.list", {"sessionId": sid, "messageId": "m2"})
            assert [s["snapshotId"] for s in only_m2["snapshots"]] == [made_id]
            assert (await call(c, "review.list", {"sessionId": other}))["snapshots"] == []

            (root / "notes.md").write_bytes(b"# Notes\nedited by hand\n")
            code, data = await refused(c, "review.restore", {"sessionId": sid, "snapshotId": edit_id})
            assert code == "FILE_CHANGED"
            assert data["expectedSha256"] == edit["snapshot"]["after"]["sha256"]
            assert data["actualSha256"] == hashlib.sha256(b"# Notes\nedited by hand\n").hexdigest()
            assert (root / "notes.md").read_bytes() == b"# Notes\nedited by hand\n"
            assert (await call(c, "review.get", {"sessionId": sid, "snapshotId": edit_id}))["snapshot"]["state"] == \
                "recorded"

            keyed = {"sessionId": sid, "snapshotId": made_id, "submissionId": "undo-1"}
            undone = await call(c, "review.restore", keyed)
            assert undone["snapshot"]["state"] == "restored" and undone["snapshot"]["restoredAt"] > 0
            assert not (root / "new.txt").exists()
            assert await call(c, "review.restore", keyed) == undone
            code, data = await refused(c, "review.restore", {"sessionId": sid, "snapshotId": made_id})
            assert code == "CONFLICT" and data.get("reason") == "already_restored"
            code, _ = await refused(c, "review.restore", {**keyed, "snapshotId": edit_id})
            assert code == "IDEMPOTENCY_CONFLICT"
            assert (root / "notes.md").read_bytes() == b"# Notes\nedited by hand\n"


# ------------------------------------------------------------------------- receipts across a SIGKILL (§4)

async def test_keyed_writes_of_the_thin_methods_answer_the_same_after_a_sigkill(tmp_path: Path) -> None:
    """§4: "A retry with the same key returns the stored response and has no other effect. This holds across
    reconnects and host restarts"; "a top-level field is taken in its camelCase spelling, so a retry
    spelling it `session_id` is the same request"; "The same key used for a different request ... fails with
    `IDEMPOTENCY_CONFLICT`" — also after the restart. Each write below is keyed; the host is killed with
    SIGKILL right after the answers and every retry (half of them in snake_case) must answer the same,
    though re-running any of them now would answer otherwise (already deleted, nothing left to mark)."""
    root = data_dir(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    calls: list[tuple[str, dict[str, Any]]] = []
    with trio.fail_after(90):
        async with outsider_host(root, kind="agent", client_id="keyed") as (proc, c):
            sid = (await call(c, "session.create", {"projectPath": str(ws)}))["id"]
            await call(c, "session.startTurn", {"sessionId": sid, "turnId": "t1"})
            asked = await call(c, "approvals.request", {"sessionId": sid, "turnId": "t1", "tool": "Bash",
                                                       "risk": "low", "options": [
                                                           {"id": "g", "decision": "allow", "remember": "global"},
                                                           {"id": "no", "decision": "deny"}]})
            async with open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
                rule = (await call(ui, "approvals.respond", {"sessionId": sid, "optionId": "g",
                                                            "requestId": asked["request"]["requestId"]}))["rule"]
            await call(c, "session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await call(c, "skills.put", {"name": "sk", "version": "1", "source": "s"})
            gid = (await call(c, "projectGroups.save", {"name": "G", "roots": ["/w/g"]}))["group"]["id"]
            await call(c, "tasks.create", {"taskId": "task-1", "title": "T", "prompt": "p"})
            await call(c, "providers.create", {"id": "p1", "name": "P"})
            await call(c, "models.add", {"providerId": "p1", "modelId": "m"})
            await call(c, "plugins.register", {"pluginId": "acme", "name": "A", "version": "1"})
            calls = [
                ("skills.delete", {"name": "sk"}),
                ("projectGroups.delete", {"groupId": gid}),
                ("approvals.removeRule", {"ruleId": rule["id"]}),
                ("notifications.markAllRead", {}),
                ("notifications.clear", {}),
                ("tasks.delete", {"taskId": "task-1"}),
                ("models.remove", {"providerId": "p1", "modelId": "m"}),
                ("providers.reorder", {"providerIds": ["p1", "gone"]}),
                ("plugins.setEnabled", {"pluginId": "acme", "enabled": False}),
                ("session.updateMetadata", {"sessionId": sid, "tags": ["x"]}),
            ]
            answers = [await call(c, m, {**p, "submissionId": f"k-{i}"}) for i, (m, p) in enumerate(calls)]
            assert answers[0]["deleted"] and answers[1]["deleted"] and answers[2]["removed"]
            assert answers[3]["updated"] == 1 and answers[4]["deleted"] == 1 and answers[6]["deleted"]

        async with outsider_host(root, kind="agent", client_id="keyed") as (_, c):
            for i, ((method, params), first) in enumerate(zip(calls, answers, strict=True)):
                spelled = {_snake(k) if i % 2 else k: v for k, v in params.items()}
                assert await call(c, method, {**spelled, "submissionId": f"k-{i}"}) == first, method
                if params:
                    other = {**params, next(iter(params)): "zz-other"} if method != "providers.reorder" else \
                        {"providerIds": ["p1"]}
                    code, _ = await refused(c, method, {**other, "submissionId": f"k-{i}"})
                    assert code == "IDEMPOTENCY_CONFLICT", method
            assert (await call(c, "notifications.markAllRead", {"submissionId": "fresh"}))["updated"] == 0
            assert (await call(c, "skills.delete", {"name": "sk", "submissionId": "fresh-2"}))["deleted"] is False


def _snake(key: str) -> str:
    return "".join(f"_{ch.lower()}" if ch.isupper() else ch for ch in key)



async def test_approval_options_a_sidecar_gives_are_checked_as_the_reference_says(tmp_path: Path) -> None:
    """approvals.request `options`: "Options you give need unique ids and at least one deny option, and
    remember: project needs a session with a project (else INVALID_PARAMS, nothing asked)" — the user can
    always refuse, and no rule is offered for a project the session does not have."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await call(c, "session.create", {}))["id"]
            await call(c, "session.startTurn", {"sessionId": sid, "turnId": "t1"})
            ask = {"sessionId": sid, "turnId": "t1", "tool": "Bash", "risk": "low"}
            deny = {"id": "no", "decision": "deny"}
            for options in ([{"id": "ok", "decision": "allow"}],
                            [{"id": "no", "decision": "allow"}, deny],
                            [{"id": "ok", "decision": "allow", "remember": "project"}, deny]):
                code, _ = await refused(c, "approvals.request", {**ask, "options": options})
                assert code == "INVALID_PARAMS", options
            assert (await call(c, "approvals.pending", {"sessionId": sid}))["pending"] == []
            fine = await call(c, "approvals.request", {**ask, "options": [{"id": "ok", "decision": "allow"}, deny]})
            assert [o["id"] for o in fine["request"]["options"]] == ["ok", "no"]
            default = await call(c, "approvals.request", {**ask, "tool": "Edit"})
            assert [o["id"] for o in default["request"]["options"]] == ["allow_once", "allow_session", "deny"]
    entry = README.read_text(encoding="utf-8").split("### `approvals.request`", 1)[1].split("\n### ", 1)[0]
    [row] = [line for line in entry.splitlines() if line.startswith("| `options`")]
    assert "at least one deny option" in row and "unique ids" in row


# ------------------------------------------------------------------------------ workspace and projects (§8.2)

async def test_workspace_get_and_a_removed_project(tmp_path: Path) -> None:
    """§8.2: "`workspace.open {path}` upserts the project by its canonical path (trimmed, `\\` → `/`, no
    trailing `/`) ... `workspace.get` reads it back ... and it changes nothing"; workspace.open `name`
    "default: the last path component"; WorkspaceResult `project` "Absent when no (existing) project is
    selected"; projects.remove: "Delete a project's sessions (rows and files), its row and project memory;
    never its folder", NOT_FOUND for a project that is not there, a keyed retry answering what it answered;
    projects.pin NOT_FOUND; "The id of a removed project is never issued again"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            assert (await call(c, "workspace.get")).get("project") is None
            folder = tmp_path / "app"
            folder.mkdir()
            (folder / "keep.txt").write_text("mine")
            opened = await call(c, "workspace.open", {"path": f"  {folder}/ "})
            pid = opened["currentProjectId"]
            assert opened["project"]["path"] == str(folder) and opened["project"]["name"] == "app"
            sid = (await call(c, "session.create", {"projectPath": str(folder)}))["id"]
            await call(c, "settings.set", {"ns": "projectMemory", "key": str(folder), "value": "remember"})
            got = await call(c, "workspace.get")
            assert got["currentProjectId"] == pid and got["project"]["sessionCount"] == 1
            assert await call(c, "workspace.get") == got  # reading changes nothing
            assert (await refused(c, "projects.pin", {"projectId": pid + 1000, "pinned": True}))[0] == "NOT_FOUND"
            pinned = await call(c, "projects.pin", {"projectId": pid, "pinned": True})
            assert pinned["project"]["pinned"] is True

            keyed = {"projectId": pid, "submissionId": "rm-project"}
            removed = await call(c, "projects.remove", keyed)
            assert removed == {"projectId": pid, "path": str(folder), "deletedSessions": [sid]}
            assert await call(c, "projects.remove", keyed) == removed
            assert (await refused(c, "projects.remove", {"projectId": pid}))[0] == "NOT_FOUND"
            assert (folder / "keep.txt").read_text() == "mine"
            assert (await refused(c, "session.get", {"sessionId": sid}))[0] == "SESSION_NOT_FOUND"
            assert (await call(c, "settings.get", {"ns": "projectMemory", "key": str(folder)})).get("value") is None
            assert (await call(c, "memories.list"))["memories"] == []
            assert (await call(c, "workspace.get")).get("project") is None
            assert (await call(c, "projects.list"))["projects"] == []
            again = await call(c, "workspace.open", {"path": str(folder)})
            assert again["project"]["id"] != pid and again["project"]["pinned"] is False


async def test_a_plugins_provider_rows_sync_and_are_released_on_uninstall(tmp_path: Path) -> None:
    """providers.sync: "A plugin declares its providers: its rows are upserted, the ones it no longer declares
    deleted" (ProvidersSyncResult `removed`); §8.3: "the user path may not edit or delete them
    (`PERMISSION_DENIED`); a plugin may not touch a user row or another plugin's" (CONFLICT is listed for the
    sync, changing nothing); §8.5: "`plugins.uninstall` ... releases the plugin's provider rows to the user";
    ProvidersChangedEvent "synced by a plugin or released"; a keyed sync's retry answers what it answered."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, ui):
            for pid in ("acme", "other"):
                await call(ui, "plugins.register", {"pluginId": pid, "name": pid, "version": "1"})
            await call(ui, "providers.create", {"id": "user-row", "name": "Mine"})
            await ui.subscribe(["providers.changed"])
            async with open_client(proc.url, proc.token, client_id="acme-c", client_kind="plugin",
                                   plugin_id="acme") as acme, \
                    open_client(proc.url, proc.token, client_id="other-c", client_kind="plugin",
                                plugin_id="other") as other:
                keyed = {"providers": [{"id": "acme-a", "name": "A"}, {"id": "acme-b", "name": "B"}],
                         "submissionId": "sync-1"}
                first = await call(acme, "providers.sync", keyed)
                assert sorted(p["id"] for p in first["providers"]) == ["acme-a", "acme-b"]
                assert all(p["ownerPluginId"] == "acme" for p in first["providers"]) and first["removed"] == []
                assert await call(acme, "providers.sync", keyed) == first
                events = await events_until_quiet(ui)
                assert len(events) == 1 and sorted(events[0].data["providerIds"]) == ["acme-a", "acme-b"]

                for method, params in (("providers.update", {"providerId": "acme-a", "name": "Renamed"}),
                                       ("providers.delete", {"providerId": "acme-a"})):
                    assert (await refused(ui, method, params))[0] == "PERMISSION_DENIED"
                for plugin, taken in ((acme, "user-row"), (other, "acme-a")):
                    code, _ = await refused(plugin, "providers.sync", {"providers": [{"id": taken, "name": "X"}]})
                    assert code in ("CONFLICT", "PERMISSION_DENIED")
                code, _ = await refused(acme, "providers.create", {"id": "acme-c", "name": "C"})
                assert code == "PERMISSION_DENIED"
                listed = {p["id"]: p for p in (await call(ui, "providers.list"))["providers"]}
                assert set(listed) == {"user-row", "acme-a", "acme-b"} and listed["user-row"]["name"] == "Mine"
                assert [p["id"] for p in (await call(acme, "providers.list"))["providers"]] == ["acme-a", "acme-b"]
                assert (await call(other, "providers.list"))["providers"] == []
                await events_until_quiet(ui)

                later = await call(acme, "providers.sync", {"providers": [{"id": "acme-a", "name": "A2"}]})
                assert [p["name"] for p in later["providers"]] == ["A2"] and later["removed"] == ["acme-b"]
            gone = await call(ui, "plugins.uninstall", {"pluginId": "acme"})
            assert gone["providersReleased"] == ["acme-a"]
            released = (await call(ui, "providers.get", {"providerId": "acme-a"}))["provider"]
            assert released.get("ownerPluginId") is None
            assert (await call(ui, "providers.update", {"providerId": "acme-a", "name": "Mine now"}))["provider"][
                "name"] == "Mine now"
            assert any("acme-a" in e.data["providerIds"] or e.data["providerIds"] == []
                       for e in await events_until_quiet(ui))


async def test_projects_remove_announces_the_settings_it_deletes(tmp_path: Path) -> None:
    """§8.1: "After a change the host publishes `settings.changed {ns, keys}`"; projects.remove deletes "its
    row and project memory" (seed 003 §5: "plus the project row and its projectMemory kv entry") and the
    `kv(app, currentProjectId)` pointer to it (workspace.get then has no project): another window showing
    the selected workspace or the memory list learns it from those events, as it does from the
    `settings.changed` of `workspace.open`. A project that is neither current nor has memory changes no kv
    key and announces none."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            quiet = (await call(c, "workspace.open", {"path": "/w/quiet"}))["project"]["id"]
            current = (await call(c, "workspace.open", {"path": "/w/app"}))["project"]["id"]
            await call(c, "settings.set", {"ns": "projectMemory", "key": "/w/app", "value": "remember"})
            async with open_client(proc.url, proc.token, client_id="window-2", client_kind="ui") as other:
                await other.subscribe(["settings.changed"])
                await call(c, "projects.remove", {"projectId": quiet})
                assert await events_until_quiet(other) == []
                await call(c, "projects.remove", {"projectId": current})
                changed = sorted((e.data["ns"], tuple(e.data["keys"])) for e in await events_until_quiet(other))
                assert changed == [("app", ("currentProjectId",)), ("projectMemory", ("/w/app",))]


# ------------------------------------------------------------------------------------------ config sync (§8.7)

async def test_config_sync_apply_announces_every_kind_of_thing_it_merges(tmp_path: Path) -> None:
    """§8.7: `configSync.apply` merges "app settings, user providers *without keys*, display order, user
    models, projects, groups, memory, instructions, skills" in one transaction; §8.1: "After a change the
    host publishes `settings.changed {ns, keys}` ... (an empty `keys` means "reload the namespace")"
    (SettingsChangedEvent lists configSync.* among its writers), §8.6 skills writes "publish
    `settings.changed {ns: "skills", keys}`", ModelsChangedEvent: "The model catalog of a provider
    changed". A window of the applying host must hear of each namespace and each provider catalog the
    bundle wrote, or it keeps showing what the merge replaced."""
    key = base64.b64encode(os.urandom(32)).decode()
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    with trio.fail_after(60):
        async with outsider_host(data_dir(tmp_path / "a")) as (_, a), \
                outsider_host(data_dir(tmp_path / "b")) as (_, b):
            for c in (a, b):
                await call(c, "configSync.configure", {"vaultKey": key})
            await call(a, "providers.create", {"id": "p1", "name": "P", "apiKey": "k-123"})
            await call(a, "models.add", {"providerId": "p1", "modelId": "m1"})
            gid = (await call(a, "projectGroups.save", {"name": "G", "roots": ["/w/g"]}))["group"]["id"]
            await call(a, "projectGroups.setMemory", {"groupId": gid, "memory": "group memory"})
            await call(a, "projectGroups.setInstructions", {"groupId": gid, "instructions": "group rules"})
            await call(a, "skills.put", {"name": "sk", "version": "1", "source": "s"})
            bundle = (await call(a, "configSync.export"))["bundleBase64"]

            await b.subscribe(["settings.changed", "models.changed", "providers.changed"])
            applied = (await call(b, "configSync.apply", {"bundleBase64": bundle}))["applied"]
            assert applied["models"] == 1 and applied["skills"] == 1 and applied["projectGroups"] == 1
            events = await events_until_quiet(b)
            namespaces = {e.data["ns"] for e in events if e.topic == "settings.changed"}
            assert {"projectGroups", "projectGroupMemory", "projectGroupInstructions", "skills"} <= namespaces
            assert {"providerId": "p1"} in [e.data for e in events if e.topic == "models.changed"]
            assert any(e.topic == "providers.changed" for e in events)
            got = await call(b, "projectGroups.get", {"groupId": gid})
            assert got["instructions"] == "group rules" and got["memory"]["content"] == "group memory"
            assert (await call(b, "providers.get", {"providerId": "p1"}))["provider"]["hasApiKey"] is False


# ------------------------------------------------------------------------------------- session.list pages

async def test_a_session_that_moves_ahead_while_a_client_pages_is_announced(tmp_path: Path) -> None:
    """session.list: "Pages follow (updatedAt, id): no session appears on two pages, and one updated while you
    page moves ahead of your cursor (to the first page; the `session.message` event of a new message says so,
    a `session.updated` event any other change), so a UI that pages keeps its list with those events" — an
    append moves its session to the first page and the event a paging UI hears for it is the message's (the
    host sends no `session.updated` per append); a rewrite (`session.replaceMessages`) is a
    `session.updated`."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            for sid in ("s-old", "s-mid", "s-new"):
                await call(c, "session.create", {"sessionId": sid})
                await trio.sleep(0.005)
            await c.subscribe(["session.updated", "session.message"])
            first = await call(c, "session.list", {"limit": 1})
            assert [s["id"] for s in first["sessions"]] == ["s-new"]
            await call(c, "session.appendMessage", {"sessionId": "s-old", "message": msg("m1", "news")})
            heard = [(e.topic, e.session_id) for e in await events_until_quiet(c)]
            assert heard == [("session.message", "s-old")]
            rest = await call(c, "session.list", {"limit": 10, "cursor": first["nextCursor"]})
            assert [s["id"] for s in rest["sessions"]] == ["s-mid"]  # s-old moved ahead of the cursor
            assert [s["id"] for s in (await call(c, "session.list"))["sessions"]] == ["s-old", "s-new", "s-mid"]
            await call(c, "session.replaceMessages", {"sessionId": "s-mid", "messages": [msg("m2", "again")]})
            heard = [(e.topic, e.session_id) for e in await events_until_quiet(c)]
            assert ("session.updated", "s-mid") in heard
            assert [s["id"] for s in (await call(c, "session.list"))["sessions"]][0] == "s-mid"
    entry = README.read_text(encoding="utf-8").split("### `session.list`", 1)[1].split("\n### ", 1)[0]
    assert "the `session.message` event of a new message says so" in entry


async def test_resolve_path_in_a_session_with_and_without_a_project_root(tmp_path: Path) -> None:
    """§8.2: "the sidecar calls `session.resolvePath {sessionId, path}` and gets `root` and `path` resolved
    against it (`.`/`..` folded, `insideRoot` says whether it stays under the root)"; the method lists
    CONFLICT, which its summary explains: "In a session without a project, a relative path is CONFLICT
    (data.reason: no_project_root); an absolute one comes back folded, insideRoot false"."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            bare = (await call(c, "session.create", {}))["id"]
            code, data = await refused(c, "session.resolvePath", {"sessionId": bare, "path": "a.txt"})
            assert code == "CONFLICT" and data.get("reason") == "no_project_root"
            absolute = await call(c, "session.resolvePath", {"sessionId": bare, "path": "/abs/x/../a.txt"})
            assert absolute["path"] == "/abs/a.txt" and absolute["insideRoot"] is False
            assert absolute.get("root") is None
            sid = (await call(c, "session.create", {"projectPath": "/w/p"}))["id"]
            await call(c, "workspace.open", {"path": "/w/elsewhere"})
            inside = await call(c, "session.resolvePath", {"sessionId": sid, "path": "src/./a/../b.py"})
            assert (inside["root"], inside["path"], inside["insideRoot"]) == ("/w/p", "/w/p/src/b.py", True)
            out = await call(c, "session.resolvePath", {"sessionId": sid, "path": "../q"})
            assert (out["path"], out["insideRoot"]) == ("/w/q", False)
            assert (await refused(c, "session.resolvePath", {"sessionId": "ghost", "path": "x"}))[0] == \
                "SESSION_NOT_FOUND"
    entry = README.read_text(encoding="utf-8").split("### `session.resolvePath`", 1)[1].split("\n### ", 1)[0]
    assert "no_project_root" in entry


async def test_config_sync_refusals_name_their_cause_and_change_nothing(tmp_path: Path) -> None:
    """§8.7: "Until `configSync.configure` has given this host a vault key, `configSync.export` and
    `configSync.apply` are `CONFLICT` (`data.reason: "not_configured"`) and write nothing"; "a bundle of a
    format this host does not read (`data.reason: "unsupported"`)" is CORRUPT_DATA; "A bundle whose content
    breaks a rule is refused whole with that rule's own error ... and changes nothing" (the method lists
    CONFLICT, NOT_FOUND and LIMIT_EXCEEDED beside CORRUPT_DATA). The bundles are sealed with this host's
    vault key, read back with `secrets.get` (what the sidecar may do)."""
    from store.config.config_sync import VAULT_KEY_REF, encode_bundle

    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            for method, params in (("configSync.export", {}), ("configSync.apply", {"bundleBase64": "AAAA"})):
                code, data = await refused(c, method, params)
                assert code == "CONFLICT" and data.get("reason") == "not_configured", method
            state = await call(c, "configSync.get")
            assert state["hasVaultKey"] is False and state.get("pending") is None and state.get("base") is None
            await call(c, "configSync.configure", {})
            key = base64.b64decode((await call(c, "secrets.get", {"ref": VAULT_KEY_REF}))["value"])
            before = await call(c, "configSync.get")
            for doc, expected in (
                ({"schema": 1, "providers": [{"id": "p", "name": "P", "config": {"apiKey": "sk-x"}}]},
                 "INVALID_PARAMS"),
                ({"schema": 1, "projects": [{"path": "/p"}], "projectMemory": {"/p": "x" * 40000}},
                 "PAYLOAD_TOO_LARGE"),
                ({"schema": 1, "projects": [{"path": "/p"}], "projectGroupInstructions": {"g-unknown": "t"}},
                 "CONFLICT"),
                ({"schema": 1, "projects": [{"path": "/p"}], "models": [{"providerId": "gone", "modelId": "m"}]},
                 "NOT_FOUND"),
                ({"schema": 99}, "CORRUPT_DATA"),
            ):
                blob = base64.b64encode(encode_bundle(key, doc)).decode()
                code, data = await refused(c, "configSync.apply", {"bundleBase64": blob})
                assert code == expected, doc
                if code == "CORRUPT_DATA":
                    assert data.get("reason") == "unsupported"
            assert (await call(c, "projects.list"))["projects"] == []
            assert (await call(c, "providers.list"))["providers"] == []
            assert await call(c, "configSync.get") == before  # no base.bin kept from a refused apply
    section = README.read_text(encoding="utf-8").split("### 8.7 Config sync", 1)[1].split("\n## ", 1)[0]
    assert "not_configured" in section and "unsupported" in section and "that rule's own error" in section


# ----------------------------------------------------------------------------------------- collaboration (§10)

async def test_collab_cancel_and_queue_remove_end_a_delivery_at_both_ends(tmp_path: Path) -> None:
    """§10: "`collab.cancel` ends a queued or running delivery (its admission goes; the session stays)";
    §5: "`collab.delivery` follows a collaboration delivery (sent once with the target's and once with the
    source's `sessionId`)"; session.queueRemove: "A queued collaboration delivery the entry admitted is
    cancelled with it (collab.delivery to both ends)"; collab.cancel: "A cancelled one is answered as it is,
    changing nothing; one that already ended otherwise is CONFLICT (data.status)", NOT_FOUND for an unknown
    delivery; a keyed cancel's retry answers what it answered."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            source = (await call(c, "session.create", {}))["id"]
            target = (await call(c, "session.create", {}))["id"]

            async def deliver(key: str) -> dict[str, Any]:
                return (await call(c, "collab.deliver", {"pluginId": "team", "sourceSessionId": source,
                                                         "targetSessionId": target, "kind": "task",
                                                         "content": f"do {key}", "idempotencyKey": key}))["delivery"]

            first, second = await deliver("k1"), await deliver("k2")
            entries = (await call(c, "session.queueList", {"sessionId": target}))["entries"]
            admitted = {e.get("sessionMessageId"): e["id"] for e in entries}
            assert {first["id"], second["id"]} <= set(admitted)
            await c.subscribe(["collab.delivery"])

            keyed = {"deliveryId": first["id"], "submissionId": "cancel-1"}
            cancelled = await call(c, "collab.cancel", keyed)
            assert cancelled["delivery"]["status"] == "cancelled"
            assert await call(c, "collab.cancel", keyed) == cancelled
            heard = await events_until_quiet(c)
            assert sorted(e.session_id or "" for e in heard) == sorted([source, target])
            assert all(e.data["delivery"]["id"] == first["id"] for e in heard)
            left = [e["id"] for e in (await call(c, "session.queueList", {"sessionId": target}))["entries"]]
            assert admitted[first["id"]] not in left and admitted[second["id"]] in left
            again = await call(c, "collab.cancel", {"deliveryId": first["id"]})
            assert again["delivery"] == cancelled["delivery"] and await events_until_quiet(c) == []
            assert (await refused(c, "collab.cancel", {"deliveryId": "col-ghost"}))[0] == "NOT_FOUND"

            await call(c, "session.queueRemove", {"sessionId": target, "entryId": admitted[second["id"]]})
            heard = await events_until_quiet(c)
            assert sorted(e.session_id or "" for e in heard) == sorted([source, target])
            got = await call(c, "collab.get", {"deliveryId": second["id"]})
            assert got["status"] == "cancelled"  # collab.get answers the CollabDelivery itself
            assert (await call(c, "session.get", {"sessionId": target}))["session"]["id"] == target
    entry = README.read_text(encoding="utf-8").split("### `collab.cancel`", 1)[1].split("\n### ", 1)[0]
    assert "A cancelled one is answered as it is" in entry


async def test_a_notifications_cursor_survives_new_rows_and_a_restart(tmp_path: Path) -> None:
    """§2 Conventions: "A cursor stays valid across writes and host restarts: items written after it never
    shift a page boundary. A cursor the host can no longer place exactly is `INVALID_CURSOR` ..., never a
    wrong page"; INVALID_CURSOR: "A paging cursor this host did not issue for this list and query (forged,
    foreign or stale)"; notifications.list `limit` "default `50`". Checked on the inbox: a page boundary
    holds after newer notifications and after a SIGKILL + restart, and a forged or foreign cursor is
    refused."""
    root = data_dir(tmp_path)
    with trio.fail_after(90):
        async with outsider_host(root, kind="agent") as (_, c):
            sid = (await call(c, "session.create", {"title": "Inbox"}))["id"]
            for n in range(53):
                await ended_turn(c, sid, f"t{n:02d}", "completed")
            full = await call(c, "notifications.list")
            assert len(full["notifications"]) == 50 and full["nextCursor"]
            assert [n["turnId"] for n in full["notifications"]][:2] == ["t52", "t51"]
            page = await call(c, "notifications.list", {"limit": 3})
            assert [n["turnId"] for n in page["notifications"]] == ["t52", "t51", "t50"]
            cursor = page["nextCursor"]
            await ended_turn(c, sid, "t53", "completed")
            after = await call(c, "notifications.list", {"limit": 3, "cursor": cursor})
            assert [n["turnId"] for n in after["notifications"]] == ["t49", "t48", "t47"]
            code, _ = await refused(c, "notifications.list", {"cursor": "bm90LWEtY3Vyc29y"})
            assert code == "INVALID_CURSOR"
        async with outsider_host(root, kind="agent") as (_, c):
            again = await call(c, "notifications.list", {"limit": 3, "cursor": cursor})
            assert [n["turnId"] for n in again["notifications"]] == ["t49", "t48", "t47"]
            unread = await call(c, "notifications.list", {"unreadOnly": True, "limit": 3})
            code, _ = await refused(c, "notifications.list", {"cursor": unread["nextCursor"]})  # another query's
            assert code == "INVALID_CURSOR"


# ------------------------------------------------------------------------------------- host-wide events (§5)

HOST_WIDE = ("settings.changed", "providers.changed", "models.changed", "task.due", "import.progress")


async def test_host_wide_events_carry_no_session_and_skip_a_session_filter(tmp_path: Path) -> None:
    """§5: "Host-wide topics (`settings.changed`, `providers.changed`, `models.changed`, `task.due`,
    `import.progress`) carry no `sessionId`: a subscription with a `sessionId` does not receive them";
    the README's event examples must show them that way, since a client codes its filter from them."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            sid = (await call(c, "session.create", {}))["id"]
            await c.subscribe(["settings.changed", "providers.changed", "models.changed"])
            async with open_client(proc.url, proc.token, client_id="filtered", client_kind="ui") as filtered:
                await filtered.subscribe(["settings.changed", "providers.changed", "models.changed"],
                                         session_id=sid)
                await call(c, "settings.set", {"ns": "ui", "key": "k", "value": 1})
                await call(c, "providers.create", {"id": "p1", "name": "P"})
                await call(c, "models.add", {"providerId": "p1", "modelId": "m"})
                heard = await events_until_quiet(c)
                assert sorted(e.topic for e in heard) == ["models.changed", "providers.changed", "settings.changed"]
                assert all(e.session_id is None for e in heard)
                assert await events_until_quiet(filtered) == []
    text = README.read_text(encoding="utf-8")
    section = " ".join(text.split("## 5. Events", 1)[1].split("\n## ", 1)[0].split())
    assert "a subscription with a `sessionId` does not receive them" in section
    examples = text.split("Examples (`params` of the notification):", 1)[1].split("## Records", 1)[0]
    for topic in EVENT_PAYLOADS:
        block = examples.split(f"`{topic}`:", 1)[1].split("```json", 1)[1].split("```", 1)[0]
        params = json.loads(block)
        assert ("sessionId" in params) == (topic not in HOST_WIDE), topic


async def test_a_plugin_connection_hears_only_its_own_settings(tmp_path: Path) -> None:
    """§1: a plugin's "connection is scoped to what that plugin owns"; §8.5: "It may call only `settings.*`
    on its own `plugin:<id>` namespace, ... anything else, or another plugin's data, is
    `PERMISSION_DENIED`" (seed 003 §4: plugin imports scope "every plugin read/write to the plugin_id that
    created the row"). Events are reads: a plugin may not follow a user's sessions (`session.message` carries
    the message itself) or another namespace's keys. It may subscribe to `settings.changed` and hears its
    own namespace only; any other topic is `PERMISSION_DENIED` and nothing is subscribed."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, ui):
            await call(ui, "plugins.register", {"pluginId": "acme", "name": "A", "version": "1"})
            async with open_client(proc.url, proc.token, client_id="acme-c", client_kind="plugin",
                                   plugin_id="acme") as plugin:
                for topics in (["session.message"], ["session.created", "settings.changed"], ["providers.changed"],
                               ["approval.requested"], ["import.progress"]):
                    code, _ = await refused(plugin, "events.subscribe", {"topics": topics})
                    assert code == "PERMISSION_DENIED", topics
                own = await call(plugin, "events.subscribe", {"topics": ["settings.changed"]})
                sid = (await call(ui, "session.create", {"title": "private"}))["id"]
                await call(ui, "session.appendMessage", {"sessionId": sid, "message": msg("m1", "private words")})
                await call(ui, "settings.set", {"ns": "app", "key": "largePasteThreshold", "value": 900})
                await call(ui, "settings.set", {"ns": "plugin:other", "key": "token-ref", "value": "x"})
                await call(ui, "settings.set", {"ns": "plugin:acme", "key": "mode", "value": "fast"})
                heard = await events_until_quiet(plugin)
                assert [(e.subscription_id, e.data) for e in heard] == \
                    [(own["subscriptionId"], {"ns": "plugin:acme", "keys": ["mode"]})]
    section = " ".join(README.read_text(encoding="utf-8").split("### 8.5 Plugins", 1)[1].split("###", 1)[0].split())
    assert "`events.subscribe` to `settings.changed` only" in section


# ------------------------------------------------------------------------------------------ list orders

async def test_lists_come_in_their_documented_order(tmp_path: Path) -> None:
    """The order each list result documents: ApprovalsRulesResult "Oldest first (createdAt, then id)";
    ModelsListResult "By providerId, then modelId"; SecretsListResult "By ref"; ApprovalsPendingResult and
    InteractionsPendingResult "newest first"; SkillsListResult "by name"; PluginsListResult "by id";
    ProjectsListResult "Most recently opened first". Each list is written out of its order."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (proc, c), \
                open_client(proc.url, proc.token, client_id="ui", client_kind="ui") as ui:
            for pid in ("pz", "pa"):
                await call(ui, "providers.create", {"id": pid, "name": pid})
            for pid, mid in (("pz", "b"), ("pa", "z"), ("pz", "a"), ("pa", "c")):
                await call(ui, "models.add", {"providerId": pid, "modelId": mid})
            models = [(m["providerId"], m["modelId"]) for m in (await call(ui, "models.list"))["models"]]
            assert models == [("pa", "c"), ("pa", "z"), ("pz", "a"), ("pz", "b")]
            for ref in ("z/one", "a/two", "m/three"):
                await call(c, "secrets.set", {"ref": ref, "value": "v"})
            assert [s["ref"] for s in (await call(ui, "secrets.list"))["secrets"]][:3] == ["a/two", "m/three", "z/one"]
            for name in ("zeta", "alpha", "mid"):
                await call(ui, "skills.put", {"name": name, "version": "1", "source": name})
            assert [s["name"] for s in (await call(ui, "skills.list"))["skills"]] == ["alpha", "mid", "zeta"]
            for pid in ("zz.plugin", "aa.plugin"):
                await call(ui, "plugins.register", {"pluginId": pid, "name": pid, "version": "1"})
            assert [p["id"] for p in (await call(ui, "plugins.list"))["plugins"]] == ["aa.plugin", "zz.plugin"]
            for path in ("/w/first", "/w/second", "/w/first"):
                await call(ui, "workspace.open", {"path": path})
                await trio.sleep(0.005)
            assert [p["path"] for p in (await call(ui, "projects.list"))["projects"]] == ["/w/first", "/w/second"]

            sid = (await call(c, "session.create", {}))["id"]
            await call(c, "session.startTurn", {"sessionId": sid, "turnId": "t1"})
            deny = {"id": "no", "decision": "deny"}
            asked = []
            for tool in ("Edit", "Bash", "Read"):
                options = [{"id": "s", "decision": "allow", "remember": "session"}, deny]
                asked.append((await call(c, "approvals.request", {"sessionId": sid, "turnId": "t1", "tool": tool,
                                                                 "risk": "low", "options": options}))["request"])
                await trio.sleep(0.005)
            pending = [r["requestId"] for r in (await call(ui, "approvals.pending", {"sessionId": sid}))["pending"]]
            assert pending == [r["requestId"] for r in reversed(asked)]
            for request in asked:
                await call(ui, "approvals.respond", {"sessionId": sid, "requestId": request["requestId"],
                                                     "optionId": "s"})
                await trio.sleep(0.005)
            assert [r["tool"] for r in (await call(ui, "approvals.rules", {}))["rules"]] == ["Edit", "Bash", "Read"]
            questions = []
            for text in ("first?", "second?"):
                questions.append((await call(c, "interactions.request", {
                    "sessionId": sid, "turnId": "t1", "question": text, "allowFreeText": True}))["request"])
                await trio.sleep(0.005)
            got = [q["requestId"] for q in (await call(ui, "interactions.pending", {}))["pending"]]
            assert got == [q["requestId"] for q in reversed(questions)]
    records = README.read_text(encoding="utf-8").split("## Records", 1)[1]
    for record, order in (("ApprovalsRulesResult", "Oldest first (createdAt, then id)."),
                          ("ModelsListResult", "By providerId, then modelId."),
                          ("SecretsListResult", "By ref."),
                          ("InteractionsPendingResult", "newest first"),
                          ("PlansPendingResult", "newest first")):
        assert order in records.split(f"### {record}\n", 1)[1].split("\n### ", 1)[0], record


# ------------------------------------------------------------------------------------------------ logs (§5)

async def test_logs_append_lines_bounds_and_sources(tmp_path: Path) -> None:
    """§5 Logs: "the host writes one line `{"ts": <receive time, ms>, "clientId": "...", "record": {...}}`
    per record" to `logs/app/<category>.ndjson`; the result is `{written, bytes, file}`; "a source has at
    most 64 categories (`LIMIT_EXCEEDED` for a new one beyond)"; "A `ui` connection writes `app` only ...
    (`PERMISSION_DENIED`)"; "Files are 0600"; "The call is not a command (no `submissionId`)" — params are
    strict, so one is INVALID_PARAMS."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            records = [{"level": "info", "msg": "é one"}, {"level": "warn", "n": 2}]
            before = dt.datetime.now(dt.UTC).timestamp() * 1000
            got = await call(c, "logs.append", {"source": "app", "category": "ui-events", "records": records})
            assert got["written"] == 2 and got["file"] == "logs/app/ui-events.ndjson"
            path = proc.data_dir / got["file"]
            lines = path.read_bytes().splitlines()
            assert got["bytes"] == sum(len(line) + 1 for line in lines)
            parsed = [json.loads(line) for line in lines]
            assert [p["record"] for p in parsed] == records
            assert all(p["clientId"] == "outsider" and p["ts"] >= before - 1000 for p in parsed)
            assert path.stat().st_mode & 0o777 == 0o600
            code, _ = await refused(c, "logs.append", {"source": "agent", "category": "x", "records": [{}]})
            assert code == "PERMISSION_DENIED"
            code, _ = await refused(c, "logs.append", {"source": "app", "category": "x", "records": [{}],
                                                       "submissionId": "s"})
            assert code == "INVALID_PARAMS"
            batch = [("logs.append", {"source": "app", "category": f"c{i:02d}", "records": [{"i": i}]})
                     for i in range(63)]
            assert not [r for r in await c.batch(batch) if isinstance(r, RpcError)]
            code, _ = await refused(c, "logs.append", {"source": "app", "category": "one-too-many", "records": [{}]})
            assert code == "LIMIT_EXCEEDED"
            assert not (proc.data_dir / "logs" / "app" / "one-too-many.ndjson").exists()
            assert (await call(c, "logs.append", {"source": "app", "category": "c00", "records": [{}]}))["written"] == 1
