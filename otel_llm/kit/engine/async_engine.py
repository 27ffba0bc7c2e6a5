"""An asyncio front for the engine: a background step loop and per-request output streams.

The loop runs each ``step()`` in a worker thread so the event loop stays free while the model runs.
New requests and aborts are queued and applied between steps, in the event-loop thread, so the engine
is never touched by two threads at once.

``submit()`` is the primitive: it returns a ``RequestStream`` once the engine has queued the request, so
its id and ``traceparent`` are known before the first token (an HTTP server sends them as headers), and
the stream then yields the engine's ``RequestOutput`` items. ``stream()`` (text) and ``generate()``
(the whole text) are built on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from otel_llm.kit.engine.engine import LLMEngine, RequestOutput

# What the step loop delivers to a request's queue: its outputs, or the error that ends it.
_Item = RequestOutput | BaseException


class RequestStream:
    """One submitted request's outputs, as an async iterator of ``RequestOutput``.

    ``request_id`` and ``traceparent`` (of its ``llm.request`` span; None without a tracker) are known
    from the start. ``finish_reason`` and ``num_output_tokens`` grow as items are read. Closing the
    stream early (``aclose()``, leaving ``async with``, or dropping it) aborts the request in the engine.
    """

    def __init__(
        self, front: AsyncLLMEngine, request_id: str, traceparent: str | None, queue: asyncio.Queue[_Item]
    ) -> None:
        self._done = False
        self.request_id = request_id
        self.traceparent = traceparent
        self.finish_reason: str | None = None
        self.num_output_tokens = 0  # token ids delivered so far, the stop token included
        self._front = front
        self._queue = queue
        self._loop = asyncio.get_running_loop()

    @property
    def finished(self) -> bool:
        """True once the last item was read, the stream failed, or it was closed."""
        return self._done

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._end()  # the engine never took the request, or the step loop died
            raise item
        self.num_output_tokens += len(item.new_token_ids)
        if item.finished:
            self.finish_reason = item.finish_reason
            self._end()
        return item

    async def aclose(self) -> None:
        """Stop reading; an unfinished request is aborted (finish reason ``abort``). Safe to repeat."""
        if not self._done:
            self._end()
            self._front._abort(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Dropped unfinished without aclose(), as after a ``break``: abort it on its loop, as an abandoned
        # async generator would be finalized there. A closed loop has no engine left to abort in.
        if not self._done:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._front._abort, self.request_id)

    def _end(self) -> None:
        self._done = True
        self._front._streams.pop(self.request_id, None)


class AsyncLLMEngine:
    """Steps the shared engine in one background task while callers await their own requests::

    front = AsyncLLMEngine(engine)
    async with await front.submit("Hello", max_tokens=8) as outputs:
        print(outputs.request_id, outputs.traceparent)
        async for out in outputs:
            print(out.new_token_ids, out.finish_reason)

    async for text in front.stream("Hello", max_tokens=8):
        print(text, end="")
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        # Work for the loop thread: (request id, operation, future of a waiting submit() or None).
        self._pending: deque[tuple[str, Callable[[], Any], asyncio.Future[Any] | None]] = deque()
        self._streams: dict[str, asyncio.Queue[_Item]] = {}
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # aclose() was called: the loop stops at its next turn
        self._ids = itertools.count()

    async def submit(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        *,
        request_id: str | None = None,
        carrier: Mapping[str, str] | None = None,
        stop_token_ids: Iterable[int] = (),
        arrival_ts: float | None = None,
    ) -> RequestStream:
        """Queue a request in the engine and return its stream once it is queued.

        ``arrival_ts`` (``time.monotonic()`` seconds) is when the request arrived, e.g. when its HTTP
        request came in; omitted, it is now. Waiting here for a running step to end is admission (the
        llm.admission span, arrival to queued), not queue time: the engine has not queued the request yet.
        Raises ValueError for a request the engine could never run, or an id already in use.
        """
        arrival_ts = time.monotonic() if arrival_ts is None else arrival_ts
        token_ids = self.engine.validate_request(prompt, max_tokens)
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already streaming; pass a unique one")
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._streams[rid] = queue
        stops = tuple(stop_token_ids)

        def enqueue() -> str | None:
            engine = self.engine
            engine.add_request(token_ids, max_tokens, rid, carrier, stops, arrival_ts)
            return engine.tracker.traceparent(rid) if engine.tracker is not None else None

        queued: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._submit(rid, enqueue, queued)
        try:
            traceparent = await queued
        except BaseException:
            self._streams.pop(rid, None)
            # Cancelled after the loop had queued it: nobody will read it, so take it out again.
            if queued.done() and not queued.cancelled() and queued.exception() is None:
                self._abort(rid)
            raise
        return RequestStream(self, rid, traceparent, queue)

    async def stream(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        *,
        request_id: str | None = None,
        carrier: Mapping[str, str] | None = None,
        stop_token_ids: Iterable[int] = (),
        arrival_ts: float | None = None,
    ) -> AsyncIterator[str]:
        """Yield the request's text as it is produced. Leaving the loop early aborts the request."""
        outputs = await self.submit(
            prompt,
            max_tokens,
            request_id=request_id,
            carrier=carrier,
            stop_token_ids=stop_token_ids,
            arrival_ts=arrival_ts,
        )
        decoder = self.engine.tokenizer.stream_decoder()
        async with outputs:
            async for out in outputs:
                text = decoder.decode(bytes(out.new_token_ids), final=out.finished)
                if text:
                    yield text

    async def generate(self, prompt: str | list[int], max_tokens: int = 16, **kwargs: Any) -> str:
        """The request's whole text; ``kwargs`` as for ``submit()``."""
        return "".join([text async for text in self.stream(prompt, max_tokens, **kwargs)])

    async def aclose(self) -> None:
        """Stop the step loop after its current step; unfinished requests stay in the engine.

        Operations already handed to the loop (aborts from ``end_open()``, a hung-up stream) are applied
        first: cancelling the loop mid-step used to drop them, so an aborted request never finished and
        its trace was lost at shutdown. The wait is at most one engine step."""
        task = self._task
        if task is not None:
            self._closing = True
            if self._wakeup is not None:
                self._wakeup.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the loop's error went to readers
                await task
            self._task = None
            self._closing = False  # a later submit() starts a new loop, as before
        self._apply_pending()  # the loop is gone: nothing steps the engine concurrently

    def end_open(self, exc: BaseException) -> int:
        """End every open stream with ``exc`` (its reader gets it) and abort its request in the engine;
        return how many there were."""
        open_ids = list(self._streams)
        for rid in open_ids:
            self._fail(rid, exc)
            self._abort(rid)
        return len(open_ids)

    def _abort(self, rid: str) -> None:
        """Forget ``rid``'s stream and abort it in the engine (a no-op if it has finished)."""
        self._streams.pop(rid, None)
        self._submit(rid, lambda: self.engine.abort_request(rid))

    def _submit(self, rid: str, op: Callable[[], Any], waiter: asyncio.Future[Any] | None = None) -> None:
        self._pending.append((rid, op, waiter))
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        assert self._wakeup is not None
        self._wakeup.set()

    async def _run(self) -> None:
        assert self._wakeup is not None
        engine = self.engine
        while True:
            self._apply_pending()
            if self._closing:
                return
            if not engine.has_unfinished():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                outputs = await asyncio.to_thread(engine.step)
            except Exception as exc:
                self._fail_all(exc)
                raise
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)

    def _apply_pending(self) -> None:
        while self._pending:
            rid, op, waiter = self._pending.popleft()
            if waiter is not None and waiter.done():
                continue  # its submit() was cancelled or failed: nobody would read the request
            try:
                result = op()
            except Exception as exc:  # a bad request fails its own submit or stream, not the loop
                if waiter is not None:
                    waiter.set_exception(exc)
                else:
                    self._fail(rid, exc)
            else:
                if waiter is not None:
                    waiter.set_result(result)

    def _fail_all(self, exc: BaseException) -> None:
        """The step loop died: every reader, and every submit() still waiting, gets its error."""
        for rid in list(self._streams):
            self._fail(rid, exc)
        for _, _, waiter in self._pending:
            if waiter is not None and not waiter.done():
                waiter.set_exception(exc)

    def _fail(self, rid: str, exc: BaseException) -> None:
        queue = self._streams.get(rid)
        if queue is not None:
            queue.put_nowait(exc)
