"""RELIABILITY.md row 7 over the whole route table, the second half of test_index_damage_routes.py (which
says what is checked and how): the cases of its INDEX_DAMAGE after SPLIT, and a JSON column that does not
parse. A module runs whole on one worker (``--dist loadfile``): the two halves run side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integrity.test_index_damage_routes import (
    INDEX_DAMAGE,
    SPLIT,
    every_method_after,
    every_method_case,
    internal_in_log,
)


@pytest.mark.parametrize(("kind", "seed", "scope"), INDEX_DAMAGE[SPLIT:])
async def test_every_method_meeting_a_damaged_index_answers_corrupt_data_and_the_host_rebuilds(
        tmp_path: Path, kind: str, seed: int, scope: str) -> None:
    """Whichever method meets the damage answers CORRUPT_DATA (or its connection closes while the host
    starts again on a rebuilt index), never INTERNAL; the host serves again without anyone restarting it."""
    await every_method_case(tmp_path, kind, seed, scope)


@pytest.mark.parametrize("kind", ["json", "json-shape"])
async def test_a_json_column_that_does_not_parse_is_corrupt_data_of_that_record(tmp_path: Path, kind: str) -> None:
    """The host writes only valid JSON into its JSON columns (tasks' config, turns' usage, an import's
    origin, the queue's attachments, providers, settings ...): bad JSON read back is damage of that record,
    CORRUPT_DATA for a method that needs that record, never INTERNAL; a listing answers around it. The index
    is not quarantined for it: most of these tables are state only the database holds, which a rebuild from
    the transcripts would lose (ARCHITECTURE.md "Durability"). The same for valid JSON of another shape than
    the host wrote (a string where it wrote an object or a list)."""
    hosts, answers = await every_method_after(tmp_path, kind, 0)
    codes = [(m, c) for h in hosts for m, c in h.codes]
    assert [mc for mc in codes if mc[1] == "INTERNAL"] == [], codes
    for h in hosts:
        assert internal_in_log(h.data) == []
        assert not list((h.data / "quarantine").glob("pi.sqlite.corrupt-*")), "no rebuild for one record"
    # the damaged record fails alone: the writes after it commit (no statement of a failed read left open on
    # the DB writer's connection: its old snapshot made every later commit "database is locked")
    assert [mc for mc in codes if mc[1] == "IO_ERROR"] == [], [s for h in hosts for s in h.said]
    said = dict(answers)
    for method in ("tasks.get", "tasks.update", "session.queueTake", "approvals.respond", "interactions.respond"):
        assert said[method] == "CORRUPT_DATA", (method, answers)
    # a listing leaves the damaged record out and names it in `unreadable` (tests/integrity/
    # test_damaged_listings.py): the records that read still list
    for method in ("tasks.list", "session.listTurns", "plugins.listSessions", "approvals.pending",
                   "interactions.pending"):
        assert said[method] == "ok", (method, answers)
