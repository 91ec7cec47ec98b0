"""The session registry checks an id where it builds the actor (not per request): an id that is not a
session id is refused with ``INVALID_ID`` and leaves no actor (nor a supervisor child) behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.errors import InvalidId
from tests.hostkit import inprocess_host


@pytest.mark.parametrize("sid", ["../escape", "a/b", "", "x" * 65])
async def test_an_invalid_session_id_starts_no_actor(tmp_path: Path, sid: str) -> None:
    async with inprocess_host(tmp_path) as host:
        with pytest.raises(InvalidId):
            await host.registry.ref(sid)
        assert not host.registry.running(sid)
        assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").glob("*escape*"))


async def test_a_valid_id_runs_one_actor_and_each_ref_finds_it(tmp_path: Path) -> None:
    async with inprocess_host(tmp_path) as host:
        first = await host.registry.ref("s1")
        again = await host.registry.ref("s1")
        assert host.registry.running("s1")
        assert first.current() is again.current() is not None
