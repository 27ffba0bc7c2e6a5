"""The global providers as users set them: ``opentelemetry-instrument``, ``configure()`` before or after
the tracker, ``set_meter_provider`` by hand. Each case runs in a fresh interpreter (OpenTelemetry's
globals can be set once per process), exporting over real OTLP to a loopback receiver where it can."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from otlp_receivers import HISTOGRAMS, HttpReceiver, attributes

from otel_llm import semconv as sc

REPO = Path(__file__).resolve().parents[1]

# Three requests of one model: queued at t, scheduled +0.1 s, tokens at +0.2 s and +0.3 s, the second
# request preempted and recomputed in between; finished at +0.4 s.
DRIVE = """
def drive(tracker, base):
    for i in range(3):
        rid, t = f"r{i}", base + i
        tracker.queued(rid, ts=t, prompt_tokens=5)
        tracker.scheduled([rid], ts=t + 0.1)
        tracker.tokens([rid], ts=t + 0.2)
        if i == 1:
            tracker.preempted([rid], ts=t + 0.22)
            tracker.scheduled([rid], ts=t + 0.25)
        tracker.tokens([rid], ts=t + 0.3)
        tracker.finished(rid, ts=t + 0.4)
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(OTEL_LOGS_EXPORTER="none", OTEL_METRIC_EXPORT_INTERVAL="600000", **extra)
    return env


def histogram_points(receiver: HttpReceiver) -> dict[str, list]:
    """The latest histogram point of each metric and attribute set over every metrics export (cumulative:
    the latest holds everything). A process may have two streams: a tracker made before configure()
    exports from the engine's process, one made after from the export process beside it."""
    latest: dict[tuple[str, tuple[Any, ...]], Any] = {}
    for r in receiver.collected.received("metrics"):
        for rm in r.request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.HasField("histogram"):
                        for p in metric.histogram.data_points:
                            key = (metric.name, tuple(sorted(attributes(p.attributes).items())))
                            latest[key] = p
    out: dict[str, list] = {}
    for (name, _), point in latest.items():
        out.setdefault(name, []).append(point)
    return out


@pytest.mark.parametrize("mode", ["process", "in_process"])
def test_opentelemetry_instrument_gets_traces_and_every_histogram(tmp_path: Path, mode: str) -> None:
    """Both export modes: in ``process`` (the default) the tracker on opentelemetry-instrument's providers
    sends its records to an export process configured from the same OTEL_* variables."""
    instrument = shutil.which("opentelemetry-instrument", path=str(Path(sys.executable).parent))
    if instrument is None:
        pytest.fail("opentelemetry-instrument is not installed: the dev extra brings opentelemetry-distro")
    app = tmp_path / "app.py"
    app.write_text(
        DRIVE
        + """
from otel_llm import RequestTracker
tracker = RequestTracker(model="zero-code")   # the providers opentelemetry-instrument set up
drive(tracker, 100.0)
tracker.force_flush(10_000)
from otel_llm.export import channel
print("export process:", channel._default is not None and channel._default.delivery()["requests"][0])
"""
    )
    with HttpReceiver() as receiver:
        env = child_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            OTEL_LLM_EXPORT_MODE=mode,
        )
        done = subprocess.run(
            [instrument, sys.executable, str(app)], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        # In process mode the export process reports the three requests done; in_process has none.
        expected = "export process: 3" if mode == "process" else "export process: False"
        assert expected in done.stdout, done.stdout
        assert receiver.collected.wait_until(lambda c: bool(c.metrics(sc.METRIC_TTFT)))
        points = histogram_points(receiver)
        roots = [s for _, s in receiver.collected.spans() if s.name == sc.SPAN_REQUEST]
    for name in HISTOGRAMS:
        assert name in points, (name, sorted(points))
    (ttft,) = points[sc.METRIC_TTFT]
    assert ttft.count == 3 and ttft.sum == pytest.approx(3 * 0.2)
    assert attributes(ttft.attributes)[sc.GEN_AI_REQUEST_MODEL] == "zero-code"
    (itl,) = points[sc.METRIC_ITL]
    assert itl.count == 3 and itl.sum == pytest.approx(3 * 0.1)
    (recompute,) = points[sc.METRIC_RECOMPUTE]
    assert recompute.count == 1 and recompute.sum == pytest.approx(0.05)
    assert len(roots) == 3


def run_child(code: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_trackers_before_and_after_configure_both_reach_the_collector() -> None:
    code = (
        DRIVE
        + """
import json
import otel_llm
from otel_llm import RequestTracker
before = RequestTracker(model="a")            # on the global proxy: nothing is configured yet
telemetry = otel_llm.configure()
after = RequestTracker(model="b")
drive(before, 100.0)
drive(after, 200.0)
print(json.dumps({"shutdown": telemetry.shutdown()}))
"""
    )
    with HttpReceiver() as receiver:
        env = child_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        assert run_child(code, env)["shutdown"]
        assert receiver.collected.wait_until(lambda c: bool(c.metrics(sc.METRIC_TTFT)))
        points = histogram_points(receiver)
        counters = {
            name: [
                (attributes(p.attributes), p.as_int or p.as_double)
                for _, m in receiver.collected.metrics(name)
                for p in m.sum.data_points
            ]
            for name in (sc.METRIC_REQUESTS, sc.METRIC_TOKENS)
        }
    for name in HISTOGRAMS:
        models = sorted(attributes(p.attributes)[sc.GEN_AI_REQUEST_MODEL] for p in points[name])
        assert models == ["a", "b"], (name, models)
    for name, values in counters.items():
        assert {a[sc.GEN_AI_REQUEST_MODEL] for a, _ in values} == {"a", "b"}, name
    requests = {a[sc.GEN_AI_REQUEST_MODEL]: v for a, v in counters[sc.METRIC_REQUESTS]}
    assert requests == {"a": 3, "b": 3}


def test_a_provider_set_by_hand_after_the_tracker_gets_its_histograms_at_the_first_collection() -> None:
    code = (
        DRIVE
        + """
import json
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otel_llm import RequestTracker
tracker = RequestTracker(model="early")
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
drive(tracker, 100.0)
data = reader.get_metrics_data()              # one collection, the first
found = {
    m.name: sum(p.count for p in m.data.data_points)
    for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    if hasattr(m.data.data_points[0], "bucket_counts")
}
print(json.dumps(found))
"""
    )
    found = run_child(code, child_env())
    for name in HISTOGRAMS:
        assert name in found, (name, found)
    assert found[sc.METRIC_TTFT] == 3 and found[sc.METRIC_ITL] == 3


def test_import_otel_llm_loads_neither_the_sdk_nor_protobuf() -> None:
    code = """
import json, sys
import otel_llm
from otel_llm import RequestTracker
RequestTracker(model="m")                     # a tracker on the global (proxy) providers, too
heavy = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk", "google.protobuf",
               "opentelemetry.exporter", "opentelemetry.proto", "grpc")))
print(json.dumps(heavy))
"""
    assert run_child(code, child_env()) == []
