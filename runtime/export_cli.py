"""``pi-host export SESSION [--format md|html|jsonl] [--out FILE] [--include-thinking] [--include-secrets]``.

The running host writes the export (``session.export``): with ``--out`` to a new
file (never over an existing one), else inline to stdout. Secrets and thinking
are left out unless asked. ``SESSION`` may be a native pi session (``native-pi:...``).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from runtime.client import HostClient

__all__ = ["run_export"]


async def run_export(client: HostClient, session: str, *, fmt: str, out_file: str | None, include_thinking: bool,
                     include_secrets: bool, out: TextIO) -> int:
    params: dict[str, Any] = {"sessionId": session, "format": fmt, "includeThinking": include_thinking,
                              "includeSecrets": include_secrets}
    if out_file is not None:
        params["outPath"] = out_file
    result = await client.call("session.export", params)
    if out_file is not None:
        print(f"exported {result['messages']} messages ({result['bytes']} bytes, {result['redactions']} "
              f"redaction(s)) to {result['path']}", file=sys.stderr)
        return 0
    out.write(result["content"])
    out.flush()
    return 0
