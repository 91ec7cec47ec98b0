"""The CLI commands that only a running host answers: ``settings``, ``providers``, ``models``, ``import``,
``export``.

:mod:`runtime.cli` imports this module when one of them runs; ``import`` and ``export`` bring their own
modules (:mod:`runtime.import_cli`, :mod:`runtime.export_cli`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from typing import Any

import trio

from runtime.cli_client import EXIT_ERROR, EXIT_NO_HOST, find_host, print_error, print_rpc_error
from runtime.client import ClientClosed, HostClient, RpcError, open_client, read_host_info
from runtime.datadir import DataDir
from runtime.export_cli import run_export
from runtime.import_cli import resolve_root, run_import
from store.attachments import BUDGET_SETTING, DEFAULT_BUDGET_BYTES, DEFAULT_GRACE_MS, GRACE_SETTING
from store.config.settings_rules import APP_FIELDS, APP_NS, HOST_OWNED_APP_KEYS
from store.rules import MAX_JSON_DEPTH

__all__ = ["run_host_command"]


def run_host_command(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    """One of this module's commands on the running host (exit 2 when none runs)."""
    if command == "import":
        if args.path == "":  # an unset "$DIR": Path("") is the current folder, which nobody asked to import
            print(f"pi-host: import {args.source}: PATH is empty (leave it out for {args.source}'s usual folder)",
                  file=sys.stderr)
            return EXIT_NO_HOST  # import's exit for a root that is missing or unusable (runtime.import_cli)
        args.root = resolve_root(args.source, args.path)
    if command == "export" and args.out is not None:
        args.out = os.path.abspath(args.out)
    return trio.run(_on_host, command, args, data_dir)


async def _on_host(command: str, args: argparse.Namespace, data_dir: DataDir) -> int:
    state = find_host(data_dir)
    if not state.running:
        print(f"pi-host: {state.problem}", file=sys.stderr)
        return EXIT_NO_HOST
    try:
        info = read_host_info(data_dir.root)
        async with open_client(info.url, info.token, client_id=f"cli-{os.getpid()}", client_kind="cli") as c:
            if command == "import":
                return await run_import(c, args.source, args.root, dry_run=args.dry_run, as_json=args.json,
                                        out=sys.stdout)
            if command == "export":
                return await run_export(c, args.session, fmt=args.format, out_file=args.out,
                                        include_thinking=args.include_thinking,
                                        include_secrets=args.include_secrets, out=sys.stdout)
            return await _config_command(c, command, args)
    except RpcError as exc:
        print_rpc_error(exc)
        return EXIT_ERROR
    except BrokenPipeError:
        raise  # our reader went away (`| head -1`), not the host: runtime.cli.main ends quietly (141)
    except (ClientClosed, OSError) as exc:
        print(f"pi-host: the host did not answer ({exc})", file=sys.stderr)
        return EXIT_NO_HOST


def _json_arg(text: str) -> Any:
    """A JSON value; anything that is not JSON is taken as a string (``set language en``). ``NaN`` and
    ``[-]Infinity`` are not JSON either (Python's parser takes them as floats, which the wire would carry as
    ``null``): they are words too."""
    try:
        return json.loads(text, parse_constant=_not_json)
    except ValueError:
        return text


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


DOCUMENTED_DEFAULTS: dict[str, Any] = {BUDGET_SETTING[1]: DEFAULT_BUDGET_BYTES, GRACE_SETTING[1]: DEFAULT_GRACE_MS}
"""App fields whose default README's settings table names, which ``settings.get`` leaves out when they are not set
(the host reads them where they are used, :mod:`store.attachments`); the seed's own defaults the host answers."""


def _not_set(ns: str, key: str) -> int:
    """``settings get KEY`` of a key that is not set and has no default: one line on stderr, exit 1 (``null`` on
    stdout and exit 0 read as a key set to null). A key of ``app`` pi-host does not know is said so, with the
    known field it is close to (a typo of one)."""
    line = f"pi-host: NOT_SET: {ns} setting {key} is not set"
    if ns == APP_NS:
        known = sorted({*APP_FIELDS, *HOST_OWNED_APP_KEYS})
        if key in known:
            line += " (it has no default)"
        else:
            close = difflib.get_close_matches(key, known, n=1)
            line += " and is not one pi-host knows" + (f" (did you mean {close[0]}?)" if close else "")
    print(line, file=sys.stderr)
    return EXIT_ERROR


async def _get_setting(c: HostClient, args: argparse.Namespace) -> int:
    got = await c.call("settings.get", {"ns": args.ns, "key": args.key})
    if got.get("unreadable"):
        print(f"pi-host: the stored {args.ns} settings are damaged; showing the defaults (pi-host doctor --repair "
              "sets the damaged bytes aside)", file=sys.stderr)
    if "value" in got:  # a stored null is a value: the host leaves "value" out only for a key that is not set
        _print(got["value"])
    elif args.ns == APP_NS and args.key in DOCUMENTED_DEFAULTS:
        _print(DOCUMENTED_DEFAULTS[args.key])
    else:
        return _not_set(args.ns, args.key)
    return 0


async def _config_command(c: HostClient, command: str, args: argparse.Namespace) -> int:
    if command == "settings":
        if args.verb == "get" and args.key is None:
            got = await c.call("settings.getAll", {"ns": args.ns})
            if got.get("unreadable"):
                print(f"pi-host: unreadable (damaged) and left out: {', '.join(got['unreadable'])} (pi-host doctor "
                      "--repair sets the damaged bytes aside)", file=sys.stderr)
            _print(got["values"])
        elif args.verb == "get":
            return await _get_setting(c, args)
        elif args.verb == "set":
            try:
                value = _json_arg(args.value)
            except RecursionError:  # nested past the parser's recursion limit: what the host says of 65 levels
                print_error("PARSE_ERROR", f"invalid JSON: nesting deeper than {MAX_JSON_DEPTH} (VALUE; nothing "
                            "was sent)", {})
                return EXIT_ERROR
            res = await c.call("settings.set", {"ns": args.ns, "key": args.key, "value": value})
            _print(res.get("value"))
        else:
            res = await c.call("settings.delete", {"ns": args.ns, "key": args.key})
            print("deleted" if res["deleted"] else "not set")
    elif command == "providers":
        listed = await c.call("providers.list", {})
        if args.json:
            _print(listed)
            return 0
        for p in listed["providers"]:
            key = "key set" if p["hasApiKey"] else "no key"
            owner = f"  (plugin {p['ownerPluginId']})" if p.get("ownerPluginId") else ""
            state = "" if p["enabled"] else "  disabled"
            print(f"{p['id']}  {p['name']}  {p.get('baseUrl') or '-'}  {key}{state}{owner}")
        if not listed["providers"]:
            print("no providers", file=sys.stderr)
    else:
        params = {"providerId": args.provider} if args.provider else {}
        catalog = await c.call("models.list", params)
        if args.json:
            _print(catalog)
            return 0
        for mdl in catalog["models"]:
            flags = " deprecated" if mdl["deprecated"] else ""
            print(f"{mdl['providerId']}/{mdl['modelId']}  {mdl['displayName']}  [{mdl['source']}]{flags}")
        if not catalog["models"]:
            print(f"no models of provider {args.provider}" if args.provider else "no models", file=sys.stderr)
    return 0


def _print(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))
