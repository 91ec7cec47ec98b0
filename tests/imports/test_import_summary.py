"""The import summary the CLI prints, and its hint for another tool's folder (issue 23)."""

from __future__ import annotations

from pathlib import Path

from runtime.import_cli import nothing_found_hint, other_tool_hint, render_summary
from store.interchange.importers.sniff import guess_source
from tests.importers import gen

CONV = [gen.User("hello"), gen.Response((("text", "hi"),), ())]


def test_summary_counts_new_messages_apart_from_parsed_ones_and_names_hidden_and_unknown() -> None:
    """Reproduces: "N messages" counted parsed messages, and unknown kinds and hidden messages went unmentioned;
    then the messages the sessions hold were called "parsed" (they are what the sessions hold from their sources:
    a record read twice, or left out, is not one more)."""
    result = {"root": "/r", "total": 2, "counts": {"updated": 1, "unchanged": 1}, "messages": 40,
              "newMessages": 3, "hiddenOffBranch": 2, "unknownKinds": {"world_state": 4, "x": 1},
              "sourceBytes": 0}
    text = render_summary(result)
    assert "updated 1 imported before from /r (1 unchanged); 3 messages new (40 in the sessions read)" in text
    assert "2 message(s) were hidden: they are no longer on the source's current branch" in text
    assert "skipped record kinds this importer does not know: world_state ×4, x ×1" in text
    quiet = render_summary({**result, "hiddenOffBranch": 0, "unknownKinds": {}})
    assert "hidden" not in quiet and "do not know" not in quiet


def test_summary_says_which_lines_did_not_come_in_as_written() -> None:
    """Reproduces: a session whose file held a line that is not JSON, or one over the 32 MiB line limit (a
    huge tool output), was imported without it and the summary said only "1 new": the skipped message was
    named nowhere but in ``--json``'s per-file counts."""
    files = [{"path": "/r/a.jsonl", "badLines": 2, "oversizedLines": 1, "repairedLines": 0, "tornTailBytes": 0},
             {"path": "/r/b.jsonl", "badLines": 0, "oversizedLines": 0, "repairedLines": 3, "tornTailBytes": 17}]
    result = {"root": "/r", "total": 2, "counts": {"new": 2}, "messages": 9, "newMessages": 9, "sourceBytes": 0,
              "sessions": [{"sessionId": "cc-a", "status": "new", "files": files[:1]},
                           {"sessionId": "cc-b", "status": "new", "files": files[1:]}]}
    lines = render_summary(result).splitlines()
    assert lines[1:] == [
        "3 line(s) could not be read and were skipped (2 not JSON, 1 over the line size limit) in 1 session(s); "
        "--json names the files",
        "3 line(s) held bytes that are not UTF-8: read with U+FFFD in their place",
        "1 file(s) end with an incomplete line (a tool still writing it, or a crash): left for the next import"]
    clean = [{**f, "badLines": 0, "oversizedLines": 0, "repairedLines": 0, "tornTailBytes": 0} for f in files]
    quiet = {**result, "sessions": [{"sessionId": "cc-a", "status": "new", "files": clean}]}
    assert len(render_summary(quiet).splitlines()) == 1
    # past the reports a result keeps, its totals still say it
    many = {**result, "sessions": [], "truncated": True, "unreadLines": 7, "repairedLines": 2}
    assert render_summary(many).splitlines()[1:3] == [
        "7 line(s) could not be read and were skipped; --json names the files",
        "2 line(s) held bytes that are not UTF-8: read with U+FFFD in their place"]


def test_the_folder_of_each_tool_is_recognised(tmp_path: Path) -> None:
    writers = {
        "claude-code": ("p/5e550000-0000-4000-8000-000000000000.jsonl", gen.claude_code_lines(CONV)),
        "codex": ("2026/01/02/rollout-x.jsonl", gen.codex_lines(CONV)),
        "pi": ("--w--/s.jsonl", gen.pi_lines(CONV)),
    }
    for source, (rel, lines) in writers.items():
        root = tmp_path / source
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_bytes(b"".join(lines))
        assert guess_source(root) == source
        assert other_tool_hint(source, str(root)) is None
        other = "codex" if source != "codex" else "pi"
        hint = other_tool_hint(other, str(root))
        assert hint is not None and f"looks like {source}'s sessions, not {other}'s" in hint
    (tmp_path / "oc" / "storage" / "session").mkdir(parents=True)
    assert guess_source(tmp_path / "oc") == "opencode"
    (tmp_path / "empty").mkdir()
    assert guess_source(tmp_path / "empty") is None


def test_an_empty_folder_hints_where_the_tool_keeps_its_sessions(tmp_path: Path) -> None:
    """Reproduces: an import of a folder with no session said "nothing found" and nothing more."""
    usual = str(tmp_path / ".codex" / "sessions")
    assert nothing_found_hint("codex", str(tmp_path / "elsewhere"), usual) == (
        f"hint: no codex sessions in {tmp_path / 'elsewhere'}; codex keeps them in {usual}")
    assert nothing_found_hint("codex", usual, usual) == f"hint: no codex sessions in {usual} yet"
    text = render_summary({"root": "/r", "total": 0, "counts": {}, "messages": 0, "sourceBytes": 0},
                          hint=nothing_found_hint("pi", "/r", "/home/u/.pi/agent/sessions"))
    assert text.splitlines() == [
        "imported nothing from /r (no sessions found); 0 messages new (0 in the sessions read), 0 B read",
        "hint: no pi sessions in /r; pi keeps them in /home/u/.pi/agent/sessions"]


def test_the_import_summary_is_a_sentence_in_a_dry_run_and_in_a_real_one() -> None:
    """A dry run printed the raw statuses ("3 would-new"), and a run that imported nothing said "imported 3
    session(s)" of three unchanged ones."""
    base = {"root": "/r", "messages": 6, "newMessages": 4, "sourceBytes": 2048}
    dry = render_summary({**base, "dryRun": True, "total": 9,
                          "counts": {"would-new": 6, "would-updated": 1, "unchanged": 2, "refused": 0}})
    assert dry.splitlines()[0] == ("would import 6 new sessions and update 1 from /r (2 unchanged); "
                                   "4 messages would be new (6 in the sessions read), 2.0 KB read")
    real = render_summary({**base, "total": 9, "counts": {"new": 6, "updated": 1, "unchanged": 2}})
    assert real.splitlines()[0] == ("imported 6 new sessions and updated 1 from /r (2 unchanged); "
                                    "4 messages new (6 in the sessions read), 2.0 KB read")
    same = {**base, "messages": 3, "newMessages": 0, "total": 3, "counts": {"unchanged": 3}}
    assert render_summary({**same, "dryRun": True}).splitlines()[0].startswith(
        "would import nothing from /r (3 unchanged); 0 messages would be new")
    assert render_summary(same).splitlines()[0].startswith("imported nothing from /r (3 unchanged); 0 messages new")
    one = render_summary({**base, "total": 2, "counts": {"new": 1, "refused": 1}})
    assert one.splitlines()[0].startswith("imported 1 new session from /r (1 refused); ")
    nothing = render_summary({"root": "/r", "total": 0, "counts": {}, "messages": 0, "sourceBytes": 0})
    assert nothing.splitlines()[0] == "imported nothing from /r (no sessions found); 0 messages new (0 in the " \
                                      "sessions read), 0 B read"


def test_a_pi_host_data_directory_is_pointed_to_its_sessions_folder(tmp_path: Path) -> None:
    """``import pi-host DATA_DIR`` (the folder a newcomer knows) found nothing and said "no pi-host sessions in
    DATA_DIR yet", though DATA_DIR/sessions held every transcript."""
    (tmp_path / "sessions").mkdir()
    assert nothing_found_hint("pi-host", str(tmp_path), "/cwd") == f"hint: no pi-host sessions in {tmp_path} yet"
    (tmp_path / "sessions" / "abc.jsonl").write_text("{}\n")
    assert nothing_found_hint("pi-host", str(tmp_path), "/cwd") == (
        f"hint: {tmp_path} looks like a pi-host data directory; its sessions are in {tmp_path / 'sessions'}: "
        f"try: pi-host import pi-host {tmp_path / 'sessions'}")
