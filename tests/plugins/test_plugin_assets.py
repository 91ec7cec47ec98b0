"""Plugin assets: validated, read-only, bounded, served to their plugin only.

Seed 000 §2: "plugins, pluginAssets | Plugin ownership and validated read-only assets".
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import RpcError
from store import plugin_assets as assets
from store.errors import InvalidInput, PayloadTooLarge
from store.rules import MAX_PLUGIN_ASSET_BYTES, MAX_PLUGIN_ASSETS, MAX_PLUGIN_ASSETS_TOTAL_BYTES
from tests.hostkit import client_for, inprocess_host
from tests.pipeline import probe

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24


def _asset(path: str, media_type: str, data: bytes) -> dict[str, Any]:
    return {"path": path, "mediaType": media_type, "dataBase64": base64.b64encode(data).decode()}


async def _err(call: Any) -> RpcError:
    with pytest.raises(RpcError) as exc:
        await call
    return exc.value


async def test_assets_install_with_the_plugin_and_are_served_to_their_plugin_only(tmp_path: Path) -> None:
    """Seed 000 §2: "plugins, pluginAssets | Plugin ownership and validated read-only assets". Assets arrive
    with the install (``plugins.register``), read back byte for byte through ``plugins.getAsset``; a plugin
    connection reaches only its own (another plugin's are PERMISSION_DENIED, and no plugin connection can
    install or replace assets); they survive a restart; a reinstall replaces the whole set; uninstall
    removes them."""
    data = tmp_path / "data"
    readme = b"# Acme tools\n"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            reg = await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1.0",
                                                     "assets": [_asset("icons/logo.png", "image/png", PNG),
                                                                _asset("README.md", "text/markdown", readme)]})
            assert [(a["path"], a["size"]) for a in reg["assets"]] == [("README.md", len(readme)),
                                                                       ("icons/logo.png", len(PNG))]
            await ui.call("plugins.register", {"pluginId": "beta", "name": "Beta", "version": "1.0",
                                               "assets": [_asset("m.json", "application/json", b"{}")]})
        async with inprocess_host(data) as host, client_for(host, "acme-rt", kind="plugin:acme") as acme, \
                client_for(host, "beta-rt", kind="plugin:beta") as beta, client_for(host, kind="ui") as ui:
            got = await acme.call("plugins.getAsset", {"path": "icons/logo.png"})  # its own id by default
            assert got["pluginId"] == "acme" and base64.b64decode(got["asset"]["dataBase64"]) == PNG
            listed = await acme.call("plugins.listAssets", {})
            assert [a["path"] for a in listed["assets"]] == ["README.md", "icons/logo.png"]
            assert "dataBase64" not in listed["assets"][0]
            state = probe.state(data)
            for call in (beta.call("plugins.getAsset", {"pluginId": "acme", "path": "README.md"}),
                         beta.call("plugins.listAssets", {"pluginId": "acme"}),
                         acme.call("plugins.getAsset", {"pluginId": "beta", "path": "m.json"}),
                         acme.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1.0",
                                                        "assets": []})):
                assert (await _err(call)).data_code == "PERMISSION_DENIED"
            assert probe.state(data) == state
            assert (await _err(acme.call("plugins.getAsset", {"path": "nope.png"}))).data_code == "NOT_FOUND"
            # the user's installer reads any plugin's assets (it installed them); it must name the plugin
            assert (await ui.call("plugins.getAsset", {"pluginId": "beta", "path": "m.json"}))["asset"]["size"] == 2
            assert (await _err(ui.call("plugins.listAssets", {}))).data_code == "INVALID_PARAMS"
            # a reinstall replaces the whole set
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "2.0",
                                               "assets": [_asset("icons/logo.png", "image/png", PNG + b"2")]})
            assert [a["path"] for a in (await acme.call("plugins.listAssets", {}))["assets"]] == ["icons/logo.png"]
            # a register without assets (an update of the entry) keeps them
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme tools", "version": "2.0"})
            assert len((await acme.call("plugins.listAssets", {}))["assets"]) == 1
            gone = await ui.call("plugins.uninstall", {"pluginId": "acme"})
            assert gone["assetsRemoved"] is True
            assert (await acme.call("plugins.listAssets", {}))["assets"] == []
            assert not (data / "plugins" / "assets" / "acme.json").exists()


async def test_bad_assets_are_refused_whole_and_nothing_is_installed(tmp_path: Path) -> None:
    """Seed 000 §2: "validated read-only assets". A bad path (``..``, hidden), a type outside the list (SVG,
    HTML: executable), bytes that are not what the type says, or a repeated path refuses the whole install
    with the field named: neither the registry entry nor any asset is written."""
    data = tmp_path / "data"
    bad = (
        (_asset("../x.png", "image/png", PNG), "INVALID_PARAMS"),
        (_asset(".hidden/x.png", "image/png", PNG), "INVALID_PARAMS"),
        (_asset("logo.svg", "image/svg+xml", b"<svg onload='x()'/>"), "INVALID_PARAMS"),
        (_asset("page.html", "text/html", b"<script>x()</script>"), "INVALID_PARAMS"),
        (_asset("logo.png", "image/png", b"<script>x()</script>"), "INVALID_PARAMS"),
        (_asset("m.json", "application/json", b"{not json"), "INVALID_PARAMS"),
        (_asset("a.txt", "text/plain", b"\xff\xfe binary"), "INVALID_PARAMS"),
        ({"path": "a.txt", "mediaType": "text/plain", "dataBase64": "%%%"}, "INVALID_PARAMS"),
    )
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            for asset, code in bad:
                err = await _err(ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                                              "assets": [asset]}))
                assert err.data_code == code, asset
                where = err.data.get("field") or err.data["errors"][0]["loc"]
                assert where.startswith("assets.0"), (asset, err.data)
            twice = [_asset("a.txt", "text/plain", b"one"), _asset("a.txt", "text/plain", b"two")]
            err = await _err(ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                                          "assets": twice}))
            assert (err.data_code, err.data["field"]) == ("INVALID_PARAMS", "assets.1.path")
            assert (await ui.call("plugins.list", {}))["plugins"] == []
            assert not (data / "plugins" / "assets").exists()


def test_asset_bounds(tmp_path: Path) -> None:
    """Seed 000 §2 plugin assets, bounded (store/rules.py): at most MAX_PLUGIN_ASSETS assets, each at most
    MAX_PLUGIN_ASSET_BYTES, all together at most MAX_PLUGIN_ASSETS_TOTAL_BYTES."""
    one = _asset("a.txt", "text/plain", b"x")
    with pytest.raises(InvalidInput):
        assets.validate_assets([{**one, "path": f"a{i}.txt"} for i in range(MAX_PLUGIN_ASSETS + 1)])
    with pytest.raises(PayloadTooLarge):
        assets.validate_assets([_asset("big.txt", "text/plain", b"x" * (MAX_PLUGIN_ASSET_BYTES + 1))])
    count = MAX_PLUGIN_ASSETS_TOTAL_BYTES // MAX_PLUGIN_ASSET_BYTES + 1
    with pytest.raises(PayloadTooLarge) as exc:
        assets.validate_assets([_asset(f"p{i}.txt", "text/plain", b"x" * MAX_PLUGIN_ASSET_BYTES)
                                for i in range(count)])
    assert exc.value.data["field"] == "assets"
    ok = assets.validate_assets([{**one, "path": f"a{i}.txt"} for i in range(MAX_PLUGIN_ASSETS)])
    assert len(ok) == MAX_PLUGIN_ASSETS


async def test_an_asset_changed_on_disk_is_corrupt_data_never_served(tmp_path: Path) -> None:
    """Seed 000 §2: "validated read-only assets" — read-only means what was validated at install is what is
    served: bytes changed behind the host's back fail their SHA-256 check (CORRUPT_DATA); a reinstall
    repairs them."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                               "assets": [_asset("a.txt", "text/plain", b"trusted")]})
        bundle = data / "plugins" / "assets" / "acme.json"
        doc = json.loads(bundle.read_text())
        doc["assets"][0]["dataBase64"] = base64.b64encode(b"swapped").decode()
        bundle.write_text(json.dumps(doc))
        async with inprocess_host(data) as host, client_for(host, "acme-rt", kind="plugin:acme") as acme, \
                client_for(host, kind="ui") as ui:
            assert (await _err(acme.call("plugins.getAsset", {"path": "a.txt"}))).data_code == "CORRUPT_DATA"
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                               "assets": [_asset("a.txt", "text/plain", b"trusted")]})
            got = await acme.call("plugins.getAsset", {"path": "a.txt"})
            assert base64.b64decode(got["asset"]["dataBase64"]) == b"trusted"


async def test_boot_removes_an_interrupted_asset_install(tmp_path: Path) -> None:
    """Seed 000 §2 "read-only assets", ARCHITECTURE "Boot removes stray temp files": an install killed
    between writing its temp file and the rename leaves the old set whole and its temp file is swept at
    the next boot (as is one of the registry's)."""
    data = tmp_path / "data"
    with trio.fail_after(60):
        async with inprocess_host(data) as host, client_for(host, kind="ui") as ui:
            await ui.call("plugins.register", {"pluginId": "acme", "name": "Acme", "version": "1",
                                               "assets": [_asset("a.txt", "text/plain", b"old")]})
        strays = [data / "plugins" / "assets" / "acme.json.tmp.0a1b2c", data / "plugins" / "registry.json.tmp.3d4e"]
        for stray in strays:
            stray.write_bytes(b'{"half": ')
        async with inprocess_host(data) as host, client_for(host, "acme-rt", kind="plugin:acme") as acme:
            assert not [s for s in strays if s.exists()]
            got = await acme.call("plugins.getAsset", {"path": "a.txt"})
            assert base64.b64decode(got["asset"]["dataBase64"]) == b"old"
