"""Replaying ``otel-llm demo``'s files into the real Collector: Jaeger shows every span as it was written.

The Collector's ``otlp_json_file`` receiver (``collector-config/local/otelcol-replay.yaml``) cannot be
built here: the Go module proxy serves no release of it that fits the tier's release train (see
tests/collector/README.md). The replay path a user has without it, ``examples/replay_files.py`` into the
Collector's OTLP/HTTP port, is run instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm import semconv as sc
from tests.collector.jaeger_view import trace_problems
from tests.collector.local_stack import REPO, LocalStack
from tests.otlp_receivers import GrpcReceiver, attributes

REQUESTS = 8
REPLAY = REPO / "examples" / "replay_files.py"


def written_spans(traces_jsonl: Path) -> dict[str, tuple[str, list]]:
    """trace id -> (service name, spans), parsed from the OTLP/JSON lines the way the replay parses them."""
    spec = importlib.util.spec_from_file_location("replay_files", REPLAY)
    assert spec and spec.loader
    replay = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay)
    traces: dict[str, tuple[str, list]] = {}
    for line in traces_jsonl.read_text().splitlines():
        request = replay.json_format.Parse(
            json.dumps(replay.hex_ids_to_base64(json.loads(line))), ExportTraceServiceRequest()
        )
        for rs in request.resource_spans:
            service = attributes(rs.resource.attributes)["service.name"]
            for ss in rs.scope_spans:
                for span in ss.spans:
                    traces.setdefault(span.trace_id.hex(), (service, []))[1].append(span)
    return traces


def test_replayed_demo_files_reach_jaeger_span_for_span(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    demo = subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", str(REQUESTS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    (run_dir,) = (tmp_path / "otel-llm-output").glob("demo-*")
    traces = written_spans(run_dir / "traces.jsonl")
    assert sum(s.name == sc.SPAN_REQUEST for _, spans in traces.values() for s in spans) == REQUESTS
    tempo = GrpcReceiver()
    tempo.start()
    stack = None
    try:
        stack = LocalStack(tmp_path, tempo.port)
        replayed = subprocess.run(
            [sys.executable, str(REPLAY), str(run_dir)],
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{stack.ports.otlp_http}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert trace_problems(stack.jaeger_url, traces) == []
    finally:
        if stack is not None:
            stack.stop()
        tempo.stop()
