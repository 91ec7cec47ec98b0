#!/usr/bin/env python3
"""Search benchmark: index build rate, search.sessions latency, index size, brute-force ratio.

    python scripts/bench_search.py                      # CI size: 20k messages
    python scripts/bench_search.py --messages 1000000 --sessions 5000 --out DIR

Builds a realistic corpus (Zipf word frequencies, log-normal message lengths,
~5 % CJK messages, ~8 % code-like text, tool rows with NULL text, a few
tombstones) through the real schema (``store.upgrade.schema.apply_schema``, FTS
triggers included) in bulk transactions, then measures ``search_sessions``
(limit 20, 3 snippets) on a read-only connection for five query kinds (3-char,
8-char, CJK, 2-char, no-hit; ``--queries`` distinct queries each) and a
brute-force scan (every text through the same Python predicate) for a subset of
the same queries, checking that both count the same matches.

The index gets the FTS5 options the host's writer sets (``tune_index``). After
the build, the latencies are measured once "as built", then the DB writer's
idle upkeep (``store.search.search_upkeep.upkeep_step`` until it reports nothing to
do, one transaction per step, as a host does once its writer has been idle)
runs and everything is measured again; the targets are judged on the second
measurement, and both are reported.

Prints the figures as JSON, writes ``DIR/bench_search.json`` and returns the
dict from :func:`run` (``scripts/bench`` imports it).
Targets reported against: p95 < 100 ms for queries of 3+ characters, and
≥ 50× faster than brute force.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # running as a script from anywhere
    sys.path.insert(0, str(ROOT))

from bench_common import pct as _pct  # noqa: E402

from store.indexing.database import apply_pragmas, open_reader  # noqa: E402
from store.search.search import literal_predicate, normalize_query, search_messages, search_sessions  # noqa: E402
from store.search.search_upkeep import segment_count, tune_index, upkeep_step  # noqa: E402
from store.upgrade.schema import apply_schema, message_mid  # noqa: E402

P95_TARGET_MS = 100.0
SPEEDUP_TARGET = 50.0
BATCH = 20_000
KINDS = ("3char", "8char", "cjk", "2char", "nohit")

_COMMON = (
    "the of and to a in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there been one all we their has would when if so no will "
    "more can out up about what some into only other could time new these two may then do first "
    "any like now my such make over our even most after also made many did before must through "
    "back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three file function error test data value return build "
    "server request response config database query index session message model user code"
).split()
_SYLLABLES = (
    "ka ri to na mi ra lo ve en ar in on st th er an re nd at ou ed ha is it al es or ti te et "
    "ng de se le co ma ne ur ve pro con ex ing ion ter men ble ous ate ent ist ment"
).split()
_CJK = (
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过"
    "发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前"
    "开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重"
    "并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常"
    "数据库连接池优化性能服务器配置文件错误测试部署缓存索引查询会话消息模型用户代码"
    "ですますしたこのそれあるいるなるできる"
)


@dataclass(frozen=True)
class Config:
    messages: int
    sessions: int
    out: Path
    queries: int
    reps: int
    brute_queries: int
    seed: int


# --- corpus ------------------------------------------------------------------------


class Vocabulary:
    """Zipf-distributed words (s ≈ 1.07): common English first, then synthetic words."""

    def __init__(self, rng: random.Random, size: int = 30_000) -> None:
        words = list(dict.fromkeys(_COMMON))
        seen = set(words)
        while len(words) < size:
            w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.words = words
        self.cum = list(itertools.accumulate(1.0 / (rank + 1) ** 1.07 for rank in range(size)))
        cjk_cum = list(itertools.accumulate(1.0 / (rank + 1) ** 0.9 for rank in range(len(_CJK))))
        self.cjk_cum = cjk_cum

    def sample(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cum, k=k)

    def cjk(self, rng: random.Random, k: int) -> str:
        return "".join(rng.choices(_CJK, cum_weights=self.cjk_cum, k=k))


def _sentence_text(vocab: Vocabulary, rng: random.Random) -> str:
    n = min(2000, int(rng.lognormvariate(3.3, 0.9)) + 1)
    words = vocab.sample(rng, n)
    out: list[str] = []
    for i in range(0, n, 12):
        chunk = words[i : i + 12]
        chunk[0] = chunk[0].capitalize()
        out.append(" ".join(chunk) + rng.choice((".", ".", ".", ",", "?", "!")))
    return " ".join(out)


def _code_text(vocab: Vocabulary, rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(2, 25)):
        a, b, c = vocab.sample(rng, 3)
        lines.append(
            rng.choice(
                (
                    f"def {a}_{b}({c}, **kwargs):",
                    f"    return {a}.{b}({c}_id={rng.randint(0, 999)})",
                    f"const {a}{b.capitalize()} = await fetch(`/api/{b}/${{{c}}}`);",
                    f"Error: {a.capitalize()}{b.capitalize()}Exception at /src/{c}/{a}.py:{rng.randint(1, 900)}",
                    f"SELECT {a}, {b} FROM {c} WHERE {a}_id = ? LIMIT 50%;",
                    f"    if {a} == '{b}': {c} += 1  # {a} {b}",
                )
            )
        )
    return "\n".join(lines)


def _cjk_text(vocab: Vocabulary, rng: random.Random) -> str:
    parts = [vocab.cjk(rng, rng.randint(8, 60)) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts) + 1), " ".join(vocab.sample(rng, 2)))
    return "，".join(parts) + "。"


@dataclass
class Samples:
    """A reservoir of message texts to draw realistic queries from."""

    ascii: list[str]
    cjk: list[str]
    limit: int = 4000

    def offer(self, rng: random.Random, bucket: list[str], text: str, seen: int) -> None:
        if len(bucket) < self.limit:
            bucket.append(text)
        else:
            j = rng.randrange(seen)
            if j < self.limit:
                bucket[j] = text


def _rows(
    cfg: Config, vocab: Vocabulary, rng: random.Random, samples: Samples, ordinals: dict[str, int]
) -> Iterator[tuple[Any, ...]]:
    """Message rows (mid, id, session_id, seq, role, tool_name, text, created_at, deleted).

    ``mid`` is ``(ordinal << 24) + seq`` as the schema requires (``ordinals``:
    session id → ``sessions.ordinal``)."""
    per_session = [1] * cfg.sessions
    # Skewed session sizes: a few long sessions, many short ones.
    weights = [rng.paretovariate(1.2) for _ in range(cfg.sessions)]
    for sidx in rng.choices(range(cfg.sessions), weights=weights, k=max(0, cfg.messages - cfg.sessions)):
        per_session[sidx] += 1
    seqs = [0] * cfg.sessions
    order = [s for s, n in enumerate(per_session) for _ in range(n)]
    rng.shuffle(order)  # sessions interleave over time, like real use
    seen_ascii = seen_cjk = 0
    t0 = 1_700_000_000_000
    for n, sidx in enumerate(order, start=1):
        seqs[sidx] += 1
        r = rng.random()
        deleted = 0
        if r < 0.20:
            role, tool, text = "tool", rng.choice(("Read", "Bash", "Edit", "Grep")), None
        else:
            role, tool = ("user" if rng.random() < 0.4 else "assistant"), None
            if r < 0.02 + 0.20:
                role = "system"
            k = rng.random()
            if k < 0.05:
                text = _cjk_text(vocab, rng)
                seen_cjk += 1
                samples.offer(rng, samples.cjk, text, seen_cjk)
            elif k < 0.13:
                text = _code_text(vocab, rng)
            else:
                text = _sentence_text(vocab, rng)
                seen_ascii += 1
                samples.offer(rng, samples.ascii, text, seen_ascii)
            deleted = int(rng.random() < 0.005)
        sid = f"s{sidx:06d}"
        yield (message_mid(ordinals[sid], seqs[sidx]), f"m{n:09d}", sid, seqs[sidx], role, tool, text,
               t0 + n * 1000, deleted)


def build_database(cfg: Config, db_path: Path, rng: random.Random) -> tuple[dict[str, Any], Samples, Vocabulary]:
    vocab = Vocabulary(rng)
    samples = Samples([], [])
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        apply_pragmas(conn, synchronous="NORMAL")  # derived index rows: NORMAL is allowed
        apply_schema(conn)
        tune_index(conn)  # as the host's writer does when it opens the database
        t_start = time.perf_counter()
        conn.execute("BEGIN")
        n_projects = max(1, cfg.sessions // 50)
        for p in range(n_projects):
            a, b = vocab.sample(rng, 2)
            conn.execute(
                "INSERT INTO projects(id, path, name, created_at, last_opened_at) VALUES (?,?,?,?,?)",
                (p + 1, f"/home/dev/src/{a}-{b}-{p}", f"{a}-{b}", 0, 0),
            )
        conn.executemany(
            "INSERT INTO sessions(id, title, project_id, created_at, updated_at) VALUES (?,?,?,?,?)",
            (
                (f"s{i:06d}", " ".join(vocab.sample(rng, rng.randint(2, 6))).capitalize(),
                 rng.randint(1, n_projects) if rng.random() < 0.8 else None, 0, 0)
                for i in range(cfg.sessions)
            ),
        )
        conn.execute("COMMIT")
        gen_time = 0.0
        t_insert = time.perf_counter()
        ordinals = dict(conn.execute("SELECT id, ordinal FROM sessions").fetchall())
        rows = _rows(cfg, vocab, rng, samples, ordinals)
        text_bytes = 0
        while True:
            g0 = time.perf_counter()
            batch = list(itertools.islice(rows, BATCH))
            gen_time += time.perf_counter() - g0
            if not batch:
                break
            text_bytes += sum(len(r[6].encode()) for r in batch if r[6])
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO messages(mid, id, session_id, seq, role, tool_name, text, created_at, deleted) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                batch,
            )
            conn.execute("COMMIT")
        conn.execute("BEGIN")
        conn.execute(
            "UPDATE sessions SET "
            "last_seq = (SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = sessions.id), "
            "updated_at = (SELECT coalesce(max(created_at), 0) FROM messages m WHERE m.session_id = sessions.id)"
        )
        trashed = [(f"s{i:06d}",) for i in rng.sample(range(cfg.sessions), max(1, cfg.sessions // 100))]
        conn.executemany("UPDATE sessions SET deleted_at = 1 WHERE id = ?", trashed)
        conn.execute("COMMIT")
        insert_time = time.perf_counter() - t_insert - gen_time
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        sizes = _sizes(conn, db_path)
        build = {
            "messages": cfg.messages,
            "sessions": cfg.sessions,
            "textBytes": text_bytes,
            "generateSeconds": round(gen_time, 2),
            "insertSeconds": round(insert_time, 2),
            "indexBuildMsgsPerSec": round(cfg.messages / insert_time) if insert_time > 0 else None,
            "totalBuildSeconds": round(time.perf_counter() - t_start, 2),
            **sizes,
        }
    finally:
        conn.close()
    return build, samples, vocab


def _sizes(conn: sqlite3.Connection, db_path: Path) -> dict[str, Any]:
    db = db_path.stat().st_size
    wal = Path(f"{db_path}-wal")
    wal_bytes = wal.stat().st_size if wal.exists() else 0
    out: dict[str, Any] = {"dbFileMB": round(db / 2**20, 1), "walFileMB": round(wal_bytes / 2**20, 1)}
    try:
        per = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    except sqlite3.Error:
        return out  # dbstat not compiled in
    fts = sum(v for k, v in per.items() if k.startswith("messages_fts"))
    msgs = sum(v for k, v in per.items() if k == "messages" or k.startswith("sqlite_autoindex_messages"))
    out.update(ftsMB=round(fts / 2**20, 1), messagesTableMB=round(msgs / 2**20, 1))
    return out


# --- queries -------------------------------------------------------------------------


def _window(rng: random.Random, text: str, n: int, ok: Callable[[str], bool]) -> str | None:
    for _ in range(20):
        if len(text) < n:
            return None
        i = rng.randrange(len(text) - n + 1)
        w = text[i : i + n]
        if ok(w):
            return w
    return None


def make_queries(cfg: Config, samples: Samples, vocab: Vocabulary, rng: random.Random) -> dict[str, list[str]]:
    def distinct(gen: Callable[[], str | None]) -> list[str]:
        got: dict[str, None] = {}
        for _ in range(cfg.queries * 200):
            q = gen()
            if q and q.strip() == q:
                got[q] = None
            if len(got) >= cfg.queries:
                break
        return list(got)

    def letters(w: str) -> bool:
        return w.isascii() and w.isalpha()

    def from_word(n: int) -> Callable[[], str | None]:
        # Words drawn uniformly from the 3,000 most frequent: very common to fairly rare.
        return lambda: _window(rng, rng.choice(vocab.words[:3000]), n, letters)

    no_hit_letters = "qxzjv"
    return {
        "3char": distinct(from_word(3)),
        "8char": distinct(
            lambda: _window(rng, rng.choice(samples.ascii), 8, lambda w: " " in w.strip() or w.isalpha())
        ),
        "cjk": distinct(lambda: _window(rng, rng.choice(samples.cjk), rng.choice((3, 4)),
                                         lambda w: all(ord(c) > 0x2E80 and c not in "，。" for c in w))),
        "2char": distinct(from_word(2)),
        "nohit": distinct(lambda: "".join(rng.choice(no_hit_letters) for _ in range(rng.randint(5, 9)))),
    }


def _latency(times_ms: Sequence[float]) -> dict[str, float]:
    return {"p50ms": round(_pct(times_ms, 50), 2), "p95ms": round(_pct(times_ms, 95), 2),
            "maxms": round(max(times_ms), 2)}


def brute_force(conn: sqlite3.Connection, query: str) -> tuple[int, int]:
    """(matching messages, matching sessions) by scanning every text with the predicate."""
    pred = literal_predicate(normalize_query(query))
    trashed = {r[0] for r in conn.execute("SELECT id FROM sessions WHERE deleted_at IS NOT NULL")}
    per: Counter[str] = Counter()
    for sid, text in conn.execute(
        "SELECT session_id, text FROM messages WHERE role IN ('user', 'assistant') AND deleted = 0"
    ):
        if sid not in trashed and pred(text):
            per[sid] += 1
    titles = {
        sid
        for sid, title, path, name in conn.execute(
            "SELECT s.id, s.title, p.path, p.name FROM sessions s LEFT JOIN projects p ON p.id = s.project_id "
            "WHERE s.deleted_at IS NULL"
        )
        if pred(title) or pred(path) or pred(name)
    }
    return sum(per.values()), len(set(per) | titles)


def idle_upkeep(db_path: Path) -> dict[str, Any]:
    """What the host's DB writer does when idle: merge steps until none is left."""
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        apply_pragmas(conn, synchronous="NORMAL")
        before = segment_count(conn)
        steps = 0
        longest = 0.0
        t0 = time.perf_counter()
        while True:
            t = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            merged = upkeep_step(conn)
            conn.execute("COMMIT")
            longest = max(longest, time.perf_counter() - t)
            if not merged:
                break
            steps += 1
        seconds = time.perf_counter() - t0
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"steps": steps, "seconds": round(seconds, 1), "longestStepMs": round(longest * 1000, 1),
                "segmentsBefore": before, "segmentsAfter": segment_count(conn)}
    finally:
        conn.close()


def measure_messages(db_path: Path, queries: dict[str, list[str]]) -> dict[str, Any]:
    """``search.query`` (global, newest first, limit 50): p50/p95 of one run per query (no target)."""
    conn = open_reader(db_path)
    try:
        out: dict[str, Any] = {}
        for kind in KINDS:
            times = []
            for q in queries[kind]:
                t = time.perf_counter()
                search_messages(conn, q, limit=50)
                times.append((time.perf_counter() - t) * 1000)
            out[kind] = _latency(times)
        return out
    finally:
        conn.close()


def measure(cfg: Config, db_path: Path, queries: dict[str, list[str]], *, brute: bool = True) -> dict[str, Any]:
    conn = open_reader(db_path)
    try:
        search_sessions(conn, "warm up the page cache")  # first touch of the FTS pages
        out: dict[str, Any] = {}
        for kind in KINDS:
            qs = queries[kind]
            times: list[float] = []
            matches: list[int] = []
            per_query_median: dict[str, float] = {}
            for q in qs:
                samples = []
                for _ in range(cfg.reps):
                    t = time.perf_counter()
                    res = search_sessions(conn, q, limit=20, snippets_per_session=3)
                    samples.append((time.perf_counter() - t) * 1000)
                times.extend(samples)
                matches.append(res["totalMessageMatches"])
                per_query_median[q] = statistics.median(samples)
            brute_ms: list[float] = []
            fast_ms: list[float] = []
            mismatches = []
            for q in qs[: cfg.brute_queries if brute else 0]:
                t = time.perf_counter()
                n_msgs, n_sessions = brute_force(conn, q)
                brute_ms.append((time.perf_counter() - t) * 1000)
                fast_ms.append(per_query_median[q])
                res = search_sessions(conn, q, limit=1, snippets_per_session=0)
                if (res["totalMessageMatches"], res["totalSessions"]) != (n_msgs, n_sessions):
                    mismatches.append(q)
            out[kind] = {
                "queries": len(qs),
                "examples": qs[:5],
                **_latency(times),
                "medianMessageMatches": statistics.median(matches),
                "maxMessageMatches": max(matches),
                "bruteQueries": len(brute_ms),
                "bruteP50ms": round(_pct(brute_ms, 50), 1) if brute_ms else None,
                "speedupP50": round(_pct(brute_ms, 50) / max(_pct(fast_ms, 50), 1e-6), 1) if brute_ms else None,
                "countMismatchesVsBrute": mismatches,
            }
        return out
    finally:
        conn.close()


def run(
    *,
    messages: int = 20_000,
    sessions: int = 100,
    out: Path | None = None,
    queries: int = 20,
    reps: int = 3,
    brute_queries: int = 5,
    seed: int = 7,
) -> dict[str, Any]:
    if messages < sessions or sessions < 1:
        raise ValueError("need at least one session and at least as many messages as sessions")
    if queries < 1 or reps < 1 or brute_queries < 0:
        raise ValueError("queries and reps must be positive")
    out_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="bench-search-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = Config(messages, sessions, out_dir, queries, reps, brute_queries, seed)
    db_path = out_dir / "bench-search.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    build, samples, vocab = build_database(cfg, db_path, rng)
    qs = make_queries(cfg, samples, vocab, rng)
    as_built = measure(cfg, db_path, qs, brute=False)
    upkeep = idle_upkeep(db_path)
    latency = measure(cfg, db_path, qs)
    messages_latency = measure_messages(db_path, qs)
    long_kinds = ("3char", "8char", "cjk", "nohit")
    result = {
        "bench": "search",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "build": build,
        "idleUpkeep": upkeep,
        "asBuilt": {k: {f: v[f] for f in ("p50ms", "p95ms", "maxms")} for k, v in as_built.items()},
        "searchSessions": latency,
        "searchQuery": messages_latency,
        "targets": {
            "p95Under100msFor3PlusChars": {k: latency[k]["p95ms"] < P95_TARGET_MS for k in long_kinds},
            "atLeast50xBruteForce": {k: latency[k]["speedupP50"] >= SPEEDUP_TARGET for k in long_kinds},
        },
        "countsAgreeWithBruteForce": all(not v["countMismatchesVsBrute"] for v in latency.values()),
        "wallSeconds": round(time.perf_counter() - t0, 1),
        "database": str(db_path),
    }
    (out_dir / "bench_search.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--sessions", type=int, default=None, help="default: messages / 200")
    ap.add_argument("--out", type=Path, default=None, help="directory for the database and JSON (default: a temp dir)")
    ap.add_argument("--queries", type=int, default=20, help="distinct queries per kind")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per query")
    ap.add_argument("--brute-queries", type=int, default=5, help="queries per kind also run as a brute-force scan")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep-db", action="store_true", help="keep the generated database")
    args = ap.parse_args(argv)
    sessions = args.sessions if args.sessions is not None else max(1, args.messages // 200)
    result = run(messages=args.messages, sessions=sessions, out=args.out, queries=args.queries,
                 reps=args.reps, brute_queries=args.brute_queries, seed=args.seed)
    if not args.keep_db:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{result['database']}{suffix}").unlink(missing_ok=True)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return result


if __name__ == "__main__":
    main()
