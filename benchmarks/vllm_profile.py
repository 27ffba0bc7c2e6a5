"""Where otel-llm's frontend CPU goes under vLLM: CPU counters around each adapter entry point.

Used only in the extra profile rounds of the phases variant's worker, after its timed rounds: the
counters themselves cost two clock reads per call, which must not land in the timed figures.

The instrumentor wraps vLLM's ``OutputProcessor`` and calls, per engine step, the adapter's
``outputs`` (before vLLM processes the step's outputs) and ``settle`` (after), and ``engine_stats``
(from ``update_scheduler_stats``), and per new request ``request_added``. Each is wrapped here, at the
class, with ``time.thread_time_ns`` (CPU of the calling thread, the frontend's main thread under
``LLM.generate``): CPU nanoseconds and calls per entry point. An entry point this adapter lacks is left
out (the adapter changes under the performance work of the same issue).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

# Adapter method -> the name the report gives it (the instrumentor's wrapped vLLM method in brackets).
# A name that extends another's with ": " is a part of it, counted inside it too (``vllm_figures``): the
# features of the per-step path (the socket read of the engine core's lines, the steps handed to
# ``batch()``, the request's finish) apart from the outputs' own replay and the settle's check.
ENTRY_POINTS = {
    "request_added": "add_request",
    "outputs": "process_outputs: outputs",
    "_pull": "process_outputs: outputs: socket read",
    "_report_steps": "process_outputs: outputs: batch()",
    "settle": "process_outputs: settle",
    "_finish": "process_outputs: settle: finish",
    "engine_stats": "update_scheduler_stats: engine_stats",
}


class EntryPointCounters:
    """Running CPU nanoseconds and call counts per adapter entry point, once ``install()`` ran."""

    def __init__(self) -> None:
        self.cpu_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self._installed = False

    def install(self) -> list[str]:
        """Wrap the adapter's entry points (once); return the report names of those wrapped."""
        from otel_llm.integrations.vllm.adapter import VLLMAdapter

        wrapped = []
        for method, name in ENTRY_POINTS.items():
            original = VLLMAdapter.__dict__.get(method)
            if not callable(original):
                continue
            wrapped.append(name)
            if not self._installed:
                setattr(VLLMAdapter, method, self._counted(name, original))
        self._installed = True
        return wrapped

    def reset(self) -> None:
        self.cpu_ns = {}
        self.calls = {}

    def _counted(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.thread_time_ns

        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return original(*args, **kwargs)
            finally:
                spent = clock() - start
                # Looked up on self at each call: reset() replaces the dicts.
                self.cpu_ns[name] = self.cpu_ns.get(name, 0) + spent
                self.calls[name] = self.calls.get(name, 0) + 1

        return counted
