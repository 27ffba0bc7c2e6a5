"""Every name otel_llm emits: span names, span events, attribute keys, metric names.

One place, so the collector configs, dashboards and tests can check themselves against the package
(renaming a constant here breaks the tests that use the old string). The ``gen_ai.*`` names follow the
OpenTelemetry GenAI semantic conventions; the ``llm.*`` names are otel_llm's own, for what the
conventions do not cover (phases, preemption, recompute).
"""

from __future__ import annotations

# --- spans -----------------------------------------------------------------------------------------
SPAN_REQUEST = "llm.request"
# [arrival, queued]: what an API server does before the engine queues the request (parsing, tokenizing,
# waiting to be admitted). Not queue time (vLLM's queue interval starts at queued), but in TTFT and e2e.
SPAN_ADMISSION = "llm.admission"
SPAN_QUEUE = "llm.queue"
SPAN_PREFILL = "llm.prefill"
SPAN_DECODE = "llm.decode"
SPAN_PREEMPTED = "llm.preempted"
SPAN_RECOMPUTE = "llm.recompute"
SPAN_ENGINE_STEP = "llm.engine.step"
# The engine's own steps at detail "steps": one trace per engine and window of time, the steps under it.
SPAN_ENGINE_WINDOW = "llm.engine.window"
# Disaggregated serving (a prefill instance hands the request and its KV cache to a decode instance):
# each instance's part of the request, under the one llm.request, and the KV transfer on each side.
SPAN_INSTANCE_PREFILL = "llm.instance.prefill"
SPAN_INSTANCE_DECODE = "llm.instance.decode"
SPAN_KV_TRANSFER = "llm.kv_transfer"
SPAN_CHOICES = "llm.choices"  # parent of the llm.request spans of one request with n > 1 choices

# --- span events on llm.request ----------------------------------------------------------------------
EVENT_QUEUED = "llm.queued"
EVENT_SCHEDULED = "llm.scheduled"
EVENT_FIRST_TOKEN = "llm.first_token"
EVENT_PREEMPTED = "llm.preempted"
EVENT_KV_SENT = "llm.kv_sent"  # on llm.instance.prefill: the KV cache left this instance
EVENT_KV_RECEIVED = "llm.kv_received"  # on llm.instance.decode: the KV cache is in this instance

# --- attributes ---------------------------------------------------------------------------------------
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
# The GenAI server's own address and port, where the integration knows them (RequestTracker(attributes=)).
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# Prompt tokens served from the engine's prefix cache (not computed), on llm.request.
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
ERROR_TYPE = "error.type"

LLM_REQUEST_ID = "llm.request.id"
VLLM_REQUEST_ID = "vllm.request.id"  # vLLM's internal (engine) id; llm.request.id is the client's
LLM_CHOICE_INDEX = "llm.choice.index"
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
LLM_PREEMPTIONS = "llm.preemptions"
# Preemptions past the per-request span cap (otel_llm.spans.MAX_PREEMPTION_SPANS): how many, and their
# time evicted / recomputing in seconds, on llm.request.
LLM_PREEMPTIONS_UNSPANNED = "llm.preemptions.unspanned"
LLM_PREEMPTIONS_UNSPANNED_PREEMPTED = "llm.preemptions.unspanned.preempted_duration"
LLM_PREEMPTIONS_UNSPANNED_RECOMPUTE = "llm.preemptions.unspanned.recompute_duration"
# What a preemption cost in work (otel_llm.recompute), in tokens, from the prefix-cache hits the engine
# reported when it rescheduled the request (scheduled(cached_tokens=...) at R_k). On llm.recompute: the
# context (prompt + output tokens so far) it had to compute again, and the part it found cached.
LLM_RECOMPUTE_TOKENS = "llm.recompute.tokens"
LLM_RECOMPUTE_CACHED_TOKENS = "llm.recompute.cached_tokens"
# On llm.request: their sums over the request's preemptions (all of them, past the span cap too).
LLM_PREEMPTIONS_RECOMPUTE_TOKENS = "llm.preemptions.recompute.tokens"
LLM_PREEMPTIONS_RECOMPUTE_CACHED_TOKENS = "llm.preemptions.recompute.cached_tokens"
LLM_RESUMED = "llm.resumed"
LLM_OUTPUT_TOKENS = "llm.output_tokens"
LLM_FINISH_REASON = "llm.finish_reason"
LLM_REQUEST_STATE = "llm.request.state"
# On the phase span (and the preemption span) a request was in when it was aborted or failed: true.
LLM_CUT_SHORT = "llm.cut_short"
LLM_ANOMALY_KIND = "kind"
# otel_llm.integration.errors: which engine integration failed, and where (a method of the engine or a step).
LLM_INTEGRATION_ENGINE = "engine"
LLM_INTEGRATION_SITE = "site"
EXPORT_DROP_REASON = "reason"  # on the otel_llm.export.*.dropped self-metrics

# On llm.engine.step spans (detail level "steps") and llm.request.
LLM_STEP_INDEX = "llm.engine.step.index"
LLM_STEP_BATCH_SIZE = "llm.engine.batch_size"  # requests that produced tokens in the step
LLM_STEP_TOKENS = "llm.engine.step.tokens"  # tokens the engine fed its model in the step
LLM_STEP_KV_CACHE_USAGE = "llm.engine.kv_cache.usage"  # fraction 0..1 after the step
LLM_STEPS = "llm.engine.steps"  # engine steps the request ran in (llm.request, detail "steps")
LLM_STEPS_UNSPANNED = "llm.engine.steps.unspanned"  # of those, steps without a span (past the cap)
# On the engine's own llm.engine.step spans, when the engine reports its batches: what the step computed.
LLM_STEP_PREFILL_TOKENS = "llm.engine.step.prefill_tokens"
LLM_STEP_RECOMPUTE_TOKENS = "llm.engine.step.recompute_tokens"
LLM_STEP_DECODE_TOKENS = "llm.engine.step.decode_tokens"
LLM_STEP_SPEC_TOKENS = "llm.engine.step.spec_tokens"  # several tokens of one request past its first
# Stalls (docs/lifecycle.md "Stalls"; only when the engine reports its batches): one llm.stall event per
# stall, on llm.decode (on llm.request at detail "request"), and the totals by cause on llm.request.
EVENT_STALL = "llm.stall"
LLM_STALL_CAUSE = "llm.stall.cause"  # one of the STALL_* values below
STALL_PREEMPTION = "preemption"  # its own preemption: the gap from the token before P_k to T_k
STALL_PREFILL = "prefill"  # other requests' prompt tokens in the gap's steps
STALL_RECOMPUTE = "recompute"  # other requests' recomputed tokens there
STALL_IDLE = "idle"  # the engine ran no step for most of the gap
STALL_SKIPPED = "skipped"  # the engine ran steps without the request
STALL_SLOW_STEP = "slow_step"  # the step that held it ran long itself, nothing in it to blame (busy machine)
STALL_UNKNOWN = "unknown"  # 0.1's name for a slow step; no longer given, kept to read older traces
LLM_STALL_DURATION = "llm.stall.duration"  # seconds from the token before to the stalled token
LLM_STALL_TOKEN = "llm.stall.token"  # the stalled token's number (1: the first)
LLM_STALL_PREFILL_TOKENS = "llm.stall.prefill_tokens"  # other requests' prefill tokens in the gap's steps
LLM_STALL_RECOMPUTE_TOKENS = "llm.stall.recompute_tokens"  # other requests' recompute tokens there
LLM_STALL_DECODE_TOKENS = "llm.stall.decode_tokens"  # decode tokens of those steps (all requests)
LLM_STALL_STEPS = "llm.stall.steps"  # engine steps that ended inside the gap
LLM_STALL_STEP_TIME = "llm.stall.step_time"  # seconds: the longest of those steps, its start to its end
LLM_STALL_TYPICAL_GAP = "llm.stall.typical_gap"  # seconds: the request's typical gap, a stall's yardstick
LLM_STALL_REQUESTS = "llm.stall.requests"  # string[]: the other requests with that work, largest first
LLM_STALL_REQUEST_TOKENS = "llm.stall.request_tokens"  # int[]: their tokens, in the same order
LLM_STALLS = "llm.stalls"  # on llm.request: its stalls (all of them; events for the longest 16)
LLM_STALLED_PREFIX = "llm.stalled."  # on llm.request: + cause, the seconds stalled for that cause
# On llm.request, from the batch() hook (docs/lifecycle.md, "Engine time"): seconds of the engine's steps
# that went to the request (each step's time split by the tokens it computed for each request), and of
# those, the seconds spent recomputing after its preemptions.
LLM_ENGINE_TIME = "llm.engine.time"
LLM_ENGINE_TIME_RECOMPUTE = "llm.engine.time.recompute"
# On otel_llm.sampling.decisions: keep / drop, and the rule that decided.
LLM_SAMPLING_DECISION = "decision"
LLM_SAMPLING_REASON = "reason"

LLM_LATENCY_QUEUE = "llm.latency.queue"
LLM_LATENCY_PREFILL = "llm.latency.prefill"
LLM_LATENCY_DECODE = "llm.latency.decode"
LLM_LATENCY_INFERENCE = "llm.latency.inference"
LLM_LATENCY_TTFT = "llm.latency.time_to_first_token"
LLM_LATENCY_E2E = "llm.latency.e2e"
LLM_LATENCY_KV_TRANSFER = "llm.latency.kv_transfer"

# The role of the engine instance a tracker reports for (on every span and metric point of a tracker
# whose role is not ROLE_BOTH), and the bytes of a request's KV transfer (on llm.kv_transfer).
LLM_ROLE = "llm.role"
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_BOTH = "both"
ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH)
LLM_KV_TRANSFER_BYTES = "llm.kv_transfer.bytes"

# Where the prompt tokens of requests scheduled for the first time came from (llm.server.prompt_tokens),
# as vLLM's vllm:prompt_tokens_by_source splits them (its local_compute, local_cache_hit,
# external_kv_transfer): computed by the model, read from the local prefix cache, or received over a
# KV transfer (a connector, a disaggregated prefill instance).
LLM_PROMPT_TOKENS_SOURCE = "llm.prompt_tokens.source"
PROMPT_SOURCE_COMPUTED = "computed"
PROMPT_SOURCE_PREFIX_CACHE = "prefix_cache"
PROMPT_SOURCE_KV_TRANSFER = "kv_transfer"

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
# A request the tracker gave up on (never finished: past its maximum age or count in flight).
REASON_ABANDONED = "abandoned"
# The name that reason had before it had one of its own; an engine passing it is still a failure.
REASON_EVICTED = "evicted"
# Not a finish: a prefill instance handed the request to a decode instance (kv_sent), which finishes it.
REASON_HANDED_OFF = "handed_off"
# The finish reasons a metric attribute keeps as given; any other string counts as REASON_OTHER on metrics
# (the span keeps the original), so an engine cannot grow the number of time series.
REASON_OTHER = "other"
KNOWN_FINISH_REASONS = frozenset(
    {REASON_STOP, REASON_LENGTH, REASON_ABORT, REASON_ERROR, REASON_ABANDONED, REASON_EVICTED}
)
# Reasons that make a request a failure: no TTFT / TPOT sample, error.type on the duration.
FAILED_REASONS = frozenset({REASON_ERROR, REASON_ABANDONED, REASON_EVICTED})
# Reasons that cut a request short: the spans it was in at finish get LLM_CUT_SHORT (and, for a failure,
# the request's ERROR status). A client's abort is not a failure, but its phase still stopped early.
CUT_SHORT_REASONS = FAILED_REASONS | {REASON_ABORT}

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
# Tokens recomputed after preemptions, and the prefix-cache tokens those recomputes reused (counters,
# {token}; the sums of the llm.recompute spans' figures, counted when the request ends).
METRIC_RECOMPUTE_TOKENS = "llm.server.recompute.tokens"
METRIC_RECOMPUTE_CACHED_TOKENS = "llm.server.recompute.cached_tokens"
METRIC_KV_TRANSFER = "llm.server.kv_transfer.duration"
# Histogram, s: per request and cause it stalled for, its seconds stalled (attribute llm.stall.cause).
METRIC_STALLED = "llm.server.stalled.duration"
# Counter, s: engine seconds of finished requests (RequestTracker.batch), by llm.engine.work and the request
# attributes in OTEL_LLM_ENGINE_TIME_ATTRIBUTES.
METRIC_ENGINE_TIME = "llm.server.engine.time"
LLM_ENGINE_WORK = "llm.engine.work"
ENGINE_WORK_COMPUTE = "compute"  # the request's prompt and output tokens, computed for the first time
ENGINE_WORK_RECOMPUTE = "recompute"  # computed again after a preemption evicted its KV cache
METRIC_KV_TRANSFER_BYTES = "llm.server.kv_transfer.bytes"

# The engine's own state, reported through RequestTracker.engine_state() (once per step or stats interval).
METRIC_KV_CACHE_USAGE = "llm.server.kv_cache.usage"  # gauge, 1: fraction of KV-cache blocks in use
METRIC_SCHEDULER_REQUESTS = "llm.server.scheduler.requests"  # gauge, {request}: running / waiting
METRIC_PREFIX_CACHE_QUERIES = "llm.server.prefix_cache.queries"  # counter, {token}: prompt tokens looked up
METRIC_PREFIX_CACHE_HITS = "llm.server.prefix_cache.hits"  # counter, {token}: of those, found cached
METRIC_SPEC_DRAFT_TOKENS = "llm.server.spec_decode.draft_tokens"  # counter, {token}: proposed by the drafter
METRIC_SPEC_ACCEPTED_TOKENS = "llm.server.spec_decode.accepted_tokens"  # counter, {token}: of those, accepted
METRIC_STEP_TOKENS = "llm.server.step.tokens"  # histogram, {token}: tokens fed to the model per step
# counter, {token}: prompt tokens of requests scheduled for the first time, by llm.prompt_tokens.source
METRIC_PROMPT_TOKENS = "llm.server.prompt_tokens"

# Self-telemetry: how otel_llm itself is doing.
METRIC_ANOMALIES = "otel_llm.anomalies"
METRIC_ABANDONED = "otel_llm.requests.abandoned"  # otel_llm.requests.evicted before
METRIC_DROPPED_SPANS = "otel_llm.export.spans.dropped"
METRIC_DROPPED_POINTS = "otel_llm.export.metric_points.dropped"
METRIC_DROPPED_RECORDS = "otel_llm.export.records.dropped"  # finished requests lost before the export process
METRIC_QUEUE_DEPTH = "otel_llm.export.queue.depth"
METRIC_SAMPLING_DECISIONS = "otel_llm.sampling.decisions"  # tail sampling at finished(), by decision / reason
# An engine integration's own failures inside the engine, by engine and site (otel_llm.integrations.faults)
METRIC_INTEGRATION_ERRORS = "otel_llm.integration.errors"

UNIT_SECONDS = "s"
UNIT_PREEMPTION = "{preemption}"
UNIT_REQUEST = "{request}"
UNIT_TOKEN = "{token}"
UNIT_ANOMALY = "{anomaly}"
UNIT_RATIO = "1"
UNIT_DECISION = "{decision}"
UNIT_ERROR = "{error}"
UNIT_BYTES = "By"

# Explicit bucket boundaries, seconds. Each list starts with the GenAI semantic conventions' advice where
# there is one and goes on to where an overloaded server's values still land in a bucket rather than
# +Inf (vLLM's own histograms reach 2,560 s for TTFT and 7,680 s for end to end). Token gaps start at
# 100 µs: small models and speculative decoding produce sub-millisecond gaps.
BUCKETS_TTFT = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0,
)  # fmt: skip
BUCKETS_REQUEST_DURATION = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    163.84, 327.68, 655.36, 1310.72, 2621.44, 5242.88, 10485.76,
)  # fmt: skip
# Inter-token gaps and time per output token: 100 µs (a fast engine) to tens of seconds (a gap across a
# preemption, a server under overload).
BUCKETS_ITL = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075,
    0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
)  # fmt: skip
BUCKETS_TPOT = BUCKETS_ITL
# Tokens the engine feeds its model in one step: one decode token up to large prefill chunks.
BUCKETS_STEP_TOKENS = (
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
# Queue, prefill, decode, inference, preempted and recompute times: 100 µs to 40 minutes.
BUCKETS_PHASE = (
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 2400.0,
)  # fmt: skip

# Every constant above: the module is a list of names, and each of them is public.
__all__ = sorted(name for name in dict(globals()) if name.isupper())
