"""Every public module of the core says what it offers in ``__all__``, and offers exactly that.

The modules below are the ones a user imports (the README, docs/ and examples/ name them). Each defines
``__all__``; every name in it can be read from the module (also those a module's ``__getattr__`` loads on
first use, which ruff cannot see), and ``from module import *`` gives those names and no others.
"""

from __future__ import annotations

import importlib

import pytest

PUBLIC = [
    "otel_llm",
    "otel_llm.tracker",
    "otel_llm.setup",
    "otel_llm.semconv",
    "otel_llm.record",
    "otel_llm.emit.sampling",
    "otel_llm.export",
    "otel_llm.export.otlp_json",
    "otel_llm.export.telemetry",
    "otel_llm.export.preaggregated",
    "otel_llm.integrations",
    "otel_llm.integrations.vllm",
    "otel_llm.integrations.sglang",
    "otel_llm.integrations.sglang.adapter",
    "otel_llm.integrations.sglang.instrumentor",
    "otel_llm.integrations.transformers",
]


@pytest.mark.parametrize("name", PUBLIC)
def test_a_public_module_lists_what_it_offers(name: str) -> None:
    module = importlib.import_module(name)
    offered = getattr(module, "__all__", None)
    assert isinstance(offered, list), f"{name} has no __all__ list"
    assert len(offered) == len(set(offered)), f"{name}.__all__ names one twice: {offered}"
    missing = [n for n in offered if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"
    star: dict[str, object] = {}
    exec(f"from {name} import *", star)
    assert set(star) - {"__builtins__"} == set(offered)


def test_the_top_level_offers_the_hook_and_configure() -> None:
    import otel_llm

    assert {"RequestTracker", "configure", "TailSampling"} <= set(otel_llm.__all__)
    assert otel_llm.RequestTracker.__module__ == "otel_llm.tracker"
    assert otel_llm.configure.__module__ == "otel_llm.setup"
