"""README ("A corrupt pi.sqlite is quarantined and rebuilt ... more than 3 such restarts in 10 minutes exit with
status 4"): the fourth restart on a rebuilt index within the window stops the process with status 4 and one line
that says the index kept being found corrupt (the disk fails), not that actors kept crashing."""

from __future__ import annotations

import argparse

import pytest

from runtime import cli_serve
from runtime.cli_serve import IndexKeepsFailing, _Restarts, _serve_failure


def test_more_than_three_rebuilds_in_the_window_stop_the_process_with_status_4(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cli_serve.time, "monotonic", lambda: clock[0])
    restarts = _Restarts()
    for _ in range(3):
        restarts.count("search met a malformed page")
        clock[0] += 100
    with pytest.raises(IndexKeepsFailing) as caught:
        restarts.count("the integrity sweep found the index damaged")
    assert _serve_failure(ExceptionGroup("host", [caught.value]), argparse.Namespace()) == 4
    line = capsys.readouterr().err.strip()
    assert line.startswith("pi-host: the index was found corrupt more than 3 times within 600 s"), line
    assert "the integrity sweep found the index damaged" in line and "actors kept crashing" not in line


def test_rebuilds_spread_wider_than_the_window_never_stop_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(cli_serve.time, "monotonic", lambda: clock[0])
    restarts = _Restarts()
    for _ in range(12):
        restarts.count("damage")
        clock[0] += 201  # never four within 600 s
