"""An outsider's audit of seed 003 §12 (native pi session authority, ADR 0254), black-box against real
``pi-host serve --native-pi-root DIR`` processes, on recorded pi v3 files (``tests/fixtures/recorded/pi``)
and the shared pi samples. What the other native tests (``tests/native_pi``, the §12 part of
``test_seed003_tail_outsider.py``) leave loose:

* every method of the published schema that takes a ``sessionId``, except ``session.get``/``fork``/
  ``export``, refuses a native id with ``UNSUPPORTED_FOR_NATIVE_SESSION`` and changes nothing (README §3:
  "every other method refuses one");
* list, get, fork and a restart leave no row naming a native session in any table and no file in the
  data directory's ``sessions/`` (§12: "never inserted into SQLite and never copied");
* a damaged pi file (an entry whose ``type`` is not a string, a header that is not one, a format pi never
  wrote) never makes ``session.list`` or ``session.get`` fail ``INTERNAL``: it is left out or read as far
  as it can be (README §9), and the good sessions beside it are still listed;
* a fork into a read-only directory is a clear error and leaves no file behind; a foreign file under a
  keyed fork's child name is never answered or removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient, open_client
from tests.acceptance.outsiderkit import code_of, data_dir, error_of, killed_during
from tests.hostkit import HostProcess, start_host_process
from tests.samplekit import REPO, samples_dir

RECORDED = REPO / "tests" / "fixtures" / "recorded" / "pi" / "0.73.1" / "sessions"
SCHEMA = REPO / "protocol" / "schema.json"
NATIVE_METHODS = {"session.get", "session.fork", "session.export"}


def pi_files() -> list[Path]:
    """The recorded pi 0.73.1 sessions and the shared pi samples (real files; never invented here)."""
    return sorted(RECORDED.rglob("*.jsonl")) + sorted((samples_dir() / "pi").glob("*.jsonl"))


def make_root(tmp_path: Path) -> Path:
    """A pi session root holding copies of every real pi file, as pi names them, in one project folder."""
    root = tmp_path / "pi"
    project = root / "--work-demo--"
    project.mkdir(parents=True)
    for i, src in enumerate(pi_files()):
        pi_named = "_" in src.name and src.name[:4].isdigit()
        name = src.name if pi_named else f"2026-06-0{i % 9 + 1}T10-00-00-000Z_{src.stem}.jsonl"
        shutil.copyfile(src, project / name)
    return root


def tree(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``root``: its bytes, mtime and inode."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino)
            for p in sorted(root.rglob("*")) if p.is_file()}


@asynccontextmanager
async def native_host(data: Path, pi_root: Path) -> AsyncIterator[tuple[HostProcess, HostClient]]:
    proc = start_host_process(data, "--native-pi-root", str(pi_root))
    try:
        async with open_client(proc.url, proc.token, client_id="outsider", client_kind="ui") as c:
            yield proc, c
    finally:
        proc.kill9()


async def native_ids(c: HostClient) -> list[str]:
    ids: list[str] = []
    params: dict[str, Any] = {"limit": 200}
    while True:
        page = await c.call("session.list", params)
        ids += [s["id"] for s in page["sessions"] if s.get("source") == "native-pi"]
        if not page.get("nextCursor"):
            return ids
        params = {"limit": 200, "cursor": page["nextCursor"]}


def rows_naming_native(data: Path, *, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Per table, the rows of the host's database that mention a native id anywhere."""
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        out: dict[str, int] = {}
        for table in tables:
            if table in skip or table.startswith("sqlite_"):
                continue
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]
            if not cols:
                continue
            where = " OR ".join(f'CAST("{col}" AS TEXT) LIKE \'%native-pi%\'' for col in cols)
            found = conn.execute(f'SELECT COUNT(*) FROM "{table}" WHERE {where}').fetchone()[0]
            if found:
                out[table] = found
        return out
    finally:
        conn.close()


def host_session_count(data: Path) -> tuple[int, int]:
    conn = sqlite3.connect(data / "pi.sqlite")
    try:
        return (conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0],
                conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0])
    finally:
        conn.close()


def session_methods() -> list[str]:
    """Every method of the published schema whose params carry a ``sessionId``."""
    schema = json.loads(SCHEMA.read_text())
    defs = schema["$defs"]
    out = []
    for name, method in schema["methods"].items():
        ref = method["params"].get("$ref", "").rsplit("/", 1)[-1]
        if "sessionId" in defs.get(ref, {}).get("properties", {}):
            out.append(name)
    return sorted(out)


# ------------------------------------------------------------------------------------ refusals


async def test_every_other_session_method_refuses_a_native_id_and_changes_nothing(tmp_path: Path) -> None:
    """README §3: a native id is accepted by ``session.get``, ``session.fork`` and ``session.export`` only;
    "every other method refuses one with ``UNSUPPORTED_FOR_NATIVE_SESSION``" (§12: rename, delete, project
    move, revision, Plan/Goal, collaboration and queue operations "remain unsupported"). Swept over every
    method of ``protocol/schema.json`` with a ``sessionId``; the pi root, the database and ``sessions/`` are
    unchanged afterwards."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    before = tree(pi_root)
    methods = [m for m in session_methods() if m not in NATIVE_METHODS]
    assert {"session.rename", "session.delete", "session.update", "session.saveActiveRevision",
            "plans.submit", "collab.begin", "session.queuePush"} <= set(methods)
    wrong: dict[str, Any] = {}
    with trio.fail_after(120):
        async with native_host(data, pi_root) as (proc, c):
            target = (await native_ids(c))[0]
            for method in methods:
                code, info = await error_of(c, method, {"sessionId": target})
                if code != "UNSUPPORTED_FOR_NATIVE_SESSION" or info.get("sessionId") != target:
                    wrong[method] = code
            assert target in await native_ids(c)
            proc.kill9()
    assert wrong == {}
    assert tree(pi_root) == before
    assert host_session_count(data) == (0, 0)
    assert rows_naming_native(data) == {}
    assert [p.name for p in (data / "sessions").iterdir()] == []


# ------------------------------------------------------------------------------ never copied here


async def test_list_get_fork_and_a_restart_leave_no_row_and_no_copy(tmp_path: Path) -> None:
    """§12: native sessions "are never inserted into SQLite and never copied to the Desktop transcript
    directory"; detail reads never modify the source (bytes, mtime, inode). Every recorded pi file is listed
    and read whole; one is forked (keyed); the host restarts on the same data directory and lists the same
    sessions plus the child. No table row names a native id (but the fork's receipt), ``sessions/`` stays
    empty, and every source file is byte-, mtime- and inode-identical."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    before = tree(pi_root)
    with trio.fail_after(120):
        async with native_host(data, pi_root) as (proc, c):
            ids = await native_ids(c)
            assert len(ids) == len(before)
            totals = {}
            for sid in ids:
                page = await c.call("session.get", {"sessionId": sid, "full": True})
                assert page["session"]["id"] == sid and page["session"]["source"] == "native-pi"
                totals[sid] = page["totalMessages"]
                await c.call("session.export", {"sessionId": sid, "format": "jsonl"})
            parent = next(s for s in ids if totals[s] > 1)
            child = await c.call("session.fork", {"sessionId": parent, "title": "audit child",
                                                  "submissionId": "audit-fork"})
            assert child["source"] == "native-pi" and child["native"] == {"version": 3, "readOnly": True}
            await trio.to_thread.run_sync(proc.terminate)  # the loop answers the closing handshake meanwhile
        after_fork = tree(pi_root)
        async with native_host(data, pi_root) as (proc, c):
            assert sorted(await native_ids(c)) == sorted([*ids, child["id"]])
            assert (await c.call("session.get", {"sessionId": child["id"], "full": True}))["totalMessages"] == \
                totals[parent]
            proc.kill9()
    assert {k: v for k, v in after_fork.items() if k in before} == before
    assert tree(pi_root) == after_fork
    # exactly one child, named as pi names its sessions, beside its parent, a v3 header naming the parent
    new = [k for k in after_fork if k not in before]
    cid = child["id"].removeprefix("native-pi:")
    assert len(new) == 1 and re.fullmatch(rf"--work-demo--/\d{{4}}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{{3}}Z_{cid}\.jsonl",
                                          new[0]), new
    header = json.loads(after_fork[new[0]][0].split(b"\n", 1)[0])
    assert (header["type"], header["version"], header["id"]) == ("session", 3, cid)
    assert Path(header["parentSession"]).parent == (pi_root / "--work-demo--").resolve()
    assert header["parentSession"] in {str((pi_root / k).resolve()) for k in before}
    assert host_session_count(data) == (0, 0)
    assert rows_naming_native(data, skip=("command_receipts",)) == {}
    assert [p.name for p in (data / "sessions").iterdir()] == []


# ------------------------------------------------------------------------------ what cannot be read


def damaged_variants(src: Path) -> dict[str, bytes]:
    """Damaged copies of a real pi v3 file, each named for what is wrong with it."""
    lines = src.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])

    def entry_with(index: int, **fields: Any) -> bytes:
        rec = json.loads(lines[index])
        rec.update(fields)
        return b"".join([*lines[:index], json.dumps(rec).encode() + b"\n", *lines[index + 1:]])

    def with_id(new_id: str, body: bytes) -> bytes:
        return body.replace(header["id"].encode(), new_id.encode(), 1)

    last = len(lines) - 1
    return {
        "type-list": with_id("dmg-type-list", entry_with(last, type=["message"])),
        "type-object": with_id("dmg-type-object", entry_with(last, type={"k": "message"})),
        "type-number-mid": with_id("dmg-type-number", entry_with(2, type=7)),
        "message-not-object": with_id("dmg-message-str", entry_with(last, message="hello")),
        "garbage-middle": with_id("dmg-garbage", b"".join([*lines[:2], b"\x00\xff not json {\n", *lines[2:]])),
        "header-not-session": b'{"type":"message","id":"x"}\n' + b"".join(lines[1:]),
        "future-version": with_id("dmg-v9", json.dumps({**header, "version": 9}).encode() + b"\n"
                                  + b"".join(lines[1:])),
        "binary": b"\x89PNG\r\n\x1a\n\x00\x00",
        "empty": b"",
    }


async def test_a_damaged_native_file_never_fails_the_listing_or_a_read(tmp_path: Path) -> None:
    """§12 / README §9: what the host cannot read is left out of ``session.list`` or read as far as it
    can be, a clear error at worst, never ``INTERNAL``; the good sessions beside it are still listed and
    read. Found by this audit: one entry whose ``type`` was a JSON array or object (pi never writes one;
    a damaged or hand-edited file can) raised a ``TypeError`` in the pi reader, which failed every
    ``session.list`` of the host with ``INTERNAL``, and a fork of such a file too."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    src = sorted(RECORDED.rglob("*.jsonl"))[0]
    bad = pi_root / "--work-damaged--"
    bad.mkdir()
    for i, (name, body) in enumerate(sorted(damaged_variants(src).items())):
        (bad / f"2026-05-{i + 10:02d}T10-00-00-000Z_{name}.jsonl").write_bytes(body)
    before = tree(pi_root)
    good = len(pi_files())
    with trio.fail_after(120):
        async with native_host(data, pi_root) as (proc, c):
            ids = await native_ids(c)
            assert len(ids) >= good
            readable = {"native-pi:dmg-type-list", "native-pi:dmg-type-object", "native-pi:dmg-type-number",
                        "native-pi:dmg-message-str", "native-pi:dmg-garbage"}
            assert readable <= set(ids)  # one odd entry does not hide the session
            codes: dict[str, str | None] = {}
            for sid in ids:
                codes[f"get {sid}"] = await code_of(c, "session.get", {"sessionId": sid, "full": True})
                codes[f"fork {sid}"] = await code_of(c, "session.fork", {"sessionId": sid})
            assert not {k: v for k, v in codes.items() if v is not None and (v == "INTERNAL" or k.startswith("get"))}
            assert all(codes[f"get {sid}"] is None for sid in ids)
            proc.kill9()
    after = tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before  # only children were added
    assert not [k for k in after if not k.endswith(".jsonl")]  # no staging file left


# ------------------------------------------------------------------------------ forks that fail


def _immutable(path: Path, on: bool) -> bool:
    done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True, check=False)
    return done.returncode == 0


async def test_a_fork_into_a_read_only_directory_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    """§12: a native fork publishes into the parent's directory; when that directory cannot be written
    (here: immutable) the fork fails closed with a stable error code (not ``INTERNAL``), returns no child,
    leaves no staging file and the parent untouched; once writable again the same fork succeeds."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    project = pi_root / "--work-demo--"
    before = tree(pi_root)
    if not _immutable(project, True):
        pytest.skip("chattr +i is not available here")
    try:
        with trio.fail_after(120):
            async with native_host(data, pi_root) as (proc, c):
                parent = (await native_ids(c))[0]
                code = await code_of(c, "session.fork", {"sessionId": parent, "submissionId": "ro-fork"})
                # EPERM of an immutable directory (EACCES of one without write permission: PERMISSION_DENIED)
                assert code in ("IO_ERROR", "PERMISSION_DENIED"), code
                assert tree(pi_root) == before
                assert await native_ids(c) == await native_ids(c)
                _immutable(project, False)
                child = await c.call("session.fork", {"sessionId": parent, "submissionId": "ro-fork-2"})
                assert child["id"] in await native_ids(c)
                proc.kill9()
    finally:
        _immutable(project, False)
    after = tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before
    new = [k for k in after if k not in before]
    assert len(new) == 1 and new[0].endswith(f"_{child['id'].removeprefix('native-pi:')}.jsonl")


async def test_a_foreign_file_under_a_keyed_childs_name_is_never_answered_or_removed(tmp_path: Path) -> None:
    """§12: "foreign files ... are never removed" and a fork answers only its own child. A keyed fork's
    child is replaced by another pi session with the same header id (a foreign file under the child's
    name); the same key, asked again of a host without the receipt (a fresh data directory, as after a
    lost database), does not answer that file as its child, leaves it untouched and writes no staging
    file."""
    pi_root = make_root(tmp_path)
    for name in "abc":
        (tmp_path / name).mkdir()
    with trio.fail_after(120):
        async with native_host(data_dir(tmp_path / "a"), pi_root) as (proc, c):
            ids = await native_ids(c)
            parent, other = ids[0], ids[1]
            params = {"sessionId": parent, "title": "mine", "submissionId": "same-key"}
            child = await c.call("session.fork", params)
            proc.kill9()
        cid = child["id"].removeprefix("native-pi:")
        path = next(pi_root.rglob(f"*_{cid}.jsonl"))
        # a foreign session under that name: the other session's lines under a header with the child's id
        async with native_host(data_dir(tmp_path / "b"), pi_root) as (proc, c):
            forked_other = await c.call("session.fork", {"sessionId": other, "title": "not mine"})
            proc.kill9()
        foreign_src = next(pi_root.rglob(f"*_{forked_other['id'].removeprefix('native-pi:')}.jsonl"))
        foreign = foreign_src.read_bytes().replace(forked_other["id"].removeprefix("native-pi:").encode(),
                                                   cid.encode(), 1)
        foreign_src.unlink()
        path.write_bytes(foreign)
        before = tree(pi_root)
        async with native_host(data_dir(tmp_path / "c"), pi_root) as (proc, c):
            code = await code_of(c, "session.fork", params)
            assert code == "IDEMPOTENCY_CONFLICT", code  # README §4: the key is another fork's
            proc.kill9()
    assert tree(pi_root) == before


def odd_root(tmp_path: Path) -> Path:
    """A pi root with one recorded session in a folder whose name is Latin-1, not UTF-8."""
    pi_root = tmp_path / "pi"
    odd = Path(os.fsdecode(bytes(pi_root) + b"/--caf\xe9--"))
    odd.mkdir(parents=True)
    src = sorted(RECORDED.rglob("*.jsonl"))[0]
    shutil.copyfile(src, odd / src.name)
    return pi_root


async def test_a_fork_of_a_session_in_a_folder_whose_name_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    """§12: the child header carries ``parentSession`` with the canonical source path, and a v3 file is
    JSON (UTF-8). A Linux folder name need not be UTF-8 (pi names its folders after the working
    directory); such a session is listed and read, and its fork, which cannot name its parent in a header,
    is refused with a documented code, writing nothing. Found by this audit: the header's encoding raised
    a ``TypeError`` and the fork answered ``INTERNAL``."""
    data = data_dir(tmp_path)
    pi_root = odd_root(tmp_path)
    before = tree(pi_root)
    with trio.fail_after(60):
        async with native_host(data, pi_root) as (proc, c):
            [sid] = await native_ids(c)
            assert (await c.call("session.get", {"sessionId": sid, "full": True}))["totalMessages"] > 0
            code, info = await error_of(c, "session.fork", {"sessionId": sid, "title": "child"})
            assert code == "UNSUPPORTED_FOR_NATIVE_SESSION", (code, info)
            assert await native_ids(c) == [sid]
            proc.kill9()
    assert tree(pi_root) == before


# ------------------------------------------------------------------------- damaged trees: get and fork agree


def damaged_trees(src: Path) -> dict[str, bytes]:
    """Copies of a real pi v3 file with branches whose tree is damaged, each named for what is wrong with it
    (its header id is ``dmg-<name>``): an entry parented to itself (the leaf, or one in the middle of the
    current branch), two entries sharing one id (so the chain loops through them, or not), and a root
    entry parented to the leaf (no entry reaches a root)."""
    lines = src.read_bytes().splitlines(keepends=True)
    header = json.loads(lines[0])
    ids = [json.loads(line).get("id") for line in lines]

    def entry_with(index: int, **fields: Any) -> bytes:
        rec = json.loads(lines[index])
        rec.update(fields)
        return b"".join([*lines[:index], json.dumps(rec).encode() + b"\n", *lines[index + 1:]])

    def named(name: str, body: bytes) -> bytes:
        return body.replace(header["id"].encode(), f"dmg-{name}".encode(), 1)

    last = len(lines) - 1
    parent_of_leaf = json.loads(lines[last])["parentId"]
    grandparent = json.loads(lines[ids.index(parent_of_leaf)])["parentId"]
    off_branch = next(i for i, line in enumerate(lines) if json.loads(line).get("type") == "branch_summary")
    return {name: named(name, body) for name, body in {
        "self-leaf": entry_with(last, parentId=ids[last]),
        "self-mid": entry_with(ids.index(grandparent), parentId=grandparent),
        "shared-id-loop": entry_with(last, id=grandparent),
        "shared-id": entry_with(off_branch, id=json.loads(lines[ids.index(grandparent)])["parentId"]),
        "no-root": entry_with(1, parentId=ids[last]),
    }.items()}


def _as_shown(view: dict[str, Any]) -> list[str]:
    """A native read's messages without the session's own id in them (a child's ids differ only there) and
    without the corrupt-leaf notice (it names the file's leaf, which a child's tree no longer has)."""
    sid = view["session"]["id"]
    out = []
    for m in view["messages"]:
        if (m.get("meta") or {}).get("importedKind") == "pi/corrupt_leaf":
            continue
        out.append(json.dumps({k: v for k, v in m.items() if k != "seq"}, sort_keys=True).replace(f"{sid}:", ""))
    return out


async def test_get_and_fork_walk_the_same_branch_of_a_damaged_tree(tmp_path: Path) -> None:
    """§12: a fork's "branch extraction" is the current branch a detail read follows. On a damaged tree
    the two walked it differently: session.get falls back to the newest branch that reaches a root (seed
    000 §3.4, with a notice), while session.fork walked from the last entry until a repeat, so an entry
    parented to itself (or a loop through two entries sharing one id) made the child a fragment of the
    loop where the read showed the intact branch: the child held one system line where its parent showed
    nine messages. Now both take the one bounded walk: each child reads exactly as its parent does
    (without the corrupt-leaf notice, and with none of its own once the child's tree is intact), a fork
    through the last message shown keeps what the read showed up to it, nothing fails, and no parent
    byte changes."""
    data = data_dir(tmp_path)
    pi_root = tmp_path / "pi"
    folder = pi_root / "--work-damaged-tree--"
    folder.mkdir(parents=True)
    src = sorted(RECORDED.rglob("*.jsonl"))[1]  # the recorded session with a branch beside its current one
    variants = damaged_trees(src)
    for i, (name, body) in enumerate(sorted(variants.items())):
        (folder / f"2026-05-{i + 10:02d}T10-00-00-000Z_{name}.jsonl").write_bytes(body)
    before = tree(pi_root)
    with trio.fail_after(120):
        async with native_host(data, pi_root) as (proc, c):
            for name in sorted(variants):
                sid = f"native-pi:dmg-{name}"
                parent = await c.call("session.get", {"sessionId": sid, "full": True})
                shown = _as_shown(parent)
                assert len(shown) >= 2, name
                child = await c.call("session.fork", {"sessionId": sid})
                got = await c.call("session.get", {"sessionId": child["id"], "full": True})
                assert _as_shown(got) == shown, name
                fell_back = [m for m in parent["messages"]
                             if "fallback" in ((m.get("meta") or {}).get("corruptLeaf") or {})]
                if fell_back:  # the child holds the intact branch only: its tree reaches a root
                    assert not [m for m in got["messages"] if (m.get("meta") or {}).get("corruptLeaf")], name
                through = next(m for m in reversed(parent["messages"]) if m["role"] in ("user", "assistant"))
                cut = await c.call("session.fork", {"sessionId": sid, "throughMessageId": through["id"]})
                part = _as_shown(await c.call("session.get", {"sessionId": cut["id"], "full": True}))
                assert part == shown[: len(part)] and len(part) >= 1, name
            proc.kill9()
    after = tree(pi_root)
    assert {k: v for k, v in after.items() if k in before} == before
    assert not [k for k in after if not k.endswith(".jsonl")]


async def test_a_keyed_fork_of_a_damaged_tree_killed_before_its_receipt_is_found_by_its_retry(
        tmp_path: Path) -> None:
    """README §4: a keyed retry "after a crash finds the child already written instead of writing another".
    The retry rebuilds the child the fork would write and compares: it looked for the branch ending where
    the child's copied lines end and required every parent entry after that leaf to be newer than the fork,
    which a damaged tree's fallback branch never is (the corrupt leaf after it is older), and it matched a
    copied line by its id, which two entries sharing one id defeat: the retry of the same request was
    IDEMPOTENCY_CONFLICT. Each damaged tree's retry answers the child it wrote, which reads as its parent
    does, and writes no second file."""
    data = data_dir(tmp_path)
    pi_root = tmp_path / "pi"
    folder = pi_root / "--work-damaged-tree--"
    folder.mkdir(parents=True)
    variants = damaged_trees(sorted(RECORDED.rglob("*.jsonl"))[1])
    for i, (name, body) in enumerate(sorted(variants.items())):
        (folder / f"2026-05-{i + 10:02d}T10-00-00-000Z_{name}.jsonl").write_bytes(body)
    with trio.fail_after(240):
        for name in sorted(variants):
            # SIGKILL just before the fork's receipt commits (the child is published by then), unanswered
            await killed_during(data, "session.fork.before_commit:1", [("session.fork", {
                "sessionId": f"native-pi:dmg-{name}", "submissionId": f"fork-{name}"})],
                serve_args=("--native-pi-root", str(pi_root)))
        published = tree(pi_root)
        assert len(published) == 2 * len(variants)  # each child was published before its kill
        async with native_host(data, pi_root) as (proc, c):
            for name in sorted(variants):
                sid = f"native-pi:dmg-{name}"
                child = await c.call("session.fork", {"sessionId": sid, "submissionId": f"fork-{name}"})
                got = await c.call("session.get", {"sessionId": child["id"], "full": True})
                assert _as_shown(got) == _as_shown(await c.call("session.get", {"sessionId": sid, "full": True}))
            proc.kill9()
    assert tree(pi_root) == published


async def test_a_native_session_is_neither_the_source_nor_the_target_of_a_delivery(tmp_path: Path) -> None:
    """§12: "collaboration ... operations remain unsupported for native sessions". The sweep above covers the
    methods naming a ``sessionId``; ``collab.deliver`` names its two ends ``sourceSessionId`` and
    ``targetSessionId``: a native id in either is ``UNSUPPORTED_FOR_NATIVE_SESSION``, and no ledger row, queue
    entry or row naming it is written."""
    data = data_dir(tmp_path)
    pi_root = make_root(tmp_path)
    with trio.fail_after(90):
        async with native_host(data, pi_root) as (proc, c):
            native = (await native_ids(c))[0]
            host = (await c.call("session.create", {"title": "Host side"}))["id"]
            for src, dst in ((native, host), (host, native)):
                code, info = await error_of(c, "collab.deliver", {
                    "pluginId": "team", "sourceSessionId": src, "targetSessionId": dst, "kind": "task",
                    "content": "review it", "idempotencyKey": f"k-{src == native}"})
                assert code == "UNSUPPORTED_FOR_NATIVE_SESSION" and info.get("sessionId") == native, (src, code)
            assert (await c.call("session.queueList", {"sessionId": host}))["entries"] == []
            assert (await c.call("collab.list", {}))["deliveries"] == []
            proc.kill9()
    assert rows_naming_native(data) == {}
