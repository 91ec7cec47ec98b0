"""The protocol's wire types, for type checkers and readers: ``from pihost_client.types import SessionSummary``.

Every params and result shape (``TypedDict``), block, event payload and literal is generated from the host's
models into :mod:`pihost_client._generated`; this module is their public name.
"""

from __future__ import annotations

from ._generated import *  # noqa: F403 - the generated module's public names are this module's
