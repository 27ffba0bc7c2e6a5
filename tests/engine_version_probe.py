"""What ``instrument()`` does with the engine release installed, run inside an engine's own virtualenv.

``python engine_version_probe.py OUT.json ENGINE [--as-version=X] [--twice]``, ENGINE ``vllm`` or
``sglang``. With ``--as-version``, the engine's installed distribution is copied first (its
``.dist-info`` folder, into a new folder put first on ``sys.path``) with only its version changed to X:
the engine's code is the installed one, its metadata says X, as after an upgrade to a release the
tested range does not cover. Nothing of ``importlib.metadata`` is replaced.

Then ``instrument()`` runs before the engine is imported (as ``opentelemetry-instrument`` and an
application calling it first do; vLLM through its general-plugin loader, which imports vLLM first),
the engine's classes are imported, and the probe writes what happened: otel_llm's warnings, the version
the metadata gave, and whether the engine's classes were patched.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

DISTRIBUTION = {"vllm": "vllm", "sglang": "sglang"}


class Kept(logging.Handler):
    """Every record otel_llm logs at WARNING or above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def relabel(distribution: str, version: str) -> None:
    """A copy of ``distribution``'s installed metadata, saying ``version``, first on ``sys.path``."""
    installed = md.distribution(distribution)
    files = installed.files or ()
    meta = next(f for f in files if f.name == "METADATA" and f.parent.name.endswith(".dist-info"))
    source = Path(installed.locate_file(meta)).parent
    folder = Path(tempfile.mkdtemp(prefix="relabelled-"))
    copy = folder / f"{distribution}-{version}.dist-info"
    shutil.copytree(source, copy)
    lines = (copy / "METADATA").read_text().splitlines(keepends=True)
    (copy / "METADATA").write_text(
        "".join(f"Version: {version}\n" if line.startswith("Version:") else line for line in lines)
    )
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()


def patched_vllm() -> bool:
    """Whether vLLM's OutputProcessor carries otel_llm's wrappers."""
    from vllm.v1.engine.output_processor import OutputProcessor

    return hasattr(vars(OutputProcessor)["process_outputs"], "__wrapped__")


def patched_sglang() -> bool:
    """Whether SGLang's Scheduler carries otel_llm's wrappers."""
    from sglang.srt.managers.scheduler import Scheduler

    return hasattr(vars(Scheduler)["_add_request_to_queue"], "__wrapped__")


def main() -> None:
    out, engine = sys.argv[1], sys.argv[2]
    options = dict(a[2:].split("=", 1) if "=" in a else (a[2:], "") for a in sys.argv[3:])
    if "as-version" in options:
        relabel(DISTRIBUTION[engine], options["as-version"])
    kept = Kept()
    logging.getLogger("otel_llm").addHandler(kept)
    if engine == "vllm":
        from otel_llm.integrations.vllm import VLLMInstrumentor as Instrumentor
    else:
        from otel_llm.integrations.sglang import SGLangInstrumentor as Instrumentor
    calls = 2 if "twice" in options else 1
    if engine == "vllm" and "plugin" in options:
        from vllm.plugins import load_general_plugins  # imports vLLM, then calls every plugin

        load_general_plugins()
        calls -= 1
    for _ in range(calls):
        Instrumentor().instrument()
    patched = patched_vllm() if engine == "vllm" else patched_sglang()
    report = {
        "metadata_version": md.version(DISTRIBUTION[engine]),
        "warnings": kept.messages,
        "instrumented": Instrumentor().is_instrumented,
        "patched": patched,
    }
    Instrumentor().uninstrument()
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
