"""Start vllm-router with its OpenTelemetry tracing on: run with ``.venv-router``'s Python.

The ``vllm-router`` command has no flag for tracing, but the ``Router`` class it wraps takes
``enable_trace=`` and ``otlp_traces_endpoint=`` (OTLP/gRPC). This is the call docs/fleet.md shows, with
the tier's few settings as arguments. ``Router.start()`` blocks until the process is stopped.

    python start_router.py --port 30000 --policy cache_aware --otlp http://127.0.0.1:4317 \
        http://127.0.0.1:8001 http://127.0.0.1:8002
"""

from __future__ import annotations

import argparse

from vllm_router import Router
from vllm_router.router import policy_from_str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workers", nargs="+", help="the vllm serve instances' base URLs")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--policy", default="cache_aware", help="round_robin, cache_aware, ...")
    parser.add_argument("--otlp", required=True, help="OTLP/gRPC endpoint for the router's spans")
    parser.add_argument(
        "--health-interval-s", type=int, default=60, help="seconds between the router's health checks"
    )
    args = parser.parse_args()
    router = Router(
        worker_urls=args.workers,
        policy=policy_from_str(args.policy),
        host="127.0.0.1",
        port=args.port,
        enable_trace=True,
        otlp_traces_endpoint=args.otlp,
        health_check_interval_secs=args.health_interval_s,
    )
    router.start()


if __name__ == "__main__":
    main()
