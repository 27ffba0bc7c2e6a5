"""Every environment variable a ``demo`` or ``serve`` run reads, checked before torch or a worker starts.

``RULES`` is one table: each entry names a variable (or several read the same way), how its value is
parsed, and what would work instead. ``check(command)`` stops at the first value that cannot be used with
one line, ``otel-llm COMMAND: error: NAME='value' is ...: what would work``, and exit status 2, as argparse
does for a bad flag.

Why not leave the values to the OpenTelemetry SDK: it reads most of them with a logged warning and a
fallback, so a typo runs a whole demo on a setting nobody asked for. ``OTEL_TRACES_SAMPLER=sometimes`` is
the default sampler, ``OTEL_SDK_DISABLED=yes`` is false, an endpoint without a scheme fails at every export
and ends up reported as an unreachable collector, and some values (a gRPC compression other than gzip, an
unknown exemplar filter, a negative queue size) raise from deep inside ``configure()``.

The variables are those the SDK's own lists (``opentelemetry.sdk.environment_variables`` and
``opentelemetry.environment_variables``) name and the pipeline of ``otel_llm.configure()`` reads, plus
otel_llm's own (``OTEL_LLM_*``); ``NOT_READ`` says why each other name of those lists is left alone. The
SDK's variables are not read when ``OTEL_SDK_DISABLED=true`` or when an ``OTEL_CONFIG_FILE`` decides the
pipeline, so they are not checked then either; the API's (propagators, context) and ours always are.
Values are parsed as their reader parses them (trimmed and case-folded, or not), so what passes here is
what the reader takes. Where the SDK has a parser that refuses a bad value, or a list of the values it
knows, it is used as is: the samplers, the exporters' compression, the header syntax, the span limits
and the exemplar filters. What stays here is what the SDK lacks: a refusal where it falls back with a
warning, the endpoint's URL, and otel_llm's own variables. ``OTEL_LLM_OUTPUT_DIR`` is checked with
``--output-dir`` (``preflight``). How each value is parsed: ``otel_llm.kit.commands.env_values``.
"""

from __future__ import annotations

import os

from opentelemetry import environment_variables as api_env
from opentelemetry.sdk import environment_variables as sdk_env

from otel_llm.export.channel import ENV_EXPORT_MODE, ENV_QUEUE_SIZE
from otel_llm.export.channel import MODES as EXPORT_MODES
from otel_llm.export.quiet import ENV_EXPORTER_LOGS
from otel_llm.export.quiet import MODES as EXPORTER_LOGS
from otel_llm.kit.commands._common import usage_error
from otel_llm.kit.commands.env_values import (
    API,
    OTEL_LLM,
    SDK,
    Rule,
    batch_size,
    boolean,
    choice,
    compression,
    endpoint,
    entry_points,
    exemplar_filter,
    generic_endpoint,
    grpc_status_codes,
    headers,
    key_values,
    number,
    readable_file,
    sampler,
    span_limit,
)

SIGNALS = ("traces", "metrics")
ENV_SDK_DISABLED = sdk_env.OTEL_SDK_DISABLED
ENV_CONFIG_FILE = "OTEL_CONFIG_FILE"


# --- the table -------------------------------------------------------------------------------------------


def _per_signal(suffix: str) -> tuple[str, ...]:
    """The generic ``OTEL_EXPORTER_OTLP_<suffix>`` and its traces and metrics variants."""
    return (
        f"OTEL_EXPORTER_OTLP_{suffix}",
        *(f"OTEL_EXPORTER_OTLP_{s.upper()}_{suffix}" for s in SIGNALS),
    )


def _exporter_rules() -> list[Rule]:
    generic, traces, metrics = _per_signal("COMPRESSION")
    return [
        Rule(
            _per_signal("PROTOCOL"),
            choice("grpc", "http/protobuf"),
            "set grpc (a collector's port 4317) or http/protobuf (port 4318, the default); otel-llm has "
            "no http/json exporter",
        ),
        Rule(
            _per_signal("ENDPOINT")[:1],
            generic_endpoint,
            "pass the collector's base URL: http://localhost:4318 (OTLP/HTTP) or http://localhost:4317 "
            "(gRPC)",
        ),
        Rule(
            _per_signal("ENDPOINT")[1:],
            endpoint,
            "pass the collector's URL: http://localhost:4318/v1/<signal> (OTLP/HTTP) or "
            "http://localhost:4317 (gRPC)",
        ),
        Rule(
            _per_signal("HEADERS"),
            headers,
            "pass name=value pairs separated by commas, values URL-encoded (api-key=abc%20123)",
        ),
        Rule((generic,), compression(generic, SIGNALS), "set gzip or none", empty_ok=False),
        Rule((traces,), compression(traces, ("traces",)), "set gzip or none", empty_ok=False),
        Rule((metrics,), compression(metrics, ("metrics",)), "set gzip or none", empty_ok=False),
        Rule(
            _per_signal("TIMEOUT"),
            number(0, above=True),
            "pass the seconds one export may take (this SDK reads seconds, not milliseconds), e.g. 10",
            empty_ok=False,
        ),
        Rule(
            _per_signal("CERTIFICATE") + _per_signal("CLIENT_KEY") + _per_signal("CLIENT_CERTIFICATE"),
            readable_file,
            "pass the path of a PEM file this user can read",
        ),
        Rule(
            _per_signal("INSECURE"),
            boolean(fold=str.lower),  # the gRPC exporter compares value.lower() with "true"
            "set true (plaintext gRPC) or false (TLS); the gRPC exporter reads anything else as false",
            empty_ok=False,
        ),
        Rule(
            tuple(
                f"OTEL_PYTHON_EXPORTER_OTLP_{protocol}{signal}_CREDENTIAL_PROVIDER"
                for protocol in ("HTTP", "GRPC")
                for signal in ("", "_TRACES", "_METRICS")
            ),
            entry_points("opentelemetry_otlp_credential_provider"),
            "name an installed credential provider",
        ),
        Rule(
            ("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES",),
            grpc_status_codes,
            "pass gRPC status code names separated by commas, e.g. UNAVAILABLE,DEADLINE_EXCEEDED",
        ),
        Rule(
            (api_env.OTEL_TRACES_EXPORTER, api_env.OTEL_METRICS_EXPORTER),
            choice("otlp", "file", "none"),
            "set otlp (the default: OTLP when an endpoint is set, else OTLP JSON files), file or none",
        ),
    ]


_LIMITS = (
    sdk_env.OTEL_ATTRIBUTE_COUNT_LIMIT,
    sdk_env.OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    sdk_env.OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT,
    sdk_env.OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    sdk_env.OTEL_SPAN_EVENT_COUNT_LIMIT,
    sdk_env.OTEL_SPAN_LINK_COUNT_LIMIT,
    sdk_env.OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT,
    sdk_env.OTEL_LINK_ATTRIBUTE_COUNT_LIMIT,
)


def _sdk_rules() -> list[Rule]:
    return [
        Rule(
            (sdk_env.OTEL_TRACES_SAMPLER,),
            sampler,
            "set one of those, or unset it for parentbased_always_on",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_TRACES_SAMPLER_ARG,),
            number(0, high=1),
            "pass the share of traces traceidratio keeps, from 0 to 1, e.g. 0.1",
        ),
        Rule(
            (sdk_env.OTEL_METRIC_EXPORT_INTERVAL,),
            number(0, above=True, infinite=True),
            "pass the milliseconds between metric exports, e.g. 60000 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_METRIC_EXPORT_TIMEOUT,),
            number(0, above=True, infinite=True),
            "pass the milliseconds one metric export may take, e.g. 30000 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_BSP_MAX_QUEUE_SIZE,),
            number(1, whole=True),
            "pass how many spans may wait for export, a whole number from 1, e.g. 2048 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE,),
            batch_size,
            "pass how many spans one export sends, from 1 to OTEL_BSP_MAX_QUEUE_SIZE, e.g. 512 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_BSP_SCHEDULE_DELAY,),
            number(1, whole=True),
            "pass the milliseconds between span exports, a whole number from 1, e.g. 5000 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_BSP_EXPORT_TIMEOUT,),
            number(0, whole=True),
            "pass the milliseconds one span export may take, a whole number, e.g. 30000 (the default)",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE,),
            choice("cumulative", "delta", "lowmemory"),
            "set one of those, or unset it for cumulative",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,),
            choice("explicit_bucket_histogram", "base2_exponential_bucket_histogram"),
            "set one of those, or unset it for explicit_bucket_histogram",
            empty_ok=False,
        ),
        Rule(
            (sdk_env.OTEL_METRICS_EXEMPLAR_FILTER,),
            exemplar_filter,
            "set one of those, in lower case, or unset it for trace_based",
            empty_ok=False,
        ),
        *(
            Rule((name,), span_limit(name), "pass a whole number from 0, or leave it empty for no limit")
            for name in _LIMITS
        ),
        Rule(
            (sdk_env.OTEL_RESOURCE_ATTRIBUTES,),
            key_values,
            "pass key=value pairs separated by commas, e.g. deployment.environment=prod,team=llm",
        ),
        Rule(
            (sdk_env.OTEL_EXPERIMENTAL_RESOURCE_DETECTORS,),
            entry_points("opentelemetry_resource_detector", "*", many=True),
            "name installed resource detectors, separated by commas",
        ),
        Rule(
            ("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED",),
            boolean(),
            "set true (the SDK's own metrics on) or false",
            empty_ok=False,
        ),
    ]


def _api_rules() -> list[Rule]:
    return [
        Rule(
            (api_env.OTEL_PROPAGATORS,),
            entry_points("opentelemetry_propagator", "none", many=True),
            "name installed propagators separated by commas (the default: tracecontext,baggage), or none",
            reader=API,
        ),
        Rule(
            (api_env.OTEL_PYTHON_CONTEXT,),
            entry_points("opentelemetry_context"),
            "name an installed context implementation, or unset it for contextvars_context",
            reader=API,
        ),
    ]


def _otel_llm_rules() -> list[Rule]:
    from otel_llm.record import DETAILS

    return [
        Rule(
            ("OTEL_LLM_SHUTDOWN_TIMEOUT",),
            number(0, above=True),
            "pass the seconds shutting down telemetry may take, e.g. 5 (the default)",
            reader=OTEL_LLM,
        ),
        Rule(
            ("OTEL_LLM_TRACE_DETAIL",),
            choice(*DETAILS),
            "set one of those, or unset it for phases",
            reader=OTEL_LLM,
        ),
        Rule(
            ("OTEL_LLM_TAIL_SAMPLING",),
            choice("on", "off", "true", "false", "1", "0"),
            "set on (keep failed, preempted, slow and a share of the other traces) or off (keep all)",
            reader=OTEL_LLM,
        ),
        Rule(
            ("OTEL_LLM_TAIL_SAMPLING_RATIO",),
            number(0, high=1),
            "pass the share of the other traces tail sampling keeps, from 0 to 1, e.g. 0.05 (the default)",
            reader=OTEL_LLM,
        ),
        Rule(
            ("OTEL_LLM_TAIL_SAMPLING_TTFT_S", "OTEL_LLM_TAIL_SAMPLING_E2E_S"),
            number(0),
            "pass a threshold in seconds, from 0, e.g. 2.5",
            reader=OTEL_LLM,
        ),
        Rule(
            (ENV_QUEUE_SIZE,),
            number(1, whole=True),
            "pass how many finished requests may wait for the export process, a whole number, e.g. 16384",
            reader=OTEL_LLM,
        ),
        Rule(
            (ENV_EXPORTER_LOGS,),
            choice(*EXPORTER_LOGS),
            "set show (the OTLP exporters' warnings and errors as they log them) or count (counted, the "
            "count in the summary)",
            reader=OTEL_LLM,
        ),
        Rule(
            (ENV_EXPORT_MODE,),
            choice(*EXPORT_MODES),
            "set process (spans and metrics built and exported by a child process) or in_process (by the "
            "engine's own process)",
            reader=OTEL_LLM,
        ),
        Rule(
            (ENV_CONFIG_FILE,),
            readable_file,
            "pass the path of an OpenTelemetry configuration file (YAML), or unset it",
            reader=OTEL_LLM,
        ),
    ]


def _sdk_on_rule() -> Rule:
    return Rule(
        (ENV_SDK_DISABLED,),
        boolean(),
        "set true (telemetry off) or false (the default); the SDK reads anything else as false",
    )


RULES: tuple[Rule, ...] = (
    _sdk_on_rule(),
    *_otel_llm_rules(),
    *_api_rules(),
    *_exporter_rules(),
    *_sdk_rules(),
)

# Names in the SDK's lists that the pipeline of ``configure()`` never reads, by prefix, with why.
NOT_READ: dict[str, str] = {
    "OTEL_LOGS_EXPORTER": "configure() builds no logs pipeline",
    "OTEL_BLRP_": "the batch log record processor: no logs pipeline",
    "OTEL_EXPORTER_OTLP_LOGS_": "the OTLP logs exporter: no logs pipeline",
    "OTEL_LOGRECORD_": "log record limits: no logs pipeline",
    "OTEL_PYTHON_EXPORTER_OTLP_HTTP_LOGS_": "the OTLP logs exporter: no logs pipeline",
    "OTEL_PYTHON_EXPORTER_OTLP_GRPC_LOGS_": "the OTLP logs exporter: no logs pipeline",
    "OTEL_EXPORTER_ZIPKIN_": "configure() exports OTLP or files, never Zipkin",
    "OTEL_EXPORTER_JAEGER_": "configure() exports OTLP or files, never Jaeger (older SDKs list it)",
    "OTEL_EXPORTER_PROMETHEUS_": "configure() exports OTLP or files, never a Prometheus endpoint",
    "OTEL_PYTHON_TRACER_CONFIGURATOR": "read by opentelemetry-instrument's auto-configuration only",
    "OTEL_PYTHON_METER_CONFIGURATOR": "read by opentelemetry-instrument's auto-configuration only",
    "OTEL_PYTHON_LOGGER_CONFIGURATOR": "read by opentelemetry-instrument's auto-configuration only",
    "OTEL_PYTHON_ID_GENERATOR": "configure() gives its providers otel_llm's own id generator",
    "OTEL_PYTHON_TRACER_PROVIDER": "the global provider's fallback; the CLI's providers are its own",
    "OTEL_PYTHON_METER_PROVIDER": "the global provider's fallback; the CLI's providers are its own",
    "OTEL_PYTHON_LOGGER_PROVIDER": "no logs pipeline",
    "OTEL_PYTHON_EVENT_LOGGER_PROVIDER": "no logs pipeline (older SDKs list it)",
    "OTEL_PYTHON_LOGGING_AUTO_INSTRUMENTATION_ENABLED": "read by opentelemetry-instrument only (logs)",
    "OTEL_LOG_LEVEL": "the Python SDK does not read it (Python's logging decides)",
    "OTEL_SERVICE_NAME": "any text is a service name",
    "OTEL_LLM_OUTPUT_DIR": "checked with --output-dir, by preflight.output_folder_problem()",
}


def _sdk_reads_variables() -> bool:
    """Whether the SDK's pipeline is built from the OTEL_* variables: not when it is disabled, nor when a
    declarative configuration file decides it."""
    from otel_llm.setup import declarative_config_file

    if os.environ.get(ENV_SDK_DISABLED, "").strip().lower() == "true":
        return False
    return declarative_config_file() is None


def first_problem() -> str | None:
    """The complaint about the first environment value a run could not use (``RULES`` in order, then
    otel_llm's own readers), or None when every value can be used."""
    sdk_on = None  # decided once the rule of OTEL_SDK_DISABLED has passed
    for rule in RULES:
        if rule.reader == SDK and rule.names != (ENV_SDK_DISABLED,):
            if sdk_on is None:
                sdk_on = _sdk_reads_variables()
            if not sdk_on:
                continue
        for name in rule.names:
            raw = os.environ.get(name)
            if raw is not None and (problem := rule.problem(name, raw)) is not None:
                return problem
    return _readers_problem(sdk_on if sdk_on is not None else _sdk_reads_variables())


def _readers_problem(sdk_on: bool) -> str | None:
    """What otel_llm's own readers of the environment reject, in their words: the table above mirrors
    them, and this keeps a run from starting should one ever be stricter."""
    from otel_llm.emit.sampling import TailSampling
    from otel_llm.export import otlp
    from otel_llm.hooks.steps import resolve_detail
    from otel_llm.setup import shutdown_timeout

    try:
        shutdown_timeout(None)
        if sdk_on:
            for signal in SIGNALS:
                otlp.destination(signal)  # type: ignore[arg-type]
        TailSampling.from_env()
        resolve_detail(None)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


def check(command: str) -> None:
    """Exit with a usage error (status 2, one line) when an environment value cannot be used."""
    problem = first_problem()
    if problem is not None:
        usage_error(command, problem)
