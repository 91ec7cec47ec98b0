"""The CLI as a newcomer and a script meet it: what each command prints when there is nothing to print, a setting
that is not set, and bad input (an out-of-range port, a negative timeout, Ctrl-C
while the host hangs, a reader that goes away) as one line and a documented exit code, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.test_cli_outsider import HUNG_DRIVER, _env, cli, one_line
from tests.hostkit import REPO, HostProcess
from tests.importers import gen


def test_empty_lists_say_so_to_a_person_and_stay_valid_json(host: HostProcess) -> None:
    """``sessions``, ``search``, ``providers`` and ``models`` printed nothing at all for an empty list: a person
    could not tell "nothing there" from a command that did nothing. The line goes to stderr: stdout stays empty,
    so ``pi-host search X | wc -l`` still counts matches."""
    for args, line in ((["sessions"], "no sessions"), (["search", "heron"], "no sessions match 'heron'"),
                       (["providers"], "no providers"), (["models"], "no models"),
                       (["models", "--provider", "nosuch"], "no models of provider nosuch")):
        done = cli(host.data_dir, *args)
        assert done.returncode == 0, (args, done.stderr)
        assert (done.stdout, done.stderr) == ("", line + "\n"), (args, done.stdout, done.stderr)
    for args, key in ((["sessions", "--json"], "sessions"), (["search", "heron", "--json"], "results"),
                      (["providers", "--json"], "providers"), (["models", "--json"], "models")):
        done = cli(host.data_dir, *args)
        assert done.returncode == 0 and json.loads(done.stdout)[key] == [], (args, done.stdout)
    assert cli(host.data_dir, "sessions", "--ids").stdout == ""  # shell completion: no words, no sentence


def test_a_setting_that_is_not_set_is_exit_1_and_one_line_naming_it(host: HostProcess) -> None:
    """``settings get KEY`` of a key that is not set printed ``null`` and exited 0, as for a key set to null."""
    for args in (["largePasteThreshold"], ["largePasteThreshold", "--json"]):  # the seed's default: read as set
        done = cli(host.data_dir, "settings", "get", *args)
        assert (done.returncode, done.stdout) == (0, "600\n"), done.stderr
    budget = cli(host.data_dir, "settings", "get", "attachmentBudgetBytes")  # README: "read when missing" 200 MB
    assert (budget.returncode, budget.stdout) == (0, f"{200 * 1024 * 1024}\n"), budget.stderr
    known = cli(host.data_dir, "settings", "get", "defaultMode")
    assert (known.returncode, known.stdout) == (1, "")
    assert one_line(known.stderr) == "pi-host: NOT_SET: app setting defaultMode is not set (it has no default)"
    typo = cli(host.data_dir, "settings", "get", "largePasteTreshold")
    assert (typo.returncode, typo.stdout) == (1, "")
    assert one_line(typo.stderr) == ("pi-host: NOT_SET: app setting largePasteTreshold is not set and is not one "
                                     "pi-host knows (did you mean largePasteThreshold?)")
    other = cli(host.data_dir, "settings", "get", "panel", "--ns", "ui")
    assert (other.returncode, other.stdout) == (1, "")
    assert one_line(other.stderr) == "pi-host: NOT_SET: ui setting panel is not set"
    assert cli(host.data_dir, "settings", "set", "panel", "null", "--ns", "ui").returncode == 0
    stored = cli(host.data_dir, "settings", "get", "panel", "--ns", "ui")  # a stored null is a value
    assert (stored.returncode, stored.stdout, stored.stderr) == (0, "null\n", "")


def test_out_of_range_numbers_are_usage_errors_not_a_wrapped_port_or_a_traceback(tmp_path: Path) -> None:
    """``serve --port 70000`` listened on port 4464 (70000 - 65536), ``--port -1`` ended in a traceback, and
    ``stop --timeout -1`` sent SIGTERM, then said the host "did not stop within -1 s"; ``types --out ""`` (an
    unset "$DIR") wrote protocol.ts and schema.json into the current folder, over any there."""
    data = tmp_path / "data"
    for args, word in ((["serve", "--port", "70000"], "--port"), (["serve", "--port", "-1"], "--port"),
                       (["serve", "--port", "0", "--idle-timeout", "nan"], "--idle-timeout"),
                       (["serve", "--port", "0", "--idle-timeout", "0"], "--idle-timeout"),
                       (["serve", "--port", "0", "--integrity-sweep", "inf"], "--integrity-sweep"),
                       (["serve", "--port", "0", "--disk-warn-below", "-1"], "--disk-warn-below"),
                       (["stop", "--timeout", "-1"], "--timeout"), (["stop", "--timeout", "nan"], "--timeout"),
                       (["types", "--out", ""], "--out"), (["export", "abc", "--out", ""], "--out")):
        done = cli(data, *args, timeout=30)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (args, done.stderr[-1500:])
        assert done.stderr.splitlines()[-1].startswith(f"pi-host {args[0]}: error: argument {word}"), done.stderr
    assert not data.exists()


DRIVER = HUNG_DRIVER.replace("1.0", "30.0").replace("sys.exit(",
                                                    "print('main', file=sys.stderr, flush=True)\nsys.exit(")


def test_ctrl_c_while_the_host_hangs_is_exit_130_without_a_traceback(host: HostProcess) -> None:
    """Ctrl-C while a command waited for a hung host printed a 50-line KeyboardInterrupt traceback and exited 1."""
    os.kill(host.proc.pid, signal.SIGSTOP)
    try:
        for args in (["status"], ["settings", "get"]):
            proc = subprocess.Popen([sys.executable, "-c", DRIVER, "--data-dir", str(host.data_dir), *args],
                                    cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            assert proc.stderr is not None and proc.stderr.readline() == "main\n"
            time.sleep(1.5)  # connected, waiting for the handshake's answer
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 130 and "Traceback" not in err, (args, proc.returncode, err[-2000:])
            assert out == "" and err == "", (args, err)
    finally:
        os.kill(host.proc.pid, signal.SIGCONT)


def test_a_reader_that_goes_away_from_settings_ends_quietly(host: HostProcess) -> None:
    """``pi-host settings get | head -1``: "the host did not answer ([Errno 32] Broken pipe)", exit 2, as if the
    host had gone away (the broken pipe was the reader's)."""
    for args in (["settings", "get"], ["providers", "--json"]):
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "--data-dir", str(host.data_dir), *args],
                                cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True, env=_env())
        os.close(write)
        os.close(read)
        _, err = proc.communicate(timeout=60)
        assert (proc.returncode, err) == (141, ""), (args, err)


def test_offline_search_refuses_bad_params_in_the_words_the_host_uses(host: HostProcess) -> None:
    """With no host, ``search ""``, ``search Q --limit 0`` and a 501-character query said "query must not be
    empty" / "limit must be an integer in 1..100" / "query is 501 characters; ...", where a running host answers
    "invalid params: 1 error(s)" and one ``loc: msg (type)`` line: a script saw two shapes of one refusal."""
    bad = (["search", ""], ["search", "hello", "--limit", "0"], ["search", "hello", "--limit", "101"],
           ["search", "q" * 501])
    online = [cli(host.data_dir, *args) for args in bad]
    assert host.terminate() == 0
    for args, answered in zip(bad, online, strict=True):
        offline = cli(host.data_dir, *args)
        assert answered.returncode == offline.returncode == 1, (args, answered.stderr, offline.stderr)
        assert offline.stderr == answered.stderr, (args[-1][:20], offline.stderr, answered.stderr)


def test_a_data_directory_path_that_is_not_utf8_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    """``serve --data-dir $'\\xff'``: SQLite cannot open a path that is not UTF-8; boot took that for a corrupt
    index ("booting again on an index rebuilt from the transcripts") and then ended in a traceback
    (sqlite3.OperationalError: Could not decode to UTF-8 column 'file')."""
    data = os.fsencode(tmp_path) + b"/\xffdata"
    for args in ([b"serve", b"--port", b"0"], [b"sessions"], [b"status"]):
        done = subprocess.run([os.fsencode(sys.executable), b"-m", b"runtime.cli", b"--data-dir", data, *args],
                              cwd=REPO, capture_output=True, timeout=60, env=_env())
        err = done.stderr.decode("utf-8", "backslashreplace")
        assert done.returncode == 2 and "Traceback" not in err, (args, done.returncode, err[-1500:])
        assert one_line(err) == (f"pi-host: the data directory {tmp_path}/\\xffdata is not a UTF-8 path, which "
                                 "SQLite cannot open: rename it, or pick another with --data-dir"), (args, err)
        assert not os.path.exists(data)


def test_a_setting_nested_too_deep_for_the_parser_is_the_hosts_parse_error(host: HostProcess) -> None:
    """``settings set K '[[[...]]]'`` nested past Python's recursion limit ended in a RecursionError traceback
    before anything was sent; 100 levels get the host's PARSE_ERROR, so 3000 say the same."""
    for depth in (100, 3000):
        done = cli(host.data_dir, "settings", "set", "--ns", "ui", "k", "[" * depth + "]" * depth)
        assert done.returncode == 1 and "Traceback" not in done.stderr, (depth, done.stderr[-1500:])
        assert one_line(done.stderr).startswith("pi-host: PARSE_ERROR: invalid JSON: nesting deeper than 64"), depth
    assert cli(host.data_dir, "settings", "get", "--ns", "ui", "k").returncode == 1  # nothing was stored


def test_an_empty_import_path_is_refused_not_read_as_the_current_folder(host: HostProcess, tmp_path: Path) -> None:
    """``pi-host import pi "$DIR"`` with DIR unset imported whatever the current folder held (``Path("")`` is
    ``.``): every pi session file under the working directory, and a "refused" line for every other .jsonl."""
    folder = tmp_path / "cwd"
    (folder / "--w--").mkdir(parents=True)
    (folder / "--w--" / "s.jsonl").write_bytes(b"".join(gen.pi_lines([gen.User("from the cwd")])))
    env = _env()
    done = subprocess.run([sys.executable, "-m", "runtime.cli", "--data-dir", str(host.data_dir), "import", "pi", ""],
                          cwd=folder, capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert one_line(done.stderr) == "pi-host: import pi: PATH is empty (leave it out for pi's usual folder)"
    assert json.loads(cli(host.data_dir, "sessions", "--json").stdout)["sessions"] == []
