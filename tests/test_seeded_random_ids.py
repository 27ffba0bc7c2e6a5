"""Trace and span ids do not follow the ``random`` module's seed.

Engines seed it for reproducible sampling (vLLM calls ``random.seed(0)`` by default in the process that
runs its engine core); the SDK's default id generator draws from it, so every process seeded alike drew
the same ids, and the two instances of a disaggregated pair gave spans of one trace the same span id
(seen with two in-process vLLM engines). ``configure()``'s provider and otel_llm's own ids use a
generator of their own.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from otel_llm import RequestTracker, configure
from otel_llm.hooks.identity import new_span_id, new_trace_id


def draws(seed: int, draw: Callable[[], object]) -> list[object]:
    random.seed(seed)
    return [draw() for _ in range(4)]


def test_the_sdk_default_follows_the_seed_which_is_the_bug() -> None:
    """The premise: without our generator, a seeded process repeats its ids (the test could fail)."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    gen = RandomIdGenerator()
    assert draws(0, gen.generate_trace_id) == draws(0, gen.generate_trace_id)


def test_configured_provider_ids_ignore_the_seed(tmp_path: Path) -> None:
    telemetry = configure(service_name="seeded", output_dir=str(tmp_path), set_global=False)
    try:
        gen = telemetry.tracer_provider.id_generator
        assert draws(0, gen.generate_trace_id) != draws(0, gen.generate_trace_id)
        assert draws(0, gen.generate_span_id) != draws(0, gen.generate_span_id)
        tracker = RequestTracker(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        )
        random.seed(0)
        tracker.queued("a")
        random.seed(0)
        tracker.queued("b")
        assert tracker.traceparent("a") != tracker.traceparent("b")
    finally:
        telemetry.shutdown(timeout_s=2)


def test_own_ids_ignore_the_seed() -> None:
    assert draws(0, new_trace_id) != draws(0, new_trace_id)
    assert draws(0, new_span_id) != draws(0, new_span_id)
