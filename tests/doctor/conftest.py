"""The doctor tests' data directory: one template a real host wrote, built once per module, copied per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.datadir import DataDir
from tests.doctor.doctorkit import build_template, copy_dir


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_template(tmp_path_factory.mktemp("doctor") / "template")


@pytest.fixture
def data(template: Path, tmp_path: Path) -> DataDir:
    return copy_dir(template, tmp_path / "data")
