"""A deprecated public name still works, and warns (docs/development.md, "Deprecations").

``PreAggregatedMetricExporter`` is kept until 0.3.0: making one raises a ``DeprecationWarning`` that points
at the caller's line, names the release that removes it and the module that does its work now; the
exporter it wraps still receives every export.
"""

from __future__ import annotations

import importlib
import json
import re
import warnings
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

from otel_llm.export.otlp_json import OtlpJsonMetricExporter


def test_the_pre_aggregated_exporter_warns_and_names_where_its_work_went(tmp_path: Path) -> None:
    from otel_llm.export.preaggregated import PreAggregatedMetricExporter

    inner = OtlpJsonMetricExporter(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapper = PreAggregatedMetricExporter(inner)
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert Path(warning.filename).resolve() == Path(__file__).resolve()  # the caller's line, not ours
    message = str(warning.message)
    assert "PreAggregatedMetricExporter" in message and "otel-llm 0.3.0" in message, message
    # The module it names is where the work is done now (an old message named one that never existed).
    named = re.findall(r"otel_llm(?:\.\w+)+", message)
    assert "otel_llm.emit.sdk_bridge" in named, message
    for module in named:
        if not module.endswith("PreAggregatedMetricExporter"):
            importlib.import_module(module)

    # Still a pass-through: a metric recorded through a provider reaches the wrapped exporter's file.
    reader = PeriodicExportingMetricReader(wrapper, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("test").create_counter("deprecations.test.count").add(3)
    assert provider.force_flush()
    provider.shutdown()
    lines = inner.path.read_text().splitlines()
    points = [
        point["asInt"]
        for line in lines
        for rm in json.loads(line)["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for metric in sm["metrics"]
        if metric["name"] == "deprecations.test.count"
        for point in metric["sum"]["dataPoints"]
    ]
    assert points and {int(p) for p in points} == {3}, lines
