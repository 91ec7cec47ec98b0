"""Damage to the host's own files under a serving host, continued from test_file_damage.py (which says what
is checked and how). A module runs whole on one worker (``--dist loadfile``); the parts of the damage sweep
run side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import test_file_damage as fd
from tests.hostile.test_file_damage import template  # noqa: F401  (the module's fixture, built here too)


@pytest.mark.parametrize(("kind", "damage", "seed"), fd.SERVING_CASES)
async def test_a_file_damaged_under_a_serving_host(tmp_path: Path,
                                                   template: tuple[Path, dict[str, str]],  # noqa: F811
                                                   kind: str, damage: str, seed: int) -> None:
    """The same damage while a host serves (with a turn open and its checkpoint saved): the reads after it
    answer, or fail with a stable code; the host keeps serving the undamaged session; the next boot too."""
    await fd.a_file_damaged_under_a_serving_host(tmp_path, template, kind, damage, seed)
