"""Native pi sessions (seed 003 §12): read-only listing and detail, refused mutations, the checked fork."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from store.errors import Conflict, StorageFull
from store.interchange.native_pi import (
    ForkHooks,
    UnsupportedForNativeSession,
    candidates,
    check_supported,
    fork_native,
    get_native,
    list_native,
    snapshot,
)
from tests.importers import gen
from tests.samplekit import NOW, sample_files, untouched_samples

__all__ = ["untouched_samples"]


def tree_state(root: Path) -> dict[str, str]:
    """Every entry under ``root`` with the hash of its bytes (symlinks by target)."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "->" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def root(tmp_path: Path, untouched_samples: Path) -> Path:
    base = tmp_path / "pi-sessions"
    project = base / "--work-demo--"
    project.mkdir(parents=True)
    for i, sample in enumerate(sample_files("pi")):
        shutil.copy(sample, project / f"2026-06-0{i + 1}T10-00-00-000Z_{sample.stem}.jsonl")
    other = base / "--work-other--"
    other.mkdir()
    conv: list[gen.Event] = [gen.User("main question"), gen.Response((("text", "main answer"),), ()),
                             gen.User("follow up")]
    (other / "2026-07-01T00-00-00-000Z_tree.jsonl").write_bytes(
        b"".join(gen.pi_lines(conv, session="tree-session", detour_after=2)))
    (other / "2026-07-02T00-00-00-000Z_v1.jsonl").write_bytes(
        b"".join(gen.pi_lines([gen.User("old format")], session="v1-session", version=1)))
    (other / "notes.jsonl").write_bytes(b'{"just": "some json"}\n')
    (other / "link.jsonl").symlink_to(project / os.listdir(project)[0])
    return base


def test_listing_is_read_only_and_source_discriminated(root: Path) -> None:
    before = tree_state(root)
    listing = list_native(root)
    assert tree_state(root) == before  # nothing written, nothing repaired
    ids = [s["id"] for s in listing.sessions]
    assert set(ids) == {"native-pi:019e963d-6bd6-7ade-8a49-256ac3391bdd",
                        "native-pi:019e19b4-eb48-746a-aa6b-8dfcfa37954b",
                        "native-pi:real-session", "native-pi:tree-session", "native-pi:v1-session"}
    assert all(s["source"] == "native-pi" and s["native"]["readOnly"] for s in listing.sessions)
    assert [r["reason"] for r in listing.refused] == ["NOT_A_SESSION_FILE"]  # notes.jsonl; the symlink is not read
    assert all("/" not in str(v) or k == "projectPath" for s in listing.sessions for k, v in s.items()
               if isinstance(v, str))  # no file path on the wire
    smoke = next(s for s in listing.sessions if s["id"].endswith("256ac3391bdd"))
    assert (smoke["title"], smoke["projectPath"], smoke["messageCount"]) == (
        "agent-history pi smoke", "/tmp/agent-history-real-agent/pi/workspace", 2)
    assert smoke["modelId"] == "gpt-5.5" and smoke["thinkingLevel"] == "off"
    assert ids == sorted(ids, key=lambda i: -next(s["updatedAt"] for s in listing.sessions if s["id"] == i))


def test_get_follows_the_current_branch_and_never_repairs(root: Path) -> None:
    detail = get_native(root, "native-pi:tree-session")
    texts = [m["blocks"][0]["text"] for m in detail.messages]
    assert texts == ["main question", "main answer", "follow up"]  # the abandoned branch is not shown
    assert detail.report.off_branch == 2
    assert all(m["id"].startswith("native-pi:tree-session:") for m in detail.messages)
    # a file pi is still writing (no final newline) is read as it is: the incomplete entry is not shown
    path = next(root.rglob("*_tree.jsonl"))
    data = path.read_bytes()
    torn = data + b'{"type":"message","id":"eabc","parentId":"e0000007","message":{"role":"user","content":"par'
    path.write_bytes(torn)
    again = get_native(root, "native-pi:tree-session")
    assert [m["blocks"][0]["text"] for m in again.messages] == texts
    assert path.read_bytes() == torn
    # the dangling-parent sample: the branch ends at the custom entry, and the rest is shown
    real = get_native(root, "native-pi:real-session")
    assert [m["role"] for m in real.messages] == ["user", "assistant", "assistant", "tool"]
    assert real.report.files[0].dangling_parents == 1
    assert real.messages[3]["blocks"][0]["result"] == "redacted camel-case tool result text"
    # old formats are read the same way, in memory
    assert [m["blocks"][0]["text"] for m in get_native(root, "native-pi:v1-session").messages] == ["old format"]


@pytest.mark.parametrize("method", ["session.rename", "session.delete", "session.appendMessage", "session.queuePush",
                                    "session.revisions", "session.switchRevision", "session.moveProject",
                                    "plans.submit", "session.truncateFrom", "collab.deliver"])
def test_mutations_are_refused_for_native_sessions(method: str) -> None:
    with pytest.raises(UnsupportedForNativeSession) as info:
        check_supported(method, "native-pi:tree-session")
    assert info.value.code == "UNSUPPORTED_FOR_NATIVE_SESSION"
    check_supported(method, "cc-0123")  # host sessions are not affected


@pytest.mark.parametrize("method", ["session.get", "session.list", "session.fork", "session.export"])
def test_reads_and_fork_are_supported(method: str) -> None:
    check_supported(method, "native-pi:x")


def parent_of(root: Path, name: str) -> Path:
    return next(root.rglob(f"*{name}*.jsonl"))


def test_fork_writes_exactly_one_v3_child_beside_the_parent(root: Path) -> None:
    parent = parent_of(root, "stub_provider")
    directory = parent.parent
    before = tree_state(root)
    result = fork_native(parent, now_ms=NOW, child_uuid="0198aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee", title="My fork")
    after = tree_state(root)
    new = sorted(set(after) - set(before))
    assert new == [str(result.path.relative_to(root))]
    assert {k: v for k, v in after.items() if k in before} == before  # the parent and every other file unchanged
    assert result.path.parent == directory
    assert result.path.name == "2026-07-26T09-00-00-000Z_0198aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee.jsonl"
    lines = result.path.read_bytes().splitlines(keepends=True)
    header = orjson.loads(lines[0])
    assert header == {"type": "session", "version": 3, "id": "0198aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee",
                      "timestamp": "2026-07-26T09:00:00.000Z", "cwd": "/tmp/as-agent-fixture/project",
                      "parentSession": os.path.realpath(parent)}
    parent_lines = parent.read_bytes().splitlines(keepends=True)
    # the branch's entries are the parent's lines, byte for byte (unknown fields and all)
    assert lines[1: len(parent_lines)] == parent_lines[1:]
    extra = [orjson.loads(line) for line in lines[len(parent_lines):]]
    assert [e["type"] for e in extra] == ["session_info"]
    assert extra[0]["name"] == "My fork" and extra[0]["parentId"] == orjson.loads(parent_lines[-1])["id"]
    assert result.native_id == "native-pi:0198aaaa-bbbb-7ccc-8ddd-eeeeeeeeeeee"
    assert result.session.summary["title"] == "My fork"
    assert [m["blocks"][0]["text"] for m in result.session.messages] == [
        m["blocks"][0]["text"] for m in get_native(root, "native-pi:019e19b4-eb48-746a-aa6b-8dfcfa37954b").messages]
    assert any(s["id"] == result.native_id for s in list_native(root).sessions)


def test_fork_at_an_earlier_entry_carries_the_parents_model_and_thinking(root: Path) -> None:
    parent = parent_of(root, "stub_provider")
    entries = [orjson.loads(line) for line in parent.read_bytes().splitlines()[1:]]
    first_user = next(e for e in entries if e["type"] == "message")
    result = fork_native(parent, now_ms=NOW, leaf_id=first_user["id"], child_uuid="child-early")
    child = [orjson.loads(line) for line in result.path.read_bytes().splitlines()[1:]]
    # the branch up to the first prompt, then nothing to add: it already holds model and thinking entries
    assert [e["id"] for e in child] == [e["id"] for e in entries[: entries.index(first_user) + 1]]
    named = parent_of(root, "smoke_session_info")
    dangling = parent_of(root, "custom_entry")
    r2 = fork_native(dangling, now_ms=NOW, child_uuid="child-dangling")
    appended = [orjson.loads(line) for line in r2.path.read_bytes().splitlines()[1:]][5:]
    # the branch has assistant replies (they name their model), so only a missing title could be added
    assert appended == []
    r3 = fork_native(named, now_ms=NOW, leaf_id=orjson.loads(named.read_bytes().splitlines()[1])["id"],
                     child_uuid="child-named")
    extra = [orjson.loads(line) for line in r3.path.read_bytes().splitlines()[2:]]
    assert [(e["type"], e.get("modelId") or e.get("thinkingLevel"), e.get("name")) for e in extra] == [
        ("session_info", None, "agent-history pi smoke (fork)"), ("model_change", "gpt-5.5", None),
        ("thinking_level_change", "off", None)]
    assert extra[0]["parentId"] == orjson.loads(named.read_bytes().splitlines()[1])["id"]


def _foreign(path: Path, content: bytes) -> None:
    """Put a file that is not the fork's at ``path`` (a different inode), the way another writer would."""
    other = path.with_name(path.name + ".foreign")
    other.write_bytes(content)
    os.replace(other, path)


Injection = Callable[[Path, Path], ForkHooks]


def replace_staged(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(temp: Path) -> None:
        state["temp"] = temp
        _foreign(temp, temp.read_bytes())  # same bytes, another inode
    return ForkHooks(after_stage=hook)


def modify_staged(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(temp: Path) -> None:
        state["temp"] = temp
        data = bytearray(temp.read_bytes())
        data[-2] = ord("X")
        with open(temp, "r+b") as fh:  # same inode, same size, other bytes
            fh.write(bytes(data))
    return ForkHooks(after_stage=hook)


def grow_staged(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(temp: Path) -> None:
        state["temp"] = temp
        with open(temp, "ab") as fh:
            fh.write(b'{"type":"custom","id":"ffffffff"}\n')
    return ForkHooks(after_stage=hook)


def take_final_name(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(temp: Path, final: Path) -> None:
        state["temp"], state["final"] = temp, final
        final.write_bytes(b"someone else's session\n")
    return ForkHooks(before_link=hook)


def replace_published(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(final: Path) -> None:
        state["final"] = final
        _foreign(final, final.read_bytes())
    return ForkHooks(after_link=hook)


def modify_published(parent: Path, state: dict[str, Any]) -> ForkHooks:
    def hook(final: Path) -> None:
        state["final"] = final
        with open(final, "ab") as fh:
            fh.write(b"tampered\n")
    return ForkHooks(after_link=hook)


INJECTIONS = {
    "staged file replaced (other inode)": (replace_staged, "staged_file_changed"),
    "staged file rewritten (same inode and size)": (modify_staged, "staged_file_changed"),
    "staged file grown": (grow_staged, "staged_file_changed"),
    "final name taken before the link": (take_final_name, "target_exists"),
    "published name replaced after the link": (replace_published, "published_file_changed"),
    "published file modified after the link": (modify_published, "published_file_changed"),
}


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_every_identity_check_fails_closed(root: Path, case: str) -> None:
    make, reason = INJECTIONS[case]
    parent = parent_of(root, "custom_entry")
    before = tree_state(root)
    state: dict[str, Any] = {}
    with pytest.raises(Conflict) as info:
        fork_native(parent, now_ms=NOW, child_uuid="child-x", hooks=make(parent, state))
    assert info.value.data["reason"] == reason
    after = tree_state(root)
    assert {k: v for k, v in after.items() if k in before} == before  # the parent and all else untouched
    left = {str(Path(k).name) for k in set(after) - set(before)}
    # what stays is exactly what was not the fork's to remove
    if case.startswith("staged"):
        foreign = {state["temp"].name}
    elif case == "published file modified after the link":
        # our own inode under both names, changed by someone else: neither still matches what we wrote
        foreign = {state["final"].name, next(n for n in left if n.endswith(".tmp"))}
    else:
        foreign = {state["final"].name}
    assert left == foreign
    if case == "final name taken before the link":
        assert state["final"].read_bytes() == b"someone else's session\n"


def test_a_partial_staging_write_is_cleaned_up(root: Path) -> None:
    parent = parent_of(root, "custom_entry")
    before = tree_state(root)

    def half_then_full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageFull):
        fork_native(parent, now_ms=NOW, child_uuid="child-partial", hooks=ForkHooks(write=half_then_full))
    assert tree_state(root) == before


def test_snapshot_refuses_a_symlink(root: Path) -> None:
    from store.errors import InvalidInput

    with pytest.raises(InvalidInput):
        snapshot(root / "--work-other--" / "link.jsonl")


def test_a_file_pi_removes_during_the_listing_is_skipped(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pi deletes and renames its own session files: one listed by the walk and gone before its lstat made
    session.list (and every native get, fork and export, which list first) INTERNAL."""
    real_walk = os.walk

    def walk_then_vanish(top: Any, **kwargs: Any) -> Any:
        for dirpath, dirnames, filenames in real_walk(top, **kwargs):
            yield dirpath, dirnames, [*filenames, "gone-before-its-lstat.jsonl"]

    monkeypatch.setattr(os, "walk", walk_then_vanish)
    names = [p.name for p in candidates(root)]
    assert names and "gone-before-its-lstat.jsonl" not in names
