"""What a connection receives: trio-websocket's reader hands each frame over without a second task step.

trio-websocket's reader task parses the socket's bytes and puts each message in a memory
channel that the connection's reader (``GatewayConnection._read_loop``) waits on. A channel's
``send`` yields once after a message went through (a schedule point), so every frame cost the
reader task two steps on the trio thread: one to read and hand the frame over, one more only
to come back and wait on the socket again, which is a schedule point itself (``receive_some``
waits, or yields after a read). :func:`hand_over_without_yield` makes the hand-over that does
not wait not yield; one that must wait (the channel is full: the connection's reader is busy)
waits as before, so reading still stops when the connection stops taking frames.
"""

from __future__ import annotations

from types import TracebackType

import trio
from trio_websocket import WebSocketConnection

__all__ = ["hand_over_without_yield"]

Message = str | bytes


class _HandOver:
    """The send side of trio-websocket's message channel: ``send`` does not yield when the message fits
    at once (a reader waits for it, or the buffer has room); otherwise it waits as the channel does."""

    def __init__(self, channel: trio.MemorySendChannel[Message]) -> None:
        self._channel = channel

    async def send(self, value: Message) -> None:
        try:
            self._channel.send_nowait(value)  # closed or broken: raises as send() would
        except trio.WouldBlock:
            await self._channel.send(value)

    def send_nowait(self, value: Message) -> None:
        self._channel.send_nowait(value)

    def close(self) -> None:
        self._channel.close()

    async def aclose(self) -> None:
        await self._channel.aclose()

    async def __aenter__(self) -> _HandOver:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._channel.close()


def hand_over_without_yield(ws: WebSocketConnection) -> bool:
    """Wrap trio-websocket 0.12's message channel (``_send_channel``; no public hook) in :class:`_HandOver`.
    False (nothing changed) when this connection does not have one as expected."""
    channel = getattr(ws, "_send_channel", None)
    if not isinstance(channel, trio.MemorySendChannel):
        return False
    setattr(ws, "_send_channel", _HandOver(channel))  # noqa: B010 - a private attribute, typed as the channel
    return True
