"""The transcript block vocabulary (seed 003 §4.7): an open set.

A block is any JSON object with a string ``type``. Five types are known and
checked lightly (required keys present with the right JSON type, enum values
where the seed fixes them); every other key and every unknown type passes
through unchanged, so a newer client's blocks survive a round trip
byte-for-byte.

The check is a small hand-written table on purpose: ``session.appendMessage``
runs it for every block of every message (tens of thousands per second), so it
must not build model objects. The pydantic models below exist for the JSON
Schema export and the reference; ``tests/protocol`` asserts that the table and
the models agree on required keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from store.rules import MAX_PATH_CHARS, is_absolute_path

from .models_common import MAX_BLOCKS_PER_MESSAGE

# ---------------------------------------------------------------------------
# Light checks (hot path)

_Check = Callable[[Any], bool]


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_list(value: Any) -> bool:
    return isinstance(value, list)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _one_of(*allowed: str) -> _Check:
    def check(value: Any) -> bool:
        return value in allowed

    return check


_SEARCH_STATUS = ("searching", "completed", "failed")
_BLOB_REF = re.compile(r"^attachments/[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def is_attachment_ref(value: Any) -> bool:
    """An attachment block's ``ref`` (seed 003 §4.7: ``attachments/<sha256> or absolute path``): a name in
    the attachment store (``attachments.put`` answers the lowercase hex SHA-256; any one plain file name is
    taken, so a blob named some other way, or not stored yet, stays referable), or an absolute path
    (``/...``, ``C:/...``) with no ``..`` component and no NUL. A relative path, or a name with a ``/``,
    names nothing the host or the sidecar can resolve safely (``../../etc/passwd``)."""
    if not isinstance(value, str) or not value or len(value) > MAX_PATH_CHARS or "\x00" in value:
        return False
    if value.startswith("attachments/"):
        return bool(_BLOB_REF.fullmatch(value))
    return is_absolute_path(value) and ".." not in value.replace("\\", "/").split("/")


# type -> ((key, required, check, what-it-must-be), ...)
_BLOCK_RULES: Mapping[str, tuple[tuple[str, bool, _Check, str], ...]] = MappingProxyType(
    {
        "text": (("text", True, _is_str, "a string"),),
        "thinking": (("text", True, _is_str, "a string"),),
        "tool_call": (
            ("callId", True, _is_str, "a string"),
            # Optional here: the seed's own tool line names the tool once, in the message's
            # toolName; TranscriptMessage requires one of the two.
            ("name", False, _is_str, "a string"),
            # The seed's type says ok|error|denied but its own example writes
            # "success": accept any string, do not rewrite history.
            ("status", False, _is_str, "a string"),
            ("completedAt", False, _is_str, "a string"),
            ("durationMs", False, _is_count, "a non-negative integer"),
        ),
        "attachment": (
            ("kind", True, _one_of("image", "file"), '"image" or "file"'),
            ("name", True, _is_str, "a string"),
            ("ref", True, is_attachment_ref, "attachments/<sha256> (as attachments.put answers) or an absolute "
             "path without '..'"),
            ("mimeType", False, _is_str, "a string"),
            ("size", False, _is_count, "a non-negative integer"),
        ),
        "hostedSearch": (
            ("status", True, _one_of(*_SEARCH_STATUS), '"searching", "completed" or "failed"'),
            ("rounds", True, _is_list, "an array"),
            ("replay", False, _is_list, "an array"),
        ),
    }
)

KNOWN_BLOCK_TYPES: tuple[str, ...] = tuple(_BLOCK_RULES)

INLINE_BYTES_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # seed 003 §4.7: the block holds metadata and a ref; bytes never enter the transcript
        "attachment": ("data", "dataBase64", "base64", "bytes"),
        # a pi-ai image block ({type: "image", data, mimeType}) is the transient base64 form
        "image": ("data",),
    }
)
"""Keys that would carry a file's bytes inside a block: such a block is refused, never stored."""

UPLOAD_HINT = (
    "store the bytes first with attachments.put (base64, up to 4 MiB) or attachments.importFile, "
    'then send an attachment block {"type": "attachment", "kind", "name", "ref": "attachments/<sha256>"}'
)


def required_keys(block_type: str) -> frozenset[str]:
    """Keys the light check requires for a known block type (empty if unknown)."""
    return frozenset(key for key, required, _, _ in _BLOCK_RULES.get(block_type, ()) if required)


def refuse_inline_bytes(block: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` when ``block`` carries a file's bytes inline (:data:`INLINE_BYTES_KEYS`)."""
    block_type = block.get("type")
    for key in INLINE_BYTES_KEYS.get(block_type, ()) if isinstance(block_type, str) else ():
        if key in block:
            raise ValueError(f'{block_type} block: inline "{key}" is refused: attachment bytes never enter '
                             f"the transcript; {UPLOAD_HINT}")


HOST_MARKS: Mapping[str, tuple[str, ...]] = MappingProxyType({"attachment": ("evicted",), "image": ("evicted",)})
"""Keys the host sets on a block when reading it (``evicted``: its blob's bytes are gone, from the host's
own state): a client's copy is dropped on the way in, so a live blob never reads back evicted."""


def check_block(block: dict[str, Any]) -> dict[str, Any]:
    """Validate one block lightly and return it unchanged (same object), or a copy without a host's
    mark (:data:`HOST_MARKS`) a client sent.

    Raises ``ValueError`` with a message naming the offending key.
    """
    block_type = block.get("type")
    if not isinstance(block_type, str) or not block_type:
        raise ValueError('a block must be an object with a non-empty string "type"')
    refuse_inline_bytes(block)
    marks = HOST_MARKS.get(block_type, ())
    if any(key in block for key in marks):
        block = {key: value for key, value in block.items() if key not in marks}
    rules = _BLOCK_RULES.get(block_type)
    if rules is None:
        return block
    for key, required, check, what in rules:
        if key in block:
            if not check(block[key]):
                raise ValueError(f'{block_type} block: "{key}" must be {what}')
        elif required:
            raise ValueError(f'{block_type} block: "{key}" is required')
    return block


_BLOCK_ITEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "properties": {"type": {"type": "string", "minLength": 1}},
    "additionalProperties": True,
}

Block = Annotated[
    dict[str, Any], AfterValidator(check_block), WithJsonSchema(_BLOCK_ITEM_SCHEMA)
]
Blocks = Annotated[
    list[Block],
    Field(
        max_length=MAX_BLOCKS_PER_MESSAGE,
        description="Content blocks (open set; see the block vocabulary).",
    ),
]

# ---------------------------------------------------------------------------
# Documentation models (JSON Schema export only)


class _BlockDoc(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", frozen=True, defer_build=True
    )


class TextBlock(_BlockDoc):
    """Visible text. Feeds the search index."""

    type: Literal["text"]
    text: str


class ThinkingBlock(_BlockDoc):
    """Assistant reasoning. Never indexed for search."""

    type: Literal["thinking"]
    text: str


class ToolTokenUsage(_BlockDoc):
    input_tokens: int | None = None
    output_tokens: int | None = None


class ToolCallBlock(_BlockDoc):
    """A tool call and (once finished) its post-truncation result."""

    type: Literal["tool_call"]
    call_id: str
    name: str | None = Field(default=None, description="The tool; when absent, the message's toolName names it.")
    args: Any = None
    status: str | None = Field(
        default=None, description='Usually "ok" | "error" | "denied"; any string is kept.'
    )
    result: Any = None
    completed_at: str | None = None
    duration_ms: int | None = Field(default=None, ge=0)
    tool_usage: ToolTokenUsage | None = None


class AttachmentBlock(_BlockDoc):
    """A user attachment: metadata and a ref, never the bytes."""

    type: Literal["attachment"]
    kind: Literal["image", "file"]
    name: str
    ref: str = Field(description="attachments/<sha256> or an absolute path (no '..' component).")
    mime_type: str | None = None
    size: int | None = Field(default=None, ge=0)
    evicted: bool | None = Field(
        default=None,
        description="Set by the host when reading: the blob was evicted (seed 000 §2.3), or its file is gone "
        "though no attachments.gc evicted it yet (deleted by hand or lost); never sent by clients "
        "(a client's copy is dropped on the way in).",
    )


class HostedSearchSource(_BlockDoc):
    url: str
    title: str | None = None


class HostedSearchRound(_BlockDoc):
    id: str
    status: Literal["searching", "completed", "failed"]
    kind: Literal["search", "openPage", "findInPage"] | None = None
    query: str | None = None
    url: str | None = None
    sources: list[HostedSearchSource] = Field(default_factory=list)


class HostedSearchBlock(_BlockDoc):
    """Provider-hosted web search progress and its replay state."""

    type: Literal["hostedSearch"]
    status: Literal["searching", "completed", "failed"]
    rounds: list[HostedSearchRound]
    replay: list[dict[str, Any]] | None = None


BLOCK_MODELS: Mapping[str, type[BaseModel]] = MappingProxyType(
    {
        "text": TextBlock,
        "thinking": ThinkingBlock,
        "tool_call": ToolCallBlock,
        "attachment": AttachmentBlock,
        "hostedSearch": HostedSearchBlock,
    }
)


def block_json_schema() -> dict[str, Any]:
    """JSON Schema of a block: any object with a string ``type``."""
    return {
        "title": "Block",
        "description": (
            "A content block: any JSON object with a non-empty string 'type'. "
            "Known types (see blocks.known) are checked lightly; unknown types "
            "and extra keys are kept unchanged."
        ),
        **_BLOCK_ITEM_SCHEMA,
    }
