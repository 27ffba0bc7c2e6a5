"""configure() and OpenTelemetry's declarative configuration file (``OTEL_CONFIG_FILE``).

Where the installed SDK can read the file (the opentelemetry-configuration package), the providers come
from it: a real YAML file whose OTLP/HTTP exporters point at a loopback receiver, with a sampler and a
view, while ``OTEL_EXPORTER_OTLP_ENDPOINT`` points elsewhere (the file wins). Where it cannot, configure()
says so in one line and uses the ``OTEL_*`` variables; that case runs in a child process in which a
meta-path finder makes the package missing for real.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from otlp_receivers import HttpReceiver, closed_port, drive_scenario

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm.setup import configure

ROOT = Path(__file__).resolve().parent.parent

CONFIG = """
file_format: "1.0"
resource:
  attributes:
    - name: service.name
      value: from-the-file
tracer_provider:
  processors:
    - simple:
        exporter:
          otlp_http:
            endpoint: {endpoint}/v1/traces
  sampler:
    trace_id_ratio_based:
      ratio: 1.0
meter_provider:
  readers:
    - periodic:
        interval: 600000
        exporter:
          otlp_http:
            endpoint: {endpoint}/v1/metrics
  views:
    - selector:
        instrument_name: {ttft}
      stream:
        aggregation:
          explicit_bucket_histogram:
            boundaries: [0.5, 5.0]
"""


def test_the_file_builds_the_providers(env, tmp_path: Path, caplog) -> None:
    pytest.importorskip("opentelemetry.configuration.file", reason="the SDK's declarative configuration")
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    with HttpReceiver() as receiver:
        path = tmp_path / "otel.yaml"
        path.write_text(CONFIG.format(endpoint=receiver.endpoint, ttft=sc.METRIC_TTFT))
        env.setenv("OTEL_CONFIG_FILE", str(path))
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")  # not used
        with caplog.at_level(logging.WARNING, logger="otel_llm"):
            telemetry = configure(service_name="fallback", set_global=False, shutdown_timeout_s=5)
        assert not caplog.records, caplog.text
        assert isinstance(telemetry.tracer_provider.sampler, TraceIdRatioBased)  # the file's sampler
        tracker = RequestTracker(
            tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        )
        drive_scenario(tracker, time.monotonic() - 5.0)
        assert telemetry.shutdown()
        spans = receiver.collected.spans()
        assert sc.SPAN_REQUEST in {span.name for _, span in spans}
        names = {a.key: a.value.string_value for r, _ in spans[:1] for a in r.attributes}
        assert names["service.name"] == "from-the-file"  # the file's resource beats the fallback
        ttft = receiver.collected.metrics(sc.METRIC_TTFT)
        assert ttft, "no TTFT metric reached the file's metric exporter"
        bounds = {tuple(p.explicit_bounds) for _, m in ttft for p in m.histogram.data_points}
        assert bounds == {(0.5, 5.0)}  # the file's view
    assert not (tmp_path / "otel-llm-output").exists()  # no file fallback either


def test_a_bad_file_is_a_value_error_naming_the_variable(env, tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.configuration.file", reason="the SDK's declarative configuration")
    env.setenv("OTEL_CONFIG_FILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match=r"^OTEL_CONFIG_FILE="):
        configure(set_global=False)


_WITHOUT = """
import logging, sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry.configuration" or name.startswith("opentelemetry.configuration."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
logging.basicConfig(format="%(levelname)s %(message)s")
import otel_llm
telemetry = otel_llm.configure(set_global=False)
print("files:", telemetry.output_dir)
telemetry.shutdown()
"""


def test_without_support_it_says_so_in_one_line_and_uses_the_variables(tmp_path: Path) -> None:
    path = tmp_path / "otel.yaml"
    path.write_text(CONFIG.format(endpoint="http://127.0.0.1:1", ttft=sc.METRIC_TTFT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_CONFIG_FILE=str(path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "OTEL_CONFIG_FILE" in line]
    assert len(said) == 1 and "OTEL_* variables" in said[0], done.stderr
    assert "files: " in done.stdout and "otel-llm-output" in done.stdout  # the variables' default


def test_the_cli_says_the_file_decides_and_sends_where_it_says(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.configuration.file", reason="the SDK's declarative configuration")
    pytest.importorskip("torch", reason="the demo runs the reference engine")
    with HttpReceiver() as receiver:
        path = tmp_path / "otel.yaml"
        path.write_text(CONFIG.format(endpoint=receiver.endpoint, ttft=sc.METRIC_TTFT))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(OTEL_CONFIG_FILE=str(path), PYTHONPATH=str(ROOT), OTEL_LLM_SHUTDOWN_TIMEOUT="5")
        done = subprocess.run(
            [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", "2"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr
        assert f"traces and metrics: where OTEL_CONFIG_FILE={path} says" in done.stdout, done.stdout
        assert "OTLP" not in done.stdout and "traces.jsonl" not in done.stdout, done.stdout
        assert sc.SPAN_REQUEST in {span.name for _, span in receiver.collected.spans()}
