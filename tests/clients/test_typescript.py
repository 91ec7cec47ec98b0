"""The TypeScript package type-checks: generated types + client + example (``tsc --noEmit``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.clients.node_packages import ensure_node_modules

PKG = Path(__file__).resolve().parents[2] / "clients" / "typescript"
# The three checks share the package's node_modules (the first installs it): they stay in this one
# module, which ./scripts/test runs on one worker (--dist loadfile). A check file of its own goes to
# the test's temporary folder with a tsconfig extending the package's: the package is never written.


def _tsc() -> Path:
    return ensure_node_modules(PKG) / ".bin" / "tsc"


def _check_file(tsc: Path, tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """``tsc --noEmit`` over the package's sources plus ``source`` (importing ``@src/…``), in ``tmp_path``; the
    library declaration files are checked once, by :func:`test_example_compiles_against_generated_types`
    (``--skipLibCheck`` here: most of tsc's time, the same files every time)."""
    (tmp_path / "check.ts").write_text(source.replace("@src/", f"{(PKG / 'src').as_posix()}/"), encoding="utf-8")
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "extends": (PKG / "tsconfig.json").as_posix(),
        "include": [(PKG / "src").as_posix() + "/**/*.ts", "check.ts"],
    }), encoding="utf-8")
    return subprocess.run([str(tsc), "--noEmit", "--skipLibCheck", "-p", "tsconfig.json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_example_compiles_against_generated_types() -> None:
    proc = subprocess.run([str(_tsc()), "--noEmit", "-p", "tsconfig.json"], cwd=PKG, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tsc_rejects_a_field_the_protocol_does_not_have(tmp_path: Path) -> None:
    """The check has teeth: reading a result field that does not exist fails to compile."""
    tsc = _tsc()
    proc = _check_file(tsc, tmp_path,
        'import type { ResultOf, UiMessage } from "@src/protocol.js";\n'
        'export function f(r: ResultOf<"session.get">, m: UiMessage): number {\n'
        "  return r.messages.length + m.positionThatDoesNotExist;\n}\n")
    assert proc.returncode != 0
    assert "positionThatDoesNotExist" in proc.stdout


def test_blocks_narrow_on_their_type(tmp_path: Path) -> None:
    """Issue 25: ``b.type === "text"`` narrows a block to TextBlock (``UnknownBlock``'s ``type: string`` in the
    ``Block`` union swallowed every literal, so ``b.text`` stayed ``unknown``)."""
    tsc = _tsc()
    proc = _check_file(tsc, tmp_path,
        'import type { AnyBlock, Block, UiMessage } from "@src/protocol.js";\n'
        'import { isKnownBlock } from "@src/protocol.js";\n'
        "export function firstText(m: UiMessage): string | undefined {\n"
        '  for (const b of m.blocks) if (b.type === "text") return b.text;\n'
        "  return undefined;\n}\n"
        "export function toolNames(blocks: Block[]): string[] {\n"
        '  return blocks.flatMap((b) => (b.type === "tool_call" && b.name ? [b.name] : []));\n}\n'
        "export function unknownType(b: AnyBlock): string | null {\n"
        "  return isKnownBlock(b) ? null : b.type;\n}\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
