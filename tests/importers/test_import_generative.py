"""Generative tests of the importers on MUTATED recorded files: a person's data comes in without loss.

Every example starts from a file a real CLI wrote (``tests/fixtures/recorded``: Claude Code, Codex, pi,
opencode's database; a pi-host source is the transcript this host wrote importing one of them) and
varies what real files vary: the text of user and assistant messages and tool results (every kind of Unicode, NUL,
lone surrogate escapes as JavaScript's ``JSON.stringify`` writes them, U+2028, very long lines),
unknown extra fields and unknown line kinds a newer CLI would add, missing optional fields,
duplicated lines, lines that are not JSON, CRLF line ends, a byte order mark, a last line torn by a
crash; for opencode the same in its ``part`` rows, unknown part types and rows that are not JSON,
and a database that gains messages. It is imported with ``import_root`` (what ``import.sessions``
runs per session, as the neighbouring importer tests do) and checked:

1. nothing is lost: every user/assistant text and every tool call and result the source holds (read
   here, by the small readers below, never by the importer's parser) is in the imported transcript;
2. importing the unchanged source again changes nothing;
3. a source that grew imports exactly its new lines, once (also when the line torn before is completed);
4. a line that is not JSON never aborts the session: it is skipped and counted (``badLines``);
5. no exception: an import answers a report (refusals only with the documented codes).

A rewound source (an older copy restored) keeps everything imported before; a rewritten one (a message
edited in place) shows the source's new text and keeps every message id. Derandomized and CI-sized;
``PIHOST_SOAK=1`` runs ten times the examples. Duplicated lines stay as the tools read them: pi and
pi-host keep the last line of an id, Claude Code keeps the first of a line written twice word for word (one
entry per ``uuid``, as its loader does).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from store.interchange.import_write import ImportTarget
from store.interchange.importers.report import SessionReport
from store.interchange.imports import import_root
from store.transcripts.transcript import read_transcript
from tests.samplekit import NOW, import_workspace
from tests.soak import soak

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # a failing long text
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
SETTINGS = settings(max_examples=soak(25, 250), deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
REFUSALS = {"EMPTY_SESSION", "NOT_A_SESSION_FILE"}
"""The documented refusal codes a prefix of a source may get (it holds no message yet)."""


def recorded(tool: str, stem: str) -> Path:
    (path,) = [p for p in RECORDED.joinpath(tool).rglob("*.jsonl") if stem in p.name and "subagents" not in p.parts]
    return path


BASES: dict[str, list[Path]] = {
    "claude-code": [recorded("claude-code", "f4c39419"), recorded("claude-code", "9617099f"),
                    recorded("claude-code", "c2700e0d")],
    "codex": [recorded("codex", "01a234be-84ec"), recorded("codex", "01a234be-8af7"),
              recorded("codex", "01a234be-9941")],
    "pi": [recorded("pi", "01a234ad-dfe8"), recorded("pi", "01a234ae-32a6")],
}
HOST_FROM = [("claude-code", 0), ("codex", 0), ("pi", 0)]
"""pi-host sources: the transcripts this host wrote importing those recorded files (what
``pi-host export --format jsonl`` or a transcript copy holds)."""
TOOLS = [*sorted(BASES), "pi-host"]


# --------------------------------------------------------------------------- independent readers
#
# Each returns the slots of a parsed line that hold the person's data: a user or assistant text, a tool
# call's id, a tool result's output and the call it answers. They know the tools' formats, not the
# importers.

Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Slot:
    kind: str  # text | call | result
    path: Path_
    """text: the string; call: the call id; result: the output (a string, or a list of text blocks)."""
    call_path: Path_ = ()
    """result: the call id it answers."""


def _get(obj: Any, path: Path_) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _set(obj: Any, path: Path_, value: Any) -> None:
    _get(obj, path[:-1])[path[-1]] = value


def claude_slots(obj: dict[str, Any]) -> list[Slot]:
    if obj.get("type") not in ("user", "assistant") or obj.get("isMeta") or obj.get("isSidechain") \
            or obj.get("isCompactSummary"):  # the summary of a compaction (a checkpoint, not a message)
        return []
    content = (obj.get("message") or {}).get("content")
    if isinstance(content, str):
        return [Slot("text", ("message", "content"))] if obj["type"] == "user" and not content.startswith("<") else []
    slots: list[Slot] = []
    for i, block in enumerate(content if isinstance(content, list) else []):
        base: Path_ = ("message", "content", i)
        if block.get("type") == "text":
            slots.append(Slot("text", (*base, "text")))
        elif block.get("type") == "tool_use":
            slots.append(Slot("call", (*base, "id")))
        elif block.get("type") == "tool_result":
            slots.append(Slot("result", (*base, "content"), (*base, "tool_use_id")))
    return slots


def codex_slots(obj: dict[str, Any]) -> list[Slot]:
    payload = obj.get("payload") or {}
    if obj.get("type") != "response_item":
        return []
    ptype = payload.get("type")
    if ptype == "message" and payload.get("role") in ("user", "assistant"):
        want = "input_text" if payload["role"] == "user" else "output_text"
        return [Slot("text", ("payload", "content", i, "text")) for i, c in enumerate(payload.get("content") or [])
                if c.get("type") == want]
    if ptype in ("function_call", "custom_tool_call"):
        return [Slot("call", ("payload", "call_id"))]
    if ptype in ("function_call_output", "custom_tool_call_output") and isinstance(payload.get("output"), str):
        return [Slot("result", ("payload", "output"), ("payload", "call_id"))]
    return []


def pi_slots(obj: dict[str, Any]) -> list[Slot]:
    msg = obj.get("message") or {}
    if obj.get("type") != "message":
        return []
    content = msg.get("content")
    if msg.get("role") == "user" and isinstance(content, str):
        return [Slot("text", ("message", "content"))]
    if msg.get("role") == "toolResult":
        return [Slot("result", ("message", "content"), ("message", "toolCallId"))]
    slots: list[Slot] = []
    for i, block in enumerate(content if isinstance(content, list) else []):
        if block.get("type") == "text" and msg.get("role") in ("user", "assistant"):
            slots.append(Slot("text", ("message", "content", i, "text")))
        elif block.get("type") == "toolCall":
            slots.append(Slot("call", ("message", "content", i, "id")))
    return slots


def host_slots(obj: dict[str, Any]) -> list[Slot]:
    """This host's transcript records (docs/DESIGN.md): ``message`` lines with ``text`` and ``tool_call``
    blocks (a call's ``result`` on its block)."""
    if obj.get("type") != "message" or obj.get("role") not in ("user", "assistant", "tool"):
        return []
    slots: list[Slot] = []
    for i, block in enumerate(obj.get("blocks") or []):
        if block.get("type") == "text" and obj["role"] != "tool":
            slots.append(Slot("text", ("blocks", i, "text")))
        elif block.get("type") == "tool_call":
            slots.append(Slot("call", ("blocks", i, "callId")))
            if isinstance(block.get("result"), str):
                slots.append(Slot("result", ("blocks", i, "result"), ("blocks", i, "callId")))
    return slots


SLOTS: dict[str, Callable[[dict[str, Any]], list[Slot]]] = {
    "claude-code": claude_slots, "codex": codex_slots, "pi": pi_slots, "pi-host": host_slots}
OPTIONAL: dict[str, tuple[str, ...]] = {
    "claude-code": ("cwd", "gitBranch", "version", "userType", "entrypoint", "promptId", "requestId",
                    "permissionMode", "promptSource", "sentAtMs", "rowSource", "turnOrigin", "turnPosition"),
    "codex": ("timestamp",),
    "pi": ("timestamp",),
    "pi-host": ("meta", "toolName"),
}
"""Fields a line may lack (an older or newer CLI version does not write them)."""


def as_text(value: Any) -> str:
    """A tool output as its text: a string, or the text of its text blocks in order."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(b.get("text", "")) for b in value if isinstance(b, dict) and b.get("type") == "text")
    return ""


def clean(text: str) -> str:
    """What the host can store of a text: lone surrogates become U+FFFD (its files are valid UTF-8)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


@dataclass
class Expected:
    texts: list[str]
    calls: set[str]
    results: dict[str, str]


def expected(tool: str, lines: list[bytes]) -> Expected:
    """What a reader of the source finds: lines that are whole JSON objects (stdlib, which also reads
    lone surrogate escapes), their text, calls and results."""
    exp = Expected([], set(), {})
    objs: list[dict[str, Any]] = []
    for raw in lines:
        try:
            obj = json.loads(raw.decode("utf-8").removeprefix("\ufeff").rstrip("\r"))
        except ValueError:
            continue
        if isinstance(obj, dict):
            objs.append(obj)
    if tool in ("pi", "pi-host"):  # the last line of an id is the entry (pi's loader, the transcript rule)
        last = {o["id"]: n for n, o in enumerate(objs) if o.get("type") == "message" and isinstance(o.get("id"), str)}
        objs = [o for n, o in enumerate(objs) if not isinstance(o.get("id"), str) or last.get(o["id"], n) == n]
    if tool == "claude-code":  # a uuid written again (same type): the last line is the message (Claude Code's
        # loader keeps one entry per uuid, the last set; the importer's rule, claude_code.py "rewritten uuid")
        def key(o: dict[str, Any]) -> tuple[str, str] | None:
            kind, uuid = o.get("type"), o.get("uuid")
            return (kind, uuid) if kind in ("user", "assistant", "system") and isinstance(uuid, str) and uuid \
                else None
        newest = {k: n for n, o in enumerate(objs) if (k := key(o)) is not None}
        objs = [o for n, o in enumerate(objs) if (k := key(o)) is None or newest[k] == n]
    for obj in objs:
        for slot in SLOTS[tool](obj):
            if slot.kind == "text":
                text = _get(obj, slot.path)
                if isinstance(text, str) and text.strip():
                    exp.texts.append(clean(text))
            elif slot.kind == "call":
                exp.calls.add(str(_get(obj, slot.path)))
            else:
                exp.results[str(_get(obj, slot.call_path))] = clean(as_text(_get(obj, slot.path)))
    return exp


@dataclass
class Held:
    texts: list[str]
    calls: dict[str, Any]
    """callId -> its result as the transcript holds it."""
    ids: list[str]


def held(target: ImportTarget, sid: str) -> Held:
    t = read_transcript(target.transcript(sid))
    out = Held([], {}, [])
    for m in t.messages:
        if m.id in t.deleted_ids:
            continue
        out.ids.append(m.id)
        for block in m.record.get("blocks") or []:
            if block.get("type") == "text":
                out.texts.append(str(block.get("text")))
            elif block.get("type") == "tool_call":
                out.calls[str(block.get("callId"))] = block.get("result")
    return out


def flat(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(flat(v) for v in value)
    if isinstance(value, dict):
        return "".join(flat(v) for k, v in value.items() if k in ("text", "content", "output"))
    return ""


def assert_nothing_lost(exp: Expected, got: Held) -> None:
    texts = set(got.texts)
    for text in exp.texts:
        assert text in texts or any(text in t for t in texts), f"lost text {text[:80]!r}"
    for call in exp.calls:
        assert call in got.calls, f"lost tool call {call}"
    for call, result in exp.results.items():
        assert call in got.calls, f"lost tool result of {call}"
        if result.strip():
            assert result.strip() in flat(got.calls[call]), f"result of {call}: {result[:60]!r} not in " \
                                                            f"{flat(got.calls[call])[:60]!r}"


# --------------------------------------------------------------------------- mutations

ANY_CHAR = st.characters(codec=None, exclude_categories=())
"""Every code point, lone surrogates included (written as JSON escapes)."""
SPECIAL = st.sampled_from(["\x00", "\u2028", "\u2029", "\ufeff", "\ud800", "\udfff", "\U0001f600", "\r", "\n",
                           "\r\n", "\t", "\x1b[31m", "\u202e", "e\u0301", "\uffff", "\\", '"', "</script>", "{{",
                           "[[", "\x7f", "\x85"])
TEXT = st.one_of(
    st.text(ANY_CHAR, min_size=1, max_size=40),
    st.lists(st.one_of(SPECIAL, st.text(ANY_CHAR, max_size=8)), min_size=1, max_size=12).map("".join),
).filter(lambda s: s.strip() != "")
LONG = st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "é", "\U0001f600", "line\n", "\u2028"]),
                 st.sampled_from([70_000, 200_000]))


@dataclass(frozen=True)
class Mutation:
    kind: str  # text | long | extra | nested_extra | drop | unknown | dup | bad
    at: int
    value: Any = None


def mutations(tool: str) -> st.SearchStrategy[list[Mutation]]:
    one = st.one_of(
        st.builds(Mutation, st.just("text"), st.integers(0, 999), TEXT),
        st.builds(Mutation, st.just("long"), st.integers(0, 999), LONG),
        st.builds(Mutation, st.just("extra"), st.integers(0, 999),
                  st.tuples(st.sampled_from(["futureField", "x_new", "renderHints"]),
                            st.one_of(st.none(), st.integers(), TEXT, st.just({"nested": [1, {"a": None}]})))),
        st.builds(Mutation, st.just("nested_extra"), st.integers(0, 999), TEXT),
        st.builds(Mutation, st.just("drop"), st.integers(0, 999), st.sampled_from(OPTIONAL[tool])),
        st.builds(Mutation, st.just("unknown"), st.integers(0, 999),
                  st.sampled_from(["world_state_v9", "telemetry", "future-kind", "agent_note"])),
        st.builds(Mutation, st.just("dup"), st.integers(0, 999)),
        st.builds(Mutation, st.just("bad"), st.integers(0, 999),
                  st.sampled_from([b"{not json", b"\x00\xff\xfe garbage", b"[1, 2]", b'"a string"', b"{\"type\":",
                                   b"\xed\xa0\x80"])),
    )
    return st.lists(one, max_size=8)


def dumps(obj: Any) -> bytes:
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON.stringify writes it as an escape
        return json.dumps(obj, separators=(",", ":")).encode("utf-8")


def unknown_line(tool: str, kind: str) -> bytes:
    if tool == "pi-host":
        return dumps({"type": kind, "at": "2026-12-02T03:25:42.000Z", "data": {"x": 1}})
    if tool == "codex":
        return dumps({"timestamp": "2026-12-02T03:13:51.000Z", "type": kind, "payload": {"type": kind, "v": [1]}})
    if tool == "pi":
        return dumps({"type": kind, "id": "f00dfeed", "parentId": None, "timestamp": "2026-12-02T02:55:40.000Z",
                      "data": {"x": 1}})
    return dumps({"type": kind, "timestamp": "2026-12-02T03:25:42.000Z", "sessionId": "x", "data": {"x": 1}})


def _load(raw: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


@dataclass
class Mutated:
    lines: list[bytes]
    bad: int


def mutate(tool: str, base: list[bytes], muts: list[Mutation]) -> Mutated:
    lines = list(base)
    bad = 0
    for mut in muts:
        at = mut.at % len(lines)
        obj = _load(lines[at])
        if mut.kind in ("text", "long"):
            slots = [(i, s) for i, raw in enumerate(lines) for s in SLOTS[tool](_load(raw))
                     if s.kind in ("text", "result")]
            if not slots:
                continue
            i, slot = slots[mut.at % len(slots)]
            target = json.loads(lines[i])
            current = _get(target, slot.path)
            if isinstance(current, list):  # a list of text blocks: vary the first text
                texts = [j for j, b in enumerate(current) if isinstance(b, dict) and b.get("type") == "text"]
                if not texts:
                    continue
                current[texts[0]]["text"] = mut.value
            else:
                _set(target, slot.path, mut.value)
            lines[i] = dumps(target)
        elif mut.kind == "extra" and obj:
            obj[mut.value[0]] = mut.value[1]
            lines[at] = dumps(obj)
        elif mut.kind == "nested_extra" and obj:
            inner = obj.get("message") or obj.get("payload")
            if isinstance(inner, dict):
                inner["futureNested"] = mut.value
                lines[at] = dumps(obj)
        elif mut.kind == "drop" and mut.value in obj:
            del obj[mut.value]
            lines[at] = dumps(obj)
        elif mut.kind == "unknown" and tool == "pi":  # an entry of the tree: pi appends to the leaf
            parent = next((e["id"] for e in map(_load, reversed(lines[: at + 1])) if isinstance(e.get("id"), str)
                           and "parentId" in e), None)
            new_id = f"f00d{len(lines):04x}"
            entry = _load(unknown_line(tool, mut.value)) | {"id": new_id, "parentId": parent}
            after = _load(lines[at + 1]) if at + 1 < len(lines) else {}
            if parent is not None and after.get("parentId") == parent:
                lines[at + 1] = dumps(after | {"parentId": new_id})
            lines.insert(at + 1, dumps(entry))
        elif mut.kind == "unknown":
            lines.insert(at + 1, unknown_line(tool, mut.value))
        elif mut.kind == "dup":
            lines.insert(at + 1, lines[at])
            bad += not obj  # a duplicated bad line is one more
        elif mut.kind == "bad" and at > 0:  # the first line names the session (pi, codex): keep it whole
            lines.insert(at, mut.value)
            bad += 1
    return Mutated(lines, bad)


def render(lines: list[bytes], *, crlf: bool = False, bom: bool = False, tail: bytes = b"") -> bytes:
    end = b"\r\n" if crlf else b"\n"
    return (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + end for line in lines) + tail


def base_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


# --------------------------------------------------------------------------- the import


def source_path(root: Path, base: Path | str) -> Path:
    return root / "src" / (base if isinstance(base, str) else base.name)


def run(conn: sqlite3.Connection, tool: str, path: Path, target: ImportTarget, now: int = NOW) -> SessionReport:
    summary = import_root(conn, tool, path, target, now_ms=lambda: now)
    (rep,) = summary.sessions
    assert rep.status != "refused" or rep.reason in REFUSALS, rep.to_dict()
    return rep


def index_rows(conn: sqlite3.Connection, sid: str) -> list[Any]:
    return conn.execute("SELECT id, seq, role, text, tool_name, is_error, deleted FROM messages WHERE session_id = ? "
                        "ORDER BY seq", (sid,)).fetchall()


def visible_rows(conn: sqlite3.Connection, sid: str) -> list[Any]:
    return conn.execute("SELECT id, role, text, tool_name, is_error FROM messages WHERE session_id = ? AND deleted = 0 "
                        "ORDER BY seq", (sid,)).fetchall()


cases = st.tuples(st.sampled_from(TOOLS), st.integers(0, 9))


def host_transcript(n: int) -> tuple[str, list[bytes]]:
    """A pi-host source made from a recorded file: the transcript an import of it wrote."""
    tool, k = HOST_FROM[n % len(HOST_FROM)]
    base = BASES[tool][k]
    with import_workspace() as (root, conn, target):
        src = source_path(root, base)
        src.write_bytes(base.read_bytes())
        rep = run(conn, tool, src, target)
        return f"{rep.session_id}.jsonl", target.transcript(rep.session_id).read_bytes().splitlines()


def pick(case: tuple[str, int]) -> tuple[str, str, list[bytes]]:
    """The tool, the file name and the lines of a recorded source."""
    tool, n = case
    if tool == "pi-host":
        return tool, *host_transcript(n)
    base = BASES[tool][n % len(BASES[tool])]
    return tool, base.name, base_lines(base)


# --------------------------------------------------------------------------- properties


@SETTINGS
@given(case=cases, data=st.data(), crlf=st.booleans(), bom=st.booleans(), torn=st.booleans())
def test_mutated_recorded_file_imports_without_loss_and_reimports_unchanged(
        case: tuple[str, int], data: st.DataObject, crlf: bool, bom: bool, torn: bool) -> None:
    tool, base, source_lines = pick(case)
    mutated = mutate(tool, source_lines, data.draw(mutations(tool), label="mutations"))
    tail = b""
    if torn:
        whole = mutated.lines[data.draw(st.integers(0, len(mutated.lines) - 1), label="torn line")]
        tail = whole[: data.draw(st.integers(1, max(1, len(whole) - 1)), label="torn at")]
    with import_workspace() as (root, conn, target):
        src = source_path(root, base)
        src.write_bytes(render(mutated.lines, crlf=crlf, bom=bom, tail=tail))
        rep = run(conn, tool, src, target)
        assert rep.status == "new", rep.to_dict()
        (frep,) = [f for f in rep.files if not f.reference]
        assert frep.bad_lines == mutated.bad, frep.to_dict()
        assert frep.torn_tail_bytes == len(tail)
        assert_nothing_lost(expected(tool, mutated.lines), held(target, rep.session_id))
        before = (target.transcript(rep.session_id).read_bytes(), index_rows(conn, rep.session_id))
        again = run(conn, tool, src, target, NOW + 1000)
        assert again.status == "unchanged"
        assert (target.transcript(rep.session_id).read_bytes(), index_rows(conn, rep.session_id)) == before


@SETTINGS
@given(case=cases, data=st.data(), crlf=st.booleans(), torn_first=st.booleans())
def test_a_grown_mutated_file_imports_exactly_its_new_lines_once(
        case: tuple[str, int], data: st.DataObject, crlf: bool, torn_first: bool) -> None:
    tool, base, source_lines = pick(case)
    mutated = mutate(tool, source_lines, data.draw(mutations(tool), label="mutations"))
    lines = mutated.lines
    cut = data.draw(st.integers(2, len(lines) - 1), label="cut")
    tail = lines[cut][: data.draw(st.integers(1, max(1, len(lines[cut]) - 1)), label="torn at")] if torn_first else b""
    with import_workspace() as (root, conn, target):
        src = source_path(root, base)
        src.write_bytes(render(lines[:cut], crlf=crlf, tail=tail))
        first = run(conn, tool, src, target)
        before = b"" if first.status == "refused" else target.transcript(first.session_id).read_bytes()
        src.write_bytes(render(lines, crlf=crlf))
        grown = run(conn, tool, src, target, NOW + 1000)
        assert grown.status in ("new", "updated", "unchanged"), grown.to_dict()
        sid = grown.session_id
        after = target.transcript(sid).read_bytes()
        if before:
            assert after.startswith(before), "the transcript written before is kept byte for byte"
            assert after[len(before):].count(b"\n") == grown.new_records + grown.replaced_records \
                + grown.hidden_off_branch
        got = held(target, sid)
        assert_nothing_lost(expected(tool, lines), got)
        assert len(got.ids) == len(set(got.ids)), "a message twice"
        with import_workspace() as (_, conn2, target2):
            fresh = run(conn2, tool, src, target2)
            assert held(target2, fresh.session_id).ids == got.ids
            assert visible_rows(conn2, sid) == visible_rows(conn, sid)
        third = run(conn, tool, src, target, NOW + 2000)
        assert third.status == "unchanged" and target.transcript(sid).read_bytes() == after


@SETTINGS
@given(case=cases, data=st.data())
def test_a_rewritten_or_rewound_file_never_loses_what_was_imported(case: tuple[str, int], data: st.DataObject) -> None:
    tool, base, lines = pick(case)
    with import_workspace() as (root, conn, target):
        src = source_path(root, base)
        src.write_bytes(render(lines))
        first = run(conn, tool, src, target)
        had = held(target, first.session_id)
        how = data.draw(st.sampled_from(["rewound", "rewritten"]), label="how")
        if how == "rewound":
            later = lines[: data.draw(st.integers(2, len(lines) - 1), label="keep")]
        else:
            edits = st.lists(st.builds(Mutation, st.just("text"), st.integers(0, 999), TEXT), min_size=1, max_size=3)
            later = mutate(tool, lines, data.draw(edits, label="edits")).lines
        src.write_bytes(render(later))
        second = run(conn, tool, src, target, NOW + 1000)
        assert second.status in ("updated", "unchanged"), second.to_dict()
        now = held(target, first.session_id)
        assert set(had.ids) <= set(now.ids), "a message imported before is gone"
        assert set(had.calls) <= set(now.calls)
        if how == "rewound":  # an older copy: everything imported before stays as it was
            assert_nothing_lost(Expected(had.texts, set(had.calls), {}), now)
        else:  # an edited message follows the source (a replacement line of its id)
            assert_nothing_lost(expected(tool, later), now)



# --------------------------------------------------------------------------- opencode (its SQLite database)

(OPENCODE_DB,) = RECORDED.joinpath("opencode").rglob("opencode.db")


def opencode_expected(db: Path) -> dict[str, Expected]:
    """Per session without a pending revert: the text of user and assistant ``text`` parts (not
    ``ignored``; not of a ``summary`` reply, which is a checkpoint), every ``tool`` part's call and a
    completed one's output."""
    out: dict[str, Expected] = {}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        sessions = [sid for sid, revert in conn.execute("SELECT id, revert FROM session") if not revert]
        for sid in sessions:
            exp = out.setdefault(sid, Expected([], set(), {}))
            rows = conn.execute("SELECT m.data, p.data FROM part p JOIN message m ON m.id = p.message_id "
                                "WHERE p.session_id = ? ORDER BY p.message_id, p.id", (sid,)).fetchall()
            for mdata, pdata in rows:
                try:
                    msg, part = json.loads(mdata), json.loads(pdata)
                except ValueError:
                    continue
                if not isinstance(part, dict) or msg.get("summary") is True:
                    continue
                if part.get("type") == "text" and not part.get("ignored") and str(part.get("text", "")).strip():
                    exp.texts.append(clean(part["text"]))
                elif part.get("type") == "tool":
                    exp.calls.add(str(part.get("callID")))
                    state = part.get("state") or {}
                    if state.get("status") == "completed" and isinstance(state.get("output"), str):
                        exp.results[str(part.get("callID"))] = clean(state["output"])
    finally:
        conn.close()
    return out


@dataclass(frozen=True)
class DbMutation:
    kind: str  # text | output | extra | unknown | bad
    at: int
    value: Any = None


db_mutations = st.lists(st.one_of(
    st.builds(DbMutation, st.just("text"), st.integers(0, 999), st.one_of(TEXT, LONG)),
    st.builds(DbMutation, st.just("output"), st.integers(0, 999), st.one_of(TEXT, LONG)),
    st.builds(DbMutation, st.just("extra"), st.integers(0, 999), TEXT),
    st.builds(DbMutation, st.just("unknown"), st.integers(0, 999), st.sampled_from(["future-part", "agent-note"])),
    st.builds(DbMutation, st.just("bad"), st.integers(0, 999), st.sampled_from(["{not json", "[1]", ""])),
), max_size=8)


def mutate_db(db: Path, muts: list[DbMutation]) -> int:
    """Apply ``muts`` to the database (a copy); the number of parts that are not JSON objects."""
    conn = sqlite3.connect(db)
    bad = 0
    try:
        for mut in muts:
            parts = conn.execute("SELECT id, message_id, session_id, time_created, data FROM part "
                                 "ORDER BY id").fetchall()
            loaded = [(row, _load(row[4].encode("utf-8", "surrogatepass"))) for row in parts]
            if mut.kind == "text":
                pool = [(r, d) for r, d in loaded if d.get("type") == "text"]
            elif mut.kind == "output":
                pool = [(r, d) for r, d in loaded if d.get("type") == "tool" and (d.get("state") or {}).get("status")
                        == "completed"]
            else:
                pool = loaded
            if not pool:
                continue
            row, data = pool[mut.at % len(pool)]
            if mut.kind == "text":
                data["text"] = mut.value
            elif mut.kind == "output":
                data["state"]["output"] = mut.value
            elif mut.kind == "extra" and data:
                data["futureField"] = mut.value
            if mut.kind in ("text", "output", "extra") and data:
                conn.execute("UPDATE part SET data = ? WHERE id = ?", (dumps(data).decode(), row[0]))
            elif mut.kind in ("unknown", "bad"):
                new = dumps({"type": mut.value, "v": 1}).decode() if mut.kind == "unknown" else mut.value
                conn.execute("INSERT INTO part VALUES (?, ?, ?, ?, ?, ?)",
                             (f"{row[0]}~{len(parts):05d}", row[1], row[2], row[3], row[3], new))
                bad += mut.kind == "bad"
        conn.commit()
    finally:
        conn.close()
    return bad


def opencode_import(conn: sqlite3.Connection, db: Path, target: ImportTarget,
                    now: int = NOW) -> dict[str, SessionReport]:
    summary = import_root(conn, "opencode", db, target, now_ms=lambda: now)
    for rep in summary.sessions:
        assert rep.status != "refused" or rep.reason in REFUSALS, rep.to_dict()
    return {rep.external_id: rep for rep in summary.sessions}


@SETTINGS
@given(muts=db_mutations)
def test_mutated_opencode_database_imports_without_loss_and_reimports_unchanged(muts: list[DbMutation]) -> None:
    with import_workspace() as (root, conn, target):
        db = root / "src" / "opencode.db"
        db.write_bytes(OPENCODE_DB.read_bytes())
        bad = mutate_db(db, muts)
        reps = opencode_import(conn, db, target)
        assert sum(f.bad_lines for r in reps.values() for f in r.files) == bad
        for sid, exp in opencode_expected(db).items():
            assert reps[sid].status == "new", reps[sid].to_dict()
            assert_nothing_lost(exp, held(target, reps[sid].session_id))
        before = {sid: target.transcript(r.session_id).read_bytes() for sid, r in reps.items()}
        again = opencode_import(conn, db, target, NOW + 1000)
        assert {r.status for r in again.values()} == {"unchanged"}
        assert {sid: target.transcript(r.session_id).read_bytes() for sid, r in reps.items()} == before


@SETTINGS
@given(muts=db_mutations, data=st.data())
def test_a_grown_opencode_database_imports_exactly_its_new_parts_once(muts: list[DbMutation],
                                                                     data: st.DataObject) -> None:
    with import_workspace() as (root, conn, target):
        full = root / "full.db"
        full.write_bytes(OPENCODE_DB.read_bytes())
        mutate_db(full, muts)
        db = root / "src" / "opencode.db"
        db.write_bytes(full.read_bytes())
        with sqlite3.connect(db) as cut:  # opencode still writing: the newest messages are not there yet
            ids = [m for (m,) in cut.execute("SELECT id FROM message ORDER BY id")]
            keep = data.draw(st.integers(1, len(ids) - 1), label="keep messages")
            cut.execute("DELETE FROM part WHERE message_id >= ?", (ids[keep],))
            cut.execute("DELETE FROM message WHERE id >= ?", (ids[keep],))
        first = opencode_import(conn, db, target)
        before = {sid: target.transcript(r.session_id).read_bytes() for sid, r in first.items()
                  if r.status != "refused"}
        db.write_bytes(full.read_bytes())
        grown = opencode_import(conn, db, target, NOW + 1000)
        for sid, rep in grown.items():
            after = target.transcript(rep.session_id).read_bytes()
            if sid in before:
                assert after.startswith(before[sid]), "the transcript written before is kept byte for byte"
                assert after[len(before[sid]):].count(b"\n") == rep.new_records + rep.replaced_records \
                    + rep.hidden_off_branch
        for sid, exp in opencode_expected(db).items():
            got = held(target, grown[sid].session_id)
            assert_nothing_lost(exp, got)
            assert len(got.ids) == len(set(got.ids))
            with import_workspace() as (_, conn2, target2):
                fresh = opencode_import(conn2, db, target2)
                assert held(target2, fresh[sid].session_id).ids == got.ids
