"""Which exporter each signal gets, decided from the standard OTEL_* environment variables.

otel_llm reads only what decides the choice: the exporter kind (``OTEL_TRACES_EXPORTER`` /
``OTEL_METRICS_EXPORTER``), whether an OTLP endpoint is configured, and the protocol. Everything else
(endpoint URLs and the HTTP ``/v1/<signal>`` path rule, headers, compression, timeouts, certificates,
TLS) is read by the SDK's own OTLP exporters, which are built without arguments for that reason.
"""

from __future__ import annotations

import os
from typing import Literal

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

Signal = Literal["traces", "metrics"]
Destination = Literal["otlp", "file", "none"]

PROTOCOL_GRPC = "grpc"
PROTOCOL_HTTP = "http/protobuf"
# The OpenTelemetry specification's default transport.
DEFAULT_PROTOCOL = PROTOCOL_HTTP
_PROTOCOLS = (PROTOCOL_GRPC, PROTOCOL_HTTP)

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
# Who writes OTLP/gRPC span requests: otel_llm's encoder (``otel_llm.export.otlp_wire``), or the SDK's.
ENV_ENCODER = "OTEL_LLM_OTLP_ENCODER"
ENCODER_OTEL_LLM, ENCODER_SDK = "otel_llm", "sdk"
# "otlp" is the standard default; "file" forces the OTLP-JSON files even when an endpoint is set.
_KINDS = ("otlp", "file", "none")


def _env(name: str) -> str:
    return os.environ.get(name, "").strip()


def _signal_env(signal: Signal, suffix: str) -> str:
    return f"OTEL_EXPORTER_OTLP_{signal.upper()}_{suffix}"


def endpoint_configured(signal: Signal) -> bool:
    """True when the generic or the per-signal OTLP endpoint variable is set and non-empty."""
    return bool(_env(_signal_env(signal, "ENDPOINT")) or _env(ENV_ENDPOINT))


def protocol(signal: Signal) -> str:
    """The signal's OTLP protocol: the per-signal variable, else the generic one, else http/protobuf.

    Raises ValueError for any value other than ``grpc`` or ``http/protobuf``, naming the variable.
    """
    for name in (_signal_env(signal, "PROTOCOL"), ENV_PROTOCOL):
        value = _env(name)
        if not value:
            continue
        if value.lower() in _PROTOCOLS:
            return value.lower()
        hint = " (otel_llm ships no OTLP/JSON-over-HTTP exporter)" if value.lower() == "http/json" else ""
        raise ValueError(
            f"{name}={value!r} is not supported{hint}: set it to 'grpc' (collector port 4317) or "
            f"'http/protobuf' (collector port 4318), or unset it for the default {DEFAULT_PROTOCOL!r}"
        )
    return DEFAULT_PROTOCOL


def encoder() -> str:
    """``otel_llm`` (the default) or ``sdk``, from ``OTEL_LLM_OTLP_ENCODER``; ValueError for anything else."""
    value = _env(ENV_ENCODER).lower() or ENCODER_OTEL_LLM
    if value not in (ENCODER_OTEL_LLM, ENCODER_SDK):
        raise ValueError(
            f"{ENV_ENCODER}={value!r} is not supported: set it to {ENCODER_OTEL_LLM!r} (the default: "
            f"otel_llm writes OTLP/gRPC span requests itself) or {ENCODER_SDK!r} (the SDK's encoder), or "
            "unset it"
        )
    return value


def destination(signal: Signal) -> Destination:
    """Where a signal goes: ``otlp`` (an endpoint is configured), ``file`` (the embedded default) or ``none``.

    Raises ValueError for an ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` value otel_llm cannot
    honour, and validates the protocol even when it ends up unused, so a typo fails at start-up.
    """
    name = f"OTEL_{signal.upper()}_EXPORTER"
    kind = _env(name).lower() or "otlp"
    if kind not in _KINDS:
        raise ValueError(
            f"{name}={kind!r} is not supported by otel_llm.configure(): set it to 'otlp' (the default: "
            f"OTLP when an endpoint is configured, else OTLP-JSON files), 'file' or 'none'"
        )
    protocol(signal)
    if signal == "traces":
        encoder()
    if kind == "otlp" and not endpoint_configured(signal):
        return "file"
    return kind  # type: ignore[return-value]


def otlp_span_exporter(signal_protocol: str) -> SpanExporter:
    """The SDK's OTLP span exporter for the protocol, configured entirely from the environment (over gRPC,
    with otel_llm's own encoder, ``otel_llm.export.direct_grpc``, unless ``OTEL_LLM_OTLP_ENCODER=sdk``)."""
    # Imported here so a process that exports over one protocol (or to files) never loads the other stack.
    if signal_protocol == PROTOCOL_GRPC:
        if encoder() == ENCODER_SDK:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()
        from otel_llm.export.direct_grpc import grpc_span_exporter

        return grpc_span_exporter()
    # The HTTP exporter encodes inside its export(), which differs between SDK releases: it keeps the
    # SDK's encoder.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    return HttpSpanExporter()


def otlp_metric_exporter(signal_protocol: str) -> MetricExporter:
    """The SDK's OTLP metric exporter; it reads temporality and histogram aggregation preferences itself."""
    if signal_protocol == PROTOCOL_GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()


_SIGNAL_PATHS = ("/v1/traces", "/v1/metrics", "/v1/logs")


def signal_path_mistake(url: str | None = None) -> str | None:
    """What is wrong when the generic endpoint (``url``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``) ends in a
    signal's path, as in ``http://localhost:4318/v1/traces``, and a signal takes it over OTLP/HTTP: the
    exporter appends ``/v1/<signal>`` to the generic endpoint, so the collector would answer 404. None
    when that is not so (gRPC ignores the path; a per-signal endpoint is used as given)."""
    from urllib.parse import urlsplit

    raw = (url if url is not None else _env(ENV_ENDPOINT)).strip()
    path = urlsplit(raw).path.rstrip("/") if "://" in raw else ""
    ending = next((p for p in _SIGNAL_PATHS if path.endswith(p)), None)
    if ending is None:
        return None
    over_http = [
        s
        for s in ("traces", "metrics")
        if not _env(_signal_env(s, "ENDPOINT")) and _protocol_or_default(s) == PROTOCOL_HTTP
    ]
    if not over_http:
        return None
    base = raw.rstrip("/")[: -len(ending)]
    signal: Signal = "metrics" if ending == "/v1/metrics" else "traces"  # logs: the traces' example
    return (
        f"ends in {ending}, and the OTLP/HTTP exporter adds /v1/{over_http[0]} to it (POST "
        f"{base}{ending}/v1/{over_http[0]}, which a collector answers 404): set {ENV_ENDPOINT}={base} (the "
        f"base URL), or {_signal_env(signal, 'ENDPOINT')}={base}/v1/{signal} (a full URL, used as given) "
        f"for {signal} alone"
    )


def _protocol_or_default(signal: Signal) -> str:
    """``protocol(signal)``, or the default where that raises (the protocol's own check says why)."""
    try:
        return protocol(signal)
    except ValueError:
        return DEFAULT_PROTOCOL


def endpoint_url(signal: Signal) -> str:
    """The URL a signal's OTLP exporter sends to: the per-signal variable, else the generic one."""
    return _env(_signal_env(signal, "ENDPOINT")) or _env(ENV_ENDPOINT)


def endpoint_urls() -> list[str]:
    """The distinct OTLP endpoint URLs the current environment sends to (none for files)."""
    urls: list[str] = []
    signals: tuple[Signal, ...] = ("traces", "metrics")
    for signal in signals:
        if destination(signal) == "otlp":
            url = endpoint_url(signal)
            if url and url not in urls:
                urls.append(url)
    return urls


def unreachable(url: str, timeout_s: float) -> str | None:
    """Why nothing accepts a TCP connection at ``url``'s host and port (in words), or None when something
    does. One connection attempt, at most ``timeout_s`` seconds."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url if "://" in url else f"http://{url}")  # gRPC endpoints may omit the scheme
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "localhost", port), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
