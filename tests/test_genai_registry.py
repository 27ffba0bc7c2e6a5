"""The telemetry of a demo run and of ``otel-llm serve`` (a completion and a chat completion), read back
from the files they wrote, against OpenTelemetry's semantic-conventions registry.

Every ``gen_ai.*``, ``server.*`` and ``error.*`` key on a span, an event or a metric point must be a name
the registry has, not deprecated in favour of another (nor removed), of the registry's type, with an
enum value the registry lists where it lists them; the ``gen_ai.server.*`` metrics must have the
registry's instrument and unit and carry its required attributes; and the operation name must be the
one the conventions give each endpoint.

Where the names, enum values, instruments and units come from: the installed
``opentelemetry-semantic-conventions`` package (its attribute and metric modules, read here). Types and
required attributes are not in that package: they are written below from the registry's YAML at
semantic-conventions v1.41.1 (``model/gen-ai/registry.yaml``, ``model/gen-ai/metrics.yaml``,
``model/server``, ``model/error``), the last release that holds the GenAI model. Nothing here is read
from otel_llm.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

# --- the registry ----------------------------------------------------------------------------------

MODULES = (
    "opentelemetry.semconv._incubating.attributes.gen_ai_attributes",
    "opentelemetry.semconv.attributes.server_attributes",
    "opentelemetry.semconv.attributes.error_attributes",
)
PREFIXES = ("gen_ai.", "server.", "error.")

# The registry's type of each key otel-llm may emit (semantic-conventions v1.41.1). A key missing here
# fails the test: look it up in the registry and add it.
TYPES = {
    "gen_ai.operation.name": "string",
    "gen_ai.provider.name": "string",
    "gen_ai.request.model": "string",
    "gen_ai.response.model": "string",
    "gen_ai.response.id": "string",
    "gen_ai.response.finish_reasons": "string[]",
    "gen_ai.request.choice.count": "int",
    "gen_ai.request.max_tokens": "int",
    "gen_ai.usage.input_tokens": "int",
    "gen_ai.usage.output_tokens": "int",
    "gen_ai.usage.cache_read.input_tokens": "int",
    "gen_ai.token.type": "string",
    "server.address": "string",
    "server.port": "int",
    "error.type": "string",
}
# Attributes the gen_ai.server.* metrics require (v1.41.1, metrics.yaml): always, and when the point has
# the key on the left, the one on the right too (server.port is conditionally required with an address).
REQUIRED = ("gen_ai.operation.name", "gen_ai.provider.name")
REQUIRED_WITH = {"server.address": "server.port"}
SERVER_METRICS = (
    gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION,
    gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
)
# Enums the registry closes (values outside them are not the conventions'); gen_ai.provider.name is
# open (a provider may name itself).
ENUMS = {
    gen_ai.GEN_AI_OPERATION_NAME: {v.value for v in gen_ai.GenAiOperationNameValues},
    gen_ai.GEN_AI_TOKEN_TYPE: {v.value for v in gen_ai.GenAiTokenTypeValues},
}
OTLP_JSON_KIND = {"string": "stringValue", "int": "intValue", "double": "doubleValue", "boolean": "boolValue"}


def registry() -> dict[str, str]:
    """Every attribute name of the registry's modules -> its docstring (where deprecations are said)."""
    names: dict[str, str] = {}
    for module_name in MODULES:
        tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
        body = tree.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Constant):
                after = body[i + 1] if i + 1 < len(body) else None
                doc = (
                    after.value.value
                    if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    else ""
                )
                names[str(node.value.value)] = str(doc)
    return names


REGISTRY = registry()


# --- what the files hold ---------------------------------------------------------------------------


def kind_of(value: dict[str, Any]) -> str:
    """An OTLP JSON AnyValue's type in the registry's words."""
    (key,) = value
    if key == "arrayValue":
        items = value[key].get("values", [])
        inner = {kind_of(v) for v in items}
        return f"{inner.pop()}[]" if len(inner) == 1 else "array"
    return {v: k for k, v in OTLP_JSON_KIND.items()}.get(key, key)


def plain(value: dict[str, Any]) -> Any:
    (key,) = value
    return [plain(v) for v in value[key].get("values", [])] if key == "arrayValue" else value[key]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def spans(folder: Path) -> list[dict[str, Any]]:
    return [
        span
        for file in folder.rglob("traces.jsonl")
        for request in lines(file)
        for rs in request["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def metrics(folder: Path) -> list[dict[str, Any]]:
    return [
        metric
        for file in folder.rglob("metrics.jsonl")
        for request in lines(file)
        for rm in request["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for metric in sm["metrics"]
    ]


def attribute_sets(folder: Path) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """(where, {key: AnyValue}) of every span, span event and metric point in the folder's files."""
    found = []
    for span in spans(folder):
        found.append((f"span {span['name']}", {a["key"]: a["value"] for a in span.get("attributes", [])}))
        for event in span.get("events", []):
            attrs = {a["key"]: a["value"] for a in event.get("attributes", [])}
            found.append((f"event {event['name']}", attrs))
    for metric in metrics(folder):
        data = next(v for k, v in metric.items() if isinstance(v, dict) and "dataPoints" in v)
        for point in data["dataPoints"]:
            found.append(
                (f"metric {metric['name']}", {a["key"]: a["value"] for a in point.get("attributes", [])})
            )
    return found


def problems(folder: Path) -> list[str]:
    """Every way the folder's telemetry departs from the registry, in words."""
    out = []
    for where, attrs in attribute_sets(folder):
        for key, value in attrs.items():
            if not key.startswith(PREFIXES):
                continue
            if key not in REGISTRY:
                out.append(f"{where}: {key} is not in the registry")
                continue
            doc = REGISTRY[key]
            if "Replaced by" in doc or "Removed" in doc:
                out.append(f"{where}: {key} is deprecated: {doc.strip().splitlines()[0]}")
                continue
            expected = TYPES.get(key)
            if expected is None:
                out.append(f"{where}: {key}: its registry type is not pinned in this test")
            elif kind_of(value) != expected:
                out.append(f"{where}: {key} is {kind_of(value)}, the registry says {expected}")
            if key in ENUMS and plain(value) not in ENUMS[key]:
                out.append(
                    f"{where}: {key}={plain(value)!r} is not one of the registry's {sorted(ENUMS[key])}"
                )
    return out


def server_metric_problems(folder: Path) -> list[str]:
    """The gen_ai.server.* metrics: the registry's instrument and unit, and its required attributes."""
    meter = MeterProvider().get_meter("registry")
    out = []
    found = {m["name"]: m for m in metrics(folder)}
    for name in SERVER_METRICS:
        metric = found.get(name)
        if metric is None:
            out.append(f"{name}: not emitted")
            continue
        create = getattr(gen_ai_metrics, f"create_{name.replace('.', '_')}")
        instrument = create(meter)  # the package's own definition, made on a real SDK meter
        if "histogram" not in metric or "Histogram" not in type(instrument).__name__:
            out.append(f"{name}: {sorted(metric)} is not the registry's {type(instrument).__name__}")
        if metric.get("unit") != instrument.unit:
            out.append(f"{name}: unit {metric.get('unit')!r}, the registry says {instrument.unit!r}")
        for point in metric.get("histogram", {}).get("dataPoints", []):
            keys = {a["key"] for a in point.get("attributes", [])}
            missing = [k for k in REQUIRED if k not in keys]
            missing += [need for key, need in REQUIRED_WITH.items() if key in keys and need not in keys]
            if missing:
                out.append(f"{name}: a point lacks {missing}")
    return out


# --- the runs --------------------------------------------------------------------------------------


def test_a_demo_runs_telemetry_is_the_registrys(demo_run: tuple[Any, Path]) -> None:
    _, folder = demo_run
    assert attribute_sets(folder), "the demo wrote no telemetry"
    assert problems(folder) == []
    assert server_metric_problems(folder) == []


def test_serve_s_telemetry_is_the_registrys(served_files: tuple[int, Path]) -> None:
    _, folder = served_files
    assert problems(folder) == []
    assert server_metric_problems(folder) == []


def test_serve_names_each_endpoint_s_operation_as_the_conventions_do(served_files: tuple[int, Path]) -> None:
    """/v1/chat/completions is ``chat``, /v1/completions ``text_completion``: on the request's span and on
    the gen_ai.server.* points. The server names its requests as OpenAI does: ``chatcmpl-`` for a chat
    completion, ``cmpl-`` for a completion (the ``id`` of each answer)."""
    _, folder = served_files
    chat, completion = (
        gen_ai.GenAiOperationNameValues.CHAT.value,
        gen_ai.GenAiOperationNameValues.TEXT_COMPLETION.value,
    )
    by_request = {}
    for span in spans(folder):
        attrs = {a["key"]: plain(a["value"]) for a in span.get("attributes", [])}
        if "llm.request.id" in attrs:
            by_request[attrs["llm.request.id"]] = attrs.get(gen_ai.GEN_AI_OPERATION_NAME)
    operations = {rid.split("-", 1)[0]: op for rid, op in by_request.items()}
    assert operations == {"chatcmpl": chat, "cmpl": completion}, by_request
    for metric in metrics(folder):
        if metric["name"] in SERVER_METRICS[:2]:  # every request has a duration and a first token
            points = metric["histogram"]["dataPoints"]
            seen = {
                plain(a["value"])
                for p in points
                for a in p["attributes"]
                if a["key"] == gen_ai.GEN_AI_OPERATION_NAME
            }
            assert seen == {chat, completion}, (metric["name"], seen)


@pytest.mark.parametrize(
    ("attrs", "complaint"),
    [
        ({"gen_ai.system": {"stringValue": "x"}}, "deprecated"),
        ({"gen_ai.usage.input_tokens": {"stringValue": "3"}}, "the registry says int"),
        ({"gen_ai.operation.name": {"stringValue": "completion"}}, "not one of the registry's"),
        ({"gen_ai.no.such.key": {"stringValue": "x"}}, "not in the registry"),
    ],
)
def test_the_check_finds_what_departs_from_the_registry(
    tmp_path: Path, attrs: dict[str, Any], complaint: str
) -> None:
    """The check itself can fail: a span file with one wrong key is found out."""
    span = {"name": "llm.request", "attributes": [{"key": k, "value": v} for k, v in attrs.items()]}
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    (tmp_path / "traces.jsonl").write_text(json.dumps(request) + "\n")
    found = problems(tmp_path)
    assert len(found) == 1 and complaint in found[0], found


# The conventions' advised bucket boundaries (semantic-conventions v1.41.1, model/gen-ai/metrics.yaml).
ADVICE = {
    gen_ai_metrics.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ],
    gen_ai_metrics.GEN_AI_SERVER_REQUEST_DURATION: [
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ],
    gen_ai_metrics.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ],
}  # fmt: skip


def test_the_docs_say_which_histograms_start_with_the_advised_buckets(demo_run: tuple[Any, Path]) -> None:
    """What docs/telemetry.md says of the three histograms' buckets is what the demo's files hold."""
    _, folder = demo_run
    bounds = {
        m["name"]: [float(b) for b in m["histogram"]["dataPoints"][0]["explicitBounds"]]
        for m in metrics(folder)
        if m["name"] in ADVICE and m.get("histogram", {}).get("dataPoints")
    }
    assert set(bounds) == set(ADVICE), sorted(bounds)
    starts = {name for name, advice in ADVICE.items() if bounds[name][: len(advice)] == advice}
    holds = {name for name, advice in ADVICE.items() if set(advice) <= set(bounds[name])}
    assert holds == set(ADVICE)  # every advised boundary is there, whatever else is
    docs = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text()
    section = docs.split("Histograms use explicit buckets", 1)[1].split("\n\n", 2)[1]
    said_to_start = {
        name
        for name in ADVICE
        for item in section.split("\n- ")
        if f"`{name}`" in item and "start with" in item and "not start" not in item
    }
    assert said_to_start == starts, (said_to_start, starts)
