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
