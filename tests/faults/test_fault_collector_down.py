"""Collector absent (connection refused) and collector black hole (accepts, never answers).

The promise checked: the engine's hook calls return while the exporter is failing or stuck (they run on
a thread joined with a deadline far shorter than the exporter would hold them), every span the pipeline
was given and lost is counted (received + dropped == produced, with nothing received), metric points lost
are counted too, and ``shutdown()`` returns within its bound.
"""

from __future__ import annotations

import pytest
from fault_tools import balanced, build, dropped_spans, on_thread, received_span_ids, serve, wait_for
from otlp_receivers import GrpcReceiver, HttpReceiver, Mode, closed_port

from otel_llm.export.counting import METRIC_POINTS, REASON_EXPORT_FAILED, REASON_QUEUE_FULL, SPANS

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


PROTOCOLS = [pytest.param("grpc", id="grpc"), pytest.param("http/protobuf", id="http")]
RECEIVERS = [
    pytest.param(GrpcReceiver, "grpc", id="grpc"),
    pytest.param(HttpReceiver, "http/protobuf", id="http"),
]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_refused_connection_every_lost_span_and_point_is_counted(env, started, protocol) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(200)))

    assert wait_for(lambda: produced.count > 0)
    assert wait_for(lambda: balanced(0, dropped_spans(telemetry), produced.count)), (
        dropped_spans(telemetry),
        produced.count,
    )
    # The default queue (2048) holds these 200 requests: all were lost by the exporter giving up, as a
    # connection nobody took (also when gRPC's deadline passed while it still tried to connect).
    spans = {reason: n for reason, n in telemetry.drops.by_reason(SPANS).items() if n}
    assert spans == {REASON_EXPORT_FAILED: produced.count}, spans

    on_thread(lambda: telemetry.force_flush(timeout_s=10))
    assert wait_for(lambda: telemetry.drops.total(METRIC_POINTS) > 0)


@pytest.mark.parametrize(("receiver_type", "protocol"), RECEIVERS)
def test_black_hole_hooks_never_wait_and_shutdown_is_bounded(env, started, receiver_type, protocol) -> None:
    receiver = receiver_type(mode=Mode.BLACK_HOLE)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    # Each export hangs for 2 s: had the hooks waited for even one export per batch of 16 spans, the
    # 500 requests (~2000 spans, 125 batches) would take minutes, not return within the join deadline.
    env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
    env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16")
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(500)))
    results: list[bool] = []
    on_thread(lambda: results.append(telemetry.shutdown(timeout_s=1.0)))

    assert results == [False]  # nothing was acknowledged in time, and the handle says so
    assert wait_for(lambda: balanced(0, dropped_spans(telemetry), produced.count)), (
        telemetry.drops.by_reason(SPANS),
        produced.count,
    )
    assert received_span_ids(receiver.collected) == []
    spans = telemetry.drops.by_reason(SPANS)
    # The exports the shutdown cut off: failed, or (in the export process, which then ends) unsent.
    cut_off = spans[REASON_EXPORT_FAILED] + spans.get("unsent_at_shutdown", 0)
    assert spans[REASON_QUEUE_FULL] > 0 and cut_off > 0
    if telemetry.export_mode == "in_process":
        assert spans[REASON_EXPORT_FAILED] > 0
    assert wait_for(lambda: telemetry.drops.total(METRIC_POINTS) > 0)
