"""Run environment snapshot: canonical digest, bounds, secret refusal, verification on read."""

from __future__ import annotations

import hashlib
import sqlite3

import orjson
import pytest

from protocol.models_turns import RunEnvironmentSnapshot
from store.errors import CorruptData, InvalidInput, NotFound, PayloadTooLarge
from store.indexing.database import open_writer
from store.snapshots import (
    DEFAULT_SECTIONS_SLACK_BYTES,
    MAX_SNAPSHOT_DEPTH,
    canonical_bytes,
    find_secret,
    load_snapshot,
    prepare_snapshot,
    store_snapshot,
    verify_snapshot,
)

NOW = 1_700_000_000_000
SNAP = {"version": 1, "connection": {"baseUrl": "https://x", "apiKeyRef": "secret:a"}, "model": {"id": "m"},
        "parameters": {"b": 2, "a": 1}, "systemPrompt": "hi", "credentialRefs": ["secret:a"]}


@pytest.fixture
def conn(tmp_path):
    c, _ = open_writer(tmp_path / "pi.sqlite", quarantine_dir=tmp_path / "q", now_ms=NOW)
    c.execute("INSERT INTO sessions(id, created_at, updated_at) VALUES ('s1', 1, 1)")
    c.execute("INSERT INTO turns(id, session_id, started_at) VALUES ('t1', 's1', 1)")
    yield c
    c.close()


def test_digest_is_sha256_of_canonical_json_independent_of_key_order():
    a = prepare_snapshot(SNAP)
    b = prepare_snapshot(dict(reversed(list(SNAP.items()))))
    assert a.digest == b.digest == hashlib.sha256(a.json_text.encode()).hexdigest()
    assert a.json_text == orjson.dumps(SNAP, option=orjson.OPT_SORT_KEYS).decode()
    assert a.size == len(a.json_text.encode()) and a.version == 1


@pytest.mark.parametrize("bad", [
    {"connection": {"apiKey": "sk-123"}},
    {"connection": {"headers": {"X-Api-Key": "k"}}},
    {"executionBindings": {"env": [{"client_secret": "v"}]}},
    {"executionBindings": {"env": {"GITHUB_TOKEN": "ghp_x"}}},
    {"connection": {"OPENAI_API_KEY": "sk"}},
    {"parameters": {"PASSWORD": "hunter2"}},
    {"capabilities": {"auth": "Bearer abcdefghijklmnopqrstuvwxyz"}},
])
def test_secret_looking_values_are_refused(bad):
    with pytest.raises(InvalidInput) as info:
        prepare_snapshot({**SNAP, **bad})
    assert info.value.code == "INVALID_PARAMS"
    assert "credential reference" in info.value.message


def test_references_and_descriptive_sections_are_allowed():
    assert find_secret({**SNAP, "connection": {"apiKey": "", "tokenRef": "secret:x", "token": None}}) is None
    schema = {"properties": {"password": {"type": "string"}, "token": "describes a token"}}
    assert find_secret({**SNAP, "toolSchemas": [schema], "skills": [{"token": "text"}]}) is None
    assert find_secret({**SNAP, "parameters": {"eosToken": "</s>", "maxTokens": 5}}) is None


def test_unknown_version_oversize_and_depth_are_refused():
    with pytest.raises(InvalidInput):
        prepare_snapshot({**SNAP, "version": 2})
    with pytest.raises(InvalidInput):
        prepare_snapshot({**SNAP, "version": True})
    with pytest.raises(PayloadTooLarge) as info:
        prepare_snapshot({**SNAP, "systemPrompt": "x" * 2048}, max_bytes=1024)
    assert info.value.code == "PAYLOAD_TOO_LARGE"
    deep: dict = {}
    cur = deep
    for _ in range(MAX_SNAPSHOT_DEPTH + 1):
        cur["k"] = {}
        cur = cur["k"]
    with pytest.raises(InvalidInput):
        prepare_snapshot({**SNAP, "parameters": deep})


def test_stored_snapshot_round_trips(conn):
    snap = prepare_snapshot(SNAP)
    store_snapshot(conn, "t1", snap, NOW)
    got = load_snapshot(conn, "t1")
    assert got == {"version": 1, "digest": snap.digest, "snapshot": SNAP}
    with pytest.raises(NotFound):
        load_snapshot(conn, "t2")


def _tamper(conn: sqlite3.Connection, sql: str, *args: object) -> None:
    conn.execute(sql, args)


@pytest.mark.parametrize("sql,args", [
    ("UPDATE run_snapshots SET snapshot_json = replace(snapshot_json, '\"hi\"', '\"ho\"')", ()),  # digest
    ("UPDATE run_snapshots SET version = 7", ()),  # unknown version
    ("UPDATE run_snapshots SET size_bytes = size_bytes + 1", ()),  # size
    ("UPDATE run_snapshots SET digest = ?", ("0" * 64,)),
])
def test_tampered_snapshot_is_corrupt_data(conn, sql, args):
    store_snapshot(conn, "t1", prepare_snapshot(SNAP), NOW)
    _tamper(conn, sql, *args)
    with pytest.raises(CorruptData) as info:
        load_snapshot(conn, "t1")
    assert info.value.code == "CORRUPT_DATA"


def test_verify_rejects_oversized_record_even_if_digest_matches():
    text = orjson.dumps({"version": 1, "p": "x" * 100}).decode()
    digest = hashlib.sha256(text.encode()).hexdigest()
    assert verify_snapshot(1, digest, text, len(text))["p"] == "x" * 100
    with pytest.raises(CorruptData):
        verify_snapshot(1, digest, text, len(text), max_bytes=50)


def test_the_limit_measures_the_snapshot_as_sent_and_the_defaults_fit_the_stored_slack():
    """protocol/README §7: 1 MiB of canonical JSON, measured on what the client sent; the sections it left
    out are stored with their empty defaults, which always fit in the stored record's slack."""
    every_default = RunEnvironmentSnapshot.model_validate({"version": 1}).model_dump(mode="json", by_alias=True)
    assert len(canonical_bytes(every_default)) - len(canonical_bytes({"version": 1})) \
        < DEFAULT_SECTIONS_SLACK_BYTES
    sent = {"version": 1, "systemPrompt": ""}
    sent["systemPrompt"] = "p" * (1024 * 1024 - len(canonical_bytes(sent)))
    assert len(canonical_bytes(sent)) == 1024 * 1024
    full = RunEnvironmentSnapshot.model_validate(sent).model_dump(mode="json", by_alias=True)
    snap = prepare_snapshot(full, sent=sent)
    assert snap.size > 1024 * 1024
    assert verify_snapshot(snap.version, snap.digest, snap.json_text, snap.size) == full
    with pytest.raises(PayloadTooLarge):
        prepare_snapshot({**full, "systemPrompt": full["systemPrompt"] + "p"},
                         sent={**sent, "systemPrompt": sent["systemPrompt"] + "p"})
