"""The README's Python tour runs as written, twice, from outside the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.hostkit import REPO, start_host_process


def test_the_readme_tour_runs_twice(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    code = re.search(r"Save this as `/tmp/pi-tour/tour.py`:\n\n```python\n(.*?)```", readme, re.S)
    assert code is not None
    data = tmp_path / "pi-tour"
    script = tmp_path / "tour.py"
    script.write_text(code.group(1).replace("/tmp/pi-tour", str(data)), encoding="utf-8")
    host = start_host_process(data)
    try:
        for _ in range(2):
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.splitlines() == ["1 True [2, 3]", "True True"]
    finally:
        host.terminate()
        host.proc.communicate()


def test_the_readme_starts_with_the_two_commands_then_what_it_is_then_the_tour() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [line for line in readme.splitlines() if line.strip()]
    assert lines[0] == "# pi-host"
    assert [line.split("#")[0].strip() for line in lines[1:5]] == ["```", "./scripts/serve", "./scripts/test", "```"]
    assert lines[5].startswith("pi-host is ")  # what it is, right after the commands
    sections = [line for line in lines if line.startswith("## ")]
    assert sections[0] == "## A 5-minute tour"
    tour = readme.split("## A 5-minute tour", 1)[1].split("\n## ", 1)[0]
    for command in ("pi-host serve", "doctor", " chat", " agent", " open", " stop", " follow", " search", " show"):
        assert command in tour, command
    # the tour runs from a folder outside the repository: no repository-relative program paths in its
    # commands (the first block, run in the repository, puts .venv/bin on PATH and leaves for /tmp/pi-tour)
    blocks = re.findall(r"```[a-z]*\n(.*?)```", tour, re.S)
    assert blocks[0].splitlines()[:2] == [
        'export PATH="$PWD/.venv/bin:$PATH"     # pi-host, and a python that has pihost_client',
        "mkdir -p /tmp/pi-tour /tmp/pi-tour-project && cd /tmp/pi-tour"]
    for block in blocks[1:]:
        assert ".venv/bin/" not in block and "./scripts/" not in block, block


def test_the_tour_keeps_the_project_out_of_the_data_directory() -> None:
    """Issue 25: the tour ran ``chat --project /tmp/pi-tour``, its data directory, so the agent's file tools
    could list and read ``host.token``; every project path in the tour is now outside every data directory."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    tour = readme.split("## A 5-minute tour", 1)[1].split("\n## ", 1)[0]
    data_dirs = {Path(d) for d in re.findall(r'(?:--data-dir |data_dir=")(/[^\s"`]+)', tour)}
    projects = {Path(p) for p in re.findall(r'(?:--project |project_path=")(/[^\s"`]+)', tour)}
    assert data_dirs == {Path("/tmp/pi-tour")} and projects == {Path("/tmp/pi-tour-project")}
    for project in projects:
        for data in data_dirs:
            assert project != data and data not in project.parents and project not in data.parents
