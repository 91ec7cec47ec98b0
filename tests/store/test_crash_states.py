"""RELIABILITY.md tier (A), row 3's "SimFS exhaustive" and row 4's torn tails: an ALICE-style crash-state
enumerator over the transcript's real write paths (create, append, group append, rewrite, tail repair).

:class:`SimFs` stands in for the ``os`` module of ``store.fsutil`` and ``store.transcripts.transcript``: every
call still runs on the real disk, and each one that matters for durability is recorded against a model of
what a power cut may keep. Per file (inode): its durable bytes and its writes and truncations since its last
fsync; for the directory: its creates, links, renames and unlinks since its last fsync. After every recorded
call the enumerator builds each crash state the model allows (any prefix of each file's unsynced operations,
the next write torn at a few offsets or NUL-extended, the ext4 case; any prefix of the directory's unsynced
namespace operations), writes it into a fresh directory, runs the real recovery (boot's temp sweep, the
writer's open, which repairs the tail, a full read) and checks it against what was acknowledged so far:

* every acknowledged message is read exactly once, with the content it was acknowledged with;
* nothing is read that was never attempted; an unacknowledged group shows as a prefix of itself at most;
* a rewrite is wholly old or wholly new; a created file wholly there or absent, never empty;
* no temp file survives the sweep; every line parses; the next append is read back whole (no glued line).

A control run drops the tmp file's fsync and the directory fsyncs from the model (the broken protocol of the
prototype in RELIABILITY.md §3) and must find violations, so the checker is not vacuous.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import store.fsutil as fsutil_mod
import store.transcripts.transcript as transcript_mod
from store.fsutil import is_temp_name, sweep_temp_files
from store.jsonio import dumps_line
from store.transcripts.transcript import TranscriptWriter, create_transcript, read_transcript, rewrite_transcript
from tests.soak import soak

T0 = 1785056400000
SID = "s1"
NAME = f"{SID}.jsonl"

Message = tuple[str, str]  # (id, text)


def line(mid: str, text: str) -> bytes:
    return dumps_line({"type": "message", "id": mid, "role": "user", "createdAt": "2026-07-26T09:00:00.000Z",
                       "blocks": [{"type": "text", "text": text}]})


@dataclass(frozen=True)
class Expect:
    """What a recovery may show at one moment: the file absent (``None``) or one of ``bases`` followed by a
    prefix of the group in flight."""

    bases: tuple[tuple[Message, ...] | None, ...]
    group: tuple[Message, ...] = ()


@dataclass
class _Op:
    kind: str  # "write" | "truncate"
    offset: int = 0
    data: bytes = b""
    size: int = 0


def _apply(content: bytes, op: _Op) -> bytes:
    if op.kind == "truncate":
        return content[: op.size] + b"\0" * max(0, op.size - len(content))
    if len(content) < op.offset:
        content += b"\0" * (op.offset - len(content))
    return content[: op.offset] + op.data + content[op.offset + len(op.data):]


def _torn(op: _Op) -> list[_Op]:
    """The ways ``op`` may be half done after a power cut: a write cut short, or its extent allocated with
    zeros in place of (some of) its bytes (the 18 NUL bytes of RELIABILITY.md §0)."""
    if op.kind != "write" or len(op.data) < 2:
        return []
    n = len(op.data)
    cuts = sorted({1, n // 2, n - 1} - {0, n})
    out = [_Op("write", op.offset, op.data[:c]) for c in cuts]
    out.append(_Op("write", op.offset, b"\0" * n))
    out.append(_Op("write", op.offset, op.data[: n // 2] + b"\0" * (n - n // 2)))
    return out


@dataclass
class SimFs:
    """The ``os`` module for the store's file code, recording what a crash may keep (see the module doc)."""

    root: str
    real: ModuleType = os
    drop_file_syncs_of_temps: bool = False
    drop_dir_syncs: bool = False
    names: dict[str, int] = field(default_factory=dict)
    durable: dict[int, bytes] = field(default_factory=dict)
    pending: dict[int, list[_Op]] = field(default_factory=dict)
    namespace: list[tuple[str, ...]] = field(default_factory=list)
    fds: dict[int, tuple[int, bool, str]] = field(default_factory=dict)  # fd -> (inode, append, name); -1 = dir
    inode_of: dict[tuple[int, int], int] = field(default_factory=dict)
    next_inode: int = 1
    ops: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    # -- bookkeeping
    def _name(self, path: Any) -> str | None:
        full = self.real.path.abspath(self.real.fspath(path))
        if self.real.path.dirname(full) == self.root:
            return self.real.path.basename(full)
        return None

    def _fresh(self, fd: int) -> int:
        st = self.real.fstat(fd)
        inode = self.next_inode
        self.next_inode += 1
        self.inode_of[(st.st_dev, st.st_ino)] = inode
        self.durable[inode] = b""
        self.pending[inode] = []
        return inode

    def _known(self, fd: int) -> int | None:
        st = self.real.fstat(fd)
        return self.inode_of.get((st.st_dev, st.st_ino))

    def _step(self) -> None:
        self.ops += 1

    # -- the calls the store makes
    def open(self, path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        name = self._name(path)
        full = self.real.path.abspath(self.real.fspath(path))
        if name is None and full != self.root:
            return self.real.open(path, flags, mode)
        existed = self.real.path.lexists(full)
        fd = self.real.open(path, flags, mode)
        if full == self.root:
            self.fds[fd] = (-1, False, "")
            return fd
        assert name is not None
        if flags & self.real.O_CREAT and not existed:
            inode = self._fresh(fd)
            self.namespace.append(("create", name, str(inode)))
            self.fds[fd] = (inode, bool(flags & self.real.O_APPEND), name)
            self._step()
        else:
            inode = self._known(fd)
            if inode is not None:
                self.fds[fd] = (inode, bool(flags & self.real.O_APPEND), name)
        return fd

    def close(self, fd: int) -> None:
        self.fds.pop(fd, None)
        self.real.close(fd)

    def write(self, fd: int, data: Any) -> int:
        entry = self.fds.get(fd)
        if entry is None or entry[0] < 0:
            return int(self.real.write(fd, data))
        inode, append, _ = entry
        offset = self.real.fstat(fd).st_size if append else self.real.lseek(fd, 0, self.real.SEEK_CUR)
        n = int(self.real.write(fd, data))
        self.pending[inode].append(_Op("write", offset, bytes(data[:n])))
        self._step()
        return n

    def ftruncate(self, fd: int, size: int) -> None:
        self.real.ftruncate(fd, size)
        entry = self.fds.get(fd)
        if entry is not None and entry[0] >= 0:
            self.pending[entry[0]].append(_Op("truncate", size=size))
            self._step()

    def fsync(self, fd: int) -> None:
        self.real.fsync(fd)
        entry = self.fds.get(fd)
        if entry is None:
            return
        inode, _, name = entry
        if inode < 0:
            if not self.drop_dir_syncs:
                self._sync_names()
        elif not (self.drop_file_syncs_of_temps and is_temp_name(name)):
            self._sync_data(inode)
        self._step()

    def fdatasync(self, fd: int) -> None:
        self.real.fdatasync(fd)
        entry = self.fds.get(fd)
        if entry is not None and entry[0] >= 0:
            self._sync_data(entry[0])
            self._step()

    def link(self, src: Any, dst: Any, **kw: Any) -> None:
        self.real.link(src, dst, **kw)
        s, d = self._name(src), self._name(dst)
        if s is not None and d is not None:
            self.namespace.append(("link", s, d))
            self._step()

    def replace(self, src: Any, dst: Any, **kw: Any) -> None:
        self.real.replace(src, dst, **kw)
        s, d = self._name(src), self._name(dst)
        if s is not None and d is not None:
            self.namespace.append(("rename", s, d))
            self._step()

    rename = replace

    def unlink(self, path: Any, **kw: Any) -> None:
        self.real.unlink(path, **kw)
        n = self._name(path)
        if n is not None:
            self.namespace.append(("unlink", n))
            self._step()

    remove = unlink

    # -- durability
    def _sync_data(self, inode: int) -> None:
        content = self.durable[inode]
        for op in self.pending[inode]:
            content = _apply(content, op)
        self.durable[inode] = content
        self.pending[inode] = []

    def _sync_names(self) -> None:
        self.names = _names_after(self.names, self.namespace)
        self.namespace = []

    def adopt(self) -> None:
        """Take what the directory holds now as durable (a state set up before the run)."""
        for entry in sorted(Path(self.root).iterdir()):
            fd = self.real.open(entry, self.real.O_RDONLY)
            try:
                inode = self._fresh(fd)
            finally:
                self.real.close(fd)
            self.names[entry.name] = inode
            self.durable[inode] = entry.read_bytes()

    def crash_states(self) -> Iterator[dict[str, bytes]]:
        """Every directory a power cut at this moment may leave (name -> bytes)."""
        inodes = sorted(i for i, ops in self.pending.items() if ops)
        per_inode: list[list[bytes]] = []
        for inode in inodes:
            ops = self.pending[inode]
            content = self.durable[inode]
            choices = [content]
            for op in ops:
                choices.extend(_apply(content, t) for t in _torn(op))
                content = _apply(content, op)
                choices.append(content)
            per_inode.append(list(dict.fromkeys(choices)))
        seen: set[frozenset[tuple[str, bytes]]] = set()
        for k in range(len(self.namespace) + 1):
            names = _names_after(self.names, self.namespace[:k])
            for picked in itertools.product(*per_inode):
                content = dict(self.durable)
                content.update(zip(inodes, picked, strict=True))
                state = {name: content[inode] for name, inode in names.items()}
                key = frozenset(state.items())
                if key not in seen:
                    seen.add(key)
                    yield state


def _names_after(names: dict[str, int], ops: list[tuple[str, ...]]) -> dict[str, int]:
    out = dict(names)
    for op in ops:
        if op[0] == "create":
            out[op[1]] = int(op[2])
        elif op[0] == "link":
            if op[1] in out:
                out[op[2]] = out[op[1]]
        elif op[0] == "rename":
            if op[1] in out:
                out[op[2]] = out.pop(op[1])
        else:
            out.pop(op[1], None)
    return out


# ----------------------------------------------------------------------------------------- the checker

def _recover(folder: Path) -> tuple[list[Message] | None, list[str]]:
    """Boot's recovery of ``folder``: what a reader shows then, and every way it breaks an invariant that
    does not depend on what was acknowledged."""
    problems: list[str] = []
    sweep_temp_files(folder)
    left = [p.name for p in folder.iterdir() if is_temp_name(p.name)]
    if left:
        problems.append(f"temp files left after the sweep: {left}")
    path = folder / NAME
    if not path.exists():
        return None, problems
    try:
        writer = TranscriptWriter.open(path)
    except Exception as exc:  # noqa: BLE001 - any failure to open a published transcript is the finding
        return None, [*problems, f"open failed: {exc!r}"]
    with writer:
        before = read_transcript(path)
        if before.header is None:
            problems.append("no header")
        if before.bad_lines or before.torn_tail or before.unknown_lines:
            problems.append(f"after repair: bad={before.bad_lines} torn={before.torn_tail}")
        shown = [(m.id, m.record["blocks"][0]["text"]) for m in before.messages]
        writer.append([line("probe", "the next append")])
    after = read_transcript(path)
    again = [(m.id, m.record["blocks"][0]["text"]) for m in after.messages]
    if again != [*shown, ("probe", "the next append")] or after.bad_lines or after.torn_tail:
        problems.append(f"the next append did not read back whole: {again} bad={after.bad_lines}")
    return shown, problems


def _allowed(shown: list[Message] | None, expect: Expect) -> bool:
    for base in expect.bases:
        if base is None:
            if shown is None:
                return True
            continue
        if shown is None:
            continue
        for j in range(len(expect.group) + 1):
            if shown == [*base, *expect.group[:j]]:
                return True
    return False


@dataclass
class Checker:
    fs: SimFs
    scratch: Path
    expect: Expect = Expect((None,))
    points: int = 0
    states: int = 0
    violations: list[str] = field(default_factory=list)
    _last: int = -1
    _checked: set[tuple[frozenset[tuple[str, bytes]], Expect]] = field(default_factory=set)

    def check_now(self) -> None:
        """Every crash state of this moment against :attr:`expect`."""
        self.points += 1
        for state in self.fs.crash_states():
            key = (frozenset(state.items()), self.expect)
            if key in self._checked:
                continue
            self._checked.add(key)
            self.states += 1
            folder = self.scratch / f"state-{self.states}"
            folder.mkdir()
            for name, data in state.items():
                (folder / name).write_bytes(data)
                (folder / name).chmod(stat.S_IRUSR | stat.S_IWUSR)
            try:
                shown, problems = _recover(folder)
                if not _allowed(shown, self.expect):
                    problems.append(f"read {shown}, allowed {self.expect}")
            finally:
                shutil.rmtree(folder)
            if problems:
                self.violations.append(f"op {self.fs.ops} {sorted(state)}: {'; '.join(problems)}")


class _Watch:
    """Runs the checker after every recorded call (wraps :class:`SimFs`'s step)."""

    def __init__(self, checker: Checker) -> None:
        self.checker = checker
        self.paused = False

    def step(self) -> None:
        fs = self.checker.fs
        fs.ops += 1
        if not self.paused:
            self.paused = True
            try:
                self.checker.check_now()
            finally:
                self.paused = False


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, broken: bool = False,
         torn_tail: bytes | None = None, rounds: int = 1) -> Checker:
    """The workload under the model, checked after every recorded call."""
    folder = tmp_path / "sessions"
    folder.mkdir()
    scratch = Path(tempfile.mkdtemp(dir=tmp_path, prefix="states-"))
    path = folder / NAME
    acked: tuple[Message, ...] | None = None
    if torn_tail is not None:  # a file a power cut left with a torn tail, before this run
        create_transcript(path, SID, T0, body_lines=[line("m0", "zero")])
        with open(path, "ab") as fh:
            fh.write(torn_tail)
        acked = (("m0", "zero"),)
    fs = SimFs(str(folder), drop_file_syncs_of_temps=broken, drop_dir_syncs=broken)
    fs.adopt()
    checker = Checker(fs, scratch, Expect((acked,)))
    watch = _Watch(checker)
    monkeypatch.setattr(fs, "_step", watch.step)
    monkeypatch.setattr(fsutil_mod, "os", fs)
    monkeypatch.setattr(transcript_mod, "os", fs)

    def landing(bases: tuple[tuple[Message, ...] | None, ...], group: tuple[Message, ...] = ()) -> None:
        checker.expect = Expect(bases, group)

    if acked is None:
        m1 = (("m1", "one"),)
        landing((None, m1))
        create_transcript(path, SID, T0, body_lines=[line("m1", "one")])
        acked = m1
        landing((acked,))
    for r in range(rounds):
        writer = TranscriptWriter.open(path)  # repairs a torn tail
        with writer:
            for group in ([(f"a{r}", f"alone {r}")], [(f"g{r}a", f"group {r} a"), (f"g{r}b", f"group {r} b")]):
                landing((acked,), tuple(group))
                writer.append([line(mid, text) for mid, text in group])
                acked = (*acked, *group)
                landing((acked,))
        # a truncate that also edits the first message: wholly old or wholly new
        new = ((acked[0][0], f"{acked[0][1]} edited"), *acked[1:-1])
        landing((acked, new))
        rewrite_transcript(path, SID, T0, [line(mid, text) for mid, text in new])
        acked = new
        landing((acked,))
    with TranscriptWriter.open(path) as writer:
        landing((acked,), (("last", "after the rewrite"),))
        writer.append([line("last", "after the rewrite")])
        acked = (*acked, ("last", "after the rewrite"))
        landing((acked,))
    checker.check_now()
    monkeypatch.undo()
    assert [(m.id, m.record["blocks"][0]["text"]) for m in read_transcript(path).messages] == list(acked)
    return checker


def test_every_crash_state_of_create_append_and_rewrite_recovers_every_acknowledged_message_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checker = _run(tmp_path, monkeypatch, rounds=soak(1, 4))
    assert not checker.violations, "\n".join(checker.violations[:20])
    # Figures (RELIABILITY row 3): the crash points and distinct states checked. The run must have reached the
    # interesting ones: a torn group, a rewrite between its rename and its directory fsync.
    assert checker.points >= 15 and checker.states >= 35, (checker.points, checker.states)


@pytest.mark.parametrize("tail", [b'{"type":"message","id":"tor', b"\0" * 18, b"garbage without a newline",
                                  line("m9", "whole line, newline lost")[:-1]],
                         ids=["cut", "nul", "garbage", "no-newline"])
def test_every_crash_state_of_a_tail_repair_keeps_the_acknowledged_lines_and_glues_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: bytes) -> None:
    """Row 4: boot cuts the torn tail before the next append, and a crash during that repair (quarantine
    copy, truncate, fsync) recovers to the same acknowledged lines with nothing glued to the next one."""
    checker = _run(tmp_path, monkeypatch, torn_tail=tail)
    assert not checker.violations, "\n".join(checker.violations[:20])
    assert checker.points >= 10, checker.points


def test_the_checker_finds_the_broken_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: with the temp file's fsync and the directory fsyncs left out of the model (rename without
    fsync, no directory fsync: the prototype's broken protocol), acknowledged messages go missing."""
    checker = _run(tmp_path, monkeypatch, broken=True)
    assert checker.violations
    assert any("read None" in v or "read [" in v for v in checker.violations), checker.violations[:5]
