"""OTLP JSON lines files: the embedded default when no OTLP endpoint is configured.

Each line of ``traces.jsonl`` is one ``ExportTraceServiceRequest`` and each line of ``metrics.jsonl`` one
``ExportMetricsServiceRequest``, in the OTLP/JSON encoding of the OpenTelemetry specification: the
official protobuf messages (built by opentelemetry-exporter-otlp-proto-common's encoders, the same code
the OTLP exporters use) written with the protobuf JSON mapping, camelCase keys, enums as integers, and
trace / span ids as lowercase hex strings instead of the mapping's base64. That is the format the
OpenTelemetry Collector's ``file`` exporter writes and its ``otlpjsonfile`` receiver reads, so the files
can be replayed into Jaeger, Tempo or any OTLP backend later.

The exporters never raise into the SDK pipeline: a write that fails (disk full, directory gone,
permissions) returns FAILURE and is logged once per exporter. Appends are thread-safe and each line goes
to the file in a single ``write`` on an ``O_APPEND`` descriptor, so on a local filesystem several
processes can append to one file without interleaving their lines.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_llm.export.preferences import aggregation_from_env, temporality_from_env

_logger = logging.getLogger(__name__)

__all__ = ["METRICS_FILE", "TRACES_FILE", "OtlpJsonMetricExporter", "OtlpJsonSpanExporter", "to_otlp_json"]

TRACES_FILE = "traces.jsonl"
METRICS_FILE = "metrics.jsonl"

# OTLP/JSON differs from the plain protobuf JSON mapping only here: these bytes fields are hex.
_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _ids_to_hex(node: Any) -> Any:
    """Rewrite base64 id fields to lowercase hex, in place, anywhere in a MessageToDict tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _ids_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _ids_to_hex(item)
    return node


_encode_failures_logged: set[str] = set()


def _log_encode_failure_once(what: str) -> None:
    """Log (with the traceback) the first batch of ``what`` that could not be encoded; later ones quietly."""
    if what not in _encode_failures_logged:
        _encode_failures_logged.add(what)
        _logger.exception("otel_llm could not encode %s as OTLP JSON; such batches are dropped", what)


def to_otlp_json(message: Message) -> str:
    """One OTLP export request as a single OTLP/JSON line, newline included."""
    tree = MessageToDict(message, use_integers_for_enums=True)
    return json.dumps(_ids_to_hex(tree), separators=(",", ":"), ensure_ascii=False) + "\n"


class _JsonLinesFile:
    """Appends whole lines to one file; opened lazily, reopened after a failure, never raises."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._failed_once = False
        # Set when a write stopped part way, so the next line starts on a fresh line.
        self._torn = False

    def append(self, line: str) -> bool:
        data = line.encode("utf-8")
        with self._lock:
            if self._closed:
                return False
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                if self._torn:
                    data = b"\n" + data
                    self._torn = False
                self._write_all(self._fd, data)
                return True
            except OSError as error:
                self._drop_fd()
                if not self._failed_once:
                    self._failed_once = True
                    _logger.error(
                        "otel_llm cannot write %s (%s); telemetry for it is being dropped", self.path, error
                    )
                return False

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        written = 0
        while written < len(view):
            try:
                written += os.write(fd, view[written:])
            except OSError:
                self._torn = written > 0
                raise

    def _drop_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop_fd()


class OtlpJsonSpanExporter(SpanExporter):
    """Writes each span batch as one ``ExportTraceServiceRequest`` line to ``<directory>/traces.jsonl``."""

    def __init__(self, directory: str | os.PathLike[str], filename: str = TRACES_FILE) -> None:
        self._file = _JsonLinesFile(Path(directory) / filename)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = to_otlp_json(encode_spans(spans))
        except Exception:  # never into the pipeline; a span the encoder rejects is a bug to see, once
            _log_encode_failure_once("spans")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self._file.append(line) else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        # Every export is written before it returns; nothing is buffered here.
        return True

    def shutdown(self) -> None:
        self._file.close()


class OtlpJsonMetricExporter(MetricExporter):
    """Writes each collection as one ``ExportMetricsServiceRequest`` line to ``<directory>/metrics.jsonl``.

    Temporality and histogram aggregation follow the same environment variables as the OTLP exporters.
    """

    def __init__(self, directory: str | os.PathLike[str], filename: str = METRICS_FILE) -> None:
        super().__init__(
            preferred_temporality=temporality_from_env(),
            preferred_aggregation=aggregation_from_env(),
        )
        self._file = _JsonLinesFile(Path(directory) / filename)

    @property
    def path(self) -> Path:
        return self._file.path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if not metrics_data.resource_metrics:
            return MetricExportResult.SUCCESS
        try:
            line = to_otlp_json(encode_metrics(metrics_data))
        except Exception:  # never into the pipeline
            _log_encode_failure_once("metrics")
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS if self._file.append(line) else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._file.close()
