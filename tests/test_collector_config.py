"""The collector, Prometheus, Tempo and Grafana files in collector-config/ agree with what otel_llm emits.

No collector or container runs here (none is available in CI); instead each check is a small function
that returns a list of problems, run once on the real files and once on a deliberately broken copy,
so every check is shown to be able to fail. Names come from ``otel_llm.semconv``: renaming a span,
attribute or metric there breaks these tests until the configs follow.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_llm import semconv
from otel_llm.kit.engine import telemetry as engine_telemetry

CONFIG_DIR = Path(__file__).resolve().parent.parent / "collector-config"
LOCAL = CONFIG_DIR / "local"
SCALED = CONFIG_DIR / "scaled"
COLLECTOR_FILES = [
    LOCAL / "otelcol.yaml",
    LOCAL / "otelcol-replay.yaml",
    SCALED / "agent.yaml",
    SCALED / "gateway.yaml",
]
DASHBOARD = LOCAL / "grafana" / "dashboards" / "otel-llm.json"
DATASOURCES = LOCAL / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
COMPOSE = LOCAL / "compose.yaml"

# Component type names the collector has renamed (lower_snake_case) or removed; configs must use the
# current names so they keep loading when the deprecated aliases go away.
DEPRECATED_TYPES = {
    "exporters": {"otlp", "otlphttp", "loadbalancing", "prometheusremotewrite", "jaeger", "logging"},
    "receivers": {"otlpjsonfile", "prometheusremotewrite"},
    "connectors": {"spanmetrics"},
    "processors": {"spanmetrics"},
}
# Connectors: (signal they consume as an exporter, signal they emit as a receiver); None = same signal.
CONNECTOR_SIGNALS = {"span_metrics": ("traces", "metrics"), "forward": None}
SIGNALS = {"traces", "metrics", "logs"}


def load_yaml(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)
    assert isinstance(data, dict), f"{path} is not a YAML mapping"
    return data


def component_type(component_id: str) -> str:
    """``otlp_grpc/tempo`` -> ``otlp_grpc``: the collector's type/name convention."""
    return component_id.split("/", 1)[0]


# --- collector pipelines ---------------------------------------------------------------------------


def pipeline_problems(config: dict[str, Any]) -> list[str]:
    """Everything a pipeline references is defined; connectors join two pipelines of the right signals."""
    problems: list[str] = []
    defined = {
        kind: set(config.get(kind) or {}) for kind in ("receivers", "processors", "exporters", "connectors")
    }
    for kind, names in DEPRECATED_TYPES.items():
        for component in defined.get(kind, set()):
            if component_type(component) in names:
                problems.append(f"{kind[:-1]} {component!r} uses a deprecated type name")
    service = config.get("service") or {}
    for extension in service.get("extensions") or []:
        if extension not in (config.get("extensions") or {}):
            problems.append(f"extension {extension!r} is enabled but not defined")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("no pipelines")
    connector_in: dict[str, set[str]] = {c: set() for c in defined["connectors"]}
    connector_out: dict[str, set[str]] = {c: set() for c in defined["connectors"]}
    used: set[str] = set()
    for name, pipeline in pipelines.items():
        signal = component_type(name)
        if signal not in SIGNALS:
            problems.append(f"pipeline {name!r}: unknown signal {signal!r}")
        if not pipeline.get("receivers") or not pipeline.get("exporters"):
            problems.append(f"pipeline {name!r} needs receivers and exporters")
        for receiver in pipeline.get("receivers") or []:
            used.add(receiver)
            if receiver in defined["connectors"]:
                connector_out[receiver].add(signal)
            elif receiver not in defined["receivers"]:
                problems.append(f"pipeline {name!r}: receiver {receiver!r} is not defined")
        for processor in pipeline.get("processors") or []:
            used.add(processor)
            if processor not in defined["processors"]:
                problems.append(f"pipeline {name!r}: processor {processor!r} is not defined")
        processors = pipeline.get("processors") or []
        if "memory_limiter" in {component_type(p) for p in processors} and component_type(processors[0]) != (
            "memory_limiter"
        ):
            problems.append(f"pipeline {name!r}: memory_limiter must come first")
        for exporter in pipeline.get("exporters") or []:
            used.add(exporter)
            if exporter in defined["connectors"]:
                connector_in[exporter].add(signal)
            elif exporter not in defined["exporters"]:
                problems.append(f"pipeline {name!r}: exporter {exporter!r} is not defined")
    for connector in defined["connectors"]:
        if not connector_in[connector] or not connector_out[connector]:
            problems.append(
                f"connector {connector!r} must be an exporter in one pipeline and a receiver in another"
            )
            continue
        expected = CONNECTOR_SIGNALS.get(component_type(connector), "unknown")
        if expected == "unknown":
            problems.append(f"connector {connector!r}: unknown type, add it to CONNECTOR_SIGNALS")
        elif expected is None and connector_in[connector] != connector_out[connector]:
            problems.append(f"connector {connector!r} must join pipelines of one signal")
        elif expected and (
            connector_in[connector] != {expected[0]} or connector_out[connector] != {expected[1]}
        ):
            problems.append(f"connector {connector!r} must go from {expected[0]} to {expected[1]}")
    for kind in ("receivers", "processors", "exporters"):
        for component in defined[kind] - used:
            problems.append(f"{kind[:-1]} {component!r} is defined but in no pipeline")
    return problems


@pytest.mark.parametrize("path", COLLECTOR_FILES, ids=lambda p: str(p.relative_to(CONFIG_DIR)))
def test_collector_config_pipelines_are_complete(path: Path) -> None:
    assert pipeline_problems(load_yaml(path)) == []


def test_every_yaml_file_parses() -> None:
    files = sorted(CONFIG_DIR.rglob("*.yaml")) + sorted(CONFIG_DIR.rglob("*.yml"))
    assert len(files) >= 10, files
    for path in files:
        load_yaml(path)


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Merge the way the collector merges several --config files: maps recursively, the rest replaced."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def test_tls_overlay_merges_into_a_valid_config_with_cert_and_key() -> None:
    merged = deep_merge(load_yaml(LOCAL / "otelcol.yaml"), load_yaml(LOCAL / "otelcol-tls.yaml"))
    assert pipeline_problems(merged) == []
    for protocol in ("grpc", "http"):
        tls = merged["receivers"]["otlp"]["protocols"][protocol]["tls"]
        assert tls["cert_file"] and tls["key_file"]


def test_pipeline_check_catches_broken_configs() -> None:
    gateway = load_yaml(SCALED / "gateway.yaml")
    undefined = copy.deepcopy(gateway)
    undefined["service"]["pipelines"]["traces/sampled"]["processors"].append("tail_smapling")
    assert any("'tail_smapling' is not defined" in p for p in pipeline_problems(undefined))

    dangling = copy.deepcopy(gateway)
    del dangling["service"]["pipelines"]["metrics/span_metrics"]
    assert any("connector 'span_metrics'" in p for p in pipeline_problems(dangling))

    wrong_signal = copy.deepcopy(gateway)
    wrong_signal["service"]["pipelines"]["logs/span_metrics"] = wrong_signal["service"]["pipelines"].pop(
        "metrics/span_metrics"
    )
    assert any("must go from traces to metrics" in p for p in pipeline_problems(wrong_signal))

    old_name = copy.deepcopy(load_yaml(LOCAL / "otelcol.yaml"))
    old_name["exporters"]["otlp/jaeger"] = old_name["exporters"].pop("otlp_grpc/jaeger")
    old_name["service"]["pipelines"]["traces"]["exporters"][0] = "otlp/jaeger"
    assert any("deprecated type name" in p for p in pipeline_problems(old_name))


def test_local_collector_sends_traces_to_jaeger_and_tempo_and_metrics_with_exemplars() -> None:
    config = load_yaml(LOCAL / "otelcol.yaml")
    pipelines = config["service"]["pipelines"]
    endpoints = {config["exporters"][e]["endpoint"] for e in pipelines["traces"]["exporters"]}
    assert endpoints == {"jaeger:4317", "tempo:4317"}
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    assert config["exporters"]["prometheus"]["enable_open_metrics"] is True
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317") and protocols["http"]["endpoint"].endswith(":4318")


def test_agent_routes_traces_by_trace_id() -> None:
    agent = load_yaml(SCALED / "agent.yaml")
    assert agent["exporters"]["load_balancing"]["routing_key"] == "traceID"
    assert agent["service"]["pipelines"]["traces"]["exporters"] == ["load_balancing"]


def test_gateway_computes_span_metrics_before_tail_sampling() -> None:
    pipelines = load_yaml(SCALED / "gateway.yaml")["service"]["pipelines"]
    for name, pipeline in pipelines.items():
        if "span_metrics" in pipeline["exporters"]:
            assert "tail_sampling" not in (pipeline.get("processors") or []), name
            assert "otlp" in pipeline["receivers"], f"{name} must see every span received"
    assert any("span_metrics" in p["exporters"] for p in pipelines.values())


# --- attribute keys ----------------------------------------------------------------------------------


def emitted_attributes() -> set[str]:
    """Attribute keys otel_llm puts on spans and metrics (read at call time so tests can rename one)."""
    prefixes = ("GEN_AI_", "LLM_", "ERROR_")
    return {v for k, v in vars(semconv).items() if k.startswith(prefixes) and isinstance(v, str)}


def span_names() -> set[str]:
    return {v for k, v in vars(semconv).items() if k.startswith("SPAN_") and isinstance(v, str)}


def walk_policies(policies: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for policy in policies:
        yield policy
        for nested in ("and", "composite", "drop", "not"):
            body = policy.get(nested) or {}
            for key, value in body.items():
                if key.endswith("_sub_policy") and isinstance(value, list):
                    yield from walk_policies(value)


OTTL_ATTRIBUTE = re.compile(r'attributes\["([^"]+)"\]')
OTTL_SPAN_NAME = re.compile(r'\bname\s*==\s*"([^"]+)"')


def sampling_problems(gateway: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    attributes, names = emitted_attributes(), span_names()
    policies = gateway["processors"]["tail_sampling"]["policies"]
    for policy in walk_policies(policies):
        kind = policy["type"]
        body = policy.get(kind) or {}
        if (
            kind in {"numeric_attribute", "string_attribute", "boolean_attribute"}
            and body["key"] not in attributes
        ):
            problems.append(f"policy {policy['name']!r}: otel_llm emits no attribute {body['key']!r}")
        for condition in body.get("span", []) if kind == "ottl_condition" else []:
            problems += [
                f"policy {policy['name']!r}: unknown attribute {key!r}"
                for key in OTTL_ATTRIBUTE.findall(condition)
                if key not in attributes
            ]
            problems += [
                f"policy {policy['name']!r}: unknown span {name!r}"
                for name in OTTL_SPAN_NAME.findall(condition)
                if name not in names
            ]
    for dimension in gateway["connectors"]["span_metrics"].get("dimensions", []):
        if dimension["name"] not in attributes:
            problems.append(f"span_metrics dimension {dimension['name']!r} is not an otel_llm attribute")
    return problems


def test_tail_sampling_keeps_errors_preemptions_slow_first_tokens_and_a_share() -> None:
    gateway = load_yaml(SCALED / "gateway.yaml")
    assert sampling_problems(gateway) == []
    policies = list(walk_policies(gateway["processors"]["tail_sampling"]["policies"]))
    by_type: dict[str, list[dict[str, Any]]] = {}
    for policy in policies:
        by_type.setdefault(policy["type"], []).append(policy[policy["type"]])
    assert any("ERROR" in p["status_codes"] for p in by_type["status_code"])
    assert any(
        p["key"] == semconv.LLM_PREEMPTIONS and p["min_value"] == 1 for p in by_type["numeric_attribute"]
    )
    ttft = [c for p in by_type["ottl_condition"] for c in p["span"] if semconv.LLM_LATENCY_TTFT in c]
    assert ttft and all(f'"{semconv.SPAN_REQUEST}"' in c for c in ttft)
    assert (
        all(0 < p["sampling_percentage"] < 100 for p in by_type["probabilistic"]) and by_type["probabilistic"]
    )


def test_sampling_check_catches_a_renamed_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = load_yaml(SCALED / "gateway.yaml")
    monkeypatch.setattr(semconv, "LLM_PREEMPTIONS", "llm.request.preemptions")
    monkeypatch.setattr(semconv, "LLM_LATENCY_TTFT", "llm.latency.ttft")
    problems = sampling_problems(gateway)
    assert any("'llm.preemptions'" in p for p in problems)
    assert any("'llm.latency.time_to_first_token'" in p for p in problems)


# --- OTLP -> Prometheus names --------------------------------------------------------------------------

UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "%": "percent", "1": "ratio"}
# Self-telemetry the dashboard does not chart (kind or unit not fixed by the lifecycle contract).
NOT_CHARTED = {
    "METRIC_ABANDONED",
    "METRIC_DROPPED_SPANS",
    "METRIC_DROPPED_POINTS",
    "METRIC_DROPPED_RECORDS",
    "METRIC_QUEUE_DEPTH",
    "METRIC_INTEGRATION_ERRORS",
}


def metric_kinds() -> dict[str, tuple[str, str]]:
    """OTLP metric name -> (instrument kind, unit), the table in the lifecycle contract ("Metric names")."""
    s = semconv
    table = {
        name: ("histogram", s.UNIT_SECONDS)
        for name in (
            s.METRIC_TTFT,
            s.METRIC_TPOT,
            s.METRIC_REQUEST_DURATION,
            s.METRIC_QUEUE,
            s.METRIC_PREFILL,
            s.METRIC_DECODE,
            s.METRIC_INFERENCE,
            s.METRIC_ITL,
            s.METRIC_PREEMPTED,
            s.METRIC_RECOMPUTE,
            s.METRIC_KV_TRANSFER,
            s.METRIC_STALLED,
        )
    }
    table[s.METRIC_KV_TRANSFER_BYTES] = ("counter", s.UNIT_BYTES)
    table[s.METRIC_PREEMPTIONS] = ("counter", s.UNIT_PREEMPTION)
    table[s.METRIC_REQUESTS] = ("counter", s.UNIT_REQUEST)
    table[s.METRIC_TOKENS] = ("counter", s.UNIT_TOKEN)
    table[s.METRIC_RECOMPUTE_TOKENS] = ("counter", s.UNIT_TOKEN)
    table[s.METRIC_RECOMPUTE_CACHED_TOKENS] = ("counter", s.UNIT_TOKEN)
    table[s.METRIC_ACTIVE] = ("gauge", s.UNIT_REQUEST)  # up-down counter or gauge: both are gauges there
    table[s.METRIC_ANOMALIES] = ("counter", s.UNIT_ANOMALY)
    table[s.METRIC_SAMPLING_DECISIONS] = ("counter", s.UNIT_DECISION)
    table[s.METRIC_ENGINE_TIME] = ("counter", s.UNIT_SECONDS)  # by llm.engine.work and chosen attributes
    # The engine's own state, from RequestTracker.engine_state() (otel_llm.hooks.engine_state).
    table[s.METRIC_KV_CACHE_USAGE] = ("gauge", s.UNIT_RATIO)
    table[s.METRIC_SCHEDULER_REQUESTS] = ("gauge", s.UNIT_REQUEST)
    for name in (
        s.METRIC_PREFIX_CACHE_QUERIES,
        s.METRIC_PREFIX_CACHE_HITS,
        s.METRIC_SPEC_DRAFT_TOKENS,
        s.METRIC_SPEC_ACCEPTED_TOKENS,
    ):
        table[name] = ("counter", s.UNIT_TOKEN)
    table[s.METRIC_STEP_TOKENS] = ("histogram", s.UNIT_TOKEN)
    table[s.METRIC_PROMPT_TOKENS] = ("counter", s.UNIT_TOKEN)
    # The reference engine's KV-cache gauges (otel_llm.kit.engine.telemetry).
    table[engine_telemetry.METRIC_KV_BLOCKS_USED] = ("gauge", engine_telemetry.UNIT_BLOCK)
    table[engine_telemetry.METRIC_KV_BLOCKS_TOTAL] = ("gauge", engine_telemetry.UNIT_BLOCK)
    return table


def prometheus_metric_names(name: str, kind: str, unit: str) -> set[str]:
    """The collector's OTLP -> Prometheus name translation (UnderscoreEscapingWithSuffixes).

    Non-alphanumeric runs become one underscore; the unit is appended as a word unless the name already
    has it (``s`` -> ``_seconds``; annotations in braces are dropped); monotonic counters end in
    ``_total``; a histogram is exposed as ``_bucket``, ``_sum`` and ``_count`` series.
    """
    tokens = [t for t in re.split(r"[^a-zA-Z0-9:]+", name) if t]
    unit_word = "" if unit.startswith("{") else UNIT_WORDS.get(unit, unit)
    if unit_word and unit_word not in tokens:
        tokens.append(unit_word)
    base = "_".join(tokens)
    if kind == "counter":
        return {base + "_total"}
    if kind == "histogram":
        return {base + suffix for suffix in ("_bucket", "_sum", "_count")}
    return {base}


def prometheus_label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def valid_metric_names() -> set[str]:
    return {
        n for name, (kind, unit) in metric_kinds().items() for n in prometheus_metric_names(name, kind, unit)
    }


def valid_labels() -> set[str]:
    # tenant: not emitted unless an operator names it in OTEL_LLM_ENGINE_TIME_ATTRIBUTES, as the engine
    # time panel's description says to (docs/telemetry.md uses the same example key).
    return {prometheus_label(a) for a in emitted_attributes()} | {"le", "job", "instance", "tenant"}


def test_translation_follows_the_collector_rules() -> None:
    assert prometheus_metric_names("gen_ai.server.time_to_first_token", "histogram", "s") == {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "gen_ai_server_time_to_first_token_seconds_sum",
        "gen_ai_server_time_to_first_token_seconds_count",
    }
    assert prometheus_metric_names("llm.server.requests", "counter", "{request}") == {
        "llm_server_requests_total"
    }
    assert prometheus_metric_names("a.duration_seconds", "gauge", "s") == {"a_duration_seconds"}
    assert prometheus_metric_names("llm.server.requests.active", "gauge", "{request}") == {
        "llm_server_requests_active"
    }
    assert prometheus_metric_names("llm.server.kv_cache.usage", "gauge", "1") == {
        "llm_server_kv_cache_usage_ratio"
    }


def test_every_semconv_metric_has_a_kind_or_is_listed_as_not_charted() -> None:
    names = {k: v for k, v in vars(semconv).items() if k.startswith("METRIC_")}
    charted = set(metric_kinds())
    missing = {k for k, v in names.items() if v not in charted and k not in NOT_CHARTED}
    assert missing == set()


PROMQL_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
IDENTIFIER = re.compile(r"(?<![\w$.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")


def split_promql(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression refers to; functions and keywords are left out."""
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    rest = re.sub(r"\{[^}]*\}", " ", expr)
    for body in PROMQL_GROUPING.findall(rest):
        labels |= set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", body))
    rest = PROMQL_GROUPING.sub(" ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = re.sub(r'"[^"]*"', " ", rest)
    metrics = {m for m in IDENTIFIER.findall(rest) if m not in PROMQL_KEYWORDS}
    return metrics, labels


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def dashboard_queries(dashboard: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(PromQL expressions incl. label_values() of variables, TraceQL queries)."""
    promql = [t["expr"] for t in walk(dashboard.get("panels", [])) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", text or "")
        if match:
            promql += [match.group(1), f"sum by ({match.group(2)}) ({match.group(1)})"]
    traceql = [t["query"] for t in walk(dashboard.get("panels", [])) if t.get("queryType") == "traceql"]
    return promql, traceql


def dashboard_problems(dashboard: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    metrics_ok, labels_ok = valid_metric_names(), valid_labels()
    promql, traceql = dashboard_queries(dashboard)
    for expr in promql:
        metrics, labels = split_promql(expr)
        if not metrics:
            problems.append(f"no metric found in {expr!r}")
        problems += [f"unknown metric {m!r} in {expr!r}" for m in sorted(metrics - metrics_ok)]
        problems += [f"unknown label {label!r} in {expr!r}" for label in sorted(labels - labels_ok)]
    for query in traceql:
        for key in re.findall(r"\bspan\.([a-zA-Z0-9_.]*[a-zA-Z0-9_])", query):
            if key not in emitted_attributes():
                problems.append(f"unknown span attribute {key!r} in {query!r}")
        for name in re.findall(r'\bname\s*=\s*"([^"]+)"', query):
            if name not in span_names():
                problems.append(f"unknown span name {name!r} in {query!r}")
    return problems


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def test_dashboard_queries_use_only_metrics_labels_and_spans_otel_llm_emits() -> None:
    assert dashboard_problems(load_dashboard()) == []


def test_dashboard_check_fails_when_a_metric_or_attribute_is_renamed(monkeypatch: pytest.MonkeyPatch) -> None:
    dashboard = load_dashboard()
    monkeypatch.setattr(semconv, "METRIC_TTFT", "gen_ai.server.ttft")
    monkeypatch.setattr(semconv, "LLM_FINISH_REASON", "llm.response.finish_reason")
    monkeypatch.setattr(semconv, "SPAN_REQUEST", "llm.req")
    monkeypatch.setattr(engine_telemetry, "METRIC_KV_BLOCKS_USED", "llm.engine.kv_cache.used")
    problems = dashboard_problems(dashboard)
    assert any("llm_engine_kv_cache_blocks_used" in p for p in problems)
    assert any("gen_ai_server_time_to_first_token_seconds_bucket" in p for p in problems)
    assert any("unknown label 'llm_finish_reason'" in p for p in problems)
    assert any("unknown span name 'llm.request'" in p for p in problems)


def test_dashboard_covers_the_serving_questions() -> None:
    promql, traceql = dashboard_queries(load_dashboard())
    used = set().union(*(split_promql(e)[0] for e in promql))
    s = semconv
    for name in (
        s.METRIC_TTFT,
        s.METRIC_ITL,
        s.METRIC_QUEUE,
        s.METRIC_PREFILL,
        s.METRIC_DECODE,
        s.METRIC_PREEMPTIONS,
        s.METRIC_PREEMPTED,
        s.METRIC_RECOMPUTE,
        s.METRIC_REQUESTS,
        s.METRIC_TOKENS,
        engine_telemetry.METRIC_KV_BLOCKS_USED,
        engine_telemetry.METRIC_KV_BLOCKS_TOTAL,
        s.METRIC_KV_CACHE_USAGE,
        s.METRIC_SCHEDULER_REQUESTS,
        s.METRIC_PREFIX_CACHE_HITS,
        s.METRIC_PREFIX_CACHE_QUERIES,
        s.METRIC_SPEC_DRAFT_TOKENS,
        s.METRIC_SPEC_ACCEPTED_TOKENS,
        s.METRIC_STEP_TOKENS,
        s.METRIC_SAMPLING_DECISIONS,
        s.METRIC_KV_TRANSFER,
        s.METRIC_KV_TRANSFER_BYTES,
    ):
        kind, unit = metric_kinds()[name]
        assert prometheus_metric_names(name, kind, unit) & used, f"no panel charts {name}"
    assert traceql, "expected trace search panels"


def test_dashboard_charts_what_preemptions_cost_in_work() -> None:
    """The recompute tax and the prompt tokens by source are charted, and a trace table finds the
    requests whose recomputes cost the most."""
    promql, traceql = dashboard_queries(load_dashboard())
    used = set().union(*(split_promql(e)[0] for e in promql))
    s = semconv
    for name in (s.METRIC_RECOMPUTE_TOKENS, s.METRIC_RECOMPUTE_CACHED_TOKENS, s.METRIC_PROMPT_TOKENS):
        kind, unit = metric_kinds()[name]
        assert prometheus_metric_names(name, kind, unit) & used, f"no panel charts {name}"
    recompute = prometheus_metric_names(s.METRIC_RECOMPUTE_TOKENS, *metric_kinds()[s.METRIC_RECOMPUTE_TOKENS])
    prompt = prometheus_metric_names(s.METRIC_PROMPT_TOKENS, *metric_kinds()[s.METRIC_PROMPT_TOKENS])
    output = prometheus_metric_names(s.METRIC_TOKENS, *metric_kinds()[s.METRIC_TOKENS])
    # The tax: recomputed over all the model's token work, in one expression.
    assert any(recompute | prompt | output <= split_promql(e)[0] for e in promql)
    assert any(f"span.{s.LLM_PREEMPTIONS_RECOMPUTE_TOKENS}" in q for q in traceql)


def test_dashboard_charts_stalled_time_by_cause() -> None:
    """What stalls cost, by cause: the stalled-time histogram, grouped by llm.stall.cause."""
    promql, _ = dashboard_queries(load_dashboard())
    series = prometheus_metric_names(semconv.METRIC_STALLED, *metric_kinds()[semconv.METRIC_STALLED])
    by_cause = [e for e in promql if split_promql(e)[0] & series]
    assert by_cause, "no panel charts the stalled time"
    cause = prometheus_label(semconv.LLM_STALL_CAUSE)
    assert all(cause in split_promql(e)[1] for e in by_cause), by_cause


def test_dashboard_charts_engine_time_by_tenant_and_kind_of_work() -> None:
    """What each tenant cost the engine: the engine-time counter, grouped by a tenant label and by
    llm.engine.work, and the recompute share of it."""
    promql, _ = dashboard_queries(load_dashboard())
    series = prometheus_metric_names(semconv.METRIC_ENGINE_TIME, *metric_kinds()[semconv.METRIC_ENGINE_TIME])
    charted = [e for e in promql if split_promql(e)[0] & series]
    work = prometheus_label(semconv.LLM_ENGINE_WORK)
    assert any({"tenant", work} <= split_promql(e)[1] for e in charted), charted
    assert any(f'{work}="{semconv.ENGINE_WORK_RECOMPUTE}"' in e for e in charted), charted


def test_latency_panels_show_exemplars() -> None:
    targets = [t for t in walk(load_dashboard()["panels"]) if "histogram_quantile" in t.get("expr", "")]
    assert targets and all(t.get("exemplar") is True for t in targets)


def test_dashboard_datasources_exist_in_provisioning() -> None:
    provisioned = {d["uid"]: d["type"] for d in load_yaml(DATASOURCES)["datasources"]}
    assert {"prometheus", "tempo", "jaeger"} <= set(provisioned.values())
    referenced = {
        (n["datasource"]["uid"], n["datasource"]["type"])
        for n in walk(load_dashboard())
        if isinstance(n.get("datasource"), dict)
    }
    assert referenced and all(provisioned.get(uid) == kind for uid, kind in referenced), referenced
    for source in load_yaml(DATASOURCES)["datasources"]:
        for link in source.get("jsonData", {}).get("exemplarTraceIdDestinations", []):
            assert provisioned.get(link["datasourceUid"]) == "tempo"
            # trace_id is the label the collector's prometheus exporter puts on exemplars.
            assert link["name"] == "trace_id"


# --- compose -------------------------------------------------------------------------------------------


def test_compose_pins_every_image_and_mounts_files_that_exist() -> None:
    compose = load_yaml(COMPOSE)
    services = compose["services"]
    assert {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{name}: {image} is not pinned"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} does not exist"
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
