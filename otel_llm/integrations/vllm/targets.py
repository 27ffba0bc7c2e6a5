"""Every vLLM name the instrumentor patches or depends on by name, found and checked before it patches.

vLLM moves its internals between releases. What the integration needs is listed here once, and
``find()`` checks all of it in the installed vLLM before anything is patched: the classes (by module
path), the methods it wraps, the arguments it reads by name, the event types it replays and the fields
of the outputs it reads. A vLLM that lacks any of them is not instrumented at all (one warning names
what is missing), rather than traced with holes. What is optional is optional by design and said once
when absent: ``update_scheduler_stats`` (the engine's own state) and ``do_tracing`` (vLLM's own tracing).
The API server's ``build_and_serve`` is checked when the API server's module is imported.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

OUTPUT_PROCESSOR = ("vllm.v1.engine.output_processor", "OutputProcessor")
SCHEDULER = ("vllm.v1.core.sched.scheduler", "Scheduler")
EVENT_TYPES = ("vllm.v1.engine", "EngineCoreEventType")
ENGINE_CORE_OUTPUT = ("vllm.v1.engine", "EngineCoreOutput")
SCHEDULER_OUTPUT = ("vllm.v1.core.sched.output", "SchedulerOutput")
CACHED_REQUEST_DATA = ("vllm.v1.core.sched.output", "CachedRequestData")
# Engines whose __init__ builds the frontend's OutputProcessor next to a model config.
ENGINES = (("vllm.v1.engine.llm_engine", "LLMEngine"), ("vllm.v1.engine.async_llm", "AsyncLLM"))
# vLLM's API server (`vllm serve`) passes its engine client, its bound socket and its arguments here before
# it serves. Imported by the API server only; ``SERVE_CLI`` is what `vllm serve` imports first.
SERVE = ("vllm.entrypoints.launchers.api_server.entry", "build_and_serve")
SERVE_CLI = "vllm.entrypoints.cli.serve"

# OutputProcessor methods wrapped; each with the arguments it reads by name (add_request) or by position
# (process_outputs: the timestamp comes second, after self and the outputs).
FRONTEND_METHODS = {
    "add_request": (("parent_req", "request_index"), False),
    "process_outputs": (("engine_core_outputs", "engine_core_timestamp"), True),
    "abort_requests": ((), False),
}
# Optional: vLLM's engine loops call it once per engine step with that step's SchedulerStats.
STATS_METHOD = "update_scheduler_stats"
# Optional: where vLLM's own tracing (--otlp-traces-endpoint) starts its ``llm_request`` span.
TRACING_METHOD = "do_tracing"
EVENT_NAMES = ("QUEUED", "SCHEDULED", "PREEMPTED")
# EngineCoreOutput fields read on every output (others, such as prefill_stats, vary by release and are
# read where present).
OUTPUT_FIELDS = ("request_id", "new_token_ids", "finish_reason", "events")
SCHEDULER_OUTPUT_FIELDS = (
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "num_scheduled_tokens",
    "total_num_scheduled_tokens",
)
CACHED_REQUEST_FIELDS = ("req_ids", "num_computed_tokens")
# Removed in vLLM 0.34, whose resumed requests are among scheduled_new_reqs (rescheduling.resumed).
RESUMED_FIELD = "resumed_req_ids"
SCHEDULER_ARGUMENTS = ("log_stats",)  # Scheduler.__init__: turned on, or no request event exists
ASYNC_ADD_REQUEST_ARGUMENTS = ("trace_headers",)  # AsyncLLM.add_request: the caller's W3C headers
SERVE_ARGUMENTS = ("engine_client", "listen_address", "sock", "args")  # build_and_serve, positional
# vllm serve's --middleware (a list of import paths on its parsed arguments), public since before 0.30.
SERVE_MIDDLEWARE = "middleware"


class Targets:
    """The vLLM classes found, each checked to have what the integration uses."""

    def __init__(self, processor: type, scheduler: type, engines: list[type], resumed_field: bool) -> None:
        self.processor = processor
        self.scheduler = scheduler
        self.engines = engines
        # CachedRequestData lists re-admitted requests (resumed_req_ids); False: found by their
        # preemptions among the new ones (vLLM 0.34's way)
        self.resumed_field = resumed_field


def _class(path: tuple[str, str]) -> Any:
    return getattr(importlib.import_module(path[0]), path[1])


def fields(cls: Any) -> set[str]:
    """The declared fields of a msgspec Struct or dataclass (annotations, as a fallback)."""
    declared = getattr(cls, "__struct_fields__", None)
    if declared is None:
        declared = getattr(cls, "__dataclass_fields__", None)
    if declared is None:
        declared = {k for base in getattr(cls, "__mro__", ()) for k in getattr(base, "__annotations__", {})}
    return set(declared)


def parameters(function: Any) -> list[str]:
    """The parameter names of ``function`` (empty when it has no signature to read)."""
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def lacks(
    owner: str, function: Any, names: Iterable[str], positional: bool, skip_self: bool = True
) -> list[str]:
    """What ``function`` lacks of the arguments ``names`` read by name, or, ``positional``, read by
    position (then the first parameters must be those, in that order), as ``owner(name)``."""
    found = parameters(function)[1 if skip_self else 0 :]
    wanted = list(names)
    if positional and found[: len(wanted)] != wanted:
        return [f"{owner}({', '.join(wanted)})"]
    return [f"{owner}({name})" for name in wanted if name not in found]


def coroutine_function(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


def find() -> tuple[Targets | None, list[str]]:
    """vLLM's classes with everything the integration needs, or None and what is missing."""
    missing: list[str] = []
    try:
        processor = _class(OUTPUT_PROCESSOR)
        for name, (arguments, positional) in FRONTEND_METHODS.items():
            method = getattr(processor, name, None)
            if not callable(method):
                missing.append(f"OutputProcessor.{name}")
            elif arguments:
                missing += lacks(f"OutputProcessor.{name}", method, arguments, positional)
        events = _class(EVENT_TYPES)
        missing += [f"EngineCoreEventType.{n}" for n in EVENT_NAMES if not hasattr(events, n)]
        output_fields = fields(_class(ENGINE_CORE_OUTPUT))
        missing += [f"EngineCoreOutput.{n}" for n in OUTPUT_FIELDS if n not in output_fields]
        scheduler = _class(SCHEDULER)
        missing += lacks("Scheduler.__init__", scheduler.__init__, SCHEDULER_ARGUMENTS, False)
        output = fields(_class(SCHEDULER_OUTPUT))
        missing += [f"SchedulerOutput.{n}" for n in SCHEDULER_OUTPUT_FIELDS if n not in output]
        cached = fields(_class(CACHED_REQUEST_DATA))
        missing += [f"CachedRequestData.{n}" for n in CACHED_REQUEST_FIELDS if n not in cached]
        if not callable(vars(scheduler).get("schedule")):
            missing.append("Scheduler.schedule")
        engines = []
        for path in ENGINES:
            engine = _class(path)
            if not callable(vars(engine).get("__init__")):
                missing.append(f"{path[1]}.__init__")
            engines.append(engine)
        add_request = vars(engines[1]).get("add_request")
        if not coroutine_function(add_request):
            missing.append("AsyncLLM.add_request")
        else:
            missing += lacks("AsyncLLM.add_request", add_request, ASYNC_ADD_REQUEST_ARGUMENTS, False)
    except Exception as exc:  # ImportError, AttributeError, or whatever an unknown vLLM raises
        missing.append(f"{type(exc).__name__}: {exc}")
    if missing:
        return None, missing
    return Targets(processor, scheduler, engines, RESUMED_FIELD in cached), []
