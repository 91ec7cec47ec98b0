"""Every settings rule of seed 003 §4.1 / §7, on a real schema database.

Each rule: the valid value, each boundary, each kind of bad value. A refusal
is ``INVALID_PARAMS`` (or ``PAYLOAD_TOO_LARGE`` for a size cap) naming the
field, and every row of ``kv`` is byte-identical afterwards. Writes go through
exactly what the ``settings.*`` handlers run (``read_for_write`` →
``plan_write`` → ``apply_plan`` in one transaction).
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson
import pytest

from store.config import settings
from store.config.settings_rules import DELETE, KvPlan, app_view, plan_write
from store.errors import DamagedRecord, InvalidInput, PayloadTooLarge
from store.project_memory import memory_view
from tests.dbkit import NOW, tx

PLATFORM = "linux"


def write(conn: sqlite3.Connection, ns: str, changes: dict[str, Any], now: int = NOW) -> KvPlan:
    def op(c: sqlite3.Connection) -> KvPlan:
        current, count = settings.read_for_write(c, ns, changes)
        plan = plan_write(ns, current, changes, existing_keys=count, now_ms=now, platform=PLATFORM)
        settings.apply_plan(c, plan, now)
        return plan

    return tx(conn)(op)


def dump(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT ns, key, value_json, updated_at FROM kv ORDER BY ns, key").fetchall()


def blob(conn: sqlite3.Connection) -> dict[str, Any]:
    found = settings.get_value(conn, "app", "settings")
    return found[0] if found else {}


def read(conn: sqlite3.Connection, key: str) -> Any:
    found = settings.get_value(conn, "app", "settings")
    return app_view(found[0] if found else None, PLATFORM).get(key)


def refused(conn: sqlite3.Connection, ns: str, changes: dict[str, Any], field: str,
            error: type[Exception] = InvalidInput) -> InvalidInput:
    before = dump(conn)
    with pytest.raises(error) as exc:
        write(conn, ns, changes, now=NOW + 1)
    assert isinstance(exc.value, InvalidInput)
    assert exc.value.data["field"] == field, exc.value.data
    assert field in exc.value.message
    assert dump(conn) == before, "a refused write changed the stored state"
    return exc.value


@pytest.fixture
def seeded(conn: sqlite3.Connection) -> sqlite3.Connection:
    """Something already stored, so a refusal has state to leave alone."""
    write(conn, "app", {"language": "en", "largePasteThreshold": 1200})
    write(conn, "ui", {"sidebarWidth": 280})
    return conn


# -- largePasteThreshold (§7: reads normalize to 600, writes validate 1..1,000,000) ---------------


@pytest.mark.parametrize("value", [1, 600, 1_000_000], ids=["min", "default", "max"])
def test_large_paste_threshold_accepts_the_range_and_its_boundaries(seeded: sqlite3.Connection, value: int) -> None:
    plan = write(seeded, "app", {"largePasteThreshold": value})
    assert blob(seeded)["largePasteThreshold"] == value and read(seeded, "largePasteThreshold") == value
    assert blob(seeded)["language"] == "en"  # a partial update merges
    assert plan.values == {"largePasteThreshold": value}


@pytest.mark.parametrize("value", [0, -5, 1_000_001, "600", True, 600.0, None, [600], {"v": 600}],
                         ids=["zero", "negative", "above-max", "string", "bool", "float", "null", "list", "object"])
def test_large_paste_threshold_refuses_every_other_value(seeded: sqlite3.Connection, value: Any) -> None:
    err = refused(seeded, "app", {"largePasteThreshold": value}, "largePasteThreshold")
    assert "1 to 1000000" in err.message
    assert read(seeded, "largePasteThreshold") == 1200


@pytest.mark.parametrize("stored", [None, {}, {"largePasteThreshold": 0}, {"largePasteThreshold": 5_000_000},
                                    {"largePasteThreshold": "900"}, {"largePasteThreshold": True}, ["not", "a blob"]],
                         ids=["no-row", "missing", "zero", "out-of-range", "string", "bool", "malformed-blob"])
def test_large_paste_threshold_reads_normalize_to_600(conn: sqlite3.Connection, stored: Any) -> None:
    if stored is not None:
        settings.set_value(conn, "app", "settings", stored, NOW)
    assert read(conn, "largePasteThreshold") == 600


@pytest.mark.parametrize("stored", ["{not json", "[600]"], ids=["not-json", "not-an-object"])
def test_a_damaged_blob_is_corrupt_to_read_and_to_write(conn: sqlite3.Connection, stored: str) -> None:
    """Before, a blob that did not parse read as defaults, and a write of one field replaced it with that field
    alone (every other app setting lost)."""
    conn.execute("INSERT INTO kv VALUES ('app', 'settings', ?, ?)", (stored, NOW))
    with pytest.raises(DamagedRecord):
        settings.app_blob(conn)
    before = dump(conn)
    with pytest.raises(DamagedRecord) as exc:
        write(conn, "app", {"largePasteThreshold": 1000}, now=NOW + 1)
    assert exc.value.data == {"ns": "app", "key": "settings", "repair": "pi-host doctor --repair"}
    assert dump(conn) == before


# -- thinkingDisplayMode ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["detailed", "compact"])
def test_thinking_display_mode_accepts_its_two_values(seeded: sqlite3.Connection, value: str) -> None:
    write(seeded, "app", {"thinkingDisplayMode": value})
    assert read(seeded, "thinkingDisplayMode") == value


@pytest.mark.parametrize("value", ["fancy", "Detailed", "", 1, None, True], ids=["unknown", "case", "empty", "int",
                                                                                "null", "bool"])
def test_thinking_display_mode_refuses_anything_else(seeded: sqlite3.Connection, value: Any) -> None:
    refused(seeded, "app", {"thinkingDisplayMode": value}, "thinkingDisplayMode")


def test_thinking_display_mode_missing_reads_detailed(seeded: sqlite3.Connection) -> None:
    assert "thinkingDisplayMode" not in blob(seeded)
    assert read(seeded, "thinkingDisplayMode") == "detailed"
    settings.set_value(seeded, "app", "settings", {"thinkingDisplayMode": "fancy"}, NOW)  # hand-edited
    assert read(seeded, "thinkingDisplayMode") == "detailed"


# -- prompt-enhancement overrides (ADR 0121) ------------------------------------------------------


@pytest.mark.parametrize("template", ["Improve: {{draft}}", "{{draft}}", "x" * 7991 + "{{draft}}",
                                      "标" * 7991 + "{{draft}}"],
                         ids=["plain", "only-variable", "at-max-length", "max-length-in-code-points"])
def test_user_template_with_the_draft_variable_within_the_limit_is_stored(seeded: sqlite3.Connection,
                                                                         template: str) -> None:
    assert len(template) <= 8000
    write(seeded, "app", {"promptEnhancementUserTemplate": template})
    assert blob(seeded)["promptEnhancementUserTemplate"] == template


@pytest.mark.parametrize("template", ["no placeholder", "{draft}", "{{ draft }}", "x" * 7992 + "{{draft}}", 42, None,
                                      ["{{draft}}"]],
                         ids=["missing-variable", "single-braces", "spaced", "over-max-length", "int", "null", "list"])
def test_user_template_without_the_variable_or_too_long_is_refused(seeded: sqlite3.Connection, template: Any) -> None:
    refused(seeded, "app", {"promptEnhancementUserTemplate": template}, "promptEnhancementUserTemplate")


@pytest.mark.parametrize("blank", ["", "   ", "\n\t "], ids=["empty", "spaces", "whitespace"])
def test_a_blank_user_template_stores_no_key(seeded: sqlite3.Connection, blank: str) -> None:
    write(seeded, "app", {"promptEnhancementUserTemplate": "Improve: {{draft}}"})
    plan = write(seeded, "app", {"promptEnhancementUserTemplate": blank})
    assert "promptEnhancementUserTemplate" not in blob(seeded)
    assert plan.values == {"promptEnhancementUserTemplate": None}
    assert plan.changed == ["promptEnhancementUserTemplate"]
    assert '""' not in dict(((k, v) for _, k, v, _ in dump(seeded)))["settings"]


def test_a_stored_system_prompt_is_dropped_on_read_and_on_the_next_write(conn: sqlite3.Connection) -> None:
    settings.set_value(conn, "app", "settings", {"promptEnhancementSystemPrompt": "old", "language": "en"}, NOW)
    assert read(conn, "promptEnhancementSystemPrompt") is None
    plan = write(conn, "app", {"language": "fr"})
    assert blob(conn) == {"language": "fr"}
    assert plan.changed == ["language", "promptEnhancementSystemPrompt"]
    write(conn, "app", {"promptEnhancementSystemPrompt": "written by an old UI"})
    assert "promptEnhancementSystemPrompt" not in blob(conn)


@pytest.mark.parametrize(("key", "good", "bad"), [
    ("promptEnhancementCustomTemplate", True, "yes"),
    ("promptEnhancementCustomTemplate", False, 1),
    ("promptEnhancementThinkingLevel", "low", "extreme"),
    ("promptEnhancementThinkingLevel", "omit", None),
    ("promptEnhancementProviderId", "openrouter", "p" * 201),
    ("promptEnhancementModelId", "m" * 200, 7),
])
def test_prompt_enhancement_switch_and_pins(seeded: sqlite3.Connection, key: str, good: Any, bad: Any) -> None:
    write(seeded, "app", {key: good})
    assert blob(seeded)[key] == good
    refused(seeded, "app", {key: bad}, key)


def test_a_blank_pin_stores_no_key(seeded: sqlite3.Connection) -> None:
    write(seeded, "app", {"promptEnhancementModelId": "gpt-x"})
    write(seeded, "app", {"promptEnhancementModelId": "  "})
    assert "promptEnhancementModelId" not in blob(seeded)


# -- networkProxy (D340) --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [
    {"mode": "system"},
    {"mode": "none"},
    {"mode": "manual", "url": "http://127.0.0.1:3128", "bypass": ["localhost", "*.internal"]},
    {"mode": "manual", "url": "socks5://proxy.example:1080"},
    {"mode": "system", "bypass": []},
], ids=["system", "none", "manual", "socks", "empty-bypass"])
def test_network_proxy_accepts_valid_settings(seeded: sqlite3.Connection, value: dict[str, Any]) -> None:
    write(seeded, "app", {"networkProxy": value})
    assert blob(seeded)["networkProxy"] == value


@pytest.mark.parametrize("value", [
    {"mode": "manual"},
    {"mode": "auto"},
    {"mode": "manual", "url": "ftp://proxy:21"},
    {"mode": "manual", "url": "http://"},
    {"mode": "manual", "url": "http://proxy:99999"},
    {"mode": "manual", "url": 3128},
    {"mode": "system", "bypass": "localhost"},
    {"mode": "system", "bypass": ["local host"]},
    {"mode": "system", "bypass": ["x"] * 65},
    {"mode": "system", "password": "hunter2"},
    {"url": "http://proxy:1"},
    "http://proxy:3128",
    None,
], ids=["manual-without-url", "unknown-mode", "bad-scheme", "no-host", "bad-port", "url-not-text", "bypass-not-list",
        "bypass-space", "bypass-too-many", "extra-key", "no-mode", "not-object", "null"])
def test_network_proxy_refuses_invalid_settings(seeded: sqlite3.Connection, value: Any) -> None:
    refused(seeded, "app", {"networkProxy": value}, "networkProxy")


# -- defaultMode, defaultCommandShell (§7 items 6, 7), attachmentBudgetBytes ----------------------


@pytest.mark.parametrize("mode", ["plan", "goal", "agent"])
def test_default_mode_accepts_the_three_modes(seeded: sqlite3.Connection, mode: str) -> None:
    write(seeded, "app", {"defaultMode": mode})
    assert read(seeded, "defaultMode") == mode


@pytest.mark.parametrize("mode", ["chat", "cruise", "", None, 1],
                         ids=["legacy-chat", "unknown", "empty", "null", "int"])
def test_default_mode_refuses_other_values(seeded: sqlite3.Connection, mode: Any) -> None:
    refused(seeded, "app", {"defaultMode": mode}, "defaultMode")


@pytest.mark.parametrize("shell", ["bash", "zsh", "sh", "fish", "dash", "pwsh"])
def test_default_command_shell_accepts_the_platform_catalog(seeded: sqlite3.Connection, shell: str) -> None:
    write(seeded, "app", {"defaultCommandShell": shell})
    assert read(seeded, "defaultCommandShell") == shell


@pytest.mark.parametrize(("shell", "says"), [("cmd", "win32"), ("powershell", "win32"), ("tcsh-9000", "linux"),
                                            ("", "linux"), (None, "linux")])
def test_default_command_shell_refuses_other_platforms_and_unknown_ids(seeded: sqlite3.Connection, shell: Any,
                                                                       says: str) -> None:
    assert says in refused(seeded, "app", {"defaultCommandShell": shell}, "defaultCommandShell").message


@pytest.mark.parametrize(("value", "ok"), [(1, True), (250_000, True), (1 << 40, True), (0, False), (-1, False),
                                           ((1 << 40) + 1, False), ("250000", False), (2.5e5, False)])
def test_attachment_budget_bytes(seeded: sqlite3.Connection, value: Any, ok: bool) -> None:
    if ok:
        write(seeded, "app", {"attachmentBudgetBytes": value})
        assert blob(seeded)["attachmentBudgetBytes"] == value
    else:
        refused(seeded, "app", {"attachmentBudgetBytes": value}, "attachmentBudgetBytes")


# -- the app namespace as a whole ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["currentProjectId", "providers.order", "settings"])
def test_host_owned_app_keys_are_refused(seeded: sqlite3.Connection, key: str) -> None:
    refused(seeded, "app", {key: 3}, key)
    refused(seeded, "app", {key: DELETE}, key)


def test_an_update_with_one_bad_value_writes_none_of_them(seeded: sqlite3.Connection) -> None:
    refused(seeded, "app", {"language": "de", "thinkingDisplayMode": "compact", "largePasteThreshold": 0},
            "largePasteThreshold")
    assert blob(seeded) == {"language": "en", "largePasteThreshold": 1200}


def test_delete_removes_one_field_and_reports_it(seeded: sqlite3.Connection) -> None:
    plan = write(seeded, "app", {"largePasteThreshold": DELETE})
    assert plan.changed == ["largePasteThreshold"] and blob(seeded) == {"language": "en"}
    assert read(seeded, "largePasteThreshold") == 600
    assert write(seeded, "app", {"largePasteThreshold": DELETE}).changed == []


def test_unknown_app_fields_are_kept_within_the_blob_bound(seeded: sqlite3.Connection) -> None:
    write(seeded, "app", {"sessionTitleCustomPrompt": True, "nested": {"a": [1, 2]}})
    assert blob(seeded)["nested"] == {"a": [1, 2]}
    refused(seeded, "app", {"huge": "x" * (256 * 1024)}, "huge", PayloadTooLarge)


def test_rewriting_the_same_value_changes_nothing(seeded: sqlite3.Connection) -> None:
    before = dump(seeded)
    assert write(seeded, "app", {"largePasteThreshold": 1200}, now=NOW + 5).changed == []
    assert dump(seeded) == before


# -- ui, cache, plugin:<id>, other namespaces ------------------------------------------------------


def test_ui_values_and_keys_are_bounded(conn: sqlite3.Connection) -> None:
    write(conn, "ui", {"big": "x" * (64 * 1024 - 2)})  # 65,536 bytes of JSON: the limit
    refused(conn, "ui", {"bigger": "x" * (64 * 1024 - 1)}, "bigger", PayloadTooLarge)
    write(conn, "ui", {f"k{i}": i for i in range(499)})
    assert settings.count_keys(conn, "ui") == 500
    refused(conn, "ui", {"one-more": 1}, "one-more")
    write(conn, "ui", {"k1": 2})  # updating an existing key is not a new key
    write(conn, "ui", {"k2": DELETE, "new": 1})  # one out, one in


def test_plugin_namespaces_are_bounded(conn: sqlite3.Connection) -> None:
    write(conn, "plugin:acme", {f"k{i}": i for i in range(100)})
    write(conn, "plugin:acme", {f"j{i}": i for i in range(100)})
    write(conn, "plugin:acme", {f"m{i}": i for i in range(56)})
    refused(conn, "plugin:acme", {"x": 1}, "x")
    write(conn, "plugin:beta", {"x": 1})  # another plugin has its own bound
    refused(conn, "plugin:beta", {"v": "x" * (64 * 1024)}, "v", PayloadTooLarge)


@pytest.mark.parametrize("ns", ["plugin:", "plugin:..", "plugin:-x", "plugin:" + "a" * 90, "plugin:a b"])
def test_a_plugin_namespace_names_a_plugin_id(conn: sqlite3.Connection, ns: str) -> None:
    """Seed 003 §4.1: uninstall = DELETE WHERE ns = plugin:<id>. A namespace no plugin id can match was
    written and could never be cleared (plugins.uninstall refuses such an id)."""
    refused(conn, ns, {"k": 1}, "ns")


def test_recent_models_is_a_bounded_mru_list(conn: sqlite3.Connection) -> None:
    recent = [{"providerId": "p", "modelId": f"m{i}"} for i in range(20)]
    write(conn, "cache", {"recentModels": recent})
    assert settings.get_value(conn, "cache", "recentModels")[0] == recent  # type: ignore[index]
    refused(conn, "cache", {"recentModels": [*recent, {"providerId": "p", "modelId": "m20"}]}, "recentModels")
    refused(conn, "cache", {"recentModels": [recent[0], recent[0]]}, "recentModels")
    refused(conn, "cache", {"recentModels": [{"providerId": "p"}]}, "recentModels")
    refused(conn, "cache", {"recentModels": [{"providerId": "p", "modelId": ""}]}, "recentModels")
    refused(conn, "cache", {"recentModels": "p/m"}, "recentModels")


def test_refresh_stamps_are_host_owned(conn: sqlite3.Connection) -> None:
    refused(conn, "cache", {"modelRefresh:openrouter": {"refreshedAt": 1}}, "modelRefresh:openrouter")


@pytest.mark.parametrize("ns", ["projectGroups", "projectGroupMemory", "projectGroupInstructions", "configSync"])
def test_host_owned_namespaces_are_refused(seeded: sqlite3.Connection, ns: str) -> None:
    err = refused(seeded, ns, {"k": 1}, "k")
    assert err.data["owner"]


def test_a_new_config_domain_is_a_bounded_namespace(conn: sqlite3.Connection) -> None:
    write(conn, "mcpServers", {"github": {"command": "gh-mcp"}})
    refused(conn, "mcpServers", {"huge": "x" * (256 * 1024)}, "huge", PayloadTooLarge)


# -- project memory (§4.2) ---------------------------------------------------------------------------


def test_project_memory_is_keyed_by_the_canonical_path(conn: sqlite3.Connection) -> None:
    write(conn, "projectMemory", {"/work/app/": "use pnpm"})
    write(conn, "projectMemory", {" /work/app ": "use pnpm, not npm"})
    rows = conn.execute("SELECT key FROM kv WHERE ns = 'projectMemory'").fetchall()
    assert rows == [("/work/app",)]
    stored = settings.get_value(conn, "projectMemory", "/work/app")[0]  # type: ignore[index]
    assert stored["content"] == "use pnpm, not npm" and stored["format"] == "entries-v1"


def test_project_memory_entries_are_normalized_to_derived_content(conn: sqlite3.Connection) -> None:
    write(conn, "projectMemory", {"/w": {"format": "entries-v1", "content": "ignored", "entries": [
        {"title": " Build ", "content": " make -j4 "}, {"title": "", "content": "   "},
        {"id": "e1", "content": "second"}]}})
    stored = settings.get_value(conn, "projectMemory", "/w")[0]  # type: ignore[index]
    assert stored["entries"] == [{"id": "e2", "title": "Build", "content": "make -j4"},
                                 {"id": "e1", "title": "", "content": "second"}]
    assert stored["content"] == "## Build\n\nmake -j4\n\nsecond" and stored["updatedAt"] == NOW


def test_project_memory_is_capped_at_32_kib(conn: sqlite3.Connection) -> None:
    write(conn, "projectMemory", {"/w": "é" * (16 * 1024)})  # 32,768 bytes: the cap
    refused(conn, "projectMemory", {"/w": "é" * (16 * 1024) + "x"}, "/w", PayloadTooLarge)
    refused(conn, "projectMemory", {"/w": {"format": "entries-v1", "entries": [
        {"title": "a", "content": "x" * (32 * 1024)}]}}, "/w", PayloadTooLarge)


@pytest.mark.parametrize("bad", [42, {"format": "entries-v2", "entries": []}, {"entries": "text"},
                                 {"entries": [{"content": 1}]}, {"entries": [{"id": "a b", "content": "x"}]},
                                 {"entries": [{"id": "a", "content": "x"}, {"id": "a", "content": "y"}]},
                                 {"entries": [{"title": "two\nlines", "content": "x"}]}],
                         ids=["int", "format", "entries-not-list", "content-not-text", "bad-id", "duplicate-id",
                              "multiline-title"])
def test_malformed_project_memory_is_refused(conn: sqlite3.Connection, bad: Any) -> None:
    write(conn, "projectMemory", {"/w": "keep me"})
    before = dump(conn)
    with pytest.raises(InvalidInput):
        write(conn, "projectMemory", {"/w": bad})
    assert dump(conn) == before


def test_legacy_plain_text_memory_reads_as_one_untitled_entry(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO kv VALUES ('projectMemory', '/w', ?, ?)", (orjson.dumps("remember this").decode(), NOW))
    view = memory_view(settings.get_value(conn, "projectMemory", "/w")[0])  # type: ignore[index]
    assert view["entries"] == [{"id": "legacy", "title": "", "content": "remember this"}]
    assert view["content"] == "remember this" and view["legacy"] is True


def test_memory_entries_of_another_writers_shape_read_as_their_derived_content() -> None:
    """An older build's visual entries (``body``, not ``content``): its derived plain content reads, as one
    untitled entry, not a refusal (the data directory's seed memory; ``pi-host doctor`` found it "damaged")
    and not an empty memory (before the damaged-record change: what the runtime was given was shown as
    nothing). With no derived content to fall back on it stays unreadable."""
    seed = {"format": "entries-v1", "entries": [{"title": "db", "body": "use WAL"}], "content": "use WAL",
            "updatedAt": NOW}
    view = memory_view(seed)
    assert view["entries"] == [{"id": "legacy", "title": "", "content": "use WAL"}] and view["content"] == "use WAL"
    with pytest.raises(DamagedRecord):
        memory_view({**seed, "content": ""})


def test_empty_memory_stores_no_key(conn: sqlite3.Connection) -> None:
    write(conn, "projectMemory", {"/w": "x"})
    plan = write(conn, "projectMemory", {"/w": "   "})
    assert settings.get_value(conn, "projectMemory", "/w") is None and plan.changed == ["/w"]
