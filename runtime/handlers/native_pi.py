"""Native pi sessions on the wire (seed 003 §12): listed, read and forked, never changed.

A configured pi session root (``HostConfig.native_pi_root``, ``serve
--native-pi-root``) is served by a :class:`store.interchange.native_pi_views.NativeCatalog`.
Its sessions appear on the wire as ``native-pi:<pi id>`` (the seed's opaque id,
a type of its own: ``NativeSessionId``). Such an id never reaches a session
actor and never becomes a path: the request pipeline sends it to these host
handlers (a route's ``native=`` handler) and the catalog resolves it by lookup
in its listing of the root. Every method without a native handler refuses it
with ``UNSUPPORTED_FOR_NATIVE_SESSION``.

* ``session.list`` merges the native summaries (``source: "native-pi"``,
  ``native: {version, readOnly}``) into the host's page, in the same order
  (``updatedAt`` then id, newest first) and under the same cursor;
* ``session.get`` reads an immutable byte snapshot and follows the current branch;
* ``session.fork`` writes exactly one new v3 child in the parent's directory
  (``store/interchange/native_pi.py``'s checked publication). With a receipt key the child's
  id is derived from the key, so a retry after a crash finds the child it wrote
  instead of writing another (idempotent by construction); the answer is then
  committed with the receipt row.
"""

from __future__ import annotations

import uuid
from typing import Any

from protocol import models as m
from runtime.context import HostContext
from store.ids import derived_id
from store.indexing import cursors, index
from store.interchange.native_pi_views import NativeCatalog, native_summary, native_window
from store.receipts import ReceiptKey

from .plugin_imports import scope_session
from .sessions import window_request

__all__ = ["fork", "get", "list_sessions"]

SERVICE = "native"


def _catalog(ctx: HostContext) -> NativeCatalog:
    catalog: NativeCatalog = ctx.services.get(SERVICE)
    return catalog


async def list_sessions(ctx: HostContext, p: m.SessionListParams, key: ReceiptKey | None) -> Any:
    """The host's sessions and the native ones, one order, one cursor (a plugin sees only its own imports)."""
    await ctx.services.index_barrier()
    fp = cursors.session_list_fingerprint(p.project_id)
    after_raw = cursors.decode_cursor(p.cursor, cursors.SESSION_LIST_KIND, fp, (int, str)) if p.cursor else None
    after = (int(after_raw[0]), str(after_raw[1])) if after_raw else None
    plugin = ctx.caller.plugin_id
    items, more, damaged = await ctx.read(lambda conn: index.list_sessions(conn, limit=p.limit, cursor=after,
                                                                 project_id=p.project_id, owner_plugin=plugin,
                                                                 now_ms=ctx.now()))
    page = [index.public_session(r) for r in items]
    catalog = _catalog(ctx)
    if plugin is None and p.project_id is None and catalog.root is not None:
        listing = await ctx.in_thread(catalog.listing)
        page += [s for s in listing.sessions if after is None or (s["updatedAt"], s["id"]) < after]
        page.sort(key=lambda s: (s["updatedAt"], s["id"]), reverse=True)
    has_more = more is not None or len(page) > p.limit
    page = page[: p.limit]
    nxt = [page[-1]["updatedAt"], page[-1]["id"]] if has_more and page else None
    out: dict[str, Any] = {"sessions": page,
                           "nextCursor": cursors.encode_cursor(cursors.SESSION_LIST_KIND, fp, nxt) if nxt else None}
    listed = {s["id"] for s in page}
    if unreadable := [sid for sid in damaged if sid in listed]:
        out["unreadableThreads"] = unreadable  # listed without their thread metadata (its record is damaged)
    return out


async def get(ctx: HostContext, p: m.SessionGetParams, key: ReceiptKey | None) -> Any:
    await scope_session(ctx.read, ctx.caller, p.session_id)  # a plugin owns no native session
    req = window_request(p, ctx.caller.client_kind)
    catalog = _catalog(ctx)
    # the window's records (up to a whole-history read) are built in the hop that reads the snapshot, not
    # on the trio loop
    return await ctx.in_thread(lambda: native_window(catalog.get(p.session_id), req))


def child_uuid(key: ReceiptKey) -> str:
    """The native child's id for a fork with a receipt key (a retry finds the same child)."""
    raw = bytes.fromhex(derived_id("native-fork", key.client_id, key.submission_id))
    return str(uuid.UUID(bytes=raw, version=4))


async def fork(ctx: HostContext, p: m.ForkParams, key: ReceiptKey | None) -> Any:
    catalog, now = _catalog(ctx), ctx.now()
    cid = child_uuid(key) if key is not None else None
    child = await ctx.in_thread(lambda: catalog.fork(p.session_id, now_ms=now, through_message_id=p.through_message_id,
                                                     title=p.title, child_uuid=cid))
    result = native_summary(child.summary)
    if key is not None:
        result = await ctx.commit(lambda conn: result)
    ctx.publish("session.created", {"session": result})
    return result
