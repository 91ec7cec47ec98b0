"""The typed client, as a type checker in the project's own venv sees it.

Reproduces issue 25's "type checkers cannot see the typed client": the
default editable install is an import hook that mypy and pyright do not run
("Cannot find implementation or library stub for module named
pihost_client"), and ``pihost_client.types`` was an attribute, not a module,
so ``from pihost_client.types import SessionSummary`` failed. Here strict mypy
checks a snippet from a folder outside the repository with the venv's
interpreter, as an app developer's project would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GOOD = '''
import anyio
from pihost_client import HostRefused, connect
from pihost_client.types import SessionSummary


def title(s: SessionSummary) -> str:
    return s["title"] or s["id"]


async def main() -> None:
    try:
        async with connect(data_dir="/tmp/nowhere", client_id="typed") as c:
            page = await c.session.list(limit=5)
            print([title(s) for s in page["sessions"]])
    except HostRefused as exc:
        print(exc.code)


anyio.run(main)
'''

BAD = '''
from pihost_client.types import SessionSummary


def count(s: SessionSummary) -> int:
    return s["messageCountThatDoesNotExist"]
'''


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    app = tmp_path / "app.py"
    app.write_text(source, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--cache-dir", str(tmp_path / ".mypy_cache"), str(app)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_the_types_module_imports() -> None:
    """Issue 25: ``pihost_client.types`` is a module with the generated wire types."""
    from pihost_client import types
    from pihost_client.types import SessionSummary, UiMessage

    assert types.SessionSummary is SessionSummary and "seq" in UiMessage.__annotations__


def test_mypy_sees_the_typed_client_from_outside_the_repository(tmp_path: Path) -> None:
    """Issue 25: strict mypy, run from another folder with the venv's interpreter, finds pihost_client and its
    types (py.typed, a path-based install) and catches a key the protocol does not have."""
    for name in ("good", "bad"):
        (tmp_path / name).mkdir()
    good = _mypy(tmp_path / "good", GOOD)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path / "bad", BAD)
    assert bad.returncode == 1 and "messageCountThatDoesNotExist" in bad.stdout, bad.stdout + bad.stderr
