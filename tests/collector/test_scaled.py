"""collector-config/scaled/ as a fleet on one machine: agents, trace-id routing, tail-sampling gateways.

Engines send to different agents; the agents' ``load_balancing`` exporters route by trace id to two
gateways; each gateway computes span metrics from every span, tail-samples, and sends what it keeps to its
own trace store (a real OTLP receiver). A tail-sampling decision comes ``decision_wait`` (60 s, as shipped)
after a trace's first span. One module-scoped run, in two stretches that each end with that wait:

1. Traffic: two ``otel-llm demo`` processes on different agents; a scripted engine
   (``scripted_engine.py``: ``RequestTracker`` driven with explicit timestamps, so a first token is as
   slow as the script says on any machine) once exporting every trace and once sampling in-process
   (``OTEL_LLM_TAIL_SAMPLING*``), with the CPU each spent; disaggregated requests whose prefill process
   sends to one agent and whose decode process sends to the other. Then every decision is taken.
2. Gateway 1 restarted twice: killed (SIGKILL) while it holds traces, then stopped (SIGTERM) while it
   holds traces, with more traces sent while it is down, then started again. Then every decision is taken.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_llm import semconv as sc
from tests.collector.processes import poll
from tests.collector.scaled_stack import SCALED, ScaledStack
from tests.otlp_receivers import attributes

REQUESTS = 12  # per demo process
SERVICES = ("otel-llm-demo-a", "otel-llm-demo-b")
DEMOS = "otel-llm-demo-.*"
# gateway.yaml's policies, as its README documents them: what the tests below hold the file to.
SLOW_TTFT_S = 2.0  # slow-first-token: llm.latency.time_to_first_token above this (seconds)
BASELINE = 0.02  # baseline: probabilistic, 2 %
SCRIPT = Path(__file__).with_name("scripted_engine.py")
# The scripted engine's requests, by kind (see scripted_engine.py): first tokens just under and well over
# the slow-first-token threshold, preempted and failed requests.
BENCH = {"fast": 4350, "near": 200, "slow": 200, "preempted": 200, "error": 50}
NEAR_TTFT_S = SLOW_TTFT_S - 0.1
SLOW_OVER_S = SLOW_TTFT_S + 0.5
BENCH_ALL = "otel-llm-bench-every-trace"  # exports every trace; the gateways sample
BENCH_IN_PROCESS = "otel-llm-bench-in-process"  # OTEL_LLM_TAIL_SAMPLING=on, the gateways' rules
PAIRS = 8
PAIR_PREFILL, PAIR_DECODE = "otel-llm-pair-prefill", "otel-llm-pair-decode"
# Disaggregated requests across the stop: prefill half (preempted: kept by `preempted` on its own) before
# it, decode half (fast, no preemption: kept by no policy on its own) while the gateway is down.
ACROSS_PAIRS = 40
ACROSS_PREFILL, ACROSS_DECODE = "otel-llm-across-prefill", "otel-llm-across-decode"
ACROSS_TTFT_S = 0.5
RESTART_REQUESTS = 16  # per phase; all preempted, so the `preempted` policy keeps every one
KILLED, STOPPED, DOWN = "otel-llm-restart-killed", "otel-llm-restart-stopped", "otel-llm-restart-down"
RESTARTED = 1  # the gateway that is killed, stopped and restarted
# A phase's spans are counted at the gateways (span metrics, flushed every 15 s) within this many seconds:
# less than decision_wait, so nothing the gateway holds can have been decided on its timer yet.
RECEIVED_WITHIN_S = 45.0
RETRY = "Exporting failed. Will retry the request after interval."  # the Collector's exporterhelper


@dataclass
class Scripted:
    """One run of scripted_engine.py: its requests, its summary line, the CPU the process used."""

    service: str
    requests: list[dict[str, Any]]
    summary: dict[str, Any]
    process_cpu_s: float  # user + system of the whole child process (getrusage RUSAGE_CHILDREN)

    def trace_ids(self, *kinds: str) -> set[str]:
        return {r["trace_id"] for r in self.requests if not kinds or r.get("kind") in kinds}


@dataclass
class Restart:
    """What the fleet fixture saw while it killed, stopped and restarted gateway ``RESTARTED``."""

    killed: Scripted
    killed_received: dict[str, float]  # gateway label -> its llm.request spans of `killed` (span metrics)
    killed_status: int
    stopped: Scripted
    stopped_received: dict[str, float]
    stopped_in_store_before: set[str]  # trace ids of `stopped` in the restarted gateway's store
    stopped_in_store_after: set[str]
    stopped_status: int
    down: Scripted
    agent_log_while_down: str  # what the agent that `down` went through logged while the gateway was down
    across: list[str]  # trace ids of the disaggregated requests split by the stop
    across_received: dict[str, float]  # gateway label -> prefill halves it received (span metrics)
    across_in_store_after: set[
        str
    ]  # trace ids of prefill halves in the restarted gateway's store after the stop


@dataclass
class Fleet:
    stack: ScaledStack
    decided_at: float = 0.0  # Unix time: every decision of the first stretch taken, before any restart
    bench: dict[str, Scripted] = field(default_factory=dict)
    pairs: list[str] = field(default_factory=list)  # trace ids of the disaggregated requests
    restart: Restart | None = None


def otel_env(stack: ScaledStack, agent: int, service: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{stack.agent_ports[agent]}",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME=service,
        **extra,
    )
    return env


def scripted(
    stack: ScaledStack, work: Path, agent: int, service: str, *args: str, stdin: str = "", **env: str
) -> Scripted:
    """Run scripted_engine.py to the end, exporting to agent ``agent``; nothing may be lost on the way."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=work,
        env=otel_env(stack, agent, service, **env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    summary = lines.pop()["summary"]
    assert summary["spans_lost"] == {} and summary["in_time"], (service, summary)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Scripted(service, lines, summary, cpu)


def mix(counts: dict[str, int]) -> list[str]:
    return [
        "mix",
        "--counts",
        ",".join(f"{kind}={n}" for kind, n in counts.items()),
        f"--near-ttft={NEAR_TTFT_S}",
        f"--slow-ttft={SLOW_OVER_S}",
    ]


def first_stretch(fleet: Fleet, work: Path) -> None:
    stack = fleet.stack
    demos: list[subprocess.Popen] = []
    try:
        for agent, service in enumerate(SERVICES):
            demos.append(
                subprocess.Popen(
                    [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", str(REQUESTS)],
                    cwd=work,
                    env=otel_env(stack, agent, service),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for demo in demos:
            _, err = demo.communicate(timeout=300)
            assert demo.returncode == 0, err
    finally:
        for demo in demos:
            if demo.poll() is None:
                demo.kill()
                demo.wait(10)
    # The same requests (same seed, so the same kinds in the same order) twice, one run after the other.
    fleet.bench[BENCH_ALL] = scripted(stack, work, 0, BENCH_ALL, *mix(BENCH), "--seed=1")
    fleet.bench[BENCH_IN_PROCESS] = scripted(
        stack,
        work,
        1,
        BENCH_IN_PROCESS,
        *mix(BENCH),
        "--seed=1",
        OTEL_LLM_TAIL_SAMPLING="on",
        OTEL_LLM_TAIL_SAMPLING_RATIO=str(BASELINE),
        OTEL_LLM_TAIL_SAMPLING_TTFT_S=str(SLOW_TTFT_S),
    )
    # Disaggregated: the prefill process (agent 0) hands each request's carrier to the decode process
    # (agent 1), as the KV transfer's metadata would carry it.
    prefill = scripted(stack, work, 0, PAIR_PREFILL, "prefill", f"--pairs={PAIRS}", f"--ttft={SLOW_OVER_S}")
    decode = scripted(stack, work, 1, PAIR_DECODE, "decode", f"--ttft={SLOW_OVER_S}", stdin=handed(prefill))
    assert prefill.trace_ids() == decode.trace_ids()
    fleet.pairs = sorted(prefill.trace_ids())


def handed(prefill: Scripted) -> str:
    """The prefill process's lines (request id, trace id, carrier), as the decode process reads them."""
    return "".join(json.dumps(r) + "\n" for r in prefill.requests)


def settle(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float) -> Any:
    """``fetch()`` again until ``done`` holds of its result or ``timeout_s`` passes; the last result. The
    tests assert what it shows: a fleet that does not get there fails them, not the fixture."""
    deadline = time.monotonic() + timeout_s
    result = fetch()
    while not done(result) and time.monotonic() < deadline:
        time.sleep(0.5)
        result = fetch()
    return result


def retried(log: str, endpoint: str) -> bool:
    """Whether an agent's log says it will retry an export to ``endpoint``."""
    return any(RETRY in line and endpoint in line for line in log.splitlines())


def received(stack: ScaledStack, service: str, n: int, span: str = sc.SPAN_REQUEST) -> dict[str, float]:
    """gateway label -> ``span`` spans of ``service`` it received, once they add up to ``n`` (or what
    the span metrics say after ``RECEIVED_WITHIN_S``; the tests check it is all of them)."""
    return settle(
        lambda: span_metric_calls(stack, span, service),
        lambda calls: sum(calls.values()) >= n,
        timeout_s=RECEIVED_WITHIN_S,
    )


def second_stretch(fleet: Fleet, work: Path, wait_s: float, batch_s: float) -> Restart:
    stack = fleet.stack
    preempted = mix({"preempted": RESTART_REQUESTS})
    # Killed while it holds traces it has not decided yet.
    killed = scripted(stack, work, 0, KILLED, *preempted, "--seed=2")
    killed_received = received(stack, KILLED, RESTART_REQUESTS)
    killed_status = stack.kill_gateway(RESTARTED)
    stack.restart_gateway(RESTARTED)
    # Stopped (SIGTERM) while it holds traces it has not decided yet: whole ones, and the prefill halves
    # of disaggregated requests whose decode halves come later.
    stopped = scripted(stack, work, 0, STOPPED, *preempted, "--seed=3")
    across = [f"--ttft={ACROSS_TTFT_S}"]
    across_prefill = scripted(
        stack, work, 0, ACROSS_PREFILL, "prefill", f"--pairs={ACROSS_PAIRS}", "--preempt", *across
    )
    stopped_received = received(stack, STOPPED, RESTART_REQUESTS)
    across_received = received(stack, ACROSS_PREFILL, ACROSS_PAIRS, sc.SPAN_INSTANCE_PREFILL)
    store = stack.stores[RESTARTED]
    before = traces_of(stack, STOPPED, RESTARTED) | traces_of(stack, ACROSS_PREFILL, RESTARTED)
    stopped_status = stack.stop_gateway(RESTARTED)
    # The gateway exported before it exited; a short grace for the last answer to be recorded.
    held = stopped_received.get(gateway(RESTARTED), 0) + across_received.get(gateway(RESTARTED), 0)
    store.collected.wait_until(
        lambda _: (
            len(traces_of(stack, STOPPED, RESTARTED) | traces_of(stack, ACROSS_PREFILL, RESTARTED)) >= held
        ),
        timeout_s=5,
    )
    after = traces_of(stack, STOPPED, RESTARTED)
    across_after = traces_of(stack, ACROSS_PREFILL, RESTARTED)
    # Sent while it is down, through the other agent.
    agent = stack.agents[1]
    log_from = len(agent.log())
    down = scripted(stack, work, 1, DOWN, *preempted, "--seed=4")
    across_decode = scripted(stack, work, 1, ACROSS_DECODE, "decode", *across, stdin=handed(across_prefill))
    assert across_decode.trace_ids() == across_prefill.trace_ids()
    endpoint = f"127.0.0.1:{stack.gateway_ports[RESTARTED]}"
    log_while_down = settle(lambda: agent.log()[log_from:], lambda log: retried(log, endpoint), timeout_s=30)
    stack.restart_gateway(RESTARTED)
    # Every decision of this stretch: the traces sent while it was down reach it when the agent's next
    # retry does, then wait decision_wait like any other. The decode halves that no policy keeps leave
    # no trace in a store: their decisions are due decision_wait after the gateways counted them all.
    other = gateway(1 - RESTARTED)
    counted: list[float] = []

    def look() -> dict[str, Any]:
        if (
            not counted
            and sum(span_metric_calls(stack, sc.SPAN_REQUEST, ACROSS_DECODE).values()) >= ACROSS_PAIRS
        ):
            counted.append(time.monotonic())
        return {service: roots(stack, service) for service in (KILLED, STOPPED, DOWN, ACROSS_DECODE)}

    settle(
        look,
        lambda found: (
            len(found[DOWN]) == RESTART_REQUESTS
            and len(found[ACROSS_DECODE]) >= across_received.get(other, 0)
            and len(found[STOPPED]) >= stopped_received.get(other, 0) + len(after)
            and len(found[KILLED]) >= killed_received.get(other, 0)
            and bool(counted)
            and time.monotonic() > counted[0] + wait_s + batch_s
        ),
        timeout_s=wait_s + batch_s + 90,
    )
    return Restart(
        killed=killed,
        killed_received=killed_received,
        killed_status=killed_status,
        stopped=stopped,
        stopped_received=stopped_received,
        stopped_in_store_before=before,
        stopped_in_store_after=after,
        stopped_status=stopped_status,
        down=down,
        agent_log_while_down=log_while_down,
        across=sorted(across_prefill.trace_ids()),
        across_received=across_received,
        across_in_store_after=across_after,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("scaled")
    stack = None
    try:
        stack = ScaledStack(work)
        run = Fleet(stack)
        first_stretch(run, work)
        config = yaml.safe_load((SCALED / "gateway.yaml").read_text())
        wait_s = float(config["processors"]["tail_sampling"]["decision_wait"].rstrip("s"))
        batch_s = float(config["processors"]["batch"]["timeout"].rstrip("s"))
        time.sleep(wait_s + batch_s + 5)  # every decision taken and its batch sent
        run.decided_at = time.time()
        run.restart = second_stretch(run, work, wait_s, batch_s)
        yield run
    finally:
        if stack is not None:
            stack.stop()


# --- reading what the gateways kept ------------------------------------------------------------------


def gateway(index: int) -> str:
    return f"gateway-{index}"  # its HOSTNAME, the `gateway` label of its span metrics


def kept(stack: ScaledStack) -> dict[str, dict[int, list[tuple[Any, Any]]]]:
    """trace id -> {gateway index: its (resource, span) pairs} over what each gateway's store received."""
    traces: dict[str, dict[int, list[tuple[Any, Any]]]] = {}
    for index, store in enumerate(stack.stores):
        for res, span in store.collected.spans():
            traces.setdefault(span.trace_id.hex(), {}).setdefault(index, []).append((res, span))
    return traces


def service_of(res: Any) -> str:
    return attributes(res.attributes).get("service.name", "")


def traces_of(stack: ScaledStack, service: str, store: int) -> set[str]:
    """Trace ids with a span of ``service`` in gateway ``store``'s store."""
    return {
        span.trace_id.hex()
        for res, span in stack.stores[store].collected.spans()
        if service_of(res) == service
    }


def roots(stack: ScaledStack, service: str | None = None, store: int | None = None) -> dict[str, dict]:
    """trace id -> attributes (plus ``error`` and ``gateway``) of every kept llm.request of ``service``."""
    found = {}
    for index, each in enumerate(stack.stores):
        if store is not None and index != store:
            continue
        for res, span in each.collected.spans():
            if span.name == sc.SPAN_REQUEST and (service is None or service_of(res) == service):
                found[span.trace_id.hex()] = {
                    **attributes(span.attributes),
                    "error": span.status.code == 2,
                    "gateway": index,
                    "service": service_of(res),
                }
    return found


def span_metric_calls(
    stack: ScaledStack, span_name: str | None, services: str, at: float | None = None
) -> dict[str, float]:
    """gateway label -> span-metrics call count of ``span_name`` (every span when None) of the services
    matching the regular expression ``services``."""
    match = f'service_name=~"{services}"' + (f', span_name="{span_name}"' if span_name else "")
    series = stack.promql(f"sum by (gateway) (traces_span_metrics_calls_total{{{match}}})", at)
    return {s["metric"].get("gateway", ""): float(s["value"][1]) for s in series}


def spans_of(counts: dict[str, int]) -> int:
    """Spans of the scripted requests: llm.request, llm.queue, llm.prefill and llm.decode each, plus
    llm.preempted and llm.recompute for the preempted one (docs/lifecycle.md)."""
    return 4 * sum(counts.values()) + 2 * counts.get("preempted", 0)


def at_most_baseline(n: int) -> int:
    """More than this many of ``n`` traces kept by the 2 % baseline alone: under one chance in a million."""
    mean = BASELINE * n
    return int(mean + 5 * (mean * (1 - BASELINE)) ** 0.5 + 3)


# --- the fleet as shipped ----------------------------------------------------------------------------


def test_agents_run_the_shipped_file_but_for_their_addresses_and_resolver(fleet: Fleet) -> None:
    assert fleet.stack.agent_changes == {
        "receivers.otlp.protocols.grpc.endpoint",
        "receivers.otlp.protocols.http.endpoint",
        "exporters.load_balancing.resolver.dns",
        "exporters.load_balancing.resolver.static",
    }


def test_every_kept_trace_is_whole_on_exactly_one_gateway(fleet: Fleet) -> None:
    traces = kept(fleet.stack)
    assert traces
    stores = fleet.stack.stores
    assert all(store.collected.spans() for store in stores), "routing sent every trace to one gateway"
    # The disaggregated requests split by a gateway's stop have a test of their own, below.
    split_by_the_stop = set(fleet.restart.across) if fleet.restart else set()
    for trace_id, by_gateway in traces.items():
        assert len(by_gateway) == 1, f"{trace_id} reached gateways {sorted(by_gateway)}"
        if trace_id in split_by_the_stop:
            continue
        (spans,) = by_gateway.values()
        (root,) = [s for _, s in spans if s.name == sc.SPAN_REQUEST]
        names = [s.name for _, s in spans]
        assert {sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE} <= set(names), trace_id
        preemptions = attributes(root.attributes)[sc.LLM_PREEMPTIONS]
        assert names.count(sc.SPAN_PREEMPTED) == names.count(sc.SPAN_RECOMPUTE) == preemptions, trace_id


def test_the_agents_route_by_trace_id(fleet: Fleet) -> None:
    # One process's 5,000 traces: both gateways get a share (routing by service would send all to one).
    # That the spans of one trace go to one gateway: the tests of whole traces and disaggregated requests.
    calls = span_metric_calls(fleet.stack, sc.SPAN_REQUEST, BENCH_ALL, at=fleet.decided_at)
    assert set(calls) == {gateway(0), gateway(1)} and all(calls.values()), calls


def test_span_metrics_count_every_request_before_sampling(fleet: Fleet) -> None:
    calls = poll(
        "span metrics of every demo request in Prometheus",
        lambda: span_metric_calls(fleet.stack, sc.SPAN_REQUEST, DEMOS, at=fleet.decided_at),
        lambda c: sum(c.values()) >= 2 * REQUESTS,
        timeout_s=60,
    )
    assert sum(calls.values()) == 2 * REQUESTS
    assert set(calls) == {"gateway-0", "gateway-1"}


def test_tail_sampling_keeps_what_the_policies_say(fleet: Fleet) -> None:
    kept_roots = [r for r in roots(fleet.stack).values() if r["service"] in SERVICES]
    # Every preemption span the gateways saw (span metrics count them before sampling) is in a kept trace.
    preempted = poll(
        "span metrics of the preemptions",
        lambda: sum(span_metric_calls(fleet.stack, sc.SPAN_PREEMPTED, DEMOS, at=fleet.decided_at).values()),
        lambda total: total > 0,
        timeout_s=60,
    )
    assert sum(r[sc.LLM_PREEMPTIONS] for r in kept_roots) == preempted
    # What no policy but the 2 % baseline keeps stays a small share of everything.
    rest = [
        r
        for r in kept_roots
        if not r["error"] and r[sc.LLM_PREEMPTIONS] == 0 and r.get(sc.LLM_LATENCY_TTFT, 0) <= SLOW_TTFT_S
    ]
    assert len(rest) <= 2, rest


# --- (a) the slow-first-token policy ------------------------------------------------------------------


def test_slow_first_token_policy_keeps_every_slow_request_and_only_those(fleet: Fleet) -> None:
    run = fleet.bench[BENCH_ALL]
    kinds = {r["trace_id"]: r["kind"] for r in run.requests}
    # Every request went over the wire: the gateways counted each one before sampling.
    calls = span_metric_calls(fleet.stack, sc.SPAN_REQUEST, BENCH_ALL, at=fleet.decided_at)
    assert sum(calls.values()) == sum(BENCH.values())
    assert run.summary["spans_delivered"] == spans_of(BENCH)
    kept_roots = roots(fleet.stack, BENCH_ALL)
    by_kind: dict[str, list[dict]] = {kind: [] for kind in BENCH}
    for trace_id, root in kept_roots.items():
        by_kind[kinds[trace_id]].append(root)
    # A slow request is neither preempted nor failed: only slow-first-token (or the 2 % baseline, for
    # all 200 of them one chance in 10^340) keeps it.
    assert len(by_kind["slow"]) == BENCH["slow"]
    for root in by_kind["slow"]:
        assert root[sc.LLM_PREEMPTIONS] == 0 and not root["error"]
        assert root[sc.LLM_LATENCY_TTFT] == pytest.approx(SLOW_OVER_S)
    assert len(by_kind["preempted"]) == BENCH["preempted"]
    assert len(by_kind["error"]) == BENCH["error"]
    # Just under the threshold, and fast: the baseline's share only.
    for kind in ("near", "fast"):
        assert len(by_kind[kind]) <= at_most_baseline(BENCH[kind]), (kind, len(by_kind[kind]))
    for root in by_kind["near"]:
        assert root[sc.LLM_LATENCY_TTFT] == pytest.approx(NEAR_TTFT_S)


# --- (d) otel-llm's tail sampling beside the gateways' --------------------------------------------------


def kept_in_process(run: Scripted) -> dict[str, str]:
    """trace id -> the rule that keeps it, by otel_llm.sampling's rules with the gateways' thresholds."""
    bound = int(BASELINE * (1 << 64))
    rules = {"error": "error", "preempted": "preempted", "slow": "slow_ttft"}
    keep = {}
    for r in run.requests:
        if r["kind"] in rules:
            keep[r["trace_id"]] = rules[r["kind"]]
        elif int(r["trace_id"], 16) & ((1 << 64) - 1) < bound:
            keep[r["trace_id"]] = "ratio"
    return keep


def test_in_process_tail_sampling_sends_only_what_its_rules_keep(fleet: Fleet) -> None:
    run = fleet.bench[BENCH_IN_PROCESS]
    keep = kept_in_process(run)
    kinds = {r["trace_id"]: r["kind"] for r in run.requests}
    expected = {kind: sum(1 for t in keep if kinds[t] == kind) for kind in BENCH}
    # On the wire: the spans of the kept requests, and nothing else.
    assert run.summary["spans_delivered"] == spans_of(expected)
    calls = span_metric_calls(fleet.stack, sc.SPAN_REQUEST, BENCH_IN_PROCESS, at=fleet.decided_at)
    assert sum(calls.values()) == len(keep)
    every = span_metric_calls(fleet.stack, None, BENCH_IN_PROCESS, at=fleet.decided_at)
    assert sum(every.values()) == spans_of(expected)
    # otel-llm's own account of its decisions (otel_llm.sampling.decisions, through the gateways'
    # metrics pipeline into Prometheus).
    series = fleet.stack.promql(
        f'sum by (decision, reason) (otel_llm_sampling_decisions_total{{job="{BENCH_IN_PROCESS}"}})',
        at=fleet.decided_at,
    )
    decisions = {(s["metric"]["decision"], s["metric"]["reason"]): int(float(s["value"][1])) for s in series}
    by_rule = {rule: sum(1 for r in keep.values() if r == rule) for rule in set(keep.values())}
    assert decisions == {
        **{("keep", rule): n for rule, n in by_rule.items()},
        ("drop", "ratio"): sum(BENCH.values()) - len(keep),
    }
    # The gateways then apply their own policies to what arrives: failed, preempted and slow requests
    # are kept by both; a request kept for the ratio alone passes the gateway's baseline at its 2 %.
    kept_roots = roots(fleet.stack, BENCH_IN_PROCESS)
    assert set(kept_roots) <= set(keep)
    assert {t for t, rule in keep.items() if rule != "ratio"} <= set(kept_roots)
    ratio_only = [t for t in kept_roots if keep[t] == "ratio"]
    assert len(ratio_only) <= at_most_baseline(by_rule.get("ratio", 0))


def test_report_in_process_and_gateway_sampling_side_by_side(fleet: Fleet) -> None:
    """The figures of collector-config/scaled/README.md (printed; no time or CPU figure is asserted)."""
    rows = []
    for name, run in fleet.bench.items():
        wire = sum(span_metric_calls(fleet.stack, None, name, at=fleet.decided_at).values())
        assert wire == run.summary["spans_delivered"]
        kinds = {r["trace_id"]: r["kind"] for r in run.requests}
        stored = roots(fleet.stack, name)
        by_kind = {kind: sum(1 for t in stored if kinds[t] == kind) for kind in BENCH}
        rows.append(
            f"{name}: {len(run.requests)} requests; spans on the wire {run.summary['spans_delivered']} "
            f"(the gateways counted {int(wire)}); traces in the stores {len(stored)} {by_kind}; engine CPU "
            f"{run.summary['cpu_s']:.2f} s from its first request to the end of its shutdown, "
            f"{run.process_cpu_s:.2f} s whole process"
        )
    print("\n" + "\n".join(rows))


# --- (b) a disaggregated request across two processes and two agents -----------------------------------


def test_a_disaggregated_request_is_whole_on_exactly_one_gateway(fleet: Fleet) -> None:
    traces = kept(fleet.stack)
    for trace_id in fleet.pairs:
        # The decode half's first token is slow: slow-first-token keeps the trace, and with it the
        # prefill half (which no policy keeps on its own) only when both halves reached the same gateway.
        by_gateway = traces.get(trace_id, {})
        assert len(by_gateway) == 1, f"{trace_id} reached gateways {sorted(by_gateway)}"
        (spans,) = by_gateway.values()
        halves: dict[str, list[str]] = {}
        for res, span in spans:
            halves.setdefault(service_of(res), []).append(span.name)
        assert sorted(halves[PAIR_PREFILL]) == sorted(
            [sc.SPAN_INSTANCE_PREFILL, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_KV_TRANSFER]
        ), trace_id
        assert sorted(halves[PAIR_DECODE]) == sorted(
            [sc.SPAN_REQUEST, sc.SPAN_INSTANCE_DECODE, sc.SPAN_KV_TRANSFER, sc.SPAN_QUEUE, sc.SPAN_DECODE]
        ), trace_id
        assert set(halves) == {PAIR_PREFILL, PAIR_DECODE}
    # Both processes' spans of every pair, and only of the pairs, were counted before sampling.
    for service, per_request in ((PAIR_PREFILL, 4), (PAIR_DECODE, 5)):
        calls = span_metric_calls(fleet.stack, None, service, at=fleet.decided_at)
        assert sum(calls.values()) == PAIRS * per_request, service


# --- (c) a gateway killed, stopped, restarted ---------------------------------------------------------


def test_a_killed_gateway_loses_the_traces_it_held_and_only_those(fleet: Fleet) -> None:
    restart = fleet.restart
    assert restart is not None
    assert restart.killed_status == -9
    received = restart.killed_received
    assert sum(received.values()) == RESTART_REQUESTS, received  # the gateways had them all
    assert received.get(gateway(RESTARTED), 0) > 0, received  # it held some when it died
    found = roots(fleet.stack, KILLED)
    # What the other gateway held, it decided as usual; what the killed one held reached no store.
    assert {r["gateway"] for r in found.values()} <= {1 - RESTARTED}
    assert len(found) == received.get(gateway(1 - RESTARTED), 0)
    assert len(found) + received.get(gateway(RESTARTED), 0) == RESTART_REQUESTS


def test_a_stopped_gateway_decides_what_it_held_before_it_exits(fleet: Fleet) -> None:
    restart = fleet.restart
    assert restart is not None
    assert restart.stopped_status == 0  # a clean exit within the stop's 30 s, not a SIGKILL
    assert sum(restart.stopped_received.values()) == RESTART_REQUESTS, restart.stopped_received
    held = restart.stopped_received.get(gateway(RESTARTED), 0)
    assert held > 0, restart.stopped_received
    # Not yet decided when the stop began (sent less than decision_wait before), all kept when it ended.
    assert restart.stopped_in_store_before == set()
    assert len(restart.stopped_in_store_after) == held
    # Nothing of it was lost: the other gateway decided its share as usual.
    assert len(roots(fleet.stack, STOPPED)) == RESTART_REQUESTS


def test_traces_sent_while_a_gateway_is_down_reach_it_when_it_is_back(fleet: Fleet) -> None:
    restart = fleet.restart
    assert restart is not None
    found = roots(fleet.stack, DOWN)
    assert len(found) == RESTART_REQUESTS  # none lost
    # Not moved to the other gateway: the static resolver's list stays as it is, and the agent retried.
    on_restarted = [t for t, r in found.items() if r["gateway"] == RESTARTED]
    assert on_restarted, "no trace of this phase routed to the restarted gateway"
    endpoint = f"127.0.0.1:{fleet.stack.gateway_ports[RESTARTED]}"
    assert retried(restart.agent_log_while_down, endpoint), restart.agent_log_while_down[-4000:]
    # The restarted gateway counts them in span metrics from zero: one writer of these series, itself.
    calls = span_metric_calls(fleet.stack, sc.SPAN_REQUEST, DOWN)
    assert calls.get(gateway(RESTARTED)) == len(on_restarted), calls
    assert sum(calls.values()) == RESTART_REQUESTS


def test_a_trace_across_a_gateway_restart_is_decided_in_two_parts(fleet: Fleet) -> None:
    """The restarted gateway has lost its decision caches: the decode halves that reach it after the
    restart are judged on their own, and no policy keeps a fast, unpreempted decode half."""
    restart = fleet.restart
    assert restart is not None
    traces = kept(fleet.stack)
    assert sum(restart.across_received.values()) == ACROSS_PAIRS, restart.across_received
    held = restart.across_received.get(gateway(RESTARTED), 0)
    assert held > 0, restart.across_received
    # The prefill halves it held (preempted: kept by `preempted`) were decided and kept at the stop.
    assert len(restart.across_in_store_after) == held
    decode_halves_kept = 0
    for trace_id in restart.across:
        by_gateway = traces.get(trace_id, {})
        assert len(by_gateway) == 1, f"{trace_id} reached gateways {sorted(by_gateway)}"
        ((index, spans),) = by_gateway.items()
        services = {service_of(res) for res, _ in spans}
        if index != RESTARTED:  # both halves within one decision_wait on a gateway that kept running
            assert services == {ACROSS_PREFILL, ACROSS_DECODE}, trace_id
            continue
        assert trace_id in restart.across_in_store_after
        decode_halves_kept += ACROSS_DECODE in services
    # The decode halves did reach it (span metrics count them), then only the 2 % baseline kept any.
    calls = span_metric_calls(fleet.stack, sc.SPAN_REQUEST, ACROSS_DECODE)
    assert calls.get(gateway(RESTARTED)) == held, calls
    assert decode_halves_kept <= at_most_baseline(held), decode_halves_kept
