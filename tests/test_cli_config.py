"""A bad environment value is handled like a bad flag by every command: one line naming the variable and
its value and saying what would work, exit status 2, no traceback, before torch (or a worker) starts.
And a value that can be used runs as asked, the SDK with nothing to warn about; with the SDK disabled the
demo says so instead of printing figures it has none for. Real subprocesses of the CLI (tests/cli_runs.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli_runs import Run, cli
from tests.otlp_receivers import HttpReceiver, closed_port

# (environment, the variable it is about, something the line must say besides)
BAD = [
    # The ones the SDK reads with a warning (or not at all) and runs on.
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"},
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://localhost:4318",
    ),
    # The signal's path in the generic endpoint: the exporter appends it again, and the collector says 404.
    (
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318/v1/traces"},
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://localhost:4318/v1/traces",
    ),
    ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL", "milliseconds"),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER", "traceidratio"),
    ({"OTEL_TRACES_SAMPLER_ARG": "abc"}, "OTEL_TRACES_SAMPLER_ARG", "0 to 1"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}, "OTEL_EXPORTER_OTLP_TIMEOUT", "seconds"),
    ({"OTEL_SDK_DISABLED": "yes"}, "OTEL_SDK_DISABLED", "true"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "-5"}, "OTEL_BSP_MAX_QUEUE_SIZE", "whole number"),
    ({"OTEL_PROPAGATORS": "b3"}, "OTEL_PROPAGATORS", "tracecontext"),
    # otel_llm's own, and what it decides from the standard ones.
    (
        {"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_RATIO": "1.5"},
        "OTEL_LLM_TAIL_SAMPLING_RATIO",
        "0 to 1",
    ),
    (
        {"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_E2E_S": "-1"},
        "OTEL_LLM_TAIL_SAMPLING_E2E_S",
        "0",
    ),
    (
        {"OTEL_LLM_TAIL_SAMPLING": "on", "OTEL_LLM_TAIL_SAMPLING_TTFT_S": "nan"},
        "OTEL_LLM_TAIL_SAMPLING_TTFT_S",
        "seconds",
    ),
    ({"OTEL_LLM_TAIL_SAMPLING": "sometimes"}, "OTEL_LLM_TAIL_SAMPLING", "off"),
    ({"OTEL_LLM_TRACE_DETAIL": "everything"}, "OTEL_LLM_TRACE_DETAIL", "phases"),
    ({"OTEL_LLM_SHUTDOWN_TIMEOUT": "soon"}, "OTEL_LLM_SHUTDOWN_TIMEOUT", "seconds"),
    ({"OTEL_LLM_EXPORT_MODE": "thread"}, "OTEL_LLM_EXPORT_MODE", "in_process"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER", "otlp"),
]


def one_line_naming(run: Run, command: str, variable: str, value: str, says: str) -> None:
    assert run.returncode == 2, run.said
    assert len(run.said) == 1, run.said  # one line, no traceback
    line = run.said[0]
    assert re.match(rf"otel-llm {command}: error: {variable}\b", line), line  # that variable first
    assert repr(value) in line and says in line, line  # its value, and what would work
    assert not run.heavy, f"{sorted(run.heavy)} imported before the error"


@pytest.mark.parametrize("command", ["demo", "serve"])
@pytest.mark.parametrize(("env", "variable", "says"), BAD, ids=[v for _, v, _ in BAD])
def test_a_bad_environment_value_is_a_usage_error(
    command: str, env: dict[str, str], variable: str, says: str, tmp_path: Path
) -> None:
    args = [command, "--port", "0"] if command == "serve" else [command]
    run = cli(*args, cwd=tmp_path, **env)
    one_line_naming(run, command, variable, env[variable], says)
    assert not (tmp_path / "otel-llm-output").exists()


@pytest.mark.parametrize("command", ["demo", "serve"])
@pytest.mark.parametrize(("env", "variable", "says"), BAD[:2], ids=[v for _, v, _ in BAD[:2]])
def test_disaggregated_runs_check_before_any_worker_starts(
    command: str, env: dict[str, str], variable: str, says: str, tmp_path: Path
) -> None:
    args = [command, "--disaggregated"] + (["--port", "0"] if command == "serve" else [])
    run = cli(*args, cwd=tmp_path, **env)
    one_line_naming(run, command, variable, env[variable], says)


def test_the_endpoint_is_named_not_the_collector(tmp_path: Path) -> None:
    run = cli("demo", cwd=tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="localhost:4318")
    assert "'localhost:4318'" in run.said[0] and "add http://" in run.said[0], run.said
    assert " lost (" not in run.stdout + "".join(run.said)  # nothing ran to be lost


def test_a_bad_flag_reads_the_same() -> None:
    # The shape the environment errors copy: argparse's error line, exit 2.
    run = cli("demo", "--requests", "x")
    assert run.returncode == 2 and run.said[-1].startswith("otel-llm demo: error:"), run.said


def test_with_the_sdk_disabled_the_demo_says_so_and_shows_no_figures(tmp_path: Path) -> None:
    # An endpoint too: nothing is sent there, so nothing may be reported as delivered or lost.
    endpoint = f"http://127.0.0.1:{closed_port()}"
    run = cli(
        "demo",
        "--requests",
        "3",
        cwd=tmp_path,
        OTEL_SDK_DISABLED="true",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
    )
    assert run.returncode == 0, run.said
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1, run.stdout  # the one line, no table, no waterfall
    assert "telemetry is off" in lines[0] and "OTEL_SDK_DISABLED" in lines[0], lines
    assert lines[0].startswith("3 requests"), lines
    for figure in ("TTFT", "n=", "delivered", "lost", "traces.jsonl"):
        assert figure not in run.stdout, run.stdout
    assert not run.said, run.said
    assert not (tmp_path / "otel-llm-output").exists()


def test_with_the_sdk_disabled_the_disaggregated_demo_says_so(tmp_path: Path) -> None:
    run = cli("demo", "--disaggregated", "--requests", "2", cwd=tmp_path, OTEL_SDK_DISABLED="true")
    assert run.returncode == 0, run.said
    assert "telemetry is off" in run.stdout, run.stdout
    assert "at the collector" not in run.stdout and "preemptions:" not in run.stdout, run.stdout


# Values the SDK and otel_llm take, many at once: the run must go as asked, and the SDK must have nothing
# to say about any of them (it logs a warning for each value it cannot use).
GOOD = {
    "OTEL_SDK_DISABLED": "false",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "1",
    "OTEL_METRIC_EXPORT_INTERVAL": "60000",
    "OTEL_METRIC_EXPORT_TIMEOUT": "30000",
    "OTEL_BSP_MAX_QUEUE_SIZE": "4096",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "256",
    "OTEL_BSP_SCHEDULE_DELAY": "500",
    "OTEL_BSP_EXPORT_TIMEOUT": "10000",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "5",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
    "OTEL_EXPORTER_OTLP_HEADERS": "x-team=llm",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "delta",
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram",
    "OTEL_METRICS_EXEMPLAR_FILTER": "always_on",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "200",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    "OTEL_PROPAGATORS": "tracecontext,baggage",
    "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED": "false",
    "OTEL_LLM_TRACE_DETAIL": "steps",
    "OTEL_LLM_EXPORT_MODE": "in_process",
    "OTEL_LLM_SHUTDOWN_TIMEOUT": "5",
}


def test_values_that_can_be_used_run_as_asked_with_nothing_to_warn_about(tmp_path: Path) -> None:
    with HttpReceiver() as receiver:
        run = cli(
            "demo", "--requests", "2", cwd=tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **GOOD
        )
        spans = receiver.collected.spans()
    assert run.returncode == 0, run.said
    assert not run.said, run.said  # no SDK warning, nothing of ours either
    assert spans, run.stdout
    resource, _ = spans[0]
    attributes = {a.key: a.value.string_value for a in resource.attributes}
    assert attributes.get("deployment.environment") == "test", attributes
    assert "spans delivered" in run.stdout, run.stdout
    assert " lost" not in run.stdout, run.stdout
