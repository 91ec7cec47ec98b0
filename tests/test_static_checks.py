"""The code base stays ruff- and mypy-clean.

Both tools run from the repository root with the configuration in
``pyproject.toml`` (``[tool.ruff]``, ``[tool.mypy]``), exactly as a developer
would run them: ``python -m ruff check`` and ``python -m mypy``. The tools come
with the ``test`` extra. mypy keeps its incremental cache in ``.mypy_cache``
(gitignored), so only the first run checks everything from scratch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _report(proc: subprocess.CompletedProcess[str]) -> str:
    return f"{' '.join(proc.args[2:])} exited {proc.returncode}\n{proc.stdout}{proc.stderr}"


def test_ruff_finds_nothing() -> None:
    proc = _run("ruff", "check", "--output-format", "concise")
    assert proc.returncode == 0, _report(proc)
    assert "All checks passed" in proc.stdout, _report(proc)


def test_mypy_strict_finds_nothing() -> None:
    proc = _run("mypy")
    assert proc.returncode == 0, _report(proc)
    assert proc.stdout.startswith("Success: no issues found"), _report(proc)
