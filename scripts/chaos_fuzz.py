"""A Hypothesis-driven fuzzer for every wire method, against a real host.

Params are generated from each method's params model (its JSON Schema, ``protocol/methods.py``
METHODS): valid-shaped ones, and mutated ones — a field of the wrong type, a huge string, deep
nesting, a lone surrogate, ``NaN``, a duplicate key, an integer outside int64, a NUL byte, an unknown
key, a forged cursor. Frames are sent one request (sometimes a batch) at a time on an authenticated
connection; every answer is read and checked. After the run (:func:`verify`): the host is alive and
no actor crashed, ``PRAGMA integrity_check`` is ``ok``, every transcript line parses, and no answer
was ``INTERNAL``. Paths in params (projects, workspaces, import roots, export targets) are kept under a sandbox
folder and URLs point at a closed local port, so a fuzzed request can never make the host read or
write outside the sandbox or reach the network.

Used by ``tests/hostile/test_fuzz.py`` (CI-sized) and ``scripts/chaos --mode fuzz --frames N``.
"""

from __future__ import annotations

import random
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed

from protocol.methods import METHODS

__all__ = ["FuzzReport", "Pools", "frames", "fuzz_host", "iter_frames", "method_names", "params_strategy", "seed_pools",
           "verify"]

_SKIP = frozenset({"host.hello"})
_PATH_KEYS = frozenset({"projectPath", "workspaceRoot", "path", "root", "roots", "primaryRoot", "outPath",
                        "remoteDir"})
_URL_KEYS = frozenset({"baseUrl", "webdavUrl"})
_MAX_DEPTH = 6


def method_names() -> list[str]:
    """Every routed method (the route table, so a newly routed method is fuzzed without a change here)."""
    from runtime.routes import ROUTES

    return sorted(name for name in ROUTES if name not in _SKIP)


# ---------------------------------------------------------------------------------- schema -> strategy


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return defs[ref.rsplit("/", 1)[-1]]
    return schema


def _json_value(depth: int = 0) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
    if depth >= 2:
        return scalars
    return st.one_of(scalars, st.lists(_json_value(depth + 1), max_size=3),
                     st.dictionaries(st.text(max_size=8), _json_value(depth + 1), max_size=3))


def _from(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    schema = _resolve(schema, defs)
    if depth > _MAX_DEPTH:
        return st.none()
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([_from(s, defs, depth + 1) for s in schema[key]])
    if "allOf" in schema:
        return _from(schema["allOf"][0], defs, depth + 1)
    kind = schema.get("type")
    if kind == "string":
        pattern = schema.get("pattern")
        lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", 10**9))
        if pattern:
            regex = st.from_regex(pattern, fullmatch=True)
            return regex if (lo, hi) == (0, 10**9) else regex.filter(lambda s: lo <= len(s) <= hi)
        return st.text(min_size=lo, max_size=max(lo, min(hi, 40)))
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", -(2**31)))
        hi = schema.get("maximum", schema.get("exclusiveMaximum", 2**31))
        return st.integers(int(lo), int(hi))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = schema.get("items", {})
        lo = int(schema.get("minItems", 0))
        return st.lists(_from(items, defs, depth + 1) if items else _json_value(), min_size=lo,
                        max_size=max(lo, min(int(schema.get("maxItems", 3)), 3)))
    if kind == "object" or "properties" in schema:
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        fixed = {k: _from(v, defs, depth + 1) for k, v in props.items() if k in required}
        optional = {k: _from(v, defs, depth + 1) for k, v in props.items() if k not in required}
        base = st.fixed_dictionaries(fixed, optional=optional)
        if props:
            return base
        return st.dictionaries(st.text(max_size=8), _json_value(depth + 1), max_size=3)
    return _json_value(depth)


def params_strategy(method: str) -> st.SearchStrategy[dict[str, Any]]:
    schema = METHODS[method].params_model.model_json_schema(by_alias=True)
    return _from(schema, schema.get("$defs", {}), 0)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------- mutations

_MUTATIONS = ("wrong_type", "huge_string", "deep_nesting", "lone_surrogate", "nan", "duplicate_key",
              "big_int", "nul", "unknown_key", "null_field", "forged_cursor", "long_path")


def _mutate(params: dict[str, Any], how: str, rng: random.Random) -> tuple[dict[str, Any], str | None]:
    """A mutated copy and, for mutations JSON cannot express, a text substitution ``(marker, raw)``."""
    out = dict(params)
    keys = list(out) or ["sessionId"]
    key = rng.choice(keys)
    if how == "wrong_type":
        out[key] = rng.choice([[1, 2], {"x": 1}, 3.5, True, "s", None, -1])
    elif how == "huge_string":
        out[key] = "h" * rng.choice([10_000, 200_000, 1_200_000])
    elif how == "deep_nesting":
        value: Any = 0
        for _ in range(rng.choice([40, 70, 200])):
            value = [value]
        out[key] = value
    elif how == "lone_surrogate":
        out[key] = "LONE_SURROGATE"
        return out, '"\\ud800x"'
    elif how == "nan":
        out[key] = "NAN_MARKER"
        return out, rng.choice(["NaN", "Infinity", "-Infinity"])
    elif how == "duplicate_key":
        out["__dup__"] = 1
        return out, "DUP"
    elif how == "big_int":
        out[key] = "BIG_INT"
        return out, rng.choice(["9223372036854775808", "-9223372036854775809", "99999999999999999999999",
                                "-9999999999999999999", "18446744073709551616", "1" * 400])
    elif how == "nul":
        out[key] = "a\x00b"
    elif how == "unknown_key":
        out["noSuchField"] = 1
    elif how == "null_field":
        out[key] = None
    elif how == "forged_cursor":
        out["cursor"] = rng.choice(["WzIsInNlc3Npb25zLmxpc3QiLCJ4IixbWzFdLCJ4Il1d", "!!!", "e30", "W10" * 100])
    elif how == "long_path":
        out[rng.choice(sorted(_PATH_KEYS))] = "/" + "/".join("p" * rng.choice([10, 300]) for _ in range(20))
    return out, None


def _sandboxed(params: Any, sandbox: str) -> Any:
    """Every path-like param under the sandbox (its garbage kept: NULs, length), so nothing is written
    or read outside it whatever the fuzzer invents."""
    if isinstance(params, dict):
        out = {}
        for k, v in params.items():
            if k in _PATH_KEYS and isinstance(v, str):
                v = f"{sandbox}/{v.lstrip('/')}" if v else v
            elif k in _PATH_KEYS and isinstance(v, list):
                v = [f"{sandbox}/{x.lstrip('/')}" if isinstance(x, str) and x else x for x in v]
            elif k in _URL_KEYS and isinstance(v, str):
                v = f"http://127.0.0.1:9/{v[:200]}"  # the discard port: refused at once, never the network
            out[k] = _sandboxed(v, sandbox) if isinstance(v, (dict, list)) else v
        return out
    if isinstance(params, list):
        return [_sandboxed(v, sandbox) for v in params]
    return params


def _render(request: dict[str, Any], raw: str | None) -> str:
    text = orjson.dumps(request).decode()
    if raw is None:
        return text
    if raw == "DUP":
        return text.replace('"__dup__":1', '"__dup__":1,"__dup__":2', 1)
    for marker in ('"LONE_SURROGATE"', '"NAN_MARKER"', '"BIG_INT"'):
        if marker in text:
            return text.replace(marker, raw, 1)
    return text


# ---------------------------------------------------------------------------------- frames


@dataclass
class Pools:
    """Ids that exist on the host, so fuzzed requests reach past the "not found" checks."""

    sessions: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    sandbox: str = "/nonexistent"
    ids: dict[str, list[str]] = field(default_factory=dict)
    """Other ids by param name (``turnId``, ``requestId``, ``deliveryId``, ``executionId``, ``ruleId``)."""


async def seed_pools(c: Any, pools: Pools, sessions: int = 4, messages: int = 3) -> None:
    """Fixture state for the fuzzer on a fresh host (``c``: a connected ``HostClient``): sessions with
    messages, and one of each of issue 16's pending things (an approval and its rules, an interaction,
    a plan request and its execution, a collaboration delivery), so fuzzed requests reach past "not
    found" into those handlers. Everything is made under ``pools.sandbox``."""
    from tests.hostkit import msg

    sandbox = Path(pools.sandbox)
    for i in range(sessions):
        project = sandbox / f"p{i}"
        project.mkdir(exist_ok=True)
        sid = (await c.call("session.create", {"title": f"fuzz {i}", "projectPath": str(project),
                                               "mode": "plan" if i % 2 else "agent"}))["id"]
        pools.sessions.append(sid)
        for j in range(messages):
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"f{i}-{j}", f"fuzz text {j}")})
            pools.messages.append(f"f{i}-{j}")
    ids = pools.ids
    agent, plan = pools.sessions[0], pools.sessions[1]
    await c.call("session.startTurn", {"sessionId": agent, "turnId": "ft1"})
    for tool in ("Bash", "Edit"):
        asked = await c.call("approvals.request", {"sessionId": agent, "turnId": "ft1", "tool": tool, "risk": "low"})
        ids.setdefault("requestId", []).append(asked["request"]["requestId"])
    answered = await c.call("approvals.respond", {"sessionId": agent, "requestId": ids["requestId"][0],
                                                  "optionId": "allow_session"})
    ids["ruleId"] = [answered["rule"]["id"]]
    asked = await c.call("interactions.request", {"sessionId": agent, "turnId": "ft1", "question": "Which?",
                                                  "allowFreeText": True})
    ids["requestId"].append(asked["request"]["requestId"])
    submitted = await c.call("plans.submit", {"sessionId": plan, "turnId": "ft2", "toolCallId": "call1", "kind": "plan",
                                              "markdown": "# Plan\n\nDo it.\n", "title": "Plan", "question": "Ok?",
                                              "workspaceRoot": str(sandbox / "p1")})
    ids["requestId"].append(submitted["requestId"])
    approved = await c.call("plans.respond", {"requestId": submitted["requestId"], "action": "approve"})
    ids["executionId"] = [approved["approval"]["executionId"]]
    await c.call("session.startTurn", {"sessionId": plan, "turnId": "ft3"})
    if len(pools.sessions) >= 4:
        delivered = await c.call("collab.deliver", {
            "pluginId": "fuzz", "sourceSessionId": pools.sessions[2], "targetSessionId": pools.sessions[3],
            "kind": "task", "content": "review this", "idempotencyKey": "fuzz-1", "notifyOnCompletion": True})
        ids["deliveryId"] = [delivered["delivery"]["id"]]
    ids["turnId"] = ["ft1", "ft2", "ft3"]


def _realistic(params: dict[str, Any], pools: Pools, rng: random.Random) -> dict[str, Any]:
    out = dict(params)
    if "sessionId" in out and pools.sessions and rng.random() < 0.6:
        out["sessionId"] = rng.choice(pools.sessions)
    for key in ("messageId", "messageAround", "fromMessageId", "throughMessageId"):
        if key in out and pools.messages and rng.random() < 0.6:
            out[key] = rng.choice(pools.messages)
    for key, known in pools.ids.items():
        if key in out and known and rng.random() < 0.6:
            out[key] = rng.choice(known)
    return out


def frames(count: int, *, seed: int, pools: Pools) -> list[str]:
    """``count`` text frames: about a third valid-shaped, the rest mutated; some batches."""
    return list(iter_frames(count, seed=seed, pools=pools))


def iter_frames(count: int, *, seed: int, pools: Pools) -> Iterator[str]:
    """:func:`frames`, rendered one at a time (a long run never holds them all: some are megabytes).
    The params are drawn now (Hypothesis), the frames rendered as they are taken."""
    return _rendered(_draw(count), count, random.Random(seed), pools)


def _draw(count: int) -> list[tuple[str, dict[str, Any]]]:
    names = method_names()
    drawn: list[tuple[str, dict[str, Any]]] = []
    per_method = max(1, count // len(names) + 1)
    for name in names:
        strategy = params_strategy(name)
        got: list[dict[str, Any]] = []

        @settings(max_examples=per_method, database=None, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def collect(p: dict[str, Any]) -> None:
            got.append(p)  # noqa: B023 - run to completion before the next method

        try:
            collect()
        except Exception as exc:
            raise RuntimeError(f"cannot generate params for {name}: {exc}") from exc
        drawn.extend((name, p) for p in got)
    return drawn


def _rendered(drawn: list[tuple[str, dict[str, Any]]], count: int, rng: random.Random,
              pools: Pools) -> Iterator[str]:
    rng.shuffle(drawn)
    made = 0
    request_id = 0
    i = 0
    while made < count:
        made += 1
        name, params = drawn[i % len(drawn)]
        i += 1
        params = _realistic(params, pools, rng)
        raw = None
        if rng.random() < 0.66:
            params, raw = _mutate(params, rng.choice(_MUTATIONS), rng)
        params = _sandboxed(params, pools.sandbox)
        request_id += 1
        if rng.random() < 0.05:
            batch = [{"jsonrpc": "2.0", "id": request_id + n, "method": name, "params": params}
                     for n in range(rng.choice([2, 10, 50]))]
            request_id += len(batch)
            yield orjson.dumps(batch).decode()
            continue
        yield _render({"jsonrpc": "2.0", "id": request_id, "method": name, "params": params}, raw)


# ---------------------------------------------------------------------------------- run and verify


@dataclass
class FuzzReport:
    frames: int = 0
    answers: int = 0
    internal: int = 0
    crashes: int = 0
    poisoned: int = 0
    reconnects: int = 0
    events: int = 0  # event notifications received (a fuzzed events.subscribe), not answers
    codes: Counter[str] = field(default_factory=Counter)
    internal_samples: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def last_line(self) -> str:
        return f"frames={self.frames} internal={self.internal} crashes={self.crashes} poisoned={self.poisoned}"

    @property
    def ok(self) -> bool:
        return not (self.internal or self.crashes or self.poisoned or self.problems)


def _answers(message: Any) -> list[dict[str, Any]]:
    if isinstance(message, list):
        return [m for m in message if isinstance(m, dict)]
    return [message] if isinstance(message, dict) else []


def record(report: FuzzReport, frame: str, message: Any) -> None:
    for answer in _answers(message):
        report.answers += 1
        err = answer.get("error")
        code = err.get("data", {}).get("code") if isinstance(err, dict) else "ok"
        report.codes[str(code)] += 1
        if code == "INTERNAL":
            report.internal += 1
            if len(report.internal_samples) < 10:
                report.internal_samples.append(frame[:300])


async def fuzz_host(url: str, token: str, frame_list: Iterable[str], report: FuzzReport,
                    on_progress: Callable[[int], None] | None = None, *, answer_timeout: float = 120.0) -> None:
    """Send every frame (one at a time, waiting for its answer), reconnecting when the host closes us.

    A reader task drains the socket all the time: event notifications (a fuzzed ``events.subscribe``
    asks for them) are counted and dropped, answers are handed over. Reading only after each send
    deadlocked against the host's backpressure once events were flowing (both sides blocked in a
    send). A frame with no answer within ``answer_timeout`` is a problem (a hang), not a wait forever.
    """
    from tests.hostile.wire import hello_frame, raw_connection

    kinds = ["ui", "agent", "cli", "test"]
    pending = iter(frame_list)
    frame: str | None = next(pending, None)
    sent = 0

    async def drain(ws: Any, out: trio.MemorySendChannel[Any]) -> None:
        async with out:
            try:
                while True:
                    message = orjson.loads(await ws.get_message())
                    if isinstance(message, dict) and "method" in message and "id" not in message:
                        report.events += 1
                        continue
                    await out.send(message)
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                return

    while frame is not None:
        try:
            async with raw_connection(url, None, max_message_size=64 * 1024 * 1024) as ws:
                await ws.send_message(hello_frame(token, f"fuzz-{report.reconnects}", kinds[report.reconnects % 4]))
                await ws.get_message()
                answers_in, answers_out = trio.open_memory_channel[Any](16)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(drain, ws, answers_in)
                    while frame is not None:
                        current, frame = frame, next(pending, None)
                        sent += 1
                        report.frames += 1
                        await ws.send_message(current)
                        with trio.move_on_after(answer_timeout) as waited:
                            answer = await answers_out.receive()  # EndOfChannel: closed by the host
                        if waited.cancelled_caught:
                            report.problems.append(f"no answer within {answer_timeout:g} s to {current[:300]}")
                            return
                        record(report, current, answer)
                        if on_progress is not None and sent % 1000 == 0:
                            on_progress(sent)
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # noqa: BLE001 - the host closed the connection (1009, 1008): reconnect
            report.reconnects += 1
            if report.reconnects > max(100, sent // 20):
                report.problems.append(f"too many reconnects; last: {type(exc).__name__}: {exc}")
                return


_LINE = re.compile(rb"[^\n]*\n")


def verify(data_dir: Path, report: FuzzReport, *, restarts: int) -> None:
    """After the run: no actor restarted, the index is intact, every transcript line parses."""
    report.crashes += restarts
    conn = sqlite3.connect(f"file:{data_dir / 'pi.sqlite'}?mode=ro", uri=True)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    if result != "ok":
        report.problems.append(f"integrity_check: {result}")
    for path in sorted((data_dir / "sessions").glob("*.jsonl")):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        for line in _LINE.findall(complete):
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                report.poisoned += 1
                report.problems.append(f"{path.name}: a line does not parse")
                break
            if not isinstance(value, dict):
                report.poisoned += 1
                break
        if len(complete) != len(data):
            report.poisoned += 1
            report.problems.append(f"{path.name}: a torn tail after the run")
