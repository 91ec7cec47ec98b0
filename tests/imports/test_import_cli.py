"""``pi-host import`` and ``pi-host export`` against a real host process (the host writes every byte)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from store.interchange.importers.common import session_id_for
from tests.hostkit import REPO, HostProcess, run_cli
from tests.importers import gen

CONV = [gen.User("find the cli word pelican"), gen.Response((("thinking", "hidden thoughts"),
                                                             ("text", "the answer is forty-two")), ())]


def cli(data: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("--data-dir", str(data), *args, env=env)


def on_terminal(data: Path, *args: str) -> tuple[int, str]:
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), *args], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=120)
    finally:
        os.close(leader)
    return code, b"".join(chunks).decode()


def claude_home(tmp_path: Path, sessions: int = 3) -> Path:
    """``$CLAUDE_CONFIG_DIR`` with ``projects/`` holding ``sessions`` sessions and one file that is not one."""
    home = tmp_path / "claude-home"
    project = home / "projects" / "-work-cli"
    project.mkdir(parents=True)
    for i in range(sessions):
        name = f"5e550000-0000-4000-8000-00000000000{i}"
        (project / f"{name}.jsonl").write_bytes(b"".join(gen.claude_code_lines(CONV, session=name)))
    (project / "not-a-session.jsonl").write_bytes(b'{"hello": "world"}\n')
    return home


def test_import_defaults_to_the_tools_root_and_prints_a_json_summary(tmp_path: Path, host: HostProcess) -> None:
    home = claude_home(tmp_path)
    env = {"CLAUDE_CONFIG_DIR": str(home)}
    dry = cli(host.data_dir, "import", "claude-code", "--dry-run", "--json", env=env)
    assert dry.returncode == 1, dry.stderr  # one file is refused
    summary = json.loads(dry.stdout)
    assert summary["dryRun"] and summary["counts"]["would-new"] == 3 and summary["counts"]["refused"] == 1
    assert summary["root"] == str(home / "projects")
    assert not list((host.data_dir / "sessions").glob("*.jsonl"))
    done = cli(host.data_dir, "import", "claude-code", "--json", env=env)
    result = json.loads(done.stdout)
    assert result["counts"]["new"] == 3 and result["counts"]["refused"] == 1
    refused = [r for r in result["sessions"] if r["status"] == "refused"]
    assert refused[0]["externalId"] == "not-a-session" and refused[0]["reason"]
    assert len(list((host.data_dir / "sessions").glob("*.jsonl"))) == 3
    # searchable at once, through the host
    found = cli(host.data_dir, "search", "pelican")
    assert found.returncode == 0 and found.stdout.count("matches") == 3
    # human summary: the refusal with its reason, then the counts
    again = cli(host.data_dir, "import", "claude-code", str(home / "projects"))
    assert "refused not-a-session:" in again.stdout and "3 unchanged" in again.stdout


def test_import_draws_a_progress_bar_only_on_a_terminal(tmp_path: Path, host: HostProcess) -> None:
    home = claude_home(tmp_path, sessions=4)
    code, shown = on_terminal(host.data_dir, "import", "claude-code", str(home / "projects"))
    assert code == 1
    assert "import claude-code [" in shown and "5/5 sessions" in shown
    assert "imported 4 new sessions from " in shown and " (1 refused); " in shown
    piped = cli(host.data_dir, "import", "claude-code", str(home / "projects"))
    assert "\r" not in piped.stdout and "[" not in piped.stdout
    code, as_json = on_terminal(host.data_dir, "import", "claude-code", str(home / "projects"), "--json")
    assert "import claude-code [" not in as_json and json.loads(as_json)["counts"]["unchanged"] == 4


def test_without_a_host_the_cli_says_so(tmp_path: Path) -> None:
    out = cli(tmp_path / "nothing-here", "import", "pi", str(tmp_path))
    assert out.returncode == 2 and "no host is running" in out.stderr  # the one line every client command prints


def test_export_to_stdout_and_to_a_new_file(tmp_path: Path, host: HostProcess) -> None:
    home = claude_home(tmp_path, sessions=1)
    cli(host.data_dir, "import", "claude-code", str(home / "projects"))
    sid = session_id_for("claude-code", "5e550000-0000-4000-8000-000000000000")
    md = cli(host.data_dir, "export", sid)
    assert md.returncode == 0 and "forty-two" in md.stdout and "hidden thoughts" not in md.stdout
    thinking = cli(host.data_dir, "export", sid, "--include-thinking")
    assert "hidden thoughts" in thinking.stdout
    out = tmp_path / "exports" / "s.html"
    out.parent.mkdir()
    done = cli(host.data_dir, "export", sid, "--format", "html", "--out", str(out))
    assert done.returncode == 0 and "exported 2 messages" in done.stderr
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "forty-two" in page
    assert (out.stat().st_mode & 0o777) == 0o600
    again = cli(host.data_dir, "export", sid, "--format", "jsonl", "--out", str(out))
    assert again.returncode == 1 and "CONFLICT" in again.stderr
    assert out.read_text() == page  # never replaced
    assert sorted(p.name for p in out.parent.iterdir()) == ["s.html"]  # no temp file left
    # the JSONL export imports back (source pi-host) to the same messages
    jsonl = tmp_path / "exports" / "s.jsonl"
    assert cli(host.data_dir, "export", sid, "--format", "jsonl", "--out", str(jsonl)).returncode == 0
    back = json.loads(cli(host.data_dir, "import", "pi-host", str(jsonl), "--json").stdout)
    assert back["counts"]["new"] == 1 and back["messages"] == 2


def test_a_missing_root_an_absent_tool_and_another_tools_folder_are_one_clear_line(tmp_path: Path,
                                                                                     host: HostProcess) -> None:
    """Issue 23: ``import codex /nope`` (and ``import opencode`` with opencode never installed) printed a
    32-line trio traceback; ``import claude-code ~/.codex/sessions`` said "nothing found" with no hint."""
    missing = cli(host.data_dir, "import", "codex", str(tmp_path / "nope"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"pi-host: import codex: {tmp_path / 'nope'} does not exist"]
    assert "Traceback" not in missing.stderr and missing.stdout == ""

    never = cli(host.data_dir, "import", "opencode", env={"XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert never.returncode == 2 and "Traceback" not in never.stderr
    (line,) = never.stderr.strip().splitlines()
    assert "does not exist" in line and "is opencode installed?" in line

    codex_home = tmp_path / "codex-home" / "sessions" / "2026" / "01" / "02"
    codex_home.mkdir(parents=True)
    (codex_home / "rollout-2026-01-02T00-00-00-01900000-0000-7000-8000-00000000c0de.jsonl").write_bytes(
        b"".join(gen.codex_lines(CONV)))
    sessions = str(tmp_path / "codex-home" / "sessions")
    wrong = cli(host.data_dir, "import", "claude-code", sessions)
    assert wrong.returncode == 0, wrong.stderr
    assert f"hint: {sessions} looks like codex's sessions, not claude-code's; try: pi-host import codex" \
        in wrong.stdout
    right = cli(host.data_dir, "import", "codex", sessions)
    assert right.returncode == 0 and "1 new" in right.stdout and "hint" not in right.stdout
    assert "2 messages new (2 in the sessions read)" in right.stdout
    again = cli(host.data_dir, "import", "codex", sessions)
    assert "1 unchanged" in again.stdout and "0 messages new" in again.stdout


def test_the_path_may_follow_the_options_as_well_as_precede_them(tmp_path: Path, host: HostProcess) -> None:
    """``import claude-code --dry-run PATH`` (an option typed before the path) is the same command as
    ``import claude-code PATH --dry-run``; argparse alone called PATH an unrecognized argument (exit 2). Two
    paths, or an unknown option, stay usage errors."""
    home = claude_home(tmp_path)
    before = cli(host.data_dir, "import", "claude-code", str(home), "--dry-run", "--json")
    after = cli(host.data_dir, "import", "claude-code", "--dry-run", "--json", str(home))
    assert after.returncode == before.returncode == 1, after.stderr  # one file is refused
    assert ({**json.loads(after.stdout), "importId": None} == {**json.loads(before.stdout), "importId": None})
    assert json.loads(after.stdout)["counts"]["would-new"] == 3
    assert not list((host.data_dir / "sessions").glob("*.jsonl"))
    for wrong in (("--dry-run", str(home), str(home)), ("--dry-run", "--bogus", str(home))):
        refused = cli(host.data_dir, "import", "claude-code", *wrong)
        assert refused.returncode == 2 and "unrecognized arguments" in refused.stderr, refused.stderr
