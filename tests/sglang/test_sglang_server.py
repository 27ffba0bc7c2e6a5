"""otel_llm in SGLang's HTTP server, driven with the official openai client, compared with ``/metrics``.

The server is ``python -m sglang.launch_server`` started from docs/sglang.md's CPU block word for word (see
serve.py), with ``SGLANG_TEST_RETRACT=1`` so that concurrent requests are retracted. otel_llm is active
through SGLang's plugin entry point alone and exports over OTLP/gRPC to a real receiver in this
process. Driven in order: chat and completions, each streaming and not, each with a caller's
``traceparent``; a burst of concurrent chat requests whose ``meta_info`` (``return_meta_info``) carries
SGLang's per-request ``num_retractions``; a stream the client closes after a few chunks. Test stand-ins
in the SGLang virtualenv: ``sgl_kernel`` and the torchvision operator schemas (see conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import secrets
import subprocess
import time
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from otel_llm import semconv as sc
from tests.otlp_receivers import GrpcReceiver
from tests.ports import free_port
from tests.sglang.conftest import HERE, SGLANG_PYTHON, metric_points, needs_sglang, roots, sglang_env
from tests.sglang.drive_engine import span_json
from tests.sglang.serve import Server

pytestmark = needs_sglang

openai = pytest.importorskip("openai")

BURST = 6  # concurrent chat requests: SGLang's forced retraction needs two or more running
BURST_TOKENS = 48
LONG_TOKENS = 1900  # the disconnected stream: far longer than the test waits for
CLOSE_AFTER_CHUNKS = 3
ABS = 1e-6  # seconds: sums of values computed from the same perf_counter stamps


def traceparent() -> tuple[str, str, str]:
    """A caller's W3C traceparent header and its trace id and span id (hex)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def one_call(
    client: Any, model: str, kind: str, stream: bool, rid: str, max_tokens: int = 16
) -> dict[str, Any]:
    """One request through the openai client with a traceparent; what SGLang answered about it."""
    header, trace_id, span_id = traceparent()
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "extra_headers": {"traceparent": header},
    }
    extra: dict[str, Any] = {"rid": rid}
    if stream:
        common["stream_options"] = {"include_usage": True}
    elif kind == "chat":
        extra["return_meta_info"] = True
    if kind == "chat":
        messages = [{"role": "user", "content": f"Tell me a story about tokens ({rid})"}]
        answer = client.chat.completions.create(messages=messages, stream=stream, extra_body=extra, **common)
    else:
        prompt = f"The quick brown fox jumps over the lazy dog ({rid})"
        answer = client.completions.create(prompt=prompt, stream=stream, extra_body=extra, **common)
    usage, meta = None, None
    if stream:
        for chunk in answer:
            usage = chunk.usage or usage
    else:
        usage = answer.usage
        meta = (answer.choices[0].model_extra or {}).get("meta_info")
    return {
        "rid": rid,
        "kind": kind,
        "stream": stream,
        "trace_id": trace_id,
        "parent_span_id": span_id,
        "usage": usage.model_dump() if usage is not None else None,
        "meta": meta,
    }


def disconnect(client: Any, model: str, rid: str) -> int:
    """A long stream the client closes after a few chunks; returns the chunks it read."""
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a very long story"}],
        max_tokens=LONG_TOKENS,
        temperature=0.0,
        stream=True,
        extra_body={"rid": rid},
    )
    read = 0
    for _ in stream:
        read += 1
        if read == CLOSE_AFTER_CHUNKS:
            break
    stream.close()
    return read


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("sglang_server")
    model = tmp / "model"
    subprocess.run(
        [str(SGLANG_PYTHON), str(HERE / "tiny_model.py"), str(model)],
        env=sglang_env(),
        check=True,
        capture_output=True,
        timeout=300,
    )
    retract = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "10"}
    with GrpcReceiver() as receiver:
        server = Server(model, free_port(), receiver.endpoint, tmp / "server.log", retract)
        with server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
            name = client.models.list().data[0].id
            # SGLang's counters so far include its /health probes (not traced by us): compare differences.
            baseline = server.get("/metrics")
            calls = [
                one_call(client, name, kind, stream, f"{kind}-{'stream' if stream else 'whole'}")
                for kind in ("chat", "completion")
                for stream in (False, True)
            ]
            with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
                futures = [
                    pool.submit(one_call, client, name, "chat", False, f"burst-{i}", BURST_TOKENS)
                    for i in range(BURST)
                ]
                calls += [f.result() for f in futures]
            chunks = disconnect(client, name, "disconnected")
            expected = {c["rid"] for c in calls} | {"disconnected"}

            def all_reported(collected: Any) -> bool:
                seen = {
                    a.value.string_value
                    for _, s in collected.spans()
                    if s.name == sc.SPAN_REQUEST
                    for a in s.attributes
                    if a.key == sc.LLM_REQUEST_ID
                }
                requests = sum(
                    p.as_int for _, m in collected.metrics(sc.METRIC_REQUESTS)[-1:] for p in m.sum.data_points
                )
                return expected <= seen and requests >= len(expected)

            reported = receiver.collected.wait_until(all_reported, timeout_s=60)
            time.sleep(0.5)  # SGLang's tokenizer finishes its bookkeeping of the abort
            prometheus = server.get("/metrics")
        log = server.tail()
        spans = [span_json(r, s) for r, s in receiver.collected.spans()]
        metrics = [
            {"name": m.name, "data": MessageToDict(m, preserving_proto_field_name=True)}
            for _, m in receiver.collected.metrics()
        ]
    result = {
        "calls": calls,
        "chunks_read": chunks,
        "reported": reported,
        "spans": spans,
        "metrics": metrics,
        "prometheus": prometheus,
        "baseline": baseline,
        "log": log,
    }
    (tmp / "served.json").write_text(json.dumps(result))  # kept with pytest's temporary files, to inspect
    return result


def sglang_counted(served: dict[str, Any], family: str, sample: str) -> float:
    """How much one sample of SGLang's ``/metrics`` grew while the test drove the server (summed over
    labels; 0 for a family SGLang has not created)."""
    from prometheus_client.parser import text_string_to_metric_families

    def total(text: str) -> float:
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            if f.name == family
            for s in f.samples
            if s.name == sample
        )

    return total(served["prometheus"]) - total(served["baseline"])


def ours(served: dict[str, Any], name: str, field: str = "as_int") -> float:
    """The sum over attribute sets of our last exported point of ``name`` (counters and histograms)."""
    return sum(float(p.get(field, 0)) for p in metric_points(served, name))


def root_of(served: dict[str, Any], rid: str) -> dict[str, Any]:
    return roots(served)[rid]


def test_every_request_reached_the_receiver(served: dict[str, Any]) -> None:
    assert served["reported"], "not every request's llm.request span and metrics arrived within 60 s"
    assert set(roots(served)) == {c["rid"] for c in served["calls"]} | {"disconnected"}


def test_caller_traceparent_is_the_parent_of_llm_request(served: dict[str, Any]) -> None:
    for call in served["calls"]:
        root = root_of(served, call["rid"])
        assert root["trace_id"] == call["trace_id"], call["rid"]
        assert root["parent_span_id"] == call["parent_span_id"], call["rid"]


def test_chat_and_completions_streaming_or_not_count_tokens_as_sglang(served: dict[str, Any]) -> None:
    kinds = {(c["kind"], c["stream"]) for c in served["calls"]}
    assert kinds == {("chat", False), ("chat", True), ("completion", False), ("completion", True)}
    for call in served["calls"]:
        attrs = root_of(served, call["rid"])["attributes"]
        assert call["usage"] is not None, call["rid"]
        assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == call["usage"]["prompt_tokens"], call["rid"]
        assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == call["usage"]["completion_tokens"], call["rid"]
        assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_LENGTH], call["rid"]


def test_preemptions_equal_sglang_num_retractions_per_request(served: dict[str, Any]) -> None:
    burst = [c for c in served["calls"] if c["rid"].startswith("burst-")]
    assert all(c["meta"] for c in burst), "SGLang returned no meta_info"
    for call in burst:
        attrs = root_of(served, call["rid"])["attributes"]
        assert attrs[sc.LLM_PREEMPTIONS] == call["meta"]["num_retractions"], call["rid"]
    assert sum(c["meta"]["num_retractions"] for c in burst) > 0, "SGLang retracted nothing in the burst"


def test_client_disconnect_shows_an_abort(served: dict[str, Any]) -> None:
    assert served["chunks_read"] == 3
    attrs = root_of(served, "disconnected")["attributes"]
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_ABORT]
    assert 0 < attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < LONG_TOKENS


def test_counts_and_queue_time_agree_with_sglang_metrics(served: dict[str, Any]) -> None:
    # Families as SGLang 0.5.23 names them; counted in its tokenizer (requests, tokens, aborts; an
    # aborted request is counted with the tokens it had) and scheduler (retractions, queue time).
    def counted(family: str, suffix: str = "_total") -> float:
        return sglang_counted(served, f"sglang:{family}", f"sglang:{family}{suffix}")

    points = metric_points(served, sc.METRIC_REQUESTS)
    requests = {attribute(p, sc.LLM_FINISH_REASON): int(p["as_int"]) for p in points}
    assert sum(requests.values()) == counted("num_requests") == len(served["calls"]) + 1
    assert requests.get(sc.REASON_ABORT, 0) == counted("num_aborted_requests") == 1
    points = metric_points(served, sc.METRIC_TOKENS)
    tokens = {attribute(p, sc.GEN_AI_TOKEN_TYPE): int(p["as_int"]) for p in points}
    assert tokens == {"input": counted("prompt_tokens"), "output": counted("generation_tokens")}
    assert ours(served, sc.METRIC_PREEMPTIONS) == counted("num_retracted_requests") > 0
    # Same definition, same stamps: the first wait in SGLang's queue, one sample per request.
    (queue,) = metric_points(served, sc.METRIC_QUEUE)
    assert int(queue["count"]) == counted("queue_time_seconds", "_count")
    assert queue["sum"] == pytest.approx(counted("queue_time_seconds", "_sum"), abs=ABS * int(queue["count"]))


def attribute(point: dict[str, Any], key: str) -> Any:
    return next(next(iter(a["value"].values())) for a in point["attributes"] if a["key"] == key)
