"""What a connection sends, bounded in bytes: the outbound queue, the frame writer, work and rate budgets.

* :class:`Outbound` — encoded replies and events waiting for the socket,
  bounded by their **bytes** (and, loosely, by their count). Offering an item
  that does not fit returns ``False``: the caller closes the connection as a
  slow consumer. An empty queue always takes one item, so a reply the reply
  cap allowed is never refused for its size alone.
* :func:`send_text` — one text frame whose payload is the encoded chunks as
  they are: no str/bytes round trip, no joined copy of a batch (the frame
  header is written, then each chunk, under trio-websocket's send lock). A
  large frame goes to the socket in sends of at most ``SEND_SLICE`` bytes, so
  no single task step copies more than that into the kernel.
* :class:`ByteBudget` — bytes reserved by requests still being worked on (a
  window read reserves its budget before it runs), so what one connection can
  make the host materialise at once is bounded too.
* :class:`RequestRate` — a token bucket on requests per second; the reader
  waits for a token (backpressure, not an error).
"""

from __future__ import annotations

import logging
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from actors.gateway_http import PrefixedStream

__all__ = ["ByteBudget", "CloseAfter", "Flush", "Frame", "Outbound", "PeerGone", "RequestRate", "SharedBytes",
           "SEND_SLICE", "flush_unsent", "send_text", "send_text_nowait"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Frame:
    """One text frame: its payload is ``b"".join(chunks)`` (never joined here)."""

    chunks: tuple[bytes, ...]
    size: int


@dataclass(frozen=True, slots=True)
class CloseAfter:
    """Outbound sentinel: everything queued before it is sent, then close."""

    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Flush:
    """Outbound sentinel: a frame started at once (``GatewayConnection.deliver``) left bytes the
    socket did not take; the writer sends them (they go before anything queued after it)."""


class PeerGone(Exception):
    """The socket broke or the WebSocket was closed while a frame was being written."""


class SharedBytes:
    """Bytes queued by every connection together, bounded by ``limit`` (host-wide)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0


class Outbound:
    """A queue of frames bounded by bytes (``max_bytes``) and by count (``max_frames``); with ``shared``,
    also by the host-wide total (a connection that still has unread frames may not push it past its limit)."""

    def __init__(self, *, max_bytes: int, max_frames: int, shared: SharedBytes | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_frames = max_frames
        self._shared = shared
        self._items: deque[Frame | CloseAfter | Flush] = deque()
        self.queued_bytes = 0
        self.peak_bytes = 0
        self.peak_frames = 0
        self._closed = False
        self._ready = trio.Event()
        self._progress = trio.Event()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        """The writer is gone (the peer left, or the connection closed): nothing is sent any more."""
        return self._closed

    def offer(self, item: Frame | CloseAfter | Flush) -> bool:
        """Queue ``item``; ``False`` if it does not fit (the consumer is too slow) or the queue is closed."""
        if self._closed:
            return False
        shared = self._shared
        if isinstance(item, Frame) and self._items:
            if self.queued_bytes + item.size > self.max_bytes or len(self._items) >= self.max_frames:
                return False
            if shared is not None and shared.held + item.size > shared.limit:
                return False
        self._items.append(item)
        if isinstance(item, Frame):
            self.queued_bytes += item.size
            if shared is not None:
                shared.held += item.size
                shared.peak = max(shared.peak, shared.held)
        self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
        self.peak_frames = max(self.peak_frames, len(self._items))
        self._ready.set()
        return True

    def has_room(self, share: float) -> bool:
        """At most ``share`` of either bound is used (events leave the rest to replies)."""
        return self.queued_bytes < self.max_bytes * share and len(self._items) < max(1, int(self.max_frames * share))

    async def wait_progress(self) -> None:
        await self._progress.wait()

    async def get(self) -> Frame | CloseAfter | Flush:
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            self._ready = trio.Event()
            await self._ready.wait()
        item = self._items.popleft()
        if isinstance(item, Frame):
            self.queued_bytes -= item.size
            if self._shared is not None:
                self._shared.held -= item.size
        self._progress.set()
        self._progress = trio.Event()
        return item

    def close(self) -> None:
        """Drop what is queued; wake the writer (``EndOfChannel``) and every waiter."""
        self._closed = True
        self._items.clear()
        if self._shared is not None:
            self._shared.held -= self.queued_bytes
        self.queued_bytes = 0
        self._ready.set()
        self._progress.set()


SMALL_FRAME = 64 * 1024
"""Payload bytes up to which a frame is sent with its header in one write (joined, copied once)."""

SEND_SLICE = 256 * 1024
"""Bytes handed to the socket at most per send of a large frame. One send is one task step: the
kernel takes as much as its send buffer holds (up to 4 MiB on Linux: ~1 ms of copying on the loop in
one step); a slice bounds that step's work (~0.1 ms) whatever the socket buffer."""


def _header(size: int) -> bytes:
    """RFC 6455 §5.2: FIN + text opcode, unmasked (server to client), payload length."""
    if size < 126:
        return struct.pack("!BB", 0x81, size)
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size)
    return struct.pack("!BBQ", 0x81, 127, size)


def _fast_path(ws: WebSocketConnection) -> tuple[trio.abc.Stream, trio.StrictFIFOLock] | None:
    """trio-websocket 0.12's stream and send lock, if this connection exposes them (no extensions)."""
    stream = getattr(ws, "_stream", None)
    lock = getattr(ws, "_stream_lock", None)
    connection = getattr(getattr(ws, "_wsproto", None), "connection", None)  # wsproto.WSConnection
    proto = getattr(connection, "_proto", None)  # its FrameProtocol
    if not isinstance(stream, trio.abc.Stream) or not isinstance(lock, trio.StrictFIFOLock):
        return None
    if proto is None or getattr(proto, "extensions", None):
        return None  # a negotiated extension (compression) must frame the payload itself
    return stream, lock


def send_text_nowait(ws: WebSocketConnection, chunks: Sequence[bytes], size: int) -> int | None:
    """Start sending ``chunks`` as ONE small text frame at once, from the caller's task (no hop to the
    writer task, no task switch): ``None`` when nothing was sent (the frame is not small, nothing may be
    sent now, the socket's buffer is full): the caller queues it for the writer. Otherwise the bytes
    the socket did not take yet (usually 0); they stay with the stream (:class:`PrefixedStream`), which
    sends them before anything else, and :func:`flush_unsent` sends them.

    Only while nobody sends (trio-websocket's send lock is free) and only on a plain socket."""
    if size > SMALL_FRAME or ws.closed is not None:
        return None
    fast = _fast_path(ws)
    if fast is None:
        return None
    stream, lock = fast
    if lock.locked() or not isinstance(stream, PrefixedStream):
        return None
    if not stream.send_nowait(b"".join((_header(size), *chunks))):
        return None
    return stream.unsent


async def flush_unsent(ws: WebSocketConnection) -> None:
    """Send what :func:`send_text_nowait` left unsent (under trio-websocket's send lock).

    Raises :class:`PeerGone` when the socket broke."""
    fast = _fast_path(ws)
    if fast is None:
        return
    stream, lock = fast
    if not isinstance(stream, PrefixedStream):
        return
    async with lock:
        try:
            await stream.flush()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise PeerGone() from None


async def send_text(ws: WebSocketConnection, chunks: Sequence[bytes], size: int) -> bool:
    """Send ``chunks`` as ONE text frame (valid UTF-8 JSON). Returns True on the zero-copy path.

    Raises :class:`PeerGone` when the connection is closed or the socket breaks.
    """
    if ws.closed is not None:
        raise PeerGone()
    fast = _fast_path(ws)
    if fast is None:
        try:
            await ws.send_message(b"".join(chunks).decode("utf-8"))
        except ConnectionClosed:
            raise PeerGone() from None
        return False
    stream, lock = fast
    try:
        lock.acquire_nowait()  # the usual case (nobody else sends): no task switch for the lock
    except trio.WouldBlock:
        await lock.acquire()
    try:
        if size <= SMALL_FRAME:
            # A small frame (an append's reply): one send, one syscall, one task switch; the copy
            # costs less than a second send.
            await stream.send_all(b"".join((_header(size), *chunks)))
        else:
            # Large chunks go as they are, in slices of at most SEND_SLICE bytes (one syscall and one
            # task step each); the small ones around them (the header, a reply's envelope, a batch's
            # commas) are joined into sends of at most SEND_SLICE bytes.
            small: list[bytes] = [_header(size)]
            held = len(small[0])
            for chunk in chunks:
                if len(chunk) <= SMALL_FRAME:
                    if held + len(chunk) > SEND_SLICE:
                        await stream.send_all(b"".join(small))
                        small, held = [], 0
                    small.append(chunk)
                    held += len(chunk)
                    continue
                if small:
                    await stream.send_all(b"".join(small))
                    small, held = [], 0
                view = memoryview(chunk)  # slices without copies
                for start in range(0, len(view), SEND_SLICE):
                    await stream.send_all(view[start:start + SEND_SLICE])
            if small:
                await stream.send_all(b"".join(small))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        raise PeerGone() from None
    finally:
        lock.release()
    return True


class ByteBudget:
    """An async byte semaphore: ``acquire(n)`` waits until ``n`` more bytes fit in ``capacity``.

    A request larger than the capacity is admitted alone (when nothing else is held),
    so it waits but is never starved forever. FIFO: a big request is not overtaken.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.peak = 0
        self._waiters: deque[tuple[int, trio.Event]] = deque()

    def _fits(self, n: int) -> bool:
        return self.held == 0 or self.held + n <= self.capacity

    async def acquire(self, n: int) -> None:
        if n <= 0:
            return
        if not self._waiters and self._fits(n):
            self._take(n)
            try:
                await trio.lowlevel.checkpoint()
            except BaseException:  # cancelled at the checkpoint: the caller holds nothing, so nothing is held
                self.release(n)
                raise
            return
        event = trio.Event()
        entry = (n, event)
        self._waiters.append(entry)
        try:
            await event.wait()
        except BaseException:
            if entry in self._waiters:
                self._waiters.remove(entry)
                # the ones it held back may fit now: with nothing left to release (every holder done),
                # they would wait for ever (a connection closed while its big request queued first
                # stalled every later request of every connection)
                self._wake()
            else:  # granted at the same moment we were cancelled: give it back
                self.release(n)
            raise

    def _take(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    def release(self, n: int) -> None:
        if n <= 0:
            return
        self.held = max(0, self.held - n)
        self._wake()

    def _wake(self) -> None:
        """Grant the waiters that fit now, in order (FIFO: a big one at the head holds the rest back)."""
        while self._waiters and self._fits(self._waiters[0][0]):
            size, event = self._waiters.popleft()
            self._take(size)
            event.set()


class RequestRate:
    """Token bucket: ``rate`` requests per second, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self._tokens = self.burst
        self._stamp: float | None = None
        self.waited = 0

    async def take(self, n: int) -> None:
        now = trio.current_time()
        if self._stamp is None:
            self._stamp = now
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        need = min(float(n), self.burst)
        if self._tokens >= need:
            self._tokens -= need
            return
        self.waited += 1
        await trio.sleep((need - self._tokens) / self.rate)
        self._stamp = trio.current_time()
        self._tokens = 0.0
