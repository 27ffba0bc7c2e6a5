"""``otel-llm serve``: the reference engine behind an OpenAI-compatible HTTP API, exported via configure().

Telemetry goes where the OTEL_* environment says (``OTEL_EXPORTER_OTLP_ENDPOINT`` for a collector; no
endpoint: OTLP JSON files in ./otel-llm-output/). Callers that send a W3C ``traceparent`` header get
the ``llm.request`` span in their own trace; every answer names its trace in ``x-trace-id``.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve the reference engine over an OpenAI-compatible HTTP API")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--kv-blocks", type=int, default=64, help="KV cache blocks of 16 tokens (default 64)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--model-name", default="otel-llm-tiny", help="the model name clients must ask for")
    p.add_argument("--seed", type=int, default=0, help="seed of the model weights")
    p.add_argument("--step-spans", action="store_true", help="also emit one llm.engine.step span per step")
    p.add_argument("--log-level", default="info", help="uvicorn log level (default info)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from otel_llm.server import create_app
    except ImportError as exc:
        raise SystemExit(
            f"otel-llm serve needs fastapi and uvicorn: pip install 'otel-llm[serve]' ({exc})"
        ) from None

    import otel_llm
    from otel_llm.engine import EngineConfig, LLMEngine, ModelConfig

    config = EngineConfig(
        model=ModelConfig(seed=args.seed),
        num_kv_blocks=args.kv_blocks,
        device=args.device,
        step_spans=args.step_spans,
    )
    telemetry = otel_llm.configure(service_name="otel-llm-serve")
    tracker = otel_llm.RequestTracker(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        model=args.model_name,
    )
    engine = LLMEngine(
        config,
        tracker=tracker,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    flushed = False

    def flush() -> None:
        nonlocal flushed
        if not flushed:
            flushed = True
            tracker.force_flush()
            telemetry.shutdown()

    # The app flushes on its way down: after SIGTERM uvicorn re-raises the signal and ends the process
    # before uvicorn.run() returns; the ``finally`` covers a server that never started.
    app = create_app(engine, model=args.model_name, on_shutdown=flush)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        flush()
    return 0
