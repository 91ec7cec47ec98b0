"""The TypeScript package type-checks: generated types + client + example (``tsc --noEmit``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "clients" / "typescript"
# The three checks share the package's node_modules (the first installs it) and its tsconfig, whose
# examples/ two of them add a file to while they check: they stay in this one module, which
# ./scripts/test runs on one worker (--dist loadfile).


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


def test_blocks_narrow_on_their_type() -> None:
    """Issue 25: ``b.type === "text"`` narrows a block to TextBlock (``UnknownBlock``'s ``type: string`` in the
    ``Block`` union swallowed every literal, so ``b.text`` stayed ``unknown``)."""
    tsc = _tsc()
    check = PKG / "examples" / "_narrow_check.ts"
    check.write_text(
        'import type { AnyBlock, Block, UiMessage } from "../src/protocol.js";\n'
        'import { isKnownBlock } from "../src/protocol.js";\n'
        "export function firstText(m: UiMessage): string | undefined {\n"
        '  for (const b of m.blocks) if (b.type === "text") return b.text;\n'
        "  return undefined;\n}\n"
        "export function toolNames(blocks: Block[]): string[] {\n"
        '  return blocks.flatMap((b) => (b.type === "tool_call" ? [b.name] : []));\n}\n'
        "export function unknownType(b: AnyBlock): string | null {\n"
        "  return isKnownBlock(b) ? null : b.type;\n}\n", encoding="utf-8")
    try:
        proc = subprocess.run([str(tsc), "--noEmit", "-p", "tsconfig.json"], cwd=PKG, capture_output=True,
                              text=True, timeout=300)
    finally:
        check.unlink()
    assert proc.returncode == 0, proc.stdout + proc.stderr
