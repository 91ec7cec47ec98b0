"""The filter of indexed message ids on a running host (``store/indexing/message_ids.py``): appends skip
the id lookup of a new id, and still remap an id another session holds (D444: indexed, or acknowledged
and not indexed yet), replay a retry, replace a streaming reservation; after a DB-writer restart and on
a rebuilt index it is built again; random sequences never put one id in two places."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.client import HostClient, RpcError
from runtime.host import RunningHost
from store.indexing.message_ids import MessageIds
from tests.hostkit import client_for, inprocess_host, msg


def filter_of(host: RunningHost) -> MessageIds:
    assert host.message_ids is not None
    return host.message_ids


async def append(c: HostClient, sid: str, message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = await c.call("session.appendMessage", {"sessionId": sid, "message": message})
    return out


async def restarted_writer(host: RunningHost, c: HostClient) -> None:
    """Crash the DB writer; a rename (a DB op: the new incarnation has started) and the index caught up."""
    before = host.services.writer.current()
    assert host.kill_actor("db-writer")
    for _ in range(5):  # the rename may reach the incarnation being killed: it answers ACTOR_RESTARTED
        try:
            await c.call("session.rename", {"sessionId": "a", "title": "after a restart"})
            break
        except RpcError as exc:
            assert exc.data_code == "ACTOR_RESTARTED"
    await host.services.index_log.barrier()
    assert host.services.writer.current() not in (None, before)


async def test_a_new_id_skips_the_lookup_and_an_indexed_id_of_another_session_is_remapped(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            ids = filter_of(host)
            assert ids.ready
            for sid in ("a", "b"):
                await c.call("session.create", {"sessionId": sid})
            assert not ids.might_hold("x1") and not ids.might_hold("b:x1")
            first = await append(c, "a", msg("x1", "one"))
            assert first["message"]["id"] == "x1" and "remappedFrom" not in first
            await host.services.index_log.barrier()
            assert ids.might_hold("x1")
            other = await append(c, "b", msg("x1", "one"))
            assert other["message"]["id"] == "b:x1" and other["remappedFrom"] == "x1"
            again = await append(c, "b", msg("x1", "one"))  # a retry: the remapped row, replayed
            assert again["replayed"] is True and again["message"]["seq"] == other["message"]["seq"]
            assert (await append(c, "a", msg("x1", "one")))["replayed"] is True


async def test_an_id_another_session_wrote_a_moment_ago_is_remapped_before_it_is_indexed(tmp_path: Path) -> None:
    """The index holds its row back (nobody reads): the filter says "certainly not indexed", and the
    index log's held ids of the other session are what remaps it."""
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, index_hold=3600.0) as host, client_for(host) as c:
            ids = filter_of(host)
            for sid in ("a", "b"):
                await c.call("session.create", {"sessionId": sid})
            await append(c, "a", msg("y1", "one"))
            assert host.services.index_log.statistics().lag_ops >= 1  # acknowledged, not indexed
            assert not ids.might_hold("y1")
            other = await append(c, "b", msg("y1", "one"))
            assert other["message"]["id"] == "b:y1" and other["remappedFrom"] == "y1"
            assert (await append(c, "a", msg("y1", "one")))["replayed"] is True
            got = await c.call("session.get", {"sessionId": "b"})
            assert [m["id"] for m in got["messages"]] == ["b:y1"]


@pytest.mark.parametrize("indexed", [True, False])
async def test_a_streaming_reservation_is_replaced_by_its_final(tmp_path: Path, indexed: bool) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path, index_hold=0.0 if indexed else 3600.0) as host, client_for(host) as c:
            await c.call("session.create", {"sessionId": "a"})
            await append(c, "a", msg("u1", "hi"))
            reserved = await append(c, "a", msg("r1", "par", "assistant", meta={"status": "streaming"}))
            if indexed:
                await host.services.index_log.barrier()
                assert filter_of(host).might_hold("r1")
            final = await append(c, "a", msg("r1", "the whole reply", "assistant"))
            assert final["replayed"] is False and final["message"]["seq"] == reserved["message"]["seq"] == 2
            got = await c.call("session.get", {"sessionId": "a"})
            assert [(m["id"], m["seq"]) for m in got["messages"]] == [("u1", 1), ("r1", 2)]


async def test_after_a_db_writer_restart_the_filter_is_built_again(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            ids = filter_of(host)
            for sid in ("a", "b"):
                await c.call("session.create", {"sessionId": sid})
            await append(c, "a", msg("z1", "one"))
            await host.services.index_log.barrier()
            await restarted_writer(host, c)
            assert ids.ready and ids.might_hold("z1")  # the same connection: it kept feeding it
            ids.detach()  # as if the writer's connection were not the one it was built on
            await restarted_writer(host, c)
            assert ids.ready and ids.might_hold("z1") and not ids.might_hold("z2")
            assert (await append(c, "b", msg("z1", "one")))["remappedFrom"] == "z1"
            await append(c, "a", msg("z2", "two"))
            await host.services.index_log.barrier()
            assert ids.might_hold("z2")


async def test_on_an_index_rebuilt_from_the_transcripts_the_filter_holds_every_id(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with inprocess_host(tmp_path) as host, client_for(host) as c:
            for sid in ("a", "b"):
                await c.call("session.create", {"sessionId": sid})
            await append(c, "a", msg("w1", "one"))
            await append(c, "b", msg("w1", "one"))  # b:w1
        async with inprocess_host(tmp_path, rebuild_index=True) as host, client_for(host) as c:
            ids = filter_of(host)
            assert host.boot.report["database"]["rebuilt"] is True
            assert ids.ready and ids.might_hold("w1") and ids.might_hold("b:w1")
            assert (await append(c, "b", msg("w1", "one")))["replayed"] is True
            again = await append(c, "a", msg("w1", "one"))
            assert again["replayed"] is True and again["message"]["sessionId"] == "a"


# ---------------------------------------------------------------------- property: never one id twice

SESSIONS = ("a", "b", "c")
op = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(SESSIONS), st.integers(0, 5)),
    st.tuples(st.just("read"), st.sampled_from(SESSIONS), st.just(0)),
    st.tuples(st.just("restart"), st.just(""), st.just(0)),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=4, max_size=30), hold=st.sampled_from([0.0, 0.05, 3600.0]))
async def test_random_appends_replays_and_shared_ids_never_duplicate_an_id(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, str, int]], hold: float) -> None:
    root = Path(tmp_path_factory.mktemp("ids")) / "data"
    written: dict[tuple[str, str], dict[str, Any]] = {}  # (session, client id) -> its first answer's ref
    with trio.fail_after(120):
        async with inprocess_host(root, index_hold=hold) as host, client_for(host) as c:
            for sid in SESSIONS:
                await c.call("session.create", {"sessionId": sid})
            for kind, sid, n in ops:
                if kind == "restart":
                    await restarted_writer(host, c)
                    continue
                if kind == "read":
                    await c.call("session.get", {"sessionId": sid})
                    continue
                mid = f"id{n}"
                out = await append(c, sid, msg(mid, f"text {mid}"))
                first = written.get((sid, mid))
                if first is not None:
                    assert out["replayed"] is True and out["message"]["id"] == first["id"]
                    assert out["message"]["seq"] == first["seq"]
                    continue
                owners = [s for (s, m) in written if m == mid]
                assert out["replayed"] is False
                assert out["message"]["id"] == (mid if not owners else f"{sid}:{mid}")
                written[(sid, mid)] = out["message"]
            seen: dict[str, str] = {}
            for sid in SESSIONS:
                got = await c.call("session.get", {"sessionId": sid})
                ids = [m["id"] for m in got["messages"]]
                assert len(ids) == len(set(ids)) == len([k for k in written if k[0] == sid])
                for mid in ids:
                    assert seen.setdefault(mid, sid) == sid, f"{mid} in {seen[mid]} and {sid}"
    in_files: dict[str, str] = {}
    for sid in SESSIONS:
        lines = (root / "sessions" / f"{sid}.jsonl").read_text().splitlines()
        mids = [r["id"] for r in map(json.loads, lines) if r.get("type") == "message"]
        assert len(mids) == len(set(mids))
        for mid in mids:
            assert in_files.setdefault(mid, sid) == sid
    assert set(in_files) == set(seen)
