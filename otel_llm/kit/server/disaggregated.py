"""The HTTP server's front for a disaggregated engine: requests go to the prefill worker, tokens come
back from the decode worker (``otel_llm.kit.engine.disaggregated``).

It offers what the app uses of ``AsyncLLMEngine``: ``submit()`` returns a ``RequestStream`` once the
request is queued, ``engine.validate_request()`` and ``engine.tokenizer`` check and decode in the API
process, ``aclose()`` stops. The API process draws no trace ids: the prefill worker's tracker does,
when it queues the request, and answers its ``traceparent`` (``Queued``) before any token, so the
headers (``traceparent``, ``x-trace-id``) name the one ``llm.request`` both workers report under.

A thread reads the workers' outputs queue and hands each item to the event loop. Closing a stream early
aborts the request in whichever worker holds it. Stopping aborts what is still open, then gives the
workers ``OTEL_LLM_SHUTDOWN_TIMEOUT`` + 1 s (seconds) to drain and flush their telemetry before it ends
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from otel_llm.kit.engine.async_engine import RequestStream
from otel_llm.kit.engine.config import EngineConfig
from otel_llm.kit.engine.disaggregated import DisaggregatedEngine, Output, Queued, Submit
from otel_llm.kit.engine.engine import RequestOutput, validate_request
from otel_llm.kit.engine.tokenizer import ByteTokenizer
from otel_llm.setup import DEFAULT_SHUTDOWN_TIMEOUT_S, ENV_SHUTDOWN_TIMEOUT

_POLL_S = 0.1  # how long the reader thread waits on the outputs queue before looking at the flag (s)


def shutdown_budget_s() -> float:
    """``OTEL_LLM_SHUTDOWN_TIMEOUT`` (seconds, default 5) + 1: what stopping the workers may take."""
    raw = os.environ.get(ENV_SHUTDOWN_TIMEOUT, "").strip()
    try:
        value = float(raw) if raw else DEFAULT_SHUTDOWN_TIMEOUT_S
    except ValueError:
        value = DEFAULT_SHUTDOWN_TIMEOUT_S
    return (value if value > 0 else DEFAULT_SHUTDOWN_TIMEOUT_S) + 1.0


class RequestCheck:
    """Checks a request against both workers' limits, in the API process (a 400 before any work)."""

    def __init__(self, prefill: EngineConfig, decode: EngineConfig) -> None:
        self.tokenizer = ByteTokenizer()
        self._configs = (prefill, decode)

    def validate_request(self, prompt: str | list[int], max_tokens: int) -> list[int]:
        """The prompt's token ids; ValueError (RequestTooLong) when either worker could never run it."""
        token_ids: list[int] = []
        for config in self._configs:
            token_ids = validate_request(self.tokenizer, config, prompt, max_tokens)
        return token_ids


class DisaggregatedFront:
    """``AsyncLLMEngine``'s interface over a ``DisaggregatedEngine`` (see the module docstring)."""

    def __init__(self, workers: DisaggregatedEngine, prefill: EngineConfig, decode: EngineConfig) -> None:
        self.workers = workers
        self.engine = RequestCheck(prefill, decode)
        self._streams: dict[str, asyncio.Queue[Any]] = {}
        self._waiting: dict[str, asyncio.Future[str | None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self._closed = False

    async def submit(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        *,
        request_id: str,
        carrier: Mapping[str, str] | None = None,
        stop_token_ids: Iterable[int] = (),
        arrival_ts: float | None = None,
    ) -> RequestStream:
        """Send the request to the prefill worker; its stream once the worker has queued it.

        ``arrival_ts``: ``time.monotonic()`` seconds (the same clock in every process of this host)."""
        if self._closed:
            raise RuntimeError("the server is stopping")
        token_ids = self.engine.validate_request(prompt, max_tokens)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already streaming; pass a unique one")
        self._start_reader()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        queued: asyncio.Future[str | None] = loop.create_future()
        self._streams[request_id] = queue
        self._waiting[request_id] = queued
        arrival = time.monotonic() if arrival_ts is None else arrival_ts
        submit = Submit(
            request_id, token_ids, max_tokens, arrival, dict(carrier or {}) or None, tuple(stop_token_ids)
        )
        self.workers.submit(submit)
        try:
            traceparent = await queued
        except BaseException:
            self._waiting.pop(request_id, None)
            self._abort(request_id)  # cancelled while the worker queued it: nobody will read it
            raise
        return RequestStream(self, request_id, traceparent, queue)  # type: ignore[arg-type]

    async def aclose(self) -> None:
        """Abort every open request, then stop the workers within the shutdown budget."""
        if self._closed:
            return
        self._closed = True
        for rid in list(self._streams):
            self._abort(rid)
        self._stop.set()
        if self._reader is not None:
            await asyncio.to_thread(self._reader.join)
        await asyncio.to_thread(self.workers.close, shutdown_budget_s())

    def end_open(self, exc: BaseException) -> int:
        """End every open stream with ``exc`` (its reader gets it) and abort its request in its worker;
        return how many there were."""
        open_streams = list(self._streams.items())
        for rid, queue in open_streams:
            queue.put_nowait(exc)
            self._abort(rid)
        return len(open_streams)

    def _abort(self, rid: str) -> None:
        """Forget ``rid``'s stream and abort it in the worker that holds it (no-op once finished)."""
        self._streams.pop(rid, None)
        self.workers.abort(rid)

    def _start_reader(self) -> None:
        if self._reader is None:
            self._loop = asyncio.get_running_loop()
            self._reader = threading.Thread(target=self._read, name="otel-llm-outputs", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        """Reader thread: move the workers' answers onto the event loop until stopped."""
        assert self._loop is not None
        while not self._stop.is_set():
            items = self.workers.events(_POLL_S)
            failed = not items and not self.workers.alive()
            with contextlib.suppress(RuntimeError):  # the loop closed under us
                if items:
                    self._loop.call_soon_threadsafe(self._deliver, items)
                if failed:
                    self._loop.call_soon_threadsafe(self._fail_all, RuntimeError("a worker process died"))
            if failed:
                return

    def _deliver(self, items: list[Output | Queued]) -> None:
        for item in items:
            if isinstance(item, Queued):
                waiter = self._waiting.pop(item.request_id, None)
                if waiter is None or waiter.done():
                    continue
                if item.error is not None:
                    self._streams.pop(item.request_id, None)
                    waiter.set_exception(ValueError(item.error))
                else:
                    waiter.set_result(item.traceparent)
                continue
            queue = self._streams.get(item.request_id)
            if queue is not None:
                queue.put_nowait(
                    RequestOutput(item.request_id, item.token_ids, item.finished, item.finish_reason, item.ts)
                )

    def _fail_all(self, exc: BaseException) -> None:
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(exc)
        self._waiting.clear()
        for queue in self._streams.values():
            queue.put_nowait(exc)
