"""``otel-llm demo`` and ``otel-llm view`` in subprocesses: files written, waterfall printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _cli(*args: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # no endpoint: the file default
    env["COLUMNS"] = "120"
    env.update(extra_env)
    return subprocess.run(
        [sys.executable, "-m", "otel_llm.kit.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_demo_writes_otlp_json_and_view_draws_the_preempted_request(tmp_path: Path) -> None:
    demo = _cli("demo", "--requests", "10", "--kv-blocks", "12", "--output-dir", "out", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    (run_dir,) = (tmp_path / "out").iterdir()  # this run's own folder
    traces, metrics = run_dir / "traces.jsonl", run_dir / "metrics.jsonl"
    assert f"otel-llm view {traces}" in demo.stdout  # the printed path is the file this run wrote
    assert metrics.stat().st_size > 0

    # Read the file independently of otel_llm's reader: request spans and their preemption counts.
    spans = [
        span
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]
    roots = [s for s in spans if s["name"] == "llm.request"]
    assert len(roots) == 10
    attrs = [{a["key"]: a["value"] for a in r["attributes"]} for r in roots]
    preemptions = {a["llm.request.id"]["stringValue"]: int(a["llm.preemptions"]["intValue"]) for a in attrs}
    most = max(preemptions, key=preemptions.__getitem__)
    assert preemptions[most] > 0, "the demo workload must preempt"
    total = sum(preemptions.values())
    assert f"{total} / {total}" in demo.stdout  # spans and engine agree in the summary table
    assert "TTFT" in demo.stdout and "llm.recompute" in demo.stdout

    view = _cli("view", str(traces), "--request", most, cwd=tmp_path)
    assert view.returncode == 0, view.stderr
    assert f"request {most}" in view.stdout
    assert f"preemptions: {preemptions[most]}" in view.stdout
    for name in ("llm.queue", "llm.prefill", "llm.preempted", "llm.recompute"):
        assert name in view.stdout

    slowest = _cli("view", str(traces), "--slowest", cwd=tmp_path)
    assert slowest.returncode == 0 and "llm.request" in slowest.stdout

    missing = _cli("view", str(traces), "--request", "no-such-request", cwd=tmp_path)
    assert missing.returncode == 2 and "no-such-request" in missing.stderr


def test_each_run_writes_its_own_files_and_prints_only_what_it_wrote(tmp_path: Path) -> None:
    first = _cli("demo", "--requests", "2", cwd=tmp_path)
    second = _cli("demo", "--requests", "2", cwd=tmp_path)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    printed = [
        Path(line.split("otel-llm view ")[1].strip())
        for out in (first.stdout, second.stdout)
        for line in out.splitlines()
        if "otel-llm view " in line
    ]
    assert len(printed) == 2 and printed[0] != printed[1]
    for path in printed:  # each file holds one run: request ids do not repeat within it
        ids = [
            s["attributes"]
            for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"]
            for s in ss["spans"]
            if s["name"] == "llm.request"
        ]
        assert len(ids) == 2
    env_none = _cli("demo", "--requests", "2", cwd=tmp_path, OTEL_TRACES_EXPORTER="none")
    assert env_none.returncode == 0, env_none.stderr
    assert "traces.jsonl" not in env_none.stdout and "traces: not exported" in env_none.stdout
    assert "metrics: " in env_none.stdout  # the metrics file it did write
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    unwritable = _cli("demo", "--requests", "2", "--output-dir", str(blocked), cwd=tmp_path)
    # Found before the engine starts: one line naming the folder, nothing run, no file claimed.
    assert unwritable.returncode == 2, unwritable.stderr
    assert unwritable.stdout == "" and "Traceback" not in unwritable.stderr
    assert str(blocked) in unwritable.stderr and len(unwritable.stderr.strip().splitlines()) == 1
