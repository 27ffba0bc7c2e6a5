"""``otel-llm serve --disaggregated``: the API process in front of a prefill and a decode worker.

The workers start first (the port opens once both are ready). On SIGTERM or Ctrl-C uvicorn lets open
connections finish for ``--graceful-timeout`` seconds, then the app's shutdown aborts what is left and
gives the workers ``OTEL_LLM_SHUTDOWN_TIMEOUT`` + 1 s to stop and flush their telemetry before ending them.
Each worker exports on its own and, as it stops, sends this process what it delivered and lost: over OTLP
the run ends with one line per worker and signal.
"""

from __future__ import annotations

import argparse
import socket
import sys
import uuid

from otel_llm.kit.commands._common import (
    SERVICE_INSTANCE_ID,
    destinations,
    run_dir,
    warn_if_unreachable,
    worker_delivery_lines,
)
from otel_llm.kit.commands.preflight import files_written


def run_disaggregated(args: argparse.Namespace, sock: socket.socket) -> int:
    """Start both workers, then serve on ``sock`` (bound to ``--host``/``--port``, not yet listening)."""
    from otel_llm.kit.engine import EngineConfig, ModelConfig
    from otel_llm.kit.engine.disaggregated import DisaggregatedEngine
    from otel_llm.kit.server import create_app, run_server
    from otel_llm.kit.server.disaggregated import DisaggregatedFront, shutdown_budget_s

    model = ModelConfig(seed=args.seed)

    def config(blocks: int | None) -> EngineConfig:
        return EngineConfig(
            model=model,
            num_kv_blocks=blocks or args.kv_blocks,
            device=args.device,
            step_spans=args.step_spans,
        )

    prefill, decode = config(args.prefill_kv_blocks), config(args.decode_kv_blocks)
    to_files = files_written()  # the environment was checked: destination() raises nothing here
    out = run_dir(args.output_dir, "serve")
    for line in destinations():
        print(f"otel-llm serve: {line}", file=sys.stderr, flush=True)
    warn_if_unreachable("serve")
    if to_files:
        print(f"otel-llm serve: files: {out / 'prefill'} and {out / 'decode'}", file=sys.stderr, flush=True)
    workers = DisaggregatedEngine(
        prefill,
        decode,
        output_dir=out,
        model=args.model_name,
        resource_attributes={SERVICE_INSTANCE_ID: uuid.uuid4().hex},
    )
    front = DisaggregatedFront(workers, prefill, decode)
    print("otel-llm serve: prefill and decode workers ready", file=sys.stderr, flush=True)

    def report() -> None:
        # After the workers stopped: what each one's exporters delivered and lost.
        for line in worker_delivery_lines(workers.delivery):
            print(f"otel-llm serve: {line}", file=sys.stderr, flush=True)
        if to_files:
            for path in sorted(out.glob("*/*.jsonl")):
                if path.stat().st_size > 0:
                    print(f"otel-llm serve: wrote {path}", file=sys.stderr, flush=True)

    app = create_app(front, model=args.model_name, on_shutdown=report, body_timeout_s=args.body_timeout)
    try:
        run_server(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            graceful_timeout_s=args.graceful_timeout,
            sock=sock,
        )
    finally:  # uvicorn never started: the app's shutdown did not run
        if not workers.closed:
            workers.close(timeout_s=shutdown_budget_s())
    return 0
