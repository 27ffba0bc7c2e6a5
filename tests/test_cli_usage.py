"""Usage errors of ``demo`` and ``serve``: every bad flag, a port another server holds and an output
folder that cannot be written are one line, exit status 2, found before torch is imported (the CUDA check,
which needs torch, still one line and 2), and leave no run folder behind.

Real subprocesses of the CLI (tests/cli_runs.py), a real listening socket for the port in use, real
folders; the probe of an output folder in-process (otel_llm.kit.commands.preflight).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from otel_llm.kit.cli import build_parser
from otel_llm.kit.commands import preflight
from tests.cli_runs import cli, environment
from tests.otlp_receivers import closed_port

# (arguments, the flag the line names, something else it must say)
BAD_FLAGS = [
    (["serve", "--log-level", "loud"], "--log-level", "'loud'"),
    (["serve", "--port", "99999"], "--port", "65535"),
    (["serve", "--graceful-timeout", "-1"], "--graceful-timeout", "seconds"),
    (["serve", "--body-timeout", "0"], "--body-timeout", "seconds"),
    (["serve", "--graceful-timeout", "nan"], "--graceful-timeout", "seconds"),
    (["serve", "--device", "gpu"], "--device", "cuda:N"),
    (["serve", "--seed", str(2**64)], "--seed", "64 bits"),
    (["serve", "--kv-blocks", "0"], "--kv-blocks", "1 or more"),
    (["serve", "--prefill-kv-blocks", "4"], "--prefill-kv-blocks", "--disaggregated"),
    (["demo", "--device", "gpu"], "--device", "cuda:N"),
    (["demo", "--device", "cuda:x"], "--device", "cuda:N"),
    (["demo", "--requests", "0"], "--requests", "1 or more"),
    (["demo", "--seed", "one"], "--seed", "whole number"),
]


@pytest.mark.parametrize(("args", "flag", "says"), BAD_FLAGS, ids=[" ".join(a) for a, _, _ in BAD_FLAGS])
def test_a_bad_flag_is_one_line_and_exit_2_before_torch(args: list[str], flag: str, says: str) -> None:
    run = cli(*args)
    assert run.returncode == 2, run.said
    assert len(run.said) == 1, run.said  # no usage block, no traceback
    line = run.said[0]
    assert line.startswith(f"otel-llm {args[0]}: error:") and flag in line and says in line, line
    assert not run.heavy, f"{sorted(run.heavy)} imported before the error"


def test_a_bad_log_level_lists_every_level_uvicorn_takes() -> None:
    pytest.importorskip("uvicorn", reason="the serve extra")
    from uvicorn.config import LOG_LEVELS

    run = cli("serve", "--log-level", "loud")
    assert run.returncode == 2 and len(run.said) == 1, run.said
    for level in LOG_LEVELS:
        assert level in run.said[0], run.said[0]
    for level in LOG_LEVELS:  # and serve takes each of them, in either case
        for spelled in (level, level.upper()):
            assert build_parser().parse_args(["serve", "--log-level", spelled]).log_level == level


def test_a_device_this_machine_lacks_is_one_line_and_exit_2() -> None:
    torch = pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is no error here")
    run = cli("demo", "--device", "cuda")
    assert run.returncode == 2 and len(run.said) == 1, run.said
    assert run.said[0].startswith("otel-llm demo: error: --device cuda") and "cpu" in run.said[0]


@pytest.fixture
def taken_port() -> int:
    """A loopback port a real server socket listens on for the test's duration."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("mode", [[], ["--disaggregated"]], ids=["serve", "serve --disaggregated"])
def test_a_port_in_use_is_found_before_the_model_loads(
    taken_port: int, mode: list[str], tmp_path: Path
) -> None:
    run = cli("serve", "--port", str(taken_port), *mode, cwd=tmp_path)
    assert run.returncode == 2, run.said
    assert len(run.said) == 1, run.said  # not "Application startup complete." and then the error
    assert f"--port {taken_port}" in run.said[0] and f"127.0.0.1:{taken_port}" in run.said[0], run.said
    assert "--port 0" in run.said[0], run.said  # what to do
    assert not run.heavy, f"{sorted(run.heavy)} imported before the error"
    assert not (tmp_path / "otel-llm-output").exists(), "a run folder was left behind"


def test_an_address_not_of_this_machine_is_a_usage_error(tmp_path: Path) -> None:
    run = cli("serve", "--host", "192.0.2.1", "--port", "0", cwd=tmp_path)  # TEST-NET-1: nobody's
    assert run.returncode == 2 and len(run.said) == 1, run.said
    assert run.said[0].startswith("otel-llm serve: error: --host 192.0.2.1"), run.said
    assert not run.heavy and not (tmp_path / "otel-llm-output").exists()


def blocked_folder(tmp_path: Path) -> Path:
    """A folder that cannot exist, for root too: its parent is a regular file."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "runs"


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_an_output_folder_that_cannot_be_written_is_found_first(command: str, tmp_path: Path) -> None:
    folder = blocked_folder(tmp_path)
    args = [command, "--output-dir", str(folder)] + (["--port", "0"] if command == "serve" else [])
    run = cli(*args, cwd=tmp_path)
    assert run.returncode == 2 and len(run.said) == 1, run.said
    assert f"--output-dir {folder}" in run.said[0], run.said
    assert not run.heavy, f"{sorted(run.heavy)} imported before the error"


def test_proc_is_no_output_folder(tmp_path: Path) -> None:
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    run = cli("demo", "--output-dir", "/proc/nope", cwd=tmp_path)
    assert run.returncode == 2 and len(run.said) == 1 and "/proc/nope" in run.said[0], run.said
    assert not run.heavy


def test_the_output_folder_from_the_environment_is_named_as_such(tmp_path: Path) -> None:
    folder = blocked_folder(tmp_path)
    run = cli("demo", cwd=tmp_path, OTEL_LLM_OUTPUT_DIR=str(folder))
    assert run.returncode == 2 and len(run.said) == 1, run.said
    assert f"OTEL_LLM_OUTPUT_DIR={str(folder)!r}" in run.said[0], run.said


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    fresh = tmp_path / "new" / "deeper" / "runs"
    assert preflight.unwritable(fresh) is None
    assert not (tmp_path / "new").exists()  # the folders made to try were removed again
    assert preflight.unwritable(blocked_folder(tmp_path)) is not None
    existing = tmp_path / "kept"
    existing.mkdir()
    assert preflight.unwritable(existing) is None and list(existing.iterdir()) == []


def test_no_files_no_folder_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Both signals over OTLP: no file is written, so an unwritable folder is no problem.
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    folder = str(blocked_folder(tmp_path))
    assert preflight.output_folder_problem(folder) is not None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    assert preflight.output_folder_problem(folder) is None
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "file")
    assert preflight.output_folder_problem(folder) is not None


def test_port_0_says_where_it_listens_and_the_spans_say_the_same(served_files: tuple[int, Path]) -> None:
    port, folder = served_files  # the port its line named (tests/cli_runs.py reads it)
    traces = folder / "traces.jsonl"
    ports = {
        attribute["value"].get("intValue")
        for line in traces.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
        if span["name"] == "llm.request"
        for attribute in span["attributes"]
        if attribute["key"] == "server.port"
    }
    assert ports == {str(port)}, ports  # OTLP JSON writes 64-bit ints as strings


def test_serve_with_the_sdk_disabled_says_so_and_reports_no_delivery(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the reference engine needs the torch extra")
    pytest.importorskip("fastapi", reason="the serve extra")
    endpoint = f"http://127.0.0.1:{closed_port()}"  # nothing listens: no warning either, nothing is sent
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_llm.kit.cli", "serve", "--port", "0"],
        cwd=tmp_path,
        env=environment(PYTHONUNBUFFERED="1", OTEL_SDK_DISABLED="true", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            assert line, "otel-llm serve ended before it listened: " + "".join(said)
            said.append(line)
            if "listening on http://" in line:
                break
        time.sleep(1)  # the endpoint check runs in the background: give it time to (not) warn
        proc.send_signal(signal.SIGTERM)
        said += proc.stderr.readlines()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = "".join(said)
    assert "telemetry is off" in text and "OTEL_SDK_DISABLED" in text, text
    assert "OTLP" not in text and "no collector answers" not in text and "delivered" not in text, text
    assert not (tmp_path / "otel-llm-output").exists(), text


def test_bare_otel_llm_prints_its_commands() -> None:
    run = cli()
    assert run.returncode == 2, run.said  # no command ran, as for any missing argument
    for command in ("demo", "serve", "view"):
        assert re.search(rf"^\s+{command}\s+\w", run.stdout, re.MULTILINE), run.stdout  # named, with a line
    assert not run.said, run.said  # the help is the answer, not an error line


def test_an_option_a_command_lacks_points_to_that_commands_help() -> None:
    run = cli("view", "traces.jsonl", "--slowset")
    assert run.returncode == 2 and len(run.said) == 1, run.said
    assert run.said[0].startswith("otel-llm view: error:") and "--slowset" in run.said[0], run.said
    assert "otel-llm view --help" in run.said[0], run.said


@pytest.mark.parametrize("command", ["demo", "serve", "view"])
def test_each_commands_help_says_what_it_does(command: str) -> None:
    run = cli(command, "--help")
    assert run.returncode == 0, run.said
    # argparse prints the description as the paragraph between the usage and the arguments.
    paragraphs = run.stdout.split("\n\n")
    assert len(paragraphs) > 2 and not paragraphs[1].lstrip().startswith(("options:", "positional")), (
        run.stdout
    )
    assert len(paragraphs[1].split()) >= 8, paragraphs[1]
