"""An OpenAI-compatible HTTP server (FastAPI) around the reference engine, with trace propagation.

``create_app(engine)`` gives the ASGI app; ``otel-llm serve`` runs it under uvicorn. Needs the
``serve`` extra (fastapi, uvicorn) besides ``torch``.
"""

from __future__ import annotations

from otel_llm.kit.server.app import HEADER_REQUEST_ID, HEADER_TRACE_ID, create_app
from otel_llm.kit.server.app import run as run_server

__all__ = ["HEADER_REQUEST_ID", "HEADER_TRACE_ID", "create_app", "run_server"]
