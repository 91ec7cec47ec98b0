"""Offline reads for the CLI: ``sessions``, ``show``, ``search`` when no host runs.

Read-only: the data directory's ``host.lock`` is taken *shared* for the
read (a host takes it exclusive, so none can start writing meanwhile, and
while one holds it this refuses), and SQLite is opened read-only
(``store.indexing.database.open_offline_reader``). The same store functions
the host's ``session.list`` and ``search.sessions`` handlers call answer here,
on that connection (``sessions`` lists the index's sessions, without native pi
ones), so the output is the one a running host would print; the host itself
(actors, the method registry) is never imported. ``show``
reads the window through the index when it covers the transcript, and from
the transcript file itself when the index trails it (after a crash, boot
would catch it up); ``sessions`` counts such a session's messages from its
file too.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runtime.cli_client import EXIT_ERROR, EXIT_NO_HOST, HostState, print_error, print_result
from runtime.datadir import NOT_A_FOLDER, DataDir
from store.errors import InvalidInput, SessionNotFound, StoreError
from store.indexing import cursors, index
from store.indexing.database import offline_reads, open_offline_reader, schema_version
from store.indexing.reconcile import plan_reconcile
from store.rules import (
    MAX_CURSOR_CHARS,
    MAX_QUERY_CHARS,
    MAX_SESSION_PAGE,
    MAX_WINDOW,
    NATIVE_SESSION_ID_RE,
    SESSION_REF_RE,
)
from store.search.search import MAX_SESSION_LIMIT, search_sessions
from store.transcripts import windows
from store.transcripts.records import wire_record
from store.transcripts.transcript import read_transcript
from store.upgrade.migrations import preflight_refusal
from store.upgrade.schema import SCHEMA_VERSION

__all__ = ["OfflineRefused", "read_offline", "read_offline_command"]


class OfflineRefused(Exception):
    """An offline read is not possible (a host holds the lock, no index, another schema)."""


@contextmanager
def _shared_lock(data_dir: DataDir) -> Iterator[None]:
    try:
        fd = os.open(data_dir.lock_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        if not data_dir.db_path.is_file():
            raise OfflineRefused(f"{data_dir.root} is not a pi-host data directory (no host.lock)") from None
        # an index no host has served here yet (an earlier app's directory, or a start a fail-closed migration
        # refused, which leaves no lock file behind): no host to share a lock with; the read is read-only
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise OfflineRefused(f"a host holds {data_dir.lock_path}; ask it (is it still booting?)") from None
            raise
        yield
    finally:
        os.close(fd)  # closing drops the lock


def read_offline_command(command: str, args: argparse.Namespace, data_dir: DataDir, state: HostState) -> int:
    """``sessions`` / ``show`` / ``search`` with no host running: read, say so on stderr, print."""
    note = state.problem if state.stale_pid is not None else None
    try:
        res = read_offline(data_dir, command, args)
    except OfflineRefused as exc:
        print(f"pi-host: {exc}", file=sys.stderr)
        return EXIT_NO_HOST
    except StoreError as exc:  # what the host would have answered: its code, message and details
        print_error(exc.code, exc.message, exc.data)
        return EXIT_ERROR
    except OSError as exc:
        if data_dir.root.exists() and not data_dir.root.is_dir():
            print(data_dir.unusable(NOT_A_FOLDER), file=sys.stderr)
        else:
            print(f"pi-host: cannot read {data_dir.root}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_NO_HOST
    print(f"pi-host: no host running; read {data_dir.root} offline" + (f" ({note})" if note else ""),
          file=sys.stderr)
    print_result(command, res, args)
    return 0


def _range_error(loc: str, value: int, low: int, high: int | None = None) -> dict[str, str] | None:
    if value < low:
        return {"loc": loc, "msg": f"Input should be greater than or equal to {low}", "type": "greater_than_equal"}
    if high is not None and value > high:
        return {"loc": loc, "msg": f"Input should be less than or equal to {high}", "type": "less_than_equal"}
    return None


def _check_params(command: str, args: argparse.Namespace) -> None:
    """What the host's params refuse (``session.list``, ``session.get``, ``search.sessions``), refused offline in
    the host's shape: INVALID_PARAMS "invalid params: N error(s)" with one ``{loc, msg, type}`` per field, in the
    params' field order (protocol/errors.py words a validation error so; the CLI prints each as ``  loc: msg
    (type)``). Out of them an offline read printed an empty listing (``--limit 0``), a window of nothing, for a
    malformed session id (``show ../x``) INVALID_ID where the host answers INVALID_PARAMS, and for a search the
    store's own words ("query must not be empty") where the host names the field and the rule."""
    found: list[dict[str, str] | None] = []
    if command == "sessions":
        found.append(_range_error("limit", args.limit, 1, MAX_SESSION_PAGE))
        if args.cursor is not None and not args.cursor:
            found.append({"loc": "cursor", "msg": "String should have at least 1 character",
                          "type": "string_too_short"})
        elif args.cursor is not None and len(args.cursor) > MAX_CURSOR_CHARS:
            found.append({"loc": "cursor", "msg": f"String should have at most {MAX_CURSOR_CHARS} characters",
                          "type": "string_too_long"})
    elif command == "show":
        if not SESSION_REF_RE.match(args.session):
            found.append({"loc": "sessionId", "msg": f"String should match pattern '{SESSION_REF_RE.pattern}'",
                          "type": "string_pattern_mismatch"})
        if args.before is not None:
            found.append(_range_error("messageBefore", args.before, 0))
        found.append(_range_error("messageLimit", args.limit, 1, MAX_WINDOW))
    elif command == "search":  # search.sessions: a query of 1 to MAX_QUERY_CHARS characters, limit 1 to 100
        if not args.query:
            found.append({"loc": "query", "msg": "String should have at least 1 character", "type": "string_too_short"})
        elif len(args.query) > MAX_QUERY_CHARS:
            found.append({"loc": "query", "msg": f"String should have at most {MAX_QUERY_CHARS} characters",
                          "type": "string_too_long"})
        found.append(_range_error("limit", args.limit, 1, MAX_SESSION_LIMIT))
    errors = [e for e in found if e is not None]
    if errors:
        raise InvalidInput(f"invalid params: {len(errors)} error(s)", data={"errors": errors})


def read_offline(data_dir: DataDir, command: str, args: argparse.Namespace) -> dict[str, Any]:
    _check_params(command, args)
    with _shared_lock(data_dir):
        try:
            conn = open_offline_reader(data_dir.db_path)
        except StoreError as exc:
            raise OfflineRefused(exc.message) from None
        try:
            with offline_reads(data_dir.db_path):
                version = schema_version(conn)
                refusal = preflight_refusal(conn) if version != SCHEMA_VERSION else None
                if refusal is not None:  # seed §7: serve fails closed on this file too; say why, not "start serve"
                    raise OfflineRefused(f"the index is schema v{version}, and `pi-host serve` refuses to migrate "
                                         f"it: {refusal.message}")
                if version != SCHEMA_VERSION:
                    raise OfflineRefused(f"the index is schema v{version}, this build reads v{SCHEMA_VERSION}: "
                                         "start `pi-host serve` once to migrate it")
                if command == "sessions":
                    return _sessions(conn, data_dir, args)
                if command == "search":
                    return search_sessions(conn, args.query, limit=args.limit, transcript=data_dir.transcript_path)
                return _show(conn, data_dir, args)
        finally:
            conn.close()


def _sessions(conn: Any, data_dir: DataDir, args: argparse.Namespace) -> dict[str, Any]:
    """A page of ``session.list``: ``--limit`` sessions after ``--cursor``, with the cursor of the next page (the
    host's cursors: a page read offline continues online and back)."""
    fp = cursors.session_list_fingerprint(None)
    after = None
    if args.cursor is not None:
        key = cursors.decode_cursor(args.cursor, cursors.SESSION_LIST_KIND, fp, (int, str))  # INVALID_CURSOR
        after = (int(key[0]), str(key[1]))
    items, more, damaged = index.list_sessions(conn, limit=args.limit, cursor=after, project_id=None)
    nxt = cursors.encode_cursor(cursors.SESSION_LIST_KIND, fp, list(more)) if more is not None else None
    out: dict[str, Any] = {"sessions": [_caught_up(conn, data_dir, index.public_session(r)) for r in items],
                           "nextCursor": nxt}
    if damaged:
        out["unreadableThreads"] = damaged
    return out


def _caught_up(conn: Any, data_dir: DataDir, summary: dict[str, Any]) -> dict[str, Any]:
    """A session whose index trails its transcript (a host was killed) counts the file's messages."""
    row = index.session_row(conn, summary["id"])
    path = data_dir.transcript(summary["id"])
    if row is None or plan_reconcile(path, row["_indexedLen"], row["_fileEpoch"]).kind in ("clean", "missing"):
        return summary
    return {**summary, "messageCount": len(read_transcript(path).messages)}


def _show(conn: Any, data_dir: DataDir, args: argparse.Namespace) -> dict[str, Any]:
    sid = args.session
    if NATIVE_SESSION_ID_RE.match(sid):  # the host's answer without a native root (the index has none)
        raise SessionNotFound(f"native session {sid} not found: an offline read has no native pi session root",
                              data={"sessionId": sid})
    path = data_dir.transcript(sid)
    req = windows.WindowRequest(before=args.before, start=None, limit=args.limit, content_limit=None, around=None)
    window = windows.read_cold(conn, sid, path, req)
    if window.row is None:
        index.require_session(conn, sid)  # SESSION_NOT_FOUND
    assert window.row is not None
    if window.plan_kind == "clean":
        reply: dict[str, Any] = json.loads(window.reply)  # the encoded session.get result
        return reply
    # The index trails the file (a host was killed): the transcript is the source of truth.
    transcript = read_transcript(path)
    total = len(transcript.messages)
    end = min(total, args.before) if args.before is not None else total
    start = max(0, end - args.limit)
    deleted = transcript.deleted_ids
    messages = []
    for pos in range(start, end):
        entry = transcript.messages[pos]
        rec = wire_record(entry.record)
        rec["seq"] = pos + 1
        if entry.id in deleted:
            rec["deleted"] = True
        messages.append(rec)
    return {"session": index.public_session(window.row), "messages": messages, "compactions": [],
            "messageStart": start, "messageEnd": end, "hasMoreBefore": start > 0, "hasMoreAfter": end < total,
            "totalMessages": total}
