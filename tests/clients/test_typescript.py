"""The TypeScript package type-checks: generated types + client + example (``tsc --noEmit``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def _tsc() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Node.js is not installed on this machine: the TypeScript check needs node and npm")
    tsc = PKG / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PKG, check=True, capture_output=True,
                       timeout=300)
    return tsc


def test_example_compiles_against_generated_types() -> None:
    proc = subprocess.run([str(_tsc()), "--noEmit", "-p", "tsconfig.json"], cwd=PKG, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tsc_rejects_a_field_the_protocol_does_not_have(tmp_path: Path) -> None:
    """The check has teeth: reading a result field that does not exist fails to compile."""
    tsc = _tsc()
    bad = PKG / "examples" / "_bad_check.ts"
    bad.write_text(
        'import type { ResultOf, UiMessage } from "../src/protocol.js";\n'
        'export function f(r: ResultOf<"session.get">, m: UiMessage): number {\n'
        "  return r.messages.length + m.positionThatDoesNotExist;\n}\n", encoding="utf-8")
    try:
        proc = subprocess.run([str(tsc), "--noEmit", "-p", "tsconfig.json"], cwd=PKG, capture_output=True,
                              text=True, timeout=300)
    finally:
        bad.unlink()
    assert proc.returncode != 0
    assert "positionThatDoesNotExist" in proc.stdout
