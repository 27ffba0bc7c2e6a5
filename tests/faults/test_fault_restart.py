"""A collector that restarts mid-run, and a slow one.

Restart: "the collector" is stopped and a new one started on the same port. While it is down every span
is counted as dropped; once it is back, new traces arrive without any action from the engine, and the
books balance: spans received (by either instance) + spans counted as dropped == spans produced, no span
received twice. The cumulative drop count reaches the restarted collector as a self-metric.
"""

from __future__ import annotations

import pytest
from fault_tools import (
    balanced,
    build,
    dropped_spans,
    on_thread,
    received_span_ids,
    serve,
    wait_for,
)
from otlp_receivers import GrpcReceiver, HttpReceiver, Mode, attributes, closed_port

from otel_llm import semconv as sc
from otel_llm.export.counting import ATTR_REASON, REASON_EXPORT_FAILED, SPANS

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


RESTARTABLE = [
    pytest.param(GrpcReceiver, "grpc", id="grpc"),
    pytest.param(HttpReceiver, "http/protobuf", id="http"),
]


def request_ids(collected) -> set[str]:
    return {
        attributes(s.attributes)[sc.LLM_REQUEST_ID] for _, s in collected.spans() if s.name == sc.SPAN_REQUEST
    }


@pytest.mark.parametrize(("receiver_type", "protocol"), RESTARTABLE)
def test_collector_restart_loses_only_what_was_sent_while_down(env, started, receiver_type, protocol) -> None:
    port = closed_port()
    first = receiver_type(port=port)
    first.start()
    started.append(first)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry, tracker, produced = build(started)

    serve(tracker, [f"before-{i}" for i in range(40)])
    assert wait_for(lambda: 0 < produced.count == len(received_span_ids(first.collected)))
    first.stop()

    before_down = produced.count
    on_thread(lambda: serve(tracker, [f"down-{i}" for i in range(40)]))
    assert wait_for(
        lambda: (
            produced.count == 2 * before_down  # as many spans again (in export mode process: reported)
            and balanced(len(received_span_ids(first.collected)), dropped_spans(telemetry), produced.count)
        )
    )
    lost_while_down = dropped_spans(telemetry)
    assert lost_while_down > 0

    second = receiver_type(port=port)
    second.start()
    started.append(second)
    # A client may still be backing off from the refused connections (gRPC's reconnect backoff), so
    # what it sends in the first moments can still be lost, and counted. Keep serving new requests until
    # they arrive: recovery needs nothing from the engine, only time.
    recovered = False
    for round_ in range(10):
        batch = {f"after-{round_}-{i}" for i in range(20)}
        serve(tracker, sorted(batch))
        if wait_for(lambda batch=batch: request_ids(second.collected) >= batch, timeout_s=3.0):
            recovered = True
            break
    assert recovered, "no new trace reached the restarted collector"
    assert wait_for(
        lambda: balanced(
            len(received_span_ids(first.collected)) + len(received_span_ids(second.collected)),
            dropped_spans(telemetry),
            produced.count,
        )
    )

    received = received_span_ids(first.collected) + received_span_ids(second.collected)
    assert len(received) == len(set(received)), "a span was delivered twice"
    if telemetry.export_mode == "in_process":  # the spans' ids are known here only when built here
        assert set(received) <= produced.ids
    assert balanced(len(received), dropped_spans(telemetry), produced.count)  # arrived or counted
    total_lost = dropped_spans(telemetry)

    # The count reaches the restarted collector as a cumulative self-metric.
    on_thread(lambda: telemetry.force_flush(timeout_s=10))
    assert wait_for(lambda: bool(second.collected.metrics(sc.METRIC_DROPPED_SPANS)))
    _, metric = second.collected.metrics(sc.METRIC_DROPPED_SPANS)[-1]
    by_reason = {attributes(p.attributes)[ATTR_REASON]: p.as_int for p in metric.sum.data_points}
    assert metric.sum.is_monotonic
    assert by_reason[REASON_EXPORT_FAILED] == total_lost
    assert sum(by_reason.values()) == total_lost


@pytest.mark.parametrize(
    ("receiver_type", "protocol"),
    [pytest.param(GrpcReceiver, "grpc", id="grpc"), pytest.param(HttpReceiver, "http/protobuf", id="http")],
)
def test_slow_collector_within_the_export_timeout_loses_nothing(
    env, started, receiver_type, protocol
) -> None:
    receiver = receiver_type(mode=Mode.SLOW, delay_s=0.3)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(100)))

    assert wait_for(lambda: 0 < produced.count == len(received_span_ids(receiver.collected)))
    assert telemetry.drops.total(SPANS) == 0


def test_collector_slower_than_the_export_timeout_is_counted_as_lost(env, started) -> None:
    """The exporter gives up after OTEL_EXPORTER_OTLP_TIMEOUT and counts the batch as dropped, although the
    collector may still store it when it finally answers: the count errs on the side of reporting loss."""
    receiver = GrpcReceiver(mode=Mode.SLOW, delay_s=1.5)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(20)))

    assert wait_for(lambda: dropped_spans(telemetry) == produced.count)
    received = received_span_ids(receiver.collected)
    if telemetry.export_mode == "in_process":  # the spans' ids are known here only when built here
        assert set(received) <= produced.ids  # what did arrive late is real, and nothing is invented
