"""Replay the embedded default's OTLP JSON files into a collector over OTLP/HTTP.

With no OTLP endpoint configured, otel_llm writes traces.jsonl and metrics.jsonl, one OTLP export
request per line (OTLP/JSON: protobuf JSON with trace and span ids in hex), into a run folder such as
./otel-llm-output/demo-<date>-<time>-<pid>/. This script turns each line back into the protobuf request
and POSTs it to the collector, which passes it on to Jaeger, Tempo and Prometheus as if it had just been
exported:

    docker compose -f collector-config/local/compose.yaml up -d
    python examples/replay_files.py                     # or: python examples/replay_files.py DIR
    (DIR: a run folder of otel-llm demo / serve or of an example, sent with every file below it, e.g. a
    disaggregated run's prefill/ and decode/; without DIR, the newest run folder in ./otel-llm-output,
    or $OTEL_LLM_OUTPUT_DIR, and it says which)

It posts to $OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces and /v1/metrics (default http://localhost:4318, the
collector's OTLP/HTTP port). Spans keep their original timestamps: search Jaeger at the time they ran.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

SIGNALS: dict[str, type[Message]] = {
    "traces": ExportTraceServiceRequest,
    "metrics": ExportMetricsServiceRequest,
}
ID_FIELDS = {"traceId", "spanId", "parentSpanId"}  # hex in OTLP/JSON, base64 in protobuf's JSON mapping


def hex_ids_to_base64(node: Any) -> Any:
    """The one difference between OTLP/JSON and the protobuf JSON mapping, undone in place."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            hex_ids_to_base64(item)
    return node


# Answers meaning "this backend takes no such signal" (a trace-only backend asked for metrics): the
# signal is reported as not taken, not as a failure of the replay.
NOT_TAKEN = {404, 405, 415, 501}


def replay(path: Path, message_type: type[Message], url: str) -> tuple[int, int, str | None]:
    """POST every line of ``path`` to ``url``: (requests accepted, requests failed, why the backend does
    not take this signal at all, or None)."""
    sent = failed = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        request = json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(line))), message_type())
        post = urllib.request.Request(
            url, data=request.SerializeToString(), headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(post, timeout=10):
                sent += 1
        except urllib.error.HTTPError as exc:
            if sent == 0 and exc.code in NOT_TAKEN:
                return 0, 0, f"HTTP {exc.code} {exc.reason}"
            failed += 1
            print(f"{path}:{number}: {url} refused it: HTTP {exc.code} {exc.reason}", file=sys.stderr)
        except OSError as exc:
            failed += 1
            print(f"{path}:{number}: could not send it to {url}: {exc}", file=sys.stderr)
    return sent, failed, None


def signal_folders(directory: Path) -> list[Path]:
    """The folders at or below ``directory`` holding a traces.jsonl or metrics.jsonl, shallowest first."""
    found = {f.parent for signal in SIGNALS for f in directory.rglob(f"{signal}.jsonl")}
    return sorted(found, key=lambda f: (len(f.parts), str(f)))


def newest_run(directory: Path) -> Path | None:
    """A folder of run folders (./otel-llm-output): the run folder written to last; None for a run
    folder itself (files of its own, or a disaggregated run's prefill/ and decode/)."""
    if any((directory / f"{signal}.jsonl").exists() for signal in SIGNALS):
        return None
    if any((directory / role).is_dir() for role in ("prefill", "decode")):
        return None
    runs = [child for child in directory.iterdir() if child.is_dir() and signal_folders(child)]

    def written(run: Path) -> float:  # the last write into any of its files
        return max(f.stat().st_mtime for folder in signal_folders(run) for f in folder.glob("*.jsonl"))

    return max(runs, key=written) if runs else None


def main() -> int:
    directory = Path(
        sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OTEL_LLM_OUTPUT_DIR", "otel-llm-output")
    )
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318").rstrip("/")
    run = newest_run(directory) if directory.is_dir() else None
    if run is not None:
        count = sum(1 for c in directory.iterdir() if c.is_dir() and signal_folders(c))
        which = "its run folder" if count == 1 else f"the newest of its {count} run folders"
        print(f"{directory}: replaying {which}, {run.name} (pass a run folder as DIR to pick)")
        directory = run
    # A run folder and everything below it: a disaggregated run's prefill/ and decode/, a server's run.
    folders = signal_folders(directory) if directory.is_dir() else []
    found, delivered, failures = False, 0, 0
    for folder, (signal, message_type) in ((f, s) for f in folders for s in SIGNALS.items()):
        path = folder / f"{signal}.jsonl"
        inner = folder.relative_to(directory)
        label = signal if len(folders) == 1 else f"{inner if inner.parts else '.'} {signal}"
        if not path.exists():
            print(f"{label}: no {path}")
            continue
        found = True
        url = f"{endpoint}/v1/{signal}"
        sent, failed, not_taken = replay(path, message_type, url)
        delivered += sent
        failures += failed
        if not_taken is not None:
            print(f"{label}: not taken by {url} ({not_taken}: the backend does not accept {signal}?)")
        else:
            print(f"{label}: {sent} export requests accepted by {url}, {failed} failed")
    if not found:
        runs = sorted(p.name for p in directory.glob("*-*") if p.is_dir()) if directory.is_dir() else []
        hint = (
            f"pass one of its run folders: {', '.join(runs)}"
            if runs
            else "run something that uses otel_llm first"
        )
        print(f"no traces.jsonl or metrics.jsonl in {directory}; {hint}", file=sys.stderr)
    # Success: something was delivered and nothing failed (a signal the backend does not take is neither).
    return 0 if delivered and not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
