"""`--data-dir` works before or after the command (the README's `./scripts/serve --data-dir D`)."""

from __future__ import annotations

from runtime.cli import _parser


def test_data_dir_before_or_after_the_command() -> None:
    before = _parser().parse_args(["--data-dir", "/tmp/a", "serve", "--port", "0"])
    after = _parser().parse_args(["serve", "--data-dir", "/tmp/a", "--port", "0"])
    assert before.data_dir == after.data_dir == "/tmp/a"
    assert before.port == after.port == 0
    plain = _parser().parse_args(["status"])
    assert plain.data_dir is None and plain.command == "status"
    show = _parser().parse_args(["show", "s1", "--data-dir", "/tmp/b", "--limit", "3"])
    assert (show.data_dir, show.session, show.limit) == ("/tmp/b", "s1", 3)
