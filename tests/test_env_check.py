"""The table of environment checks (otel_llm.kit.commands.env_check) against the SDK's own lists of variables:
every variable the SDK names is either checked or said not to be read, every checked one rejects a bad
value naming it and that value, and takes the values its reader takes.

In-process, on the real environment (monkeypatch sets it); tests/test_cli_config.py runs the CLI itself.
"""

from __future__ import annotations

import os

import opentelemetry.environment_variables as api_variables
import opentelemetry.sdk.environment_variables as sdk_variables
import pytest

from otel_llm.kit.commands import env_check

CHECKED = {name for rule in env_check.RULES for name in rule.names}

# One value each variable's reader cannot use, written here from the SDK's and otel_llm's documented
# rules (not from the table).
BAD = {
    "OTEL_SDK_DISABLED": "yes",
    "OTEL_LLM_SHUTDOWN_TIMEOUT": "0",
    "OTEL_LLM_TRACE_DETAIL": "everything",
    "OTEL_LLM_TAIL_SAMPLING": "sometimes",
    "OTEL_LLM_TAIL_SAMPLING_RATIO": "2",
    "OTEL_LLM_TAIL_SAMPLING_TTFT_S": "-1",
    "OTEL_LLM_TAIL_SAMPLING_E2E_S": "soon",
    "OTEL_LLM_EXPORT_MODE": "thread",
    "OTEL_LLM_EXPORT_QUEUE_SIZE": "0",
    "OTEL_LLM_EXPORTER_LOGS": "quiet",
    "OTEL_CONFIG_FILE": "/nonexistent/otel.yaml",
    "OTEL_PROPAGATORS": "tracecontext,no_such_propagator",
    "OTEL_PYTHON_CONTEXT": "no_such_context",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc+tls",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "HTTP",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "tcp://collector:4317",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://collector:70000/v1/metrics",
    "OTEL_EXPORTER_OTLP_HEADERS": "api-key",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a b=c",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "=value",
    "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
    "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "brotli",
    "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "",
    "OTEL_EXPORTER_OTLP_TIMEOUT": "abc",
    "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-3",
    "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "nan",
    "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/",
    "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE": "/nonexistent/ca.pem",
    "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/nonexistent/key.pem",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": "/nonexistent/key.pem",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": "/nonexistent/key.pem",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/nonexistent/cert.pem",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": "/nonexistent/cert.pem",
    "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE": "/nonexistent/cert.pem",
    "OTEL_EXPORTER_OTLP_INSECURE": "yes",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE": "1",
    "OTEL_EXPORTER_OTLP_METRICS_INSECURE": " true",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_METRICS_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_TRACES_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_METRICS_CREDENTIAL_PROVIDER": "no_such_provider",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES": "UNAVAILABLE,FLAKY",
    "OTEL_TRACES_EXPORTER": "zipkin",
    "OTEL_METRICS_EXPORTER": "prometheus",
    "OTEL_TRACES_SAMPLER": "sometimes",
    "OTEL_TRACES_SAMPLER_ARG": "abc",
    "OTEL_METRIC_EXPORT_INTERVAL": "soon",
    "OTEL_METRIC_EXPORT_TIMEOUT": "-1",
    "OTEL_BSP_MAX_QUEUE_SIZE": "-5",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096",  # more than the default queue of 2048
    "OTEL_BSP_SCHEDULE_DELAY": "0.5",
    "OTEL_BSP_EXPORT_TIMEOUT": "30s",
    "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "deltas",
    "OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "exponential",
    "OTEL_METRICS_EXEMPLAR_FILTER": "ALWAYS_ON",  # the SDK compares case and all
    "OTEL_ATTRIBUTE_COUNT_LIMIT": "many",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "-1",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "1.5",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "abc",
    "OTEL_SPAN_EVENT_COUNT_LIMIT": "-2",
    "OTEL_SPAN_LINK_COUNT_LIMIT": "x",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "x",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "x",
    "OTEL_RESOURCE_ATTRIBUTES": "team",
    "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "no_such_detector",
    "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED": "on",
}

# Values their readers take; each must pass.
GOOD = [
    ("OTEL_SDK_DISABLED", "False"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector.example:443/otlp"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1]:4317"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://localhost:4318/v1/traces"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%20123,x-team=llm"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "deflate"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "2.5"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "TRUE"),
    ("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES", "unavailable, deadline_exceeded"),
    ("OTEL_TRACES_EXPORTER", "None"),
    ("OTEL_METRICS_EXPORTER", "file"),
    ("OTEL_TRACES_SAMPLER", "ParentBased_TraceIdRatio"),
    ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "1500.5"),
    ("OTEL_METRIC_EXPORT_INTERVAL", "inf"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "8192"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2048"),
    ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ("OTEL_BSP_EXPORT_TIMEOUT", "0"),
    ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "LowMemory"),
    ("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION", "BASE2_EXPONENTIAL_BUCKET_HISTOGRAM"),
    ("OTEL_METRICS_EXEMPLAR_FILTER", "always_off"),
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "0"),
    ("OTEL_SPAN_EVENT_COUNT_LIMIT", ""),  # empty: no limit
    ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=a%2Cb"),
    ("OTEL_PROPAGATORS", "tracecontext,baggage"),
    ("OTEL_PROPAGATORS", "none"),
    ("OTEL_PYTHON_CONTEXT", "contextvars_context"),
    ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true"),
    ("OTEL_LLM_TAIL_SAMPLING", "1"),
    ("OTEL_LLM_TAIL_SAMPLING_RATIO", "0"),
    ("OTEL_LLM_TRACE_DETAIL", " Steps "),
    ("OTEL_LLM_EXPORT_MODE", "in_process"),
    ("OTEL_LLM_EXPORT_QUEUE_SIZE", "4096"),
    ("OTEL_LLM_EXPORTER_LOGS", "show"),
    ("OTEL_LLM_SHUTDOWN_TIMEOUT", "0.5"),
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def sdk_listed() -> set[str]:
    """Every variable name the SDK's and the API's own lists hold."""
    return {
        value
        for module in (sdk_variables, api_variables)
        for value in vars(module).values()
        if isinstance(value, str) and value.startswith("OTEL_")
    }


def test_every_variable_the_sdk_lists_is_checked_or_said_not_to_be_read() -> None:
    unaccounted = {
        name
        for name in sdk_listed()
        if name not in CHECKED and not any(name.startswith(prefix) for prefix in env_check.NOT_READ)
    }
    assert not unaccounted, sorted(unaccounted)


def test_nothing_is_both_checked_and_said_not_to_be_read() -> None:
    both = {name for name in CHECKED if any(name.startswith(prefix) for prefix in env_check.NOT_READ)}
    assert not both, sorted(both)


def test_every_checked_variable_has_a_bad_value_here() -> None:
    assert set(BAD) == CHECKED, (sorted(CHECKED - set(BAD)), sorted(set(BAD) - CHECKED))


@pytest.mark.parametrize(("name", "value"), sorted(BAD.items()))
def test_a_bad_value_is_named_with_its_value(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    problem = env_check.first_problem()
    assert problem is not None, f"{name}={value!r} passed"
    said = f"{name}={value!r} " if value.strip() else f"{name} is set but empty: "
    assert problem.startswith(said), problem
    assert "\n" not in problem
    what = problem.split(": ", 1)[1] if value.strip() else problem[len(said) :]
    assert len(what) > 10, problem  # then what would work


@pytest.mark.parametrize(("name", "value"), GOOD)
def test_a_value_its_reader_takes_passes(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    assert env_check.first_problem() is None


def test_grpc_takes_gzip_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The gRPC exporter of this SDK raises on "none", which the HTTP one takes.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
    assert env_check.first_problem() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc")
    problem = env_check.first_problem()
    assert problem is not None and "gzip" in problem and "metrics" in problem, problem


def test_with_the_sdk_disabled_only_what_is_still_read_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "sometimes")  # the SDK's: not read now
    assert env_check.first_problem() is None
    monkeypatch.setenv("OTEL_PROPAGATORS", "no_such_propagator")  # the API's: read at import
    assert (env_check.first_problem() or "").startswith("OTEL_PROPAGATORS=")
    monkeypatch.delenv("OTEL_PROPAGATORS")
    monkeypatch.setenv("OTEL_LLM_TRACE_DETAIL", "everything")  # otel_llm's: read by the tracker
    assert (env_check.first_problem() or "").startswith("OTEL_LLM_TRACE_DETAIL=")
