"""`vllm serve --api-server-count 2`: two API-server processes, each with its own output loop and, in
the default export mode, its own export process; one engine core. Every request's trace arrives whole
and exactly once, from whichever API server handled it.

Set up as ``served`` in test_vllm_serve.py is (``serving``: ``OTEL_LLM_VLLM_CONFIGURE=1``, gRPC to a
real receiver, the rescheduling probe in the engine core).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from engine_tier import Server, latest_points, needs_engine, span_dicts, total
from process_tree import export_processes_below
from test_vllm_serve import (
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


@pytest.fixture(scope="module")
def two_api_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vllm-serve-api-servers")
    with serving(tmp, "vllm-api-servers", "--api-server-count", "2", **probe_env(tmp)) as server:
        # Two rounds of streams: enough connections that both API servers take some.
        server.extra["streams"] = concurrent_streams(server) + concurrent_streams(server)

        def arrived(collected: object) -> bool:
            return sum(s["name"] == sc.SPAN_REQUEST for s in span_dicts(server.collected)) >= 2 * STREAMS

        assert server.collected.wait_until(arrived, timeout_s=WAIT_S), server.output()[-4000:]
        server.extra["export_processes"] = len(export_processes_below(server.proc.pid))
        server.extra["prometheus"] = prometheus(server)  # vLLM sums its API servers' own counters
        yield server


def test_every_request_is_one_whole_trace_exactly_once(two_api_servers: Server) -> None:
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
