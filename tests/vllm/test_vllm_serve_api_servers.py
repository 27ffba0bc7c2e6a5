"""`vllm serve --api-server-count 2`: two API-server processes, each with its own output loop and, in
the default export mode, its own export process; one engine core. Every request's trace arrives whole
and exactly once, from whichever API server handled it.

Set up as ``served`` in test_vllm_serve.py is (``serving``: ``OTEL_LLM_VLLM_CONFIGURE=1``, gRPC to a
real receiver, the rescheduling probe in the engine core).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_tier import (
    ENGINE_BIN,
    Server,
    engine_env,
    latest_points,
    needs_engine,
    serve_args,
    span_dicts,
    start_server,
    total,
)
from otlp_receivers import GrpcReceiver, Mode
from ports import free_port
from process_tree import alive, descendants, export_processes_below
from test_vllm_serve import (
    OTLP_FAST,
    STREAMS,
    assert_recompute_figures_are_the_engine_cores,
    assert_steps_reach_the_trackers_as_the_engine_core_made_them,
    concurrent_streams,
    probe_env,
    prometheus,
    roots_by_client_id,
    serving,
)

from otel_llm import semconv as sc

pytestmark = needs_engine
WAIT_S = 60.0


def wait_for_api_servers(server: Server, count: int = 2) -> None:
    """Until each of ``count`` API servers says it serves (uvicorn's "Application startup complete.").
    The first to start answers /v1/models alone, and on a busy machine the other may start seconds
    later: requests sent before then all land on the first."""
    deadline = time.monotonic() + WAIT_S
    while server.output().count("Application startup complete.") < count:
        assert time.monotonic() < deadline, server.output()[-4000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def two_api_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vllm-serve-api-servers")
    with serving(tmp, "vllm-api-servers", "--api-server-count", "2", **probe_env(tmp)) as server:
        wait_for_api_servers(server)
        # Two rounds of streams: enough connections that both API servers take some.
        server.extra["streams"] = concurrent_streams(server) + concurrent_streams(server)

        def arrived(collected: object) -> bool:
            return sum(s["name"] == sc.SPAN_REQUEST for s in span_dicts(server.collected)) >= 2 * STREAMS

        assert server.collected.wait_until(arrived, timeout_s=WAIT_S), server.output()[-4000:]
        server.extra["export_processes"] = len(export_processes_below(server.proc.pid))
        server.extra["prometheus"] = prometheus(server)  # vLLM sums its API servers' own counters
        yield server


def test_every_request_is_one_whole_trace_exactly_once(two_api_servers: Server) -> None:
    assert_every_request_is_one_whole_trace_exactly_once(two_api_servers)


def assert_every_request_is_one_whole_trace_exactly_once(two_api_servers: Server) -> None:
    spans = span_dicts(two_api_servers.collected)
    ids = Counter(s["span_id"] for s in spans)
    assert not [i for i, n in ids.items() if n > 1], "a span arrived twice"
    roots = roots_by_client_id(spans)
    streams = two_api_servers.extra["streams"]
    assert len(streams) == 2 * STREAMS
    for stream in streams:
        (root,) = roots[stream["id"]]  # exactly once
        in_trace = [s for s in spans if s["trace_id"] == root["trace_id"]]
        names = Counter(s["name"] for s in in_trace)
        assert names[sc.SPAN_QUEUE] == 1 and names[sc.SPAN_PREFILL] >= 1 and names[sc.SPAN_DECODE] == 1, names
        # Whole: every span's parent is in the trace (the root has none: no caller traceparent here).
        own = {s["span_id"] for s in in_trace}
        assert all(s["parent_id"] in own for s in in_trace if s is not root), names
        assert root["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == stream["usage"].completion_tokens


def test_each_api_server_has_its_export_process(two_api_servers: Server) -> None:
    assert two_api_servers.extra["export_processes"] == 2


def test_each_api_server_gets_its_requests_recompute_figures_from_the_engine_core(
    two_api_servers: Server,
) -> None:
    """The API servers and the engine core are children of one launcher here: each API server listens
    under the launcher's pid and its client index, and the engine core sends each rescheduling's figures
    to the API server whose request it is."""
    probed = assert_recompute_figures_are_the_engine_cores(two_api_servers)
    assert {p["client"] for p in probed} == {0, 1}, "reschedulings of requests from both API servers"


def test_each_api_server_gets_every_step_of_the_engine_core_from_its_first_request_on(
    two_api_servers: Server,
) -> None:
    """A request's stalls come from the whole step, whichever API server its other requests came through:
    the engine core sends each step to both."""
    got = assert_steps_reach_the_trackers_as_the_engine_core_made_them(two_api_servers)
    assert len(got) == 2, "both API servers' trackers heard of the engine's steps"


def test_each_api_server_exports_under_its_own_instance_and_their_sums_are_vllms(
    two_api_servers: Server,
) -> None:
    """Each API server's metrics are a stream of their own (``service.instance.id``); over both, the
    requests and tokens equal vLLM's /metrics, which adds its API servers up."""
    assert_each_api_server_exports_under_its_own_instance_and_their_sums_are_vllms(two_api_servers)


def assert_each_api_server_exports_under_its_own_instance_and_their_sums_are_vllms(
    two_api_servers: Server,
) -> None:
    vllm = two_api_servers.extra["prometheus"]
    expected = {
        "requests": vllm["vllm:request_success_total"],
        "output": vllm["vllm:generation_tokens_total"],
        "input": vllm["vllm:prompt_tokens_total"],
    }
    assert expected["requests"] == 2 * STREAMS

    def summed(collected: object) -> dict[str, float]:
        points = latest_points(two_api_servers.collected)
        tokens = points.get(sc.METRIC_TOKENS, [])
        return {
            "requests": total(points.get(sc.METRIC_REQUESTS, []), "value"),
            "output": total(tokens, "value", **{sc.GEN_AI_TOKEN_TYPE: "output"}),
            "input": total(tokens, "value", **{sc.GEN_AI_TOKEN_TYPE: "input"}),
        }

    two_api_servers.collected.wait_until(lambda c: summed(c) == expected, timeout_s=WAIT_S)
    assert summed(two_api_servers.collected) == expected
    instances: set[str] = set()
    for export in two_api_servers.collected.received("metrics"):
        for rm in export.request.resource_metrics:
            resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
            names = {m.name for sm in rm.scope_metrics for m in sm.metrics}
            if sc.METRIC_REQUESTS in names:
                instances.add(resource.get("service.instance.id", ""))
    assert len(instances) == 2 and "" not in instances, instances


# --- opentelemetry-instrument ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def distro_two_api_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`opentelemetry-instrument vllm serve --api-server-count 2`: the SDK's providers in every API
    server, built from OTEL_* by the distro, whose resource detectors give each its own
    service.instance.id (opentelemetry-sdk 1.45 and later; the engine's virtualenv has 1.45.2)."""
    tmp = tmp_path_factory.mktemp("vllm-distro-api-servers")
    receiver = GrpcReceiver()
    receiver.start()
    port = free_port()
    env = engine_env(
        tmp,
        OTEL_SERVICE_NAME="vllm-distro-api-servers",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        **OTLP_FAST,
    )
    command = [
        str(ENGINE_BIN / "opentelemetry-instrument"),
        str(ENGINE_BIN / "vllm"),
        *serve_args(port, "--api-server-count", "2", "--shutdown-timeout", "6"),
    ]
    server = start_server(command, env, tmp / "serve.log", receiver.collected, port)
    try:
        wait_for_api_servers(server)
        server.extra["streams"] = concurrent_streams(server) + concurrent_streams(server)

        def arrived(collected: object) -> bool:
            return sum(s["name"] == sc.SPAN_REQUEST for s in span_dicts(server.collected)) >= 2 * STREAMS

        assert server.collected.wait_until(arrived, timeout_s=WAIT_S), server.output()[-4000:]
        server.extra["prometheus"] = prometheus(server)
        yield server
    finally:
        server.stop()
        receiver.stop()


def test_distro_every_request_is_one_whole_trace_exactly_once(distro_two_api_servers: Server) -> None:
    assert_every_request_is_one_whole_trace_exactly_once(distro_two_api_servers)


def test_distro_each_api_server_exports_under_its_own_instance_and_their_sums_are_vllms(
    distro_two_api_servers: Server,
) -> None:
    assert_each_api_server_exports_under_its_own_instance_and_their_sums_are_vllms(distro_two_api_servers)
    lines = [line for line in distro_two_api_servers.output().splitlines() if "otel_llm" in line]
    assert not [line for line in lines if "under one resource" in line or "--shutdown-timeout" in line]


# --- stopping ------------------------------------------------------------------------------------------

# vLLM's launcher kills the API servers' process trees --shutdown-timeout seconds after SIGTERM.
KILLED = "force killing remaining process ApiServer"
GAVE_UP = "did not finish within"  # otel_llm's line when a flush ran past its budget


def test_the_default_shutdown_timeout_is_named_at_start_with_the_one_that_keeps_the_telemetry(
    two_api_servers: Server,
) -> None:
    """vLLM's default --shutdown-timeout (0) kills the API servers at once: said at start, with the
    value that lets OTEL_LLM_SHUTDOWN_TIMEOUT (5 s by default) + 1 s run."""
    lines = [line for line in two_api_servers.output().splitlines() if "--shutdown-timeout" in line]
    assert lines and all("otel_llm" in line and "pass --shutdown-timeout 6" in line for line in lines), lines


def stop_two_api_servers(
    tmp: Path, receiver: GrpcReceiver, budget_s: int, **env_extra: str
) -> dict[str, Any]:
    """`vllm serve --api-server-count 2 --shutdown-timeout <budget + 1>` exporting to ``receiver``: a
    round of streams, then SIGTERM to the main process, as an orchestrator stops a deployment. Returns
    the seconds until every process of the server had ended, which are left, the server's output, and
    how many streams were sent (another round when the first missed an API server)."""
    port = free_port()
    env = engine_env(
        tmp,
        OTEL_LLM_VLLM_CONFIGURE="1",
        OTEL_SERVICE_NAME="vllm-api-servers-stop",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_LLM_SHUTDOWN_TIMEOUT=str(budget_s),
        **{**OTLP_FAST, **env_extra},
    )
    wait = str(budget_s + 1)
    command = [
        str(ENGINE_BIN / "vllm"),
        *serve_args(port, "--api-server-count", "2", "--shutdown-timeout", wait),
    ]
    server = start_server(command, env, tmp / "serve.log", receiver.collected, port)
    try:
        wait_for_api_servers(server)
        streams = concurrent_streams(server)
        deadline = time.monotonic() + WAIT_S
        # Each API server starts its export process with its first request; the kernel hands the
        # connections out, so a round may miss one API server: another round then.
        while len(export_processes_below(server.proc.pid)) < 2:
            assert time.monotonic() < deadline, server.output()[-4000:]
            time.sleep(1.0)
            if len(export_processes_below(server.proc.pid)) < 2:
                streams += concurrent_streams(server)
        if receiver.mode is Mode.BLACK_HOLE:  # both export processes stuck inside an export
            while receiver.held < 2:
                assert time.monotonic() < deadline, (receiver.held, server.output()[-4000:])
                time.sleep(0.2)
        tree = descendants(server.proc.pid)
        server.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        server.proc.wait(timeout=120)
        while [p for p in tree if alive(p)] and time.monotonic() - sent < 120:
            time.sleep(0.05)
        return {
            "took": time.monotonic() - sent,
            "left": [p for p in tree if alive(p)],
            "output": server.output(),
            "sent": len(streams),
        }
    finally:
        server.stop()


def test_sigterm_with_a_stuck_collector_ends_every_process_within_the_budget(tmp_path: Path) -> None:
    """The collector holds every export unanswered and the exporters' own timeout (600 s) is far beyond
    any budget. Each API server gives its telemetry OTEL_LLM_SHUTDOWN_TIMEOUT (2 s), says what it
    dropped and ends by itself, inside the --shutdown-timeout that vLLM's launcher waits before it kills;
    no process of the server is left, the export processes included."""
    receiver = GrpcReceiver(mode=Mode.BLACK_HOLE)
    receiver.start()
    try:
        stopped = stop_two_api_servers(tmp_path, receiver, 2, OTEL_EXPORTER_OTLP_TIMEOUT="600")
    finally:
        receiver.stop()
    output = stopped["output"]
    assert not stopped["left"], f"still running {stopped['took']:.1f} s after SIGTERM\n{output[-4000:]}"
    assert KILLED not in output, output[-4000:]  # they ended before vLLM's launcher gave up on them
    gave_up = [line for line in output.splitlines() if GAVE_UP in line and "dropped" in line]
    assert len(gave_up) >= 2, output[-4000:]  # each API server said what it could not send
    assert "--shutdown-timeout" not in "".join(line for line in output.splitlines() if "otel_llm" in line)
    print(f"two API servers, a stuck collector: every process gone {stopped['took']:.1f} s after SIGTERM")


def test_sigterm_with_a_healthy_collector_delivers_each_api_servers_last_metrics(tmp_path: Path) -> None:
    """Metrics exported only at shutdown (a one-hour interval): after SIGTERM, both API servers' counts
    arrive, and together they count every request."""
    receiver = GrpcReceiver()
    receiver.start()
    try:
        stopped = stop_two_api_servers(tmp_path, receiver, 5, OTEL_METRIC_EXPORT_INTERVAL="3600000")
        points = latest_points(receiver.collected)
    finally:
        receiver.stop()
    output = stopped["output"]
    assert not stopped["left"] and KILLED not in output, output[-4000:]
    assert GAVE_UP not in output, output[-4000:]
    assert total(points.get(sc.METRIC_REQUESTS, []), "value") == stopped["sent"], output[-4000:]
    instances = {
        kv.value.string_value
        for export in receiver.collected.received("metrics")
        for rm in export.request.resource_metrics
        for kv in rm.resource.attributes
        if kv.key == "service.instance.id"
    }
    assert len(instances) == 2, instances  # both API servers flushed theirs
