"""The record: what the hook side knows about one finished request, and what it hands the emit side.

otel_llm is two halves with this package between them (docs/lifecycle.md, "The record"):

- the hook side (``otel_llm.hooks``: the tracker, its in-flight registry, timelines, checks, clock and
  trace identity) records numbers while requests run and produces one ``RequestRecord`` per finished
  request, plus the tracker's running figures (``Figures``) when asked;
- the emit side (``otel_llm.emit``: intervals, tail sampling, spans, metrics; ``otel_llm.export``:
  encoding and export, in the engine's process or in an export process beside it) only consumes them.

Neither half imports the other: a tracker is handed its ``RecordConsumer`` from outside
(``otel_llm.tracker``), and the consumer reaches back only through the ``Producer`` interface below.
Everything here is plain data (numbers, strings, tuples, dicts of attribute values), so a record crosses a
process boundary as it is (``otel_llm.record.wire``). Times are ``time.monotonic()`` seconds of the
producing tracker's clock; ``TrackerInfo.clock_offset_ns`` turns them into wall-clock nanoseconds.

Names follow docs/lifecycle.md: A arrival, Q queued, S1 first scheduled, F first tokens event, L last
tokens event, E finished; per preemption P_k, R_k (rescheduled), T_k (first tokens after R_k); K the end
of a disaggregated request's KV transfer on this instance.
"""

from __future__ import annotations

import threading
from operator import itemgetter
from typing import Any, Final, Protocol

from otel_llm import semconv as sc

# What a span_hook author reads (the record and the tracker's description of itself), and the detail
# levels; the rest is the contract between the two halves, internal to the package.
__all__ = ["DETAILS", "DETAIL_PHASES", "DETAIL_REQUEST", "DETAIL_STEPS", "RequestRecord", "TrackerInfo"]

# The version of the record layout (``RequestRecord``, ``TrackerInfo``, ``Figures`` and their wire form).
# A reader refuses a stream of another version rather than misread it.
VERSION = 4

# Trace detail levels (which spans a request gets): the hook side records steps only for ``steps``.
DETAIL_REQUEST = "request"
DETAIL_PHASES = "phases"
DETAIL_STEPS = "steps"
DETAILS = (DETAIL_REQUEST, DETAIL_PHASES, DETAIL_STEPS)

# Preemptions drawn as spans (and events) per request; 2 spans and 2 events each. A request preempted
# more often than this is thrashing, and the first ones show the pattern (the rest are summed up on
# llm.request). The hook side counts a request past it as an anomaly.
MAX_PREEMPTION_SPANS = 32
# Engine steps drawn as llm.engine.step spans per request (detail ``steps``): the longest ones.
MAX_STEP_SPANS = 16
# Stalls kept as rows (events) per request: the longest; the totals by cause count every one.
MAX_STALL_ROWS = 16

# The sampler decisions a record can carry, as the SDK's ``Decision`` numbers them.
DROP, RECORD_ONLY, RECORD_AND_SAMPLE = 0, 1, 2

# Trouble a consumer meets with a record, reported back as one of the tracker's anomaly kinds
# (``Producer.note``): building its spans or metric values raised; the user's span hook raised.
ANOMALY_FINISH_FAILED = "finish_failed"
ANOMALY_SPAN_HOOK_FAILED = "span_hook_failed"

# Preemption tuple fields (``RequestRecord.preemptions``), in order:
#   preempted (P_k), output_tokens (produced before P_k), last_token (the latest tokens event before P_k,
#   None when it came before the first token), rescheduled (R_k or None), recomputed (T_k or None),
#   cached_tokens and recompute_tokens (what the rescheduling found cached / had to compute; None when
#   the engine did not report it).
Preemption = tuple[float, int, "float | None", "float | None", "float | None", "int | None", "int | None"]
# Where each field of a Preemption sits: the emit side reads rows by these names, never by bare numbers.
# (Plain tuples on the wire: marshal takes no named tuples.) Final, so a type checker knows each type.
PREEMPTION_PREEMPTED: Final = 0
PREEMPTION_OUTPUT_TOKENS: Final = 1
PREEMPTION_LAST_TOKEN: Final = 2
PREEMPTION_RESCHEDULED: Final = 3
PREEMPTION_RECOMPUTED: Final = 4
PREEMPTION_CACHED_TOKENS: Final = 5
PREEMPTION_RECOMPUTE_TOKENS: Final = 6
# Step tuple fields (``RequestRecord.steps``): span start, tokens event (ts), index of the tracker's
# tokens() call, batch size, tokens fed to the model (or None), KV-cache usage (or None), and the trace id
# and span id of the engine's own span of that step (``StepWindow``; both None when it got none).
StepRow = tuple[float, float, int, int, "int | None", "float | None", "int | None", "int | None"]
STEP_START: Final = 0
STEP_TOKENS_AT: Final = 1
STEP_INDEX: Final = 2
STEP_BATCH_SIZE: Final = 3
STEP_TOKENS: Final = 4
STEP_KV_CACHE_USAGE: Final = 5
STEP_TRACE_ID: Final = 6
STEP_SPAN_ID: Final = 7
# An engine step with a span of its own (``StepWindow`` rows): its span id, span start (the previous
# tokens event), tokens event, index, batch size, tokens fed to the model (or None), KV-cache usage (or
# None), the (trace id, span id) of the llm.request span of each request that produced tokens in it, and
# what it computed by kind, (prefill, recompute, decode, spec) tokens, when the engine reports its batches
# (else None).
EngineStepRow = tuple[
    int,
    float,
    float,
    int,
    int,
    "int | None",
    "float | None",
    "tuple[tuple[int, int], ...]",
    "tuple[int, int, int, int] | None",
]
ENGINE_STEP_SPAN_ID: Final = 0
ENGINE_STEP_START: Final = 1
ENGINE_STEP_TOKENS_AT: Final = 2
ENGINE_STEP_REQUEST_LINKS: Final = 7
# One window of an engine's steps (detail ``steps``; ``otel_llm.hooks.step_windows``): its trace id and
# root span id, start and end (monotonic seconds), the steps in it, and those with spans (``EngineStepRow``).
StepWindow = tuple[int, int, float, float, int, "tuple[EngineStepRow, ...]"]
# Stall tuple fields (``RequestRecord.stalls`` rows, docs/lifecycle.md "Stalls"): gap start (the token
# before), gap end (the stalled token), cause, the stalled token's number (1 = the first), other requests'
# prefill and recompute tokens and the decode tokens in the steps that ended inside the gap, those steps,
# the other requests with prefill or recompute work there as (request id, tokens), largest first, the
# longest of those steps' own time (start to end; 0.0 for a preemption's gap), and the request's typical
# gap (both in seconds).
StallRow = tuple[float, float, str, int, int, int, int, int, "tuple[tuple[str, int], ...]", float, float]
# ``RequestRecord.stalls``: ((cause, stalls, seconds), ...) over every stall, and the longest
# ``MAX_STALL_ROWS`` rows in time order.
Stalls = tuple["tuple[tuple[str, int, float], ...]", "tuple[StallRow, ...]"]
# A parent span: trace id, span id, trace flags, whether it is remote, trace state as (key, value) pairs.
Parent = tuple[int, int, int, bool, "tuple[tuple[str, str], ...]"]
# A sampler's decision taken on the hook side: decision (DROP / RECORD_ONLY / RECORD_AND_SAMPLE), the
# attributes the sampler added itself (or None), its trace state as (key, value) pairs (or None).
Sampling = tuple[int, "dict[str, Any] | None", "tuple[tuple[str, str], ...] | None"]


class TrackerInfo:
    """What every record of one tracker shares: sent once, before its first record.

    ``base``: the attributes of every span and metric point (model, provider, operation, role, the
    integration's server attributes); ``detail``: the trace detail level; ``role``: ``prefill``,
    ``decode`` or ``both``; ``clock_offset_ns``: wall-clock ns minus monotonic ns of the tracker's clock.
    """

    __slots__ = ("base", "clock_offset_ns", "detail", "role")

    def __init__(self, base: dict[str, Any], detail: str, role: str, clock_offset_ns: int) -> None:
        self.base = base
        self.detail = detail
        self.role = role
        self.clock_offset_ns = clock_offset_ns

    def wall_ns(self, mono_s: float) -> int:
        """Monotonic seconds of this tracker's clock -> wall-clock nanoseconds since the epoch."""
        return self.clock_offset_ns + int(mono_s * 1e9)


class RequestRecord(tuple):
    """One finished request (or one abandoned, or one handed off to a decode instance), as plain data.

    Times are monotonic seconds (None where the request never reached that point):
    ``arrival`` A, ``queued`` Q, ``first_scheduled`` S1, ``first_token`` F, ``last_token`` L,
    ``finished`` E (K on a prefill instance that handed the request off), ``last_event`` (the latest event
    before E), ``kv_done`` K (the KV transfer's end on this instance).

    Identity, fixed on the hook side: ``trace_id`` and ``span_id`` of ``llm.request``; ``parent`` its
    parent span (``Parent``) or None; ``sampling`` the sampler's decision when the hook side took one
    (``traceparent()``, a hand-off; ``Sampling``), else None (the emit side asks its own sampler, with
    the span's full attributes); ``random_trace_id``: whether the id generator marks its trace ids random
    (W3C level 2).

    Counts: ``prompt_tokens``, ``output_tokens``, ``cached_tokens`` (prompt tokens found in the prefix
    cache at S1), ``kv_bytes``. ``preemptions``: one ``Preemption`` tuple per preemption, in order.
    ``steps``: for the ``steps`` detail level, ``(steps the request ran in, (StepRow, ...))`` with at most
    the longest 16 rows, else None. ``stalls``: when the engine reports its batches (``batch()``), the
    request's stalls (``Stalls``; empty tuples for none), else None. ``engine_time``: then also the
    request's share of the engine's steps, (seconds, of which recomputing after preemptions)
    (``otel_llm.hooks.engine_time``), else None.

    Outcome: ``reason`` (finish reason), ``error_type`` / ``status_message`` (set for failed reasons:
    the exception's class and its ``Type: message`` text, or the reason itself), ``handed_off`` (the
    request left for a decode instance), ``handed_in`` (a decode instance continues a prefill instance's
    request), ``prefill_kept`` (the prefill instance's tail-sampling decision, carried in).
    ``attributes``: the caller's attributes from ``queued`` (already cleaned), or None.

    A tuple of these fields in ``FIELDS`` order, read by name: made in one step when a request finishes
    and turned into its wire form as it is (``otel_llm.record.wire``); never changed once made.
    """

    __slots__ = ()

    # The order of the fields (and of the wire form); append only, and bump VERSION on change.
    FIELDS = (
        "request_id",
        "attributes",
        "prompt_tokens",
        "output_tokens",
        "cached_tokens",
        "arrival",
        "queued",
        "first_scheduled",
        "first_token",
        "last_token",
        "finished",
        "last_event",
        "reason",
        "error_type",
        "status_message",
        "trace_id",
        "span_id",
        "parent",
        "sampling",
        "random_trace_id",
        "preemptions",
        "handed_off",
        "handed_in",
        "prefill_kept",
        "kv_done",
        "kv_bytes",
        "steps",
        "stalls",
        "engine_time",
    )

    def __new__(cls, *fields: Any) -> RequestRecord:
        if len(fields) != len(cls.FIELDS):
            raise TypeError(f"a RequestRecord has {len(cls.FIELDS)} fields, got {len(fields)}")
        return tuple.__new__(cls, fields)

    def __repr__(self) -> str:
        return f"RequestRecord({self.request_id!r}, reason={self.reason!r}, trace_id={self.trace_id:032x})"

    # Filled in below from FIELDS: one read-only property per field.
    request_id: str
    attributes: dict[str, Any] | None
    prompt_tokens: int | None
    output_tokens: int
    cached_tokens: int | None
    arrival: float
    queued: float
    first_scheduled: float | None
    first_token: float | None
    last_token: float | None
    finished: float
    last_event: float
    reason: str
    error_type: str | None
    status_message: str | None
    trace_id: int
    span_id: int
    parent: Parent | None
    sampling: Sampling | None
    random_trace_id: bool
    preemptions: tuple[Preemption, ...]
    handed_off: bool
    handed_in: bool
    prefill_kept: bool | None
    kv_done: float | None
    kv_bytes: int | None
    steps: tuple[int, tuple[StepRow, ...]] | None
    stalls: Stalls | None
    engine_time: tuple[float, float] | None


for _index, _name in enumerate(RequestRecord.FIELDS):
    setattr(RequestRecord, _name, property(itemgetter(_index), doc=f"field {_index} of the record"))
del _index, _name


class Figures:
    """A tracker's running figures at one instant, read by whoever exports its metrics.

    Cumulative since the tracker started: ``states`` (requests in flight: waiting, running, preempted),
    ``anomalies`` (odd input by kind), ``abandoned`` (requests closed because they never finished),
    ``counters`` (the engine's counter totals by ``engine_state()`` argument; None: never reported) and
    ``prompt_tokens`` (by source, None before the first report). Latest values: ``kv_cache_usage``
    (0..1), ``running`` / ``waiting`` (as the engine counts them), None when not reported.

    ``itl`` / ``step_tokens``: the per-step samples recorded since the previous ``figures(drain=True)``
    ((gap seconds, how many requests) pairs; tokens per step), for a consumer that asked the tracker to
    buffer them (``Producer.use_recorders``); empty otherwise.
    """

    __slots__ = (
        "abandoned",
        "anomalies",
        "counters",
        "itl",
        "kv_cache_usage",
        "prompt_tokens",
        "running",
        "states",
        "step_tokens",
        "waiting",
    )

    FIELDS = (
        "states",
        "anomalies",
        "abandoned",
        "kv_cache_usage",
        "running",
        "waiting",
        "counters",
        "prompt_tokens",
        "itl",
        "step_tokens",
    )

    def __init__(
        self,
        states: tuple[int, int, int],
        anomalies: dict[str, int],
        abandoned: int,
        kv_cache_usage: float | None,
        running: int | None,
        waiting: int | None,
        counters: dict[str, int | None],
        prompt_tokens: dict[str, int] | None,
        itl: list[tuple[float, int]],
        step_tokens: list[int],
    ) -> None:
        self.states = states
        self.anomalies = anomalies
        self.abandoned = abandoned
        self.kv_cache_usage = kv_cache_usage
        self.running = running
        self.waiting = waiting
        self.counters = counters
        self.prompt_tokens = prompt_tokens
        self.itl = itl
        self.step_tokens = step_tokens


class StepRecorder(Protocol):
    """Where the hot path adds a per-step sample, with the producer's lock held: ``add(value, n)``."""

    def add(self, value: float, n: int = 1) -> None: ...


class Producer(Protocol):
    """What a record consumer may ask of the tracker that feeds it."""

    info: TrackerInfo

    @property
    def lock(self) -> threading.Lock:
        """The tracker's lock: held while the hot path adds to the per-step recorders."""
        ...

    def figures(self, drain: bool = False) -> Figures:
        """The tracker's figures now; ``drain``: also hand over (and forget) the buffered samples."""
        ...

    def use_recorders(self, itl: StepRecorder | None, step_tokens: StepRecorder | None) -> None:
        """Where the hot path adds inter-token gaps and tokens per step from now on; None: buffer them for
        ``figures(drain=True)``. Call with ``lock`` held."""
        ...

    def note(self, kind: str, request_id: Any) -> None:
        """Count trouble the consumer met with a record (an anomaly kind), as the tracker's own."""
        ...

    def step_windows(self, final: bool = False) -> list[StepWindow]:
        """The windows of engine steps closed since the last call (detail ``steps``; otherwise none),
        and the open one too when ``final`` (a flush). Takes the lock itself: call without it."""
        ...


class RecordConsumer(Protocol):
    """What a tracker hands its records to: an in-process emitter or an export process's feed.

    None of these may block the engine for long, do network I/O on the calling thread, or raise."""

    def bind(self, producer: Producer) -> None:
        """Called once, by the tracker being built, before any record."""
        ...

    def request(self, record: RequestRecord) -> None:
        """One finished request, on the thread that finished it."""
        ...

    def would_keep(self, record: RequestRecord) -> bool:
        """Whether the trace of ``record`` would be kept (tail sampling), without counting a decision."""
        ...

    def flush(self, timeout_millis: int) -> bool:
        """Export what is pending, within ``timeout_millis``; True when it finished in time."""
        ...

    def after_fork(self) -> None:
        """In a forked child, after the tracker renewed its lock: drop state a fork leaves unusable."""
        ...


def start_attributes(
    request_id: str, attributes: dict[str, Any] | None, prompt_tokens: int | None, base: dict[str, Any]
) -> dict[str, Any]:
    """The request span's attributes known from ``queued`` on: what a sampler sees when the decision is
    taken before the request ends, and the first part of ``llm.request``'s attributes.

    The caller's attributes first, then the tracker's (they win on a clash), then the request id and
    prompt tokens; ``llm.request.id`` given by the caller is kept (an integration that tracks requests
    under an internal id passes the client's id there)."""
    attrs: dict[str, Any] = dict(attributes) if attributes else {}
    own_id = attrs.get(sc.LLM_REQUEST_ID)
    attrs.update(base)
    attrs[sc.LLM_REQUEST_ID] = own_id if isinstance(own_id, str) else request_id
    if prompt_tokens is not None:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = prompt_tokens
    return attrs
