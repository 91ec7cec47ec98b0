"""The import layering between ``protocol/`` and ``store/`` (issue 22).

The rules both need (id patterns, limits, credential detection) live in one bottom
module, ``store/rules.py``, that imports nothing of the project. ``store/`` never
imports ``protocol/`` (storage knows nothing of the wire); ``protocol/`` imports from
``store/`` only that bottom module. Every import counts, at any depth (a function-level
import is still a dependency); relative imports are resolved first.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROJECT = ("runtime", "actors", "protocol", "store", "clients", "scripts", "tests")
BOTTOM = "store.rules"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``; ``from m import a`` also yields ``m.a``."""
    return _imports_in(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _imports_in(text: str, name: str, *, is_package: bool) -> list[tuple[int, str]]:
    package = name if is_package else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(text, name)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            found.append((node.lineno, module))
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _is(module: str, top: str) -> bool:
    return module == top or module.startswith(top + ".")


def _sources(top: str) -> list[Path]:
    return sorted((REPO / top).rglob("*.py"))


def test_store_never_imports_protocol() -> None:
    bad = [f"{p.relative_to(REPO)}:{line}: {m}" for p in _sources("store") for line, m in _imports(p)
           if _is(m, "protocol")]
    assert bad == [], "store/ imports protocol/ (move the shared rule into store/rules.py):\n" + "\n".join(bad)


def test_protocol_imports_only_the_bottom_module_of_store() -> None:
    bad = [f"{p.relative_to(REPO)}:{line}: {m}" for p in _sources("protocol") for line, m in _imports(p)
           if _is(m, "store") and not _is(m, BOTTOM) and m != "store"]
    assert bad == [], f"protocol/ imports store/ beyond {BOTTOM}:\n" + "\n".join(bad)


def test_the_bottom_module_imports_nothing_of_the_project() -> None:
    path = REPO / "store" / "rules.py"
    bad = [f"{line}: {m}" for line, m in _imports(path) if any(_is(m, top) for top in PROJECT)]
    assert bad == [], "store/rules.py must import only the standard library:\n" + "\n".join(bad)


def test_the_checker_sees_every_kind_of_import() -> None:
    """The checker itself: plain, from, relative and function-level imports are all found."""
    text = ("import protocol.methods\nfrom . import sibling\nfrom ..errors import StoreError\n"
            "def f() -> None:\n    from protocol.errors import RpcErrorCode\n")
    got = [m for _line, m in _imports_in(text, "store.indexing.probe", is_package=False)]
    assert got == ["protocol.methods", "store.indexing", "store.indexing.sibling", "store.errors",
                   "store.errors.StoreError", "protocol.errors", "protocol.errors.RpcErrorCode"]
    assert _module_name(REPO / "store" / "__init__.py") == "store"
    assert any(_is(m, "store") for _line, m in _imports(REPO / "store" / "ids.py"))
