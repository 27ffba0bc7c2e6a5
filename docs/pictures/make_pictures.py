"""Draw the pictures of the documentation from what the code produces today.

``python docs/pictures/make_pictures.py [OUT_DIR]`` runs ``otel-llm demo`` into a temporary folder and
draws pictures of it into OUT_DIR (default: this folder):

- ``waterfall.svg``: what ``otel-llm view`` prints for the run. The viewer's own code picks the request
  (the most preempted one) and draws every line; only its last step, printing the lines with rich,
  prints into a recording rich console instead of the terminal, which rich then exports as SVG. Needs the
  ``torch`` extra (the demo's engine, and rich).
- ``phoenix-trace.png``: the same request's trace in a real trace UI. A fresh Arize Phoenix server on
  loopback receives the run's files over OTLP/HTTP from ``examples/replay_files.py``, exactly as a
  collector would, and headless Chromium takes a screenshot of Phoenix's page for that trace. Needs
  Phoenix (``bash tests/phoenix/make_env.sh`` builds ``.venv-phoenix``; or ``OTEL_LLM_PHOENIX``, the
  path of a ``phoenix`` command) and Debian's chromium (``apt-get install chromium``; or
  ``OTEL_LLM_CHROMIUM``). Without them this picture is left as it is, and the script says so.
- ``fleet-trace.png``: in the same Phoenix, one request's trace through vllm-router and a ``vllm serve``
  instance, replayed from ``fleet-trace/traces.jsonl``: a trace a run of ``tests/router`` read back from
  Jaeger (the fleet, two engines and a router, is more than this script starts). That tier checks the
  stored trace has the shape of a fresh one, and ``OTEL_LLM_FLEET_TRACE=docs/pictures/fleet-trace``
  makes it write a fresh one there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent  # the checkout: its otel_llm is the one drawn
WIDTH = 100  # the viewer's width when it is not run in a terminal
TITLE = "otel-llm view"
DEMO = "import sys; from otel_llm.kit.cli import main; sys.exit(main(sys.argv[1:]))"
PHOENIX = Path(os.environ.get("OTEL_LLM_PHOENIX") or ROOT / ".venv-phoenix" / "bin" / "phoenix")
CHROMIUM = os.environ.get("OTEL_LLM_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# Headless, and nothing of Chromium's own traffic: on a machine with no way out its background
# connections are refused, many at a time, and slow every start.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
WINDOW = (1400, 900)  # the screenshot's size in pixels
RENDER_BUDGET_MS = 15_000  # Chromium's virtual time for Phoenix's page to load its data and draw it
# One request's trace through vllm-router and a `vllm serve` instance, as Jaeger stored it in a run of
# tests/router (OTLP/JSON, the form otel-llm's files take); that tier checks it has the shape of a fresh
# one, and sets OTEL_LLM_FLEET_TRACE to write a fresh one here.
FLEET_TRACE = HERE / "fleet-trace"
PHOENIX_START_S = 180.0  # Phoenix migrates a new database at its first start: tens of seconds on 2 cores


def run_demo(output_dir: Path) -> tuple[Path, str]:
    """Run ``otel-llm demo`` with its files in ``output_dir``: the run folder it wrote, what it printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", DEMO, "demo", "--output-dir", str(output_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        said = f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        raise SystemExit(f"otel-llm demo exited {done.returncode}:\n{said}")
    (run,) = [p for p in output_dir.iterdir() if p.is_dir()]
    return run, done.stdout


def view_svg(files: Sequence[str], width: int = WIDTH) -> str:
    """What ``otel-llm view FILES --width WIDTH`` prints, as an SVG of rich's terminal export."""
    from rich.console import Console
    from rich.text import Text

    from otel_llm.kit.cli import main
    from otel_llm.kit.commands import view

    console = Console(record=True, width=width, file=open(os.devnull, "w"), soft_wrap=True)  # noqa: SIM115

    def emit(lines: Sequence[Sequence[tuple[str, str | None]]], file: object = None) -> None:
        for line in lines:  # as otel_llm.kit.waterfall_render.emit prints them
            console.print(Text.assemble(*[(t, s or "") for t, s in line]))

    drawn = view.emit
    view.emit = emit  # type: ignore[assignment]
    try:
        status = main(["view", *files, "--width", str(width)])
    finally:
        view.emit = drawn  # type: ignore[assignment]
    if status != 0:
        raise SystemExit(f"otel-llm view exited {status}")
    return console.export_svg(title=TITLE)


def shown_trace(printed: str) -> str:
    """The trace id of the request the demo's waterfall shows (its line ``request req-N  trace ID``)."""
    found = re.search(r"^request req-\d+ +trace ([0-9a-f]{32})$", printed, re.M)
    if not found:
        raise SystemExit(f"the demo printed no waterfall:\n{printed[-2000:]}")
    return found.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def phoenix_can_run(phoenix: Path = PHOENIX, chromium: str = CHROMIUM) -> str | None:
    """None when the Phoenix picture can be taken here, else what is missing and how to get it."""
    if not phoenix.exists():
        return (
            f"Phoenix not found at {phoenix}: build it with `bash tests/phoenix/make_env.sh` "
            "or set OTEL_LLM_PHOENIX"
        )
    if not Path(chromium).exists():
        return (
            f"chromium not found at {chromium}: install Debian's (`apt-get install chromium`) "
            "or set OTEL_LLM_CHROMIUM"
        )
    return None


@contextmanager
def phoenix_server(work_dir: Path, phoenix: Path = PHOENIX) -> Iterator[str]:
    """A new Phoenix server on loopback with its database in ``work_dir``; yields its URL (the UI, the
    GraphQL API and OTLP/HTTP's /v1/traces on one port)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env.update(
        PHOENIX_WORKING_DIR=str(work_dir),
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(free_port()),
        PHOENIX_TELEMETRY_ENABLED="false",
    )
    url = f"http://127.0.0.1:{port}"
    log_path = work_dir / "phoenix.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen([str(phoenix), "serve"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + PHOENIX_START_S
        while True:
            if server.poll() is not None:
                raise SystemExit(f"phoenix serve exited {server.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"phoenix serve did not answer in {PHOENIX_START_S:.0f} s") from None
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def graphql(url: str, query: str) -> dict:
    request = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["data"]


def replay(run: Path, url: str) -> None:
    """Send the run's files to ``url`` over OTLP/HTTP with the example a user would run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = url
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "replay_files.py"), str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"replay_files.py exited {done.returncode}:\n{done.stdout}\n{done.stderr}")


def project_holding(url: str, trace_id: str, timeout_s: float = 60.0) -> str:
    """The id of the Phoenix project that holds the trace, once Phoenix has stored it."""
    query = f'{{ projects {{ edges {{ node {{ id trace(traceId: "{trace_id}") {{ numSpans }} }} }} }} }}'
    deadline = time.monotonic() + timeout_s
    while True:
        for edge in graphql(url, query)["projects"]["edges"]:
            if edge["node"]["trace"]:
                return str(edge["node"]["id"])
        if time.monotonic() > deadline:
            raise SystemExit(f"Phoenix at {url} has no trace {trace_id} after {timeout_s:.0f} s")
        time.sleep(0.5)


def chromium(page: str, *action: str, chromium: str = CHROMIUM) -> str:
    """Run headless Chromium on ``page`` with ``action`` (``--screenshot=PATH`` or ``--dump-dom``); what it
    printed on standard output (the page's DOM, for ``--dump-dom``)."""
    with tempfile.TemporaryDirectory(prefix="otel-llm-chromium-") as profile:
        done = subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                f"--virtual-time-budget={RENDER_BUDGET_MS}",
                *action,
                page,
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
    if done.returncode != 0:
        raise SystemExit(f"chromium exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def phoenix_pictures(shots: Sequence[tuple[Path, str, Path]]) -> list[str]:
    """For each (run folder, trace id, target PNG): replay the run into one new Phoenix and write the PNG
    of Phoenix's page for the trace; each page's DOM as Chromium rendered it (what it shows, as text)."""
    doms = []
    with tempfile.TemporaryDirectory(prefix="otel-llm-phoenix-") as work, phoenix_server(Path(work)) as url:
        for run, trace_id, target in shots:
            replay(run, url)
            page = f"{url}/projects/{project_holding(url, trace_id)}/traces/{trace_id}"
            chromium(page, f"--screenshot={target}")
            doms.append(chromium(page, "--dump-dom"))
    return doms


def phoenix_picture(run: Path, trace_id: str, target: Path) -> str:
    """``phoenix_pictures`` of one trace."""
    return phoenix_pictures([(run, trace_id, target)])[0]


def fleet_trace_id(folder: Path = FLEET_TRACE) -> str:
    """The id of the one trace stored in ``folder``'s traces.jsonl."""
    ids = {
        span["traceId"]
        for line in (folder / "traces.jsonl").read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    }
    assert len(ids) == 1, ids
    return ids.pop()


def make(out_dir: Path = HERE) -> list[Path]:
    """Write ``waterfall.svg`` and, where Phoenix and Chromium are here, ``phoenix-trace.png`` into
    ``out_dir`` from one fresh demo run; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="otel-llm-pictures-") as tmp:
        run, printed = run_demo(Path(tmp))
        target = out_dir / "waterfall.svg"
        target.write_text(view_svg([str(run)]), encoding="utf-8")
        written.append(target)
        missing = phoenix_can_run()
        if missing:
            print(f"phoenix-trace.png and fleet-trace.png left as they are: {missing}", file=sys.stderr)
        else:
            shots = [
                (run, shown_trace(printed), out_dir / "phoenix-trace.png"),
                (FLEET_TRACE, fleet_trace_id(), out_dir / "fleet-trace.png"),
            ]
            phoenix_pictures(shots)
            written += [target for _, _, target in shots]
    return written


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for path in make(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE):
        print(path)
