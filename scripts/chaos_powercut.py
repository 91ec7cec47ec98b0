"""Real-kernel power cuts (RELIABILITY.md tier C): a loop-mounted ext4 image + ``EXT4_IOC_SHUTDOWN``.

::

    with LoopMount(workdir / "disk.img", workdir / "mnt") as disk:
        ...  # run a host with its data directory under disk.mountpoint
        host.kill9()
        disk.cut()        # ioctl(EXT4_IOC_SHUTDOWN, NOLOGFLUSH): unsynced data is gone
        disk.remount()    # umount + mount: what survived is what the disk kept

Needs root, ``mkfs.ext4``, ``mount``/``umount`` and a loop device.
:func:`unavailable_reason` says why not, so tests can skip with the reason.
Blocking; call from a worker thread inside trio.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import time
from pathlib import Path
from types import TracebackType

EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # drop everything not yet in the journal


class PowerCutUnavailable(RuntimeError):
    """Loop mounts are not permitted here (the message says why)."""


def unavailable_reason() -> str | None:
    """None when a loop-mounted ext4 image can be used, else why not (without trying a mount)."""
    if os.geteuid() != 0:
        return "power cuts need root (mount -o loop and EXT4_IOC_SHUTDOWN)"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/loop-control") and not os.path.exists("/dev/loop0"):
        return "no loop device (/dev/loop-control missing)"
    return None


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PowerCutUnavailable(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


class LoopMount:
    def __init__(self, image: Path, mountpoint: Path, *, size_mb: int = 64) -> None:
        self.image = Path(image)
        self.mountpoint = Path(mountpoint)
        self.size_mb = size_mb
        self.mounted = False
        self.cuts = 0

    def create(self) -> None:
        reason = unavailable_reason()
        if reason:
            raise PowerCutUnavailable(reason)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as fh:
            fh.truncate(self.size_mb * 1024 * 1024)
        _run("mkfs.ext4", "-F", "-q", str(self.image))
        self.mount()

    def mount(self) -> None:
        _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        self.mounted = True

    def umount(self) -> None:
        last = ""
        for _ in range(50):  # a just-killed process may still hold the mount for a moment
            proc = subprocess.run(["umount", str(self.mountpoint)], capture_output=True, text=True)
            if proc.returncode == 0:
                self.mounted = False
                return
            last = proc.stderr.strip()
            time.sleep(0.1)
        raise RuntimeError(f"umount {self.mountpoint} failed: {last}")

    def cut(self) -> None:
        """Shut the filesystem down without flushing the journal: a power cut for this disk."""
        fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", EXT4_GOING_FLAGS_NOLOGFLUSH))
        finally:
            os.close(fd)
        self.cuts += 1

    def remount(self) -> None:
        self.umount()
        self.mount()

    def destroy(self) -> None:
        if self.mounted:
            self.umount()
        self.image.unlink(missing_ok=True)

    def __enter__(self) -> LoopMount:
        self.create()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.destroy()


def probe(workdir: Path) -> str | None:
    """Try a real 8 MB mount + cut once: None if power cuts work here, else the reason."""
    reason = unavailable_reason()
    if reason:
        return reason
    disk = LoopMount(workdir / "probe.img", workdir / "probe-mnt", size_mb=8)
    try:
        disk.create()
        disk.cut()
        disk.remount()
    except (PowerCutUnavailable, OSError, RuntimeError) as exc:
        return f"loop mount / EXT4_IOC_SHUTDOWN not permitted: {exc}"
    finally:
        try:
            disk.destroy()
        except (RuntimeError, OSError):
            pass
    return None


__all__ = ["EXT4_GOING_FLAGS_NOLOGFLUSH", "EXT4_IOC_SHUTDOWN", "LoopMount", "PowerCutUnavailable", "probe",
           "unavailable_reason"]
