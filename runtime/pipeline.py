"""The request pipeline: one path from a decoded request to its target and back.

For every wire method (``runtime/routes.py`` says where each one goes) the
pipeline does what all of them share, once:

1. **validate** the params with the method's model (``protocol/methods.py``;
   limits live beside the models) — handlers receive the model, never a dict.
   Before that, a native pi session id (``native-pi:...``) is refused with
   ``UNSUPPORTED_FOR_NATIVE_SESSION`` by every route without a ``native``
   handler; a session route with one sends native ids there (a host task: no
   session actor, no path is built from the id);
2. **receipts**: a mutating request with a ``submissionId`` gets a key
   (clientId, submissionId, method, fingerprint) and *claims* it before its
   effect (``runtime/receipts.py``): a concurrent duplicate waits and is answered
   from the first; the target answers a completed one from the database before
   running anything; the terminal response is stored with the effect (by the
   target: ``ctx.commit`` in the same transaction, or the file the effect writes);
3. **ordering** (``runtime/ordering.py``): :meth:`Pipeline.submit` queues the
   request in its connection's :class:`~runtime.ordering.Ordering` and returns
   at once (the gateway's reader goes on reading frames). Each connection's
   requests are then dispatched one after the other in frame order; a request
   is handed to its target only after every earlier mutating request of its
   connection has taken effect (was answered), except those already in the
   same ordered mailbox (one session actor, the DB writer), which run it in
   order anyway. So a read sees the writes sent before it and two writes apply
   in frame order, whatever their targets; a duplicate waiting for its
   receipt's first request holds up its connection's later requests, not the
   reader. :meth:`Pipeline.call` (in-process callers, who await each answer)
   dispatches directly;
4. **answers** come back through a reply callback, once: no task waits per
   request. In test mode every result is validated against its result model;
5. **shutdown**: after :meth:`Pipeline.close` every new request is answered
   ``SHUTTING_DOWN``; :meth:`Pipeline.drained` waits for those in flight.

Errors are never translated here: the gateway maps exceptions to wire codes
(``protocol/errors.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import outcome
import trio
from pydantic import BaseModel, ValidationError

from actors.db_reader import PoolClosed
from actors.db_writer import DbOp
from actors.gateway_types import CallContext, Reply
from actors.session import SessionCall, SessionOp
from protocol.errors import MethodNotFound
from protocol.jsonrpc import Encoded, longer_than, more_items_than
from protocol.methods import METHODS, MethodSpec
from runtime.context import HostContext, Pinned, ReadContext, Services, WriterContext, WriterResult
from runtime.kernel.actor import ActorCrashed, ActorStopped, Busy, CallbackReply, InternalBug
from runtime.ordering import Abandoned, Ordering, Turn
from runtime.receipts import Claim, ReceiptBook, Replayed
from runtime.routes import ROUTES, Route, Via
from store import receipts
from store.errors import PermissionDenied, StoreError
from store.interchange.native_pi import is_native_id, unsupported_for_native
from store.receipts import ReceiptKey

__all__ = ["Pipeline", "ShuttingDown"]

log = logging.getLogger("pi_host")

FINGERPRINT_ON_LOOP = 64 * 1024
"""Params of at most this many characters of JSON are fingerprinted for their receipt key on the trio
loop (tens of microseconds; the appends' fast path, :meth:`Pipeline._to_actor_now`); longer ones (a 2 MiB
message: milliseconds of sorted JSON and SHA-256) in a worker thread, from the connection's ordering task."""

VALIDATE_ON_LOOP = 256
"""A connection's request whose params hold at most this many objects, arrays and items
(:func:`protocol.jsonrpc.more_items_than`) is validated on the trio loop (a usual append: a few dozen,
tens of microseconds); one with more (a message of thousands of blocks: milliseconds of pydantic) in a
worker thread while its connection's reader waits, so its frames keep their order."""


class ShuttingDown(Exception):
    """The host is shutting down: the request was not run (retriable, on the next host)."""

    code = "SHUTTING_DOWN"
    retriable = True

    def __init__(self, message: str = "the host is shutting down; retry once it is back") -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = {}


@dataclass(frozen=True, slots=True)
class _Bound:
    route: Route
    spec: MethodSpec
    op: SessionOp | None
    wire_names: Mapping[str, str]
    """Params field name -> its wire (camelCase) spelling, where they differ."""


def _wire_names(model: type[BaseModel]) -> dict[str, str]:
    return {name: f.alias for name, f in model.model_fields.items() if f.alias and f.alias != name}


def receipt_client(caller: CallContext) -> str:
    """Whose receipts a request's key names: its ``clientId``, scoped by the plugin a plugin connection
    authenticated as (``#`` is in no ``clientId``): two plugins, or a plugin and a UI, that happen to
    share a ``clientId`` never answer each other's retries, and nothing a plugin does not own reaches
    it through a receipt."""
    if caller.plugin_id is None:
        return caller.client_id
    return f"{caller.client_id}#plugin:{caller.plugin_id}"


class _Answer:
    """The one reply of one request: settles its receipt claim and its turn, checks the result,
    counts it out."""

    __slots__ = ("_pipeline", "_bound", "_reply", "claim", "turn", "release", "done", "served_direct")

    def __init__(self, pipeline: Pipeline, bound: _Bound, reply: Reply) -> None:
        self._pipeline = pipeline
        self._bound = bound
        self._reply = reply
        self.claim: Claim | None = None
        self.turn: Turn | None = None
        self.release: Callable[[], None] | None = None
        self.done = False
        self.served_direct = False
        """Answered by the route's ``direct`` read, from the request's own task after its read-pool hop."""

    def __call__(self, result: outcome.Outcome[Any]) -> None:
        if self.done:
            return
        self.done = True
        pipeline = self._pipeline
        pipeline._finished()
        if self.turn is not None:
            self.turn.settle()  # its effect, if any, took place: the connection's next request may go
        if self.release is not None:
            self.release()
        if isinstance(result, outcome.Value):
            value, pin = result.value, None
            if isinstance(value, Pinned):
                value, pin = value.response, value.seq
            if pipeline.validate_results:
                value = _checked(self._bound.spec, value)
            if self.claim is not None:
                if isinstance(value, BaseException):
                    self.claim.release()
                else:
                    self.claim.complete(value, pin_until=pin)
            self._reply(outcome.Error(value) if isinstance(value, BaseException) else outcome.Value(value))
            return
        assert isinstance(result, outcome.Error)
        error = result.error
        if self.claim is not None:
            self.claim.release()
        if pipeline.closing and isinstance(error, (ActorStopped, ActorCrashed, PoolClosed, trio.Cancelled)):
            error = ShuttingDown()
        self._reply(outcome.Error(error))


_WRITER = ("writer",)


class _MessageIds:
    """Message ids being written, with their session: one id goes to one session at a time.

    Two sessions writing one id at once each planned it as new (neither saw the other's
    line), and the index remapped the second one (D444) after its caller was answered
    with the plain id: the receipt it stored, and every replay, named another id. The
    second now waits for the first's answer, when the id is held, and remaps it itself.
    """

    def __init__(self) -> None:
        self._writing: dict[str, _Claim] = {}

    async def claim(self, sid: str, ids: tuple[str, ...]) -> Callable[[], None]:
        """Wait while another session writes one of ``ids``; the returned function releases them."""
        while (other := self._other(sid, ids)) is not None:
            if other.done is None:  # the first to wait for it: built only then, not per claim
                other.done = trio.Event()
            await other.done.wait()
        return self._take(sid, ids)

    def claim_nowait(self, sid: str, ids: tuple[str, ...]) -> Callable[[], None] | None:
        """:meth:`claim` when no other session writes one of ``ids``; ``None`` (nothing claimed) otherwise."""
        return None if self._other(sid, ids) is not None else self._take(sid, ids)

    def _other(self, sid: str, ids: tuple[str, ...]) -> _Claim | None:
        return next((held for mid in ids if (held := self._writing.get(mid)) is not None and held.sid != sid), None)

    def _take(self, sid: str, ids: tuple[str, ...]) -> Callable[[], None]:
        mine_claim = _Claim(sid)
        mine = [mid for mid in ids if mid not in self._writing]  # this session's own earlier write keeps its claim
        for mid in mine:
            self._writing[mid] = mine_claim

        def release() -> None:
            for mid in mine:
                if self._writing.get(mid) is mine_claim:
                    del self._writing[mid]
            if mine_claim.done is not None:
                mine_claim.done.set()

        return release


class _Claim:
    """One session's claim of the message ids it is writing; ``done`` is built when another session waits."""

    __slots__ = ("sid", "done")

    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.done: trio.Event | None = None


def _native_session_param(raw: Any, keys: frozenset[str], *, allowed: bool) -> str | None:
    """A native pi session id in a param of the method that names a session (``keys``: ``sessionId``,
    ``sourceSessionId``, ``targetSessionId``, ``activeSessionId``, in either spelling): refused before
    validation, as the README says of every method but those whose route reads one (``allowed``: in
    ``sessionId`` only). A key the method does not take is left to validation (an unknown key,
    ``INVALID_PARAMS``), whatever its value."""
    if not keys or not isinstance(raw, Mapping):
        return None
    for name, value in raw.items():
        if not isinstance(name, str) or not isinstance(value, str) or name not in keys:
            continue
        if name in ("sessionId", "session_id"):
            if not allowed and is_native_id(value):
                return value
        elif is_native_id(value):
            return value
    return None


def _tag(bound: _Bound, params: Any) -> Hashable | None:
    """Where a request will be queued, as far as its params say (a hint for the one before it)."""
    route = bound.route
    if route.via is Via.SESSION and route.session is None:
        return ("session", params.session_id)
    if route.via is Via.WRITER:
        return _WRITER
    return None


def _large_params(raw: Any, size: int | None) -> bool:
    """Whether fingerprinting ``raw`` is too much work for the trio loop: its frame (``size`` characters)
    is longer than :data:`FINGERPRINT_ON_LOOP` and so, roughly counted, are the params themselves."""
    return (size is None or size > FINGERPRINT_ON_LOOP) and longer_than(raw, FINGERPRINT_ON_LOOP)


def _submission(bound: _Bound, params: Any) -> str | None:
    """The request's ``submissionId`` when it keys a receipt (a mutation's), else ``None``."""
    if not bound.spec.mutating:
        return None  # asked first: a read's params model has no submission_id, and pydantic's miss is slow
    submission = getattr(params, "submission_id", None)
    return None if submission is None else str(submission)


def _shown(bound: _Bound, raw: Any) -> dict[str, Any]:
    """The params as the wire spells them: a retry spelling a field in snake_case (accepted, README §2) is
    the same request as its camelCase original."""
    names = bound.wire_names
    return {names.get(k, k): v for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def _checked(spec: MethodSpec, value: Any) -> Any:
    try:
        spec.result_model.model_validate(value.decode() if isinstance(value, Encoded) else value)
    except ValidationError as exc:
        # Our own answer does not fit the documented model: a host bug, not bad params.
        log.error("result of %s does not match its model: %s", spec.name, exc)
        return InternalBug(f"result of {spec.name} does not match the protocol model")
    return value


@dataclass
class _Presence:
    """A client's open connections, and how many it opened so far (a reconnect changes it)."""

    open: int = 0
    generation: int = 0


class Pipeline:
    def __init__(self, services: Services, *, routes: Mapping[str, Route] = ROUTES,
                 book: ReceiptBook | None = None, validate_results: bool = False,
                 on_client_gone: Sequence[Callable[[Services, CallContext], Awaitable[None]]] = (),
                 client_gone_after: float = 5.0) -> None:
        self.services = services
        self._on_client_gone = tuple(on_client_gone)
        self._client_gone_after = client_gone_after
        self._clients: dict[str, _Presence] = {}  # per client id, while it has connections or may come back
        self.book = book if book is not None else ReceiptBook()
        self.validate_results = validate_results
        self.closing = False
        self._bound: dict[str, _Bound] = {}
        for name, route in routes.items():
            spec = METHODS.get(name)
            if spec is None:
                raise InternalBug(f"route {name!r} has no wire method in protocol/methods.py")
            op = None
            if route.via is Via.SESSION:
                op = SessionOp(route.handler, spec.mutating, name, ready_check=route.ready_check, group=route.group,
                               replayed=route.replayed)
            self._bound[name] = _Bound(route, spec, op, _wire_names(spec.params_model))
        self._in_flight = 0
        self._idle = trio.Event()  # set (and built again) when the last request in flight is answered while
        self._idle_wanted = False  # drained() waits on it: not one event per request
        self._nursery: trio.Nursery | None = None
        self._orders: dict[int, Ordering] = {}  # per connection, while it has requests in its order
        self._writing = _MessageIds()
        self._hashing = trio.CapacityLimiter(2)  # the threads that fingerprint or validate long params

    # -- lifecycle -------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the tasks of reads, of multi-step requests and of busy connections' orders until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def close(self) -> None:
        """From now on every new request is answered ``SHUTTING_DOWN``."""
        self.closing = True

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def drained(self) -> None:
        """Wait until every request submitted so far has been answered."""
        while self._in_flight:
            self._idle_wanted = True
            await self._idle.wait()

    def _finished(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle_wanted:
            self._idle_wanted = False
            self._idle.set()
            self._idle = trio.Event()

    # -- requests ----------------------------------------------------------------
    def routes(self) -> Mapping[str, Route]:
        return {name: b.route for name, b in self._bound.items()}

    async def submit(self, method: str, raw: Any, caller: CallContext, reply: Reply, *, more: bool = False,
                     size: int | None = None) -> None:
        """Queue the request behind the earlier ones of its connection; returns without waiting.
        ``size``: ``raw``'s JSON text is at most this many characters (``None``: not known)."""
        checked = None
        if more_items_than(raw, VALIDATE_ON_LOOP) and not self.closing and (bound := self._bound.get(method)):
            checked = await trio.to_thread.run_sync(outcome.capture, bound.spec.params_model.model_validate, raw,
                                                    limiter=self._hashing)
        prepared = self._prepare(method, raw, caller, reply, checked)
        if prepared is None:
            return
        bound, params, answer = prepared
        order = self._ordering(caller.connection_id)
        if self._to_actor_now(bound, params, raw, caller, answer, more, order, size):
            return

        async def step(turn: Turn) -> None:
            await self._run(bound, params, raw, caller, answer, more, turn, size)

        def drop() -> None:
            answer(outcome.Error(ShuttingDown("the request was dropped before it was run")))

        try:
            answer.turn = order.add(step, drop, mutating=bound.spec.mutating or bound.route.writes,
                                    tag=_tag(bound, params))
        except ShuttingDown as exc:
            answer(outcome.Error(exc))

    def _to_actor_now(self, bound: _Bound, params: Any, raw: Any, caller: CallContext, answer: _Answer, more: bool,
                      order: Ordering, size: int | None) -> bool:
        """The usual session request, handed to its running actor from the submitting task, at once:
        what :meth:`_run` and :meth:`_dispatch` do in the order's dispatching task, without that task
        (one task spawn and one task switch less per request). Only when none of their steps would
        wait: nothing of the connection is queued or dispatching before it and no earlier mutation
        elsewhere is pending (:meth:`Ordering.may_hand_on`), its receipt key is unclaimed (and its
        params short enough to be fingerprinted here: :data:`FINGERPRINT_ON_LOOP`) and its message
        ids free, the actor runs and its mailbox has room. Otherwise nothing was done (no claim
        kept, nothing posted, not answered) and ``False``: the ordering's task runs it."""
        route, op = bound.route, bound.op
        if op is None or route.session is not None or route.fingerprint is not None \
                or route.legacy_fingerprint is not None:
            return False  # not a session route (``op`` is its SessionOp), or its steps may wait
        sid = params.session_id
        target = ("session", sid)
        if (route.native is not None and is_native_id(sid)) or not order.may_hand_on(target):
            return False
        ref = self.services.sessions.current(sid)
        if ref is None:
            return False  # not running (or between incarnations): started or awaited by ``_to_actor``
        submission = _submission(bound, params)
        if submission is not None and _large_params(raw, size):
            return False  # fingerprinted in a worker thread by ``_key``
        try:
            key = self._plain_key(bound, submission, raw, caller)
        except Exception:
            return False  # answered by the ordering's task, as it always was
        claim = self.book.claim_nowait(key) if key is not None else None
        if key is not None and claim is None:
            return False  # held or answered already: wait for it, replay it or refuse it there
        release = None
        if route.message_ids is not None:
            release = self._writing.claim_nowait(sid, route.message_ids(params))
            if release is None:
                if claim is not None:
                    claim.release()
                return False
        turn = order.turn(bound.spec.mutating or route.writes, _tag(bound, params))
        answer.claim, answer.release, answer.turn = claim, release, turn
        try:
            ref.post_nowait(SessionCall(op, params, key, caller, more), CallbackReply(answer))
        except (Busy, ActorStopped, ActorCrashed):
            answer.claim = answer.release = answer.turn = None
            if release is not None:
                release()
            if claim is not None:
                claim.release()
            return False
        order.handed_on(turn, target)
        return True

    async def call(self, method: str, raw: Any, caller: CallContext, *, decode: bool = True) -> Any:
        """Run one request and wait for its answer (in-process callers: tests, benchmarks, the scheduler).

        The caller awaits each answer, so its requests are ordered already: no
        connection order is kept. A result the handler encoded already
        (:class:`protocol.jsonrpc.Encoded`) is decoded unless ``decode=False`` (then it is
        returned as the gateway would send it)."""
        done = trio.Event()
        box: list[outcome.Outcome[Any]] = []

        def reply(result: outcome.Outcome[Any]) -> None:
            box.append(result)
            done.set()

        prepared = self._prepare(method, raw, caller, reply)
        if prepared is None:
            await done.wait()  # answered at once (refused): still a checkpoint
        else:
            bound, params, answer = prepared
            await self._run(bound, params, raw, caller, answer, False, None, None)
            if answer.served_direct:
                # Answered already, after the read-pool hop (a checkpoint): a cancellation is still raised
                # here, as done.wait() would raise it, without one more pass of the scheduler.
                await trio.lowlevel.checkpoint_if_cancelled()
            else:
                await done.wait()
        value = box[0].unwrap()
        return value.decode() if decode and isinstance(value, Encoded) else value

    def _prepare(self, method: str, raw: Any, caller: CallContext, reply: Reply,
                 checked: outcome.Outcome[BaseModel] | None = None) -> tuple[_Bound, Any, _Answer] | None:
        """Validate (answering what fails), count the request in: its bound route, params and answer.
        ``checked``: ``raw`` validated already, in a worker thread (:data:`VALIDATE_ON_LOOP`)."""
        if self.closing:
            reply(outcome.Error(ShuttingDown()))
            return None
        bound = self._bound.get(method)
        if bound is None or bound.route.via is Via.CONNECTION:
            reply(outcome.Error(MethodNotFound(method)))
            return None
        if caller.plugin_id is not None and not bound.route.plugins:
            # A plugin reaches only the routes opened to it (whatever the params: it is refused the method, not
            # told what is wrong with params it may never send); their handlers scope what it owns.
            reply(outcome.Error(PermissionDenied(f"a plugin connection may not call {method}",
                                                 data={"method": method, "pluginId": caller.plugin_id})))
            return None
        native = _native_session_param(raw, bound.spec.session_keys, allowed=bound.route.native is not None)
        if native is not None:
            reply(outcome.Error(unsupported_for_native(method, native)))
            return None
        try:
            params = (bound.spec.params_model.model_validate({} if raw is None else raw) if checked is None
                      else checked.unwrap())
        except ValidationError as exc:
            reply(outcome.Error(exc))
            return None
        self._in_flight += 1
        return bound, params, _Answer(self, bound, reply)

    def connected(self, caller: CallContext) -> None:
        """A connection of ``caller.client_id`` authenticated."""
        presence = self._clients.setdefault(caller.client_id, _Presence())
        presence.open += 1
        presence.generation += 1

    def disconnected(self, caller: CallContext) -> None:
        """The connection closed: its requests not dispatched yet are dropped (nobody reads their
        answers; a retry with the same ``submissionId`` runs one), those dispatched run on. When it
        was its client's last connection and none comes back within ``client_gone_after`` seconds,
        the client is gone: ``on_client_gone`` is told (the turn queue offers again what a
        controller took and began no turn with)."""
        order = self._orders.get(caller.connection_id)
        if order is not None:
            order.abandon()
        presence = self._clients.get(caller.client_id)
        if presence is None:
            return
        presence.open -= 1
        if presence.open > 0:
            return
        if self._on_client_gone and self._nursery is not None and not self.closing:
            self._nursery.start_soon(self._client_left, caller, order, presence.generation)
        else:
            del self._clients[caller.client_id]

    async def _client_left(self, caller: CallContext, order: Ordering | None, generation: int) -> None:
        if order is not None:
            await order.wait_idle()  # what it handed on (a queueTake, say) took effect first
        await trio.sleep(self._client_gone_after)
        presence = self._clients.get(caller.client_id)
        if presence is None or presence.open > 0 or presence.generation != generation:
            return  # it came back (a reconnect, or its next connection): it is not gone
        del self._clients[caller.client_id]
        for hook in self._on_client_gone:
            try:
                await hook(self.services, caller)
            except (StoreError, ActorStopped, ActorCrashed, ShuttingDown) as exc:
                # Nothing is lost: what a gone client left is offered again at the next attach,
                # take or restart. Logged, not raised into the pipeline's nursery.
                log.warning("after client %s left: %s", caller.client_id, exc)

    def _ordering(self, connection: int) -> Ordering:
        order = self._orders.get(connection)
        if order is None:
            def forget() -> None:
                if self._orders.get(connection) is order:
                    del self._orders[connection]

            order = Ordering(lambda fn: self._start(fn), on_idle=forget)
            self._orders[connection] = order
        return order

    async def _run(self, bound: _Bound, params: Any, raw: Any, caller: CallContext, answer: _Answer, more: bool,
                   turn: Turn | None, size: int | None) -> None:
        """Claim the receipt (or replay it), then hand the request to its target, in its turn."""
        try:
            key = await self._key(bound, bound.spec.name, params, raw, caller, size)
            if key is not None:
                got = await self.book.claim(key)
                if isinstance(got, Replayed):
                    answer(outcome.Value(got.response))
                    return
                answer.claim = got
            await self._dispatch(bound, params, key, caller, answer, more, turn)
        except Abandoned as exc:
            answer(outcome.Error(ShuttingDown(str(exc))))
        except Exception as exc:
            answer(outcome.Error(exc))
        except BaseException:
            if not answer.done:
                answer(outcome.Error(ShuttingDown("the request was cancelled before it was run")))
            raise

    async def _key(self, bound: _Bound, method: str, params: BaseModel, raw: Any,
                   caller: CallContext, size: int | None) -> ReceiptKey | None:
        route = bound.route
        submission = _submission(bound, params)
        if submission is None:
            return None
        large = route.fingerprint is None and _large_params(raw, size)
        if route.fingerprint is None and route.legacy_fingerprint is None and not large:
            return self._plain_key(bound, submission, raw, caller)
        shown = _shown(bound, raw)
        if route.fingerprint is not None:
            fp = await route.fingerprint(self.services, method, shown)
        elif large:
            # sorted JSON and SHA-256 of megabytes: milliseconds the trio loop does not wait for
            fp = await trio.to_thread.run_sync(receipts.fingerprint, method, shown, limiter=self._hashing)
        else:
            fp = receipts.fingerprint(method, shown)
        legacy = None
        if route.legacy_fingerprint is not None:
            legacy = await route.legacy_fingerprint(self.services, method, shown)
        return ReceiptKey(receipt_client(caller), submission, method, fp, legacy)

    @staticmethod
    def _plain_key(bound: _Bound, submission: str | None, raw: Any, caller: CallContext) -> ReceiptKey | None:
        """:meth:`_key` of a route with the plain fingerprint (no fingerprint hooks), on the trio loop."""
        if submission is None:
            return None
        method = bound.spec.name
        return ReceiptKey(receipt_client(caller), submission, method,
                          receipts.fingerprint(method, _shown(bound, raw)), None)

    async def _dispatch(self, bound: _Bound, params: Any, key: ReceiptKey | None, caller: CallContext,
                        answer: _Answer, more: bool, turn: Turn | None) -> None:
        route = bound.route
        services = self.services

        async def ready(target: Hashable | None) -> None:
            if turn is not None:
                await turn.ready(target)

        if route.via is Via.SESSION:
            assert bound.op is not None
            if route.session is not None:
                await ready(None)  # the lookup may read what earlier writes left
                sid = await route.session(services, params, key)
            else:
                sid = params.session_id
            if route.native is not None and is_native_id(sid):
                await ready(None)
                self._start(self._host, bound.spec.name, Route(Via.HOST, route.native), params, key, caller, answer)
                return
            target = ("session", sid)
            await ready(target)
            if route.direct is not None and not services.sessions.running(sid):
                # A read of a session with no actor: no earlier write of this connection waits in a mailbox of
                # its (there is none), and ``ready`` saw every other one take effect. Served in one read-pool
                # hop, from this task in-process; a connection's read gets its own task (it never holds up the
                # requests behind it). Not served there: the actor answers it, as before.
                if turn is None:
                    if await self._direct(bound, params, caller, answer):
                        return
                else:
                    self._start(self._direct_or_actor, bound, params, key, caller, answer, sid)
                    return
            if route.message_ids is not None:
                answer.release = await self._writing.claim(sid, route.message_ids(params))
            if more and turn is not None and bound.spec.mutating:
                # The batch's next request, if it was read already, waits for this write when it goes
                # elsewhere: then the actor should not linger for it.
                after = turn.following()
                more = after is None or after == target
            await self._to_actor(bound, params, key, caller, answer, sid, more)
            return
        if route.via is Via.WRITER:
            await ready(_WRITER)
            now = services.now_ms()
            op = DbOp(_writer_op(route.handler, params, key, caller, now, services.wake_scheduler), durable=True,
                      label=bound.spec.name)
            await services.db_ref().post(op, CallbackReply(_after_commit(services, answer)))
            return
        await ready(None)
        if route.via is Via.READS:
            self._start(self._read, route, params, caller, answer)
        else:
            self._start(self._host, bound.spec.name, route, params, key, caller, answer)

    async def _to_actor(self, bound: _Bound, params: Any, key: ReceiptKey | None, caller: CallContext,
                        answer: _Answer, sid: str, more: bool) -> None:
        """Post the request to its session's actor (started if needed)."""
        assert bound.op is not None
        ref = await self.services.sessions.ref(sid)
        call, reply = SessionCall(bound.op, params, key, caller, more), CallbackReply(answer)
        try:
            ref.post_nowait(call, reply)  # room in the mailbox: in, without a task switch
        except (Busy, ActorStopped, ActorCrashed):
            await ref.post(call, reply)  # waits for room, or for the next incarnation

    async def _direct(self, bound: _Bound, params: Any, caller: CallContext, answer: _Answer) -> bool:
        """The route's ``direct`` read; whether it answered (``False``: the actor must)."""
        assert bound.route.direct is not None
        try:
            result = await bound.route.direct(self.services, params, caller)
        except Exception as exc:
            answer(outcome.Error(exc))
            return True
        except BaseException:
            answer(outcome.Error(ShuttingDown()))
            raise
        if result is None:
            return False
        answer.served_direct = True  # its hop to the read pool was a checkpoint (``Route.direct``)
        answer(outcome.Value(result))
        return True

    async def _direct_or_actor(self, bound: _Bound, params: Any, key: ReceiptKey | None, caller: CallContext,
                               answer: _Answer, sid: str) -> None:
        """A connection's direct read, in its own task: served, or posted to the actor."""
        if await self._direct(bound, params, caller, answer):
            return
        try:
            await self._to_actor(bound, params, key, caller, answer, sid, False)
        except Exception as exc:
            answer(outcome.Error(exc))
        except BaseException:
            answer(outcome.Error(ShuttingDown("the request was cancelled before it was run")))
            raise

    def _start(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        nursery = self._nursery
        if nursery is None:
            raise ShuttingDown()
        nursery.start_soon(fn, *args)

    async def _read(self, route: Route, params: Any, caller: CallContext, answer: _Answer) -> None:
        services = self.services

        async def work() -> Any:
            if route.barrier:
                await services.index_barrier()
            now = services.now_ms()
            transcript = services.data_dir.transcript_path
            return await services.reads.run(
                lambda conn: route.handler(ReadContext(conn, now, caller, transcript), params))

        await _answer_with(answer, work)

    async def _host(self, method: str, route: Route, params: Any, key: ReceiptKey | None, caller: CallContext,
                    answer: _Answer) -> None:
        ctx = HostContext(self.services, caller, key, method, receipt_answer=route.receipt_answer)

        async def work() -> Any:
            if key is not None:
                found = await self.services.reads.run(receipts.check, key)
                if found is not None:
                    return await ctx.answer_of(found["response"])
            result = await route.handler(ctx, params, key)
            if key is not None and ctx.committed is not None and ctx.committed != result:
                raise InternalBug(f"{route.handler.__name__} answered something other than its stored response")
            return result

        await _answer_with(answer, work)


async def _answer_with(answer: _Answer, work: Callable[[], Awaitable[Any]]) -> None:
    """Run ``work`` and answer with its result or error; a cancellation answers ``SHUTTING_DOWN``."""
    try:
        result = await work()
    except Exception as exc:
        answer(outcome.Error(exc))
    except BaseException:
        answer(outcome.Error(ShuttingDown()))
        raise
    else:
        answer(outcome.Value(result))


def _writer_op(handler: Callable[..., Any], params: Any, key: ReceiptKey | None, caller: CallContext,
               now: int, wake_scheduler: Callable[[], None]) -> Callable[[Any], WriterResult]:
    """A DB-only method as one op of the writer's batch: replay check, effect, receipt row."""

    def op(conn: Any) -> WriterResult:
        if key is not None:
            found = receipts.check(conn, key)
            if found is not None:
                return WriterResult(found["response"], [], [])
        ctx = WriterContext(conn, now, caller, wake_scheduler)
        value = handler(ctx, params, key)
        if key is not None:
            receipts.store(conn, key, value, session_id=None, now_ms=now)
        return WriterResult(value, ctx.events, ctx.after)

    return op


def _after_commit(services: Services, answer: _Answer) -> Callable[[outcome.Outcome[Any]], None]:
    def done(result: outcome.Outcome[Any]) -> None:
        if isinstance(result, outcome.Value) and isinstance(result.value, WriterResult):
            committed = result.value
            for topic, data, session_id in committed.events:
                services.bus.publish(topic, data, session_id=session_id)
            for fn in committed.after:
                fn()
            answer(outcome.Value(committed.value))
            return
        answer(result)

    return done
