"""The wire models are built on first use (``WireModel``'s ``defer_build``); ``protocol.models.build_all`` builds
every one (``pi-host serve`` runs it before boot)."""

from __future__ import annotations

import subprocess
import sys

from tests.hostkit import REPO

_PROBE = """
from pydantic import BaseModel
import protocol.models as m
import protocol.methods
wire = [c for c in vars(m).values()
        if isinstance(c, type) and issubclass(c, BaseModel) and c.__module__.startswith("protocol.")]
before = sum(1 for c in wire if c.__pydantic_complete__)
built = m.build_all()
after = [c.__name__ for c in wire if not c.__pydantic_complete__]
print(len(wire), before, built, after, m.build_all())
"""


def test_importing_builds_no_wire_model_and_build_all_builds_every_one() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    count, before, built, left, again = done.stdout.strip().split(" ", 4)
    assert int(count) > 300 and int(before) == 0, done.stdout
    assert int(built) >= int(count) and left == "[]" and again == "0", done.stdout
