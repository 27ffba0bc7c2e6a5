"""Every name otel_llm emits: span names, span events, attribute keys, metric names.

One place, so the collector configs, dashboards and tests can check themselves against the package
(renaming a constant here breaks the tests that use the old string). The ``gen_ai.*`` names follow the
OpenTelemetry GenAI semantic conventions; the ``llm.*`` names are otel_llm's own, for what the
conventions do not cover (phases, preemption, recompute).
"""

from __future__ import annotations

# --- spans -----------------------------------------------------------------------------------------
SPAN_REQUEST = "llm.request"
SPAN_QUEUE = "llm.queue"
SPAN_PREFILL = "llm.prefill"
SPAN_DECODE = "llm.decode"
SPAN_PREEMPTED = "llm.preempted"
SPAN_RECOMPUTE = "llm.recompute"
SPAN_ENGINE_STEP = "llm.engine.step"
SPAN_CHOICES = "llm.choices"  # parent of the llm.request spans of one request with n > 1 choices

# --- span events on llm.request ----------------------------------------------------------------------
EVENT_QUEUED = "llm.queued"
EVENT_SCHEDULED = "llm.scheduled"
EVENT_FIRST_TOKEN = "llm.first_token"
EVENT_PREEMPTED = "llm.preempted"

# --- attributes ---------------------------------------------------------------------------------------
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"

LLM_REQUEST_ID = "llm.request.id"
VLLM_REQUEST_ID = "vllm.request.id"  # vLLM's internal (engine) id; llm.request.id is the client's
LLM_CHOICE_INDEX = "llm.choice.index"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
LLM_PREEMPTIONS = "llm.preemptions"
LLM_RESUMED = "llm.resumed"
LLM_OUTPUT_TOKENS = "llm.output_tokens"
LLM_FINISH_REASON = "llm.finish_reason"
LLM_REQUEST_STATE = "llm.request.state"
LLM_ANOMALY_KIND = "kind"
EXPORT_DROP_REASON = "reason"  # on the otel_llm.export.*.dropped self-metrics

LLM_LATENCY_QUEUE = "llm.latency.queue"
LLM_LATENCY_PREFILL = "llm.latency.prefill"
LLM_LATENCY_DECODE = "llm.latency.decode"
LLM_LATENCY_INFERENCE = "llm.latency.inference"
LLM_LATENCY_TTFT = "llm.latency.time_to_first_token"
LLM_LATENCY_E2E = "llm.latency.e2e"

# Values of gen_ai.token.type and llm.request.state.
TOKEN_TYPE_INPUT = "input"
TOKEN_TYPE_OUTPUT = "output"
STATE_WAITING = "waiting"
STATE_RUNNING = "running"
STATE_PREEMPTED = "preempted"

# Finish reasons an engine may pass (any other string is kept as given).
REASON_STOP = "stop"
REASON_LENGTH = "length"
REASON_ABORT = "abort"
REASON_ERROR = "error"
REASON_EVICTED = "evicted"
# Reasons that make a request a failure: no TTFT / TPOT sample, error.type on the duration.
FAILED_REASONS = frozenset({REASON_ERROR, REASON_EVICTED})

# --- metrics (name, unit) -----------------------------------------------------------------------------
METRIC_TTFT = "gen_ai.server.time_to_first_token"
METRIC_TPOT = "gen_ai.server.time_per_output_token"
METRIC_REQUEST_DURATION = "gen_ai.server.request.duration"
METRIC_QUEUE = "llm.server.queue.duration"
METRIC_PREFILL = "llm.server.prefill.duration"
METRIC_DECODE = "llm.server.decode.duration"
METRIC_INFERENCE = "llm.server.inference.duration"
METRIC_ITL = "llm.server.inter_token_latency"
METRIC_PREEMPTED = "llm.server.preempted.duration"
METRIC_RECOMPUTE = "llm.server.recompute.duration"
METRIC_PREEMPTIONS = "llm.server.preemptions"
METRIC_REQUESTS = "llm.server.requests"
METRIC_TOKENS = "llm.server.tokens"
METRIC_ACTIVE = "llm.server.requests.active"

# Self-telemetry: how otel_llm itself is doing.
METRIC_ANOMALIES = "otel_llm.anomalies"
METRIC_EVICTED = "otel_llm.requests.evicted"
METRIC_DROPPED_SPANS = "otel_llm.export.spans.dropped"
METRIC_DROPPED_POINTS = "otel_llm.export.metric_points.dropped"
METRIC_QUEUE_DEPTH = "otel_llm.export.queue.depth"

UNIT_SECONDS = "s"
UNIT_PREEMPTION = "{preemption}"
UNIT_REQUEST = "{request}"
UNIT_TOKEN = "{token}"
UNIT_ANOMALY = "{anomaly}"

# Explicit bucket boundaries, seconds. The three gen_ai.server.* lists are the GenAI semantic
# conventions' advice; the llm.* ones are ours, chosen to resolve the values each metric sees.
BUCKETS_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
BUCKETS_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
BUCKETS_REQUEST_DURATION = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
# Inter-token gaps are milliseconds on a healthy engine and seconds across a preemption.
BUCKETS_ITL = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Queue, prefill, decode, inference, preempted and recompute times: milliseconds to minutes.
BUCKETS_PHASE = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
