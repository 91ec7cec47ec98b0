"""Finding a running host: ``<dataDir>/host.json`` and its token file.

The token file holds 64 hexadecimal characters and a trailing newline; the
newline is not part of the token.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import HostNotRunning

__all__ = ["HostInfo", "HostNotRunning", "default_data_dir", "pid_alive", "read_host_info"]


@dataclass(frozen=True, slots=True)
class HostInfo:
    url: str
    token: str
    pid: int

    def __repr__(self) -> str:  # never print the token
        return f"HostInfo(url={self.url!r}, pid={self.pid})"


def default_data_dir() -> Path:
    """``$PI_DESKTOP_DATA_DIR``, else ``~/.pi-desktop``."""
    return Path(os.environ.get("PI_DESKTOP_DATA_DIR") or Path.home() / ".pi-desktop")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def read_host_info(data_dir: str | os.PathLike[str] | None = None) -> HostInfo:
    """Read ``host.json`` and the token it names (blocking file I/O; cheap)."""
    root = Path(data_dir) if data_dir is not None else default_data_dir()
    path = root / "host.json"
    if not root.is_dir():
        raise HostNotRunning(f"no host has used {root}: the data directory does not exist", no_data_dir=True)
    try:
        info = json.loads(path.read_text("utf-8"))
        url, pid = info["url"], info["pid"]
        token_file = Path(info["tokenFile"])
    except FileNotFoundError:
        raise HostNotRunning(f"no host is running on {root} (no host.json)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HostNotRunning(f"cannot read {path}: {exc}") from None
    if not isinstance(url, str) or not isinstance(pid, int):
        raise HostNotRunning(f"{path} is malformed")
    if not pid_alive(pid):
        raise HostNotRunning(f"{path} was left by pid {pid}, which is not running (the host was killed)",
                             stale_pid=pid)
    if not token_file.is_absolute():
        token_file = root / token_file
    try:
        token = token_file.read_text("utf-8").strip()
    except OSError as exc:
        raise HostNotRunning(f"cannot read the token file {token_file}: {exc}") from None
    return HostInfo(url=url, token=token, pid=pid)
