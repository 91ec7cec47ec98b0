"""Params and results: ``logs.append``, the app's and the agent sidecar's NDJSON logs (seed 003 §2).

The limits sit beside the model: a call carries at most
:data:`MAX_LOG_RECORDS` records, each at most :data:`MAX_LOG_RECORD_BYTES`
as compact JSON and together at most :data:`MAX_LOG_APPEND_BYTES`. The
category is checked against :data:`LOG_CATEGORY_PATTERN` here and again by
the host before any path is built.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints

from .models_common import JsonObject, Params, Result

MAX_LOG_RECORDS: Final = 100
MAX_LOG_RECORD_BYTES: Final = 16 * 1024
MAX_LOG_APPEND_BYTES: Final = 256 * 1024
LOG_CATEGORY_PATTERN: Final = r"^[a-z0-9][a-z0-9_-]{0,63}$"

LogSource = Literal["app", "agent"]
LogCategory = Annotated[str, StringConstraints(pattern=LOG_CATEGORY_PATTERN)]


class LogsAppendParams(Params):
    """Append records to ``logs/<source>/<category>.ndjson`` (rotated by the host)."""

    source: LogSource = Field(description="app: the desktop app (clientKind ui); agent: the sidecar "
                                          "(clientKind agent). host/ is the host's own.")
    category: LogCategory = Field(description="Lower-case letters, digits, - and _, 1-64 characters, "
                                              "starting with a letter or digit: one file per category.")
    records: list[JsonObject] = Field(min_length=1, max_length=MAX_LOG_RECORDS,
                                      description=f"JSON objects, each at most {MAX_LOG_RECORD_BYTES} bytes "
                                                  f"and together at most {MAX_LOG_APPEND_BYTES} bytes.")


class LogsAppendResult(Result):
    written: int = Field(ge=0, description="Records written (all of them: a call is refused whole).")
    bytes: int = Field(ge=0, description="NDJSON bytes appended.")
    file: str = Field(description="The file, relative to the data directory (logs/<source>/<category>.ndjson).")


__all__ = [
    "LOG_CATEGORY_PATTERN",
    "MAX_LOG_APPEND_BYTES",
    "MAX_LOG_RECORDS",
    "MAX_LOG_RECORD_BYTES",
    "LogCategory",
    "LogSource",
    "LogsAppendParams",
    "LogsAppendResult",
]
