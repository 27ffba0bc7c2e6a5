"""Everything one active vLLM instrumentation holds, in one object (``IntegrationState``).

``instrument()`` makes one; every wrapper it places closes over it; ``uninstrument()`` (or the stop
after a failure, see ``otel_llm.integrations.faults``) restores vLLM's classes and drops it. Nothing of
it is kept in class variables or module globals, so two instrumentations in a row never share a
request, a tracker or a socket. The patch is process-wide (it changes vLLM's classes), so one state is
active at a time (``otel_llm.integrations.vllm.instrumentor`` keeps it), under ``LOCK``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from otel_llm import semconv as sc
from otel_llm.integrations.faults import Faults
from otel_llm.integrations.patching import Patch
from otel_llm.integrations.vllm.adapter import VLLMAdapter
from otel_llm.integrations.vllm.engine_core_figures import EngineCoreFigures
from otel_llm.integrations.vllm.frontend_figures import FrontendFigures
from otel_llm.integrations.vllm.rescheduling import Reschedulings

LOCK = threading.RLock()
# One logger for every message of the integration, whichever module says it.
log = logging.getLogger("otel_llm.integrations.vllm")


class IntegrationState:
    """One instrumentation's trackers, adapters, engine cores, sockets and patch.

    ``tracker``: the one given to ``instrument()``, else None and the trackers are built from
    ``tracker_options`` as requests arrive (one per served model, endpoint and disaggregated role).
    """

    def __init__(self, tracker: Any, tracker_options: dict[str, Any], faults: Faults) -> None:
        self.tracker = tracker
        self.tracker_options = tracker_options
        self.faults = faults
        self.trackers: dict[tuple[str | None, str, str], Any] = {}  # (model, operation, role)
        # One adapter per OutputProcessor (one per frontend, usually one per process).
        self.adapters: weakref.WeakKeyDictionary[Any, VLLMAdapter] = weakref.WeakKeyDictionary()
        self.schedulers: weakref.WeakSet[Any] = weakref.WeakSet()  # engine cores in this process
        # What those engine cores found cached when they rescheduled preempted requests, for the adapters.
        self.reschedulings = Reschedulings()
        # In an engine core whose frontend is another process: sends it those figures.
        self.engine_core_figures = EngineCoreFigures()
        # In a frontend: the sockets its engine cores send figures to, by (pid, client index).
        self.frontend_figures: dict[tuple[int, int], FrontendFigures] = {}
        # Under `vllm serve`: server.address / server.port as the API server bound them (None: no API
        # server in this process, e.g. LLM.generate(), so no server attribute, no gen_ai.response.model).
        self.api_server: dict[str, str | int] | None = None
        self.lora = False  # vllm serve --enable-lora: answers may name an adapter, not the model
        self.patch: Patch | None = None
        self.vllm_hook: object | None = None  # the import hook while vLLM is not imported yet
        self.api_server_hook: object | None = None  # the import hook while the API server is not
        self.cli_hook: object | None = None  # the import hook while `vllm serve`'s CLI module is not
        self.stopped = False
        # This vLLM's CachedRequestData lists re-admitted requests (resumed_req_ids; not in 0.34).
        self.resumed_field = True
        # The adapter found last, with its processor (weakly): a frontend has one OutputProcessor, so each
        # step's lookups hit this instead of the WeakKeyDictionary, whose get() makes a weak reference
        # every time (about 1 µs, twice a step).
        self._last: tuple[weakref.ref[Any], VLLMAdapter] | None = None

    # --- adapters -----------------------------------------------------------------------------------

    def adapter(self, processor: Any) -> VLLMAdapter:
        """The adapter of ``processor``, made at its first use."""
        adapter = self.adapters.get(processor)
        if adapter is None:
            with LOCK:
                adapter = self.adapters.get(processor)
                if adapter is None:
                    adapter = VLLMAdapter(self.tracker_for, reschedulings=self.reschedulings)
                    self.adapters[processor] = adapter
                    if self.frontend_figures and not self.schedulers:
                        adapter.pull_steps = self.pull_engine_core_steps
        return adapter

    def adapter_of(self, processor: Any) -> VLLMAdapter | None:
        """The adapter of an instrumented ``OutputProcessor``, None when it has none (yet)."""
        last = self._last
        if last is not None and last[0]() is processor:
            return last[1]
        adapter = self.adapters.get(processor)
        if adapter is not None:
            self._last = (weakref.ref(processor), adapter)
        return adapter

    def tracker_for(self, model: str | None, operation: str, role: str = sc.ROLE_BOTH) -> Any:
        """The tracker for one served model, endpoint and disaggregated role, built where the first such
        request arrives.

        The role is the request's (its ``kv_transfer_params``), so a ``kv_both`` instance that serves
        prefill-only, decode-only and plain requests has up to three trackers per model and endpoint:
        ``llm.role`` is a tracker-wide attribute of every span and metric point (low-cardinality, like
        the model), and a tracker's role decides what ``queued`` does with a carrier and how a request
        ends, so a role per request would have to change the tracker's API and hot path."""
        if self.tracker is not None:
            if role != sc.ROLE_BOTH and getattr(self.tracker, "role", sc.ROLE_BOTH) != role:
                from otel_llm.integrations.patching import warn_once

                warn_once(
                    log,
                    "otel_llm: vLLM serves %s requests of disaggregated prefill/decode (kv_transfer_params), "
                    "but the tracker given to instrument() has role %r: their traces are not joined across "
                    "the two instances. Let instrument() build the trackers, or give one of that role.",
                    role,
                    getattr(self.tracker, "role", None),
                )
            return self.tracker
        key = (model, operation, role)
        tracker = self.trackers.get(key)
        if tracker is None:
            with LOCK:
                tracker = self.trackers.get(key)
                if tracker is None:
                    tracker = self.trackers[key] = self._new_tracker(model, operation, role)
        return tracker

    def _new_tracker(self, model: str | None, operation: str, role: str) -> Any:
        from otel_llm import RequestTracker  # the tracker is built only where requests arrive
        from otel_llm.integrations import faults
        from otel_llm.integrations.vllm.providers import configure_if_asked

        options = dict(self.tracker_options)
        configure_if_asked(options)
        options.setdefault("model", model)
        options.setdefault("operation_name", operation)
        options["role"] = role  # the request's part decides, not an instance-wide option
        if self.api_server is not None:  # vllm serve: its answers name the served model ...
            server = dict(self.api_server)
            if model and not self.lora:  # ... or, with LoRA on, a request's adapter
                server[sc.GEN_AI_RESPONSE_MODEL] = model
            options["attributes"] = {**server, **(options.get("attributes") or {})}
        faults.report_to(options.get("meter_provider"))
        return RequestTracker(**options)

    # --- what the engine cores in this process or in their own tell the frontends ---------------------

    def pending_events(self, request_id: str) -> list[Any] | None:
        """Events an in-process engine core recorded for the request and has not sent yet."""
        for scheduler in list(self.schedulers):
            request = scheduler.requests.get(request_id)
            events = request.events if request is not None else None
            if events:
                return list(events)  # a copy: vLLM still owns (and may still send) them
        return None

    def pull_engine_core_steps(self) -> None:
        """Read what this process's engine cores in their own processes wrote (engine_core_figures): the
        reschedulings' figures are kept for the adapters, the steps handed to them (``step_scheduled``)."""
        for figures in list(self.frontend_figures.values()):
            found = figures.drain()
            if found:
                self.reschedulings.add(found)
            steps = figures.take_steps()
            if steps:
                # The usual case, one frontend in this process: the adapter found last, without a pass
                # over the WeakKeyDictionary (a generator under an iteration guard, every step).
                last = self._last
                one = last is not None and last[0]() is not None and len(self.adapters) == 1
                adapters = [last[1]] if one and last is not None else list(self.adapters.values())
                # One frontend in this process (the usual case): every step its engine cores sent is its
                # own, also when a step's first request came through another API server.
                addressed = len(adapters) == 1
                for ts, scheduled, recompute in steps:
                    for adapter in adapters:
                        adapter.step_scheduled(scheduled, ts, recompute, addressed=addressed)

    # --- the end -------------------------------------------------------------------------------------

    def abandon_in_flight(self, why: str) -> int:
        """At a stop: every request the adapters follow ends now as ``abandoned`` with ``why``, so no
        trace of one looks whole; returns how many. Never raises (the tracker may be what failed)."""
        ended = 0
        for adapter in list(self.adapters.values()):
            try:
                ended += adapter.abandon_all(why)
            except Exception:
                log.debug("otel_llm: ending vLLM's requests in flight failed", exc_info=True)
        return ended

    def close(self) -> list[str]:
        """Restore vLLM's classes, remove the import hooks, close the sockets; returns the points that
        another library had wrapped again since (see ``Patch.restore``)."""
        from otel_llm.integrations import import_hook

        for hook in (self.vllm_hook, self.api_server_hook, self.cli_hook):
            if hook is not None:
                import_hook.remove(hook)
        self.vllm_hook = self.api_server_hook = self.cli_hook = None
        patch, self.patch = self.patch, None
        rewrapped = patch.restore() if patch is not None else []
        for figures in self.frontend_figures.values():
            figures.close()
        self.frontend_figures = {}
        self.adapters = weakref.WeakKeyDictionary()
        self._last = None
        self.trackers = {}
        return rewrapped
