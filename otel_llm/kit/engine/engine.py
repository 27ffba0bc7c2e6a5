"""The engine loop: add requests, then ``step()`` until done. Each step reads as a sentence:
schedule, report preemptions and admissions, run the model, append tokens, report them, finish.

Per-request telemetry goes only through the public hook (a ``RequestTracker`` or anything with its
methods); each step takes one timestamp for its scheduling decisions and one for its tokens.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace

from otel_llm import semconv
from otel_llm.kit.engine.config import EngineConfig
from otel_llm.kit.engine.model_runner import ModelRunner
from otel_llm.kit.engine.scheduler import Scheduler
from otel_llm.kit.engine.sequence import Sequence, SequenceStatus
from otel_llm.kit.engine.telemetry import EngineTelemetry, parse_traceparent
from otel_llm.kit.engine.tokenizer import ByteTokenizer


@dataclass(slots=True)
class RequestOutput:
    """Tokens one step produced for one request. ``ts`` is the step's ``time.monotonic()`` seconds."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    ts: float


@dataclass(slots=True)
class Handoff:
    """A request a prefill instance hands to a decode instance: its tokens, its prompt's K/V
    ((layers, K/V, prompt tokens, H, D) float32 on the CPU) and the tracker's hand-off carrier."""

    request_id: str
    prompt_token_ids: list[int]
    first_token: int
    max_tokens: int
    stop_token_ids: list[int]
    kv: Any  # torch.Tensor
    carrier: dict[str, str] | None


class RequestTooLong(ValueError):
    """A prompt plus its output limit that no sequence of this engine can hold (counts in tokens)."""

    def __init__(self, prompt_tokens: int, max_tokens: int, limit: int) -> None:
        super().__init__(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the {limit} tokens "
            "one sequence may hold (KV cache slots, model positions); raise num_kv_blocks or shorten it"
        )
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


def validate_request(
    tokenizer: ByteTokenizer, config: EngineConfig, prompt: str | list[int], max_tokens: int
) -> list[int]:
    """The prompt's token ids, or ValueError (RequestTooLong when it does not fit) when the request
    could never run on an engine with ``config``."""
    token_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not token_ids:
        raise ValueError("prompt is empty; pass at least one character or token id")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    limit = min(config.kv_capacity, config.model.max_position)
    if len(token_ids) + max_tokens > limit:
        raise RequestTooLong(len(token_ids), max_tokens, limit)
    return token_ids


class LLMEngine:
    """A continuous-batching engine over a paged KV cache, with recompute preemption.

    ``tracker`` receives the request lifecycle (queued / scheduled / preempted / tokens / finished);
    ``meter_provider`` and ``tracer_provider`` (global ones when omitted) receive the step-level
    metrics and, with ``config.step_spans``, the ``llm.engine.step`` spans.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        tracker: Any | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.tokenizer = ByteTokenizer()
        self.scheduler = Scheduler(self.config)
        self.runner = ModelRunner(self.config, self.scheduler.block_manager)
        self.tracker = tracker
        # A hook with engine_state() (RequestTracker) also takes the engine's own state and, on
        # scheduled(), the tokens each request found in the prefix cache: its prompt's at the first
        # admission, its context's (prompt + output so far) at one after a preemption.
        self._reports_state = tracker is not None and hasattr(tracker, "engine_state")
        # ...and, per step, the tokens it computes for each request (batch(): why a request stalled).
        self._reports_batches = (
            self.config.report_batches and tracker is not None and hasattr(tracker, "batch")
        )
        self._prefix_hits_reported = 0
        self._prefix_queries_reported = 0
        self._prompt_tokens_reported = (0, 0, 0)  # computed, cached, transferred
        self.telemetry = EngineTelemetry(
            self.scheduler,
            meter_provider,
            tracer_provider,
            step_spans=self.config.step_spans,
            clock=getattr(tracker, "clock", None),  # a RequestTracker's: step and request spans agree
        )
        self._seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._handoffs: list[Handoff] = []  # prefill role: requests to send, see take_handoffs()

    def add_request(
        self,
        prompt: str | list[int],
        max_tokens: int = 16,
        request_id: str | None = None,
        carrier: Mapping[str, str] | None = None,
        stop_token_ids: Iterable[int] = (),
        arrival_ts: float | None = None,
    ) -> str:
        """Queue a request and return its id. ``carrier`` may hold a W3C ``traceparent`` to join."""
        token_ids = self.validate_request(prompt, max_tokens)
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in the engine; pass a unique one")
        seq = Sequence(request_id, token_ids, max_tokens, frozenset(stop_token_ids))
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        if self.tracker is not None:
            self.tracker.queued(
                request_id, arrival_ts=arrival_ts, prompt_tokens=len(token_ids), carrier=carrier
            )
            if self.telemetry.step_spans:
                seq.trace_link = parse_traceparent(self.tracker.traceparent(request_id))
        return request_id

    def add_handoff(self, handoff: Handoff, queued_ts: float, received_ts: float, num_bytes: int) -> str:
        """Decode role: continue a request a prefill instance handed off. ``queued_ts`` is when its
        transfer's metadata arrived, ``received_ts`` when all of its K/V had (``time.monotonic()``
        seconds); ``num_bytes`` the K/V's size. Its first token is delivered with the next one."""
        h = handoff
        seq = Sequence(h.request_id, list(h.prompt_token_ids), h.max_tokens, frozenset(h.stop_token_ids))
        if h.request_id in self._seqs:
            raise ValueError(f"request id {h.request_id!r} is already in the engine; pass a unique one")
        seq.output_token_ids.append(h.first_token)
        seq.num_computed_tokens = len(h.prompt_token_ids)  # their K/V came with the request
        seq.pending_kv = h.kv
        seq.undelivered = 1
        self._seqs[h.request_id] = seq
        self.scheduler.add(seq)
        if self.tracker is not None:
            tracker = self.tracker
            tracker.queued(
                h.request_id, ts=queued_ts, prompt_tokens=len(h.prompt_token_ids), carrier=h.carrier
            )
            tracker.kv_received(h.request_id, ts=received_ts, num_bytes=num_bytes)
        return h.request_id

    def take_handoffs(self) -> list[Handoff]:
        """Prefill role: the requests that got their first token since the last call, to send to a
        decode instance; the caller reports each one's ``kv_sent`` to the tracker once it is sent."""
        out, self._handoffs = self._handoffs, []
        return out

    def validate_request(self, prompt: str | list[int], max_tokens: int) -> list[int]:
        """The prompt's token ids, or ValueError when the request could never run on this engine."""
        return validate_request(self.tokenizer, self.config, prompt, max_tokens)

    def abort_request(self, request_id: str) -> bool:
        """Remove a waiting or running request; False if it is unknown or already finished."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, semconv.REASON_ABORT)
        if self.tracker is not None:
            self.tracker.finished(request_id, reason=semconv.REASON_ABORT)
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def step(self) -> list[RequestOutput]:
        sched_ts = time.monotonic()
        batch = self.scheduler.schedule()
        tracker = self.tracker
        if tracker is not None and batch.preempted:
            tracker.preempted([s.request_id for s in batch.preempted], ts=sched_ts)
        if tracker is not None and batch.newly_scheduled:
            ids = [s.request_id for s in batch.newly_scheduled]
            if self._reports_state:
                cached = [s.cached_at_admission for s in batch.newly_scheduled]
                tracker.scheduled(ids, ts=sched_ts, cached_tokens=cached)
            else:
                tracker.scheduled(ids, ts=sched_ts)
        for seq in batch.newly_scheduled:
            if seq.pending_kv is not None:  # a handed-in request: its prompt's K/V into its new blocks
                self.runner.write_kv(seq, seq.pending_kv)  # type: ignore[arg-type]
                seq.pending_kv = None
        if batch.is_empty():
            self.telemetry.record_step([], 0, 0, len(batch.preempted), 0.0, sched_ts, sched_ts)
            self._report_state(0)
            return []
        if self._reports_batches:
            tracker.batch(  # type: ignore[union-attr]
                {s.request_id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}, ts=sched_ts
            )
        decode_tokens = sum(1 for s in batch.seqs if not s.is_prefill)
        next_tokens = self.runner.run(batch)
        ts = time.monotonic()

        outputs: list[RequestOutput] = []
        finished: list[Sequence] = []
        block_manager = self.scheduler.block_manager
        handed: list[Sequence] = []
        produced: list[str] = []
        for seq, n, token in zip(batch.seqs, batch.num_new_tokens, next_tokens, strict=True):
            seq.num_computed_tokens += n
            block_manager.register_full_blocks(seq)
            if token is None:
                continue  # a prefill chunk that does not reach the end yet
            seq.output_token_ids.append(token)
            produced.append(seq.request_id)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                finished.append(seq)
            elif self.config.role == "prefill":
                handed.append(seq)  # its first token: the decode instance takes it from here
                continue
            new = seq.output_token_ids[-1 - seq.undelivered :]  # a handed-in request's first token too
            seq.undelivered = 0
            outputs.append(RequestOutput(seq.request_id, new, reason is not None, reason, ts))
        for seq in handed:
            self._hand_off(seq)
        if tracker is not None:
            if produced:
                tracker.tokens(produced, ts=ts, counts=_counts(produced, outputs))
            elif self._reports_batches:  # only prompt chunks: the step's end, for its time
                tracker.tokens([], ts=ts)
            for seq in finished:
                tracker.finished(seq.request_id, reason=seq.finish_reason, ts=ts)
        for seq in finished:
            del self._seqs[seq.request_id]
        self._report_state(batch.num_tokens)
        self.telemetry.record_step(
            batch.seqs,
            batch.num_tokens - decode_tokens,
            decode_tokens,
            len(batch.preempted),
            self.runner.last_forward_s,
            sched_ts,
            ts,
        )
        return outputs

    def _report_state(self, step_tokens: int) -> None:
        """The step's end state to the hook's engine_state(): one call per step, numbers only."""
        if not self._reports_state:
            return
        sched = self.scheduler
        queries, hits = sched.prefix_cache_queries, sched.prefix_cache_hits
        prompt = (sched.prompt_tokens_computed, sched.prompt_tokens_cached, sched.prompt_tokens_transferred)
        computed, cached, transferred = (n - r for n, r in zip(prompt, self._prompt_tokens_reported))
        self.tracker.engine_state(  # type: ignore[union-attr]
            kv_cache_usage=sched.block_manager.usage,
            running=len(sched.running),
            waiting=len(sched.waiting),
            prefix_cache_queries=queries - self._prefix_queries_reported,
            prefix_cache_hits=hits - self._prefix_hits_reported,
            step_tokens=step_tokens or None,
            prompt_tokens_computed=computed,
            prompt_tokens_cached=cached,
            prompt_tokens_transferred=transferred,
        )
        self._prefix_queries_reported, self._prefix_hits_reported = queries, hits
        self._prompt_tokens_reported = prompt

    def _hand_off(self, seq: Sequence) -> None:
        """Prefill role: copy the prompt's K/V out, free the blocks, queue the request for sending."""
        kv = self.runner.read_kv(seq, seq.num_prompt_tokens)
        carrier = self.tracker.handoff_carrier(seq.request_id) if self.tracker is not None else None
        self._handoffs.append(
            Handoff(
                seq.request_id,
                seq.prompt_token_ids,
                seq.output_token_ids[0],
                seq.max_tokens,
                sorted(seq.stop_token_ids),
                kv,
                carrier,
            )
        )
        self.scheduler.finish(seq, semconv.REASON_HANDED_OFF)
        del self._seqs[seq.request_id]

    @staticmethod
    def _finish_reason(seq: Sequence, token: int) -> str | None:
        if token in seq.stop_token_ids:
            return semconv.REASON_STOP
        if seq.num_output_tokens >= seq.max_tokens:
            return semconv.REASON_LENGTH
        return None

    def generate(self, prompts: Iterable[str], max_tokens: int = 16) -> list[str]:
        """Run ``prompts`` to completion and return their generated texts, in order."""
        ids = [self.add_request(p, max_tokens=max_tokens) for p in prompts]
        produced: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished():
            for out in self.step():
                if out.request_id in produced:
                    produced[out.request_id] += out.new_token_ids
        return [self.tokenizer.decode(produced[rid]) for rid in ids]

    def sequence(self, request_id: str) -> Sequence | None:
        """The live sequence of an unfinished request (for inspection), or None."""
        seq = self._seqs.get(request_id)
        return seq if seq is not None and seq.status is not SequenceStatus.FINISHED else None


def _counts(produced: list[str], outputs: list[RequestOutput]) -> list[int] | None:
    """Tokens per request of a step, or None when each got one (the tracker's fast path): a handed-in
    request's first step delivers two, the prefill instance's token and its own."""
    if all(len(o.new_token_ids) == 1 for o in outputs):
        return None
    delivered = {o.request_id: len(o.new_token_ids) for o in outputs}
    return [delivered.get(rid, 1) for rid in produced]
