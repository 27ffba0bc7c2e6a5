"""Turn what SGLang's scheduler does to its ``Req`` objects into RequestTracker calls.

SGLang 0.5.23 stamps each request's ``SchedulerReqTimeStats`` with ``time.perf_counter()`` seconds
(the same clock as ``time.monotonic()`` on Linux, checked at import): ``wait_queue_entry_time`` when the
request enters the waiting queue (again after each retraction), ``last_forward_entry_time`` when a
prefill batch admits it (reset to 0 by a retraction). The adapter reads those stamps, so our queue time
is SGLang's own first wait, and every retraction wait is exactly SGLang's wait after that retraction.

Per request the adapter keeps what it has already reported (output tokens, retractions, the admission
stamp), so each scheduler call is turned into the difference since the last one:

- ``requeued(req)`` after ``Scheduler._add_request_to_queue``: first time -> ``queued`` (except SGLang's
  own health probes, which are never tracked); a higher
  ``retraction_count`` -> ``preempted`` at the re-queue stamp (SGLang's retract = our preemption, and the
  request is recomputed from prompt + generated tokens when admitted again).
- ``admitted(reqs)`` after ``Scheduler.get_new_batch_prefill``: a new admission stamp -> ``scheduled``
  with the request's ``prefix_len`` as its cached tokens
  (chunked prefill admits a request several times with one stamp; those are skipped).
- ``stepped(batch, ts)`` before ``Scheduler.process_batch_result``, once per batch the scheduler ran:
  what the batch computed per request (``extend_lens`` of a prefill or mixed batch, one token each in a
  decode batch) -> ``batch``, at ``ts``, when ``run_batch`` launched it. Under the overlap scheduler a
  batch's result is processed after the next batch is launched, so it is reported there, just before
  its own tokens, not at launch.
- ``streamed(reqs)`` before ``SchedulerOutputStreamer.stream_output``, which every batch result and
  every abort passes through: new output tokens -> ``tokens`` (one timestamp per call); a finished
  request not yet reported -> ``finished``. The overlap scheduler may stream a finished request twice;
  the second time it is no longer in flight here and is skipped (SGLang skips it the same way).

Nothing here imports SGLang: requests are read by attribute name.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from otel_llm import semconv as sc

# SGLang's per-process clock for request stamps; on Linux both are CLOCK_MONOTONIC.
__all__ = ["SGLangAdapter", "finish_reason", "to_monotonic"]

SAME_CLOCK = (
    time.get_clock_info("perf_counter").implementation == time.get_clock_info("monotonic").implementation
)
_PERF_TO_MONOTONIC = 0.0 if SAME_CLOCK else time.monotonic() - time.perf_counter()

# Request id prefix of the one-token generation SGLang's /health and /health_generate run
# (sglang.srt.constants.HEALTH_CHECK_RID_PREFIX); such requests are not traced.
HEALTH_CHECK = "HEALTH_CHECK"

# Attribute the tokenizer-side hook puts on the time stats that SGLang sends to the scheduler.
CARRIED = "otel_llm"


def to_monotonic(perf_ts: float) -> float:
    """A ``time.perf_counter()`` stamp of SGLang's on the ``time.monotonic()`` clock."""
    return perf_ts + _PERF_TO_MONOTONIC


def finish_reason(req: Any) -> str:
    """Our finish reason for a finished ``Req``: SGLang's OpenAI-style type (stop, length, abort)."""
    reason = getattr(req, "finished_reason", None)
    if reason is None:
        return sc.REASON_STOP
    try:
        kind = reason.to_json().get("type")
    except Exception:
        kind = None
    if isinstance(kind, str) and kind:
        return kind
    return type(reason).__name__.lower()


class _Live:
    """What the adapter has reported for one request in flight."""

    __slots__ = ("admissions", "admitted_at", "retractions", "tokens")

    def __init__(self, retractions: int) -> None:
        self.tokens = 0  # output tokens reported so far
        self.retractions = retractions  # SGLang's retraction_count when last seen
        self.admitted_at = 0.0  # the last_forward_entry_time already reported as scheduled
        self.admissions = 0  # admissions reported (the first feeds the prompt tokens by source)


class SGLangAdapter:
    """Feeds one SGLang scheduler's requests into a RequestTracker (request ids are SGLang's rids)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self._live: dict[str, _Live] = {}
        self.unflushed = 0  # requests finished since the last flush (see SGLangInstrumentor's on_idle)
        self._report_batch = getattr(tracker, "batch", None)  # a tracker without batch(): not reported
        self._step_open = False  # a batch went to batch() and its tokens() has not come yet

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def requeued(self, req: Any) -> None:
        """After ``_add_request_to_queue``: a new request was queued, or a retracted one re-queued."""
        stats = req.time_stats
        entered = getattr(stats, "wait_queue_entry_time", 0.0)
        if not entered:
            return  # rejected before the queue (priority or queue limit): SGLang streams its abort
        rid = req.rid
        if isinstance(rid, str) and rid.startswith(HEALTH_CHECK):
            return  # SGLang's /health probe: a one-token request per probe, not the users' traffic
        count = getattr(req, "retraction_count", 0)
        live = self._live.get(rid)
        if live is None:
            self._live[rid] = _Live(count)
            carried: Mapping[str, Any] = getattr(stats, CARRIED, None) or {}
            queued = to_monotonic(entered)
            created = carried.get("created")
            arrival = to_monotonic(created) if isinstance(created, float) and 0 < created <= entered else None
            self.tracker.queued(
                rid,
                ts=queued,
                arrival_ts=arrival,
                prompt_tokens=len(getattr(req, "origin_input_ids", ()) or ()),
                carrier=carried.get("carrier"),
            )
        elif count > live.retractions:
            # One re-queue per retraction; a count that jumped by more is reported once per step.
            for _ in range(count - live.retractions):
                self.tracker.preempted([rid], ts=to_monotonic(entered))
            live.retractions = count
            live.admitted_at = 0.0

    def admitted(self, reqs: Iterable[Any]) -> None:
        """After ``get_new_batch_prefill``: requests admitted to a prefill batch (first time or again).

        With each admission goes the request's ``prefix_len``: the tokens of what SGLang is about to
        prefill (the prompt at a first admission, prompt + output so far after a retraction) that its
        radix cache matched on the device, so not computed (the batch's ``prefix_lens``). First
        admissions also feed the prompt tokens by source (computed / prefix cache), once each."""
        computed = cached = 0
        for req in reqs:
            live = self._live.get(req.rid)
            if live is None:
                continue
            stamp = getattr(req.time_stats, "last_forward_entry_time", 0.0)
            if stamp and stamp != live.admitted_at:
                first = not live.admissions
                live.admitted_at = stamp
                live.admissions += 1
                hit = getattr(req, "prefix_len", None)
                if hit.__class__ is not int or hit < 0:
                    self.tracker.scheduled([req.rid], ts=to_monotonic(stamp))
                    continue
                self.tracker.scheduled([req.rid], ts=to_monotonic(stamp), cached_tokens=[hit])
                if first:
                    prompt = len(getattr(req, "origin_input_ids", ()) or ())
                    hit = min(hit, prompt)
                    computed += prompt - hit
                    cached += hit
        if computed or cached:
            report = getattr(self.tracker, "engine_state", None)
            if report is not None:
                report(prompt_tokens_computed=computed, prompt_tokens_cached=cached)

    def stepped(self, batch: Any, ts: float) -> None:
        """Before ``process_batch_result``: the batch's tokens per request, to ``batch()`` (``ts``: when
        it was launched, monotonic seconds). Idle and other batches that compute no tokens of their
        own (prebuilt: a disaggregated decode's first) are not reported, nor are speculative decoding's
        verify batches, whose kept tokens are known only after the step."""
        report = self._report_batch
        if report is None:
            return
        reqs = batch.reqs
        if not reqs:
            return
        mode = batch.forward_mode
        rids = [req.rid for req in reqs]
        if mode.is_decode():
            report(dict.fromkeys(rids, 1), ts=ts)
            self._step_open = True
        elif mode.is_extend() and not mode.is_target_verify():
            lens = batch.extend_lens
            if lens is not None and len(lens) == len(rids):
                report(dict(zip(rids, lens)), ts=ts)
                self._step_open = True

    def streamed(self, reqs: Iterable[Any], ts: float | None = None) -> None:
        """Before ``stream_output``: new tokens and finishes of these requests, at ``ts`` (monotonic s)."""
        ts = time.monotonic() if ts is None else ts
        ids: list[str] = []
        counts: list[int] = []
        done: list[tuple[str, str]] = []
        live_of = self._live.get
        for req in reqs:
            rid = req.rid
            live = live_of(rid)
            if live is None:
                continue
            finished = req.finished()
            if finished and getattr(req, "finished_output", False):
                continue  # streamed as finished before (overlap scheduler): already reported
            produced = getattr(req, "finished_len", None) if finished else None
            if produced is None:
                produced = len(req.output_ids)
            if produced > live.tokens:
                ids.append(rid)
                counts.append(produced - live.tokens)
                live.tokens = produced
            if finished:
                done.append((rid, finish_reason(req)))
        if ids:
            if all(n == 1 for n in counts):
                self.tracker.tokens(ids, ts=ts)
            else:
                self.tracker.tokens(ids, ts=ts, counts=counts)
        elif self._step_open:
            # A reported batch that gave no token (prompt chunks only) ends here, not when the next one
            # is launched: its time (llm.engine.time) must not take in the wait between the two.
            self.tracker.tokens([], ts=ts)
        self._step_open = False
        self.unflushed += len(done)
        for rid, reason in done:
            del self._live[rid]
            self.tracker.finished(rid, reason=reason, ts=ts)
