"""collector-config/local/otelcol-tls.yaml: the overlay merged over otelcol.yaml serves OTLP over TLS.

The certificate is made by the very ``openssl`` command collector-config/README.md gives (self-signed for
localhost and 127.0.0.1); otel-llm trusts it through ``OTEL_EXPORTER_OTLP_CERTIFICATE``, as the README
tells a user, and its traces reach Jaeger.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from otel_llm import semconv as sc
from tests.collector.local_stack import LOCAL, LocalStack
from tests.collector.processes import get_json, poll
from tests.collector.test_local import otel_env
from tests.otlp_receivers import GrpcReceiver

REQUESTS = 4


def readme_certificate(directory: Path) -> tuple[Path, Path]:
    """Run the README's ``openssl req`` command in ``directory``; (certificate, key)."""
    readme = (LOCAL.parent / "README.md").read_text()
    (command,) = re.findall(r"^openssl req .*?[^\\]$", readme, re.M | re.S)
    done = subprocess.run(["sh", "-c", command], cwd=directory, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory / "collector.crt", directory / "collector.key"


def demo(stack: LocalStack, work: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", "demo", "--requests", str(REQUESTS)],
        cwd=work,
        env={**otel_env(stack, "otel-llm-demo-tls"), "OTEL_LLM_SHUTDOWN_TIMEOUT": "3", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_tls_overlay_takes_otlp_over_tls_with_the_users_certificate(tmp_path: Path) -> None:
    assert shutil.which("openssl"), "the README's certificate command needs openssl"
    cert, key = readme_certificate(tmp_path)
    tempo = GrpcReceiver()
    tempo.start()
    stack = None
    try:
        stack = LocalStack(tmp_path, tempo.port, tls=(cert, key))
        assert stack.otlp_grpc.startswith("https://")
        done = demo(stack, tmp_path, OTEL_EXPORTER_OTLP_CERTIFICATE=str(cert))
        assert done.returncode == 0, done.stdout + done.stderr
        found = poll(
            "Jaeger to show the demo's requests sent over TLS",
            lambda: get_json(
                f"{stack.jaeger_url}/api/traces",
                {"service": "otel-llm-demo-tls", "operation": sc.SPAN_REQUEST, "limit": "100"},
            )["data"],
            lambda traces: len(traces) == REQUESTS,
        )
        assert len(found) == REQUESTS
        # Plain text to the same port reaches nothing: the receiver speaks TLS only.
        before = len(tempo.collected.spans())
        plain = demo(stack, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=stack.otlp_grpc.replace("https", "http"))
        assert plain.returncode == 0, plain.stdout + plain.stderr
        # Nothing more reaches the Collector's exporters (a batch would have left within its 2 s timeout).
        assert not tempo.collected.wait_until(lambda c: len(c.spans()) > before, timeout_s=5)
    finally:
        if stack is not None:
            stack.stop()
        tempo.stop()
