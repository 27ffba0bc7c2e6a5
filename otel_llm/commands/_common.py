"""What the subcommands share: argument types that reject bad values cleanly, telemetry set-up for one
run (its own output folder, a clear message for bad OTEL_* values), and saying where telemetry went.

Nothing here imports torch or rich, so ``otel-llm --help`` works on the core install.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path
from typing import Any

SERVICE_INSTANCE_ID = "service.instance.id"  # the run id on every span and metric of one run


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small: pass 1 or more")
    return value


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, 0 (pick a free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port: pass 0 (any free port) to 65535")
    return value


def check_device(device: str) -> str | None:
    """None when torch can run on ``device`` (cpu, cuda, cuda:N), else what is wrong, in words."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        return f"--device {device!r} is not a device: pass cpu, cuda or cuda:N"
    if parsed.type == "cpu":
        return None
    if parsed.type != "cuda":
        return f"--device {device!r}: the reference engine runs on cpu or cuda (cuda:N)"
    if not torch.cuda.is_available():
        return f"--device {device!r}: this machine (or this torch build) has no CUDA device; use --device cpu"
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        return f"--device {device!r}: there are {torch.cuda.device_count()} CUDA devices (cuda:0 ...)"
    return None


def need_torch(command: str) -> None:
    """Exit with the install line when torch (the reference engine's extra) is missing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"otel-llm {command} runs the reference engine, which needs torch: "
            "pip install torch==2.13.0 && pip install 'otel-llm[torch]'"
        ) from None


def run_dir(parent: str | os.PathLike[str] | None, command: str) -> Path:
    """A fresh folder for this run's files, ``<parent>/<command>-<YYYYmmdd-HHMMSS>-<pid>``.

    ``parent`` defaults to ``OTEL_LLM_OUTPUT_DIR``, else ``./otel-llm-output``. A new folder per run keeps
    runs apart: request ids repeat across runs, and two servers never write into one file.
    """
    from otel_llm.setup import DEFAULT_OUTPUT_DIR, ENV_OUTPUT_DIR

    base = parent
    if base is None:
        base = os.environ.get(ENV_OUTPUT_DIR, "").strip() or DEFAULT_OUTPUT_DIR
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(base).expanduser().absolute() / f"{command}-{stamp}-{os.getpid()}"


def configure_run(command: str, output_dir: str | os.PathLike[str] | None) -> Any:
    """``otel_llm.configure()`` for one CLI run, or exit with the configuration problem in one line."""
    import otel_llm

    try:
        return otel_llm.configure(
            service_name=f"otel-llm-{command}",
            output_dir=run_dir(output_dir, command),
            set_global=False,
            resource_attributes={SERVICE_INSTANCE_ID: uuid.uuid4().hex},
        )
    except ValueError as exc:
        raise SystemExit(f"otel-llm {command}: {exc}") from None


def destinations() -> list[str]:
    """Where each signal goes under the current OTEL_* environment, one line each (before it is sent)."""
    from otel_llm.export import otlp

    lines = []
    for signal in ("traces", "metrics"):
        to = otlp.destination(signal)  # type: ignore[arg-type]
        if to == "otlp":
            url = (
                os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT", "").strip()
                or os.environ.get(otlp.ENV_ENDPOINT, "").strip()
            )
            lines.append(f"{signal}: OTLP {otlp.protocol(signal)} to {url}")  # type: ignore[arg-type]
        elif to == "none":
            lines.append(f"{signal}: not exported ({signal.upper()} exporter is none)")
    return lines


def written_files(telemetry: Any) -> list[Path]:
    """This run's OTLP JSON files that exist and hold data (call after ``telemetry.shutdown()``)."""
    if telemetry.output_dir is None:
        return []
    found = [Path(telemetry.output_dir) / name for name in ("traces.jsonl", "metrics.jsonl")]
    return [p for p in found if p.is_file() and p.stat().st_size > 0]
