"""A description of the machine and software a run measured (no file-system paths)."""

from __future__ import annotations

import os
import platform
from importlib import metadata

PACKAGES = (
    "otel-llm",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-grpc",
    "grpcio",
    "protobuf",
    "prometheus-client",
    "torch",
)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> list[str]:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    return [
        f"- CPU: {cpu_model()}, {os.cpu_count()} logical cores ({usable} usable by this process)",
        f"- OS: {platform.system()} {platform.release()} ({platform.machine()})",
        f"- Python: {platform.python_implementation()} {platform.python_version()}",
        f"- Packages: {', '.join(versions)}",
    ]
