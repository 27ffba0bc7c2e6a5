"""The caller's W3C trace headers under `vllm serve`, kept whatever vLLM does with them.

vLLM 0.30 and 0.31 read a request's ``traceparent`` and ``tracestate`` only when vLLM's own tracing is on
(``--otlp-traces-endpoint``); otherwise they never reach ``AsyncLLM.add_request`` and the request's trace
would start afresh instead of continuing the caller's (a router's, a gateway's). vLLM 0.32 and later pass
them on in every case. So the API server gets one ASGI middleware of ours through vLLM's public
``--middleware`` option: it puts the two headers in a context variable for the request's task, where
``add_request`` finds them when vLLM passed none. The middleware does no I/O and cannot raise.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from otel_llm.integrations.vllm import targets

# The caller's W3C headers of the request being added on this task: set by the middleware for a whole
# HTTP request, and by AsyncLLM.add_request's wrapper when vLLM passed trace_headers itself.
CALLER_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "otel_llm_vllm_caller_headers", default=None
)

# ASGI gives header names lower-cased, as bytes.
W3C_HEADERS = (b"traceparent", b"tracestate")

# The import path vLLM's --middleware takes: module, then the class.
MIDDLEWARE = f"{__name__}.CallerTraceHeaders"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class CallerTraceHeaders:
    """Pure ASGI middleware: the request's ``traceparent`` / ``tracestate`` in ``CALLER_HEADERS`` while
    the request is served. A request without them passes through untouched (one scan of its headers)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = caller_headers(scope) if scope.get("type") == "http" else None
        if not found:
            await self.app(scope, receive, send)
            return
        token = CALLER_HEADERS.set(found)
        try:
            await self.app(scope, receive, send)
        finally:
            CALLER_HEADERS.reset(token)


def caller_headers(scope: Scope) -> dict[str, str] | None:
    """``traceparent`` and ``tracestate`` from an ASGI scope's headers (latin-1, as HTTP/1.1 header
    values are), or None when the request has neither."""
    found: dict[str, str] | None = None
    for name, value in scope.get("headers") or ():
        if name in W3C_HEADERS:
            if found is None:
                found = {}
            found[name.decode("latin-1")] = value.decode("latin-1")
    return found


def add_to(args: Any) -> bool:
    """Add the middleware to ``vllm serve``'s parsed arguments (``--middleware``), before vLLM builds
    its app. False when this vLLM has no such option: callers' trace headers then travel only where
    vLLM passes them itself."""
    middleware = getattr(args, targets.SERVE_MIDDLEWARE, None)
    if not isinstance(middleware, list):
        return False
    if MIDDLEWARE not in middleware:
        middleware.append(MIDDLEWARE)
    return True
