"""``otel-llm view`` and the CLI as a new user meets it: long requests, narrow terminals, zoom, trace ids,
one word per thing (preempted, abandoned), files that are not traces, the core install without rich or
torch, bad values, ``--version``.

Traces are written by a real tracker through otel_llm's own OTLP JSON file exporter, then read back by
the command.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_llm import RequestTracker
from otel_llm import semconv as sc
from otel_llm._version import __version__
from otel_llm.export.otlp_json import OtlpJsonSpanExporter
from otel_llm.kit.cli import main
from otel_llm.kit.commands.view import STYLES, fmt_duration
from tests.view_files import tracker_file

T0 = 1000.0
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def long_trace(tmp_path: Path) -> tuple[Path, str]:
    """One request of about 36 s: 0.2 s admission, 30 s queued, a preemption in decode."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OtlpJsonSpanExporter(tmp_path)))
    tracker = RequestTracker(tracer_provider=provider, model="m")
    tracker.queued("short", ts=T0 - 1, arrival_ts=T0 - 1)
    tracker.finished("short", ts=T0 - 0.5)
    tracker.queued("long", ts=T0 + 0.2, arrival_ts=T0)
    tracker.scheduled(["long"], ts=T0 + 30.2)
    tracker.tokens(["long"], ts=T0 + 30.25)
    tracker.preempted(["long"], ts=T0 + 31)
    tracker.scheduled(["long"], ts=T0 + 33)
    tracker.tokens(["long"], ts=T0 + 33.1)
    for k in range(20):
        tracker.tokens(["long"], ts=T0 + 33.2 + k * 0.1)
    trace_id = tracker.traceparent("long").split("-")[1]  # type: ignore[union-attr]
    tracker.finished("long", ts=T0 + 35.9457)
    provider.shutdown()
    return tmp_path / "traces.jsonl", trace_id


def view(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["view", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_every_span_has_a_bar_at_any_width(capsys, long_trace, width: int) -> None:
    path, _ = long_trace
    rc, out, _ = view(capsys, str(path), "--request", "long", "--width", str(width))
    assert rc == 0
    lines = out.splitlines()
    assert all(len(line) <= width for line in lines[:-2]), [len(x) for x in lines]
    for name in (sc.SPAN_ADMISSION, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE, sc.SPAN_RECOMPUTE):
        (row,) = [line for line in lines if line.lstrip().startswith(name + " ")]
        assert STYLES[name][0] in row, (width, row)
    assert "35.9 s" in out  # the axis and durations in seconds, not 35945.7 ms
    assert "…" not in "".join(lines[2:-2])


def test_trace_id_picks_the_request(capsys, long_trace) -> None:
    path, trace_id = long_trace
    rc, out, _ = view(capsys, str(path), "--trace-id", trace_id.upper(), "--width", "80")
    assert rc == 0 and out.startswith("request long")
    rc, _, err = view(capsys, str(path), "--trace-id", "0" * 32)
    assert rc == 2 and "no request in trace" in err


def test_zoom_on_a_phase_and_on_a_window(capsys, long_trace) -> None:
    path, _ = long_trace
    rc, out, _ = view(capsys, str(path), "--request", "long", "--phase", "decode", "--width", "80")
    assert rc == 0
    axis = out.splitlines()[1]
    assert "30.2 s" in axis and "35.9 s" in axis  # decode runs from the first token to the end
    queue_row = next(line for line in out.splitlines() if line.lstrip().startswith(sc.SPAN_QUEUE))
    assert "‹" in queue_row  # before the window
    rc, out, _ = view(capsys, str(path), "--request", "long", "--window", "100ms:300ms", "--width", "80")
    assert rc == 0 and "100 ms" in out.splitlines()[1] and "300 ms" in out.splitlines()[1]
    admission_row = next(line for line in out.splitlines() if sc.SPAN_ADMISSION in line)
    assert admission_row.count(STYLES[sc.SPAN_ADMISSION][0]) > 20  # 0.2 s of 0.2 s shown: half the axis
    for bad in ("--window", "5s:1s"), ("--window", "abc"), ("--phase", "nothing"), ("--width", "30"):
        rc, _, err = view(capsys, str(path), *bad)
        assert rc == 2 and err.startswith("otel-llm view:"), (bad, err)


def legend_lines(out: str) -> list[str]:
    """The legend: the last lines, whose entries start with a glyph (the numbers, with a word)."""
    lines = out.splitlines()
    end = len(lines)
    while not (lines[end - 1][0].isalnum() or lines[end - 1][0] == "("):
        end -= 1
    return lines[end:]


def test_legend_reads_without_colour(capsys, long_trace) -> None:
    path, _ = long_trace
    _, out, _ = view(capsys, str(path), "--request", "long")
    legend = " ".join(legend_lines(out))
    glyphs = [STYLES[name][0] for name in STYLES]
    assert len(set(glyphs)) == len(glyphs)
    for name, word in (
        (sc.SPAN_QUEUE, "queue"),
        (sc.SPAN_ADMISSION, "admission"),
        (sc.SPAN_PREFILL, "prefill"),
        (sc.SPAN_DECODE, "decode"),
        (sc.SPAN_PREEMPTED, "preempted"),
        (sc.SPAN_RECOMPUTE, "recompute"),
    ):
        assert f"{STYLES[name][0]} {word}" in legend, (word, legend)


def test_a_preemption_is_called_preempted_everywhere(capsys, long_trace) -> None:
    """``evicted`` was the finish reason of a request the tracker gave up on: never a preemption's word."""
    path, _ = long_trace
    rc, out, _ = view(capsys, str(path), "--request", "long", "--width", "100")
    assert rc == 0
    assert "evicted" not in out.lower(), out
    # The fixture's preemption: preempted at T0 + 31, rescheduled at T0 + 33.
    assert f"preempted for: {fmt_duration(33.0 - 31.0)}" in out, out


def test_summary_and_legend_keep_to_the_width_and_show_only_what_is_drawn(capsys, long_trace) -> None:
    path, _ = long_trace
    rc, out, _ = view(capsys, str(path), "--request", "long", "--width", "60")
    assert rc == 0
    assert all(len(line) <= 60 for line in out.splitlines()), [len(x) for x in out.splitlines()]
    # One instance: no KV transfer or instance glyphs in its legend; preempted in decode: the gap.
    tail = "\n".join(legend_lines(out))
    assert "KV transfer" not in tail and "instance" not in tail, tail
    assert "preempted (gap in its phase)" in tail and "recompute" in tail, tail


def gave_up_on_one(tracker: RequestTracker) -> None:
    """Two requests in a tracker that keeps one: the older is closed unfinished when the second comes."""
    tracker.queued("old", ts=T0, prompt_tokens=4)
    tracker.scheduled(["old"], ts=T0 + 0.01)
    tracker.tokens(["old"], ts=T0 + 0.02)
    tracker.queued("new", ts=T0 + 0.03, prompt_tokens=4)
    tracker.scheduled(["new"], ts=T0 + 0.04)
    tracker.tokens(["new"], ts=T0 + 0.05)
    tracker.finished("new", reason="stop", ts=T0 + 0.06)


@pytest.mark.parametrize("written_as", ["abandoned", "evicted"])
def test_a_request_the_tracker_gave_up_on_reads_as_abandoned(capsys, tmp_path: Path, written_as: str) -> None:
    """Files of this version say ``abandoned``, older ones ``evicted``: the viewer shows both as abandoned."""
    real = tracker_file(tmp_path / "real", gave_up_on_one, max_in_flight=1)
    text = real.read_text()
    reasons = {'"stringValue":"abandoned"', '"stringValue":"evicted"'}
    (found,) = [r for r in reasons if r in text]  # the reason the tracker of this checkout wrote
    path = tmp_path / "traces.jsonl"
    path.write_text(text.replace(found, f'"stringValue":"{written_as}"'))
    rc, out, _ = view(capsys, str(path), "--list")
    assert rc == 0
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line) for line in out.splitlines()[1:])}
    assert rows["old"][4] == "abandoned" and rows["new"][4] == "stop", out
    rc, out, _ = view(capsys, str(path), "--request", "old", "--width", "120")
    assert rc == 0
    (finish,) = [fact for line in out.splitlines() for fact in line.split("  ") if fact.startswith("finish:")]
    assert finish.startswith("finish: abandoned (") and "gave up" in finish, finish
    assert "evicted" not in out


def test_list_shows_every_request_to_pick_from(capsys, long_trace) -> None:
    path, trace_id = long_trace
    rc, out, _ = view(capsys, str(path), "--list")
    assert rc == 0
    header, *rows = out.splitlines()
    assert header.split() == ["request", "TTFT", "e2e", "preemptions", "finish", "trace"]
    assert [row.split()[0] for row in rows] == ["short", "long"]  # start order
    long_row = rows[1].split()
    assert long_row[-1] == trace_id and "1" in long_row  # its one preemption
    assert "35.9" in rows[1]  # e2e, seconds


def test_help_says_which_request_is_shown_by_default(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["view", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    assert "most preempted request" in helped and "--list" in helped


def one_token_and_three(tracker: RequestTracker) -> None:
    tracker.queued("one", ts=T0)
    tracker.scheduled(["one"], ts=T0 + 0.01)
    tracker.tokens(["one"], ts=T0 + 0.02)
    tracker.finished("one", ts=T0 + 0.03)  # the decode span: first token to the end, 10 ms
    tracker.queued("three", ts=T0 + 1)
    tracker.scheduled(["three"], ts=T0 + 1.01)
    for k in range(3):
        tracker.tokens(["three"], ts=T0 + 1.02 + k * 0.01)
    tracker.finished("three", ts=T0 + 1.05)


def decode_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if "decode (first to last token):" in line]
    return line


def test_a_one_token_request_says_which_decode_time_it_shows(capsys, tmp_path: Path) -> None:
    path = tracker_file(tmp_path, one_token_and_three)
    rc, out, _ = view(capsys, str(path), "--request", "one", "--width", "100")
    assert rc == 0
    (row,) = [line for line in out.splitlines() if line.lstrip().startswith(sc.SPAN_DECODE + " ")]
    assert fmt_duration(0.03 - 0.02) in row  # the span: first token to the end
    line = decode_line(out)
    assert "decode (first to last token): 0 (" in line  # not a bare "decode: 0" beside a 10 ms span
    assert "one token" in line and sc.SPAN_DECODE in line, line  # why, on that line
    rc, out, _ = view(capsys, str(path), "--request", "three", "--width", "100")
    assert rc == 0
    line = decode_line(out)
    assert f"decode (first to last token): {fmt_duration(0.04 - 0.02)}" in line and "one token" not in line


def test_a_file_that_is_not_json_lines_is_named_in_one_line(capsys, long_trace, tmp_path: Path) -> None:
    path, _ = long_trace
    packed = tmp_path / "traces.jsonl.gz"  # the real file, gzipped: binary, no longer JSON lines
    packed.write_bytes(gzip.compress(path.read_bytes()))
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(packed, folder / "traces.jsonl")  # a folder whose traces.jsonl is binary
    for given, named in ((packed, packed), (folder, folder / "traces.jsonl")):
        rc, out, err = view(capsys, str(given))
        assert rc == 2 and out == ""
        assert len(err.splitlines()) == 1 and err.startswith("otel-llm view: "), err
        assert str(named) in err and "traces.jsonl" in err.split(str(named), 1)[1], err


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.00085, "850 µs"), (0.0123, "12.3 ms"), (35.9457, "35.9 s"), (750.0, "12.5 min"), (0.25, "250 ms")],
)
def test_durations_pick_their_unit(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


# The core install: rich and torch are extras. A meta-path finder makes them missing for real.
_WITHOUT = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("rich", "torch"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
from otel_llm.kit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def cli_without_extras(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_core_install_without_rich_or_torch(long_trace, tmp_path: Path) -> None:
    path, _ = long_trace
    helped = cli_without_extras("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "demo" in helped.stdout, helped.stderr
    viewed = cli_without_extras("view", str(path), "--request", "long", "--width", "80", cwd=tmp_path)
    assert viewed.returncode == 0, viewed.stderr
    assert STYLES[sc.SPAN_QUEUE][0] in viewed.stdout  # plain text, same waterfall
    for command in ("demo", "serve"):
        done = cli_without_extras(command, cwd=tmp_path)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert "pip install" in done.stderr and "torch" in done.stderr


def test_a_reader_that_leaves_early_gets_no_error(long_trace) -> None:
    """``otel-llm view --list | head -1``: the pipe closes before the list is written."""
    path, _ = long_trace
    for args in (["--list"], ["--width", "80"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "otel_llm.kit.cli", "view", str(path), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        proc.stdout.close()  # the reader is gone before anything is written
        err = proc.stderr.read()
        proc.wait(60)
        assert err == "", err
        assert proc.returncode == 1


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["demo", "--kv-blocks", "0"], "--kv-blocks"),
        (["demo", "--requests", "x"], "--requests"),
        (["serve", "--port", "70000"], "--port"),
        (["serve", "--port", "-1"], "--port"),
    ],
)
def test_bad_cli_values_are_usage_errors(capsys, args: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert says in capsys.readouterr().err
