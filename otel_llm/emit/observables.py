"""Observable instruments shared by every tracker on one meter provider.

The SDK keeps only the first instrument created under a name on a meter, and with it only the first
callbacks: a second tracker on the same provider (two models served by one process) would have its
observable counters and gauges silently ignored. So each provider gets each otel_llm observable once,
and its callback asks every live tracker registered on that provider for its observations. Trackers on
the global provider share one set, whether they were made before or after the real provider was set.
Trackers are held weakly: one that is gone stops reporting and is forgotten.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from otel_llm._version import __version__
from otel_llm.emit import meter_providers

_log = logging.getLogger("otel_llm")

# Yields (value, attributes) pairs at collection time; attributes exclude the owner's base attributes.
ObserveFn = Callable[[], Iterable[tuple[float, dict[str, Any]]]]


class Observer:
    """What an owner (one tracker's metrics) reports: base attributes and one callback per instrument."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = dict(base)
        self.callbacks: dict[str, ObserveFn] = {}


class _ProviderObservables:
    """The observers reporting to the otel_llm observable instruments of one meter provider.

    Holds no reference to the provider (it is the key of a weak mapping to this object).
    """

    def __init__(self) -> None:
        self.observers: dict[str, list[weakref.ref[Observer]]] = {}

    def register(
        self,
        provider: metrics.MeterProvider,
        observer: Observer,
        name: str,
        unit: str,
        description: str,
        counter: bool,
        gauge: bool = False,
    ) -> None:
        """Caller holds _LOCK."""
        refs = self.observers.get(name)
        if refs is None:
            refs = self.observers[name] = []
            meter = provider.get_meter("otel_llm", __version__)
            create: Callable[..., object]
            if gauge:
                create = meter.create_observable_gauge
            elif counter:
                create = meter.create_observable_counter
            else:
                create = meter.create_observable_up_down_counter
            create(name, callbacks=[self._callback(name)], unit=unit, description=description)
        refs.append(weakref.ref(observer))

    def _callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observations(options: CallbackOptions) -> Iterable[Observation]:
            with _LOCK:
                refs = self.observers[name]
                live = [o for o in (ref() for ref in refs) if o is not None]
                if len(live) != len(refs):
                    self.observers[name] = [weakref.ref(o) for o in live]
            out: list[Observation] = []
            for observer in live:
                try:
                    values = list(observer.callbacks[name]())
                except Exception:  # one tracker's trouble must not hide the others' values
                    _log.debug("otel_llm: observing %s failed", name, exc_info=True)
                    continue
                base = observer.base
                out.extend(Observation(value, {**base, **attrs}) for value, attrs in values)
            return out

        return observations


_LOCK = threading.Lock()


def _renew_lock_after_fork() -> None:
    global _LOCK  # a fork while the reader thread held it would leave the child's copy locked forever
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_after_fork)
_BY_PROVIDER: weakref.WeakKeyDictionary[Any, _ProviderObservables] = weakref.WeakKeyDictionary()


def observe(
    provider: metrics.MeterProvider,
    observer: Observer,
    name: str,
    unit: str,
    description: str,
    callback: ObserveFn,
    *,
    counter: bool,
    gauge: bool = False,
) -> None:
    """Report ``callback``'s values as instrument ``name`` of ``provider`` for as long as ``observer``
    lives (``gauge``: an observable gauge; else ``counter``: an observable counter, else an observable
    up-down counter)."""
    observer.callbacks[name] = callback
    with _LOCK:
        key = _key(provider)
        shared = _BY_PROVIDER.get(key)
        if shared is None:
            shared = _BY_PROVIDER[key] = _ProviderObservables()
        shared.register(key, observer, name, unit, description, counter, gauge)


def _key(provider: Any) -> Any:
    """The provider whose instruments ``provider``'s trackers share (caller holds _LOCK).

    Instruments created through the global proxy are forwarded to the real global provider once one is
    set, and that provider's meter keeps only the first instrument of a name: so a tracker on the
    global provider (given as the proxy or as the real object) joins the proxy's instruments when the
    proxy made some, and the real provider's otherwise."""
    proxy = meter_providers.global_proxy()
    current = metrics.get_meter_provider()
    if provider is proxy or provider is current:
        if proxy is not None and proxy in _BY_PROVIDER:
            return proxy
        return current
    return provider
