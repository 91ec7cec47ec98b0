"""``runtime.cli`` builds only the subcommand a line names (``_parser(_command_named(argv))``): each command
costs about a millisecond of every start (its arguments' help formatters, gettext's lookups), and every host
a test or the app starts parses its line. A line must read, print and fail exactly as the whole parser reads,
prints and fails it."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Any

import pytest

from runtime import cli

LINES = [
    [], ["--help"], ["-h"], ["--version"], ["bogus"], ["--", "serve"], ["-x", "status"], ["--data-dir"],
    ["--d", "x", "serve", "-h"], ["--data", "/x", "status", "--help"], ["--data-d", "/y", "sessions"],
    ["--data-dir", "serve", "--help"], ["--data-dir", "serve", "status"], ["--data-dir=/y", "sessions", "-h"],
    ["--dev", "--data-dir", "/z", "doctor", "-h"], ["doctor", "--data-dir"], ["serve", "--bogus"],
    ["serve", "--port", "70000"], ["serve", "--port", "0", "--quiet", "--data-dir", "/d"], ["status", "extra"],
    ["sessions", "--limit", "x"], ["sessions", "--ids", "--json"], ["show"], ["show", "serve", "--limit", "3"],
    ["search", "serve"], ["follow", "s1", "--json"], ["stop", "--timeout", "5"], ["open", "--print"],
    ["agent", "--help"], ["chat", "--dev"], ["completion", "bash"], ["types", "--out", "/t"],
    ["import", "nosuch"], ["import", "pi", "--dry-run", "/p"], ["export", "s", "--format", "html"],
    ["settings"], ["settings", "get", "k", "--ns", "ui"], ["settings", "nosuch"], ["settings", "set", "k", "v"],
    ["providers", "--json"], ["models", "--provider", "p"], ["doctor", "--repair", "--json"],
]


def _read(parser_of: Any, argv: list[str]) -> tuple[Any, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args, extra = parser_of(argv).parse_known_args(argv)
            read: Any = (sorted((k, repr(v)) for k, v in vars(args).items()), extra)
        except SystemExit as exit_:
            read = ("exit", exit_.code)
    return read, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", LINES, ids=[" ".join(line) or "(none)" for line in LINES])
def test_a_line_reads_as_the_whole_parser_reads_it(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    whole = _read(lambda _: cli._parser(), argv)
    assert _read(lambda line: cli._parser(cli._command_named(line)), argv) == whole


def test_the_command_named_is_the_root_parsers_first_word() -> None:
    assert cli._command_named(["--data-dir", "serve", "status"]) == "status"
    assert cli._command_named(["--dev", "show", "serve"]) == "show"
    assert cli._command_named(["--data-dir=/d", "serve"]) == "serve"
    # what the root parser answers itself, or reads otherwise: the whole parser
    for line in (["--data", "serve", "status"], ["--", "serve"], ["nosuch"], [], ["completion", "bash"]):
        assert cli._command_named(line) is None, line


def test_building_one_command_is_a_fraction_of_building_them_all() -> None:
    """Counted in parsers made, not timed: one command's parser makes its own parser (and its verbs'), the
    root, and the two shared parents."""
    made: list[str] = []
    real = argparse.ArgumentParser.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(str(kwargs.get("prog")))
        real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "__init__", counting)
        cli._parser("serve")
        one = len(made)
        made.clear()
        cli._parser()
        every = len(made)
    assert one == 4 and every == 3 + len(cli._COMMANDS) + 3  # settings' three verbs
