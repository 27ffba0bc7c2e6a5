"""``otel-llm view`` of files or folders holding several runs: it shows one (the newest unless ``--run N``),
says on stderr which and how to pick another, and ``--runs`` lists them. The runs are real processes:
examples/hook_quickstart.py twice (a run folder each), two processes appending to one file, and the
disaggregated engine's two worker processes (one run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_llm import semconv as sc
from otel_llm.kit.cli import main
from tests.view_files import file_spans

ROOT = Path(__file__).resolve().parent.parent


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


def quickstart_twice(cwd: Path) -> list[Path]:
    """Two runs of examples/hook_quickstart.py; their run folders, in the order they ran."""
    folders: list[Path] = []
    for _ in range(2):
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "hook_quickstart.py")],
            cwd=cwd,
            env=clean_env(),
            check=True,
            capture_output=True,
            timeout=120,
        )
        (new,) = set((cwd / "otel-llm-output").iterdir()) - set(folders)
        folders.append(new)
    return folders


def view(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["view", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def trace_ids(path: Path, instance: str | None = None) -> set[str]:
    """The trace ids of the requests in ``path`` (of the process with that service.instance.id)."""
    return {
        s["traceId"]
        for s in file_spans(path)
        if s["name"] == sc.SPAN_REQUEST and instance in (None, s["resource"].get("service.instance.id"))
    }


def shown_trace(out: str) -> str:
    return out.split("trace ", 1)[1].split()[0]


def test_a_folder_of_run_folders_shows_the_newest_and_says_how_to_pick(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = quickstart_twice(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, out, err = view(capsys, "otel-llm-output", "--width", "100")
    assert rc == 0
    assert shown_trace(out) in trace_ids(second / "traces.jsonl")
    (note,) = err.splitlines()
    assert "2 runs" in note and "newest" in note and second.name in note and first.name not in note, note
    assert "--runs" in note and "--run N" in note, note

    rc, out, _ = view(capsys, "otel-llm-output", "--runs")
    assert rc == 0
    header, *rows = out.splitlines()
    assert header.split() == ["run", "started", "requests", "where"]
    assert [row.split()[0] for row in rows] == ["1", "2"]
    for row, folder in zip(rows, (first, second)):
        assert row.endswith(str(folder.relative_to(tmp_path)))
        assert row.split()[3] == str(len(trace_ids(folder / "traces.jsonl")))  # its requests

    rc, out, err = view(capsys, "otel-llm-output", "--run", "1", "--list")
    assert rc == 0 and first.name in err and "run 1" in err
    assert {line.split()[-1] for line in out.splitlines()[1:]} == trace_ids(first / "traces.jsonl")

    rc, out, err = view(capsys, str(first), "--width", "100")  # one run folder: that run, nothing to say
    assert rc == 0 and err == "" and shown_trace(out) in trace_ids(first / "traces.jsonl")

    monkeypatch.delenv("OTEL_LLM_OUTPUT_DIR", raising=False)
    rc, out, err = view(capsys, "--width", "100")  # no file: the newest run folder of ./otel-llm-output
    assert rc == 0 and shown_trace(out) in trace_ids(second / "traces.jsonl")
    assert second.name in err and first.name not in err, err


def test_a_run_number_that_is_not_there_is_a_usage_error(capsys, tmp_path: Path) -> None:
    first, _ = quickstart_twice(tmp_path)
    rc, _, err = view(capsys, str(tmp_path / "otel-llm-output"), "--run", "3")
    assert rc == 2 and len(err.splitlines()) == 1 and "--runs" in err and "2 runs" in err, err
    for bad in ("0", "x"):
        with pytest.raises(SystemExit) as exited:
            main(["view", str(first), "--run", bad])
        assert exited.value.code == 2
        assert "--run" in capsys.readouterr().err


# What a user's script does with the hook of docs/hooks.md (configure() without an output folder): every run
# appends to ./otel-llm-output/traces.jsonl, with the same request ids.
_APPENDING_RUN = """
import otel_llm
telemetry = otel_llm.configure(service_name="appending")
tracker = otel_llm.RequestTracker(model="m")
for rid in ("r1", "r2"):
    tracker.queued(rid, prompt_tokens=4)
tracker.scheduled(["r1", "r2"])
tracker.tokens(["r1", "r2"])
tracker.finished("r1", reason="stop")
tracker.finished("r2", reason="stop")
telemetry.shutdown()
"""


def test_processes_appending_to_one_file_are_runs_of_their_own(capsys, tmp_path: Path) -> None:
    for instance in ("first-run", "second-run"):
        subprocess.run(
            [sys.executable, "-c", _APPENDING_RUN],
            cwd=tmp_path,
            env=clean_env(OTEL_RESOURCE_ATTRIBUTES=f"service.instance.id={instance}"),
            check=True,
            timeout=120,
        )
    path = tmp_path / "otel-llm-output" / "traces.jsonl"
    by_run = {instance: trace_ids(path, instance) for instance in ("first-run", "second-run")}
    assert all(len(ids) == 2 for ids in by_run.values()), by_run

    rc, out, err = view(capsys, str(path), "--request", "r1", "--width", "100")
    assert rc == 0 and shown_trace(out) in by_run["second-run"]
    assert "2 runs" in err and "second-run" in err and "first-run" not in err, err
    rc, out, err = view(capsys, str(path), "--runs")
    assert rc == 0 and [row.split()[0] for row in out.splitlines()[1:]] == ["1", "2"]
    assert "first-run" in out.splitlines()[1] and "second-run" in out.splitlines()[2], out
    rc, out, _ = view(capsys, str(path), "--run", "1", "--request", "r1", "--width", "100")
    assert rc == 0 and shown_trace(out) in by_run["first-run"]


def test_the_two_workers_of_a_disaggregated_run_are_one_run(capsys, tmp_path: Path) -> None:
    """The library's DisaggregatedEngine, given no resource attributes: each worker process gets an id
    of its own from the SDK (or none); the traces they share make them one run."""
    pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    from otel_llm.kit.engine import ByteTokenizer, EngineConfig
    from otel_llm.kit.engine.disaggregated import DisaggregatedEngine, Submit

    engine = DisaggregatedEngine(
        EngineConfig(num_kv_blocks=16), EngineConfig(num_kv_blocks=16), output_dir=tmp_path
    )
    tok = ByteTokenizer()
    for i in range(2):
        engine.submit(Submit(f"req-{i}", tok.encode("Hello there"), 4, time.monotonic()))
    engine.close()
    rc, out, err = view(capsys, str(tmp_path), "--width", "100")
    assert rc == 0 and err == "", err
    for name in (sc.SPAN_INSTANCE_PREFILL, sc.SPAN_INSTANCE_DECODE):
        assert name in out
    rc, out, _ = view(capsys, str(tmp_path), "--runs")
    assert rc == 0 and len(out.splitlines()) == 2, out  # the header and one run
