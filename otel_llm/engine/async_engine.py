"""An asyncio front for the engine: a background step loop and per-request token streams.

The loop runs each ``step()`` in a worker thread so the event loop stays free while the model runs.
New requests and aborts are queued and applied between steps, in the event-loop thread, so the engine
is never touched by two threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

from otel_llm.engine.engine import LLMEngine, RequestOutput


class AsyncLLMEngine:
    """Streams text per request while one background task steps the shared engine::

    async for text in AsyncLLMEngine(engine).stream("Hello", max_tokens=8):
        print(text, end="")
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._pending: deque[tuple[str, Callable[[], object]]] = deque()
        self._streams: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    async def stream(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        *,
        request_id: str | None = None,
        carrier: Mapping[str, str] | None = None,
        stop_token_ids: Iterable[int] = (),
    ) -> AsyncIterator[str]:
        """Yield the request's text as it is produced. Leaving the loop early aborts the request."""
        arrival_ts = time.monotonic()  # before any wait for the step loop: that wait is queue time
        token_ids = self.engine.validate_request(prompt, max_tokens)
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already streaming; pass a unique one")
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._streams[rid] = queue
        add = self.engine.add_request
        stops = tuple(stop_token_ids)
        self._submit(rid, lambda: add(token_ids, max_tokens, rid, carrier, stops, arrival_ts))
        decoder = self.engine.tokenizer.stream_decoder()
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine never took it, or the step loop died
                    raise item
                finished = item.finished
                text = decoder.decode(bytes(item.new_token_ids), final=finished)
                if text:
                    yield text
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._submit(rid, lambda: self.engine.abort_request(rid))

    async def generate(self, prompt: str | list[int], max_tokens: int = 16, **kwargs: object) -> str:
        return "".join([text async for text in self.stream(prompt, max_tokens, **kwargs)])  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Stop the step loop; unfinished requests stay in the engine."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _submit(self, rid: str, op: Callable[[], object]) -> None:
        self._pending.append((rid, op))
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        assert self._wakeup is not None
        self._wakeup.set()

    async def _run(self) -> None:
        assert self._wakeup is not None
        engine = self.engine
        while True:
            while self._pending:
                rid, op = self._pending.popleft()
                try:
                    op()
                except Exception as exc:  # a bad request fails its own stream, not the loop
                    self._fail(rid, exc)
            if not engine.has_unfinished():
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            try:
                outputs = await asyncio.to_thread(engine.step)
            except Exception as exc:
                for rid in list(self._streams):
                    self._fail(rid, exc)
                raise
            for out in outputs:
                queue = self._streams.get(out.request_id)
                if queue is not None:
                    queue.put_nowait(out)

    def _fail(self, rid: str, exc: BaseException) -> None:
        queue = self._streams.get(rid)
        if queue is not None:
            queue.put_nowait(exc)
