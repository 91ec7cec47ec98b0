"""Re-importing a source that changed the way the real tool changes it: what is new comes in once, nothing
imported before is lost or doubled, and a restarted host serves the same.

Every source here is a file the real CLI wrote (``tests/fixtures/recorded``), copied and changed the way that
tool changes it after the first import, then imported again with ``import.sessions`` on a real host:

* Claude Code appends to the session file when the user resumes it, and may write a line again word for
  word under its ``uuid`` (a resume re-recording the chain, an echoed prompt, a retried write). Its loader
  keeps one entry per uuid, so it shows that message once. The repeat became a second copy of the message
  (``<uuid>@<offset>``): a prompt shown twice, an assistant reply whose text doubled; in a rewound file the
  repeat made the tree "untrusted", so the abandoned turn came back live after the live one (while its
  revision still held it). ``--resume`` in older versions starts a NEW file that repeats the earlier lines
  under their uuids: that is another session in Claude Code's list, and here too, each one whole.
* Codex appends to the rollout on resume; the rollout's earlier part can also change (a torn last line
  repaired before the append, the file re-saved with CRLF line ends or re-serialized, its history cut at a
  compaction). Its records were named by byte offset (``L<offset>``), so any change of an earlier line's
  length renamed every later line: the re-import added all of them again.

Each case asserts the exact ids and texts the session shows after each import, after a restart, and that a
further import of the same bytes is ``unchanged``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

from runtime.client import HostClient
from store.interchange import import_write, imports
from store.interchange.importers import claude_code, codex
from store.interchange.importers.common import session_id_for
from tests.hostkit import client_for, inprocess_host

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
CC_RESUME = next(RECORDED.glob("claude-code/2.1.332/projects/*/9617099f-8f7a-4d84-a5a8-f6641f15ae29.jsonl"))
"""The recorded ``resume`` + ``compact`` session: three prompts (the 2nd and 3rd after resumes), a /compact."""
CX_RESUME = next(RECORDED.glob("codex/0.171.0/sessions/*/*/*/rollout-*-01a234be-907e-7d13-9348-da115abb4f14.jsonl"))
"""The recorded Codex ``resume`` rollout: a turn, then ``codex resume`` and a second turn (line 14 on)."""
TIMEOUT = 60


# --------------------------------------------------------------------------- helpers


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _rec(line: bytes) -> dict[str, Any]:
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


def _text(message: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in message["blocks"] if b.get("type") == "text")


async def _import(c: HostClient, root: Path, source: str) -> dict[str, Any]:
    result = await c.call("import.sessions", {"source": source, "root": str(root)})
    assert result["counts"]["refused"] == 0, result
    return dict(result)


async def _shown(c: HostClient, sid: str) -> list[tuple[str, str, str]]:
    """(id, role, text) of every message the session shows, in order."""
    window = await c.call("session.get", {"sessionId": sid, "full": True})
    return [(m["id"], m["role"], _text(m)) for m in window["messages"] if not m.get("deleted")]


def _texts(shown: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [(role, text[:60]) for _, role, text in shown]


def _once(shown: list[tuple[str, str, str]]) -> None:
    ids = [mid for mid, _, _ in shown]
    assert len(ids) == len(set(ids)), ids


# --------------------------------------------------------------------------- Claude Code

CC_FIRST = [("user", "[[scenario:resume]] Remember the word heron."), ("assistant", "Noted: the word is heron.")]
CC_ALL = [*CC_FIRST, ("user", "What was the word?"), ("assistant", "The word was heron."),
          ("user", "One more time: the word?"), ("assistant", "Still heron."),
          ("system", "<local-command-caveat>The command below was run directly in "),
          ("user", "<command-name>/compact</command-name>\n            <command-m"),
          ("user", "<local-command-stdout>Compacted (ctrl+o to see full summary)"),
          ("user", "[[scenario:after-compact]] Do you still know the word?"),
          ("assistant", "After the compaction I still know: heron.")]
"""What the whole recorded session shows (Claude Code's own view of it: every message once)."""


def _cc_ids(sid: str, lines: list[bytes], texts: list[tuple[str, str]]) -> list[str]:
    """The ids the messages of ``texts`` are named by: ``<sid>:<uuid>`` of the first line saying each (for a
    reply, the first line of its API response: Claude Code writes one line per block)."""
    recs = [_rec(line) for line in lines]
    out = []
    for _role, text in texts:
        for rec in recs:
            content = (rec.get("message") or {}).get("content")
            said = content if isinstance(content, str) else "".join(
                b.get("text", "") for b in content or () if isinstance(b, dict))
            if rec.get("type") in ("user", "assistant", "system") and said.startswith(text[:40]):
                if rec["type"] == "assistant":
                    rec = next(r for r in recs if r.get("type") == "assistant"
                               and r["message"].get("id") == rec["message"].get("id"))
                out.append(f"{sid}:{rec['uuid']}")
                break
        else:
            raise AssertionError(f"no line says {text!r}")
    return out


def _cc_source(tmp: Path) -> tuple[Path, Path, list[bytes]]:
    root = tmp / "projects"
    path = root / "-tmp-work" / CC_RESUME.name
    path.parent.mkdir(parents=True)
    return root, path, _lines(CC_RESUME)


def _written_again(line: bytes, *, later: bool = False) -> bytes:
    """``line`` as Claude Code writes a line again: the same uuid, parent and message; ``later``: a minute later
    (a resume re-recording it), else byte for byte (a retried write)."""
    if not later:
        return line
    rec = _rec(line)
    when = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")) + timedelta(minutes=1)
    rec["timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _rewind_third(lines: list[bytes]) -> list[bytes]:
    """The session as Claude Code writes it when the user rewinds to the second prompt and sends the third
    instead (the third's parent is the second's parent): the second turn is abandoned."""
    recs = [_rec(ln) for ln in lines]
    second = next(r for r in recs if r.get("type") == "user" and r["message"]["content"] == "What was the word?")
    out = list(lines)
    for i, r in enumerate(recs):
        if r.get("type") == "user" and r["message"]["content"] == "One more time: the word?":
            rewound = {**r, "parentUuid": second["parentUuid"]}
            out[i] = (json.dumps(rewound, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
    return out


async def test_claude_code_resume_with_repeated_lines_brings_each_message_once(tmp_path: Path) -> None:
    root, path, lines = _cc_source(tmp_path)
    sid = session_id_for("claude-code", CC_RESUME.stem)
    first_turn = lines[:24]  # up to the first reply and its bookkeeping
    prompt = next(ln for ln in lines if b"Remember the word heron" in ln and _rec(ln)["type"] == "user")
    reply = next(ln for ln in lines if b"Noted: the word is heron" in ln and _rec(ln)["type"] == "assistant")
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(first_turn))
            first = await _import(c, root, "claude-code")
            assert first["counts"]["new"] == 1
            shown = await _shown(c, sid)
            assert _texts(shown) == CC_FIRST
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, CC_FIRST)
            # resumed: the first prompt is recorded again (later time) and the reply line written again, then
            # the conversation goes on
            path.write_bytes(b"".join([*first_turn, _written_again(prompt, later=True), _written_again(reply),
                                       *lines[24:]]))
            grown = await _import(c, root, "claude-code")
            (report,) = grown["sessions"]
            assert report["status"] == "updated" and grown["newMessages"] == len(CC_ALL) - len(CC_FIRST)
            shown = await _shown(c, sid)
            _once(shown)
            assert _texts(shown) == [(role, text[:60]) for role, text in CC_ALL]
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, CC_ALL)
            assert shown[1][2] == "Noted: the word is heron."  # the repeated reply line did not double its text
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            again = await _import(c, root, "claude-code")
            assert again["counts"]["unchanged"] == 1 and again["newMessages"] == 0
            assert await _shown(c, sid) == shown


async def test_claude_code_repeated_line_in_a_rewound_session_keeps_the_abandoned_turn_archived(
        tmp_path: Path) -> None:
    """The third prompt was sent after a rewind to the second (its parent is the second's parent): the second
    turn is abandoned, archived as a revision. A later import of the file, grown with the third prompt written
    again and the rest of the session, shows the live branch once and leaves the abandoned turn archived."""
    root, path, lines = _cc_source(tmp_path)
    sid = session_id_for("claude-code", CC_RESUME.stem)
    lines = _rewind_third(lines)
    third_at = next(i for i, ln in enumerate(lines) if b"One more time: the word?" in ln and _rec(ln)["type"] == "user")
    live_first = [CC_FIRST[0], CC_FIRST[1], ("user", "One more time: the word?"), ("assistant", "Still heron.")]
    live_all = [*live_first, *[(role, text[:60]) for role, text in CC_ALL[6:]]]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(lines[:38]))  # through the third turn's reply
            first = await _import(c, root, "claude-code")
            assert first["sessions"][0]["archivedBranches"] == 1
            shown = await _shown(c, sid)
            assert _texts(shown) == live_first
            tree = await c.call("session.tree", {"sessionId": sid})
            archived = sorted(n["id"] for n in tree["nodes"] if n["id"].startswith("rev:"))
            assert archived
            path.write_bytes(b"".join([*lines[:38], _written_again(lines[third_at], later=True), *lines[38:]]))
            grown = await _import(c, root, "claude-code")
            (report,) = grown["sessions"]
            assert report["status"] == "updated", report
            assert grown["newMessages"] == len(live_all) - len(live_first) and report["hiddenOffBranch"] == 0
            shown = await _shown(c, sid)
            _once(shown)
            assert _texts(shown) == live_all
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, live_all)
            tree = await c.call("session.tree", {"sessionId": sid})
            assert sorted(n["id"] for n in tree["nodes"] if n["id"].startswith("rev:")) == archived
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            again = await _import(c, root, "claude-code")
            assert again["counts"]["unchanged"] == 1 and await _shown(c, sid) == shown


async def test_claude_code_copy_an_earlier_import_made_of_a_repeated_line_is_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewound file with a repeated line, imported by the importer before rules 12 (a repeat was never the
    same line: the tree was untrusted, every branch live, the repeat a message of its own): the next import
    hides the abandoned turn (archived) and the copy, and the session shows what a fresh import shows."""
    root, path, lines = _cc_source(tmp_path)
    sid = session_id_for("claude-code", CC_RESUME.stem)
    lines = _rewind_third(lines)
    third_at = next(i for i, ln in enumerate(lines) if b"One more time: the word?" in ln and _rec(ln)["type"] == "user")
    path.write_bytes(b"".join([*lines[:38], _written_again(lines[third_at], later=True), *lines[38:]]))
    live_all = [*CC_FIRST, ("user", "One more time: the word?"), ("assistant", "Still heron."),
                *[(role, text[:60]) for role, text in CC_ALL[6:]]]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        with monkeypatch.context() as m:
            m.setattr(claude_code, "_same_line", lambda path, span, rec, snapshot=None: False)
            m.setattr(claude_code, "MAX_REPEATED_IDS", 0)  # and no uuid written again is one message (rules 13)
            m.setattr(import_write, "IMPORT_RULES", 11)
            m.setattr(imports, "IMPORT_RULES", 11)
            async with inprocess_host(data) as host, client_for(host) as c:
                await _import(c, root, "claude-code")
                before = await _shown(c, sid)
                assert len(before) == len(live_all) + 3  # the abandoned turn live, the repeat a second copy
        async with inprocess_host(data) as host, client_for(host) as c:
            again = await _import(c, root, "claude-code")
            (report,) = again["sessions"]
            assert report["status"] == "updated" and report["hiddenOffBranch"] == 3 and again["newMessages"] == 0
            shown = await _shown(c, sid)
            _once(shown)
            assert _texts(shown) == live_all
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, live_all)
            tree = await c.call("session.tree", {"sessionId": sid})
            assert [n for n in tree["nodes"] if n["id"].startswith("rev:")]
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "claude-code"))["counts"]["unchanged"] == 1


async def test_claude_code_resume_into_a_new_file_is_a_second_whole_session(tmp_path: Path) -> None:
    """Older Claude Code resumed into a new session file that repeats the earlier lines under their uuids.
    Claude Code lists both sessions; so does the host: the first one stays as imported, the new one holds the
    history it repeats and what was said after the resume, each message once."""
    root, path, lines = _cc_source(tmp_path)
    old_sid = session_id_for("claude-code", CC_RESUME.stem)
    new_name = "5e55e55e-0000-4000-8000-00000000c0de"
    new_sid = session_id_for("claude-code", new_name)
    first_turn = lines[:24]

    def moved(line: bytes) -> bytes:
        rec = _rec(line)
        if rec.get("sessionId") == CC_RESUME.stem:
            rec["sessionId"] = new_name
        return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()

    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(first_turn))
            await _import(c, root, "claude-code")
            old_shown = await _shown(c, old_sid)
            assert _texts(old_shown) == CC_FIRST
            (path.parent / f"{new_name}.jsonl").write_bytes(b"".join(moved(ln) for ln in lines))
            both = await _import(c, root, "claude-code")
            assert sorted((s["sessionId"], s["status"]) for s in both["sessions"]) == sorted(
                [(old_sid, "unchanged"), (new_sid, "new")])
            assert await _shown(c, old_sid) == old_shown
            new_shown = await _shown(c, new_sid)
            _once(new_shown)
            assert _texts(new_shown) == [(role, text[:60]) for role, text in CC_ALL]
            assert [m for m, _, _ in new_shown] == [m.replace(old_sid, new_sid)
                                                    for m in _cc_ids(old_sid, lines, CC_ALL)]
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, old_sid) == old_shown and await _shown(c, new_sid) == new_shown
            again = await _import(c, root, "claude-code")
            assert again["counts"]["unchanged"] == 2


# --------------------------------------------------------------------------- Codex

CX_FIRST = [("system", "<skills_instructions>\n## Skills\nA skill is a set of local instru"),
            ("system", "<environment_context>\n  <cwd>/tmp/record-codex-lwo1tagp/work</c"),
            ("user", "[[scenario:resume]] Remember the word heron."), ("assistant", "Noted: the word is heron.")]
CX_ALL = [*CX_FIRST, ("user", "What was the word?"), ("assistant", "The word was heron.")]
CX_RESUMED_AT = 14
"""The first line ``codex resume`` wrote (its ``thread_settings_applied``): the lines before are the first turn."""


def _cx_source(tmp: Path) -> tuple[Path, Path, list[bytes]]:
    root = tmp / "sessions"
    path = root / CX_RESUME.relative_to(CX_RESUME.parents[3])
    path.parent.mkdir(parents=True)
    return root, path, _lines(CX_RESUME)


def _crlf(lines: list[bytes]) -> list[bytes]:
    return [ln.rstrip(b"\n") + b"\r\n" for ln in lines]


def _spaced(lines: list[bytes]) -> list[bytes]:
    """Each line written again by a JSON writer with spaces after separators (same values, other bytes)."""
    return [(json.dumps(_rec(ln), ensure_ascii=False) + "\n").encode() for ln in lines]


def _meta_grown(lines: list[bytes]) -> list[bytes]:
    """The ``session_meta`` line written again with the repository's git facts added."""
    meta = _rec(lines[0])
    meta["payload"]["git"] = {"commit_hash": "0123456789abcdef0123456789abcdef01234567", "branch": "main",
                              "repository_url": "https://example.invalid/repo.git"}
    return [(json.dumps(meta, separators=(",", ":")) + "\n").encode(), *lines[1:]]


def _compacted(lines: list[bytes]) -> list[bytes]:
    """The history before the resume cut and replaced by a ``compacted`` line holding its summary and the
    replacement history (what Codex keeps of it): the first turn's items are no longer lines of the file."""
    items = [_rec(ln)["payload"] for ln in lines if _rec(ln)["type"] == "response_item"]
    compacted = {"timestamp": _rec(lines[-1])["timestamp"], "type": "compacted",
                 "payload": {"message": "", "replacement_history": items}}
    return [lines[0], (json.dumps(compacted, separators=(",", ":")) + "\n").encode()]


REWRITES = {"crlf": _crlf, "spaced": _spaced, "meta": _meta_grown, "compacted": _compacted}


async def _cx_check(c: HostClient, sid: str, want: list[tuple[str, str]], first_ids: list[str]) -> list[Any]:
    shown = await _shown(c, sid)
    _once(shown)
    assert [(role, text[:60]) for _, role, text in shown] == [(role, text[:60]) for role, text in want]
    assert [m for m, _, _ in shown][: len(first_ids)] == first_ids
    return shown


async def test_codex_resume_appends_each_new_message_once(tmp_path: Path) -> None:
    root, path, lines = _cx_source(tmp_path)
    sid = session_id_for("codex", "01a234be-907e-7d13-9348-da115abb4f14")
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(lines[:CX_RESUMED_AT]))
            assert (await _import(c, root, "codex"))["counts"]["new"] == 1
            first_ids = [m for m, _, _ in await _cx_check(c, sid, CX_FIRST, [])]
            path.write_bytes(b"".join(lines))
            grown = await _import(c, root, "codex")
            assert grown["counts"]["updated"] == 1 and grown["newMessages"] == 2
            shown = await _cx_check(c, sid, CX_ALL, first_ids)
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "codex"))["counts"]["unchanged"] == 1


@pytest.mark.parametrize("rewrite", sorted(REWRITES))
async def test_codex_rollout_whose_earlier_part_changed_brings_only_what_is_new(tmp_path: Path,
                                                                                rewrite: str) -> None:
    """The first turn imported; then the rollout's first part changes (``rewrite``) and ``codex resume``
    appends the second turn. The re-import adds the second turn once and keeps the first as it was."""
    root, path, lines = _cx_source(tmp_path)
    sid = session_id_for("codex", "01a234be-907e-7d13-9348-da115abb4f14")
    change = REWRITES[rewrite]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(lines[:CX_RESUMED_AT]))
            await _import(c, root, "codex")
            first_ids = [m for m, _, _ in await _cx_check(c, sid, CX_FIRST, [])]
            later = _crlf(lines[CX_RESUMED_AT:]) if rewrite == "crlf" else lines[CX_RESUMED_AT:]
            path.write_bytes(b"".join([*change(lines[:CX_RESUMED_AT]), *later]))
            grown = await _import(c, root, "codex")
            (report,) = grown["sessions"]
            assert report["status"] == "updated" and grown["newMessages"] == 2, report
            shown = await _cx_check(c, sid, CX_ALL, first_ids)
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "codex"))["counts"]["unchanged"] == 1


async def test_codex_torn_line_repaired_on_resume_brings_the_resumed_turn_once(tmp_path: Path) -> None:
    """A crash tore the rollout's last line (the first reply); ``codex resume`` ends the torn line before it
    appends. The torn reply is no message (Codex cannot read it either); the resumed turn comes in once."""
    root, path, lines = _cx_source(tmp_path)
    sid = session_id_for("codex", "01a234be-907e-7d13-9348-da115abb4f14")
    reply_at = next(i for i, ln in enumerate(lines) if b"Noted: the word is heron" in ln
                    and _rec(ln)["type"] == "response_item")
    torn = lines[reply_at][: len(lines[reply_at]) // 2]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join([*lines[:reply_at], torn]))
            await _import(c, root, "codex")
            first_ids = [m for m, _, _ in await _cx_check(c, sid, CX_FIRST[:3], [])]
            path.write_bytes(b"".join([*lines[:reply_at], torn + b"\n", *lines[CX_RESUMED_AT:]]))
            grown = await _import(c, root, "codex")
            assert grown["newMessages"] == 2
            shown = await _cx_check(c, sid, [*CX_FIRST[:3], *CX_ALL[4:]], first_ids)
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "codex"))["counts"]["unchanged"] == 1


async def test_codex_session_an_earlier_import_named_by_offset_keeps_its_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session imported when records were named by byte offset (``L<offset>``) grows: the re-import names
    the held lines as before and adds only the new turn."""
    root, path, lines = _cx_source(tmp_path)
    sid = session_id_for("codex", "01a234be-907e-7d13-9348-da115abb4f14")
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        with monkeypatch.context() as m:
            m.setattr(codex._Converter, "line_id", lambda self, rec, offset: f"L{offset}")
            async with inprocess_host(data) as host, client_for(host) as c:
                path.write_bytes(b"".join(lines[:CX_RESUMED_AT]))
                await _import(c, root, "codex")
                first = await _cx_check(c, sid, CX_FIRST, [])
        first_ids = [mid for mid, _, _ in first]
        assert all(mid.split(":", 1)[1].startswith("L") for mid in first_ids)
        async with inprocess_host(data) as host, client_for(host) as c:
            path.write_bytes(b"".join(lines))
            grown = await _import(c, root, "codex")
            assert grown["newMessages"] == 2
            shown = await _cx_check(c, sid, CX_ALL, first_ids)
            assert all(mid.split(":", 1)[1].startswith("L") for mid, _, _ in shown)
            assert (await _import(c, root, "codex"))["counts"]["unchanged"] == 1


def _said_otherwise(line: bytes, text: str) -> bytes:
    """``line`` written again under its uuid saying something else (its text blocks ``text``), a minute later:
    the loader of Claude Code keeps one entry per uuid, the last line written (a map by uuid: ``Jm`` in
    2.0.76's ``cli.js``, the transcript loader of 2.1.3xx likewise)."""
    rec = _rec(_written_again(line, later=True))
    content = rec["message"]["content"]
    rec["message"] = {**rec["message"], "content": text if isinstance(content, str) else [
        {**b, "text": text} if isinstance(b, dict) and b.get("type") == "text" else b for b in content]}
    return (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


CC_REPLY_AGAIN = "Noted again: the word is heron."


async def test_claude_code_uuid_written_again_saying_something_else_is_one_message_the_last(tmp_path: Path) -> None:
    """The first reply's line written again after the resume under its uuid, its text changed: Claude Code shows
    one reply there, the last line written. It was imported as a second message (``<uuid>@<offset>``) after
    the whole conversation; now it is one message at the first line's place, with the last line's text."""
    root, path, lines = _cc_source(tmp_path)
    sid = session_id_for("claude-code", CC_RESUME.stem)
    reply = next(ln for ln in lines if b"Noted: the word is heron" in ln and _rec(ln)["type"] == "assistant")
    path.write_bytes(b"".join([*lines, _said_otherwise(reply, CC_REPLY_AGAIN)]))
    expected = [CC_FIRST[0], ("assistant", CC_REPLY_AGAIN), *[(role, text[:60]) for role, text in CC_ALL[2:]]]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        async with inprocess_host(data) as host, client_for(host) as c:
            first = await _import(c, root, "claude-code")
            (report,) = first["sessions"]
            assert report["status"] == "new" and first["newMessages"] == len(CC_ALL), report
            shown = await _shown(c, sid)
            _once(shown)
            assert _texts(shown) == expected
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, CC_ALL)
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "claude-code"))["counts"]["unchanged"] == 1


async def test_claude_code_copy_an_earlier_import_made_of_a_uuid_written_again_is_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same file imported by the importer of rules 12 (the line written again a message of its own, after
    the conversation): the import under rules 13 reads the unchanged file again, shows the reply once with the
    last line's text and hides the copy; a restart serves the same and a further import is ``unchanged``."""
    root, path, lines = _cc_source(tmp_path)
    sid = session_id_for("claude-code", CC_RESUME.stem)
    reply = next(ln for ln in lines if b"Noted: the word is heron" in ln and _rec(ln)["type"] == "assistant")
    path.write_bytes(b"".join([*lines, _said_otherwise(reply, CC_REPLY_AGAIN)]))
    expected = [CC_FIRST[0], ("assistant", CC_REPLY_AGAIN), *[(role, text[:60]) for role, text in CC_ALL[2:]]]
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        with monkeypatch.context() as m:
            m.setattr(claude_code, "MAX_REPEATED_IDS", 0)  # no uuid written again is one message: rules 12
            m.setattr(import_write, "IMPORT_RULES", 12)
            m.setattr(imports, "IMPORT_RULES", 12)
            async with inprocess_host(data) as host, client_for(host) as c:
                await _import(c, root, "claude-code")
                before = await _shown(c, sid)
                assert len(before) == len(CC_ALL) + 1 and before[-1][2] == CC_REPLY_AGAIN  # the copy, last
        async with inprocess_host(data) as host, client_for(host) as c:
            again = await _import(c, root, "claude-code")
            (report,) = again["sessions"]
            assert report["status"] == "updated" and report["hiddenOffBranch"] == 1, report
            assert again["newMessages"] == 0
            shown = await _shown(c, sid)
            _once(shown)
            assert _texts(shown) == expected
            assert [m for m, _, _ in shown] == _cc_ids(sid, lines, CC_ALL)
        async with inprocess_host(data) as host, client_for(host) as c:
            assert await _shown(c, sid) == shown
            assert (await _import(c, root, "claude-code"))["counts"]["unchanged"] == 1
