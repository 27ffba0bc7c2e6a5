"""An engine without a model, for the fleet tests: ``RequestTracker`` driven with explicit timestamps.

Every hook call takes ``ts=`` (monotonic seconds), so a request's time to first token is whatever the
script says, on any machine and under any load, and nothing waits on the wall clock: all timestamps lie
in the recent past. Telemetry goes through ``otel_llm.configure()``, set by the ``OTEL_*`` environment like
any engine's (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_LLM_TAIL_SAMPLING*``).

Modes (stdout: one JSON object a line):

- ``mix --counts fast=800,slow=40,...``: requests of these kinds, one after another, shuffled by ``--seed``.
  ``fast``: first token after 50 ms. ``near``: first token after ``--near-ttft`` s. ``slow``: after
  ``--slow-ttft`` s. ``preempted``: fast, preempted once during decode. ``error``: fast, finishes with
  reason ``error``. None but ``preempted`` is preempted, none but ``error`` fails. One line per request
  (``id``, ``kind``, ``trace_id``), then the summary.
- ``prefill --pairs K``: the prefill instance (``role="prefill"``) of K disaggregated requests, each
  preempted once during its prefill with ``--preempt``; one line per request with the hand-off carrier it
  sends to the decode instance, then the summary.
- ``decode``: the decode instance (``role="decode"``) of the requests whose carriers it reads on stdin (the
  prefill mode's lines); their first token is delivered ``--ttft`` s after arrival (the same value must be
  given to both). Then the summary.

The summary line: ``{"summary": {...}}`` with the spans the exporter delivered and lost and the CPU seconds
this process spent from its first request to the end of ``Telemetry.shutdown()`` (``time.process_time``,
every thread).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from otel_llm import RequestTracker, configure

KINDS = ("fast", "near", "slow", "preempted", "error")
FAST_TTFT_S = 0.05
TOKEN_GAP_S = 0.02
FLUSH_EVERY = 100  # requests: keeps the batch span processor's queue (2048 spans) from overflowing


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")


def trace_id(tracker: RequestTracker, rid: str) -> str:
    traceparent = tracker.traceparent(rid)
    assert traceparent is not None, rid
    return traceparent.split("-")[1]


def duration(kind: str, args: argparse.Namespace) -> float:
    ttft = {"near": args.near_ttft, "slow": args.slow_ttft}.get(kind, FAST_TTFT_S)
    return ttft + 4 * TOKEN_GAP_S + (0.4 if kind == "preempted" else 0.0)


def one_request(tracker: RequestTracker, rid: str, kind: str, t: float, args: argparse.Namespace) -> None:
    ttft = {"near": args.near_ttft, "slow": args.slow_ttft}.get(kind, FAST_TTFT_S)
    tracker.queued(rid, ts=t, prompt_tokens=32)
    emit({"id": rid, "kind": kind, "trace_id": trace_id(tracker, rid)})
    tracker.scheduled([rid], ts=t + ttft - 0.04)  # a slow first token waited in the queue
    tracker.tokens([rid], ts=t + ttft)
    t += ttft
    if kind == "error":
        tracker.finished(rid, reason="error", error="scripted failure", ts=t + TOKEN_GAP_S)
        return
    tracker.tokens([rid], ts=t + TOKEN_GAP_S)
    if kind == "preempted":
        tracker.preempted([rid], ts=t + 0.03)
        tracker.scheduled([rid], ts=t + 0.3)
        tracker.tokens([rid], ts=t + 0.35)  # recomputed, then this step's token
        t += 0.4
    tracker.tokens([rid], ts=t + 2 * TOKEN_GAP_S)
    tracker.tokens([rid], ts=t + 3 * TOKEN_GAP_S)
    tracker.finished(rid, reason="stop", ts=t + 4 * TOKEN_GAP_S)


def run_mix(tracker: RequestTracker, telemetry: Any, args: argparse.Namespace) -> None:
    kinds: list[str] = []
    for item in args.counts.split(","):
        kind, _, n = item.partition("=")
        if kind not in KINDS:
            raise SystemExit(f"unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        kinds += [kind] * int(n)
    random.Random(args.seed).shuffle(kinds)
    t = time.monotonic() - sum(duration(k, args) + 0.001 for k in kinds) - 1.0
    for i, kind in enumerate(kinds):
        one_request(tracker, f"req-{i:05d}", kind, t, args)
        t += duration(kind, args) + 0.001
        if (i + 1) % FLUSH_EVERY == 0:
            telemetry.force_flush()


def run_prefill(tracker: RequestTracker, args: argparse.Namespace) -> None:
    if args.ttft < 0.45:
        raise SystemExit("--ttft: at least 0.45 s (prefill, KV transfer, decode scheduling)")
    t = time.monotonic() - args.pairs * (args.ttft + 1.0) - 1.0
    for i in range(args.pairs):
        rid = f"pair-{i:03d}"
        tracker.queued(rid, ts=t, prompt_tokens=64)
        tracker.scheduled([rid], ts=t + 0.01)
        if args.preempt:
            tracker.preempted([rid], ts=t + 0.03)
            tracker.scheduled([rid], ts=t + 0.05)
        tracker.tokens([rid], ts=t + args.ttft - 0.4)  # the prefill's token, delivered by decode
        carrier = tracker.handoff_carrier(rid)
        emit({"id": rid, "trace_id": trace_id(tracker, rid), "carrier": carrier})
        tracker.kv_sent(rid, ts=t + args.ttft - 0.3, num_bytes=65536)
        t += args.ttft + 1.0


def run_decode(tracker: RequestTracker, args: argparse.Namespace) -> None:
    for line in sys.stdin:
        handed = json.loads(line)
        rid, carrier = handed["id"], handed["carrier"]
        arrival = float(carrier["llm-arrival"])
        first = arrival + args.ttft
        tracker.queued(rid, ts=first - 0.35, prompt_tokens=64, carrier=carrier)
        emit({"id": rid, "trace_id": trace_id(tracker, rid)})
        tracker.kv_received(rid, ts=first - 0.25, num_bytes=65536)
        tracker.scheduled([rid], ts=first - 0.2)
        tracker.tokens([rid], ts=first, counts=[2])
        tracker.tokens([rid], ts=first + TOKEN_GAP_S)
        tracker.tokens([rid], ts=first + 2 * TOKEN_GAP_S)
        tracker.finished(rid, reason="stop", ts=first + 3 * TOKEN_GAP_S)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("mix", "prefill", "decode"))
    parser.add_argument("--counts", default="fast=10", help="mix: kind=n,... (kinds: %(default)s)")
    parser.add_argument("--pairs", type=int, default=1, help="prefill: disaggregated requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near-ttft", type=float, default=1.9, help="seconds")
    parser.add_argument("--slow-ttft", type=float, default=2.5, help="seconds")
    parser.add_argument("--ttft", type=float, default=2.5, help="prefill, decode: seconds")
    parser.add_argument("--preempt", action="store_true", help="prefill: preempt each request once")
    args = parser.parse_args()
    telemetry = configure(service_name=f"otel-llm-scripted-{args.mode}")
    role = {"prefill": "prefill", "decode": "decode"}.get(args.mode, "both")
    tracker = RequestTracker(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        model="scripted",
        role=role,
    )
    started = time.process_time()
    if args.mode == "mix":
        run_mix(tracker, telemetry, args)
    elif args.mode == "prefill":
        run_prefill(tracker, args)
    else:
        run_decode(tracker, args)
    in_time = telemetry.shutdown()
    cpu_s = time.process_time() - started
    delivered, lost = telemetry.delivery("spans")
    emit({"summary": {"spans_delivered": delivered, "spans_lost": lost, "in_time": in_time, "cpu_s": cpu_s}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
