"""Logging: NDJSON records to ``<dataDir>/logs/host.ndjson``, human lines to stderr."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import orjson

_STD_ATTRS = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime"}


class NdjsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(logs_dir: Path, *, stderr: bool = True, level: int = logging.INFO) -> list[logging.Handler]:
    root = logging.getLogger("pi_host")
    root.setLevel(level)
    root.propagate = False
    handlers: list[logging.Handler] = []
    logs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    file_handler = logging.FileHandler(logs_dir / "host.ndjson", encoding="utf-8")
    file_handler.setFormatter(NdjsonFormatter())
    handlers.append(file_handler)
    if stderr:
        human = logging.StreamHandler(sys.stderr)
        human.setFormatter(logging.Formatter("%(asctime)s pi-host %(levelname)s %(message)s", "%H:%M:%S"))
        handlers.append(human)
    for h in handlers:
        root.addHandler(h)
    logging.Formatter.converter = time.gmtime
    return handlers
