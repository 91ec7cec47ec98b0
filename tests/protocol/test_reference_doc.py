"""Issue 25 ("Wire and docs"): ``protocol/README.md`` says what the host does (each test names its finding)."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from actors.gateway_types import GatewayConfig
from runtime.config import HostConfig

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = (ROOT / "protocol" / "README.md").read_text(encoding="utf-8")
GUIDE = REFERENCE.split("\n# Reference\n", 1)[0]
HOST_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(HostConfig)}


def _section(title_start: str) -> str:
    start = GUIDE.index(f"\n## {title_start}")
    end = GUIDE.find("\n## ", start + 1)
    return GUIDE[start:end if end != -1 else None]


def test_sections_are_numbered_once_in_order() -> None:
    """Finding: section 8 appeared twice (the whole section was duplicated)."""
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", GUIDE, flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1))


def test_limits_table_states_the_unauthenticated_cap_the_host_uses() -> None:
    """Finding: the limits table said 32 connections without host.hello where the code says 128."""
    cap = HOST_DEFAULTS["max_unauthenticated"]
    assert cap == GatewayConfig(token="t").max_unauthenticated
    assert f"{cap} that have not said `host.hello`" in _section("7. Limits")


def test_limits_table_states_the_live_session_bound_the_host_uses() -> None:
    """The race audit met the bound of live session actors (BUSY); the table now states it."""
    limits = _section("7. Limits")
    assert f"{HOST_DEFAULTS['max_sessions_active']:,} (`HostConfig.max_sessions_active`)" in limits
    assert f"passivates after {HOST_DEFAULTS['session_idle_timeout']:g} s" in limits


def test_oversize_frame_and_params_are_documented_as_the_host_handles_them() -> None:
    """Finding: a frame over 16 MiB closes the connection with 1009 though the reference promised
    PAYLOAD_TOO_LARGE. The reference now says 1009 for the frame, PAYLOAD_TOO_LARGE for params."""
    limits = _section("7. Limits")
    assert HOST_DEFAULTS["max_frame_bytes"] == 16 * 1024 * 1024
    assert HOST_DEFAULTS["max_params_bytes"] == 8 * 1024 * 1024
    assert "longer than\n16 MiB" in limits and "**1009**" in limits
    assert "more than 8 MiB" in limits and "`PAYLOAD_TOO_LARGE`\n(`data.limit`)" in limits
    assert "Going over\neither gives `PAYLOAD_TOO_LARGE`" not in REFERENCE


def test_envelope_says_notifications_run_nothing_and_params_are_an_object() -> None:
    """Findings: a notification could create a session; array params got a pydantic message."""
    envelope = _section("2. JSON-RPC 2.0 envelope")
    assert "runs no notification" in envelope
    assert '"params must be an\n  object"' in envelope


def test_both_turn_recipes_have_the_sidecar_append_the_prompt() -> None:
    """Finding: the two turn recipes disagreed on who appends the user's message (the reference
    sidecar, ``clients/python/pihost_client/agent.py``, appends it after ``session.startTurn``)."""
    agent = (ROOT / "clients" / "python" / "pihost_client" / "agent.py").read_text(encoding="utf-8")
    assert agent.index("start_turn(") < agent.index('"role": "user", "turnId": turn_id')
    side_by_side = _section("10. ").split("### One turn, UI and sidecar side by side", 1)[1]
    end_to_end = _section("11. One turn")
    for recipe in (side_by_side, end_to_end):
        rows = [line for line in recipe.splitlines() if line.startswith("|")]
        [append_row] = [r for r in rows if "session.appendMessage" in r and "user" in r]
        cells = [c.strip() for c in append_row.strip("|").split("|")]
        assert "session.appendMessage" in cells[1] and "startTurn" in "".join(rows[: rows.index(append_row) + 1])
        assert "session.queuePush" in recipe


def test_readme_points_to_the_pid_where_it_is() -> None:
    """Finding: the README said ``pi-host status --json`` shows the host's pid (it does not); the pid is in
    ``host.json`` (written by the host, read by the CLI)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "status --json` shows its" not in readme
    assert "its pid is in\n`/tmp/pi-tour/host.json`" in readme


def test_every_boot_key_the_guide_names_is_in_the_boot_report_reference() -> None:
    """Finding: the guide sends readers to ``host.status`` → ``boot.walFold``, ``boot.mergesDeferred``,
    ``boot.inflight``, ``boot.retention``, ``boot.salvage``, ``boot.scratchSwept`` and ``boot.scratchNotSwept``,
    which the host sends, but the BootReport reference listed none of them (only "more keys may appear");
    likewise the JSONL export's ``blobs`` / ``blobsEvicted`` / ``reviewSnapshots`` / ``reviewUnreadable``
    counts were named in section 9 and missing from SessionExportResult."""
    from protocol.models_export import SessionExportResult
    from protocol.models_host import BootReport

    def wire(model: Any) -> set[str]:
        return {f.alias or name for name, f in model.model_fields.items()}

    named = set(re.findall(r"`boot\.([A-Za-z]+)", GUIDE)) | set(
        re.findall(r"`boot\.([A-Za-z]+)", (ROOT / "README.md").read_text(encoding="utf-8")))
    assert named and named - wire(BootReport) == set()
    assert {"blobs", "blobsEvicted", "reviewSnapshots", "reviewUnreadable"} <= wire(SessionExportResult)
