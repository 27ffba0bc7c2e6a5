"""An OTLP gRPC receiver in its own process (as a collector would be), counting what it decoded.

Run as ``python -m benchmarks.receiver``: it prints its port, then answers each line on stdin:
``spans`` -> the number of spans received so far; ``itl`` -> the latest inter-token-latency histogram
point as JSON (bucket counts and count); ``quit`` -> stops. The receiver itself is the project's test
receiver (official opentelemetry-proto messages over grpcio).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from otel_llm import semconv as sc


def _itl(collected: Any) -> dict[str, Any]:
    points = [p for _, metric in collected.metrics(sc.METRIC_ITL) for p in metric.histogram.data_points]
    if not points:
        return {}
    latest = max(points, key=lambda p: (p.count, p.time_unix_nano))
    return {
        "count": latest.count,
        "bucket_counts": list(latest.bucket_counts),
        "bounds": list(latest.explicit_bounds),
    }


def main() -> None:
    from tests.otlp_receivers import GrpcReceiver

    with GrpcReceiver() as receiver:
        print(receiver.port, flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "spans":
                print(len(receiver.collected.spans()), flush=True)
            elif command == "itl":
                print(json.dumps(_itl(receiver.collected)), flush=True)
            elif command == "quit":
                break


if __name__ == "__main__":
    main()
