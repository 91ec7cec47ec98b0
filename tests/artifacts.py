"""Where tests leave what a person would look at (screenshots, terminal captures): ``test-artifacts/``.

The directory is gitignored; ``PIHOST_TEST_ARTIFACTS`` moves it (CI can collect it from there).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def artifact_dir(name: str) -> Path:
    root = Path(os.environ.get("PIHOST_TEST_ARTIFACTS") or REPO / "test-artifacts")
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path
