"""The CLI's rough edges left by the outsider pass (tests/cli/test_cli_outsider.py), each fixed with a test here:
README's "every read takes ``--json``" (``status`` printed JSON either way), ``follow``'s exit on Ctrl-C, paging
``sessions`` online and offline (``--cursor``), offline ``show`` refusing a malformed id as the host does, and
shell completion of ``settings``' verbs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from runtime.client import open_client
from tests.hostkit import REPO, HostProcess, msg, run_cli, start_host_process


def cli(data: Path | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    head = ["--data-dir", str(data)] if data is not None else []
    return run_cli(*head, *args, env=env, timeout=timeout, inherit=False)  # forked: see tests.hostkit.run_cli


def _seed(host: HostProcess, count: int = 1) -> list[str]:
    async def go() -> list[str]:
        ids = []
        async with open_client(host.url, host.token, client_id="cli-rough", client_kind="test") as c:
            for i in range(count):
                sid = str((await c.call("session.create", {"title": f"Rough {i}"}))["id"])
                await c.call("session.appendMessage", {"sessionId": sid, "message": msg(f"m{i}", f"hello {i}")})
                ids.append(sid)
        return ids

    return trio.run(go)


def test_status_prints_a_summary_for_a_person_and_the_whole_result_with_json(host: HostProcess) -> None:
    """README: "every read takes --json" (and prints text for a person without it); ``status`` printed the
    whole host.status JSON either way."""
    _seed(host)
    whole = cli(host.data_dir, "status", "--json")
    assert whole.returncode == 0, whole.stderr
    parsed = json.loads(whole.stdout)
    assert parsed["version"] and parsed["boot"]["sessionsScanned"] >= 0
    brief = cli(host.data_dir, "status")
    assert brief.returncode == 0, brief.stderr
    lines = brief.stdout.splitlines()
    assert not brief.stdout.lstrip().startswith("{") and 3 <= len(lines) <= 8, brief.stdout
    assert lines[0].startswith(f"pi-host {parsed['version']}  up ") and parsed["bootId"] in lines[0]
    assert any(line.startswith("actors: ") for line in lines)
    assert any(line.startswith("boot: first start (a new data directory), ") for line in lines), brief.stdout


def test_status_says_how_the_last_run_ended_after_a_restart(tmp_path: Path) -> None:
    """The boot line tells a new data directory (nothing recovered: it said "last stop unclean (recovered)")
    from a restart after a clean stop and after a kill, as ``serve``'s recovery line does."""
    data = tmp_path / "data"
    first = start_host_process(data)
    try:
        _seed(first)
    finally:
        assert first.terminate() == 0
    again = start_host_process(data)
    try:
        lines = cli(data, "status").stdout.splitlines()
        assert any(line.startswith("boot: last stop clean, 1 sessions scanned") for line in lines), lines
    finally:
        again.kill9()
    third = start_host_process(data)
    try:
        lines = cli(data, "status").stdout.splitlines()
        assert any(line.startswith("boot: last stop unclean (recovered), ") for line in lines), lines
    finally:
        third.terminate()


def _follow(data: Path, sid: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PI_DESKTOP_DATA_DIR"}
    return subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(data), "follow", sid], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _stderr_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    return proc.stderr.readline().rstrip("\n")


def test_follow_exits_128_plus_the_signal_and_says_in_one_line_that_the_host_went_away(host: HostProcess) -> None:
    """``follow`` ended with exit 0 on Ctrl-C, where ``agent`` (and ``serve`` stopped during boot) exit 128 + the
    signal, the shell's convention: 130 for SIGINT, 143 for SIGTERM (``pi-host follow --help`` says so). A host
    that stops under it is said in one line on stderr, and follow waits for the next one."""
    (sid,) = _seed(host)
    terminated = _follow(host.data_dir, sid)
    try:
        assert _stderr_line(terminated).startswith(f"pi-host: following {sid}")
        terminated.send_signal(signal.SIGTERM)
        out, err = terminated.communicate(timeout=30)
    finally:
        if terminated.poll() is None:
            terminated.kill()
            terminated.communicate()
    assert terminated.returncode == 143 and out == "" and "Traceback" not in err, (terminated.returncode, err)
    interrupted = _follow(host.data_dir, sid)
    try:
        assert _stderr_line(interrupted).startswith(f"pi-host: following {sid}")
        assert cli(host.data_dir, "stop").returncode == 0
        assert _stderr_line(interrupted).startswith("pi-host: waiting for a host: no host is running on ")
        time.sleep(1.5)  # several attempts: still the one line
        interrupted.send_signal(signal.SIGINT)
        out, err = interrupted.communicate(timeout=30)
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
            interrupted.communicate()
    assert interrupted.returncode == 130, (interrupted.returncode, err)
    assert out == "" and err == "", err  # nothing more after the waiting line, no traceback


def test_offline_reads_refuse_malformed_params_with_the_hosts_code_and_message(host: HostProcess) -> None:
    """``show ../x`` answered INVALID_ID offline where the host answers INVALID_PARAMS ("invalid params: 1
    error(s)" and the field's pattern); the offline bounds were worded differently too. Offline, each answer is
    now the host's, line for line; a native pi id (which an offline read cannot see) is SESSION_NOT_FOUND, as on
    a host without a native root."""
    (sid,) = _seed(host)
    refused = (["show", "../x"], ["show", "../x", "--limit", "0", "--before", "-1"], ["show", sid, "--limit", "5001"],
               ["sessions", "--limit", "0"], ["sessions", "--limit", "501"])
    online = {}
    for args in refused:
        done = cli(host.data_dir, *args)
        assert done.returncode == 1 and done.stderr.startswith("pi-host: INVALID_PARAMS: invalid params: "), done
        online[tuple(args)] = done.stderr
    native = cli(host.data_dir, "show", "native-pi:abc")
    assert native.returncode == 1 and native.stderr.startswith("pi-host: SESSION_NOT_FOUND: native session "), native
    host.terminate()
    for args in refused:
        done = cli(host.data_dir, *args)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", online[tuple(args)]), args
    offline_native = cli(host.data_dir, "show", "native-pi:abc")
    assert offline_native.returncode == 1
    assert offline_native.stderr.startswith("pi-host: SESSION_NOT_FOUND: native session native-pi:abc not found")
    assert offline_native.stderr.splitlines()[1:] == native.stderr.splitlines()[1:] == ['  sessionId: "native-pi:abc"']


def _pages(data: Path, *first: str) -> tuple[list[list[str]], list[str | None]]:
    """Every page of ``sessions --limit 2 --json``, from ``first`` (extra arguments) on."""
    pages: list[list[str]] = []
    cursors: list[str | None] = []
    extra = list(first)
    while True:
        done = cli(data, "sessions", "--limit", "2", "--json", *extra)
        assert done.returncode == 0, done.stderr
        page = json.loads(done.stdout)
        pages.append([s["id"] for s in page["sessions"]])
        cursors.append(page["nextCursor"])
        if page["nextCursor"] is None:
            return pages, cursors
        extra = ["--cursor", page["nextCursor"]]
        assert len(pages) < 10


def test_sessions_pages_with_cursor_online_and_offline_alike(host: HostProcess) -> None:
    """Offline ``sessions`` listed the newest ``--limit`` (at most 500) with ``nextCursor: null``, and neither mode
    took a cursor: no way to see more. ``--cursor`` pages as ``session.list`` does, with the host's cursors, so a
    page read online continues offline; a human listing names the next page on stderr."""
    ids = _seed(host, 5)
    online, online_cursors = _pages(host.data_dir)
    assert [len(p) for p in online] == [2, 2, 1] and sorted(sum(online, [])) == sorted(ids)
    text = cli(host.data_dir, "sessions", "--limit", "2")
    assert text.returncode == 0 and len(text.stdout.splitlines()) == 2
    # the next page's command as given (the data directory and --limit too: without them it listed the default
    # data directory's sessions, 200 a page)
    more = f"pi-host: more sessions: pi-host --data-dir {host.data_dir} sessions --limit 2 --cursor {online_cursors[0]}"
    assert text.stderr.strip() == more
    bad_online = [cli(host.data_dir, "sessions", "--cursor", c).stderr for c in ("", "zzz", "a" * 513)]
    assert [e.split(":")[1].strip() for e in bad_online] == ["INVALID_PARAMS", "INVALID_CURSOR", "INVALID_PARAMS"]
    host.terminate()
    offline, offline_cursors = _pages(host.data_dir)
    assert offline == online
    assert _pages(host.data_dir, "--cursor", str(online_cursors[0]))[0] == online[1:]  # an online cursor, offline
    assert offline_cursors == online_cursors
    text = cli(host.data_dir, "sessions", "--limit", "2")
    assert text.stderr.splitlines()[-1] == more
    bad_offline = [cli(host.data_dir, "sessions", "--cursor", c) for c in ("", "zzz", "a" * 513)]
    assert [(d.returncode, d.stderr) for d in bad_offline] == [(1, e) for e in bad_online]


def _complete(words: list[str]) -> list[str]:
    script = cli(None, "completion", "bash").stdout
    line = " ".join(f'"{w}"' for w in words)
    code = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _pi_host; printf "%s\\n" "${{COMPREPLY[@]}}"'
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_completion_offers_the_verbs_of_settings_then_each_verbs_options(tmp_path: Path) -> None:
    """README: completion completes "commands, options and session ids"; ``settings`` offered only its own
    options, never ``get`` / ``set`` / ``delete``, nor ``--ns`` after one of them. Listed choices complete too:
    ``completion bash|zsh`` and ``export --format md|html|jsonl``."""
    assert {"get", "set", "delete"} <= set(_complete(["pi-host", "settings", ""]))
    assert _complete(["pi-host", "settings", "g"]) == ["get"]
    assert _complete(["pi-host", "--data-dir", str(tmp_path), "settings", "de"]) == ["delete"]
    after_get = set(_complete(["pi-host", "settings", "get", "--"]))
    assert {"--ns", "--json"} <= after_get and "get" not in after_get
    assert "--ns" in _complete(["pi-host", "settings", "--data-dir", str(tmp_path), "set", "--n"])
    assert _complete(["pi-host", "settings", "set", "--ns", "app", "--j"]) == []  # set takes no --json
    assert set(_complete(["pi-host", "completion", ""])) >= {"bash", "zsh"}
    assert _complete(["pi-host", "export", "s1", "--format", ""]) == ["md", "html", "jsonl"]
