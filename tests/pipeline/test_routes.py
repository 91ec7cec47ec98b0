"""The route table against the wire registry: every method routed once, every handler typed
with its method's params model, group handlers only on the session target."""

from __future__ import annotations

import typing

import pytest

from actors.session_context import SessionContext
from protocol.methods import METHODS
from runtime.context import HostContext, ReadContext, WriterContext
from runtime.routes import ROUTES, Via

CONTEXT = {Via.SESSION: SessionContext, Via.WRITER: WriterContext, Via.READS: ReadContext, Via.HOST: HostContext}


def test_every_wire_method_has_exactly_one_route() -> None:
    assert set(ROUTES) == set(METHODS)


@pytest.mark.parametrize("name", sorted(n for n, r in ROUTES.items() if r.via is not Via.CONNECTION))
def test_handler_takes_the_context_of_its_target_and_the_params_model_of_its_method(name: str) -> None:
    route = ROUTES[name]
    hints = typing.get_type_hints(route.handler)
    args = [v for k, v in hints.items() if k != "return"]
    assert args[0] is CONTEXT[route.via], f"{name}: handler's first argument is not {CONTEXT[route.via].__name__}"
    assert args[1] is METHODS[name].params_model, f"{name}: handler is typed with {args[1]}, not the method's model"


def test_only_session_routes_have_groups_or_session_resolvers() -> None:
    for name, route in ROUTES.items():
        if route.via is not Via.SESSION:
            assert route.group is None and route.session is None and route.ready_check, name


def test_connection_methods_are_the_gateways() -> None:
    assert {n for n, r in ROUTES.items() if r.via is Via.CONNECTION} == {
        "host.hello", "events.subscribe", "events.unsubscribe"}


def test_reads_are_not_mutating_and_writer_routes_are() -> None:
    for name, route in ROUTES.items():
        if route.via is Via.READS:
            assert not METHODS[name].mutating, name
        if route.via is Via.WRITER:
            assert METHODS[name].mutating, name


@pytest.mark.parametrize("name", sorted(n for n, r in ROUTES.items() if r.native is not None))
def test_native_handlers_are_host_handlers_of_the_methods_params_model(name: str) -> None:
    route = ROUTES[name]
    assert route.via is Via.SESSION, f"{name}: a native handler only stands beside a session route"
    hints = typing.get_type_hints(route.native)
    args = [v for k, v in hints.items() if k != "return"]
    assert args[0] is HostContext and args[1] is METHODS[name].params_model, name
