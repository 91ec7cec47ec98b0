"""Params and results: sessions.trash / sessions.restore / sessions.purge / sessions.listTrashed."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .models_common import MutatingParams, Params, Result, SessionId
from .models_records import SessionSummary


class TrashParams(MutatingParams):
    session_id: SessionId


class TrashResult(Result):
    session: SessionSummary = Field(description="deletedAt is set while it is in the trash.")


class PurgeResult(Result):
    session_id: SessionId
    purged: Literal[True] = True


class ListTrashedParams(Params):
    limit: int = Field(default=200, ge=1, le=1000)


class ListTrashedResult(Result):
    sessions: list[SessionSummary] = Field(description="Most recently trashed first.")


__all__ = ["ListTrashedParams", "ListTrashedResult", "PurgeResult", "TrashParams", "TrashResult"]
