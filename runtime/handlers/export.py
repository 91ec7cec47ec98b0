"""``session.export`` (seed 003 §10.4): Markdown, one self-contained HTML page, or this host's JSONL.

A host session is exported inside its actor (the index covers the transcript,
and no append lands halfway), streamed window by window in the actor's worker
thread (``store/interchange/export.py``). A native pi session (``native-pi:...``) is
exported from an immutable snapshot of its file (``store/interchange/native_pi_views.py``).

Secrets are excluded by default: every value the secret store holds, the host's
own bearer token (by its exact value, read from ``host.token``), credential
references and secret-named values are redacted; ``includeSecrets`` turns that
off (refused to plugins). The export is answered inline up to
``MAX_EXPORT_INLINE_BYTES``, or written to a new file ``outPath`` (temp file in
its directory, fsync, hard link: never over an existing file; refused to plugins,
whose writes stay within what they own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from actors.session_context import SessionContext
from protocol import models as m
from runtime.context import HostContext
from store.errors import PermissionDenied
from store.interchange.export import (
    ExportOptions,
    ExportReport,
    InlineBuffer,
    export_session,
    export_to_new_file,
    host_token,
    secret_values,
)
from store.interchange.native_pi_views import NativeCatalog, export_native
from store.receipts import ReceiptKey
from store.rules import MAX_EXPORT_INLINE_BYTES

from .plugin_imports import scope_session

__all__ = ["export", "export_native_session"]

VAULT = "vault"
BLOBS = "blobs"
NATIVE = "native"


def _options(p: m.SessionExportParams, caller_plugin: str | None, secrets: tuple[str, ...], blobs: Any,
             now_ms: int) -> ExportOptions:
    if p.include_secrets and caller_plugin is not None:
        raise PermissionDenied("includeSecrets is not available to plugins", data={"field": "includeSecrets"})
    if p.out_path is not None and caller_plugin is not None:
        # a file where the user may write is not the plugin's: it gets the export inline
        raise PermissionDenied("outPath is not available to plugins (the export is answered inline)",
                               data={"field": "outPath"})
    return ExportOptions(format=p.format, include_thinking=p.include_thinking, include_secrets=p.include_secrets,
                         secret_values=() if p.include_secrets else secrets,
                         attachments=blobs.files if blobs is not None else None, exported_at_ms=now_ms)


def _deliver(p: m.SessionExportParams, produce: Callable[[BinaryIO], ExportReport]) -> dict[str, Any]:
    """Run ``produce`` into the inline buffer or the new file; the wire result."""
    if p.out_path is not None:
        path = Path(p.out_path)
        report = export_to_new_file(path, produce)
        return {**report.to_dict(), "path": str(path)}
    buffer = InlineBuffer(MAX_EXPORT_INLINE_BYTES)
    report = produce(buffer)
    return {**report.to_dict(), "content": buffer.getvalue().decode("utf-8")}


async def _secrets(read: Callable[..., Any], services: Any, include: bool) -> tuple[str, ...]:
    """The values to redact: the secret store's and the host's own token (read in the reader's thread)."""
    if include:
        return ()
    vault = services.get(VAULT)
    token_path = services.data_dir.token_path
    values: tuple[str, ...] = await read(lambda conn: (*secret_values(conn, vault.store), *host_token(token_path)))
    return values


async def export(ctx: SessionContext, p: m.SessionExportParams, key: ReceiptKey | None) -> Any:
    await scope_session(ctx.read, ctx.caller, ctx.sid)
    services = ctx.services
    values = await _secrets(ctx.read, services, p.include_secrets)
    options = _options(p, ctx.caller.plugin_id, values, services.get(BLOBS), ctx.now())
    options = replace(options, review_dir=ctx.paths.review_changes)  # a JSONL export carries its snapshots
    sid, path = ctx.sid, ctx.paths.transcript

    def run(conn: Any) -> dict[str, Any]:
        return _deliver(p, lambda out: export_session(conn, path, sid, out, options))

    return await ctx.io_with_reader(run)


async def export_native_session(ctx: HostContext, p: m.SessionExportParams, key: ReceiptKey | None) -> Any:
    await scope_session(ctx.read, ctx.caller, p.session_id)  # a plugin owns no native session
    services = ctx.services
    catalog: NativeCatalog = services.get(NATIVE)
    values = await _secrets(ctx.read, services, p.include_secrets)
    options = _options(p, ctx.caller.plugin_id, values, services.get(BLOBS), ctx.now())
    session = await ctx.in_thread(catalog.get, p.session_id)
    return await ctx.in_thread(lambda: _deliver(p, lambda out: export_native(session, out, options)))
