"""``pi-host types --out DIR``: the protocol's TypeScript types and JSON Schema for a UI project (issue 25 item 4).

Reproduces: "the types cannot be had outside the repository" — a UI project had to copy
``clients/typescript/src/protocol.ts`` out of a checkout. The command writes the files the
installed package ships (``tests/packaging/test_wheel.py`` runs it from the built wheel).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.hostkit import REPO

COMMITTED = {"protocol.ts": REPO / "clients" / "typescript" / "src" / "protocol.ts",
             "schema.json": REPO / "protocol" / "schema.json"}


def types(out: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["PYTHONPATH"] = str(REPO)  # run from outside the repository
    return subprocess.run([sys.executable, "-m", "runtime.cli", "types", "--out", str(out)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_writes_the_committed_types_and_schema_into_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "ui" / "src" / "pihost"
    done = types(out, tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["protocol.ts", "schema.json"]  # no temporary left behind
    for name, committed in COMMITTED.items():
        assert (out / name).read_bytes() == committed.read_bytes(), name
    assert done.stdout.split() == [str(out / "protocol.ts"), str(out / "schema.json")]
    assert "protocol 1" in done.stderr


def test_a_second_run_replaces_the_two_files_and_leaves_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "types"
    out.mkdir()
    (out / "protocol.ts").write_text("// an older protocol\n")
    (out / "index.ts").write_text("export * from './protocol';\n")
    done = types(Path("types"), tmp_path)  # a relative DIR is the caller's
    assert done.returncode == 0, done.stderr
    assert (out / "protocol.ts").read_bytes() == COMMITTED["protocol.ts"].read_bytes()
    assert (out / "index.ts").read_text() == "export * from './protocol';\n"


def test_an_unwritable_folder_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = types(blocker / "types", tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("pi-host types: cannot write to") and "Traceback" not in done.stderr


def test_the_packaged_types_are_the_generated_client_file() -> None:
    """protocol/protocol.ts (package data) is a link to the generated file: one source, no copy to drift."""
    link = REPO / "protocol" / "protocol.ts"
    assert link.is_symlink() and link.resolve() == COMMITTED["protocol.ts"].resolve()
