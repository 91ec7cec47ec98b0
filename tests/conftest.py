"""Suite-wide hooks.

The suite runs on parallel workers, one test module per work unit (``--dist loadfile``, ``scripts/test``).
Its wall time is the busiest worker's, so the modules are handed out longest first (the classic
longest-processing-time order): a long module started last would run alone at the end while the other
workers idle. ``module_costs.json`` holds each module's seconds from a measured run
(``python -m scripts.suite_costs``); a module it does not name yet counts as a median one. The order of
the tests inside a module is kept.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

_COSTS = Path(__file__).with_name("module_costs.json")


def _module_costs() -> dict[str, float]:
    try:
        raw = json.loads(_COSTS.read_text(encoding="utf-8"))["seconds"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    costs = _module_costs()
    if not costs:
        return
    unknown = statistics.median(costs.values())
    position = {id(item): i for i, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, str, int]:
        module = item.nodeid.split("::", 1)[0]
        return (-costs.get(module, unknown), module, position[id(item)])

    items.sort(key=key)
