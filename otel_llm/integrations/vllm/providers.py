"""Where the vLLM integration's telemetry goes, and how its warnings stay visible under vLLM.

``OTEL_LLM_VLLM_CONFIGURE=1``: otel_llm builds its own providers from the ``OTEL_*`` variables
(``otel_llm.configure()``), once, in the process that serves requests, for `vllm serve` without the
opentelemetry-instrument wrapper. Under `vllm serve` a dependency of vLLM raises the root logger and its
handlers to ERROR, so otel_llm's logger gets its own level and a fallback handler.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

ENV_CONFIGURE = "OTEL_LLM_VLLM_CONFIGURE"


class _Configured:
    telemetry: Any = None  # the Telemetry of OTEL_LLM_VLLM_CONFIGURE=1, once built in this process


def configure_asked() -> bool:
    """Whether ``OTEL_LLM_VLLM_CONFIGURE`` asks otel_llm to build its own providers."""
    return os.environ.get(ENV_CONFIGURE, "").strip().lower() in ("1", "true", "yes")


def configured_telemetry() -> Any:
    """The Telemetry built for ``OTEL_LLM_VLLM_CONFIGURE=1`` in this process, None before."""
    return _Configured.telemetry


def configure_if_asked(options: dict[str, Any]) -> None:
    """With OTEL_LLM_VLLM_CONFIGURE=1, build providers from OTEL_* (once per process) and use them."""
    if not configure_asked():
        return
    if _Configured.telemetry is None:
        import atexit

        from opentelemetry import trace

        from otel_llm import configure

        # vLLM's own --otlp-traces-endpoint sets the global TracerProvider before the first request;
        # then ours stay private (passed to the trackers) and each exports to its own endpoint.
        set_global = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        # One instance per process: `vllm serve --api-server-count N` runs N API servers, each with its
        # own cumulative metrics; under one service.instance.id their streams would overwrite each
        # other in a backend. OTEL_RESOURCE_ATTRIBUTES still wins (configure() gives it precedence).
        instance = {"service.instance.id": uuid.uuid4().hex}
        _Configured.telemetry = configure(set_global=set_global, resource_attributes=instance)
        atexit.register(_Configured.telemetry.shutdown)
    options.setdefault("tracer_provider", _Configured.telemetry.tracer_provider)
    options.setdefault("meter_provider", _Configured.telemetry.meter_provider)


class _UnlessHandled(logging.StreamHandler):
    """Writes otel_llm's records to stderr only when no root handler would take them.

    Under `vllm serve`, a dependency of vLLM sets the root logger and its handlers to ERROR
    (model_hosting_container_standards), so a library's warnings vanish. Records still propagate as
    usual; this handler is the fallback where they would be dropped.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if any(record.levelno >= h.level for h in logging.getLogger().handlers):
            return
        super().emit(record)


def make_warnings_visible() -> None:
    """otel_llm's warnings (a missing engine-core plugin, a stop) must show under vLLM, whose
    dependencies raise the root logger to ERROR: the package logger gets its own level and a fallback
    handler, unless the application configured it."""
    package_logger = logging.getLogger("otel_llm")
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.WARNING)
    if not any(isinstance(h, _UnlessHandled) for h in package_logger.handlers):
        handler = _UnlessHandled()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
        package_logger.addHandler(handler)
