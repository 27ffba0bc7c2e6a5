"""``otel-llm serve`` called with the official openai client, the client's span joined to the server's.

Runs the server (``otel-llm serve``) in a child process unless OPENAI_BASE_URL points at one already,
then sends one plain and one streamed request inside a client-side span. The W3C ``traceparent`` header
carries that span to the server, so ``llm.request`` is its child: one trace from caller to engine.

    pip install openai
    docker compose -f collector-config/local/compose.yaml up -d
    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4317 OTEL_EXPORTER_OTLP_PROTOCOL=grpc \\
        python examples/server_openai_client.py

Then paste the printed trace id into Jaeger (http://localhost:16686) or Grafana's Tempo search. With no
OTLP endpoint configured, both sides write OTLP JSON files into one new folder per run,
./otel-llm-output/openai-client-<date>-<time>-<pid>/ (under $OTEL_LLM_OUTPUT_DIR when set): this
client's span in its traces.jsonl, the server's run in a serve-* folder inside it; the script prints
the folder and the ``otel-llm view`` command for it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from openai import OpenAI
from opentelemetry import propagate, trace

import otel_llm

SMOKE = os.environ.get("OTEL_LLM_EXAMPLE_SMOKE") == "1"  # tests run every example small
MAX_TOKENS = 8 if SMOKE else 48


def run_folder() -> Path:
    """This run's own folder for the files of both sides (absolute: the server is told it too)."""
    base = os.environ.get("OTEL_LLM_OUTPUT_DIR", "").strip() or "otel-llm-output"
    return Path(base).absolute() / time.strftime(f"openai-client-%Y%m%d-%H%M%S-{os.getpid()}")


def start_server(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``otel-llm serve`` on a free loopback port; it reads the same OTEL_* variables as this script and,
    without an endpoint, writes its files into a run folder inside ``folder``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "otel_llm.kit.cli", "serve", "--port", str(port), "--kv-blocks", "16"]
    command += ["--output-dir", str(folder)]
    server = subprocess.Popen([*command, "--log-level", "warning"])
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/health", timeout=1).close()
            return server, base_url
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise SystemExit("otel-llm serve did not start") from None
            time.sleep(0.2)


def main() -> None:
    folder = run_folder()
    server, base_url = None, os.environ.get("OPENAI_BASE_URL", "").removesuffix("/v1")
    if not base_url:
        server, base_url = start_server(folder)
    telemetry = otel_llm.configure(service_name="openai-client-example", output_dir=folder)
    tracer = trace.get_tracer("examples.server_openai_client")
    client = OpenAI(base_url=f"{base_url}/v1", api_key="not-needed")
    try:
        with tracer.start_as_current_span("ask otel-llm", kind=trace.SpanKind.CLIENT) as span:
            headers: dict[str, str] = {}
            propagate.inject(headers)  # traceparent (and tracestate) of the span above
            raw = client.completions.with_raw_response.create(
                model="otel-llm-tiny", prompt="The KV cache", max_tokens=MAX_TOKENS, extra_headers=headers
            )
            print(f"completion: {raw.parse().choices[0].text!r}")
            stream = client.chat.completions.create(
                model="otel-llm-tiny",
                messages=[{"role": "user", "content": "Why do requests get preempted?"}],
                max_tokens=MAX_TOKENS,
                stream=True,
                extra_headers=headers,
            )
            print("chat: ", end="")
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    print(chunk.choices[0].delta.content, end="", flush=True)
            print()
        trace_id = format(span.get_span_context().trace_id, "032x")
        print(f"trace id {trace_id} (server says x-trace-id: {raw.headers.get('x-trace-id')})")
    finally:
        client.close()  # no idle keep-alive connection for the server to wait on
        # Both sides stop at once: the server flushes its telemetry while this process flushes its own,
        # so the example ends within one OTEL_LLM_SHUTDOWN_TIMEOUT (+ 1 s), even with the collector down.
        if server is not None:
            server.terminate()  # SIGTERM: uvicorn stops, the server flushes its telemetry on the way out
        telemetry.shutdown()
        if server is not None:
            server.wait(30)
    if telemetry.output_dir is None:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "the configured endpoint")
        print(f"traces: sent over OTLP to {endpoint}")
    elif server is None:
        print(f"files: {telemetry.output_dir} (this client's span; the server at {base_url} keeps its own)")
    else:
        print(f"files: {telemetry.output_dir} (this client's span; the server's run in a folder inside)")
        print(f"view the requests: otel-llm view {telemetry.output_dir} --list")


if __name__ == "__main__":
    main()
