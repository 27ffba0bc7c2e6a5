"""SGLangInstrumentor: switch the adapter on inside SGLang's processes without touching its source.

Scheduler process (where requests live): wraps ``Scheduler._add_request_to_queue`` and
``Scheduler.get_new_batch_prefill`` (after SGLang's call), ``SchedulerOutputStreamer.stream_output``
(before it), ``Scheduler.run_batch`` and ``Scheduler.process_batch_result`` (what each batch computed,
reported before its result is processed) and ``Scheduler.on_idle``: once the scheduler has drained,
what finished since the last flush is flushed from a background thread (SGLang ends its scheduler
processes with SIGKILL, so anything still buffered at shutdown would be lost). Tokenizer process
(SGLang's HTTP server or ``sglang.Engine``): wraps ``TokenizerManager._init_req_state`` and
``APIServerReqTimeStats.__getstate__``, so a caller's W3C ``traceparent`` / ``tracestate`` and the
request's arrival stamp travel to the scheduler inside the time stats SGLang already sends;
``SchedulerReqTimeStats`` gets one class attribute so that its ``new_from_obj`` copies them.
``uninstrument()`` puts every original back.

SGLang is imported only when ``instrument()`` runs and is installed; when a class or method this
integration needs is missing, ``instrument()`` logs one warning and does nothing. A wrapper never raises
because of telemetry: trouble is logged once and SGLang's own call always runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from otel_llm.integrations import import_hook, versions
from otel_llm.integrations.patching import Patch, guarded, warn_once
from otel_llm.integrations.sglang.adapter import CARRIED, SGLangAdapter

__all__ = ["SGLangInstrumentor"]

_log = logging.getLogger(__name__)

_SCHEDULER = ("sglang.srt.managers.scheduler", "Scheduler")
_STREAMER = ("sglang.srt.managers.scheduler_components.output_streamer", "SchedulerOutputStreamer")
_TOKENIZER = ("sglang.srt.managers.tokenizer_manager", "TokenizerManager")
_TIME_STATS = ("sglang.srt.observability.req_time_stats", "APIServerReqTimeStats", "SchedulerReqTimeStats")
_TRACE_HEADERS = ("traceparent", "tracestate")
# Keyword arguments that opentelemetry-instrument passes to every instrumentor; not tracker options.
_LOADER_KWARGS = ("raise_exception_on_conflict", "skip_dep_check")
_PROVIDER_NAME = "sglang"
_UNSET_PROVIDERS = ("ProxyTracerProvider", "_ProxyMeterProvider", "NoOpTracerProvider", "NoOpMeterProvider")


def _guarded(what: str, call: Callable[..., None], *args: Any) -> None:
    """Run one adapter step; telemetry trouble is logged once and never reaches SGLang."""
    guarded(_log, "SGLang", what, call, *args)


def _warn_once(message: str, *args: Any, exc_info: bool = False) -> None:
    warn_once(_log, message, *args, exc_info=exc_info)


class SGLangInstrumentor:
    """Instruments SGLang so every request becomes an otel_llm trace and metrics.

    ``instrument(tracker=None, **tracker_options)``: use ``tracker``, or create a RequestTracker with
    ``tracker_options`` (``tracer_provider``, ``meter_provider``, ``model``, ...) in the scheduler process
    when its first request is queued. Without providers, the global ones are used where something set
    them (``opentelemetry-instrument``, SGLang's ``--enable-trace``), else ``otel_llm.configure()``'s
    (OTLP from ``OTEL_*`` variables, else OTLP JSON files). The model defaults to SGLang's
    ``served_model_name``. Process-wide; a second ``instrument()`` while active does nothing.
    """

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _patch: ClassVar[Patch | None] = None
    _waiting: ClassVar[object | None] = None  # the import hook, while SGLang is installed but not imported
    _tracker: ClassVar[Any] = None
    _tracker_options: ClassVar[dict[str, Any]] = {}
    _adapter: ClassVar[SGLangAdapter | None] = None
    _telemetry: ClassVar[Any] = None  # otel_llm.configure()'s handle, when this integration made one

    @property
    def is_instrumented(self) -> bool:
        return SGLangInstrumentor._patch is not None

    def instrumentation_dependencies(self) -> tuple[str, ...]:
        return (versions.SGLANG.requirement,)  # the tested range, stated in otel_llm.integrations.versions

    def instrument(self, tracker: Any = None, **tracker_options: Any) -> None:
        # opentelemetry-instrument's loader passes these; it loads every instrumentor of a distribution
        # whose `instruments-any` extra is met, so a vLLM-only environment loads this one too.
        by_loader = any([tracker_options.pop(key, None) is not None for key in _LOADER_KWARGS])
        versions.version_check()  # a bad OTEL_LLM_VERSION_CHECK fails here, in the caller
        with SGLangInstrumentor._lock:
            if SGLangInstrumentor._patch is not None or SGLangInstrumentor._waiting is not None:
                _log.debug("otel_llm: SGLang is already instrumented")
                return
            SGLangInstrumentor._tracker = tracker
            SGLangInstrumentor._tracker_options = {"provider_name": _PROVIDER_NAME, **tracker_options}
            SGLangInstrumentor._adapter = None
            if "sglang" not in sys.modules:
                spec = importlib.util.find_spec("sglang")
                if spec is not None and spec.origin is not None:
                    # Installed, not imported: patch when (if ever) this process imports it, so a process
                    # started by opentelemetry-instrument that never uses SGLang pays nothing for it.
                    SGLangInstrumentor._waiting = import_hook.when_imported("sglang", _patch_when_imported)
                    return
                if by_loader:
                    _log.debug("otel_llm: SGLang is not installed; the SGLang integration does nothing")
                    return
            _patch_sglang()

    def uninstrument(self) -> None:
        with SGLangInstrumentor._lock:
            waiting, SGLangInstrumentor._waiting = SGLangInstrumentor._waiting, None
            if waiting is not None:
                import_hook.remove(waiting)
            patch, SGLangInstrumentor._patch = SGLangInstrumentor._patch, None
            if patch is not None:
                patch.restore()
            SGLangInstrumentor._adapter = None
            SGLangInstrumentor._tracker = None

    @classmethod
    def _adapter_for(cls, scheduler: Any) -> SGLangAdapter | None:
        """This process's adapter, built on the first request; None on ranks that do not report."""
        adapter = cls._adapter
        if adapter is not None:
            return adapter
        if getattr(scheduler, "tp_rank", 0) != 0:
            return None  # every tensor-parallel rank schedules the same requests: rank 0 reports
        with cls._lock:
            if cls._adapter is None:
                tracker = cls._tracker
                if tracker is None:
                    tracker = cls._tracker = _build_tracker(scheduler, dict(cls._tracker_options))
                cls._adapter = SGLangAdapter(tracker)
            return cls._adapter


def _build_tracker(scheduler: Any, options: dict[str, Any]) -> Any:
    """A RequestTracker for this scheduler process, on the providers the class docstring describes."""
    from opentelemetry import metrics, trace

    from otel_llm import RequestTracker

    if options.get("model") is None:
        name = getattr(getattr(scheduler, "server_args", None), "served_model_name", None)
        options["model"] = name if isinstance(name, str) else None
    need_traces = options.get("tracer_provider") is None and _unset(trace.get_tracer_provider())
    need_metrics = options.get("meter_provider") is None and _unset(metrics.get_meter_provider())
    if need_traces or need_metrics:
        from otel_llm import configure

        # Not global: SGLang's --enable-trace or the user may own the globals of this process.
        telemetry = SGLangInstrumentor._telemetry = configure(set_global=False, service_name="sglang")
        if need_traces:
            options["tracer_provider"] = telemetry.tracer_provider
        if need_metrics:
            options["meter_provider"] = telemetry.meter_provider
    return RequestTracker(**options)


def _unset(provider: Any) -> bool:
    return type(provider).__name__ in _UNSET_PROVIDERS


def _patch_when_imported() -> None:
    """Called right after ``import sglang`` completes, when instrument() came first."""
    with SGLangInstrumentor._lock:
        SGLangInstrumentor._waiting = None
        try:
            _patch_sglang()
        except Exception:  # never break `import sglang`
            _warn_once("otel_llm: could not instrument SGLang; SGLang is unaffected", exc_info=True)


def _patch_sglang() -> None:
    """Wrap SGLang's scheduler and tokenizer methods (caller holds SGLangInstrumentor._lock)."""
    found = _find_sglang()
    if found is None or not versions.SGLANG.allows(_log):  # outside the tested range: one warning
        return
    scheduler, streamer, tokenizer, api_stats, sched_stats = found
    patch = Patch()
    patch.replace(scheduler, "_add_request_to_queue", _wrap_add(scheduler._add_request_to_queue))
    patch.replace(scheduler, "get_new_batch_prefill", _wrap_prefill(scheduler.get_new_batch_prefill))
    patch.replace(scheduler, "on_idle", _wrap_idle(scheduler.on_idle))
    patch.replace(streamer, "stream_output", _wrap_stream(streamer.stream_output))
    patch.replace(tokenizer, "_init_req_state", _wrap_init_state(tokenizer._init_req_state))
    patch.replace(api_stats, "__getstate__", _wrap_getstate(api_stats.__getstate__))
    # new_from_obj copies only attributes the scheduler's stats class has: give it ours.
    patch.replace(sched_stats, CARRIED, None)
    # What each batch computed (the tracker's batch(): stalls explained); optional, as neither is needed
    # for the requests' own spans.
    if callable(getattr(scheduler, "run_batch", None)) and callable(
        getattr(scheduler, "process_batch_result", None)
    ):
        patch.replace(scheduler, "run_batch", _wrap_run(scheduler.run_batch))
        patch.replace(scheduler, "process_batch_result", _wrap_result(scheduler.process_batch_result))
    else:
        _warn_once(
            "otel_llm: this SGLang's Scheduler lacks run_batch / process_batch_result; requests' stalls "
            "are not explained"
        )
    SGLangInstrumentor._patch = patch


def _find_sglang() -> tuple[Any, Any, Any, Any, Any] | None:
    """SGLang's classes when they have what we wrap; else warn once and return None (``Any``: their
    methods are looked up by name, checked here at run time)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:  # no origin: a folder named sglang, such as a test folder
        _warn_once("otel_llm: SGLang is not installed; the SGLang integration does nothing")
        return None
    try:
        scheduler = getattr(importlib.import_module(_SCHEDULER[0]), _SCHEDULER[1])
        streamer = getattr(importlib.import_module(_STREAMER[0]), _STREAMER[1])
        tokenizer = getattr(importlib.import_module(_TOKENIZER[0]), _TOKENIZER[1])
        stats_module = importlib.import_module(_TIME_STATS[0])
        api_stats = getattr(stats_module, _TIME_STATS[1])
        sched_stats = getattr(stats_module, _TIME_STATS[2])
        missing = [
            f"{cls.__name__}.{name}"
            for cls, name in (
                (scheduler, "_add_request_to_queue"),
                (scheduler, "get_new_batch_prefill"),
                (scheduler, "on_idle"),
                (streamer, "stream_output"),
                (tokenizer, "_init_req_state"),
                (sched_stats, "new_from_obj"),
            )
            if not callable(getattr(cls, name, None))
        ]
    except Exception as exc:  # ImportError, AttributeError, or whatever an unknown SGLang raises
        missing = [f"{type(exc).__name__}: {exc}"]
    if missing:
        _warn_once("otel_llm: this SGLang lacks %s; the SGLang integration does nothing", ", ".join(missing))
        return None
    return scheduler, streamer, tokenizer, api_stats, sched_stats


def _wrap_add(original: Callable[..., Any]) -> Callable[..., Any]:
    def _add_request_to_queue(self: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, req, *args, **kwargs)
        adapter = SGLangInstrumentor._adapter or _guarded_adapter(self)
        if adapter is not None:
            _guarded("_add_request_to_queue", adapter.requeued, req)
        return result

    _add_request_to_queue.__wrapped__ = original  # type: ignore[attr-defined]
    return _add_request_to_queue


def _guarded_adapter(scheduler: Any) -> SGLangAdapter | None:
    try:
        return SGLangInstrumentor._adapter_for(scheduler)
    except Exception:
        _warn_once("otel_llm: could not start the SGLang integration; SGLang is unaffected", exc_info=True)
        return None


def _admitted(adapter: SGLangAdapter, plan: Any) -> None:
    # 0.5.23 returns a NextBatchPlan (the new prefill batch in batch_to_run); older ones the batch itself.
    batch = getattr(plan, "batch_to_run", plan)
    if batch is not None:
        adapter.admitted(batch.reqs)


def _wrap_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_new_batch_prefill(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = original(self, *args, **kwargs)
        adapter = SGLangInstrumentor._adapter
        if adapter is not None and plan is not None:
            _guarded("get_new_batch_prefill", _admitted, adapter, plan)
        return plan

    get_new_batch_prefill.__wrapped__ = original  # type: ignore[attr-defined]
    return get_new_batch_prefill


# Launch times (monotonic seconds) of the batches whose results are not processed yet, oldest first:
# SGLang processes results in launch order, one per run_batch (the overlap scheduler keeps one in
# flight). Bounded: a launch whose result never comes must not shift every later one for long.
_launched: deque[float] = deque(maxlen=4)


def _wrap_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if SGLangInstrumentor._adapter is not None:
            _launched.append(time.monotonic())
        return original(self, batch, *args, **kwargs)

    run_batch.__wrapped__ = original  # type: ignore[attr-defined]
    return run_batch


def _wrap_result(original: Callable[..., Any]) -> Callable[..., Any]:
    def process_batch_result(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = SGLangInstrumentor._adapter
        if adapter is not None and _launched:
            # Before SGLang: its result processing streams the batch's tokens (the tracker's tokens()).
            _guarded("process_batch_result", adapter.stepped, batch, _launched.popleft())
        return original(self, batch, *args, **kwargs)

    process_batch_result.__wrapped__ = original  # type: ignore[attr-defined]
    return process_batch_result


_flushing = threading.Lock()  # at most one flush thread at a time


def _wrap_idle(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_idle(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        adapter = SGLangInstrumentor._adapter
        if adapter is not None and adapter.unflushed and not adapter.in_flight and _flushing.acquire(False):
            adapter.unflushed = 0
            flush = threading.Thread(target=_flush, args=(adapter.tracker,), name="otel_llm", daemon=True)
            flush.start()
        return result

    on_idle.__wrapped__ = original  # type: ignore[attr-defined]
    return on_idle


def _flush(tracker: Any) -> None:
    try:
        tracker.force_flush(10_000)
    except Exception:
        _warn_once("otel_llm: flushing SGLang's telemetry failed", exc_info=True)
    finally:
        _flushing.release()


def _wrap_stream(original: Callable[..., Any]) -> Callable[..., Any]:
    def stream_output(self: Any, reqs: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = SGLangInstrumentor._adapter
        if adapter is not None:
            # Before SGLang: it marks a finished request as streamed (finished_output) on the way out.
            skip = kwargs.get("skip_req", args[1] if len(args) > 1 else None)
            _guarded("stream_output", adapter.streamed, [r for r in reqs if r is not skip])
        return original(self, reqs, *args, **kwargs)

    stream_output.__wrapped__ = original  # type: ignore[attr-defined]
    return stream_output


def _wrap_init_state(original: Callable[..., Any]) -> Callable[..., Any]:
    def _init_req_state(self: Any, obj: Any, request: Any = None, *args: Any, **kwargs: Any) -> Any:
        result = original(self, obj, request, *args, **kwargs)
        _guarded("_init_req_state", _remember_carrier, self, obj, request)
        return result

    _init_req_state.__wrapped__ = original  # type: ignore[attr-defined]
    return _init_req_state


def _remember_carrier(tokenizer: Any, obj: Any, request: Any) -> None:
    """Keep the caller's W3C headers on each new request's tokenizer-side time stats."""
    headers = getattr(obj, "external_trace_header", None)
    if not headers and request is not None:
        headers = getattr(request, "headers", None)
    carrier = {k: headers[k] for k in _TRACE_HEADERS if headers and k in headers} if headers else {}
    rids = obj.rid if isinstance(obj.rid, list) else [obj.rid]
    states = tokenizer.rid_to_state
    for rid in rids:
        state = states.get(rid)
        if state is not None:
            setattr(state.time_stats, CARRIED, {"carrier": carrier or None})


def _wrap_getstate(original: Callable[..., Any]) -> Callable[..., Any]:
    def __getstate__(self: Any) -> Any:
        state = original(self)
        try:
            carried = dict(getattr(self, CARRIED, None) or {})
            carried["created"] = float(getattr(self, "created_time", 0.0) or 0.0)
            state[CARRIED] = carried
        except Exception:
            _warn_once("otel_llm: could not pass trace context to the SGLang scheduler", exc_info=True)
        return state

    __getstate__.__wrapped__ = original  # type: ignore[attr-defined]
    return __getstate__
