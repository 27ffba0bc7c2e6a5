"""Which MeterProvider a tracker's metrics really reach, and what kind of provider it is.

API only: nothing here imports the SDK. A tracker may be created on OpenTelemetry's global proxy
provider before anything set a real one (``configure()``, ``opentelemetry-instrument``); the proxy then
forwards every instrument to the real provider once it is set. So the provider a tracker was given is
not always the one that collects its metrics, and both this module and the observables registry speak
of the *resolved* provider.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any, Literal

from opentelemetry import metrics

Kind = Literal["proxy", "noop", "sdk", "api"]


def global_proxy() -> Any:
    """The API's global proxy MeterProvider (an API internal; None if a later API moved it)."""
    internal = sys.modules.get("opentelemetry.metrics._internal")
    return getattr(internal, "_PROXY_METER_PROVIDER", None)


def is_proxy(provider: Any) -> bool:
    proxy = global_proxy()
    if proxy is not None:
        return provider is proxy
    return type(provider).__name__ == "_ProxyMeterProvider"


def resolve(provider: metrics.MeterProvider | None) -> Any:
    """The provider that collects: the global one for None or the proxy (still the proxy while no real
    provider is set), else ``provider`` itself."""
    if provider is None or is_proxy(provider):
        return metrics.get_meter_provider()
    return provider


def kind(provider: Any) -> Kind:
    """``proxy``: no real global provider yet; ``noop``; ``sdk``: the OpenTelemetry SDK's MeterProvider
    (or a subclass); ``api``: any other implementation of the API."""
    if is_proxy(provider):
        return "proxy"
    if isinstance(provider, metrics.NoOpMeterProvider):
        return "noop"
    sdk = sys.modules.get("opentelemetry.sdk.metrics")  # an SDK provider implies the SDK is imported
    if sdk is not None and isinstance(provider, sdk.MeterProvider):
        return "sdk"
    return "api"


# --- who contributes histograms to which provider -------------------------------------------------------
# Owners (one tracker's metrics each) register under the provider they were given: a real provider, or
# the proxy. A collection of real provider P takes the owners registered under P, plus those registered
# under the proxy when P is the global provider (the proxy feeds it). Held weakly: an owner that is gone
# stops contributing.

_OWNERS: dict[int, tuple[Any, list[Any]]] = {}  # id(provider) -> (weakref to provider, [weakref owner])
_OWNERS_LOCK = threading.Lock()


class _ProxyKey:
    """Stands for the proxy should a later API no longer expose it."""


_FALLBACK_PROXY_KEY = _ProxyKey()


def _proxy_key() -> Any:
    proxy = global_proxy()
    return proxy if proxy is not None else _FALLBACK_PROXY_KEY


def register_owner(provider: Any, owner: Any) -> None:
    """``owner`` (with a ``histogram_sources()`` method) contributes to ``provider``'s collections."""
    key = _proxy_key() if provider is None or is_proxy(provider) else provider
    with _OWNERS_LOCK:
        entry = _OWNERS.get(id(key))
        if entry is None or entry[0]() is not key:
            entry = _OWNERS[id(key)] = (weakref.ref(key), [])
        entry[1].append(weakref.ref(owner))


def owners_for(provider: Any) -> list[Any]:
    """The live owners whose histograms a collection of ``provider`` (a real provider) includes."""
    keys = [provider]
    if metrics.get_meter_provider() is provider:
        keys.append(_proxy_key())
    out: list[Any] = []
    with _OWNERS_LOCK:
        for key in keys:
            entry = _OWNERS.get(id(key))
            if entry is None or entry[0]() is not key:
                continue
            live = [o for o in (ref() for ref in entry[1]) if o is not None]
            if len(live) != len(entry[1]):
                entry[1][:] = [weakref.ref(o) for o in live]
            out.extend(live)
    return out


def _renew_lock_after_fork() -> None:
    global _OWNERS_LOCK  # a fork while a reader thread held it would leave the child's copy locked
    _OWNERS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_after_fork)
