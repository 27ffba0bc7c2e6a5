"""The runs in a set of OTLP JSON traces files, so that ``otel-llm view`` shows one run at a time.

Request ids repeat from run to run (every demo run has its ``req-000``), so the requests of two runs must
not be mixed. A span's run is the folder its file is in (a run folder; a disaggregated run's ``prefill/``
and ``decode/`` worker folders count as their parent) and its resource's ``service.instance.id``, which
tells apart the processes that appended to one file (recent SDKs draw one per process by default;
``otel-llm demo`` and ``serve`` set one per run). Processes of one folder whose spans share a trace are
one run: a disaggregated run's two workers each report their part of every request, under ids of their
own when the code that started them set none. A run without an ``llm.request`` span (a client's own
spans) has nothing to draw and is left out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from otel_llm import semconv
from otel_llm.kit.waterfall import SpanRecord, load_otlp_json

RUN_ID = "service.instance.id"  # the resource attribute that names a run
TRACES_FILE = "traces.jsonl"
# The worker folders a disaggregated run writes below its run folder (otel_llm.kit.engine.disaggregated).
WORKER_FOLDERS = frozenset({semconv.ROLE_PREFILL, semconv.ROLE_DECODE})


@dataclass(slots=True)
class Run:
    """The spans of one run, and where they were read from."""

    instance_ids: list[str]  # its service.instance.id values (none: told apart by its folder only)
    folder: Path  # the folder of its files (of a disaggregated run's two workers: the run folder)
    spans: list[SpanRecord] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    @property
    def roots(self) -> list[SpanRecord]:
        return [s for s in self.spans if s.name == semconv.SPAN_REQUEST]

    @property
    def started_ns(self) -> int:
        """When its first request started, epoch nanoseconds."""
        return min(s.start_ns for s in self.roots)

    @property
    def started(self) -> str:
        """``started_ns`` as local wall-clock time, to the second."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_ns / 1e9))


def trace_files(paths: Sequence[str]) -> list[Path]:
    """The files named; a folder stands for every ``traces.jsonl`` below it. ValueError for a folder
    without one."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        found = sorted(path.rglob(TRACES_FILE)) if path.is_dir() else [path]
        if not found:
            raise ValueError(f"{name}: no {TRACES_FILE} in this folder")
        files += found
    return files


def _folder(file: Path) -> Path:
    """The run folder of a traces file: its own folder, or its parent's for a worker's folder."""
    folder = file.resolve().parent
    return folder.parent if folder.name in WORKER_FOLDERS else folder


def split_runs(files: Sequence[Path]) -> list[Run]:
    """The runs with requests in ``files``, the oldest (by its first request's start) first."""
    parts: dict[tuple[Path, str], Run] = {}  # by (folder, service.instance.id or "")
    for file in files:
        folder = _folder(file)
        for span in load_otlp_json(file):
            instance = str(span.resource.get(RUN_ID) or "")
            part = parts.get((folder, instance))
            if part is None:
                part = parts[(folder, instance)] = Run([instance] if instance else [], folder)
            part.spans.append(span)
            if file not in part.files:
                part.files.append(file)
    runs = _joined_by_trace(list(parts.values()))
    return sorted((run for run in runs if run.roots), key=lambda r: r.started_ns)


def _joined_by_trace(parts: list[Run]) -> list[Run]:
    """``parts`` with those of one folder that share a trace id merged into one run."""
    owner: dict[tuple[Path, str], Run] = {}  # (folder, trace id) -> the run that has it
    runs: list[Run] = []
    for part in parts:
        keys = {(part.folder, s.trace_id) for s in part.spans}
        joined = list({id(owner[k]): owner[k] for k in keys if k in owner}.values())
        if not joined:
            runs.append(part)
            owner.update(dict.fromkeys(keys, part))
            continue
        target = joined[0]
        for other in [*joined[1:], part]:  # the part may join runs that were apart until now
            target.instance_ids += other.instance_ids
            target.spans += other.spans
            target.files += [f for f in other.files if f not in target.files]
            owner.update(dict.fromkeys({(other.folder, s.trace_id) for s in other.spans}, target))
            if other is not part:
                runs.remove(other)
    return runs


def where(runs: Sequence[Run]) -> list[str]:
    """Each run's place in words, relative to the working directory when below it: its folder, or, when
    other runs share the folder (several processes appending to one file), its files and its
    ``service.instance.id``."""
    cwd = Path.cwd().resolve()

    def shown(path: Path) -> str:
        path = path.resolve()
        return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)

    folders = [run.folder for run in runs]
    places = []
    for run in runs:
        if folders.count(run.folder) == 1:
            places.append(shown(run.folder))
        else:
            files = ", ".join(shown(f) for f in run.files)
            ids = ", ".join(run.instance_ids)
            places.append(f"{files} ({RUN_ID} {ids})" if ids else files)
    return places
