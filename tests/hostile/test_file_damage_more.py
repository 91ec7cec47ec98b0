"""Damage to the host's own files, continued from test_file_damage.py (which says what is checked and how):
the cases of its CASES after HALF, and every kind of file damaged with the index lost too. A module runs
whole on one worker (``--dist loadfile``); the parts of the damage sweep run side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import test_file_damage as fd
from tests.hostile.test_file_damage import template  # noqa: F401  (the module's fixture, built here too)


@pytest.mark.parametrize(("kind", "damage", "seed"), fd.CASES[fd.HALF:])
async def test_a_file_damaged_between_two_hosts(tmp_path: Path, template: tuple[Path, dict[str, str]],  # noqa: F811
                                                kind: str, damage: str, seed: int) -> None:
    await fd.test_a_file_damaged_between_two_hosts(tmp_path, template, kind, damage, seed)


@pytest.mark.parametrize(("kind", "damage"), fd.INDEX_LOST_CASES)
async def test_a_file_damaged_and_the_index_lost(tmp_path: Path, template: tuple[Path, dict[str, str]],  # noqa: F811
                                                 kind: str, damage: str) -> None:
    """The damage, and the index gone too (RELIABILITY row 8): the boot rebuilds the index from the files,
    the damaged one among them, which is the path that reads every file from its first byte."""
    await fd.a_file_damaged_and_the_index_lost(tmp_path, template, kind, damage)
