"""Every method of the protocol registry is served: by the gateway (hello, events) or a routed handler."""

from __future__ import annotations

import trio

from protocol.methods import METHODS
from tests.hostkit import inprocess_host

GATEWAY_METHODS = {"host.hello", "events.subscribe", "events.unsubscribe"}


async def test_every_registered_method_has_a_handler(tmp_path):
    with trio.fail_after(30):
        async with inprocess_host(tmp_path) as host:
            served = set(host.pipeline.routes())
            assert GATEWAY_METHODS <= served
            assert set(METHODS) - served == set()
            assert served - set(METHODS) == set()
