"""``pi-host import claude-code|codex|pi|opencode|pi-host [PATH] [--dry-run] [--json]``.

The running host does the import (it owns every byte: ``import.sessions``);
the CLI resolves the tool's usual root in *its* environment when no PATH is
given (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``PI_CODING_AGENT_DIR``,
``XDG_DATA_HOME`` honoured), follows the host's ``import.progress`` events with
a progress bar when stdout is a terminal, and prints a summary: one line per
refused session with its reason, then the counts; ``--json`` prints the whole
result (counts, per-session reports). When nothing was imported and the root
holds another tool's sessions, a hint names that tool; when it holds no session at all,
a hint says where the tool keeps them. A root that does not
exist (or a tool that was never installed) is one line on stderr. Exit
status: 0 when every session was imported or unchanged, 1 when some sessions
were refused or the host refused the request, 2 when no host is running or
the root is missing or unusable.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import trio

from runtime.client import HostClient, RpcError
from store.interchange.importers import default_root
from store.interchange.importers.sniff import guess_source

__all__ = ["ImportBar", "nothing_found_hint", "other_tool_hint", "render_summary", "resolve_root", "run_import"]

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


SHOWN_UNKNOWN_KINDS = 8


def render_summary(result: dict[str, Any], *, hint: str | None = None) -> str:
    """Refusals one per line, then the counts: sessions by outcome, new messages (and those the sessions read hold
    from their sources: the result's ``messages``, which are not the source records parsed), messages hidden
    because they left the source's branch, record kinds the importer did not know; ``hint`` last."""
    lines = []
    for rep in result.get("sessions", []):
        if rep.get("status") == "refused":
            where = rep.get("externalId") or rep.get("sessionId") or "?"
            lines.append(f"refused {where}: {rep.get('reason')}: {rep.get('message')}")
    dry = bool(result.get("dryRun"))
    held = int(result.get("messages", 0))
    new = int(result.get("newMessages", held))
    added = "would be new" if dry else "new"
    lines.append(f"{_what_happened(result, dry)}; {new} messages {added} ({held} in the sessions read), "
                 f"{_size(int(result.get('sourceBytes', 0)))} read")
    hidden = int(result.get("hiddenOffBranch", 0))
    if hidden:
        lines.append(f"{hidden} message(s) {'would be' if dry else 'were'} hidden: they are no longer on the "
                     "source's current branch (kept in the transcript, shown again if the branch returns)")
    restored = int(result.get("restoredOnBranch", 0))
    if restored:
        lines.append(f"{restored} message(s) hidden by an earlier import {'would be' if dry else 'were'} shown "
                     "again: they are back on the source's current branch")
    lines.extend(_line_notes(result))
    unknown = result.get("unknownKinds") or {}
    if isinstance(unknown, dict) and unknown:
        kinds = sorted(unknown.items(), key=lambda kv: (-int(kv[1]), kv[0]))
        listed = ", ".join(f"{k} ×{n}" for k, n in kinds[:SHOWN_UNKNOWN_KINDS])
        more = f" and {len(kinds) - SHOWN_UNKNOWN_KINDS} more" if len(kinds) > SHOWN_UNKNOWN_KINDS else ""
        lines.append(f"skipped record kinds this importer does not know: {listed}{more}")
    if result.get("truncated"):
        lines.append("(more sessions were reported than the summary holds; see the host's reports with --json)")
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def _sessions(n: int) -> str:
    return f"{n} new session{'' if n == 1 else 's'}"


def _what_happened(result: dict[str, Any], dry: bool) -> str:
    """The summary's sentence: ``imported 6 new sessions and updated 1 from ROOT (2 unchanged, 1 refused)``, in a
    dry run ``would import 6 new sessions and update 1 ...``; ``imported nothing`` when no session came in. The
    counts are the host's statuses (``would-new`` ... in a dry run), said in words."""
    counts = {k: int(n) for k, n in (result.get("counts") or {}).items() if isinstance(n, int)}
    new = counts.get("would-new" if dry else "new", 0)
    updated = counts.get("would-updated" if dry else "updated", 0)
    if new and updated:
        done = f"{_sessions(new)} and {'update' if dry else 'updated'} {updated}"
    elif new:
        done = _sessions(new)
    elif updated:
        done = f"{'update' if dry else 'updated'} {updated} imported before"
    else:
        done = "nothing"
    if updated and not new:
        head = f"would {done}" if dry else done
    else:
        head = f"would import {done}" if dry else f"imported {done}"
    said = {"new", "updated", "would-new", "would-updated"}
    rest = [f"{n} {k}" for k, n in counts.items() if n and k not in said]
    if not result.get("total"):
        rest = ["no sessions found"]
    return f"{head} from {result.get('root')}" + (f" ({', '.join(rest)})" if rest else "")


def _size(n: int) -> str:
    """Bytes read, as a person reads them (``0.0 MB`` said nothing of a few KB)."""
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1024 * 1024 else _mb(n)


def _line_notes(result: dict[str, Any]) -> list[str]:
    """What the sessions' files held that did not come in as written: lines skipped (not JSON, over the line
    size limit) and lines read with bytes that are not UTF-8 replaced (the result's ``unreadLines`` /
    ``repairedLines``, broken down by the reports' ``files`` when they hold them all), files whose last line
    is incomplete (left for the next import)."""
    bad = oversized = repaired = torn = 0
    hit: set[str] = set()
    for rep in result.get("sessions", []):
        if rep.get("status") == "refused":
            continue
        for file in rep.get("files") or ():
            b, o, r = (int(file.get(k) or 0) for k in ("badLines", "oversizedLines", "repairedLines"))
            t = int(file.get("tornTailBytes") or 0) > 0
            bad, oversized, repaired, torn = bad + b, oversized + o, repaired + r, torn + t
            if b or o:
                hit.add(str(rep.get("sessionId") or rep.get("externalId")))
    unread = max(int(result.get("unreadLines") or 0), bad + oversized)
    notes = []
    if unread:
        why = ", ".join(x for x in (f"{bad} not JSON" if bad else "",
                                    f"{oversized} over the line size limit" if oversized else "") if x)
        detail = f" ({why}) in {len(hit)} session(s)" if unread == bad + oversized else ""
        notes.append(f"{unread} line(s) could not be read and were skipped{detail}; --json names the files")
    repaired = max(int(result.get("repairedLines") or 0), repaired)
    if repaired:
        notes.append(f"{repaired} line(s) held bytes that are not UTF-8: read with U+FFFD in their place")
    if torn:
        notes.append(f"{torn} file(s) end with an incomplete line (a tool still writing it, or a crash): "
                     "left for the next import")
    return notes


def other_tool_hint(source: str, root: str) -> str | None:
    """A hint when ``root`` holds another tool's sessions (None when it does not look like one)."""
    guessed = guess_source(Path(root))
    if guessed is None or guessed == source:
        return None
    return (f"hint: {root} looks like {guessed}'s sessions, not {source}'s; "
            f"try: pi-host import {guessed} {shlex.quote(root)}")


def nothing_found_hint(source: str, root: str, usual: str) -> str:
    """The hint when ``root`` held no session of ``source`` and no other tool's: where ``source`` keeps
    them (``usual``, this environment's default root) when that is another folder. A pi-host data directory
    given for ``pi-host`` (its transcripts are in its ``sessions`` folder) is pointed there."""
    sessions = Path(root) / "sessions"
    if source == "pi-host" and sessions.is_dir() and any(sessions.glob("*.jsonl")):
        return (f"hint: {root} looks like a pi-host data directory; its sessions are in {sessions}: "
                f"try: pi-host import pi-host {shlex.quote(str(sessions))}")
    if source == "pi-host" or os.path.abspath(usual) == os.path.abspath(root):
        return f"hint: no {source} sessions in {root} yet"
    return f"hint: no {source} sessions in {root}; {source} keeps them in {usual}"


def _imported_any(result: dict[str, Any]) -> bool:
    counts = result.get("counts", {})
    return any(int(counts.get(k, 0)) for k in ("new", "updated", "unchanged", "would-new", "would-updated"))


def resolve_root(source: str, path: str | None) -> str:
    """PATH, or the tool's usual root in this process's environment; absolute."""
    return os.path.abspath(Path(path) if path is not None else default_root(source))


async def run_import(client: HostClient, source: str, root: str, *, dry_run: bool, as_json: bool,
                     out: TextIO, err: TextIO = sys.stderr) -> int:
    import_id = f"cli-{secrets.token_hex(6)}"
    params: dict[str, Any] = {"source": source, "root": root, "dryRun": dry_run, "importId": import_id}
    bar = ImportBar(out) if out.isatty() and not as_json else None
    result: dict[str, Any] = {}
    refused: RpcError | None = None
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
        except RpcError as exc:  # answered outside the nursery: one line, not an exception group
            refused = exc
        finally:
            nursery.cancel_scope.cancel()
            if bar is not None:
                bar.clear()
    if refused is not None:
        return _refusal(refused, source, root, err)
    hint = None
    if not _imported_any(result):
        hint = other_tool_hint(source, root)
        if hint is None and not int(result.get("total", 0)):
            hint = nothing_found_hint(source, root, str(default_root(source)))
    if as_json:
        out.write(json.dumps(result if hint is None else {**result, "hint": hint}, indent=2,
                             ensure_ascii=False) + "\n")
    else:
        out.write(render_summary(result, hint=hint) + "\n")
    return 1 if result.get("counts", {}).get("refused") else 0


def _refusal(exc: RpcError, source: str, root: str, err: TextIO) -> int:
    """One line for a refused import request; 2 for a root that is missing or not usable, else 1."""
    if exc.data_code == "NOT_FOUND":
        line = f"pi-host: import {source}: {root} does not exist"
        if source != "pi-host" and os.path.abspath(default_root(source)) == root:
            line += f" (the usual place {source} keeps its sessions; is {source} installed? pass its folder as PATH)"
        print(line, file=err)
        return 2
    print(f"pi-host: import {source}: {exc.data_code}: {exc.message}", file=err)
    return 2 if exc.data_code in ("INVALID_PARAMS", "PERMISSION_DENIED") else 1


async def _follow(client: HostClient, import_id: str, bar: ImportBar, finished: trio.Event) -> None:
    async for event in client:
        if event.topic == "import.progress" and isinstance(event.data, dict) \
                and event.data.get("importId") == import_id:
            bar(event.data)
            if event.data.get("finished"):
                finished.set()
                return
