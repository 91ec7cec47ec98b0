"""The CLI's manners: help, --version, one-line failures, errors with details, --json, offline reads, stop,
follow, completion."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import trio

from runtime.client import open_client
from runtime.datadir import DataDir, DataDirLock
from runtime.host import VERSION
from tests.hostkit import REPO, HostProcess, forks_alike, msg, run_cli, start_host_process


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    full.update(env or {})
    if forks_alike(env):  # forked from the warm forkserver (tests.hostkit.run_cli)
        return run_cli(*args, env=full, timeout=timeout, inherit=False)
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=full)


async def _seed(host: HostProcess) -> str:
    async with open_client(host.url, host.token, client_id="cli-test-seed", client_kind="test") as c:
        sid = str((await c.call("session.create", {"title": "CLI manners"}))["id"])
        for i in range(5):
            await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"line {i} 数据库")})
    return sid


def seeded(data: Path) -> tuple[HostProcess, str]:
    host = start_host_process(data)
    return host, trio.run(_seed, host)


def test_no_command_prints_help_and_serves_nothing(tmp_path: Path) -> None:
    done = cli(env={"HOME": str(tmp_path)})
    assert done.returncode == 2
    assert done.stdout.startswith("usage: pi-host") and "serve" in done.stdout and "completion" in done.stdout
    assert not (tmp_path / ".pi-desktop").exists()
    # the exit codes a script meets are in the help (they were only in the module's docstring)
    text = " ".join(done.stdout.split())
    for code in ("0 ok", "1 an error the host answered", "2 no host", "3 the data directory is in use",
                 "4 actors kept crashing", "5 the data directory could not be opened", "6 the port is in use"):
        assert code in text, code
    doctor = cli("doctor", "--help")
    assert "exit 0 clean, 1 repairable or repaired, 2 damage it cannot repair, 3 refused" in " ".join(
        doctor.stdout.split())


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"pi-host {VERSION} (protocol 1)"


def test_serve_on_the_default_data_dir_says_so_first(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["HOME"] = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--port", "0", "--quiet"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(f"pi-host: serving the default data directory {tmp_path / '.pi-desktop'}")
        assert "--data-dir DIR serves another" in first
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_stale_host_json_is_one_line_and_reads_go_offline(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host, sid = seeded(data)
    pid = host.proc.pid
    host.kill9()
    host.proc.communicate()
    assert (data / "host.json").exists()
    done = cli("--data-dir", str(data), "status")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"is stale: pid {pid} is not running (the host was killed)" in done.stderr
    assert "Traceback" not in done.stderr
    listed = cli("--data-dir", str(data), "sessions")
    assert listed.returncode == 0, listed.stderr
    assert sid in listed.stdout and "5 msgs  CLI manners" in listed.stdout
    assert "read" in listed.stderr and "offline" in listed.stderr and "stale" in listed.stderr


def test_a_busy_port_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        done = cli("--data-dir", str(tmp_path / "data"), "serve", "--port", str(port), "--quiet")
    assert done.returncode == 6
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr and "--port 0" in done.stderr


def test_a_refused_migration_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    DataDir(data).ensure()
    conn = sqlite3.connect(data / "pi.sqlite")
    conn.execute("CREATE TABLE t(x)")
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    done = cli("--data-dir", str(data), "serve", "--port", "0", "--quiet")
    assert done.returncode == 5, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("pi-host: cannot open the data directory: SCHEMA_TOO_NEW")


def test_errors_print_code_message_and_field_details(host: HostProcess) -> None:
    bad = cli("--data-dir", str(host.data_dir), "sessions", "--limit", "0")
    assert bad.returncode == 1
    lines = bad.stderr.splitlines()
    assert lines[0].startswith("pi-host: INVALID_PARAMS: invalid params")
    assert any(line.startswith("  limit: Input should be greater than or equal to 1") for line in lines)
    missing = cli("--data-dir", str(host.data_dir), "show", "nosuch")
    assert missing.returncode == 1
    assert missing.stderr.splitlines()[0].startswith("pi-host: SESSION_NOT_FOUND: session nosuch not found")
    assert '  sessionId: "nosuch"' in missing.stderr


def _json_reads(data: Path, sid: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, args in (("sessions", ["sessions"]), ("show", ["show", sid, "--limit", "3"]),
                       ("search", ["search", "数据库"])):
        done = cli("--data-dir", str(data), *args, "--json")
        assert done.returncode == 0, done.stderr
        out[name] = json.loads(done.stdout)
    return out


def test_json_output_parses_online_and_offline_alike(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host, sid = seeded(data)
    try:
        status = json.loads(cli("--data-dir", str(data), "status", "--json").stdout)
        assert status["version"] == VERSION and status["boot"]
        online = _json_reads(data, sid)
    finally:
        host.terminate()
        host.proc.communicate()
    before = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in data.iterdir() if p.is_file())
    offline = _json_reads(data, sid)
    after = sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in data.iterdir() if p.is_file())
    assert before == after  # read-only: no file created or touched
    assert offline == online
    window = offline["show"]
    assert isinstance(window, dict)
    assert [m["seq"] for m in window["messages"]] == [3, 4, 5] and window["hasMoreBefore"] is True
    paged = json.loads(cli("--data-dir", str(data), "show", sid, "--limit", "3", "--before", "2", "--json").stdout)
    assert [m["seq"] for m in paged["messages"]] == [1, 2]


def test_search_says_on_stderr_when_more_sessions_match_than_it_printed(tmp_path: Path) -> None:
    """``pi-host search`` printed the first ``--limit`` (20) matching sessions and nothing about the rest, so a
    newcomer took 20 for all; ``sessions`` says "more sessions" on stderr. Now search does too (online and
    offline alike), with the total and how to see more; stdout stays one session a line."""
    data = tmp_path / "data"
    host, _ = seeded(data)

    async def two_more() -> None:
        async with open_client(host.url, host.token, client_id="cli-more", client_kind="test") as c:
            for n in range(2):
                sid = str((await c.call("session.create", {"title": f"more {n}"}))["id"])
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("x", "数据库 again")})

    try:
        trio.run(two_more)
        online = cli("--data-dir", str(data), "search", "数据库", "--limit", "2")
        every = cli("--data-dir", str(data), "search", "数据库")
    finally:
        host.terminate()
        host.proc.communicate()
    offline = cli("--data-dir", str(data), "search", "数据库", "--limit", "2")
    for done in (online, offline):
        assert done.returncode == 0, done.stderr
        assert len([line for line in done.stdout.splitlines() if not line.startswith(" ")]) == 2
        assert "pi-host: 2 of 3 matching sessions shown (--limit: up to 100)" \
            in done.stderr.splitlines(), done.stderr
    assert every.returncode == 0 and every.stderr == ""  # all 3 shown: nothing to say


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path: Path) -> None:
    """``pi-host sessions --json | head -1``: no traceback when the pipe closes (online and offline)."""
    data = tmp_path / "data"
    host, _ = seeded(data)

    def piped() -> tuple[int, str]:
        full = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "sessions",
                                 "--json", "--limit", "200"], cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                                text=True, env=full)
        os.close(write)
        os.close(read)  # the reader is gone before the command writes
        _, err = proc.communicate(timeout=60)
        return proc.returncode, err

    async def more() -> None:
        async with open_client(host.url, host.token, client_id="cli-pipe", client_kind="test") as c:
            for i in range(120):  # more than a pipe buffer of JSON: the write itself fails
                await c.call("session.create", {"title": f"pipe {i} " + "x" * 70})

    try:
        code, err = piped()  # one session: the output fails only when it is flushed
        assert (code, err) == (141, ""), err
        trio.run(more)
        code, err = piped()
        assert (code, err) == (141, ""), err
    finally:
        host.terminate()
        host.proc.communicate()
    code, err = piped()  # offline: only the one line saying so
    assert code == 141 and err.strip() == f"pi-host: no host running; read {data} offline", err


def test_offline_reads_refuse_while_a_host_holds_the_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host, _sid = seeded(data)
    host.terminate()
    host.proc.communicate()
    lock = DataDirLock(DataDir(data))  # what a booting host holds before it writes host.json
    lock.acquire()
    try:
        for args in (["sessions"], ["search", "line"], ["show", "x"]):
            done = cli("--data-dir", str(data), *args)
            assert done.returncode == 2
            assert "a host is starting" in done.stderr and done.stdout == ""
    finally:
        lock.release()


def test_stop_terminates_cleanly_and_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host = start_host_process(data)
    try:
        done = cli("--data-dir", str(data), "stop")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"pi-host stopped cleanly (pid {host.proc.pid})"
        assert host.reap(30) == 0
        assert (data / "clean-shutdown").exists() and not (data / "host.json").exists()
    finally:
        host.terminate()
        host.proc.communicate()
    again = cli("--data-dir", str(data), "stop")
    assert again.returncode == 2 and "nothing to stop: no host is running" in again.stderr


def test_follow_tails_a_sessions_events(tmp_path: Path) -> None:
    data = tmp_path / "data"
    host, sid = seeded(data)
    follow = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "follow", sid, "--json"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stderr is not None and follow.stdout is not None
        assert "following" in follow.stderr.readline()

        async def more() -> None:
            async with open_client(host.url, host.token, client_id="cli-follow-feed", client_kind="test") as c:
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg("late", "one more")})

        trio.run(more)
        event = json.loads(follow.stdout.readline())
        assert event["topic"] == "session.message" and event["data"]["message"]["id"] == "late"

        async def streaming() -> None:
            async with open_client(host.url, host.token, client_id="cli-follow-agent", client_kind="agent") as c:
                await c.call("session.startTurn", {"sessionId": sid, "turnId": "ft"})
                await c.call("session.saveInflightMessage", {"sessionId": sid, "turnId": "ft", "message": msg(
                    "fr", "half a reply", role="assistant")})
                await c.call("approvals.request", {"sessionId": sid, "turnId": "ft", "tool": "read_file",
                                                   "argsSummary": "read_file a.txt", "risk": "low"})

        trio.run(streaming)
        seen = [json.loads(follow.stdout.readline()) for _ in range(3)]
        by_topic = {e["topic"]: e for e in seen}
        assert set(by_topic) == {"turn.started", "session.inflight", "approval.requested"}, seen
        preview = by_topic["session.inflight"]
        assert preview["transient"] is True and preview["data"]["message"]["inflight"] is True
        before = [e["cursor"] for e in seen[:seen.index(preview)] if "transient" not in e]
        assert preview["cursor"] == max(before)  # a preview repeats the newest numbered cursor
        assert "transient" not in by_topic["turn.started"]
        assert by_topic["approval.requested"]["data"]["request"]["argsSummary"] == "read_file a.txt"
    finally:
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=30)
        host.terminate()
        host.proc.communicate()
    assert follow.returncode == 130, err  # 128 + SIGINT, as `agent` (`pi-host follow --help`)
    assert "Traceback" not in err, err


def _complete(script: str, words: list[str], data: Path | None = None) -> list[str]:
    line = " ".join(f'"{w}"' for w in words)
    code = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _pi_host; printf "%s\\n" "${{COMPREPLY[@]}}"'
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_shell_completion(tmp_path: Path) -> None:
    script = cli("completion", "bash").stdout
    assert "complete -F _pi_host pi-host" in script
    assert set(_complete(script, ["pi-host", "se"])) == {"serve", "sessions", "search", "settings"}
    assert "--limit" in _complete(script, ["pi-host", "show", "--l"])
    assert "--allow-origin" in _complete(script, ["pi-host", "--data-dir", "/x", "serve", "--a"])
    data = tmp_path / "data"
    host, sid = seeded(data)
    host.terminate()
    host.proc.communicate()
    words = _complete(script, ["pi-host", "--data-dir", str(data), "show", ""])
    assert sid in words and "--limit" in words and "serve" not in words  # ids from the offline session list
    zsh = cli("completion", "zsh").stdout
    assert zsh.startswith("autoload -U +X bashcompinit && bashcompinit")


def test_offline_reads_of_a_damaged_index_or_a_file_for_a_data_dir_say_so_without_a_traceback(tmp_path: Path) -> None:
    """The README: offline reads read the data directory read-only. A garbage pi.sqlite (doctor calls it
    DAMAGED; the next start quarantines it) and a --data-dir that is a file gave Python tracebacks."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "pi.sqlite").write_bytes(b"garbage, not a database\n")
    (data / "host.lock").touch()
    for command in (["sessions"], ["show", "abc"], ["search", "foo"]):
        got = cli("--data-dir", str(data), *command)
        assert got.returncode not in (0, 1) and "Traceback" not in got.stderr, got.stderr
        assert "cannot be read" in got.stderr and "pi-host serve" in got.stderr
    a_file = tmp_path / "afile"
    a_file.write_text("hi")
    for command in (["sessions"], ["show", "abc"], ["search", "foo"]):  # one line, worded as serve words it
        got = cli("--data-dir", str(a_file), *command)
        assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr
        assert got.stderr == f"pi-host: cannot use {a_file} as the data directory: it is not a folder\n", got.stderr


def test_serve_listens_on_loopback_only(tmp_path: Path) -> None:
    """RELIABILITY.md §5 "Bind to 127.0.0.1 (and ::1) only": ``--host`` takes a loopback address or localhost,
    and any other address is refused before anything is opened (before, 0.0.0.0 listened on every interface)."""
    data = tmp_path / "data"
    for address in ("0.0.0.0", "::", "192.168.1.5", "example.com", ""):
        done = cli("--data-dir", str(data), "serve", "--port", "0", "--quiet", "--host", address)
        assert done.returncode == 2, (address, done.stderr)
        assert "not a loopback address" in done.stderr and "127.0.0.1, ::1 or localhost" in done.stderr
    assert not data.exists()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "serve", "--port",
                             str(port), "--quiet", "--host", "127.0.0.2"], cwd=REPO, stderr=subprocess.PIPE)
    try:
        info = data / "host.json"
        for _ in range(600):
            if info.exists() and json.loads(info.read_text() or "{}").get("pid") == proc.pid:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        assert "127.0.0.2" in json.loads(info.read_text())["url"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
