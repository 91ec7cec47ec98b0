"""``pi-host import claude-code|codex|pi|opencode|pi-host [PATH] [--dry-run] [--json]``.

The running host does the import (it owns every byte: ``import.sessions``);
the CLI resolves the tool's usual root in *its* environment when no PATH is
given (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``PI_CODING_AGENT_DIR``,
``XDG_DATA_HOME`` honoured), follows the host's ``import.progress`` events with
a progress bar when stdout is a terminal, and prints a summary: one line per
refused session with its reason, then the counts; ``--json`` prints the whole
result (counts, per-session reports). Exit status: 0 when every session was
imported or unchanged, 1 when the host refused the request or some sessions
were refused, 2 when no host is running.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, TextIO

import trio

from runtime.client import HostClient
from store.interchange.importers import default_root

__all__ = ["ImportBar", "render_summary", "resolve_root", "run_import"]

BAR_WIDTH = 30
MIN_REDRAW_S = 0.05
FINAL_EVENT_WAIT_S = 2.0


def _mb(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB"


class ImportBar:
    """``import claude-code [#####.........] 12/40 sessions  18.2/51.0 MB  3 new`` redrawn in place."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._last = 0.0
        self._drawn = False

    def __call__(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        done, total = int(event.get("done", 0)), int(event.get("total", 0))
        if not event.get("finished") and done < total and now - self._last < MIN_REDRAW_S:
            return
        self._last = now
        read, size = int(event.get("sourceBytes", 0)), int(event.get("totalBytes", 0))
        fraction = read / size if size else (done / total if total else 1.0)
        filled = min(BAR_WIDTH, int(BAR_WIDTH * fraction))
        counts = event.get("counts") or {}
        tail = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        self._out.write(f"\rimport {event.get('source', '')} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                        f"{done}/{total} sessions  {_mb(read)}/{_mb(size)}  {tail}\x1b[K")
        self._out.flush()
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self._out.write("\r\x1b[2K")
            self._out.flush()
            self._drawn = False


def render_summary(result: dict[str, Any]) -> str:
    lines = []
    for rep in result.get("sessions", []):
        if rep.get("status") == "refused":
            where = rep.get("externalId") or rep.get("sessionId") or "?"
            lines.append(f"refused {where}: {rep.get('reason')}: {rep.get('message')}")
    counts = result.get("counts", {})
    shown = ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing found"
    verb = "would import" if result.get("dryRun") else "imported"
    lines.append(f"{verb} {result.get('total', 0)} session(s) from {result.get('root')}: {shown}; "
                 f"{result.get('messages', 0)} messages, {_mb(int(result.get('sourceBytes', 0)))} read")
    if result.get("truncated"):
        lines.append("(more sessions were reported than the summary holds; see the host's reports with --json)")
    return "\n".join(lines)


def resolve_root(source: str, path: str | None) -> str:
    """PATH, or the tool's usual root in this process's environment; absolute."""
    return os.path.abspath(Path(path) if path is not None else default_root(source))


async def run_import(client: HostClient, source: str, root: str, *, dry_run: bool, as_json: bool,
                     out: TextIO) -> int:
    import_id = f"cli-{secrets.token_hex(6)}"
    params: dict[str, Any] = {"source": source, "root": root, "dryRun": dry_run, "importId": import_id}
    bar = ImportBar(out) if out.isatty() and not as_json else None
    result: dict[str, Any] = {}
    if bar is not None:
        await client.subscribe(["import.progress"])
    finished = trio.Event()
    async with trio.open_nursery() as nursery:
        if bar is not None:
            nursery.start_soon(_follow, client, import_id, bar, finished)
        try:
            result = await client.call("import.sessions", params)
            if bar is not None:  # the last event was sent before the answer: draw it
                with trio.move_on_after(FINAL_EVENT_WAIT_S):
                    await finished.wait()
        finally:
            nursery.cancel_scope.cancel()
            if bar is not None:
                bar.clear()
    out.write((json.dumps(result, indent=2, ensure_ascii=False) if as_json else render_summary(result)) + "\n")
    return 1 if result.get("counts", {}).get("refused") else 0


async def _follow(client: HostClient, import_id: str, bar: ImportBar, finished: trio.Event) -> None:
    async for event in client:
        if event.topic == "import.progress" and isinstance(event.data, dict) \
                and event.data.get("importId") == import_id:
            bar(event.data)
            if event.data.get("finished"):
                finished.set()
                return
