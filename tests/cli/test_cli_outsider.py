"""An outsider's pass over the CLI as README.md and ``pi-host <command> --help`` describe it: the real entry
point (``runtime.cli.main``) in processes of their own against real host processes, forked from the warm
forkserver (``tests.hostkit.run_cli``: each command a process of its own with its own argv, environment, exit
status and output, without an interpreter start and the host's import per call); a command that needs its own
session, locale or interpreter settings runs as ``python -m runtime.cli``.

What tests/cli, tests/doctor, tests/imports and tests/settings already cover is left to them; this file
checks what they leave out: how ``stop`` and ``status`` read a ``host.json`` whose pid is a zombie, a live
stranger or no process at all (``stop`` must never signal anything but the host); ``stop --timeout``; a host
that accepts connections but never answers; every client command without a host (one line, nothing
created); the ``--json`` shapes of every read and ``open --print``; offline reads refusing what the host
refuses; completion scripts that their shell parses and that complete the session ids of every command
taking one, in the root ``--dev`` names; ``import --dry-run`` leaving the index alone; and ``export`` on
stdout in its three formats, with secrets only when asked and a redaction count that counts redactions.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from runtime.client import open_client
from tests.hostkit import REPO, HostProcess, forks_alike, msg, run_cli, start_host_process
from tests.importers import gen

SECRET = "sk-outsider-0123456789abcdef"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def cli(data: Path | None, *args: str, env: dict[str, str] | None = None, timeout: float = 60,
        new_session: bool = False) -> subprocess.CompletedProcess[str]:
    head = ["--data-dir", str(data)] if data is not None else []
    if not new_session and forks_alike(env):
        # the same main forked from the warm forkserver: no interpreter start and import per call (the command
        # as installed runs in the tests that need its own process group, locale or interpreter settings)
        return run_cli(*head, *args, env=_env(env), timeout=timeout, inherit=False)
    return subprocess.run([sys.executable, "-m", "runtime.cli", *head, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=_env(env), start_new_session=new_session)


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _seed(host: HostProcess, titles: tuple[str, ...] = ("Outsider",), texts: tuple[str, ...] = ("hello",)
          ) -> list[str]:
    async def go() -> list[str]:
        ids = []
        async with open_client(host.url, host.token, client_id="cli-outsider", client_kind="ui") as c:
            for title in titles:
                sid = str((await c.call("session.create", {"title": title}))["id"])
                for i, text in enumerate(texts):
                    await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", text)})
                ids.append(sid)
        return ids

    return trio.run(go)


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return "gone"
    return stat[stat.rfind(b")") + 2:][:1].decode()


# -- host.json and the pid it names ----------------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs procfs to make a zombie visible")
def test_a_killed_host_whose_parent_has_not_reaped_it_is_called_killed(tmp_path: Path) -> None:
    """README: "Kill it with kill -9 instead and the CLI says in one line that host.json is stale". Until its
    parent reaps it, a killed host is a zombie that ``kill(pid, 0)`` still finds: the CLI called that "pid N is
    alive but does not hold host.lock (a reused pid)", sending the reader looking for another process."""
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "serve", "--port", "0",
                             "--quiet"], cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, "the host did not start"
            try:
                if json.loads((data / "host.json").read_text()).get("pid") == proc.pid:
                    break
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # not waited for: a zombie until proc.wait() below
        while _proc_state(proc.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        status = cli(data, "status")
        assert status.returncode == 2
        line = one_line(status.stderr)
        assert f"is stale: pid {proc.pid} is not running (the host was killed)" in line, line
        stop = cli(data, "stop")
        assert stop.returncode == 2 and "nothing to stop" in one_line(stop.stderr)
        assert "(the host was killed)" in stop.stderr
        listed = cli(data, "sessions")
        assert listed.returncode == 0 and "(the host was killed)" in listed.stderr, listed.stderr
        doctor = cli(None, "doctor", "--data-dir", str(data))  # the host is stopped: doctor checks, never refuses
        assert doctor.returncode in (0, 1), doctor.stdout + doctor.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def test_stop_leaves_a_live_stranger_that_reused_the_pid_alone(tmp_path: Path) -> None:
    """``stop`` signals only a host that holds ``host.lock``; a live process under the pid of a killed host's
    ``host.json`` is someone else's."""
    data = tmp_path / "data"
    start_host_process(data).kill9()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        info = json.loads((data / "host.json").read_text())
        info["pid"] = stranger.pid
        (data / "host.json").write_text(json.dumps(info))
        status = cli(data, "status")
        assert status.returncode == 2
        assert f"pid {stranger.pid} is alive but does not hold host.lock (a reused pid)" in one_line(status.stderr)
        stop = cli(data, "stop", "--timeout", "2")
        assert stop.returncode == 2 and one_line(stop.stderr).startswith("pi-host: nothing to stop: ")
        time.sleep(0.2)
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()


def test_stop_never_signals_a_process_group_for_a_host_json_without_a_pid(host: HostProcess) -> None:
    """``kill(0, SIGTERM)`` signals the caller's own process group (and -1 every process): a ``host.json``
    naming pid 0 made ``pi-host stop`` kill itself (and its process group) instead of stopping the host."""
    info_path = host.data_dir / "host.json"
    info = json.loads(info_path.read_text())
    for bad in (0, None, "123"):
        damaged = dict(info, pid=bad)
        tmp = info_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(damaged))
        os.replace(tmp, info_path)
        stop = cli(host.data_dir, "stop", "--timeout", "2", new_session=True)  # its own group: safe if it fails
        assert stop.returncode == 2, (bad, stop.returncode, stop.stderr)
        assert "names no process id" in one_line(stop.stderr), stop.stderr
    assert host.proc.poll() is None  # the host was left running
    info_path.write_text(json.dumps(info))
    assert cli(host.data_dir, "status", "--json").returncode == 0  # and still answers


def test_stop_gives_up_after_its_timeout_and_the_host_still_stops_cleanly(host: HostProcess) -> None:
    """``stop --timeout``: "seconds to wait"; a host that cannot act on SIGTERM (here: SIGSTOPped) makes
    ``stop`` give up with one line and a non-zero status; the SIGTERM still takes effect once it runs."""
    os.kill(host.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        stop = cli(host.data_dir, "stop", "--timeout", "1")
        took = time.monotonic() - started
        assert stop.returncode == 1, stop.stderr
        assert f"pid {host.proc.pid} did not stop within 1 s" in one_line(stop.stderr)
        assert took < 15
    finally:
        os.kill(host.proc.pid, signal.SIGCONT)
    assert host.reap(60) == 0
    assert (host.data_dir / "clean-shutdown").exists() and not (host.data_dir / "host.json").exists()


HUNG_DRIVER = """
import sys
import runtime.client
runtime.client._CONNECT_TIMEOUT = 1.0  # the 60 s a real run waits, shortened
from runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_host_that_never_answers_is_one_line_not_a_traceback(host: HostProcess) -> None:
    """A stopped (SIGSTOP) or hung host accepts the TCP connection and never answers the WebSocket
    handshake: after the connect timeout every client command printed a 60-line ExceptionGroup traceback
    ending in trio.TooSlowError instead of the one line naming the problem."""
    os.kill(host.proc.pid, signal.SIGSTOP)
    try:
        for args in (["status"], ["sessions"], ["settings", "get"], ["export", "abc"]):
            done = subprocess.run([sys.executable, "-c", HUNG_DRIVER, "--data-dir", str(host.data_dir), *args],
                                  cwd=REPO, capture_output=True, text=True, timeout=60, env=_env())
            assert done.returncode == 2, (args, done.returncode, done.stderr[-2000:])
            line = one_line(done.stderr)
            assert line.startswith("pi-host: the host ") and " did not answer (" in line, (args, line)
            assert "did not answer the WebSocket handshake within 1 s" in line, (args, line)
    finally:
        os.kill(host.proc.pid, signal.SIGCONT)


def test_serve_on_a_file_for_a_data_dir_is_one_line(tmp_path: Path) -> None:
    """``serve --data-dir`` naming a file (or a path below one) ended in a FileExistsError /
    NotADirectoryError traceback; every other refusal of ``serve`` is one line."""
    a_file = tmp_path / "afile"
    a_file.write_text("mine\n")
    for root, why in ((a_file, "it is not a folder"), (a_file / "below", "Not a directory")):
        done = cli(root, "serve", "--port", "0", "--quiet")
        assert done.returncode == 2, done.stderr
        assert one_line(done.stderr) == f"pi-host: cannot use {root} as the data directory: {why}"
    assert a_file.read_text() == "mine\n"


# -- no host --------------------------------------------------------------------------------------------------


def test_every_client_command_without_a_host_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    for args in (["status"], ["status", "--json"], ["follow", "abc"], ["settings", "get"], ["settings", "set",
                 "k", "1"], ["providers"], ["models"], ["export", "abc"], ["import", "pi", str(tmp_path)],
                 ["open", "--print"]):
        done = cli(nowhere, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert one_line(done.stderr) == f"pi-host: no host is running on {nowhere}", args
        assert done.stdout == ""
    stop = cli(nowhere, "stop")
    assert stop.returncode == 2
    assert one_line(stop.stderr) == f"pi-host: nothing to stop: no host is running on {nowhere}"
    for args in (["sessions"], ["sessions", "--json"], ["show", "abc"], ["search", "x"]):
        done = cli(nowhere, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert "is not a pi-host data directory" in one_line(done.stderr) and done.stdout == ""
    assert not nowhere.exists()


# -- reads on a running host ------------------------------------------------------------------------------------


def test_json_shapes_open_print_and_a_missing_session(host: HostProcess) -> None:
    first, second = _seed(host, titles=("First", "Second"), texts=("hello outsider", "again"))
    status = json.loads(cli(host.data_dir, "status", "--json").stdout)
    assert {"version", "bootId", "uptimeMs", "actors", "boot"} <= set(status)
    assert status["bootId"] == json.loads((host.data_dir / "host.json").read_text())["bootId"]
    page = json.loads(cli(host.data_dir, "sessions", "--json", "--limit", "1").stdout)
    assert [s["id"] for s in page["sessions"]] == [second] and page["nextCursor"]  # newest first
    both = json.loads(cli(host.data_dir, "sessions", "--json").stdout)
    assert [s["id"] for s in both["sessions"]] == [second, first] and both["nextCursor"] is None
    human = cli(host.data_dir, "sessions", "--limit", "1").stdout.splitlines()
    assert len(human) == 1 and human[0].startswith(second)
    hits = json.loads(cli(host.data_dir, "search", "outsider", "--json").stdout)
    assert hits["totalSessions"] == 2 and {r["sessionId"] for r in hits["results"]} == {first, second}
    none = cli(host.data_dir, "search", "zzqqxx")
    assert none.returncode == 0 and none.stdout == "" and none.stderr == "no sessions match 'zzqqxx'\n"
    window = json.loads(cli(host.data_dir, "show", first, "--json").stdout)
    assert [m["id"] for m in window["messages"]] == ["m0", "m1"]

    # README: "Every read takes --json" - the configuration reads too
    for args in (["providers"], ["models"], ["models", "--provider", "none"], ["settings", "get"],
                 ["settings", "get", "largePasteThreshold"]):
        read = cli(host.data_dir, *args, "--json")
        assert read.returncode == 0, (args, read.stderr)
        json.loads(read.stdout)
    assert json.loads(cli(host.data_dir, "providers", "--json").stdout) == {"providers": []}
    assert isinstance(json.loads(cli(host.data_dir, "models", "--json").stdout)["models"], list)

    port = host.url.rsplit(":", 1)[1]
    urls = [cli(host.data_dir, "open", "--print") for _ in range(2)]
    assert all(u.returncode == 0 for u in urls), urls
    links = [u.stdout.strip() for u in urls]
    assert all(link.startswith(f"http://127.0.0.1:{port}/#code=") for link in links), links
    assert links[0] != links[1] and host.token not in "".join(links)  # a one-time code, never the token

    for args in (["show", "nosuch"], ["follow", "nosuch"], ["export", "nosuch", "--out",
                                                            str(host.data_dir.parent / "x.md")]):
        done = cli(host.data_dir, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.splitlines()[0] == "pi-host: SESSION_NOT_FOUND: session nosuch not found", args
        assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (host.data_dir.parent / "x.md").exists()


def test_offline_reads_refuse_the_bounds_the_host_refuses(tmp_path: Path) -> None:
    """README: ``sessions``, ``show`` and ``search`` "also work with no host running" and a test holds their
    output equal online and offline. Out of the host's bounds they were not: ``sessions --limit 0`` (or -1)
    and ``show --limit 0`` / ``--before -1`` printed an empty listing with exit 0 offline, where the host
    answers INVALID_PARAMS (exit 1)."""
    host = start_host_process(tmp_path / "data")
    try:
        (sid,) = _seed(host)
        bad = (["sessions", "--limit", "0"], ["sessions", "--limit", "-1"], ["sessions", "--limit", "501"],
               ["show", sid, "--limit", "0"], ["show", sid, "--limit", "5001"], ["show", sid, "--before", "-1"],
               ["search", "hello", "--limit", "0"])
        good = (["sessions", "--limit", "500", "--json"], ["show", sid, "--limit", "5000", "--json"],
                ["show", sid, "--before", "0", "--json"])
        online_good = []
        for args in bad:
            done = cli(host.data_dir, *args)
            assert done.returncode == 1 and done.stderr.startswith("pi-host: INVALID_PARAMS: "), (args, done.stderr)
        for args in good:
            done = cli(host.data_dir, *args)
            assert done.returncode == 0, (args, done.stderr)
            online_good.append(json.loads(done.stdout))
    finally:
        host.terminate()
    for args in bad:
        done = cli(host.data_dir, *args)
        assert done.returncode == 1, (args, done.returncode, done.stdout, done.stderr)
        assert done.stderr.startswith("pi-host: INVALID_PARAMS: ") and done.stdout == "", (args, done.stderr)
    for args, online in zip(good, online_good, strict=True):
        done = cli(host.data_dir, *args)
        assert done.returncode == 0 and json.loads(done.stdout) == online, (args, done.stderr)


# -- completion ---------------------------------------------------------------------------------------------------


def _complete(script: str, words: list[str], env: dict[str, str] | None = None) -> list[str]:
    line = " ".join(f'"{w}"' for w in words)
    code = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _pi_host; printf "%s\\n" "${{COMPREPLY[@]}}"'
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, env=_env(env))
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completion_scripts_parse_and_complete_every_command_and_every_session_argument(host: HostProcess) -> None:
    """README: ``source <(pi-host completion bash)`` (or ``zsh``) completes commands, options and session ids.
    ``export <sessionId>`` is in the tour, but its session ids did not complete."""
    bash = cli(None, "completion", "bash")
    zsh = cli(None, "completion", "zsh")
    assert bash.returncode == 0 and zsh.returncode == 0
    checked = subprocess.run(["bash", "-n"], input=bash.stdout, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    if shutil.which("zsh"):
        checked = subprocess.run(["zsh", "-n"], input=zsh.stdout, capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stderr
    sourced = subprocess.run(["bash", "-c", "source <(pi-host completion bash) && complete -p pi-host"],
                             capture_output=True, text=True, timeout=60, env=_env())
    assert sourced.returncode == 0 and "_pi_host" in sourced.stdout, sourced.stderr
    bad = cli(None, "completion", "fish")
    assert bad.returncode == 2 and "invalid choice: 'fish'" in bad.stderr

    commands = {"serve", "status", "sessions", "show", "search", "follow", "stop", "open", "agent", "chat",
                "completion", "types", "import", "export", "settings", "providers", "models", "doctor"}
    assert commands <= set(_complete(bash.stdout, ["pi-host", ""]))
    assert {"--include-secrets", "--include-thinking", "--format", "--out"} <= set(
        _complete(bash.stdout, ["pi-host", "export", "--"]))
    (sid,) = _seed(host)
    for command in ("show", "follow", "export", "chat"):
        words = _complete(bash.stdout, ["pi-host", "--data-dir", str(host.data_dir), command, ""])
        assert sid in words, (command, words)


def test_completion_offers_the_session_ids_of_the_development_root_after_dev(tmp_path: Path) -> None:
    """README: ``--dev`` picks ``~/.pi-desktop-dev`` for every command, and completion completes session ids;
    after ``--dev`` it listed the ids of the packaged root instead (only ``--data-dir`` reached the lookup)."""
    home = tmp_path / "home"
    host = start_host_process(home / ".pi-desktop-dev")
    try:
        (sid,) = _seed(host)
    finally:
        host.terminate()
    script = cli(None, "completion", "bash").stdout
    env = {"HOME": str(home)}
    for words in (["pi-host", "--dev", "show", ""], ["pi-host", "show", "--dev", ""],
                  ["pi-host", "--dev", "export", ""]):
        assert sid in _complete(script, words, env), words
    assert sid not in _complete(script, ["pi-host", "show", ""], env)  # the packaged root holds no session
    assert not (home / ".pi-desktop").exists()


# -- import and export ------------------------------------------------------------------------------------------


def test_import_dry_run_leaves_the_index_and_the_files_alone(tmp_path: Path, host: HostProcess) -> None:
    project = tmp_path / "claude" / "projects" / "-work-outsider"
    project.mkdir(parents=True)
    conv = [gen.User("the dry run word is heron"), gen.Response((("text", "noted"),), ())]
    for i in range(2):
        name = f"0d000000-0000-4000-8000-00000000000{i}"
        (project / f"{name}.jsonl").write_bytes(b"".join(gen.claude_code_lines(conv, session=name)))
    (existing,) = _seed(host)

    def files() -> list[str]:
        return sorted(str(p.relative_to(host.data_dir)) for p in host.data_dir.rglob("*")
                      if p.is_file() and not p.name.startswith(("pi.sqlite", "host.")) and "logs" not in p.parts)

    before_files = files()
    before_list = cli(host.data_dir, "sessions", "--json").stdout
    dry = cli(host.data_dir, "import", "claude-code", str(project.parent), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    summary = json.loads(dry.stdout)
    assert summary["dryRun"] is True and summary["counts"]["would-new"] == 2
    assert files() == before_files
    assert cli(host.data_dir, "sessions", "--json").stdout == before_list
    heron = cli(host.data_dir, "search", "heron")
    assert (heron.stdout, heron.stderr) == ("", "no sessions match 'heron'\n")
    human = cli(host.data_dir, "import", "claude-code", str(project.parent), "--dry-run")
    assert human.returncode == 0 and "would import 2 new sessions from " in human.stdout, human.stdout
    done = json.loads(cli(host.data_dir, "import", "claude-code", str(project.parent), "--json").stdout)
    assert done["dryRun"] is False and done["counts"]["new"] == 2  # the dry runs recorded nothing
    listed = json.loads(cli(host.data_dir, "sessions", "--json").stdout)["sessions"]
    assert len(listed) == 3 and existing in {s["id"] for s in listed}


def test_export_formats_on_stdout_secrets_only_when_asked_and_honest_counts(tmp_path: Path,
                                                                             host: HostProcess) -> None:
    async def fill() -> tuple[str, str]:
        async with open_client(host.url, host.token, client_id="cli-outsider-export", client_kind="ui") as c:
            await c.call("providers.create", {"id": "op", "name": "Outsider", "apiKey": SECRET,
                                              "baseUrl": "https://example.invalid/v1"})
            leaky = str((await c.call("session.create", {"title": "Leaky"}))["id"])
            await c.call("session.appendMessage", {"sessionId": leaky, "message": msg(
                "u1", f"my key is {SECRET}, keep it safe")})
            await c.call("session.appendMessage", {"sessionId": leaky, "message": msg(
                "a1", "", role="assistant", blocks=[
                    {"type": "thinking", "text": "a private thought"},
                    {"type": "text", "text": "the reply to the outsider"}])})
            clean = str((await c.call("session.create", {"title": "Clean"}))["id"])
            await c.call("session.appendMessage", {"sessionId": clean, "message": msg("c1", "nothing secret")})
        async with open_client(host.url, host.token, client_id="cli-outsider-agent", client_kind="agent") as c:
            await c.call("session.startTurn", {"sessionId": clean, "turnId": "t1", "environment": {
                "version": 1, "connection": {"baseUrl": "http://127.0.0.1:9/v1", "credentialRef": None},
                "credentialRefs": []}})  # what the reference sidecar sends for its fake model: no credential
            await c.call("session.appendMessage", {"sessionId": clean, "turnId": "t1", "message": msg(
                "c2", "a reply", role="assistant")})
        return leaky, clean

    leaky, clean = trio.run(fill)
    for fmt in ("md", "html", "jsonl"):
        plain = cli(host.data_dir, "export", leaky, "--format", fmt)
        assert plain.returncode == 0, plain.stderr
        assert "the reply to the outsider" in plain.stdout and SECRET not in plain.stdout, fmt
        assert "a private thought" not in plain.stdout, fmt
        full = cli(host.data_dir, "export", leaky, "--format", fmt, "--include-secrets", "--include-thinking")
        assert full.returncode == 0 and SECRET in full.stdout and "a private thought" in full.stdout, fmt
        if fmt == "html":
            assert plain.stdout.lower().startswith("<!doctype html>")
        if fmt == "jsonl":
            lines = [json.loads(line) for line in plain.stdout.splitlines()]
            assert lines[0]["type"] == "session"
    out = tmp_path / "leaky.md"
    saved = cli(host.data_dir, "export", leaky, "--out", str(out))
    assert saved.returncode == 0 and saved.stdout == ""
    assert SECRET not in out.read_text() and "the reply to the outsider" in out.read_text()
    assert "exported 2 messages" in saved.stderr and "0 redaction(s)" not in saved.stderr
    # a session with nothing secret in it reports no redactions, in every format
    for fmt in ("md", "html", "jsonl"):
        target = tmp_path / f"clean.{fmt}"
        done = cli(host.data_dir, "export", clean, "--format", fmt, "--out", str(target))
        assert done.returncode == 0, done.stderr
        assert "exported 2 messages" in done.stderr and ", 0 redaction(s))" in done.stderr, (fmt, done.stderr)
    missing_dir = tmp_path / "no" / "such" / "dir" / "x.md"
    done = cli(host.data_dir, "export", clean, "--out", str(missing_dir))
    assert done.returncode != 0 and "Traceback" not in done.stderr and not missing_dir.exists()
    assert done.stderr.startswith("pi-host: ")
