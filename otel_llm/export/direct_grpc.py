"""The SDK's OTLP/gRPC span exporter, encoding with ``otel_llm.export.otlp_wire``.

Everything but the encoding stays the SDK's: endpoint, headers, TLS, compression, timeout and retries,
all read from the OTEL_* variables as before. The seam is ``_translate_data``, the method the SDK's gRPC
exporter base declares for each signal's exporter to turn SDK data into the request (present from SDK
1.35 to 1.45, the range tested). The bytes are parsed into the SDK's request message, since the gRPC stub
serializes a message; parsing is C code in protobuf and costs about a tenth of the encoding saved.

Where a release lacks the seam, the SDK's exporter is used as it is (the same request, encoded by the
SDK), with one log line saying so. Should the encoder fail on a batch, that batch is encoded by the SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from otel_llm.export.otlp_wire import encode_spans

_log = logging.getLogger("otel_llm")


def grpc_span_exporter() -> SpanExporter:
    """An OTLP/gRPC span exporter configured from the environment, as the SDK's own is."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if not callable(getattr(OTLPSpanExporter, "_translate_data", None)):
        _log.info(
            "otel_llm: this SDK's OTLP/gRPC span exporter has no _translate_data; the SDK encodes spans"
        )
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    class WireGrpcSpanExporter(OTLPSpanExporter):
        """``OTLPSpanExporter`` whose request is written by ``otel_llm.export.otlp_wire``."""

        _failed = False

        def _translate_data(self, data: Sequence[Any]) -> Any:
            try:
                return ExportTraceServiceRequest.FromString(encode_spans(data))
            except Exception:  # a bug of ours must not lose the batch: the SDK encodes it
                if not WireGrpcSpanExporter._failed:
                    WireGrpcSpanExporter._failed = True
                    _log.exception("otel_llm: encoding spans failed; the SDK's encoder takes this batch")
                return sdk_encode_spans(data)

    return WireGrpcSpanExporter()
