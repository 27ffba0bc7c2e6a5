"""What travels with a request from a prefill instance to a decode instance, so both report one trace.

Disaggregated serving splits a request over two engine instances: the prefill instance computes the
prompt's KV cache and the first token, then sends the KV cache to a decode instance, which produces the
rest. The prefill instance's tracker fixed the request's trace identity at ``queued``; the decode
instance's tracker continues it from a carrier sent in the transfer's metadata (plain strings, so it fits
a JSON header, vLLM's ``kv_transfer_params``, or HTTP headers):

- ``traceparent``: W3C header of the request's ``llm.request`` span (trace id, span id, sampled flag);
  the decode instance emits that span, and the prefill instance's spans are already its children;
- ``llm-request-parent``: W3C header of ``llm.request``'s own parent (the caller's span), when it has one;
- ``llm-arrival``: the request's arrival (A) at the prefill side, ``time.monotonic()`` seconds, exact
  between the processes of one host (they share the monotonic clock);
- ``llm-arrival-unix-nano``: the same arrival on the wall clock (ns since the Unix epoch), and
  ``llm-clock``: which monotonic clock ``llm-arrival`` is on (the Linux boot id). A decode instance on
  another host (another boot id, or none on either side) places the arrival from the wall clock, so
  the arrival there is as good as the two hosts' clock sync; a skew that puts it after the decode
  instance's ``queued`` is clamped and counted like any arrival after queued;
- ``llm-tail-sampling``: ``keep`` or ``drop``, the prefill instance's tail-sampling decision for its
  spans (``keep`` when it does no tail sampling), so the decode instance keeps what it kept
  (``otel_llm.emit.sampling``, rule ``prefill_kept``).

The trackers' side: ``carrier_for`` makes a prefill instance's carrier (``handoff_carrier()``), and
``continue_request`` marks a decode instance's timeline of a request handed in (``queued(carrier=...)``).
Only the OpenTelemetry API is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_llm.hooks.clock import Clock
from otel_llm.hooks.identity import (
    format_traceparent,
    normalize_carrier,
    parent_span_context,
    parse_traceparent,
)
from otel_llm.hooks.timeline import Timeline

if TYPE_CHECKING:
    from otel_llm.hooks.identity import TraceIdentity

KEY_TRACEPARENT = "traceparent"
KEY_PARENT = "llm-request-parent"
KEY_ARRIVAL = "llm-arrival"
KEY_ARRIVAL_UNIX_NANO = "llm-arrival-unix-nano"
KEY_CLOCK = "llm-clock"
KEY_TAIL = "llm-tail-sampling"
# Every key a carrier may hold (a transport that keeps only some must keep these).
CARRIER_KEYS = (KEY_TRACEPARENT, KEY_PARENT, KEY_ARRIVAL, KEY_ARRIVAL_UNIX_NANO, KEY_CLOCK, KEY_TAIL)
TAIL_KEEP = "keep"
TAIL_DROP = "drop"


@dataclass(frozen=True, slots=True)
class HandedIn:
    """A request's identity as the decode instance continues it."""

    trace_id: int
    span_id: int  # of llm.request, fixed by the prefill instance
    sampled: bool
    parent: Context | None  # llm.request's parent (remote), or None when it is a trace's root
    arrival: float | None  # A, monotonic seconds
    prefill_kept: bool | None  # the prefill instance's tail-sampling decision; None when not carried


@cache
def monotonic_clock_id() -> str | None:
    """What names this host's ``time.monotonic()`` clock: the Linux boot id (read once), else None."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def make_carrier(
    traceparent: str, parent: SpanContext | None, arrival: float, clock: Clock, kept: bool = True
) -> dict[str, str]:
    """The hand-off carrier of a request (see the module docstring); ``kept``: whether the prefill
    instance keeps the request's spans (its tail-sampling decision). ``clock``: the tracker's, which
    turns ``arrival`` (monotonic seconds) into the carried wall-clock time."""
    carrier = {
        KEY_TRACEPARENT: traceparent,
        KEY_ARRIVAL: repr(arrival),
        KEY_ARRIVAL_UNIX_NANO: str(clock.wall_ns(arrival)),
        KEY_TAIL: TAIL_KEEP if kept else TAIL_DROP,
    }
    clock_id = monotonic_clock_id()
    if clock_id is not None:
        carrier[KEY_CLOCK] = clock_id
    if parent is not None:
        carrier[KEY_PARENT] = format_traceparent(parent.trace_id, parent.span_id, int(parent.trace_flags))
    return carrier


def read_carrier(carrier: Mapping[str, Any] | None, clock: Clock) -> HandedIn | None:
    """The continued identity, or None when the carrier is not a hand-off (e.g. a caller's headers).
    ``clock``: the tracker's, which moves a carried wall-clock arrival onto its monotonic clock."""
    headers = normalize_carrier(carrier)
    if not headers or KEY_ARRIVAL not in headers:
        return None
    own = parse_traceparent(headers.get(KEY_TRACEPARENT))
    if own is None:
        return None
    trace_id, span_id, flags = own
    parent = None
    above = parse_traceparent(headers.get(KEY_PARENT))
    if above is not None and above[0] == trace_id:
        ctx = SpanContext(trace_id, above[1], is_remote=True, trace_flags=TraceFlags(above[2]))
        parent = trace.set_span_in_context(NonRecordingSpan(ctx))
    arrival = _arrival(headers, clock)
    tail = headers.get(KEY_TAIL, "").strip().lower()
    kept = True if tail == TAIL_KEEP else False if tail == TAIL_DROP else None
    return HandedIn(trace_id, span_id, bool(flags & 0x01), parent, arrival, kept)


def _arrival(headers: Mapping[str, str], clock: Clock) -> float | None:
    """The carried arrival on this process's monotonic clock, or None when it cannot be read.

    The monotonic value as it is when the carrier comes from this host's clock; otherwise the wall-clock
    value moved onto this host's monotonic clock (a carrier without one falls back to the monotonic
    value, as older versions sent)."""
    clock_id = headers.get(KEY_CLOCK)
    same_clock = clock_id is not None and clock_id == monotonic_clock_id()
    if not same_clock:
        try:
            wall_ns = int(headers[KEY_ARRIVAL_UNIX_NANO])
        except (KeyError, ValueError):
            pass
        else:
            return clock.monotonic_s(wall_ns)
    try:
        arrival = float(headers[KEY_ARRIVAL])
    except ValueError:
        return None
    return arrival if math.isfinite(arrival) else None


def carrier_for(tl: Timeline, traceparent: str, kept: bool, clock: Clock) -> dict[str, str]:
    """A prefill instance's carrier of the request ``tl`` in flight; ``traceparent``: the header of its
    ``llm.request`` span; ``kept``: whether this instance keeps the request's spans (tail sampling
    decides at the hand-off what ``kv_sent()`` will: no rule depends on the transfer on a prefill
    instance, so the decision travels with it)."""
    return make_carrier(traceparent, parent_span_context(tl.parent), tl.arrival, clock, kept)


def continue_request(tl: Timeline, handed: HandedIn, identity: TraceIdentity) -> None:
    """A decode instance's new timeline ``tl`` of a request handed in: its trace ids and arrival already
    came from ``handed``; its sampling decision was taken by the prefill instance's sampler."""
    tl.handed_in = True
    tl.prefill_kept = handed.prefill_kept
    identity.continue_sampling(tl, handed.sampled)
