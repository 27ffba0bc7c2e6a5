"""Hugging Face transformers: one request trace per sequence that ``generate()`` produces.

Switch it on once, before generating::

    from otel_llm.integrations.transformers import TransformersInstrumentor

    TransformersInstrumentor().instrument(model="my-model")
    model.generate(input_ids, max_new_tokens=32)  # each row of the batch becomes one llm.request trace

How a call maps onto the request lifecycle: every output sequence is a request that is
queued and scheduled when ``generate()`` is entered (a plain call has no queue), produces one tokens
event per generation step (the first step is the prefill, so its timestamp is the first token) and
finishes with ``stop`` at the step that emitted an end-of-sequence token, ``length`` when it reached the
token limit, ``error`` (the exception attached) when ``generate()`` raised. The per-step timestamps come
from a stopping criterion appended to the call that never stops anything; it reads the newest token of
each row, which is a host-device sync that greedy and sampling decoding already do every step.

Limits: rows stopped by stop strings, ``max_time`` or your own criteria are finished (``stop``) when
``generate()`` returns; beam search and other modes whose steps do not map one row to one output are
traced per output sequence with batch-level step timestamps; ``custom_generate`` repositories and paged
(continuous batching) calls run untraced. Telemetry trouble is logged once and never reaches generation.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai

from otel_llm import semconv

__all__ = ["TransformersInstrumentor"]

_logger = logging.getLogger(__name__)
_PROVIDER_NAME = "transformers"
_logged: set[str] = set()
_nesting = threading.local()


def _log_once(kind: str, exc: BaseException | None = None) -> None:
    """Log a telemetry fault the first time it happens; generation carries on either way."""
    if kind not in _logged:
        _logged.add(kind)
        _logger.warning("otel_llm transformers integration: %s (logged once)", kind, exc_info=exc)


class _StepObserver:
    """A stopping criterion that reports every generation step to the tracker and never stops anything.

    ``ids[row]`` is the request id of output row ``row``. Timestamps are ``time.monotonic()`` seconds,
    taken after the step's tokens are readable on the host.
    """

    def __init__(
        self,
        tracker: Any,
        ids: list[str],
        start_len: int | None,
        eos: frozenset[int],
        max_new: int | None,
        ends_at_cap: bool,
    ) -> None:
        self.tracker = tracker
        self.alive = dict(enumerate(ids))  # row -> request id, rows still generating
        self.generated = [0] * len(ids)
        self.prev_len = start_len  # sequence length before this step; None when unknown
        self.eos = eos
        self.max_new = max_new
        self.ends_at_cap = ends_at_cap
        self.broken = False
        self._not_done: Any = None  # cached all-False verdict, reused while shape and device hold

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        if not self.broken and self.alive:
            try:
                self._step(input_ids)
            except Exception as exc:
                self.broken = True
                _log_once("step callback failed; this call is no longer traced", exc)
        verdict = self._not_done
        if verdict is None or verdict.shape[0] != input_ids.shape[0] or verdict.device != input_ids.device:
            import torch

            verdict = self._not_done = torch.zeros(
                input_ids.shape[0], dtype=torch.bool, device=input_ids.device
            )
        return verdict

    def _step(self, input_ids: Any) -> None:
        cur_len = input_ids.shape[-1]
        # Assisted decoding appends several tokens per step; plain decoding one.
        new = 1 if self.prev_len is None else max(cur_len - self.prev_len, 1)
        self.prev_len = cur_len
        per_row = input_ids.shape[0] == len(self.generated)
        latest = input_ids[:, -new:].tolist() if per_row and self.eos else None
        ts = time.monotonic()
        step_ids: list[str] = []
        counts: list[int] = []
        done: list[tuple[int, str]] = []
        for row, request_id in self.alive.items():
            produced, reason = new, None
            if latest is not None:
                for k, token in enumerate(latest[row]):
                    if token in self.eos:
                        produced, reason = k + 1, semconv.REASON_STOP
                        break
            self.generated[row] += produced
            if reason is None and self.max_new is not None and self.generated[row] >= self.max_new:
                reason = semconv.REASON_LENGTH
            step_ids.append(request_id)
            counts.append(produced)
            if reason is not None:
                done.append((row, reason))
        self.tracker.tokens(step_ids, ts=ts, counts=counts if new > 1 else None)
        for row, reason in done:
            self.tracker.finished(self.alive.pop(row), reason=reason, ts=ts)

    def close(self, error: BaseException | None = None) -> None:
        """Finish the rows still generating when ``generate()`` returned or raised."""
        for row, request_id in self.alive.items():
            if error is None:
                full = self.ends_at_cap if self.max_new is None else self.generated[row] >= self.max_new
                reason = semconv.REASON_LENGTH if full else semconv.REASON_STOP
            else:
                reason = semconv.REASON_ERROR if isinstance(error, Exception) else semconv.REASON_ABORT
            self.tracker.finished(request_id, reason=reason, error=error)
        self.alive.clear()


def _setting(name: str, kwargs: dict[str, Any], config: Any, model_config: Any) -> Any:
    """A generation setting as generate() resolves it: call kwargs, passed config, model config."""
    if kwargs.get(name) is not None:
        return kwargs[name]
    for source in (config, model_config):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


def _token_set(value: Any) -> frozenset[int]:
    if value is None:
        return frozenset()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return frozenset(value) if isinstance(value, (list, tuple)) else frozenset((int(value),))


def _start(
    tracker: Any,
    model: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    config_index: int,
    user_criteria: bool,
) -> _StepObserver | None:
    """Register the call's requests as queued and scheduled now; None for calls we do not trace."""
    if isinstance(kwargs.get("custom_generate"), str) or kwargs.get("cache_implementation") == "paged":
        return None
    inputs: Any = args[0] if args else None  # a tensor (or None), probed by its ndim below
    for key in ("inputs", "input_ids", "inputs_embeds", "input_features"):
        if inputs is None:
            inputs = kwargs.get(key)
    config = args[config_index] if len(args) > config_index else kwargs.get("generation_config")
    model_config = getattr(model, "generation_config", None)

    def setting(name: str) -> Any:
        return _setting(name, kwargs, config, model_config)

    batch = int(inputs.shape[0]) if getattr(inputs, "ndim", 0) >= 2 else 1
    # Token ids (batch, seq) or embeddings (batch, seq, hidden); audio features say nothing about tokens.
    embeds = inputs is not None and inputs is kwargs.get("inputs_embeds")
    width = int(inputs.shape[1]) if getattr(inputs, "ndim", 0) == 2 or embeds else None
    mask: Any = kwargs.get("attention_mask")
    prompt: list[int | None]  # None: the prompt's length is unknown (audio features)
    if getattr(mask, "ndim", 0) == 2 and mask.shape[0] == batch:
        prompt = [int(n) for n in mask.sum(dim=1).tolist()]
    else:
        prompt = [width] * batch
    beams = setting("num_beams") or 1
    per_prompt = setting("num_return_sequences") or 1
    prompt = [n for n in prompt for _ in range(per_prompt)]

    decoder_only = not getattr(getattr(model, "config", None), "is_encoder_decoder", False)
    start_len = width if decoder_only and beams == 1 else None
    max_new = setting("max_new_tokens")
    if max_new is None and setting("max_length") is not None:
        # A decoder-only model counts the prompt in max_length; an encoder-decoder its start token.
        max_new = setting("max_length") - (width if decoder_only and width is not None else 1)

    attributes: dict[str, Any] = {gen_ai.GEN_AI_REQUEST_STREAM: kwargs.get("streamer") is not None}
    if max_new is not None:
        attributes[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] = int(max_new)
    if per_prompt > 1:
        attributes[gen_ai.GEN_AI_REQUEST_CHOICE_COUNT] = int(per_prompt)
    if setting("do_sample"):  # greedy and beam search ignore the sampling settings
        for key, name in (
            (gen_ai.GEN_AI_REQUEST_TEMPERATURE, "temperature"),
            (gen_ai.GEN_AI_REQUEST_TOP_P, "top_p"),
            (gen_ai.GEN_AI_REQUEST_TOP_K, "top_k"),
        ):
            if setting(name) is not None:
                attributes[key] = setting(name)
    call_id = uuid.uuid4().hex
    ids = [f"{call_id}-{row}" for row in range(len(prompt))]
    now = time.monotonic()
    for request_id, tokens in zip(ids, prompt, strict=True):
        tracker.queued(request_id, ts=now, prompt_tokens=tokens, attributes=dict(attributes))
    tracker.scheduled(ids, ts=now)
    # Without a known limit, a row still generating at the end stopped at the library's default limit,
    # unless something else can stop single rows.
    ends_at_cap = max_new is None and not (user_criteria or setting("stop_strings") or setting("max_time"))
    return _StepObserver(tracker, ids, start_len, _token_set(setting("eos_token_id")), max_new, ends_at_cap)


def _wrap(original: Callable[..., Any], tracker: Any, state: dict[str, bool]) -> Callable[..., Any]:
    from transformers import StoppingCriteriaList

    params = list(inspect.signature(original).parameters)[1:]  # without self
    config_index = params.index("generation_config")
    criteria_index = params.index("stopping_criteria")

    @functools.wraps(original)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A generate() inside a traced one (the draft model of assisted decoding) is part of that request.
        if not state["active"] or getattr(_nesting, "inside", False):
            return original(self, *args, **kwargs)
        try:
            positional = len(args) > criteria_index
            user = (args[criteria_index] if positional else kwargs.get("stopping_criteria")) or []
            observer = _start(tracker, self, args, kwargs, config_index, bool(user))
        except Exception as exc:
            _log_once("could not start tracing a generate() call", exc)
            observer = None
        if observer is None:
            return original(self, *args, **kwargs)
        criteria = StoppingCriteriaList([*user, observer])
        if positional:
            args = (*args[:criteria_index], criteria, *args[criteria_index + 1 :])
        else:
            kwargs["stopping_criteria"] = criteria
        _nesting.inside = True
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            _close(observer, exc)
            raise
        finally:
            _nesting.inside = False
        _close(observer, None)
        return result

    generate._otel_llm_original = original  # type: ignore[attr-defined]
    return generate


def _close(observer: _StepObserver, error: BaseException | None) -> None:
    try:
        observer.close(error)
    except Exception as exc:
        _log_once("could not finish the requests of a generate() call", exc)


class TransformersInstrumentor:
    """Traces ``transformers.GenerationMixin.generate`` for every model in the process.

    The patch is process-wide, so the instrumented state is shared by all instances: a second
    ``instrument()`` does nothing, and ``uninstrument()`` puts the original function object back.
    """

    _lock = threading.Lock()
    _original: Callable[..., Any] | None = None
    _state: dict[str, bool] | None = None

    @property
    def is_instrumented(self) -> bool:
        return TransformersInstrumentor._original is not None

    def instrument(
        self,
        tracker: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        model: str | None = None,
    ) -> None:
        """Start tracing. Pass a ``RequestTracker`` of your own, or providers (global ones when omitted)."""
        if tracker is not None and (tracer_provider is not None or meter_provider is not None or model):
            raise ValueError("pass either tracker= or tracer_provider=/meter_provider=/model=, not both")
        if tracker is not None and not callable(getattr(tracker, "tokens", None)):
            raise TypeError(f"tracker= takes an otel_llm.RequestTracker, got {type(tracker).__name__}")
        from transformers import GenerationMixin

        with TransformersInstrumentor._lock:
            if TransformersInstrumentor._original is not None:
                return
            if tracker is None:
                from otel_llm import RequestTracker

                tracker = RequestTracker(
                    tracer_provider=tracer_provider,
                    meter_provider=meter_provider,
                    model=model,
                    provider_name=_PROVIDER_NAME,
                )
            original = GenerationMixin.__dict__["generate"]
            state = {"active": True}
            GenerationMixin.generate = _wrap(original, tracker, state)  # type: ignore[method-assign]
            TransformersInstrumentor._original, TransformersInstrumentor._state = original, state

    def uninstrument(self) -> None:
        """Stop tracing and restore the original ``generate`` (a no-op when not instrumented)."""
        from transformers import GenerationMixin

        with TransformersInstrumentor._lock:
            original, state = TransformersInstrumentor._original, TransformersInstrumentor._state
            if original is None or state is None:
                return
            state["active"] = False  # also silences our wrapper if someone wrapped it in turn
            if getattr(GenerationMixin.__dict__.get("generate"), "_otel_llm_original", None) is original:
                GenerationMixin.generate = original  # type: ignore[method-assign]
            else:
                _log_once("generate() was wrapped again after instrument(); left in place, tracing off")
            TransformersInstrumentor._original = TransformersInstrumentor._state = None
