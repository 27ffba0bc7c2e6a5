"""Every script in examples/ runs as written (in smoke mode, in a fresh directory) and delivers what it
promises: spans in files of a run folder of its own, named in what it prints, or spans and metrics at a
real loopback OTLP receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from otel_llm import semconv as sc
from tests.otlp_receivers import GrpcReceiver, HttpReceiver, attributes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
TIMEOUT_S = 120


def run(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OPENAI_"))}
    clean.update(OTEL_LLM_EXAMPLE_SMOKE="1", OTEL_LLM_SHUTDOWN_TIMEOUT="5", **env)
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES.parent), clean.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return done


def quickstart_run(cwd: Path, **env: str) -> Path:
    """Run hook_quickstart.py; the run folder it wrote its files into (one new folder per run), which it
    names with the ``otel-llm view`` command for it, as docs/demo.md says every example does."""
    base = Path(env.get("OTEL_LLM_OUTPUT_DIR", cwd / "otel-llm-output"))
    before = set(base.glob("hook-quickstart-*"))
    out = run("hook_quickstart.py", cwd, **env).stdout
    (folder,) = set(base.glob("hook-quickstart-*")) - before
    assert f"otel-llm view {folder}" in out, out
    return folder


def printed(out: str, label: str) -> Path:
    """The path an example printed after ``label`` (e.g. ``files: /abs/run-folder``)."""
    (line,) = [line for line in out.splitlines() if line.startswith(label)]
    return Path(line.removeprefix(label).split()[0])


def file_spans(directory: Path) -> list[dict]:
    lines = (directory / "traces.jsonl").read_text().splitlines()
    return [
        span
        for line in lines
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def received_names(receiver) -> list[str]:
    return [span.name for _, span in receiver.collected.spans()]


def check_hook_quickstart(tmp_path: Path) -> None:
    for _ in range(2):  # a second run writes its own folder: the first run's files stay as they were
        folder = quickstart_run(tmp_path)
        names = [s["name"] for s in file_spans(folder)]
        assert names.count(sc.SPAN_REQUEST) == 5  # the script's docstring: five requests, one preemption
        assert names.count(sc.SPAN_PREEMPTED) == 1
        assert (folder / "metrics.jsonl").stat().st_size > 0


def check_engine_demo(tmp_path: Path) -> None:
    folders = []
    for _ in range(2):  # each run its own folder, named in what it prints; the first stays as it was
        out = run("engine_demo.py", tmp_path).stdout
        folder = printed(out, "files: ")
        assert folder.parent == tmp_path / "otel-llm-output" and folder.name.startswith("engine-demo-"), out
        assert f"otel-llm view {folder}" in out
        names = [s["name"] for s in file_spans(folder)]
        assert names.count(sc.SPAN_REQUEST) == 4  # its four prompts
        assert names.count(sc.SPAN_PREEMPTED) == int(out.split("preemptions:")[1].split()[0]) > 0
        folders.append((folder, (folder / "traces.jsonl").read_bytes()))
    assert folders[0][0] != folders[1][0]
    assert all((folder / "traces.jsonl").read_bytes() == written for folder, written in folders)
    assert not (tmp_path / "otel-llm-output" / "traces.jsonl").exists()  # nothing in a shared file


def check_engine_otlp(tmp_path: Path) -> None:
    with GrpcReceiver() as receiver:
        out = run(
            "engine_otlp.py",
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        )
        requests = int(out.stdout.split(" requests")[0].split()[-1])
        preemptions = int(out.stdout.split(" preemptions")[0].split()[-1])
        assert receiver.collected.wait_until(
            lambda c: received_names(receiver).count(sc.SPAN_REQUEST) == requests
        )
        assert received_names(receiver).count(sc.SPAN_PREEMPTED) == preemptions
        assert receiver.collected.metrics(sc.METRIC_TTFT)
    assert not (tmp_path / "otel-llm-output").exists()  # it went over the wire, not to files


def check_server_openai_client(tmp_path: Path) -> None:
    with HttpReceiver() as receiver:
        out = run("server_openai_client.py", tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        printed_trace = out.stdout.split("trace id ")[1].split()[0]
        spans = receiver.collected.spans
        assert receiver.collected.wait_until(
            lambda c: len([s for _, s in spans() if s.name == sc.SPAN_REQUEST]) == 2 and len(spans()) > 2
        )
        (caller,) = [
            s for r, s in spans() if attributes(r.attributes)["service.name"] == "openai-client-example"
        ]
        roots = [(r, s) for r, s in spans() if s.name == sc.SPAN_REQUEST]
        assert caller.trace_id.hex() == printed_trace
        for resource, root in roots:  # one plain, one streamed call: both children of the client's span
            assert attributes(resource.attributes)["service.name"] == "otel-llm-serve"
            assert root.trace_id == caller.trace_id and root.parent_span_id == caller.span_id
    assert f"x-trace-id: {printed_trace}" in out.stdout


def check_replay_files(tmp_path: Path) -> None:
    folder = quickstart_run(tmp_path)  # something to replay
    written = file_spans(folder)
    with HttpReceiver() as receiver:
        run(
            "replay_files.py",
            tmp_path,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_LLM_OUTPUT_DIR=str(folder),
        )
        got = receiver.collected.spans()
        assert sorted((s.trace_id.hex(), s.span_id.hex(), s.name) for _, s in got) == sorted(
            (s["traceId"], s["spanId"], s["name"]) for s in written
        )
        assert {r.path for r in receiver.collected.received()} == {"/v1/traces", "/v1/metrics"}
        assert receiver.collected.metrics(sc.METRIC_TTFT)


def check_any(script: str) -> Callable[[Path], None]:
    """An example without its own check must at least deliver request spans to a collector."""

    def check(tmp_path: Path) -> None:
        with GrpcReceiver() as receiver:
            run(
                script,
                tmp_path,
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
                OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            )
            assert receiver.collected.wait_until(lambda c: sc.SPAN_REQUEST in received_names(receiver))

    return check


CHECKS: dict[str, Callable[[Path], None]] = {
    "hook_quickstart.py": check_hook_quickstart,
    "engine_demo.py": check_engine_demo,
    "engine_otlp.py": check_engine_otlp,
    "server_openai_client.py": check_server_openai_client,
    "replay_files.py": check_replay_files,
}


def test_the_examples_we_promise_exist() -> None:
    assert set(CHECKS) <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_and_delivers(script: str, tmp_path: Path) -> None:
    if script != "hook_quickstart.py":
        pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    if script == "server_openai_client.py":
        pytest.importorskip("openai", reason="the example's client")
        pytest.importorskip("fastapi", reason="the server needs the serve extra")
    CHECKS.get(script, check_any(script))(tmp_path)


def test_replay_files_sends_both_workers_of_a_disaggregated_run(tmp_path: Path) -> None:
    """A disaggregated run folder (otel-llm demo / serve --disaggregated) holds prefill/ and decode/;
    replaying the run folder sends both, as `otel-llm view` joins both."""
    run_dir = tmp_path / "serve-run"
    run_dir.mkdir()
    for role in ("prefill", "decode"):
        quickstart_run(tmp_path, OTEL_LLM_OUTPUT_DIR=str(tmp_path / role)).rename(run_dir / role)
    written = file_spans(run_dir / "prefill") + file_spans(run_dir / "decode")
    with HttpReceiver() as receiver:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / "replay_files.py"), str(run_dir)],
            env={**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        got = sorted(s.span_id.hex() for _, s in receiver.collected.spans())
    assert got == sorted(s["spanId"] for s in written)
    assert "prefill traces" in done.stdout and "decode metrics" in done.stdout


def test_replay_files_names_the_run_folders_of_the_output_dir(tmp_path: Path) -> None:
    (tmp_path / "otel-llm-output" / "demo-20260101-120000-1").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "replay_files.py")],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 1 and "demo-20260101-120000-1" in done.stderr, done.stderr


def test_server_openai_client_writes_both_sides_into_its_run_folder(tmp_path: Path) -> None:
    """Without an endpoint: this client's span and the server's run in one run folder it names, which
    ``otel-llm view`` reads as one run (the printed trace: both requests)."""
    pytest.importorskip("openai", reason="the example's client")
    pytest.importorskip("fastapi", reason="the server needs the serve extra")
    pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    out = run("server_openai_client.py", tmp_path).stdout
    folder = printed(out, "files: ")
    assert folder.parent == tmp_path / "otel-llm-output" and folder.name.startswith("openai-client-"), out
    trace_id = out.split("trace id ")[1].split()[0]
    (client,) = file_spans(folder)  # the client's one span, and no more
    assert client["traceId"] == trace_id
    (server_run,) = folder.glob("serve-*")
    roots = [s for s in file_spans(server_run) if s["name"] == sc.SPAN_REQUEST]
    assert len(roots) == 2 and {s["traceId"] for s in roots} == {trace_id}
    assert f"otel-llm view {folder} --list" in out
    viewed = subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", "view", str(folder), "--list"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert viewed.returncode == 0 and viewed.stderr == "", viewed.stderr  # one run: nothing to say
    assert [row.split()[-1] for row in viewed.stdout.splitlines()[1:]] == [trace_id, trace_id]


def test_replay_files_without_dir_sends_the_newest_run_folder(tmp_path: Path) -> None:
    older, newer = quickstart_run(tmp_path), quickstart_run(tmp_path)
    written = file_spans(newer)
    with HttpReceiver() as receiver:
        done = run("replay_files.py", tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        got = sorted(s.span_id.hex() for _, s in receiver.collected.spans())
    assert got == sorted(s["spanId"] for s in written)
    (said,) = [line for line in done.stdout.splitlines() if "replaying" in line]
    assert newer.name in said and older.name not in said and "2 run folders" in said, said
