"""VLLMInstrumentor: switch the adapter on inside a running vLLM V1 without touching vLLM's source.

It wraps three methods of the frontend's ``OutputProcessor`` class (``add_request``,
``process_outputs``, ``abort_requests``) and, where vLLM has it, a fourth (``update_scheduler_stats``,
which receives the engine's ``SchedulerStats`` once per step) and a fifth (``do_tracing``, where vLLM's own
tracing starts its ``llm_request`` span: given our ``llm.request`` as its parent, so both are one trace),
the engine core ``Scheduler.__init__`` (to
turn on stats logging, without which the engine core sends no request events and no ``SchedulerStats``)
and ``Scheduler.schedule`` (only read: what a rescheduling found cached, kept for a frontend in the same
process, see ``rescheduling``),
and ``__init__`` of ``LLMEngine`` and ``AsyncLLM`` (to read the served model name from vLLM's model
config). ``uninstrument()`` puts the original functions back, so the classes are exactly as they were.

Cost where vLLM is never used: the ``opentelemetry_instrumentor`` entry points are declared with an
``instruments-any`` extra (vLLM, SGLang), so ``opentelemetry-instrument`` skips them from package metadata
alone when neither is installed (and where only SGLang is, this one returns at once, quietly); when
vLLM is installed but not imported yet, ``instrument()`` only places an import hook and
patches once vLLM is imported. When vLLM lacks a class or method this integration needs,
``instrument()`` logs one warning and does nothing. A wrapper never raises because of telemetry: the
adapter's errors are logged once and vLLM's own call always runs.
"""

from __future__ import annotations

import contextvars
import importlib
import importlib.util
import logging
import math
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from otel_llm import semconv as sc
from otel_llm.integrations import import_hook
from otel_llm.integrations.patching import Patch, guarded, warn_once
from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.compositions import recomputing
from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures, FrontendFigures, frontend_key
from otel_llm.integrations.vllm.rescheduling import Reschedulings, rescheduled
from otel_llm.server_attributes import server_attributes

if TYPE_CHECKING:
    import inspect

_log = logging.getLogger(__name__)

_OUTPUT_PROCESSOR = ("vllm.v1.engine.output_processor", "OutputProcessor")
_SCHEDULER = ("vllm.v1.core.sched.scheduler", "Scheduler")
_EVENT_TYPES = ("vllm.v1.engine", "EngineCoreEventType")
_WRAPPED_METHODS = ("add_request", "process_outputs", "abort_requests")
# Optional: vLLM's engine loops (LLMEngine.step, AsyncLLM's output handler) call it once per engine step
# with that step's SchedulerStats, whether or not the frontend logs stats itself. Without it (older vLLM)
# the integration works, minus the engine's own state.
_STATS_METHOD = "update_scheduler_stats"
# Optional: where vLLM's own tracing (--otlp-traces-endpoint) starts its ``llm_request`` span of a finished
# request, from the trace headers of that request's last output. Wrapped so that span is a child of ours.
_TRACING_METHOD = "do_tracing"
_EVENT_NAMES = ("QUEUED", "SCHEDULED", "PREEMPTED")
# Engines whose __init__ builds the frontend's OutputProcessor next to a model config.
_ENGINES = (("vllm.v1.engine.llm_engine", "LLMEngine"), ("vllm.v1.engine.async_llm", "AsyncLLM"))
# Optional: vLLM's API server (`vllm serve`) passes its engine client, its bound socket and its arguments
# here before it serves: what the GenAI server attributes need. Imported by the API server only.
_SERVE = ("vllm.entrypoints.launchers.api_server.entry", "build_and_serve")
_INSTRUMENTS = ("vllm >= 0.11",)  # also in the `instruments-any` extra in pyproject.toml
# OTEL_LLM_VLLM_CONFIGURE=1: build otel_llm's providers from the OTEL_* variables (configure()) in the
# process that serves requests, for `vllm serve` without the opentelemetry-instrument wrapper.
ENV_CONFIGURE = "OTEL_LLM_VLLM_CONFIGURE"
# Keyword arguments that opentelemetry-instrument passes to every instrumentor; not tracker options.
_LOADER_KWARGS = ("raise_exception_on_conflict", "skip_dep_check")
_PROVIDER_NAME = "vllm"

# The caller's W3C headers of the request being added on this task: AsyncLLM.add_request drops them
# before they reach the engine request unless vLLM's own tracing is on (--otlp-traces-endpoint).
_CALLER_HEADERS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "otel_llm_vllm_caller_headers", default=None
)


def _guarded(what: str, call: Callable[..., None], *args: Any) -> None:
    """Run one adapter step; telemetry trouble is logged once and never reaches vLLM."""
    guarded(_log, "vLLM", what, call, *args)


def _warn_once(message: str, *args: Any, exc_info: bool = False) -> None:
    warn_once(_log, message, *args, exc_info=exc_info)


class VLLMInstrumentor:
    """Instruments vLLM V1's frontend so every request becomes an otel_llm trace and metrics.

    ``instrument(tracker=None, **tracker_options)``: use ``tracker`` for every request, or create
    RequestTrackers with ``tracker_options`` (``tracer_provider``, ``meter_provider``, ``model``, ...)
    when the first request arrives, one per served model and endpoint (``gen_ai.operation.name`` is
    ``chat`` for ``/v1/chat/completions``, else ``text_completion``); ``model`` defaults to vLLM's served
    model name. The instrumentation is process-wide (it patches classes); a second ``instrument()``
    while active does nothing. Follows the contrib ``BaseInstrumentor`` protocol
    (``instrumentation_dependencies``, ``instrument(**kwargs)``, ``uninstrument()``) without depending
    on opentelemetry-instrumentation.
    """

    # Class-level: the patch is process-wide, so every instance sees and controls the same state.
    _lock: ClassVar[threading.RLock] = threading.RLock()
    _patch: ClassVar[Patch | None] = None
    _waiting: ClassVar[object | None] = None  # the import hook while vLLM is not imported yet
    _tracker: ClassVar[Any] = None
    _trackers: ClassVar[dict[tuple[str | None, str, str], Any]] = {}  # (model, operation, role)
    _tracker_options: ClassVar[dict[str, Any]] = {}
    _adapters: ClassVar[weakref.WeakKeyDictionary[Any, VLLMAdapter]] = weakref.WeakKeyDictionary()
    _schedulers: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()  # engine cores in this process
    # What those engine cores found cached when they rescheduled preempted requests, for the adapters.
    _reschedulings: ClassVar[Reschedulings] = Reschedulings()
    # In an engine core whose frontend is another process: sends it those figures (engine_core_figures).
    _engine_core_figures: ClassVar[EngineCoreFigures | None] = None
    # In a frontend: the sockets its engine cores send figures to, by (pid, client index).
    _frontend_figures: ClassVar[dict[tuple[int, int], FrontendFigures]] = {}
    telemetry: ClassVar[Any] = None  # the Telemetry of OTEL_LLM_VLLM_CONFIGURE=1, once built
    # Under `vllm serve`: server.address / server.port as the API server bound them (None: no API server
    # in this process, e.g. LLM.generate(), so no server attribute and no gen_ai.response.model).
    _server: ClassVar[dict[str, str | int] | None] = None
    _lora: ClassVar[bool] = False  # vllm serve --enable-lora: answers may name an adapter, not the model
    _serve_waiting: ClassVar[object | None] = None  # the import hook while the API server is not imported

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirements on the instrumented library, as contrib instrumentors declare them."""
        return _INSTRUMENTS

    @property
    def is_instrumented(self) -> bool:
        """True once vLLM's classes are patched (False while waiting for vLLM to be imported)."""
        return VLLMInstrumentor._patch is not None

    def instrument(self, tracker: Any = None, **tracker_options: Any) -> None:
        # opentelemetry-instrument's loader passes these; it loads every instrumentor of a distribution
        # whose `instruments-any` extra is met, so an SGLang-only environment loads this one too.
        by_loader = any([tracker_options.pop(key, None) is not None for key in _LOADER_KWARGS])
        with VLLMInstrumentor._lock:
            if VLLMInstrumentor._patch is not None or VLLMInstrumentor._waiting is not None:
                _log.debug("otel_llm: vLLM is already instrumented")
                return
            VLLMInstrumentor._tracker = tracker
            VLLMInstrumentor._tracker_options = {"provider_name": _PROVIDER_NAME, **tracker_options}
            VLLMInstrumentor._trackers = {}
            VLLMInstrumentor._adapters = weakref.WeakKeyDictionary()
            VLLMInstrumentor._reschedulings = Reschedulings()
            VLLMInstrumentor._engine_core_figures = EngineCoreFigures()
            if "vllm" in sys.modules:
                _patch_vllm()
                return
            spec = importlib.util.find_spec("vllm")
            # A namespace package (no origin) is some folder named vllm on sys.path, such as a test folder.
            if spec is None or spec.origin is None:
                if by_loader:
                    _log.debug("otel_llm: vLLM is not installed; the vLLM integration does nothing")
                else:
                    _warn_once("otel_llm: vLLM is not installed; the vLLM integration does nothing")
                return
            # Installed, not imported: patch when (if ever) this process imports it.
            VLLMInstrumentor._waiting = import_hook.when_imported("vllm", _patch_vllm)

    def uninstrument(self) -> None:
        with VLLMInstrumentor._lock:
            waiting, VLLMInstrumentor._waiting = VLLMInstrumentor._waiting, None
            if waiting is not None:
                import_hook.remove(waiting)
            serve_waiting, VLLMInstrumentor._serve_waiting = VLLMInstrumentor._serve_waiting, None
            if serve_waiting is not None:
                import_hook.remove(serve_waiting)
            patch, VLLMInstrumentor._patch = VLLMInstrumentor._patch, None
            if patch is not None:
                patch.restore()
            VLLMInstrumentor._server, VLLMInstrumentor._lora = None, False
            VLLMInstrumentor._adapters = weakref.WeakKeyDictionary()
            VLLMInstrumentor._reschedulings = Reschedulings()
            VLLMInstrumentor._engine_core_figures = None
            for figures in VLLMInstrumentor._frontend_figures.values():
                figures.close()
            VLLMInstrumentor._frontend_figures = {}
            VLLMInstrumentor._tracker = None
            VLLMInstrumentor._trackers = {}

    @classmethod
    def _adapter(cls, processor: Any) -> VLLMAdapter:
        adapter = cls._adapters.get(processor)
        if adapter is None:
            with cls._lock:
                adapter = cls._adapters.setdefault(
                    processor, VLLMAdapter(cls._tracker_for, reschedulings=cls._reschedulings)
                )
                if cls._frontend_figures and not cls._schedulers:
                    adapter.pull_steps = _pull_engine_core_steps
        return adapter

    @classmethod
    def _tracker_for(cls, model: str | None, operation: str, role: str = sc.ROLE_BOTH) -> Any:
        """The tracker for one served model, endpoint and disaggregated role, built where the first such
        request arrives.

        The role is the request's (its ``kv_transfer_params``), so a ``kv_both`` instance that serves
        prefill-only, decode-only and plain requests has up to three trackers per model and endpoint:
        ``llm.role`` is a tracker-wide attribute of every span and metric point (low-cardinality, like
        the model), and a tracker's role decides what ``queued`` does with a carrier and how a request
        ends, so a role per request would have to change the tracker's API and hot path."""
        if cls._tracker is not None:
            if role != sc.ROLE_BOTH and getattr(cls._tracker, "role", sc.ROLE_BOTH) != role:
                _warn_once(
                    "otel_llm: vLLM serves %s requests of disaggregated prefill/decode (kv_transfer_params), "
                    "but the tracker given to instrument() has role %r: their traces are not joined across "
                    "the two instances. Let instrument() build the trackers, or give one of that role.",
                    role,
                    getattr(cls._tracker, "role", None),
                )
            return cls._tracker
        key = (model, operation, role)
        tracker = cls._trackers.get(key)
        if tracker is None:
            with cls._lock:
                tracker = cls._trackers.get(key)
                if tracker is None:
                    from otel_llm import RequestTracker  # the tracker is built only where requests arrive

                    options = dict(cls._tracker_options)
                    _configure_if_asked(options)
                    options.setdefault("model", model)
                    options.setdefault("operation_name", operation)
                    options["role"] = role  # the request's part decides, not an instance-wide option
                    if cls._server is not None:  # vllm serve: its answers name the served model ...
                        server = dict(cls._server)
                        if model and not cls._lora:  # ... or, with LoRA on, a request's adapter
                            server[sc.GEN_AI_RESPONSE_MODEL] = model
                        options["attributes"] = {**server, **(options.get("attributes") or {})}
                    tracker = cls._trackers[key] = RequestTracker(**options)
        return tracker

    @classmethod
    def _pending_events(cls, request_id: str) -> list[Any] | None:
        """Events an in-process engine core recorded for the request and has not sent yet."""
        for scheduler in list(cls._schedulers):
            request = getattr(scheduler, "requests", {}).get(request_id)
            events = getattr(request, "events", None)
            if events:
                return list(events)  # a copy: vLLM still owns (and may still send) them
        return None


def _configure_if_asked(options: dict[str, Any]) -> None:
    """With OTEL_LLM_VLLM_CONFIGURE=1, build providers from OTEL_* (once) and use them."""
    if os.environ.get(ENV_CONFIGURE, "").strip().lower() not in ("1", "true", "yes"):
        return
    if VLLMInstrumentor.telemetry is None:
        import atexit

        from opentelemetry import trace

        from otel_llm import configure

        # vLLM's own --otlp-traces-endpoint sets the global TracerProvider before the first request;
        # then ours stay private (passed to the trackers) and each exports to its own endpoint.
        set_global = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        # One instance per process: `vllm serve --api-server-count N` runs N API servers, each with its
        # own cumulative metrics; under one service.instance.id their streams would overwrite each
        # other in a backend. OTEL_RESOURCE_ATTRIBUTES still wins (configure() gives it precedence).
        instance = {"service.instance.id": uuid.uuid4().hex}
        VLLMInstrumentor.telemetry = configure(set_global=set_global, resource_attributes=instance)
        atexit.register(VLLMInstrumentor.telemetry.shutdown)
    options.setdefault("tracer_provider", VLLMInstrumentor.telemetry.tracer_provider)
    options.setdefault("meter_provider", VLLMInstrumentor.telemetry.meter_provider)


class _UnlessHandled(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes otel_llm's records to stderr only when no root handler would take them.

    Under `vllm serve`, a dependency of vLLM sets the root logger and its handlers to ERROR
    (model_hosting_container_standards), so a library's warnings vanish. Records still propagate as
    usual; this handler is the fallback where they would be dropped.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if any(record.levelno >= h.level for h in logging.getLogger().handlers):
            return
        super().emit(record)


def _make_warnings_visible() -> None:
    """otel_llm's warnings (a missing engine-core plugin, a pipeline without histograms) must show under
    vLLM, whose dependencies raise the root logger to ERROR: the package logger gets its own level and
    a fallback handler, unless the application configured it."""
    package_logger = logging.getLogger("otel_llm")
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.WARNING)
    if not any(isinstance(h, _UnlessHandled) for h in package_logger.handlers):
        handler = _UnlessHandled()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s"))
        package_logger.addHandler(handler)


def _patch_vllm() -> None:
    """Patch vLLM's classes now (vLLM is imported); called by instrument() or by the import hook."""
    with VLLMInstrumentor._lock:
        VLLMInstrumentor._waiting = None
        if VLLMInstrumentor._patch is not None:
            return
        try:
            import inspect

            found = _find_vllm()
            if found is None:
                return
            _make_warnings_visible()
            processor_cls, scheduler_cls = found
            patch = Patch()
            for name in _WRAPPED_METHODS:
                patch.replace(processor_cls, name, _WRAPPERS[name](getattr(processor_cls, name)))
            update_stats = getattr(processor_cls, _STATS_METHOD, None)
            if callable(update_stats):
                patch.replace(processor_cls, _STATS_METHOD, _wrap_update_scheduler_stats(update_stats))
            else:
                _warn_once(
                    "otel_llm: this vLLM's OutputProcessor has no %s; the engine's own state (KV-cache "
                    "usage, running and waiting requests, prefix-cache hits, tokens per step) is not "
                    "reported",
                    _STATS_METHOD,
                )
            do_tracing = processor_cls.__dict__.get(_TRACING_METHOD)
            if callable(do_tracing):
                patch.replace(processor_cls, _TRACING_METHOD, _wrap_do_tracing(do_tracing))
            if scheduler_cls is not None:
                patch.replace(scheduler_cls, "__init__", _stats_on(scheduler_cls.__init__))
                if callable(scheduler_cls.__dict__.get("schedule")):
                    patch.replace(scheduler_cls, "schedule", _note_reschedulings(scheduler_cls.schedule))
            for engine_cls in _engine_classes():
                patch.replace(engine_cls, "__init__", _model_from_config(engine_cls.__init__))
                add_request = engine_cls.__dict__.get("add_request")
                if inspect.iscoroutinefunction(add_request):
                    patch.replace(engine_cls, "add_request", _keep_caller_headers(add_request))
            VLLMInstrumentor._patch = patch
            VLLMInstrumentor._serve_waiting = import_hook.when_imported(_SERVE[0], _patch_serve)
        except Exception:  # never break `import vllm`
            _warn_once("otel_llm: could not instrument vLLM; vLLM is unaffected", exc_info=True)


def _patch_serve() -> None:
    """Wrap the API server's ``build_and_serve`` (its module is imported); called by the import hook."""
    with VLLMInstrumentor._lock:
        VLLMInstrumentor._serve_waiting = None
        patch = VLLMInstrumentor._patch
        if patch is None:  # uninstrumented meanwhile
            return
        try:
            import inspect

            module = sys.modules[_SERVE[0]]
            original = module.__dict__.get(_SERVE[1])
            if not inspect.iscoroutinefunction(original):
                _warn_once(
                    "otel_llm: this vLLM's API server has no %s.%s; spans and metrics under vllm serve carry "
                    "no server.address, server.port or gen_ai.response.model",
                    *_SERVE,
                )
                return
            patch.replace(module, _SERVE[1], _wrap_build_and_serve(original))  # type: ignore[arg-type]
        except Exception:  # never break the API server's start
            _warn_once(
                "otel_llm: could not read vLLM's API server address; vLLM is unaffected", exc_info=True
            )


def _wrap_build_and_serve(original: Callable[..., Any]) -> Callable[..., Any]:
    async def build_and_serve(
        engine_client: Any, listen_address: Any, sock: Any, args: Any, *rest: Any, **kw: Any
    ) -> Any:
        _guarded("API server start", _note_server, sock, args)
        return await original(engine_client, listen_address, sock, args, *rest, **kw)

    build_and_serve.__wrapped__ = original  # type: ignore[attr-defined]
    return build_and_serve


def _note_server(sock: Any, args: Any) -> None:
    """server.address and server.port of the API server: the host it was told to listen on (none when
    every address), the port its socket is bound to (read back, so --port 0 is known), or its Unix
    socket's path (--uds). vLLM's answers name its first served model name (``gen_ai.response.model``,
    added per tracker), or the LoRA adapter a request asked for: with ``--enable-lora`` it is left out."""
    VLLMInstrumentor._lora = bool(getattr(args, "enable_lora", False))
    _warn_of_several_api_servers(args)
    uds = getattr(args, "uds", None)
    if isinstance(uds, str) and uds:
        VLLMInstrumentor._server = server_attributes(None, None, unix_socket=uds)
        return
    bound = sock.getsockname()
    port = bound[1] if isinstance(bound, tuple) and len(bound) >= 2 else None
    host = getattr(args, "host", None)
    VLLMInstrumentor._server = server_attributes(host if isinstance(host, str) else None, port)


def _warn_of_several_api_servers(args: Any) -> None:
    """At an API server's start under ``vllm serve --api-server-count N`` (N > 1), what would lose or
    mix up its telemetry, said once with what to set. Nothing with one API server."""
    count = getattr(args, "api_server_count", None)
    if not (isinstance(count, int) and count > 1):
        return
    _warn_if_stopped_before_flushing(count, getattr(args, "shutdown_timeout", None))
    if os.environ.get(ENV_CONFIGURE, "").strip().lower() not in ("1", "true", "yes"):
        _warn_if_one_resource(count)  # _configure_if_asked() gives each process its own instance


def _warn_if_stopped_before_flushing(count: int, wait: Any) -> None:
    """vLLM's launcher stops several API servers on SIGTERM by waiting ``--shutdown-timeout`` seconds
    (default 0) and then killing each one's process tree, export processes included: an API server
    still flushing loses its last telemetry without a word. Said with the value that lets the flush
    finish: our budget + 1 s of grace."""
    if not isinstance(wait, (int, float)):
        return
    from otel_llm.setup import shutdown_timeout

    try:
        needed = math.ceil(shutdown_timeout(None) + 1.0)
    except ValueError:
        return  # configure() says what is wrong with it
    if wait < needed:
        _warn_once(
            "otel_llm: vllm serve --api-server-count %d kills its API servers %s s after SIGTERM "
            "(--shutdown-timeout); each needs up to %d s to send its last telemetry "
            "(OTEL_LLM_SHUTDOWN_TIMEOUT + 1 s), which is lost otherwise: pass --shutdown-timeout %d",
            count,
            wait,
            needed,
            needed,
        )


def _warn_if_one_resource(count: int) -> None:
    """Providers built by ``opentelemetry-instrument`` take the resource the SDK's detectors give. Before
    opentelemetry-sdk 1.45 that has no ``service.instance.id`` unless asked for: every API server then
    exports its cumulative metrics as the same stream, and a backend keeps whichever came last."""
    from opentelemetry.sdk.resources import Resource

    if "service.instance.id" in Resource.create().attributes:
        return
    _warn_once(
        "otel_llm: the %d API servers of vllm serve export their metrics under one resource with no "
        "service.instance.id, so a backend takes their counters for one stream: opentelemetry-sdk 1.45 "
        "or later gives each process its own; with 1.43 or 1.44, add service_instance to "
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS; or set OTEL_LLM_VLLM_CONFIGURE=1",
        count,
    )


def _find_vllm() -> tuple[type, type | None] | None:
    """vLLM's OutputProcessor (and Scheduler) when they have what we wrap; else warn once, None."""
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

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
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    def __init__(*args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.arguments["log_stats"] = True
            args, kwargs = bound.args, bound.kwargs
        except TypeError:
            pass  # let vLLM report its own argument error
        original(*args, **kwargs)
        if args:
            VLLMInstrumentor._schedulers.add(args[0])  # aborts read its undelivered events

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _note_reschedulings(original: Callable[..., Any]) -> Callable[..., Any]:
    """Scheduler.schedule, then what its reschedulings found cached and what the step computes per
    request, kept while a frontend in this process is instrumented. With none here (an engine core in
    its own process) both go to the frontend (engine_core_figures): the reschedulings' figures when the
    step re-admits a preempted request, and the step's line every step, one write."""

    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not VLLMInstrumentor._adapters:
            sender = VLLMInstrumentor._engine_core_figures
            if sender is None:
                return original(self, *args, **kwargs)
            ts = time.monotonic()
            output = original(self, *args, **kwargs)
            # Inline, not a call: this runs on every step, and most steps re-admit nothing.
            if getattr(getattr(output, "scheduled_cached_reqs", None), "resumed_req_ids", None) or getattr(
                output, "scheduled_new_reqs", None
            ):
                _guarded("schedule", _send, sender, self, output, ts, True)
            elif sender.clients:
                _guarded("schedule", _send, sender, self, output, ts, False)
            return output
        ts = time.monotonic()  # when the step's scheduling began: the start of its batch()
        output = original(self, *args, **kwargs)
        _guarded("schedule", _noted, self, output, ts)
        return output

    schedule.__wrapped__ = original  # type: ignore[attr-defined]
    return schedule


def _send(sender: EngineCoreFigures, scheduler: Any, output: Any, ts: float, admits: bool) -> None:
    """One step's reschedulings (``admits``: it schedules new or re-admitted requests) and its line, in
    one write per frontend."""
    found = None
    if admits:
        sender.learn(scheduler, output)
        found = rescheduled(scheduler, output)
    step = None
    scheduled = getattr(output, "num_scheduled_tokens", None)
    if scheduled and sender.clients:
        total = getattr(output, "total_num_scheduled_tokens", None)
        step = (ts, scheduled, total, recomputing(getattr(scheduler, "requests", {}), scheduled, total))
    if found or step:
        sender.send(found or [], step, getattr(scheduler, "requests", None))


def _pull_engine_core_steps() -> None:
    """Read what this process's engine cores in their own processes wrote (engine_core_figures): the
    reschedulings' figures are kept for the adapters, the steps handed to them (``step_scheduled``)."""
    for figures in list(VLLMInstrumentor._frontend_figures.values()):
        found = figures.drain()
        if found:
            VLLMInstrumentor._reschedulings.add(found)
        steps = figures.take_steps()
        if steps:
            adapters = list(VLLMInstrumentor._adapters.values())
            # One frontend in this process (the usual case): every step its engine cores sent is its own,
            # also when a step's first request came through another API server.
            addressed = len(adapters) == 1
            for ts, scheduled, recompute in steps:
                for adapter in adapters:
                    adapter.step_scheduled(scheduled, ts, recompute, addressed=addressed)


def _noted(scheduler: Any, output: Any, ts: float) -> None:
    VLLMInstrumentor._reschedulings.record(scheduler, output)
    for adapter in list(VLLMInstrumentor._adapters.values()):
        adapter.pull_steps = None  # the engine core is here: nothing arrives on the socket
    scheduled = getattr(output, "num_scheduled_tokens", None)
    if scheduled:
        recompute = recomputing(
            getattr(scheduler, "requests", {}), scheduled, getattr(output, "total_num_scheduled_tokens", None)
        )
        for adapter in list(VLLMInstrumentor._adapters.values()):
            adapter.step_scheduled(scheduled, ts, recompute)


def _engine_classes() -> list[type]:
    """vLLM's engine classes whose ``__init__`` we wrap for the model name (those this build has)."""
    found = []
    for module_name, class_name in _ENGINES:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # a trimmed vLLM install, or a version without this engine
            _log.debug("otel_llm: no %s.%s in this vLLM", module_name, class_name, exc_info=True)
            continue
        if callable(cls.__dict__.get("__init__")):
            found.append(cls)
    return found


def _model_from_config(original: Callable[..., None]) -> Callable[..., None]:
    """Engine ``__init__`` that then names its output processor's requests after the served model."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _guarded("engine init", _note_model, self)
        _guarded("engine init", _listen_for_figures, original, self, args, kwargs)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _listen_for_figures(original: Callable[..., None], engine: Any, args: Any, kwargs: Any) -> None:
    """Open the socket this frontend's engine cores send their reschedulings' figures to (one per key in
    a process; with the engine core in this process nothing ever arrives there)."""
    import inspect

    try:
        bound = inspect.signature(original).bind(engine, *args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = dict(kwargs)
    key = frontend_key(bound)
    with VLLMInstrumentor._lock:
        if key in VLLMInstrumentor._frontend_figures or VLLMInstrumentor._patch is None:
            return
        try:
            figures = FrontendFigures(*key)
        except OSError as exc:
            _warn_once(
                "otel_llm: cannot receive what vLLM's engine core finds cached at reschedulings (%s); "
                "llm.recompute spans will carry no token figures",
                exc,
            )
            return
        VLLMInstrumentor._frontend_figures[key] = figures
        VLLMInstrumentor._reschedulings.sources.append(figures.drain)
        if not VLLMInstrumentor._schedulers:
            for adapter in VLLMInstrumentor._adapters.values():
                adapter.pull_steps = _pull_engine_core_steps


def _note_model(engine: Any) -> None:
    processor = getattr(engine, "output_processor", None)
    config = getattr(engine, "model_config", None)
    if processor is None or config is None:
        return
    name = getattr(config, "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if not isinstance(name, str):
        name = getattr(config, "model", None)
    if isinstance(name, str):
        VLLMInstrumentor._adapter(processor).model = name


def _keep_caller_headers(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AsyncLLM.add_request`` that leaves the caller's trace headers where our adapter finds them."""
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    async def add_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            headers = signature.bind(self, *args, **kwargs).arguments.get("trace_headers")
        except TypeError:
            headers = None
        token = _CALLER_HEADERS.set(dict(headers) if headers else None)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _CALLER_HEADERS.reset(token)

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _wrap_add_request(original: Callable[..., Any]) -> Callable[..., Any]:
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        _guarded("add_request", _request_added, signature, self, request, args, kwargs)
        return result

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _request_added(
    signature: inspect.Signature, processor: Any, request: Any, args: Iterable[Any], kwargs: dict[str, Any]
) -> None:
    """Hand a new request to the adapter with its ``n > 1`` parent and choice index, if any."""
    try:
        bound = signature.bind(processor, request, *args, **kwargs).arguments
    except TypeError:
        bound = {}
    parent, index = bound.get("parent_req"), bound.get("request_index", 0)
    VLLMInstrumentor._adapter(processor).request_added(
        request, parent, index if isinstance(index, int) else 0, _CALLER_HEADERS.get()
    )


def _wrap_process_outputs(original: Callable[..., Any]) -> Callable[..., Any]:
    # Once per batch of every engine step: the adapter's calls are inline here, each in its own
    # try (what ``_guarded`` does, without its two extra calls).
    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        batch_ts = args[0] if args else kwargs.get("engine_core_timestamp")
        adapter = _adapter_of(self)
        if adapter is not None:
            # Before vLLM: it may trim tokens after a stop string; vLLM counts them untrimmed too.
            try:
                adapter.outputs(engine_core_outputs, batch_ts, _open_ids(self))
            except Exception:
                _step_failed("process_outputs")
        result = original(self, engine_core_outputs, *args, **kwargs)
        if adapter is not None:
            try:
                adapter.settle(engine_core_outputs, _open_ids(self))
            except Exception:
                _step_failed("process_outputs")
        return result

    process_outputs.__wrapped__ = original  # type: ignore[attr-defined]
    return process_outputs


def _wrap_update_scheduler_stats(original: Callable[..., Any]) -> Callable[..., Any]:
    def update_scheduler_stats(self: Any, scheduler_stats: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, scheduler_stats, *args, **kwargs)
        adapter = _adapter_of(self)
        if adapter is not None:
            try:
                adapter.engine_stats(scheduler_stats)
            except Exception:
                _step_failed("update_scheduler_stats")
        return result

    update_scheduler_stats.__wrapped__ = original  # type: ignore[attr-defined]
    return update_scheduler_stats


def _wrap_do_tracing(original: Callable[..., Any]) -> Callable[..., Any]:
    # vLLM calls it only with its own tracing on, once per finished request, inside process_outputs and
    # so before the adapter's settle() finishes the request: our llm.request is still open to ask.
    def do_tracing(self: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = _adapter_of(self)
        if adapter is not None:
            try:
                headers = adapter.parent_headers(output.request_id, output.trace_headers)
                if headers is not None:
                    output.trace_headers = headers
            except Exception:
                _step_failed("do_tracing")
        return original(self, output, *args, **kwargs)

    do_tracing.__wrapped__ = original  # type: ignore[attr-defined]
    return do_tracing


# The adapter found last, with the adapters' map it came from and its processor (weakly): a frontend
# has one OutputProcessor, so each step's lookups hit this instead of the WeakKeyDictionary, whose get()
# makes a weak reference every time (about 1 µs, twice a step).
_last_adapter: tuple[Any, weakref.ref[Any], VLLMAdapter] | None = None


def _adapter_of(processor: Any) -> VLLMAdapter | None:
    """The adapter of an instrumented ``OutputProcessor``, None when it has none (yet)."""
    global _last_adapter
    adapters = VLLMInstrumentor._adapters
    last = _last_adapter
    if last is not None and last[0] is adapters and last[1]() is processor:
        return last[2]
    adapter = adapters.get(processor)
    if adapter is not None:
        _last_adapter = (adapters, weakref.ref(processor), adapter)
    return adapter


def _step_failed(what: str) -> None:
    """In an ``except`` block: the adapter failed in ``what``; said once, with the traceback."""
    _warn_once("otel_llm: vLLM integration failed in %s; vLLM is unaffected", what, exc_info=True)


def _wrap_abort_requests(original: Callable[..., Any]) -> Callable[..., Any]:
    def abort_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        adapter = VLLMInstrumentor._adapters.get(self)
        if adapter is not None:
            pending = VLLMInstrumentor._pending_events if VLLMInstrumentor._schedulers else None
            _guarded("abort_requests", adapter.abandoned, _open_ids(self), pending)
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
