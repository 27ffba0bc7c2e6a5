"""A lost export is counted under what the collector answered, not as an unexplained failure.

Real receivers (tests/otlp_receivers.py) answer each export with one HTTP status or gRPC status; the
SDK's own OTLP exporters send to them through configure()'s pipeline, in both export modes (the
engine's process, and the export process). The expected reason of each answer is written out here from
the OTLP specification's meaning of the status, not read from otel_llm.
"""

from __future__ import annotations

import time

import grpc
import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver, Mode, closed_port, drive_scenario

from otel_llm import RequestTracker
from otel_llm.setup import configure

pytestmark = pytest.mark.both_modes

# (receiver, its answer, the protocol, the reason a user reads)
ANSWERS = [
    (HttpReceiver, 404, "http/protobuf", "export_not_found"),
    (HttpReceiver, 401, "http/protobuf", "export_unauthorized"),
    (HttpReceiver, 403, "http/protobuf", "export_unauthorized"),
    (HttpReceiver, 413, "http/protobuf", "export_too_large"),
    (GrpcReceiver, grpc.StatusCode.UNIMPLEMENTED, "grpc", "export_not_found"),
    (GrpcReceiver, grpc.StatusCode.UNAUTHENTICATED, "grpc", "export_unauthorized"),
    (GrpcReceiver, grpc.StatusCode.PERMISSION_DENIED, "grpc", "export_unauthorized"),
    (GrpcReceiver, grpc.StatusCode.RESOURCE_EXHAUSTED, "grpc", "export_too_large"),
]


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)
    # Answers the SDK retries (unavailable, too large over gRPC) are retried for at most this long.
    env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")


def lost_after_shutdown(env: pytest.MonkeyPatch, endpoint: str, protocol: str) -> tuple[dict, dict]:
    """Three requests' spans and metric points sent to ``endpoint``; what was lost, by reason."""
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry = configure(set_global=False, shutdown_timeout_s=8.0)
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    drive_scenario(tracker, time.monotonic() - 5.0)
    telemetry.shutdown()
    return telemetry.delivery("spans")[1], telemetry.delivery("metric_points")[1]


@pytest.mark.parametrize(
    ("receiver_type", "answer", "protocol", "reason"),
    ANSWERS,
    ids=[f"{p}-{getattr(a, 'name', a)}" for _, a, p, _ in ANSWERS],
)
def test_a_refused_export_is_counted_under_the_collectors_answer(
    env, receiver_type, answer, protocol: str, reason: str
) -> None:
    with receiver_type(mode=Mode.REFUSE, answer=answer) as receiver:
        spans, points = lost_after_shutdown(env, receiver.endpoint, protocol)
        assert receiver.collected.refused > 0  # the answer was given, and nothing was kept
    assert set(spans) == {reason} and spans[reason] > 0, spans
    assert set(points) == {reason} and points[reason] > 0, points


@pytest.mark.parametrize(
    ("receiver_type", "protocol"), [(HttpReceiver, "http/protobuf"), (GrpcReceiver, "grpc")]
)
def test_an_unavailable_collector_and_one_that_never_answers_are_told_apart(
    env, receiver_type, protocol: str
) -> None:
    with receiver_type(mode=Mode.REFUSE) as receiver:  # 503 / UNAVAILABLE, retried until the timeout
        spans, _ = lost_after_shutdown(env, receiver.endpoint, protocol)
    assert set(spans) == {"export_unavailable"}, spans
    with receiver_type(mode=Mode.BLACK_HOLE) as receiver:
        env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
        spans, _ = lost_after_shutdown(env, receiver.endpoint, protocol)
    # Past the export timeout, or still waiting when the shutdown gave up on it.
    assert set(spans) <= {"export_timed_out", "unsent_at_shutdown"} and spans, spans


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_nothing_listening_stays_an_export_failure(env, protocol: str) -> None:
    spans, points = lost_after_shutdown(env, f"http://127.0.0.1:{closed_port()}", protocol)
    assert set(spans) <= {"export_failed", "unsent_at_shutdown"} and spans, spans
    assert "export_unavailable" not in points and "export_timed_out" not in points, points


@pytest.mark.parametrize(("answer", "words"), [(404, "not found"), (401, "unauthorized")])
def test_the_runs_summary_line_says_what_the_collector_answered(env, answer: int, words: str) -> None:
    from otel_llm.kit.commands._common import delivery_lines

    with HttpReceiver(mode=Mode.REFUSE, answer=answer) as receiver:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        telemetry = configure(set_global=False, shutdown_timeout_s=8.0)
        tracker = RequestTracker(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        )
        drive_scenario(tracker, time.monotonic() - 5.0)
        lines = delivery_lines(telemetry)
    spans = next(line for line in lines if line.startswith("traces: "))
    assert " 0 spans delivered, " in spans and words in spans, spans
    assert "unreachable" not in spans, spans


def test_configure_warns_of_a_signal_path_in_the_generic_endpoint(env, caplog) -> None:
    # The CLI refuses it (tests/test_cli_config.py); a library builds as asked and says what to change.
    base = f"http://127.0.0.1:{closed_port()}"
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{base}/v1/metrics")
    with caplog.at_level("WARNING", logger="otel_llm"):
        configure(set_global=False, shutdown_timeout_s=0.5).shutdown()
    said = [
        r.getMessage() for r in caplog.records if r.name.startswith("otel_llm") and "/v1/" in r.getMessage()
    ]
    assert len(said) == 1 and f"OTEL_EXPORTER_OTLP_ENDPOINT={base} " in said[0], said
    assert "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=" in said[0], said


def test_a_deadline_after_failed_connects_is_no_answer() -> None:
    """On a busy machine gRPC can spend an export's whole deadline retrying a refused connection and
    then report DEADLINE_EXCEEDED: nobody ever took the connection, so it is not "timed out" (a
    collector too slow to answer). A deadline with no failed connect before it stays timed out.

    Real gRPC calls through the stub wrapper the exporters get: one to a closed port (refused), one
    to a receiver that never answers (its deadline passes)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    from otel_llm.export import answers

    hole = GrpcReceiver(mode=Mode.BLACK_HOLE)
    hole.start()
    try:
        book = answers.Answers()

        def call(port: int) -> None:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = answers._NotingStub(trace_service_pb2_grpc.TraceServiceStub(channel), book)
                with pytest.raises(grpc.RpcError):
                    stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=0.5)

        book.begin()
        call(closed_port())
        call(hole.port)
        after_refusals = book.reason()
        book.begin()
        call(hole.port)
        alone = book.reason()
    finally:
        hole.stop()
    assert (after_refusals, alone) == (None, answers.TIMED_OUT)
