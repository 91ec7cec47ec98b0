"""Shared fixtures: the schema export script, loaded as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "export_schema.py"


@pytest.fixture(scope="session")
def export_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_schema", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
