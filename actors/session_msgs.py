"""Requests a session actor understands (the gateway's dispatcher builds them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ReceiptKey:
    """Command receipt identity + request fingerprint (seed 000 §2.4)."""

    client_id: str
    submission_id: str
    method: str
    fingerprint: str


@dataclass(frozen=True)
class CreateSession:
    title: str = ""
    project_path: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    receipt: ReceiptKey | None = None


@dataclass(frozen=True)
class AppendMessage:
    message: Mapping[str, Any]
    turn_id: str | None = None
    receipt: ReceiptKey | None = None
    more: bool = False  # more appends of the same JSON-RPC batch follow (group commit hint)


@dataclass(frozen=True)
class GetWindow:
    before: int | None = None
    start: int | None = None
    limit: int | None = None
    content_limit: int | None = None
    around: str | None = None


@dataclass(frozen=True)
class RenameSession:
    title: str
    receipt: ReceiptKey | None = None


@dataclass(frozen=True)
class UpdateSession:
    settings: Mapping[str, Any]
    receipt: ReceiptKey | None = None


@dataclass(frozen=True)
class DeleteSession:
    receipt: ReceiptKey | None = None


@dataclass(frozen=True)
class Custom:
    """A feature request handled by a registered feature handler (turns, revisions, ...)."""

    kind: str
    params: Mapping[str, Any]
    receipt: ReceiptKey | None = None
