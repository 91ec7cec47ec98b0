#!/usr/bin/env python3
"""Trigram index variants, side by side: CPU, bytes and search p95 of each FTS5 layout.

    python scripts/bench_index_variants.py                      # 50,000 messages, one session
    python scripts/bench_index_variants.py --messages 200000 --sessions 400
    python scripts/bench_index_variants.py --options --only "(v22 layout),automerge"   # FTS5 options

Builds every variant of ``messages_fts`` on the SAME corpus in one run, through
the real schema (``apply_schema`` with only the ``CREATE VIRTUAL TABLE
messages_fts`` statement swapped, the host's triggers unchanged) and the host's
index options (``tune_index``), inserting messages in transactions of 64
rows like the DB writer's group commits (one multi-row INSERT per batch, as
``store.indexing.index.insert_message_rows`` does, unless the variant says
"row per statement"; "batch 1"/"batch 512": other transaction sizes; with ``--options``, "automerge N",
"pgsz N": other FTS5 options over the host's, "wal_autocheckpoint", "page_size": other settings of the
file, whose floor is not measured again: their CPU column holds the non-index tables' share too); then the writer's idle
merges (``upkeep_step`` until none is left), then ``search.sessions`` (limit 20,
3 snippets) for the 3-char, 8-char, CJK and no-hit queries of
``scripts/bench_search.py`` drawn from this corpus, and a scan of every text
with the search predicate for a subset of them (counts must be equal: exact).

The corpus is the "~1 KB message" of the append benchmarks: text of 300-3,000
characters (log-uniform; a ~30,000-word Zipf vocabulary, ~8 % code, ~5 % CJK),
~20 % tool rows (their output is in the transcript, NULL text in the index).
The transcript bytes are the lines the host writes for these messages
(``normalize_message`` + ``dumps_line``), so "disk per message" is what one
session's ``.jsonl`` plus the SQLite index (``pi.sqlite``: messages table,
trigram index and the rest, after checkpoint, free pages not counted) cost.

Columns: CPU µs per message indexed (process CPU of the inserts minus the same
inserts into the variant without a trigram index, triggers dropped), trigram
index bytes per message (dbstat over the ``messages_fts*`` tables), disk per
message, search p95 per query kind, the smallest speedup over the scan, and
exact = the counts equal the scan's for every scanned query.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent
for _p in (ROOT, SCRIPTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import bench_common  # noqa: E402 - after the sys.path setup above
import bench_search as bs  # noqa: E402 - after the sys.path setup above

from store.indexing.database import apply_pragmas  # noqa: E402
from store.jsonio import dumps_line  # noqa: E402
from store.search.search_upkeep import tune_index, upkeep_step  # noqa: E402
from store.transcripts.records import normalize_message  # noqa: E402
from store.upgrade.schema import DDL, apply_schema, message_mid  # noqa: E402

KINDS = ("3char", "8char", "cjk", "nohit")


@dataclass(frozen=True)
class Variant:
    name: str
    fts_sql: str | None
    """The ``CREATE VIRTUAL TABLE messages_fts`` statement, or None: no trigram index (the floor)."""
    batch: int = 64
    one_statement: bool = True
    """The batch's rows in multi-row INSERTs (``insert_message_rows``, what the host's indexer does),
    or one INSERT per row (what it did before: FTS5 writes a segment per statement)."""
    fts_config: tuple[tuple[str, int], ...] = ()
    """FTS5 options set after the host's own (``tune_index``): e.g. ``automerge``, ``crisismerge``, ``pgsz``.
    Runtime settings in ``messages_fts_config``: the index's content and every answer stay the same."""
    pragmas: tuple[tuple[str, int], ...] = ()
    """Connection PRAGMAs after the host's (``apply_pragmas``), e.g. ``wal_autocheckpoint``."""
    page_size: int | None = None
    """The database's page size (set before its first table; None: SQLite's default, as the host's)."""

    @property
    def is_schema(self) -> bool:
        """The schema's own index as the host's indexer writes it."""
        return (self.fts_sql == _stock() and self.batch == 64 and self.one_statement and not self.fts_config
                and not self.pragmas and self.page_size is None)


def _fts(options: str) -> str:
    return f"CREATE VIRTUAL TABLE messages_fts USING fts5(\n  text,\n  {options}tokenize='trigram'\n)"


VARIANTS: tuple[Variant, ...] = (
    Variant("no trigram index (floor)", None),
    Variant("no trigram index, row per statement", None, one_statement=False),
    Variant("detail=full, row per statement (before)", _fts("content='',\n  "), one_statement=False),
    Variant("detail=full (v22 layout)", _fts("content='',\n  ")),
    Variant("detail=full, columnsize=0", _fts("content='', columnsize=0,\n  ")),
    Variant("detail=column", _fts("content='', detail=column,\n  ")),
    Variant("detail=none", _fts("content='', detail=none,\n  ")),
    Variant("detail=none, columnsize=0", _fts("content='', detail=none, columnsize=0,\n  ")),
    Variant("detail=none, content=messages", _fts("content='messages', content_rowid='mid', detail=none,\n  ")),
    Variant("detail=none, row per statement", _fts("content='', detail=none,\n  "), one_statement=False),
    Variant("detail=full, batch 1", _fts("content='',\n  "), batch=1),
    Variant("detail=full, batch 512", _fts("content='',\n  "), batch=512),
)

OPTION_VARIANTS: tuple[Variant, ...] = (
    # The v22 layout with other FTS5 merge/page options and file settings (content and answers unchanged);
    # run with --options (scripts/bench leaves them out):
    Variant("detail=full, automerge 4 (FTS5 default)", _fts("content='',\n  "), fts_config=(("automerge", 4),)),
    Variant("detail=full, automerge 16", _fts("content='',\n  "), fts_config=(("automerge", 16),)),
    Variant("detail=full, automerge 0 (crisismerge only)", _fts("content='',\n  "), fts_config=(("automerge", 0),)),
    Variant("detail=full, pgsz 4050 (FTS5 default)", _fts("content='',\n  "), fts_config=(("pgsz", 4050),)),
    Variant("detail=full, wal_autocheckpoint 10000", _fts("content='',\n  "),
            pragmas=(("wal_autocheckpoint", 10_000),)),
    Variant("detail=full, page_size 16384", _fts("content='',\n  "), page_size=16_384),
)


# --- corpus ------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    rows: list[tuple[Any, ...]]
    """(mid, id, session_id, seq, role, tool_name, text, created_at, deleted) for ``messages``."""
    transcript_bytes: int
    samples: bs.Samples
    vocab: bs.Vocabulary
    sessions: int


def _text_of(vocab: bs.Vocabulary, rng: random.Random, kind: str) -> str:
    """Text of 300-3,000 characters (log-uniform), CJK a third of that (3 bytes each)."""
    n = int(math.exp(rng.uniform(math.log(300), math.log(3000))))
    make = {"cjk": bs._cjk_text, "code": bs._code_text, "prose": bs._sentence_text}[kind]
    if kind == "cjk":
        n //= 3
    parts: list[str] = []
    size = 0
    while size < n:
        part = make(vocab, rng)
        parts.append(part)
        size += len(part) + 1
    return ("\n" if kind == "code" else " ").join(parts)[:n].strip() or "x"


def _history_message(source: bench_common.Corpus, mid: str, n: int) -> tuple[dict[str, Any], str | None]:
    """A message of ``scripts/bench_history.py``'s 50,000-message session and its indexed text."""
    message = source.message(mid, n)
    if message["role"] == "tool":
        return message, None
    return message, "".join(b["text"] for b in message["blocks"] if b["type"] == "text")


def build_corpus(messages: int, sessions: int, seed: int, kind_of_corpus: str = "zipf") -> Corpus:
    if kind_of_corpus == "history":
        return _build_history_corpus(messages, sessions, seed)
    rng = random.Random(seed)
    vocab = bs.Vocabulary(rng)
    samples = bs.Samples([], [])
    rows: list[tuple[Any, ...]] = []
    transcript = 0
    seqs = [0] * sessions
    seen = {"prose": 0, "cjk": 0}
    now = 1_700_000_000_000
    for n in range(messages):
        s = n % sessions
        seqs[s] += 1
        r = rng.random()
        k = rng.random()
        kind = "cjk" if k < 0.05 else "code" if k < 0.13 else "prose"
        text = _text_of(vocab, rng, kind)
        mid = f"m{n:09d}"
        if r < 0.2:  # tool row: output in the transcript, NULL text in the index
            message: dict[str, Any] = {"id": mid, "role": "tool", "toolName": "Read", "blocks": [
                {"type": "tool_result", "callId": f"c-{mid}", "content": text}]}
            role, tool, indexed = "tool", "Read", None
        else:
            role = "user" if r < 0.5 else "assistant"
            message = {"id": mid, "role": role, "blocks": [{"type": "text", "text": text}]}
            tool, indexed = None, text
            if kind in seen:
                seen[kind] += 1
                bucket = samples.cjk if kind == "cjk" else samples.ascii
                samples.offer(rng, bucket, text, seen[kind])
        transcript += len(dumps_line(normalize_message(message, now_ms=now + n)))
        rows.append((message_mid(s + 1, seqs[s]), mid, f"s{s:06d}", seqs[s], role, tool, indexed, now + n, 0))
    return Corpus(rows, transcript, samples, vocab, sessions)


def _build_history_corpus(messages: int, sessions: int, seed: int) -> Corpus:
    """``bench_common.Corpus`` (what the history and append sections write): its small
    vocabulary makes every 3-character query common, and it holds no CJK."""
    rng = random.Random(seed)
    source = bench_common.Corpus(seed)
    vocab = bs.Vocabulary(rng, size=len(dict.fromkeys(bs._COMMON)))
    # No CJK text in this corpus: CJK queries are cut from generated CJK and find nothing.
    samples = bs.Samples([], [bs._cjk_text(vocab, rng) for _ in range(50)])
    vocab.words = list(bench_common._WORDS)  # the words the queries are cut from
    rows: list[tuple[Any, ...]] = []
    transcript = 0
    seqs = [0] * sessions
    now = 1_700_000_000_000
    for n in range(messages):
        s = n % sessions
        seqs[s] += 1
        mid = f"m{n:09d}"
        message, text = _history_message(source, mid, n)
        if text is not None:
            samples.offer(rng, samples.ascii, text, n + 1)
        transcript += len(dumps_line(normalize_message(message, now_ms=now + n)))
        rows.append((message_mid(s + 1, seqs[s]), mid, f"s{s:06d}", seqs[s], message["role"],
                     message.get("toolName"), text, now + n, 0))
    return Corpus(rows, transcript, samples, vocab, sessions)


# --- one variant --------------------------------------------------------------------


def _stock() -> str:
    """The schema's own ``messages_fts`` statement."""
    return next(s for s in DDL if s.startswith("CREATE VIRTUAL TABLE messages_fts"))


def _ddl(variant: Variant) -> tuple[str, ...]:
    stock = _stock()
    if variant.fts_sql is None:
        return DDL
    return tuple(variant.fts_sql if s == stock else s for s in DDL)


def _batches(rows: Sequence[tuple[Any, ...]], size: int) -> Iterator[Sequence[tuple[Any, ...]]]:
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def build_variant(variant: Variant, corpus: Corpus, db_path: Path) -> dict[str, Any]:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    conn = sqlite3.connect(str(db_path), isolation_level=None)
    try:
        if variant.page_size is not None:
            conn.execute(f"PRAGMA page_size = {int(variant.page_size)}")
        apply_pragmas(conn, synchronous="NORMAL")
        for name, value in variant.pragmas:
            conn.execute(f"PRAGMA {name} = {int(value)}")
        apply_schema(conn, statements=_ddl(variant))
        if variant.fts_sql is None:
            for trigger in ("messages_ai", "messages_ad", "messages_au"):
                conn.execute(f"DROP TRIGGER {trigger}")
        else:
            tune_index(conn)
            for key, value in variant.fts_config:
                conn.execute("INSERT INTO messages_fts(messages_fts, rank) VALUES (?, ?)", (key, value))
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO sessions(id, title, created_at, updated_at) VALUES (?,?,?,?)",
            ((f"s{i:06d}", f"session {i}", 0, 0) for i in range(corpus.sessions)),
        )
        conn.execute("COMMIT")
        sql = ("INSERT INTO messages(mid, id, session_id, seq, role, tool_name, text, created_at, deleted) "
               "VALUES (?,?,?,?,?,?,?,?,?)")
        cpu0 = time.process_time()
        for batch in _batches(corpus.rows, variant.batch):
            conn.execute("BEGIN")
            if variant.one_statement:
                values = ",".join(["(?,?,?,?,?,?,?,?,?)"] * len(batch))
                conn.execute(sql.replace("(?,?,?,?,?,?,?,?,?)", values), [v for r in batch for v in r])
            else:
                conn.executemany(sql, batch)
            conn.execute("COMMIT")
        insert_cpu = time.process_time() - cpu0
        conn.execute("UPDATE sessions SET "
                     "last_seq = (SELECT max(seq) FROM messages m WHERE m.session_id = sessions.id), "
                     "updated_at = (SELECT max(created_at) FROM messages m WHERE m.session_id = sessions.id)")
        merge_cpu = 0.0
        if variant.fts_sql is not None:
            cpu0 = time.process_time()
            while True:
                conn.execute("BEGIN IMMEDIATE")
                merged = upkeep_step(conn)
                conn.execute("COMMIT")
                if not merged:
                    break
            merge_cpu = time.process_time() - cpu0
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
        used = (int(conn.execute("PRAGMA page_count").fetchone()[0])
                - int(conn.execute("PRAGMA freelist_count").fetchone()[0])) * page
        per = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
        fts = sum(v for k, v in per.items() if k.startswith("messages_fts"))
    finally:
        conn.close()
    n = len(corpus.rows)
    return {"insertCpuUs": insert_cpu / n * 1e6, "mergeCpuUs": merge_cpu / n * 1e6, "dbBytes": used,
            "ftsBytes": fts}


def search_variant(corpus: Corpus, db_path: Path, queries: dict[str, list[str]], reps: int,
                   brute_queries: int) -> dict[str, Any]:
    cfg = bs.Config(len(corpus.rows), corpus.sessions, db_path.parent, len(queries["3char"]), reps,
                    brute_queries, 0)
    got = bs.measure(cfg, db_path, {**queries, "2char": queries["3char"][:1]})
    return {kind: got[kind] for kind in KINDS}


# --- the run ------------------------------------------------------------------------


def run(*, messages: int = 50_000, sessions: int = 1, queries: int = 20, reps: int = 3, brute_queries: int = 5,
        seed: int = 7, out: Path | None = None, only: Sequence[str] = (), corpus_kind: str = "zipf",
        options: bool = False) -> dict[str, Any]:
    out_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="bench-index-variants-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus = build_corpus(messages, sessions, seed, corpus_kind)
    cfg = bs.Config(messages, sessions, out_dir, queries, reps, brute_queries, seed)
    qs = bs.make_queries(cfg, corpus.samples, corpus.vocab, random.Random(seed + 1))
    rows: list[dict[str, Any]] = []
    floor_cpu: dict[bool, float] = {}  # per way of inserting
    db_path = out_dir / "variant.sqlite"
    for variant in VARIANTS + (OPTION_VARIANTS if options else ()):
        if only and variant.fts_sql is not None and not any(o in variant.name for o in only):
            continue
        built = build_variant(variant, corpus, db_path)
        row: dict[str, Any] = {"variant": variant.name, "batch": variant.batch, "oneStatement": variant.one_statement,
                               "schema": variant.is_schema,
                               **built}
        if variant.fts_sql is None:
            floor_cpu[variant.one_statement] = built["insertCpuUs"]
        else:
            row["indexCpuUs"] = built["insertCpuUs"] - floor_cpu.get(variant.one_statement, 0.0)
            row["search"] = search_variant(corpus, db_path, qs, reps, brute_queries)
        row["indexBytesPerMessage"] = built["ftsBytes"] / messages
        row["diskBytesPerMessage"] = (built["dbBytes"] + corpus.transcript_bytes) / messages
        rows.append(row)
        print(_line(row), flush=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path}{suffix}").unlink(missing_ok=True)
    result = {
        "bench": "index-variants",
        "sqlite": sqlite3.sqlite_version,
        "messages": messages,
        "sessions": sessions,
        "corpus": corpus_kind,
        "transcriptBytesPerMessage": corpus.transcript_bytes / messages,
        "searchableMessages": sum(1 for r in corpus.rows if r[6] is not None),
        "trigramPositionsPerMessage": trigram_positions(corpus) / messages,
        "examples": {k: v[:3] for k, v in qs.items()},
        "variants": rows,
        "wallSeconds": round(time.perf_counter() - t0, 1),
    }
    (out_dir / "bench_index_variants.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def trigram_positions(corpus: Corpus) -> int:
    """Trigram occurrences in the indexed texts (a text of n characters holds n - 2): what an index that
    keeps positions (``detail=full``, the one an 8-character phrase is answered from without reading the
    texts) stores at least one byte for each (FTS5 writes a position as a varint delta, 1 byte at least)."""
    return sum(max(0, len(r[6]) - 2) for r in corpus.rows if r[6] is not None)


HEADER = (f"{'variant':<40} {'batch':>5} {'CPU µs/msg':>10} {'merge µs':>8} {'index B/msg':>11} "
          f"{'disk B/msg':>10} " + " ".join(f"{k + ' p95':>10}" for k in KINDS) + f" {'min ×scan':>9} {'exact':>5}")


def _line(row: dict[str, Any]) -> str:
    search = row.get("search")
    whole = "(" + format(row["insertCpuUs"], ".1f") + ")"
    cpu = f"{row['indexCpuUs']:10.1f}" if "indexCpuUs" in row else f"{whole:>10}"
    name = ("* " if row.get("schema") else "") + row["variant"]
    head = (f"{name:<40} {row['batch']:>5} {cpu} {row['mergeCpuUs']:8.1f} "
            f"{row['indexBytesPerMessage']:11.0f} {row['diskBytesPerMessage']:10.0f}")
    if not search:
        return head
    p95 = " ".join(f"{search[k]['p95ms']:8.2f}ms" for k in KINDS)
    speed = min(search[k]["speedupP50"] or math.inf for k in KINDS)
    exact = "yes" if all(not search[k]["countMismatchesVsBrute"] for k in KINDS) else "NO"
    return f"{head} {p95} {speed:9.0f} {exact:>5}"


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{result['corpus']} corpus: {result['messages']:,} messages in {result['sessions']} session(s), "
        f"SQLite {result['sqlite']}; "
        f"transcript {result['transcriptBytesPerMessage']:.0f} B/message; CPU of the floor row is its whole "
        "insert (in parentheses), of the others the extra over the floor inserting the same way; "
        "* = the schema's own index as the host's indexer writes it",
        HEADER,
        *(_line(r) for r in result["variants"]),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--queries", type=int, default=20, help="distinct queries per kind")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per query")
    ap.add_argument("--brute-queries", type=int, default=5, help="queries per kind also counted by a scan")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default="", help="comma-separated substrings of variant names (the floor always runs)")
    ap.add_argument("--corpus", choices=("zipf", "history"), default="zipf",
                    help="zipf: a 30,000-word Zipf vocabulary with code and CJK; history: bench_common.Corpus, "
                         "the messages of the history and append sections")
    ap.add_argument("--options", action="store_true",
                    help="also the v22 layout with other FTS5 options (automerge, pgsz) and file settings")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    print(HEADER, flush=True)
    result = run(messages=args.messages, sessions=args.sessions, queries=args.queries, reps=args.reps,
                 brute_queries=args.brute_queries, seed=args.seed, out=args.out,
                 only=[o for o in args.only.split(",") if o], corpus_kind=args.corpus, options=args.options)
    print()
    print(table(result))
    return result


if __name__ == "__main__":
    main()
