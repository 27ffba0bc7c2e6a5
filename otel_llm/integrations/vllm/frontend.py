"""vLLM's frontend, offline (``LLM``) and under `vllm serve` alike: its requests and outputs into the
adapter.

Wrapped: the ``OutputProcessor``'s ``add_request``, ``process_outputs`` and ``abort_requests``, and where
vLLM has them ``update_scheduler_stats`` (the engine's ``SchedulerStats``, once per step) and
``do_tracing`` (where vLLM's own tracing starts its ``llm_request`` span: given our ``llm.request`` as
its parent, so both are one trace); the ``__init__`` of ``LLMEngine`` and ``AsyncLLM`` (the served model
name from vLLM's model config, and the socket the engine cores in their own processes write to), and
``AsyncLLM.add_request`` (the caller's trace headers, which vLLM drops unless its own tracing is on).

Every wrapper runs vLLM's own call whatever happens to ours. A failure of ours is counted and said
(``otel_llm.integrations.faults``) and, since the requests after it would be traced with holes, stops
the integration; only ``do_tracing``'s leaves our telemetry whole, and is said once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from otel_llm.integrations.vllm.caller_headers import CALLER_HEADERS
from otel_llm.integrations.vllm.frontend_figures import FrontendFigures, frontend_key
from otel_llm.integrations.vllm.state import LOCK, IntegrationState, log

if TYPE_CHECKING:
    import inspect

LOST_REQUESTS = "the events, tokens and ends of the requests after it"
LOST_ENGINE_STATE = "the engine's own state (KV-cache usage, running and waiting requests) of later steps"
LOST_MODEL = "the served model's name and the engine cores' figures of this engine"


def _open_ids(processor: Any) -> Any:
    """The processor's open request ids: vLLM's ``request_states``, by request id."""
    return processor.request_states


def wrap_add_request(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        try:
            _request_added(state, signature, self, request, args, kwargs)
        except Exception:
            state.faults.failed("OutputProcessor.add_request", LOST_REQUESTS)
        return result

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request


def _request_added(
    state: IntegrationState,
    signature: inspect.Signature,
    processor: Any,
    request: Any,
    args: Iterable[Any],
    kwargs: dict[str, Any],
) -> None:
    """Hand a new request to the adapter with its ``n > 1`` parent and choice index, if any."""
    bound = signature.bind(processor, request, *args, **kwargs).arguments
    parent, index = bound.get("parent_req"), bound.get("request_index", 0)
    state.adapter(processor).request_added(
        request, parent, index if isinstance(index, int) else 0, CALLER_HEADERS.get()
    )


def wrap_process_outputs(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    # Once per batch of every engine step: the adapter's calls are inline here, each in its own try.
    adapter_of = state.adapter_of
    failed = state.faults.failed

    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        batch_ts = args[0] if args else kwargs.get("engine_core_timestamp")
        adapter = adapter_of(self)
        if adapter is not None:
            # Before vLLM: it may trim tokens after a stop string; vLLM counts them untrimmed too.
            try:
                adapter.outputs(engine_core_outputs, batch_ts, self.request_states)
            except Exception:
                failed("OutputProcessor.process_outputs", LOST_REQUESTS)
        result = original(self, engine_core_outputs, *args, **kwargs)
        if adapter is not None and not state.stopped:
            try:
                adapter.settle(engine_core_outputs, self.request_states)
            except Exception:
                failed("OutputProcessor.process_outputs", LOST_REQUESTS)
        return result

    process_outputs.__wrapped__ = original  # type: ignore[attr-defined]
    return process_outputs


def wrap_abort_requests(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    def abort_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        adapter = state.adapters.get(self)
        if adapter is not None:
            try:
                pending = state.pending_events if state.schedulers else None
                adapter.abandoned(_open_ids(self), pending)
            except Exception:
                state.faults.failed("OutputProcessor.abort_requests", LOST_REQUESTS)
        return result

    abort_requests.__wrapped__ = original  # type: ignore[attr-defined]
    return abort_requests


def wrap_update_scheduler_stats(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    adapter_of = state.adapter_of

    def update_scheduler_stats(self: Any, scheduler_stats: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, scheduler_stats, *args, **kwargs)
        adapter = adapter_of(self)
        if adapter is not None:
            try:
                adapter.engine_stats(scheduler_stats)
            except Exception:
                state.faults.failed("OutputProcessor.update_scheduler_stats", LOST_ENGINE_STATE)
        return result

    update_scheduler_stats.__wrapped__ = original  # type: ignore[attr-defined]
    return update_scheduler_stats


def wrap_do_tracing(state: IntegrationState, original: Callable[..., Any]) -> Callable[..., Any]:
    # vLLM calls it only with its own tracing on, once per finished request, inside process_outputs and
    # so before the adapter's settle() finishes the request: our llm.request is still open to ask.
    # A failure here leaves our telemetry whole (vLLM's span is then a trace of its own): said once.
    def do_tracing(self: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
        adapter = state.adapter_of(self)
        if adapter is not None:
            try:
                headers = adapter.parent_headers(output.request_id, output.trace_headers)
                if headers is not None:
                    output.trace_headers = headers
            except Exception:
                state.faults.failed("OutputProcessor.do_tracing")
        return original(self, output, *args, **kwargs)

    do_tracing.__wrapped__ = original  # type: ignore[attr-defined]
    return do_tracing


def read_model_name(state: IntegrationState, original: Callable[..., None]) -> Callable[..., None]:
    """Engine ``__init__`` that then names its output processor's requests after the served model and
    opens the socket its engine cores in their own processes write to."""
    site = f"{getattr(original, '__qualname__', 'engine __init__')}"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _name_requests(state, self)
            _listen_for_figures(state, original, self, args, kwargs)
        except Exception:
            state.faults.failed(site, LOST_MODEL)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    return __init__


def _name_requests(state: IntegrationState, engine: Any) -> None:
    """The adapter of the engine's output processor names its requests after vLLM's served model name
    (the first of ``--served-model-name``, else the model path)."""
    processor = engine.output_processor
    config = engine.model_config
    name = config.served_model_name
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    if not isinstance(name, str):
        name = config.model
    if isinstance(name, str):
        state.adapter(processor).model = name


def _listen_for_figures(
    state: IntegrationState, original: Callable[..., None], engine: Any, args: Any, kwargs: Any
) -> None:
    """Open the socket this frontend's engine cores send their reschedulings' figures to (one per key in
    a process; with the engine core in this process nothing ever arrives there)."""
    import inspect

    try:
        bound = inspect.signature(original).bind(engine, *args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = dict(kwargs)
    key = frontend_key(bound)
    with LOCK:
        if key in state.frontend_figures or state.patch is None:
            return
        try:
            figures = FrontendFigures(*key)
        except OSError as exc:
            from otel_llm.integrations.patching import warn_once

            warn_once(
                log,
                "otel_llm: cannot receive what vLLM's engine core finds cached at reschedulings (%s); "
                "llm.recompute spans will carry no token figures",
                exc,
            )
            return
        state.frontend_figures[key] = figures
        state.reschedulings.sources.append(figures.drain)
        if not state.schedulers:
            for adapter in state.adapters.values():
                adapter.pull_steps = state.pull_engine_core_steps


def keep_caller_headers(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AsyncLLM.add_request`` that leaves the caller's trace headers where our adapter finds them."""
    import inspect  # here, not at module import: start-up cost under opentelemetry-instrument

    signature = inspect.signature(original)

    async def add_request(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            headers = signature.bind(self, *args, **kwargs).arguments.get("trace_headers")
        except TypeError:
            headers = None  # vLLM reports its own argument error
        if not headers:  # what the API server's middleware found stands (caller_headers.py)
            return await original(self, *args, **kwargs)
        token = CALLER_HEADERS.set(dict(headers))
        try:
            return await original(self, *args, **kwargs)
        finally:
            CALLER_HEADERS.reset(token)

    add_request.__wrapped__ = original  # type: ignore[attr-defined]
    return add_request
