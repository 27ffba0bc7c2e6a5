"""When an engine integration's own code fails inside the engine: counted, said once, and stopped
where it would go on with incomplete telemetry.

An engine moves its internals between releases: a field renamed, an argument dropped, a method moved.
The integration's wrappers never let such trouble reach the engine (its own call always runs), but
swallowing it quietly would leave traces that look whole and are not. So each failure is:

- counted in the self-metric ``otel_llm.integration.errors`` (a counter, ``{error}``), by ``engine``
  (``vllm``, ``sglang``) and ``site`` (the engine's method or the step that failed), process-wide and
  cumulative, so a stopped integration's count is still exported;
- said once per site, at WARNING, with the engine's installed version and the traceback;
- where later requests' telemetry would be incomplete (most sites), followed by the integration's stop:
  it uninstruments itself, with one WARNING that says so and why.

The counter is observed on every meter provider the integration's trackers use (``report_to``), once
per provider, like the trackers' own self-metrics (``otel_llm.emit.observables``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from opentelemetry import metrics

from otel_llm import semconv as sc
from otel_llm.emit import observables
from otel_llm.integrations.patching import warn_once

_LOCK = threading.Lock()
_COUNTS: dict[tuple[str, str], int] = {}  # (engine, site) -> failures in this process
_OBSERVER = observables.Observer({})
_REPORTED: list[Any] = []  # the meter providers the counter is registered on (few: no weak set needed)


def _observe() -> list[tuple[float, dict[str, Any]]]:
    with _LOCK:
        counts = list(_COUNTS.items())
    return [
        (n, {sc.LLM_INTEGRATION_ENGINE: engine, sc.LLM_INTEGRATION_SITE: site})
        for (engine, site), n in counts
    ]


def report_to(meter_provider: metrics.MeterProvider | None) -> None:
    """Observe ``otel_llm.integration.errors`` on ``meter_provider`` (None: the global one), once."""
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _LOCK:
        if any(known is provider for known in _REPORTED):
            return
        _REPORTED.append(provider)
    observables.observe(
        provider,
        _OBSERVER,
        sc.METRIC_INTEGRATION_ERRORS,
        sc.UNIT_ERROR,
        "Failures of otel_llm's engine integrations inside the engine, by engine and site",
        _observe,
        counter=True,
    )


def counts() -> dict[tuple[str, str], int]:
    """The failures counted so far in this process, by (engine, site)."""
    with _LOCK:
        return dict(_COUNTS)


class Faults:
    """One engine integration's failures: each counted, each site said once (with the engine's version),
    and, when ``stop`` is given and the failure would leave later telemetry incomplete, the stop.

    ``version``: the engine's installed version, read at the first failure (metadata, not an import).
    ``stop(site, why)``: uninstruments the integration and says so; called at most once per failure."""

    def __init__(
        self,
        engine: str,
        label: str,
        log: logging.Logger,
        version: Callable[[], str],
        stop: Callable[[str, str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.label = label  # the engine's name as a user writes it (vLLM, SGLang)
        self._log = log
        self._version = version
        self.stop_with = stop  # set by the integration once it has its state

    def version(self) -> str:
        try:
            return self._version()
        except Exception:
            return "of unknown version"

    def count(self, site: str) -> None:
        with _LOCK:
            key = (self.engine, site)
            _COUNTS[key] = _COUNTS.get(key, 0) + 1

    def failed(self, site: str, lost: str | None = None) -> None:
        """In an ``except`` block: the integration's step at ``site`` raised. ``lost``: what later
        telemetry would miss, so the integration stops; None: nothing later depends on it (said once)."""
        self.count(site)
        # Once per site in this process (the site is part of the message warn_once keys on).
        label = self.label
        message = f"otel_llm: the {label} integration failed in {site} ({label} %s); {label} is unaffected"
        warn_once(self._log, message, self.version(), exc_info=True)
        if lost is not None and self.stop_with is not None:
            self.stop_with(site, lost)

    def missing(self, site: str, message: str, *args: Any) -> None:
        """A target the integration needs is not in this engine: counted, ``message`` said once."""
        self.count(site)
        warn_once(self._log, message, *args)
