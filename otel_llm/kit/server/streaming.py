"""Server-sent events and client hang-ups.

Starlette's StreamingResponse stops pulling from its iterator when the client disconnects but leaves
the iterator suspended; ``EventStream`` also closes it and calls ``on_close``, at once, so the engine
request behind it is aborted now rather than whenever the garbage collector gets to it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Send

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One ``data:`` event. Compact JSON holds no newline, so one line per event is enough."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class EventStream(StreamingResponse):
    """``text/event-stream`` from an async generator of encoded events, closed however the response ends."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        headers: dict[str, str],
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(events, headers={**headers, "cache-control": "no-cache"})
        self._events = events
        self._on_close = on_close

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            # Runs when the disconnect listener cancels us too; the shield lets the close finish.
            with anyio.CancelScope(shield=True):
                await self._events.aclose()
                await self._on_close()


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client hangs up first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)

    async def hang_up() -> None:
        # The body has been read, so the next message can only be the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(hang_up())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # let the cancellation reach the engine
    if task.cancelled():
        raise ClientGone()
    return task.result()
