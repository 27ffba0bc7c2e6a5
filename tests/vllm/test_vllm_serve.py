"""`vllm serve` as its users run it, driven with the official openai client, telemetry over real OTLP.

Three servers of the tiny model (engine core in a spawned process, as always under ``vllm serve``):

- ``served``: the route without the OpenTelemetry distro: ``OTEL_LLM_VLLM_CONFIGURE=1`` plus OTEL_*
  variables; the otel_llm plugin configures otel_llm in the process that serves requests (gRPC here).
  A workload with preemptions, streaming, chat and completions, ``n=2``, stop strings, a client that
  disconnects and a caller ``traceparent``; compared with the server's own ``/metrics``.
- ``zero_code``: ``opentelemetry-instrument vllm serve`` with vLLM's own ``--otlp-traces-endpoint`` set
  too: where each side's spans go, and every histogram; it listens on every address (no ``--host``).
  It runs in export mode ``in_process`` (the others in the default, ``process``; see also
  test_vllm_serve_api_servers.py).
- ``unplugged``: the engine core without the otel_llm plugin (``VLLM_PLUGINS=''``) and vLLM's stats
  logging off: otel_llm's warning saying what to set must be visible in the server's output.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cost_model import shares
from engine_tier import (
    ENGINE_BIN,
    MODEL_NAME,
    Server,
    engine_env,
    latest_points,
    needs_engine,
    serve_args,
    span_dicts,
    start_server,
    total,
)
from otlp_receivers import (
    CALLER_SPAN_ID,
    CALLER_TRACE_ID,
    CALLER_TRACEPARENT,
    HISTOGRAMS,
    GrpcReceiver,
)
from ports import free_port

from otel_llm import semconv as sc

pytestmark = needs_engine
openai = pytest.importorskip("openai")
prometheus_parser = pytest.importorskip("prometheus_client.parser")

KIND_INTERNAL, KIND_SERVER = 1, 2  # OTLP Span.SpanKind
STREAMS = 12  # concurrent streams: with 20 KV blocks of 32 tokens vLLM preempts
STREAM_TOKENS = 200  # 7 KV blocks each with the prompt: any 3 streams at once must preempt
WAIT_S = 60.0
OTLP_FAST = {"OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def client(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def concurrent_streams(server: Server, count: int = STREAMS, leaver: bool = False) -> list[dict[str, Any]]:
    """``count`` streaming completions released at once; each returns its id, finish reason and usage.

    ``leaver``: one more stream, of 480 tokens, whose client goes away after its first chunk while the
    others keep the engine busy (alone, the tiny model would finish it before the server notices); its
    id is the last entry.
    """
    results: list[dict[str, Any]] = [{} for _ in range(count + leaver)]
    errors: list[BaseException] = []
    start = threading.Barrier(count + leaver)

    def one(k: int) -> None:
        try:
            api = client(server)
            start.wait(timeout=60)
            stream = api.completions.create(
                model=MODEL_NAME,
                prompt=f"Stream {k}: the quick brown fox jumps over the lazy dog",
                max_tokens=STREAM_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            for chunk in stream:
                results[k]["id"] = chunk.id
                if chunk.choices and chunk.choices[0].finish_reason:
                    results[k]["finish_reason"] = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    results[k]["usage"] = chunk.usage
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    def leave() -> None:
        try:
            # Its own client, closed with the stream, so the connection goes too.
            api = client(server)
            start.wait(timeout=60)
            stream = api.completions.create(
                model=MODEL_NAME,
                prompt="A long story:",
                max_tokens=480,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            for chunks, chunk in enumerate(stream, start=1):
                results[count]["id"] = chunk.id
                if chunks == 1:
                    break
            stream.close()
            api.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(count)]
    if leaver:
        threads.append(threading.Thread(target=leave))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return results


def wait_for_requests(server: Server, count: int) -> None:
    """Until ``count`` llm.request spans and a metrics export counting ``count`` finished requests."""

    def arrived(collected: Any) -> bool:
        roots = [s for s in span_dicts(collected) if s["name"] == sc.SPAN_REQUEST]
        points = latest_points(collected).get(sc.METRIC_REQUESTS, [])
        return len(roots) >= count and total(points, "value") >= count

    assert server.collected.wait_until(arrived, timeout_s=WAIT_S), server.output()[-4000:]


def roots_by_client_id(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        if s["name"] == sc.SPAN_REQUEST:
            out.setdefault(s["attributes"][sc.LLM_REQUEST_ID], []).append(s)
    return out


def summed(points: list[dict[str, Any]]) -> dict[str, float]:
    """A histogram's count and sum over all its attribute sets (here: chat and text_completion)."""
    return {"count": total(points, "count"), "sum": total(points, "sum")}


def prometheus(server: Server, text: str | None = None) -> dict[str, float]:
    """The server's /metrics (or ``text`` read from there) as name -> value, summed over label sets
    (``_sum`` / ``_count`` kept)."""
    values: dict[str, float] = {}
    for family in prometheus_parser.text_string_to_metric_families(text or server.prometheus()):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


# --- the route without the distro: OTEL_LLM_VLLM_CONFIGURE=1 -----------------------------------------


@contextlib.contextmanager
def serving(tmp: Path, service_name: str, *serve_extra: str, **env_extra: str) -> Iterator[Server]:
    """``vllm serve`` on the route without the distro (``OTEL_LLM_VLLM_CONFIGURE=1``), OTLP/gRPC to a
    real receiver; both stopped on the way out. ``serve_extra``: more ``vllm serve`` arguments;
    ``env_extra``: more of its environment."""
    receiver = GrpcReceiver()
    receiver.start()
    port = free_port()
    env = engine_env(
        tmp,
        OTEL_LLM_VLLM_CONFIGURE="1",
        OTEL_SERVICE_NAME=service_name,
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        **OTLP_FAST,
        **env_extra,
    )
    command = [str(ENGINE_BIN / "vllm"), *serve_args(port, *serve_extra)]
    try:
        server = start_server(command, env, tmp / "serve.log", receiver.collected, port)
    except BaseException:
        receiver.stop()
        raise
    if "RESCHEDULING_PROBE_OUT" in env_extra:
        server.extra["probe"] = Path(env_extra["RESCHEDULING_PROBE_OUT"])
    try:
        yield server
    finally:
        server.stop()
        receiver.stop()


PROBE = Path(__file__).resolve().parent / "rescheduling_probe"  # a test-only sitecustomize, see there


def probe_env(tmp: Path) -> dict[str, str]:
    """The environment that loads the rescheduling probe into every process of a server."""
    return {"PYTHONPATH": str(PROBE), "RESCHEDULING_PROBE_OUT": str(tmp / "reschedulings.jsonl")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vllm-serve")
    with serving(tmp, "vllm-serve-test", **probe_env(tmp)) as server:
        server.extra.update(drive(server))
        wait_for_requests(server, server.extra["requests"])
        server.extra["prometheus_text"] = server.prometheus()
        server.extra["prometheus"] = prometheus(server, server.extra["prometheus_text"])
        yield server


def drive(server: Server) -> dict[str, Any]:
    """The workload, as a client would run it; returns what the client saw."""
    *streams, leaver = concurrent_streams(server, leaver=True)
    seen: dict[str, Any] = {"streams": streams, "disconnect": leaver}
    api = client(server)
    chat_id, chat_reason = None, None
    for chunk in api.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=24,
        stream=True,
        extra_headers={"traceparent": CALLER_TRACEPARENT},
    ):
        chat_id = chunk.id
        if chunk.choices and chunk.choices[0].finish_reason:
            chat_reason = chunk.choices[0].finish_reason
    seen["chat"] = {"id": chat_id, "finish_reason": chat_reason}
    two = api.completions.create(
        model=MODEL_NAME,
        prompt="Two answers, please:",
        max_tokens=16,
        n=2,
        extra_headers={"traceparent": CALLER_TRACEPARENT.replace(CALLER_SPAN_ID, "b7ad6b7169203331")},
    )
    seen["n2"] = {"id": two.id, "finish_reasons": sorted(c.finish_reason for c in two.choices)}
    stopped = api.completions.create(
        model=MODEL_NAME, prompt="Stop soon:", max_tokens=64, stop=["e", "a", "o", " "]
    )
    seen["stop"] = {"id": stopped.id, "finish_reason": stopped.choices[0].finish_reason}
    chat_once = api.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Once."}], max_tokens=8
    )
    seen["chat_once"] = {"id": chat_once.id, "finish_reason": chat_once.choices[0].finish_reason}
    seen["requests"] = STREAMS + 1 + 2 + 1 + 1 + 1  # sequences: n=2 is two
    return seen


def test_served_one_trace_per_request_with_the_client_ids(served: Server) -> None:
    roots = roots_by_client_id(span_dicts(served.collected))
    for stream in served.extra["streams"]:
        (root,) = roots[stream["id"]]
        assert stream["id"].startswith("cmpl-")
        attributes = root["attributes"]
        assert attributes[sc.GEN_AI_OPERATION_NAME] == "text_completion"
        assert attributes[sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME
        assert attributes[sc.VLLM_REQUEST_ID].startswith(f"{stream['id']}-0-")  # vLLM's internal id
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == stream["usage"].completion_tokens
        assert attributes[sc.GEN_AI_USAGE_INPUT_TOKENS] == stream["usage"].prompt_tokens
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [stream["finish_reason"]]
        assert root["parent_id"] is None and root["kind"] == KIND_SERVER


def test_served_chat_is_operation_chat_under_the_callers_span(served: Server) -> None:
    seen = served.extra["chat"]
    (root,) = roots_by_client_id(span_dicts(served.collected))[seen["id"]]
    assert seen["id"].startswith("chatcmpl-")
    assert root["attributes"][sc.GEN_AI_OPERATION_NAME] == "chat"
    assert root["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS] == [seen["finish_reason"]]
    assert root["trace_id"] == CALLER_TRACE_ID and root["parent_id"] == CALLER_SPAN_ID
    (once,) = roots_by_client_id(span_dicts(served.collected))[served.extra["chat_once"]["id"]]
    assert once["attributes"][sc.GEN_AI_OPERATION_NAME] == "chat"


def test_served_n2_is_one_trace_with_a_span_per_choice(served: Server) -> None:
    seen = served.extra["n2"]
    spans = span_dicts(served.collected)
    (parent,) = [s for s in spans if s["name"] == sc.SPAN_CHOICES]
    assert parent["attributes"][sc.LLM_REQUEST_ID] == seen["id"]
    assert parent["attributes"][sc.GEN_AI_REQUEST_CHOICE_COUNT] == 2
    assert parent["attributes"][sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME
    assert parent["trace_id"] == CALLER_TRACE_ID and parent["parent_id"] == "b7ad6b7169203331"
    choices = roots_by_client_id(spans)[seen["id"]]
    assert sorted(c["attributes"][sc.LLM_CHOICE_INDEX] for c in choices) == [0, 1]
    assert len({c["attributes"][sc.VLLM_REQUEST_ID] for c in choices}) == 2
    reasons = sorted(c["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS][0] for c in choices)
    assert reasons == seen["finish_reasons"]
    for choice in choices:
        assert choice["trace_id"] == CALLER_TRACE_ID
        assert choice["parent_id"] == parent["span_id"] and choice["kind"] == KIND_INTERNAL
        assert parent["start"] <= choice["start"] <= choice["end"] <= parent["end"]
    assert parent["end"] == max(c["end"] for c in choices)


def test_served_stop_strings_finish_as_the_client_saw(served: Server) -> None:
    seen = served.extra["stop"]
    (root,) = roots_by_client_id(span_dicts(served.collected))[seen["id"]]
    assert root["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS] == [seen["finish_reason"]]


def vllm_aborted_the_leaver(served: Server) -> bool:
    """Whether vLLM aborted the stream whose client went away, by vLLM's own count: it counts every
    request it finished (``vllm:request_success_total``), and an aborted one not. On a busy machine the
    engine may finish that stream before the server sees its client go; then vLLM counts it too."""
    success = served.extra["prometheus"]["vllm:request_success_total"]
    assert success in (served.extra["requests"] - 1, served.extra["requests"]), success
    return success == served.extra["requests"] - 1


def test_served_disconnect_ends_as_vllm_ended_it(served: Server) -> None:
    (root,) = roots_by_client_id(span_dicts(served.collected))[served.extra["disconnect"]["id"]]
    attributes = root["attributes"]
    aborted = vllm_aborted_the_leaver(served)
    print(f"vllm serve: the stream whose client went away was {'aborted' if aborted else 'finished'}")
    if aborted:
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == [sc.REASON_ABORT]
        assert 1 <= attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < 480  # it ended before its length
    else:
        assert attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
        assert attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 480
    assert root["status"] != 2  # an abort is not an error (OTLP STATUS_CODE_ERROR is 2)


def probe_records(server: Server, kind: str) -> list[dict[str, Any]]:
    """The probe's records of one kind (rescheduling_probe), in the order they were written."""
    path = server.extra["probe"]
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def probed_reschedulings(server: Server) -> list[dict[str, Any]]:
    """The engine core's own record of each rescheduling, in the order they came."""
    return probe_records(server, "rescheduling")


def is_subsequence(short: list[Any], long: list[Any]) -> bool:
    """Every item of ``short`` is in ``long``, in the same order."""
    rest = iter(long)
    return all(any(item == other for other in rest) for item in short)


def assert_steps_reach_the_trackers_as_the_engine_core_made_them(server: Server) -> dict[int, int]:
    """The steps the engine core scheduled reach the trackers of the frontends as ``batch()``, in order,
    with vLLM's ``num_scheduled_tokens`` as it is and, as its recompute, the requests vLLM's ``Request``
    says recompute (more than one token: one token counts as decode, the hook's rule): each tracker gets
    a subsequence of the engine's steps holding, at least, every step that held one of its own requests
    (a frontend with no request in flight has no use for a step). Returns the most steps a tracker of
    each frontend (pid) got."""
    steps = probe_records(server, "step")
    assert steps, "the workload scheduled nothing"
    assert len({s["pid"] for s in steps}) == 1 and steps[0]["pid"] != server.proc.pid
    calls: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for call in probe_records(server, "batch"):
        calls.setdefault((call["pid"], call["tracker"]), []).append(call)
    assert calls, "no batch() call reached a tracker in the frontend"
    expected = [(s["scheduled"], sorted(r for r in s["recompute"] if s["scheduled"][r] > 1)) for s in steps]
    assert any(recompute for _, recompute in expected), "12 streams on 20 KV blocks were meant to recompute"
    got: dict[int, int] = {}
    for (pid, _), mine in calls.items():
        assert pid != steps[0]["pid"], "batch() ran in the engine core"
        seen = [(c["scheduled"], c["recompute"]) for c in mine]
        assert is_subsequence(seen, expected), f"tracker in {pid}: steps the engine core did not make"
        own = {rid for c in mine for rid in c["own"]}
        needed = [e for e, s in zip(expected, steps) if own.intersection(s["scheduled"])]
        assert needed and is_subsequence(needed, seen), f"tracker in {pid}: missed a step of its requests"
        got[pid] = max(got.get(pid, 0), len(seen))
    return got


def assert_recompute_figures_are_the_engine_cores(server: Server) -> list[dict[str, Any]]:
    """Every rescheduling the engine core's probe wrote down is on its request's ``llm.recompute`` span,
    in order, with the same cached and to-compute tokens; the request's sums and otel_llm's counters
    agree. Returns the probe's records."""
    probed = probed_reschedulings(server)
    assert probed, "12 streams on 20 KV blocks were meant to preempt and reschedule"
    assert {p["pid"] for p in probed} != {server.proc.pid}, "the probe ran in the engine core, not the server"
    expected: dict[str, list[tuple[int, int]]] = {}
    for p in sorted(probed, key=lambda p: p["ts"]):
        expected.setdefault(p["id"], []).append((p["cached"], p["to_compute"]))
    spans = span_dicts(server.collected)
    parent_of = {s["span_id"]: s["parent_id"] for s in spans}

    def under(span: dict[str, Any], root: dict[str, Any]) -> bool:
        at = span["parent_id"]
        while at is not None and at != root["span_id"]:
            at = parent_of.get(at)
        return at == root["span_id"]

    recomputes = sorted((s for s in spans if s["name"] == sc.SPAN_RECOMPUTE), key=lambda s: s["start"])
    got: dict[str, list[tuple[int, int]]] = {}
    sums: dict[str, tuple[int, int]] = {}
    for root in (s for s in spans if s["name"] == sc.SPAN_REQUEST):
        mine = [s for s in recomputes if s["trace_id"] == root["trace_id"] and under(s, root)]
        if mine:
            vllm_id = root["attributes"][sc.VLLM_REQUEST_ID]
            got[vllm_id] = [
                (a.get(sc.LLM_RECOMPUTE_CACHED_TOKENS), a.get(sc.LLM_RECOMPUTE_TOKENS))
                for a in (s["attributes"] for s in mine)
            ]
            sums[vllm_id] = (
                root["attributes"].get(sc.LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS),
                root["attributes"].get(sc.LLM_PREEMPTIONS_RECOMPUTE_TOKENS),
            )
    assert got == expected
    assert sums == {
        rid: (sum(c for c, _ in figures), sum(t for _, t in figures)) for rid, figures in expected.items()
    }
    expected_counts = (sum(p["to_compute"] for p in probed), sum(p["cached"] for p in probed))

    def counted(collected: object) -> tuple[float, float]:
        points = latest_points(server.collected)
        return tuple(  # type: ignore[return-value]
            total(points.get(name, []), "value")
            for name in (sc.METRIC_RECOMPUTE_TOKENS, sc.METRIC_RECOMPUTE_CACHED_TOKENS)
        )

    # Each serving process exports its metrics every 500 ms: the last export may follow the spans.
    server.collected.wait_until(lambda c: counted(c) == expected_counts, timeout_s=WAIT_S)
    assert counted(server.collected) == expected_counts
    # vLLM's own prefix-cache counts of preempted requests' lookups: the context looked up at each
    # re-admission (found cached + left to compute) and the part found.
    looked_up = probe_records(server, "prefix_cache")
    recomputed, cached = expected_counts
    assert sum(p["hits"] for p in looked_up) == cached
    assert sum(p["queries"] for p in looked_up) == cached + recomputed
    assert "did not say what it found cached" not in server.output()
    return probed


def test_served_recompute_figures_equal_the_engine_cores_own(served: Server) -> None:
    """Under ``vllm serve`` the scheduler runs in the engine-core process; what each rescheduling found
    cached and had to recompute reaches the request's trace from there (engine_core_figures)."""
    probed = assert_recompute_figures_are_the_engine_cores(served)
    assert any(p["cached"] > 0 for p in probed), "a rescheduling that found its own blocks still cached"


def test_served_steps_reach_the_trackers_as_the_engine_core_made_them(served: Server) -> None:
    """Under ``vllm serve`` each step's composition comes from the engine core's process
    (engine_core_figures), so every request has its stall figures, as with the engine core in process."""
    (count,) = assert_steps_reach_the_trackers_as_the_engine_core_made_them(served).values()
    assert count == len(probe_records(served, "step")), "one frontend: it gets every step"
    roots = [s for s in span_dicts(served.collected) if s["name"] == sc.SPAN_REQUEST]
    assert roots and all(sc.LLM_STALLS in r["attributes"] for r in roots)
    assert "engine-core steps failed" not in served.output()


def probed_step_times(server: Server) -> list[tuple[dict[str, Any], float, float | None]]:
    """The engine core's steps (the probe's records) with when each began and the timestamp of the
    outputs it made (None: it made none), paired through the ``SchedulerOutput`` each came with."""
    path = server.extra["probe"]
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    steps: list[dict[str, Any]] = []
    ends: dict[int, float | None] = {}
    waiting: dict[int, int] = {}  # output id -> index of the step still waiting for its outputs
    for r in records:
        if r["kind"] == "step":
            waiting[r["output"]] = len(steps)
            steps.append(r)
        elif r["kind"] == "outputs" and r["output"] in waiting:
            ends[waiting.pop(r["output"])] = r["at"]
    return [(step, step["at"], ends.get(k)) for k, step in enumerate(steps)]


def test_served_engine_time_is_each_requests_share_of_the_engine_cores_steps(served: Server) -> None:
    """``llm.engine.time`` and its recompute part under the cost model (docs/lifecycle.md, "Engine
    time"), from the engine core's side alone (the probe): each step's ``num_scheduled_tokens``, the
    requests vLLM's ``Request`` says recompute, when its scheduling began and the timestamp of its
    outputs (a step with none ends where the next one begins). The steps cross to the frontend through
    the ring; the shares must come out as the engine core's own."""
    timed = probed_step_times(served)
    assert timed, "the workload scheduled nothing"
    total, recompute, busy = shares([(s["scheduled"], start, end, s["recompute"]) for s, start, end in timed])
    roots = [s for s in span_dicts(served.collected) if s["name"] == sc.SPAN_REQUEST]
    got = {r["attributes"][sc.VLLM_REQUEST_ID]: r["attributes"] for r in roots}
    assert set(total) <= set(got)
    assert sum(recompute.values()) > 0, "12 streams on 20 KV blocks were meant to recompute"
    # The client that leaves and the request with stop strings end in the frontend (an abort, a stop
    # string found there) while the engine core still runs steps that hold them, until it hears of it.
    # The tracker works a request's figures out when it ends: those steps' shares are nobody's.
    ended_first = {served.extra["disconnect"]["id"], served.extra["stop"]["id"]}
    frontend_ended = {rid for rid, a in got.items() if a[sc.LLM_REQUEST_ID] in ended_first}
    assert len(frontend_ended) == 2, frontend_ended

    def near(a: float, b: float) -> bool:
        return a == pytest.approx(b, rel=0.02, abs=1e-5)

    off = [
        (
            rid,
            a[sc.LLM_ENGINE_TIME],
            total.get(rid, 0.0),
            a[sc.LLM_ENGINE_TIME_RECOMPUTE],
            recompute.get(rid, 0.0),
        )
        for rid, a in got.items()
        if rid not in frontend_ended
        and not (
            near(a[sc.LLM_ENGINE_TIME], total.get(rid, 0.0))
            and near(a[sc.LLM_ENGINE_TIME_RECOMPUTE], recompute.get(rid, 0.0))
        )
    ]
    summed = sum(a[sc.LLM_ENGINE_TIME] for a in got.values())
    assert not off, (
        f"{len(off)} of {len(got)} off; sum {summed} vs busy {busy} over {len(timed)} steps",
        off,
    )
    for rid in frontend_ended:
        assert 0 < got[rid][sc.LLM_ENGINE_TIME] <= total[rid] * 1.02 + 1e-5, rid
    assert summed == pytest.approx(busy, rel=0.01)


def test_served_counters_equal_the_servers_own_metrics(served: Server) -> None:
    vllm = served.extra["prometheus"]
    points = latest_points(served.collected)
    assert vllm["vllm:num_preemptions_total"] > 0, "12 streams on 20 KV blocks were meant to preempt"
    assert total(points[sc.METRIC_PREEMPTIONS], "value") == vllm["vllm:num_preemptions_total"]
    finished = total(points[sc.METRIC_REQUESTS], "value")
    aborted = total(points[sc.METRIC_REQUESTS], "value", **{sc.LLM_FINISH_REASON: sc.REASON_ABORT})
    assert aborted == vllm_aborted_the_leaver(served)
    assert finished - aborted == vllm["vllm:request_success_total"]  # vLLM counts no aborted request
    tokens = points[sc.METRIC_TOKENS]
    assert total(tokens, "value", **{sc.GEN_AI_TOKEN_TYPE: "output"}) == vllm["vllm:generation_tokens_total"]
    assert total(tokens, "value", **{sc.GEN_AI_TOKEN_TYPE: "input"}) == vllm["vllm:prompt_tokens_total"]
    by_operation = {
        op: total(points[sc.METRIC_REQUESTS], "value", **{sc.GEN_AI_OPERATION_NAME: op})
        for op in ("chat", "text_completion")
    }
    assert by_operation == {"chat": 2, "text_completion": served.extra["requests"] - 2}


def prometheus_by_label(server: Server, sample: str, label: str) -> dict[str, float]:
    """One sample of the server's /metrics by the value of one label, summed over the other labels."""
    values: dict[str, float] = {}
    for family in prometheus_parser.text_string_to_metric_families(server.extra["prometheus_text"]):
        for s in family.samples:
            if s.name == sample:
                values[s.labels[label]] = values.get(s.labels[label], 0.0) + s.value
    return values


def test_served_prompt_tokens_by_source_equal_the_servers(served: Server) -> None:
    theirs = prometheus_by_label(served, "vllm:prompt_tokens_by_source_total", "source")
    assert theirs, "this vLLM exports vllm:prompt_tokens_by_source"
    expected = {
        sc.PROMPT_SOURCE_COMPUTED: theirs.get("local_compute", 0.0),
        sc.PROMPT_SOURCE_PREFIX_CACHE: theirs.get("local_cache_hit", 0.0),
        sc.PROMPT_SOURCE_KV_TRANSFER: theirs.get("external_kv_transfer", 0.0),
    }
    assert expected[sc.PROMPT_SOURCE_COMPUTED] > 0

    def ours(collected: object) -> dict[str, float]:
        points = latest_points(served.collected).get(sc.METRIC_PROMPT_TOKENS, [])
        return {
            source: total(points, "value", **{sc.LLM_PROMPT_TOKENS_SOURCE: source}) for source in expected
        }

    served.collected.wait_until(lambda c: ours(c) == expected, timeout_s=WAIT_S)
    assert ours(served.collected) == expected


def test_served_per_request_preemptions_equal_the_servers_histogram(served: Server) -> None:
    """vLLM's ``vllm:request_num_preemptions`` holds each finished request's preemptions (aborted ones
    not): the same figures as each such request's ``llm.preemptions``, bucket by bucket."""
    buckets = prometheus_by_label(served, "vllm:request_num_preemptions_bucket", "le")
    assert buckets, "this vLLM exports vllm:request_num_preemptions"
    vllm = served.extra["prometheus"]
    roots = [s for s in span_dicts(served.collected) if s["name"] == sc.SPAN_REQUEST]
    finished = [r for r in roots if r["attributes"][sc.GEN_AI_RESPONSE_FINISH_REASONS] != [sc.REASON_ABORT]]
    ours = [r["attributes"].get(sc.LLM_PREEMPTIONS, 0) for r in finished]
    assert sum(ours) > 0, "12 streams on 20 KV blocks were meant to preempt"
    assert len(ours) == vllm["vllm:request_num_preemptions_count"]
    assert sum(ours) == vllm["vllm:request_num_preemptions_sum"]
    for le, count in buckets.items():
        assert sum(n <= float(le) for n in ours) == count, f"bucket le={le}"


def test_served_inter_token_latency_equals_the_servers(served: Server) -> None:
    """vLLM counts inter-token gaps per step, aborted requests included, as we do."""
    vllm = served.extra["prometheus"]
    point = summed(latest_points(served.collected)[sc.METRIC_ITL])
    assert point["count"] == vllm["vllm:inter_token_latency_seconds_count"]
    expected = vllm["vllm:inter_token_latency_seconds_sum"]
    assert point["sum"] == pytest.approx(expected, abs=1e-6 * point["count"])


@pytest.mark.parametrize(
    ("ours", "theirs", "attribute"),
    [
        (sc.METRIC_QUEUE, "vllm:request_queue_time_seconds", sc.LLM_LATENCY_QUEUE),
        (sc.METRIC_PREFILL, "vllm:request_prefill_time_seconds", sc.LLM_LATENCY_PREFILL),
        (sc.METRIC_DECODE, "vllm:request_decode_time_seconds", sc.LLM_LATENCY_DECODE),
        (sc.METRIC_INFERENCE, "vllm:request_inference_time_seconds", sc.LLM_LATENCY_INFERENCE),
    ],
)
def test_served_phase_histograms_equal_the_servers(
    served: Server, ours: str, theirs: str, attribute: str
) -> None:
    """vLLM records phase times for finished requests only; ours also hold the aborted request's."""
    vllm = served.extra["prometheus"]
    point = summed(latest_points(served.collected)[ours])
    (leaver,) = roots_by_client_id(span_dicts(served.collected))[served.extra["disconnect"]["id"]]
    extra = 1 if vllm_aborted_the_leaver(served) else 0  # if finished, vLLM's figures hold it already
    assert point["count"] == vllm[f"{theirs}_count"] + extra
    expected = vllm[f"{theirs}_sum"] + extra * leaver["attributes"][attribute]
    assert point["sum"] == pytest.approx(expected, abs=1e-6 * point["count"])


def test_served_ttft_next_to_the_servers(served: Server) -> None:
    """Same arrival; ours ends at the engine core's batch timestamp, vLLM's when its frontend process
    handles that batch, after the hand-over between the two processes (printed; docs/vllm.md quotes it)."""
    vllm = served.extra["prometheus"]
    point = summed(latest_points(served.collected)[sc.METRIC_TTFT])
    assert point["count"] == vllm["vllm:time_to_first_token_seconds_count"]
    offset = (vllm["vllm:time_to_first_token_seconds_sum"] - point["sum"]) / point["count"]
    print(f"vllm serve: vllm:time_to_first_token_seconds - ours = {offset * 1e3:+.3f} ms per request")
    assert offset >= -1e-4


def test_served_engine_state_equals_the_servers(served: Server) -> None:
    """The engine core's SchedulerStats reach the API server's frontend; once the engine is idle, our
    engine-state metrics (summed over the trackers' points) equal the server's /metrics. An export
    may have been taken between a step's outputs and its stats, so wait for one taken after both."""
    vllm = served.extra["prometheus"]
    expected = {
        "prefix_cache_queries": vllm["vllm:prefix_cache_queries_total"],
        "prefix_cache_hits": vllm["vllm:prefix_cache_hits_total"],
        "step_count": vllm["vllm:iteration_tokens_total_count"],
        "step_sum": vllm["vllm:iteration_tokens_total_sum"],
        "kv_cache_usage": vllm["vllm:kv_cache_usage_perc"],
        "running": vllm["vllm:num_requests_running"],
        "waiting": vllm["vllm:num_requests_waiting"],
    }
    seen: dict[str, float] = {}

    def caught_up(collected: Any) -> bool:
        points = latest_points(collected)
        requests = points.get(sc.METRIC_SCHEDULER_REQUESTS, [])
        seen.update(
            prefix_cache_queries=total(points.get(sc.METRIC_PREFIX_CACHE_QUERIES, []), "value"),
            prefix_cache_hits=total(points.get(sc.METRIC_PREFIX_CACHE_HITS, []), "value"),
            step_count=total(points.get(sc.METRIC_STEP_TOKENS, []), "count"),
            step_sum=total(points.get(sc.METRIC_STEP_TOKENS, []), "sum"),
            kv_cache_usage=total(points.get(sc.METRIC_KV_CACHE_USAGE, []), "value"),
            running=total(requests, "value", **{sc.LLM_REQUEST_STATE: sc.STATE_RUNNING}),
            waiting=total(requests, "value", **{sc.LLM_REQUEST_STATE: sc.STATE_WAITING}),
        )
        return seen == expected

    served.collected.wait_until(caught_up, timeout_s=WAIT_S)
    assert expected["step_count"] > 0 and expected["prefix_cache_queries"] > 0
    assert seen == expected
    # One engine, one report: its state is on one tracker's points (the first request's endpoint).
    assert len(latest_points(served.collected)[sc.METRIC_STEP_TOKENS]) == 1


def test_served_every_histogram_is_exported_with_model_and_operation(served: Server) -> None:
    points = latest_points(served.collected)
    missing = [name for name in HISTOGRAMS if not points.get(name)]
    assert not missing, f"no data points for {missing}"
    for name in HISTOGRAMS:
        for p in points[name]:
            assert p["attributes"][sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME
            assert p["attributes"][sc.GEN_AI_OPERATION_NAME] in ("chat", "text_completion")
            assert p["attributes"][sc.GEN_AI_PROVIDER_NAME] == "vllm"


def server_attributes_seen(server: Server) -> list[dict[str, Any]]:
    """The GenAI server attributes of every llm.request span and every histogram point."""
    keys = (sc.SERVER_ADDRESS, sc.SERVER_PORT, sc.GEN_AI_RESPONSE_MODEL)
    roots = [s["attributes"] for s in span_dicts(server.collected) if s["name"] == sc.SPAN_REQUEST]
    points = latest_points(server.collected)
    assert roots and all(points.get(name) for name in HISTOGRAMS)
    seen = roots + [p["attributes"] for name in HISTOGRAMS for p in points[name]]
    return [{k: a[k] for k in keys if k in a} for a in seen]


def test_served_genai_server_attributes_on_every_span_and_point(served: Server) -> None:
    """--host 127.0.0.1 --port N: both known, and every answer names the served model."""
    want = {sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: served.port, sc.GEN_AI_RESPONSE_MODEL: MODEL_NAME}
    for seen in server_attributes_seen(served):
        assert seen == want


def test_served_resource_from_otel_variables(served: Server) -> None:
    (span, *_) = [s for s in span_dicts(served.collected) if s["name"] == sc.SPAN_REQUEST]
    assert span["resource"]["service.name"] == "vllm-serve-test"


# --- zero code: opentelemetry-instrument vllm serve, with vLLM's own --otlp-traces-endpoint too -------


@pytest.fixture(scope="module")
def zero_code(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("vllm-zero-code")
    ours, theirs = GrpcReceiver(), GrpcReceiver()
    ours.start()
    theirs.start()
    port = free_port()
    env = engine_env(
        tmp,
        OTEL_SERVICE_NAME="vllm-zero-code",
        OTEL_LLM_EXPORT_MODE="in_process",  # this tier's test of the other export mode
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp",
        OTEL_LOGS_EXPORTER="none",
        OTEL_EXPORTER_OTLP_ENDPOINT=ours.endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",  # vLLM's own exporter is gRPC unless ..._TRACES_PROTOCOL says
        **OTLP_FAST,
    )
    command = [
        str(ENGINE_BIN / "opentelemetry-instrument"),
        str(ENGINE_BIN / "vllm"),
        # No --host: vLLM listens on every address, so no server.address is known.
        *serve_args(port, "--otlp-traces-endpoint", theirs.endpoint, host=None),
    ]
    server = start_server(command, env, tmp / "serve.log", ours.collected, port)
    server.extra["theirs"] = theirs.collected
    try:
        server.extra["streams"] = concurrent_streams(server)
        wait_for_requests(server, STREAMS)
        yield server
    finally:
        server.stop()
        ours.stop()
        theirs.stop()


def test_zero_code_on_every_address_has_a_port_and_no_address(zero_code: Server) -> None:
    want = {sc.SERVER_PORT: zero_code.port, sc.GEN_AI_RESPONSE_MODEL: MODEL_NAME}
    for seen in server_attributes_seen(zero_code):
        assert seen == want


def test_zero_code_traces_with_engine_events(zero_code: Server) -> None:
    roots = roots_by_client_id(span_dicts(zero_code.collected))
    spans = span_dicts(zero_code.collected)
    for stream in zero_code.extra["streams"]:
        (root,) = roots[stream["id"]]
        assert root["attributes"][sc.GEN_AI_REQUEST_MODEL] == MODEL_NAME
        assert root["attributes"][sc.GEN_AI_USAGE_OUTPUT_TOKENS] == STREAM_TOKENS
        names = {s["name"] for s in spans if s["trace_id"] == root["trace_id"]}
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= names
    # The engine core's events arrived: vLLM preempted, and the traces show it.
    assert any(s["name"] == sc.SPAN_PREEMPTED for s in spans)


def test_zero_code_exports_every_histogram(zero_code: Server) -> None:
    """Needs otel_llm's histograms to reach the MeterProvider opentelemetry-instrument builds."""
    points = latest_points(zero_code.collected)
    missing = [name for name in HISTOGRAMS if not points.get(name)]
    assert not missing, f"no data points for {missing}"


def test_zero_code_vllms_own_spans_join_ours(zero_code: Server) -> None:
    """The distro set the global TracerProvider first. vLLM's --otlp-traces-endpoint then builds a
    provider of its own that cannot become global, and vLLM records its `llm_request` spans through
    the global one: they go to the OTEL_* endpoint with otel_llm's, none to vLLM's endpoint. Each is
    a child of its request's `llm.request`: one trace per request, not two roots (no caller
    traceparent here, so vLLM alone would start a trace of its own)."""
    ours = span_dicts(zero_code.collected)
    vllms = {s["attributes"].get("gen_ai.request.id"): s for s in ours if s["name"] == "llm_request"}
    roots = roots_by_client_id(ours)
    for stream in zero_code.extra["streams"]:
        (root,) = roots[stream["id"]]
        theirs_here = vllms[f"{stream['id']}-0"]
        assert (theirs_here["trace_id"], theirs_here["parent_id"]) == (root["trace_id"], root["span_id"])
        assert root["parent_id"] is None  # ours is the trace's root
    theirs = span_dicts(zero_code.extra["theirs"])
    assert not [s for s in theirs if s["name"] in ("llm_request", sc.SPAN_REQUEST)]


# --- the engine core without the plugin -----------------------------------------------------------------

LAUNCHER = (
    "import sys\n"
    "from otel_llm.integrations.vllm import VLLMInstrumentor\n"
    "VLLMInstrumentor().instrument()\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv = ['vllm', *sys.argv[1:]]\n"
    "main()\n"
)


def test_unplugged_engine_core_warns_what_to_set(tmp_path: Path) -> None:
    """A launcher script instruments the frontend; the spawned engine core loads no plugin
    (``VLLM_PLUGINS=''``) and vLLM's stats logging is off, so no request event arrives. Under `vllm serve`
    the root logger and its handlers are at ERROR; otel_llm's WARNING must still reach the output and
    name the variable to set."""
    receiver = GrpcReceiver()
    receiver.start()
    port = free_port()
    env = engine_env(tmp_path, VLLM_PLUGINS="")
    command = [str(ENGINE_BIN / "python"), "-c", LAUNCHER, *serve_args(port, "--disable-log-stats")]
    server = start_server(command, env, tmp_path / "serve.log", receiver.collected, port)
    try:
        client(server).completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=4)
        deadline = time.monotonic() + WAIT_S
        while "VLLM_PLUGINS" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        server.stop()
        receiver.stop()
    lines = [line for line in server.output().splitlines() if "otel_llm" in line and "VLLM_PLUGINS" in line]
    assert lines, server.output()[-4000:]
    assert "WARNING" in lines[0]
