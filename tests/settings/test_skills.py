"""Skills and the memory listing (seed 000 §2: "skills, memories | Skill source and agent memory data").

Seed 003 §9: "new config domain (MCP servers, memories) | kv namespace | no [migration]": skills are
``kv(skills, <name>)``, host-owned; memories are the project / group memory that already exists
(``settings.*`` / ``projectGroups.setMemory``), listed by ``memories.list``.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store import skills
from store.errors import KV_REPAIR, Conflict, DamagedRecord, InvalidInput, LimitExceeded, PayloadTooLarge
from store.rules import MAX_SKILL_SOURCE_BYTES, MAX_SKILLS
from tests.dbkit import NOW, tx
from tests.hostkit import client_for, inprocess_host

SOURCE = "---\nname: release-notes\ndescription: Draft release notes\n---\n\nRead the changelog, then write.\n"


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def test_skills_crud_over_the_wire_is_durable_and_sends_no_source_in_lists(tmp_path: Path) -> None:
    """Seed 000 §2: "skills [...] | Skill source and agent memory data". A skill (name, version, source)
    is stored, read back whole by ``skills.get``, listed without its source (name, version, digest,
    size), survives a restart, and is removed by ``skills.delete``; a retry with the same submissionId
    replays its receipt."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            put = await c.call("skills.put", {"name": "release-notes", "version": "1.0.0", "source": SOURCE,
                                              "description": "Draft release notes", "origin": "~/.pi/skills",
                                              "submissionId": "s1"})
            assert put["changed"] is True and "source" not in put["skill"]
            assert put["skill"]["sizeBytes"] == len(SOURCE.encode()) and len(put["skill"]["sha256"]) == 64
            again = await c.call("skills.put", {"name": "release-notes", "version": "1.0.0", "source": SOURCE,
                                                "description": "Draft release notes", "origin": "~/.pi/skills",
                                                "submissionId": "s1"})
            assert again == put  # the receipt's stored answer
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            got = (await c.call("skills.get", {"name": "release-notes"}))["skill"]
            assert got["source"] == SOURCE and got["version"] == "1.0.0" and got["origin"] == "~/.pi/skills"
            listed = (await c.call("skills.list", {}))["skills"]
            assert [s["name"] for s in listed] == ["release-notes"] and "source" not in listed[0]
            assert listed[0]["sha256"] == got["sha256"]
            assert (await c.call("skills.delete", {"name": "release-notes"}))["deleted"] is True
            assert (await c.call("skills.delete", {"name": "release-notes"}))["deleted"] is False
            assert (await _err(c.call("skills.get", {"name": "release-notes"}))).data_code == "NOT_FOUND"
            assert (await c.call("skills.list", {}))["skills"] == []


async def test_skills_bad_input_is_refused_with_the_field_named_and_nothing_written(tmp_path: Path) -> None:
    """Seed 000 §2 ("Skill source") bounded like every config domain (seed 003 §9): a bad name, version or
    an oversized source gets a clear error naming the field and stores nothing; ``settings.set`` cannot
    write ``kv(skills)`` behind the skills methods' rules."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for params, field in (({"name": "Bad Name", "version": "1", "source": "x"}, "name"),
                                  ({"name": "ok", "version": "../1", "source": "x"}, "version"),
                                  ({"name": "ok", "version": "1", "source": ""}, "source")):
                err = await _err(c.call("skills.put", params))
                assert err.data_code == "INVALID_PARAMS" and err.data["errors"][0]["loc"] == field
            big = "x" * (MAX_SKILL_SOURCE_BYTES // 2 + 1)
            err = await _err(c.call("skills.put", {"name": "ok", "version": "1", "source": "é" * len(big)}))
            assert (err.data_code, err.data["field"]) == ("PAYLOAD_TOO_LARGE", "source")
            err = await _err(c.call("settings.set", {"ns": "skills", "key": "ok", "value": {"source": "x"}}))
            assert err.data_code == "INVALID_PARAMS" and err.data["owner"] == "skills.put / skills.delete"
            assert (await c.call("skills.list", {}))["skills"] == []


def test_a_skill_version_names_one_source(conn: sqlite3.Connection) -> None:
    """Seed 000 §4: the run environment snapshot "fixes [...] Skill content": a name and version identify one
    source, so a put of the same version with other source is CONFLICT (bump the version) and changes
    nothing; the same put again writes nothing (updatedAt kept); a new version replaces it."""
    first, changed = tx(conn)(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW))
    assert changed
    with pytest.raises(Conflict):
        tx(conn)(lambda c: skills.put_skill(c, name="a", version="1", source="two", now_ms=NOW + 1))
    same, changed = tx(conn)(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW + 2))
    assert not changed and same["updatedAt"] == NOW
    bumped, changed = tx(conn)(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 3))
    assert changed and bumped["createdAt"] == NOW and bumped["updatedAt"] == NOW + 3
    assert skills.get_skill(conn, "a") == bumped


def test_a_stored_name_at_version_keeps_its_source_after_newer_versions_and_a_delete(
        conn: sqlite3.Connection) -> None:
    """Audit: kv(skills, <name>) holds only the current version, so once 2 was put, a put of 1 with other
    source was taken: what a run recorded as a@1 changed under it. Every name@version ever stored keeps its
    digest (kv(skillVersions), also after skills.delete): other source is CONFLICT and changes nothing; the
    same source is accepted (that version becomes current again)."""
    put = tx(conn)
    put(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW))
    put(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 1))
    before = conn.execute("SELECT * FROM kv ORDER BY ns, key").fetchall()
    with pytest.raises(Conflict) as info:
        put(lambda c: skills.put_skill(c, name="a", version="1", source="forged", now_ms=NOW + 2))
    assert info.value.data["version"] == "1" and info.value.data["sha256"] == hashlib.sha256(b"one").hexdigest()
    assert conn.execute("SELECT * FROM kv ORDER BY ns, key").fetchall() == before
    back, changed = put(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW + 3))
    assert changed and back["version"] == "1" and skills.get_skill(conn, "a") == back
    again, changed = put(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW + 4))
    assert not changed and again == back
    with pytest.raises(Conflict):  # the newer one is kept too
        put(lambda c: skills.put_skill(c, name="a", version="2", source="other", now_ms=NOW + 5))
    assert put(lambda c: skills.delete_skill(c, "a", now_ms=NOW + 5))
    with pytest.raises(Conflict):  # a delete frees the name, not what its versions were
        put(lambda c: skills.put_skill(c, name="a", version="2", source="other", now_ms=NOW + 6))
    fresh, changed = put(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 7))
    assert changed and fresh["createdAt"] == NOW + 7 and skills.list_skills(conn).items[0]["version"] == "2"


def test_a_skill_stored_before_versions_were_kept_is_held_to_its_source(conn: sqlite3.Connection) -> None:
    """A skill an older build stored has no kv(skillVersions) row: its current version still names its source,
    and replacing it by a newer version keeps that digest."""
    put = tx(conn)
    put(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW))
    put(lambda c: c.execute("DELETE FROM kv WHERE ns = 'skillVersions'"))
    with pytest.raises(Conflict):
        put(lambda c: skills.put_skill(c, name="a", version="1", source="forged", now_ms=NOW + 1))
    put(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 2))
    with pytest.raises(Conflict):
        put(lambda c: skills.put_skill(c, name="a", version="1", source="forged", now_ms=NOW + 3))


@pytest.mark.parametrize("stored", ['{"sha2', '["ab"]', '{"sizeBytes": 3}'])
def test_a_damaged_version_digest_refuses_a_put_of_that_version_naming_its_row(conn: sqlite3.Connection,
                                                                               stored: str) -> None:
    """Before, a kv(skillVersions) record that no longer read as {sha256: text} was skipped: a put of that
    name@version with any source was taken, and the damaged record (never written over) left it open for good."""
    put = tx(conn)
    put(lambda c: skills.put_skill(c, name="a", version="1", source="one", now_ms=NOW))
    put(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 1))
    put(lambda c: c.execute("UPDATE kv SET value_json = ? WHERE ns = 'skillVersions' AND key = 'a@1'", (stored,)))
    before = conn.execute("SELECT * FROM kv ORDER BY ns, key").fetchall()
    with pytest.raises(DamagedRecord) as info:
        put(lambda c: skills.put_skill(c, name="a", version="1", source="forged", now_ms=NOW + 2))
    assert info.value.data == {"ns": "skillVersions", "key": "a@1", "repair": KV_REPAIR}
    assert conn.execute("SELECT * FROM kv ORDER BY ns, key").fetchall() == before
    same, changed = put(lambda c: skills.put_skill(c, name="a", version="2", source="two", now_ms=NOW + 3))
    assert not changed and same["version"] == "2"  # the other versions are not held up


async def test_skills_put_of_an_older_version_with_other_source_is_conflict_on_the_wire(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            await c.call("skills.put", {"name": "notes", "version": "1.0.0", "source": "one"})
            await c.call("skills.put", {"name": "notes", "version": "1.1.0", "source": "two"})
            err = await _err(c.call("skills.put", {"name": "notes", "version": "1.0.0", "source": "forged"}))
            assert err.data_code == "CONFLICT" and err.data["version"] == "1.0.0"
            assert (await c.call("skills.get", {"name": "notes"}))["skill"]["source"] == "two"
            err = await _err(c.call("settings.set", {"ns": "skillVersions", "key": "notes@1.0.0", "value": {}}))
            assert err.data_code == "INVALID_PARAMS" and err.data["owner"] == "skills.put / skills.delete"


def test_skill_count_and_text_bounds(conn: sqlite3.Connection) -> None:
    """Seed 000 §2 skills, bounded (store/rules.py): at most MAX_SKILLS skills (LIMIT_EXCEEDED, an update of an
    existing one still works), a source of at most MAX_SKILL_SOURCE_BYTES of UTF-8, no NUL characters."""
    for i in range(MAX_SKILLS):
        tx(conn)(lambda c, i=i: skills.put_skill(c, name=f"s{i}", version="1", source="x", now_ms=NOW))
    with pytest.raises(LimitExceeded):
        tx(conn)(lambda c: skills.put_skill(c, name="one-more", version="1", source="x", now_ms=NOW))
    tx(conn)(lambda c: skills.put_skill(c, name="s0", version="2", source="y", now_ms=NOW))
    assert len(skills.list_skills(conn).items) == MAX_SKILLS
    with pytest.raises(PayloadTooLarge):
        skills.put_skill(conn, name="s1", version="3", source="x" * (MAX_SKILL_SOURCE_BYTES + 1), now_ms=NOW)
    with pytest.raises(InvalidInput):
        skills.put_skill(conn, name="s1", version="3", source="a\x00b", now_ms=NOW)


async def test_memories_list_pages_project_and_group_memory(tmp_path: Path) -> None:
    """Seed 000 §2: "memories | [...] agent memory data"; seed 003 §4.2 project memory "independent for every
    project path". ``memories.list`` lists what ``settings.set(projectMemory)`` and
    ``projectGroups.setMemory`` stored (key, entry count, size), in pages, never the content."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for path in ("/p/a", "/p/b", "/p/c"):
                await c.call("settings.set", {"ns": "projectMemory", "key": path + "/", "value": f"memo {path}"})
            first = await c.call("memories.list", {"limit": 2})
            assert [(m["key"], m["entries"]) for m in first["memories"]] == [("/p/a", 1), ("/p/b", 1)]
            assert first["memories"][0]["contentBytes"] == len("memo /p/a") and first["nextAfter"] == "/p/b"
            rest = await c.call("memories.list", {"limit": 2, "after": first["nextAfter"]})
            assert [m["key"] for m in rest["memories"]] == ["/p/c"] and "nextAfter" not in rest
            group = (await c.call("projectGroups.save", {"name": "G", "roots": [str(tmp_path)]}))["group"]
            await c.call("projectGroups.setMemory", {"groupId": group["id"], "memory": "shared"})
            groups = await c.call("memories.list", {"scope": "group"})
            assert [(m["scope"], m["key"], m["entries"]) for m in groups["memories"]] == [("group", group["id"], 1)]
            await c.call("settings.delete", {"ns": "projectMemory", "key": "/p/b"})
            assert [m["key"] for m in (await c.call("memories.list", {}))["memories"]] == ["/p/a", "/p/c"]
