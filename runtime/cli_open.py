"""``pi-host open``: the browser inspector, logged in with a one-time code.

The host issues a code (``host.createLoginCode``, valid once for 60 s); the
URL carries it in its fragment, which a browser never sends to a server; the
page exchanges it for the token over ``POST /login`` and removes it from
the address bar at once.
"""

from __future__ import annotations

import os
import sys
import webbrowser

import trio

from runtime.cli_client import EXIT_ERROR, EXIT_NO_HOST, find_host, print_rpc_error
from runtime.client import ClientClosed, RpcError, open_client, read_host_info
from runtime.datadir import DataDir

__all__ = ["open_inspector"]


async def _login_url(data_dir: DataDir) -> str:
    info = read_host_info(data_dir.root)
    async with open_client(info.url, info.token, client_id=f"cli-open-{os.getpid()}", client_kind="cli") as c:
        result = await c.call("host.createLoginCode", {})
    return str(result["url"])


def open_inspector(data_dir: DataDir, *, print_only: bool) -> int:
    state = find_host(data_dir)
    if not state.running:
        print(f"pi-host: {state.problem}", file=sys.stderr)
        return EXIT_NO_HOST
    try:
        url = trio.run(_login_url, data_dir)
    except RpcError as exc:
        print_rpc_error(exc)
        return EXIT_ERROR
    except (ClientClosed, OSError) as exc:
        print(f"pi-host: the host did not answer ({exc})", file=sys.stderr)
        return EXIT_NO_HOST
    if print_only or not webbrowser.open(url):
        print(url)
    else:
        print("pi-host: opened the inspector in your browser (the login code works once, for 60 s)")
    return 0
