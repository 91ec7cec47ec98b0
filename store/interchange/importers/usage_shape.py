"""One usage shape for every imported assistant message (issue 23 item 4).

Each tool reports a response's token usage in its own shape; the host's own
messages carry pi's (``input``, ``output``, ``cacheRead``, ``cacheWrite``,
``totalTokens``, ``cost``). An imported message's ``meta.usage`` is that one
shape, plus ``reasoning``; the tool's report is kept beside it, unchanged, as
``meta.usageRaw``. Meanings, whatever the source:

* ``input``: prompt tokens not read from the cache; ``cacheRead`` /
  ``cacheWrite``: prompt tokens read from / written to the provider's cache;
* ``output``: every generated token, reasoning included; ``reasoning``: the
  part of ``output`` that was reasoning (0 when the source does not say);
* ``totalTokens``: input + cacheRead + cacheWrite + output;
* ``cost.total``: the cost the tool recorded (pi, opencode), absent otherwise.

Per source:

* claude-code (Anthropic Messages ``usage``): ``input_tokens`` excludes the
  cache (``cache_read_input_tokens``, ``cache_creation_input_tokens``);
  thinking is part of ``output_tokens`` and not counted apart.
* codex (OpenAI Responses ``usage`` as the rollout writes it):
  ``input_tokens`` includes ``cached_input_tokens`` and (0.17x)
  ``cache_write_input_tokens``; ``output_tokens`` includes
  ``reasoning_output_tokens``.
* pi: already this shape (``cost`` is pi's cost object).
* opencode (``message.tokens``): ``output`` excludes ``reasoning`` (opencode
  counts them apart), ``cache.read`` / ``cache.write``; its cost is
  ``message.cost``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["normalize_usage"]


def _n(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _get(raw: Mapping[str, Any], *path: str) -> int:
    value: Any = raw
    for key in path:
        if not isinstance(value, Mapping):
            return 0
        value = value.get(key)
    return _n(value)


def _cost(value: object) -> float | None:
    if isinstance(value, Mapping):
        value = value.get("total")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)


def normalize_usage(source: str, raw: Mapping[str, Any], *, cost: object = None) -> dict[str, Any] | None:
    """The one shape of a message's usage report (None for a source whose shape is the host's own)."""
    if source == "claude-code":
        inp, out = _get(raw, "input_tokens"), _get(raw, "output_tokens")
        read, write, reasoning = _get(raw, "cache_read_input_tokens"), _get(raw, "cache_creation_input_tokens"), 0
    elif source == "codex":
        read, write = _get(raw, "cached_input_tokens"), _get(raw, "cache_write_input_tokens")
        inp, out = max(0, _get(raw, "input_tokens") - read - write), _get(raw, "output_tokens")
        reasoning = _get(raw, "reasoning_output_tokens")
    elif source == "pi":
        inp, out, read, write = _get(raw, "input"), _get(raw, "output"), _get(raw, "cacheRead"), _get(raw, "cacheWrite")
        reasoning = _get(raw, "reasoning")
        cost = raw.get("cost") if cost is None else cost
    elif source == "opencode":
        reasoning = _get(raw, "reasoning")
        inp, out = _get(raw, "input"), _get(raw, "output") + reasoning
        read, write = _get(raw, "cache", "read"), _get(raw, "cache", "write")
    else:
        return None
    usage: dict[str, Any] = {"input": inp, "output": out, "cacheRead": read, "cacheWrite": write,
                             "reasoning": reasoning, "totalTokens": inp + out + read + write}
    total = _cost(cost)
    if total is not None:
        usage["cost"] = {"total": total}
    return usage
