"""Turn vLLM V1 engine-core outputs into RequestTracker calls.

vLLM's engine core timestamps what happens to a request (QUEUED, SCHEDULED, PREEMPTED; monotonic seconds)
and sends the events to the frontend inside the request's next ``EngineCoreOutput``, so they arrive late:
QUEUED together with the first tokens, PREEMPTED together with the SCHEDULED that resumed the request.
Every event keeps its own timestamp, and the tracker takes explicit timestamps, so replaying one output's
events in timestamp order before its tokens rebuilds the timeline exactly as it happened. New tokens
carry the batch's ``EngineCoreOutputs.timestamp`` (the same clock). The result: our queue / prefill /
decode / inference values are computed from the very timestamps vLLM's ``FinishedRequestStats`` uses.

The engine's own state (KV-cache usage, running and waiting requests, prefix-cache and speculative
decoding counts, tokens per step) comes once per engine step from vLLM's ``SchedulerStats``, which the
frontend hands to ``OutputProcessor.update_scheduler_stats`` after the step's outputs (see
``engine_state``); each request's prefix-cache hits ride on its first output, next to its first SCHEDULED
event, and go to the tracker with it. What a rescheduling after a preemption found cached comes from the
engine core, in this process or sent from its own (``rescheduling``, ``engine_core_figures``); it goes
with that SCHEDULED event. What each step computed per request (``SchedulerOutput.num_scheduled_tokens``),
from the engine core in this process or sent from its own, goes to the trackers' ``batch()`` when the
step's outputs arrive (``compositions``), so the trackers explain stalls.

Nothing here imports vLLM: outputs and requests are read by attribute name, enum members by name, so a
vLLM build that renumbers its enums keeps working (``reading``).

Where the parts are: this module turns the frontend's calls into tracker calls; each request's life, from
registration through its events to its end, is ``followed`` (with ``choice_groups`` for ``n > 1`` and
``handoffs`` for disaggregated prefill); a step's ``engine_state()`` call is ``step_report``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Mapping
from operator import attrgetter
from typing import Any

from otel_llm import semconv as sc
from otel_llm.integrations.vllm import disaggregated as pd
from otel_llm.integrations.vllm.compositions import Compositions
from otel_llm.integrations.vllm.engine_state import (
    cached_prompt_tokens,
    computed_prompt_tokens,
    prompt_sources,
)
from otel_llm.integrations.vllm.followed import FollowedRequests, Pending, PendingEvents
from otel_llm.integrations.vllm.identity import identify
from otel_llm.integrations.vllm.reading import (
    choice_count,
    finish_reason_name,
    prompt_length,
    wall_to_monotonic,
)
from otel_llm.integrations.vllm.rescheduling import Reschedulings
from otel_llm.integrations.vllm.step_report import add_prompt, report_step

_log = logging.getLogger(__name__)

_REQUEST_ID = attrgetter("request_id")

TrackerFor = Callable[..., Any]
"""``tracker_for(model, operation)``: the RequestTracker for requests of that model and endpoint;
``tracker_for(model, operation, role)`` for a disaggregated request's part (``prefill`` / ``decode``),
whose tracker has that role (see ``disaggregated``)."""


class VLLMAdapter:
    """Feeds the requests and outputs of one vLLM ``OutputProcessor`` into RequestTrackers.

    The trackers' request ids are vLLM's internal request ids (unique per sequence, also with ``n > 1``);
    the id the client saw goes on the span as ``llm.request.id`` (see ``identity``), the internal one as
    ``vllm.request.id``. ``model`` is the served model name (set from vLLM's model config when the
    engine is built). Call order per engine step: ``outputs`` before vLLM processes the batch (it may trim
    tokens after a stop string), ``settle`` after (requests vLLM dropped from its open set have finished);
    an engine step whose outputs come in several batches (``AsyncLLM`` splits large ones) calls both per
    batch, then ``engine_stats`` once.

    The engine's own state goes to one tracker, the one this adapter's first request went to: it is one
    engine's state, and reporting it to every (model, endpoint) tracker would count it several times.
    """

    def __init__(
        self, tracker_for: TrackerFor, model: str | None = None, reschedulings: Reschedulings | None = None
    ) -> None:
        """``reschedulings``: what vLLM's engine core found cached when it rescheduled preempted requests,
        in this process or sent from its own (None: not known)."""
        self._tracker_for = tracker_for
        self.model = model
        # The requests followed, from registration to their end (``followed``). What of it every batch
        # reads is kept here too (the same objects), so the hot path reads it without a hop.
        self._requests = FollowedRequests(reschedulings)
        self._pending = self._requests.pending
        self._live = self._requests.live
        self._trackers = self._requests.trackers
        self._handoffs = self._requests.handoffs
        self._warned_no_events = False
        # Steps the scheduler scheduled for these requests, until their outputs arrive.
        self._compositions = Compositions()
        # With the engine core in its own process: reads the steps it sent (engine_core_figures) into
        # ``step_scheduled``, called as each batch of outputs arrives. None with the engine core here.
        self.pull_steps: Callable[[], None] | None = None
        # Tokens of the engine step being delivered, counted as vLLM's iteration stats count them.
        self._step_outputs = 0
        self._step_tokens = 0
        self._step_prompt: list[int] | None = None  # computed, local cache, external: vLLM's split
        # Whether this vLLM's outputs carry prefill_stats (0.32 and later, at least): without them the
        # prompt tokens a step computed are unknown, and tokens per step are not reported.
        self._prefill_stats: bool | None = None
        # How many requests vLLM's frontend held when ``outputs`` began (-1: not a dict, not known):
        # ``settle`` has nothing to do when it holds as many after processing the batch.
        self._open_before = -1

    def request_added(
        self,
        request: Any,
        parent: Any = None,
        index: int = 0,
        caller_headers: Mapping[str, str] | None = None,
    ) -> None:
        """Remember a new ``EngineCoreRequest``; the tracker hears of it when its QUEUED event arrives.

        ``parent``: vLLM's ``ParentRequest`` when the request is one of ``n > 1`` choices (``index``).
        ``caller_headers``: the caller's W3C headers when vLLM left them off the request.
        """
        request_id = request.request_id
        if request_id in self._pending or request_id in self._live:
            return  # a streaming-input update of a request we already follow
        arrival_wall = getattr(request, "arrival_time", None)
        arrival = wall_to_monotonic(arrival_wall) if arrival_wall else None
        headers = getattr(request, "trace_headers", None) or caller_headers
        carrier = dict(headers) if headers else None
        count = choice_count(parent)
        identity = identify(request, index if count > 1 else None)
        # A P/D request's part (n > 1 is not split across instances by vLLM's connectors: kept whole).
        params = pd.transfer_params(request) if count == 1 else None
        role = pd.request_role(params)
        if role == sc.ROLE_BOTH:
            tracker = self._tracker_for(self.model, identity.operation)
        else:
            tracker = self._tracker_for(self.model, identity.operation, role)
            if role == sc.ROLE_PREFILL:
                self._handoffs.expect(request_id)
            else:  # decode: continue the prefill instance's trace, else the caller's
                carrier = pd.carrier_in(params) or carrier
        choices = None
        if count > 1:
            choices = self._requests.choices.join(
                request_id, parent, identity, tracker, arrival, count, carrier, self.model
            )
            carrier = None  # the choice's parent is the llm.choices span
            arrival = choices.arrival  # one conversion to monotonic for all: children start with it
        self._requests.add(
            request_id, Pending(arrival, prompt_length(request), carrier, identity, tracker, choices)
        )

    def outputs(
        self, outputs: Iterable[Any], batch_ts: float | None, still_open: Container[str] | None = None
    ) -> None:
        """Replay one batch of ``EngineCoreOutput``s: each request's events, then the batch's tokens.

        ``still_open``: the requests vLLM's frontend holds before it processes the batch; the step's
        token count takes only their outputs, as vLLM's does (it drops outputs of aborted requests).
        None: every output counts.

        Most outputs of a step are a followed request's one new token and nothing else. Those reach the
        tracker in one ``tokens()`` call, their ids in vLLM's order, so an unchanged decode batch takes
        the tracker's steady path (one shared step moves). When every output of the batch is such a
        plain one, it is found with a few passes over the batch at C speed; otherwise the plain ones
        are sorted out in one loop, and only the others (events, not one token, a request not followed,
        a second tracker) go through ``_output``, one by one.
        """
        if batch_ts is None:
            batch_ts = time.monotonic()
        if self.pull_steps is not None:
            self._pull()
        if still_open is not None and still_open.__class__ is dict:
            self._open_before = len(still_open)
        else:
            self._open_before = -1
        live_get = self._live.get
        if outputs.__class__ is list and outputs:
            # The common step: every output is a followed request's one new token, without events, and
            # all go to one tracker. A request's first output, the only one with ``prefill_stats`` (its
            # prompt's figures), is never plain: it carries the QUEUED event, or, from an engine core
            # without events, it belongs to a request not opened yet.
            request_ids = list(map(_REQUEST_ID, outputs))
            owners = list(map(live_get, request_ids))
            tracker = owners[0]
            if (
                tracker is not None
                and owners.count(tracker) == len(owners)
                and not [out for out in outputs if out.events or len(out.new_token_ids) != 1]
            ):
                self._step_outputs += len(request_ids)
                self._step_tokens += len(request_ids)
                if self._compositions and self._report_steps(batch_ts) and len(self._trackers) > 1:
                    self._end_steps(batch_ts, tracker)
                tracker.tokens(request_ids, ts=batch_ts)
                if self._handoffs.remote_decode:
                    self._handoffs.hand_off(outputs, self._live)
                return
        plain: list[str] = []  # followed, one token, nothing else, all on ``tracker``
        odd: list[Any] | None = None
        tracker = None
        for out in outputs:
            request_id = out.request_id
            owner = live_get(request_id)
            if (
                owner is None
                or out.events
                or len(out.new_token_ids) != 1
                or (owner is not tracker and tracker is not None)
            ):
                if odd is None:
                    odd = []
                odd.append(out)
                continue
            tracker = owner
            plain.append(request_id)
        # A followed request is open in vLLM's frontend until ``settle`` or ``abandoned`` drops it, so
        # every plain output counts for the step, one token each.
        self._step_outputs += len(plain)
        self._step_tokens += len(plain)
        if odd is None:
            reported = bool(self._compositions) and self._report_steps(batch_ts)
            if plain and tracker is not None:  # a plain output always set tracker
                tracker.tokens(plain, ts=batch_ts)
            if reported:
                self._end_steps(batch_ts, *((tracker,) if plain else ()))
        else:
            batches: dict[Any, tuple[list[str], list[int]]] = {}
            if plain:
                batches[tracker] = (plain, [1] * len(plain))
            for out in odd:
                self._output(out, batch_ts, still_open, batches)
            # After the events: the trackers know which requests are new.
            reported = bool(self._compositions) and self._report_steps(batch_ts)
            for owner, (request_ids, counts) in batches.items():
                # One token each (no speculative decoding) goes without counts: the tracker's fast path.
                one_each = counts.count(1) == len(counts)
                owner.tokens(request_ids, ts=batch_ts, counts=None if one_each else counts)
            if reported:
                self._end_steps(batch_ts, *batches)
        if self._handoffs.remote_decode:
            self._handoffs.hand_off(outputs, self._live)

    def _output(
        self,
        out: Any,
        batch_ts: float,
        still_open: Container[str] | None,
        batches: dict[Any, tuple[list[str], list[int]]],
    ) -> None:
        """One output that is not a followed request's plain token: its step counts, its events (in
        timestamp order, before its tokens), and its tokens added to its tracker's batch."""
        request_id = out.request_id
        if self._prefill_stats is None:
            self._prefill_stats = hasattr(out, "prefill_stats")
        if still_open is None or request_id in still_open:
            self._step_outputs += 1
            self._step_tokens += len(out.new_token_ids) + (computed_prompt_tokens(out) or 0)
            sources = prompt_sources(out)
            if sources is not None:
                self._step_prompt = add_prompt(self._step_prompt, sources)
        if request_id not in self._live and request_id not in self._pending:
            return  # registered before instrumentation, or already finished
        events = out.events
        # The prefix-cache hits of the first scheduling ride on the request's first output (older
        # vLLMs repeat them on every output: only the first output's go to the first SCHEDULED).
        cached = cached_prompt_tokens(out) if request_id in self._pending else None
        if events:
            self._requests.replay(request_id, events, cached)
        if request_id in self._pending:
            # No QUEUED event: the engine core runs without stats logging. Queue from arrival and
            # schedule at this batch; the prefill/queue split and preemptions are unknown then.
            self._note_no_events()
            self._requests.open(request_id, None)
            self._requests.schedule(request_id, batch_ts, cached)
        produced = len(out.new_token_ids)
        if produced:
            tracker = self._live[request_id]
            batch = batches.get(tracker)
            if batch is None:
                batch = batches[tracker] = ([], [])
            batch[0].append(request_id)
            batch[1].append(produced)

    def step_scheduled(
        self, scheduled: Any, ts: float, recompute: list[Any] | None = None, addressed: bool = False
    ) -> None:
        """A scheduler's step (``num_scheduled_tokens`` as otel_llm's own dict, kept as given: nothing
        changes it; scheduled at ``ts``, monotonic seconds; ``recompute``: its requests that recompute):
        kept when it holds a request of this frontend (or ``addressed``: its engine core sent it to this
        frontend), reported when its outputs arrive."""
        if not scheduled:
            return
        if addressed:
            if self._live or self._pending:
                self._compositions.add(ts, scheduled, recompute)
            return
        first = next(iter(scheduled))
        if first in self._live or first in self._pending:
            self._compositions.add(ts, scheduled, recompute)

    def _pull(self) -> None:
        self.pull_steps()  # type: ignore[misc]

    def _report_steps(self, batch_ts: float) -> bool:
        """``batch()`` of every kept step scheduled by ``batch_ts`` to each tracker of this frontend:
        they share the engine's steps, so each one's stalls may name requests of another. Returns
        whether any was. What raises here reaches the instrumentor's wrapper, which counts it and
        stops the integration: later steps would have no stall figures."""
        reported = False
        for ts, scheduled, recompute in self._compositions.due(batch_ts):
            reported = True
            for tracker in self._trackers.values():
                tracker.batch(scheduled, ts=ts, recompute=recompute)
        return reported

    def _end_steps(self, batch_ts: float, *told: Any) -> None:
        """The steps just reported ended at ``batch_ts``: said to each tracker that got no tokens with
        them (``tokens([])``), e.g. a step of prompt chunks only. Else the step would last until the next
        one began, and its time (``llm.engine.time``) would take in the wait between the two."""
        if len(told) == len(self._trackers):
            return  # every tracker got tokens, which ended the step
        for tracker in self._trackers.values():
            if tracker not in told:
                tracker.tokens([], ts=batch_ts)

    def engine_stats(self, stats: Any) -> None:
        """The end of one engine step: its ``SchedulerStats`` (or None) and the tokens of its outputs.

        One ``engine_state()`` call per step. Tokens per step are counted only for steps that delivered
        outputs, as vLLM records ``vllm:iteration_tokens_total``: per output, its new tokens plus, on a
        request's first output, the prompt tokens the engine computed (its prefix-cache hits excluded).
        A step of vLLM 0.32 / 0.33 with no first output, no prefix-cache lookup and no speculative
        decoding reads five fields straight; any other goes through ``state_of``, field by field.
        """
        outputs, tokens = self._step_outputs, self._step_tokens
        self._step_outputs = self._step_tokens = 0
        prompt, self._step_prompt = self._step_prompt, None
        tracker = self._requests.engine_tracker
        if tracker is not None:
            step = tokens if outputs and self._prefill_stats is not False else None
            report_step(tracker, stats, step, prompt)

    def settle(self, outputs: Iterable[Any], still_open: Container[str]) -> None:
        """After vLLM processed a batch: finish the requests of ``outputs`` that left ``still_open``.

        A request can finish in the frontend without an engine finish reason (a stop string found by the
        detokenizer, or a request rejected with an error), so membership decides, the reason explains.
        """
        before, self._open_before = self._open_before, -1
        if before >= 0 and len(still_open) == before:  # type: ignore[arg-type]
            return  # vLLM's frontend dropped none of its requests while it processed this batch
        now = time.monotonic()
        for out in outputs:
            request_id = out.request_id
            if request_id not in self._live or request_id in still_open:
                continue
            error = getattr(out, "error", None)
            if out.finish_reason is not None:
                reason = finish_reason_name(out.finish_reason)
            elif error is not None:
                reason = sc.REASON_ERROR
            else:
                reason = sc.REASON_STOP
            message = getattr(error, "message", None) if error is not None else None
            if request_id in self._handoffs.handing_off:
                self._requests.sent(request_id, now)
            else:
                self._requests.finish(request_id, reason, now, message)

    def abandoned(self, still_open: Container[str], pending_events: PendingEvents | None = None) -> None:
        """After an abort: every request we follow that left ``still_open`` finished with ``abort``.

        ``pending_events`` gives the events the engine core recorded but has not sent yet (only possible
        when the engine core runs in this process): replayed first, so the trace shows the scheduling,
        prefill and preemptions that happened before the abort.
        """
        self._requests.abandon(still_open, pending_events)

    def abandon_all(self, why: str) -> int:
        """Every request followed ends now as ``abandoned``, with ``why`` as its error: the integration
        stops, and no later event of theirs will reach a tracker. Returns how many ended."""
        return self._requests.abandon_all(why)

    def parent_headers(self, request_id: str, headers: Mapping[str, str] | None) -> dict[str, str] | None:
        """The W3C headers that put vLLM's own ``llm_request`` span (its ``--otlp-traces-endpoint``
        tracing) under this request's ``llm.request``: ``headers``, the caller's as vLLM carries them,
        with the traceparent of our span instead of theirs (their tracestate is ours too, as ours
        continues the caller's). None for a request not followed, whose headers vLLM keeps."""
        tracker = self._live.get(request_id)
        if tracker is None:
            return None
        traceparent = tracker.traceparent(request_id)
        if traceparent is None:
            return None
        merged = {k: v for k, v in (headers or {}).items() if k.lower() != "traceparent"}
        merged["traceparent"] = traceparent
        return merged

    # --- internals -----------------------------------------------------------------------------------

    def _note_no_events(self) -> None:
        if not self._warned_no_events:
            self._warned_no_events = True
            _log.warning(
                "otel_llm: vLLM's outputs carry no request events, so queue time, prefill and preemptions "
                "are not visible (prefill shows as 0, queue time as the whole wait). The engine-core "
                "process did not load the otel_llm plugin that turns them on: unset VLLM_PLUGINS or add "
                "otel_llm to it (VLLM_PLUGINS=otel_llm,...), or run vLLM with stats logging on."
            )
