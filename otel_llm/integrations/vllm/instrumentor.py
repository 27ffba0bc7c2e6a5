"""VLLMInstrumentor: switch the adapter on inside a running vLLM V1 without touching vLLM's source.

It wraps three methods of the frontend's ``OutputProcessor`` class (``add_request``,
``process_outputs``, ``abort_requests``) and the engine core ``Scheduler.__init__`` (to turn on stats
logging, without which the engine core sends no request events). ``uninstrument()`` puts the original
functions back, so the classes are exactly as they were. vLLM is imported only when ``instrument()``
runs; when vLLM is absent, or lacks a class or method this integration needs, ``instrument()`` logs one
warning and does nothing. A wrapper never raises because of telemetry: the adapter's errors are logged
once and vLLM's own call always runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from otel_llm.integrations.vllm.adapter import VLLMAdapter

_log = logging.getLogger(__name__)

_OUTPUT_PROCESSOR = ("vllm.v1.engine.output_processor", "OutputProcessor")
_SCHEDULER = ("vllm.v1.core.sched.scheduler", "Scheduler")
_EVENT_TYPES = ("vllm.v1.engine", "EngineCoreEventType")
_WRAPPED_METHODS = ("add_request", "process_outputs", "abort_requests")
_EVENT_NAMES = ("QUEUED", "SCHEDULED", "PREEMPTED")
# Keyword arguments that opentelemetry-instrument passes to every instrumentor; not tracker options.
_LOADER_KWARGS = ("raise_exception_on_conflict", "skip_dep_check")
_PROVIDER_NAME = "vllm"

_warned: set[str] = set()  # messages already logged once in this process


def _warn_once(message: str, *args: Any, exc_info: bool = False) -> None:
    if message not in _warned:
        _warned.add(message)
        _log.warning(message, *args, exc_info=exc_info)


def _guarded(what: str, call: Callable[..., None], *args: Any) -> None:
    """Run one adapter step; telemetry trouble is logged once and never reaches vLLM."""
    try:
        call(*args)
    except Exception:
        _warn_once("otel_llm: vLLM integration failed in %s; vLLM is unaffected", what, exc_info=True)


class _Patch:
    """The classes and original functions of one active instrumentation."""

    def __init__(self, processor_cls: type, scheduler_cls: type | None) -> None:
        self.processor_cls = processor_cls
        self.scheduler_cls = scheduler_cls
        # name -> the function found in the class's own __dict__ (None: it was inherited)
        self.originals: dict[tuple[type, str], Any] = {}

    def replace(self, cls: type, name: str, wrapper: Callable[..., Any]) -> None:
        self.originals[(cls, name)] = cls.__dict__.get(name)
        setattr(cls, name, wrapper)

    def restore(self) -> None:
        for (cls, name), original in self.originals.items():
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self.originals.clear()


class VLLMInstrumentor:
    """Instruments vLLM V1's frontend so every request becomes an otel_llm trace and metrics.

    ``instrument(tracker=None, **tracker_options)``: use ``tracker``, or create a RequestTracker with
    ``tracker_options`` (``tracer_provider``, ``meter_provider``, ``model``, ...) when the first request
    arrives. The instrumentation is process-wide (it patches classes); a second ``instrument()`` while
    active does nothing.
    """

    # Class-level: the patch is process-wide, so every instance sees and controls the same state.
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _patch: ClassVar[_Patch | None] = None
    _tracker: ClassVar[Any] = None
    _tracker_options: ClassVar[dict[str, Any]] = {}
    _adapters: ClassVar[weakref.WeakKeyDictionary[Any, VLLMAdapter]] = weakref.WeakKeyDictionary()

    @property
    def is_instrumented(self) -> bool:
        return VLLMInstrumentor._patch is not None

    def instrument(self, tracker: Any = None, **tracker_options: Any) -> None:
        for key in _LOADER_KWARGS:
            tracker_options.pop(key, None)
        with VLLMInstrumentor._lock:
            if VLLMInstrumentor._patch is not None:
                _log.debug("otel_llm: vLLM is already instrumented")
                return
            found = _find_vllm()
            if found is None:
                return
            processor_cls, scheduler_cls = found
            options = {"provider_name": _PROVIDER_NAME, **tracker_options}
            VLLMInstrumentor._tracker = tracker
            VLLMInstrumentor._tracker_options = options
            VLLMInstrumentor._adapters = weakref.WeakKeyDictionary()
            patch = _Patch(processor_cls, scheduler_cls)
            for name in _WRAPPED_METHODS:
                patch.replace(processor_cls, name, _WRAPPERS[name](getattr(processor_cls, name)))
            if scheduler_cls is not None:
                patch.replace(scheduler_cls, "__init__", _stats_on(scheduler_cls.__init__))
            VLLMInstrumentor._patch = patch

    def uninstrument(self) -> None:
        with VLLMInstrumentor._lock:
            patch, VLLMInstrumentor._patch = VLLMInstrumentor._patch, None
            if patch is not None:
                patch.restore()
            VLLMInstrumentor._adapters = weakref.WeakKeyDictionary()
            VLLMInstrumentor._tracker = None

    @classmethod
    def _adapter(cls, processor: Any) -> VLLMAdapter:
        adapter = cls._adapters.get(processor)
        if adapter is None:
            with cls._lock:
                if cls._tracker is None:
                    from otel_llm import RequestTracker  # the tracker is built only where requests arrive

                    cls._tracker = RequestTracker(**cls._tracker_options)
                adapter = cls._adapters.setdefault(processor, VLLMAdapter(cls._tracker))
        return adapter


def _find_vllm() -> tuple[type, type | None] | None:
    """vLLM's OutputProcessor (and Scheduler) when they have what we wrap; else warn once, None."""
    spec = importlib.util.find_spec("vllm")
    # A namespace package (no origin) is some folder named vllm on sys.path, such as a test folder.
    if spec is None or spec.origin is None:
        _warn_once("otel_llm: vLLM is not installed; the vLLM integration does nothing")
        return None
    try:
        processor_cls = getattr(importlib.import_module(_OUTPUT_PROCESSOR[0]), _OUTPUT_PROCESSOR[1])
        event_types = getattr(importlib.import_module(_EVENT_TYPES[0]), _EVENT_TYPES[1])
        missing = [n for n in _WRAPPED_METHODS if not callable(getattr(processor_cls, n, None))]
        missing += [f"{_EVENT_TYPES[1]}.{n}" for n in _EVENT_NAMES if not hasattr(event_types, n)]
    except Exception as exc:  # ImportError, AttributeError, or whatever an unknown vLLM raises
        missing = [f"{type(exc).__name__}: {exc}"]
    if missing:
        _warn_once(
            "otel_llm: this vLLM version lacks %s; the vLLM integration does nothing", ", ".join(missing)
        )
        return None
    try:
        scheduler_cls = getattr(importlib.import_module(_SCHEDULER[0]), _SCHEDULER[1])
        if "log_stats" not in inspect.signature(scheduler_cls.__init__).parameters:
            scheduler_cls = None
    except Exception:
        scheduler_cls = None
    if scheduler_cls is None:
        _warn_once(
            "otel_llm: cannot turn on vLLM's engine stats logging; queue and preemption events "
            "appear only when vLLM logs stats"
        )
    return processor_cls, scheduler_cls


def _stats_on(original: Callable[..., None]) -> Callable[..., None]:
    """Scheduler.__init__ with ``log_stats=True``: only then does it record request events."""
    signature = inspect.signature(original)

    def __init__(*args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["log_stats"] = True
            args, kwargs = bound.args, bound.kwargs
        except TypeError:
            pass  # let vLLM report its own argument error
        original(*args, **kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _wrap_add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        _guarded("add_request", lambda: VLLMInstrumentor._adapter(self).request_added(request))
        return result

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _wrap_process_outputs(original: Callable[..., Any]) -> Callable[..., Any]:
    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        batch_ts = args[0] if args else kwargs.get("engine_core_timestamp")
        adapter = VLLMInstrumentor._adapters.get(self)
        if adapter is not None:
            # Before vLLM: it may trim tokens after a stop string; vLLM counts them untrimmed too.
            _guarded("process_outputs", adapter.outputs, engine_core_outputs, batch_ts)
        result = original(self, engine_core_outputs, *args, **kwargs)
        if adapter is not None:
            _guarded("process_outputs", adapter.settle, engine_core_outputs, _open_ids(self))
        return result

    process_outputs.__wrapped__ = original  # type: ignore[attr-defined]
    return process_outputs


def _wrap_abort_requests(original: Callable[..., Any]) -> Callable[..., Any]:
    def abort_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        adapter = VLLMInstrumentor._adapters.get(self)
        if adapter is not None:
            _guarded("abort_requests", adapter.abandoned, _open_ids(self))
        return result

    abort_requests.__wrapped__ = original  # type: ignore[attr-defined]
    return abort_requests


def _open_ids(processor: Any) -> Any:
    """The processor's open request ids (``request_states``); empty if this vLLM keeps none."""
    states = getattr(processor, "request_states", None)
    return states if states is not None else ()


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "add_request": _wrap_add_request,
    "process_outputs": _wrap_process_outputs,
    "abort_requests": _wrap_abort_requests,
}
