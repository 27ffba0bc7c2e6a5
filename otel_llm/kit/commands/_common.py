"""What the subcommands share: argument types that reject bad values cleanly, telemetry set-up for one
run (its own output folder), and saying where telemetry went (or that it is off).

Nothing here imports torch or rich, so ``otel-llm --help`` works on the core install.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

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


def seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds: pass e.g. 5")
    return value


# What torch.manual_seed() takes: a 64-bit seed, signed or not.
SEED_RANGE = (-(2**63), 2**64 - 1)


def seed(text: str) -> int:
    """argparse type: a seed torch takes (a 64-bit whole number)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} does not fit in 64 bits: pass 0 to {high}")
    return value


# The devices the reference engine runs on, as torch spells them.
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


def device_name(text: str) -> str:
    """argparse type: ``cpu``, ``cuda`` or ``cuda:N``, checked by spelling alone (torch is not imported:
    whether this machine has that device is ``check_device``'s question, once torch is loaded)."""
    value = text.strip().lower()
    if not _DEVICE.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: pass cpu, cuda or cuda:N")
    return value


# uvicorn's log levels, most to least severe (uvicorn.config.LOG_LEVELS).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def log_level(text: str) -> str:
    """argparse type: one of ``LOG_LEVELS``, in any case (as uvicorn reads them)."""
    value = text.strip().lower()
    if value not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level: pass {', '.join(LOG_LEVELS)}")
    return value


def check_device(device: str) -> str | None:
    """None when torch can run on ``device`` (``device_name``'s spelling) here, else what is wrong."""
    import torch

    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        return f"--device {device}: this machine (or this torch build) has no CUDA device; use --device cpu"
    index = torch.device(device).index
    if index is not None and index >= torch.cuda.device_count():
        return f"--device {device}: there are {torch.cuda.device_count()} CUDA devices (cuda:0 ...)"
    return None


# The modules each extra of pyproject.toml brings, as the CLI needs them (numpy: torch warns without it).
EXTRA_MODULES = {"torch": ("torch", "numpy", "rich"), "serve": ("fastapi", "uvicorn")}


def install_line(extras: Sequence[str], with_torch: bool) -> str:
    """The install command for ``extras``, as it works from a clone of the repository (no index has it).

    torch first, pinned, as the README installs it: that takes the build the tests run on.
    """
    line = f"pip install -e '.[{','.join(extras)}]'"
    return f"pip install torch==2.13.0 && {line}" if with_torch else line


def need_extras(command: str, *extras: str) -> None:
    """Exit naming every missing module of ``extras`` at once, with the one install line for all of them.

    Looks the modules up without importing them, so the check costs nothing when they are there.
    """
    missing = {extra: [m for m in EXTRA_MODULES[extra] if not _installed(m)] for extra in extras}
    names = [m for modules in missing.values() for m in modules]
    if not names:
        return
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    wanted = [extra for extra in extras if missing[extra]]
    raise SystemExit(
        f"otel-llm {command} needs {listed}, not installed here: in the otel-llm checkout, run "
        f"{install_line(wanted, with_torch='torch' in names)}"
    )


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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


def usage_error(command: str, message: object) -> NoReturn:
    """Exit as argparse does for a bad flag: one ``otel-llm COMMAND: error: ...`` line, status 2."""
    print(f"otel-llm {command}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def configure_run(command: str, output_dir: str | os.PathLike[str] | None) -> Any:
    """``otel_llm.configure()`` for one CLI run, or exit with the configuration problem in one line."""
    import otel_llm
    from otel_llm.export import quiet

    try:
        return otel_llm.configure(
            service_name=f"otel-llm-{command}",
            output_dir=run_dir(output_dir, command),
            set_global=False,
            resource_attributes={SERVICE_INSTANCE_ID: uuid.uuid4().hex},
            # The run reports what was delivered and lost itself: the exporters' own lines are counted
            # (the summary gives the number), unless OTEL_LLM_EXPORTER_LOGS=show asks for them.
            exporter_logs=os.environ.get(quiet.ENV_EXPORTER_LOGS, "").strip().lower() or quiet.COUNT,
        )
    except ValueError as exc:
        usage_error(command, exc)


def sdk_disabled() -> bool:
    """Whether ``OTEL_SDK_DISABLED`` turns telemetry off (read as ``configure()`` reads it)."""
    from otel_llm.setup import ENV_SDK_DISABLED

    return os.environ.get(ENV_SDK_DISABLED, "").strip().lower() == "true"


# What a run says instead of figures when there is no telemetry to take them from.
TELEMETRY_OFF = "telemetry is off (OTEL_SDK_DISABLED=true), no traces or metrics are made"


def destinations() -> list[str]:
    """Where each signal goes under the current OTEL_* environment, one line each (before it is sent)."""
    from otel_llm.export import otlp
    from otel_llm.setup import ENV_CONFIG_FILE, declarative_config_file

    if sdk_disabled():
        return [TELEMETRY_OFF]
    config_file = declarative_config_file()
    if config_file is not None:
        return [f"traces and metrics: where {ENV_CONFIG_FILE}={config_file} says"]
    lines = []
    for signal in ("traces", "metrics"):
        to = otlp.destination(signal)  # type: ignore[arg-type]
        if to == "otlp":
            lines.append(f"{signal}: OTLP {otlp.protocol(signal)} to {_endpoint(signal)}")  # type: ignore[arg-type]
        elif to == "none":
            lines.append(f"{signal}: not exported ({signal.upper()} exporter is none)")
    return lines


# Each way telemetry is lost, in a reader's words (otel_llm.export.counting and Telemetry.delivery()).
_LOSS_WORDS = {
    "export_failed": "export failed: no collector took the connection, or it gave another error",
    "export_not_found": "not found: no OTLP receiver at that URL (check its path)",
    "export_unauthorized": "unauthorized: the collector refused the credentials (OTEL_EXPORTER_OTLP_HEADERS)",
    "export_too_large": "too large: the collector refused batches over its size limit",
    "export_unavailable": "unavailable: the collector answered that it could not take them now",
    "export_timed_out": "timed out: no answer within the export timeout (OTEL_EXPORTER_OTLP_TIMEOUT)",
    "queue_full": "the span queue was full",
    "after_shutdown": "ended after the shutdown",
    "unsent_at_shutdown": "still queued when the shutdown timeout ran out",
    "export_process_exited": "in flight when the export process died",
}


def delivery_lines(telemetry: Any) -> list[str]:
    """After ``telemetry.shutdown()``: for each signal sent over OTLP, where it went, what was delivered
    and what was lost, and why. One line per signal; the run's last word on its telemetry.

    ``telemetry``: this process's ``Telemetry``, or a worker's ``DeliveryReport``.
    """
    from otel_llm.export import otlp
    from otel_llm.export.telemetry import DeliveryReport
    from otel_llm.setup import declarative_config_file

    lines: list[str] = []
    if sdk_disabled() or declarative_config_file() is not None:  # nothing sent, or nothing counted there
        return lines
    report = telemetry if isinstance(telemetry, DeliveryReport) else telemetry.delivery_report()
    for signal, unit in (("traces", "spans"), ("metrics", "metric_points")):
        if otlp.destination(signal) != "otlp":  # type: ignore[arg-type]
            continue
        line = f"{signal}: OTLP {otlp.protocol(signal)} to {_endpoint(signal)}"  # type: ignore[arg-type]
        delivered, lost = report.delivery(unit)
        noun = unit.replace("_", " ")
        text = f"{line}: {delivered} {noun} delivered"
        if lost:
            reasons = "; ".join(f"{n} {_LOSS_WORDS.get(reason, reason)}" for reason, n in lost.items())
            text += f", {sum(lost.values())} lost ({reasons})"
        elif not report.in_time:
            # An export still running when the shutdown timeout ran out has not said what it lost.
            text += ", the last export cut off by the shutdown timeout"
        lines.append(text)
    lost_requests = report.delivery("requests")[1]
    if lost_requests:
        reasons = "; ".join(f"{n} {_LOSS_WORDS.get(r, r)}" for r, n in lost_requests.items())
        lines.append(
            f"requests: {sum(lost_requests.values())} lost before their telemetry was built ({reasons})"
        )
    counted = report.exporter_lines
    if counted:
        lines.append(
            f"the OTLP exporters logged {counted} warnings and errors (retries, failed exports), "
            f"counted here, not shown; {quiet_hint()}"
        )
    return lines


def quiet_hint() -> str:
    from otel_llm.export import quiet

    return f"{quiet.ENV_EXPORTER_LOGS}=show writes them"


def worker_delivery_lines(reports: dict[str, Any]) -> list[str]:
    """``delivery_lines`` of each worker of a disaggregated run (each exports on its own), labelled with
    its role; ``reports``: the ``DeliveryReport`` each worker sent as it stopped, by role. A worker that
    sent none (killed at the shutdown timeout) is named, so its silence is not read as "nothing lost"."""
    lines: list[str] = []
    for role in ("prefill", "decode"):
        report = reports.get(role)
        if report is not None:
            lines += [f"{role} worker: {line}" for line in delivery_lines(report)]
        elif otlp_urls():
            lines.append(
                f"{role} worker: telemetry not accounted for: the worker was stopped before it reported "
                "what it delivered (its unexported telemetry is lost)"
            )
    return lines


def otlp_urls() -> list[str]:
    """The distinct OTLP endpoint URLs the current environment sends to (none for files, and none while
    ``OTEL_SDK_DISABLED`` turns telemetry off: nothing is sent, so no endpoint is checked or reported)."""
    from otel_llm.export import otlp
    from otel_llm.setup import declarative_config_file

    if sdk_disabled():
        return []
    if declarative_config_file() is not None:  # the file names its own endpoints
        return []
    return otlp.endpoint_urls()


def _endpoint(signal: str) -> str:
    """The URL a signal's OTLP exporter sends to: the per-signal variable, else the generic one."""
    from otel_llm.export import otlp

    return otlp.endpoint_url(signal)  # type: ignore[arg-type]


def warn_if_unreachable(command: str, telemetry: Any = None, timeout_s: float = 3.0) -> threading.Thread:
    """Check each OTLP endpoint once, on a background thread (start-up is not held up), and print one
    warning line for each that accepts no connection: telemetry sent there is lost until a collector
    listens. ``telemetry`` is told, so that its shutdown does not wait on exports nothing can take."""
    from otel_llm.export import otlp

    def check() -> None:
        for url in otlp_urls():
            why = otlp.unreachable(url, timeout_s)
            if why is not None:
                if telemetry is not None:
                    telemetry.endpoint_unreachable()
                print(
                    f"otel-llm {command}: warning: no collector answers at {url} ({why}); telemetry sent "
                    "there is lost (and counted) until one listens",
                    file=sys.stderr,
                    flush=True,
                )

    thread = threading.Thread(target=check, name="otel_llm-endpoint-check", daemon=True)
    thread.start()
    return thread


def written_files(telemetry: Any) -> list[Path]:
    """This run's OTLP JSON files that exist and hold data (call after ``telemetry.shutdown()``)."""
    if telemetry.output_dir is None:
        return []
    found = [Path(telemetry.output_dir) / name for name in ("traces.jsonl", "metrics.jsonl")]
    return [p for p in found if p.is_file() and p.stat().st_size > 0]
