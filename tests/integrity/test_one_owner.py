"""Issue 22, item 1: no handler moves the index mark or writes transcript lines itself.

Lines enter a transcript only through ``SessionContext.append_lines`` (and whole files through
``SessionContext.rewrite_file``), whose index op moves the mark by compare-and-set. A handler
that reached for the mark, the index-row writers or the actor's file state directly would bring
back the bug where a plain UPDATE moved the mark over lines whose index op was lost.
"""

from __future__ import annotations

import ast
from pathlib import Path

HANDLERS = Path(__file__).resolve().parents[2] / "runtime" / "handlers"

# store functions that move a session's index mark or write its line-derived rows
MARK_WRITERS = {"set_index_mark", "index_messages", "reindex_session", "index_written", "index_compactions",
                "clear_session_index"}
# what SessionContext no longer offers handlers: the old ways to write lines and to touch the actor's state
GONE_FROM_CONTEXT = {"write_lines", "writer", "appended", "note_rewritten", "refresh_row", "index_later",
                     "_index_later", "write_durably", "adopt_row", "indexed_later", "rewritten"}


def _offences(tree: ast.AST) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
            if name in GONE_FROM_CONTEXT:  # ctx.write_lines(...), ctx.refresh_row() ...
                out.append(f"line {node.lineno}: {name}")
                continue
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.alias):
            name = node.name.rsplit(".", 1)[-1]
        if name in MARK_WRITERS:
            out.append(f"line {getattr(node, 'lineno', '?')}: {name}")
    return out


def test_no_handler_moves_the_index_mark_or_writes_lines_itself() -> None:
    """Reproduces issue 22's cause: nine handler sites wrote a line and then set the index mark with a
    plain UPDATE (``set_index_mark``), and others moved the actor's file state by hand."""
    assert len(list(HANDLERS.glob("*.py"))) > 20
    found = {path.name: offences for path in sorted(HANDLERS.glob("*.py"))
             if (offences := _offences(ast.parse(path.read_text(), str(path))))}
    assert found == {}


def test_the_checker_sees_a_direct_mark_write() -> None:
    code = ("from store.indexing import index\n"
            "def op(conn):\n    index.set_index_mark(conn, 's', 10, None)\n"
            "async def h(ctx):\n    await ctx.write_lines([b'x'])\n")
    assert _offences(ast.parse(code)) == ["line 3: set_index_mark", "line 5: write_lines"]
