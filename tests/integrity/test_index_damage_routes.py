"""RELIABILITY.md row 7 over the whole route table: "corrupt it while running ... a corruption found at
runtime crashes the DB-writer actor, and the supervisor rebuilds". A damaged index (``pi.sqlite``) met by
ANY method answers CORRUPT_DATA, or the connection closes while the same process starts again on an index
rebuilt from the transcripts; never INTERNAL ("a host bug"), neither on the wire nor in the host's log.

- Every routed method is called once after the index is damaged, with the valid request the schema test
  builds for it (``tests/protocol/test_results_validate.READS`` for reads, ``tests/pipeline/scenarios`` for
  the mutating ones), on a real ``pi-host serve`` process. The damage: a stretch of random bytes, a few
  random bytes, each deliberate kind of ``test_index_damage_kinds`` (text that is not UTF-8, the FTS5 format
  record, the FTS5 schema row).
- A JSON column that does not parse, or holds JSON of another shape, is damage of that one record:
  CORRUPT_DATA, no rebuild (most of those tables hold state only the database has, which a rebuild from the
  transcripts would lose: ARCHITECTURE.md "Durability"), and the writes after it still commit.
- The DB writer's idle search upkeep meeting damage, with no request behind it.
- The offline CLI reads and ``pi-host doctor [--repair]`` on a damaged index: a clear line and an exit
  code, never a traceback.

Seeded; more seeds, and the deliberate kinds over every method, under PIHOST_SOAK=1."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.methods import METHODS
from runtime.client import ClientClosed, HostClient, RpcError, open_client
from runtime.routes import ROUTES, Via
from tests.hostkit import (
    REPO,
    HostProcess,
    LaunchedHost,
    launch_host_process,
    msg,
    once_rebuilt,
    run_cli,
    start_host_process,
)
from tests.integrity.test_index_damage_kinds import _damage
from tests.integrity.test_reliability_outsider_a import log_records
from tests.pipeline import scenarios as sc
from tests.protocol import test_results_validate as rv

SOAK = os.environ.get("PIHOST_SOAK") == "1"


class Host:
    """One ``pi-host serve`` process on ``data`` (started again when it exits after its restarts on a rebuilt
    index), one connection per client kind, and every answer's error code."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.proc: HostProcess | None = None
        self.stack = AsyncExitStack()
        self.clients: dict[str, HostClient] = {}
        self.codes: list[tuple[str, str]] = []
        self.said: list[tuple[str, str]] = []
        """Each error answer's code and message."""
        self.met = 0

    async def start(self, launched: LaunchedHost | None = None) -> None:
        """Start a host on ``data``, or wait for the one ``launched`` there earlier."""
        self.proc = start_host_process(self.data) if launched is None else launched.started()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    async def client(self, kind: str) -> HostClient:
        if kind not in self.clients:
            assert self.proc is not None
            plugin = kind.split(":", 1)[1] if kind.startswith("plugin:") else None
            self.clients[kind] = await self.stack.enter_async_context(open_client(
                self.proc.url, self.proc.token, client_id=f"damage-{kind}",
                client_kind="plugin" if plugin else kind, plugin_id=plugin))
        return self.clients[kind]

    async def drop_clients(self) -> None:
        stack, self.stack, self.clients = self.stack, AsyncExitStack(), {}
        with trio.move_on_after(5) as cs:
            cs.shield = True
            try:
                await stack.aclose()
            except BaseException:  # a connection the host closed under it
                pass

    async def call(self, kind: str, method: str, params: dict[str, Any]) -> Any:
        closed: BaseException | None = None
        try:
            c = await self.client(kind)
            with trio.fail_after(30):
                return await c.call(method, params)
        except RpcError as failed:
            code = str(failed.data_code)
            self.codes.append((method, code))
            self.said.append((method, f"{code}: {failed.message}"))
            if code not in ("CORRUPT_DATA", "SHUTTING_DOWN"):
                raise
            error = failed
        except (ClientClosed, OSError) as exc:
            self.codes.append((method, f"closed {exc}"))
            closed = exc
            error = RpcError(-1, "CLOSED", str(exc), {})
        await self.recover()
        raise error from closed

    async def recover(self) -> None:
        """Wait for the host to serve again on a rebuilt index: the same process after its restart, or a new
        one once it gave up restarting."""
        self.met += 1
        await self.drop_clients()
        assert self.proc is not None
        with trio.move_on_after(60) as waited:
            while True:
                if self.proc.proc.poll() is not None:
                    self.proc.kill9()
                    await self.start()
                with trio.move_on_after(5):  # a handshake the stopping run accepted and never answers
                    try:
                        async with open_client(self.proc.url, self.proc.token, client_id="probe",
                                               client_kind="agent") as c:
                            await c.call("host.status", {})
                            return
                    except (OSError, ClientClosed, RpcError):
                        pass
                # the restart on a rebuilt index takes a few tens of ms: a probe refused (the listener is
                # closed between the runs) costs little, and a 0.2 s wait made most recoveries 0.2 s
                await trio.sleep(0.02)
        if waited.cancelled_caught:
            tail = [f"{r.get('level')} {r.get('msg')}" for r in log_records(self.data)][-12:]
            raise AssertionError(f"the host (exit {self.proc.proc.poll()}) serves no more: {tail}")


class Proxy:
    """What a scenario's setup calls ``c``: its calls go through :class:`Host` (recorded, recovered)."""

    def __init__(self, host: Host, kind: str) -> None:
        self.host, self.kind = host, kind

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self.host.call(self.kind, method, params)


# ---------------------------------------------------------------------------------------------- the damage

def checkpoint(db: Path) -> None:
    conn = sqlite3.connect(db, timeout=10)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except (sqlite3.DatabaseError, UnicodeDecodeError):  # damaged by an earlier round no call met yet (SQLite's
        pass  # message may quote the damaged bytes)
    finally:
        conn.close()


def stretch(db: Path, rng: random.Random) -> None:
    checkpoint(db)
    size = db.stat().st_size
    at = rng.randrange(100, size - 64)
    with db.open("r+b") as fh:
        fh.seek(at)
        fh.write(rng.randbytes(rng.randrange(64, min(8192, size - at))))


def few_bytes(db: Path, rng: random.Random) -> None:
    checkpoint(db)
    size = db.stat().st_size
    with db.open("r+b") as fh:
        for _ in range(rng.randrange(1, 8)):
            fh.seek(rng.randrange(100, size))
            fh.write(rng.randbytes(1))


JSON_COLUMNS = {
    "kv": "value_json", "providers": "config_json", "models": "capabilities_json",
    "session_import_origins": "origin_json", "turns": "usage_json", "plan_approvals": "plan_json",
    "turn_queue": "attachments_json", "scheduled_tasks": "config_json", "audit_log": "payload_json",
    "command_receipts": "response_json", "run_snapshots": "snapshot_json", "attachment_blobs": "meta_json",
    "boot_reports": "report_json", "approvals": "options_json", "interactions": "choices_json",
    "thread_meta": "tags_json",
}
"""A JSON column of each table that has one (the host writes only valid JSON there)."""


def bad_json(db: Path, text: str = '{"cut') -> None:
    """Every JSON column of the index set to ``text`` (JSON that does not parse, or of another shape)."""
    columns = [*JSON_COLUMNS.items(), ("turn_queue", "lease_client"), ("interactions", "answer_json"),
               ("run_snapshots", "input_json"), ("thread_meta", "origins_json")]
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        for table, column in columns:
            conn.execute(f"UPDATE {table} SET {column} = ? WHERE {column} IS NOT NULL", (text,))
    finally:
        conn.close()


def _sql(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def damage(db: Path, kind: str, rng: random.Random) -> None:
    """``kind`` of damage over the index: while a host serves it, or between two hosts."""
    if kind == "json":
        bad_json(db)
    elif kind == "json-shape":
        bad_json(db, '"a string"')
    elif kind == "stretch":
        stretch(db, rng)
    elif kind == "few-bytes":
        few_bytes(db, rng)
    elif kind == "text-not-utf8":  # every message's text (test_index_damage_kinds: one session's)
        _sql(db, "UPDATE messages SET text = CAST(X'7365636f6e6420ff' AS TEXT)")  # 'second \xff': what the reads search
    elif kind in ("fts5-schema", "schema-name"):  # the schema cookie moved on: a serving host's connections
        if kind == "fts5-schema":                   # read the schema again
            _damage(db, kind)
        else:  # a schema row's name that is not UTF-8: SQLite's message quotes it (UnicodeDecodeError)
            _sql(db, "PRAGMA writable_schema = ON", "UPDATE sqlite_master SET name = CAST(X'6b76ff' AS TEXT), "
                 "sql = 'CREATE TABLE kv(' WHERE name = 'kv'")
        probe = sqlite3.connect(db)
        try:
            version = probe.execute("PRAGMA schema_version").fetchone()[0]
        finally:
            probe.close()
        _sql(db, "PRAGMA writable_schema = ON", f"PRAGMA schema_version = {version + 1}")
    else:
        _damage(db, kind)


# ---------------------------------------------------------------------------------------------- the calls

Call = tuple[str, sc.Setup, Any, str]
"""A method, the setup that builds the state it needs, its params from that state, the client kind."""


def calls(reads_only: bool = False) -> list[Call]:
    """Every routed method once: reads first (on one rich state), then each mutating scenario."""
    reads = [(m, setup, params, kind) for m, (setup, params, kind) in rv.READS.items()]
    writes = [(m, s.setup, s.params, s.kind) for m, s in sc.SCENARIOS.items() if METHODS[m].mutating]
    return reads if reads_only else reads + writes


def test_every_routed_method_is_called_here() -> None:
    routed = {n for n, r in ROUTES.items() if r.via is not Via.CONNECTION}
    assert routed - {m for m, *_ in calls()} == set()


def internal_in_log(data: Path) -> list[str]:
    """Host log records of an INTERNAL answer ("unexpected exception while handling a request")."""
    return [f"{r.get('msg')}: {str(r.get('exc', ''))[-600:]}" for r in log_records(data)
            if "INTERNAL" in json.dumps(r) or "unexpected exception" in str(r.get("msg"))]


class Rich:
    """The shared states of the reads, built again after a rebuild took the database-only state away."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.setups = {id(rv.EVERYTHING): rv.once(rv.with_everything), id(rv.REQUESTS): rv.once(rv.with_requests)}

    def of(self, setup: sc.Setup) -> sc.Setup:
        return self.setups.get(id(setup), setup)


async def every_method_after(tmp_path: Path, kind: str, seed: int, *,
                             reads_only: bool = False) -> tuple[list[Host], list[tuple[str, str]]]:
    """Each call once right after ``kind`` of damage (again before every call: a call that does not meet it
    leaves it for the next). A setup that fails (it met the damage, or an earlier scenario's state is in its
    way: scenarios reuse turn ids) runs again on a host of its own on a fresh data directory."""
    rng = random.Random(seed)
    hosts: list[Host] = []
    answers: list[tuple[str, str]] = []
    rich = Rich()
    spare: list[LaunchedHost] = []
    """The next host, booting on its own data directory while this one serves: most cases need a few dozen
    fresh hosts (the scenarios reuse ids), and waiting for each boot was a quarter of their time."""

    def launch_spare() -> None:
        data = tmp_path / f"data{len(hosts)}"  # the one after the last of ``hosts``
        data.mkdir()
        spare.append(launch_host_process(data))

    async def new_host() -> Host:
        if hosts:
            await hosts[-1].drop_clients()
            hosts[-1].kill()
        launched = spare.pop() if spare else None
        data = tmp_path / f"data{len(hosts)}"
        if launched is None:
            data.mkdir()
        hosts.append(Host(data))
        try:
            assert launched is None or launched.data_dir == data
            await hosts[-1].start(launched)
        except BaseException:
            if launched is not None:
                launched.kill9()
            raise
        launch_spare()
        rich.renew()
        return hosts[-1]

    h = await new_host()
    try:
        for n, (method, setup, params, ckind) in enumerate(calls(reads_only)):
            v = None
            for attempt in range(3):
                root = tmp_path / f"w{n}-{attempt}"
                root.mkdir()
                met = h.met
                try:
                    v = await rich.of(setup)(Proxy(h, ckind), root)  # type: ignore[arg-type]
                    break
                except RpcError:
                    if h.met != met:  # it met the damage: again on the rebuilt index, then on a new host
                        rich.renew()
                        if attempt:
                            h = await new_host()
                    else:  # an earlier scenario's state is in its way: again here meets it again
                        h = await new_host()
            assert v is not None, f"{method}: its setup failed three times: {h.codes[-3:]}"
            damage(h.data / "pi.sqlite", kind, rng)
            met = h.met
            try:
                await h.call(ckind, method, params(v))
                answers.append((method, "ok"))
            except RpcError as failed:
                answers.append((method, str(failed.data_code)))
            if h.met != met:
                rich.renew()
    finally:
        await h.drop_clients()
        h.kill()
        for unused in spare:
            unused.kill9()
    return hosts, answers


INDEX_DAMAGE = [("stretch", 1, "all"), ("stretch", 2, "all"), ("few-bytes", 3, "all"), ("text-not-utf8", 0, "reads"),
                ("fts5-format", 0, "reads"), ("fts5-schema", 0, "reads")]
"""The deliberate kinds over the reads only in CI: each scenario's setup appends, meets the damage left by a
call that did not, and costs a rebuild (all methods under PIHOST_SOAK=1, with more random seeds)."""
if SOAK:
    INDEX_DAMAGE = [(kind, seed, "all") for kind, seed, _ in INDEX_DAMAGE] + [
        (kind, seed, "all") for seed in range(10, 20) for kind in ("stretch", "few-bytes")]


async def every_method_case(tmp_path: Path, kind: str, seed: int, scope: str) -> None:
    """Whichever method meets the damage answers CORRUPT_DATA (or its connection closes while the host
    starts again on a rebuilt index), never INTERNAL; the host serves again without anyone restarting it."""
    hosts, answers = await every_method_after(tmp_path, kind, seed, reads_only=scope == "reads")
    codes = [(m, c) for h in hosts for m, c in h.codes]
    assert [mc for mc in codes if mc[1] == "INTERNAL"] == [], codes
    for h in hosts:
        assert internal_in_log(h.data) == []
    met = [mc for mc in codes if mc[1] in ("CORRUPT_DATA", "SHUTTING_DOWN") or mc[1].startswith("closed")]
    if kind != "few-bytes":  # a few bytes may all land where no read looks
        assert met, answers
        assert any(list((h.data / "quarantine").glob("pi.sqlite.corrupt-*")) for h in hosts), \
            "a damage met at runtime is quarantined and the index rebuilt"


SPLIT = 3
"""The cases of INDEX_DAMAGE up to SPLIT run here, the others (and the JSON columns) in
test_index_damage_routes_more.py: a module runs whole on one worker (``--dist loadfile``), and the two
halves, about two minutes each, run side by side."""


@pytest.mark.parametrize(("kind", "seed", "scope"), INDEX_DAMAGE[:SPLIT])
async def test_every_method_meeting_a_damaged_index_answers_corrupt_data_and_the_host_rebuilds(
        tmp_path: Path, kind: str, seed: int, scope: str) -> None:
    """Whichever method meets the damage answers CORRUPT_DATA (or its connection closes while the host
    starts again on a rebuilt index), never INTERNAL; the host serves again without anyone restarting it."""
    await every_method_case(tmp_path, kind, seed, scope)


# ---------------------------------------------------------------------------------------------- at boot

async def test_a_schema_row_named_with_bytes_that_are_not_utf8_is_quarantined_at_boot(tmp_path: Path) -> None:
    """Row 7: "boot runs PRAGMA quick_check, quarantines db+wal+shm and rebuilds from JSONL". A schema row
    whose name is not UTF-8 (a few random bytes landed there) makes SQLite's own error message quote those
    bytes, so Python raises UnicodeDecodeError instead of an sqlite3 error; boot's probe must still call it
    damage: the host starts, on a rebuilt index holding every acknowledged message."""
    data = tmp_path / "data"
    data.mkdir()
    proc = start_host_process(data)
    try:
        async with open_client(proc.url, proc.token, client_id="boot", client_kind="agent") as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            for i in range(5):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"needle {i}")})
            await c.call("session.get", {"sessionId": "s1"})
    finally:
        proc.terminate()
    _sql(data / "pi.sqlite", "PRAGMA writable_schema = ON",
         "UPDATE sqlite_master SET name = CAST(X'6b76ff' AS TEXT), sql = 'CREATE TABLE kv(' WHERE name = 'kv'")
    proc = start_host_process(data)
    try:
        async with open_client(proc.url, proc.token, client_id="boot", client_kind="agent") as c:
            assert (await c.call("host.status", {}))["boot"]["dbRebuilt"]
            got = await c.call("session.get", {"sessionId": "s1", "full": True})
            assert [m["id"] for m in got["messages"]] == [f"m{i}" for i in range(5)]
            assert len((await c.call("search.query", {"query": "needle"}))["results"]) == 5
    finally:
        proc.kill9()
    assert list((data / "quarantine").glob("pi.sqlite.corrupt-*"))
    assert internal_in_log(data) == []


@pytest.mark.parametrize("method", ["search.query", "settings.set"])
async def test_a_schema_row_named_with_bytes_that_are_not_utf8_under_a_serving_host_is_corrupt_data(
        tmp_path: Path, method: str) -> None:
    """The same damage under a serving host (the schema cookie moved on, so its connections read the schema
    again): a read (the read pool) and a write (the DB writer) that meet it answer CORRUPT_DATA or see their
    connection closed (or SHUTTING_DOWN) while the host restarts on a rebuilt index; never INTERNAL, nor an
    IO_ERROR that leaves the damaged file in place."""
    data = tmp_path / "data"
    data.mkdir()
    h = Host(data)
    await h.start()
    try:
        await h.call("agent", "session.create", {"sessionId": "s1", "title": "t"})
        await h.call("agent", "session.appendMessage", {"sessionId": "s1", "message": msg("m0", "needle")})
        damage(data / "pi.sqlite", "schema-name", random.Random(0))
        params = {"query": "needle"} if method == "search.query" else {"key": "a", "value": 1}
        with pytest.raises(RpcError) as met:
            await h.call("agent", method, params)
        # SHUTTING_DOWN: the request came while the host was already restarting (another path met the damage
        # first, e.g. its search upkeep on a loaded machine); retriable, as CLOSED is
        assert met.value.data_code in ("CORRUPT_DATA", "CLOSED", "SHUTTING_DOWN"), met.value
        got = await h.call("agent", "session.get", {"sessionId": "s1", "full": True})
        assert [m["id"] for m in got["messages"]] == ["m0"]
    finally:
        await h.drop_clients()
        h.kill()
    assert list((data / "quarantine").glob("pi.sqlite.corrupt-*"))
    assert internal_in_log(data) == []


# ---------------------------------------------------------------------------------------------- idle upkeep

async def test_the_db_writer_meeting_damage_in_its_idle_upkeep_rebuilds_with_no_request(tmp_path: Path) -> None:
    """The DB writer's own write path with no request behind it: the search index's merge step it runs when
    idle meets a damaged FTS5 structure record; the host restarts on a rebuilt index by itself (no INTERNAL logged), and
    every acknowledged message searches again."""
    data = tmp_path / "data"
    data.mkdir()
    proc = start_host_process(data, "--search-upkeep-after", "0.3")
    try:
        async with open_client(proc.url, proc.token, client_id="idle", client_kind="agent") as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            for i in range(30):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(f"m{i}", f"needle {i}")})
            assert len((await c.call("search.query", {"query": "needle", "limit": 50}))["results"]) == 30
            # FTS5's structure record (which segments exist), its cookie changed: the merge step reads it
            # whatever the segments are (how the appends were batched decides how many there are)
            _sql(data / "pi.sqlite", "UPDATE messages_fts_data SET block = X'00000000ffffffffffff' WHERE id = 10")
        # no request meets the damage: the idle upkeep does
        async with once_rebuilt(proc, ready=lambda: list((data / "quarantine").glob("pi.sqlite.corrupt-*"))) as c:
            found = await c.call("search.query", {"query": "needle", "limit": 50})
            assert len(found["results"]) == 30, found
        assert proc.proc.poll() is None, "the same process serves again"
    finally:
        proc.kill9()
    assert internal_in_log(data) == []
    assert any("corrupt" in str(r.get("msg")) for r in log_records(data) if r.get("level") == "error")


# ---------------------------------------------------------------------------------------------- the CLI

def cli(data: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--data-dir", str(data), *argv, env={"PYTHONPATH": str(REPO)})


CLI_DAMAGE = [("stretch", 1), ("stretch", 4), ("text-not-utf8", 0), ("fts5-format", 0), ("fts5-schema", 0),
              ("json", 0)]


@pytest.mark.parametrize(("kind", "seed"), CLI_DAMAGE)
async def test_offline_reads_and_doctor_on_a_damaged_index_say_so_without_a_traceback(
        tmp_path: Path, kind: str, seed: int) -> None:
    """``pi-host sessions`` / ``show`` / ``search`` read offline, and ``pi-host doctor [--repair]``, on a damaged
    ``pi.sqlite`` (no host running): a clear ``pi-host:`` line and an exit code from the documented set (the
    reads: 0, 1 with the error code the host would answer, 2 refused; doctor: 0 clean, 1 repairable or
    repaired, 2 damage it cannot repair), never a Python traceback printed to a person."""
    data = tmp_path / "data"
    data.mkdir()
    proc = start_host_process(data)
    try:
        async with open_client(proc.url, proc.token, client_id="cli", client_kind="agent") as c:
            await c.call("session.create", {"sessionId": "s1", "title": "t"})
            for i in range(20):
                await c.call("session.appendMessage", {"sessionId": "s1", "message": msg(
                    f"m{i}", "second " + random.Random(i).randbytes(200).hex())})
            await c.call("tasks.create", {"title": "t", "prompt": "p"})
            await c.call("session.get", {"sessionId": "s1"})
    finally:
        proc.terminate()
    damage(data / "pi.sqlite", kind, random.Random(seed))
    runs = {" ".join(argv): cli(data, *argv) for argv in (
        ("sessions",), ("show", "s1"), ("search", "second"), ("doctor",), ("doctor", "--repair"))}
    for what, run in runs.items():
        said = run.stdout + run.stderr
        assert "Traceback" not in said, (what, said)
        assert run.returncode in (0, 1, 2), (what, run.returncode, said)
        if run.returncode and not what.startswith("doctor"):
            assert run.stderr.startswith("pi-host"), (what, said)
    if kind in ("text-not-utf8", "fts5-format", "fts5-schema"):  # met by the search
        assert runs["search second"].returncode == 1 and "CORRUPT_DATA" in runs["search second"].stderr, runs
    if kind in ("fts5-format", "fts5-schema"):  # found, and not repairable in place: the next start rebuilds
        assert runs["doctor"].returncode == 1, runs["doctor"]
        assert runs["doctor --repair"].returncode == 2, runs["doctor --repair"]
        assert "quarantines" in runs["doctor --repair"].stdout
