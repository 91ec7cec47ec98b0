"""protocol/README.md's limits at their edges, against real ``pi-host serve`` processes: each limit exactly
at its bound (accepted, and a stored value reads back intact, also after a SIGKILL + restart) and one past it
(refused with the documented code, nothing written, the connection still usable). Limits named in characters
are probed with 4-byte emoji (one code point, four UTF-8 bytes, two UTF-16 units); limits named in bytes with
multi-byte text whose character count is under the bound while its UTF-8 size is over it."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any, get_args

import trio

from protocol.models_common import Topic
from runtime.client import HostClient, open_client
from store.config.config_sync import KEY_ID_BYTES, MAGIC
from tests.acceptance.outsiderkit import code_of, error_of, real_host
from tests.hostile.wire import error_code, exchange, raw_connection
from tests.hostkit import msg
from tests.httpkit import FakeProvider, Reply

EMOJI = "\U0001f600"  # one code point, 4 UTF-8 bytes


async def alive(c: HostClient) -> None:
    """The connection still answers after a refusal."""
    assert isinstance((await c.call("session.list", {"limit": 1}))["sessions"], list)


async def refused(c: HostClient, method: str, params: dict[str, Any], code: str = "INVALID_PARAMS") -> None:
    assert await code_of(c, method, params) == code, (method, code)
    await alive(c)


async def summary(c: HostClient, sid: str) -> dict[str, Any]:
    result: dict[str, Any] = (await c.call("session.get", {"sessionId": sid}))["session"]
    return result


# ------------------------------------------------------------------------- receipts and loose references

async def test_submission_id_of_200_emoji_is_a_receipt_key_201_is_refused(tmp_path: Path) -> None:
    """`submissionId`: "Command receipt key (1-200 chars)": 200 code points work as a key (a retry, also after a
    restart, answers the stored response); 201 is INVALID_PARAMS and creates nothing."""
    key = EMOJI * 200
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            first = await c.call("session.create", {"submissionId": key, "title": "keyed"})
            again = await c.call("session.create", {"submissionId": key, "title": "keyed"})
            assert again["id"] == first["id"]
            await refused(c, "session.create", {"submissionId": key + EMOJI, "title": "too long a key"})
            await refused(c, "session.create", {"submissionId": "", "title": "empty key"})
            assert len((await c.call("session.list", {"limit": 500}))["sessions"]) == 1
        async with real_host(tmp_path) as (_, c):
            replay = await c.call("session.create", {"submissionId": key, "title": "keyed"})
            assert replay["id"] == first["id"]
            assert len((await c.call("session.list", {"limit": 500}))["sessions"]) == 1


async def test_provider_and_model_ids_of_200_emoji_are_stored_201_refused(tmp_path: Path) -> None:
    """`providerId` / `modelId`: "Loose reference …: 1-200 chars" on session.create."""
    pid, mid = EMOJI * 200, "\u00e9" * 200
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            sid = (await c.call("session.create", {"providerId": pid, "modelId": mid}))["id"]
            await refused(c, "session.create", {"providerId": pid + "x", "modelId": mid})
            await refused(c, "session.create", {"providerId": pid, "modelId": mid + "x"})
            assert len((await c.call("session.list", {"limit": 500}))["sessions"]) == 1
        async with real_host(tmp_path) as (_, c):
            s = await summary(c, sid)
            assert (s["providerId"], s["modelId"]) == (pid, mid)


# ----------------------------------------------------------------------------------- thread metadata

async def test_thread_metadata_at_its_bounds_survives_a_restart_and_one_past_changes_nothing(tmp_path: Path) -> None:
    """README "Thread metadata": `tags` (at most 32, each 1-64 code points), `folder` (≤ 256), `preset` (≤ 128)."""
    tags = [f"{i:02d}" + EMOJI * 62 for i in range(32)]  # 64 code points each, 250 UTF-8 bytes
    folder, preset = EMOJI * 256, EMOJI * 128
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            out = await c.call("session.updateMetadata",
                               {"sessionId": sid, "tags": tags, "folder": folder, "preset": preset})
            assert (out["thread"]["tags"], out["thread"]["folder"], out["thread"]["preset"]) == (tags, folder, preset)
            await refused(c, "session.updateMetadata", {"sessionId": sid, "tags": [*tags, "extra"]})
            await refused(c, "session.updateMetadata", {"sessionId": sid, "tags": ["x" + EMOJI * 64]})
            await refused(c, "session.updateMetadata", {"sessionId": sid, "folder": folder + "x"})
            await refused(c, "session.updateMetadata", {"sessionId": sid, "preset": preset + "x"})
        async with real_host(tmp_path) as (_, c):
            thread = (await summary(c, sid))["thread"]
            assert (thread["tags"], thread["folder"], thread["preset"]) == (tags, folder, preset)


# ---------------------------------------------------------------------------------------- reads

async def test_list_page_search_query_and_topics_at_and_past_their_bounds(tmp_path: Path) -> None:
    """§7: "`session.list` / `artifacts.list` page | 1–500", "search query | 1–500 characters", "topics per
    subscription | 16"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("session.create", {"title": "hello"})
            assert len((await c.call("session.list", {"limit": 500}))["sessions"]) == 1
            await refused(c, "session.list", {"limit": 501})
            await refused(c, "session.list", {"limit": 0})
            assert (await c.call("artifacts.list", {"limit": 500}))["artifacts"] == []
            await refused(c, "artifacts.list", {"limit": 501})
            await refused(c, "artifacts.list", {"limit": 0})
            await c.call("search.sessions", {"query": EMOJI * 500, "limit": 100})
            await refused(c, "search.sessions", {"query": EMOJI * 501})
            await refused(c, "search.sessions", {"query": "x", "limit": 101})
            assert (await c.call("search.query", {"query": EMOJI * 500}))["results"] == []
            await refused(c, "search.query", {"query": EMOJI * 501})
            topics = list(get_args(Topic))  # the enum the README's `topics` row is generated from
            assert len(topics) >= 17
            await c.call("events.subscribe", {"topics": topics[:16]})
            await refused(c, "events.subscribe", {"topics": topics[:17]})


# ------------------------------------------------------------------------------- notifications

async def test_notification_ids_1000_per_call_1001_refused(tmp_path: Path) -> None:
    """§7: "ids per `notifications.markRead` / `clear` | 1000"."""
    ids = [f"n{i}" for i in range(1000)]
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("notifications.markRead", {"ids": ids})
            await refused(c, "notifications.markRead", {"ids": [*ids, "n1000"]})
            await refused(c, "notifications.markRead", {"ids": []})
            await c.call("notifications.clear", {"ids": ids})
            await refused(c, "notifications.clear", {"ids": [*ids, "n1000"]})


# ------------------------------------------------------------------------------------ settings

async def test_settings_update_takes_100_keys_and_refuses_101_whole(tmp_path: Path) -> None:
    """§7: "keys per `settings.update` | 1–100 (all or none)"."""
    values = {f"k{i}": EMOJI * i for i in range(100)}
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("settings.update", {"ns": "ui", "values": values})
            await refused(c, "settings.update", {"ns": "ui", "values": {**{f"z{i}": i for i in range(101)}}})
            await refused(c, "settings.update", {"ns": "ui", "values": {}})
        async with real_host(tmp_path) as (_, c):
            stored = (await c.call("settings.getAll", {"ns": "ui"}))["values"]
            assert {k: stored.get(k) for k in values} == values
            assert not any(k.startswith("z") for k in stored)


async def test_prompt_template_of_8000_emoji_is_kept_8001_refused(tmp_path: Path) -> None:
    """§8.1: `promptEnhancementUserTemplate` "text of at most 8,000 characters containing `{{draft}}`";
    `promptEnhancement…Id` "an id of at most 200 characters"."""
    template = "{{draft}}" + EMOJI * (8000 - len("{{draft}}"))
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("settings.set", {"key": "promptEnhancementUserTemplate", "value": template})
            await c.call("settings.set", {"key": "promptEnhancementProviderId", "value": EMOJI * 200})
            await refused(c, "settings.set", {"key": "promptEnhancementUserTemplate", "value": template + "x"})
            await refused(c, "settings.set", {"key": "promptEnhancementProviderId", "value": EMOJI * 201})
        async with real_host(tmp_path) as (_, c):
            got = (await c.call("settings.get", {"key": "promptEnhancementUserTemplate"}))["value"]
            assert got == template
            assert (await c.call("settings.get", {"key": "promptEnhancementProviderId"}))["value"] == EMOJI * 200


# ---------------------------------------------------------------------------------------- secrets

async def test_secret_ref_is_bounded_in_utf8_bytes(tmp_path: Path) -> None:
    """`secrets.set` `ref`: "1-512 bytes": 128 emoji (512 bytes) is stored; 129 emoji (129 characters, 516
    bytes) and 511 ASCII + one 2-byte letter (512 characters, 513 bytes) are refused."""
    ref = "p/" + EMOJI * 127 + "xx"  # 2 + 508 + 2 = 512 bytes
    assert len(ref.encode()) == 512
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            await c.call("secrets.set", {"ref": ref, "value": "v" * 65536})
            await refused(c, "secrets.set", {"ref": "p/" + EMOJI * 128, "value": "v"})
            await refused(c, "secrets.set", {"ref": "p" * 511 + "\u00e9", "value": "v"})
            await refused(c, "secrets.set", {"ref": "p/over", "value": "v" * 65537})
        async with real_host(tmp_path, kind="agent") as (_, c):
            assert (await c.call("secrets.get", {"ref": ref}))["value"] == "v" * 65536
            refs = [s["ref"] for s in (await c.call("secrets.list", {}))["secrets"]]
            assert refs == [ref]


# ----------------------------------------------------------------------------------------- skills

async def test_skill_source_is_bounded_in_utf8_bytes(tmp_path: Path) -> None:
    """`skills.put`: `source` "at most 65536 bytes of UTF-8", `name` at most 64 characters, `version` at most
    64, `description` max length 1024."""
    source = EMOJI * 16384  # 65536 bytes
    name = "a" * 64
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("skills.put", {"name": name, "version": "v" * 64, "source": source,
                                        "description": EMOJI * 1024})
            await refused(c, "skills.put", {"name": "b", "version": "1", "source": source + "x"},
                          "PAYLOAD_TOO_LARGE")
            await refused(c, "skills.put", {"name": "a" * 65, "version": "1", "source": "x"})
            await refused(c, "skills.put", {"name": "c", "version": "v" * 65, "source": "x"})
            await refused(c, "skills.put", {"name": "d", "version": "1", "source": "x",
                                            "description": EMOJI * 1025})
        async with real_host(tmp_path) as (_, c):
            got = (await c.call("skills.get", {"name": name}))["skill"]
            assert (got["source"], got["sizeBytes"], got["description"]) == (source, 65536, EMOJI * 1024)
            names = [s["name"] for s in (await c.call("skills.list", {}))["skills"]]
            assert names == [name]


# ------------------------------------------------------------------------------------------- logs

async def test_log_records_100_per_call_16_kib_each(tmp_path: Path) -> None:
    """§ logs: "1 to 100 records, each at most 16 KiB as JSON and together at most 256 KiB
    (`PAYLOAD_TOO_LARGE`, nothing written)"."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            await c.call("logs.append",
                         {"source": "app", "category": "edge", "records": [{"i": i} for i in range(100)]})
            await refused(c, "logs.append", {"source": "app", "category": "edge2",
                                             "records": [{"i": i} for i in range(101)]})
            # {"t":"…"} is 8 bytes of JSON around the text: 16376 bytes of text is exactly 16 KiB.
            at = {"t": EMOJI * 4094}
            over = {"t": EMOJI * 4094 + "x"}
            await c.call("logs.append", {"source": "app", "category": "edge3", "records": [at]})
            await refused(c, "logs.append", {"source": "app", "category": "edge4", "records": [over]},
                          "PAYLOAD_TOO_LARGE")
            logs = proc.data_dir / "logs" / "app"
            assert not (logs / "edge2.ndjson").exists() and not (logs / "edge4.ndjson").exists()


# ------------------------------------------------------------------------------------ messages

async def test_a_message_of_4096_blocks_lands_4097_is_refused(tmp_path: Path) -> None:
    """§7: "blocks per message | 4096"."""
    blocks = [{"type": "text", "text": f"{EMOJI}{i}"} for i in range(4096)]
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage",
                         {"sessionId": sid, "message": {"id": "m1", "role": "user", "blocks": blocks}})
            over = [*blocks, {"type": "text", "text": "one more"}]
            await refused(c, "session.appendMessage",
                          {"sessionId": sid, "message": {"id": "m2", "role": "user", "blocks": over}})
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m3", "after")})
        async with real_host(tmp_path, kind="agent") as (_, c):
            got = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [m["id"] for m in got] == ["m1", "m3"]
            assert got[0]["blocks"] == blocks


# ---------------------------------------------------------------------------------------- paths

async def test_a_path_is_bounded_in_utf8_bytes_per_component_and_whole(tmp_path: Path) -> None:
    """§7: "a path in params | 4096 UTF-8 bytes, 255 per component, no NUL | `INVALID_PARAMS`": a component of
    63 emoji + 3 ASCII (255 bytes) is accepted, one of 64 emoji (64 characters, 256 bytes) refused; a path of
    4096 bytes is accepted, 4097 refused."""
    comp = EMOJI * 63 + "abc"  # 255 bytes
    assert len(comp.encode()) == 255
    whole = "/" + "/".join([comp] * 16)  # 1 + 16 * 256 - 1 = 4096 bytes
    assert len(whole.encode()) == 4096
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            opened = await c.call("workspace.open", {"path": whole})
            await refused(c, "workspace.open", {"path": "/w/" + EMOJI * 64})
            await refused(c, "workspace.open", {"path": whole + "x"})
            await refused(c, "workspace.open", {"path": "/w/a\x00b"})
        async with real_host(tmp_path) as (_, c):
            got = await c.call("workspace.get", {})
            assert got["project"]["path"] == whole
            paths = [p["path"] for p in (await c.call("projects.list", {}))["projects"]]
            assert paths == [whole], opened


# ------------------------------------------------------------------------------- settings namespaces

async def test_a_ui_value_is_bounded_at_64_kib_of_utf8_json(tmp_path: Path) -> None:
    """§8.1: "`ui`: renderer state (values ≤ 64 KiB, ≤ 500 keys)": a string value whose JSON is 65,536 UTF-8
    bytes (16,383 emoji + 2 letters + 2 quotes) is stored; one byte more is PAYLOAD_TOO_LARGE."""
    value = EMOJI * 16383 + "ab"
    assert len(json.dumps(value, ensure_ascii=False).encode()) == 64 * 1024
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("settings.set", {"ns": "ui", "key": "big", "value": value})
            await refused(c, "settings.set", {"ns": "ui", "key": "bigger", "value": value + "c"}, "PAYLOAD_TOO_LARGE")
        async with real_host(tmp_path) as (_, c):
            assert (await c.call("settings.get", {"ns": "ui", "key": "big"}))["value"] == value
            assert "bigger" not in (await c.call("settings.getAll", {"ns": "ui"}))["values"]


async def test_project_memory_is_capped_at_32_kib_of_utf8_content(tmp_path: Path) -> None:
    """§8.2 / seed 003 §4.2: project memory "capped at 32 KiB" of derived content (`PAYLOAD_TOO_LARGE`): 8,192
    emoji (32,768 bytes) are stored, one letter more is refused and the stored memory is unchanged."""
    text = EMOJI * 8192
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("settings.set", {"ns": "projectMemory", "key": "/w/app", "value": text})
            await refused(c, "settings.set", {"ns": "projectMemory", "key": "/w/app", "value": text + "x"},
                          "PAYLOAD_TOO_LARGE")
        async with real_host(tmp_path) as (_, c):
            stored = (await c.call("settings.get", {"ns": "projectMemory", "key": "/w/app"}))["value"]
            assert stored["content"] == text


async def test_group_memory_and_instructions_are_capped_at_32_kib(tmp_path: Path) -> None:
    """§7: "project / group memory, group instructions | 32 KiB of content; 200 entries"."""
    text = EMOJI * 8192
    entries = [{"title": f"e{i}", "content": "x"} for i in range(200)]
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            gid = (await c.call("projectGroups.save", {"name": "G", "roots": ["/w/a"]}))["group"]["id"]
            await c.call("projectGroups.setInstructions", {"groupId": gid, "instructions": text})
            await refused(c, "projectGroups.setInstructions", {"groupId": gid, "instructions": text + "x"},
                          "PAYLOAD_TOO_LARGE")
            await c.call("projectGroups.setMemory", {"groupId": gid, "memory": text})
            await refused(c, "projectGroups.setMemory", {"groupId": gid, "memory": text + "x"},
                          "PAYLOAD_TOO_LARGE")
            memory = {"format": "entries-v1", "entries": entries}
            over = {"format": "entries-v1", "entries": [*entries, {"title": "one more", "content": "x"}]}
            code = await code_of(c, "projectGroups.setMemory", {"groupId": gid, "memory": over})
            assert code == "INVALID_PARAMS", code
            await c.call("projectGroups.setMemory", {"groupId": gid, "memory": memory})
        async with real_host(tmp_path) as (_, c):
            got = await c.call("projectGroups.get", {"groupId": gid})
            assert got["instructions"] == text
            assert [e["title"] for e in got["memory"]["entries"]] == [e["title"] for e in entries]


async def test_recent_models_holds_20_entries(tmp_path: Path) -> None:
    """§8.1: `cache` `recentModels` — "a list of at most 20 distinct `{providerId, modelId}`"."""
    recent = [{"providerId": EMOJI, "modelId": f"m{i}"} for i in range(20)]
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("settings.set", {"ns": "cache", "key": "recentModels", "value": recent})
            over = [*recent, {"providerId": "p", "modelId": "m20"}]
            await refused(c, "settings.set", {"ns": "cache", "key": "recentModels", "value": over})
        async with real_host(tmp_path) as (_, c):
            assert (await c.call("settings.get", {"ns": "cache", "key": "recentModels"}))["value"] == recent


# -------------------------------------------------------------------------------- blobs and plans

async def test_an_attachment_of_4_mib_is_stored_one_byte_more_is_refused(tmp_path: Path) -> None:
    """`attachments.put`: "Standard base64 of at most 4 MiB"; `meta` "at most 4096 bytes as JSON"."""
    data = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    meta = {"t": EMOJI * 1022}  # {"t":"…"}: 8 + 4088 = 4096 bytes of compact UTF-8 JSON
    assert len(json.dumps(meta, ensure_ascii=False, separators=(",", ":")).encode()) == 4096
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            put = await c.call("attachments.put", {"name": EMOJI * 63 + "abc", "mimeType": "application/octet-stream",
                                                   "dataBase64": base64.b64encode(data).decode(), "meta": meta})
            assert (put["size"], put["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
            await refused(c, "attachments.put", {"name": "over", "mimeType": "application/octet-stream",
                                                 "dataBase64": base64.b64encode(data + b"x").decode()},
                          "PAYLOAD_TOO_LARGE")
            code = await code_of(c, "attachments.put", {"name": "m", "mimeType": "text/plain",
                                                        "dataBase64": "eA==", "meta": {"t": EMOJI * 1022 + "x"}})
            assert code == "INVALID_PARAMS", code
            blobs = sorted(p.name for p in (proc.data_dir / "attachments").iterdir() if not p.name.startswith("."))
            assert blobs == [put["sha256"], f"{put['sha256']}.meta"], blobs  # the bytes and their metadata


async def test_plan_markdown_is_bounded_in_utf8_bytes(tmp_path: Path) -> None:
    """`plans.submit` `markdown`: "at most 1,048,576 bytes of UTF-8 (PAYLOAD_TOO_LARGE), so fewer characters when
    some are multi-byte": 262,144 emoji are written byte-for-byte; one letter more is refused, nothing written."""
    ws = tmp_path / "proj"
    ws.mkdir()
    body = EMOJI * 262144
    with trio.fail_after(60):
        async with real_host(tmp_path / "data", kind="agent") as (_, c):
            sid = (await c.call("session.create", {"projectPath": str(ws), "mode": "plan"}))["id"]
            base = {"sessionId": sid, "turnId": "t1", "kind": "plan", "workspaceRoot": str(ws)}
            await refused(c, "plans.submit", {**base, "toolCallId": "c0", "markdown": body + "x"},
                          "PAYLOAD_TOO_LARGE")
            assert not (ws / ".pi").exists() or not any((ws / ".pi").rglob("*.md"))
            req = await c.call("plans.submit", {**base, "toolCallId": "c1", "markdown": body})
            written = (ws / req["artifactPath"]).read_bytes()
            assert written == body.encode() and req["artifactSize"] == 1024 * 1024
        async with real_host(tmp_path / "data", kind="agent") as (_, c):
            assert [p.name for p in (ws / ".pi").rglob("*.md")] == [Path(req["artifactPath"]).name]


# ------------------------------------------------------------------------------ prompts and questions

async def test_permission_prompt_options_and_texts_at_their_bounds(tmp_path: Path) -> None:
    """§7: "permission prompt options | 8"; `approvals.request` `tool` 1-200, `argsSummary` max length 4000,
    an option's `label` max length 500."""
    options = [{"id": f"o{i}", "label": EMOJI * 500, "decision": "allow" if i else "deny"} for i in range(8)]
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            base = {"sessionId": sid, "turnId": "t1", "risk": "low"}
            await refused(c, "approvals.request", {**base, "tool": "T", "options": [
                *options, {"id": "o8", "label": "x", "decision": "allow"}]})
            await refused(c, "approvals.request", {**base, "tool": EMOJI * 201})
            await refused(c, "approvals.request", {**base, "tool": "T", "argsSummary": EMOJI * 4001})
            await refused(c, "approvals.request", {**base, "tool": "T", "options": [
                {"id": "o", "label": EMOJI * 501, "decision": "allow"}]})
            assert (await c.call("approvals.pending", {"sessionId": sid}))["pending"] == []
            asked = (await c.call("approvals.request", {**base, "tool": EMOJI * 200, "argsSummary": EMOJI * 4000,
                                                        "options": options}))["request"]
            pending = (await c.call("approvals.pending", {"sessionId": sid}))["pending"]
            assert [p["requestId"] for p in pending] == [asked["requestId"]]
            got = pending[0]
            assert (got["tool"], got["argsSummary"]) == (EMOJI * 200, EMOJI * 4000)
            assert [(o["id"], o["label"]) for o in got["options"]] == [(o["id"], o["label"]) for o in options]


async def test_question_choices_32_and_answer_text_20000_characters(tmp_path: Path) -> None:
    """§7: "question choices / answer text | 32 / 20,000 characters"; `question` max length 4000. Refused
    answers do not use up the one answer a question takes."""
    choices = [{"id": f"c{i}", "label": EMOJI * 500} for i in range(32)]
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1"})
            base = {"sessionId": sid, "turnId": "t1", "multiple": True, "allowFreeText": True}
            await refused(c, "interactions.request", {**base, "question": "q", "choices": [
                *choices, {"id": "c32", "label": "x"}]})
            await refused(c, "interactions.request", {**base, "question": EMOJI * 4001, "choices": choices})
            asked = (await c.call("interactions.request",
                                  {**base, "question": EMOJI * 4000, "choices": choices}))["request"]
            rid = asked["requestId"]
            async with open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as ui:
                answer = {"sessionId": sid, "requestId": rid}
                await refused(ui, "interactions.respond", {**answer, "answer": {"text": EMOJI * 20001}})
                await refused(ui, "interactions.respond", {**answer, "answer": {
                    "choiceIds": [f"c{i}" for i in range(33)]}})
                ids32 = [f"c{i}" for i in range(32)]
                done = await ui.call("interactions.respond",
                                     {**answer, "answer": {"choiceIds": ids32, "text": EMOJI * 20000}})
                assert done["request"]["answer"] == {"choiceIds": ids32, "text": EMOJI * 20000}
        async with real_host(tmp_path, kind="agent") as (_, c):
            got = await c.call("session.get", {"sessionId": sid})
            assert EMOJI * 20000 in json.dumps(got, ensure_ascii=False)


# ---------------------------------------------------------------------------------- run environment

def _canonical_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode())


def _nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` levels deep (``{}`` is one level)."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"n": value}
    return value


async def test_run_environment_snapshot_of_1_mib_and_depth_32(tmp_path: Path) -> None:
    """§7: "run environment snapshot | 1 MiB of canonical JSON, nesting depth 32": the snapshot as sent, here
    with every field present (a sidecar's full snapshot, so as stored too), sorted keys, compact, UTF-8. A
    snapshot of exactly 1 MiB (the system prompt in emoji) is stored and reads back after a restart, one byte
    more is PAYLOAD_TOO_LARGE; the snapshot object nested 32 levels deep is stored, 33 is INVALID_PARAMS."""
    env: dict[str, Any] = {"version": 1, "connection": {}, "model": {}, "parameters": {}, "systemPrompt": "",
                           "skills": [], "toolSchemas": [], "executionBindings": {}, "permissionPolicy": {},
                           "browserSubmissionContext": {}, "credentialRefs": [], "capabilities": {}}
    pad = 1024 * 1024 - _canonical_size(env)
    env["systemPrompt"] = EMOJI * (pad // 4) + "a" * (pad % 4)
    assert _canonical_size(env) == 1024 * 1024
    deep = {**env, "systemPrompt": "", "parameters": _nested(31)}  # the snapshot is level 1
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            await refused(c, "session.startTurn", {"sessionId": sid, "turnId": "t0",
                                                   "environment": {**env, "systemPrompt": env["systemPrompt"] + "b"}},
                          "PAYLOAD_TOO_LARGE")
            await refused(c, "session.startTurn", {"sessionId": sid, "turnId": "t0",
                                                   "environment": {**deep, "parameters": _nested(32)}})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": env})
            await c.call("session.endTurn", {"sessionId": sid, "turnId": "t1", "status": "completed"})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t2", "environment": deep})
        async with real_host(tmp_path, kind="agent") as (_, c):
            got = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert got["snapshot"]["systemPrompt"] == env["systemPrompt"]
            got = await c.call("session.turnEnvironment", {"turnId": "t2"})
            assert got["snapshot"]["parameters"] == deep["parameters"]
            assert await code_of(c, "session.turnEnvironment", {"turnId": "t0"}) is not None


# ----------------------------------------------------------------------------------- collaboration

async def test_a_callback_projects_2000_characters_of_the_result(tmp_path: Path) -> None:
    """§7: "callback projection 2,000 characters": a result of 2,000 emoji is called back whole; of 2,001 the
    callback holds the first 2,000 and a cut marker, never the 2,001st (characters, not bytes or UTF-16 units);
    the completion reads back the same after a restart."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            src = (await c.call("session.create", {"title": "lead"}))["id"]
            contents: list[str] = []
            for n, turn in ((2000, "t1"), (2001, "t2")):
                tgt = (await c.call("session.create", {"title": f"worker {n}"}))["id"]
                d = (await c.call("collab.deliver", {"pluginId": "team", "sourceSessionId": src, "targetSessionId": tgt,
                                                     "kind": "task", "content": "go", "idempotencyKey": f"k{n}",
                                                     "notifyOnCompletion": True}))["delivery"]
                await c.call("session.startTurn", {"sessionId": tgt, "turnId": turn})
                await c.call("collab.begin", {"sessionId": tgt, "deliveryId": d["id"], "turnId": turn})
                result = EMOJI * (n - 1) + "\u00e9"
                done = await c.call("collab.settle", {"sessionId": tgt, "deliveryId": d["id"], "turnId": turn,
                                                      "status": "completed", "result": result})
                assert done["delivery"]["result"] == result
                contents.append(done["callback"]["content"])
                cb_id = done["callback"]["id"]
            whole, cut = contents
            assert EMOJI * 1999 + "\u00e9" in whole and "more characters" not in whole
            assert EMOJI * 2000 in cut and "\u00e9" not in cut and "1 more character" in cut
        async with real_host(tmp_path, kind="agent") as (_, c):
            assert (await c.call("collab.get", {"deliveryId": cb_id}))["content"] == cut


async def _fill(c: HostClient, ns: str, count: int, prefix: str = "k") -> None:
    for start in range(0, count, 100):
        await c.call("settings.update", {"ns": ns, "values": {
            f"{prefix}{i}": i for i in range(start, min(count, start + 100))}})


async def test_namespace_key_counts_at_their_bounds(tmp_path: Path) -> None:
    """§8.1: `ui` ≤ 500 keys, `cache` ≤ 200, `plugin:<id>` ≤ 256, any other namespace ≤ 1000, the `app` blob
    500 keys (§7): the last key fits, one more is refused and not stored; an existing key can still be
    rewritten at the bound."""
    bounds = {"ui": 500, "cache": 200, "plugin:acme": 256, "mcpServers": 1000, "app": 500}
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            for ns, bound in bounds.items():
                await _fill(c, ns, bound)
                await refused(c, "settings.set", {"ns": ns, "key": "one-more", "value": 1})
                await c.call("settings.set", {"ns": ns, "key": "k0", "value": EMOJI})
        async with real_host(tmp_path) as (_, c):
            for ns, bound in bounds.items():
                stored = (await c.call("settings.getAll", {"ns": ns}))["values"]
                assert "one-more" not in stored, ns
                assert stored["k0"] == EMOJI and all(stored[f"k{i}"] == i for i in range(1, bound)), ns


async def test_namespace_value_sizes_at_their_bounds(tmp_path: Path) -> None:
    """§8.1: `cache` values ≤ 16 KiB, `plugin:<id>` ≤ 64 KiB, any other namespace ≤ 256 KiB, counted on the
    value's UTF-8 JSON: exactly at the bound in emoji is stored, one byte more is PAYLOAD_TOO_LARGE."""
    sizes = {"cache": 16 * 1024, "plugin:acme": 64 * 1024, "mcpServers": 256 * 1024}
    values = {ns: EMOJI * ((size - 2) // 4) + "a" * ((size - 2) % 4) for ns, size in sizes.items()}
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            for ns, value in values.items():
                assert len(json.dumps(value, ensure_ascii=False).encode()) == sizes[ns]
                await c.call("settings.set", {"ns": ns, "key": "v", "value": value})
                await refused(c, "settings.set", {"ns": ns, "key": "w", "value": value + "b"}, "PAYLOAD_TOO_LARGE")
        async with real_host(tmp_path) as (_, c):
            for ns, value in values.items():
                assert (await c.call("settings.getAll", {"ns": ns}))["values"] == {"v": value}, ns


# ------------------------------------------------------------------------------------------- frames

def request(method: str, params: Any, request_id: Any = 1) -> str:
    """A request frame (stdlib json: integers past 64 bits are written as they are)."""
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params},
                      ensure_ascii=False, separators=(",", ":"))


async def test_request_id_of_256_characters_and_integers_of_64_bits(tmp_path: Path) -> None:
    """§ requests: "an `id` (a string of at most 256 characters, or an integer)": 256 emoji are echoed exactly
    (also when the frame spells them as surrogate-pair escapes), 257 is INVALID_REQUEST with `id: null`.
    §7: "integers anywhere in a frame | signed 64-bit | `PARSE_ERROR`": ±(2^63 - 1) and -2^63 are kept exactly
    (as an id and inside a stored message), 2^63 and -2^63 - 1 are PARSE_ERROR and nothing is stored."""
    top, bottom = 2**63 - 1, -(2**63)
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (proc, c):
            sid = (await c.call("session.create", {}))["id"]
            async with raw_connection(proc.url, proc.token) as ws:
                listing = {"limit": 1}
                answer = await exchange(ws, request("session.list", listing, EMOJI * 256))
                assert answer["id"] == EMOJI * 256 and "result" in answer
                escaped = request("session.list", listing, EMOJI * 256).replace(EMOJI, "\\ud83d\\ude00")
                answer = await exchange(ws, escaped)
                assert answer["id"] == EMOJI * 256 and "result" in answer
                answer = await exchange(ws, request("session.list", listing, EMOJI * 257))
                assert answer["id"] is None and error_code(answer) == "INVALID_REQUEST"
                for n in (top, bottom):
                    answer = await exchange(ws, request("session.list", listing, n))
                    assert answer["id"] == n and "result" in answer
                for n in (top + 1, bottom - 1):
                    answer = await exchange(ws, request("session.list", listing, n))
                    assert error_code(answer) == "PARSE_ERROR", answer
                meta = {"top": top, "bottom": bottom, "negTop": -top}
                answer = await exchange(ws, request("session.appendMessage", {
                    "sessionId": sid, "message": {**msg("m1", "ints"), "meta": meta}}))
                assert "result" in answer, answer
                for i, n in enumerate((top + 1, bottom - 1)):
                    answer = await exchange(ws, request("session.appendMessage", {
                        "sessionId": sid, "message": {**msg(f"bad{i}", "ints"), "meta": {"n": n}}}, 7))
                    assert error_code(answer) == "PARSE_ERROR", answer
                answer = await exchange(ws, request("session.list", listing, 8))
                assert answer["id"] == 8 and "result" in answer
        async with real_host(tmp_path, kind="agent") as (_, c):
            rows = (await c.call("session.get", {"sessionId": sid}))["messages"]
            assert [m["id"] for m in rows] == ["m1"]
            assert {k: rows[0]["meta"][k] for k in meta} == meta


# ------------------------------------------------------------------------------- review, providers, logs

async def test_review_snapshots_of_4_mib_files(tmp_path: Path) -> None:
    """§7 / review: "a file (before or after) of at most 4 MiB (`PAYLOAD_TOO_LARGE`)": 4 MiB before and after
    is recorded and its before bytes read back whole after a restart; 4 MiB + 1 either side is refused and
    writes no snapshot."""
    ws = tmp_path / "ws"
    ws.mkdir()
    limit = 4 * 1024 * 1024
    before = bytes(range(256)) * (limit // 256)
    (ws / "at.bin").write_bytes(b"a" * limit)
    (ws / "over.bin").write_bytes(b"a" * (limit + 1))
    data = tmp_path / "data"

    def record(path: str, old: bytes) -> dict[str, Any]:
        return {"sessionId": sid, "path": path, "beforeBase64": base64.b64encode(old).decode(), "toolName": "Edit"}

    with trio.fail_after(60):
        async with real_host(data, kind="agent") as (_, c):
            sid = (await c.call("session.create", {"projectPath": str(ws)}))["id"]
            await refused(c, "review.record", record("at.bin", before + b"x"), "PAYLOAD_TOO_LARGE")
            await refused(c, "review.record", record("over.bin", b"old"), "PAYLOAD_TOO_LARGE")
            snap = (await c.call("review.record", record("at.bin", before)))["snapshot"]
            assert len(list((data / "review-changes" / sid).glob("rv-*"))) == 1
        async with real_host(data, kind="agent") as (_, c):
            got = await c.call("review.get", {"sessionId": sid, "snapshotId": snap["snapshotId"],
                                              "includeBefore": True})
            assert base64.b64decode(got["beforeBase64"]) == before


async def test_provider_config_of_64_kib(tmp_path: Path) -> None:
    """§8.3: "`config` is checked (an object ≤ 64 KiB …)", counted on its UTF-8 JSON: exactly 64 KiB in emoji
    is stored and reads back after a restart; one byte more is PAYLOAD_TOO_LARGE and creates no provider."""
    config = {"note": ""}
    pad = 64 * 1024 - len(json.dumps(config, ensure_ascii=False, separators=(",", ":")).encode())
    config["note"] = EMOJI * (pad // 4) + "a" * (pad % 4)
    assert len(json.dumps(config, ensure_ascii=False, separators=(",", ":")).encode()) == 64 * 1024
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await refused(c, "providers.create", {"id": "over", "name": "over",
                                                  "config": {"note": config["note"] + "b"}}, "PAYLOAD_TOO_LARGE")
            await c.call("providers.create", {"id": "at", "name": EMOJI * 200, "config": config})
        async with real_host(tmp_path) as (_, c):
            listed = (await c.call("providers.list", {}))["providers"]
            assert [p["id"] for p in listed] == ["at"]
            assert listed[0]["config"] == config and listed[0]["name"] == EMOJI * 200


async def test_log_calls_of_256_kib_and_64_categories(tmp_path: Path) -> None:
    """Logs: records "together at most 256 KiB (`PAYLOAD_TOO_LARGE`, nothing written)"; "a source has at most 64
    categories (`LIMIT_EXCEEDED` for a new one beyond)". The 256 KiB count the records' UTF-8 JSON: not the
    characters (4-byte emoji past it are refused) and not the lines the host wraps them in (ASCII records
    that fit are written)."""
    per = {"t": EMOJI * 4094}  # 16,384 bytes of compact JSON each: 16 of them are 256 KiB
    with trio.fail_after(60):
        async with real_host(tmp_path) as (proc, c):
            logs = proc.data_dir / "logs" / "app"
            await refused(c, "logs.append", {"source": "app", "category": "c0", "records": [*[per] * 16, {}]},
                          "PAYLOAD_TOO_LARGE")
            assert not (logs / "c0.ndjson").exists()
            assert (await c.call("logs.append", {"source": "app", "category": "c0",
                                                 "records": [per] * 16}))["written"] == 16
            ascii_per = {"t": "a" * 16376}  # the same 256 KiB in ASCII: the lines written are longer, not the records
            assert (await c.call("logs.append", {"source": "app", "category": "c0",
                                                 "records": [ascii_per] * 16}))["written"] == 16
            for i in range(1, 64):
                await c.call("logs.append", {"source": "app", "category": f"c{i}", "records": [{}]})
            await refused(c, "logs.append", {"source": "app", "category": "c64", "records": [{}]},
                          "LIMIT_EXCEEDED")
            await c.call("logs.append", {"source": "app", "category": "c63", "records": [{"again": True}]})
            assert not (logs / "c64.ndjson").exists()
            assert len((logs / "c0.ndjson").read_text().splitlines()) == 32


# --------------------------------------------------------------------------------- plugins and sync

async def test_plugin_assets_1_mib_each_4_mib_together_64_at_most(tmp_path: Path) -> None:
    """Plugins: "at most 64 assets, 1 MiB each and 4 MiB together" (`PAYLOAD_TOO_LARGE` / `INVALID_PARAMS`
    naming `assets.<i>.<field>`), validated whole before anything is written: a set of four 1 MiB assets is
    installed and reads back after a restart; 1 MiB + 1 (a base64 text the field's length bound lets
    through), 4 MiB + 1 together and a 65th asset change nothing."""
    mib = 1024 * 1024
    text = ("\u00e9" * (mib // 2)).encode()  # 1 MiB of UTF-8 text/plain

    def asset(path: str, data: bytes) -> dict[str, Any]:
        return {"path": path, "mediaType": "text/plain", "dataBase64": base64.b64encode(data).decode()}

    at = [asset(f"a{i}.txt", text) for i in range(4)]
    base = {"pluginId": "acme", "name": "Acme", "version": "1"}
    with trio.fail_after(90):
        async with real_host(tmp_path) as (_, c):
            await refused(c, "plugins.register", {**base, "assets": [asset("big.txt", text + b"a")]},
                          "PAYLOAD_TOO_LARGE")
            await refused(c, "plugins.register", {**base, "assets": [*at, asset("one.txt", b"a")]},
                          "PAYLOAD_TOO_LARGE")
            many = [asset(f"s{i}.txt", b"x") for i in range(65)]
            assert await code_of(c, "plugins.register", {**base, "assets": many}) == "INVALID_PARAMS"
            await c.call("plugins.register", {**base, "assets": [asset(f"s{i}.txt", b"x") for i in range(64)]})
            await c.call("plugins.register", {**base, "assets": at})
        async with real_host(tmp_path) as (_, c):
            listed = (await c.call("plugins.listAssets", {"pluginId": "acme"}))["assets"]
            assert sorted(a["path"] for a in listed) == [f"a{i}.txt" for i in range(4)]
            got = await c.call("plugins.getAsset", {"pluginId": "acme", "path": "a3.txt"})
            assert base64.b64decode(got["asset"]["dataBase64"] if "asset" in got else got["dataBase64"]) == text


async def test_a_config_sync_bundle_is_bounded_at_4_mib(tmp_path: Path) -> None:
    """§7: "config-sync bundle | 4 MiB": a bundle of exactly 4 MiB is read through to its key check (another
    device's key: `foreign_key`); one of 4 MiB + 1 byte is refused before it (`CORRUPT_DATA`, `tampered`: no
    host writes one); neither changes anything and the connection stays usable."""
    limit = 4 * 1024 * 1024
    head = MAGIC + b"\xff" * KEY_ID_BYTES  # a bundle header with another vault key's id

    def bundle(size: int) -> str:
        return base64.b64encode(head + b"\0" * (size - len(head))).decode()

    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("configSync.configure", {})
            before = await c.call("configSync.get", {})
            code, data = await error_of(c, "configSync.apply", {"bundleBase64": bundle(limit)})
            assert (code, data.get("reason")) == ("CORRUPT_DATA", "foreign_key"), (code, data)
            code, data = await error_of(c, "configSync.apply", {"bundleBase64": bundle(limit + 1)})
            assert (code, data.get("reason")) == ("CORRUPT_DATA", "tampered"), (code, data)
            await alive(c)
            assert await c.call("configSync.get", {}) == before


# ------------------------------------------------------------------------------------ transcripts

async def test_replace_messages_takes_100000_messages(tmp_path: Path) -> None:
    """§7: "messages per `session.replaceMessages` | 100 000": the whole set lands and survives a restart;
    100 001 is INVALID_PARAMS and the transcript is unchanged."""
    rows = [{"id": f"m{i}", "role": "user", "blocks": [{"type": "text", "text": "x"}]} for i in range(100_000)]
    with trio.fail_after(90):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            await refused(c, "session.replaceMessages", {"sessionId": sid, "messages": [*rows, {
                "id": "m100000", "role": "user", "blocks": [{"type": "text", "text": "x"}]}]})
            assert (await c.call("session.get", {"sessionId": sid}))["messages"] == []
            await c.call("session.replaceMessages", {"sessionId": sid, "messages": rows})
        async with real_host(tmp_path, kind="agent") as (_, c):
            got = await c.call("session.get", {"sessionId": sid, "messageLimit": 1})
            assert [m["id"] for m in got["messages"]] == ["m99999"]
            assert got["session"]["messageCount"] == 100_000


async def test_window_max_bytes_and_cursor_bounds(tmp_path: Path) -> None:
    """`session.get` `maxBytes`: "default and maximum 16 MiB"; a `cursor` is 1-512 characters."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            sid = (await c.call("session.create", {}))["id"]
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg("m1", EMOJI)})
            got = await c.call("session.get", {"sessionId": sid, "maxBytes": 16 * 1024 * 1024})
            assert [m["id"] for m in got["messages"]] == ["m1"]
            await refused(c, "session.get", {"sessionId": sid, "maxBytes": 16 * 1024 * 1024 + 1})
            assert await code_of(c, "session.list", {"cursor": "c" * 512}) == "INVALID_CURSOR"  # read, not its length
            await refused(c, "session.list", {"cursor": "c" * 513})


async def test_an_inflight_preview_carries_32768_characters_per_block(tmp_path: Path) -> None:
    """§7 / events: "`session.inflight` previews | … 32,768 characters per block"; "Each block's text is capped
    at 32,768 characters; `session.get` has the whole reply": 32,768 emoji arrive whole, 32,769 arrive as the
    first 32,768 (cut on a character, marked truncated) while `session.get` returns them all."""
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            await c.call("events.subscribe", {"topics": ["session.inflight"]})
            for n in (32768, 32769):
                sid = (await c.call("session.create", {}))["id"]
                await c.call("session.startTurn", {"sessionId": sid, "turnId": f"t{n}"})
                reply = {"id": "a1", "role": "assistant", "turnId": f"t{n}",
                         "blocks": [{"type": "text", "text": EMOJI * n}]}
                await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": f"t{n}", "message": reply})
                while True:
                    event = await c.next_event()
                    if event.topic == "session.inflight" and event.data.get("sessionId") == sid:
                        break
                block = event.data["message"]["blocks"][0]
                assert block["text"] == EMOJI * min(n, 32768)
                assert bool(block.get("truncated")) is (n > 32768)
                whole = (await c.call("session.get", {"sessionId": sid}))["inflight"]["message"]
                assert whole["blocks"][0]["text"] == EMOJI * n


# ------------------------------------------------------------------------------ trimming and counts

async def test_trimmed_limits_count_after_trimming(tmp_path: Path) -> None:
    """§7 "session title | 1–80 characters after trimming" and thread metadata "`tags` (… each 1-64 code
    points, trimmed …)": 80 / 64 emoji with whitespace around are accepted and stored trimmed; whitespace
    alone is refused; a title of 320 characters (its field's length) that trims to 80 is accepted."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            sid = (await c.call("session.create", {"title": "  " + EMOJI * 80 + "\t"}))["id"]
            assert (await summary(c, sid))["title"] == EMOJI * 80
            padded = " " * 120 + EMOJI * 80 + " " * 120
            assert (await c.call("session.rename", {"sessionId": sid, "title": padded}))["title"] == EMOJI * 80
            await refused(c, "session.rename", {"sessionId": sid, "title": " " + EMOJI * 81 + " "})
            await refused(c, "session.rename", {"sessionId": sid, "title": "   "})
            tag = EMOJI * 64
            out = await c.call("session.updateMetadata", {"sessionId": sid, "tags": [f" {tag} ", "\u00e9" * 64]})
            assert out["thread"]["tags"] == [tag, "\u00e9" * 64]
            await refused(c, "session.updateMetadata", {"sessionId": sid, "tags": [" " + EMOJI * 65 + " "]})
        async with real_host(tmp_path) as (_, c):
            s = await summary(c, sid)
            assert (s["title"], s["thread"]["tags"]) == (EMOJI * 80, [tag, "\u00e9" * 64])


async def test_list_fields_at_their_item_counts(tmp_path: Path) -> None:
    """Item counts of the field tables: `projectGroups.save` `roots` (max items 64), a run environment's
    `credentialRefs` (max items 64), `tasks.create` `weekdays` (1-7), `networkProxy.bypass` (≤ 64 host
    patterns, §8.1): the bound is accepted, one more is INVALID_PARAMS and writes nothing."""
    roots = [f"/w/{EMOJI}{i}" for i in range(64)]
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="agent") as (_, c):
            await refused(c, "projectGroups.save", {"name": "G", "roots": [*roots, "/w/x"]})
            gid = (await c.call("projectGroups.save", {"name": "G", "roots": roots}))["group"]["id"]
            sid = (await c.call("session.create", {}))["id"]
            env = {"version": 1, "credentialRefs": [f"secret:r{i}" for i in range(64)]}
            await refused(c, "session.startTurn", {"sessionId": sid, "turnId": "t0", "environment": {
                **env, "credentialRefs": [*env["credentialRefs"], "secret:r64"]}})
            await c.call("session.startTurn", {"sessionId": sid, "turnId": "t1", "environment": env})
            task = {"title": EMOJI * 200, "prompt": "p", "cadence": "weekly", "weekdays": [0, 1, 2, 3, 4, 5, 6],
                    "schedule": {"hour": 9, "minute": 0}}
            await refused(c, "tasks.create", {**task, "weekdays": [0, 1, 2, 3, 4, 5, 6, 0]})
            await refused(c, "tasks.create", {**task, "title": EMOJI * 201})
            created = await c.call("tasks.create", task)
            proxy = {"mode": "manual", "url": "http://proxy.local:3128", "bypass": [f"h{i}.local" for i in range(64)]}
            await c.call("settings.set", {"key": "networkProxy", "value": proxy})
            await refused(c, "settings.set", {"key": "networkProxy", "value": {
                **proxy, "bypass": [*proxy["bypass"], "h64.local"]}})
        async with real_host(tmp_path, kind="agent") as (_, c):
            assert (await c.call("projectGroups.get", {"groupId": gid}))["group"]["roots"] == roots
            got = await c.call("session.turnEnvironment", {"turnId": "t1"})
            assert got["snapshot"]["credentialRefs"] == env["credentialRefs"]
            assert (await c.call("settings.get", {"key": "networkProxy"}))["value"]["bypass"] == proxy["bypass"]
            assert [t["title"] for t in (await c.call("tasks.list", {}))["tasks"]] == [EMOJI * 200], created


async def test_a_host_keeps_1000_providers(tmp_path: Path) -> None:
    """§7: "providers / models per provider | 1000 / 5000": 999 a plugin declares plus one of the user's make
    1000; another is LIMIT_EXCEEDED and not created; a declaration of 1001 is INVALID_PARAMS."""
    declared = [{"id": f"acme-{i}", "name": f"{EMOJI} {i}"} for i in range(999)]
    with trio.fail_after(60):
        async with real_host(tmp_path, kind="plugin", plugin_id="acme") as (proc, plugin):
            await refused(plugin, "providers.sync", {"providers": [*declared, *[
                {"id": f"acme-x{i}", "name": "x"} for i in range(2)]]})
            await plugin.call("providers.sync", {"providers": declared})
            async with open_client(proc.url, proc.token, client_id="ui-1", client_kind="ui") as ui:
                await ui.call("providers.create", {"id": "mine", "name": "Mine"})
                await refused(ui, "providers.create", {"id": "one-more", "name": "One more"}, "LIMIT_EXCEEDED")
        async with real_host(tmp_path) as (_, c):
            ids = {p["id"] for p in (await c.call("providers.list", {}))["providers"]}
            assert len(ids) == 1000 and "mine" in ids and "one-more" not in ids


async def test_a_provider_keeps_5000_models(tmp_path: Path) -> None:
    """§7: "providers / models per provider | 1000 / 5000": a provider listing 5000 models is refreshed
    whole; a 5001st (added by hand) is LIMIT_EXCEEDED; a listing of 5001 is PROVIDER_BAD_REPLY (§8.4: "more than
    5,000 models") and changes nothing."""
    models = [{"id": f"m-{i}", "object": "model"} for i in range(5000)]
    with trio.fail_after(90), FakeProvider(Reply(models=models)) as server:
        async with real_host(tmp_path) as (_, c):
            await c.call("providers.create", {"id": "local", "name": "Local", "baseUrl": server.base_url})
            assert (await c.call("models.refresh", {"providerId": "local"}))["listed"] == 5000
            await refused(c, "models.add", {"providerId": "local", "modelId": "by-hand"}, "LIMIT_EXCEEDED")
            server.reply = Reply(models=[*models, {"id": "m-5000", "object": "model"}])
            await refused(c, "models.refresh", {"providerId": "local"}, "PROVIDER_BAD_REPLY")
        async with real_host(tmp_path) as (_, c):
            ids = {m["modelId"] for m in (await c.call("models.list", {"providerId": "local"}))["models"]}
            assert ids == {m["id"] for m in models}


async def test_project_memory_is_keyed_by_any_project_path(tmp_path: Path) -> None:
    """Seed 003 §4.2: project memory is "independent for every project path" (kv key = the canonical path),
    and §7 lets a path in params be 4096 UTF-8 bytes: a project at a 4096-byte path gets its memory (set,
    read after a restart, deleted); other namespaces keep keys of 1-512 characters."""
    deep = ("/" + "a" * 255) * 16  # 16 components of 255 bytes: 4096 bytes
    assert len(deep.encode()) == 4096
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            await c.call("workspace.open", {"path": deep})
            await c.call("settings.set", {"ns": "projectMemory", "key": deep, "value": "first"})
            await c.call("settings.update", {"ns": "projectMemory", "values": {deep: "remember " + EMOJI}})
            await refused(c, "settings.set", {"ns": "ui", "key": "k" * 513, "value": 1})
            await refused(c, "settings.get", {"ns": "ui", "key": "k" * 513})
            await c.call("settings.set", {"ns": "ui", "key": "k" * 512, "value": 1})
        async with real_host(tmp_path) as (_, c):
            got = (await c.call("settings.get", {"ns": "projectMemory", "key": deep}))["value"]
            assert got["content"] == "remember " + EMOJI
            assert (await c.call("settings.delete", {"ns": "projectMemory", "key": deep}))["deleted"] is True
            assert "value" not in await c.call("settings.get", {"ns": "projectMemory", "key": deep})


async def test_a_connection_holds_64_subscriptions(tmp_path: Path) -> None:
    """§7: "subscriptions per connection | 64 (`LIMIT_EXCEEDED`)": the 64th is accepted, the 65th refused
    (the connection stays usable); after an `events.unsubscribe` there is room for one again."""
    with trio.fail_after(60):
        async with real_host(tmp_path) as (_, c):
            subs = [(await c.call("events.subscribe", {"topics": ["session.created"]}))["subscriptionId"]
                    for _ in range(64)]
            assert len(set(subs)) == 64
            await refused(c, "events.subscribe", {"topics": ["session.created"]}, "LIMIT_EXCEEDED")
            await c.call("events.unsubscribe", {"subscriptionId": subs[0]})
            await c.call("events.subscribe", {"topics": ["session.created"]})
            await refused(c, "events.subscribe", {"topics": ["session.created"]}, "LIMIT_EXCEEDED")
