"""The OpenAI-compatible HTTP API around the reference engine.

One ``AsyncLLMEngine`` steps the engine in a background task; each handler submits its request, gets
its ``RequestStream`` once the engine has queued it, and reads that request's outputs. The caller's W3C
``traceparent`` / ``tracestate`` headers become the request's trace context, so ``llm.request`` joins
the caller's trace, and every answer carries the request's ids back: ``x-request-id`` (the engine's
id), ``x-trace-id`` (paste it into Jaeger or Tempo) and ``traceparent`` (of the ``llm.request`` span).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from otel_llm import semconv as sc
from otel_llm.kit.engine import AsyncLLMEngine, LLMEngine
from otel_llm.kit.engine.async_engine import RequestStream
from otel_llm.kit.engine.engine import RequestTooLong
from otel_llm.kit.server import errors, protocol
from otel_llm.kit.server.disaggregated import DisaggregatedFront
from otel_llm.kit.server.streaming import DONE, ClientGone, EventStream, sse, unless_disconnected

# uvicorn's own logger, so these lines look like the server's other lines and follow --log-level.
_logger = logging.getLogger("uvicorn.error")

TRACE_HEADERS = ("traceparent", "tracestate")  # W3C Trace Context, read from the caller
HEADER_REQUEST_ID = "x-request-id"
HEADER_TRACE_ID = "x-trace-id"
DEFAULT_BODY_TIMEOUT_S = 30.0
CLIENT_CLOSED = 499  # nginx's status for "client closed request"; nobody receives it
# After --graceful-timeout the server ends what is still open itself; uvicorn's own cancellation, this
# much later, is only a backstop (it logs every request it cancels with a traceback).
BACKSTOP_S = 1.0


class ServerStopping(Exception):
    """The server is stopping and its graceful timeout is over: an open request is ended (aborted)."""


def run(
    app: FastAPI,
    *,
    host: str,
    port: int,
    log_level: str,
    graceful_timeout_s: float,
    sock: socket.socket | None = None,
) -> None:
    """``uvicorn.run(app, ...)``, except that open requests still running ``graceful_timeout_s`` seconds
    after SIGTERM / Ctrl-C are ended by the app (a 503, or a last error event in a stream; the engine
    aborts them) before uvicorn would cancel their tasks.

    ``sock``: a socket already bound to ``host``:``port`` (``otel-llm serve`` binds it before loading the
    model, so a port in use is found first); uvicorn listens on it. Without one, uvicorn binds itself."""
    import uvicorn

    class Server(uvicorn.Server):
        interrupted = False  # a Ctrl-C (SIGINT) asked for the shutdown

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and sockets:
                # uvicorn says where it listens only for sockets it bound itself.
                where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                _logger.info("listening on http://%s (Ctrl-C to stop)", where)

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.interrupted = self.interrupted or sig == signal.SIGINT
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets: Any = None) -> None:
            timer = asyncio.get_running_loop().call_later(graceful_timeout_s, app.state.server.end_open)
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=graceful_timeout_s + BACKSTOP_S,
    )
    server = Server(config)
    try:
        server.run(sockets=None if sock is None else [sock])
    except KeyboardInterrupt:
        # uvicorn re-raises a Ctrl-C once its graceful shutdown is done, and asyncio turns that into a
        # cancelled main task: the shutdown is over, so there is nothing left to report but the exit.
        raise SystemExit(130) from None
    if server.interrupted:
        # The re-raised Ctrl-C does not always reach this frame (when the main task has already ended),
        # and a shell still expects Ctrl-C's status.
        raise SystemExit(130)
    if not server.started:
        raise SystemExit(3)  # as uvicorn.run(): the server could not start


def create_app(
    engine: LLMEngine | DisaggregatedFront,
    model: str = "otel-llm-tiny",
    on_shutdown: Callable[[], object] | None = None,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
) -> FastAPI:
    """A FastAPI app serving ``engine`` under the model name ``model``: one ``LLMEngine``, or the
    front of a prefill and a decode worker (``otel_llm.kit.server.disaggregated``).

    A request whose body has not fully arrived ``body_timeout_s`` seconds after its headers is answered
    408, so a client that stalls mid-body holds neither a handler nor a graceful shutdown for long.

    The engine reports to its own tracker (if any), unchanged; the app owns the engine from now on and
    stops its step loop on shutdown, then calls ``on_shutdown`` (e.g. to flush telemetry: uvicorn
    ends the process right after a SIGTERM shutdown, so code after ``uvicorn.run()`` may never run).
    """
    server = _Server(engine, model, body_timeout_s)

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
    def __init__(self, engine: LLMEngine | DisaggregatedFront, model: str, body_timeout_s: float) -> None:
        self.engine = AsyncLLMEngine(engine) if isinstance(engine, LLMEngine) else engine
        self.model = model
        self.body_timeout_s = body_timeout_s
        self.created = int(time.time())
        self._stopping = asyncio.Event()  # set when the graceful timeout is over
        self._uploads: set[asyncio.Future[bytes]] = set()  # bodies being read now

    def end_open(self) -> None:
        """End every open request: its reader gets ServerStopping, the engine aborts it; a request whose
        body is still arriving is answered 503 at once. One log line says what was cut."""
        uploads = len(self._uploads)
        self._stopping.set()
        streams = self.engine.end_open(ServerStopping("the server is shutting down; the request was aborted"))
        if streams or uploads:
            _logger.warning(
                "graceful shutdown timeout over: ended %d open request(s) (aborted in the engine, their "
                "traces say abort) and %d still sending its body (answered 503)",
                streams,
                uploads,
            )

    async def read_body(self, request: Request) -> bytes:
        """The request body; 408 when it takes longer than ``body_timeout_s``, 503 when the server's
        graceful timeout ends first, ClientGone when the client hangs up while sending it."""
        reading = asyncio.ensure_future(request.body())
        stopping = asyncio.ensure_future(self._stopping.wait())
        self._uploads.add(reading)
        try:
            await asyncio.wait({reading, stopping}, timeout=self.body_timeout_s, return_when=FIRST_COMPLETED)
        finally:
            self._uploads.discard(reading)
            stopping.cancel()
            if not reading.done():
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
        if reading.cancelled():
            if self._stopping.is_set():
                raise errors.ApiError(
                    503,
                    "the server is shutting down; the request body had not fully arrived",
                    type=errors.SERVER_ERROR,
                    code="server_shutting_down",
                )
            raise errors.ApiError(
                408, f"the request body did not arrive within {self.body_timeout_s:g} s", code="timeout"
            )
        try:
            return reading.result()
        except ClientDisconnect:
            raise ClientGone() from None

    async def answer(self, request: Request, kind: type[protocol._Common], chat: bool) -> Response:
        # Arrival (A): reading and checking the body, tokenizing and queueing are the llm.admission span.
        arrival_ts = time.monotonic()
        try:
            raw = await self.read_body(request)
        except ClientGone:  # nobody is left to answer; nothing reached the engine
            return Response(status_code=CLIENT_CLOSED)
        body = self._parse(raw, kind)
        prompt, max_tokens = body.engine_prompt(), body.output_limit()
        try:
            token_ids = self.engine.engine.validate_request(prompt, max_tokens)
        except RequestTooLong as exc:
            raise _too_long(exc, chat) from None
        except ValueError as exc:
            raise errors.ApiError(400, str(exc), param="messages" if chat else "prompt") from None
        carrier = {name: request.headers[name] for name in TRACE_HEADERS if name in request.headers}
        submit = functools.partial(
            self.engine.submit,
            token_ids,
            max_tokens,
            request_id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            carrier=carrier or None,
            stop_token_ids=body.stop_token_ids(),
            arrival_ts=arrival_ts,
        )
        if body.stream:
            # Headers go out first: the request is queued, so its id and trace context exist by now.
            gen = _Generation(self, body, chat, len(token_ids), await _queued(submit()))
            return EventStream(gen.events(), gen.headers(), on_close=gen.outputs.aclose)
        try:
            return await unless_disconnected(request, self._whole(submit, body, chat, len(token_ids)))
        except ClientGone:
            return Response(status_code=CLIENT_CLOSED)

    async def _whole(
        self,
        submit: Callable[[], Awaitable[RequestStream]],
        body: protocol._Common,
        chat: bool,
        prompt_tokens: int,
    ) -> JSONResponse:
        # Submitted inside the work that a hang-up cancels: a request still waiting to be queued then
        # never reaches the engine, and one already queued is aborted.
        gen = _Generation(self, body, chat, prompt_tokens, await _queued(submit()))
        return await gen.whole()

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
    """One request's answer, built from the engine's outputs for it."""

    def __init__(
        self, server: _Server, body: protocol._Common, chat: bool, prompt_tokens: int, outputs: RequestStream
    ) -> None:
        self.server, self.body, self.chat = server, body, chat
        self.prompt_tokens = prompt_tokens
        self.outputs = outputs
        self.rid = outputs.request_id

    async def pieces(self) -> AsyncGenerator[str, None]:
        """The generated text, piece by piece, without the stop token that ended it."""
        decoder = self.server.engine.engine.tokenizer.stream_decoder()
        async for out in self.outputs:
            token_ids = out.new_token_ids
            if out.finish_reason == sc.REASON_STOP:
                token_ids = token_ids[:-1]  # the engine stops only on a stop token; OpenAI leaves it out
            text = decoder.decode(bytes(token_ids), final=out.finished)
            if text:
                yield text

    async def whole(self) -> JSONResponse:
        try:
            async with self.outputs:  # leaving early (the client hung up) aborts the request
                text = "".join([p async for p in self.pieces()])
        except Exception as exc:
            raise _failed(exc) from exc
        reason = self.outputs.finish_reason
        body = protocol.completion(self.rid, self.server.model, text, reason, self.chat, self._usage())
        return JSONResponse(body, headers=self.headers())

    async def events(self) -> AsyncGenerator[bytes, None]:
        """The server-sent events of a streamed answer; the response closes ``outputs`` when it ends."""
        model, rid, chat = self.server.model, self.rid, self.chat
        try:
            if chat:
                yield sse(protocol.chunk(rid, model, "", None, chat, first=True))
            async for piece in self.pieces():
                yield sse(protocol.chunk(rid, model, piece, None, chat))
            yield sse(protocol.chunk(rid, model, None, self.outputs.finish_reason, chat))
            if self.body.include_usage:
                yield sse(protocol.usage_chunk(rid, model, chat, self._usage()))
            yield DONE
        except Exception as exc:  # headers are gone: report in the stream, as OpenAI does
            yield sse(_failed(exc).body())

    def _usage(self) -> dict[str, int]:
        return protocol.usage(self.prompt_tokens, self.outputs.num_output_tokens)

    def headers(self) -> dict[str, str]:
        headers = {HEADER_REQUEST_ID: self.rid}
        traceparent = self.outputs.traceparent
        if traceparent:
            headers["traceparent"] = traceparent
            headers[HEADER_TRACE_ID] = traceparent.split("-")[1]
        return headers


async def _queued(submission: Awaitable[RequestStream]) -> RequestStream:
    """Wait until the engine has queued the request; its failure to do so is the server's (500)."""
    try:
        return await submission
    except Exception as exc:
        raise _engine_failed(exc) from exc


def _too_long(exc: RequestTooLong, chat: bool) -> errors.ApiError:
    """Blame the prompt when it alone fills a sequence, else max_tokens; name the server's own option."""
    room = f"this server holds at most {exc.limit} tokens per sequence, prompt and output together"
    if exc.prompt_tokens >= exc.limit:
        return errors.ApiError(
            400,
            f"the prompt is {exc.prompt_tokens} tokens; {room} (shorten the prompt, or start the server "
            "with more --kv-blocks)",
            param="messages" if chat else "prompt",
            code="context_length_exceeded",
        )
    return errors.ApiError(
        400,
        f"max_tokens ({exc.max_tokens}) leaves no room: the prompt is {exc.prompt_tokens} tokens and {room}; "
        f"ask for at most {exc.limit - exc.prompt_tokens} tokens",
        param="max_tokens",
        code="context_length_exceeded",
    )


def _failed(exc: Exception) -> errors.ApiError:
    """What ended a request that the engine had taken: the server stopping (503), else the engine (500)."""
    if isinstance(exc, ServerStopping):
        return errors.ApiError(503, str(exc), type=errors.SERVER_ERROR, code="server_shutting_down")
    return _engine_failed(exc)


def _engine_failed(exc: Exception) -> errors.ApiError:
    return errors.ApiError(500, f"the engine failed: {exc}", type=errors.SERVER_ERROR)
