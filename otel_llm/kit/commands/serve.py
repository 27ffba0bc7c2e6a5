"""``otel-llm serve``: the reference engine behind an OpenAI-compatible HTTP API, exported via configure().

Telemetry goes where the OTEL_* environment says (``OTEL_EXPORTER_OTLP_ENDPOINT`` for a collector; no
endpoint: OTLP JSON files in ./otel-llm-output/). Callers that send a W3C ``traceparent`` header get
the ``llm.request`` span in their own trace; every answer names its trace in ``x-trace-id``.

``--disaggregated`` runs the engine as a prefill worker process and a decode worker process (their KV
sent over a Unix socket) behind this API process, which routes (``otel_llm.kit.server.disaggregated``). Each
worker exports its own telemetry (files: ``<run folder>/prefill/`` and ``<run folder>/decode/``); the
API process exports none.
"""

from __future__ import annotations

import argparse
import sys

from otel_llm.kit.commands import env_check
from otel_llm.kit.commands._common import (
    LOG_LEVELS,
    check_device,
    configure_run,
    delivery_lines,
    destinations,
    device_name,
    log_level,
    need_extras,
    positive_int,
    seconds,
    seed,
    tcp_port,
    usage_error,
    warn_if_unreachable,
    written_files,
)
from otel_llm.kit.commands.preflight import PortUnusable, bind_port, output_folder_problem

# How long a stopping server lets open connections finish before it closes them; then telemetry gets its
# own bounded flush. 5 + OTEL_LLM_SHUTDOWN_TIMEOUT (5) + 1 s stays well inside Kubernetes' 30 s grace.
DEFAULT_GRACEFUL_TIMEOUT_S = 5.0
# A request body that has not fully arrived after this long is answered 408 (a client stalled mid-body).
DEFAULT_BODY_TIMEOUT_S = 30.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the reference engine over an OpenAI-compatible HTTP API",
        description="Serve the reference torch engine over an OpenAI-compatible HTTP API "
        "(/v1/completions, /v1/chat/completions, /v1/models), every request traced. Without an endpoint, "
        "telemetry goes to OTLP JSON files in a new run folder; Ctrl-C or SIGTERM stops it.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=tcp_port, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument(
        "--kv-blocks", type=positive_int, default=64, help="KV cache blocks of 16 tokens (default 64)"
    )
    p.add_argument(
        "--disaggregated",
        action="store_true",
        help="run a prefill worker process and a decode worker process; this process routes",
    )
    p.add_argument(
        "--prefill-kv-blocks",
        type=positive_int,
        default=None,
        help="with --disaggregated: the prefill worker's KV cache blocks (default --kv-blocks)",
    )
    p.add_argument(
        "--decode-kv-blocks",
        type=positive_int,
        default=None,
        help="with --disaggregated: the decode worker's KV cache blocks (default --kv-blocks)",
    )
    p.add_argument("--device", type=device_name, default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--model-name", default="otel-llm-tiny", help="the model name clients must ask for")
    p.add_argument("--seed", type=seed, default=0, help="seed of the model weights")
    p.add_argument("--step-spans", action="store_true", help="also emit one llm.engine.step span per step")
    p.add_argument(
        "--log-level",
        type=log_level,
        default="info",
        help=f"uvicorn's log level: {', '.join(LOG_LEVELS)} (default info)",
    )
    p.add_argument(
        "--output-dir",
        default=None,
        help="folder under which this run's OTLP JSON files go, in a new <serve-time-pid> folder "
        "(no endpoint set; default ./otel-llm-output)",
    )
    p.add_argument(
        "--graceful-timeout",
        type=seconds,
        default=DEFAULT_GRACEFUL_TIMEOUT_S,
        help=f"seconds open connections get to finish on shutdown (default {DEFAULT_GRACEFUL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--body-timeout",
        type=seconds,
        default=DEFAULT_BODY_TIMEOUT_S,
        help=f"seconds a request body may take to arrive, else 408 (default {DEFAULT_BODY_TIMEOUT_S:g})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Everything that can be found wrong without the model is, before torch is imported; the port is
    # bound now (listened on once the model is up), so a port in use costs no model load and no run folder.
    if not args.disaggregated and (args.prefill_kv_blocks is not None or args.decode_kv_blocks is not None):
        usage_error("serve", "--prefill-kv-blocks and --decode-kv-blocks need --disaggregated")
    env_check.check("serve")
    need_extras("serve", "torch", "serve")
    try:
        sock = bind_port(args.host, args.port)
    except PortUnusable as exc:
        usage_error("serve", exc)
    args.port = sock.getsockname()[1]  # the one asked for, or the free one --port 0 got
    problem = output_folder_problem(args.output_dir)
    if problem is not None:
        usage_error("serve", problem)
    from otel_llm.kit.server import create_app, run_server

    problem = check_device(args.device)
    if problem is not None:
        usage_error("serve", problem)
    if args.disaggregated:
        from otel_llm.kit.commands.serve_disaggregated import run_disaggregated

        return run_disaggregated(args, sock)

    import otel_llm
    from otel_llm.kit.engine import EngineConfig, LLMEngine, ModelConfig
    from otel_llm.kit.server.operations import OperationTrackers
    from otel_llm.server_attributes import server_attributes

    config = EngineConfig(
        model=ModelConfig(seed=args.seed),
        num_kv_blocks=args.kv_blocks,
        device=args.device,
        step_spans=args.step_spans,
    )
    telemetry = configure_run("serve", args.output_dir)
    for line in destinations():
        print(f"otel-llm serve: {line}", file=sys.stderr, flush=True)
    warn_if_unreachable("serve", telemetry)
    if telemetry.output_dir is not None:
        print(f"otel-llm serve: files: {telemetry.output_dir}", file=sys.stderr, flush=True)
    # A tracker per GenAI operation: /v1/chat/completions is `chat`, /v1/completions `text_completion`.
    tracker = OperationTrackers(
        lambda operation: otel_llm.RequestTracker(
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
            model=args.model_name,
            operation_name=operation,
            attributes=server_attributes(args.host, args.port, args.model_name),
        )
    )
    engine = LLMEngine(
        config,
        tracker=tracker,
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    stopped = False

    def stop_telemetry() -> None:
        # One bounded step flushes and stops both providers (OTEL_LLM_SHUTDOWN_TIMEOUT, + 1 s at most).
        nonlocal stopped
        if not stopped:
            stopped = True
            telemetry.shutdown()
            for line in delivery_lines(telemetry):
                print(f"otel-llm serve: {line}", file=sys.stderr, flush=True)
            for path in written_files(telemetry):
                print(f"otel-llm serve: wrote {path}", file=sys.stderr, flush=True)

    # The app stops telemetry on its way down: after SIGTERM uvicorn re-raises the signal and ends the
    # process before uvicorn.run() returns; the ``finally`` covers a server that never started.
    app = create_app(
        engine, model=args.model_name, on_shutdown=stop_telemetry, body_timeout_s=args.body_timeout
    )
    try:
        run_server(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            graceful_timeout_s=args.graceful_timeout,
            sock=sock,
        )
    finally:
        stop_telemetry()
    return 0
