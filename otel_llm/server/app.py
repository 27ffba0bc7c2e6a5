"""The OpenAI-compatible HTTP API around the reference engine.

One ``AsyncLLMEngine`` steps the engine in a background task; each handler submits its request and
awaits that request's tokens. The caller's W3C ``traceparent`` / ``tracestate`` headers become the
request's trace context, so ``llm.request`` joins the caller's trace, and every answer carries the
request's ids back: ``x-request-id`` (the engine's id), ``x-trace-id`` (paste it into Jaeger or Tempo)
and ``traceparent`` (of the ``llm.request`` span).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from otel_llm.engine import AsyncLLMEngine, LLMEngine
from otel_llm.server import errors, protocol
from otel_llm.server.streaming import DONE, ClientGone, EventStream, sse, unless_disconnected
from otel_llm.server.watch import RequestWatch, Watched

TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context, read from the caller
HEADER_REQUEST_ID = "x-request-id"
HEADER_TRACE_ID = "x-trace-id"
CLIENT_CLOSED = 499  # nginx's status for "client closed request"; nobody receives it


def create_app(
    engine: LLMEngine, model: str = "otel-llm-tiny", on_shutdown: Callable[[], object] | None = None
) -> FastAPI:
    """A FastAPI app serving ``engine`` under the model name ``model``.

    The engine's tracker (if any) is wrapped in a ``RequestWatch``; the app owns the engine from now on
    and stops its step loop on shutdown, then calls ``on_shutdown`` (e.g. to flush telemetry: uvicorn
    ends the process right after a SIGTERM shutdown, so code after ``uvicorn.run()`` may never run).
    """
    server = _Server(engine, model)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await server.engine.aclose()
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)  # flushing may wait on the network

    app = FastAPI(
        title="otel-llm",
        summary="OpenAI-compatible API of the reference engine",
        lifespan=lifespan,
        # llm.request is the server span of each call, a direct child of the caller's span; FastAPI's own
        # HTTP spans would be a second server span beside it. Its HTTP metrics stay on.
        telemetry={"tracing": False, "operation_spans": False},
    )
    errors.install(app)
    app.state.server = server

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return protocol.model_list(model, server.created)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.answer(request, protocol.CompletionRequest, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.answer(request, protocol.ChatCompletionRequest, chat=True)

    return app


class _Server:
    def __init__(self, engine: LLMEngine, model: str) -> None:
        if not isinstance(engine.tracker, RequestWatch):
            engine.tracker = RequestWatch(engine.tracker)
        self.watch: RequestWatch = engine.tracker
        self.engine = AsyncLLMEngine(engine)
        self.model = model
        self.created = int(time.time())

    async def answer(self, request: Request, kind: type[protocol._Common], chat: bool) -> Response:
        body = self._parse(await request.body(), kind)
        prompt, max_tokens = body.engine_prompt(), body.output_limit()
        try:
            token_ids = self.engine.engine.validate_request(prompt, max_tokens)
        except ValueError as exc:
            param = "max_tokens" if "max_tokens" in str(exc) else ("messages" if chat else "prompt")
            raise errors.ApiError(400, str(exc), param=param) from None
        carrier = {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        gen = _Generation(self, rid, body, chat, len(token_ids))
        gen.start(token_ids, max_tokens, carrier)
        if body.stream:
            return await gen.event_stream()
        try:
            return await unless_disconnected(request, gen.whole())
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)

    def _parse(self, raw: bytes, kind: type[protocol._Common]) -> protocol._Common:
        data = errors.parse_json(raw)
        if not isinstance(data, dict):
            raise errors.ApiError(400, "request body must be a JSON object", code="invalid_value")
        try:
            body = kind.model_validate(data)
        except ValidationError as exc:
            raise errors.from_validation(exc, data) from None
        if body.model != self.model:
            raise errors.ApiError(
                404,
                f"model {body.model!r} does not exist; this server serves {self.model!r} (GET /v1/models)",
                type=errors.NOT_FOUND,
                param="model",
                code="model_not_found",
            )
        return body


class _Generation:
    """One request's way through the engine, from submission to its last token."""

    def __init__(
        self, server: _Server, rid: str, body: protocol._Common, chat: bool, prompt_tokens: int
    ) -> None:
        self.server, self.rid, self.body, self.chat = server, rid, body, chat
        self.prompt_tokens = prompt_tokens
        self.stops = {chr(t) for t in body.stop_token_ids()}
        self.watched: Watched = server.watch.watch(rid)

    def start(self, token_ids: list[int], max_tokens: int, carrier: dict[str, str]) -> None:
        self.texts = self.server.engine.stream(
            token_ids,
            max_tokens,
            request_id=self.rid,
            carrier=carrier or None,
            stop_token_ids=self.body.stop_token_ids(),
        )
        # Pulling the first piece submits the request; the step loop then queues it in the engine.
        self.first: asyncio.Future[str] = asyncio.ensure_future(anext(self.texts))
        self._pieces = self.pieces()

    async def pieces(self) -> AsyncGenerator[str, None]:
        """The generated text, piece by piece, without the stop character that ended it."""
        try:
            piece = await self.first
        except StopAsyncIteration:
            return
        yield self._strip(piece)
        async for piece in self.texts:
            yield self._strip(piece)

    def _strip(self, piece: str) -> str:
        # Generation ends at the first stop token, so a piece ending in one is the last piece.
        return piece[:-1] if piece and piece[-1] in self.stops else piece

    async def whole(self) -> JSONResponse:
        try:
            text = "".join([p async for p in self._pieces])
        except Exception as exc:
            raise errors.ApiError(500, f"the engine failed: {exc}", type=errors.SERVER_ERROR) from exc
        finally:
            self.server.watch.forget(self.rid)
        body = protocol.completion(
            self.rid, self.server.model, text, self._reason(), self.chat, self._usage()
        )
        return JSONResponse(body, headers=self._headers())

    async def event_stream(self) -> Response:
        # Headers go out first, so wait until the engine has queued the request and its trace id exists.
        queued = asyncio.ensure_future(self.watched.queued.wait())
        try:
            await asyncio.wait({self.first, queued}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            queued.cancel()
        if self.first.done() and not self.first.cancelled():
            exc = self.first.exception()
            if exc is not None and not isinstance(exc, StopAsyncIteration):
                self.server.watch.forget(self.rid)
                raise errors.ApiError(500, f"the engine failed: {exc}", type=errors.SERVER_ERROR) from exc
        return EventStream(self._events(), self._headers(), on_close=self.close)

    async def _events(self) -> AsyncGenerator[bytes, None]:
        model, rid, chat = self.server.model, self.rid, self.chat
        try:
            if chat:
                yield sse(protocol.chunk(rid, model, "", None, chat, first=True))
            async for piece in self._pieces:
                if piece:
                    yield sse(protocol.chunk(rid, model, piece, None, chat))
            yield sse(protocol.chunk(rid, model, None, self._reason(), chat))
            if self.body.include_usage:
                yield sse(protocol.usage_chunk(rid, model, chat, self._usage()))
            yield DONE
        except Exception as exc:  # headers are gone: report in the stream, as OpenAI does
            yield sse(errors.ApiError(500, f"the engine failed: {exc}", type=errors.SERVER_ERROR).body())

    async def close(self) -> None:
        """Stop pulling tokens; an unfinished request is aborted in the engine (reason ``abort``)."""
        if not self.first.done():
            self.first.cancel()  # the cancellation runs the engine stream's own clean-up
            await asyncio.gather(self.first, return_exceptions=True)
        await self._pieces.aclose()
        await self.texts.aclose()  # a no-op once finished; otherwise its clean-up aborts the request
        self.server.watch.forget(self.rid)

    def _reason(self) -> str:
        return self.watched.finish_reason or "stop"

    def _usage(self) -> dict[str, int]:
        return protocol.usage(self.prompt_tokens, self.watched.completion_tokens)

    def _headers(self) -> dict[str, str]:
        headers = {HEADER_REQUEST_ID: self.rid}
        traceparent = self.watched.traceparent
        if traceparent:
            headers["traceparent"] = traceparent
            headers[HEADER_TRACE_ID] = traceparent.split("-")[1]
        return headers
