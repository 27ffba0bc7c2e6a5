"""``configure()``: tracer and meter providers from the standard OTEL_* environment variables.

Where each signal goes:

- an OTLP endpoint is configured for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or the per-signal
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``): the SDK's OTLP
  exporter over ``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` or ``http/protobuf``, the default), which reads
  headers, compression, timeout and TLS settings itself;
- no endpoint: OTLP JSON lines files, ``traces.jsonl`` and ``metrics.jsonl``, in ``./otel-llm-output/``
  (or ``output_dir=`` / ``OTEL_LLM_OUTPUT_DIR``), replayable into any OTLP backend later;
- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` = ``none``: nowhere; ``file``: files even when an
  endpoint is set. ``OTEL_SDK_DISABLED=true`` turns everything off (no-op providers, no files).

Where otel_llm's own spans and metric values are built and exported (``export_mode=`` or
``OTEL_LLM_EXPORT_MODE``): ``process`` (the default), an export process beside the engine's, fed with
each finished request's record (``otel_llm.export.channel``): the engine's process pays a few
microseconds per request, not the spans' building and encoding; ``in_process``: in the engine's process,
on the thread that finishes the request. Either way the providers returned serve identity (a request's
ids, the sampler's decision for ``traceparent()``) and whatever else the application traces and
measures, exported from the engine's process.

Example::

    import otel_llm

    telemetry = otel_llm.configure(service_name="my-engine")
    tracker = otel_llm.RequestTracker(model="my-model")   # uses the global providers set above
    ...
    telemetry.shutdown()                                   # bounded, even with the collector down
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from otel_llm.export import channel as export_channel
from otel_llm.export import otlp, quiet
from otel_llm.export.config_file import ENV_CONFIG_FILE, declarative_config_file, from_config_file
from otel_llm.export.counting import (
    CountingBatchSpanProcessor,
    CountingMetricExporter,
    DropCounter,
    register_self_metrics,
)
from otel_llm.export.otlp_json import OtlpJsonMetricExporter, OtlpJsonSpanExporter
from otel_llm.export.telemetry import Telemetry
from otel_llm.hooks.identity import new_span_id, new_trace_id

__all__ = ["Telemetry", "configure"]

_logger = logging.getLogger(__name__)

ENV_OUTPUT_DIR = "OTEL_LLM_OUTPUT_DIR"
ENV_SHUTDOWN_TIMEOUT = "OTEL_LLM_SHUTDOWN_TIMEOUT"
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
DEFAULT_OUTPUT_DIR = "otel-llm-output"
# Long enough for a final export to a healthy collector, short enough that a stopping engine with an
# unreachable collector is not held up noticeably.
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0

_global_lock = threading.Lock()
_global_telemetry: Telemetry | None = None


def configure(
    *,
    service_name: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    set_global: bool = True,
    resource_attributes: Mapping[str, Any] | None = None,
    shutdown_timeout_s: float | None = None,
    views: Sequence[View] = (),
    export_mode: str | None = None,
    exporter_logs: str | None = None,
) -> Telemetry:
    """Build tracer and meter providers from the environment and return their handle.

    Args:
        service_name: ``service.name`` when the environment sets none (``OTEL_SERVICE_NAME`` and a
            ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` win, so operators can rename a deployment).
        output_dir: directory of the OTLP-JSON files for signals without an endpoint; default
            ``OTEL_LLM_OUTPUT_DIR``, else ``./otel-llm-output`` (resolved against the current directory now).
        set_global: also install the providers as OpenTelemetry's global ones. OpenTelemetry allows that
            once per process: a second ``configure(set_global=True)`` returns the first handle unchanged
            (with a warning); if other code already set the globals, the new providers are returned
            without becoming global (and a warning says so).
        resource_attributes: extra resource attributes; the environment's take precedence.
        shutdown_timeout_s: bound in seconds of ``Telemetry.shutdown()`` / ``force_flush()``; default
            ``OTEL_LLM_SHUTDOWN_TIMEOUT``, else 5.
        views: metric views; they apply to otel_llm's histograms too (new bucket boundaries, a rename,
            ``DropAggregation``, exponential buckets): a histogram a View matches is recorded through an
            SDK histogram, at the SDK's cost per value. Views keep otel_llm's telemetry in this process
            (export mode ``in_process``).
        export_mode: ``process`` (otel_llm's spans and metric values built and exported by an export
            process beside this one, started when the first request finishes) or ``in_process``; default
            ``OTEL_LLM_EXPORT_MODE``, else ``process``. Trackers on the returned providers (or on the
            global ones, when this call set them) and without a ``span_hook`` use it.
        exporter_logs: ``show`` (the SDK exporters' warnings and errors, retries included, as they log
            them) or ``count`` (counted, not written: ``Telemetry.exporter_lines()``; for a command that
            reports deliveries itself); default ``OTEL_LLM_EXPORTER_LOGS``, else ``show``.

    Raises:
        ValueError: an unsupported ``OTEL_EXPORTER_OTLP_*PROTOCOL``, ``OTEL_*_EXPORTER`` or export mode
            value, or a bad shutdown timeout. Nothing is built in that case.

    Sampling (``OTEL_TRACES_SAMPLER`` / ``_ARG``), the metric export interval
    (``OTEL_METRIC_EXPORT_INTERVAL``, ms) and the batch span processor (``OTEL_BSP_*``) are read by the
    SDK as usual.
    """
    global _global_telemetry
    timeout_s = shutdown_timeout(shutdown_timeout_s)
    mode = export_channel.export_mode(export_mode) or export_channel.MODE_PROCESS
    max_queue = export_channel.queue_size()
    logs = quiet.exporter_logs(exporter_logs)
    with _global_lock:
        if set_global and _global_telemetry is not None and not _global_telemetry.is_shutdown:
            _logger.warning(
                "otel_llm.configure() already set the global providers; returning that handle "
                "(the arguments and environment of this call are not applied)"
            )
            return _global_telemetry
        config_file = declarative_config_file()
        if config_file is not None:
            telemetry = from_config_file(config_file, service_name, resource_attributes, timeout_s, views)
        else:
            if os.environ.get(ENV_CONFIG_FILE, "").strip():
                _logger.warning(
                    "otel_llm: %s is set, but this OpenTelemetry install cannot read it (it needs the "
                    "opentelemetry-configuration package, SDK 1.43 or later); using the OTEL_* variables",
                    ENV_CONFIG_FILE,
                )
            mistake = None if _disabled() else otlp.signal_path_mistake()
            if mistake is not None:  # the CLI refuses it; a library warns and builds as asked
                _logger.warning(
                    "otel_llm: %s=%s %s", otlp.ENV_ENDPOINT, os.environ[otlp.ENV_ENDPOINT], mistake
                )
            beside = mode == export_channel.MODE_PROCESS and not views and not _disabled()
            # Beside an export process, otel_llm's self-metrics are the export process's to report.
            telemetry = _build(service_name, output_dir, resource_attributes, timeout_s, views, not beside)
            if beside:
                _export_beside(
                    telemetry, service_name, output_dir, resource_attributes, timeout_s, max_queue, logs
                )
        if logs == quiet.COUNT:
            telemetry.count_exporter_lines()
        if set_global and _install_global(telemetry):
            _global_telemetry = telemetry
        return telemetry


def _export_beside(
    telemetry: Telemetry,
    service_name: str | None,
    output_dir: str | os.PathLike[str] | None,
    resource_attributes: Mapping[str, Any] | None,
    timeout_s: float,
    max_queue: int,
    logs: str,
) -> None:
    """Give ``telemetry`` an export process for otel_llm's own spans and metrics (started on first use),
    set up as this call's pipeline: the same settings, and this process's environment as it is now."""
    directory = telemetry.output_dir if telemetry.output_dir is not None else output_dir
    settings = {
        "service_name": service_name,
        "output_dir": None if directory is None else str(directory),
        "resource_attributes": dict(resource_attributes) if resource_attributes else {},
        "shutdown_timeout_s": timeout_s,
        "exporter_logs": logs,
    }
    channel = export_channel.ExportChannel(settings, dict(os.environ), max_queue)
    channel.count_engine_drops(telemetry.local_drops)
    export_channel.register(telemetry.tracer_provider, telemetry.meter_provider, channel)
    telemetry.attach_channel(channel)


def build_export_pipeline(
    settings: Mapping[str, Any], engine_drops: Callable[[], dict[str, dict[str, int]]]
) -> Telemetry:
    """The export process's pipeline (``otel_llm.export.process``): what ``configure()`` in the engine's
    process would build in export mode ``in_process``, from the settings it was given and the environment
    the export process inherited; ``engine_drops``: the engine's own pipeline's losses, reported with
    this pipeline's in ``otel_llm.export.*.dropped``."""
    timeout_s = shutdown_timeout(settings.get("shutdown_timeout_s"))
    service_name = settings.get("service_name")
    resource_attributes = settings.get("resource_attributes") or None
    config_file = declarative_config_file()
    if config_file is not None:
        telemetry = from_config_file(config_file, service_name, resource_attributes, timeout_s, ())
    else:
        directory = settings.get("output_dir")
        telemetry = _build(service_name, directory, resource_attributes, timeout_s, (), True, engine_drops)
    if settings.get("exporter_logs") == quiet.COUNT:
        telemetry.count_exporter_lines()
    return telemetry


def _disabled() -> bool:
    return os.environ.get(ENV_SDK_DISABLED, "").strip().lower() == "true"


def _build(
    service_name: str | None,
    output_dir: str | os.PathLike[str] | None,
    resource_attributes: Mapping[str, Any] | None,
    timeout_s: float,
    views: Sequence[View],
    self_metrics: bool = True,
    more_drops: Callable[[], dict[str, dict[str, int]]] | None = None,
) -> Telemetry:
    if _disabled():
        _logger.info("otel_llm: %s=true, telemetry is off", ENV_SDK_DISABLED)
        return Telemetry(
            trace.NoOpTracerProvider(), metrics.NoOpMeterProvider(), shutdown_timeout_s=timeout_s
        )
    # Decide (and validate) both signals before building anything, so bad configuration leaves no threads.
    traces_to, metrics_to = otlp.destination("traces"), otlp.destination("metrics")
    directory = _output_dir(output_dir) if "file" in (traces_to, metrics_to) else None
    resource = _resource(service_name, resource_attributes)

    # Every span or metric point the pipeline loses is counted here and exported as a self-metric.
    drops = DropCounter()
    span_exporter = _span_exporter(traces_to, directory)
    metric_exporter = _metric_exporter(metrics_to, directory, drops)
    readers = [PeriodicExportingMetricReader(metric_exporter)] if metric_exporter is not None else []
    meter_provider = MeterProvider(
        resource=resource, metric_readers=readers, views=list(views), shutdown_on_exit=False
    )
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False, id_generator=_IdGenerator())
    processor = None
    if span_exporter is not None:
        processor = CountingBatchSpanProcessor(span_exporter, drops, meter_provider=meter_provider)
        tracer_provider.add_span_processor(processor)
    if self_metrics:
        depth = processor.queue_depth if processor is not None else None
        register_self_metrics(meter_provider, drops, depth, more_drops)
    _logger.info(
        "otel_llm: traces -> %s, metrics -> %s",
        _describe(traces_to, "traces", directory),
        _describe(metrics_to, "metrics", directory),
    )
    return Telemetry(
        tracer_provider,
        meter_provider,
        exporters=[e for e in (span_exporter, metric_exporter) if e is not None],
        output_dir=directory,
        shutdown_timeout_s=timeout_s,
        drops=drops,
    )


def _span_exporter(to: str, directory: Path | None) -> SpanExporter | None:
    if to == "otlp":
        return otlp.otlp_span_exporter(otlp.protocol("traces"))
    if to == "file" and directory is not None:
        return OtlpJsonSpanExporter(directory)
    return None


def _metric_exporter(to: str, directory: Path | None, drops: DropCounter) -> MetricExporter | None:
    inner: MetricExporter
    if to == "otlp":
        inner = otlp.otlp_metric_exporter(otlp.protocol("metrics"))
    elif to == "file" and directory is not None:
        inner = OtlpJsonMetricExporter(directory)
    else:
        return None
    # otel_llm's own histograms join every collection of the provider (otel_llm.sdk_bridge), so they
    # pass through this counting wrapper like any SDK point.
    return CountingMetricExporter(inner, drops)


def _resource(service_name: str | None, extra: Mapping[str, Any] | None) -> Resource:
    code: dict[str, Any] = dict(extra or {})
    if service_name:
        code[SERVICE_NAME] = service_name
    # Resource.create() lets code override the environment; merging the environment's attributes
    # (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) on top again gives the operator the last word.
    return Resource.create(code).merge(OTELResourceDetector().detect())


def _output_dir(arg: str | os.PathLike[str] | None) -> Path:
    chosen = arg if arg is not None else (os.environ.get(ENV_OUTPUT_DIR, "").strip() or DEFAULT_OUTPUT_DIR)
    return Path(chosen).expanduser().absolute()


def shutdown_timeout(arg: float | None) -> float:
    """``arg``, else ``OTEL_LLM_SHUTDOWN_TIMEOUT``, else 5 (seconds); ValueError naming the bad one."""
    raw: float | str
    if arg is not None:
        source, raw = "shutdown_timeout_s", arg
    else:
        source, raw = ENV_SHUTDOWN_TIMEOUT, os.environ.get(ENV_SHUTDOWN_TIMEOUT, "").strip()
        if not raw:
            return DEFAULT_SHUTDOWN_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{source}={raw!r}: pass a positive number of seconds, e.g. 5")
    return value


def _install_global(telemetry: Telemetry) -> bool:
    """Make the providers global; False (and a warning) when other code got there first."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _logger.warning(
            "otel_llm.configure(): a global TracerProvider was already set by other code; the new providers "
            "are not global, pass them to RequestTracker(tracer_provider=..., meter_provider=...)"
        )
        return False
    trace.set_tracer_provider(telemetry.tracer_provider)
    metrics.set_meter_provider(telemetry.meter_provider)
    if metrics.get_meter_provider() is not telemetry.meter_provider:
        _logger.warning(
            "otel_llm.configure(): a global MeterProvider was already set by other code; pass "
            "Telemetry.meter_provider to RequestTracker(meter_provider=...) to use otel_llm's metrics "
            "pipeline"
        )
    return True


def _describe(to: str, signal: otlp.Signal, directory: Path | None) -> str:
    if to == "otlp":
        return f"OTLP {otlp.protocol(signal)}"
    if to == "file" and directory is not None:
        return str(directory / f"{signal}.jsonl")
    return "nowhere"


class _IdGenerator(RandomIdGenerator):
    """The SDK's random ids, drawn from otel_llm's own generator rather than the ``random`` module's
    shared one, which engines seed (vLLM: ``random.seed(0)`` by default where its engine core runs), so
    that processes seeded alike would otherwise draw the same trace and span ids."""

    # The hook side draws a request's ids from that generator itself (otel_llm.hooks.identity).
    draws_otel_llm_ids = True

    def generate_span_id(self) -> int:
        return new_span_id()

    def generate_trace_id(self) -> int:
        return new_trace_id()
